//! Row kernels shared by the CPU kernels: a row scaled and added into another, rows of
//! attention heads, dot products, prefetching a row.
//!
//! This crate is built for baseline x86-64 (the binary must run anywhere), so each loop that
//! runs over wide rows also has a twin compiled for AVX, chosen at run time. The twins do the
//! same operations in the same order (a multiply and an add are never fused; dot products
//! keep eight partial sums in a fixed order), so results do not depend on the CPU.

/// `y[i] += alpha * x[i]` over a slice pair of equal length. Rows of at least
/// [`WIDE_ROW`] floats run the same loop compiled for AVX where the CPU has it (this crate is
/// built for baseline x86-64, 4 floats per instruction); the multiply and the add stay
/// separate (Rust never fuses them), so the bits are the same either way.
#[inline]
pub(crate) fn axpy_slice(alpha: f32, x: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if y.len() >= WIDE_ROW && std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU has AVX (checked just above; the standard library caches it).
        unsafe { avx::axpy(alpha, x, y) };
        return;
    }
    axpy_loop(alpha, x, y);
}

/// `y[i] += x[i]` (AVX for wide rows, as [`axpy_slice`]).
#[inline]
pub(crate) fn add_slice(x: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if y.len() >= WIDE_ROW && std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU has AVX (checked just above).
        unsafe { avx::add(x, y) };
        return;
    }
    add_loop(x, y);
}

/// `y[h f..(h + 1) f] += w[h] * x[h f..(h + 1) f]` for each head `h < w.len()`, where
/// `f = y.len() / w.len()`: an attention layer's row of heads, each scaled by its own
/// coefficient. The bits of one [`axpy_slice`] per head, with one AVX dispatch for the whole
/// row (a head is often only 8-32 floats, too short to pay for a call each).
#[inline]
pub(crate) fn axpy_heads(w: &[f32], x: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if y.len() >= WIDE_ROW && std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU has AVX (checked just above).
        unsafe { avx::axpy_heads(w, x, y) };
        return;
    }
    axpy_heads_loop(w, x, y);
}

/// `o[h] = dot_slice(a[h f..(h + 1) f], b[h f..(h + 1) f])` for each head `h < o.len()`, where
/// `f = a.len() / o.len()` and `b` is as long as `a` (AVX for wide rows, as [`axpy_heads`]).
#[inline]
pub(crate) fn dot_heads(a: &[f32], b: &[f32], o: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if a.len() >= WIDE_ROW && std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU has AVX (checked just above).
        unsafe { avx::dot_heads(a, b, o) };
        return;
    }
    dot_heads_loop(a, b, o);
}

/// Row length from which [`axpy_slice`], [`add_slice`], [`axpy_heads`], [`dot_heads`] and
/// [`dot_f64_slice`] call their AVX loops (shorter rows stay inline).
const WIDE_ROW: usize = 32;

#[inline(always)]
fn axpy_heads_loop(w: &[f32], x: &[f32], y: &mut [f32]) {
    let f = y.len() / w.len().max(1);
    if f == 0 {
        return;
    }
    for ((&a, x), y) in w.iter().zip(x.chunks_exact(f)).zip(y.chunks_exact_mut(f)) {
        axpy_loop(a, x, y);
    }
}

#[inline(always)]
fn dot_heads_loop(a: &[f32], b: &[f32], o: &mut [f32]) {
    dot_heads_with(a, b, o, dot_loop);
}

/// The head split of [`dot_heads`], each head's dot product by `dot`.
#[inline(always)]
fn dot_heads_with(a: &[f32], b: &[f32], o: &mut [f32], dot: impl Fn(&[f32], &[f32]) -> f32) {
    let f = a.len() / o.len().max(1);
    if f == 0 {
        o.fill(0.0);
        return;
    }
    for ((o, a), b) in o.iter_mut().zip(a.chunks_exact(f)).zip(b.chunks_exact(f)) {
        *o = dot(a, b);
    }
}

#[inline(always)]
fn axpy_loop(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += alpha * x;
    }
}

