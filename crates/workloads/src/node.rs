//! One node of a cluster whose nodes run in separate processes (`ambidex node`,
//! docs/cluster.md): load this node's share of the workload, run its threads' workers
//! through the phases the launcher calls (warmup, measure, stop), keep serving the other
//! nodes until the launcher says every node's workers have finished, then check this
//! node's data and report.
//!
//! The in-process runner (`ambidex_txn::runner`) keeps its runtimes serving until every
//! worker of the whole cluster has returned, with a counter shared by all nodes; across
//! processes that counter is the launcher's: a node says when its own workers are done
//! ([`RunningNode::workers_done`]) and serves on until [`RunningNode::finish`].

use crate::common::Workload;
use crate::driver::{
    build_and_load_node, dispatch, make_worker, replica_digests, BenchConfig, NodeReport,
    ReplicaDigest, Tally, WorkloadVisitor, MEASURE, STOP, WARMUP,
};
use ambidex_rpc::{RpcStats, Runtime, RuntimeConfig};
use ambidex_transport::fault::{FaultConfig, FaultyEndpoint};
use ambidex_transport::{cputime, CounterSnapshot, NodeId, SharedNode};
use ambidex_txn::runner::{finish_thread, ThreadResult, Worker, WorkerCtx};
use ambidex_txn::{NodeDb, Placement, TxnConfig, TxnStats, TxnThread};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

/// How a node process runs its threads.
#[derive(Clone, Debug, Default)]
pub struct NodeOptions {
    pub rpc: RuntimeConfig,
    pub txn: TxnConfig,
    /// Wraps every endpoint of this node in the transport's fault injector.
    pub fault: Option<FaultConfig>,
    /// Records this node's transactions to this JSON-lines file.
    pub history: Option<PathBuf>,
}

type MakeWorker = Box<dyn Fn(Arc<Mutex<Tally>>, Arc<AtomicU8>) -> Worker + Send>;
type Check =
    Box<dyn Fn(&Arc<NodeDb>) -> (Result<serde_json::Value, String>, Vec<ReplicaDigest>) + Send>;

/// A node whose database is loaded, ready to start.
pub struct LoadedNode {
    node: NodeId,
    coroutines: usize,
    threads: u16,
    types: usize,
    db: Arc<NodeDb>,
    pub load_seconds: f64,
    make_worker: MakeWorker,
    check: Check,
}

/// Builds node `node`'s database and loads its share of the workload `cfg` describes
/// (`cfg.progress`: a progress bar on stderr).
pub fn load_node(cfg: &BenchConfig, node: NodeId) -> Result<LoadedNode, String> {
    struct Load<'a> {
        cfg: &'a BenchConfig,
        node: NodeId,
    }
    impl WorkloadVisitor<LoadedNode> for Load<'_> {
        fn visit<W: Workload>(
            self,
            wl: Arc<W>,
            placement: Placement,
        ) -> Result<LoadedNode, String> {
            let cfg = self.cfg;
            let t0 = Instant::now();
            let db = build_and_load_node(&*wl, placement, self.node, cfg.seed, cfg.progress)?;
            let load_seconds = t0.elapsed().as_secs_f64();
            let seed = cfg.seed;
            let (w1, w2) = (wl.clone(), wl.clone());
            Ok(LoadedNode {
                node: self.node,
                coroutines: cfg.coroutines,
                threads: cfg.threads,
                types: wl.txn_types().len(),
                db,
                load_seconds,
                make_worker: Box::new(move |total, phase| {
                    make_worker(w1.clone(), total, phase, seed)
                }),
                check: Box::new(move |db| (w2.check_node(db), replica_digests(&*w2, db))),
            })
        }
    }
    if cfg.coroutines == 0 {
        return Err("coroutines must be at least 1".into());
    }
    dispatch(cfg, Load { cfg, node })
}

