//! PaGraph's trial batch ([`measure_trial_batch`]) through a scripted [`MemoryProbe`]: it
//! measures the first training batch of epoch 0, leaves the model untouched, and the queued
//! bytes follow the pipeline's in-flight bounds.

use fanout_cache::PlainExtractor;
use fanout_compute::{Adam, CpuBackend, Model, ModelConfig, ModelKind, Tensor};
use fanout_exec::{
    measure_trial_batch, minibatch_bytes, MemoryProbe, Pipeline, PipelineConfig, Trainer,
};
use fanout_graph::NoProgress;
use fanout_sample::{KHopConfig, KHopSampler, RemapKind, Sampler};
use fanout_synth::{generate, GenOptions, Preset};
use std::cell::Cell;
use std::sync::Arc;

/// Reports `in_use` at reset and `in_use + extra` as the peak.
struct Scripted {
    in_use: u64,
    extra: u64,
    resets: Cell<u32>,
}

impl MemoryProbe for Scripted {
    fn name(&self) -> String {
        "scripted".into()
    }
    fn available(&self) -> Result<u64, String> {
        Err("not known".into())
    }
    fn reset_peak(&self) -> u64 {
        self.resets.set(self.resets.get() + 1);
        self.in_use
    }
    fn peak(&self) -> u64 {
        self.in_use + self.extra
    }
}

fn params(t: &Trainer<CpuBackend>) -> Vec<Tensor> {
    t.model()
        .named_params()
        .iter()
        .map(|(_, p)| p.value.clone())
        .collect()
}

#[test]
fn the_trial_batch_is_measured_and_changes_nothing() {
    let cfg = Preset::Tiny.config(Some(1500));
    let ds = Arc::new(
        generate(&cfg, &GenOptions::default(), None, &NoProgress)
            .unwrap()
            .0,
    );
    let k = KHopConfig {
        fanouts: vec![5, 5],
        replace: false,
        remap: RemapKind::Auto,
    };
    let sampler: Arc<dyn Sampler> = Arc::new(KHopSampler::new(ds.clone(), k).unwrap());
    let pc = PipelineConfig {
        batch_size: 32,
        seed: 9,
        prefetch: 3,
        reorder_window: 4,
        ..PipelineConfig::default()
    };
    let mc = ModelConfig::new(ModelKind::Gcn, 16, 32, 4, 2);
    let mut t = Trainer::new(
        Model::new(CpuBackend, mc).unwrap(),
        Box::new(Adam::new(CpuBackend, 0.01)),
    );
    let before = params(&t);
    let probe = Scripted {
        in_use: 1000,
        extra: 12345,
        resets: Cell::new(0),
    };
    let mut ex = PlainExtractor::new(ds.clone()).unwrap();
    let seeds = ds.train.to_vec();
    let m = measure_trial_batch(&mut t, &sampler, &mut ex, &seeds, &pc, &probe).unwrap();
    assert_eq!(probe.resets.get(), 1);
    assert_eq!(m.step_peak, 12345);
    // Parameters, gradients and Adam's two moments, 4 bytes each.
    assert_eq!(m.model_state, 16 * t.model().num_params() as u64);
    assert_eq!(m.peak(), 12345 + m.model_state);
    assert_eq!(params(&t), before, "the trial step moved the weights");

    // It is the batch the run trains first.
    let pipe = Pipeline::new(
        sampler.clone(),
        Box::new(PlainExtractor::new(ds.clone()).unwrap()),
        seeds.clone(),
        &PipelineConfig {
            reorder_window: 0,
            ..pc.clone()
        },
    )
    .unwrap();
    let first = pipe.epoch(0).next().unwrap().unwrap();
    assert_eq!(m.input_nodes, first.batch.input_nodes.len() as u64);
    assert_eq!(m.batch_bytes, minibatch_bytes(&first.batch));
    assert_eq!(m.feature_bytes, 4 * first.features.len() as u64);

    // Queued: loader depth max(3, 4) + a window of 4 sampled, 3 + 1 prepared.
    assert_eq!(pc.batches_in_flight(), (8, 4));
    assert_eq!(
        m.queued_bytes(&pc),
        8 * m.batch_bytes + 4 * (m.batch_bytes + m.feature_bytes)
    );
    let plain = PipelineConfig {
        reorder_window: 1,
        ..pc
    };
    assert_eq!(plain.batches_in_flight(), (3, 4));

    // Training after the trial equals training without it.
    let train = |t: &mut Trainer<CpuBackend>| {
        let b = pipe.epoch(0).next().unwrap().unwrap();
        t.train_batch(b, 0).unwrap();
        params(t)
    };
    let mut fresh = Trainer::new(
        Model::new(CpuBackend, ModelConfig::new(ModelKind::Gcn, 16, 32, 4, 2)).unwrap(),
        Box::new(Adam::new(CpuBackend, 0.01)),
    );
    assert_eq!(train(&mut t), train(&mut fresh));
}
