//! The per-thread runtime: one endpoint, a master loop and worker coroutines.
//!
//! [`Runtime::poll_once`] is one master step: poll the endpoint, run request handlers
//! inline, send the responses of that poll (and due retransmissions) with one doorbell
//! (with `respond_first`, the default), resume the workers whose responses are all in,
//! then send the requests of the step's flushes with a second doorbell. A flush's whole
//! batch of small requests to one endpoint joins the group an earlier flush of the step
//! built there as a part, while it fits (see `wire` and `State::join_group`). Workers
//! are `async` tasks that
//! reach the runtime through their [`Ctx`]; a worker queues requests without I/O and
//! `ctx.flush().await` sends them with one doorbell and resumes once every response (or
//! failure) is in. Everything lives in this one struct: no globals, no hidden threads,
//! so a simulator can step many runtimes in one thread.

use crate::clock::{Clock, SystemClock};
use crate::config::{IdleStep, RpcError, RuntimeConfig, ThreadMap};
use crate::reply::Reply;
use crate::wire::{self, Seg};
use ambidex_transport::{ClusterConfig, CounterSnapshot, Datagram, Endpoint, EndpointAddr, NodeId};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

/// What a handler learns about the request it serves.
#[derive(Clone, Copy, Debug)]
pub struct RequestInfo {
    pub src: EndpointAddr,
    pub rtype: u8,
    /// Sequence number of the request's record (shared by the requests of a group).
    pub seq: u64,
}

/// A request handler: runs inline in the master loop and writes its response into the
/// [`Reply`] (empty when the handler starts). It must not block.
pub type Handler = Box<dyn FnMut(&RequestInfo, &[u8], &mut Reply<'_>)>;

/// Counters of one runtime; every drop and retransmission is here.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct RpcStats {
    pub rpcs_issued: u64,
    pub rpcs_completed: u64,
    pub rpcs_failed: u64,
    pub flushes: u64,
    /// Flushes whose batch joined another flush's group as a part (no window entry of
    /// its own).
    pub flushes_joined: u64,
    pub requests_served: u64,
    pub no_handler: u64,
    /// Duplicate requests answered from the response cache (handler not rerun).
    pub duplicate_requests: u64,
    /// Duplicates of requests the client already settled (dropped).
    pub stale_requests: u64,
    pub out_of_window_requests: u64,
    pub retransmits: u64,
    pub suspected: u64,
    pub rx_datagrams: u64,
    pub rx_malformed: u64,
    pub rx_unknown_response: u64,
    pub rx_duplicate_response: u64,
    pub rx_bad_segment: u64,
    pub reassembly_evicted: u64,
    pub tx_datagrams: u64,
    pub tx_doorbells: u64,
    pub send_errors: u64,
    pub credit_waits: u64,
    pub resumes: u64,
}

impl RpcStats {
    pub fn merge(&mut self, o: &RpcStats) {
        macro_rules! add { ($($f:ident),*) => { $(self.$f += o.$f;)* } }
        add!(
            rpcs_issued,
            rpcs_completed,
            rpcs_failed,
            flushes,
            flushes_joined,
            requests_served,
            no_handler,
            duplicate_requests,
            stale_requests,
            out_of_window_requests,
            retransmits,
            suspected,
            rx_datagrams,
            rx_malformed,
            rx_unknown_response,
            rx_duplicate_response,
            rx_bad_segment,
            reassembly_evicted,
            tx_datagrams,
            tx_doorbells,
            send_errors,
            credit_waits,
            resumes
        );
    }
}

/// A queued request of the current batch, returned by [`Ctx::queue`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReqHandle(u16);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Building,
    WaitCredit,
    InFlight,
    Done,
}

/// The settled statuses have the values of their wire statuses, so that reading one
/// off the wire is a range check.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
enum ReqStatus {
    Ok = wire::STATUS_OK,
    NoHandler = wire::STATUS_NO_HANDLER,
    TooLarge = wire::STATUS_TOO_LARGE,
    /// Not settled yet.
    Queued,
    Failed,
}

/// One request of a batch: where its payload is in the request arena and, once in,
/// where its response is in the response arena.
#[derive(Clone, Copy)]
#[repr(align(32))] // a power-of-two stride: indexing is a shift
struct QReq {
    dest: u32,
    rtype: u8,
    status: ReqStatus,
    /// Next request of its group: request `next` of worker `next_co` (queued as the
    /// next request of the batch; a flush that groups otherwise, or another worker's
    /// batch joining the group, rewrites it). Not followed past a group's last request.
    next: u16,
    next_co: u16,
    off: u32,
    len: u32,
    roff: u32,
    rlen: u32,
}

/// A worker coroutine's batch. Buffers keep their capacity across batches, so a steady
/// state allocates nothing.
struct Co {
    reqs: Vec<QReq>,
    arena: Vec<u8>,
    /// Responses of the batch, appended as they come in (each request gets at most one).
    rarena: Vec<u8>,
    pending: u32,
    /// Requests of the batch settled as failed.
    failed: u32,
    phase: Phase,
    in_ready: bool,
    waiting_credit: bool,
    /// Destination of the batch's first request; `multi` once another one joins.
    dest0: u32,
    multi: bool,
    /// Some request of the batch needs segments.
    big: bool,
}

impl Co {
    fn new() -> Co {
        Co {
            reqs: Vec::new(),
            arena: Vec::new(),
            rarena: Vec::new(),
            pending: 0,
            failed: 0,
            phase: Phase::Building,
            in_ready: false,
            waiting_credit: false,
            dest0: 0,
            multi: false,
            big: false,
        }
    }
}

/// A fixed power-of-two array indexed by sequence number (seq mod length), so indexing
/// needs no bounds check.
struct SeqArray<T> {
    items: Box<[T]>,
    mask: usize,
}

impl<T> SeqArray<T> {
    fn new(n: usize, f: impl FnMut(usize) -> T) -> SeqArray<T> {
        assert!(n.is_power_of_two());
        SeqArray {
            items: (0..n).map(f).collect(),
            mask: n - 1,
        }
    }

    #[inline(always)]
    fn at(&self, seq: u64) -> &T {
        // SAFETY: `items` has mask + 1 entries (a power of two), so the index is in range.
        unsafe { self.items.get_unchecked(seq as usize & self.mask) }
    }

    #[inline(always)]
    fn at_mut(&mut self, seq: u64) -> &mut T {
        // SAFETY: as in `at`.
        unsafe { self.items.get_unchecked_mut(seq as usize & self.mask) }
    }
}

#[derive(Clone, Copy, Default)]
struct ReqRec {
    seq: u64,
    live: bool,
    /// Items of the group this seq carries (its first request is `idx` of worker `co`,
    /// the others follow `QReq::next` and `QReq::next_co`); 0 for a lone request sent
    /// as its own (segmented) message.
    count: u8,
    /// Parts of the group (workers' batches): its response may take `max_message` each.
    parts: u8,
    co: u16,
    idx: u16,
    dg: u16,
    retries: u32,
    deadline: u64,
}

#[derive(Clone, Copy, Default)]
struct DgSlot {
    remaining: u16,
    weight: u16,
}

/// Client side of one destination endpoint: credits, sequence numbers and the window
/// of requests in flight (indexed by seq mod window).
struct Dest {
    credits: u32,
    dg_free: Vec<u16>,
    dg: Vec<DgSlot>,
    next_seq: u64,
    /// Every seq below is settled (sent in request headers as `ack`).
    ack: u64,
    win: SeqArray<ReqRec>,
    /// Window entries in flight.
    inflight: u32,
}

impl Dest {
    fn new(credits: u32, window: usize) -> Dest {
        Dest {
            credits,
            dg_free: (0..credits as u16).rev().collect(),
            dg: vec![DgSlot::default(); credits as usize],
            next_seq: 1,
            ack: 1,
            win: SeqArray::new(window, |_| ReqRec::default()),
            inflight: 0,
        }
    }

    /// Opens the window entry of the next seq: `count` items (0: a lone request) of
    /// worker `co`'s batch from its request `idx`, in credit slot `dg`. Returns the seq.
    #[inline(always)]
    fn open_entry(&mut self, count: u8, co: u16, idx: u16, dg: u16, deadline: u64) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.dg[dg as usize].remaining += 1;
        *self.win.at_mut(seq) = ReqRec {
            seq,
            live: true,
            count,
            parts: 1,
            co,
            idx,
            dg,
            retries: 0,
            deadline,
        };
        self.inflight += 1;
        seq
    }

    fn alloc_dg(&mut self, weight: u16) -> u16 {
        let s = self
            .dg_free
            .pop()
            .expect("credit accounting: a slot per credit");
        self.dg[s as usize] = DgSlot {
            remaining: 0,
            weight,
        };
        self.credits -= weight as u32;
        s
    }
}

/// Server side of one client endpoint: cached responses of the last `window` requests.
struct ClientWin {
    session: u32,
    base: u64,
    slots: SeqArray<Served>,
}

struct Served {
    seq: u64,
    /// Tag of the response record: its status, or a group's item count.
    tag: u8,
    /// The request came in segments, or as a group (a duplicate must too).
    segmented: bool,
    group: bool,
    /// Step time the response was last sent (resends are rate-limited).
    sent_at: u64,
    resp: Vec<u8>,
}

/// What a datagram may be coalesced with: its kind and session (never NO_KEY).
#[inline(always)]
fn open_key(kind: u8, session: u32) -> u64 {
    (kind as u64) << 32 | session as u64
}

/// `DestTx::open_key` when no datagram is open.
const NO_KEY: u64 = u64::MAX;

/// No open datagram (`DestTx::open`).
const NO_DG: usize = usize::MAX;
/// The open datagram has no credit slot (`DestTx::cur_dg`): it was not opened by a flush.
const NO_SLOT: u16 = u16::MAX;

