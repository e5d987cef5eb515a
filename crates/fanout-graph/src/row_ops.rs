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

/// Edges ahead of the current one whose rows [`RowOps::sum_f32`] fetches (as the gather does).
const AHEAD: usize = 8;
use std::mem::MaybeUninit;

/// The row loops chosen once for this CPU (AVX, and F16C, where it has them).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowOps {
    #[cfg(target_arch = "x86_64")]
    avx: bool,
    #[cfg(target_arch = "x86_64")]
    f16c: bool,
    #[cfg(target_arch = "x86_64")]
    avx512: bool,
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
            #[cfg(target_arch = "x86_64")]
            avx512: std::arch::is_x86_feature_detected!("avx512f"),
        }
    }

    /// Whether [`RowOps::sum_f32`] runs here (AVX-512F).
    pub(crate) fn sums_in_registers(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            self.avx512
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// Writes into `y` the sum over the edges `e` of `edges`, in order, of
    /// `coeff[e] * row(ids[indices[e]])` (no weight without `coeff`), `row(v)` being
    /// `a[v * d..(v + 1) * d]` for `d = y.len()`: the same bits as zeroing `y` and calling
    /// [`RowOps::add_f32`] for each edge in order. The sums stay in registers across all the
    /// edges, 256 columns at a time, so `y` is written once instead of read and written per
    /// edge. The row [`AHEAD`] edges later (past `edges` too) is fetched into L2 before each
    /// edge, and the id of the one twice as far. Only where [`RowOps::sums_in_registers`];
    /// panics elsewhere, or if an index, id or coefficient is out of range.
    pub(crate) fn sum_f32(
        self,
        y: &mut [MaybeUninit<f32>],
        a: &[f32],
        ids: &[u32],
        indices: &[u32],
        coeff: Option<&[f32]>,
        edges: std::ops::Range<usize>,
    ) {
        assert!(self.sums_in_registers(), "sum_f32 needs AVX-512F");
        assert!(edges.end <= indices.len() && coeff.is_none_or(|c| c.len() >= edges.end));
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has AVX-512F (asserted).
        unsafe {
            x86::sum_f32(y, a, ids, indices, coeff, edges)
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

    /// [`super::RowOps::sum_f32`]: column blocks of up to 256 floats, each summed over every
    /// edge in sixteen (or fewer) AVX-512 registers.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn sum_f32(
        y: &mut [MaybeUninit<f32>],
        a: &[f32],
        ids: &[u32],
        indices: &[u32],
        coeff: Option<&[f32]>,
        edges: std::ops::Range<usize>,
    ) {
        let d = y.len();
        let yp = y.as_mut_ptr().cast::<f32>();
        let e = Edges {
            a,
            ids,
            indices,
            coeff,
            d,
            lo: edges.start,
            hi: edges.end,
        };
        let mut c0 = 0;
        while c0 < d {
            let width = (d - c0).min(256);
            let tail = width % 16;
            let last: __mmask16 = if tail == 0 { 0xffff } else { (1 << tail) - 1 };
            // SAFETY: columns c0..c0 + width lie in `y` and in every row (`Edges::row`); the
            // CPU has AVX-512F (this function's contract).
            unsafe {
                match width.div_ceil(16) {
                    16 => block::<16>(yp, c0, last, &e),
                    15 => block::<15>(yp, c0, last, &e),
                    14 => block::<14>(yp, c0, last, &e),
                    13 => block::<13>(yp, c0, last, &e),
                    12 => block::<12>(yp, c0, last, &e),
                    11 => block::<11>(yp, c0, last, &e),
                    10 => block::<10>(yp, c0, last, &e),
                    9 => block::<9>(yp, c0, last, &e),
                    8 => block::<8>(yp, c0, last, &e),
                    7 => block::<7>(yp, c0, last, &e),
                    6 => block::<6>(yp, c0, last, &e),
                    5 => block::<5>(yp, c0, last, &e),
                    4 => block::<4>(yp, c0, last, &e),
                    3 => block::<3>(yp, c0, last, &e),
                    2 => block::<2>(yp, c0, last, &e),
                    _ => block::<1>(yp, c0, last, &e),
                }
            }
            c0 += width;
        }
    }

    /// The edges of one output row of [`sum_f32`].
    struct Edges<'a> {
        a: &'a [f32],
        ids: &'a [u32],
        indices: &'a [u32],
        coeff: Option<&'a [f32]>,
        d: usize,
        lo: usize,
        hi: usize,
    }

    impl Edges<'_> {
        /// Edge `e`'s row (`d` floats) and weight.
        #[inline(always)]
        fn row(&self, e: usize) -> (&[f32], Option<f32>) {
            let v = self.ids[self.indices[e] as usize] as usize;
            (
                &self.a[v * self.d..(v + 1) * self.d],
                self.coeff.map(|c| c[e]),
            )
        }

        /// Fetches the row [`super::AHEAD`] edges after `e` into L2, and the id of the edge
        /// twice as far into L1; nothing past the indices or the stored rows.
        #[inline(always)]
        fn fetch_ahead(&self, e: usize) {
            if let Some(&later) = self.indices.get(e + 2 * super::AHEAD) {
                // SAFETY: a prefetch never faults and reads nothing architecturally.
                unsafe {
                    _mm_prefetch::<_MM_HINT_T0>(
                        self.ids.as_ptr().wrapping_add(later as usize).cast(),
                    )
                };
            }
            let Some(&ahead) = self.indices.get(e + super::AHEAD) else {
                return;
            };
            let Some(&v) = self.ids.get(ahead as usize) else {
                return;
            };
            let row = (v as usize).saturating_mul(self.d);
            if let Some(r) = self.a.get(row..row.saturating_add(self.d)) {
                let (p, bytes) = (r.as_ptr().cast::<i8>(), 4 * self.d);
                let mut off = 0;
                while off < bytes {
                    // SAFETY: as above; the address is inside the row.
                    unsafe { _mm_prefetch::<_MM_HINT_T1>(p.add(off)) };
                    off += 64;
                }
            }
        }
    }

    /// Columns `c0..c0 + 16 * (V - 1) + popcount(last)` of [`sum_f32`], in `V` registers
    /// (the last one masked by `last`).
    ///
    /// # Safety
    /// AVX-512F; `y` holds the edges' `d` floats; those columns are below `d`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn block<const V: usize>(y: *mut f32, c0: usize, last: __mmask16, e: &Edges<'_>) {
        let mut acc = [_mm512_setzero_ps(); V];
        for i in e.lo..e.hi {
            if c0 == 0 {
                e.fetch_ahead(i);
            }
            let (x, w) = e.row(i);
            let xp = x.as_ptr().add(c0);
            match w {
                Some(w) => {
                    let wv = _mm512_set1_ps(w);
                    for (j, a) in acc.iter_mut().enumerate() {
                        let m = if j + 1 == V { last } else { 0xffff };
                        // SAFETY: masked lanes are not read; the others are below d.
                        let xv = _mm512_maskz_loadu_ps(m, xp.add(16 * j));
                        *a = _mm512_add_ps(*a, _mm512_mul_ps(wv, xv));
                    }
                }
                None => {
                    for (j, a) in acc.iter_mut().enumerate() {
                        let m = if j + 1 == V { last } else { 0xffff };
                        // SAFETY: as above.
                        *a = _mm512_add_ps(*a, _mm512_maskz_loadu_ps(m, xp.add(16 * j)));
                    }
                }
            }
        }
        for (j, a) in acc.iter().enumerate() {
            let m = if j + 1 == V { last } else { 0xffff };
            // SAFETY: masked lanes are not written; the others are below d.
            _mm512_mask_storeu_ps(y.add(c0 + 16 * j), m, *a);
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

    /// The sums kept in registers equal zeroing the row and adding the edges' rows one by one
    /// (`add_f32`), bit for bit, at widths around the 16-float vector and the 256-column
    /// block, with and without weights, reading rows through the id map.
    #[test]
    fn register_sums_equal_the_row_by_row_sums() {
        let rows = RowOps::new();
        if !rows.sums_in_registers() {
            return;
        }
        let mut state = 7u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u32
        };
        for d in [1, 15, 16, 17, 255, 256, 257, 600] {
            let stored = 40;
            let a: Vec<f32> = (0..stored * d)
                .map(|_| (next() % 2001) as f32 / 97.0 - 10.0)
                .collect();
            let ids: Vec<u32> = (0..stored as u32).rev().collect();
            let indices: Vec<u32> = (0..30).map(|_| next() % stored as u32).collect();
            let coeff: Vec<f32> = (0..30).map(|_| (next() % 100) as f32 / 37.0).collect();
            for w in [None, Some(&coeff[..])] {
                for edges in [0..0, 0..1, 3..29, 0..30] {
                    let mut got = vec![MaybeUninit::new(f32::NAN); d];
                    rows.sum_f32(&mut got, &a, &ids, &indices, w, edges.clone());
                    let got: Vec<f32> = got.iter().map(|o| unsafe { o.assume_init() }).collect();
                    let mut want = vec![0.0f32; d];
                    for e in edges.clone() {
                        let v = ids[indices[e] as usize] as usize;
                        add_f32_scalar(&mut want, &a[v * d..(v + 1) * d], w.map(|c| c[e]));
                    }
                    assert!(
                        same_bits(&got, &want),
                        "width {d}, edges {edges:?}, weights {}",
                        w.is_some()
                    );
                }
            }
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
