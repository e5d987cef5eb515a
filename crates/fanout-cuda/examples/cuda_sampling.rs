//! Times k-hop sampling on the GPU (`CudaSampler`), with the arcs in device memory and read
//! from pinned host memory (UVA), against the CPU sampler on all cores, on the same seeds and
//! keys; uniform, then weighted when the dataset has `weight.bin` (`fanout dataset weights`),
//! then PinSAGE random walks (GNNLab's setting: top 5 of 4 walks of length 3 per layer, 3
//! layers, whatever FANOUTS says) (run on a GPU machine):
//!
//! `cargo run --release --features cuda -p fanout-cuda --example cuda_sampling DATASET [BATCH FANOUTS BATCHES]`
//!
//! DATASET is a dataset directory (`fanout dataset gen --preset products DIR`); BATCH seeds
//! per batch (default 8000), FANOUTS in hop order (default 15,10,5), BATCHES timed batches
//! (default 20, after 2 warm-ups). Seeds are the training set, shuffled. Prints, per sampler,
//! the median batch time, seeds per second (SEPS), edges per second, and whether every GPU
//! batch equals the CPU's (checked in a second, untimed pass). Timed batches are dropped as
//! they come, and the allocator is `fanout train`'s, so host buffers are reused as in training.

use fanout_cuda::{ArcsAt, CudaBackend, CudaDevice, CudaSampler};
use fanout_graph::{Dataset, NoProgress};
use fanout_rand::Rng;
use fanout_sample::{
    alias::files, parse_fanouts, AliasTables, BatchKey, KHopConfig, KHopSampler, MiniBatch,
    RandomWalkConfig, RandomWalkSampler, RemapKind, Sampler, WeightedConfig, WeightedSampler,
};
use std::sync::Arc;
use std::time::Instant;

// As `fanout train`: freed batch buffers are kept and reused, so a batch's host vectors do not
// fault in fresh pages each time.
#[global_allocator]
static ALLOC: fanout_compute::HugePageAlloc = fanout_compute::HugePageAlloc;

