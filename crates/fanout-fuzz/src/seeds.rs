//! Sound seed inputs for every target, generated here and committed under `corpus/` by
//! `fanout-fuzz seed` (so that the committed corpus can be regenerated after a format change).

use crate::bundle::Bundle;
use crate::targets::{Target, IMPORT_NODES};
use fanout_compute::{io, CpuBackend, Model, ModelKind, PaperSetting};
use fanout_graph::{Dataset, NoProgress};
use fanout_import::npy::write_npy;
use fanout_rand::Rng;
use fanout_synth::{generate, GenOptions, Preset};
use std::fmt::Write;

/// The seed inputs of `target`, with a short name for each.
pub fn seeds(target: Target) -> Result<Vec<(String, Bundle)>, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let d = dir.path();
    let io_err = |e: std::io::Error| e.to_string();
    Ok(match target {
        Target::Dataset => {
            // Two layouts and both feature types, from the generator's tiny preset.
            let mut out = Vec::new();
            for (name, nodes, seed, f16) in [("tiny-f32", 48, 1, false), ("tiny-f16", 40, 2, true)]
            {
                let cfg = Preset::Tiny.config(Some(nodes));
                let opts = GenOptions {
                    seed,
                    feat_dtype: if f16 {
                        fanout_graph::FeatDtype::F16
                    } else {
                        fanout_graph::FeatDtype::F32
                    },
                    ..GenOptions::default()
                };
                let path = d.join(name);
                generate(&cfg, &opts, Some(&path), &NoProgress).map_err(|e| e.to_string())?;
                Dataset::open(&path).map_err(|e| e.to_string())?;
                let b = Bundle::read_dir(&path, &[fanout_graph::checks::STAMP]).map_err(io_err)?;
                out.push((name.to_string(), b));
            }
            out
        }
        Target::Npy => {
            let (edges, feat, labels) = small_graph(IMPORT_NODES, 3);
            let n = IMPORT_NODES;
            let e = edges.len() as u64;
            let src: Vec<i64> = edges.iter().map(|a| a.0 as i64).collect();
            let dst: Vec<i64> = edges.iter().map(|a| a.1 as i64).collect();
            let ei: Vec<i64> = src.iter().chain(&dst).copied().collect();
            let p = d.join("npy");
            std::fs::create_dir_all(&p).map_err(io_err)?;
            let w = |name: &str, r: fanout_graph::Result<()>| r.map_err(|e| format!("{name}: {e}"));
            w(
                "edge_index",
                write_npy(&p.join("edge_index.npy"), &[2, e], &ei),
            )?;
            w(
                "node_feat",
                write_npy(&p.join("node_feat.npy"), &[n, 3], &feat),
            )?;
            w(
                "node_label",
                write_npy(&p.join("node_label.npy"), &[n], &labels),
            )?;
            let ids = |a: u64, b: u64| (a..b).map(|v| v as i64).collect::<Vec<i64>>();
            w(
                "train_idx",
                write_npy(&p.join("train_idx.npy"), &[10], &ids(0, 10)),
            )?;
            w(
                "valid_idx",
                write_npy(&p.join("valid_idx.npy"), &[5], &ids(10, 15)),
            )?;
            w(
                "test_idx",
                write_npy(&p.join("test_idx.npy"), &[5], &ids(15, 20)),
            )?;
            let full = Bundle::read_dir(&p, &[]).map_err(io_err)?;
            // Topology only: the edge array alone.
            let edges_only = Bundle {
                files: full
                    .files
                    .iter()
                    .filter(|(n, _)| n == "edge_index.npy")
                    .cloned()
                    .collect(),
            };
            vec![("full".into(), full), ("edges-only".into(), edges_only)]
        }
        Target::Ogb => {
            let (edges, feat, labels) = small_graph(IMPORT_NODES, 3);
            let mut b = Bundle::default();
            let mut text = String::new();
            for (s, t) in &edges {
                let _ = writeln!(text, "{s},{t}");
            }
            b.files.push(("raw/edge.csv".into(), text.into_bytes()));
            b.files.push((
                "raw/num-node-list.csv".into(),
                format!("{IMPORT_NODES}\n").into_bytes(),
            ));
            let mut text = String::new();
            for row in feat.chunks(3) {
                let _ = writeln!(text, "{},{},{}", row[0], row[1], row[2]);
            }
            b.files
                .push(("raw/node-feat.csv".into(), text.into_bytes()));
            let text: String = labels.iter().map(|l| format!("{l}\n")).collect();
            b.files
                .push(("raw/node-label.csv".into(), text.into_bytes()));
            for (name, ids) in [("train", 0..10), ("valid", 10..15), ("test", 15..20)] {
                let text: String = ids.map(|v| format!("{v}\n")).collect();
                b.files
                    .push((format!("split/time/{name}.csv"), text.into_bytes()));
            }
            b.files.sort();
            vec![("small".into(), b)]
        }
        Target::Edgelist => {
            let (edges, _, _) = small_graph(IMPORT_NODES, 0);
            let mut text = String::from("# a comment\n% another\n");
            for (i, (s, t)) in edges.iter().enumerate() {
                let sep = ["\t", " ", ","][i % 3];
                let _ = writeln!(text, "{s}{sep}{t}");
            }
            let b = Bundle {
                files: vec![("edges.txt".into(), text.into_bytes())],
            };
            vec![("small".into(), b)]
        }
        Target::Report => {
            // A training run's metrics as `fanout train --metrics-out` writes them (the fields
            // the report draws and some it does not), and cache-sim rows as JSON lines.
            let mut epochs = Vec::new();
            for e in 0..3u32 {
                let f = f64::from(e);
                let val = if e == 0 {
                    "null".to_string()
                } else {
                    format!("{}", 0.5 + 0.125 * f)
                };
                epochs.push(format!(
                    "    {{\"epoch\": {e}, \"wall_s\": {}, \"sample_s\": 0.25, \"extract_s\": 0.375, \
                     \"train_s\": {}, \"allreduce_s\": 0.0625, \"compute_floor_s\": 0.5, \
                     \"performed_floor_s\": 0.375, \"memory_floor_s\": 0.125, \"loss\": {}, \
                     \"train_acc\": {}, \"val_acc\": {val}, \"extract\": {{\"rows\": 4096, \
                     \"bytes_total\": 1048576, \"bytes_from_cache\": 524288, \"bytes_reused\": \
                     262144, \"bytes_from_host\": 262144}}}}",
                    1.5 - 0.25 * f,
                    1.25 - 0.25 * f,
                    2.0 / (1.0 + f),
                    0.25 + 0.25 * f,
                ));
            }
            let run = format!(
                "{{\n  \"model\": \"sage\",\n  \"dataset\": \"embedded\",\n  \"strategy\": \
                 \"data-parallel\",\n  \"workers\": 2,\n  \"test_acc\": 0.75,\n  \
                 \"median_epoch_s\": 1.25,\n  \"median_floor_s\": 0.5,\n  \"epochs\": [\n{}\n  ]\n}}\n",
                epochs.join(",\n")
            );
            let mut rows = String::new();
            for policy in ["random", "degree", "presc1", "optimal"] {
                for (i, ratio) in [0.0, 0.125, 0.25, 0.5].into_iter().enumerate() {
                    let _ = writeln!(
                        rows,
                        "{{\"dataset\": \"cora\", \"policy\": \"{policy}\", \"ratio\": {ratio}, \
                         \"hit_rate\": {}, \"batch_size\": 1024, \"sampler\": \"khop\", \
                         \"fanouts_hop_order\": \"25,10\"}}",
                        0.25 * i as f64
                    );
                }
            }
            let one = |text: String| Bundle {
                files: vec![("metrics.json".into(), text.into_bytes())],
            };
            vec![("train".into(), one(run)), ("cache-sim".into(), one(rows))]
        }
        Target::Checkpoint => {
            let mut out = Vec::new();
            for kind in ModelKind::ALL {
                let mut cfg = PaperSetting::for_kind(kind, 3, 4).model;
                cfg.hidden = 8;
                cfg.num_layers = 2;
                let model = Model::new(CpuBackend, cfg).map_err(|e| e.to_string())?;
                let bytes = io::to_bytes(&model).map_err(|e| e.to_string())?;
                let b = Bundle {
                    files: vec![("model.safetensors".into(), bytes)],
                };
                out.push((format!("{kind:?}").to_lowercase(), b));
            }
            out
        }
    })
}

/// A random graph on `n` vertices (about 4 arcs each), `dim`-wide features and 4 classes.
fn small_graph(n: u64, dim: usize) -> (Vec<(u64, u64)>, Vec<f32>, Vec<i64>) {
    let mut r = Rng::new(n);
    let edges = (0..4 * n).map(|_| (r.below(n), r.below(n))).collect();
    let feat = (0..n as usize * dim)
        .map(|_| (r.below(1000) as f32) / 250.0 - 2.0)
        .collect();
    let labels = (0..n).map(|v| (v % 4) as i64).collect();
    (edges, feat, labels)
}
