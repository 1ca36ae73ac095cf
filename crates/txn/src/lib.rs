//! # ambidex-txn: serializable distributed transactions
//!
//! Optimistic concurrency control with two-phase commit over a coordinator log and
//! primary-backup replication (FaSST §5, Figure 6; FaRM §4). Every phase issues its
//! work through a [`Policy`]: two-sided RPCs or one-sided verbs, every choice of DrTM+H
//! Table 4, with the presets `fasst`, `farm`, `drtm-r` and `drtm-h`
//! (`docs/transactions.md` has the design).
//!
//! - placement (`ambidex_cluster`): a key hashes to a partition, whose replica list
//!   (primary first) the configuration gives; each thread caches its node's
//!   configuration and each transaction runs in one.
//! - [`db`]: one node's share of every table, in the store.
//! - [`actions`]: what the protocol does to one item (read, lock, check a version,
//!   install, release), shared by the coordinator's local path and the handlers.
//! - `txn`: the worker-coroutine API ([`Txn`]) and the order of the phases.
//! - `phases`: one module per phase (execute, lock, validate, log, commit).
//! - [`policy`]: how each phase issues its work.
//! - [`messages`]: one type per request and response, encoding and decoding together.
//! - [`handlers`]: the primaries', backups' and log replicas' request handlers.
//! - [`catalog_exchange`]: nodes without a launcher ask each other for their
//!   descriptors (the catalog) by RPC.
//! - [`log`]: in-memory log replicas (memory is assumed battery-backed, as in the
//!   papers), truncated once a transaction is installed everywhere.
//! - [`log_ring`]: the one-sided log (`Log::Write`): rings in registered memory that
//!   coordinators WRITE their records into, truncated lazily by RPC.
//! - `onesided`: what the one-sided phases need of remote tables (descriptors, item
//!   shapes, bucket walks, install images).
//! - `committer`: passive ACK's committer coroutines.
//! - [`recovery`]: deciding and installing the transactions in flight on a new
//!   configuration from the surviving log records; releasing failed coordinators'
//!   locks.
//! - [`runner`]: brings a cluster's node threads up (in-process runs and node
//!   processes).
//! - [`stats`]: what the layer counts ([`TxnStats`]); [`history`]: recording
//!   histories.
//! - `error`: the errors of start-up, loading and the end of a run (re-exported here).
//!
//! Modules named without a link are internal to the crate; what other crates use of
//! them is re-exported here.
//!
//! Locks carry their owner in the store's lock word (`ambidex_store::LockOwner`: the
//! coordinator's node, thread and transaction slot); a primary takes the node and thread
//! from the request's sender, so a coordinator can name only its own locks.
//!
//! Setting up a node thread: create the node's [`NodeDb`] once (and give every node the
//! cluster's catalog, which the one-sided phases need, or have it ask the other nodes
//! for it: [`NodeDb::fetch_catalog_at_start`]), then on each thread
//! `let th = TxnThread::install(&mut runtime, db.clone(), TxnConfig::default());`,
//! attach the node's scratch region for one-sided READs, spawn workers that run
//! `Txn::begin(&ctx, &th)` and, with passive ACK, committers
//! ([`TxnThread::spawn_committers`]); `runner::start_thread` does all of it.

pub mod actions;
pub mod catalog_exchange;
mod committer;
pub mod db;
pub(crate) mod error;
pub mod handlers;
pub mod history;
pub mod log;
pub mod log_ring;
pub mod messages;
mod onesided;
pub(crate) mod phases;
pub mod policy;
pub mod recovery;
pub mod runner;
pub mod stats;
pub(crate) mod txn;

pub use ambidex_cluster::{Configuration, Placement};
/// The owner a lock word names (re-exported from the store for users of the actions).
pub use ambidex_store::LockOwner;
pub use db::{NodeDb, TableSpec};
pub use error::{
    CatalogExchangeError, DbError, DescriptorsDecodeError, EtcdError, OutOfRoom, RestartError,
    RunError, RunFailure, StartError, StartupCheckError, TableFull,
};
pub use log_ring::LogRegionSetupError;
pub use messages::WriteKind;
pub use policy::{Policy, PolicyError};
pub use stats::{AbortReason, Phase, TxnStats};
pub use txn::{Committed, ItemId, Txn};

