//! Dense matrix products on the CPU.
//!
//! Kernel choice: `matrixmultiply` (BLIS-style packing with runtime-detected AVX/AVX2/FMA/
//! AVX-512 micro-kernels on x86-64, NEON on aarch64). It is one small pure-Rust crate (one
//! dependency, `rawpointer`) that compiles in seconds, unlike `gemm` (a family of heavily
//! generic crates whose build takes minutes on two cores). Its own `threading` feature brings
//! a second thread pool; instead we split C into row blocks and run one single-threaded
//! `sgemm` per block on rayon's pool, so GEMM shares the threads of the graph kernels instead
//! of oversubscribing.
//! Every block packs the whole of op(B) again, a memory-bound copy of `k * n` floats against
//! `2 * rows * k * n` flops of compute, so blocks are at least 128 rows. For the
//! weight-gradient shape `X^T G` (few output rows, a long inner dimension) row blocks would be
//! too few or too thin: when C holds two or more 128 x 128 tiles, each tile is one
//! full-length product (a GraphSAGE `128 x N1 x 256` gradient: two tiles); a narrower C has its
//! inner dimension split into chunks computed in parallel into partial products that are then
//! added in chunk order.
//!
//! Weight gradients `A^T G` whose `G` is mostly zeros skip them instead
//! ([`super::sparse_grad`], chosen by [`skips_zeros`]), and a row-major `A` goes through
//! `rowmajor`, which reads `A` in place where `matrixmultiply` would need a column-major copy
//! of it: for every `B` on AVX-512 CPUs, for a narrow one (at most 128 columns) on AVX2 ones
//! (`rowmajor::Isa::max_n`).
//!
//! Every split depends only on the shapes, never on the thread count, so results are
//! bit-identical whatever `RAYON_NUM_THREADS` is. C is written without being zeroed first
//! when `beta == 0` ([`matmul`] hands uninitialised memory to `sgemm`).

use rayon::prelude::*;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, Ordering};

use super::par::DisjointOut;
use super::{dense, rowmajor, sparse_grad, sparse_rows};
use crate::source::RowSource;
use crate::tensor::Tensor;

/// Products with fewer multiply-adds than this run on the calling thread.
/// Nominal flops of every product issued through this module since the process started.
static NOMINAL_FLOPS: AtomicU64 = AtomicU64::new(0);
/// The part of [`NOMINAL_FLOPS`] that the zero-skipping kernel did not perform.
static SKIPPED_FLOPS: AtomicU64 = AtomicU64::new(0);

/// Nominal floating-point operations (`2 m n k` per `m x k` by `k x n` product) of every
/// product computed by [`gemm`], [`gemm_dense`], [`matmul`] and [`acc_at_b_shared`] (and the
/// backend's per-head products) in this process since it started, all threads and in-process
/// workers together. A product that skips zeros counts as the dense product it replaces
/// ([`skipped_flops`] says how much of that it did not perform). Read it before and after a stretch of work: the difference is that
/// work's GEMM flops, the numerator of its nominal compute floor.
pub fn nominal_flops() -> u64 {
    NOMINAL_FLOPS.load(Ordering::Relaxed)
}

/// The part of [`nominal_flops`] that was not performed: `2 k` flops for every zero of `G`
/// in each `A^T G` product (`A` of `k` columns) computed by the zero-skipping kernel, since the
/// process started. `nominal_flops() - skipped_flops()` are the flops actually performed.
pub fn skipped_flops() -> u64 {
    SKIPPED_FLOPS.load(Ordering::Relaxed)
}

/// Adds the flops that `A^T G` products with `A`s of `cols` columns in all did not perform
/// because `used` of `g`'s entries were non-zero.
pub(super) fn count_skipped(cols: usize, g: &Tensor, used: usize) {
    let zeros = g.rows() * g.cols() - used;
    SKIPPED_FLOPS.fetch_add(2 * (cols * zeros) as u64, Ordering::Relaxed);
}

/// Adds the nominal flops of an `m x k` by `k x n` product computed outside this module (the
/// per-head products of `super::heads`).
pub(super) fn count_nominal(m: usize, n: usize, k: usize) {
    NOMINAL_FLOPS.fetch_add(2 * (m * n * k) as u64, Ordering::Relaxed);
}

/// Adds the nominal flops of `op(A) * op(B)`.
fn count(a: &Tensor, trans_a: bool, b: &Tensor, trans_b: bool) {
    let (m, n) = product_shape(a, trans_a, b, trans_b);
    let k = if trans_a { a.rows() } else { a.cols() };
    NOMINAL_FLOPS.fetch_add(2 * (m * n * k) as u64, Ordering::Relaxed);
}

