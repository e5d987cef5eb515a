//! How a GPU sampler's hop draws each frontier vertex's neighbours: uniformly (`khop_counts`,
//! `khop_sample`), in proportion to the arcs' weights through their alias tables
//! (`weighted_pick`, `weighted_place`), or as the most visited of PinSAGE random walks
//! (`walk_pick`, `walk_place`); and where the arrays the kernels read are kept. The last two
//! learn how many edges a vertex yields only as they draw, so they draw into room set aside
//! per vertex, prefix-sum what each yielded, then move the draws into the block.

use super::{ArcsAt, CudaSampler, FIRST};
use crate::backend::kernels::grid;
use crate::cuda::mapped_pinned;
use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, DevicePtr, DeviceRepr, DriverError, PinnedHostSlice,
    ValidAsZeroBits,
};
use fanout_graph::{Error, Result};
use fanout_sample::{
    AliasTables, BatchKey, KHopSampler, RandomWalkSampler, WeightedSampler, FANOUT_ALL,
};
use rayon::prelude::*;
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

impl<T: DeviceRepr + ValidAsZeroBits + Copy + Default> Readable<T> {
    /// `len` elements where `at` says, written by `fill` (pinned: in place; on the device:
    /// into a host vector, then copied); an empty array takes one zeroed element.
    pub(super) fn filled(
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        at: ArcsAt,
        len: usize,
        fill: impl FnOnce(&mut [T]),
    ) -> std::result::Result<Self, (&'static str, DriverError)> {
        match at {
            ArcsAt::Device if len == 0 => stream
                .alloc_zeros(1)
                .map(Readable::Device)
                .map_err(|e| ("cuMemAlloc", e)),
            ArcsAt::Device => {
                let mut host = vec![T::default(); len];
                fill(&mut host);
                stream
                    .clone_htod(&host)
                    .map(Readable::Device)
                    .map_err(|e| ("cuMemcpyHtoD", e))
            }
            ArcsAt::PinnedHost => {
                let (buf, addr) = mapped_pinned(ctx, len, fill)?;
                Ok(Readable::Pinned { _buf: buf, addr })
            }
        }
    }

    /// A copy of `src` where `at` says (on the device straight from `src`).
    pub(super) fn copy_of(
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        at: ArcsAt,
        src: &[T],
    ) -> std::result::Result<Self, (&'static str, DriverError)> {
        match at {
            ArcsAt::Device if !src.is_empty() => stream
                .clone_htod(src)
                .map(Readable::Device)
                .map_err(|e| ("cuMemcpyHtoD", e)),
            _ => Self::filled(ctx, stream, at, src.len(), |d| d.copy_from_slice(src)),
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

/// The kind of sampler to build, with what it needs from the host.
pub(super) enum Kind<'a> {
    Uniform {
        replace: bool,
    },
    Weighted {
        replace: bool,
        tables: &'a AliasTables,
    },
    Walks(Walks),
}

/// PinSAGE's walks from each vertex: how many, at most how many steps, and the probability of
/// stopping after each step (`RandomWalkConfig`'s fields).
#[derive(Clone, Copy)]
pub(super) struct Walks {
    pub(super) walks: u32,
    pub(super) length: u32,
    pub(super) stop_prob: f64,
}

/// How a hop draws a vertex's neighbours.
pub(super) enum Draws {
    /// Uniformly, as `fanout-sample`'s `KHopSampler`.
    Uniform { replace: bool },
    /// In proportion to weight, as `fanout-sample`'s `WeightedSampler`: every arc's weight,
    /// and its keep-probability and alias packed in one word (`sample.cu`'s `alias_prob`,
    /// `alias_idx`), beside the arcs.
    Weighted {
        replace: bool,
        weights: Readable<f32>,
        alias: Readable<u64>,
    },
    /// The top-k of random walks, as `fanout-sample`'s `RandomWalkSampler`.
    Walks(Walks),
}

impl Draws {
    /// The draws of `kind`, its arrays copied where `at` says; on failure, the call (and what
    /// it copied) and its error.
    pub(super) fn of(
        kind: Kind<'_>,
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        at: ArcsAt,
    ) -> std::result::Result<Self, (String, DriverError)> {
        Ok(match kind {
            Kind::Uniform { replace } => Draws::Uniform { replace },
            Kind::Walks(w) => Draws::Walks(w),
            Kind::Weighted { replace, tables } => {
                fn named(what: &str) -> impl Fn((&str, DriverError)) -> (String, DriverError) + '_ {
                    move |(call, e)| (format!("{call} ({what})"), e)
                }
                let (w, p, x) = (&tables.weights, &tables.prob, &tables.idx);
                Draws::Weighted {
                    replace,
                    weights: Readable::copy_of(ctx, stream, at, w).map_err(named("weights"))?,
                    alias: Readable::filled(ctx, stream, at, p.len(), |d| {
                        d.par_iter_mut().enumerate().for_each(|(e, d)| {
                            *d = p[e].to_bits() as u64 | (x[e] as u64) << 32;
                        })
                    })
                    .map_err(named("alias tables"))?,
                }
            }
        })
    }
}

/// One hop's edges on the device: the block's offsets (`n + 1`), its sampled global ids, their
/// weights (weighted draws) and their count.
pub(super) struct HopEdges {
    pub(super) offs: CudaSlice<u32>,
    pub(super) ids: CudaSlice<u32>,
    pub(super) weights: Option<CudaSlice<f32>>,
    pub(super) m: usize,
}

impl CudaSampler {
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
        let map = match map {
            Some(m) => m.device_ptr(&self.stream).0,
            None => 0u64,
        };
        let k = self.fanouts[hop];
        let hop = Hop {
            frontier,
            n,
            n64: n as i64,
            k,
            hop,
            map,
        };
        match &self.draws {
            &Draws::Uniform { replace } => self.uniform_hop(&hop, replace, key),
            Draws::Weighted {
                replace,
                weights,
                alias,
            } => {
                let tables = [weights.addr(&self.stream), alias.addr(&self.stream)];
                self.weighted_hop(&hop, *replace, tables, key)
            }
            &Draws::Walks(w) => self.walk_hop(&hop, w, key),
        }
    }

