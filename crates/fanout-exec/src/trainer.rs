//! The train stage: one model and its optimiser on one backend, and [`fit`], the epoch loop
//! with periodic evaluation.

use crate::error::{ExecError, Result};
use crate::metrics::{EpochMetrics, RunMetrics, SplitEpoch, WorkerEpochMetrics};
use crate::pipeline::{BatchSource, EpochStream, Prepared, RemoteWork};
use fanout_cache::ExtractStats;
use fanout_comm::Comm;
use fanout_compute::cpu::denormals::FlushDenormals;
use fanout_compute::{Backend, BlockRef, MappedRows, Mode, Model, OptimState, Optimizer, Tensor};
use fanout_graph::Cancel;
use fanout_sample::Block;
use std::sync::Arc;
use std::time::Instant;

mod deferred;

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

/// What [`Trainer::compute_reduced_gradients`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReducedStep {
    /// This worker's own share: its mean loss, correct and labelled seeds.
    pub outcome: BatchOutcome,
    /// Labelled seeds of the step over all workers.
    pub step_labelled: usize,
    /// Seconds spent in the all-reduce (packing and waiting for the others included).
    pub sync_s: f64,
    /// Bytes this worker contributed to it.
    pub sync_bytes: u64,
    /// What the step's batches computed by other workers cost them (none but in
    /// [`Trainer::compute_group_gradients`] with remote batches).
    pub remote: RemoteWork,
}

