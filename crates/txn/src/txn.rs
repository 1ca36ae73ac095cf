//! The coordinator: the transaction API of worker coroutines (FaSST §5.2.1) and the order
//! of the protocol's phases (FaSST §5, Figure 6; DrTM+H Figure 1), each in its own module
//! of [`crate::phases`]:
//!
//! execute (read values and versions; write-set keys are locked at their primary in the
//! same round trip, the lock phase folded in) → validate (re-read the versions of
//! read-only keys) → log (the commit record to the coordinator's log replicas) → commit
//! backups (wait for every ACK) → commit primaries (install, new version, unlock).
//!
//! Keys whose primary is this node are accessed directly through the item actions;
//! every other access is an RPC queued without I/O and sent with one doorbell per phase.

use crate::messages::{LockToken, WriteKind, WriteRec};
use crate::phases::commit::CommitJob;
use crate::policy::PassiveAck;
use crate::stats::{AbortReason, Phase, PhaseMap};
use crate::TxnThread;
use ambidex_cluster::Configuration;
use ambidex_rpc::{Ctx, ReqHandle};
use ambidex_store::LockOwner;
use ambidex_transport::NodeId;
use std::rc::Rc;

/// A key of the transaction (index returned by [`Txn::read`] / [`Txn::write`]).
pub type ItemId = usize;

pub(crate) struct Item {
    pub(crate) table: u32,
    pub(crate) key: u64,
    pub(crate) write: Option<WriteKind>,
    pub(crate) home: NodeId,
    pub(crate) fetched: bool,
    /// Found (OK) or absent (ABSENT) at execute.
    pub(crate) exists: bool,
    pub(crate) version: u64,
    pub(crate) value: Vec<u8>,
    /// Set once the primary holds the lock for us.
    pub(crate) lock: Option<LockToken>,
    /// The value to commit (insert / update).
    pub(crate) new_value: Option<Vec<u8>>,
    pub(crate) pending: Option<ReqHandle>,
    /// A remote key fetched with its location: the item's offset in its home's table
    /// region and its header word then (for a CAS lock, a header READ, a one-sided
    /// commit, the location cache).
    pub(crate) loc: Option<u64>,
    pub(crate) hdr: u64,
    /// A one-sided fetch of the key in progress ([`crate::phases::execute`]).
    pub(crate) fetch: Option<crate::phases::execute::Fetch>,
}

/// The outcome of a committed transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Committed {
    pub id: u64,
    /// True if it wrote nothing.
    pub read_only: bool,
}

/// Buffers a finished transaction leaves to the next one of its thread, so the hot path
/// allocates nothing per transaction once the pool is warm.
#[derive(Default)]
pub(crate) struct TxnBufs {
    /// Empty while pooled.
    pub(crate) items: Vec<Item>,
    /// Spare value buffers (cleared).
    pub(crate) bytes: Vec<Vec<u8>>,
    pub(crate) req: Vec<u8>,
    pub(crate) body: Vec<u8>,
    pub(crate) handles: Vec<ReqHandle>,
    pub(crate) targets: Vec<NodeId>,
    pub(crate) ops: Vec<crate::phases::commit::CommitOp>,
    /// Header READs of the validate phase: (item, READ).
    pub(crate) reads: Vec<(usize, ambidex_rpc::OpHandle)>,
    /// Locks of the lock phase awaiting their answer.
    pub(crate) locking: Vec<crate::phases::lock::Locking>,
    /// Bucket walks of the execute phase in progress.
    pub(crate) walks: Vec<crate::onesided::Walk>,
}

/// Spare buffers kept per pooled transaction, and pooled transactions per thread: enough
/// for every coroutine's transaction, bounded so one huge transaction pins little memory.
pub(crate) const SPARE_BYTES: usize = 64;
pub(crate) const POOLED_TXNS: usize = 256;

impl TxnBufs {
    pub(crate) fn spare(&mut self) -> Vec<u8> {
        self.bytes.pop().unwrap_or_default()
    }
}