/// Outgoing datagrams to one endpoint, built in place. The record count of the open
/// datagram is kept in `open_count` and written into its header when it is closed.
struct DestTx {
    /// Zero-initialised scratch; `len` bytes of it are in use.
    buf: Vec<u8>,
    len: usize,
    bounds: Vec<(u32, u32)>,
    open: usize,
    /// `open_key(kind, session)` of the open datagram; NO_KEY if none is open.
    open_key: u64,
    open_count: usize,
    /// Credit slot of the open request datagram (NO_SLOT if it has none).
    cur_dg: u16,
    touched: bool,
    /// The last group built in the open datagram, which later requests of the same
    /// flush, or later whole batches (as parts), join while it is the datagram's last
    /// record: its record's position (NO_DG if none), flush number, seq, items, body
    /// bytes, parts, and last request (request `grp_last` of worker `grp_co`).
    grp_pos: usize,
    grp_flush: u64,
    grp_seq: u64,
    grp_count: u8,
    grp_len: usize,
    grp_parts: u8,
    grp_last: u16,
    grp_co: u16,
}

impl Default for DestTx {
    fn default() -> Self {
        DestTx {
            buf: Vec::new(),
            len: 0,
            bounds: Vec::new(),
            open: NO_DG,
            open_key: NO_KEY,
            open_count: 0,
            cur_dg: NO_SLOT,
            touched: false,
            grp_pos: NO_DG,
            grp_flush: 0,
            grp_seq: 0,
            grp_count: 0,
            grp_len: 0,
            grp_parts: 0,
            grp_last: 0,
            grp_co: 0,
        }
    }
}

impl DestTx {
    #[inline]
    fn close(&mut self) {
        if self.open != NO_DG {
            self.buf[self.open + 3] = self.open_count as u8;
            self.bounds.push((self.open as u32, self.len as u32));
            self.open = NO_DG;
            self.open_key = NO_KEY;
        }
        self.grp_pos = NO_DG;
    }

    /// Whether a record of `rec_len` bytes can join the open datagram, whose kind and
    /// session make `key`.
    #[inline(always)]
    fn has_room(&self, key: u64, rec_len: usize, mtu: usize) -> bool {
        self.open_key == key
            && self.open_count < wire::MAX_RECORDS
            && self.len - self.open + rec_len <= mtu
    }

    /// Whether a request of `item` bytes (header included) of flush `flush` can join the
    /// group that flush is building.
    #[inline(always)]
    fn joins_group(&self, flush: u64, item: usize, mtu: usize) -> bool {
        self.grp_flush == flush && self.group_has_room(1, item, mtu)
    }

    /// Whether `n` more items of `bytes` bytes (headers included) fit the last group
    /// built in the open datagram, which is still its last record.
    #[inline(always)]
    fn group_has_room(&self, n: usize, bytes: usize, mtu: usize) -> bool {
        self.grp_pos != NO_DG
            && self.len == self.grp_pos + wire::REC_HDR + self.grp_len
            && self.grp_count as usize + n <= wire::MAX_ITEMS
            && self.len - self.open + bytes <= mtu
    }

    /// Appends items (`body`, `n` of them) to the last group (see `group_has_room`) and
    /// rewrites its header.
    #[inline(always)]
    fn grow_group(&mut self, n: usize, body: &[u8]) {
        let at = self.len;
        // In bounds: `open_new` sized the buffer for a whole datagram.
        self.buf[at..at + body.len()].copy_from_slice(body);
        self.len += body.len();
        self.grp_len += body.len();
        self.grp_count += n as u8;
        wire::write_group_header(
            &mut self.buf,
            self.grp_pos,
            self.grp_seq,
            self.grp_count,
            self.grp_len as u16,
        );
    }

    /// Writes a group record of `count` items (copied from `body`) at the end of the
    /// open datagram (which `ensure` sized) and makes it the last group (one part, built
    /// by flush `flush` of worker `co`, whose request `last` it ends with).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn put_group(&mut self, seq: u64, count: u8, body: &[u8], flush: u64, co: u16, last: u16) {
        let pos = self.len;
        let end = pos + wire::REC_HDR + body.len();
        wire::write_group_header(&mut self.buf, pos, seq, count, body.len() as u16);
        self.buf[pos + wire::REC_HDR..end].copy_from_slice(body);
        self.len = end;
        self.open_count += 1;
        (self.grp_pos, self.grp_flush, self.grp_seq, self.grp_count) = (pos, flush, seq, count);
        (self.grp_len, self.grp_parts, self.grp_last, self.grp_co) = (body.len(), 1, last, co);
    }

    /// Makes room for `n` more bytes.
    #[inline(always)]
    fn room(&mut self, n: usize) {
        if self.len + n > self.buf.len() {
            self.grow(n);
        }
    }

    #[inline(never)]
    fn grow(&mut self, n: usize) {
        let want = (self.len + n).max(2 * self.buf.len()).max(4096);
        self.buf.resize(want, 0);
    }
}

/// Bytes of an endpoint's outgoing buffer kept between steps (beyond, it is freed).
const SHRINK_TX_ABOVE: usize = 1 << 20;

#[derive(Default)]
struct Tx {
    /// Every datagram opened gets room for this many bytes up front.
    mtu: usize,
    per: Vec<DestTx>,
    touched: Vec<u32>,
    list: Vec<Datagram<'static>>,
}

/// Reuses a vector's allocation for another lifetime (it is emptied first).
fn recycle<'a, 'b>(mut v: Vec<Datagram<'a>>) -> Vec<Datagram<'b>> {
    v.clear();
    v.into_iter().map(|_| unreachable!()).collect()
}

impl Tx {
    /// Ensures an open datagram to `d` with room for a record of `rec_len` bytes; returns
    /// true if a new datagram was opened. `alone` forces a fresh datagram (segments).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn ensure(
        &mut self,
        d: usize,
        kind: u8,
        session: u32,
        ack: u64,
        rec_len: usize,
        mtu: usize,
        coalesce: bool,
        alone: bool,
    ) -> bool {
        if coalesce && !alone && self.per[d].has_room(open_key(kind, session), rec_len, mtu) {
            return false;
        }
        self.open_new(d, kind, session, ack);
        true
    }

    #[inline(never)]
    fn open_new(&mut self, d: usize, kind: u8, session: u32, ack: u64) {
        let t = &mut self.per[d];
        t.close();
        if !t.touched {
            t.touched = true;
            self.touched.push(d as u32);
        }
        // Room for a whole datagram: records pushed into it need no check of their own.
        t.room(self.mtu);
        t.open = t.len;
        wire::write_header(&mut t.buf, t.len, kind, session, ack);
        t.len += wire::DGRAM_HDR;
        t.open_key = open_key(kind, session);
        t.open_count = 0;
        t.cur_dg = NO_SLOT;
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn push(&mut self, d: usize, seq: u64, tag: u8, seg: Option<Seg>, group: bool, payload: &[u8]) {
        let t = &mut self.per[d];
        debug_assert!(t.open != NO_DG, "ensure before push");
        // `ensure` checked that the record fits the datagram, which `open_new` sized (and
        // the slicing in `write_record` checks it again).
        debug_assert!(t.len + wire::record_len(payload.len(), seg.is_some()) <= t.buf.len());
        t.len = wire::write_record(&mut t.buf, t.len, seq, tag, seg, group, payload);
        t.open_count += 1;
    }

    fn close(&mut self, d: usize) {
        self.per[d].close();
    }

    fn is_empty(&self) -> bool {
        self.touched.is_empty()
    }

    /// Sends everything built so far with one doorbell; returns the datagram count.
    fn send(
        &mut self,
        ep: &mut dyn Endpoint,
        threads: usize,
    ) -> (usize, Result<(), ambidex_transport::TransportError>) {
        let mut list: Vec<Datagram<'_>> = recycle(std::mem::take(&mut self.list));
        for &d in &self.touched {
            let t = &mut self.per[d as usize];
            t.close();
        }
        for &d in &self.touched {
            let t = &self.per[d as usize];
            let dst =
                EndpointAddr::new((d as usize / threads) as u16, (d as usize % threads) as u16);
            for &(s, e) in &t.bounds {
                list.push(Datagram {
                    dst,
                    payload: &t.buf[s as usize..e as usize],
                });
            }
        }
        let n = list.len();
        let r = if n > 0 { ep.send(&list) } else { Ok(()) };
        self.list = recycle(list);
        for &d in &self.touched {
            let t = &mut self.per[d as usize];
            t.len = 0;
            t.bounds.clear();
            t.touched = false;
            // A burst of large responses must not pin its memory for good.
            if t.buf.len() > SHRINK_TX_ABOVE {
                t.buf = Vec::new();
            }
        }
        self.touched.clear();
        (n, r)
    }
}

/// A message being reassembled from segments.
struct Reasm {
    active: bool,
    src: u32,
    kind: u8,
    session: u32,
    seq: u64,
    tag: u8,
    total: u32,
    got: u32,
    bits: Vec<u64>,
    buf: Vec<u8>,
    touched: u64,
}

/// Per-destination needs of one flush (scratch).
#[derive(Clone, Copy, Default)]
struct Need {
    fill: usize,
    /// Records in the datagram being filled, items in its last group.
    count: usize,
    items: usize,
    dgrams: usize,
    reqs: usize,
}

pub(crate) struct State {
    me: EndpointAddr,
    cfg: RuntimeConfig,
    cluster: ClusterConfig,
    threads: usize,
    /// Destination thread of `Ctx::queue` (from the thread map).
    queue_thread: u16,
    clock: Arc<dyn Clock>,
    now: u64,
    rto: u64,
    session: u32,
    credits: u32,
    window: usize,
    max_message: usize,
    /// Most parts this runtime puts in a group, and accepts in one: their responses'
    /// budgets (and the item headers) together stay within the wire's message limit.
    max_parts: u8,
    /// Single-record and segment payload caps, MTU and coalescing (for every send).
    limits: SendLimits,
    handlers: Box<[Option<Handler>; 256]>,
    dests: Vec<Option<Box<Dest>>>,
    clients: Vec<Option<Box<ClientWin>>>,
    cos: Vec<Co>,
    ready: Vec<u16>,
    credit_waiters: Vec<u16>,
    tx: Tx,
    reasm: Vec<Reasm>,
    /// Scratch of reassembly eviction: slots held per source endpoint (all zero between
    /// uses).
    reasm_held: Vec<u32>,
    need: Vec<Need>,
    need_touched: Vec<u32>,
    /// Window entries in flight (a group is one).
    inflight: u64,
    next_scan: u64,
    clock_skips: u32,
    /// Step time of the last poll that received something (the idle policy's clock).
    last_rx: u64,
    /// `RuntimeConfig::busy_wait` resolved for this host, in ns.
    busy_wait_ns: u64,
    stats: RpcStats,
    suspects: Vec<NodeId>,
    on_suspect: Option<Box<dyn FnMut(NodeId)>>,
}

pub(crate) struct Core {
    ep: Box<dyn Endpoint>,
    st: State,
}

/// Marks a task for polling when a foreign future wakes it (the RPC path itself does
/// not use wakers: the master queues the worker directly).
struct TaskWake {
    flag: AtomicBool,
    any: Arc<AtomicBool>,
}

impl Wake for TaskWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.flag.store(true, Ordering::Release);
        self.any.store(true, Ordering::Release);
    }
}