const PARALLEL_MIN_MACS: usize = 1 << 18;
/// Smallest row block (packing op(B) per block costs about 10 / rows of the block's time).
const MIN_BLOCK_ROWS: usize = 128;
/// Row blocks start at multiples of this (a multiple of every micro-kernel height).
const TILE_ALIGN: usize = 64;
/// The inner dimension is split when it is at least this long and 4x the output rows.
const K_SPLIT_MIN: usize = 2048;
/// At most this many partial products (bounds the scratch memory to `16 * m * n` floats).
const K_SPLIT_MAX_PARTS: usize = 16;
/// Inner-dimension chunks are at least this long.
const K_SPLIT_CHUNK: usize = 1024;
/// Bytes of op(A) and op(B) together from which a long-inner-dimension product is split
/// along the inner dimension even when C holds two or more tiles. Measured with
/// `examples/tn_speed.rs` (two threads, Sapphire Rapids VM, alternating the two splits on the
/// same data): the split was 1.01-1.13x faster than the tiles for 128-256 x 8,000-40,000 x
/// 47-256 products and 1.30-1.34x for 256 x 150,000 x 256 (a GAT weight gradient over a
/// first layer's sources); at 3,700 rows (under 8 MiB of inputs) the tiles won on the Zen 3
/// VM (100-117 GFLOP/s against 67-98) and the two were within 3-8% here.
const K_SPLIT_STREAM_BYTES: usize = 8 << 20;
/// Side of the output tiles of the long-inner-dimension products (a multiple of every
/// micro-kernel's height and width, so the split never changes which elements go through a
/// full micro-tile).
const GRID_TILE: usize = 128;

/// Row-major op(A) with at least this many columns is copied column-major before `sgemm`
/// (or read in place by `rowmajor`, where the CPU and op(B)'s width allow).
/// matrixmultiply packs A into panels of 16 rows; from a row-major A it reads each panel
/// element by element (compiled to gather instructions, about 6 cycles a float on the 2-core
/// VM's EPYC: 12% of a width-100 GraphSAGE epoch's CPU), while from a column-major A it copies 16
/// contiguous floats at a time. The copy made here reads A once in 8 x 8 tiles.
const TRANSPOSE_MIN_K: usize = 8;
/// The column-major copy holds at most this many floats (256 KiB) at a time, so that
/// `matrixmultiply` packs it from L2 right after it is written: with 4 MiB copies (out of
/// L2 on every CPU we measured), its packing was a sixth of a GAT epoch's CPU on the 2-core
/// Sapphire Rapids VM, and 256 KiB copies made GAT and wide-feature GraphSAGE epochs 4-9%
/// faster with the same bits (docs/performance.md, stop 45). Slices still start at multiples
/// of [`TILE_ALIGN`] rows, so the micro-tiles and roundings are those of one call.
const TRANSPOSED_MAX: usize = 1 << 16;

thread_local! {
    /// Each thread's column-major copy of the op(A) rows it is multiplying, kept between
    /// products (at most [`TRANSPOSED_MAX`] floats a thread) so no step faults in fresh pages
    /// for it.
    static TRANSPOSED_A: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Rows of op(A) per column-major copy: a multiple of [`TILE_ALIGN`] (so the product's
/// micro-tiles, and hence its roundings, are those of one call over all rows) with the copy
/// within [`TRANSPOSED_MAX`] floats where `k` allows.
fn transposed_rows(k: usize) -> usize {
    ((TRANSPOSED_MAX / k.max(1)) / TILE_ALIGN).max(1) * TILE_ALIGN
}

/// Rows `r0..r0 + rows` of the row-major `a` (`k` columns) written column-major into
/// `scratch` (element `(i, j)` at `j * rows + i`), which is returned.
pub(super) fn transposed_a_rows<'s>(
    a: &[f32],
    k: usize,
    r0: usize,
    rows: usize,
    scratch: &'s mut Vec<f32>,
) -> &'s [f32] {
    let len = rows * k;
    scratch.clear();
    scratch.reserve(len);
    let src = &a[r0 * k..(r0 + rows) * k];
    let dst = &mut scratch.spare_capacity_mut()[..len];
    // Full 8 x 8 tiles in registers where the CPU has AVX; the rest (and every tile
    // elsewhere) element by element.
    #[cfg(target_arch = "x86_64")]
    let full = if is_x86_feature_detected!("avx") {
        // SAFETY: the CPU has AVX.
        unsafe { transpose_full_tiles_avx(src, k, rows, dst) };
        (rows / 8 * 8, k / 8 * 8)
    } else {
        (0, 0)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let full = (0, 0);
    for i in 0..rows {
        // Columns `full.1..` of every row, and all columns of rows `full.0..`.
        let j_from = if i < full.0 { full.1 } else { 0 };
        for j in j_from..k {
            dst[j * rows + i].write(src[i * k + j]);
        }
    }
    // SAFETY: the tiles cover rows 0..full.0 x columns 0..full.1, the loop above the rest,
    // so all `len` elements were written.
    unsafe { scratch.set_len(len) };
    scratch
}

/// Writes the full 8 x 8 tiles of the row-major `rows x k` `src` transposed into `dst`
/// (element `(i, j)` at `j * rows + i`).
///
/// # Safety
/// The CPU must support AVX; `src.len() == dst.len() == rows * k`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn transpose_full_tiles_avx(
    src: &[f32],
    k: usize,
    rows: usize,
    dst: &mut [MaybeUninit<f32>],
) {
    use std::arch::x86_64::{_mm256_loadu_ps, _mm256_storeu_ps};
    debug_assert!(src.len() == rows * k && dst.len() == rows * k);
    let (s, d) = (src.as_ptr(), dst.as_mut_ptr().cast::<f32>());
    for i0 in (0..rows / 8 * 8).step_by(8) {
        for j0 in (0..k / 8 * 8).step_by(8) {
            // SAFETY: rows i0..i0+8 and columns j0..j0+8 lie inside the matrix, so every
            // load reads 8 floats of `src` and every store writes 8 floats of `dst`.
            unsafe {
                let t = super::sparse_grad::x86::transpose8(std::array::from_fn(|r| {
                    _mm256_loadu_ps(s.add((i0 + r) * k + j0))
                }));
                for (c, v) in t.into_iter().enumerate() {
                    _mm256_storeu_ps(d.add((j0 + c) * rows + i0), v);
                }
            }
        }
    }
}

