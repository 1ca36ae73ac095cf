//! The per-thread runtime: one endpoint, a master loop and worker coroutines.
//!
//! [`Runtime::poll_once`] is one master step: poll the endpoint, run request handlers
//! inline, send the responses of that poll (and due retransmissions) with one doorbell
//! (with `respond_first`, the default), resume the workers whose responses are all in,
//! then send the requests of the step's flushes with a second doorbell. Workers are
//! `async` tasks that reach the runtime through their [`Ctx`]; a worker queues requests
//! without I/O and `ctx.flush().await` sends them with one doorbell and resumes once
//! every response (or failure) is in. Everything lives in this one struct: no globals,
//! no hidden threads, so a simulator can step many runtimes in one thread.
//!
//! One concern per file, as eRPC splits its `Rpc`; the state is owned by small structs
//! whose methods these are:
//! - `task`: spawning, [`Ctx`], the [`Flush`] and [`YieldNow`] futures (`Tasks`);
//! - `batch`: a worker's queued batch and the ready queues (`Workers`);
//! - `client`: destinations, windows and credits; flush encoding; settling responses;
//!   retransmission and suspicion (`Client`);
//! - `server`: handlers and the duplicate-response cache (`Server`);
//! - `outbox`: the one encoder of outgoing datagrams (`Outbox`);
//! - `onesided`: READ, WRITE, CAS and FAA from workers, posted with the step's
//!   doorbell, completions routed back, passive ACK (`OneSided`);
//! - `reassembly`: messages that came in segments; `stats`: [`RpcStats`].

mod batch;
mod client;
mod onesided;
mod outbox;
mod reassembly;
mod seq_array;
mod server;
mod stats;
mod task;

pub use batch::ReqHandle;
pub use onesided::{OneSidedError, OpHandle};
pub use server::{Handler, RequestInfo};
pub use stats::RpcStats;
pub use task::{Ctx, Flush, Idle, Pause, YieldNow};

use crate::clock::{Clock, SystemClock};
use crate::config::{IdleStep, RpcError, RuntimeConfig, ThreadMap};
use crate::epoch::EpochWatch;
use crate::reply::Reply;
use crate::wire;
use ambidex_transport::rtt::RttEstimator;
use ambidex_transport::{
    ClusterConfig, CounterSnapshot, Endpoint, EndpointAddr, EndpointWaker, NodeId,
};
use batch::Workers;
use client::Client;
use onesided::OneSided;
use outbox::{Outbox, SendLimits};
use reassembly::Reassembly;
use server::Server;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;
use task::Tasks;

/// Everything of a runtime but its endpoint and its tasks: what the master step and the
/// workers' `Ctx` share.
pub(crate) struct State {
    me: EndpointAddr,
    cfg: RuntimeConfig,
    cluster: ClusterConfig,
    threads: usize,
    /// Destination thread of `Ctx::queue` (from the thread map).
    queue_thread: u16,
    clock: Arc<dyn Clock>,
    /// Time read at the start of the current step.
    now: u64,
    /// `RuntimeConfig::give_up` in ns.
    give_up: u64,
    /// Least time between two resends of one cached response: the shortest scan period
    /// of a client (`rto_min / 4`), which never retransmits a request sooner.
    resend_gap: u64,
    max_message: usize,
    /// Most parts this runtime puts in a group, and accepts in one: their responses'
    /// budgets (and the item headers) together stay within the wire's message limit.
    max_parts: u8,
    clock_skips: u32,
    /// Step time of the last poll that received something (the idle policy's clock).
    last_rx: u64,
    /// `RuntimeConfig::busy_wait` resolved for this host, in ns.
    busy_wait_ns: u64,
    workers: Workers,
    client: Client,
    server: Server,
    outbox: Outbox,
    reassembly: Reassembly,
    onesided: OneSided,
    stats: RpcStats,
    /// The node's epoch source ([`Runtime::follow`]); without one the epoch is fixed.
    watch: Option<Arc<dyn EpochWatch>>,
    /// The epoch this runtime sends and accepts in, and its members
    /// (`crate::epoch::is_member`).
    epoch: u32,
    members: u64,
    /// The endpoint has a doorbell: without one, [`Ctx::idle`] parks like [`Ctx::pause`].
    has_waker: bool,
}

