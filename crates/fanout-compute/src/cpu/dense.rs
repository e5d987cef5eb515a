//! Dense row and elementwise kernels (bias, activations, dropout, normalisation, head ops).

use fanout_rand::lowbias32;
use rayon::prelude::*;
use std::mem::MaybeUninit;

use crate::backend::DropoutSpec;
use crate::cpu::par::{
    copy, map1, map2, par_row_reduce, par_rows, sum_partials, ELEM_CHUNK, REDUCE_ROWS,
};
use crate::cpu::rows::{axpy_heads, axpy_slice, dot_f64_slice, dot_heads, dot_slice};
use crate::tensor::Tensor;

/// See [`crate::Backend::add_bias`].
pub(crate) fn add_bias(x: &mut Tensor, bias: &Tensor) {
    assert_eq!(bias.shape(), (1, x.cols()), "add_bias: bias shape");
    let cols = x.cols();
    let b = bias.data();
    par_rows(x.data_mut(), cols, |_, row| axpy_slice(1.0, b, row));
}

/// See [`crate::Backend::sum_rows`].
pub(crate) fn sum_rows(x: &Tensor) -> Tensor {
    let cols = x.cols();
    let total = par_row_reduce(x.rows(), cols, |r0, r1, acc| {
        let rows = &x.data()[r0 * cols..r1 * cols];
        with_avx2(|| sum_rows_f64(rows, acc))
    });
    Tensor::new(1, cols, total.into_iter().map(|v| v as f32).collect())
}

/// Runs `f`, an `#[inline(always)]` row loop, compiled for AVX2 where the CPU has it, plainly
/// otherwise. The f64 column sums below are elementwise (no lane mixes with another), and Rust
/// never fuses a multiply into an add, so both builds give the same bits; the baseline x86-64
/// build converts and adds two doubles an instruction, which made GAT's attention-vector
/// gradient compute-bound (docs/performance.md, stop 51).
#[inline(always)]
fn with_avx2(f: impl FnOnce()) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        #[target_feature(enable = "avx2")]
        unsafe fn avx2(f: impl FnOnce()) {
            f()
        }
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { avx2(f) };
    }
    f()
}

/// `acc[c] += rows[r][c] as f64` for each row of `rows` in order (`acc.len()` columns).
#[inline(always)]
fn sum_rows_f64(rows: &[f32], acc: &mut [f64]) {
    if acc.is_empty() {
        return;
    }
    for row in rows.chunks_exact(acc.len()) {
        for (a, &v) in acc.iter_mut().zip(row) {
            *a += v as f64;
        }
    }
}

/// See [`crate::Backend::axpy`].
pub(crate) fn axpy(alpha: f32, x: &Tensor, y: &mut Tensor) {
    assert_eq!(x.shape(), y.shape(), "axpy: shapes differ");
    y.data_mut()
        .par_chunks_mut(ELEM_CHUNK)
        .zip(x.data().par_chunks(ELEM_CHUNK))
        .for_each(|(y, x)| axpy_slice(alpha, x, y));
}

/// See [`crate::Backend::axpy_prefix`].
pub(crate) fn axpy_prefix(alpha: f32, x: &Tensor, y: &mut Tensor, rows: usize) {
    assert!(
        x.rows() >= rows && y.rows() >= rows && x.cols() == y.cols(),
        "axpy_prefix: x {:?}, y {:?}, rows {rows}",
        x.shape(),
        y.shape()
    );
    let n = rows * x.cols();
    y.data_mut()[..n]
        .par_chunks_mut(ELEM_CHUNK)
        .zip(x.data()[..n].par_chunks(ELEM_CHUNK))
        .for_each(|(y, x)| axpy_slice(alpha, x, y));
}

/// See [`crate::Backend::prefix_rows`].
pub(crate) fn prefix_rows(x: &Tensor, rows: usize) -> Tensor {
    assert!(rows <= x.rows(), "prefix_rows: {rows} > {}", x.rows());
    Tensor::new(rows, x.cols(), copy(&x.data()[..rows * x.cols()]))
}

