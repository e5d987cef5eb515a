//! Weight gradients `C <- beta C + alpha A^T G` that skip the zeros of `G`.
//!
//! In a GNN layer followed by ReLU and dropout, the gradient at the layer's pre-activation is
//! zero wherever the unit was inactive or dropped: about 78% of a GraphSAGE hidden layer's
//! entries with dropout 0.5 (measured on cnr2000 with fanouts 10,25). A dense `A^T G`
//! multiplies all of those zeros. This kernel visits only the non-zeros: per block of
//! `ROW_BLOCK` (64) rows of `G` it copies the block transposed (8 x 8 tiles in registers) and
//! marks each column's non-zero rows in a 64-bit mask; then for every column it holds a strip
//! of up to 128 floats of `C^T`'s row in registers and, for each set bit of the column's mask,
//! adds `value * A[row, strip]`, one load and one fused multiply-add per vector, as in a dense
//! micro-kernel, over a fifth of the products. The strip of `A` is first copied out of the
//! block's rows into a contiguous buffer, and each task owns a strip of `A`'s columns, so a
//! wide `A` is read from memory once (`cargo run --release -p fanout-compute --example
//! kernel_speed -- ROWS WIDTH` compares it with the dense product).
//!
//! Several products that share `G` (GraphSAGE's `W_self` and `W_neigh` gradients) mark its
//! non-zeros once. No crate offers a dense-transposed-times-sparse product on a dense
//! row-major `G`: sparse-matrix crates (`sprs`, `nalgebra-sparse`) take a compressed matrix
//! built beforehand, which here costs as much as the product, and multiply with scalar loops;
//! hence this hand-written kernel.
//!
//! Each element of C sums its products in increasing row order whatever the thread count and
//! vector width (tasks split C's rows, never the rows of `G`), so results are bit-identical
//! for any `RAYON_NUM_THREADS` and CPU with AVX2; they differ from the dense product's only by
//! rounding.

use rayon::prelude::*;

use super::par::{sum_partials, DisjointOut, REDUCE_ROWS};
use super::rows::prefetch_row;
use crate::tensor::Tensor;

/// Rows of `G` whose non-zeros are marked together, and rows of `A` packed together: a
/// block's strip of `A` (64 rows x [`STRIP`] floats, 32 KiB) stays in L1 while every column
/// of `G` uses it.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) const ROW_BLOCK: usize = 64;
// A block's rows are the bits of one `u64` mask per column.
const _: () = assert!(ROW_BLOCK <= 64);
// `NonZeros::of_product`'s column sums are taken over whole row blocks.
const _: () = assert!(REDUCE_ROWS.is_multiple_of(ROW_BLOCK));
/// Columns of `A` (rows of `C`) per parallel task: one strip of `C^T`'s row held in
/// registers across a column's non-zeros (eight 16-float AVX-512 vectors, or two passes of
/// eight 8-float AVX2 vectors).
pub(super) const STRIP: usize = 128;

/// True when this CPU can run [`gemm_tn_sparse`] (x86-64 with AVX2 and FMA).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Fraction of non-zero entries of `g` (NaNs count as non-zero), estimated from every
/// `step`-th row; exact with `step == 1`. Zero for an empty `g`.
pub fn density(g: &Tensor, step: usize) -> f64 {
    let (mut seen, mut nz) = (0usize, 0usize);
    for r in (0..g.rows()).step_by(step.max(1)) {
        let row = g.row(r);
        seen += row.len();
        nz += row.iter().filter(|&&v| v != 0.0).count();
    }
    if seen == 0 {
        0.0
    } else {
        nz as f64 / seen as f64
    }
}

/// True when [`density`]`(g, step)` would exceed `max`, found without reading the rest of the
/// sample once the non-zeros seen so far already exceed `max` of all the sampled entries: a
/// dense matrix (a layer's input features, checked before every product) is rejected after
/// reading about `max` of its sample. The same answer as comparing [`density`] with `max`.
pub fn density_exceeds(g: &Tensor, step: usize, max: f64) -> bool {
    sample_exceeds(g.rows(), g.cols(), step, max, |r| {
        // Counted in u32 lanes, which vectorise (a row has far fewer than 2^32 entries).
        g.row(r).iter().map(|&v| (v != 0.0) as u32).sum::<u32>() as usize
    })
}

/// [`density_exceeds`] of the elementwise product `grad * factor` (each entry one f32
/// multiply), without making it. Panics if the shapes differ.
pub fn product_density_exceeds(grad: &Tensor, factor: &Tensor, step: usize, max: f64) -> bool {
    assert_eq!(
        grad.shape(),
        factor.shape(),
        "G's factor has the wrong shape"
    );
    sample_exceeds(grad.rows(), grad.cols(), step, max, |r| {
        let (g, f) = (grad.row(r), factor.row(r));
        g.iter()
            .zip(f)
            .map(|(&x, &y)| (x * y != 0.0) as u32)
            .sum::<u32>() as usize
    })
}

/// True when the non-zeros of every `step`-th of `rows` rows of `cols` entries (`row_nz(r)`
/// of row `r`) are more than `max` of those rows' entries, stopping once they are.
fn sample_exceeds(
    rows: usize,
    cols: usize,
    step: usize,
    max: f64,
    mut row_nz: impl FnMut(usize) -> usize,
) -> bool {
    let step = step.max(1);
    let total = rows.div_ceil(step) * cols;
    if total == 0 {
        return 0.0 > max;
    }
    let mut nz = 0usize;
    for r in (0..rows).step_by(step) {
        nz += row_nz(r);
        // `nz` only grows, so once this holds the whole sample's density exceeds `max` too.
        if nz as f64 / total as f64 > max {
            return true;
        }
    }
    false
}

/// The vector width the multiply-adds use. Both add the same products in the same order into
/// each element, so they give the same bits (`avx2_and_avx512_give_the_same_bits`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) enum Simd {
    /// 8-float vectors (AVX2 + FMA).
    Avx2,
    /// 16-float vectors (AVX-512F), where the CPU has them.
    Avx512,
}

impl Simd {
    pub(super) fn best() -> Simd {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx512f") {
            return Simd::Avx512;
        }
        Simd::Avx2
    }
}

