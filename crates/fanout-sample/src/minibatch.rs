//! The mini-batch every later stage consumes: seeds, per-layer blocks over local ids, input
//! nodes (global ids), labels and the key that produced it.
//!
//! Local ids are shared by all layers of one mini-batch (NOTES.md "Shared semantics", DGL block
//! semantics): the seeds are local ids `0..B`, hop 1 appends the vertices it discovers, hop 2
//! appends its own, and so on. Every block's destinations are therefore a prefix of its sources,
//! and the last hop's sources are all the input nodes.

use serde::Serialize;

/// Identifies one mini-batch: the run's seed, the epoch and the step within the epoch. Every
/// random choice made while sampling the batch is a pure function of this key, the sampler's
/// configuration and the graph, whatever the thread count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct BatchKey {
    /// The run's seed (`--seed`).
    pub seed: u64,
    /// Epoch number, from 0.
    pub epoch: u64,
    /// Step (mini-batch index) within the epoch, from 0.
    pub step: u64,
}

/// One layer of message flow (DGL "block" / message-flow graph) in destination-major CSR over
/// the mini-batch's local ids.
///
/// Guarantees (checked by [`MiniBatch::validate`]): `indptr.len() == num_dst + 1`, `indptr` starts
/// at 0 and never decreases, `indices.len() == indptr[num_dst]`, every index is `< num_src`,
/// `num_dst <= num_src`, and `weights`, when present, has one entry per edge. Row `d` lists the
/// sources of the sampled arcs into destination `d`; destination `d` is source `d` too (prefix).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Block {
    /// Number of destination vertices (local ids `0..num_dst`).
    pub num_dst: usize,
    /// Number of source vertices (local ids `0..num_src`), destinations included.
    pub num_src: usize,
    /// `num_dst + 1` offsets into `indices`.
    pub indptr: Vec<u32>,
    /// Local source id of every sampled edge, grouped by destination.
    pub indices: Vec<u32>,
    /// Optional per-edge weight: the stored arc weight (weighted sampler), the visit count
    /// (random walk) or the importance-sampling coefficient (layer-wise). `None` for uniform.
    pub weights: Option<Vec<f32>>,
}

impl Block {
    /// Number of edges in the block.
    pub fn num_edges(&self) -> usize {
        self.indices.len()
    }

    /// The local source ids of destination `d`.
    pub fn row(&self, d: usize) -> &[u32] {
        &self.indices[self.indptr[d] as usize..self.indptr[d + 1] as usize]
    }
}

/// A sampled mini-batch.
///
/// `blocks` are in the order a model consumes them: `blocks[0]` is the input layer (its sources
/// are all the input nodes) and `blocks[L-1]` produces the seeds. The block made by hop `h`
/// (counted from the seeds, i.e. using `fanouts[h]`) is `blocks[L-1-h]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct MiniBatch {
    /// The key this batch was sampled for.
    pub key: BatchKey,
    /// Number of seeds `B`; they are local ids `0..B` and `input_nodes[..B]`.
    pub num_seeds: usize,
    /// Blocks in model order (input layer first).
    pub blocks: Vec<Block>,
    /// Global id of every local id: the deduplicated vertex set of the outermost layer, each
    /// vertex once, seeds first (in the order given), then each hop's new vertices in order of
    /// first occurrence in that hop's edge list. Feature gathering reads exactly these rows.
    pub input_nodes: Vec<u32>,
    /// Labels of the seeds (`labels[i]` is the label of `seeds()[i]`, -1 = none), when the
    /// dataset has labels.
    pub labels: Option<Vec<i64>>,
    /// A copy of the blocks that the sampler left on the device it sampled on (a GPU
    /// sampler's), for a compute backend on that device to use instead of uploading `blocks`
    /// ([`Resident`]).
    #[serde(skip)]
    pub resident: Resident,
}

/// A sampler's copy of a batch held on a device, opaque to everything but that device's
/// compute backend, which downcasts it (`fanout_compute::Backend::adopt_blocks`). The host
/// fields of the [`MiniBatch`] stay complete for every host stage, and the copy holds the same
/// blocks; a backend that adopts the copy does not read the host blocks, so code that edits
/// `blocks` in place must clear `resident` (`Resident::default()`).
/// It is never compared (two batches equal in their host fields are equal), serialised or sent
/// to another worker.
#[derive(Clone, Default)]
pub struct Resident(pub Option<std::sync::Arc<dyn std::any::Any + Send + Sync>>);

impl PartialEq for Resident {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for Resident {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Resident(on a device)"
        } else {
            "Resident(none)"
        })
    }
}

