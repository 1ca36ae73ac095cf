//! Commit (FaSST §5 steps 4–5, DrTM+H §5.3): the backups of every written key take the
//! writes, then every primary installs them and releases the locks: by COMMIT_PRIMARY
//! RPC, or with [`policy::Commit::Write`] by one-sided WRITEs of the value followed on
//! the same queue by the header's release (a CAS from the locked word; see
//! `crate::onesided::commit_image`). Local copies are applied in place through the
//! item actions.
//!
//! Backups: with `Log::Rpc` (FaSST) every backup applies the writes by COMMIT_BACKUP
//! RPC, every acknowledgement awaited before any primary releases, so the next writer
//! of a key cannot overtake this one at a backup. With `Log::Write` (FaRM, DrTM+H) the
//! log phase already WROTE the record one-sided into a ring at every backup of the keys
//! written, before any primary is touched; the backup's CPU applies it when the
//! coordinator truncates it (lazily, off the critical path), each copy taking the
//! primary's version and older records of a key skipped, so records from different
//! coordinators may be applied in any order. This step then only applies the
//! coordinator's own node's backup copies, and the commit is one round trip (the
//! primaries').
//!
//! The work is a `CommitJob`: the transaction's items, moved out of it. Without
//! passive ACK the transaction runs the job itself and returns once every primary
//! acknowledged. With passive ACK (DrTM+H §3.2) it returns once its log is complete and
//! hands the job to one of its thread's committers (`crate::committer`), which runs
//! the same steps and checks every acknowledgement off the critical path: a failed one
//! is counted (`committed_incomplete`) and its log record kept for recovery, never
//! dropped.

use crate::actions;
use crate::messages::{rtype, Ack, CommitBackupReq, CommitPrimaryReq};
use crate::onesided::commit_image;
use crate::policy;
use crate::stats::{Phase, PhaseMap};
use crate::txn::{writes_of, Item, Txn, TxnBufs};
use crate::TxnThread;
use ambidex_cluster::Configuration;
use ambidex_rpc::{Ctx, OneSidedError, OpHandle};
use ambidex_store::LockOwner;
use ambidex_transport::NodeId;
use std::rc::Rc;

/// A committed transaction's installation.
pub(crate) struct CommitJob {
    pub id: u64,
    /// The configuration the transaction ran in.
    pub config: Rc<Configuration>,
    pub owner: LockOwner,
    /// The slot is the transaction's own (given back when the job is done).
    pub own_slot: bool,
    pub items: Vec<Item>,
    pub bufs: TxnBufs,
    /// Every step so far was acknowledged.
    pub ok: bool,
    /// The coroutine whose transaction it is.
    pub worker: u16,
}

/// The installation's state as the steps see it: owned by a [`CommitJob`], or
/// borrowed from the transaction when it installs its writes itself.
pub(crate) struct CommitWork<'a> {
    pub id: u64,
    pub config: &'a Configuration,
    pub owner: LockOwner,
    pub items: &'a mut [Item],
    pub bufs: &'a mut TxnBufs,
    pub ok: &'a mut bool,
}

impl CommitJob {
    pub fn work(&mut self) -> CommitWork<'_> {
        CommitWork {
            id: self.id,
            config: &self.config,
            owner: self.owner,
            items: &mut self.items,
            bufs: &mut self.bufs,
            ok: &mut self.ok,
        }
    }
}

/// A one-sided operation of a commit step, with the old word its CAS must return if
/// signaled.
#[derive(Clone, Copy)]
pub(crate) struct CommitOp {
    op: OpHandle,
    expect: Option<u64>,
}