use ambidex_cluster::ConfigView;
use ambidex_rpc::{Ctx, Runtime};
use ambidex_transport::{NodeId, ThreadId};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

/// Settings of the transaction layer.
#[derive(Clone, Debug)]
pub struct TxnConfig {
    /// How each phase issues its work (default: FaSST, all RPC).
    pub policy: Policy,
    /// TEST ONLY: skip validation, making the protocol non-serializable. Exists so tests
    /// and the simulator can show that the checkers catch a broken protocol.
    pub skip_validation_for_tests: bool,
    /// TEST ONLY: recovery replays no record of a transaction whose coordinator left
    /// the cluster, so its committed writes that were not installed everywhere are
    /// lost. Exists so the simulator can show that its crash checks catch it.
    pub recovery_skips_dead_coordinators_for_tests: bool,
    /// The pace at which a primary copies a partition to a new backup after a failure
    /// (bytes per second per node; 0: unpaced). Copies take CPU from the node's
    /// transactions: FaRM paces them for the same reason.
    pub rereplication_bytes_per_s: u64,
}

/// [`TxnConfig::rereplication_bytes_per_s`] by default: 64 MiB/s (1 GiB of copies in
/// 16 s).
pub const REREPLICATION_BYTES_PER_S: u64 = 64 << 20;

impl Default for TxnConfig {
    fn default() -> TxnConfig {
        TxnConfig {
            policy: Policy::default(),
            skip_validation_for_tests: false,
            recovery_skips_dead_coordinators_for_tests: false,
            rereplication_bytes_per_s: REREPLICATION_BYTES_PER_S,
        }
    }
}

/// A key of a finished transaction, as histories record it.
#[derive(Clone, Copy, Debug)]
pub struct ItemView<'a> {
    pub table: u32,
    pub key: u64,
    pub write: Option<WriteKind>,
    /// Whether the key existed when fetched.
    pub exists: bool,
    /// The transaction version fetched (0: never written).
    pub version: u64,
    /// The value fetched (empty if absent).
    pub value: &'a [u8],
    /// The value committed (inserts and updates).
    pub new_value: Option<&'a [u8]>,
}

/// Receives every finished transaction of a thread (see [`history`]).
pub trait HistorySink {
    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        id: u64,
        node: NodeId,
        thread: ThreadId,
        outcome: Result<(), AbortReason>,
        start_ns: u64,
        end_ns: u64,
        items: &[ItemView<'_>],
    );