/// See [`crate::Backend::scale`].
pub(crate) fn scale(x: &mut Tensor, alpha: f32) {
    x.data_mut()
        .par_chunks_mut(ELEM_CHUNK)
        .for_each(|c| c.iter_mut().for_each(|v| *v *= alpha));
}

/// See [`crate::Backend::mul`].
pub(crate) fn mul(a: &Tensor, b: &Tensor) -> Tensor {
    assert_eq!(a.shape(), b.shape(), "mul: shapes differ");
    Tensor::new(a.rows(), a.cols(), map2(a.data(), b.data(), |a, b| a * b))
}

/// See [`crate::Backend::mul_sum_rows`]. The column sums are [`sum_rows`]'s: f64 partial
/// sums over the same chunks of [`REDUCE_ROWS`] rows, added in chunk order.
pub(crate) fn mul_sum_rows(a: &Tensor, b: &Tensor) -> (Tensor, Tensor) {
    assert_eq!(a.shape(), b.shape(), "mul_sum_rows: shapes differ");
    let (rows, cols) = a.shape();
    let len = rows * cols;
    let mut out: Vec<f32> = Vec::with_capacity(len);
    let mut partials: Vec<Vec<f64>> = Vec::new();
    if len > 0 {
        partials = out.spare_capacity_mut()[..len]
            .par_chunks_mut(REDUCE_ROWS * cols)
            .enumerate()
            .map(|(i, chunk)| {
                let mut acc = vec![0.0f64; cols];
                let span = i * REDUCE_ROWS * cols..i * REDUCE_ROWS * cols + chunk.len();
                let (ar, br) = (&a.data()[span.clone()], &b.data()[span]);
                with_avx2(|| mul_sum_rows_f64(chunk, &mut acc, ar, br));
                acc
            })
            .collect();
        // SAFETY: the chunks cover all `len` elements and every element of each was written.
        unsafe { out.set_len(len) };
    }
    let total = sum_partials(partials, cols);
    (
        Tensor::new(rows, cols, out),
        Tensor::new(1, cols, total.into_iter().map(|v| v as f32).collect()),
    )
}

/// `out = a * b` elementwise and `acc[c] += out[r][c] as f64` for each row in order (rows of
/// `acc.len()` columns; `out`, `a` and `b` the same length).
#[inline(always)]
fn mul_sum_rows_f64(out: &mut [MaybeUninit<f32>], acc: &mut [f64], a: &[f32], b: &[f32]) {
    let cols = acc.len();
    let rows = out
        .chunks_exact_mut(cols)
        .zip(a.chunks_exact(cols).zip(b.chunks_exact(cols)));
    for (orow, (ar, br)) in rows {
        for (((o, s), &x), &y) in orow.iter_mut().zip(&mut *acc).zip(ar).zip(br) {
            let v = x * y;
            o.write(v);
            *s += v as f64;
        }
    }
}

/// See [`crate::Backend::dot`].
pub(crate) fn dot(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.shape(), b.shape(), "dot: shapes differ");
    par_row_reduce(a.rows(), 1, |r0, r1, acc| {
        for r in r0..r1 {
            acc[0] += dot_f64_slice(a.row(r), b.row(r));
        }
    })[0]
}

/// Whether every element of `x` is finite (see [`crate::Backend::all_finite`]): read in
/// place and in parallel, where the trait's default copies the tensor first and scans it on
/// one thread while the other workers wait (every step checks every parameter gradient).
pub(crate) fn all_finite(x: &[f32]) -> bool {
    // Branch-free within a chunk, so that the compiler vectorises the test.
    x.par_chunks(ELEM_CHUNK)
        .all(|c| c.iter().fold(true, |ok, v| ok & v.is_finite()))
}

