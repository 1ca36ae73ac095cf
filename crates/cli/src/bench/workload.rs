//! `ambidex bench WORKLOAD`: the papers' workloads, with the report of FaSST §6 /
//! DrTM+H §5–6. With the `local` transport every node is a thread of this process; with
//! `shm` and `udp` every node is its own `ambidex node` process (docs/cluster.md), which
//! this process starts, drives through the control protocol, and whose reports it
//! combines into the same report (`--in-process` keeps them in this process). The run is
//! configured by one `Config`: `--config FILE`, then the flags.

use crate::config_args::{set, ConfigArgs};
use crate::plot::{draw, Plot, PlotError};
use ambidex::bench::launch::{
    check_kills, check_restarts, run_node_processes, FaultError, KillSpec, LaunchError,
    LaunchOptions, RestartSpec,
};
use ambidex::bench::report::{one_sided_line, policy_line};
use ambidex::bench::{run_bench, sweep_coroutines, BenchError, BenchReport, SweepPoint};
use ambidex::config::{ClusterSection, FaultSection, Transport};
use ambidex::Config;
use serde::Serialize;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub cfg: ConfigArgs,
    /// The workload, by its registered name (the `bench` subcommands name the built-in
    /// ones; a program with its own workloads names them here) [default: the config
    /// file's `run.workload`, smallbank].
    #[arg(long)]
    pub workload: Option<String>,
    /// Transport: `local` (every node a thread of this process), `shm` (one process per
    /// node on this host, shared memory) or `udp` (one process per node, UDP; loopback
    /// unless the config file gives addresses) [default: local].
    #[arg(long)]
    pub transport: Option<Transport>,
    /// shm, udp: open every node in this process instead of one process per node.
    #[arg(long)]
    pub in_process: bool,
    /// Start each node process through this command, `{node}` replaced by the node id
    /// (e.g. `ip netns exec ns{node}`).
    #[arg(long, value_name = "CMD")]
    pub node_wrapper: Option<String>,
    /// Seconds every node process has to load its share and open its transport.
    #[arg(long, default_value_t = 600.0)]
    pub node_timeout: f64,
    /// Fault injector: probability of dropping each datagram sent.
    #[arg(long)]
    pub fault_drop: Option<f64>,
    /// Fault injector: probability of duplicating a datagram.
    #[arg(long)]
    pub fault_duplicate: Option<f64>,
    /// Fault injector: probability of holding a datagram back past the next batch.
    #[arg(long)]
    pub fault_reorder: Option<f64>,
    /// Fault injector: probability of delaying a datagram (up to --fault-max-delay-us).
    #[arg(long)]
    pub fault_delay: Option<f64>,
    #[arg(long)]
    pub fault_max_delay_us: Option<u64>,
    #[arg(long)]
    pub fault_seed: Option<u64>,
    /// Measured seconds [default: 5].
    #[arg(long)]
    pub duration: Option<f64>,
    /// Seconds run before measuring [default: 1].
    #[arg(long)]
    pub warmup: Option<f64>,
    /// [default: 42]
    #[arg(long)]
    pub seed: Option<u64>,
    /// Object store: keys read per transaction [default: 4].
    #[arg(long)]
    pub r: Option<usize>,
    /// Object store: keys of those updated [default: 2].
    #[arg(long)]
    pub w: Option<usize>,
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
    /// Draw the throughput timeline (committed/s per 10 ms over the whole run, with
    /// the kills, deaths and manager events marked) to this SVG file.
    #[arg(long, value_name = "FILE")]
    pub plot_timeline: Option<PathBuf>,
    /// Node processes: SIGKILL node NODE SECONDS after the run started (after `start`
    /// was sent; warmup included). Repeatable. With the manager on the run goes on
    /// without it and reports the failure; with `--manager none` it fails the run.
    /// `NODE@commit:SECONDS`: after SECONDS the node SIGKILLs itself the next time its
    /// coordinators are in the commit phase (between the first commit-backup write and
    /// the end of commit-primary; several at once preferred).
    #[arg(long, value_name = "NODE@[commit:]SECONDS", value_parser = parse_kill)]
    pub kill: Vec<KillSpec>,
    /// Node processes, with a manager (embedded or etcd): start dead node NODE again
    /// SECONDS after the run started (or as soon after as the manager removed it), with
    /// the same id, an empty database and the next incarnation; it rejoins, is
    /// re-replicated into and runs the workload again. After a `--kill` of NODE before
    /// SECONDS the restart waits for that death; without one, NODE must be dead at
    /// SECONDS (killed from outside, by its pid, or dead of anything), and if it is
    /// alive then it is not restarted (a note on stderr and in the report's
    /// `restarts_not_done`). Repeatable, with a `--kill` of NODE between two restarts.
    #[arg(long, value_name = "NODE@SECONDS", value_parser = parse_restart)]
    pub restart: Vec<RestartSpec>,
    /// Record every transaction to this JSON-lines file (docs/history-format.md).
    #[arg(long)]
    pub history: Option<PathBuf>,
    /// No progress bar while loading.
    #[arg(long)]
    pub no_progress: bool,
    #[arg(long)]
    pub json: bool,
}

