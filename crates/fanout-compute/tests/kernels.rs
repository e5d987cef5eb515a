//! Forward semantics of the CPU kernels against naive references, block validation, and
//! independence of results from the thread count.

mod common;

use common::{rand_tensor, OwnedBlock};
use fanout_compute::cpu::gemm::{
    gemm, gemm_dense, gemm_dense_tiled, gemm_matrixmultiply, matmul, skips_zeros, skips_zeros_of_a,
};
use fanout_compute::cpu::sparse_grad;
use fanout_compute::{Aggregation, Backend, ComputeError, CpuBackend, DropoutSpec, Tensor};
use fanout_rand::Rng;

const BE: CpuBackend = CpuBackend;

fn naive_matmul(a: &Tensor, ta: bool, b: &Tensor, tb: bool) -> Tensor {
    let at = |i: usize, p: usize| if ta { a.get(p, i) } else { a.get(i, p) };
    let bt = |p: usize, j: usize| if tb { b.get(j, p) } else { b.get(p, j) };
    let (m, k) = if ta { (a.cols(), a.rows()) } else { a.shape() };
    let n = if tb { b.rows() } else { b.cols() };
    Tensor::from_fn(m, n, |i, j| {
        (0..k)
            .map(|p| at(i, p) as f64 * bt(p, j) as f64)
            .sum::<f64>() as f32
    })
}

/// A `rows x cols` tensor whose entries are non-zero with probability `density`.
fn rand_sparse(rows: usize, cols: usize, density: f64, rng: &mut Rng) -> Tensor {
    let dense = rand_tensor(rows, cols, rng);
    Tensor::from_fn(rows, cols, |i, j| {
        if rng.bernoulli(density) {
            dense.get(i, j)
        } else {
            0.0
        }
    })
}

#[test]
fn zero_skipping_weight_gradient_matches_the_dense_product() {
    if !sparse_grad::available() {
        eprintln!("skipped: this CPU has no AVX2 + FMA, so the zero-skipping kernel never runs");
        return;
    }
    let mut rng = Rng::new(11);
    // (rows of G, columns of A, columns of G): rows not a multiple of the 8-row tiles or the
    // 64-row blocks, A widths below, at and past one 128-float strip with tails of many
    // vector counts (100, 56, 37, 63, 65, 602 = 4 x 128 + 90, 8, 16, 1, 5, 120, 128), G
    // widths with partial 8-column tiles.
    let shapes = [
        (1, 1, 1),
        (9, 5, 7),
        (203, 100, 77),
        (130, 128, 256),
        (67, 37, 130),
        (64, 8, 8),
        (150, 56, 70),
        (40, 16, 24),
        (71, 63, 9),
        (70, 65, 17),
        (90, 602, 20),
        (33, 120, 8),
    ];
    for &(m, k, n) in &shapes {
        for density in [0.0, 0.05, 0.22, 0.6, 1.0] {
            let a = rand_tensor(m, k, &mut rng);
            let g = rand_sparse(m, n, density, &mut rng);
            for (alpha, beta) in [(1.0, 0.0), (0.7, 1.0), (-1.5, 0.25)] {
                let c0 = rand_tensor(k, n, &mut rng);
                let mut want = c0.clone();
                gemm_dense(alpha, &a, true, &g, false, beta, &mut want);
                let mut got = c0.clone();
                sparse_grad::gemm_tn_sparse(alpha, &mut [(&a, &mut got)], &g, beta);
                let err = got.max_abs_diff(&want);
                assert!(
                    err < 1e-5 * (m as f32).sqrt() * (1.0 + alpha.abs()),
                    "{m}x{k}x{n} density {density} alpha {alpha} beta {beta}: {err}"
                );
            }
        }
    }
    // beta = 0 ignores NaNs in C; a NaN in G reaches its whole column of C, as densely,
    // whether it sits in a full 8 x 8 tile (row 5, column 3), in a column past the last full
    // tile (row 6, column 10) or in a row past the last full tile (row 66, column 1).
    let a = rand_tensor(70, 20, &mut rng);
    let mut g = rand_sparse(70, 12, 0.2, &mut rng);
    for (r, j) in [(5, 3), (6, 10), (66, 1)] {
        g.data_mut()[r * 12 + j] = f32::NAN;
    }
    let mut c = Tensor::full(20, 12, f32::NAN);
    sparse_grad::gemm_tn_sparse(1.0, &mut [(&a, &mut c)], &g, 0.0);
    for r in 0..20 {
        for j in 0..12 {
            let want = [3, 10, 1].contains(&j);
            assert_eq!(c.get(r, j).is_nan(), want, "C[{r}, {j}] = {}", c.get(r, j));
        }
    }
}

#[test]
fn shared_weight_gradients_match_one_dense_product_each() {
    let mut rng = Rng::new(12);
    // 2,500 rows: long enough for the zero-skipping path when G is sparse (on CPUs with the
    // kernel); a dense G takes the per-pair dense path. Both accumulate into the old values.
    for density in [0.2, 0.9] {
        let g = rand_sparse(2500, 256, density, &mut rng);
        // The dispatch this test is about: zero-skipping for the sparse G (where the CPU has
        // the kernel), the dense product for the dense one.
        assert_eq!(
            skips_zeros(&g, 128),
            density < 0.5 && sparse_grad::available(),
            "density {density}"
        );
        let (x, y) = (
            rand_tensor(2500, 128, &mut rng),
            rand_tensor(2500, 100, &mut rng),
        );
        let (cx0, cy0) = (
            rand_tensor(128, 256, &mut rng),
            rand_tensor(100, 256, &mut rng),
        );
        let (mut cx, mut cy) = (cx0.clone(), cy0.clone());
        BE.acc_at_b_shared(&g, &mut [(&x, &mut cx), (&y, &mut cy)])
            .unwrap();
        let (mut wx, mut wy) = (cx0, cy0);
        gemm_dense(1.0, &x, true, &g, false, 1.0, &mut wx);
        gemm_dense(1.0, &y, true, &g, false, 1.0, &mut wy);
        let err = cx.max_abs_diff(&wx).max(cy.max_abs_diff(&wy));
        assert!(err < 1e-3, "density {density}: {err}");
        // The single-product entry point dispatches the same way.
        let mut one = Tensor::zeros(128, 256);
        BE.gemm(1.0, &x, true, &g, false, 0.0, &mut one).unwrap();
        let mut want = Tensor::zeros(128, 256);
        gemm_dense(1.0, &x, true, &g, false, 0.0, &mut want);
        assert!(one.max_abs_diff(&want) < 1e-3, "density {density}: gemm");
    }
}

