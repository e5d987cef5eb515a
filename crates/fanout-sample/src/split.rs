//! GSplit's view of a sampled mini-batch: every vertex belongs to the worker whose id range
//! holds it (a dataset written by `fanout dataset partition --method metis`, whose parts are
//! contiguous ranges), and every sampled edge is computed by the owner of its destination.
//! An edge whose source lives elsewhere is remote: split parallelism shuffles its source's
//! hidden feature (or a partial sum) between workers.

use crate::minibatch::MiniBatch;

/// Vertex ownership by contiguous id ranges: part `p` owns `offsets[p]..offsets[p + 1]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeOwners {
    offsets: Vec<u64>,
}

impl RangeOwners {
    /// Ranges from `parts + 1` non-decreasing boundaries starting at 0 (the content of
    /// `part_offsets.bin`); an error says what is wrong.
    pub fn new(offsets: Vec<u64>) -> Result<Self, String> {
        if offsets.len() < 2 || offsets[0] != 0 || offsets.windows(2).any(|w| w[0] > w[1]) {
            return Err(format!(
                "part offsets {offsets:?}: expected at least two non-decreasing boundaries starting at 0"
            ));
        }
        Ok(RangeOwners { offsets })
    }

    /// Number of parts.
    pub fn parts(&self) -> usize {
        self.offsets.len() - 1
    }

    /// The part that owns `v`, or `None` past the last range.
    pub fn owner(&self, v: u64) -> Option<usize> {
        let p = self.offsets.partition_point(|&o| o <= v);
        (p > 0 && p < self.offsets.len()).then(|| p - 1)
    }
}

/// How one mini-batch splits: per part, the edges it computes (those into the vertices it
/// owns), and how many of them have a local source.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SplitStats {
    /// Sampled edges computed by each part, over all blocks.
    pub edges: Vec<u64>,
    /// Of those, the edges whose source the same part owns.
    pub local: Vec<u64>,
}

impl SplitStats {
    /// All edges of the batch.
    pub fn total(&self) -> u64 {
        self.edges.iter().sum()
    }

    /// Local edges over all edges (1.0 for an empty batch).
    pub fn local_fraction(&self) -> f64 {
        let t = self.total();
        if t == 0 {
            1.0
        } else {
            self.local.iter().sum::<u64>() as f64 / t as f64
        }
    }

    /// GSplit's edge skew: (most - fewest edges of a part) / mean edges per part (0 when empty).
    pub fn edge_skew(&self) -> f64 {
        let t = self.total();
        if t == 0 {
            return 0.0;
        }
        let max = self.edges.iter().copied().max().unwrap_or(0);
        let min = self.edges.iter().copied().min().unwrap_or(0);
        (max - min) as f64 / (t as f64 / self.edges.len() as f64)
    }
}

/// Splits `mb`'s edges by the owner of their destination. Errors if a vertex lies beyond the
/// ranges (the ranges belong to another dataset).
pub fn split_stats(mb: &MiniBatch, owners: &RangeOwners) -> Result<SplitStats, String> {
    let k = owners.parts();
    let mut s = SplitStats {
        edges: vec![0; k],
        local: vec![0; k],
    };
    let owner = |local: u32| -> Result<usize, String> {
        let v = mb.input_nodes[local as usize] as u64;
        owners
            .owner(v)
            .ok_or_else(|| format!("vertex {v} lies beyond the part ranges ({k} parts)"))
    };
    for b in &mb.blocks {
        for d in 0..b.num_dst {
            let od = owner(d as u32)?;
            let (lo, hi) = (b.indptr[d] as usize, b.indptr[d + 1] as usize);
            s.edges[od] += (hi - lo) as u64;
            for &src in &b.indices[lo..hi] {
                if owner(src)? == od {
                    s.local[od] += 1;
                }
            }
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::minibatch::{BatchKey, Block};

    #[test]
    fn owners_follow_the_ranges_and_refuse_bad_boundaries() {
        let o = RangeOwners::new(vec![0, 3, 3, 7]).unwrap();
        let owners: Vec<_> = (0..8).map(|v| o.owner(v)).collect();
        assert_eq!(
            owners,
            [
                Some(0),
                Some(0),
                Some(0),
                Some(2),
                Some(2),
                Some(2),
                Some(2),
                None
            ]
        );
        for bad in [vec![0], vec![1, 3], vec![0, 4, 2]] {
            assert!(RangeOwners::new(bad).is_err());
        }
    }

    #[test]
    fn edges_go_to_their_destination_owner_and_remote_sources_are_counted() {
        // Seeds 0 (part 0) and 5 (part 1); sources 1 (part 0) and 4 (part 1).
        let mb = MiniBatch {
            resident: Default::default(),
            key: BatchKey::default(),
            num_seeds: 2,
            blocks: vec![Block {
                num_dst: 2,
                num_src: 4,
                indptr: vec![0, 3, 4],
                // dst 0 <- 1, 4, 5; dst 5 <- 4
                indices: vec![2, 3, 1, 3],
                weights: None,
            }],
            input_nodes: vec![0, 5, 1, 4],
            labels: None,
        };
        let o = RangeOwners::new(vec![0, 3, 6]).unwrap();
        let s = split_stats(&mb, &o).unwrap();
        assert_eq!(s.edges, [3, 1]);
        assert_eq!(s.local, [1, 1]);
        assert_eq!(s.local_fraction(), 0.5);
        assert_eq!(s.edge_skew(), 1.0); // (3 - 1) / 2
        let e = split_stats(&mb, &RangeOwners::new(vec![0, 3]).unwrap()).unwrap_err();
        assert!(
            e.contains("vertex 4 lies beyond the part ranges (1 parts)"),
            "{e}"
        );
    }
}
