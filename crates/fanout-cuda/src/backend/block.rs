//! A block (one layer's message-flow graph) in device memory, with its transpose built on
//! first use.

use super::kernels::launch;
use super::CudaBackend;
use cudarc::driver::CudaSlice;
use fanout_compute::{BlockDims, BlockRef, SourceMajor};
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
    pub(crate) fn upload_block(&self, b: &BlockRef<'_>) -> CudaBlock {
        let dims = b.dims();
        let indptr = self.to_device(b.indptr);
        let indices = self.to_device(b.indices);
        let weights = b.weights.map(|w| self.to_device(w));
        let mut edst = self.alloc::<u32>(dims.num_edges);
        let dsts = dims.num_dst as i64;
        launch!(
            self.inner,
            "edge_dst",
            dims.num_dst,
            [&indptr, &mut edst, &dsts]
        );
        CudaBlock(Arc::new(BlockData {
            dims,
            indptr,
            indices,
            weights,
            edst,
            out_degrees: OnceLock::new(),
            transposed: OnceLock::new(),
        }))
    }

    /// The number of edges leaving each source (counted on the device on first use, kept).
    pub(crate) fn out_degrees<'b>(&self, b: &'b CudaBlock) -> &'b CudaSlice<u32> {
        b.0.out_degrees.get_or_init(|| {
            let d = &b.0;
            let mut counts = self.alloc::<u32>(d.dims.num_src);
            let edges = d.dims.num_edges as i64;
            launch!(
                self.inner,
                "count_sources",
                d.dims.num_edges,
                [&d.indices, &mut counts, &edges]
            );
            counts
        })
    }

    /// The block's transpose ([`SourceMajor::of`], built on the host: each source lists its
    /// edges in increasing edge id) on first use, uploaded and kept.
    /// Layers that aggregate their input first (GraphSAGE, GCN) never need it on the input
    /// layer's block, the largest: its sources get no gradient. GAT's attention gradients
    /// need it on every block.
    pub(crate) fn transposed<'b>(&self, b: &'b CudaBlock) -> &'b Transposed {
        b.0.transposed.get_or_init(|| {
            let d = &b.0;
            let host_indptr = self.to_host(&d.indptr, d.dims.num_dst + 1);
            let host_indices = self.to_host(&d.indices, d.dims.num_edges);
            let t = SourceMajor::of(&host_indptr, &host_indices, d.dims.num_src);
            Transposed {
                ptr: self.to_device(&t.indptr),
                dst: self.to_device(&t.dst),
                eid: self.to_device(&t.eid),
            }
        })
    }
}
