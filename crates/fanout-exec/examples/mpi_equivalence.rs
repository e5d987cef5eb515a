//! Data parallelism over MPI against the one-worker computation, run by
//! `scripts/mpi-tests.sh` under `mpirun -np 2` and `-np 3`:
//!
//! 1. for GraphSAGE, GAT and GIN, the all-reduced gradient of the ranks' shares of a batch
//!    equals the one-worker gradient over the whole batch under the same key (every rank also
//!    computes the one-worker gradient itself, to compare);
//! 2. a 3-epoch data-parallel run over MPI trains the model and losses of a one-worker run.
//!
//! Prints one `check NAME ok|FAILED` line per check on rank 0 and exits non-zero when any
//! fails.

use fanout_cache::{Extractor, PlainExtractor};
use fanout_comm::{Comm, MpiComm};
use fanout_compute::{Adam, CpuBackend, Model, ModelConfig, ModelKind};
use fanout_exec::{solo, train_worker, Prepared, RunEnv, TrainConfig, Trainer};
use fanout_graph::{Dataset, NoProgress};
use fanout_sample::{near_equal_part, BatchKey, KHopConfig, KHopSampler, RemapKind, Sampler};
use fanout_synth::{generate, GenOptions, Preset};
use std::sync::Arc;

fn prepared(ds: &Arc<Dataset>, s: &Arc<dyn Sampler>, seeds: &[u32], key: BatchKey) -> Prepared {
    let batch = s.sample(seeds, key).expect("sample");
    let mut ex = PlainExtractor::new(ds.clone()).expect("features");
    let mut features = Vec::new();
    let extract = ex
        .extract(&batch.input_nodes, &mut features)
        .expect("extract");
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
    mc.seed = 3;
    let model = Model::new(CpuBackend, mc).expect("model");
    Trainer::new(model, Box::new(Adam::new(CpuBackend, 0.01)))
}

fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return f32::INFINITY;
    }
    a.iter()
        .zip(b)
        // A NaN on one side only is as far as can be (`f32::max` would skip it).
        .map(|(x, y)| match (x.is_nan(), y.is_nan()) {
            (true, true) => 0.0,
            (false, false) if x == y => 0.0,
            (false, false) => (x - y).abs() / (1.0 + y.abs()),
            _ => f32::INFINITY,
        })
        .fold(0.0, f32::max)
}

fn main() {
    let comm = MpiComm::init().expect("MPI");
    let (rank, n) = (comm.rank(), comm.size());
    let cfg = Preset::Tiny.config(Some(800));
    let (ds, _) = generate(&cfg, &GenOptions::default(), None, &NoProgress).expect("tiny");
    let ds = Arc::new(ds);
    let kcfg = KHopConfig {
        fanouts: vec![4, 3],
        replace: false,
        remap: RemapKind::Auto,
    };
    let s: Arc<dyn Sampler> = Arc::new(KHopSampler::new(ds.clone(), kcfg).expect("sampler"));
    let union: Vec<u32> = ds.train.iter().copied().take(61).collect();
    let key = BatchKey {
        seed: 7,
        epoch: 2,
        step: 5,
    };
    let mut failed = 0;
    let mut report = |name: String, ok: bool, detail: String| {
        if !ok {
            failed += 1;
        }
        if rank == 0 {
            let verdict = if ok { "ok" } else { "FAILED" };
            println!("check {name} {verdict} ({detail})");
        }
    };
    for kind in [ModelKind::Sage, ModelKind::Gat, ModelKind::Gin] {
        let mut one = trainer(&ds, kind);
        one.compute_gradients(prepared(&ds, &s, &union, key), 9)
            .expect("one-worker step");
        let mut expect = Vec::new();
        one.gradients_into(1.0, &mut expect).unwrap();
        let mut t = trainer(&ds, kind);
        let mine = near_equal_part(&union, rank, n);
        t.compute_reduced_gradients(prepared(&ds, &s, mine, key), 9, &comm, &mut Vec::new())
            .expect("all-reduced step");
        let mut got = Vec::new();
        t.gradients_into(1.0, &mut got).unwrap();
        let mut d = [max_rel_diff(&got, &expect) as f64];
        // The worst rank decides.
        let mut all = d;
        comm.all_reduce_sum_f64(&mut all).expect("reduce");
        d[0] = all[0];
        report(
            format!("gradient-{}-np{n}", kind.name()),
            d[0] < 1e-5 * n as f64,
            format!("sum of per-rank max relative differences {:.2e}", d[0]),
        );
    }
    // A whole run: MPI data parallelism against one worker on the same config.
    let run = |workers: usize| TrainConfig {
        fanouts: Some(vec![4, 3]),
        batch_size: Some(40),
        hidden: Some(32),
        epochs: 3,
        lr: Some(0.01),
        seed: 5,
        workers,
        ..TrainConfig::default()
    };
    let env = RunEnv::default();
    let many = train_worker(ds.clone(), &run(n), &comm, None, &env, &mut ()).expect("mpi run");
    let one = train_worker(ds.clone(), &run(1), &solo(), None, &env, &mut ()).expect("one run");
    let params = |m: &Model<CpuBackend>| -> Vec<f32> {
        m.named_params()
            .iter()
            .flat_map(|(_, p)| p.value.data().to_vec())
            .collect()
    };
    let d = max_rel_diff(&params(&many.model), &params(&one.model));
    let loss_gap = many
        .metrics
        .epochs
        .iter()
        .zip(&one.metrics.epochs)
        .map(|(a, b)| (a.loss - b.loss).abs())
        // A NaN gap fails (`f64::max` would skip it).
        .fold(
            0.0,
            |m, g| if g.is_nan() { f64::INFINITY } else { m.max(g) },
        );
    report(
        format!("run-np{n}"),
        d < 1e-3 && loss_gap < 1e-4 && many.metrics.epochs[0].workers.len() == n,
        format!("parameters differ by {d:.2e}, losses by {loss_gap:.2e}"),
    );
    comm.barrier().expect("barrier");
    if failed > 0 {
        std::process::exit(1);
    }
}
