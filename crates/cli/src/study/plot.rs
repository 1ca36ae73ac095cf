//! One SVG per figure, in the shape the paper draws it: latency against throughput
//! curves, grouped bars, stacked per-phase bars. SVG only, text laid out by plotters'
//! built-in estimate (no font library), as `crate::plot`.

use super::figure::{FigureSpec, Point, Shape, PHASES};
use crate::plot::{DrawError, PlotError};
use plotters::prelude::*;
use std::path::Path;

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;
type Res = Result<(), DrawError>;

fn color(i: usize) -> RGBColor {
    const C: [RGBColor; 8] = [
        RGBColor(31, 119, 180),
        RGBColor(214, 39, 40),
        RGBColor(44, 160, 44),
        RGBColor(255, 127, 14),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
    ];
    C[i % C.len()]
}

/// Draws figure `f` with `points` to `path`.
pub fn figure(f: &FigureSpec, points: &[Point], path: &Path) -> Result<(), PlotError> {
    let size = match f.shape {
        Shape::Curve => (900, 560),
        _ => (1100, 520),
    };
    let root = SVGBackend::new(path, size).into_drawing_area();
    let labels: Vec<&str> = f.series.iter().map(|s| s.label.as_str()).collect();
    let drawn = root.fill(&WHITE).and_then(|()| {
        match f.shape {
            Shape::Curve => curve(&root, &f.title, &labels, points),
            Shape::Bars | Shape::Rates | Shape::Scaling => {
                bars(&root, &f.title, f.shape, &labels, &f.coroutines, points)
            }
            Shape::Phases => stacked(&root, &f.title, &labels, &f.coroutines, points),
        }?;
        root.present()
    });
    drawn.map_err(|source| PlotError::Draw {
        path: path.to_path_buf(),
        source,
    })
}

fn of<'a>(points: &'a [Point], series: &str) -> Vec<&'a Point> {
    let mut v: Vec<&Point> = points.iter().filter(|p| p.series == series).collect();
    v.sort_by_key(|p| p.coroutines);
    v
}

