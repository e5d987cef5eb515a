//! Synthetic data for fanout.

pub mod features;

pub use features::{
    split_vertices, uniform_labels, write_class_features, ClassFeatures, SplitFractions,
};
