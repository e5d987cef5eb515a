//! The consumers fuzzed, one per [`Target`], and how a run ends ([`Outcome`]).

use crate::bundle::Bundle;
use fanout_compute::{io, CpuBackend};
use fanout_graph::{Dataset, NoProgress};
use fanout_import::{Format, ImportOptions};
use fanout_sample::{BatchKey, KHopConfig, KHopSampler, RemapKind, Sampler};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Arc;

/// What is fuzzed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    /// A dataset folder (`meta.txt` and every array): opened, then sampled and gathered, and
    /// every 8th input trained on for one epoch.
    Dataset,
    /// A NumPy source folder (`.npy` headers and arrays), imported, then verified.
    Npy,
    /// An OGB source folder (`raw/*.csv`, `split/*/*.csv`), imported, then verified.
    Ogb,
    /// An edge-list text file, imported, then verified.
    Edgelist,
    /// A checkpoint (safetensors with fanout's metadata), loaded into a model.
    Checkpoint,
    /// The JSON `fanout report` reads (a training run's metrics, or cache-sim rows), drawn as
    /// SVG and, for every 4th input, PNG.
    Report,
}

impl Target {
    /// Every target.
    pub const ALL: [Target; 6] = [
        Target::Dataset,
        Target::Npy,
        Target::Ogb,
        Target::Edgelist,
        Target::Checkpoint,
        Target::Report,
    ];

    /// The name used for corpus folders and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Target::Dataset => "dataset",
            Target::Npy => "npy",
            Target::Ogb => "ogb",
            Target::Edgelist => "edgelist",
            Target::Checkpoint => "checkpoint",
            Target::Report => "report",
        }
    }
}

/// How one run ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Accepted.
    Ok,
    /// Refused with a clean error (the message).
    Error(String),
    /// A panic, or an error reporting one, or a broken guarantee (the message): a bug.
    Crash(String),
}

/// Vertices of the import seeds: imports are told this count, so that a mutated id far out of
/// range is an error rather than a request for billions of vertices (which is legal input).
pub const IMPORT_NODES: u64 = 40;

/// Runs `target` on `input`, written to a fresh temporary folder.
pub fn run(target: Target, input: &Bundle) -> Outcome {
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => return Outcome::Error(format!("no temporary folder: {e}")),
    };
    let src = dir.path().join("src");
    if let Err(e) = input.write_dir(&src) {
        return Outcome::Error(format!("cannot write the input: {e}"));
    }
    let out = dir.path().join("out");
    let r = catch_unwind(AssertUnwindSafe(|| match target {
        Target::Dataset => dataset(&src),
        Target::Npy => import(Format::Npy, &src, &out),
        Target::Ogb => import(Format::Ogb, &src, &out),
        Target::Edgelist => import(Format::EdgeList, &src.join("edges.txt"), &out),
        Target::Checkpoint => checkpoint(&src.join("model.safetensors")),
        Target::Report => report(&src.join("metrics.json"), &out),
    }));
    match r {
        Ok(Ok(())) => Outcome::Ok,
        Ok(Err(Failure::Error(m))) if m.contains("panicked") => Outcome::Crash(m),
        Ok(Err(Failure::Error(m))) => Outcome::Error(m),
        Ok(Err(Failure::Broken(m))) => Outcome::Crash(m),
        Err(p) => Outcome::Crash(format!("panic: {}", panic_message(&*p))),
    }
}

/// Why a consumer stopped.
enum Failure {
    /// A clean error.
    Error(String),
    /// A guarantee broken without a panic (e.g. an import that verify then rejects).
    Broken(String),
}

fn err(e: impl std::fmt::Display) -> Failure {
    Failure::Error(e.to_string())
}