/// One transaction, driven by one worker coroutine.
///
/// Dropped without [`Txn::commit`] or [`Txn::abort`] (an application bug, or a worker
/// future dropped mid-transaction), it still releases its locks: local ones at once,
/// remote ones by UNLOCKs its thread sends with the next transaction's first round trip
/// (see the crate's `phases` module).
pub struct Txn<'c> {
    pub(crate) ctx: &'c Ctx,
    pub(crate) th: Rc<TxnThread>,
    pub(crate) id: u64,
    /// The configuration the transaction runs in (its thread's at begin).
    pub(crate) config: Rc<Configuration>,
    /// Who holds this transaction's locks (its slot is its own while it lives).
    pub(crate) owner: LockOwner,
    /// False if the slot is shared (more live transactions than slots), or retired: a
    /// lock naming it may outlive the transaction (a release whose outcome is unknown,
    /// an incomplete install, orphaned locks), so it must never name another
    /// transaction's locks — a CAS lock recognises its own by the owner in the word.
    pub(crate) own_slot: bool,
    pub(crate) items: Vec<Item>,
    pub(crate) bufs: TxnBufs,
    aborted: Option<AbortReason>,
    start_ns: u64,
    phase_ns: PhaseMap<u64>,
    /// Bit `p` set once phase `p` ran (a byte, not a map of bools: `Txn` is moved by
    /// value, so its size costs copies).
    ran: u8,
    done: bool,
    /// Its items and buffers went to the committer (passive ACK).
    deferred: bool,
    /// Its commit record is in every log replica: it is committed.
    logged: bool,
    /// Its coordinator's own log record exists: from here on, if the cluster moves to
    /// a new configuration, recovery commits it (its record survives with this node).
    pub(crate) own_record: bool,
    /// It waited for its node to run and bound its coroutine to its epoch.
    started: bool,
}

