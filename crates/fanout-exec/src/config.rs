//! [`TrainConfig`]: everything that defines a training run, as one serde value.
//!
//! The command line (`fanout train`, its `--config FILE`), the Python package and tests all
//! describe a run with this type and hand it to [`crate::train`]. A config read from a file
//! may leave settings out (they take [`TrainConfig::default`]'s values); settings whose
//! default depends on the model or the dataset (fanouts, batch size, hidden width, learning
//! rate) are `None` until [`TrainConfig::resolve`] fills them in. Every metrics JSON records
//! the resolved config under `"config"`, and [`TrainConfig::from_file`] reads such a file
//! back, so a run can be replayed exactly.

use crate::error::{ExecError, Result};
use fanout_compute::{ModelKind, PaperSetting};
use fanout_graph::Residency;
use fanout_sample::{SamplerKind, SamplerSpec};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// How the run is spread over workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StrategyKind {
    /// One worker: one pipeline feeding one trainer.
    Single,
    /// PaGraph's data parallelism: each worker trains a replica on its share of every step's
    /// seeds (or on its partition's training vertices), gradients are summed across workers and
    /// every replica takes the same optimiser step.
    DataParallel,
    /// GNNLab's factored design: sampler workers sample every step's slices and send them
    /// through a bounded queue to trainer workers, which extract (through their cache) and
    /// train; a sampler idle at the end of an epoch trains claimed slices (dynamic
    /// switching). One worker samples each epoch whole, then trains it.
    Factored,
    /// MorphGL's routed preparation on the factored layout: each trainer prepares part of its
    /// slices itself (the CPU route) and receives the rest from the samplers (the remote
    /// route), split by MorphGL's cost model from profiled per-batch costs.
    Hybrid,
    /// GSplit's split parallelism: every step's one-worker batch is split by the dataset's
    /// METIS partition (`part_offsets.bin`, one part per worker); each worker samples, loads
    /// and computes the vertices it owns, and rows cross workers only along cut edges.
    Split,
}

impl StrategyKind {
    /// Factored or hybrid: sampler and trainer roles joined by a queue.
    pub fn is_factored(self) -> bool {
        matches!(self, StrategyKind::Factored | StrategyKind::Hybrid)
    }

    /// The name used in configs and metrics (`single`, `data-parallel`, `factored`,
    /// `hybrid`, `split`).
    pub fn name(self) -> &'static str {
        match self {
            StrategyKind::Single => "single",
            StrategyKind::DataParallel => "data-parallel",
            StrategyKind::Factored => "factored",
            StrategyKind::Hybrid => "hybrid",
            StrategyKind::Split => "split",
        }
    }
}

/// GNNLab's factored design (`strategy = "factored"`, and the layout of `"hybrid"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FactoredSpec {
    /// Sampler workers (`None`: GNNLab's cost model from a trial, `N_s = ceil(N / (K + 1))`
    /// with `K = T_train / T_sample` per batch).
    pub samplers: Option<usize>,
    /// Dynamic switching: a sampler done with its share of an epoch trains slices still
    /// queued while GNNLab's profit `M_r * T_t / N_t - T_t` is positive.
    pub switching: bool,
    /// Slices a sampler may have sent to one trainer and not yet seen taken (the queue's
    /// back-pressure; at least 1).
    pub queue_depth: usize,
    /// Batches the trial that measures `T_sample` and `T_train` samples and trains (at
    /// least 1).
    pub trial_batches: usize,
}

impl Default for FactoredSpec {
    /// Samplers from the cost model, switching on, queues of 4 slices, a trial of 4 batches.
    fn default() -> Self {
        FactoredSpec {
            samplers: None,
            switching: true,
            queue_depth: 4,
            trial_batches: 4,
        }
    }
}

