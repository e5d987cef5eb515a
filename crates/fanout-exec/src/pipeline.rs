//! The sample -> extract -> train pipeline of one epoch.
//!
//! Sampling runs on the [`Loader`]'s worker threads into its bounded in-order queue; one
//! extract thread turns each [`MiniBatch`] into a feature matrix through an [`Extractor`] and
//! pushes it into a second bounded queue; the caller (the train stage) pulls [`Prepared`]
//! batches from the [`EpochStream`]. Each queue holds at most `prefetch` batches, so memory is
//! bounded and a slow stage back-pressures the ones before it.
//!
//! With [`PipelineConfig::reorder_window`] `W >= 2` the extract thread first takes `W` sampled
//! batches (fewer at the end of the epoch), puts them in FastGL's Greedy Reorder order
//! ([`fanout_cache::reorder_batches`]: adjacent batches share more input nodes, so Match reuses
//! more rows) and then extracts them in that order. The window is a buffer inside the extract
//! thread, not a queue, so it cannot deadlock with the bounded queues; the loader samples up to
//! `max(prefetch, W)` batches ahead so that the next window is sampled while this one is
//! extracted and trained.

use crate::buffers::BufferPool;
use crate::error::{ExecError, Result};
use crate::metrics::StageClock;
pub use crate::store_input::StoreInput;
use fanout_cache::{reorder_batches, CacheSplit, ExtractStats, Extractor};
use fanout_compute::{Backend, CpuBackend, InputPlan, Tensor};
use fanout_graph::Dataset;
use fanout_sample::{BatchKey, BatchPlan, Loader, LoaderConfig, MiniBatch, Sampler};
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
    /// FastGL Greedy Reorder window: the extract stage takes this many sampled batches at a
    /// time and extracts them in Greedy Reorder order. 0 or 1 = off (sampled order). Larger
    /// than the epoch = the whole epoch in one window. Only useful with an extractor that
    /// reuses the previous batch's rows (Match); evaluation pipelines keep it 0.
    pub reorder_window: usize,
    /// How this worker's batches are cut from its seeds ([`BatchPlan::Whole`] for one worker;
    /// data-parallel workers slice global batches or cut their partition into equal step
    /// counts).
    pub plan: BatchPlan,
    /// The rayon pool sampling and extraction run on (`None`: the global pool). In-process
    /// workers each get their own.
    pub pool: Option<Arc<rayon::ThreadPool>>,
    /// The model's first layer's [`InputPlan`] (`fanout_compute::Model::input_plan`): where it
    /// aggregates a batch's input first and the extractor can aggregate where the rows are
    /// stored ([`Extractor::extract_aggregated`]), the extract stage hands over block 0's
    /// destination rows and their aggregate ([`Prepared::input_agg`]) instead of every input
    /// row, sparing the writing and reading back of the whole input matrix. `None`: always
    /// every row. Only for consumers that train or evaluate a model with this plan.
    pub input_plan: Option<InputPlan>,
    /// With `input_plan`: where the first layer makes its aggregate inside its product
    /// ([`InputPlan::made_in_product`]), the features are mostly non-zero and one
    /// micro-tile's rows read few enough stored bytes
    /// (`fanout_compute::cpu::gemm::makes_rows_in_product`), the extract stage gathers only
    /// block 0's destination rows and leaves their aggregate to the trainer
    /// ([`Prepared::input_store`]), which makes it a few rows at a time inside that product
    /// while it fetches the next rows' stored rows, overlapping that memory-bound pass with
    /// arithmetic; elsewhere it aggregates as without this. For CPU trainers (another backend
    /// would make the aggregate whole on the host first). The same results bit for bit.
    pub aggregate_in_trainer: bool,
}

impl Default for PipelineConfig {
    /// Batch 1024, shuffled, seed 0, queues of 2, one sampling worker (each batch is itself
    /// sampled in parallel on the rayon pool), no reordering.
    fn default() -> Self {
        PipelineConfig {
            batch_size: 1024,
            shuffle: true,
            seed: 0,
            prefetch: 2,
            sample_workers: 1,
            reorder_window: 0,
            plan: BatchPlan::Whole,
            pool: None,
            input_plan: None,
            aggregate_in_trainer: false,
        }
    }
}

