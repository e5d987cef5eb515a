//! FastGL Match-Reorder. **Match**: before loading batch t, reuse the rows of batch t-1
//! already on the device and load only the new ones (done by
//! [`crate::CachedExtractor`] with `match_previous`). **Reorder** (Algorithm 1, with the
//! NOTES.md fixes): in a window of sampled batches, start at the window's first batch and
//! repeatedly take the unused batch with the largest match degree
//! `M_ij = |S_i ∩ S_j| / min(|S_i|, |S_j|)` to the current one; an explicit used mask, zero
//! diagonal, ties to the lowest index.
//!
//! Cost: the pairwise intersections take O(n x rows in the window) membership tests plus one
//! |V|-bit set per worker; the artifact's window is the whole epoch.

use fanout_sample::MiniBatch;
use rayon::prelude::*;

/// Pairwise intersection sizes `|S_i ∩ S_j|` of duplicate-free vertex sets (ids below
/// `num_nodes`), as a symmetric `n x n` row-major matrix with a zero diagonal.
pub fn intersections(sets: &[&[u32]], num_nodes: usize) -> Vec<u64> {
    let n = sets.len();
    let words = num_nodes.div_ceil(64);
    let rows: Vec<Vec<u64>> = (0..n)
        .into_par_iter()
        .map_init(
            || vec![0u64; words],
            |bits, i| {
                for &v in sets[i] {
                    bits[v as usize / 64] |= 1 << (v % 64);
                }
                let row = (0..n)
                    .map(|j| {
                        if j <= i {
                            0
                        } else {
                            sets[j]
                                .iter()
                                .filter(|&&v| bits[v as usize / 64] >> (v % 64) & 1 == 1)
                                .count() as u64
                        }
                    })
                    .collect();
                for &v in sets[i] {
                    bits[v as usize / 64] = 0;
                }
                row
            },
        )
        .collect();
    let mut m = vec![0u64; n * n];
    for i in 0..n {
        for j in i + 1..n {
            m[i * n + j] = rows[i][j];
            m[j * n + i] = rows[i][j];
        }
    }
    m
}

/// FastGL's match degree `|S_i ∩ S_j| / min(|S_i|, |S_j|)`, 0 when a set is empty.
pub fn match_degree(inter: u64, len_i: usize, len_j: usize) -> f64 {
    let m = len_i.min(len_j);
    if m == 0 {
        0.0
    } else {
        inter as f64 / m as f64
    }
}

/// Rows reused when the batches run in `order`: `sum_t |S_order[t] ∩ S_order[t-1]|` from the
/// pairwise intersections `inter` (as from [`intersections`]).
pub fn chain_overlap(inter: &[u64], n: usize, order: &[usize]) -> u64 {
    order.windows(2).map(|w| inter[w[0] * n + w[1]]).sum()
}

/// Greedy Reorder of one window (Algorithm 1 with the NOTES.md fixes). Guarantees: returns a
/// permutation of `0..sets.len()` starting at 0, and the rows it lets Match reuse
/// ([`chain_overlap`]) are never fewer than the identity order's: where the greedy chain would
/// reuse fewer rows (possible, greedy is not optimal), the identity order is returned.
pub fn greedy_reorder(sets: &[&[u32]], num_nodes: usize) -> Vec<usize> {
    let n = sets.len();
    if n <= 2 {
        return (0..n).collect();
    }
    let inter = intersections(sets, num_nodes);
    let m = |i: usize, j: usize| match_degree(inter[i * n + j], sets[i].len(), sets[j].len());
    let mut used = vec![false; n];
    let mut order = Vec::with_capacity(n);
    let mut cur = 0;
    used[0] = true;
    order.push(0);
    for _ in 1..n {
        let mut best: Option<(usize, f64)> = None;
        for j in 0..n {
            if used[j] {
                continue;
            }
            let d = m(cur, j);
            let better = match best {
                None => true,
                Some((_, b)) => d > b,
            };
            if better {
                best = Some((j, d));
            }
        }
        let (j, _) = best.expect("an unused batch remains");
        used[j] = true;
        order.push(j);
        cur = j;
    }
    let identity: Vec<usize> = (0..n).collect();
    if chain_overlap(&inter, n, &order) < chain_overlap(&inter, n, &identity) {
        identity
    } else {
        order
    }
}

