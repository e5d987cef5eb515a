//! `fanout train`: a thin shell over the run API ([`fanout_exec::train`]): flags (over an
//! optional config file) become a [`TrainConfig`], progress is drawn on the terminal, and rank
//! 0 writes the metrics JSON and the checkpoint.

use crate::cmd::residency::ResidencyArg;
use crate::cmd::sampler_args::SamplerArgs;
use crate::memory::HostHeap;
use crate::progress::Bars;
use clap::{Args, ValueEnum};
use fanout_compute::ModelKind;
use fanout_exec::{
    BatchOutcome, EpochMetrics, FeaturePlacement, FitObserver, RunEnv, SampleScope,
    SamplingPlacement, StrategyKind, TrainConfig, TrainOutcome,
};
use fanout_sample::parse_fanouts;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::path::{Path, PathBuf};

/// Train a GNN on a dataset (or, without --dataset, on a small embedded synthetic graph)
///
/// Fanouts are in hop order from the seeds ("10,25": each seed draws 10 neighbours, each of
/// those 25). Defaults per model follow the papers (GNNLab/FastGL): sage 10,25 (2 layers),
/// gcn/gat/gin 15,10,5, pinsage top-5 random-walk neighbours x3; batch 8000, lr 0.003,
/// dropout 0.5. Validation and test sets are evaluated with the same sampler and fanouts.
///
/// Several workers: `--workers N` runs N data-parallel workers in this process (threads);
/// `mpirun -np N fanout train ...` (a build with `--features mpi`) runs one per process.
///
/// Example: fanout train --dataset data/cora --model gcn --epochs 50 --metrics-out m.json
#[derive(Args)]
// A flag given twice takes its last value (so scripts can append overrides).
#[command(verbatim_doc_comment, args_override_self = true)]
pub struct TrainArgs {
    /// A run config: TOML, JSON, or the metrics JSON of an earlier run (which replays it).
    /// Flags given on the command line override its settings (`--match-reorder=false`,
    /// `--replace=false` turn off switches the file turns on).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Dataset directory (default: a 100,000-vertex products-like graph generated in memory).
    #[arg(long)]
    pub dataset: Option<PathBuf>,
    /// Model [default: sage].
    #[arg(long, value_enum)]
    pub model: Option<ModelArg>,
    /// Per-hop fanouts from the seeds; the layer count is their number (default per model).
    /// khop/weighted: neighbours per vertex; randomwalk: top-k per layer; layerwise: vertices
    /// per layer.
    #[arg(long)]
    pub fanouts: Option<String>,
    #[command(flatten)]
    pub sampler: SamplerArgs,
    /// Seeds per mini-batch, over all workers together (default 8000; 1000 on the embedded
    /// dataset).
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Hidden width (default per model: 256, gat/gin 64).
    #[arg(long)]
    pub hidden: Option<usize>,
    /// Epochs [default: 10].
    #[arg(long)]
    pub epochs: Option<u64>,
    /// Adam learning rate (default 0.003).
    #[arg(long)]
    pub lr: Option<f32>,
    /// L2 weight decay (PyTorch Adam semantics) [default: 0].
    #[arg(long)]
    pub weight_decay: Option<f32>,
    /// Dropout between layers [default: 0.5].
    #[arg(long)]
    pub dropout: Option<f32>,
    /// Seed of initialisation, shuffling, sampling and dropout (runs are deterministic per
    /// seed and worker count) [default: 0].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Threads for sampling and compute in this process, shared by its workers (default: all
    /// cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Evaluate on the validation and test sets every N epochs and after the last (0: only
    /// after the last) [default: 1].
    #[arg(long)]
    pub eval_every: Option<u64>,
    /// Write the run's metrics as JSON (test_acc, per-epoch times, loss and accuracies, each
    /// worker's figures, and the full config under "config", so `--config` replays it).
    #[arg(long)]
    pub metrics_out: Option<PathBuf>,
    /// Save the best-validation model (safetensors) for `fanout eval`, with the training
    /// state (current parameters, Adam moments and step, epochs done) for `--resume`. Written
    /// atomically after every epoch, so an interrupted or failed run keeps its last good one
    /// (--strategy factored and hybrid write it once, at the end). May name the --resume
    /// checkpoint, which is then updated as the run goes.
    #[arg(long)]
    pub save_model: Option<PathBuf>,
    /// Continue the run saved in CKPT (by --save-model) up to --epochs, with the same model,
    /// dataset and settings (only --epochs, --threads, --prefetch, --eval-every,
    /// --feature-residency, --feature-placement and --no-fuse-input may change). The result
    /// equals the
    /// uninterrupted run's. Metrics list the resumed epochs only. Not for --strategy factored
    /// or hybrid.
    #[arg(long, value_name = "CKPT")]
    pub resume: Option<PathBuf>,
    /// Batches queued between pipeline stages [default: 2].
    #[arg(long)]
    pub prefetch: Option<usize>,
    /// Feature cache in front of the feature store: none, random, degree (PaGraph), presc or
    /// prescK (GNNLab PreSC with K pre-sampling epochs). The epoch summaries report the hit rate
    /// and the bytes gathered from the host store [default: none].
    #[arg(long)]
    pub cache_policy: Option<String>,
    /// Cache size: a ratio of all vertices ("0.1", "10%"), bytes ("512MiB", "2GB"), or "auto"
    /// (PaGraph): one trial training step (sample, extract, forward, backward of the first
    /// batch, no optimiser step) measures its peak memory, and the cache gets what is left of
    /// --device-memory after that peak, the batches queued in the pipeline and a safety margin
    /// of min(1 GiB, device memory / 16). auto needs a --cache-policy [default: 0.1].
    #[arg(long)]
    pub cache_ratio: Option<String>,
    /// Device memory budget of --cache-ratio auto, in bytes ("2GiB", "512MB" or a whole
    /// number). Default on the CPU backend: MemAvailable of /proc/meminfo (the "device" is the
    /// host heap there, so the --workers of one process share it equally).
    #[arg(long, value_name = "BYTES")]
    pub device_memory: Option<String>,
    /// FastGL Match: reuse the rows of the previous mini-batch and gather only the new ones.
    /// The batches keep their sampled order unless --reorder-window is given too.
    /// `--match-reorder=false` turns off what a --config file turns on.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub match_reorder: Option<bool>,
    /// FastGL Greedy Reorder (needs --match-reorder): take N sampled batches at a time and
    /// train them in the order where consecutive batches share the most input nodes, so Match
    /// reuses more rows. Every batch is still trained once per epoch; the order (and so the
    /// trained model) depends on N. 0 or 1: sampled order. The loader samples max(N,
    /// --prefetch) batches ahead, so up to 2N sampled batches are held in memory.
    #[arg(long, value_name = "N")]
    pub reorder_window: Option<usize>,
    /// Build every batch's whole input matrix even where the first layer could aggregate its
    /// input straight from the stored features (GraphSAGE, GCN, GIN; no cache); the results are
    /// the same bit for bit, this only spends more memory traffic (for comparisons).
    #[arg(long)]
    pub no_fuse_input: bool,
    /// Where the features are read from during training: a copy in huge-page memory (faster
    /// random row gathers; auto copies when they take at most a quarter of available memory,
    /// and at most 16 GiB) or the memory-mapped dataset file [default: auto].
    #[arg(long, value_enum)]
    pub feature_residency: Option<ResidencyArg>,
    /// Where each batch's feature rows are gathered: device keeps them on the GPU (needs
    /// --device cuda): without --cache-policy or --match-reorder every row is copied there once
    /// and gathered there (nothing but ids and blocks crosses per step); with them the cached
    /// rows are copied there once, the previous batch's rows stay there for Match, and each
    /// batch uploads only its misses; uva keeps every row in page-locked host memory that the
    /// GPU reads in place (zero-copy, for features that do not fit on it; with a cache or
    /// Match, the rows they miss are read there instead of uploaded);
    /// host gathers on the CPU and uploads every row; auto picks, on a GPU without a cache or
    /// Match, device when the rows as f32 take at most half its free memory and a quarter of
    /// the host's available memory, else uva when they take at most a quarter of the host's,
    /// else host [default: auto].
    #[arg(long, value_enum)]
    pub feature_placement: Option<PlacementArg>,
    /// Where batches are sampled (with --device cuda): device copies the topology to the GPU
    /// once and draws each batch there (khop, weighted and randomwalk; the same batches as the
    /// host sampler, bit for bit); uva does the same with the arcs read from pinned host memory
    /// (graphs whose arcs do not fit on the GPU); host samples on the CPU threads; auto picks
    /// device on a GPU for those samplers when the topology takes at most a quarter of its
    /// free memory, else (not weighted) uva when the arcs take at most a quarter of the host's
    /// available memory; device and uva may take at most three quarters of the
    /// GPU's free memory [default: auto].
    #[arg(long, value_enum)]
    pub sampling_placement: Option<SamplingArg>,
    /// Data-parallel workers in this process (threads, each with its own share of --threads;
    /// with --device cuda, each on a GPU of its own). Under mpirun, each process is one worker
    /// instead [default: 1].
    #[arg(long)]
    pub workers: Option<usize>,
    /// How the run is spread over workers (default: single for one worker, data-parallel for
    /// more).
    #[arg(long, value_enum)]
    pub strategy: Option<StrategyArg>,
    /// A partition written by `fanout dataset partition` (e.g. pagraph-4): each data-parallel
    /// worker trains its part's training vertices and caches by degree inside its part
    /// (PaGraph). Without it, every step's batch is split between the workers.
    #[arg(long, value_name = "NAME")]
    pub partition: Option<String>,
    /// Where partitioned workers sample from: inside their partition (PaGraph's self-reliant
    /// workers; at most the partition's hops) or the whole graph [default: partition].
    #[arg(long, value_enum)]
    pub sample_from: Option<SampleFromArg>,
    /// Sampler workers of --strategy factored (default: GNNLab's cost model from a trial).
    #[arg(long, value_name = "N")]
    pub samplers: Option<usize>,
    /// --strategy factored: keep samplers sampling only (no dynamic switching to training).
    #[arg(long)]
    pub no_switching: bool,
    /// --strategy factored: slices a sampler may send one trainer ahead of its training
    /// [default: 4].
    #[arg(long, value_name = "N")]
    pub queue_depth: Option<usize>,
    /// Device to compute on: cpu, cuda (= cuda:0) or cuda:N. CUDA needs a build with
    /// `--features cuda` and the NVIDIA driver, NVRTC and cuBLAS libraries at run time; the
    /// model computes on the GPU (see --feature-placement and --sampling-placement).
    #[arg(long, default_value = "cpu")]
    pub device: fanout_cuda::DeviceSpec,
}

