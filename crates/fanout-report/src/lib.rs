//! Pictures of fanout's metrics, for a person to look at: `fanout report METRICS.json -o
//! run.svg`. A training run ([`input::TrainRun`]) becomes four panels: the stages' busy time per
//! epoch stacked, with the epoch's wall time and its compute and memory floors as lines (and
//! the floor of the flops done, where zero-skipping put it below the compute floor); the
//! loss; train and validation accuracy; the share of feature bytes served by the cache and by
//! Match-Reorder's reuse. Cache-sim rows become hit rate against cache ratio, one line per
//! policy. The format follows the output's extension (`.svg` or `.png`); the file is written
//! under a temporary name and renamed, so an existing picture is never left half-written.

pub mod input;
mod sim_chart;
mod train_chart;

pub use input::{load, parse, Report};

use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// What went wrong, as one line naming the file.
#[derive(Debug)]
pub struct Error(String);

impl Error {
    pub(crate) fn new(msg: String) -> Error {
        Error(msg)
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

/// Picture size in pixels (SVG user units).
const TRAIN_SIZE: (u32, u32) = (1280, 900);
const SIM_SIZE: (u32, u32) = (900, 600);

/// The family name every chart asks for; [`register_font`] binds it to the embedded font.
pub(crate) const FONT: &str = "sans-serif";

/// Binds [`FONT`] to the embedded DejaVu Sans subset (fonts/README.md), once per process:
/// plotters lays out text with it for both backends.
fn register_font() -> Result<(), Error> {
    static DONE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *DONE.get_or_init(|| {
        plotters::style::register_font(
            FONT,
            FontStyle::Normal,
            include_bytes!("../fonts/DejaVuSans-subset.ttf"),
        )
        .is_ok()
    });
    ok.then_some(())
        .ok_or_else(|| Error::new("the embedded font could not be loaded".into()))
}

/// The picture formats, chosen by the output's extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Scalable vector graphics (text stays text).
    Svg,
    /// A PNG bitmap.
    Png,
}

impl Format {
    /// The format for `path`'s extension (case-insensitive), or an error naming what is accepted.
    pub fn of(path: &Path) -> Result<Format, Error> {
        match path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            Some("svg") => Ok(Format::Svg),
            Some("png") => Ok(Format::Png),
            _ => Err(Error::new(format!(
                "{}: unknown picture format; expected a name ending in .svg or .png",
                path.display()
            ))),
        }
    }
}

/// Checks the picture's name `out` before anything is read: an extension naming a format, and
/// not the metrics file `input` itself (drawing over it would lose the metrics).
pub fn check_output(out: &Path, input: Option<&Path>) -> Result<Format, Error> {
    let format = Format::of(out)?;
    let same = |i: &Path| same_file(out, i);
    if input.is_some_and(same) {
        return Err(Error::new(format!(
            "{}: the picture would replace the metrics it is drawn from; name another picture",
            out.display()
        )));
    }
    Ok(format)
}

/// Whether `a` and `b` name one file: the same device and inode where both exist on Unix (so
/// a hard link counts), else the same canonical path, else the same path as given.
fn same_file(a: &Path, b: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let (Ok(x), Ok(y)) = (std::fs::metadata(a), std::fs::metadata(b)) {
            return (x.dev(), x.ino()) == (y.dev(), y.ino());
        }
    }
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// Draws `report` into `out` (format from its extension), through a temporary file renamed
/// into place. Returns a one-line description of what was drawn.
pub fn render(report: &Report, out: &Path) -> Result<String, Error> {
    let format = Format::of(out)?;
    register_font()?;
    let size = match report {
        Report::Train(_) => TRAIN_SIZE,
        Report::CacheSim(_) => SIM_SIZE,
    };
    let fail = |e: String| Error::new(format!("{}: {e}", out.display()));
    // The temporary keeps the extension: the PNG encoder picks the format from it.
    let tmp = temporary_beside(out);
    let drawn = match format {
        Format::Svg => {
            let mut svg = String::new();
            let what = draw(
                report,
                SVGBackend::with_string(&mut svg, size).into_drawing_area(),
            )
            .map_err(fail)?;
            std::fs::write(&tmp, svg).map_err(|e| {
                let _ = std::fs::remove_file(&tmp);
                fail(format!("cannot write {}: {e}", tmp.display()))
            })?;
            what
        }
        Format::Png => {
            let area = BitMapBackend::new(&tmp, size).into_drawing_area();
            draw(report, area).map_err(|e| {
                let _ = std::fs::remove_file(&tmp);
                fail(e)
            })?
        }
    };
    std::fs::rename(&tmp, out).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        fail(format!("cannot rename {} into place: {e}", tmp.display()))
    })?;
    Ok(drawn)
}

