//! Loss and accuracy kernels.

use rayon::prelude::*;

use crate::backend::{check_labels, CrossEntropy};
use crate::error::Result;
use crate::tensor::Tensor;

/// See [`crate::Backend::softmax_cross_entropy`].
pub(crate) fn softmax_cross_entropy(
    logits: &Tensor,
    labels: &[i64],
) -> Result<CrossEntropy<Tensor>> {
    let count = check_labels(logits.rows(), logits.cols(), labels)?;
    let classes = logits.cols();
    let mut grad = Tensor::zeros(logits.rows(), classes);
    let mut row_loss = vec![0.0f64; logits.rows()];
    if count > 0 {
        let inv = 1.0 / count as f32;
        grad.data_mut()
            .par_chunks_mut(classes.max(1))
            .zip(row_loss.par_iter_mut())
            .enumerate()
            .with_min_len(64)
            .for_each(|(r, (g, loss))| {
                if labels[r] < 0 {
                    return;
                }
                let x = logits.row(r);
                let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let sum: f64 = x.iter().map(|&v| ((v - max) as f64).exp()).sum();
                let lse = max as f64 + sum.ln();
                let y = labels[r] as usize;
                *loss = lse - x[y] as f64;
                for c in 0..classes {
                    g[c] = ((x[c] as f64 - lse).exp() as f32) * inv;
                }
                g[y] -= inv;
            });
    }
    let total: f64 = row_loss.iter().sum();
    Ok(CrossEntropy {
        loss: if count > 0 {
            (total / count as f64) as f32
        } else {
            0.0
        },
        count,
        grad,
    })
}

/// See [`crate::Backend::accuracy`].
pub(crate) fn accuracy(logits: &Tensor, labels: &[i64]) -> (usize, usize) {
    assert_eq!(labels.len(), logits.rows(), "accuracy: label count != rows");
    (0..logits.rows())
        .into_par_iter()
        .with_min_len(256)
        .map(|r| {
            if labels[r] < 0 {
                return (0, 0);
            }
            let x = logits.row(r);
            let mut best = 0;
            for c in 1..x.len() {
                if x[c] > x[best] {
                    best = c;
                }
            }
            ((best as i64 == labels[r]) as usize, 1)
        })
        .reduce(|| (0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}
