//! `dataset verify`: a full scan that trusts nothing. Stops at the first damaged entry and names
//! the file, the entry and what was expected.

use crate::checksum::file_checksum;
use crate::dataset::{files, Dataset, FeatData, Offsets};
use crate::error::{Error, Result};
use crate::progress::Progress;
use rayon::prelude::*;
use std::path::Path;

/// What a successful verification looked at.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct VerifyReport {
    /// Files whose stored checksum matched.
    pub checksums_verified: Vec<String>,
    /// Data files present but without a stored checksum (GNNLab-written datasets).
    pub checksums_missing: Vec<String>,
    /// Sound but noteworthy facts (absent features, overlapping splits, ...).
    pub warnings: Vec<String>,
}

/// Verifies the dataset in `dir`: sizes against meta (on open), checksums, offsets monotone and
/// ending at NUM_EDGE, every id in range, labels in range, split ids in range and unique, and no
/// NaN or infinite feature. Returns the first problem as an error.
pub fn verify(dir: &Path, progress: &dyn Progress) -> Result<VerifyReport> {
    let ds = Dataset::open(dir)?;
    let mut report = VerifyReport::default();
    let n = ds.meta.num_node;

    // Checksums first: a damaged file explains any later failure.
    let present: Vec<String> = [
        files::INDPTR,
        files::INDPTR64,
        files::INDICES,
        files::INDICES64,
        files::FEAT,
        files::LABEL,
        files::TRAIN,
        files::VALID,
        files::TEST,
    ]
    .iter()
    .filter(|f| dir.join(f).is_file())
    .map(|f| f.to_string())
    .collect();
    for file in ds.meta.checksums.keys() {
        if !dir.join(file).is_file() {
            return Err(Error::format(
                dir.join(file),
                format!(
                    "missing, but meta.txt has a checksum for it ({})",
                    crate::meta::checksum_key(file)
                ),
            ));
        }
    }
    let total: u64 = ds
        .meta
        .checksums
        .keys()
        .filter_map(|f| std::fs::metadata(dir.join(f)).ok())
        .map(|m| m.len())
        .sum();
    progress.phase("checksums", total, "bytes");
    for (file, stored) in &ds.meta.checksums {
        let path = dir.join(file);
        let actual = file_checksum(&path, progress)?;
        if &actual != stored {
            return Err(Error::format(
                path,
                format!("checksum mismatch: meta.txt says {stored}, the file hashes to {actual}; the file was modified or damaged after it was written"),
            ));
        }
        report.checksums_verified.push(file.clone());
    }
    progress.finish_phase();
    report.checksums_missing = present
        .into_iter()
        .filter(|f| !ds.meta.checksums.contains_key(f))
        .collect();

    // Offsets.
    progress.phase("topology", n + ds.meta.num_edge, "entries");
    let (pfile, first, bad, last): (&str, u64, Option<(usize, u64, u64)>, u64) =
        match &ds.topology.indptr {
            Offsets::U32(p) => (
                files::INDPTR,
                p[0] as u64,
                p.par_windows(2)
                    .position_first(|w| w[1] < w[0])
                    .map(|i| (i + 1, p[i + 1] as u64, p[i] as u64)),
                p[p.len() - 1] as u64,
            ),
            Offsets::U64(p) => (
                files::INDPTR64,
                p[0],
                p.par_windows(2)
                    .position_first(|w| w[1] < w[0])
                    .map(|i| (i + 1, p[i + 1], p[i])),
                p[p.len() - 1],
            ),
        };
    let ppath = dir.join(pfile);
    if first != 0 {
        return Err(Error::format(
            ppath,
            format!("entry 0 = {first}, expected 0"),
        ));
    }
    if let Some((i, v, prev)) = bad {
        return Err(Error::format(
            ppath,
            format!(
                "entry {i} = {v} is less than entry {} = {prev}; offsets must not decrease",
                i - 1
            ),
        ));
    }
    if last != ds.meta.num_edge {
        return Err(Error::format(
            ppath,
            format!(
                "last entry (entry {n}) = {last}, expected NUM_EDGE = {}",
                ds.meta.num_edge
            ),
        ));
    }
    progress.advance(n);

    // Neighbour ids: always scanned here, whatever open remembered.
    crate::checks::check_ids(dir, &ds.topology.indptr, &ds.topology.indices, n)?;
    progress.advance(ds.meta.num_edge);
    progress.finish_phase();

    // Labels.
    match &ds.labels {
        Some(labels) => {
            crate::checks::check_labels(&dir.join(files::LABEL), labels, ds.meta.num_class)?
        }
        None => report
            .warnings
            .push("label.bin is absent: the dataset has no labels".into()),
    }

    // Splits.
    let mut owner = vec![0u8; n as usize];
    for (file, split, bit) in [
        (files::TRAIN, &ds.train, 1u8),
        (files::VALID, &ds.valid, 2),
        (files::TEST, &ds.test, 4),
    ] {
        let path = dir.join(file);
        crate::checks::check_split(&path, split, n)?;
        // check_split refused repeats within one split.
        for &v in split.iter() {
            owner[v as usize] |= bit;
        }
        if let Some(labels) = &ds.labels {
            let unlabelled = split.iter().filter(|&&v| labels[v as usize] < 0).count();
            if unlabelled > 0 {
                report.warnings.push(format!("{file}: {unlabelled} vertices have label -1 (ignored by training and evaluation)"));
            }
        }
    }
    let overlap = owner.iter().filter(|o| o.count_ones() > 1).count();
    if overlap > 0 {
        report.warnings.push(format!(
            "{overlap} vertices belong to more than one of train/valid/test"
        ));
    }

    // Features.
    match &ds.features {
        Some(f) => {
            progress.phase("features", (f.num_rows() * f.dim) as u64, "values");
            let d = f.dim;
            let bad = match &f.data {
                FeatData::F32(a) => {
                    a.par_chunks(1 << 20)
                        .enumerate()
                        .find_map_first(|(c, chunk)| {
                            let r = chunk
                                .iter()
                                .position(|x| !x.is_finite())
                                .map(|i| (c * (1 << 20) + i, chunk[i]));
                            progress.advance(chunk.len() as u64);
                            r
                        })
                }
                FeatData::F16(a) => {
                    a.par_chunks(1 << 20)
                        .enumerate()
                        .find_map_first(|(c, chunk)| {
                            let r = chunk
                                .iter()
                                .position(|x| !x.is_finite())
                                .map(|i| (c * (1 << 20) + i, chunk[i].to_f32()));
                            progress.advance(chunk.len() as u64);
                            r
                        })
                }
            };
            progress.finish_phase();
            if let Some((i, x)) = bad {
                return Err(Error::format(
                    dir.join(files::FEAT),
                    format!(
                        "entry {i} (vertex {}, feature {}) = {x}; features must be finite numbers",
                        i / d,
                        i % d
                    ),
                ));
            }
        }
        None if ds.meta.feat_dim > 0 => report.warnings.push(format!(
            "feat.bin is absent although FEAT_DIM = {}: consumers will have to generate features",
            ds.meta.feat_dim
        )),
        None => {}
    }
    Ok(report)
}