/// Where a partitioned data-parallel worker samples from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SampleScope {
    /// Inside its partition (PaGraph's self-reliant workers): the partition holds the L-hop
    /// in-neighbourhood of its training vertices, so a model of at most L layers never leaves
    /// it; deeper models are refused.
    #[default]
    Partition,
    /// From the whole graph (any depth).
    Global,
}

/// The feature cache in front of the host feature store.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheSpec {
    /// `none`, `random`, `degree` (PaGraph), `presc` or `prescK` (GNNLab).
    pub policy: String,
    /// A ratio of all vertices (`"0.1"`, `"10%"`), bytes (`"512MiB"`) or `"auto"`.
    pub ratio: String,
    /// Memory budget of `ratio = "auto"` (bytes, e.g. `"2GiB"`); `None`: what the device offers.
    pub device_memory: Option<String>,
    /// FastGL Match: reuse the previous batch's rows.
    pub match_reorder: bool,
    /// FastGL Greedy Reorder window in batches (needs `match_reorder`; 0 or 1: off).
    pub reorder_window: usize,
}

impl Default for CacheSpec {
    /// No cache (`policy = "none"`, `ratio = "0.1"` should one be chosen), no Match.
    fn default() -> Self {
        CacheSpec {
            policy: "none".into(),
            ratio: "0.1".into(),
            device_memory: None,
            match_reorder: false,
            reorder_window: 0,
        }
    }
}

/// Where a run's batches get their feature rows (`feature_placement`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FeaturePlacement {
    /// On a GPU (a backend with its own memory) without a feature cache or Match-Reorder:
    /// `device` when the rows as f32 take at most half the device's free memory and a quarter
    /// of the host's available memory, else `uva` when they take at most a quarter of the
    /// host's available memory (page-locked memory cannot be paged out); `host` otherwise.
    /// With a cache or Match on a GPU: every row on the device when they fit as above (the
    /// cache is then not built; Match's batch order is kept, so results do not depend on the
    /// placement); else the cache on the device,
    /// as `uva` when the rows take at most a quarter of the host's available memory, else as
    /// `device`; a cache too large for the device stays where it was built (every row read in
    /// place, or on the host). `host` on the CPU.
    #[default]
    Auto,
    /// The extract stage gathers each batch's rows on the host (caches, Match-Reorder and the
    /// fused first-layer aggregation apply) and the trainer uploads them.
    Host,
    /// The rows live on the compute device. Without a feature cache, every row is copied there
    /// once and each batch's rows are gathered there: nothing but the batch's ids and blocks
    /// crosses per step (a device cache holding the whole feature matrix). With a cache
    /// (`--cache-policy`, `--cache-ratio`), the cached rows are copied there once and each
    /// batch uploads only the rows the cache misses (GNNLab's and PaGraph's GPU cache); with
    /// Match-Reorder the previous batch's rows stay there and are reused (FastGL). Needs a GPU
    /// backend.
    Device,
    /// The rows live in page-locked host memory that the GPU reads in place over its bus
    /// (zero-copy; PyG's and MorphGL's UVA feature fetch), for features that do not fit in
    /// device memory: the extract stage gathers nothing and the trainer's device gathers each
    /// batch's rows from host memory. With a feature cache or Match-Reorder, the cached rows
    /// (and the previous batch's) are on the device as for `Device`, and only the rows they
    /// miss are read in place, none gathered or uploaded by the host. Needs a GPU backend.
    Uva,
}

impl FeaturePlacement {
    /// The name used in configs and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            FeaturePlacement::Auto => "auto",
            FeaturePlacement::Host => "host",
            FeaturePlacement::Device => "device",
            FeaturePlacement::Uva => "uva",
        }
    }
}

