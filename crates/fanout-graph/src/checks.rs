//! Content checks that [`Dataset::open`](crate::Dataset::open) runs so that damaged data is a
//! one-line error on open, never an out-of-bounds read deep inside a sampler, a gather or a loss:
//! labels and split ids in range, no split id twice (O(NUM_NODE), always), and neighbour ids
//! in range (O(NUM_EDGE)).
//!
//! The O(NUM_EDGE) scan is remembered: after it passes, a stamp file (`.fanout-checked`) beside
//! the data records the identity of the files it covered (size, modification and change times,
//! inode), and later opens skip the scan while they match. Files changed in the last two seconds
//! are not remembered, so that a rewrite within one clock tick cannot pass for the old file. Any rewrite of `meta.txt` or `indices.bin` changes
//! their identity and brings the scan back. A folder that cannot be written (a read-only share)
//! is scanned on every open. `dataset verify` always scans everything.

use crate::dataset::{files, Ids, Offsets};
use crate::error::{Error, Result};
use rayon::prelude::*;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The stamp file's name inside a dataset folder.
pub const STAMP: &str = ".fanout-checked";

/// The first line of a stamp; a stamp with another first line is ignored (and rewritten).
const STAMP_HEADER: &str =
    "# fanout open-time checks passed for these files (name size mtime_ns ctime_ns inode); v1";

/// Files changed less than this many seconds ago are not remembered (see `stamp_key`).
const RACY_SECONDS: u64 = 2;

/// The files whose content the remembered scan depends on.
const STAMPED: [&str; 3] = [files::META, files::INDICES, files::INDICES64];

/// How [`Dataset::open`](crate::Dataset::open) established that every neighbour id is below
/// NUM_NODE.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
#[serde(tag = "how", rename_all = "snake_case")]
pub enum IdCheck {
    /// Scanned on this open, in `seconds`; `remembered` says whether the stamp was written, so
    /// that the next open can skip the scan (not when the folder is read-only or a file changed
    /// in the last two seconds).
    Scanned { seconds: f64, remembered: bool },
    /// Skipped: a stamp from an earlier scan matched the files.
    Remembered,
}

/// Checks that every neighbour id is below `n`, reusing a matching stamp in `dir` and writing one
/// after a scan that passed. The error names the file, the entry, the vertex whose row holds it,
/// the value and the bound.
pub(crate) fn check_ids_remembered(
    dir: &Path,
    indptr: &Offsets,
    ids: &Ids,
    n: u64,
) -> Result<IdCheck> {
    check_ids_remembered_within(dir, indptr, ids, n, RACY_SECONDS)
}

/// [`check_ids_remembered`] with the racy window as a parameter (tests shorten it).
fn check_ids_remembered_within(
    dir: &Path,
    indptr: &Offsets,
    ids: &Ids,
    n: u64,
    racy_seconds: u64,
) -> Result<IdCheck> {
    let key = stamp_key(dir, racy_seconds);
    let stamp = dir.join(STAMP);
    if let Some(k) = &key {
        if std::fs::read_to_string(&stamp).is_ok_and(|s| s == *k) {
            return Ok(IdCheck::Remembered);
        }
    }
    let t = Instant::now();
    check_ids(dir, indptr, ids, n)?;
    let seconds = t.elapsed().as_secs_f64();
    let remembered = key.is_some_and(|k| write_stamp(&stamp, &k));
    Ok(IdCheck::Scanned {
        seconds,
        remembered,
    })
}

/// The first entry of `a` that is `>= n`, with its position, or `None` if every entry is
/// below `n`. The common case (none) is a branch-free maximum per chunk, which the compiler
/// vectorises; only a chunk whose maximum is out of range is searched element by element, so
/// the scan runs near memory speed.
pub fn first_at_least<T: Copy + Into<u64> + Ord + Default + Send + Sync>(
    a: &[T],
    n: u64,
) -> Option<(usize, u64)> {
    const CHUNK: usize = 1 << 16;
    let chunk = a
        .par_chunks(CHUNK)
        .position_first(|c| c.iter().copied().fold(T::default(), T::max).into() >= n)?;
    let start = chunk * CHUNK;
    let end = (start + CHUNK).min(a.len());
    let i = start + a[start..end].iter().position(|&v| v.into() >= n)?;
    Some((i, a[i].into()))
}

