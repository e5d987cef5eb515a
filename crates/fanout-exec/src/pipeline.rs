//! The sample -> extract -> train pipeline of one epoch.
//!
//! Sampling runs on the [`Loader`]'s worker threads into its bounded in-order queue; one
//! extract thread turns each [`MiniBatch`] into a feature matrix through an [`Extractor`] and
//! pushes it into a second bounded queue; the caller (the train stage) pulls [`Prepared`]
//! batches from the [`EpochStream`]. Each queue holds at most `prefetch` batches, so memory is
//! bounded and a slow stage back-pressures the ones before it.

use crate::error::{ExecError, Result};
use crate::metrics::StageClock;
use fanout_cache::{ExtractStats, Extractor};
use fanout_graph::Dataset;
use fanout_sample::{BatchKey, Loader, LoaderConfig, MiniBatch, Sampler};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

/// A [`Sampler`] that adds the time of every `sample` call to a [`StageClock`] and otherwise
/// behaves exactly like the sampler it wraps (same batches, same errors).
pub struct TimedSampler {
    inner: Arc<dyn Sampler>,
    clock: Arc<StageClock>,
}

impl TimedSampler {
    /// Wraps `inner`, timing into `clock`.
    pub fn new(inner: Arc<dyn Sampler>, clock: Arc<StageClock>) -> Self {
        TimedSampler { inner, clock }
    }
}

impl Sampler for TimedSampler {
    fn sample(&self, seeds: &[u32], key: BatchKey) -> fanout_graph::Result<MiniBatch> {
        let t = Instant::now();
        let out = self.inner.sample(seeds, key);
        self.clock.add_since(t);
        out
    }
    fn num_layers(&self) -> usize {
        self.inner.num_layers()
    }
    fn dataset(&self) -> &Arc<Dataset> {
        self.inner.dataset()
    }
    fn name(&self) -> &'static str {
        self.inner.name()
    }
}

/// How a [`Pipeline`] splits and schedules an epoch.
#[derive(Clone, Debug)]
pub struct PipelineConfig {
    /// Seeds per mini-batch (at least 1).
    pub batch_size: usize,
    /// Shuffle the seeds every epoch (training) or keep their order (evaluation).
    pub shuffle: bool,
    /// The run's seed (part of every batch key).
    pub seed: u64,
    /// Depth of each inter-stage queue (at least 1).
    pub prefetch: usize,
    /// Threads sampling batches concurrently (at least 1).
    pub sample_workers: usize,
}

impl Default for PipelineConfig {
    /// Batch 1024, shuffled, seed 0, queues of 2, one sampling worker (each batch is itself
    /// sampled in parallel on the rayon pool).
    fn default() -> Self {
        PipelineConfig {
            batch_size: 1024,
            shuffle: true,
            seed: 0,
            prefetch: 2,
            sample_workers: 1,
        }
    }
}

/// A mini-batch ready for the train stage: its blocks, labels and the features of its input
/// nodes (`batch.input_nodes.len() x dim`, row-major, in input-node order).
#[derive(Debug)]
pub struct Prepared {
    /// The sampled mini-batch.
    pub batch: MiniBatch,
    /// Feature rows of `batch.input_nodes`.
    pub features: Vec<f32>,
    /// Feature width.
    pub dim: usize,
    /// Where the feature bytes came from.
    pub extract: ExtractStats,
}

/// Sample and extract stages over one seed set (the training set, or a set to evaluate).
/// Guarantee: the batches of an epoch, their order and their features are a pure function of
/// (dataset, sampler configuration, seeds, [`PipelineConfig::batch_size`], `shuffle`, `seed`,
/// epoch), whatever the queue depths and thread counts.
pub struct Pipeline {
    loader: Loader,
    extractor: Arc<Mutex<Box<dyn Extractor>>>,
    prefetch: usize,
    sample_clock: Arc<StageClock>,
    extract_clock: Arc<StageClock>,
    extract_stats: Arc<Mutex<ExtractStats>>,
}

