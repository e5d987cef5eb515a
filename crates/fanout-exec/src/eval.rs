//! [`evaluate_checkpoint`]: the accuracy of a saved model, sampled exactly as its training run
//! evaluated it.

use crate::config::TrainConfig;
use crate::error::{ExecError, Result};
use crate::pipeline::{Pipeline, PipelineConfig};
use crate::run::{checkpoint_meta as meta, open_dataset};
use crate::trainer::Trainer;
use fanout_compute::{io, Backend, ComputeError, CpuBackend, Sgd};
use fanout_graph::{Progress, Residency};
use fanout_sample::{parse_fanouts, SamplerSpec};
use std::path::PathBuf;

/// Which seed set to evaluate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvalSplit {
    /// The test set.
    Test,
    /// The validation set.
    Valid,
    /// The training set.
    Train,
}

impl EvalSplit {
    /// `"test"`, `"valid"` or `"train"`.
    pub fn name(self) -> &'static str {
        match self {
            EvalSplit::Test => "test",
            EvalSplit::Valid => "valid",
            EvalSplit::Train => "train",
        }
    }
}

/// What to evaluate.
#[derive(Clone, Debug)]
pub struct EvalRequest {
    /// Checkpoint written by a training run (`TrainOutcome::save_model`).
    pub checkpoint: PathBuf,
    /// Dataset directory; `None`: the embedded graph.
    pub dataset: Option<PathBuf>,
    /// The split.
    pub split: EvalSplit,
    /// Where features are read from.
    pub feature_residency: Residency,
}

/// Evaluates a checkpoint on `req.split`, sampling with the fanouts, batch size, seed and
/// sampler stored in it, so the accuracy equals the one its training run reported for the
/// same parameters. Errors name the checkpoint or the dataset and what does not match.
pub fn evaluate_checkpoint(req: &EvalRequest, progress: &dyn Progress) -> Result<f64> {
    evaluate_checkpoint_with(CpuBackend, req, progress)
}

/// [`evaluate_checkpoint`] with the model on `be` (sampling and feature extraction stay on the
/// host). A backend whose kernels give the CPU's results gives the CPU's accuracy; its device
/// failing (a [`fanout_compute::DeviceFailure`] from a backend method) ends the evaluation
/// with [`ExecError::Device`].
pub fn evaluate_checkpoint_with<B: Backend>(
    be: B,
    req: &EvalRequest,
    progress: &dyn Progress,
) -> Result<f64> {
    let path = &req.checkpoint;
    let bad = |e: String| ExecError::Invalid(format!("{}: {e}", path.display()));
    let bytes = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let md = io::read_metadata(&bytes).map_err(|e| bad(e.to_string()))?;
    let model = io::from_bytes(be.clone(), &bytes).map_err(|e| match e {
        ComputeError::Device(f) => ExecError::device(f),
        e => bad(e.to_string()),
    })?;
    let get = |k: &str| {
        md.get(k)
            .cloned()
            .ok_or_else(|| bad(format!("no {k} metadata: not saved by `fanout train`")))
    };
    let fanouts = parse_fanouts(&get(meta::FANOUTS)?).map_err(bad)?;
    let batch = get(meta::BATCH)?;
    let batch_size: usize = batch
        .parse()
        .ok()
        .filter(|&b: &usize| b > 0)
        .ok_or_else(|| {
            bad(format!(
                "metadata {} is {batch:?}, expected a positive whole number",
                meta::BATCH
            ))
        })?;
    let seed_text = get(meta::SEED)?;
    let seed: u64 = seed_text.parse().map_err(|_| {
        bad(format!(
            "metadata {} is {seed_text:?}, expected a whole number",
            meta::SEED
        ))
    })?;
    // Checkpoints before the run config was stored used the model's default sampler.
    let trained: Option<TrainConfig> = md
        .get(meta::CONFIG)
        .map(|json| serde_json::from_str::<TrainConfig>(json))
        .transpose()
        .map_err(|e| bad(format!("unreadable {} metadata: {e}", meta::CONFIG)))?;
    // Without a dataset the embedded graph is evaluated on: only a model trained on it fits.
    if let (None, Some(d)) = (
        &req.dataset,
        trained.as_ref().and_then(|c| c.dataset.as_ref()),
    ) {
        return Err(bad(format!(
            "the model was trained on {}; name the dataset to evaluate on (--dataset), as \
             without one the embedded graph is used",
            d.display()
        )));
    }
    let sampler: SamplerSpec = trained.map(|c| c.sampler).unwrap_or_default();
    let cfg = TrainConfig {
        dataset: req.dataset.clone(),
        feature_residency: req.feature_residency,
        model: model.config().kind,
        sampler,
        ..TrainConfig::default()
    };
    let ds = open_dataset(&cfg, progress)?;
    let mc = model.config().clone();
    let in_dim = ds.features.as_ref().map_or(0, |f| f.dim);
    if in_dim != mc.in_dim || ds.meta.num_class as usize != mc.num_classes {
        return Err(ExecError::Invalid(format!(
            "the model expects {}-dim features and {} classes; {} has {in_dim} and {}",
            mc.in_dim,
            mc.num_classes,
            ds.dir.display(),
            ds.meta.num_class
        )));
    }
    if fanouts.len() != mc.num_layers {
        return Err(bad("fanouts do not match the layer count".into()));
    }
    let set = match req.split {
        EvalSplit::Test => ds.test.to_vec(),
        EvalSplit::Valid => ds.valid.to_vec(),
        EvalSplit::Train => ds.train.to_vec(),
    };
    if set.is_empty() {
        return Err(ExecError::Invalid(format!(
            "{}: the {} set is empty",
            ds.dir.display(),
            req.split.name()
        )));
    }
    let sampler = cfg.sampler.build(&ds, fanouts, cfg.sampler_kind())?;
    let pcfg = PipelineConfig {
        batch_size,
        shuffle: false,
        seed,
        ..PipelineConfig::default()
    };
    let ex = fanout_cache::PlainExtractor::new(ds.clone())?;
    let pipe = Pipeline::new(sampler, Box::new(ex), set, &pcfg)?;
    let mut trainer = Trainer::new(model, Box::new(Sgd::new(be, 0.0)));
    trainer.evaluate(&pipe)
}
