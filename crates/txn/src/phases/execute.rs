//! Execute (FaSST §5 step 1, DrTM+H §5.1): fetch the values and versions of the keys
//! added since the last call, with as few round trips as the policy allows.
//!
//! Per remote key, by [`policy::Execute`]:
//! - `rpc`: a READ RPC (READ_LOC when a later phase needs the item's address);
//! - `onesided`: a bucket READ (and overflow buckets), then the item's READ;
//! - `cached`: the location cache first (one item READ), else the bucket walk, which
//!   fills it;
//! - `hybrid`: the location cache first, else a READ_LOC RPC, which fills it.
//!
//! A cached location is a hint: the item READ checks key and header, and a stale one is
//! dropped and the key fetched the other way. A locked item aborts the transaction as
//! the RPC path does; a torn one (a write in progress) is read again a few times.
//! Write-set keys are locked at their primary in the execute round trip when the policy
//! folds the lock into it (`rpc` execute with `rpc` lock, FaSST), and always for
//! inserts (only the primary's CPU can allocate the item); otherwise they are read like
//! read-set keys and locked by the lock phase ([`super::lock`]).
//!
//! Every step of every key goes out in the same round: one doorbell per round trip.

use super::rpc_failure;
use crate::actions;
use crate::messages::{
    rtype, DecodeError, Fetched, LockResp, ReadReq, ReadResp, Status, WriteKind,
};
use crate::onesided::{self, RemoteTable, RemoteTables, Walk, WalkStep, BUCKET_BYTES};
use crate::policy;
use crate::stats::AbortReason;
use crate::txn::{Item, Txn};
use ambidex_rpc::{OneSidedError, OpHandle, ReqHandle, RpcError};
use ambidex_store::Loc;
use ambidex_transport::AccessError;
use std::rc::Rc;

/// Times a torn item (a write in progress) is read again before the transaction gives
/// up as if it were locked.
const TORN_RETRIES: u8 = 8;

/// Where an item's fetch came from, for the location cache's bookkeeping.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Source {
    Cache,
    /// A bucket walk, whose state is `TxnBufs::walks[i]` (kept out of the item, which
    /// every transaction moves and copies).
    Walk(u16),
}

/// A fetch in progress of one key (on its [`Item`]).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Fetch {
    /// An RPC in flight (its handle in `Item::pending`).
    Lock,
    Read,
    ReadLoc,
    /// A one-sided READ in flight.
    Bucket {
        op: OpHandle,
        hops: u32,
    },
    Item {
        op: OpHandle,
        off: u64,
        from: Source,
        tries: u8,
    },
    /// To queue at the next round.
    NextBucket {
        off: u64,
        hops: u32,
    },
    NextItem {
        off: u64,
        from: Source,
        tries: u8,
    },
    NextReadLoc,
}

/// Why a one-sided operation's result is unusable.
pub(crate) fn onesided_failure(e: &OneSidedError) -> AbortReason {
    match e {
        OneSidedError::Access {
            error: AccessError::Timeout,
            ..
        }
        | OneSidedError::NotPosted
        | OneSidedError::NotReady => AbortReason::Timeout,
        // Failed by the initiator's move to a new configuration, or fenced by the
        // target's: not a malformed answer (and worth trying again).
        OneSidedError::Access {
            error: AccessError::EpochChanged,
            ..
        } => AbortReason::EpochChanged,
        _ => AbortReason::BadResponse,
    }
}

