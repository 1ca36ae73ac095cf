//! The benchmark driver: builds an in-process cluster (local fabric, or shm with every node
//! opened in this process), loads a workload in parallel, runs it with a warmup, checks
//! its invariants and produces the report.
//!
//! Multi-process runs (one `ambidex node` process per node, [`crate::node`]) share the
//! worker loop ([`make_worker`]) and the report ([`assemble_report`]): each node sends a
//! [`NodeReport`] and [`combine_node_reports`] merges them into the same [`BenchReport`].
//!
//! Warmup: workers start together and run for `warmup_s`; a timer thread then flips the
//! run into the measured phase (sampling process CPU time and the clock), and after
//! `duration_s` into the stop phase. A transaction counts (throughput, latency, aborts,
//! per-type counts) iff it *finishes* in the measured phase, so CPU time and elapsed time
//! cover exactly the counted window. The transaction layer's own `TxnStats` (phase means)
//! cover the whole run, warmup included.

use crate::common::{worker_seed, Loader, Outcome, Workload};
use crate::{objstore, smallbank, tatp, tpcc};
use ambidex_rpc::{RpcStats, RuntimeConfig};
use ambidex_transport::local::LocalFabric;
use ambidex_transport::{cputime, ClusterConfig, CounterSnapshot, SharedNode};
use ambidex_txn::runner::{self, RunSpec, Worker, WorkerCtx};
use ambidex_txn::stats::PhaseMap;
use ambidex_txn::{AbortReason, NodeDb, Phase, Placement, TxnConfig, TxnStats};
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Which workload to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadKind {
    /// FaSST's object store O(r, w) (reads/writes in [`BenchConfig::objstore`]).
    ObjectStore,
    Tatp,
    SmallBank,
    /// Full TPC-C mix.
    Tpcc,
    /// DrTM+H's TPC-C variant: NewOrder only, always distributed.
    TpccNo,
}

impl WorkloadKind {
    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::ObjectStore => "object-store",
            WorkloadKind::Tatp => "tatp",
            WorkloadKind::SmallBank => "smallbank",
            WorkloadKind::Tpcc => "tpcc",
            WorkloadKind::TpccNo => "tpcc-no",
        }
    }

    /// Worker coroutines per thread when none are given: FaSST's ~20, enough to hide the
    /// network latency (FaSST §4.1); 8 for TPC-C, whose transactions are long and contend
    /// on few warehouses at the quick scale.
    pub fn default_coroutines(self) -> usize {
        match self {
            WorkloadKind::Tpcc | WorkloadKind::TpccNo => 8,
            _ => 20,
        }
    }

    /// The scale used when none is given: small enough that a 3-node run loads in a few
    /// seconds on a 2-core machine. Paper scale is 1.0 (see [`BenchConfig::scale`]).
    pub fn quick_scale(self) -> f64 {
        match self {
            WorkloadKind::ObjectStore => 0.1,
            WorkloadKind::Tatp => 0.05,
            WorkloadKind::SmallBank => 1.0,
            WorkloadKind::Tpcc | WorkloadKind::TpccNo => 0.1,
        }
    }
}

impl std::str::FromStr for WorkloadKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "object-store" | "objstore" | "object" => WorkloadKind::ObjectStore,
            "tatp" => WorkloadKind::Tatp,
            "smallbank" => WorkloadKind::SmallBank,
            "tpcc" => WorkloadKind::Tpcc,
            "tpcc-no" => WorkloadKind::TpccNo,
            _ => {
                return Err(format!(
                    "unknown workload {s:?} (object-store, tatp, smallbank, tpcc, tpcc-no)"
                ))
            }
        })
    }
}

/// Which transport the in-process cluster uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TransportKind {
    Local,
    Shm,
}

impl std::str::FromStr for TransportKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "local" => Ok(TransportKind::Local),
            "shm" => Ok(TransportKind::Shm),
            _ => Err(format!("unknown transport {s:?} (local, shm)")),
        }
    }
}

/// O(r, w) parameters.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ObjStoreParams {
    /// Keys read per transaction (r).
    pub reads: usize,
    /// Of those, keys updated (w ≤ r).
    pub writes: usize,
    /// Allow several keys of a transaction on one primary (default: distinct primaries
    /// where r ≤ nodes, as FaSST's O(r, w) avoids coalescing).
    pub same_node: bool,
}

impl Default for ObjStoreParams {
    fn default() -> Self {
        ObjStoreParams {
            reads: 1,
            writes: 0,
            same_node: false,
        }
    }
}

#[derive(Clone, Debug)]
pub struct BenchConfig {
    pub workload: WorkloadKind,
    pub nodes: u16,
    pub threads: u16,
    /// Worker coroutines per thread.
    pub coroutines: usize,
    pub replication: u16,
    pub duration_s: f64,
    pub warmup_s: f64,
    /// Multiplier of the paper-scale population (`None`: [`WorkloadKind::quick_scale`]).
    /// 1.0 is: object store 1,000,000 keys per thread; TATP 1,000,000 subscribers per
    /// node; SmallBank 100,000 accounts per thread; TPC-C 1 warehouse per thread with
    /// spec-size tables (above 1, more warehouses per thread; below 1, one warehouse per
    /// thread with items, customers and initial orders shrunk by the factor).
    pub scale: Option<f64>,
    pub seed: u64,
    pub transport: TransportKind,
    pub objstore: ObjStoreParams,
    /// Show a progress bar on stderr while loading.
    pub progress: bool,
    /// Record every transaction's reads and writes to this JSON-lines file
    /// (`docs/history-format.md`); off by default.
    pub history: Option<std::path::PathBuf>,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            workload: WorkloadKind::SmallBank,
            nodes: 3,
            threads: 1,
            coroutines: 20,
            replication: 3,
            duration_s: 5.0,
            warmup_s: 1.0,
            scale: None,
            seed: 42,
            transport: TransportKind::Local,
            objstore: ObjStoreParams::default(),
            progress: true,
            history: None,
        }
    }
}

