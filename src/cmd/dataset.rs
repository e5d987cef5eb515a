//! `fanout dataset import | gen | weights | info | verify`.

use crate::progress::Bars;
use clap::{Args, Subcommand, ValueEnum};
use fanout_graph::{
    verify, BuildOptions, Cancel, Dataset, DatasetInfo, FeatDtype, Layout, VerifyReport,
};
use fanout_import::{import_with_cancel, Format, ImportOptions, RandomFeatures};
use fanout_sample::alias::write_weights;
use fanout_sample::{make_weights, WeightScheme};
use fanout_synth::{generate_with_cancel, GenOptions, Preset};
use std::path::PathBuf;

/// Dataset tools.
#[derive(Subcommand)]
pub enum DatasetCommand {
    /// Import a graph from NumPy arrays, OGB raw files or an edge list into a dataset directory.
    ///
    /// Examples:
    ///   fanout dataset import --format npy ../shared/datasets/cora data/cora
    ///   fanout dataset import --format npy --random-features 128 --classes 16 --train-frac 0.01 ../shared/datasets/cnr2000 data/cnr2000
    ///   fanout dataset import --format edgelist --symmetrize --dedup --drop-self-loops soc.txt.gz data/soc
    #[command(verbatim_doc_comment)]
    Import(ImportArgs),
    /// Generate a synthetic dataset shaped like one of the papers' graphs, with learnable labels.
    ///
    /// Example: fanout dataset gen --preset products --nodes 2449029 data/products
    #[command(verbatim_doc_comment)]
    Gen(GenArgs),
    /// Write `weight.bin` (one f32 weight per stored arc) for `--sampler weighted`.
    ///
    /// Schemes: random = uniform in (0, 1] keyed by --seed; newer = GNNLab's weighted setting
    /// (neighbours weighted by registration order, the vertex id: the arc listing u weighs
    /// (u + 1) / N). Refuses to replace an existing weight.bin without --force; the alias tables
    /// are rebuilt on the next weighted run.
    ///
    /// Example: fanout dataset weights data/twitter --scheme newer
    #[command(verbatim_doc_comment)]
    Weights(WeightsArgs),
    /// Split the training set into parts for data-parallel workers (PaGraph), written under
    /// DIR/partitions/NAME/ (`fanout train --workers K --partition NAME`); or, with --method
    /// metis, partition the graph with METIS and write it as a new dataset OUT whose parts are
    /// contiguous id ranges (GSplit).
    ///
    /// Examples:
    ///   fanout dataset partition --method pagraph --parts 4 data/products
    ///   fanout dataset partition --method metis --parts 4 data/products data/products-metis4
    #[command(verbatim_doc_comment)]
    Partition(crate::cmd::partition::PartitionArgs),
    /// Print sizes, degree statistics, split sizes, bytes on disk and the stored partitions.
    Info(InfoArgs),
    /// Check every entry (checksums, offsets, ids, labels, splits, features); exit code 0 when
    /// sound, 1 with a message naming the file and the first bad entry otherwise.
    Verify(InfoArgs),
}