/// A node whose threads are running (from `start` until `finish`).
pub struct RunningNode {
    node: NodeId,
    db: Arc<NodeDb>,
    load_seconds: f64,
    check: Check,
    phase: Arc<AtomicU8>,
    /// Workers of this node still running.
    live: Arc<AtomicUsize>,
    /// Set by `finish`: every node's workers are done; stop serving.
    drain: Arc<AtomicBool>,
    /// The workers' own stop flag (set by `abort`).
    stop: Arc<AtomicBool>,
    error: Arc<Mutex<Option<String>>>,
    handles: Vec<JoinHandle<()>>,
    results: Arc<Mutex<Vec<ThreadResult>>>,
    total: Arc<Mutex<Tally>>,
    types: usize,
    recorder: Option<ambidex_history::Recorder>,
    measure_start: Option<(f64, Instant)>,
    /// (CPU seconds, wall seconds) of the measured window.
    measured: (f64, f64),
}

impl LoadedNode {
    /// Starts every thread of this node on `transport` (this node's), workers in the
    /// warmup phase: nothing is counted until [`RunningNode::measure`].
    pub fn start(self, transport: SharedNode, opts: NodeOptions) -> Result<RunningNode, String> {
        if transport.node() != self.node {
            return Err(format!(
                "the transport is node {}'s, not node {}'s",
                transport.node(),
                self.node
            ));
        }
        if transport.config().threads_per_node != self.threads {
            return Err(format!(
                "the transport has {} threads per node, the run {}",
                transport.config().threads_per_node,
                self.threads
            ));
        }
        let recorder = match &opts.history {
            Some(path) => Some(
                ambidex_history::Recorder::create(path)
                    .map_err(|e| format!("cannot create history file {}: {e}", path.display()))?,
            ),
            None => None,
        };
        let total = Arc::new(Mutex::new(Tally::new(self.types)));
        let phase = Arc::new(AtomicU8::new(WARMUP));
        let worker = (self.make_worker)(total.clone(), phase.clone());
        let live = Arc::new(AtomicUsize::new(self.threads as usize * self.coroutines));
        let drain = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let error: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
        let results = Arc::new(Mutex::new(Vec::new()));
        let mut handles = Vec::new();
        for t in 0..self.threads {
            let (transport, db, worker, opts) = (
                transport.clone(),
                self.db.clone(),
                worker.clone(),
                opts.clone(),
            );
            let (t_live, drain, stop, t_error, results, recorder) = (
                live.clone(),
                drain.clone(),
                stop.clone(),
                error.clone(),
                results.clone(),
                recorder.clone(),
            );
            let (node, coroutines) = (self.node, self.coroutines);
            let spawned = std::thread::Builder::new()
                .name(format!("node{node}-t{t}"))
                .spawn(move || {
                    let setup = || -> Result<(Runtime, Rc<TxnThread>), String> {
                        let ep = transport
                            .endpoint(t)
                            .map_err(|e| format!("endpoint {node}.{t}: {e}"))?;
                        let ep = match &opts.fault {
                            Some(f) => FaultyEndpoint::wrap(ep, f.clone())
                                .map_err(|e| format!("fault injector: {e}"))?,
                            None => ep,
                        };
                        let mut rt = Runtime::new(ep, opts.rpc.clone())
                            .map_err(|e| format!("RPC runtime of thread {t}: {e}"))?;
                        let th = TxnThread::install(&mut rt, db, opts.txn.clone());
                        Ok((rt, th))
                    };
                    let (mut rt, th) = match setup() {
                        Ok(x) => x,
                        Err(e) => {
                            t_error.lock().unwrap().get_or_insert(e);
                            t_live.fetch_sub(coroutines, Ordering::SeqCst);
                            return;
                        }
                    };
                    if let Some(rec) = &recorder {
                        th.set_history(Box::new(ambidex_txn::history::RecorderSink(rec.thread())));
                    }
                    for c in 0..coroutines {
                        let (th, worker, live, stop) =
                            (th.clone(), worker.clone(), t_live.clone(), stop.clone());
                        rt.spawn(move |ctx| async move {
                            let w = WorkerCtx {
                                ctx,
                                th,
                                node,
                                thread: t,
                                coroutine: c,
                                stop,
                            };
                            worker(w).await;
                            live.fetch_sub(1, Ordering::SeqCst);
                        });
                    }
                    // Serve until the launcher says every node's workers are done.
                    rt.run_until(|_| drain.load(Ordering::SeqCst));
                    results.lock().unwrap().push(finish_thread(&mut rt, &th));
                });
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    error
                        .lock()
                        .unwrap()
                        .get_or_insert(format!("cannot start thread {t}: {e}"));
                    live.fetch_sub(self.coroutines, Ordering::SeqCst);
                }
            }
        }
        Ok(RunningNode {
            node: self.node,
            db: self.db,
            load_seconds: self.load_seconds,
            check: self.check,
            phase,
            live,
            drain,
            stop,
            error,
            handles,
            results,
            total,
            types: self.types,
            recorder,
            measure_start: None,
            measured: (0.0, 0.0),
        })
    }
}

