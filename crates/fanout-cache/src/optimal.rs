//! The optimal static cache (GNNLab footnote 4, PaGraph): the vertices the *evaluated* trace
//! visits most, scored on that same trace. An oracle for evaluation only: it needs the future.
//!
//! Hits of a static cache on a trace are the sum, over cached vertices, of their presence
//! counts; the top counts therefore maximise hits for any row budget, so no static policy can
//! beat this one on the same trace.

use crate::policy::rank_by_scores;
use crate::trace::Trace;

/// The oracle's order: vertices by decreasing presence in `trace` (ties larger id first).
pub fn optimal_ranking(trace: &Trace) -> Vec<u32> {
    rank_by_scores(&trace.presence_counts())
}

/// Cached-row hits (row count, not bytes) of the cache holding `ranking[..rows]` on a trace
/// with these presence counts: `sum(counts[ranking[i]] for i < rows)`.
pub fn hits(counts: &[u32], ranking: &[u32], rows: usize) -> u64 {
    ranking[..rows.min(ranking.len())]
        .iter()
        .map(|&v| counts[v as usize] as u64)
        .sum()
}

/// The oracle's hits for every budget in `rows` at once (one sort of the counts).
pub fn optimal_hits(counts: &[u32], rows: &[usize]) -> Vec<u64> {
    let mut c: Vec<u32> = counts.iter().copied().filter(|&x| x > 0).collect();
    c.sort_unstable_by(|a, b| b.cmp(a));
    let mut prefix = Vec::with_capacity(c.len() + 1);
    prefix.push(0u64);
    for &x in &c {
        prefix.push(prefix.last().unwrap() + x as u64);
    }
    rows.iter().map(|&r| prefix[r.min(c.len())]).collect()
}
