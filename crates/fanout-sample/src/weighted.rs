//! Weighted k-hop sampling through per-arc alias tables (GNNLab's weighted k-hop).
//!
//! With replacement: `k` alias draws per row, O(1) each. Without replacement: successive
//! sampling (each next arc drawn in proportion to weight among the arcs not yet chosen, as
//! `numpy.random.choice(replace=False, p=w)`), implemented by alias draws that reject repeats;
//! after `8k + 64` draws without finishing (weight concentrated on few arcs) it finishes with an
//! exact scan over the row. Arcs of weight 0 are never drawn, so a row yields
//! `min(k, arcs of positive weight)` edges without replacement.

use crate::alias::{AliasTables, NO_ARC};
use crate::graph::{
    check_dataset, hop_stream, par_collect, tag, vertex_rng, vid, Csr, CsrJob, FANOUT_ALL,
};
use crate::minibatch::{BatchKey, MiniBatch};
use crate::remap::RemapKind;
use crate::resident::Residency;
use crate::sampler::{check_hop, growth, Driver, HopEdges, HopSample, Sampler};
use fanout_graph::{Dataset, Error, Offset, Result, VertexId};
use std::collections::HashSet;
use std::sync::Arc;

/// Configuration of [`WeightedSampler`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct WeightedConfig {
    /// Arcs per vertex for each hop, in hop order from the seeds; [`FANOUT_ALL`] takes every arc
    /// of positive weight.
    pub fanouts: Vec<u32>,
    /// Draw with replacement (repeats kept as parallel edges).
    pub replace: bool,
    /// Remapping table.
    pub remap: RemapKind,
}

/// Weighted k-hop sampler. Guarantees (beyond [`Sampler`]'s): each draw picks arc `e` of the
/// row with probability `weight[e] / row sum` (among the arcs not yet chosen, without
/// replacement); block weights are the stored weights of the sampled arcs.
pub struct WeightedSampler {
    cfg: WeightedConfig,
    tables: Arc<AliasTables>,
    driver: Driver,
}

impl WeightedSampler {
    /// A sampler over `ds` with its tables (from [`AliasTables::load_or_build`]). Errors if the
    /// tables do not have one entry per arc, or on an empty fanout list.
    pub fn new(ds: Arc<Dataset>, cfg: WeightedConfig, tables: Arc<AliasTables>) -> Result<Self> {
        check_dataset(&ds)?;
        let e = ds.num_arcs() as usize;
        if [tables.weights.len(), tables.prob.len(), tables.idx.len()] != [e; 3] {
            return Err(Error::Invalid(format!(
                "alias tables do not match the dataset ({e} arcs)"
            )));
        }
        if cfg.fanouts.is_empty() || cfg.fanouts.contains(&0) {
            return Err(Error::Invalid(
                "weighted sampling needs at least one hop and fanouts >= 1".into(),
            ));
        }
        Ok(WeightedSampler {
            driver: Driver::new(ds, cfg.remap, growth(&cfg.fanouts)),
            cfg,
            tables,
        })
    }
}

impl WeightedSampler {
    /// The random stream of hop `hop` of the batch `key` (each vertex's draws are seeded from
    /// it and the vertex id): for other implementations that must draw the same arcs.
    pub fn hop_base(key: &BatchKey, hop: usize) -> u64 {
        hop_stream(key, tag::WEIGHTED, hop)
    }

    /// Reads rows as `r` says ([`Residency::Auto`] by default): a resident huge-page copy of
    /// the topology, or the memory-mapped files.
    pub fn with_residency(mut self, r: Residency) -> Self {
        self.driver.set_residency(r);
        self
    }
}

