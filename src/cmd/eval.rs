//! `fanout eval`: the accuracy of a saved model on a dataset's test (or validation) set,
//! sampled exactly as `fanout train` evaluated it.

use crate::cmd::residency::ResidencyArg;
use crate::progress::Bars;
use clap::{Args, ValueEnum};
use fanout_exec::{EvalRequest, EvalSplit};
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
    /// Device to compute on: cpu, cuda (= cuda:0) or cuda:N (a build with `--features cuda`;
    /// sampling and feature gathering stay on the CPU).
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

/// Runs `fanout eval`: a thin shell over [`fanout_exec::Compute::evaluate`].
pub fn run(a: &EvalArgs, quiet: bool) -> Result<(), String> {
    // Opening says first what is missing for a GPU (no CUDA build, no driver, no device).
    let (compute, _) = fanout_exec::Compute::open(a.device)
        .map_err(|why| format!("--device {}: {why}", a.device))?;
    if let Some(t) = a.threads {
        if t == 0 {
            return Err("--threads must be at least 1".into());
        }
        rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .build_global()
            .map_err(|e| format!("cannot start {t} threads: {e}"))?;
    }
    let split = match a.split {
        SplitArg::Test => EvalSplit::Test,
        SplitArg::Valid => EvalSplit::Valid,
        SplitArg::Train => EvalSplit::Train,
    };
    let req = EvalRequest {
        checkpoint: a.model.clone(),
        dataset: a.dataset.clone(),
        split,
        feature_residency: a.feature_residency.into(),
    };
    let acc = compute
        .evaluate(&req, &Bars::new(quiet))
        .map_err(|e| e.to_string())?;
    let name = split.name();
    if a.json {
        println!("{}", serde_json::json!({ "split": name, "accuracy": acc }));
    } else {
        println!("{name} accuracy {acc:.4}");
    }
    Ok(())
}