fn draw<DB: DrawingBackend>(
    report: &Report,
    root: DrawingArea<DB, plotters::coord::Shift>,
) -> Result<String, String> {
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let what = match report {
        Report::Train(run) => train_chart::draw(run, &root)?,
        Report::CacheSim(rows) => sim_chart::draw(rows, &root)?,
    };
    root.present().map_err(|e| e.to_string())?;
    Ok(what)
}

/// `dir/.name.tmp-PID.ext`: beside the output (same file system, so the rename is atomic).
fn temporary_beside(out: &Path) -> PathBuf {
    let name = out.file_name().and_then(|n| n.to_str()).unwrap_or("report");
    let ext = out.extension().and_then(|e| e.to_str()).unwrap_or("svg");
    out.with_file_name(format!(".{name}.tmp-{}.{ext}", std::process::id()))
}

/// A legend swatch for a dashed line (two short strokes of `$style`): a closure for
/// `SeriesAnno::legend`. A macro because the composed element's type cannot be named outside
/// plotters.
macro_rules! dashed_swatch {
    ($style:expr) => {{
        let style: plotters::style::ShapeStyle = $style;
        move |at: (i32, i32)| {
            plotters::element::EmptyElement::at(at)
                + plotters::element::PathElement::new(vec![(0, 0), (8, 0)], style)
                + plotters::element::PathElement::new(vec![(12, 0), (20, 0)], style)
        }
    }};
}
pub(crate) use dashed_swatch;