/// The model kinds `--model` accepts.
#[derive(Clone, Copy, ValueEnum)]
pub enum ModelArg {
    /// GraphSAGE, mean aggregator.
    Sage,
    /// GCN (symmetric normalisation).
    Gcn,
    /// GAT (8 heads).
    Gat,
    /// GIN.
    Gin,
    /// PinSAGE on random-walk neighbourhoods.
    Pinsage,
}

impl From<ModelArg> for ModelKind {
    fn from(m: ModelArg) -> ModelKind {
        match m {
            ModelArg::Sage => ModelKind::Sage,
            ModelArg::Gcn => ModelKind::Gcn,
            ModelArg::Gat => ModelKind::Gat,
            ModelArg::Gin => ModelKind::Gin,
            ModelArg::Pinsage => ModelKind::PinSage,
        }
    }
}

/// `--strategy`.
#[derive(Clone, Copy, ValueEnum)]
pub enum StrategyArg {
    /// One worker.
    Single,
    /// PaGraph's data parallelism: replicas on shares of the seeds, gradients all-reduced.
    DataParallel,
    /// GNNLab's factored design: sampler workers feed trainer workers through a queue.
    Factored,
    /// MorphGL's routes on the factored layout: trainers prepare part of their batches
    /// themselves, split by MorphGL's cost model.
    Hybrid,
    /// GSplit's split parallelism: each step's batch split across workers by the dataset's
    /// METIS partition (fanout dataset partition --method metis --parts N).
    Split,
}