/// `C <- alpha * op(A) * op(B) + beta * C` where `op(X)` is `X` or `X^T`.
///
/// Panics unless `op(A)` is `m x k`, `op(B)` is `k x n` and `C` is `m x n`. When `beta == 0`
/// the old contents of `C` are ignored (NaNs included). A weight-gradient product `A^T B`
/// whose `B` is at least half zeros (a ReLU or dropout layer's gradient) goes through
/// [`sparse_grad::gemm_tn_sparse`], which skips them (see [`skips_zeros`]; a NaN or infinity
/// in A that meets only zeros of B then contributes nothing); a product `A op(B)` whose `A`
/// is about three-quarters zeros (a layer's input gradient `G W^T`) through
/// [`sparse_rows::gemm_nn_sparse`], which skips those (see [`skips_zeros_of_a`]; likewise
/// for a NaN or infinity in B); everything else through [`gemm_dense`]. Either way the
/// results do not depend on the thread count.
pub fn gemm(
    alpha: f32,
    a: &Tensor,
    trans_a: bool,
    b: &Tensor,
    trans_b: bool,
    beta: f32,
    c: &mut Tensor,
) {
    let n = if trans_b { b.rows() } else { b.cols() };
    if trans_a && !trans_b && a.rows() == b.rows() && skips_zeros(b, a.cols()) {
        count(a, trans_a, b, trans_b);
        let used = sparse_grad::gemm_tn_sparse(alpha, &mut [(a, c)], b, beta);
        count_skipped(a.cols(), b, used);
    } else if !trans_a && skips_zeros_of_a(a, n) {
        count(a, trans_a, b, trans_b);
        let used = sparse_rows::gemm_nn_sparse(alpha, a, b, trans_b, beta, c);
        count_skipped(n, a, used);
    } else {
        gemm_dense(alpha, a, trans_a, b, trans_b, beta, c);
    }
}

/// [`gemm`] with zeros included (the reference the zero-skipping path is tested and
/// benchmarked against): through `matrixmultiply`, or `rowmajor` for a row-major op(A) where
/// the CPU runs it and op(B) is narrow enough for it. Parallel over blocks of `C` on the current rayon pool;
/// results do not depend on the thread count (each element is computed by exactly one kernel
/// call with the same blocking).
pub fn gemm_dense(
    alpha: f32,
    a: &Tensor,
    trans_a: bool,
    b: &Tensor,
    trans_b: bool,
    beta: f32,
    c: &mut Tensor,
) {
    gemm_dense_with(alpha, a, trans_a, b, trans_b, beta, c, Kernels::Any);
}

/// [`gemm_dense`] always through `matrixmultiply` (a row-major op(A) copied column-major
/// first): the reference the in-place row-major kernel is tested and benchmarked against.
pub fn gemm_matrixmultiply(
    alpha: f32,
    a: &Tensor,
    trans_a: bool,
    b: &Tensor,
    trans_b: bool,
    beta: f32,
    c: &mut Tensor,
) {
    gemm_dense_with(
        alpha,
        a,
        trans_a,
        b,
        trans_b,
        beta,
        c,
        Kernels::MatrixMultiply,
    );
}

/// [`gemm_dense`] with a long inner dimension always split into output tiles, however large
/// its inputs (see `K_SPLIT_STREAM_BYTES`): the reference the inner-dimension split is
/// benchmarked against (`examples/tn_speed.rs`).
pub fn gemm_dense_tiled(
    alpha: f32,
    a: &Tensor,
    trans_a: bool,
    b: &Tensor,
    trans_b: bool,
    beta: f32,
    c: &mut Tensor,
) {
    gemm_dense_with(alpha, a, trans_a, b, trans_b, beta, c, Kernels::TiledLongK);
}

/// Which kernels and splits a dense product may use.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kernels {
    /// The fastest for the shape (`rowmajor` where it applies).
    Any,
    /// `matrixmultiply` only.
    MatrixMultiply,
    /// As `Any`, but a long inner dimension is always split into output tiles.
    TiledLongK,
}