/// The median time of a batch of `s`, each batch dropped after it is timed (as training drops
/// it), after 2 warm-ups.
fn timed(s: &dyn Sampler, batches: &[(Vec<u32>, BatchKey)]) -> f64 {
    for (seeds, key) in batches.iter().take(2) {
        s.sample(seeds, *key).expect("sample");
    }
    let mut times = Vec::new();
    for (seeds, key) in batches {
        let t = Instant::now();
        let b = s.sample(seeds, *key).expect("sample");
        times.push(t.elapsed().as_secs_f64());
        drop(b);
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// Whether every batch of `a` equals `b`'s, and the mean edges of `b`'s batches.
fn same_batches(a: &dyn Sampler, b: &dyn Sampler, batches: &[(Vec<u32>, BatchKey)]) -> (bool, f64) {
    let mut edges = 0usize;
    let mut same = true;
    for (seeds, key) in batches {
        let (x, y): (MiniBatch, MiniBatch) = (
            a.sample(seeds, *key).expect("sample"),
            b.sample(seeds, *key).expect("sample"),
        );
        same &= x == y;
        edges += y.blocks.iter().map(|x| x.num_edges()).sum::<usize>();
    }
    (same, edges as f64 / batches.len() as f64)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dir) = args.first() else {
        eprintln!("usage: cuda_sampling DATASET [BATCH FANOUTS BATCHES]");
        std::process::exit(2);
    };
    let batch: usize = args.get(1).map_or(8000, |a| a.parse().expect("BATCH"));
    let fanouts = parse_fanouts(args.get(2).map_or("15,10,5", String::as_str)).expect("FANOUTS");
    let count: u64 = args.get(3).map_or(20, |a| a.parse().expect("BATCHES"));
    let ds = Arc::new(Dataset::open(dir).expect("open the dataset"));
    let dev = match CudaDevice::open(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("no GPU: {e}");
            std::process::exit(2);
        }
    };
    let be = CudaBackend::new(&dev).expect("CUDA backend");
    let mut train: Vec<u32> = ds.train.to_vec();
    Rng::new(1).shuffle(&mut train);
    let batches: Vec<(Vec<u32>, BatchKey)> = (0..count)
        .map(|step| {
            let from = (step as usize * batch) % train.len().max(1);
            let seeds = train
                .iter()
                .cycle()
                .skip(from)
                .take(batch.min(train.len()))
                .copied()
                .collect();
            (
                seeds,
                BatchKey {
                    seed: 1,
                    epoch: 0,
                    step,
                },
            )
        })
        .collect();
    let cfg = KHopConfig {
        fanouts: fanouts.clone(),
        replace: false,
        remap: RemapKind::Auto,
    };
    println!(
        "device: {} | {} vertices, {} arcs | batch {batch}, fanouts {fanouts:?}, {count} batches | \
         {} CPU threads",
        dev.name(),
        ds.num_nodes(),
        ds.meta.num_edge,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    let mut same = compare(
        "uniform",
        &|at| CudaSampler::with_arcs(&be, ds.clone(), cfg.clone(), at),
        &KHopSampler::new(ds.clone(), cfg.clone()).expect("CPU sampler"),
        &batches,
    );
    if ds.dir.join(files::WEIGHT).exists() {
        let tables = Arc::new(AliasTables::load_or_build(&ds, &NoProgress).expect("alias tables"));
        let w = WeightedConfig {
            fanouts: cfg.fanouts.clone(),
            replace: false,
            remap: RemapKind::Auto,
        };
        let cpu = WeightedSampler::new(ds.clone(), w.clone(), tables.clone()).expect("CPU sampler");
        same &= compare(
            "weighted",
            &|at| CudaSampler::weighted(&be, ds.clone(), w.clone(), tables.clone(), at),
            &cpu,
            &batches,
        );
    } else {
        println!("weighted: no {} in the dataset, not timed", files::WEIGHT);
    }
    let walks = RandomWalkConfig::default();
    let cpu = RandomWalkSampler::new(ds.clone(), walks.clone()).expect("CPU sampler");
    same &= compare(
        "random walks",
        &|at| CudaSampler::random_walk(&be, ds.clone(), walks.clone(), at),
        &cpu,
        &batches,
    );
    if !same {
        std::process::exit(1);
    }
}

/// Times the GPU sampler `gpu` makes (arcs on the device, then pinned) against `cpu` on
/// `batches`, prints the figures, and says whether every GPU batch equals the CPU's.
fn compare(
    kind: &str,
    gpu: &dyn Fn(ArcsAt) -> fanout_graph::Result<CudaSampler>,
    cpu: &dyn Sampler,
    batches: &[(Vec<u32>, BatchKey)],
) -> bool {
    let t = Instant::now();
    let dev = gpu(ArcsAt::Device).expect("GPU sampler");
    let setup = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let uva = gpu(ArcsAt::PinnedHost).expect("GPU sampler, arcs in pinned host memory");
    let setup_uva = t.elapsed().as_secs_f64();
    let g = timed(&dev, batches);
    let u = timed(&uva, batches);
    let c = timed(cpu, batches);
    let (same_device, edges) = same_batches(&dev, cpu, batches);
    let (same_pinned, _) = same_batches(&uva, cpu, batches);
    let same = same_device && same_pinned;
    let batch = batches.first().map_or(0, |b| b.0.len());
    println!(
        "{kind}: GPU sampler set-up {setup:.3} s (arcs on the device), {setup_uva:.3} s (pinned)"
    );
    for (name, t) in [
        ("GPU, arcs on the device", g),
        ("GPU, arcs pinned on the host", u),
        ("CPU", c),
    ] {
        println!(
            "{kind}, {name}: median batch {:.2} ms | {:.0} seeds/s | {:.1} M edges/s",
            t * 1e3,
            batch as f64 / t,
            edges / t / 1e6
        );
    }
    println!(
        "{kind}: GPU / CPU speed: {:.1}x (arcs on the device), {:.1}x (pinned) | {edges:.0} edges \
         per batch | GPU batches equal the CPU's: {same}",
        c / g,
        c / u
    );
    same
}
