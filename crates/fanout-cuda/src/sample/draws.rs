//! How a GPU sampler's hop draws each frontier vertex's arcs: uniformly (`khop_counts`,
//! `khop_sample`) or in proportion to the arcs' weights through their alias tables
//! (`weighted_pick`, `weighted_place`), and where the arrays the kernels read are kept.

use super::{ArcsAt, CudaKHopSampler, FIRST};
use crate::backend::kernels::grid;
use crate::cuda::mapped_pinned;
use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, DevicePtr, DeviceRepr, DriverError, PinnedHostSlice,
    ValidAsZeroBits,
};
use fanout_graph::{Error, Result};
use fanout_sample::{BatchKey, KHopSampler, WeightedSampler, FANOUT_ALL};
use std::sync::Arc;

/// An array the sampling kernels read: in device memory, or in page-locked host memory read
/// over the bus by its device address ([`ArcsAt::PinnedHost`]).
pub(super) enum Readable<T> {
    Device(CudaSlice<T>),
    /// The pinned buffer (kept alive here) and its device address.
    Pinned {
        _buf: PinnedHostSlice<T>,
        addr: u64,
    },
}

impl<T: DeviceRepr + ValidAsZeroBits + Copy> Readable<T> {
    /// A copy of `src` where `at` says (an empty `src` takes one zeroed element).
    pub(super) fn copy_of(
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        at: ArcsAt,
        src: &[T],
    ) -> std::result::Result<Self, (&'static str, DriverError)> {
        match at {
            ArcsAt::Device if src.is_empty() => stream
                .alloc_zeros(1)
                .map(Readable::Device)
                .map_err(|e| ("cuMemAlloc", e)),
            ArcsAt::Device => stream
                .clone_htod(src)
                .map(Readable::Device)
                .map_err(|e| ("cuMemcpyHtoD", e)),
            ArcsAt::PinnedHost => {
                let (buf, addr) = mapped_pinned(ctx, src.len(), |dst| dst.copy_from_slice(src))?;
                Ok(Readable::Pinned { _buf: buf, addr })
            }
        }
    }

    /// The address the kernels read it at.
    pub(super) fn addr(&self, stream: &CudaStream) -> u64 {
        match self {
            Readable::Device(d) => d.device_ptr(stream).0,
            Readable::Pinned { addr, .. } => *addr,
        }
    }
}

/// How a hop draws a vertex's arcs.
pub(super) enum Draws {
    /// Uniformly, as `fanout-sample`'s `KHopSampler`.
    Uniform,
    /// In proportion to weight, as `fanout-sample`'s `WeightedSampler`: every arc's weight,
    /// keep-probability and alias, beside the arcs.
    Weighted {
        weights: Readable<f32>,
        prob: Readable<f32>,
        idx: Readable<u32>,
    },
}

/// One hop's edges on the device: the block's offsets (`n + 1`), its sampled global ids, their
/// weights (weighted draws) and their count.
pub(super) struct HopEdges {
    pub(super) offs: CudaSlice<u32>,
    pub(super) ids: CudaSlice<u32>,
    pub(super) weights: Option<CudaSlice<f32>>,
    pub(super) m: usize,
}

impl CudaKHopSampler {
    /// Draws hop `hop` for the `n` vertices of `frontier` (device ids). With `map`, each
    /// sampled id's remap word is lowered to its first edge position.
    pub(super) fn draw_hop(
        &self,
        frontier: &CudaSlice<u32>,
        n: usize,
        key: &BatchKey,
        hop: usize,
        map: Option<&mut CudaSlice<u32>>,
    ) -> Result<HopEdges> {
        let k = self.cfg.fanouts[hop];
        let replace = u32::from(self.cfg.replace && k != FANOUT_ALL);
        let n64 = n as i64;
        // Each vertex's edges (uniform), or the most it can yield (weighted).
        let mut counts = self.alloc::<u32>(n)?;
        launch!(
            self,
            "khop_counts",
            grid(n),
            [frontier, &n64, &self.indptr, &k, &replace, &mut counts]
        )?;
        // The offsets are u32 sums: when n x k could reach 2^31 (k = all, or a huge
        // frontier), the counts are summed on the host first so that a total past the
        // remapper's 2^31 is refused rather than wrapped.
        if k == FANOUT_ALL || n as u64 * k as u64 >= FIRST as u64 {
            let total: u64 = self
                .download(&counts, 0, n)?
                .iter()
                .map(|&c| c as u64)
                .sum();
            if total >= FIRST as u64 {
                return Err(Error::Invalid(format!(
                    "a mini-batch of more than 2^31 edges (hop {hop}: {total} edges)"
                )));
            }
        }
        let offs = self.exclusive_scan(&counts, n)?;
        let m = self.download(&offs, n, n + 1)?[0] as usize;
        let map_addr = match map {
            Some(m) => m.device_ptr(&self.stream).0,
            None => 0u64,
        };
        let arcs = self.indices.addr(&self.stream);
        let Draws::Weighted { weights, prob, idx } = &self.draws else {
            let base = KHopSampler::hop_base(key, hop);
            let mut ids = self.alloc::<u32>(m)?;
            launch!(
                self,
                "khop_sample",
                grid(n),
                [
                    frontier,
                    &n64,
                    &self.indptr,
                    &arcs,
                    &k,
                    &replace,
                    &base,
                    &offs,
                    &mut ids,
                    &map_addr
                ]
            )?;
            return Ok(HopEdges {
                offs,
                ids,
                weights: None,
                m,
            });
        };
        // Weighted: the picks go to room for the most each vertex can yield (`offs`), then
        // are moved into the block at the offsets of what each yielded.
        let base = WeightedSampler::hop_base(key, hop);
        let (pad, mut pos) = (offs, self.alloc::<u32>(m)?);
        let (w, p, a) = (
            weights.addr(&self.stream),
            prob.addr(&self.stream),
            idx.addr(&self.stream),
        );
        launch!(
            self,
            "weighted_pick",
            grid(n),
            [
                frontier,
                &n64,
                &self.indptr,
                &w,
                &p,
                &a,
                &k,
                &replace,
                &base,
                &pad,
                &mut pos,
                &mut counts
            ]
        )?;
        let offs = self.exclusive_scan(&counts, n)?;
        let m = self.download(&offs, n, n + 1)?[0] as usize;
        let mut ids = self.alloc::<u32>(m)?;
        let mut wout = self.alloc::<f32>(m)?;
        launch!(
            self,
            "weighted_place",
            grid(n),
            [
                frontier,
                &n64,
                &self.indptr,
                &arcs,
                &w,
                &pad,
                &pos,
                &offs,
                &mut ids,
                &mut wout,
                &map_addr
            ]
        )?;
        Ok(HopEdges {
            offs,
            ids,
            weights: Some(wout),
            m,
        })
    }
}
