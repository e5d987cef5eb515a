//! Uniform k-hop neighbour sampling (GraphSAGE / DGL `NeighborSampler`, GNNLab's k-hop).
//!
//! Each vertex of the frontier draws `fanouts[h]` of its stored row: without replacement by
//! Floyd's algorithm (k random draws and a membership test over the k chosen, never touching the
//! rest of the row), or with replacement by k independent draws. A row no longer than the fanout
//! is taken whole (without replacement). Work per vertex is O(k): membership tests use a bit
//! map for rows of at most 4096 arcs (one word up to 64), then a scan of the k chosen for
//! k <= 64, a hash set above; the graph is never written. Sampling a row is split in two stages a few rows apart (draw positions
//! and prefetch those arcs, then read them) so that memory latency overlaps.

use crate::graph::{
    check_dataset, hop_stream, layout_note, offsets, par_fill, prefetch, tag, vertex_rng, vid, Csr,
    CsrJob, AHEAD, FANOUT_ALL,
};
use crate::minibatch::{BatchKey, MiniBatch};
use crate::remap::RemapKind;
use crate::resident::Residency;
use crate::sampler::{check_hop, growth, Driver, HopEdges, HopSample, Sampler};
use fanout_graph::{Dataset, Error, Offset, Result, VertexId};
use fanout_rand::Rng;
use rayon::prelude::*;
use std::collections::HashSet;
use std::sync::Arc;

/// Configuration of [`KHopSampler`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct KHopConfig {
    /// Neighbours per vertex for each hop, in hop order from the seeds ("15,10,5": seeds draw
    /// 15). [`FANOUT_ALL`] takes every neighbour. DGL lists the same fanouts reversed.
    pub fanouts: Vec<u32>,
    /// Draw with replacement (exactly k per non-empty row, repeats kept as parallel edges).
    pub replace: bool,
    /// Remapping table.
    pub remap: RemapKind,
}

/// Uniform k-hop sampler. Guarantees (beyond [`Sampler`]'s): without replacement, every row of
/// a block holds `min(k, degree)` distinct arc positions, each k-subset equally likely; with
/// replacement, `k` independent uniform arcs per non-empty row; every block edge is a stored arc.
/// Vertex `v`'s draws in hop `h` use the stream keyed by (seed, epoch, step, hop, v).
pub struct KHopSampler {
    cfg: KHopConfig,
    driver: Driver,
}

