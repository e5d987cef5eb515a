//! Whole-generator tests: every preset at a small scale, checked for the properties the presets
//! promise (degree shape, density, homophily, locality, splits, learnability, determinism).

use crate::{generate, GenOptions, GenSummary, Preset, PresetConfig};
use fanout_graph::{verify, Dataset, FeatDtype, Layout, NoProgress, Progress};
use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

/// Vertices per preset in these tests (tiny keeps its default).
const NODES: u64 = 40_000;

struct Sample {
    cfg: PresetConfig,
    ds: Dataset,
    summary: GenSummary,
    /// `verify` of the files as written, run before they were deleted.
    verified: Result<(), String>,
}

/// Each preset generated once (seed 1) and shared by the tests. The files are verified and then
/// deleted at once: statics are never dropped, so a self-deleting directory held here would
/// stay behind in the temporary folder after every test run; the opened dataset's memory maps
/// keep the data readable after the unlink.
fn sample(p: Preset) -> &'static Sample {
    static CACHE: [OnceLock<Sample>; 5] = [const { OnceLock::new() }; 5];
    let i = Preset::ALL.iter().position(|&q| q == p).unwrap();
    CACHE[i].get_or_init(|| {
        let nodes = (p != Preset::Tiny).then_some(NODES);
        let cfg = p.config(nodes);
        let opts = GenOptions {
            seed: 1,
            ..GenOptions::default()
        };
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join(p.to_string());
        let (ds, summary) = generate(&cfg, &opts, Some(&out), &NoProgress).unwrap();
        let verified = verify(&out, &NoProgress)
            .map(|_| ())
            .map_err(|e| e.to_string());
        drop(tmp);
        Sample {
            cfg,
            ds,
            summary,
            verified,
        }
    })
}

/// Sorted row lengths (= degrees: the graph is symmetric).
fn sorted_degrees(ds: &Dataset) -> Vec<u64> {
    let mut d = ds.topology.row_lengths();
    d.sort_unstable();
    d
}

/// Gini coefficient of a sorted non-negative sequence.
fn gini(sorted: &[u64]) -> f64 {
    let n = sorted.len() as f64;
    let total: u64 = sorted.iter().sum();
    let weighted: f64 = sorted
        .iter()
        .enumerate()
        .map(|(i, &x)| (2.0 * i as f64 - n + 1.0) * x as f64)
        .sum();
    weighted / (n * total as f64)
}

#[test]
fn every_preset_is_simple_symmetric_verified_and_on_target() {
    for p in Preset::ALL {
        let Sample {
            cfg,
            ds,
            summary,
            verified,
        } = sample(p);
        let n = ds.num_nodes();
        verified.as_ref().unwrap_or_else(|e| panic!("{p}: {e}"));
        assert_eq!(ds.topology.in_degrees(), ds.topology.out_degrees(), "{p}");
        for v in 0..n {
            let row: Vec<u64> = ds.topology.row(v).iter().collect();
            assert!(
                row.windows(2).all(|w| w[0] < w[1]),
                "{p}: repeats in row {v}"
            );
            assert!(!row.contains(&v), "{p}: self-loop at {v}");
        }
        let avg = ds.num_arcs() as f64 / n as f64;
        assert!(
            (avg / cfg.avg_degree - 1.0).abs() < 0.05,
            "{p}: average degree {avg}, target {}",
            cfg.avg_degree
        );
        assert!(
            (summary.homophily - cfg.homophily).abs() < 0.02,
            "{p}: homophily {}, target {}",
            summary.homophily,
            cfg.homophily
        );
        let m = &ds.meta;
        assert_eq!(
            (
                summary.nodes,
                summary.arcs,
                summary.feat_dim,
                summary.classes
            ),
            (m.num_node, m.num_edge, m.feat_dim, m.num_class)
        );
        let labels = ds.labels.as_ref().unwrap();
        assert!(labels.iter().all(|&l| (0..cfg.classes as i64).contains(&l)));
        assert_eq!(ds.features.as_ref().unwrap().dim as u64, cfg.feat_dim);
    }
}