/// Where a run's batches are sampled (`sampling_placement`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SamplingPlacement {
    /// On a GPU with k-hop (uniform or weighted) or random-walk sampling: `device` when the
    /// topology (8 bytes per vertex twice and 4 per arc, 16 weighted) takes at most a quarter
    /// of the device's free memory, else (not weighted) `uva` when the per-vertex part does
    /// and the arcs take at most a quarter of the host's available memory; `host` otherwise,
    /// and on the CPU.
    #[default]
    Auto,
    /// The sampler's threads on the host.
    Host,
    /// The GPU (k-hop, weighted and random-walk sampling; not layer-wise): the topology (and
    /// alias tables) is copied there once and each batch is drawn there, with FastGL's
    /// Fused-Map remapping, giving the host sampler's batches bit for bit. Needs a GPU
    /// backend.
    Device,
    /// The GPU, as `device`, with the arcs in pinned host memory that the kernels read over
    /// the bus (UVA, zero-copy): for graphs whose arcs do not fit on the GPU. The same batches.
    Uva,
}

impl SamplingPlacement {
    /// The name used in configs and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            SamplingPlacement::Auto => "auto",
            SamplingPlacement::Host => "host",
            SamplingPlacement::Device => "device",
            SamplingPlacement::Uva => "uva",
        }
    }
}

/// A training run. Serialises to and from JSON and TOML with these field names; unknown
/// fields are refused (a misspelt setting is an error, not silently ignored).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Dataset directory; `None`: a 100,000-vertex products-like graph generated in memory.
    pub dataset: Option<PathBuf>,
    /// The model.
    pub model: ModelKind,
    /// Per-hop fanouts in hop order from the seeds (`None`: the model's paper setting).
    pub fanouts: Option<Vec<u32>>,
    /// Seeds per step, over all workers together (`None`: 8000, or 1000 on the embedded graph).
    pub batch_size: Option<usize>,
    /// Hidden width (`None`: the model's paper setting).
    pub hidden: Option<usize>,
    /// Epochs (at least 1).
    pub epochs: u64,
    /// Adam learning rate (`None`: 0.003).
    pub lr: Option<f32>,
    /// L2 weight decay (PyTorch Adam semantics).
    pub weight_decay: f32,
    /// Dropout between layers, in `[0, 1)`.
    pub dropout: f32,
    /// Seed of initialisation, shuffling, sampling and dropout.
    pub seed: u64,
    /// Threads for sampling and compute in this process (`None`: all cores), shared by its
    /// in-process workers.
    pub threads: Option<usize>,
    /// Evaluate every N epochs and after the last (0: only after the last).
    pub eval_every: u64,
    /// Batches queued between pipeline stages.
    pub prefetch: usize,
    /// Aggregate the first layer's input where the features are stored, when the model
    /// aggregates it first (GraphSAGE and GCN per batch by their order rule, GIN always) and the
    /// features are read straight from the dataset (no cache, no Match-Reorder, f32 rows;
    /// single-worker and data-parallel runs): the batch's whole input matrix is then never
    /// built. The same results bit for bit; `false` builds it (for comparison).
    pub fuse_input: bool,
    /// The sampler (`kind = None`: random walks for PinSAGE, k-hop otherwise).
    pub sampler: SamplerSpec,
    /// The feature cache.
    pub cache: CacheSpec,
    /// Where features are read from during training.
    pub feature_residency: Residency,
    /// Where each batch's feature rows are gathered: on the host by the extract stage, or on
    /// the compute device from a copy of every row made once.
    pub feature_placement: FeaturePlacement,
    /// Where each batch is sampled: by the host's sampler threads or on the compute device.
    pub sampling_placement: SamplingPlacement,
    /// How the run is spread over workers (`None`: single for one worker, data-parallel for
    /// more).
    pub strategy: Option<StrategyKind>,
    /// Workers: in-process threads groups, or under MPI the number of processes (which must
    /// then match, or be left at 1).
    pub workers: usize,
    /// Partition under `DATASET/partitions/` whose training vertices the data-parallel
    /// workers split (`None`: every step's seeds are sliced across the workers, so N workers
    /// train exactly the one-worker batches).
    pub partition: Option<String>,
    /// Where partitioned workers sample from.
    pub sample_from: SampleScope,
    /// GNNLab's factored design (for `strategy = "factored"`).
    pub factored: FactoredSpec,
}

