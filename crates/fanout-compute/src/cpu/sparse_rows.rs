//! Products `C <- alpha A B + beta C` that skip the zeros of a row-major `A`.
//!
//! A layer that passes its gradient on multiplies the gradient at its pre-activation, `G`, by
//! its weights: `G W^T`. Behind ReLU and dropout `G` is about three-quarters zeros (the same
//! zeros [`super::sparse_grad`] skips in the weight gradient `X^T G`), and a layer's input
//! can be such an output too (GIN's inner ReLU, a hidden layer's rows). A dense product
//! multiplies all of those zeros. This one computes each row of `C` as the sum, over the
//! non-zeros `A[i, p]` of row `i`, of `A[i, p] * B[p, :]`, with the machinery of the weight
//! gradients turned around: per task of `ROWS_PER_TASK` rows of `A`, each block of
//! `ROW_BLOCK` of `A`'s columns gets a 64-bit mask per row marking its non-zeros (no copy
//! and no transpose: a row's block of `A` is contiguous, and the kernel reads the values
//! where they lie), and for each strip of up to `STRIP` columns of `C` the block's rows of
//! `B` are copied into a contiguous buffer (32 KiB, in L1) and `sparse_grad`'s micro-kernel
//! adds `A[i, p] * B[p, strip]` over the marked `p` into the row's strip held in registers.
//! The task's strips of `C` (at most 256 KiB) stay in L2 across the blocks; they are `C`
//! itself when nothing scales the sums and `C`'s width is whole vectors.
//!
//! Each element of `C` is one chain of fused multiply-adds over its row's non-zeros in
//! increasing `p` from zero, then scaled by `alpha` with `beta C` added fused, whatever the
//! thread count (tasks split the rows of `C`, never the inner dimension), so results are
//! bit-identical for any `RAYON_NUM_THREADS`. That is the chain of the dense row-major
//! kernel (`super::rowmajor`) less its terms `0 * B[p, j]`, which add nothing to a sum that
//! starts at `+0`: for a finite `B` the two give the same bits. No crate multiplies a
//! dense-stored sparse matrix without first compressing it (which costs as much as the
//! product here), hence this module.

use rayon::prelude::*;
use std::mem::MaybeUninit;

use super::sparse_grad::{available, padded, Simd, ROW_BLOCK, STRIP};
use crate::tensor::Tensor;

/// Rows of `A` and `C` per parallel task: the task's strip of `C` (`ROWS_PER_TASK x STRIP`
/// floats, 256 KiB) stays in L2 while every block of `A`'s columns adds into it. A fixed
/// number, so the split does not depend on the thread count.
const ROWS_PER_TASK: usize = 512;

/// `C <- alpha * A * op(B) + beta * C` for a row-major `A` (`m x k`), `op(B)` = `B` (`k x n`)
/// or `B^T` (`B` is `n x k`) and `C` (`m x n`), visiting only the non-zero entries of `A`.
/// With `beta == 0` the old contents of `C` are ignored. A NaN in `A` reaches its whole row
/// of `C`, as in a dense product; a NaN or infinity in `B` that meets only zeros of `A`
/// contributes nothing (a dense product would give NaN).
///
/// Returns the number of entries of `A` it used (its non-zeros and NaNs): `2 n` flops each,
/// against `2 m k n` for the dense product.
///
/// Panics on mismatched shapes, or if [`available`] is false.
pub fn gemm_nn_sparse(
    alpha: f32,
    a: &Tensor,
    b: &Tensor,
    trans_b: bool,
    beta: f32,
    c: &mut Tensor,
) -> usize {
    gemm_nn_sparse_with(None, alpha, a, b, trans_b, beta, c)
}

