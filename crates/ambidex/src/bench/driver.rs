//! The benchmark driver: opens an in-process cluster (every node in this process, any
//! transport), loads a workload in parallel, runs it with a warmup, checks its invariants
//! and produces the report.
//!
//! Multi-process runs (one `ambidex node` process per node, [`crate::bench::node`]) share
//! the worker loop (`make_worker`), the per-thread settings
//! ([`Config::run_spec`](crate::Config::run_spec)) and the report (`assemble_report`):
//! each node sends a [`NodeReport`](crate::bench::NodeReport) and
//! [`crate::bench::combine_node_reports`] merges them into the same [`BenchReport`].
//!
//! Warmup: workers start together and run for `warmup_s`; a timer thread then flips the
//! run into the measured phase (sampling process CPU time and the clock), and after
//! `duration_s` into the stop phase. A transaction counts (throughput, latency, aborts,
//! per-type counts) iff it *finishes* in the measured phase, so CPU time and elapsed time
//! cover exactly the counted window. The transaction layer's own `TxnStats` (phase means)
//! cover the whole run, warmup included.

use super::BenchError;
use crate::bench::load::build_and_load;
use crate::bench::report::{OneSidedCounts, PolicyReport};
use crate::config::Config;
use crate::transports::InProcess;
use crate::workload::{worker_seed, Outcome, Registry, Workload};
use ambidex_rpc::RpcStats;
use ambidex_transport::{cputime, CounterSnapshot, SharedNode};
use ambidex_txn::runner::{self, RunSpec, Worker, WorkerCtx};
use ambidex_txn::stats::LocationCacheStats;
use ambidex_txn::{AbortReason, NodeDb, Placement, Policy, TxnStats};
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Latency of the transactions committed in the measured window (µs), from the start of
/// a transaction's first attempt to its commit (retries and their backoff included), at
/// 1% resolution. All 0 when nothing committed.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LatencyUs {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Mean.
    pub mean: f64,
    /// Largest.
    pub max: f64,
}

/// Counts of one transaction type in the measured window.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TypeReport {
    /// Transactions of this type committed.
    pub committed: u64,
    /// Aborted attempts (each attempt of a transaction tried again counts).
    pub aborted: u64,
    /// Attempts that tried an aborted transaction again (`run.retry_aborts`).
    #[serde(default)]
    pub retries: u64,
    /// Aborted attempts after which the transaction was not tried again: the
    /// application's own aborts, reasons a retry cannot help, the last of
    /// [`MAX_ATTEMPTS`], or the run's end.
    #[serde(default)]
    pub gave_up: u64,
    /// Committed transactions that found their row(s) (TATP; others: all committed).
    pub found: u64,
    /// Committed transactions that did not find their row(s) (TATP's "not found").
    pub not_found: u64,
    /// found / committed.
    #[serde(default)]
    pub found_rate: f64,
    /// The rate WORKLOADS.md expects (TATP only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_found_rate: Option<f64>,
}