impl BenchConfig {
    pub fn scale(&self) -> f64 {
        self.scale.unwrap_or_else(|| self.workload.quick_scale())
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct LatencyUs {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub mean: f64,
    pub max: f64,
}

/// Counts of one transaction type in the measured window.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TypeReport {
    pub committed: u64,
    pub aborted: u64,
    /// Committed transactions that found their row(s) (TATP; others: all committed).
    pub found: u64,
    pub not_found: u64,
    /// found / committed.
    #[serde(default)]
    pub found_rate: f64,
    /// The rate WORKLOADS.md expects (TATP only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_found_rate: Option<f64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct BenchReport {
    pub workload: String,
    pub transport: String,
    pub mode: String,
    pub nodes: u16,
    pub threads_per_node: u16,
    pub coroutines: usize,
    pub replication: u16,
    pub scale: f64,
    pub load_seconds: f64,
    pub warmup_s: f64,
    /// Measured window (seconds).
    pub duration_s: f64,
    pub committed: u64,
    pub committed_per_s: f64,
    /// Process CPU time (all node threads) in the measured window.
    pub cpu_seconds: f64,
    pub committed_per_cpu_s: f64,
    pub aborted: u64,
    /// aborted / (committed + aborted).
    pub abort_rate: f64,
    pub aborts_by_reason: BTreeMap<String, u64>,
    /// Aborts other than the application's own (`user`: SmallBank's insufficient funds,
    /// TPC-C's 1% NewOrder rollback) over the attempts that were not application aborts:
    /// the conflict/failure rate of the protocol.
    pub conflict_abort_rate: f64,
    pub latency_us: LatencyUs,
    pub per_type: BTreeMap<String, TypeReport>,
    /// Mean µs per protocol phase (whole run, warmup included).
    pub phase_means_us: BTreeMap<String, f64>,
    /// The transaction layer's counters (whole run, warmup included).
    pub txn_layer: TxnStats,
    pub rpc: ambidex_rpc::RpcStats,
    pub transport_counters: CounterSnapshot,
    pub max_rss_bytes: u64,
    pub stuck_workers: usize,
    /// SmallBank: the total balance matches the committed deltas.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invariant_ok: Option<bool>,
    /// TPC-C: consistency conditions 1–4 hold.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consistency_ok: Option<bool>,
    /// What the workload's check computed (or the violation).
    pub check: serde_json::Value,
}

/// One point of the coroutine sweep (FaSST Figure 10).
#[derive(Clone, Debug, Serialize)]
pub struct SweepPoint {
    pub coroutines: usize,
    pub committed_per_s: f64,
    pub committed_per_cpu_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// An in-process cluster: transport nodes and one database per node.
struct Cluster {
    nodes: Vec<SharedNode>,
    shm_dir: Option<PathBuf>,
    _fabric: Option<Arc<LocalFabric>>,
}

impl Cluster {
    fn new(cfg: &BenchConfig) -> Result<Cluster, String> {
        let cc = ClusterConfig::new(cfg.nodes, cfg.threads);
        match cfg.transport {
            TransportKind::Local => {
                let f = LocalFabric::new(cc).map_err(|e| e.to_string())?;
                Ok(Cluster {
                    nodes: f.nodes(),
                    shm_dir: None,
                    _fabric: Some(f),
                })
            }
            TransportKind::Shm => {
                static N: AtomicU64 = AtomicU64::new(0);
                let dir = ambidex_transport_shm::ShmCluster::default_dir(cc.cluster_id)
                    .with_extension(format!(
                        "bench-{}-{}",
                        std::process::id(),
                        N.fetch_add(1, Ordering::Relaxed)
                    ));
                ambidex_transport_shm::ShmCluster::create(&dir, &cc).map_err(|e| e.to_string())?;
                let mut c = Cluster {
                    nodes: Vec::new(),
                    shm_dir: Some(dir.clone()),
                    _fabric: None,
                };
                for n in 0..cfg.nodes {
                    c.nodes.push(
                        ambidex_transport_shm::ShmNode::open(&dir, n).map_err(|e| e.to_string())?,
                    );
                }
                Ok(c)
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.nodes.clear();
        if let Some(d) = &self.shm_dir {
            let _ = ambidex_transport_shm::ShmCluster::remove(d);
        }
    }
}

/// Runs the benchmark `cfg` describes and returns its report.
pub fn run_bench(cfg: &BenchConfig) -> Result<BenchReport, String> {
    let mut out = Vec::new();
    with_workload(cfg, &[cfg.coroutines], &mut out)?;
    Ok(out.pop().expect("one run"))
}

/// Loads once and runs once per coroutine count (FaSST Figure 10's throughput-latency
/// curve). Each run starts from the state the previous one left.
pub fn sweep_coroutines(
    cfg: &BenchConfig,
    counts: &[usize],
) -> Result<(Vec<SweepPoint>, Vec<BenchReport>), String> {
    let mut reports = Vec::new();
    with_workload(cfg, counts, &mut reports)?;
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
    cfg: &BenchConfig,
    counts: &[usize],
    out: &mut Vec<BenchReport>,
) -> Result<(), String> {
    if counts.contains(&0) {
        return Err("threads and coroutines must be at least 1".into());
    }
    struct Run<'a> {
        cfg: &'a BenchConfig,
        counts: &'a [usize],
        out: &'a mut Vec<BenchReport>,
    }
    impl WorkloadVisitor<()> for Run<'_> {
        fn visit<W: Workload>(self, wl: Arc<W>, placement: Placement) -> Result<(), String> {
            run_all(wl, placement, self.cfg, self.counts, self.out)
        }
    }
    dispatch(cfg, Run { cfg, counts, out })
}

/// Something done with the workload a [`BenchConfig`] describes, whatever its type
/// (the [`Workload`] trait is not object safe, so callers visit it instead).
pub trait WorkloadVisitor<R> {
    fn visit<W: Workload>(self, wl: Arc<W>, placement: Placement) -> Result<R, String>;
}

/// Builds (does not load) the workload of `cfg` and hands it to `v`.
pub fn dispatch<R>(cfg: &BenchConfig, v: impl WorkloadVisitor<R>) -> Result<R, String> {
    let placement = Placement::new(cfg.nodes, cfg.replication)?;
    if cfg.threads == 0 {
        return Err("threads and coroutines must be at least 1".into());
    }
    let scale = cfg.scale();
    if scale.is_nan() || scale <= 0.0 {
        return Err(format!("scale must be positive, not {scale}"));
    }
    match cfg.workload {
        WorkloadKind::ObjectStore => {
            let wl = objstore::ObjectStore::new(placement, cfg.threads, scale, cfg.objstore)?;
            v.visit(Arc::new(wl), placement)
        }
        WorkloadKind::Tatp => v.visit(Arc::new(tatp::Tatp::new(placement, scale)), placement),
        WorkloadKind::SmallBank => v.visit(
            Arc::new(smallbank::SmallBank::new(placement, cfg.threads, scale)),
            placement,
        ),
        WorkloadKind::Tpcc | WorkloadKind::TpccNo => {
            let p = tpcc::TpccParams::new(
                placement,
                cfg.threads,
                scale,
                cfg.workload == WorkloadKind::TpccNo,
                cfg.warmup_s + cfg.duration_s,
            );
            v.visit(Arc::new(tpcc::Tpcc::new(p)), placement)
        }
    }
}

/// Creates one database per node with the workload's tables and loads it in parallel.
pub fn build_and_load<W: Workload>(
    wl: &W,
    placement: Placement,
    seed: u64,
    progress: bool,
) -> Result<Vec<Arc<NodeDb>>, String> {
    let specs = wl.tables();
    let dbs: Vec<Arc<NodeDb>> = (0..placement.nodes)
        .map(|n| NodeDb::new(n, placement, &specs))
        .collect::<Result<_, _>>()?;
    load_parallel(wl, &dbs, seed, progress)?;
    wl.after_load(&dbs)?;
    Ok(dbs)
}

/// Creates and loads the database of node `node` only (a node process of a multi-process
/// cluster): every unit is generated, and only this node's rows are stored.
pub fn build_and_load_node<W: Workload>(
    wl: &W,
    placement: Placement,
    node: u16,
    seed: u64,
    progress: bool,
) -> Result<Arc<NodeDb>, String> {
    if node >= placement.nodes {
        return Err(format!(
            "node {node} is outside a cluster of {} nodes",
            placement.nodes
        ));
    }
    let db = NodeDb::new(node, placement, &wl.tables())?;
    let dbs = [db];
    load_parallel(wl, &dbs, seed, progress)?;
    wl.after_load(&dbs)?;
    let [db] = dbs;
    Ok(db)
}

fn load_parallel<W: Workload>(
    wl: &W,
    dbs: &[Arc<NodeDb>],
    seed: u64,
    progress: bool,
) -> Result<(), String> {
    let units = wl.load_units();
    let nodes = dbs.iter().map(|d| d.node as usize + 1).max().unwrap_or(0);
    // One thread per group of nodes; generation (cheap) is repeated by every thread so
    // that each node's tables are written by one thread only.
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let threads = dbs.len().min(cores.max(2)).max(1);
    let bar = if progress {
        let b = indicatif::ProgressBar::with_draw_target(
            Some(units),
            indicatif::ProgressDrawTarget::stderr(),
        );
        b.set_style(
            indicatif::ProgressStyle::with_template("loading {msg} [{bar:40}] {pos}/{len} ({eta})")
                .expect("template")
                .progress_chars("=> "),
        );
        b.set_message(wl.name());
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let failed = std::sync::atomic::AtomicBool::new(false);
    let err: Mutex<Option<String>> = Mutex::new(None);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (bar, failed, err) = (&bar, &failed, &err);
            s.spawn(move || {
                // Thread t writes the databases at positions t, t + threads, ...
                let mut mine = vec![false; nodes];
                for (i, db) in dbs.iter().enumerate() {
                    if i % threads == t {
                        mine[db.node as usize] = true;
                    }
                }
                let loader = Loader::new(dbs, mine, t == 0);
                for u in 0..units {
                    if failed.load(Ordering::Relaxed) {
                        return;
                    }
                    // A stream per unit: the data depends neither on the thread nor on
                    // the number of threads.
                    let mut rng =
                        SmallRng::seed_from_u64(worker_seed(seed, 0xffff, 0xffff, u as usize));
                    if let Err(e) = wl.load_unit(u, &mut rng, &loader) {
                        failed.store(true, Ordering::Relaxed);
                        *err.lock().unwrap() = Some(e);
                        return;
                    }
                    if t == 0 && u % 64 == 63 {
                        bar.inc(64);
                    }
                }
            });
        }
    });
    bar.finish_and_clear();
    match err.into_inner().unwrap() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// What every worker coroutine adds up.
pub struct Tally {
    per_type: Vec<TypeReport>,
    aborts: BTreeMap<String, u64>,
    hist: Histogram<u64>,
}

/// Largest latency the histograms hold (ns): 100 s.
const HIST_MAX_NS: u64 = 100_000_000_000;

impl Tally {
    pub fn new(types: usize) -> Tally {
        Tally {
            per_type: vec![TypeReport::default(); types],
            aborts: BTreeMap::new(),
            // 1 ns .. 100 s at 2 significant digits (1% resolution): a count array small
            // enough to stay in cache (3 digits cost ~2% of TATP's CPU time).
            hist: Histogram::new_with_bounds(1, HIST_MAX_NS, 2).expect("histogram bounds"),
        }
    }

