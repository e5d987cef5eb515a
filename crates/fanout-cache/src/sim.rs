//! The cache simulator behind `fanout cache-sim`: sample the evaluated epoch once, keep only its
//! input-node sets ([`Trace`]), and score every (policy, ratio) on that trace by counting bytes
//! (no feature row is copied). Hit rate = bytes served from the cache / feature bytes needed
//! over all mini-batches of the epoch, input nodes counted once per mini-batch (NOTES.md).
//!
//! The evaluated epoch is `eval_epoch`; PreSC pre-samples epochs keyed apart from it
//! ([`crate::presc`]); the oracle is scored on the evaluated trace itself.

use crate::match_reorder::{match_stats, reorder_windows, MatchStats};
use crate::optimal::{hits, optimal_hits};
use crate::policy::{
    degree_ranking, degree_scores, positions, random_ranking, rank_by_scores, Policy,
};
use crate::presc::{presample_epoch, presc_order, PreSampled};
use crate::trace::Trace;
use fanout_graph::Result;
use fanout_sample::{LoaderConfig, Sampler};
use std::sync::Arc;

/// What to simulate.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Policies to score.
    pub policies: Vec<Policy>,
    /// Cache ratios alpha (cached rows / |V|).
    pub ratios: Vec<f64>,
    /// Also score Match (reuse of the previous batch) and Match + Greedy Reorder with each cache.
    pub match_reorder: bool,
    /// Reorder window in batches (0 = the whole epoch, as FastGL's artifact).
    pub window: usize,
    /// Seed of the random policy.
    pub seed: u64,
    /// The first evaluated epoch.
    pub eval_epoch: u64,
    /// Evaluated epochs (`eval_epoch..eval_epoch + eval_epochs`, at least 1). The oracle sees
    /// all of them (GNNLab's optimal is over the training run's footprints); hit rates are over
    /// all of them.
    pub eval_epochs: u64,
    /// Also compute GNNLab's Table 2 footprint similarity of epochs `eval_epoch` and
    /// `eval_epoch + 1`, and FastGL's match degree statistics of epoch `eval_epoch`.
    pub similarity: bool,
}

/// One (policy, ratio) cell. Byte counts are stored feature bytes; totals are over all
/// evaluated epochs, `*_per_epoch` fields are those totals divided by the epoch count.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SimRow {
    /// Policy name.
    pub policy: String,
    /// Requested ratio alpha.
    pub ratio: f64,
    /// Cached rows (`floor(alpha x |V|)`).
    pub cached_rows: usize,
    /// Evaluated epochs.
    pub epochs: u64,
    /// Bytes served from the cache / bytes needed, in 0..1.
    pub hit_rate: f64,
    /// Bytes the mini-batches need (input nodes x row bytes), total.
    pub bytes_needed: u64,
    /// Bytes served from the cache, total.
    pub bytes_from_cache: u64,
    /// Bytes gathered from the host store (needed - cache), total.
    pub bytes_from_host: u64,
    /// `bytes_from_host / epochs`.
    pub bytes_per_epoch: f64,
    /// The oracle's hit rate at the same ratio on the same trace.
    pub optimal_hit_rate: f64,
    /// `hit_rate / optimal_hit_rate` (1 when the oracle hits nothing).
    pub share_of_optimal: f64,
    /// Host bytes with the cache and Match, batches in sampled order, total (`match_reorder`).
    pub match_bytes_from_host: Option<u64>,
    /// Host bytes with the cache, Match and Greedy Reorder, total (`match_reorder`).
    pub mr_bytes_from_host: Option<u64>,
    /// `(bytes_from_host - mr_bytes_from_host) / epochs`: what Match-Reorder saves per epoch on
    /// top of the cache.
    pub mr_saved_bytes_per_epoch: Option<f64>,
}

/// GNNLab Table 2 similarity and FastGL match statistics of the evaluated epoch.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Similarity {
    /// sim(e -> e+1) over the top 10% of |V| by presence (visited vertices only).
    pub footprint_similarity: f64,
    /// Match degree statistics of the first evaluated epoch.
    pub matching: MatchStats,
}

/// The simulator's output.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SimReport {
    /// Vertices of the graph.
    pub num_nodes: usize,
    /// Bytes of one stored feature row.
    pub row_bytes: usize,
    /// Evaluated epochs.
    pub epochs: u64,
    /// Mini-batches per evaluated epoch (of the first one).
    pub batches: usize,
    /// Input nodes summed over the batches of the evaluated epochs, per epoch.
    pub rows_per_epoch: f64,
    /// Distinct vertices visited in the evaluated epochs.
    pub distinct_rows: usize,
    /// One row per (policy, ratio), policies in the given order, ratios within.
    pub rows: Vec<SimRow>,
    /// With `similarity`.
    pub similarity: Option<Similarity>,
}

