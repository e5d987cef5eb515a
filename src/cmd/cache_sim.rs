//! `fanout cache-sim`: hit rates and bytes moved per epoch for cache policies and ratios
//! (GNNLab PreSC, PaGraph degree, random, the optimal oracle), optionally with FastGL
//! Match-Reorder, on one sampled epoch's trace.

use crate::cmd::sampler_args::SamplerArgs;
use clap::Args;
use fanout_cache::{parse_policies, simulate, Policy, SimConfig, SimReport};
use fanout_graph::Dataset;
use fanout_sample::{layout_note, parse_fanouts, LoaderConfig, SamplerKind};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Simulate feature caches on sampled epochs: hit rate and host bytes per epoch
///
/// Samples the evaluated epochs (--epochs, default 10: a static cache serves a whole training
/// run, and GNNLab's optimal is over the run's footprints) once and scores every
/// (policy, ratio) on them by counting bytes (no feature is copied). Hit rate = bytes served
/// from the cache / feature bytes needed, input nodes counted once per mini-batch. alpha =
/// cached rows / |V|. PreSC pre-samples its own epochs (keyed apart from the evaluated ones);
/// `optimal` caches the evaluated epochs' most visited vertices (an oracle). Fanouts are in hop order from the seeds ("15,10,5": seeds
/// draw 15; DGL lists them reversed).
///
/// Example: fanout cache-sim --dataset data/papers --fanouts 15,10,5 --batch-size 8000 --similarity
#[derive(Args)]
#[command(verbatim_doc_comment)]
pub struct CacheSimArgs {
    /// Dataset directory.
    #[arg(long)]
    dataset: PathBuf,
    #[command(flatten)]
    sampler: SamplerArgs,
    /// Per-hop sizes in hop order from the seeds; khop/weighted: neighbours per vertex (-1 =
    /// all); randomwalk: top-k neighbours per layer.
    #[arg(long, default_value = "15,10,5")]
    fanouts: String,
    /// Seeds per mini-batch.
    #[arg(long, default_value_t = 8000)]
    batch_size: usize,
    /// Cache ratios alpha (cached rows / |V|), comma-separated.
    #[arg(long, default_value = "0.01,0.05,0.1,0.2")]
    ratios: String,
    /// Policies: random, degree, presc (= presc1), prescK, optimal.
    #[arg(long, default_value = "random,degree,presc1,presc2,optimal")]
    policies: String,
    /// Also count FastGL Match (reuse of the previous batch) and Match + Greedy Reorder.
    #[arg(long)]
    match_reorder: bool,
    /// Reorder window in batches (0 = the whole epoch).
    #[arg(long, default_value_t = 0)]
    window: usize,
    /// Also report GNNLab's Table 2 footprint similarity of adjacent epochs and FastGL's match
    /// degree statistics (samples one more epoch).
    #[arg(long)]
    similarity: bool,
    /// Seed of the run (shuffles, sampling keys, the random policy).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The first evaluated epoch.
    #[arg(long, default_value_t = 0)]
    epoch: u64,
    /// Evaluated epochs: hit rates and the oracle are over all of them (GNNLab's optimal is
    /// over a training run's footprints); bytes are reported per epoch. 1 scores a single
    /// epoch against its own oracle (harsher: the oracle then knows which rarely visited
    /// vertices that one epoch draws).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    epochs: u64,
    /// Threads (default: all cores).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=4096))]
    threads: Option<u64>,
    /// Print one JSON object per (policy, ratio) per line instead of a table (keys include
    /// policy, ratio, hit_rate, bytes_per_epoch, share_of_optimal).
    #[arg(long)]
    json: bool,
}

