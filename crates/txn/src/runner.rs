//! Runs a cluster whose nodes are all in this process (any transport: `local`, or `shm`
//! with every node attached here): one runtime per (node, thread), a transaction thread
//! state on each, and `coroutines` workers per thread.
//!
//! Runtimes keep serving requests until every worker of the whole cluster has finished,
//! so no node stops answering while another still needs it.

use crate::{HistorySink, NodeDb, TxnConfig, TxnStats, TxnThread};
use ambidex_rpc::{Ctx, RpcStats, Runtime, RuntimeConfig};
use ambidex_transport::{cputime, CounterSnapshot, NodeId, SharedNode, ThreadId};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a worker coroutine gets.
pub struct WorkerCtx {
    pub ctx: Ctx,
    pub th: Rc<TxnThread>,
    pub node: NodeId,
    pub thread: ThreadId,
    pub coroutine: usize,
    /// Set when the run's duration is over; workers finish their transaction and return.
    pub stop: Arc<AtomicBool>,
}

/// Makes the future of one worker coroutine (called on the worker's own thread).
pub type Worker = Arc<dyn Fn(WorkerCtx) -> Pin<Box<dyn Future<Output = ()>>> + Send + Sync>;

/// Makes the history sink of one (node, thread), if histories are recorded.
pub type SinkFactory = Arc<dyn Fn(NodeId, ThreadId) -> Box<dyn HistorySink> + Send + Sync>;

#[derive(Clone)]
pub struct RunSpec {
    pub coroutines: usize,
    pub rpc: RuntimeConfig,
    pub txn: TxnConfig,
    /// Stop the workers after this long (`None`: they finish on their own).
    pub duration: Option<Duration>,
    pub history: Option<SinkFactory>,
}

impl Default for RunSpec {
    fn default() -> Self {
        RunSpec {
            coroutines: 4,
            rpc: RuntimeConfig::default(),
            txn: TxnConfig::default(),
            duration: None,
            history: None,
        }
    }
}

/// What a run produced.
#[derive(Default)]
pub struct RunResult {
    pub txn: TxnStats,
    pub rpc: RpcStats,
    pub transport: CounterSnapshot,
    pub elapsed: Duration,
    pub cpu_seconds: f64,
    /// Log records still held per (node, thread) when the run ended.
    pub log_records_held: Vec<u64>,
    /// Workers that did not finish (stuck); a correct run has none.
    pub stuck_workers: usize,
}

/// Runs `worker` on every thread of every node until all workers return (or the
/// duration passes and they notice `stop`). `nodes[i]` and `dbs[i]` are node i.
pub fn run(
    nodes: &[SharedNode],
    dbs: &[Arc<NodeDb>],
    spec: &RunSpec,
    worker: Worker,
) -> Result<RunResult, String> {
    if nodes.len() != dbs.len() || nodes.is_empty() {
        return Err("one database per node is needed".into());
    }
    let threads = nodes[0].config().threads_per_node;
    let live = Arc::new(AtomicUsize::new(
        nodes.len() * threads as usize * spec.coroutines,
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let results = Arc::new(Mutex::new(Vec::new()));
    let cpu0 = cputime::process_cpu_seconds();
    let start = Instant::now();
    let mut handles = Vec::new();
    for (n, node) in nodes.iter().enumerate() {
        for t in 0..threads {
            let (node, db) = (node.clone(), dbs[n].clone());
            let (spec, worker, live, stop, results) = (
                spec.clone(),
                worker.clone(),
                live.clone(),
                stop.clone(),
                results.clone(),
            );
            handles.push(std::thread::spawn(move || -> Result<(), String> {
                let ep = node.endpoint(t).map_err(|e| e.to_string())?;
                let mut rt = Runtime::new(ep, spec.rpc.clone()).map_err(|e| format!("{e:?}"))?;
                let th = TxnThread::install(&mut rt, db, spec.txn.clone());
                if let Some(f) = &spec.history {
                    th.set_history(f(n as NodeId, t));
                }
                for c in 0..spec.coroutines {
                    let (th, worker, live, stop) =
                        (th.clone(), worker.clone(), live.clone(), stop.clone());
                    rt.spawn(move |ctx| async move {
                        let w = WorkerCtx {
                            ctx,
                            th,
                            node: n as NodeId,
                            thread: t,
                            coroutine: c,
                            stop,
                        };
                        worker(w).await;
                        live.fetch_sub(1, Ordering::SeqCst);
                    });
                }
                rt.run_until(|_| live.load(Ordering::SeqCst) == 0);
                results.lock().unwrap().push(finish_thread(&mut rt, &th));
                Ok(())
            }));
        }
    }
    if let Some(d) = spec.duration {
        while start.elapsed() < d && live.load(Ordering::SeqCst) > 0 {
            std::thread::sleep(Duration::from_millis(5).min(d));
        }
        stop.store(true, Ordering::SeqCst);
    }
    let mut errors = Vec::new();
    for h in handles {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errors.push(e),
            Err(_) => errors.push("a node thread panicked".to_string()),
        }
    }
    if !errors.is_empty() {
        return Err(errors.join("; "));
    }
    let mut r = RunResult {
        elapsed: start.elapsed(),
        cpu_seconds: cputime::process_cpu_seconds() - cpu0,
        ..Default::default()
    };
    for (txn, rpc, tr, stuck) in results.lock().unwrap().iter() {
        r.txn.merge(txn);
        r.rpc.merge(rpc);
        r.transport.merge(tr);
        r.log_records_held.push(txn.log_records_held);
        r.stuck_workers += stuck;
    }
    Ok(r)
}

/// What a node thread reports when it ends: its transaction and RPC counters, its
/// transport counters, and how many of its coroutines had not finished.
pub type ThreadResult = (TxnStats, RpcStats, CounterSnapshot, usize);

/// The end of a node thread whose workers are done: serves 20 ms more so that the last
/// responses and retransmissions land, flushes its history, and reports.
pub fn finish_thread(rt: &mut Runtime, th: &TxnThread) -> ThreadResult {
    let until = Instant::now() + Duration::from_millis(20);
    rt.run_until(|_| Instant::now() >= until);
    let stuck = rt.live_tasks();
    if let Some(mut h) = th.take_history() {
        h.flush();
    }
    (th.stats(), rt.stats(), rt.endpoint_counters(), stuck)
}
