//! Layer-wise importance sampling (LADIES style; FastGCN's fixed layer size, as PaGraph
//! evaluates with 2,400 vertices per layer).
//!
//! Hop `h` draws at most `layer_sizes[h]` vertices for the whole layer instead of a fanout per
//! vertex. Candidates are the stored-row neighbours of the current frontier (all vertices
//! gathered so far); candidate `u` has importance `q(u) = sum over frontier vertices v with u in
//! row(v) of (1 / deg v)^2`, the squared column norm of the row-normalised adjacency restricted
//! to the frontier. `s` candidates are drawn without replacement in proportion to `q`
//! (successive sampling via Efraimidis-Spirakis keys `ln(U_u) / q(u)`, one independent uniform
//! per candidate, so the draw is parallel and deterministic). Each frontier vertex then keeps
//! every arc from a drawn vertex, with weight `(1 / deg v) / pi(u)`, where `pi(u) =
//! min(1, s * p(u))`, `p = q / sum q`, approximates `u`'s chance of being drawn: the
//! importance-sampling estimate of row-normalised aggregation. When the layer holds every
//! candidate (no more of them than `s`), nothing is sampled, `pi = 1`, and the weights are
//! exactly the row-normalised `1 / deg v`.
//!
//! Unlike the per-vertex samplers, work is proportional to the frontier's total degree (LADIES
//! needs every candidate's importance), plus a sort of the (candidate, frontier) pairs.

use crate::graph::{check_dataset, hop_stream, par_collect, tag, vertex_rng, vid, Csr, CsrJob};
use crate::minibatch::{BatchKey, MiniBatch};
use crate::remap::RemapKind;
use crate::resident::Residency;
use crate::sampler::{Driver, HopEdges, Sampler};
use fanout_graph::{Dataset, Error, Offset, Result, VertexId};
use rayon::prelude::*;
use std::sync::Arc;

/// Configuration of [`LayerwiseSampler`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LayerwiseConfig {
    /// Vertices drawn per layer, in hop order from the seeds.
    pub layer_sizes: Vec<u32>,
    /// Remapping table.
    pub remap: RemapKind,
}

/// Layer-wise sampler. Guarantees (beyond [`Sampler`]'s): hop `h` adds at most
/// `layer_sizes[h]` new vertices; every block edge is a stored arc whose source is one of the
/// vertices drawn for that layer, and each destination keeps all its arcs from drawn vertices;
/// block weights are the importance coefficients described in the module docs.
pub struct LayerwiseSampler {
    cfg: LayerwiseConfig,
    driver: Driver,
}

impl LayerwiseSampler {
    /// A sampler over `ds`. Errors on an empty layer list or a zero layer size.
    pub fn new(ds: Arc<Dataset>, cfg: LayerwiseConfig) -> Result<Self> {
        check_dataset(&ds)?;
        if cfg.layer_sizes.is_empty() || cfg.layer_sizes.contains(&0) {
            return Err(Error::Invalid(
                "layer-wise sampling needs at least one layer and layer sizes >= 1".into(),
            ));
        }
        Ok(LayerwiseSampler {
            driver: Driver::new(ds, cfg.remap, 2.0),
            cfg,
        })
    }
}

impl LayerwiseSampler {
    /// Reads rows as `r` says ([`Residency::Auto`] by default): a resident huge-page copy of
    /// the topology, or the memory-mapped files.
    pub fn with_residency(mut self, r: Residency) -> Self {
        self.driver.set_residency(r);
        self
    }
}

impl Sampler for LayerwiseSampler {
    fn sample(&self, seeds: &[u32], key: BatchKey) -> Result<MiniBatch> {
        let rows = &self.driver.rows;
        self.driver
            .run(seeds, key, self.cfg.layer_sizes.len(), |h, frontier| {
                rows.run(LayerHop {
                    frontier,
                    size: self.cfg.layer_sizes[h] as usize,
                    base: hop_stream(&key, tag::LAYER, h),
                })
            })
    }
    fn num_layers(&self) -> usize {
        self.cfg.layer_sizes.len()
    }
    fn dataset(&self) -> &Arc<Dataset> {
        &self.driver.ds
    }
    fn is_resident(&self) -> bool {
        self.driver.rows.is_resident()
    }
    fn name(&self) -> &'static str {
        "layerwise"
    }
}

