//! The row loops of reading features: converting an f16 row to f32, and adding a (scaled) f32
//! or f16 row to an f32 sum.
//!
//! Written by hand because `half`'s slice conversion calls a separate, non-inlined function
//! for every 8 values (most of an f16 gather's time; README, "Features stored as f16"), and
//! converting into a buffer first costs a second pass; here the F16C conversion (8 values per
//! instruction, exact) feeds the copy or the sum directly. The f32 sum is the plain loop
//! compiled for AVX where the CPU has it (the crate is built for baseline x86-64, 4 floats per
//! instruction). Every path computes exactly what the scalar loop does, `y + w * x` with one
//! rounding for the product and one for the sum (no fused multiply-add), so the bits never
//! depend on the CPU.

use half::f16;
use std::mem::MaybeUninit;

/// The row loops chosen once for this CPU (AVX, and F16C, where it has them).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowOps {
    #[cfg(target_arch = "x86_64")]
    avx: bool,
    #[cfg(target_arch = "x86_64")]
    f16c: bool,
}

impl RowOps {
    /// Detects the CPU's features (cached by the standard library after the first call).
    pub(crate) fn new() -> Self {
        #[cfg(target_arch = "x86_64")]
        let avx = std::arch::is_x86_feature_detected!("avx");
        RowOps {
            #[cfg(target_arch = "x86_64")]
            avx,
            #[cfg(target_arch = "x86_64")]
            f16c: avx && std::arch::is_x86_feature_detected!("f16c"),
        }
    }

    /// `y[i] += w * x[i]` (`y[i] += x[i]` without `w`) for every element.
    pub(crate) fn add_f32(self, y: &mut [f32], x: &[f32], w: Option<f32>) {
        assert_eq!(x.len(), y.len(), "f32 row and sum differ in length");
        #[cfg(target_arch = "x86_64")]
        if self.avx {
            // SAFETY: the CPU has AVX (checked in `new`).
            unsafe { x86::add_f32(y, x, w) };
            return;
        }
        add_f32_scalar(y, x, w);
    }

    /// Writes `x` converted to f32 into `out` (the same length), every element.
    pub(crate) fn convert_f16(self, x: &[f16], out: &mut [MaybeUninit<f32>]) {
        assert_eq!(x.len(), out.len(), "f16 row and output differ in length");
        #[cfg(target_arch = "x86_64")]
        if self.f16c {
            // SAFETY: the CPU has F16C and AVX (checked in `new`); lengths checked above.
            unsafe { x86::convert(x, out) };
            return;
        }
        for (o, h) in out.iter_mut().zip(x) {
            o.write(h.to_f32());
        }
    }

    /// `y[i] += w * x[i]` (`y[i] += x[i]` without `w`) for every element, `x` converted to f32.
    pub(crate) fn add_f16(self, y: &mut [f32], x: &[f16], w: Option<f32>) {
        assert_eq!(x.len(), y.len(), "f16 row and sum differ in length");
        #[cfg(target_arch = "x86_64")]
        if self.f16c {
            // SAFETY: the CPU has F16C and AVX (checked in `new`); lengths checked above.
            unsafe { x86::add_f16(y, x, w) };
            return;
        }
        add_f16_scalar(y, x, w);
    }
}

/// The scalar loops every path matches bit for bit.
#[inline(always)]
fn add_f32_scalar(y: &mut [f32], x: &[f32], w: Option<f32>) {
    match w {
        Some(w) => y.iter_mut().zip(x).for_each(|(y, &x)| *y += w * x),
        None => y.iter_mut().zip(x).for_each(|(y, &x)| *y += x),
    }
}

