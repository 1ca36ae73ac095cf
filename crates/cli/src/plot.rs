//! SVG plots of a coroutine sweep (throughput vs. latency, FaSST Figure 10) and of the
//! per-phase latency breakdown (DrTM+H Figure 15 style). SVG backend only and no font
//! backend: plotters lays text out with its built-in estimate, so no system library
//! (fontconfig, freetype) is needed.

use ambidex::bench::SweepPoint;
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Why a plot could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The data to draw is empty (a sweep without points, a run without commits).
    #[error("plotting {}: no {what} to plot", path.display())]
    Empty {
        /// What is missing: `points`, `phases`, `committed transactions`.
        what: &'static str,
        /// The SVG file.
        path: PathBuf,
    },
    /// plotters could not lay the chart out or write the file.
    #[error("plotting {}", path.display())]
    Draw {
        /// The SVG file.
        path: PathBuf,
        /// plotters' error (the file system's, for the SVG backend).
        #[source]
        source: DrawError,
    },
}

/// What plotters fails with on the SVG backend.
pub type DrawError = DrawingAreaErrorKind<std::io::Error>;

/// What to draw.
pub enum Plot<'a> {
    /// Median and p99 latency (µs) against throughput (committed transactions/s).
    Sweep(&'a [SweepPoint]),
    /// Mean µs per protocol phase (`BenchReport::phase_means_us`).
    Phases(&'a BTreeMap<String, f64>),
    /// Committed transactions per 10 ms (`BenchReport::timeline_10ms`), drawn as
    /// committed/s against time, with a labelled vertical line at each mark (ms since
    /// the run's start: kills, deaths, manager events).
    Timeline {
        buckets: &'a [u64],
        marks: &'a [(f64, String)],
    },
}

/// Draws `what` to the SVG file `path`.
pub fn draw(what: Plot<'_>, title: &str, path: &Path) -> Result<(), PlotError> {
    let empty = |what| PlotError::Empty {
        what,
        path: path.to_path_buf(),
    };
    match what {
        Plot::Sweep([]) => return Err(empty("points")),
        Plot::Phases(p) if p.is_empty() => return Err(empty("phases")),
        Plot::Timeline { buckets: [], .. } => return Err(empty("committed transactions")),
        _ => {}
    }
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    let drawn = root.fill(&WHITE).and_then(|()| {
        match what {
            Plot::Sweep(points) => sweep(&root, points, title),
            Plot::Phases(phases) => phases_chart(&root, phases, title),
            Plot::Timeline { buckets, marks } => timeline(&root, buckets, marks, title),
        }?;
        root.present()
    });
    drawn.map_err(|source| PlotError::Draw {
        path: path.to_path_buf(),
        source,
    })
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;
type PlotResult = Result<(), DrawError>;

/// Draws a sweep of at least one point.
fn sweep(root: &Area<'_>, points: &[SweepPoint], title: &str) -> PlotResult {
    let x_max = points.iter().map(|p| p.committed_per_s).fold(0.0, f64::max) * 1.1 + 1.0;
    let y_max = points
        .iter()
        .map(|p| p.p99_us.max(p.p50_us))
        .fold(0.0, f64::max)
        * 1.1
        + 1.0;
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("committed transactions / s")
        .y_desc("latency (µs)")
        .draw()?;
    for (name, color, get) in [
        (
            "median",
            BLUE,
            (|p: &SweepPoint| p.p50_us) as fn(&SweepPoint) -> f64,
        ),
        ("99th percentile", RED, |p: &SweepPoint| p.p99_us),
    ] {
        let series: Vec<(f64, f64)> = points.iter().map(|p| (p.committed_per_s, get(p))).collect();
        chart
            .draw_series(LineSeries::new(series.clone(), color.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart.draw_series(
            series
                .iter()
                .map(|&(x, y)| Circle::new((x, y), 4, color.filled())),
        )?;
    }
    // Label each point with its coroutine count.
    chart.draw_series(points.iter().map(|p| {
        Text::new(
            format!("{}", p.coroutines),
            (p.committed_per_s, p.p50_us),
            ("sans-serif", 12),
        )
    }))?;
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;
    Ok(())
}

/// Draws a breakdown of at least one phase.
fn phases_chart(root: &Area<'_>, phases: &BTreeMap<String, f64>, title: &str) -> PlotResult {
    // Protocol order (execute, validate, log, commit backups, commit primaries), then
    // any other key.
    let order = |k: &str| {
        ambidex::bench::report::PHASE_NAMES
            .iter()
            .position(|p| *p == k)
            .unwrap_or(usize::MAX)
    };
    let mut names: Vec<&String> = phases.keys().collect();
    names.sort_by_key(|k| (order(k), (*k).clone()));
    let y_max = phases.values().cloned().fold(0.0, f64::max) * 1.15 + 0.1;
    let n = names.len();
    // Bar i is centred on x = i, where its label goes.
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5..n as f64 - 0.5, 0.0..y_max)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < n {
                names[i as usize].clone()
            } else {
                String::new()
            }
        })
        .y_desc("mean µs per transaction")
        .draw()?;
    chart.draw_series(names.iter().enumerate().map(|(i, k)| {
        let v = phases[*k];
        Rectangle::new(
            [(i as f64 - 0.35, 0.0), (i as f64 + 0.35, v)],
            BLUE.mix(0.7).filled(),
        )
    }))?;
    chart.draw_series(names.iter().enumerate().map(|(i, k)| {
        Text::new(
            format!("{:.1}", phases[*k]),
            (i as f64 - 0.1, phases[*k] * 1.04 + 0.01),
            ("sans-serif", 12),
        )
    }))?;
    Ok(())
}

/// Draws a timeline of at least one bucket.
fn timeline(root: &Area<'_>, buckets: &[u64], marks: &[(f64, String)], title: &str) -> PlotResult {
    let bucket_s = ambidex::bench::driver::TIMELINE_BUCKET.as_secs_f64();
    let x_max = buckets.len() as f64 * bucket_s * 1e3;
    let x_max = marks.iter().map(|m| m.0).fold(x_max, f64::max) + 1.0;
    let rate = |c: u64| c as f64 / bucket_s;
    let y_max = buckets.iter().map(|&c| rate(c)).fold(0.0, f64::max) * 1.15 + 1.0;
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("ms since the start")
        .y_desc("committed transactions / s")
        .draw()?;
    let series = buckets
        .iter()
        .enumerate()
        .map(|(i, &c)| (i as f64 * bucket_s * 1e3, rate(c)));
    chart.draw_series(LineSeries::new(series, BLUE.stroke_width(1)))?;
    for (i, (at, label)) in marks.iter().enumerate() {
        let at = at.max(0.0);
        chart.draw_series(LineSeries::new(vec![(at, 0.0), (at, y_max)], RED))?;
        // Staggered so marks a few ms apart stay readable.
        let y = y_max * (0.95 - 0.06 * (i % 8) as f64);
        chart.draw_series(std::iter::once(Text::new(
            label.clone(),
            (at, y),
            ("sans-serif", 12),
        )))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sweep and a phase breakdown draw as SVGs with their curves and labels.
    #[test]
    fn sweeps_and_phases_draw() {
        let dir = std::env::temp_dir().join(format!("ambidex-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let points = [
            SweepPoint {
                coroutines: 1,
                committed_per_s: 1000.0,
                committed_per_cpu_s: 900.0,
                p50_us: 20.0,
                p99_us: 40.0,
            },
            SweepPoint {
                coroutines: 4,
                committed_per_s: 3000.0,
                committed_per_cpu_s: 2500.0,
                p50_us: 30.0,
                p99_us: 70.0,
            },
        ];
        let svg = dir.join("sweep.svg");
        draw(Plot::Sweep(&points), "O(3,1)", &svg).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.contains("<svg") && text.contains("polyline"));
        let phases: BTreeMap<String, f64> =
            [("execute".to_string(), 5.0), ("commit".to_string(), 3.0)].into();
        let svg2 = dir.join("phases.svg");
        draw(Plot::Phases(&phases), "phases", &svg2).unwrap();
        assert!(std::fs::read_to_string(&svg2).unwrap().contains("execute"));
        // Nothing to draw is an error naming the file, and no file is written.
        let svg3 = dir.join("empty.svg");
        let e = draw(Plot::Sweep(&[]), "none", &svg3).unwrap_err();
        assert!(matches!(e, PlotError::Empty { what: "points", .. }), "{e}");
        assert!(e.to_string().contains("empty.svg"), "{e}");
        assert!(!svg3.exists());
        // A file that cannot be written is plotters' error, with the file's name.
        let bad = dir.join("no-such-dir").join("x.svg");
        let e = draw(Plot::Sweep(&points), "x", &bad).unwrap_err();
        assert!(matches!(e, PlotError::Draw { .. }), "{e}");
        assert!(crate::error::chain(&e).contains("x.svg: caused by"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