#[allow(clippy::too_many_arguments)]
fn gemm_dense_with(
    alpha: f32,
    a: &Tensor,
    trans_a: bool,
    b: &Tensor,
    trans_b: bool,
    beta: f32,
    c: &mut Tensor,
    kernels: Kernels,
) {
    let (m, n) = product_shape(a, trans_a, b, trans_b);
    count(a, trans_a, b, trans_b);
    assert_eq!(
        c.shape(),
        (m, n),
        "gemm: C is {:?}, expected ({m}, {n})",
        c.shape()
    );
    let cd = c.data_mut();
    // SAFETY: `cd` is initialised, and viewing it as MaybeUninit only lets `gemm_into` write
    // floats into it; it reads it only when beta != 0, which it may as it is initialised.
    unsafe {
        let len = cd.len();
        let cu = std::slice::from_raw_parts_mut(cd.as_mut_ptr().cast::<MaybeUninit<f32>>(), len);
        gemm_into(alpha, a, trans_a, b, trans_b, beta, cu, kernels);
    }
}

/// `(C, A)` with `C = X W_x + A W` (`first = Some((X, W_x))`) or `C = A W`, where `src`
/// makes the rows of `A` (`m x k`; `W` is `k x n`, `X` `m x k_x`, `W_x` `k_x x n`): the
/// values of `C = matmul(X, W_x)` followed by `gemm(1, A, W, 1, C)` on the whole `A` (without
/// `X`, `gemm(1, A, W, 0, C)`), and their bits unless `A` is mostly zeros (where `gemm`
/// skips them, a NaN or infinity in `W` that meets only zeros may be lost there and not
/// here). Where `A W` takes the in-place row-major kernel and the rows of one micro-tile
/// read few enough stored bytes to stay in cache (`rowmajor::sourced_suits`), `A`'s rows are
/// made a micro-tile at a time inside that product while the next tile's stored rows are
/// fetched, so that the fetching overlaps its arithmetic; elsewhere `A` is made whole, in
/// parallel, first. Panics on mismatched shapes.
pub fn matmul_sourced(
    first: Option<(&Tensor, &Tensor)>,
    src: &dyn RowSource,
    w: &Tensor,
) -> (Tensor, Tensor) {
    let (m, k, n) = (src.rows(), src.cols(), w.cols());
    assert!(
        w.rows() == k && first.is_none_or(|(x, wx)| x.rows() == m && wx.shape() == (x.cols(), n)),
        "matmul_sourced: A is {m} x {k}, W {:?}, X and W_x {:?}",
        w.shape(),
        first.map(|(x, wx)| (x.shape(), wx.shape()))
    );
    let Some(isa) = sourced_isa(src, n) else {
        let mut c = match first {
            Some((x, wx)) => matmul(x, false, wx, false),
            None => Tensor::zeros(m, n),
        };
        let a = crate::source::made_whole(src);
        gemm(
            1.0,
            &a,
            false,
            w,
            false,
            if first.is_some() { 1.0 } else { 0.0 },
            &mut c,
        );
        return (c, a);
    };
    // The first product first, as `matmul` computes it (`rowmajor::gemm_rows_sourced` says
    // why not inside).
    let (mut c, beta) = match first {
        Some((x, wx)) => (matmul(x, false, wx, false).into_data(), 1.0),
        None => (Vec::with_capacity(m * n), 0.0),
    };
    NOMINAL_FLOPS.fetch_add(2 * (m * n * k) as u64, Ordering::Relaxed);
    let packed = rowmajor::PackedB::new(isa, w.data(), n, 1, k, n);
    let threads = rayon::current_num_threads();
    // Row blocks as `gemm_into` splits them where B is packed once.
    let per = m
        .div_ceil(threads * 8)
        .max(MIN_BLOCK_ROWS)
        .div_ceil(TILE_ALIGN)
        * TILE_ALIGN;
    let mut a: Vec<f32> = Vec::with_capacity(m * k);
    let (a_at, c_at) = (DisjointOut(a.as_mut_ptr()), DisjointOut(c.as_mut_ptr()));
    (0..m.div_ceil(per)).into_par_iter().for_each(|i| {
        let r0 = i * per;
        // SAFETY: the CPU runs `isa` (`sourced_suits`); `src` has k columns and m rows (the
        // shapes asserted); the blocks r0..r0 + rows of A (room for m * k floats) and of C
        // (m * n floats, initialised by the first product when beta is 1) are disjoint
        // between tasks.
        unsafe {
            rowmajor::gemm_rows_sourced(
                src,
                r0,
                per.min(m - r0),
                &packed,
                beta,
                c_at.ptr(),
                a_at.ptr(),
            )
        }
    });
    // SAFETY: the blocks cover rows 0..m; `gemm_rows_sourced` made every row of A and, with
    // beta 0, wrote every element of C.
    unsafe {
        a.set_len(m * k);
        c.set_len(m * n);
    }
    (Tensor::new(m, n, c), Tensor::new(m, k, a))
}

