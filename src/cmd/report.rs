//! `fanout report`: a picture of a run's metrics JSON (training) or of cache-sim rows.

use clap::Args;
use std::path::PathBuf;

/// Draw a run's metrics as a picture (SVG or PNG)
///
/// From `fanout train --metrics-out METRICS.json`: the stages' busy time per epoch, stacked,
/// with the epoch's wall time and its compute and memory floors as lines; the loss; train and
/// validation accuracy; the share of feature bytes served by the cache and by reuse. From
/// `fanout cache-sim --json > sim.json`: hit rate against cache ratio, one line per policy.
///
/// Examples:
///   fanout train --metrics-out run.json && fanout report run.json -o run.svg
///   fanout cache-sim --dataset data/cora --json > sim.json && fanout report sim.json -o sim.png
#[derive(Args)]
#[command(verbatim_doc_comment)]
pub struct ReportArgs {
    /// Metrics JSON of `fanout train --metrics-out`, or the output of `fanout cache-sim --json`.
    pub input: PathBuf,
    /// The picture to write: a name ending in .svg or .png (default: INPUT with .svg), never
    /// INPUT itself.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

/// Reads the metrics, draws them and says what was written.
pub fn run(a: &ReportArgs) -> Result<(), String> {
    let out = a
        .output
        .clone()
        .unwrap_or_else(|| a.input.with_extension("svg"));
    // Refuse a bad name (or the input's own) before reading anything.
    fanout_report::check_output(&out, Some(&a.input)).map_err(|e| e.to_string())?;
    let report = fanout_report::load(&a.input).map_err(|e| e.to_string())?;
    let what = fanout_report::render(&report, &out).map_err(|e| e.to_string())?;
    println!("wrote {}: {what}", out.display());
    Ok(())
}
