//! Shared helpers for the integration tests: random data, random blocks, and a
//! finite-difference gradient checker.
#![allow(dead_code)]

use fanout_compute::{Backend, BlockRef, CpuBackend, CpuBlock, Tensor};
use fanout_rand::Rng;

/// Uniform values in `[-1, 1)`.
pub fn rand_tensor(rows: usize, cols: usize, rng: &mut Rng) -> Tensor {
    Tensor::from_fn(rows, cols, |_, _| rng.next_f32() * 2.0 - 1.0)
}

/// An owned block, for building `BlockRef`s in tests.
#[derive(Clone, Debug)]
pub struct OwnedBlock {
    pub num_dst: usize,
    pub num_src: usize,
    pub indptr: Vec<u32>,
    pub indices: Vec<u32>,
    pub weights: Option<Vec<f32>>,
}

impl OwnedBlock {
    /// A random block: each destination draws 0..=max_deg sources (duplicates allowed);
    /// destination 1 always has no edge, destination 0 always has a self edge; weights (when
    /// asked) are visit-count-like integers 1..=4.
    pub fn random(
        num_dst: usize,
        num_src: usize,
        max_deg: usize,
        weighted: bool,
        rng: &mut Rng,
    ) -> Self {
        let mut indptr = vec![0u32];
        let mut indices = Vec::new();
        for d in 0..num_dst {
            let deg = if d == 1 {
                0
            } else {
                1 + rng.below(max_deg as u64) as usize
            };
            for k in 0..deg {
                let s = if d == 0 && k == 0 {
                    0
                } else {
                    rng.below(num_src as u64) as u32
                };
                indices.push(s);
            }
            indptr.push(indices.len() as u32);
        }
        let weights = weighted.then(|| {
            (0..indices.len())
                .map(|_| 1.0 + rng.below(4) as f32)
                .collect()
        });
        OwnedBlock {
            num_dst,
            num_src,
            indptr,
            indices,
            weights,
        }
    }

    /// From adjacency lists (`lists[d]` = sources of destination `d`).
    pub fn from_lists(num_src: usize, lists: &[Vec<u32>], weights: Option<Vec<f32>>) -> Self {
        let mut indptr = vec![0u32];
        let mut indices = Vec::new();
        for l in lists {
            indices.extend_from_slice(l);
            indptr.push(indices.len() as u32);
        }
        OwnedBlock {
            num_dst: lists.len(),
            num_src,
            indptr,
            indices,
            weights,
        }
    }

    pub fn as_ref(&self) -> BlockRef<'_> {
        BlockRef {
            num_dst: self.num_dst,
            num_src: self.num_src,
            indptr: &self.indptr,
            indices: &self.indices,
            weights: self.weights.as_deref(),
        }
    }

    pub fn prepare(&self) -> CpuBlock {
        CpuBackend
            .prepare_block(&self.as_ref())
            .expect("valid block")
    }

    pub fn num_edges(&self) -> usize {
        self.indices.len()
    }
}

/// `sum(out * r)` in f64: a scalar loss whose gradient with respect to `out` is `r`.
pub fn proj_loss(out: &Tensor, r: &Tensor) -> f64 {
    assert_eq!(out.shape(), r.shape());
    out.data()
        .iter()
        .zip(r.data())
        .map(|(&a, &b)| a as f64 * b as f64)
        .sum()
}

/// Outcome of a passing gradient check.
#[derive(Debug)]
pub struct GradReport {
    pub checked: usize,
    /// Coordinates excused because the function is not smooth there (a ReLU kink within the
    /// step): the one-sided differences disagree by at least the mismatch.
    pub kinks: usize,
    pub max_err: f64,
}

/// Step of the central differences.
pub const EPS: f32 = 5e-3;

/// Checks `analytic` (the claimed gradient of `loss_at` at `x0`) against central differences
/// with step [`EPS`], coordinate by coordinate: `|num - ana| <= 1e-3 + 1e-2 * max(|num|,|ana|)`.
/// A failing coordinate is excused as a kink when the forward and backward one-sided
/// differences differ by at least the mismatch (what a ReLU corner within the step causes, and
/// what a wrong gradient in a smooth region does not); at most 10% of coordinates may be.
pub fn check_grad(
    what: &str,
    x0: &[f32],
    analytic: &[f32],
    mut loss_at: impl FnMut(&[f32]) -> f64,
) -> Result<GradReport, String> {
    assert_eq!(x0.len(), analytic.len(), "{what}: gradient length");
    let f0 = loss_at(x0);
    let mut x = x0.to_vec();
    let (mut kinks, mut max_err) = (0usize, 0.0f64);
    let mut failures = Vec::new();
    for i in 0..x0.len() {
        x[i] = x0[i] + EPS;
        let fp = loss_at(&x);
        x[i] = x0[i] - EPS;
        let fm = loss_at(&x);
        x[i] = x0[i];
        let h = EPS as f64;
        let num = (fp - fm) / (2.0 * h);
        let ana = analytic[i] as f64;
        let err = (num - ana).abs();
        let tol = 1e-3 + 1e-2 * num.abs().max(ana.abs());
        if err <= tol {
            max_err = max_err.max(err);
            continue;
        }
        let one_sided_gap = ((fp - f0) / h - (f0 - fm) / h).abs();
        if one_sided_gap >= err {
            kinks += 1;
        } else {
            failures.push(format!("[{i}] numeric {num:.6} analytic {ana:.6}"));
        }
    }
    if !failures.is_empty() {
        return Err(format!(
            "{what}: {} of {} coordinates wrong: {}",
            failures.len(),
            x0.len(),
            failures[..failures.len().min(5)].join(", ")
        ));
    }
    if kinks * 10 > x0.len().max(10) {
        return Err(format!(
            "{what}: {kinks} of {} coordinates at kinks (too many to trust)",
            x0.len()
        ));
    }
    Ok(GradReport {
        checked: x0.len(),
        kinks,
        max_err,
    })
}

/// [`check_grad`] that panics with the message on failure.
pub fn assert_grad(
    what: &str,
    x0: &[f32],
    analytic: &[f32],
    loss_at: impl FnMut(&[f32]) -> f64,
) -> GradReport {
    match check_grad(what, x0, analytic, loss_at) {
        Ok(r) => r,
        Err(m) => panic!("{m}"),
    }
}