/// What a benchmark run did (`ambidex bench`'s JSON report), in-process or combined from
/// node processes. Counts and rates are of the measured window unless a field says
/// otherwise; times are seconds unless the name gives another unit.
#[derive(Clone, Debug, Default, Serialize)]
pub struct BenchReport {
    /// The workload's registered name (`run.workload`).
    pub workload: String,
    /// The transport backend: `local`, `shm` or `udp`.
    pub transport: String,
    /// The configuration's preset name (`txn.mode`); `policy` is what ran.
    pub mode: String,
    /// Every phase's choice the run used, and its preset's name if it equals one.
    pub policy: PolicyReport,
    /// Nodes in the cluster (`cluster.nodes`).
    pub nodes: u16,
    /// Threads (runtimes) per node (`cluster.threads`).
    pub threads_per_node: u16,
    /// Worker coroutines per thread.
    pub coroutines: usize,
    /// Copies of every key, primary included (`cluster.replication`).
    pub replication: u16,
    /// The workload's population multiplier ([`Config::scale`]).
    pub scale: f64,
    /// Wall time taken to build the tables and load the workload: every node in
    /// process, or until the last node process said it was loaded.
    pub load_seconds: f64,
    /// Seconds run before the measured window (`run.warmup_s`).
    pub warmup_s: f64,
    /// Measured window (seconds).
    pub duration_s: f64,
    /// Transactions committed.
    pub committed: u64,
    /// Throughput: `committed` / `duration_s`.
    pub committed_per_s: f64,
    /// Process CPU time (all node threads) in the measured window.
    pub cpu_seconds: f64,
    /// Transactions committed per CPU second: `committed` / `cpu_seconds`.
    pub committed_per_cpu_s: f64,
    /// Aborted attempts (a transaction tried again counts each aborted attempt).
    pub aborted: u64,
    /// Attempts: committed + aborted.
    pub attempts: u64,
    /// Attempts that tried an aborted transaction again (`run.retry_aborts`).
    pub retries: u64,
    /// Transactions whose last attempt aborted: not tried again (the application's
    /// own aborts, reasons a retry cannot help, the last of `MAX_ATTEMPTS`, the end).
    pub gave_up: u64,
    /// aborted / (committed + aborted): of every attempt, the share that aborted.
    pub abort_rate: f64,
    /// Aborted attempts by abort reason (`AbortReason::name`: `locked_at_lock`,
    /// `version_changed`, `user`, ...).
    pub aborts_by_reason: BTreeMap<String, u64>,
    /// Aborts other than the application's own (`user`: SmallBank's insufficient funds,
    /// TPC-C's 1% NewOrder rollback) over the attempts that were not application aborts:
    /// the conflict/failure rate of the protocol.
    pub conflict_abort_rate: f64,
    /// Latency of committed transactions.
    pub latency_us: LatencyUs,
    /// Counts per transaction type, by the workload's name for it.
    pub per_type: BTreeMap<String, TypeReport>,
    /// Mean µs per protocol phase (whole run, warmup included).
    pub phase_means_us: BTreeMap<String, f64>,
    /// The transaction layer's counters (whole run, warmup included).
    pub txn_layer: TxnStats,
    /// The RPC runtimes' counters (requests, retransmissions, datagrams and doorbells,
    /// drops, credit waits, one-sided operations), summed over every thread of every
    /// node, whole run.
    pub rpc: ambidex_rpc::RpcStats,
    /// One-sided operations posted by every thread of every node (from `rpc`), whole
    /// run, warmup and start-up check included.
    pub one_sided: OneSidedCounts,
    /// Location-cache lookups of every coordinator (from `txn_layer`), whole run.
    pub location_cache: LocationCacheStats,
    /// The transport's counters (datagrams, one-sided operations, drops and errors),
    /// summed over every endpoint, whole run.
    pub transport_counters: CounterSnapshot,
    /// Peak resident set size (bytes) of this process, or of the largest node process.
    pub max_rss_bytes: u64,
    /// Worker coroutines that had not returned when the run ended; a correct run has
    /// none.
    pub stuck_workers: usize,
    /// Other nodes' tables each node's start-up check read one-sided through the
    /// exchanged descriptors and verified (superblock against descriptor), by node.
    pub remote_tables_verified: Vec<u64>,
    /// SmallBank: the total balance matches the committed deltas.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invariant_ok: Option<bool>,
    /// TPC-C: consistency conditions 1–4 hold.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consistency_ok: Option<bool>,
    /// What the workload's check computed (or the violation).
    pub check: serde_json::Value,
    /// Committed transactions per 10 ms over the whole run (warmup included), summed
    /// over every thread of every node; bucket 0 starts when the workers start (in a
    /// multi-process run, when each node received `start`).
    pub timeline_10ms: Vec<u64>,
    /// Node processes that died during the run (with a manager; without one a death
    /// fails the run).
    pub failures: Vec<crate::bench::survival::NodeFailure>,
    /// Node processes the launcher killed (`--kill`).
    pub kills: Vec<crate::bench::survival::Kill>,
    /// Node processes restarted during the run (`--restart`): when, as which
    /// incarnation, when they were members again and re-replicated into.
    pub restarts: Vec<crate::bench::survival::Restart>,
    /// Restarts not done because their node was alive at their time (`--restart`
    /// without a `--kill` of the node before it restarts a node that died or was
    /// killed from outside); omitted when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub restarts_not_done: Vec<crate::bench::survival::RestartNotDone>,
    /// The configuration manager's events (ms since the run's start).
    pub manager_events: Vec<crate::bench::survival::ManagerEvent>,
    /// How long the cluster took to notice and get over the first failure; `null`
    /// without one.
    pub recovery: Option<crate::bench::survival::Recovery>,
    /// When (system clock, ns, as the manager's events) the first commit of a
    /// transaction that touched a key whose primary was on a node removed during the
    /// run ended; what `recovery.first_commit_ms` is computed from.
    #[serde(skip)]
    pub first_lost_commit_ns: Option<u64>,
    /// The configuration the run was given (every path echoes the one it ran with).
    pub config: Config,
}

