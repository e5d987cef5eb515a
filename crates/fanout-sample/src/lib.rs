//! fanout's sampling engine.
//!
//! Fanouts are in hop order from the seeds ("15,10,5": each seed draws 15 neighbours, each of
//! those 10, each of those 5; DGL lists them reversed). Blocks follow DGL semantics: hop `h + 1`
//! samples from every vertex gathered so far, seeds included, and each layer's destinations are
//! a prefix (local ids `0..n`) of its sources (NOTES.md "Shared semantics").
//!
//! - [`MiniBatch`] / [`Block`] / [`BatchKey`]: what every later stage consumes.
//! - Samplers ([`Sampler`]): [`KHopSampler`] (uniform, with or without replacement),
//!   [`WeightedSampler`] (per-arc alias tables, [`AliasTables`], over `weight.bin`, which
//!   [`make_weights`] produces), [`RandomWalkSampler`] (PinSAGE),
//!   [`LayerwiseSampler`] (LADIES-style importance sampling of a fixed number of vertices per
//!   layer). All are deterministic for a given (seed, epoch, step), whatever the thread count:
//!   every random stream is keyed by (seed, epoch, step, sampler, hop, vertex).
//! - [`Remapper`]: parallel global-to-local ids ([`FusedMap`] hash table after FastGL with its
//!   errata fixed, or [`DenseMap`]), equal to the sequential [`remap_reference`].
//! - [`Loader`]: shuffled epochs split into batches, sampled ahead by worker threads into a
//!   bounded in-order queue.
//! - [`Residency`]: samplers read rows from a private huge-page copy of the topology when it
//!   fits comfortably in memory (fewer TLB misses on random row reads), else from the mapped files.
//!
//! Samplers walk the stored rows: in-neighbours for CSC datasets (the default, pull sampling);
//! for CSR datasets, out-neighbours ([`layout_note`] says so to people).

pub mod alias;
pub mod arc_weights;
pub mod graph;
pub mod khop;
pub mod layerwise;
pub mod loader;
pub mod minibatch;
pub mod randomwalk;
pub mod remap;
pub mod resident;
pub mod sampler;
pub mod split;
#[cfg(test)]
mod testutil;
pub mod weighted;
pub mod wire;

pub use alias::AliasTables;
pub use arc_weights::{make_weights, WeightScheme};
pub use graph::{check_dataset, layout_note, parse_fanouts, FANOUT_ALL};
pub use khop::{KHopConfig, KHopSampler};
pub use layerwise::{LayerwiseConfig, LayerwiseSampler};
pub use loader::{epoch_batches, near_equal_part, BatchPlan, EpochIter, Loader, LoaderConfig};
pub use minibatch::{BatchKey, Block, MiniBatch, Resident};
pub use randomwalk::{RandomWalkConfig, RandomWalkSampler};
pub use remap::{remap_reference, DenseMap, FusedMap, RemapKind, Remapper};
pub use resident::Residency;
pub use sampler::{HopSample, Sampler};
pub use split::{split_stats, RangeOwners, SplitStats};
pub use weighted::{WeightedConfig, WeightedSampler};
pub mod spec;
pub use spec::{BuiltSampler, SamplerKind, SamplerSpec};
