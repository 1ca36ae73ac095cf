//! `ambidex bench WORKLOAD`: the papers' workloads, with the report of FaSST §6 /
//! DrTM+H §5–6. With the `local` transport every node is a thread of this process; with
//! `shm` and `udp` every node is its own `ambidex node` process (docs/cluster.md), which
//! this process starts, drives through the control protocol, and whose reports it
//! combines into the same report (`--in-process` keeps shm nodes in this process).

use crate::cluster::{
    Backend, ClusterFile, ClusterSection, ClusterSpec, FaultSection, Launch, NodeProcesses,
    RpcSection, RunSection,
};
use ambidex_workloads::plot::{plot, Plot};
use ambidex_workloads::{
    combine_node_reports, run_bench, sweep_coroutines, BenchConfig, BenchReport, NodeReport,
    ObjStoreParams, SweepPoint, TransportKind, WorkloadKind,
};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Transport: `local` (every node a thread of this process), `shm` (one process per
    /// node on this host, shared memory) or `udp` (one process per node, UDP; loopback
    /// unless `--cluster-config` gives addresses).
    #[arg(long, default_value = "local")]
    pub transport: String,
    /// shm only: attach every node in this process instead of one process per node.
    #[arg(long)]
    pub in_process: bool,
    /// Take the cluster (transport, nodes, threads, shm directory or udp addresses, RPC
    /// retries, injected faults) from this JSON file (docs/cluster.md); the workload
    /// options still come from this command line.
    #[arg(long, value_name = "FILE")]
    pub cluster_config: Option<PathBuf>,
    /// Start each node process through this command, `{node}` replaced by the node id
    /// (e.g. `ip netns exec ns{node}`).
    #[arg(long, value_name = "CMD")]
    pub node_wrapper: Option<String>,
    /// Seconds every node process has to load its share and open its transport.
    #[arg(long, default_value_t = 600.0)]
    pub node_timeout: f64,
    /// RPC retransmission timeout in ms (node processes; default 20).
    #[arg(long)]
    pub rpc_timeout_ms: Option<f64>,
    /// RPC retransmissions before a destination is suspected (node processes; default 50).
    #[arg(long)]
    pub rpc_retries: Option<u32>,
    /// Fault injector (node processes): probability of dropping each datagram sent.
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
    #[arg(long, default_value_t = 3)]
    pub nodes: u16,
    /// Threads per node.
    #[arg(long, default_value_t = 1)]
    pub threads: u16,
    /// Worker coroutines per thread [default: 20; 8 for TPC-C].
    #[arg(long)]
    pub coroutines: Option<usize>,
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
    let run = run_section(workload, a);
    let cfg = bench_config(a.nodes, a.threads, &run, !a.no_progress && !a.json)?;
    Ok(BenchConfig {
        // Node processes ignore it; udp runs only as node processes.
        transport: match a.transport.as_str() {
            "udp" => TransportKind::Local,
            t => t.parse()?,
        },
        history: a.history.clone(),
        ..cfg
    })
}

/// The run options of the command line, as the cluster file's `run` section.
fn run_section(workload: &str, a: &Args) -> RunSection {
    RunSection {
        workload: workload.to_string(),
        // An unknown workload name is reported by the caller's parse of the run section.
        coroutines: a.coroutines.unwrap_or_else(|| {
            workload
                .parse::<WorkloadKind>()
                .map_or(20, |k| k.default_coroutines())
        }),
        replication: a.replication,
        scale: a.scale,
        seed: a.seed,
        warmup_s: a.warmup,
        duration_s: a.duration,
        r: a.r,
        w: a.w,
        same_node: a.same_node,
        history: a.history.as_ref().map(|p| p.display().to_string()),
    }
}

/// The benchmark configuration of a cluster file's run (for a node process).
pub fn run_config(
    cluster: &ClusterSection,
    run: &RunSection,
    progress: bool,
) -> Result<BenchConfig, String> {
    bench_config(cluster.nodes, cluster.threads, run, progress)
}

