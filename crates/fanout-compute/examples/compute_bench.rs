//! Throughput of the CPU backend's main kernels at the papers' sizes (batch 8000, hidden 256).
//!
//! Run: `RAYON_NUM_THREADS=2 cargo run --release -p fanout-compute --example compute_bench`
//! Prints GFLOP/s for the dense products of a 256-wide layer (forward `X W`, and the two
//! backward shapes `G W^T`, `X^T G`) and edge throughput for mean aggregation and its
//! backward.

use std::time::Instant;

use std::collections::HashMap;

use fanout_compute::{
    Adam, Aggregation, Backend, BlockRef, CpuBackend, Mode, Model, ModelConfig, ModelKind,
    Optimizer, Tensor,
};
use fanout_rand::Rng;

fn rand(rows: usize, cols: usize, rng: &mut Rng) -> Tensor {
    Tensor::from_fn(rows, cols, |_, _| rng.next_f32() * 2.0 - 1.0)
}

/// Best-of-`reps` seconds of `f`.
fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// A mini-batch with DGL frontier semantics over random neighbours in a graph of `n`
/// vertices: `(num_src, indptr, indices)` per block, outermost first.
fn random_batch(
    seeds: usize,
    fanouts_from_seeds: &[usize],
    n: u64,
    rng: &mut Rng,
) -> Vec<(usize, Vec<u32>, Vec<u32>)> {
    let mut local: HashMap<u64, u32> = (0..seeds as u64).map(|v| (v, v as u32)).collect();
    let mut order: Vec<u64> = (0..seeds as u64).collect();
    let mut blocks = Vec::new();
    let mut num_dst = seeds;
    for &f in fanouts_from_seeds {
        let (mut indptr, mut indices) = (vec![0u32], Vec::new());
        for _ in 0..num_dst {
            for _ in 0..f {
                let g = rng.below(n);
                let next = order.len() as u32;
                let id = *local.entry(g).or_insert_with(|| {
                    order.push(g);
                    next
                });
                indices.push(id);
            }
            indptr.push(indices.len() as u32);
        }
        blocks.push((order.len(), indptr, indices));
        num_dst = order.len();
    }
    blocks.reverse();
    blocks
}

/// One GraphSAGE training step (2 layers, fanouts 10,25 from the seeds, hidden 256).
fn sage_step(be: CpuBackend, rng: &mut Rng) {
    let (seeds, in_dim, classes) = (2000, 128, 47);
    let batch = random_batch(seeds, &[10, 25], 2_000_000, rng);
    let block_refs: Vec<BlockRef<'_>> = batch
        .iter()
        .map(|(num_src, indptr, indices)| BlockRef {
            num_dst: indptr.len() - 1,
            num_src: *num_src,
            indptr,
            indices,
            weights: None,
        })
        .collect();
    let edges: usize = block_refs.iter().map(|b| b.num_edges()).sum();
    let inputs = block_refs[0].num_src;
    let mut model = Model::new(
        be,
        ModelConfig::new(ModelKind::Sage, in_dim, 256, classes, 2),
    )
    .expect("model");
    let mut opt = Adam::new(be, 0.003);
    let x = rand(inputs, in_dim, rng);
    let labels: Vec<i64> = (0..seeds)
        .map(|_| rng.below(classes as u64) as i64)
        .collect();
    let t = best(5, || {
        let blocks = model.prepare_blocks(&block_refs).expect("blocks");
        let logits = model
            .forward(&blocks, x.clone(), Mode::Train { dropout_key: 1 })
            .expect("forward");
        let ce = be.softmax_cross_entropy(&logits, &labels).expect("loss");
        model.zero_grad().unwrap();
        model.backward(&ce.grad).expect("backward");
        opt.step_model(&mut model).expect("step");
    });
    println!(
        "sage train step: {seeds} seeds, {inputs} input nodes x {in_dim}, {edges} edges: {:7.2} ms",
        t * 1e3
    );
}

fn main() {
    let be = CpuBackend;
    let mut rng = Rng::new(1);
    println!("threads: {}", rayon::current_num_threads());
    let (m, k, n) = (8000, 256, 256);
    let x = rand(m, k, &mut rng);
    let w = rand(k, n, &mut rng);
    let g = rand(m, n, &mut rng);
    let flops = 2.0 * (m * k * n) as f64;
    let mut c = Tensor::zeros(m, n);
    let t = best(10, || {
        be.gemm(1.0, &x, false, &w, false, 0.0, &mut c).unwrap()
    });
    println!(
        "gemm X W      {m}x{k} * {k}x{n}: {:7.2} ms  {:6.1} GFLOP/s",
        t * 1e3,
        flops / t / 1e9
    );
    let mut dx = Tensor::zeros(m, k);
    let t = best(10, || {
        be.gemm(1.0, &g, false, &w, true, 0.0, &mut dx).unwrap()
    });
    println!(
        "gemm G W^T    {m}x{n} * {n}x{k}: {:7.2} ms  {:6.1} GFLOP/s",
        t * 1e3,
        flops / t / 1e9
    );
    let mut dw = Tensor::zeros(k, n);
    let t = best(10, || {
        be.gemm(1.0, &x, true, &g, false, 0.0, &mut dw).unwrap()
    });
    println!(
        "gemm X^T G    {k}x{m} * {m}x{n}: {:7.2} ms  {:6.1} GFLOP/s",
        t * 1e3,
        flops / t / 1e9
    );

    // Mean aggregation of a block shaped like GraphSAGE's first hop: 8000 seeds, 10
    // neighbours each, drawn from 60000 sources, 256 wide.
    let (dst, src, fanout) = (8000usize, 60000usize, 10usize);
    let indptr: Vec<u32> = (0..=dst).map(|d| (d * fanout) as u32).collect();
    let indices: Vec<u32> = (0..dst * fanout)
        .map(|_| rng.below(src as u64) as u32)
        .collect();
    let block = be
        .prepare_block(&BlockRef {
            num_dst: dst,
            num_src: src,
            indptr: &indptr,
            indices: &indices,
            weights: None,
        })
        .unwrap();
    let h = rand(src, 256, &mut rng);
    let t = best(10, || {
        std::hint::black_box(be.aggregate(&block, &h, Aggregation::Mean).unwrap());
    });
    let edges = (dst * fanout) as f64;
    println!(
        "mean aggregate {dst} dst x {fanout} edges x 256: {:7.2} ms  {:6.1} M edges/s",
        t * 1e3,
        edges / t / 1e6
    );
    let gd = rand(dst, 256, &mut rng);
    // Baseline for the backward: just allocating and writing its 60000 x 256 output (fresh
    // pages; on a small VM this alone is a large part of the time).
    let t = best(10, || {
        let mut z = be.zeros(src, 256).unwrap();
        be.scale(&mut z, 0.0).unwrap();
        std::hint::black_box(z);
    });
    println!(
        "baseline: allocate + write a {src}x256 tensor:     {:7.2} ms",
        t * 1e3
    );
    let t = best(10, || {
        std::hint::black_box(
            be.aggregate_backward(&block, &gd, Aggregation::Mean)
                .unwrap(),
        );
    });
    println!(
        "mean aggregate backward (to {src} sources):     {:7.2} ms  {:6.1} M edges/s",
        t * 1e3,
        edges / t / 1e6
    );
    sage_step(be, &mut rng);
}
