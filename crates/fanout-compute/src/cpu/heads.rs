//! The kernels of an attention layer that aggregates its sources before projecting them:
//! every head's edge coefficients applied to whole source rows ([`spmm_heads`]), the
//! coefficients' gradient ([`spmm_heads_backward_coeff`]), and products of the `H` column
//! blocks of one tensor with the matching column blocks of another ([`head_matmul`],
//! [`head_acc_at_b`], [`head_matmul_bt`]).
//!
//! No head's block is copied out: the products with a row-major left factor run the
//! row-major tile (`super::rowmajor`) on strided rows, reading the block where it lies (a
//! head's block is as wide as the layer's input, and `matrixmultiply` would pack every row
//! of it for only `F` multiply-adds per element). The weight gradient skips the zeros of a
//! ReLU and dropout layer's gradient where `gemm` would (`sparse_grad::head_tn_sparse`);
//! otherwise it, and every product off x86-64, calls `matrixmultiply::sgemm`, which takes
//! any row and column strides. Their tasks (row blocks of [`HEAD_ROWS`], or of
//! [`HEAD_K_ROWS`] output rows for the weight gradient) depend only on the shapes and each
//! output element is one call's, so the results do not depend on the thread count.
//!
//! The two edge kernels, [`spmm_heads`] and [`spmm_heads_backward_coeff`], keep one vector of
//! columns of up to eight heads in registers on x86-64 (AVX or AVX-512), so a source row is
//! loaded once for all heads; they give the plain loops' bits, which every other CPU runs.

use rayon::prelude::*;
use std::mem::MaybeUninit;

use super::gemm::{count_nominal, count_skipped, skips_zeros};
use super::graph::CpuBlock;
use super::par::{par_dst_edges, par_rows_new, DisjointOut};
use super::rowmajor::{gemm_rows_strided, Isa, PackedB};
use super::rows::{axpy_slice, dot_heads};
use super::sparse_grad;
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
    #[cfg(target_arch = "x86_64")]
    if let Some(isa) = x86::HeadSums::detect(k) {
        let out = par_rows_new(dims.num_dst, heads * k, |d, row| {
            let edges = b.edges(d);
            let w = &coeff.data()[edges.start * heads..edges.end * heads];
            // SAFETY: `isa` was detected on this CPU; every source is `< num_src`, the rows
            // of `x` (a validated block, `x.rows()` checked above), `w` holds `heads` values
            // per edge and `row` is `heads * k` long.
            unsafe { isa.row(b.sources(d), b.sources(d + 1), w, heads, x, row) };
        });
        return Tensor::new(dims.num_dst, heads * k, out);
    }
    spmm_heads_plain(b, coeff, x)
}

/// [`spmm_heads`] one scaled row at a time (every CPU; the vector path's reference).
fn spmm_heads_plain(b: &CpuBlock, coeff: &Tensor, x: &Tensor) -> Tensor {
    let dims = b.dims();
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
    #[cfg(target_arch = "x86_64")]
    if k >= super::rows::DOT_LANES && is_x86_feature_detected!("avx") {
        par_dst_edges(b.indptr(), out.data_mut(), heads, |d, o| {
            // SAFETY: the CPU has AVX (checked above); every source is `< num_src`, the rows
            // of `x` (a validated block, `x.rows()` checked above); `grad`'s row is
            // `heads * k` wide and `o` holds `heads` values per edge.
            unsafe {
                x86::head_dots(
                    b.sources(d),
                    b.sources(d + 1),
                    grad.row(d),
                    heads,
                    x.data().as_ptr(),
                    k,
                    o,
                )
            };
        });
        return out;
    }
    spmm_heads_backward_coeff_plain(b, grad, x, heads, out)
}