fn bench_config(
    nodes: u16,
    threads: u16,
    run: &RunSection,
    progress: bool,
) -> Result<BenchConfig, String> {
    if nodes == 0 || threads == 0 || run.coroutines == 0 {
        return Err("--nodes, --threads and --coroutines must be at least 1".into());
    }
    if run.coroutines > 4096 {
        return Err("--coroutines must be at most 4096".into());
    }
    let duration_ok = run.duration_s > 0.0 && run.duration_s <= 86400.0;
    let warmup_ok = (0.0..=3600.0).contains(&run.warmup_s);
    if !(duration_ok && warmup_ok) {
        return Err("--duration must be in (0, 86400] and --warmup in [0, 3600] seconds".into());
    }
    if let Some(s) = run.scale {
        if !(s > 0.0 && s <= 1000.0) {
            return Err("--scale must be in (0, 1000]".into());
        }
    }
    if run.w > run.r || run.r == 0 {
        return Err("object store: need 1 <= r and w <= r".into());
    }
    Ok(BenchConfig {
        workload: run.workload.parse()?,
        nodes,
        threads,
        coroutines: run.coroutines,
        replication: run.replication,
        duration_s: run.duration_s,
        warmup_s: run.warmup_s,
        scale: run.scale,
        seed: run.seed,
        transport: TransportKind::Local,
        objstore: ObjStoreParams {
            reads: run.r,
            writes: run.w,
            same_node: run.same_node,
        },
        progress,
        history: None,
    })
}

/// True if this run starts one node process per node.
fn multi_process(a: &Args) -> Result<bool, String> {
    let multi = match (a.transport.as_str(), a.in_process) {
        _ if a.cluster_config.is_some() => {
            if a.in_process {
                return Err("--cluster-config runs node processes; drop --in-process".into());
            }
            true
        }
        ("local", _) => false,
        ("shm", in_process) => !in_process,
        ("udp", false) => true,
        ("udp", true) => {
            return Err("--in-process runs local or shm; udp nodes run as processes".into())
        }
        (t, _) => return Err(format!("unknown transport {t:?} (local, shm, udp)")),
    };
    if !multi {
        let node_only = a.node_wrapper.is_some()
            || a.rpc_timeout_ms.is_some()
            || a.rpc_retries.is_some()
            || fault_flags(a).is_some();
        if node_only {
            return Err(
                "--node-wrapper, --rpc-* and --fault-* apply to node processes: \
                 use --transport shm or udp (without --in-process)"
                    .into(),
            );
        }
    }
    Ok(multi)
}

fn fault_flags(a: &Args) -> Option<()> {
    (a.fault_drop.is_some()
        || a.fault_duplicate.is_some()
        || a.fault_reorder.is_some()
        || a.fault_delay.is_some()
        || a.fault_max_delay_us.is_some()
        || a.fault_seed.is_some())
    .then_some(())
}

