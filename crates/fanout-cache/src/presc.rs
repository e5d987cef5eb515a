//! GNNLab's pre-sampling based cache policy (PreSC#K): run K sampling-only epochs, count for
//! each vertex the number of mini-batches whose input nodes contain it, and cache the top
//! alpha x |V|.
//!
//! Ties: by degree in the sampling direction (the degree policy's score), then larger id
//! first. The artifact breaks ties by id alone; that matters when an epoch has few
//! mini-batches, where the counts are 0..K x batches and most visited vertices tie: among
//! vertices pre-sampled equally often, the one that more sampled rows list is the likelier to
//! be drawn again (docs/caching.md measures both rules).
//!
//! Pre-sampling epochs are numbered from [`PRESAMPLE_EPOCH_BASE`], so their shuffles and
//! sampling keys differ from every training epoch's (NOTES.md: PreSC is evaluated on a
//! different epoch than the one it pre-sampled).

use crate::policy::{degree_scores, rank_by_scores_then};
use crate::trace::Trace;
use fanout_graph::{Error, Result};
use fanout_sample::{LoaderConfig, Sampler};
use std::sync::Arc;

/// Epoch number of the first pre-sampling epoch (2^48: no training run gets there).
pub const PRESAMPLE_EPOCH_BASE: u64 = 1 << 48;

/// Presence counts of pre-sampling epoch `i` (epoch [`PRESAMPLE_EPOCH_BASE`]` + i`) alone.
/// Deterministic: a pure function of the graph, sampler configuration, `seeds`, `cfg.seed`,
/// `cfg.batch_size`/`shuffle`/`drop_last` and `i`.
pub fn presample_epoch(
    sampler: &Arc<dyn Sampler>,
    seeds: &[u32],
    cfg: &LoaderConfig,
    i: u64,
) -> Result<Vec<u32>> {
    Ok(Trace::record(sampler.clone(), seeds, cfg, PRESAMPLE_EPOCH_BASE + i)?.presence_counts())
}

/// PreSC#K hotness: presence counts summed over pre-sampling epochs `0..k` (the average count
/// times K, the same order). Errors when `k == 0` or sampling fails.
pub fn presample_counts(
    sampler: &Arc<dyn Sampler>,
    seeds: &[u32],
    cfg: &LoaderConfig,
    k: u32,
) -> Result<Vec<u32>> {
    if k == 0 {
        return Err(Error::Invalid(
            "PreSC needs at least one pre-sampling epoch".into(),
        ));
    }
    let mut acc = presample_epoch(sampler, seeds, cfg, 0)?;
    for i in 1..k as u64 {
        let c = presample_epoch(sampler, seeds, cfg, i)?;
        acc.iter_mut().zip(c).for_each(|(a, b)| *a += b);
    }
    Ok(acc)
}

/// PreSC#K's order of all vertices, hottest first (ties by sampling-direction degree, then
/// larger id first).
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

/// PreSC's order from pre-sampling `counts` and the degree policy's scores `degrees`:
/// decreasing count, ties by decreasing degree, then larger id first.
pub fn presc_order(counts: &[u32], degrees: &[u64]) -> Vec<u32> {
    rank_by_scores_then(counts, degrees)
}
