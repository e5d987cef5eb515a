//! The run API: one call trains a [`TrainConfig`] and returns a [`TrainOutcome`].
//!
//! [`train`] is what `fanout train` and the Python package call: it opens (or generates) the
//! dataset once, starts `config.workers` in-process workers sharing it (each with its own
//! threads), and returns rank 0's outcome. [`train_worker`] runs one worker of a group whose
//! [`Comm`] the caller made (one MPI process of `mpirun -np N fanout train ...`).
//!
//! Both compute on the CPU backend; [`train_with_backend`] and [`train_worker_with`] are the
//! same runs on any [`Backend`] (the same generic code: `train` is
//! `train_with_backend(CpuBackend, ..)`). A backend other than the CPU runs one worker with
//! the single or data-parallel strategy for now; the rest is refused
//! ([`check_backend`]), never run on the CPU instead.
//!
//! A worker is one pipeline feeding one trainer ([`crate::fit`]); the strategy decides which
//! seeds it trains ([`crate::strategy::WorkerPlan`]). Workers first check that they were all
//! given the same config. A worker that fails tells the others through [`Comm::fail`], so
//! the run ends with that worker's message instead of hanging.

use crate::config::{FeaturePlacement, StrategyKind, TrainConfig};
use crate::error::{ExecError, Result};
use crate::memory::{measure_trial_batch, MemoryProbe, TrialMemory};
use crate::metrics::{EpochMetrics, RunMetrics};
use crate::pipeline::{Pipeline, PipelineConfig};
use crate::placement::{device_cache_table, map_rows, rows_at, wants_cache, RowsAt};
use crate::strategy::WorkerPlan;
use crate::trainer::{fit_with, FitConfig, FitControl, FitObserver, FitState, Trainer};
use fanout_cache::{
    auto_cache_size, build_extractor, parse_bytes, AutoSize, CacheConfig, CacheSize, CacheSizeSpec,
    Extractor, PlainExtractor, Policy, PreSampling,
};
use fanout_comm::{Comm, CommError, CommStats, LocalComm};
use fanout_compute::{
    io, Adam, Backend, CpuBackend, Model, ModelConfig, OptimState, Optimizer, Tensor,
};
use fanout_graph::{Cancel, Dataset, NoProgress, Progress};
use fanout_sample::{LoaderConfig, Sampler};
use fanout_synth::{generate, GenOptions, Preset};
use std::any::Any;
use std::path::Path;
use std::sync::Arc;

/// Vertices of the embedded default dataset (products preset shape).
pub const EMBEDDED_NODES: u64 = 100_000;
/// Generator seed of the embedded default dataset.
pub const EMBEDDED_SEED: u64 = 7;

/// Checkpoint metadata keys with the run's settings, so evaluation repeats its sampling.
pub mod checkpoint_meta {
    /// Hop-order fanouts, comma-separated.
    pub const FANOUTS: &str = "train.fanouts";
    /// Seeds per evaluation batch.
    pub const BATCH: &str = "train.batch_size";
    /// The run's seed (keys evaluation sampling).
    pub const SEED: &str = "train.seed";
    /// "embedded" when trained on the embedded default dataset, else "dir".
    pub const DATASET: &str = "train.dataset";
    /// The whole resolved [`crate::TrainConfig`] as JSON (sampler settings included).
    pub const CONFIG: &str = "train.config";
    /// The resumable training state as JSON (epochs done, optimiser step, best model's
    /// accuracies, the dataset's vertex count); its tensors are `train.params.*` (the current
    /// parameters; `layers.*` hold the best-validation ones) and `train.optim.{i}`.
    pub const STATE: &str = "train.state";
    /// Prefix of the current parameters' tensors in a resumable checkpoint.
    pub const PARAMS_PREFIX: &str = "train.params.";
    /// Prefix of the optimiser state's tensors (numbered from 0).
    pub const OPTIM_PREFIX: &str = "train.optim.";
}

/// The JSON of [`checkpoint_meta::STATE`].
#[derive(serde::Serialize, serde::Deserialize)]
struct StateMeta {
    epochs_done: u64,
    optim_step: u64,
    optim_tensors: usize,
    num_nodes: u64,
    best: Option<BestMeta>,
}

/// The best model's figures in [`StateMeta`] (its parameters are the `layers.*` tensors).
#[derive(serde::Serialize, serde::Deserialize)]
struct BestMeta {
    val_acc: Option<f64>,
    epoch: u64,
    test_acc: f64,
}

/// What a run needs from its host besides the config: where progress goes and, for
/// `cache.ratio = "auto"`, how to measure memory.
pub struct RunEnv<'a> {
    /// Progress of dataset generation and feature copies (rank 0 only).
    pub progress: &'a dyn Progress,
    /// Measures the device's memory for PaGraph's trial batch; `None`: `auto` is refused.
    pub probe: Option<&'a (dyn MemoryProbe + Sync)>,
    /// Checked between training steps: once cancelled, the run stops with
    /// [`ExecError::Interrupted`] (the host's signal handler sets it). `None`: never.
    pub cancel: Option<&'a Cancel>,
    /// Rank 0 writes a resumable checkpoint here (atomically) after every epoch: the
    /// best-validation model as [`TrainOutcome::save_model`] writes it, plus the training
    /// state ([`checkpoint_meta::STATE`]).
    pub checkpoint: Option<&'a Path>,
    /// Continue the run saved in this checkpoint (written through `checkpoint` or
    /// [`TrainOutcome::save_model`] by a run of the same config): the run then ends with the
    /// model the uninterrupted run would have. Single and data-parallel strategies only.
    pub resume: Option<&'a Path>,
}

impl Default for RunEnv<'_> {
    /// No progress, no memory probe, no cancellation, no checkpoints.
    fn default() -> Self {
        RunEnv {
            progress: &NoProgress,
            probe: None,
            cancel: None,
            checkpoint: None,
            resume: None,
        }
    }
}

/// What one worker's run produced. Every worker of a run ends with the same parameters and
/// the same [`RunMetrics`] (losses and accuracies are summed over workers); only rank 0
/// should write files.
pub struct TrainOutcome {
    /// The config, resolved (model and dataset defaults filled in).
    pub config: TrainConfig,
    /// Per-epoch metrics and the best-validation test accuracy.
    pub metrics: RunMetrics,
    /// The best-validation model, on the CPU whatever backend trained it (its parameters are
    /// exactly the trained ones, copied to the host).
    pub model: Model<CpuBackend>,
    /// Name of the backend that trained the model ([`Backend::name`]: `"cpu"`, ...).
    pub backend: &'static str,
    /// This worker's rank, and the number of workers.
    pub rank: usize,
    /// Workers in the run.
    pub workers: usize,
    /// The communicator's kind ("local", "mpi").
    pub comm: &'static str,
    /// Everything this worker sent through the communicator.
    pub comm_stats: CommStats,
    /// How the workers summed their gradients: `"host"` (read back and summed through the
    /// communicator) or `"device"` (on the devices, [`Backend::sum_over_group`]: NCCL on
    /// GPUs); `None` for one worker.
    pub gradient_sum: Option<&'static str>,
    /// The feature cache as built (JSON, for the metrics file).
    pub cache: serde_json::Value,
    /// Name of the dataset ("embedded" or its directory).
    pub dataset: String,
    /// Whether features were read from a resident copy.
    pub features_resident: bool,
    /// Threads this worker computed on.
    pub threads: usize,
    /// The strategy's own figures (the factored layout, trial and switching), for the
    /// metrics JSON; `None` for strategies without any.
    pub strategy_report: Option<serde_json::Value>,
    /// The training state after the last epoch, when the run wrote checkpoints
    /// ([`RunEnv::checkpoint`]); [`TrainOutcome::save_model`] stores it so the run can be
    /// continued with more epochs.
    pub state: Option<FitState>,
    /// Vertices of the dataset trained on (checked when a checkpoint is resumed).
    pub num_nodes: u64,
}

