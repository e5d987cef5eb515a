//! Optimisers against hand computations, and models that overfit a tiny graph.

mod common;

use common::{rand_tensor, OwnedBlock};
use fanout_compute::{
    Adam, Backend, CpuBackend, Mode, Model, ModelConfig, ModelKind, Optimizer, PaperSetting, Param,
    Sgd, Tensor,
};
use fanout_rand::Rng;

const BE: CpuBackend = CpuBackend;

fn param(value: &[f32], grad: &[f32]) -> Param<CpuBackend> {
    let mut p = Param::new(&BE, "p", &Tensor::new(1, value.len(), value.to_vec())).unwrap();
    p.grad = Tensor::new(1, grad.len(), grad.to_vec());
    p
}

#[test]
fn adam_matches_the_pytorch_update() {
    let mut p = param(&[1.0, -2.0, 0.5], &[0.3, -0.1, 0.0]);
    let mut opt = Adam::new(BE, 0.1).with_weight_decay(0.01);
    opt.step(&mut [&mut p]).unwrap();
    // Step 1: bias-corrected m = g', v = g'^2, so the update is lr * g' / (|g'| + eps).
    let want: Vec<f32> = [1.0f32, -2.0, 0.5]
        .iter()
        .zip([0.3f32, -0.1, 0.0])
        .map(|(&x, g)| {
            let g = g + 0.01 * x;
            x - 0.1 * g / (g.abs() + 1e-8)
        })
        .collect();
    assert!(p.value.max_abs_diff(&Tensor::new(1, 3, want.clone())) < 1e-6);
    // Step 2 with the same gradient, by the textbook formulas.
    opt.step(&mut [&mut p]).unwrap();
    let (b1, b2) = (0.9f64, 0.999f64);
    for i in 0..3 {
        let x0 = [1.0f64, -2.0, 0.5][i];
        let g = [0.3f64, -0.1, 0.0][i];
        let g1 = g + 0.01 * x0;
        let x1 = want[i] as f64;
        let g2 = g + 0.01 * x1;
        let m = b1 * (1.0 - b1) * g1 + (1.0 - b1) * g2;
        let v = b2 * (1.0 - b2) * g1 * g1 + (1.0 - b2) * g2 * g2;
        let (mh, vh) = (m / (1.0 - b1 * b1), v / (1.0 - b2 * b2));
        let x2 = x1 - 0.1 * mh / (vh.sqrt() + 1e-8);
        assert!(
            (p.value.data()[i] as f64 - x2).abs() < 1e-5,
            "coordinate {i}"
        );
    }
    assert_eq!(opt.steps(), 2);
    // A different parameter list is an error, not a silent mix-up.
    let mut q = param(&[1.0], &[1.0]);
    assert!(opt.step(&mut [&mut q]).is_err());
}

#[test]
fn sgd_with_weight_decay_and_momentum() {
    let mut p = param(&[1.0, -1.0], &[0.5, 0.5]);
    let mut opt = Sgd::new(BE, 0.1).with_weight_decay(0.1);
    opt.step(&mut [&mut p]).unwrap();
    assert!(p.value.max_abs_diff(&Tensor::new(1, 2, vec![0.94, -1.04])) < 1e-6);
    let mut p = param(&[0.0], &[1.0]);
    let mut opt = Sgd::new(BE, 0.1).with_momentum(0.9);
    opt.step(&mut [&mut p]).unwrap(); // buf = 1, x = -0.1
    opt.step(&mut [&mut p]).unwrap(); // buf = 1.9, x = -0.29
    assert!((p.value.data()[0] + 0.29).abs() < 1e-6);
}

/// A tiny graph: `n` vertices with 4 random in-neighbours plus a self-loop each, the first
/// `seeds` of them labelled at random with `classes` classes. Returns the two full-neighbourhood
/// blocks (outermost first: all vertices -> all vertices, all vertices -> seeds).
fn tiny_graph(n: usize, seeds: usize, rng: &mut Rng) -> (OwnedBlock, OwnedBlock) {
    let lists: Vec<Vec<u32>> = (0..n)
        .map(|v| {
            let mut l = vec![v as u32];
            l.extend((0..4).map(|_| rng.below(n as u64) as u32));
            l
        })
        .collect();
    let weights = |ls: &[Vec<u32>], rng: &mut Rng| {
        let e: usize = ls.iter().map(Vec::len).sum();
        (0..e).map(|_| 1.0 + rng.below(3) as f32).collect()
    };
    let w0 = weights(&lists, rng);
    let w1 = weights(&lists[..seeds], rng);
    (
        OwnedBlock::from_lists(n, &lists, Some(w0)),
        OwnedBlock::from_lists(n, &lists[..seeds], Some(w1)),
    )
}