    /// Each vertex's edges (uniform), or the most it can yield (weighted): `khop_counts`.
    fn bounds(&self, h: &Hop<'_>, replace: u32) -> Result<CudaSlice<u32>> {
        let mut counts = self.alloc::<u32>(h.n)?;
        launch!(
            self,
            "khop_counts",
            grid(h.n),
            [
                h.frontier,
                &h.n64,
                &self.indptr,
                &h.k,
                &replace,
                &mut counts
            ]
        )?;
        Ok(counts)
    }

    /// The offsets of `counts` (`n + 1`) and their total. The offsets are u32 sums: where
    /// `most` (a bound on the total) could reach 2^31, the counts are summed on the host first
    /// so that a total past the remapper's 2^31 is refused rather than wrapped. (A weighted
    /// hop's counts are bounds themselves, its room: every arc of a row, zero weights
    /// included, for `FANOUT_ALL`; such a hop may be refused for edges it would not draw.)
    fn offsets(
        &self,
        counts: &CudaSlice<u32>,
        n: usize,
        most: u64,
        hop: usize,
    ) -> Result<(CudaSlice<u32>, usize)> {
        if most >= FIRST as u64 {
            let total: u64 = self.download(counts, 0, n)?.iter().map(|&c| c as u64).sum();
            if total >= FIRST as u64 {
                return Err(Error::Invalid(format!(
                    "a mini-batch of more than 2^31 edges (hop {hop}: up to {total} edges)"
                )));
            }
        }
        let offs = self.exclusive_scan(counts, n)?;
        let m = self.download(&offs, n, n + 1)?[0] as usize;
        Ok((offs, m))
    }

    fn uniform_hop(&self, h: &Hop<'_>, replace: bool, key: &BatchKey) -> Result<HopEdges> {
        let replace = u32::from(replace && h.k != FANOUT_ALL);
        let counts = self.bounds(h, replace)?;
        let (offs, m) = self.offsets(&counts, h.n, h.most(), h.hop)?;
        let base = KHopSampler::hop_base(key, h.hop);
        let arcs = self.indices.addr(&self.stream);
        let mut ids = self.alloc::<u32>(m)?;
        launch!(
            self,
            "khop_sample",
            grid(h.n),
            [
                h.frontier,
                &h.n64,
                &self.indptr,
                &arcs,
                &h.k,
                &replace,
                &base,
                &offs,
                &mut ids,
                &h.map
            ]
        )?;
        Ok(HopEdges {
            offs,
            ids,
            weights: None,
            m,
        })
    }

