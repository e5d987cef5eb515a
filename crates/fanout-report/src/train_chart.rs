//! The four panels of a training run.

use crate::input::{Epoch, TrainRun};
use crate::{dashed_swatch, FONT, PALETTE};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

type Area<'a, DB> = DrawingArea<DB, Shift>;

/// A per-epoch figure, and one that may be absent.
type Stat = fn(&Epoch) -> f64;
type MaybeStat = fn(&Epoch) -> Option<f64>;

/// Draws `run` on `root`; returns what was drawn, in words.
pub(crate) fn draw<DB: DrawingBackend>(run: &TrainRun, root: &Area<DB>) -> Result<String, String> {
    let floor = run
        .median_floor_s
        .filter(|f| *f > 0.0)
        .map_or(String::new(), |f| {
            format!(" = {:.2}x its floor", run.median_epoch_s / f)
        });
    let end = match (run.test_acc, &run.stopped) {
        (Some(a), _) => format!("test accuracy {a:.4}"),
        (None, Some(_)) => format!(
            "stopped after {} epoch{}",
            run.epochs.len(),
            if run.epochs.len() == 1 { "" } else { "s" }
        ),
        (None, None) => "no test accuracy".into(),
    };
    let title = format!(
        "{} on {} ({}): median epoch {:.2} s{floor}, {end}",
        run.model, run.dataset, run.strategy, run.median_epoch_s
    );
    let body = root.titled(&title, (FONT, 22)).map_err(|e| e.to_string())?;
    let panels = body.split_evenly((2, 2));
    stages(&run.epochs, &panels[0]).map_err(|e| e.to_string())?;
    loss(&run.epochs, &panels[1]).map_err(|e| e.to_string())?;
    accuracy(run, &panels[2]).map_err(|e| e.to_string())?;
    bytes(&run.epochs, &panels[3]).map_err(|e| e.to_string())?;
    let n = run.epochs.len();
    Ok(format!(
        "{n} epoch{}: stage times and floors, loss, accuracy, cache hit rate",
        if n == 1 { "" } else { "s" }
    ))
}

type DrawResult<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// The x range covering every epoch number in `e`, whatever their order, with room for bars.
fn epochs_axis(e: &[Epoch]) -> std::ops::Range<f64> {
    let lo = e.iter().map(|x| x.epoch).min().unwrap_or(0) as f64;
    let hi = e.iter().map(|x| x.epoch).max().unwrap_or(0) as f64;
    lo - 0.6..hi + 0.6
}

type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

fn legend<'a, DB: DrawingBackend + 'a>(
    chart: &mut Chart<'a, DB>,
    at: SeriesLabelPosition,
) -> DrawResult<DB> {
    chart
        .configure_series_labels()
        .position(at)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .label_font((FONT, 13))
        .draw()
}