impl TrainOutcome {
    /// [`TrainOutcome::report`] with `device`'s summary (what [`crate::Compute::open`] gave)
    /// under `"device"`: the metrics JSON of a run that chose its device.
    pub fn report_on(&self, device: &crate::DeviceInfo) -> serde_json::Value {
        let mut report = self.report();
        if let Some(obj) = report.as_object_mut() {
            // A plain struct of strings and numbers: serialising it cannot fail.
            let d = serde_json::to_value(device).unwrap_or(serde_json::Value::Null);
            obj.insert("device".into(), d);
        }
        report
    }

    /// The metrics JSON of `fanout train --metrics-out`: the run's figures, the resolved
    /// config under `"config"` (so the file replays the run), and the per-worker figures.
    /// A run that stopped before its end writes [`stopped_run_report`] instead.
    pub fn report(&self) -> serde_json::Value {
        let c = &self.config;
        serde_json::json!({
            "model": c.model.name(),
            "dataset": self.dataset,
            "fanouts": c.fanouts,
            "batch_size": c.batch_size,
            "hidden": c.hidden,
            "lr": c.lr,
            "weight_decay": c.weight_decay,
            "dropout": c.dropout,
            "seed": c.seed,
            "threads": self.threads,
            "backend": self.backend,
            "strategy": c.strategy_kind().name(),
            "workers": self.workers,
            "comm": { "kind": self.comm, "calls": self.comm_stats.calls,
                      "bytes_sent": self.comm_stats.bytes_sent,
                      "seconds": self.comm_stats.seconds,
                      "gradient_sum": self.gradient_sum },
            "test_acc": self.metrics.test_acc,
            "best_val_acc": self.metrics.best_val_acc,
            "best_epoch": self.metrics.best_epoch,
            "median_epoch_s": self.metrics.median_epoch_s,
            "median_floor_s": self.metrics.median_floor_s(),
            "median_performed_bound_s": self.metrics.median_performed_bound_s(),
            "machine_rates": self.metrics.rates,
            "cache": self.cache,
            "reorder_window": c.cache.reorder_window.max(1),
            "features_resident": self.features_resident,
            "epochs": self.metrics.epochs,
            "config": c,
            "factored": self.strategy_report,
            "hybrid": self.strategy_report.as_ref().and_then(|r| r.get("hybrid")),
        })
    }

    /// The best-validation model as a safetensors checkpoint carrying the run's settings
    /// ([`checkpoint_meta`]) and, when the run kept it, its training state, written atomically
    /// to `path`.
    pub fn save_model(&self, path: &Path) -> Result<()> {
        let be = self.model.backend();
        let params = self
            .model
            .named_params()
            .into_iter()
            .map(|(n, p)| Ok((n, be.download(&p.value)?)))
            .collect::<Result<Vec<(String, Tensor)>>>()?;
        let bytes = checkpoint_bytes(
            &self.config,
            self.model.config(),
            params,
            self.state.as_ref(),
            self.num_nodes,
        )?;
        Ok(io::save_bytes(&bytes, path)?)
    }
}

/// A checkpoint of `model` (its named parameters, the best-validation ones) with the run's
/// settings and, when given, the training `state` to resume from.
fn checkpoint_bytes(
    c: &TrainConfig,
    model: &ModelConfig,
    mut params: Vec<(String, Tensor)>,
    state: Option<&FitState>,
    num_nodes: u64,
) -> Result<Vec<u8>> {
    {
        let fanouts: Vec<String> = c.fanouts.iter().flatten().map(|k| k.to_string()).collect();
        let config = serde_json::to_string(c).map_err(|e| ExecError::Invalid(e.to_string()))?;
        let mut extra = vec![
            (checkpoint_meta::FANOUTS.to_string(), fanouts.join(",")),
            (
                checkpoint_meta::BATCH.to_string(),
                c.batch_size.unwrap_or(1).to_string(),
            ),
            (checkpoint_meta::SEED.to_string(), c.seed.to_string()),
            (
                checkpoint_meta::DATASET.to_string(),
                if c.dataset.is_none() {
                    "embedded"
                } else {
                    "dir"
                }
                .to_string(),
            ),
            (checkpoint_meta::CONFIG.to_string(), config),
        ];
        if let Some(s) = state {
            let names: Vec<String> = params.iter().map(|(n, _)| n.clone()).collect();
            for (n, t) in names.iter().zip(&s.params) {
                params.push((format!("{}{n}", checkpoint_meta::PARAMS_PREFIX), t.clone()));
            }
            for (i, t) in s.optim.tensors.iter().enumerate() {
                params.push((format!("{}{i}", checkpoint_meta::OPTIM_PREFIX), t.clone()));
            }
            let meta = StateMeta {
                epochs_done: s.epochs_done,
                optim_step: s.optim.step,
                optim_tensors: s.optim.tensors.len(),
                num_nodes,
                best: s.best.as_ref().map(|b| BestMeta {
                    val_acc: b.val_acc,
                    epoch: b.epoch,
                    test_acc: b.test_acc,
                }),
            };
            let json =
                serde_json::to_string(&meta).map_err(|e| ExecError::Invalid(e.to_string()))?;
            extra.push((checkpoint_meta::STATE.to_string(), json));
        }
        Ok(io::to_bytes_parts(model, &params, &extra)?)
    }
}

/// A model configuration in a few words, for messages.
fn describe(m: &ModelConfig) -> String {
    format!(
        "{}, in_dim {}, hidden {}, {} classes, {} layers",
        m.kind.name(),
        m.in_dim,
        m.hidden,
        m.num_classes,
        m.num_layers
    )
}

