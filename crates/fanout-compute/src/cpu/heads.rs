//! The kernels of an attention layer that aggregates its sources before projecting them:
//! every head's edge coefficients applied to whole source rows ([`spmm_heads`]), the
//! coefficients' gradient ([`spmm_heads_backward_coeff`]), and products of the `H` column
//! blocks of one tensor with the matching column blocks of another ([`head_matmul`],
//! [`head_acc_at_b`], [`head_matmul_bt`]).
//!
//! No head's block is copied out: the products with a row-major left factor run the
//! row-major tile (`super::rowmajor`) on strided rows, reading the block where it lies (a
//! head's block is as wide as the layer's input, and `matrixmultiply` would pack every row
//! of it for only `F` multiply-adds per element); the weight gradient, and every product
//! off x86-64, call `matrixmultiply::sgemm`, which takes any row and column strides. Their
//! tasks (row blocks of [`HEAD_ROWS`], or of [`HEAD_K_ROWS`] output rows for the weight
//! gradient) depend only on the shapes and each output element is one call's, so the results
//! do not depend on the thread count.

use rayon::prelude::*;
use std::mem::MaybeUninit;

use super::gemm::count_nominal;
use super::graph::CpuBlock;
use super::par::{par_dst_edges, par_rows_new, DisjointOut};
use super::rowmajor::{gemm_rows_strided, Isa, PackedB};
use super::rows::{axpy_slice, dot_heads};
use crate::tensor::Tensor;

/// Rows of the output per task of [`head_matmul`] and [`head_matmul_bt`] (a multiple of every
/// `matrixmultiply` micro-kernel height).
const HEAD_ROWS: usize = 256;
/// Rows of the weight gradient per task of [`head_acc_at_b`].
const HEAD_K_ROWS: usize = 64;

/// See [`crate::Backend::spmm_heads`].
pub(crate) fn spmm_heads(b: &CpuBlock, coeff: &Tensor, x: &Tensor) -> Tensor {
    let dims = b.dims();
    assert_eq!(coeff.rows(), dims.num_edges, "spmm_heads: coeff rows");
    assert_eq!(x.rows(), dims.num_src, "spmm_heads: x rows");
    let (heads, k) = (coeff.cols(), x.cols());
    let out = par_rows_new(dims.num_dst, heads * k, |d, row| {
        for (e, xs) in b.source_rows(d, x) {
            for (&w, acc) in coeff.row(e).iter().zip(row.chunks_exact_mut(k)) {
                axpy_slice(w, xs, acc);
            }
        }
    });
    Tensor::new(dims.num_dst, heads * k, out)
}

/// See [`crate::Backend::spmm_heads_backward_coeff`].
pub(crate) fn spmm_heads_backward_coeff(b: &CpuBlock, grad: &Tensor, x: &Tensor) -> Tensor {
    let dims = b.dims();
    assert_eq!(
        grad.rows(),
        dims.num_dst,
        "spmm_heads_backward_coeff: grad rows"
    );
    assert_eq!(x.rows(), dims.num_src, "spmm_heads_backward_coeff: x rows");
    let k = x.cols();
    assert!(
        k > 0 && grad.cols().is_multiple_of(k),
        "spmm_heads_backward_coeff: grad {:?} for x {:?}",
        grad.shape(),
        x.shape()
    );
    let heads = grad.cols() / k;
    let mut out = Tensor::zeros(dims.num_edges, heads);
    par_dst_edges(b.indptr(), out.data_mut(), heads, |d, o| {
        let g = grad.row(d);
        for (i, (_, xs)) in b.source_rows(d, x).enumerate() {
            for (h, o) in o[i * heads..(i + 1) * heads].iter_mut().enumerate() {
                dot_heads(&g[h * k..(h + 1) * k], xs, std::slice::from_mut(o));
            }
        }
    });
    out
}

/// The head count's split of `y`'s and `w`'s widths: `(k, f)`, `y` being `H*k` wide and `w`
/// `k x H*f`. Panics unless the shapes agree.
fn head_widths(y: &Tensor, w: &Tensor, heads: usize, what: &str) -> (usize, usize) {
    let (k, hf) = w.shape();
    assert!(
        heads > 0 && y.cols() == heads * k && hf.is_multiple_of(heads),
        "{what}: {heads} heads of y {:?} and w {:?}",
        y.shape(),
        w.shape()
    );
    (k, hf / heads)
}

/// See [`crate::Backend::head_matmul`].
pub(crate) fn head_matmul(y: &Tensor, w: &Tensor, heads: usize) -> Tensor {
    let (k, f) = head_widths(y, w, heads, "head_matmul");
    let (n, hk, hf) = (y.rows(), y.cols(), w.cols());
    count_nominal(n, hf, k);
    let mut out = Vec::with_capacity(n * hf);
    // Head h: rows of y's block `h` (`k` floats, `hk` apart) by w's columns `h` (`k x f`,
    // strides (hf, 1)) into out's columns `h` (`f` floats, `hf` apart).
    per_head_rows(
        (y.data(), hk, |h| h * k),
        (w.data(), |h| h * f, hf, 1),
        (k, f),
        (out.spare_capacity_mut(), hf, |h| h * f),
        n,
        heads,
    );
    // SAFETY: `per_head_rows` wrote every element (its blocks tile the n x hf output).
    unsafe { out.set_len(n * hf) };
    Tensor::new(n, hf, out)
}