/// A `--kill` or `--restart` value that does not parse.
#[derive(Debug, thiserror::Error)]
pub enum NodeAtError {
    /// No `@`.
    #[error("{0:?}: expected NODE@SECONDS, e.g. 2@1.5")]
    NoAt(String),
    /// The node is not a node id.
    #[error("{arg:?}: node {node:?}: {source}")]
    Node {
        /// The whole value.
        arg: String,
        /// Its node part.
        node: String,
        /// Why.
        #[source]
        source: std::num::ParseIntError,
    },
    /// The seconds are not a number.
    #[error("{arg:?}: seconds {seconds:?}: {source}")]
    Seconds {
        /// The whole value.
        arg: String,
        /// Its seconds part.
        seconds: String,
        /// Why.
        #[source]
        source: std::num::ParseFloatError,
    },
    /// `commit:` in a restart.
    #[error("{0:?}: a restart is NODE@SECONDS")]
    CommitRestart(String),
}

/// NODE@SECONDS; the seconds' text may start with `commit:` (returned as true).
fn parse_node_at(s: &str) -> Result<(u16, f64, bool), NodeAtError> {
    let (n, t) = s
        .split_once('@')
        .ok_or_else(|| NodeAtError::NoAt(s.into()))?;
    let node = n.trim().parse().map_err(|source| NodeAtError::Node {
        arg: s.into(),
        node: n.into(),
        source,
    })?;
    let (in_commit, t) = match t.trim().strip_prefix("commit:") {
        Some(rest) => (true, rest),
        None => (false, t),
    };
    let seconds: f64 = t.trim().parse().map_err(|source| NodeAtError::Seconds {
        arg: s.into(),
        seconds: t.into(),
        source,
    })?;
    Ok((node, seconds, in_commit))
}

fn parse_kill(s: &str) -> Result<KillSpec, NodeAtError> {
    let (node, seconds, in_commit) = parse_node_at(s)?;
    Ok(KillSpec {
        node,
        seconds,
        in_commit,
    })
}

fn parse_restart(s: &str) -> Result<RestartSpec, NodeAtError> {
    match parse_node_at(s)? {
        (_, _, true) => Err(NodeAtError::CommitRestart(s.into())),
        (node, seconds, false) => Ok(RestartSpec { node, seconds }),
    }
}

