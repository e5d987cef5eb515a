//! Times the CUDA backend's graph kernels against the device's copy bandwidth and the CPU
//! backend on the same block (run on a GPU machine):
//!
//! `cargo run --release --features cuda -p fanout-cuda --example cuda_kernels [DST FANOUT COLS]`
//!
//! The block has DST destinations (default 100,000) with FANOUT (default 10) uniformly drawn
//! sources each among 5 x DST sources, features COLS (default 256) wide: the input layer of a
//! GraphSAGE batch. Prints one line per operation: median of 10 timed runs after 2 warm-ups,
//! the bytes the operation must move at least (gathered source rows read once per edge, output
//! written once), and the rate that gives. The aggregations and row gathers run with the plain
//! kernels and with the Memory-Aware ones (`GraphKernels`). Then a feature gather from an
//! ogbn-products-sized table held on the device (ids uploaded each time, or already on the
//! device); the same gather from the table in page-locked host memory read in place over the
//! bus (`--feature-placement uva`) and gathered on the host and uploaded, against a plain copy
//! of the same bytes from page-locked memory; and the device's copy rate (bytes read +
//! written).

use fanout_compute::{Aggregation, Backend, BlockRef, CpuBackend, Tensor};
use fanout_cuda::{CudaBackend, CudaDevice, GraphKernels};
use fanout_rand::Rng;
use std::time::Instant;