pub fn run(workload: &str, a: &Args) -> Result<Outcome, String> {
    let cfg = config(workload, a)?;
    if multi_process(a)? {
        if a.sweep_coroutines.is_some() {
            return Err("--sweep-coroutines runs every node in this process: use \
                 --transport local, or shm with --in-process"
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

/// Removes the run's scratch directory and the shm cluster directory, however the run ends.
struct RunFiles {
    dir: PathBuf,
    spec: Option<ClusterSpec>,
}

impl Drop for RunFiles {
    fn drop(&mut self) {
        if let Some(spec) = &self.spec {
            spec.destroy();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `cfg` with one `ambidex node` process per node and combines their reports.
fn run_multi_process(a: &Args, mut cfg: BenchConfig) -> Result<BenchReport, String> {
    let mut cluster = match &a.cluster_config {
        Some(path) => {
            let file = ClusterFile::read(path)?;
            if file.run.is_some() {
                eprintln!(
                    "ambidex: note: the \"run\" section of {} is ignored; the run comes from \\
                     the command line",
                    path.display()
                );
            }
            if a.nodes != file.cluster.nodes || a.threads != file.cluster.threads {
                eprintln!(
                    "ambidex: note: {} nodes x {} threads, from {}",
                    file.cluster.nodes,
                    file.cluster.threads,
                    path.display()
                );
            }
            file.cluster
        }
        None => ClusterSection {
            transport: match a.transport.as_str() {
                "udp" => Backend::Udp,
                _ => Backend::Shm,
            },
            nodes: a.nodes,
            threads: a.threads,
            cluster_id: None,
            mtu: None,
            recv_depth: None,
            shm_dir: None,
            udp_addrs: Vec::new(),
            rpc: RpcSection::default(),
            fault: None,
        },
    };
    if let Some(ms) = a.rpc_timeout_ms {
        cluster.rpc.retransmit_timeout_ms = ms;
    }
    if let Some(n) = a.rpc_retries {
        cluster.rpc.max_retries = n;
    }
    if fault_flags(a).is_some() {
        let f = cluster.fault.get_or_insert_with(|| FaultSection {
            seed: 1,
            max_delay_us: 2000,
            ..Default::default()
        });
        f.drop = a.fault_drop.unwrap_or(f.drop);
        f.duplicate = a.fault_duplicate.unwrap_or(f.duplicate);
        f.reorder = a.fault_reorder.unwrap_or(f.reorder);
        f.delay = a.fault_delay.unwrap_or(f.delay);
        f.max_delay_us = a.fault_max_delay_us.unwrap_or(f.max_delay_us);
        f.seed = a.fault_seed.unwrap_or(f.seed);
    }
    cluster.validate()?;
    cfg.nodes = cluster.nodes;
    cfg.threads = cluster.threads;
    check_replication(&cfg)?;
    if !(a.node_timeout > 0.0 && a.node_timeout <= 86400.0) {
        return Err("--node-timeout must be in (0, 86400] seconds".into());
    }
    // Where the nodes meet on this host, unless the file says.
    let here = ClusterSpec::on_this_host(cluster.transport, cluster.cluster_config()?);
    if cluster.transport == Backend::Shm && cluster.shm_dir.is_none() {
        cluster.shm_dir = here.shm_dir;
    }
    if cluster.transport == Backend::Udp && cluster.udp_addrs.is_empty() {
        cluster.udp_addrs = here.udp_addrs;
    }
    let spec = cluster.spec()?;
    let dir = std::env::temp_dir().join(format!(
        "ambidex-run-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
    ));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut files = RunFiles { dir, spec: None };
    spec.create()?;
    files.spec = Some(spec);
    let run = run_section(cfg.workload.name(), a);
    let give_up = cluster.rpc.give_up_after();
    let file = ClusterFile {
        cluster,
        run: Some(run.clone()),
    };
    let config_path = files.dir.join("cluster.json");
    file.write(&config_path)?;

    let mut procs = NodeProcesses::spawn(&Launch {
        config: &config_path,
        nodes: cfg.nodes,
        wrapper: a.node_wrapper.as_deref(),
        progress: cfg.progress,
    })?;
    let pids: Vec<String> = procs
        .pids()
        .iter()
        .enumerate()
        .map(|(n, p)| format!("{n}={p}"))
        .collect();
    eprintln!(
        "ambidex: started {} {} node processes (node=pid: {})",
        cfg.nodes,
        file.cluster.transport.name(),
        pids.join(" ")
    );
    let t0 = Instant::now();
    procs.wait_all("ready", Duration::from_secs_f64(a.node_timeout))?;
    let load_seconds = t0.elapsed().as_secs_f64();
    eprintln!("ambidex: every node loaded its share ({load_seconds:.1} s); running");
    procs.send_all("start")?;
    procs.watch(Duration::from_secs_f64(cfg.warmup_s))?;
    procs.send_all("measure")?;
    let tm = Instant::now();
    procs.watch(Duration::from_secs_f64(cfg.duration_s))?;
    procs.send_all("stop")?;
    let elapsed = tm.elapsed().as_secs_f64();
    // A worker may be waiting out retransmissions in each phase of its transaction.
    let drain = give_up * 6 + Duration::from_secs(30);
    procs.wait_all("workers_done", drain)?;
    procs.send_all("finish")?;
    let reports = procs.wait_all("report", Duration::from_secs(600))?;
    procs.wait_exits(Duration::from_secs(10))?;
    let reports = reports
        .into_iter()
        .enumerate()
        .map(|(n, mut v)| {
            let r: NodeReport = serde_json::from_value(v["report"].take())
                .map_err(|e| format!("node {n} sent a malformed report: {e}"))?;
            if r.node as usize != n {
                return Err(format!("node {n} sent the report of node {}", r.node));
            }
            Ok(r)
        })
        .collect::<Result<Vec<_>, String>>()?;
    let mut report = combine_node_reports(&cfg, file.cluster.transport.name(), elapsed, reports)?;
    report.load_seconds = load_seconds;
    if let Some(h) = &run.history {
        if !h.contains("{node}") {
            merge_histories(Path::new(h), &run, cfg.nodes)?;
        }
    }
    drop(files);
    Ok(report)
}

fn check_replication(cfg: &BenchConfig) -> Result<(), String> {
    if cfg.replication == 0 || cfg.replication > cfg.nodes {
        return Err(format!(
            "replication factor {} must be between 1 and the number of nodes ({})",
            cfg.replication, cfg.nodes
        ));
    }
    Ok(())
}

/// Concatenates the nodes' history files into `out` (record order carries no meaning)
/// and removes them.
fn merge_histories(out: &Path, run: &RunSection, nodes: u16) -> Result<(), String> {
    let mut f = std::fs::File::create(out)
        .map_err(|e| format!("cannot create history file {}: {e}", out.display()))?;
    for n in 0..nodes {
        let part = run.history_for(n).expect("history is on");
        let mut src = std::fs::File::open(&part)
            .map_err(|e| format!("node {n}'s history {}: {e}", part.display()))?;
        std::io::copy(&mut src, &mut f)
            .map_err(|e| format!("merging the history into {}: {e}", out.display()))?;
        let _ = std::fs::remove_file(&part);
    }
    Ok(())
}