    fn merge(&mut self, o: &Tally) {
        for (a, b) in self.per_type.iter_mut().zip(&o.per_type) {
            a.committed += b.committed;
            a.aborted += b.aborted;
            a.found += b.found;
            a.not_found += b.not_found;
        }
        for (k, v) in &o.aborts {
            *self.aborts.entry(k.clone()).or_insert(0) += v;
        }
        self.hist.add(&o.hist).expect("same histogram bounds");
    }
}

pub(crate) const WARMUP: u8 = 0;
pub(crate) const MEASURE: u8 = 1;
pub(crate) const STOP: u8 = 2;

fn run_all<W: Workload>(
    wl: Arc<W>,
    placement: Placement,
    cfg: &BenchConfig,
    counts: &[usize],
    out: &mut Vec<BenchReport>,
) -> Result<(), String> {
    let t0 = Instant::now();
    let dbs = build_and_load(&*wl, placement, cfg.seed, cfg.progress)?;
    let load_seconds = t0.elapsed().as_secs_f64();
    for (i, &coroutines) in counts.iter().enumerate() {
        // A fresh transport per run; the data stays.
        let cluster = Cluster::new(cfg)?;
        let mut r = run_once(
            &wl,
            &cluster.nodes,
            &dbs,
            cfg,
            coroutines,
            cfg.seed.wrapping_add(i as u64),
        )?;
        drop(cluster);
        r.load_seconds = load_seconds;
        out.push(r);
    }
    Ok(())
}

/// The worker coroutine every (node, thread, coroutine) runs: transactions from the mix
/// until the phase is [`STOP`] (or the runner says stop), counting those that finish in
/// the [`MEASURE`] phase into a tally merged into `total` at the end.
pub(crate) fn make_worker<W: Workload>(
    wl: Arc<W>,
    total: Arc<Mutex<Tally>>,
    phase: Arc<AtomicU8>,
    seed: u64,
) -> Worker {
    let types = wl.txn_types().len();
    Arc::new(move |w: WorkerCtx| {
        let (wl, total, phase) = (wl.clone(), total.clone(), phase.clone());
        Box::pin(async move {
            let mut rng = SmallRng::seed_from_u64(worker_seed(seed, w.node, w.thread, w.coroutine));
            let mut local = W::Local::default();
            let mut tally = Tally::new(types);
            loop {
                if phase.load(Ordering::Relaxed) == STOP || w.stop.load(Ordering::Relaxed) {
                    break;
                }
                let start = w.ctx.now_ns();
                let (ty, outcome) = wl.run_one(&w, &mut rng, &mut local).await;
                if phase.load(Ordering::Relaxed) != MEASURE {
                    continue;
                }
                let t = &mut tally.per_type[ty];
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
                        *tally.aborts.entry(r.name().to_string()).or_insert(0) += 1;
                    }
                }
            }
            wl.finish_worker(local);
            total.lock().unwrap().merge(&tally);
        })
    })
}