/// `C_i <- beta * C_i + alpha * A_i^T G` for every `(A_i, C_i)` in `pairs`, with `A_i`
/// (`m x k_i`), `G` (`m x n`), `C_i` (`k_i x n`), visiting only the non-zero entries of `G`
/// (marked once for all pairs). With `beta == 0` the old contents of each `C_i` are ignored.
/// A NaN in `G` reaches its whole column of `C_i`, as in a dense product; a NaN or infinity in
/// `A_i` that meets only zeros of `G` contributes nothing (a dense product would give NaN).
///
/// Returns the number of entries of `G` it used (its non-zeros and NaNs): each pair performed
/// `2 k_i` flops per such entry, against `2 k_i m n` for the dense product.
///
/// Panics on mismatched shapes, or if [`available`] is false.
pub fn gemm_tn_sparse(
    alpha: f32,
    pairs: &mut [(&Tensor, &mut Tensor)],
    g: &Tensor,
    beta: f32,
) -> usize {
    gemm_tn_sparse_with(Simd::best(), alpha, pairs, g, beta)
}

/// [`gemm_tn_sparse`] with the given vector width.
///
/// First G's row blocks of [`ROW_BLOCK`] rows are transposed and their non-zeros marked per
/// column, in parallel over the blocks. Then each task owns a [`STRIP`] of one `A_i`'s
/// columns (so `A` is read from memory once in all, and `C_i`'s rows are split between
/// tasks, never the rows of `G`): per row block it copies its strip of the block's rows of
/// `A` into a contiguous buffer (rows of a wide `A` lie a multiple of 4 KiB apart and would
/// fight over the same L1 sets) and, for every column of `G`, adds `value * A[row, strip]`
/// over the column's marked non-zeros into the strip held in registers. Each element of
/// `C_i` sums its products in increasing row order whatever the thread count, so results
/// are bit-identical for any `RAYON_NUM_THREADS`; they differ from the dense product's only
/// by rounding.
fn gemm_tn_sparse_with(
    simd: Simd,
    alpha: f32,
    pairs: &mut [(&Tensor, &mut Tensor)],
    g: &Tensor,
    beta: f32,
) -> usize {
    check_pairs(pairs, g);
    if g.cols() == 0 {
        return 0;
    }
    let nz = NonZeros::of(g);
    multiply(simd, alpha, pairs, &nz, beta);
    nz.count()
}

/// [`gemm_tn_sparse`] of `G = grad * factor` (elementwise, each entry one f32 multiply: the
/// gradient through an epilogue that kept `factor`), which is made as its non-zeros are
/// marked and never written out whole. Returns the entries used, and `G`'s column sums as
/// `dense::mul_sum_rows` gives them (f64, the same bits), so that one pass over
/// `grad` and `factor` does what `mul_sum_rows` and [`gemm_tn_sparse`] did in three.
///
/// Panics on mismatched shapes, or if [`available`] is false.
pub fn gemm_tn_sparse_product(
    alpha: f32,
    pairs: &mut [(&Tensor, &mut Tensor)],
    grad: &Tensor,
    factor: &Tensor,
    beta: f32,
) -> (usize, Vec<f64>) {
    gemm_tn_sparse_product_with(Simd::best(), alpha, pairs, grad, factor, beta)
}

/// [`gemm_tn_sparse_product`] with the given vector width.
fn gemm_tn_sparse_product_with(
    simd: Simd,
    alpha: f32,
    pairs: &mut [(&Tensor, &mut Tensor)],
    grad: &Tensor,
    factor: &Tensor,
    beta: f32,
) -> (usize, Vec<f64>) {
    check_pairs(pairs, grad);
    let (nz, sums) = NonZeros::of_product(grad, factor);
    if grad.cols() > 0 {
        multiply(simd, alpha, pairs, &nz, beta);
    }
    (nz.count(), sums)
}

/// Asserts the shapes [`gemm_tn_sparse`] takes, and that the CPU runs it.
fn check_pairs(pairs: &[(&Tensor, &mut Tensor)], g: &Tensor) {
    let (m, n) = g.shape();
    for (a, c) in pairs.iter() {
        assert_eq!(a.rows(), m, "gemm_tn_sparse: A and G differ in rows");
        assert_eq!(
            c.shape(),
            (a.cols(), n),
            "gemm_tn_sparse: C has the wrong shape"
        );
    }
    assert!(available(), "gemm_tn_sparse needs AVX2 and FMA");
}

/// `C_i <- beta * C_i + alpha * A_i^T G` for every pair, over the non-zeros `nz` of `G`
/// (which has at least one column), in parallel over strips of each `C_i`'s rows.
fn multiply(
    simd: Simd,
    alpha: f32,
    pairs: &mut [(&Tensor, &mut Tensor)],
    nz: &NonZeros,
    beta: f32,
) {
    let n = nz.n;
    let mut tasks: Vec<(&Tensor, usize, &mut [f32])> = Vec::new();
    for (a, c) in pairs.iter_mut() {
        let a: &Tensor = a;
        for (s, out) in c.data_mut().chunks_mut(STRIP * n).enumerate() {
            tasks.push((a, s * STRIP, out));
        }
    }
    tasks.into_par_iter().for_each(|(a, kc, out)| {
        let sw = out.len() / n;
        let spw = padded(sw);
        // C^T's rows kc..kc + sw, each padded to whole 16-float vectors.
        let mut ct = vec![0.0f32; n * spw];
        accumulate(simd, a, nz, kc, sw, &mut ct);
        for (kk, row) in out.chunks_exact_mut(n).enumerate() {
            for (j, o) in row.iter_mut().enumerate() {
                let s = ct[j * spw + kk];
                *o = if beta == 0.0 {
                    alpha * s
                } else {
                    alpha * s + beta * *o
                };
            }
        }
    });
}