impl PipelineConfig {
    /// The configuration of an evaluation pipeline derived from a training one: same batch
    /// size, seed, queues and workers, but seeds in their given order and no reordering.
    pub fn for_evaluation(&self) -> PipelineConfig {
        PipelineConfig {
            shuffle: false,
            reorder_window: 0,
            ..self.clone()
        }
    }

    /// The reorder window in effect: `reorder_window` when it is at least 2, else 1 (off).
    pub fn window(&self) -> usize {
        self.reorder_window.max(1)
    }

    /// How many batches the loader samples ahead of the extract stage: `prefetch` (at least
    /// 1), raised to the reorder window when reordering so that a whole window can be sampled
    /// while the previous one is extracted.
    pub fn loader_depth(&self) -> usize {
        let p = self.prefetch.max(1);
        if self.window() > 1 {
            p.max(self.window())
        } else {
            p
        }
    }

    /// Upper bounds on the batches one pipeline holds besides the one in the train stage:
    /// `(sampled, prepared)`. Sampled batches wait in the loader's queue ([`Self::loader_depth`])
    /// and in the reorder window; prepared batches (features extracted) wait in the extract
    /// queue (`prefetch`) plus the one being extracted. Used to size PaGraph's prefetch
    /// buffers.
    pub fn batches_in_flight(&self) -> (usize, usize) {
        let w = self.window();
        let window_held = if w > 1 { w } else { 0 };
        (self.loader_depth() + window_held, self.prefetch.max(1) + 1)
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
    /// `Some(rank)`: the batch is trained by that worker instead (a GNNLab standby trainer
    /// claimed it); `batch` then holds only its key and seed count, and `features` is empty.
    /// The trainer hands it its parameters and adds its gradient through
    /// [`BatchSource::remote_start`] and [`BatchSource::remote_finish`].
    pub remote: Option<usize>,
    /// `Some`: this worker's share of a split-parallel step ([`crate::split`]); `batch` then
    /// holds the step's key, this worker's seeds (`input_nodes`: the vertices of the share)
    /// and labels but no blocks, and `features` the rows of the share's own vertices.
    pub split: Option<Box<crate::split::SplitBatch>>,
    /// `Some`: the extract stage aggregated block 0's input where the rows are stored
    /// ([`PipelineConfig::input_plan`]): `features` then holds only block 0's destination
    /// rows (none where the trainer was to make the aggregate and the first layer reads only
    /// that, [`fanout_compute::InputPlan::reads_dst`]) and this their aggregate, which the
    /// trainer feeds to
    /// [`fanout_compute::Model::forward_rows_aggregated`].
    pub input_agg: Option<Vec<f32>>,
    /// `Some`: the extract stage left block 0's aggregate to the trainer
    /// ([`PipelineConfig::aggregate_in_trainer`]): `features` then holds only block 0's
    /// destination rows (none where the first layer reads only the aggregate,
    /// [`fanout_compute::InputPlan::reads_dst`]), and the trainer makes their aggregate from
    /// this store inside the
    /// first layer's product ([`fanout_compute::Model::forward_rows_sourced`]).
    pub input_store: Option<StoreInput>,
    /// `Some`: the batch's rows are split between a cache on the trainer's device and the
    /// host ([`Pipeline::with_cache_on_device`]): `features` then holds only the misses, in
    /// input order (nothing with [`Pipeline::with_cache_on_device_misses_mapped`]: the
    /// trainer's device reads them in place), and the trainer assembles the rest from its copy
    /// of the cache ([`crate::Trainer::with_device_cache`]).
    pub cache_split: Option<CacheSplit>,
}

/// Sample and extract stages over one seed set (the training set, or a set to evaluate).
/// Guarantees: the batches of an epoch, their order and their features are a pure function of
/// (dataset, sampler configuration, seeds, [`PipelineConfig::batch_size`], `shuffle`, `seed`,
/// `reorder_window`, epoch), whatever the queue depths and thread counts; with reordering an
/// epoch still yields every sampled batch exactly once (a permutation of the sampled order
/// that keeps each window's batches together), so every seed is trained once per epoch.
pub struct Pipeline {
    loader: Loader,
    extractor: Arc<Mutex<Box<dyn Extractor>>>,
    prefetch: usize,
    window: usize,
    num_nodes: usize,
    pool: Option<Arc<rayon::ThreadPool>>,
    sample_clock: Arc<StageClock>,
    extract_clock: Arc<StageClock>,
    buffers: Arc<BufferPool>,
    input_plan: Option<InputPlan>,
    aggregate_in_trainer: bool,
    rows_elsewhere: Option<RowsElsewhere>,
    cache_on_device: bool,
    /// With `cache_on_device`: the trainer reads the missed rows in place (none gathered here).
    misses_mapped: bool,
}

/// Rows the trainer gathers itself, from every vertex's row on the device or mapped from host
/// memory: the extract stage only counts them.
#[derive(Clone, Copy)]
struct RowsElsewhere {
    /// Bytes of one stored row.
    row_bytes: u64,
    /// Whether the device reads them from host memory (they cross the bus) rather than its own.
    over_bus: bool,
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
        let num_nodes = sampler.dataset().num_nodes() as usize;
        let timed: Arc<dyn Sampler> = Arc::new(TimedSampler::new(sampler, sample_clock.clone()));
        let loader = Loader::new(
            timed,
            seeds,
            LoaderConfig {
                batch_size: cfg.batch_size,
                shuffle: cfg.shuffle,
                drop_last: false,
                seed: cfg.seed,
                prefetch: cfg.loader_depth(),
                workers: cfg.sample_workers.max(1),
                pool: cfg.pool.clone(),
            },
        )?
        .with_plan(cfg.plan)?;
        Ok(Pipeline {
            loader,
            extractor: Arc::new(Mutex::new(extractor)),
            prefetch: cfg.prefetch.max(1),
            window: cfg.window(),
            num_nodes,
            pool: cfg.pool.clone(),
            sample_clock,
            extract_clock: Arc::new(StageClock::default()),
            // Enough for the batches in flight plus the one the consumer holds.
            buffers: Arc::new(BufferPool::new(cfg.prefetch.max(1) + cfg.window() + 2)),
            input_plan: cfg.input_plan,
            aggregate_in_trainer: cfg.aggregate_in_trainer,
            rows_elsewhere: None,
            cache_on_device: false,
            misses_mapped: false,
        })
    }