impl<'c> Txn<'c> {
    /// Begins a transaction of this thread's coordinator.
    pub fn begin(ctx: &'c Ctx, th: &Rc<TxnThread>) -> Txn<'c> {
        let mut bufs = th.bufs.borrow_mut().pop().unwrap_or_default();
        let (owner, own_slot) = th.take_slot();
        Txn {
            ctx,
            th: th.clone(),
            id: th.next_id(),
            config: th.config(),
            owner,
            own_slot,
            items: std::mem::take(&mut bufs.items),
            bufs,
            aborted: None,
            // The step's start, read without a clock call: at or before the true begin,
            // which only widens the interval a history checker sees (safe for real-time
            // order; the end below must not be early, so it reads the clock).
            start_ns: ctx.step_ns(),
            phase_ns: PhaseMap::default(),
            ran: 0,
            done: false,
            deferred: false,
            logged: false,
            own_record: false,
            started: false,
        }
    }

    /// [`Txn::start`] without awaiting when nothing is to wait for or to change: the
    /// node runs, its configuration is still the transaction's and the runtime is in
    /// its epoch (a few atomic loads and one borrow of the runtime). False if the slow
    /// path must run.
    #[inline]
    fn start_now(&mut self) -> bool {
        if self.started {
            return true;
        }
        let state = self.th.db.cluster();
        if state.running(self.ctx.step_ns())
            && state.config.epoch() == self.config.epoch
            && self.ctx.bind_current_epoch(self.config.epoch)
        {
            self.started = true;
        }
        self.started
    }

    /// Before the first phase: waits while the node is not running transactions (a
    /// reconfiguration is in progress), moves to the node's current configuration if it
    /// changed since `begin`, and binds the coroutine to its epoch so nothing of it is
    /// sent once the cluster moves on. A fenced node runs nothing. Callers try
    /// [`Txn::start_now`] first.
    #[cold]
    async fn start(&mut self) -> Result<(), AbortReason> {
        if self.started {
            return Ok(());
        }
        // An `Rc` of the thread, not an `Arc` clone of the node's state: every thread's
        // transactions pass here, and an `Arc` count is one cache line for all of them.
        let th = self.th.clone();
        let state = th.db.cluster();
        let mut waited = false;
        while !state.running(self.ctx.step_ns()) {
            waited = true;
            if state.fenced() {
                // Yield once, so a worker retrying at once does not starve the thread.
                self.ctx.yield_now().await;
                return Err(AbortReason::Fenced);
            }
            // Paused, not yielded: a reconfiguration's stages wait for every member's
            // threads, which a spinning wait here would take the cores from.
            self.ctx.pause().await;
        }
        if waited {
            ambidex_cluster::rectrace!("node {} txn started after waiting", self.th.node);
        }
        let config = self.th.config();
        if config.epoch != self.config.epoch {
            self.config = config;
            for it in &mut self.items {
                it.home = self.config.placement.primary(it.table, it.key);
            }
        }
        if self.config.epoch != self.ctx.epoch() {
            // The runtime has not switched yet: the next attempt will.
            self.ctx.yield_now().await;
            return Err(AbortReason::EpochChanged);
        }
        self.ctx.bind_epoch(self.config.epoch);
        self.started = true;
        Ok(())
    }

    /// Whether the cluster is still in the configuration this transaction runs in
    /// (checked before each phase: an old transaction takes no lock and writes nothing
    /// once its thread moved on).
    #[inline]
    fn same_epoch(&self) -> Result<(), AbortReason> {
        if self.ctx.epoch() == self.config.epoch {
            Ok(())
        } else {
            Err(AbortReason::EpochChanged)
        }
    }

    /// Why a transaction of an older configuration aborts: a node it used is gone, or
    /// only the configuration changed.
    fn epoch_reason(&self) -> AbortReason {
        let now = self.th.config();
        if self
            .items
            .iter()
            .any(|it| !now.placement.is_member(it.home))
        {
            AbortReason::NodeFailed
        } else {
            AbortReason::EpochChanged
        }
    }

    /// A transaction whose own log record exists when the cluster moved on: the
    /// survivors' recovery installs it (this node's record survives with this node), so
    /// it is committed once recovery is done (the node runs again in a newer epoch).
    /// Returns false if the node was fenced instead: then only the survivors know.
    async fn await_recovery(&self) -> bool {
        let state = self.th.db.cluster();
        loop {
            if state.fenced() {
                return false;
            }
            if state.config.epoch() > self.config.epoch && state.running(self.ctx.step_ns()) {
                return true;
            }
            self.ctx.pause().await;
        }
    }

    /// Whether the cluster went on without this transaction's epoch: this thread is in
    /// a newer one, or the node is fenced (removed: it may never learn the newer one).
    /// A transaction whose record may be out is then decided by recovery.
    pub(crate) fn left_behind(&self) -> bool {
        self.ctx.epoch() != self.config.epoch || self.th.db.cluster().fenced()
    }

    /// The transaction's id (unique in the cluster; the version its writes install).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The owner its locks carry in the store's lock words.
    pub fn owner(&self) -> LockOwner {
        self.owner
    }

    fn add(&mut self, table: u32, key: u64, write: Option<WriteKind>) -> ItemId {
        if let Some(i) = self
            .items
            .iter()
            .position(|it| it.table == table && it.key == key)
        {
            // A key read and then written is one write-set key (W ⊆ R).
            if write.is_some() && self.items[i].write.is_none() {
                let it = &mut self.items[i];
                it.write = write;
                it.fetched = false;
            }
            return i;
        }
        let home = self.config.placement.primary(table, key);
        self.items.push(Item {
            table,
            key,
            write,
            home,
            fetched: false,
            exists: false,
            version: 0,
            value: self.bufs.spare(),
            lock: None,
            new_value: None,
            pending: None,
            loc: None,
            hdr: 0,
            fetch: None,
        });
        self.items.len() - 1
    }

    /// Adds `key` to the read set (no I/O until [`Txn::execute`]).
    pub fn read(&mut self, table: u32, key: u64) -> ItemId {
        self.add(table, key, None)
    }

    /// Adds `key` to the write set with `kind` (no I/O until [`Txn::execute`]).
    pub fn write(&mut self, table: u32, key: u64, kind: WriteKind) -> ItemId {
        self.add(table, key, Some(kind))
    }

    /// The value fetched for `item` (`None` if the key is absent or not yet fetched).
    pub fn get(&self, item: ItemId) -> Option<&[u8]> {
        let it = self.items.get(item)?;
        (it.fetched && it.exists).then_some(&it.value[..])
    }

    /// The transaction version fetched for `item` (0 if absent and never written).
    pub fn version(&self, item: ItemId) -> u64 {
        self.items.get(item).map(|i| i.version).unwrap_or(0)
    }

    /// Sets the value an insert or update of `item` commits. Panics if `item` is not an
    /// insert or update of this transaction (a programming error).
    pub fn set(&mut self, item: ItemId, value: &[u8]) {
        let it = &mut self.items[item];
        assert!(
            matches!(it.write, Some(WriteKind::Insert | WriteKind::Update)),
            "set() on a key that is not inserted or updated"
        );
        let mut v = match it.new_value.take() {
            Some(v) => v,
            None => self.bufs.spare(),
        };
        v.clear();
        v.extend_from_slice(value);
        it.new_value = Some(v);
    }

    /// Turns the update of `item` into a delete of its key (a key fetched for update
    /// and then deleted: the lock an update takes serves a delete, which also needs the
    /// key to exist). Panics if `item` is not an update or delete of this transaction
    /// (a programming error).
    pub fn delete_instead(&mut self, item: ItemId) {
        let it = &mut self.items[item];
        assert!(
            matches!(it.write, Some(WriteKind::Update | WriteKind::Delete)),
            "delete_instead() on a key that is not updated"
        );
        it.write = Some(WriteKind::Delete);
        if let Some(mut v) = it.new_value.take() {
            v.clear();
            self.bufs.bytes.push(v);
        }
    }

    /// Adds the time since `t0` (a `step_ns` reading) to phase `p`.
    pub(crate) fn timed(&mut self, p: Phase, t0: u64) {
        self.phase_ns[p] += self.ctx.step_ns().saturating_sub(t0);
        self.ran |= 1 << p as u8;
    }

    /// Fetches every key added since the last call with one doorbell: values and
    /// versions of read-set keys, and locks at the primary for write-set keys. On failure
    /// the transaction is aborted (its locks released) and the reason returned.
    pub async fn execute(&mut self) -> Result<(), AbortReason> {
        if let Some(r) = self.aborted {
            return Err(r);
        }
        // With passive ACK, this coroutine's previous transaction may still be being
        // installed, holding its locks, which its next transaction would likely meet
        // (a coroutine's transactions often touch the same hot rows) and abort on. It
        // waits for that installation first; its caller had the answer already.
        if self.th.cfg.policy.passive_ack == PassiveAck::On {
            crate::committer::own_jobs_done(&self.th, self.ctx.id()).await;
        }
        if !self.start_now() {
            if let Err(r) = self.start().await {
                self.fail(r).await;
                return Err(r);
            }
        }
        if let Err(r) = self.same_epoch() {
            self.fail(r).await;
            return Err(r);
        }
        let t0 = self.ctx.step_ns();
        let g = crate::InPhase::new(&self.th, Phase::Execute);
        let r = self.execute_phase().await;
        drop(g);
        self.timed(Phase::Execute, t0);
        if let Err(r) = r {
            self.fail(r).await;
            return Err(r);
        }
        Ok(())
    }

    /// Aborts: releases every lock held and records the abort as the application's.
    pub async fn abort(mut self) {
        if self.aborted.is_none() {
            self.fail(AbortReason::User).await;
        }
    }

    /// Releases locks, counts and records the abort. Idempotent.
    async fn fail(&mut self, reason: AbortReason) {
        if self.aborted.is_some() {
            return;
        }
        let reason = if self.started && self.ctx.epoch() != self.config.epoch {
            // The cluster moved on: recovery released every lock of the old epoch, and
            // nothing of this transaction may be sent in the new one.
            for it in &mut self.items {
                it.lock = None;
            }
            match reason {
                AbortReason::User => reason,
                _ => self.epoch_reason(),
            }
        } else {
            self.release_locks().await;
            reason
        };
        self.aborted = Some(reason);
        self.th.stats.borrow_mut().abort(reason);
        if self.th.records_history() {
            self.th.record(
                self.id,
                &self.items_view(),
                Err(reason),
                self.start_ns,
                self.ctx.step_ns(),
            );
        }
        self.done = true;
    }

    fn items_view(&self) -> Vec<crate::ItemView<'_>> {
        self.items
            .iter()
            .filter(|it| it.fetched)
            .map(|it| crate::ItemView {
                table: it.table,
                key: it.key,
                write: it.write,
                exists: it.exists,
                version: it.version,
                value: &it.value,
                new_value: it.new_value.as_deref(),
            })
            .collect()
    }

