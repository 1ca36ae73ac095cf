//! `ambidex bench rpc`: symmetric all-to-all RPCs, compared with the raw datagram rate
//! of the same transport measured in the same run.
//!
//! Both phases run on the same endpoints (taken once per thread): a raw ping-pong phase
//! straight on the endpoints, then, after every queue is drained, an RPC phase with the
//! endpoints handed to fresh runtimes (and taken back after). The pair repeats `rounds`
//! times, so a change of load on a shared machine hits both rates alike. Each phase runs
//! `duration_s`; work is divided by the CPU time of the whole process (all nodes are
//! threads of it) over the phases of its kind.
//!
//! Traffic: every thread keeps `coroutines` workers busy; a worker queues `batch` echo
//! requests of `size` bytes and flushes them. Unless `coalesce`, request j of a batch
//! goes to a different node (cycling over the other nodes; with fewer nodes than `batch`
//! the repeats to a node are coalesced by the runtime, as FaSST would); with `coalesce`
//! the whole batch goes to one node. `no_coalescing` turns the runtime's coalescing off
//! (one datagram per request). The raw phase keeps the same number of datagrams
//! outstanding (`coroutines * batch` per thread), sends them in doorbells of `batch` to
//! the same destinations and echoes every ping, batching the echoes of one poll.
//! Both phases idle alike: `RuntimeConfig::spin_polls` empty polls, `yield_polls` polls
//! after a yield, then a park in `Endpoint::wait` of at most `RuntimeConfig::max_wait`.

use crate::{IdleStep, RpcError, RpcStats, Runtime, RuntimeConfig};
use ambidex_transport::cputime::process_cpu_seconds;
use ambidex_transport::{
    CounterSnapshot, Datagram, Endpoint, EndpointAddr, NodeId, NodeTransport, ThreadId,
    TransportError,
};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

const ECHO: u8 = 1;