    /// This pipeline for a trainer that holds the extractor's cache in its backend's memory
    /// ([`crate::Trainer::with_device_cache`]): the extract stage gathers only the rows the
    /// cache misses ([`Extractor::extract_split`]), and each [`Prepared`] carries them with
    /// its [`CacheSplit`] (and no `input_agg`). Its [`ExtractStats`] are those of the same
    /// extraction on the host. A batch fails with an error if the extractor has neither a
    /// cache nor Match.
    pub fn with_cache_on_device(mut self) -> Self {
        self.cache_on_device = true;
        self
    }

    /// As [`Pipeline::with_cache_on_device`], for a trainer that also holds every feature row
    /// in host memory its device reads in place ([`crate::Trainer::with_mapped_rows`]): the
    /// extract stage reads no row (`extract_split` without misses), each [`Prepared`] carries
    /// its [`CacheSplit`] and empty `features`, and the trainer's device reads the missed rows
    /// over the bus. The [`ExtractStats`] are those of [`Pipeline::with_cache_on_device`]
    /// (rows counted at their stored size, as the host path counts them, where
    /// [`Pipeline::with_rows_mapped`] counts the f32 rows that cross the bus).
    pub fn with_cache_on_device_misses_mapped(mut self) -> Self {
        self.cache_on_device = true;
        self.misses_mapped = true;
        self
    }