    /// A transaction whose outcome another node may decide from here on (its log
    /// phase starts: a record of it may survive this node): recorded with
    /// [`HistorySink::record`] once it finishes. A sink that keeps these can report a
    /// transaction whose coordinator died before finishing as of unknown outcome (the
    /// simulator's crashes).
    fn pending(
        &mut self,
        _id: u64,
        _node: NodeId,
        _thread: ThreadId,
        _start_ns: u64,
        _items: &[ItemView<'_>],
    ) {
    }

    /// Writes out anything buffered.
    fn flush(&mut self) {}
}

/// Per-thread state of the transaction layer, shared by the thread's coroutines.
pub struct TxnThread {
    pub db: Arc<NodeDb>,
    pub cfg: TxnConfig,
    /// This thread's copy of its node's configuration (shared with its handlers).
    pub(crate) view: Rc<ConfigView>,
    node: NodeId,
    thread: ThreadId,
    seq: Cell<u64>,
    pub stats: RefCell<TxnStats>,
    pub log: Rc<RefCell<log::LogReplica>>,
    /// This thread's rings at the other nodes (`Log::Write`).
    pub(crate) rings: RefCell<log_ring::RingWriters>,
    /// Per node: ids of this thread's transactions installed everywhere, to piggyback on
    /// the next LOG request to that log replica.
    truncations: RefCell<Vec<Vec<u64>>>,
    history: RefCell<Option<Box<dyn HistorySink>>>,
    /// Buffers of finished transactions, reused by the next ones.
    pub(crate) bufs: RefCell<Vec<txn::TxnBufs>>,
    /// Transaction slots (the lock owner's third part) free for reuse, and the next
    /// never used.
    free_slots: RefCell<Vec<u16>>,
    next_slot: Cell<u16>,
    /// Remote locks of transactions dropped without commit or abort, released by the
    /// thread's next round trip ([`phases::lock`]).
    pub(crate) orphans: RefCell<Vec<phases::lock::Orphan>>,
    /// Other nodes' tables, for the one-sided phases.
    pub(crate) remote: RefCell<onesided::RemoteTables>,
    /// A stored value (transaction version + value) being read or built one-sided.
    pub(crate) stored: RefCell<Vec<u8>>,
    /// The WRITEs of a one-sided install being built.
    pub(crate) commit_image: RefCell<onesided::CommitImage>,
    /// Installations handed to the committer (passive ACK).
    pub(crate) committer: RefCell<committer::CommitQueue>,
    /// Coordinators of this thread in each phase now ([`TxnThread::in_phase`]).
    in_phase: [Cell<u32>; Phase::COUNT],
}

/// Counts one coordinator of a thread in a phase while it lives (a guard, so a
/// transaction dropped mid-phase is uncounted too).
pub(crate) struct InPhase(Rc<TxnThread>, Phase);

impl InPhase {
    pub(crate) fn new(th: &Rc<TxnThread>, p: Phase) -> InPhase {
        let c = &th.in_phase[p as usize];
        c.set(c.get() + 1);
        InPhase(th.clone(), p)
    }
}

impl Drop for InPhase {
    fn drop(&mut self) {
        let c = &self.0.in_phase[self.1 as usize];
        c.set(c.get().saturating_sub(1));
    }
}

/// The lock slot transactions share when no slot of their own is free (the last slot
/// of a lock owner; never handed out as a transaction's own).
const SHARED_SLOT: u16 = LockOwner::MAX_SLOTS - 1;

/// The coordinator (node, thread) that gave transaction id `txn` (see `ID_BASE`).
pub fn coordinator_of(txn: u64) -> (NodeId, ThreadId) {
    (
        ((txn >> (SEQ_BITS + 8)) & 0xff) as NodeId,
        ((txn >> SEQ_BITS) & 0xff) as ThreadId,
    )
}

/// Transaction ids: bit 62 set (so no id collides with the load version 1), then node,
/// thread and a per-thread sequence number.
const ID_BASE: u64 = 1 << 62;
const SEQ_BITS: u32 = 38;

impl TxnThread {
    /// Registers the protocol handlers on `rt` and returns the thread's coordinator state.
    ///
    /// # Panics
    /// If the thread's index does not fit a lock owner (at most
    /// `LockOwner::MAX_THREADS` threads per node; [`NodeDb::new`] already refused more
    /// nodes than fit): a configuration error found at set-up, before any traffic.
    pub fn install(rt: &mut Runtime, db: Arc<NodeDb>, cfg: TxnConfig) -> Rc<TxnThread> {
        let log = Rc::new(RefCell::new(log::LogReplica::default()));
        let view = Rc::new(ConfigView::new(db.config()));
        handlers::register(rt, db.clone(), view.clone(), log.clone());
        rt.follow(Arc::new(recovery::NodeWatch(db.cluster().clone())));
        // The RPC layer's suspicions go to the node's agent, which reports them.
        let state = db.cluster().clone();
        rt.on_suspect(move |node| state.suspect(node));
        let addr = rt.addr();
        let epoch = rt.epoch();
        if let Err(e) = LockOwner::new(db.node, addr.thread, 0) {
            panic!("cannot install the transaction layer: {e}");
        }
        let th = Rc::new(TxnThread {
            node: db.node,
            thread: addr.thread,
            truncations: RefCell::new(vec![Vec::new(); db.nodes() as usize]),
            view,
            db,
            cfg,
            seq: Cell::new(0),
            stats: RefCell::new(TxnStats::default()),
            log,
            rings: RefCell::new(log_ring::RingWriters::new(epoch)),
            history: RefCell::new(None),
            bufs: RefCell::new(Vec::new()),
            free_slots: RefCell::new(Vec::new()),
            next_slot: Cell::new(0),
            orphans: RefCell::new(Vec::new()),
            remote: RefCell::new(onesided::RemoteTables::default()),
            stored: RefCell::new(Vec::new()),
            commit_image: RefCell::new(onesided::CommitImage::default()),
            committer: RefCell::new(committer::CommitQueue::default()),
            in_phase: Default::default(),
        });
        // Before any transaction: ids unlike any an earlier incarnation of the node gave.
        th.number_from_incarnation(th.db.incarnation());
        th
    }

