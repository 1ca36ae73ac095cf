//! Deterministic simulation of a whole cluster (`ambidex sim`).
//!
//! One seed runs a whole ambidex cluster — every node's RPC runtime, transaction layer
//! and workload coroutines, with the real protocol code — in one thread, over the
//! simulated network of `ambidex-transport-sim`, and then checks everything that must
//! hold. The same seed gives the same run, bit for bit ([`SimReport::run_hash`]).
//!
//! A run ([`run`] for a registered workload, [`run_with`] for any):
//! 1. loads the workload at a tiny scale, from the seed, on one `NodeDb` per node;
//! 2. builds a stepped [`SimNet`] and, per (node, thread), a runtime whose clock is the
//!    simulated clock (offset per node: nodes' clocks are not synchronized), the
//!    transaction layer, and `coroutines` workload workers;
//! 3. schedules: each step picks, with the seeded generator, one runtime that may have
//!    work (not paused, not known idle) and runs one master step of it
//!    (`Runtime::poll_once`), charging it a seeded sliver of simulated CPU time; when every
//!    runtime is idle, time jumps to the next network event (or 1 ms, so retransmission
//!    timers fire). The fault profile ([`FaultProfile`]) starts partitions, node pauses
//!    and crashes from a second seeded stream, and restarts crashed nodes as new
//!    incarnations that rejoin (`crash-restart`) from a third. A configuration manager on simulated time
//!    and one stepped agent per node give every node a lease ([`LEASE`]) and carry the
//!    cluster through reconfigurations (`docs/simulation.md`);
//! 4. after `steps` steps, stops the workers, heals partitions, ends pauses and keeps
//!    stepping until every worker has returned, no RPC is in flight and the network is
//!    empty (or a generous budget runs out: the workers left are stuck);
//! 5. checks: no stuck coroutine; the serializability checker on the recorded history;
//!    replica consistency; every committed write installed at its primary (no committed
//!    transaction lost, none half-installed); no lock left held; no RPC left in flight;
//!    the workload's invariants (SmallBank's total, TPC-C's consistency conditions).
//!
//! Sources of nondeterminism and how they are removed: time is the simulated clock
//! (runtimes read it through `ManualClock`s); RPC session nonces come from the seed;
//! region keys come from the network's seeded generator; the network draws every fault
//! from one seeded generator in call order; the scheduler draws from its own; loading is
//! single-threaded with the driver's per-unit streams; nothing iterates a randomly
//! seeded hash map where order matters (the log replicas' map is only looked up).

pub(crate) mod checks;
mod error;
pub mod profile;

use error::RestartError;
pub use error::{SimConfigError, SimError};

pub use profile::{FaultProfile, PROFILES};

pub use crate::config::InjectedBug;

use crate::bench::driver::WorkloadVisitor;
use crate::bench::load::{build_nodes, LoadOptions};
use crate::bench::report::policy_flags;
use crate::bench::{BenchError, OneSidedCounts, PolicyReport};
use crate::config::Config;
use crate::workload::{worker_seed, Outcome, Registry, Workload};
use ambidex_cluster::{AgentCore, EventKind, Stage, SteppedClient, SteppedManager};
use ambidex_history::TxnRecord;
use ambidex_rpc::{Clock, ManualClock, RpcStats, Runtime, RuntimeConfig};
use ambidex_transport::{EndpointAddr, NodeId, SharedNode};
use ambidex_transport_sim::{mix, SimNet, SimNetStats, HASH_SEED};
use ambidex_txn::log_ring::LogRingConfig;
use ambidex_txn::recovery::{RecoveryStats, ThreadRecovery};
use ambidex_txn::runner::{start_thread, ManagerSpec, RunSpec, WorkerCtx};
use ambidex_txn::stats::LocationCacheStats;
use ambidex_txn::{NodeDb, Phase, Placement, StartError, TableSpec, TxnStats, TxnThread};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A fault placed at a fixed simulated time, in addition to the profile's.
#[derive(Clone, Debug, PartialEq)]
pub enum Scripted {
    /// The nodes of `side` are cut off from the others during `[from_ns, until_ns)`.
    Partition {
        /// The nodes cut off from the rest.
        side: Vec<NodeId>,
        /// When the partition starts (simulated ns).
        from_ns: u64,
        /// When it heals (simulated ns).
        until_ns: u64,
    },
    /// `node` is not scheduled during `[from_ns, until_ns)`.
    Pause {
        /// The node not scheduled.
        node: NodeId,
        /// When the pause starts (simulated ns).
        from_ns: u64,
        /// When it ends (simulated ns).
        until_ns: u64,
    },
}

impl Scripted {
    /// Parses `NODES@FROM..UNTIL` (`NODES` comma-separated, times in milliseconds of
    /// simulated time, for example `2@1..6` or `0,1@0.5..3`) as a partition, or as a
    /// pause of one node if `pause`.
    pub fn parse(s: &str, pause: bool) -> Result<Scripted, SimConfigError> {
        let flag = if pause { "--pause" } else { "--partition" };
        let bad = |why: &str| SimConfigError::Script {
            flag,
            arg: s.to_string(),
            why: format!("{why} (expected NODES@FROM..UNTIL in ms, e.g. 2@1..6)"),
        };
        let (nodes, window) = s.split_once('@').ok_or_else(|| bad("no '@'"))?;
        let (from, until) = window.split_once("..").ok_or_else(|| bad("no '..'"))?;
        let ms = |x: &str| -> Result<u64, SimConfigError> {
            let v: f64 = x.trim().parse().map_err(|_| bad("bad time"))?;
            if !(v.is_finite() && (0.0..=1e6).contains(&v)) {
                return Err(bad("times must be within 0..=1000000 ms"));
            }
            Ok((v * 1e6).round() as u64)
        };
        let (from_ns, until_ns) = (ms(from)?, ms(until)?);
        if from_ns >= until_ns {
            return Err(bad("the window is empty"));
        }
        let mut side = Vec::new();
        for n in nodes.split(',') {
            side.push(n.trim().parse::<NodeId>().map_err(|_| bad("bad node"))?);
        }
        side.sort_unstable();
        side.dedup();
        if pause {
            if side.len() != 1 {
                return Err(bad("a pause names one node"));
            }
            return Ok(Scripted::Pause {
                node: side[0],
                from_ns,
                until_ns,
            });
        }
        Ok(Scripted::Partition {
            side,
            from_ns,
            until_ns,
        })
    }

    fn check(&self, nodes: u16) -> Result<(), SimConfigError> {
        match self {
            Scripted::Partition { side, .. } => {
                if side.iter().any(|&n| n >= nodes)
                    || side.is_empty()
                    || side.len() >= nodes as usize
                {
                    return Err(SimConfigError::Script {
                        flag: "--partition",
                        arg: self.arg(),
                        why: format!("the cut-off side must be some, not all, of nodes 0..{nodes}"),
                    });
                }
            }
            Scripted::Pause { node, .. } => {
                if *node >= nodes {
                    return Err(SimConfigError::Script {
                        flag: "--pause",
                        arg: self.arg(),
                        why: format!("no node {node}"),
                    });
                }
            }
        }
        Ok(())
    }

    /// The command-line form.
    pub fn arg(&self) -> String {
        let ms = |ns: u64| {
            let s = format!("{:.6}", ns as f64 / 1e6);
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        };
        match self {
            Scripted::Partition {
                side,
                from_ns,
                until_ns,
            } => {
                let nodes: Vec<String> = side.iter().map(|n| n.to_string()).collect();
                format!("{}@{}..{}", nodes.join(","), ms(*from_ns), ms(*until_ns))
            }
            Scripted::Pause {
                node,
                from_ns,
                until_ns,
            } => format!("{node}@{}..{}", ms(*from_ns), ms(*until_ns)),
        }
    }
}

/// Worker coroutines per thread of a simulation unless the configuration says.
pub const SIM_COROUTINES: usize = 4;

/// The configuration `ambidex sim` starts from (a file and flags are laid over it):
/// `Config`'s defaults — 3 nodes × 1 thread, R = 3 — with 4 coroutines per thread, the
/// RPC layer retransmitting every 1 ms (the simulated round trip is 4–20 µs plus
/// queueing, so the measured timeout would sit at that floor anyway) and giving up on a
/// request 51 ms after it was first sent (which every fault profile stays well below),
/// 2,000 steps and the `chaos` profile. No backoff (`rto_max_ms` = `rto_min_ms`):
/// `chaos` cuts a node off for up to 5 ms about every millisecond, and with the timeout
/// doubling to 2 ms too few probes fit the give-up time: CI seeds (smallbank under farm
/// seed 127, tatp seeds 148 and 168) then suspected a node, which without recovery
/// breaks the run.
pub fn defaults(workload: impl Into<String>, seed: u64) -> Config {
    let mut c = Config::default();
    c.run.workload = workload.into();
    c.run.seed = seed;
    c.run.coroutines = Some(SIM_COROUTINES);
    c.rpc.rto_min_ms = 1.0;
    c.rpc.rto_max_ms = 1.0;
    c.rpc.give_up_ms = 51.0;
    c
}

