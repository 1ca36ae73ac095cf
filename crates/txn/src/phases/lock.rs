//! Lock: write-set keys are locked at their primary, which reads the value under the
//! lock (FaSST §5 step 1). With [`policy::Lock::Rpc`] this is a LOCK RPC sent in the
//! execute round trip, so the phase has no time of its own (see [`crate::stats::Phase`]).
//! Also here: releasing locks on abort (UNLOCK), and the locks of a transaction dropped
//! without commit or abort ("orphans"): local ones are released at once, remote ones
//! queued on the thread and sent with its next round trip.

use super::execute::{absorb, onesided_failure, Fetch};
use crate::actions;
use crate::messages::{rtype, LockReq, LockResp, LockToken, UnlockReq, WriteKind};
use crate::policy;
use crate::stats::AbortReason;
use crate::txn::{Item, Txn};
use ambidex_rpc::{OneSidedError, OpHandle, ReqHandle};
use ambidex_store::Header;
use ambidex_transport::NodeId;

/// A lock of the lock phase awaiting its answer: the item, the version and existence
/// execute read, and the header READ behind a CAS lock (none: a LOCK RPC).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Locking {
    item: usize,
    version: u64,
    exists: bool,
    read: Option<OpHandle>,
}

/// A remote lock of a dropped transaction, to be released by its thread.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Orphan {
    pub home: NodeId,
    pub table: u32,
    pub key: u64,
    pub slot: u16,
    pub token: LockToken,
}