/// Greedy Reorder applied window by window (`window` batches each; 0 = the whole list): the
/// returned order is a permutation of `0..sets.len()` that keeps every window's batches
/// together and in window order.
pub fn reorder_windows(sets: &[&[u32]], window: usize, num_nodes: usize) -> Vec<usize> {
    let w = if window == 0 {
        sets.len().max(1)
    } else {
        window
    };
    let mut order = Vec::with_capacity(sets.len());
    for (k, chunk) in sets.chunks(w).enumerate() {
        order.extend(
            greedy_reorder(chunk, num_nodes)
                .into_iter()
                .map(|i| k * w + i),
        );
    }
    order
}

/// Reorders a window of sampled mini-batches for training ([`greedy_reorder`] on their input
/// nodes). The batches themselves are untouched; only their order changes.
pub fn reorder_batches(batches: Vec<MiniBatch>, num_nodes: usize) -> Vec<MiniBatch> {
    let order = {
        let sets: Vec<&[u32]> = batches.iter().map(|b| b.input_nodes.as_slice()).collect();
        greedy_reorder(&sets, num_nodes)
    };
    let mut slots: Vec<Option<MiniBatch>> = batches.into_iter().map(Some).collect();
    order
        .into_iter()
        .map(|i| slots[i].take().expect("a permutation"))
        .collect()
}

/// FastGL Table 4 statistics of one epoch: match degrees over all pairs of batches, and over
/// consecutive batches in the sampled and in the reordered order.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct MatchStats {
    /// Batches in the epoch.
    pub batches: usize,
    /// Mean `M_ij` over all pairs `i < j` (0 with fewer than 2 batches).
    pub avg_m: f64,
    /// Smallest and largest `M_ij` over the pairs; `delta_m = max_m - min_m` (FastGL's ΔM).
    pub min_m: f64,
    /// Largest `M_ij` over the pairs.
    pub max_m: f64,
    /// `max_m - min_m`.
    pub delta_m: f64,
    /// Standard deviation of `M_ij` over the pairs.
    pub std_m: f64,
    /// Mean `M` between consecutive batches in sampled order.
    pub avg_adjacent_m: f64,
    /// Mean `M` between consecutive batches after Greedy Reorder of the whole epoch.
    pub avg_adjacent_m_reordered: f64,
}

