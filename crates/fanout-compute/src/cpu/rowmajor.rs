//! `C <- alpha A B + beta C` for a tall row-major `A`, reading `A` in place.
//!
//! The layer products `X W` and `G W^T` have a row-major `A` of thousands of rows. Before
//! `matrixmultiply` can multiply it, [`super::gemm`] copies it column-major (its packing reads
//! a row-major `A` element by element), a pass that reads and writes every element of `A`
//! and then `matrixmultiply` packs the copy again. With a narrow `C` (a hidden width of 64,
//! the classes of an output layer) the product does few flops per element of `A` and those
//! two passes weigh: in a GCN epoch at hidden 64 the copy alone took 7% of the CPU; in a
//! GraphSAGE epoch at hidden 256 on AVX-512, the copy and the packing took a tenth.
//! This kernel copies nothing of `A`: its micro-tile is `MR` rows of `C` by `NR` columns
//! ([`Isa`] sets both), and at every step of the inner dimension it broadcasts one element of
//! each of the `MR` rows of `A`, read where they lie, and multiplies it by `NR` contiguous
//! floats of `B`, packed once per product into column panels. The accumulators stay in
//! registers across the whole inner dimension, so each element of `C` is one chain of fused
//! multiply-adds in increasing `k`, then scaled by `alpha` (and `beta C` added): the result
//! depends neither on how the rows are split between threads nor on the vector width. No
//! crate offers a GEMM that reads a row-major `A` without packing it (`matrixmultiply` and
//! `gemm` both pack), hence this hand-written one; it is used up to [`Isa::max_n`] columns,
//! where it was measured faster.

// Off x86-64 `Isa::detect` gives `None` and the kernel is never reached.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code, unused_variables))]

use rayon::prelude::*;
use std::mem::MaybeUninit;

/// The vector instructions a micro-tile is written in: the tile shape follows the register
/// file (16 registers of 8 floats, or 32 of 16).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// AVX2 and FMA: [`MR_AVX2`] rows by [`NR_AVX2`] columns (12 accumulators).
    Avx2,
    /// AVX-512F: [`MR_AVX512`] rows by [`NR_AVX512`] columns (24 accumulators).
    Avx512,
}

/// Rows of an AVX2 micro-tile.
pub(crate) const MR_AVX2: usize = 6;
/// Columns of an AVX2 micro-tile (two 8-float vectors).
pub(crate) const NR_AVX2: usize = 16;
/// Rows of an AVX-512 micro-tile.
pub(crate) const MR_AVX512: usize = 12;
/// Columns of an AVX-512 micro-tile (two 16-float vectors).
pub(crate) const NR_AVX512: usize = 32;

impl Isa {
    /// The best this CPU runs, or `None` (not x86-64, or no AVX2 and FMA).
    pub(crate) fn detect() -> Option<Isa> {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f") {
                return Some(Isa::Avx512);
            }
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                return Some(Isa::Avx2);
            }
        }
        None
    }

    /// True when this CPU runs the instructions.
    #[cfg(test)]
    fn runs_here(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                Isa::Avx512 => is_x86_feature_detected!("avx512f"),
                Isa::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// Rows of a micro-tile.
    fn mr(self) -> usize {
        match self {
            Isa::Avx2 => MR_AVX2,
            Isa::Avx512 => MR_AVX512,
        }
    }

    /// Columns of a micro-tile, the width of `B`'s panels.
    fn nr(self) -> usize {
        match self {
            Isa::Avx2 => NR_AVX2,
            Isa::Avx512 => NR_AVX512,
        }
    }

    /// Widest `C` this kernel computes. The copy it saves costs the same per element of `A`
    /// whatever `n` is, while the product's flops per element of `A` grow with `n`.
    /// AVX2: on the 2-core Zen 3 VM (two threads, `m` 1,024 to 80,000, `k` 64 to 4,096) it
    /// was 1.08-1.7x faster than the transpose and `matrixmultiply` for `n` of 47 to 128 in
    /// every run, and between 0.8x and 1.15x, with no consistent gain, for `n` of 256 and 512.
    /// AVX-512: see [`MAX_N_AVX512`].
    pub(crate) fn max_n(self) -> usize {
        match self {
            Isa::Avx2 => 128,
            Isa::Avx512 => MAX_N_AVX512,
        }
    }
}

/// Widest `C` the AVX-512 kernel computes: no limit. On the 2-core Sapphire Rapids VM
/// (`examples/gemm_speed.rs`, one and two threads, `B` plain and transposed) it was faster
/// than the transpose and `matrixmultiply`'s AVX-512 kernel for every shape measured, `n`
/// from 47 to 1,024 and `k` from 64 to 4,096 (docs/performance.md, stop 46).
pub(crate) const MAX_N_AVX512: usize = usize::MAX;

