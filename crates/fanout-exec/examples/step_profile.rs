//! Where a GraphSAGE training step's time goes when nothing else competes for the cores:
//!
//! `cargo run --release -p fanout-exec --example step_profile -- DATASET [BATCH] [EPOCHS]`
//!
//! (fanouts 10,25, hidden 256, dropout 0.5, Adam lr 0.003, as `bench/train_vs_dgl.sh`; set
//! `RAYON_NUM_THREADS` for the thread count). One epoch of shuffled batches is sampled and
//! its features gathered into memory first; then the model trains on those batches EPOCHS
//! times (default 4, at least 2), each step on a pool worker as the trainer runs it, and the
//! median per-step milliseconds of forward, loss, backward and optimiser are printed, over
//! every epoch after the first. In `fanout train` the same steps
//! share the cores with the sample and extract stages, so its train stage is slower than the
//! sum printed here by about what those stages use; compare this sum with a peer's train-stage
//! time to see how much of a gap is the step itself.
use fanout_cache::{Extractor, PlainExtractor};
use fanout_compute::{
    Adam, Backend, CpuBackend, Mode, Model, ModelConfig, ModelKind, Optimizer, Tensor,
};
use fanout_graph::Dataset;
use fanout_sample::{BatchKey, KHopConfig, KHopSampler, MiniBatch, RemapKind, Sampler};
use std::sync::Arc;
use std::time::Instant;

fn usage(why: &str) -> ! {
    eprintln!("step_profile: {why}\nusage: step_profile DATASET [BATCH] [EPOCHS]");
    std::process::exit(2);
}

fn arg(args: &[String], i: usize, default: usize, name: &str) -> usize {
    match args.get(i).map(|s| s.parse::<usize>()) {
        None => default,
        Some(Ok(v)) if v > 0 => v,
        _ => usage(&format!("{name} must be a positive integer")),
    }
}

fn median_ms(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2] * 1e3
}

fn main() {
    fanout_exec::tune_allocator(); // as `fanout train` does
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = args.first().unwrap_or_else(|| usage("DATASET is missing"));
    let batch = arg(&args, 1, 1024, "BATCH");
    let epochs = arg(&args, 2, 4, "EPOCHS").max(2);
    let ds = Arc::new(Dataset::open(dir).unwrap_or_else(|e| usage(&e.to_string())));
    let dim = match &ds.features {
        Some(f) => f.dim,
        None => usage("the dataset has no features"),
    };
    let cfg = KHopConfig {
        fanouts: vec![10, 25],
        replace: false,
        remap: RemapKind::Auto,
    };
    let sampler = KHopSampler::new(ds.clone(), cfg).unwrap_or_else(|e| usage(&e.to_string()));
    let mut extractor = PlainExtractor::new(ds.clone()).unwrap_or_else(|e| usage(&e.to_string()));

    // Shuffled training seeds (any fixed permutation will do).
    let mut seeds = ds.train.to_vec();
    fanout_rand::Rng::new(1).shuffle(&mut seeds);
    let batches: Vec<(MiniBatch, Vec<f32>)> = seeds
        .chunks(batch)
        .enumerate()
        .map(|(step, s)| {
            let key = BatchKey {
                seed: 1,
                epoch: 0,
                step: step as u64,
            };
            let mb = sampler
                .sample(s, key)
                .unwrap_or_else(|e| usage(&e.to_string()));
            let mut rows = Vec::new();
            extractor
                .extract(&mb.input_nodes, &mut rows)
                .unwrap_or_else(|e| usage(&e.to_string()));
            (mb, rows)
        })
        .collect();
    if batches.is_empty() || batches[0].0.labels.is_none() {
        usage("the dataset needs training vertices and labels");
    }

    let be = CpuBackend;
    let mc = ModelConfig::new(ModelKind::Sage, dim, 256, ds.meta.num_class as usize, 2);
    let mut model = Model::new(be, mc).unwrap_or_else(|e| usage(&e.to_string()));
    let mut opt = Adam::new(be, 0.003);
    let mut phases: [Vec<f64>; 4] = Default::default();
    for epoch in 0..epochs {
        for (step, (mb, rows)) in batches.iter().enumerate() {
            let refs = fanout_exec::block_refs(&mb.blocks);
            let labels = mb.labels.as_deref().expect("checked above");
            let x = Tensor::new(mb.input_nodes.len(), dim, rows.clone());
            // On a pool worker, as the trainer runs steps of this size (`run_step`): from any
            // other thread each of the step's parallel kernels pays a hand-over to the pool.
            let times = be.on_compute_threads(|| {
                let t0 = Instant::now();
                let blocks = model
                    .prepare_blocks(&refs)
                    .expect("sampled blocks are valid");
                let mode = Mode::Train {
                    dropout_key: (epoch * batches.len() + step) as u64,
                };
                let logits = model.forward(&blocks, x, mode).expect("shapes match");
                let t1 = Instant::now();
                let ce = be
                    .softmax_cross_entropy(&logits, labels)
                    .expect("labels in range");
                let t2 = Instant::now();
                model.zero_grad().unwrap();
                model.backward(&ce.grad).expect("after a training forward");
                let t3 = Instant::now();
                opt.step_model(&mut model)
                    .expect("gradients match the parameters");
                let t4 = Instant::now();
                [(t0, t1), (t1, t2), (t2, t3), (t3, t4)]
            });
            if epoch > 0 {
                for (p, (a, b)) in phases.iter_mut().zip(times) {
                    p.push((b - a).as_secs_f64());
                }
            }
        }
    }
    let n = batches.len();
    let mean = |f: fn(&MiniBatch) -> usize| batches.iter().map(|(mb, _)| f(mb)).sum::<usize>() / n;
    let (dst, src) = (mean(|m| m.blocks[0].num_dst), mean(|m| m.blocks[0].num_src));
    let [fwd, loss, bwd, adam] = phases.each_mut().map(|p| median_ms(p));
    println!(
        "{n} batches of {batch}, input block {dst} dst / {src} src (mean), {} threads",
        rayon::current_num_threads()
    );
    println!(
        "per step, median ms: forward {fwd:.2}  loss {loss:.2}  backward {bwd:.2}  optimiser {adam:.2}  \
         total {:.2} (x {n} = {:.3} s per epoch)",
        fwd + loss + bwd + adam,
        (fwd + loss + bwd + adam) * n as f64 / 1e3
    );
}
