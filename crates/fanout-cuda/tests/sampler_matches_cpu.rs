//! GPU sampling against the CPU samplers: the same mini-batches bit for bit (draws, their
//! order, local ids, input vertices, labels) with the arcs on the device or read from pinned
//! host memory, with and without replacement, for fanouts that
//! reach every branch of the CPU's Floyd sampling (rows of at most 64 arcs, at most 4096, and
//! longer; k above and below 64) and "all"; single hops; and the same errors. Weighted
//! sampling likewise, block weights included, over rows of random, zero and concentrated
//! weights (the exact scan after rejection gives up), and its device blocks aggregate as the
//! host's; and PinSAGE random walks, visit counts and their order included. Skips itself,
//! printing why, where there is no GPU.
#![cfg(feature = "cuda")]

mod common;
use common::gpu;
use fanout_compute::{Aggregation, Backend, BlockRef, CpuBackend, Tensor};
use fanout_cuda::{ArcsAt, CudaSampler};
use fanout_graph::{
    build_topology, files, BuildOptions, Dataset, DatasetWriter, Layout, Meta, NoProgress,
    SliceArcs,
};
use fanout_rand::Rng;
use fanout_sample::alias::write_weights;
use fanout_sample::{
    AliasTables, BatchKey, KHopConfig, KHopSampler, MiniBatch, RandomWalkConfig, RandomWalkSampler,
    RemapKind, Sampler, WeightedConfig, WeightedSampler, FANOUT_ALL,
};
use std::sync::Arc;

/// Vertex 0 has 6,000 in-neighbours (past the 4,096-arc bit map), vertex 1 has 300, vertex 2
/// none; the others 0 to 40 (a tenth none).
fn graph(n: u64) -> Arc<Dataset> {
    let mut r = Rng::new(5);
    let mut arcs: Vec<(u64, u64)> = (1..=6000.min(n - 1)).map(|s| (s, 0)).collect();
    arcs.extend((0..300).map(|_| (r.below(n), 1)));
    for d in 3..n {
        let deg = if r.bernoulli(0.1) { 0 } else { r.below(41) };
        arcs.extend((0..deg).map(|_| (r.below(n), d)));
    }
    let mut w = DatasetWriter::temporary().unwrap();
    let opts = BuildOptions {
        layout: Layout::Csc,
        dedup: true,
        num_nodes: Some(n),
        ..Default::default()
    };
    let st = build_topology(&mut SliceArcs(&arcs), &opts, &mut w, &NoProgress).unwrap();
    let labels: Vec<i64> = (0..n as i64).map(|v| v % 7).collect();
    w.write_array(files::LABEL, &labels).unwrap();
    let train: Vec<u32> = (0..n as u32 / 2).collect();
    w.write_array(files::TRAIN, &train).unwrap();
    let meta = Meta {
        num_node: n,
        num_edge: st.num_arcs,
        num_class: 7,
        num_train_set: train.len() as u64,
        layout: Layout::Csc,
        ..Meta::default()
    };
    Arc::new(w.finish(meta, &NoProgress).unwrap())
}

fn config(fanouts: &[u32], replace: bool) -> KHopConfig {
    KHopConfig {
        fanouts: fanouts.to_vec(),
        replace,
        remap: RemapKind::Auto,
    }
}

/// Seeds 0, 1, 2 (the long rows and the empty one) and `b - 3` others, shuffled by `step`.
fn seeds(n: u64, b: usize, step: u64) -> Vec<u32> {
    let mut all: Vec<u32> = (3..n as u32).collect();
    Rng::new(step).shuffle(&mut all);
    let mut s = vec![0, 1, 2];
    s.extend(&all[..b - 3]);
    Rng::new(step + 100).shuffle(&mut s);
    s
}

