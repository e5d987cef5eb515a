//! Finite-difference checks of every backend operation that has a backward.

mod common;

use common::{assert_grad, proj_loss, rand_tensor, OwnedBlock};
use fanout_compute::{Aggregation, Backend, CpuBackend, Tensor};
use fanout_rand::Rng;

const BE: CpuBackend = CpuBackend;

fn t(like: &Tensor, v: &[f32]) -> Tensor {
    Tensor::new(like.rows(), like.cols(), v.to_vec())
}

#[test]
fn aggregations_backward_for_every_kind() {
    let mut rng = Rng::new(1);
    let blk = OwnedBlock::random(6, 11, 4, true, &mut rng);
    let block = blk.prepare();
    let x = rand_tensor(11, 4, &mut rng);
    let r = rand_tensor(6, 4, &mut rng);
    for agg in [
        Aggregation::Sum,
        Aggregation::Mean,
        Aggregation::Weighted,
        Aggregation::WeightedMean,
        Aggregation::GcnBoth,
    ] {
        let dx = BE.aggregate_backward(&block, &r, agg).unwrap();
        assert_grad(&format!("{agg:?} d x"), x.data(), dx.data(), |v| {
            proj_loss(&BE.aggregate(&block, &t(&x, v), agg).unwrap(), &r)
        });
    }
}

#[test]
fn multi_head_spmm_backward_to_x_and_coefficients() {
    let mut rng = Rng::new(2);
    let blk = OwnedBlock::random(5, 8, 4, false, &mut rng);
    let block = blk.prepare();
    let heads = 3;
    let x = rand_tensor(8, heads * 2, &mut rng);
    let c = rand_tensor(blk.num_edges(), heads, &mut rng);
    let r = rand_tensor(5, heads * 2, &mut rng);
    let dx = BE.spmm_backward_x(&block, Some(&c), &r).unwrap();
    let dc = BE.spmm_backward_coeff(&block, &r, &x, heads).unwrap();
    assert_grad("spmm d x", x.data(), dx.data(), |v| {
        proj_loss(&BE.spmm(&block, Some(&c), &t(&x, v)).unwrap(), &r)
    });
    assert_grad("spmm d coeff", c.data(), dc.data(), |v| {
        proj_loss(&BE.spmm(&block, Some(&t(&c, v)), &x).unwrap(), &r)
    });
}

#[test]
fn fused_spmm_backward_gives_both_gradients_bit_for_bit() {
    fn bits(t: &Tensor) -> Vec<u32> {
        t.data().iter().map(|v| v.to_bits()).collect()
    }
    let mut rng = Rng::new(7);
    // Heads of 1-33 floats, rows below and above the kernels' vector widths; blocks with
    // repeated sources, sources without edges (num_src > sources drawn) and an edgeless
    // destination; more sources than one task's worth of edges.
    for (num_dst, num_src, max_deg, heads, f) in [
        (5, 8, 4, 1, 1),
        (9, 30, 6, 3, 5),
        (40, 200, 12, 8, 4),
        (300, 2000, 25, 8, 32),
        (50, 60, 30, 2, 33),
    ] {
        let blk = OwnedBlock::random(num_dst, num_src, max_deg, false, &mut rng);
        let block = blk.prepare();
        let x = rand_tensor(num_src, heads * f, &mut rng);
        let c = rand_tensor(blk.num_edges(), heads, &mut rng);
        let g = rand_tensor(num_dst, heads * f, &mut rng);
        let (dx, dc) = BE.spmm_backward(&block, &c, &g, &x).unwrap();
        let what = format!("{num_dst} x {num_src}, {heads} heads of {f}");
        assert_eq!(
            bits(&dx),
            bits(&BE.spmm_backward_x(&block, Some(&c), &g).unwrap()),
            "d x, {what}"
        );
        assert_eq!(
            bits(&dc),
            bits(&BE.spmm_backward_coeff(&block, &g, &x, heads).unwrap()),
            "d coeff, {what}"
        );
    }
}