/// Whether [`matmul_sourced`] makes the rows of `src` inside a product by a `W` of `n`
/// columns on this CPU (rather than whole first).
pub fn makes_rows_in_product(src: &dyn RowSource, n: usize) -> bool {
    sourced_isa(src, n).is_some()
}

/// The kernel [`matmul_sourced`] makes `src`'s rows inside, if any.
fn sourced_isa(src: &dyn RowSource, n: usize) -> Option<rowmajor::Isa> {
    rowmajor::sourced_suits(src).filter(|&isa| in_place(isa, src.rows(), src.cols(), n))
}

/// Whether [`gemm_into`] computes a row-major `A` (`m x k`) by a plain `B` (`k x n`) with
/// `rowmajor`'s kernel of `isa` (its choice for `Kernels::Any`, untransposed factors).
fn in_place(isa: rowmajor::Isa, m: usize, k: usize, n: usize) -> bool {
    let serial = m.saturating_mul(n).saturating_mul(k) < PARALLEL_MIN_MACS;
    let long_k = !serial && k >= K_SPLIT_MIN && k >= 4 * m;
    !long_k && k >= TRANSPOSE_MIN_K && n <= isa.max_n() && m > 0 && n > 0
}

/// `op(A) * op(B)` as a new tensor (see [`gemm`]; a mostly-zero `A` skips its zeros, as
/// there), written into fresh memory without zeroing it first (with `beta == 0` either kernel
/// writes every element of C).
pub fn matmul(a: &Tensor, trans_a: bool, b: &Tensor, trans_b: bool) -> Tensor {
    let (m, n) = product_shape(a, trans_a, b, trans_b);
    count(a, trans_a, b, trans_b);
    let mut data: Vec<f32> = Vec::with_capacity(m * n);
    let c = &mut data.spare_capacity_mut()[..m * n];
    // SAFETY: with beta == 0, `gemm_nn_sparse_into` and `gemm_into` write every one of the
    // m * n elements and read none (their contracts), so all `m * n` elements are
    // initialised before `set_len`.
    unsafe {
        if !trans_a && skips_zeros_of_a(a, n) {
            let used = sparse_rows::gemm_nn_sparse_into(None, 1.0, a, b, trans_b, 0.0, c);
            count_skipped(n, a, used);
        } else {
            gemm_into(1.0, a, trans_a, b, trans_b, 0.0, c, Kernels::Any);
        }
        data.set_len(m * n);
    }
    Tensor::new(m, n, data)
}

/// `c_i <- c_i + a_i^T g` for every `(a_i, c_i)` in `pairs` (weight gradients that share the
/// output gradient `g`): one [`gemm_dense`] per pair, or, when [`skips_zeros`] says so,
/// one pass of [`sparse_grad::gemm_tn_sparse`] that marks `g`'s non-zeros once for all pairs.
/// Panics on mismatched shapes.
pub fn acc_at_b_shared(g: &Tensor, pairs: &mut [(&Tensor, &mut Tensor)]) {
    let widest = pairs.iter().map(|(a, _)| a.cols()).max().unwrap_or(0);
    if pairs.iter().all(|(a, _)| a.rows() == g.rows()) && skips_zeros(g, widest) {
        for (a, _) in pairs.iter() {
            count(a, true, g, false);
        }
        let cols = pairs.iter().map(|(a, _)| a.cols()).sum();
        let used = sparse_grad::gemm_tn_sparse(1.0, pairs, g, 1.0);
        count_skipped(cols, g, used);
    } else {
        for (a, c) in pairs.iter_mut() {
            gemm_dense(1.0, a, true, g, false, 1.0, c);
        }
    }
}

/// [`acc_at_b_shared`] of `g = grad * factor` (elementwise: the gradient through an epilogue
/// that kept `factor`), returning `g`'s column sums as `dense::mul_sum_rows` gives them
/// (`1 x n`, the same bits). Where the zeros of `g` are skipped (the test of
/// [`skips_zeros`], on the product), `g` is made inside the marking pass of
/// [`sparse_grad::gemm_tn_sparse_product`] and never written out; otherwise it is
/// `mul_sum_rows`' product, multiplied densely. Panics on mismatched shapes.
pub fn acc_at_b_shared_product(
    grad: &Tensor,
    factor: &Tensor,
    pairs: &mut [(&Tensor, &mut Tensor)],
) -> Tensor {
    assert_eq!(
        grad.shape(),
        factor.shape(),
        "G's factor has the wrong shape"
    );
    let widest = pairs.iter().map(|(a, _)| a.cols()).max().unwrap_or(0);
    if pairs.iter().all(|(a, _)| a.rows() == grad.rows())
        && sparse_shape(grad, widest)
        && !sparse_grad::product_density_exceeds(grad, factor, 16, SPARSE_MAX_DENSITY)
    {
        for (a, _) in pairs.iter() {
            count(a, true, grad, false);
        }
        let cols = pairs.iter().map(|(a, _)| a.cols()).sum();
        let (used, sums) = sparse_grad::gemm_tn_sparse_product(1.0, pairs, grad, factor, 1.0);
        count_skipped(cols, grad, used);
        Tensor::new(1, grad.cols(), sums.into_iter().map(|v| v as f32).collect())
    } else {
        let (g, sums) = dense::mul_sum_rows(grad, factor);
        acc_at_b_shared(&g, pairs);
        sums
    }
}