/// [`gemm_nn_sparse`] with the given vector width.
fn gemm_nn_sparse_with(
    simd: Option<Simd>,
    alpha: f32,
    a: &Tensor,
    b: &Tensor,
    trans_b: bool,
    beta: f32,
    c: &mut Tensor,
) -> usize {
    let n = if trans_b { b.rows() } else { b.cols() };
    assert_eq!(
        c.shape(),
        (a.rows(), n),
        "gemm_nn_sparse: C has the wrong shape"
    );
    let cd = c.data_mut();
    // SAFETY: `cd` is initialised, so it may be read whatever beta is; viewing it as
    // MaybeUninit only lets the kernel write floats into it.
    unsafe {
        let len = cd.len();
        let cu = std::slice::from_raw_parts_mut(cd.as_mut_ptr().cast::<MaybeUninit<f32>>(), len);
        gemm_nn_sparse_into(simd, alpha, a, b, trans_b, beta, cu)
    }
}

/// [`gemm_nn_sparse`] into a `C` given as `m x n` row-major, possibly uninitialised memory
/// (what [`super::gemm::matmul`] hands it: no zero-fill first), with the vector width
/// `simd` (the best one the CPU runs for `None`).
///
/// # Safety
/// When `beta != 0`, every element of `c` must be initialised (it is read). When
/// `beta == 0`, `c` is only written, and on return every element of it has been written.
pub(super) unsafe fn gemm_nn_sparse_into(
    simd: Option<Simd>,
    alpha: f32,
    a: &Tensor,
    b: &Tensor,
    trans_b: bool,
    beta: f32,
    c: &mut [MaybeUninit<f32>],
) -> usize {
    let simd = simd.unwrap_or_else(Simd::best);
    let (m, k) = a.shape();
    let (kb, n) = if trans_b {
        (b.cols(), b.rows())
    } else {
        b.shape()
    };
    assert_eq!(
        k, kb,
        "gemm_nn_sparse: A and op(B) differ in the inner dimension"
    );
    assert_eq!(c.len(), m * n, "gemm_nn_sparse: C has the wrong length");
    assert!(available(), "gemm_nn_sparse needs AVX2 and FMA");
    if m == 0 || n == 0 {
        return 0;
    }
    // The strips copy rows of op(B): a transposed B (a weight, `n x k`) is laid out as
    // `k x n` once (its column-major copy), one pass over it against `m / ROWS_PER_TASK`
    // reads.
    let bt;
    let b = if trans_b {
        let mut scratch = Vec::new();
        super::gemm::transposed_a_rows(b.data(), k, 0, n, &mut scratch);
        bt = Tensor::new(k, n, scratch);
        &bt
    } else {
        b
    };
    c.par_chunks_mut(ROWS_PER_TASK * n)
        .enumerate()
        .map(|(t, c_rows)| rows_task(simd, alpha, a, t * ROWS_PER_TASK, b, beta, c_rows))
        .sum()
}

