//! The benchmark driver: builds an in-process cluster (local fabric, or shm with every node
//! opened in this process), loads a workload in parallel, runs it with a warmup, checks
//! its invariants and produces the report.
//!
//! Warmup: workers start together and run for `warmup_s`; a timer thread then flips the
//! run into the measured phase (sampling process CPU time and the clock), and after
//! `duration_s` into the stop phase. A transaction counts (throughput, latency, aborts,
//! per-type counts) iff it *finishes* in the measured phase, so CPU time and elapsed time
//! cover exactly the counted window. The transaction layer's own `TxnStats` (phase means)
//! cover the whole run, warmup included.

use crate::common::{worker_seed, Loader, Outcome, Workload};
use crate::{objstore, smallbank, tatp, tpcc};
use ambidex_rpc::RuntimeConfig;
use ambidex_transport::local::LocalFabric;
use ambidex_transport::{cputime, ClusterConfig, CounterSnapshot, SharedNode};
use ambidex_txn::runner::{self, RunSpec, Worker, WorkerCtx};
use ambidex_txn::{NodeDb, Placement, TxnConfig, TxnStats};
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use serde::Serialize;
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
            coroutines: 8,
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
#[derive(Clone, Debug, Default, Serialize)]
pub struct TypeReport {
    pub committed: u64,
    pub aborted: u64,
    /// Committed transactions that found their row(s) (TATP; others: all committed).
    pub found: u64,
    pub not_found: u64,
    /// found / committed.
    pub found_rate: f64,
    /// The rate WORKLOADS.md expects (TATP only).
    #[serde(skip_serializing_if = "Option::is_none")]
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
    let placement = Placement::new(cfg.nodes, cfg.replication)?;
    if cfg.threads == 0 || counts.contains(&0) {
        return Err("threads and coroutines must be at least 1".into());
    }
    let scale = cfg.scale();
    if scale.is_nan() || scale <= 0.0 {
        return Err(format!("scale must be positive, not {scale}"));
    }
    match cfg.workload {
        WorkloadKind::ObjectStore => {
            let wl = objstore::ObjectStore::new(placement, cfg.threads, scale, cfg.objstore)?;
            run_all(Arc::new(wl), placement, cfg, counts, out)
        }
        WorkloadKind::Tatp => run_all(
            Arc::new(tatp::Tatp::new(placement, scale)),
            placement,
            cfg,
            counts,
            out,
        ),
        WorkloadKind::SmallBank => run_all(
            Arc::new(smallbank::SmallBank::new(placement, cfg.threads, scale)),
            placement,
            cfg,
            counts,
            out,
        ),
        WorkloadKind::Tpcc | WorkloadKind::TpccNo => {
            let p = tpcc::TpccParams::new(
                placement,
                cfg.threads,
                scale,
                cfg.workload == WorkloadKind::TpccNo,
                cfg.warmup_s + cfg.duration_s,
            );
            run_all(Arc::new(tpcc::Tpcc::new(p)), placement, cfg, counts, out)
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

fn load_parallel<W: Workload>(
    wl: &W,
    dbs: &[Arc<NodeDb>],
    seed: u64,
    progress: bool,
) -> Result<(), String> {
    let units = wl.load_units();
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
                let mine = (0..dbs.len()).map(|n| n % threads == t).collect();
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
struct Tally {
    per_type: Vec<TypeReport>,
    aborts: BTreeMap<String, u64>,
    hist: Histogram<u64>,
}

impl Tally {
    fn new(types: usize) -> Tally {
        Tally {
            per_type: vec![TypeReport::default(); types],
            aborts: BTreeMap::new(),
            // 1 ns .. 100 s at 2 significant digits (1% resolution): a count array small
            // enough to stay in cache (3 digits cost ~2% of TATP's CPU time).
            hist: Histogram::new_with_bounds(1, 100_000_000_000, 2).expect("histogram bounds"),
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

const WARMUP: u8 = 0;
const MEASURE: u8 = 1;
const STOP: u8 = 2;

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
    let worker: Worker = {
        let (wl, total, phase) = (wl.clone(), total.clone(), phase.clone());
        Arc::new(move |w: WorkerCtx| {
            let (wl, total, phase) = (wl.clone(), total.clone(), phase.clone());
            Box::pin(async move {
                let mut rng =
                    SmallRng::seed_from_u64(worker_seed(seed, w.node, w.thread, w.coroutine));
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
    };
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
    let check = wl.check(dbs);
    let (check_json, ok) = match check {
        Ok(v) => (v, true),
        Err(e) => (serde_json::json!({ "violation": e }), false),
    };
    let (invariant_ok, consistency_ok) = match cfg.workload {
        WorkloadKind::SmallBank => (Some(ok), None),
        WorkloadKind::Tpcc | WorkloadKind::TpccNo => (None, Some(ok)),
        _ => (if check_json.is_null() { None } else { Some(ok) }, None),
    };
    Ok(BenchReport {
        workload: cfg.workload.name().to_string(),
        transport: match cfg.transport {
            TransportKind::Local => "local".into(),
            TransportKind::Shm => "shm".into(),
        },
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
            let attempts = committed + aborted - user;
            if attempts == 0 {
                0.0
            } else {
                (aborted - user) as f64 / attempts as f64
            }
        },
        aborts_by_reason: tally.aborts,
        latency_us,
        per_type,
        phase_means_us: res
            .txn
            .phase_means_us()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        txn_layer: res.txn,
        rpc: res.rpc,
        transport_counters: res.transport,
        max_rss_bytes: cputime::max_rss_bytes(),
        stuck_workers: res.stuck_workers,
        invariant_ok,
        consistency_ok,
        check: check_json,
    })
}
