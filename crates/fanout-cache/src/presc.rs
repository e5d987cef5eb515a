//! GNNLab's pre-sampling based cache policy (PreSC#K): run K sampling-only epochs, count for
//! each vertex the number of mini-batches whose input nodes contain it, and cache the top
//! alpha x |V|.
//!
//! Ties: by the expected number of times the vertex is drawn given the pre-sampled batches'
//! expansions (each destination that drew `k` edges from a stored row of length `deg` gives
//! `k / deg` to every vertex of that row), then by degree in the sampling direction (the
//! degree policy's score), then larger id first. The artifact breaks ties by id alone; that
//! matters when an epoch has few mini-batches, where the counts are 0..K x batches and most
//! visited vertices tie, and when the cache holds more vertices than were pre-sampled at all.
//! The expected draw count is the draw count averaged over the sampler's choices at the
//! expanded vertices (exact for uniform sampling without replacement, a uniform spread for the
//! others): lower variance than the draws themselves, and it also ranks the neighbours that
//! were not drawn. A vertex expected to be drawn m times in an epoch is absent from it with
//! probability about e^-m, so among equal presence counts the larger m is the likelier hit;
//! it comes free with the pre-sampled batches, unlike more pre-sampling epochs
//! (docs/caching.md measures each rule).
//!
//! Pre-sampling epochs are numbered from [`PRESAMPLE_EPOCH_BASE`], so their shuffles and
//! sampling keys differ from every training epoch's (NOTES.md: PreSC is evaluated on a
//! different epoch than the one it pre-sampled).

use crate::policy::{degree_scores, rank_by_scores_then};
use fanout_graph::{Error, Result};
use fanout_sample::{Loader, LoaderConfig, Sampler};
use std::sync::Arc;

/// Epoch number of the first pre-sampling epoch (2^48: no training run gets there).
pub const PRESAMPLE_EPOCH_BASE: u64 = 1 << 48;

/// What pre-sampling records per vertex (indexed by global id).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PreSampled {
    /// Mini-batches whose input nodes contain the vertex (PreSC's hotness).
    pub presence: Vec<u32>,
    /// Expected draws given the expansions (module docs): the tie-break among equal presence.
    pub draws: Vec<f64>,
}

impl PreSampled {
    /// Adds `other`'s counts (presence saturating).
    pub fn add(&mut self, other: &PreSampled) {
        for (a, b) in self.presence.iter_mut().zip(&other.presence) {
            *a = a.saturating_add(*b);
        }
        for (a, b) in self.draws.iter_mut().zip(&other.draws) {
            *a += b;
        }
    }

    /// The primary ranking key: presence in the high 32 bits, the bits of the expected draws
    /// as a non-negative f32 in the low 32 (those order as the numbers do).
    pub fn keys(&self) -> Vec<u64> {
        self.presence
            .iter()
            .zip(&self.draws)
            .map(|(&p, &d)| (p as u64) << 32 | (d.max(0.0) as f32).to_bits() as u64)
            .collect()
    }
}

/// Counts of pre-sampling epoch `i` (epoch [`PRESAMPLE_EPOCH_BASE`]` + i`) alone.
/// Deterministic: a pure function of the graph, sampler configuration, `seeds`, `cfg.seed`,
/// `cfg.batch_size`/`shuffle`/`drop_last` and `i`.
pub fn presample_epoch(
    sampler: &Arc<dyn Sampler>,
    seeds: &[u32],
    cfg: &LoaderConfig,
    i: u64,
) -> Result<PreSampled> {
    let topology = &sampler.dataset().topology;
    let n = topology.num_nodes() as usize;
    let mut out = PreSampled {
        presence: vec![0; n],
        draws: vec![0.0; n],
    };
    let loader = Loader::new(sampler.clone(), seeds.to_vec(), cfg.clone())?;
    for mb in loader.epoch(PRESAMPLE_EPOCH_BASE + i) {
        let mb = mb?;
        // Input nodes are distinct within a batch (MiniBatch guarantees it).
        for &v in &mb.input_nodes {
            out.presence[v as usize] += 1;
        }
        // Destinations are local ids 0..num_dst of every block, i.e. input_nodes[..num_dst].
        for b in &mb.blocks {
            for (d, &u) in mb.input_nodes[..b.num_dst].iter().enumerate() {
                let k = b.row(d).len();
                let row = topology.row(u as u64);
                if k == 0 || row.is_empty() {
                    continue;
                }
                let share = k as f64 / row.len() as f64;
                for v in row.iter() {
                    out.draws[v as usize] += share;
                }
            }
        }
    }
    Ok(out)
}

/// PreSC#K's counts summed over pre-sampling epochs `0..k` (presence is the average count
/// times K, the same order). Errors when `k == 0` or sampling fails.
pub fn presample_counts(
    sampler: &Arc<dyn Sampler>,
    seeds: &[u32],
    cfg: &LoaderConfig,
    k: u32,
) -> Result<PreSampled> {
    if k == 0 {
        return Err(Error::Invalid(
            "PreSC needs at least one pre-sampling epoch".into(),
        ));
    }
    let mut acc = presample_epoch(sampler, seeds, cfg, 0)?;
    for i in 1..k as u64 {
        acc.add(&presample_epoch(sampler, seeds, cfg, i)?);
    }
    Ok(acc)
}

/// PreSC#K's order of all vertices, hottest first (see [`presc_order`]).
pub fn presc_ranking(
    sampler: &Arc<dyn Sampler>,
    seeds: &[u32],
    cfg: &LoaderConfig,
    k: u32,
) -> Result<Vec<u32>> {
    let counts = presample_counts(sampler, seeds, cfg, k)?;
    Ok(presc_order(
        &counts,
        &degree_scores(&sampler.dataset().topology),
    ))
}

/// PreSC's order from pre-sampled `counts` and the degree policy's scores `degrees`:
/// decreasing presence, ties by decreasing expected draws, then decreasing degree, then
/// larger id.
pub fn presc_order(counts: &PreSampled, degrees: &[u64]) -> Vec<u32> {
    rank_by_scores_then(&counts.keys(), degrees)
}
