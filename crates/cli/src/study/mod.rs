//! `ambidex study`: the papers' evaluations, one command each. `study phases`
//! reproduces DrTM+H's phase-by-phase study and end-to-end comparison (Figures 7–15)
//! on SmallBank or TPC-C/no; `study fasst` reproduces FaSST's Figures 7–10 as
//! shapes. Every point is a fresh in-process cluster loaded and run with the
//! benchmark's driver; the output directory gets one JSON with every point, a Markdown
//! report with a table per figure and the verdict on each of the paper's claims, and an
//! SVG per figure (docs/study/README.md).

mod fasst;
mod figure;
mod measure;
mod output;
mod phases;
mod plot;

use crate::config_args::{set, ConfigArgs};
use crate::plot::PlotError;
use ambidex::config::{ConfigError, Transport};
use ambidex::Config;
use ambidex_workloads::WorkloadKind;
use std::path::PathBuf;

/// A study that cannot be made: its flags, its configuration, an earlier run's output
/// (`--replot`) or writing its own. A run that fails is not one: it is a missing point
/// (`measure::Failure`).
#[derive(Debug, thiserror::Error)]
pub enum StudyError {
    /// The configuration of its figures is invalid (or `--workload` is no workload).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// `study phases --workload` other than DrTM+H's two.
    #[error(
        "study phases runs DrTM+H's workloads: --workload smallbank or tpcc-no, not {workload}"
    )]
    NotAPhasesWorkload {
        /// The workload given.
        workload: &'static str,
    },
    /// `study fasst` with `--nodes` or `--threads`.
    #[error("study fasst sets the cluster's shape itself (Figures 8 and 9 vary it): drop {flag}")]
    FasstShape {
        /// The flag given.
        flag: &'static str,
    },
    /// A workload the study runs is not in this program's registry.
    #[error("{workload} is not registered")]
    NotRegistered {
        /// The workload.
        workload: &'static str,
    },
    /// `--coroutines` empty or with a 0.
    #[error("--coroutines needs positive counts, e.g. 1,4,16 (got {given:?})")]
    Coroutines {
        /// The counts given.
        given: Vec<usize>,
    },
    /// `--repeat 0`.
    #[error("--repeat must be at least 1")]
    NoRepeat,
    /// `--figures` names a figure the study does not have.
    #[error("study {study} has no figure {figure}; its figures are {known:?}")]
    NoSuchFigure {
        /// The study's name.
        study: String,
        /// The figure asked for.
        figure: u32,
        /// The study's figures.
        known: Vec<u32>,
    },
    /// A run's configuration could not be encoded to tell runs apart.
    #[error("encoding a run's configuration as JSON")]
    EncodeConfig(#[source] serde_json::Error),
    /// The progress bar's template is invalid.
    #[error("the progress bar's template")]
    ProgressTemplate(#[from] indicatif::style::TemplateError),
    /// `--replot` cannot read the earlier run's `study.json`.
    #[error("--replot reads {}", path.display())]
    ReadBack {
        /// The file.
        path: PathBuf,
        /// What the file system said.
        #[source]
        source: std::io::Error,
    },
    /// `--replot`'s `study.json` is not one a study wrote.
    #[error("{} is not a study's output", path.display())]
    NotAStudy {
        /// The file.
        path: PathBuf,
        /// What the JSON parser said.
        #[source]
        source: serde_json::Error,
    },
    /// `--replot`'s `study.json` is another study's.
    #[error("{} holds study {found}, not {wanted}", path.display())]
    OtherStudy {
        /// The file.
        path: PathBuf,
        /// The study it holds.
        found: String,
        /// This study.
        wanted: String,
    },
    /// The output directory cannot be created.
    #[error("creating {}", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// What the file system said.
        #[source]
        source: std::io::Error,
    },
    /// `study.json` could not be encoded.
    #[error("encoding study.json")]
    EncodeStudy(#[source] serde_json::Error),
    /// An output file cannot be written.
    #[error("writing {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// What the file system said.
        #[source]
        source: std::io::Error,
    },
    /// A figure's SVG cannot be drawn.
    #[error(transparent)]
    Plot(#[from] PlotError),
}

#[derive(clap::Subcommand)]
pub enum Command {
    /// DrTM+H's phase-by-phase study (Figures 7-11), its scaling (Figure 12) and its
    /// end-to-end comparison of the four designs (Figures 13-15) on one workload.
    Phases(PhasesArgs),
    /// FaSST's Figures 7-10: the object store, TATP and SmallBank as the cluster grows,
    /// TATP's latency against throughput.
    Fasst(CommonArgs),
}

#[derive(Clone, Debug, clap::Args)]
pub struct PhasesArgs {
    /// The workload of Figures 7-10 and 12-15: smallbank or tpcc-no (Figure 11 always
    /// runs TPC-E customer-position).
    #[arg(long, default_value = "smallbank")]
    pub workload: String,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Clone, Debug, clap::Args)]
