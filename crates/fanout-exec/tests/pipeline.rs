//! End to end through the pipeline: a model overfits a tiny graph to 100% training accuracy,
//! runs are deterministic, stage clocks tick, and an early-dropped epoch stops cleanly.

use fanout_cache::{ExtractStats, Extractor, PlainExtractor};
use fanout_compute::{Adam, CpuBackend, Model, ModelConfig, ModelKind};
use fanout_exec::{fit, solo, FitConfig, Pipeline, PipelineConfig, Trainer};
use fanout_graph::{Dataset, NoProgress};
use fanout_sample::{KHopConfig, KHopSampler, RemapKind, Sampler, FANOUT_ALL};
use fanout_synth::{generate, GenOptions, Preset};
use std::sync::Arc;

fn tiny(nodes: u64) -> Arc<Dataset> {
    let cfg = Preset::Tiny.config(Some(nodes));
    let (ds, _) = generate(&cfg, &GenOptions::default(), None, &NoProgress).unwrap();
    Arc::new(ds)
}

fn pipeline(ds: &Arc<Dataset>, fanouts: Vec<u32>, seeds: Vec<u32>, shuffle: bool) -> Pipeline {
    let ex = PlainExtractor::new(ds.clone()).unwrap();
    pipeline_with(ds, fanouts, seeds, shuffle, Box::new(ex))
}

fn pipeline_with(
    ds: &Arc<Dataset>,
    fanouts: Vec<u32>,
    seeds: Vec<u32>,
    shuffle: bool,
    ex: Box<dyn Extractor>,
) -> Pipeline {
    let cfg = KHopConfig {
        fanouts,
        replace: false,
        remap: RemapKind::Auto,
    };
    let s: Arc<dyn Sampler> = Arc::new(KHopSampler::new(ds.clone(), cfg).unwrap());
    let pc = PipelineConfig {
        batch_size: 16,
        shuffle,
        seed: 1,
        prefetch: 2,
        sample_workers: 2,
        reorder_window: 0,
        ..PipelineConfig::default()
    };
    Pipeline::new(s, ex, seeds, &pc).unwrap()
}

/// The plain extractor until its `fail_at`-th call, which errors (or panics).
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
        if self.calls == self.fail_at {
            if self.panic {
                panic!("injected extract panic");
            }
            return Err(fanout_graph::Error::Invalid(
                "injected extract error".into(),
            ));
        }
        self.inner.extract(ids, out)
    }
}

fn trainer(ds: &Dataset, kind: ModelKind, dropout: f32) -> Trainer<CpuBackend> {
    let mut mc = ModelConfig::new(kind, ds.features.as_ref().unwrap().dim, 64, 4, 2);
    mc.dropout = dropout;
    let model = Model::new(CpuBackend, mc).unwrap();
    Trainer::new(model, Box::new(Adam::new(CpuBackend, 0.01)))
}

#[test]
fn sage_overfits_a_tiny_graph_through_the_pipeline() {
    let ds = tiny(300);
    let seeds = ds.train.to_vec();
    assert!(seeds.len() >= 40);
    let all = vec![FANOUT_ALL, FANOUT_ALL];
    let train = pipeline(&ds, all.clone(), seeds.clone(), true);
    let mut t = trainer(&ds, ModelKind::Sage, 0.0);
    let cfg = FitConfig {
        epochs: 60,
        eval_every: 0,
    };
    let run = fit(&mut t, &train, None, None, cfg, &solo(), &mut ()).unwrap();
    let last = run.epochs.last().unwrap();
    assert!(last.loss < run.epochs[0].loss);
    let eval_train = pipeline(&ds, all, seeds, false);
    assert_eq!(t.evaluate(&eval_train).unwrap(), 1.0, "loss {}", last.loss);
}

