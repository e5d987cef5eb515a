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

/// `|x - y|`, infinite where exactly one of them is NaN and zero where both are (a fold with
/// `f32::max` would silently skip a NaN difference).
fn abs_diff(x: f32, y: f32) -> f32 {
    match (x.is_nan(), y.is_nan()) {
        (true, true) => 0.0,
        (false, false) if x == y => 0.0,
        (false, false) => (x - y).abs(),
        _ => f32::INFINITY,
    }
}

/// Largest `|a - b| / (1 + |b|)` over the two vectors (infinite on a NaN on one side only).
#[allow(dead_code)] // each test binary compiles this module; not all use every helper
pub fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(&x, &y)| abs_diff(x, y) / (1.0 + y.abs()))
        .fold(0.0, f32::max)
}

/// Largest `|a - b|` over the two vectors, relative to the largest magnitude in `scale`
/// (infinite on a NaN on one side only).
#[allow(dead_code)]
pub fn max_scaled_diff(a: &[f32], b: &[f32], scale: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let s = scale.iter().map(|v| v.abs()).fold(1e-6f32, f32::max);
    a.iter()
        .zip(b)
        .map(|(&x, &y)| abs_diff(x, y) / s)
        .fold(0.0, f32::max)
}
