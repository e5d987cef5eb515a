//! Weight-gradient products `A^T G` with a long inner dimension (a layer's rows), computed by
//! `gemm_dense` (split along the inner dimension once the inputs pass 8 MiB) and by
//! `gemm_dense_tiled` (always one full-length product per 128 x 128 output tile), alternating
//! call by call on the same data: `cargo run --release -p fanout-compute --example tn_speed`
//! (set `RAYON_NUM_THREADS`). Prints each shape's median GFLOP/s for both and their ratio.
use fanout_compute::cpu::gemm::{gemm_dense, gemm_dense_tiled};
use fanout_compute::Tensor;
use std::time::Instant;

/// `m x k x n`: `m` the layer's input width, `k` its rows, `n` its output width.
const SHAPES: [(usize, usize, usize); 7] = [
    (128, 3_700, 256),
    (256, 3_700, 256),
    (128, 8_000, 256),
    (256, 8_000, 256),
    (256, 20_000, 256),
    (256, 40_000, 47),
    (256, 150_000, 256),
];
/// Timed calls of each, after two warm-up calls.
const CALLS: usize = 15;

fn median(mut t: Vec<f64>) -> f64 {
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn main() {
    println!("| m x k x n | gemm_dense GFLOP/s | tiles GFLOP/s | ratio |\n|---|---|---|---|");
    for (m, k, n) in SHAPES {
        let a = Tensor::from_fn(k, m, |i, j| {
            ((i * 31 + j * 17) % 1000) as f32 / 1000.0 - 0.5
        });
        let g = Tensor::from_fn(k, n, |i, j| ((i * 13 + j * 7) % 1000) as f32 / 1000.0 - 0.5);
        let mut c = Tensor::zeros(m, n);
        let (mut ours, mut tiles) = (Vec::new(), Vec::new());
        for call in 0..CALLS + 2 {
            let t = Instant::now();
            gemm_dense(1.0, &a, true, &g, false, 0.0, &mut c);
            let x = t.elapsed().as_secs_f64();
            let t = Instant::now();
            gemm_dense_tiled(1.0, &a, true, &g, false, 0.0, &mut c);
            let y = t.elapsed().as_secs_f64();
            if call >= 2 {
                ours.push(x);
                tiles.push(y);
            }
        }
        let flops = 2.0 * (m * k * n) as f64;
        let (x, y) = (median(ours), median(tiles));
        println!(
            "| {m} x {k} x {n} | {:.1} | {:.1} | {:.2}x |",
            flops / x / 1e9,
            flops / y / 1e9,
            y / x
        );
    }
}
