//! The CUDA backend against the CPU backend on the same inputs: every `Backend` operation on
//! random tensors and blocks (edgeless destinations, repeated sources, weights), dropout masks
//! bit for bit, determinism, and whole models (forward, gradients, Adam steps) for every model
//! kind. Skips itself, printing why, where there is no GPU.
//!
//! Each test collects every mismatch before failing, so one run on a GPU reports them all.
#![cfg(feature = "cuda")]

mod common;
use common::gpu;
use fanout_compute::{
    Adam, AdamUpdate, Aggregation, Backend, BlockRef, CpuBackend, DropoutSpec, Mode, Model,
    ModelConfig, ModelKind, Optimizer, SgdUpdate, Tensor,
};
use fanout_cuda::{CudaBackend, GraphKernels};
use fanout_rand::Rng;

const CPU: CpuBackend = CpuBackend;

fn rand(rows: usize, cols: usize, rng: &mut Rng) -> Tensor {
    Tensor::from_fn(rows, cols, |_, _| rng.next_f32() * 2.0 - 1.0)
}

struct Owned {
    num_dst: usize,
    num_src: usize,
    indptr: Vec<u32>,
    indices: Vec<u32>,
    weights: Option<Vec<f32>>,
}

impl Owned {
    /// Destination 1 has no edge, destination 0 a self edge; repeated sources happen.
    fn random(num_dst: usize, num_src: usize, max_deg: u64, weighted: bool, rng: &mut Rng) -> Self {
        let (mut indptr, mut indices) = (vec![0u32], Vec::new());
        for d in 0..num_dst {
            let deg = if d == 1 { 0 } else { 1 + rng.below(max_deg) };
            for k in 0..deg {
                let s = if d == 0 && k == 0 {
                    0
                } else {
                    rng.below(num_src as u64) as u32
                };
                indices.push(s);
            }
            indptr.push(indices.len() as u32);
        }
        let weights = weighted.then(|| {
            (0..indices.len())
                .map(|_| 1.0 + rng.below(4) as f32)
                .collect()
        });
        Owned {
            num_dst,
            num_src,
            indptr,
            indices,
            weights,
        }
    }

    fn as_ref(&self) -> BlockRef<'_> {
        BlockRef {
            num_dst: self.num_dst,
            num_src: self.num_src,
            indptr: &self.indptr,
            indices: &self.indices,
            weights: self.weights.as_deref(),
        }
    }
}

/// Collected mismatches, reported together.
#[derive(Default)]
struct Report {
    failures: Vec<String>,
    checked: usize,
    bit_equal: usize,
}

impl Report {
    /// `got` (downloaded from the GPU) against `want` (CPU): same shape, every element within
    /// `tol * max(1, |want|)`, NaN where NaN.
    fn close(&mut self, what: &str, want: &Tensor, got: &Tensor, tol: f32) {
        self.checked += 1;
        if want.shape() != got.shape() {
            self.failures.push(format!(
                "{what}: shape {:?} != CPU {:?}",
                got.shape(),
                want.shape()
            ));
            return;
        }
        let mut worst = (0.0f32, 0usize);
        let mut bits = true;
        for (i, (&w, &g)) in want.data().iter().zip(got.data()).enumerate() {
            bits &= w.to_bits() == g.to_bits();
            let err = if w.is_nan() || g.is_nan() {
                if w.is_nan() && g.is_nan() {
                    0.0
                } else {
                    f32::INFINITY
                }
            } else {
                (w - g).abs() / w.abs().max(1.0)
            };
            if err > worst.0 {
                worst = (err, i);
            }
        }
        self.bit_equal += bits as usize;
        if worst.0 > tol {
            let i = worst.1;
            self.failures.push(format!(
                "{what}: element {i} is {} on the GPU, {} on the CPU (relative error {:.3e} > {tol:.0e})",
                got.data()[i],
                want.data()[i],
                worst.0
            ));
        }
    }

    fn same_bits(&mut self, what: &str, want: &Tensor, got: &Tensor) {
        self.checked += 1;
        if want != got {
            self.failures
                .push(format!("{what}: not bit for bit the CPU's"));
        } else {
            self.bit_equal += 1;
        }
    }

    fn finish(self, name: &str) {
        eprintln!(
            "{name}: {} comparisons, {} bit for bit the CPU's, {} failed",
            self.checked,
            self.bit_equal,
            self.failures.len()
        );
        assert!(
            self.failures.is_empty(),
            "{name}: {} mismatches:\n{}",
            self.failures.len(),
            self.failures.join("\n")
        );
    }
}

const TOL: f32 = 1e-5;
const GEMM_TOL: f32 = 1e-4;