    /// The thread moved to `epoch`: what belonged to the old one goes. Orphaned locks
    /// are released by recovery; the log rings restart (recovery replays what they
    /// held). Cached locations are hints checked against the item read, and a lookup
    /// takes only an entry on the key's home, a member: an entry on a removed node is
    /// never used, so only those on `replaced` (nodes that are members again in a new
    /// incarnation, whose items are elsewhere now) are dropped. Not the whole cache:
    /// one pass over it takes milliseconds (tens for a large one), on the way to every
    /// recovery.
    pub(crate) fn forget_old_epoch(&self, epoch: u32, replaced: u64) {
        self.orphans.borrow_mut().clear();
        self.rings.borrow_mut().reset(epoch);
        // A node that rejoined since has new descriptors (`NodeDb::replace_in_catalog`).
        self.remote.borrow_mut().clear();
        if self.thread == 0 {
            self.db.location_cache.invalidate_nodes(replaced);
        }
    }

    /// The configuration this thread runs in now.
    #[inline]
    pub fn config(&self) -> Rc<Configuration> {
        self.view.get(self.db.config())
    }

    /// A lock owner for a new transaction: a free slot of this thread. When none is free
    /// (more than `SHARED_SLOT` live transactions on one thread, or slots retired),
    /// transactions share the one slot `SHARED_SLOT`, which no transaction ever owns:
    /// its locks still exclude each other (taken by RPC: a CAS lock recognises its own
    /// lock by the owner in the word, which a shared owner cannot), and no owner of its
    /// own can mistake one of them for its own. Only a recovery's attribution is
    /// coarser. The second value is false for the shared slot, which is not given back.
    fn take_slot(&self) -> (LockOwner, bool) {
        let (slot, own) = match self.free_slots.borrow_mut().pop() {
            Some(s) => (s, true),
            None => {
                let s = self.next_slot.get();
                if s < SHARED_SLOT {
                    self.next_slot.set(s + 1);
                    (s, true)
                } else {
                    (SHARED_SLOT, false)
                }
            }
        };
        let owner = LockOwner {
            node: self.node,
            thread: self.thread,
            slot,
        };
        (owner, own)
    }

    /// Gives a transaction's own slot back (its locks are released or orphaned).
    pub(crate) fn give_slot(&self, o: LockOwner) {
        self.free_slots.borrow_mut().push(o.slot);
    }

    /// Spawns `n` committers on `rt` (one per worker) if the policy has passive ACK:
    /// then a transaction returns once its log is complete and a committer installs its
    /// writes. Without them, passive ACK degrades to waiting for the installation.
    /// Every worker spawned must call [`TxnThread::worker_started`] and, when it ends,
    /// await [`TxnThread::worker_finished`] (the committers end once every worker has
    /// and every installation is done; `runner::start_thread` does this).
    pub fn spawn_committers(th: &Rc<TxnThread>, rt: &mut Runtime, n: usize) {
        if th.cfg.policy.passive_ack != policy::PassiveAck::On {
            return;
        }
        for _ in 0..n.max(1) {
            th.committer.borrow_mut().running += 1;
            let th = th.clone();
            rt.spawn(move |ctx| committer::run(ctx, th));
        }
    }

    /// A worker of this thread starts (see [`TxnThread::spawn_committers`]).
    pub fn worker_started(&self) {
        self.committer.borrow_mut().live_workers += 1;
    }

    /// A worker of this thread is done: resolves once every installation its
    /// transactions handed to the committer is finished.
    pub async fn worker_finished(&self, ctx: &Ctx) {
        let last = {
            let mut q = self.committer.borrow_mut();
            q.live_workers = q.live_workers.saturating_sub(1);
            if q.live_workers == 0 {
                q.wake_all();
            }
            q.live_workers == 0
        };
        while self.committer.borrow().running > 0 && self.committer.borrow().pending() > 0 {
            ctx.yield_now().await;
        }
        if last {
            // The thread's last worker: its replicas apply the records left in its rings.
            self.drain_rings(ctx).await;
        }
    }

    /// Whether a committer can take a job at once (see `CommitQueue::has_idle`).
    pub(crate) fn committer_idle(&self) -> bool {
        self.committer.borrow().has_idle()
    }

    pub(crate) fn defer_commit(&self, job: phases::commit::CommitJob) {
        self.committer.borrow_mut().push(job);
    }