/// Runs the simulation and prints the table or JSON lines.
pub fn run(args: &CacheSimArgs, quiet: bool) -> Result<(), String> {
    let threads = args.threads.map_or_else(
        || std::thread::available_parallelism().map_or(1, |n| n.get()),
        |t| t as usize,
    );
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map_err(|e| format!("cannot start {threads} threads: {e}"))?,
    );
    let policies = parse_policies(&args.policies).map_err(|e| format!("--policies: {e}"))?;
    let ratios = parse_ratios(&args.ratios)?;
    let ds = Arc::new(Dataset::open(&args.dataset).map_err(|e| e.to_string())?);
    let say = |s: String| {
        if !args.json && !quiet {
            eprintln!("{s}");
        }
    };
    if let Some(note) = layout_note(&ds) {
        say(note);
    }
    let row_bytes = match &ds.features {
        Some(f) => f.row_bytes(),
        None => return Err(format!("{}: the dataset has no features; byte counts need a feature width (import with --random-features DIM)", args.dataset.display())),
    };
    let seeds = ds.train.to_vec();
    if seeds.is_empty() {
        return Err(format!("{}: no training vertices", args.dataset.display()));
    }
    let fanouts = parse_fanouts(&args.fanouts).map_err(|e| format!("--fanouts: {e}"))?;
    let spec = args.sampler.spec();
    let kind = spec.kind_or(SamplerKind::Khop);
    let bars = crate::progress::Bars::new(quiet || args.json);
    let sampler = pool
        .install(|| spec.build_with(&ds, fanouts, kind, &bars))
        .map_err(|e| e.to_string())?
        .sampler;
    let loader = LoaderConfig {
        batch_size: args.batch_size,
        seed: args.seed,
        workers: 1,
        prefetch: 2,
        pool: Some(pool.clone()),
        ..Default::default()
    };
    let cfg = SimConfig {
        policies: policies.clone(),
        ratios,
        match_reorder: args.match_reorder,
        window: args.window,
        seed: args.seed,
        eval_epoch: args.epoch,
        eval_epochs: args.epochs,
        similarity: args.similarity,
    };
    let start = Instant::now();
    say(format!(
        "simulating {} on {} ({} vertices, {} training), fanouts {} (hop order), batch {}",
        kind.name(),
        args.dataset.display(),
        ds.num_nodes(),
        seeds.len(),
        args.fanouts,
        args.batch_size
    ));
    // On a pool of its own, not the loader's: the simulation waits for the loader's batches,
    // which are sampled on that pool, so with one thread it would wait on itself for ever.
    // Its own parallel work (the rankings' sorts) keeps to --threads threads too.
    let sim_pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| format!("cannot start {threads} threads: {e}"))?;
    let rep = sim_pool
        .install(|| simulate(sampler, &seeds, &loader, row_bytes, &cfg))
        .map_err(|e| e.to_string())?;
    say(format!("done in {:.1} s", start.elapsed().as_secs_f64()));
    if args.json {
        print_json(args, &rep);
    } else {
        print_table(args, &rep, &policies);
    }
    Ok(())
}

/// The cache ratios of `--ratios` (at least one).
fn parse_ratios(s: &str) -> Result<Vec<f64>, String> {
    s.split(',')
        .filter(|t| !t.trim().is_empty())
        .map(|t| {
            let a: f64 = t
                .trim()
                .parse()
                .map_err(|_| format!("--ratios: {t:?} is not a number"))?;
            if (0.0..=1.0).contains(&a) {
                Ok(a)
            } else {
                Err(format!("--ratios: {a} is not within [0, 1]"))
            }
        })
        .collect::<Result<Vec<f64>, String>>()
        .and_then(|r| {
            if r.is_empty() {
                Err(format!(
                    "--ratios {s:?}: no ratio; give cached fractions, e.g. 0.05,0.1,0.2"
                ))
            } else {
                Ok(r)
            }
        })
}

fn mb(b: f64) -> String {
    format!("{:.1}", b / 1e6)
}