/// Runs the simulation: one sampled trace of the evaluated epochs, PreSC's pre-sampling epochs
/// (shared: PreSC#2 reuses PreSC#1's epoch), then byte counts per (policy, ratio).
/// `row_bytes` is the stored row size (features need not be present: nothing is read).
/// Guarantees: deterministic for fixed inputs; the oracle's hit rate is >= every policy's.
pub fn simulate(
    sampler: Arc<dyn Sampler>,
    seeds: &[u32],
    loader: &LoaderConfig,
    row_bytes: usize,
    cfg: &SimConfig,
) -> Result<SimReport> {
    let ds = sampler.dataset().clone();
    let n = ds.num_nodes() as usize;
    let epochs = cfg.eval_epochs.max(1);
    let trace = Trace::record_epochs(sampler.clone(), seeds, loader, cfg.eval_epoch, epochs)?;
    let counts = trace.presence_counts();
    let rb = row_bytes as u64;
    let needed = trace.total_rows() * rb;
    let budgets: Vec<usize> = cfg
        .ratios
        .iter()
        .map(|&a| crate::CacheSize::Ratio(a).rows(n, row_bytes))
        .collect();
    let opt = optimal_hits(&counts, &budgets);
    let orders = cfg.match_reorder.then(|| {
        let sets = trace.batches();
        let mut reordered = Vec::with_capacity(sets.len());
        for e in 0..trace.num_epochs() {
            let r = trace.epoch_range(e);
            let o = reorder_windows(&sets[r.clone()], cfg.window, n);
            reordered.extend(o.into_iter().map(|i| r.start + i));
        }
        ((0..sets.len()).collect::<Vec<usize>>(), reordered)
    });
    let mut presc_epochs: Vec<PreSampled> = Vec::new();
    let mut degrees: Option<Vec<u64>> = None;
    let mut rows = Vec::new();
    let per_epoch = |b: u64| b as f64 / epochs as f64;
    for &p in &cfg.policies {
        let ranking = match p {
            Policy::Random => random_ranking(n, cfg.seed),
            Policy::Degree => degree_ranking(&ds.topology),
            Policy::Optimal => rank_by_scores(&counts),
            Policy::PreSC(k) => {
                while presc_epochs.len() < k as usize {
                    let i = presc_epochs.len() as u64;
                    presc_epochs.push(presample_epoch(&sampler, seeds, loader, i)?);
                }
                let mut acc = presc_epochs[0].clone();
                for e in &presc_epochs[1..k as usize] {
                    acc.add(e);
                }
                presc_order(
                    &acc,
                    degrees.get_or_insert_with(|| degree_scores(&ds.topology)),
                )
            }
        };
        let pos = cfg.match_reorder.then(|| positions(&ranking));
        for (i, (&ratio, &r)) in cfg.ratios.iter().zip(&budgets).enumerate() {
            let h = hits(&counts, &ranking, r) * rb;
            let o = opt[i] * rb;
            let rate = |b: u64| {
                if needed == 0 {
                    0.0
                } else {
                    b as f64 / needed as f64
                }
            };
            let (mut m, mut mr) = (None, None);
            if let (Some(pos), Some((ident, reordered))) = (&pos, &orders) {
                m = Some(match_host_rows(&trace, ident, pos, r) * rb);
                mr = Some(match_host_rows(&trace, reordered, pos, r) * rb);
            }
            rows.push(SimRow {
                policy: p.to_string(),
                ratio,
                cached_rows: r,
                epochs,
                hit_rate: rate(h),
                bytes_needed: needed,
                bytes_from_cache: h,
                bytes_from_host: needed - h,
                bytes_per_epoch: per_epoch(needed - h),
                optimal_hit_rate: rate(o),
                share_of_optimal: if o == 0 { 1.0 } else { h as f64 / o as f64 },
                match_bytes_from_host: m,
                mr_bytes_from_host: mr,
                mr_saved_bytes_per_epoch: mr.map(|x| per_epoch(needed - h - x)),
            });
        }
    }
    let similarity = if cfg.similarity {
        let first = trace.epoch_presence_counts(0);
        let next = if trace.num_epochs() > 1 {
            trace.epoch_presence_counts(1)
        } else {
            Trace::record(sampler.clone(), seeds, loader, cfg.eval_epoch + 1)?.presence_counts()
        };
        let sets = trace.batches();
        Some(Similarity {
            footprint_similarity: footprint_similarity(&first, &next, 0.1),
            matching: match_stats(&sets[trace.epoch_range(0)], n),
        })
    } else {
        None
    };
    Ok(SimReport {
        num_nodes: n,
        row_bytes,
        epochs,
        batches: trace.epoch_range(0).len(),
        rows_per_epoch: trace.total_rows() as f64 / epochs as f64,
        distinct_rows: counts.iter().filter(|&&c| c > 0).count(),
        rows,
        similarity,
    })
}

