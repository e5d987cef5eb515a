//! The train stage: one model and its optimiser on one backend, and [`fit`], the epoch loop
//! with periodic evaluation.

use crate::error::{ExecError, Result};
use crate::metrics::{EpochMetrics, RunMetrics};
use crate::pipeline::{EpochStream, Pipeline, Prepared};
use fanout_cache::ExtractStats;
use fanout_compute::{Backend, BlockRef, Mode, Model, Optimizer, Tensor};
use fanout_sample::Block;
use std::time::Instant;

/// The epoch number evaluation batches are sampled under. Evaluation always uses this one key
/// (with the run's seed), so every evaluation of a model sees the same sampled neighbourhoods
/// and a reloaded model reproduces the accuracy exactly.
pub const EVAL_EPOCH: u64 = u64::MAX;

/// Result of one training step.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BatchOutcome {
    /// Mean cross-entropy over the labelled seeds.
    pub loss: f64,
    /// Seeds whose arg-max prediction equals their label.
    pub correct: usize,
    /// Seeds with a label (the loss's divisor).
    pub labelled: usize,
}

/// A model with its optimiser on one backend: the train stage of a pipeline. Guarantee: given
/// the same prepared batches in the same order, the parameters after each step are a pure
/// function of the model's initial parameters (deterministic kernels, dropout keyed by step).
pub struct Trainer<B: Backend> {
    model: Model<B>,
    opt: Box<dyn Optimizer<B> + Send>,
}

/// Borrowed compute-side views of a mini-batch's sampled blocks (outermost first), as
/// [`Model::prepare_blocks`] takes them. No copy: the views point into `blocks`.
pub fn block_refs(blocks: &[Block]) -> Vec<BlockRef<'_>> {
    blocks
        .iter()
        .map(|b| BlockRef {
            num_dst: b.num_dst,
            num_src: b.num_src,
            indptr: &b.indptr,
            indices: &b.indices,
            weights: b.weights.as_deref(),
        })
        .collect()
}

fn labels(p: &Prepared) -> Result<&[i64]> {
    p.batch.labels.as_deref().ok_or_else(|| {
        ExecError::Invalid("the dataset has no labels (label.bin absent): cannot train".into())
    })
}

impl<B: Backend> Trainer<B> {
    /// A trainer updating `model` with `opt`.
    pub fn new(model: Model<B>, opt: Box<dyn Optimizer<B> + Send>) -> Self {
        Trainer { model, opt }
    }

    /// The model.
    pub fn model(&self) -> &Model<B> {
        &self.model
    }

    /// The model, mutable.
    pub fn model_mut(&mut self) -> &mut Model<B> {
        &mut self.model
    }

    /// Gives the model back.
    pub fn into_model(self) -> Model<B> {
        self.model
    }

    fn forward(&mut self, p: Prepared, mode: Mode) -> Result<B::Tensor> {
        let blocks = self.model.prepare_blocks(&block_refs(&p.batch.blocks))?;
        let rows = p.batch.input_nodes.len();
        let x = Tensor::new(rows, p.dim, p.features);
        let be = self.model.backend().clone();
        Ok(self.model.forward(&blocks, be.upload_owned(x), mode)?)
    }

    /// Forward and backward of one batch: the parameter gradients are *replaced* by this
    /// batch's (zeroed first). Split from [`Trainer::apply_gradients`] so that data-parallel
    /// workers can all-reduce gradients in between.
    pub fn compute_gradients(&mut self, p: Prepared, dropout_key: u64) -> Result<BatchOutcome> {
        let labels = labels(&p)?.to_vec();
        let logits = self.forward(p, Mode::Train { dropout_key })?;
        let be = self.model.backend().clone();
        let ce = be.softmax_cross_entropy(&logits, &labels)?;
        let (correct, labelled) = be.accuracy(&logits, &labels);
        self.model.zero_grad();
        self.model.backward(&ce.grad)?;
        Ok(BatchOutcome {
            loss: ce.loss as f64,
            correct,
            labelled,
        })
    }

    /// One optimiser step from the current gradients.
    pub fn apply_gradients(&mut self) -> Result<()> {
        Ok(self.opt.step_model(&mut self.model)?)
    }

    /// A full training step: [`Trainer::compute_gradients`] then [`Trainer::apply_gradients`].
    pub fn train_batch(&mut self, p: Prepared, dropout_key: u64) -> Result<BatchOutcome> {
        let out = self.compute_gradients(p, dropout_key)?;
        self.apply_gradients()?;
        Ok(out)
    }

