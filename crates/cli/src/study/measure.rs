//! Runs a study's points. A configuration that several figures share (the `drtm-h`
//! preset is in most of them) is measured once per coroutine count; with `repeat` > 1
//! the whole list is run that many times in turn (A, B, C, A, B, C, ...), so the
//! machine's slow spells fall on every configuration alike, and each point is the run
//! with the median throughput.

use super::figure::Point;
use super::{Plan, StudyError};
use ambidex::bench::sweep_coroutines;
use ambidex::Config;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::Instant;

/// A run that failed (its point is missing; the claims that need it are undecided).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Failure {
    pub series: Vec<String>,
    pub coroutines: usize,
    pub error: String,
}

/// Every figure's points (by figure id), the runs that failed, and where, when and how
/// they were measured.
pub struct Measured {
    pub points: BTreeMap<String, Vec<Point>>,
    pub failures: Vec<Failure>,
    pub runs: usize,
    pub repeat: usize,
    pub seconds: f64,
    /// The command that measured them.
    pub command: String,
    pub machine: Machine,
    pub unix_time: u64,
}

/// The machine a study ran on.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Machine {
    pub cpus: usize,
    pub cpu_model: String,
    pub kernel: String,
}

impl Machine {
    /// This machine, as `/proc` describes it.
    pub fn this() -> Machine {
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split(':').nth(1))
                    .map(|m| m.trim().to_string())
            })
            .unwrap_or_default();
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        Machine {
            cpus: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(0),
            cpu_model,
            kernel,
        }
    }
}

/// What `study.json` holds that [`read_back`] needs.
#[derive(Deserialize)]
struct Recorded {
    study: String,
    command: String,
    machine: Machine,
    unix_time: u64,
    seconds: f64,
    runs: usize,
    repeat: usize,
    figures: Vec<RecordedFigure>,
    failures: Vec<Failure>,
}

#[derive(Deserialize)]
struct RecordedFigure {
    id: String,
    points: Vec<Point>,
}

/// The measurements of an earlier run of the same study, read back from its
/// `study.json` in the plan's directory (`--replot`). A figure the file lacks has no
/// points.
pub fn read_back(plan: &Plan) -> Result<Measured, StudyError> {
    let path = plan.out.join("study.json");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(source) => return Err(StudyError::ReadBack { path, source }),
    };
    let r: Recorded = match serde_json::from_str(&text) {
        Ok(r) => r,
        Err(source) => return Err(StudyError::NotAStudy { path, source }),
    };
    if r.study != plan.name {
        return Err(StudyError::OtherStudy {
            path,
            found: r.study,
            wanted: plan.name.clone(),
        });
    }
    Ok(Measured {
        points: r.figures.into_iter().map(|f| (f.id, f.points)).collect(),
        failures: r.failures,
        runs: r.runs,
        repeat: r.repeat,
        seconds: r.seconds,
        command: r.command,
        machine: r.machine,
        unix_time: r.unix_time,
    })
}

/// One distinct run: a configuration at a coroutine count, and where its point goes.
struct Job {
    cfg: Config,
    coroutines: usize,
    /// (figure id, series label) of every figure that shows it.
    uses: Vec<(String, String)>,
}

/// What makes two runs the same: the configuration, its transaction section by the
/// policy it resolves to (a preset and the same choices spelled as overrides are one).
fn job_key(cfg: &Config) -> Result<String, StudyError> {
    let policy = cfg.policy()?;
    let mut c = cfg.clone();
    c.txn.mode = ambidex::config::policy_phases(&policy);
    (c.txn.execute, c.txn.lock, c.txn.validate) = (None, None, None);
    (c.txn.log, c.txn.commit, c.txn.passive_ack) = (None, None, None);
    serde_json::to_string(&c).map_err(StudyError::EncodeConfig)
}