/// An `ambidex bench` run that could not be made (a run whose workload check failed
/// is a report: see [`Outcome`]).
#[derive(Debug, thiserror::Error)]
pub enum BenchCmdError {
    /// The configuration (the file, the flags, or the whole).
    #[error(transparent)]
    Config(#[from] ambidex::config::ConfigError),
    /// The workload's name.
    #[error(transparent)]
    UnknownWorkload(#[from] ambidex::workload::UnknownWorkload),
    /// A flag that needs node processes, in a run without them.
    #[error("{flag} {what}: use --transport shm or udp (without --in-process)")]
    NeedsNodeProcesses {
        /// The flag(s).
        flag: &'static str,
        /// What it does ("applies to node processes").
        what: &'static str,
    },
    /// A sweep over node processes.
    #[error(
        "--sweep-coroutines runs every node in this process: use --transport local, or \
         --in-process"
    )]
    SweepNeedsOneProcess,
    /// A sweep with no or zero counts.
    #[error("--sweep-coroutines needs positive counts, e.g. 1,2,4,8,16")]
    SweepCounts,
    /// A kill or restart the run cannot do.
    #[error(transparent)]
    Fault(#[from] FaultError),
    /// A run over node processes.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// A run in this process.
    #[error(transparent)]
    Bench(#[from] BenchError),
    /// A plot.
    #[error(transparent)]
    Plot(#[from] PlotError),
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

/// The run's configuration: the defaults, `--config FILE`, then the flags (and the
/// subcommand's workload, if any); validated.
pub fn config(workload: Option<&str>, a: &Args) -> Result<Config, BenchCmdError> {
    let mut c = a.cfg.resolve(&Config::default())?;
    if let Some(w) = workload.or(a.workload.as_deref()) {
        c.run.workload = w.to_string();
    }
    set(&mut c.cluster.transport, a.transport);
    set(&mut c.run.duration_s, a.duration);
    set(&mut c.run.warmup_s, a.warmup);
    set(&mut c.run.seed, a.seed);
    set(&mut c.run.r, a.r);
    set(&mut c.run.w, a.w);
    if a.same_node {
        c.run.same_node = true;
    }
    if let Some(h) = &a.history {
        c.run.history = Some(h.display().to_string());
    }
    if fault_flags(a) {
        let f = c.fault.get_or_insert_with(FaultSection::default);
        set(&mut f.drop, a.fault_drop);
        set(&mut f.duplicate, a.fault_duplicate);
        set(&mut f.reorder, a.fault_reorder);
        set(&mut f.delay, a.fault_delay);
        set(&mut f.max_delay_us, a.fault_max_delay_us);
        set(&mut f.seed, a.fault_seed);
    }
    c.run.progress = !a.no_progress && !a.json;
    c.validate()?;
    // The workload's own defaults (coroutines, scale) filled in: node processes run
    // exactly this configuration.
    Ok(crate::registry().resolve(&c)?)
}

fn fault_flags(a: &Args) -> bool {
    a.fault_drop.is_some()
        || a.fault_duplicate.is_some()
        || a.fault_reorder.is_some()
        || a.fault_delay.is_some()
        || a.fault_max_delay_us.is_some()
        || a.fault_seed.is_some()
}

/// True if this run starts one node process per node.
fn multi_process(c: &ClusterSection, a: &Args) -> Result<bool, BenchCmdError> {
    let multi = c.transport != Transport::Local && !a.in_process;
    if !multi && a.node_wrapper.is_some() {
        return Err(BenchCmdError::NeedsNodeProcesses {
            flag: "--node-wrapper",
            what: "applies to node processes",
        });
    }
    Ok(multi)
}

pub fn run(workload: Option<&str>, a: &Args) -> Result<Outcome, BenchCmdError> {
    let cfg = config(workload, a)?;
    let acts_on_nodes = !a.kill.is_empty() || !a.restart.is_empty();
    if acts_on_nodes && !multi_process(&cfg.cluster, a)? {
        return Err(BenchCmdError::NeedsNodeProcesses {
            flag: "--kill and --restart",
            what: "act on node processes",
        });
    }
    check_kills(&a.kill, &cfg)?;
    check_restarts(&a.restart, &a.kill, &cfg)?;
    let r = run_one_or_sweep(a, &cfg)?;
    if let (Some(path), Outcome::One(r)) = (&a.plot_timeline, &r) {
        plot_timeline(r, path)?;
    }
    Ok(r)
}

fn plot_timeline(r: &BenchReport, path: &Path) -> Result<(), BenchCmdError> {
    let mut marks: Vec<(f64, String)> = Vec::new();
    for k in &r.kills {
        marks.push((k.at_ms, format!("kill {}", k.node)));
    }
    for f in &r.failures {
        marks.push((f.at_ms, format!("{} died", f.node)));
    }
    for s in &r.restarts {
        marks.push((s.at_ms, format!("restart {}", s.node)));
    }
    for e in &r.manager_events {
        let what = serde_json::to_value(&e.what)
            .ok()
            .and_then(|v| match v {
                serde_json::Value::String(s) => Some(s),
                serde_json::Value::Object(m) => m.keys().next().cloned(),
                _ => None,
            })
            .unwrap_or_default();
        marks.push((e.at_ms, what));
    }
    draw(
        Plot::Timeline {
            buckets: &r.timeline_10ms,
            marks: &marks,
        },
        &format!("{}: committed transactions/s over time", r.workload),
        path,
    )?;
    Ok(())
}

fn run_one_or_sweep(a: &Args, cfg: &Config) -> Result<Outcome, BenchCmdError> {
    let cfg = cfg.clone();
    let workload = cfg.run.workload.clone();
    if multi_process(&cfg.cluster, a)? {
        if a.sweep_coroutines.is_some() {
            return Err(BenchCmdError::SweepNeedsOneProcess);
        }
        let opts = LaunchOptions {
            node_wrapper: a.node_wrapper.clone(),
            node_timeout_s: a.node_timeout,
            kills: a.kill.clone(),
            restarts: a.restart.clone(),
        };
        let r = run_node_processes(crate::registry(), cfg, &opts)?;
        if let Some(path) = &a.plot {
            draw(
                Plot::Phases(&r.phase_means_us),
                &format!("{workload}: mean time per phase"),
                path,
            )?;
        }
        return Ok(Outcome::One(Box::new(r)));
    }
    if let Some(counts) = &a.sweep_coroutines {
        if counts.is_empty() || counts.contains(&0) {
            return Err(BenchCmdError::SweepCounts);
        }
        let (points, runs) = sweep_coroutines(crate::registry(), &cfg, counts)?;
        if let Some(path) = &a.plot {
            draw(
                Plot::Sweep(&points),
                &format!("{workload}: throughput vs latency"),
                path,
            )?;
        }
        return Ok(Outcome::Sweep(SweepReport { points, runs }));
    }
    let r = run_bench(crate::registry(), &cfg)?;
    if let Some(path) = &a.plot {
        draw(
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
    let warehouses = match r.check["warehouses"].as_u64() {
        Some(w) => format!(", {w} warehouses"),
        None => String::new(),
    };
    println!(
        "ambidex {}: {} transport, {} nodes x {} threads x {} coroutines, R={}, scale {}{warehouses}",
        r.workload, r.transport, r.nodes, r.threads_per_node, r.coroutines, r.replication, r.scale
    );
    println!("  {}", policy_line(&r.policy));
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
        "  attempts {}: committed {}, aborted {} ({:.2}%; conflicts {:.2}%), retried {}, given up {}",
        r.attempts,
        r.committed,
        r.aborted,
        r.abort_rate * 100.0,
        r.conflict_abort_rate * 100.0,
        r.retries,
        r.gave_up
    );
    println!(
        "  aborts by reason: {}",
        if reasons.is_empty() {
            "-".to_string()
        } else {
            reasons.join(" ")
        }
    );
    if let Some(ok) = r.invariant_ok {
        let what = match r.workload.as_str() {
            "smallbank" => "total balance",
            "stress" => "every group whole or absent",
            "tpce" => "LAST_TRADE volume, every feed seen whole",
            _ => "the workload's check",
        };
        println!(
            "  invariant ({what}): {}",
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
    println!("  {}", one_sided_line(&r.one_sided, &r.location_cache));
    println!(
        "  peak RSS {:.0} MiB",
        r.max_rss_bytes as f64 / (1 << 20) as f64
    );
    for f in &r.failures {
        println!(
            "  node {} (pid {}) {} at {:.0} ms; the run went on without it",
            f.node, f.pid, f.how, f.at_ms
        );
    }
    for k in r.kills.iter().filter_map(|k| k.in_commit.map(|c| (k, c))) {
        println!(
            "  node {} killed itself in its commit phase at {:.0} ms ({} coordinators in it)",
            k.0.node, k.0.at_ms, k.1
        );
    }
    for rs in &r.restarts {
        let ms = |t: Option<f64>| t.map_or("never".to_string(), |t| format!("{t:.0} ms"));
        println!(
            "  node {} restarted at {:.0} ms (pid {}, incarnation {}): member again at {}, \
             re-replicated at {}; it committed {}",
            rs.node,
            rs.at_ms,
            rs.pid,
            rs.incarnation,
            ms(rs.member_ms),
            ms(rs.rereplicated_ms),
            rs.committed
        );
    }
    for n in &r.restarts_not_done {
        println!("  note at {:.0} ms: {}", n.at_ms, n.why);
    }
    if let Some(rc) = &r.recovery {
        let ms = |t: Option<f64>| t.map_or("never".to_string(), |t| format!("{t:.0} ms"));
        println!(
            "  after the failure at {:.0} ms: detected {}, reconfigured {}, recovered {}",
            rc.failed_at_ms,
            ms(rc.detected_ms),
            ms(rc.reconfigured_ms),
            ms(rc.recovered_ms)
        );
    }
    let verified: Vec<String> = r
        .remote_tables_verified
        .iter()
        .map(|n| n.to_string())
        .collect();
    println!(
        "  start-up check: other nodes' tables read one-sided and verified, by node: {}",
        verified.join(" ")
    );
}