/// Trains `kind` with Adam on the tiny graph; returns the step at which train accuracy first
/// reached 100% (checked every 5 steps), or `None`.
fn steps_to_overfit(kind: ModelKind, max_steps: usize) -> Option<usize> {
    let mut rng = Rng::new(2024);
    let (n, seeds, classes) = (60, 50, 4);
    let (b0, b1) = tiny_graph(n, seeds, &mut rng);
    let x = rand_tensor(n, 8, &mut rng);
    let labels: Vec<i64> = (0..seeds).map(|_| rng.below(classes) as i64).collect();
    let mut cfg = ModelConfig::new(kind, 8, 32, classes as usize, 2);
    cfg.dropout = 0.1;
    cfg.heads = 4;
    let mut model = Model::new(BE, cfg).unwrap();
    let blocks = model.prepare_blocks(&[b0.as_ref(), b1.as_ref()]).unwrap();
    let mut opt = Adam::new(BE, 0.01);
    for step in 0..max_steps {
        if step % 5 == 0 {
            let logits = model.forward(&blocks, x.clone(), Mode::Eval).unwrap();
            let (correct, total) = BE.accuracy(&logits, &labels).unwrap();
            assert_eq!(total, seeds);
            if correct == total {
                eprintln!("{kind:?}: 100% train accuracy after {step} Adam steps");
                return Some(step);
            }
        }
        let mode = Mode::Train {
            dropout_key: step as u64,
        };
        let logits = model.forward(&blocks, x.clone(), mode).unwrap();
        let ce = BE.softmax_cross_entropy(&logits, &labels).unwrap();
        model.zero_grad().unwrap();
        model.backward(&ce.grad).unwrap();
        opt.step_model(&mut model).unwrap();
    }
    None
}

#[test]
fn sage_overfits_a_tiny_graph() {
    let s = steps_to_overfit(ModelKind::Sage, 400);
    assert!(s.is_some(), "GraphSAGE did not reach 100% train accuracy");
}

#[test]
fn gcn_overfits_a_tiny_graph() {
    let s = steps_to_overfit(ModelKind::Gcn, 600);
    assert!(s.is_some(), "GCN did not reach 100% train accuracy");
}

#[test]
fn gat_gin_pinsage_overfit_a_tiny_graph() {
    for kind in [ModelKind::Gat, ModelKind::Gin, ModelKind::PinSage] {
        let s = steps_to_overfit(kind, 400);
        assert!(s.is_some(), "{kind:?} did not reach 100% train accuracy");
    }
}

#[test]
fn paper_settings_build_with_the_documented_shapes() {
    let s = PaperSetting::for_kind(ModelKind::Gcn, 100, 47);
    assert_eq!(s.fanouts, [15, 10, 5]);
    assert_eq!((s.batch_size, s.lr, s.model.hidden), (8000, 0.003, 256));
    let m = Model::new(BE, s.model).unwrap();
    assert_eq!(m.layers().len(), 3);
    assert_eq!(m.layers()[2].out_dim(), 47);
    let s = PaperSetting::for_kind(ModelKind::Sage, 100, 47);
    assert_eq!(
        (s.fanouts.as_slice(), s.model.num_layers),
        (&[10, 25][..], 2)
    );
    let gat = Model::new(BE, PaperSetting::for_kind(ModelKind::Gat, 100, 47).model).unwrap();
    assert_eq!(gat.layers()[0].out_dim(), 64);
    assert_eq!(gat.layers()[2].out_dim(), 47);
    let mut bad = ModelConfig::new(ModelKind::Gat, 10, 30, 3, 2);
    bad.heads = 8;
    assert!(Model::new(BE, bad).is_err());
    assert!(Model::new(BE, ModelConfig::new(ModelKind::Sage, 10, 30, 3, 0)).is_err());
}

#[test]
fn model_checks_the_block_chain() {
    let mut rng = Rng::new(3);
    let (b0, b1) = tiny_graph(20, 10, &mut rng);
    let mut model = Model::new(BE, ModelConfig::new(ModelKind::Sage, 4, 8, 3, 2)).unwrap();
    let blocks = model.prepare_blocks(&[b1.as_ref(), b0.as_ref()]).unwrap();
    let x = rand_tensor(20, 4, &mut rng);
    assert!(model.forward(&blocks, x.clone(), Mode::Eval).is_err());
    let blocks = model.prepare_blocks(&[b0.as_ref()]).unwrap();
    assert!(model.forward(&blocks, x, Mode::Eval).is_err());
    assert!(model.backward(&Tensor::zeros(10, 3)).is_err());
}