/// Checks that every neighbour id is below `n` (a full parallel scan).
pub(crate) fn check_ids(dir: &Path, indptr: &Offsets, ids: &Ids, n: u64) -> Result<()> {
    let (file, bad) = match ids {
        Ids::U32(a) => (files::INDICES, first_at_least(a, n)),
        Ids::U64(a) => (files::INDICES64, first_at_least(a, n)),
    };
    match bad {
        None => Ok(()),
        Some((i, v)) => Err(Error::format(
            dir.join(file),
            format!(
                "entry {i} = {v} (in the row of vertex {}) is out of range; expected a vertex id < NUM_NODE = {n}",
                owner_of(indptr, i as u64)
            ),
        )),
    }
}

/// Checks that every label is -1 (unlabelled) or a class below `num_class`.
pub(crate) fn check_labels(path: &Path, labels: &[i64], num_class: u64) -> Result<()> {
    let c = num_class as i64;
    match labels.par_iter().position_first(|&l| l < -1 || l >= c) {
        None => Ok(()),
        Some(i) => Err(Error::format(
            path,
            if c == 0 {
                format!(
                    "entry {i} (vertex {i}) = {}, expected -1 (unlabelled): NUM_CLASS is 0",
                    labels[i]
                )
            } else {
                format!(
                    "entry {i} (vertex {i}) = {}, expected -1 (unlabelled) or a class in 0..={} (NUM_CLASS = {c})",
                    labels[i],
                    c - 1
                )
            },
        )),
    }
}

/// Checks that every id of a split is a vertex below `n` and that none appears twice (one bit
/// per vertex of scratch, `n / 8` bytes).
pub(crate) fn check_split(path: &Path, split: &[u32], n: u64) -> Result<()> {
    if let Some(i) = split.par_iter().position_first(|&v| v as u64 >= n) {
        return Err(Error::format(
            path,
            format!(
                "entry {i} = {} is out of range; expected a vertex id < NUM_NODE = {n}",
                split[i]
            ),
        ));
    }
    // A repeated id would otherwise fail only when both copies meet in one mini-batch (the
    // sampler refuses a repeated seed), or be trained twice per epoch when they do not.
    // One bit per vertex, set in parallel; the error path rescans in order so that it names
    // the first repeat whatever the thread timing.
    let words: Vec<AtomicU64> = (0..(n as usize).div_ceil(64))
        .map(|_| AtomicU64::new(0))
        .collect();
    let repeated = split.par_iter().any(|&v| {
        let bit = 1u64 << (v % 64);
        words[v as usize / 64].fetch_or(bit, Ordering::Relaxed) & bit != 0
    });
    if !repeated {
        return Ok(());
    }
    let mut seen = std::collections::HashMap::new();
    for (i, &v) in split.iter().enumerate() {
        if let Some(j) = seen.insert(v, i) {
            return Err(Error::format(
                path,
                format!(
                    "vertex {v} appears twice (entries {j} and {i}); a split lists each vertex once"
                ),
            ));
        }
    }
    // Only a file rewritten between the two passes gets here.
    Err(Error::format(
        path,
        "changed while it was read; open the dataset again",
    ))
}

/// The vertex whose row holds arc position `pos` (offsets already checked monotone).
pub(crate) fn owner_of(indptr: &Offsets, pos: u64) -> u64 {
    let rows_starting_at_or_before = match indptr {
        Offsets::U32(p) => p.partition_point(|&x| x as u64 <= pos),
        Offsets::U64(p) => p.partition_point(|&x| x <= pos),
    };
    rows_starting_at_or_before.saturating_sub(1) as u64
}