#[test]
fn matmul_matches_naive_triple_loop_for_all_transposes() {
    let mut rng = Rng::new(1);
    // Small and odd shapes, row-block-parallel shapes (m * n * k above the threading
    // threshold), inner-dimension-split shapes (k >= 2048 and k >= 4 m, C one tile) and
    // tiled long-inner-dimension shapes (C at least two 128 x 128 tiles, edge tiles partial).
    let shapes = [
        (1, 1, 1),
        (3, 5, 2),
        (17, 9, 13),
        (300, 70, 90),
        (64, 257, 33),
        (20, 3000, 30),
        (7, 5001, 9),
        (130, 2500, 300),
        (40, 2100, 129),
    ];
    for &(m, k, n) in &shapes {
        for ta in [false, true] {
            for tb in [false, true] {
                let a = if ta {
                    rand_tensor(k, m, &mut rng)
                } else {
                    rand_tensor(m, k, &mut rng)
                };
                let b = if tb {
                    rand_tensor(n, k, &mut rng)
                } else {
                    rand_tensor(k, n, &mut rng)
                };
                let c = BE.matmul(&a, ta, &b, tb).unwrap();
                let want = naive_matmul(&a, ta, &b, tb);
                let err = c.max_abs_diff(&want);
                assert!(
                    err < 1e-4 * (k as f32).sqrt(),
                    "{m}x{k}x{n} {ta} {tb}: {err}"
                );
            }
        }
    }
}

#[test]
fn gemm_alpha_beta_and_edge_cases() {
    let mut rng = Rng::new(2);
    let a = rand_tensor(40, 30, &mut rng);
    let b = rand_tensor(30, 20, &mut rng);
    let c0 = rand_tensor(40, 20, &mut rng);
    let mut c = c0.clone();
    BE.gemm(0.5, &a, false, &b, false, 2.0, &mut c).unwrap();
    let ab = naive_matmul(&a, false, &b, false);
    let want = Tensor::from_fn(40, 20, |i, j| 0.5 * ab.get(i, j) + 2.0 * c0.get(i, j));
    assert!(c.max_abs_diff(&want) < 1e-4);
    // beta = 0 ignores NaNs already in C.
    let mut c = Tensor::full(40, 20, f32::NAN);
    BE.gemm(1.0, &a, false, &b, false, 0.0, &mut c).unwrap();
    assert!(c.max_abs_diff(&ab) < 1e-4);
    // k = 0: C = beta * C.
    let mut c = Tensor::full(2, 3, 4.0);
    BE.gemm(
        1.0,
        &Tensor::zeros(2, 0),
        false,
        &Tensor::zeros(0, 3),
        false,
        0.5,
        &mut c,
    )
    .unwrap();
    assert_eq!(c, Tensor::full(2, 3, 2.0));
}

/// A fixed block: 3 destinations, 5 sources.
/// d0 <- {0, 3, 4}, d1 <- {}, d2 <- {3, 3}; weights 1, 2, 3 | - | 4, 0.5.
fn fixed_block() -> OwnedBlock {
    OwnedBlock::from_lists(
        5,
        &[vec![0, 3, 4], vec![], vec![3, 3]],
        Some(vec![1.0, 2.0, 3.0, 4.0, 0.5]),
    )
}

#[test]
fn aggregation_coefficients_match_their_definitions() {
    let b = fixed_block().prepare();
    let c = |agg| BE.edge_coefficients(&b, agg).unwrap().unwrap().into_data();
    assert!(BE
        .edge_coefficients(&b, Aggregation::Sum)
        .unwrap()
        .is_none());
    assert_eq!(c(Aggregation::Mean), [1. / 3., 1. / 3., 1. / 3., 0.5, 0.5]);
    assert_eq!(c(Aggregation::Weighted), [1.0, 2.0, 3.0, 4.0, 0.5]);
    assert_eq!(
        c(Aggregation::WeightedMean),
        [1. / 6., 2. / 6., 3. / 6., 4. / 4.5, 0.5 / 4.5]
    );
    // out_deg: src0 1, src3 3, src4 1; in_deg: d0 3, d2 2.
    let g = c(Aggregation::GcnBoth);
    let want = [
        1.0 / (1.0f64 * 3.0).sqrt(),
        1.0 / (3.0f64 * 3.0).sqrt(),
        1.0 / (1.0f64 * 3.0).sqrt(),
        1.0 / (3.0f64 * 2.0).sqrt(),
        1.0 / (3.0f64 * 2.0).sqrt(),
    ];
    for (x, w) in g.iter().zip(want) {
        assert!((*x as f64 - w).abs() < 1e-6);
    }
}

#[test]
fn spmm_matches_naive_and_edgeless_destinations_get_zero() {
    let mut rng = Rng::new(3);
    let blk = OwnedBlock::random(7, 12, 5, true, &mut rng);
    let b = blk.prepare();
    let x = rand_tensor(12, 6, &mut rng);
    let c = rand_tensor(blk.num_edges(), 2, &mut rng);
    let out = BE.spmm(&b, Some(&c), &x).unwrap();
    let want = Tensor::from_fn(7, 6, |d, col| {
        let h = col / 3;
        (blk.indptr[d]..blk.indptr[d + 1])
            .map(|e| c.get(e as usize, h) * x.get(blk.indices[e as usize] as usize, col))
            .sum()
    });
    assert!(out.max_abs_diff(&want) < 1e-5);
    assert!(
        out.row(1).iter().all(|&v| v == 0.0),
        "destination 1 has no edge"
    );
}