fn run_once<W: Workload>(
    wl: &Arc<W>,
    nodes: &[SharedNode],
    dbs: &[Arc<NodeDb>],
    cfg: &BenchConfig,
    coroutines: usize,
    seed: u64,
) -> Result<BenchReport, String> {
    let types = wl.txn_types().len();
    let total = Arc::new(Mutex::new(Tally::new(types)));
    let phase = Arc::new(AtomicU8::new(WARMUP));
    let worker = make_worker(wl.clone(), total.clone(), phase.clone(), seed);
    let warmup = Duration::from_secs_f64(cfg.warmup_s.max(0.0));
    let duration = Duration::from_secs_f64(cfg.duration_s.max(0.001));
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
    let recorder = match &cfg.history {
        Some(path) => Some(
            ambidex_history::Recorder::create(path)
                .map_err(|e| format!("cannot create history file {}: {e}", path.display()))?,
        ),
        None => None,
    };
    let history: Option<ambidex_txn::runner::SinkFactory> = recorder.clone().map(|rec| {
        let f: ambidex_txn::runner::SinkFactory =
            Arc::new(move |_, _| Box::new(ambidex_txn::history::RecorderSink(rec.thread())));
        f
    });
    let spec = RunSpec {
        coroutines,
        rpc: RuntimeConfig::default(),
        txn: TxnConfig::default(),
        // A backstop only: workers stop on the timer's STOP.
        duration: Some(warmup + duration + Duration::from_secs(30)),
        history,
    };
    let res = runner::run(nodes, dbs, &spec, worker);
    if let Some(rec) = &recorder {
        rec.flush()
            .map_err(|e| format!("writing the history: {e}"))?;
    }
    let (cpu, elapsed) = timer
        .join()
        .map_err(|_| "timer thread panicked".to_string())?;
    let res = res?;
    let tally = std::mem::replace(&mut *total.lock().unwrap(), Tally::new(types));
    let check = wl.check(dbs);
    Ok(assemble_report(
        cfg,
        &**wl,
        ReportParts {
            transport: match cfg.transport {
                TransportKind::Local => "local",
                TransportKind::Shm => "shm",
            },
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
    ))
}

/// What a finished run measured, before it becomes a [`BenchReport`].
pub struct ReportParts<'a> {
    pub transport: &'a str,
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
pub fn assemble_report<W: Workload>(cfg: &BenchConfig, wl: &W, p: ReportParts<'_>) -> BenchReport {
    let ReportParts {
        transport,
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
    let h = &tally.hist;
    let us = |ns: u64| ns as f64 / 1000.0;
    let latency_us = if h.is_empty() {
        LatencyUs::default()
    } else {
        LatencyUs {
            p50: us(h.value_at_quantile(0.5)),
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
    let (invariant_ok, consistency_ok) = match cfg.workload {
        WorkloadKind::SmallBank => (Some(ok), None),
        WorkloadKind::Tpcc | WorkloadKind::TpccNo => (None, Some(ok)),
        _ => (if check_json.is_null() { None } else { Some(ok) }, None),
    };
    BenchReport {
        workload: cfg.workload.name().to_string(),
        transport: transport.to_string(),
        mode: "fasst".into(),
        nodes: cfg.nodes,
        threads_per_node: cfg.threads,
        coroutines,
        replication: cfg.replication,
        scale: cfg.scale(),
        load_seconds: 0.0,
        warmup_s: cfg.warmup_s,
        duration_s: elapsed,
        committed,
        committed_per_s: committed as f64 / elapsed.max(1e-9),
        cpu_seconds: cpu,
        committed_per_cpu_s: committed as f64 / cpu.max(1e-9),
        aborted,
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
        txn_layer: txn,
        rpc,
        transport_counters,
        max_rss_bytes,
        stuck_workers,
        invariant_ok,
        consistency_ok,
        check: check_json,
    }
}

// ----- multi-process runs: one node's report and their combination -----

/// What one node process reports after a run (the `report` message of the control
/// protocol, docs/cluster.md). Everything is additive over nodes except `max_rss_bytes`
/// (the launcher takes the largest). It arrives from another process: the launcher
/// treats it as untrusted input.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NodeReport {
    pub node: u16,
    pub load_seconds: f64,
    /// Wall time of this node's measured window (between `measure` and `stop`).
    pub measured_s: f64,
    /// User + system CPU seconds of this node's process over its measured window.
    pub cpu_seconds: f64,
    /// Peak resident set size of this node's process.
    pub max_rss_bytes: u64,
    /// Per transaction type (the workload's order): committed, aborted, found, not found.
    pub per_type: Vec<TypeReport>,
    pub aborts_by_reason: BTreeMap<String, u64>,
    /// The latency histogram of committed transactions (ns) as raw counts:
    /// `[value, count]` per recorded bucket (its highest equivalent value).
    pub latency_ns: Vec<[u64; 2]>,
    /// `TxnStats` of this node's threads (as serialized).
    pub txn_layer: serde_json::Value,
    /// `RpcStats` of this node's threads (as serialized).
    pub rpc: serde_json::Value,
    pub transport_counters: CounterSnapshot,
    pub stuck_workers: usize,
    /// The workload's [`Workload::check_node`] result...
    pub check: serde_json::Value,
    /// ...or the violation it found.
    #[serde(default)]
    pub check_violation: Option<String>,
    /// Digests of the rows this node stores, per (table, primary node): what
    /// [`combine_node_reports`] compares between a primary and its backups.
    #[serde(default)]
    pub replica_digests: Vec<ReplicaDigest>,
}

/// An order-independent digest of the rows of `table` whose primary is `primary`, as
/// stored on one node (the primary itself or one of its backups). Deletes count (as
/// their tombstones); keys that never existed do not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaDigest {
    pub table: u32,
    pub primary: u16,
    pub rows: u64,
    /// Wrapping sum of a 64-bit hash of (key, transaction version, value) per row.
    pub sum: u64,
}

fn row_hash(key: u64, meta: u64, value: &[u8]) -> u64 {
    // FNV-1a over the value, mixed with the key and the version word.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in value {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mut x = h ^ key.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ meta.rotate_left(29);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// The digests of every table of `db` (after a run, on the quiescent node).
pub fn replica_digests<W: Workload>(wl: &W, db: &NodeDb) -> Vec<ReplicaDigest> {
    let mut map: BTreeMap<(u32, u16), ReplicaDigest> = BTreeMap::new();
    for spec in wl.tables() {
        for (key, meta, value) in db.dump(spec.id) {
            // A version-0 tombstone is a key that never existed: an aborted insert leaves
            // one at the primary only. Deletes leave tombstones with their version.
            if meta == ambidex_txn::db::TOMBSTONE {
                continue;
            }
            let primary = db.placement.primary(spec.id, key);
            let d = map.entry((spec.id, primary)).or_insert(ReplicaDigest {
                table: spec.id,
                primary,
                ..Default::default()
            });
            d.rows += 1;
            d.sum = d.sum.wrapping_add(row_hash(key, meta, value.as_slice()));
        }
    }
    map.into_values().collect()
}

impl NodeReport {
    /// Packs one node's tally and counters.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        node: u16,
        tally: Tally,
        txn: &TxnStats,
        rpc: &RpcStats,
        transport_counters: CounterSnapshot,
        stuck_workers: usize,
        check: Result<serde_json::Value, String>,
        replica_digests: Vec<ReplicaDigest>,
    ) -> NodeReport {
        let (check, check_violation) = match check {
            Ok(v) => (v, None),
            Err(e) => (serde_json::Value::Null, Some(e)),
        };
        NodeReport {
            node,
            per_type: tally.per_type,
            aborts_by_reason: tally.aborts,
            latency_ns: tally
                .hist
                .iter_recorded()
                .map(|v| [v.value_iterated_to(), v.count_at_value()])
                .collect(),
            txn_layer: serde_json::to_value(txn).unwrap_or_default(),
            rpc: serde_json::to_value(rpc).unwrap_or_default(),
            transport_counters,
            stuck_workers,
            check,
            check_violation,
            replica_digests,
            ..Default::default()
        }
    }
}

/// Merges the reports of every node (one per node, any order) into the run's report.
/// `elapsed` is the measured window as the launcher timed it.
pub fn combine_node_reports(
    cfg: &BenchConfig,
    transport: &str,
    elapsed: f64,
    reports: Vec<NodeReport>,
) -> Result<BenchReport, String> {
    struct Combine<'a> {
        cfg: &'a BenchConfig,
        transport: &'a str,
        elapsed: f64,
        reports: Vec<NodeReport>,
    }
    impl WorkloadVisitor<BenchReport> for Combine<'_> {
        fn visit<W: Workload>(self, wl: Arc<W>, p: Placement) -> Result<BenchReport, String> {
            combine(
                self.cfg,
                &*wl,
                p,
                self.transport,
                self.elapsed,
                self.reports,
            )
        }
    }
    dispatch(
        cfg,
        Combine {
            cfg,
            transport,
            elapsed,
            reports,
        },
    )
}

