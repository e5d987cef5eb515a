//! A block (message-flow graph of one layer) as compute sees it.

use crate::error::{ComputeError, Result};

/// One layer's message-flow graph with DGL block semantics, borrowed from whoever built it
/// (normally the sampler's `fanout_sample::Block`, whose fields map one to one).
///
/// Layout: destination-major CSR over local ids. Destination `d` (`0..num_dst`) receives one
/// message per edge `e` in `indptr[d]..indptr[d + 1]`, from local source `indices[e]`
/// (`0..num_src`). Destinations are the first `num_dst` sources: local id `i < num_dst` is the
/// same vertex on both sides, which is how layers find `h_dst` (the first `num_dst` rows of
/// `h_src`). `weights`, when present, holds one value per edge (PinSAGE visit counts, weighted
/// sampling).
///
/// [`BlockRef::validate`] checks exactly these invariants; backends call it when preparing a
/// block, so a malformed block is an error, never undefined behaviour.
///
/// From a sampler block `b`: `BlockRef { num_dst: b.num_dst, num_src: b.num_src,
/// indptr: &b.indptr, indices: &b.indices, weights: b.weights.as_deref() }`.
#[derive(Clone, Copy, Debug)]
pub struct BlockRef<'a> {
    /// Number of destination vertices.
    pub num_dst: usize,
    /// Number of source vertices, destinations included (`num_src >= num_dst`).
    pub num_src: usize,
    /// `num_dst + 1` non-decreasing offsets into `indices`, starting at 0.
    pub indptr: &'a [u32],
    /// Local source id of every edge, grouped by destination.
    pub indices: &'a [u32],
    /// Optional weight per edge.
    pub weights: Option<&'a [f32]>,
}

/// The sizes of a prepared block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockDims {
    /// Number of destination vertices.
    pub num_dst: usize,
    /// Number of source vertices (destinations included).
    pub num_src: usize,
    /// Number of edges.
    pub num_edges: usize,
}

/// The source-major side of a block's edges, which gradients flowing to the sources walk:
/// source `s` owns entries `indptr[s]..indptr[s + 1]` of `dst` and `eid`, in increasing edge
/// id (so in increasing destination). Every backend builds its transpose with
/// [`SourceMajor::of`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceMajor {
    /// `num_src + 1` non-decreasing offsets into `dst` and `eid`, from 0 to the edge count.
    pub indptr: Vec<u32>,
    /// Destination of each entry.
    pub dst: Vec<u32>,
    /// Edge id (position in the block's `indices`) of each entry.
    pub eid: Vec<u32>,
}

impl SourceMajor {
    /// The transpose of a destination-major CSR that [`BlockRef::validate`] accepts: a stable
    /// counting sort of the edges by source, `O(edges + num_src)` on one thread.
    pub fn of(indptr: &[u32], indices: &[u32], num_src: usize) -> Self {
        let mut t_indptr = vec![0u32; num_src + 1];
        for &s in indices {
            t_indptr[s as usize + 1] += 1;
        }
        for s in 0..num_src {
            t_indptr[s + 1] += t_indptr[s];
        }
        let mut next = t_indptr.clone();
        let (mut dst, mut eid) = (vec![0u32; indices.len()], vec![0u32; indices.len()]);
        for (d, w) in indptr.windows(2).enumerate() {
            for edge in w[0]..w[1] {
                let s = indices[edge as usize] as usize;
                let pos = next[s] as usize;
                next[s] += 1;
                dst[pos] = d as u32;
                eid[pos] = edge;
            }
        }
        SourceMajor {
            indptr: t_indptr,
            dst,
            eid,
        }
    }
}

impl<'a> BlockRef<'a> {
    /// Number of edges (`indices.len()`).
    pub fn num_edges(&self) -> usize {
        self.indices.len()
    }

    /// The sizes of this block.
    pub fn dims(&self) -> BlockDims {
        BlockDims {
            num_dst: self.num_dst,
            num_src: self.num_src,
            num_edges: self.indices.len(),
        }
    }