/// Reads the training state of the checkpoint at `path` for a run of `cfg` (resolved) with
/// model `model` on a dataset of `num_nodes` vertices, checking that it was written by a run
/// of the same config (only `epochs`, `threads`, `prefetch`, `eval_every`,
/// `feature_residency`, `feature_placement` and `fuse_input` may differ: none changes the
/// results). `params` are the model's parameter names and shapes.
fn load_resume(
    path: &Path,
    cfg: &TrainConfig,
    model: &ModelConfig,
    params: &[(String, (usize, usize))],
    per_param: usize,
    num_nodes: u64,
) -> Result<FitState> {
    let bad = |m: String| ExecError::Invalid(format!("--resume {}: {m}", path.display()));
    let bytes = std::fs::read(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
    let stored = io::read_config(&bytes).map_err(|e| bad(e.to_string()))?;
    if &stored != model {
        return Err(bad(format!(
            "the checkpoint's model ({}) differs from this run's ({}); resume with the \
             settings and dataset of the run that wrote it",
            describe(&stored),
            describe(model),
        )));
    }
    let meta = io::read_metadata(&bytes).map_err(|e| bad(e.to_string()))?;
    let get = |k: &str| {
        meta.get(k).ok_or_else(|| {
            bad(format!(
                "no {k} metadata: this checkpoint holds a model but no training state to resume \
                 (write one with fanout train --save-model)"
            ))
        })
    };
    let mut then: TrainConfig =
        serde_json::from_str(get(checkpoint_meta::CONFIG)?).map_err(|e| {
            bad(format!(
                "metadata {} is not a run config: {e}",
                checkpoint_meta::CONFIG
            ))
        })?;
    then.epochs = cfg.epochs;
    then.threads = cfg.threads;
    then.prefetch = cfg.prefetch;
    then.eval_every = cfg.eval_every;
    then.feature_residency = cfg.feature_residency;
    then.feature_placement = cfg.feature_placement;
    then.fuse_input = cfg.fuse_input;
    // The same dataset under another spelling (`./data/x` for `data/x`, a link) is the same
    // dataset; its size is checked against the checkpoint's below.
    if let (Some(a), Some(b)) = (&then.dataset, &cfg.dataset) {
        if crate::outputs::same_file(a, b) {
            then.dataset = cfg.dataset.clone();
        }
    }
    if let Some(d) = then.first_difference(cfg) {
        return Err(bad(format!(
            "it was written by a run with other settings ({d}, checkpoint vs this run); \
             resume with the same settings"
        )));
    }
    let state: StateMeta = serde_json::from_str(get(checkpoint_meta::STATE)?).map_err(|e| {
        bad(format!(
            "metadata {} is not a training state: {e}",
            checkpoint_meta::STATE
        ))
    })?;
    if state.num_nodes != num_nodes {
        return Err(bad(format!(
            "it was trained on a dataset of {} vertices, this one has {num_nodes}",
            state.num_nodes
        )));
    }
    if state.epochs_done >= cfg.epochs {
        return Err(bad(format!(
            "it has already trained {} epochs; give --epochs greater than {} to continue",
            state.epochs_done, state.epochs_done
        )));
    }
    let n_opt = state.optim_tensors;
    if n_opt != 0 && n_opt != per_param * params.len() {
        return Err(bad(format!(
            "metadata {} lists {n_opt} optimiser tensors, expected 0 or {}",
            checkpoint_meta::STATE,
            per_param * params.len()
        )));
    }
    let read = |name: &str, (r, c): (usize, usize)| {
        io::read_tensor(&bytes, name, r, c).map_err(|e| bad(e.to_string()))
    };
    let mut current = Vec::with_capacity(params.len());
    let mut best = Vec::with_capacity(params.len());
    for (n, shape) in params {
        current.push(read(
            &format!("{}{n}", checkpoint_meta::PARAMS_PREFIX),
            *shape,
        )?);
        best.push(read(n, *shape)?);
    }
    let mut tensors = Vec::with_capacity(n_opt);
    for i in 0..n_opt {
        let shape = params[i / per_param.max(1)].1;
        tensors.push(read(
            &format!("{}{i}", checkpoint_meta::OPTIM_PREFIX),
            shape,
        )?);
    }
    Ok(FitState {
        epochs_done: state.epochs_done,
        params: current,
        optim: OptimState {
            step: state.optim_step,
            tensors,
        },
        best: state.best.map(|b| crate::trainer::BestState {
            val_acc: b.val_acc,
            epoch: b.epoch,
            test_acc: b.test_acc,
            params: best,
        }),
    })
}

/// Opens the config's dataset (its features copied into huge-page memory as
/// `feature_residency` says) or generates the embedded one, and checks that it can be trained
/// on (features, labels, classes, a training set).
pub fn open_dataset(cfg: &TrainConfig, progress: &dyn Progress) -> Result<Arc<Dataset>> {
    let mut ds = match &cfg.dataset {
        Some(d) => Dataset::open(d)?,
        None => {
            let gen = Preset::Products.config(Some(EMBEDDED_NODES));
            let opts = GenOptions {
                seed: EMBEDDED_SEED,
                ..GenOptions::default()
            };
            let (ds, _) = generate(&gen, &opts, None, progress)
                .map_err(|e| ExecError::Invalid(format!("generating the embedded dataset: {e}")))?;
            ds
        }
    };
    // Feature gathers read random rows: from huge pages they miss the TLB far less.
    ds.make_features_resident(cfg.feature_residency, progress)?;
    let name = ds.dir.display().to_string();
    let bad = |m: String| Err(ExecError::Invalid(format!("{name}: {m}")));
    if ds.features.is_none() {
        return bad("the dataset has no features; import it with --random-features DIM".into());
    }
    if ds.labels.is_none() {
        return bad("the dataset has no labels (label.bin)".into());
    }
    if ds.meta.num_class == 0 {
        return bad("NUM_CLASS is 0".into());
    }
    if ds.train.is_empty() {
        return bad("the training set is empty".into());
    }
    // Vertices labelled -1 are skipped by the loss: with no other, every step would train on
    // nothing and report a loss of 0.
    if let Some(labels) = &ds.labels {
        if ds.train.iter().all(|&v| labels[v as usize] < 0) {
            return bad(format!(
                "none of the {} training vertices has a label (all are -1 in label.bin), so \
                 there is nothing to train on",
                ds.train.len()
            ));
        }
    }
    Ok(Arc::new(ds))
}

/// Trains `cfg` in this process on the CPU backend: one worker, or `cfg.workers` in-process
/// workers (threads) sharing one opened dataset and splitting `cfg.threads` (default: all
/// cores) between them. `obs` sees rank 0's progress. Returns rank 0's outcome; if any worker
/// fails, the error of the worker that failed first. Same as
/// `train_with_backend(CpuBackend, cfg, env, obs)`.
pub fn train(cfg: &TrainConfig, env: &RunEnv, obs: &mut dyn FitObserver) -> Result<TrainOutcome> {
    train_with_backend(CpuBackend, cfg, env, obs)
}

/// [`train`] computing on `be`: the model, its optimiser, the trial batch of
/// `--cache-ratio auto` (measured through `env.probe`, which must measure `be`'s memory) and
/// evaluation all run on `be`; sampling and feature extraction stay on the host. Given the
/// same config, a backend whose kernels give the CPU's results trains the CPU's model bit for
/// bit. The outcome's model is on the CPU ([`TrainOutcome::model`]). A backend other than the
/// CPU is refused, before the dataset is opened, the options [`check_backend`] names; its
/// device failing during the run (a [`fanout_compute::DeviceFailure`] from a backend method)
/// ends the run with [`ExecError::Device`].
pub fn train_with_backend<B: Backend>(
    be: B,
    cfg: &TrainConfig,
    env: &RunEnv,
    obs: &mut dyn FitObserver,
) -> Result<TrainOutcome> {
    cfg.validate()?;
    check_backend(&be, cfg)?;
    if be.name() != "cpu" && cfg.workers > 1 {
        // Its workers would be threads sharing one device (and one backend's queue). GPUs
        // run several workers through `Compute::train`, one GPU each.
        return Err(ExecError::Invalid(format!(
            "--workers {} on one backend runs on --device cpu only (this run computes on {}): \
             on GPUs, `--device cuda --workers N` gives each worker a GPU of its own, or start \
             one process per GPU with mpirun (`mpirun -np N fanout train --device cuda \
             --strategy data-parallel`)",
            cfg.workers,
            be.name()
        )));
    }
    let ds = open_dataset(cfg, env.progress)?;
    let n = cfg.workers.max(1);
    if n == 1 {
        let comm = crate::solo();
        let pool = single_worker_pool(cfg.threads)?;
        return train_worker_with(be, ds, cfg, &comm, pool, env, obs);
    }
    run_group(n, cfg.threads, env, obs, &|comm, pool, env, obs| {
        train_worker_with(be.clone(), ds.clone(), cfg, comm, pool, env, obs)
    })
}

/// Runs a group of `n` (at least 2) workers in this process, one thread each, joined by a
/// [`LocalComm`]: rank 0 on the calling thread with `env` and `obs`, the others on threads of
/// their own with no progress bars and no observer. Each gets a pool of `threads / n` threads
/// (`threads` defaults to every core). A worker that fails tells the others through the
/// communicator; the error returned is the one that caused the others, not their echoes.
/// Returns rank 0's outcome.
pub(crate) fn run_group(
    n: usize,
    threads: Option<usize>,
    env: &RunEnv,
    obs: &mut dyn FitObserver,
    worker: &GroupWorker<'_>,
) -> Result<TrainOutcome> {
    let threads = threads.unwrap_or_else(available_cores);
    let per_worker = (threads / n).max(1);
    let pools = (0..n)
        .map(|r| worker_pool(per_worker, r))
        .collect::<Result<Vec<_>>>()?;
    let quiet_env = RunEnv {
        progress: &NoProgress,
        ..*env
    };
    std::thread::scope(|s| {
        let mut members = LocalComm::group(n).into_iter();
        let mut pools = pools.into_iter();
        let comm0 = members.next().expect("rank 0");
        let pool0 = pools.next().expect("rank 0's pool");
        let others: Vec<_> = members
            .zip(pools)
            .map(|(comm, pool)| {
                let env = &quiet_env;
                std::thread::Builder::new()
                    .name(format!("worker-{}", comm.rank()))
                    .spawn_scoped(s, move || {
                        let r = worker(&comm, Some(pool), env, &mut ());
                        if let Err(e) = &r {
                            comm.fail(&e.to_string());
                        }
                        r.map(|_| ())
                    })
                    .map_err(|e| ExecError::Invalid(format!("cannot start a worker thread: {e}")))
            })
            .collect::<Result<_>>()?;
        let first = worker(&comm0, Some(pool0), env, obs);
        if let Err(e) = &first {
            comm0.fail(&e.to_string());
        }
        let mut errors: Vec<ExecError> = Vec::new();
        for h in others {
            match h.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => errors.push(e),
                Err(_) => errors.push(ExecError::Invalid("a worker thread panicked".into())),
            }
        }
        match first {
            Ok(out) if errors.is_empty() => Ok(out),
            Ok(_) => Err(pick_error(errors)),
            Err(e) => {
                errors.insert(0, e);
                Err(pick_error(errors))
            }
        }
    })
}