fn combine<W: Workload>(
    cfg: &BenchConfig,
    wl: &W,
    placement: Placement,
    transport: &str,
    elapsed: f64,
    mut reports: Vec<NodeReport>,
) -> Result<BenchReport, String> {
    reports.sort_by_key(|r| r.node);
    let nodes: Vec<u16> = reports.iter().map(|r| r.node).collect();
    if nodes != (0..cfg.nodes).collect::<Vec<_>>() {
        return Err(format!(
            "expected one report from each of nodes 0..{}, got nodes {nodes:?}",
            cfg.nodes
        ));
    }
    let types = wl.txn_types().len();
    let mut tally = Tally::new(types);
    let (mut txn, mut rpc) = (TxnStats::default(), RpcStats::default());
    let mut counters = CounterSnapshot::default();
    let (mut cpu, mut rss, mut stuck, mut load) = (0.0, 0u64, 0usize, 0.0f64);
    let mut parts = Vec::new();
    let mut violations = Vec::new();
    for r in &reports {
        let n = r.node;
        plausible(r).map_err(|e| format!("node {n}'s report: {e}"))?;
        if r.per_type.len() != types {
            return Err(format!(
                "node {n} reported {} transaction types, the workload has {types}",
                r.per_type.len()
            ));
        }
        for (a, b) in tally.per_type.iter_mut().zip(&r.per_type) {
            a.committed = a.committed.saturating_add(b.committed);
            a.aborted = a.aborted.saturating_add(b.aborted);
            a.found = a.found.saturating_add(b.found);
            a.not_found = a.not_found.saturating_add(b.not_found);
        }
        for (k, v) in &r.aborts_by_reason {
            let e = tally.aborts.entry(k.clone()).or_insert(0);
            *e = e.saturating_add(*v);
        }
        for &[value, count] in &r.latency_ns {
            tally
                .hist
                .record_n(value.max(1), count)
                .map_err(|e| format!("node {n}'s latency histogram: {e:?}"))?;
        }
        txn.merge(&txn_stats_from_json(&r.txn_layer).map_err(|e| format!("node {n}: {e}"))?);
        rpc.merge(&rpc_stats_from_json(&r.rpc).map_err(|e| format!("node {n}: {e}"))?);
        counters.merge(&r.transport_counters);
        if !(r.cpu_seconds.is_finite() && r.cpu_seconds >= 0.0) {
            return Err(format!("node {n} reported {} CPU seconds", r.cpu_seconds));
        }
        cpu += r.cpu_seconds;
        rss = rss.max(r.max_rss_bytes);
        stuck = stuck.saturating_add(r.stuck_workers);
        if r.load_seconds.is_finite() {
            load = load.max(r.load_seconds);
        }
        match &r.check_violation {
            Some(v) => violations.push(format!("node {n}: {v}")),
            None => parts.push(r.check.clone()),
        }
    }
    let check = if !violations.is_empty() {
        Err(violations.join("; "))
    } else {
        wl.check_combine(&parts).and_then(|summary| {
            let replicas = compare_replicas(&reports, placement)?;
            Ok(match summary {
                serde_json::Value::Object(mut m) => {
                    m.insert("replica_rows_compared".into(), replicas.into());
                    serde_json::Value::Object(m)
                }
                other => other,
            })
        })
    };
    let mut r = assemble_report(
        cfg,
        wl,
        ReportParts {
            transport,
            coroutines: cfg.coroutines,
            tally,
            elapsed,
            cpu,
            txn,
            rpc,
            transport_counters: counters,
            max_rss_bytes: rss,
            stuck_workers: stuck,
            check,
        },
    );
    r.load_seconds = load;
    Ok(r)
}