#[test]
fn runs_are_deterministic_and_clocks_tick() {
    let ds = tiny(400);
    let run = || {
        let train = pipeline(&ds, vec![5, 5], ds.train.to_vec(), true);
        let valid = pipeline(&ds, vec![5, 5], ds.valid.to_vec(), false);
        let test = pipeline(&ds, vec![5, 5], ds.test.to_vec(), false);
        let mut t = trainer(&ds, ModelKind::Gcn, 0.5);
        let cfg = FitConfig {
            epochs: 3,
            eval_every: 2,
        };
        fit(
            &mut t,
            &train,
            Some(&valid),
            Some(&test),
            cfg,
            &solo(),
            &mut (),
        )
        .unwrap()
    };
    let (a, b) = (run(), run());
    assert_eq!(a.epochs.len(), 3);
    // Evaluated after epoch 1 (every 2nd) and after the last, not after epoch 0.
    assert!(a.epochs[0].val_acc.is_none() && a.epochs[1].val_acc.is_some());
    assert!(a.epochs[2].test_acc.is_some());
    for (x, y) in a.epochs.iter().zip(&b.epochs) {
        assert_eq!(
            (x.loss, x.train_acc, x.val_acc),
            (y.loss, y.train_acc, y.val_acc)
        );
        assert!(x.train_s > 0.0);
        assert!(x.batches > 0 && x.edges > 0 && x.input_nodes > 0);
        // The next epoch starts extracting while this one's last batch trains; the bytes
        // still count in the epoch whose batches they fed.
        let row_bytes = ds.features.as_ref().unwrap().row_bytes() as u64;
        assert_eq!(x.extract.rows, x.input_nodes, "epoch {}", x.epoch);
        assert_eq!(x.extract.bytes_total, x.input_nodes * row_bytes);
    }
    // Stage clocks tick. Busy time counts in the epoch during whose wall time it was spent:
    // the next epoch's first batches are sampled and extracted while this one's last batch
    // trains, so on a graph this small a later epoch can show none of its own.
    assert!(a.epochs.iter().map(|e| e.sample_s).sum::<f64>() > 0.0);
    assert!(a.epochs.iter().map(|e| e.extract_s).sum::<f64>() > 0.0);
    assert!(a.epochs[0].sample_s > 0.0 && a.epochs[0].extract_s > 0.0);
    assert_eq!(a.test_acc, b.test_acc);
    // Starting the next epoch early changes nothing in this one: epoch 0 of the 3-epoch run
    // equals a 1-epoch run, which starts nothing ahead.
    let one = {
        let train = pipeline(&ds, vec![5, 5], ds.train.to_vec(), true);
        let mut t = trainer(&ds, ModelKind::Gcn, 0.5);
        let cfg = FitConfig {
            epochs: 1,
            eval_every: 0,
        };
        fit(&mut t, &train, None, None, cfg, &solo(), &mut ()).unwrap()
    };
    assert_eq!(one.epochs[0].input_nodes, a.epochs[0].input_nodes);
    assert_eq!(one.epochs[0].loss, a.epochs[0].loss);
}

#[test]
fn an_extract_error_or_panic_ends_the_epoch_with_one_error_and_no_second_panic() {
    let ds = tiny(400);
    for panic in [false, true] {
        let ex = FailingExtractor {
            inner: PlainExtractor::new(ds.clone()).unwrap(),
            calls: 0,
            fail_at: 3,
            panic,
        };
        let p = pipeline_with(&ds, vec![5, 5], ds.train.to_vec(), true, Box::new(ex));
        assert!(p.num_batches() > 4);
        let items: Vec<_> = p.epoch(0).collect();
        // Two prepared batches, then the error, then nothing.
        assert_eq!(items.len(), 3, "panic {panic}");
        assert!(items[..2].iter().all(|r| r.is_ok()));
        let e = items[2].as_ref().err().unwrap().to_string();
        let want = if panic {
            "the extract stage panicked"
        } else {
            "injected extract error"
        };
        assert!(e.contains(want), "{e}");
        // The next epoch: a panicked extractor is not trusted again (one error, no panic on
        // the poisoned lock); an extractor that only returned an error goes on.
        let next: Vec<_> = p.epoch(1).collect();
        if panic {
            assert_eq!(next.len(), 1);
            let e = next[0].as_ref().err().unwrap().to_string();
            assert!(e.contains("failed in an earlier epoch"), "{e}");
        } else {
            assert_eq!(next.len(), p.num_batches());
            assert!(next.iter().all(|r| r.is_ok()));
        }
    }
}

#[test]
fn dropping_an_epoch_early_stops_the_stages() {
    let ds = tiny(400);
    let p = pipeline(&ds, vec![5, 5], ds.train.to_vec(), true);
    let mut s = p.epoch(0);
    assert!(s.len() > 2);
    let first = s.next().unwrap().unwrap();
    assert_eq!(
        first.features.len(),
        first.batch.input_nodes.len() * first.dim
    );
    drop(s);
    // The next epoch still runs to completion.
    assert_eq!(p.epoch(1).count(), p.num_batches());
}