/// The simulation's workload scale: `run.scale`, or the registered workload's
/// [`sim_scale`](crate::workload::WorkloadInfo::sim_scale).
pub fn scale(reg: &Registry, cfg: &Config) -> Result<f64, SimConfigError> {
    Ok(match cfg.run.scale {
        Some(s) => s,
        None => reg.entry(&cfg.run.workload)?.info().sim_scale,
    })
}

fn coroutines(cfg: &Config) -> usize {
    cfg.run.coroutines.unwrap_or(SIM_COROUTINES)
}

/// The scripted partitions and pauses of `cfg.sim`.
pub fn script(cfg: &Config) -> Result<Vec<Scripted>, SimConfigError> {
    let mut out = Vec::new();
    for p in &cfg.sim.partitions {
        out.push(Scripted::parse(p, false)?);
    }
    for p in &cfg.sim.pauses {
        out.push(Scripted::parse(p, true)?);
    }
    Ok(out)
}

/// Checks a simulation's configuration: the simulator's own limits, then everything
/// [`Config::validate`] checks. Every bad value is a clear error.
pub fn validate(cfg: &Config) -> Result<(), SimConfigError> {
    let out = |what, allowed, got: String| SimConfigError::OutOfRange { what, allowed, got };
    let (nodes, threads) = (cfg.cluster.nodes, cfg.cluster.threads);
    if !(1..=16).contains(&nodes) {
        return Err(out("nodes", "1..=16", nodes.to_string()));
    }
    if !(1..=8).contains(&threads) {
        return Err(out("threads", "1..=8", threads.to_string()));
    }
    let c = coroutines(cfg);
    if !(1..=64).contains(&c) {
        return Err(out("coroutines", "1..=64", c.to_string()));
    }
    Placement::new(nodes, cfg.cluster.replication)
        .map_err(|e| SimConfigError::Shape(e.to_string()))?;
    if cfg.sim.steps > 100_000_000 {
        return Err(out("steps", "at most 100000000", cfg.sim.steps.to_string()));
    }
    if let Some(s) = cfg.run.scale {
        if !(s.is_finite() && s > 0.0 && s <= 1.0) {
            return Err(out("scale", "in (0, 1] for a simulation", s.to_string()));
        }
    }
    if cfg.sim.trace > 1_000_000 {
        return Err(out("trace", "at most 1000000", cfg.sim.trace.to_string()));
    }
    FaultProfile::named(&cfg.sim.faults)?;
    for f in script(cfg)? {
        f.check(nodes)?;
    }
    cfg.validate()?;
    Ok(())
}

/// The command that reproduces a run of `cfg` (the settings that have flags; a run
/// configured by a file adds `--config FILE`).
pub fn command(cfg: &Config) -> String {
    let mut c = format!(
        "ambidex sim --workload {} --seed {} --steps {} --faults {}",
        cfg.run.workload, cfg.run.seed, cfg.sim.steps, cfg.sim.faults
    );
    let d = defaults(cfg.run.workload.clone(), cfg.run.seed);
    if cfg.cluster.nodes != d.cluster.nodes {
        c += &format!(" --nodes {}", cfg.cluster.nodes);
    }
    if cfg.cluster.threads != d.cluster.threads {
        c += &format!(" --threads {}", cfg.cluster.threads);
    }
    if coroutines(cfg) != coroutines(&d) {
        c += &format!(" --coroutines {}", coroutines(cfg));
    }
    if cfg.cluster.replication != d.cluster.replication {
        c += &format!(" --replication {}", cfg.cluster.replication);
    }
    if let Some(s) = cfg.run.scale {
        c += &format!(" --scale {s}");
    }
    if cfg.rpc.rto_min_ms != d.rpc.rto_min_ms {
        c += &format!(" --rpc-rto-min-ms {}", cfg.rpc.rto_min_ms);
    }
    if cfg.rpc.rto_max_ms != d.rpc.rto_max_ms {
        c += &format!(" --rpc-rto-max-ms {}", cfg.rpc.rto_max_ms);
    }
    if cfg.rpc.give_up_ms != d.rpc.give_up_ms {
        c += &format!(" --rpc-give-up-ms {}", cfg.rpc.give_up_ms);
    }
    // A bad policy fails the run before anyone reads the command.
    if let Ok(p) = cfg.policy() {
        c += &policy_flags(&p);
    }
    for f in script(cfg).unwrap_or_default() {
        match f {
            Scripted::Partition { .. } => c += &format!(" --partition {}", f.arg()),
            Scripted::Pause { .. } => c += &format!(" --pause {}", f.arg()),
        }
    }
    if let Some(b) = cfg.txn.inject_bug {
        c += &format!(" --inject-bug {}", b.name());
    }
    c
}

/// Transactions of one type.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TypeCount {
    /// Transactions committed.
    pub committed: u64,
    /// Attempts aborted.
    pub aborted: u64,
}

/// What a run did and what its checks found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SimReport {
    /// The workload's name.
    pub workload: String,
    /// The run's seed (`run.seed`): the same seed and configuration give the same run.
    pub seed: u64,
    /// The fault profile's name (`sim.faults`).
    pub faults: String,
    /// The deliberately broken protocol the run used (`txn.inject_bug`), if any.
    pub bug: Option<String>,
    /// The `ambidex sim` command line that reproduces the run.
    pub command: String,
    /// Every phase's choice the run used, and its preset's name if it equals one.
    pub policy: PolicyReport,
    /// Scheduler steps run before the workers were stopped.
    pub steps: u64,
    /// Steps run after that, until the cluster was quiescent.
    pub quiesce_steps: u64,
    /// Simulated nanoseconds the run took (including quiescing).
    pub sim_time_ns: u64,
    /// Transactions committed (the whole run: a simulation has no warmup).
    pub committed: u64,
    /// Attempts aborted.
    pub aborted: u64,
    /// Aborted attempts by abort reason (`AbortReason::name`).
    pub aborts_by_reason: BTreeMap<String, u64>,
    /// Commits and aborts per transaction type, by the workload's name for it.
    pub per_type: BTreeMap<String, TypeCount>,
    /// Partitions started (the profile's and the scripted ones).
    pub partitions: u64,
    /// Node pauses started (the profile's and the scripted ones).
    pub pauses: u64,
    /// Nodes crashed (the `crash` and `crash-restart` profiles), in order.
    pub crashes: Vec<CrashEvent>,
    /// Crashed nodes restarted (the `crash-restart` profile), in order.
    pub restarts: Vec<RestartEvent>,
    /// A node cut off for longer than the give-up time (the `long-partition` profile):
    /// (node, from, until), simulated ns.
    pub long_partition: Option<(NodeId, u64, u64)>,
    /// The configuration manager's final state and what it did.
    pub cluster: ClusterReport,
    /// What the nodes' recoveries and re-replications did, summed over threads.
    pub recovery: RecoveryStats,
    /// Transactions whose coordinator died (or was fenced) before it knew their
    /// outcome that the checks took as committed (someone saw a write of theirs, or it
    /// is installed).
    pub unknown_committed: u64,
    /// Such transactions the checks took as aborted (the others).
    pub unknown_aborted: u64,
    /// What the simulated network did: datagrams sent, delivered and dropped (by
    /// cause), duplicated, delayed, reordered; one-sided operations; crashes.
    pub net: SimNetStats,
    /// The RPC runtimes' counters, summed over every runtime (crashed nodes' included).
    pub rpc: RpcStats,
    /// The transaction layer's counters, summed over every thread (crashed nodes'
    /// included).
    pub txn_layer: TxnStats,
    /// One-sided operations posted by every runtime (from `rpc`).
    pub one_sided: OneSidedCounts,
    /// Location-cache lookups of every coordinator (from `txn_layer`).
    pub location_cache: LocationCacheStats,
    /// Transactions in the recorded history (what the serializability checker checked).
    pub history_transactions: u64,
    /// Whether the checker found the recorded history serializable.
    pub serializable: bool,
    /// The workload's own check (its summary or the violation).
    pub workload_check: serde_json::Value,
    /// Other nodes' tables the nodes' start-up checks read one-sided through the
    /// catalog and verified, summed over the nodes as loaded (a restarted node's is in
    /// its [`RestartEvent`]).
    pub remote_tables_verified: u64,
    /// Every check that failed; empty for a passing run.
    pub failures: Vec<String>,
    /// Hash of every network event, 16 hex digits.
    pub trace_hash: String,
    /// Hash of the final stored state of the members (keys, versions, values) and of
    /// the commit, abort and history counts, 16 hex digits.
    pub state_digest: String,
    /// Both combined: equal for two runs of the same seed and configuration.
    pub run_hash: String,
    /// The configuration the run was given.
    pub config: Config,
    /// The last network events (if asked for).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub trace_tail: Vec<String>,
    /// The recorded history (for `--history FILE`); not in the JSON report.
    #[serde(skip)]
    pub history: Vec<TxnRecord>,
}

