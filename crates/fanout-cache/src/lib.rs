//! fanout's data path between the feature store and the trainer.
//!
//! - [`Extractor`]: the extract stage's interface (input nodes -> feature rows, with byte
//!   accounting in [`ExtractStats`]); [`PlainExtractor`] is the uncached reference path.
//! - [`table`]: the device cache ([`FeatureCache`]: byte budget or ratio -> rows, vertex -> slot
//!   table, rows in the stored dtype) and PaGraph's budget rule ([`pagraph_budget`],
//!   [`auto_cache_size`]: the size left after a trial batch's peak).
//! - [`policy`]: random, degree (in the sampling direction), PreSC#K ([`presc`]) and the
//!   optimal oracle ([`optimal`]) as hotness rankings.
//! - [`match_reorder`]: FastGL Match degree, Greedy Reorder (Algorithm 1 with the NOTES.md
//!   fixes) and its statistics.
//! - [`cached`]: [`CachedExtractor`] (cache and/or Match in front of the host store) and
//!   [`build_extractor`], the trainer's entry point.
//! - [`trace`] and [`sim`]: one epoch's input-node sets, scored for every policy and ratio by
//!   counting bytes (`fanout cache-sim`).
//!
//! Byte counts are stored feature bytes (f16 rows count 2 bytes a value). On the CPU backend the
//! "device" is host memory: counts are exact, speed-ups are not.

pub mod cached;
pub mod extract;
pub mod match_reorder;
pub mod optimal;
pub mod policy;
pub mod presc;
pub mod sim;
pub mod table;
pub mod trace;

pub use cached::{build_extractor, CacheConfig, CacheSummary, CachedExtractor, PreSampling};
pub use extract::{CacheSplit, ExtractStats, Extractor, PlainExtractor};
pub use match_reorder::{greedy_reorder, match_stats, reorder_batches, MatchStats};
pub use policy::{parse_policies, Policy};
pub use sim::{simulate, SimConfig, SimReport, SimRow};
pub use table::{
    auto_cache_size, auto_margin, pagraph_budget, parse_bytes, AutoSize, CacheSize, CacheSizeSpec,
    FeatureCache, PAGRAPH_SLACK,
};
pub use trace::Trace;

#[cfg(test)]
mod tests;
