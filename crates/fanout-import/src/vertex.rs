//! Vertex data shared by the importers: checks on vertex counts, split and label validation,
//! feature element conversion, and generated (random) labels, features and splits.

use crate::RandomFeatures;
use fanout_graph::meta::{MAX_CLASSES, MAX_ELEMENTS};
use fanout_graph::{f16, files, DatasetWriter, Error, FeatDtype, Pod, Progress, Result};
use fanout_synth::MAX_CENTROID_VALUES;
use fanout_synth::{split_vertices, uniform_labels, write_class_features, ClassFeatures};
use std::path::Path;
use std::sync::OnceLock;

/// Bytes per vertex the topology builder needs (row counts, offsets and cursors).
const BUILD_BYTES_PER_VERTEX: u64 = 24;

/// What an importer wrote besides the topology.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct VertexData {
    pub feat_dim: u64,
    pub num_classes: u64,
    /// `[train, valid, test]` sizes.
    pub splits: [u64; 3],
}

/// The largest vertex count whose topology this machine's memory can build (physical memory /
/// 24 bytes per vertex). Guards against one stray huge id turning into a multi-terabyte
/// allocation that would abort the process.
pub(crate) fn max_vertices() -> u64 {
    static MAX: OnceLock<u64> = OnceLock::new();
    *MAX.get_or_init(|| {
        let total = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
                let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
                kb.checked_mul(1024)
            })
            .unwrap_or(1 << 40);
        total / BUILD_BYTES_PER_VERTEX
    })
}

/// The message for a vertex id that would need more vertices than [`max_vertices`].
pub(crate) fn too_large_id(id: u64) -> String {
    format!(
        "vertex id {id} would make a graph of {} vertices, more than this machine's memory can build (at most {} at {BUILD_BYTES_PER_VERTEX} bytes each); vertex ids must be numbered densely from 0: relabel them first",
        id as u128 + 1,
        max_vertices()
    )
}

/// Fails when a graph of `n` vertices (stated by `origin`) cannot be built in this machine's
/// memory.
pub(crate) fn check_num_nodes(n: u64, origin: &str) -> Result<()> {
    if n > max_vertices() {
        return Err(Error::Invalid(format!(
            "{origin} gives {n} vertices, more than this machine's memory can build (at most {} at {BUILD_BYTES_PER_VERTEX} bytes each)",
            max_vertices()
        )));
    }
    Ok(())
}

/// Checks a split (ids distinct and `< n`) and narrows it to u32. `at(i)` names entry `i` in
/// messages (`entry 3`, `line 4`), `path` is the source file.
pub(crate) fn finish_split(
    path: &Path,
    ids: &[u64],
    n: u64,
    at: &dyn Fn(usize) -> String,
) -> Result<Vec<u32>> {
    if n > u32::MAX as u64 && !ids.is_empty() {
        return Err(Error::format(
            path,
            format!("{n} vertices: splits support at most 2^32 - 1 vertices"),
        ));
    }
    let mut seen = vec![0u64; (n as usize).div_ceil(64)];
    let mut out = Vec::with_capacity(ids.len());
    for (i, &v) in ids.iter().enumerate() {
        if v >= n {
            return Err(Error::format(
                path,
                format!(
                    "{}: vertex id {v} is out of range; expected < {n} (the number of vertices)",
                    at(i)
                ),
            ));
        }
        let (w, b) = ((v / 64) as usize, 1u64 << (v % 64));
        if seen[w] & b != 0 {
            let j = ids.iter().position(|&x| x == v).unwrap_or(0);
            return Err(Error::format(
                path,
                format!(
                    "{}: vertex {v} appears twice (also at {}); a split lists each vertex once",
                    at(i),
                    at(j)
                ),
            ));
        }
        seen[w] |= b;
        out.push(v as u32);
    }
    Ok(out)
}