#[test]
fn edge_softmax_sums_to_one_per_destination_and_head() {
    let mut rng = Rng::new(4);
    let blk = OwnedBlock::random(6, 10, 5, false, &mut rng);
    let b = blk.prepare();
    let mut s = rand_tensor(blk.num_edges(), 3, &mut rng);
    s.data_mut()[0] = 80.0; // large logits stay finite
    let a = BE.edge_softmax(&b, &s).unwrap();
    let sums = BE.edge_sum_to_dst(&b, &a).unwrap();
    for d in 0..6 {
        let deg = blk.indptr[d + 1] - blk.indptr[d];
        for h in 0..3 {
            let want = if deg == 0 { 0.0 } else { 1.0 };
            assert!((sums.get(d, h) - want).abs() < 1e-5);
        }
    }
    assert!(a.data().iter().all(|v| v.is_finite()));
}

#[test]
fn gather_scatter_and_prefix_ops() {
    let x = Tensor::from_fn(4, 2, |r, c| (r * 10 + c) as f32);
    let g = BE.gather_rows(&x, &[3, 0, 3]).unwrap();
    assert_eq!(g.data(), &[30., 31., 0., 1., 30., 31.]);
    let mut y = Tensor::zeros(4, 2);
    BE.scatter_add_rows(&mut y, &[3, 0, 3], &g).unwrap();
    assert_eq!(y.data(), &[0., 1., 0., 0., 0., 0., 60., 62.]);
    let p = BE.prefix_rows(&x, 2).unwrap();
    assert_eq!(p.data(), &[0., 1., 10., 11.]);
    let mut z = Tensor::zeros(4, 2);
    BE.axpy_prefix(2.0, &p, &mut z, 2).unwrap();
    assert_eq!(z.data(), &[0., 2., 20., 22., 0., 0., 0., 0.]);
}

#[test]
fn dropout_is_keyed_and_has_the_right_rate() {
    let x = Tensor::full(200, 50, 1.0);
    let (a, ma) = BE.dropout(&x, 0.5, 42, None).unwrap();
    let (b, _) = BE.dropout(&x, 0.5, 42, None).unwrap();
    let (c, _) = BE.dropout(&x, 0.5, 43, None).unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c);
    let kept = ma.data().iter().filter(|&&m| m != 0.0).count() as f64 / 10_000.0;
    assert!((kept - 0.5).abs() < 0.03, "kept fraction {kept}");
    assert!(ma.data().iter().all(|&m| m == 0.0 || m == 2.0));
}

#[test]
fn dropout_keyed_by_row_ids_follows_the_ids_not_the_rows() {
    // A vertex gets the same mask row wherever it sits (so data-parallel workers and the
    // one-worker union batch drop the same units), and different ids get different rows.
    let x = Tensor::full(6, 40, 1.0);
    let ids = [10u32, 11, 12, 13, 14, 15];
    let moved = [13u32, 99, 10, 98, 97, 96];
    let (_, m) = BE.dropout(&x, 0.5, 42, Some(&ids)).unwrap();
    let (_, n) = BE.dropout(&x, 0.5, 42, Some(&moved)).unwrap();
    assert_eq!(m.row(3), n.row(0), "id 13");
    assert_eq!(m.row(0), n.row(2), "id 10");
    assert_ne!(m.row(1), n.row(1));
    // Without ids the row index is the id.
    let (_, plain) = BE.dropout(&x, 0.5, 42, None).unwrap();
    let (_, by_index) = BE.dropout(&x, 0.5, 42, Some(&[0, 1, 2, 3, 4, 5])).unwrap();
    assert_eq!(plain, by_index);
    assert_ne!(plain, m);
}

#[test]
fn dropout_rate_product_and_independence_hold_for_odd_widths() {
    // Odd widths, and a single column (each row's only draw: neighbours are other rows).
    for &(rows, cols) in &[(400, 67), (150, 130), (3000, 1)] {
        let x = rand_tensor(rows, cols, &mut Rng::new(cols as u64));
        for &p in &[0.1f32, 0.5, 0.9] {
            let (y, m) = BE.dropout(&x, p, 7, None).unwrap();
            let keep = 1.0 / (1.0 - p);
            let n = (rows * cols) as f64;
            let dropped = m.data().iter().filter(|&&v| v == 0.0).count() as f64;
            // 5 standard deviations of a binomial count.
            let sd = (n * p as f64 * (1.0 - p as f64)).sqrt();
            assert!(
                (dropped - n * p as f64).abs() < 5.0 * sd,
                "{rows}x{cols} p={p}: dropped {dropped} of {n}"
            );
            assert!(m.data().iter().all(|&v| v == 0.0 || v == keep));
            for ((&yv, &xv), &mv) in y.data().iter().zip(x.data()).zip(m.data()) {
                assert_eq!(yv, xv * mv);
            }
            // Neighbouring elements (next columns of a row, or next rows) are independent: both
            // dropped about p^2 of the time.
            let d = m.data();
            let pairs = d.len() / 2;
            let both = (0..pairs)
                .filter(|&i| d[2 * i] == 0.0 && d[2 * i + 1] == 0.0)
                .count() as f64;
            let q = (p * p) as f64;
            let sd2 = (pairs as f64 * q * (1.0 - q)).sqrt();
            assert!(
                (both - pairs as f64 * q).abs() < 5.0 * sd2,
                "{rows}x{cols} p={p}: both dropped {both} of {pairs} pairs"
            );
        }
    }
}