/// See [`crate::Backend::relu`].
pub(crate) fn relu(x: &Tensor) -> Tensor {
    Tensor::new(x.rows(), x.cols(), map1(x.data(), |v| v.max(0.0)))
}

/// See [`crate::Backend::relu_backward`].
pub(crate) fn relu_backward(grad: &Tensor, out: &Tensor) -> Tensor {
    assert_eq!(grad.shape(), out.shape(), "relu_backward: shapes differ");
    let d = map2(
        grad.data(),
        out.data(),
        |g, o| if o > 0.0 { g } else { 0.0 },
    );
    Tensor::new(grad.rows(), grad.cols(), d)
}

/// See [`crate::Backend::leaky_relu`].
pub(crate) fn leaky_relu(x: &Tensor, slope: f32) -> Tensor {
    let d = map1(x.data(), |v| if v > 0.0 { v } else { slope * v });
    Tensor::new(x.rows(), x.cols(), d)
}

/// See [`crate::Backend::leaky_relu_backward`].
pub(crate) fn leaky_relu_backward(grad: &Tensor, x: &Tensor, slope: f32) -> Tensor {
    assert_eq!(
        grad.shape(),
        x.shape(),
        "leaky_relu_backward: shapes differ"
    );
    let d = map2(
        grad.data(),
        x.data(),
        |g, v| if v > 0.0 { g } else { slope * g },
    );
    Tensor::new(grad.rows(), grad.cols(), d)
}

/// See [`crate::Backend::dropout`].
///
/// An element is dropped when its 32-bit uniform draw is below `round(p * 2^32)`, so its drop
/// probability is within `2^-32` of `p`. The draw of row `r`, column `c` is a counter-based
/// hash: with `(lo, hi)` the halves of `mix_keys([key, r])`, it is
/// `lowbias32(lowbias32(lo + c) ^ hi)` ([`fanout_rand::lowbias32`], a two-multiply 32-bit
/// integer hash (a bijection; the inner one makes a row's draws distinct, the outer one
/// decorrelates rows whose `lo` differ by a shift). Unlike a sequential generator, every
/// element's draw is independent of the others' computation, so the loop runs eight lanes at
/// a time (AVX2 where the CPU has it, with the same integers and hence the same masks as the
/// plain loop): a fifth of the time of two draws per xoshiro256++ step.
pub(crate) fn dropout(x: &Tensor, p: f32, key: u64, row_ids: Option<&[u32]>) -> (Tensor, Tensor) {
    let (thr, keep) = dropout_params(p, row_ids, x.rows());
    let (rows, cols) = x.shape();
    let len = rows * cols;
    let (mut out, mut mask): (Vec<f32>, Vec<f32>) =
        (Vec::with_capacity(len), Vec::with_capacity(len));
    if len > 0 {
        out.spare_capacity_mut()[..len]
            .par_chunks_mut(cols)
            .zip(mask.spare_capacity_mut()[..len].par_chunks_mut(cols))
            .enumerate()
            .with_min_len((2048 / cols).max(1))
            .for_each(|(r, (orow, mrow))| {
                let id = row_ids.map_or(r as u64, |ids| ids[r] as u64);
                DropoutRow::new(key, id, thr, keep).apply(x.row(r), orow, mrow);
            });
        // SAFETY: the rows cover all `len` elements of both buffers, and `apply` wrote every
        // element of each row (`x.row(r)` is as long as the row).
        unsafe {
            out.set_len(len);
            mask.set_len(len);
        }
    }
    (Tensor::new(rows, cols, out), Tensor::new(rows, cols, mask))
}

/// One row's dropout: its hash keys, the drop threshold and the keep scale.
#[derive(Clone, Copy)]
struct DropoutRow {
    lo: u32,
    hi: u32,
    thr: u32,
    keep: f32,
}