/// One worker of [`run_group`]: its member of the group, its pool, the run's environment and
/// its observer; returns its outcome.
pub(crate) type GroupWorker<'a> = dyn Fn(
        &LocalComm,
        Option<Arc<rayon::ThreadPool>>,
        &RunEnv,
        &mut dyn FitObserver,
    ) -> Result<TrainOutcome>
    + Sync
    + 'a;

/// Of several workers' errors, the one that caused the others: not a "rank R failed" echo.
fn pick_error(errors: Vec<ExecError>) -> ExecError {
    let echo = |e: &ExecError| matches!(e, ExecError::Comm(CommError::PeerFailed { .. }));
    let mut errors = errors;
    match errors.iter().position(|e| !echo(e)) {
        Some(i) => errors.swap_remove(i),
        None => errors.swap_remove(0),
    }
}

fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn worker_pool(threads: usize, rank: usize) -> Result<Arc<rayon::ThreadPool>> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("w{rank}-{i}"))
        .build()
        .map(Arc::new)
        .map_err(|e| ExecError::Invalid(format!("cannot start {threads} threads: {e}")))
}

/// One worker computes on the global pool (sized to `threads` when it can still be sized),
/// or on a pool of its own when the global one already has another size.
fn single_worker_pool(threads: Option<usize>) -> Result<Option<Arc<rayon::ThreadPool>>> {
    let Some(t) = threads else { return Ok(None) };
    if rayon::ThreadPoolBuilder::new()
        .num_threads(t)
        .build_global()
        .is_ok()
        || rayon::current_num_threads() == t
    {
        return Ok(None);
    }
    worker_pool(t, 0).map(Some)
}

/// Refuses a group whose workers were given different configs: every worker compares its
/// config with rank 0's and all of them return the same error.
fn check_same_config(cfg: &TrainConfig, comm: &dyn Comm) -> Result<()> {
    if comm.size() == 1 {
        return Ok(());
    }
    let mine = serde_json::to_vec(cfg).map_err(|e| ExecError::Invalid(e.to_string()))?;
    let all = comm.all_gather(&mine)?;
    let root: TrainConfig = serde_json::from_slice(&all[0])
        .map_err(|e| ExecError::Invalid(format!("rank 0 sent an unreadable config: {e}")))?;
    for (rank, bytes) in all.iter().enumerate().skip(1) {
        let other: TrainConfig = serde_json::from_slice(bytes).map_err(|e| {
            ExecError::Invalid(format!("rank {rank} sent an unreadable config: {e}"))
        })?;
        if let Some(d) = root.first_difference(&other) {
            return Err(ExecError::Invalid(format!(
                "workers were started with different configs: rank 0 and rank {rank} differ in {d}"
            )));
        }
    }
    Ok(())
}

/// Refuses what runs on the CPU backend only for now when `be` is another backend (its
/// [`Backend::name`] is not `"cpu"`), with an [`ExecError::Invalid`] naming the option:
///
/// - `--strategy factored` and `hybrid`: their sampler and trainer roles exchange parameters
///   and gradients as CPU tensors ([`crate::factored`] is written for the CPU backend);
/// - `--strategy split`: it needs several workers;
/// - `--cache-ratio auto` on a backend with memory of its own ([`Backend::free_memory`] is
///   `Some`): PaGraph's trial step is measured with a probe of host memory.
///
/// Everything else (single, data-parallel over any number of workers each with its own
/// backend, caches of a given size, `--fuse-input`, `--resume` and checkpoints) runs on any
/// backend. Several workers in one process on one backend ([`train_with_backend`] with
/// `--workers N`) would share one device and are refused there; on GPUs each worker gets a
/// backend of its own ([`crate::Compute::train`], one thread per GPU, or one MPI process per
/// GPU, each calling [`train_worker_with`]).
///
/// On any backend, `--sampling-placement device` or `uva` is refused unless the backend is
/// the CUDA one and the sampler has a GPU implementation (k-hop, weighted, random walks).
pub fn check_backend<B: Backend>(be: &B, cfg: &TrainConfig) -> Result<()> {
    crate::device::check_sampling_placement(be, cfg)?;
    if be.name() == "cpu" {
        return Ok(());
    }
    let cpu_only = |option: String| {
        Err(ExecError::Invalid(format!(
            "{option} runs on --device cpu only for now (this run computes on {})",
            be.name()
        )))
    };
    // PaGraph's auto-sizing measures a trial step with a probe of host memory; a device with
    // memory of its own would need a probe of that memory, which does not exist yet.
    if be.free_memory().is_some() && wants_cache(cfg) && cfg.cache.ratio.trim() == "auto" {
        return cpu_only("--cache-ratio auto".into());
    }
    match cfg.strategy_kind() {
        StrategyKind::Single | StrategyKind::DataParallel => Ok(()),
        s @ (StrategyKind::Factored | StrategyKind::Hybrid | StrategyKind::Split) => {
            cpu_only(format!("--strategy {}", s.name()))
        }
    }
}

/// `x` as a `U` when it is one, else `x` back: how generic code hands a `Trainer<B>` or a
/// `Model<B>` to the parts that take the CPU backend's, when `B` is [`CpuBackend`].
fn as_type<T: 'static, U: 'static>(x: T) -> std::result::Result<U, T> {
    let any: Box<dyn Any> = Box::new(x);
    match any.downcast::<U>() {
        Ok(u) => Ok(*u),
        Err(any) => Err(*any.downcast::<T>().expect("the value boxed above")),
    }
}

/// `model` on the CPU backend with exactly its parameter values: the model itself when it is
/// already there, else a copy through checkpoint serialisation (every parameter downloaded;
/// gradients and cached activations are not copied).
fn into_cpu_model<B: Backend>(model: Model<B>) -> Result<Model<CpuBackend>> {
    match as_type::<_, Model<CpuBackend>>(model) {
        Ok(cpu) => Ok(cpu),
        Err(model) => Ok(io::from_bytes(CpuBackend, &io::to_bytes(&model)?)?),
    }
}