    /// This pipeline for a trainer that holds every feature row in its backend's memory
    /// ([`crate::Trainer::with_device_rows`]): the extract stage gathers nothing, each
    /// [`Prepared`] carries empty `features` (and no `input_agg`), and its [`ExtractStats`]
    /// count every row's `row_bytes` (bytes of one stored row) as served from the device.
    pub fn with_rows_on_device(mut self, row_bytes: u64) -> Self {
        self.rows_elsewhere = Some(RowsElsewhere {
            row_bytes,
            over_bus: false,
        });
        self
    }

    /// This pipeline for a trainer that holds every feature row in host memory its device
    /// reads in place ([`crate::Trainer::with_mapped_rows`]): as
    /// [`Pipeline::with_rows_on_device`], but the rows count as read from the host (they
    /// cross the bus), none from a cache; `row_bytes` is then the bytes of a row as the
    /// device reads it.
    pub fn with_rows_mapped(mut self, row_bytes: u64) -> Self {
        self.rows_elsewhere = Some(RowsElsewhere {
            row_bytes,
            over_bus: true,
        });
        self
    }

    /// Batches per epoch.
    pub fn num_batches(&self) -> usize {
        self.loader.num_batches()
    }

    /// The Greedy Reorder window in effect (1 = batches in sampled order).
    pub fn reorder_window(&self) -> usize {
        self.window
    }

    /// The free list the extract stage takes its feature buffers from. A consumer done with a
    /// [`Prepared::features`] gives it back here ([`BufferPool::give`]) to spare the next
    /// batch fresh pages; one that does not loses nothing but that.
    pub fn buffers(&self) -> &Arc<BufferPool> {
        &self.buffers
    }

    /// Busy time of the sample stage since the last call to [`Pipeline::take_times`].
    pub fn sample_clock(&self) -> &StageClock {
        &self.sample_clock
    }

    /// Returns `(sample_s, extract_s)` of busy time accumulated since the last call, and
    /// resets them. (Bytes are per batch: [`Prepared::extract`].)
    pub fn take_times(&self) -> (f64, f64) {
        (self.sample_clock.take(), self.extract_clock.take())
    }

