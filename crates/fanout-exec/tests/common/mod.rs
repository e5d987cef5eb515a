//! Helpers shared by the integration tests of this crate.

use fanout_graph::{Dataset, FeatDtype, NoProgress};
use fanout_synth::{generate, GenOptions, Preset};
use std::sync::Arc;

/// The tiny preset at `nodes` vertices, written to a temporary directory (kept alive by the
/// returned guard) and opened from there, so runs configured by path can train on it.
pub fn saved_tiny(nodes: u64) -> (tempfile::TempDir, Arc<Dataset>) {
    saved_tiny_as(nodes, FeatDtype::F32)
}

/// [`saved_tiny`] with its features stored as `dtype`.
#[allow(dead_code)] // each test binary compiles this module; not all use every helper
pub fn saved_tiny_as(nodes: u64, dtype: FeatDtype) -> (tempfile::TempDir, Arc<Dataset>) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tiny");
    let cfg = Preset::Tiny.config(Some(nodes));
    let opts = GenOptions {
        feat_dtype: dtype,
        ..GenOptions::default()
    };
    generate(&cfg, &opts, Some(&out), &NoProgress).unwrap();
    let ds = Arc::new(Dataset::open(&out).unwrap());
    (dir, ds)
}