/// Largest counter accepted from a node report: far above any real run, and low enough
/// that sums over nodes cannot overflow.
const MAX_COUNT: u64 = 1 << 56;

/// Rejects counters no run can produce (a node report is input from another process).
fn plausible(r: &NodeReport) -> Result<(), String> {
    let big = |what: &str, v: u64| {
        if v > MAX_COUNT {
            Err(format!("{what} = {v} is implausible"))
        } else {
            Ok(())
        }
    };
    for t in &r.per_type {
        for v in [t.committed, t.aborted, t.found, t.not_found] {
            big("a transaction count", v)?;
        }
    }
    for (k, v) in &r.aborts_by_reason {
        big(k, *v)?;
    }
    for [_, c] in &r.latency_ns {
        big("a latency count", *c)?;
    }
    for (k, v) in &r.transport_counters.0 {
        big(k, *v)?;
    }
    big("stuck_workers", r.stuck_workers as u64)?;
    for (what, x) in [("txn_layer", &r.txn_layer), ("rpc", &r.rpc)] {
        let mut stack = vec![x];
        while let Some(v) = stack.pop() {
            match v {
                serde_json::Value::Number(n) => {
                    big(what, n.as_u64().unwrap_or(0))?;
                }
                serde_json::Value::Array(a) => stack.extend(a),
                serde_json::Value::Object(m) => stack.extend(m.values()),
                _ => {}
            }
        }
    }
    Ok(())
}

