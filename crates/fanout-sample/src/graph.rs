//! What every sampler shares: the checks a dataset must pass, monomorphised access to its rows,
//! the random-stream keys, fanout parsing and the parallel row builders.

use crate::minibatch::BatchKey;
use fanout_graph::{CsrVisitor, Dataset, Error, Layout, Offset, Result, Topology, VertexId};
use fanout_rand::{mix_keys, Rng};
use rayon::prelude::*;

/// A fanout meaning "every neighbour" (written `-1` or `all` on the command line, as in DGL).
pub const FANOUT_ALL: u32 = u32::MAX;

/// Parses fanouts written in hop order from the seeds, e.g. `"15,10,5"`: each seed draws 15
/// neighbours, each of those 10, each of those 5. `-1` or `all` takes every neighbour
/// ([`FANOUT_ALL`]). Errors on an empty list, zero or anything else that is not a count.
pub fn parse_fanouts(s: &str) -> std::result::Result<Vec<u32>, String> {
    let out: Vec<u32> = s
        .split(',')
        .map(|t| {
            let t = t.trim();
            match t {
                "-1" | "all" => Ok(FANOUT_ALL),
                _ => match t.parse::<u32>() {
                    Ok(0) => Err(format!(
                        "fanout 0 in {s:?}: each hop must draw at least one neighbour"
                    )),
                    Ok(k) if k != FANOUT_ALL => Ok(k),
                    _ => Err(format!(
                        "fanout {t:?} in {s:?} is not a positive count (or -1 for all neighbours)"
                    )),
                },
            }
        })
        .collect::<std::result::Result<_, _>>()?;
    if out.is_empty() {
        return Err("empty fanout list".into());
    }
    Ok(out)
}

/// Checks that `ds` can be sampled: vertex ids fit in 32 bits (mini-batches carry u32 global
/// ids, like the split files). Both layouts are accepted: samplers walk the stored rows, which
/// are in-neighbours for CSC (pull sampling, the default) and out-neighbours for CSR (messages
/// then flow against arc direction; identical for symmetric graphs).
pub fn check_dataset(ds: &Dataset) -> Result<()> {
    if ds.num_nodes() >= u32::MAX as u64 {
        return Err(Error::Invalid(format!(
            "{}: {} vertices; sampling supports at most 2^32 - 2 (mini-batches use 32-bit ids)",
            ds.dir.display(),
            ds.num_nodes()
        )));
    }
    Ok(())
}

/// A note for people when the dataset is CSR (samplers then follow out-neighbours), else `None`.
pub fn layout_note(ds: &Dataset) -> Option<String> {
    (ds.topology.layout == Layout::Csr).then(|| {
        format!(
            "note: {} is stored as CSR: sampling walks out-neighbours (reverse arcs); \
             store it as CSC (the default) to sample in-neighbours",
            ds.dir.display()
        )
    })
}

/// Checks seeds: errors (naming one) if a seed is not a vertex of a graph of `n` vertices.
/// Distinctness is checked by the remapper.
pub fn check_seeds(seeds: &[u32], n: u64) -> Result<()> {
    if let Some(&bad) = seeds.par_iter().find_any(|&&s| s as u64 >= n) {
        return Err(Error::Invalid(format!(
            "seed vertex {bad} is out of range; the graph has {n} vertices"
        )));
    }
    Ok(())
}

/// The compressed topology with concrete element types.
#[derive(Clone, Copy)]
pub(crate) struct Csr<'a, O, I> {
    pub indptr: &'a [O],
    pub indices: &'a [I],
}

impl<'a, O: Offset, I: VertexId> Csr<'a, O, I> {
    /// Offsets of row `v`.
    #[inline]
    pub fn bounds(&self, v: u32) -> (usize, usize) {
        let v = v as usize;
        (Offset::idx(self.indptr[v]), Offset::idx(self.indptr[v + 1]))
    }
    /// Row `v`.
    #[inline]
    pub fn row(&self, v: u32) -> &'a [I] {
        let (a, b) = self.bounds(v);
        &self.indices[a..b]
    }
    /// Row length of `v`.
    #[inline]
    pub fn degree(&self, v: u32) -> usize {
        let (a, b) = self.bounds(v);
        b - a
    }
}

