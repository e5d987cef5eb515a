//! Split parallelism against the one-worker step on the same mini-batch.

use fanout_cache::{ExtractStats, Extractor, PlainExtractor};
use fanout_compute::{Adam, CpuBackend, Model, ModelConfig, ModelKind};
use fanout_exec::pipeline::Prepared;
use fanout_exec::{
    fit, split, train, BatchOutcome, Comm, FitConfig, LocalComm, RunEnv, StrategyKind, TrainConfig,
    Trainer,
};
use fanout_graph::Dataset;
use fanout_sample::{BatchKey, MiniBatch, RangeOwners, Sampler, SamplerKind, SamplerSpec};
use std::sync::Arc;

mod common;
use common::saved_tiny;

fn trainer(ds: &Dataset, kind: ModelKind) -> Trainer<CpuBackend> {
    let classes = ds.meta.num_class as usize;
    let mut mc = ModelConfig::new(kind, ds.features.as_ref().unwrap().dim, 16, classes, 3);
    mc.dropout = 0.5;
    mc.heads = if kind == ModelKind::Gat { 2 } else { 1 };
    mc.seed = 3;
    Trainer::new(
        Model::new(CpuBackend, mc).unwrap(),
        Box::new(Adam::new(CpuBackend, 0.01)),
    )
}

/// Parameter gradients by name, in the model's order.
type Grads = Vec<(String, Vec<f32>)>;

/// Every parameter's gradient, by name.
fn gradients(t: &Trainer<CpuBackend>) -> Grads {
    t.model()
        .named_params()
        .into_iter()
        .map(|(name, p)| (name, p.grad.data().to_vec()))
        .collect()
}

/// The largest difference between `a` and `b`, relative to the largest magnitude in `b`.
fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    common::max_scaled_diff(a, b, b)
}

/// [`max_rel_diff`] tensor by tensor (a wrong small gradient, a bias or GIN's eps, is not
/// hidden by a large one elsewhere), with the name of the worst tensor.
fn max_rel_diff_each(a: &Grads, b: &Grads) -> (f32, String) {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|((name, x), (_, y))| (max_rel_diff(x, y), name.clone()))
        .fold((0.0, String::new()), |m, d| if d.0 > m.0 { d } else { m })
}

const KEY: BatchKey = BatchKey {
    seed: 11,
    epoch: 1,
    step: 2,
};
const DROPOUT_KEY: u64 = 77;

/// The one-worker step: (its outcome, gradients, the batch).
fn one_worker(
    ds: &Arc<Dataset>,
    s: &dyn Sampler,
    kind: ModelKind,
    seeds: &[u32],
) -> (BatchOutcome, Grads, MiniBatch) {
    let batch = s.sample(seeds, KEY).unwrap();
    let kept = batch.clone();
    let mut features = Vec::new();
    ds.features
        .as_ref()
        .unwrap()
        .gather_into(&batch.input_nodes, &mut features);
    let p = Prepared {
        batch,
        features,
        dim: ds.features.as_ref().unwrap().dim,
        extract: Default::default(),
        remote: None,
        split: None,
        input_agg: None,
        input_store: None,
        cache_split: None,
    };
    let mut t = trainer(ds, kind);
    let o = t.compute_gradients(p, DROPOUT_KEY).unwrap();
    (o, gradients(&t), kept)
}