fn median_s(mut f: impl FnMut(), sync: &dyn Fn()) -> f64 {
    for _ in 0..2 {
        f();
    }
    sync();
    let mut t: Vec<f64> = (0..10)
        .map(|_| {
            let s = Instant::now();
            f();
            sync();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[5]
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| {
            a.parse()
                .expect("arguments: DST FANOUT COLS (whole numbers)")
        })
        .collect();
    let (dst, fanout, cols) = (
        *args.first().unwrap_or(&100_000),
        *args.get(1).unwrap_or(&10),
        *args.get(2).unwrap_or(&256),
    );
    let src = 5 * dst;
    let dev = match CudaDevice::open(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("no GPU: {e}");
            std::process::exit(2);
        }
    };
    let g = CudaBackend::new(&dev).expect("CUDA backend");
    println!(
        "device: {} | block: {dst} destinations, {fanout} edges each, {src} sources, {cols} columns",
        dev.name()
    );
    let mut rng = Rng::new(1);
    let indptr: Vec<u32> = (0..=dst).map(|d| (d * fanout) as u32).collect();
    let indices: Vec<u32> = (0..dst * fanout)
        .map(|_| rng.below(src as u64) as u32)
        .collect();
    let br = BlockRef {
        num_dst: dst,
        num_src: src,
        indptr: &indptr,
        indices: &indices,
        weights: None,
    };
    let x = Tensor::from_fn(src, cols, |_, _| rng.next_f32());
    let gd = Tensor::from_fn(dst, cols, |_, _| rng.next_f32());
    let (gb, cb) = (
        g.prepare_block(&br).unwrap(),
        CpuBackend.prepare_block(&br).unwrap(),
    );
    let (gx, ggd) = (g.upload(&x).unwrap(), g.upload(&gd).unwrap());
    let _ = g.aggregate_backward(&gb, &ggd, Aggregation::Mean).unwrap(); // builds the transpose once
    let edges = (dst * fanout) as f64;
    let row = (cols * 4) as f64;
    let gsync = || g.synchronize().unwrap();
    let nosync = || {};
    let report = |name: &str, bytes: f64, gpu_s: f64, cpu_s: f64| {
        println!(
            "{name:<28} GPU {:>9.3} ms {:>8.1} GB/s | CPU {:>9.3} ms ({:.1}x the GPU's time)",
            gpu_s * 1e3,
            bytes / gpu_s / 1e9,
            cpu_s * 1e3,
            cpu_s / gpu_s
        );
    };
    // Each graph kernel with the plain kernels and the Memory-Aware ones, one after the
    // other on the same inputs (both give the same bits).
    let both = |f: &dyn Fn()| {
        g.set_graph_kernels(GraphKernels::Plain);
        let plain = median_s(f, &gsync);
        g.set_graph_kernels(GraphKernels::MemoryAware);
        (plain, median_s(f, &gsync))
    };
    let bytes = edges * row + dst as f64 * row;
    let cpu = median_s(
        || drop(CpuBackend.aggregate(&cb, &x, Aggregation::Mean).unwrap()),
        &nosync,
    );
    let (plain, ma) = both(&|| drop(g.aggregate(&gb, &gx, Aggregation::Mean).unwrap()));
    report("aggregate mean, plain", bytes, plain, cpu);
    report("aggregate mean, memory-aware", bytes, ma, cpu);
    println!("{:<28} memory-aware / plain time {:.3}", "", ma / plain);
    let bytes = edges * row + src as f64 * row;
    let cpu = median_s(
        || {
            drop(
                CpuBackend
                    .aggregate_backward(&cb, &gd, Aggregation::Mean)
                    .unwrap(),
            )
        },
        &nosync,
    );
    let (plain, ma) = both(&|| drop(g.aggregate_backward(&gb, &ggd, Aggregation::Mean).unwrap()));
    report("aggregate backward, plain", bytes, plain, cpu);
    report("aggregate backward, m-aware", bytes, ma, cpu);
    println!("{:<28} memory-aware / plain time {:.3}", "", ma / plain);
    let idx: Vec<u32> = (0..dst).map(|_| rng.below(src as u64) as u32).collect();
    let cpu = median_s(|| drop(CpuBackend.gather_rows(&x, &idx).unwrap()), &nosync);
    let (plain, warp) = both(&|| drop(g.gather_rows(&gx, &idx).unwrap()));
    report("gather_rows, plain", 2.0 * dst as f64 * row, plain, cpu);
    report(
        "gather_rows, warp per row",
        2.0 * dst as f64 * row,
        warp,
        cpu,
    );
    let w = Tensor::from_fn(cols, cols, |_, _| rng.next_f32());
    let gw = g.upload(&w).unwrap();
    let flops = 2.0 * src as f64 * (cols * cols) as f64;
    let gs = median_s(|| drop(g.matmul(&gx, false, &gw, false).unwrap()), &gsync);
    let cs = median_s(
        || drop(CpuBackend.matmul(&x, false, &w, false).unwrap()),
        &nosync,
    );
    println!(
        "{:<28} GPU {:>9.3} ms {:>8.1} TFLOP/s | CPU {:>9.3} ms ({:.1}x)",
        "gemm S x C x C (FP32)",
        gs * 1e3,
        flops / gs / 1e12,
        cs * 1e3,
        cs / gs
    );
    // Feature extraction with every row on the device (--feature-placement device): the
    // rows of a batch's input vertices gathered from an ogbn-products-sized table.
    let (table_rows, feat, batch_rows) = (2_449_029usize, 100usize, 1_000_000usize);
    let table = g
        .upload(&Tensor::from_fn(table_rows, feat, |r, c| (r + c) as f32))
        .unwrap();
    let ids: Vec<u32> = (0..batch_rows)
        .map(|_| rng.below(table_rows as u64) as u32)
        .collect();
    let line = |what: &str, secs: f64| {
        println!(
            "{what:<28} GPU {:>9.3} ms {:>8.1} GB/s ({batch_rows} random rows of a {table_rows} x {feat} table, rows read + written)",
            secs * 1e3,
            2.0 * (batch_rows * feat * 4) as f64 / secs / 1e9
        )
    };
    let (plain, warp) = both(&|| drop(g.gather_rows(&table, &ids).unwrap()));
    line("features, plain, ids up", plain);
    line("features, warp, ids up", warp);
    let dev_ids = g.upload_ids(&ids).unwrap();
    let resident = median_s(
        || drop(g.gather_rows_device(&table, &dev_ids, batch_rows).unwrap()),
        &gsync,
    );
    line("features, warp, ids on GPU", resident);
    // The same table in page-locked host memory, gathered by the GPU over the bus
    // (--feature-placement uva), against the bus's own rate: one copy of the gathered bytes
    // from page-locked memory.
    let host_table = Tensor::from_fn(table_rows, feat, |r, c| (r + c) as f32);
    let mapped = g
        .map_host_rows(table_rows, feat, &mut |t| {
            t.copy_from_slice(host_table.data())
        })
        .expect("the CUDA backend maps host rows")
        .expect("page-locked memory for the table");
    let zero_copy = median_s(
        || drop(g.gather_mapped_rows(&mapped, &ids, None).unwrap()),
        &gsync,
    );
    let host_gather = median_s(
        || drop(CpuBackend.gather_rows(&host_table, &ids).unwrap()),
        &nosync,
    );
    let staged = median_s(
        || {
            drop(
                g.upload(&CpuBackend.gather_rows(&host_table, &ids).unwrap())
                    .unwrap(),
            )
        },
        &gsync,
    );
    let bytes = (batch_rows * feat * 4) as f64;
    let stream = dev.new_stream().expect("a stream");
    let pinned = dev
        .pinned_zeroed::<f32>(batch_rows * feat)
        .expect("pinned memory");
    let mut on_dev = stream
        .inner()
        .alloc_zeros::<f32>(batch_rows * feat)
        .expect("device memory");
    let bus = median_s(
        || {
            stream
                .inner()
                .memcpy_htod(pinned.inner(), &mut on_dev)
                .expect("copy")
        },
        &|| stream.synchronize().expect("sync"),
    );
    let over_bus = |what: &str, secs: f64| {
        println!(
            "{what:<28} GPU {:>9.3} ms {:>8.1} GB/s over the bus ({:.0} MB of rows)",
            secs * 1e3,
            bytes / secs / 1e9,
            bytes / 1e6
        )
    };
    over_bus("features, zero-copy (uva)", zero_copy);
    over_bus("features, host gather+upload", staged);
    println!(
        "{:<28} CPU {:>9.3} ms (of which the host gather on all cores)",
        "",
        host_gather * 1e3
    );
    over_bus("copy from page-locked memory", bus);
    drop(table);
    let copy = median_s(|| drop(g.copy(&gx).unwrap()), &gsync);
    println!(
        "{:<28} GPU {:>9.3} ms {:>8.1} GB/s (read + written)",
        "device copy of x",
        copy * 1e3,
        2.0 * src as f64 * row / copy / 1e9
    );
    gradient_sums(&dev, &mut rng);
}