#[test]
fn degree_skew_follows_the_datasets() {
    let stats = |p| {
        let d = sorted_degrees(&sample(p).ds);
        let n = d.len();
        let mean = d.iter().sum::<u64>() as f64 / n as f64;
        let max_over_mean = d[n - 1] as f64 / mean;
        let p99_over_median = d[n * 99 / 100] as f64 / d[n / 2].max(1) as f64;
        (max_over_mean, p99_over_median, gini(&d))
    };
    let (products, twitter, papers) = (
        stats(Preset::Products),
        stats(Preset::Twitter),
        stats(Preset::Papers),
    );
    for (name, s) in [("products", products), ("twitter", twitter)] {
        assert!(s.0 > 8.0 && s.1 > 5.0, "{name} not heavy-tailed: {s:?}");
    }
    assert!(
        twitter.2 > products.2 + 0.05 && products.2 > papers.2 + 0.05,
        "Gini twitter {} > products {} > papers {} expected",
        twitter.2,
        products.2,
        papers.2
    );
    assert!(twitter.0 > products.0 && products.0 > papers.0);
}

#[test]
fn splits_have_exact_sizes_and_are_disjoint() {
    for p in Preset::ALL {
        let Sample {
            cfg, ds, summary, ..
        } = sample(p);
        let n = ds.num_nodes() as f64;
        let f = cfg.split;
        let sets = [&ds.train, &ds.valid, &ds.test];
        for (set, frac) in sets.iter().zip([f.train, f.valid, f.test]) {
            assert_eq!(set.len(), (frac * n).round() as usize, "{p}");
            assert!(set.windows(2).all(|w| w[0] < w[1]), "{p}: unsorted split");
        }
        let labels = ds.labels.as_ref().unwrap();
        let region = |v: &u32| {
            cfg.labelled_classes == 0 || (labels[*v as usize] as u64) < cfg.labelled_classes
        };
        assert!(
            sets.iter().all(|s| s.iter().all(region)),
            "{p}: a split vertex outside the labelled classes 0..{}",
            cfg.labelled_classes
        );
        let mut all: Vec<u32> = sets.iter().flat_map(|s| s.iter().copied()).collect();
        let len = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), len, "{p}: splits overlap");
        assert_eq!(
            (summary.train, summary.valid, summary.test),
            (
                ds.train.len() as u64,
                ds.valid.len() as u64,
                ds.test.len() as u64
            )
        );
    }
}

#[test]
fn uk_keeps_edges_near_in_id_space() {
    let near = |p| {
        let ds = &sample(p).ds;
        // A few mean host sizes; 5% of the id range at this scale.
        let window = 4 * Preset::Uk.config(None).host_size;
        let close: u64 = (0..ds.num_nodes())
            .map(|v| {
                let row = ds.topology.row(v);
                row.iter().filter(|u| u.abs_diff(v) <= window).count() as u64
            })
            .sum();
        close as f64 / ds.num_arcs() as f64
    };
    let (uk, products) = (near(Preset::Uk), near(Preset::Products));
    assert!(
        uk > 0.6 && uk > 10.0 * products,
        "arcs within 1024 ids: uk {uk}, products {products}"
    );
}

/// Accuracy of the nearest class mean (means estimated on all vertices) on rows of `x`.
fn nearest_mean_accuracy(x: &[f32], dim: usize, labels: &[i64], classes: usize) -> f64 {
    let mut mean = vec![0f64; classes * dim];
    let mut count = vec![0f64; classes];
    for (row, &l) in x.chunks(dim).zip(labels) {
        count[l as usize] += 1.0;
        for (m, &v) in mean[l as usize * dim..].iter_mut().zip(row) {
            *m += v as f64;
        }
    }
    for (c, m) in mean.chunks_mut(dim).enumerate() {
        m.iter_mut().for_each(|m| *m /= count[c].max(1.0));
    }
    let correct = x
        .chunks(dim)
        .zip(labels)
        .filter(|(row, &l)| {
            let dist = |c: usize| -> f64 {
                let m = &mean[c * dim..(c + 1) * dim];
                m.iter()
                    .zip(*row)
                    .map(|(a, &b)| (a - b as f64).powi(2))
                    .sum()
            };
            let best = (0..classes).min_by(|&a, &b| dist(a).total_cmp(&dist(b)));
            best == Some(l as usize)
        })
        .count();
    correct as f64 / labels.len() as f64
}