/// Empty polls between clock reads (an idle spin would otherwise mostly read the clock).
const CLOCK_EVERY: u32 = 32;

type Task = Pin<Box<dyn Future<Output = ()>>>;

/// One thread's runtime. Not `Send`: build it on the thread that runs it.
pub struct Runtime {
    core: Rc<RefCell<Core>>,
    tasks: Vec<Option<Task>>,
    wakes: Vec<Arc<TaskWake>>,
    wakers: Vec<Waker>,
    any_woken: Arc<AtomicBool>,
    run_buf: Vec<u16>,
    live: usize,
    idle: u32,
}

/// A worker coroutine's handle on its runtime.
#[derive(Clone)]
pub struct Ctx {
    core: Rc<RefCell<Core>>,
    id: u16,
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
        let queue_thread = match cfg.thread_map {
            ThreadMap::Peer => me.thread,
            ThreadMap::Fixed(t) => t,
        };
        let st = State {
            me,
            queue_thread,
            threads: cluster.threads_per_node as usize,
            rto: cfg.retransmit_timeout.as_nanos().max(1) as u64,
            credits,
            window,
            max_message,
            max_parts: ((wire::MAX_WIRE_MESSAGE as usize - wire::MAX_ITEMS * wire::ITEM_HDR)
                / max_message)
                .clamp(1, wire::MAX_PARTS) as u8,
            limits: SendLimits {
                single_cap,
                group_cap: single_cap - wire::ITEM_HDR,
                seg_payload,
                mtu: cluster.mtu,
                coalesce: cfg.coalesce,
            },
            handlers: Box::new(std::array::from_fn(|_| None)),
            dests: (0..n).map(|_| None).collect(),
            clients: (0..n).map(|_| None).collect(),
            cos: Vec::new(),
            ready: Vec::new(),
            credit_waiters: Vec::new(),
            tx: Tx {
                mtu: cluster.mtu,
                per: (0..n).map(|_| DestTx::default()).collect(),
                ..Default::default()
            },
            reasm: Vec::new(),
            reasm_held: vec![0; n],
            need: vec![Need::default(); n],
            need_touched: Vec::new(),
            inflight: 0,
            next_scan: now,
            clock_skips: 0,
            last_rx: now,
            busy_wait_ns: cfg.busy_wait_for(ep.host_threads()).as_nanos() as u64,
            stats: RpcStats::default(),
            suspects: Vec::new(),
            on_suspect: None,
            now,
            session,
            clock,
            cluster,
            cfg,
        };
        Ok(Runtime {
            core: Rc::new(RefCell::new(Core { ep, st })),
            tasks: Vec::new(),
            wakes: Vec::new(),
            wakers: Vec::new(),
            any_woken: Arc::new(AtomicBool::new(false)),
            run_buf: Vec::new(),
            live: 0,
            idle: 0,
        })
    }

    /// Registers the handler of request type `rtype` (replacing any previous one).
    pub fn register(
        &mut self,
        rtype: u8,
        handler: impl FnMut(&RequestInfo, &[u8], &mut Reply<'_>) + 'static,
    ) {
        self.core.borrow_mut().st.handlers[rtype as usize] = Some(Box::new(handler));
    }

    /// Spawns a worker coroutine; it first runs at the next step.
    pub fn spawn<F, Fut>(&mut self, f: F)
    where
        F: FnOnce(Ctx) -> Fut,
        Fut: Future<Output = ()> + 'static,
    {
        let id = self.tasks.len();
        assert!(id < u16::MAX as usize, "too many coroutines");
        let ctx = Ctx {
            core: self.core.clone(),
            id: id as u16,
        };
        self.tasks.push(Some(Box::pin(f(ctx))));
        let w = Arc::new(TaskWake {
            flag: AtomicBool::new(false),
            any: self.any_woken.clone(),
        });
        self.wakers.push(Waker::from(w.clone()));
        self.wakes.push(w);
        let mut core = self.core.borrow_mut();
        core.st.cos.push(Co::new());
        core.st.make_ready(id as u16);
        self.live += 1;
    }

    /// One master step: poll the endpoint and serve its requests; send their responses
    /// (and due retransmissions) with one doorbell; resume the workers that are ready and
    /// send the requests of all their flushes with a second doorbell. With
    /// `respond_first` off, both go out with the one doorbell at the end. Returns whether
    /// anything happened.
    pub fn poll_once(&mut self) -> bool {
        let received;
        {
            let mut core = self.core.borrow_mut();
            let Core { ep, st } = &mut *core;
            let max = st.cfg.poll_batch;
            received = ep.poll_recv(max, &mut |src, p| st.on_datagram(src, p));
            // The clock is read only when there is work or time-driven state (timeouts)
            // to serve, so empty polls stay cheap.
            st.clock_skips += 1;
            if received > 0 || !st.ready.is_empty() || st.clock_skips >= CLOCK_EVERY {
                st.now = st.clock.now_ns();
                st.clock_skips = 0;
                if received > 0 {
                    st.last_rx = st.now;
                }
            }
            if st.inflight > 0 && st.now >= st.next_scan {
                st.scan_timeouts();
            }
            if st.ready.is_empty() || st.cfg.respond_first {
                // Send the responses of this poll now: the peer can work on them while
                // this thread resumes its coroutines.
                if !st.tx.is_empty() {
                    st.send_tx(&mut **ep);
                }
            }
            if !st.ready.is_empty() {
                std::mem::swap(&mut st.ready, &mut self.run_buf);
                for &id in &self.run_buf {
                    st.cos[id as usize].in_ready = false;
                }
            }
        }
        if self.any_woken.load(Ordering::Relaxed) && self.any_woken.swap(false, Ordering::Acquire) {
            for (i, w) in self.wakes.iter().enumerate() {
                if w.flag.swap(false, Ordering::Acquire) {
                    self.run_buf.push(i as u16);
                }
            }
            // Coroutines woken from outside resume with a fresh step time too.
            let mut core = self.core.borrow_mut();
            core.st.now = core.st.clock.now_ns();
        }
        let resumed = self.run_buf.len();
        if resumed == 0 {
            return received > 0;
        }
        for k in 0..resumed {
            let id = self.run_buf[k] as usize;
            if let Some(task) = self.tasks[id].as_mut() {
                let mut cx = Context::from_waker(&self.wakers[id]);
                if task.as_mut().poll(&mut cx).is_ready() {
                    self.tasks[id] = None;
                    self.live -= 1;
                }
            }
        }
        self.run_buf.clear();
        let mut core = self.core.borrow_mut();
        let Core { ep, st } = &mut *core;
        st.stats.resumes += resumed as u64;
        // The requests of this step's flushes (and its responses unless `respond_first`
        // sent them already): one doorbell.
        if !st.tx.is_empty() {
            st.send_tx(&mut **ep);
        }
        true
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
                        st.inflight > 0
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

    /// Parks in `Endpoint::wait` until a datagram may be ready, the next retransmission
    /// scan is due, or `max_wait` passes.
    pub fn park(&mut self) {
        let mut core = self.core.borrow_mut();
        let Core { ep, st } = &mut *core;
        st.clock_skips = CLOCK_EVERY; // time has passed: read the clock at the next step
        let mut t = st.cfg.max_wait;
        if st.inflight > 0 {
            let now = st.clock.now_ns();
            t = t.min(Duration::from_nanos(st.next_scan.saturating_sub(now)));
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

    pub fn live_tasks(&self) -> usize {
        self.live
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
        self.core.borrow().st.session
    }

    /// Request datagrams in flight allowed per destination endpoint.
    pub fn credits_per_dest(&self) -> u32 {
        self.core.borrow().st.credits
    }

    /// Largest request or response this runtime sends or accepts.
    pub fn max_message(&self) -> usize {
        self.core.borrow().st.max_message
    }

    /// Nodes suspected failed since the last call (the cluster layer consumes these).
    pub fn take_suspects(&mut self) -> Vec<NodeId> {
        std::mem::take(&mut self.core.borrow_mut().st.suspects)
    }

    /// Called at each suspicion, in addition to the queue of [`Runtime::take_suspects`].
    pub fn on_suspect(&mut self, f: impl FnMut(NodeId) + 'static) {
        self.core.borrow_mut().st.on_suspect = Some(Box::new(f));
    }

    /// Gives the endpoint back (for example to a next phase) once the runtime is done.
    /// A runtime whose workers still hold it comes back whole, as the error.
    #[allow(clippy::result_large_err)]
    pub fn into_endpoint(self) -> Result<Box<dyn Endpoint>, Runtime> {
        drop(self.tasks);
        match Rc::try_unwrap(self.core) {
            Ok(c) => Ok(c.into_inner().ep),
            Err(core) => Err(Runtime {
                core,
                tasks: Vec::new(),
                wakes: self.wakes,
                wakers: self.wakers,
                any_woken: self.any_woken,
                run_buf: self.run_buf,
                live: 0,
                idle: 0,
            }),
        }
    }
}

impl State {
    fn make_ready(&mut self, id: u16) {
        let co = &mut self.cos[id as usize];
        if !co.in_ready {
            co.in_ready = true;
            self.ready.push(id);
        }
    }

    #[inline]
    fn ep_index(&self, a: EndpointAddr) -> usize {
        a.node as usize * self.threads + a.thread as usize
    }

    fn send_tx(&mut self, ep: &mut dyn Endpoint) {
        let (n, r) = self.tx.send(ep, self.threads);
        self.stats.tx_datagrams += n as u64;
        self.stats.tx_doorbells += 1;
        if r.is_err() {
            // Only misuse errors exist here; requests stay live and are retransmitted.
            self.stats.send_errors += 1;
        }
    }

    #[inline]
    fn queue(
        &mut self,
        id: u16,
        addr: EndpointAddr,
        rtype: u8,
        payload: &[u8],
    ) -> Result<ReqHandle, RpcError> {
        if !self.cluster.contains(addr) {
            return Err(RpcError::UnknownDestination(addr));
        }
        let d = self.ep_index(addr);
        self.queue_index(id, d, rtype, payload)
    }

    /// Queues a request to endpoint index `d` (inside the cluster).
    #[inline(always)]
    fn queue_index(
        &mut self,
        id: u16,
        d: usize,
        rtype: u8,
        payload: &[u8],
    ) -> Result<ReqHandle, RpcError> {
        if payload.len() > self.max_message {
            return Err(RpcError::TooLarge {
                len: payload.len(),
                max: self.max_message,
            });
        }
        let d = d as u32;
        let co = &mut self.cos[id as usize];
        match co.phase {
            Phase::Building => {}
            Phase::Done => {
                co.reqs.clear();
                co.arena.clear();
                co.rarena.clear();
                co.failed = 0;
                co.phase = Phase::Building;
            }
            Phase::WaitCredit | Phase::InFlight => return Err(RpcError::FlushInProgress),
        }
        let idx = co.reqs.len();
        if idx >= u16::MAX as usize {
            let t = self.threads;
            return Err(RpcError::BatchTooLarge {
                dest: EndpointAddr::new((d as usize / t) as u16, (d as usize % t) as u16),
                datagrams: idx,
                requests: idx,
            });
        }
        if idx == 0 {
            co.dest0 = d;
            co.multi = false;
            co.big = false;
        } else if d != co.dest0 {
            co.multi = true;
        }
        if payload.len() > self.limits.group_cap {
            co.big = true;
            // Offsets into the arena are u32. Only large requests can reach that: below
            // u16::MAX requests of at most one datagram each stay far under 4 GiB.
            if co.arena.len() + wire::ITEM_HDR + payload.len() > u32::MAX as usize {
                let t = self.threads;
                return Err(RpcError::BatchTooLarge {
                    dest: EndpointAddr::new((d as usize / t) as u16, (d as usize % t) as u16),
                    datagrams: idx,
                    requests: idx + 1,
                });
            }
        }
        // The arena holds each request as a group item, ready to be copied; the batch's
        // first starts a part of whatever group it goes into.
        let off = wire::extend_item(&mut co.arena, rtype, payload, idx == 0);
        co.reqs.push(QReq {
            dest: d,
            rtype,
            status: ReqStatus::Queued,
            next: idx as u16 + 1,
            next_co: id,
            off: off as u32,
            len: payload.len() as u32,
            roff: 0,
            rlen: 0,
        });
        Ok(ReqHandle(idx as u16))
    }

    fn flush_poll(&mut self, id: u16) -> Poll<Result<(), RpcError>> {
        let co = &mut self.cos[id as usize];
        match co.phase {
            Phase::Done => return Poll::Ready(Ok(())),
            Phase::InFlight => {
                if co.pending > 0 {
                    return Poll::Pending;
                }
                co.phase = Phase::Done;
                return Poll::Ready(self.batch_result(id));
            }
            Phase::Building | Phase::WaitCredit => {
                if co.reqs.is_empty() {
                    co.phase = Phase::Done;
                    return Poll::Ready(Ok(()));
                }
            }
        }
        match self.try_send(id) {
            Ok(true) => {
                self.cos[id as usize].phase = Phase::InFlight;
                Poll::Pending
            }
            Ok(false) => {
                let co = &mut self.cos[id as usize];
                co.phase = Phase::WaitCredit;
                if !co.waiting_credit {
                    co.waiting_credit = true;
                    self.credit_waiters.push(id);
                }
                self.stats.credit_waits += 1;
                Poll::Pending
            }
            Err(e) => {
                let co = &mut self.cos[id as usize];
                co.phase = Phase::Done;
                for q in co.reqs.iter_mut() {
                    q.status = ReqStatus::Failed;
                }
                Poll::Ready(Err(e))
            }
        }
    }

    #[inline]
    fn batch_result(&self, id: u16) -> Result<(), RpcError> {
        let co = &self.cos[id as usize];
        if co.failed == 0 {
            return Ok(());
        }
        for q in co.reqs.iter() {
            if q.status == ReqStatus::Failed {
                let d = q.dest as usize;
                return Err(RpcError::Timeout {
                    dest: EndpointAddr::new((d / self.threads) as u16, (d % self.threads) as u16),
                });
            }
        }
        Ok(())
    }

    /// Encodes coroutine `id`'s batch into this step's outgoing datagrams (sent with one
    /// doorbell at the end of the step) if every destination has the credits and window
    /// room; Ok(false) if it must wait.
    fn try_send(&mut self, id: u16) -> Result<bool, RpcError> {
        let co = &self.cos[id as usize];
        // The usual case: the batch joins a group of this step as a part (it needs no
        // credit or window entry of its own).
        if !co.multi && !co.big && self.join_group(id) {
            return Ok(true);
        }
        // Fast path: a batch of single-datagram requests to one destination needs at
        // most one credit and one window entry per request.
        let co = &self.cos[id as usize];
        let fast = !co.multi
            && !co.big
            && match self.dests[co.dest0 as usize].as_deref() {
                Some(dest) => {
                    let n = co.reqs.len();
                    n <= dest.credits as usize
                        && n <= self.window - (dest.next_seq - dest.ack) as usize
                }
                None => false,
            };
        if fast {
            self.encode_one_dest(id);
            return Ok(true);
        }
        if !self.check_needs(id)? {
            return Ok(false);
        }
        self.encode_batch(id);
        Ok(true)
    }

    /// Phase 1 of a flush: what the batch needs per destination (mirrors the packing of
    /// `encode_batch` as if every destination started a fresh datagram: starting in a
    /// datagram already open never takes more new ones, so it is an upper bound; window
    /// entries are bounded by the requests). Ok(false) if some destination lacks credits
    /// or window room now.
    #[inline(never)]
    fn check_needs(&mut self, id: u16) -> Result<bool, RpcError> {
        let mtu = self.cluster.mtu;
        let coalesce = self.cfg.coalesce;
        let group_cap = self.limits.group_cap;
        let co = &self.cos[id as usize];
        for q in &co.reqs {
            let d = q.dest as usize;
            let n = &mut self.need[d];
            if n.reqs == 0 {
                self.need_touched.push(q.dest);
            }
            n.reqs += 1;
            let len = q.len as usize;
            if len > group_cap {
                n.dgrams += len.div_ceil(self.limits.seg_payload);
                n.fill = 0;
                n.items = 0;
                continue;
            }
            let item = wire::ITEM_HDR + len;
            if coalesce && n.items > 0 && n.items < wire::MAX_ITEMS && n.fill + item <= mtu {
                // Joins the group.
                n.fill += item;
                n.items += 1;
            } else if coalesce
                && n.fill > 0
                && n.count < wire::MAX_RECORDS
                && n.fill + wire::REC_HDR + item <= mtu
            {
                // A new group in the same datagram.
                n.fill += wire::REC_HDR + item;
                n.count += 1;
                n.items = 1;
            } else {
                n.dgrams += 1;
                n.fill = wire::DGRAM_HDR + wire::REC_HDR + item;
                n.count = 1;
                n.items = 1;
            }
        }
        let mut short = false;
        let mut err = None;
        for &d in &self.need_touched {
            let n = self.need[d as usize];
            self.need[d as usize] = Need::default();
            let dest = self.dests[d as usize]
                .get_or_insert_with(|| Box::new(Dest::new(self.credits, self.window)));
            if n.dgrams > self.credits as usize || n.reqs > self.window {
                let t = self.threads;
                err = Some(RpcError::BatchTooLarge {
                    dest: EndpointAddr::new((d as usize / t) as u16, (d as usize % t) as u16),
                    datagrams: n.dgrams,
                    requests: n.reqs,
                });
            }
            let room = self.window - (dest.next_seq - dest.ack) as usize;
            if n.dgrams > dest.credits as usize || n.reqs > room {
                short = true;
            }
        }
        self.need_touched.clear();
        if let Some(e) = err {
            return Err(e);
        }
        Ok(!short)
    }

    /// Phase 2 of a flush (needs checked): assigns sequence numbers and credits, encodes.
    /// `now` is from this master step (deadlines are coarse: timeout/4 scans). The small
    /// requests to one destination form groups (one seq each); a group may start in a
    /// request datagram to that destination opened earlier in this step (by another
    /// flush): a datagram holds one credit however many flushes share it.
    #[inline(never)]
    fn encode_batch(&mut self, id: u16) {
        let mtu = self.cluster.mtu;
        let coalesce = self.cfg.coalesce;
        let group_cap = self.limits.group_cap;
        let deadline = self.now + self.rto;
        let session = self.session;
        let flush = self.stats.flushes;
        let co = &mut self.cos[id as usize];
        let nreq = co.reqs.len();
        let mut entries = 0u64;
        for i in 0..nreq {
            let q = co.reqs[i];
            let d = q.dest as usize;
            let dest = self.dests[d].as_deref_mut().expect("created in phase 1");
            let (lo, hi) = (q.off as usize, (q.off + q.len) as usize);
            if q.len as usize > group_cap {
                // Alone, in segments, each holding a credit.
                let segs = (hi - lo).div_ceil(self.limits.seg_payload);
                let dg = dest.alloc_dg(segs as u16);
                let seq = dest.open_entry(0, id, i as u16, dg, deadline);
                push_segments(
                    &mut self.tx,
                    d,
                    wire::KIND_REQUEST,
                    session,
                    dest.ack,
                    seq,
                    q.rtype,
                    &co.arena[lo..hi],
                    self.limits.seg_payload,
                    mtu,
                    false,
                );
                entries += 1;
                continue;
            }
            let item = &co.arena[lo - wire::ITEM_HDR..hi];
            let t = &mut self.tx.per[d];
            if coalesce && t.joins_group(flush, item.len(), mtu) {
                t.grow_group(1, item);
                // The group is this flush's: its last request is this worker's.
                co.reqs[t.grp_last as usize].next = i as u16;
                t.grp_last = i as u16;
                dest.win.at_mut(t.grp_seq).count += 1;
                continue;
            }
            // A new group: in the open request datagram if it fits and holds a credit
            // (one holding only retransmissions has none), else in a fresh one.
            if !self.tx.ensure(
                d,
                wire::KIND_REQUEST,
                session,
                dest.ack,
                wire::REC_HDR + item.len(),
                mtu,
                coalesce,
                false,
            ) && self.tx.per[d].cur_dg == NO_SLOT
            {
                self.tx.open_new(d, wire::KIND_REQUEST, session, dest.ack);
            }
            let t = &mut self.tx.per[d];
            if t.cur_dg == NO_SLOT {
                t.cur_dg = dest.alloc_dg(1);
            }
            let seq = dest.open_entry(1, id, i as u16, t.cur_dg, deadline);
            t.put_group(seq, 1, item, flush, id, i as u16);
            entries += 1;
        }
        co.pending = nreq as u32;
        self.inflight += entries;
        self.stats.rpcs_issued += nreq as u64;
        self.stats.flushes += 1;
        if self.next_scan <= self.now {
            self.next_scan = self.now + self.scan_period();
        }
    }

    /// Adds worker `id`'s batch (small requests to one destination) to the last group
    /// of the open datagram to that destination, if another worker's flush built it in
    /// this step and the batch fits, as a new part: no window entry, record or credit of
    /// its own (the group's datagram holds a credit: a flush opened it). Returns whether
    /// it did.
    #[inline(always)]
    fn join_group(&mut self, id: u16) -> bool {
        let co = &self.cos[id as usize];
        let (d, nreq, bytes) = (co.dest0 as usize, co.reqs.len(), co.arena.len());
        let t = &mut self.tx.per[d];
        if !(self.cfg.coalesce
            && t.grp_parts < self.max_parts
            && t.group_has_room(nreq, bytes, self.cluster.mtu))
        {
            return false;
        }
        debug_assert!(t.grp_co != id, "a worker flushes once per step");
        let last = &mut self.cos[t.grp_co as usize].reqs[t.grp_last as usize];
        (last.next, last.next_co) = (0, id);
        t.grow_group(nreq, &self.cos[id as usize].arena);
        t.grp_parts += 1;
        (t.grp_last, t.grp_co) = ((nreq - 1) as u16, id);
        let dest = self.dests[d]
            .as_deref_mut()
            .expect("a flush to it built the group");
        let rec = dest.win.at_mut(t.grp_seq);
        rec.count += nreq as u8;
        rec.parts += 1;
        self.cos[id as usize].pending = nreq as u32;
        self.stats.rpcs_issued += nreq as u64;
        self.stats.flushes += 1;
        self.stats.flushes_joined += 1;
        true
    }

    /// `encode_batch` for a batch of small requests to one destination (the common
    /// case), with the destination's state looked up once. The arena holds the batch as
    /// group items, so each group it forms is a record header plus one copy.
    #[inline(always)]
    fn encode_one_dest(&mut self, id: u16) {
        let mtu = self.cluster.mtu;
        let coalesce = self.cfg.coalesce;
        let deadline = self.now + self.rto;
        let session = self.session;
        let key = open_key(wire::KIND_REQUEST, session);
        let flush = self.stats.flushes;
        let co = &mut self.cos[id as usize];
        let (d, nreq) = (co.dest0 as usize, co.reqs.len());
        let dest = self.dests[d].as_deref_mut().expect("checked by try_send");
        let tx = &mut self.tx;
        // Without coalescing every request is a group of one in its own datagram.
        let most = if coalesce { wire::MAX_ITEMS } else { 1 };
        let mut entries = 0u32;
        let mut i = 0;
        // The usual case first (after `join_group`): the whole batch, one group, joins
        // the open datagram.
        let t = &mut tx.per[d];
        if coalesce
            && nreq <= wire::MAX_ITEMS
            && t.cur_dg != NO_SLOT
            && t.has_room(key, wire::REC_HDR + co.arena.len(), mtu)
        {
            let seq = dest.open_entry(nreq as u8, id, 0, t.cur_dg, deadline);
            t.put_group(seq, nreq as u8, &co.arena, flush, id, (nreq - 1) as u16);
            (entries, i) = (1, nreq);
        }
        while i < nreq {
            let lo = co.reqs[i].off as usize - wire::ITEM_HDR;
            let first = co.reqs[i].off as usize + co.reqs[i].len as usize - lo;
            // Join the open request datagram if the first request fits and it holds a
            // credit (one holding only retransmissions has none), else open one.
            let t = &tx.per[d];
            if !(coalesce && t.cur_dg != NO_SLOT && t.has_room(key, wire::REC_HDR + first, mtu)) {
                tx.open_new(d, wire::KIND_REQUEST, session, dest.ack);
                tx.per[d].cur_dg = dest.alloc_dg(1);
            }
            let t = &mut tx.per[d];
            // The requests that fit: a run of the arena (usually all of it).
            let room = mtu - (t.len - t.open) - wire::REC_HDR;
            let (mut j, mut hi) = (i + 1, lo + first);
            if i == 0 && nreq <= most && co.arena.len() <= room {
                (j, hi) = (nreq, co.arena.len());
            }
            let last = nreq.min(i + most);
            while j < last {
                let e = (co.reqs[j].off + co.reqs[j].len) as usize;
                if e - lo > room {
                    break;
                }
                hi = e;
                j += 1;
            }
            // The group's requests are consecutive: `QReq::next` as queued.
            let seq = dest.open_entry((j - i) as u8, id, i as u16, t.cur_dg, deadline);
            t.put_group(
                seq,
                (j - i) as u8,
                &co.arena[lo..hi],
                flush,
                id,
                (j - 1) as u16,
            );
            entries += 1;
            i = j;
        }
        co.pending = nreq as u32;
        self.inflight += entries as u64;
        self.stats.rpcs_issued += nreq as u64;
        self.stats.flushes += 1;
        if self.next_scan <= self.now {
            self.next_scan = self.now + self.scan_period();
        }
    }

    fn scan_period(&self) -> u64 {
        (self.rto / 4).max(50_000)
    }

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
            self.client_window(s, &hdr);
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
            if hdr.session != self.session || self.dests[s].is_none() {
                // Every record of the datagram is a response this runtime never asked for.
                self.stats.rx_unknown_response += hdr.count as u64;
                return;
            }
            self.on_responses(s, recs);
        }
    }

    /// The server window of client `s`, brought up to date with a request datagram's
    /// header (session and acknowledged watermark).
    #[inline]
    fn client_window(&mut self, s: usize, hdr: &wire::Header) {
        let window = self.window;
        let win = self.clients[s].get_or_insert_with(|| {
            Box::new(ClientWin {
                session: hdr.session,
                base: 0,
                slots: SeqArray::new(window, |_| Served {
                    seq: 0,
                    tag: 0,
                    segmented: false,
                    group: false,
                    sent_at: 0,
                    resp: Vec::new(),
                }),
            })
        });
        if win.session != hdr.session {
            // A new incarnation of the client: its old requests are void.
            win.session = hdr.session;
            win.base = 0;
            for sl in win.slots.items.iter_mut() {
                sl.seq = 0;
            }
        }
        win.base = win.base.max(hdr.ack);
    }

    #[inline]
    fn on_request(
        &mut self,
        s: usize,
        src: EndpointAddr,
        hdr: &wire::Header,
        r: &wire::Record<'_>,
    ) {
        let window = self.window;
        let win = self.clients[s].as_deref_mut().expect("client_window first");
        if r.seq < win.base {
            self.stats.stale_requests += 1;
            return;
        }
        if r.seq - win.base >= window as u64 {
            self.stats.out_of_window_requests += 1;
            return;
        }
        let sv = win.slots.at(r.seq);
        if sv.seq == r.seq {
            // Executed before: resend the cached response, never rerun the handler. A
            // duplicate must have the original's form, gets the response once (a
            // segmented one at its first segment), and at most once per scan period: a
            // real client retransmits only after its timeout, and nobody can make this
            // server resend a large response faster than it would answer new requests.
            self.stats.duplicate_requests += 1;
            if r.seg.is_some() == sv.segmented
                && r.group == sv.group
                && r.seg.is_none_or(|g| g.offset == 0)
            {
                // A fresh clock: the step's is read after the poll, and a thread that
                // was descheduled would hold a stale one and turn real retransmissions
                // away.
                let now = self.clock.now_ns();
                if now >= sv.sent_at.saturating_add(self.scan_period()) {
                    self.respond_cached(s, hdr.session, r.seq, now);
                }
            }
            return;
        }
        if r.group {
            // A client never segments a group, and runs no handler of a malformed one.
            let items = match r.seg.is_none() && r.tag > 0 {
                true => wire::request_items(r.payload, r.tag as usize, self.max_parts as usize),
                false => None,
            };
            let Some(items) = items else {
                self.stats.rx_malformed += 1;
                return;
            };
            self.serve_group(s, src, hdr.session, r.seq, r.tag, items);
            return;
        }
        if r.seg.is_some() {
            self.on_segmented_request(s, src, hdr, r);
            return;
        }
        self.serve(s, src, hdr.session, r.seq, r.tag, r.payload, false);
    }

    /// Runs the handler of client `s`'s request `seq` (never run before), keeps its
    /// response in the request's slot of the client window and sends it.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn serve(
        &mut self,
        s: usize,
        src: EndpointAddr,
        session: u32,
        seq: u64,
        tag: u8,
        payload: &[u8],
        segmented: bool,
    ) {
        let win = self.clients[s].as_deref_mut().expect("client_window first");
        let sv = win.slots.at_mut(seq);
        sv.seq = seq;
        sv.segmented = segmented;
        sv.group = false;
        sv.sent_at = self.now;
        sv.resp.clear();
        let info = RequestInfo {
            src,
            rtype: tag,
            seq,
        };
        sv.tag = run_handler(
            &mut self.handlers[tag as usize],
            &mut self.stats,
            &info,
            payload,
            &mut sv.resp,
            self.max_message,
        );
        send_response(&mut self.tx, self.limits, s, session, seq, sv);
    }

    /// Runs the handlers of client `s`'s group `seq` (checked, never run before) in
    /// order, keeps their responses as one group in the request's slot of the client
    /// window and sends it. The responses of one part of a group (one worker's batch)
    /// share `max_message` bytes: a response that would overflow them gets `TooLarge`.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn serve_group(
        &mut self,
        s: usize,
        src: EndpointAddr,
        session: u32,
        seq: u64,
        count: u8,
        mut items: wire::Items<'_>,
    ) {
        let win = self.clients[s].as_deref_mut().expect("client_window first");
        let sv = win.slots.at_mut(seq);
        sv.seq = seq;
        sv.tag = count;
        sv.segmented = false;
        sv.group = true;
        sv.sent_at = self.now;
        sv.resp.clear();
        let mut info = RequestInfo { src, rtype: 0, seq };
        // Where the current part's responses start.
        let mut part = 0;
        while items.len_left() > 0 {
            if items.starts_part() {
                part = sv.resp.len();
            }
            let Some((rtype, payload)) = items.next() else {
                break;
            };
            info.rtype = rtype;
            // The item's header first (patched after), then the handler writes its
            // response in place.
            let at = wire::open_item(&mut sv.resp);
            // The part's budget. The whole response stays within the wire's limit
            // because this server accepts at most `max_parts` parts (see there), each at
            // most `max_message` plus the headers of items that found it spent.
            let room = self.max_message.saturating_sub(at - part + wire::ITEM_HDR);
            let status = run_handler(
                &mut self.handlers[rtype as usize],
                &mut self.stats,
                &info,
                payload,
                &mut sv.resp,
                room,
            );
            wire::close_item(&mut sv.resp, at, status);
        }
        send_response(&mut self.tx, self.limits, s, session, seq, sv);
    }

    /// Sends the response kept in the slot of client `s`'s request `seq`.
    #[inline(always)]
    fn respond_cached(&mut self, s: usize, session: u32, seq: u64, now: u64) {
        let sv = self.clients[s]
            .as_deref_mut()
            .expect("client_window first")
            .slots
            .at_mut(seq);
        sv.sent_at = now;
        send_response(&mut self.tx, self.limits, s, session, seq, sv);
    }

    /// A segment of a request not executed before: runs the handler once the whole
    /// message is in.
    #[inline(never)]
    fn on_segmented_request(
        &mut self,
        s: usize,
        src: EndpointAddr,
        hdr: &wire::Header,
        r: &wire::Record<'_>,
    ) {
        let seg = r.seg.expect("segmented");
        let max = self.max_message;
        let Some(i) = self.reassemble(s, wire::KIND_REQUEST, hdr.session, r, seg, max) else {
            return;
        };
        // Borrow the buffer out of the pool (no allocation) while the handler runs.
        self.reasm[i].active = false;
        let whole = std::mem::take(&mut self.reasm[i].buf);
        let total = self.reasm[i].total as usize;
        self.serve(s, src, hdr.session, r.seq, r.tag, &whole[..total], true);
        self.reasm[i].buf = whole;
    }

    /// The response records of one datagram from destination `s` (its session is ours).
    /// Whole responses settle inline, with the destination looked up once and the
    /// counters added once per datagram; segments go through reassembly.
    #[inline(always)]
    fn on_responses(&mut self, s: usize, recs: wire::Records<'_>) {
        let (mut entries, mut reqs) = (0u64, 0u64);
        let mut dest = self.dests[s]
            .as_deref_mut()
            .expect("checked by on_datagram");
        for r in recs {
            if r.seq >= dest.next_seq {
                self.stats.rx_unknown_response += 1;
                continue;
            }
            let rec = dest.win.at(r.seq);
            if r.seq < dest.ack || !rec.live || rec.seq != r.seq {
                self.stats.rx_duplicate_response += 1;
                continue;
            }
            // A group's response is a group of as many items; a lone request's is not.
            let count = rec.count;
            if r.group != (count > 0) || (r.group && r.tag != count) {
                self.stats.rx_malformed += 1;
                continue;
            }
            if r.group {
                if r.seg.is_some() {
                    self.on_segmented_response(s, &r, ReqStatus::Ok);
                    dest = self.dests[s]
                        .as_deref_mut()
                        .expect("checked by on_datagram");
                } else if settle_group(
                    dest,
                    r.seq,
                    r.payload,
                    &mut self.cos,
                    &mut self.ready,
                    &mut self.credit_waiters,
                ) {
                    entries += 1;
                    reqs += count as u64;
                } else {
                    self.stats.rx_malformed += 1;
                }
                continue;
            }
            let Some(status) = status_of(r.tag) else {
                self.stats.rx_malformed += 1;
                continue;
            };
            if r.seg.is_some() {
                self.on_segmented_response(s, &r, status);
                dest = self.dests[s]
                    .as_deref_mut()
                    .expect("checked by on_datagram");
                continue;
            }
            entries += 1;
            reqs += 1;
            settle_in(
                dest,
                r.seq,
                status,
                Some(r.payload),
                &mut self.cos,
                &mut self.ready,
                &mut self.credit_waiters,
            );
        }
        if entries > 0 {
            dest.inflight -= entries as u32;
            self.inflight -= entries;
            self.stats.rpcs_completed += reqs;
        }
    }

    /// A segment of a live request's (or group's) response: settles it once the message
    /// is whole.
    #[inline(never)]
    fn on_segmented_response(&mut self, s: usize, r: &wire::Record<'_>, status: ReqStatus) {
        let seg = r.seg.expect("segmented");
        let session = self.session;
        // A group's response takes up to `max_message` per part, plus the header of
        // every item (one that found its part's budget spent still has one). The caller
        // checked that `r.seq` is live.
        let (count, parts) = self.dests[s]
            .as_deref()
            .map_or((0, 1), |d| (d.win.at(r.seq).count, d.win.at(r.seq).parts));
        let max = match count {
            0 => self.max_message,
            n => self.max_message * parts.max(1) as usize + n as usize * wire::ITEM_HDR,
        };
        let Some(i) = self.reassemble(s, wire::KIND_RESPONSE, session, r, seg, max) else {
            return;
        };
        let ra = &mut self.reasm[i];
        ra.active = false;
        let dest = self.dests[s].as_deref_mut().expect("checked");
        let rec = *dest.win.at(r.seq);
        let body = &ra.buf[..ra.total as usize];
        if rec.count > 0 {
            let (cos, ready, waiters) = (&mut self.cos, &mut self.ready, &mut self.credit_waiters);
            if settle_group(dest, r.seq, body, cos, ready, waiters) {
                dest.inflight -= 1;
                self.inflight -= 1;
                self.stats.rpcs_completed += rec.count as u64;
            } else {
                self.stats.rx_malformed += 1;
            }
            return;
        }
        let co = &mut self.cos[rec.co as usize];
        let q = &mut co.reqs[rec.idx as usize];
        q.roff = co.rarena.len() as u32;
        q.rlen = ra.total;
        co.rarena.extend_from_slice(body);
        self.settle(s, r.seq, status);
    }

    /// Completes (or fails) the live window entry `seq` to destination `s` with every
    /// request it carries: frees the entry and, with the last entry of its datagram, the
    /// datagram's credits.
    fn settle(&mut self, s: usize, seq: u64, status: ReqStatus) {
        let dest = self.dests[s]
            .as_deref_mut()
            .expect("settle of a known destination");
        let n = settle_in(
            dest,
            seq,
            status,
            None,
            &mut self.cos,
            &mut self.ready,
            &mut self.credit_waiters,
        ) as u64;
        dest.inflight -= 1;
        self.inflight -= 1;
        if status == ReqStatus::Failed {
            self.stats.rpcs_failed += n;
        } else {
            self.stats.rpcs_completed += n;
        }
    }

    /// Retransmits requests past their deadline; fails them (and suspects their
    /// destination) once the retries are used up.
    #[inline(never)]
    fn scan_timeouts(&mut self) {
        let now = self.now;
        self.next_scan = now + self.scan_period();
        let mtu = self.cluster.mtu;
        for d in 0..self.dests.len() {
            let Some(dest) = self.dests[d].as_mut() else {
                continue;
            };
            if dest.inflight == 0 {
                continue;
            }
            let mut give_up = false;
            for seq in dest.ack..dest.next_seq {
                let rec = dest.win.at_mut(seq);
                if !rec.live || rec.deadline > now {
                    continue;
                }
                if rec.retries >= self.cfg.max_retries {
                    give_up = true;
                    break;
                }
                rec.retries += 1;
                rec.deadline = now + self.rto;
                self.stats.retransmits += 1;
                let co = &self.cos[rec.co as usize];
                let q = co.reqs[rec.idx as usize];
                let cos = &self.cos;
                if rec.count == 0 {
                    // A lone request, sent in segments.
                    push_segments(
                        &mut self.tx,
                        d,
                        wire::KIND_REQUEST,
                        self.session,
                        dest.ack,
                        seq,
                        q.rtype,
                        &co.arena[q.off as usize..(q.off + q.len) as usize],
                        self.limits.seg_payload,
                        mtu,
                        false,
                    );
                    continue;
                }
                // A group, rebuilt from its requests' items (it fit one datagram); its
                // parts' first items carry their flags in the workers' arenas.
                let (mut body, mut c, mut k) = (0, rec.co, rec.idx);
                for _ in 0..rec.count {
                    let q = &cos[c as usize].reqs[k as usize];
                    body += wire::ITEM_HDR + q.len as usize;
                    (c, k) = (q.next_co, q.next);
                }
                self.tx.ensure(
                    d,
                    wire::KIND_REQUEST,
                    self.session,
                    dest.ack,
                    wire::REC_HDR + body,
                    mtu,
                    self.cfg.coalesce,
                    false,
                );
                let t = &mut self.tx.per[d];
                let pos = t.len;
                wire::write_group_header(&mut t.buf, pos, seq, rec.count, body as u16);
                let (mut at, mut c, mut k) = (pos + wire::REC_HDR, rec.co, rec.idx);
                for _ in 0..rec.count {
                    let co = &cos[c as usize];
                    let q = &co.reqs[k as usize];
                    let (lo, hi) = (q.off as usize - wire::ITEM_HDR, (q.off + q.len) as usize);
                    t.buf[at..at + hi - lo].copy_from_slice(&co.arena[lo..hi]);
                    at += hi - lo;
                    (c, k) = (q.next_co, q.next);
                }
                t.len = at;
                t.open_count += 1;
            }
            if give_up {
                let node = (d / self.threads) as NodeId;
                self.stats.suspected += 1;
                self.suspects.push(node);
                if let Some(cb) = self.on_suspect.as_mut() {
                    cb(node);
                }
                // Every request to it fails; their workers see RpcError::Timeout.
                let (lo, hi) = (dest.ack, dest.next_seq);
                for seq in lo..hi {
                    let live = self.dests[d].as_ref().map(|x| {
                        let r = x.win.at(seq);
                        r.live && r.seq == seq
                    });
                    if live == Some(true) {
                        self.settle(d, seq, ReqStatus::Failed);
                    }
                }
            }
        }
    }

    /// Adds a segment of a message of at most `max` bytes; returns the reassembly slot
    /// once its message is complete.
    fn reassemble(
        &mut self,
        src: usize,
        kind: u8,
        session: u32,
        r: &wire::Record<'_>,
        seg: Seg,
        max: usize,
    ) -> Option<usize> {
        let sp = self.limits.seg_payload;
        let total = seg.total as usize;
        let off = seg.offset as usize;
        // Segments are cut at fixed boundaries by a sender of the same MTU.
        if total > max || !off.is_multiple_of(sp) || r.payload.len() != sp.min(total - off) {
            self.stats.rx_bad_segment += 1;
            return None;
        }
        let found = self.reasm.iter().position(|x| {
            x.active
                && x.src == src as u32
                && x.kind == kind
                && x.session == session
                && x.seq == r.seq
        });
        let i = match found {
            Some(i) => {
                let x = &self.reasm[i];
                if x.total != seg.total || x.tag != r.tag {
                    self.stats.rx_bad_segment += 1;
                    return None;
                }
                i
            }
            None => {
                let i = if let Some(i) = self.reasm.iter().position(|x| !x.active) {
                    i
                } else if self.reasm.len() < self.cfg.reassembly_slots.max(1) {
                    self.reasm.push(Reasm {
                        active: false,
                        src: 0,
                        kind: 0,
                        session: 0,
                        seq: 0,
                        tag: 0,
                        total: 0,
                        got: 0,
                        bits: Vec::new(),
                        buf: Vec::new(),
                        touched: 0,
                    });
                    self.reasm.len() - 1
                } else {
                    // Full: evict the oldest message of the source holding the most
                    // slots, so that one source (a flood of first segments) cannot
                    // starve the others' messages.
                    self.stats.reassembly_evicted += 1;
                    // One pass to count the slots per source (scratch indexed by source).
                    let held = &mut self.reasm_held;
                    let mut hog = 0;
                    for x in &self.reasm {
                        held[x.src as usize] += 1;
                        if held[x.src as usize] > held[hog as usize] {
                            hog = x.src;
                        }
                    }
                    for x in &self.reasm {
                        held[x.src as usize] = 0;
                    }
                    let (i, _) = self
                        .reasm
                        .iter()
                        .enumerate()
                        .filter(|(_, x)| x.src == hog)
                        .min_by_key(|(_, x)| x.touched)?;
                    i
                };
                let x = &mut self.reasm[i];
                x.active = true;
                x.src = src as u32;
                x.kind = kind;
                x.session = session;
                x.seq = r.seq;
                x.tag = r.tag;
                x.total = seg.total;
                x.got = 0;
                x.bits.clear();
                x.bits.resize(total.div_ceil(sp).div_ceil(64), 0);
                if x.buf.len() < total {
                    x.buf.resize(total, 0);
                }
                i
            }
        };
        let x = &mut self.reasm[i];
        x.touched = self.now;
        let k = off / sp;
        if x.bits[k / 64] & (1 << (k % 64)) != 0 {
            return None; // duplicate segment
        }
        x.bits[k / 64] |= 1 << (k % 64);
        x.buf[off..off + r.payload.len()].copy_from_slice(r.payload);
        x.got += r.payload.len() as u32;
        (x.got == x.total).then_some(i)
    }
}

