//! Throughput of the CPU kernels that dominate a GraphSAGE training step, on the shapes of its
//! input layer: `cargo run --release -p fanout-compute --example kernel_speed -- [ROWS]`
//! (ROWS = destination rows of the input layer, default 5000; set `RAYON_NUM_THREADS`).
//! Prints the median of 30 runs per kernel; compare GEMM rates with another library's on the
//! same shapes (e.g. `torch.matmul` with `torch.set_num_threads`).
use fanout_compute::cpu::gemm::{gemm, gemm_dense};
use fanout_compute::cpu::sparse_grad::{density, gemm_tn_sparse};
use fanout_compute::cpu::sparse_rows::gemm_nn_sparse;
use fanout_compute::{Aggregation, Backend, BlockRef, CpuBackend, Tensor};
use std::time::Instant;

fn median_s(mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..30)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

/// [`median_s`] of `dense` and of `sparse` in 7 alternating rounds (so that load changes hit
/// both), and the median of each side's rounds.
fn alternated(mut dense: impl FnMut(), mut sparse: impl FnMut()) -> (f64, f64) {
    let (mut d, mut s) = (Vec::new(), Vec::new());
    for _ in 0..7 {
        d.push(median_s(&mut dense));
        s.push(median_s(&mut sparse));
    }
    d.sort_by(f64::total_cmp);
    s.sort_by(f64::total_cmp);
    (d[3], s[3])
}

fn filled(r: usize, c: usize) -> Tensor {
    Tensor::from_fn(r, c, |i, j| {
        ((i * 31 + j * 17) % 1000) as f32 / 1000.0 - 0.5
    })
}

/// A `rows x 256` gradient about `pct`% non-zero, its zeros placed by a xorshift from `seed`.
fn sparse_g(rows: usize, pct: u64, seed: u64) -> Tensor {
    let mut z = seed;
    Tensor::from_fn(rows, 256, |i, j| {
        z ^= z << 13;
        z ^= z >> 7;
        z ^= z << 17;
        if z % 100 < pct {
            ((i + j) % 7) as f32 - 3.0
        } else {
            0.0
        }
    })
}