/// One crash of a run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CrashEvent {
    /// The node that crashed.
    pub node: NodeId,
    /// Simulated ns.
    pub at_ns: u64,
    /// The phase the profile aimed at ("execute", ..., "commit_primary", "recovery";
    /// "before recovery" for the first of two crashes aimed at recovery).
    pub target: String,
    /// Whether a coordinator of the node was in the target phase at the crash (for
    /// "recovery": whether the cluster was in stage Adopt or Recover).
    pub hit: bool,
    /// Every phase a coordinator of the node was in at the crash, or the cluster's
    /// stage for a crash during recovery.
    pub phases: Vec<String>,
}

/// The manager's side of a run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ClusterReport {
    /// The configuration epoch at the end (1: the cluster never reconfigured).
    pub epoch: u32,
    /// The stage of that epoch at the end: `run`, or `adopt` / `recover` if a
    /// reconfiguration did not finish.
    pub stage: String,
    /// Bit i: node i is a member at the end.
    pub members: u64,
    /// The manager's events ("at_ns epoch what").
    pub events: Vec<String>,
    /// Why the cluster stopped, if it did.
    pub failure: Option<String>,
}

impl SimReport {
    /// The run's failures and the command that reproduces them (a sweep's message).
    pub fn failure_report(&self) -> String {
        format!(
            "seed {}: {}\n  reproduce: {}",
            self.seed,
            self.failures.join("\n  "),
            self.command
        )
    }

    /// Whether every check passed (no `failures`).
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Runs one simulated seed of the registered workload `cfg.run.workload` and checks it.
/// `Err` only for a bad configuration or a set-up failure; a run whose checks fail is
/// an `Ok` report with `failures`.
pub fn run(reg: &Registry, cfg: &Config) -> Result<SimReport, SimError> {
    validate(cfg)?;
    reg.entry(&cfg.run.workload)?.sim(cfg, SimRun { cfg })
}

/// [`run_with`] as a [`WorkloadVisitor`] (the registry builds the workload).
pub(crate) struct SimRun<'a> {
    pub(crate) cfg: &'a Config,
}

impl WorkloadVisitor<SimReport, SimError> for SimRun<'_> {
    fn visit<W: Workload>(self, wl: Arc<W>, _placement: Placement) -> Result<SimReport, SimError> {
        run_with(self.cfg, wl)
    }
}

/// Rows of room per table and node a simulation gives beyond its loaded rows, plus
/// `SIM_ROOM_PER_STEP` per step (a step inserts far fewer rows than that). The
/// workloads size some tables for long benchmark runs (TATP's CALL_FORWARDING has
/// 100,000 spare rows); touching pages of such tables would dominate a seed's time.
pub const SIM_TABLE_ROOM: usize = 16_384;
pub(crate) const SIM_ROOM_PER_STEP: usize = 4;
/// The steps a run with a long partition is given room for at least: the run goes on
/// until the partition healed (about 150,000 steps at the default give-up time), and a
/// step inserts well under a row per table (TPC-C: about 0.2 order lines).
pub const LONG_PARTITION_ROOM_STEPS: u64 = 40_000;

/// Loads `wl` on fresh databases in this thread (the driver's loader, unit by unit
/// with its streams), with tables capped to what `steps` steps can fill.
fn load<W: Workload>(
    wl: &W,
    placement: Placement,
    transports: &[SharedNode],
    seed: u64,
    steps: u64,
) -> Result<Vec<Arc<NodeDb>>, BenchError> {
    let room = table_room(steps);
    let opts = LoadOptions {
        progress: false,
        threads: Some(1),
        max_capacity: Some(room),
        no_catalog: false,
    };
    build_nodes(wl, placement, transports, seed, &opts)
}

/// Rows of room per table and node of a run of `steps` steps.
fn table_room(steps: u64) -> usize {
    SIM_TABLE_ROOM.saturating_add((steps as usize).saturating_mul(SIM_ROOM_PER_STEP))
}

/// Counts kept by the workers of a run.
#[derive(Default)]
struct Tally {
    per_type: Vec<TypeCount>,
    aborts: BTreeMap<String, u64>,
}

/// One (node, thread) of the simulated cluster.
struct NodeThread {
    addr: EndpointAddr,
    rt: Runtime,
    th: Rc<TxnThread>,
    /// Its part in reconfigurations (adopt, recover, copy), as a node thread's loop.
    rec: ThreadRecovery,
    /// Simulated time at which this runtime's last step found nothing to do.
    idle_since: Option<u64>,
}

/// A runtime that found nothing to do is polled again at least this often, so its
/// retransmission timers fire even while other runtimes keep the scheduler busy.
const IDLE_RECHECK_NS: u64 = 250_000;
/// When every runtime is idle and nothing is in flight, time jumps by at most this.
const IDLE_JUMP_NS: u64 = 1_000_000;
/// Simulated CPU time one master step costs, uniform in this range.
const STEP_NS: (u64, u64) = (100, 1_000);
/// Limits of the quiescing phase: simulated time and steps.
const QUIESCE_NS: u64 = 10_000_000_000;
const QUIESCE_STEPS: u64 = 2_000_000;

/// Every node's lease (simulated time): renewed at a fifth of it by its agent, which
/// the scheduler steps every `AGENT_EVERY_NS` (1 ms); the manager ticks as often.
pub const LEASE: Duration = Duration::from_millis(10);
pub(crate) const AGENT_EVERY_NS: u64 = 1_000_000;
/// Steps a run goes on for once the cluster runs again after a reconfiguration (so
/// transactions run in the new configuration), and the simulated time a run may take
/// waiting for that at most.
const STEPS_AFTER_RECOVERY: u64 = 1_500;
const RUN_LIMIT_NS: u64 = 2_000_000_000;

/// The manager of a run and its nodes' agents, stepped by the scheduler.
struct SimCluster {
    manager: SteppedManager,
    /// Per node: its agent, and its handle on the manager (`None` from its crash until
    /// it restarts).
    agents: Vec<Option<(AgentCore, SteppedClient)>>,
    next_agent: Vec<u64>,
    next_tick: u64,
}

/// What the `crash` profile aims at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CrashTarget {
    Phase(Phase),
    /// A second node, while the cluster recovers from a first crash (stage Adopt if
    /// `.0` is false, Recover if true, whichever comes if that one is missed).
    Recovery(bool),
}

impl CrashTarget {
    /// The target of seed `seed`: the phases and recovery in turn.
    fn of_seed(seed: u64) -> CrashTarget {
        match seed % 7 {
            6 => CrashTarget::Recovery((seed / 7) % 2 == 1),
            i => CrashTarget::Phase(Phase::ALL[i as usize]),
        }
    }

    fn name(self) -> String {
        match self {
            CrashTarget::Phase(p) => p.name().to_string(),
            CrashTarget::Recovery(_) => "recovery".into(),
        }
    }
}

/// A crash the profile will make.
struct CrashPlan {
    node: NodeId,
    target: CrashTarget,
    /// Not before this (simulated ns); at this latest if the target is never seen.
    from_ns: u64,
    deadline_ns: u64,
    /// For a crash during recovery: the second node.
    second: NodeId,
    /// Crashes made of this plan (1 or 2 when done).
    made: u8,
    done: bool,
}

struct Sim {
    net: Arc<SimNet>,
    clocks: Vec<Arc<ManualClock>>,
    offsets: Vec<u64>,
    threads: Vec<NodeThread>,
    paused_until: Vec<u64>,
    sched: SmallRng,
    fault_rng: SmallRng,
    faults: FaultProfile,
    next_partition: u64,
    next_pause: u64,
    partitions: u64,
    pauses: u64,
    /// Set once quiescing starts: no new partitions or pauses.
    calm: bool,
    /// Scripted pauses: (node, from, until).
    pauses_at: Vec<(usize, u64, u64)>,
    dbs: Vec<Arc<NodeDb>>,
    cluster: SimCluster,
    crashed: Vec<bool>,
    crash: Option<CrashPlan>,
    crashes: Vec<CrashEvent>,
    /// The long partition, once placed: (node, from, until).
    long_partition: Option<(NodeId, u64, u64)>,
    give_up_ns: u64,
    /// Restarts to make (the `crash-restart` profile), one per crash, and those made.
    restart_plans: Vec<RestartPlan>,
    restarts: Vec<RestartEvent>,
    restart_rng: SmallRng,
    /// Threads of crashed incarnations that were restarted: never stepped again, kept
    /// for their counters.
    retired: Vec<NodeThread>,
    /// Per worker slot (see `running` in [`run_with`]): its node; and per node, the
    /// slot of its current incarnation.
    slot_node: Vec<NodeId>,
    slot_of: Vec<usize>,
    /// Starts a node's threads (see [`run_with`]).
    spawn: Spawn,
    /// The tables a restarted node's fresh database has (the loader's, capped as it
    /// caps them) and the test-only bug of the run.
    specs: Vec<TableSpec>,
    bug: Option<InjectedBug>,
    /// Workers per slot (threads × coroutines).
    per_slot: usize,
    /// Restarted nodes whose new regions the others' catalogs do not have yet.
    catalog_pending: Vec<NodeId>,
    /// What went wrong restarting nodes (a failure of the run).
    restart_failures: Vec<String>,
}