/// The response status of a record tag (None: no such status).
#[inline(always)]
fn status_of(tag: u8) -> Option<ReqStatus> {
    match tag {
        wire::STATUS_OK => Some(ReqStatus::Ok),
        wire::STATUS_NO_HANDLER => Some(ReqStatus::NoHandler),
        wire::STATUS_TOO_LARGE => Some(ReqStatus::TooLarge),
        _ => None,
    }
}

/// Frees the live window entry `seq` of `dest`: moves the acknowledged watermark and,
/// with the last entry of its datagram, returns the datagram's credits. Returns the
/// entry.
#[inline(always)]
fn retire(
    dest: &mut Dest,
    seq: u64,
    cos: &mut [Co],
    ready: &mut Vec<u16>,
    credit_waiters: &mut Vec<u16>,
) -> ReqRec {
    let rec = dest.win.at_mut(seq);
    rec.live = false;
    let rec = *rec;
    // The entry at `ack` is live unless it is this one (ack is the lowest unsettled
    // seq), so the watermark moves only when the oldest entry settles.
    if seq == dest.ack {
        dest.ack += 1;
        while dest.ack < dest.next_seq && !dest.win.at(dest.ack).live {
            dest.ack += 1;
        }
    }
    let slot = &mut dest.dg[rec.dg as usize];
    slot.remaining -= 1;
    if slot.remaining == 0 {
        dest.credits += slot.weight as u32;
        dest.dg_free.push(rec.dg);
        if !credit_waiters.is_empty() {
            wake_credit_waiters(cos, ready, credit_waiters);
        }
    }
    rec
}