/// Samples three batches (`sizes[step]` seeds, steps 0 to 2 of `seed` and `epoch`) with both
/// samplers and asserts they are equal: block counts, sizes, edges and weights (weighted
/// blocks: `weighted`) first for a readable message; returns the edges compared.
fn same_batches(
    gpu: &CudaSampler,
    cpu: &dyn Sampler,
    n: u64,
    sizes: [usize; 3],
    (seed, epoch): (u64, u64),
    weighted: bool,
    what: &str,
) -> usize {
    let mut checked = 0;
    for step in 0..3u64 {
        let key = BatchKey { seed, epoch, step };
        let s = seeds(n, sizes[step as usize], step);
        let want = cpu.sample(&s, key).unwrap();
        let got = gpu.sample(&s, key).unwrap();
        assert_eq!(got.blocks.len(), want.blocks.len(), "{what} step {step}");
        for (l, (g, w)) in got.blocks.iter().zip(&want.blocks).enumerate() {
            assert_eq!(
                (g.num_dst, g.num_src),
                (w.num_dst, w.num_src),
                "{what} step {step} block {l}: sizes"
            );
            assert!(
                g.indptr == w.indptr && g.indices == w.indices,
                "{what} step {step} block {l}: edges differ"
            );
            assert!(
                g.weights.is_some() == weighted && g.weights == w.weights,
                "{what} step {step} block {l}: weights differ"
            );
        }
        assert_eq!(got, want, "{what} step {step}");
        got.validate().unwrap();
        checked += got.blocks.iter().map(|b| b.num_edges()).sum::<usize>();
    }
    checked
}

#[test]
fn batches_are_the_cpu_samplers_bit_for_bit() {
    let Some(dev) = gpu() else { return };
    let ds = graph(20_000);
    let cases: &[&[u32]] = &[&[25, 10], &[15, 10, 5], &[100, 3], &[2, FANOUT_ALL], &[70]];
    let mut checked = 0;
    for (&fanouts, arcs) in cases
        .iter()
        .flat_map(|f| [(f, ArcsAt::Device), (f, ArcsAt::PinnedHost)])
    {
        for replace in [false, true] {
            let cfg = config(fanouts, replace);
            let cpu = KHopSampler::new(ds.clone(), cfg.clone()).unwrap();
            let gpu = CudaSampler::with_arcs(&dev, ds.clone(), cfg, arcs).unwrap();
            let what = format!("{arcs:?} fanouts {fanouts:?} replace {replace}");
            checked += same_batches(&gpu, &cpu, 20_000, [3, 500, 4000], (11, 1), false, &what);
        }
    }
    eprintln!("{checked} sampled edges equal to the CPU's");
}

/// The feature rows of a GPU batch's input vertices, gathered with the ids the sampler left on
/// the device (`gather_input_rows` and `gather_mapped_rows` with the batch's `resident`), are
/// the rows of its host input vertices; the ids really come from the device copy (ids of the
/// right count but other values given on the host gather the same rows); without the copy,
/// or with a count that does not match, the host ids are used.
#[test]
fn input_rows_gathered_with_the_samplers_device_ids() {
    let Some(dev) = gpu() else { return };
    let n = 20_000u64;
    let ds = graph(n);
    let gpu =
        CudaSampler::with_arcs(&dev, ds.clone(), config(&[10, 5], false), ArcsAt::Device).unwrap();
    let key = BatchKey {
        seed: 3,
        epoch: 0,
        step: 1,
    };
    let batch = gpu.sample(&seeds(n, 600, 1), key).unwrap();
    let resident = batch.resident.0.as_deref();
    assert!(resident.is_some(), "a GPU batch carries its device copy");
    let cols = 12;
    let x = Tensor::from_fn(n as usize, cols, |r, c| (r * cols + c) as f32);
    let gx = dev.upload(&x).unwrap();
    let ids = &batch.input_nodes;
    let want = CpuBackend.gather_rows(&x, ids).unwrap();
    let other = vec![0u32; ids.len()];
    assert_eq!(
        dev.download(&dev.gather_input_rows(&gx, ids, resident).unwrap())
            .unwrap(),
        want
    );
    assert_eq!(
        dev.download(&dev.gather_input_rows(&gx, &other, resident).unwrap())
            .unwrap(),
        want,
        "the ids are read from the device copy"
    );
    assert_eq!(
        dev.download(&dev.gather_input_rows(&gx, ids, None).unwrap())
            .unwrap(),
        want
    );
    let fewer = &ids[..ids.len() - 1];
    assert_eq!(
        dev.download(&dev.gather_input_rows(&gx, fewer, resident).unwrap())
            .unwrap(),
        CpuBackend.gather_rows(&x, fewer).unwrap(),
        "another count: the host ids"
    );
    let mapped = dev
        .map_host_rows(n as usize, cols, &mut |t| t.copy_from_slice(x.data()))
        .unwrap()
        .unwrap();
    assert_eq!(
        dev.download(&dev.gather_mapped_rows(&mapped, &other, resident).unwrap())
            .unwrap(),
        want,
        "mapped rows, the ids of the device copy"
    );
}