#[test]
fn cross_entropy_and_accuracy_on_known_values() {
    let logits = Tensor::new(3, 2, vec![0.0, 0.0, 2.0, 0.0, 0.0, 5.0]);
    let ce = BE.softmax_cross_entropy(&logits, &[1, 0, -1]).unwrap();
    let want = (2f64.ln() + (1.0 + (-2f64).exp()).ln()) / 2.0;
    assert!((ce.loss as f64 - want).abs() < 1e-6);
    assert_eq!(ce.count, 2);
    assert!(ce.grad.row(2).iter().all(|&g| g == 0.0));
    assert_eq!(BE.accuracy(&logits, &[1, 0, -1]).unwrap(), (1, 2));
    assert!(matches!(
        BE.softmax_cross_entropy(&logits, &[0, 2, 0]),
        Err(ComputeError::Label {
            row: 1,
            label: 2,
            ..
        })
    ));
    assert!(BE.softmax_cross_entropy(&logits, &[0, 1]).is_err());
    let none = BE.softmax_cross_entropy(&logits, &[-1, -1, -1]).unwrap();
    assert_eq!((none.loss, none.count), (0.0, 0));
}

#[test]
fn malformed_blocks_are_errors() {
    let good = fixed_block();
    assert!(good.as_ref().validate().is_ok());
    let mut b = good.clone();
    b.indices[2] = 5;
    assert!(
        BE.prepare_block(&b.as_ref()).is_err(),
        "source out of range"
    );
    let mut b = good.clone();
    b.indptr[1] = 4;
    b.indptr[2] = 3;
    assert!(b.as_ref().validate().is_err(), "decreasing indptr");
    let mut b = good.clone();
    b.num_dst = 6;
    assert!(b.as_ref().validate().is_err(), "num_dst > num_src");
    let mut b = good.clone();
    b.weights = Some(vec![1.0; 4]);
    assert!(b.as_ref().validate().is_err(), "weight count");
    let mut b = good;
    b.indptr.pop();
    assert!(b.as_ref().validate().is_err(), "indptr length");
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let run = || {
        let mut rng = Rng::new(5);
        let blk = OwnedBlock::random(3000, 5000, 12, true, &mut rng);
        let b = blk.prepare();
        let x = rand_tensor(5000, 24, &mut rng);
        let w = rand_tensor(24, 40, &mut rng);
        let y = BE.matmul(&x, false, &w, false).unwrap();
        let agg = BE.aggregate(&b, &x, Aggregation::GcnBoth).unwrap();
        let back = BE.aggregate_backward(&b, &agg, Aggregation::Mean).unwrap();
        let mut dw = rand_tensor(24, 40, &mut rng);
        BE.gemm(0.7, &x, true, &y, false, 1.0, &mut dw).unwrap();
        // Accumulating product with an inner dimension above the kernel's k-block (256), so
        // later k-blocks and beta = 1 take the fused and the buffered epilogues (alpha != 1:
        // they round differently, so a thread-count-dependent tiling would show).
        let z = rand_tensor(5000, 300, &mut rng);
        let v = rand_tensor(300, 40, &mut rng);
        let mut acc = rand_tensor(5000, 40, &mut rng);
        BE.gemm(0.7, &z, false, &v, false, 1.0, &mut acc).unwrap();
        // A weight gradient on the tiled path (C = 130 x 300: six tiles), accumulating.
        let (g1, g2) = (
            rand_tensor(2600, 130, &mut rng),
            rand_tensor(2600, 300, &mut rng),
        );
        let mut dw2 = rand_tensor(130, 300, &mut rng);
        BE.gemm(0.7, &g1, true, &g2, false, 1.0, &mut dw2).unwrap();
        // A weight gradient whose inputs pass 8 MiB: split along the inner dimension into
        // partial products added in chunk order, though C holds four tiles.
        let (s1, s2) = (
            rand_tensor(8200, 130, &mut rng),
            rand_tensor(8200, 130, &mut rng),
        );
        let mut dw5 = rand_tensor(130, 130, &mut rng);
        BE.gemm(0.7, &s1, true, &s2, false, 1.0, &mut dw5).unwrap();
        let dw2 = (dw2, dw5);
        // Weight gradients of a sparse G (the zero-skipping path where the CPU has it).
        let gs = rand_sparse(2600, 300, 0.2, &mut rng);
        let mut dw3 = rand_tensor(130, 300, &mut rng);
        let mut dw4 = rand_tensor(40, 300, &mut rng);
        let h = rand_tensor(2600, 40, &mut rng);
        BE.acc_at_b_shared(&gs, &mut [(&g1, &mut dw3), (&h, &mut dw4)])
            .unwrap();
        let s = BE.sum_rows(&y).unwrap();
        // Attention kernels (GAT): 4 heads of 16, rows wide enough for the AVX loops.
        let z = rand_tensor(5000, 64, &mut rng);
        let coeff = rand_tensor(blk.num_edges(), 4, &mut rng);
        let att = rand_tensor(4, 16, &mut rng);
        let g = rand_tensor(3000, 64, &mut rng);
        let (gz, gc) = BE.spmm_backward(&b, &coeff, &g, &z).unwrap();
        let el = BE.head_dot(&z, &att).unwrap();
        let mut gz_acc = rand_tensor(5000, 64, &mut rng);
        let ga = BE
            .head_dot_backward_acc(&el, &z, &att, &mut gz_acc)
            .unwrap();
        let heads = (
            BE.spmm(&b, Some(&coeff), &z).unwrap(),
            gz,
            gc,
            el,
            gz_acc,
            ga,
        );
        (
            y,
            agg,
            back,
            (dw, acc, dw2, dw3, dw4),
            s,
            BE.dot(&x, &x).unwrap(),
            heads,
        )
    };
    let pool = |n| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .unwrap()
    };
    let one = pool(1).install(run);
    let three = pool(3).install(run);
    let seven = pool(7).install(run);
    // Plain asserts: a failure should name the result, not print megabytes of floats.
    assert!(one.0 == three.0, "dense product differs");
    assert!(one.1 == three.1, "aggregation differs");
    assert!(one.2 == three.2, "aggregation backward differs");
    assert!(
        one.3 == three.3 && one.3 == seven.3,
        "accumulating products differ"
    );
    assert!(one.4 == three.4, "column sums differ");
    assert!(one.5 == three.5, "dot product differs");
    assert!(
        one.6 == three.6 && one.6 == seven.6,
        "attention kernels differ"
    );
}