/// `C[:, h n..(h + 1) n] += A_h^T G[:, h n..(h + 1) n]` for every head `h < heads`, where
/// `A_h` is the columns `h k..(h + 1) k` of `a` (`m x heads k`), `G` is `m x heads n` and `C`
/// `k x heads n`: the weight gradient of an attention layer that aggregated before projecting
/// (`super::heads::head_acc_at_b`), each head's product as [`gemm_tn_sparse`] computes it,
/// `G`'s non-zeros marked once for all heads and each head's block of `a` read where it lies.
/// Each task owns one head's strip of `C`'s rows, so the results do not depend on the thread
/// count. Returns the entries of `G` used.
///
/// Panics on mismatched shapes, or if [`available`] is false.
pub(super) fn head_tn_sparse(a: &Tensor, g: &Tensor, c: &mut Tensor, heads: usize) -> usize {
    assert!(available(), "head_tn_sparse needs AVX2 and FMA");
    let (m, hk) = a.shape();
    let hn = g.cols();
    assert!(
        heads > 0 && hk.is_multiple_of(heads) && hn.is_multiple_of(heads),
        "head_tn_sparse: {heads} heads of a {:?} and g {:?}",
        a.shape(),
        g.shape()
    );
    let (k, n) = (hk / heads, hn / heads);
    assert_eq!(g.rows(), m, "head_tn_sparse: g rows");
    assert_eq!(c.shape(), (k, hn), "head_tn_sparse: c shape");
    if n == 0 || k == 0 {
        return 0;
    }
    let simd = Simd::best();
    let nz = NonZeros::of(g);
    let out = DisjointOut(c.data_mut().as_mut_ptr());
    let tasks: Vec<(usize, usize)> = (0..heads)
        .flat_map(|h| (0..k).step_by(STRIP).map(move |kc| (h, kc)))
        .collect();
    tasks.into_par_iter().for_each(|(h, kc)| {
        let (sw, cols) = (STRIP.min(k - kc), h * n..(h + 1) * n);
        let spw = padded(sw);
        let mut ct = vec![0.0f32; n * spw];
        let row = |i: usize| &a.row(i)[h * k..(h + 1) * k];
        let rows = Rows { m, k, row: &row };
        accumulate_rows(simd, rows, &nz, cols, kc, sw, &mut ct);
        for kk in 0..sw {
            for j in 0..n {
                // SAFETY: row kc + kk < k of C, column h n + j < heads n: this task's strip of
                // rows of head h's columns, which no other task writes.
                unsafe { *out.ptr().add((kc + kk) * hn + h * n + j) += ct[j * spw + kk] };
            }
        }
    });
    nz.count()
}

/// `k` rounded up to whole 16-float vectors: the row length of a task's `C^T` strip and of
/// its packed rows of `A`, so that every load and store is of whole vectors (the lanes past
/// `k` are zeros in the packed `A` and are never copied into C).
pub(super) fn padded(k: usize) -> usize {
    k.div_ceil(16) * 16
}

/// G's non-zeros, per block of [`ROW_BLOCK`] rows: a transposed copy of G (its rows rounded
/// up to whole blocks) and one 64-bit mask per column and block. Reading a column's values
/// from G itself would stride a full row of G per value, and a block's rows, 1 KiB apart for
/// 256 columns, fall into the same few L1 sets as the strip of `A`; a list of `(row, value)`
/// pairs per column took longer to build than the masks and the copy together
/// (docs/performance.md).
///
/// Block `b`'s masks are `masks[b * n..][..n]`: bit `r` of column `j`'s is set when row `r`
/// of the block, in that column, is not zero (or is NaN). Its copy starts at
/// `gt[b * n * ROW_BLOCK]`, column `j`'s rows at `[j * ROW_BLOCK..][..ROW_BLOCK]` from there.
/// Only the marked entries of the copy are meaningful: the others (a zero of G, a row past
/// G's last) may hold anything, since no kernel reads an unmarked entry. That lets the
/// copy's memory come from [`spare_copy`] without being cleared.
struct NonZeros {
    /// G's columns.
    n: usize,
    masks: Vec<u64>,
    gt: Vec<f32>,
}

impl NonZeros {
    /// Transposes and marks `g`'s row blocks in parallel.
    fn of(g: &Tensor) -> NonZeros {
        let (m, n) = g.shape();
        let blocks = m.div_ceil(ROW_BLOCK);
        let mut masks = vec![0u64; blocks * n];
        let mut gt = spare_copy(blocks * n * ROW_BLOCK);
        if n > 0 {
            masks
                .par_chunks_mut(n)
                .zip(gt.par_chunks_mut(n * ROW_BLOCK))
                .enumerate()
                .for_each(|(b, (masks, gt))| {
                    let i0 = b * ROW_BLOCK;
                    mark_block(g, None, i0, ROW_BLOCK.min(m - i0), gt, masks, None);
                });
        }
        NonZeros { n, masks, gt }
    }

    /// [`NonZeros::of`] the product `grad * factor` (elementwise, each entry one f32 multiply),
    /// which is made block by block and never written out, and its column sums as
    /// [`super::dense::mul_sum_rows`] adds them: f64 partial sums over chunks of
    /// [`REDUCE_ROWS`] rows in row order, added in chunk order. Panics if the shapes differ.
    fn of_product(grad: &Tensor, factor: &Tensor) -> (NonZeros, Vec<f64>) {
        assert_eq!(
            grad.shape(),
            factor.shape(),
            "G's factor has the wrong shape"
        );
        let (m, n) = grad.shape();
        let blocks = m.div_ceil(ROW_BLOCK);
        let mut masks = vec![0u64; blocks * n];
        let mut gt = spare_copy(blocks * n * ROW_BLOCK);
        let mut partials = Vec::new();
        if n > 0 {
            const PER_CHUNK: usize = REDUCE_ROWS / ROW_BLOCK;
            partials = masks
                .par_chunks_mut(PER_CHUNK * n)
                .zip(gt.par_chunks_mut(PER_CHUNK * n * ROW_BLOCK))
                .enumerate()
                .map(|(c, (masks, gt))| {
                    let mut sums = vec![0.0f64; n];
                    let blocks = masks.chunks_mut(n).zip(gt.chunks_mut(n * ROW_BLOCK));
                    for (b, (masks, gt)) in blocks.enumerate() {
                        let i0 = (c * PER_CHUNK + b) * ROW_BLOCK;
                        let ib = ROW_BLOCK.min(m - i0);
                        mark_block(grad, Some(factor), i0, ib, gt, masks, Some(&mut sums));
                    }
                    sums
                })
                .collect();
        }
        let sums = sum_partials(partials, n);
        (NonZeros { n, masks, gt }, sums)
    }

    /// Block `b`'s masks, and where its transposed copy starts.
    fn block(&self, b: usize) -> (&[u64], *const f32) {
        let masks = &self.masks[b * self.n..][..self.n];
        (masks, self.gt[b * self.n * ROW_BLOCK..].as_ptr())
    }

    /// The number of row blocks.
    fn blocks(&self) -> usize {
        self.masks.len().checked_div(self.n).unwrap_or(0)
    }

    /// The number of entries marked: non-zeros and NaNs.
    fn count(&self) -> usize {
        self.masks.iter().map(|m| m.count_ones() as usize).sum()
    }
}

impl Drop for NonZeros {
    fn drop(&mut self) {
        keep_spare(std::mem::take(&mut self.gt));
    }
}

