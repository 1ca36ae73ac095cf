//! A benchmark run whose every node is a process: start them, hand out the catalog,
//! host the manager, cause the failures asked for, and combine the reports.

use super::catalog::catalog_from_ready;
use super::error::LaunchError;
use super::faults::{check_kills, check_restarts, KillSpec, RestartSpec};
use super::manager_host::ManagerHost;
use super::processes::{Launch, NodeProcesses};
use crate::bench::combine::{combine_live_reports, node_policy, same_policy};
use crate::bench::etcd_membership;
use crate::bench::survival::{recovery, Kill, ManagerEvent, NodeFailure, Restart, RestartNotDone};
use crate::bench::{combine_node_reports, BenchReport, NodeReport};
use crate::config::{fresh_etcd_cluster, ClusterSection, ManagerKind, RunSection};
use crate::workload::Registry;
use crate::{transports, Config};
use ambidex_history::Salvaged;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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

/// How node processes are started and what they are made to suffer.
#[derive(Clone, Debug)]
pub struct LaunchOptions {
    /// Start each node process through this command, `{node}` replaced by the node id
    /// (e.g. `ip netns exec ns{node}`).
    pub node_wrapper: Option<String>,
    /// Seconds every node process has to load its share and open its transport.
    pub node_timeout_s: f64,
    /// Nodes to kill during the run.
    pub kills: Vec<KillSpec>,
    /// Nodes to start again during the run.
    pub restarts: Vec<RestartSpec>,
}

impl Default for LaunchOptions {
    fn default() -> Self {
        LaunchOptions {
            node_wrapper: None,
            node_timeout_s: 600.0,
            kills: Vec::new(),
            restarts: Vec::new(),
        }
    }
}

/// Runs `cfg`'s workload (from `reg`) with one node process per node, each this
/// program run as `PROGRAM node --config FILE --node N` (so the program must answer
/// that command line with [`node_process::run`](crate::bench::node_process::run), as
/// `ambidex_cli::main_with` does), drives them through the control protocol, and
/// combines their reports. `cfg.cluster.transport` is `shm` or `udp`.
pub fn run_node_processes(
    reg: &Registry,
    mut cfg: Config,
    opts: &LaunchOptions,
) -> Result<BenchReport, LaunchError> {
    if !(opts.node_timeout_s > 0.0 && opts.node_timeout_s <= 86400.0) {
        return Err(LaunchError::NodeTimeout(opts.node_timeout_s));
    }
    check_kills(&opts.kills, &cfg)?;
    // Which restarts wait for a kill of the launcher's.
    let after_kill = check_restarts(&opts.restarts, &opts.kills, &cfg)?;
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
    std::fs::create_dir_all(&dir).map_err(|source| LaunchError::ScratchDir {
        path: dir.display().to_string(),
        source,
    })?;
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
        wrapper: opts.node_wrapper.as_deref(),
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
    let readies = procs.wait_all("ready", Duration::from_secs_f64(opts.node_timeout_s))?;
    let load_seconds = t0.elapsed().as_secs_f64();
    // Every node runs the cluster's policy, or nothing runs: a node on another policy
    // (a stale or edited config file) would speak another protocol to its peers.
    let policy = cfg.policy()?;
    for (n, ready) in readies.iter().enumerate() {
        let n = n as u16;
        node_policy(n, ready.get("policy")).and_then(|ran| same_policy(n, ran, policy))?;
    }
    eprintln!("ambidex: every node loaded its share ({load_seconds:.1} s); running");
    // Every node learns every node's table descriptors before it starts.
    let catalog =
        catalog_from_ready(&readies, 0, nodes).map_err(|source| LaunchError::Catalog {
            restarting: None,
            source,
        })?;
    procs.send_all_json(&serde_json::json!({ "cmd": "catalog", "catalog": catalog }))?;
    // With a manager, every lease starts now (not during loading), and from now on a
    // node that dies is reported rather than fatal.
    let mut host = match (cfg.cluster.manager_spec(), cfg.cluster.manager) {
        (None, _) => None,
        (Some(_), ManagerKind::Etcd) => {
            etcd_membership::bootstrap(&cfg.cluster)?;
            if !opts.restarts.is_empty() {
                // A restart waits for etcd to have removed its node.
                let mut reader = etcd_membership::StateReader::connect(&cfg.cluster)?;
                procs.restart_view(Box::new(move || match reader.read()? {
                    (state, None) => Ok(state),
                    (_, Some(why)) => Err(LaunchError::ClusterStopped(why)),
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
    for k in &opts.kills {
        let at = run_start + Duration::from_secs_f64(k.seconds);
        if k.in_commit {
            procs.kill_in_commit_at(k.node, at)?;
        } else {
            procs.kill_at(k.node, at)?;
        }
    }
    for (r, after_kill) in opts.restarts.iter().zip(after_kill) {
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
        return Err(LaunchError::RestartsNotDone {
            count: procs.restarts_pending(),
            last_read: procs.restart_view_error().map(str::to_string),
        });
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
                .map_err(|source| LaunchError::Report { node: n, source })?;
            if r.node != n {
                return Err(LaunchError::ReportOfOther {
                    node: n,
                    other: r.node,
                });
            }
            Ok(r)
        })
        .collect::<Result<Vec<_>, LaunchError>>()?;
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
            reg,
            &cfg,
            transport,
            elapsed,
            reports,
            Some(state.config.placement.clone()),
        )?,
        None => combine_node_reports(reg, &cfg, transport, elapsed, reports)?,
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
) -> Result<Salvaged, LaunchError> {
    let io = |what: String| move |source| LaunchError::History { what, source };
    let f = std::fs::File::create(out)
        .map_err(io(format!("cannot create history file {}", out.display())))?;
    let mut f = std::io::BufWriter::with_capacity(1 << 20, f);
    let mut got = Salvaged::default();
    let mut add = |n: u16, p: &Path, f: &mut std::io::BufWriter<std::fs::File>| {
        let src =
            std::fs::File::open(p).map_err(io(format!("node {n}'s history {}", p.display())))?;
        let s =
            ambidex_history::salvage(std::io::BufReader::with_capacity(1 << 20, src), f).map_err(
                io(format!("merging {} into {}", p.display(), out.display())),
            )?;
        got.records += s.records;
        got.torn += s.torn;
        let _ = std::fs::remove_file(p);
        Ok::<(), LaunchError>(())
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
        .map_err(io(format!("merging the history into {}", out.display())))?;
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
    fn state(&self, c: &ClusterSection) -> Result<ambidex_cluster::ClusterState, LaunchError> {
        match self {
            RunManager::Embedded(h) => Ok(h.state()),
            RunManager::Etcd { .. } => match etcd_membership::final_state(c)? {
                (state, None) => Ok(state),
                (_, Some(why)) => Err(LaunchError::ClusterStopped(why)),
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
) -> Result<(), LaunchError> {
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