#[test]
fn on_compute_threads_runs_on_a_pool_worker_and_returns_the_value() {
    // Test threads are not rayon workers; the CPU backend moves the closure onto one, which is
    // what lets kernels fork inside the pool.
    assert!(rayon::current_thread_index().is_none());
    let (idx, v) = BE.on_compute_threads(|| (rayon::current_thread_index(), 6 * 7));
    assert!(idx.is_some());
    assert_eq!(v, 42);
    // Kernels give the same result there as on the calling thread.
    let a = Tensor::from_fn(300, 70, |r, c| ((r * 7 + c * 3) % 11) as f32 - 5.0);
    let b = Tensor::from_fn(70, 90, |r, c| ((r * 5 + c) % 13) as f32 * 0.25);
    assert_eq!(
        BE.on_compute_threads(|| BE.matmul(&a, false, &b, false).unwrap()),
        BE.matmul(&a, false, &b, false).unwrap()
    );
}

/// The separate passes the epilogue replaces: bias, ReLU, dropout in turn; and the gradient at
/// the epilogue's input for `grad`: ReLU's backward after the dropout mask's.
fn epilogue_reference(
    x: &Tensor,
    bias: Option<&Tensor>,
    relu: bool,
    dropout: Option<DropoutSpec<'_>>,
    grad: &Tensor,
) -> (Tensor, Tensor) {
    let mut z = x.clone();
    if let Some(b) = bias {
        BE.add_bias(&mut z, b).unwrap();
    }
    let a = if relu {
        BE.relu(&z).unwrap()
    } else {
        z.clone()
    };
    let (out, g) = match dropout {
        Some(d) => {
            let (out, mask) = BE.dropout(&a, d.p, d.key, d.row_ids).unwrap();
            (out, BE.mul(grad, &mask).unwrap())
        }
        None => (a, grad.clone()),
    };
    let g = if relu {
        BE.relu_backward(&g, &z).unwrap()
    } else {
        g
    };
    (out, g)
}

#[test]
fn epilogue_equals_bias_relu_and_dropout_in_turn() {
    // Odd widths (the AVX2 loop's tail), a single column, rows keyed by index and by id.
    let mut rng = Rng::new(5);
    for &(rows, cols) in &[(37, 67), (300, 16), (9, 1), (0, 5)] {
        let x = rand_tensor(rows, cols, &mut rng);
        let bias = rand_tensor(1, cols, &mut rng);
        let grad = rand_tensor(rows, cols, &mut rng);
        let ids: Vec<u32> = (0..rows as u32).map(|r| 1000 + 7 * r).collect();
        for use_bias in [false, true] {
            for relu in [false, true] {
                for drop in [None, Some(0.0f32), Some(0.3), Some(0.8)] {
                    for by_id in [false, true] {
                        let spec = drop.map(|p| DropoutSpec {
                            p,
                            key: 99,
                            row_ids: by_id.then_some(&ids[..]),
                        });
                        let b = use_bias.then_some(&bias);
                        let what = format!(
                            "{rows}x{cols} bias {use_bias} relu {relu} drop {drop:?} ids {by_id}"
                        );
                        let (want, want_grad) = epilogue_reference(&x, b, relu, spec, &grad);
                        let mut got = x.clone();
                        let factor = BE.epilogue(&mut got, b, relu, spec, true).unwrap();
                        assert_eq!(got, want, "{what}: output");
                        match factor {
                            Some(f) => {
                                let g = BE.mul(&grad, &f).unwrap();
                                // Equal as floats: a cut element may be -0 here, 0 there.
                                assert_eq!(g.data(), want_grad.data(), "{what}: gradient");
                            }
                            None => {
                                assert!(!relu && drop.is_none(), "{what}: no factor");
                                assert_eq!(want_grad, grad, "{what}: identity");
                            }
                        }
                        // Not kept: the same output and no factor.
                        let mut bare = x.clone();
                        assert!(BE
                            .epilogue(&mut bare, b, relu, spec, false)
                            .unwrap()
                            .is_none());
                        assert_eq!(bare, want, "{what}: output without the factor");
                    }
                }
            }
        }
    }
}

#[test]
fn mul_sum_rows_is_mul_then_sum_rows_bit_for_bit() {
    // Several 256-row partial sums (the last one short), odd widths, and empty tensors.
    let mut rng = Rng::new(8);
    for &(rows, cols) in &[(700, 67), (256, 3), (1, 1), (0, 4), (5, 0)] {
        let a = rand_tensor(rows, cols, &mut rng);
        let b = rand_tensor(rows, cols, &mut rng);
        let (prod, sums) = BE.mul_sum_rows(&a, &b).unwrap();
        let want = BE.mul(&a, &b).unwrap();
        assert_eq!(prod, want, "{rows}x{cols}: product");
        let want_sums = BE.sum_rows(&want).unwrap();
        let bits = |t: &Tensor| t.data().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&sums), bits(&want_sums), "{rows}x{cols}: column sums");
    }
}