/// Transposed copies of earlier products, kept for the next ones. A layer's `G` is the same
/// size step after step, and a fresh copy of it (80 MB in the first layer of a three-layer
/// GCN on 100,000 vertices) was zeroed by the allocator and faulted in page by page: 6% of
/// such an epoch's CPU, more than marking it. At most [`SPARE_KEPT`] copies are held, for
/// the life of the process.
static SPARE: std::sync::Mutex<Vec<Vec<f32>>> = std::sync::Mutex::new(Vec::new());
/// Copies [`SPARE`] holds at most: one per product that runs at a time (one per worker).
const SPARE_KEPT: usize = 2;

/// A buffer of at least `len` floats whose contents are unspecified (a spare copy's old
/// values, or zeros where it had to grow).
fn spare_copy(len: usize) -> Vec<f32> {
    let mut buf = {
        let mut spare = SPARE.lock().unwrap_or_else(|e| e.into_inner());
        // The smallest kept copy that holds `len` floats, else the largest (grown below), so
        // that a small product does not take the copy a large one needs.
        let fits = (spare.iter().enumerate())
            .filter(|(_, b)| b.capacity() >= len)
            .min_by_key(|(_, b)| b.capacity());
        let pick = fits.or_else(|| spare.iter().enumerate().max_by_key(|(_, b)| b.capacity()));
        pick.map(|(i, _)| i)
            .map(|i| spare.swap_remove(i))
            .unwrap_or_default()
    };
    if buf.len() < len {
        // Room for a quarter more: batches differ in size, and growing by just what one needs
        // moved the copy to fresh pages (faulted and cleared on the calling thread, while the
        // other workers waited) for every slightly larger batch.
        buf.reserve(len + len / 4 - buf.len());
        buf.resize(len, 0.0);
    }
    buf
}

/// Hands `buf` to [`SPARE`] for a later [`spare_copy`], unless it holds enough already.
fn keep_spare(buf: Vec<f32>) {
    let mut spare = SPARE.lock().unwrap_or_else(|e| e.into_inner());
    if buf.capacity() > 0 && spare.len() < SPARE_KEPT {
        spare.push(buf);
    }
}

/// `x86::mark_block` over G's rows `i0..i0 + ib` into one block's copy and masks, G being
/// `g * factor` when a factor is given, adding its entries into `sums` when given (the caller
/// asserted [`available`]).
fn mark_block(
    g: &Tensor,
    factor: Option<&Tensor>,
    i0: usize,
    ib: usize,
    gt: &mut [f32],
    masks: &mut [u64],
    sums: Option<&mut [f64]>,
) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `gemm_tn_sparse_with` asserted `available()`; `ib <= ROW_BLOCK`, the rows are
    // inside G, the factor has G's shape (asserted by the callers), the block holds `n` masks
    // and `n * ROW_BLOCK` floats, and `sums` holds `n`.
    unsafe {
        x86::mark_block(
            g.data(),
            factor.map(Tensor::data),
            g.cols(),
            i0,
            ib,
            gt,
            masks,
            sums,
        )
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (g, factor, i0, ib, gt, masks, sums);
        unreachable!("gemm_tn_sparse asserts available(), which is false off x86-64")
    }
}

/// The task body: `ct[j * padded(sw) + kk] += sum_r A[r, kc + kk] * G[r, j]` for `kk < sw`
/// over G's marked non-zeros, adding in increasing `r` for every element.
fn accumulate(simd: Simd, a: &Tensor, nz: &NonZeros, kc: usize, sw: usize, ct: &mut [f32]) {
    let rows = Rows {
        m: a.rows(),
        k: a.cols(),
        row: &|i| a.row(i),
    };
    accumulate_rows(simd, rows, nz, 0..nz.n, kc, sw, ct)
}

/// The rows of a left factor `A` (`m x k`) as [`accumulate_rows`] reads them: `row(i)` is row
/// `i`'s `k` values, wherever they lie (a head's block of a wider row, for [`head_tn_sparse`]).
#[derive(Clone, Copy)]
struct Rows<'a> {
    m: usize,
    k: usize,
    row: &'a (dyn Fn(usize) -> &'a [f32] + Sync),
}

/// [`accumulate`] of `A`'s rows as `a` gives them, against G's columns `cols` only (their
/// masks and values in `nz`): `ct` is `cols.len() x padded(sw)`.
fn accumulate_rows(
    simd: Simd,
    a: Rows<'_>,
    nz: &NonZeros,
    cols: std::ops::Range<usize>,
    kc: usize,
    sw: usize,
    ct: &mut [f32],
) {
    let (m, k) = (a.m, a.k);
    let spw = padded(sw);
    assert!(kc + sw <= k && sw > 0 && cols.end <= nz.n && ct.len() == cols.len() * spw);
    assert_eq!(nz.blocks(), m.div_ceil(ROW_BLOCK));
    // The block's rows of A's strip, packed and 64-byte aligned (so that no vector load
    // straddles two cache lines); the lanes past `sw` stay zero.
    let mut buf = vec![0.0f32; ROW_BLOCK * spw + 15];
    let at = buf.as_ptr().align_offset(64).min(15);
    let pa = &mut buf[at..at + ROW_BLOCK * spw];
    let ncols = cols.len();
    // Columns walked between two groups of prefetches (see below).
    let per_group = ncols.div_ceil(PREFETCH_GROUPS).max(1);
    let groups = ncols.div_ceil(per_group);
    for b in 0..nz.blocks() {
        let (masks, vals) = nz.block(b);
        let (masks, vals) = (
            &masks[cols.clone()],
            vals.wrapping_add(cols.start * ROW_BLOCK),
        );
        let i0 = b * ROW_BLOCK;
        for r in 0..ROW_BLOCK.min(m - i0) {
            pa[r * spw..][..sw].copy_from_slice(&(a.row)(i0 + r)[kc..][..sw]);
        }
        // The next block's strip of A comes from memory (a layer's input, written long
        // before), and copying it waited on every line: the copy ran at a few GB/s. It is
        // fetched into L2 while this block's columns are walked, a group of its rows after
        // each group of columns, so that the prefetches do not queue up at once.
        let next = i0 + ROW_BLOCK;
        let next_rows = ROW_BLOCK.min(m.saturating_sub(next));
        let rows_per_group = next_rows.div_ceil(groups.max(1));
        for g in 0..groups {
            let (j0, j1) = (g * per_group, ((g + 1) * per_group).min(ncols));
            let vals = vals.wrapping_add(j0 * ROW_BLOCK);
            // SAFETY: the block holds `n` masks and `n x ROW_BLOCK` values, of which `cols`
            // (inside `0..n`, asserted) are taken, so column `j`'s marked rows are inside `gt`.
            unsafe {
                block_columns(
                    simd,
                    pa,
                    spw,
                    &masks[j0..j1],
                    vals,
                    &mut ct[j0 * spw..j1 * spw],
                )
            };
            for r in
                (g * rows_per_group..((g + 1) * rows_per_group).min(next_rows)).map(|r| next + r)
            {
                prefetch_row(&(a.row)(r)[kc..][..sw]);
            }
        }
    }
}