    /// Runs the commit protocol. Returns the committed transaction, or why it aborted.
    pub async fn commit(mut self) -> Result<Committed, AbortReason> {
        if let Some(r) = self.aborted {
            return Err(r);
        }
        if self.items.iter().any(|it| !it.fetched) {
            self.execute().await?;
        }
        if !self.start_now() {
            if let Err(r) = self.start().await {
                self.fail(r).await;
                return Err(r);
            }
        }
        self.default_new_values();
        let read_only = self.items.iter().all(|it| it.write.is_none());
        // Policies that do not lock at execute lock the write set now (DrTM+H §5.2).
        if !self.th.cfg.policy.lock_at_execute()
            && self
                .items
                .iter()
                .any(|it| it.write.is_some() && it.lock.is_none())
        {
            if let Err(r) = self.same_epoch() {
                self.fail(r).await;
                return Err(r);
            }
            let t0 = self.ctx.step_ns();
            let g = crate::InPhase::new(&self.th, Phase::Lock);
            let r = self.lock_phase().await;
            drop(g);
            self.timed(Phase::Lock, t0);
            if let Err(r) = r {
                self.fail(r).await;
                return Err(r);
            }
        }
        // Single-key read-only transactions skip validation (FaSST §5).
        if !(read_only && self.items.len() <= 1) {
            if let Err(r) = self.same_epoch() {
                self.fail(r).await;
                return Err(r);
            }
            let t0 = self.ctx.step_ns();
            let g = crate::InPhase::new(&self.th, Phase::Validate);
            let v = self.validate_phase().await;
            drop(g);
            self.timed(Phase::Validate, t0);
            if let Err(r) = v {
                self.fail(r).await;
                return Err(r);
            }
        }
        if read_only {
            self.finish_commit(true, false);
            return Ok(Committed {
                id: self.id,
                read_only: true,
            });
        }
        if let Err(r) = self.same_epoch() {
            self.fail(r).await;
            return Err(r);
        }
        if self.th.records_history() {
            // From here a record of it may survive this node: if the node dies before
            // it finishes, its outcome is recovery's.
            self.th
                .record_pending(self.id, &self.items_view(), self.start_ns);
        }
        let t0 = self.ctx.step_ns();
        let g = crate::InPhase::new(&self.th, Phase::Log);
        let logged = self.log_phase().await;
        drop(g);
        self.timed(Phase::Log, t0);
        if let Err(r) = logged {
            if self.own_record && self.left_behind() {
                // Its record may be at some replica and is here: recovery commits it.
                return self.committed_by_recovery().await;
            }
            self.fail(r).await;
            return Err(r);
        }
        // From here the transaction is committed: its record is in every log replica.
        self.logged = true;
        if self.th.cfg.policy.passive_ack == PassiveAck::On && self.th.committer_idle() {
            // Passive ACK: the installation goes on off this transaction's path.
            self.finish_commit(false, false);
            let job = self.take_job();
            self.deferred = true;
            self.th.defer_commit(job);
            return Ok(Committed {
                id: self.id,
                read_only: false,
            });
        }
        let complete = self.commit_inline().await;
        if complete {
            self.th.truncate_later(self.id);
        } else if self.ctx.epoch() != self.config.epoch {
            // Recovery installs what this commit could not; its locks are released
            // then, and it returns once its writes are visible.
            self.await_recovery().await;
        } else {
            // Some lock may stay held until recovery: the slot is retired.
            self.own_slot = false;
        }
        self.finish_commit(false, !complete);
        Ok(Committed {
            id: self.id,
            read_only: false,
        })
    }

