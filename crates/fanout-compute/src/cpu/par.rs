//! Parallel loops shared by the CPU kernels.
//!
//! Every helper splits work at positions that depend only on the data sizes, never on the
//! thread count, so reductions add their partial results in the same order on any machine.

use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Elements per task for elementwise loops.
pub(crate) const ELEM_CHUNK: usize = 1 << 14;
/// Rows per partial sum in reductions over rows.
pub(crate) const REDUCE_ROWS: usize = 256;
/// Edges per task (roughly) for loops over destinations.
const EDGES_PER_TASK: usize = 4096;

/// The base pointer of an output that parallel tasks write in disjoint blocks (tiles of a
/// product, heads' column blocks). Closures reach it through [`DisjointOut::ptr`], a method,
/// so they capture the whole `Sync` value rather than its raw-pointer field.
#[derive(Clone, Copy)]
pub(crate) struct DisjointOut(pub(crate) *mut f32);
// SAFETY: every user writes only a block of the output that no other task touches (each use
// says which).
unsafe impl Sync for DisjointOut {}
unsafe impl Send for DisjointOut {}

impl DisjointOut {
    /// The output's base pointer.
    pub(crate) fn ptr(self) -> *mut f32 {
        self.0
    }
}

/// Calls `f(r, row)` for every row of the row-major `out` (`cols` wide), in parallel.
pub(crate) fn par_rows<F>(out: &mut [f32], cols: usize, f: F)
where
    F: Fn(usize, &mut [f32]) + Sync + Send,
{
    if cols == 0 || out.is_empty() {
        return;
    }
    let min = (2048 / cols).max(1);
    out.par_chunks_mut(cols)
        .enumerate()
        .with_min_len(min)
        .for_each(|(r, row)| f(r, row));
}

/// A new `rows x cols` row-major vector: each row is zeroed and then given to `f(r, row)`,
/// in parallel as [`par_rows`] does. Zeroing a row just before `f` accumulates into it keeps
/// it in cache, where a zero-filled tensor followed by [`par_rows`] passes over the whole
/// output twice.
pub(crate) fn par_rows_new<F>(rows: usize, cols: usize, f: F) -> Vec<f32>
where
    F: Fn(usize, &mut [f32]) + Sync + Send,
{
    let len = rows * cols;
    let mut v: Vec<f32> = Vec::with_capacity(len);
    if let Some(per_task) = 2048usize.checked_div(cols) {
        let min = per_task.max(1);
        v.spare_capacity_mut()[..len]
            .par_chunks_mut(cols)
            .enumerate()
            .with_min_len(min)
            .for_each(|(r, row)| {
                row.fill(MaybeUninit::new(0.0));
                // SAFETY: every element of `row` was just initialised; `MaybeUninit<f32>`
                // has the layout of `f32`.
                let row = unsafe { &mut *(row as *mut [MaybeUninit<f32>] as *mut [f32]) };
                f(r, row);
            });
    }
    // SAFETY: the chunks cover all `len` elements (`cols > 0`; else `len == 0`) and each
    // was zeroed before `f` saw it.
    unsafe { v.set_len(len) };
    v
}

/// Task boundaries `(d0, d1)` over the rows of a CSR with offsets `indptr`: a new task starts
/// once one holds `EDGES_PER_TASK` edges (or 256 rows).
fn edge_groups(indptr: &[u32]) -> Vec<(usize, usize)> {
    let num_dst = indptr.len() - 1;
    let mut groups = Vec::new();
    let mut start = 0;
    for d in 0..num_dst {
        let edges = (indptr[d + 1] - indptr[start]) as usize;
        if edges >= EDGES_PER_TASK || d + 1 - start >= 256 {
            groups.push((start, d + 1));
            start = d + 1;
        }
    }
    if start < num_dst {
        groups.push((start, num_dst));
    }
    groups
}