    /// Installations not finished yet (passive ACK; tests, reports).
    pub fn commits_pending(&self) -> usize {
        self.committer.borrow().pending()
    }

    /// Takes a finished transaction's buffers (and items, emptied) for the thread's
    /// next transactions.
    pub(crate) fn recycle(&self, mut bufs: txn::TxnBufs, mut items: Vec<txn::Item>) {
        for it in items.drain(..) {
            for mut v in std::iter::once(it.value).chain(it.new_value) {
                if bufs.bytes.len() < txn::SPARE_BYTES && v.capacity() > 0 {
                    v.clear();
                    bufs.bytes.push(v);
                }
            }
        }
        bufs.items = items;
        let mut pool = self.bufs.borrow_mut();
        if pool.len() < txn::POOLED_TXNS {
            pool.push(bufs);
        }
    }

    /// Remote locks of dropped transactions not yet released (tests, reports).
    pub fn orphaned_locks(&self) -> usize {
        self.orphans.borrow().len()
    }

    /// Sends every finished transaction of this thread to `sink`.
    pub fn set_history(&self, sink: Box<dyn HistorySink>) {
        *self.history.borrow_mut() = Some(sink);
    }

    /// Takes the history sink back (to flush it).
    pub fn take_history(&self) -> Option<Box<dyn HistorySink>> {
        self.history.borrow_mut().take()
    }

    /// Numbers this thread's transactions from `incarnation`'s range (the top bits of
    /// the sequence), for a restarted node: no id of it repeats one an earlier
    /// incarnation of the node gave, which may still be in a log or a history.
    fn number_from_incarnation(&self, incarnation: u64) {
        self.seq
            .set((incarnation.saturating_sub(1) & 0x3f) << (SEQ_BITS - 6));
    }

    fn next_id(&self) -> u64 {
        let s = self.seq.get() + 1;
        self.seq.set(s);
        ID_BASE
            | (self.node as u64) << (SEQ_BITS + 8)
            | (self.thread as u64 & 0xff) << SEQ_BITS
            | (s & ((1 << SEQ_BITS) - 1))
    }

    pub(crate) fn truncate_later(&self, id: u64) {
        self.log.borrow_mut().truncate(id);
        if self.cfg.policy.log == policy::Log::Write {
            self.rings.borrow_mut().installed(id);
            return;
        }
        let mut t = self.truncations.borrow_mut();
        let config = self.config();
        for r in config.placement.log_replicas(self.node).skip(1) {
            t[r as usize].push(id);
        }
    }

    /// Runs `f` on the ids to truncate at `node`'s log replica (it drains what it sends).
    fn with_truncations<R>(&self, node: NodeId, f: impl FnOnce(&mut Vec<u64>) -> R) -> R {
        let mut t = self.truncations.borrow_mut();
        match t.get_mut(node as usize) {
            Some(list) => f(list),
            None => f(&mut Vec::new()),
        }
    }

    /// How many of this thread's coordinators (and committers) are in phase `p` now:
    /// a cheap observable for a simulator that crashes a node in a given phase.
    pub fn in_phase(&self, p: Phase) -> u32 {
        self.in_phase[p as usize].get()
    }

    fn records_history(&self) -> bool {
        self.history.borrow().is_some()
    }

    fn record(
        &self,
        id: u64,
        items: &[ItemView<'_>],
        outcome: Result<(), AbortReason>,
        start_ns: u64,
        end_ns: u64,
    ) {
        if let Some(h) = self.history.borrow_mut().as_mut() {
            h.record(id, self.node, self.thread, outcome, start_ns, end_ns, items);
        }
    }

    fn record_pending(&self, id: u64, items: &[ItemView<'_>], start_ns: u64) {
        if let Some(h) = self.history.borrow_mut().as_mut() {
            h.pending(id, self.node, self.thread, start_ns, items);
        }
    }

    /// This thread's counters, with its log replica's.
    pub fn stats(&self) -> TxnStats {
        let mut s = self.stats.borrow().clone();
        let log = self.log.borrow();
        s.log_appended = log.appended;
        s.log_truncated = log.truncated;
        let rings = self.rings.borrow();
        s.log_records_held = log.len() as u64 + rings.held() as u64;
        s.log_ring = rings.stats;
        s.log_ring.merge(&log.ring);
        s
    }
}