#[test]
fn every_operation_matches_the_cpu_backend() {
    let Some(g) = gpu() else { return };
    let mut r = Report::default();
    let mut rng = Rng::new(7);
    let up = |t: &Tensor| g.upload(t).unwrap();
    let down = |t: &<CudaBackend as Backend>::Tensor| g.download(t).unwrap();

    // Memory.
    let x = rand(37, 19, &mut rng);
    r.same_bits("upload/download", &x, &down(&up(&x)));
    let mut z = up(&x);
    g.fill_zero(&mut z).unwrap();
    r.same_bits("fill_zero", &Tensor::zeros(37, 19), &down(&z));
    r.same_bits(
        "zeros",
        &Tensor::zeros(5, 3),
        &down(&g.zeros(5, 3).unwrap()),
    );
    r.same_bits(
        "empty",
        &Tensor::zeros(0, 4),
        &down(&up(&Tensor::zeros(0, 4))),
    );

    // Dense products, every transpose, beta 0 and 1, and the degenerate shapes.
    for &(m, k, n) in &[(1, 1, 1), (33, 17, 9), (128, 300, 64), (5, 0, 3), (0, 4, 2)] {
        for &(ta, tb) in &[(false, false), (true, false), (false, true), (true, true)] {
            let a = if ta {
                rand(k, m, &mut rng)
            } else {
                rand(m, k, &mut rng)
            };
            let b = if tb {
                rand(n, k, &mut rng)
            } else {
                rand(k, n, &mut rng)
            };
            let c0 = rand(m, n, &mut rng);
            for &beta in &[0.0f32, 1.0] {
                let mut cc = c0.clone();
                CPU.gemm(0.5, &a, ta, &b, tb, beta, &mut cc).unwrap();
                let mut gc = up(&c0);
                g.gemm(0.5, &up(&a), ta, &up(&b), tb, beta, &mut gc)
                    .unwrap();
                r.close(
                    &format!("gemm {m}x{k}x{n} ta={ta} tb={tb} beta={beta}"),
                    &cc,
                    &down(&gc),
                    GEMM_TOL,
                );
            }
        }
    }
    let (a, gr) = (rand(50, 12, &mut rng), rand(50, 7, &mut rng));
    let (mut c1, mut c2) = (rand(12, 7, &mut rng), rand(12, 7, &mut rng));
    let (mut d1, mut d2) = (up(&c1), up(&c2));
    CPU.acc_at_b_shared(&gr, &mut [(&a, &mut c1), (&a, &mut c2)])
        .unwrap();
    let ga = up(&a);
    g.acc_at_b_shared(&up(&gr), &mut [(&ga, &mut d1), (&ga, &mut d2)])
        .unwrap();
    r.close("acc_at_b_shared 1", &c1, &down(&d1), GEMM_TOL);
    r.close("acc_at_b_shared 2", &c2, &down(&d2), GEMM_TOL);

    // Element-wise and row operations, on a tensor with zeros and negative values.
    let mut x = rand(301, 67, &mut rng);
    x.data_mut()[3] = 0.0;
    x.data_mut()[4] = -0.0;
    let y = rand(301, 67, &mut rng);
    let bias = rand(1, 67, &mut rng);
    let (gx, gy, gb) = (up(&x), up(&y), up(&bias));
    let mut t = x.clone();
    CPU.add_bias(&mut t, &bias).unwrap();
    let mut u = g.copy(&gx).unwrap();
    g.add_bias(&mut u, &gb).unwrap();
    r.close("add_bias", &t, &down(&u), TOL);
    r.close(
        "sum_rows",
        &CPU.sum_rows(&x).unwrap(),
        &down(&g.sum_rows(&gx).unwrap()),
        TOL * 10.0,
    );
    r.close(
        "sum_rows 0 rows",
        &CPU.sum_rows(&Tensor::zeros(0, 3)).unwrap(),
        &down(&g.sum_rows(&g.zeros(0, 3).unwrap()).unwrap()),
        TOL,
    );
    let mut t = y.clone();
    CPU.axpy(-0.75, &x, &mut t).unwrap();
    let mut u = g.copy(&gy).unwrap();
    g.axpy(-0.75, &gx, &mut u).unwrap();
    r.close("axpy", &t, &down(&u), TOL);
    let small = rand(40, 67, &mut rng);
    let mut t = y.clone();
    CPU.axpy_prefix(2.0, &small, &mut t, 31).unwrap();
    let mut u = g.copy(&gy).unwrap();
    g.axpy_prefix(2.0, &up(&small), &mut u, 31).unwrap();
    r.close("axpy_prefix", &t, &down(&u), TOL);
    r.same_bits(
        "prefix_rows",
        &CPU.prefix_rows(&x, 100).unwrap(),
        &down(&g.prefix_rows(&gx, 100).unwrap()),
    );
    let mut t = x.clone();
    CPU.scale(&mut t, 1.5).unwrap();
    let mut u = g.copy(&gx).unwrap();
    g.scale(&mut u, 1.5).unwrap();
    r.close("scale", &t, &down(&u), TOL);
    r.close(
        "mul",
        &CPU.mul(&x, &y).unwrap(),
        &down(&g.mul(&gx, &gy).unwrap()),
        TOL,
    );
    let (p, s) = CPU.mul_sum_rows(&x, &y).unwrap();
    let (gp, gs) = g.mul_sum_rows(&gx, &gy).unwrap();
    r.close("mul_sum_rows product", &p, &down(&gp), TOL);
    r.close("mul_sum_rows sums", &s, &down(&gs), TOL * 10.0);
    let (dc, dg) = (CPU.dot(&x, &y).unwrap(), g.dot(&gx, &gy).unwrap());
    r.checked += 1;
    if (dc - dg).abs() > 1e-9 * dc.abs().max(1.0) {
        r.failures
            .push(format!("dot: {dg} on the GPU, {dc} on the CPU"));
    }
    let relu = CPU.relu(&x).unwrap();
    r.close("relu", &relu, &down(&g.relu(&gx).unwrap()), 0.0);
    r.close(
        "relu_backward",
        &CPU.relu_backward(&y, &relu).unwrap(),
        &down(&g.relu_backward(&gy, &up(&relu)).unwrap()),
        0.0,
    );
    r.close(
        "leaky_relu",
        &CPU.leaky_relu(&x, 0.2).unwrap(),
        &down(&g.leaky_relu(&gx, 0.2).unwrap()),
        TOL,
    );
    r.close(
        "leaky_relu_backward",
        &CPU.leaky_relu_backward(&y, &x, 0.2).unwrap(),
        &down(&g.leaky_relu_backward(&gy, &gx, 0.2).unwrap()),
        TOL,
    );

    // Dropout and the epilogue: masks bit for bit (with and without row ids).
    let ids: Vec<u32> = (0..301).map(|i| (i * 7919) % 100_003).collect();
    for (p, row_ids) in [(0.5f32, None), (0.3, Some(&ids[..])), (0.0, None)] {
        let (o, m) = CPU.dropout(&x, p, 99, row_ids).unwrap();
        let (go, gm) = g.dropout(&gx, p, 99, row_ids).unwrap();
        r.same_bits(
            &format!("dropout mask p={p} ids={}", row_ids.is_some()),
            &m,
            &down(&gm),
        );
        r.close(&format!("dropout output p={p}"), &o, &down(&go), 0.0);
    }
    for bias_on in [false, true] {
        for relu_on in [false, true] {
            for drop_on in [false, true] {
                for keep in [false, true] {
                    let spec = drop_on.then_some(DropoutSpec {
                        p: 0.4,
                        key: 5,
                        row_ids: Some(&ids),
                    });
                    let mut t = x.clone();
                    let fc = CPU
                        .epilogue(&mut t, bias_on.then_some(&bias), relu_on, spec, keep)
                        .unwrap();
                    let mut u = g.copy(&gx).unwrap();
                    let fg = g
                        .epilogue(&mut u, bias_on.then_some(&gb), relu_on, spec, keep)
                        .unwrap();
                    let what = format!(
                        "epilogue bias={bias_on} relu={relu_on} dropout={drop_on} keep={keep}"
                    );
                    r.close(&what, &t, &down(&u), 0.0);
                    match (fc, fg) {
                        (None, None) => {}
                        (Some(a), Some(b)) => {
                            r.close(&format!("{what} factor"), &a, &down(&b), 0.0)
                        }
                        (a, b) => r.failures.push(format!(
                            "{what}: factor {} on the CPU, {} on the GPU",
                            a.is_some(),
                            b.is_some()
                        )),
                    }
                }
            }
        }
    }

    // Row normalisation (a zero row included) and heads.
    let mut xz = x.clone();
    xz.data_mut()[67..134].fill(0.0);
    let (yc, nc) = CPU.l2_normalize_rows(&xz).unwrap();
    let (yg, ng) = g.l2_normalize_rows(&up(&xz)).unwrap();
    r.close("l2_normalize_rows y", &yc, &down(&yg), TOL);
    r.close("l2_normalize_rows norms", &nc, &down(&ng), TOL);
    r.close(
        "l2_normalize_rows_backward",
        &CPU.l2_normalize_rows_backward(&y, &yc, &nc).unwrap(),
        &down(
            &g.l2_normalize_rows_backward(&gy, &up(&yc), &up(&nc))
                .unwrap(),
        ),
        TOL * 10.0,
    );
    for &(heads, f) in &[(1usize, 67usize), (8, 4), (3, 33)] {
        let xh = rand(123, heads * f, &mut rng);
        let ah = rand(heads, f, &mut rng);
        let gh = rand(123, heads, &mut rng);
        let (gxh, gah, ggh) = (up(&xh), up(&ah), up(&gh));
        r.close(
            &format!("head_dot {heads}x{f}"),
            &CPU.head_dot(&xh, &ah).unwrap(),
            &down(&g.head_dot(&gxh, &gah).unwrap()),
            TOL,
        );
        let (dxc, dac) = CPU.head_dot_backward(&gh, &xh, &ah).unwrap();
        let (dxg, dag) = g.head_dot_backward(&ggh, &gxh, &gah).unwrap();
        r.close(
            &format!("head_dot_backward dx {heads}x{f}"),
            &dxc,
            &down(&dxg),
            TOL,
        );
        r.close(
            &format!("head_dot_backward da {heads}x{f}"),
            &dac,
            &down(&dag),
            TOL * 10.0,
        );
        let acc0 = rand(130, heads * f, &mut rng);
        let mut acc = acc0.clone();
        let dac2 = CPU.head_dot_backward_acc(&gh, &xh, &ah, &mut acc).unwrap();
        let mut gacc = up(&acc0);
        let dag2 = g
            .head_dot_backward_acc(&ggh, &gxh, &gah, &mut gacc)
            .unwrap();
        r.close(
            &format!("head_dot_backward_acc acc {heads}x{f}"),
            &acc,
            &down(&gacc),
            TOL,
        );
        r.close(
            &format!("head_dot_backward_acc da {heads}x{f}"),
            &dac2,
            &down(&dag2),
            TOL * 10.0,
        );
        r.close(
            &format!("head_mean {heads}x{f}"),
            &CPU.head_mean(&xh, heads).unwrap(),
            &down(&g.head_mean(&gxh, heads).unwrap()),
            TOL,
        );
        let gm = rand(123, f, &mut rng);
        r.close(
            &format!("head_mean_backward {heads}x{f}"),
            &CPU.head_mean_backward(&gm, heads).unwrap(),
            &down(&g.head_mean_backward(&up(&gm), heads).unwrap()),
            TOL,
        );
    }

    // Graph operations on random blocks (one edgeless).
    let blocks = [
        Owned::random(50, 120, 9, true, &mut rng),
        Owned::random(300, 900, 25, false, &mut rng),
        Owned::random(7, 7, 1, true, &mut rng),
        Owned {
            num_dst: 4,
            num_src: 6,
            indptr: vec![0; 5],
            indices: vec![],
            weights: None,
        },
    ];
    for (bi, ob) in blocks.iter().enumerate() {
        let br = ob.as_ref();
        let (cb, gbk) = (
            CPU.prepare_block(&br).unwrap(),
            g.prepare_block(&br).unwrap(),
        );
        assert_eq!(CPU.block_dims(&cb), g.block_dims(&gbk));
        let (s, d, e) = (ob.num_src, ob.num_dst, ob.indices.len());
        for agg in [
            Aggregation::Sum,
            Aggregation::Mean,
            Aggregation::Weighted,
            Aggregation::WeightedMean,
            Aggregation::GcnBoth,
        ] {
            let cc = CPU.edge_coefficients(&cb, agg).unwrap();
            let gc = g.edge_coefficients(&gbk, agg).unwrap();
            match (&cc, &gc) {
                (None, None) => {}
                (Some(a), Some(b)) => r.close(
                    &format!("block {bi} coefficients {agg:?}"),
                    a,
                    &down(b),
                    TOL,
                ),
                _ => r
                    .failures
                    .push(format!("block {bi} coefficients {agg:?}: Some/None differ")),
            }
            let xs = rand(s, 24, &mut rng);
            let gd = rand(d, 24, &mut rng);
            r.close(
                &format!("block {bi} aggregate {agg:?}"),
                &CPU.aggregate(&cb, &xs, agg).unwrap(),
                &down(&g.aggregate(&gbk, &up(&xs), agg).unwrap()),
                TOL,
            );
            r.close(
                &format!("block {bi} aggregate_backward {agg:?}"),
                &CPU.aggregate_backward(&cb, &gd, agg).unwrap(),
                &down(&g.aggregate_backward(&gbk, &up(&gd), agg).unwrap()),
                TOL,
            );
        }
        for heads in [1usize, 4] {
            let f = 6;
            let xs = rand(s, heads * f, &mut rng);
            let coeff = rand(e, heads, &mut rng);
            let gd = rand(d, heads * f, &mut rng);
            let (gxs, gco, ggd) = (up(&xs), up(&coeff), up(&gd));
            r.close(
                &format!("block {bi} spmm heads={heads}"),
                &CPU.spmm(&cb, Some(&coeff), &xs).unwrap(),
                &down(&g.spmm(&gbk, Some(&gco), &gxs).unwrap()),
                TOL,
            );
            r.close(
                &format!("block {bi} spmm_backward_x heads={heads}"),
                &CPU.spmm_backward_x(&cb, Some(&coeff), &gd).unwrap(),
                &down(&g.spmm_backward_x(&gbk, Some(&gco), &ggd).unwrap()),
                TOL,
            );
            r.close(
                &format!("block {bi} spmm_backward_coeff heads={heads}"),
                &CPU.spmm_backward_coeff(&cb, &gd, &xs, heads).unwrap(),
                &down(&g.spmm_backward_coeff(&gbk, &ggd, &gxs, heads).unwrap()),
                TOL,
            );
            let (dxc, dcc) = CPU.spmm_backward(&cb, &coeff, &gd, &xs).unwrap();
            let (dxg, dcg) = g.spmm_backward(&gbk, &gco, &ggd, &gxs).unwrap();
            r.close(
                &format!("block {bi} spmm_backward dx heads={heads}"),
                &dxc,
                &down(&dxg),
                TOL,
            );
            r.close(
                &format!("block {bi} spmm_backward dcoeff heads={heads}"),
                &dcc,
                &down(&dcg),
                TOL,
            );
            let el = rand(s, heads, &mut rng);
            let er = rand(d, heads, &mut rng);
            let sc = CPU.u_add_v(&cb, &el, &er).unwrap();
            r.close(
                &format!("block {bi} u_add_v"),
                &sc,
                &down(&g.u_add_v(&gbk, &up(&el), &up(&er)).unwrap()),
                TOL,
            );
            r.close(
                &format!("block {bi} edge_sum_to_src"),
                &CPU.edge_sum_to_src(&cb, &coeff).unwrap(),
                &down(&g.edge_sum_to_src(&gbk, &gco).unwrap()),
                TOL,
            );
            r.close(
                &format!("block {bi} edge_sum_to_dst"),
                &CPU.edge_sum_to_dst(&cb, &coeff).unwrap(),
                &down(&g.edge_sum_to_dst(&gbk, &gco).unwrap()),
                TOL,
            );
            let a = CPU.edge_softmax(&cb, &sc).unwrap();
            r.close(
                &format!("block {bi} edge_softmax"),
                &a,
                &down(&g.edge_softmax(&gbk, &up(&sc)).unwrap()),
                TOL,
            );
            r.close(
                &format!("block {bi} edge_softmax_backward"),
                &CPU.edge_softmax_backward(&cb, &a, &coeff).unwrap(),
                &down(&g.edge_softmax_backward(&gbk, &up(&a), &gco).unwrap()),
                TOL,
            );
        }
    }
    // Row gathers and scatters (repeated indices).
    let idx: Vec<u32> = (0..500).map(|_| rng.below(301) as u32).collect();
    r.same_bits(
        "gather_rows",
        &CPU.gather_rows(&x, &idx).unwrap(),
        &down(&g.gather_rows(&gx, &idx).unwrap()),
    );
    let src = rand(500, 67, &mut rng);
    let mut t = y.clone();
    CPU.scatter_add_rows(&mut t, &idx, &src).unwrap();
    let mut u = g.copy(&gy).unwrap();
    g.scatter_add_rows(&mut u, &idx, &up(&src)).unwrap();
    r.close("scatter_add_rows", &t, &down(&u), TOL);

    // Loss and metrics (unlabelled rows included).
    let logits = rand(200, 47, &mut rng);
    let labels: Vec<i64> = (0..200)
        .map(|i| if i % 7 == 3 { -1 } else { rng.below(47) as i64 })
        .collect();
    let ce = CPU.softmax_cross_entropy(&logits, &labels).unwrap();
    let cg = g.softmax_cross_entropy(&up(&logits), &labels).unwrap();
    r.checked += 1;
    if ce.count != cg.count || (ce.loss - cg.loss).abs() > 1e-6 * ce.loss.abs().max(1.0) {
        r.failures.push(format!(
            "softmax_cross_entropy: loss {} / {} rows on the GPU, {} / {} on the CPU",
            cg.loss, cg.count, ce.loss, ce.count
        ));
    }
    r.close("softmax_cross_entropy grad", &ce.grad, &down(&cg.grad), TOL);
    let bad = g.softmax_cross_entropy(&up(&logits), &[5; 200].map(|v: i64| v * 10));
    r.checked += 1;
    if bad.is_ok() {
        r.failures
            .push("softmax_cross_entropy accepted labels >= classes".into());
    }
    r.checked += 1;
    if CPU.accuracy(&logits, &labels).unwrap() != g.accuracy(&up(&logits), &labels).unwrap() {
        r.failures.push(format!(
            "accuracy: {:?} on the GPU, {:?} on the CPU",
            g.accuracy(&up(&logits), &labels).unwrap(),
            CPU.accuracy(&logits, &labels).unwrap()
        ));
    }

    // Optimiser updates.
    let (p0, g0, m0, v0) = (
        rand(20, 9, &mut rng),
        rand(20, 9, &mut rng),
        rand(20, 9, &mut rng),
        rand(20, 9, &mut rng).map_abs(),
    );
    let hp = AdamUpdate {
        lr: 0.01,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
        step: 3,
    };
    let (mut p, mut m, mut v) = (p0.clone(), m0.clone(), v0.clone());
    CPU.adam_update(&mut p, &g0, &mut m, &mut v, &hp).unwrap();
    let (mut gp, mut gm, mut gv) = (up(&p0), up(&m0), up(&v0));
    g.adam_update(&mut gp, &up(&g0), &mut gm, &mut gv, &hp)
        .unwrap();
    r.close("adam value", &p, &down(&gp), TOL);
    r.close("adam m", &m, &down(&gm), TOL);
    r.close("adam v", &v, &down(&gv), TOL);
    for momentum in [0.0f32, 0.9] {
        let hp = SgdUpdate {
            lr: 0.1,
            momentum,
            weight_decay: 0.001,
        };
        let (mut p, mut b) = (p0.clone(), m0.clone());
        CPU.sgd_update(&mut p, &g0, &mut b, &hp).unwrap();
        let (mut gp, mut gb) = (up(&p0), up(&m0));
        g.sgd_update(&mut gp, &up(&g0), &mut gb, &hp).unwrap();
        r.close(
            &format!("sgd value momentum={momentum}"),
            &p,
            &down(&gp),
            TOL,
        );
    }
    r.finish("every_operation_matches_the_cpu_backend");
}