pub struct CommonArgs {
    /// Transport: local (nodes are threads sharing memory), shm (shared-memory rings and
    /// regions: a one-sided verb never runs the remote node's code) or udp (loopback
    /// datagrams: the remote node's poller serves one-sided verbs). Every node runs in
    /// this process.
    #[arg(long, default_value = "local")]
    pub transport: Transport,
    /// Output directory [default: study-phases-WORKLOAD or study-fasst].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Only these figures (the paper's numbers, e.g. 7,12) [default: every figure].
    #[arg(long, value_delimiter = ',', value_name = "N,...")]
    pub figures: Option<Vec<u32>>,
    /// Measure nothing: read the points of an earlier run of this study from
    /// OUT/study.json and write its report, claims and SVGs again (after a change of
    /// the plots or of the claims' checks). The other flags must describe that run.
    #[arg(long)]
    pub replot: bool,
    /// Fewer points: the fewest and most coroutines only, one run each, short windows
    /// (a few minutes in all); without it every point of the sweep, the median of
    /// --repeat runs.
    #[arg(long)]
    pub quick: bool,
    /// Runs per point, alternated across the whole study; the point is the run with the
    /// median throughput [default: 3; 1 with --quick].
    #[arg(long)]
    pub repeat: Option<usize>,
    /// Coroutines per thread of the sweep [default: 1,2,4,8,16 (FaSST Figure 10:
    /// 1,2,4,8,12,16,19); with --quick: 1,16].
    #[arg(long, value_delimiter = ',')]
    pub coroutines: Option<Vec<usize>>,
    /// Measured seconds per run [default: 1.5; 0.5 with --quick].
    #[arg(long)]
    pub duration: Option<f64>,
    /// Seconds run before measuring [default: 0.3; 0.2 with --quick].
    #[arg(long)]
    pub warmup: Option<f64>,
    /// Population as a multiple of the papers' [default: each workload's default scale;
    /// TPC-C/no 0.05 (0.02 with --quick) of its 72 warehouses' rows, TPC-E 0.2 with
    /// --quick].
    #[arg(long)]
    pub scale: Option<f64>,
    /// Nodes [default: 3].
    #[arg(long)]
    pub nodes: Option<u16>,
    /// Threads per node [default: 1].
    #[arg(long)]
    pub threads: Option<u16>,
}

/// What a study measures, resolved from its flags.
pub struct Plan {
    pub name: String,
    pub command: String,
    pub out: PathBuf,
    pub repeat: usize,
    pub figures: Vec<figure::FigureSpec>,
}

pub fn run(cmd: &Command) -> Result<(), StudyError> {
    let (mut plan, common) = match cmd {
        Command::Phases(a) => (phases_plan(a)?, &a.common),
        Command::Fasst(a) => (fasst_plan(a)?, a),
    };
    if let Some(wanted) = &common.figures {
        let known: Vec<u32> = plan.figures.iter().filter_map(|f| f.number()).collect();
        if let Some(n) = wanted.iter().find(|n| !known.contains(n)) {
            return Err(StudyError::NoSuchFigure {
                study: plan.name.clone(),
                figure: *n,
                known,
            });
        }
        plan.figures
            .retain(|f| f.number().is_some_and(|n| wanted.contains(&n)));
    }
    let result = if common.replot {
        measure::read_back(&plan)?
    } else {
        measure::measure(&plan)?
    };
    output::write(&plan, &result)?;
    output::print_summary(&plan, &result);
    Ok(())
}