impl Txn<'_> {
    /// Locks write-set item `i` in the execute round trip (FaSST's folded lock, and
    /// every insert): in place if local, else a LOCK queued (returns true).
    pub(crate) fn lock_item(&mut self, i: usize, req: &mut Vec<u8>) -> Result<bool, AbortReason> {
        let db = &self.th.db;
        let owner = self.owner;
        let it = &mut self.items[i];
        let Some(kind) = it.write else {
            return Ok(false);
        };
        if it.home == db.node {
            let mut val = std::mem::take(&mut it.value);
            val.clear();
            let f = actions::lock(db, it.table, it.key, kind, owner, &mut val);
            return absorb(it, f, val, true).map(|_| false);
        }
        self.queue_lock_rpc(i, req).map(|_| true)
    }

    fn queue_lock_rpc(&mut self, i: usize, req: &mut Vec<u8>) -> Result<(), AbortReason> {
        let slot = self.owner.slot;
        let it = &mut self.items[i];
        let kind = it.write.unwrap_or(WriteKind::Update);
        req.clear();
        LockReq {
            table: it.table,
            key: it.key,
            kind,
            slot,
        }
        .encode(req);
        match self.ctx.queue(it.home, rtype::LOCK, req) {
            Ok(h) => {
                it.pending = Some(h);
                it.fetch = Some(Fetch::Lock);
                Ok(())
            }
            Err(_) => Err(AbortReason::Timeout),
        }
    }

    /// Takes the LOCK response of item `i`.
    #[inline]
    pub(crate) fn absorb_lock_response(
        &mut self,
        i: usize,
        h: ReqHandle,
        flushed: bool,
    ) -> Result<(), AbortReason> {
        if self.ctx.response(h, |_| ()).is_err() {
            // No answer: the LOCK may have executed, leaving a lock that names this
            // slot.
            self.own_slot = false;
        }
        self.take_fetch(i, h, flushed, true, |b| {
            LockResp::decode(b).map(|r| (r.fetched, r.value))
        })
    }

    /// The lock phase of policies that do not fold it into execute (DrTM+H §5.2):
    /// every write-set key read at execute and not locked yet is locked, and the lock
    /// checked against the version read, in one round trip. `cas`: a CAS of the
    /// header with a READ of it behind on the same queue; `rpc`: a LOCK RPC, whose
    /// answer carries the version under the lock. Local keys lock in place.
    pub(crate) async fn lock_phase(&mut self) -> Result<(), AbortReason> {
        let db = self.th.db.clone();
        let owner = self.owner;
        let cas = self.th.cfg.policy.lock == policy::Lock::Cas;
        let mut failure = None;
        let mut waiting = std::mem::take(&mut self.bufs.locking);
        waiting.clear();
        let mut req = std::mem::take(&mut self.bufs.req);
        let mut any = self.queue_orphans();
        for i in 0..self.items.len() {
            let it = &self.items[i];
            if it.write.is_none() || it.lock.is_some() || !it.fetched {
                continue;
            }
            let (version, exists) = (it.version, it.exists);
            if it.home == db.node {
                let it = &mut self.items[i];
                let mut val = std::mem::take(&mut it.value);
                val.clear();
                let kind = it.write.unwrap_or(WriteKind::Update);
                let f = actions::lock(&db, it.table, it.key, kind, owner, &mut val);
                let r = absorb(it, f, val, true).map_err(at_lock);
                if let Err(r) = r.and_then(|_| unchanged(it, version, exists)) {
                    failure.get_or_insert(r);
                }
                continue;
            }
            let loc = self.items[i].loc;
            // A shared slot cannot recognise its lock by the owner in the word.
            match (cas && self.own_slot, loc) {
                (true, Some(off)) => match self.queue_cas_lock(i, off) {
                    Ok(read) => {
                        waiting.push(Locking {
                            item: i,
                            version,
                            exists,
                            read: Some(read),
                        });
                        any = true;
                    }
                    Err(r) => {
                        failure.get_or_insert(r);
                    }
                },
                _ => match self.queue_lock_rpc(i, &mut req) {
                    Ok(()) => {
                        waiting.push(Locking {
                            item: i,
                            version,
                            exists,
                            read: None,
                        });
                        any = true;
                    }
                    Err(r) => {
                        failure.get_or_insert(r);
                    }
                },
            }
        }
        self.bufs.req = req;
        if any {
            let flushed = self.flushed(self.ctx.flush().await);
            for &Locking {
                item: i,
                version,
                exists,
                read,
            } in &waiting
            {
                let r = match read {
                    Some(op) => self.take_cas_lock(i, op),
                    None => {
                        self.items[i].fetch = None;
                        match self.items[i].pending.take() {
                            Some(h) => self
                                .absorb_lock_response(i, h, flushed)
                                .map_err(at_lock)
                                .and_then(|_| unchanged(&self.items[i], version, exists)),
                            None => Err(AbortReason::Timeout),
                        }
                    }
                };
                if let Err(r) = r {
                    failure.get_or_insert(r);
                }
            }
        }
        self.bufs.locking = waiting;
        failure.map_or(Ok(()), Err)
    }

    /// Queues the CAS that locks item `i` at `off` (unsignaled: the READ behind it on
    /// the same queue confirms it, passive ACK) and the READ of its header; returns the
    /// READ's handle.
    fn queue_cas_lock(&mut self, i: usize, off: u64) -> Result<OpHandle, AbortReason> {
        let t = self.remote_table(i)?;
        let hdr = self.items[i].hdr;
        let at = t.at(off);
        let fail = |e: OneSidedError| onesided_failure(&e);
        self.ctx
            .queue_cas(
                at,
                Header::unlocked(hdr),
                Header::locked(hdr, self.owner),
                false,
            )
            .map_err(fail)?;
        let read = self.ctx.queue_read(at, 8, true).map_err(|e| {
            // The CAS goes out with the batch and may take a lock nobody records.
            self.own_slot = false;
            fail(e)
        })?;
        // Marks the lock's outcome unknown until the READ is taken (a transaction
        // dropped meanwhile must not give its slot away).
        self.items[i].fetch = Some(Fetch::Lock);
        Ok(read)
    }

    /// Decides a CAS lock by the header READ behind it: ours at the version read at
    /// execute, someone else's, or changed.
    fn take_cas_lock(&mut self, i: usize, read: OpHandle) -> Result<(), AbortReason> {
        self.items[i].fetch = None;
        let word = self
            .ctx
            .read_result(read, |b| {
                u64::from_ne_bytes(b.get(..8).and_then(|w| w.try_into().ok()).unwrap_or([0; 8]))
            })
            .map_err(|e| {
                // The CAS may have taken the lock: the slot must not name another
                // transaction's locks.
                self.own_slot = false;
                onesided_failure(&e)
            })?;
        let it = &mut self.items[i];
        let (Some(off), hdr) = (it.loc, it.hdr) else {
            return Err(AbortReason::BadResponse);
        };
        if word == Header::locked(hdr, self.owner) {
            it.lock = Some(LockToken {
                offset: off,
                store_version: hdr,
            });
            Ok(())
        } else if Header::is_locked(word) || word == Header::unlocked(hdr) {
            // Held by another transaction, or it was when the CAS ran.
            Err(AbortReason::LockedAtLock)
        } else {
            Err(AbortReason::VersionChanged)
        }
    }

    /// Releases every lock held (abort) and waits for every release: an UNLOCK RPC, or
    /// with CAS locks a CAS back to the unlocked word. A release whose outcome is not
    /// known (a failed RPC or CAS) may leave a lock naming this transaction's slot, so
    /// the slot is retired: a later transaction with the same owner would take that
    /// lock for its own.
    pub(crate) async fn release_locks(&mut self) {
        let db = self.th.db.clone();
        let cas = self.th.cfg.policy.lock == policy::Lock::Cas;
        let mut req = std::mem::take(&mut self.bufs.req);
        let mut releases = std::mem::take(&mut self.bufs.reads);
        releases.clear();
        self.bufs.handles.clear();
        let mut any = self.queue_orphans();
        let mut unknown = false;
        for i in 0..self.items.len() {
            let it = &mut self.items[i];
            let Some(tok) = it.lock.take() else { continue };
            if it.home == db.node {
                actions::release(&db, it.table, it.key, tok, self.owner);
                continue;
            }
            if cas {
                if let Ok(t) = self.remote_table(i) {
                    let held = Header::locked(tok.store_version, self.owner);
                    let free = Header::unlocked(tok.store_version);
                    if let Ok(op) = self.ctx.queue_cas(t.at(tok.offset), held, free, true) {
                        releases.push((i, op));
                        any = true;
                        continue;
                    }
                }
            }
            let it = &self.items[i];
            req.clear();
            UnlockReq {
                table: it.table,
                key: it.key,
                slot: self.owner.slot,
                token: tok,
            }
            .encode(&mut req);
            match self.ctx.queue(it.home, rtype::UNLOCK, &req) {
                Ok(h) => {
                    self.bufs.handles.push(h);
                    any = true;
                }
                Err(_) => unknown = true,
            }
        }
        self.bufs.req = req;
        if any {
            let r = self.ctx.flush().await;
            unknown |= !self.flushed(r);
            for &(_, op) in &releases {
                unknown |= self.ctx.atomic_result(op).is_err();
            }
            for &h in &self.bufs.handles {
                unknown |= self.ctx.response(h, |_| ()).is_err();
            }
        }
        self.bufs.reads = releases;
        if unknown {
            self.own_slot = false;
        }
    }

    /// Queues UNLOCKs for the thread's orphaned locks (responses are not awaited: an
    /// unlock of a lock no longer held is a no-op). Returns whether any was queued.
    #[inline]
    pub(crate) fn queue_orphans(&mut self) -> bool {
        // Every round trip checks; orphans are rare (an application bug).
        if self.th.orphans.borrow().is_empty() {
            return false;
        }
        self.queue_orphans_now()
    }

    #[inline(never)]
    fn queue_orphans_now(&mut self) -> bool {
        let mut orphans = self.th.orphans.borrow_mut();
        let mut req = std::mem::take(&mut self.bufs.req);
        let mut any = false;
        for o in orphans.drain(..) {
            req.clear();
            UnlockReq {
                table: o.table,
                key: o.key,
                slot: o.slot,
                token: o.token,
            }
            .encode(&mut req);
            any |= self.ctx.queue(o.home, rtype::UNLOCK, &req).is_ok();
        }
        self.bufs.req = req;
        any
    }

    /// For a transaction dropped without commit or abort: releases its local locks and
    /// hands its remote ones to the thread. A LOCK whose response has arrived but was not
    /// taken yet (a future dropped mid-round-trip) is taken now; one still in flight
    /// cannot be named (recovery finds it by its owner). Returns whether any lock was
    /// held, and whether a lock naming the slot may outlive the transaction (a LOCK or
    /// CAS in flight, remote locks the thread releases later): then its slot must not be
    /// given to another transaction, whose owner it would share.
    pub(crate) fn orphan_locks(&mut self) -> (bool, bool) {
        let db = self.th.db.clone();
        let (mut any, mut unknown) = (false, false);
        for i in 0..self.items.len() {
            let fetch = self.items[i].fetch.take();
            let pending = self.items[i].pending.take();
            if matches!(fetch, Some(Fetch::Lock)) {
                match pending {
                    Some(h) => {
                        // No response (still in flight, or the request failed): the
                        // LOCK may yet execute, or may have.
                        unknown |= self.ctx.response(h, |_| ()).is_err();
                        let _ = self.absorb_lock_response(i, h, true);
                    }
                    // A CAS lock in flight: it may take the lock.
                    None => unknown = true,
                }
            }
            let it = &mut self.items[i];
            let Some(token) = it.lock.take() else {
                continue;
            };
            any = true;
            if it.home == db.node {
                actions::release(&db, it.table, it.key, token, self.owner);
            } else {
                // Released later by the thread: until then the lock names this slot.
                unknown = true;
                self.th.orphans.borrow_mut().push(Orphan {
                    home: it.home,
                    table: it.table,
                    key: it.key,
                    slot: self.owner.slot,
                    token,
                });
            }
        }
        (any, unknown)
    }
}

/// A lock refused at the lock phase is counted as such (at execute it is
/// `LockedAtExecute`).
fn at_lock(r: AbortReason) -> AbortReason {
    match r {
        AbortReason::LockedAtExecute => AbortReason::LockedAtLock,
        r => r,
    }
}

/// The key locked at the lock phase must be as execute read it (OCC validation of the
/// write set: the locked record cannot change again, DrTM+H §5.2).
fn unchanged(it: &Item, version: u64, exists: bool) -> Result<(), AbortReason> {
    if it.version == version && it.exists == exists {
        Ok(())
    } else {
        Err(AbortReason::VersionChanged)
    }
}