/// A model with its optimiser on one backend: the train stage of a pipeline. Guarantee: given
/// the same prepared batches in the same order, the parameters after each step are a pure
/// function of the model's initial parameters (deterministic kernels, dropout keyed by step).
pub struct Trainer<B: Backend> {
    model: Model<B>,
    opt: Box<dyn Optimizer<B> + Send>,
    pool: Option<Arc<rayon::ThreadPool>>,
    device_rows: Option<B::Tensor>,
    /// Every feature row in host memory the device reads in place
    /// ([`Trainer::with_mapped_rows`]).
    mapped_rows: Option<MappedRows>,
    /// The cache table on the device ([`Trainer::with_device_cache`]).
    device_cache: Option<B::Tensor>,
    /// The last batch assembled from a [`fanout_cache::CacheSplit`] that Match may reuse: its
    /// split's number and its rows, on the device.
    previous_rows: Option<(u64, B::Tensor)>,
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
        Trainer {
            model,
            opt,
            pool: None,
            device_rows: None,
            mapped_rows: None,
            device_cache: None,
            previous_rows: None,
        }
    }

    /// This trainer with a copy of the extractor's cache in its backend's memory: `table`
    /// holds the cached rows in slot order ([`fanout_cache::Extractor::cache_rows`]) followed by
    /// one row of negative zeros. A batch that comes with a
    /// [`crate::Prepared::cache_split`] ([`crate::Pipeline::with_cache_on_device`]) gets its
    /// input rows gathered from the table (a row the cache does not hold gets the
    /// negative-zero row), then the rows it reuses from the previous batch (Match, kept on the
    /// device) and its uploaded misses added at their positions: `-0.0 + m` is `m` for every
    /// float but a NaN (both zeros included), so finite rows are exactly the stored ones (a
    /// NaN stays a NaN, its payload up to the device). A batch that
    /// reuses rows of a batch this trainer did not assemble just before is an error. With
    /// [`Trainer::with_mapped_rows`] too, a batch that brings no missed rows (from a pipeline
    /// [`crate::Pipeline::with_cache_on_device_misses_mapped`]) has them read by the device
    /// from the mapped rows instead of uploaded.
    pub fn with_device_cache(mut self, table: B::Tensor) -> Self {
        self.device_cache = Some(table);
        self
    }

    /// This trainer with every vertex's feature row in its backend's memory (`rows`: row `v`
    /// is vertex `v`'s features, as f32): a batch that arrives without features (from a
    /// pipeline [`crate::Pipeline::with_rows_on_device`]) gets its input rows gathered there
    /// ([`Backend::gather_rows`]), the same rows the extract stage would have sent.
    pub fn with_device_rows(mut self, rows: B::Tensor) -> Self {
        self.device_rows = Some(rows);
        self
    }

    /// This trainer with every vertex's feature row in host memory that its backend's device
    /// reads in place (`rows`, from [`Backend::map_host_rows`]: row `v` is vertex `v`'s
    /// features, as f32): a batch that arrives without features (from a pipeline
    /// [`crate::Pipeline::with_rows_mapped`]) gets its input rows gathered by the device
    /// ([`Backend::gather_mapped_rows`]), the same rows the extract stage would have sent.
    pub fn with_mapped_rows(mut self, rows: MappedRows) -> Self {
        self.mapped_rows = Some(rows);
        self
    }

    /// This trainer with its steps run on `pool` instead of the global rayon pool (in-process
    /// workers each compute on their own threads).
    pub fn with_pool(mut self, pool: Option<Arc<rayon::ThreadPool>>) -> Self {
        self.pool = pool;
        self
    }

    /// Runs `step` (a training or evaluation step of `p`) where this trainer computes: on its
    /// pool when it has one, else as [`run_step`] decides.
    fn run<R: Send>(&mut self, p: Prepared, step: impl FnOnce(&mut Self, Prepared) -> R + Send) -> R
    where
        B: Send,
    {
        match self.pool.clone() {
            Some(pool) => pool.install(|| step(self, p)),
            None => {
                let be = self.model.backend().clone();
                run_step(&be, p, |p| step(self, p))
            }
        }
    }

    /// Subnormal floats flushed to zero on the threads this trainer computes on (its pool, or
    /// the current rayon pool, and the calling thread) while the guard lives
    /// ([`fanout_compute::cpu::denormals`]).
    pub fn flush_denormals(&self) -> FlushDenormals {
        FlushDenormals::on(self.pool.clone())
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
        let resident = p.batch.resident.0.as_deref();
        let blocks = self
            .model
            .prepare_blocks_from(resident, &block_refs(&p.batch.blocks))?;
        let be = self.model.backend().clone();
        // Dropout is keyed by vertex id, so data-parallel workers drop what the one-worker
        // union batch would.
        let ids = Some(&p.batch.input_nodes[..]);
        // Block 0's destination rows, none where the first layer reads only their aggregate
        // (`InputPlan::reads_dst`; a layer that reads them refuses a wrong count).
        let dst_rows = match p.batch.blocks.first() {
            Some(b) if !p.features.is_empty() => b.num_dst,
            _ => 0,
        };
        if let Some(store) = &p.input_store {
            // The first layer makes the aggregate from the store inside its product.
            let src = store.rows_of(&p.batch)?;
            let x_dst = be.upload_owned(Tensor::new(dst_rows, p.dim, p.features))?;
            return Ok(self
                .model
                .forward_rows_sourced(&blocks, x_dst, &src, mode, ids)?);
        }
        if let Some(agg) = p.input_agg {
            // The aggregate of block 0's destinations (the extract stage aggregated).
            let agg_rows = p.batch.blocks.first().map_or(0, |b| b.num_dst);
            let x_dst = be.upload_owned(Tensor::new(dst_rows, p.dim, p.features))?;
            let agg = be.upload_owned(Tensor::new(agg_rows, p.dim, agg))?;
            return Ok(self
                .model
                .forward_rows_aggregated(&blocks, x_dst, agg, mode, ids)?);
        }
        let rows = p.batch.input_nodes.len();
        if p.cache_split.is_some() && self.device_cache.is_none() {
            return Err(ExecError::Invalid(
                "a batch split for a cache on the device reached a trainer without one \
                 (Trainer::with_device_cache)"
                    .into(),
            ));
        }
        if let (Some(table), Some(split)) = (&self.device_cache, &p.cache_split) {
            let mut x = be.gather_rows(table, &split.slots)?;
            if !split.reused_positions.is_empty() {
                let previous = match &self.previous_rows {
                    Some((seq, rows)) if seq + 1 == split.seq => rows,
                    _ => {
                        return Err(ExecError::Invalid(format!(
                            "batch {} reuses rows of the batch before it, which this trainer \
                             did not assemble (batches out of order)",
                            split.seq
                        )))
                    }
                };
                let reused = be.gather_rows(previous, &split.reused_from)?;
                be.scatter_add_rows(&mut x, &split.reused_positions, &reused)?;
            }
            if !split.miss_positions.is_empty() {
                let m = split.miss_positions.len();
                let misses = match &self.mapped_rows {
                    // Read by the device in place (Pipeline::with_cache_on_device_misses_mapped).
                    Some(all) if p.features.is_empty() && p.dim > 0 => {
                        let ids: Vec<u32> = split
                            .miss_positions
                            .iter()
                            .map(|&i| p.batch.input_nodes[i as usize])
                            .collect();
                        be.gather_mapped_rows(all, &ids, None)?
                    }
                    _ if p.features.len() != m * p.dim => {
                        return Err(ExecError::Invalid(format!(
                            "batch {} misses {m} rows of the device cache but brings {} values \
                             for them (rows of {}){}",
                            split.seq,
                            p.features.len(),
                            p.dim,
                            if self.mapped_rows.is_none() {
                                ", and the trainer reads no rows in place"
                            } else {
                                ""
                            }
                        )))
                    }
                    _ => be.upload_owned(Tensor::new(m, p.dim, p.features))?,
                };
                be.scatter_add_rows(&mut x, &split.miss_positions, &misses)?;
            }
            // Match: the next batch may reuse these rows.
            self.previous_rows = if split.keep {
                Some((split.seq, be.copy(&x)?))
            } else {
                None
            };
            return Ok(self.model.forward_rows(&blocks, x, mode, ids)?);
        }
        let x = match (&self.device_rows, &self.mapped_rows) {
            (Some(all), _) if p.features.is_empty() && rows > 0 => {
                be.gather_input_rows(all, &p.batch.input_nodes, resident)?
            }
            (_, Some(all)) if p.features.is_empty() && rows > 0 => {
                be.gather_mapped_rows(all, &p.batch.input_nodes, resident)?
            }
            _ => be.upload_owned(Tensor::new(rows, p.dim, p.features))?,
        };
        Ok(self.model.forward_rows(&blocks, x, mode, ids)?)
    }

    /// Forward and backward of one batch: the parameter gradients are *replaced* by this
    /// batch's (zeroed first). Split from [`Trainer::apply_gradients`] so that data-parallel
    /// workers can all-reduce gradients in between.
    pub fn compute_gradients(&mut self, p: Prepared, dropout_key: u64) -> Result<BatchOutcome> {
        let out = self.forward_backward(p, dropout_key, |be, logits, labels| {
            let (ce, correct) = be.loss_and_accuracy(logits, labels)?;
            let out = BatchOutcome {
                loss: ce.loss as f64,
                correct,
                labelled: ce.count,
            };
            Ok((ce.grad, out))
        })?;
        Ok(out.unwrap_or_default())
    }

    /// Forward and backward of `p` in training mode, the parameter gradients replaced by its
    /// own: `loss` gives, from the logits and labels, the loss's gradient and what the caller
    /// keeps of the loss. `None` for a batch without seeds (a data-parallel worker's empty
    /// share of a step: no gradient of its own, zeroed, but it still takes part in the
    /// all-reduce and the optimiser step).
    fn forward_backward<R>(
        &mut self,
        p: Prepared,
        dropout_key: u64,
        loss: impl FnOnce(&B, &B::Tensor, &[i64]) -> Result<(B::Tensor, R)>,
    ) -> Result<Option<R>> {
        let labels = labels(&p)?.to_vec();
        if p.batch.num_seeds == 0 {
            self.model.zero_grad()?;
            return Ok(None);
        }
        let logits = self.forward(p, Mode::Train { dropout_key })?;
        let be = self.model.backend().clone();
        let (grad, kept) = loss(&be, &logits, &labels)?;
        self.model.zero_grad()?;
        self.model.backward(&grad)?;
        Ok(Some(kept))
    }

    /// Appends every parameter gradient, multiplied by `scale`, to `out` (parameters in
    /// [`Model::named_params`] order, each row-major). With [`Trainer::set_gradients`] this is
    /// how data-parallel workers all-reduce their gradients. `Err` when the device fails.
    pub fn gradients_into(&self, scale: f32, out: &mut Vec<f32>) -> Result<()> {
        let be = self.model.backend();
        for (_, p) in self.model.named_params() {
            let g = be.download(&p.grad)?;
            out.extend(g.data().iter().map(|v| v * scale));
        }
        Ok(())
    }

    /// A data-parallel worker's share of a step: forward and backward of its batch `p`, then
    /// the all-reduce that leaves on every worker of `comm` the gradient of the mean loss over
    /// the step's labelled seeds of all workers (each worker's mean gradient weighted by its
    /// labelled count, summed in rank order, divided by the global count), which is the
    /// one-worker gradient over the union of the workers' batches up to rounding, provided the
    /// batches were sampled under the same key. `scratch` is reused between steps. On a
    /// backend in a device group ([`Backend::device_group`]) the gradients are summed there,
    /// with the same bits, and never read back. The optimiser does not step.
    pub fn compute_reduced_gradients(
        &mut self,
        p: Prepared,
        dropout_key: u64,
        comm: &dyn Comm,
        scratch: &mut Vec<f32>,
    ) -> Result<ReducedStep>
    where
        B: Send,
    {
        let outcome = self.run(p, |t, p| t.compute_gradients(p, dropout_key))?;
        let start = Instant::now();
        if let Some(group) = self.model.backend().device_group() {
            return self.sum_on_devices(outcome, group, comm, start);
        }
        scratch.clear();
        self.gradients_into(outcome.labelled as f32, scratch)?;
        scratch.push(outcome.labelled as f32);
        comm.all_reduce_sum_f32(scratch)?;
        let step_labelled = scratch.pop().unwrap_or(0.0);
        let scale = if step_labelled > 0.0 {
            1.0 / step_labelled
        } else {
            0.0
        };
        self.set_gradients(scratch, scale)?;
        Ok(ReducedStep {
            outcome,
            step_labelled: step_labelled as usize,
            sync_s: start.elapsed().as_secs_f64(),
            sync_bytes: 4 * (scratch.len() as u64 + 1),
            remote: RemoteWork::default(),
        })
    }

    /// [`Trainer::compute_reduced_gradients`] on a backend that joined a device group
    /// (`group`, its `(rank, size)`): the labelled count is summed through `comm` (one value)
    /// and the gradients over the group on the devices ([`Backend::sum_over_group`]), with
    /// the host path's scales, so the result is the host path's bit for bit and no gradient
    /// is read back. The step's `sync_s` is the host's part only (the count's sum and queuing
    /// the device's work): the device sums behind it, as it computes.
    fn sum_on_devices(
        &mut self,
        outcome: BatchOutcome,
        group: (usize, usize),
        comm: &dyn Comm,
        start: Instant,
    ) -> Result<ReducedStep> {
        if group != (comm.rank(), comm.size()) {
            return Err(ExecError::Invalid(format!(
                "the backend's device group has rank {} of {}, the communicator rank {} of {}",
                group.0,
                group.1,
                comm.rank(),
                comm.size()
            )));
        }
        let mut count = [outcome.labelled as f32];
        comm.all_reduce_sum_f32(&mut count)?;
        let step_labelled = count[0];
        let scale = if step_labelled > 0.0 {
            1.0 / step_labelled
        } else {
            0.0
        };
        let be = self.model.backend().clone();
        let mut grads: Vec<&mut B::Tensor> = self
            .model
            .params_mut()
            .into_iter()
            .map(|p| &mut p.grad)
            .collect();
        be.sum_over_group(&mut grads, outcome.labelled as f32, scale)?;
        Ok(ReducedStep {
            outcome,
            step_labelled: step_labelled as usize,
            sync_s: start.elapsed().as_secs_f64(),
            sync_bytes: 4 * (self.model.num_params() as u64 + 1),
            remote: RemoteWork::default(),
        })
    }

    /// One step made of several batches of this worker (a factored trainer's slices of a
    /// step, some perhaps computed by a standby worker through `src`): the gradients of the
    /// local batches and the remote results are summed, weighted by labelled seeds, then
    /// all-reduced over `comm` and divided by the step's labelled count, as
    /// [`Trainer::compute_reduced_gradients`] does for one batch. The result equals that of a
    /// data-parallel step whose workers held these batches, up to rounding. The optimiser
    /// does not step. `outcome` sums this worker's batches (remote ones included).
    pub fn compute_group_gradients(
        &mut self,
        group: Vec<Prepared>,
        dropout_key: u64,
        src: &dyn BatchSource,
        comm: &dyn Comm,
        scratch: &mut Vec<f32>,
    ) -> Result<ReducedStep>
    where
        B: Send,
    {
        let (remote, local): (Vec<Prepared>, Vec<Prepared>) =
            group.into_iter().partition(|p| p.remote.is_some());
        if !remote.is_empty() {
            let params = self.parameters()?;
            for p in &remote {
                src.remote_start(p, &params)?;
            }
        }
        let n = self.model.num_params();
        let mut acc = vec![0f32; n];
        let (mut loss_sum, mut correct, mut labelled) = (0f64, 0usize, 0usize);
        let add = |acc: &mut Vec<f32>, g: &[f32]| -> Result<()> {
            if g.len() != n {
                return Err(ExecError::Invalid(format!(
                    "a gradient of {} values for a model of {n} parameters",
                    g.len()
                )));
            }
            acc.iter_mut().zip(g).for_each(|(a, b)| *a += b);
            Ok(())
        };
        for p in local {
            let o = self.run(p, |t, p| t.compute_gradients(p, dropout_key))?;
            scratch.clear();
            self.gradients_into(o.labelled as f32, scratch)?;
            add(&mut acc, scratch)?;
            loss_sum += o.loss * o.labelled as f64;
            correct += o.correct;
            labelled += o.labelled;
        }
        let mut work = RemoteWork::default();
        for p in &remote {
            let r = src.remote_finish(p)?;
            add(&mut acc, &r.gradient)?;
            loss_sum += r.loss_sum;
            correct += r.correct;
            labelled += r.labelled;
            work.add(&r.work);
        }
        let start = Instant::now();
        acc.push(labelled as f32);
        // Summed on the host even on a backend in a device group: only data-parallel joins
        // one, and its steps take `compute_reduced_gradients`, so every rank sums the same way.
        if comm.size() > 1 {
            comm.all_reduce_sum_f32(&mut acc)?;
        }
        let step_labelled = acc.pop().unwrap_or(0.0);
        let scale = if step_labelled > 0.0 {
            1.0 / step_labelled
        } else {
            0.0
        };
        self.set_gradients(&acc, scale)?;
        Ok(ReducedStep {
            outcome: BatchOutcome {
                loss: if labelled > 0 {
                    loss_sum / labelled as f64
                } else {
                    0.0
                },
                correct,
                labelled,
            },
            step_labelled: step_labelled as usize,
            sync_s: start.elapsed().as_secs_f64(),
            sync_bytes: 4 * (acc.len() as u64 + 1),
            remote: work,
        })
    }

    /// A split-parallel worker's share of a step ([`crate::split::step`] on
    /// [`Prepared::split`], on this trainer's thread pool): afterwards every worker holds the
    /// one-worker gradient of the step's batch. The optimiser does not step. `Err` if `p` is
    /// not a split share.
    pub fn compute_split_gradients(
        &mut self,
        mut p: Prepared,
        dropout_key: u64,
        comm: &dyn Comm,
    ) -> Result<crate::split::SplitStep>
    where
        B: Send,
    {
        let share = p
            .split
            .take()
            .ok_or_else(|| ExecError::Invalid("a batch without a split share".into()))?;
        self.run(p, |t, p| {
            crate::split::step(t, &share, p.features, p.dim, comm, dropout_key)
        })
    }

    /// Replaces every parameter value by the matching run of `flat` (the layout of
    /// [`Trainer::parameters`]); a standby worker takes a trainer's parameters this way.
    /// `Err` if `flat`'s length is not the model's parameter count.
    pub fn set_parameters(&mut self, flat: &[f32]) -> Result<()> {
        let n = self.model.num_params();
        if flat.len() != n {
            return Err(ExecError::Invalid(format!(
                "{} parameter values for a model of {n} parameters",
                flat.len()
            )));
        }
        let be = self.model.backend().clone();
        let mut at = 0;
        for p in self.model.params_mut() {
            let (r, c) = be.shape(&p.value);
            p.value = be.upload_owned(Tensor::new(r, c, flat[at..at + r * c].to_vec()))?;
            at += r * c;
        }
        Ok(())
    }

    /// Replaces every parameter gradient by the matching run of `flat` (the layout of
    /// [`Trainer::gradients_into`]) multiplied by `scale`. `Err` if `flat`'s length is not the
    /// model's parameter count.
    pub fn set_gradients(&mut self, flat: &[f32], scale: f32) -> Result<()> {
        let n = self.model.num_params();
        if flat.len() != n {
            return Err(ExecError::Invalid(format!(
                "{} gradient values for a model of {n} parameters",
                flat.len()
            )));
        }
        let be = self.model.backend().clone();
        let mut at = 0;
        for p in self.model.params_mut() {
            let (r, c) = be.shape(&p.grad);
            let v: Vec<f32> = flat[at..at + r * c].iter().map(|v| v * scale).collect();
            at += r * c;
            p.grad = be.upload_owned(Tensor::new(r, c, v))?;
        }
        Ok(())
    }

    /// The parameters' values, flattened in [`Trainer::gradients_into`]'s layout (to check
    /// that replicas agree, or to broadcast them). `Err` when the device fails.
    pub fn parameters(&self) -> Result<Vec<f32>> {
        let be = self.model.backend();
        let mut out = Vec::with_capacity(self.model.num_params());
        for (_, p) in self.model.named_params() {
            out.extend_from_slice(be.download(&p.value)?.data());
        }
        Ok(out)
    }

    /// One optimiser step from the current gradients.
    pub fn apply_gradients(&mut self) -> Result<()> {
        Ok(self.opt.step_model(&mut self.model)?)
    }

    /// [`Trainer::apply_gradients`] on this trainer's pool, when it has one.
    fn run_apply(&mut self) -> Result<()>
    where
        B: Send,
    {
        match self.pool.clone() {
            Some(pool) => pool.install(|| self.apply_gradients()),
            None => self.apply_gradients(),
        }
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
        self.model.zero_grad()?;
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
        Ok(self.model.backend().accuracy(&logits, &labels)?)
    }

    /// Accuracy (`0..=1`, 0 when nothing is labelled) over every seed of `pipe`, sampled under
    /// [`EVAL_EPOCH`]. The pipeline's stage clocks are reset afterwards.
    pub fn evaluate(&mut self, pipe: &dyn BatchSource) -> Result<f64>
    where
        B: Send,
    {
        let (correct, labelled) = self.evaluate_counts(pipe)?;
        Ok(ratio(correct as f64, labelled as f64))
    }

    /// `(correct, labelled)` over every seed of `pipe` (see [`Trainer::evaluate`]); workers
    /// that evaluate slices of a set sum these. On a backend that defers reads, each batch's
    /// count is read after the next batch is queued (`deferred.rs`); the counts are the same.
    pub fn evaluate_counts(&mut self, pipe: &dyn BatchSource) -> Result<(usize, usize)>
    where
        B: Send,
    {
        // The same arithmetic as evaluations inside `fit_with` (a saved model scores what its
        // run reported).
        let _flush = self.flush_denormals();
        let late = self.model.backend().defers_reads();
        let (mut correct, mut labelled) = (0usize, 0usize);
        let mut add = |(c, l): (usize, usize)| {
            correct += c;
            labelled += l;
        };
        let mut queued: Option<deferred::QueuedEval> = None;
        for p in pipe.epoch(EVAL_EPOCH) {
            let p = p?;
            if p.batch.num_seeds == 0 {
                continue;
            }
            if late {
                let next = self.run(p, |t, p| t.queue_eval(p))?;
                if let Some(q) = queued.replace(next) {
                    add(self.finish_eval(q)?);
                }
            } else {
                add(self.run(p, |t, p| t.eval_batch(p))?);
            }
        }
        if let Some(q) = queued {
            add(self.finish_eval(q)?);
        }
        pipe.take_times();
        Ok((correct, labelled))
    }

    /// What is not finite after a step's forward and backward: `loss` (the step's mean loss)
    /// or a parameter gradient, named, with its first bad value; `None` when all are finite.
    /// `Err` when the device fails.
    pub fn non_finite(&self, loss: f64) -> Result<Option<String>> {
        if !loss.is_finite() {
            return Ok(Some(loss_not_finite(loss)));
        }
        let be = self.model.backend();
        let params = self.model.named_params();
        // One check of every gradient (one read on a device); which one is bad only when one is.
        if be.all_finite(&params.iter().map(|(_, p)| &p.grad).collect::<Vec<_>>())? {
            return Ok(None);
        }
        for (name, p) in params {
            let g = be.download(&p.grad)?;
            if let Some(&v) = g.data().iter().find(|v| !v.is_finite()) {
                return Ok(Some(gradient_not_finite(&name, v)));
            }
        }
        Ok(None)
    }

    /// A copy of the optimiser's state (for a resumable checkpoint); `Err` when the device
    /// fails.
    pub fn optimizer_state(&self) -> Result<OptimState> {
        Ok(self.opt.export_state()?)
    }

    /// Replaces the optimiser's state (from [`Trainer::optimizer_state`] of a trainer over the
    /// same model).
    pub fn set_optimizer_state(&mut self, state: OptimState) -> Result<()> {
        Ok(self.opt.import_state(state)?)
    }

    /// The parameters' values on the host, in [`Model::named_params`] order; `Err` when the
    /// device fails.
    pub fn snapshot(&self) -> Result<Vec<Tensor>> {
        let be = self.model.backend();
        let params = self.model.named_params();
        let host = params.iter().map(|(_, p)| be.download(&p.value));
        Ok(host.collect::<std::result::Result<_, _>>()?)
    }

    /// Replaces the parameters' values by `params` (from [`Trainer::snapshot`] of a trainer
    /// over the same model). `Err` when the device fails.
    pub fn restore(&mut self, params: &[Tensor]) -> Result<()> {
        let be = self.model.backend().clone();
        for (p, v) in self.model.params_mut().into_iter().zip(params) {
            p.value = be.upload(v)?;
        }
        Ok(())
    }
}