    /// A step that changes nothing: forward and backward of one batch (so its memory peak is
    /// that of a real training step), then the gradients are zeroed and the cached activations
    /// dropped; the optimiser does not step. Guarantee: the parameters and the optimiser state
    /// are exactly as before, so later training is unaffected (PaGraph's trial batch).
    pub fn trial_step(&mut self, p: Prepared, dropout_key: u64) -> Result<BatchOutcome> {
        let out = self.compute_gradients(p, dropout_key);
        self.model.zero_grad();
        self.model.clear_cache();
        out
    }

    /// Bytes of the model's persistent state once training has stepped: parameters, their
    /// gradients and the optimiser's per-parameter state (Adam: two moments), 4 bytes a value.
    pub fn state_bytes(&self) -> u64 {
        let per_value = 2 + self.opt.state_per_param() as u64;
        self.model.num_params() as u64 * 4 * per_value
    }

    /// `(correct, labelled)` predictions of one batch in evaluation mode (no dropout).
    pub fn eval_batch(&mut self, p: Prepared) -> Result<(usize, usize)> {
        let labels = labels(&p)?.to_vec();
        let logits = self.forward(p, Mode::Eval)?;
        Ok(self.model.backend().accuracy(&logits, &labels))
    }

    /// Accuracy (`0..=1`, 0 when nothing is labelled) over every seed of `pipe`, sampled under
    /// [`EVAL_EPOCH`]. The pipeline's stage clocks are reset afterwards.
    pub fn evaluate(&mut self, pipe: &Pipeline) -> Result<f64> {
        let (mut correct, mut labelled) = (0usize, 0usize);
        let be = self.model.backend().clone();
        for p in pipe.epoch(EVAL_EPOCH) {
            let p = p?;
            let (c, l) = run_step(&be, p, |p| self.eval_batch(p))?;
            correct += c;
            labelled += l;
        }
        pipe.take_times();
        Ok(if labelled == 0 {
            0.0
        } else {
            correct as f64 / labelled as f64
        })
    }

    fn snapshot(&self) -> Vec<Tensor> {
        let be = self.model.backend();
        self.model
            .named_params()
            .iter()
            .map(|(_, p)| be.download(&p.value))
            .collect()
    }

    fn restore(&mut self, params: &[Tensor]) {
        let be = self.model.backend().clone();
        for (p, v) in self.model.params_mut().into_iter().zip(params) {
            p.value = be.upload(v);
        }
    }
}

/// Input-layer destinations up to which a step runs through [`Backend::on_compute_threads`].
///
/// Measured on the CPU backend (cnr2000, GraphSAGE 10,25, hidden 256, 2 threads): at batch
/// 1024 (about 3,700 input-layer destinations) moving the step onto a pool worker took the
/// epoch from 0.51-0.67 s to 0.45-0.49 s, since each of its many short kernels otherwise pays
/// a hand-over to the pool; at batch 4096 and 8000 (13,000 and 24,000 destinations) it made
/// the epoch slower (0.44 -> 0.56 s at 8000, with more CPU time: the step's worker waits for
/// stolen halves of long kernels while the sampler holds the other worker), and at 2048 it
/// made no difference. Larger steps therefore call the backend from the trainer's own thread.
pub const COMPUTE_THREAD_STEP_MAX_DST: usize = 8192;

/// Runs `step` (the training or evaluation step of `p`) through
/// [`Backend::on_compute_threads`] when `p`'s input layer has at most
/// [`COMPUTE_THREAD_STEP_MAX_DST`] destinations, else on the calling thread.
fn run_step<B: Backend, R: Send>(
    be: &B,
    p: Prepared,
    step: impl FnOnce(Prepared) -> R + Send,
) -> R {
    let small = p
        .batch
        .blocks
        .first()
        .is_some_and(|b| b.num_dst <= COMPUTE_THREAD_STEP_MAX_DST);
    if small {
        be.on_compute_threads(|| step(p))
    } else {
        step(p)
    }
}

/// How [`fit`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FitConfig {
    /// Epochs to train (at least 1).
    pub epochs: u64,
    /// Evaluate after every `eval_every`-th epoch (and always after the last); 0 = only after
    /// the last.
    pub eval_every: u64,
}

/// Receives progress from [`fit`] (progress bars, logs). Every method has an empty default.
pub trait FitObserver {
    /// A training pass over `batches` batches begins.
    fn epoch_start(&mut self, _epoch: u64, _batches: usize) {}
    /// One training batch is done.
    fn batch_done(&mut self, _outcome: &BatchOutcome) {}
    /// Evaluation of the epoch begins.
    fn eval_start(&mut self, _epoch: u64) {}
    /// The epoch is finished (evaluation included).
    fn epoch_end(&mut self, _metrics: &EpochMetrics) {}
}

impl FitObserver for () {}

