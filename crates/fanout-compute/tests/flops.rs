//! The nominal-flop counter behind the compute floor: every product path adds exactly
//! `2 m n k`, the zero-skipping weight-gradient path included, and the skipped-flop counter
//! exactly `2 k` per zero of `G` on that path alone. One test in its own binary, so no other
//! test multiplies while it reads the process-wide counters.

use fanout_compute::cpu::{gemm, sparse_grad};
use fanout_compute::Tensor;

#[test]
fn every_product_path_adds_exactly_its_nominal_flops() {
    let a = Tensor::new(3, 4, (0..12).map(|i| i as f32).collect());
    let b = Tensor::new(4, 5, (0..20).map(|i| i as f32).collect());
    let mut expected = 0u64;
    let mut skipped = 0u64;
    let mut check = |what: &str, f: &mut dyn FnMut(), flops: u64| {
        let (before, skipped_before) = (gemm::nominal_flops(), gemm::skipped_flops());
        f();
        expected += flops;
        assert_eq!(gemm::nominal_flops() - before, flops, "{what}");
        skipped += gemm::skipped_flops() - skipped_before;
    };
    check(
        "matmul 3x4x5",
        &mut || drop(gemm::matmul(&a, false, &b, false)),
        2 * 3 * 4 * 5,
    );
    let mut c = Tensor::zeros(4, 4);
    check(
        "gemm A^T A (4x3x4)",
        &mut || gemm::gemm(1.0, &a, true, &a, false, 0.0, &mut c),
        2 * 4 * 3 * 4,
    );
    // A gradient that is mostly zeros takes the zero-skipping path; it still counts as dense.
    let (rows, k, n) = (4096usize, 8usize, 8usize);
    let x = Tensor::new(rows, k, vec![1.0; rows * k]);
    let g = Tensor::new(
        rows,
        n,
        (0..rows * n)
            .map(|i| if i % 10 == 0 { 1.0 } else { 0.0 })
            .collect(),
    );
    // The zero-skipping kernel needs a CPU that has it (AVX2 on x86-64).
    assert_eq!(gemm::skips_zeros(&g, k), sparse_grad::available());
    let flops = (2 * k * rows * n) as u64;
    let mut c1 = Tensor::zeros(k, n);
    let mut c2 = Tensor::zeros(k, n);
    check(
        "acc_at_b_shared, two pairs, sparse",
        &mut || gemm::acc_at_b_shared(&g, &mut [(&x, &mut c1), (&x, &mut c2)]),
        2 * flops,
    );
    let dense = Tensor::new(rows, n, vec![1.0; rows * n]);
    assert!(!gemm::skips_zeros(&dense, k));
    check(
        "acc_at_b_shared, one pair, dense",
        &mut || gemm::acc_at_b_shared(&dense, &mut [(&x, &mut c1)]),
        flops,
    );
    check(
        "gemm, sparse path",
        &mut || gemm::gemm(1.0, &x, true, &g, false, 0.0, &mut c2),
        flops,
    );
    // The product of `g` and a factor of twos has `g`'s zeros, and the dense one none.
    let twos = Tensor::new(rows, n, vec![2.0; rows * n]);
    check(
        "acc_at_b_shared_product, two pairs, sparse",
        &mut || {
            drop(gemm::acc_at_b_shared_product(
                &g,
                &twos,
                &mut [(&x, &mut c1), (&x, &mut c2)],
            ))
        },
        2 * flops,
    );
    check(
        "acc_at_b_shared_product, one pair, dense",
        &mut || {
            drop(gemm::acc_at_b_shared_product(
                &dense,
                &twos,
                &mut [(&x, &mut c1)],
            ))
        },
        flops,
    );
    assert!(expected > 0);
    // Only the four sparse products skipped anything: five pairs in all, each `2 k` flops for
    // every zero of `g` (nine in ten of its entries).
    let zeros = (rows * n - (rows * n).div_ceil(10)) as u64;
    let want = if sparse_grad::available() {
        5 * 2 * k as u64 * zeros
    } else {
        0
    };
    assert_eq!(skipped, want);
}
