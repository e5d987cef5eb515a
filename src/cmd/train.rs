//! `fanout train`: sample-based training through the sample -> extract -> train pipeline, with
//! evaluation, per-epoch summaries, a metrics JSON file and a checkpoint.

use crate::cmd::residency::ResidencyArg;
use crate::memory::HostHeap;
use crate::progress::Bars;
use clap::{Args, ValueEnum};
use fanout_cache::{
    auto_cache_size, build_extractor, parse_bytes, CacheConfig, CacheSize, CacheSizeSpec,
    PlainExtractor, Policy, PreSampling,
};
use fanout_compute::{io, Adam, CpuBackend, Model, ModelConfig, ModelKind, PaperSetting};
use fanout_exec::{fit, BatchOutcome, EpochMetrics, FitConfig, FitObserver, Pipeline};
use fanout_exec::{measure_trial_batch, MemoryProbe, PipelineConfig, Trainer};
use fanout_graph::{Dataset, Residency};
use fanout_sample::{
    parse_fanouts, KHopConfig, KHopSampler, LoaderConfig, RandomWalkConfig, RandomWalkSampler,
    RemapKind, Sampler,
};
use fanout_synth::{generate, GenOptions, Preset};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::path::PathBuf;
use std::sync::Arc;

/// Vertices of the embedded default dataset (products preset shape).
pub const EMBEDDED_NODES: u64 = 100_000;
/// Generator seed of the embedded default dataset.
pub const EMBEDDED_SEED: u64 = 7;