trait MapAbs {
    fn map_abs(self) -> Self;
}
impl MapAbs for Tensor {
    fn map_abs(mut self) -> Self {
        self.data_mut().iter_mut().for_each(|v| *v = v.abs());
        self
    }
}

#[test]
fn gradients_to_sources_are_deterministic() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(3);
    let ob = Owned::random(2000, 5000, 30, false, &mut rng);
    let b = g.prepare_block(&ob.as_ref()).unwrap();
    let gd = g.upload(&rand(2000, 64, &mut rng)).unwrap();
    let first = g
        .download(&g.aggregate_backward(&b, &gd, Aggregation::GcnBoth).unwrap())
        .unwrap();
    for _ in 0..3 {
        assert_eq!(
            first,
            g.download(&g.aggregate_backward(&b, &gd, Aggregation::GcnBoth).unwrap())
                .unwrap()
        );
    }
}

/// The Memory-Aware aggregation, the warp row gather and the vectorised attention products
/// against the plain kernels and the CPU: the same bits, on rows of up to 100 edges (the kernel
/// stages edges 32 at a time), widths that leave lanes idle or take several passes (1 to 520
/// columns, 16-byte reads or not), 4 to 40 heads (heads of 1, 3, 5 and 6 columns inside or
/// across 16-byte reads, 32 heads filling 33 KiB of shared memory; more heads than the kernel
/// stages fall back to the plain one), forward and backward, and more destinations than one
/// grid covers;
/// gathered rows of aligned and unaligned widths, and device ids past the table giving zero
/// rows.
#[test]
fn memory_aware_kernels_equal_the_plain_ones() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(21);
    let mut r = Report::default();
    let both = |f: &dyn Fn() -> <CudaBackend as Backend>::Tensor| {
        g.set_graph_kernels(GraphKernels::Plain);
        let plain = g.download(&f()).unwrap();
        g.set_graph_kernels(GraphKernels::MemoryAware);
        (plain, g.download(&f()).unwrap())
    };
    for (bi, max_deg) in [1u64, 31, 100].into_iter().enumerate() {
        let ob = Owned::random(700, 900, max_deg, false, &mut rng);
        let cb = CPU.prepare_block(&ob.as_ref()).unwrap();
        let gb = g.prepare_block(&ob.as_ref()).unwrap();
        let edges = ob.indices.len();
        for (cols, heads) in [
            (1, 0),
            (31, 0),
            (100, 0),
            (256, 0),
            (300, 0),
            (12, 4),
            (256, 4),
            (48, 8),
            (40, 8),
            (32, 32),
            (96, 32),
            (520, 40),
        ] {
            let what = format!("block {bi} (up to {max_deg} edges), {cols} columns, {heads} heads");
            let x = rand(900, cols, &mut rng);
            let gd = rand(700, cols, &mut rng);
            let coeff = (heads > 0).then(|| rand(edges, heads, &mut rng));
            let (gx, ggd) = (g.upload(&x).unwrap(), g.upload(&gd).unwrap());
            let gco = coeff.as_ref().map(|c| g.upload(c).unwrap());
            let (plain, ma) = both(&|| g.spmm(&gb, gco.as_ref(), &gx).unwrap());
            r.same_bits(&format!("{what}: spmm memory-aware = plain"), &plain, &ma);
            r.close(
                &format!("{what}: spmm memory-aware"),
                &CPU.spmm(&cb, coeff.as_ref(), &x).unwrap(),
                &ma,
                TOL,
            );
            let (plain, ma) = both(&|| g.spmm_backward_x(&gb, gco.as_ref(), &ggd).unwrap());
            r.same_bits(
                &format!("{what}: spmm backward memory-aware = plain"),
                &plain,
                &ma,
            );
            r.close(
                &format!("{what}: spmm backward memory-aware"),
                &CPU.spmm_backward_x(&cb, coeff.as_ref(), &gd).unwrap(),
                &ma,
                TOL,
            );
            if heads > 0 {
                let (plain, ma) = both(&|| g.spmm_backward_coeff(&gb, &ggd, &gx, heads).unwrap());
                r.same_bits(
                    &format!("{what}: coefficient gradient, vectorised = plain"),
                    &plain,
                    &ma,
                );
                r.close(
                    &format!("{what}: coefficient gradient, vectorised"),
                    &CPU.spmm_backward_coeff(&cb, &gd, &x, heads).unwrap(),
                    &ma,
                    TOL,
                );
                let a = rand(heads, cols / heads, &mut rng);
                let ga = g.upload(&a).unwrap();
                let (plain, ma) = both(&|| g.head_dot(&gx, &ga).unwrap());
                r.same_bits(
                    &format!("{what}: head_dot, vectorised = plain"),
                    &plain,
                    &ma,
                );
                r.close(
                    &format!("{what}: head_dot, vectorised"),
                    &CPU.head_dot(&x, &a).unwrap(),
                    &ma,
                    TOL,
                );
            }
        }
    }
    // More destinations than one grid covers (65,536 blocks x 8 warps): the rows loop.
    let ob = Owned::random(600_000, 700_000, 3, false, &mut rng);
    let (cb, gb) = (
        CPU.prepare_block(&ob.as_ref()).unwrap(),
        g.prepare_block(&ob.as_ref()).unwrap(),
    );
    let (x, coeff) = (
        rand(700_000, 8, &mut rng),
        rand(ob.indices.len(), 2, &mut rng),
    );
    let (gx, gco) = (g.upload(&x).unwrap(), g.upload(&coeff).unwrap());
    let (plain, ma) = both(&|| g.spmm(&gb, Some(&gco), &gx).unwrap());
    r.same_bits(
        "600,000 destinations: spmm memory-aware = plain",
        &plain,
        &ma,
    );
    r.close(
        "600,000 destinations: spmm memory-aware",
        &CPU.spmm(&cb, Some(&coeff), &x).unwrap(),
        &ma,
        TOL,
    );
    for cols in [3usize, 100, 128] {
        let x = rand(5000, cols, &mut rng);
        let gx = g.upload(&x).unwrap();
        let ids: Vec<u32> = (0..3000).map(|_| rng.below(5000) as u32).collect();
        let (plain, warp) = both(&|| g.gather_rows(&gx, &ids).unwrap());
        r.same_bits(
            &format!("gather_rows {cols} columns: warp = plain"),
            &plain,
            &warp,
        );
        r.same_bits(
            &format!("gather_rows {cols} columns: the CPU's"),
            &CPU.gather_rows(&x, &ids).unwrap(),
            &warp,
        );
        let mut past = ids.clone();
        past[7] = 5000;
        past[2999] = u32::MAX;
        let got = g
            .download(
                &g.gather_rows_device(&gx, &g.upload_ids(&past).unwrap(), past.len())
                    .unwrap(),
            )
            .unwrap();
        let mut want = CPU.gather_rows(&x, &ids).unwrap();
        for row in [7, 2999] {
            want.data_mut()[row * cols..(row + 1) * cols].fill(0.0);
        }
        r.same_bits(
            &format!("gather_rows_device {cols} columns, ids past the table"),
            &want,
            &got,
        );
        let mapped = g
            .map_host_rows(5000, cols, &mut |t| t.copy_from_slice(x.data()))
            .expect("maps")
            .expect("page-locked memory");
        r.same_bits(
            &format!("gather_mapped_rows {cols} columns: the CPU's"),
            &CPU.gather_rows(&x, &ids).unwrap(),
            &g.download(&g.gather_mapped_rows(&mapped, &ids, None).unwrap())
                .unwrap(),
        );
    }
    r.finish("memory_aware_kernels_equal_the_plain_ones");
}