impl Default for TrainConfig {
    /// GraphSAGE on the embedded graph: 10 epochs, dropout 0.5, seed 0, evaluation every
    /// epoch, queues of 2, no cache, one worker; model-dependent settings unresolved.
    fn default() -> Self {
        TrainConfig {
            dataset: None,
            model: ModelKind::Sage,
            fanouts: None,
            batch_size: None,
            hidden: None,
            epochs: 10,
            lr: None,
            weight_decay: 0.0,
            dropout: 0.5,
            seed: 0,
            threads: None,
            eval_every: 1,
            prefetch: 2,
            fuse_input: true,
            sampler: SamplerSpec::default(),
            cache: CacheSpec::default(),
            feature_residency: Residency::Auto,
            feature_placement: FeaturePlacement::Auto,
            sampling_placement: SamplingPlacement::Auto,
            strategy: None,
            workers: 1,
            partition: None,
            sample_from: SampleScope::Partition,
            factored: FactoredSpec::default(),
        }
    }
}

/// The `"config"` member of a metrics file's JSON `text`, deserialised from its own slice of
/// the text; an error names the line and column in the whole text, as serde_json's own errors
/// would (its position within the member moved by where the member starts).
fn replay_config(text: &str) -> std::result::Result<TrainConfig, String> {
    #[derive(Deserialize)]
    struct Metrics<'a> {
        #[serde(borrow)]
        config: &'a serde_json::value::RawValue,
    }
    let member = serde_json::from_str::<Metrics>(text)
        .map_err(|e| e.to_string())?
        .config
        .get();
    serde_json::from_str(member).map_err(|e| {
        let message = e.to_string();
        if e.line() == 0 {
            return message;
        }
        // `member` is a slice of `text` (borrowed, not copied), so its offset is exact.
        let start = member.as_ptr() as usize - text.as_ptr() as usize;
        let before = &text[..start];
        let line = before.matches('\n').count() + e.line();
        let column = if e.line() == 1 {
            start - before.rfind('\n').map_or(0, |i| i + 1) + e.column()
        } else {
            e.column()
        };
        let own = format!(" at line {} column {}", e.line(), e.column());
        let what = message.strip_suffix(&own).unwrap_or(&message);
        format!("{what} at line {line} column {column}")
    })
}

