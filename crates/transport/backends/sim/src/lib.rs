//! # ambidex-transport-sim: a deterministic simulated network
//!
//! The `sim` backend keeps every node of a cluster — its endpoints, its registered regions
//! and everything in flight between them — in one [`SimNet`]. Nothing moves by itself:
//! datagrams and one-sided operations become events in one queue ordered by
//! (delivery time, sequence number), and time is a number the caller advances
//! ([`SimNet::advance_to`]). A scheduler that steps every node's runtime in one thread and
//! advances this clock gets the same run, bit for bit, from the same seed: every fault
//! decision is drawn from one seeded generator in the order the (deterministic) calls
//! arrive, and no wall clock is read.
//!
//! What the network does, by the seeded probabilities of [`SimFaults`]:
//! - **datagrams**: one-way latency uniform in `[min_latency_ns, max_latency_ns]`;
//!   dropped, duplicated (each copy with its own latency), held back a little so later
//!   ones overtake them (reordering), or delayed for up to `max_delay_ns`. A datagram
//!   reaching a full receive queue is dropped and counted, as on every backend;
//! - **one-sided operations** ride a reliable connection per (initiator endpoint, target
//!   node), as RDMA RC does: they execute against the target's region at their delivery
//!   time, in posting order; a request lost on the wire is retransmitted after
//!   `onesided_rto_ns`, and an operation whose target stays unreachable for
//!   `onesided_retries` retransmissions completes with [`AccessError::Timeout`], and
//!   the operations queued behind it on the connection fail with it at once (an RC
//!   queue pair in the error state flushes its work requests); an endpoint's
//!   `set_epoch` fails its operations still queued with [`AccessError::EpochChanged`],
//!   as udp's does; a READ or
//!   WRITE may be executed twice (a retransmitted request the target re-executes, which
//!   is how RDMA treats duplicate READ/WRITE requests; atomics are never re-executed).
//!   The completion travels back with its own latency; completions of one connection
//!   arrive in order;
//! - **partitions** ([`SimNet::partition`]): links between two sides are cut for a time
//!   window: datagrams arriving while cut are lost, one-sided operations retry;
//! - **crash and restart** ([`SimNet::crash`], [`SimNet::restart`]): a crashed node's
//!   receive and completion queues are emptied, its endpoints go dead (their calls do
//!   nothing), traffic to it is dropped and one-sided operations to it time out. Its
//!   registered memory survives (the papers' battery-backed DRAM); after a restart its
//!   endpoints can be taken again (a new incarnation).
//!
//! Two ways to drive it:
//! - **stepped** ([`SimNet::new`]): the caller owns time. `Endpoint::wait` returns at
//!   once and advances nothing, so a runtime's park step is harmless. This is the
//!   deterministic mode of the simulator (`ambidex sim`).
//! - **threaded** ([`SimNet::threaded`]): for code that runs endpoints on real threads
//!   (the conformance suite). `Endpoint::wait` moves time to the next event, or blocks
//!   briefly on a condition variable when nothing is in flight. Not deterministic, since
//!   the threads' interleaving is not.
//!
//! Every delivered datagram, executed operation and completion is folded into a running
//! hash ([`SimNet::trace_hash`]) that a determinism test compares across runs.

use ambidex_transport::counters::{Counter, CounterSnapshot, Counters};
use ambidex_transport::onesided;
use ambidex_transport::region::{Region, RegionMemory};
use ambidex_transport::types::*;
use ambidex_transport::{Endpoint, NodeTransport, SharedNode};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::cmp::Ordering as CmpOrdering;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Most regions one node may register.
pub const MAX_REGIONS: usize = 4096;

/// Seeded fault probabilities (0.0..=1.0) and timing of the simulated network.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimFaults {
    /// One-way latency of a datagram or one-sided request, uniform in [min, max] ns.
    pub min_latency_ns: u64,
    pub max_latency_ns: u64,
    /// A datagram is lost.
    pub drop: f64,
    /// A datagram is delivered twice (each copy with its own latency).
    pub duplicate: f64,
    /// A datagram is held back up to `reorder_window_ns` so later ones overtake it.
    pub reorder: f64,
    pub reorder_window_ns: u64,
    /// A datagram is delayed up to `max_delay_ns` (a congested path).
    pub delay: f64,
    pub max_delay_ns: u64,
    /// A one-sided request is lost on the wire and retransmitted after `onesided_rto_ns`.
    pub onesided_loss: f64,
    /// A one-sided READ or WRITE is executed twice at the target.
    pub onesided_duplicate: f64,
    /// A one-sided request is delayed up to `max_delay_ns`.
    pub onesided_delay: f64,
    pub onesided_rto_ns: u64,
    /// Retransmissions to an unreachable target before the operation fails with Timeout.
    pub onesided_retries: u32,
}

impl Default for SimFaults {
    /// No faults; latencies of a fast datacenter network.
    fn default() -> Self {
        SimFaults {
            min_latency_ns: 2_000,
            max_latency_ns: 10_000,
            drop: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_window_ns: 50_000,
            delay: 0.0,
            max_delay_ns: 1_000_000,
            onesided_loss: 0.0,
            onesided_duplicate: 0.0,
            onesided_delay: 0.0,
            onesided_rto_ns: 500_000,
            onesided_retries: 7,
        }
    }
}

