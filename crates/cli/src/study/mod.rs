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
use ambidex::config::Transport;
use ambidex::Config;
use ambidex_workloads::WorkloadKind;
use std::path::PathBuf;

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

pub fn run(cmd: &Command) -> Result<(), String> {
    let (mut plan, common) = match cmd {
        Command::Phases(a) => (phases_plan(a)?, &a.common),
        Command::Fasst(a) => (fasst_plan(a)?, a),
    };
    if let Some(wanted) = &common.figures {
        let known: Vec<u32> = plan.figures.iter().filter_map(|f| f.number()).collect();
        if let Some(n) = wanted.iter().find(|n| !known.contains(n)) {
            return Err(format!(
                "study {} has no figure {n}; its figures are {known:?}",
                plan.name
            ));
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
fn base_config(a: &CommonArgs, workload: WorkloadKind) -> Result<Config, String> {
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
fn sweep(a: &CommonArgs, full: &[usize]) -> Result<(Vec<usize>, Vec<usize>), String> {
    let sweep = match &a.coroutines {
        Some(c) => c.clone(),
        None if a.quick => vec![1, 16],
        None => full.to_vec(),
    };
    if sweep.is_empty() || sweep.contains(&0) {
        return Err("--coroutines needs positive counts, e.g. 1,4,16".into());
    }
    let (lo, hi) = (
        *sweep.iter().min().expect("not empty"),
        *sweep.iter().max().expect("not empty"),
    );
    let ends = if lo == hi { vec![lo] } else { vec![lo, hi] };
    Ok((sweep, ends))
}

fn repeat(a: &CommonArgs) -> Result<usize, String> {
    match a.repeat.unwrap_or(if a.quick { 1 } else { 3 }) {
        0 => Err("--repeat must be at least 1".into()),
        n => Ok(n),
    }
}

fn phases_plan(a: &PhasesArgs) -> Result<Plan, String> {
    let w: WorkloadKind = a.workload.parse()?;
    if !matches!(w, WorkloadKind::SmallBank | WorkloadKind::TpccNo) {
        return Err(format!(
            "study phases runs DrTM+H's workloads: --workload smallbank or tpcc-no, not {}",
            w.name()
        ));
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

fn fasst_plan(a: &CommonArgs) -> Result<Plan, String> {
    if a.nodes.is_some() || a.threads.is_some() {
        return Err("study fasst sets the cluster's shape itself (Figures 8 and 9 vary it)".into());
    }
    let base = base_config(a, WorkloadKind::Tatp)?;
    let (sweep, _) = sweep(a, &[1, 2, 4, 8, 12, 16, 19])?;
    // Figures 7-9 run at the workloads' default coroutines (FaSST's ~20).
    let one = crate::registry()
        .info(WorkloadKind::Tatp.name())
        .ok_or("tatp is not registered")?
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