/// Opens the dataset; when it opens, samples two batches of its training seeds with and
/// without replacement, gathers their features, and trains one epoch on every 8th input.
fn dataset(dir: &Path) -> Result<(), Failure> {
    let ds = Arc::new(Dataset::open(dir).map_err(err)?);
    let n = ds.num_nodes();
    let seeds: Vec<u32> = if ds.train.is_empty() {
        (0..n.min(8) as u32).collect()
    } else {
        ds.train.iter().take(8).copied().collect()
    };
    for replace in [false, true] {
        let cfg = KHopConfig {
            fanouts: vec![3, 2],
            replace,
            remap: RemapKind::Auto,
        };
        let s = KHopSampler::new(ds.clone(), cfg).map_err(err)?;
        let key = BatchKey {
            seed: 1,
            epoch: 0,
            step: replace as u64,
        };
        let b = s.sample(&seeds, key).map_err(err)?;
        if let Some(f) = &ds.features {
            let mut out = Vec::new();
            f.gather_into(&b.input_nodes, &mut out);
            if out.len() != b.input_nodes.len() * f.dim {
                return Err(Failure::Broken(format!(
                    "gathered {} values for {} rows of {}",
                    out.len(),
                    b.input_nodes.len(),
                    f.dim
                )));
            }
        }
    }
    // Training is the slow part: every 8th input, chosen by content.
    let h = dir_hash(dir);
    if h & 7 == 0 && ds.features.is_some() && ds.labels.is_some() && !ds.train.is_empty() {
        let cfg = fanout_exec::TrainConfig {
            dataset: Some(dir.to_path_buf()),
            fanouts: Some(vec![3, 2]),
            batch_size: Some(16),
            hidden: Some(8),
            epochs: 1,
            threads: Some(1),
            ..fanout_exec::TrainConfig::default()
        };
        fanout_exec::train(&cfg, &fanout_exec::RunEnv::default(), &mut ()).map_err(err)?;
    }
    Ok(())
}

/// A cheap hash of the files' sizes, to pick inputs deterministically.
fn dir_hash(dir: &Path) -> u64 {
    let mut h = 0u64;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let len = e.metadata().map_or(0, |m| m.len());
            h = h.wrapping_add(fanout_rand::mix_keys(&[len]));
        }
    }
    h
}

/// Imports `src`; a successful import must then open and pass `verify`.
fn import(format: Format, src: &Path, out: &Path) -> Result<(), Failure> {
    let mut opts = ImportOptions::default();
    opts.build.num_nodes = Some(IMPORT_NODES);
    fanout_import::import(format, src, out, &opts, &NoProgress).map_err(err)?;
    fanout_graph::verify(out, &NoProgress)
        .map(|_| ())
        .map_err(|e| Failure::Broken(format!("the import succeeded but verify says: {e}")))
}

/// Loads the checkpoint into a model.
fn checkpoint(path: &Path) -> Result<(), Failure> {
    let bytes = std::fs::read(path).map_err(err)?;
    io::read_config(&bytes).map_err(err)?;
    io::from_bytes(CpuBackend, &bytes).map_err(err)?;
    Ok(())
}

/// Draws the metrics as `fanout report` does: the output is checked, the file read, then drawn
/// as SVG and, for every 4th input (PNG is the slower backend), as PNG. A drawing that
/// succeeds must leave a non-empty picture of its format.
fn report(input: &Path, out: &Path) -> Result<(), Failure> {
    std::fs::create_dir_all(out).map_err(err)?;
    let pictures = [("run.svg", &b"<svg"[..]), ("run.png", &b"\x89PNG"[..])];
    let draw = if dir_hash(input.parent().unwrap_or(input)) & 3 == 0 {
        &pictures[..]
    } else {
        &pictures[..1]
    };
    for (name, magic) in draw {
        let pic = out.join(name);
        fanout_report::check_output(&pic, Some(input)).map_err(err)?;
        let r = fanout_report::load(input).map_err(err)?;
        fanout_report::render(&r, &pic).map_err(err)?;
        let bytes = std::fs::read(&pic).map_err(|e| {
            Failure::Broken(format!("render succeeded but {name} cannot be read: {e}"))
        })?;
        if !bytes.windows(magic.len()).take(64).any(|w| w == *magic) {
            return Err(Failure::Broken(format!(
                "render succeeded but {name} ({} bytes) is not a picture of its format",
                bytes.len()
            )));
        }
    }
    Ok(())
}

/// The text of a panic payload.
fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(not a string)".into())
}

/// Runs `f` with the panic hook silenced (crashes are reported by the fuzzer, not printed with
/// a backtrace each), then restores the previous hook.
pub fn with_quiet_panics<R>(f: impl FnOnce() -> R) -> R {
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = catch_unwind(AssertUnwindSafe(f));
    std::panic::set_hook(prev);
    match r {
        Ok(r) => r,
        Err(p) => std::panic::resume_unwind(p),
    }
}