/// Stacked busy seconds per stage, with the epoch's wall time and floors as lines.
fn stages<DB: DrawingBackend>(e: &[Epoch], area: &Area<DB>) -> DrawResult<DB> {
    let with_allreduce = e.iter().any(|x| x.allreduce_s > 0.0);
    let mut parts: Vec<(&str, Stat)> = vec![
        ("sample", |x| x.sample_s),
        ("extract", |x| x.extract_s),
        ("train", |x| x.compute_s),
    ];
    if with_allreduce {
        parts.push(("all-reduce", |x| x.allreduce_s));
    }
    let stacked = |x: &Epoch| parts.iter().map(|(_, f)| f(x)).sum::<f64>();
    let line = |f: MaybeStat| -> Vec<(f64, f64)> {
        e.iter()
            .filter_map(|x| f(x).map(|v| (x.epoch as f64, v)))
            .collect()
    };
    // The floor of the flops done is below the compute floor where weight gradients skipped
    // zeros (not drawn where it coincides with it everywhere); drawn last, with short dashes,
    // so that a memory floor of the same height still shows between them.
    let floors: [(&str, MaybeStat, RGBColor, (u32, u32)); 3] = [
        (
            "compute floor",
            |x| x.compute_floor_s,
            RGBColor(200, 0, 0),
            (8, 5),
        ),
        (
            "memory floor",
            |x| x.memory_floor_s,
            RGBColor(120, 60, 160),
            (8, 5),
        ),
        (
            "floor of the flops done",
            |x| {
                x.performed_floor_s
                    .filter(|&p| Some(p) != x.compute_floor_s)
            },
            RGBColor(240, 110, 110),
            (4, 9),
        ),
    ];
    // The legend sits in the upper right, over the last epochs' bars: the axis reaches far
    // enough above the data for it, about 6% of the panel's height per entry (the stages,
    // the epoch, and each floor drawn).
    let entries = parts.len() + 1 + floors.iter().filter(|fl| !line(fl.1).is_empty()).count();
    let legend_share = 0.04 + 0.062 * entries as f64;
    let top = e
        .iter()
        .map(|x| {
            stacked(x)
                .max(x.wall_s)
                .max(x.compute_floor_s.unwrap_or(0.0))
                .max(x.memory_floor_s.unwrap_or(0.0))
        })
        .fold(0.0, f64::max)
        .max(1e-3)
        / (1.0 - legend_share);
    let caption = if e.iter().any(|x| x.compute_floor_s.is_some()) {
        "Busy time per stage (stacked) and epoch time, against the floors"
    } else {
        "Busy time per stage (stacked) and epoch time"
    };
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT, 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(epochs_axis(e), 0.0..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc("epoch")
        .y_desc("seconds")
        .x_labels(e.len().min(12))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .label_style((FONT, 12))
        .draw()?;
    for (k, (name, f)) in parts.iter().enumerate() {
        let colour = PALETTE[k];
        chart
            .draw_series(e.iter().map(|x| {
                let below: f64 = parts[..k].iter().map(|(_, g)| g(x)).sum();
                let c = x.epoch as f64;
                Rectangle::new([(c - 0.3, below), (c + 0.3, below + f(x))], colour.filled())
            }))?
            .label(*name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
    }
    let wall = line(|x| Some(x.wall_s));
    chart
        .draw_series(LineSeries::new(wall.clone(), BLACK.stroke_width(2)))?
        .label("epoch (wall)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(2)));
    chart.draw_series(wall.iter().map(|&p| Circle::new(p, 3, BLACK.filled())))?;
    for (name, f, colour, (dash, gap)) in floors {
        let pts = line(f);
        if pts.is_empty() {
            continue;
        }
        let style = colour.stroke_width(2);
        chart
            .draw_series(DashedLineSeries::new(pts, dash, gap, style))?
            .label(name)
            .legend(dashed_swatch!(style));
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)
}

fn loss<DB: DrawingBackend>(e: &[Epoch], area: &Area<DB>) -> DrawResult<DB> {
    let top = e.iter().map(|x| x.loss).fold(0.0, f64::max).max(1e-3) * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption("Training loss", (FONT, 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(epochs_axis(e), 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("epoch")
        .y_desc("mean loss")
        .x_labels(e.len().min(12))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .label_style((FONT, 12))
        .draw()?;
    let pts: Vec<(f64, f64)> = e.iter().map(|x| (x.epoch as f64, x.loss)).collect();
    let c = PALETTE[0];
    chart.draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?;
    chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled())))?;
    Ok(())
}

fn accuracy<DB: DrawingBackend>(run: &TrainRun, area: &Area<DB>) -> DrawResult<DB> {
    let e = &run.epochs;
    let mut chart = ChartBuilder::on(area)
        .caption("Accuracy", (FONT, 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(epochs_axis(e), 0.0..1.05)?;
    chart
        .configure_mesh()
        .x_desc("epoch")
        .y_desc("accuracy")
        .x_labels(e.len().min(12))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .label_style((FONT, 12))
        .draw()?;
    let series: [(&str, Vec<(f64, f64)>); 2] = [
        (
            "train (epoch's batches)",
            e.iter().map(|x| (x.epoch as f64, x.train_acc)).collect(),
        ),
        (
            "validation",
            e.iter()
                .filter_map(|x| x.val_acc.map(|v| (x.epoch as f64, v)))
                .collect(),
        ),
    ];
    for (k, (name, pts)) in series.into_iter().enumerate() {
        let c = PALETTE[k];
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled())))?;
    }
    if let Some(acc) = run.test_acc {
        let r = epochs_axis(e);
        let test = RGBColor(200, 0, 0).stroke_width(2);
        chart
            .draw_series(DashedLineSeries::new(
                vec![(r.start, acc), (r.end, acc)],
                8,
                5,
                test,
            ))?
            .label(format!("test, best model ({acc:.4})"))
            .legend(dashed_swatch!(test));
    }
    legend(&mut chart, SeriesLabelPosition::LowerRight)
}

fn bytes<DB: DrawingBackend>(e: &[Epoch], area: &Area<DB>) -> DrawResult<DB> {
    let mut chart = ChartBuilder::on(area)
        .caption("Feature bytes not read from the host store", (FONT, 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(epochs_axis(e), 0.0..105.0)?;
    chart
        .configure_mesh()
        .x_desc("epoch")
        .y_desc("% of the epoch's feature bytes")
        .x_labels(e.len().min(12))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .label_style((FONT, 12))
        .draw()?;
    let series: [(&str, Stat); 2] = [
        ("cache hits", |x| x.cache_share),
        ("reused from the previous batch", |x| x.reuse_share),
    ];
    for (k, (name, f)) in series.into_iter().enumerate() {
        let c = PALETTE[k + 2];
        let pts: Vec<(f64, f64)> = e.iter().map(|x| (x.epoch as f64, 100.0 * f(x))).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled())))?;
    }
    if e.iter()
        .all(|x| x.cache_share == 0.0 && x.reuse_share == 0.0)
    {
        // Two lines flat at zero read like a broken cache: say what they mean.
        let r = epochs_axis(e);
        chart.draw_series(std::iter::once(Text::new(
            NO_SAVED_BYTES,
            (r.start + 0.05 * (r.end - r.start), 55.0),
            (FONT, 14),
        )))?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)
}

/// The note in the bytes panel of a run that read every feature byte from the host store.
pub(crate) const NO_SAVED_BYTES: &str =
    "every feature byte was read from the host store (no cache hit, nothing reused)";