impl DropoutRow {
    /// Writes `out[c] = x[c] * mask[c]`, `mask[c] = keep` or 0, for every column.
    fn apply(self, x: &[f32], out: &mut [MaybeUninit<f32>], mask: &mut [MaybeUninit<f32>]) {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2.
            return unsafe { self.apply_avx2(x, out, mask) };
        }
        self.apply_plain(x, out, mask)
    }

    /// [`DropoutRow::apply`] compiled for AVX2 (the same integer and float operations, so
    /// the same results; the compiler vectorises the loop eight lanes wide).
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn apply_avx2(
        self,
        x: &[f32],
        out: &mut [MaybeUninit<f32>],
        mask: &mut [MaybeUninit<f32>],
    ) {
        self.apply_plain(x, out, mask)
    }

    /// A row's dropout for the row of vertex (or row index) `id` under `key`.
    fn new(key: u64, id: u64, thr: u32, keep: f32) -> Self {
        let seed = fanout_rand::mix_keys(&[key, id]);
        DropoutRow {
            lo: seed as u32,
            hi: (seed >> 32) as u32,
            thr,
            keep,
        }
    }

    /// The mask value of column `c`: `keep` or 0.
    #[inline(always)]
    fn mask(self, c: usize) -> f32 {
        let d = lowbias32(lowbias32(self.lo.wrapping_add(c as u32)) ^ self.hi);
        self.keep * (d >= self.thr) as u32 as f32
    }

    #[inline(always)]
    fn apply_plain(self, x: &[f32], out: &mut [MaybeUninit<f32>], mask: &mut [MaybeUninit<f32>]) {
        for (c, ((o, m), &xv)) in out.iter_mut().zip(mask.iter_mut()).zip(x).enumerate() {
            let mv = self.mask(c);
            m.write(mv);
            o.write(xv * mv);
        }
    }
}

/// The threshold and keep scale of dropout at rate `p` over `rows` rows (see [`dropout`]).
/// Panics unless `0 <= p < 1` and `row_ids`, when given, has an id for every row.
fn dropout_params(p: f32, row_ids: Option<&[u32]>, rows: usize) -> (u32, f32) {
    if let Some(ids) = row_ids {
        assert!(
            ids.len() >= rows,
            "dropout: {} row ids for {rows} rows",
            ids.len()
        );
    }
    crate::backend::dropout_threshold(p)
}

/// See [`crate::Backend::epilogue`]. One pass per row: the element is read once, written
/// once, and its gradient factor written once when kept, where bias, ReLU and dropout in
/// turn read it three times and write it four times (two fresh tensors and a mask).
pub(crate) fn epilogue(
    x: &mut Tensor,
    bias: Option<&Tensor>,
    relu: bool,
    dropout: Option<DropoutSpec<'_>>,
    keep: bool,
) -> Option<Tensor> {
    let (rows, cols) = x.shape();
    if let Some(b) = bias {
        assert_eq!(b.shape(), (1, cols), "epilogue: bias shape");
    }
    let drop = dropout.map(|d| {
        let (thr, keep) = dropout_params(d.p, d.row_ids, rows);
        (d, thr, keep)
    });
    let keep = keep && (relu || drop.is_some());
    let len = rows * cols;
    let mut factor: Vec<f32> = Vec::with_capacity(if keep { len } else { 0 });
    if len > 0 {
        let flags = EpilogueFlags {
            bias: bias.is_some(),
            relu,
            drop: drop.is_some(),
            keep,
        };
        let b = bias.map_or(&[][..], |b| b.data());
        let body = |r: usize, xrow: &mut [f32], frow: &mut [MaybeUninit<f32>]| {
            let row = drop.map(|(d, thr, k)| {
                let id = d.row_ids.map_or(r as u64, |ids| ids[r] as u64);
                DropoutRow::new(d.key, id, thr, k)
            });
            epilogue_row(flags, b, row, xrow, frow);
        };
        let min = (2048 / cols).max(1);
        let xrows = x.data_mut().par_chunks_mut(cols);
        if keep {
            let frows = factor.spare_capacity_mut()[..len].par_chunks_mut(cols);
            xrows
                .zip(frows)
                .enumerate()
                .with_min_len(min)
                .for_each(|(r, (xrow, frow))| body(r, xrow, frow));
        } else {
            xrows
                .enumerate()
                .with_min_len(min)
                .for_each(|(r, xrow)| body(r, xrow, &mut []));
        }
        if keep {
            // SAFETY: the rows cover all `len` elements and `epilogue_row` wrote every
            // element of each row's factor when `keep`.
            unsafe { factor.set_len(len) };
        }
    }
    keep.then(|| Tensor::new(rows, cols, factor))
}