/// `--sample-from`.
#[derive(Clone, Copy, ValueEnum)]
pub enum SampleFromArg {
    /// Inside the worker's partition (self-reliant).
    Partition,
    /// The whole graph.
    Global,
}

impl TrainArgs {
    /// The run's config: `--config`'s file (or the defaults) with every given flag applied.
    pub fn to_config(&self) -> Result<TrainConfig, String> {
        let mut c = match &self.config {
            Some(p) => TrainConfig::from_file(p).map_err(|e| format!("--config {e}"))?,
            None => TrainConfig::default(),
        };
        if let Some(d) = &self.dataset {
            c.dataset = Some(d.clone());
        }
        if let Some(m) = self.model {
            c.model = m.into();
        }
        self.sampler.apply(&mut c.sampler);
        if let Some(f) = &self.fanouts {
            c.fanouts = Some(parse_fanouts(f).map_err(|e| format!("--fanouts: {e}"))?);
        }
        set(&mut c.batch_size, self.batch_size.map(Some));
        set(&mut c.hidden, self.hidden.map(Some));
        set(&mut c.epochs, self.epochs);
        set(&mut c.lr, self.lr.map(Some));
        set(&mut c.weight_decay, self.weight_decay);
        set(&mut c.dropout, self.dropout);
        set(&mut c.seed, self.seed);
        set(&mut c.threads, self.threads.map(Some));
        set(&mut c.eval_every, self.eval_every);
        set(&mut c.prefetch, self.prefetch);
        c.fuse_input &= !self.no_fuse_input;
        set(&mut c.cache.policy, self.cache_policy.clone());
        set(&mut c.cache.ratio, self.cache_ratio.clone());
        if let Some(r) = self
            .cache_ratio
            .as_ref()
            .filter(|_| c.cache.policy.trim() == "none")
        {
            return Err(format!(
                "--cache-ratio {r} sizes a cache: add --cache-policy (random, degree or presc)"
            ));
        }
        set(
            &mut c.cache.device_memory,
            self.device_memory.clone().map(Some),
        );
        set(&mut c.cache.match_reorder, self.match_reorder);
        set(&mut c.cache.reorder_window, self.reorder_window);
        set(
            &mut c.feature_residency,
            self.feature_residency.map(Into::into),
        );
        set(
            &mut c.feature_placement,
            self.feature_placement.map(PlacementArg::placement),
        );
        set(
            &mut c.sampling_placement,
            self.sampling_placement.map(SamplingArg::placement),
        );
        set(&mut c.workers, self.workers);
        if let Some(s) = self.strategy {
            c.strategy = Some(match s {
                StrategyArg::Single => StrategyKind::Single,
                StrategyArg::DataParallel => StrategyKind::DataParallel,
                StrategyArg::Factored => StrategyKind::Factored,
                StrategyArg::Hybrid => StrategyKind::Hybrid,
                StrategyArg::Split => StrategyKind::Split,
            });
        }
        set(&mut c.factored.samplers, self.samplers.map(Some));
        c.factored.switching &= !self.no_switching;
        set(&mut c.factored.queue_depth, self.queue_depth);
        set(&mut c.partition, self.partition.clone().map(Some));
        if let Some(s) = self.sample_from {
            c.sample_from = match s {
                SampleFromArg::Partition => SampleScope::Partition,
                SampleFromArg::Global => SampleScope::Global,
            };
        }
        Ok(c)
    }
}