/// Median latency against throughput, one line per series, each point labelled with
/// its coroutine count.
fn curve(root: &Area<'_>, title: &str, labels: &[&str], points: &[Point]) -> Res {
    let x_max = points.iter().map(|p| p.committed_per_s).fold(0.0, f64::max) * 1.1 + 1.0;
    let y_max = points.iter().map(|p| p.p50_us).fold(0.0, f64::max) * 1.15 + 1.0;
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 16))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("committed transactions / s (all nodes)")
        .y_desc("median latency (µs)")
        .x_label_formatter(&|x| super::figure::fmt_num(*x))
        .draw()?;
    for (i, label) in labels.iter().enumerate() {
        let c = color(i);
        let pts: Vec<(f64, f64)> = of(points, label)
            .iter()
            .map(|p| (p.committed_per_s, p.p50_us))
            .collect();
        if pts.is_empty() {
            continue;
        }
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?
            .label(*label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart.draw_series(pts.iter().map(|&(x, y)| Circle::new((x, y), 4, c.filled())))?;
        chart.draw_series(of(points, label).iter().map(|p| {
            Text::new(
                format!("{}", p.coroutines),
                (p.committed_per_s, p.p50_us),
                ("sans-serif", 11),
            )
        }))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;
    Ok(())
}

/// Two panels of grouped bars, a group per coroutine count and a bar per series:
/// throughput, and median latency with the 99th percentile as a thin line (`Bars`), RPC
/// requests per second (`Rates`), or throughput per CPU-second beside per second
/// (`Scaling`).
fn bars(
    root: &Area<'_>,
    title: &str,
    shape: Shape,
    labels: &[&str],
    coroutines: &[usize],
    points: &[Point],
) -> Res {
    let root = root.titled(title, ("sans-serif", 16))?;
    let (left, right) = root.split_horizontally(550);
    let find = |s: &str, c: usize| points.iter().find(|p| p.series == s && p.coroutines == c);
    let groups = coroutines.len();
    let n = labels.len().max(1);
    let width = 0.8 / n as f64;
    // Bar (group g, series i) spans [g - 0.4 + i w, g - 0.4 + (i + 1) w].
    let x0 = |g: usize, i: usize| g as f64 - 0.4 + i as f64 * width;
    let group_label = |x: &f64| {
        let g = x.round();
        if (x - g).abs() < 1e-6 && g >= 0.0 && (g as usize) < groups {
            format!("{} coroutines", coroutines[g as usize])
        } else {
            String::new()
        }
    };
    type Get = fn(&Point) -> f64;
    let panels: [(&Area<'_>, &str, Get, Option<Get>); 2] = match shape {
        Shape::Scaling => [
            (
                &left,
                "committed / CPU-second",
                |p| p.committed_per_cpu_s,
                None,
            ),
            (&right, "committed / s", |p| p.committed_per_s, None),
        ],
        Shape::Rates => [
            (&left, "committed / s", |p| p.committed_per_s, None),
            (&right, "RPC requests / s", |p| p.rpc_requests_per_s, None),
        ],
        _ => [
            (&left, "committed / s", |p| p.committed_per_s, None),
            (
                &right,
                "latency µs (bar p50, line p99)",
                |p| p.p50_us,
                Some(|p| p.p99_us),
            ),
        ],
    };
    for (area, y_desc, get, upper) in panels {
        let y_max = points
            .iter()
            .map(|p| upper.map_or(get(p), |u| u(p).max(get(p))))
            .fold(0.0, f64::max)
            * 1.35 // room above the bars for the legend
            + 1.0;
        let mut chart = ChartBuilder::on(area)
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(65)
            .build_cartesian_2d(-0.5..groups as f64 - 0.5, 0.0..y_max)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(groups.max(1))
            .x_label_formatter(&group_label)
            .y_desc(y_desc)
            .y_label_formatter(&|y| super::figure::fmt_num(*y))
            .draw()?;
        for (i, label) in labels.iter().enumerate() {
            let c = color(i);
            let bars: Vec<(f64, f64)> = coroutines
                .iter()
                .enumerate()
                .filter_map(|(g, &co)| find(label, co).map(|p| (x0(g, i), get(p))))
                .collect();
            chart
                .draw_series(bars.iter().map(|&(x, y)| {
                    Rectangle::new([(x, 0.0), (x + width * 0.9, y)], c.mix(0.8).filled())
                }))?
                .label(*label)
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
            if let Some(u) = upper {
                chart.draw_series(coroutines.iter().enumerate().filter_map(|(g, &co)| {
                    find(label, co).map(|p| {
                        let x = x0(g, i) + width * 0.45;
                        PathElement::new(vec![(x, get(p)), (x, u(p))], BLACK.stroke_width(2))
                    })
                }))?;
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .border_style(BLACK)
            .background_style(WHITE)
            .draw()?;
    }
    Ok(())
}

/// A stacked bar of mean µs per phase for every (coroutine count, series).
fn stacked(
    root: &Area<'_>,
    title: &str,
    labels: &[&str],
    coroutines: &[usize],
    points: &[Point],
) -> Res {
    let bars: Vec<(String, Option<&Point>)> = coroutines
        .iter()
        .flat_map(|&c| {
            labels.iter().map(move |l| {
                (
                    format!("{l} ({c})"),
                    points.iter().find(|p| p.series == *l && p.coroutines == c),
                )
            })
        })
        .collect();
    let total = |p: &Point| {
        PHASES
            .iter()
            .map(|ph| p.phase_means_us.get(*ph).copied().unwrap_or(0.0))
            .sum::<f64>()
    };
    let y_max = bars
        .iter()
        .filter_map(|b| b.1.map(total))
        .fold(0.0, f64::max)
        * 1.35 // room above the bars for the legend
        + 1.0;
    let n = bars.len();
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 16))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d(-0.5..n as f64 - 0.5, 0.0..y_max)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n.max(1))
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < n {
                bars[i as usize].0.clone()
            } else {
                String::new()
            }
        })
        .y_desc("mean µs per transaction (coroutines in brackets)")
        .draw()?;
    for (k, phase) in PHASES.iter().enumerate() {
        let c = color(k);
        let rects: Vec<Rectangle<(f64, f64)>> = bars
            .iter()
            .enumerate()
            .filter_map(|(i, (_, p))| {
                let p = (*p)?;
                let below: f64 = PHASES[..k]
                    .iter()
                    .map(|ph| p.phase_means_us.get(*ph).copied().unwrap_or(0.0))
                    .sum();
                let v = p.phase_means_us.get(*phase).copied().unwrap_or(0.0);
                Some(Rectangle::new(
                    [(i as f64 - 0.35, below), (i as f64 + 0.35, below + v)],
                    c.mix(0.85).filled(),
                ))
            })
            .collect();
        chart
            .draw_series(rects)?
            .label(*phase)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;
    Ok(())
}