/// [`spmm_heads_backward_coeff`] one dot product at a time into the zeros `out` (every
/// CPU; the vector path's reference).
fn spmm_heads_backward_coeff_plain(
    b: &CpuBlock,
    grad: &Tensor,
    x: &Tensor,
    heads: usize,
    mut out: Tensor,
) -> Tensor {
    let k = x.cols();
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
    if skips_zeros(g, k) {
        // A ReLU and dropout layer's gradient: each head's product skips its zeros.
        let used = sparse_grad::head_tn_sparse(y, g, gw, heads);
        count_skipped(k, g, used);
        return;
    }
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

/// The vector paths of the two edge kernels. [`spmm_heads`]'s plain loop adds each edge's
/// source row, scaled by each head's coefficient, into the whole output row (`H * k` floats,
/// every element loaded and stored once per edge); here one vector's columns of up to eight
/// heads stay in registers while every edge of the destination is added to them, so the
/// output is written once and each source vector loaded once for all those heads. Each
/// element still sums its edges in edge order from zero, a product then a sum (two
/// roundings), so the bits are the plain loop's. [`spmm_heads_backward_coeff`]'s dot
/// products likewise load each source vector once for up to eight heads (`head_dots`).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::super::rows::{dot_lanes_sum, DOT_LANES};
    use super::super::sparse_grad::x86::Lanes;
    use crate::tensor::Tensor;
    use std::arch::x86_64::*;

    /// `o[i heads + h] = g[h k..(h + 1) k] . x[src[i] k..][..k]` for every edge `i` and head
    /// `h`: [`super::spmm_heads_backward_coeff`]'s dot products of one destination, each in
    /// `rows::dot_slice`'s order (product `c` into partial sum `c % 8`, the eight sums added
    /// pairwise), so with the bits of `rows::dot_heads`. A source's vector of columns is
    /// loaded once for up to eight heads (eight 8-float sums in registers), where a dot
    /// product per head loads it once per head. Prefetches the rows of `next` (the next
    /// destination's sources), one per edge.
    ///
    /// # Safety
    /// The CPU has AVX; `x` holds a `k`-float row for every id in `src` and `next`;
    /// `g.len() == heads * k`; `o.len() == src.len() * heads`.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn head_dots(
        src: &[u32],
        next: &[u32],
        g: &[f32],
        heads: usize,
        x: *const f32,
        k: usize,
        o: &mut [f32],
    ) {
        debug_assert!(g.len() == heads * k && o.len() == src.len() * heads);
        let dots = HeadDots {
            src,
            g: g.as_ptr(),
            heads,
            x,
            k,
            o: o.as_mut_ptr(),
        };
        let mut h0 = 0;
        while h0 < heads {
            match heads - h0 {
                1 => dots.heads_from::<1>(h0, next),
                2 => dots.heads_from::<2>(h0, next),
                3 => dots.heads_from::<3>(h0, next),
                4 => dots.heads_from::<4>(h0, next),
                5 => dots.heads_from::<5>(h0, next),
                6 => dots.heads_from::<6>(h0, next),
                7 => dots.heads_from::<7>(h0, next),
                _ => dots.heads_from::<8>(h0, next),
            }
            h0 += 8;
        }
        if heads > 0 {
            for &s in next.get(src.len()..).unwrap_or(&[]) {
                prefetch_row(x.add(s as usize * k), k);
            }
        }
    }

    /// The rows of one destination's dot products ([`head_dots`]).
    #[derive(Clone, Copy)]
    struct HeadDots<'a> {
        src: &'a [u32],
        g: *const f32,
        heads: usize,
        x: *const f32,
        k: usize,
        o: *mut f32,
    }

    impl HeadDots<'_> {
        /// Heads `h0..h0 + G`, prefetching `next[i]`'s row at edge `i` in the first group.
        ///
        /// # Safety
        /// As [`head_dots`]; `h0 + G <= heads`.
        #[inline(always)]
        unsafe fn heads_from<const G: usize>(self, h0: usize, next: &[u32]) {
            let HeadDots {
                src,
                g,
                heads,
                x,
                k,
                o,
            } = self;
            let full = k - k % DOT_LANES;
            for (i, &s) in src.iter().enumerate() {
                if h0 == 0 {
                    if let Some(&n) = next.get(i) {
                        prefetch_row(x.add(n as usize * k), k);
                    }
                }
                let xs = x.add(s as usize * k);
                let mut acc = [_mm256_setzero_ps(); G];
                let mut c = 0;
                while c < full {
                    let xv = <__m256 as Lanes>::load(xs.add(c));
                    for (j, acc) in acc.iter_mut().enumerate() {
                        let gv = <__m256 as Lanes>::load(g.add((h0 + j) * k + c));
                        *acc = <__m256 as Lanes>::add_product(*acc, gv, xv);
                    }
                    c += DOT_LANES;
                }
                for (j, acc) in acc.iter().enumerate() {
                    let mut lanes = [0.0f32; DOT_LANES];
                    _mm256_storeu_ps(lanes.as_mut_ptr(), *acc);
                    for (l, c) in (full..k).enumerate() {
                        lanes[l] += *g.add((h0 + j) * k + c) * *xs.add(c);
                    }
                    *o.add(i * heads + h0 + j) = dot_lanes_sum(&lanes);
                }
            }
        }
    }

    /// `rows::prefetch_row` of the `k` floats at `p`.
    ///
    /// # Safety
    /// `k` floats are readable at `p`.
    #[inline(always)]
    unsafe fn prefetch_row(p: *const f32, k: usize) {
        super::super::rows::prefetch_row(std::slice::from_raw_parts(p, k))
    }

    /// The vector width to use.
    #[derive(Clone, Copy)]
    pub(super) enum HeadSums {
        Avx512,
        Avx,
    }

    impl HeadSums {
        /// The widest vectors this CPU has, for rows of `k >=` one vector; `None` otherwise.
        pub(super) fn detect(k: usize) -> Option<Self> {
            if k >= 16 && is_x86_feature_detected!("avx512f") {
                Some(HeadSums::Avx512)
            } else if k >= 8 && is_x86_feature_detected!("avx") {
                Some(HeadSums::Avx)
            } else {
                None
            }
        }

        /// `row[h k + c] = sum over i of w[i heads + h] * x[src[i], c]` for every head
        /// `h < heads` and column `c < k` (`x` being `k` wide), edges added in order from
        /// zero. Prefetches the rows of `next` (the next destination's sources), a line of
        /// each per line of columns summed.
        ///
        /// # Safety
        /// The CPU has the vector width's instructions (as [`HeadSums::detect`] found);
        /// every id in `src` and `next` is a row of `x`; `w.len() >= src.len() * heads`;
        /// `row.len() == heads * k`.
        pub(super) unsafe fn row(
            self,
            src: &[u32],
            next: &[u32],
            w: &[f32],
            heads: usize,
            x: &Tensor,
            row: &mut [f32],
        ) {
            let k = x.cols();
            debug_assert!(w.len() >= src.len() * heads && row.len() == heads * k);
            let g = Group {
                src,
                next,
                w,
                heads,
                x: x.data().as_ptr(),
                k,
                row: row.as_mut_ptr(),
            };
            match self {
                HeadSums::Avx512 => g.avx512(),
                HeadSums::Avx => g.avx(),
            }
        }
    }

    /// One output row's sums: its edges' sources `src`, their coefficients `w` (`heads` per
    /// edge), the source rows `x` (`k` floats each) and the row `row` (`heads * k`).
    #[derive(Clone, Copy)]
    struct Group<'a> {
        src: &'a [u32],
        next: &'a [u32],
        w: &'a [f32],
        heads: usize,
        x: *const f32,
        k: usize,
        row: *mut f32,
    }

    impl Group<'_> {
        /// # Safety
        /// As [`HeadSums::row`], with AVX-512F.
        #[target_feature(enable = "avx512f")]
        unsafe fn avx512(self) {
            self.all_heads::<__m512>()
        }

        /// # Safety
        /// As [`HeadSums::row`], with AVX.
        #[target_feature(enable = "avx")]
        unsafe fn avx(self) {
            self.all_heads::<__m256>()
        }

        /// The heads in groups of eight (the last group smaller).
        ///
        /// # Safety
        /// As [`HeadSums::row`], the CPU having `V`'s instructions.
        #[inline(always)]
        unsafe fn all_heads<V: Lanes>(self) {
            let mut h0 = 0;
            while h0 < self.heads {
                match self.heads - h0 {
                    1 => self.heads_from::<V, 1>(h0),
                    2 => self.heads_from::<V, 2>(h0),
                    3 => self.heads_from::<V, 3>(h0),
                    4 => self.heads_from::<V, 4>(h0),
                    5 => self.heads_from::<V, 5>(h0),
                    6 => self.heads_from::<V, 6>(h0),
                    7 => self.heads_from::<V, 7>(h0),
                    _ => self.heads_from::<V, 8>(h0),
                }
                h0 += 8;
            }
        }

        /// Heads `h0..h0 + G`.
        ///
        /// # Safety
        /// As [`HeadSums::row`], the CPU having `V`'s instructions; `h0 + G <= heads`.
        #[inline(always)]
        unsafe fn heads_from<V: Lanes, const G: usize>(self, h0: usize) {
            let Group {
                src,
                next,
                w,
                heads,
                x,
                k,
                row,
            } = self;
            let full = k - k % V::LANES;
            let mut c = 0;
            while c < full {
                // The next destination's rows, a line of each per line of columns here, so
                // they arrive while this one's are summed without a burst of misses.
                if h0 == 0 && (c * 4) % 64 == 0 {
                    for &s in next {
                        _mm_prefetch::<_MM_HINT_T1>(x.add(s as usize * k + c).cast());
                    }
                }
                let mut acc = [V::splat(0.0); G];
                for (i, &s) in src.iter().enumerate() {
                    let xv = V::load(x.add(s as usize * k + c));
                    let we = w.as_ptr().add(i * heads + h0);
                    for (j, acc) in acc.iter_mut().enumerate() {
                        *acc = V::add_product(*acc, V::splat(*we.add(j)), xv);
                    }
                }
                for (j, acc) in acc.iter().enumerate() {
                    acc.store(row.add((h0 + j) * k + c));
                }
                c += V::LANES;
            }
            // The last columns, fewer than a vector, one at a time in the same order.
            for j in 0..G {
                for c in full..k {
                    let mut sum = 0.0f32;
                    for (i, &s) in src.iter().enumerate() {
                        sum += w[i * heads + h0 + j] * *x.add(s as usize * k + c);
                    }
                    *row.add((h0 + j) * k + c) = sum;
                }
            }
        }
    }
}