#[test]
fn long_inner_dimensions_give_the_product_split_either_way() {
    // A weight gradient `A^T G` over 8,200 rows (inputs of 8.5 MB): `gemm_dense` splits the
    // inner dimension into partial products, `gemm_dense_tiled` computes one full-length
    // product per 128 x 128 tile of C. Both are the product, accumulated with beta.
    let mut rng = Rng::new(33);
    let (a, g) = (
        rand_tensor(8200, 130, &mut rng),
        rand_tensor(8200, 130, &mut rng),
    );
    let c0 = rand_tensor(130, 130, &mut rng);
    let ab = naive_matmul(&a, true, &g, false);
    let want = Tensor::from_fn(130, 130, |i, j| 0.5 * ab.get(i, j) + c0.get(i, j));
    let (mut split, mut tiles) = (c0.clone(), c0.clone());
    gemm_dense(0.5, &a, true, &g, false, 1.0, &mut split);
    gemm_dense_tiled(0.5, &a, true, &g, false, 1.0, &mut tiles);
    for (what, got) in [("split", &split), ("tiles", &tiles)] {
        let d = got.max_abs_diff(&want);
        assert!(d < 1e-3, "{what}: off the naive product by {d}");
    }
    // The two paths round differently, so a mutation that sent both down one would show.
    assert!(split != tiles, "the split and the tiles gave the same bits");
}

#[test]
fn row_major_and_column_major_a_and_transposed_b_give_the_product() {
    // A row-major A is read in place (`rowmajor`: for every B on AVX-512 CPUs, up to 128
    // columns on AVX2 ones) and otherwise multiplied from a column-major copy made in row
    // slices. Whatever the path: a transposed B gives the bits of the same B row-major (both
    // are packed into the same panels), 1 and 3 threads give the same bits, and the result is
    // the product, accumulated into C with beta = 1 and ignoring C with beta = 0. Shapes: rows
    // not a multiple of the micro-tile's 6 (every remainder 1-5 below), widths not a multiple
    // of its 16, several row blocks, a long inner dimension (2000), a wide B (256, the copy),
    // and inner dimensions below the copy's minimum of 8.
    let mut rng = Rng::new(21);
    for &(m, k, n) in &[
        (300, 100, 256),
        (1000, 33, 47),
        (4000, 2000, 16),
        (1001, 64, 128),
        (97, 12, 17),
        (70, 9, 5),
        (90, 7, 3),
        (5, 40, 33),
        (4, 40, 1),
        (3, 40, 16),
        (2, 8, 15),
    ] {
        let a = rand_tensor(m, k, &mut rng);
        let at = Tensor::from_fn(k, m, |j, i| a.get(i, j));
        let b = rand_tensor(k, n, &mut rng);
        let bt = Tensor::from_fn(n, k, |j, p| b.get(p, j));
        let c0 = rand_tensor(m, n, &mut rng);
        let ab = naive_matmul(&a, false, &b, false);
        let bits = |t: &Tensor| t.data().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let mut first: Vec<Option<Vec<u32>>> = vec![None; 4];
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                for (bi, beta) in [0.0f32, 1.0].into_iter().enumerate() {
                    let want =
                        Tensor::from_fn(m, n, |i, j| 0.5 * ab.get(i, j) + beta * c0.get(i, j));
                    for (li, (lhs, ta)) in [(&a, false), (&at, true)].into_iter().enumerate() {
                        let what = format!("{m}x{k}x{n}, A^T {ta}, {threads} threads, beta {beta}");
                        // With beta = 0 the old C must not matter: start from NaNs.
                        let start = if beta == 0.0 {
                            Tensor::full(m, n, f32::NAN)
                        } else {
                            c0.clone()
                        };
                        let (mut x, mut z) = (start.clone(), start);
                        gemm_dense(0.5, lhs, ta, &b, false, beta, &mut x);
                        gemm_dense(0.5, lhs, ta, &bt, true, beta, &mut z);
                        assert_eq!(bits(&x), bits(&z), "{what}: B against B^T");
                        let mut r = c0.clone();
                        gemm_matrixmultiply(0.5, lhs, ta, &b, false, beta, &mut r);
                        assert!(
                            x.max_abs_diff(&r) < 1e-5 * k as f32,
                            "{what}: against matrixmultiply"
                        );
                        assert!(
                            x.max_abs_diff(&want) < 1e-4 * k as f32,
                            "{what}: against the naive product"
                        );
                        let slot = &mut first[bi * 2 + li];
                        match slot {
                            None => *slot = Some(bits(&x)),
                            Some(one) => assert_eq!(*one, bits(&x), "{what}: against 1 thread"),
                        }
                    }
                }
            });
        }
    }
}

#[test]
fn weight_gradients_of_a_kept_factors_product_match_the_written_out_product() {
    // `acc_at_b_shared_product` against what the layers did before it: `mul_sum_rows`, the
    // bias `axpy` and `acc_at_b_shared` on the product written out. The same bits on the
    // zero-skipping path (a ReLU-and-dropout factor, a quarter non-zero), the dense one (a
    // factor of twos) and a gradient too short for the kernel.
    let be = CpuBackend;
    let mut rng = Rng::new(43);
    for (rows, p) in [(3000, 0.25), (3000, 1.0), (100, 0.25)] {
        let grad = rand_tensor(rows, 64, &mut rng);
        let factor = Tensor::from_fn(rows, 64, |_, _| if rng.bernoulli(p) { 2.0 } else { 0.0 });
        let (x1, x2) = (
            rand_tensor(rows, 100, &mut rng),
            rand_tensor(rows, 37, &mut rng),
        );
        let (c1, c2, bias) = (
            rand_tensor(100, 64, &mut rng),
            rand_tensor(37, 64, &mut rng),
            rand_tensor(1, 64, &mut rng),
        );
        let (mut w1, mut w2, mut b) = (c1.clone(), c2.clone(), bias.clone());
        let (g, sums) = be.mul_sum_rows(&grad, &factor).unwrap();
        be.axpy(1.0, &sums, &mut b).unwrap();
        be.acc_at_b_shared(&g, &mut [(&x1, &mut w1), (&x2, &mut w2)])
            .unwrap();
        let (mut v1, mut v2, mut v) = (c1, c2, bias);
        be.acc_at_b_shared_product(
            &grad,
            &factor,
            &mut [(&x1, &mut v1), (&x2, &mut v2)],
            &mut v,
        )
        .unwrap();
        let bits = |t: &Tensor| t.data().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let what = format!("{rows} rows, factor non-zero with probability {p}");
        assert_eq!(bits(&v1), bits(&w1), "first weight gradient, {what}");
        assert_eq!(bits(&v2), bits(&w2), "second weight gradient, {what}");
        assert_eq!(bits(&v), bits(&b), "bias gradient, {what}");
    }
}

