//! fanout's data path between the feature store and the trainer.
//!
//! - [`Extractor`]: the extract stage's interface (input nodes -> feature rows, with byte
//!   accounting in [`ExtractStats`]); [`PlainExtractor`] is the uncached reference path.

pub mod extract;

pub use extract::{ExtractStats, Extractor, PlainExtractor};