/// The zero-copy gather runs on the backend's side stream: the backend stream's first reader
/// of its rows must wait for it, whether that stream is idle (the reader would otherwise start
/// at once, beside a gather still crossing the bus) or busy with earlier work (the gather then
/// overlaps it). Each round gathers 200,000 rows over the bus (80 MB, milliseconds) and reads
/// them at once on the backend stream with a row gather; a reader that did not wait sees rows
/// not yet written. The rows' buffers are freed and reused between rounds, across the streams.
#[test]
fn side_stream_gather_is_ordered_before_its_readers() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(29);
    let (rows, cols) = (500_000usize, 100usize);
    let x = rand(rows, cols, &mut rng);
    let mapped = g
        .map_host_rows(rows, cols, &mut |t| t.copy_from_slice(x.data()))
        .expect("maps")
        .expect("page-locked memory");
    let big = rand(2048, 2048, &mut rng);
    let gbig = g.upload(&big).unwrap();
    let mut r = Report {
        failures: Vec::new(),
        checked: 0,
        bit_equal: 0,
    };
    for round in 0..8 {
        let ids: Vec<u32> = (0..200_000)
            .map(|_| rng.below(rows as u64) as u32)
            .collect();
        let again: Vec<u32> = (0..50_000).map(|_| rng.below(200_000) as u32).collect();
        let busy = round % 2 == 1;
        if busy {
            // Queued ahead on the backend stream: the gather overlaps these products.
            for _ in 0..4 {
                std::hint::black_box(g.matmul(&gbig, false, &gbig, false).unwrap());
            }
        }
        let gathered = g.gather_mapped_rows(&mapped, &ids, None).unwrap();
        let read = g.gather_rows(&gathered, &again).unwrap();
        drop(gathered);
        let want = CPU
            .gather_rows(&CPU.gather_rows(&x, &ids).unwrap(), &again)
            .unwrap();
        r.same_bits(
            &format!(
                "round {round} ({}): rows read on the backend stream",
                if busy { "busy" } else { "idle" }
            ),
            &want,
            &g.download(&read).unwrap(),
        );
    }
    r.finish("side_stream_gather_is_ordered_before_its_readers");
}