/// Counts `n` settled requests out of worker `co_id`'s batch; queues the worker once
/// its batch is complete.
#[inline(always)]
fn batch_settled(co: &mut Co, co_id: u16, n: u32, ready: &mut Vec<u16>) {
    co.pending -= n;
    if co.pending == 0 && !co.in_ready {
        co.in_ready = true;
        ready.push(co_id);
    }
}

/// Completes (or fails) the live window entry `seq` of `dest` (see [`retire`]) with
/// `status` for every request it carries, and `resp` (a whole response) as the
/// response of a lone request. Returns the requests settled. The caller counts the
/// entry out of `inflight` (its own and the destination's) and the requests into the
/// completed or failed counters.
#[inline(always)]
fn settle_in(
    dest: &mut Dest,
    seq: u64,
    status: ReqStatus,
    resp: Option<&[u8]>,
    cos: &mut [Co],
    ready: &mut Vec<u16>,
    credit_waiters: &mut Vec<u16>,
) -> u32 {
    let rec = retire(dest, seq, cos, ready, credit_waiters);
    let n = (rec.count as u32).max(1);
    if let Some(p) = resp {
        let co = &mut cos[rec.co as usize];
        let q = &mut co.reqs[rec.idx as usize];
        q.roff = co.rarena.len() as u32;
        q.rlen = p.len() as u32;
        wire::extend_bytes(&mut co.rarena, p);
    }
    // The items of one worker are consecutive in a group (its part).
    let (mut c, mut k, mut run) = (rec.co, rec.idx, 0);
    for left in (0..n).rev() {
        let co = &mut cos[c as usize];
        let q = &mut co.reqs[k as usize];
        q.status = status;
        run += 1;
        let (nc, nk) = (q.next_co, q.next);
        if left == 0 || nc != c {
            if status == ReqStatus::Failed {
                co.failed += run;
            }
            batch_settled(co, c, run, ready);
            run = 0;
        }
        (c, k) = (nc, nk);
    }
    n
}