/// One point of the coroutine sweep (FaSST Figure 10).
#[derive(Clone, Debug, Serialize)]
pub struct SweepPoint {
    /// Worker coroutines per thread of this run.
    pub coroutines: usize,
    /// Its throughput ([`BenchReport::committed_per_s`]).
    pub committed_per_s: f64,
    /// Its transactions committed per CPU second.
    pub committed_per_cpu_s: f64,
    /// Its median latency (µs).
    pub p50_us: f64,
    /// Its 99th-percentile latency (µs).
    pub p99_us: f64,
}

/// Runs the benchmark `cfg` describes (its workload registered in `reg`) and returns its
/// report.
pub fn run_bench(reg: &Registry, cfg: &Config) -> Result<BenchReport, BenchError> {
    let cfg = &reg.resolve(cfg)?;
    let mut out = Vec::new();
    with_workload(reg, cfg, &[cfg.coroutines()], &mut out)?;
    Ok(out.pop().expect("one run"))
}

/// Runs workload `wl` (built on `cfg`'s placement) on the in-process cluster `cfg`
/// describes, as [`run_bench`] runs registered ones; `cfg.run.workload` only names the
/// report's workload ([`Config::coroutines`] and [`Config::scale`] apply as they are).
pub fn run_workload<W: Workload>(cfg: &Config, wl: Arc<W>) -> Result<BenchReport, BenchError> {
    cfg.validate()?;
    let mut out = Vec::new();
    run_all(wl, cfg.placement()?, cfg, &[cfg.coroutines()], &mut out)?;
    Ok(out.pop().expect("one run"))
}

/// Runs once per coroutine count (FaSST Figure 10's throughput-latency curve), each on a
/// fresh cluster loaded afresh (a transport's endpoints are taken once per run).
pub fn sweep_coroutines(
    reg: &Registry,
    cfg: &Config,
    counts: &[usize],
) -> Result<(Vec<SweepPoint>, Vec<BenchReport>), BenchError> {
    let cfg = &reg.resolve(cfg)?;
    let mut reports = Vec::new();
    with_workload(reg, cfg, counts, &mut reports)?;
    let points = reports
        .iter()
        .map(|r| SweepPoint {
            coroutines: r.coroutines,
            committed_per_s: r.committed_per_s,
            committed_per_cpu_s: r.committed_per_cpu_s,
            p50_us: r.latency_us.p50,
            p99_us: r.latency_us.p99,
        })
        .collect();
    Ok((points, reports))
}

fn with_workload(
    reg: &Registry,
    cfg: &Config,
    counts: &[usize],
    out: &mut Vec<BenchReport>,
) -> Result<(), BenchError> {
    if counts.contains(&0) {
        return Err(BenchError::NoCoroutines);
    }
    reg.entry(&cfg.run.workload)?
        .bench(cfg, Run { cfg, counts, out })
}

/// [`run_all`] of one registered workload, once per coroutine count.
pub(crate) struct Run<'a> {
    cfg: &'a Config,
    counts: &'a [usize],
    out: &'a mut Vec<BenchReport>,
}

impl WorkloadVisitor<(), BenchError> for Run<'_> {
    fn visit<W: Workload>(self, wl: Arc<W>, placement: Placement) -> Result<(), BenchError> {
        run_all(wl, placement, self.cfg, self.counts, self.out)
    }
}

/// Something done with a registered workload, whatever its type (the [`Workload`]
/// trait is not object safe, so the registry's entries visit it instead).
pub(crate) trait WorkloadVisitor<R, E> {
    fn visit<W: Workload>(self, wl: Arc<W>, placement: Placement) -> Result<R, E>;
}

