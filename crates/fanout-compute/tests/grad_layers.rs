//! Finite-difference checks of every layer's input and parameter gradients, and of whole
//! models (dropout included) through the cross-entropy loss.

mod common;

use common::{assert_grad, check_grad, proj_loss, rand_tensor, OwnedBlock};
use fanout_compute::{
    Activation, AggregateOrder, Backend, CpuBackend, GatLayer, GcnLayer, GinLayer, HeadMerge,
    Layer, Mode, Model, ModelConfig, ModelKind, Pass, PinSageLayer, SageLayer, Tensor,
};
use fanout_rand::Rng;

type L = Box<dyn Layer<CpuBackend>>;

/// Checks d(sum(out * r))/d(h_src) and /d(every parameter) of `layer` on a random block.
fn check_layer(name: &str, mut layer: L, weighted: bool, seed: u64) {
    let mut rng = Rng::new(seed);
    let blk = OwnedBlock::random(5, 9, 4, weighted, &mut rng);
    let block = blk.prepare();
    jitter(
        layer.params_mut().into_iter().map(|p| &mut p.value),
        &mut rng,
    );
    let h = rand_tensor(blk.num_src, layer.in_dim(), &mut rng);
    let out = layer.forward(&block, h.clone(), Pass::TRAIN).unwrap();
    assert_eq!(
        out.shape(),
        (blk.num_dst, layer.out_dim()),
        "{name} output shape"
    );
    let r = rand_tensor(out.rows(), out.cols(), &mut rng);
    let dx = layer.backward(&r, true).unwrap().expect("input gradient");
    assert_grad(&format!("{name} d h_src"), h.data(), dx.data(), |v| {
        let hx = Tensor::new(h.rows(), h.cols(), v.to_vec());
        proj_loss(&layer.forward(&block, hx, Pass::Eval).unwrap(), &r)
    });
    let saved: Vec<(&'static str, Tensor, Tensor)> = layer
        .params()
        .iter()
        .map(|p| (p.name(), p.value.clone(), p.grad.clone()))
        .collect();
    // A first layer asks for no input gradient, and some layers then take another path to
    // their parameters' gradients (GraphSAGE's and GCN's through the backend's
    // `acc_at_b_shared_product`): the same values, up to rounding.
    for p in layer.params_mut() {
        p.grad = Tensor::zeros(p.grad.rows(), p.grad.cols());
    }
    layer.forward(&block, h.clone(), Pass::TRAIN).unwrap();
    assert!(
        layer.backward(&r, false).unwrap().is_none(),
        "{name}: no input gradient"
    );
    for (p, (pname, _, g)) in layer.params().iter().zip(&saved) {
        for (i, (x, y)) in p.grad.data().iter().zip(g.data()).enumerate() {
            let tol = 1e-5 * (1.0 + y.abs());
            assert!(
                (x - y).abs() <= tol,
                "{name} d {pname}[{i}] without d h_src: {x} vs {y}"
            );
        }
    }
    for (k, (pname, v0, g)) in saved.iter().enumerate() {
        assert_grad(&format!("{name} d {pname}"), v0.data(), g.data(), |v| {
            layer.params_mut()[k].value = Tensor::new(v0.rows(), v0.cols(), v.to_vec());
            proj_loss(&layer.forward(&block, h.clone(), Pass::Eval).unwrap(), &r)
        });
        layer.params_mut()[k].value = v0.clone();
    }
}

/// Moves every parameter off its initial value (biases start at exactly 0, which puts a ReLU
/// of an edgeless destination on its kink).
fn jitter<'a>(values: impl Iterator<Item = &'a mut Tensor>, rng: &mut Rng) {
    for v in values {
        v.data_mut()
            .iter_mut()
            .for_each(|x| *x += 0.3 * (rng.next_f32() * 2.0 - 1.0));
    }
}

fn rng(seed: u64) -> Rng {
    Rng::new(seed)
}

#[test]
fn sage_gradients_both_orders_and_activations() {
    for (i, order) in [AggregateOrder::AggregateFirst, AggregateOrder::ProjectFirst]
        .into_iter()
        .enumerate()
    {
        for act in [Activation::None, Activation::Relu] {
            let l = SageLayer::new(CpuBackend, 6, 5, act, &mut rng(1))
                .unwrap()
                .with_order(order);
            check_layer(
                &format!("sage {order:?} {act:?}"),
                Box::new(l),
                false,
                10 + i as u64,
            );
        }
    }
}

#[test]
fn gcn_gradients_both_orders() {
    for order in [AggregateOrder::AggregateFirst, AggregateOrder::ProjectFirst] {
        for act in [Activation::None, Activation::Relu] {
            let l = GcnLayer::new(CpuBackend, 6, 4, act, &mut rng(2))
                .unwrap()
                .with_order(order);
            check_layer(&format!("gcn {order:?} {act:?}"), Box::new(l), false, 20);
        }
    }
}