/// Completes the live group `seq` of `dest` with its response `body`; false (and
/// nothing changed) if the body is not one well-formed response per request.
#[inline(always)]
fn settle_group(
    dest: &mut Dest,
    seq: u64,
    body: &[u8],
    cos: &mut [Co],
    ready: &mut Vec<u16>,
    credit_waiters: &mut Vec<u16>,
) -> bool {
    let count = dest.win.at(seq).count as usize;
    let Some(mut items) = wire::group_items(body, count, |t| t <= wire::STATUS_MAX) else {
        return false;
    };
    let rec = retire(dest, seq, cos, ready, credit_waiters);
    // Part by part (a worker's consecutive items): one copy into the worker's response
    // arena, of which each request's response is a range.
    let b0 = body.as_ptr() as usize;
    let (mut c, mut k, mut lo) = (rec.co, rec.idx, 0usize);
    while items.len_left() > 0 {
        let co = &mut cos[c as usize];
        let base = co.rarena.len();
        let (mut run, mut hi, mut next_co) = (0u32, lo, c);
        for (tag, payload) in items.by_ref() {
            let q = &mut co.reqs[k as usize];
            let at = payload.as_ptr() as usize - b0;
            q.roff = (base + at - lo) as u32;
            q.rlen = payload.len() as u32;
            q.status = status_of(tag).unwrap_or(ReqStatus::TooLarge);
            (run, hi) = (run + 1, at + payload.len());
            (next_co, k) = (q.next_co, q.next);
            if next_co != c {
                break;
            }
        }
        wire::extend_bytes(&mut co.rarena, &body[lo..hi]);
        batch_settled(co, c, run, ready);
        (c, lo) = (next_co, hi);
    }
    true
}