/// One task: rows `r0..r0 + c_rows.len() / n` of `C`, written into `c_rows` (read only when
/// `beta != 0`, then initialised: [`gemm_nn_sparse_into`]'s contract). Returns the entries of
/// those rows of `A` it used.
fn rows_task(
    simd: Simd,
    alpha: f32,
    a: &Tensor,
    r0: usize,
    b: &Tensor,
    beta: f32,
    c_rows: &mut [MaybeUninit<f32>],
) -> usize {
    let (k, n) = b.shape();
    let rows = c_rows.len() / n;
    // Each block of A's columns with its rows' non-zeros marked, once for every strip; the
    // kernel reads the values from A where they lie.
    let blocks: Vec<Vec<u64>> = (0..k.div_ceil(ROW_BLOCK))
        .map(|blk| mark_rows(a, r0, rows, blk * ROW_BLOCK))
        .collect();
    let used = blocks
        .iter()
        .flatten()
        .map(|m| m.count_ones() as usize)
        .sum();
    // Sums go straight into C when nothing scales them and every strip is whole vectors;
    // otherwise into a strip of sums (rows padded to whole vectors) copied out after.
    let direct = alpha == 1.0 && beta == 0.0 && n % 16 == 0;
    let spw_max = padded(STRIP.min(n));
    let mut sums = if direct {
        c_rows.fill(MaybeUninit::new(0.0));
        Vec::new()
    } else {
        vec![0.0f32; rows * spw_max]
    };
    // The block's rows of B's strip, packed and 64-byte aligned; lanes past the strip's width
    // stay zero.
    let mut buf = vec![0.0f32; ROW_BLOCK * spw_max + 15];
    let at = buf.as_ptr().align_offset(64).min(15);
    for kc in (0..n).step_by(STRIP) {
        let sw = STRIP.min(n - kc);
        let spw = padded(sw);
        let pa = &mut buf[at..at + ROW_BLOCK * spw];
        // Lanes past `sw` must be zero whatever the previous strip's layout left there.
        pa.fill(0.0);
        let (out, ldc) = if direct {
            // `spw == sw` here (n is a multiple of 16), so row `i`'s strip is columns
            // `kc..kc + sw` of C.
            (c_rows[kc..].as_mut_ptr().cast::<f32>(), n)
        } else {
            sums[..rows * spw].fill(0.0);
            (sums.as_mut_ptr(), spw)
        };
        for (blk, masks) in blocks.iter().enumerate() {
            let p0 = blk * ROW_BLOCK;
            for p in 0..ROW_BLOCK.min(k - p0) {
                pa[p * spw..][..sw].copy_from_slice(&b.row(p0 + p)[kc..][..sw]);
            }
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `gemm_nn_sparse_into` asserted `available()` (AVX2 + FMA), and
            // `Simd::Avx512` is only chosen where the CPU has AVX-512F. `pa` is `ROW_BLOCK x
            // spw` with every marked row (below `k - p0`) written. A marked bit `p` of row
            // `i` reads `A[r0 + i, p0 + p]`, inside A (`p0 + p < k`, `r0 + i < m`). Row `i`'s
            // `spw` floats at `out + i * ldc` are inside `c_rows` (direct: columns `kc..kc +
            // sw` of its row) or `sums` (`rows x spw`), which nothing else touches meanwhile.
            unsafe {
                let marked = super::sparse_grad::x86::Marked {
                    masks,
                    vals: a.data().as_ptr().add(r0 * k + p0),
                    stride: k,
                };
                match simd {
                    Simd::Avx512 => {
                        super::sparse_grad::x86::block_avx512(pa, spw, marked, out, ldc)
                    }
                    Simd::Avx2 => super::sparse_grad::x86::block_avx2(pa, spw, marked, out, ldc),
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                let _ = (simd, masks, out, ldc);
                unreachable!("gemm_nn_sparse asserts available(), which is false off x86-64")
            }
        }
        if !direct {
            for (row, sums) in c_rows.chunks_exact_mut(n).zip(sums.chunks_exact(spw)) {
                for (o, &s) in row[kc..kc + sw].iter_mut().zip(sums) {
                    // `beta C` added fused, as the dense row-major tile does.
                    o.write(if beta == 0.0 {
                        alpha * s
                    } else {
                        // SAFETY: beta != 0 only with an initialised C (the contract).
                        beta.mul_add(unsafe { o.assume_init() }, alpha * s)
                    });
                }
            }
        }
    }
    used
}

/// The masks of columns `p0..p0 + ROW_BLOCK` (fewer at the end) of `A`'s rows `r0..r0 +
/// rows`: bit `p` of row `i`'s mask is set when `A[r0 + i, p0 + p]` is not zero (or is NaN).
fn mark_rows(a: &Tensor, r0: usize, rows: usize, p0: usize) -> Vec<u64> {
    let width = ROW_BLOCK.min(a.cols() - p0);
    (r0..r0 + rows)
        .map(|r| {
            let src = &a.row(r)[p0..p0 + width];
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `gemm_nn_sparse_into` asserted `available()` (AVX2); `src` holds at
            // most ROW_BLOCK = 64 floats.
            unsafe {
                x86::mark(src)
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                let _ = src;
                unreachable!("gemm_nn_sparse asserts available(), which is false off x86-64")
            }
        })
        .collect()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// The mask whose bit `p` is set when `src[p]` is not zero (or is NaN), eight floats a
    /// compare.
    ///
    /// # Safety
    /// AVX2; `src.len() <= 64`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn mark(src: &[f32]) -> u64 {
        debug_assert!(src.len() <= 64);
        let full = src.len() / 8 * 8;
        let mut mask = 0u64;
        for c in (0..full).step_by(8) {
            // SAFETY: c + 8 <= full <= src.len().
            unsafe {
                let v = _mm256_loadu_ps(src.as_ptr().add(c));
                // Unordered-or-not-equal: NaNs count as non-zero.
                let ne = _mm256_cmp_ps::<_CMP_NEQ_UQ>(v, _mm256_setzero_ps());
                mask |= u64::from(_mm256_movemask_ps(ne) as u8) << c;
            }
        }
        for (c, &v) in src.iter().enumerate().skip(full) {
            mask |= u64::from(v != 0.0) << c;
        }
        mask
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::super::sparse_grad::testing;
    use super::*;
    use fanout_rand::Rng;

    /// The kernel's arithmetic, one element at a time: each element of `C` chains fused
    /// multiply-adds over its row of `A`'s non-zeros (NaNs included) in increasing column
    /// order, from zero.
    fn scalar_model(alpha: f32, a: &Tensor, b: &Tensor, beta: f32, c: &Tensor) -> Tensor {
        Tensor::from_fn(a.rows(), b.cols(), |i, j| {
            let mut s = 0.0f32;
            for p in 0..a.cols() {
                let v = a.get(i, p);
                if v != 0.0 {
                    s = v.mul_add(b.get(p, j), s);
                }
            }
            if beta == 0.0 {
                alpha * s
            } else {
                beta.mul_add(c.get(i, j), alpha * s)
            }
        })
    }

    #[test]
    fn both_widths_and_any_thread_count_give_the_bits_of_one_chain_per_element() {
        let widths = testing::widths_here();
        let pools = testing::pools();
        let mut rng = Rng::new(9);
        let mut rand = |r: usize, c: usize, density: f64| testing::random(&mut rng, r, c, density);
        // (rows of A, inner dimension, columns of C): one element; several tasks with a
        // partial last one; inner dimensions not a multiple of the 64-column blocks; C's
        // width past one strip by one float and with tails of 1, 9 and 17 floats; widths of
        // whole vectors (144, 256), which alpha = 1, beta = 0 sums straight into C.
        let shapes = [
            (1, 1, 1),
            (1100, 70, 129),
            (700, 100, 144),
            (513, 64, 9),
            (40, 200, 256),
            (7, 130, 17),
            (600, 256, 145),
        ];
        for &(m, k, n) in &shapes {
            for density in [0.0, 0.25, 1.0] {
                let mut a = rand(m, k, density);
                if density == 0.25 {
                    // A NaN in the middle, and one in the last column.
                    a.data_mut()[(m / 2) * k + k / 2] = f32::NAN;
                    a.data_mut()[k - 1] = f32::NAN;
                }
                let used = a.data().iter().filter(|&&v| v != 0.0).count();
                let b = rand(k, n, 1.0);
                let bt = Tensor::from_fn(n, k, |j, p| b.get(p, j));
                for (alpha, beta) in [(1.0, 0.0), (-0.75, 1.0), (1.5, 0.3)] {
                    let c0 = rand(m, n, 1.0);
                    let want = scalar_model(alpha, &a, &b, beta, &c0);
                    for &simd in &widths {
                        for pool in &pools {
                            for (op_b, trans_b) in [(&b, false), (&bt, true)] {
                                let mut got = c0.clone();
                                let listed = pool.install(|| {
                                    gemm_nn_sparse_with(
                                        Some(simd),
                                        alpha,
                                        &a,
                                        op_b,
                                        trans_b,
                                        beta,
                                        &mut got,
                                    )
                                });
                                let threads = pool.current_num_threads();
                                let what = format!(
                                    "{simd:?}, {threads} threads, {m}x{k}x{n}, density {density}, \
                                     alpha {alpha}, beta {beta}, B^T {trans_b}"
                                );
                                assert_eq!(listed, used, "entries of A used: {what}");
                                assert!(testing::same_bits(&got, &want), "{what}");
                            }
                        }
                    }
                }
            }
        }
    }
}