/// Groups of columns a block's walk is cut into, each followed by prefetches of a share of
/// the next block's rows ([`accumulate_rows`]).
const PREFETCH_GROUPS: usize = 16;

/// The multiply-adds of one row block for the columns of G whose masks are `masks` and whose
/// values start at `vals` (`ROW_BLOCK` a column): `ct` holds their `spw`-float rows of `C^T`,
/// `pa` is the block's packed strip (`ROW_BLOCK x spw`, asserted).
///
/// # Safety
/// [`available`] is true; `vals + j * ROW_BLOCK + r` is readable for every row `r` marked in
/// `masks[j]`.
unsafe fn block_columns(
    simd: Simd,
    pa: &[f32],
    spw: usize,
    masks: &[u64],
    vals: *const f32,
    ct: &mut [f32],
) {
    assert!(pa.len() >= ROW_BLOCK * spw && ct.len() == masks.len() * spw);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller guarantees AVX2 + FMA and the values of every marked row, and
    // `Simd::Avx512` is only chosen where the CPU has AVX-512F; `pa` is `ROW_BLOCK x spw`,
    // which holds every marked row (all below ROW_BLOCK), and `ct` is `masks.len() x spw`
    // (both asserted).
    unsafe {
        let marked = x86::Marked {
            masks,
            vals,
            stride: ROW_BLOCK,
        };
        let ct = ct.as_mut_ptr();
        match simd {
            Simd::Avx512 => x86::block_avx512(pa, spw, marked, ct, spw),
            Simd::Avx2 => x86::block_avx2(pa, spw, marked, ct, spw),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (simd, pa, spw, masks, vals, ct);
        unreachable!("gemm_tn_sparse asserts available(), which is false off x86-64")
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::x86_64::*;

    use super::ROW_BLOCK;

    /// Copies G's rows `i0..i0 + ib` (all `n` columns) into `gt` transposed (column `j` at
    /// `gt[j * ROW_BLOCK..][..ib]`) and sets bit `r` of `masks[j]` for every non-zero (or NaN)
    /// `G[i0 + r, j]`. `masks` must be zero on entry. With `factor`, G is the elementwise
    /// product `gd * factor` (each entry one f32 multiply), made here and written nowhere
    /// else. With `sums`, each of G's entries is also added, as an f64, into `sums[j]` of its
    /// column, in increasing row order.
    ///
    /// Full 8 x 8 tiles are transposed in registers, sixteen columns (one cache line of a
    /// row) at a time down the block, so that each line of G is read once and each column's
    /// rows are written together.
    ///
    /// # Safety
    /// AVX2; `ib <= ROW_BLOCK`, `i0 + ib <= G's rows`, `factor` (when given) as long as `gd`,
    /// `gt.len() == n * ROW_BLOCK`, `masks.len() == n`, `sums` (when given) of length `n`.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn mark_block(
        gd: &[f32],
        factor: Option<&[f32]>,
        n: usize,
        i0: usize,
        ib: usize,
        gt: &mut [f32],
        masks: &mut [u64],
        mut sums: Option<&mut [f64]>,
    ) {
        debug_assert!(ib <= ROW_BLOCK && gt.len() == n * ROW_BLOCK && masks.len() == n);
        debug_assert!((i0 + ib) * n <= gd.len());
        debug_assert!(factor.is_none_or(|f| f.len() == gd.len()));
        debug_assert!(sums.as_deref().is_none_or(|s| s.len() == n));
        let (full_r, full_c) = (ib / 8 * 8, n / 8 * 8);
        let (src, dst) = (gd.as_ptr().add(i0 * n), gt.as_mut_ptr());
        let fsrc = factor.map(|f| f.as_ptr().add(i0 * n));
        // The next block's rows of `gd` and `factor`, fetched into L2 a slice per step of
        // the loop below: this pass reads down columns sixteen wide, which the hardware
        // prefetchers do not follow, and the rows (a layer's gradient, its kept factor) are
        // rarely still in cache.
        let next0 = (i0 + ib) * n;
        let next_lines = (gd.len().min(next0 + ROW_BLOCK * n) - next0.min(gd.len())).div_ceil(16);
        let tensors = if factor.is_some() { 2 } else { 1 };
        let steps = full_c.div_ceil(16) * (full_r / 8);
        let per = (next_lines * tensors).div_ceil(steps.max(1));
        let mut fetched = 0;
        for c16 in (0..full_c).step_by(16) {
            for r8 in (0..full_r).step_by(8) {
                let end = (fetched + per).min(next_lines * tensors);
                for l in fetched..end {
                    // The first `next_lines` are `gd`'s, the rest the factor's.
                    let (base, l) = match factor {
                        Some(f) if l >= next_lines => (f.as_ptr(), l - next_lines),
                        _ => (gd.as_ptr(), l),
                    };
                    // A prefetch never faults and reads nothing architecturally; the line is
                    // one of the next block's rows (`l` counts up to `next_lines`).
                    _mm_prefetch::<_MM_HINT_T1>(base.wrapping_add(next0 + l * 16).cast());
                }
                fetched = end;
                for c8 in (c16..full_c.min(c16 + 16)).step_by(8) {
                    let at = r8 * n + c8;
                    let rows: [__m256; 8] = std::array::from_fn(|t| {
                        let v = _mm256_loadu_ps(src.add(at + t * n));
                        match fsrc {
                            Some(f) => _mm256_mul_ps(v, _mm256_loadu_ps(f.add(at + t * n))),
                            None => v,
                        }
                    });
                    if let Some(sums) = sums.as_deref_mut() {
                        // Rows in order into the f64 sums of these eight columns.
                        let sp = sums.as_mut_ptr().add(c8);
                        let (mut lo, mut hi) = (_mm256_loadu_pd(sp), _mm256_loadu_pd(sp.add(4)));
                        for r in rows {
                            lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(r)));
                            hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(r)));
                        }
                        _mm256_storeu_pd(sp, lo);
                        _mm256_storeu_pd(sp.add(4), hi);
                    }
                    for (c, v) in transpose8(rows).into_iter().enumerate() {
                        let j = c8 + c;
                        _mm256_storeu_ps(dst.add(j * ROW_BLOCK + r8), v);
                        // Unordered-or-not-equal: NaNs count as non-zero, as in a dense
                        // product.
                        let ne = _mm256_cmp_ps::<_CMP_NEQ_UQ>(v, _mm256_setzero_ps());
                        masks[j] |= (_mm256_movemask_ps(ne) as u64) << r8;
                    }
                }
            }
        }
        // The rows and columns outside full tiles, one element at a time (each column's rows
        // still in increasing order: the tiles held only rows below `full_r` of columns below
        // `full_c`).
        let mut one = |r: usize, j: usize| {
            let e = (i0 + r) * n + j;
            let v = match factor {
                Some(f) => gd[e] * f[e],
                None => gd[e],
            };
            gt[j * ROW_BLOCK + r] = v;
            if v != 0.0 {
                masks[j] |= 1 << r;
            }
            if let Some(sums) = sums.as_deref_mut() {
                sums[j] += v as f64;
            }
        };
        for r in 0..full_r {
            for j in full_c..n {
                one(r, j);
            }
        }
        for r in full_r..ib {
            for j in 0..n {
                one(r, j);
            }
        }
    }

    /// The 8 x 8 transpose: lane `t` of output `c` is lane `c` of input `t` (also the
    /// column-major copy of [`super::super::gemm`]'s row-major A).
    ///
    /// # Safety
    /// The CPU must support AVX.
    #[inline(always)]
    pub(in crate::cpu) unsafe fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        [
            _mm256_permute2f128_ps::<0x20>(u0, u4),
            _mm256_permute2f128_ps::<0x20>(u1, u5),
            _mm256_permute2f128_ps::<0x20>(u2, u6),
            _mm256_permute2f128_ps::<0x20>(u3, u7),
            _mm256_permute2f128_ps::<0x31>(u0, u4),
            _mm256_permute2f128_ps::<0x31>(u1, u5),
            _mm256_permute2f128_ps::<0x31>(u2, u6),
            _mm256_permute2f128_ps::<0x31>(u3, u7),
        ]
    }

    /// A block's non-zeros as the multiply-adds read them: bit `r` of `masks[j]` marks a row
    /// `r` whose value is `vals[j * stride + r]`. For the weight gradients, the block's
    /// transposed copy of G (`stride` = [`ROW_BLOCK`]); for [`crate::cpu::sparse_rows`], a
    /// block of `A`'s columns where it lies (`stride` = `A`'s row length).
    #[derive(Clone, Copy)]
    pub(in crate::cpu) struct Marked<'a> {
        pub(in crate::cpu) masks: &'a [u64],
        pub(in crate::cpu) vals: *const f32,
        pub(in crate::cpu) stride: usize,
    }

    /// One row block's multiply-adds with 16-float vectors: for every `j` with non-zeros,
    /// `ct[j * ldc..][..spw] += vals[j * stride + r] * pa[r * spw..][..spw]` over the rows `r`
    /// marked in `masks[j]`, in increasing order, the strip held in registers.
    ///
    /// # Safety
    /// AVX-512F; `spw` a multiple of 16 in `16..=128`; `pa` holds the block's marked rows
    /// (`r * spw + spw <= pa.len()`); `vals + j * stride + r` is readable for every marked
    /// `r` of every `masks[j]`; `ct + j * ldc` has `spw` floats readable and writable for
    /// every `j < masks.len()`, and no other reference touches them during the call.
    #[target_feature(enable = "avx512f")]
    pub(in crate::cpu) unsafe fn block_avx512(
        pa: &[f32],
        spw: usize,
        marked: Marked<'_>,
        ct: *mut f32,
        ldc: usize,
    ) {
        strips::<__m512>(pa, spw, marked, ct, ldc)
    }

    /// [`block_avx512`] with 8-float vectors: the strip's first 64 floats, then the rest (two
    /// passes over the masks, eight accumulators at most in each).
    ///
    /// # Safety
    /// AVX2 and FMA; otherwise as [`block_avx512`].
    #[target_feature(enable = "avx2,fma")]
    pub(in crate::cpu) unsafe fn block_avx2(
        pa: &[f32],
        spw: usize,
        marked: Marked<'_>,
        ct: *mut f32,
        ldc: usize,
    ) {
        strips::<__m256>(pa, spw, marked, ct, ldc)
    }

    /// A vector of `LANES` floats: what a strip needs of it (and the per-head sums of
    /// `super::super::heads`). Implemented for the AVX2 and AVX-512 registers, so that one
    /// [`strip`] serves both widths.
    pub(in crate::cpu) trait Lanes: Copy {
        const LANES: usize;
        /// # Safety
        /// The CPU has the vector's instructions; `LANES` floats readable at `p`.
        unsafe fn load(p: *const f32) -> Self;
        /// # Safety
        /// The CPU has the vector's instructions; `LANES` floats writable at `p`.
        unsafe fn store(self, p: *mut f32);
        /// # Safety
        /// The CPU has the vector's instructions.
        unsafe fn splat(v: f32) -> Self;
        /// `a * b + c`, fused (one rounding).
        ///
        /// # Safety
        /// The CPU has the vector's instructions.
        unsafe fn fma(a: Self, b: Self, c: Self) -> Self;
        /// `c + a * b` rounded twice, as the scalar `c += a * b` is (Rust never fuses them).
        ///
        /// # Safety
        /// The CPU has the vector's instructions.
        unsafe fn add_product(c: Self, a: Self, b: Self) -> Self;
    }

    impl Lanes for __m512 {
        const LANES: usize = 16;
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            _mm512_loadu_ps(p)
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            _mm512_storeu_ps(p, self)
        }
        #[inline(always)]
        unsafe fn splat(v: f32) -> Self {
            _mm512_set1_ps(v)
        }
        #[inline(always)]
        unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
            _mm512_fmadd_ps(a, b, c)
        }
        #[inline(always)]
        unsafe fn add_product(c: Self, a: Self, b: Self) -> Self {
            _mm512_add_ps(c, _mm512_mul_ps(a, b))
        }
    }

    impl Lanes for __m256 {
        const LANES: usize = 8;
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            _mm256_loadu_ps(p)
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            _mm256_storeu_ps(p, self)
        }
        #[inline(always)]
        unsafe fn splat(v: f32) -> Self {
            _mm256_set1_ps(v)
        }
        #[inline(always)]
        unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
            _mm256_fmadd_ps(a, b, c)
        }
        #[inline(always)]
        unsafe fn add_product(c: Self, a: Self, b: Self) -> Self {
            _mm256_add_ps(c, _mm256_mul_ps(a, b))
        }
    }

    /// The strip of `spw` floats in passes of at most eight vectors `V` (one pass with
    /// AVX-512, two with AVX2 for a full 128-float strip).
    ///
    /// # Safety
    /// As [`block_avx512`], with the CPU features of `V` and `spw` a multiple of `V::LANES`.
    #[inline(always)]
    unsafe fn strips<V: Lanes>(
        pa: &[f32],
        spw: usize,
        marked: Marked<'_>,
        ct: *mut f32,
        ldc: usize,
    ) {
        let vectors = spw / V::LANES;
        let mut done = 0;
        while done < vectors {
            let off = done * V::LANES;
            match (vectors - done).min(8) {
                1 => strip::<V, 1>(pa, spw, off, marked, ct, ldc),
                2 => strip::<V, 2>(pa, spw, off, marked, ct, ldc),
                3 => strip::<V, 3>(pa, spw, off, marked, ct, ldc),
                4 => strip::<V, 4>(pa, spw, off, marked, ct, ldc),
                5 => strip::<V, 5>(pa, spw, off, marked, ct, ldc),
                6 => strip::<V, 6>(pa, spw, off, marked, ct, ldc),
                7 => strip::<V, 7>(pa, spw, off, marked, ct, ldc),
                _ => strip::<V, 8>(pa, spw, off, marked, ct, ldc),
            }
            done += 8;
        }
    }

    /// `ct[j * ldc + off..][..NV * LANES] += vals[j * stride + r] * pa[r * spw + off..][..NV *
    /// LANES]` for every `j`'s marked rows `r`, in increasing order, the accumulators held in
    /// `NV` registers.
    ///
    /// # Safety
    /// The CPU features of `V`; `off + NV * V::LANES <= spw`; as [`block_avx512`].
    #[inline(always)]
    unsafe fn strip<V: Lanes, const NV: usize>(
        pa: &[f32],
        spw: usize,
        off: usize,
        marked: Marked<'_>,
        ct: *mut f32,
        ldc: usize,
    ) {
        let (pa, vals) = (pa.as_ptr().add(off), marked.vals);
        for (j, &mask) in marked.masks.iter().enumerate() {
            if mask == 0 {
                continue;
            }
            let out = ct.add(j * ldc + off);
            let vals = vals.add(j * marked.stride);
            let mut acc: [V; NV] = std::array::from_fn(|q| V::load(out.add(V::LANES * q)));
            let mut bits = mask;
            while bits != 0 {
                let r = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let x = pa.add(r * spw);
                let b = V::splat(*vals.add(r));
                for (q, v) in acc.iter_mut().enumerate() {
                    *v = V::fma(b, V::load(x.add(V::LANES * q)), *v);
                }
            }
            for (q, v) in acc.iter().enumerate() {
                v.store(out.add(V::LANES * q));
            }
        }
    }
}