impl RunningNode {
    /// Starts the measured window: transactions finishing from now on are counted.
    pub fn measure(&mut self) {
        self.measure_start = Some((cputime::process_cpu_seconds(), Instant::now()));
        self.phase.store(MEASURE, Ordering::SeqCst);
    }

    /// Ends the measured window; every worker finishes its transaction and returns.
    pub fn stop(&mut self) {
        self.phase.store(STOP, Ordering::SeqCst);
        if let Some((c0, t0)) = self.measure_start.take() {
            self.measured = (
                cputime::process_cpu_seconds() - c0,
                t0.elapsed().as_secs_f64(),
            );
        }
    }

    /// True once every worker of this node has returned (the node still serves
    /// requests); an error if a thread of this node failed.
    pub fn workers_done(&self) -> Result<bool, String> {
        if let Some(e) = self.error.lock().unwrap().clone() {
            return Err(e);
        }
        Ok(self.live.load(Ordering::SeqCst) == 0)
    }

    /// Every node's workers are done: stops serving, checks this node's data and
    /// returns its report.
    pub fn finish(mut self) -> Result<NodeReport, String> {
        self.phase.store(STOP, Ordering::SeqCst);
        self.drain.store(true, Ordering::SeqCst);
        for h in std::mem::take(&mut self.handles) {
            h.join().map_err(|_| "a node thread panicked".to_string())?;
        }
        if let Some(e) = self.error.lock().unwrap().clone() {
            return Err(e);
        }
        if let Some(rec) = &self.recorder {
            rec.flush()
                .map_err(|e| format!("writing the history: {e}"))?;
        }
        let (mut txn, mut rpc) = (TxnStats::default(), RpcStats::default());
        let mut counters = CounterSnapshot::default();
        let mut stuck = 0;
        for (t, r, c, s) in self.results.lock().unwrap().iter() {
            txn.merge(t);
            rpc.merge(r);
            counters.merge(c);
            stuck += s;
        }
        let tally = std::mem::replace(&mut *self.total.lock().unwrap(), Tally::new(self.types));
        let (check, digests) = (self.check)(&self.db);
        let mut r = NodeReport::new(
            self.node, tally, &txn, &rpc, counters, stuck, check, digests,
        );
        r.load_seconds = self.load_seconds;
        r.cpu_seconds = self.measured.0;
        r.measured_s = self.measured.1;
        r.max_rss_bytes = cputime::max_rss_bytes();
        Ok(r)
    }

    /// Stops the workers and the threads without a report (the run failed elsewhere).
    pub fn abort(self) {
        self.stop.store(true, Ordering::SeqCst);
        self.phase.store(STOP, Ordering::SeqCst);
        self.drain.store(true, Ordering::SeqCst);
    }
}