/// `out` cut into each group's consecutive part, `per(d0, d1)` elements for group `(d0, d1)`.
fn split_by_groups<'a, T>(
    groups: &[(usize, usize)],
    mut rest: &'a mut [T],
    per: impl Fn(usize, usize) -> usize,
) -> Vec<&'a mut [T]> {
    let mut slices = Vec::with_capacity(groups.len());
    for &(d0, d1) in groups {
        let (head, tail) = rest.split_at_mut(per(d0, d1));
        slices.push(head);
        rest = tail;
    }
    debug_assert!(rest.is_empty(), "the groups cover the whole buffer");
    slices
}

/// Calls `f(d, slice)` for every destination `d` of a CSR with offsets `indptr`, where `slice`
/// is `out[indptr[d] * width..indptr[d + 1] * width]` (the rows of `d`'s edges in an edge
/// tensor `width` wide). Destinations are grouped into tasks of about `EDGES_PER_TASK` edges.
pub(crate) fn par_dst_edges<F>(indptr: &[u32], out: &mut [f32], width: usize, f: F)
where
    F: Fn(usize, &mut [f32]) + Sync + Send,
{
    let groups = edge_groups(indptr);
    let slices = split_by_groups(&groups, out, |d0, d1| {
        (indptr[d1] - indptr[d0]) as usize * width
    });
    groups
        .into_par_iter()
        .zip(slices)
        .for_each(|((d0, d1), slice)| {
            let base = indptr[d0] as usize;
            for d in d0..d1 {
                let lo = (indptr[d] as usize - base) * width;
                let hi = (indptr[d + 1] as usize - base) * width;
                f(d, &mut slice[lo..hi]);
            }
        });
}

/// A new `rows x cols` matrix (`rows = indptr.len() - 1`) built row by row alongside an edge
/// tensor: calls `f(r, row, edges)` for every row `r` of the CSR with offsets `indptr`, where
/// `row` is row `r` of the result, zeroed before `f` sees it, and `edges` is
/// `edge_out[indptr[r] * width..indptr[r + 1] * width]`. Rows are grouped into tasks as in
/// [`par_dst_edges`].
pub(crate) fn par_rows_new_with_edges<F>(
    indptr: &[u32],
    cols: usize,
    edge_out: &mut [f32],
    width: usize,
    f: F,
) -> Vec<f32>
where
    F: Fn(usize, &mut [f32], &mut [f32]) + Sync + Send,
{
    let rows = indptr.len() - 1;
    let len = rows * cols;
    let mut v: Vec<f32> = Vec::with_capacity(len);
    let groups = edge_groups(indptr);
    let row_parts = split_by_groups(&groups, &mut v.spare_capacity_mut()[..len], |d0, d1| {
        (d1 - d0) * cols
    });
    let edge_parts = split_by_groups(&groups, edge_out, |d0, d1| {
        (indptr[d1] - indptr[d0]) as usize * width
    });
    groups
        .into_par_iter()
        .zip(row_parts)
        .zip(edge_parts)
        .for_each(|(((d0, d1), rows_part), edges)| {
            let base = indptr[d0] as usize;
            for d in d0..d1 {
                let row = &mut rows_part[(d - d0) * cols..(d - d0 + 1) * cols];
                row.fill(std::mem::MaybeUninit::new(0.0));
                // SAFETY: every element was just initialised; `MaybeUninit<f32>` has the
                // layout of `f32`.
                let row = unsafe { &mut *(row as *mut [std::mem::MaybeUninit<f32>] as *mut [f32]) };
                let lo = (indptr[d] as usize - base) * width;
                let hi = (indptr[d + 1] as usize - base) * width;
                f(d, row, &mut edges[lo..hi]);
            }
        });
    // SAFETY: the groups cover every row, and each row was zeroed before `f` saw it (a panic
    // in `f` unwinds before this line).
    unsafe { v.set_len(len) };
    v
}

/// Sums `f(r0, r1)` over fixed chunks of `REDUCE_ROWS` rows of `0..rows`, each result a vector
/// of `len`, in parallel; partial vectors are added in chunk order (deterministic).
pub(crate) fn par_row_reduce<F>(rows: usize, len: usize, f: F) -> Vec<f64>
where
    F: Fn(usize, usize, &mut [f64]) + Sync + Send,
{
    let chunks = rows.div_ceil(REDUCE_ROWS);
    let partials: Vec<Vec<f64>> = (0..chunks)
        .into_par_iter()
        .map(|c| {
            let mut acc = vec![0.0f64; len];
            f(c * REDUCE_ROWS, ((c + 1) * REDUCE_ROWS).min(rows), &mut acc);
            acc
        })
        .collect();
    sum_partials(partials, len)
}

