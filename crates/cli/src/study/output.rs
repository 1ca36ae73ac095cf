//! A study's output: `study.json` (every point, every claim's verdict), `study.md` (the
//! summary, then per figure its SVG, a table and the claims), and one SVG per figure.

use super::figure::{fmt_num, FigureSpec, Point, Points, Shape, Verdict, PHASES};
use super::measure::{Failure, Machine, Measured};
use super::{Plan, StudyError};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;

#[derive(Serialize)]
struct StudyJson<'a> {
    study: &'a str,
    command: &'a str,
    machine: &'a Machine,
    unix_time: u64,
    seconds: f64,
    runs: usize,
    repeat: usize,
    figures: Vec<FigureJson<'a>>,
    failures: &'a [Failure],
}

#[derive(Serialize)]
struct FigureJson<'a> {
    id: &'a str,
    title: &'a str,
    paper: &'a str,
    shape: Shape,
    verdict: &'static str,
    series: Vec<SeriesJson<'a>>,
    coroutines: &'a [usize],
    points: &'a [Point],
    claims: Vec<ClaimJson>,
}

#[derive(Serialize)]
struct SeriesJson<'a> {
    label: &'a str,
    workload: String,
    transport: &'static str,
    nodes: u16,
    threads: u16,
    policy: String,
}

#[derive(Serialize)]
struct ClaimJson {
    text: &'static str,
    #[serde(flatten)]
    verdict: Verdict,
}

/// A figure's claims, checked against its points.
fn verdicts(f: &FigureSpec, points: &[Point]) -> Vec<ClaimJson> {
    let p = Points { all: points };
    f.claims
        .iter()
        .map(|c| ClaimJson {
            text: c.text,
            verdict: (c.check)(&p),
        })
        .collect()
}

/// A figure's verdict from its claims'.
fn figure_verdict(claims: &[ClaimJson]) -> &'static str {
    let held = claims
        .iter()
        .filter(|c| c.verdict.holds == Some(true))
        .count();
    let failed = claims
        .iter()
        .filter(|c| c.verdict.holds == Some(false))
        .count();
    match (held, failed) {
        (h, 0) if h == claims.len() => "holds",
        (0, f) if f == claims.len() => "does not hold",
        (_, 0) => "undecided",
        _ => "partly",
    }
}

fn word(h: Option<bool>) -> &'static str {
    match h {
        Some(true) => "holds",
        Some(false) => "does not hold",
        None => "undecided",
    }
}

/// Writes `study.json`, `study.md` and the SVGs into the plan's directory.
pub fn write(plan: &Plan, m: &Measured) -> Result<(), StudyError> {
    let dir = &plan.out;
    std::fs::create_dir_all(dir).map_err(|source| StudyError::CreateDir {
        path: dir.clone(),
        source,
    })?;
    let empty: Vec<Point> = Vec::new();
    let figures: Vec<FigureJson<'_>> = plan
        .figures
        .iter()
        .map(|f| {
            let points = m.points.get(&f.id).unwrap_or(&empty);
            let claims = verdicts(f, points);
            FigureJson {
                id: &f.id,
                title: &f.title,
                paper: &f.paper,
                shape: f.shape,
                verdict: figure_verdict(&claims),
                series: f
                    .series
                    .iter()
                    .map(|s| SeriesJson {
                        label: &s.label,
                        workload: s.cfg.run.workload.clone(),
                        transport: s.cfg.cluster.transport.name(),
                        nodes: s.cfg.cluster.nodes,
                        threads: s.cfg.cluster.threads,
                        policy: s
                            .cfg
                            .policy()
                            .map(|p| ambidex::config::policy_phases(&p))
                            .unwrap_or_else(|e| e.to_string()),
                    })
                    .collect(),
                coroutines: &f.coroutines,
                points,
                claims,
            }
        })
        .collect();
    for (f, j) in plan.figures.iter().zip(&figures) {
        if j.points.is_empty() {
            continue;
        }
        let path = dir.join(format!("{}.svg", f.id));
        super::plot::figure(f, j.points, &path)?;
    }
    let study = StudyJson {
        study: &plan.name,
        command: &m.command,
        machine: &m.machine,
        unix_time: m.unix_time,
        seconds: m.seconds,
        runs: m.runs,
        repeat: m.repeat,
        figures,
        failures: &m.failures,
    };
    let json = serde_json::to_string_pretty(&study).map_err(StudyError::EncodeStudy)?;
    write_file(&dir.join("study.json"), &json)?;
    write_file(&dir.join("study.md"), &markdown(plan, &study))
}

fn write_file(path: &Path, text: &str) -> Result<(), StudyError> {
    std::fs::write(path, text).map_err(|source| StudyError::Write {
        path: path.to_path_buf(),
        source,
    })
}