/// Starts the threads of node `.0` as incarnation `.1` on database `.3`, its workers in
/// slot `.2`, drawing session nonces from `.4`.
type Spawn = Box<
    dyn FnMut(
        NodeId,
        u64,
        usize,
        Arc<NodeDb>,
        &mut SmallRng,
    ) -> Result<Vec<NodeThread>, StartError>,
>;

/// One incarnation's transactions whose outcome another node may decide, by id.
type Pending = Rc<RefCell<BTreeMap<u64, TxnRecord>>>;

/// Restarts a run makes at most (one per crash, two crashes at most).
const MAX_RESTARTS: usize = 2;

/// A restart the `crash-restart` profile will make of a crashed node.
struct RestartPlan {
    node: NodeId,
    crashed_at_ns: u64,
    /// Restart at this time (simulated ns), whether or not the node was removed yet.
    early_at: Option<u64>,
    /// Otherwise: this long after the manager removed it.
    after_removal_ns: u64,
    removed_at: Option<u64>,
    done: bool,
}

/// One restart of a crashed node (the `crash-restart` profile), simulated ns.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RestartEvent {
    /// The node that restarted.
    pub node: NodeId,
    /// The new incarnation.
    pub incarnation: u64,
    /// When its previous incarnation crashed.
    pub crashed_at_ns: u64,
    /// When the manager removed the crashed incarnation (`None`: never).
    pub removed_at_ns: Option<u64>,
    /// When the node started again (a fresh empty database, new threads, its agent
    /// asking to join).
    pub at_ns: u64,
    /// Whether it started before its crashed incarnation was removed (its join then
    /// makes the manager remove that incarnation).
    pub before_removal: bool,
    /// When the manager admitted the new incarnation (a member again).
    pub rejoined_at_ns: Option<u64>,
    /// When every copy was up to date again after the admission.
    pub rereplicated_at_ns: Option<u64>,
    /// Transactions the new incarnation's coordinators committed.
    pub committed: u64,
    /// Other nodes' tables its start-up check verified once it was a member again.
    pub remote_tables_verified: u64,
}

fn gap(rng: &mut SmallRng, mean: u64) -> u64 {
    rng.gen_range(0..=2 * mean.max(1))
}

impl Sim {
    fn now(&self) -> u64 {
        self.net.now()
    }

    /// Moves simulated time to `t`: delivers what is due and sets every node's clock.
    fn advance(&mut self, t: u64) {
        self.net.advance_to(t);
        let now = self.net.now();
        for (c, off) in self.clocks.iter().zip(&self.offsets) {
            c.set(now + off);
        }
    }

    /// Starts the profile's partitions and pauses that are due.
    fn inject_faults(&mut self, now: u64) {
        if self.calm {
            return;
        }
        for &(node, from, until) in &self.pauses_at {
            if from <= now && now < until && self.paused_until[node] < until {
                self.paused_until[node] = until;
                self.pauses += 1;
            }
        }
        let n = self.paused_until.len() as u16;
        self.crash_if_due(now);
        self.restart_if_due(now);
        self.update_catalogs();
        let (lo, hi) = self.faults.long_partition;
        if hi > 0.0 && self.long_partition.is_none() && n > 1 {
            let node = self.fault_rng.gen_range(0..n);
            let from = now + self.fault_rng.gen_range(100_000..=600_000);
            let d = (self.give_up_ns as f64 * self.fault_rng.gen_range(lo..=hi)) as u64;
            self.net.partition(&[node], from, from + d);
            self.partitions += 1;
            self.long_partition = Some((node, from, from + d));
        }
        let f = &self.faults;
        if f.partition_every_ns > 0 && now >= self.next_partition && n > 1 {
            // A random non-empty proper subset of the nodes is cut off from the rest.
            let mask = self.fault_rng.gen_range(1..(1u32 << n) - 1);
            let side: Vec<NodeId> = (0..n).filter(|i| mask & (1 << i) != 0).collect();
            let d = self
                .fault_rng
                .gen_range(f.partition_ns.0..=f.partition_ns.1);
            self.net.partition(&side, now, now + d);
            self.partitions += 1;
            self.next_partition = now + d + gap(&mut self.fault_rng, f.partition_every_ns);
        }
        let f = &self.faults;
        if f.pause_every_ns > 0 && now >= self.next_pause {
            let node = self.fault_rng.gen_range(0..n) as usize;
            let d = self.fault_rng.gen_range(f.pause_ns.0..=f.pause_ns.1);
            self.paused_until[node] = self.paused_until[node].max(now + d);
            self.pauses += 1;
            self.next_pause = now + d + gap(&mut self.fault_rng, f.pause_every_ns);
        }
    }

    /// One scheduler step: one runtime's master step, or a jump of time when every
    /// runtime is idle. Returns false if it only moved time.
    fn step(&mut self, candidates: &mut Vec<usize>) -> bool {
        let now = self.now();
        self.inject_faults(now);
        self.drive_cluster(now);
        candidates.clear();
        for (i, t) in self.threads.iter().enumerate() {
            let n = t.addr.node as usize;
            if self.paused_until[n] > now || self.crashed[n] {
                continue;
            }
            let idle = t
                .idle_since
                .is_some_and(|s| now - s < IDLE_RECHECK_NS && !self.net.has_pending(t.addr));
            if !idle {
                candidates.push(i);
            }
        }
        if candidates.is_empty() {
            // Nothing can run: jump to the next event, the end of a pause, or a timer.
            let mut t = now + IDLE_JUMP_NS;
            if let Some(e) = self.net.next_event_time() {
                t = t.min(e);
            }
            for &p in &self.paused_until {
                if p > now {
                    t = t.min(p);
                }
            }
            t = t.min(self.cluster.next_tick);
            for (n, &a) in self.cluster.next_agent.iter().enumerate() {
                if self.cluster.agents[n].is_some() {
                    t = t.min(a);
                }
            }
            for th in self.threads.iter_mut() {
                th.idle_since = None;
            }
            self.advance(t.max(now + 1));
            return false;
        }
        let i = candidates[self.sched.gen_range(0..candidates.len())];
        let t = &mut self.threads[i];
        // As a node thread's loop: its part in a reconfiguration between steps.
        if t.rec.due(&t.rt) {
            t.rec.step(&mut t.rt, &t.th);
        }
        if t.rt.poll_once() {
            t.idle_since = None;
        } else {
            // Makes the next step read the clock (the sim endpoint's wait returns at once).
            t.rt.park();
            t.idle_since = Some(now);
        }
        let cost = self.sched.gen_range(STEP_NS.0..=STEP_NS.1);
        self.advance(now + cost);
        true
    }

    /// Ticks the manager and steps the agents that are due (a paused node's agent is
    /// paused with it; a crashed node's is gone).
    fn drive_cluster(&mut self, now: u64) {
        let c = &mut self.cluster;
        if now >= c.next_tick {
            c.manager.tick(now);
            c.next_tick = now + AGENT_EVERY_NS;
        }
        for n in 0..c.agents.len() {
            if now < c.next_agent[n] || self.paused_until[n] > now {
                continue;
            }
            if let Some((agent, client)) = c.agents[n].as_mut() {
                agent.step(self.clocks[n].now_ns(), client, self.dbs[n].cluster());
                c.next_agent[n] = now + AGENT_EVERY_NS;
            }
        }
    }

    /// The manager's epoch and stage now.
    fn epoch_stage(&self) -> (u32, Stage) {
        self.cluster.manager.epoch_stage()
    }

    /// Whether the run must go on whatever its steps: a crash still to come, a long
    /// partition not over yet, or a reconfiguration in progress.
    fn disrupted(&self, now: u64) -> bool {
        self.crash.as_ref().is_some_and(|c| !c.done)
            || self.long_partition.is_some_and(|(_, _, until)| now < until)
            || (self.faults.long_partition.1 > 0.0 && self.long_partition.is_none())
            || self.epoch_stage().1 != Stage::Run
            || self.restoring()
    }

    /// The phases a coordinator of node `n` is in now.
    fn phases_of(&self, n: NodeId) -> Vec<Phase> {
        Phase::ALL
            .into_iter()
            .filter(|&p| {
                self.threads
                    .iter()
                    .any(|t| t.addr.node == n && t.th.in_phase(p) > 0)
            })
            .collect()
    }