/// Runs one worker of a group on the CPU backend: `comm` joins it to the others (a one-member
/// group for a single-worker run), `pool` is where it computes (`None`: the global rayon
/// pool). Every worker of the group must be given the same `cfg` (checked first) and a
/// dataset with the same content. Returns this worker's outcome; see [`TrainOutcome`]. Same
/// as `train_worker_with(CpuBackend, ..)`.
pub fn train_worker(
    ds: Arc<Dataset>,
    cfg: &TrainConfig,
    comm: &dyn Comm,
    pool: Option<Arc<rayon::ThreadPool>>,
    env: &RunEnv,
    obs: &mut dyn FitObserver,
) -> Result<TrainOutcome> {
    train_worker_with(CpuBackend, ds, cfg, comm, pool, env, obs)
}

/// [`train_worker`] computing on `be` (see [`train_with_backend`]): the model, optimiser,
/// trial batch and evaluation run on `be`, `pool` holds the host threads that drive it. A
/// backend other than the CPU is refused what [`check_backend`] names; each worker of a
/// group needs a backend of its own (one GPU each), and their gradients are summed on
/// the host through `comm`, or on the devices where the backends joined a device group
/// ([`Backend::sum_over_group`], which gives the host sum's bits), so a group of workers on
/// other backends whose kernels give the CPU's results trains the CPU group's model bit for
/// bit. A device failing (a [`fanout_compute::DeviceFailure`] from a backend method) ends
/// the worker with [`ExecError::Device`].
pub fn train_worker_with<B: Backend>(
    be: B,
    ds: Arc<Dataset>,
    cfg: &TrainConfig,
    comm: &dyn Comm,
    pool: Option<Arc<rayon::ThreadPool>>,
    env: &RunEnv,
    obs: &mut dyn FitObserver,
) -> Result<TrainOutcome> {
    check_same_config(cfg, comm)?;
    let (rank, workers) = (comm.rank(), comm.size());
    let mut cfg = cfg.clone();
    // Under MPI the launcher sets the worker count (`mpirun -np N`); a config may leave it
    // at 1 or repeat it.
    if comm.kind() == "mpi" && cfg.workers == 1 {
        cfg.workers = workers;
    }
    if cfg.workers != workers {
        return Err(ExecError::Invalid(format!(
            "the config asks for {} workers but {workers} were started",
            cfg.workers
        )));
    }
    cfg.validate()?;
    check_backend(&be, &cfg)?;
    if workers > 1 && cfg.strategy_kind() == StrategyKind::Single {
        return Err(ExecError::Invalid(format!(
            "{workers} workers were started for --strategy single; use --strategy data-parallel"
        )));
    }
    let in_dim = ds.features.as_ref().map_or(0, |f| f.dim);
    cfg.resolve(in_dim, ds.meta.num_class as usize);
    let fanouts = cfg.fanouts.clone().unwrap_or_default();
    let batch_size = cfg.batch_size.unwrap_or(1);
    let plan = WorkerPlan::new(&ds, &cfg, rank, workers)?;
    let built = cfg
        .sampler
        .build_with(&ds, fanouts.clone(), cfg.sampler_kind(), env.progress)?;
    if let Some(note) = &built.note {
        obs.note(note);
    }
    let sampler =
        match crate::device::device_sampler(&be, &cfg, &ds, &fanouts, built.tables.as_ref())? {
            Some((on_device, note)) => {
                obs.note(&note);
                on_device
            }
            None => built.sampler,
        };

    let model_cfg = ModelConfig {
        hidden: cfg.hidden.unwrap_or(1),
        num_layers: fanouts.len(),
        dropout: cfg.dropout,
        seed: cfg.seed,
        ..fanout_compute::PaperSetting::for_kind(cfg.model, in_dim, ds.meta.num_class as usize)
            .model
    };
    model_cfg.validate()?;
    let model = Model::new(be.clone(), model_cfg.clone())?;
    let opt = Adam::new(be.clone(), cfg.lr.unwrap_or(0.003)).with_weight_decay(cfg.weight_decay);
    let resume = match env.resume {
        None => None,
        Some(_) if cfg.strategy_kind().is_factored() => {
            return Err(ExecError::Invalid(format!(
                "--resume is supported for the single and data-parallel strategies, not {}",
                cfg.strategy_kind().name()
            )))
        }
        Some(path) => {
            let shapes: Vec<(String, (usize, usize))> = model
                .named_params()
                .into_iter()
                .map(|(n, p)| (n, be.shape(&p.value)))
                .collect();
            let per_param = opt.state_per_param();
            let n = ds.num_nodes();
            Some(load_resume(path, &cfg, &model_cfg, &shapes, per_param, n)?)
        }
    };
    // Every feature row copied to the compute device once, or each batch's gathered on the
    // host (see `FeaturePlacement`); decided before any strategy runs, so that every one
    // refuses what cannot be.
    let row_bytes = ds.features.as_ref().map_or(0, |f| f.row_bytes() as u64);
    let mut rows_at = rows_at(&be, &cfg, &ds)?;
    let on_device = rows_at == RowsAt::Device;
    // auto keeps every row on the device when they fit there: a cache or Match asked for is
    // then checked but not built (it would hold a part of what the device holds whole). Match's
    // batch order is kept, so the run trains as under any other placement.
    let cache_unneeded = on_device
        && cfg.feature_placement == FeaturePlacement::Auto
        && (wants_cache(&cfg) || cfg.cache.match_reorder);
    let names: Vec<String> = model.named_params().into_iter().map(|(n, _)| n).collect();
    let mut trainer = Trainer::new(model, Box::new(opt)).with_pool(pool.clone());
    let threads = pool
        .as_ref()
        .map_or_else(rayon::current_num_threads, |p| p.current_num_threads());

    let dataset = match &cfg.dataset {
        None => "embedded".to_string(),
        Some(d) => d.display().to_string(),
    };
    if cfg.strategy_kind().is_factored() {
        // Factored roles compute on the CPU backend: `check_backend` refused any other.
        let trainer = as_type::<_, Trainer<CpuBackend>>(trainer).map_err(|_| {
            ExecError::Invalid(format!(
                "--strategy {} runs on --device cpu only for now",
                cfg.strategy_kind().name()
            ))
        })?;
        let summary = run_summary(&cfg, &ds, &model_cfg, trainer.model().num_params(), "");
        let run = crate::factored::FactoredRun {
            ds,
            cfg,
            comm,
            pool,
            env,
            sampler,
            trainer,
            threads,
            dataset,
            summary,
        };
        return crate::factored::run(run, obs);
    }
    if on_device {
        let n = ds.num_nodes() as usize;
        let all: Vec<u32> = (0..n as u32).collect();
        let mut rows = Vec::new();
        let mut plain = PlainExtractor::new(ds.clone())?;
        plain.extract(&all, &mut rows)?;
        let dim = plain.dim();
        trainer = trainer.with_device_rows(be.upload_owned(Tensor::new(n, dim, rows))?);
        obs.note(&format!(
            "features on the device: {n} rows x {dim} ({:.0} MB as f32), each batch's rows gathered there",
            (n * dim * 4) as f64 / 1e6
        ));
    }
    if rows_at.mapped() {
        match map_rows(&be, &ds, rows_at.cache_on_device())? {
            Ok((mapped, note)) => {
                trainer = trainer.with_mapped_rows(mapped);
                obs.note(&note);
            }
            // auto falls back to the host path (a cache on the device then has its misses
            // uploaded); asked for, it is an error.
            Err(why) if cfg.feature_placement == FeaturePlacement::Auto => {
                obs.note(&format!("features gathered on the host: {why}"));
                rows_at = if rows_at.cache_on_device() {
                    RowsAt::DeviceCache
                } else {
                    RowsAt::Host
                };
            }
            Err(why) => {
                let instead = if rows_at.cache_on_device() {
                    " (--feature-placement device keeps the cache on the GPU and uploads the \
                     misses)"
                } else {
                    ""
                };
                return Err(ExecError::Invalid(format!(
                    "--feature-placement uva: {why}{instead}"
                )));
            }
        }
    }
    let mapped = rows_at.mapped();
    // The mapped table holds f32 rows, whatever the dataset stores: what crosses the bus.
    let mapped_row_bytes = 4 * ds.features.as_ref().map_or(0, |f| f.dim as u64);
    let pcfg = PipelineConfig {
        batch_size: plan.batch_size,
        shuffle: true,
        seed: cfg.seed,
        prefetch: cfg.prefetch.max(1),
        sample_workers: 1,
        reorder_window: cfg.reorder_window(),
        plan: plan.train_plan,
        pool: pool.clone(),
        input_plan: if cfg.fuse_input && rows_at == RowsAt::Host {
            trainer.model().input_plan()
        } else {
            None
        },
        // On the CPU the trainer makes the aggregate inside its first product, where the
        // fetching of stored rows overlaps arithmetic; a GPU trainer takes it made.
        aggregate_in_trainer: cfg.fuse_input && be.name() == CpuBackend.name(),
    };
    let uncached;
    let cache_cfg = if cache_unneeded {
        cache_spec(&cfg)?;
        obs.note(
            "the feature cache is not built: every feature row fits on the device and stays \
             there (--feature-placement uva or device keeps the cache on the GPU instead; \
             Match's batch order is kept)",
        );
        uncached = no_cache(&cfg);
        &uncached
    } else {
        &cfg
    };
    let (mut extractor, mut cache_json, cache_line) = build_cache(
        &ds,
        cache_cfg,
        &sampler,
        &plan,
        &pcfg,
        &mut trainer,
        env,
        Some(TrialTurns::all(comm)),
    )?;
    if let Some(line) = cache_line {
        obs.note(&line);
    }
    let table = match rows_at.cache_on_device() {
        false => None,
        true => match device_cache_table(&be, extractor.as_ref(), cfg.feature_placement) {
            Ok(t) => Some(t),
            // auto keeps a cache that does not fit on the device on the host, or, where every
            // row is mapped already, reads every row in place instead.
            Err(why) if cfg.feature_placement == FeaturePlacement::Auto => {
                let (instead, at) = if rows_at.mapped() {
                    (
                        "every row is read in place instead, no cache kept",
                        RowsAt::Mapped,
                    )
                } else {
                    ("the cache stays on the host", RowsAt::Host)
                };
                obs.note(&format!("{instead}: {why}"));
                if at == RowsAt::Mapped {
                    // Nothing reads the host cache now: its memory goes back, and the run
                    // reports no cache, as one asked for none would.
                    (extractor, cache_json, _) = build_cache(
                        &ds,
                        &no_cache(&cfg),
                        &sampler,
                        &plan,
                        &pcfg,
                        &mut trainer,
                        env,
                        None,
                    )?;
                }
                rows_at = at;
                None
            }
            Err(e) => return Err(e),
        },
    };
    if let Some((table, cached, dim)) = table {
        trainer = trainer.with_device_cache(table);
        let reuse = if cfg.cache.match_reorder {
            ", and the rows it shares with the batch before it (Match) are reused there"
        } else {
            ""
        };
        let misses = if rows_at.mapped() {
            "the device reads the rows it misses in place from host memory"
        } else {
            "each batch uploads only the rows it misses"
        };
        obs.note(&format!(
            "feature cache on the device: {cached} rows x {dim} ({:.0} MB as f32); {misses}{reuse}",
            (cached * dim * 4) as f64 / 1e6
        ));
    }
    let train: Box<dyn crate::BatchSource> = match &plan.split {
        Some(owners) => Box::new(crate::split::SplitSource::new(
            sampler.clone(),
            owners.clone(),
            extractor,
            comm,
            plan.train_seeds.clone(),
            plan.batch_size,
            cfg.seed,
            crate::split::Shuffle::for_model(cfg.model),
        )?),
        None => {
            let p = Pipeline::new(sampler.clone(), extractor, plan.train_seeds.clone(), &pcfg)?;
            Box::new(match rows_at {
                RowsAt::Device => p.with_rows_on_device(row_bytes),
                RowsAt::DeviceCache => p.with_cache_on_device(),
                RowsAt::DeviceCacheMapped => p.with_cache_on_device_misses_mapped(),
                RowsAt::Mapped => p.with_rows_mapped(mapped_row_bytes),
                RowsAt::Host => p,
            })
        }
    };
    let (mut valid, mut test) = eval_pipelines(&ds, &sampler, &pcfg, batch_size, plan.eval_plan)?;
    if on_device {
        valid = valid.map(|p| p.with_rows_on_device(row_bytes));
        test = test.map(|p| p.with_rows_on_device(row_bytes));
    }
    if mapped {
        valid = valid.map(|p| p.with_rows_mapped(mapped_row_bytes));
        test = test.map(|p| p.with_rows_mapped(mapped_row_bytes));
    }

    let mut described = plan.describe(workers, threads);
    if be.name() != "cpu" {
        described.push_str(&format!("; computing on {}", be.name()));
    }
    obs.note(&run_summary(
        &cfg,
        &ds,
        &model_cfg,
        trainer.model().num_params(),
        &described,
    ));
    let fit_cfg = FitConfig {
        epochs: cfg.epochs,
        eval_every: cfg.eval_every,
    };
    let num_nodes = ds.num_nodes();
    // Epochs in the last checkpoint this run wrote, and the state after the last epoch.
    let mut saved: Option<u64> = None;
    let mut last: Option<FitState> = None;
    let result = {
        let ckpt = env.checkpoint.filter(|_| rank == 0);
        let (cfg, model_cfg, names) = (&cfg, &model_cfg, &names);
        let (saved, last) = (&mut saved, &mut last);
        let mut hook = |s: &FitState| -> Result<()> {
            if let Some(path) = ckpt {
                let best = s.best.as_ref().map_or(&s.params, |b| &b.params);
                let params = names.iter().cloned().zip(best.iter().cloned()).collect();
                let bytes = checkpoint_bytes(cfg, model_cfg, params, Some(s), num_nodes)?;
                io::save_bytes(&bytes, path)?;
                *saved = Some(s.epochs_done);
            }
            *last = Some(s.clone());
            Ok(())
        };
        let ctl = FitControl {
            cancel: env.cancel,
            resume,
            // The floors are the CPU's GEMM rate and copy bandwidth: meaningless for another
            // backend's steps, so they are neither measured nor reported there.
            rates: if be.name() == "cpu" {
                crate::floor::run_rates(cfg.threads)
            } else {
                None
            },
            on_epoch: if env.checkpoint.is_some() {
                Some(&mut hook)
            } else {
                None
            },
        };
        fit_with(
            &mut trainer,
            train.as_ref(),
            valid.as_ref().map(|p| p as &dyn crate::BatchSource),
            test.as_ref().map(|p| p as &dyn crate::BatchSource),
            fit_cfg,
            comm,
            obs,
            ctl,
        )
    };
    let metrics = result.map_err(|e| {
        let note = match (saved, env.checkpoint, env.resume) {
            (Some(k), Some(p), _) => Some(format!(
                "the last good checkpoint is {} (after {k} epochs; continue with --resume {})",
                p.display(),
                p.display()
            )),
            (None, _, Some(r)) => Some(format!(
                "the last good checkpoint is {}, the one resumed from, left as it was",
                r.display()
            )),
            (None, Some(p), None) => Some(format!(
                "no epoch finished, so nothing was saved to {} (a file already there is left \
                 as it was)",
                p.display()
            )),
            _ => None,
        };
        e.with_checkpoint(note)
    })?;
    Ok(TrainOutcome {
        config: cfg,
        metrics,
        model: into_cpu_model(trainer.into_model())?,
        backend: be.name(),
        rank,
        workers,
        comm: comm.kind(),
        comm_stats: comm.stats(),
        gradient_sum: (workers > 1).then(|| match be.device_group() {
            Some(_) => "device",
            None => "host",
        }),
        cache: cache_json,
        dataset,
        features_resident: ds.features.as_ref().is_some_and(|f| f.is_resident()),
        threads,
        strategy_report: None,
        state: last,
        num_nodes,
    })
}