impl TrainConfig {
    /// Reads a config from `path`: TOML, or JSON, either a config object or a metrics file
    /// written by a run (its `"config"` member is taken, so the run is replayed). A `.toml`
    /// file is read as TOML; any other is tried as JSON, then as TOML. Errors name the file
    /// and what was wrong, with its line and column where the text is the config itself.
    pub fn from_file(path: &Path) -> Result<TrainConfig> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ExecError::Invalid(format!("{}: {e}", path.display())))?;
        let bad = |e: String| ExecError::Invalid(format!("{}: {e}", path.display()));
        let is_toml = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("toml"));
        if is_toml {
            return toml::from_str(&text).map_err(|e| bad(e.to_string()));
        }
        let value: serde_json::Value = match serde_json::from_str(&text) {
            Ok(v) => v,
            Err(json) => {
                // TOML only when it says something: an empty or comment-only file (a cut-off
                // JSON config, say) would otherwise run the defaults without a word.
                let table: toml::Table = toml::from_str(&text).map_err(|toml| {
                    bad(format!(
                        "neither JSON ({json}) nor TOML ({})",
                        toml.to_string().trim_end()
                    ))
                })?;
                if table.is_empty() {
                    return Err(bad(format!("not JSON ({json}), and holds no setting")));
                }
                return table
                    .try_into()
                    .map_err(|e: toml::de::Error| bad(e.to_string()));
            }
        };
        match value.get("config") {
            // A metrics file: its config member, read from its own text so that an error
            // gives the line and column in the file (a hand-edited replay, say).
            Some(_) if value.get("epochs").is_some_and(|e| e.is_array()) => {
                replay_config(&text).map_err(|e| bad(format!("its \"config\" member: {e}")))
            }
            // The config itself, read again from the text so that errors say where.
            _ => serde_json::from_str(&text).map_err(|e| bad(e.to_string())),
        }
    }

    /// The strategy in effect: the configured one, else single for one worker and
    /// data-parallel for more.
    pub fn strategy_kind(&self) -> StrategyKind {
        self.strategy.unwrap_or(if self.workers > 1 {
            StrategyKind::DataParallel
        } else {
            StrategyKind::Single
        })
    }

    /// The FastGL Greedy Reorder window the training pipeline uses: `cache.reorder_window`
    /// with Match-Reorder on, else 0 (batches in sampled order).
    pub fn reorder_window(&self) -> usize {
        if self.cache.match_reorder {
            self.cache.reorder_window
        } else {
            0
        }
    }

    /// The sampler kind in effect (random walks for PinSAGE unless set).
    pub fn sampler_kind(&self) -> SamplerKind {
        self.sampler
            .kind
            .unwrap_or(if self.model == ModelKind::PinSage {
                SamplerKind::Randomwalk
            } else {
                SamplerKind::Khop
            })
    }

    /// The most batches `prefetch` and the Greedy Reorder window may hold in a queue: each
    /// queued batch holds its blocks and features, and queues are allocated to their bound.
    pub const MAX_QUEUED_BATCHES: usize = 1024;
    /// The widest hidden layer a run may ask for.
    pub const MAX_HIDDEN: usize = 1 << 16;
    /// The most threads (or in-process workers) a run may ask for.
    pub const MAX_THREADS: usize = 4096;
    /// The most batches a factored run's trial may time per role (the trial cycles through
    /// the epoch's batches, so a larger count only makes the run start later).
    pub const MAX_TRIAL_BATCHES: usize = 256;

    /// Checks what can be checked without the dataset: ranges and combinations of settings.
    /// Errors read like the command line's (`--workers must be at least 1`).
    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(ExecError::Invalid(m.to_string()));
        if self.epochs == 0 {
            return bad("--epochs must be at least 1");
        }
        if self.batch_size == Some(0) {
            return bad("--batch-size must be at least 1");
        }
        if self.hidden == Some(0) {
            return bad("--hidden must be at least 1");
        }
        if self.threads == Some(0) {
            return bad("--threads must be at least 1");
        }
        if self.workers == 0 {
            return bad("--workers must be at least 1");
        }
        if let Some(f) = &self.fanouts {
            if f.is_empty() {
                return bad("--fanouts needs at least one hop");
            }
        }
        // The config is written into the metrics JSON (so that it replays the run), and JSON
        // holds text: refused here rather than after the run, when the metrics are written.
        if let Some(d) = self.dataset.as_ref().filter(|d| d.to_str().is_none()) {
            return Err(ExecError::Invalid(format!(
                "--dataset {}: the path is not valid UTF-8, and a run's config and metrics JSON \
                 hold it as text; rename the folder, or link to it under a UTF-8 name",
                d.display()
            )));
        }
        let sane = |v: f32, min: f32| v.is_finite() && v >= min;
        if self.lr.is_some_and(|lr| !sane(lr, f32::MIN_POSITIVE)) || !sane(self.weight_decay, 0.0) {
            return bad("--lr must be positive and --weight-decay non-negative");
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return bad("--dropout must be in [0, 1)");
        }
        let max = Self::MAX_QUEUED_BATCHES;
        for (flag, v) in [
            ("--prefetch", self.prefetch),
            ("--reorder-window", self.cache.reorder_window),
        ] {
            if v > max {
                return Err(ExecError::Invalid(format!(
                    "{flag} {v}: at most {max} batches (each one queued holds its sampled blocks \
                     and features in memory)"
                )));
            }
        }
        // Far beyond any real setting, and small enough that what they size (weights,
        // threads) is allocated or started rather than aborting the process or stalling it.
        for (flag, v, most) in [
            ("--hidden", self.hidden.unwrap_or(0), Self::MAX_HIDDEN),
            ("--threads", self.threads.unwrap_or(0), Self::MAX_THREADS),
            ("--workers", self.workers, Self::MAX_THREADS),
        ] {
            if v > most {
                return Err(ExecError::Invalid(format!("{flag} {v}: at most {most}")));
            }
        }
        if self.cache.reorder_window > 1 && !self.cache.match_reorder {
            return Err(ExecError::Invalid(format!(
                "--reorder-window {}: reordering only helps Match (reuse of the previous \
                 batch's rows); add --match-reorder",
                self.cache.reorder_window
            )));
        }
        match self.strategy_kind() {
            StrategyKind::Single if self.workers > 1 => {
                return Err(ExecError::Invalid(format!(
                    "--strategy single runs one worker, not --workers {}; use --strategy \
                     data-parallel",
                    self.workers
                )))
            }
            StrategyKind::Single if self.partition.is_some() => {
                return bad("--partition is for --strategy data-parallel");
            }
            _ => {}
        }
        if self.strategy_kind() == StrategyKind::Split {
            if self.partition.is_some() {
                return bad(
                    "--partition is for --strategy data-parallel; split parallelism reads the \
                     METIS ranges of the dataset itself (fanout dataset partition --method metis)",
                );
            }
            if self.cache.match_reorder {
                return bad("--match-reorder is not available with --strategy split");
            }
            if self.dataset.is_none() {
                return bad(
                    "--strategy split needs --dataset: a dataset written by fanout dataset \
                     partition --method metis --parts N (one part per worker)",
                );
            }
        }
        // FastGL's Greedy Reorder orders a window of one worker's sampled batches; several
        // workers would each order their own slices, and one step's gradients would then add
        // slices of different batches.
        if self.reorder_window() > 1 && (self.workers > 1 || self.strategy_kind().is_factored()) {
            return Err(ExecError::Invalid(format!(
                "--reorder-window {}: Greedy Reorder needs the whole window of batches on one \
                 worker; with {} each worker sees only its own slices, in its own order. Use \
                 --workers 1 with --strategy single, or drop --reorder-window (--match-reorder \
                 still reuses the previous batch's rows)",
                self.cache.reorder_window,
                if self.strategy_kind().is_factored() {
                    "--strategy factored or hybrid".to_string()
                } else {
                    format!("--workers {}", self.workers)
                }
            )));
        }
        if self.strategy_kind().is_factored() {
            if self.partition.is_some() {
                return bad("--partition is for --strategy data-parallel, not factored or hybrid");
            }
            let f = &self.factored;
            if f.queue_depth == 0 {
                return bad("--queue-depth must be at least 1");
            }
            if !(1..=Self::MAX_TRIAL_BATCHES).contains(&f.trial_batches) {
                return Err(ExecError::Invalid(format!(
                    "[factored] trial_batches = {}: expected 1 to {} (the batches each role \
                     times before the split between samplers and trainers is chosen)",
                    f.trial_batches,
                    Self::MAX_TRIAL_BATCHES
                )));
            }
            if let Some(s) = f.samplers {
                if self.workers > 1 && (s == 0 || s >= self.workers) {
                    return Err(ExecError::Invalid(format!(
                        "--samplers {s} with --workers {}: factored runs need at least one \
                         sampler and one trainer (1 to {})",
                        self.workers,
                        self.workers - 1
                    )));
                }
            }
        }
        if self.partition.is_some() && self.dataset.is_none() {
            return bad("--partition needs --dataset (partitions live beside a dataset)");
        }
        // Settings another strategy would silently ignore.
        if !self.strategy_kind().is_factored() && self.factored != FactoredSpec::default() {
            return bad(
                "--samplers, --no-switching, --queue-depth and the rest of a config's \
                 [factored] table (trial_batches) are for --strategy factored or hybrid",
            );
        }
        if self.strategy_kind().is_factored() && self.workers == 1 {
            if let Some(s) = self.factored.samplers {
                return Err(ExecError::Invalid(format!(
                    "--samplers {s}: one worker samples and trains in turn; give --workers 2 \
                     or more to split them"
                )));
            }
        }
        if self.sample_from != SampleScope::default() && self.partition.is_none() {
            return bad("--sample-from is for --partition (PaGraph's partitioned workers)");
        }
        Ok(())
    }

    /// Fills in the settings whose defaults depend on the model and the dataset (fanouts,
    /// batch size, hidden width, learning rate), from `in_dim` and `num_classes` of the
    /// dataset. After this the config describes the run completely.
    pub fn resolve(&mut self, in_dim: usize, num_classes: usize) {
        let paper = PaperSetting::for_kind(self.model, in_dim, num_classes);
        if self.fanouts.is_none() {
            self.fanouts = Some(paper.fanouts.iter().map(|&k| k as u32).collect());
        }
        if self.batch_size.is_none() {
            let embedded = self.dataset.is_none();
            self.batch_size = Some(if embedded { 1000 } else { paper.batch_size });
        }
        if self.hidden.is_none() {
            self.hidden = Some(paper.model.hidden);
        }
        if self.lr.is_none() {
            self.lr = Some(paper.lr);
        }
        if self.sampler.kind.is_none() {
            self.sampler.kind = Some(self.sampler_kind());
        }
        if self.strategy.is_none() {
            self.strategy = Some(self.strategy_kind());
        }
    }

    /// The first top-level setting in which `self` and `other` differ, as `name: a vs b`
    /// (for refusing workers started with different configs); `None` when equal.
    pub fn first_difference(&self, other: &TrainConfig) -> Option<String> {
        let (a, b) = (
            serde_json::to_value(self).ok()?,
            serde_json::to_value(other).ok()?,
        );
        let (a, b) = (a.as_object()?, b.as_object()?);
        a.iter().find(|(k, v)| b.get(*k) != Some(v)).map(|(k, v)| {
            format!(
                "{k}: {v} vs {}",
                b.get(k).unwrap_or(&serde_json::Value::Null)
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_round_trip_through_json_and_toml() {
        let mut c = TrainConfig {
            dataset: Some("data/cora".into()),
            model: ModelKind::Gcn,
            workers: 3,
            partition: Some("pagraph-3".into()),
            ..TrainConfig::default()
        };
        c.cache.policy = "degree".into();
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<TrainConfig>(&json).unwrap(), c);
        let toml_text = toml::to_string(&c).unwrap();
        assert_eq!(toml::from_str::<TrainConfig>(&toml_text).unwrap(), c);
    }

    #[test]
    fn partial_files_take_defaults_and_unknown_keys_are_refused() {
        let c: TrainConfig = toml::from_str("model = \"gat\"\nepochs = 3\n").unwrap();
        assert_eq!(c.model, ModelKind::Gat);
        assert_eq!(c.epochs, 3);
        assert_eq!(c.dropout, 0.5);
        let e = toml::from_str::<TrainConfig>("epoch = 3\n").unwrap_err();
        assert!(e.to_string().contains("epoch"), "{e}");
    }

    #[test]
    fn metrics_files_replay_their_config() {
        let dir = tempfile::tempdir().unwrap();
        let c = TrainConfig {
            epochs: 7,
            seed: 11,
            ..TrainConfig::default()
        };
        let metrics = serde_json::json!({ "test_acc": 0.5, "config": c, "epochs": [] });
        let p = dir.path().join("m.json");
        std::fs::write(&p, metrics.to_string()).unwrap();
        assert_eq!(TrainConfig::from_file(&p).unwrap(), c);
        // A hand-edited replay names the line and column of the bad value in the whole file,
        // pretty-printed (the member starts on line 3) or on one line.
        let mut text = serde_json::to_string_pretty(&metrics).unwrap();
        text = text.replace("\"epochs\": 7", "\"epochs\": \"seven\"");
        let at = text.find("\"seven\"").unwrap();
        let line = text[..at].matches('\n').count() + 1;
        let column = at - text[..at].rfind('\n').unwrap() + "\"seven\"".len() - 1;
        assert!(line > 3, "{text}");
        std::fs::write(&p, &text).unwrap();
        let e = TrainConfig::from_file(&p).unwrap_err().to_string();
        let want = format!("at line {line} column {column}");
        assert!(
            e.contains("m.json") && e.contains("\"config\" member"),
            "{e}"
        );
        assert!(
            e.contains("expected u") && e.ends_with(&want),
            "{e} (want {want})"
        );
        let one_line = metrics.to_string().replace("\"seed\":11", "\"seed\":-1");
        let at = one_line.find("-1").unwrap() + 2;
        std::fs::write(&p, &one_line).unwrap();
        let e = TrainConfig::from_file(&p).unwrap_err().to_string();
        assert!(
            e.ends_with(&format!("at line 1 column {at}")),
            "{e} in {one_line}"
        );
        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, "epochs = \"many\"\n").unwrap();
        let e = TrainConfig::from_file(&bad).unwrap_err().to_string();
        assert!(e.contains("bad.toml") && e.contains("epochs"), "{e}");
    }

    #[cfg(unix)]
    #[test]
    fn a_dataset_path_that_is_not_utf8_is_refused_before_the_run() {
        use std::os::unix::ffi::OsStrExt;
        let c = TrainConfig {
            dataset: Some(std::ffi::OsStr::from_bytes(b"data/d\xff").into()),
            ..TrainConfig::default()
        };
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("--dataset data/d\u{fffd}") && e.contains("not valid UTF-8"),
            "{e}"
        );
        let c = TrainConfig {
            dataset: Some("data/d\u{e9}".into()),
            ..TrainConfig::default()
        };
        c.validate().unwrap();
        assert!(serde_json::to_value(&c).is_ok());
    }

    #[test]
    fn strategy_follows_workers_and_bad_combinations_are_refused() {
        let mut c = TrainConfig::default();
        assert_eq!(c.strategy_kind(), StrategyKind::Single);
        c.workers = 2;
        assert_eq!(c.strategy_kind(), StrategyKind::DataParallel);
        assert!(c.validate().is_ok());
        c.strategy = Some(StrategyKind::Single);
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("--workers 2"));
        let c = TrainConfig {
            dropout: 1.0,
            ..TrainConfig::default()
        };
        assert!(c.validate().is_err());
        let c = TrainConfig {
            partition: Some("p".into()),
            workers: 2,
            ..TrainConfig::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("--dataset"));
    }

    #[test]
    fn resolve_fills_model_defaults_and_differences_are_named() {
        let mut c = TrainConfig {
            model: ModelKind::PinSage,
            ..TrainConfig::default()
        };
        c.resolve(100, 47);
        assert_eq!(c.sampler.kind, Some(SamplerKind::Randomwalk));
        assert_eq!(c.batch_size, Some(1000));
        assert!(c.fanouts.is_some() && c.hidden.is_some() && c.lr.is_some());
        let mut d = c.clone();
        assert_eq!(c.first_difference(&d), None);
        d.seed = 4;
        assert_eq!(c.first_difference(&d).unwrap(), "seed: 0 vs 4");
    }
}
