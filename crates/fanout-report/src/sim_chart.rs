//! Cache-sim rows: hit rate against cache ratio, one line per policy (and dataset, when the
//! file holds several).

use crate::input::SimRow;
use crate::{dashed_swatch, FONT, PALETTE};
use plotters::coord::Shift;
use plotters::prelude::*;

/// Draws `rows` on `root`; returns what was drawn, in words.
pub(crate) fn draw<DB: DrawingBackend>(
    rows: &[SimRow],
    root: &DrawingArea<DB, Shift>,
) -> Result<String, String> {
    if rows.is_empty() {
        return Err("no cache-sim rows to draw".into());
    }
    // Series in first-appearance order.
    let several = rows.iter().any(|r| r.dataset != rows[0].dataset);
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for r in rows {
        let name = if several {
            format!("{} {}", r.dataset, r.policy)
        } else {
            r.policy.clone()
        };
        let point = (100.0 * r.ratio, 100.0 * r.hit_rate);
        match series.iter_mut().find(|(n, _)| *n == name) {
            Some((_, pts)) => pts.push(point),
            None => series.push((name, vec![point])),
        }
    }
    for (_, pts) in &mut series {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    let title = if several {
        "Cache hit rate by policy".to_string()
    } else {
        format!(
            "{}: cache hit rate by policy ({})",
            rows[0].dataset, rows[0].setting
        )
    };
    let max_x = rows
        .iter()
        .map(|r| 100.0 * r.ratio)
        .fold(0.0, f64::max)
        .max(1e-3);
    let max_y = rows
        .iter()
        .map(|r| 100.0 * r.hit_rate)
        .fold(0.0, f64::max)
        .max(1.0);
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let mut chart = ChartBuilder::on(root)
        .caption(&title, (FONT, 18))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..max_x * 1.05, 0.0..(max_y * 1.15).min(105.0))
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("cached vertices (% of the graph)")
        .y_desc("hit rate (% of feature bytes)")
        .label_style((FONT, 13))
        .draw()
        .map_err(err)?;
    for (k, (name, pts)) in series.iter().enumerate() {
        let c = PALETTE[k % PALETTE.len()];
        // The optimal policy (the bound) dashed, the others solid.
        let style = c.stroke_width(2);
        if name.ends_with("optimal") {
            chart
                .draw_series(DashedLineSeries::new(pts.clone(), 8, 5, style))
                .map_err(err)?
                .label(name.as_str())
                .legend(dashed_swatch!(style));
        } else {
            chart
                .draw_series(LineSeries::new(pts.clone(), style))
                .map_err(err)?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        }
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled())))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .label_font((FONT, 13))
        .draw()
        .map_err(err)?;
    Ok(format!(
        "hit rate against cache ratio: {} series, {} points",
        series.len(),
        rows.len()
    ))
}
