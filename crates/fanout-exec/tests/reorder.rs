//! FastGL Greedy Reorder in the pipeline (`PipelineConfig::reorder_window`): an epoch is a
//! permutation of the sampled batches that keeps each window together, the order is Greedy
//! Reorder's on each window whatever the thread counts and queue depths, Match reuses more rows
//! with it on a constructed case, and the features stay exactly the plain extractor's.

use fanout_cache::match_reorder::reorder_windows;
use fanout_cache::{CachedExtractor, ExtractStats, Extractor, PlainExtractor};
use fanout_compute::{Adam, CpuBackend, Model, ModelConfig, ModelKind};
use fanout_exec::{fit, solo, FitConfig, Pipeline, PipelineConfig, Prepared, Trainer};
use fanout_graph::{Dataset, NoProgress};
use fanout_sample::{KHopConfig, KHopSampler, RemapKind, Sampler};
use fanout_synth::{generate, GenOptions, Preset};
use std::collections::BTreeSet;
use std::sync::Arc;

const BATCH: usize = 16;

fn tiny() -> Arc<Dataset> {
    let cfg = Preset::Tiny.config(Some(3000));
    let (ds, _) = generate(&cfg, &GenOptions::default(), None, &NoProgress).unwrap();
    Arc::new(ds)
}

fn sampler(ds: &Arc<Dataset>) -> Arc<dyn Sampler> {
    let cfg = KHopConfig {
        fanouts: vec![4, 3],
        replace: false,
        remap: RemapKind::Auto,
    };
    Arc::new(KHopSampler::new(ds.clone(), cfg).unwrap())
}

fn config(shuffle: bool, window: usize, prefetch: usize, workers: usize) -> PipelineConfig {
    PipelineConfig {
        batch_size: BATCH,
        shuffle,
        seed: 5,
        prefetch,
        sample_workers: workers,
        reorder_window: window,
        ..PipelineConfig::default()
    }
}

/// A Match extractor (no static cache).
fn matching(ds: &Arc<Dataset>) -> Box<dyn Extractor> {
    Box::new(CachedExtractor::new(ds.clone(), None, true).unwrap())
}

fn epoch(ds: &Arc<Dataset>, seeds: &[u32], cfg: &PipelineConfig, e: u64) -> Vec<Prepared> {
    let p = Pipeline::new(sampler(ds), matching(ds), seeds.to_vec(), cfg).unwrap();
    p.epoch(e).map(Result::unwrap).collect()
}