#[inline(never)]
fn wake_credit_waiters(cos: &mut [Co], ready: &mut Vec<u16>, credit_waiters: &mut Vec<u16>) {
    for &w in credit_waiters.iter() {
        let co = &mut cos[w as usize];
        co.waiting_credit = false;
        if !co.in_ready {
            co.in_ready = true;
            ready.push(w);
        }
    }
    credit_waiters.clear();
}

#[allow(clippy::too_many_arguments)]
fn push_segments(
    tx: &mut Tx,
    d: usize,
    kind: u8,
    session: u32,
    ack: u64,
    seq: u64,
    tag: u8,
    payload: &[u8],
    sp: usize,
    mtu: usize,
    group: bool,
) {
    let total = payload.len() as u32;
    for (k, chunk) in payload.chunks(sp).enumerate() {
        tx.ensure(
            d,
            kind,
            session,
            ack,
            wire::record_len(chunk.len(), true),
            mtu,
            false,
            true,
        );
        tx.push(
            d,
            seq,
            tag,
            Some(Seg {
                total,
                offset: (k * sp) as u32,
            }),
            group,
            chunk,
        );
        tx.close(d);
    }
}

/// Runs the handler of a request (if any), appending its response to `resp`; returns
/// the response status. A response over `max` bytes is dropped.
#[inline(always)]
fn run_handler(
    h: &mut Option<Handler>,
    stats: &mut RpcStats,
    info: &RequestInfo,
    payload: &[u8],
    resp: &mut Vec<u8>,
    max: usize,
) -> u8 {
    match h.as_mut() {
        Some(h) => {
            stats.requests_served += 1;
            let mut r = Reply::new(resp);
            h(info, payload, &mut r);
            if r.len() > max {
                r.clear();
                wire::STATUS_TOO_LARGE
            } else {
                wire::STATUS_OK
            }
        }
        None => {
            stats.no_handler += 1;
            wire::STATUS_NO_HANDLER
        }
    }
}