/// Which parts of [`epilogue`] run.
#[derive(Clone, Copy)]
struct EpilogueFlags {
    bias: bool,
    relu: bool,
    drop: bool,
    keep: bool,
}

/// One row of [`epilogue`]: picks the loop compiled for its flags (and for AVX2 where the CPU
/// has it: the same float operations in the same order, so the same results).
fn epilogue_row(
    f: EpilogueFlags,
    bias: &[f32],
    drop: Option<DropoutRow>,
    x: &mut [f32],
    factor: &mut [MaybeUninit<f32>],
) {
    // Unused parts get harmless stand-ins; the loop's constant flags never read them.
    let d = drop.unwrap_or(DropoutRow {
        lo: 0,
        hi: 0,
        thr: 0,
        keep: 1.0,
    });
    macro_rules! dispatch {
        ($($b:literal $r:literal $d:literal $k:literal),*) => {
            match (f.bias, f.relu, f.drop, f.keep) {
                $(($b, $r, $d, $k) => epilogue_loop::<$b, $r, $d, $k>(bias, d, x, factor),)*
            }
        };
    }
    dispatch!(
        false false false false, false false false true, false false true false,
        false false true true, false true false false, false true false true,
        false true true false, false true true true, true false false false,
        true false false true, true false true false, true false true true,
        true true false false, true true false true, true true true false,
        true true true true
    );
}

/// [`epilogue_loop_plain`], built for AVX2 when the CPU has it.
fn epilogue_loop<const B: bool, const R: bool, const D: bool, const K: bool>(
    bias: &[f32],
    drop: DropoutRow,
    x: &mut [f32],
    factor: &mut [MaybeUninit<f32>],
) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2.
        return unsafe { epilogue_loop_avx2::<B, R, D, K>(bias, drop, x, factor) };
    }
    epilogue_loop_plain::<B, R, D, K>(bias, drop, x, factor)
}

/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn epilogue_loop_avx2<const B: bool, const R: bool, const D: bool, const K: bool>(
    bias: &[f32],
    drop: DropoutRow,
    x: &mut [f32],
    factor: &mut [MaybeUninit<f32>],
) {
    epilogue_loop_plain::<B, R, D, K>(bias, drop, x, factor)
}

/// The element operations of [`epilogue`] for one row: bias (`B`), ReLU (`R`), dropout (`D`),
/// the gradient factor written (`K`).
#[inline(always)]
fn epilogue_loop_plain<const B: bool, const R: bool, const D: bool, const K: bool>(
    bias: &[f32],
    drop: DropoutRow,
    x: &mut [f32],
    factor: &mut [MaybeUninit<f32>],
) {
    let n = x.len();
    let bias = if B { &bias[..n] } else { &[][..] };
    let factor = if K { &mut factor[..n] } else { &mut [][..] };
    for c in 0..n {
        // `add_bias` adds `1.0 * b`, which is `b`.
        let z = if B { x[c] + bias[c] } else { x[c] };
        let a = if R { z.max(0.0) } else { z };
        let m = if D { drop.mask(c) } else { 1.0 };
        x[c] = if D { a * m } else { a };
        if K {
            // ReLU's derivative is `z > 0` (`relu_backward` tests its output, which is
            // positive exactly where `z` is).
            factor[c].write(if !R || z > 0.0 { m } else { 0.0 });
        }
    }
}

