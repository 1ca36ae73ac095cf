//! Lock: write-set keys are locked at their primary, which reads the value under the
//! lock (FaSST §5 step 1). With [`policy::Lock::Rpc`] this is a LOCK RPC sent in the
//! execute round trip, so the phase has no time of its own (see [`crate::stats::Phase`]).
//! Also here: releasing locks on abort (UNLOCK), and the locks of a transaction dropped
//! without commit or abort ("orphans"): local ones are released at once, remote ones
//! queued on the thread and sent with its next round trip.

use super::execute::absorb;
use crate::actions;
use crate::messages::{rtype, LockReq, LockResp, LockToken, UnlockReq};
use crate::policy;
use crate::stats::AbortReason;
use crate::txn::Txn;
use ambidex_rpc::ReqHandle;
use ambidex_transport::NodeId;

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
    /// Locks write-set item `i`: in place if local, else a LOCK queued (returns true).
    #[inline]
    pub(crate) fn lock_item(&mut self, i: usize, req: &mut Vec<u8>) -> Result<bool, AbortReason> {
        match self.th.cfg.policy.lock {
            policy::Lock::Rpc => self.lock_item_rpc(i, req),
            _ => todo!("issue 17: one-sided phases"),
        }
    }

    fn lock_item_rpc(&mut self, i: usize, req: &mut Vec<u8>) -> Result<bool, AbortReason> {
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
            return absorb(it, f, val).map(|_| false);
        }
        req.clear();
        LockReq {
            table: it.table,
            key: it.key,
            kind,
            slot: owner.slot,
        }
        .encode(req);
        match self.ctx.queue(it.home, rtype::LOCK, req) {
            Ok(h) => {
                it.pending = Some(h);
                Ok(true)
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
        self.take_fetch(i, h, flushed, |b| {
            LockResp::decode(b).map(|r| (r.fetched, r.value))
        })
    }

    /// Releases every lock held (abort), waiting for the UNLOCKs to be sent.
    pub(crate) async fn release_locks(&mut self) {
        let db = self.th.db.clone();
        let mut req = std::mem::take(&mut self.bufs.req);
        let mut any = self.queue_orphans();
        for it in &mut self.items {
            let Some(tok) = it.lock.take() else { continue };
            if it.home == db.node {
                actions::release(&db, it.table, it.key, tok, self.owner);
                continue;
            }
            req.clear();
            UnlockReq {
                table: it.table,
                key: it.key,
                slot: self.owner.slot,
                token: tok,
            }
            .encode(&mut req);
            // A lost unlock leaves the key locked until recovery; the RPC layer
            // retransmits, so this only happens if the primary is gone.
            if self.ctx.queue(it.home, rtype::UNLOCK, &req).is_ok() {
                any = true;
            }
        }
        self.bufs.req = req;
        if any {
            let _ = self.ctx.flush().await;
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
    /// cannot be named (recovery finds it by its owner); then the transaction's slot must
    /// not be given to another transaction, whose owner it would share. Returns whether
    /// any lock was held, and whether a LOCK's outcome is unknown.
    pub(crate) fn orphan_locks(&mut self) -> (bool, bool) {
        let db = self.th.db.clone();
        let (mut any, mut unknown) = (false, false);
        for i in 0..self.items.len() {
            if let Some(h) = self.items[i].pending.take() {
                if self.items[i].write.is_some() {
                    // No response (still in flight, or the request failed): the LOCK
                    // may yet execute, or may have.
                    unknown |= self.ctx.response(h, |_| ()).is_err();
                    let _ = self.absorb_lock_response(i, h, true);
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