/// The palette of the series, in order (colour-blind-safe Okabe-Ito colours).
pub(crate) const PALETTE: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(230, 159, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(213, 94, 0),
    RGBColor(240, 228, 66),
    RGBColor(0, 0, 0),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::{Epoch, SimRow, TrainRun};

    fn epoch(i: u64, sample_s: f64, floors: bool, skipped: bool) -> Epoch {
        Epoch {
            epoch: i,
            wall_s: 1.0,
            sample_s,
            extract_s: 0.2,
            compute_s: 0.6,
            allreduce_s: 0.0,
            compute_floor_s: floors.then_some(0.5),
            performed_floor_s: floors.then_some(if skipped { 0.3 } else { 0.5 }),
            memory_floor_s: floors.then_some(0.1),
            loss: 2.0 - i as f64 * 0.5,
            train_acc: 0.3 + i as f64 * 0.1,
            val_acc: Some(0.35 + i as f64 * 0.1),
            cache_share: 0.25,
            reuse_share: 0.05,
        }
    }

    fn run(floors: bool) -> Report {
        run_with(floors, false)
    }

    /// [`run`], with weight gradients that skipped zeros (a floor of the flops done below
    /// the compute floor) when `skipped`.
    fn run_with(floors: bool, skipped: bool) -> Report {
        Report::Train(TrainRun {
            model: "sage".into(),
            dataset: "data/cora".into(),
            strategy: "single".into(),
            test_acc: Some(0.8),
            stopped: None,
            median_epoch_s: 1.0,
            median_floor_s: floors.then_some(0.5),
            epochs: [0.1, 0.2, 0.4]
                .iter()
                .enumerate()
                .map(|(i, &s)| epoch(i as u64, s, floors, skipped))
                .collect(),
        })
    }

    /// Heights of the filled rectangles of colour `fill` wider than the legend's swatches.
    fn bar_heights(svg: &str, fill: &str) -> Vec<f64> {
        svg.lines()
            .filter(|l| l.starts_with("<rect") && l.contains(&format!("fill=\"{fill}\"")))
            .filter_map(|l| {
                let attr = |k: &str| -> Option<f64> {
                    let at = l.find(&format!(" {k}=\""))? + k.len() + 3;
                    l[at..].split('"').next()?.parse().ok()
                };
                (attr("width")? > 20.0).then(|| attr("height")).flatten()
            })
            .collect()
    }

    #[test]
    fn train_svg_draws_bars_in_proportion_and_floors_only_when_reported() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("run.svg");
        let what = render(&run(true), &out).unwrap();
        assert!(what.starts_with("3 epochs"), "{what}");
        let svg = std::fs::read_to_string(&out).unwrap();
        assert!(
            svg.contains("median epoch 1.00 s = 2.00x its floor"),
            "title"
        );
        assert!(svg.contains("epoch time, against the floors"), "caption");
        for label in [
            "sample",
            "extract",
            "train",
            "compute floor",
            "memory floor",
            "validation",
        ] {
            // plotters writes a text element's content on a line of its own.
            assert!(svg.lines().any(|l| l.trim() == label), "{label}");
        }
        // Sample bars (the first palette colour): 0.1, 0.2, 0.4 s, so heights 1 : 2 : 4.
        let h = bar_heights(&svg, "#0072B2");
        assert_eq!(h.len(), 3, "{h:?}");
        assert!(
            (h[1] / h[0] - 2.0).abs() < 0.1 && (h[2] / h[0] - 4.0).abs() < 0.1,
            "{h:?}"
        );
        // Extract bars are all 0.2 s: the same height as the second sample bar.
        let x = bar_heights(&svg, "#E69F00");
        assert!(x.iter().all(|&v| (v - h[1]).abs() <= 1.0), "{x:?} vs {h:?}");
        // The floor of the flops done is drawn only where it is below the compute floor.
        assert!(!svg.contains("flops done"));
        render(&run_with(true, true), &out).unwrap();
        let svg = std::fs::read_to_string(&out).unwrap();
        assert!(svg.lines().any(|l| l.trim() == "floor of the flops done"));
        // Without floors in the metrics, none is drawn or named.
        render(&run(false), &out).unwrap();
        let svg = std::fs::read_to_string(&out).unwrap();
        assert!(!svg.contains("compute floor") && !svg.contains("memory floor"));
        assert!(!svg.contains("flops done"));
        assert!(!svg.contains("its floor") && !svg.contains("against the floors"));
    }

    /// The bytes panel says in words when no epoch had a cache hit or a reused byte, and only
    /// then.
    #[test]
    fn a_run_without_cache_or_reuse_says_so_in_its_bytes_panel() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("run.svg");
        let note = crate::train_chart::NO_SAVED_BYTES;
        render(&run(true), &out).unwrap();
        assert!(!std::fs::read_to_string(&out).unwrap().contains(note));
        let Report::Train(mut r) = run(true) else {
            unreachable!("run() is a training run")
        };
        for e in &mut r.epochs {
            (e.cache_share, e.reuse_share) = (0.0, 0.0);
        }
        r.epochs[1].reuse_share = 0.01;
        render(&Report::Train(r.clone()), &out).unwrap();
        assert!(!std::fs::read_to_string(&out).unwrap().contains(note));
        r.epochs[1].reuse_share = 0.0;
        render(&Report::Train(r), &out).unwrap();
        let svg = std::fs::read_to_string(&out).unwrap();
        assert!(svg.lines().any(|l| l.trim() == note), "the note");
    }

    /// Renders `report` on another thread; `None` if it takes more than a minute (a hang).
    fn render_within_a_minute(report: Report, out: PathBuf) -> Option<Result<String, Error>> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(render(&report, &out)));
        rx.recv_timeout(std::time::Duration::from_secs(60)).ok()
    }

    #[test]
    fn extreme_figures_and_epochs_out_of_order_still_draw() {
        let t = tempfile::tempdir().unwrap();
        let Report::Train(mut r) = run(true) else {
            unreachable!()
        };
        // The largest figures the reader accepts, on every stacked stage and line.
        let big = input::MAX_MAGNITUDE;
        for x in &mut r.epochs {
            (x.wall_s, x.sample_s, x.extract_s, x.compute_s) = (big, big, big, big);
            (x.allreduce_s, x.compute_floor_s, x.loss) = (big, Some(big), big);
        }
        r.epochs.reverse();
        r.epochs[0].epoch = 7;
        let out = t.path().join("big.svg");
        let drawn = render_within_a_minute(Report::Train(r), out.clone());
        assert!(drawn.expect("rendering hung").is_ok());
        // Every epoch's bar is inside the x axis: 3 sample bars drawn, none clipped away.
        let svg = std::fs::read_to_string(&out).unwrap();
        assert_eq!(bar_heights(&svg, "#0072B2").len(), 3);
        let rows = vec![SimRow {
            dataset: "d".into(),
            policy: "degree".into(),
            ratio: big,
            hit_rate: big,
            setting: String::new(),
        }];
        let drawn = render_within_a_minute(Report::CacheSim(rows), t.path().join("sim.svg"));
        assert!(drawn.expect("rendering hung").is_ok());
    }

    #[test]
    fn png_has_the_picture_size_and_replaces_the_old_file_whole() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("run.PNG");
        std::fs::write(&out, b"old").unwrap();
        render(&run(true), &out).unwrap();
        let png = std::fs::read(&out).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let be = |i: usize| u32::from_be_bytes(png[i..i + 4].try_into().unwrap());
        assert_eq!((be(16), be(20)), TRAIN_SIZE);
        // Only the picture is left in the folder (no temporary).
        assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 1);
    }

    #[test]
    fn bad_outputs_are_errors_that_leave_nothing_behind() {
        let t = tempfile::tempdir().unwrap();
        let e = render(&run(true), &t.path().join("run.pdf"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("run.pdf: unknown picture format; expected"),
            "{e}"
        );
        let missing = t.path().join("no/such/dir/run.svg");
        let e = render(&run(true), &missing).unwrap_err().to_string();
        assert!(e.contains("cannot write"), "{e}");
        assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 0);
    }

    #[test]
    fn cache_sim_draws_one_line_per_policy_through_its_points() {
        let row = |dataset: &str, policy: &str, ratio: f64, hit: f64| SimRow {
            dataset: dataset.into(),
            policy: policy.into(),
            ratio,
            hit_rate: hit,
            setting: "khop, fanouts 15,10,5, batch 8000".into(),
        };
        let rows = vec![
            row("cora", "degree", 0.2, 0.3),
            row("cora", "degree", 0.1, 0.15),
            row("cora", "random", 0.1, 0.1),
            row("cora", "random", 0.2, 0.2),
        ];
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("sim.svg");
        let what = render(&Report::CacheSim(rows.clone()), &out).unwrap();
        assert_eq!(what, "hit rate against cache ratio: 2 series, 4 points");
        let svg = std::fs::read_to_string(&out).unwrap();
        assert!(svg.contains("cora: cache hit rate by policy (khop, fanouts 15,10,5"));
        // Each policy's line has its two points, in ratio order (x rises along the line).
        for colour in ["#0072B2", "#E69F00"] {
            let line = svg
                .lines()
                .find(|l| {
                    l.starts_with("<polyline") && l.contains(colour) && l.matches(',').count() == 2
                })
                .unwrap_or_else(|| panic!("no two-point line in {colour}"));
            let pts: Vec<f64> = line
                .split("points=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap()
                .split_whitespace()
                .map(|p| p.split(',').next().unwrap().parse().unwrap())
                .collect();
            assert!(pts[0] < pts[1], "{line}");
        }
        let e = render(&Report::CacheSim(Vec::new()), &out).unwrap_err();
        assert!(e.to_string().contains("no cache-sim rows"), "{e}");
        let mut two = rows;
        two.push(row("citeseer", "degree", 0.1, 0.2));
        render(&Report::CacheSim(two), &out).unwrap();
        let svg = std::fs::read_to_string(&out).unwrap();
        assert!(svg.contains("citeseer degree") && svg.contains("cora random"));
    }
}