/// [`ExecError::NonFinite`]'s `what` for a loss that is not finite.
fn loss_not_finite(loss: f64) -> String {
    format!("the loss ({loss})")
}

/// [`ExecError::NonFinite`]'s `what` for parameter `name`'s gradient holding `value`.
fn gradient_not_finite(name: &str, value: f32) -> String {
    format!("the gradient of {name} ({value})")
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
    /// A line of information for the user (the run's set-up, the cache built).
    fn note(&mut self, _line: &str) {}
}

impl FitObserver for () {}

/// The best-validation model [`fit`] keeps, as it stands after some epoch.
#[derive(Clone, Debug, PartialEq)]
pub struct BestState {
    /// Its validation accuracy (`None` without a validation set: the latest evaluation wins).
    pub val_acc: Option<f64>,
    /// The epoch it was evaluated after.
    pub epoch: u64,
    /// Its test accuracy (0 without a test set).
    pub test_acc: f64,
    /// Its parameters, in [`Model::named_params`] order.
    pub params: Vec<Tensor>,
}

/// Everything a run's later epochs depend on, after `epochs_done` epochs: a resumed run given
/// this state trains exactly as the uninterrupted run would have (sampling, shuffling and
/// dropout are keyed by the run's seed, the epoch and the step, so they need no state).
#[derive(Clone, Debug, PartialEq)]
pub struct FitState {
    /// Epochs finished.
    pub epochs_done: u64,
    /// The current parameters (not the best ones), in [`Model::named_params`] order.
    pub params: Vec<Tensor>,
    /// The optimiser's state.
    pub optim: OptimState,
    /// The best-validation model so far; `None` before the first evaluation.
    pub best: Option<BestState>,
}