#[inline(always)]
fn add_loop(x: &[f32], y: &mut [f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += x;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx {
    /// # Safety
    /// The CPU must have AVX.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
        super::axpy_loop(alpha, x, y)
    }

    /// # Safety
    /// The CPU must have AVX.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn add(x: &[f32], y: &mut [f32]) {
        super::add_loop(x, y)
    }

    /// # Safety
    /// The CPU must have AVX.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn axpy_heads(w: &[f32], x: &[f32], y: &mut [f32]) {
        super::axpy_heads_loop(w, x, y)
    }

    /// # Safety
    /// The CPU must have AVX.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn dot_heads(a: &[f32], b: &[f32], o: &mut [f32]) {
        // SAFETY: this function's caller guarantees AVX.
        super::dot_heads_with(a, b, o, |a, b| unsafe { dot(a, b) });
    }

    /// [`super::dot_f64_slice`]: partial sums 0-3 and 4-7 in two registers.
    ///
    /// # Safety
    /// The CPU must have AVX.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn dot_f64(a: &[f32], b: &[f32]) -> f64 {
        use super::DOT_LANES;
        use std::arch::x86_64::{
            _mm256_add_pd, _mm256_cvtps_pd, _mm256_mul_pd, _mm256_setzero_pd, _mm256_storeu_pd,
            _mm_loadu_ps,
        };
        let n = a.len().min(b.len());
        let full = n / DOT_LANES * DOT_LANES;
        let (mut lo, mut hi) = (_mm256_setzero_pd(), _mm256_setzero_pd());
        for i in (0..full).step_by(DOT_LANES) {
            // SAFETY: i + 8 <= full <= both lengths: each load reads 4 floats in bounds.
            unsafe {
                let (pa, pb) = (a.as_ptr().add(i), b.as_ptr().add(i));
                let xl = _mm256_cvtps_pd(_mm_loadu_ps(pa));
                let yl = _mm256_cvtps_pd(_mm_loadu_ps(pb));
                let xh = _mm256_cvtps_pd(_mm_loadu_ps(pa.add(4)));
                let yh = _mm256_cvtps_pd(_mm_loadu_ps(pb.add(4)));
                lo = _mm256_add_pd(lo, _mm256_mul_pd(xl, yl));
                hi = _mm256_add_pd(hi, _mm256_mul_pd(xh, yh));
            }
        }
        let mut s = [0.0f64; DOT_LANES];
        // SAFETY: `s` holds 8 doubles.
        unsafe {
            _mm256_storeu_pd(s.as_mut_ptr(), lo);
            _mm256_storeu_pd(s.as_mut_ptr().add(4), hi);
        }
        for (l, (x, y)) in a[full..n].iter().zip(&b[full..n]).enumerate() {
            s[l] += *x as f64 * *y as f64;
        }
        super::dot_lanes_sum(&s)
    }

    /// [`super::dot_slice`] with its eight partial sums in one register (the compiler,
    /// left to the scalar loop, splits them into pairs).
    ///
    /// # Safety
    /// The CPU must have AVX.
    #[target_feature(enable = "avx")]
    #[inline]
    unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        use super::DOT_LANES;
        use std::arch::x86_64::{
            _mm256_add_ps, _mm256_loadu_ps, _mm256_mul_ps, _mm256_setzero_ps, _mm256_storeu_ps,
        };
        let n = a.len().min(b.len());
        let full = n / DOT_LANES * DOT_LANES;
        let mut acc = _mm256_setzero_ps();
        for i in (0..full).step_by(DOT_LANES) {
            // SAFETY: i + 8 <= full <= both lengths, so each load reads 8 floats in bounds.
            let (x, y) = unsafe {
                (
                    _mm256_loadu_ps(a.as_ptr().add(i)),
                    _mm256_loadu_ps(b.as_ptr().add(i)),
                )
            };
            acc = _mm256_add_ps(acc, _mm256_mul_ps(x, y));
        }
        let mut s = [0.0f32; DOT_LANES];
        // SAFETY: `s` holds 8 floats.
        unsafe { _mm256_storeu_ps(s.as_mut_ptr(), acc) };
        for (l, (x, y)) in a[full..n].iter().zip(&b[full..n]).enumerate() {
            s[l] += x * y;
        }
        super::dot_lanes_sum(&s)
    }
}

