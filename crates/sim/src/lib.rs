//! # ambidex-sim: deterministic simulation of a whole cluster
//!
//! One seed runs a whole ambidex cluster — every node's RPC runtime, transaction layer
//! and workload coroutines, with the real protocol code — in one thread, over the
//! simulated network of `ambidex-transport-sim`, and then checks everything that must
//! hold. The same seed gives the same run, bit for bit ([`SimReport::run_hash`]).
//!
//! A run ([`run`]):
//! 1. loads the workload at a tiny scale, from the seed, on one `NodeDb` per node;
//! 2. builds a stepped [`SimNet`] and, per (node, thread), a runtime whose clock is the
//!    simulated clock (offset per node: nodes' clocks are not synchronized), the
//!    transaction layer, and `coroutines` workload workers;
//! 3. schedules: each step picks, with the seeded generator, one runtime that may have
//!    work (not paused, not known idle) and runs one master step of it
//!    (`Runtime::poll_once`), charging it a seeded sliver of simulated CPU time; when every
//!    runtime is idle, time jumps to the next network event (or 1 ms, so retransmission
//!    timers fire). The fault profile ([`FaultProfile`]) starts partitions and node pauses
//!    from a second seeded stream;
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

pub mod checks;
pub mod profile;

pub use profile::{FaultProfile, PROFILES};

use ambidex_history::TxnRecord;
use ambidex_rpc::{ManualClock, RpcStats, Runtime, RuntimeConfig};
use ambidex_transport::{ClusterConfig, EndpointAddr, NodeId};
use ambidex_transport_sim::{mix, SimNet, SimNetStats, HASH_SEED};
use ambidex_txn::runner::WorkerCtx;
use ambidex_txn::{NodeDb, Placement, TxnConfig, TxnStats, TxnThread};
use ambidex_workloads::common::{worker_seed, Loader, Outcome, Workload};
use ambidex_workloads::{objstore, smallbank, tatp, tpcc, ObjStoreParams, WorkloadKind};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A deliberately broken protocol, to show that the checks catch it (test only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum InjectedBug {
    /// `TxnConfig::skip_validation_for_tests`: commit without validating the read set.
    SkipValidation,
}

impl InjectedBug {
    pub fn name(self) -> &'static str {
        match self {
            InjectedBug::SkipValidation => "skip-validation",
        }
    }
}

impl std::str::FromStr for InjectedBug {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "skip-validation" => Ok(InjectedBug::SkipValidation),
            _ => Err(format!("unknown injected bug {s:?} (skip-validation)")),
        }
    }
}

/// A fault placed at a fixed simulated time, in addition to the profile's.
#[derive(Clone, Debug, PartialEq)]
pub enum Scripted {
    /// The nodes of `side` are cut off from the others during `[from_ns, until_ns)`.
    Partition {
        side: Vec<NodeId>,
        from_ns: u64,
        until_ns: u64,
    },
    /// `node` is not scheduled during `[from_ns, until_ns)`.
    Pause {
        node: NodeId,
        from_ns: u64,
        until_ns: u64,
    },
}