#[test]
fn labels_are_learnable_from_neighbourhoods() {
    for p in [Preset::Tiny, Preset::Products] {
        let ds = &sample(p).ds;
        let n = ds.num_nodes() as usize;
        let f = ds.features.as_ref().unwrap();
        let dim = f.dim;
        let mut own = vec![0f32; n * dim];
        for (v, row) in own.chunks_mut(dim).enumerate() {
            f.copy_row(v, row);
        }
        // One round of mean aggregation over the vertex and its neighbours (what a GNN layer
        // does).
        let mut agg = own.clone();
        for (v, out) in agg.chunks_mut(dim).enumerate() {
            let row = ds.topology.row(v as u64);
            for u in row.iter() {
                let x = &own[u as usize * dim..(u as usize + 1) * dim];
                out.iter_mut().zip(x).for_each(|(o, &x)| *o += x);
            }
            out.iter_mut().for_each(|o| *o /= (row.len() + 1) as f32);
        }
        let labels = &ds.labels.as_ref().unwrap()[..];
        let classes = ds.meta.num_class as usize;
        let chance = 1.0 / classes as f64;
        let own_acc = nearest_mean_accuracy(&own, dim, labels, classes);
        let agg_acc = nearest_mean_accuracy(&agg, dim, labels, classes);
        assert!(
            own_acc > 1.5 * chance && agg_acc > own_acc + 0.2,
            "{p}: chance {chance:.3}, own features {own_acc:.3}, neighbourhood mean {agg_acc:.3}"
        );
    }
}

/// The checksums meta.txt records, per file.
fn checksums(ds: &Dataset) -> BTreeMap<String, String> {
    ds.meta.checksums.clone()
}

#[test]
fn same_seed_same_files_whatever_the_thread_count() {
    // Several edge chunks, hosts and features, so that parallel work is really split.
    for preset in [Preset::Tiny, Preset::Uk] {
        let mut cfg = preset.config(Some(30_000));
        cfg.feat_dim = 8;
        let run = |threads: usize, seed: u64| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let opts = GenOptions {
                seed,
                ..GenOptions::default()
            };
            pool.install(|| generate(&cfg, &opts, None, &NoProgress).unwrap().0)
        };
        let one = checksums(&run(1, 7));
        let two = checksums(&run(2, 7));
        assert_eq!(one.len(), 7, "{one:?}");
        assert_eq!(one, two, "{preset}: thread count changed the files");
        let other = checksums(&run(2, 8));
        for (file, sum) in &one {
            assert_ne!(other[file], *sum, "{preset}: seed 8 gave the same {file}");
        }
    }
}

#[test]
fn writes_a_directory_and_respects_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tiny");
    let cfg = Preset::Tiny.config(Some(500));
    let mut opts = GenOptions::default();
    let (ds, _) = generate(&cfg, &opts, Some(&out), &NoProgress).unwrap();
    assert_eq!(ds.dir, out);
    let e = generate(&cfg, &opts, Some(&out), &NoProgress).unwrap_err();
    assert!(e.to_string().contains("--overwrite"), "{e}");
    opts.overwrite = true;
    opts.seed = 3;
    opts.feat_dtype = FeatDtype::F16;
    opts.layout = Layout::Csr;
    let (ds2, _) = generate(&cfg, &opts, Some(&out), &NoProgress).unwrap();
    assert_ne!(ds2.meta.checksums, ds.meta.checksums);
    assert_eq!(
        (ds2.meta.layout, ds2.meta.feat_dtype),
        (Layout::Csr, FeatDtype::F16)
    );
    verify(&out, &NoProgress).unwrap();
    let mut bad = cfg.clone();
    bad.homophily = 1.5;
    let e = generate(&bad, &opts, None, &NoProgress).unwrap_err();
    assert!(e.to_string().contains("homophily = 1.5"), "{e}");
}

