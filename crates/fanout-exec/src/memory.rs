//! Device memory for PaGraph's cache sizing: the [`MemoryProbe`] interface a backend implements
//! and [`measure_trial_batch`], which runs one training step and measures its peak.
//!
//! PaGraph sizes its static feature cache after a first mini-batch: cache bytes = device
//! memory - the peak used by a training step - slack - prefetch buffers. The trainer only talks
//! to a [`MemoryProbe`]: on the CPU backend the binary implements it with a counting global
//! allocator (the "device" is the host heap; memory-mapped dataset files are the host store and
//! are not counted), a CUDA backend would read `cuMemGetInfo` and its allocator's peak.

use crate::error::{ExecError, Result};
use crate::pipeline::{PipelineConfig, Prepared};
use crate::trainer::Trainer;
use fanout_cache::Extractor;
use fanout_compute::Backend;
use fanout_sample::{epoch_batches, BatchKey, LoaderConfig, MiniBatch, Sampler};
use std::sync::Arc;

/// Measures the memory of the device training runs on. Implementations must count every
/// allocation of the device made by any thread (sampling and kernels run on thread pools).
pub trait MemoryProbe {
    /// What is measured, for messages ("host heap", "cuda:0").
    fn name(&self) -> String;
    /// Memory the device offers training when the user sets no budget (CPU: `MemAvailable`
    /// of `/proc/meminfo`; CUDA: free memory from `cuMemGetInfo`). The error says why it
    /// cannot be known and is shown to the user.
    fn available(&self) -> std::result::Result<u64, String>;
    /// Starts a measurement: returns the bytes in use now and restarts the peak from them.
    fn reset_peak(&self) -> u64;
    /// The most bytes in use at any moment since the last [`MemoryProbe::reset_peak`].
    fn peak(&self) -> u64;
}

/// What [`measure_trial_batch`] measured. All figures are bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TrialMemory {
    /// Peak growth of device memory during the trial step (sample, extract, forward,
    /// backward) over the bytes in use when it started.
    pub step_peak: u64,
    /// The model's persistent state ([`Trainer::state_bytes`]: parameters, gradients and
    /// optimiser state, which the first real step allocates).
    pub model_state: u64,
    /// Heap bytes of the trial's sampled batch (blocks, input nodes, labels).
    pub batch_bytes: u64,
    /// Bytes of its extracted feature matrix (input nodes x dim x 4).
    pub feature_bytes: u64,
    /// Input nodes of the trial batch.
    pub input_nodes: u64,
}

impl TrialMemory {
    /// The trial batch's peak device memory: `step_peak + model_state`.
    pub fn peak(&self) -> u64 {
        self.step_peak + self.model_state
    }

    /// Bytes of the batches a pipeline configured by `cfg` holds besides the one being
    /// trained (PaGraph's prefetch buffers), assuming every batch is as large as the trial's:
    /// `sampled x batch_bytes + prepared x (batch_bytes + feature_bytes)` with
    /// `(sampled, prepared) = cfg.batches_in_flight()`.
    pub fn queued_bytes(&self, cfg: &PipelineConfig) -> u64 {
        let (sampled, prepared) = cfg.batches_in_flight();
        sampled as u64 * self.batch_bytes
            + prepared as u64 * (self.batch_bytes + self.feature_bytes)
    }
}

/// Heap bytes of a sampled mini-batch's arrays (lengths, not capacities, so the figure is a
/// pure function of the batch).
pub fn minibatch_bytes(b: &MiniBatch) -> u64 {
    let blocks: usize = b
        .blocks
        .iter()
        .map(|k| 4 * (k.indptr.len() + k.indices.len() + k.weights.as_ref().map_or(0, Vec::len)))
        .sum();
    (blocks + 4 * b.input_nodes.len() + 8 * b.labels.as_ref().map_or(0, Vec::len)) as u64
}

/// PaGraph's trial batch: samples the first training batch of epoch 0 (the batch the run's
/// first step trains, under the same key), extracts it with `extractor`, runs forward and
/// backward with [`Trainer::trial_step`] (no optimiser step) and returns its memory as `probe`
/// measured it. Guarantees: the trainer's parameters and optimiser state are unchanged, so the
/// run that follows trains exactly as without the trial; errors on an empty seed set or a
/// failed step.
pub fn measure_trial_batch<B: Backend>(
    trainer: &mut Trainer<B>,
    sampler: &Arc<dyn Sampler>,
    extractor: &mut dyn Extractor,
    seeds: &[u32],
    cfg: &PipelineConfig,
    probe: &dyn MemoryProbe,
) -> Result<TrialMemory> {
    let loader = LoaderConfig {
        batch_size: cfg.batch_size.max(1),
        shuffle: cfg.shuffle,
        seed: cfg.seed,
        ..LoaderConfig::default()
    };
    let first = epoch_batches(seeds, &loader, 0)
        .into_iter()
        .next()
        .ok_or_else(|| ExecError::Invalid("the trial batch needs a training seed".into()))?;
    let model_state = trainer.state_bytes();
    let start = probe.reset_peak();
    let key = BatchKey {
        seed: cfg.seed,
        epoch: 0,
        step: 0,
    };
    let batch = sampler.sample(&first, key)?;
    let batch_bytes = minibatch_bytes(&batch);
    let mut features = Vec::new();
    let extract = extractor.extract(&batch.input_nodes, &mut features)?;
    let input_nodes = batch.input_nodes.len() as u64;
    let feature_bytes = 4 * features.len() as u64;
    let p = Prepared {
        batch,
        features,
        dim: extractor.dim(),
        remote: None,
        extract,
        split: None,
        input_agg: None,
        input_store: None,
        cache_split: None,
    };
    trainer.trial_step(p, 0)?;
    let step_peak = probe.peak().saturating_sub(start);
    Ok(TrialMemory {
        step_peak,
        model_state,
        batch_bytes,
        feature_bytes,
        input_nodes,
    })
}
