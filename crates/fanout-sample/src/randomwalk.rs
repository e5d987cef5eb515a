//! PinSAGE random-walk neighbourhoods (GNNLab's random-walk sampler).
//!
//! For every frontier vertex `v`: `walks` walks start at `v`; each step moves to a uniformly
//! drawn entry of the current vertex's stored row, counts a visit to it (visits back to `v`
//! itself are not counted: a vertex is not its own neighbour), then stops the walk with
//! probability `stop_prob`; a walk also ends after `length` steps or at a vertex with an empty
//! row. The `k` most visited vertices become `v`'s neighbours (ties: smaller global id first),
//! with their visit counts as edge weights. Work per vertex is O(walks x length), whatever the
//! degrees. GNNLab's PinSAGE: 3 layers, 4 walks of length 3, stop 0.5, top 5.

use crate::graph::{check_dataset, hop_stream, par_collect, tag, vertex_rng, vid, Csr, CsrJob};
use crate::minibatch::{BatchKey, MiniBatch};
use crate::remap::RemapKind;
use crate::resident::Residency;
use crate::sampler::{growth, Driver, HopEdges, Sampler};
use fanout_graph::{Dataset, Error, Offset, Result, VertexId};
use std::sync::Arc;

/// Configuration of [`RandomWalkSampler`].
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RandomWalkConfig {
    /// Neighbours kept per vertex (top-k by visits), one entry per layer in hop order.
    pub top_k: Vec<u32>,
    /// Walks per vertex.
    pub walks: u32,
    /// Maximum steps per walk.
    pub length: u32,
    /// Probability of stopping after each step.
    pub stop_prob: f64,
    /// Remapping table.
    pub remap: RemapKind,
}

impl Default for RandomWalkConfig {
    /// GNNLab's PinSAGE setting: 3 layers of top 5 from 4 walks of length 3, stop 0.5.
    fn default() -> Self {
        RandomWalkConfig {
            top_k: vec![5, 5, 5],
            walks: 4,
            length: 3,
            stop_prob: 0.5,
            remap: RemapKind::Auto,
        }
    }
}

/// PinSAGE sampler. Guarantees (beyond [`Sampler`]'s): each row holds at most `top_k[h]`
/// distinct vertices, never the destination itself, ordered by decreasing visit count (ties:
/// smaller global id first); block weights are the visit counts (>= 1).
pub struct RandomWalkSampler {
    cfg: RandomWalkConfig,
    driver: Driver,
}

impl RandomWalkSampler {
    /// A sampler over `ds`. Errors on an empty layer list, zero `top_k`, walks or length, or a
    /// stop probability outside [0, 1].
    pub fn new(ds: Arc<Dataset>, cfg: RandomWalkConfig) -> Result<Self> {
        check_dataset(&ds)?;
        if cfg.top_k.is_empty() || cfg.top_k.contains(&0) || cfg.walks == 0 || cfg.length == 0 {
            return Err(Error::Invalid(
                "random-walk sampling needs at least one layer and top-k, walks and length >= 1"
                    .into(),
            ));
        }
        if !(0.0..=1.0).contains(&cfg.stop_prob) {
            return Err(Error::Invalid(format!(
                "stop probability {} is not in [0, 1]",
                cfg.stop_prob
            )));
        }
        let per_vertex: Vec<u32> = cfg
            .top_k
            .iter()
            .map(|&k| k.min(cfg.walks.saturating_mul(cfg.length)))
            .collect();
        Ok(RandomWalkSampler {
            driver: Driver::new(ds, cfg.remap, growth(&per_vertex)),
            cfg,
        })
    }
}

impl RandomWalkSampler {
    /// The random stream of hop `hop` of the batch `key` (each vertex's walks are seeded from
    /// it and the vertex id): for other implementations that must walk the same steps.
    pub fn hop_base(key: &BatchKey, hop: usize) -> u64 {
        hop_stream(key, tag::WALK, hop)
    }

    /// Reads rows as `r` says ([`Residency::Auto`] by default): a resident huge-page copy of
    /// the topology, or the memory-mapped files.
    pub fn with_residency(mut self, r: Residency) -> Self {
        self.driver.set_residency(r);
        self
    }
}

impl Sampler for RandomWalkSampler {
    fn sample(&self, seeds: &[u32], key: BatchKey) -> Result<MiniBatch> {
        let rows = &self.driver.rows;
        self.driver
            .run(seeds, key, self.cfg.top_k.len(), |h, frontier| {
                rows.run(WalkHop {
                    frontier,
                    k: self.cfg.top_k[h] as usize,
                    cfg: &self.cfg,
                    base: Self::hop_base(&key, h),
                })
            })
    }
    fn num_layers(&self) -> usize {
        self.cfg.top_k.len()
    }
    fn dataset(&self) -> &Arc<Dataset> {
        &self.driver.ds
    }
    fn is_resident(&self) -> bool {
        self.driver.rows.is_resident()
    }
    fn name(&self) -> &'static str {
        "randomwalk"
    }
}

struct WalkHop<'a> {
    frontier: &'a [u32],
    k: usize,
    cfg: &'a RandomWalkConfig,
    base: u64,
}

