//! `fanout dataset partition`: PaGraph's training-set partition for data-parallel workers,
//! written beside the dataset, and the partition lines of `fanout dataset info`; with
//! `--method metis`, GSplit's graph partition written as a new, relabelled dataset.

use crate::progress::Bars;
use clap::{Args, ValueEnum};
use fanout_graph::{
    partition_training_set, Cancel, Dataset, Partition, PartitionMethod, PartitionStats,
};
use std::path::PathBuf;

/// `fanout dataset partition` flags.
#[derive(Args)]
pub struct PartitionArgs {
    /// Dataset directory (pagraph/random: the partition is written under DIR/partitions/NAME/).
    dir: PathBuf,
    /// With --method metis: the relabelled dataset to write (each part a contiguous id range,
    /// plus old_to_new.bin and part_offsets.bin).
    out: Option<PathBuf>,
    /// pagraph: PaGraph's computation-aware streaming partition of the training set (balances
    /// training vertices, keeps shared neighbourhoods together); random: round-robin, the
    /// baseline; metis: a METIS partition of the whole graph into contiguous id ranges (GSplit).
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
    /// Replace an existing partition of that name (metis: an existing dataset at OUT).
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
    /// METIS k-way on the symmetrised graph, written as a relabelled dataset.
    Metis,
}

/// Runs `fanout dataset partition`.
pub fn run(a: &PartitionArgs, quiet: bool, cancel: &Cancel) -> Result<(), String> {
    if a.parts == 0 {
        return Err("--parts must be at least 1".into());
    }
    let method = match (a.method, &a.out) {
        (MethodArg::Metis, Some(_)) if a.name.is_some() => {
            return Err(
                "--name names a partition under DIR/partitions/; --method metis writes the dataset OUT instead, so leave --name out".into(),
            )
        }
        (MethodArg::Metis, Some(out)) => return run_metis(a, out, quiet, cancel),
        (MethodArg::Metis, None) => {
            return Err(
                "--method metis writes a new dataset: give its directory after DIR (fanout dataset partition --method metis --parts G DIR OUT)".into(),
            )
        }
        (_, Some(out)) => {
            return Err(format!(
                "{}: only --method metis writes a new dataset; pagraph and random partitions are stored under DIR/partitions/",
                out.display()
            ))
        }
        (MethodArg::Pagraph, None) => PartitionMethod::PaGraph,
        (MethodArg::Random, None) => PartitionMethod::Random,
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
    let p = partition_training_set(&ds, method, a.parts, a.hops, a.seed, &bars, cancel).map_err(
        |e| match e {
            fanout_graph::Error::Interrupted => {
                format!("interrupted: nothing was written to {}", dest.display())
            }
            e => e.to_string(),
        },
    )?;
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

/// `--method metis`: partition, relabel, write `out`, print the summary.
fn run_metis(
    a: &PartitionArgs,
    out: &std::path::Path,
    quiet: bool,
    cancel: &Cancel,
) -> Result<(), String> {
    let ds = Dataset::open(&a.dir).map_err(|e| e.to_string())?;
    let t = std::time::Instant::now();
    let bars = Bars::new(quiet || a.json);
    let s = fanout_metis::partition_dataset(&ds, a.parts, a.seed, out, a.overwrite, &bars, cancel)
        .map_err(|e| e.to_string())?;
    let secs = t.elapsed().as_secs_f64();
    if a.json {
        let v = serde_json::json!({ "path": out, "seconds": secs, "metis": s });
        println!("{}", serde_json::to_string_pretty(&v).unwrap());
        return Ok(());
    }
    println!(
        "wrote {} in {secs:.2} s: {} METIS parts as contiguous id ranges (part_offsets.bin, old_to_new.bin); {:.1}% of arcs cross parts, largest part {:.3}x the mean",
        out.display(),
        s.parts,
        100.0 * s.cut_fraction,
        s.imbalance
    );
    for (i, (v, tr)) in s.vertices.iter().zip(&s.train).enumerate() {
        println!("  part {i}: {v} vertices, {tr} training vertices");
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
