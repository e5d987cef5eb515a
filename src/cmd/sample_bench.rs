//! `fanout sample-bench`: sampling throughput of one sampler on one dataset, in sampled edges
//! per second (SEPS), batches per second and mean input nodes per batch.

use crate::cmd::sampler_args::SamplerArgs;
use clap::Args;
use fanout_graph::Dataset;
use fanout_sample::{layout_note, parse_fanouts, Loader, LoaderConfig, SamplerKind};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Measure sampling throughput in sampled edges per second (SEPS, edges summed over all blocks)
///
/// Samples the training set in shuffled mini-batches through the prefetching loader; the first
/// `--warmup` batches are not timed. Fanouts are in hop order from the seeds: "15,10,5" means each
/// seed draws 15 neighbours, each of those 10, each of those 5 (DGL lists the same fanouts
/// reversed, from the input layer).
///
/// Example: fanout sample-bench --dataset data/products --fanouts 15,10,5 --batch-size 8000 --json
#[derive(Args)]
#[command(verbatim_doc_comment)]
pub struct SampleBenchArgs {
    /// Dataset directory.
    #[arg(long)]
    dataset: PathBuf,
    #[command(flatten)]
    sampler: SamplerArgs,
    /// Per-hop sizes in hop order from the seeds (first = the seeds' hop). khop/weighted:
    /// neighbours per vertex (-1 = all); randomwalk: top-k neighbours per layer; layerwise:
    /// vertices per layer.
    #[arg(long, default_value = "15,10,5")]
    fanouts: String,
    /// Seeds per mini-batch.
    #[arg(long, default_value_t = 8000)]
    batch_size: usize,
    /// Threads of the sampling pool (default: all cores).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=4096))]
    threads: Option<u64>,
    /// Number of epochs to time (default 1 unless --batches is given).
    #[arg(long, conflicts_with = "batches", value_parser = clap::value_parser!(u64).range(1..))]
    epochs: Option<u64>,
    /// Number of batches to time (crossing epochs when needed).
    #[arg(long)]
    batches: Option<usize>,
    /// Untimed batches sampled first (page cache, allocations).
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Seed of the run: shuffles and random streams are keyed by (seed, epoch, step).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Batches sampled concurrently by the loader (each batch is parallel over the pool).
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Batches sampled ahead of the consumer.
    #[arg(long, default_value_t = 4)]
    prefetch: usize,
    /// Print one JSON object on stdout (keys include seps, batches_per_s, mean_input_nodes,
    /// threads) instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs the benchmark and prints its figures.
pub fn run(args: &SampleBenchArgs, quiet: bool) -> Result<(), String> {
    let threads = args.threads.map_or_else(
        || std::thread::available_parallelism().map_or(1, |n| n.get()),
        |t| t as usize,
    );
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("sample-{i}"))
            .build()
            .map_err(|e| format!("cannot start {threads} sampling threads: {e}"))?,
    );
    let ds = Arc::new(Dataset::open(&args.dataset).map_err(|e| e.to_string())?);
    if let Some(note) = layout_note(&ds) {
        eprintln!("{note}");
    }
    let fanouts = parse_fanouts(&args.fanouts).map_err(|e| format!("--fanouts: {e}"))?;
    let spec = args.sampler.spec();
    let kind = spec.kind_or(SamplerKind::Khop);
    let bars = crate::progress::Bars::new(quiet || args.json);
    let built = pool
        .install(|| spec.build_with(&ds, fanouts.clone(), kind, &bars))
        .map_err(|e| e.to_string())?;
    if let (Some(note), false) = (&built.note, args.json) {
        eprintln!("{note}");
    }
    let sampler = built.sampler;
    let resident = sampler.is_resident();
    let train = ds.train.to_vec();
    if train.is_empty() {
        return Err(format!(
            "{}: the dataset has no training vertices (NUM_TRAIN_SET 0); nothing to sample",
            args.dataset.display()
        ));
    }
    let cfg = LoaderConfig {
        batch_size: args.batch_size,
        seed: args.seed,
        workers: args.workers,
        prefetch: args.prefetch,
        pool: Some(pool.clone()),
        ..Default::default()
    };
    let loader = Loader::new(sampler, train, cfg).map_err(|e| e.to_string())?;
    let per_epoch = loader.num_batches();
    let total = match (args.batches, args.epochs) {
        (Some(b), _) => b,
        (None, e) => per_epoch * e.unwrap_or(1) as usize,
    };
    if total == 0 {
        return Err("nothing to time: --batches/--epochs give zero batches".into());
    }

    // Warm-up: the first `--warmup` batches of the run, untimed (as bench/dgl_sample.py does);
    // the timed batches are the ones that follow them.
    let (mut epoch, mut first) = (0u64, 0usize);
    let mut left = args.warmup;
    while left > 0 && per_epoch > 0 {
        let n = left.min(per_epoch - first);
        for mb in loader.epoch_from(epoch, first).take(n) {
            mb.map_err(|e| e.to_string())?;
        }
        left -= n;
        first += n;
        if first == per_epoch {
            (epoch, first) = (epoch + 1, 0);
        }
    }

    let bar = if quiet || args.json {
        ProgressBar::hidden()
    } else {
        let b = ProgressBar::new(total as u64);
        b.set_draw_target(ProgressDrawTarget::stderr_with_hz(4));
        b.set_style(
            ProgressStyle::with_template(
                "sampling [{bar:30}] {human_pos}/{human_len} batches ({per_sec}, ETA {eta})",
            )
            .unwrap()
            .progress_chars("=> "),
        );
        b
    };
    let (mut batches, mut edges, mut inputs) = (0usize, 0u64, 0u64);
    let start = Instant::now();
    let secs: f64;
    'epochs: loop {
        for mb in loader.epoch_from(epoch, first) {
            let mb = mb.map_err(|e| e.to_string())?;
            edges += mb.num_edges() as u64;
            inputs += mb.input_nodes.len() as u64;
            batches += 1;
            bar.inc(1);
            if batches == total {
                // Stop the clock before the iterator's drop waits for batches sampled ahead.
                secs = start.elapsed().as_secs_f64();
                break 'epochs;
            }
        }
        (epoch, first) = (epoch + 1, 0);
    }
    bar.finish_and_clear();

    let seps = edges as f64 / secs;
    let batches_per_s = batches as f64 / secs;
    let mean_input_nodes = inputs as f64 / batches as f64;
    if args.json {
        let out = serde_json::json!({
            "dataset": args.dataset.display().to_string(),
            "sampler": kind.name(),
            "fanouts_hop_order": args.fanouts,
            "batch_size": args.batch_size,
            "replace": spec.replace,
            "threads": threads,
            "workers": args.workers,
            "resident_topology": resident,
            "batches": batches,
            "batches_per_epoch": per_epoch,
            "sampled_edges": edges,
            "seconds": secs,
            "seps": seps,
            "batches_per_s": batches_per_s,
            "mean_input_nodes": mean_input_nodes,
            "mean_edges_per_batch": edges as f64 / batches as f64,
        });
        println!("{out}");
    } else {
        println!(
            "{} sampler on {} ({} vertices, {} arcs, {}), fanouts {} (hop order from the seeds), batch size {}, {} threads",
            kind.name(),
            args.dataset.display(),
            ds.num_nodes(),
            ds.num_arcs(),
            if resident { "resident topology" } else { "mapped topology" },
            args.fanouts,
            args.batch_size,
            threads
        );
        println!(
            "{batches} batches in {secs:.2} s: {:.3} M sampled edges/s (SEPS), {batches_per_s:.2} batches/s, mean input nodes {mean_input_nodes:.0}, mean edges {:.0} per batch",
            seps / 1e6,
            edges as f64 / batches as f64
        );
    }
    Ok(())
}