/// Overwrites `slot` with `v` when a flag gave one.
fn set<T>(slot: &mut T, v: Option<T>) {
    if let Some(v) = v {
        *slot = v;
    }
}

/// Draws rank 0's progress: a bar per epoch, the set-up lines and one summary line per epoch;
/// keeps the finished epochs' figures for a run that stops early.
pub struct Observer {
    bar: Option<ProgressBar>,
    quiet: bool,
    epochs: u64,
    done: Vec<EpochMetrics>,
}

impl Observer {
    /// Writes the figures of the epochs done to `--metrics-out` when the run stopped early
    /// (`fanout_exec::stopped_run_report`) and returns `msg` saying so.
    fn stopped(&self, a: &TrainArgs, cfg: &TrainConfig, msg: String) -> String {
        let (Some(p), false) = (&a.metrics_out, self.done.is_empty()) else {
            return msg;
        };
        let report = fanout_exec::stopped_run_report(cfg, &self.done, &msg);
        match write_atomic(p, &report) {
            Ok(()) => format!(
                "{msg}; the figures of the {} epoch{} done are in {}",
                self.done.len(),
                if self.done.len() == 1 { "" } else { "s" },
                p.display()
            ),
            Err(e) => format!("{msg}; writing the epochs done failed too: {e}"),
        }
    }
}