/// Rows of `C` per pass over the panels of `B`: each panel (`k x NR`) is reused by this many
/// rows while it is in L1 (or L2, for a long `k`), and the rows of `A` (`ROW_CHUNK x k`) stay
/// in L2 across panels. A multiple of both micro-tiles' heights.
const ROW_CHUNK: usize = 96;

/// `op(B)` (`k x n`) packed into `ceil(n / nr)` panels of `k x nr` floats, row by row, the
/// columns past `n` zero, for the micro-tiles of one [`Isa`].
pub(crate) struct PackedB {
    isa: Isa,
    k: usize,
    n: usize,
    data: Vec<f32>,
}

impl PackedB {
    /// Packs the `k x n` matrix whose element `(i, j)` is `b[i * rs + j * cs]` for `isa`'s
    /// micro-tiles. Panels are packed in parallel on the current rayon pool once `B` holds
    /// [`PARALLEL_PACK_MIN`] floats (a 1024 x 1024 `B` took a fifth of a 1024-row product's
    /// time packed on one thread), reading rows of a row-major `B` and columns of a
    /// transposed one contiguously.
    pub(crate) fn new(isa: Isa, b: &[f32], rs: usize, cs: usize, k: usize, n: usize) -> PackedB {
        let nr = isa.nr();
        let panels = n.div_ceil(nr);
        let mut data = vec![0.0f32; panels * k * nr];
        let pack = |(p, panel): (usize, &mut [f32])| {
            let j0 = p * nr;
            let w = nr.min(n - j0);
            if cs == 1 {
                for (i, row) in panel.chunks_exact_mut(nr).enumerate() {
                    row[..w].copy_from_slice(&b[i * rs + j0..i * rs + j0 + w]);
                }
            } else {
                for jj in 0..w {
                    let col = (j0 + jj) * cs;
                    for i in 0..k {
                        panel[i * nr + jj] = b[i * rs + col];
                    }
                }
            }
        };
        if k * n >= PARALLEL_PACK_MIN {
            data.par_chunks_exact_mut(k * nr).enumerate().for_each(pack);
        } else {
            data.chunks_exact_mut(k * nr).enumerate().for_each(pack);
        }
        PackedB { isa, k, n, data }
    }
}

/// `B`s of at least this many floats are packed in parallel.
const PARALLEL_PACK_MIN: usize = 1 << 16;

/// Rows `row0..row0 + c.len() / n` of `C <- alpha A B + beta C`, with `A` row-major (`k`
/// columns, `a` holding all its rows) and `B` packed. `c` is those rows of `C`, row-major;
/// it is read only when `beta != 0`. Every element of `C` is one chain of fused multiply-adds
/// in increasing `k` from zero, then scaled, whichever [`Isa`] `B` was packed for: both
/// kernels give the same bits.
///
/// # Safety
/// `b`'s [`Isa`] must run on this CPU (as the one [`Isa::detect`] gives does); `a` must
/// hold rows `row0..row0 + rows` of `k` floats; `c.len()` must be a multiple of `b.n`; when
/// `beta != 0`, `c` must be initialised.
pub(crate) unsafe fn gemm_rows(
    alpha: f32,
    a: &[f32],
    row0: usize,
    b: &PackedB,
    beta: f32,
    c: &mut [MaybeUninit<f32>],
) {
    let (k, n) = (b.k, b.n);
    let rows = c.len() / n;
    assert!(c.len() == rows * n && a.len() >= (row0 + rows) * k);
    // SAFETY: A's rows row0..row0 + rows lie in `a` (asserted), k floats apart; C's rows are
    // `c`'s, n floats apart; the rest is this function's contract.
    unsafe {
        gemm_rows_strided(
            alpha,
            a.as_ptr().add(row0 * k),
            k,
            rows,
            b,
            beta,
            c.as_mut_ptr().cast::<f32>(),
            n,
        )
    }
}