/// Every backup holds exactly its primary's rows (same keys, versions and values) once
/// the cluster is quiescent. Returns the backup rows compared.
fn compare_replicas(reports: &[NodeReport], placement: Placement) -> Result<u64, String> {
    // (table, primary) -> per holding node, its digest.
    let mut groups: BTreeMap<(u32, u16), BTreeMap<u16, ReplicaDigest>> = BTreeMap::new();
    for r in reports {
        for d in &r.replica_digests {
            groups
                .entry((d.table, d.primary))
                .or_default()
                .insert(r.node, *d);
        }
    }
    let mut compared = 0u64;
    for ((table, primary), holders) in &groups {
        let reference = holders.get(primary).copied().unwrap_or(ReplicaDigest {
            table: *table,
            primary: *primary,
            ..Default::default()
        });
        for i in 1..placement.replication {
            let b = ((*primary as u32 + i as u32) % placement.nodes as u32) as u16;
            let got = holders.get(&b).copied().unwrap_or(ReplicaDigest {
                table: *table,
                primary: *primary,
                ..Default::default()
            });
            if got != reference {
                return Err(format!(
                    "replicas differ: table {table}, primary node {primary} has {} rows \
                     (digest {:#x}), its backup node {b} has {} rows (digest {:#x})",
                    reference.rows, reference.sum, got.rows, got.sum
                ));
            }
            compared += got.rows;
        }
        if let Some(extra) = holders
            .keys()
            .find(|&&n| !placement_holds(placement, *primary, n))
        {
            return Err(format!(
                "node {extra} stores rows of table {table} whose primary is node {primary}, \
                 but it is not one of their replicas"
            ));
        }
    }
    Ok(compared)
}

fn placement_holds(p: Placement, primary: u16, node: u16) -> bool {
    let d = (node as u32 + p.nodes as u32 - primary as u32) % p.nodes as u32;
    d < p.replication as u32
}

// Node reports carry `RpcStats` (serde) and `TxnStats` as JSON. `TxnStats` keys its
// aborts by `&'static str`, so it is rebuilt field by field (a unit test checks that no
// field is missed).

fn json_u64(v: &serde_json::Value, name: &str) -> Result<u64, String> {
    match v.get(name) {
        None => Ok(0),
        Some(x) => x
            .as_u64()
            .ok_or_else(|| format!("counter {name:?} is not a non-negative integer")),
    }
}

fn rpc_stats_from_json(v: &serde_json::Value) -> Result<RpcStats, String> {
    if !v.is_object() {
        return Err("RPC counters are not a JSON object".into());
    }
    RpcStats::deserialize(v).map_err(|e| format!("RPC counters: {e}"))
}

const ABORT_REASONS: [AbortReason; 9] = [
    AbortReason::LockedAtExecute,
    AbortReason::MissingKey,
    AbortReason::InsertExists,
    AbortReason::LockedAtValidate,
    AbortReason::VersionChanged,
    AbortReason::TableFull,
    AbortReason::Timeout,
    AbortReason::BadResponse,
    AbortReason::User,
];

/// The `&'static str` `TxnStats::aborts` keys by: a known reason's name, or (a reason
/// added since) a leaked copy, at most 64 of them per process.
fn intern_reason(name: &str) -> Result<&'static str, String> {
    if let Some(r) = ABORT_REASONS.iter().find(|r| r.name() == name) {
        return Ok(r.name());
    }
    static EXTRA: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut extra = EXTRA.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = extra.iter().find(|s| **s == name) {
        return Ok(s);
    }
    if extra.len() >= 64 || name.len() > 64 {
        return Err(format!("unknown abort reason {name:?}"));
    }
    let s: &'static str = Box::leak(name.to_string().into_boxed_str());
    extra.push(s);
    Ok(s)
}