/// See [`crate::Backend::l2_normalize_rows`].
pub(crate) fn l2_normalize_rows(x: &Tensor) -> (Tensor, Tensor) {
    let mut norms = Tensor::zeros(x.rows(), 1);
    par_rows(norms.data_mut(), 1, |r, n| {
        let s = x.row(r).iter().map(|&v| v as f64 * v as f64).sum::<f64>();
        n[0] = if s > 0.0 { s.sqrt() as f32 } else { 1.0 };
    });
    let mut y = x.clone();
    let cols = x.cols();
    par_rows(y.data_mut(), cols, |r, row| {
        let inv = 1.0 / norms.data()[r];
        row.iter_mut().for_each(|v| *v *= inv);
    });
    (y, norms)
}

/// See [`crate::Backend::l2_normalize_rows_backward`].
pub(crate) fn l2_normalize_rows_backward(grad: &Tensor, y: &Tensor, norms: &Tensor) -> Tensor {
    assert_eq!(
        grad.shape(),
        y.shape(),
        "l2_normalize_rows_backward: shapes"
    );
    assert_eq!(
        norms.shape(),
        (y.rows(), 1),
        "l2_normalize_rows_backward: norms"
    );
    let mut out = Tensor::zeros(y.rows(), y.cols());
    par_rows(out.data_mut(), y.cols(), |r, o| {
        let (g, yr) = (grad.row(r), y.row(r));
        let proj = dot_slice(g, yr);
        let inv = 1.0 / norms.data()[r];
        for c in 0..o.len() {
            o[c] = (g[c] - yr[c] * proj) * inv;
        }
    });
    out
}

fn head_split(x: &Tensor, heads: usize, what: &str) -> usize {
    assert!(
        heads > 0 && x.cols().is_multiple_of(heads),
        "{what}: {} columns do not split into {heads} heads",
        x.cols()
    );
    x.cols() / heads
}

/// See [`crate::Backend::head_dot`].
pub(crate) fn head_dot(x: &Tensor, a: &Tensor) -> Tensor {
    head_dot_prefix(x, a, x.rows())
}

/// See [`crate::Backend::head_dot_prefix`]: the rows are read where they lie.
pub(crate) fn head_dot_prefix(x: &Tensor, a: &Tensor, rows: usize) -> Tensor {
    let (heads, f) = a.shape();
    assert_eq!(x.cols(), heads * f, "head_dot: x width != H * F");
    assert!(rows <= x.rows(), "head_dot: {rows} rows of {}", x.rows());
    let mut out = Tensor::zeros(rows, heads);
    par_rows(out.data_mut(), heads, |n, o| {
        let xr = x.row(n);
        dot_heads(xr, a.data(), o);
    });
    out
}

/// See [`crate::Backend::head_dot_backward`].
pub(crate) fn head_dot_backward(grad: &Tensor, x: &Tensor, a: &Tensor) -> (Tensor, Tensor) {
    // `d x` is the in-place form's sum into zeros.
    let mut gx = Tensor::zeros(x.rows(), x.cols());
    let ga = head_dot_backward_acc(grad, x, a, &mut gx);
    (gx, ga)
}

/// See [`crate::Backend::head_dot_backward_acc`]: each row of `acc` gets its heads' terms
/// (`grad[n, h] * a[h]`) added in place.
pub(crate) fn head_dot_backward_acc(
    grad: &Tensor,
    x: &Tensor,
    a: &Tensor,
    acc: &mut Tensor,
) -> Tensor {
    assert_eq!(
        grad.rows(),
        x.rows(),
        "head_dot_backward_acc: grad rows != x rows"
    );
    head_dot_prefix_backward_acc(grad, x, a, acc)
}