/// The stamp content that matches the present files, or `None` when it must not be trusted: a
/// file's identity cannot be read, or a file changed within the last [`RACY_SECONDS`] (a write
/// in the same clock tick as the stamp would leave the same times behind; git's "racy" rule).
fn stamp_key(dir: &Path, racy_seconds: u64) -> Option<String> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_nanos();
    let mut s = String::from(STAMP_HEADER);
    s.push('\n');
    for name in STAMPED {
        let md = match std::fs::metadata(dir.join(name)) {
            Ok(md) => md,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(_) => return None,
        };
        let mtime = md
            .modified()
            .ok()?
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?
            .as_nanos();
        #[cfg(unix)]
        let (ctime, inode) = {
            use std::os::unix::fs::MetadataExt;
            let ctime = (md.ctime() as i128 * 1_000_000_000 + md.ctime_nsec() as i128).max(0);
            (ctime as u128, md.ino())
        };
        #[cfg(not(unix))]
        let (ctime, inode) = (mtime, 0u64);
        if now.saturating_sub(mtime.max(ctime)) < racy_seconds as u128 * 1_000_000_000 {
            return None;
        }
        s.push_str(&format!("{name} {} {mtime} {ctime} {inode}\n", md.len()));
    }
    Some(s)
}

/// Writes the stamp under a temporary name and renames it into place (concurrent openers, such
/// as MPI ranks, each write a whole stamp). Returns whether it was written.
fn write_stamp(stamp: &Path, key: &str) -> bool {
    let tmp = stamp.with_extension(format!("tmp.{}", std::process::id()));
    let ok = std::fs::write(&tmp, key).is_ok() && std::fs::rename(&tmp, stamp).is_ok();
    if !ok {
        let _ = std::fs::remove_file(&tmp);
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{files, DatasetWriter, Meta, NoProgress};
    use std::path::PathBuf;

    /// A 4-vertex dataset (a directed 4-cycle, labels, one vertex per split) in `dir/ds`.
    fn make(dir: &Path) -> PathBuf {
        let out = dir.join("ds");
        let mut w = DatasetWriter::create(&out, false).unwrap();
        w.write_array::<u32>(files::INDPTR, &[0, 1, 2, 3, 4])
            .unwrap();
        w.write_array::<u32>(files::INDICES, &[1, 2, 3, 0]).unwrap();
        w.write_array::<i64>(files::LABEL, &[0, 1, -1, 1]).unwrap();
        w.write_array::<u32>(files::TRAIN, &[0]).unwrap();
        w.write_array::<u32>(files::VALID, &[1]).unwrap();
        w.write_array::<u32>(files::TEST, &[3]).unwrap();
        let meta = Meta {
            num_node: 4,
            num_edge: 4,
            num_class: 2,
            num_train_set: 1,
            num_valid_set: 1,
            num_test_set: 1,
            ..Meta::default()
        };
        w.finish(meta, &NoProgress).unwrap();
        out
    }

    fn write_u32(p: &Path, v: &[u32]) {
        std::fs::write(
            p,
            v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>(),
        )
        .unwrap();
    }

    fn check(dir: &Path, racy: u64) -> Result<IdCheck> {
        let ds = crate::Dataset::open(dir).unwrap();
        let t = &ds.topology;
        check_ids_remembered_within(dir, &t.indptr, &t.indices, 4, racy)
    }

    #[test]
    fn the_scan_is_remembered_until_the_ids_change() {
        let t = tempfile::tempdir().unwrap();
        let ds = make(t.path());
        let _ = std::fs::remove_file(ds.join(STAMP));
        assert!(matches!(
            check(&ds, 0),
            Ok(IdCheck::Scanned {
                remembered: true,
                ..
            })
        ));
        assert!(ds.join(STAMP).is_file());
        assert_eq!(check(&ds, 0).unwrap(), IdCheck::Remembered);
        // Damage of the same size, in place (the open dataset's map sees it): the stamp no
        // longer matches, so even with no racy window the scan runs and fails.
        let before = std::fs::read_to_string(ds.join(STAMP)).unwrap();
        let open = crate::Dataset::open(&ds).unwrap();
        write_u32(&ds.join(files::INDICES), &[1, 2, 7, 0]);
        let (p, ids) = (&open.topology.indptr, &open.topology.indices);
        let e = check_ids_remembered_within(&ds, p, ids, 4, 0)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("indices.bin: entry 2 = 7 (in the row of vertex 2) is out of range; expected a vertex id < NUM_NODE = 4"),
            "{e}"
        );
        // A failed scan leaves the old stamp as it was (it no longer matches anything).
        assert_eq!(std::fs::read_to_string(ds.join(STAMP)).unwrap(), before);
    }

    #[test]
    fn files_changed_within_the_racy_window_are_not_remembered() {
        let t = tempfile::tempdir().unwrap();
        let ds = make(t.path());
        let _ = std::fs::remove_file(ds.join(STAMP));
        assert!(matches!(
            check(&ds, 3600),
            Ok(IdCheck::Scanned {
                remembered: false,
                ..
            })
        ));
        assert!(!ds.join(STAMP).exists());
        // A stamp written by hand with the right identities is still not trusted inside the window.
        std::fs::write(ds.join(STAMP), stamp_key(&ds, 0).unwrap()).unwrap();
        assert!(matches!(check(&ds, 3600), Ok(IdCheck::Scanned { .. })));
        assert_eq!(check(&ds, 0).unwrap(), IdCheck::Remembered);
    }

    #[test]
    fn a_stamp_for_other_files_is_not_trusted() {
        let t = tempfile::tempdir().unwrap();
        let ds = make(t.path());
        std::fs::write(
            ds.join(STAMP),
            format!("{STAMP_HEADER}\nindices.bin 16 1 1 1\n"),
        )
        .unwrap();
        assert!(matches!(
            check(&ds, 0),
            Ok(IdCheck::Scanned {
                remembered: true,
                ..
            })
        ));
        assert_eq!(check(&ds, 0).unwrap(), IdCheck::Remembered);
    }

    #[test]
    fn labels_and_split_ids_out_of_range_are_caught_on_open() {
        let t = tempfile::tempdir().unwrap();
        let ds = make(t.path());
        let labels: Vec<u8> = [0i64, 1, 2, 1]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        std::fs::write(ds.join(files::LABEL), labels).unwrap();
        let e = crate::Dataset::open(&ds).unwrap_err().to_string();
        assert!(
            e.contains("label.bin: entry 2 (vertex 2) = 2, expected -1 (unlabelled) or a class in 0..=1 (NUM_CLASS = 2)"),
            "{e}"
        );
        let labels: Vec<u8> = [0i64, -2, 0, 1]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        std::fs::write(ds.join(files::LABEL), labels).unwrap();
        let e = crate::Dataset::open(&ds).unwrap_err().to_string();
        assert!(e.contains("entry 1 (vertex 1) = -2"), "{e}");
        std::fs::write(ds.join(files::LABEL), [0u8; 32]).unwrap();
        write_u32(&ds.join(files::VALID), &[4]);
        let e = crate::Dataset::open(&ds).unwrap_err().to_string();
        assert!(
            e.contains(
                "valid_set.bin: entry 0 = 4 is out of range; expected a vertex id < NUM_NODE = 4"
            ),
            "{e}"
        );
    }

    #[test]
    fn owner_of_finds_the_row_and_skips_empty_rows() {
        let p = Offsets::U32(crate::Array::from_vec(vec![0, 2, 2, 5]));
        let owners: Vec<u64> = (0..5).map(|i| owner_of(&p, i)).collect();
        assert_eq!(owners, [0, 0, 2, 2, 2]);
    }

    #[test]
    fn first_at_least_finds_the_first_out_of_range_entry_in_any_chunk() {
        let len = 3 * (1 << 16) + 17; // two full chunks and a partial one
        let mut a = vec![5u32; len];
        assert_eq!(first_at_least(&a, 6), None);
        assert_eq!(first_at_least(&a, 5), Some((0, 5)));
        for bad in [0, (1 << 16) - 1, 1 << 16, 2 * (1 << 16) + 3, len - 1] {
            let mut b = a.clone();
            b[bad] = 9;
            b[len - 1] = 7; // a later, smaller offender is not the first
            let want = if bad == len - 1 { (bad, 7) } else { (bad, 9) };
            assert_eq!(first_at_least(&b, 6), Some(want), "bad at {bad}");
        }
        a[100] = u32::MAX;
        let wide: Vec<u64> = a.iter().map(|&v| v as u64).collect();
        assert_eq!(first_at_least(&wide, 1 << 40), None);
        assert_eq!(first_at_least(&wide, 6), Some((100, u32::MAX as u64)));
        assert_eq!(first_at_least::<u32>(&[], 0), None);
    }
}