    /// `tables`: the device addresses of the weights and the packed alias entries.
    fn weighted_hop(
        &self,
        h: &Hop<'_>,
        replace: bool,
        [w, alias]: [u64; 2],
        key: &BatchKey,
    ) -> Result<HopEdges> {
        let replace = u32::from(replace && h.k != FANOUT_ALL);
        // The picks go to room for the most each vertex can yield (`pad`), then are moved
        // into the block at the offsets of what each yielded.
        let mut counts = self.bounds(h, replace)?;
        let (pad, room) = self.offsets(&counts, h.n, h.most(), h.hop)?;
        let base = WeightedSampler::hop_base(key, h.hop);
        let mut pos = self.alloc::<u32>(room)?;
        launch!(
            self,
            "weighted_pick",
            grid(h.n),
            [
                h.frontier,
                &h.n64,
                &self.indptr,
                &w,
                &alias,
                &h.k,
                &replace,
                &base,
                &pad,
                &mut pos,
                &mut counts
            ]
        )?;
        // What each vertex yielded is at most its room, whose total passed the check above.
        let (offs, m) = self.offsets(&counts, h.n, 0, h.hop)?;
        let arcs = self.indices.addr(&self.stream);
        let mut ids = self.alloc::<u32>(m)?;
        let mut wout = self.alloc::<f32>(m)?;
        launch!(
            self,
            "weighted_place",
            grid(h.n),
            [
                h.frontier,
                &h.n64,
                &self.indptr,
                &arcs,
                &w,
                &pad,
                &pos,
                &offs,
                &mut ids,
                &mut wout,
                &h.map
            ]
        )?;
        Ok(HopEdges {
            offs,
            ids,
            weights: Some(wout),
            m,
        })
    }

    fn walk_hop(
        &self,
        h: &Hop<'_>,
        Walks {
            walks,
            length,
            stop_prob,
        }: Walks,
        key: &BatchKey,
    ) -> Result<HopEdges> {
        // Room for every step's vertex and its count, per frontier vertex.
        let room = walks as u64 * length as u64;
        let words = (h.n as u64)
            .checked_mul(room)
            .and_then(|w| usize::try_from(w).ok())
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "hop {}: {walks} walks of {length} steps from each of {} vertices need \
                     more room than can be addressed",
                    h.hop, h.n
                ))
            })?;
        let (mut vis, mut hits) = (self.alloc::<u32>(words)?, self.alloc::<u32>(words)?);
        let mut counts = self.alloc::<u32>(h.n)?;
        let base = RandomWalkSampler::hop_base(key, h.hop);
        let arcs = self.indices.addr(&self.stream);
        launch!(
            self,
            "walk_pick",
            grid(h.n),
            [
                h.frontier,
                &h.n64,
                &self.indptr,
                &arcs,
                &walks,
                &length,
                &stop_prob,
                &base,
                &room,
                &h.k,
                &mut vis,
                &mut hits,
                &mut counts
            ]
        )?;
        let most = h.n as u64 * room.min(h.k as u64);
        let (offs, m) = self.offsets(&counts, h.n, most, h.hop)?;
        let mut ids = self.alloc::<u32>(m)?;
        let mut wout = self.alloc::<f32>(m)?;
        launch!(
            self,
            "walk_place",
            grid(h.n),
            [&h.n64, &room, &vis, &hits, &offs, &mut ids, &mut wout, &h.map]
        )?;
        Ok(HopEdges {
            offs,
            ids,
            weights: Some(wout),
            m,
        })
    }
}

/// One hop's frontier and size, as the kernels take them.
struct Hop<'a> {
    frontier: &'a CudaSlice<u32>,
    n: usize,
    n64: i64,
    /// Neighbours (or top-k) per vertex.
    k: u32,
    hop: usize,
    /// The remap words' device address, or 0 for none.
    map: u64,
}

impl Hop<'_> {
    /// A bound on the edges of a k-hop: `n x k` (every arc for `FANOUT_ALL`).
    fn most(&self) -> u64 {
        if self.k == FANOUT_ALL {
            u64::MAX
        } else {
            self.n as u64 * self.k as u64
        }
    }
}
