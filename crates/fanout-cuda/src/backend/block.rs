//! A block (one layer's message-flow graph) in device memory, with its transpose built on
//! first use.

use super::kernels::launch;
use super::{device_error, CudaBackend};
use crate::sample::{DeviceBlock, DeviceBlocks};
use crate::sort::{DeviceSort, Failure};
use cudarc::driver::{CudaSlice, DeviceRepr};
#[cfg(doc)]
use fanout_compute::SourceMajor;
use fanout_compute::{BlockDims, BlockRef, DeviceResult};
use std::any::Any;
use std::fmt;
use std::sync::{Arc, OnceLock};

/// A validated block on the device: destination-major CSR (`indptr`, `indices`, optional
/// `weights`) and each edge's destination; built on first use and kept: the sources'
/// out-degrees (GCN's coefficients) and the source-major transpose listing each source's edges
/// in edge order (gradients towards the sources). Cheap to clone (shared).
#[derive(Clone)]
pub struct CudaBlock(pub(crate) Arc<BlockData>);

pub(crate) struct BlockData {
    pub(crate) dims: BlockDims,
    pub(crate) indptr: CudaSlice<u32>,
    pub(crate) indices: CudaSlice<u32>,
    pub(crate) weights: Option<CudaSlice<f32>>,
    pub(crate) edst: CudaSlice<u32>,
    out_degrees: OnceLock<CudaSlice<u32>>,
    transposed: OnceLock<Transposed>,
}

/// The source-major side: for source `s`, entries `ptr[s]..ptr[s+1]` give the destination
/// (`dst`) and edge id (`eid`) of its edges, in increasing edge id.
pub(crate) struct Transposed {
    pub(crate) ptr: CudaSlice<u32>,
    pub(crate) dst: CudaSlice<u32>,
    pub(crate) eid: CudaSlice<u32>,
}

impl fmt::Debug for CudaBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaBlock({:?})", self.0.dims)
    }
}

impl CudaBackend {
    /// Copies a validated block to the device and computes each edge's destination there.
    pub(crate) fn upload_block(&self, b: &BlockRef<'_>) -> DeviceResult<CudaBlock> {
        let indptr = self.to_device(b.indptr)?;
        let indices = self.to_device(b.indices)?;
        let weights = match b.weights {
            Some(w) => Some(self.to_device(w)?),
            None => None,
        };
        self.block_from(b.dims(), indptr, indices, weights)
    }