impl Txn<'_> {
    /// Fetches every key not yet fetched. The caller aborts on error.
    pub(crate) async fn execute_phase(&mut self) -> Result<(), AbortReason> {
        let mut failure = None;
        self.bufs.walks.clear();
        let mut any = self.queue_orphans();
        let mut req = std::mem::take(&mut self.bufs.req);
        for i in 0..self.items.len() {
            let it = &self.items[i];
            if it.fetched || it.fetch.is_some() {
                continue;
            }
            match self.start_fetch(i, &mut req) {
                Ok(remote) => any |= remote,
                Err(r) => {
                    failure.get_or_insert(r);
                }
            }
        }
        while any {
            let flushed = self.flushed(self.ctx.flush().await);
            any = false;
            let mut next = false;
            for i in 0..self.items.len() {
                if let Err(r) = self.take_fetch_result(i, flushed) {
                    failure.get_or_insert(r);
                }
                next |= matches!(
                    self.items[i].fetch,
                    Some(Fetch::NextBucket { .. } | Fetch::NextItem { .. } | Fetch::NextReadLoc)
                );
            }
            // RPC-only fetches finish in one round trip.
            if !next {
                break;
            }
            let mut queued = false;
            for i in 0..self.items.len() {
                if !matches!(
                    self.items[i].fetch,
                    Some(Fetch::NextBucket { .. } | Fetch::NextItem { .. } | Fetch::NextReadLoc)
                ) {
                    continue;
                }
                if failure.is_some() {
                    self.items[i].fetch = None;
                    continue;
                }
                match self.queue_next(i, &mut req) {
                    Ok(true) => {
                        any = true;
                        queued = true;
                    }
                    Ok(false) => any = true,
                    Err(r) => {
                        self.items[i].fetch = None;
                        failure.get_or_insert(r);
                    }
                }
            }
            if any && !queued {
                // Steps wait for scratch that nothing of this round frees: the
                // coroutine has no scratch to READ into.
                for it in &mut self.items {
                    it.fetch = None;
                }
                failure.get_or_insert(AbortReason::BadResponse);
                any = false;
            }
        }
        self.bufs.req = req;
        failure.map_or(Ok(()), Err)
    }

    /// Starts fetching item `i`: in place if local, else its first remote step queued.
    /// Returns whether anything remote was queued.
    fn start_fetch(&mut self, i: usize, req: &mut Vec<u8>) -> Result<bool, AbortReason> {
        let pol = self.th.cfg.policy;
        let it = &self.items[i];
        if let Some(kind) = it.write {
            if kind == WriteKind::Insert || pol.lock_at_execute() {
                return self.lock_item(i, req);
            }
        }
        let it = &mut self.items[i];
        let db = &self.th.db;
        if it.home == db.node {
            let mut val = std::mem::take(&mut it.value);
            val.clear();
            let f = actions::read(db, it.table, it.key, &mut val);
            return absorb(it, f, val, false).map(|_| false);
        }
        let next = match pol.execute {
            policy::Execute::Rpc if pol.needs_locations() => Fetch::NextReadLoc,
            policy::Execute::Rpc => return self.queue_read_rpc(i, req, false).map(|_| true),
            policy::Execute::OneSided => {
                let t = self.remote_table(i)?;
                Fetch::NextBucket {
                    off: onesided::main_bucket(&t, self.items[i].key),
                    hops: 0,
                }
            }
            policy::Execute::Cached | policy::Execute::Hybrid => {
                let t = self.remote_table(i)?;
                let it = &self.items[i];
                let cached = self
                    .th
                    .db
                    .location_cache
                    .get(it.table, it.key)
                    .filter(|l| l.node == it.home && l.region == t.desc.region.id);
                match cached {
                    Some(l) => Fetch::NextItem {
                        off: l.offset,
                        from: Source::Cache,
                        tries: 0,
                    },
                    None => {
                        self.th.stats.borrow_mut().location_cache.misses += 1;
                        miss_fallback(pol.execute, &t, it.key)
                    }
                }
            }
        };
        self.items[i].fetch = Some(next);
        self.queue_next(i, req).map(|_| true)
    }

    /// The remote table of item `i`'s home.
    pub(crate) fn remote_table(&self, i: usize) -> Result<Rc<RemoteTable>, AbortReason> {
        let it = &self.items[i];
        RemoteTables::get(&self.th.remote, &self.th.db, it.home, it.table)
            .ok_or(AbortReason::NoRemoteTable)
    }

    /// Queues a READ (or READ_LOC) RPC for item `i`.
    fn queue_read_rpc(
        &mut self,
        i: usize,
        req: &mut Vec<u8>,
        located: bool,
    ) -> Result<(), AbortReason> {
        let it = &mut self.items[i];
        req.clear();
        ReadReq {
            table: it.table,
            key: it.key,
        }
        .encode(req);
        let rt = if located {
            rtype::READ_LOC
        } else {
            rtype::READ
        };
        let h = self
            .ctx
            .queue(it.home, rt, req)
            .map_err(|_| AbortReason::Timeout)?;
        it.pending = Some(h);
        it.fetch = Some(if located { Fetch::ReadLoc } else { Fetch::Read });
        Ok(())
    }

    /// Queues the step item `i`'s fetch is waiting for: true if queued, false if it
    /// waits for the next round (no scratch left in this one).
    fn queue_next(&mut self, i: usize, req: &mut Vec<u8>) -> Result<bool, AbortReason> {
        let next = self.items[i].fetch;
        let t = match next {
            Some(Fetch::NextReadLoc) => return self.queue_read_rpc(i, req, true).map(|_| true),
            Some(Fetch::NextBucket { .. } | Fetch::NextItem { .. }) => self.remote_table(i)?,
            _ => return Ok(false),
        };
        let queued = match next {
            Some(Fetch::NextBucket { off, hops }) => self
                .ctx
                .queue_read(t.at(off), BUCKET_BYTES, true)
                .map(|op| Fetch::Bucket { op, hops }),
            Some(Fetch::NextItem { off, from, tries }) => self
                .ctx
                .queue_read(t.at(off), t.shape.item_size as u32, true)
                .map(|op| Fetch::Item {
                    op,
                    off,
                    from,
                    tries,
                }),
            _ => return Ok(false),
        };
        match queued {
            Ok(f) => {
                self.items[i].fetch = Some(f);
                Ok(true)
            }
            // This round's READs filled the coroutine's scratch: the step waits for
            // the next round (the flush of this one frees the scratch). A READ larger
            // than the whole slice can never fit.
            Err(OneSidedError::NoScratch { need, .. }) if need <= crate::db::SCRATCH_PER_WORKER => {
                Ok(false)
            }
            Err(e) => Err(onesided_failure(&e)),
        }
    }

    /// Takes the result of item `i`'s step in flight, if any, and decides its next one.
    fn take_fetch_result(&mut self, i: usize, flushed: bool) -> Result<(), AbortReason> {
        let Some(f) = self.items[i].fetch else {
            return Ok(());
        };
        match f {
            Fetch::Lock | Fetch::Read | Fetch::ReadLoc => {
                self.items[i].fetch = None;
                let Some(h) = self.items[i].pending.take() else {
                    return Ok(());
                };
                match f {
                    Fetch::Lock => self.absorb_lock_response(i, h, flushed),
                    Fetch::Read => self.absorb_read_response(i, h, flushed),
                    _ => self.absorb_read_loc_response(i, h, flushed),
                }
            }
            Fetch::Bucket { op, hops } => {
                self.items[i].fetch = None;
                let t = self.remote_table(i)?;
                let key = self.items[i].key;
                let walk = self
                    .ctx
                    .read_result(op, |b| onesided::read_bucket(&t, key, b, hops))
                    .map_err(|e| onesided_failure(&e))?;
                self.walk_on(i, &t, walk, None)
            }
            Fetch::Item {
                op,
                off,
                from,
                tries,
            } => {
                self.items[i].fetch = None;
                self.take_item_read(i, op, off, from, tries)
            }
            // Not queued this round (no scratch left): stays for the next.
            Fetch::NextBucket { .. } | Fetch::NextItem { .. } | Fetch::NextReadLoc => Ok(()),
        }
    }

    /// The next step of a bucket walk: the next candidate item, the next bucket, or the
    /// key's absence.
    fn walk_on(
        &mut self,
        i: usize,
        t: &RemoteTable,
        mut walk: Walk,
        slot: Option<u16>,
    ) -> Result<(), AbortReason> {
        let step = onesided::next_step(t, &mut walk);
        let it = &mut self.items[i];
        it.fetch = match step {
            WalkStep::Item(off) => {
                let w = match slot {
                    Some(w) => {
                        self.bufs.walks[w as usize] = walk;
                        w
                    }
                    None => {
                        self.bufs.walks.push(walk);
                        (self.bufs.walks.len() - 1) as u16
                    }
                };
                Some(Fetch::NextItem {
                    off,
                    from: Source::Walk(w),
                    tries: 0,
                })
            }
            WalkStep::Bucket(off, hops) => Some(Fetch::NextBucket { off, hops }),
            WalkStep::NotFound => {
                it.fetched = true;
                it.exists = false;
                it.version = 0;
                it.loc = None;
                it.value.clear();
                return if it.write.is_some() {
                    Err(AbortReason::MissingKey)
                } else {
                    Ok(())
                };
            }
        };
        Ok(())
    }

    /// Takes an item READ: the key's value, a stale location, a locked or torn item.
    fn take_item_read(
        &mut self,
        i: usize,
        op: OpHandle,
        off: u64,
        from: Source,
        tries: u8,
    ) -> Result<(), AbortReason> {
        let t = self.remote_table(i)?;
        let pol = self.th.cfg.policy;
        let db = self.th.db.clone();
        let mut stored = self.th.stored.borrow_mut();
        let it = &mut self.items[i];
        let key = it.key;
        let mut val = std::mem::take(&mut it.value);
        let r = self.ctx.read_result(op, |img| {
            onesided::read_item(&t, img, key, &mut stored, &mut val)
        });
        it.value = val;
        let r = r.map_err(|e| onesided_failure(&e))?;
        match r {
            onesided::ItemRead::Found { hdr, version, live } => {
                it.fetched = true;
                it.exists = live;
                it.version = version;
                it.loc = Some(off);
                it.hdr = hdr;
                match from {
                    Source::Cache => self.th.stats.borrow_mut().location_cache.hits += 1,
                    Source::Walk(_) if pol.uses_location_cache() => db.location_cache.insert(
                        it.table,
                        key,
                        Loc {
                            node: it.home,
                            region: t.desc.region.id,
                            offset: off,
                        },
                    ),
                    Source::Walk(_) => {}
                }
                if !live && it.write.is_some() {
                    return Err(AbortReason::MissingKey);
                }
                Ok(())
            }
            onesided::ItemRead::Locked => Err(AbortReason::LockedAtExecute),
            onesided::ItemRead::Torn if tries < TORN_RETRIES => {
                it.fetch = Some(Fetch::NextItem {
                    off,
                    from,
                    tries: tries + 1,
                });
                Ok(())
            }
            onesided::ItemRead::Torn => Err(AbortReason::LockedAtExecute),
            onesided::ItemRead::Miss => match from {
                Source::Cache => {
                    self.th.stats.borrow_mut().location_cache.stale += 1;
                    db.location_cache.invalidate(it.table, key);
                    it.fetch = Some(miss_fallback(pol.execute, &t, key));
                    Ok(())
                }
                Source::Walk(w) => {
                    drop(stored);
                    let walk = self.bufs.walks[w as usize];
                    self.walk_on(i, &t, walk, Some(w))
                }
            },
        }
    }

    #[inline]
    fn absorb_read_response(
        &mut self,
        i: usize,
        h: ReqHandle,
        flushed: bool,
    ) -> Result<(), AbortReason> {
        self.take_fetch(i, h, flushed, false, |b| {
            ReadResp::decode(b).map(|r| {
                let f = Fetched {
                    status: r.status,
                    version: r.version,
                    token: Default::default(),
                };
                (f, r.value)
            })
        })
    }

    /// Takes a READ_LOC response: the value, and where the item is (into the location
    /// cache if the policy uses it).
    fn absorb_read_loc_response(
        &mut self,
        i: usize,
        h: ReqHandle,
        flushed: bool,
    ) -> Result<(), AbortReason> {
        let mut token = None;
        let r = self.take_fetch(i, h, flushed, false, |b| {
            LockResp::decode(b).map(|r| {
                token = Some(r.fetched.token);
                (r.fetched, r.value)
            })
        });
        let it = &mut self.items[i];
        if let Some(tok) = token.filter(|t| t.offset != 0 && it.fetched) {
            // Untrusted: an address the one-sided phases will CAS and WRITE must be an
            // item of the table, its header word unlocked and present.
            let h = tok.store_version;
            let valid = self.remote_table(i).is_ok_and(|t| {
                t.desc.layout.item_at(tok.offset).is_some()
                    && h & !ambidex_store::layout::VERSION_MASK == 0
                    && h & 1 == 1
            });
            if !valid {
                self.items[i].fetched = false;
                return Err(AbortReason::BadResponse);
            }
            let it = &mut self.items[i];
            it.loc = Some(tok.offset);
            it.hdr = tok.store_version;
            if self.th.cfg.policy.uses_location_cache() {
                let region = self.remote_table(i).map(|t| t.desc.region.id);
                if let Ok(region) = region {
                    let it = &self.items[i];
                    self.th.db.location_cache.insert(
                        it.table,
                        it.key,
                        Loc {
                            node: it.home,
                            region,
                            offset: tok.offset,
                        },
                    );
                }
            }
        }
        r
    }

    /// Takes the READ, READ_LOC or LOCK response `h` of item `i` (decoded by `decode`
    /// into its head and value) into the item; `locked`: a LOCK's (the token is a lock).
    #[inline]
    pub(crate) fn take_fetch(
        &mut self,
        i: usize,
        h: ReqHandle,
        flushed: bool,
        locked: bool,
        decode: impl FnOnce(&[u8]) -> Result<(Fetched, &[u8]), DecodeError>,
    ) -> Result<(), AbortReason> {
        // The answer goes into a spare buffer: a LOCK that fails leaves the item with
        // the value its execute read (the history records that read).
        let mut val = self.bufs.spare();
        val.clear();
        let parsed = self.ctx.response(h, |b| {
            decode(b).map(|(f, value)| {
                val.extend_from_slice(value);
                f
            })
        });
        let it = &mut self.items[i];
        match parsed {
            // A found value must have the table's size (untrusted).
            Ok(Ok(f))
                if f.status == Status::Ok && self.th.db.value_size(it.table) != Some(val.len()) =>
            {
                self.bufs.bytes.push(val);
                it.fetched = false;
                if locked && it.write.is_some() {
                    // The lock is held all the same: recorded so the abort releases it.
                    it.lock = Some(f.token);
                }
                Err(AbortReason::BadResponse)
            }
            Ok(Ok(f)) => {
                let old = std::mem::take(&mut it.value);
                self.bufs.bytes.push(old);
                absorb(it, f, val, locked)
            }
            Ok(Err(_)) => {
                self.bufs.bytes.push(val);
                Err(AbortReason::BadResponse)
            }
            Err(e) => {
                self.bufs.bytes.push(val);
                Err(rpc_failure(&e, flushed))
            }
        }
    }

    /// Whether a flush of the worker's batch went through: false if a request failed
    /// (a suspected node, a refused send). Unsignaled one-sided failures the flush
    /// reports (of this batch or an earlier one) are counted, not a failure of the
    /// flush: each phase checks its own operations' results, and commit ones are
    /// checked by the commit itself.
    #[inline]
    pub(crate) fn flushed(&self, r: Result<(), RpcError>) -> bool {
        match r {
            Ok(()) => true,
            Err(RpcError::UnsignaledFailed(v)) => {
                self.th.stats.borrow_mut().onesided_unsignaled_failures += v.len() as u64;
                true
            }
            Err(_) => false,
        }
    }
}

