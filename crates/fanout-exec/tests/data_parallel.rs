//! Data parallelism against the one-worker computation it replaces: the all-reduced gradient
//! of N workers equals the one-worker gradient over the union batch (same key), and whole
//! runs of N in-process workers train the one-worker model (up to rounding).

use fanout_cache::{Extractor, PlainExtractor};
use fanout_compute::{Adam, CpuBackend, Model, ModelConfig, ModelKind};
use fanout_exec::{
    solo, train, Comm, LocalComm, Prepared, RunEnv, StrategyKind, TrainConfig, Trainer,
};
use fanout_graph::{Dataset, NoProgress};
use fanout_sample::{near_equal_part, BatchKey, KHopConfig, KHopSampler, RemapKind, Sampler};
use fanout_synth::{generate, GenOptions, Preset};
use std::sync::Arc;

mod common;
use common::{max_rel_diff, saved_tiny};

fn tiny(nodes: u64) -> Arc<Dataset> {
    let cfg = Preset::Tiny.config(Some(nodes));
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

fn prepared(ds: &Arc<Dataset>, s: &Arc<dyn Sampler>, seeds: &[u32], key: BatchKey) -> Prepared {
    let batch = s.sample(seeds, key).unwrap();
    let mut ex = PlainExtractor::new(ds.clone()).unwrap();
    let mut features = Vec::new();
    let extract = ex.extract(&batch.input_nodes, &mut features).unwrap();
    Prepared {
        batch,
        dim: ex.dim(),
        features,
        extract,
        remote: None,
        split: None,
        input_agg: None,
        input_store: None,
        cache_split: None,
    }
}

fn trainer(ds: &Dataset, kind: ModelKind) -> Trainer<CpuBackend> {
    let classes = ds.meta.num_class as usize;
    let mut mc = ModelConfig::new(kind, ds.features.as_ref().unwrap().dim, 32, classes, 2);
    mc.heads = if kind == ModelKind::Gat { 4 } else { 1 };
    mc.dropout = 0.5;
    mc.seed = 3;
    Trainer::new(
        Model::new(CpuBackend, mc).unwrap(),
        Box::new(Adam::new(CpuBackend, 0.01)),
    )
}

#[test]
fn allreduced_gradients_equal_the_union_batch_gradient() {
    let ds = tiny(600);
    let s = sampler(&ds);
    let union: Vec<u32> = ds.train.iter().copied().take(61).collect();
    assert_eq!(
        union.len(),
        61,
        "the tiny graph has too few training vertices"
    );
    let key = BatchKey {
        seed: 7,
        epoch: 2,
        step: 5,
    };
    let dropout_key = (2 << 32) | 5;
    // GCN is left out: its norm="both" coefficients count a source's out-degree within the
    // sampled block, which differs between a worker's batch and the union batch (as in DGL).
    for kind in [ModelKind::Sage, ModelKind::Gat, ModelKind::Gin] {
        let mut one = trainer(&ds, kind);
        let p = prepared(&ds, &s, &union, key);
        let single = one.compute_gradients(p, dropout_key).unwrap();
        let mut expect = Vec::new();
        one.gradients_into(1.0, &mut expect).unwrap();
        assert!(expect.iter().any(|&g| g != 0.0));
        for workers in [2usize, 3] {
            let results: Vec<(Vec<f32>, f64, usize)> = std::thread::scope(|sc| {
                let handles: Vec<_> = LocalComm::group(workers)
                    .into_iter()
                    .map(|comm| {
                        let (ds, s, union) = (ds.clone(), s.clone(), &union);
                        sc.spawn(move || {
                            let mine = near_equal_part(union, comm.rank(), workers);
                            let mut t = trainer(&ds, kind);
                            let p = prepared(&ds, &s, mine, key);
                            let mut scratch = Vec::new();
                            let r = t
                                .compute_reduced_gradients(p, dropout_key, &comm, &mut scratch)
                                .unwrap();
                            let mut g = Vec::new();
                            t.gradients_into(1.0, &mut g).unwrap();
                            (
                                g,
                                r.outcome.loss * r.outcome.labelled as f64,
                                r.step_labelled,
                            )
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for (rank, (g, _, labelled)) in results.iter().enumerate() {
                assert_eq!(*labelled, single.labelled, "{kind:?} {workers} workers");
                let d = max_rel_diff(g, &expect);
                assert!(
                    d < 1e-5,
                    "{kind:?}, {workers} workers, rank {rank}: diff {d}"
                );
                // Replicas hold bit-identical gradients.
                assert_eq!(g, &results[0].0);
            }
            let loss: f64 = results.iter().map(|r| r.1).sum::<f64>() / single.labelled as f64;
            assert!(
                (loss - single.loss).abs() < 1e-5 * (1.0 + single.loss),
                "{kind:?} {workers}: loss {loss} vs {}",
                single.loss
            );
        }
    }
}

#[test]
fn a_worker_with_another_mask_key_breaks_the_equality() {
    // The check above can fail: dropout keyed by row index instead of vertex id (or a worker
    // using another step key) makes the gradients differ.
    let ds = tiny(600);
    let s = sampler(&ds);
    let union: Vec<u32> = ds.train.iter().copied().take(40).collect();
    let key = BatchKey {
        seed: 7,
        epoch: 0,
        step: 1,
    };
    let mut one = trainer(&ds, ModelKind::Sage);
    one.compute_gradients(prepared(&ds, &s, &union, key), 1)
        .unwrap();
    let mut expect = Vec::new();
    one.gradients_into(1.0, &mut expect).unwrap();
    let grads: Vec<Vec<f32>> = std::thread::scope(|sc| {
        let hs: Vec<_> = LocalComm::group(2)
            .into_iter()
            .map(|comm| {
                let (ds, s, union) = (ds.clone(), s.clone(), &union);
                sc.spawn(move || {
                    let mine = near_equal_part(union, comm.rank(), 2);
                    let mut t = trainer(&ds, ModelKind::Sage);
                    let dropout_key = 1 + comm.rank() as u64; // rank 1 draws other masks
                    let p = prepared(&ds, &s, mine, key);
                    t.compute_reduced_gradients(p, dropout_key, &comm, &mut Vec::new())
                        .unwrap();
                    let mut g = Vec::new();
                    t.gradients_into(1.0, &mut g).unwrap();
                    g
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(max_rel_diff(&grads[0], &expect) > 1e-4);
}

fn config(ds: &Dataset, workers: usize) -> TrainConfig {
    TrainConfig {
        dataset: Some(ds.dir.clone()),
        fanouts: Some(vec![4, 3]),
        batch_size: Some(40),
        hidden: Some(32),
        epochs: 3,
        lr: Some(0.01),
        threads: Some(2),
        workers,
        seed: 5,
        ..TrainConfig::default()
    }
}

#[test]
fn in_process_workers_train_the_one_worker_model() {
    let (_dir, ds) = saved_tiny(800);
    let one = train(&config(&ds, 1), &RunEnv::default(), &mut ()).unwrap();
    let params = |m: &Model<CpuBackend>| -> Vec<f32> {
        m.named_params()
            .iter()
            .flat_map(|(_, p)| p.value.data().to_vec())
            .collect()
    };
    for workers in [2, 3] {
        let many = train(&config(&ds, workers), &RunEnv::default(), &mut ()).unwrap();
        assert_eq!(many.workers, workers);
        assert_eq!(many.config.strategy, Some(StrategyKind::DataParallel));
        for (a, b) in many.metrics.epochs.iter().zip(&one.metrics.epochs) {
            assert_eq!(a.batches, b.batches);
            assert!(
                (a.loss - b.loss).abs() < 1e-4,
                "{workers}: {} vs {}",
                a.loss,
                b.loss
            );
            assert_eq!(a.workers.len(), workers);
            assert!(a.allreduce_bytes > 0);
            // Evaluation slices the one-worker batches: equal counts, so near-equal accuracy
            // (parameters differ only by rounding).
            let (va, vb) = (a.val_acc.unwrap(), b.val_acc.unwrap());
            assert!((va - vb).abs() < 0.02, "{workers}: val {va} vs {vb}");
        }
        let d = max_rel_diff(&params(&many.model), &params(&one.model));
        assert!(d < 1e-3, "{workers} workers: parameters differ by {d}");
    }
}

#[test]
fn a_failing_worker_stops_the_group_with_its_message() {
    // Rank 1 of 2 gets an all-reduce of another length than rank 0's: it fails, and rank 0,
    // blocked in the collective, returns the failure instead of hanging.
    let group = LocalComm::group(2);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|sc| {
        for comm in group {
            let tx = tx.clone();
            sc.spawn(move || {
                if comm.rank() == 1 {
                    comm.fail("feature file damaged on rank 1");
                    return;
                }
                let mut buf = vec![1.0f32; 8];
                let r = comm.all_reduce_sum_f32(&mut buf);
                tx.send(r.map_err(|e| e.to_string())).unwrap();
            });
        }
    });
    let r = rx.recv_timeout(std::time::Duration::from_secs(20)).unwrap();
    let e = r.unwrap_err();
    assert!(e.contains("rank 1") && e.contains("damaged"), "{e}");
}

#[test]
fn workers_refuse_different_configs_and_bad_partitions() {
    let (_dir, ds) = saved_tiny(800);
    // Different configs: the check happens before any training.
    let results: Vec<String> = std::thread::scope(|sc| {
        let hs: Vec<_> = LocalComm::group(2)
            .into_iter()
            .map(|comm| {
                let ds = ds.clone();
                sc.spawn(move || {
                    let mut cfg = config(&ds, 2);
                    cfg.seed += comm.rank() as u64;
                    let r = fanout_exec::train_worker(
                        ds,
                        &cfg,
                        &comm,
                        None,
                        &RunEnv::default(),
                        &mut (),
                    );
                    r.err().map(|e| e.to_string()).unwrap_or_default()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for e in &results {
        assert!(e.contains("different configs") && e.contains("seed"), "{e}");
    }
    // A partition that does not exist: a clean error naming it.
    let mut cfg = config(&ds, 2);
    cfg.partition = Some("pagraph-2".into());
    let e = train(&cfg, &RunEnv::default(), &mut ())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("pagraph-2"), "{e}");
    // More workers than the group.
    let e = fanout_exec::train_worker(
        ds.clone(),
        &config(&ds, 3),
        &solo(),
        None,
        &RunEnv::default(),
        &mut (),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("3 workers"), "{e}");
}

#[test]
fn partitioned_workers_sample_inside_their_part() {
    use fanout_graph::{partition_training_set, PartitionMethod};
    use fanout_sample::{Loader, LoaderConfig, SamplerKind};
    let (_dir, ds) = saved_tiny(800);
    let p = partition_training_set(
        &ds,
        PartitionMethod::PaGraph,
        3,
        2,
        0,
        &NoProgress,
        &fanout_graph::Cancel::new(),
    )
    .unwrap();
    p.write(&ds, "pg3", false).unwrap();
    let mut cfg = config(&ds, 3);
    cfg.partition = Some("pg3".into());
    cfg.resolve(16, 4);
    let mut seen = 0;
    for rank in 0..3 {
        let plan = fanout_exec::WorkerPlan::new(&ds, &cfg, rank, 3).unwrap();
        assert_eq!(plan.train_seeds, p.train[rank]);
        let part = &plan.part.as_ref().unwrap().1;
        let s = cfg
            .sampler
            .build(&ds, vec![4, 3], SamplerKind::Khop)
            .unwrap();
        let lc = LoaderConfig {
            batch_size: plan.batch_size,
            seed: 5,
            ..LoaderConfig::default()
        };
        let loader = Loader::new(s, plan.train_seeds.clone(), lc)
            .unwrap()
            .with_plan(plan.train_plan)
            .unwrap();
        assert_eq!(loader.num_batches(), ds.train.len().div_ceil(40));
        for epoch in 0..2 {
            for b in loader.epoch(epoch) {
                for v in b.unwrap().input_nodes {
                    assert!(
                        part.binary_search(&v).is_ok(),
                        "rank {rank}: {v} left the part"
                    );
                    seen += 1;
                }
            }
        }
    }
    assert!(seen > 1000);
    // Three layers reach past a 2-hop part: refused.
    cfg.fanouts = Some(vec![4, 3, 2]);
    let e = fanout_exec::WorkerPlan::new(&ds, &cfg, 0, 3).unwrap_err();
    assert!(e.to_string().contains("--sample-from global"), "{e}");
}
