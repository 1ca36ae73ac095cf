//! `ambidex bench WORKLOAD`: the papers' workloads on a cluster whose nodes all run in
//! this process (the `local` transport by default, or `shm` with every node attached
//! here), with the report of FaSST §6 / DrTM+H §5–6.

use ambidex_workloads::plot::{plot, Plot};
use ambidex_workloads::{
    run_bench, sweep_coroutines, BenchConfig, BenchReport, ObjStoreParams, SweepPoint,
};
use serde::Serialize;
use std::path::PathBuf;

#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Transport: `local` (threads) or `shm` (shared memory; nodes attached in this
    /// process). Multi-process runs (`udp`, one process per node) are not built yet.
    #[arg(long, default_value = "local")]
    pub transport: String,
    #[arg(long, default_value_t = 3)]
    pub nodes: u16,
    /// Threads per node.
    #[arg(long, default_value_t = 1)]
    pub threads: u16,
    /// Worker coroutines per thread.
    #[arg(long, default_value_t = 8)]
    pub coroutines: usize,
    /// The primitive preset; only `fasst` (RPCs for every phase) exists so far.
    #[arg(long, default_value = "fasst")]
    pub mode: String,
    /// Copies of every key (primary + backups).
    #[arg(long, default_value_t = 3)]
    pub replication: u16,
    /// Measured seconds.
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
    /// Seconds run before measuring.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Population as a multiple of the papers' (1.0 = paper scale; default: a quick size
    /// per workload, see docs/workloads.md).
    #[arg(long)]
    pub scale: Option<f64>,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Object store: keys read per transaction.
    #[arg(long, default_value_t = 4)]
    pub r: usize,
    /// Object store: keys of those updated.
    #[arg(long, default_value_t = 2)]
    pub w: usize,
    /// Object store: allow several keys of a transaction on one primary.
    #[arg(long)]
    pub same_node: bool,
    /// Run once per coroutine count (a throughput-latency curve, FaSST Figure 10).
    #[arg(long, value_delimiter = ',')]
    pub sweep_coroutines: Option<Vec<usize>>,
    /// Report mean time per protocol phase (DrTM+H Figure 15).
    #[arg(long)]
    pub phase_breakdown: bool,
    /// Draw the sweep curve (or, without a sweep, the phase breakdown) to this SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Record every transaction to this JSON-lines file (docs/history-format.md).
    #[arg(long)]
    pub history: Option<PathBuf>,
    /// No progress bar while loading.
    #[arg(long)]
    pub no_progress: bool,
    #[arg(long)]
    pub json: bool,
}

/// A sweep's output: the curve and every run's report.
#[derive(Serialize)]
pub struct SweepReport {
    pub points: Vec<SweepPoint>,
    pub runs: Vec<BenchReport>,
}

pub enum Outcome {
    One(Box<BenchReport>),
    Sweep(SweepReport),
}

pub fn config(workload: &str, a: &Args) -> Result<BenchConfig, String> {
    if a.mode != "fasst" {
        return Err(format!(
            "--mode {}: only the fasst preset exists so far (every phase over RPCs)",
            a.mode
        ));
    }
    if a.nodes == 0 || a.threads == 0 || a.coroutines == 0 {
        return Err("--nodes, --threads and --coroutines must be at least 1".into());
    }
    if !(a.duration > 0.0 && a.duration <= 86400.0) || !(0.0..=3600.0).contains(&a.warmup) {
        return Err("--duration must be in (0, 86400] and --warmup in [0, 3600] seconds".into());
    }
    if let Some(s) = a.scale {
        if !(s > 0.0 && s <= 1000.0) {
            return Err("--scale must be in (0, 1000]".into());
        }
    }
    if a.w > a.r || a.r == 0 {
        return Err("object store: need 1 <= r and w <= r".into());
    }
    Ok(BenchConfig {
        workload: workload.parse()?,
        nodes: a.nodes,
        threads: a.threads,
        coroutines: a.coroutines,
        replication: a.replication,
        duration_s: a.duration,
        warmup_s: a.warmup,
        scale: a.scale,
        seed: a.seed,
        transport: a.transport.parse()?,
        objstore: ObjStoreParams {
            reads: a.r,
            writes: a.w,
            same_node: a.same_node,
        },
        progress: !a.no_progress && !a.json,
        history: a.history.clone(),
    })
}