/// What every worker coroutine adds up.
pub(crate) struct Tally {
    pub(crate) per_type: Vec<TypeReport>,
    pub(crate) aborts: BTreeMap<String, u64>,
    pub(crate) hist: Histogram<u64>,
    /// Committed transactions per [`TIMELINE_BUCKET`] since the workers were made,
    /// warmup included (grown as time passes: no allocation per transaction).
    pub(crate) timeline: Vec<u32>,
    /// When (system clock, ns) this node's first commit that touched a key whose
    /// primary was on a node no longer a member ended ([`crate::bench::lost`]).
    pub(crate) first_lost_commit_ns: Option<u64>,
}

/// The timeline's bucket (`BenchReport::timeline_10ms`).
pub const TIMELINE_BUCKET: Duration = Duration::from_millis(10);
/// Buckets kept at most (a day): later commits are not on the timeline.
pub const TIMELINE_MAX_BUCKETS: usize = 8_640_000;

/// Largest latency the histograms hold (ns): 100 s.
const HIST_MAX_NS: u64 = 100_000_000_000;

impl Tally {
    pub(crate) fn new(types: usize) -> Tally {
        Tally {
            per_type: vec![TypeReport::default(); types],
            aborts: BTreeMap::new(),
            // 1 ns .. 100 s at 2 significant digits (1% resolution): a count array small
            // enough to stay in cache (3 digits cost ~2% of TATP's CPU time).
            hist: Histogram::new_with_bounds(1, HIST_MAX_NS, 2).expect("histogram bounds"),
            timeline: Vec::new(),
            first_lost_commit_ns: None,
        }
    }

    /// One commit `since` the workers were made.
    #[inline]
    fn count_commit(&mut self, since: Duration) {
        let i = (since.as_nanos() / TIMELINE_BUCKET.as_nanos()) as usize;
        if i >= TIMELINE_MAX_BUCKETS {
            return;
        }
        if i >= self.timeline.len() {
            // Amortized: doubles, so a run of n buckets allocates O(log n) times.
            self.timeline
                .resize((i + 1).max(self.timeline.len() * 2), 0);
        }
        self.timeline[i] = self.timeline[i].saturating_add(1);
    }

    fn merge(&mut self, o: &Tally) {
        for (a, b) in self.per_type.iter_mut().zip(&o.per_type) {
            a.committed += b.committed;
            a.aborted += b.aborted;
            a.retries += b.retries;
            a.gave_up += b.gave_up;
            a.found += b.found;
            a.not_found += b.not_found;
        }
        for (k, v) in &o.aborts {
            *self.aborts.entry(k.clone()).or_insert(0) += v;
        }
        self.hist.add(&o.hist).expect("same histogram bounds");
        add_timeline(&mut self.timeline, &o.timeline);
        self.first_lost_commit_ns = min_some(self.first_lost_commit_ns, o.first_lost_commit_ns);
    }
}