impl Sampler for WeightedSampler {
    fn sample(&self, seeds: &[u32], key: BatchKey) -> Result<MiniBatch> {
        let rows = &self.driver.rows;
        self.driver
            .run(seeds, key, self.cfg.fanouts.len(), |h, frontier| {
                rows.run(WeightedHop {
                    frontier,
                    k: self.cfg.fanouts[h],
                    replace: self.cfg.replace,
                    base: Self::hop_base(&key, h),
                    t: &self.tables,
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
        "weighted"
    }
    fn sample_hop(&self, frontier: &[u32], key: BatchKey, hop: usize) -> Result<HopSample> {
        check_hop(self, frontier, hop)?;
        Ok(self.driver.rows.run(WeightedHop {
            frontier,
            k: self.cfg.fanouts[hop],
            replace: self.cfg.replace,
            base: Self::hop_base(&key, hop),
            t: &self.tables,
        }))
    }
}

struct WeightedHop<'a> {
    frontier: &'a [u32],
    k: u32,
    replace: bool,
    base: u64,
    t: &'a AliasTables,
}

impl CsrJob for WeightedHop<'_> {
    type Out = HopEdges;
    fn run<O: Offset, I: VertexId>(self, g: Csr<'_, O, I>) -> HopEdges {
        let (indptr, ids, weights) = par_collect(self.frontier.len(), true, |i, ids, ws| {
            let v = self.frontier[i];
            let (a, b) = g.bounds(v);
            let row = Row {
                ids: &g.indices[a..b],
                w: &self.t.weights[a..b],
                prob: &self.t.prob[a..b],
                idx: &self.t.idx[a..b],
            };
            row.pick(self.k, self.replace, self.base, v, ids, ws);
        });
        HopEdges {
            indptr,
            ids,
            weights: Some(weights),
        }
    }
}

/// One row's arcs with their weights and alias table.
struct Row<'a, I> {
    ids: &'a [I],
    w: &'a [f32],
    prob: &'a [f32],
    idx: &'a [u32],
}

impl<I: VertexId> Row<'_, I> {
    fn pick(
        &self,
        k: u32,
        replace: bool,
        base: u64,
        v: u32,
        ids: &mut Vec<u32>,
        ws: &mut Vec<f32>,
    ) {
        let d = self.ids.len();
        if d == 0 || self.idx[0] == NO_ARC {
            return;
        }
        let push = |j: usize| {
            ids.push(vid(self.ids[j]));
            ws.push(self.w[j]);
        };
        if k == FANOUT_ALL || (!replace && k as usize >= d) {
            (0..d).filter(|&j| self.w[j] > 0.0).for_each(push);
            return;
        }
        let mut rng = vertex_rng(base, v);
        let mut draw = || {
            let i = rng.below(d as u64) as usize;
            if rng.next_f32() < self.prob[i] {
                i
            } else {
                self.idx[i] as usize
            }
        };
        let k = k as usize;
        if replace {
            (0..k).map(|_| draw()).for_each(push);
            return;
        }
        let mut chosen: Vec<usize> = Vec::with_capacity(k);
        let mut set = HashSet::new();
        let mut attempts = 0;
        while chosen.len() < k && attempts < 8 * k + 64 {
            attempts += 1;
            let j = draw();
            let seen = if k <= 64 {
                chosen.contains(&j)
            } else {
                !set.insert(j)
            };
            if !seen {
                chosen.push(j);
            }
        }
        if chosen.len() < k {
            // Exact successive sampling over what is left.
            let mut rng = vertex_rng(base ^ 0x5EED, v);
            let mut taken = vec![false; d];
            chosen.iter().for_each(|&j| taken[j] = true);
            while chosen.len() < k {
                let left = |j: &usize| !taken[*j] && self.w[*j] > 0.0;
                let total: f64 = (0..d).filter(left).map(|j| self.w[j] as f64).sum();
                if total <= 0.0 {
                    break;
                }
                let mut r = rng.next_f64() * total;
                let mut pick = None;
                for j in (0..d).filter(left) {
                    pick = Some(j);
                    r -= self.w[j] as f64;
                    if r < 0.0 {
                        break;
                    }
                }
                let j = pick.unwrap();
                taken[j] = true;
                chosen.push(j);
            }
        }
        chosen.into_iter().for_each(push);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alias::write_weights;
    use crate::testutil::*;
    use fanout_graph::{Layout, NoProgress};
    use std::collections::HashMap;

    /// Weight of arc (src -> dst): `f(dst, src)`; returns the sampler and the weight map.
    fn setup(
        ds: &Arc<Dataset>,
        f: impl Fn(u32, u32) -> f32,
        fanouts: &[u32],
        replace: bool,
    ) -> (WeightedSampler, HashMap<(u32, u32), f32>) {
        let mut w = Vec::new();
        let mut map = HashMap::new();
        for v in 0..ds.num_nodes() as u32 {
            for u in ds.topology.row(v as u64).iter() {
                let x = f(v, u as u32);
                w.push(x);
                map.insert((v, u as u32), x);
            }
        }
        write_weights(&ds.dir, &w).unwrap();
        let t = Arc::new(AliasTables::load_or_build(ds, &NoProgress).unwrap());
        let cfg = WeightedConfig {
            fanouts: fanouts.to_vec(),
            replace,
            remap: RemapKind::Auto,
        };
        (WeightedSampler::new(ds.clone(), cfg, t).unwrap(), map)
    }

    fn key(step: u64) -> BatchKey {
        BatchKey {
            seed: 5,
            epoch: 0,
            step,
        }
    }

    #[test]
    fn one_hop_alone_draws_what_the_batch_drew() {
        let ds = random_graph(1500, 60, 4);
        let seeds: Vec<u32> = (0..80).map(|i| i * 13 + 2).collect();
        for replace in [false, true] {
            let (s, _) = setup(&ds, |v, u| 1.0 + ((u * 7 + v) % 4) as f32, &[5, 3], replace);
            assert_hops_match_the_batch(&s, &seeds, key(3));
        }
    }

    #[test]
    fn edges_exist_weights_carried_zero_weight_never_drawn_deterministic() {
        let ds = random_graph(2000, 100, 7);
        let arcs = arc_set(&ds);
        // Weight 0 for arcs from sources divisible by 3.
        let f = |v: u32, u: u32| {
            if u.is_multiple_of(3) {
                0.0
            } else {
                1.0 + ((u ^ v) % 5) as f32
            }
        };
        let seeds: Vec<u32> = (0..100).map(|i| i * 19).collect();
        for replace in [false, true] {
            let (s, map) = setup(&ds, f, &[8, 4], replace);
            let mb = s.sample(&seeds, key(1)).unwrap();
            mb.validate().unwrap();
            assert_edges_exist(&mb, &arcs);
            let mut positive: HashMap<u32, usize> = HashMap::new();
            for (e, &x) in &map {
                *positive.entry(e.0).or_default() += (x > 0.0) as usize;
            }
            let g = &mb.input_nodes;
            for (b, k) in mb.blocks.iter().zip([4usize, 8]) {
                let w = b.weights.as_ref().unwrap();
                for d in 0..b.num_dst {
                    let row = b.row(d);
                    let r0 = b.indptr[d] as usize;
                    for (j, &l) in row.iter().enumerate() {
                        let e = (g[d], g[l as usize]);
                        assert_eq!(w[r0 + j], map[&e]);
                        assert!(!e.1.is_multiple_of(3), "zero-weight arc drawn");
                    }
                    let pos = positive.get(&g[d]).copied().unwrap_or(0);
                    let want = match (replace, pos) {
                        (_, 0) => 0,
                        (true, _) => k,
                        (false, p) => p.min(k),
                    };
                    assert_eq!(row.len(), want);
                    if !replace {
                        let mut r = row.to_vec();
                        r.sort_unstable();
                        r.dedup();
                        assert_eq!(r.len(), row.len(), "duplicate without replacement");
                    }
                }
            }
            let other = pool(3).install(|| s.sample(&seeds, key(1)).unwrap());
            assert_eq!(other, mb);
        }
    }

    #[test]
    fn with_replacement_frequencies_match_weights() {
        let ds = random_graph(100, 30, 8);
        let (s, map) = setup(&ds, |_, u| (u % 6) as f32, &[10], true);
        let row: Vec<u32> = ds.topology.row(0).iter().map(|x| x as u32).collect();
        let mut counts = vec![0u64; row.len()];
        let trials = 3000;
        for t in 0..trials {
            let mb = s.sample(&[0], key(t)).unwrap();
            for &l in mb.blocks[0].row(0) {
                let g = mb.input_nodes[l as usize];
                counts[row.iter().position(|&x| x == g).unwrap()] += 1;
            }
        }
        let total: f32 = row.iter().map(|&u| map[&(0, u)]).sum();
        let (mut obs, mut exp) = (vec![], vec![]);
        for (i, &u) in row.iter().enumerate() {
            let p = map[&(0, u)] / total;
            if p == 0.0 {
                assert_eq!(counts[i], 0);
            } else {
                obs.push(counts[i]);
                exp.push(p as f64 * trials as f64 * 10.0);
            }
        }
        let x = chi2(&obs, &exp);
        assert!(x < chi2_critical(obs.len() - 1), "chi2 {x}");
    }

    #[test]
    fn without_replacement_pairs_follow_successive_sampling() {
        // Vertex 0 with in-neighbours 1..=4 of weights 1, 2, 3, 4; k = 2.
        let arcs: Vec<(u64, u64)> = (1..=4).map(|u| (u, 0)).collect();
        let ds = dataset(&arcs, 5, Layout::Csc);
        let (s, _) = setup(&ds, |_, u| u as f32, &[2], false);
        let w = [1.0, 2.0, 3.0, 4.0];
        let total: f64 = 10.0;
        let mut pairs = Vec::new();
        for i in 0..4 {
            for j in i + 1..4 {
                let p = w[i] / total * w[j] / (total - w[i]) + w[j] / total * w[i] / (total - w[j]);
                pairs.push(((i as u32 + 1, j as u32 + 1), p));
            }
        }
        let mut counts = vec![0u64; pairs.len()];
        let trials = 6_000;
        for t in 0..trials {
            let mb = s.sample(&[0], key(t)).unwrap();
            let mut got: Vec<u32> = mb.blocks[0]
                .row(0)
                .iter()
                .map(|&l| mb.input_nodes[l as usize])
                .collect();
            got.sort_unstable();
            let i = pairs
                .iter()
                .position(|(p, _)| *p == (got[0], got[1]))
                .unwrap();
            counts[i] += 1;
        }
        let exp: Vec<f64> = pairs.iter().map(|(_, p)| p * trials as f64).collect();
        let x = chi2(&counts, &exp);
        assert!(
            x < chi2_critical(5),
            "chi2 {x} counts {counts:?} expected {exp:?}"
        );
    }
}