    /// Checks every invariant documented on [`BlockRef`]: `num_dst <= num_src`,
    /// `indptr.len() == num_dst + 1`, `indptr[0] == 0`, non-decreasing offsets ending at
    /// `indices.len()`, every index `< num_src`, `num_src` fits in `u32`, and one weight per
    /// edge when weights are present (finite values). Returns the first violation.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(ComputeError::Block(m));
        if self.num_dst > self.num_src {
            return bad(format!(
                "num_dst {} exceeds num_src {}",
                self.num_dst, self.num_src
            ));
        }
        if self.num_src > u32::MAX as usize {
            return bad(format!("num_src {} does not fit in u32", self.num_src));
        }
        if self.indptr.len() != self.num_dst + 1 {
            return bad(format!(
                "indptr has {} entries, expected num_dst + 1 = {}",
                self.indptr.len(),
                self.num_dst + 1
            ));
        }
        if self.indptr[0] != 0 {
            return bad(format!("indptr[0] is {}, expected 0", self.indptr[0]));
        }
        // The scans below are branch-free folds, which the compiler vectorises (a block is
        // checked every step, and `position` scans one element at a time); where one fails,
        // `position` then finds the first offender for the message.
        let rising = self.indptr.iter().zip(&self.indptr[1..]);
        if !rising.clone().fold(true, |ok, (a, b)| ok & (a <= b)) {
            let d = rising.clone().position(|(a, b)| b < a).unwrap_or(0);
            return bad(format!("indptr decreases at destination {d}"));
        }
        if self.indptr[self.num_dst] as usize != self.indices.len() {
            return bad(format!(
                "indptr ends at {} but there are {} indices",
                self.indptr[self.num_dst],
                self.indices.len()
            ));
        }
        let max_src = self.indices.iter().fold(0u32, |m, &s| m.max(s));
        if !self.indices.is_empty() && max_src as usize >= self.num_src {
            let e = (self.indices.iter())
                .position(|&s| s as usize >= self.num_src)
                .unwrap_or(0);
            return bad(format!(
                "edge {e} has source {} >= num_src {}",
                self.indices[e], self.num_src
            ));
        }
        if let Some(w) = self.weights {
            if w.len() != self.indices.len() {
                return bad(format!(
                    "{} weights for {} edges",
                    w.len(),
                    self.indices.len()
                ));
            }
            if !w.iter().fold(true, |ok, x| ok & x.is_finite()) {
                let e = w.iter().position(|x| !x.is_finite()).unwrap_or(0);
                return bad(format!("weight of edge {e} is not finite"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanout_rand::Rng;

    /// The message of `b`'s validation error (panics when `b` is valid).
    fn violation(b: BlockRef<'_>) -> String {
        match b.validate() {
            Err(ComputeError::Block(m)) => m,
            other => panic!("expected a block error, got {other:?}"),
        }
    }

    #[test]
    fn validation_names_the_first_offending_destination_edge_or_weight() {
        // Long enough for the vectorised scans' main loops, offenders at the start, middle
        // and end of each array.
        let (num_dst, fan) = (300usize, 3usize);
        let indptr: Vec<u32> = (0..=num_dst).map(|d| (d * fan) as u32).collect();
        let indices: Vec<u32> = (0..num_dst * fan).map(|e| (e % 500) as u32).collect();
        let weights = vec![0.5f32; indices.len()];
        fn block<'a>(
            indptr: &'a [u32],
            indices: &'a [u32],
            weights: Option<&'a [f32]>,
        ) -> BlockRef<'a> {
            BlockRef {
                num_dst: indptr.len() - 1,
                num_src: 500,
                indptr,
                indices,
                weights,
            }
        }
        assert!(block(&indptr, &indices, Some(&weights)).validate().is_ok());
        for at in [0usize, 417, indices.len() - 1] {
            let mut bad = indices.clone();
            bad[at] = 500;
            bad[indices.len() - 1] = 700 + (at == indices.len() - 1) as u32;
            let want = format!("edge {at} has source {} >= num_src 500", bad[at]);
            assert_eq!(violation(block(&indptr, &bad, None)), want);
            let mut w = weights.clone();
            w[at] = if at == 0 { f32::NAN } else { f32::INFINITY };
            let got = violation(block(&indptr, &indices, Some(&w)));
            assert_eq!(got, format!("weight of edge {at} is not finite"));
        }
        for d in [1usize, 150, num_dst - 1] {
            let mut bad = indptr.clone();
            bad[d] = bad[d + 1] + 1;
            let got = violation(block(&bad, &indices, None));
            assert_eq!(got, format!("indptr decreases at destination {d}"));
        }
        let empty = [0u32; 1];
        let edgeless = BlockRef {
            num_dst: 0,
            num_src: 0,
            indptr: &empty,
            indices: &[],
            weights: None,
        };
        assert!(edgeless.validate().is_ok());
    }

    #[test]
    fn source_major_lists_each_sources_edges_in_edge_order() {
        let mut rng = Rng::new(3);
        for (num_dst, num_src) in [(0usize, 0usize), (1, 1), (5, 9), (40, 70)] {
            let (mut indptr, mut indices) = (vec![0u32], Vec::new());
            for d in 0..num_dst {
                // Edgeless destinations and repeated sources included.
                for _ in 0..rng.below(6) {
                    indices.push(rng.below(num_src as u64) as u32);
                }
                if d % 3 == 1 {
                    indices.truncate(indptr[d] as usize);
                }
                indptr.push(indices.len() as u32);
            }
            let t = SourceMajor::of(&indptr, &indices, num_src);
            let dst_of = |e: usize| indptr.partition_point(|&p| p as usize <= e) as u32 - 1;
            assert_eq!(t.indptr.len(), num_src + 1);
            for s in 0..num_src {
                let want: Vec<u32> = (0..indices.len() as u32)
                    .filter(|&e| indices[e as usize] as usize == s)
                    .collect();
                let r = t.indptr[s] as usize..t.indptr[s + 1] as usize;
                assert_eq!(t.eid[r.clone()], want[..], "source {s}");
                let dsts: Vec<u32> = want.iter().map(|&e| dst_of(e as usize)).collect();
                assert_eq!(t.dst[r], dsts[..], "source {s}");
            }
        }
    }
}
