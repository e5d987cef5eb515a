//! Cross-module tests on small synthetic graphs: cached extraction is exact, simulated byte
//! counts match what the extractor measures, the oracle bounds every policy, PreSC is
//! deterministic.

use crate::cached::{build_extractor, CacheConfig, CachedExtractor, PreSampling};
use crate::extract::{CacheSplit, ExtractStats, Extractor, PlainExtractor};
use crate::policy::{degree_ranking, random_ranking, Policy};
use crate::presc::{presample_counts, presc_ranking};
use crate::sim::{simulate, SimConfig};
use crate::table::{CacheSize, FeatureCache};
use crate::trace::Trace;
use fanout_graph::{Dataset, FeatDtype, NoProgress};
use fanout_sample::{KHopConfig, KHopSampler, LoaderConfig, RemapKind, Sampler};
use fanout_synth::{generate, GenOptions, Preset};
use std::sync::Arc;

fn dataset(dtype: FeatDtype) -> Arc<Dataset> {
    let cfg = Preset::Tiny.config(Some(3000));
    let opts = GenOptions {
        seed: 3,
        feat_dtype: dtype,
        ..Default::default()
    };
    Arc::new(generate(&cfg, &opts, None, &NoProgress).unwrap().0)
}

fn sampler(ds: &Arc<Dataset>) -> Arc<dyn Sampler> {
    let cfg = KHopConfig {
        fanouts: vec![5, 3],
        replace: false,
        remap: RemapKind::Auto,
    };
    Arc::new(KHopSampler::new(ds.clone(), cfg).unwrap())
}