fn main() {
    let rows: usize = match std::env::args().nth(1).map(|s| s.parse()) {
        None => 5000,
        Some(Ok(n)) => n,
        Some(Err(e)) => {
            eprintln!("kernel_speed: ROWS must be a positive integer ({e})");
            std::process::exit(2);
        }
    };
    let width: usize = match std::env::args().nth(2).map(|s| s.parse()) {
        None => 128,
        Some(Ok(n)) if n > 0 => n,
        _ => {
            eprintln!("kernel_speed: WIDTH must be a positive integer");
            std::process::exit(2);
        }
    };
    println!("threads {}, rows {rows}", rayon::current_num_threads());
    for (label, m, k, n, ta) in [
        (
            "gemm X W      (rows x 128 . 128 x 256)",
            rows,
            128,
            256,
            false,
        ),
        (
            "gemm X W      (rows x 256 . 256 x 256)",
            rows,
            256,
            256,
            false,
        ),
        (
            "gemm X^T G    (128 x rows . rows x 256)",
            128,
            rows,
            256,
            true,
        ),
        (
            "gemm X^T G    (256 x rows . rows x 256)",
            256,
            rows,
            256,
            true,
        ),
    ] {
        let a = if ta { filled(k, m) } else { filled(m, k) };
        let b = filled(k, n);
        let mut c = Tensor::zeros(m, n);
        let s = median_s(|| gemm(1.0, &a, ta, &b, false, 0.0, &mut c));
        let gflops = 2.0 * (m * k * n) as f64 / s / 1e9;
        println!("{label}  {:8.3} ms  {gflops:6.1} GFLOP/s", s * 1e3);
    }
    // GraphSAGE's two weight gradients `X_dst^T G` and `A^T G` (rows x 128 each, G rows x
    // 256) with G as sparse as behind a ReLU and dropout: the dense products against the
    // zero-skipping kernel that marks G's non-zeros once for both. Alternating rounds, so that
    // load changes hit both; median of the rounds' medians.
    let (xd, xa) = (filled(rows, width), filled(rows, width));
    let pcts: &[u64] = if fanout_compute::cpu::sparse_grad::available() {
        &[10, 22, 30, 40, 50, 60, 70]
    } else {
        println!("(no AVX2 + FMA: the zero-skipping weight gradient is not measured)");
        &[]
    };
    for &pct in pcts {
        let g = sparse_g(rows, pct, 0x2545_F491_4F6C_DD1D);
        let (mut cd, mut ca) = (Tensor::zeros(width, 256), Tensor::zeros(width, 256));
        let (mut sd, mut sa) = (Tensor::zeros(width, 256), Tensor::zeros(width, 256));
        let (dense, sparse) = alternated(
            || {
                gemm_dense(1.0, &xd, true, &g, false, 0.0, &mut cd);
                gemm_dense(1.0, &xa, true, &g, false, 0.0, &mut ca);
            },
            || {
                gemm_tn_sparse(1.0, &mut [(&xd, &mut sd), (&xa, &mut sa)], &g, 0.0);
            },
        );
        println!(
            "X_dst^T G + A^T G, G {:2.0}% non-zero (2 x {width} x rows . rows x 256): dense {:6.3} ms, zero-skipping {:6.3} ms ({:.2}x), max diff {:.1e}",
            100.0 * density(&g, 1),
            dense * 1e3,
            sparse * 1e3,
            dense / sparse,
            cd.max_abs_diff(&sd).max(ca.max_abs_diff(&sa))
        );
    }
    // A layer's input gradient `G W^T` (rows x 256 . 256 x WIDTH, W stored WIDTH x 256) with
    // G as sparse: the dense product against the kernel that skips G's zeros row by row.
    let w = filled(width, 256);
    for &pct in pcts {
        let g = sparse_g(rows, pct, 0x9E37_79B9_7F4A_7C15);
        let (mut cd, mut cs) = (Tensor::zeros(rows, width), Tensor::zeros(rows, width));
        let (dense, sparse) = alternated(
            || gemm_dense(1.0, &g, false, &w, true, 0.0, &mut cd),
            || {
                gemm_nn_sparse(1.0, &g, &w, true, 0.0, &mut cs);
            },
        );
        println!(
            "G W^T, G {:2.0}% non-zero (rows x 256 . 256 x {width}): dense {:6.3} ms, zero-skipping {:6.3} ms ({:.2}x), max diff {:.1e}",
            100.0 * density(&g, 1),
            dense * 1e3,
            sparse * 1e3,
            dense / sparse,
            cd.max_abs_diff(&cs)
        );
    }
    let x = filled(rows, 256);
    let mut key = 0;
    let s = median_s(|| {
        key += 1;
        std::hint::black_box(CpuBackend.dropout(&x, 0.5, key, None).unwrap());
    });
    // Mean aggregation over a products-like input block: `rows` destinations, 25 sampled
    // sources each out of 20 x rows sources, 100-wide rows.
    let (num_src, fan, width) = (20 * rows, 25, 100);
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let indices: Vec<u32> = (0..rows * fan)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % num_src as u64) as u32
        })
        .collect();
    let indptr: Vec<u32> = (0..=rows).map(|d| (d * fan) as u32).collect();
    let block = CpuBackend
        .prepare_block(&BlockRef {
            num_dst: rows,
            num_src,
            indptr: &indptr,
            indices: &indices,
            weights: None,
        })
        .expect("a valid block");
    let xs = filled(num_src, width);
    let coeff = CpuBackend
        .edge_coefficients(&block, Aggregation::Mean)
        .unwrap();
    let t = median_s(|| {
        std::hint::black_box(CpuBackend.spmm(&block, coeff.as_ref(), &xs).unwrap());
    });
    println!(
        "spmm mean ({rows} dst x {fan} of {num_src} src, width {width}) {:8.3} ms  {:6.2} ns/edge",
        t * 1e3,
        t * 1e9 / (rows * fan) as f64
    );
    println!(
        "dropout p=0.5 (rows x 256)               {:8.3} ms  {:6.2} ns/element",
        s * 1e3,
        s * 1e9 / (rows * 256) as f64
    );
}