/// The vector paths against the plain loops, and the zero-skipping weight gradient (x86-64
/// only: elsewhere both take the plain paths).
#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::super::sparse_grad::testing::{pools, random};
    use super::*;
    use crate::block::BlockRef;
    use fanout_rand::Rng;

    /// A block of `num_dst` destinations with 0-30 random sources each (repeats included)
    /// among `num_src`.
    fn random_block(num_dst: usize, num_src: usize, rng: &mut Rng) -> CpuBlock {
        let (mut indptr, mut indices) = (vec![0u32], Vec::new());
        for _ in 0..num_dst {
            for _ in 0..rng.below(31) {
                indices.push(rng.below(num_src as u64) as u32);
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
        CpuBlock::new(&b).unwrap()
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        t.data().iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn weight_gradients_that_skip_zeros_match_f64_on_any_thread_count() {
        let mut rng = Rng::new(23);
        // Rows enough for the zero-skipping shape; a strip and a part of one per head.
        let (m, heads, k, f) = (2200, 3, 150, 20);
        let y = random(&mut rng, m, heads * k, 1.0);
        let g = random(&mut rng, m, heads * f, 0.3);
        assert!(
            skips_zeros(&g, k),
            "the test's gradient should take the zero-skipping path"
        );
        let start = random(&mut rng, k, heads * f, 1.0);
        let [one, three] = pools().map(|pool| {
            let mut gw = start.clone();
            pool.install(|| head_acc_at_b(&y, &g, &mut gw, heads));
            gw
        });
        assert_eq!(bits(&one), bits(&three), "thread counts");
        let got = one;
        for i in 0..k {
            for h in 0..heads {
                for j in 0..f {
                    let mut want = start.data()[i * heads * f + h * f + j] as f64;
                    for r in 0..m {
                        let a = y.data()[r * heads * k + h * k + i] as f64;
                        want += a * g.data()[r * heads * f + h * f + j] as f64;
                    }
                    let have = got.data()[i * heads * f + h * f + j] as f64;
                    assert!(
                        (have - want).abs() <= 1e-4 * (1.0 + want.abs()),
                        "{i} {h} {j}"
                    );
                }
            }
        }
    }

    #[test]
    fn vector_head_sums_and_dots_give_the_plain_loops_bits() {
        let mut rng = Rng::new(17);
        // Heads below, at and above a group of eight; rows narrower than a vector, whole
        // vectors and vectors plus a tail.
        for (heads, k) in [
            (1, 16),
            (3, 5),
            (8, 256),
            (9, 17),
            (12, 100),
            (2, 8),
            (8, 7),
        ] {
            let b = random_block(40, 90, &mut rng);
            let coeff = random(&mut rng, b.dims().num_edges, heads, 1.0);
            let mut x = random(&mut rng, 90, k, 1.0);
            // Signed zeros and a NaN go through the sums as in the plain loop.
            x.data_mut()[0] = -0.0;
            x.data_mut()[k] = f32::NAN;
            let want = bits(&spmm_heads_plain(&b, &coeff, &x));
            assert_eq!(
                bits(&spmm_heads(&b, &coeff, &x)),
                want,
                "{heads} heads of {k}"
            );
            let grad = random(&mut rng, 40, heads * k, 1.0);
            let zeros = Tensor::zeros(b.dims().num_edges, heads);
            let plain = spmm_heads_backward_coeff_plain(&b, &grad, &x, heads, zeros);
            let got = spmm_heads_backward_coeff(&b, &grad, &x);
            assert_eq!(
                bits(&got),
                bits(&plain),
                "coefficients' gradient, {heads} heads of {k}"
            );
            for isa in [x86::HeadSums::Avx512, x86::HeadSums::Avx] {
                let lanes = if matches!(isa, x86::HeadSums::Avx512) {
                    16
                } else {
                    8
                };
                let has = match isa {
                    x86::HeadSums::Avx512 => is_x86_feature_detected!("avx512f"),
                    x86::HeadSums::Avx => is_x86_feature_detected!("avx"),
                };
                if !has || k < lanes {
                    continue;
                }
                let mut got = vec![f32::NAN; b.dims().num_dst * heads * k];
                for (d, row) in got.chunks_mut(heads * k).enumerate() {
                    let e = b.edges(d);
                    let w = &coeff.data()[e.start * heads..e.end * heads];
                    // SAFETY: checked above that the CPU has `isa`; the shapes are the block's.
                    unsafe { isa.row(b.sources(d), &[], w, heads, &x, row) };
                }
                let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "{lanes} lanes, {heads} heads of {k}");
            }
        }
    }
}