fn add_f16_scalar(y: &mut [f32], x: &[f16], w: Option<f32>) {
    match w {
        Some(w) => y.iter_mut().zip(x).for_each(|(y, x)| *y += w * x.to_f32()),
        None => y.iter_mut().zip(x).for_each(|(y, x)| *y += x.to_f32()),
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{add_f16_scalar, add_f32_scalar, f16, MaybeUninit};
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU must have F16C and AVX; `out.len() == x.len()`.
    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn convert(x: &[f16], out: &mut [MaybeUninit<f32>]) {
        let n = x.len();
        let (xp, op) = (x.as_ptr().cast::<u16>(), out.as_mut_ptr().cast::<f32>());
        let mut i = 0;
        while i + 8 <= n {
            let h = _mm_loadu_si128(xp.add(i).cast());
            _mm256_storeu_ps(op.add(i), _mm256_cvtph_ps(h));
            i += 8;
        }
        for (o, h) in out[i..].iter_mut().zip(&x[i..]) {
            o.write(h.to_f32());
        }
    }

    /// The scalar loop, vectorised by the compiler with AVX's 8-float registers (mul and add
    /// stay separate: Rust never contracts them).
    ///
    /// # Safety
    /// The CPU must have AVX.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn add_f32(y: &mut [f32], x: &[f32], w: Option<f32>) {
        add_f32_scalar(y, x, w)
    }

    /// # Safety
    /// The CPU must have F16C and AVX; `y.len() == x.len()`.
    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn add_f16(y: &mut [f32], x: &[f16], w: Option<f32>) {
        let n = x.len();
        let (xp, yp) = (x.as_ptr().cast::<u16>(), y.as_mut_ptr());
        let mut i = 0;
        match w {
            Some(w) => {
                let wv = _mm256_set1_ps(w);
                while i + 8 <= n {
                    let xv = _mm256_cvtph_ps(_mm_loadu_si128(xp.add(i).cast()));
                    let yv = _mm256_loadu_ps(yp.add(i));
                    _mm256_storeu_ps(yp.add(i), _mm256_add_ps(yv, _mm256_mul_ps(wv, xv)));
                    i += 8;
                }
            }
            None => {
                while i + 8 <= n {
                    let xv = _mm256_cvtph_ps(_mm_loadu_si128(xp.add(i).cast()));
                    let yv = _mm256_loadu_ps(yp.add(i));
                    _mm256_storeu_ps(yp.add(i), _mm256_add_ps(yv, xv));
                    i += 8;
                }
            }
        }
        add_f16_scalar(&mut y[i..], &x[i..], w);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every f16 bit pattern, so NaNs, infinities, subnormals and both zeros are all covered.
    fn all_halves() -> Vec<f16> {
        (0..=u16::MAX).map(f16::from_bits).collect()
    }

    fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    #[test]
    fn converting_gives_to_f32_of_every_value_at_every_length() {
        let x = all_halves();
        let rows = RowOps::new();
        // Lengths around the 8-value step, and all 65,536 values at once.
        for n in [0, 1, 7, 8, 9, 23, 65_536] {
            let mut out = vec![MaybeUninit::new(-1.0f32); n];
            rows.convert_f16(&x[..n], &mut out);
            let got: Vec<f32> = out.iter().map(|o| unsafe { o.assume_init() }).collect();
            let want: Vec<f32> = x[..n].iter().map(|h| h.to_f32()).collect();
            assert!(same_bits(&got, &want), "length {n}");
        }
    }

    #[test]
    fn adding_f16_or_f32_rows_gives_the_scalar_sums_bit_for_bit() {
        // Finite values only (NaN payloads may differ between paths; the sums need not).
        let x: Vec<f16> = all_halves().into_iter().filter(|h| h.is_finite()).collect();
        let rows = RowOps::new();
        let x32: Vec<f32> = x.iter().map(|h| h.to_f32() * 1.1).collect();
        for n in [1, 8, 13, x.len()] {
            for w in [None, Some(0.1f32), Some(-3.7e-3)] {
                let y0: Vec<f32> = (0..n).map(|i| (i as f32 * 0.77).sin() * 100.0).collect();
                let (mut got, mut want) = (y0.clone(), y0.clone());
                // The last n: large negative values at the short lengths.
                let xs = &x[x.len() - n..];
                rows.add_f16(&mut got, xs, w);
                add_f16_scalar(&mut want, xs, w);
                assert!(same_bits(&got, &want), "length {n}, weight {w:?}");
                // f32 rows: every path against the scalar loop.
                let (mut got32, mut want32) = (y0.clone(), y0.clone());
                let xs32 = &x32[x32.len() - n..];
                rows.add_f32(&mut got32, xs32, w);
                add_f32_scalar(&mut want32, xs32, w);
                assert!(same_bits(&got32, &want32), "f32, length {n}, weight {w:?}");
                // And the sum did change (the kernel ran).
                assert!(!same_bits(&got, &y0), "length {n}");
            }
        }
    }
}