/// The elementwise sum of `partials` (each `len` long), added in their order starting from
/// zero: the combining step of [`par_row_reduce`], for kernels that fill their own chunked
/// partial sums and must add them as it does.
pub(crate) fn sum_partials(partials: Vec<Vec<f64>>, len: usize) -> Vec<f64> {
    let mut total = vec![0.0f64; len];
    for p in partials {
        for (t, v) in total.iter_mut().zip(p) {
            *t += v;
        }
    }
    total
}

/// Vectors shorter than this are built on the calling thread.
const PAR_BUILD_MIN: usize = 1 << 15;

/// A vector of `len` floats built without zero-filling it first: `write(start, out)` is
/// called, in parallel for long vectors, on consecutive chunks of at most [`ELEM_CHUNK`]
/// elements (`out` holds elements `start..start + out.len()`) and writes each of them.
/// Saves the sequential `memset` of `vec![0.0; len]` on the caller's thread, which is most of
/// the train stage's single-threaded time otherwise.
///
/// # Safety
/// `write` must initialise every element of every chunk it is given.
pub(crate) unsafe fn par_build<F>(len: usize, write: F) -> Vec<f32>
where
    F: Fn(usize, &mut [MaybeUninit<f32>]) + Sync + Send,
{
    let mut v: Vec<f32> = Vec::with_capacity(len);
    let spare = &mut v.spare_capacity_mut()[..len];
    if len < PAR_BUILD_MIN {
        for (i, c) in spare.chunks_mut(ELEM_CHUNK).enumerate() {
            write(i * ELEM_CHUNK, c);
        }
    } else {
        spare
            .par_chunks_mut(ELEM_CHUNK)
            .enumerate()
            .for_each(|(i, c)| write(i * ELEM_CHUNK, c));
    }
    // SAFETY: the chunks cover all `len` elements and `write` initialised each (the contract).
    unsafe { v.set_len(len) };
    v
}

/// `len` zeros, zero-filled in parallel for long vectors.
pub(crate) fn zeros(len: usize) -> Vec<f32> {
    if len < PAR_BUILD_MIN {
        return vec![0.0; len];
    }
    // SAFETY: every element of every chunk is written.
    unsafe { par_build(len, |_, out| out.fill(MaybeUninit::new(0.0))) }
}

/// A copy of `a`, copied in parallel for long slices.
pub(crate) fn copy(a: &[f32]) -> Vec<f32> {
    // SAFETY: each chunk `out` is zipped with `a[start..start + out.len()]` (in bounds: the
    // chunks cover `0..a.len()`), so every element of it is written.
    unsafe {
        par_build(a.len(), |start, out| {
            let src = &a[start..start + out.len()];
            for (o, &x) in out.iter_mut().zip(src) {
                o.write(x);
            }
        })
    }
}

/// `out[i] = f(a[i])`, in parallel.
pub(crate) fn map1(a: &[f32], f: impl Fn(f32) -> f32 + Sync + Send) -> Vec<f32> {
    // SAFETY: as in `copy`, every element of each chunk is written.
    unsafe {
        par_build(a.len(), |start, out| {
            let src = &a[start..start + out.len()];
            for (o, &x) in out.iter_mut().zip(src) {
                o.write(f(x));
            }
        })
    }
}

/// `out[i] = f(a[i], b[i])`, in parallel. Panics if the lengths differ.
pub(crate) fn map2(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32 + Sync + Send) -> Vec<f32> {
    assert_eq!(a.len(), b.len(), "elementwise operands differ in length");
    // SAFETY: as in `copy` (both inputs are as long as the output), every element is written.
    unsafe {
        par_build(a.len(), |start, out| {
            let end = start + out.len();
            for ((o, &x), &y) in out.iter_mut().zip(&a[start..end]).zip(&b[start..end]) {
                o.write(f(x, y));
            }
        })
    }
}