/// A step's gradient sum for a data-parallel worker (eight tensors, 1M values in all), one
/// rank: read back, scaled and written again as the host path does, against the NCCL group's
/// sum on the device (a group of one: the all-gather is a copy; more ranks add the transfers).
fn gradient_sums(dev: &CudaDevice, rng: &mut Rng) {
    if !fanout_cuda::nccl_present() {
        println!("gradient sum: NCCL (libnccl.so) cannot be loaded here; skipped");
        return;
    }
    let g = CudaBackend::new(dev).expect("CUDA backend");
    let id = fanout_cuda::nccl_unique_id().expect("NCCL id");
    g.join_group(&id, 0, 1).expect("NCCL group of one");
    let mut grads: Vec<_> = (0..8)
        .map(|_| {
            g.upload(&Tensor::from_fn(256, 512, |_, _| rng.next_f32()))
                .unwrap()
        })
        .collect();
    let sync = || g.synchronize().unwrap();
    let host = median_s(
        || {
            for t in grads.iter_mut() {
                let mut h = g.download(t).unwrap();
                h.data_mut().iter_mut().for_each(|v| *v *= 0.5);
                *t = g.upload_owned(h).unwrap();
            }
        },
        &sync,
    );
    let nccl = median_s(
        || {
            let mut refs: Vec<_> = grads.iter_mut().collect();
            g.sum_over_group(&mut refs, 2.0, 0.5).unwrap();
        },
        &sync,
    );
    println!(
        "{:<28} GPU {:>9.3} ms through the host, {:.3} ms on the device (NCCL group of one)",
        "gradient sum, 4 MB",
        host * 1e3,
        nccl * 1e3
    );
}