/// What a response is cut to: one record up to `single_cap` bytes, else segments of
/// `seg_payload` bytes.
#[derive(Clone, Copy)]
struct SendLimits {
    single_cap: usize,
    /// Largest request that travels in a group (one item in a fresh datagram); larger
    /// ones are sent alone, in segments.
    group_cap: usize,
    seg_payload: usize,
    mtu: usize,
    coalesce: bool,
}

/// Sends the response kept in `sv` (of request `seq` from client `d`).
#[inline(always)]
fn send_response(tx: &mut Tx, lim: SendLimits, d: usize, session: u32, seq: u64, sv: &Served) {
    let (tag, resp) = (sv.tag, &sv.resp[..]);
    if resp.len() <= lim.single_cap {
        tx.ensure(
            d,
            wire::KIND_RESPONSE,
            session,
            0,
            wire::record_len(resp.len(), false),
            lim.mtu,
            lim.coalesce,
            false,
        );
        tx.push(d, seq, tag, None, sv.group, resp);
    } else {
        push_segments(
            tx,
            d,
            wire::KIND_RESPONSE,
            session,
            0,
            seq,
            tag,
            resp,
            lim.seg_payload,
            lim.mtu,
            sv.group,
        );
    }
}

impl Ctx {
    /// Queues a request to `node` (thread chosen by the [`ThreadMap`]) without I/O.
    #[inline]
    pub fn queue(&self, node: NodeId, rtype: u8, payload: &[u8]) -> Result<ReqHandle, RpcError> {
        let mut core = self.core.borrow_mut();
        let st = &mut core.st;
        // The thread is valid for every node (checked when the runtime was built).
        if node >= st.cluster.nodes {
            return Err(RpcError::UnknownDestination(EndpointAddr::new(
                node,
                st.queue_thread,
            )));
        }
        let d = node as usize * st.threads + st.queue_thread as usize;
        st.queue_index(self.id, d, rtype, payload)
    }

    /// Queues a request to an explicit endpoint (credits assume the [`ThreadMap`]).
    pub fn queue_to(
        &self,
        addr: EndpointAddr,
        rtype: u8,
        payload: &[u8],
    ) -> Result<ReqHandle, RpcError> {
        self.core
            .borrow_mut()
            .st
            .queue(self.id, addr, rtype, payload)
    }

    /// Sends the queued batch with one doorbell and resolves when every response (or
    /// failure) is in. `Err(Timeout)` if some destination was suspected.
    pub fn flush(&self) -> Flush<'_> {
        Flush { ctx: self }
    }

    /// Runs `f` on the response to `h` (valid until the next `queue`).
    pub fn response<R>(&self, h: ReqHandle, f: impl FnOnce(&[u8]) -> R) -> Result<R, RpcError> {
        let core = self.core.borrow();
        let st = &core.st;
        let co = &st.cos[self.id as usize];
        let Some(q) = co.reqs.get(h.0 as usize) else {
            return Err(RpcError::NotReady);
        };
        match q.status {
            ReqStatus::Ok => Ok(f(&co.rarena[q.roff as usize..(q.roff + q.rlen) as usize])),
            ReqStatus::NoHandler => Err(RpcError::NoHandler { rtype: q.rtype }),
            ReqStatus::TooLarge => Err(RpcError::ResponseTooLarge),
            ReqStatus::Failed => {
                let d = q.dest as usize;
                Err(RpcError::Timeout {
                    dest: EndpointAddr::new((d / st.threads) as u16, (d % st.threads) as u16),
                })
            }
            _ => Err(RpcError::NotReady),
        }
    }

    /// Yields to the master once (the coroutine is resumed at the next step).
    pub fn yield_now(&self) -> YieldNow<'_> {
        YieldNow {
            ctx: self,
            yielded: false,
        }
    }

    /// The runtime's clock.
    pub fn now_ns(&self) -> u64 {
        self.core.borrow().st.clock.now_ns()
    }

    /// The time the runtime read at the start of the current master step: no clock read,
    /// and within one step of [`Ctx::now_ns`] for a coroutine the step resumed (a step
    /// that resumes coroutines always reads the clock). For per-transaction timings,
    /// where a clock read per phase would cost more than the phase's bookkeeping.
    #[inline]
    pub fn step_ns(&self) -> u64 {
        self.core.borrow().st.now
    }

    pub fn addr(&self) -> EndpointAddr {
        self.core.borrow().st.me
    }

    pub fn cluster(&self) -> ClusterConfig {
        self.core.borrow().st.cluster.clone()
    }

    /// This coroutine's index in its runtime.
    pub fn id(&self) -> u16 {
        self.id
    }
}

/// Future of [`Ctx::flush`].
pub struct Flush<'a> {
    ctx: &'a Ctx,
}

impl Future for Flush<'_> {
    type Output = Result<(), RpcError>;
    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.ctx.core.borrow_mut().st.flush_poll(self.ctx.id)
    }
}

/// Future of [`Ctx::yield_now`].
pub struct YieldNow<'a> {
    ctx: &'a Ctx,
    yielded: bool,
}

impl Future for YieldNow<'_> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        if self.yielded {
            return Poll::Ready(());
        }
        self.yielded = true;
        self.ctx.core.borrow_mut().st.make_ready(self.ctx.id);
        Poll::Pending
    }
}
