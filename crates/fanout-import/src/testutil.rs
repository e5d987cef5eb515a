//! Helpers for the importers' tests.

use crate::{import, Format, ImportOptions, ImportSummary};
use fanout_graph::{verify, Dataset, NoProgress};
use std::path::Path;

/// Imports, checks the result with `verify`, and opens it.
pub(crate) fn import_ok(
    format: Format,
    src: &Path,
    out: &Path,
    opts: &ImportOptions,
) -> (Dataset, ImportSummary) {
    let s = import(format, src, out, opts, &NoProgress)
        .unwrap_or_else(|e| panic!("import of {} failed: {e}", src.display()));
    let report = verify(out, &NoProgress).unwrap_or_else(|e| panic!("verify failed: {e}"));
    assert!(report.checksums_missing.is_empty(), "{report:?}");
    (Dataset::open(out).unwrap(), s)
}

/// Imports expecting failure; checks nothing was left at `out` and returns the message.
pub(crate) fn import_err(format: Format, src: &Path, out: &Path, opts: &ImportOptions) -> String {
    let existed = out.exists();
    let e = import(format, src, out, opts, &NoProgress)
        .map(|s| format!("{s:?}"))
        .expect_err("import should have failed");
    assert_eq!(
        out.exists(),
        existed,
        "a failed import changed {}",
        out.display()
    );
    if let Some(parent) = out.parent() {
        let leftovers: Vec<_> = std::fs::read_dir(parent)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
            .collect();
        assert!(leftovers.is_empty(), "temporary directories left behind");
    }
    e.to_string()
}

/// Every stored row as a vector of ids.
pub(crate) fn rows(ds: &Dataset) -> Vec<Vec<u64>> {
    (0..ds.num_nodes())
        .map(|v| ds.topology.row(v).iter().collect())
        .collect()
}