/// Lanes of [`dot_slice`]'s partial sums.
pub(super) const DOT_LANES: usize = 8;

/// Dot product in f32 over the shorter of the two slices, in a fixed order that does not
/// depend on the CPU: product `i` is added to partial sum `i % 8` (each product rounded, then
/// each sum: never a fused multiply-add), and the eight partial sums are added pairwise,
/// `((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7))`. Eight independent sums vectorise,
/// where a single running sum is a chain of dependent scalar additions; [`dot_heads`]' AVX
/// loop holds them in one register and gives the same bits.
#[inline]
pub(crate) fn dot_slice(a: &[f32], b: &[f32]) -> f32 {
    dot_loop(a, b)
}

#[inline(always)]
fn dot_loop(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut s = [0.0f32; DOT_LANES];
    let (ca, cb) = (a.chunks_exact(DOT_LANES), b.chunks_exact(DOT_LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..DOT_LANES {
            s[l] += x[l] * y[l];
        }
    }
    for (l, (x, y)) in ra.iter().zip(rb).enumerate() {
        s[l] += x * y;
    }
    dot_lanes_sum(&s)
}

/// Dot product accumulated in f64 over the shorter of the two slices, in [`dot_slice`]'s
/// order (product `i`, exact in f64, into partial sum `i % 8`; the eight sums added pairwise),
/// with AVX where the CPU has it (the same bits).
#[inline]
pub(crate) fn dot_f64_slice(a: &[f32], b: &[f32]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if a.len().min(b.len()) >= WIDE_ROW && std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU has AVX (checked just above).
        return unsafe { avx::dot_f64(a, b) };
    }
    dot_f64_loop(a, b)
}

#[inline(always)]
fn dot_f64_loop(a: &[f32], b: &[f32]) -> f64 {
    let n = a.len().min(b.len());
    let mut s = [0.0f64; DOT_LANES];
    for i in 0..n {
        s[i % DOT_LANES] += a[i] as f64 * b[i] as f64;
    }
    dot_lanes_sum(&s)
}

/// The partial sums of [`dot_slice`] (or [`dot_f64_slice`]) added in its order.
#[inline(always)]
pub(super) fn dot_lanes_sum<T: Copy + std::ops::Add<Output = T>>(s: &[T; DOT_LANES]) -> T {
    ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]))
}

/// Edges ahead of the current one whose source rows the sparse kernels prefetch.
pub(crate) const PREFETCH_AHEAD: usize = 6;

