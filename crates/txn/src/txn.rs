//! The coordinator: the transaction API of worker coroutines (FaSST §5.2.1) and the
//! protocol that commits it (FaSST §5, Figure 6):
//!
//! execute (read values and versions; write-set keys are locked at their primary in the
//! same round trip) → validate (re-read the versions of read-only keys) → log (the commit
//! record to the coordinator's log replicas) → commit backups (wait for every ACK) →
//! commit primaries (install, new version, unlock).
//!
//! Keys whose primary is this node are accessed directly in the local store; every other
//! access is an RPC queued without I/O and sent with one doorbell per phase.

use crate::db::Fetched;
use crate::stats::{AbortReason, Phase};
use crate::wire::{self, rtype, status, LockToken, Reader, WriteKind, WriteRec};
use crate::TxnThread;
use ambidex_rpc::{Ctx, ReqHandle, RpcError};
use ambidex_transport::NodeId;
use std::rc::Rc;

/// A key of the transaction (index returned by [`Txn::read`] / [`Txn::write`]).
pub type ItemId = usize;

struct Item {
    table: u32,
    key: u64,
    write: Option<WriteKind>,
    home: NodeId,
    fetched: bool,
    /// Found (OK) or absent (ABSENT) at execute.
    exists: bool,
    version: u64,
    value: Vec<u8>,
    /// Set once the primary holds the lock for us.
    lock: Option<LockToken>,
    /// The value to commit (insert / update).
    new_value: Option<Vec<u8>>,
    pending: Option<ReqHandle>,
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
    items: Vec<Item>,
    /// Spare value buffers (cleared).
    bytes: Vec<Vec<u8>>,
    req: Vec<u8>,
    body: Vec<u8>,
    handles: Vec<ReqHandle>,
    targets: Vec<NodeId>,
}

/// Spare buffers kept per pooled transaction, and pooled transactions per thread: enough
/// for every coroutine's transaction, bounded so one huge transaction pins little memory.
const SPARE_BYTES: usize = 64;
const POOLED_TXNS: usize = 256;

impl TxnBufs {
    fn spare(&mut self) -> Vec<u8> {
        self.bytes.pop().unwrap_or_default()
    }
}

/// One transaction, driven by one worker coroutine.
pub struct Txn<'c> {
    ctx: &'c Ctx,
    th: Rc<TxnThread>,
    id: u64,
    items: Vec<Item>,
    bufs: TxnBufs,
    aborted: Option<AbortReason>,
    start_ns: u64,
    phase_ns: [u64; 5],
    done: bool,
}

