//! Training steps read a step late, for backends whose reads wait for the queued work
//! ([`Backend::defers_reads`]): the step is queued whole (forward, loss, backward, the
//! non-finite gate, the gated optimiser step) and its figures are read only after the next
//! step is queued, so the device does not drain between steps. Evaluation batches read
//! their correct counts a batch late the same way.
//!
//! What [`fit_with`](super::fit_with) guarantees stays: a step whose loss or a gradient is not
//! finite stops the run with [`ExecError::NonFinite`] naming it, and the optimiser does not
//! apply it. The gate ([`Backend::mark_non_finite`]) is marked on the device by the bad step
//! and the optimiser kernels skip while it is marked, so neither that step nor the one queued
//! behind it changes the parameters.

use super::{gradient_not_finite, loss_not_finite, BatchOutcome, Trainer};
use crate::error::{ExecError, Result};
use crate::pipeline::Prepared;
use fanout_compute::{Backend, Mode, PendingRead, Tensor};

/// A step queued by [`Trainer::queue_step`]: its reads under way and where it was.
pub(crate) struct QueuedStep {
    figures: PendingRead,
    gate: PendingRead,
    labelled: usize,
    /// The epoch and step within it, and the learning rate, for the error if it was bad.
    at: (u64, u64, f32),
}

impl<B: Backend> Trainer<B> {
    /// A gate for [`Trainer::queue_step`]: slot 0 for the loss, `1 + i` for parameter `i`.
    pub(crate) fn new_gate(&self) -> Result<B::Tensor> {
        let slots = 1 + self.model.named_params().len();
        Ok(self.model.backend().zeros(1, 1 + slots)?)
    }

    /// Queues a whole training step of `p` (the work of [`Trainer::compute_gradients`] and
    /// [`Trainer::apply_gradients`]) with nothing read back: the loss and every gradient mark
    /// `gate` when not finite, and the optimiser skips while `gate` is marked. `at` is the
    /// step's `(epoch, step, learning rate)`.
    pub(crate) fn queue_step(
        &mut self,
        p: Prepared,
        dropout_key: u64,
        gate: &mut B::Tensor,
        at: (u64, u64, f32),
    ) -> Result<QueuedStep> {
        let be = self.model.backend().clone();
        let kept = self.forward_backward(p, dropout_key, |be, logits, labels| {
            let f = be.loss_and_accuracy_on_device(logits, labels)?;
            Ok((f.grad, (f.figures, f.count)))
        })?;
        // No seed: no gradient, and the optimiser steps as the read path's does.
        let figures = match kept {
            Some(kept) => kept,
            None => (be.upload_owned(Tensor::zeros(1, 2))?, 0),
        };
        be.mark_non_finite(&figures.0, gate, 0)?;
        for (i, (_, param)) in self.model.named_params().into_iter().enumerate() {
            be.mark_non_finite(&param.grad, gate, 1 + i)?;
        }
        self.opt.step_model_gated(&mut self.model, gate)?;
        Ok(QueuedStep {
            figures: be.read_later(&figures.0)?,
            gate: be.read_later(gate)?,
            labelled: figures.1,
            at,
        })
    }

    /// The outcome of a step [`Trainer::queue_step`] queued (waits for its reads), or
    /// [`ExecError::NonFinite`] naming what was not finite in it: the loss, else the first
    /// parameter (in [`fanout_compute::Model::named_params`] order) whose gradient was.
    pub(crate) fn finish_step(&self, q: QueuedStep) -> Result<BatchOutcome> {
        let be = self.model.backend();
        let figures = be.finish_read(q.figures)?;
        let gate = be.finish_read(q.gate)?;
        let (f, g) = (figures.data(), gate.data());
        let out = BatchOutcome {
            loss: f[0] as f64,
            correct: f[1] as usize,
            labelled: q.labelled,
        };
        if g[0] == 0.0 {
            return Ok(out);
        }
        let what = if !out.loss.is_finite() || g[1] != 0.0 {
            loss_not_finite(out.loss)
        } else {
            let names = self.model.named_params();
            match (2..g.len()).find(|&s| g[s] != 0.0) {
                Some(s) => gradient_not_finite(&names[s - 2].0, g[s]),
                None => "a gradient".to_string(),
            }
        };
        let (epoch, step, lr) = q.at;
        Err(ExecError::NonFinite {
            epoch,
            step,
            what,
            lr,
            checkpoint: None,
        })
    }
}

