//! A mutation fuzzer for everything fanout reads from users: `meta.txt` and the dataset arrays
//! (opened, then sampled, gathered and trained on), the `.npy` reader, OGB csv files, edge-list
//! text and checkpoints.
//!
//! Written by hand rather than with `cargo fuzz` (nightly only) or `cargo afl` (an external
//! compiler wrapper and fork server): fanout must build and test on stable Rust with nothing
//! but cargo, and its inputs are folders of files, which these tools do not model. The
//! mutations are the classic ones of AFL's havoc stage (bit flips, interesting integers,
//! inserted, deleted and duplicated ranges) plus decimal-number swaps for text.
//!
//! An input is a [`Bundle`]: the files of one source folder (a dataset, an OGB root, ...).
//! Each iteration takes a seed bundle of the [`Target`], mutates one of its files, writes the
//! bundle to a fresh folder and runs the target's consumer on it. Any result is fine except a
//! panic (caught) or an error that reports one: that is a crash, kept as a regression input.

pub mod bundle;
pub mod mutate;
pub mod seeds;
pub mod targets;

pub use bundle::Bundle;
pub use targets::{Outcome, Target};

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The folder of committed inputs: `corpus/<target>/` (seeds) and `regressions/<target>/`
/// (crashes found and fixed).
pub fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// Every committed input of `target` (seeds and regressions), sorted by path.
pub fn committed_inputs(target: Target) -> std::io::Result<Vec<(PathBuf, Bundle)>> {
    let mut out = Vec::new();
    for kind in ["corpus", "regressions"] {
        let dir = data_dir().join(kind).join(target.name());
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut paths: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for p in paths {
            let bytes = std::fs::read(&p)?;
            let b = Bundle::decode(&bytes).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: {e}", p.display()),
                )
            })?;
            out.push((p, b));
        }
    }
    Ok(out)
}

/// A crash: the input that caused it and what happened.
#[derive(Debug)]
pub struct Crash {
    /// The mutated input.
    pub input: Bundle,
    /// The panic message, or the error that reported a panic.
    pub message: String,
}

/// What a fuzzing pass did.
#[derive(Debug, Default)]
pub struct PassStats {
    /// Inputs run.
    pub runs: u64,
    /// Runs that ended without an error.
    pub ok: u64,
    /// Runs that ended with a clean error.
    pub errors: u64,
    /// Crashes found (each also handed to the callback).
    pub crashes: u64,
    /// Seconds spent.
    pub seconds: f64,
}

/// Fuzzes `target` for `duration` (at least one run per seed input) from the RNG `seed`,
/// handing every crash to `on_crash`. `seeds` are the inputs mutated (at least one).
pub fn fuzz(
    target: Target,
    seeds: &[Bundle],
    duration: Duration,
    seed: u64,
    mut on_crash: impl FnMut(&Crash),
) -> PassStats {
    assert!(!seeds.is_empty(), "fuzzing needs at least one seed input");
    let mut rng = fanout_rand::Rng::new(seed);
    let start = Instant::now();
    let mut stats = PassStats::default();
    targets::with_quiet_panics(|| {
        while stats.runs < seeds.len() as u64 || start.elapsed() < duration {
            let base = &seeds[rng.below(seeds.len() as u64) as usize];
            let input = mutate::mutate_bundle(base, &mut rng);
            match targets::run(target, &input) {
                Outcome::Ok => stats.ok += 1,
                Outcome::Error(_) => stats.errors += 1,
                Outcome::Crash(message) => {
                    stats.crashes += 1;
                    on_crash(&Crash { input, message });
                }
            }
            stats.runs += 1;
        }
    });
    stats.seconds = start.elapsed().as_secs_f64();
    stats
}