    /// The log phase was cut by a change of configuration after this node's own record
    /// was written: the transaction is committed by recovery (the rule of
    /// [`crate::recovery`]), and returns once that is done. A node fenced meanwhile
    /// cannot know the outcome: `Fenced`.
    async fn committed_by_recovery(mut self) -> Result<Committed, AbortReason> {
        for it in &mut self.items {
            it.lock = None;
        }
        self.logged = true;
        if !self.await_recovery().await {
            self.th.stats.borrow_mut().abort(AbortReason::Fenced);
            self.aborted = Some(AbortReason::Fenced);
            self.done = true;
            return Err(AbortReason::Fenced);
        }
        self.th.stats.borrow_mut().committed_by_recovery += 1;
        self.finish_commit(false, false);
        Ok(Committed {
            id: self.id,
            read_only: false,
        })
    }

    /// An update without set() writes back the value read; an insert without set()
    /// inserts zeroes.
    fn default_new_values(&mut self) {
        for it in &mut self.items {
            if it.new_value.is_some() {
                continue;
            }
            if it.write == Some(WriteKind::Update) {
                let mut v = self.bufs.bytes.pop().unwrap_or_default();
                v.extend_from_slice(&it.value);
                it.new_value = Some(v);
            }
            if it.write == Some(WriteKind::Insert) {
                let size = self.th.db.value_size(it.table).unwrap_or(0);
                let mut v = self.bufs.bytes.pop().unwrap_or_default();
                v.resize(size, 0);
                it.new_value = Some(v);
            }
        }
    }