/// What the zero-skipping kernels' tests share (here, in [`super::sparse_rows`] and in
/// `super::heads`).
#[cfg(all(test, target_arch = "x86_64"))]
pub(super) mod testing {
    use super::{available, Simd};
    use crate::tensor::Tensor;
    use fanout_rand::Rng;

    /// The vector widths this CPU runs (none without AVX2 + FMA), saying what is left out.
    pub(in crate::cpu) fn widths_here() -> Vec<Simd> {
        if !available() {
            eprintln!("skipped: this CPU has no AVX2 + FMA");
            return Vec::new();
        }
        if Simd::best() == Simd::Avx512 {
            vec![Simd::Avx2, Simd::Avx512]
        } else {
            eprintln!("this CPU has no AVX-512F: only the AVX2 path is checked");
            vec![Simd::Avx2]
        }
    }

    /// Pools of 1 and 3 threads.
    pub(in crate::cpu) fn pools() -> [rayon::ThreadPool; 2] {
        [1, 3].map(|t| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .expect("a thread pool")
        })
    }

    /// True when `a` and `b` hold the same floats, bit for bit (NaNs included).
    pub(in crate::cpu) fn same_bits(a: &Tensor, b: &Tensor) -> bool {
        a.shape() == b.shape()
            && a.data()
                .iter()
                .zip(b.data())
                .all(|(x, y)| x.to_bits() == y.to_bits())
    }

    /// An `r x c` tensor whose entries are, with probability `density`, uniform in `[-1, 1)`,
    /// and otherwise zero.
    pub(in crate::cpu) fn random(rng: &mut Rng, r: usize, c: usize, density: f64) -> Tensor {
        Tensor::from_fn(r, c, |_, _| {
            if rng.bernoulli(density) {
                rng.next_f32() * 2.0 - 1.0
            } else {
                0.0
            }
        })
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use fanout_rand::Rng;

    /// The kernel's arithmetic, one element at a time: each element of `C` chains fused
    /// multiply-adds over `G`'s non-zeros (NaNs included) in increasing row order, from zero.
    fn scalar_model(alpha: f32, a: &Tensor, g: &Tensor, beta: f32, c: &Tensor) -> Tensor {
        Tensor::from_fn(a.cols(), g.cols(), |kk, j| {
            let mut s = 0.0f32;
            for r in 0..g.rows() {
                let v = g.get(r, j);
                if v != 0.0 {
                    s = v.mul_add(a.get(r, kk), s);
                }
            }
            if beta == 0.0 {
                alpha * s
            } else {
                alpha * s + beta * c.get(kk, j)
            }
        })
    }

    #[test]
    fn density_exceeds_answers_as_the_density_does() {
        let mut rng = Rng::new(3);
        for &(rows, cols) in &[(0, 5), (5, 0), (1, 1), (100, 7), (33, 64), (1000, 3)] {
            for p in [0.0, 0.2, 0.35, 0.5, 0.9, 1.0] {
                let g =
                    Tensor::from_fn(rows, cols, |_, _| if rng.bernoulli(p) { 1.0 } else { 0.0 });
                for step in [1, 3, 16] {
                    for max in [0.0, 0.2, 0.35, 0.5, 1.0] {
                        assert_eq!(
                            density_exceeds(&g, step, max),
                            density(&g, step) > max,
                            "{rows}x{cols}, non-zero with probability {p}, step {step}, max {max}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn avx2_and_avx512_give_the_same_bits() {
        let widths = testing::widths_here();
        let pools = testing::pools();
        let mut rng = Rng::new(5);
        let mut rand = |r: usize, c: usize, density: f64| testing::random(&mut rng, r, c, density);
        // (rows of G, columns of A, columns of G): one element; a strip past 128 columns by
        // one float; tails of 1, 9, 15 and 16 floats after full strips (every AVX-512 vector
        // count, and AVX2 second passes); rows not a multiple of 8 or of the 64-row blocks.
        let shapes = [
            (1, 1, 1),
            (65, 129, 33),
            (200, 300, 70),
            (130, 16, 256),
            (64, 265, 9),
            (90, 602, 20),
            (7, 271, 5),
            (129, 240, 17),
        ];
        for &(m, k, n) in &shapes {
            for density in [0.0, 0.1, 0.3, 1.0] {
                let a = rand(m, k, 1.0);
                let mut g = rand(m, n, density);
                if density == 0.3 {
                    // One NaN inside a full 8 x 8 tile (for most shapes), one in the last
                    // column (outside full tiles when n is not a multiple of 8).
                    g.data_mut()[(m / 2) * n + n / 2] = f32::NAN;
                    g.data_mut()[n - 1] = f32::NAN;
                }
                // Non-zeros and the NaN: the entries the kernel must use.
                let used = g.data().iter().filter(|&&v| v != 0.0).count();
                for (alpha, beta) in [(1.0, 0.0), (-0.75, 1.0), (1.5, 0.25)] {
                    let c0 = rand(k, n, 1.0);
                    let want = scalar_model(alpha, &a, &g, beta, &c0);
                    for &simd in &widths {
                        for pool in &pools {
                            let mut got = c0.clone();
                            let listed = pool.install(|| {
                                gemm_tn_sparse_with(simd, alpha, &mut [(&a, &mut got)], &g, beta)
                            });
                            let threads = pool.current_num_threads();
                            let what = format!("{simd:?}, {threads} threads, {m}x{k}x{n}, density {density}, alpha {alpha}, beta {beta}");
                            assert_eq!(listed, used, "entries of G used: {what}");
                            assert!(testing::same_bits(&got, &want), "{what}");
                        }
                    }
                }
            }
        }
    }

    /// The product made inside the marking pass gives what `mul_sum_rows` and the kernel give
    /// on the written-out product: the same entries used, `C`'s bits, and the column sums'
    /// f64 bits in the chunked row order `mul_sum_rows` documents. The gradient's magnitudes
    /// span 2^-40 to 2^40, so that f64 sums taken in another order would differ; the copy's
    /// spare memory starts as NaNs, which an unmarked entry read by mistake would spread.
    #[test]
    fn product_marked_in_place_gives_the_written_out_products_bits() {
        let widths = testing::widths_here();
        let pools = testing::pools();
        let mut rng = Rng::new(11);
        // (rows, columns of A, columns of G): chunks of 256 rows and blocks of 64 cut inside
        // and at their ends; columns outside full 8-wide tiles.
        let shapes = [
            (1, 3, 1),
            (64, 20, 8),
            (300, 40, 13),
            (513, 17, 33),
            (1000, 130, 16),
        ];
        for &(m, k, n) in &shapes {
            for density in [0.0, 0.3, 1.0] {
                let grad = Tensor::from_fn(m, n, |_, _| {
                    let scale = (rng.below(81) as i32 - 40) as f32;
                    (rng.next_f32() * 2.0 - 1.0) * scale.exp2()
                });
                // A ReLU-and-dropout factor: 0 or 2, non-zero with probability `density`.
                let mut factor =
                    Tensor::from_fn(m, n, |_, _| if rng.bernoulli(density) { 2.0 } else { 0.0 });
                if m * n > 20 {
                    // NaN in the gradient where the factor is zero and where it is not.
                    factor.data_mut()[m * n / 3] = 0.0;
                    let mut g = grad.clone();
                    g.data_mut()[m * n / 3] = f32::NAN;
                    g.data_mut()[m * n - 1] = f32::NAN;
                    check_product(&widths, &pools, &mut rng, k, &g, &factor);
                }
                check_product(&widths, &pools, &mut rng, k, &grad, &factor);
            }
        }
    }

    fn check_product(
        widths: &[Simd],
        pools: &[rayon::ThreadPool],
        rng: &mut Rng,
        k: usize,
        grad: &Tensor,
        factor: &Tensor,
    ) {
        let (m, n) = grad.shape();
        let (g, sums32) = super::super::dense::mul_sum_rows(grad, factor);
        // The documented order: f64 sums over chunks of REDUCE_ROWS rows, chunks added in order.
        let mut want_sums = vec![0.0f64; n];
        for r0 in (0..m).step_by(REDUCE_ROWS) {
            let mut part = vec![0.0f64; n];
            for r in r0..(r0 + REDUCE_ROWS).min(m) {
                for (p, &v) in part.iter_mut().zip(g.row(r)) {
                    *p += v as f64;
                }
            }
            for (t, p) in want_sums.iter_mut().zip(part) {
                *t += p;
            }
        }
        let used = g.data().iter().filter(|&&v| v != 0.0).count();
        let (a1, a2) = (
            testing::random(rng, m, k, 1.0),
            testing::random(rng, m, k + 5, 0.5),
        );
        let (alpha, beta) = (0.75, 1.0);
        let (c1, c2) = (
            testing::random(rng, k, n, 1.0),
            testing::random(rng, k + 5, n, 1.0),
        );
        let want = [
            scalar_model(alpha, &a1, &g, beta, &c1),
            scalar_model(alpha, &a2, &g, beta, &c2),
        ];
        for &simd in widths {
            for pool in pools {
                keep_spare(vec![f32::NAN; (m.div_ceil(ROW_BLOCK) + 1) * n * ROW_BLOCK]);
                let (mut got1, mut got2) = (c1.clone(), c2.clone());
                let (listed, sums) = pool.install(|| {
                    let mut pairs = [(&a1, &mut got1), (&a2, &mut got2)];
                    gemm_tn_sparse_product_with(simd, alpha, &mut pairs, grad, factor, beta)
                });
                let threads = pool.current_num_threads();
                let what = format!("{simd:?}, {threads} threads, {m}x{k}x{n}");
                assert_eq!(listed, used, "entries used: {what}");
                let bits64 = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits64(&sums), bits64(&want_sums), "f64 column sums: {what}");
                let cast: Vec<u32> = sums.iter().map(|&v| (v as f32).to_bits()).collect();
                let theirs: Vec<u32> = sums32.data().iter().map(|v| v.to_bits()).collect();
                assert_eq!(cast, theirs, "mul_sum_rows' sums: {what}");
                for (got, want) in [got1, got2].iter().zip(&want) {
                    assert!(testing::same_bits(got, want), "C: {what}");
                }
            }
        }
    }
}