    /// Makes the profile's crash once its moment came (see [`CrashTarget`]).
    fn crash_if_due(&mut self, now: u64) {
        let Some(plan) = self.crash.as_ref() else {
            return;
        };
        if plan.done || now < plan.from_ns {
            return;
        }
        let (node, target, late) = (plan.node, plan.target, now >= plan.deadline_ns);
        match (target, plan.made) {
            (CrashTarget::Phase(p), _) => {
                let phases = self.phases_of(node);
                let hit = phases.contains(&p);
                if hit || late {
                    self.crash_node(
                        node,
                        target.name(),
                        hit,
                        phases.iter().map(|p| p.name().into()),
                    );
                    if let Some(c) = self.crash.as_mut() {
                        c.done = true;
                    }
                }
            }
            (CrashTarget::Recovery(_), 0) => {
                let phases = self.phases_of(node);
                // The first of two: in whatever phase (not a target of its own).
                self.crash_node(
                    node,
                    "before recovery".into(),
                    true,
                    phases.iter().map(|p| p.name().into()),
                );
                let c = self.crash.as_mut().expect("a plan");
                c.made = 1;
                // The second crash comes while the cluster recovers from the first.
                c.deadline_ns = now + 4 * LEASE.as_nanos() as u64;
            }
            (CrashTarget::Recovery(recover), _) => {
                let (epoch, stage) = self.epoch_stage();
                let want = if recover {
                    Stage::Recover
                } else {
                    Stage::Adopt
                };
                let hit = epoch > 1 && stage == want;
                // Missed the stage aimed at: any stage of recovery will do.
                let other = epoch > 1 && stage != Stage::Run;
                if hit
                    || (other && now >= plan.deadline_ns)
                    || now >= plan.deadline_ns + LEASE.as_nanos() as u64
                {
                    let second = plan.second;
                    let stage = format!("{stage:?}").to_lowercase();
                    self.crash_node(second, target.name(), hit || other, [stage]);
                    let c = self.crash.as_mut().expect("a plan");
                    c.made = 2;
                    c.done = true;
                }
            }
        }
    }

    /// Crashes node `n`: its memory stays as it was (battery-backed, and the checks
    /// ignore it), nothing of this incarnation runs again and its agent is gone (its
    /// lease runs out). Under `crash-restart` a restart is planned ([`Sim::restart`]).
    fn crash_node(
        &mut self,
        n: NodeId,
        target: String,
        hit: bool,
        phases: impl IntoIterator<Item = String>,
    ) {
        if self.crashed[n as usize] {
            return;
        }
        self.net.crash(n);
        self.crashed[n as usize] = true;
        self.cluster.agents[n as usize] = None;
        self.crashes.push(CrashEvent {
            node: n,
            at_ns: self.now(),
            target,
            hit,
            phases: phases.into_iter().collect(),
        });
        if self.faults.restart && self.restart_plans.len() < MAX_RESTARTS {
            // A quarter of the restarts come before the manager can have removed the
            // crashed incarnation (its lease, renewed at a fifth of its period, holds
            // at least 4/5 of it); the others 1-4 leases after the removal.
            let lease = LEASE.as_nanos() as u64;
            let early = self.restart_rng.gen_bool(0.25);
            let early_at =
                early.then(|| self.now() + self.restart_rng.gen_range(200_000..=lease / 2));
            let after_removal_ns = self.restart_rng.gen_range(lease..=4 * lease);
            self.restart_plans.push(RestartPlan {
                node: n,
                crashed_at_ns: self.now(),
                early_at,
                after_removal_ns,
                removed_at: None,
                done: false,
            });
        }
    }

    /// Makes the planned restarts that are due.
    fn restart_if_due(&mut self, now: u64) {
        let members = self.cluster.manager.members();
        let mut due = Vec::new();
        for (i, p) in self.restart_plans.iter_mut().enumerate() {
            if p.done {
                continue;
            }
            if p.removed_at.is_none() && members & (1 << p.node) == 0 {
                p.removed_at = Some(now);
            }
            if p.early_at.is_some_and(|t| now >= t)
                || p.removed_at.is_some_and(|t| now >= t + p.after_removal_ns)
            {
                due.push(i);
            }
        }
        for i in due {
            self.restart_plans[i].done = true;
            let (node, crashed_at) = (
                self.restart_plans[i].node,
                self.restart_plans[i].crashed_at_ns,
            );
            if let Err(e) = self.restart(node, crashed_at) {
                self.restart_failures
                    .push(format!("restarting node {node}: {e}"));
            }
        }
    }

    /// Starts crashed node `n` again as a new incarnation, as a restarted machine
    /// would: its endpoints taken again, a fresh empty database (the loader's tables,
    /// no rows) in the cluster's configuration as the survivors have it, the whole
    /// catalog with its new regions, its threads (holding no lease: they neither serve
    /// nor run transactions until admitted) and an agent that asks to join. The
    /// survivors' catalogs take its new regions once they removed the old incarnation
    /// ([`Sim::update_catalogs`]).
    fn restart(&mut self, n: NodeId, crashed_at_ns: u64) -> Result<(), RestartError> {
        let nn = n as usize;
        let now = self.now();
        let state = self.cluster.manager.state();
        let incarnation = state.config.incarnations[nn] + 1;
        let before_removal = state.config.placement.is_member(n);
        let survivor = (0..self.dbs.len())
            .find(|&m| m != nn && !self.crashed[m] && state.config.placement.is_member(m as NodeId))
            .ok_or(RestartError::NoSurvivor)?;
        let mut config = (*self.dbs[survivor].config().load()).clone();
        // Restarted before its crashed incarnation was removed: it starts in the
        // configuration without it (the one its join makes the manager publish, as far
        // as it can know), not in one that still counts that incarnation a member.
        // There its runtime would answer the epoch's requests (the RPC layer serves
        // whatever the lease) from an empty store.
        if config.placement.is_member(n) && self.bug != Some(InjectedBug::JoinerServesOldEpoch) {
            config = config
                .without(1 << n)
                .map_err(RestartError::Configuration)?;
        }
        let transport = self.net.node(n);
        transport.restart().map_err(RestartError::Transport)?;
        let db = NodeDb::with_config(&*transport, config, &self.specs, LogRingConfig::default())?;
        if let Some(cat) = self.dbs[survivor].catalog() {
            let mut whole = (*cat).clone();
            whole.replace_node(n, db.table_descs(), Some(db.log_region_desc()))?;
            db.set_catalog(whole)?;
            self.catalog_pending.push(n);
        }
        // The agent first: the node holds no lease from here on.
        let agent = AgentCore::join(
            LEASE,
            self.clocks[nn].now_ns(),
            db.cluster(),
            n,
            incarnation,
        );
        let client = self.cluster.manager.client(n, incarnation);
        self.cluster.agents[nn] = Some((agent, client));
        self.cluster.next_agent[nn] = now;
        let slot = self.slot_node.len() / self.per_slot;
        let slots = self.dbs.len() + MAX_RESTARTS;
        if slot >= slots {
            return Err(RestartError::NoSlot { slots });
        }
        let threads = (self.spawn)(n, incarnation, slot, db.clone(), &mut self.restart_rng)?;
        self.slot_node.extend(vec![n; self.per_slot]);
        self.slot_of[nn] = slot;
        let (old, keep): (Vec<NodeThread>, Vec<NodeThread>) = std::mem::take(&mut self.threads)
            .into_iter()
            .partition(|t| t.addr.node == n);
        self.threads = keep;
        self.threads.extend(threads);
        self.retired.extend(old);
        self.dbs[nn] = db;
        self.crashed[nn] = false;
        self.paused_until[nn] = 0;
        self.restarts.push(RestartEvent {
            node: n,
            incarnation,
            crashed_at_ns,
            at_ns: now,
            before_removal,
            ..Default::default()
        });
        Ok(())
    }

    /// Gives the live members' catalogs the new regions of restarted nodes, once none
    /// of them has the crashed incarnation as a member any more (while it is one, a
    /// thread filling its caches would reach the new, empty regions in an epoch that
    /// counts the old copies), which is before any of them can admit the new one.
    fn update_catalogs(&mut self) {
        if self.catalog_pending.is_empty() {
            return;
        }
        let members = self.cluster.manager.members();
        let live: Vec<usize> = (0..self.dbs.len())
            .filter(|&m| !self.crashed[m] && members & (1 << m) != 0)
            .collect();
        let pending = std::mem::take(&mut self.catalog_pending);
        for n in pending {
            let removed = live
                .iter()
                .filter(|&&m| m != n as usize)
                .all(|&m| !self.dbs[m].config().with(|c| c.placement.is_member(n)));
            if !removed {
                self.catalog_pending.push(n);
                continue;
            }
            let db = self.dbs[n as usize].clone();
            let (tables, log) = (db.table_descs(), db.log_region_desc());
            for (m, d) in self.dbs.iter().enumerate() {
                if m != n as usize && !self.crashed[m] {
                    if let Err(e) = d.replace_in_catalog(n, tables.clone(), log) {
                        self.restart_failures
                            .push(format!("node {m}'s catalog: {e}"));
                    }
                }
            }
        }
    }

    /// Whether worker slot `slot` belongs to a node out of the cluster: an incarnation
    /// restarted since, or crashed, or not a member (see [`Sim::gone`]).
    /// Whether the workers of `slot` are not waited for: an incarnation replaced by a
    /// later one, or crashed. A node removed but alive (fenced) is waited for: its
    /// workers must see their transactions fail and return, never hang.
    fn slot_gone(&self, slot: usize) -> bool {
        let n = self.slot_node[slot * self.per_slot] as usize;
        self.slot_of[n] != slot || self.crashed[n]
    }