impl FitObserver for Observer {
    fn epoch_start(&mut self, epoch: u64, batches: usize) {
        if self.quiet {
            return;
        }
        let b = ProgressBar::with_draw_target(Some(batches as u64), ProgressDrawTarget::stderr());
        b.set_style(
            ProgressStyle::with_template(
                "epoch {prefix} [{bar:30}] {pos}/{len} batches {per_sec} eta {eta} {msg}",
            )
            .unwrap()
            .progress_chars("=> "),
        );
        b.set_prefix(format!("{epoch}/{}", self.epochs));
        self.bar = Some(b);
    }
    fn batch_done(&mut self, o: &BatchOutcome) {
        if let Some(b) = &self.bar {
            b.set_message(format!("loss {:.4}", o.loss));
            b.inc(1);
        }
    }
    fn eval_start(&mut self, _: u64) {
        if let Some(b) = &self.bar {
            b.set_message("evaluating");
        }
    }
    fn note(&mut self, line: &str) {
        println!("{line}");
    }
    fn epoch_end(&mut self, m: &EpochMetrics) {
        self.done.push(m.clone());
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
        let acc = |a: Option<f64>| a.map_or("-".to_string(), |v| format!("{v:.4}"));
        let sync = if m.workers.is_empty() {
            String::new()
        } else {
            format!(
                "  allreduce {:.2}s ({:.1} MB)  slowest worker {}",
                m.allreduce_s,
                m.allreduce_bytes as f64 / 1e6,
                m.workers
                    .iter()
                    .max_by(|a, b| a.wall_s.total_cmp(&b.wall_s))
                    .map_or(0, |w| w.rank)
            )
        };
        let floor = floor_note(m);
        let run_bytes = m.run_extract();
        println!(
            "epoch {:>3}  {:>7.2}s{floor}  sample {:.2}s  extract {:.2}s  train {:.2}s  loss {:.4}  train_acc {:.4}  val_acc {}  host {:.1} MB  reused {:.1} MB  hit {:.1}%{sync}",
            m.epoch,
            m.wall_s,
            m.sample_s,
            m.extract_s,
            m.train_s,
            m.loss,
            m.train_acc,
            acc(m.val_acc),
            // Every worker's bytes: with several, `m.extract` is this (rank 0's) alone.
            run_bytes.bytes_from_host as f64 / 1e6,
            run_bytes.bytes_reused as f64 / 1e6,
            100.0 * run_bytes.hit_rate()
        );
    }
}

/// `--feature-placement`.
#[derive(Clone, Copy, ValueEnum)]
pub enum PlacementArg {
    /// Device on a GPU whose free memory holds the rows twice over, without a cache.
    Auto,
    /// Gathered on the host and uploaded per batch.
    Host,
    /// Copied to the GPU once, gathered there.
    Device,
    /// In page-locked host memory, gathered by the GPU over the bus (zero-copy); with a cache,
    /// the misses only.
    Uva,
}

impl PlacementArg {
    fn placement(self) -> FeaturePlacement {
        match self {
            PlacementArg::Auto => FeaturePlacement::Auto,
            PlacementArg::Host => FeaturePlacement::Host,
            PlacementArg::Device => FeaturePlacement::Device,
            PlacementArg::Uva => FeaturePlacement::Uva,
        }
    }
}

/// `--sampling-placement`.
#[derive(Clone, Copy, ValueEnum)]
pub enum SamplingArg {
    /// Device (or uva) on a GPU for k-hop sampling, when the topology fits (see above).
    Auto,
    /// The host's sampler threads.
    Host,
    /// The GPU (k-hop sampling only).
    Device,
    /// The GPU, reading the arcs from pinned host memory (graphs whose arcs do not fit there).
    Uva,
}

impl SamplingArg {
    fn placement(self) -> SamplingPlacement {
        match self {
            SamplingArg::Auto => SamplingPlacement::Auto,
            SamplingArg::Host => SamplingPlacement::Host,
            SamplingArg::Device => SamplingPlacement::Device,
            SamplingArg::Uva => SamplingPlacement::Uva,
        }
    }
}