#[derive(Clone, Copy, ValueEnum)]
pub enum FormatArg {
    /// Directory with `edge_index.npy` `[2,E]` and optional node_feat/node_label/*_idx .npy files.
    Npy,
    /// OGB raw node-property layout: raw/edge.csv[.gz], raw/num-node-list.csv[.gz], `split/<scheme>/`.
    Ogb,
    /// Text file of `src dst` lines (# or % comments; optionally gzip-compressed).
    Edgelist,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum LayoutArg {
    /// Rows list in-neighbours (what pull-style neighbour sampling walks).
    Csc,
    /// Rows list out-neighbours.
    Csr,
}

impl From<LayoutArg> for Layout {
    fn from(l: LayoutArg) -> Layout {
        match l {
            LayoutArg::Csc => Layout::Csc,
            LayoutArg::Csr => Layout::Csr,
        }
    }
}

/// Options shared by commands that write a dataset.
#[derive(Args)]
pub struct WriteArgs {
    /// Topology layout to store.
    #[arg(long, value_enum, default_value = "csc")]
    layout: LayoutArg,
    /// Store features as f16 (half the bytes; FEAT_DTYPE f16).
    #[arg(long)]
    f16: bool,
    /// Replace OUT if it is an existing dataset (it is replaced only after the new one is complete).
    #[arg(long)]
    overwrite: bool,
    /// Verify the written dataset entry by entry before reporting success.
    #[arg(long)]
    verify: bool,
    /// Print one JSON object (summary, info and verification) on stdout instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct ImportArgs {
    /// Input format.
    #[arg(long, value_enum)]
    format: FormatArg,
    /// Source: a directory (npy, ogb) or a file (edgelist).
    src: PathBuf,
    /// Output dataset directory (must not exist unless --overwrite).
    out: PathBuf,
    /// Add the reverse of every arc.
    #[arg(long)]
    symmetrize: bool,
    /// Drop arcs from a vertex to itself.
    #[arg(long)]
    drop_self_loops: bool,
    /// Keep one copy of repeated arcs.
    #[arg(long)]
    dedup: bool,
    /// Number of vertices (default: from the features/labels, else largest id + 1).
    #[arg(long)]
    num_nodes: Option<u64>,
    /// For topology-only graphs: generate DIM-dimensional features that are learnable from
    /// random labels (class centroid + noise), plus labels and train/valid/test splits.
    #[arg(long, value_name = "DIM")]
    random_features: Option<usize>,
    /// Number of classes of the random labels.
    #[arg(long, requires = "random_features", default_value_t = 16)]
    classes: u64,
    /// Fraction of vertices in the training set (with --random-features).
    #[arg(long, requires = "random_features", default_value_t = 0.1)]
    train_frac: f64,
    /// Fraction of vertices in the validation set (with --random-features).
    #[arg(long, requires = "random_features", default_value_t = 0.05)]
    valid_frac: f64,
    /// Fraction of vertices in the test set (with --random-features).
    #[arg(long, requires = "random_features", default_value_t = 0.05)]
    test_frac: f64,
    /// Class-centroid scale relative to unit noise (with --random-features).
    #[arg(long, requires = "random_features", default_value_t = 0.5)]
    signal: f32,
    /// Seed of the random features, labels and splits.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// OGB split scheme (folder under split/); default: the only one present.
    #[arg(long)]
    split_scheme: Option<String>,
    #[command(flatten)]
    write: WriteArgs,
}

#[derive(Args)]
pub struct GenArgs {
    /// Graph shape: tiny (tests), products, papers, twitter, uk.
    #[arg(long, value_parser = parse_preset)]
    preset: Preset,
    /// Number of vertices (default: the preset's default scale).
    #[arg(long)]
    nodes: Option<u64>,
    /// Feature width (default: the preset's; 0 for a topology-only dataset).
    #[arg(long)]
    feat_dim: Option<u64>,
    /// Seed: the same seed always gives the same dataset.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output dataset directory (must not exist unless --overwrite).
    out: PathBuf,
    #[command(flatten)]
    write: WriteArgs,
}

fn parse_preset(s: &str) -> Result<Preset, String> {
    s.parse::<Preset>().map_err(|e| e.to_string())
}

#[derive(Clone, Copy, ValueEnum)]
pub enum SchemeArg {
    /// Uniform in (0, 1], independent per arc (keyed by --seed).
    Random,
    /// (u + 1) / N for the arc listing neighbour u: newer (larger id) neighbours are likelier.
    Newer,
}

#[derive(Args)]
pub struct WeightsArgs {
    /// Dataset directory.
    dir: PathBuf,
    /// How the weights are made.
    #[arg(long, value_enum, default_value = "random")]
    scheme: SchemeArg,
    /// Seed of the random scheme.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Replace an existing weight.bin.
    #[arg(long)]
    force: bool,
    /// Print the summary as JSON (path, weights, scheme, seed, seconds).
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct InfoArgs {
    /// Dataset directory.
    dir: PathBuf,
    /// Print JSON on stdout instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs a dataset subcommand; the error string is printed after "error: ".
pub fn run(cmd: &DatasetCommand, quiet: bool, cancel: Option<&Cancel>) -> Result<(), String> {
    let bars = Bars::new(quiet);
    let never = Cancel::new();
    let cancel = cancel.unwrap_or(&never);
    fn written(out: &std::path::Path) -> impl Fn(fanout_graph::Error) -> String + '_ {
        move |e| match e {
            fanout_graph::Error::Interrupted => format!(
                "interrupted: nothing was written to {} (the partial output was removed)",
                out.display()
            ),
            e => e.to_string(),
        }
    }
    match cmd {
        DatasetCommand::Import(a) => {
            let opts = ImportOptions {
                build: BuildOptions {
                    layout: a.write.layout.into(),
                    symmetrize: a.symmetrize,
                    drop_self_loops: a.drop_self_loops,
                    dedup: a.dedup,
                    num_nodes: a.num_nodes,
                },
                feat_dtype: dtype(a.write.f16),
                random: a.random_features.map(|dim| RandomFeatures {
                    dim,
                    classes: a.classes,
                    train_frac: a.train_frac,
                    valid_frac: a.valid_frac,
                    test_frac: a.test_frac,
                    seed: a.seed,
                    signal: a.signal,
                }),
                overwrite: a.write.overwrite,
                split_scheme: a.split_scheme.clone(),
            };
            let format = match a.format {
                FormatArg::Npy => Format::Npy,
                FormatArg::Ogb => Format::Ogb,
                FormatArg::Edgelist => Format::EdgeList,
            };
            let s = import_with_cancel(format, &a.src, &a.out, &opts, &bars, cancel)
                .map_err(written(&a.out))?;
            let headline = format!(
                "imported {} ({}) into {} in {:.2} s: {} nodes, {} arcs ({} read, {} self-loops dropped, {} reverse arcs added, {} duplicates dropped), {:.0} input arcs/s",
                s.source,
                s.format,
                s.out,
                s.seconds,
                s.num_nodes,
                s.num_arcs,
                s.build.input_arcs,
                s.build.self_loops_dropped,
                s.build.reverse_arcs_added,
                s.build.duplicates_dropped,
                s.build.input_arcs as f64 / s.seconds.max(1e-9)
            );
            finish_write(
                &a.out,
                &a.write,
                &bars,
                headline,
                serde_json::to_value(&s).unwrap(),
            )
        }
        DatasetCommand::Gen(a) => {
            let mut cfg = a.preset.config(a.nodes);
            if let Some(d) = a.feat_dim {
                cfg.feat_dim = d;
            }
            let opts = GenOptions {
                seed: a.seed,
                feat_dtype: dtype(a.write.f16),
                layout: a.write.layout.into(),
                overwrite: a.write.overwrite,
            };
            let (_, s) = generate_with_cancel(&cfg, &opts, Some(&a.out), &bars, cancel)
                .map_err(written(&a.out))?;
            let headline = format!(
                "generated {} into {} in {:.2} s: {} nodes, {} arcs ({:.2} M arcs/s), {}-dim features, {} classes, split {}/{}/{}, homophily {:.3}",
                s.preset,
                a.out.display(),
                s.seconds,
                s.nodes,
                s.arcs,
                s.arcs_per_s / 1e6,
                s.feat_dim,
                s.classes,
                s.train,
                s.valid,
                s.test,
                s.homophily
            );
            let mut summary = serde_json::to_value(&s).unwrap();
            summary["config"] = serde_json::to_value(&cfg).unwrap();
            finish_write(&a.out, &a.write, &bars, headline, summary)
        }
        DatasetCommand::Weights(a) => {
            let ds = Dataset::open(&a.dir).map_err(|e| e.to_string())?;
            let path = a.dir.join(fanout_sample::alias::files::WEIGHT);
            if path.exists() && !a.force {
                return Err(format!(
                    "{} exists; pass --force to replace it",
                    path.display()
                ));
            }
            let (scheme, name) = match a.scheme {
                SchemeArg::Random => (WeightScheme::Random, "random"),
                SchemeArg::Newer => (WeightScheme::Newer, "newer"),
            };
            let t = std::time::Instant::now();
            let w = make_weights(&ds, scheme, a.seed);
            write_weights(&a.dir, &w).map_err(|e| e.to_string())?;
            // Tables of the old weights would be rebuilt anyway (their key is the old
            // weights' checksum); removed now, they take no disk until the next build.
            for f in [
                fanout_sample::alias::files::ALIAS_KEY,
                fanout_sample::alias::files::ALIAS_PROB,
                fanout_sample::alias::files::ALIAS_IDX,
            ] {
                let p = a.dir.join(f);
                if p.exists() {
                    std::fs::remove_file(&p).map_err(|e| {
                        format!("{}: cannot remove stale alias table: {e}", p.display())
                    })?;
                }
            }
            let secs = t.elapsed().as_secs_f64();
            if a.json {
                let v = serde_json::json!({
                    "path": path.display().to_string(),
                    "weights": w.len(),
                    "scheme": name,
                    "seed": a.seed,
                    "seconds": secs,
                });
                println!("{v}");
            } else {
                println!(
                    "wrote {} ({} weights, scheme {name}) in {secs:.2} s",
                    path.display(),
                    w.len()
                );
            }
            Ok(())
        }
        DatasetCommand::Partition(a) => crate::cmd::partition::run(a, quiet, cancel),
        DatasetCommand::Info(a) => {
            let ds = Dataset::open(&a.dir).map_err(|e| e.to_string())?;
            let info = DatasetInfo::of(&ds);
            if a.json {
                println!("{}", serde_json::to_string_pretty(&info).unwrap());
            } else {
                print!("{info}");
                for p in &info.partitions {
                    match (&p.stats, &p.error) {
                        (Some(s), _) => print!("{}", crate::cmd::partition::describe(&p.name, s)),
                        (None, e) => println!(
                            "partition {}: damaged: {}",
                            p.name,
                            e.as_deref().unwrap_or("")
                        ),
                    }
                }
            }
            Ok(())
        }
        DatasetCommand::Verify(a) => {
            let t = std::time::Instant::now();
            let report = verify(&a.dir, &bars).map_err(|e| format!("verify failed: {e}"))?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&report).unwrap());
            } else {
                print_verify(&a.dir, &report, t.elapsed().as_secs_f64());
            }
            Ok(())
        }
    }
}