/// The earlier of two optional times.
pub(crate) fn min_some(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// Adds timeline `b` into `a`, bucket by bucket; trailing empty buckets are dropped.
pub(crate) fn add_timeline(a: &mut Vec<u32>, b: &[u32]) {
    if a.len() < b.len() {
        a.resize(b.len(), 0);
    }
    for (x, y) in a.iter_mut().zip(b) {
        *x = x.saturating_add(*y);
    }
    while a.last() == Some(&0) {
        a.pop();
    }
}

pub(crate) const WARMUP: u8 = 0;
pub(crate) const MEASURE: u8 = 1;
pub(crate) const STOP: u8 = 2;

fn run_all<W: Workload>(
    wl: Arc<W>,
    placement: Placement,
    cfg: &Config,
    counts: &[usize],
    out: &mut Vec<BenchReport>,
) -> Result<(), BenchError> {
    for (i, &coroutines) in counts.iter().enumerate() {
        // A fresh transport per run (endpoints are taken once), the transport first and
        // the tables in its regions: every point of a sweep loads the same data afresh.
        let udp = cfg.rpc.udp_options()?;
        let cluster = InProcess::open_with(&cfg.cluster, udp)?;
        let t0 = Instant::now();
        let dbs = build_and_load(
            &*wl,
            placement.clone(),
            &cluster.nodes,
            cfg.run.seed,
            cfg.run.progress,
        )?;
        let load_seconds = t0.elapsed().as_secs_f64();
        let mut r = run_once(
            &wl,
            &cluster.nodes,
            &dbs,
            cfg,
            coroutines,
            cfg.run.seed.wrapping_add(i as u64),
        )?;
        drop(cluster);
        r.load_seconds = load_seconds;
        out.push(r);
    }
    Ok(())
}

/// Attempts of one transaction at most, with `run.retry_aborts`: the first and 99
/// retries. A transaction that keeps meeting a lock that is not released (one held for
/// a failed coordinator until recovery decides it) is given up then, not tried for ever.
pub const MAX_ATTEMPTS: u32 = 100;

/// How long a transaction waits before its `attempt`-th retry: uniform in the upper half
/// of a window that doubles from 16 µs to 4 ms (randomized so that two transactions that
/// met do not meet again at their retries).
fn backoff_ns(attempt: u32, jitter: &mut SmallRng) -> u64 {
    let window = (16_000u64 << attempt.min(8)).min(4_000_000);
    jitter.gen_range(window / 2..=window)
}

/// The worker coroutine every (node, thread, coroutine) runs: transactions from the mix
/// until the phase is [`STOP`] (or the runner says stop), counting the attempts that
/// finish in the [`MEASURE`] phase into a tally merged into `total` at the end. With
/// `retries` a transaction aborted for a transient reason
/// ([`AbortReason::is_transient`]) is tried again, up to [`MAX_ATTEMPTS`].
pub(crate) fn make_worker<W: Workload>(
    wl: Arc<W>,
    total: Arc<Mutex<Tally>>,
    phase: Arc<AtomicU8>,
    seed: u64,
    retries: bool,
) -> Worker {
    let types = wl.txn_types().len();
    // The timeline's zero: every coroutine of this node counts from the same instant.
    let t0 = Instant::now();
    Arc::new(move |w: WorkerCtx| {
        let (wl, total, phase) = (wl.clone(), total.clone(), phase.clone());
        Box::pin(async move {
            let mut rng = SmallRng::seed_from_u64(worker_seed(seed, w.node, w.thread, w.coroutine));
            let mut jitter =
                SmallRng::seed_from_u64(!worker_seed(seed, w.node, w.thread, w.coroutine));
            let mut local = W::Local::default();
            let mut tally = Tally::new(types);
            crate::bench::lost::start_worker(&w, t0);
            'txns: loop {
                if phase.load(Ordering::Relaxed) == STOP || w.stop.load(Ordering::Relaxed) {
                    break;
                }
                // A transaction is tried until it commits or ends for good, from the
                // same inputs each time: its draws come from `rng`, which each retry
                // rewinds to where the first attempt began (as DrTM+H's and FaSST's
                // drivers reset their seed). Its latency runs from the first attempt.
                let start = w.ctx.now_ns();
                let rewind = rng.clone();
                let mut attempt = 0u32;
                loop {
                    let (ty, outcome) = wl.run_one(&w, &mut rng, &mut local).await;
                    if matches!(outcome, Outcome::Committed { .. }) {
                        tally.count_commit(t0.elapsed());
                    }
                    let measured = phase.load(Ordering::Relaxed) == MEASURE;
                    let retry = match outcome {
                        Outcome::Aborted(r) => {
                            retries
                                && r.is_transient()
                                && attempt + 1 < MAX_ATTEMPTS
                                && phase.load(Ordering::Relaxed) != STOP
                                && !w.stop.load(Ordering::Relaxed)
                        }
                        Outcome::Committed { .. } => false,
                    };
                    if measured {
                        let t = &mut tally.per_type[ty];
                        t.retries += u64::from(attempt > 0);
                        match outcome {
                            Outcome::Committed { found } => {
                                t.committed += 1;
                                if found {
                                    t.found += 1;
                                } else {
                                    t.not_found += 1;
                                }
                                let ns = w.ctx.now_ns().saturating_sub(start).max(1);
                                let _ = tally.hist.record(ns);
                            }
                            Outcome::Aborted(r) => {
                                t.aborted += 1;
                                t.gave_up += u64::from(!retry);
                                *tally.aborts.entry(r.name().to_string()).or_insert(0) += 1;
                            }
                        }
                    }
                    // A node removed while alive (its lease ran out) is fenced for good:
                    // its workers end, rather than abort at once for the rest of the run
                    // and take the cores from the members.
                    if matches!(outcome, Outcome::Aborted(AbortReason::Fenced)) {
                        break 'txns;
                    }
                    if !retry {
                        break;
                    }
                    attempt += 1;
                    rng = rewind.clone();
                    // Let the transaction it met finish first: a retry at once meets the
                    // same lock while its holder commits (hundreds of µs here), and
                    // spins through its attempts.
                    let until = w.ctx.now_ns() + backoff_ns(attempt, &mut jitter);
                    while w.ctx.now_ns() < until {
                        w.ctx.pause().await;
                    }
                }
            }
            wl.finish_worker(local);
            tally.first_lost_commit_ns = crate::bench::lost::first_commit_ns(t0);
            total.lock().unwrap().merge(&tally);
        })
    })
}