/// [`gemm_rows`] on strided rows: `rows` rows of `C <- alpha A B + beta C`, row `i` of `A`
/// at `a + i * lda` (`b.k` floats) and row `i` of `C` at `c + i * ldc` (`b.n` floats), so
/// `A` and `C` may be column blocks of wider matrices. The same bits as [`gemm_rows`].
///
/// # Safety
/// `b`'s [`Isa`] must run on this CPU; the rows must lie in their allocations, `C`'s written
/// by no one else meanwhile and initialised when `beta != 0`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_rows_strided(
    alpha: f32,
    a: *const f32,
    lda: usize,
    rows: usize,
    b: &PackedB,
    beta: f32,
    c: *mut f32,
    ldc: usize,
) {
    let k = b.k;
    let (mr_max, nr) = (b.isa.mr(), b.isa.nr());
    #[cfg(target_arch = "x86_64")]
    for r0 in (0..rows).step_by(ROW_CHUNK) {
        let chunk = ROW_CHUNK.min(rows - r0);
        for (p, panel) in b.data.chunks_exact(k * nr).enumerate() {
            let j0 = p * nr;
            let w = nr.min(b.n - j0);
            let mut i = 0;
            while i < chunk {
                let mr = mr_max.min(chunk - i);
                // SAFETY: rows r0+i..r0+i+mr of A and C exist (the contract); the panel has k
                // rows of nr floats; the tile writes columns j0..j0+w < n of those rows of C,
                // read only when beta != 0; the CPU runs the panel's Isa.
                unsafe {
                    let a_at = a.add((r0 + i) * lda);
                    let c_at = c.add((r0 + i) * ldc + j0);
                    let b_at = panel.as_ptr();
                    let none = &mut LineFetch::none();
                    match b.isa {
                        Isa::Avx2 => x86::tile_avx2::<0>(
                            mr, k, a_at, lda, b_at, alpha, beta, c_at, ldc, w, none,
                        ),
                        Isa::Avx512 => x86::tile_avx512::<0>(
                            mr, k, a_at, lda, b_at, alpha, beta, c_at, ldc, w, none,
                        ),
                    }
                }
                i += mr;
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (alpha, a, lda, rows, beta, c, ldc, mr_max, nr, k);
        unreachable!("gemm_rows is only called where an Isa runs (x86-64)")
    }
}

/// Stored rows fetched into L2 one at a time from inside a micro-tile's inner loop
/// ([`gemm_rows_sourced`]): the rows the next rows of `A` will be made from. Spread over the
/// arithmetic, the fetches overlap it; issued all at once, they would fill the core's queue
/// of outstanding misses and stall it.
pub(crate) struct LineFetch<'a> {
    /// Start addresses of the rows still to fetch.
    rows: &'a [usize],
    /// Bytes of each row.
    bytes: usize,
}

impl<'a> LineFetch<'a> {
    /// Every line of rows `rows` (start addresses), `bytes` each.
    pub(crate) fn new(rows: &'a [usize], bytes: usize) -> Self {
        LineFetch { rows, bytes }
    }

    /// Nothing to fetch.
    pub(crate) fn none() -> LineFetch<'static> {
        LineFetch::new(&[], 0)
    }

    /// Prefetches every line of the next row, if any is left.
    #[inline(always)]
    fn next(&mut self) {
        let Some((&row, rest)) = self.rows.split_first() else {
            return;
        };
        self.rows = rest;
        let (mut at, end) = (row & !63, row.saturating_add(self.bytes));
        while at < end {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a prefetch reads nothing architecturally and never faults, whatever the
            // address.
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
                _mm_prefetch::<_MM_HINT_T1>(at as *const i8);
            }
            at += 64;
        }
    }
}

/// Steps of the inner dimension per stored row [`gemm_rows_sourced`] prefetches (all its
/// lines at once, a burst the miss queue absorbs). At a width of 256 into a hidden width of
/// 256 a step is 24 fused multiply-adds on AVX-512, and the next 12 rows read about 300
/// stored rows over 2,048 steps: one row every 4 steps fetches them all by two thirds of the
/// way. On products 256 (GraphSAGE, two Zen 4 cores) an epoch took 0.23 s with 4, 6 or 8,
/// 0.245 with 2, and 0.26 with the aggregate made whole by the loader. The first version,
/// which fetched 4 lines every step through a cursor that stepped across rows, took 0.25 in
/// one build and 0.29 in another that should have been the same: the per-step bookkeeping
/// in the hottest loop is the likely reason.
const STEPS_PER_ROW_AVX512: usize = 4;
/// As [`STEPS_PER_ROW_AVX512`] for the AVX2 tile, whose steps are half as long.
const STEPS_PER_ROW_AVX2: usize = 8;

/// Stored bytes a chunk of rows may read for [`gemm_rows_sourced`] to be worth it: the
/// fetched lines must still be in L2 (1-2 MiB a core on current x86 servers) when the next
/// chunk is made, beside `B`'s panels.
pub(crate) const SOURCED_CHUNK_BYTES: usize = 512 << 10;