/// The cluster every figure starts from: 3 nodes x 1 thread, R = 3, no manager (a study
/// run has no failures to survive; leases would only add their renewals), the flags'
/// transport, window and scale.
fn base_config(a: &CommonArgs, workload: WorkloadKind) -> Result<Config, ConfigError> {
    let mut c = ConfigArgs::default().resolve(&Config::default())?;
    c.run.workload = workload.into();
    c.cluster.transport = a.transport;
    c.cluster.manager = ambidex::config::ManagerKind::None;
    set(&mut c.cluster.nodes, a.nodes);
    set(&mut c.cluster.threads, a.threads);
    c.run.duration_s = a.duration.unwrap_or(if a.quick { 0.5 } else { 1.5 });
    c.run.warmup_s = a.warmup.unwrap_or(if a.quick { 0.2 } else { 0.3 });
    c.run.scale = a.scale.or(study_scale(workload, a.quick));
    c.run.progress = false;
    c.validate()?;
    Ok(c)
}

/// The population a study loads when `--scale` is not given, where it differs from the
/// workload's default: every point of a study loads afresh, and a full study runs about
/// 300 of them. TPC-C/no keeps its 72 warehouses (the conflicts come from them) with a
/// twentieth of each warehouse's rows (--quick: a fiftieth); TPC-E a fifth of its
/// customers with --quick.
fn study_scale(w: WorkloadKind, quick: bool) -> Option<f64> {
    match (w, quick) {
        (WorkloadKind::TpccNo, false) => Some(0.05),
        (WorkloadKind::TpccNo, true) => Some(0.02),
        (WorkloadKind::Tpce, true) => Some(0.2),
        _ => None,
    }
}

/// The sweep's coroutine counts and its two ends.
fn sweep(a: &CommonArgs, full: &[usize]) -> Result<(Vec<usize>, Vec<usize>), StudyError> {
    let sweep = match &a.coroutines {
        Some(c) => c.clone(),
        None if a.quick => vec![1, 16],
        None => full.to_vec(),
    };
    if sweep.is_empty() || sweep.contains(&0) {
        return Err(StudyError::Coroutines { given: sweep });
    }
    let (lo, hi) = (
        *sweep.iter().min().expect("not empty"),
        *sweep.iter().max().expect("not empty"),
    );
    let ends = if lo == hi { vec![lo] } else { vec![lo, hi] };
    Ok((sweep, ends))
}

fn repeat(a: &CommonArgs) -> Result<usize, StudyError> {
    match a.repeat.unwrap_or(if a.quick { 1 } else { 3 }) {
        0 => Err(StudyError::NoRepeat),
        n => Ok(n),
    }
}

fn phases_plan(a: &PhasesArgs) -> Result<Plan, StudyError> {
    let w: WorkloadKind = a.workload.parse()?;
    if !matches!(w, WorkloadKind::SmallBank | WorkloadKind::TpccNo) {
        return Err(StudyError::NotAPhasesWorkload { workload: w.name() });
    }
    let c = &a.common;
    let base = base_config(c, w)?;
    let tpce = base_config(c, WorkloadKind::Tpce)?;
    let (sweep, ends) = sweep(c, &[1, 2, 4, 8, 16])?;
    Ok(Plan {
        name: format!("phases-{}", w.name()),
        command: command_line(),
        out: c
            .out
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("study-phases-{}", w.name()))),
        repeat: repeat(c)?,
        figures: phases::figures(&base, &tpce, &sweep, &ends),
    })
}

fn fasst_plan(a: &CommonArgs) -> Result<Plan, StudyError> {
    if a.nodes.is_some() || a.threads.is_some() {
        let flag = if a.nodes.is_some() {
            "--nodes"
        } else {
            "--threads"
        };
        return Err(StudyError::FasstShape { flag });
    }
    let base = base_config(a, WorkloadKind::Tatp)?;
    let (sweep, _) = sweep(a, &[1, 2, 4, 8, 12, 16, 19])?;
    // Figures 7-9 run at the workloads' default coroutines (FaSST's ~20).
    let tatp = WorkloadKind::Tatp.name();
    let one = crate::registry()
        .info(tatp)
        .ok_or(StudyError::NotRegistered { workload: tatp })?
        .default_coroutines;
    let shapes: &[(u16, u16)] = if a.quick {
        &fasst::SHAPES[..3]
    } else {
        &fasst::SHAPES
    };
    Ok(Plan {
        name: "fasst".into(),
        command: command_line(),
        out: a
            .out
            .clone()
            .unwrap_or_else(|| PathBuf::from("study-fasst")),
        repeat: repeat(a)?,
        figures: fasst::figures(&base, shapes, one, &sweep),
    })
}

/// The command as run, for the report.
fn command_line() -> String {
    let mut args: Vec<String> = std::env::args().collect();
    if let Some(first) = args.first_mut() {
        *first = "ambidex".into();
    }
    args.join(" ")
}