/// Largest fraction of non-zeros in `g` at which `a^T g` goes through
/// [`sparse_grad::gemm_tn_sparse`]. Measured with `kernel_speed 6000 WIDTH` (two
/// `WIDTH x 6,000 x 256` gradients, two threads, AVX-512), WIDTH 100, 256 and 1,024: at 51%
/// non-zero the zero-skipping kernel is 1.28-1.34x faster than the dense product, at 60%
/// 1.15-1.22x; the margin covers the density being estimated from every 16th row.
const SPARSE_MAX_DENSITY: f64 = 0.5;

/// True when [`gemm`] computes `a^T g` for an `a` of `k` columns by skipping `g`'s zeros: a
/// weight-gradient shape (`g`'s rows, the inner dimension, at least 2,048) large enough to be
/// parallel, a CPU with the kernel, and `g`, sampled every 16th row, at most 50% non-zero.
/// Wide `a` included: with 26% non-zeros the kernel is 2.0x faster than the dense product
/// for `k` = 256 over 3,640 rows, 1.75x for `k` = 100 over 6,000 (`kernel_speed ROWS WIDTH`,
/// two threads).
pub fn skips_zeros(g: &Tensor, k: usize) -> bool {
    sparse_shape(g, k) && !sparse_grad::density_exceeds(g, 16, SPARSE_MAX_DENSITY)
}

/// [`skips_zeros`] but for the density: the shape and the CPU.
fn sparse_shape(g: &Tensor, k: usize) -> bool {
    let (inner, n) = g.shape();
    inner >= K_SPLIT_MIN
        && k.saturating_mul(n).saturating_mul(inner) >= PARALLEL_MIN_MACS
        && sparse_grad::available()
}

/// The densest row-major `a` (sampled every 16th row) whose zeros [`gemm`] skips
/// ([`sparse_rows::gemm_nn_sparse`]) in a product with `n` columns, or `None` for a product
/// too narrow to gain. Measured with `kernel_speed ROWS WIDTH` (`G W^T`, `G` of 256 columns,
/// `W^T` WIDTH wide, two threads, Sapphire Rapids VM) against the dense product: 256 wide
/// over 3,640 and 20,000 rows, 1.68-1.81x faster at 26% non-zero, 1.26-1.31x at 43%,
/// 1.11-1.13x at 51%, level at 60%; 128 wide, 1.52x at 26%, 1.22x at 43%; 64 wide, 1.35x at
/// 26%, 1.06x at 34%, level at 43%. The bounds leave a margin for the sampled estimate.
fn sparse_rows_max_density(n: usize) -> Option<f64> {
    if n >= 128 {
        Some(0.45)
    } else if n >= 64 {
        Some(0.3)
    } else {
        None
    }
}

/// True when [`gemm`] and [`matmul`] compute `a * op(b)` (`op(b)` of `n` columns, `a` not
/// transposed) by skipping `a`'s zeros: at least 512 rows and 64 columns in `a`, a CPU with
/// the kernel, and `a`, sampled every 16th row, at most as dense as
/// `sparse_rows_max_density` allows for `n` (45% from 128 columns, 30% from 64). That is the
/// input gradient `G W^T` of a hidden layer behind ReLU and dropout, or such a layer's
/// output multiplied by the next layer.
pub fn skips_zeros_of_a(a: &Tensor, n: usize) -> bool {
    let (m, k) = a.shape();
    let Some(max) = sparse_rows_max_density(n) else {
        return false;
    };
    m >= 512 && k >= 64 && sparse_grad::available() && !sparse_grad::density_exceeds(a, 16, max)
}

/// `(m, n)` of `op(A) * op(B)`; panics if the inner dimensions differ.
fn product_shape(a: &Tensor, trans_a: bool, b: &Tensor, trans_b: bool) -> (usize, usize) {
    let (m, k) = if trans_a {
        (a.cols(), a.rows())
    } else {
        (a.rows(), a.cols())
    };
    let (kb, n) = if trans_b {
        (b.cols(), b.rows())
    } else {
        (b.rows(), b.cols())
    };
    assert_eq!(
        k, kb,
        "gemm: inner dimensions differ (op(A) is {m} x {k}, op(B) is {kb} x {n})"
    );
    (m, n)
}