impl CsrJob for WalkHop<'_> {
    type Out = HopEdges;
    fn run<O: Offset, I: VertexId>(self, g: Csr<'_, O, I>) -> HopEdges {
        let (indptr, ids, weights) = par_collect(self.frontier.len(), true, |i, ids, ws| {
            let v = self.frontier[i];
            let visits = walk_counts(g, v, self.cfg, self.base);
            for &(u, c) in visits.iter().take(self.k) {
                ids.push(u);
                ws.push(c as f32);
            }
        });
        HopEdges {
            indptr,
            ids,
            weights: Some(weights),
        }
    }
}

/// Visit counts of `v`'s walks, sorted by decreasing count then increasing id.
fn walk_counts<O: Offset, I: VertexId>(
    g: Csr<'_, O, I>,
    v: u32,
    cfg: &RandomWalkConfig,
    base: u64,
) -> Vec<(u32, u32)> {
    let mut rng = vertex_rng(base, v);
    let mut visits: Vec<(u32, u32)> = Vec::with_capacity((cfg.walks * cfg.length) as usize);
    for _ in 0..cfg.walks {
        let mut cur = v;
        for _ in 0..cfg.length {
            let row = g.row(cur);
            if row.is_empty() {
                break;
            }
            cur = vid(row[rng.below(row.len() as u64) as usize]);
            if cur != v {
                match visits.iter_mut().find(|e| e.0 == cur) {
                    Some(e) => e.1 += 1,
                    None => visits.push((cur, 1)),
                }
            }
            if rng.bernoulli(cfg.stop_prob) {
                break;
            }
        }
    }
    visits.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    visits
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;
    use fanout_rand::Rng;
    use std::collections::BTreeMap;

    /// Slow reference: walks written out again on the public row API, counted in a BTreeMap,
    /// fully sorted, top k kept.
    fn reference(
        ds: &Dataset,
        v: u32,
        cfg: &RandomWalkConfig,
        base: u64,
        k: usize,
    ) -> Vec<(u32, u32)> {
        let mut rng: Rng = vertex_rng(base, v);
        let mut counts: BTreeMap<u32, u32> = BTreeMap::new();
        for _ in 0..cfg.walks {
            let mut cur = v as u64;
            for _ in 0..cfg.length {
                let row = ds.topology.row(cur);
                if row.is_empty() {
                    break;
                }
                cur = row.get(rng.below(row.len() as u64) as usize);
                if cur != v as u64 {
                    *counts.entry(cur as u32).or_default() += 1;
                }
                if rng.next_f64() < cfg.stop_prob {
                    break;
                }
            }
        }
        let mut all: Vec<(u32, u32)> = counts.into_iter().collect();
        all.sort_by_key(|&(u, c)| (std::cmp::Reverse(c), u));
        all.truncate(k);
        all
    }

    #[test]
    fn top_k_counts_match_slow_reference_and_blocks_are_valid() {
        let ds = random_graph(3000, 200, 11);
        let cfg = RandomWalkConfig {
            walks: 6,
            length: 4,
            ..Default::default()
        };
        let s = RandomWalkSampler::new(ds.clone(), cfg.clone()).unwrap();
        let seeds: Vec<u32> = (0..150).map(|i| i * 17).collect();
        let key = BatchKey {
            seed: 3,
            epoch: 2,
            step: 7,
        };
        let mb = s.sample(&seeds, key).unwrap();
        mb.validate().unwrap();
        let mut nonempty = 0;
        for (b, h) in mb.blocks.iter().rev().zip(0..) {
            let base = hop_stream(&key, tag::WALK, h);
            let w = b.weights.as_ref().unwrap();
            for d in 0..b.num_dst {
                let v = mb.input_nodes[d];
                let want = reference(&ds, v, &cfg, base, 5);
                let got: Vec<(u32, u32)> = b
                    .row(d)
                    .iter()
                    .zip(&w[b.indptr[d] as usize..])
                    .map(|(&l, &c)| (mb.input_nodes[l as usize], c as u32))
                    .collect();
                assert_eq!(got, want, "hop {h} vertex {v}");
                nonempty += !got.is_empty() as usize;
            }
        }
        assert!(nonempty > 100);
        let other = pool(4).install(|| s.sample(&seeds, key).unwrap());
        assert_eq!(other, mb);
    }

    #[test]
    fn walks_stay_on_arcs_and_stop_probability_one_gives_one_step() {
        // With stop probability 1 every walk takes exactly one step: neighbours are arcs.
        let ds = random_graph(500, 50, 12);
        let arcs = arc_set(&ds);
        let cfg = RandomWalkConfig {
            top_k: vec![5, 5],
            stop_prob: 1.0,
            ..Default::default()
        };
        let s = RandomWalkSampler::new(ds.clone(), cfg).unwrap();
        let mb = s.sample(&[0, 1, 2, 3], BatchKey::default()).unwrap();
        mb.validate().unwrap();
        assert_edges_exist(&mb, &arcs);
        let total: f32 = mb.blocks[1].weights.as_ref().unwrap()[..mb.blocks[1].indptr[1] as usize]
            .iter()
            .sum();
        assert_eq!(total, 4.0, "4 walks of one step from the hub");
        assert!(RandomWalkSampler::new(
            ds,
            RandomWalkConfig {
                stop_prob: 2.0,
                ..Default::default()
            }
        )
        .is_err());
    }
}