impl SimFaults {
    /// No faults (the default).
    pub fn none() -> SimFaults {
        SimFaults::default()
    }

    pub fn validate(&self) -> Result<(), TransportError> {
        ambidex_transport::fault::check_probabilities(&[
            ("drop", self.drop),
            ("duplicate", self.duplicate),
            ("reorder", self.reorder),
            ("delay", self.delay),
            ("onesided_loss", self.onesided_loss),
            ("onesided_duplicate", self.onesided_duplicate),
            ("onesided_delay", self.onesided_delay),
        ])?;
        if self.min_latency_ns > self.max_latency_ns {
            return Err(TransportError::Config(
                "min_latency_ns exceeds max_latency_ns".into(),
            ));
        }
        if self.onesided_rto_ns == 0 {
            return Err(TransportError::Config(
                "onesided_rto_ns must be positive".into(),
            ));
        }
        Ok(())
    }
}

/// What the network did, over the whole run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SimNetStats {
    pub datagrams_sent: u64,
    pub datagrams_delivered: u64,
    pub dropped_fault: u64,
    pub dropped_partition: u64,
    pub dropped_node_down: u64,
    pub dropped_queue_full: u64,
    pub duplicated: u64,
    pub delayed: u64,
    pub reordered: u64,
    pub onesided_posted: u64,
    pub onesided_executed: u64,
    pub onesided_retransmits: u64,
    pub onesided_timeouts: u64,
    /// Operations failed without being tried because their connection failed: queued
    /// behind one that timed out, or still queued when their initiator moved to a new
    /// epoch (as an RC queue pair in the error state flushes its work requests).
    pub onesided_flushed: u64,
    pub onesided_reexecuted: u64,
    /// One-sided operations a partition kept from their target (each try).
    pub onesided_partitioned: u64,
    pub events: u64,
    pub crashes: u64,
    pub restarts: u64,
}

/// FNV-style mixing of one word into a running hash (deterministic everywhere).
#[inline]
pub fn mix(h: u64, w: u64) -> u64 {
    (h ^ w).wrapping_mul(0x0000_0100_0000_01b3).rotate_left(29)
}

/// A deterministic 64-bit hash of bytes.
pub fn hash_bytes(mut h: u64, b: &[u8]) -> u64 {
    let mut chunks = b.chunks_exact(8);
    for c in &mut chunks {
        h = mix(h, u64::from_le_bytes(c.try_into().expect("8 bytes")));
    }
    let mut last = [0u8; 8];
    let rest = chunks.remainder();
    last[..rest.len()].copy_from_slice(rest);
    mix(mix(h, u64::from_le_bytes(last)), b.len() as u64)
}

/// Initial value of every running hash.
pub const HASH_SEED: u64 = 0xcbf2_9ce4_8422_2325;

struct Packet {
    src: EndpointAddr,
    dst: EndpointAddr,
    epoch: u32,
    payload: Vec<u8>,
}

enum EvKind {
    /// A datagram arrives at its destination's receive queue.
    Deliver(Packet),
    /// The first operation of one-sided connection `chan` reaches its target.
    ChanHead { chan: usize, gen: u64 },
    /// A one-sided completion (or confirmation) reaches the initiator.
    Complete {
        ep: usize,
        incarnation: u64,
        signaled: bool,
        c: Completion,
    },
}

struct Event {
    time: u64,
    seq: u64,
    kind: EvKind,
}

impl PartialEq for Event {
    fn eq(&self, o: &Self) -> bool {
        (self.time, self.seq) == (o.time, o.seq)
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, o: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(o))
    }
}
impl Ord for Event {
    /// Reversed, so the max-heap pops the earliest (time, seq) first.
    fn cmp(&self, o: &Self) -> CmpOrdering {
        (o.time, o.seq).cmp(&(self.time, self.seq))
    }
}

enum OwnedKind {
    Read { len: u32, dest: LocalBuf },
    Write(Vec<u8>),
    Cas { expected: u64, new: u64 },
    Faa { add: u64 },
}

impl OwnedKind {
    fn of(k: &OneSidedKind<'_>) -> OwnedKind {
        match *k {
            OneSidedKind::Read { len, dest } => OwnedKind::Read { len, dest },
            OneSidedKind::Write { data } => OwnedKind::Write(data.to_vec()),
            OneSidedKind::Cas { expected, new } => OwnedKind::Cas { expected, new },
            OneSidedKind::Faa { add } => OwnedKind::Faa { add },
        }
    }

    fn borrow(&self) -> OneSidedKind<'_> {
        match self {
            OwnedKind::Read { len, dest } => OneSidedKind::Read {
                len: *len,
                dest: *dest,
            },
            OwnedKind::Write(d) => OneSidedKind::Write { data: d },
            OwnedKind::Cas { expected, new } => OneSidedKind::Cas {
                expected: *expected,
                new: *new,
            },
            OwnedKind::Faa { add } => OneSidedKind::Faa { add: *add },
        }
    }

    /// READ and WRITE may be re-executed by a target seeing a retransmitted request.
    fn repeatable(&self) -> bool {
        matches!(self, OwnedKind::Read { .. } | OwnedKind::Write(_))
    }
}

struct PendingOp {
    wr_id: u64,
    remote: RemoteAddr,
    kind: OwnedKind,
    signaled: bool,
    ready: u64,
    tries: u32,
    /// Executed once already; a duplicate execution is due (then it completes).
    reexec: bool,
    result: Result<u64, AccessError>,
    /// The initiator's epoch when it posted the operation.
    epoch: u32,
}

