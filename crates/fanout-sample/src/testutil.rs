//! Test graphs and statistics shared by the unit tests.

use fanout_graph::{
    build_topology, files, BuildOptions, Dataset, DatasetWriter, Layout, Meta, NoProgress,
    SliceArcs,
};
use fanout_rand::Rng;
use std::collections::HashSet;
use std::sync::Arc;

/// A dataset in a temporary directory from `arcs` (deduplicated), with labels `v % 7` and train
/// set `0..n/2`.
pub fn dataset(arcs: &[(u64, u64)], n: u64, layout: Layout) -> Arc<Dataset> {
    let mut w = DatasetWriter::temporary().unwrap();
    let opts = BuildOptions {
        layout,
        dedup: true,
        num_nodes: Some(n),
        ..Default::default()
    };
    let st = build_topology(&mut SliceArcs(arcs), &opts, &mut w, &NoProgress).unwrap();
    let labels: Vec<i64> = (0..n as i64).map(|v| v % 7).collect();
    w.write_array(files::LABEL, &labels).unwrap();
    let train: Vec<u32> = (0..n as u32 / 2).collect();
    w.write_array(files::TRAIN, &train).unwrap();
    let meta = Meta {
        num_node: n,
        num_edge: st.num_arcs,
        num_class: 7,
        num_train_set: train.len() as u64,
        layout,
        ..Meta::default()
    };
    Arc::new(w.finish(meta, &NoProgress).unwrap())
}

/// A skewed random graph on `n` vertices: vertex 0 is a hub with `hub` in-neighbours, other
/// in-degrees vary from 0 to about 40.
pub fn random_graph(n: u64, hub: u64, seed: u64) -> Arc<Dataset> {
    let mut r = Rng::new(seed);
    let mut arcs: Vec<(u64, u64)> = (1..=hub.min(n - 1)).map(|s| (s, 0)).collect();
    for d in 1..n {
        let deg = if r.bernoulli(0.1) { 0 } else { r.below(40) };
        for _ in 0..deg {
            arcs.push((r.below(n), d));
        }
    }
    dataset(&arcs, n, Layout::Csc)
}

/// Pearson's chi-square statistic.
pub fn chi2(counts: &[u64], expected: &[f64]) -> f64 {
    counts
        .iter()
        .zip(expected)
        .map(|(&o, &e)| (o as f64 - e).powi(2) / e)
        .sum()
}

/// Upper 10^-4 quantile of the chi-square distribution with `dof` degrees of freedom
/// (Wilson-Hilferty; accurate to about 1% for dof >= 5).
pub fn chi2_critical(dof: usize) -> f64 {
    let k = dof as f64;
    let z = 3.719; // standard normal upper 1e-4 quantile
    let a = 2.0 / (9.0 * k);
    k * (1.0 - a + z * a.sqrt()).powi(3)
}

/// A rayon pool with `t` threads.
pub fn pool(t: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(t)
        .build()
        .unwrap()
}

/// The set of stored rows as (dst, src) pairs, for "every sampled edge exists" checks.
pub fn arc_set(ds: &Dataset) -> HashSet<(u32, u32)> {
    (0..ds.num_nodes())
        .flat_map(|v| {
            ds.topology
                .row(v)
                .iter()
                .map(move |u| (v as u32, u as u32))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Checks that every block edge of `mb` is a stored arc (row dst lists src).
pub fn assert_edges_exist(mb: &crate::MiniBatch, arcs: &HashSet<(u32, u32)>) {
    let g = &mb.input_nodes;
    for b in &mb.blocks {
        for d in 0..b.num_dst {
            for &s in b.row(d) {
                let e = (g[d], g[s as usize]);
                assert!(arcs.contains(&e), "sampled edge {e:?} is not in the graph");
            }
        }
    }
}

/// Runs each of `jobs` on an OS thread of its own that hands it to `pool` (`install`), as
/// loaders hand batches to the rayon pool, all at once; returns the results in completion
/// order. Panics when they have not all finished within 60 s (a deadlock).
pub fn install_from_threads<T, F>(pool: &Arc<rayon::ThreadPool>, jobs: Vec<F>) -> Vec<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let n = jobs.len();
    let (tx, rx) = std::sync::mpsc::channel();
    for job in jobs {
        let (pool, tx) = (pool.clone(), tx.clone());
        std::thread::spawn(move || {
            let _ = tx.send(pool.install(job));
        });
    }
    (0..n)
        .map(|_| {
            rx.recv_timeout(std::time::Duration::from_secs(60))
                .expect("jobs handed to the pool from outside threads did not finish (deadlock)")
        })
        .collect()
}

/// Checks [`crate::Sampler::sample_hop`] against [`crate::Sampler::sample`]: for every hop of
/// the batch of `seeds`, a part of that hop's frontier (every other vertex, in reverse order)
/// sampled alone gets exactly the sources (and weights) it got in the batch. Also checks the
/// errors for a vertex out of range and a hop beyond the sampler's depth.
pub fn assert_hops_match_the_batch(s: &dyn crate::Sampler, seeds: &[u32], key: crate::BatchKey) {
    let mb = s.sample(seeds, key).unwrap();
    let layers = mb.num_layers();
    for h in 0..layers {
        let b = &mb.blocks[layers - 1 - h];
        let global = |e: usize| mb.input_nodes[b.indices[e] as usize];
        let part: Vec<usize> = (0..b.num_dst).rev().step_by(2).collect();
        let frontier: Vec<u32> = part.iter().map(|&d| mb.input_nodes[d]).collect();
        let hop = s.sample_hop(&frontier, key, h).unwrap();
        assert_eq!(hop.indptr.len(), frontier.len() + 1);
        for (i, &d) in part.iter().enumerate() {
            let (lo, hi) = (b.indptr[d] as usize, b.indptr[d + 1] as usize);
            let want: Vec<u32> = (lo..hi).map(global).collect();
            let (a, z) = (hop.indptr[i] as usize, hop.indptr[i + 1] as usize);
            assert_eq!(hop.ids[a..z], want[..], "hop {h}, vertex {}", frontier[i]);
            if let (Some(w), Some(bw)) = (&hop.weights, &b.weights) {
                assert_eq!(w[a..z], bw[lo..hi], "hop {h} weights");
            }
        }
        assert_eq!(hop.weights.is_some(), b.weights.is_some());
    }
    let n = s.dataset().num_nodes() as u32;
    assert!(s.sample_hop(&[n], key, 0).is_err());
    assert!(s.sample_hop(&[0], key, layers).is_err());
}