/// The validation and test pipelines of a worker (`None` for an empty split): batches of
/// `batch_size` cut by `plan`, in order, without a cache, with `pcfg`'s queues and pool.
pub(crate) fn eval_pipelines(
    ds: &Arc<Dataset>,
    sampler: &Arc<dyn Sampler>,
    pcfg: &PipelineConfig,
    batch_size: usize,
    plan: fanout_sample::BatchPlan,
) -> Result<(Option<Pipeline>, Option<Pipeline>)> {
    let eval_cfg = PipelineConfig {
        batch_size,
        plan,
        ..pcfg.for_evaluation()
    };
    let split = |v: Vec<u32>| -> Result<Option<Pipeline>> {
        if v.is_empty() {
            return Ok(None);
        }
        let ex = PlainExtractor::new(ds.clone())?;
        Pipeline::new(sampler.clone(), Box::new(ex), v, &eval_cfg).map(Some)
    };
    Ok((split(ds.valid.to_vec())?, split(ds.test.to_vec())?))
}

/// The line describing a run: model, dataset, sizes and settings, then `strategy`.
fn run_summary(
    cfg: &TrainConfig,
    ds: &Dataset,
    model_cfg: &ModelConfig,
    params: usize,
    strategy: &str,
) -> String {
    let fanouts: Vec<String> = model_fanouts(cfg).iter().map(|k| k.to_string()).collect();
    format!(
        "{} on {} ({} vertices, {} train / {} valid / {} test): {} layers, hidden {}, fanouts \
         {}, batch {}, lr {}, {} parameters{}",
        cfg.model.name(),
        if cfg.dataset.is_none() {
            "the embedded graph".to_string()
        } else {
            ds.dir.display().to_string()
        },
        ds.num_nodes(),
        ds.train.len(),
        ds.valid.len(),
        ds.test.len(),
        model_cfg.num_layers,
        model_cfg.hidden,
        fanouts.join(","),
        cfg.batch_size.unwrap_or(0),
        cfg.lr.unwrap_or(0.0),
        params,
        strategy,
    )
}

