//! Synthetic data for fanout: graphs shaped like the papers' datasets with planted, learnable
//! classes ([`Preset`], [`generate()`]), and learnable vertex data for topology-only graphs
//! ([`write_class_features`], [`split_vertices`]).

mod calibrate;
pub mod features;
pub mod generate;
mod model;
pub mod preset;
#[cfg(test)]
mod tests;

pub use features::{
    split_vertices, split_vertices_from, uniform_labels, write_class_features, ClassFeatures,
    SplitFractions, MAX_CENTROID_VALUES,
};
pub use generate::{generate, generate_with_cancel, GenOptions, GenSummary};
pub use preset::{Preset, PresetConfig};