/// One reliable one-sided connection: (initiator endpoint, target node).
#[derive(Default)]
struct Chan {
    ops: VecDeque<PendingOp>,
    /// Bumped when the initiator crashes or the connection is flushed, so its stale
    /// events are ignored.
    gen: u64,
    last_completion: u64,
}

struct EpState {
    rx: VecDeque<(EndpointAddr, u32, Vec<u8>)>,
    cq: VecDeque<Completion>,
    epoch: u32,
    outstanding: usize,
    taken: bool,
    counters: Counters,
}

struct NodeState {
    up: bool,
    incarnation: u64,
    regions: Vec<Region>,
    counters: Counters,
    /// The epoch fence: the newest epoch any endpoint of the node moved to. Operations
    /// stamped with an older one fail with `EpochChanged` when they reach the node.
    epoch: u32,
}

struct Partition {
    side: Vec<bool>,
    from: u64,
    until: u64,
}

struct Inner {
    config: ClusterConfig,
    now: u64,
    seq: u64,
    rng: SmallRng,
    /// Region keys: a stream of their own, so registering regions (every node's tables)
    /// does not shift the network's draws.
    key_rng: SmallRng,
    faults: SimFaults,
    events: BinaryHeap<Event>,
    eps: Vec<EpState>,
    nodes: Vec<NodeState>,
    chans: Vec<Chan>,
    partitions: Vec<Partition>,
    trace: u64,
    trace_log: Option<(usize, VecDeque<String>)>,
    stats: SimNetStats,
}

/// A whole simulated cluster network.
pub struct SimNet {
    config: ClusterConfig,
    threaded: bool,
    inner: Mutex<Inner>,
    cv: Condvar,
}

impl SimNet {
    /// A stepped network: the caller advances time ([`SimNet::advance_to`]).
    pub fn new(
        config: ClusterConfig,
        seed: u64,
        faults: SimFaults,
    ) -> Result<Arc<SimNet>, TransportError> {
        Self::build(config, seed, faults, false)
    }

    /// A network for endpoints on real threads: `Endpoint::wait` moves time forward.
    /// Not deterministic (thread interleaving is not).
    pub fn threaded(
        config: ClusterConfig,
        seed: u64,
        faults: SimFaults,
    ) -> Result<Arc<SimNet>, TransportError> {
        Self::build(config, seed, faults, true)
    }