/// `loss_and_accuracy` (both figures read back at once) gives the loss of
/// `softmax_cross_entropy` on the same GPU bit for bit, its gradient, and the CPU's correct
/// count, with unlabelled rows and with none labelled.
#[test]
fn loss_and_accuracy_in_one_read() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(13);
    for (rows, classes, unlabelled) in [(8000usize, 47usize, 3usize), (5, 3, 0), (40, 9, 40)] {
        let x = rand(rows, classes, &mut rng);
        let labels: Vec<i64> = (0..rows)
            .map(|r| {
                if r % 7 == 0 && r / 7 < unlabelled {
                    -1
                } else {
                    rng.below(classes as u64) as i64
                }
            })
            .collect();
        let gx = g.upload(&x).unwrap();
        let (ce, correct) = g.loss_and_accuracy(&gx, &labels).unwrap();
        let apart = g.softmax_cross_entropy(&gx, &labels).unwrap();
        assert_eq!(
            ce.loss.to_bits(),
            apart.loss.to_bits(),
            "{rows} x {classes}: loss"
        );
        assert_eq!(ce.count, apart.count);
        assert_eq!(
            g.download(&ce.grad).unwrap(),
            g.download(&apart.grad).unwrap(),
            "{rows} x {classes}: gradient"
        );
        let (want, labelled) = CPU.accuracy(&x, &labels).unwrap();
        assert_eq!(
            (correct, ce.count),
            (want, labelled),
            "{rows} x {classes}: accuracy"
        );
        let cpu = CPU.softmax_cross_entropy(&x, &labels).unwrap();
        assert!(
            (ce.loss - cpu.loss).abs() <= 1e-5 * cpu.loss.abs().max(1.0),
            "{rows} x {classes}: {} vs CPU {}",
            ce.loss,
            cpu.loss
        );
    }
    let none = vec![-1i64; 6];
    let gx = g.upload(&rand(6, 4, &mut rng)).unwrap();
    let (ce, correct) = g.loss_and_accuracy(&gx, &none).unwrap();
    assert_eq!((ce.loss, ce.count, correct), (0.0, 0, 0));
    assert!(
        g.loss_and_accuracy(&gx, &[0, 1, 2, 3, 4, 5]).is_err(),
        "label 4 and 5 of 4 classes"
    );
}