/// Trains for `cfg.epochs` epochs over `train`, evaluating on `valid` and `test` (when given)
/// every `cfg.eval_every` epochs and after the last. On return the trainer holds the
/// parameters of the best-validation epoch (the last evaluated one without a validation set),
/// so saving it gives a model whose test accuracy is [`RunMetrics::test_acc`].
pub fn fit<B: Backend>(
    trainer: &mut Trainer<B>,
    train: &Pipeline,
    valid: Option<&Pipeline>,
    test: Option<&Pipeline>,
    cfg: FitConfig,
    obs: &mut dyn FitObserver,
) -> Result<RunMetrics> {
    if cfg.epochs == 0 {
        return Err(ExecError::Invalid("epochs must be at least 1".into()));
    }
    let mut run = RunMetrics::default();
    let mut best: Option<(f64, Vec<Tensor>)> = None;
    train.take_times();
    // The next epoch's stream, started while this epoch's last batch trains, so that its first
    // batches are sampled and extracted behind that step instead of in front of the epoch.
    let mut next: Option<EpochStream> = None;
    for epoch in 0..cfg.epochs {
        obs.epoch_start(epoch, train.num_batches());
        let start = Instant::now();
        let (mut train_s, mut wait_s) = (0.0, 0.0);
        let (mut loss_sum, mut correct, mut labelled) = (0.0, 0usize, 0usize);
        let (mut batches, mut edges, mut inputs) = (0u64, 0u64, 0u64);
        let mut extract = ExtractStats::default();
        let mut stream = next.take().unwrap_or_else(|| train.epoch(epoch));
        let total = stream.len() as u64;
        loop {
            let t = Instant::now();
            let Some(p) = stream.next() else { break };
            wait_s += t.elapsed().as_secs_f64();
            let p = p?;
            if batches + 1 == total && epoch + 1 < cfg.epochs {
                // The last batch of this epoch is in hand: the extract thread is done with
                // the extractor, so the next epoch can start sampling and extracting.
                next = Some(train.epoch(epoch + 1));
            }
            let t = Instant::now();
            edges += p.batch.num_edges() as u64;
            inputs += p.batch.input_nodes.len() as u64;
            extract.add(&p.extract);
            // Dropout is keyed by the batch's own step, so a reordered epoch trains every
            // batch with the mask it would get in sampled order.
            let key = (epoch << 32) | p.batch.key.step;
            let be = trainer.model.backend().clone();
            let out = run_step(&be, p, |p| trainer.train_batch(p, key))?;
            train_s += t.elapsed().as_secs_f64();
            loss_sum += out.loss * out.labelled as f64;
            correct += out.correct;
            labelled += out.labelled;
            batches += 1;
            obs.batch_done(&out);
        }
        drop(stream);
        let wall_s = start.elapsed().as_secs_f64();
        // Busy times of the stages since the last call: with the next epoch started early,
        // its first batches' sampling and extraction count here (they ran in this epoch's
        // wall time). Bytes are summed per batch above, so they belong to their own epoch.
        let (sample_s, extract_s) = train.take_times();
        let frac = |a: f64, b: usize| if b == 0 { 0.0 } else { a / b as f64 };
        let mut m = EpochMetrics {
            epoch,
            wall_s,
            sample_s,
            extract_s,
            train_s,
            wait_s,
            loss: frac(loss_sum, labelled),
            train_acc: frac(correct as f64, labelled),
            batches,
            edges,
            input_nodes: inputs,
            hit_rate: extract.hit_rate(),
            extract,
            ..EpochMetrics::default()
        };
        let last = epoch + 1 == cfg.epochs;
        if last || (cfg.eval_every > 0 && (epoch + 1) % cfg.eval_every == 0) {
            obs.eval_start(epoch);
            let t = Instant::now();
            m.val_acc = valid.map(|v| trainer.evaluate(v)).transpose()?;
            m.test_acc = test.map(|v| trainer.evaluate(v)).transpose()?;
            m.eval_s = t.elapsed().as_secs_f64();
            // Without a validation set, the latest evaluation counts as best.
            let score = m.val_acc.unwrap_or(f64::INFINITY);
            let better = match &best {
                None => true,
                Some((b, _)) => score > *b || score.is_infinite(),
            };
            if better {
                best = Some((score, trainer.snapshot()));
                run.best_epoch = epoch;
                run.best_val_acc = m.val_acc.unwrap_or(0.0);
                run.test_acc = m.test_acc.unwrap_or(0.0);
            }
        }
        obs.epoch_end(&m);
        run.epochs.push(m);
    }
    if let Some((_, params)) = best {
        trainer.restore(&params);
    }
    run.median_epoch_s = RunMetrics::median_epoch_time(&run.epochs);
    Ok(run)
}