fn dtype(f16: bool) -> FeatDtype {
    if f16 {
        FeatDtype::F16
    } else {
        FeatDtype::F32
    }
}

fn print_verify(dir: &std::path::Path, r: &VerifyReport, secs: f64) {
    println!(
        "verified {} in {secs:.2} s: sound ({} checksums matched{})",
        dir.display(),
        r.checksums_verified.len(),
        if r.checksums_missing.is_empty() {
            String::new()
        } else {
            format!(
                ", no stored checksum for {}",
                r.checksums_missing.join(", ")
            )
        }
    );
    for w in &r.warnings {
        println!("  note: {w}");
    }
}

/// Common tail of `import` and `gen`: optional verification, then the summary (text or JSON).
fn finish_write(
    out: &std::path::Path,
    w: &WriteArgs,
    bars: &Bars,
    headline: String,
    summary: serde_json::Value,
) -> Result<(), String> {
    let t = std::time::Instant::now();
    let report = if w.verify {
        Some(
            verify(out, bars)
                .map_err(|e| format!("the written dataset failed verification: {e}"))?,
        )
    } else {
        None
    };
    let verify_s = t.elapsed().as_secs_f64();
    let ds = Dataset::open(out).map_err(|e| e.to_string())?;
    let info = DatasetInfo::of(&ds);
    if w.json {
        let v = serde_json::json!({ "summary": summary, "info": info, "verify": report });
        println!("{}", serde_json::to_string_pretty(&v).unwrap());
    } else {
        println!("{headline}");
        if let Some(r) = &report {
            print_verify(out, r, verify_s);
        }
        print!("{info}");
    }
    Ok(())
}