    fn finish_commit(&mut self, read_only: bool, incomplete: bool) {
        {
            let mut st = self.th.stats.borrow_mut();
            st.committed += 1;
            if read_only {
                st.read_only_committed += 1;
            }
            if incomplete {
                st.committed_incomplete += 1;
            }
            for p in Phase::ALL {
                if self.ran & (1 << p as u8) != 0 {
                    st.phase_ns[p] += self.phase_ns[p];
                    st.phase_count[p] += 1;
                }
            }
        }
        if self.th.records_history() {
            // Read after the last phase completed (for writes: every primary installed
            // and answered), so the recorded interval contains the commit point; the
            // step's start could precede the installs.
            let end = self.ctx.now_ns();
            self.th
                .record(self.id, &self.items_view(), Ok(()), self.start_ns, end);
        }
        self.done = true;
    }

    /// The write-set keys selected by `filter`, as commit-record entries (primary: with
    /// lock tokens).
    pub(crate) fn writes<'a>(
        &'a self,
        filter: impl Fn(&Item) -> bool + 'a,
    ) -> impl Iterator<Item = WriteRec<'a>> + 'a {
        writes_of(&self.items, filter)
    }

    /// Moves the transaction's items and buffers into its installation job.
    pub(crate) fn take_job(&mut self) -> CommitJob {
        CommitJob {
            id: self.id,
            config: self.config.clone(),
            owner: self.owner,
            own_slot: self.own_slot,
            items: std::mem::take(&mut self.items),
            bufs: std::mem::take(&mut self.bufs),
            ok: true,
            worker: self.ctx.id(),
        }
    }

    /// Adds `ns` to phase `p`'s time.
    pub(crate) fn add_phase_time(&mut self, p: Phase, ns: u64) {
        self.phase_ns[p] += ns;
        self.ran |= 1 << p as u8;
    }
}

/// The write-set keys of `items` selected by `filter`, as commit-record entries
/// (primary: with lock tokens).
pub(crate) fn writes_of<'a>(
    items: &'a [Item],
    filter: impl Fn(&Item) -> bool + 'a,
) -> impl Iterator<Item = WriteRec<'a>> + 'a {
    items
        .iter()
        .filter(move |it| it.write.is_some() && filter(it))
        .filter_map(|it| {
            Some(WriteRec {
                table: it.table,
                key: it.key,
                kind: it.write?,
                prev_version: it.version,
                token: it.lock.unwrap_or_default(),
                value: it.new_value.as_deref().unwrap_or(&[]),
            })
        })
}

impl Drop for Txn<'_> {
    fn drop(&mut self) {
        if !self.done && self.logged {
            // Dropped while installing a committed transaction: its locks must not be
            // released as an abort's would be (a release could overtake the install).
            // They stay held, with its log record, for recovery; the slot is retired.
            self.th.stats.borrow_mut().committed_incomplete += 1;
            self.own_slot = false;
            self.done = true;
        }
        if !self.done {
            // Dropped without commit or abort: release every lock (and count it, so the
            // application bug cannot go unnoticed).
            let (held, unknown) = self.orphan_locks();
            if held || unknown {
                self.th.stats.borrow_mut().abort(AbortReason::User);
            }
            // A LOCK that may still execute names this slot: retire it rather than
            // let a later transaction of the thread share its owner.
            self.own_slot &= !unknown;
        }
        if self.deferred {
            // Its locks are held until the committer installs its writes: the
            // committer gives the slot and the buffers back.
            return;
        }
        if self.own_slot {
            self.th.give_slot(self.owner);
        }
        self.th.recycle(
            std::mem::take(&mut self.bufs),
            std::mem::take(&mut self.items),
        );
    }
}

#[cfg(test)]
mod size_tests {
    /// Items are moved and scanned by every phase: keep them small.
    #[test]
    fn item_stays_small() {
        let n = std::mem::size_of::<super::Item>();
        assert!(n <= 144, "Item is {n} bytes");
    }
}