#[test]
fn u_add_v_backward_is_edge_sums() {
    let mut rng = Rng::new(3);
    let blk = OwnedBlock::random(5, 8, 4, false, &mut rng);
    let block = blk.prepare();
    let el = rand_tensor(8, 2, &mut rng);
    let er = rand_tensor(5, 2, &mut rng);
    let r = rand_tensor(blk.num_edges(), 2, &mut rng);
    let del = BE.edge_sum_to_src(&block, &r).unwrap();
    let der = BE.edge_sum_to_dst(&block, &r).unwrap();
    assert_grad("u_add_v d el", el.data(), del.data(), |v| {
        proj_loss(&BE.u_add_v(&block, &t(&el, v), &er).unwrap(), &r)
    });
    assert_grad("u_add_v d er", er.data(), der.data(), |v| {
        proj_loss(&BE.u_add_v(&block, &el, &t(&er, v)).unwrap(), &r)
    });
}

#[test]
fn edge_softmax_backward() {
    let mut rng = Rng::new(4);
    let blk = OwnedBlock::random(6, 9, 5, false, &mut rng);
    let block = blk.prepare();
    let s = rand_tensor(blk.num_edges(), 2, &mut rng);
    let r = rand_tensor(blk.num_edges(), 2, &mut rng);
    let a = BE.edge_softmax(&block, &s).unwrap();
    let ds = BE.edge_softmax_backward(&block, &a, &r).unwrap();
    assert_grad("edge_softmax d scores", s.data(), ds.data(), |v| {
        proj_loss(&BE.edge_softmax(&block, &t(&s, v)).unwrap(), &r)
    });
}

#[test]
fn pointwise_and_row_ops_backward() {
    let mut rng = Rng::new(5);
    let x = rand_tensor(6, 8, &mut rng);
    let r = rand_tensor(6, 8, &mut rng);
    let out = BE.relu(&x).unwrap();
    assert_grad(
        "relu",
        x.data(),
        BE.relu_backward(&r, &out).unwrap().data(),
        |v| proj_loss(&BE.relu(&t(&x, v)).unwrap(), &r),
    );
    let g = BE.leaky_relu_backward(&r, &x, 0.2).unwrap();
    assert_grad("leaky_relu", x.data(), g.data(), |v| {
        proj_loss(&BE.leaky_relu(&t(&x, v), 0.2).unwrap(), &r)
    });
    let (y, norms) = BE.l2_normalize_rows(&x).unwrap();
    let g = BE.l2_normalize_rows_backward(&r, &y, &norms).unwrap();
    assert_grad("l2_normalize_rows", x.data(), g.data(), |v| {
        proj_loss(&BE.l2_normalize_rows(&t(&x, v)).unwrap().0, &r)
    });
    let (_, mask) = BE.dropout(&x, 0.4, 11, None).unwrap();
    assert_grad(
        "dropout",
        x.data(),
        BE.mul(&r, &mask).unwrap().data(),
        |v| proj_loss(&BE.dropout(&t(&x, v), 0.4, 11, None).unwrap().0, &r),
    );
    // Head ops: 2 heads of 4.
    let a = rand_tensor(2, 4, &mut rng);
    let rh = rand_tensor(6, 2, &mut rng);
    let (dx, da) = BE.head_dot_backward(&rh, &x, &a).unwrap();
    assert_grad("head_dot d x", x.data(), dx.data(), |v| {
        proj_loss(&BE.head_dot(&t(&x, v), &a).unwrap(), &rh)
    });
    assert_grad("head_dot d a", a.data(), da.data(), |v| {
        proj_loss(&BE.head_dot(&x, &t(&a, v)).unwrap(), &rh)
    });
    // Added in place into as many rows, or into the first rows of a taller tensor; heads of
    // 4 (rows of 8 floats, the scalar loops) and of 16 (rows of 64, the AVX loops).
    let bits = |t: &Tensor| t.data().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    for (heads, f) in [(2, 4), (4, 16)] {
        let xw = rand_tensor(6, heads * f, &mut rng);
        let aw = rand_tensor(heads, f, &mut rng);
        let gw = rand_tensor(6, heads, &mut rng);
        let (dxw, daw) = BE.head_dot_backward(&gw, &xw, &aw).unwrap();
        for extra in [0, 3] {
            let acc0 = rand_tensor(6 + extra, heads * f, &mut rng);
            let mut want = acc0.clone();
            BE.axpy_prefix(1.0, &dxw, &mut want, 6).unwrap();
            let mut got = acc0.clone();
            let da_acc = BE.head_dot_backward_acc(&gw, &xw, &aw, &mut got).unwrap();
            let what = format!("{heads} heads of {f}, {extra} rows more");
            assert_eq!(bits(&got), bits(&want), "head_dot_backward_acc d x, {what}");
            assert_eq!(
                bits(&da_acc),
                bits(&daw),
                "head_dot_backward_acc d a, {what}"
            );
        }
    }
    let rm = rand_tensor(6, 4, &mut rng);
    assert_grad(
        "head_mean",
        x.data(),
        BE.head_mean_backward(&rm, 2).unwrap().data(),
        |v| proj_loss(&BE.head_mean(&t(&x, v), 2).unwrap(), &rm),
    );
    // Bias: gradient is the column sums.
    let b = rand_tensor(1, 8, &mut rng);
    assert_grad(
        "add_bias d bias",
        b.data(),
        BE.sum_rows(&r).unwrap().data(),
        |v| {
            let mut y = x.clone();
            BE.add_bias(&mut y, &t(&b, v)).unwrap();
            proj_loss(&y, &r)
        },
    );
}