/// Every worker's split step, in threads over an in-process group.
fn split_workers(
    ds: &Arc<Dataset>,
    s: &Arc<dyn Sampler>,
    kind: ModelKind,
    seeds: &[u32],
    offsets: &[u64],
    shuffle: split::Shuffle,
) -> Vec<(split::SplitStep, Grads)> {
    let owners = RangeOwners::new(offsets.to_vec()).unwrap();
    let comms = LocalComm::group(owners.parts());
    std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                let (owners, s) = (owners.clone(), s.clone());
                scope.spawn(move || {
                    let b = split::sample(s.as_ref(), &owners, seeds, KEY, shuffle, &comm).unwrap();
                    let mut features = Vec::new();
                    let f = ds.features.as_ref().unwrap();
                    f.gather_into(&b.owned, &mut features);
                    let mut t = trainer(ds, kind);
                    let r = split::step(&mut t, &b, features, f.dim, &comm, DROPOUT_KEY).unwrap();
                    (r, gradients(&t))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Distinct (destination, owner of one of its sources) pairs whose owner is not the
/// destination's, over every block of the one-worker batch: the rows partial sums send.
fn cross_pairs(b: &MiniBatch, owners: &RangeOwners) -> u64 {
    let owner = |local: u32| owners.owner(b.input_nodes[local as usize] as u64).unwrap();
    let mut pairs = 0;
    for blk in &b.blocks {
        for d in 0..blk.num_dst {
            let od = owner(d as u32);
            let mut others: Vec<usize> = blk
                .row(d)
                .iter()
                .map(|&s| owner(s))
                .filter(|&o| o != od)
                .collect();
            others.sort_unstable();
            others.dedup();
            pairs += others.len() as u64;
        }
    }
    pairs
}

/// Distinct (vertex, hop) sources owned by another worker than their destination's: the rows
/// source-row shuffles send.
fn cross_sources(b: &MiniBatch, owners: &RangeOwners) -> u64 {
    let owner = |local: u32| owners.owner(b.input_nodes[local as usize] as u64).unwrap();
    let mut rows = 0;
    for blk in &b.blocks {
        // A source is sent once to each other worker that has a destination reading it.
        let mut sent: Vec<(u32, usize)> = Vec::new();
        for d in 0..blk.num_dst {
            let od = owner(d as u32);
            sent.extend(
                blk.row(d)
                    .iter()
                    .filter(|&&s| owner(s) != od)
                    .map(|&s| (s, od)),
            );
        }
        sent.sort_unstable();
        sent.dedup();
        rows += sent.len() as u64;
    }
    rows
}

#[test]
fn a_split_step_equals_the_one_worker_step_on_the_same_batch() {
    let (_dir, ds) = saved_tiny(900);
    let s = SamplerSpec::default()
        .build(&ds, vec![5, 4, 3], SamplerKind::Khop)
        .unwrap();
    let n = ds.num_nodes();
    let seeds: Vec<u32> = ds.train.iter().copied().take(120).collect();
    for kind in ModelKind::ALL {
        let (outcome, grads, batch) = one_worker(&ds, s.as_ref(), kind, &seeds);
        // Uneven ranges, and a worker that owns no seed at all (the last range holds none of
        // the first 120 training vertices only by chance, so one is made empty on purpose).
        let offsets_list = [vec![0, n / 3, n], vec![0, n / 5, n / 2, n], vec![0, n, n]];
        let mut shuffles = vec![split::Shuffle::Rows];
        if split::Shuffle::partial_sums_fit(kind) {
            shuffles.push(split::Shuffle::PartialSums);
        }
        assert_eq!(split::Shuffle::for_model(kind), *shuffles.last().unwrap());
        for (offsets, shuffle) in offsets_list
            .iter()
            .flat_map(|o| shuffles.iter().map(move |&s| (o.clone(), s)))
        {
            let workers = split_workers(&ds, &s, kind, &seeds, &offsets, shuffle);
            let what = format!("{kind:?} {offsets:?} {shuffle:?}");
            for (r, g) in &workers {
                assert!(
                    (r.step.loss - outcome.loss).abs() < 1e-5,
                    "{what}: loss {} vs {}",
                    r.step.loss,
                    outcome.loss
                );
                assert_eq!(r.step.labelled, outcome.labelled, "{what}");
                assert_eq!(r.step.correct, outcome.correct, "{what}");
                let (d, name) = max_rel_diff_each(g, &grads);
                assert!(d < 1e-4, "{what}: gradient of {name} differs by {d}");
            }
            // The workers' own seeds partition the step's.
            let mine: usize = workers.iter().map(|(r, _)| r.mine.labelled).sum();
            assert_eq!(mine, outcome.labelled, "{what}");
            // Every sampled edge is computed once, by one worker.
            let computed: u64 = workers
                .iter()
                .map(|(r, _)| r.local_edges + r.remote_edges)
                .sum();
            assert_eq!(computed, batch.num_edges() as u64, "{what}");
            let shuffled: u64 = workers.iter().map(|(r, _)| r.shuffled_bytes).sum();
            let remote: u64 = workers.iter().map(|(r, _)| r.remote_edges).sum();
            assert_eq!(shuffled > 0, remote > 0, "{what}");
            // Two or three non-empty ranges: some edges cross them, and rows were shuffled.
            assert_eq!(remote > 0, offsets[1] < n, "{what}: {remote} remote");
            // Rows received: one per (destination, owner) pair with partial sums, one per
            // (source, reading worker) with source rows, counted here from the one-worker batch.
            let owners = RangeOwners::new(offsets.clone()).unwrap();
            let rows: u64 = workers.iter().map(|(r, _)| r.remote_rows).sum();
            let expected = match shuffle {
                split::Shuffle::PartialSums => cross_pairs(&batch, &owners),
                split::Shuffle::Rows => cross_sources(&batch, &owners),
            };
            assert_eq!(rows, expected, "{what}: rows received");
        }
    }
}

/// PinSAGE transforms each source row before summing and GAT weighs it by attention: a
/// split step refuses partial sums for them rather than compute a different model.
#[test]
fn partial_sums_are_refused_for_models_that_transform_sources() {
    let (_dir, ds) = saved_tiny(900);
    let s: Arc<dyn Sampler> = SamplerSpec::default()
        .build(&ds, vec![3, 3, 3], SamplerKind::Khop)
        .unwrap();
    let n = ds.num_nodes();
    let seeds: Vec<u32> = ds.train.iter().copied().take(40).collect();
    let owners = RangeOwners::new(vec![0, n / 2, n]).unwrap();
    for kind in [ModelKind::PinSage, ModelKind::Gat] {
        assert!(!split::Shuffle::partial_sums_fit(kind));
        let errors: Vec<String> = std::thread::scope(|scope| {
            let handles: Vec<_> = LocalComm::group(2)
                .into_iter()
                .map(|comm| {
                    let (owners, s, seeds, ds) = (owners.clone(), s.clone(), &seeds, &ds);
                    scope.spawn(move || {
                        let b = split::sample(
                            s.as_ref(),
                            &owners,
                            seeds,
                            KEY,
                            split::Shuffle::PartialSums,
                            &comm,
                        )
                        .unwrap();
                        let f = ds.features.as_ref().unwrap();
                        let mut features = Vec::new();
                        f.gather_into(&b.owned, &mut features);
                        let mut t = trainer(ds, kind);
                        let e = split::step(&mut t, &b, features, f.dim, &comm, DROPOUT_KEY)
                            .unwrap_err();
                        e.to_string()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for e in errors {
            assert!(e.contains("partial sums"), "{kind:?}: {e}");
        }
    }
}

#[test]
fn unsplittable_samplers_and_mismatched_parts_are_refused() {
    let (_dir, ds) = saved_tiny(900);
    let n = ds.num_nodes();
    let owners = RangeOwners::new(vec![0, n]).unwrap();
    let comm = LocalComm::group(1).pop().unwrap();
    let seeds: Vec<u32> = ds.train.iter().copied().take(10).collect();
    let walks = SamplerSpec::default()
        .build(&ds, vec![3, 3], SamplerKind::Randomwalk)
        .unwrap();
    let e = split::sample(
        walks.as_ref(),
        &owners,
        &seeds,
        KEY,
        split::Shuffle::Rows,
        &comm,
    )
    .unwrap_err();
    assert!(e.to_string().contains("cannot be split"), "{e}");
    let s = SamplerSpec::default()
        .build(&ds, vec![3, 3, 3], SamplerKind::Khop)
        .unwrap();
    let two = RangeOwners::new(vec![0, n / 2, n]).unwrap();
    let e = split::sample(s.as_ref(), &two, &seeds, KEY, split::Shuffle::Rows, &comm).unwrap_err();
    assert!(
        e.to_string().contains("2 parts but the run has 1 workers"),
        "{e}"
    );
    assert_eq!(comm.size(), 1);
}

fn write_offsets(ds: &Dataset, offsets: &[u64]) {
    let bytes: Vec<u8> = offsets.iter().flat_map(|o| o.to_le_bytes()).collect();
    std::fs::write(ds.dir.join(fanout_graph::files::PART_OFFSETS), bytes).unwrap();
}

fn config(ds: &Dataset, workers: usize, strategy: StrategyKind, model: ModelKind) -> TrainConfig {
    TrainConfig {
        dataset: Some(ds.dir.clone()),
        model,
        fanouts: Some(vec![4, 3]),
        batch_size: Some(48),
        hidden: Some(16),
        epochs: 3,
        lr: Some(0.01),
        threads: Some(1),
        workers,
        seed: 5,
        strategy: Some(strategy),
        // k-hop for every model (PinSAGE's default random walks cannot be split).
        sampler: SamplerSpec {
            kind: Some(SamplerKind::Khop),
            ..SamplerSpec::default()
        },
        ..TrainConfig::default()
    }
}

fn params(m: &Model<CpuBackend>) -> Vec<f32> {
    m.named_params()
        .iter()
        .flat_map(|(_, p)| p.value.data().to_vec())
        .collect()
}

#[test]
fn split_training_equals_one_worker_training() {
    let (_dir, ds) = saved_tiny(900);
    let n = ds.num_nodes();
    let run = |cfg: &TrainConfig| train(cfg, &RunEnv::default(), &mut ()).unwrap();
    for model in ModelKind::ALL {
        let single = run(&config(&ds, 1, StrategyKind::Single, model));
        for offsets in [vec![0, n], vec![0, n / 3, n], vec![0, n / 4, n / 2, n]] {
            write_offsets(&ds, &offsets);
            let workers = offsets.len() - 1;
            let split = run(&config(&ds, workers, StrategyKind::Split, model));
            let what = format!("{model:?} over {offsets:?}");
            for (a, b) in single.metrics.epochs.iter().zip(&split.metrics.epochs) {
                assert!(
                    (a.loss - b.loss).abs() < 1e-4,
                    "{what}: loss {} vs {}",
                    a.loss,
                    b.loss
                );
                assert_eq!(a.seeds, b.seeds, "{what}: every seed once per epoch");
                let s = b.split.as_ref().expect("split figures");
                assert_eq!(s.local_edges + s.remote_edges, b.edges, "{what}");
                assert_eq!(s.remote_edges > 0, workers > 1, "{what}");
                assert_eq!(b.workers.len(), if workers > 1 { workers } else { 0 });
            }
            let d = max_rel_diff(&params(&single.model), &params(&split.model));
            assert!(d < 1e-3, "{what}: parameters differ by {d}");
            // Parameters equal up to rounding: the same test accuracy, or one prediction
            // apart (a near tie flipped by rounding).
            let one = 1.0 / ds.test.len() as f64;
            let (a, b) = (single.metrics.test_acc, split.metrics.test_acc);
            assert!(
                (a - b).abs() <= one + 1e-12,
                "{what}: test accuracy {a} vs {b}"
            );
        }
    }
    // A PreSC cache ranks only the worker's own range (it never reads other rows): rank 0 of
    // [0, n/3, n] caches at most its n/3 vertices though half the graph would fit. Caching
    // changes where bytes come from, not the result.
    write_offsets(&ds, &[0, n / 3, n]);
    let cached = |mut c: TrainConfig| {
        c.cache.policy = "presc".into();
        c.cache.ratio = "0.5".into();
        c
    };
    let single = run(&cached(config(
        &ds,
        1,
        StrategyKind::Single,
        ModelKind::Sage,
    )));
    let split = run(&cached(config(
        &ds,
        2,
        StrategyKind::Split,
        ModelKind::Sage,
    )));
    let rows = split.cache["rows"].as_u64().unwrap();
    assert!(
        rows > 0 && rows <= n / 3,
        "rank 0 caches {rows} rows of its {}",
        n / 3
    );
    assert!(split.metrics.epochs.iter().all(|e| e.hit_rate > 0.0));
    for (a, b) in single.metrics.epochs.iter().zip(&split.metrics.epochs) {
        assert!(
            (a.loss - b.loss).abs() < 1e-4,
            "cached: loss {} vs {}",
            a.loss,
            b.loss
        );
    }
    // The number of parts must be the number of workers; a dataset without ranges is refused.
    write_offsets(&ds, &[0, n / 2, n]);
    let e = match train(
        &config(&ds, 3, StrategyKind::Split, ModelKind::Sage),
        &RunEnv::default(),
        &mut (),
    ) {
        Ok(_) => panic!("trained"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("2 METIS parts but the run has 3 workers"), "{e}");
    std::fs::remove_file(ds.dir.join(fanout_graph::files::PART_OFFSETS)).unwrap();
    let e = match train(
        &config(&ds, 2, StrategyKind::Split, ModelKind::Sage),
        &RunEnv::default(),
        &mut (),
    ) {
        Ok(_) => panic!("trained"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("has no METIS ranges"), "{e}");
}

/// Fails its `fail_at`-th extraction: returns an error, or panics if `panic`.
struct FailingExtractor {
    inner: PlainExtractor,
    calls: usize,
    fail_at: usize,
    panic: bool,
}

impl Extractor for FailingExtractor {
    fn dim(&self) -> usize {
        self.inner.dim()
    }
    fn extract(&mut self, ids: &[u32], out: &mut Vec<f32>) -> fanout_graph::Result<ExtractStats> {
        self.calls += 1;
        if self.calls == self.fail_at && self.panic {
            panic!("injected extract panic");
        }
        if self.calls == self.fail_at {
            return Err(fanout_graph::Error::Invalid(
                "injected extract error".into(),
            ));
        }
        self.inner.extract(ids, out)
    }
}

/// An error or a panic while one worker prepares a step ends every worker with its message
/// (a panicking preparing thread once left its peers waiting in a sampling collective).
#[test]
fn one_worker_failing_to_prepare_ends_every_worker_with_an_error() {
    for (panic, message) in [
        (false, "injected extract error"),
        (true, "injected extract panic"),
    ] {
        one_worker_fails_to_prepare(panic, message);
    }
}

fn one_worker_fails_to_prepare(panic: bool, message: &str) {
    let (_dir, ds) = saved_tiny(900);
    let n = ds.num_nodes();
    let s = SamplerSpec::default()
        .build(&ds, vec![4, 3, 3], SamplerKind::Khop)
        .unwrap();
    let owners = RangeOwners::new(vec![0, n / 3, n]).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    for comm in LocalComm::group(2) {
        let (ds, s, owners, tx) = (ds.clone(), s.clone(), owners.clone(), tx.clone());
        std::thread::spawn(move || {
            let rank = comm.rank();
            let ex = FailingExtractor {
                inner: PlainExtractor::new(ds.clone()).unwrap(),
                calls: 0,
                // Worker 1 fails on the third step of the first epoch.
                fail_at: if rank == 1 { 3 } else { usize::MAX },
                panic,
            };
            let seeds = ds.train.to_vec();
            let src = split::SplitSource::new(
                s,
                owners,
                Box::new(ex),
                &comm,
                seeds,
                40,
                5,
                split::Shuffle::PartialSums,
            )
            .unwrap();
            let mut t = trainer(&ds, ModelKind::Sage);
            let cfg = FitConfig {
                epochs: 2,
                eval_every: 0,
            };
            let r = fit(&mut t, &src, None, None, cfg, &comm, &mut ());
            if let Err(e) = &r {
                comm.fail(&e.to_string());
            }
            drop(src);
            let _ = tx.send((rank, r.map(|_| ()).map_err(|e| e.to_string())));
        });
    }
    let mut errors = Vec::new();
    for _ in 0..2 {
        let (rank, r) = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("a worker hung after its peer failed");
        errors.push((rank, r.unwrap_err()));
    }
    errors.sort();
    assert!(errors[1].1.contains(message), "{errors:?}");
    assert!(errors[0].1.contains(message), "{errors:?}");
}