    fn build(
        config: ClusterConfig,
        seed: u64,
        faults: SimFaults,
        threaded: bool,
    ) -> Result<Arc<SimNet>, TransportError> {
        config.validate()?;
        faults.validate()?;
        let n = config.nodes as usize;
        let eps = (0..config.endpoints())
            .map(|_| EpState {
                rx: VecDeque::new(),
                cq: VecDeque::new(),
                epoch: config.epoch,
                outstanding: 0,
                taken: false,
                counters: Counters::default(),
            })
            .collect();
        let nodes = (0..n)
            .map(|_| NodeState {
                up: true,
                incarnation: 0,
                regions: Vec::new(),
                counters: Counters::default(),
                epoch: config.epoch,
            })
            .collect();
        let chans = (0..config.endpoints() * n)
            .map(|_| Chan::default())
            .collect();
        let inner = Inner {
            config: config.clone(),
            now: 0,
            seq: 0,
            rng: SmallRng::seed_from_u64(seed ^ 0x5349_4d4e_4554_0001),
            key_rng: SmallRng::seed_from_u64(seed ^ 0x5349_4d4b_4559_0001),
            faults,
            events: BinaryHeap::new(),
            eps,
            nodes,
            chans,
            partitions: Vec::new(),
            trace: HASH_SEED,
            trace_log: None,
            stats: SimNetStats::default(),
        };
        Ok(Arc::new(SimNet {
            config,
            threaded,
            inner: Mutex::new(inner),
            cv: Condvar::new(),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    /// The transport of node `n`.
    pub fn node(self: &Arc<Self>, n: NodeId) -> SharedNode {
        assert!(n < self.config.nodes, "node {n} outside the cluster");
        Arc::new(SimNode {
            net: self.clone(),
            node: n,
        })
    }

    /// Every node's transport, in order.
    pub fn nodes(self: &Arc<Self>) -> Vec<SharedNode> {
        (0..self.config.nodes).map(|n| self.node(n)).collect()
    }

    /// Simulated time, in nanoseconds since the network was built.
    pub fn now(&self) -> u64 {
        self.lock().now
    }

    /// When the next event (a delivery, an execution, a completion) is due.
    pub fn next_event_time(&self) -> Option<u64> {
        self.lock().events.peek().map(|e| e.time)
    }

    /// Processes every event due up to `t` in (time, sequence) order and sets the clock
    /// to `t` (time never goes back). Returns the number of events processed.
    pub fn advance_to(&self, t: u64) -> usize {
        let n = self.lock().run_until(t);
        if self.threaded && n > 0 {
            self.cv.notify_all();
        }
        n
    }

    /// Processes the events due now.
    pub fn run_due(&self) -> usize {
        let mut g = self.lock();
        let now = g.now;
        g.run_until(now)
    }

    /// Events still in flight (datagrams, one-sided operations and completions).
    pub fn in_flight(&self) -> usize {
        self.lock().events.len()
    }

    /// True if endpoint `addr` has received datagrams or completions not yet polled.
    pub fn has_pending(&self, addr: EndpointAddr) -> bool {
        let g = self.lock();
        let e = &g.eps[self.config.endpoint_index(addr)];
        !e.rx.is_empty() || !e.cq.is_empty()
    }

    pub fn faults(&self) -> SimFaults {
        self.lock().faults.clone()
    }

    /// Changes the fault probabilities from now on.
    pub fn set_faults(&self, f: SimFaults) -> Result<(), TransportError> {
        f.validate()?;
        self.lock().faults = f;
        Ok(())
    }

    /// Cuts every link between the nodes of `side` and the others during
    /// `[from_ns, until_ns)` (both directions).
    pub fn partition(&self, side: &[NodeId], from_ns: u64, until_ns: u64) {
        let mut s = vec![false; self.config.nodes as usize];
        for &n in side {
            if let Some(x) = s.get_mut(n as usize) {
                *x = true;
            }
        }
        let mut g = self.lock();
        let h = mix(mix(mix(g.trace, 0x9a87), from_ns), until_ns);
        g.trace = side.iter().fold(h, |h, &n| mix(h, n as u64));
        g.partitions.push(Partition {
            side: s,
            from: from_ns,
            until: until_ns,
        });
    }

    /// Removes every partition, present and scheduled.
    pub fn heal(&self) {
        let mut g = self.lock();
        g.partitions.clear();
        g.trace = mix(g.trace, 0x4ea1);
    }

    /// True if the link between nodes `a` and `b` is cut now.
    pub fn is_cut(&self, a: NodeId, b: NodeId) -> bool {
        self.lock().cut(a, b)
    }

    /// Crashes node `n`: its queues are emptied, its endpoints die, traffic to it is lost.
    pub fn crash(&self, n: NodeId) {
        let mut g = self.lock();
        let g = &mut *g;
        let nn = n as usize;
        if nn >= g.nodes.len() || !g.nodes[nn].up {
            return;
        }
        g.nodes[nn].up = false;
        g.nodes[nn].incarnation += 1;
        // Its fence stays: its regions survive (battery-backed), and so must the promise
        // that no operation of an epoch older than the one it had reached lands there.
        g.stats.crashes += 1;
        g.trace = mix(mix(g.trace, 0xc7a5), n as u64);
        let t = self.config.threads_per_node as usize;
        let nodes = self.config.nodes as usize;
        for ep in nn * t..(nn + 1) * t {
            let e = &mut g.eps[ep];
            e.rx.clear();
            e.cq.clear();
            e.outstanding = 0;
            e.taken = false;
            e.epoch = self.config.epoch;
            for target in 0..nodes {
                let c = &mut g.chans[ep * nodes + target];
                c.ops.clear();
                c.gen += 1;
            }
        }
    }

    /// Restarts crashed node `n`: a new incarnation whose endpoints can be taken again.
    /// Its registered regions are those it had (battery-backed memory).
    pub fn restart(&self, n: NodeId) {
        let mut g = self.lock();
        if let Some(node) = g.nodes.get_mut(n as usize) {
            if !node.up {
                node.up = true;
                g.stats.restarts += 1;
                g.trace = mix(mix(g.trace, 0x7e57), n as u64);
            }
        }
    }

    pub fn is_up(&self, n: NodeId) -> bool {
        self.lock().nodes.get(n as usize).is_some_and(|s| s.up)
    }

    pub fn stats(&self) -> SimNetStats {
        self.lock().stats.clone()
    }

    /// The running hash of everything the network did (see the crate docs).
    pub fn trace_hash(&self) -> u64 {
        self.lock().trace
    }

    /// Keeps a text line for each of the last `keep` network events (0: off).
    pub fn record_trace(&self, keep: usize) {
        self.lock().trace_log = (keep > 0).then(|| (keep, VecDeque::new()));
    }

    /// The recorded event lines, oldest first.
    pub fn trace_tail(&self) -> Vec<String> {
        self.lock()
            .trace_log
            .as_ref()
            .map(|(_, l)| l.iter().cloned().collect())
            .unwrap_or_default()
    }
}

impl Inner {
    fn schedule(&mut self, time: u64, kind: EvKind) {
        let seq = self.seq;
        self.seq += 1;
        self.events.push(Event { time, seq, kind });
    }

    fn latency(&mut self) -> u64 {
        let f = &self.faults;
        if f.max_latency_ns > f.min_latency_ns {
            let (lo, hi) = (f.min_latency_ns, f.max_latency_ns);
            self.rng.gen_range(lo..=hi)
        } else {
            f.min_latency_ns
        }
    }

    #[inline]
    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.gen_bool(p.min(1.0))
    }

    fn cut(&self, a: NodeId, b: NodeId) -> bool {
        let (a, b) = (a as usize, b as usize);
        self.partitions.iter().any(|p| {
            p.from <= self.now
                && self.now < p.until
                && p.side.get(a).copied().unwrap_or(false)
                    != p.side.get(b).copied().unwrap_or(false)
        })
    }

    fn log(&mut self, line: impl FnOnce() -> String) {
        if let Some((keep, l)) = self.trace_log.as_mut() {
            if l.len() == *keep {
                l.pop_front();
            }
            l.push_back(line());
        }
    }

    fn run_until(&mut self, t: u64) -> usize {
        let mut n = 0;
        while self.events.peek().is_some_and(|e| e.time <= t) {
            let ev = self.events.pop().expect("peeked");
            self.now = self.now.max(ev.time);
            self.stats.events += 1;
            self.process(ev.kind);
            n += 1;
        }
        self.now = self.now.max(t);
        let now = self.now;
        self.partitions.retain(|p| p.until > now);
        n
    }

    fn threads(&self) -> usize {
        self.config.threads_per_node as usize
    }

    fn send_one(&mut self, src: EndpointAddr, dst: EndpointAddr, epoch: u32, payload: &[u8]) {
        self.stats.datagrams_sent += 1;
        let src_ep = self.config.endpoint_index(src);
        if self.chance(self.faults.drop) {
            self.stats.dropped_fault += 1;
            self.eps[src_ep].counters.add(Counter::FaultDropped, 1);
            return;
        }
        let copies = if self.chance(self.faults.duplicate) {
            self.stats.duplicated += 1;
            self.eps[src_ep].counters.add(Counter::FaultDuplicated, 1);
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut t = self.now + self.latency();
            if self.chance(self.faults.delay) {
                self.stats.delayed += 1;
                self.eps[src_ep].counters.add(Counter::FaultDelayed, 1);
                let max = self.faults.max_delay_ns;
                t += self.rng.gen_range(0..=max);
            } else if self.chance(self.faults.reorder) {
                self.stats.reordered += 1;
                self.eps[src_ep].counters.add(Counter::FaultReordered, 1);
                let max = self.faults.reorder_window_ns;
                t += self.rng.gen_range(0..=max);
            }
            self.schedule(
                t,
                EvKind::Deliver(Packet {
                    src,
                    dst,
                    epoch,
                    payload: payload.to_vec(),
                }),
            );
        }
    }

    fn process(&mut self, kind: EvKind) {
        match kind {
            EvKind::Deliver(p) => self.deliver(p),
            EvKind::ChanHead { chan, gen } => self.chan_head(chan, gen),
            EvKind::Complete {
                ep,
                incarnation,
                signaled,
                c,
            } => {
                let node = ep / self.threads();
                if self.nodes[node].incarnation != incarnation {
                    return;
                }
                self.trace = mix(
                    mix(mix(mix(self.trace, 3), self.now), ep as u64),
                    c.wr_id ^ c.value.rotate_left(17) ^ (c.status.is_ok() as u64) << 63,
                );
                let now = self.now;
                self.log(|| format!("{now} complete ep{ep} wr{} {:?}", c.wr_id, c.status));
                let e = &mut self.eps[ep];
                e.outstanding = e.outstanding.saturating_sub(1);
                if signaled || c.status.is_err() {
                    e.cq.push_back(c);
                }
            }
        }
    }

    fn deliver(&mut self, p: Packet) {
        let now = self.now;
        let dn = p.dst.node as usize;
        let outcome = if !self.nodes[dn].up {
            self.stats.dropped_node_down += 1;
            1
        } else if self.cut(p.src.node, p.dst.node) {
            self.stats.dropped_partition += 1;
            let src_ep = self.config.endpoint_index(p.src);
            self.eps[src_ep].counters.add(Counter::FaultDropped, 1);
            2
        } else {
            let depth = self.config.recv_depth;
            let e = &mut self.eps[self.config.endpoint_index(p.dst)];
            if e.rx.len() >= depth {
                e.counters.add(Counter::RxDroppedQueueFull, 1);
                self.stats.dropped_queue_full += 1;
                3
            } else {
                self.stats.datagrams_delivered += 1;
                0
            }
        };
        let h = mix(mix(self.trace, 1), now);
        let h = mix(
            mix(h, (p.src.node as u64) << 16 | p.src.thread as u64),
            outcome,
        );
        let h = mix(h, (p.dst.node as u64) << 16 | p.dst.thread as u64);
        self.trace = hash_bytes(h, &p.payload);
        self.log(|| {
            format!(
                "{now} datagram {} -> {} {} B{}",
                p.src,
                p.dst,
                p.payload.len(),
                ["", " (node down)", " (partitioned)", " (queue full)"][outcome as usize]
            )
        });
        if outcome == 0 {
            let idx = self.config.endpoint_index(p.dst);
            self.eps[idx].rx.push_back((p.src, p.epoch, p.payload));
        }
    }

    /// Executes `op` (from endpoint `src_ep`) at its target now.
    fn execute(&mut self, src_ep: usize, op: &PendingOp) -> Result<u64, AccessError> {
        let src_node = src_ep / self.threads();
        let target = op.remote.node as usize;
        let max = self.config.max_onesided;
        let local_regions = &self.nodes[src_node].regions;
        let local = |id: RegionId| local_regions.get(id as usize).map(|r| &r.mem);
        let result = if op.epoch < self.nodes[target].epoch {
            self.nodes[target]
                .counters
                .add(Counter::OnesidedEpochErrors, 1);
            Err(AccessError::EpochChanged)
        } else {
            match self.nodes[target].regions.get(op.remote.region as usize) {
                None => Err(AccessError::UnknownRegion),
                Some(r) => onesided::execute(r, &op.remote, &op.kind.borrow(), max, &local),
            }
        };
        if let Err(e) = result {
            if e != AccessError::BadLocalBuffer && e != AccessError::EpochChanged {
                self.nodes[target]
                    .counters
                    .add(Counter::RemoteAccessViolations, 1);
            }
        }
        self.stats.onesided_executed += 1;
        self.trace = mix(
            mix(mix(mix(self.trace, 2), self.now), src_ep as u64),
            op.remote.offset ^ (op.remote.node as u64) << 48 ^ result.unwrap_or(u64::MAX),
        );
        let now = self.now;
        self.log(|| {
            format!(
                "{now} one-sided {:?} ep{src_ep} -> node {} region {} +{}: {:?}",
                op.kind.borrow().opcode(),
                op.remote.node,
                op.remote.region,
                op.remote.offset,
                result
            )
        });
        result
    }

    fn chan_head(&mut self, chan: usize, gen: u64) {
        if self.chans[chan].gen != gen {
            return;
        }
        let Some(mut op) = self.chans[chan].ops.pop_front() else {
            return;
        };
        let nodes = self.config.nodes as usize;
        let (src_ep, target) = (chan / nodes, chan % nodes);
        let src_node = (src_ep / self.threads()) as NodeId;
        let reachable = self.nodes[target].up && !self.cut(src_node, target as NodeId);
        if op.reexec {
            op.reexec = false;
            if reachable {
                self.stats.onesided_reexecuted += 1;
                let _ = self.execute(src_ep, &op);
            }
            self.finish(chan, op);
            return;
        }
        let lost = self.chance(self.faults.onesided_loss);
        if self.nodes[target].up && self.cut(src_node, target as NodeId) {
            self.stats.onesided_partitioned += 1;
        }
        if !reachable || lost {
            op.tries += 1;
            self.stats.onesided_retransmits += 1;
            self.eps[src_ep]
                .counters
                .add(Counter::OnesidedRetransmits, 1);
            if op.tries > self.faults.onesided_retries {
                self.stats.onesided_timeouts += 1;
                op.result = Err(AccessError::Timeout);
                self.eps[src_ep].counters.add(Counter::OnesidedErrors, 1);
                self.finish(chan, op);
                // The connection is in the error state: what is queued behind fails
                // now, not after a give-up time of its own each.
                self.flush(chan, AccessError::Timeout);
            } else {
                let t = self.now + self.faults.onesided_rto_ns;
                self.chans[chan].ops.push_front(op);
                self.schedule(t, EvKind::ChanHead { chan, gen });
            }
            return;
        }
        op.result = self.execute(src_ep, &op);
        if op.result.is_err() {
            self.eps[src_ep].counters.add(Counter::OnesidedErrors, 1);
        }
        if op.result.is_ok() && op.kind.repeatable() && self.chance(self.faults.onesided_duplicate)
        {
            op.reexec = true;
            let t = self.now + self.latency();
            self.chans[chan].ops.push_front(op);
            self.schedule(t, EvKind::ChanHead { chan, gen });
            return;
        }
        self.finish(chan, op);
    }

    /// Sends `op`'s completion back and starts the connection's next operation.
    fn finish(&mut self, chan: usize, op: PendingOp) {
        let back = self.now + self.latency();
        self.complete(chan, op, back);
        let c = &self.chans[chan];
        if let Some(t) = c.ops.front().map(|o| o.ready.max(self.now)) {
            let gen = c.gen;
            self.schedule(t, EvKind::ChanHead { chan, gen });
        }
    }

    /// Fails every operation still queued on connection `chan` with `why`, as an RC
    /// queue pair that enters the error state flushes its work requests (and as the udp
    /// backend fails a peer's operations): after one timed out (the target is
    /// unreachable; each would otherwise wait out the retries in turn, one give-up time
    /// apiece), and at the initiator's `set_epoch` (nothing of the old epoch may execute
    /// in the new one, where recovery decided its transaction). The initiator's NIC
    /// completes them at once, in order; an operation already executed and waiting only
    /// for its duplicate execution completes with its result. The connection starts
    /// afresh with the next post. Returns how many were failed.
    fn flush(&mut self, chan: usize, why: AccessError) -> usize {
        if self.chans[chan].ops.is_empty() {
            return 0;
        }
        let nodes = self.config.nodes as usize;
        let (src_ep, target) = (chan / nodes, chan % nodes);
        // The head's scheduled event is void.
        self.chans[chan].gen += 1;
        let mut failed = 0;
        while let Some(mut op) = self.chans[chan].ops.pop_front() {
            if !op.reexec {
                op.result = Err(why);
                failed += 1;
            }
            let now = self.now;
            self.complete(chan, op, now);
        }
        self.stats.onesided_flushed += failed as u64;
        self.eps[src_ep]
            .counters
            .add(Counter::OnesidedErrors, failed as u64);
        let now = self.now;
        self.log(|| format!("{now} flushed ep{src_ep} -> node {target}: {failed} {why:?}"));
        failed
    }

    /// Schedules `op`'s completion at its initiator at `at`, or after the connection's
    /// previous completion (completions of one connection arrive in order).
    fn complete(&mut self, chan: usize, op: PendingOp, at: u64) {
        let nodes = self.config.nodes as usize;
        let (src_ep, target) = (chan / nodes, chan % nodes);
        let c = &mut self.chans[chan];
        let t = at.max(c.last_completion);
        c.last_completion = t;
        let incarnation = self.nodes[src_ep / self.threads()].incarnation;
        self.schedule(
            t,
            EvKind::Complete {
                ep: src_ep,
                incarnation,
                signaled: op.signaled,
                c: Completion {
                    wr_id: op.wr_id,
                    op: op.kind.borrow().opcode(),
                    node: target as NodeId,
                    status: op.result.map(|_| ()),
                    value: op.result.unwrap_or(0),
                },
            },
        );
    }

    fn post(&mut self, src_ep: usize, ops: &[OneSidedOp<'_>]) {
        let nodes = self.config.nodes as usize;
        let incarnation = self.nodes[src_ep / self.threads()].incarnation;
        for op in ops {
            self.stats.onesided_posted += 1;
            self.eps[src_ep].outstanding += 1;
            let target = op.remote.node as usize;
            if target >= nodes {
                // No such node: the local NIC fails it at once.
                self.eps[src_ep].counters.add(Counter::OnesidedErrors, 1);
                let now = self.now;
                self.schedule(
                    now,
                    EvKind::Complete {
                        ep: src_ep,
                        incarnation,
                        signaled: op.signaled,
                        c: Completion {
                            wr_id: op.wr_id,
                            op: op.kind.opcode(),
                            node: op.remote.node,
                            status: Err(AccessError::UnknownNode),
                            value: 0,
                        },
                    },
                );
                continue;
            }
            let mut ready = self.now + self.latency();
            if self.chance(self.faults.onesided_delay) {
                let max = self.faults.max_delay_ns;
                ready += self.rng.gen_range(0..=max);
            }
            let chan = src_ep * nodes + target;
            let c = &mut self.chans[chan];
            let first = c.ops.is_empty();
            c.ops.push_back(PendingOp {
                wr_id: op.wr_id,
                remote: op.remote,
                kind: OwnedKind::of(&op.kind),
                signaled: op.signaled,
                ready,
                tries: 0,
                reexec: false,
                result: Ok(0),
                epoch: self.eps[src_ep].epoch,
            });
            if first {
                let gen = c.gen;
                self.schedule(ready, EvKind::ChanHead { chan, gen });
            }
        }
    }
}

struct SimNode {
    net: Arc<SimNet>,
    node: NodeId,
}

impl NodeTransport for SimNode {
    fn node(&self) -> NodeId {
        self.node
    }

    fn config(&self) -> &ClusterConfig {
        &self.net.config
    }

    fn register(&self, len: usize, perms: Perms) -> Result<Region, TransportError> {
        let mut g = self.net.lock();
        let id = g.nodes[self.node as usize].regions.len();
        if id >= MAX_REGIONS {
            return Err(TransportError::Region(format!(
                "more than {MAX_REGIONS} regions on one node"
            )));
        }
        // Keys come from the seeded generator, not the OS, so runs repeat exactly.
        let key = loop {
            let k: u64 = g.key_rng.gen();
            if k != 0 {
                break k;
            }
        };
        let mem = RegionMemory::anonymous(len)?;
        let region = Region {
            desc: RegionDesc {
                node: self.node,
                id: id as RegionId,
                len: mem.len() as u64,
                key,
                perms,
            },
            mem,
        };
        g.nodes[self.node as usize].regions.push(region.clone());
        Ok(region)
    }

    fn region(&self, id: RegionId) -> Option<Region> {
        self.net.lock().nodes[self.node as usize]
            .regions
            .get(id as usize)
            .cloned()
    }

    fn endpoint(&self, thread: ThreadId) -> Result<Box<dyn Endpoint>, TransportError> {
        let addr = EndpointAddr::new(self.node, thread);
        if !self.net.config.contains(addr) {
            return Err(TransportError::UnknownDestination(addr));
        }
        let idx = self.net.config.endpoint_index(addr);
        let mut g = self.net.lock();
        let node = &g.nodes[self.node as usize];
        if !node.up {
            return Err(TransportError::Config(format!(
                "node {} is down",
                self.node
            )));
        }
        let incarnation = node.incarnation;
        if std::mem::replace(&mut g.eps[idx].taken, true) {
            return Err(TransportError::Config(format!(
                "endpoint {addr} already taken"
            )));
        }
        Ok(Box::new(SimEndpoint {
            net: self.net.clone(),
            addr,
            idx,
            incarnation,
            inbox: Vec::new(),
        }))
    }

    fn counters(&self) -> CounterSnapshot {
        self.net.lock().nodes[self.node as usize]
            .counters
            .snapshot()
    }

    /// A crash (if the node is up) followed by [`SimNet::restart`].
    fn restart(&self) -> Result<(), TransportError> {
        self.net.crash(self.node);
        self.net.restart(self.node);
        Ok(())
    }
}

/// An endpoint of a [`SimNet`]: a handle; the state lives in the network.
struct SimEndpoint {
    net: Arc<SimNet>,
    addr: EndpointAddr,
    idx: usize,
    /// The node incarnation this endpoint belongs to; it is dead once the node crashed.
    incarnation: u64,
    inbox: Vec<(EndpointAddr, Vec<u8>)>,
}

impl SimEndpoint {
    fn live(&self, g: &Inner) -> bool {
        let n = &g.nodes[self.addr.node as usize];
        n.up && n.incarnation == self.incarnation
    }

    /// Locks the network; in threaded mode also processes the events due.
    fn enter(&self) -> MutexGuard<'_, Inner> {
        enter(&self.net)
    }
}

/// Locks `net`; in threaded mode also processes the events due.
fn enter(net: &SimNet) -> MutexGuard<'_, Inner> {
    let mut g = net.lock();
    if net.threaded {
        let now = g.now;
        g.run_until(now);
    }
    g
}

impl Endpoint for SimEndpoint {
    fn addr(&self) -> EndpointAddr {
        self.addr
    }

    fn config(&self) -> &ClusterConfig {
        &self.net.config
    }

    fn send(&mut self, batch: &[Datagram<'_>]) -> Result<(), TransportError> {
        self.net.config.check_batch(batch)?;
        let mut g = self.enter();
        if !self.live(&g) {
            return Ok(());
        }
        let epoch = g.eps[self.idx].epoch;
        let mut bytes = 0u64;
        for d in batch {
            bytes += d.payload.len() as u64;
            g.send_one(self.addr, d.dst, epoch, d.payload);
        }
        let c = &g.eps[self.idx].counters;
        c.add(Counter::TxDatagrams, batch.len() as u64);
        c.add(Counter::TxBytes, bytes);
        c.add(Counter::TxDoorbells, 1);
        drop(g);
        if self.net.threaded {
            self.net.cv.notify_all();
        }
        Ok(())
    }

    fn poll_recv(&mut self, max: usize, sink: &mut dyn FnMut(EndpointAddr, &[u8])) -> usize {
        {
            let mut g = enter(&self.net);
            let node = &g.nodes[self.addr.node as usize];
            if !node.up || node.incarnation != self.incarnation {
                return 0;
            }
            let e = &mut g.eps[self.idx];
            let n = max.min(e.rx.len());
            let (mut wrong, mut bytes) = (0u64, 0u64);
            for _ in 0..n {
                let (src, epoch, p) = e.rx.pop_front().expect("counted");
                if epoch != e.epoch {
                    wrong += 1;
                    continue;
                }
                bytes += p.len() as u64;
                self.inbox.push((src, p));
            }
            e.counters.add(Counter::RxDroppedWrongEpoch, wrong);
            e.counters
                .add(Counter::RxDatagrams, self.inbox.len() as u64);
            e.counters.add(Counter::RxBytes, bytes);
        }
        // The sink runs without the network's lock (it may be long, and may not re-enter).
        let n = self.inbox.len();
        for (src, p) in self.inbox.drain(..) {
            sink(src, &p);
        }
        n
    }

    fn post(&mut self, ops: &[OneSidedOp<'_>]) -> Result<(), TransportError> {
        let mut g = self.enter();
        if !self.live(&g) {
            return Ok(());
        }
        g.post(self.idx, ops);
        g.eps[self.idx]
            .counters
            .add(Counter::OnesidedPosted, ops.len() as u64);
        drop(g);
        if self.net.threaded {
            self.net.cv.notify_all();
        }
        Ok(())
    }

    fn poll_cq(&mut self, max: usize, out: &mut Vec<Completion>) -> usize {
        let mut g = self.enter();
        if !self.live(&g) {
            return 0;
        }
        let cq = &mut g.eps[self.idx].cq;
        let n = max.min(cq.len());
        out.extend(cq.drain(..n));
        n
    }

    fn outstanding(&self) -> usize {
        let g = self.net.lock();
        if self.live(&g) {
            g.eps[self.idx].outstanding
        } else {
            0
        }
    }

    /// Stepped mode: returns at once (the scheduler owns time). Threaded mode: moves time
    /// to the next event (at most `timeout` ahead), or waits briefly for a sender.
    fn wait(&mut self, timeout: Duration) {
        if !self.net.threaded {
            return;
        }
        let mut g = self.enter();
        let e = &g.eps[self.idx];
        if !e.rx.is_empty() || !e.cq.is_empty() {
            return;
        }
        match g.events.peek().map(|e| e.time) {
            Some(t) => {
                let limit = g.now.saturating_add(timeout.as_nanos() as u64);
                g.run_until(t.min(limit));
                drop(g);
                self.net.cv.notify_all();
            }
            None => {
                let _ = self
                    .net
                    .cv
                    .wait_timeout(g, timeout.min(Duration::from_millis(1)));
            }
        }
    }

    fn set_epoch(&mut self, epoch: u32) {
        let mut g = self.net.lock();
        if self.live(&g) {
            let old = std::mem::replace(&mut g.eps[self.idx].epoch, epoch);
            // The fence: every operation executes under the lock, so none of an older
            // epoch can reach this node's memory after this.
            let n = self.idx / self.net.config.threads_per_node as usize;
            let node = &mut g.nodes[n];
            node.epoch = node.epoch.max(epoch);
            if old != epoch {
                // This endpoint's operations of the old epoch fail now, on every
                // connection, as udp's do: one to a node that left would otherwise
                // wait out its retries (and every one behind it, in turn).
                let nodes = self.net.config.nodes as usize;
                for target in 0..nodes {
                    g.flush(self.idx * nodes + target, AccessError::EpochChanged);
                }
            }
        }
        drop(g);
        if self.net.threaded {
            self.net.cv.notify_all();
        }
    }

    fn counters(&self) -> CounterSnapshot {
        self.net.lock().eps[self.idx].counters.snapshot()
    }
}