/// Runs `fanout train`: in this process, or as one MPI rank when started by mpirun.
pub fn run(
    a: &TrainArgs,
    quiet: bool,
    cancel: Option<&fanout_graph::Cancel>,
) -> Result<(), String> {
    let cfg = a.to_config()?;
    check_outputs(a)?;
    fanout_exec::tune_allocator();
    if fanout_comm::launched_by_mpi() {
        // Validated by each rank once the launcher's rank count is known; each rank opens
        // its own device, chosen by its place on its machine.
        return crate::cmd::mpi::train(a, &cfg, quiet);
    }
    let (compute, device) = fanout_exec::Compute::open(a.device)
        .map_err(|why| format!("--device {}: {why}", a.device))?;
    cfg.validate().map_err(|e| settings_error(e, a))?;
    if cfg.dataset.is_none() && !quiet {
        eprintln!(
            "no --dataset: training on an embedded products-like graph ({} vertices, generated in memory)",
            fanout_exec::EMBEDDED_NODES
        );
    }
    let bars = Bars::new(quiet);
    let probe = HostHeap;
    let env = RunEnv {
        progress: &bars,
        probe: Some(&probe),
        cancel,
        checkpoint: a.save_model.as_deref(),
        resume: a.resume.as_deref(),
    };
    let mut obs = observer(&cfg, quiet);
    let out = compute
        .train(&cfg, &env, &mut obs)
        .map_err(|e| obs.stopped(a, &cfg, e.to_string()))?;
    finish(a, &out, Some(&device))
}

/// A settings error of the run; with `--config`, it says that the setting named by its flag
/// may come from the file, under the flag's name with `_` for `-`.
pub fn settings_error(e: fanout_exec::ExecError, a: &TrainArgs) -> String {
    match &a.config {
        Some(p) => format!(
            "{e} (the settings come from --config {} and the flags; in the file a flag's \
             setting is its name with _ for -, e.g. --batch-size is batch_size, some inside a \
             table, e.g. --reorder-window is reorder_window under [cache])",
            p.display()
        ),
        None => e.to_string(),
    }
}

/// Refuses, before anything runs, outputs that could not be written or would write over the
/// run's config, the checkpoint it resumes, or each other (`fanout_exec::check_outputs`).
/// `--save-model` may name the checkpoint `--resume` reads: it is then updated as the run goes.
fn check_outputs(a: &TrainArgs) -> Result<(), String> {
    let outputs: Vec<(&str, &Path)> = [
        ("--metrics-out", a.metrics_out.as_deref()),
        ("--save-model", a.save_model.as_deref()),
    ]
    .into_iter()
    .filter_map(|(f, p)| Some((f, p?)))
    .collect();
    let updated = |r: &Path| {
        a.save_model
            .as_deref()
            .is_some_and(|s| fanout_exec::outputs::same_file(r, s))
    };
    let inputs: Vec<(&str, &Path)> = [
        ("--config", a.config.as_deref()),
        ("--resume", a.resume.as_deref().filter(|r| !updated(r))),
    ]
    .into_iter()
    .filter_map(|(f, p)| Some((f, p?)))
    .collect();
    fanout_exec::check_outputs(&outputs, &inputs).map_err(|e| e.to_string())
}

/// Rank 0's observer.
pub fn observer(cfg: &TrainConfig, quiet: bool) -> Observer {
    Observer {
        bar: None,
        quiet,
        epochs: cfg.epochs,
        done: Vec::new(),
    }
}