fn print_table(args: &CacheSimArgs, rep: &SimReport, policies: &[Policy]) {
    println!(
        "{} | {} | fanouts {} | batch {} | {} epoch(s) of {} batches, {:.0} rows/epoch ({} MB), {} distinct ({:.1}% of |V|)",
        args.dataset.display(),
        args.sampler.spec().kind_or(SamplerKind::Khop).name(),
        args.fanouts,
        args.batch_size,
        rep.epochs,
        rep.batches,
        rep.rows_per_epoch,
        mb(rep.rows_per_epoch * rep.row_bytes as f64),
        rep.distinct_rows,
        100.0 * rep.distinct_rows as f64 / rep.num_nodes.max(1) as f64
    );
    let mut head = "| policy | ratio | hit rate | % of optimal | host MB/epoch |".to_string();
    let mut rule = "|---|---|---|---|---|".to_string();
    if args.match_reorder {
        head += " +match MB/epoch | +match+reorder MB/epoch | MR saved MB/epoch |";
        rule += "---|---|---|";
    }
    println!("{head}\n{rule}");
    for r in &rep.rows {
        let mut line = format!(
            "| {} | {} | {:.1}% | {:.1}% | {} |",
            r.policy,
            r.ratio,
            100.0 * r.hit_rate,
            100.0 * r.share_of_optimal,
            mb(r.bytes_per_epoch)
        );
        if let (Some(m), Some(x), Some(s)) = (
            r.match_bytes_from_host,
            r.mr_bytes_from_host,
            r.mr_saved_bytes_per_epoch,
        ) {
            let e = rep.epochs as f64;
            line += &format!(" {} | {} | {} |", mb(m as f64 / e), mb(x as f64 / e), mb(s));
        }
        println!("{line}");
    }
    if policies.contains(&Policy::PreSC(1)) && policies.contains(&Policy::Degree) {
        for r in rep.rows.iter().filter(|r| r.policy == "presc1") {
            if let Some(d) = rep
                .rows
                .iter()
                .find(|d| d.policy == "degree" && d.ratio == r.ratio)
            {
                // No ratio to a degree cache that hits nothing (a graph without arcs, say).
                let times = if d.hit_rate > 0.0 {
                    format!("= {:.2}x", r.hit_rate / d.hit_rate)
                } else {
                    "against".to_string()
                };
                println!(
                    "ratio {}: presc1 {:.1}% {times} degree {:.1}%, {:.1}% of optimal {:.1}%",
                    r.ratio,
                    100.0 * r.hit_rate,
                    100.0 * d.hit_rate,
                    100.0 * r.share_of_optimal,
                    100.0 * r.optimal_hit_rate
                );
            }
        }
    }
    if let Some(s) = &rep.similarity {
        let m = &s.matching;
        println!(
            "footprint similarity (GNNLab Table 2, top 10% of |V|, epoch {} -> {}): {:.2}%",
            args.epoch,
            args.epoch + 1,
            100.0 * s.footprint_similarity
        );
        println!(
            "match degree (FastGL Table 4) over {} batches: avg M_ij {:.1}%, min {:.1}%, max {:.1}%, delta M {:.1}%, std {:.1}%; adjacent avg {:.1}% sampled order, {:.1}% reordered",
            m.batches,
            100.0 * m.avg_m,
            100.0 * m.min_m,
            100.0 * m.max_m,
            100.0 * m.delta_m,
            100.0 * m.std_m,
            100.0 * m.avg_adjacent_m,
            100.0 * m.avg_adjacent_m_reordered
        );
    }
}

fn print_json(args: &CacheSimArgs, rep: &SimReport) {
    for r in &rep.rows {
        let mut v = serde_json::to_value(r).expect("serialisable");
        let o = v.as_object_mut().unwrap();
        o.insert("dataset".into(), args.dataset.display().to_string().into());
        o.insert(
            "sampler".into(),
            args.sampler.spec().kind_or(SamplerKind::Khop).name().into(),
        );
        o.insert("fanouts_hop_order".into(), args.fanouts.clone().into());
        o.insert("batch_size".into(), args.batch_size.into());
        o.insert("batches".into(), rep.batches.into());
        o.insert("num_nodes".into(), rep.num_nodes.into());
        o.insert("row_bytes".into(), rep.row_bytes.into());
        o.insert("seed".into(), args.seed.into());
        if let Some(s) = &rep.similarity {
            o.insert(
                "similarity".into(),
                serde_json::to_value(s).expect("serialisable"),
            );
        }
        println!("{v}");
    }
}