fn markdown(plan: &Plan, s: &StudyJson<'_>) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# ambidex study {}\n", s.study);
    let _ = writeln!(md, "Command: `{}`  ", s.command);
    let _ = writeln!(
        md,
        "Machine: {} CPUs ({}), Linux {}  ",
        s.machine.cpus, s.machine.cpu_model, s.machine.kernel
    );
    let _ = writeln!(
        md,
        "{} runs ({} per point, the median's shown), {:.0} s.\n",
        s.runs, s.repeat, s.seconds
    );
    let _ = writeln!(md, "## Does the paper's conclusion hold here?\n");
    let _ = writeln!(md, "| figure | paper | here |\n|---|---|---|");
    for f in &s.figures {
        let _ = writeln!(
            md,
            "| [{}](#{}) | {} | **{}** |",
            f.id, f.id, f.paper, f.verdict
        );
    }
    if !s.failures.is_empty() {
        let _ = writeln!(md, "\nRuns that failed (their points are missing):\n");
        for f in s.failures {
            let _ = writeln!(
                md,
                "- {} at {} coroutines: {}",
                f.series.join(", "),
                f.coroutines,
                f.error
            );
        }
    }
    for (spec, f) in plan.figures.iter().zip(&s.figures) {
        let _ = writeln!(md, "\n## {}\n", f.id);
        let _ = writeln!(md, "{}. {}.\n", f.title, f.paper);
        if !f.points.is_empty() {
            let _ = writeln!(md, "![{}]({}.svg)\n", f.id, f.id);
        }
        let _ = writeln!(md, "Series:\n");
        for se in &f.series {
            let _ = writeln!(
                md,
                "- **{}**: {}, {} nodes x {} threads, {}",
                se.label, se.workload, se.nodes, se.threads, se.policy
            );
        }
        let _ = writeln!(md);
        md.push_str(&table(spec, f.points));
        let _ = writeln!(md, "\nThe paper's claims, here:\n");
        for c in &f.claims {
            let _ = writeln!(
                md,
                "- **{}**: {}  \n  {}",
                word(c.verdict.holds),
                c.text,
                c.verdict.evidence
            );
        }
    }
    md
}

/// The figure's points as a Markdown table, in series then coroutine order.
fn table(f: &FigureSpec, points: &[Point]) -> String {
    let phases = f.shape == Shape::Phases;
    let mut t = String::from(
        "| series | nodes x threads | coroutines | committed/s | per CPU-s | p50 µs | p90 µs | p99 µs | aborts | RPCs/s | one-sided/s | cache hits |",
    );
    let mut rule = String::from("|---|---|---|---|---|---|---|---|---|---|---|---|");
    if phases {
        for p in PHASES {
            let _ = write!(t, " {p} µs |");
            rule.push_str("---|");
        }
    }
    let _ = writeln!(t, "\n{rule}");
    for s in &f.series {
        let mut pts: Vec<&Point> = points.iter().filter(|p| p.series == s.label).collect();
        pts.sort_by_key(|p| p.coroutines);
        for p in pts {
            let _ = write!(
                t,
                "| {} | {} x {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1}% | {} | {} | {:.0}% |",
                p.series,
                p.nodes,
                p.threads,
                p.coroutines,
                fmt_num(p.committed_per_s),
                fmt_num(p.committed_per_cpu_s),
                p.p50_us,
                p.p90_us,
                p.p99_us,
                p.abort_rate * 100.0,
                fmt_num(p.rpc_requests_per_s),
                fmt_num(p.one_sided_per_s),
                p.cache_hit_rate * 100.0
            );
            if phases {
                for ph in PHASES {
                    let _ = write!(
                        t,
                        " {:.1} |",
                        p.phase_means_us.get(ph).copied().unwrap_or(0.0)
                    );
                }
            }
            t.push('\n');
        }
    }
    t
}

/// The summary on stdout: per figure its verdict, per claim its verdict and evidence.
pub fn print_summary(plan: &Plan, m: &Measured) {
    println!(
        "ambidex study {}: {} runs in {:.0} s; output in {}",
        plan.name,
        m.runs,
        m.seconds,
        plan.out.display()
    );
    let empty = Vec::new();
    for f in &plan.figures {
        let points = m.points.get(&f.id).unwrap_or(&empty);
        let claims = verdicts(f, points);
        println!("{}: {}", f.id, figure_verdict(&claims));
        for c in &claims {
            println!("  {}: {}", word(c.verdict.holds), c.text);
            println!("    {}", c.verdict.evidence);
        }
    }
    for f in &m.failures {
        println!(
            "FAILED at {} coroutines: {}: {}",
            f.coroutines,
            f.series.join(", "),
            f.error
        );
    }
}