/// A step read late: the figures left on the device are `loss_and_accuracy`'s (loss bit for
/// bit, the count), reads started behind queued work and finished later (more at once than
/// the backend keeps buffers for) give the tensors, the gate is marked by NaN and infinity in
/// their slots and stays marked, and the gated optimiser kernels skip exactly while it is.
#[test]
fn steps_read_late_give_what_steps_read_at_once_do() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(17);
    for (rows, classes) in [(8000usize, 47usize), (5, 3)] {
        let x = rand(rows, classes, &mut rng);
        let labels: Vec<i64> = (0..rows)
            .map(|r| {
                if r % 5 == 1 {
                    -1
                } else {
                    rng.below(classes as u64) as i64
                }
            })
            .collect();
        let gx = g.upload(&x).unwrap();
        let (ce, correct) = g.loss_and_accuracy(&gx, &labels).unwrap();
        let f = g.loss_and_accuracy_on_device(&gx, &labels).unwrap();
        let read = g.finish_read(g.read_later(&f.figures).unwrap()).unwrap();
        assert_eq!(read.data()[0].to_bits(), ce.loss.to_bits(), "{rows}: loss");
        assert_eq!(read.data()[1], correct as f32, "{rows}: correct");
        assert_eq!(f.count, ce.count);
        assert_eq!(
            g.download(&f.grad).unwrap(),
            g.download(&ce.grad).unwrap(),
            "{rows}: gradient"
        );
    }
    // Twelve reads outstanding at once, each behind a product queued after the one before.
    let a = g.upload(&rand(512, 512, &mut rng)).unwrap();
    let hosts: Vec<Tensor> = (0..12).map(|k| rand(1 + k, 3 + k, &mut rng)).collect();
    let reads: Vec<_> = hosts
        .iter()
        .map(|h| {
            let _busy = g.matmul(&a, false, &a, false).unwrap();
            g.read_later(&g.upload(h).unwrap()).unwrap()
        })
        .collect();
    for (h, r) in hosts.iter().zip(reads) {
        assert_eq!(&g.finish_read(r).unwrap(), h, "a read started late");
    }
    // The gate and the gated updates, against the CPU's defaults.
    let mut gate = g.zeros(1, 4).unwrap();
    let p0 = rand(3, 5, &mut rng);
    let grad = rand(3, 5, &mut rng);
    let hp = AdamUpdate {
        lr: 0.1,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
        step: 1,
    };
    let sgd = SgdUpdate {
        lr: 0.1,
        momentum: 0.9,
        weight_decay: 0.0,
    };
    let adam_gated = |gate: &_| {
        let (mut p, mut m, mut v) = (
            g.upload(&p0).unwrap(),
            g.zeros(3, 5).unwrap(),
            g.zeros(3, 5).unwrap(),
        );
        g.adam_update_gated(&mut p, &g.upload(&grad).unwrap(), &mut m, &mut v, &hp, gate)
            .unwrap();
        let mut b = g.zeros(3, 5).unwrap();
        let mut q = g.upload(&p0).unwrap();
        g.sgd_update_gated(&mut q, &g.upload(&grad).unwrap(), &mut b, &sgd, gate)
            .unwrap();
        (g.download(&p).unwrap(), g.download(&q).unwrap())
    };
    let (mut cp, mut cm, mut cv, mut cb) = (
        p0.clone(),
        Tensor::zeros(3, 5),
        Tensor::zeros(3, 5),
        Tensor::zeros(3, 5),
    );
    CPU.adam_update(&mut cp, &grad, &mut cm, &mut cv, &hp)
        .unwrap();
    let mut cq = p0.clone();
    CPU.sgd_update(&mut cq, &grad, &mut cb, &sgd).unwrap();
    assert_eq!(
        adam_gated(&gate),
        (cp, cq),
        "an open gate updates as the CPU does"
    );
    g.mark_non_finite(&g.upload(&rand(40, 40, &mut rng)).unwrap(), &mut gate, 0)
        .unwrap();
    assert_eq!(
        g.download(&gate).unwrap().data(),
        &[0.0; 4],
        "finite values mark nothing"
    );
    let mut bad = rand(100, 7, &mut rng);
    bad.data_mut()[333] = f32::NAN;
    g.mark_non_finite(&g.upload(&bad).unwrap(), &mut gate, 2)
        .unwrap();
    let marked = g.download(&gate).unwrap();
    assert_eq!(
        (marked.data()[0], marked.data()[1], marked.data()[2]),
        (1.0, 0.0, 0.0)
    );
    assert!(marked.data()[3].is_nan(), "slot 2 holds the NaN");
    let mut inf = rand(1, 9, &mut rng);
    inf.data_mut()[8] = f32::NEG_INFINITY;
    g.mark_non_finite(&g.upload(&inf).unwrap(), &mut gate, 0)
        .unwrap();
    let marked = g.download(&gate).unwrap();
    assert_eq!(marked.data()[..2], [1.0, f32::NEG_INFINITY]);
    assert_eq!(adam_gated(&gate), (p0.clone(), p0), "a marked gate skips");
}