/// Work that runs on [`Csr`] with its concrete types.
pub(crate) trait CsrJob {
    type Out;
    fn run<O: Offset, I: VertexId>(self, g: Csr<'_, O, I>) -> Self::Out;
}

struct Visit<J>(J);
impl<J: CsrJob> CsrVisitor for Visit<J> {
    type Output = J::Out;
    fn visit<O: Offset, I: VertexId>(self, indptr: &[O], indices: &[I]) -> J::Out {
        self.0.run(Csr { indptr, indices })
    }
}

/// Runs `job` on the topology's concrete arrays (one monomorphised copy per width).
pub(crate) fn with_csr<J: CsrJob>(t: &Topology, job: J) -> J::Out {
    t.visit(Visit(job))
}

/// A vertex id from the topology as u32 (checked by [`check_dataset`]).
#[inline]
pub(crate) fn vid<I: VertexId>(x: I) -> u32 {
    VertexId::idx(x) as u32
}

/// Stream tags: samplers never share random streams.
pub(crate) mod tag {
    pub const UNIFORM: u64 = 0x0055_4e49;
    pub const WEIGHTED: u64 = 0x0057_4754;
    pub const WALK: u64 = 0x0057_414c;
    pub const LAYER: u64 = 0x004c_4159;
    pub const SHUFFLE: u64 = 0x0053_4855;
}

/// The base key of one hop of one batch for one sampler: `mix_keys([seed, epoch, step, tag,
/// hop])`. Vertex `v`'s stream in that hop is [`vertex_rng`]`(base, v)`.
pub(crate) fn hop_stream(key: &BatchKey, tag: u64, hop: usize) -> u64 {
    mix_keys(&[key.seed, key.epoch, key.step, tag, hop as u64])
}

/// The random stream of vertex `v` within a hop: `Rng::keyed(&[base, v])`.
#[inline]
pub(crate) fn vertex_rng(base: u64, v: u32) -> Rng {
    Rng::keyed(&[base, v as u64])
}

/// Hints the CPU to fetch the cache line holding `x` (no-op off x86-64). Never faults.
#[inline(always)]
pub(crate) fn prefetch<T>(x: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it never faults or changes memory, and SSE is baseline on
    // x86-64.
    #[allow(unused_unsafe)]
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch(x as *const T as *const i8, _MM_HINT_T0);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

/// How many rows [`par_fill`]'s first stage runs ahead of its second.
pub(crate) const AHEAD: usize = 6;

/// Rows per parallel task in the row builders.
const GRAIN: usize = 256;

/// Exclusive prefix sum of row lengths as u32 offsets. Panics if a block would hold 2^32 or
/// more edges (about 16 GiB of indices for one layer of one batch).
pub(crate) fn offsets(lens: &[u32]) -> Vec<u32> {
    let mut out = Vec::with_capacity(lens.len() + 1);
    let mut acc = 0u64;
    out.push(0);
    for &l in lens {
        acc += l as u64;
        out.push(u32::try_from(acc).expect("one block holds 2^32 or more sampled edges"));
    }
    out
}

/// Splits `out` at the row offsets of every `GRAIN`-th row.
fn split_rows<'a, T>(mut out: &'a mut [T], indptr: &[u32]) -> Vec<&'a mut [T]> {
    let n = indptr.len() - 1;
    let mut parts = Vec::with_capacity(n / GRAIN + 1);
    let mut r = 0;
    while r < n {
        let e = (r + GRAIN).min(n);
        let (head, tail) = out.split_at_mut((indptr[e] - indptr[r]) as usize);
        parts.push(head);
        out = tail;
        r = e;
    }
    parts
}

/// Fills rows of known lengths in parallel: `f(row, ids, weights)` gets the row's slices of
/// `ids` (and of `weights`, when given), laid out by `indptr`. `ahead(row, ids)` runs on each row
/// [`AHEAD`] rows before `f` does (within a task; same row order), so a caller can split its work
/// into a first stage that prefetches what the second will read.
pub(crate) fn par_fill<F, A>(
    indptr: &[u32],
    ids: &mut [u32],
    weights: Option<&mut [f32]>,
    ahead: A,
    f: F,
) where
    F: Fn(usize, &mut [u32], Option<&mut [f32]>) + Sync,
    A: Fn(usize, &mut [u32]) + Sync,
{
    let id_parts = split_rows(ids, indptr);
    let w_parts: Vec<Option<&mut [f32]>> = match weights {
        Some(w) => split_rows(w, indptr).into_iter().map(Some).collect(),
        None => id_parts.iter().map(|_| None).collect(),
    };
    id_parts
        .into_par_iter()
        .zip(w_parts)
        .enumerate()
        .for_each(|(c, (ids, mut w))| {
            let r0 = c * GRAIN;
            let r1 = (r0 + GRAIN).min(indptr.len() - 1);
            let base = indptr[r0] as usize;
            let span = |r: usize| indptr[r] as usize - base..indptr[r + 1] as usize - base;
            for r in r0..r1.min(r0 + AHEAD) {
                ahead(r, &mut ids[span(r)]);
            }
            for r in r0..r1 {
                if r + AHEAD < r1 {
                    ahead(r + AHEAD, &mut ids[span(r + AHEAD)]);
                }
                f(r, &mut ids[span(r)], w.as_mut().map(|w| &mut w[span(r)]));
            }
        });
}