    /// Starts sampling and extracting `epoch` in the background and returns its prepared
    /// batches: in step order, or with a reorder window in Greedy Reorder order within each
    /// window of `W` consecutive steps. Dropping the stream early stops both stages.
    pub fn epoch(&self, epoch: u64) -> EpochStream {
        let (tx, rx) = sync_channel::<Result<Prepared>>(self.prefetch);
        let mut batches = self.loader.epoch(epoch);
        let total = batches.len();
        let ex = self.extractor.clone();
        let clock = self.extract_clock.clone();
        let (window, num_nodes, pool) = (self.window, self.num_nodes, self.pool.clone());
        let buffers = self.buffers.clone();
        let (input_plan, rows_elsewhere) = (self.input_plan, self.rows_elsewhere);
        let in_trainer = self.aggregate_in_trainer;
        let (cache_on_device, misses_mapped) = (self.cache_on_device, self.misses_mapped);
        let handle = std::thread::spawn(move || {
            // A panic in an earlier epoch's extraction poisons the lock: that run already
            // ended with the panic's message, and the extractor's state is not trusted again.
            let Ok(mut ex) = ex.lock() else {
                let _ = tx.send(Err(ExecError::Invalid(
                    "the extract stage failed in an earlier epoch; its cache state is unknown"
                        .into(),
                )));
                return;
            };
            let dim = ex.dim();
            // Whether the stored rows are mostly non-zero, sampled once for the stream.
            let mut dense_rows = None;
            let mut extract = |batch: MiniBatch| {
                let dense = &mut dense_rows;
                let t = Instant::now();
                let mut features = buffers.take();
                let exr: &mut dyn Extractor = &mut **ex;
                let mut input_agg = None;
                let mut input_store = None;
                let mut cache_split = None;
                let mut gather = || {
                    if cache_on_device {
                        let mut split = CacheSplit::default();
                        features.clear();
                        let misses = (!misses_mapped).then_some(&mut features);
                        let stats = exr
                            .extract_split(&batch.input_nodes, &mut split, misses)
                            .ok_or_else(|| {
                                fanout_graph::Error::Invalid(
                                    "the cache on the device needs an extractor with a cache \
                                     or Match"
                                        .into(),
                                )
                            })??;
                        cache_split = Some(split);
                        return Ok(stats);
                    }
                    if let Some(at) = rows_elsewhere {
                        // The trainer gathers the rows where they all live.
                        features.clear();
                        let rows = batch.input_nodes.len() as u64;
                        let bytes = rows * at.row_bytes;
                        return Ok(ExtractStats {
                            rows,
                            bytes_total: bytes,
                            bytes_from_cache: if at.over_bus { 0 } else { bytes },
                            bytes_from_host: if at.over_bus { bytes } else { 0 },
                            ..ExtractStats::default()
                        });
                    }
                    let first = extract_first_input(
                        exr,
                        input_plan,
                        in_trainer,
                        dense,
                        &batch,
                        &mut features,
                    );
                    if let Some(r) = first {
                        let (stats, input) = r?;
                        match input {
                            FirstInput::Aggregate(agg) => input_agg = Some(agg),
                            FirstInput::Store(store) => input_store = Some(store),
                        }
                        return Ok(stats);
                    }
                    exr.extract(&batch.input_nodes, &mut features)
                };
                let s = match &pool {
                    Some(p) => p.install(gather),
                    None => gather(),
                };
                clock.add_since(t);
                Ok::<_, ExecError>(Prepared {
                    batch,
                    features,
                    dim,
                    extract: s?,
                    remote: None,
                    split: None,
                    input_agg,
                    input_store,
                    cache_split,
                })
            };
            loop {
                // Take the next window (one batch without reordering). A sampling error is
                // passed on at once and ends the epoch; the window's other batches are dropped.
                let mut win = Vec::with_capacity(window.min(total));
                let mut failed = None;
                for mb in batches.by_ref() {
                    match mb {
                        Ok(b) => win.push(b),
                        Err(e) => {
                            failed = Some(ExecError::from(e));
                            break;
                        }
                    }
                    if win.len() == window {
                        break;
                    }
                }
                if let Some(e) = failed {
                    let _ = tx.send(Err(e));
                    return;
                }
                if win.is_empty() {
                    return;
                }
                if window > 1 {
                    // Reordering is extract-stage work: its time counts as extraction.
                    let t = Instant::now();
                    win = reorder_batches(win, num_nodes);
                    clock.add_since(t);
                }
                for b in win {
                    let p = extract(b);
                    let failed = p.is_err();
                    if tx.send(p).is_err() || failed {
                        return;
                    }
                }
            }
        });
        EpochStream::from_channel(rx, Some(handle), total)
    }
}

/// Where a trainer's prepared batches come from: a local [`Pipeline`], or the queue other
/// workers feed ([`crate::factored::QueueSource`], GNNLab's factored design), so the training loop
/// ([`crate::fit`]) is shared by every strategy.
pub trait BatchSource: Sync {
    /// Batches of every epoch (every worker of a run sees the same count).
    fn num_batches(&self) -> usize;
    /// The prepared batches of `epoch` (see [`Pipeline::epoch`]).
    fn epoch(&self, epoch: u64) -> EpochStream;
    /// `(sample_s, extract_s)` busy seconds since the last call (see [`Pipeline::take_times`]).
    fn take_times(&self) -> (f64, f64);
    /// Consecutive batches of an epoch that form one optimiser step on this worker (1 for a
    /// pipeline; a factored trainer may take several slices of each step, whose gradients are
    /// summed before the step).
    fn items_per_step(&self) -> usize {
        1
    }
    /// Starts the remote computation of a batch another worker claimed
    /// ([`Prepared::remote`]): hands it the current `params`. Sources without remote batches
    /// never yield one; the default refuses.
    fn remote_start(&self, _p: &Prepared, _params: &[f32]) -> Result<()> {
        Err(ExecError::Invalid(
            "this batch source has no remote workers".into(),
        ))
    }
    /// Waits for the remote batch's result: its gradient of the summed (not mean) loss over its
    /// labelled seeds, with the loss sum and counts.
    fn remote_finish(&self, _p: &Prepared) -> Result<RemoteGradient> {
        Err(ExecError::Invalid(
            "this batch source has no remote workers".into(),
        ))
    }
}

