//! `ambidex bench WORKLOAD`: the papers' workloads, with the report of FaSST §6 /
//! DrTM+H §5–6. With the `local` transport every node is a thread of this process; with
//! `shm` and `udp` every node is its own `ambidex node` process (docs/cluster.md), which
//! this process starts, drives through the control protocol, and whose reports it
//! combines into the same report (`--in-process` keeps them in this process). The run is
//! configured by one `Config`: `--config FILE`, then the flags.

use crate::cluster::{Launch, NodeProcesses};
use crate::config_args::{set, ConfigArgs};
use crate::manager_host::ManagerHost;
use crate::plot::{plot, Plot};
use ambidex::bench::combine::combine_live_reports;
use ambidex::bench::combine::{node_policy, same_policy};
use ambidex::bench::etcd_membership;
use ambidex::bench::report::{one_sided_line, policy_line};
use ambidex::bench::survival::{
    recovery, Kill, ManagerEvent, NodeFailure, Restart, RestartNotDone,
};
use ambidex::bench::{
    combine_node_reports, run_bench, sweep_coroutines, BenchReport, NodeReport, SweepPoint,
};
use ambidex::config::Transport;
use ambidex::config::{fresh_etcd_cluster, ClusterSection, FaultSection, ManagerKind, RunSection};
use ambidex::history::Salvaged;
use ambidex::{transports, Config};
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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

/// `--kill NODE@SECONDS` or `NODE@commit:SECONDS`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KillSpec {
    pub node: u16,
    pub seconds: f64,
    /// The node kills itself in its commit phase (after `seconds`).
    pub in_commit: bool,
}

/// `--restart NODE@SECONDS`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RestartSpec {
    pub node: u16,
    pub seconds: f64,
}

/// NODE@SECONDS; the seconds' text may start with `commit:` (returned as true).
fn parse_node_at(s: &str) -> Result<(u16, f64, bool), String> {
    let (n, t) = s
        .split_once('@')
        .ok_or_else(|| format!("{s:?}: expected NODE@SECONDS, e.g. 2@1.5"))?;
    let node = n
        .trim()
        .parse()
        .map_err(|e| format!("{s:?}: node {n:?}: {e}"))?;
    let (in_commit, t) = match t.trim().strip_prefix("commit:") {
        Some(rest) => (true, rest),
        None => (false, t),
    };
    let seconds: f64 = t
        .trim()
        .parse()
        .map_err(|e| format!("{s:?}: seconds {t:?}: {e}"))?;
    Ok((node, seconds, in_commit))
}

fn parse_kill(s: &str) -> Result<KillSpec, String> {
    let (node, seconds, in_commit) = parse_node_at(s)?;
    Ok(KillSpec {
        node,
        seconds,
        in_commit,
    })
}

fn parse_restart(s: &str) -> Result<RestartSpec, String> {
    match parse_node_at(s)? {
        (_, _, true) => Err(format!("{s:?}: a restart is NODE@SECONDS")),
        (node, seconds, false) => Ok(RestartSpec { node, seconds }),
    }
}

/// Refuses kills of nodes the run does not have, or outside the run (after the start,
/// before the end of the measured window).
fn check_kills(kills: &[KillSpec], cfg: &Config) -> Result<(), String> {
    let run = cfg.run.warmup_s + cfg.run.duration_s;
    for k in kills {
        // A node that finds no moment in its commit phase dies at its give-up (1 s,
        // `ambidex::bench::lost`): still inside the run.
        if k.in_commit && k.seconds + 1.2 > run {
            return Err(format!(
                "--kill {}@commit:{}: a commit-phase kill must leave 1.2 s of the run \
                 (SECONDS <= warmup + duration - 1.2 = {:.1})",
                k.node,
                k.seconds,
                run - 1.2
            ));
        }
        if k.node >= cfg.cluster.nodes {
            return Err(format!(
                "--kill {}@{}: the cluster has nodes 0..{}",
                k.node, k.seconds, cfg.cluster.nodes
            ));
        }
        if !(k.seconds > 0.0 && k.seconds < run) {
            return Err(format!(
                "--kill {}@{}: the time must be after the start and before the run ends \
                 (0 < SECONDS < warmup + duration = {run})",
                k.node, k.seconds
            ));
        }
    }
    Ok(())
}