#[allow(clippy::needless_update)]
fn txn_stats_from_json(v: &serde_json::Value) -> Result<TxnStats, String> {
    if !v.is_object() {
        return Err("transaction-layer counters are not a JSON object".into());
    }
    let g = |name: &str| json_u64(v, name);
    let arr = |name: &str| -> Result<PhaseMap<u64>, String> {
        let mut out = PhaseMap::<u64>::default();
        if let Some(a) = v.get(name) {
            let a = a
                .as_array()
                .filter(|a| a.len() == Phase::COUNT)
                .ok_or_else(|| format!("{name:?} is not an array of {} counters", Phase::COUNT))?;
            for (o, x) in out.0.iter_mut().zip(a) {
                *o = x
                    .as_u64()
                    .ok_or_else(|| format!("{name:?} holds a non-integer"))?;
            }
        }
        Ok(out)
    };
    let mut aborts = BTreeMap::new();
    if let Some(m) = v.get("aborts") {
        let m = m.as_object().ok_or("\"aborts\" is not an object")?;
        for (k, x) in m {
            let n = x
                .as_u64()
                .ok_or_else(|| format!("abort count {k:?} is not an integer"))?;
            aborts.insert(intern_reason(k)?, n);
        }
    }
    Ok(TxnStats {
        committed: g("committed")?,
        aborted: g("aborted")?,
        aborts,
        read_only_committed: g("read_only_committed")?,
        committed_incomplete: g("committed_incomplete")?,
        phase_ns: arr("phase_ns")?,
        phase_count: arr("phase_count")?,
        log_appended: g("log_appended")?,
        log_truncated: g("log_truncated")?,
        log_records_held: g("log_records_held")?,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field of the serialized stats comes back: a field added to `RpcStats` or
    /// `TxnStats` without being added here fails this test.
    #[test]
    fn stats_round_trip_through_json() {
        let mut v = serde_json::to_value(RpcStats::default()).unwrap();
        for (i, (_, x)) in v.as_object_mut().unwrap().iter_mut().enumerate() {
            *x = (i as u64 + 1).into();
        }
        let back = serde_json::to_value(rpc_stats_from_json(&v).unwrap()).unwrap();
        assert_eq!(back, v);

        let mut t = TxnStats::default();
        for (i, r) in ABORT_REASONS.iter().enumerate() {
            t.aborts.insert(r.name(), i as u64 + 1);
        }
        let mut v = serde_json::to_value(&t).unwrap();
        for (i, (k, x)) in v.as_object_mut().unwrap().iter_mut().enumerate() {
            match k.as_str() {
                "aborts" => {}
                "phase_ns" | "phase_count" => {
                    *x = serde_json::json!([i, i + 1, i + 2, i + 3, i + 4, i + 5]);
                }
                _ => *x = (i as u64 + 100).into(),
            }
        }
        let back = serde_json::to_value(txn_stats_from_json(&v).unwrap()).unwrap();
        assert_eq!(back, v);
        // Malformed input is an error, not a panic.
        assert!(txn_stats_from_json(&serde_json::json!({"phase_ns": [1]})).is_err());
        assert!(rpc_stats_from_json(&serde_json::json!({"retransmits": -1})).is_err());
        assert!(rpc_stats_from_json(&serde_json::json!([])).is_err());
    }

    #[test]
    fn implausible_node_reports_are_errors_not_panics() {
        let cfg = BenchConfig {
            workload: WorkloadKind::SmallBank,
            scale: Some(0.001),
            ..Default::default()
        };
        let good = |node| NodeReport {
            node,
            per_type: vec![TypeReport::default(); 6],
            txn_layer: serde_json::to_value(TxnStats::default()).unwrap(),
            rpc: serde_json::to_value(RpcStats::default()).unwrap(),
            ..Default::default()
        };
        let mut bad = good(1);
        bad.per_type[0].committed = u64::MAX;
        let e = combine_node_reports(&cfg, "udp", 1.0, vec![good(0), bad, good(2)]);
        assert!(e.unwrap_err().contains("node 1"));
        let mut bad = good(2);
        bad.rpc["retransmits"] = serde_json::json!(u64::MAX);
        assert!(combine_node_reports(&cfg, "udp", 1.0, vec![good(0), good(1), bad]).is_err());
        let mut bad = good(0);
        bad.latency_ns = vec![[u64::MAX, 1]];
        assert!(combine_node_reports(&cfg, "udp", 1.0, vec![bad, good(1), good(2)]).is_err());
        // A missing node, or one twice.
        assert!(combine_node_reports(&cfg, "udp", 1.0, vec![good(0), good(1)]).is_err());
        assert!(combine_node_reports(&cfg, "udp", 1.0, vec![good(0), good(1), good(1)]).is_err());
    }

    #[test]
    fn replica_comparison_finds_a_diverging_backup() {
        let p = Placement::new(3, 2).unwrap();
        let d = |node: u16, table: u32, primary: u16, rows: u64, sum: u64| NodeReport {
            node,
            replica_digests: vec![ReplicaDigest {
                table,
                primary,
                rows,
                sum,
            }],
            ..Default::default()
        };
        // Node 0's rows are backed up on node 1.
        let ok = [d(0, 1, 0, 5, 77), d(1, 1, 0, 5, 77), d(2, 9, 2, 0, 0)];
        assert_eq!(compare_replicas(&ok, p), Ok(5));
        let bad = [d(0, 1, 0, 5, 77), d(1, 1, 0, 5, 78), d(2, 9, 2, 0, 0)];
        assert!(compare_replicas(&bad, p)
            .unwrap_err()
            .contains("backup node 1"));
        let stray = [d(0, 1, 0, 5, 77), d(1, 1, 0, 5, 77), d(2, 1, 0, 1, 1)];
        assert!(compare_replicas(&stray, p).unwrap_err().contains("node 2"));
    }
}