impl Scripted {
    /// Parses `NODES@FROM..UNTIL` (`NODES` comma-separated, times in milliseconds of
    /// simulated time, for example `2@1..6` or `0,1@0.5..3`) as a partition, or as a
    /// pause of one node if `pause`.
    pub fn parse(s: &str, pause: bool) -> Result<Scripted, String> {
        let what = if pause { "--pause" } else { "--partition" };
        let bad = |why: &str| {
            format!("{what} {s:?}: {why} (expected NODES@FROM..UNTIL in ms, e.g. 2@1..6)")
        };
        let (nodes, window) = s.split_once('@').ok_or_else(|| bad("no '@'"))?;
        let (from, until) = window.split_once("..").ok_or_else(|| bad("no '..'"))?;
        let ms = |x: &str| -> Result<u64, String> {
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

    fn check(&self, nodes: u16) -> Result<(), String> {
        match self {
            Scripted::Partition { side, .. } => {
                if side.iter().any(|&n| n >= nodes)
                    || side.is_empty()
                    || side.len() >= nodes as usize
                {
                    return Err(format!(
                        "--partition {}: the cut-off side must be some, not all, of nodes 0..{nodes}",
                        self.arg()
                    ));
                }
            }
            Scripted::Pause { node, .. } => {
                if *node >= nodes {
                    return Err(format!("--pause {}: no node {node}", self.arg()));
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

/// One simulated run.
#[derive(Clone, Debug)]
pub struct SimSpec {
    pub workload: WorkloadKind,
    pub seed: u64,
    /// Scheduler steps (one runtime's master step each) before the workers are stopped.
    pub steps: u64,
    pub faults: FaultProfile,
    pub nodes: u16,
    pub threads: u16,
    pub coroutines: usize,
    pub replication: u16,
    /// Workload scale (`None`: [`sim_scale`], a tiny population with real contention).
    pub scale: Option<f64>,
    pub bug: Option<InjectedBug>,
    /// Keep the last this-many network events in the report (0: none).
    pub trace_events: usize,
    /// Partitions and pauses at fixed times, besides the profile's.
    pub script: Vec<Scripted>,
}

impl SimSpec {
    /// The defaults of `ambidex sim`: 3 nodes × 1 thread, R = 3, 4 coroutines per thread,
    /// 2,000 steps, the `chaos` profile.
    pub fn new(workload: WorkloadKind, seed: u64) -> SimSpec {
        SimSpec {
            workload,
            seed,
            steps: 2_000,
            faults: FaultProfile::named("chaos").expect("chaos exists"),
            nodes: 3,
            threads: 1,
            coroutines: 4,
            replication: 3,
            scale: None,
            bug: None,
            trace_events: 0,
            script: Vec::new(),
        }
    }

    pub fn scale(&self) -> f64 {
        self.scale.unwrap_or_else(|| sim_scale(self.workload))
    }

    /// Checks the spec; every bad value is a clear error.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=16).contains(&self.nodes) {
            return Err(format!("nodes must be 1..=16, not {}", self.nodes));
        }
        if !(1..=8).contains(&self.threads) {
            return Err(format!("threads must be 1..=8, not {}", self.threads));
        }
        if !(1..=64).contains(&self.coroutines) {
            return Err(format!(
                "coroutines must be 1..=64, not {}",
                self.coroutines
            ));
        }
        Placement::new(self.nodes, self.replication)?;
        if self.steps > 100_000_000 {
            return Err(format!(
                "steps must be at most 100000000, not {}",
                self.steps
            ));
        }
        let s = self.scale();
        if !(s.is_finite() && s > 0.0 && s <= 1.0) {
            return Err(format!("scale must be in (0, 1] for a simulation, not {s}"));
        }
        if self.workload == WorkloadKind::TpccNo && self.nodes as u32 * (self.threads as u32) < 2 {
            return Err("tpcc-no needs at least 2 warehouses (nodes × threads ≥ 2)".into());
        }
        if self.trace_events > 1_000_000 {
            return Err("trace_events must be at most 1000000".into());
        }
        for f in &self.script {
            f.check(self.nodes)?;
        }
        Ok(())
    }

    /// The command that reproduces this run.
    pub fn command(&self) -> String {
        let mut c = format!(
            "ambidex sim --workload {} --seed {} --steps {} --faults {}",
            self.workload.name(),
            self.seed,
            self.steps,
            self.faults.name
        );
        let d = SimSpec::new(self.workload, self.seed);
        if self.nodes != d.nodes {
            c += &format!(" --nodes {}", self.nodes);
        }
        if self.threads != d.threads {
            c += &format!(" --threads {}", self.threads);
        }
        if self.coroutines != d.coroutines {
            c += &format!(" --coroutines {}", self.coroutines);
        }
        if self.replication != d.replication {
            c += &format!(" --replication {}", self.replication);
        }
        if let Some(s) = self.scale {
            c += &format!(" --scale {s}");
        }
        for f in &self.script {
            match f {
                Scripted::Partition { .. } => c += &format!(" --partition {}", f.arg()),
                Scripted::Pause { .. } => c += &format!(" --pause {}", f.arg()),
            }
        }
        if let Some(b) = self.bug {
            c += &format!(" --inject-bug {}", b.name());
        }
        c
    }
}

/// The population a simulation loads by default: a few dozen to a few hundred rows per
/// table, so that a few hundred transactions really conflict.
pub fn sim_scale(w: WorkloadKind) -> f64 {
    match w {
        // 20 keys per thread.
        WorkloadKind::ObjectStore => 0.00002,
        // 100 subscribers per node.
        WorkloadKind::Tatp => 0.0001,
        // 50 accounts per thread; the hot set is 4% of them.
        WorkloadKind::SmallBank => 0.0005,
        // One warehouse per thread; customers and items are set below the loader's
        // minimums in `run` (SIM_TPCC_CUSTOMERS, SIM_TPCC_ITEMS).
        WorkloadKind::Tpcc | WorkloadKind::TpccNo => 0.001,
    }
}

/// The object store's transaction shape in simulations: O(4, 2) (reads 4 keys, updates 2).
pub const SIM_OBJSTORE: ObjStoreParams = ObjStoreParams {
    reads: 4,
    writes: 2,
    same_node: false,
};

/// New orders per warehouse the TPC-C tables make room for in a simulation.
pub const SIM_TPCC_ORDER_HEADROOM: u64 = 1_000;
/// TPC-C customers (and initial orders) per district and items at the default sim scale.
pub const SIM_TPCC_CUSTOMERS: u64 = 12;
pub const SIM_TPCC_ITEMS: u64 = 100;

/// The RPC settings of simulated runs: the default runtime with a 1 ms retransmission
/// timeout (the simulated round trip is 4–20 µs plus queueing), giving up after 50
/// retransmissions (50 ms), which every fault profile stays well below.
pub fn sim_runtime_config() -> RuntimeConfig {
    RuntimeConfig {
        retransmit_timeout: Duration::from_millis(1),
        max_retries: 50,
        ..RuntimeConfig::default()
    }
}

/// Transactions of one type.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TypeCount {
    pub committed: u64,
    pub aborted: u64,
}

/// What a run did and what its checks found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SimReport {
    pub workload: String,
    pub seed: u64,
    pub faults: String,
    pub bug: Option<String>,
    pub command: String,
    /// Steps run before the workers were stopped, and while quiescing.
    pub steps: u64,
    pub quiesce_steps: u64,
    /// Simulated nanoseconds the run took (including quiescing).
    pub sim_time_ns: u64,
    pub committed: u64,
    pub aborted: u64,
    pub aborts_by_reason: BTreeMap<String, u64>,
    pub per_type: BTreeMap<String, TypeCount>,
    pub partitions: u64,
    pub pauses: u64,
    pub net: SimNetStats,
    pub rpc: RpcStats,
    pub txn_layer: TxnStats,
    /// Transactions in the recorded history, and the checker's summary line.
    pub history_transactions: u64,
    pub serializable: bool,
    /// The workload's own check (its summary or the violation).
    pub workload_check: serde_json::Value,
    /// Every check that failed; empty for a passing run.
    pub failures: Vec<String>,
    /// Hash of every network event; hash of the final stored state; both combined.
    pub trace_hash: String,
    pub state_digest: String,
    pub run_hash: String,
    /// The last network events (if asked for).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub trace_tail: Vec<String>,
    /// The recorded history (for `--history FILE`); not in the JSON report.
    #[serde(skip)]
    pub history: Vec<TxnRecord>,
}

impl SimReport {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Runs one simulated seed and checks it. `Err` only for a bad spec or a set-up failure;
/// a run whose checks fail is an `Ok` report with `failures`.
pub fn run(spec: &SimSpec) -> Result<SimReport, String> {
    spec.validate()?;
    let placement = Placement::new(spec.nodes, spec.replication)?;
    let scale = spec.scale();
    match spec.workload {
        WorkloadKind::ObjectStore => {
            let wl = objstore::ObjectStore::new(placement, spec.threads, scale, SIM_OBJSTORE)?;
            run_with(spec, Arc::new(wl))
        }
        WorkloadKind::Tatp => run_with(spec, Arc::new(tatp::Tatp::new(placement, scale))),
        WorkloadKind::SmallBank => run_with(
            spec,
            Arc::new(smallbank::SmallBank::new(placement, spec.threads, scale)),
        ),
        WorkloadKind::Tpcc | WorkloadKind::TpccNo => {
            let mut p = tpcc::TpccParams::new(
                placement,
                spec.threads,
                scale,
                spec.workload == WorkloadKind::TpccNo,
                0.0,
            );
            if spec.scale.is_none() {
                // Smaller than the loader's own minimums: a simulation runs a few hundred
                // transactions, and loading is most of a seed's time.
                p.customers = SIM_TPCC_CUSTOMERS;
                p.initial_orders = SIM_TPCC_CUSTOMERS;
                p.items = SIM_TPCC_ITEMS;
            }
            p.order_headroom = SIM_TPCC_ORDER_HEADROOM;
            run_with(spec, Arc::new(tpcc::Tpcc::new(p)))
        }
    }
}

/// Rows of room per table and node a simulation gives beyond its loaded rows, plus
/// `SIM_ROOM_PER_STEP` per step (a step inserts far fewer rows than that). The
/// workloads size some tables for long benchmark runs (TATP's CALL_FORWARDING has
/// 100,000 spare rows); touching pages of such tables would dominate a seed's time.
pub const SIM_TABLE_ROOM: usize = 16_384;
pub const SIM_ROOM_PER_STEP: usize = 4;

/// Loads `wl` on fresh databases in this thread, unit by unit with the driver's streams.
fn load<W: Workload>(
    wl: &W,
    placement: Placement,
    seed: u64,
    steps: u64,
) -> Result<Vec<Arc<NodeDb>>, String> {
    let room = SIM_TABLE_ROOM.saturating_add((steps as usize).saturating_mul(SIM_ROOM_PER_STEP));
    let mut specs = wl.tables();
    for s in &mut specs {
        s.capacity_per_node = s.capacity_per_node.min(room);
    }
    let dbs: Vec<Arc<NodeDb>> = (0..placement.nodes)
        .map(|n| NodeDb::new(n, placement, &specs))
        .collect::<Result<_, _>>()?;
    let loader = Loader::new(&dbs, vec![true; dbs.len()], true);
    for u in 0..wl.load_units() {
        let mut rng = SmallRng::seed_from_u64(worker_seed(seed, 0xffff, 0xffff, u as usize));
        wl.load_unit(u, &mut rng, &loader)?;
    }
    wl.after_load(&dbs)?;
    Ok(dbs)
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
        candidates.clear();
        for (i, t) in self.threads.iter().enumerate() {
            if self.paused_until[t.addr.node as usize] > now {
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
            for th in self.threads.iter_mut() {
                th.idle_since = None;
            }
            self.advance(t.max(now + 1));
            return false;
        }
        let i = candidates[self.sched.gen_range(0..candidates.len())];
        let t = &mut self.threads[i];
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

    /// RPCs issued and not yet completed or failed, over every runtime.
    fn rpcs_in_flight(&self) -> u64 {
        self.threads
            .iter()
            .map(|t| {
                let s = t.rt.stats();
                s.rpcs_issued - s.rpcs_completed - s.rpcs_failed
            })
            .sum()
    }
}

/// Runs one simulated seed of any workload (`spec.workload` and `spec.scale` are not
/// used: `wl` is the workload, built by the caller for `spec`'s cluster shape).
pub fn run_with<W: Workload>(spec: &SimSpec, wl: Arc<W>) -> Result<SimReport, String> {
    spec.validate()?;
    let placement = Placement::new(spec.nodes, spec.replication)?;
    let seed = spec.seed;
    let dbs = load(&*wl, placement, seed, spec.steps)?;
    let tables: Vec<u32> = wl.tables().iter().map(|t| t.id).collect();

    let cluster = ClusterConfig::new(spec.nodes, spec.threads);
    let net =
        SimNet::new(cluster.clone(), seed, spec.faults.net.clone()).map_err(|e| e.to_string())?;
    net.record_trace(spec.trace_events);
    let mut setup = SmallRng::seed_from_u64(mix(seed, 0x5e70));
    let offsets: Vec<u64> = (0..spec.nodes)
        .map(|_| 1_000_000_000 + setup.gen_range(0..=spec.faults.clock_skew_ns))
        .collect();
    let clocks: Vec<Arc<ManualClock>> = offsets
        .iter()
        .map(|&o| Arc::new(ManualClock::new(o)))
        .collect();
    // Struct update on purpose: TxnConfig may grow fields (test flags, presets).
    #[allow(clippy::needless_update)]
    let txn_cfg = TxnConfig {
        skip_validation_for_tests: spec.bug == Some(InjectedBug::SkipValidation),
        ..TxnConfig::default()
    };
    let recs: Rc<RefCell<Vec<TxnRecord>>> = Rc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let types = wl.txn_types().len();
    let tally = Rc::new(RefCell::new(Tally {
        per_type: vec![TypeCount::default(); types],
        ..Default::default()
    }));
    // Per worker (node, thread, coroutine): still running?
    let running: Rc<Vec<Cell<bool>>> = Rc::new(
        (0..spec.nodes as usize * spec.threads as usize * spec.coroutines)
            .map(|_| Cell::new(true))
            .collect(),
    );
    let mut threads = Vec::new();
    for n in 0..spec.nodes {
        let node = net.node(n);
        for t in 0..spec.threads {
            let ep = node.endpoint(t).map_err(|e| e.to_string())?;
            let rpc = RuntimeConfig {
                session: Some(setup.gen::<u32>() | 1),
                ..sim_runtime_config()
            };
            let mut rt = Runtime::with_clock(ep, rpc, clocks[n as usize].clone())
                .map_err(|e| e.to_string())?;
            let th = TxnThread::install(&mut rt, dbs[n as usize].clone(), txn_cfg.clone());
            th.set_history(Box::new(checks::MemorySink {
                recs: recs.clone(),
                clock_offset_us: offsets[n as usize] / 1000,
            }));
            for c in 0..spec.coroutines {
                let idx = (n as usize * spec.threads as usize + t as usize) * spec.coroutines + c;
                let (wl, th, stop, tally, running) = (
                    wl.clone(),
                    th.clone(),
                    stop.clone(),
                    tally.clone(),
                    running.clone(),
                );
                rt.spawn(move |ctx| async move {
                    let w = WorkerCtx {
                        ctx,
                        th,
                        node: n,
                        thread: t,
                        coroutine: c,
                        stop,
                    };
                    let mut rng = SmallRng::seed_from_u64(worker_seed(seed, n, t, c));
                    let mut local = W::Local::default();
                    while !w.stop.load(Ordering::Relaxed) {
                        let (ty, outcome) = wl.run_one(&w, &mut rng, &mut local).await;
                        {
                            let mut tl = tally.borrow_mut();
                            match outcome {
                                Outcome::Committed { .. } => tl.per_type[ty].committed += 1,
                                Outcome::Aborted(r) => {
                                    tl.per_type[ty].aborted += 1;
                                    *tl.aborts.entry(r.name().to_string()).or_insert(0) += 1;
                                }
                            }
                        }
                        // Every transaction ends a step, even one that needed no remote
                        // access: other coroutines and nodes interleave with it.
                        w.ctx.yield_now().await;
                    }
                    wl.finish_worker(local);
                    running[idx].set(false);
                });
            }
            threads.push(NodeThread {
                addr: EndpointAddr::new(n, t),
                rt,
                th,
                idle_since: None,
            });
        }
    }
    let mut fault_rng = SmallRng::seed_from_u64(mix(seed, 0xfa17));
    // The first fault comes within one mean gap (runs are short in simulated time).
    let next_partition = gap(&mut fault_rng, spec.faults.partition_every_ns) / 2;
    let next_pause = gap(&mut fault_rng, spec.faults.pause_every_ns) / 2;
    let mut sim = Sim {
        net: net.clone(),
        clocks,
        offsets,
        threads,
        paused_until: vec![0; spec.nodes as usize],
        sched: SmallRng::seed_from_u64(mix(seed, 0x5c4e)),
        fault_rng,
        faults: spec.faults.clone(),
        next_partition,
        next_pause,
        partitions: 0,
        pauses: 0,
        calm: false,
        pauses_at: Vec::new(),
    };
    for f in &spec.script {
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

    // The run.
    let mut cand = Vec::new();
    let mut steps = 0u64;
    while steps < spec.steps {
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
        if check
            && running.iter().all(|r| !r.get())
            && net.in_flight() == 0
            && sim.threads.iter().all(|t| !net.has_pending(t.addr))
            && sim.rpcs_in_flight() == 0
        {
            settled = true;
            break;
        }
        sim.step(&mut cand);
        quiesce_steps += 1;
    }

    // Checks.
    let mut failures = Vec::new();
    if !settled {
        let stuck: Vec<String> = running
            .iter()
            .enumerate()
            .filter(|(_, r)| r.get())
            .map(|(i, _)| {
                let per_node = spec.threads as usize * spec.coroutines;
                format!(
                    "node {} thread {} coroutine {}",
                    i / per_node,
                    (i % per_node) / spec.coroutines,
                    i % spec.coroutines
                )
            })
            .collect();
        failures.push(format!(
            "not quiescent after {} steps / {} ms of simulated time: {} coroutine(s) stuck [{}], {} RPC(s) and {} network event(s) in flight",
            quiesce_steps,
            (sim.now() - t_stop) / 1_000_000,
            stuck.len(),
            stuck.join(", "),
            sim.rpcs_in_flight(),
            net.in_flight()
        ));
    }
    let history = std::mem::take(&mut *recs.borrow_mut());
    let report = ambidex_history::check(&history);
    if !report.valid {
        let mut s = report.summary();
        s.truncate(2_000);
        failures.push(format!(
            "serializability: {}",
            s.trim_end().replace('\n', " | ")
        ));
    }
    let dump = checks::Dump::of(&dbs, &tables);
    failures.extend(checks::replica_consistency(&dbs, &placement, &dump));
    failures.extend(checks::committed_writes_installed(
        &dbs, &placement, &history,
    ));
    failures.extend(checks::no_locks_held(&dbs, &placement, &history));
    let mut rpc = RpcStats::default();
    let mut txn_layer = TxnStats::default();
    for t in &sim.threads {
        rpc.merge(&t.rt.stats());
        txn_layer.merge(&t.th.stats());
    }
    if txn_layer.committed_incomplete > 0 {
        failures.push(format!(
            "{} transaction(s) committed with some commit RPC unanswered (recovery would have to finish them)",
            txn_layer.committed_incomplete
        ));
    }
    let workload_check = match wl.check(&dbs) {
        Ok(v) => v,
        Err(e) => {
            failures.push(format!("workload invariant: {e}"));
            serde_json::json!({ "violation": e })
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
        faults: spec.faults.name.to_string(),
        bug: spec.bug.map(|b| b.name().to_string()),
        command: spec.command(),
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
        net: net.stats(),
        rpc,
        txn_layer,
        history_transactions: history.len() as u64,
        serializable: report.valid,
        workload_check,
        failures,
        trace_hash: format!("{trace_hash:016x}"),
        state_digest: format!("{state:016x}"),
        run_hash: format!("{run_hash:016x}"),
        trace_tail: net.trace_tail(),
        history,
    })
}