    /// Per node: out of the cluster (crashed, or removed and fenced). Such nodes are
    /// not waited for: crashes happen only while the run lasts, and nobody joins while
    /// it quiesces.
    fn gone(&self) -> Vec<bool> {
        let members = self.cluster.manager.members();
        (0..self.dbs.len())
            .map(|n| self.crashed[n] || members & (1 << n) == 0)
            .collect()
    }

    /// Whether a restart is still to come, or a restarted node is not a member again
    /// as its new incarnation, or some copy is not up to date yet (a rejoined node's,
    /// or one re-replicated after a crash).
    fn restoring(&self) -> bool {
        if self.restart_plans.iter().any(|p| !p.done) {
            return true;
        }
        let st = self.cluster.manager.state();
        let c = &st.config;
        self.restarts.iter().any(|r| {
            let node = r.node as usize;
            let back = c.placement.is_member(r.node) && c.incarnations[node] == r.incarnation;
            // Back, and its start-up check (which waits for stage Run at the node)
            // has an outcome: a run ended before it would report a check it never
            // made.
            let checked = self.dbs[node].verification().is_some();
            let settled = self.crashed[node] || (back && checked);
            !settled
        }) || c.placement.syncing().next().is_some()
    }

    /// RPCs issued and not yet completed or failed, over every runtime of a node not
    /// in `gone`.
    fn rpcs_in_flight(&self, gone: &[bool]) -> u64 {
        self.threads
            .iter()
            .filter(|t| !gone[t.addr.node as usize])
            .map(|t| {
                let s = t.rt.stats();
                s.rpcs_issued - s.rpcs_completed - s.rpcs_failed
            })
            .sum()
    }
}

