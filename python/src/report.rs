//! `fanout.report`: the pictures of `fanout report`, drawn by the same crate.

use crate::errors::{raise, Kind};
use pyo3::prelude::*;
use std::path::PathBuf;

/// Draws metrics into the picture `out` (`.svg` or `.png`, written under a temporary name and
/// renamed) and returns `fanout report`'s one-line description of it. The metrics are the
/// JSON `text` (named "metrics" in errors), or else the file `path`. A bad output name,
/// an `out` that is the metrics file, or bad metrics raise `InvalidArgumentError` before
/// anything is written; a missing file `NotFoundError`; a file that cannot be read or a
/// picture that cannot be written `FanoutIOError`.
#[pyfunction]
#[pyo3(signature = (out, text=None, path=None))]
pub fn report(
    py: Python<'_>,
    out: PathBuf,
    text: Option<String>,
    path: Option<PathBuf>,
) -> PyResult<String> {
    fanout_report::check_output(&out, path.as_deref())
        .map_err(|e| raise(Kind::Invalid, e.to_string()))?;
    let (text, origin) = match (text, path) {
        (Some(t), _) => (t, "metrics".to_string()),
        (None, Some(p)) => match std::fs::read_to_string(&p) {
            Ok(t) => (t, p.display().to_string()),
            Err(e) => {
                let kind = if e.kind() == std::io::ErrorKind::NotFound {
                    Kind::NotFound
                } else {
                    Kind::Io
                };
                return Err(raise(kind, format!("{}: cannot read: {e}", p.display())));
            }
        },
        (None, None) => return Err(raise(Kind::Invalid, "report: no metrics given")),
    };
    let report =
        fanout_report::parse(&text, &origin).map_err(|e| raise(Kind::Invalid, e.to_string()))?;
    py.detach(|| fanout_report::render(&report, &out))
        .map_err(|e| raise(Kind::Io, e.to_string()))
}