/// Whether [`gemm_rows_sourced`] runs here and suits `src`: the CPU runs an [`Isa`] and the
/// stored rows of one micro-tile's rows fit in [`SOURCED_CHUNK_BYTES`] on average.
pub(crate) fn sourced_suits(src: &dyn crate::RowSource) -> Option<Isa> {
    let isa = Isa::detect()?;
    let rows = src.rows().max(1);
    let bytes = (src.stored_reads() as u128 * src.stored_row_bytes() as u128 * isa.mr() as u128)
        .div_ceil(rows as u128);
    (bytes <= SOURCED_CHUNK_BYTES as u128).then_some(isa)
}

/// Rows `row0..row0 + rows` of `C <- A B + beta C`, the rows of `A` made by `src` a
/// micro-tile's height at a time and written to `a_out` (row `i` at `a_out + i * k`) just
/// before they are multiplied, while the stored rows of the next micro-tile's rows are
/// prefetched from the tile's inner loop ([`LineFetch`]). Each element of `C` is the chain of
/// [`gemm_rows`] (alpha 1): the same bits as making all of `A` first and calling it.
///
/// Only the one product: with a second one in the same loop (GraphSAGE's self product, for
/// twice the arithmetic to hide the fetching behind) each micro-tile's rows read both
/// packed weights, which with the fetched rows overflowed L2, and a products-256 epoch took
/// 0.36 s against 0.27.
///
/// # Safety
/// `b`'s [`Isa`] must run on this CPU; `src` must have `b.k` columns and at least
/// `row0 + rows` rows; `a_out` and `c` must hold those rows (`k` and `b.n` floats each),
/// written by no one else meanwhile; `c` must be initialised when `beta != 0`.
pub(crate) unsafe fn gemm_rows_sourced(
    src: &dyn crate::RowSource,
    row0: usize,
    rows: usize,
    b: &PackedB,
    beta: f32,
    c: *mut f32,
    a_out: *mut f32,
) {
    let (k, n) = (b.k, b.n);
    let (mr, nr) = (b.isa.mr(), b.isa.nr());
    let end = row0 + rows;
    let mut next = Vec::new();
    let mut r0 = row0;
    while r0 < end {
        let r1 = (r0 + mr).min(end);
        // SAFETY: rows r0..r1 of A lie in `a_out` (the contract), k floats each; `fill`
        // writes every one of them before the tiles read them.
        let a_rows = unsafe {
            std::slice::from_raw_parts_mut(
                a_out.add(r0 * k).cast::<MaybeUninit<f32>>(),
                (r1 - r0) * k,
            )
        };
        src.fill(r0..r1, a_rows);
        next.clear();
        src.stored_rows(r1..(r1 + mr).min(end), &mut next);
        let mut fetch = LineFetch::new(&next, src.stored_row_bytes());
        #[cfg(target_arch = "x86_64")]
        for (p, panel) in b.data.chunks_exact(k * nr).enumerate() {
            let j0 = p * nr;
            let w = nr.min(n - j0);
            // SAFETY: the tile reads rows r0..r1 of A (just written) and the panel's k rows
            // of nr floats, and writes columns j0..j0 + w < n of C's rows r0..r1 (read only
            // when beta != 0); the CPU runs the panel's Isa.
            unsafe {
                let (a_at, c_at) = (a_out.add(r0 * k), c.add(r0 * n + j0));
                let b_at = panel.as_ptr();
                match b.isa {
                    Isa::Avx2 => x86::tile_avx2::<STEPS_PER_ROW_AVX2>(
                        r1 - r0,
                        k,
                        a_at,
                        k,
                        b_at,
                        1.0,
                        beta,
                        c_at,
                        n,
                        w,
                        &mut fetch,
                    ),
                    Isa::Avx512 => x86::tile_avx512::<STEPS_PER_ROW_AVX512>(
                        r1 - r0,
                        k,
                        a_at,
                        k,
                        b_at,
                        1.0,
                        beta,
                        c_at,
                        n,
                        w,
                        &mut fetch,
                    ),
                }
            }
        }
        r0 = r1;
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (nr, c);
        unreachable!("gemm_rows_sourced is only called where an Isa runs (x86-64)")
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{LineFetch, MR_AVX2, MR_AVX512, NR_AVX2 as NR, NR_AVX512};

    /// One `rows x NR_AVX2` tile of `C` (`rows <= MR_AVX2`); see [`tile`].
    ///
    /// # Safety
    /// As [`tile`].
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn tile_avx2<const PF: usize>(
        rows: usize,
        k: usize,
        a: *const f32,
        lda: usize,
        b: *const f32,
        alpha: f32,
        beta: f32,
        c: *mut f32,
        ldc: usize,
        w: usize,
        fetch: &mut LineFetch<'_>,
    ) {
        debug_assert!((1..=MR_AVX2).contains(&rows));
        // SAFETY: forwarded contract.
        unsafe {
            match rows {
                6 => tile::<6, PF>(k, a, lda, b, alpha, beta, c, ldc, w, fetch),
                5 => tile::<5, PF>(k, a, lda, b, alpha, beta, c, ldc, w, fetch),
                4 => tile::<4, PF>(k, a, lda, b, alpha, beta, c, ldc, w, fetch),
                3 => tile::<3, PF>(k, a, lda, b, alpha, beta, c, ldc, w, fetch),
                2 => tile::<2, PF>(k, a, lda, b, alpha, beta, c, ldc, w, fetch),
                _ => tile::<1, PF>(k, a, lda, b, alpha, beta, c, ldc, w, fetch),
            }
        }
    }

    /// One `rows x NR_AVX512` tile of `C` (`rows <= MR_AVX512`); see [`tile512`].
    ///
    /// # Safety
    /// As [`tile512`].
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn tile_avx512<const PF: usize>(
        rows: usize,
        k: usize,
        a: *const f32,
        lda: usize,
        b: *const f32,
        alpha: f32,
        beta: f32,
        c: *mut f32,
        ldc: usize,
        w: usize,
        fetch: &mut LineFetch<'_>,
    ) {
        debug_assert!((1..=MR_AVX512).contains(&rows));
        // SAFETY: forwarded contract.
        unsafe {
            match rows {
                12 => tile512::<12, PF>(k, a, lda, b, alpha, beta, c, ldc, w, fetch),
                11 => tile512::<11, PF>(k, a, lda, b, alpha, beta, c, ldc, w, fetch),
                10 => tile512::<10, PF>(k, a, lda, b, alpha, beta, c, ldc, w, fetch),
                9 => tile512::<9, PF>(k, a, lda, b, alpha, beta, c, ldc, w, fetch),
                8 => tile512::<8, PF>(k, a, lda, b, alpha, beta, c, ldc, w, fetch),
                7 => tile512::<7, PF>(k, a, lda, b, alpha, beta, c, ldc, w, fetch),
                6 => tile512::<6, PF>(k, a, lda, b, alpha, beta, c, ldc, w, fetch),
                5 => tile512::<5, PF>(k, a, lda, b, alpha, beta, c, ldc, w, fetch),
                4 => tile512::<4, PF>(k, a, lda, b, alpha, beta, c, ldc, w, fetch),
                3 => tile512::<3, PF>(k, a, lda, b, alpha, beta, c, ldc, w, fetch),
                2 => tile512::<2, PF>(k, a, lda, b, alpha, beta, c, ldc, w, fetch),
                _ => tile512::<1, PF>(k, a, lda, b, alpha, beta, c, ldc, w, fetch),
            }
        }
    }

    /// One `R x NR_AVX512` tile of `C` (`R <= MR_AVX512`): rows of `A` from `a` (row stride
    /// `lda`), the panel of `B` from `b` (`k x NR_AVX512`), `C` at `c` (row stride `ldc`),
    /// `w <= NR_AVX512` columns. Each element is the chain of fused multiply-adds of the
    /// AVX2 [`tile`], so the two give the same bits.
    ///
    /// # Safety
    /// The CPU has AVX-512F; the pointers address the extents above; `c` is initialised
    /// when `beta != 0`.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile512<const R: usize, const PF: usize>(
        k: usize,
        a: *const f32,
        lda: usize,
        b: *const f32,
        alpha: f32,
        beta: f32,
        c: *mut f32,
        ldc: usize,
        w: usize,
        fetch: &mut LineFetch<'_>,
    ) {
        let mut lo = [_mm512_setzero_ps(); R];
        let mut hi = [_mm512_setzero_ps(); R];
        for kk in 0..k {
            // SAFETY: kk < k, so the panel row and each A element are inside their extents.
            unsafe {
                let b0 = _mm512_loadu_ps(b.add(kk * NR_AVX512));
                let b1 = _mm512_loadu_ps(b.add(kk * NR_AVX512 + 16));
                for r in 0..R {
                    let x = _mm512_set1_ps(*a.add(r * lda + kk));
                    lo[r] = _mm512_fmadd_ps(x, b0, lo[r]);
                    hi[r] = _mm512_fmadd_ps(x, b1, hi[r]);
                }
            }
            // Every PF steps (never with PF 0), one row of `fetch`.
            if PF > 0 && kk % PF.max(1) == 0 {
                fetch.next();
            }
        }
        let va = _mm512_set1_ps(alpha);
        let vb = _mm512_set1_ps(beta);
        // Lanes of the two vectors inside the tile's w columns.
        let m_lo: __mmask16 = if w >= 16 { 0xffff } else { (1u16 << w) - 1 };
        let m_hi: __mmask16 = if w >= 32 {
            0xffff
        } else if w > 16 {
            (1u16 << (w - 16)) - 1
        } else {
            0
        };
        for r in 0..R {
            // SAFETY: row r of the tile has w valid columns at c + r * ldc; the masked loads
            // and stores touch only lanes below w, and the second vector's address is formed
            // only when it has such lanes (w > 16), so it stays inside C.
            unsafe {
                let out = c.add(r * ldc);
                let mut x0 = _mm512_mul_ps(lo[r], va);
                if beta != 0.0 {
                    x0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m_lo, out), vb, x0);
                }
                _mm512_mask_storeu_ps(out, m_lo, x0);
                if m_hi != 0 {
                    let (out, mut x1) = (out.add(16), _mm512_mul_ps(hi[r], va));
                    if beta != 0.0 {
                        x1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m_hi, out), vb, x1);
                    }
                    _mm512_mask_storeu_ps(out, m_hi, x1);
                }
            }
        }
    }

    /// One `R x NR` tile of `C` (`R <= MR`): rows of `A` from `a` (row stride `lda`), the
    /// panel of `B` from `b` (`k x NR`), `C` at `c` (row stride `ldc`), `w <= NR` columns.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; the pointers address the extents above; `c` is initialised
    /// when `beta != 0`.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const R: usize, const PF: usize>(
        k: usize,
        a: *const f32,
        lda: usize,
        b: *const f32,
        alpha: f32,
        beta: f32,
        c: *mut f32,
        ldc: usize,
        w: usize,
        fetch: &mut LineFetch<'_>,
    ) {
        let mut lo = [_mm256_setzero_ps(); R];
        let mut hi = [_mm256_setzero_ps(); R];
        for kk in 0..k {
            // SAFETY: kk < k, so the panel row and each A element are inside their extents.
            unsafe {
                let b0 = _mm256_loadu_ps(b.add(kk * NR));
                let b1 = _mm256_loadu_ps(b.add(kk * NR + 8));
                for r in 0..R {
                    let x = _mm256_broadcast_ss(&*a.add(r * lda + kk));
                    lo[r] = _mm256_fmadd_ps(x, b0, lo[r]);
                    hi[r] = _mm256_fmadd_ps(x, b1, hi[r]);
                }
            }
            // Every PF steps (never with PF 0), one row of `fetch`.
            if PF > 0 && kk % PF.max(1) == 0 {
                fetch.next();
            }
        }
        let va = _mm256_set1_ps(alpha);
        let vb = _mm256_set1_ps(beta);
        for r in 0..R {
            // SAFETY: row r of the tile has w valid columns at c + r * ldc.
            unsafe {
                let out = c.add(r * ldc);
                if w == NR {
                    let (mut x0, mut x1) = (_mm256_mul_ps(lo[r], va), _mm256_mul_ps(hi[r], va));
                    if beta != 0.0 {
                        x0 = _mm256_fmadd_ps(_mm256_loadu_ps(out), vb, x0);
                        x1 = _mm256_fmadd_ps(_mm256_loadu_ps(out.add(8)), vb, x1);
                    }
                    _mm256_storeu_ps(out, x0);
                    _mm256_storeu_ps(out.add(8), x1);
                } else {
                    let mut t = [0.0f32; NR];
                    _mm256_storeu_ps(t.as_mut_ptr(), _mm256_mul_ps(lo[r], va));
                    _mm256_storeu_ps(t.as_mut_ptr().add(8), _mm256_mul_ps(hi[r], va));
                    for (j, v) in t[..w].iter().enumerate() {
                        let o = out.add(j);
                        *o = if beta != 0.0 {
                            beta.mul_add(*o, *v)
                        } else {
                            *v
                        };
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `C <- alpha A B + beta C` through [`gemm_rows`] with `isa`'s tiles, all rows at once;
    /// `b` is `B` row-major (`k x n`), or `B^T` row-major (`n x k`) when `transposed`.
    #[allow(clippy::too_many_arguments)]
    fn product(
        isa: Isa,
        a: &[f32],
        b: &[f32],
        transposed: bool,
        c: &[f32],
        k: usize,
        n: usize,
        beta: f32,
    ) -> Vec<f32> {
        let (rs, cs) = if transposed { (1, k) } else { (n, 1) };
        let packed = PackedB::new(isa, b, rs, cs, k, n);
        let mut out: Vec<MaybeUninit<f32>> = c.iter().map(|&x| MaybeUninit::new(x)).collect();
        // SAFETY: the test runs `isa` only where the CPU has it; `a` holds `c.len() / n`
        // rows of `k` floats; `out` is initialised.
        unsafe { gemm_rows(0.75, a, 0, &packed, beta, &mut out) };
        // SAFETY: every element was initialised above and is only overwritten.
        out.into_iter()
            .map(|x| unsafe { x.assume_init() })
            .collect()
    }

    /// Rows `r` made as `r`-dependent values (any function of the row will do), naming
    /// stored rows in a buffer of their own.
    struct Made {
        rows: usize,
        cols: usize,
        stored: Vec<f32>,
    }

    impl crate::RowSource for Made {
        fn rows(&self) -> usize {
            self.rows
        }
        fn cols(&self) -> usize {
            self.cols
        }
        fn fill(&self, rows: std::ops::Range<usize>, out: &mut [MaybeUninit<f32>]) {
            for (i, o) in out.iter_mut().enumerate() {
                let (r, j) = (rows.start + i / self.cols, i % self.cols);
                o.write(((r * 31 + j * 7) % 29) as f32 / 13.0 - 1.0);
            }
        }
        fn stored_rows(&self, rows: std::ops::Range<usize>, out: &mut Vec<usize>) {
            let base = self.stored.as_ptr() as usize;
            out.extend(rows.map(|r| base + 4 * (r % 8) * self.cols));
        }
        fn stored_row_bytes(&self) -> usize {
            4 * self.cols
        }
        fn stored_reads(&self) -> usize {
            self.rows
        }
    }

    /// Both tiles, fetching as they go, give the bits of the plain product on the made rows,
    /// and make every row of `A`, over rows and widths that leave partial tiles and panels.
    #[test]
    fn sourced_rows_give_the_plain_products_bits_with_both_tiles() {
        for isa in [Isa::Avx2, Isa::Avx512]
            .into_iter()
            .filter(|i| i.runs_here())
        {
            for (m, k, n) in [(1, 8, 3), (13, 40, 47), (29, 256, 64), (50, 17, 100)] {
                let src = Made {
                    rows: m,
                    cols: k,
                    stored: vec![0.5; 8 * k],
                };
                let mut a = vec![MaybeUninit::new(0.0f32); m * k];
                crate::RowSource::fill(&src, 0..m, &mut a);
                // SAFETY: `fill` wrote every element.
                let a: Vec<f32> = a.into_iter().map(|x| unsafe { x.assume_init() }).collect();
                let b: Vec<f32> = (0..k * n)
                    .map(|i| ((i * 5) % 17) as f32 / 7.0 - 1.0)
                    .collect();
                let c0: Vec<f32> = (0..m * n).map(|i| (i % 11) as f32 / 3.0).collect();
                let packed = PackedB::new(isa, &b, n, 1, k, n);
                for beta in [0.0, 1.0] {
                    let mut want: Vec<MaybeUninit<f32>> =
                        c0.iter().map(|&x| MaybeUninit::new(x)).collect();
                    // SAFETY: `isa` runs here; `a` holds m rows of k; `want` is initialised.
                    unsafe { gemm_rows(1.0, &a, 0, &packed, beta, &mut want) };
                    let (mut c, mut made) = (c0.clone(), vec![f32::NAN; m * k]);
                    // SAFETY: `isa` runs here; `src` has m rows of k; `made` and `c` hold m
                    // rows, `c` initialised.
                    unsafe {
                        gemm_rows_sourced(
                            &src,
                            0,
                            m,
                            &packed,
                            beta,
                            c.as_mut_ptr(),
                            made.as_mut_ptr(),
                        )
                    };
                    let same = |x: &[f32], y: &[f32]| {
                        x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
                    };
                    // SAFETY: `gemm_rows` wrote or kept every element.
                    let want: Vec<f32> = want
                        .into_iter()
                        .map(|x| unsafe { x.assume_init() })
                        .collect();
                    assert!(same(&made, &a), "{isa:?} {m} x {k}: A");
                    assert!(same(&c, &want), "{isa:?} {m} x {k} x {n}, beta {beta}: C");
                }
            }
        }
    }

    #[test]
    fn both_tiles_give_the_bits_of_one_fused_chain_per_element() {
        // Each element must be the chain fma(a_ik, b_kj, acc) for k = 0, 1, ... from zero,
        // times alpha, plus beta C (fused): computed here in scalar code. Rows that leave
        // every remainder of both tile heights (1..11) and of ROW_CHUNK, widths that leave
        // partial panels of both widths (masked lanes in the AVX-512 tile), and B's that are
        // packed in parallel (k * n from 65,536 floats). B is given plain and transposed (the
        // two packing loops), and with beta = 0 C holds NaNs, which must not be read.
        let isas: Vec<Isa> = [Isa::Avx2, Isa::Avx512]
            .into_iter()
            .filter(|i| i.runs_here())
            .collect();
        if isas.is_empty() {
            eprintln!("no AVX2 or AVX-512 on this CPU: nothing to test");
            return;
        }
        let mut seed = 0x9e37_79b9_u32;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed % 2001) as f32 / 1000.0 - 1.0
        };
        for (m, k, n) in [
            (107, 19, 47),
            (12, 8, 32),
            (13, 33, 17),
            (203, 64, 96),
            (11, 5, 1),
            (97, 40, 63),
            (30, 300, 250),
            (5, 2048, 33),
        ] {
            let a: Vec<f32> = (0..m * k).map(|_| next()).collect();
            let b: Vec<f32> = (0..k * n).map(|_| next()).collect();
            let bt: Vec<f32> = (0..n * k).map(|e| b[(e % k) * n + e / k]).collect();
            let c0: Vec<f32> = (0..m * n).map(|_| next()).collect();
            for beta in [0.0f32, 1.5] {
                let c = if beta == 0.0 {
                    vec![f32::NAN; m * n]
                } else {
                    c0.clone()
                };
                let want: Vec<f32> = (0..m * n)
                    .map(|e| {
                        let (i, j) = (e / n, e % n);
                        let acc =
                            (0..k).fold(0.0f32, |acc, p| a[i * k + p].mul_add(b[p * n + j], acc));
                        if beta == 0.0 {
                            acc * 0.75
                        } else {
                            beta.mul_add(c[e], acc * 0.75)
                        }
                    })
                    .collect();
                for &isa in &isas {
                    for (bb, transposed) in [(&b, false), (&bt, true)] {
                        let got = product(isa, &a, bb, transposed, &c, k, n, beta);
                        let bad = (0..m * n).find(|&e| got[e].to_bits() != want[e].to_bits());
                        assert!(
                            bad.is_none(),
                            "{isa:?} {m}x{k}x{n} beta {beta} B^T {transposed}: element {bad:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn strided_rows_give_the_bits_of_the_copied_block() {
        // A and C as column blocks of wider matrices (a GAT head's block): the same bits as
        // the contiguous copy through `gemm_rows`, columns outside the block untouched.
        let isas: Vec<Isa> = [Isa::Avx2, Isa::Avx512]
            .into_iter()
            .filter(|i| i.runs_here())
            .collect();
        let (m, k, n, lda, ldc, a0, c0) = (131, 37, 45, 100, 70, 21, 9);
        let val = |e: usize| ((e * 7919 % 2003) as f32 / 1000.0 - 1.0) * 0.5;
        let wide_a: Vec<f32> = (0..m * lda).map(val).collect();
        let b: Vec<f32> = (0..k * n).map(|e| val(e + 17)).collect();
        let block: Vec<f32> = (0..m * k)
            .map(|e| wide_a[(e / k) * lda + a0 + e % k])
            .collect();
        for isa in isas {
            let want = product(isa, &block, &b, false, &vec![0.0; m * n], k, n, 0.0);
            let packed = PackedB::new(isa, &b, n, 1, k, n);
            let mut wide_c = vec![f32::NAN; m * ldc];
            // SAFETY: the CPU runs `isa`; row i of the block is at a0 + i * lda (a0 + k <=
            // lda) and of C at c0 + i * ldc (c0 + n <= ldc), inside both vectors.
            unsafe {
                gemm_rows_strided(
                    0.75,
                    wide_a.as_ptr().add(a0),
                    lda,
                    m,
                    &packed,
                    0.0,
                    wide_c.as_mut_ptr().add(c0),
                    ldc,
                )
            };
            for i in 0..m {
                let row = &wide_c[i * ldc..(i + 1) * ldc];
                let got: Vec<u32> = row[c0..c0 + n].iter().map(|v| v.to_bits()).collect();
                let exp: Vec<u32> = want[i * n..(i + 1) * n]
                    .iter()
                    .map(|v| v.to_bits())
                    .collect();
                assert_eq!(got, exp, "{isa:?} row {i}");
                assert!(
                    row[..c0].iter().chain(&row[c0 + n..]).all(|v| v.is_nan()),
                    "{isa:?} row {i}"
                );
            }
        }
    }
}