/// What a remote worker computed for a claimed batch (see [`BatchSource::remote_finish`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RemoteGradient {
    /// Sum of the cross-entropy over the labelled seeds.
    pub loss_sum: f64,
    /// Seeds predicted correctly.
    pub correct: usize,
    /// Labelled seeds.
    pub labelled: usize,
    /// The parameter gradient of `loss_sum`, in [`crate::Trainer::gradients_into`]'s layout.
    pub gradient: Vec<f32>,
    /// What the batch cost the remote worker, for the epoch's metrics.
    pub work: RemoteWork,
}

/// What a remote worker's batch cost (see [`RemoteGradient`]): the counts an epoch's metrics
/// take from a batch it trains itself, so that an epoch counts every batch trained for it
/// wherever it was trained.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoteWork {
    /// Sampled edges over the batch's blocks.
    pub edges: u64,
    /// Input vertices of the batch.
    pub input_nodes: u64,
    /// The batch's feature extraction.
    pub extract: ExtractStats,
    /// Nominal flops of the step's products ([`fanout_compute::cpu::gemm::nominal_flops`]).
    pub gemm_flops: u64,
    /// The part of `gemm_flops` that zero-skipping products did not perform.
    pub gemm_flops_skipped: u64,
}

impl RemoteWork {
    /// Adds another batch's counts.
    pub fn add(&mut self, o: &RemoteWork) {
        self.edges += o.edges;
        self.input_nodes += o.input_nodes;
        self.extract.add(&o.extract);
        self.gemm_flops += o.gemm_flops;
        self.gemm_flops_skipped += o.gemm_flops_skipped;
    }
}

impl BatchSource for Pipeline {
    fn num_batches(&self) -> usize {
        Pipeline::num_batches(self)
    }
    fn epoch(&self, epoch: u64) -> EpochStream {
        Pipeline::epoch(self, epoch)
    }
    fn take_times(&self) -> (f64, f64) {
        Pipeline::take_times(self)
    }
}

/// The prepared batches of one epoch, in the order [`Pipeline::epoch`] describes. Yields `Err`
/// for a batch that failed to sample and ends after it; a producer that stops before the
/// epoch's last batch without sending an error (it panicked) also ends the stream with `Err`.
pub struct EpochStream {
    rx: Option<Receiver<Result<Prepared>>>,
    handle: Option<JoinHandle<()>>,
    /// Batches made on demand by the consumer's own thread instead (see
    /// [`EpochStream::on_demand`]).
    make: Option<OnDemand>,
    total: usize,
    /// Items received from `rx` so far, and whether one was an error.
    received: usize,
    errored: bool,
}

/// A producer run in the consuming thread, one batch per call.
type OnDemand = Box<dyn Iterator<Item = Result<Prepared>> + Send>;

impl EpochStream {
    /// A stream of `total` batches fed by `rx`, whose producer thread, if `handle` is given,
    /// is joined when the stream ends or is dropped (the producer must stop when its sends
    /// fail).
    pub(crate) fn from_channel(
        rx: Receiver<Result<Prepared>>,
        handle: Option<JoinHandle<()>>,
        total: usize,
    ) -> EpochStream {
        EpochStream {
            rx: Some(rx),
            handle,
            make: None,
            total,
            received: 0,
            errored: false,
        }
    }