/// GIN's eps without a read back: `axpy_prefix_one_plus` is `axpy_prefix` with `1 + s` bit for
/// bit (and the CPU's), `add_dot` adds `dot` rounded to f32 bit for bit.
#[test]
fn gin_eps_stays_on_the_device() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(17);
    for eps in [0.0f32, 0.37, -1.25, 1e-7] {
        let s = Tensor::scalar(eps);
        let x = rand(50, 9, &mut rng);
        let y = rand(60, 9, &mut rng);
        let (gs, gx) = (g.upload(&s).unwrap(), g.upload(&x).unwrap());
        let mut on_device = g.upload(&y).unwrap();
        g.axpy_prefix_one_plus(&gs, &gx, &mut on_device, 30)
            .unwrap();
        let mut read = g.upload(&y).unwrap();
        g.axpy_prefix(1.0 + eps, &gx, &mut read, 30).unwrap();
        let mut cpu = y.clone();
        CPU.axpy_prefix(1.0 + eps, &x, &mut cpu, 30).unwrap();
        assert_eq!(
            g.download(&on_device).unwrap(),
            g.download(&read).unwrap(),
            "eps {eps}"
        );
        assert_eq!(g.download(&on_device).unwrap(), cpu, "eps {eps}: the CPU's");
        let (a, b) = (rand(1000, 37, &mut rng), rand(1000, 37, &mut rng));
        let (ga, gb) = (g.upload(&a).unwrap(), g.upload(&b).unwrap());
        let mut acc = g.upload(&s).unwrap();
        g.add_dot(&ga, &gb, &mut acc).unwrap();
        let want = eps + 1.0 * (g.dot(&ga, &gb).unwrap() as f32);
        assert_eq!(
            g.download(&acc).unwrap().data()[0].to_bits(),
            want.to_bits(),
            "eps {eps}: add_dot"
        );
    }
}

/// `all_finite` finds a NaN, an infinity or a negative infinity in any of several tensors,
/// wherever it is, as the CPU backend does; finite tensors (huge values, negative zeros,
/// subnormals) pass.
#[test]
fn all_finite_finds_every_non_finite_value() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(8);
    let mut host: Vec<Tensor> = vec![
        rand(300, 7, &mut rng),
        rand(1, 1, &mut rng),
        rand(5000, 33, &mut rng),
    ];
    host[0].data_mut()[5] = f32::MAX;
    host[0].data_mut()[6] = -0.0;
    host[2].data_mut()[9] = f32::MIN_POSITIVE / 4.0;
    let check = |h: &[Tensor]| {
        let up: Vec<_> = h.iter().map(|t| g.upload(t).unwrap()).collect();
        let want = CPU.all_finite(&h.iter().collect::<Vec<_>>()).unwrap();
        assert_eq!(g.all_finite(&up.iter().collect::<Vec<_>>()).unwrap(), want);
        want
    };
    assert!(check(&host), "finite tensors");
    for (t, at, bad) in [
        (0, 0, f32::NAN),
        (1, 0, f32::INFINITY),
        (2, 5000 * 33 - 1, f32::NEG_INFINITY),
        (2, 77, -f32::NAN),
    ] {
        let mut h = host.clone();
        h[t].data_mut()[at] = bad;
        assert!(!check(&h), "{bad} in tensor {t} at {at}");
    }
    assert!(g.all_finite(&[]).unwrap(), "no tensor");
}