/// Refuses restarts outside the run, without a manager (the restarted node joins
/// through it), or of a node restarted before and not killed again since. Returns, per
/// restart, whether a `--kill` of its node comes before it (after the node's previous
/// restart, if any): such a restart waits for that death, any other one restarts the
/// node only if it is dead at its time (killed from outside, or it died).
fn check_restarts(
    restarts: &[RestartSpec],
    kills: &[KillSpec],
    cfg: &Config,
) -> Result<Vec<bool>, String> {
    let run = cfg.run.warmup_s + cfg.run.duration_s;
    let mut after_kill = Vec::new();
    for r in restarts {
        let what = format!("--restart {}@{}", r.node, r.seconds);
        if cfg.cluster.manager_spec().is_none() {
            return Err(format!(
                "{what}: a restarted node rejoins through a configuration manager \
                 (--manager embedded or etcd)"
            ));
        }
        if r.node >= cfg.cluster.nodes {
            return Err(format!(
                "{what}: the cluster has nodes 0..{}",
                cfg.cluster.nodes
            ));
        }
        if !(r.seconds > 0.0 && r.seconds < run) {
            return Err(format!(
                "{what}: the time must be before the run ends (0 < SECONDS < warmup + \
                 duration = {run})"
            ));
        }
        let same_node = restarts.iter().filter(|o| o.node == r.node);
        if same_node.clone().filter(|o| o.seconds == r.seconds).count() > 1 {
            return Err(format!("{what}: the same restart twice"));
        }
        // The node's previous restart, if any.
        let previous = same_node
            .map(|o| o.seconds)
            .filter(|&t| t < r.seconds)
            .fold(None, |m: Option<f64>, t| Some(m.map_or(t, |m| m.max(t))));
        let killed_since = |from: f64| {
            kills
                .iter()
                .any(|k| k.node == r.node && k.seconds > from && k.seconds < r.seconds)
        };
        if let Some(p) = previous {
            if !killed_since(p) {
                return Err(format!(
                    "{what}: node {} is restarted at {p} s and again before being killed \
                     again (--kill {}@SECONDS, {p} < SECONDS < {})",
                    r.node, r.node, r.seconds
                ));
            }
        }
        after_kill.push(killed_since(previous.unwrap_or(f64::NEG_INFINITY)));
    }
    Ok(after_kill)
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
pub fn config(workload: Option<&str>, a: &Args) -> Result<Config, String> {
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
fn multi_process(c: &ClusterSection, a: &Args) -> Result<bool, String> {
    let multi = c.transport != Transport::Local && !a.in_process;
    if !multi && a.node_wrapper.is_some() {
        return Err(
            "--node-wrapper applies to node processes: use --transport shm or udp \
             (without --in-process)"
                .into(),
        );
    }
    Ok(multi)
}

pub fn run(workload: Option<&str>, a: &Args) -> Result<Outcome, String> {
    let cfg = config(workload, a)?;
    let acts_on_nodes = !a.kill.is_empty() || !a.restart.is_empty();
    if acts_on_nodes && !multi_process(&cfg.cluster, a)? {
        return Err(
            "--kill and --restart act on node processes: use --transport shm or udp \
             (without --in-process)"
                .into(),
        );
    }
    check_kills(&a.kill, &cfg)?;
    check_restarts(&a.restart, &a.kill, &cfg)?;
    let r = run_one_or_sweep(a, &cfg)?;
    if let (Some(path), Outcome::One(r)) = (&a.plot_timeline, &r) {
        plot_timeline(r, path)?;
    }
    Ok(r)
}

fn plot_timeline(r: &BenchReport, path: &Path) -> Result<(), String> {
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
    plot(
        Plot::Timeline {
            buckets: &r.timeline_10ms,
            marks: &marks,
        },
        &format!("{}: committed transactions/s over time", r.workload),
        path,
    )
}

fn run_one_or_sweep(a: &Args, cfg: &Config) -> Result<Outcome, String> {
    let cfg = cfg.clone();
    let workload = cfg.run.workload.clone();
    if multi_process(&cfg.cluster, a)? {
        if a.sweep_coroutines.is_some() {
            return Err("--sweep-coroutines runs every node in this process: use \
                 --transport local, or --in-process"
                .into());
        }
        let r = run_multi_process(a, cfg)?;
        if let Some(path) = &a.plot {
            plot(
                Plot::Phases(&r.phase_means_us),
                &format!("{workload}: mean time per phase"),
                path,
            )?;
        }
        return Ok(Outcome::One(Box::new(r)));
    }
    if let Some(counts) = &a.sweep_coroutines {
        if counts.is_empty() || counts.contains(&0) {
            return Err("--sweep-coroutines needs positive counts, e.g. 1,2,4,8,16".into());
        }
        let (points, runs) = sweep_coroutines(crate::registry(), &cfg, counts)?;
        if let Some(path) = &a.plot {
            plot(
                Plot::Sweep(&points),
                &format!("{workload}: throughput vs latency"),
                path,
            )?;
        }
        return Ok(Outcome::Sweep(SweepReport { points, runs }));
    }
    let r = run_bench(crate::registry(), &cfg)?;
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

/// Removes the run's scratch directory and the shm cluster directory, however the run ends.
struct RunFiles {
    dir: PathBuf,
    cluster: Option<ClusterSection>,
}

impl Drop for RunFiles {
    fn drop(&mut self) {
        if let Some(c) = &self.cluster {
            transports::destroy(c);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `cfg` with one `ambidex node` process per node and combines their reports.
fn run_multi_process(a: &Args, mut cfg: Config) -> Result<BenchReport, String> {
    if !(a.node_timeout > 0.0 && a.node_timeout <= 86400.0) {
        return Err("--node-timeout must be in (0, 86400] seconds".into());
    }
    // Which restarts wait for a kill of the launcher's (`run` checked them).
    let after_kill = check_restarts(&a.restart, &a.kill, &cfg)?;
    // Where the nodes meet on this host, unless the file says.
    transports::on_this_host(&mut cfg.cluster);
    // With etcd, every node must join the same new cluster there.
    if cfg.cluster.manager == ManagerKind::Etcd && cfg.cluster.etcd_cluster.is_none() {
        cfg.cluster.etcd_cluster = Some(fresh_etcd_cluster());
    }
    let dir = std::env::temp_dir().join(format!(
        "ambidex-run-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
    ));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut files = RunFiles { dir, cluster: None };
    transports::create(&cfg.cluster)?;
    files.cluster = Some(cfg.cluster.clone());
    let give_up = cfg.rpc.give_up_after();
    let config_path = files.dir.join("config.json");
    cfg.write(&config_path)?;
    let nodes = cfg.cluster.nodes;
    let path = config_path.display().to_string();
    let progress = cfg.run.progress;
    let args = |n: u16| {
        let mut v: Vec<String> = ["node", "--config", &path, "--node", &n.to_string()]
            .map(String::from)
            .to_vec();
        // Node 0 shows the loading progress bar; the others load silently.
        if !(progress && n == 0) {
            v.push("--no-progress".into());
        }
        v
    };
    let mut procs = NodeProcesses::spawn(&Launch {
        args: &args,
        nodes: 0..nodes,
        wrapper: a.node_wrapper.as_deref(),
    })?;
    let pids: Vec<String> = procs
        .pids()
        .iter()
        .enumerate()
        .map(|(n, p)| format!("{n}={p}"))
        .collect();
    eprintln!(
        "ambidex: started {nodes} {} node processes (node=pid: {})",
        cfg.cluster.transport,
        pids.join(" ")
    );
    let t0 = Instant::now();
    let readies = procs.wait_all("ready", Duration::from_secs_f64(a.node_timeout))?;
    let load_seconds = t0.elapsed().as_secs_f64();
    // Every node runs the cluster's policy, or nothing runs: a node on another policy
    // (a stale or edited config file) would speak another protocol to its peers.
    let policy = cfg.policy()?;
    for (n, ready) in readies.iter().enumerate() {
        let n = n as u16;
        node_policy(n, ready.get("policy"))
            .and_then(|ran| same_policy(n, ran, policy))
            .map_err(|e| e.to_string())?;
    }
    eprintln!("ambidex: every node loaded its share ({load_seconds:.1} s); running");
    // Every node learns every node's table descriptors before it starts.
    let catalog = crate::cluster::catalog_from_ready(&readies, 0, nodes)?;
    procs.send_all_json(&serde_json::json!({ "cmd": "catalog", "catalog": catalog }))?;
    // With a manager, every lease starts now (not during loading), and from now on a
    // node that dies is reported rather than fatal.
    let mut host = match (cfg.cluster.manager_spec(), cfg.cluster.manager) {
        (None, _) => None,
        (Some(_), ManagerKind::Etcd) => {
            etcd_membership::bootstrap(&cfg.cluster)?;
            if !a.restart.is_empty() {
                // A restart waits for etcd to have removed its node.
                let mut reader = etcd_membership::StateReader::connect(&cfg.cluster)?;
                procs.restart_view(Box::new(move || match reader.read()? {
                    (state, None) => Ok(state),
                    (_, Some(why)) => Err(format!("the cluster could not go on: {why}")),
                }));
            }
            procs.survive_deaths(true);
            Some(RunManager::Etcd { start_ns: 0 })
        }
        (Some(m), _) => {
            let mut h = ManagerHost::start(nodes, cfg.cluster.replication, m.lease)?;
            procs.answer_manager_calls(h.manager());
            h.start_pushing(procs.stdins())?;
            procs.survive_deaths(true);
            Some(RunManager::Embedded(h))
        }
    };
    let run_start = Instant::now();
    if let Some(h) = &mut host {
        h.mark_start();
    }
    procs.send_all("start")?;
    for k in &a.kill {
        let at = run_start + Duration::from_secs_f64(k.seconds);
        if k.in_commit {
            procs.kill_in_commit_at(k.node, at)?;
        } else {
            procs.kill_at(k.node, at)?;
        }
    }
    for (r, after_kill) in a.restart.iter().zip(after_kill) {
        let at = run_start + Duration::from_secs_f64(r.seconds);
        procs.restart_at(r.node, at, after_kill)?;
    }
    procs.watch(Duration::from_secs_f64(cfg.run.warmup_s))?;
    procs.send_all("measure")?;
    let tm = Instant::now();
    procs.watch(Duration::from_secs_f64(cfg.run.duration_s))?;
    procs.send_all("stop")?;
    let elapsed = tm.elapsed().as_secs_f64();
    if procs.restarts_pending() > 0 {
        // The node was never removed, or died too late: the run did not do what it
        // was asked.
        let last_read = procs
            .restart_view_error()
            .map(|e| format!("; the last read of the membership failed: {e}"))
            .unwrap_or_default();
        return Err(format!(
            "{} restart(s) not done before the run ended (the node must be dead and \
             removed by the manager first: is the kill early enough?){last_read}",
            procs.restarts_pending()
        ));
    }
    // A worker may be waiting out retransmissions in each phase of its transaction.
    let drain = give_up * 6 + Duration::from_secs(30);
    procs.wait_live("workers_done", drain)?;
    if let (Some(h), Some(m)) = (&host, cfg.cluster.manager_spec()) {
        settle(&mut procs, h, &cfg.cluster, m.lease)?;
    }
    // The run's membership ends here: the nodes stop their agents at finish, and the
    // lease expiries that follow are the end of the run, not failures.
    let membership = match &host {
        Some(h) => Some((h.events(), h.state(&cfg.cluster)?, h.start_ns())),
        None => None,
    };
    let etcd = matches!(host, Some(RunManager::Etcd { .. }));
    // A death from here on (during finish) fails the run again.
    procs.survive_deaths(false);
    // Every node checks under the final configuration (each counts its primaries).
    match &membership {
        Some((_, state, _)) => {
            procs.send_all_json(&serde_json::json!({ "cmd": "finish", "state": state }))?
        }
        None => procs.send_all("finish")?,
    }
    let reports = procs.wait_live("report", Duration::from_secs(600))?;
    procs.wait_exits(Duration::from_secs(10), "after its report")?;
    drop(host);
    let reports = reports
        .into_iter()
        .map(|(n, mut v)| {
            let r: NodeReport = serde_json::from_value(v["report"].take())
                .map_err(|e| format!("node {n} sent a malformed report: {e}"))?;
            if r.node != n {
                return Err(format!("node {n} sent the report of node {}", r.node));
            }
            Ok(r)
        })
        .collect::<Result<Vec<_>, String>>()?;
    // With etcd, the nodes' clients published the events: each change once, by one node.
    let membership = membership.map(|(mut events, state, start_ns)| {
        if etcd {
            events = reports
                .iter()
                .flat_map(|r| r.manager_events.iter().cloned())
                .collect();
            events.sort_by_key(|e| (e.at_ns, e.epoch));
        }
        (events, state, start_ns)
    });
    // What each restarted node's new incarnation committed (its whole timeline).
    let committed_by: Vec<(u16, u64)> = reports
        .iter()
        .map(|r| (r.node, r.timeline_10ms.iter().map(|&c| c as u64).sum()))
        .collect();
    let transport = cfg.cluster.transport.name();
    let mut report = match &membership {
        Some((_, state, _)) => combine_live_reports(
            crate::registry(),
            &cfg,
            transport,
            elapsed,
            reports,
            Some(state.config.placement.clone()),
        )?,
        None => combine_node_reports(crate::registry(), &cfg, transport, elapsed, reports)?,
    };
    report.load_seconds = load_seconds;
    let ms = |t: Instant| t.saturating_duration_since(run_start).as_secs_f64() * 1e3;
    report.failures = procs
        .deaths()
        .iter()
        .map(|d| NodeFailure {
            node: d.node,
            pid: d.pid,
            how: d.how.clone(),
            at_ms: ms(d.at),
        })
        .collect();
    report.kills = procs
        .killed()
        .iter()
        .map(|k| Kill {
            node: k.node,
            pid: k.pid,
            at_ms: ms(k.at),
            in_commit: k.in_commit,
        })
        .collect();
    if let Some((events, _, start_ns)) = &membership {
        report.manager_events = events
            .iter()
            .map(|e| ManagerEvent::new(e, *start_ns))
            .collect();
    }
    report.restarts = procs
        .restarted()
        .iter()
        .map(|r| {
            Restart {
                node: r.node,
                pid: r.pid,
                incarnation: r.incarnation,
                at_ms: ms(r.at),
                member_ms: None,
                rereplicated_ms: None,
                committed: committed_by
                    .iter()
                    .find(|c| c.0 == r.node)
                    .map_or(0, |c| c.1),
            }
            .with_events(&report.manager_events)
        })
        .collect();
    report.restarts_not_done = procs
        .not_restarted()
        .iter()
        .map(|n| RestartNotDone {
            node: n.node,
            at_ms: ms(n.at),
            why: n.why.clone(),
        })
        .collect();
    report.recovery = recovery(
        &report.kills,
        &report.failures,
        &report.manager_events,
        report
            .first_lost_commit_ns
            .zip(membership.as_ref())
            .map(|(ns, m)| (ns as f64 - m.2 as f64) / 1e6),
    );
    if let Some(h) = &cfg.run.history {
        if !h.contains("{node}") {
            let restarted: Vec<u16> = report.restarts.iter().map(|r| r.node).collect();
            merge_histories(Path::new(h), &cfg.run, nodes, &restarted)?;
        }
    }
    drop(files);
    Ok(report)
}

/// Concatenates the nodes' history files into `out` (record order carries no meaning)
/// and removes them. A killed incarnation's file is merged like the others: its
/// unwritten stretches are dropped and a record the kill tore is skipped and counted
/// ([`ambidex::history::salvage`]).
fn merge_histories(
    out: &Path,
    run: &RunSection,
    nodes: u16,
    restarts: &[u16],
) -> Result<Salvaged, String> {
    let f = std::fs::File::create(out)
        .map_err(|e| format!("cannot create history file {}: {e}", out.display()))?;
    let mut f = std::io::BufWriter::with_capacity(1 << 20, f);
    let mut got = Salvaged::default();
    let mut add = |n: u16, p: &Path, f: &mut std::io::BufWriter<std::fs::File>| {
        let src = std::fs::File::open(p)
            .map_err(|e| format!("node {n}'s history {}: {e}", p.display()))?;
        let s = ambidex::history::salvage(std::io::BufReader::with_capacity(1 << 20, src), f)
            .map_err(|e| format!("merging {} into {}: {e}", p.display(), out.display()))?;
        got.records += s.records;
        got.torn += s.torn;
        let _ = std::fs::remove_file(p);
        Ok::<(), String>(())
    };
    for n in 0..nodes {
        let part = run.history_for(n).expect("history is on");
        add(n, &part, &mut f)?;
        // A restarted node's later incarnations recorded beside it (`.incK`).
        for k in 2..=restarts.iter().filter(|&&r| r == n).count() as u64 + 1 {
            let mut p = part.clone().into_os_string();
            p.push(format!(".inc{k}"));
            add(n, &PathBuf::from(p), &mut f)?;
        }
    }
    f.flush()
        .map_err(|e| format!("merging the history into {}: {e}", out.display()))?;
    // The count of skipped fragments is said, not silently dropped.
    eprintln!(
        "ambidex: history: {} records merged into {}, {} torn record fragment(s) skipped",
        got.records,
        out.display(),
        got.torn
    );
    Ok(got)
}

/// Who holds a run's membership.
enum RunManager {
    /// The launcher's embedded manager.
    Embedded(ManagerHost),
    /// The etcd at `cluster.etcd_endpoints`; the run started at `start_ns` (system
    /// clock, ns since the Unix epoch, as the nodes' clients count).
    Etcd { start_ns: u64 },
}

impl RunManager {
    /// Marks now as the run's start.
    fn mark_start(&mut self) {
        match self {
            RunManager::Embedded(h) => h.mark_start(),
            RunManager::Etcd { start_ns } => {
                *start_ns = ambidex_transport::clock::SystemClock::shared().now_ns()
            }
        }
    }

    fn start_ns(&self) -> u64 {
        match self {
            RunManager::Embedded(h) => h.start_ns(),
            RunManager::Etcd { start_ns } => *start_ns,
        }
    }

    /// The manager's events so far; none with etcd, whose events come with the nodes'
    /// reports.
    fn events(&self) -> Vec<ambidex_cluster::Event> {
        match self {
            RunManager::Embedded(h) => h.events(),
            RunManager::Etcd { .. } => Vec::new(),
        }
    }

    /// The membership's state now. A cluster that stopped (etcd records why) is an
    /// error.
    fn state(&self, c: &ClusterSection) -> Result<ambidex_cluster::ClusterState, String> {
        match self {
            RunManager::Embedded(h) => Ok(h.state()),
            RunManager::Etcd { .. } => match etcd_membership::final_state(c)? {
                (state, None) => Ok(state),
                (_, Some(why)) => Err(format!("the cluster could not go on: {why}")),
            },
        }
    }
}

/// Lets the cluster settle before the nodes check: a node that died late in the run
/// is removed, and a reconfiguration under way (that removal, or a lease that ran out
/// on a loaded host) finishes. The checks need one configuration that every live node
/// is in and that no dead node is a member of (a dead primary's rows would be missing).
/// Waits up to 100 leases (at least 2 s), then leaves it to the check to say what is
/// wrong.
fn settle(
    procs: &mut NodeProcesses,
    host: &RunManager,
    c: &ClusterSection,
    lease: Duration,
) -> Result<(), String> {
    let until = Instant::now() + (lease * 100).max(Duration::from_secs(2));
    loop {
        let s = host.state(c)?;
        let dead_members = s.config.placement.member_mask() & procs.dead_nodes();
        let settled = s.stage == ambidex_cluster::Stage::Run && dead_members == 0;
        if settled || Instant::now() >= until {
            return Ok(());
        }
        procs.watch(Duration::from_millis(5))?;
    }
}