/// Rows gathered from the host when batches run in `order` with a cache holding the vertices
/// with `pos < cached` and Match reusing the previous batch's (non-cached) rows (across epoch
/// boundaries too: the last batch of an epoch is still on the device).
pub fn match_host_rows(trace: &Trace, order: &[usize], pos: &[u32], cached: usize) -> u64 {
    let mut stamp = vec![0u32; trace.num_nodes];
    let mut host = 0u64;
    for (t, &b) in order.iter().enumerate() {
        let cur = t as u32 + 1;
        for &v in trace.batch(b) {
            let v = v as usize;
            if (pos[v] as usize) >= cached && (t == 0 || stamp[v] != cur - 1) {
                host += 1;
            }
        }
        for &v in trace.batch(b) {
            stamp[v as usize] = cur;
        }
    }
    host
}

/// GNNLab Table 2: `sim(i -> j) = sum over T_i ∩ T_j of min(f_i, f_j) / sum over T_j of f_j`,
/// where `T` is the top `frac` of |V| by frequency (visited vertices only, ties larger id
/// first). 0 when epoch j visits nothing.
pub fn footprint_similarity(f_i: &[u32], f_j: &[u32], frac: f64) -> f64 {
    let k = (frac * f_i.len() as f64).ceil() as usize;
    let top = |f: &[u32]| -> Vec<u32> {
        rank_by_scores(f)
            .into_iter()
            .take(k)
            .take_while(|&v| f[v as usize] > 0)
            .collect()
    };
    let (ti, tj) = (top(f_i), top(f_j));
    let mut in_i = vec![false; f_i.len()];
    for &v in &ti {
        in_i[v as usize] = true;
    }
    let den: u64 = tj.iter().map(|&v| f_j[v as usize] as u64).sum();
    let num: u64 = tj
        .iter()
        .filter(|&&v| in_i[v as usize])
        .map(|&v| f_i[v as usize].min(f_j[v as usize]) as u64)
        .sum();
    if den == 0 {
        0.0
    } else {
        num as f64 / den as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn match_counts_reuse_of_the_previous_batch_only() {
        let t = Trace::from_batches(6, &[vec![0u32, 1, 2], vec![1, 2, 3], vec![0, 4]]);
        let none = vec![u32::MAX; 6];
        // Batch 1 reuses 1, 2; batch 2 reuses nothing (0 was two batches ago).
        assert_eq!(match_host_rows(&t, &[0, 1, 2], &none, 0), 3 + 1 + 2);
        // With vertex 0 cached: 2 + 1 + 1.
        let mut pos = none.clone();
        pos[0] = 0;
        assert_eq!(match_host_rows(&t, &[0, 1, 2], &pos, 1), 2 + 1 + 1);
        assert_eq!(match_host_rows(&t, &[0, 2, 1], &none, 0), 3 + 1 + 3);
    }

    #[test]
    fn similarity_of_equal_and_disjoint_footprints() {
        let f = vec![5u32, 4, 3, 2, 1, 0, 0, 0, 0, 0];
        assert_eq!(footprint_similarity(&f, &f, 0.2), 1.0);
        let g = vec![0u32, 0, 0, 0, 0, 0, 0, 0, 3, 3];
        assert_eq!(footprint_similarity(&f, &g, 0.2), 0.0);
        let h = vec![2u32, 4, 0, 0, 0, 0, 0, 0, 0, 0];
        // T_i = {0, 1}, T_j = {1, 0}: (min(5,2) + min(4,4)) / 6.
        assert!((footprint_similarity(&f, &h, 0.2) - 1.0).abs() < 1e-12);
        assert!((footprint_similarity(&h, &f, 0.2) - 6.0 / 9.0).abs() < 1e-12);
    }
}