/// See [`crate::Backend::head_dot_prefix_backward_acc`]: the first `grad.rows()` rows of `x`,
/// read where they lie.
pub(crate) fn head_dot_prefix_backward_acc(
    grad: &Tensor,
    x: &Tensor,
    a: &Tensor,
    acc: &mut Tensor,
) -> Tensor {
    let (heads, f) = a.shape();
    let rows = grad.rows();
    assert_eq!(
        x.cols(),
        heads * f,
        "head_dot_backward_acc: x width != H * F"
    );
    assert!(
        grad.cols() == heads && rows <= x.rows(),
        "head_dot_backward_acc: grad {:?} for x {:?}",
        grad.shape(),
        x.shape()
    );
    assert!(
        acc.cols() == x.cols() && acc.rows() >= rows,
        "head_dot_backward_acc: acc {:?} for {rows} rows of x {:?}",
        acc.shape(),
        x.shape()
    );
    let n = rows * x.cols();
    par_rows(&mut acc.data_mut()[..n], heads * f, |r, o| {
        axpy_heads(grad.row(r), a.data(), o);
    });
    head_dot_grad_a(grad, x, heads, f)
}

/// `d a` of [`head_dot_backward`]: `sum_n grad[n, h] x[n, h*F + k]` over `grad`'s rows,
/// accumulated in f64.
fn head_dot_grad_a(grad: &Tensor, x: &Tensor, heads: usize, f: usize) -> Tensor {
    let ga = par_row_reduce(grad.rows(), heads * f, |r0, r1, acc| {
        let (g, xs) = (
            &grad.data()[r0 * heads..r1 * heads],
            &x.data()[r0 * heads * f..r1 * heads * f],
        );
        with_avx2(|| head_dot_grad_a_f64(g, xs, acc, f))
    });
    Tensor::new(heads, f, ga.into_iter().map(|v| v as f32).collect())
}

/// `acc[h * f + k] += (g[n][h] * x[n][h * f + k]) as f64` for each row `n` in order (`g` rows
/// of `acc.len() / f` heads, `x` rows of `acc.len()` values).
#[inline(always)]
fn head_dot_grad_a_f64(g: &[f32], x: &[f32], acc: &mut [f64], f: usize) {
    if acc.is_empty() {
        return;
    }
    let heads = acc.len() / f;
    for (gr, xr) in g.chunks_exact(heads).zip(x.chunks_exact(acc.len())) {
        for ((acc_h, x_h), &gh) in acc.chunks_exact_mut(f).zip(xr.chunks_exact(f)).zip(gr) {
            for (s, &v) in acc_h.iter_mut().zip(x_h) {
                *s += (gh * v) as f64;
            }
        }
    }
}

/// See [`crate::Backend::head_mean`].
pub(crate) fn head_mean(x: &Tensor, heads: usize) -> Tensor {
    let f = head_split(x, heads, "head_mean");
    let mut out = Tensor::zeros(x.rows(), f);
    let inv = 1.0 / heads as f32;
    par_rows(out.data_mut(), f, |n, o| {
        let xr = x.row(n);
        for h in 0..heads {
            axpy_slice(inv, &xr[h * f..(h + 1) * f], o);
        }
    });
    out
}