/// Records each phase's total and the sum of its advances.
#[derive(Default)]
struct Recorder(Mutex<Vec<(String, u64, u64)>>);

impl Progress for Recorder {
    fn phase(&self, name: &str, total: u64, _: &'static str) {
        self.0.lock().unwrap().push((name.to_string(), total, 0));
    }
    fn advance(&self, n: u64) {
        self.0.lock().unwrap().last_mut().unwrap().2 += n;
    }
}

#[test]
fn progress_phases_have_totals_that_their_advances_reach() {
    let rec = Recorder::default();
    let cfg = Preset::Tiny.config(None);
    generate(&cfg, &GenOptions::default(), None, &rec).unwrap();
    let phases = rec.0.into_inner().unwrap();
    let names: Vec<&str> = phases.iter().map(|p| p.0.as_str()).collect();
    for want in ["pass 1/2", "pass 2/2", "features", "checksum", "homophily"] {
        assert!(names.iter().any(|n| n.contains(want)), "{names:?}");
    }
    for (name, total, done) in &phases {
        if *total > 0 {
            assert_eq!(total, done, "phase {name}");
        }
    }
}

#[test]
fn papers_splits_sit_in_few_communities_and_widen_on_small_graphs() {
    // At 600 vertices, 3 of 172 classes hold ~10 vertices, fewer than the 8 + 1 + 1 the splits
    // need for some seeds: the region widens class by class instead of failing.
    for seed in 0..6 {
        let cfg = Preset::Papers.config(Some(600));
        let opts = GenOptions {
            seed,
            ..GenOptions::default()
        };
        let (ds, _) = generate(&cfg, &opts, None, &NoProgress).unwrap();
        let labels = ds.labels.as_ref().unwrap();
        let split: Vec<u32> = [&ds.train, &ds.valid, &ds.test]
            .iter()
            .flat_map(|s| s.iter().copied())
            .collect();
        let wanted: usize = cfg.split.sizes(600).iter().sum();
        assert_eq!(split.len(), wanted, "seed {seed}");
        // The region is the smallest prefix of classes (at least 3) that holds the splits.
        let k = split.iter().map(|&v| labels[v as usize]).max().unwrap() + 1;
        let in_prefix = |k: i64| labels.iter().filter(|&&l| l < k).count();
        assert!(
            k <= 3 || in_prefix(k - 1) < wanted,
            "seed {seed}: region wider than needed"
        );
    }
    // At the default scale the region is exactly 3 classes.
    let s = sample(Preset::Papers);
    let labels = s.ds.labels.as_ref().unwrap();
    assert!(s.ds.train.iter().all(|&v| labels[v as usize] < 3));
}

#[test]
fn a_cancelled_generation_leaves_nothing_and_keeps_the_old_dataset() {
    use fanout_graph::{Cancel, Error};
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("ds");
    let cfg = Preset::Tiny.config(None);
    let opts = GenOptions {
        seed: 1,
        overwrite: true,
        ..GenOptions::default()
    };
    generate(&cfg, &opts, Some(&out), &NoProgress).unwrap();
    let before = std::fs::read(out.join("meta.txt")).unwrap();
    let cancel = Cancel::new();
    cancel.cancel();
    let other = GenOptions { seed: 2, ..opts };
    let r = crate::generate_with_cancel(&cfg, &other, Some(&out), &NoProgress, &cancel);
    assert!(matches!(r, Err(Error::Interrupted)), "{:?}", r.err());
    assert_eq!(std::fs::read(out.join("meta.txt")).unwrap(), before);
    let left: Vec<_> = std::fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        left,
        vec![std::ffi::OsString::from("ds")],
        "temporary left behind"
    );
}
