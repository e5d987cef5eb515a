//! Dense row and elementwise kernels (bias, activations, dropout, normalisation, head ops).

use fanout_rand::Rng;
use rayon::prelude::*;

use crate::cpu::par::{
    axpy_slice, copy, dot_slice, map1, map2, par_row_reduce, par_rows, ELEM_CHUNK,
};
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
        for r in r0..r1 {
            for (a, &v) in acc.iter_mut().zip(x.row(r)) {
                *a += v as f64;
            }
        }
    });
    Tensor::new(1, cols, total.into_iter().map(|v| v as f32).collect())
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

/// See [`crate::Backend::dot`].
pub(crate) fn dot(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.shape(), b.shape(), "dot: shapes differ");
    par_row_reduce(a.rows(), 1, |r0, r1, acc| {
        for r in r0..r1 {
            acc[0] += a
                .row(r)
                .iter()
                .zip(b.row(r))
                .map(|(&x, &y)| x as f64 * y as f64)
                .sum::<f64>();
        }
    })[0]
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
/// An element is dropped when a 32-bit uniform draw is below `round(p * 2^32)`, so its drop
/// probability is within `2^-32` of `p`. Each `next_u64` of the row's generator gives two
/// draws, and the mask and the product are written in one branch-free pass: the per-element
/// coin flip with a float compare and a data-dependent branch cost about a fifth of a
/// GraphSAGE training step.
pub(crate) fn dropout(x: &Tensor, p: f32, key: u64) -> (Tensor, Tensor) {
    assert!((0.0..1.0).contains(&p), "dropout: p = {p} not in [0, 1)");
    let keep = 1.0 / (1.0 - p);
    let thr = (p as f64 * 4_294_967_296.0).round().min(u32::MAX as f64) as u32;
    let (rows, cols) = x.shape();
    let len = rows * cols;
    let (mut out, mut mask): (Vec<f32>, Vec<f32>) =
        (Vec::with_capacity(len), Vec::with_capacity(len));
    if len > 0 {
        const BLOCK: usize = 64;
        out.spare_capacity_mut()[..len]
            .par_chunks_mut(cols)
            .zip(mask.spare_capacity_mut()[..len].par_chunks_mut(cols))
            .enumerate()
            .with_min_len((2048 / cols).max(1))
            .for_each(|(r, (orow, mrow))| {
                let mut rng = Rng::keyed(&[key, r as u64]);
                let xrow = x.row(r);
                let mut draws = [0u32; BLOCK];
                for ((o, m), xs) in orow
                    .chunks_mut(BLOCK)
                    .zip(mrow.chunks_mut(BLOCK))
                    .zip(xrow.chunks(BLOCK))
                {
                    for pair in draws[..o.len().div_ceil(2) * 2].chunks_exact_mut(2) {
                        let bits = rng.next_u64();
                        pair[0] = bits as u32;
                        pair[1] = (bits >> 32) as u32;
                    }
                    for (((o, m), &xv), &d) in o.iter_mut().zip(m.iter_mut()).zip(xs).zip(&draws) {
                        let mv = keep * (d >= thr) as u32 as f32;
                        m.write(mv);
                        o.write(xv * mv);
                    }
                }
            });
        // SAFETY: the rows cover all `len` elements of both buffers, and every element of each
        // row's blocks (which cover the row: `xs` is as long as the row) was written above.
        unsafe {
            out.set_len(len);
            mask.set_len(len);
        }
    }
    (Tensor::new(rows, cols, out), Tensor::new(rows, cols, mask))
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
    let (heads, f) = a.shape();
    assert_eq!(x.cols(), heads * f, "head_dot: x width != H * F");
    let mut out = Tensor::zeros(x.rows(), heads);
    par_rows(out.data_mut(), heads, |n, o| {
        let xr = x.row(n);
        for h in 0..heads {
            o[h] = dot_slice(&xr[h * f..(h + 1) * f], a.row(h));
        }
    });
    out
}

/// See [`crate::Backend::head_dot_backward`].
pub(crate) fn head_dot_backward(grad: &Tensor, x: &Tensor, a: &Tensor) -> (Tensor, Tensor) {
    let (heads, f) = a.shape();
    assert_eq!(x.cols(), heads * f, "head_dot_backward: x width != H * F");
    assert_eq!(
        grad.shape(),
        (x.rows(), heads),
        "head_dot_backward: grad shape"
    );
    let mut gx = Tensor::zeros(x.rows(), x.cols());
    par_rows(gx.data_mut(), heads * f, |n, o| {
        let g = grad.row(n);
        for h in 0..heads {
            axpy_slice(g[h], a.row(h), &mut o[h * f..(h + 1) * f]);
        }
    });
    let ga = par_row_reduce(x.rows(), heads * f, |r0, r1, acc| {
        for n in r0..r1 {
            let (g, xr) = (grad.row(n), x.row(n));
            for h in 0..heads {
                for k in 0..f {
                    acc[h * f + k] += (g[h] * xr[h * f + k]) as f64;
                }
            }
        }
    });
    let ga = Tensor::new(heads, f, ga.into_iter().map(|v| v as f32).collect());
    (gx, ga)
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