/// An evaluation batch queued by [`Trainer::queue_eval`]: its correct count under way.
pub(crate) struct QueuedEval {
    figures: PendingRead,
    labelled: usize,
}

impl<B: Backend> Trainer<B> {
    /// Queues the evaluation of `p` (the forward pass in evaluation mode, the loss and the
    /// correct count) with nothing read back, for [`Trainer::finish_eval`] after the next
    /// batch is queued: the device does not drain between evaluation batches. The loss (and
    /// its gradient) are computed with the count, by the kernels training uses, and unused.
    pub(crate) fn queue_eval(&mut self, p: Prepared) -> Result<QueuedEval> {
        let labels = super::labels(&p)?.to_vec();
        let logits = self.forward(p, Mode::Eval)?;
        let be = self.model.backend();
        let f = be.loss_and_accuracy_on_device(&logits, &labels)?;
        Ok(QueuedEval {
            figures: be.read_later(&f.figures)?,
            labelled: f.count,
        })
    }

    /// `(correct, labelled)` of a batch [`Trainer::queue_eval`] queued (waits for its read):
    /// what [`Trainer::eval_batch`] gives for the same batch.
    pub(crate) fn finish_eval(&self, q: QueuedEval) -> Result<(usize, usize)> {
        let figures = self.model.backend().finish_read(q.figures)?;
        // A float holds the count exactly below 2^24 rows a batch; the CUDA backend reads
        // larger batches' counts back at once instead.
        Ok((figures.data()[1] as usize, q.labelled))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanout_compute::{Adam, CpuBackend, Model, ModelConfig, ModelKind};

    fn queued(figures: Vec<f32>, gate: Vec<f32>) -> QueuedStep {
        QueuedStep {
            figures: PendingRead::done(Tensor::new(1, 2, figures)),
            gate: PendingRead::done(Tensor::new(1, gate.len(), gate)),
            labelled: 7,
            at: (2, 9, 0.5),
        }
    }

    /// A finished step gives its figures, or the error naming the loss or the first marked
    /// parameter (slot `1 + i` of the gate is parameter `i`).
    #[test]
    fn a_finished_step_names_what_its_gate_marked() {
        let model = Model::new(CpuBackend, ModelConfig::new(ModelKind::Sage, 4, 8, 3, 2)).unwrap();
        let names: Vec<String> = model.named_params().into_iter().map(|(n, _)| n).collect();
        let t = Trainer::new(model, Box::new(Adam::new(CpuBackend, 0.1)));
        let gate = t.new_gate().unwrap();
        assert_eq!(t.model.backend().shape(&gate), (1, 2 + names.len()));
        let ok = t.finish_step(queued(vec![1.5, 4.0], vec![0.0; 2 + names.len()]));
        let ok = ok.unwrap();
        assert_eq!((ok.loss, ok.correct, ok.labelled), (1.5, 4, 7));
        let mut g = vec![0.0; 2 + names.len()];
        (g[0], g[2 + 1], g[2 + 2]) = (1.0, f32::INFINITY, f32::NAN);
        let what = |r: Result<BatchOutcome>| match r {
            Err(ExecError::NonFinite {
                epoch,
                step,
                what,
                lr,
                ..
            }) => (epoch, step, what, lr),
            other => panic!("not a non-finite stop: {other:?}"),
        };
        let want = format!("the gradient of {} (inf)", names[1]);
        assert_eq!(
            what(t.finish_step(queued(vec![1.5, 4.0], g.clone()))),
            (2, 9, want, 0.5)
        );
        g[1] = f32::NAN;
        let loss = what(t.finish_step(queued(vec![f32::NAN, 4.0], g)));
        assert_eq!(loss.2, "the loss (NaN)");
    }
}
