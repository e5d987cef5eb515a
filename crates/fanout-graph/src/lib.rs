//! fanout's graph and feature store.
//!
//! A dataset is a directory of flat little-endian arrays described by `meta.txt` (GUIDE section
//! 1, compatible with GNNLab's converters). [`Dataset::open`] memory-maps it in O(1) time and
//! memory; [`DatasetWriter`] writes one atomically (temporary directory, checksums, rename);
//! [`build_topology`] turns a re-readable arc stream into CSC or CSR without holding the input;
//! [`verify()`] scans every entry; [`DatasetInfo`] summarises.

pub mod array;
pub mod build;
pub mod cancel;
pub mod checks;
pub mod checksum;
pub mod dataset;
pub mod error;
pub mod info;
pub mod meta;
pub mod partition;
pub mod progress;
pub mod relabel;
mod row_ops;
pub mod verify;
pub mod writer;

pub use array::{available_memory, Array, ArrayMut, Pod, Residency};
pub use build::{build_topology, ArcSink, ArcSource, BuildOptions, BuildStats, SliceArcs};
pub use cancel::Cancel;
pub use checks::IdCheck;
pub use dataset::{
    files, CsrVisitor, Dataset, FeatData, Features, Ids, Offset, Offsets, Row, Topology, VertexId,
};
pub use error::{Error, Result};
pub use half::f16;
pub use info::{DatasetInfo, DegreeStats, PartitionInfo};
pub use meta::{FeatDtype, Layout, Meta};
pub use partition::{
    list_partitions, part_degree_ranking, partition_training_set, Partition, PartitionMethod,
    PartitionStats,
};
pub use progress::{NoProgress, Progress};
pub use verify::{verify, VerifyReport};
pub use writer::DatasetWriter;