#[test]
fn fit_with_stops_on_cancel_and_resumes_from_the_state_its_hook_saw() {
    use fanout_exec::{fit_with, ExecError, FitControl, FitState};
    use fanout_graph::Cancel;
    let ds = tiny(300);
    let cfg = |epochs| FitConfig {
        epochs,
        eval_every: 1,
    };
    let valid = pipeline(&ds, vec![5, 5], ds.valid.to_vec(), false);
    // Cancelled before the first step: nothing trained.
    let cancel = Cancel::new();
    cancel.cancel();
    let mut t = trainer(&ds, ModelKind::Sage, 0.5);
    let before = t.parameters().unwrap();
    let train = pipeline(&ds, vec![5, 5], ds.train.to_vec(), true);
    let ctl = FitControl {
        cancel: Some(&cancel),
        ..FitControl::default()
    };
    let r = fit_with(&mut t, &train, None, None, cfg(3), &solo(), &mut (), ctl);
    match r {
        Err(
            e @ ExecError::Interrupted {
                epoch: 0, step: 0, ..
            },
        ) => {
            assert!(e.is_interrupted());
            assert!(
                e.to_string().starts_with("interrupted at epoch 0, step 0"),
                "{e}"
            );
        }
        Err(e) => panic!("expected an interruption, got {e}"),
        Ok(_) => panic!("a cancelled run trained"),
    }
    assert_eq!(t.parameters().unwrap(), before);
    // Three epochs straight, keeping the states the hook sees.
    let mut states: Vec<FitState> = Vec::new();
    let mut hook = |s: &FitState| {
        states.push(s.clone());
        Ok(())
    };
    let mut full = trainer(&ds, ModelKind::Sage, 0.5);
    let ctl = FitControl {
        on_epoch: Some(&mut hook),
        ..FitControl::default()
    };
    let v = Some(&valid as &dyn fanout_exec::BatchSource);
    let a = fit_with(&mut full, &train, v, None, cfg(3), &solo(), &mut (), ctl).unwrap();
    assert_eq!(states.len(), 3);
    assert_eq!(states[0].epochs_done, 1);
    assert_eq!(states[0].optim.tensors.len(), 2 * 6);
    // Resumed from the state after epoch 1 in a fresh trainer: the same best model and state.
    let mut resumed = trainer(&ds, ModelKind::Sage, 0.5);
    let ctl = FitControl {
        resume: Some(states[0].clone()),
        ..FitControl::default()
    };
    let b = fit_with(&mut resumed, &train, v, None, cfg(3), &solo(), &mut (), ctl).unwrap();
    assert_eq!(resumed.parameters().unwrap(), full.parameters().unwrap());
    assert_eq!(
        (a.best_epoch, a.best_val_acc),
        (b.best_epoch, b.best_val_acc)
    );
    assert_eq!(b.epochs.len(), 2);
    // A state that has trained all the epochs asked for is refused.
    let ctl = FitControl {
        resume: Some(states[2].clone()),
        ..FitControl::default()
    };
    let mut t = trainer(&ds, ModelKind::Sage, 0.5);
    assert!(fit_with(&mut t, &train, v, None, cfg(3), &solo(), &mut (), ctl).is_err());
}

#[cfg(target_arch = "x86_64")]
#[test]
fn fit_flushes_subnormals_while_it_trains_and_gives_the_callers_mode_back() {
    use fanout_compute::cpu::denormals::flushing_denormals;
    use fanout_exec::{BatchOutcome, FitObserver};
    // A pool of the trainer's own: other tests of this binary train on the global pool at the
    // same time, and their guards flush it while they run.
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap(),
    );
    /// Whether the step's thread and every worker of the pool flushed, at each batch.
    struct Seen(Arc<rayon::ThreadPool>, Vec<(bool, bool)>);
    impl FitObserver for Seen {
        fn batch_done(&mut self, _: &BatchOutcome) {
            let workers = self.0.broadcast(|_| flushing_denormals());
            self.1
                .push((flushing_denormals(), workers.iter().all(|&f| f)));
        }
    }
    let ds = tiny(200);
    let train = pipeline(&ds, vec![4, 4], ds.train.to_vec(), true);
    let mut t = trainer(&ds, ModelKind::Sage, 0.0).with_pool(Some(pool.clone()));
    let cfg = FitConfig {
        epochs: 2,
        eval_every: 0,
    };
    assert!(!flushing_denormals());
    let mut seen = Seen(pool.clone(), Vec::new());
    fit(&mut t, &train, None, None, cfg, &solo(), &mut seen).unwrap();
    assert!(!seen.1.is_empty());
    assert!(seen.1.iter().all(|&s| s == (true, true)), "{:?}", seen.1);
    assert!(!flushing_denormals(), "the caller's mode is given back");
    assert!(pool.broadcast(|_| !flushing_denormals()).iter().all(|&f| f));
}