impl KHopSampler {
    /// A sampler over `ds`. Errors if the fanout list is empty or the graph is too large for
    /// 32-bit ids.
    pub fn new(ds: Arc<Dataset>, cfg: KHopConfig) -> Result<Self> {
        check_dataset(&ds)?;
        if cfg.fanouts.is_empty() || cfg.fanouts.contains(&0) {
            return Err(Error::Invalid(
                "k-hop sampling needs at least one hop and fanouts >= 1".into(),
            ));
        }
        let g = growth(&cfg.fanouts);
        Ok(KHopSampler {
            driver: Driver::new(ds, cfg.remap, g),
            cfg,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &KHopConfig {
        &self.cfg
    }

    /// The base key of hop `hop`'s draws under `key`: vertex `v` draws from
    /// `fanout_rand::Rng::keyed(&[base, v])`. Other implementations of this sampler (the GPU's)
    /// use it to draw exactly what this one draws.
    pub fn hop_base(key: &BatchKey, hop: usize) -> u64 {
        hop_stream(key, tag::UNIFORM, hop)
    }

    /// A note to show people when the dataset is CSR (out-neighbours are sampled).
    pub fn layout_note(&self) -> Option<String> {
        layout_note(&self.driver.ds)
    }
}

impl KHopSampler {
    /// Reads rows as `r` says ([`Residency::Auto`] by default): a resident huge-page copy of
    /// the topology, or the memory-mapped files.
    pub fn with_residency(mut self, r: Residency) -> Self {
        self.driver.set_residency(r);
        self
    }
}

impl Sampler for KHopSampler {
    fn sample(&self, seeds: &[u32], key: BatchKey) -> Result<MiniBatch> {
        let rows = &self.driver.rows;
        self.driver
            .run(seeds, key, self.cfg.fanouts.len(), |h, frontier| {
                rows.run(UniformHop {
                    frontier,
                    k: self.cfg.fanouts[h],
                    replace: self.cfg.replace,
                    base: hop_stream(&key, tag::UNIFORM, h),
                })
            })
    }
    fn num_layers(&self) -> usize {
        self.cfg.fanouts.len()
    }
    fn dataset(&self) -> &Arc<Dataset> {
        &self.driver.ds
    }
    fn is_resident(&self) -> bool {
        self.driver.rows.is_resident()
    }
    fn name(&self) -> &'static str {
        "khop"
    }
    fn sample_hop(&self, frontier: &[u32], key: BatchKey, hop: usize) -> Result<HopSample> {
        check_hop(self, frontier, hop)?;
        Ok(self.driver.rows.run(UniformHop {
            frontier,
            k: self.cfg.fanouts[hop],
            replace: self.cfg.replace,
            base: hop_stream(&key, tag::UNIFORM, hop),
        }))
    }
}

/// Number of edges a row of length `d` yields.
#[inline]
pub(crate) fn row_count(d: usize, k: u32, replace: bool) -> u32 {
    if d == 0 {
        0
    } else if k == FANOUT_ALL {
        d as u32
    } else if replace {
        k
    } else {
        (d as u32).min(k)
    }
}

/// Whether a row of length `d` is taken whole (no random draws).
#[inline]
fn takes_all(d: usize, k: u32, replace: bool) -> bool {
    k == FANOUT_ALL || (!replace && d <= k as usize)
}

/// First stage of sampling one row: draws the positions (within the row) of the sampled arcs
/// into `out` (length `row_count(d, k, replace)`), unless the row is taken whole.
#[inline]
fn positions(d: usize, k: u32, replace: bool, base: u64, v: u32, out: &mut [u32]) {
    if takes_all(d, k, replace) {
        return;
    }
    let mut rng = vertex_rng(base, v);
    if replace {
        for o in out.iter_mut() {
            *o = rng.below(d as u64) as u32;
        }
    } else {
        floyd(d, out, &mut rng);
    }
}

/// Second stage: replaces the positions in `out` by the neighbours' ids (or copies the row).
#[inline]
fn resolve<I: VertexId>(row: &[I], k: u32, replace: bool, out: &mut [u32]) {
    if takes_all(row.len(), k, replace) {
        for (o, &x) in out.iter_mut().zip(row) {
            *o = vid(x);
        }
    } else {
        for o in out.iter_mut() {
            *o = vid(row[*o as usize]);
        }
    }
}

/// Fills `out` (length `row_count(row.len(), k, replace)`) with sampled neighbours of `v`'s row.
#[cfg(test)]
pub(crate) fn pick<I: VertexId>(
    row: &[I],
    out: &mut [u32],
    k: u32,
    replace: bool,
    base: u64,
    v: u32,
) {
    positions(row.len(), k, replace, base, v, out);
    resolve(row, k, replace, out);
}

/// Floyd's algorithm: `out.len()` distinct positions in `0..d`, every subset equally likely.
fn floyd(d: usize, out: &mut [u32], rng: &mut Rng) {
    let k = out.len();
    assert!(d <= u32::MAX as usize, "row longer than 2^32 arcs");
    if d <= 64 {
        // Membership as a bit mask: the usual case (rows of a few dozen arcs).
        let mut chosen = 0u64;
        for (c, j) in (d - k..d).enumerate() {
            let t = rng.below(j as u64 + 1) as u32;
            let x = if chosen >> t & 1 == 1 { j as u32 } else { t };
            chosen |= 1 << x;
            out[c] = x;
        }
    } else if d <= 4096 {
        // A 512-byte bit map on the stack.
        let mut chosen = [0u64; 64];
        for (c, j) in (d - k..d).enumerate() {
            let t = rng.below(j as u64 + 1) as u32;
            let x = if chosen[t as usize / 64] >> (t % 64) & 1 == 1 {
                j as u32
            } else {
                t
            };
            chosen[x as usize / 64] |= 1 << (x % 64);
            out[c] = x;
        }
    } else if k <= 64 {
        for (c, j) in (d - k..d).enumerate() {
            let t = rng.below(j as u64 + 1) as u32;
            out[c] = if out[..c].contains(&t) { j as u32 } else { t };
        }
    } else {
        let mut seen = HashSet::with_capacity(2 * k);
        for (c, j) in (d - k..d).enumerate() {
            let t = rng.below(j as u64 + 1) as u32;
            let x = if seen.insert(t) { t } else { j as u32 };
            seen.insert(x);
            out[c] = x;
        }
    }
}

struct UniformHop<'a> {
    frontier: &'a [u32],
    k: u32,
    replace: bool,
    base: u64,
}

impl CsrJob for UniformHop<'_> {
    type Out = HopEdges;
    fn run<O: Offset, I: VertexId>(self, g: Csr<'_, O, I>) -> HopEdges {
        let UniformHop {
            frontier,
            k,
            replace,
            base,
        } = self;
        let lens: Vec<u32> = frontier
            .par_iter()
            .with_min_len(1024)
            .map(|&v| row_count(g.degree(v), k, replace))
            .collect();
        let indptr = offsets(&lens);
        drop(lens);
        let mut ids = vec![0u32; *indptr.last().unwrap() as usize];
        // Two stages a few rows apart, so the arcs a row will read are already on their way
        // from memory: draw positions and prefetch them, then read them.
        let draw = |i: usize, out: &mut [u32]| {
            if let Some(&next) = frontier.get(i + AHEAD) {
                prefetch(&g.indptr[next as usize]);
            }
            let v = frontier[i];
            let (a, b) = g.bounds(v);
            positions(b - a, k, replace, base, v, out);
            if takes_all(b - a, k, replace) {
                (a..b)
                    .step_by(16)
                    .take(4)
                    .for_each(|e| prefetch(&g.indices[e]));
            } else {
                out.iter()
                    .for_each(|&p| prefetch(&g.indices[a + p as usize]));
            }
        };
        par_fill(&indptr, &mut ids, None, draw, |i, out, _| {
            resolve(g.row(frontier[i]), k, replace, out);
        });
        HopEdges {
            indptr,
            ids,
            weights: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;
    use fanout_graph::Layout;
    use std::collections::HashMap;

    #[test]
    fn one_hop_alone_draws_what_the_batch_drew() {
        let ds = random_graph(3000, 200, 3);
        let seeds: Vec<u32> = (0..150).map(|i| i * 17 + 1).collect();
        for replace in [false, true] {
            let s = sampler(&ds, &[6, 4, 3], replace);
            let key = BatchKey {
                seed: 9,
                epoch: 2,
                step: 5,
            };
            assert_hops_match_the_batch(&s, &seeds, key);
        }
    }

    fn sampler(ds: &Arc<Dataset>, fanouts: &[u32], replace: bool) -> KHopSampler {
        sampler_with(ds, fanouts, replace, RemapKind::Auto)
    }

    fn sampler_with(
        ds: &Arc<Dataset>,
        fanouts: &[u32],
        replace: bool,
        remap: RemapKind,
    ) -> KHopSampler {
        let cfg = KHopConfig {
            fanouts: fanouts.to_vec(),
            replace,
            remap,
        };
        KHopSampler::new(ds.clone(), cfg).unwrap()
    }

    fn key(step: u64) -> BatchKey {
        BatchKey {
            seed: 42,
            epoch: 1,
            step,
        }
    }

    /// Batches sampled concurrently by outside threads (several loaders sharing a sampler)
    /// on one pool, each building a dense remapper (a parallel fill): they must all
    /// finish, with the batches a lone call gives. Holding the remapper pool's lock across the
    /// build deadlocked (a worker waiting for the fill ran the other batch, which took the
    /// lock).
    #[test]
    fn concurrent_batches_from_outside_the_pool_finish() {
        let n = 300_000u64;
        let arcs: Vec<(u64, u64)> = (0..n).map(|v| ((v + 1) % n, v)).collect();
        let ds = dataset(&arcs, n, Layout::Csc);
        let pool = Arc::new(pool(2));
        // Rounds with a fresh sampler (no remapper to reuse): the race is not hit every time.
        for _ in 0..10 {
            let s = Arc::new(sampler_with(&ds, &[2, 2], false, RemapKind::Dense));
            let jobs: Vec<_> = (0..8u32)
                .map(|t| {
                    let s = s.clone();
                    move || {
                        let seeds: Vec<u32> = (0..64).map(|i| t * 1000 + i).collect();
                        let mb = s.sample(&seeds, key(t as u64)).unwrap();
                        (t, seeds, mb)
                    }
                })
                .collect();
            for (t, seeds, mb) in install_from_threads(&pool, jobs) {
                let alone = s.sample(&seeds, key(t as u64)).unwrap();
                assert_eq!(mb.input_nodes, alone.input_nodes);
            }
        }
    }

    #[test]
    fn blocks_valid_edges_exist_no_duplicates_counts_right() {
        let ds = random_graph(3000, 500, 1);
        let arcs = arc_set(&ds);
        let deg = ds.topology.in_degrees();
        let seeds: Vec<u32> = (0..200).map(|i| i * 13).collect();
        for replace in [false, true] {
            let s = sampler(&ds, &[15, 10, 5], replace);
            let mb = s.sample(&seeds, key(0)).unwrap();
            mb.validate().unwrap();
            assert_eq!(mb.seeds(), &seeds[..]);
            assert_edges_exist(&mb, &arcs);
            let labels: Vec<i64> = seeds.iter().map(|&v| v as i64 % 7).collect();
            assert_eq!(mb.labels.as_ref(), Some(&labels));
            for (h, &k) in [15u32, 10, 5].iter().enumerate() {
                let b = &mb.blocks[2 - h];
                for d in 0..b.num_dst {
                    let dg = deg[mb.input_nodes[d] as usize] as usize;
                    let row = b.row(d);
                    assert_eq!(row.len(), row_count(dg, k, replace) as usize);
                    if !replace {
                        let mut r = row.to_vec();
                        r.sort_unstable();
                        r.dedup();
                        assert_eq!(r.len(), row.len(), "duplicate neighbour");
                    }
                }
            }
        }
    }

    /// Inclusion counts of each of the hub's neighbours over many batches of one seed.
    fn hub_counts(s: &KHopSampler, trials: u64) -> Vec<u64> {
        let ds = s.dataset();
        let row: Vec<u64> = ds.topology.row(0).iter().collect();
        let mut counts = vec![0u64; row.len()];
        for t in 0..trials {
            let mb = s.sample(&[0], key(t)).unwrap();
            let b = mb.blocks.last().unwrap();
            for &l in b.row(0) {
                let g = mb.input_nodes[l as usize] as u64;
                counts[row.binary_search(&g).unwrap()] += 1;
            }
        }
        counts
    }

    #[test]
    fn uniform_without_and_with_replacement_chi_square() {
        // Hubs of 60 and 300 in-neighbours (Floyd's bit-mask and scan paths), fanout 5.
        for hub in [60usize, 300] {
            let ds = random_graph(hub as u64 + 100, hub as u64, 2);
            let d = ds.topology.row(0).len();
            assert_eq!(d, hub);
            let trials = 4000;
            let expect = vec![trials as f64 * 5.0 / d as f64; d];
            for replace in [false, true] {
                let counts = hub_counts(&sampler(&ds, &[5], replace), trials);
                let x = chi2(&counts, &expect);
                assert!(
                    x < chi2_critical(d - 1),
                    "hub {hub} replace {replace}: chi2 {x}"
                );
            }
            // The same test rejects a sampler that always takes the first k, or one that draws a
            // tenth of the neighbours 50% more often and another tenth 50% less.
            let mut first_k = vec![0u64; d];
            first_k[..5].iter_mut().for_each(|c| *c = trials);
            assert!(chi2(&first_k, &expect) > chi2_critical(d - 1));
            let mut biased: Vec<u64> = expect.iter().map(|&e| e as u64).collect();
            let tenth = d / 10;
            biased[..tenth].iter_mut().for_each(|c| *c = *c * 3 / 2);
            biased[tenth..2 * tenth].iter_mut().for_each(|c| *c /= 2);
            assert!(chi2(&biased, &expect) > chi2_critical(d - 1));
        }
    }

    #[test]
    fn floyd_pairs_are_uniform() {
        // All C(6,2) = 15 pairs of positions equally likely (tests the joint law, not only the
        // marginals a "rotate by a random offset" sampler would also get right).
        let mut r = Rng::new(3);
        let mut counts = vec![0u64; 36];
        let trials = 30_000;
        for _ in 0..trials {
            let mut out = [0u32; 2];
            floyd(6, &mut out, &mut r);
            let (a, b) = (out[0].min(out[1]), out[0].max(out[1]));
            assert_ne!(a, b);
            counts[(a * 6 + b) as usize] += 1;
        }
        let pairs: Vec<u64> = (0..36)
            .filter(|i| i / 6 < i % 6)
            .map(|i| counts[i])
            .collect();
        let x = chi2(&pairs, &[trials as f64 / 15.0; 15]);
        assert!(x < chi2_critical(14), "chi2 {x}");
        // The membership paths (bit mask, bit map, scan, hash set) pick the same positions for
        // the same stream, so the choice of path never changes a sample.
        for (d, k) in [
            (64usize, 10usize),
            (65, 10),
            (4096, 64),
            (5000, 64),
            (5000, 65),
        ] {
            let mut a = vec![0u32; k];
            floyd(d, &mut a, &mut Rng::new(d as u64));
            let mut b = vec![0u32; k];
            let mut rb = Rng::new(d as u64);
            for (c, j) in (d - k..d).enumerate() {
                let t = rb.below(j as u64 + 1) as u32;
                b[c] = if b[..c].contains(&t) { j as u32 } else { t };
            }
            assert_eq!(a, b, "d {d} k {k}");
            let set: HashSet<u32> = a.iter().copied().collect();
            assert_eq!(set.len(), k);
            assert!(a.iter().all(|&x| (x as usize) < d));
        }
    }

    /// Sequential reference: same streams, one vertex at a time, HashMap remapping.
    fn reference(
        ds: &Dataset,
        seeds: &[u32],
        fanouts: &[u32],
        replace: bool,
        k: BatchKey,
    ) -> MiniBatch {
        let mut nodes: Vec<u32> = seeds.to_vec();
        let mut local: HashMap<u32, u32> = (0..).zip(seeds).map(|(i, &s)| (s, i)).collect();
        let mut blocks = Vec::new();
        for (h, &f) in fanouts.iter().enumerate() {
            let base = hop_stream(&k, tag::UNIFORM, h);
            let num_dst = nodes.len();
            let (mut indptr, mut indices) = (vec![0u32], Vec::new());
            for i in 0..num_dst {
                let v = nodes[i];
                let row: Vec<u32> = ds.topology.row(v as u64).iter().map(|x| x as u32).collect();
                let mut out = vec![0u32; row_count(row.len(), f, replace) as usize];
                pick(&row, &mut out, f, replace, base, v);
                for g in out {
                    let l = *local.entry(g).or_insert_with(|| {
                        nodes.push(g);
                        nodes.len() as u32 - 1
                    });
                    indices.push(l);
                }
                indptr.push(indices.len() as u32);
            }
            blocks.push(crate::Block {
                num_dst,
                num_src: nodes.len(),
                indptr,
                indices,
                weights: None,
            });
        }
        blocks.reverse();
        let labels = ds
            .labels
            .as_ref()
            .map(|l| seeds.iter().map(|&s| l[s as usize]).collect());
        MiniBatch {
            resident: Default::default(),
            key: k,
            num_seeds: seeds.len(),
            blocks,
            input_nodes: nodes,
            labels,
        }
    }

    #[test]
    fn deterministic_across_runs_threads_and_equal_to_sequential_reference() {
        let ds = random_graph(5000, 300, 4);
        let seeds: Vec<u32> = (0..300).map(|i| (i * 7919) % 5000).collect();
        for replace in [false, true] {
            let want = reference(&ds, &seeds, &[10, 4, 3], replace, key(9));
            for (threads, remap) in [
                (1, RemapKind::Dense),
                (2, RemapKind::Hash),
                (7, RemapKind::Auto),
            ] {
                let s = sampler_with(&ds, &[10, 4, 3], replace, remap);
                let got = pool(threads).install(|| s.sample(&seeds, key(9)).unwrap());
                assert_eq!(got, want, "threads {threads} replace {replace} {remap:?}");
                // The workspace is reused: a second batch is still right.
                assert_eq!(s.sample(&seeds, key(9)).unwrap(), want);
            }
        }
        let s = sampler(&ds, &[10, 4, 3], false);
        assert_ne!(
            s.sample(&seeds, key(1)).unwrap(),
            s.sample(&seeds, key(2)).unwrap()
        );
    }

    #[test]
    fn bad_seeds_are_errors_and_csr_rows_are_sampled() {
        let ds = random_graph(100, 10, 5);
        let s = sampler(&ds, &[3], false);
        let e = s.sample(&[1, 100], key(0)).unwrap_err().to_string();
        assert!(e.contains("seed vertex 100 is out of range"), "{e}");
        let e = s.sample(&[4, 4], key(0)).unwrap_err().to_string();
        assert!(e.contains("appears more than once"), "{e}");
        assert!(s.sample(&[4], key(0)).is_ok());
        assert!(KHopSampler::new(
            ds.clone(),
            KHopConfig {
                fanouts: vec![],
                replace: false,
                remap: RemapKind::Auto
            }
        )
        .is_err());

        let arcs: Vec<(u64, u64)> = (0..50)
            .flat_map(|v| [(v, (v + 1) % 50), (v, (v + 7) % 50)])
            .collect();
        let csr = dataset(&arcs, 50, Layout::Csr);
        let s = sampler(&csr, &[2, 2], false);
        assert!(s.layout_note().unwrap().contains("out-neighbours"));
        let mb = s.sample(&[0, 1], key(0)).unwrap();
        mb.validate().unwrap();
        assert_edges_exist(&mb, &arc_set(&csr));
        assert_eq!(mb.blocks[1].row(0).len(), 2);
    }
}