/// Why [`run_bench`] could not run or finish the benchmark.
#[derive(Debug, thiserror::Error)]
pub enum RpcBenchError {
    /// The configuration's node count is zero or differs from the transports given.
    #[error("config says {configured} nodes, {given} given")]
    NodeCount {
        /// `RpcBenchConfig::nodes`.
        configured: u16,
        /// Node transports passed in.
        given: usize,
    },
    /// `RpcBenchConfig::threads` is zero or more than the cluster's threads per node.
    #[error("threads must be 1..={max} (got {threads})")]
    Threads {
        /// Threads asked for.
        threads: u16,
        /// The cluster's threads per node.
        max: u16,
    },
    /// Coroutines, batch or duration is zero (or negative).
    #[error("coroutines, batch and duration must be positive")]
    NotPositive,
    /// The node transport at position `index` is node `node`.
    #[error("node {index} is given out of order (it is node {node})")]
    OutOfOrder {
        /// Position in the list given.
        index: usize,
        /// The node id of the transport at that position.
        node: NodeId,
    },
    /// The transport refused an endpoint.
    #[error("endpoint {thread} of node {node}: {source}")]
    Endpoint {
        /// Node of the endpoint.
        node: NodeId,
        /// Thread of the endpoint.
        thread: ThreadId,
        /// The transport's error.
        #[source]
        source: TransportError,
    },
    /// The latency histogram could not be created.
    #[error("latency histogram: {0}")]
    Histogram(#[from] hdrhistogram::CreationError),
    /// A thread could not start an RPC runtime on its endpoint.
    #[error("runtime on endpoint {addr}: {source}")]
    Runtime {
        /// The endpoint.
        addr: EndpointAddr,
        /// The runtime's error.
        #[source]
        source: RpcError,
    },
    /// A worker still held the runtime when the RPC phase ended, so the endpoint could
    /// not be taken back.
    #[error("a worker outlived its runtime")]
    WorkerOutlivedRuntime,
    /// A benchmark thread panicked.
    #[error("bench thread panicked")]
    ThreadPanicked,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct RpcBenchConfig {
    pub nodes: u16,
    /// Threads (runtimes) per node.
    pub threads: u16,
    /// Worker coroutines per thread.
    pub coroutines: u16,
    /// Requests per flush.
    pub batch: u16,
    /// Request and response payload bytes.
    pub size: usize,
    /// Send a whole batch to one node (else one node per request).
    pub coalesce: bool,
    /// Disable the runtime's coalescing (every request its own datagram).
    pub no_coalescing: bool,
    /// `RuntimeConfig::spin_polls` / `yield_polls` of both phases (None: the defaults).
    pub spin_polls: Option<u32>,
    pub yield_polls: Option<u32>,
    /// `RuntimeConfig::busy_wait` in microseconds (None: automatic).
    pub busy_wait_us: Option<u64>,
    /// Seconds of each phase (raw, then RPC), per round.
    pub duration_s: f64,
    /// Rounds of (raw, RPC) phases, alternated so that load drifting on a shared machine
    /// affects both rates alike; the figures sum over rounds.
    pub rounds: u16,
}

impl Default for RpcBenchConfig {
    fn default() -> Self {
        RpcBenchConfig {
            nodes: 2,
            threads: 1,
            coroutines: 20,
            batch: 4,
            size: 32,
            coalesce: false,
            no_coalescing: false,
            spin_polls: None,
            yield_polls: None,
            busy_wait_us: None,
            duration_s: 1.0,
            rounds: 2,
        }
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct RpcBenchReport {
    pub config: RpcBenchConfig,
    pub rpcs: u64,
    pub elapsed_s: f64,
    pub rpcs_per_s: f64,
    pub cpu_seconds: f64,
    pub rpcs_per_cpu_s: f64,
    /// Latency of a whole batch (flush to last response), per RPC, in microseconds.
    pub latency_us: Latency,
    pub retransmits: u64,
    pub rpc_drops: u64,
    pub credits_per_dest: u32,
    pub datagrams_per_rpc: f64,
    pub rpc_stats: RpcStats,
    /// Transport drop and error counters over both phases.
    pub transport_drops: CounterSnapshot,
    pub raw_datagrams: u64,
    pub raw_cpu_seconds: f64,
    pub raw_datagrams_per_s: f64,
    pub raw_datagrams_per_cpu_s: f64,
    /// `rpcs_per_cpu_s / raw_datagrams_per_cpu_s` (an uncoalesced RPC is two datagrams).
    pub rpc_to_raw_ratio: f64,
}

/// Where a thread's batches go: request `j` of batch `k` from node `me` goes to the
/// `(k + j)`-th other node after `me` (the `k`-th with `coalesce`), cyclically. A table
/// and a wrapping cursor, with a division only when a batch wraps around the other
/// nodes: two divisions per request cost a sizeable share of a raw datagram, and both
/// phases would carry them.
struct Targets {
    others: Vec<u16>,
    /// Index in `others` of batch `k`'s first destination.
    start: usize,
    coalesce: bool,
}

impl Targets {
    fn new(cfg: &RpcBenchConfig, me: u16, first_batch: u64) -> Targets {
        let n = cfg.nodes.max(1);
        let others: Vec<u16> = if n == 1 {
            vec![0]
        } else {
            (1..n)
                .map(|i| ((me as u32 + i as u32) % n as u32) as u16)
                .collect()
        };
        let start = (first_batch % others.len() as u64) as usize;
        Targets {
            others,
            start,
            coalesce: cfg.coalesce,
        }
    }

    /// Destination of request `j` of the current batch.
    #[inline]
    fn dest(&self, j: usize) -> u16 {
        let m = self.others.len();
        if m == 1 {
            return self.others[0];
        }
        let mut i = if self.coalesce {
            self.start
        } else {
            self.start + j
        };
        if i >= m {
            i %= m;
        }
        self.others[i]
    }

    /// Moves on to the next batch.
    #[inline]
    fn next_batch(&mut self) {
        self.start += 1;
        if self.start == self.others.len() {
            self.start = 0;
        }
    }
}

struct PhaseSync {
    start: Barrier,
    stopped: Barrier,
    drained: Barrier,
    stop: AtomicBool,
    /// RPC phase: threads whose workers have all returned.
    finished: AtomicUsize,
}

/// The main thread's part of one phase: start it, let it run `dur`, stop it. Returns
/// the process CPU seconds and wall seconds it took.
fn timed_phase(p: &PhaseSync, dur: Duration) -> (f64, f64) {
    p.start.wait();
    let (c0, t0) = (process_cpu_seconds(), Instant::now());
    std::thread::sleep(dur);
    p.stop.store(true, Ordering::SeqCst);
    let r = (process_cpu_seconds() - c0, t0.elapsed().as_secs_f64());
    p.stopped.wait();
    r
}

/// A thread with no endpoint left still takes part in a phase's barriers.
fn skip_phase(p: &PhaseSync) {
    p.start.wait();
    p.finished.fetch_add(1, Ordering::SeqCst);
    p.stopped.wait();
    p.drained.wait();
}

/// Drops whatever is still queued for `ep` until it stays quiet (between phases).
fn drain(ep: &mut dyn Endpoint) {
    let mut quiet = 0;
    while quiet < 3 {
        if ep.poll_recv(256, &mut |_, _| {}) == 0 {
            quiet += 1;
            ep.wait(Duration::from_millis(2));
        } else {
            quiet = 0;
        }
    }
}

type PhaseResult = (Box<dyn Endpoint>, u64, RpcStats, CounterSnapshot, u32);

/// One thread's RPC phase on `ep`: a fresh runtime and workers, run until every thread's
/// workers have stopped, then the endpoint back (drained) for the next phase.
fn rpc_phase(
    ep: Box<dyn Endpoint>,
    cfg: &RpcBenchConfig,
    rt_cfg: &RuntimeConfig,
    p: &Arc<PhaseSync>,
    hist: &Mutex<Histogram<u64>>,
    total: usize,
) -> Result<PhaseResult, RpcBenchError> {
    let addr = ep.addr();
    let mut rt = match Runtime::new(ep, rt_cfg.clone()) {
        Ok(rt) => rt,
        Err(source) => {
            skip_phase(p);
            return Err(RpcBenchError::Runtime { addr, source });
        }
    };
    let (rpcs, local_hist) = setup_workers(&mut rt, cfg, p);
    p.start.wait();
    let mut reported = false;
    rt.run_until(|rt| {
        if !reported && rt.live_tasks() == 0 {
            reported = true;
            p.finished.fetch_add(1, Ordering::SeqCst);
        }
        reported && p.finished.load(Ordering::SeqCst) == total
    });
    p.stopped.wait();
    let _ = hist.lock().unwrap().add(&*local_hist.borrow());
    let (stats, counters, credits) = (rt.stats(), rt.endpoint_counters(), rt.credits_per_dest());
    let mut ep = match rt.into_endpoint() {
        Ok(ep) => ep,
        Err(_) => {
            p.drained.wait();
            return Err(RpcBenchError::WorkerOutlivedRuntime);
        }
    };
    drain(&mut *ep);
    p.drained.wait();
    Ok((ep, rpcs.get(), stats, counters, credits))
}

/// Runs the raw phase then the RPC phase. `nodes` must be the cluster's node transports
/// in order, with every endpoint `0..threads` still untaken.
pub fn run_bench(
    cfg: &RpcBenchConfig,
    nodes: Vec<Arc<dyn NodeTransport>>,
) -> Result<RpcBenchReport, RpcBenchError> {
    if nodes.len() != cfg.nodes as usize || cfg.nodes == 0 {
        return Err(RpcBenchError::NodeCount {
            configured: cfg.nodes,
            given: nodes.len(),
        });
    }
    let cc = nodes[0].config().clone();
    if cfg.threads == 0 || cfg.threads > cc.threads_per_node {
        return Err(RpcBenchError::Threads {
            threads: cfg.threads,
            max: cc.threads_per_node,
        });
    }
    if cfg.coroutines == 0 || cfg.batch == 0 || cfg.duration_s <= 0.0 {
        return Err(RpcBenchError::NotPositive);
    }
    // Both phases idle the same way: the raw phase uses this config's spin_polls,
    // yield_polls and max_wait too (see `raw_phase`).
    let defaults = RuntimeConfig::default();
    let rt_cfg = RuntimeConfig {
        coalesce: !cfg.no_coalescing,
        spin_polls: cfg.spin_polls.unwrap_or(defaults.spin_polls),
        yield_polls: cfg.yield_polls.unwrap_or(defaults.yield_polls),
        busy_wait: cfg.busy_wait_us.map(Duration::from_micros),
        ..defaults
    };
    let mut eps = Vec::new();
    for (n, node) in nodes.iter().enumerate() {
        if node.node() as usize != n {
            return Err(RpcBenchError::OutOfOrder {
                index: n,
                node: node.node(),
            });
        }
        for t in 0..cfg.threads {
            eps.push(node.endpoint(t).map_err(|source| RpcBenchError::Endpoint {
                node: node.node(),
                thread: t,
                source,
            })?);
        }
    }
    let total = eps.len();
    let dur = Duration::from_secs_f64(cfg.duration_s);
    let sync = |n| {
        Arc::new(PhaseSync {
            start: Barrier::new(n),
            stopped: Barrier::new(n),
            drained: Barrier::new(n),
            stop: AtomicBool::new(false),
            finished: AtomicUsize::new(0),
        })
    };
    let rounds = cfg.rounds.max(1) as usize;
    // One (raw, RPC) pair of phase barriers per round.
    let phases: Arc<Vec<(Arc<PhaseSync>, Arc<PhaseSync>)>> = Arc::new(
        (0..rounds)
            .map(|_| (sync(total + 1), sync(total + 1)))
            .collect(),
    );
    let hist = Arc::new(Mutex::new(Histogram::<u64>::new_with_bounds(
        1,
        60_000_000_000,
        3,
    )?));
    let errors = Arc::new(Mutex::new(Vec::<RpcBenchError>::new()));
    let mut handles = Vec::new();
    for ep in eps {
        let (cfg, rt_cfg, phases, hist, errors) = (
            cfg.clone(),
            rt_cfg.clone(),
            phases.clone(),
            hist.clone(),
            errors.clone(),
        );
        handles.push(std::thread::spawn(
            move || -> (u64, u64, RpcStats, CounterSnapshot, u32) {
                let mut ep = Some(ep);
                let (mut raw_count, mut rpcs) = (0, 0);
                let (mut stats, mut counters, mut credits) =
                    (RpcStats::default(), CounterSnapshot::default(), 0);
                for (raw, rpc) in phases.iter() {
                    let Some(mut e) = ep.take() else {
                        // An earlier round failed: keep the barriers moving.
                        skip_phase(raw);
                        skip_phase(rpc);
                        continue;
                    };
                    raw_count += raw_phase(&mut *e, &cfg, raw, &rt_cfg);
                    match rpc_phase(e, &cfg, &rt_cfg, rpc, &hist, total) {
                        Ok((e, n, st, c, cr)) => {
                            rpcs += n;
                            stats.merge(&st);
                            counters = c; // the endpoint's counters are cumulative
                            credits = cr;
                            ep = Some(e);
                        }
                        Err(e) => errors.lock().unwrap().push(e),
                    }
                }
                (raw_count, rpcs, stats, counters, credits)
            },
        ));
    }
    // Alternate the phases so that a change of load on a shared machine hits both alike.
    let (mut raw_cpu, mut raw_elapsed, mut cpu, mut elapsed) = (0.0, 0.0, 0.0, 0.0);
    for (raw, rpc) in phases.iter() {
        let (c, e) = timed_phase(raw, dur);
        raw_cpu += c;
        raw_elapsed += e;
        raw.drained.wait();
        let (c, e) = timed_phase(rpc, dur);
        cpu += c;
        elapsed += e;
        rpc.drained.wait();
    }

    let mut raw_datagrams = 0;
    let mut rpcs = 0;
    let mut stats = RpcStats::default();
    let mut counters = CounterSnapshot::default();
    let mut credits = 0;
    for h in handles {
        let (r, n, st, c, cr) = h.join().map_err(|_| RpcBenchError::ThreadPanicked)?;
        raw_datagrams += r;
        rpcs += n;
        stats.merge(&st);
        counters.merge(&c);
        credits = cr;
    }
    if let Some(e) = errors.lock().unwrap().drain(..).next() {
        return Err(e);
    }
    let h = hist.lock().unwrap();
    let q = |p: f64| h.value_at_quantile(p) as f64 / 1000.0;
    let rpcs_per_cpu_s = rpcs as f64 / cpu.max(1e-9);
    let raw_per_cpu = raw_datagrams as f64 / raw_cpu.max(1e-9);
    Ok(RpcBenchReport {
        config: cfg.clone(),
        rpcs,
        elapsed_s: elapsed,
        rpcs_per_s: rpcs as f64 / elapsed,
        cpu_seconds: cpu,
        rpcs_per_cpu_s,
        latency_us: Latency {
            p50: q(0.5),
            p99: q(0.99),
            p999: q(0.999),
        },
        retransmits: stats.retransmits,
        rpc_drops: stats.rx_malformed
            + stats.rx_unknown_response
            + stats.rx_duplicate_response
            + stats.stale_requests
            + stats.out_of_window_requests,
        credits_per_dest: credits,
        datagrams_per_rpc: stats.tx_datagrams as f64 / stats.rpcs_completed.max(1) as f64,
        rpc_stats: stats,
        transport_drops: counters.drops_and_errors(),
        raw_datagrams,
        raw_cpu_seconds: raw_cpu,
        raw_datagrams_per_s: raw_datagrams as f64 / raw_elapsed,
        raw_datagrams_per_cpu_s: raw_per_cpu,
        rpc_to_raw_ratio: rpcs_per_cpu_s / raw_per_cpu.max(1e-9),
    })
}

type Shared<T> = Rc<RefCell<T>>;

fn setup_workers(
    rt: &mut Runtime,
    cfg: &RpcBenchConfig,
    sync: &Arc<PhaseSync>,
) -> (Rc<Cell<u64>>, Shared<Histogram<u64>>) {
    rt.register(ECHO, |_, req, resp| resp.extend_from_slice(req));
    let count = Rc::new(Cell::new(0u64));
    let hist = Rc::new(RefCell::new(
        Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds"),
    ));
    for c in 0..cfg.coroutines {
        let (cfg, sync, count, hist) = (cfg.clone(), sync.clone(), count.clone(), hist.clone());
        rt.spawn(move |ctx| async move {
            let mut targets = Targets::new(&cfg, ctx.addr().node, c as u64);
            let payload = vec![0x5a; cfg.size];
            while !sync.stop.load(Ordering::Relaxed) {
                for j in 0..cfg.batch as usize {
                    if ctx.queue(targets.dest(j), ECHO, &payload).is_err() {
                        return;
                    }
                }
                targets.next_batch();
                // The step's clock (read once per master step), not a clock read per
                // batch: two reads per batch of 4 cost more than a tenth of the run.
                let t0 = ctx.step_ns();
                if ctx.flush().await.is_err() {
                    continue;
                }
                let dt = ctx.step_ns().saturating_sub(t0).max(1);
                if !sync.stop.load(Ordering::Relaxed) {
                    count.set(count.get() + cfg.batch as u64);
                    let _ = hist.borrow_mut().record_n(dt, cfg.batch as u64);
                }
            }
        });
    }
    (count, hist)
}

const PING: u8 = 1;
const PONG: u8 = 2;

/// Raw datagram ping-pong on one endpoint; returns datagrams received while measured.
fn raw_phase(
    ep: &mut dyn Endpoint,
    cfg: &RpcBenchConfig,
    sync: &PhaseSync,
    idle_policy: &RuntimeConfig,
) -> u64 {
    let me = ep.addr();
    let window = cfg.coroutines as usize * cfg.batch as usize;
    let mut ping = vec![0u8; cfg.size.max(1)];
    ping[0] = PING;
    let mut pong = ping.clone();
    pong[0] = PONG;
    let mut echo_to: Vec<EndpointAddr> = Vec::with_capacity(64);
    let mut out: Vec<Datagram<'_>> = Vec::with_capacity(window.max(64));
    let mut targets = Targets::new(cfg, me.node, 0);
    let (mut outstanding, mut received, mut idle) = (0usize, 0u64, 0u32);
    let busy_wait = idle_policy.busy_wait_for(ep.host_threads());
    sync.start.wait();
    // About when something last arrived: read at the first empty poll after a busy one
    // (a clock read per idle stretch, as the runtime reads its clock once per step).
    let (mut last_rx, mut fresh) = (Instant::now(), false);
    while !sync.stop.load(Ordering::Relaxed) {
        while outstanding + cfg.batch as usize <= window {
            out.clear();
            for j in 0..cfg.batch as usize {
                let dst = EndpointAddr::new(targets.dest(j), me.thread);
                out.push(Datagram {
                    dst,
                    payload: &ping,
                });
            }
            targets.next_batch();
            let _ = ep.send(&out);
            outstanding += cfg.batch as usize;
        }
        echo_to.clear();
        let mut pongs = 0;
        let n = ep.poll_recv(64, &mut |src, p| match p.first() {
            Some(&PING) => echo_to.push(src),
            _ => pongs += 1,
        });
        received += n as u64;
        outstanding = outstanding.saturating_sub(pongs);
        if !echo_to.is_empty() {
            out.clear();
            out.extend(echo_to.iter().map(|&dst| Datagram {
                dst,
                payload: &pong,
            }));
            let _ = ep.send(&out);
        }
        if n == 0 {
            // The same idle policy as `Runtime::run_until`: spin, yield, then park unless
            // pings are outstanding and something arrived within `busy_wait`.
            idle += 1;
            if fresh {
                fresh = false;
                last_rx = Instant::now();
            }
            match idle_policy.idle_step(idle, || outstanding > 0 && last_rx.elapsed() < busy_wait) {
                IdleStep::Spin => std::hint::spin_loop(),
                IdleStep::Yield => std::thread::yield_now(),
                IdleStep::Park => {
                    idle = 0;
                    ep.wait(idle_policy.max_wait);
                }
            }
        } else {
            idle = 0;
            fresh = true;
        }
    }
    // Nobody sends after this barrier; drain what is queued so the RPC phase starts clean.
    sync.stopped.wait();
    drain(ep);
    sync.drained.wait();
    received
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_cycle_over_the_other_nodes() {
        for nodes in 1..6u16 {
            for coalesce in [false, true] {
                let cfg = RpcBenchConfig {
                    nodes,
                    coalesce,
                    ..Default::default()
                };
                for me in 0..nodes {
                    let mut t = Targets::new(&cfg, me, 3);
                    for k in 3..40u64 {
                        for j in 0..7u64 {
                            // Request j of batch k goes to the (k + j)-th other node
                            // after me (the k-th with coalesce), cyclically.
                            let want = if nodes == 1 {
                                0
                            } else {
                                let step = if coalesce { k } else { k + j };
                                ((me as u64 + 1 + step % (nodes as u64 - 1)) % nodes as u64) as u16
                            };
                            assert_eq!(
                                t.dest(j as usize),
                                want,
                                "nodes {nodes} me {me} k {k} j {j}"
                            );
                            if nodes > 1 {
                                assert_ne!(t.dest(j as usize), me, "never to itself");
                            }
                        }
                        t.next_batch();
                    }
                }
            }
        }
    }
}
