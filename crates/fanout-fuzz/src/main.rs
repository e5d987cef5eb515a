//! `fanout-fuzz`: fuzz fanout's input parsers and loaders (see the library's docs).
//!
//! ```text
//! cargo run -p fanout-fuzz --release -- run --seconds 3600             # every target, an hour each
//! cargo run -p fanout-fuzz --release -- run --target npy --seconds 600
//! cargo run -p fanout-fuzz --release -- replay                         # committed inputs only
//! cargo run -p fanout-fuzz --release -- seed                           # rewrite corpus/ from the generators
//! ```
//!
//! Crashes are written to `crates/fanout-fuzz/crashes/<target>/<hash>.fzb` with their message
//! beside them; once fixed, move them to `regressions/<target>/`, which the tests replay.

use clap::{Parser, Subcommand};
use fanout_fuzz::{committed_inputs, data_dir, fuzz, seeds, targets, Outcome, Target};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(about = "Mutation fuzzer for fanout's parsers and loaders")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Fuzz: mutate the committed inputs and run the target on each mutant.
    Run {
        /// The target (default: every target in turn).
        #[arg(long, value_enum)]
        target: Option<Target>,
        /// Seconds per target.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// RNG seed of the mutations.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Run every committed input (corpus and regressions) once, unmutated.
    Replay,
    /// Rewrite `corpus/<target>/` from the seed generators.
    Seed,
}

fn main() -> ExitCode {
    match Cli::parse().cmd {
        Cmd::Run {
            target,
            seconds,
            seed,
        } => run(target, seconds, seed),
        Cmd::Replay => replay(),
        Cmd::Seed => seed_corpus(),
    }
}

fn selected(target: Option<Target>) -> Vec<Target> {
    target.map_or_else(|| Target::ALL.to_vec(), |t| vec![t])
}

fn run(target: Option<Target>, seconds: u64, seed: u64) -> ExitCode {
    let mut crashes = 0;
    for t in selected(target) {
        let inputs = match committed_inputs(t) {
            Ok(v) if !v.is_empty() => v,
            Ok(_) => {
                eprintln!(
                    "error: no committed inputs for {} (run `fanout-fuzz seed`)",
                    t.name()
                );
                return ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        };
        let bundles: Vec<_> = inputs.into_iter().map(|(_, b)| b).collect();
        let dir = data_dir().join("crashes").join(t.name());
        let s = fuzz(t, &bundles, Duration::from_secs(seconds), seed, |c| {
            let bytes = c.input.encode();
            let name = format!(
                "{:016x}",
                fanout_rand::mix_keys(&[bytes.len() as u64, hash(&bytes)])
            );
            let _ = std::fs::create_dir_all(&dir);
            let _ = std::fs::write(dir.join(format!("{name}.fzb")), &bytes);
            let _ = std::fs::write(dir.join(format!("{name}.txt")), &c.message);
            eprintln!("crash in {}: {} (saved as {name}.fzb)", t.name(), c.message);
        });
        crashes += s.crashes;
        println!(
            "{:<10} {:>8} runs in {:>6.1} s ({:>6.0}/s): {} accepted, {} refused with an error, {} crashes",
            t.name(),
            s.runs,
            s.seconds,
            s.runs as f64 / s.seconds.max(1e-9),
            s.ok,
            s.errors,
            s.crashes
        );
    }
    if crashes > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn replay() -> ExitCode {
    let mut bad = 0;
    targets::with_quiet_panics(|| {
        for t in Target::ALL {
            let inputs = committed_inputs(t).unwrap_or_default();
            for (path, b) in &inputs {
                if let Outcome::Crash(m) = targets::run(t, b) {
                    eprintln!("crash: {}: {m}", path.display());
                    bad += 1;
                }
            }
            println!(
                "{:<10} {} committed inputs replayed",
                t.name(),
                inputs.len()
            );
        }
    });
    if bad > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn seed_corpus() -> ExitCode {
    for t in Target::ALL {
        let dir = data_dir().join("corpus").join(t.name());
        let list = match seeds::seeds(t) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("error: seeds of {}: {e}", t.name());
                return ExitCode::FAILURE;
            }
        };
        if let Err(e) = std::fs::create_dir_all(&dir) {
            eprintln!("error: {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
        for (name, b) in list {
            let p = dir.join(format!("{name}.fzb"));
            if let Err(e) = std::fs::write(&p, b.encode()) {
                eprintln!("error: {}: {e}", p.display());
                return ExitCode::FAILURE;
            }
            println!("{}", p.display());
        }
    }
    ExitCode::SUCCESS
}

/// FNV-1a of `bytes` (a name for a crash file).
fn hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}