/// Writes the three splits (empty ones are not written) and returns their sizes.
pub(crate) fn write_splits(writer: &mut DatasetWriter, splits: [Vec<u32>; 3]) -> Result<[u64; 3]> {
    let mut sizes = [0u64; 3];
    for (k, (file, ids)) in [files::TRAIN, files::VALID, files::TEST]
        .into_iter()
        .zip(splits)
        .enumerate()
    {
        sizes[k] = ids.len() as u64;
        if !ids.is_empty() {
            writer.write_array(file, &ids)?;
        }
    }
    Ok(sizes)
}

/// The class count of checked labels (each -1 or >= 0): largest label + 1.
pub(crate) fn num_classes(labels: &[i64]) -> u64 {
    labels
        .iter()
        .copied()
        .max()
        .map_or(0, |m| (m + 1).max(0) as u64)
}

/// A stored feature element type: f32 or f16.
pub(crate) trait FeatElem: Pod + Default {
    /// The stored value of `x`, or `None` when it is not finite once stored (NaN, infinity, or
    /// beyond the f16 range).
    fn store(x: f32) -> Option<Self>;
}

impl FeatElem for f32 {
    #[inline]
    fn store(x: f32) -> Option<f32> {
        x.is_finite().then_some(x)
    }
}

impl FeatElem for f16 {
    #[inline]
    fn store(x: f32) -> Option<f16> {
        let y = f16::from_f32(x);
        y.is_finite().then_some(y)
    }
}

/// Why feature value `x` could not be stored as `dtype`.
pub(crate) fn bad_feature(x: f32, dtype: FeatDtype) -> String {
    if x.is_finite() {
        format!(
            "value {x} does not fit in {} (largest magnitude 65504); import with f32 features",
            dtype.as_str()
        )
    } else {
        format!("value {x}; features must be finite numbers")
    }
}

/// Checks the generation parameters before any work is done.
pub(crate) fn check_random(r: &RandomFeatures) -> Result<()> {
    if r.dim == 0 {
        return Err(Error::Invalid(
            "random features need a dimension > 0 (leave them out for a topology-only dataset)"
                .into(),
        ));
    }
    if r.classes == 0 || r.classes > MAX_CLASSES {
        return Err(Error::Invalid(format!(
            "random features: {} classes; expected 1 to {MAX_CLASSES} (2^24)",
            r.classes
        )));
    }
    // The generator keeps one centroid of `dim` floats per class in memory.
    if !matches!((r.dim as u64).checked_mul(r.classes), Some(x) if x <= MAX_CENTROID_VALUES) {
        return Err(Error::Invalid(format!(
            "random features: {} classes x {} dimensions is too large; the class centroids \
             (classes x dimensions floats) must fit in 1 GiB ({MAX_CENTROID_VALUES} values)",
            r.classes, r.dim
        )));
    }
    if !r.signal.is_finite() {
        return Err(Error::Invalid(format!(
            "random features: signal {} must be a finite number",
            r.signal
        )));
    }
    let fr = [r.train_frac, r.valid_frac, r.test_frac];
    if fr.iter().any(|x| !(0.0..=1.0).contains(x)) || fr.iter().sum::<f64>() > 1.0 + 1e-9 {
        return Err(Error::Invalid(format!(
            "split fractions train {} / valid {} / test {} must each lie in [0, 1] and sum to at most 1",
            r.train_frac, r.valid_frac, r.test_frac
        )));
    }
    Ok(())
}

/// The error for random features requested on a source that has its own `what` in `path`.
pub(crate) fn refuse_random(path: &Path, what: &str) -> Error {
    Error::Invalid(format!(
        "random features were requested, but the source already has {what} ({}); import it without random features, or remove the file",
        path.display()
    ))
}