fn steps(batches: &[Prepared]) -> Vec<usize> {
    batches.iter().map(|p| p.batch.key.step as usize).collect()
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn an_epoch_is_greedy_reorder_of_each_window_whatever_the_threads_and_queues() {
    let ds = tiny();
    let n = ds.num_nodes() as usize;
    let seeds = ds.train.to_vec();
    let w = 4;
    for e in [0, 1] {
        // Reference: the sampled order, then Greedy Reorder window by window.
        let plain = epoch(&ds, &seeds, &config(true, 0, 2, 1), e);
        assert_eq!(steps(&plain), (0..plain.len()).collect::<Vec<_>>());
        assert!(plain.len() > 2 * w, "{} batches", plain.len());
        let sets: Vec<&[u32]> = plain
            .iter()
            .map(|p| p.batch.input_nodes.as_slice())
            .collect();
        let expected = reorder_windows(&sets, w, n);
        assert_ne!(
            expected,
            (0..plain.len()).collect::<Vec<_>>(),
            "the case must reorder something"
        );
        for (prefetch, workers) in [(1, 1), (2, 3), (7, 2)] {
            let got = epoch(&ds, &seeds, &config(true, w, prefetch, workers), e);
            assert_eq!(
                steps(&got),
                expected,
                "prefetch {prefetch} workers {workers}"
            );
            // Each window keeps its own batches; every seed is trained exactly once.
            for (k, c) in steps(&got).chunks(w).enumerate() {
                assert!(c.iter().all(|&s| s / w == k), "window {k}: {c:?}");
            }
            let mut trained: Vec<u32> = got.iter().flat_map(|p| p.batch.seeds().to_vec()).collect();
            trained.sort_unstable();
            let mut all = seeds.clone();
            all.sort_unstable();
            assert_eq!(trained, all);
            // The batches themselves are the sampled ones.
            for p in &got {
                assert_eq!(p.batch, plain[p.batch.key.step as usize].batch);
            }
        }
    }
    // A window of 1 (or 0) is the sampled order; evaluation configurations never reorder.
    let one = epoch(&ds, &seeds, &config(true, 1, 2, 2), 0);
    assert_eq!(steps(&one), (0..one.len()).collect::<Vec<_>>());
    let ev = config(true, 8, 3, 2).for_evaluation();
    assert_eq!((ev.reorder_window, ev.shuffle, ev.prefetch), (0, false, 3));
}

#[test]
fn reordering_alternating_communities_raises_match_reuse_with_exact_features() {
    let ds = tiny();
    let labels = ds.labels.as_ref().unwrap();
    // Training seeds of classes 0 and 1, in batches that alternate between the two classes:
    // in sampled order consecutive batches share few input nodes (homophily 0.8).
    let class = |c: i64| -> Vec<u32> {
        ds.train
            .iter()
            .filter(|&&s| labels[s as usize] == c)
            .copied()
            .collect()
    };
    let (a, b) = (class(0), class(1));
    let k = a.len().min(b.len()) / BATCH;
    assert!(k >= 4, "{k} batches per class");
    let mut seeds = Vec::new();
    for i in 0..k {
        seeds.extend_from_slice(&a[i * BATCH..(i + 1) * BATCH]);
        seeds.extend_from_slice(&b[i * BATCH..(i + 1) * BATCH]);
    }
    let reused = |window: usize| {
        let cfg = config(false, window, 2, 2);
        let p = Pipeline::new(sampler(&ds), matching(&ds), seeds.clone(), &cfg).unwrap();
        let batches: Vec<Prepared> = p.epoch(0).map(Result::unwrap).collect();
        let mut stats = ExtractStats::default();
        batches.iter().for_each(|b| stats.add(&b.extract));
        assert_eq!(batches.len(), 2 * k);
        (stats, batches)
    };
    let (sampled, plain_batches) = reused(0);
    let mut plain = PlainExtractor::new(ds.clone()).unwrap();
    for w in [4, 2 * k] {
        let (reordered, batches) = reused(w);
        assert_eq!(reordered.bytes_total, sampled.bytes_total);
        assert!(
            reordered.bytes_reused > sampled.bytes_reused,
            "window {w}: reused {} bytes, {} in sampled order",
            reordered.bytes_reused,
            sampled.bytes_reused
        );
        assert!(reordered.bytes_from_host < sampled.bytes_from_host);
        // Features are bit for bit the plain extractor's, batch by batch.
        let mut out = Vec::new();
        for p in &batches {
            plain.extract(&p.batch.input_nodes, &mut out).unwrap();
            assert_eq!(bits(&p.features), bits(&out), "step {}", p.batch.key.step);
            assert_eq!(p.batch, plain_batches[p.batch.key.step as usize].batch);
        }
    }
}

#[test]
fn training_with_a_window_trains_every_batch_deterministically_and_stops_early_cleanly() {
    let ds = tiny();
    let seeds = ds.train.to_vec();
    let run = |prefetch: usize, workers: usize| {
        let cfg = config(true, 5, prefetch, workers);
        let train = Pipeline::new(sampler(&ds), matching(&ds), seeds.clone(), &cfg).unwrap();
        let mc = ModelConfig::new(ModelKind::Sage, 16, 32, 4, 2);
        let model = Model::new(CpuBackend, mc).unwrap();
        let mut t = Trainer::new(model, Box::new(Adam::new(CpuBackend, 0.01)));
        let fc = FitConfig {
            epochs: 2,
            eval_every: 0,
        };
        let m = fit(&mut t, &train, None, None, fc, &solo(), &mut ()).unwrap();
        assert!(m
            .epochs
            .iter()
            .all(|e| e.batches as usize == train.num_batches()));
        m.epochs
            .iter()
            .map(|e| (e.loss, e.train_acc, e.extract))
            .collect::<Vec<_>>()
    };
    assert_eq!(run(1, 1), run(4, 3));

    let p = Pipeline::new(
        sampler(&ds),
        matching(&ds),
        seeds.clone(),
        &config(true, 5, 1, 2),
    )
    .unwrap();
    let mut s = p.epoch(0);
    let first = s.next().unwrap().unwrap();
    assert_eq!(
        first.batch.key.step, 0,
        "a window starts at its first batch"
    );
    drop(s);
    assert_eq!(p.epoch(1).count(), p.num_batches());
    let seen: BTreeSet<u64> = p.epoch(2).map(|b| b.unwrap().batch.key.step).collect();
    assert_eq!(seen.len(), p.num_batches());
}
