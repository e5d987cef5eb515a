//! Which order a GAT layer computes in, read off the process-wide nominal-flop counter: one
//! test in its own binary, so no other test multiplies while it reads the counter.

mod common;

use common::{rand_tensor, OwnedBlock};
use fanout_compute::cpu::gemm::nominal_flops;
use fanout_compute::{
    Activation, AggregateOrder, CpuBackend, GatLayer, HeadMerge, Layer, Pass, Tensor,
};
use fanout_rand::Rng;

#[test]
fn gat_aggregates_first_only_where_it_may_and_it_pays() {
    let (heads, f, k) = (4, 16, 64);
    let new = || {
        GatLayer::new(
            CpuBackend,
            k,
            heads,
            f,
            HeadMerge::Concat,
            Activation::Relu,
            &mut Rng::new(9),
        )
        .unwrap()
    };
    let mut rng = Rng::new(80);
    // Many sources per destination: aggregating first multiplies 4 rows, not 200.
    let blk = OwnedBlock::random(4, 200, 40, false, &mut rng);
    let block = blk.prepare();
    let h = rand_tensor(200, k, &mut rng);
    let flops = |l: &mut GatLayer<CpuBackend>, h: &Tensor| {
        let before = nominal_flops();
        l.forward(&block, h.clone(), Pass::TRAIN).unwrap();
        nominal_flops() - before
    };
    let (s, d, hf) = (200u64, 4u64, (heads * f) as u64);
    let projected = 2 * s * k as u64 * hf;
    // The folded attention vectors' products (`in x H` each, over the sources and over the
    // destinations) and the destinations' per-head products.
    let folded = 2 * (s + d) * k as u64 * heads as u64;
    let aggregated = folded + 2 * d * k as u64 * hf;
    let mut first = new().without_input_gradient();
    assert_eq!(flops(&mut first, &h), aggregated, "auto, no input gradient");
    let mut forced = new()
        .without_input_gradient()
        .with_order(AggregateOrder::ProjectFirst);
    assert_eq!(flops(&mut forced, &h), projected, "forced to project first");
    let mut with_grad = new();
    assert_eq!(
        flops(&mut with_grad, &h),
        projected,
        "auto with an input gradient"
    );
    let mut impossible = new().with_order(AggregateOrder::AggregateFirst);
    assert!(impossible.forward(&block, h.clone(), Pass::TRAIN).is_err());

    // The backward of the aggregate-first order: the weight and aggregate gradients'
    // per-head products and the folded vectors' gradients.
    first.forward(&block, h.clone(), Pass::TRAIN).unwrap();
    let g = rand_tensor(4, heads * f, &mut rng);
    let before = nominal_flops();
    first.backward(&g, false).unwrap();
    let per_head = 2 * d * k as u64 * hf;
    assert_eq!(nominal_flops() - before, 2 * per_head + folded, "backward");

    // One source per destination: projecting first is cheaper, and Auto does.
    let blk = OwnedBlock::random(50, 50, 1, false, &mut rng);
    let block = blk.prepare();
    let h = rand_tensor(50, k, &mut rng);
    let mut first = new().without_input_gradient();
    let before = nominal_flops();
    first.forward(&block, h, Pass::TRAIN).unwrap();
    assert_eq!(
        nominal_flops() - before,
        2 * 50 * k as u64 * hf,
        "auto, sparse block"
    );
}