pub(crate) struct Core {
    ep: Box<dyn Endpoint>,
    st: State,
}

/// Empty polls between clock reads (an idle spin would otherwise mostly read the clock).
const CLOCK_EVERY: u32 = 32;

/// Longest park while coroutines are paused ([`Ctx::pause`]): how late they may see
/// what they wait for when nothing else wakes the thread.
pub const PAUSE_PARK: Duration = Duration::from_micros(200);

/// One thread's runtime. Not `Send`: build it on the thread that runs it.
pub struct Runtime {
    core: Rc<RefCell<Core>>,
    tasks: Tasks,
    /// Workers to resume in this step (scratch).
    run_buf: Vec<u16>,
    idle: u32,
}

fn mix32(mut x: u64) -> u32 {
    // splitmix64 finaliser: spreads clock and address bits over the nonce.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d049bb133111eb);
    (x ^ (x >> 31)) as u32
}

impl Runtime {
    /// A runtime on `ep` with wall-clock time.
    pub fn new(ep: Box<dyn Endpoint>, cfg: RuntimeConfig) -> Result<Runtime, RpcError> {
        Self::with_clock(ep, cfg, SystemClock::shared())
    }

    /// A runtime whose time comes from `clock` (a simulator's).
    pub fn with_clock(
        ep: Box<dyn Endpoint>,
        cfg: RuntimeConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Runtime, RpcError> {
        let cluster = ep.config().clone();
        let me = ep.addr();
        let credits = cfg.credits_for(&cluster)?;
        if credits > u16::MAX as u32 {
            return Err(RpcError::Config("credits must fit 16 bits".into()));
        }
        if let ThreadMap::Fixed(t) = cfg.thread_map {
            if t >= cluster.threads_per_node {
                return Err(RpcError::Config(format!("thread_map: no thread {t}")));
            }
        }
        let window = (cfg.window.max(1) as usize).next_power_of_two();
        let single_cap = cluster.mtu - wire::DGRAM_HDR - wire::REC_HDR;
        let seg_payload = cluster.mtu - wire::DGRAM_HDR - wire::REC_HDR - wire::SEG_EXT;
        // A segmented request takes one credit per segment and must fit the budget.
        let max_message = cfg
            .max_message
            .min(wire::MAX_WIRE_MESSAGE as usize)
            .min(credits as usize * seg_payload)
            .max(single_cap);
        let now = clock.now_ns();
        let session = cfg
            .session
            .unwrap_or_else(|| mix32(now ^ ((me.node as u64) << 48) ^ ((me.thread as u64) << 32)));
        let n = cluster.endpoints();
        let (rto_initial, rto_min, rto_max) = cfg.rto_bounds_ns();
        let rtt0 = RttEstimator::new(rto_initial, rto_min, rto_max);
        let queue_thread = match cfg.thread_map {
            ThreadMap::Peer => me.thread,
            ThreadMap::Fixed(t) => t,
        };
        let limits = SendLimits {
            single_cap,
            group_cap: single_cap - wire::ITEM_HDR,
            seg_payload,
            mtu: cluster.mtu,
            coalesce: cfg.coalesce,
        };
        let st = State {
            me,
            queue_thread,
            threads: cluster.threads_per_node as usize,
            give_up: cfg.give_up.as_nanos().clamp(1, u64::MAX as u128) as u64,
            resend_gap: client::scan_period_for(rto_min),
            max_message,
            max_parts: ((wire::MAX_WIRE_MESSAGE as usize - wire::MAX_ITEMS * wire::ITEM_HDR)
                / max_message)
                .clamp(1, wire::MAX_PARTS) as u8,
            clock_skips: 0,
            last_rx: now,
            busy_wait_ns: cfg.busy_wait_for(ep.host_threads()).as_nanos() as u64,
            workers: Workers::default(),
            client: Client::new(session, credits, window, n, now, rtt0),
            server: Server::new(n),
            outbox: Outbox::new(limits, n),
            reassembly: Reassembly::new(cfg.reassembly_slots, seg_payload, n),
            onesided: OneSided::new(cluster.nodes as usize),
            stats: RpcStats::default(),
            watch: None,
            epoch: cluster.epoch,
            members: u64::MAX,
            has_waker: ep.waker().is_some(),
            now,
            clock,
            cluster,
            cfg,
        };
        Ok(Runtime {
            core: Rc::new(RefCell::new(Core { ep, st })),
            tasks: Tasks::new(),
            run_buf: Vec::new(),
            idle: 0,
        })
    }

    /// Follows `watch`'s epoch from now on: at each change (noticed when the runtime
    /// reads its clock: at every step with work and every few idle polls) the endpoint
    /// moves to the new epoch, every request and one-sided operation of the old one
    /// fails with [`RpcError::EpochChanged`], and requests to nodes that are not
    /// members fail at once ([`RpcError::NotMember`]).
    pub fn follow(&mut self, watch: Arc<dyn EpochWatch>) {
        let mut core = self.core.borrow_mut();
        let Core { ep, st } = &mut *core;
        let (e, members) = (watch.epoch(), watch.members());
        st.watch = Some(watch);
        if e != st.epoch {
            st.change_epoch(&mut **ep, e, members);
        } else {
            st.members = members;
        }
    }

    /// The epoch this runtime sends and accepts datagrams in.
    #[inline]
    pub fn epoch(&self) -> u32 {
        self.core.borrow().st.epoch
    }

    /// Registers the handler of request type `rtype` (replacing any previous one).
    pub fn register(
        &mut self,
        rtype: u8,
        handler: impl FnMut(&RequestInfo, &[u8], &mut Reply<'_>) + 'static,
    ) {
        self.core
            .borrow_mut()
            .st
            .server
            .handlers
            .set(rtype, Box::new(handler));
    }

    /// One master step: poll the endpoint and serve its requests; send their responses
    /// (and due retransmissions) with one doorbell; resume the workers that are ready and
    /// send the requests of all their flushes with a second doorbell. With
    /// `respond_first` off, both go out with the one doorbell at the end. Returns whether
    /// anything happened.
    pub fn poll_once(&mut self) -> bool {
        let received;
        // Paused coroutines resumed by this step (not work).
        let mut unpaused = 0;
        {
            let mut core = self.core.borrow_mut();
            let Core { ep, st } = &mut *core;
            let max = st.cfg.poll_batch;
            received = ep.poll_recv(max, &mut |src, p| st.on_datagram(src, p));
            if st.onesided.need_cq {
                st.poll_completions(&mut **ep);
            }
            // The clock is read only when there is work or time-driven state (timeouts)
            // to serve, so empty polls stay cheap.
            st.clock_skips += 1;
            if received > 0 || !st.workers.ready.is_empty() || st.clock_skips >= CLOCK_EVERY {
                st.now = st.clock.now_ns();
                st.clock_skips = 0;
                if received > 0 {
                    st.last_rx = st.now;
                }
                if let Some(w) = &st.watch {
                    let e = w.epoch();
                    if e != st.epoch {
                        let members = w.members();
                        st.change_epoch(&mut **ep, e, members);
                    }
                }
                if !st.workers.paused.is_empty() {
                    let mut paused = std::mem::take(&mut st.workers.paused);
                    for &id in &paused {
                        if !st.workers.batches[id as usize].in_ready {
                            unpaused += 1;
                        }
                        st.workers.make_ready(id);
                    }
                    // Keep the vector's room for the next pauses.
                    paused.clear();
                    st.workers.paused = paused;
                    st.workers.pausing = 0;
                }
            }
            if !st.client.sampled.is_empty() {
                st.client.take_samples(st.now);
            }
            if st.client.inflight > 0 && st.now >= st.client.next_scan {
                st.scan_timeouts();
            }
            if st.workers.ready.is_empty() || st.cfg.respond_first {
                // Send the responses of this poll now: the peer can work on them while
                // this thread resumes its coroutines.
                if !st.outbox.is_empty() {
                    st.send_outbox(&mut **ep);
                }
            }
            if !st.workers.ready.is_empty() {
                std::mem::swap(&mut st.workers.ready, &mut self.run_buf);
                for &id in &self.run_buf {
                    st.workers.batches[id as usize].in_ready = false;
                }
            }
        }
        if self.tasks.take_woken(&mut self.run_buf) {
            // Coroutines woken from outside resume with a fresh step time too.
            let mut core = self.core.borrow_mut();
            core.st.now = core.st.clock.now_ns();
        }
        let resumed = self.run_buf.len();
        if resumed == 0 {
            return received > 0;
        }
        let worked = received > 0 || resumed > unpaused;
        for k in 0..resumed {
            self.tasks.resume(self.run_buf[k] as usize);
        }
        self.run_buf.clear();
        let mut core = self.core.borrow_mut();
        let Core { ep, st } = &mut *core;
        st.stats.resumes += resumed as u64;
        // The requests of this step's flushes (and its responses unless `respond_first`
        // sent them already): one doorbell; then their one-sided operations.
        if !st.outbox.is_empty() {
            st.send_outbox(&mut **ep);
        }
        if st.onesided.has_posts() {
            st.post_ops(&mut **ep);
        }
        worked
    }

    /// Steps until `stop` says so. When idle: a few empty polls, then a few polls each after
    /// a `sched_yield` (on an oversubscribed machine the thread being waited for is often
    /// queued on this very core, and yielding hands it the core without a futex wake-up),
    /// then a park in `Endpoint::wait`.
    pub fn run_until(&mut self, mut stop: impl FnMut(&Runtime) -> bool) {
        while !stop(self) {
            if self.poll_once() {
                self.idle = 0;
            } else {
                self.idle += 1;
                let step = {
                    let st = &self.core.borrow().st;
                    st.cfg.idle_step(self.idle, || {
                        st.client.inflight > 0
                            && st.busy_wait_ns > 0
                            && st.clock.now_ns().saturating_sub(st.last_rx) < st.busy_wait_ns
                    })
                };
                match step {
                    IdleStep::Spin => std::hint::spin_loop(),
                    IdleStep::Yield => std::thread::yield_now(),
                    IdleStep::Park => {
                        self.idle = 0;
                        self.park();
                    }
                }
            }
        }
    }

    /// Steps until every worker coroutine has finished. A node that also serves others
    /// should use [`Runtime::run_until`] with a cluster-wide stop condition instead.
    pub fn run(&mut self) {
        self.run_until(|rt| rt.live_tasks() == 0)
    }

    /// Parks in `Endpoint::wait` until a datagram may be ready, the doorbell rings
    /// ([`Runtime::waker`]), the next retransmission scan is due, or `max_wait` passes
    /// (`PAUSE_PARK` while a coroutine is in [`Ctx::pause`], or in [`Ctx::idle`] on an
    /// endpoint without a doorbell).
    pub fn park(&mut self) {
        let mut core = self.core.borrow_mut();
        let Core { ep, st } = &mut *core;
        st.clock_skips = CLOCK_EVERY; // time has passed: read the clock at the next step
        let mut t = st.cfg.max_wait;
        if st.workers.pausing > 0 || (!st.has_waker && !st.workers.paused.is_empty()) {
            t = t.min(PAUSE_PARK);
        }
        if st.client.inflight > 0 {
            let now = st.clock.now_ns();
            t = t.min(Duration::from_nanos(
                st.client.next_scan.saturating_sub(now),
            ));
        }
        ep.wait(t);
    }

    /// Feeds one datagram to the receive path as if the endpoint had delivered it (for
    /// simulators and fuzzing). Responses it causes go out at the next step.
    pub fn inject(&mut self, src: EndpointAddr, payload: &[u8]) {
        let mut core = self.core.borrow_mut();
        core.st.now = core.st.clock.now_ns();
        core.st.on_datagram(src, payload);
    }

    /// The endpoint's doorbell, for other threads: ringing it ends this runtime's park,
    /// and coroutines in [`Ctx::idle`] are resumed at the next step. `None` if the
    /// backend has none (then `idle` parks at most `PAUSE_PARK` at a time).
    pub fn waker(&self) -> Option<Arc<dyn EndpointWaker>> {
        self.core.borrow().ep.waker()
    }

    pub fn live_tasks(&self) -> usize {
        self.tasks.live
    }

    pub fn stats(&self) -> RpcStats {
        self.core.borrow().st.stats.clone()
    }

    /// The endpoint's transport counters.
    pub fn endpoint_counters(&self) -> CounterSnapshot {
        self.core.borrow().ep.counters()
    }

    pub fn addr(&self) -> EndpointAddr {
        self.core.borrow().st.me
    }

    pub fn session(&self) -> u32 {
        self.core.borrow().st.client.session
    }

    /// Request datagrams in flight allowed per destination endpoint.
    pub fn credits_per_dest(&self) -> u32 {
        self.core.borrow().st.client.credits
    }

    /// Largest request or response this runtime sends or accepts.
    pub fn max_message(&self) -> usize {
        self.core.borrow().st.max_message
    }

    /// The round-trip estimate and retransmission timeout of this runtime's requests to
    /// `dest`, once it has sent one there (diagnostics and tests).
    pub fn rtt_to(&self, dest: EndpointAddr) -> Option<RttEstimator> {
        let st = &self.core.borrow().st;
        if dest.node >= st.cluster.nodes || dest.thread >= st.cluster.threads_per_node {
            return None;
        }
        let d = st.cluster.endpoint_index(dest);
        st.client.dests[d].as_deref().map(|x| x.rtt)
    }

    /// Nodes suspected failed since the last call (the cluster layer consumes these).
    pub fn take_suspects(&mut self) -> Vec<NodeId> {
        std::mem::take(&mut self.core.borrow_mut().st.client.suspects)
    }

    /// Called at each suspicion, in addition to the queue of [`Runtime::take_suspects`].
    pub fn on_suspect(&mut self, f: impl FnMut(NodeId) + 'static) {
        self.core.borrow_mut().st.client.on_suspect = Some(Box::new(f));
    }

    /// Gives the endpoint back (for example to a next phase) once the runtime is done.
    /// A runtime whose workers still hold it comes back whole, as the error.
    #[allow(clippy::result_large_err)]
    pub fn into_endpoint(mut self) -> Result<Box<dyn Endpoint>, Runtime> {
        // Dropping the tasks drops the workers' `Ctx`s.
        self.tasks.tasks.clear();
        self.tasks.live = 0;
        match Rc::try_unwrap(self.core) {
            Ok(c) => Ok(c.into_inner().ep),
            Err(core) => Err(Runtime {
                core,
                tasks: self.tasks,
                run_buf: self.run_buf,
                idle: 0,
            }),
        }
    }
}

impl State {
    /// The dense index of an endpoint of the cluster.
    #[inline]
    fn ep_index(&self, a: EndpointAddr) -> usize {
        a.node as usize * self.threads + a.thread as usize
    }

    fn send_outbox(&mut self, ep: &mut dyn Endpoint) {
        let (n, r) = self.outbox.send(ep, self.threads);
        self.stats.tx_datagrams += n as u64;
        self.stats.tx_doorbells += 1;
        if r.is_err() {
            // Only misuse errors exist here; requests stay live and are retransmitted.
            self.stats.send_errors += 1;
        }
    }

    /// Moves to epoch `e` with `members`: the endpoint stamps and accepts only `e`, and
    /// everything of the old epoch fails: requests in flight at once; batches still
    /// queued or waiting for credits when their flush next runs (they are resumed to
    /// see it); one-sided operations in flight as the backend completes them (it fails
    /// them on `set_epoch`, as a reset queue pair flushes its work requests).
    #[cold]
    fn change_epoch(&mut self, ep: &mut dyn Endpoint, e: u32, members: u64) {
        self.epoch = e;
        self.members = members;
        ep.set_epoch(e);
        self.stats.epoch_changes += 1;
        for d in 0..self.client.dests.len() {
            let Some(dest) = self.client.dests[d].as_deref() else {
                continue;
            };
            let (lo, hi) = (dest.ack, dest.next_seq);
            for seq in lo..hi {
                if self.client.dest(d).is_live(seq) {
                    self.stats.failed_by_epoch += 1;
                    self.settle(d, seq, batch::ReqStatus::EpochChanged);
                }
            }
        }
        for id in 0..self.workers.batches.len() {
            if self.workers.batches[id].phase == batch::Phase::WaitCredit {
                self.workers.make_ready(id as u16);
            }
        }
    }

    /// Whether `node` may be sent to (a member of the current configuration).
    #[inline(always)]
    fn member(&mut self, node: NodeId) -> bool {
        let ok = crate::epoch::is_member(self.members, node);
        if !ok {
            self.stats.not_member += 1;
        }
        ok
    }

    /// Queues a request of worker `id` to endpoint index `d` (inside the cluster), a
    /// thread of `node` (the caller's, so no division here).
    #[inline(always)]
    fn queue_index(
        &mut self,
        id: u16,
        node: NodeId,
        d: usize,
        rtype: u8,
        payload: &[u8],
    ) -> Result<ReqHandle, RpcError> {
        debug_assert_eq!(node as usize, d / self.threads);
        if !self.member(node) {
            return Err(RpcError::NotMember(node));
        }
        if payload.len() > self.max_message {
            return Err(RpcError::TooLarge {
                len: payload.len(),
                max: self.max_message,
            });
        }
        let group_cap = self.outbox.limits.group_cap;
        let b = &mut self.workers.batches[id as usize];
        let h = b.push(id, d as u32, rtype, payload, group_cap, self.threads)?;
        if h.0 == 0 && b.ops == 0 {
            b.epoch = if b.bound != 0 { b.bound } else { self.epoch };
        }
        Ok(h)
    }

    /// The receive path: one datagram, checked whole before any record is acted on;
    /// requests go to the server, responses to the client.
    fn on_datagram(&mut self, src: EndpointAddr, bytes: &[u8]) {
        self.stats.rx_datagrams += 1;
        let Ok((hdr, recs)) = wire::decode(bytes) else {
            self.stats.rx_malformed += 1;
            return;
        };
        if !self.cluster.contains(src) {
            self.stats.rx_malformed += 1;
            return;
        }
        let s = self.ep_index(src);
        if hdr.kind == wire::KIND_REQUEST {
            self.server.client_window(s, &hdr, self.client.window);
            // A client sends the records of a request datagram in increasing seq order;
            // a repeated or falling seq would only make this server repeat itself.
            let mut last = 0;
            for r in recs {
                if r.seq <= last {
                    self.stats.rx_malformed += 1;
                    continue;
                }
                last = r.seq;
                self.on_request(s, src, &hdr, &r);
            }
        } else {
            if hdr.session != self.client.session || self.client.dests[s].is_none() {
                // Every record of the datagram is a response this runtime never asked for.
                self.stats.rx_unknown_response += hdr.count as u64;
                return;
            }
            self.on_responses(s, recs);
        }
    }
}