impl MiniBatch {
    /// The seeds' global ids (`input_nodes[..num_seeds]`).
    pub fn seeds(&self) -> &[u32] {
        &self.input_nodes[..self.num_seeds]
    }

    /// Number of layers (hops).
    pub fn num_layers(&self) -> usize {
        self.blocks.len()
    }

    /// Total sampled edges over all blocks (the numerator of SEPS, counted as DGL does: the sum
    /// of the blocks' edge counts).
    pub fn num_edges(&self) -> usize {
        self.blocks.iter().map(Block::num_edges).sum()
    }

    /// Vertex counts from the seeds outward: `[B, |hop 1 sources|, ..., |input nodes|]`.
    pub fn layer_sizes(&self) -> Vec<usize> {
        let mut s = vec![self.num_seeds];
        s.extend(self.blocks.iter().rev().map(|b| b.num_src));
        s
    }

    /// Checks every structural invariant documented on [`MiniBatch`] and [`Block`]: block
    /// shapes, prefix property between consecutive layers, local ids in range, input nodes
    /// distinct, labels sized to the seeds. Returns a description of the first violation.
    pub fn validate(&self) -> Result<(), String> {
        let l = self.blocks.len();
        let mut expect_dst = self.num_seeds;
        for h in 0..l {
            let b = &self.blocks[l - 1 - h];
            let name = format!("block {} (hop {h})", l - 1 - h);
            if b.num_dst != expect_dst {
                return Err(format!(
                    "{name}: {} destinations, expected {expect_dst} (the previous hop's sources)",
                    b.num_dst
                ));
            }
            if b.num_src < b.num_dst {
                return Err(format!("{name}: fewer sources than destinations"));
            }
            if b.indptr.len() != b.num_dst + 1 || b.indptr[0] != 0 {
                return Err(format!("{name}: indptr has wrong length or start"));
            }
            if b.indptr.windows(2).any(|w| w[0] > w[1]) {
                return Err(format!("{name}: indptr decreases"));
            }
            if *b.indptr.last().unwrap() as usize != b.indices.len() {
                return Err(format!("{name}: indptr end != number of indices"));
            }
            if let Some(&bad) = b.indices.iter().find(|&&i| i as usize >= b.num_src) {
                return Err(format!("{name}: local id {bad} >= num_src {}", b.num_src));
            }
            if b.weights
                .as_ref()
                .is_some_and(|w| w.len() != b.indices.len())
            {
                return Err(format!("{name}: weights length != edges"));
            }
            expect_dst = b.num_src;
        }
        if self.input_nodes.len() != expect_dst {
            return Err(format!(
                "{} input nodes, expected {expect_dst} (outermost sources)",
                self.input_nodes.len()
            ));
        }
        let mut sorted = self.input_nodes.clone();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            return Err("input nodes repeat a vertex".into());
        }
        if self
            .labels
            .as_ref()
            .is_some_and(|x| x.len() != self.num_seeds)
        {
            return Err("labels are not one per seed".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> MiniBatch {
        // Seeds {10, 11}; hop 0 finds 12; hop 1 finds 13.
        MiniBatch {
            resident: Default::default(),
            key: BatchKey::default(),
            num_seeds: 2,
            blocks: vec![
                Block {
                    num_dst: 3,
                    num_src: 4,
                    indptr: vec![0, 1, 2, 3],
                    indices: vec![3, 0, 1],
                    weights: None,
                },
                Block {
                    num_dst: 2,
                    num_src: 3,
                    indptr: vec![0, 2, 2],
                    indices: vec![2, 1],
                    weights: None,
                },
            ],
            input_nodes: vec![10, 11, 12, 13],
            labels: Some(vec![1, 0]),
        }
    }

    #[test]
    fn accessors_and_validate() {
        let mb = tiny();
        assert_eq!(mb.validate(), Ok(()));
        assert_eq!(mb.seeds(), &[10, 11]);
        assert_eq!(mb.num_edges(), 5);
        assert_eq!(mb.layer_sizes(), vec![2, 3, 4]);
        assert_eq!(mb.blocks[1].row(0), &[2, 1]);
    }

    #[test]
    fn validate_catches_broken_invariants() {
        let mut mb = tiny();
        mb.blocks[0].indices[0] = 4;
        assert!(mb.validate().unwrap_err().contains("local id 4"));
        let mut mb = tiny();
        mb.blocks[0].num_dst = 2;
        assert!(mb.validate().unwrap_err().contains("destinations"));
        let mut mb = tiny();
        mb.input_nodes[3] = 10;
        assert!(mb.validate().unwrap_err().contains("repeat"));
    }
}