/// Asks the CPU to bring `row` into cache (every 64-byte line of it) without waiting.
/// Random rows of a source matrix larger than the caches make aggregation latency-bound
/// (about 200 ns per 400-byte row on one core); prefetching a few edges ahead overlaps those
/// misses. Into L2 (`PREFETCHT1`), as fanout-graph's `Features::prefetch_row` does: a core
/// tracks only a few dozen misses into L1. A hint only: no effect on results, and a no-op
/// off x86-64.
#[inline(always)]
pub(crate) fn prefetch_row(row: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        let p = row.as_ptr().cast::<i8>();
        let bytes = std::mem::size_of_val(row);
        let mut off = 0;
        while off < bytes {
            // SAFETY: a prefetch never faults and reads nothing architecturally; the address
            // is inside `row` anyway.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(p.add(off)) };
            off += 64;
        }
        if bytes > 0 {
            // The last line, when the row does not start on a line boundary.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(p.add(bytes - 1)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = row;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_sums_give_the_scalar_loops_bits_at_every_length() {
        // Lengths on both sides of WIDE_ROW and of the vector widths.
        for n in [1, 7, 31, 32, 33, 64, 100, 257] {
            let x: Vec<f32> = (0..n).map(|i| ((i * 7919) as f32).sin() * 1e3).collect();
            let y0: Vec<f32> = (0..n).map(|i| ((i * 104729) as f32).cos()).collect();
            for alpha in [1.0f32, 0.1, -3.3e-5] {
                let (mut got, mut want) = (y0.clone(), y0.clone());
                axpy_slice(alpha, &x, &mut got);
                // One rounding for the product, one for the sum: never a fused multiply-add.
                for (w, &xi) in want.iter_mut().zip(&x) {
                    let p = alpha * xi;
                    *w += p;
                }
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "axpy, length {n}, alpha {alpha}");
            }
            let (mut got, mut want) = (y0.clone(), y0.clone());
            add_slice(&x, &mut got);
            for (w, &xi) in want.iter_mut().zip(&x) {
                *w += xi;
            }
            assert!(got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }

    fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    #[test]
    fn head_rows_give_one_scalar_loop_per_head() {
        // Head widths below, at and above the vector widths; rows below and above WIDE_ROW.
        for (heads, f) in [(1, 1), (3, 5), (8, 4), (4, 8), (8, 32), (2, 33), (1, 100)] {
            let n = heads * f;
            let x: Vec<f32> = (0..n).map(|i| ((i * 7919) as f32).sin() * 1e3).collect();
            let z: Vec<f32> = (0..n).map(|i| ((i * 31) as f32).cos() * 1e-2).collect();
            let y0: Vec<f32> = (0..n).map(|i| ((i * 104729) as f32).cos()).collect();
            let w: Vec<f32> = (0..heads).map(|h| 0.37 - h as f32 * 0.71).collect();
            let mut got = y0.clone();
            axpy_heads(&w, &x, &mut got);
            let mut want = y0.clone();
            for h in 0..heads {
                for k in h * f..(h + 1) * f {
                    let p = w[h] * x[k];
                    want[k] += p;
                }
            }
            assert!(same_bits(&got, &want), "axpy_heads, {heads} x {f}");
            let mut dots = vec![f32::NAN; heads];
            dot_heads(&x, &z, &mut dots);
            let want: Vec<f32> = (0..heads)
                .map(|h| dot_slice(&x[h * f..(h + 1) * f], &z[h * f..(h + 1) * f]))
                .collect();
            assert!(same_bits(&dots, &want), "dot_heads, {heads} x {f}");
        }
    }

    #[test]
    fn dot_adds_in_eight_lanes_then_pairwise() {
        for n in [0, 1, 7, 8, 9, 31, 32, 33, 100, 1000] {
            // Magnitudes spread over many binades, so another order would round differently.
            let a: Vec<f32> = (0..n)
                .map(|i| ((i * 7919) as f32).sin() * 10f32.powi(i as i32 % 7 - 3))
                .collect();
            let b: Vec<f32> = (0..n).map(|i| ((i * 104729) as f32).cos()).collect();
            let mut s = [0.0f32; 8];
            for i in 0..n {
                let p = a[i] * b[i];
                s[i % 8] += p;
            }
            let want = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
            let got = dot_slice(&a, &b);
            assert_eq!(got.to_bits(), want.to_bits(), "length {n}");
            let exact: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            let scale: f64 = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (*x as f64 * *y as f64).abs())
                .sum();
            assert!(
                (got as f64 - exact).abs() <= 1e-6 * scale.max(1e-30),
                "length {n}"
            );
        }
        // The shorter slice decides the length.
        assert_eq!(dot_slice(&[1.0, 2.0, 3.0], &[4.0, 5.0]), 14.0);
    }

    #[test]
    fn f64_dot_adds_exact_products_in_eight_lanes_then_pairwise() {
        for n in [0, 1, 7, 8, 9, 31, 32, 33, 100, 1000, 4099] {
            let a: Vec<f32> = (0..n)
                .map(|i| ((i * 7919) as f32).sin() * 10f32.powi(i as i32 % 9 - 4))
                .collect();
            let b: Vec<f32> = (0..n).map(|i| ((i * 104729) as f32).cos()).collect();
            let mut s = [0.0f64; 8];
            for i in 0..n {
                s[i % 8] += a[i] as f64 * b[i] as f64;
            }
            let want = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
            assert_eq!(
                dot_f64_slice(&a, &b).to_bits(),
                want.to_bits(),
                "length {n}"
            );
        }
        assert_eq!(dot_f64_slice(&[1.0, 2.0, 3.0], &[4.0, 5.0]), 14.0);
    }
}