/// Uploads of every size around the page-locked staging ring's bounds (64 KiB and more go
/// through it, above 32 MiB in 32 MiB chunks that take several of its buffers, more than it
/// has for the largest), more of them than the ring has buffers and all queued before any is
/// read back, arrive whole and in order: a buffer reused before its copy finished would show.
#[test]
fn uploads_through_the_staging_ring_arrive_whole() {
    let Some(g) = gpu() else { return };
    let floats = |bytes: usize| bytes / 4;
    let sizes = [
        floats(64 << 10) - 1,
        floats(64 << 10),
        floats(1 << 20) + 3,
        7,
        floats(32 << 20),
        floats(32 << 20) + 1,
        floats(3 << 20),
        floats(200 << 10),
        floats(5 << 20),
        floats(64 << 10) + 5,
        floats(9 << 20),
        floats(150 << 20) + 3,
        floats(1 << 20),
        floats(64 << 20),
        floats(70 << 20) + 1,
    ];
    let hosts: Vec<Tensor> = sizes
        .iter()
        .enumerate()
        .map(|(k, &n)| Tensor::from_fn(1, n, |_, c| (k * 1_000_003 + c) as f32))
        .collect();
    let on_device: Vec<_> = hosts.iter().map(|t| g.upload(t).unwrap()).collect();
    for (k, (h, d)) in hosts.iter().zip(&on_device).enumerate() {
        assert_eq!(
            &g.download(d).unwrap(),
            h,
            "upload {k} of {} floats",
            sizes[k]
        );
    }
}

/// Two layers of one kind on a small graph, trained for a few Adam steps with dropout on both
/// backends: logits, loss, every parameter gradient of the first step, and the parameters after
/// the last step agree.
#[test]
fn models_train_as_on_the_cpu() {
    let Some(g) = gpu() else { return };
    let mut r = Report::default();
    let mut rng = Rng::new(11);
    let (n, seeds, classes, in_dim) = (200, 64, 5, 16);
    let lists: Vec<Vec<u32>> = (0..n)
        .map(|v| {
            let mut l = vec![v as u32];
            l.extend((0..1 + rng.below(6)).map(|_| rng.below(n as u64) as u32));
            l
        })
        .collect();
    let block = |ls: &[Vec<u32>], rng: &mut Rng| {
        let (mut indptr, mut indices) = (vec![0u32], Vec::new());
        for l in ls {
            indices.extend_from_slice(l);
            indptr.push(indices.len() as u32);
        }
        let w = (0..indices.len())
            .map(|_| 1.0 + rng.below(3) as f32)
            .collect();
        Owned {
            num_dst: ls.len(),
            num_src: n,
            indptr,
            indices,
            weights: Some(w),
        }
    };
    let b0 = block(&lists, &mut rng);
    let b1 = block(&lists[..seeds], &mut rng);
    let b1 = Owned { num_src: n, ..b1 };
    let x = rand(n, in_dim, &mut rng);
    let labels: Vec<i64> = (0..seeds).map(|_| rng.below(classes) as i64).collect();
    for kind in ModelKind::ALL {
        let mut cfg = ModelConfig::new(kind, in_dim, 32, classes as usize, 2);
        cfg.dropout = 0.2;
        cfg.heads = 4;
        let mut mc = Model::new(CPU, cfg.clone()).unwrap();
        let mut mg = Model::new(g.clone(), cfg).unwrap();
        let bc = mc.prepare_blocks(&[b0.as_ref(), b1.as_ref()]).unwrap();
        let bg = mg.prepare_blocks(&[b0.as_ref(), b1.as_ref()]).unwrap();
        let (mut oc, mut og) = (Adam::new(CPU, 0.01), Adam::new(g.clone(), 0.01));
        let gx = g.upload(&x).unwrap();
        for step in 0..4u64 {
            let mode = Mode::Train { dropout_key: step };
            let lc = mc.forward(&bc, x.clone(), mode).unwrap();
            let lg = mg.forward(&bg, g.copy(&gx).unwrap(), mode).unwrap();
            r.close(
                &format!("{kind:?} step {step} logits"),
                &lc,
                &g.download(&lg).unwrap(),
                1e-4,
            );
            let cc = CPU.softmax_cross_entropy(&lc, &labels).unwrap();
            let cg = g.softmax_cross_entropy(&lg, &labels).unwrap();
            r.checked += 1;
            if (cc.loss - cg.loss).abs() > 1e-4 * cc.loss.abs().max(1.0) {
                r.failures.push(format!(
                    "{kind:?} step {step}: loss {} on the GPU, {} on the CPU",
                    cg.loss, cc.loss
                ));
            }
            mc.zero_grad().unwrap();
            mg.zero_grad().unwrap();
            mc.backward(&cc.grad).unwrap();
            mg.backward(&cg.grad).unwrap();
            if step == 0 {
                for ((name, pc), (_, pg)) in mc.named_params().into_iter().zip(mg.named_params()) {
                    r.close(
                        &format!("{kind:?} gradient of {name}"),
                        &pc.grad,
                        &g.download(&pg.grad).unwrap(),
                        1e-3,
                    );
                }
            }
            oc.step_model(&mut mc).unwrap();
            og.step_model(&mut mg).unwrap();
        }
        for ((name, pc), (_, pg)) in mc.named_params().into_iter().zip(mg.named_params()) {
            r.close(
                &format!("{kind:?} {name} after 4 steps"),
                &pc.value,
                &g.download(&pg.value).unwrap(),
                1e-3,
            );
        }
        let (ec, eg) = (
            mc.forward(&bc, x.clone(), Mode::Eval).unwrap(),
            mg.forward(&bg, gx, Mode::Eval).unwrap(),
        );
        r.checked += 1;
        if CPU.accuracy(&ec, &labels).unwrap() != g.accuracy(&eg, &labels).unwrap() {
            r.failures.push(format!("{kind:?}: eval accuracy differs"));
        }
    }
    r.finish("models_train_as_on_the_cpu");
}
