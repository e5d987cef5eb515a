//! GNNLab's factored design against the plain strategies on the same batches.

use fanout_compute::{CpuBackend, Model};
use fanout_exec::{train, FactoredSpec, RunEnv, StrategyKind, TrainConfig, TrainOutcome};
use fanout_graph::Dataset;

mod common;
use common::saved_tiny;

fn config(ds: &Dataset, workers: usize, strategy: StrategyKind) -> TrainConfig {
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
        strategy: Some(strategy),
        ..TrainConfig::default()
    }
}

fn factored(ds: &Dataset, workers: usize, samplers: Option<usize>, switching: bool) -> TrainConfig {
    TrainConfig {
        factored: FactoredSpec {
            samplers,
            switching,
            queue_depth: 1,
            trial_batches: 2,
        },
        ..config(ds, workers, StrategyKind::Factored)
    }
}

fn params(m: &Model<CpuBackend>) -> Vec<f32> {
    m.named_params()
        .iter()
        .flat_map(|(_, p)| p.value.data().to_vec())
        .collect()
}

/// The largest difference between `a` and `b`, relative to the largest magnitude in `a`.
fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    common::max_scaled_diff(a, b, a)
}

fn run(cfg: &TrainConfig) -> TrainOutcome {
    train(cfg, &RunEnv::default(), &mut ()).unwrap()
}

/// Same losses per epoch (up to rounding) and the same trained parameters.
fn assert_same_training(a: &TrainOutcome, b: &TrainOutcome, what: &str) {
    assert_eq!(a.metrics.epochs.len(), b.metrics.epochs.len());
    for (x, y) in a.metrics.epochs.iter().zip(&b.metrics.epochs) {
        assert!(
            (x.loss - y.loss).abs() < 1e-4,
            "{what}: loss {} vs {}",
            x.loss,
            y.loss
        );
        assert_eq!(x.seeds, y.seeds, "{what}: seeds per epoch");
    }
    let d = max_rel_diff(&params(&a.model), &params(&b.model));
    assert!(d < 1e-3, "{what}: parameters differ by {d}");
}

#[test]
fn one_worker_factored_is_the_single_worker_run() {
    let (_dir, ds) = saved_tiny(800);
    let single = run(&config(&ds, 1, StrategyKind::Single));
    let f = run(&factored(&ds, 1, None, true));
    // The same batches in the same order through the same step: bit-identical.
    for (x, y) in f.metrics.epochs.iter().zip(&single.metrics.epochs) {
        assert_eq!(x.loss, y.loss);
        assert_eq!(x.seeds, ds.train.len() as u64);
    }
    assert_eq!(params(&f.model), params(&single.model));
    assert_eq!(f.metrics.test_acc, single.metrics.test_acc);
}

#[test]
fn factored_steps_equal_data_parallel_steps_whatever_the_allocation() {
    let (_dir, ds) = saved_tiny(800);
    for workers in [2, 3] {
        let dp = run(&config(&ds, workers, StrategyKind::DataParallel));
        for samplers in 1..workers {
            let f = run(&factored(&ds, workers, Some(samplers), false));
            let what = format!("{workers} workers, {samplers} samplers");
            assert_same_training(&f, &dp, &what);
            let rep = f.strategy_report.as_ref().unwrap();
            assert_eq!(rep["layout"]["samplers"], samplers, "{what}");
            assert_eq!(rep["claimed_by_standby"], 0, "{what}");
            for e in &f.metrics.epochs {
                assert_eq!(e.seeds, ds.train.len() as u64, "{what}: every seed once");
            }
        }
    }
}

#[test]
fn switching_trains_every_slice_once_and_changes_no_step() {
    let (_dir, ds) = saved_tiny(800);
    // One sampler far faster than one trainer: it finishes each epoch's share early and, as
    // a standby, claims queued slices while the profit is positive.
    let dp = run(&config(&ds, 2, StrategyKind::DataParallel));
    let f = run(&factored(&ds, 2, Some(1), true));
    assert_same_training(&f, &dp, "switching");
    let rep = f.strategy_report.as_ref().unwrap();
    let claimed = rep["claimed_by_standby"].as_u64().unwrap();
    assert!(claimed > 0, "no slice was claimed: {rep}");
    for e in &f.metrics.epochs {
        assert_eq!(e.seeds, ds.train.len() as u64, "epoch {}", e.epoch);
    }
    // A slice a standby trained counts in the owner's epoch like one it trained itself: the
    // same edges, input vertices and feature bytes as without switching.
    let still = run(&factored(&ds, 2, Some(1), false));
    for (a, b) in f.metrics.epochs.iter().zip(&still.metrics.epochs) {
        let what = format!("epoch {}", a.epoch);
        assert_eq!((a.edges, a.input_nodes), (b.edges, b.input_nodes), "{what}");
        assert_eq!(a.extract, b.extract, "{what}");
        assert!(a.extract.bytes_from_host > 0, "{what}");
    }
    // The cost model picks an allocation of its own and still trains the same steps.
    let auto = run(&factored(&ds, 3, None, true));
    let dp3 = run(&config(&ds, 3, StrategyKind::DataParallel));
    assert_same_training(&auto, &dp3, "cost model");
    let rep = auto.strategy_report.as_ref().unwrap();
    assert_eq!(rep["allocation"], "cost model");
    assert!(rep["trial"]["t_train_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn hybrid_routes_change_who_samples_not_the_steps() {
    let (_dir, ds) = saved_tiny(800);
    let dp = run(&config(&ds, 3, StrategyKind::DataParallel));
    let cfg = TrainConfig {
        strategy: Some(StrategyKind::Hybrid),
        ..factored(&ds, 3, Some(1), false)
    };
    let h = run(&cfg);
    assert_same_training(&h, &dp, "hybrid");
    let rep = &h.strategy_report.as_ref().unwrap()["hybrid"];
    let split = &rep["split"];
    let (own, remote) = (
        split["n_cpu"].as_u64().unwrap(),
        split["n_gpu"].as_u64().unwrap(),
    );
    // Each of the 2 trainers holds 3 slices of each of ceil(train / 40) steps per epoch.
    let steps = ds.train.len().div_ceil(40) as u64;
    let per_trainer = steps * (3 / 2 + 3 % 2) as u64;
    assert!(
        own + remote == per_trainer || own + remote == steps * (3 / 2) as u64,
        "{rep}"
    );
    assert!(rep["costs"]["t_model"].as_f64().unwrap() > 0.0);
    for e in &h.metrics.epochs {
        assert_eq!(e.seeds, ds.train.len() as u64);
    }
}