impl<'c> Txn<'c> {
    /// Begins a transaction of this thread's coordinator.
    pub fn begin(ctx: &'c Ctx, th: &Rc<TxnThread>) -> Txn<'c> {
        let mut bufs = th.bufs.borrow_mut().pop().unwrap_or_default();
        Txn {
            ctx,
            th: th.clone(),
            id: th.next_id(),
            items: std::mem::take(&mut bufs.items),
            bufs,
            aborted: None,
            start_ns: ctx.step_ns(),
            phase_ns: [0; 5],
            done: false,
        }
    }

    /// The transaction's id (unique in the cluster; the version its writes install).
    pub fn id(&self) -> u64 {
        self.id
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
        let home = self.th.db.placement.primary(table, key);
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

    /// Fetches every key added since the last call with one doorbell: values and
    /// versions of read-set keys, and locks at the primary for write-set keys. On failure
    /// the transaction is aborted (its locks released) and the reason returned.
    pub async fn execute(&mut self) -> Result<(), AbortReason> {
        if let Some(r) = self.aborted {
            return Err(r);
        }
        let t0 = self.ctx.step_ns();
        let db = self.th.db.clone();
        let me = db.node;
        let mut any_remote = false;
        let mut failure = None;
        let mut req = std::mem::take(&mut self.bufs.req);
        for i in 0..self.items.len() {
            let it = &mut self.items[i];
            if it.fetched {
                continue;
            }
            if it.home == me {
                let mut val = std::mem::take(&mut it.value);
                val.clear();
                let f = match it.write {
                    Some(kind) => db.lock(it.table, it.key, kind, &mut val),
                    None => db.read(it.table, it.key, &mut val),
                };
                if let Err(r) = absorb(it, f, val) {
                    failure.get_or_insert(r);
                }
            } else {
                req.clear();
                wire::key_request(&mut req, it.table, it.key, it.write);
                let rt = if it.write.is_some() {
                    rtype::LOCK
                } else {
                    rtype::READ
                };
                match self.ctx.queue(it.home, rt, &req) {
                    Ok(h) => {
                        it.pending = Some(h);
                        any_remote = true;
                    }
                    Err(_) => {
                        failure.get_or_insert(AbortReason::Timeout);
                    }
                }
            }
        }
        if any_remote {
            let flushed = self.ctx.flush().await;
            for i in 0..self.items.len() {
                let Some(h) = self.items[i].pending.take() else {
                    continue;
                };
                let is_lock = self.items[i].write.is_some();
                let mut val = std::mem::take(&mut self.items[i].value);
                val.clear();
                let parsed = self.ctx.response(h, |r| parse_fetch(r, is_lock, &mut val));
                // Every path below leaves the buffer with the item (absorb takes it).
                let keep = |it: &mut Item, val: Vec<u8>| it.value = val;
                match (parsed, &flushed) {
                    (Ok(Some(f)), _) => {
                        if let Err(r) = absorb(&mut self.items[i], f, val) {
                            failure.get_or_insert(r);
                        }
                    }
                    (Ok(None), _) => {
                        keep(&mut self.items[i], val);
                        failure.get_or_insert(AbortReason::BadResponse);
                    }
                    (Err(RpcError::Timeout { .. }), _) | (Err(_), Err(_)) => {
                        keep(&mut self.items[i], val);
                        failure.get_or_insert(AbortReason::Timeout);
                    }
                    (Err(_), Ok(())) => {
                        keep(&mut self.items[i], val);
                        failure.get_or_insert(AbortReason::BadResponse);
                    }
                }
            }
        }
        self.bufs.req = req;
        self.phase_ns[Phase::Execute as usize] += self.ctx.step_ns() - t0;
        match failure {
            None => Ok(()),
            Some(r) => {
                self.fail(r).await;
                Err(r)
            }
        }
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
        self.aborted = Some(reason);
        self.release_locks().await;
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

    async fn release_locks(&mut self) {
        let db = self.th.db.clone();
        let mut req = std::mem::take(&mut self.bufs.req);
        let mut any = false;
        for it in &mut self.items {
            let Some(tok) = it.lock.take() else { continue };
            if it.home == db.node {
                db.unlock(it.table, it.key, tok);
            } else {
                req.clear();
                wire::key_request(&mut req, it.table, it.key, None);
                wire::put_u64(&mut req, tok.offset);
                wire::put_u64(&mut req, tok.store_version);
                // A lost unlock leaves the key locked until recovery; the RPC layer
                // retransmits, so this only happens if the primary is gone.
                if self.ctx.queue(it.home, rtype::UNLOCK, &req).is_ok() {
                    any = true;
                }
            }
        }
        self.bufs.req = req;
        if any {
            let _ = self.ctx.flush().await;
        }
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
        // An update without set() writes back the value read; an insert without set()
        // inserts zeroes.
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
        let read_only = self.items.iter().all(|it| it.write.is_none());
        // Single-key read-only transactions skip validation (FaSST §5).
        if !(read_only && self.items.len() <= 1) {
            let t0 = self.ctx.step_ns();
            let v = self.validate().await;
            self.phase_ns[Phase::Validate as usize] += self.ctx.step_ns() - t0;
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
        let t0 = self.ctx.step_ns();
        let logged = self.log().await;
        self.phase_ns[Phase::Log as usize] += self.ctx.step_ns() - t0;
        if let Err(r) = logged {
            self.fail(r).await;
            return Err(r);
        }
        // From here the transaction is committed: its record is in every log replica.
        let t0 = self.ctx.step_ns();
        let backups_ok = self.commit_backups().await;
        let t1 = self.ctx.step_ns();
        self.phase_ns[Phase::CommitBackup as usize] += t1 - t0;
        let primaries_ok = self.commit_primaries().await;
        self.phase_ns[Phase::CommitPrimary as usize] += self.ctx.step_ns() - t1;
        let complete = backups_ok && primaries_ok;
        if complete {
            self.th.truncate_later(self.id);
        }
        self.finish_commit(false, !complete);
        Ok(Committed {
            id: self.id,
            read_only: false,
        })
    }

    fn finish_commit(&mut self, read_only: bool, incomplete: bool) {
        let end = self.ctx.step_ns();
        {
            let mut st = self.th.stats.borrow_mut();
            st.committed += 1;
            if read_only {
                st.read_only_committed += 1;
            }
            if incomplete {
                st.committed_incomplete += 1;
            }
            for p in 0..5 {
                if self.phase_ns[p] > 0 || (p == 0) {
                    st.phase_ns[p] += self.phase_ns[p];
                    st.phase_count[p] += 1;
                }
            }
        }
        if self.th.records_history() {
            self.th
                .record(self.id, &self.items_view(), Ok(()), self.start_ns, end);
        }
        self.done = true;
    }

    async fn validate(&mut self) -> Result<(), AbortReason> {
        if self.th.cfg.skip_validation_for_tests {
            return Ok(());
        }
        let db = self.th.db.clone();
        let mut req = std::mem::take(&mut self.bufs.req);
        let mut any = false;
        let mut failure = None;
        for it in &mut self.items {
            if it.write.is_some() {
                continue;
            }
            if it.home == db.node {
                if let Err(r) = check_unchanged(it, db.validate(it.table, it.key)) {
                    failure.get_or_insert(r);
                }
            } else {
                req.clear();
                wire::key_request(&mut req, it.table, it.key, None);
                match self.ctx.queue(it.home, rtype::VALIDATE, &req) {
                    Ok(h) => {
                        it.pending = Some(h);
                        any = true;
                    }
                    Err(_) => {
                        failure.get_or_insert(AbortReason::Timeout);
                    }
                }
            }
        }
        self.bufs.req = req;
        if any {
            let flushed = self.ctx.flush().await;
            for it in &mut self.items {
                let Some(h) = it.pending.take() else { continue };
                match self.ctx.response(h, parse_status) {
                    Ok(Some(f)) => {
                        if let Err(r) = check_unchanged(it, f) {
                            failure.get_or_insert(r);
                        }
                    }
                    Ok(None) => {
                        failure.get_or_insert(AbortReason::BadResponse);
                    }
                    Err(_) => {
                        failure.get_or_insert(if flushed.is_err() {
                            AbortReason::Timeout
                        } else {
                            AbortReason::BadResponse
                        });
                    }
                }
            }
        }
        failure.map_or(Ok(()), Err)
    }

    /// Encodes the writes of this transaction for `node` (primary: with lock tokens).
    /// The write-set keys selected by `filter`, as commit-record entries (primary: with
    /// lock tokens).
    fn writes<'a>(
        &'a self,
        filter: impl Fn(&Item) -> bool + 'a,
    ) -> impl Iterator<Item = WriteRec<'a>> + 'a {
        self.items
            .iter()
            .filter(move |it| it.write.is_some() && filter(it))
            .map(|it| WriteRec {
                table: it.table,
                key: it.key,
                kind: it.write.expect("write-set key"),
                prev_version: it.version,
                token: it.lock.unwrap_or(LockToken {
                    offset: 0,
                    store_version: 0,
                }),
                value: it.new_value.as_deref().unwrap_or(&[]),
            })
    }

    /// Encodes the writes selected by `filter` into `out`; returns how many.
    fn encode_writes(&self, out: &mut Vec<u8>, filter: impl Fn(&Item) -> bool) -> u16 {
        let mut n = 0u16;
        for w in self.writes(filter) {
            wire::put_write(out, &w);
            n += 1;
        }
        n
    }

    async fn log(&mut self) -> Result<(), AbortReason> {
        let placement = self.th.db.placement;
        let me = self.th.db.node;
        let mut body = std::mem::take(&mut self.bufs.body);
        body.clear();
        let n = self.encode_writes(&mut body, |_| true);
        // The coordinator's own node is always a log replica.
        self.th.log.borrow_mut().append(self.id, me, &body);
        let mut handles = std::mem::take(&mut self.bufs.handles);
        handles.clear();
        let mut req = std::mem::take(&mut self.bufs.req);
        let mut queued = Ok(());
        for replica in placement.log_replicas(me).skip(1) {
            req.clear();
            wire::put_commit_header(&mut req, self.id, n);
            req.extend_from_slice(&body);
            self.th.take_truncations(replica, &mut req);
            match self.ctx.queue(replica, rtype::LOG, &req) {
                Ok(h) => handles.push(h),
                Err(_) => {
                    queued = Err(AbortReason::Timeout);
                    break;
                }
            }
        }
        self.bufs.req = req;
        self.bufs.body = body;
        if queued.is_err() || handles.is_empty() {
            self.bufs.handles = handles;
            return queued;
        }
        let flushed = self.ctx.flush().await;
        let mut result = Ok(());
        for &h in &handles {
            if self.ctx.response(h, |_| ()).is_err() || flushed.is_err() {
                // The record may sit at some replicas; recovery resolves it as aborted
                // since not all replicas have it.
                self.th.log.borrow_mut().truncate(self.id);
                result = Err(AbortReason::Timeout);
                break;
            }
        }
        self.bufs.handles = handles;
        result
    }

    /// Sends each node the writes it must apply; `backups` selects backups or primaries.
    /// Returns false if some node did not acknowledge.
    async fn commit_to(&mut self, primaries: bool) -> bool {
        let db = self.th.db.clone();
        let placement = db.placement;
        let me = db.node;
        let mut targets = std::mem::take(&mut self.bufs.targets);
        targets.clear();
        for it in self.items.iter().filter(|it| it.write.is_some()) {
            if primaries {
                targets.push(it.home);
            } else {
                targets.extend(placement.backups(it.table, it.key));
            }
        }
        targets.sort_unstable();
        targets.dedup();
        let mut ok = true;
        let mut handles = std::mem::take(&mut self.bufs.handles);
        handles.clear();
        let mut req = std::mem::take(&mut self.bufs.req);
        for &node in &targets {
            let holds = |it: &Item| {
                if primaries {
                    it.home == node
                } else {
                    placement.backups(it.table, it.key).any(|b| b == node)
                }
            };
            if node == me {
                // Local copies are applied in place: no encoding round trip.
                for w in self.writes(holds) {
                    ok &= if primaries {
                        db.commit_primary(self.id, &w)
                    } else {
                        db.apply_backup(self.id, &w)
                    };
                }
                continue;
            }
            req.clear();
            wire::put_commit_header(&mut req, self.id, 0);
            let n = self.encode_writes(&mut req, holds);
            req[8..10].copy_from_slice(&n.to_le_bytes());
            let rt = if primaries {
                rtype::COMMIT_PRIMARY
            } else {
                rtype::COMMIT_BACKUP
            };
            match self.ctx.queue(node, rt, &req) {
                Ok(h) => handles.push(h),
                Err(_) => ok = false,
            }
        }
        self.bufs.req = req;
        self.bufs.targets = targets;
        if !handles.is_empty() {
            let flushed = self.ctx.flush().await;
            ok &= flushed.is_ok();
            for &h in &handles {
                ok &= self
                    .ctx
                    .response(h, |r| r.first() == Some(&status::OK))
                    .unwrap_or(false);
            }
        }
        self.bufs.handles = handles;
        if primaries {
            for it in &mut self.items {
                it.lock = None;
            }
        }
        ok
    }

    async fn commit_backups(&mut self) -> bool {
        self.commit_to(false).await
    }

    async fn commit_primaries(&mut self) -> bool {
        self.commit_to(true).await
    }
}

impl Drop for Txn<'_> {
    fn drop(&mut self) {
        // A transaction dropped without commit or abort (an application bug) would leave
        // locks held at primaries; count it so it cannot go unnoticed.
        if !self.done && self.items.iter().any(|it| it.lock.is_some()) {
            self.th.stats.borrow_mut().abort(AbortReason::User);
        }
        // Hand the buffers to the thread's next transaction.
        let mut bufs = std::mem::take(&mut self.bufs);
        for it in self.items.drain(..) {
            for mut v in std::iter::once(it.value).chain(it.new_value) {
                if bufs.bytes.len() < SPARE_BYTES && v.capacity() > 0 {
                    v.clear();
                    bufs.bytes.push(v);
                }
            }
        }
        bufs.items = std::mem::take(&mut self.items);
        let mut pool = self.th.bufs.borrow_mut();
        if pool.len() < POOLED_TXNS {
            pool.push(bufs);
        }
    }
}

/// Takes a READ/LOCK answer into the item, or says why the transaction must abort.
fn absorb(it: &mut Item, f: Fetched, val: Vec<u8>) -> Result<(), AbortReason> {
    // The item keeps the buffer whatever happens (it is reused by later transactions).
    it.value = val;
    if f.status != status::OK {
        it.value.clear();
    }
    if !matches!(
        f.status,
        status::OK | status::ABSENT | status::ABSENT_LOCKED
    ) {
        // Nothing was read (locked, exists, full, malformed): the key stays unfetched so
        // it is neither used nor recorded as a read.
        it.fetched = false;
    } else {
        it.fetched = true;
        it.version = f.version;
    }
    match f.status {
        status::OK => {
            it.exists = true;
            if it.write.is_some() {
                it.lock = Some(f.token);
            }
            Ok(())
        }
        status::ABSENT => {
            it.exists = false;
            // Update or delete of an absent key fails; a read of one is fine.
            if it.write.is_some() {
                Err(AbortReason::MissingKey)
            } else {
                Ok(())
            }
        }
        status::ABSENT_LOCKED if it.write == Some(WriteKind::Insert) => {
            it.exists = false;
            it.lock = Some(f.token);
            Ok(())
        }
        status::LOCKED => Err(AbortReason::LockedAtExecute),
        status::EXISTS => Err(AbortReason::InsertExists),
        status::FULL => Err(AbortReason::TableFull),
        _ => Err(AbortReason::BadResponse),
    }
}

/// Validation of one read-only key: same existence, same version, not locked.
fn check_unchanged(it: &Item, f: Fetched) -> Result<(), AbortReason> {
    match f.status {
        status::LOCKED => Err(AbortReason::LockedAtValidate),
        status::OK | status::ABSENT => {
            if (f.status == status::OK) != it.exists || f.version != it.version {
                Err(AbortReason::VersionChanged)
            } else {
                Ok(())
            }
        }
        _ => Err(AbortReason::BadResponse),
    }
}

/// Parses a VALIDATE response (`[status][version]`, no value).
fn parse_status(r: &[u8]) -> Option<Fetched> {
    let mut rd = Reader::new(r);
    let status = rd.u8()?;
    let version = rd.u64()?;
    Some(Fetched {
        status,
        version,
        token: LockToken {
            offset: 0,
            store_version: 0,
        },
    })
}

/// Parses a READ / LOCK response: `[status][version]` then, for LOCK,
/// `[offset][store_version]`, then the value, appended to `val`.
fn parse_fetch(r: &[u8], is_lock: bool, val: &mut Vec<u8>) -> Option<Fetched> {
    let mut rd = Reader::new(r);
    let status = rd.u8()?;
    let version = rd.u64()?;
    let token = if is_lock {
        LockToken {
            offset: rd.u64()?,
            store_version: rd.u64()?,
        }
    } else {
        LockToken {
            offset: 0,
            store_version: 0,
        }
    };
    val.extend_from_slice(rd.rest());
    Some(Fetched {
        status,
        version,
        token,
    })
}