/// Prints the run's summary and writes the metrics JSON (with `device`'s summary under
/// `"device"` when given) and the checkpoint (rank 0's job).
pub fn finish(
    a: &TrainArgs,
    out: &TrainOutcome,
    device: Option<&fanout_cuda::DeviceInfo>,
) -> Result<(), String> {
    let m = &out.metrics;
    // The floor of the median epoch's worth of work: the median over the same epochs.
    let floor = m
        .median_floor_s()
        .filter(|&f| f > 0.0)
        .map_or(String::new(), |f| {
            // Weight gradients that skipped zeros did less arithmetic than the floor counts:
            // say how far the epoch is from what was done, when that is noticeably less.
            let done = m
                .median_performed_bound_s()
                .filter(|&d| d > 0.0 && d < 0.95 * f)
                .map_or(String::new(), |d| {
                    format!(
                        "; {:.2}x the {d:.2}s of the products done, zeros skipped",
                        m.median_epoch_s / d
                    )
                });
            format!(" = {:.2}x its floor ({f:.2}s{done})", m.median_epoch_s / f)
        });
    println!(
        "test accuracy {:.4} (epoch {}, best validation accuracy {:.4}); median epoch {:.2}s{floor}{}",
        m.test_acc,
        m.best_epoch,
        m.best_val_acc,
        m.median_epoch_s,
        if out.workers > 1 {
            format!(" over {} workers ({})", out.workers, out.comm)
        } else {
            String::new()
        }
    );
    // The floor counts every nominal GEMM flop and gathered byte at the machine's rates. An
    // epoch well below the floor of the arithmetic actually done (zero-skipped weight
    // gradients left out) means either that the cached rates were measured while something
    // else ran, or that the kernels skipped other work the floor counts (zero rows of sparse
    // features, as in cora's bag-of-words): say both.
    let done = m.median_performed_bound_s().or(m.median_floor_s());
    if let Some(f) = done.filter(|&f| m.median_epoch_s < 0.9 * f) {
        let file = fanout_exec::floor::rates_file()
            .map_or("the rates cache".into(), |p| p.display().to_string());
        eprintln!(
            "note: the median epoch ({:.2}s) is faster than its floor ({f:.2}s): either the features are sparse and the kernels skipped their zero rows, or the machine rates in {file} were measured under load and are too low (delete that file to measure them again on a quiet machine)",
            m.median_epoch_s
        );
    }
    if let Some(p) = &a.metrics_out {
        let report = device.map_or_else(|| out.report(), |d| out.report_on(d));
        write_atomic(p, &report)?;
    }
    if let Some(p) = &a.save_model {
        out.save_model(p).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Writes `json` (pretty) to `path` atomically (`fanout_compute::io::write_atomically`).
fn write_atomic(path: &Path, json: &serde_json::Value) -> Result<(), String> {
    let text = serde_json::to_string_pretty(json).map_err(|e| e.to_string())?;
    fanout_compute::io::write_atomically(path, (text + "\n").as_bytes())
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The epoch line's distance to the floor, `  = 2.10x floor (compute 0.41s, memory 0.05s)`:
/// the epoch against what its GEMM flops (counted dense) and gathered bytes take at this
/// machine's measured rates. When zero-skipping did visibly fewer flops, the compute floor of
/// those is named too (`compute 0.19s, 0.12s done`), since such an epoch can be shorter than
/// its dense floor. Empty without measured rates.
fn floor_note(m: &EpochMetrics) -> String {
    match (m.floor_s(), m.compute_floor_s, m.memory_floor_s) {
        (Some(f), Some(c), Some(mem)) if f > 0.0 => {
            let done = m
                .performed_floor_s
                .filter(|&d| format!("{d:.2}") != format!("{c:.2}"))
                .map_or(String::new(), |d| format!(", {d:.2}s done"));
            format!(
                "  = {:.2}x floor (compute {c:.2}s{done}, memory {mem:.2}s)",
                m.wall_s / f
            )
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod floor_note_tests {
    use super::*;

    #[test]
    fn the_floor_note_names_the_flops_done_when_zeros_were_skipped() {
        let mut m = EpochMetrics {
            wall_s: 0.16,
            compute_floor_s: Some(0.19),
            performed_floor_s: Some(0.19),
            memory_floor_s: Some(0.06),
            ..EpochMetrics::default()
        };
        assert_eq!(
            floor_note(&m),
            "  = 0.84x floor (compute 0.19s, memory 0.06s)"
        );
        m.performed_floor_s = Some(0.12);
        assert_eq!(
            floor_note(&m),
            "  = 0.84x floor (compute 0.19s, 0.12s done, memory 0.06s)"
        );
        // Without a measured GEMM rate there is no compute floor to name: nothing is said.
        m.compute_floor_s = None;
        assert_eq!(floor_note(&m), "");
    }
}
