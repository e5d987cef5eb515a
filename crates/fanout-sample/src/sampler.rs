//! The [`Sampler`] trait and the hop-by-hop driver all samplers share: seed checks, remapping,
//! block assembly in model order, labels, and a pool of reusable remapper workspaces.

use crate::graph::check_seeds;
use crate::minibatch::{BatchKey, Block, MiniBatch};
use crate::remap::{RemapKind, Remapper};
use crate::resident::{Residency, Rows};
use fanout_graph::{Dataset, Result};
use std::sync::{Arc, Mutex};

/// A mini-batch sampler. Guarantees shared by every implementation:
/// - the result is a pure function of (graph, configuration, `seeds`, `key`): identical across
///   runs and rayon thread counts (it runs on the current rayon pool);
/// - the [`MiniBatch`] invariants hold ([`MiniBatch::validate`]), seeds are local ids `0..B` in
///   the order given, and hop `h + 1` samples from every vertex gathered so far, seeds included;
/// - errors (never panics) on seeds out of range or repeated.
pub trait Sampler: Send + Sync {
    /// Samples the mini-batch for `seeds` (distinct global ids) under `key`.
    fn sample(&self, seeds: &[u32], key: BatchKey) -> Result<MiniBatch>;
    /// Number of layers (blocks) per mini-batch.
    fn num_layers(&self) -> usize;
    /// The dataset sampled from.
    fn dataset(&self) -> &Arc<Dataset>;
    /// Whether rows are read from a resident huge-page copy of the topology rather than the
    /// memory-mapped files (see [`Residency`]).
    fn is_resident(&self) -> bool {
        false
    }
    /// A short name ("khop", "weighted", "randomwalk", "layerwise").
    fn name(&self) -> &'static str;
    /// Hop `hop` alone for `frontier` (global ids) under `key`: row `i` holds exactly the
    /// sources vertex `frontier[i]` gets in hop `hop` of [`Sampler::sample`] for any seeds
    /// under `key` whose hop-`hop` frontier contains it, as global ids (the draws of a vertex
    /// do not depend on the rest of the frontier). This is what lets split parallelism sample
    /// one mini-batch on several workers, each for the vertices it owns. Errors on ids out of
    /// range, on `hop >= num_layers()`, and for samplers whose draws depend on the whole
    /// frontier (random walks, layer-wise: the default).
    fn sample_hop(&self, frontier: &[u32], key: BatchKey, hop: usize) -> Result<HopSample> {
        let _ = (frontier, key, hop);
        Err(fanout_graph::Error::Invalid(format!(
            "the {} sampler draws a hop for the whole frontier at once, so it cannot be split \
             across workers; use the khop or weighted sampler",
            self.name()
        )))
    }
}

/// One hop of sampling ([`Sampler::sample_hop`]): destination-major CSR over the frontier
/// with global source ids. Guarantees `indptr.len() == frontier.len() + 1`, `indptr[0] == 0`,
/// non-decreasing, ending at `ids.len()`; `weights`, when present, has one value per id.
#[derive(Clone, Debug, PartialEq)]
pub struct HopSample {
    /// Offsets of each frontier vertex's sources in `ids`.
    pub indptr: Vec<u32>,
    /// Global id of every sampled source.
    pub ids: Vec<u32>,
    /// Per-edge weights (weighted sampling), else `None`.
    pub weights: Option<Vec<f32>>,
}

/// Checks a [`Sampler::sample_hop`] request against the dataset and the sampler's depth.
pub(crate) fn check_hop(s: &dyn Sampler, frontier: &[u32], hop: usize) -> Result<()> {
    check_seeds(frontier, s.dataset().num_nodes())?;
    if hop >= s.num_layers() {
        return Err(fanout_graph::Error::Invalid(format!(
            "hop {hop} asked of a {}-hop sampler",
            s.num_layers()
        )));
    }
    Ok(())
}

/// One hop's output inside the samplers (the same thing as the public [`HopSample`]).
pub(crate) type HopEdges = HopSample;

/// Runs hops and assembles mini-batches; owns the reusable remapper workspaces.
pub(crate) struct Driver {
    pub ds: Arc<Dataset>,
    /// Where rows are read from.
    pub rows: Rows,
    remap: RemapKind,
    /// Expected distinct vertices per seed (a sizing hint for the remapper).
    growth: f64,
    pool: Mutex<Vec<Remapper>>,
}

impl Driver {
    pub fn new(ds: Arc<Dataset>, remap: RemapKind, growth: f64) -> Self {
        Driver {
            rows: Rows::new(ds.clone(), Residency::Auto),
            ds,
            remap,
            growth,
            pool: Mutex::new(Vec::new()),
        }
    }

    /// Reads rows as `r` says from now on.
    pub fn set_residency(&mut self, r: Residency) {
        self.rows = Rows::new(self.ds.clone(), r);
    }

    /// Samples `layers` hops; `hop(h, frontier)` returns the edges of hop `h` for the frontier
    /// (the global ids of local ids `0..frontier.len()`).
    pub fn run<F>(&self, seeds: &[u32], key: BatchKey, layers: usize, hop: F) -> Result<MiniBatch>
    where
        F: Fn(usize, &[u32]) -> HopEdges,
    {
        let n = self.ds.num_nodes();
        check_seeds(seeds, n)?;
        // The lock is released before a new remapper is built: building one fills its table
        // with rayon jobs, and a worker waiting for them may run another batch's sampling,
        // which takes this lock (holding it across the build deadlocked two loaders).
        let reused = self.pool.lock().unwrap().pop();
        let mut rm = reused.unwrap_or_else(|| {
            let expect = (seeds.len() as f64 * self.growth).min(n as f64) as usize;
            Remapper::new(n, self.remap, expect)
        });
        if let Err(e) = rm.start(seeds) {
            self.pool.lock().unwrap().push(rm);
            return Err(e);
        }
        let mut blocks = Vec::with_capacity(layers);
        for h in 0..layers {
            let num_dst = rm.len();
            let mut e = hop(h, rm.nodes());
            debug_assert_eq!(e.indptr.len(), num_dst + 1);
            rm.extend(&mut e.ids);
            blocks.push(Block {
                num_dst,
                num_src: rm.len(),
                indptr: e.indptr,
                indices: e.ids,
                weights: e.weights,
            });
        }
        blocks.reverse();
        let input_nodes = rm.take_nodes();
        self.pool.lock().unwrap().push(rm);
        let labels = self.ds.labels.as_ref().map(|l| {
            input_nodes[..seeds.len()]
                .iter()
                .map(|&s| l[s as usize])
                .collect()
        });
        Ok(MiniBatch {
            resident: Default::default(),
            key,
            num_seeds: seeds.len(),
            blocks,
            input_nodes,
            labels,
        })
    }
}

/// Expected growth factor of the vertex set over hops with these per-hop maxima (a hint).
pub(crate) fn growth(fanouts: &[u32]) -> f64 {
    fanouts
        .iter()
        .map(|&k| 1.0 + k as f64)
        .product::<f64>()
        .min(1e12)
}