/// Runs one simulated seed of any workload (`run.workload` and `run.scale` are not
/// used: `wl` is the workload, built by the caller for `cfg`'s cluster shape).
pub fn run_with<W: Workload>(cfg: &Config, wl: Arc<W>) -> Result<SimReport, SimError> {
    validate(cfg)?;
    let faults = FaultProfile::named(&cfg.sim.faults)?;
    let script = script(cfg)?;
    let (nodes, threads_per_node) = (cfg.cluster.nodes, cfg.cluster.threads);
    let coroutines = coroutines(cfg);
    let placement = cfg.placement()?;
    let seed = cfg.run.seed;
    let cluster = cfg.cluster_config()?;
    // A reliable connection gives up on a one-sided operation after as long as the RPC
    // layer gives up on a request, as a NIC's retry budget and the RPC timeouts would be
    // set together: a partition the RPCs survive, one-sided operations survive too. The
    // simulated NIC keeps a fixed timeout (the RPC floor; its round trips are far below
    // it) and as many tries as fit the give-up time.
    let mut net_faults = faults.net.clone();
    net_faults.onesided_rto_ns = ((cfg.rpc.rto_min_ms * 1e6) as u64).max(1);
    net_faults.onesided_retries =
        ((cfg.rpc.give_up_ms / cfg.rpc.rto_min_ms).ceil() as u32).saturating_sub(1);
    let net = SimNet::new(cluster, seed, net_faults).map_err(SimError::Net)?;
    net.record_trace(cfg.sim.trace);
    // The network first: every node's tables live in regions registered on it, and the
    // nodes learn each other's descriptors directly (the catalog).
    let transports: Vec<SharedNode> = (0..nodes).map(|n| net.node(n)).collect();
    // A long partition keeps the run going, workers and all, until it healed: 2–3 times
    // the give-up time, far more steps than asked (140,915 for `--steps 2000`, seed 1003
    // of TPC-C, whose order lines then filled their tables).
    let room_steps = if faults.long_partition.1 > 0.0 {
        cfg.sim.steps.max(LONG_PARTITION_ROOM_STEPS)
    } else {
        cfg.sim.steps
    };
    let dbs = load(&*wl, placement.clone(), &transports, seed, room_steps)?;
    let tables: Vec<u32> = wl.tables().iter().map(|t| t.id).collect();

    let mut setup = SmallRng::seed_from_u64(mix(seed, 0x5e70));
    let offsets: Vec<u64> = (0..nodes)
        .map(|_| 1_000_000_000 + setup.gen_range(0..=faults.clock_skew_ns))
        .collect();
    let clocks: Vec<Arc<ManualClock>> = offsets
        .iter()
        .map(|&o| Arc::new(ManualClock::new(o)))
        .collect();
    // The same per-thread settings as the other paths, with the faults left to the
    // simulated network.
    let base = RunSpec {
        fault: None,
        // Leases and reconfigurations: the simulator runs the manager and the nodes'
        // agents itself, on simulated time (`SimCluster`), not on threads.
        manager: Some(ManagerSpec::embedded(LEASE)),
        kill: None,
        ..cfg.run_spec(coroutines, None)?
    };
    let policy = base.txn.policy;
    let recs: Rc<RefCell<Vec<TxnRecord>>> = Rc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let types = wl.txn_types().len();
    let tally = Rc::new(RefCell::new(Tally {
        per_type: vec![TypeCount::default(); types],
        ..Default::default()
    }));
    // Per worker slot (node or restarted incarnation, thread, coroutine): still
    // running? Slot `n < nodes` is node n's first incarnation; the restarts take the
    // slots after, in order.
    let per_node = threads_per_node as usize * coroutines;
    let running: Rc<Vec<Cell<bool>>> = Rc::new(
        (0..(nodes as usize + MAX_RESTARTS) * per_node)
            .map(|i| Cell::new(i < nodes as usize * per_node))
            .collect(),
    );
    // Per incarnation: its transactions whose outcome another node may decide (see
    // `checks::MemorySink`).
    let pendings: Rc<RefCell<Vec<Pending>>> = Rc::default();
    // Starts the threads of node `n` as `incarnation` on `db`, its workers in slot
    // `slot`, with session nonces from `nonces`.
    let mut spawn: Spawn = {
        let (net, clocks, offsets, recs) =
            (net.clone(), clocks.clone(), offsets.clone(), recs.clone());
        let (stop, tally, running) = (stop.clone(), tally.clone(), running.clone());
        let pendings = pendings.clone();
        let wl = wl.clone();
        Box::new(move |n, incarnation, slot, db, nonces| {
            db.set_incarnation(incarnation);
            let node = net.node(n);
            let pending: Pending = Rc::default();
            pendings.borrow_mut().push(pending.clone());
            // A restarted node's workers draw other transactions than its first's.
            let wseed = if incarnation == 1 {
                seed
            } else {
                mix(seed, incarnation)
            };
            // Its workers are running until they return: the run quiesces only once
            // a restarted node's have too (their last commits and ring drains).
            let first = slot * threads_per_node as usize * coroutines;
            for r in &running[first..first + threads_per_node as usize * coroutines] {
                r.set(true);
            }
            let mut threads = Vec::new();
            for t in 0..threads_per_node {
                let ep = node.endpoint(t).map_err(|source| StartError::Endpoint {
                    node: n,
                    thread: t,
                    source,
                })?;
                // Session nonces from the seed, not the clock.
                let spec = RunSpec {
                    rpc: RuntimeConfig {
                        session: Some(nonces.gen::<u32>() | 1),
                        ..base.rpc.clone()
                    },
                    ..base.clone()
                };
                let (wl, tally) = (wl.clone(), tally.clone());
                let running_done = running.clone();
                let (rt, th) = start_thread(
                    ep,
                    clocks[n as usize].clone(),
                    &spec,
                    db.clone(),
                    Some(Box::new(checks::MemorySink {
                        recs: recs.clone(),
                        clock_offset_us: offsets[n as usize] / 1000,
                        pending: pending.clone(),
                    })),
                    stop.clone(),
                    move |w: WorkerCtx| {
                        let (wl, tally) = (wl.clone(), tally.clone());
                        async move {
                            let mut rng = SmallRng::seed_from_u64(worker_seed(
                                wseed,
                                w.node,
                                w.thread,
                                w.coroutine,
                            ));
                            let mut local = W::Local::default();
                            while !w.stop.load(Ordering::Relaxed) {
                                let (ty, outcome) = wl.run_one(&w, &mut rng, &mut local).await;
                                // Counted now: a worker of a crashed node never finishes.
                                wl.fold_worker(&mut local);
                                {
                                    let mut tl = tally.borrow_mut();
                                    match outcome {
                                        Outcome::Committed { .. } => tl.per_type[ty].committed += 1,
                                        Outcome::Aborted(r) => {
                                            tl.per_type[ty].aborted += 1;
                                            *tl.aborts.entry(r.name().to_string()).or_insert(0) +=
                                                1;
                                        }
                                    }
                                }
                                // Every transaction ends a step, even one that needed no
                                // remote access: other coroutines and nodes interleave
                                // with it.
                                w.ctx.yield_now().await;
                            }
                            wl.finish_worker(local);
                        }
                    },
                    move |c| {
                        let idx = (slot * threads_per_node as usize + t as usize) * coroutines + c;
                        running_done[idx].set(false);
                    },
                )?;
                threads.push(NodeThread {
                    addr: EndpointAddr::new(n, t),
                    rec: ThreadRecovery::new(&rt, &th),
                    rt,
                    th,
                    idle_since: None,
                });
            }
            Ok(threads)
        })
    };
    let mut threads = Vec::new();
    for n in 0..nodes {
        threads.extend(spawn(
            n,
            1,
            n as usize,
            dbs[n as usize].clone(),
            &mut setup,
        )?);
    }
    let mut fault_rng = SmallRng::seed_from_u64(mix(seed, 0xfa17));
    // The first fault comes within one mean gap (runs are short in simulated time).
    let next_partition = gap(&mut fault_rng, faults.partition_every_ns) / 2;
    let next_pause = gap(&mut fault_rng, faults.pause_every_ns) / 2;
    let config = (*dbs[0].config().load()).clone();
    let manager = SteppedManager::new(config.clone(), LEASE, net.now());
    let cluster = SimCluster {
        agents: (0..nodes)
            .map(|n| {
                let agent = AgentCore::new(
                    LEASE,
                    clocks[n as usize].now_ns(),
                    dbs[n as usize].cluster(),
                );
                Some((agent, manager.client(n, config.incarnations[n as usize])))
            })
            .collect(),
        next_agent: (0..nodes)
            .map(|_| setup.gen_range(0..AGENT_EVERY_NS))
            .collect(),
        next_tick: 0,
        manager,
    };
    let crash = (faults.crash && nodes > 1).then(|| {
        let node = fault_rng.gen_range(0..nodes);
        let from_ns = fault_rng.gen_range(100_000..=600_000);
        let second = (node + 1 + fault_rng.gen_range(0..nodes - 1)) % nodes;
        let mut target = CrashTarget::of_seed(seed);
        if matches!(target, CrashTarget::Recovery(_)) && (nodes < 3 || cfg.cluster.replication < 3)
        {
            // Two crashes would lose every copy of some partition.
            target = CrashTarget::Phase(Phase::Log);
        }
        CrashPlan {
            node,
            target,
            from_ns,
            deadline_ns: from_ns + 2_000_000,
            second,
            made: 0,
            done: false,
        }
    });
    // Every node holds its lease before anything runs: each agent renews once now,
    // then every AGENT_EVERY_NS from a seeded phase.
    let mut cluster = cluster;
    for n in 0..nodes as usize {
        if let Some((agent, client)) = cluster.agents[n].as_mut() {
            agent.step(clocks[n].now_ns(), client, dbs[n].cluster());
        }
    }
    let mut sim = Sim {
        net: net.clone(),
        clocks,
        offsets,
        threads,
        paused_until: vec![0; nodes as usize],
        sched: SmallRng::seed_from_u64(mix(seed, 0x5c4e)),
        fault_rng,
        faults: faults.clone(),
        next_partition,
        next_pause,
        partitions: 0,
        pauses: 0,
        calm: false,
        pauses_at: Vec::new(),
        dbs: dbs.clone(),
        cluster,
        crashed: vec![false; nodes as usize],
        crash,
        crashes: Vec::new(),
        long_partition: None,
        give_up_ns: (cfg.rpc.give_up_ms * 1e6) as u64,
        restart_plans: Vec::new(),
        restarts: Vec::new(),
        restart_rng: SmallRng::seed_from_u64(mix(seed, 0x7e57)),
        retired: Vec::new(),
        slot_node: (0..nodes).flat_map(|n| vec![n; per_node]).collect(),
        slot_of: (0..nodes as usize).collect(),
        spawn,
        specs: wl
            .tables()
            .into_iter()
            .map(|mut t| {
                t.capacity_per_node = t.capacity_per_node.min(table_room(cfg.sim.steps));
                t
            })
            .collect(),
        bug: cfg.txn.inject_bug,
        per_slot: per_node,
        catalog_pending: Vec::new(),
        restart_failures: Vec::new(),
    };
    for f in &script {
        match f {
            Scripted::Partition {
                side,
                from_ns,
                until_ns,
            } => {
                net.partition(side, *from_ns, *until_ns);
                sim.partitions += 1;
            }
            Scripted::Pause {
                node,
                from_ns,
                until_ns,
            } => sim.pauses_at.push((*node as usize, *from_ns, *until_ns)),
        }
    }

    // Start-up: every node's check of the other nodes' tables (the workers wait for
    // it), with the profile's partitions and pauses held back; these steps are not the
    // run's.
    let mut cand = Vec::new();
    sim.calm = true;
    let mut startup_steps = 0u64;
    let checking = |d: &Arc<NodeDb>| d.catalog().is_some() && d.verification().is_none();
    while dbs.iter().any(checking) && startup_steps < QUIESCE_STEPS {
        sim.step(&mut cand);
        startup_steps += 1;
    }
    sim.calm = false;

    // The run: its steps, and longer while a crash or a long partition is to come or
    // the cluster reconfigures, then STEPS_AFTER_RECOVERY more in the new configuration.
    let mut steps = 0u64;
    let run_start = sim.now();
    let mut back_at: Option<u64> = None;
    loop {
        let now = sim.now();
        let disrupted = sim.disrupted(now);
        if !disrupted && back_at.is_none() && sim.epoch_stage().0 > 1 {
            back_at = Some(steps);
        }
        let more = steps < cfg.sim.steps
            || disrupted
            || back_at.is_some_and(|b| steps < b + STEPS_AFTER_RECOVERY);
        if !more || now - run_start >= RUN_LIMIT_NS {
            break;
        }
        if sim.step(&mut cand) {
            steps += 1;
        }
        if running.iter().all(|r| !r.get()) {
            break;
        }
    }

    // Quiesce: stop the workers, heal the network, step until everything has settled.
    stop.store(true, Ordering::Relaxed);
    sim.calm = true;
    net.heal();
    sim.paused_until.iter_mut().for_each(|p| *p = 0);
    let t_stop = sim.now();
    let mut quiesce_steps = 0u64;
    let mut settled = false;
    while quiesce_steps < QUIESCE_STEPS && sim.now() - t_stop < QUIESCE_NS {
        // `%`, not `is_multiple_of`: the workspace's rust-version is 1.80.
        #[allow(clippy::manual_is_multiple_of)]
        let check = quiesce_steps % 16 == 0;
        if check && sim.epoch_stage().1 == Stage::Run && {
            let gone = sim.gone();
            running
                .iter()
                .enumerate()
                .all(|(i, r)| !r.get() || sim.slot_gone(i / per_node))
                && sim
                    .threads
                    .iter()
                    .all(|t| gone[t.addr.node as usize] || !net.has_pending(t.addr))
                && sim.rpcs_in_flight(&gone) == 0
                && (gone.iter().any(|&g| g) || net.in_flight() == 0)
                // Re-replication is paced: between two COPY requests nothing is in
                // flight, but the copies are not done.
                && sim.cluster.manager.state().config.placement.syncing().next().is_none()
        } {
            settled = true;
            break;
        }
        sim.step(&mut cand);
        quiesce_steps += 1;
    }

    // Checks.
    let mut failures = Vec::new();
    if !settled {
        let gone = sim.gone();
        let stuck: Vec<String> = running
            .iter()
            .enumerate()
            .filter(|&(i, r)| r.get() && !sim.slot_gone(i / per_node))
            .map(|(i, _)| {
                format!(
                    "node {} thread {} coroutine {}",
                    sim.slot_node[i],
                    (i % per_node) / coroutines,
                    i % coroutines
                )
            })
            .collect();
        failures.push(format!(
            "not quiescent after {} steps / {} ms of simulated time: {} coroutine(s) stuck [{}], {} RPC(s) and {} network event(s) in flight, cluster at {:?}; coordinators in phases [{}], installations pending [{}]",
            quiesce_steps,
            (sim.now() - t_stop) / 1_000_000,
            stuck.len(),
            stuck.join(", "),
            sim.rpcs_in_flight(&gone),
            net.in_flight(),
            sim.epoch_stage(),
            (0..nodes)
                .filter(|&n| !gone[n as usize])
                .map(|n| {
                    let p: Vec<&str> = sim.phases_of(n).iter().map(|p| p.name()).collect();
                    format!("node {n}: {}", p.join("+"))
                })
                .collect::<Vec<_>>()
                .join(", "),
            sim.threads
                .iter()
                .filter(|t| !gone[t.addr.node as usize])
                .map(|t| format!("{}.{}: {}", t.addr.node, t.addr.thread, t.th.commits_pending()))
                .collect::<Vec<_>>()
                .join(", "),
        ));
    }
    // The final configuration: the checks read the members' copies where it places
    // them. A node that left (crashed, or cut off and fenced) is made to follow it too,
    // so a workload's check counts no primary of it.
    let fin = sim.cluster.manager.state();
    // Every node's current database: a restarted node's new one.
    let (loaded, dbs) = (dbs, sim.dbs.clone());
    let placement = fin.config.placement.clone();
    let members = placement.member_mask();
    for db in &dbs {
        if db.cluster().config.epoch() != fin.config.epoch {
            db.cluster().enter(fin.config.clone(), Stage::Run);
        }
    }
    if let Some(f) = sim.cluster.manager.failure() {
        failures.push(format!("the cluster could not go on: {f}"));
    }
    for db in dbs.iter().filter(|d| members & (1 << d.node) != 0) {
        if db.cluster().fenced() {
            failures.push(format!(
                "member {} was fenced: {}",
                db.node,
                db.cluster().why().unwrap_or_default()
            ));
        }
    }
    if sim.crash.as_ref().is_some_and(|c| !c.done) {
        failures.push("the profile's crash never happened".into());
    }
    failures.append(&mut sim.restart_failures);
    // Each restart: when the manager removed the crashed incarnation, admitted the new
    // one, and had every copy up to date again; the new one must be a member with every
    // copy in sync at the end.
    let events = sim.cluster.manager.events();
    // The manager's stage timeout keeps a real cluster going; here every member that
    // is alive acknowledges promptly, so one that timed out is a bug the timeout hid.
    for e in &events {
        if let EventKind::StageTimedOut { nodes } = e.what {
            failures.push(format!(
                "members {nodes:#b} held epoch {}'s stage past the manager's timeout",
                e.epoch
            ));
        }
    }
    for r in sim.restarts.iter_mut() {
        let bit = 1u64 << r.node;
        r.removed_at_ns = events.iter().find_map(|e| match e.what {
            EventKind::Reconfigured { removed, .. }
                if removed & bit != 0 && e.at_ns >= r.crashed_at_ns =>
            {
                Some(e.at_ns)
            }
            _ => None,
        });
        r.rejoined_at_ns = events.iter().find_map(|e| match e.what {
            EventKind::Reconfigured { joined, .. } if joined & bit != 0 && e.at_ns >= r.at_ns => {
                Some(e.at_ns)
            }
            _ => None,
        });
        r.rereplicated_at_ns = r.rejoined_at_ns.and_then(|j| {
            events
                .iter()
                .find(|e| e.what == EventKind::Rereplicated && e.at_ns >= j)
                .map(|e| e.at_ns)
        });
        r.committed = sim
            .threads
            .iter()
            .filter(|t| t.addr.node == r.node && sim.slot_of[r.node as usize] >= nodes as usize)
            .map(|t| t.th.stats().committed)
            .sum();
        let crashed_again = sim.crashed[r.node as usize];
        let member = placement.is_member(r.node)
            && fin.config.incarnations[r.node as usize] == r.incarnation;
        if !member && !crashed_again {
            failures.push(format!(
                "node {} restarted at {} ns as incarnation {} is not a member as it at the end{}",
                r.node,
                r.at_ns,
                r.incarnation,
                dbs[r.node as usize]
                    .cluster()
                    .why()
                    .map(|w| format!(" (fenced: {w})"))
                    .unwrap_or_default()
            ));
        }
    }
    if placement.syncing().next().is_some() {
        failures.push(format!(
            "copies not up to date at the end: partitions {:?}",
            placement.syncing().collect::<Vec<_>>()
        ));
    }
    let mut history = std::mem::take(&mut *recs.borrow_mut());
    // Transactions whose coordinator died (or was fenced) before it knew their outcome:
    // committed if anyone saw them or they are installed, else aborted.
    let mut unknown_ids = Vec::new();
    for p in pendings.borrow().iter() {
        for (id, r) in std::mem::take(&mut *p.borrow_mut()) {
            unknown_ids.push(id);
            history.push(r);
        }
    }
    let (unknown_committed, unknown_aborted) =
        ambidex_history::resolve_unknown(&mut history, |w| {
            let mut buf = Vec::new();
            let p = placement.primary(w.table, w.key) as usize;
            ambidex_txn::actions::read(&dbs[p], w.table, w.key, &mut buf).version == w.version
        });
    unknown_ids.sort_unstable();
    for r in history
        .iter()
        .filter(|r| r.is_committed() && unknown_ids.binary_search(&r.id).is_ok())
    {
        for w in &r.writes {
            let old = r
                .reads
                .iter()
                .find(|x| x.table == w.table && x.key == w.key)
                .and_then(|x| x.value.as_deref())
                .and_then(ambidex_history::decode_hex);
            let new = w.value.as_deref().and_then(ambidex_history::decode_hex);
            wl.committed_by_recovery(w.table, old.as_deref(), new.as_deref());
        }
    }
    let report = ambidex_history::check(&history);
    if !report.valid {
        let mut s = report.summary();
        s.truncate(2_000);
        failures.push(format!(
            "serializability: {}",
            s.trim_end().replace('\n', " | ")
        ));
    }
    let dump = checks::Dump::of_members(&dbs, &tables, members);
    failures.extend(checks::replica_consistency(&dbs, &placement, &dump));
    failures.extend(checks::committed_writes_installed(
        &dbs, &placement, &history,
    ));
    failures.extend(checks::no_locks_held(&dbs, &placement, &history));
    // The loaded nodes' start-up checks are counted; a restarted node's (made once it
    // is a member, of the members then) is its restart's.
    let mut remote_tables_verified = 0;
    for db in &loaded {
        match db.remote_tables_verified() {
            Ok(n) => remote_tables_verified += n as u64,
            Err(e) => failures.push(format!("start-up check: {e}")),
        }
    }
    for r in sim.restarts.iter_mut() {
        let db = &dbs[r.node as usize];
        if sim.crashed[r.node as usize] || loaded.iter().any(|d| Arc::ptr_eq(d, db)) {
            continue;
        }
        match db.remote_tables_verified() {
            Ok(n) => r.remote_tables_verified = n as u64,
            Err(e) => failures.push(format!("restarted node's start-up check: {e}")),
        }
    }
    let mut rpc = RpcStats::default();
    let mut txn_layer = TxnStats::default();
    let mut recovery = RecoveryStats::default();
    for t in sim.threads.iter().chain(&sim.retired) {
        rpc.merge(&t.rt.stats());
        txn_layer.merge(&t.th.stats());
        recovery.merge(&t.rec.stats.borrow());
    }
    // After a reconfiguration, recovery finished what the commits left.
    if txn_layer.committed_incomplete > 0 && fin.config.epoch == 1 {
        failures.push(format!(
            "{} transaction(s) committed with some commit RPC unanswered (recovery would have to finish them)",
            txn_layer.committed_incomplete
        ));
    }
    for db in &dbs {
        if let Err(e) = db.room_check() {
            failures.push(format!("node {}: {e}", db.node));
        }
    }
    let workload_check = match wl.check(&dbs) {
        Ok(v) => v,
        Err(e) => {
            failures.push(format!("workload invariant: {e}"));
            serde_json::json!({ "violation": e.to_string() })
        }
    };

    let tally = tally.borrow();
    let committed = tally.per_type.iter().map(|t| t.committed).sum();
    let aborted = tally.per_type.iter().map(|t| t.aborted).sum();
    let trace_hash = net.trace_hash();
    let mut state = dump.digest();
    state = mix(mix(mix(state, committed), aborted), history.len() as u64);
    let run_hash = mix(mix(HASH_SEED, trace_hash), state);
    Ok(SimReport {
        workload: wl.name().to_string(),
        seed,
        faults: faults.name.to_string(),
        bug: cfg.txn.inject_bug.map(|b| b.name().to_string()),
        command: command(cfg),
        policy: policy.into(),
        steps,
        quiesce_steps,
        sim_time_ns: sim.now(),
        committed,
        aborted,
        aborts_by_reason: tally.aborts.clone(),
        per_type: wl
            .txn_types()
            .iter()
            .zip(&tally.per_type)
            .map(|(n, c)| (n.to_string(), c.clone()))
            .collect(),
        partitions: sim.partitions,
        pauses: sim.pauses,
        crashes: sim.crashes.clone(),
        restarts: sim.restarts.clone(),
        long_partition: sim.long_partition,
        cluster: ClusterReport {
            epoch: fin.config.epoch,
            stage: format!("{:?}", fin.stage).to_lowercase(),
            members,
            events: sim
                .cluster
                .manager
                .events()
                .iter()
                .map(|e| format!("{} e{} {:?}", e.at_ns, e.epoch, e.what))
                .collect(),
            failure: sim.cluster.manager.failure(),
        },
        recovery,
        unknown_committed,
        unknown_aborted,
        net: net.stats(),
        one_sided: (&rpc).into(),
        location_cache: txn_layer.location_cache,
        rpc,
        txn_layer,
        history_transactions: history.len() as u64,
        serializable: report.valid,
        workload_check,
        remote_tables_verified,
        failures,
        trace_hash: format!("{trace_hash:016x}"),
        state_digest: format!("{state:016x}"),
        run_hash: format!("{run_hash:016x}"),
        config: cfg.clone(),
        trace_tail: net.trace_tail(),
        history,
    })
}