fn model_fanouts(cfg: &TrainConfig) -> Vec<u32> {
    cfg.fanouts.clone().unwrap_or_default()
}

/// The cache policy (`None`: no cache) and size `cfg` asks for; `Err` names the flag that is
/// wrong.
pub(crate) fn cache_spec(cfg: &TrainConfig) -> Result<(Option<Policy>, CacheSizeSpec)> {
    let c = &cfg.cache;
    let policy = match c.policy.trim() {
        "none" | "" => None,
        p => Some(
            p.parse::<Policy>()
                .map_err(|e| ExecError::Invalid(format!("--cache-policy: {e}")))?,
        ),
    };
    let size_spec = CacheSizeSpec::parse(&c.ratio)
        .map_err(|e| ExecError::Invalid(format!("--cache-ratio: {e}, or auto")))?;
    if size_spec == CacheSizeSpec::Auto && policy.is_none() {
        return Err(ExecError::Invalid(
            "--cache-ratio auto sizes a feature cache: give --cache-policy random, degree or presc"
                .into(),
        ));
    }
    if c.device_memory.is_some() && size_spec != CacheSizeSpec::Auto {
        return Err(ExecError::Invalid(
            "--device-memory is the budget of --cache-ratio auto; add --cache-ratio auto".into(),
        ));
    }
    Ok((policy, size_spec))
}

/// How the workers of one process take turns at `--cache-ratio auto`'s trial step: the
/// probe's peak is the process's, so a worker measuring while another runs its trial would
/// count both, and the sizes would change from run to run.
#[derive(Clone, Copy)]
pub(crate) struct TrialTurns<'a> {
    /// Every worker of the group; each calls the same barriers, in rank order, whether it
    /// runs a trial (in [`build_cache`]) or not ([`sit_out_trials`]).
    pub comm: &'a dyn Comm,
    /// The workers with a cache, which share the memory budget equally.
    pub sharing: u64,
}

impl<'a> TrialTurns<'a> {
    /// Turns over `comm` where every worker has a cache.
    pub(crate) fn all(comm: &'a dyn Comm) -> Self {
        TrialTurns {
            comm,
            sharing: comm.size() as u64,
        }
    }
}

/// True when the workers of `comm` take [`TrialTurns`]: workers of one process (`local`),
/// more than one, and a cache sized `auto` in `cfg`.
fn trial_turns_needed(cfg: &TrainConfig, comm: &dyn Comm) -> bool {
    comm.kind() == "local"
        && comm.size() > 1
        && matches!(cache_spec(cfg), Ok((Some(_), CacheSizeSpec::Auto)))
}

/// The barriers of [`build_cache`]'s trial turns for a worker of `comm` without a cache (a
/// factored run's sampler), so that the workers with one can measure one at a time while it
/// waits, allocating nothing.
pub(crate) fn sit_out_trials(cfg: &TrainConfig, comm: &dyn Comm) -> Result<()> {
    if trial_turns_needed(cfg, comm) {
        for _ in 0..=comm.size() {
            comm.barrier()?;
        }
    }
    Ok(())
}

/// `cfg` with no feature cache and no Match reuse (the batch order it sets is kept: the
/// pipeline reads the window from `cfg`).
fn no_cache(cfg: &TrainConfig) -> TrainConfig {
    TrainConfig {
        cache: crate::CacheSpec::default(),
        ..cfg.clone()
    }
}