impl Pipeline {
    /// A pipeline sampling `seeds` with `sampler` and extracting with `extractor`. Errors on a
    /// zero batch size or an empty seed set.
    pub fn new(
        sampler: Arc<dyn Sampler>,
        extractor: Box<dyn Extractor>,
        seeds: Vec<u32>,
        cfg: &PipelineConfig,
    ) -> Result<Self> {
        if seeds.is_empty() {
            return Err(ExecError::Invalid("the seed set is empty".into()));
        }
        let sample_clock = Arc::new(StageClock::default());
        let timed: Arc<dyn Sampler> = Arc::new(TimedSampler::new(sampler, sample_clock.clone()));
        let loader = Loader::new(
            timed,
            seeds,
            LoaderConfig {
                batch_size: cfg.batch_size,
                shuffle: cfg.shuffle,
                drop_last: false,
                seed: cfg.seed,
                prefetch: cfg.prefetch.max(1),
                workers: cfg.sample_workers.max(1),
                pool: None,
            },
        )?;
        Ok(Pipeline {
            loader,
            extractor: Arc::new(Mutex::new(extractor)),
            prefetch: cfg.prefetch.max(1),
            sample_clock,
            extract_clock: Arc::new(StageClock::default()),
            extract_stats: Arc::new(Mutex::new(ExtractStats::default())),
        })
    }

    /// Batches per epoch.
    pub fn num_batches(&self) -> usize {
        self.loader.num_batches()
    }

    /// Busy time of the sample stage since the last call to [`Pipeline::take_times`].
    pub fn sample_clock(&self) -> &StageClock {
        &self.sample_clock
    }

    /// Returns `(sample_s, extract_s, extract stats)` accumulated since the last call, and
    /// resets them. Call it after an epoch's stream has been consumed or dropped.
    pub fn take_times(&self) -> (f64, f64, ExtractStats) {
        let stats = std::mem::take(&mut *self.extract_stats.lock().unwrap());
        (self.sample_clock.take(), self.extract_clock.take(), stats)
    }

    /// Starts sampling and extracting `epoch` in the background and returns its prepared
    /// batches in step order. Dropping the stream early stops both stages.
    pub fn epoch(&self, epoch: u64) -> EpochStream {
        let (tx, rx) = sync_channel::<Result<Prepared>>(self.prefetch);
        let batches = self.loader.epoch(epoch);
        let total = batches.len();
        let ex = self.extractor.clone();
        let clock = self.extract_clock.clone();
        let stats = self.extract_stats.clone();
        let handle = std::thread::spawn(move || {
            let mut ex = ex.lock().unwrap();
            let dim = ex.dim();
            for mb in batches {
                let item = match mb {
                    Ok(batch) => {
                        let t = Instant::now();
                        let mut features = Vec::new();
                        let s = ex.extract(&batch.input_nodes, &mut features);
                        clock.add_since(t);
                        stats.lock().unwrap().add(&s);
                        Ok(Prepared {
                            batch,
                            features,
                            dim,
                            extract: s,
                        })
                    }
                    Err(e) => Err(ExecError::from(e)),
                };
                let failed = item.is_err();
                if tx.send(item).is_err() || failed {
                    return;
                }
            }
        });
        EpochStream {
            rx: Some(rx),
            handle: Some(handle),
            total,
        }
    }
}

/// The prepared batches of one epoch, in step order. Yields `Err` for a batch that failed to
/// sample and ends after it.
pub struct EpochStream {
    rx: Option<Receiver<Result<Prepared>>>,
    handle: Option<JoinHandle<()>>,
    total: usize,
}

impl EpochStream {
    /// Batches this epoch yields in total.
    pub fn len(&self) -> usize {
        self.total
    }

    /// True for an epoch without batches.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }
}

impl Iterator for EpochStream {
    type Item = Result<Prepared>;
    fn next(&mut self) -> Option<Result<Prepared>> {
        match self.rx.as_ref()?.recv() {
            Ok(item) => Some(item),
            Err(_) => {
                // The extract thread ended: normally, or by a panic, which we report.
                self.rx = None;
                let h = self.handle.take()?;
                match h.join() {
                    Ok(()) => None,
                    Err(_) => Some(Err(ExecError::Invalid("the extract stage panicked".into()))),
                }
            }
        }
    }
}

impl Drop for EpochStream {
    fn drop(&mut self) {
        // Closing the queue makes the extract thread's next send fail; it then drops the
        // loader's iterator, which stops the sampling workers.
        self.rx = None;
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