pub fn run(workload: &str, a: &Args) -> Result<Outcome, String> {
    let cfg = config(workload, a)?;
    if let Some(counts) = &a.sweep_coroutines {
        if counts.is_empty() || counts.contains(&0) {
            return Err("--sweep-coroutines needs positive counts, e.g. 1,2,4,8,16".into());
        }
        let (points, runs) = sweep_coroutines(&cfg, counts)?;
        if let Some(path) = &a.plot {
            plot(
                Plot::Sweep(&points),
                &format!("{workload}: throughput vs latency"),
                path,
            )?;
        }
        return Ok(Outcome::Sweep(SweepReport { points, runs }));
    }
    let r = run_bench(&cfg)?;
    if let Some(path) = &a.plot {
        plot(
            Plot::Phases(&r.phase_means_us),
            &format!("{workload}: mean time per phase"),
            path,
        )?;
    }
    Ok(Outcome::One(Box::new(r)))
}

pub fn print(a: &Args, o: &Outcome) {
    match o {
        Outcome::One(r) => print_one(a, r),
        Outcome::Sweep(s) => {
            println!("coroutines  committed/s  per CPU-s   p50 us   p99 us");
            for p in &s.points {
                println!(
                    "{:>10} {:>12.0} {:>10.0} {:>8.1} {:>8.1}",
                    p.coroutines, p.committed_per_s, p.committed_per_cpu_s, p.p50_us, p.p99_us
                );
            }
        }
    }
}

fn print_one(a: &Args, r: &BenchReport) {
    println!(
        "ambidex {}: {} transport, {} nodes x {} threads x {} coroutines, R={}, mode {}, scale {}",
        r.workload,
        r.transport,
        r.nodes,
        r.threads_per_node,
        r.coroutines,
        r.replication,
        r.mode,
        r.scale
    );
    println!(
        "  committed {:>10}   {:>10.0}/s   {:>10.0} per CPU-second ({:.2} CPU-s over {:.1} s)",
        r.committed, r.committed_per_s, r.committed_per_cpu_s, r.cpu_seconds, r.duration_s
    );
    println!(
        "  latency us: p50 {:.1}  p99 {:.1}  p99.9 {:.1}  mean {:.1}",
        r.latency_us.p50, r.latency_us.p99, r.latency_us.p999, r.latency_us.mean
    );
    let reasons: Vec<String> = r
        .aborts_by_reason
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    println!(
        "  aborted {} ({:.2}%; conflicts {:.2}%): {}",
        r.aborted,
        r.abort_rate * 100.0,
        r.conflict_abort_rate * 100.0,
        if reasons.is_empty() {
            "-".to_string()
        } else {
            reasons.join(" ")
        }
    );
    if let Some(ok) = r.invariant_ok {
        println!(
            "  invariant (total balance): {}",
            if ok { "holds" } else { "VIOLATED" }
        );
    }
    if let Some(ok) = r.consistency_ok {
        println!(
            "  TPC-C consistency conditions 1-4: {}",
            if ok { "hold" } else { "VIOLATED" }
        );
    }
    if a.phase_breakdown {
        let phases: Vec<String> = r
            .phase_means_us
            .iter()
            .map(|(k, v)| format!("{k} {v:.1}"))
            .collect();
        println!("  mean us per phase: {}", phases.join(", "));
    }
    if r.stuck_workers > 0 {
        println!("  WARNING: {} workers did not finish", r.stuck_workers);
    }
    let drops = r.transport_counters.drops_and_errors();
    let nonzero: Vec<String> = drops
        .0
        .iter()
        .filter(|(_, v)| **v > 0)
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    println!(
        "  transport drops/errors: {}   RPC retransmits: {}",
        if nonzero.is_empty() {
            "none".into()
        } else {
            nonzero.join(" ")
        },
        r.rpc.retransmits
    );
    println!(
        "  peak RSS {:.0} MiB",
        r.max_rss_bytes as f64 / (1 << 20) as f64
    );
}
