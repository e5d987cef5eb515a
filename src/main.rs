//! `fanout`: the command line of the fanout GNN training engine.

mod cmd;
mod memory;
mod progress;

/// Counts heap bytes so that `fanout train --cache-ratio auto` can measure a trial batch's peak
/// (see `memory.rs`).
#[global_allocator]
static ALLOC: memory::CountingAlloc = memory::CountingAlloc;

use clap::{Parser, Subcommand};

/// Fast sample-based training of graph neural networks on large graphs.
///
/// Start with `fanout dataset gen --preset tiny OUT` or `fanout dataset import`, then inspect the
/// result with `fanout dataset info OUT`.
#[derive(Parser)]
#[command(name = "fanout", version, about, long_about = None, propagate_version = true)]
struct Cli {
    /// Draw no progress bars (they are also hidden when stderr is not a terminal).
    #[arg(long, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

// subcommands (parsed once per process, so the size of the largest variant does not matter)
#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)]
enum Command {
    /// Create, import, inspect and verify datasets (the GNNLab-compatible directory format).
    #[command(subcommand)]
    Dataset(cmd::dataset::DatasetCommand),
    Train(cmd::train::TrainArgs),
    Eval(cmd::eval::EvalArgs),
    SampleBench(cmd::sample_bench::SampleBenchArgs),
    CacheSim(cmd::cache_sim::CacheSimArgs),
}

/// Restores the default action of SIGPIPE (Rust ignores it, so `println!` to a closed pipe
/// panics): `fanout ... | head` then ends quietly, as other command-line tools do. Hand-written
/// because it is one libc call; no crate is needed for it.
fn default_sigpipe() {
    #[cfg(unix)]
    {
        extern "C" {
            fn signal(signum: i32, handler: usize) -> usize;
        }
        const SIGPIPE: i32 = 13;
        const SIG_DFL: usize = 0;
        // SAFETY: setting a signal's disposition to its default is async-signal-safe and has
        // no preconditions.
        unsafe {
            signal(SIGPIPE, SIG_DFL);
        }
    }
}

fn main() {
    default_sigpipe();
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Dataset(c) => cmd::dataset::run(c, cli.quiet),
        Command::Train(a) => cmd::train::run(a, cli.quiet),
        Command::Eval(a) => cmd::eval::run(a, cli.quiet),
        Command::SampleBench(a) => cmd::sample_bench::run(a),
        Command::CacheSim(a) => cmd::cache_sim::run(a, cli.quiet),
    };
    if let Err(msg) = result {
        eprintln!("error: {msg}");
        std::process::exit(1);
    }
}