#[test]
fn matmul_backward() {
    let mut rng = Rng::new(6);
    let a = rand_tensor(5, 4, &mut rng);
    let w = rand_tensor(4, 3, &mut rng);
    let r = rand_tensor(5, 3, &mut rng);
    let da = BE.matmul(&r, false, &w, true).unwrap();
    let dw = BE.matmul(&a, true, &r, false).unwrap();
    assert_grad("matmul d a", a.data(), da.data(), |v| {
        proj_loss(&BE.matmul(&t(&a, v), false, &w, false).unwrap(), &r)
    });
    assert_grad("matmul d w", w.data(), dw.data(), |v| {
        proj_loss(&BE.matmul(&a, false, &t(&w, v), false).unwrap(), &r)
    });
}

#[test]
fn cross_entropy_backward() {
    let mut rng = Rng::new(7);
    let logits = rand_tensor(7, 4, &mut rng);
    let labels = [0i64, 3, -1, 2, 1, -1, 3];
    let ce = BE.softmax_cross_entropy(&logits, &labels).unwrap();
    assert_eq!(ce.count, 5);
    assert_grad("cross entropy", logits.data(), ce.grad.data(), |v| {
        BE.softmax_cross_entropy(&t(&logits, v), &labels)
            .unwrap()
            .loss as f64
    });
}

#[test]
fn gather_and_scatter_add_are_adjoint() {
    // <gather(x, idx), r> == <x, scatter_add(0, idx, r)>, so each is the other's backward.
    let mut rng = Rng::new(8);
    let x = rand_tensor(6, 3, &mut rng);
    let idx = [4u32, 0, 4, 5, 2, 4, 1];
    let r = rand_tensor(idx.len(), 3, &mut rng);
    let mut dx = Tensor::zeros(6, 3);
    BE.scatter_add_rows(&mut dx, &idx, &r).unwrap();
    assert_grad("gather_rows d x", x.data(), dx.data(), |v| {
        proj_loss(&BE.gather_rows(&t(&x, v), &idx).unwrap(), &r)
    });
    let r6 = rand_tensor(6, 3, &mut rng);
    let g = BE.gather_rows(&r6, &idx).unwrap();
    assert_grad("scatter_add_rows d x", r.data(), g.data(), |v| {
        let mut y = Tensor::zeros(6, 3);
        BE.scatter_add_rows(&mut y, &idx, &t(&r, v)).unwrap();
        proj_loss(&y, &r6)
    });
}
