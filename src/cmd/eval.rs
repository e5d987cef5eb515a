//! `fanout eval`: the accuracy of a saved model on a dataset's test (or validation) set,
//! sampled exactly as `fanout train` evaluated it.

use crate::cmd::residency::ResidencyArg;
use crate::cmd::train::{make_pipeline, make_sampler, meta, open_dataset, set_threads};
use clap::{Args, ValueEnum};
use fanout_compute::{io, CpuBackend, ModelKind};
use fanout_exec::{PipelineConfig, Trainer};
use fanout_sample::parse_fanouts;
use std::path::PathBuf;

/// Evaluate a model saved by `fanout train --save-model` on a dataset
///
/// Samples the chosen split with the fanouts, batch size and seed stored in the checkpoint
/// (the ones it was trained and evaluated with), so the test accuracy matches the one
/// `fanout train` reported. Without --dataset, uses the embedded default graph.
///
/// Example: fanout eval --model sage.safetensors --dataset data/cora
#[derive(Args)]
#[command(verbatim_doc_comment)]
pub struct EvalArgs {
    /// Checkpoint written by `fanout train --save-model`.
    #[arg(long)]
    pub model: PathBuf,
    /// Dataset directory (default: the embedded graph `fanout train` uses without --dataset).
    #[arg(long)]
    pub dataset: Option<PathBuf>,
    /// Which split to evaluate.
    #[arg(long, value_enum, default_value = "test")]
    pub split: SplitArg,
    /// Threads for sampling and compute (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Where the features are read from (as `fanout train --feature-residency`).
    #[arg(long, value_enum, default_value = "auto")]
    pub feature_residency: ResidencyArg,
    /// Device to compute on: cpu, cuda (= cuda:0) or cuda:N. CUDA needs a build with
    /// `--features cuda`; its compute path is not implemented yet, so cuda stops with an error.
    #[arg(long, default_value = "cpu")]
    pub device: fanout_cuda::DeviceSpec,
}

/// The split `--split` accepts.
#[derive(Clone, Copy, ValueEnum)]
pub enum SplitArg {
    /// Test set.
    Test,
    /// Validation set.
    Valid,
    /// Training set.
    Train,
}

/// Runs `fanout eval`.
pub fn run(a: &EvalArgs, quiet: bool) -> Result<(), String> {
    let _device = crate::cmd::device::open_for_compute(a.device)?;
    set_threads(a.threads)?;
    let bytes = std::fs::read(&a.model).map_err(|e| format!("{}: {e}", a.model.display()))?;
    let bad = |e: String| format!("{}: {e}", a.model.display());
    let md = io::read_metadata(&bytes).map_err(|e| bad(e.to_string()))?;
    let model = io::from_bytes(CpuBackend, &bytes).map_err(|e| bad(e.to_string()))?;
    let get = |k: &str| {
        md.get(k)
            .cloned()
            .ok_or_else(|| bad(format!("no {k} metadata: not saved by `fanout train`")))
    };
    let fanouts = parse_fanouts(&get(meta::FANOUTS)?).map_err(bad)?;
    let batch_size: usize = get(meta::BATCH)?
        .parse()
        .map_err(|_| bad("bad batch size".into()))?;
    let seed: u64 = get(meta::SEED)?
        .parse()
        .map_err(|_| bad("bad seed".into()))?;
    let ds = open_dataset(a.dataset.as_ref(), a.feature_residency.into(), quiet)?;
    let cfg = model.config().clone();
    let in_dim = ds.features.as_ref().map_or(0, |f| f.dim);
    if in_dim != cfg.in_dim || ds.meta.num_class as usize != cfg.num_classes {
        return Err(format!(
            "the model expects {}-dim features and {} classes; {} has {in_dim} and {}",
            cfg.in_dim,
            cfg.num_classes,
            ds.dir.display(),
            ds.meta.num_class
        ));
    }
    if fanouts.len() != cfg.num_layers {
        return Err(bad("fanouts do not match the layer count".into()));
    }
    let (name, set) = match a.split {
        SplitArg::Test => ("test", ds.test.to_vec()),
        SplitArg::Valid => ("valid", ds.valid.to_vec()),
        SplitArg::Train => ("train", ds.train.to_vec()),
    };
    if set.is_empty() {
        return Err(format!("{}: the {name} set is empty", ds.dir.display()));
    }
    let kind: ModelKind = cfg.kind;
    let sampler = make_sampler(&ds, kind, fanouts)?;
    let pcfg = PipelineConfig {
        batch_size,
        shuffle: false,
        seed,
        prefetch: 2,
        sample_workers: 1,
        reorder_window: 0,
    };
    let pipe = make_pipeline(&ds, &sampler, set, &pcfg)?;
    let mut trainer = Trainer::new(model, Box::new(fanout_compute::Sgd::new(CpuBackend, 0.0)));
    let acc = trainer.evaluate(&pipe).map_err(|e| e.to_string())?;
    if a.json {
        println!("{}", serde_json::json!({ "split": name, "accuracy": acc }));
    } else {
        println!("{name} accuracy {acc:.4}");
    }
    Ok(())
}