#[test]
fn a_mostly_zero_left_factor_gives_the_dense_products_bits() {
    // `G W^T` and `G W` with G about a quarter non-zero (a hidden layer's gradient behind ReLU
    // and dropout) skip G's zeros where the CPU has the kernel; the skipped terms are exact
    // zeros added to sums that start at +0, so on AVX-512 CPUs (where the dense product is
    // the row-major tile for every width) the bits are the dense product's, with beta = 0 and
    // beta != 0, on 1 and 3 threads. Elsewhere the naive product within rounding. W is 208
    // wide (whole vectors), so `matmul` sums straight into its fresh, unzeroed C and the
    // accumulating `gemm` through a buffer. A dense G, a narrow W and a thin G take the dense
    // path.
    let mut rng = Rng::new(41);
    let g = rand_sparse(1500, 256, 0.25, &mut rng);
    assert_eq!(skips_zeros_of_a(&g, 256), sparse_grad::available());
    assert!(
        !skips_zeros_of_a(&rand_tensor(1500, 256, &mut rng), 256),
        "a dense G"
    );
    assert!(!skips_zeros_of_a(&g, 32), "a narrow product");
    assert!(
        skips_zeros_of_a(&g, 64) == sparse_grad::available(),
        "64 wide"
    );
    assert!(
        !skips_zeros_of_a(&rand_sparse(1500, 256, 0.4, &mut rng), 64),
        "64 wide, 40% non-zero"
    );
    assert!(
        !skips_zeros_of_a(&rand_sparse(100, 256, 0.25, &mut rng), 256),
        "a thin G"
    );
    #[cfg(target_arch = "x86_64")]
    let same_bits = is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    let same_bits = false;
    let w = rand_tensor(208, 256, &mut rng);
    let wt = Tensor::from_fn(256, 208, |p, j| w.get(j, p));
    let c0 = rand_tensor(1500, 208, &mut rng);
    let bits = |t: &Tensor| t.data().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let naive = naive_matmul(&g, false, &wt, false);
    let mut first = None;
    for threads in [1, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let got = pool.install(|| {
            let plain = matmul(&g, false, &wt, false);
            let transposed = matmul(&g, false, &w, true);
            assert_eq!(bits(&plain), bits(&transposed), "W against W^T");
            let mut acc = c0.clone();
            gemm(0.5, &g, false, &w, true, 1.5, &mut acc);
            if same_bits {
                let mut dense = Tensor::zeros(1500, 208);
                gemm_dense(1.0, &g, false, &wt, false, 0.0, &mut dense);
                assert_eq!(
                    bits(&plain),
                    bits(&dense),
                    "{threads} threads: against the dense product"
                );
                let mut dense_acc = c0.clone();
                gemm_dense(0.5, &g, false, &w, true, 1.5, &mut dense_acc);
                assert_eq!(
                    bits(&acc),
                    bits(&dense_acc),
                    "{threads} threads: accumulated"
                );
            }
            assert!(
                plain.max_abs_diff(&naive) < 1e-4 * 256.0,
                "against the naive product"
            );
            (bits(&plain), bits(&acc))
        });
        match &first {
            None => first = Some(got),
            Some(one) => assert!(*one == got, "1 and 3 threads differ"),
        }
    }
}

#[test]
fn out_degrees_count_each_sources_edges() {
    let mut rng = Rng::new(11);
    let blk = OwnedBlock::random(50, 90, 12, false, &mut rng);
    let mut want = vec![0u32; blk.num_src];
    for &s in &blk.indices {
        want[s as usize] += 1;
    }
    assert_eq!(blk.prepare().out_degrees(), want);
}

#[test]
fn head_dots_of_a_prefix_give_the_copied_prefixs_bits() {
    // GAT's destination logits read the first rows of the sources' `z` in place: the same
    // bits as on a copy, for the logits, the accumulated `d x` (rows past the prefix left as
    // they were) and `d a`. Row counts: none, one, a part and all of `x`, and a prefix long
    // enough to be summed in several parts.
    let mut rng = Rng::new(21);
    let bits = |t: &Tensor| t.data().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    for &(heads, f, total, rows) in &[
        (8, 32, 300, 37),
        (3, 5, 40, 0),
        (3, 5, 40, 1),
        (2, 7, 40, 40),
        (4, 16, 9000, 5000),
    ] {
        let what = format!("{heads}x{f}, {rows} of {total} rows");
        let x = rand_tensor(total, heads * f, &mut rng);
        let a = rand_tensor(heads, f, &mut rng);
        let copy = BE.prefix_rows(&x, rows).unwrap();
        let got = BE.head_dot_prefix(&x, &a, rows).unwrap();
        assert_eq!(got.shape(), (rows, heads), "{what}: logits' shape");
        assert_eq!(bits(&got), bits(&BE.head_dot(&copy, &a).unwrap()), "{what}");

        let grad = rand_tensor(rows, heads, &mut rng);
        let start = rand_tensor(total, heads * f, &mut rng);
        let (mut acc, mut want_acc) = (start.clone(), start.clone());
        let da = BE
            .head_dot_prefix_backward_acc(&grad, &x, &a, &mut acc)
            .unwrap();
        let want_da = BE
            .head_dot_backward_acc(&grad, &copy, &a, &mut want_acc)
            .unwrap();
        assert_eq!(bits(&acc), bits(&want_acc), "{what}: d x");
        assert_eq!(bits(&da), bits(&want_da), "{what}: d a");
        let tail = rows * heads * f;
        assert_eq!(
            &acc.data()[tail..],
            &start.data()[tail..],
            "{what}: past the prefix"
        );
    }
}

