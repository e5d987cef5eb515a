//! `fanout`: the command line of the fanout GNN training engine.

mod cmd;
mod interrupt;
mod memory;
mod progress;

/// Counts heap bytes so that `fanout train --cache-ratio auto` can measure a trial batch's peak,
/// and backs large blocks with transparent huge pages (see `memory.rs`).
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
    Report(cmd::report::ReportArgs),
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
    // Only the commands that stop cleanly on a signal catch it; the others end at once. An
    // MPI rank does not: its ranks would stop at different steps and wait for each other, so
    // a signal ends it (and mpirun the job) at once.
    let interrupts = match &cli.command {
        Command::Train(_) if fanout_comm::launched_by_mpi() => None,
        Command::Train(_)
        | Command::Dataset(
            cmd::dataset::DatasetCommand::Import(_)
            | cmd::dataset::DatasetCommand::Gen(_)
            | cmd::dataset::DatasetCommand::Partition(_),
        ) => Some(interrupt::Interrupts::install()),
        _ => None,
    };
    let cancel = interrupts.as_ref().map(|i| &i.cancel);
    let result = match &cli.command {
        Command::Dataset(c) => cmd::dataset::run(c, cli.quiet, cancel),
        Command::Train(a) => cmd::train::run(a, cli.quiet, cancel),
        Command::Eval(a) => cmd::eval::run(a, cli.quiet),
        Command::SampleBench(a) => cmd::sample_bench::run(a, cli.quiet),
        Command::CacheSim(a) => cmd::cache_sim::run(a, cli.quiet),
        Command::Report(a) => cmd::report::run(a),
    };
    if let Err(msg) = result {
        // An interrupted command says so in one line (its message starts "interrupted").
        if let Some(code) = interrupts.as_ref().and_then(|i| i.exit_code()) {
            eprintln!("{msg}");
            std::process::exit(code);
        }
        eprintln!("error: {msg}");
        std::process::exit(1);
    }
}