/// See [`crate::Backend::head_matmul_bt`].
pub(crate) fn head_matmul_bt(g: &Tensor, w: &Tensor, heads: usize) -> Tensor {
    let (k, hf) = w.shape();
    assert!(
        heads > 0 && hf.is_multiple_of(heads) && g.cols() == hf,
        "head_matmul_bt: {heads} heads of g {:?} and w {:?}",
        g.shape(),
        w.shape()
    );
    let (n, f, hk) = (g.rows(), hf / heads, heads * k);
    count_nominal(n, hk, f);
    let mut out = Vec::with_capacity(n * hk);
    // Head h: rows of g's columns `h` (`f` floats, `hf` apart) by w's columns `h` read
    // transposed (`f x k`, strides (1, hf)) into out's block `h` (`k` floats, `hk` apart).
    per_head_rows(
        (g.data(), hf, |h| h * f),
        (w.data(), |h| h * f, 1, hf),
        (f, k),
        (out.spare_capacity_mut(), hk, |h| h * k),
        n,
        heads,
    );
    // SAFETY: `per_head_rows` wrote every element (its blocks tile the n x hk output).
    unsafe { out.set_len(n * hk) };
    Tensor::new(n, hk, out)
}

/// `C_h = A_h B_h` for every head `h`, each operand a strided block of a wider matrix: `A_h`
/// is `rows x inner` at `a.0[a.2(h)..]` with rows `a.1` apart, `B_h` is `inner x cols` with
/// element `(i, j)` at `b.0[b.1(h) + i * b.2 + j * b.3]`, `C_h` is `rows x cols` at
/// `c.0[c.2(h)..]` with rows `c.1` apart, written without being read (`C`'s blocks
/// disjoint; where they tile `c`, all of it is written). Tasks are
/// [`HEAD_ROWS`] rows of one head; on x86-64 with AVX2 or AVX-512 the row-major tile reads
/// `A_h` where it lies (`B_h` packed once per head), elsewhere `sgemm` takes the strides.
fn per_head_rows(
    a: (&[f32], usize, impl Fn(usize) -> usize + Sync),
    b: (&[f32], impl Fn(usize) -> usize + Sync, usize, usize),
    (inner, cols): (usize, usize),
    c: (
        &mut [MaybeUninit<f32>],
        usize,
        impl Fn(usize) -> usize + Sync,
    ),
    rows: usize,
    heads: usize,
) {
    if rows == 0 || cols == 0 {
        return;
    }
    let packed: Option<Vec<PackedB>> = Isa::detect().map(|isa| {
        (0..heads)
            .map(|h| PackedB::new(isa, &b.0[b.1(h)..], b.2, b.3, inner, cols))
            .collect()
    });
    let out = DisjointOut(c.0.as_mut_ptr().cast::<f32>());
    (0..rows.div_ceil(HEAD_ROWS) * heads)
        .into_par_iter()
        .for_each(|t| {
            let (r0, h) = ((t / heads) * HEAD_ROWS, t % heads);
            let n = HEAD_ROWS.min(rows - r0);
            // SAFETY: A_h's rows r0..r0 + n and B_h lie in their slices (the callers'
            // shapes); C_h's rows r0..r0 + n are this task's alone (tasks split rows and
            // heads, and heads' column blocks are disjoint), written with beta = 0, which
            // reads nothing of C.
            unsafe {
                let a_at = a.0.as_ptr().add(r0 * a.1 + a.2(h));
                let c_at = out.ptr().add(r0 * c.1 + c.2(h));
                match &packed {
                    Some(p) => gemm_rows_strided(1.0, a_at, a.1, n, &p[h], 0.0, c_at, c.1),
                    None => matrixmultiply::sgemm(
                        n,
                        inner,
                        cols,
                        1.0,
                        a_at,
                        a.1 as isize,
                        1,
                        b.0.as_ptr().add(b.1(h)),
                        b.2 as isize,
                        b.3 as isize,
                        0.0,
                        c_at,
                        c.1 as isize,
                        1,
                    ),
                }
            }
        });
}

/// See [`crate::Backend::head_acc_at_b`].
pub(crate) fn head_acc_at_b(y: &Tensor, g: &Tensor, gw: &mut Tensor, heads: usize) {
    let (k, f) = head_widths(y, gw, heads, "head_acc_at_b");
    let (n, hk, hf) = (y.rows(), y.cols(), gw.cols());
    assert_eq!(g.shape(), (n, hf), "head_acc_at_b: g shape");
    count_nominal(k, hf, n);
    let c = DisjointOut(gw.data_mut().as_mut_ptr());
    let (yd, gd) = (y.data(), g.data());
    (0..k.div_ceil(HEAD_K_ROWS) * heads)
        .into_par_iter()
        .for_each(|t| {
            let (i0, h) = ((t / heads) * HEAD_K_ROWS, t % heads);
            let rows = HEAD_K_ROWS.min(k - i0);
            // SAFETY: A is columns i0.. of y's head-h block read transposed (`rows x n`,
            // strides (1, hk)), B is g's head-h columns (`n x f`, strides (hf, 1)), C is rows
            // i0.. of gw's head-h columns (`rows x f`, strides (hf, 1)), read and written by
            // this task alone.
            unsafe {
                matrixmultiply::sgemm(
                    rows,
                    n,
                    f,
                    1.0,
                    yd.as_ptr().add(h * k + i0),
                    1,
                    hk as isize,
                    gd.as_ptr().add(h * f),
                    hf as isize,
                    1,
                    1.0,
                    c.ptr().add(i0 * hf + h * f),
                    hf as isize,
                    1,
                );
            }
        });
}