/// What [`fit_with`] adds to [`fit`]: cancellation, a state to resume from, and a hook that
/// receives the state after every epoch (to write checkpoints).
#[derive(Default)]
pub struct FitControl<'a> {
    /// Checked before every step and after every epoch; once cancelled, [`fit_with`] returns
    /// [`ExecError::Interrupted`] without taking another step.
    pub cancel: Option<&'a Cancel>,
    /// Continue from this state: its parameters and optimiser state replace the trainer's,
    /// and training starts at epoch `epochs_done` (which must be below the config's epochs).
    pub resume: Option<FitState>,
    /// Called with the state after every finished epoch (evaluation included); an `Err`
    /// stops the run.
    #[allow(clippy::type_complexity)]
    pub on_epoch: Option<&'a mut dyn FnMut(&FitState) -> Result<()>>,
    /// This machine's rates ([`crate::floor`]): with them, every epoch reports its compute and
    /// memory floors.
    pub rates: Option<fanout_compute::MachineRates>,
}

/// Trains for `cfg.epochs` epochs over `train`, evaluating on `valid` and `test` (when given)
/// every `cfg.eval_every` epochs and after the last. On return the trainer holds the
/// parameters of the best-validation epoch (the last evaluated one without a validation set),
/// so saving it gives a model whose test accuracy is [`RunMetrics::test_acc`].
///
/// `comm` joins the workers of a data-parallel run (a one-member group for one worker).
/// With several workers, every step's gradients are weighted by each worker's labelled seeds,
/// summed across workers in rank order and divided by the step's global labelled count, and
/// every worker then takes the same optimiser step, so the replicas stay bit-identical and a
/// step equals the one-worker step over the union of the workers' batches (up to rounding).
/// Losses, accuracies and evaluation counts are summed the same way, so every worker returns
/// the same [`RunMetrics`]; [`EpochMetrics::workers`] holds each worker's own times. Every
/// worker must see the same number of batches per epoch.
pub fn fit<B: Backend + Send>(
    trainer: &mut Trainer<B>,
    train: &dyn BatchSource,
    valid: Option<&dyn BatchSource>,
    test: Option<&dyn BatchSource>,
    cfg: FitConfig,
    comm: &dyn Comm,
    obs: &mut dyn FitObserver,
) -> Result<RunMetrics> {
    let ctl = FitControl::default();
    fit_with(trainer, train, valid, test, cfg, comm, obs, ctl)
}