/// Rows built by appending: `f(row, ids, weights)` pushes row `row`'s edges (and, when
/// `with_weights`, one weight per edge). Returns `(indptr, ids, weights)`; deterministic.
pub(crate) fn par_collect<F>(n: usize, with_weights: bool, f: F) -> (Vec<u32>, Vec<u32>, Vec<f32>)
where
    F: Fn(usize, &mut Vec<u32>, &mut Vec<f32>) + Sync,
{
    let parts: Vec<(Vec<u32>, Vec<u32>, Vec<f32>)> = (0..n.div_ceil(GRAIN))
        .into_par_iter()
        .map(|c| {
            let (mut lens, mut ids, mut w) = (Vec::new(), Vec::new(), Vec::new());
            for r in c * GRAIN..((c + 1) * GRAIN).min(n) {
                let before = ids.len();
                f(r, &mut ids, &mut w);
                lens.push((ids.len() - before) as u32);
                debug_assert!(!with_weights || w.len() == ids.len());
            }
            (lens, ids, w)
        })
        .collect();
    let lens: Vec<u32> = parts.iter().flat_map(|p| p.0.iter().copied()).collect();
    let indptr = offsets(&lens);
    let mut ids = vec![0u32; *indptr.last().unwrap() as usize];
    let mut weights = vec![0f32; if with_weights { ids.len() } else { 0 }];
    // Parallel concatenation.
    let mut id_slices = Vec::with_capacity(parts.len());
    let mut w_slices = Vec::with_capacity(parts.len());
    let (mut rest_i, mut rest_w) = (&mut ids[..], &mut weights[..]);
    for p in &parts {
        let (h, t) = rest_i.split_at_mut(p.1.len());
        id_slices.push(h);
        rest_i = t;
        let wl = if with_weights { p.2.len() } else { 0 };
        let (h, t) = rest_w.split_at_mut(wl);
        w_slices.push(h);
        rest_w = t;
    }
    parts
        .par_iter()
        .zip(id_slices)
        .zip(w_slices)
        .for_each(|((p, i), w)| {
            i.copy_from_slice(&p.1);
            w.copy_from_slice(&p.2[..w.len()]);
        });
    (indptr, ids, weights)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fanouts_parse_in_hop_order() {
        assert_eq!(parse_fanouts("15,10,5"), Ok(vec![15, 10, 5]));
        assert_eq!(parse_fanouts("10, -1"), Ok(vec![10, FANOUT_ALL]));
        assert_eq!(parse_fanouts("all"), Ok(vec![FANOUT_ALL]));
        assert!(parse_fanouts("").is_err());
        assert!(parse_fanouts("3,0").unwrap_err().contains("at least one"));
        assert!(parse_fanouts("3,x").unwrap_err().contains("not a positive"));
    }

    #[test]
    fn row_builders_agree() {
        let n = 1000;
        let len = |r: usize| (r * 7 % 5) as u32;
        let lens: Vec<u32> = (0..n).map(len).collect();
        let indptr = offsets(&lens);
        let mut ids = vec![0u32; *indptr.last().unwrap() as usize];
        let mut w = vec![0f32; ids.len()];
        par_fill(
            &indptr,
            &mut ids,
            Some(&mut w),
            |_, _| {},
            |r, out, wo| {
                for (j, x) in out.iter_mut().enumerate() {
                    *x = (r * 10 + j) as u32;
                }
                wo.unwrap().fill(r as f32);
            },
        );
        let (p2, i2, w2) = par_collect(n, true, |r, out, wo| {
            for j in 0..len(r) as usize {
                out.push((r * 10 + j) as u32);
                wo.push(r as f32);
            }
        });
        assert_eq!((p2, i2, w2), (indptr, ids, w));
    }
}