fn loader(seed: u64) -> LoaderConfig {
    LoaderConfig {
        batch_size: 64,
        seed,
        workers: 1,
        prefetch: 2,
        ..Default::default()
    }
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// A block that does not fit its input nodes (an edge to no input node, offsets out of order
/// or of the wrong count, coefficients of the wrong count) is an error from both aggregating
/// paths, not a panic; a sound one gives the same stats and destination rows from both.
#[test]
fn aggregating_extractions_refuse_unsound_blocks() {
    let ds = dataset(FeatDtype::F32);
    let mut plain = PlainExtractor::new(ds.clone()).unwrap();
    let input: Vec<u32> = (0..10).collect();
    let (indptr, indices) = (vec![0u32, 2, 5], vec![3u32, 4, 0, 9, 2]);
    let coeff = vec![0.5f32; 5];
    let (mut dst, mut agg) = (Vec::new(), Vec::new());
    let made = plain
        .extract_aggregated(
            &input,
            2,
            &indptr,
            &indices,
            Some(&coeff),
            &mut dst,
            &mut agg,
        )
        .unwrap()
        .unwrap();
    let mut dst2 = Vec::new();
    let (left, store) = plain
        .extract_sourced(&input, 2, &indptr, &indices, Some(&mut dst2))
        .unwrap()
        .unwrap();
    assert_eq!((made, bits(&dst)), (left, bits(&dst2)));
    assert!(Arc::ptr_eq(&store, &ds));
    // Without the destinations' rows: none gathered, and only the edges' rows counted.
    let (alone, _) = plain
        .extract_sourced(&input, 2, &indptr, &indices, None)
        .unwrap()
        .unwrap();
    let row_bytes = (dst.len() / 2 * 4) as u64;
    assert_eq!(alone.rows, made.rows - 2);
    assert_eq!(alone.bytes_total, made.bytes_total - 2 * row_bytes);
    assert_eq!(alone.bytes_from_host, alone.bytes_total);
    let unsound: [(&[u32], &[u32], usize); 3] = [
        (&[0, 2, 5], &[3, 4, 0, 10, 2], 5),
        (&[0, 3, 2], &[3, 4, 0, 9, 2], 5),
        (&[0, 2, 4], &[3, 4, 0, 9, 2], 5),
    ];
    for (indptr, indices, edges) in unsound {
        let coeff = vec![0.5f32; edges];
        let r =
            plain.extract_aggregated(&input, 2, indptr, indices, Some(&coeff), &mut dst, &mut agg);
        assert!(r.unwrap().is_err(), "{indptr:?} {indices:?}");
        let r = plain.extract_sourced(&input, 2, indptr, indices, Some(&mut dst2));
        assert!(r.unwrap().is_err(), "{indptr:?} {indices:?}");
        let r = plain.extract_sourced(&input, 2, indptr, indices, None);
        assert!(
            r.unwrap().is_err(),
            "{indptr:?} {indices:?}, no rows gathered"
        );
    }
    let r = plain.extract_aggregated(
        &input,
        2,
        &indptr,
        &indices,
        Some(&coeff[..4]),
        &mut dst,
        &mut agg,
    );
    assert!(r.unwrap().is_err(), "four coefficients for five edges");
}

#[test]
fn out_of_range_ids_are_errors_that_leave_the_extractor_as_it_was() {
    let ds = dataset(FeatDtype::F32);
    let n = ds.num_nodes() as u32;
    let ranking = degree_ranking(&ds.topology);
    let f = ds.features.as_ref().unwrap();
    let cache = FeatureCache::build(f, &ranking[..n as usize / 5]).unwrap();
    let mut plain = PlainExtractor::new(ds.clone()).unwrap();
    let mut cached = CachedExtractor::new(ds.clone(), Some(cache), true).unwrap();
    let good: Vec<u32> = (0..50).map(|i| i * 7 % n).collect();
    let mut bad = good.clone();
    bad[17] = n;
    bad[30] = u32::MAX;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    cached.extract(&good, &mut b).unwrap();
    for ex in [&mut plain as &mut dyn Extractor, &mut cached] {
        let e = ex.extract(&bad, &mut a).unwrap_err().to_string();
        assert!(
            e.contains(&format!(
                "input vertex 17 of the batch is {n}; expected a vertex id < NUM_NODE = {n}"
            )),
            "{e}"
        );
    }
    // The failed call neither panicked nor disturbed Match-Reorder's memory of `good`.
    let s = cached.extract(&good, &mut b).unwrap();
    assert_eq!(s.bytes_reused + s.bytes_from_cache, s.bytes_total);
    plain.extract(&good, &mut a).unwrap();
    assert_eq!(bits(&a), bits(&b));
}

/// A dataset with `dtype` features, its sampler, its training seeds and one epoch's batches.
fn traced(dtype: FeatDtype) -> (Arc<Dataset>, Arc<dyn Sampler>, Vec<u32>, Trace) {
    let ds = dataset(dtype);
    let s = sampler(&ds);
    let seeds = ds.train.to_vec();
    let trace = Trace::record(s.clone(), &seeds, &loader(1), 0).unwrap();
    (ds, s, seeds, trace)
}

#[test]
fn cached_extraction_equals_plain_extraction_byte_for_byte() {
    for dtype in [FeatDtype::F32, FeatDtype::F16] {
        let (ds, s, seeds, trace) = traced(dtype);
        let n = ds.num_nodes() as usize;
        let rankings = [
            random_ranking(n, 9),
            degree_ranking(&ds.topology),
            presc_ranking(&s, &seeds, &loader(1), 1).unwrap(),
        ];
        let mut plain = PlainExtractor::new(ds.clone()).unwrap();
        for (ranking, alpha) in rankings.iter().zip([0.05, 0.3, 1.0]) {
            for match_previous in [false, true] {
                let f = ds.features.as_ref().unwrap();
                let rows = CacheSize::Ratio(alpha).rows(n, f.row_bytes());
                let cache = FeatureCache::build(f, &ranking[..rows]).unwrap();
                assert_eq!(cache.bytes(), (rows * f.row_bytes()) as u64);
                let mut ex = CachedExtractor::new(ds.clone(), Some(cache), match_previous).unwrap();
                let (mut a, mut b) = (Vec::new(), vec![1.0; 3]);
                let mut total = ExtractStats::default();
                for batch in trace.batches() {
                    let sp = plain.extract(batch, &mut a).unwrap();
                    let sc = ex.extract(batch, &mut b).unwrap();
                    assert_eq!(
                        bits(&a),
                        bits(&b),
                        "{dtype:?} alpha {alpha} match {match_previous}"
                    );
                    assert_eq!((sc.rows, sc.bytes_total), (sp.rows, sp.bytes_total));
                    assert_eq!(
                        sc.bytes_total,
                        sc.bytes_from_cache + sc.bytes_reused + sc.bytes_from_host
                    );
                    total.add(&sc);
                }
                assert_eq!(total.bytes_reused > 0, match_previous && alpha < 1.0);
                if alpha == 1.0 {
                    assert_eq!(total.hit_rate(), 1.0);
                }
            }
        }
        // Match alone, no cache.
        let mut ex = CachedExtractor::new(ds.clone(), None, true).unwrap();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for batch in trace.batches() {
            plain.extract(batch, &mut a).unwrap();
            ex.extract(batch, &mut b).unwrap();
            assert_eq!(bits(&a), bits(&b));
        }
    }
}

/// What a device does with [`CacheSplit`]s: gathers the table's rows, then the previous
/// batch's reused rows, then the uploaded misses. Returns the batch's rows.
fn assemble(
    table: &[f32],
    d: usize,
    split: &CacheSplit,
    misses: &[f32],
    previous: Option<&(u64, Vec<f32>)>,
) -> Vec<f32> {
    let cached = table.len() / d.max(1);
    let mut x = vec![f32::NAN; split.slots.len() * d];
    let mut seen = vec![0u8; split.slots.len()];
    for (i, &slot) in split.slots.iter().enumerate() {
        if (slot as usize) < cached {
            let s = slot as usize;
            x[i * d..(i + 1) * d].copy_from_slice(&table[s * d..(s + 1) * d]);
            seen[i] += 1;
        } else {
            assert_eq!(
                slot as usize, cached,
                "a row not cached names the extra row"
            );
        }
    }
    if !split.reused_positions.is_empty() {
        let (seq, prev) = previous.expect("a previous batch");
        assert_eq!(seq + 1, split.seq, "reuses the batch just before");
        for (&i, &j) in split.reused_positions.iter().zip(&split.reused_from) {
            let (i, j) = (i as usize, j as usize);
            x[i * d..(i + 1) * d].copy_from_slice(&prev[j * d..(j + 1) * d]);
            seen[i] += 1;
        }
    }
    for (k, &i) in split.miss_positions.iter().enumerate() {
        let i = i as usize;
        x[i * d..(i + 1) * d].copy_from_slice(&misses[k * d..(k + 1) * d]);
        seen[i] += 1;
    }
    assert!(
        seen.iter().all(|&c| c == 1),
        "every row from exactly one place"
    );
    x
}

#[test]
fn a_split_for_a_device_cache_reassembles_the_plain_rows_byte_for_byte() {
    for dtype in [FeatDtype::F32, FeatDtype::F16] {
        let (ds, _, _, trace) = traced(dtype);
        let n = ds.num_nodes() as usize;
        let f = ds.features.as_ref().unwrap();
        let d = f.dim;
        let mut plain = PlainExtractor::new(ds.clone()).unwrap();
        for (alpha, match_previous) in [(0.3, false), (1.0, false), (0.3, true), (0.0, true)] {
            let what = format!("{dtype:?} alpha {alpha} match {match_previous}");
            let build = || {
                let rows = CacheSize::Ratio(alpha).rows(n, f.row_bytes());
                let ranking = degree_ranking(&ds.topology);
                let cache =
                    (alpha > 0.0).then(|| FeatureCache::build(f, &ranking[..rows]).unwrap());
                CachedExtractor::new(ds.clone(), cache, match_previous).unwrap()
            };
            // The same batches through the host path and through splits, the misses gathered
            // on the host (`ex`) or left to the device (`lazy`).
            let (mut host, mut ex, mut lazy) = (build(), build(), build());
            let mut lazy_split = CacheSplit::default();
            let table = ex.cache_rows().expect("a cache or Match");
            let (mut a, mut b, mut misses) = (Vec::new(), Vec::new(), vec![7.0; 5]);
            let mut split = CacheSplit {
                slots: vec![9],
                miss_positions: vec![9],
                ..CacheSplit::default()
            };
            let (mut previous, mut reused) = (None, 0);
            for (k, batch) in trace.batches().into_iter().enumerate() {
                let sp = plain.extract(batch, &mut a).unwrap();
                let sh = host.extract(batch, &mut b).unwrap();
                let ss = ex
                    .extract_split(batch, &mut split, Some(&mut misses))
                    .unwrap()
                    .unwrap();
                assert_eq!(ss, sh, "{what}: the accounting of the host path");
                let sl = lazy
                    .extract_split(batch, &mut lazy_split, None)
                    .unwrap()
                    .unwrap();
                assert_eq!(
                    sl, ss,
                    "{what}: the same accounting without the misses' rows"
                );
                assert_eq!(
                    lazy_split, split,
                    "{what}: the same split without the misses' rows"
                );
                assert_eq!((split.seq, split.keep), (k as u64, match_previous));
                assert_eq!(misses.len(), split.miss_positions.len() * d);
                let x = assemble(&table, d, &split, &misses, previous.as_ref());
                assert_eq!(bits(&x), bits(&a), "{what}");
                assert_eq!(sp.bytes_total, ss.bytes_total);
                reused += split.reused_positions.len();
                if split.keep {
                    previous = Some((split.seq, x));
                }
            }
            assert_eq!(reused > 0, match_previous && alpha < 1.0, "{what}");
        }
        // No split without a cache or Match.
        let mut none = CachedExtractor::new(ds.clone(), None, false).unwrap();
        assert!(none
            .extract_split(&[0], &mut CacheSplit::default(), Some(&mut Vec::new()))
            .is_none());
        assert!(none.cache_rows().is_none());
        // Out-of-range ids are errors, as for extract.
        let cache = FeatureCache::build(f, &[0, 1]).unwrap();
        let mut ex = CachedExtractor::new(ds.clone(), Some(cache), false).unwrap();
        let bad = [0, n as u32];
        for misses in [Some(&mut Vec::new()), None] {
            assert!(ex
                .extract_split(&bad, &mut CacheSplit::default(), misses)
                .unwrap()
                .is_err());
        }
    }
}

#[test]
fn simulated_bytes_equal_measured_bytes_and_optimal_bounds_every_policy() {
    for (dtype, epochs) in [
        (FeatDtype::F32, 1),
        (FeatDtype::F16, 1),
        (FeatDtype::F32, 3),
    ] {
        let ds = dataset(dtype);
        let s = sampler(&ds);
        let seeds = ds.train.to_vec();
        let f = ds.features.as_ref().unwrap();
        let cfg = SimConfig {
            policies: vec![
                Policy::Random,
                Policy::Degree,
                Policy::PreSC(1),
                Policy::PreSC(2),
                Policy::Optimal,
            ],
            ratios: vec![0.01, 0.05, 0.2],
            match_reorder: true,
            window: 0,
            seed: 4,
            eval_epoch: 0,
            eval_epochs: epochs,
            similarity: true,
        };
        let rep = simulate(s.clone(), &seeds, &loader(2), f.row_bytes(), &cfg).unwrap();
        assert_eq!(rep.rows.len(), 15);
        assert_eq!(rep.row_bytes, f.row_bytes());
        let trace = Trace::record_epochs(s.clone(), &seeds, &loader(2), 0, epochs).unwrap();
        assert_eq!(trace.num_epochs() as u64, epochs);
        for row in &rep.rows {
            assert!(row.hit_rate <= row.optimal_hit_rate + 1e-12, "{row:?}");
            assert!((0.0..=1.0).contains(&row.hit_rate));
            assert!(row.match_bytes_from_host.unwrap() <= row.bytes_from_host);
            if row.policy == "optimal" {
                assert_eq!(row.hit_rate, row.optimal_hit_rate);
            }
            // Replay the cell through the real extractor: same bytes.
            let policy: Policy = row.policy.parse().unwrap();
            let n = ds.num_nodes() as usize;
            let ranking = match policy {
                Policy::Random => random_ranking(n, 4),
                Policy::Degree => degree_ranking(&ds.topology),
                Policy::PreSC(k) => presc_ranking(&s, &seeds, &loader(2), k).unwrap(),
                Policy::Optimal => crate::optimal::optimal_ranking(&trace),
            };
            let cache = FeatureCache::build(f, &ranking[..row.cached_rows]).unwrap();
            let mut ex = CachedExtractor::new(ds.clone(), Some(cache), true).unwrap();
            let mut out = Vec::new();
            let mut st = ExtractStats::default();
            for b in trace.batches() {
                st.add(&ex.extract(b, &mut out).unwrap());
            }
            assert_eq!(st.bytes_total, row.bytes_needed);
            assert_eq!(st.bytes_from_cache, row.bytes_from_cache, "{row:?}");
            assert_eq!(st.bytes_from_host, row.match_bytes_from_host.unwrap());
        }
        let sim = rep.similarity.unwrap();
        assert!((0.0..=1.0).contains(&sim.footprint_similarity));
        assert_eq!(sim.matching.batches, rep.batches);
        assert!(sim.matching.avg_m > 0.0);
    }
}

#[test]
fn presc_is_deterministic_per_seed_and_builds_through_the_trainer_entry_point() {
    let ds = dataset(FeatDtype::F32);
    let s = sampler(&ds);
    let seeds = ds.train.to_vec();
    let a = presample_counts(&s, &seeds, &loader(5), 2).unwrap();
    let b = presample_counts(
        &s,
        &seeds,
        &LoaderConfig {
            workers: 3,
            ..loader(5)
        },
        2,
    )
    .unwrap();
    assert_eq!(a, b);
    assert_ne!(a, presample_counts(&s, &seeds, &loader(6), 2).unwrap());
    assert!(presample_counts(&s, &seeds, &loader(5), 0).is_err());
    // The ranking is the presence counts, ties by expected draws, then sampling-direction
    // degree, then larger id.
    let ranking = presc_ranking(&s, &seeds, &loader(5), 2).unwrap();
    let deg = crate::policy::degree_scores(&ds.topology);
    assert_eq!(ranking, crate::presc::presc_order(&a, &deg));
    let (p, d) = (&a.presence, &a.draws);
    assert!(ranking.windows(2).all(|w| {
        let (x, y) = (w[0] as usize, w[1] as usize);
        (p[x], d[x] as f32, deg[x], x) > (p[y], d[y] as f32, deg[y], y)
    }));
    // Equal presence but different expected draws does occur, so the tie-break is exercised.
    assert!(ranking.windows(2).any(|w| {
        let (x, y) = (w[0] as usize, w[1] as usize);
        p[x] == p[y] && d[x] > d[y]
    }));

    let pre = PreSampling {
        sampler: s.clone(),
        seeds: &seeds,
        loader: loader(5),
    };
    let cfg = CacheConfig {
        policy: Some(Policy::PreSC(1)),
        size: CacheSize::Ratio(0.1),
        match_previous: true,
        seed: 0,
        ranking: None,
    };
    let (ex, sum) = build_extractor(ds.clone(), &cfg, Some(&pre)).unwrap();
    assert_eq!(sum.rows, 300);
    assert_eq!(
        ex.cache().unwrap().vertices(),
        &presc_ranking(&s, &seeds, &loader(5), 1).unwrap()[..300]
    );
    assert!(ex.matches_previous());
    assert!(build_extractor(ds.clone(), &cfg, None).is_err());
    let opt = CacheConfig {
        policy: Some(Policy::Optimal),
        ..cfg.clone()
    };
    assert!(build_extractor(ds.clone(), &opt, Some(&pre)).is_err());
    let none = CacheConfig {
        policy: None,
        ..cfg
    };
    let (ex, sum) = build_extractor(ds.clone(), &none, None).unwrap();
    assert!(ex.cache().is_none() && sum.rows == 0 && sum.policy == "none");
    // A given ranking replaces the policy's: its first rows are cached, and bad ids refused.
    let ranked = CacheConfig {
        policy: Some(Policy::Degree),
        size: CacheSize::Rows(3),
        ranking: Some(vec![7, 5, 2999, 0]),
        ..none.clone()
    };
    let (ex, sum) = build_extractor(ds.clone(), &ranked, None).unwrap();
    assert_eq!(ex.cache().unwrap().vertices(), &[7, 5, 2999]);
    assert_eq!(sum.policy, "degree");
    let bad = CacheConfig {
        ranking: Some(vec![3000]),
        ..ranked
    };
    assert!(build_extractor(ds, &bad, None).is_err());
}

/// A directed graph stored in `layout`: arcs 0->1, 0->2, 0->3, 1->2, 3->2 (vertex 0 has the
/// largest out-degree, vertex 2 the largest in-degree).
fn directed(layout: fanout_graph::Layout) -> Arc<Dataset> {
    use fanout_graph::{build_topology, BuildOptions, DatasetWriter, Meta, SliceArcs};
    let arcs: Vec<(u64, u64)> = vec![(0, 1), (0, 2), (0, 3), (1, 2), (3, 2)];
    let mut w = DatasetWriter::temporary().unwrap();
    let opts = BuildOptions {
        layout,
        num_nodes: Some(5),
        ..Default::default()
    };
    let st = build_topology(&mut SliceArcs(&arcs), &opts, &mut w, &NoProgress).unwrap();
    let meta = Meta {
        num_node: 5,
        num_edge: st.num_arcs,
        layout,
        ..Meta::default()
    };
    Arc::new(w.finish(meta, &NoProgress).unwrap())
}

#[test]
fn degree_policy_follows_the_sampling_direction() {
    use fanout_graph::Layout;
    // CSC rows are in-neighbours: a vertex is drawn into others' lists once per out-arc.
    let csc = directed(Layout::Csc);
    assert_eq!(
        crate::policy::degree_scores(&csc.topology),
        csc.topology.out_degrees()
    );
    assert_eq!(degree_ranking(&csc.topology)[0], 0);
    // CSR rows are out-neighbours: once per in-arc.
    let csr = directed(Layout::Csr);
    assert_eq!(
        crate::policy::degree_scores(&csr.topology),
        csr.topology.in_degrees()
    );
    assert_eq!(degree_ranking(&csr.topology)[0], 2);
    // Ties (vertices 1 and 3 in CSC: out-degree 1 each) go to the larger id.
    assert_eq!(&degree_ranking(&csc.topology)[1..3], &[3, 1]);
}

#[test]
fn presc_expected_draws_are_the_draws_when_every_neighbour_is_taken() {
    // With fanouts above every degree each expansion takes its whole row, so the expected
    // draw count (k / deg to each of the row's vertices) must equal the number of sampled
    // edges leaving each vertex, counted here from the blocks directly.
    let ds = dataset(FeatDtype::F32);
    let max_deg = ds.topology.row_lengths().into_iter().max().unwrap() as u32;
    let cfg = KHopConfig {
        fanouts: vec![max_deg + 1, max_deg + 1],
        replace: false,
        remap: RemapKind::Auto,
    };
    let s: Arc<dyn Sampler> = Arc::new(KHopSampler::new(ds.clone(), cfg).unwrap());
    let seeds: Vec<u32> = ds.train.to_vec()[..40].to_vec();
    let lc = loader(2);
    let got = crate::presc::presample_epoch(&s, &seeds, &lc, 0).unwrap();
    let n = ds.num_nodes() as usize;
    let (mut presence, mut draws) = (vec![0u32; n], vec![0.0f64; n]);
    let l = fanout_sample::Loader::new(s.clone(), seeds.clone(), lc).unwrap();
    for mb in l.epoch(crate::presc::PRESAMPLE_EPOCH_BASE) {
        let mb = mb.unwrap();
        mb.input_nodes
            .iter()
            .for_each(|&v| presence[v as usize] += 1);
        for b in &mb.blocks {
            for &src in &b.indices {
                draws[mb.input_nodes[src as usize] as usize] += 1.0;
            }
        }
    }
    assert_eq!(got.presence, presence);
    assert!(draws.iter().sum::<f64>() > 0.0);
    for (v, (g, w)) in got.draws.iter().zip(&draws).enumerate() {
        assert!(
            (g - w).abs() < 1e-9,
            "vertex {v}: expected draws {g}, draws {w}"
        );
    }
}

#[test]
fn gather_into_writes_exactly_the_stored_rows_over_old_contents() {
    // PlainExtractor's gather writes into uninitialised capacity; every element must come from
    // the store, whatever the vector held before (NaN garbage here), for f32 and f16 rows.
    for dtype in [FeatDtype::F32, FeatDtype::F16] {
        let ds = dataset(dtype);
        let f = ds.features.as_ref().unwrap();
        let n = ds.num_nodes() as u32;
        let ids: Vec<u32> = (0..2500u32).map(|i| (i * 7919 + i / 3) % n).collect();
        let mut out = vec![f32::NAN; ids.len() * f.dim * 2];
        f.gather_into(&ids, &mut out);
        assert_eq!(out.len(), ids.len() * f.dim);
        let mut row = vec![0.0f32; f.dim];
        for (i, &v) in ids.iter().enumerate() {
            f.copy_row(v as usize, &mut row);
            assert_eq!(
                bits(&out[i * f.dim..(i + 1) * f.dim]),
                bits(&row),
                "row {i}"
            );
        }
        f.gather_into(&ids[..10], &mut out);
        assert_eq!(out.len(), 10 * f.dim);
        f.gather_into(&[], &mut out);
        assert!(out.is_empty());
    }
}

/// Batches of several parallel chunks (more input rows than `SPLIT_CHUNK`) split as the
/// one-row-at-a-time rule says: a cached row names its slot, else a row of the batch before
/// (Match) is reused from its position there, else it is missed; every list ascending, the
/// chunks joined in order. Checked against that rule written out sequentially.
#[test]
fn splits_of_large_batches_follow_the_sequential_rule() {
    let cfg = Preset::Tiny.config(Some(60_000));
    let opts = GenOptions {
        seed: 9,
        ..Default::default()
    };
    let ds = Arc::new(generate(&cfg, &opts, None, &NoProgress).unwrap().0);
    let n = ds.num_nodes() as u32;
    let f = ds.features.as_ref().unwrap();
    let ranking = degree_ranking(&ds.topology);
    let cached = &ranking[..n as usize / 4];
    let cache = FeatureCache::build(f, cached).unwrap();
    let slots: Vec<Option<u32>> = (0..n).map(|v| cache.slot(v)).collect();
    let extra = cache.len() as u32;
    let mut ex = CachedExtractor::new(ds.clone(), Some(cache), true).unwrap();
    // Distinct ids in a scrambled order, overlapping from one batch to the next.
    let batch = |start: u32, len: u32| -> Vec<u32> {
        (0..len)
            .map(|i| ((start + i) as u64 * 48_271 % n as u64) as u32)
            .collect()
    };
    let batches = [batch(0, 40_000), batch(20_000, 37_000), batch(50_000, 5)];
    let mut previous = std::collections::HashMap::new();
    let mut split = CacheSplit::default();
    for (k, ids) in batches.iter().enumerate() {
        ex.extract_split(ids, &mut split, None).unwrap().unwrap();
        let mut want = CacheSplit {
            seq: k as u64,
            keep: true,
            ..CacheSplit::default()
        };
        for (i, &v) in ids.iter().enumerate() {
            let i = i as u32;
            match (slots[v as usize], previous.get(&v)) {
                (Some(s), _) => want.slots.push(s),
                (None, Some(&j)) => {
                    want.slots.push(extra);
                    want.reused_positions.push(i);
                    want.reused_from.push(j);
                }
                (None, None) => {
                    want.slots.push(extra);
                    want.miss_positions.push(i);
                }
            }
        }
        assert!(
            want.reused_positions.len() > 1000 || k != 1,
            "the test reuses rows"
        );
        assert_eq!(split, want, "batch {k}");
        previous = ids
            .iter()
            .enumerate()
            .map(|(i, &v)| (v, i as u32))
            .collect();
    }
}