/// [`fit`] under `ctl` (see [`FitControl`]). Besides, every step's loss and gradients are
/// checked: the first non-finite one stops the run with [`ExecError::NonFinite`] before the
/// optimiser applies it. Until it returns, the calling thread and the trainer's pool flush
/// subnormal floats to zero ([`Trainer::flush_denormals`]); each gets its own setting back.
/// [`RunMetrics::epochs`] lists the epochs this call trained; the best model and its
/// accuracies may come from `ctl.resume`.
#[allow(clippy::too_many_arguments)]
pub fn fit_with<B: Backend + Send>(
    trainer: &mut Trainer<B>,
    train: &dyn BatchSource,
    valid: Option<&dyn BatchSource>,
    test: Option<&dyn BatchSource>,
    cfg: FitConfig,
    comm: &dyn Comm,
    obs: &mut dyn FitObserver,
    mut ctl: FitControl<'_>,
) -> Result<RunMetrics> {
    if cfg.epochs == 0 {
        return Err(ExecError::Invalid("epochs must be at least 1".into()));
    }
    let workers = comm.size();
    let mut run = RunMetrics::default();
    let mut best: Option<(f64, Vec<Tensor>)> = None;
    // The best model's validation accuracy, for the state handed to `ctl.on_epoch`.
    let mut best_val: Option<f64> = None;
    let mut first_epoch = 0;
    if let Some(state) = ctl.resume.take() {
        if state.epochs_done >= cfg.epochs {
            return Err(ExecError::Invalid(format!(
                "the run to resume has already trained {} epochs; ask for more epochs than that",
                state.epochs_done
            )));
        }
        trainer.restore(&state.params)?;
        trainer.set_optimizer_state(state.optim)?;
        if let Some(b) = state.best {
            run.best_epoch = b.epoch;
            run.best_val_acc = b.val_acc.unwrap_or(0.0);
            run.test_acc = b.test_acc;
            best_val = b.val_acc;
            best = Some((b.val_acc.unwrap_or(f64::INFINITY), b.params));
        }
        first_epoch = state.epochs_done;
    }
    let interrupted = |epoch: u64, step: u64| ExecError::Interrupted {
        epoch,
        step,
        checkpoint: None,
    };
    train.take_times();
    // Late in training, gradients shrink into subnormal floats, on which x86 cores compute
    // several times slower (docs/performance.md); flushed to zero, as TensorFlow does, until
    // this call returns.
    let _flush = trainer.flush_denormals();
    let mut grads: Vec<f32> = Vec::new();
    // A backend whose reads wait for its queue reads each one-worker step's figures after
    // queueing the next step (`deferred.rs`); the gate stops its optimiser on the device.
    let mut gate = if workers == 1 && trainer.model.backend().defers_reads() {
        Some(trainer.new_gate()?)
    } else {
        None
    };
    // The next epoch's stream, started while this epoch's last batch trains, so that its first
    // batches are sampled and extracted behind that step instead of in front of the epoch.
    let mut next: Option<EpochStream> = None;
    for epoch in first_epoch..cfg.epochs {
        obs.epoch_start(epoch, train.num_batches());
        let start = Instant::now();
        let flops_start = fanout_compute::cpu::gemm::nominal_flops();
        let skipped_start = fanout_compute::cpu::gemm::skipped_flops();
        let (mut train_s, mut wait_s) = (0.0, 0.0);
        let (mut loss_sum, mut correct, mut labelled) = (0.0, 0usize, 0usize);
        let (mut batches, mut edges, mut inputs) = (0u64, 0u64, 0u64);
        let (mut sync_s, mut sync_bytes) = (0.0, 0u64);
        let mut extract = ExtractStats::default();
        // Batches trained for this worker by others (a factored run's standby samplers).
        let mut remote = RemoteWork::default();
        let mut split: Option<SplitEpoch> = None;
        let mut stream = next.take().unwrap_or_else(|| train.epoch(epoch));
        let total = stream.len() as u64;
        let per_step = train.items_per_step().max(1);
        let mut taken = 0u64;
        // The step queued last, its figures not read yet (a backend that defers reads).
        let mut queued: Option<deferred::QueuedStep> = None;
        let mut add = |out: &BatchOutcome, obs: &mut dyn FitObserver| {
            loss_sum += out.loss * out.labelled as f64;
            correct += out.correct;
            labelled += out.labelled;
            obs.batch_done(out);
        };
        loop {
            if ctl.cancel.is_some_and(Cancel::is_cancelled) {
                if let Some(q) = queued.take() {
                    add(&trainer.finish_step(q)?, obs);
                }
                return Err(interrupted(epoch, batches));
            }
            let t = Instant::now();
            let mut group = Vec::with_capacity(per_step);
            for p in stream.by_ref() {
                match p {
                    Ok(p) => group.push(p),
                    Err(e) => {
                        // The step queued before is read first: its outcome is reported, and
                        // a non-finite one is the error.
                        if let Some(q) = queued.take() {
                            add(&trainer.finish_step(q)?, obs);
                        }
                        return Err(e);
                    }
                }
                if group.len() == per_step {
                    break;
                }
            }
            wait_s += t.elapsed().as_secs_f64();
            if group.is_empty() {
                break;
            }
            taken += group.len() as u64;
            if taken == total && epoch + 1 < cfg.epochs {
                // The last batch of this epoch is in hand: the extract thread is done with
                // the extractor, so the next epoch can start sampling and extracting.
                next = Some(train.epoch(epoch + 1));
            }
            let t = Instant::now();
            for p in &group {
                edges += p.batch.num_edges() as u64;
                inputs += p.batch.input_nodes.len() as u64;
                extract.add(&p.extract);
            }
            // Dropout is keyed by the batch's own step, so a reordered epoch trains every
            // batch with the mask it would get in sampled order.
            let key = (epoch << 32) | group[0].batch.key.step;
            let step = batches;
            let lr = trainer.opt.lr();
            let non_finite = |what: String| ExecError::NonFinite {
                epoch,
                step,
                what,
                lr,
                checkpoint: None,
            };
            let late = gate.is_some()
                && group.len() == 1
                && group[0].remote.is_none()
                && group[0].split.is_none();
            if !late {
                // A step read at once follows: the one queued before it is read first, so
                // outcomes are added in step order.
                if let Some(q) = queued.take() {
                    add(&trainer.finish_step(q)?, obs);
                }
            }
            let out = if let (Some(gate), true) = (gate.as_mut(), late) {
                let p = group.pop().expect("one batch");
                let at = (epoch, step, lr);
                let q = match trainer.run(p, |t, p| t.queue_step(p, key, gate, at)) {
                    Ok(q) => q,
                    Err(e) => {
                        if let Some(before) = queued.take() {
                            add(&trainer.finish_step(before)?, obs);
                        }
                        return Err(e);
                    }
                };
                // The step before this one, read now that this one is queued behind it.
                match queued.replace(q) {
                    Some(before) => Some(trainer.finish_step(before)?),
                    None => None,
                }
            } else if group[0].split.is_some() {
                let p = group.pop().expect("one batch");
                let s = trainer.compute_split_gradients(p, key, comm)?;
                edges += s.local_edges + s.remote_edges;
                split.get_or_insert_with(SplitEpoch::default).add(&s);
                sync_s += s.allreduce_s;
                sync_bytes += s.allreduce_bytes;
                // Every worker holds the step's gradient, so all stop at the same step.
                if let Some(bad) = trainer.non_finite(s.step.loss)? {
                    return Err(non_finite(bad));
                }
                trainer.run_apply()?;
                Some(s.mine)
            } else if workers == 1 && group.len() == 1 && group[0].remote.is_none() {
                let p = group.pop().expect("one batch");
                let (out, bad) = trainer.run(p, |t, p| -> Result<_> {
                    let out = t.compute_gradients(p, key)?;
                    if let Some(bad) = t.non_finite(out.loss)? {
                        return Ok((out, Some(bad)));
                    }
                    t.apply_gradients()?;
                    Ok((out, None))
                })?;
                if let Some(bad) = bad {
                    return Err(non_finite(bad));
                }
                Some(out)
            } else {
                let r = if group.len() == 1 && group[0].remote.is_none() {
                    let p = group.pop().expect("one batch");
                    trainer.compute_reduced_gradients(p, key, comm, &mut grads)?
                } else {
                    trainer.compute_group_gradients(group, key, train, comm, &mut grads)?
                };
                sync_s += r.sync_s;
                sync_bytes += r.sync_bytes;
                remote.add(&r.remote);
                // The gradients are the all-reduced ones, the same on every worker, so every
                // worker stops at the same step; a worker's own non-finite loss stops it alone
                // (the others learn of it through the communicator).
                if let Some(bad) = trainer.non_finite(r.outcome.loss)? {
                    return Err(non_finite(bad));
                }
                trainer.run_apply()?;
                Some(r.outcome)
            };
            train_s += t.elapsed().as_secs_f64();
            batches += 1;
            if let Some(out) = out {
                add(&out, obs);
            }
        }
        if let Some(q) = queued.take() {
            let t = Instant::now();
            add(&trainer.finish_step(q)?, obs);
            train_s += t.elapsed().as_secs_f64();
        }
        drop(stream);
        let mut wall_s = start.elapsed().as_secs_f64();
        let mut gemm_flops = fanout_compute::cpu::gemm::nominal_flops() - flops_start;
        let mut gemm_flops_skipped = fanout_compute::cpu::gemm::skipped_flops() - skipped_start;
        // Batches others trained for this worker count as its own: their edges, inputs and
        // bytes, and their products where this process's counters did not see them.
        edges += remote.edges;
        inputs += remote.input_nodes;
        extract.add(&remote.extract);
        if !shares_flop_counters(comm) {
            gemm_flops += remote.gemm_flops;
            gemm_flops_skipped += remote.gemm_flops_skipped;
        }
        let mut floor_bytes = extract.bytes_from_host;
        // Busy times of the stages since the last call: with the next epoch started early,
        // its first batches' sampling and extraction count here (they ran in this epoch's
        // wall time). Bytes are summed per batch above, so they belong to their own epoch.
        let (sample_s, extract_s) = train.take_times();
        let mine = WorkerEpochMetrics {
            rank: comm.rank(),
            wall_s,
            sample_s,
            extract_s,
            train_s,
            wait_s,
            allreduce_s: sync_s,
            allreduce_bytes: sync_bytes,
            batches,
            seeds: labelled as u64,
            edges,
            input_nodes: inputs,
            bytes_from_host: extract.bytes_from_host,
            hit_rate: extract.hit_rate(),
            extract,
            split: split.clone(),
        };
        let mut per_worker = Vec::new();
        if workers > 1 {
            let mut sums = [loss_sum, correct as f64, labelled as f64];
            comm.all_reduce_sum_f64(&mut sums)?;
            loss_sum = sums[0];
            correct = sums[1] as usize;
            labelled = sums[2] as usize;
            per_worker = gather_workers(comm, &mine)?;
            // The epoch lasts as long as its slowest worker.
            wall_s = per_worker.iter().map(|w| w.wall_s).fold(wall_s, f64::max);
            // Workers in one process share its flop counters, so the compute floor is the
            // whole group's products at the rate of all its threads; the memory floor then
            // takes the whole group's bytes too. Under MPI both are this process's own.
            if shares_flop_counters(comm) {
                floor_bytes = per_worker.iter().map(|w| w.bytes_from_host).sum();
            }
        }
        let memory_floor_s = ctl.rates.map(|r| r.memory_floor_s(floor_bytes));
        let mut m = EpochMetrics {
            epoch,
            wall_s,
            sample_s,
            extract_s,
            train_s,
            wait_s,
            loss: ratio(loss_sum, labelled as f64),
            train_acc: ratio(correct as f64, labelled as f64),
            batches,
            seeds: labelled as u64,
            edges,
            input_nodes: inputs,
            hit_rate: extract.hit_rate(),
            extract,
            allreduce_s: sync_s,
            allreduce_bytes: sync_bytes,
            workers: per_worker,
            gemm_flops,
            gemm_flops_skipped,
            compute_floor_s: ctl.rates.map(|r| r.compute_floor_s(gemm_flops)),
            // Saturating: the two process-wide counters are read one after the other while
            // other in-process workers may be multiplying.
            performed_floor_s: ctl
                .rates
                .map(|r| r.compute_floor_s(gemm_flops.saturating_sub(gemm_flops_skipped))),
            memory_floor_s,
            split,
            ..EpochMetrics::default()
        };
        let last = epoch + 1 == cfg.epochs;
        if last || (cfg.eval_every > 0 && (epoch + 1) % cfg.eval_every == 0) {
            obs.eval_start(epoch);
            let t = Instant::now();
            let mut acc = |set: Option<&dyn BatchSource>| -> Result<Option<f64>> {
                let Some(set) = set else { return Ok(None) };
                let (c, l) = trainer.evaluate_counts(set)?;
                let mut counts = [c as f64, l as f64];
                if workers > 1 {
                    comm.all_reduce_sum_f64(&mut counts)?;
                }
                Ok(Some(ratio(counts[0], counts[1])))
            };
            m.val_acc = acc(valid)?;
            m.test_acc = acc(test)?;
            m.eval_s = t.elapsed().as_secs_f64();
            // Without a validation set, the latest evaluation counts as best.
            let score = m.val_acc.unwrap_or(f64::INFINITY);
            let better = match &best {
                None => true,
                Some((b, _)) => score > *b || score.is_infinite(),
            };
            if better {
                best = Some((score, trainer.snapshot()?));
                run.best_epoch = epoch;
                run.best_val_acc = m.val_acc.unwrap_or(0.0);
                run.test_acc = m.test_acc.unwrap_or(0.0);
                best_val = m.val_acc;
            }
        }
        obs.epoch_end(&m);
        run.epochs.push(m);
        if let Some(hook) = ctl.on_epoch.as_mut() {
            let state = FitState {
                epochs_done: epoch + 1,
                params: trainer.snapshot()?,
                optim: trainer.optimizer_state()?,
                best: best.as_ref().map(|(_, params)| BestState {
                    val_acc: best_val,
                    epoch: run.best_epoch,
                    test_acc: run.test_acc,
                    params: params.clone(),
                }),
            };
            hook(&state)?;
        }
        if epoch + 1 < cfg.epochs && ctl.cancel.is_some_and(Cancel::is_cancelled) {
            return Err(interrupted(epoch + 1, 0));
        }
    }
    if let Some((_, params)) = best {
        trainer.restore(&params)?;
    }
    run.median_epoch_s = RunMetrics::median_epoch_time(&run.epochs);
    run.rates = ctl.rates;
    Ok(run)
}

/// `a / b`, 0 when `b` is 0.
fn ratio(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        0.0
    } else {
        a / b
    }
}

/// Whether the workers of `comm` run in this process, so that the process-wide flop counters
/// ([`fanout_compute::cpu::gemm::nominal_flops`]) count every worker's products (under MPI
/// each process counts its own).
fn shares_flop_counters(comm: &dyn Comm) -> bool {
    comm.kind() == "local"
}

/// Every worker's epoch figures, in rank order (an all-gather of their JSON).
fn gather_workers(comm: &dyn Comm, mine: &WorkerEpochMetrics) -> Result<Vec<WorkerEpochMetrics>> {
    let bytes = serde_json::to_vec(mine).map_err(|e| ExecError::Invalid(e.to_string()))?;
    comm.all_gather(&bytes)?
        .iter()
        .map(|b| {
            serde_json::from_slice(b).map_err(|e| {
                ExecError::Invalid(format!("a worker sent unreadable epoch metrics: {e}"))
            })
        })
        .collect()
}