fn run_once<W: Workload>(
    wl: &Arc<W>,
    nodes: &[SharedNode],
    dbs: &[Arc<NodeDb>],
    cfg: &Config,
    coroutines: usize,
    seed: u64,
) -> Result<BenchReport, BenchError> {
    let types = wl.txn_types().len();
    let total = Arc::new(Mutex::new(Tally::new(types)));
    let phase = Arc::new(AtomicU8::new(WARMUP));
    let worker = make_worker(
        wl.clone(),
        total.clone(),
        phase.clone(),
        seed,
        cfg.run.retry_aborts,
    );
    let warmup = Duration::from_secs_f64(cfg.run.warmup_s.max(0.0));
    let duration = Duration::from_secs_f64(cfg.run.duration_s.max(0.001));
    // The timer thread that moves the run through its phases and samples CPU time.
    let timer = {
        let phase = phase.clone();
        std::thread::spawn(move || {
            std::thread::sleep(warmup);
            let (c0, t0) = (cputime::process_cpu_seconds(), Instant::now());
            phase.store(MEASURE, Ordering::SeqCst);
            std::thread::sleep(duration);
            phase.store(STOP, Ordering::SeqCst);
            (
                cputime::process_cpu_seconds() - c0,
                t0.elapsed().as_secs_f64(),
            )
        })
    };
    let recorder =
        match &cfg.run.history {
            Some(path) => Some(ambidex_history::Recorder::create(path).map_err(|source| {
                BenchError::History {
                    path: path.clone(),
                    source,
                }
            })?),
            None => None,
        };
    let history: Option<ambidex_txn::runner::SinkFactory> = recorder.clone().map(|rec| {
        let f: ambidex_txn::runner::SinkFactory =
            Arc::new(move |_, _| Box::new(ambidex_txn::history::RecorderSink(rec.thread())));
        f
    });
    let spec = RunSpec {
        // A backstop only: workers stop on the timer's STOP.
        duration: Some(warmup + duration + Duration::from_secs(30)),
        history,
        ..cfg.run_spec(coroutines, None)?
    };
    let policy = spec.txn.policy;
    let res = runner::run(nodes, dbs, &spec, worker);
    if let Some(rec) = &recorder {
        rec.flush().map_err(|source| BenchError::History {
            path: cfg.run.history.clone().unwrap_or_default(),
            source,
        })?;
    }
    let (cpu, elapsed) = timer.join().map_err(|_| BenchError::TimerPanicked)?;
    let res = res?;
    let tally = std::mem::replace(&mut *total.lock().unwrap(), Tally::new(types));
    let check = dbs
        .iter()
        .try_for_each(|d| d.room_check().map_err(|e| format!("node {}: {e}", d.node)))
        .and_then(|()| wl.check(dbs).map_err(|e| e.to_string()));
    let verified = dbs
        .iter()
        .map(|d| d.remote_tables_verified().map(|n| n as u64))
        .collect::<Result<Vec<_>, _>>()?;
    let mut report = assemble_report(
        cfg,
        &**wl,
        ReportParts {
            transport: cfg.cluster.transport.name(),
            policy,
            coroutines,
            tally,
            elapsed,
            cpu,
            txn: res.txn,
            rpc: res.rpc,
            transport_counters: res.transport,
            max_rss_bytes: cputime::max_rss_bytes(),
            stuck_workers: res.stuck_workers,
            check,
        },
    );
    report.remote_tables_verified = verified;
    Ok(report)
}