/// What a location-cache miss (or a stale entry) turns into.
fn miss_fallback(execute: policy::Execute, t: &RemoteTable, key: u64) -> Fetch {
    match execute {
        policy::Execute::Hybrid | policy::Execute::Rpc => Fetch::NextReadLoc,
        policy::Execute::OneSided | policy::Execute::Cached => Fetch::NextBucket {
            off: onesided::main_bucket(t, key),
            hops: 0,
        },
    }
}

/// Takes a READ/READ_LOC/LOCK answer into the item, or says why the transaction must
/// abort. `locked`: the answer is a LOCK's, whose token is the lock now held.
pub(crate) fn absorb(
    it: &mut Item,
    f: Fetched,
    val: Vec<u8>,
    locked: bool,
) -> Result<(), AbortReason> {
    // The item keeps the buffer whatever happens (it is reused by later transactions).
    it.value = val;
    if f.status != Status::Ok {
        it.value.clear();
    }
    if !matches!(f.status, Status::Ok | Status::Absent | Status::AbsentLocked) {
        // Nothing was read (locked, exists, full, malformed): the key stays unfetched so
        // it is neither used nor recorded as a read.
        it.fetched = false;
    } else {
        it.fetched = true;
        it.version = f.version;
    }
    match f.status {
        Status::Ok => {
            it.exists = true;
            if locked && it.write.is_some() {
                it.lock = Some(f.token);
            }
            Ok(())
        }
        Status::Absent => {
            it.exists = false;
            // Update or delete of an absent key fails; a read of one is fine.
            if it.write.is_some() {
                Err(AbortReason::MissingKey)
            } else {
                Ok(())
            }
        }
        Status::AbsentLocked if locked && it.write == Some(WriteKind::Insert) => {
            it.exists = false;
            it.lock = Some(f.token);
            Ok(())
        }
        Status::Locked => Err(AbortReason::LockedAtExecute),
        Status::Exists => Err(AbortReason::InsertExists),
        Status::Full => Err(AbortReason::TableFull),
        _ => Err(AbortReason::BadResponse),
    }
}
