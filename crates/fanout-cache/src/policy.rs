//! Cache policies as hotness rankings: every policy orders all vertices hottest first, and a
//! cache of `r` rows holds the first `r` of that order (GNNLab's general scheme: a hotness
//! metric plus a cache ratio).
//!
//! - **random**: a permutation keyed by the seed.
//! - **degree** (PaGraph): how often a vertex appears in the stored rows, i.e. in the lists the
//!   samplers draw from. Samplers walk stored rows: for CSC (in-neighbours, the default) a vertex
//!   `u` appears in `v`'s row once per arc `u -> v`, so the count is its *out-degree*; for CSR
//!   (out-neighbours) it is its *in-degree*. Both are `Topology::column_counts`, which is what
//!   we rank by, whatever the layout.
//! - **presc#K** (GNNLab): per-mini-batch presence counts over K sampling-only epochs
//!   ([`crate::presc`]).
//! - **optimal**: presence counts of the evaluated trace itself ([`crate::optimal`]).
//!
//! Ties: larger vertex id first for every score-based policy (GNNLab artifact); PreSC first
//! breaks count ties by expected draws, then degree ([`crate::presc`]).

use fanout_graph::Topology;
use fanout_rand::Rng;
use rayon::prelude::*;
use std::fmt;
use std::str::FromStr;

/// Stream tag of the random policy's permutation.
const RANDOM_TAG: u64 = 0x0052_4e44_4341;

/// A cache policy by name. Parsing accepts `random`, `degree`, `presc` (= `presc1`),
/// `prescK` for K >= 1, and `optimal`; [`fmt::Display`] writes the canonical name back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Policy {
    /// Random vertices (seeded).
    Random,
    /// Degree in the sampling direction (PaGraph).
    Degree,
    /// GNNLab PreSC with K sampling-only epochs.
    PreSC(u32),
    /// The evaluation oracle: the evaluated trace's own most-visited vertices.
    Optimal,
}

impl FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Policy, String> {
        let t = s.trim().to_ascii_lowercase();
        match t.as_str() {
            "random" => Ok(Policy::Random),
            "degree" => Ok(Policy::Degree),
            "presc" => Ok(Policy::PreSC(1)),
            "optimal" => Ok(Policy::Optimal),
            _ => match t.strip_prefix("presc").map(|k| k.trim_start_matches('#').parse::<u32>()) {
                Some(Ok(k)) if k >= 1 => Ok(Policy::PreSC(k)),
                _ => Err(format!(
                    "unknown cache policy {s:?}; expected random, degree, presc, prescK (K >= 1) or optimal"
                )),
            },
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Policy::Random => f.write_str("random"),
            Policy::Degree => f.write_str("degree"),
            Policy::PreSC(k) => write!(f, "presc{k}"),
            Policy::Optimal => f.write_str("optimal"),
        }
    }
}

/// Parses a comma-separated policy list (`"random,degree,presc1"`).
pub fn parse_policies(s: &str) -> Result<Vec<Policy>, String> {
    s.split(',')
        .filter(|t| !t.trim().is_empty())
        .map(str::parse)
        .collect()
}

/// All vertices ordered by decreasing score, ties larger id first. Guarantee: a permutation of
/// `0..scores.len()`, a pure function of `scores`.
pub fn rank_by_scores<T: Copy + Ord + Send + Sync>(scores: &[T]) -> Vec<u32> {
    let mut order: Vec<u32> = (0..scores.len() as u32).collect();
    order
        .par_sort_unstable_by(|&a, &b| scores[b as usize].cmp(&scores[a as usize]).then(b.cmp(&a)));
    order
}

/// All vertices ordered by decreasing `primary`, ties by decreasing `secondary`, then larger id
/// first. Guarantee: a permutation of `0..primary.len()`, a pure function of both slices (which
/// must have the same length).
pub fn rank_by_scores_then<P, S>(primary: &[P], secondary: &[S]) -> Vec<u32>
where
    P: Copy + Ord + Send + Sync,
    S: Copy + Ord + Send + Sync,
{
    assert_eq!(
        primary.len(),
        secondary.len(),
        "score slices differ in length"
    );
    let mut order: Vec<u32> = (0..primary.len() as u32).collect();
    order.par_sort_unstable_by(|&a, &b| {
        let (a, b) = (a as usize, b as usize);
        (primary[b], secondary[b], b).cmp(&(primary[a], secondary[a], a))
    });
    order
}

/// The random policy's order: a permutation of `0..num_nodes` keyed by `seed` only.
pub fn random_ranking(num_nodes: usize, seed: u64) -> Vec<u32> {
    let mut order: Vec<u32> = (0..num_nodes as u32).collect();
    Rng::keyed(&[seed, RANDOM_TAG]).shuffle(&mut order);
    order
}

/// The degree policy's scores: occurrences of each vertex in the stored rows (out-degree for
/// CSC, in-degree for CSR; see the module docs).
pub fn degree_scores(topology: &Topology) -> Vec<u64> {
    topology.column_counts()
}

/// The degree policy's order ([`degree_scores`], ties larger id first).
pub fn degree_ranking(topology: &Topology) -> Vec<u32> {
    rank_by_scores(&degree_scores(topology))
}

/// Position of every vertex in `ranking` (`pos[ranking[i]] == i`); a cache of `r` rows holds
/// exactly the vertices with `pos < r`.
pub fn positions(ranking: &[u32]) -> Vec<u32> {
    let mut pos = vec![0u32; ranking.len()];
    for (i, &v) in ranking.iter().enumerate() {
        pos[v as usize] = i as u32;
    }
    pos
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in ["random", "degree", "presc1", "presc2", "presc10", "optimal"] {
            assert_eq!(s.parse::<Policy>().unwrap().to_string(), s);
        }
        assert_eq!("presc".parse::<Policy>(), Ok(Policy::PreSC(1)));
        assert_eq!("PreSC#2".parse::<Policy>(), Ok(Policy::PreSC(2)));
        assert!("presc0".parse::<Policy>().is_err());
        assert!("lru".parse::<Policy>().is_err());
        assert_eq!(parse_policies("random, degree").unwrap().len(), 2);
    }

    #[test]
    fn ranking_breaks_ties_toward_larger_ids() {
        assert_eq!(rank_by_scores(&[3u32, 5, 3, 0, 5]), vec![4, 1, 2, 0, 3]);
        // Secondary scores break primary ties; the id breaks what is left.
        let second = [9u64, 1, 2, 7, 1];
        assert_eq!(
            rank_by_scores_then(&[3u32, 5, 3, 0, 5], &second),
            vec![4, 1, 0, 2, 3]
        );
        let r = random_ranking(100, 7);
        assert_eq!(r, random_ranking(100, 7));
        assert_ne!(r, random_ranking(100, 8));
        let mut s = r.clone();
        s.sort_unstable();
        assert_eq!(s, (0..100).collect::<Vec<u32>>());
        let p = positions(&r);
        assert!((0..100).all(|i| p[r[i] as usize] == i as u32));
    }
}