/// Writes generated labels, class-centroid features and splits for `n` vertices.
pub(crate) fn write_random(
    writer: &mut DatasetWriter,
    n: u64,
    r: &RandomFeatures,
    dtype: FeatDtype,
    progress: &dyn Progress,
) -> Result<VertexData> {
    check_random(r)?;
    if !matches!(n.checked_mul(r.dim as u64), Some(x) if x <= MAX_ELEMENTS) {
        return Err(Error::Invalid(format!(
            "random features: {n} vertices x {} dimensions exceed {MAX_ELEMENTS} (2^58) values",
            r.dim
        )));
    }
    let labels = uniform_labels(n, r.classes, r.seed);
    writer.write_array(files::LABEL, &labels)?;
    let spec = ClassFeatures {
        num_classes: r.classes,
        dim: r.dim,
        dtype,
        signal: r.signal,
        seed: r.seed,
    };
    write_class_features(writer, &labels, &spec, progress)?;
    let fractions = fanout_synth::SplitFractions {
        train: r.train_frac,
        valid: r.valid_frac,
        test: r.test_frac,
    };
    let splits = write_splits(writer, split_vertices(n, fractions, r.seed)?)?;
    Ok(VertexData {
        feat_dim: r.dim as u64,
        num_classes: r.classes,
        splits,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_feature_sizes_are_bounded_before_any_allocation() {
        let r = |dim: usize, classes: u64| RandomFeatures {
            dim,
            classes,
            train_frac: 0.1,
            valid_frac: 0.1,
            test_frac: 0.1,
            seed: 0,
            signal: 0.5,
        };
        assert!(check_random(&r(4096, 1 << 16)).is_ok());
        for (bad, want) in [
            (r(0, 4), "dimension > 0"),
            (r(16, 0), "expected 1 to 16777216"),
            (r(16, 100_000_000_000), "expected 1 to 16777216"),
            (r(100_000_000_000, 16), "must fit in 1 GiB"),
            (r(1 << 15, 1 << 14), "must fit in 1 GiB"),
        ] {
            let e = check_random(&bad).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
    }

    #[test]
    fn splits_are_checked_for_range_and_repeats() {
        let p = Path::new("train.csv");
        let at = |i: usize| format!("line {}", i + 1);
        assert_eq!(finish_split(p, &[3, 0, 2], 4, &at).unwrap(), vec![3, 0, 2]);
        let e = finish_split(p, &[3, 4], 4, &at).unwrap_err().to_string();
        assert_eq!(
            e,
            "train.csv: line 2: vertex id 4 is out of range; expected < 4 (the number of vertices)"
        );
        let e = finish_split(p, &[1, 2, 1], 4, &at).unwrap_err().to_string();
        assert!(
            e.contains("line 3: vertex 1 appears twice (also at line 1)"),
            "{e}"
        );
    }

    #[test]
    fn feature_storage_rejects_non_finite_and_f16_overflow() {
        assert_eq!(<f32 as FeatElem>::store(1e6), Some(1e6));
        assert_eq!(<f32 as FeatElem>::store(f32::NAN), None);
        assert_eq!(<f16 as FeatElem>::store(0.5), Some(f16::from_f32(0.5)));
        assert_eq!(<f16 as FeatElem>::store(1e6), None);
        assert!(bad_feature(1e6, FeatDtype::F16).contains("does not fit in f16"));
        assert!(bad_feature(f32::NAN, FeatDtype::F32).contains("NaN; features must be finite"));
        assert_eq!(num_classes(&[-1, 2, 0]), 3);
        assert_eq!(num_classes(&[-1, -1]), 0);
        assert_eq!(num_classes(&[]), 0);
    }

    #[test]
    fn huge_ids_are_refused_before_allocating() {
        assert!(max_vertices() > 1 << 20);
        assert!(too_large_id(u64::MAX).contains("18446744073709551616 vertices"));
        assert!(check_num_nodes(1 << 62, "--num-nodes").is_err());
        assert!(check_num_nodes(1000, "--num-nodes").is_ok());
    }
}