/// Builds the training pipeline's extractor: plain, or with the configured cache (sized by
/// hand or from PaGraph's trial batch) and Match. Returns it with the cache's JSON and a
/// summary line for the user. `group`, when given, is the communicator of every worker that
/// builds its cache here at the same point: with `--cache-ratio auto`, the workers of one
/// process then measure their trial batches one at a time and size their caches for an equal
/// share of the memory budget.
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
pub(crate) fn build_cache<B: Backend>(
    ds: &Arc<Dataset>,
    cfg: &TrainConfig,
    sampler: &Arc<dyn Sampler>,
    plan: &WorkerPlan,
    pcfg: &PipelineConfig,
    trainer: &mut Trainer<B>,
    env: &RunEnv,
    turns: Option<TrialTurns<'_>>,
) -> Result<(
    Box<dyn fanout_cache::Extractor>,
    serde_json::Value,
    Option<String>,
)> {
    let c = &cfg.cache;
    let (policy, size_spec) = cache_spec(cfg)?;
    if policy.is_none() && !c.match_reorder {
        let ex = PlainExtractor::new(ds.clone())?;
        let json = serde_json::json!({ "policy": "none", "rows": 0 });
        return Ok((Box::new(ex), json, None));
    }
    let (size, auto) = match size_spec {
        CacheSizeSpec::Fixed(s) => (s, None),
        CacheSizeSpec::Auto => {
            let (rows, t, z) = auto_size(ds, cfg, sampler, plan, pcfg, trainer, env, turns)?;
            (CacheSize::Rows(rows), Some((t, z)))
        }
    };
    let pre = PreSampling {
        sampler: sampler.clone(),
        seeds: &plan.train_seeds,
        loader: LoaderConfig {
            batch_size: plan.batch_size,
            shuffle: true,
            seed: cfg.seed,
            ..LoaderConfig::default()
        },
    };
    let mut ranking = plan.cache_ranking(ds, policy);
    if let (Some(_), Some((_, own)), Some(p)) = (&plan.split, &plan.part, policy) {
        // A split worker only ever reads its own range's rows: its cache ranks them alone,
        // in the policy's order over the whole graph (degree is already ranked in the part).
        let full = match p {
            _ if ranking.is_some() => None,
            Policy::Random => Some(fanout_cache::policy::random_ranking(
                ds.num_nodes() as usize,
                cfg.seed,
            )),
            Policy::PreSC(k) => Some(fanout_cache::presc::presc_ranking(
                sampler,
                pre.seeds,
                &pre.loader,
                k,
            )?),
            _ => None,
        };
        if let (Some(full), Some(&lo), Some(&hi)) = (full, own.first(), own.last()) {
            ranking = Some(full.into_iter().filter(|v| (lo..=hi).contains(v)).collect());
        }
    }
    let cache = CacheConfig {
        policy,
        size,
        match_previous: c.match_reorder,
        seed: cfg.seed,
        ranking,
    };
    let (ex, summary) = build_extractor(ds.clone(), &cache, Some(&pre))?;
    let how = match &auto {
        None if cache.policy.is_none() => String::new(),
        None => format!("; size set by hand (--cache-ratio {})", c.ratio.trim()),
        Some((t, z)) => format!(
            "; size auto: device memory {}, trial-batch peak {} (step {} + model state {}), \
             queued batches {}, margin {} -> cache {} = {} rows{}",
            mib(z.device_memory),
            mib(z.trial_peak),
            mib(t.step_peak),
            mib(t.model_state),
            mib(z.prefetch_buffers),
            mib(z.margin),
            mib(z.budget),
            z.rows,
            if z.rows == 0 {
                " (no memory left for a cache: 0 rows)"
            } else {
                ""
            }
        ),
    };
    let line = format!(
        "feature cache: {} holding {} rows ({:.1}% of vertices, {:.1} MB){}{}{}{}",
        summary.policy,
        summary.rows,
        100.0 * summary.ratio,
        summary.bytes as f64 / 1e6,
        if cache.ranking.is_some() {
            ", ranked within this worker's partition"
        } else {
            ""
        },
        if summary.match_previous {
            ", reusing the previous batch's rows"
        } else {
            ""
        },
        if pcfg.window() > 1 {
            format!(", Greedy Reorder in windows of {} batches", pcfg.window())
        } else {
            String::new()
        },
        how
    );
    let json = serde_json::json!({
        "policy": summary.policy,
        "rows": summary.rows,
        "ratio": summary.ratio,
        "bytes": summary.bytes,
        "match_previous": summary.match_previous,
        "ranked_in_partition": cache.ranking.is_some(),
        "size_chosen": if auto.is_some() { "auto" } else { "by hand" },
        "cache_ratio": c.ratio.trim(),
        "auto": auto.map(|(t, z)| serde_json::json!({
            "device_memory": z.device_memory,
            "trial_peak": z.trial_peak,
            "trial_step_peak": t.step_peak,
            "model_state": t.model_state,
            "trial_batch_bytes": t.batch_bytes,
            "trial_feature_bytes": t.feature_bytes,
            "trial_input_nodes": t.input_nodes,
            "prefetch_buffers": z.prefetch_buffers,
            "margin": z.margin,
            "budget": z.budget,
            "row_bytes": ds.features.as_ref().map_or(0, |f| f.row_bytes()),
            "num_nodes": ds.num_nodes(),
            "rows": z.rows,
        })),
    });
    Ok((Box::new(ex), json, Some(line)))
}

/// PaGraph's cache sizing: one trial step measures the peak, the cache gets what is left.
#[allow(clippy::too_many_arguments)]
fn auto_size<B: Backend>(
    ds: &Arc<Dataset>,
    cfg: &TrainConfig,
    sampler: &Arc<dyn Sampler>,
    plan: &WorkerPlan,
    pcfg: &PipelineConfig,
    trainer: &mut Trainer<B>,
    env: &RunEnv,
    turns: Option<TrialTurns<'_>>,
) -> Result<(usize, TrialMemory, AutoSize)> {
    let probe = env.probe.ok_or_else(|| {
        ExecError::Invalid("--cache-ratio auto needs a memory probe, which this host lacks".into())
    })?;
    let device_memory = match &cfg.cache.device_memory {
        Some(t) => {
            parse_bytes(t).map_err(|e| ExecError::Invalid(format!("--device-memory: {e}")))?
        }
        None => probe.available().map_err(|e| {
            ExecError::Invalid(format!(
                "--cache-ratio auto: no --device-memory given and the {}'s size is unknown: \
                 {e}; give --device-memory BYTES",
                probe.name()
            ))
        })?,
    };
    let mut ex = PlainExtractor::new(ds.clone())?;
    let mut trial_batch =
        || measure_trial_batch(trainer, sampler, &mut ex, &plan.train_seeds, pcfg, probe);
    // The probe's peak is the process's: workers of one process take turns (the others wait
    // at a barrier, allocating nothing), or each would count the others' trials and the sizes
    // would change from run to run. The workers with a cache share the host's memory, so
    // each sizes its cache for its share of the budget.
    let budget = device_memory;
    let (trial, shares) = match turns.filter(|t| trial_turns_needed(cfg, t.comm)) {
        Some(t) => {
            // Every worker's set-up done before the first trial (one barrier), then one turn
            // between each pair of the `size` barriers that follow, in rank order (a worker
            // without a cache passes its turn: `sit_out_trials`).
            let c = t.comm;
            for _ in 0..=c.rank() {
                c.barrier()?;
            }
            let mine = trial_batch();
            for _ in c.rank()..c.size() {
                c.barrier()?;
            }
            (mine, t.sharing.max(1))
        }
        None => (trial_batch(), 1),
    };
    let device_memory = budget / shares;
    let trial = trial.map_err(|e| {
        ExecError::Invalid(format!("--cache-ratio auto: the trial batch failed: {e}"))
    })?;
    let f = ds
        .features
        .as_ref()
        .ok_or_else(|| ExecError::Invalid("the dataset has no features".into()))?;
    let sized = auto_cache_size(
        device_memory,
        trial.peak(),
        trial.queued_bytes(pcfg),
        ds.num_nodes() as usize,
        f.row_bytes(),
    )
    .map_err(|e| {
        let share = match shares {
            1 => String::new(),
            n => format!(" shared by the {n} workers of this process"),
        };
        ExecError::Invalid(format!(
            "--cache-ratio auto with --device-memory {}{share}: {e}; raise --device-memory or \
             lower --batch-size",
            mib(budget)
        ))
    })?;
    Ok((sized.rows, trial, sized))
}

/// Bytes as MiB with one decimal, for summaries.
fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

/// The metrics JSON of a run that stopped before its end (interrupted, or failed): the epochs
/// it finished, with the fields of [`TrainOutcome::report`] that do not need the end of the
/// run (`test_acc` is `null`) and `"stopped"`, why it stopped. `fanout report` draws it.
pub fn stopped_run_report(
    cfg: &TrainConfig,
    epochs: &[EpochMetrics],
    stopped: &str,
) -> serde_json::Value {
    let m = RunMetrics {
        median_epoch_s: RunMetrics::median_epoch_time(epochs),
        epochs: epochs.to_vec(),
        ..RunMetrics::default()
    };
    serde_json::json!({
        "model": cfg.model.name(),
        "dataset": cfg.dataset.as_ref().map_or("embedded".into(), |d| d.display().to_string()),
        "strategy": cfg.strategy_kind().name(),
        "workers": cfg.workers,
        "stopped": stopped,
        "test_acc": null,
        "median_epoch_s": m.median_epoch_s,
        "median_floor_s": m.median_floor_s(),
        "median_performed_bound_s": m.median_performed_bound_s(),
        "epochs": m.epochs,
        "config": cfg,
    })
}