#[test]
fn per_head_aggregates_and_products_match_their_definitions() {
    // GAT aggregating before projecting: `spmm_heads` applies each head's coefficient to the
    // whole source row, its coefficient gradient is a per-head dot, and the per-head
    // products multiply matching column blocks. Against f64 loops, on a block with an
    // edgeless destination, with row counts past the kernels' 256-row tasks; and the same
    // bits on 1 and 3 threads.
    let run = |num_dst: usize, heads: usize, k: usize, f: usize| {
        let mut rng = Rng::new(31 + num_dst as u64);
        let blk = OwnedBlock::random(num_dst, 2 * num_dst + 3, 6, false, &mut rng);
        let b = blk.prepare();
        let x = rand_tensor(blk.num_src, k, &mut rng);
        let c = rand_tensor(blk.num_edges(), heads, &mut rng);
        let edges = |d: usize| blk.indptr[d] as usize..blk.indptr[d + 1] as usize;
        let src = |e: usize| blk.indices[e] as usize;
        let y = BE.spmm_heads(&b, &c, &x).unwrap();
        let want = Tensor::from_fn(num_dst, heads * k, |d, j| {
            let (h, i) = (j / k, j % k);
            edges(d)
                .map(|e| c.get(e, h) as f64 * x.get(src(e), i) as f64)
                .sum::<f64>() as f32
        });
        assert!(y.max_abs_diff(&want) < 1e-4, "spmm_heads {num_dst}");
        assert!(y.row(1).iter().all(|&v| v == 0.0), "edgeless destination");

        let gy = rand_tensor(num_dst, heads * k, &mut rng);
        let gc = BE.spmm_heads_backward_coeff(&b, &gy, &x).unwrap();
        let want = Tensor::from_fn(blk.num_edges(), heads, |e, h| {
            let d = (0..num_dst).find(|&d| edges(d).contains(&e)).unwrap();
            (0..k)
                .map(|i| gy.get(d, h * k + i) as f64 * x.get(src(e), i) as f64)
                .sum::<f64>() as f32
        });
        assert!(
            gc.max_abs_diff(&want) < 1e-4,
            "spmm_heads_backward_coeff {num_dst}"
        );

        let w = rand_tensor(k, heads * f, &mut rng);
        let per_head = |a: &Tensor, a_cols: usize, b: &Tensor, rows: usize| {
            // rows x (heads * f): a's head block times b's head block.
            Tensor::from_fn(rows, heads * f, |r, j| {
                let h = j / f;
                (0..a_cols)
                    .map(|p| a.get(r, h * a_cols + p) as f64 * b.get(p, j) as f64)
                    .sum::<f64>() as f32
            })
        };
        let out = BE.head_matmul(&y, &w, heads).unwrap();
        assert!(
            out.max_abs_diff(&per_head(&y, k, &w, num_dst)) < 1e-4,
            "head_matmul"
        );

        let g = rand_tensor(num_dst, heads * f, &mut rng);
        let start = rand_tensor(k, heads * f, &mut rng);
        let mut gw = start.clone();
        BE.head_acc_at_b(&y, &g, &mut gw, heads).unwrap();
        let want = Tensor::from_fn(k, heads * f, |i, j| {
            let h = j / f;
            start.get(i, j)
                + (0..num_dst)
                    .map(|n| y.get(n, h * k + i) as f64 * g.get(n, j) as f64)
                    .sum::<f64>() as f32
        });
        assert!(gw.max_abs_diff(&want) < 1e-3, "head_acc_at_b");

        let gy2 = BE.head_matmul_bt(&g, &w, heads).unwrap();
        let want = Tensor::from_fn(num_dst, heads * k, |n, j| {
            let (h, i) = (j / k, j % k);
            (0..f)
                .map(|p| g.get(n, h * f + p) as f64 * w.get(i, h * f + p) as f64)
                .sum::<f64>() as f32
        });
        assert!(gy2.max_abs_diff(&want) < 1e-4, "head_matmul_bt");
        [y, gc, out, gw, gy2]
    };
    for &(num_dst, heads, k, f) in &[(7, 2, 5, 3), (600, 3, 20, 8), (300, 1, 9, 4)] {
        let pool = |n| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .unwrap()
        };
        let one = pool(1).install(|| run(num_dst, heads, k, f));
        let three = pool(3).install(|| run(num_dst, heads, k, f));
        for (a, b) in one.iter().zip(&three) {
            assert_eq!(a, b, "{num_dst} x {heads} heads: 1 and 3 threads");
        }
    }
}

/// `all_finite` finds a NaN, an infinity or a negative infinity wherever it lies in any of
/// several tensors (the first, a middle and the last element of each; the second is longer
/// than one parallel chunk), and answers true for finite extremes (the largest float, a
/// subnormal) and for no tensor at all.
#[test]
fn all_finite_finds_every_non_finite_value() {
    let mut rng = Rng::new(5);
    let mut ts = [
        rand_tensor(3, 7, &mut rng),
        rand_tensor(300, 257, &mut rng),
        rand_tensor(1, 1, &mut rng),
    ];
    ts[1].data_mut()[5] = f32::MAX;
    ts[1].data_mut()[6] = -f32::MIN_POSITIVE / 4.0;
    assert!(BE.all_finite(&refs(&ts)).unwrap(), "finite extremes");
    assert!(BE.all_finite(&[]).unwrap(), "no tensor");
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        for t in 0..ts.len() {
            let len = ts[t].data().len();
            for at in [0, len / 2, len - 1] {
                let mut copy = ts.clone();
                copy[t].data_mut()[at] = bad;
                assert!(
                    !BE.all_finite(&refs(&copy)).unwrap(),
                    "{bad} in tensor {t} at {at}"
                );
            }
        }
    }
}

fn refs(ts: &[Tensor]) -> Vec<&Tensor> {
    ts.iter().collect()
}
