//! Dense products with a row-major `A` (the layer products `X W` and `G W^T`), computed by
//! `gemm_dense` (which reads `A` in place for a narrow `B` where the CPU has the kernel) and
//! by `gemm_matrixmultiply` (a column-major copy of `A`, then `matrixmultiply`), alternating
//! in rounds on the same data: `cargo run --release -p fanout-compute --example gemm_speed
//! [-- --transposed-b]` (set `RAYON_NUM_THREADS`). Prints each shape's median GFLOP/s for both
//! and their ratio.
use fanout_compute::cpu::gemm::{gemm_dense, gemm_matrixmultiply};
use fanout_compute::Tensor;
use std::time::Instant;

/// `m x k x n` shapes of GraphSAGE and GCN layers: hidden 64 and 128, 47 classes, wide
/// features, and wide outputs (where `gemm_dense` uses `matrixmultiply` too).
const SHAPES: [(usize, usize, usize); 15] = [
    (80_000, 256, 64),
    (40_000, 256, 47),
    (20_000, 256, 128),
    (5_000, 1024, 64),
    (5_000, 4096, 64),
    (2_000, 602, 47),
    (1_024, 256, 47),
    (80_000, 64, 256),
    (10_000, 100, 256),
    (10_000, 256, 256),
    (3_000, 1024, 256),
    (10_000, 256, 512),
    (3_000, 1024, 1024),
    (2_000, 4096, 512),
    // The shape the machine's GEMM rate is measured on (`MachineRates::measure`).
    (1_024, 1024, 1024),
];
const ROUNDS: usize = 5;
const PER_ROUND: usize = 4;

fn filled(r: usize, c: usize, seed: usize) -> Tensor {
    Tensor::from_fn(r, c, |i, j| {
        ((i * 31 + j * 17 + seed) % 1000) as f32 / 1000.0 - 0.5
    })
}

fn median(mut t: Vec<f64>) -> f64 {
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn main() {
    let transposed_b = std::env::args().any(|a| a == "--transposed-b");
    println!(
        "| m x k x n | gemm_dense GFLOP/s | matrixmultiply GFLOP/s | ratio |\n|---|---|---|---|"
    );
    for (m, k, n) in SHAPES {
        let a = filled(m, k, 0);
        let b = if transposed_b {
            filled(n, k, 7)
        } else {
            filled(k, n, 7)
        };
        let mut c = Tensor::zeros(m, n);
        let (mut ours, mut reference) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            for _ in 0..PER_ROUND {
                let t = Instant::now();
                gemm_dense(1.0, &a, false, &b, transposed_b, 0.0, &mut c);
                ours.push(t.elapsed().as_secs_f64());
            }
            for _ in 0..PER_ROUND {
                let t = Instant::now();
                gemm_matrixmultiply(1.0, &a, false, &b, transposed_b, 0.0, &mut c);
                reference.push(t.elapsed().as_secs_f64());
            }
        }
        let flops = 2.0 * (m * k * n) as f64;
        let (x, y) = (median(ours), median(reference));
        println!(
            "| {m} x {k} x {n} | {:.1} | {:.1} | {:.2}x |",
            flops / x / 1e9,
            flops / y / 1e9,
            y / x
        );
    }
}