/// Match statistics of `sets` (one epoch's input-node sets in sampled order).
pub fn match_stats(sets: &[&[u32]], num_nodes: usize) -> MatchStats {
    let n = sets.len();
    let mut s = MatchStats {
        batches: n,
        ..Default::default()
    };
    if n < 2 {
        return s;
    }
    let inter = intersections(sets, num_nodes);
    let m = |i: usize, j: usize| match_degree(inter[i * n + j], sets[i].len(), sets[j].len());
    let all: Vec<f64> = (0..n)
        .flat_map(|i| (i + 1..n).map(move |j| (i, j)))
        .map(|(i, j)| m(i, j))
        .collect();
    let k = all.len() as f64;
    s.avg_m = all.iter().sum::<f64>() / k;
    s.min_m = all.iter().copied().fold(f64::INFINITY, f64::min);
    s.max_m = all.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    s.delta_m = s.max_m - s.min_m;
    s.std_m = (all.iter().map(|x| (x - s.avg_m).powi(2)).sum::<f64>() / k).sqrt();
    let adj =
        |order: &[usize]| order.windows(2).map(|w| m(w[0], w[1])).sum::<f64>() / (n - 1) as f64;
    s.avg_adjacent_m = adj(&(0..n).collect::<Vec<_>>());
    s.avg_adjacent_m_reordered = adj(&greedy_reorder(sets, num_nodes));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_perm(o: &[usize], n: usize) -> bool {
        let mut s = o.to_vec();
        s.sort_unstable();
        s == (0..n).collect::<Vec<_>>()
    }

    #[test]
    fn greedy_follows_the_largest_match() {
        // FastGL Fig. 6: m13 > m12, so batch 2 (index 2) runs second.
        let sets: Vec<Vec<u32>> = vec![vec![0, 1, 2, 3], vec![7, 8, 9, 3], vec![0, 1, 2, 9]];
        let s: Vec<&[u32]> = sets.iter().map(Vec::as_slice).collect();
        assert_eq!(greedy_reorder(&s, 10), vec![0, 2, 1]);
        let inter = intersections(&s, 10);
        assert_eq!(inter, vec![0, 1, 3, 1, 0, 1, 3, 1, 0]);
        assert!(chain_overlap(&inter, 3, &[0, 2, 1]) > chain_overlap(&inter, 3, &[0, 1, 2]));
    }

    #[test]
    fn reorder_is_a_permutation_never_worse_than_identity() {
        let mut r = fanout_rand::Rng::new(5);
        for case in 0..200 {
            let n = 1 + case % 9;
            let nv = 40;
            let sets: Vec<Vec<u32>> = (0..n)
                .map(|_| {
                    let mut v: Vec<u32> = (0..nv).filter(|_| r.bernoulli(0.3)).collect();
                    if case % 3 == 0 {
                        v.truncate(1 + r.below(6) as usize); // uneven sizes
                    }
                    v
                })
                .collect();
            let s: Vec<&[u32]> = sets.iter().map(Vec::as_slice).collect();
            let o = greedy_reorder(&s, nv as usize);
            assert!(is_perm(&o, n), "case {case}");
            let inter = intersections(&s, nv as usize);
            let id: Vec<usize> = (0..n).collect();
            assert!(chain_overlap(&inter, n, &o) >= chain_overlap(&inter, n, &id));
            let w = reorder_windows(&s, 3, nv as usize);
            assert!(is_perm(&w, n));
            assert!(w
                .chunks(3)
                .enumerate()
                .all(|(k, c)| c.iter().all(|&i| i / 3 == k)));
        }
    }

    #[test]
    fn reorder_batches_permutes_whole_batches() {
        let mb = |step: u64, nodes: Vec<u32>| MiniBatch {
            resident: Default::default(),
            key: fanout_sample::BatchKey {
                step,
                ..Default::default()
            },
            num_seeds: 1,
            input_nodes: nodes,
            ..Default::default()
        };
        let b = vec![
            mb(0, vec![0, 1, 2, 3]),
            mb(1, vec![7, 8, 9, 3]),
            mb(2, vec![0, 1, 2, 9]),
        ];
        let steps: Vec<u64> = reorder_batches(b.clone(), 10)
            .iter()
            .map(|m| m.key.step)
            .collect();
        assert_eq!(steps, vec![0, 2, 1]);
        assert_eq!(reorder_batches(b, 10)[1].input_nodes, vec![0, 1, 2, 9]);
    }

    #[test]
    fn stats_of_identical_and_disjoint_sets() {
        let sets: Vec<Vec<u32>> = vec![vec![1, 2], vec![1, 2], vec![5, 6, 7]];
        let s: Vec<&[u32]> = sets.iter().map(Vec::as_slice).collect();
        let st = match_stats(&s, 8);
        assert_eq!((st.min_m, st.max_m), (0.0, 1.0));
        assert!((st.avg_m - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(st.delta_m, 1.0);
        assert_eq!(match_stats(&s[..1], 8).avg_m, 0.0);
    }
}