#[test]
fn single_hops_are_the_cpu_samplers() {
    let Some(dev) = gpu() else { return };
    let ds = graph(5_000);
    for replace in [false, true] {
        let cfg = config(&[30, 4], replace);
        let cpu = KHopSampler::new(ds.clone(), cfg.clone()).unwrap();
        let gpu = CudaSampler::new(&dev, ds.clone(), cfg).unwrap();
        let key = BatchKey {
            seed: 3,
            epoch: 0,
            step: 7,
        };
        // A frontier with a repeated vertex and the long rows: hops take any frontier.
        let frontier: Vec<u32> = vec![0, 1, 2, 9, 4999, 9, 17];
        for hop in 0..2 {
            assert_eq!(
                gpu.sample_hop(&frontier, key, hop).unwrap(),
                cpu.sample_hop(&frontier, key, hop).unwrap(),
                "replace {replace} hop {hop}"
            );
        }
        assert!(gpu.sample_hop(&frontier, key, 2).is_err());
    }
}

#[test]
fn bad_seeds_are_the_cpu_samplers_errors_and_leave_no_trace() {
    let Some(dev) = gpu() else { return };
    let ds = graph(3_000);
    let cfg = config(&[10, 10], false);
    let cpu = KHopSampler::new(ds.clone(), cfg.clone()).unwrap();
    let gpu = CudaSampler::new(&dev, ds.clone(), cfg).unwrap();
    let key = BatchKey::default();
    // More seeds than vertices: a repeat the GPU must refuse before writing its vertex list.
    for bad in [vec![4, 8, 4, 9], vec![1, 3_000], vec![7; 3_001]] {
        let g = gpu.sample(&bad, key).unwrap_err().to_string();
        let c = cpu.sample(&bad, key).unwrap_err().to_string();
        assert_eq!(g, c, "seeds {bad:?}");
    }
    // The refused batch's seeds took remap words; the next batch must not see them.
    let s = seeds(3_000, 300, 1);
    assert_eq!(gpu.sample(&s, key).unwrap(), cpu.sample(&s, key).unwrap());
    assert_eq!(gpu.sample(&[], key).unwrap(), cpu.sample(&[], key).unwrap());
}

/// Writes the graph's arc weights: every 7th vertex's row all zero (no draws), every 5th's
/// one heavy arc among light ones (rejection gives up, the exact scan finishes), the others
/// random with a tenth zero; returns the alias tables.
fn weigh(ds: &Dataset) -> Arc<AliasTables> {
    let mut r = Rng::new(9);
    let mut w = Vec::new();
    for v in 0..ds.num_nodes() {
        for (j, _) in ds.topology.row(v).iter().enumerate() {
            w.push(if v % 7 == 6 {
                0.0
            } else if v % 5 == 4 {
                if j == 0 {
                    1e6
                } else {
                    1e-3
                }
            } else if r.bernoulli(0.1) {
                0.0
            } else {
                r.next_f32() + 0.01
            });
        }
    }
    write_weights(&ds.dir, &w).unwrap();
    Arc::new(AliasTables::load_or_build(ds, &NoProgress).unwrap())
}

fn weighted_config(fanouts: &[u32], replace: bool) -> WeightedConfig {
    WeightedConfig {
        fanouts: fanouts.to_vec(),
        replace,
        remap: RemapKind::Auto,
    }
}

fn block_refs(b: &MiniBatch) -> Vec<BlockRef<'_>> {
    b.blocks
        .iter()
        .map(|b| BlockRef {
            num_dst: b.num_dst,
            num_src: b.num_src,
            indptr: &b.indptr,
            indices: &b.indices,
            weights: b.weights.as_deref(),
        })
        .collect()
}