/// What a finished run measured, before it becomes a [`BenchReport`].
pub(crate) struct ReportParts<'a> {
    pub transport: &'a str,
    /// The policy every node ran.
    pub policy: Policy,
    pub coroutines: usize,
    pub tally: Tally,
    /// Measured window (s).
    pub elapsed: f64,
    /// CPU seconds of every node over the measured window.
    pub cpu: f64,
    pub txn: TxnStats,
    pub rpc: RpcStats,
    pub transport_counters: CounterSnapshot,
    pub max_rss_bytes: u64,
    pub stuck_workers: usize,
    pub check: Result<serde_json::Value, String>,
}

/// The report of a run (in-process or combined from node processes).
pub(crate) fn assemble_report<W: Workload>(
    cfg: &Config,
    wl: &W,
    p: ReportParts<'_>,
) -> BenchReport {
    let ReportParts {
        transport,
        policy,
        coroutines,
        tally,
        elapsed,
        cpu,
        txn,
        rpc,
        transport_counters,
        max_rss_bytes,
        stuck_workers,
        check,
    } = p;
    let committed: u64 = tally.per_type.iter().map(|t| t.committed).sum();
    let aborted: u64 = tally.per_type.iter().map(|t| t.aborted).sum();
    let retries: u64 = tally.per_type.iter().map(|t| t.retries).sum();
    let gave_up: u64 = tally.per_type.iter().map(|t| t.gave_up).sum();
    let h = &tally.hist;
    let us = |ns: u64| ns as f64 / 1000.0;
    let latency_us = if h.is_empty() {
        LatencyUs::default()
    } else {
        LatencyUs {
            p50: us(h.value_at_quantile(0.5)),
            p90: us(h.value_at_quantile(0.9)),
            p99: us(h.value_at_quantile(0.99)),
            p999: us(h.value_at_quantile(0.999)),
            mean: h.mean() / 1000.0,
            max: us(h.max()),
        }
    };
    let expected = wl.expected_found_rates();
    let per_type = wl
        .txn_types()
        .iter()
        .zip(tally.per_type)
        .enumerate()
        .map(|(i, (name, mut t))| {
            t.found_rate = if t.committed == 0 {
                0.0
            } else {
                t.found as f64 / t.committed as f64
            };
            t.expected_found_rate = expected.get(i).copied().flatten();
            (name.to_string(), t)
        })
        .collect();
    let (check_json, ok) = match check {
        Ok(v) => (v, true),
        Err(e) => (serde_json::json!({ "violation": e }), false),
    };
    let (invariant_ok, consistency_ok) = wl.check_verdict(&check_json, ok);
    BenchReport {
        workload: cfg.run.workload.clone(),
        transport: transport.to_string(),
        mode: cfg.txn.mode.clone(),
        policy: policy.into(),
        nodes: cfg.cluster.nodes,
        threads_per_node: cfg.cluster.threads,
        coroutines,
        replication: cfg.cluster.replication,
        scale: cfg.scale(),
        load_seconds: 0.0,
        warmup_s: cfg.run.warmup_s,
        duration_s: elapsed,
        committed,
        committed_per_s: committed as f64 / elapsed.max(1e-9),
        cpu_seconds: cpu,
        committed_per_cpu_s: committed as f64 / cpu.max(1e-9),
        aborted,
        attempts: committed + aborted,
        retries,
        gave_up,
        abort_rate: if committed + aborted == 0 {
            0.0
        } else {
            aborted as f64 / (committed + aborted) as f64
        },
        conflict_abort_rate: {
            let user = tally.aborts.get("user").copied().unwrap_or(0);
            let attempts = (committed + aborted).saturating_sub(user);
            if attempts == 0 {
                0.0
            } else {
                aborted.saturating_sub(user) as f64 / attempts as f64
            }
        },
        aborts_by_reason: tally.aborts,
        latency_us,
        per_type,
        phase_means_us: txn
            .phase_means_us()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        location_cache: txn.location_cache,
        txn_layer: txn,
        one_sided: (&rpc).into(),
        rpc,
        transport_counters,
        max_rss_bytes,
        stuck_workers,
        remote_tables_verified: Vec::new(),
        invariant_ok,
        consistency_ok,
        check: check_json,
        timeline_10ms: tally.timeline.iter().map(|&c| c as u64).collect(),
        failures: Vec::new(),
        kills: Vec::new(),
        restarts: Vec::new(),
        restarts_not_done: Vec::new(),
        manager_events: Vec::new(),
        recovery: None,
        first_lost_commit_ns: tally.first_lost_commit_ns,
        config: cfg.clone(),
    }
}