/// The distinct runs of a plan, in figure order.
fn jobs(plan: &Plan) -> Result<Vec<Job>, StudyError> {
    let mut jobs: Vec<Job> = Vec::new();
    let mut index: BTreeMap<(String, usize), usize> = BTreeMap::new();
    for f in &plan.figures {
        for s in &f.series {
            let key = job_key(&s.cfg)?;
            for &c in &f.coroutines {
                let use_ = (f.id.clone(), s.label.clone());
                match index.get(&(key.clone(), c)) {
                    Some(&i) => jobs[i].uses.push(use_),
                    None => {
                        index.insert((key.clone(), c), jobs.len());
                        jobs.push(Job {
                            cfg: s.cfg.clone(),
                            coroutines: c,
                            uses: vec![use_],
                        });
                    }
                }
            }
        }
    }
    Ok(jobs)
}

/// Runs every job `plan.repeat` times and keeps each one's median run.
pub fn measure(plan: &Plan) -> Result<Measured, StudyError> {
    let jobs = jobs(plan)?;
    let total = jobs.len() * plan.repeat;
    let per_run = jobs
        .first()
        .map(|j| j.cfg.run.warmup_s + j.cfg.run.duration_s + 0.5)
        .unwrap_or(0.0);
    eprintln!(
        "study {}: {} figures, {} distinct runs x {} = {total} runs (about {:.0} s of running, plus loading)",
        plan.name,
        plan.figures.len(),
        jobs.len(),
        plan.repeat,
        total as f64 * per_run
    );
    let bar = indicatif::ProgressBar::new(total as u64);
    bar.set_style(indicatif::ProgressStyle::with_template(
        "[{elapsed_precise}] {bar:30} {pos}/{len} {msg}",
    )?);
    let t0 = Instant::now();
    let tty = std::io::stderr().is_terminal();
    let mut runs: Vec<Vec<Point>> = vec![Vec::new(); jobs.len()];
    let mut errors: Vec<Option<String>> = vec![None; jobs.len()];
    for round in 0..plan.repeat {
        for (i, job) in jobs.iter().enumerate() {
            let (fig, label) = &job.uses[0];
            bar.set_message(format!("{fig} {label} x{} ({})", job.coroutines, round + 1));
            if errors[i].is_none() {
                match sweep_coroutines(crate::registry(), &job.cfg, &[job.coroutines]) {
                    Ok((_, reports)) => match reports.first() {
                        Some(r) => runs[i].push(Point::from_report(label, r)),
                        None => errors[i] = Some("the run returned no report".into()),
                    },
                    Err(e) => errors[i] = Some(crate::error::chain(&e)),
                }
            }
            bar.inc(1);
            // Without a terminal the bar is hidden: a line every 10 runs instead.
            let done = round * jobs.len() + i + 1;
            if !tty && (done % 10 == 0 || done == total) {
                eprintln!(
                    "study {}: {done}/{total} runs, {:.0} s",
                    plan.name,
                    t0.elapsed().as_secs_f64()
                );
            }
        }
    }
    bar.finish_and_clear();
    let mut points: BTreeMap<String, Vec<Point>> = BTreeMap::new();
    let mut failures = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        if let Some(e) = &errors[i] {
            failures.push(Failure {
                series: job
                    .uses
                    .iter()
                    .map(|u| format!("{} {}", u.0, u.1))
                    .collect(),
                coroutines: job.coroutines,
                error: e.clone(),
            });
            continue;
        }
        let Some(median) = median_run(&runs[i]) else {
            continue;
        };
        for (fig, label) in &job.uses {
            let mut p = median.clone();
            p.series = label.clone();
            points.entry(fig.clone()).or_default().push(p);
        }
    }
    Ok(Measured {
        points,
        failures,
        runs: total,
        repeat: plan.repeat,
        seconds: t0.elapsed().as_secs_f64(),
        command: plan.command.clone(),
        machine: Machine::this(),
        unix_time: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    })
}

/// The run with the median throughput (the lower middle of an even count).
fn median_run(runs: &[Point]) -> Option<&Point> {
    let mut v: Vec<&Point> = runs.iter().collect();
    v.sort_by(|a, b| a.committed_per_s.total_cmp(&b.committed_per_s));
    v.get((v.len().max(1) - 1) / 2).copied()
}
