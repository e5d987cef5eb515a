//! `fanout dataset partition`: PaGraph's training-set partition for data-parallel workers,
//! written beside the dataset, and the partition lines of `fanout dataset info`.

use crate::progress::Bars;
use clap::{Args, ValueEnum};
use fanout_graph::{
    list_partitions, partition_training_set, Dataset, Partition, PartitionMethod, PartitionStats,
};
use std::path::PathBuf;

/// `fanout dataset partition` flags.
#[derive(Args)]
pub struct PartitionArgs {
    /// Dataset directory (the partition is written under DIR/partitions/NAME/).
    dir: PathBuf,
    /// pagraph: PaGraph's computation-aware streaming partition (balances training vertices,
    /// keeps shared neighbourhoods together); random: round-robin, the baseline.
    #[arg(long, value_enum, default_value = "pagraph")]
    method: MethodArg,
    /// Number of parts (one per data-parallel worker).
    #[arg(long)]
    parts: usize,
    /// In-neighbourhood depth each part holds: its workers can sample this many hops (a model
    /// of at most this many layers) without leaving it.
    #[arg(long, default_value_t = 2)]
    hops: usize,
    /// Seed of the order in which training vertices are streamed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Partition name (default: METHOD-PARTS, e.g. pagraph-4).
    #[arg(long)]
    name: Option<String>,
    /// Replace an existing partition of that name.
    #[arg(long)]
    overwrite: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

/// `--method`.
#[derive(Clone, Copy, ValueEnum)]
pub enum MethodArg {
    /// PaGraph Eq. 1 (with the +1 terms of its authors' code).
    Pagraph,
    /// Shuffled round-robin.
    Random,
}

/// Runs `fanout dataset partition`.
pub fn run(a: &PartitionArgs, quiet: bool) -> Result<(), String> {
    if a.parts == 0 {
        return Err("--parts must be at least 1".into());
    }
    let method = match a.method {
        MethodArg::Pagraph => PartitionMethod::PaGraph,
        MethodArg::Random => PartitionMethod::Random,
    };
    let ds = Dataset::open(&a.dir).map_err(|e| e.to_string())?;
    let name = a
        .name
        .clone()
        .unwrap_or_else(|| Partition::default_name(method, a.parts));
    let dest = ds
        .dir
        .join(fanout_graph::partition::PARTITIONS_DIR)
        .join(&name);
    if dest.exists() && !a.overwrite {
        return Err(format!(
            "{} exists; add --overwrite to replace it",
            dest.display()
        ));
    }
    let t = std::time::Instant::now();
    let bars = Bars::new(quiet || a.json);
    let p = partition_training_set(&ds, method, a.parts, a.hops, a.seed, &bars)
        .map_err(|e| e.to_string())?;
    let dir = p
        .write(&ds, &name, a.overwrite)
        .map_err(|e| e.to_string())?;
    let secs = t.elapsed().as_secs_f64();
    let stats = p.stats(&ds);
    if a.json {
        let v = serde_json::json!({
            "name": name, "path": dir, "seconds": secs, "stats": stats,
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap());
    } else {
        println!("wrote {} in {secs:.2} s", dir.display());
        print!("{}", describe(&name, &stats));
    }
    Ok(())
}

/// A partition's summary: one line, then one per part.
pub fn describe(name: &str, s: &PartitionStats) -> String {
    let mut out = format!(
        "partition {name}: {} parts by {}, {} hops; training balance {:.3} (max/mean), \
         replicated vertices {:.1}%, a part holds {:.1}% of the vertices on average\n",
        s.parts, s.method, s.hops, s.train_balance, s.replicated_pct, s.mean_part_pct
    );
    for i in 0..s.parts {
        out += &format!(
            "  part {i}: {} training vertices, {} vertices, {} arcs inside\n",
            s.train[i], s.vertices[i], s.edges[i]
        );
    }
    out
}

/// The partitions stored beside `ds`, each opened and described (`dataset info`); a damaged
/// one is reported by its error instead of figures.
pub fn partitions_of(ds: &Dataset) -> Vec<(String, Result<PartitionStats, String>)> {
    list_partitions(ds)
        .unwrap_or_default()
        .into_iter()
        .map(|name| {
            let s = Partition::open(ds, &name)
                .map(|p| p.stats(ds))
                .map_err(|e| e.to_string());
            (name, s)
        })
        .collect()
}