/// Train a GNN on a dataset (or, without --dataset, on a small embedded synthetic graph)
///
/// Fanouts are in hop order from the seeds ("10,25": each seed draws 10 neighbours, each of
/// those 25). Defaults per model follow the papers (GNNLab/FastGL): sage 10,25 (2 layers),
/// gcn/gat/gin 15,10,5, pinsage top-5 random-walk neighbours x3; batch 8000, lr 0.003,
/// dropout 0.5. Validation and test sets are evaluated with the same sampler and fanouts.
///
/// Example: fanout train --dataset data/cora --model gcn --epochs 50 --metrics-out m.json
#[derive(Args)]
// A flag given twice takes its last value (so scripts can append overrides).
#[command(verbatim_doc_comment, args_override_self = true)]
pub struct TrainArgs {
    /// Dataset directory (default: a 100,000-vertex products-like graph generated in memory).
    #[arg(long)]
    pub dataset: Option<PathBuf>,
    /// Model.
    #[arg(long, value_enum, default_value = "sage")]
    pub model: ModelArg,
    /// Per-hop fanouts from the seeds; the layer count is their number (default per model).
    #[arg(long)]
    pub fanouts: Option<String>,
    /// Seeds per mini-batch (default 8000; 1000 on the embedded dataset).
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Hidden width (default per model: 256, gat/gin 64).
    #[arg(long)]
    pub hidden: Option<usize>,
    /// Epochs.
    #[arg(long, default_value_t = 10)]
    pub epochs: u64,
    /// Adam learning rate (default 0.003).
    #[arg(long)]
    pub lr: Option<f32>,
    /// L2 weight decay (PyTorch Adam semantics).
    #[arg(long, default_value_t = 0.0)]
    pub weight_decay: f32,
    /// Dropout between layers.
    #[arg(long, default_value_t = 0.5)]
    pub dropout: f32,
    /// Seed of initialisation, shuffling, sampling and dropout (runs are deterministic per seed).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Threads for sampling and compute (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Evaluate on the validation and test sets every N epochs and after the last (0: only
    /// after the last).
    #[arg(long, default_value_t = 1)]
    pub eval_every: u64,
    /// Write the run's metrics as JSON (test_acc, per-epoch times, loss and accuracies).
    #[arg(long)]
    pub metrics_out: Option<PathBuf>,
    /// Save the best-validation model (safetensors) for `fanout eval`.
    #[arg(long)]
    pub save_model: Option<PathBuf>,
    /// Batches queued between pipeline stages.
    #[arg(long, default_value_t = 2)]
    pub prefetch: usize,
    /// Feature cache in front of the feature store: none, random, degree (PaGraph), presc or
    /// prescK (GNNLab PreSC with K pre-sampling epochs). The epoch summaries report the hit rate
    /// and the bytes gathered from the host store.
    #[arg(long, default_value = "none")]
    pub cache_policy: String,
    /// Cache size: a ratio of all vertices ("0.1", "10%"), bytes ("512MiB", "2GB"), or "auto"
    /// (PaGraph): one trial training step (sample, extract, forward, backward of the first
    /// batch, no optimiser step) measures its peak memory, and the cache gets what is left of
    /// --device-memory after that peak, the batches queued in the pipeline and a safety margin
    /// of min(1 GiB, device memory / 16). auto needs a --cache-policy.
    #[arg(long, default_value = "0.1")]
    pub cache_ratio: String,
    /// Device memory budget of --cache-ratio auto, in bytes ("2GiB", "512MB" or a whole
    /// number). Default on the CPU backend: MemAvailable of /proc/meminfo (the "device" is the
    /// host heap there).
    #[arg(long, value_name = "BYTES")]
    pub device_memory: Option<String>,
    /// FastGL Match: reuse the rows of the previous mini-batch and gather only the new ones.
    /// The batches keep their sampled order unless --reorder-window is given too.
    #[arg(long)]
    pub match_reorder: bool,
    /// FastGL Greedy Reorder (needs --match-reorder): take N sampled batches at a time and
    /// train them in the order where consecutive batches share the most input nodes, so Match
    /// reuses more rows. Every batch is still trained once per epoch; the order (and so the
    /// trained model) depends on N. 0 or 1: sampled order. The loader samples max(N,
    /// --prefetch) batches ahead, so up to 2N sampled batches are held in memory.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub reorder_window: usize,
    /// Where the features are read from during training: a copy in huge-page memory (faster
    /// random row gathers; auto copies when they take at most a quarter of available memory,
    /// and at most 16 GiB) or the memory-mapped dataset file.
    #[arg(long, value_enum, default_value = "auto")]
    pub feature_residency: ResidencyArg,
    /// Device to compute on: cpu, cuda (= cuda:0) or cuda:N. CUDA needs a build with
    /// `--features cuda`; its compute path is not implemented yet, so cuda stops with an error.
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

/// A dataset opened from a directory (its features copied into huge-page memory as `features`
/// says: [`Dataset::make_features_resident`], with a progress bar) or generated in memory
/// (kept alive by the handle).
pub fn open_dataset(
    dir: Option<&PathBuf>,
    features: Residency,
    quiet: bool,
) -> Result<Arc<Dataset>, String> {
    let mut ds = match dir {
        Some(d) => Dataset::open(d).map_err(|e| e.to_string())?,
        None => {
            let cfg = Preset::Products.config(Some(EMBEDDED_NODES));
            let opts = GenOptions {
                seed: EMBEDDED_SEED,
                ..GenOptions::default()
            };
            let (ds, _) = generate(&cfg, &opts, None, &Bars::new(quiet))
                .map_err(|e| format!("generating the embedded dataset: {e}"))?;
            ds
        }
    };
    // Feature gathers read random rows: from huge pages they miss the TLB far less.
    ds.make_features_resident(features, &Bars::new(quiet))
        .map_err(|e| e.to_string())?;
    let name = ds.dir.display().to_string();
    if ds.features.is_none() {
        return Err(format!(
            "{name}: the dataset has no features; import it with --random-features DIM"
        ));
    }
    if ds.labels.is_none() {
        return Err(format!("{name}: the dataset has no labels (label.bin)"));
    }
    if ds.meta.num_class == 0 {
        return Err(format!("{name}: NUM_CLASS is 0"));
    }
    Ok(Arc::new(ds))
}

/// The sampler for `kind` with hop-order `fanouts` (random walks for PinSAGE).
pub fn make_sampler(
    ds: &Arc<Dataset>,
    kind: ModelKind,
    fanouts: Vec<u32>,
) -> Result<Arc<dyn Sampler>, String> {
    let s: Arc<dyn Sampler> = if kind == ModelKind::PinSage {
        let cfg = RandomWalkConfig {
            top_k: fanouts,
            ..RandomWalkConfig::default()
        };
        Arc::new(RandomWalkSampler::new(ds.clone(), cfg).map_err(|e| e.to_string())?)
    } else {
        let cfg = KHopConfig {
            fanouts,
            replace: false,
            remap: RemapKind::Auto,
        };
        Arc::new(KHopSampler::new(ds.clone(), cfg).map_err(|e| e.to_string())?)
    };
    Ok(s)
}

/// A pipeline over `seeds` with the plain extractor.
pub fn make_pipeline(
    ds: &Arc<Dataset>,
    sampler: &Arc<dyn Sampler>,
    seeds: Vec<u32>,
    cfg: &PipelineConfig,
) -> Result<Pipeline, String> {
    let ex = PlainExtractor::new(ds.clone()).map_err(|e| e.to_string())?;
    Pipeline::new(sampler.clone(), Box::new(ex), seeds, cfg).map_err(|e| e.to_string())
}

/// Builds the global rayon pool with `threads` threads (when given).
pub fn set_threads(threads: Option<usize>) -> Result<(), String> {
    if let Some(t) = threads {
        if t == 0 {
            return Err("--threads must be at least 1".into());
        }
        rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .build_global()
            .map_err(|e| format!("cannot start {t} threads: {e}"))?;
    }
    Ok(())
}

/// Checkpoint metadata keys with the sampling settings, so `fanout eval` repeats them.
pub mod meta {
    /// Hop-order fanouts, comma-separated.
    pub const FANOUTS: &str = "train.fanouts";
    /// Seeds per evaluation batch.
    pub const BATCH: &str = "train.batch_size";
    /// The run's seed (keys evaluation sampling).
    pub const SEED: &str = "train.seed";
    /// "embedded" when trained on the embedded default dataset.
    pub const DATASET: &str = "train.dataset";
}

struct Observer {
    bar: Option<ProgressBar>,
    quiet: bool,
    epochs: u64,
}

impl FitObserver for Observer {
    fn epoch_start(&mut self, epoch: u64, batches: usize) {
        if self.quiet {
            return;
        }
        let b = ProgressBar::with_draw_target(Some(batches as u64), ProgressDrawTarget::stderr());
        b.set_style(
            ProgressStyle::with_template("epoch {prefix} [{bar:30}] {pos}/{len} batches {msg}")
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
    fn epoch_end(&mut self, m: &EpochMetrics) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
        let acc = |a: Option<f64>| a.map_or("-".to_string(), |v| format!("{v:.4}"));
        println!(
            "epoch {:>3}  {:>7.2}s  sample {:.2}s  extract {:.2}s  train {:.2}s  loss {:.4}  train_acc {:.4}  val_acc {}  host {:.1} MB  reused {:.1} MB  hit {:.1}%",
            m.epoch,
            m.wall_s,
            m.sample_s,
            m.extract_s,
            m.train_s,
            m.loss,
            m.train_acc,
            acc(m.val_acc),
            m.extract.bytes_from_host as f64 / 1e6,
            m.extract.bytes_reused as f64 / 1e6,
            100.0 * m.hit_rate
        );
    }
}

/// Bytes as MiB with one decimal, for summaries.
fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

/// Runs `fanout train`.
pub fn run(a: &TrainArgs, quiet: bool) -> Result<(), String> {
    let _device = crate::cmd::device::open_for_compute(a.device)?;
    fanout_exec::tune_allocator();
    set_threads(a.threads)?;
    let kind = ModelKind::from(a.model);
    let embedded = a.dataset.is_none();
    if embedded && !quiet {
        eprintln!(
            "no --dataset: training on an embedded products-like graph ({EMBEDDED_NODES} vertices, generated in memory)"
        );
    }
    let ds = open_dataset(a.dataset.as_ref(), a.feature_residency.into(), quiet)?;
    let in_dim = ds.features.as_ref().map_or(0, |f| f.dim);
    let paper = PaperSetting::for_kind(kind, in_dim, ds.meta.num_class as usize);
    let fanouts = match &a.fanouts {
        Some(s) => parse_fanouts(s).map_err(|e| format!("--fanouts: {e}"))?,
        None => paper.fanouts.iter().map(|&k| k as u32).collect(),
    };
    let batch_size = a
        .batch_size
        .unwrap_or(if embedded { 1000 } else { paper.batch_size });
    if batch_size == 0 {
        return Err("--batch-size must be at least 1".into());
    }
    let config = ModelConfig {
        hidden: a.hidden.unwrap_or(paper.model.hidden),
        num_layers: fanouts.len(),
        dropout: a.dropout,
        seed: a.seed,
        ..paper.model.clone()
    };
    config.validate().map_err(|e| e.to_string())?;
    let lr = a.lr.unwrap_or(paper.lr);
    let sane = |v: f32, min: f32| v.is_finite() && v >= min;
    if !sane(lr, f32::MIN_POSITIVE) || !sane(a.weight_decay, 0.0) {
        return Err("--lr must be positive and --weight-decay non-negative".into());
    }
    let train_set = ds.train.to_vec();
    if train_set.is_empty() {
        return Err(format!("{}: the training set is empty", ds.dir.display()));
    }
    let sampler = make_sampler(&ds, kind, fanouts.clone())?;
    if a.reorder_window > 1 && !a.match_reorder {
        return Err(format!(
            "--reorder-window {}: reordering only helps Match (reuse of the previous batch's \
             rows); add --match-reorder",
            a.reorder_window
        ));
    }
    let pcfg = PipelineConfig {
        batch_size,
        shuffle: true,
        seed: a.seed,
        prefetch: a.prefetch.max(1),
        sample_workers: 1,
        reorder_window: if a.match_reorder { a.reorder_window } else { 0 },
    };
    // Evaluation never reorders.
    let eval_cfg = pcfg.for_evaluation();
    let policy = match a.cache_policy.trim() {
        "none" => None,
        p => Some(
            p.parse::<Policy>()
                .map_err(|e| format!("--cache-policy: {e}"))?,
        ),
    };
    let size_spec =
        CacheSizeSpec::parse(&a.cache_ratio).map_err(|e| format!("--cache-ratio: {e}, or auto"))?;
    if size_spec == CacheSizeSpec::Auto && policy.is_none() {
        return Err(
            "--cache-ratio auto sizes a feature cache: give --cache-policy random, degree or presc"
                .into(),
        );
    }
    if a.device_memory.is_some() && size_spec != CacheSizeSpec::Auto {
        return Err(
            "--device-memory is the budget of --cache-ratio auto; add --cache-ratio auto".into(),
        );
    }

    let be = CpuBackend;
    let model = Model::new(be, config.clone()).map_err(|e| e.to_string())?;
    let opt = Adam::new(be, lr).with_weight_decay(a.weight_decay);
    let mut trainer = Trainer::new(model, Box::new(opt));

    let (size, auto) = match size_spec {
        CacheSizeSpec::Fixed(s) => (s, None),
        CacheSizeSpec::Auto => {
            let probe = HostHeap;
            let device_memory = match &a.device_memory {
                Some(t) => parse_bytes(t).map_err(|e| format!("--device-memory: {e}"))?,
                None => probe.available().map_err(|e| {
                    format!(
                        "--cache-ratio auto: no --device-memory given and the {}'s size is \
                         unknown: {e}; give --device-memory BYTES",
                        probe.name()
                    )
                })?,
            };
            let mut ex = PlainExtractor::new(ds.clone()).map_err(|e| e.to_string())?;
            let trial =
                measure_trial_batch(&mut trainer, &sampler, &mut ex, &train_set, &pcfg, &probe)
                    .map_err(|e| format!("--cache-ratio auto: the trial batch failed: {e}"))?;
            let f = ds.features.as_ref().ok_or("the dataset has no features")?;
            let sized = auto_cache_size(
                device_memory,
                trial.peak(),
                trial.queued_bytes(&pcfg),
                ds.num_nodes() as usize,
                f.row_bytes(),
            )
            .map_err(|e| {
                format!(
                    "--cache-ratio auto with --device-memory {}: {e}; raise --device-memory or \
                     lower --batch-size",
                    mib(device_memory)
                )
            })?;
            (CacheSize::Rows(sized.rows), Some((trial, sized)))
        }
    };
    let cache = CacheConfig {
        policy,
        size,
        match_previous: a.match_reorder,
        seed: a.seed,
    };
    let mut cache_json = serde_json::json!({ "policy": "none", "rows": 0 });
    let train = if cache.policy.is_none() && !cache.match_previous {
        make_pipeline(&ds, &sampler, train_set, &pcfg)?
    } else {
        let pre = PreSampling {
            sampler: sampler.clone(),
            seeds: &train_set,
            loader: LoaderConfig {
                batch_size,
                shuffle: true,
                seed: a.seed,
                ..LoaderConfig::default()
            },
        };
        let (ex, summary) =
            build_extractor(ds.clone(), &cache, Some(&pre)).map_err(|e| e.to_string())?;
        let how = match &auto {
            None if cache.policy.is_none() => String::new(),
            None => format!(
                "; size set by hand (--cache-ratio {})",
                a.cache_ratio.trim()
            ),
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
        println!(
            "feature cache: {} holding {} rows ({:.1}% of vertices, {:.1} MB){}{}{}",
            summary.policy,
            summary.rows,
            100.0 * summary.ratio,
            summary.bytes as f64 / 1e6,
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
        cache_json = serde_json::json!({
            "policy": summary.policy,
            "rows": summary.rows,
            "ratio": summary.ratio,
            "bytes": summary.bytes,
            "match_previous": summary.match_previous,
            "size_chosen": if auto.is_some() { "auto" } else { "by hand" },
            "cache_ratio": a.cache_ratio.trim(),
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
        Pipeline::new(sampler.clone(), Box::new(ex), train_set, &pcfg).map_err(|e| e.to_string())?
    };
    let split = |v: Vec<u32>| -> Result<Option<Pipeline>, String> {
        if v.is_empty() {
            Ok(None)
        } else {
            make_pipeline(&ds, &sampler, v, &eval_cfg).map(Some)
        }
    };
    let valid = split(ds.valid.to_vec())?;
    let test = split(ds.test.to_vec())?;

    let fanout_str: Vec<String> = fanouts.iter().map(|k| k.to_string()).collect();
    println!(
        "{} on {} ({} vertices, {} train / {} valid / {} test): {} layers, hidden {}, fanouts {}, batch {}, lr {lr}, {} parameters",
        kind.name(),
        if embedded { "the embedded graph".to_string() } else { ds.dir.display().to_string() },
        ds.num_nodes(),
        ds.train.len(),
        ds.valid.len(),
        ds.test.len(),
        config.num_layers,
        config.hidden,
        fanout_str.join(","),
        batch_size,
        trainer.model().num_params()
    );
    let mut obs = Observer {
        bar: None,
        quiet,
        epochs: a.epochs,
    };
    let cfg = FitConfig {
        epochs: a.epochs,
        eval_every: a.eval_every,
    };
    let run = fit(
        &mut trainer,
        &train,
        valid.as_ref(),
        test.as_ref(),
        cfg,
        &mut obs,
    )
    .map_err(|e| e.to_string())?;
    println!(
        "test accuracy {:.4} (epoch {}, best validation accuracy {:.4}); median epoch {:.2}s",
        run.test_acc, run.best_epoch, run.best_val_acc, run.median_epoch_s
    );
    if let Some(p) = &a.metrics_out {
        let json = serde_json::json!({
            "model": kind.name(),
            "dataset": if embedded { "embedded".to_string() } else { ds.dir.display().to_string() },
            "fanouts": fanouts,
            "batch_size": batch_size,
            "hidden": config.hidden,
            "lr": lr,
            "weight_decay": a.weight_decay,
            "dropout": a.dropout,
            "seed": a.seed,
            "threads": a.threads.unwrap_or_else(rayon::current_num_threads),
            "test_acc": run.test_acc,
            "best_val_acc": run.best_val_acc,
            "best_epoch": run.best_epoch,
            "median_epoch_s": run.median_epoch_s,
            "cache": cache_json,
            "reorder_window": pcfg.window(),
            "features_resident": ds.features.as_ref().is_some_and(|f| f.is_resident()),
            "epochs": run.epochs,
        });
        let text = serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?;
        std::fs::write(p, text + "\n").map_err(|e| format!("{}: {e}", p.display()))?;
    }
    if let Some(p) = &a.save_model {
        let extra = vec![
            (meta::FANOUTS.to_string(), fanout_str.join(",")),
            (meta::BATCH.to_string(), batch_size.to_string()),
            (meta::SEED.to_string(), a.seed.to_string()),
            (
                meta::DATASET.to_string(),
                if embedded { "embedded" } else { "dir" }.to_string(),
            ),
        ];
        let bytes = io::to_bytes_with(trainer.model(), &extra).map_err(|e| e.to_string())?;
        io::save_bytes(&bytes, p).map_err(|e| e.to_string())?;
    }
    Ok(())
}