    /// The input vertices a [`CudaSampler`](crate::CudaSampler) left on this device
    /// for a batch (`resident`) whose host input vertices are `idx`: `None` when `resident`
    /// is not such a copy, is on another device or holds another number of ids. As for the
    /// blocks, the contents are not compared.
    pub(crate) fn resident_inputs<'r>(
        &self,
        resident: Option<&'r (dyn Any + Send + Sync)>,
        idx: &[u32],
    ) -> Option<&'r CudaSlice<u32>> {
        let dev = resident?.downcast_ref::<DeviceBlocks>()?;
        (dev.device == self.index() && dev.num_inputs == idx.len() && dev.inputs.len() >= idx.len())
            .then_some(&dev.inputs)
    }

    /// The blocks a [`CudaSampler`](crate::CudaSampler) left on this device for a
    /// batch (`resident`), copied on the device instead of uploaded from `blocks` (the same
    /// blocks on the host, made by the sampler with them); `None` when `resident` is not such
    /// a copy, is on another device, or does not have exactly `blocks`' destination, source
    /// and edge counts. The contents are not compared: a copy moved by hand onto another
    /// batch of the same shapes would be used.
    pub(crate) fn adopt_blocks(
        &self,
        resident: &(dyn Any + Send + Sync),
        blocks: &[BlockRef<'_>],
    ) -> DeviceResult<Option<Vec<CudaBlock>>> {
        let Some(dev) = resident.downcast_ref::<DeviceBlocks>() else {
            return Ok(None);
        };
        // Exactly the shapes the sampler recorded for these blocks (a copy moved onto
        // another batch of other shapes is not adopted), and buffers that hold them.
        let fits = |b: &BlockRef<'_>, &(d, s, e): &(usize, usize, usize)| {
            (b.num_dst, b.num_src, b.indices.len()) == (d, s, e)
        };
        // Weighted blocks have their weights there too, and unweighted ones none.
        let holds = |b: &BlockRef<'_>, d: &DeviceBlock| {
            let e = b.indices.len();
            d.offs.len() > b.num_dst
                && d.ids.len() >= e
                && match (&b.weights, &d.weights) {
                    (None, None) => true,
                    (Some(_), Some(w)) => w.len() >= e,
                    _ => false,
                }
        };
        if dev.device != self.index()
            || dev.blocks.len() != blocks.len()
            || dev.dims.len() != blocks.len()
            || !blocks.iter().zip(&dev.dims).all(|(b, d)| fits(b, d))
            || !blocks.iter().zip(&dev.blocks).all(|(b, d)| holds(b, d))
        {
            return Ok(None);
        }
        fn copy<T: DeviceRepr>(
            be: &CudaBackend,
            s: &CudaSlice<T>,
            len: usize,
        ) -> DeviceResult<CudaSlice<T>> {
            be.stream()
                .clone_dtod(&s.slice(0..len.max(1)))
                .map_err(|e| device_error("cuMemcpyDtoD (sampled block)", e))
        }
        let adopted = blocks.iter().zip(&dev.blocks).map(|(b, d)| {
            let dims = b.dims();
            let weights = match &d.weights {
                Some(w) => Some(copy(self, w, dims.num_edges)?),
                None => None,
            };
            self.block_from(
                dims,
                copy(self, &d.offs, dims.num_dst + 1)?,
                copy(self, &d.ids, dims.num_edges)?,
                weights,
            )
        });
        Ok(Some(adopted.collect::<DeviceResult<_>>()?))
    }

    /// A block from its device arrays: computes each edge's destination there.
    fn block_from(
        &self,
        dims: BlockDims,
        indptr: CudaSlice<u32>,
        indices: CudaSlice<u32>,
        weights: Option<CudaSlice<f32>>,
    ) -> DeviceResult<CudaBlock> {
        let mut edst = self.alloc::<u32>(dims.num_edges)?;
        let dsts = dims.num_dst as i64;
        launch!(
            self.inner,
            "edge_dst",
            dims.num_dst,
            [&indptr, &mut edst, &dsts]
        );
        Ok(CudaBlock(Arc::new(BlockData {
            dims,
            indptr,
            indices,
            weights,
            edst,
            out_degrees: OnceLock::new(),
            transposed: OnceLock::new(),
        })))
    }

    /// The number of edges leaving each source (counted on the device on first use, kept).
    pub(crate) fn out_degrees<'b>(&self, b: &'b CudaBlock) -> DeviceResult<&'b CudaSlice<u32>> {
        if let Some(counts) = b.0.out_degrees.get() {
            return Ok(counts);
        }
        let d = &b.0;
        let mut counts = self.alloc::<u32>(d.dims.num_src)?;
        let edges = d.dims.num_edges as i64;
        launch!(
            self.inner,
            "count_sources",
            d.dims.num_edges,
            [&d.indices, &mut counts, &edges]
        );
        // Another thread may have counted meanwhile: the first count kept is used.
        Ok(b.0.out_degrees.get_or_init(|| counts))
    }

    /// The block's transpose on first use, built on the device and kept: the sources'
    /// offsets are the prefix sum of their out-degrees, and a stable radix sort of the edges
    /// by source gives each source's edge ids in increasing order and, through each edge's
    /// destination, the destinations: [`SourceMajor::of`]'s arrays exactly (integer work
    /// only). Layers that aggregate their input first (GraphSAGE, GCN) never need it on the
    /// input layer's block, the largest: its sources get no gradient. GAT's attention
    /// gradients need it on every block.
    pub(crate) fn transposed<'b>(&self, b: &'b CudaBlock) -> DeviceResult<&'b Transposed> {
        if let Some(t) = b.0.transposed.get() {
            return Ok(t);
        }
        let d = &b.0;
        let (n, e) = (d.dims.num_src, d.dims.num_edges);
        let sort = DeviceSort {
            stream: self.stream(),
            kernels: self.kernels(),
        };
        let degrees = self.out_degrees(b)?;
        let built = self.inner.timed("transpose (radix sort)", || {
            let ptr = sort.exclusive_scan(degrees, n)?;
            let max_key = n.saturating_sub(1) as u32;
            let (_, eid) = sort.sort_with_positions(&d.indices, e, max_key)?;
            let dst = sort.gather(&d.edst, &eid, e)?;
            Ok::<_, Failure>(Transposed { ptr, dst, eid })
        });
        let t = built.map_err(|(call, err)| device_error(call, err))?;
        // Another thread may have built one meanwhile: the first one kept is used.
        Ok(b.0.transposed.get_or_init(|| t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CudaDevice;
    use fanout_compute::SourceMajor;
    use fanout_rand::Rng;

    /// The device transpose against `SourceMajor::of` on blocks with a hub source (a long
    /// segment), repeated sources, edgeless destinations, sources without edges, and source
    /// counts that take one to four radix passes. Skips without a GPU.
    #[test]
    fn device_transposes_are_the_hosts() {
        let dev = match CudaDevice::open(0) {
            Ok(d) => d,
            Err(e) => return eprintln!("skipped: no GPU here ({e})"),
        };
        let be = CudaBackend::new(&dev).unwrap();
        let mut rng = Rng::new(9);
        for (num_dst, num_src, max_deg) in [
            (1, 1, 1),
            (5, 9, 0),
            (300, 250, 12),
            (3000, 70_000, 30),
            (20_000, 400_000, 40),
            (100, (1 << 24) + 5, 5),
        ] {
            let num_src: usize = num_src.max(num_dst);
            let mut indptr = vec![0u32];
            let mut indices = Vec::new();
            for d in 0..num_dst {
                let deg = if d % 7 == 3 {
                    0
                } else {
                    rng.below(max_deg + 1)
                };
                for _ in 0..deg {
                    // A third of the edges go to source 0 (a hub), the rest anywhere.
                    let s = if rng.below(3) == 0 {
                        0
                    } else {
                        rng.below(num_src as u64) as u32
                    };
                    indices.push(s);
                }
                indptr.push(indices.len() as u32);
            }
            let b = BlockRef {
                num_dst,
                num_src,
                indptr: &indptr,
                indices: &indices,
                weights: None,
            };
            let block = be.upload_block(&b).unwrap();
            let t = be.transposed(&block).unwrap();
            let want = SourceMajor::of(&indptr, &indices, num_src);
            let e = indices.len();
            let case = format!("{num_dst} x {num_src}, {e} edges");
            assert_eq!(
                be.to_host(&t.ptr, num_src + 1).unwrap(),
                want.indptr,
                "{case}: offsets"
            );
            assert_eq!(be.to_host(&t.eid, e).unwrap(), want.eid, "{case}: edge ids");
            assert_eq!(
                be.to_host(&t.dst, e).unwrap(),
                want.dst,
                "{case}: destinations"
            );
        }
    }
}
