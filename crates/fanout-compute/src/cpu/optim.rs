//! Optimiser update kernels (elementwise, parallel over fixed chunks).

use rayon::prelude::*;

use crate::backend::{AdamUpdate, SgdUpdate};
use crate::cpu::par::ELEM_CHUNK;
use crate::tensor::Tensor;

/// See [`crate::Backend::adam_update`].
pub(crate) fn adam_update(
    value: &mut Tensor,
    grad: &Tensor,
    m: &mut Tensor,
    v: &mut Tensor,
    hp: &AdamUpdate,
) {
    let shape = value.shape();
    assert!(
        grad.shape() == shape && m.shape() == shape && v.shape() == shape,
        "adam_update: shapes differ"
    );
    let (step_size, inv_sqrt_bc2) = hp.scalars();
    let (b1, b2, eps, wd) = (hp.beta1, hp.beta2, hp.eps, hp.weight_decay);
    value
        .data_mut()
        .par_chunks_mut(ELEM_CHUNK)
        .zip(m.data_mut().par_chunks_mut(ELEM_CHUNK))
        .zip(v.data_mut().par_chunks_mut(ELEM_CHUNK))
        .zip(grad.data().par_chunks(ELEM_CHUNK))
        .for_each(|(((p, m), v), g)| {
            for i in 0..p.len() {
                let gi = g[i] + wd * p[i];
                m[i] = b1 * m[i] + (1.0 - b1) * gi;
                v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
                p[i] -= step_size * m[i] / (v[i].sqrt() * inv_sqrt_bc2 + eps);
            }
        });
}

/// See [`crate::Backend::sgd_update`].
pub(crate) fn sgd_update(value: &mut Tensor, grad: &Tensor, buf: &mut Tensor, hp: &SgdUpdate) {
    let shape = value.shape();
    assert!(grad.shape() == shape, "sgd_update: grad shape differs");
    let (lr, mu, wd) = (hp.lr, hp.momentum, hp.weight_decay);
    if mu == 0.0 {
        value
            .data_mut()
            .par_chunks_mut(ELEM_CHUNK)
            .zip(grad.data().par_chunks(ELEM_CHUNK))
            .for_each(|(p, g)| {
                for i in 0..p.len() {
                    p[i] -= lr * (g[i] + wd * p[i]);
                }
            });
        return;
    }
    assert!(
        buf.shape() == shape,
        "sgd_update: momentum buffer shape differs"
    );
    value
        .data_mut()
        .par_chunks_mut(ELEM_CHUNK)
        .zip(buf.data_mut().par_chunks_mut(ELEM_CHUNK))
        .zip(grad.data().par_chunks(ELEM_CHUNK))
        .for_each(|((p, b), g)| {
            for i in 0..p.len() {
                b[i] = mu * b[i] + g[i] + wd * p[i];
                p[i] -= lr * b[i];
            }
        });
}