struct LayerHop<'a> {
    frontier: &'a [u32],
    size: usize,
    base: u64,
}

impl CsrJob for LayerHop<'_> {
    type Out = HopEdges;
    fn run<O: Offset, I: VertexId>(self, g: Csr<'_, O, I>) -> HopEdges {
        let frontier = self.frontier;
        // (candidate << 32 | frontier position) for every arc into the frontier, sorted.
        let mut pairs: Vec<u64> = frontier
            .par_iter()
            .enumerate()
            .flat_map_iter(|(i, &v)| {
                g.row(v)
                    .iter()
                    .map(move |&u| ((vid(u) as u64) << 32) | i as u64)
            })
            .collect();
        pairs.par_sort_unstable();
        let inv_deg = |i: usize| 1.0 / g.degree(frontier[i]) as f64;
        // Candidates with their importance, by increasing id.
        let cands: Vec<(u32, f64)> = pairs
            .par_chunk_by(|a, b| a >> 32 == b >> 32)
            .map(|run| {
                let q = run
                    .iter()
                    .map(|&p| inv_deg(p as u32 as usize).powi(2))
                    .sum();
                ((run[0] >> 32) as u32, q)
            })
            .collect();
        drop(pairs);
        let total_q: f64 = cands.iter().map(|c| c.1).sum();
        // Every candidate fits in the layer: each is kept for certain.
        let all = cands.len() <= self.size;
        // Draw: the `size` largest keys ln(U) / q (ties by id, for determinism).
        let mut chosen: Vec<(u32, f64)> = if all {
            cands
        } else {
            let mut keyed: Vec<(f64, u32, f64)> = cands
                .par_iter()
                .map(|&(u, q)| {
                    let unif = 1.0 - vertex_rng(self.base, u).next_f64();
                    (unif.ln() / q, u, q)
                })
                .collect();
            keyed.select_nth_unstable_by(self.size - 1, |a, b| {
                b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
            });
            keyed.truncate(self.size);
            keyed.into_iter().map(|(_, u, q)| (u, q)).collect()
        };
        chosen.sort_unstable_by_key(|c| c.0);
        let s = chosen.len() as f64;
        let (indptr, ids, weights) = par_collect(frontier.len(), true, |i, ids, ws| {
            let inv = inv_deg(i);
            for &u in g.row(frontier[i]) {
                let u = vid(u);
                if let Ok(j) = chosen.binary_search_by_key(&u, |c| c.0) {
                    let pi = if all {
                        1.0
                    } else {
                        (s * chosen[j].1 / total_q).min(1.0)
                    };
                    ids.push(u);
                    ws.push((inv / pi) as f32);
                }
            }
        });
        HopEdges {
            indptr,
            ids,
            weights: Some(weights),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;
    use fanout_graph::Layout;
    use std::collections::{HashMap, HashSet};

    fn sampler(ds: &Arc<Dataset>, sizes: &[u32]) -> LayerwiseSampler {
        let cfg = LayerwiseConfig {
            layer_sizes: sizes.to_vec(),
            remap: RemapKind::Auto,
        };
        LayerwiseSampler::new(ds.clone(), cfg).unwrap()
    }

    #[test]
    fn layers_bounded_edges_are_all_arcs_from_drawn_vertices() {
        let ds = random_graph(4000, 300, 21);
        let arcs = arc_set(&ds);
        let s = sampler(&ds, &[100, 200]);
        let seeds: Vec<u32> = (0..60).map(|i| i * 31).collect();
        let key = BatchKey {
            seed: 1,
            epoch: 0,
            step: 3,
        };
        let mb = s.sample(&seeds, key).unwrap();
        mb.validate().unwrap();
        assert_edges_exist(&mb, &arcs);
        let sizes = mb.layer_sizes();
        assert!(
            sizes[1] - sizes[0] <= 100 && sizes[2] - sizes[1] <= 200,
            "{sizes:?}"
        );
        for b in &mb.blocks {
            // The drawn set is every source that received an edge; each destination keeps all
            // of its arcs from that set.
            let drawn: HashSet<u32> = b
                .indices
                .iter()
                .map(|&l| mb.input_nodes[l as usize])
                .collect();
            for d in 0..b.num_dst {
                let v = mb.input_nodes[d];
                let mut want: Vec<u32> = ds
                    .topology
                    .row(v as u64)
                    .iter()
                    .map(|u| u as u32)
                    .filter(|u| drawn.contains(u))
                    .collect();
                let mut got: Vec<u32> = b
                    .row(d)
                    .iter()
                    .map(|&l| mb.input_nodes[l as usize])
                    .collect();
                want.sort_unstable();
                got.sort_unstable();
                assert_eq!(got, want);
            }
            assert!(b
                .weights
                .as_ref()
                .unwrap()
                .iter()
                .all(|w| w.is_finite() && *w > 0.0));
        }
        let other = pool(3).install(|| s.sample(&seeds, key).unwrap());
        assert_eq!(other, mb);
    }

    #[test]
    fn a_layer_holding_every_candidate_weighs_rows_exactly() {
        // Layers larger than any frontier's candidates: nothing is sampled, every arc is kept
        // and weighted 1 / deg v, so each destination's weights sum to 1.
        let ds = random_graph(400, 8, 5);
        let s = sampler(&ds, &[1_000_000, 1_000_000]);
        let seeds: Vec<u32> = (0..10).map(|i| i * 7).collect();
        let key = BatchKey {
            seed: 2,
            epoch: 0,
            step: 0,
        };
        let mb = s.sample(&seeds, key).unwrap();
        for b in &mb.blocks {
            let w = b.weights.as_ref().unwrap();
            for d in 0..b.indptr.len() - 1 {
                let r = b.indptr[d] as usize..b.indptr[d + 1] as usize;
                if r.is_empty() {
                    continue;
                }
                let sum: f32 = w[r].iter().sum();
                assert!((sum - 1.0).abs() < 1e-5, "destination {d}: {sum}");
            }
        }
    }

    #[test]
    fn draws_follow_importance() {
        // Seed 0 has one in-neighbour (1): q = 1. Seed 2 has ten (10..20): q = 1/100 each.
        // With one vertex per layer, P(1) = 1 / 1.1 and P(each other) = 0.01 / 1.1.
        let mut arcs = vec![(1u64, 0u64)];
        arcs.extend((10..20).map(|u| (u, 2)));
        let ds = dataset(&arcs, 20, Layout::Csc);
        let s = sampler(&ds, &[1]);
        let mut counts: HashMap<u32, u64> = HashMap::new();
        let trials = 4_000;
        for t in 0..trials {
            let mb = s
                .sample(
                    &[0, 2],
                    BatchKey {
                        seed: 0,
                        epoch: 0,
                        step: t,
                    },
                )
                .unwrap();
            assert_eq!(mb.input_nodes.len(), 3);
            *counts.entry(mb.input_nodes[2]).or_default() += 1;
        }
        let ids: Vec<u32> = std::iter::once(1).chain(10..20).collect();
        let obs: Vec<u64> = ids
            .iter()
            .map(|u| counts.get(u).copied().unwrap_or(0))
            .collect();
        let exp: Vec<f64> = ids
            .iter()
            .map(|&u| trials as f64 * if u == 1 { 1.0 } else { 0.01 } / 1.1)
            .collect();
        let x = chi2(&obs, &exp);
        assert!(x < chi2_critical(10), "chi2 {x} {obs:?}");
        // A uniform draw over the 11 candidates would fail the same test.
        let uniform: Vec<u64> = vec![trials / 11; 11];
        assert!(chi2(&uniform, &exp) > chi2_critical(10));
    }
}