impl CommitWork<'_> {
    /// Queues the step's work (backups, or `primaries`) and applies the local part in
    /// place. Returns whether anything was queued.
    pub fn queue_step(&mut self, ctx: &Ctx, th: &TxnThread, primaries: bool) -> bool {
        let db = th.db.clone();
        let placement = &self.config.placement;
        let me = db.node;
        let owner = self.owner;
        let by_write = primaries && th.cfg.policy.commit == policy::Commit::Write;
        // With a one-sided log the remote backups hold the record and apply it when it
        // is truncated; only this node's own backup copies are applied here.
        let from_log = th.cfg.policy.log == policy::Log::Write;
        let mut targets = std::mem::take(&mut self.bufs.targets);
        targets.clear();
        for it in self.items.iter().filter(|it| it.write.is_some()) {
            if primaries {
                targets.push(it.home);
            } else {
                targets.extend(
                    placement
                        .backups(it.table, it.key)
                        .filter(|&b| !from_log || b == me),
                );
            }
        }
        targets.sort_unstable();
        targets.dedup();
        self.bufs.handles.clear();
        self.bufs.ops.clear();
        let mut req = std::mem::take(&mut self.bufs.req);
        let mut any = false;
        for &node in &targets {
            let holds = |it: &Item| {
                if primaries {
                    it.home == node
                } else {
                    placement.backups(it.table, it.key).any(|b| b == node)
                }
            };
            if node == me && !primaries && ctx.epoch() != self.config.epoch {
                // The cluster moved on: a copy here may be a primary of the new epoch,
                // locked by its transactions, which an apply would wait for (on this
                // very thread, for ever). The record is logged: recovery installs it.
                *self.ok = false;
                continue;
            }
            if node == me {
                for w in writes_of(self.items, holds) {
                    *self.ok &= if primaries {
                        actions::install(&db, self.id, &w, owner)
                    } else if from_log {
                        actions::apply_logged(&db, self.id, &w).is_ok()
                    } else {
                        actions::apply_backup(&db, self.id, &w)
                    };
                }
                continue;
            }
            if by_write {
                any |= self.queue_writes(ctx, th, node);
                continue;
            }
            req.clear();
            let mut enc = if primaries {
                CommitPrimaryReq::begin(&mut req, self.id, owner.slot)
            } else {
                CommitBackupReq::begin(&mut req, self.id)
            };
            for w in writes_of(self.items, holds) {
                enc.push(&mut req, &w);
            }
            enc.finish(&mut req);
            let rt = if primaries {
                rtype::COMMIT_PRIMARY
            } else {
                rtype::COMMIT_BACKUP
            };
            match ctx.queue(node, rt, &req) {
                Ok(h) => {
                    self.bufs.handles.push(h);
                    any = true;
                }
                Err(_) => *self.ok = false,
            }
        }
        self.bufs.req = req;
        self.bufs.targets = targets;
        any
    }

    /// Queues the one-sided install of every write whose primary is `node`: its data
    /// WRITEs unsignaled, confirmed by the signaled release CAS behind them on the same
    /// queue (passive ACK), whose old word shows the lock was still held.
    fn queue_writes(&mut self, ctx: &Ctx, th: &TxnThread, node: NodeId) -> bool {
        let mut img = th.commit_image.borrow_mut();
        let mut stored = th.stored.borrow_mut();
        let mut any = false;
        for i in 0..self.items.len() {
            let it = &self.items[i];
            if it.write.is_none() || it.home != node {
                continue;
            }
            let (Some(token), Some(w)) = (it.lock, writes_of(&self.items[i..=i], |_| true).next())
            else {
                *self.ok = false;
                continue;
            };
            let t = match crate::onesided::RemoteTables::get(&th.remote, &th.db, node, it.table) {
                Some(t) => t,
                None => {
                    *self.ok = false;
                    continue;
                }
            };
            let size = t.shape.value_size.checked_sub(crate::db::META);
            if !size.is_some_and(|n| actions::stored_value(self.id, &w, n, &mut stored)) {
                *self.ok = false;
                continue;
            }
            commit_image(
                &t,
                token.offset,
                it.key,
                token.store_version,
                self.owner,
                &stored,
                &mut img,
            );
            let mut queued = Ok(());
            for (at, r) in &img.writes {
                match ctx.queue_write(t.at(*at), &img.bytes[r.clone()], false) {
                    Ok(op) => self.bufs.ops.push(CommitOp { op, expect: None }),
                    Err(e) => queued = Err(e),
                }
            }
            let (held, free) = img.release;
            if queued.is_ok() {
                match ctx.queue_cas(t.at(token.offset), held, free, true) {
                    Ok(op) => self.bufs.ops.push(CommitOp {
                        op,
                        expect: Some(held),
                    }),
                    Err(e) => queued = Err(e),
                }
            }
            // A WRITE queued without its release would leave the item locked: the job
            // is incomplete either way, and recovery finishes it from the log.
            match queued {
                Ok(()) => any = true,
                Err(_) => *self.ok = false,
            }
        }
        any
    }

    /// After the step's flush: whether every node acknowledged (RPCs answered `Ok`,
    /// one-sided operations completed, signaled releases found the lock held).
    pub fn check_step(&mut self, ctx: &Ctx, flushed: bool, primaries: bool) {
        *self.ok &= flushed;
        for &h in &self.bufs.handles {
            *self.ok &= ctx.response(h, Ack::is_ok).unwrap_or(false);
        }
        for c in &self.bufs.ops {
            *self.ok &= match c.expect {
                Some(held) => ctx.atomic_result(c.op) == Ok(held),
                // Unsignaled: confirmed by the node's signaled operation behind it.
                None => matches!(ctx.op_result(c.op), Ok(()) | Err(OneSidedError::NoValue)),
            };
        }
        if primaries {
            for it in self.items.iter_mut() {
                it.lock = None;
            }
        }
    }
}

impl Txn<'_> {
    /// Installs the transaction's writes (backups, then primaries) and waits for every
    /// acknowledgement; returns whether all came.
    /// The installation's state borrowed from the transaction (see [`CommitWork`]).
    fn work<'a>(&'a mut self, ok: &'a mut bool) -> CommitWork<'a> {
        CommitWork {
            id: self.id,
            config: &self.config,
            owner: self.owner,
            items: &mut self.items,
            bufs: &mut self.bufs,
            ok,
        }
    }

    pub(crate) async fn commit_inline(&mut self) -> bool {
        let mut ok = true;
        let mut times = PhaseMap::<u64>::default();
        for (primaries, phase) in [(false, Phase::CommitBackup), (true, Phase::CommitPrimary)] {
            if primaries && !ok {
                // A backup may not hold the writes: the primaries keep their locks (so
                // no later writer's backup write can overtake this one), for recovery.
                break;
            }
            let t0 = self.ctx.step_ns();
            let (ctx, th) = (self.ctx, self.th.clone());
            let _in_phase = crate::InPhase::new(&th, phase);
            if self.work(&mut ok).queue_step(ctx, &th, primaries) {
                let r = ctx.flush().await;
                let flushed = self.flushed(r);
                self.work(&mut ok).check_step(ctx, flushed, primaries);
            } else if primaries {
                self.work(&mut ok).check_step(ctx, true, primaries);
            }
            times[phase] = self.ctx.step_ns().saturating_sub(t0);
        }
        for p in [Phase::CommitBackup, Phase::CommitPrimary] {
            self.add_phase_time(p, times[p]);
        }
        ok
    }
}