#[test]
fn weighted_batches_are_the_cpu_samplers_bit_for_bit() {
    let Some(dev) = gpu() else { return };
    let n = 20_000u64;
    let ds = graph(n);
    let tables = weigh(&ds);
    let cases: &[&[u32]] = &[&[25, 10], &[15, 10, 5], &[100, 3], &[2, FANOUT_ALL], &[70]];
    let mut checked = 0;
    for (&fanouts, arcs) in cases
        .iter()
        .flat_map(|f| [(f, ArcsAt::Device), (f, ArcsAt::PinnedHost)])
    {
        for replace in [false, true] {
            let cfg = weighted_config(fanouts, replace);
            let what = format!("{arcs:?} fanouts {fanouts:?} replace {replace}");
            let cpu = WeightedSampler::new(ds.clone(), cfg.clone(), tables.clone()).unwrap();
            let gpu = CudaSampler::weighted(&dev, ds.clone(), cfg, tables.clone(), arcs).unwrap();
            assert_eq!(gpu.name(), "weighted");
            checked += same_batches(&gpu, &cpu, n, [3, 500, 4000], (12, 2), true, &what);
            let frontier: Vec<u32> = vec![0, 1, 2, 4, 6, 9, 9, 19_999];
            let key = BatchKey::default();
            for hop in 0..fanouts.len() {
                assert_eq!(
                    gpu.sample_hop(&frontier, key, hop).unwrap(),
                    cpu.sample_hop(&frontier, key, hop).unwrap(),
                    "{what} hop {hop}"
                );
            }
        }
    }
    eprintln!("{checked} weighted edges equal to the CPU's");
}

/// A weighted batch's device blocks, adopted by the backend, carry the weights: weighted
/// aggregation over them is the aggregation over the host blocks uploaded.
#[test]
fn weighted_device_blocks_aggregate_as_the_host_blocks() {
    let Some(dev) = gpu() else { return };
    let n = 20_000u64;
    let ds = graph(n);
    let tables = weigh(&ds);
    let gpu = CudaSampler::weighted(
        &dev,
        ds.clone(),
        weighted_config(&[10, 5], false),
        tables,
        ArcsAt::Device,
    )
    .unwrap();
    let batch = gpu.sample(&seeds(n, 700, 2), BatchKey::default()).unwrap();
    let refs = block_refs(&batch);
    let resident = batch
        .resident
        .0
        .as_deref()
        .expect("a GPU batch's device copy");
    let adopted = dev.adopt_blocks(resident, &refs).unwrap().expect("adopted");
    for (l, (a, r)) in adopted.iter().zip(&refs).enumerate() {
        let uploaded = dev.prepare_block(r).unwrap();
        let x = dev
            .upload(&Tensor::from_fn(r.num_src, 8, |i, c| {
                ((i * 8 + c) % 13) as f32 - 6.0
            }))
            .unwrap();
        for agg in [Aggregation::Weighted, Aggregation::WeightedMean] {
            assert_eq!(
                dev.download(&dev.aggregate(a, &x, agg).unwrap()).unwrap(),
                dev.download(&dev.aggregate(&uploaded, &x, agg).unwrap())
                    .unwrap(),
                "block {l} {agg:?}"
            );
        }
    }
}

/// Random walks: GNNLab's PinSAGE setting, long walks that rarely stop with every visited
/// vertex kept, walks that never stop and walks that always stop after one step; on both
/// placements of the arcs. Single hops are refused as the CPU refuses them.
#[test]
fn random_walk_batches_are_the_cpu_samplers_bit_for_bit() {
    let Some(dev) = gpu() else { return };
    let n = 20_000u64;
    let ds = graph(n);
    let walk = |top_k: &[u32], walks, length, stop_prob| RandomWalkConfig {
        top_k: top_k.to_vec(),
        walks,
        length,
        stop_prob,
        remap: RemapKind::Auto,
    };
    let cases = [
        RandomWalkConfig::default(),
        walk(&[3, FANOUT_ALL], 10, 6, 0.1),
        walk(&[8], 5, 4, 0.0),
        walk(&[2, 2], 3, 5, 1.0),
    ];
    let mut checked = 0;
    for (cfg, arcs) in cases
        .iter()
        .flat_map(|c| [(c, ArcsAt::Device), (c, ArcsAt::PinnedHost)])
    {
        let what = format!("{arcs:?} {cfg:?}");
        let cpu = RandomWalkSampler::new(ds.clone(), cfg.clone()).unwrap();
        let gpu = CudaSampler::random_walk(&dev, ds.clone(), cfg.clone(), arcs).unwrap();
        assert_eq!(gpu.name(), "randomwalk");
        checked += same_batches(&gpu, &cpu, n, [3, 400, 3000], (13, 1), true, &what);
        let key = BatchKey::default();
        assert_eq!(
            gpu.sample_hop(&[1, 2], key, 0).unwrap_err().to_string(),
            cpu.sample_hop(&[1, 2], key, 0).unwrap_err().to_string()
        );
    }
    eprintln!("{checked} random-walk edges equal to the CPU's");
}
