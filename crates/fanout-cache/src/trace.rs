//! An epoch's extraction trace: the input-node set of every mini-batch, in step order, stored
//! flat. Recorded once and reused by every policy, ratio and ordering the simulator scores.

use fanout_graph::Result;
use fanout_sample::{Loader, LoaderConfig, Sampler};
use std::sync::Arc;

/// The input nodes of each mini-batch of one or more consecutive epochs. Guarantees: batch `i`
/// is `nodes[offsets[i]..offsets[i + 1]]`, each vertex at most once per batch (mini-batch input
/// nodes are deduplicated), every id below `num_nodes`; epoch `e` holds batches
/// `epoch_starts[e]..epoch_starts[e + 1]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    /// Vertices of the graph.
    pub num_nodes: usize,
    /// `num_batches + 1` offsets into `nodes`.
    pub offsets: Vec<usize>,
    /// Input nodes of all batches, concatenated.
    pub nodes: Vec<u32>,
    /// `epochs + 1` batch indices: where each epoch starts, then the end.
    pub epoch_starts: Vec<usize>,
}

impl Trace {
    /// Samples epoch `epoch` of `seeds` with `sampler` under `cfg` (the same shuffle and keys
    /// the trainer's loader would use) and keeps only the input nodes. Deterministic.
    pub fn record(
        sampler: Arc<dyn Sampler>,
        seeds: &[u32],
        cfg: &LoaderConfig,
        epoch: u64,
    ) -> Result<Trace> {
        Trace::record_epochs(sampler, seeds, cfg, epoch, 1)
    }

    /// Like [`Trace::record`] for epochs `first..first + count`, in order.
    pub fn record_epochs(
        sampler: Arc<dyn Sampler>,
        seeds: &[u32],
        cfg: &LoaderConfig,
        first: u64,
        count: u64,
    ) -> Result<Trace> {
        let num_nodes = sampler.dataset().num_nodes() as usize;
        let loader = Loader::new(sampler, seeds.to_vec(), cfg.clone())?;
        let mut t = Trace {
            num_nodes,
            offsets: vec![0],
            nodes: Vec::new(),
            epoch_starts: vec![0],
        };
        for e in first..first + count {
            for mb in loader.epoch(e) {
                t.push(&mb?.input_nodes);
            }
            t.epoch_starts.push(t.num_batches());
        }
        Ok(t)
    }

    /// A one-epoch trace from explicit batches (tests, or batches already sampled). Panics on
    /// an id not below `num_nodes`; the caller guarantees each batch is duplicate-free.
    pub fn from_batches<B: AsRef<[u32]>>(num_nodes: usize, batches: &[B]) -> Trace {
        let mut t = Trace {
            num_nodes,
            offsets: vec![0],
            nodes: Vec::new(),
            epoch_starts: vec![0],
        };
        for b in batches {
            t.push(b.as_ref());
        }
        t.epoch_starts.push(t.num_batches());
        t
    }

    /// Number of epochs.
    pub fn num_epochs(&self) -> usize {
        self.epoch_starts.len() - 1
    }

    /// Batch indices of epoch `e`.
    pub fn epoch_range(&self, e: usize) -> std::ops::Range<usize> {
        self.epoch_starts[e]..self.epoch_starts[e + 1]
    }

    /// Presence counts of epoch `e` alone.
    pub fn epoch_presence_counts(&self, e: usize) -> Vec<u32> {
        let r = self.epoch_range(e);
        let mut c = vec![0u32; self.num_nodes];
        for &v in &self.nodes[self.offsets[r.start]..self.offsets[r.end]] {
            c[v as usize] += 1;
        }
        c
    }

    fn push(&mut self, batch: &[u32]) {
        assert!(
            batch.iter().all(|&v| (v as usize) < self.num_nodes),
            "trace: vertex out of range"
        );
        self.nodes.extend_from_slice(batch);
        self.offsets.push(self.nodes.len());
    }

    /// Number of mini-batches.
    pub fn num_batches(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Input nodes of batch `i`.
    pub fn batch(&self, i: usize) -> &[u32] {
        &self.nodes[self.offsets[i]..self.offsets[i + 1]]
    }

    /// All batches as slices, in step order.
    pub fn batches(&self) -> Vec<&[u32]> {
        (0..self.num_batches()).map(|i| self.batch(i)).collect()
    }

    /// Rows extracted over the trace (input nodes summed over batches).
    pub fn total_rows(&self) -> u64 {
        self.nodes.len() as u64
    }

    /// For every vertex, the number of mini-batches (of all epochs) whose input nodes contain it.
    pub fn presence_counts(&self) -> Vec<u32> {
        let mut c = vec![0u32; self.num_nodes];
        for &v in &self.nodes {
            c[v as usize] += 1;
        }
        c
    }
}