    /// A stream of `total` batches, each made by `make` when the consumer asks for it, in the
    /// consumer's thread: for sources whose preparation talks to other workers (split
    /// parallelism's sampling), so that every worker's calls happen in the same order on
    /// the thread that also does the training step's communication.
    pub(crate) fn on_demand(make: OnDemand, total: usize) -> EpochStream {
        EpochStream {
            rx: None,
            handle: None,
            make: Some(make),
            total,
            received: 0,
            errored: false,
        }
    }

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
        if let Some(make) = self.make.as_mut() {
            return make.next();
        }
        match self.rx.as_ref()?.recv() {
            Ok(item) => {
                self.received += 1;
                self.errored |= item.is_err();
                Some(item)
            }
            Err(_) => {
                // The producer ended: normally, or by a panic, which we report.
                self.rx = None;
                if let Some(h) = self.handle.take() {
                    if h.join().is_err() {
                        return Some(Err(ExecError::Invalid("the extract stage panicked".into())));
                    }
                }
                (self.received < self.total && !self.errored).then(|| {
                    Err(ExecError::Invalid(format!(
                        "the batch producer stopped after {} of {} batches without an error",
                        self.received, self.total
                    )))
                })
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

/// Stored rows sampled to tell dense features from mostly-zero ones.
const DENSITY_SAMPLE_ROWS: usize = 64;

/// Block 0's input where the extract stage does not gather every input row.
enum FirstInput {
    /// The destinations' aggregate, made here.
    Aggregate(Vec<f32>),
    /// Left to the trainer.
    Store(StoreInput),
}

/// Block 0's destination rows into `features` (none, `features` left empty, where the trainer
/// makes the aggregate and the layer reads only that) and, where `plan` aggregates block 0 first and
/// the extractor reads the stored rows, their aggregate (or, `in_trainer`, where to make it);
/// `None` otherwise (the caller extracts every row). `dense` caches, for the stream, whether
/// the stored rows are mostly non-zero.
fn extract_first_input(
    ex: &mut dyn Extractor,
    plan: Option<InputPlan>,
    in_trainer: bool,
    dense: &mut Option<bool>,
    batch: &MiniBatch,
    features: &mut Vec<f32>,
) -> Option<fanout_graph::Result<(ExtractStats, FirstInput)>> {
    let b0 = batch.blocks.first()?;
    let refs = crate::trainer::block_refs(std::slice::from_ref(b0));
    let plan = plan?;
    let aggregation = plan.for_block(refs[0].dims())?;
    // The coefficients the layer itself uses (the same code computes them), so the aggregate
    // is bit-identical to the layer's own.
    let cpu = CpuBackend;
    let block = cpu.prepare_block(&refs[0]).ok()?;
    // The CPU backend never fails; were it to, the batch is extracted the plain way.
    let coeff = cpu.edge_coefficients(&block, aggregation).ok()?;
    let (input, indptr, indices) = (&batch.input_nodes, &b0.indptr, &b0.indices);
    if in_trainer && plan.made_in_product {
        // A layer that reads only the aggregate (GCN) gets no destination rows.
        features.clear();
        let dst = plan.reads_dst.then_some(features);
        let r = ex.extract_sourced(input, b0.num_dst, indptr, indices, dst)?;
        let (stats, store) = match r {
            Ok(r) => r,
            Err(e) => return Some(Err(e)),
        };
        let ds = store.clone();
        let f = ds.features.as_ref()?;
        // Mostly-zero features (bags of words) make mostly-zero aggregates, whose product
        // skips their zeros when the aggregate is made whole; inside the product it would not.
        let dense = *dense.get_or_insert_with(|| f.nonzero_fraction(DENSITY_SAMPLE_ROWS) > 0.5);
        let coeff = coeff.map(Tensor::into_data);
        if !dense {
            // Made whole here, where it overlaps the trainer's work.
            let mut agg = Vec::new();
            f.aggregate_into(input, indptr, indices, coeff.as_deref(), &mut agg);
            return Some(Ok((stats, FirstInput::Aggregate(agg))));
        }
        let store = StoreInput { store, coeff };
        let inside = store
            .rows_of(batch)
            .is_ok_and(|src| fanout_compute::cpu::gemm::makes_rows_in_product(&src, plan.out_dim));
        if inside {
            return Some(Ok((stats, FirstInput::Store(store))));
        }
        let mut agg = Vec::new();
        f.aggregate_into(input, indptr, indices, store.coeff.as_deref(), &mut agg);
        return Some(Ok((stats, FirstInput::Aggregate(agg))));
    }
    let coeff = coeff.as_ref().map(|c| c.data());
    let mut agg = Vec::new();
    let r = ex.extract_aggregated(
        input, b0.num_dst, indptr, indices, coeff, features, &mut agg,
    )?;
    Some(r.map(|s| (s, FirstInput::Aggregate(agg))))
}
