//! `C <- alpha A B + beta C` for a tall row-major `A` and a narrow `B`, reading `A` in place.
//!
//! The layer products `X W` and `G W^T` have a row-major `A` of thousands of rows. Before
//! `matrixmultiply` can multiply it, [`super::gemm`] copies it column-major (its packing reads
//! a row-major `A` element by element), a pass that reads and writes every element of `A`
//! and then `matrixmultiply` packs the copy again. With a narrow `C` (a hidden width of 64,
//! the classes of an output layer) the product does few flops per element of `A` and those
//! two passes weigh: in a GCN epoch at hidden 64 the copy alone took 7% of the CPU.
//! This kernel copies nothing of `A`: its micro-tile is [`MR`] rows of `C` by [`NR`] columns,
//! and at every step of the inner dimension it broadcasts one element of each of the `MR`
//! rows of `A`, read where they lie, and multiplies it by `NR` contiguous floats of `B`,
//! packed once per product into column panels. The `MR * NR / 8` accumulators stay in
//! registers across the whole inner dimension, so each element of `C` is one chain of fused
//! multiply-adds in increasing `k`, then scaled by `alpha` (and `beta C` added): the result
//! does not depend on how the rows are split between threads. No crate offers a GEMM that
//! reads a row-major `A` without packing it (`matrixmultiply` and `gemm` both pack), hence
//! this hand-written one; it is used up to [`MAX_N`] columns, where it was measured faster.

// Off x86-64 `available` is false and the kernel is never reached.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code, unused_variables))]

use std::mem::MaybeUninit;

/// Rows of a micro-tile.
pub(crate) const MR: usize = 6;
/// Columns of a micro-tile (two 8-float vectors).
pub(crate) const NR: usize = 16;
/// Widest `C` this kernel computes. The copy it saves costs the same per element of `A`
/// whatever `n` is, while the product's flops per element of `A` grow with `n`: on the 2-core
/// Zen 3 VM (two threads, `m` 1,024 to 80,000, `k` 64 to 4,096) it was 1.08-1.7x faster
/// than the transpose and `matrixmultiply` for `n` of 47 to 128 in every run, and between
/// 0.8x and 1.15x, with no consistent gain, for `n` of 256 and 512.
pub(crate) const MAX_N: usize = 128;
/// Rows of `C` per pass over the panels of `B`: each panel (`k x NR`) is reused by this many
/// rows while it is in L1, and the rows of `A` (`ROW_CHUNK x k`) stay in L2 across panels.
const ROW_CHUNK: usize = 96;

/// `op(B)` (`k x n`) packed into `ceil(n / NR)` panels of `k x NR` floats, row by row, the
/// columns past `n` zero.
pub(crate) struct PackedB {
    k: usize,
    n: usize,
    data: Vec<f32>,
}

impl PackedB {
    /// Packs the `k x n` matrix whose element `(i, j)` is `b[i * rs + j * cs]`.
    pub(crate) fn new(b: &[f32], rs: usize, cs: usize, k: usize, n: usize) -> PackedB {
        let panels = n.div_ceil(NR);
        let mut data = vec![0.0f32; panels * k * NR];
        for (p, panel) in data.chunks_exact_mut(k * NR).enumerate() {
            let j0 = p * NR;
            let w = NR.min(n - j0);
            for (i, row) in panel.chunks_exact_mut(NR).enumerate() {
                for (jj, x) in row[..w].iter_mut().enumerate() {
                    *x = b[i * rs + (j0 + jj) * cs];
                }
            }
        }
        PackedB { k, n, data }
    }
}

/// True when products with a row-major `A` go through this kernel: x86-64 with AVX2 and FMA
/// but without AVX-512F. Where the CPU has AVX-512, `matrixmultiply`'s 16-float kernels run
/// instead (this kernel's 8-float vectors were only measured against its AVX2 kernel).
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && !is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Rows `row0..row0 + c.len() / n` of `C <- alpha A B + beta C`, with `A` row-major (`k`
/// columns, `a` holding all its rows) and `B` packed. `c` is those rows of `C`, row-major;
/// it is read only when `beta != 0`.
///
/// # Safety
/// [`available`] must be true; `a` must hold rows `row0..row0 + rows` of `k` floats;
/// `c.len()` must be a multiple of `b.n`; when `beta != 0`, `c` must be initialised.
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
    #[cfg(target_arch = "x86_64")]
    for r0 in (0..rows).step_by(ROW_CHUNK) {
        let chunk = ROW_CHUNK.min(rows - r0);
        for (p, panel) in b.data.chunks_exact(k * NR).enumerate() {
            let j0 = p * NR;
            let w = NR.min(n - j0);
            let mut i = 0;
            while i < chunk {
                let mr = MR.min(chunk - i);
                let a_at = a.as_ptr().add((row0 + r0 + i) * k);
                let c_at = c.as_mut_ptr().add((r0 + i) * n + j0).cast::<f32>();
                // SAFETY: rows r0+i..r0+i+mr of this block exist in `a` (asserted above) and
                // in `c`; the panel has k rows of NR floats; the tile writes columns
                // j0..j0+w < n of those rows of `c`, read only when beta != 0.
                unsafe {
                    match mr {
                        6 => x86::tile::<6>(k, a_at, panel.as_ptr(), alpha, beta, c_at, n, w),
                        5 => x86::tile::<5>(k, a_at, panel.as_ptr(), alpha, beta, c_at, n, w),
                        4 => x86::tile::<4>(k, a_at, panel.as_ptr(), alpha, beta, c_at, n, w),
                        3 => x86::tile::<3>(k, a_at, panel.as_ptr(), alpha, beta, c_at, n, w),
                        2 => x86::tile::<2>(k, a_at, panel.as_ptr(), alpha, beta, c_at, n, w),
                        _ => x86::tile::<1>(k, a_at, panel.as_ptr(), alpha, beta, c_at, n, w),
                    }
                }
                i += mr;
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (alpha, row0, beta);
        unreachable!("gemm_rows is only called where available() is true (x86-64)")
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::NR;

    /// One `R x NR` tile of `C` (`R <= MR`): rows of `A` from `a` (row stride `k`), the
    /// panel of `B` from `b` (`k x NR`), `C` at `c` (row stride `ldc`), `w <= NR` columns.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; the pointers address the extents above; `c` is initialised
    /// when `beta != 0`.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn tile<const R: usize>(
        k: usize,
        a: *const f32,
        b: *const f32,
        alpha: f32,
        beta: f32,
        c: *mut f32,
        ldc: usize,
        w: usize,
    ) {
        let mut lo = [_mm256_setzero_ps(); R];
        let mut hi = [_mm256_setzero_ps(); R];
        for kk in 0..k {
            // SAFETY: kk < k, so the panel row and each A element are inside their extents.
            unsafe {
                let b0 = _mm256_loadu_ps(b.add(kk * NR));
                let b1 = _mm256_loadu_ps(b.add(kk * NR + 8));
                for r in 0..R {
                    let x = _mm256_broadcast_ss(&*a.add(r * k + kk));
                    lo[r] = _mm256_fmadd_ps(x, b0, lo[r]);
                    hi[r] = _mm256_fmadd_ps(x, b1, hi[r]);
                }
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