/// See [`crate::Backend::head_mean_backward`].
pub(crate) fn head_mean_backward(grad: &Tensor, heads: usize) -> Tensor {
    assert!(heads > 0, "head_mean_backward: zero heads");
    let f = grad.cols();
    let mut out = Tensor::zeros(grad.rows(), heads * f);
    let inv = 1.0 / heads as f32;
    par_rows(out.data_mut(), heads * f, |n, o| {
        let g = grad.row(n);
        for h in 0..heads {
            for k in 0..f {
                o[h * f + k] = g[k] * inv;
            }
        }
    });
    out
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// The AVX2 build of a dropout row gives the masks of the plain one (same integers), so
    /// training is reproducible across CPUs.
    #[test]
    fn dropout_masks_are_the_same_with_and_without_avx2() {
        if !is_x86_feature_detected!("avx2") {
            eprintln!("skipped: no AVX2 on this CPU");
            return;
        }
        let x: Vec<f32> = (0..203).map(|i| i as f32 - 50.0).collect();
        let row = DropoutRow {
            lo: 0xDEAD_BEEF,
            hi: 0x1234_5678,
            thr: 1 << 31,
            keep: 2.0,
        };
        let run = |avx2: bool| {
            let mut o = vec![MaybeUninit::uninit(); x.len()];
            let mut m = vec![MaybeUninit::uninit(); x.len()];
            if avx2 {
                // SAFETY: the CPU has AVX2 (checked above).
                unsafe { row.apply_avx2(&x, &mut o, &mut m) };
            } else {
                row.apply_plain(&x, &mut o, &mut m);
            }
            // SAFETY: `apply_*` writes every element.
            let read = |v: Vec<MaybeUninit<f32>>| -> Vec<f32> {
                v.into_iter().map(|e| unsafe { e.assume_init() }).collect()
            };
            (read(o), read(m))
        };
        let plain = run(false);
        assert!(plain.1.contains(&0.0) && plain.1.contains(&2.0));
        assert_eq!(plain, run(true));
    }

    /// The f64 column sums (`sum_rows`, `mul_sum_rows`, GAT's attention-vector gradient) give
    /// the same bits through [`with_avx2`] as the plain loops, on widths that leave a
    /// remainder after full vectors and values whose products round.
    #[test]
    fn f64_column_sums_are_the_same_with_and_without_avx2() {
        let (rows, heads, f) = (37, 7, 29);
        let cols = heads * f;
        let val = |i: usize, salt: u32| {
            let h = lowbias32(i as u32 ^ salt.wrapping_mul(0x9E37_79B9));
            (h as f32 / u32::MAX as f32 - 0.5) * 1e3f32.powi((h % 5) as i32 - 2)
        };
        let x: Vec<f32> = (0..rows * cols).map(|i| val(i, 1)).collect();
        let y: Vec<f32> = (0..rows * cols).map(|i| val(i, 2)).collect();
        let g: Vec<f32> = (0..rows * heads).map(|i| val(i, 3)).collect();
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();

        let (mut plain, mut fast) = (vec![0.0f64; cols], vec![0.0f64; cols]);
        sum_rows_f64(&x, &mut plain);
        with_avx2(|| sum_rows_f64(&x, &mut fast));
        assert_eq!(bits(&plain), bits(&fast), "sum_rows");

        let out = |acc: &mut Vec<f64>, avx2: bool| {
            let mut o = vec![MaybeUninit::uninit(); x.len()];
            if avx2 {
                with_avx2(|| mul_sum_rows_f64(&mut o, acc, &x, &y));
            } else {
                mul_sum_rows_f64(&mut o, acc, &x, &y);
            }
            // SAFETY: `mul_sum_rows_f64` writes every element.
            o.into_iter()
                .map(|e| unsafe { e.assume_init() }.to_bits())
                .collect::<Vec<_>>()
        };
        let (mut plain, mut fast) = (vec![0.0f64; cols], vec![0.0f64; cols]);
        assert_eq!(
            out(&mut plain, false),
            out(&mut fast, true),
            "mul_sum_rows product"
        );
        assert_eq!(bits(&plain), bits(&fast), "mul_sum_rows sums");

        let (mut plain, mut fast) = (vec![0.0f64; cols], vec![0.0f64; cols]);
        head_dot_grad_a_f64(&g, &x, &mut plain, f);
        with_avx2(|| head_dot_grad_a_f64(&g, &x, &mut fast, f));
        assert_eq!(bits(&plain), bits(&fast), "head_dot_grad_a");
        // And the loop is the sum it says, in f64 from f32 products.
        let want: f64 = (0..rows)
            .map(|n| (g[n * heads + 3] * x[n * cols + 3 * f + 5]) as f64)
            .sum();
        assert_eq!(plain[3 * f + 5], want);
    }
}