/// The body of [`gemm`] over a C given as `m x n` row-major possibly uninitialised memory,
/// with the kernels `kernels` allows.
///
/// # Safety
/// `c.len() == m * n` for the product's shape. When `beta != 0`, every element of `c` must be
/// initialised (it is read). When `beta == 0`, `c` is only written, and on return every
/// element of it has been written.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_into(
    alpha: f32,
    a: &Tensor,
    trans_a: bool,
    b: &Tensor,
    trans_b: bool,
    beta: f32,
    c: &mut [MaybeUninit<f32>],
    kernels: Kernels,
) {
    let (m, n) = product_shape(a, trans_a, b, trans_b);
    let k = if trans_a { a.rows() } else { a.cols() };
    assert_eq!(c.len(), m * n, "gemm: C has the wrong length");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        for x in c.iter_mut() {
            // SAFETY (read): beta != 0 only with an initialised C (this function's contract).
            let v = if beta == 0.0 {
                0.0
            } else {
                beta * x.assume_init()
            };
            x.write(v);
        }
        return;
    }
    // Strides of op(A) and op(B) in elements (row stride, column stride).
    let (rsa, csa) = if trans_a {
        (1, a.cols() as isize)
    } else {
        (a.cols() as isize, 1)
    };
    let (rsb, csb) = if trans_b {
        (1, b.cols() as isize)
    } else {
        (b.cols() as isize, 1)
    };
    let (ad, bd) = (a.data(), b.data());
    // Computes rows `row0..row0 + c_rows.len() / n` of C into `c_rows` from a column-major
    // copy of op(A)'s rows (see `transposed_a_rows`).
    let block_transposed = |row0: usize, c_rows: &mut [MaybeUninit<f32>]| {
        let rows = c_rows.len() / n;
        let sub = transposed_rows(k);
        TRANSPOSED_A.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            for r0 in (0..rows).step_by(sub) {
                let sr = sub.min(rows - r0);
                let at = transposed_a_rows(ad, k, row0 + r0, sr, &mut scratch);
                // SAFETY: `at` holds op(A) rows row0+r0..row0+r0+sr column-major (`sr x k`,
                // strides (1, sr)); op(B) as in `block`; C rows r0..r0+sr of `c_rows` are an
                // exclusive `sr x n` row-major slice, written (and read only when beta != 0,
                // then initialised by `gemm_into`'s contract) by sgemm.
                unsafe {
                    matrixmultiply::sgemm(
                        sr,
                        k,
                        n,
                        alpha,
                        at.as_ptr(),
                        1,
                        sr as isize,
                        bd.as_ptr(),
                        rsb,
                        csb,
                        beta,
                        c_rows.as_mut_ptr().add(r0 * n).cast::<f32>(),
                        n as isize,
                        1,
                    );
                }
            }
        });
    };
    // Which split computes C: one block on this thread, GRID_TILE tiles each over the whole
    // inner dimension, partial products over inner-dimension chunks, or row blocks (below).
    let serial = m.saturating_mul(n).saturating_mul(k) < PARALLEL_MIN_MACS;
    let tiles = m.div_ceil(GRID_TILE) * n.div_ceil(GRID_TILE);
    let long_k = !serial && k >= K_SPLIT_MIN && k >= 4 * m;
    // Inputs of a long inner dimension too large to stay in cache between the tiles that
    // re-read them (each column block of op(A) once per tile column, and of op(B) once per
    // tile row): then the inner-dimension split, which reads each input once, is faster.
    let streams_inputs = kernels != Kernels::TiledLongK
        && k.saturating_mul(m + n).saturating_mul(4) >= K_SPLIT_STREAM_BYTES;
    // A row-major op(A) is read in place by `rowmajor` where the CPU runs it and op(B) is
    // narrow enough for its instructions, in the splits that go through `block`; op(B) is
    // packed once for every block.
    let packed = rowmajor::Isa::detect()
        .filter(|isa| {
            kernels != Kernels::MatrixMultiply
                && !long_k
                && !trans_a
                && k >= TRANSPOSE_MIN_K
                && n <= isa.max_n()
        })
        .map(|isa| rowmajor::PackedB::new(isa, bd, rsb as usize, csb as usize, k, n));
    // Computes rows `row0..row0 + c_rows.len() / n` of C into `c_rows`.
    let block = |row0: usize, c_rows: &mut [MaybeUninit<f32>]| {
        let rows = c_rows.len() / n;
        if let Some(pb) = &packed {
            // SAFETY: the CPU runs the kernel (`Isa::detect`); `ad` holds all m rows of the
            // row-major op(A) (k columns), `c_rows` is rows row0.. of C (a multiple of n
            // long), initialised when beta != 0 by this function's contract.
            return unsafe { rowmajor::gemm_rows(alpha, ad, row0, pb, beta, c_rows) };
        }
        if !trans_a && k >= TRANSPOSE_MIN_K {
            return block_transposed(row0, c_rows);
        }
        // Offset of op(A)'s row `row0` in `ad`.
        let a_off = if trans_a { row0 } else { row0 * a.cols() };
        // SAFETY: op(A) rows `row0..row0+rows` with strides (rsa, csa) address only elements of
        // `ad` (checked shapes: the last one is at a_off + (rows-1)*rsa + (k-1)*csa < ad.len()),
        // op(B) with (rsb, csb) stays inside `bd`, and `c_rows` is an exclusive `rows x n`
        // row-major slice, so (n, 1) strides address each of its elements once. sgemm reads C
        // only when beta != 0 (then C is initialised, by `gemm_into`'s contract) and writes
        // every element of it.
        unsafe {
            matrixmultiply::sgemm(
                rows,
                k,
                n,
                alpha,
                ad.as_ptr().add(a_off),
                rsa,
                csa,
                bd.as_ptr(),
                rsb,
                csb,
                beta,
                c_rows.as_mut_ptr().cast::<f32>(),
                n as isize,
                1,
            );
        }
    };
    if serial {
        block(0, c);
        return;
    }
    if long_k && tiles >= 2 && !streams_inputs {
        // Few output rows, a long inner dimension, and C wide enough for two or more
        // GRID_TILE x GRID_TILE tiles: one full-length product per tile, in parallel. No
        // partial sums to add up, and (measured on 128 x 3,700 x 256 weight gradients, two
        // threads) 100-117 GFLOP/s against 67-98 for the inner-dimension split below.
        let cols = n.div_ceil(GRID_TILE);
        let c_at = DisjointOut(c.as_mut_ptr().cast::<f32>());
        (0..tiles).into_par_iter().for_each(|t| {
            let (r0, c0) = ((t / cols) * GRID_TILE, (t % cols) * GRID_TILE);
            let (rows, width) = (GRID_TILE.min(m - r0), GRID_TILE.min(n - c0));
            let a_off = if trans_a { r0 } else { r0 * a.cols() };
            let b_off = if trans_b { c0 * b.cols() } else { c0 };
            // SAFETY: op(A) rows r0..r0+rows and op(B) columns c0..c0+width lie inside `ad`
            // and `bd` (the bounds argument of `block`, shifted by the tile's origin); the
            // tiles are disjoint rectangles of the m x n row-major C (row stride n), so each
            // element of C is written by exactly one task, and read only when beta != 0
            // (then initialised, by this function's contract).
            unsafe {
                matrixmultiply::sgemm(
                    rows,
                    k,
                    width,
                    alpha,
                    ad.as_ptr().add(a_off),
                    rsa,
                    csa,
                    bd.as_ptr().add(b_off),
                    rsb,
                    csb,
                    beta,
                    c_at.ptr().add(r0 * n + c0),
                    n as isize,
                    1,
                );
            }
        });
        return;
    }
    if long_k {
        // Partial products over inner-dimension chunks, summed in chunk order.
        let parts = k.div_ceil(K_SPLIT_CHUNK).min(K_SPLIT_MAX_PARTS);
        let chunk = k.div_ceil(parts);
        let partials: Vec<Vec<f32>> = (0..k.div_ceil(chunk))
            .into_par_iter()
            .map(|p| {
                let k0 = p * chunk;
                let kk = chunk.min(k - k0);
                let mut part: Vec<f32> = Vec::with_capacity(m * n);
                // SAFETY: op(A) columns k0..k0+kk and op(B) rows k0..k0+kk lie inside `ad` and
                // `bd` (same bounds argument as `block`, shifted by k0 along the inner
                // dimension), and `part` has room for an exclusive m x n row-major buffer,
                // every element of which sgemm writes (beta == 0), so `set_len` is sound.
                unsafe {
                    matrixmultiply::sgemm(
                        m,
                        kk,
                        n,
                        1.0,
                        ad.as_ptr().offset(k0 as isize * csa),
                        rsa,
                        csa,
                        bd.as_ptr().offset(k0 as isize * rsb),
                        rsb,
                        csb,
                        0.0,
                        part.as_mut_ptr(),
                        n as isize,
                        1,
                    );
                    part.set_len(m * n);
                }
                part
            })
            .collect();
        c.par_chunks_mut(1 << 14).enumerate().for_each(|(ci, cc)| {
            let off = ci << 14;
            for (j, out) in cc.iter_mut().enumerate() {
                let s: f32 = partials.iter().map(|p| p[off + j]).sum();
                // SAFETY (read): beta != 0 only with an initialised C (the contract).
                out.write(if beta == 0.0 {
                    alpha * s
                } else {
                    alpha * s + beta * unsafe { out.assume_init() }
                });
            }
        });
        return;
    }
    // Row blocks: about four per thread for load balance when rows allow (eight where op(B)
    // was packed once for all blocks, as a block then costs nothing more, and a worker left
    // without a block at the end waits for a shorter one), at least MIN_BLOCK_ROWS, and a
    // multiple of TILE_ALIGN rows. The alignment is what keeps results independent of the
    // thread count: matrixmultiply computes full micro-tiles with a fused multiply-add into C
    // but edge tiles through a buffer (two roundings), so every row must fall in the same kind
    // of tile whatever the split. Micro-kernels are 4 to 16 rows high.
    let threads = rayon::current_num_threads();
    let per_thread = if packed.is_some() { 8 } else { 4 };
    let per = m
        .div_ceil(threads * per_thread)
        .max(MIN_BLOCK_ROWS)
        .div_ceil(TILE_ALIGN)
        * TILE_ALIGN;
    if per >= m {
        block(0, c);
        return;
    }
    c.par_chunks_mut(per * n)
        .enumerate()
        .for_each(|(i, chunk)| block(i * per, chunk));
}