#[test]
fn gat_gradients_concat_and_mean() {
    for merge in [HeadMerge::Concat, HeadMerge::Mean] {
        for act in [Activation::None, Activation::Relu] {
            let l = GatLayer::new(CpuBackend, 5, 2, 3, merge, act, &mut rng(3)).unwrap();
            check_layer(&format!("gat {merge:?} {act:?}"), Box::new(l), false, 30);
        }
    }
}

#[test]
fn gat_aggregating_first_gives_the_projected_orders_values_and_gradients() {
    // A first layer (no input gradient) in both orders on one random block: the same output
    // and parameter gradients up to rounding, and the aggregate-first gradients checked
    // against finite differences. Blocks with more sources than destinations, several heads,
    // both merges and activations.
    for (k, (merge, act)) in [
        (HeadMerge::Concat, Activation::Relu),
        (HeadMerge::Concat, Activation::None),
        (HeadMerge::Mean, Activation::None),
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("gat aggregating first, {merge:?} {act:?}");
        let mut r0 = rng(70 + k as u64);
        let blk = OwnedBlock::random(5, 11, 4, false, &mut r0);
        let block = blk.prepare();
        let layer = |order| {
            let mut l = GatLayer::new(CpuBackend, 6, 3, 2, merge, act, &mut rng(7))
                .unwrap()
                .without_input_gradient()
                .with_order(order);
            jitter(
                l.params_mut().into_iter().map(|p| &mut p.value),
                &mut rng(8),
            );
            l
        };
        let (mut first, mut projected) = (
            layer(AggregateOrder::AggregateFirst),
            layer(AggregateOrder::ProjectFirst),
        );
        let h = rand_tensor(blk.num_src, 6, &mut r0);
        let out = first.forward(&block, h.clone(), Pass::TRAIN).unwrap();
        let want = projected.forward(&block, h.clone(), Pass::TRAIN).unwrap();
        assert_eq!(out.shape(), want.shape(), "{name}: output shape");
        for (i, (x, y)) in out.data().iter().zip(want.data()).enumerate() {
            assert!(
                (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
                "{name} out[{i}]: {x} vs {y}"
            );
        }
        let r = rand_tensor(out.rows(), out.cols(), &mut r0);
        assert!(first.backward(&r, false).unwrap().is_none(), "{name}");
        projected.backward(&r, false).unwrap();
        for (p, q) in first.params().iter().zip(projected.params()) {
            for (i, (x, y)) in p.grad.data().iter().zip(q.grad.data()).enumerate() {
                let tol = 1e-5 * (1.0 + y.abs());
                assert!(
                    (x - y).abs() <= tol,
                    "{name} d {}[{i}]: {x} vs {y}",
                    p.name()
                );
            }
        }
        let saved: Vec<(Tensor, Tensor)> = first
            .params()
            .iter()
            .map(|p| (p.value.clone(), p.grad.clone()))
            .collect();
        for (i, (v0, g)) in saved.iter().enumerate() {
            let pname = first.params()[i].name();
            assert_grad(&format!("{name} d {pname}"), v0.data(), g.data(), |v| {
                first.params_mut()[i].value = Tensor::new(v0.rows(), v0.cols(), v.to_vec());
                proj_loss(&first.forward(&block, h.clone(), Pass::Eval).unwrap(), &r)
            });
            first.params_mut()[i].value = v0.clone();
        }
        // Asked for an input gradient after all, it says so instead of returning a wrong one.
        first.forward(&block, h.clone(), Pass::TRAIN).unwrap();
        assert!(first.backward(&r, true).is_err(), "{name}: input gradient");
    }
}

#[test]
fn gin_gradients() {
    for act in [Activation::None, Activation::Relu] {
        let mut l = GinLayer::new(CpuBackend, 5, 7, 4, act, &mut rng(4)).unwrap();
        // A non-zero epsilon so that its gradient path is exercised away from the init.
        l.params_mut()[0].value = Tensor::scalar(0.3);
        check_layer(&format!("gin {act:?}"), Box::new(l), false, 40);
    }
}

#[test]
fn pinsage_gradients_weighted_with_and_without_normalisation() {
    for (act, normalize) in [(Activation::Relu, true), (Activation::None, false)] {
        let l = PinSageLayer::new(CpuBackend, 5, 6, 4, act, normalize, &mut rng(5)).unwrap();
        check_layer(&format!("pinsage norm={normalize}"), Box::new(l), true, 50);
    }
}

#[test]
fn checker_rejects_a_wrong_backward() {
    let mut r0 = rng(6);
    let blk = OwnedBlock::random(5, 9, 4, false, &mut r0);
    let block = blk.prepare();
    let mut layer = SageLayer::new(CpuBackend, 6, 5, Activation::None, &mut r0).unwrap();
    let h = rand_tensor(9, 6, &mut r0);
    let out = layer.forward(&block, h.clone(), Pass::TRAIN).unwrap();
    let r = rand_tensor(out.rows(), out.cols(), &mut r0);
    let dx = layer.backward(&r, true).unwrap().unwrap();
    let mut loss = |v: &[f32]| {
        let hx = Tensor::new(9, 6, v.to_vec());
        proj_loss(&layer.forward(&block, hx, Pass::Eval).unwrap(), &r)
    };
    assert!(check_grad("right", h.data(), dx.data(), &mut loss).is_ok());
    // A sign flip in the whole gradient.
    let flipped: Vec<f32> = dx.data().iter().map(|v| -v).collect();
    assert!(check_grad("flipped", h.data(), &flipped, &mut loss).is_err());
    // A backward that forgot the self term (only destination rows of the gradient change).
    let mut partial = dx.data().to_vec();
    partial[..5 * 6].iter_mut().for_each(|v| *v *= 0.5);
    assert!(check_grad("half self term", h.data(), &partial, &mut loss).is_err());
}

#[test]
fn gradients_accumulate_and_backward_needs_a_training_forward() {
    let mut r0 = rng(7);
    let blk = OwnedBlock::random(4, 7, 3, false, &mut r0);
    let block = blk.prepare();
    let mut layer = GcnLayer::new(CpuBackend, 3, 2, Activation::None, &mut r0).unwrap();
    let h = rand_tensor(7, 3, &mut r0);
    let g = Tensor::full(4, 2, 1.0);
    layer.forward(&block, h.clone(), Pass::TRAIN).unwrap();
    layer.backward(&g, false).unwrap();
    let once = layer.params()[0].grad.clone();
    assert!(layer.backward(&g, false).is_err(), "cache is consumed");
    layer.forward(&block, h.clone(), Pass::TRAIN).unwrap();
    layer.backward(&g, false).unwrap();
    let twice = &layer.params()[0].grad;
    let expect = Tensor::new(3, 2, once.data().iter().map(|v| 2.0 * v).collect());
    assert!(twice.max_abs_diff(&expect) < 1e-6);
    layer.forward(&block, h.clone(), Pass::Eval).unwrap();
    assert!(
        layer.backward(&g, false).is_err(),
        "eval forward caches nothing"
    );
    // Wrong input width is an error, not a panic.
    assert!(layer
        .forward(&block, rand_tensor(7, 4, &mut r0), Pass::TRAIN)
        .is_err());
}

/// Two blocks (outermost first): 10 sources -> 6 -> 4 seeds.
fn two_blocks(rng: &mut Rng, weighted: bool) -> Vec<OwnedBlock> {
    vec![
        OwnedBlock::random(6, 10, 3, weighted, rng),
        OwnedBlock::random(4, 6, 3, weighted, rng),
    ]
}

#[test]
fn model_gradients_through_cross_entropy_with_dropout() {
    let be = CpuBackend;
    for (i, kind) in [
        ModelKind::Sage,
        ModelKind::Gcn,
        ModelKind::Gat,
        ModelKind::Gin,
        ModelKind::PinSage,
    ]
    .into_iter()
    .enumerate()
    {
        let mut r0 = rng(100 + i as u64);
        let mut cfg = ModelConfig::new(kind, 5, 6, 3, 2);
        cfg.heads = 2;
        cfg.dropout = 0.3;
        cfg.seed = 9;
        let mut model = Model::new(be, cfg).unwrap();
        jitter(
            model.params_mut().into_iter().map(|p| &mut p.value),
            &mut r0,
        );
        let owned = two_blocks(&mut r0, kind == ModelKind::PinSage);
        let blocks: Vec<_> = owned.iter().map(OwnedBlock::prepare).collect();
        let x = rand_tensor(10, 5, &mut r0);
        let labels = [0i64, 2, -1, 1];
        let mode = Mode::Train { dropout_key: 77 };
        let logits = model.forward(&blocks, x.clone(), mode).unwrap();
        let ce = be.softmax_cross_entropy(&logits, &labels).unwrap();
        model.zero_grad().unwrap();
        model.backward(&ce.grad).unwrap();
        let saved: Vec<(String, Tensor, Tensor)> = model
            .named_params()
            .into_iter()
            .map(|(n, p)| (n, p.value.clone(), p.grad.clone()))
            .collect();
        for (k, (name, v0, g)) in saved.iter().enumerate() {
            assert_grad(
                &format!("{kind:?} model d {name}"),
                v0.data(),
                g.data(),
                |v| {
                    model.params_mut()[k].value = Tensor::new(v0.rows(), v0.cols(), v.to_vec());
                    let out = model.forward(&blocks, x.clone(), mode).unwrap();
                    be.softmax_cross_entropy(&out, &labels).unwrap().loss as f64
                },
            );
            model.params_mut()[k].value = v0.clone();
        }
    }
}
