//! Log (FaSST §5 step 3, DrTM+H §5.4): the commit record (every write) to its replicas;
//! the coordinator's own node always keeps one, in place.
//!
//! - `Log::Rpc`: a LOG RPC to each of the coordinator's log replicas (FaSST). Records
//!   of transactions installed everywhere are truncated by piggybacking their ids on
//!   the next LOG to that replica.
//! - `Log::Write`: one-sided WRITEs of the record into this thread's ring at every
//!   other backup of the keys written ([`crate::log_ring`]), which apply it to their
//!   copies when it is truncated; all replicas' WRITEs with one doorbell, the last
//!   WRITE per replica signaled (its completion confirms the others on its queue, passive
//!   ACK). Truncations go as RING_TRUNCATE RPCs in the same flush when due, so they cost
//!   no round trip; a full ring makes the coordinator send one alone and wait (yielding)
//!   for the replica's acknowledgement, up to `LogRingConfig::full_wait`, then abort
//!   with `log_full`. It never writes over records the replica has not released.
//!
//! Once a record may be at some replica the transaction is committed (the rule of
//! [`crate::recovery`]): a LOG RPC or WRITE that fails is sent again until it lands or
//! the configuration changes, and then recovery decides it (`EpochChanged` here). Only
//! a failure before anything was sent (a full or unknown ring, a request that cannot be
//! queued) aborts, removing the coordinator's own record.

use crate::log_ring::format;
use crate::log_ring::writer::{Repair, Reservation, RingWriter, TRUNCATION_LOST_NS};
use crate::log_ring::RingWriters;
use crate::messages::{rtype, Ack, LogReq, RingTruncateReq, RingTruncateResp};
use crate::policy;
use crate::stats::AbortReason;
use crate::txn::Txn;
use crate::TxnThread;
use ambidex_rpc::{Ctx, OpHandle, ReqHandle, RpcError};
use ambidex_transport::NodeId;

/// A one-sided operation of a log flush: for replica `at` (index into the targets), a
/// part of its record, or a repair of an earlier failed append.
pub(crate) struct Op {
    at: usize,
    h: OpHandle,
    repair: Option<Repair>,
}

/// The lists of one append, kept by the thread between transactions (taken while a
/// coroutine's append is out, so concurrent appends each have their own).
#[derive(Default)]
pub(crate) struct Scratch {
    res: Vec<Reservation>,
    ops: Vec<Op>,
    /// Truncations sent: (target index, request, head asked).
    truncs: Vec<(usize, ReqHandle, u64)>,
}

impl Scratch {
    fn take(th: &TxnThread) -> Scratch {
        let mut s = th.rings.borrow_mut().scratch.pop().unwrap_or_default();
        s.res.clear();
        s.ops.clear();
        s.truncs.clear();
        s
    }

    fn give_back(self, th: &TxnThread) {
        let mut rings = th.rings.borrow_mut();
        if rings.scratch.len() < SPARE_SCRATCH {
            rings.scratch.push(self);
        }
    }
}

/// Scratch lists kept per thread (one per coroutine appending at once, bounded).
const SPARE_SCRATCH: usize = 64;

/// What an append (or a reclaim) leaves unresolved while its flush is out. If its
/// future is dropped there (a worker dropped mid-transaction), the drop resolves it as
/// a failure: the transaction's slots are voided and its own record removed (it never
/// committed), and the repairs it took are given back, so a dropped append never blocks
/// its rings. Defused once the flush returned.
struct Unresolved<'a> {
    th: &'a TxnThread,
    /// The epoch of the rings it used (a later epoch's writers are not its own).
    epoch: u32,
    txn: Option<u64>,
    targets: &'a [NodeId],
    res: &'a [Reservation],
    ops: &'a [Op],
    /// The flush's truncations: no answer will be read, so they are no longer out (one
    /// that still executes later is behind the head by then, and changes nothing).
    truncs: &'a [(usize, ReqHandle, u64)],
}

impl Unresolved<'_> {
    fn defuse(self) {
        std::mem::forget(self);
    }
}

impl Drop for Unresolved<'_> {
    fn drop(&mut self) {
        let Ok(mut rings) = self.th.rings.try_borrow_mut() else {
            return;
        };
        if let Some(txn) = self.txn {
            for (&r, res) in self.targets.iter().zip(self.res) {
                if let Some(w) = rings.at(r, self.epoch) {
                    w.failed(txn, res);
                }
            }
            if let Ok(mut log) = self.th.log.try_borrow_mut() {
                log.truncate(txn);
            }
        }
        for o in self.ops {
            if let (Some(rep), Some(&r)) = (o.repair, self.targets.get(o.at)) {
                if let Some(w) = rings.at(r, self.epoch) {
                    w.repair_failed(rep);
                }
            }
        }
        for &(i, _, to) in self.truncs {
            if let Some(w) = self.targets.get(i).and_then(|&r| rings.at(r, self.epoch)) {
                w.truncation_acked(to, None);
            }
        }
    }
}

/// Flushes `ctx`'s batch. Unsignaled failures of the worker's earlier batches that the
/// flush reports are not this phase's: they are given back to the worker (as
/// `ambidex_store::remote` does). The phase then reads each of its operations' results:
/// a flush that failed for another reason (a truncation RPC timed out, say) may still
/// have completed every WRITE, and then the record is logged.
async fn flush(ctx: &Ctx, own: &[Op]) {
    if let Err(RpcError::UnsignaledFailed(mut reported)) = ctx.flush().await {
        for o in own {
            if let Err(e) = ctx.op_result(o.h) {
                if let Some(i) = reported.iter().position(|r| *r == e) {
                    reported.swap_remove(i);
                }
            }
        }
        ctx.requeue_unsignaled_failures(reported);
    }
}

/// Queues the repairs waiting at ring `w` (target `i`): a repair that cannot be queued
/// waits for the next flush.
fn queue_repairs(ctx: &Ctx, w: &mut RingWriter, i: usize, signaled: bool, ops: &mut Vec<Op>) {
    for rep in w.take_repairs() {
        match ctx.queue_write(w.addr(rep.pos), rep.bytes(), signaled) {
            Ok(h) => ops.push(Op {
                at: i,
                h,
                repair: Some(rep),
            }),
            Err(_) => w.repair_failed(rep),
        }
    }
}

/// Queues the record `rec` (its sequence number set to the reservation's) into ring
/// `w` (target `i`) at reservation `res`, in WRITEs of at most `max` bytes, the last
/// signaled. False if one could not be queued.
fn queue_record(
    ctx: &Ctx,
    w: &mut RingWriter,
    i: usize,
    res: &Reservation,
    rec: &mut [u8],
    max: usize,
    ops: &mut Vec<Op>,
) -> bool {
    format::set_seq(rec, res.seq);
    let mut off = 0;
    while off < rec.len() {
        let end = (off + max).min(rec.len());
        let at = w.addr(res.pos + off as u64);
        match ctx.queue_write(at, &rec[off..end], end == rec.len()) {
            Ok(h) => ops.push(Op {
                at: i,
                h,
                repair: None,
            }),
            Err(_) => return false,
        }
        off = end;
    }
    true
}

/// Queues the pad before reservation `res` (it wraps the ring) into ring `w` (target
/// `i`), unsignaled. False if it could not be queued.
fn queue_pad(
    ctx: &Ctx,
    w: &mut RingWriter,
    i: usize,
    res: &Reservation,
    ops: &mut Vec<Op>,
) -> bool {
    let Some((pos, seq)) = res.pad else {
        return true;
    };
    let pad = format::pad(w.ring_bytes() - pos % w.ring_bytes(), seq);
    match ctx.queue_write(w.addr(pos), &pad, false) {
        Ok(h) => {
            ops.push(Op {
                at: i,
                h,
                repair: None,
            });
            true
        }
        Err(_) => false,
    }
}

/// Queues a truncation of ring `w` at replica `r` (target `i`) if one is due at `now`
/// (`urgent`: the ring is full), noting it in `truncs` as (target, handle, head asked).
fn queue_truncation(
    ctx: &Ctx,
    w: &mut RingWriter,
    r: NodeId,
    i: usize,
    urgent: bool,
    now: u64,
    truncs: &mut Vec<(usize, ReqHandle, u64)>,
) {
    if let Some(to) = w.truncation_due(urgent, now) {
        let req = RingTruncateReq { head: to }.to_bytes();
        if let Ok(h) = ctx.queue(r, rtype::RING_TRUNCATE, &req) {
            w.truncation_sent(now);
            truncs.push((i, h, to));
        }
    }
}

impl Txn<'_> {
    pub(crate) async fn log_phase(&mut self) -> Result<(), AbortReason> {
        match self.th.cfg.policy.log {
            policy::Log::Rpc => self.log_rpc().await,
            policy::Log::Write => self.log_write().await,
        }
    }

    async fn log_rpc(&mut self) -> Result<(), AbortReason> {
        let placement = &self.config.placement;
        let me = self.th.db.node;
        // The records alone (no count): what every replica stores.
        let mut body = std::mem::take(&mut self.bufs.body);
        body.clear();
        let mut n = 0u16;
        for w in self.writes(|_| true) {
            w.encode(&mut body);
            n += 1;
        }
        self.th.log.borrow_mut().append(self.id, me, &body);
        self.own_record = true;
        // Bit i: the i-th log replica after this node has not acknowledged the record
        // (a mask, not a list: no copy of the replicas on the common path). The bits
        // past the last replica go once a round has gone through them all.
        let mut pending = u64::MAX;
        let mut handles = std::mem::take(&mut self.bufs.handles);
        let mut req = std::mem::take(&mut self.bufs.req);
        let mut first = true;
        let result = loop {
            handles.clear();
            // The replicas queued this round, in the order of `handles`.
            let mut round = 0u64;
            let mut queued = true;
            let mut replicas = 0;
            for (i, replica) in placement.log_replicas(me).skip(1).enumerate() {
                debug_assert!(i < 64);
                replicas = i + 1;
                if pending & (1 << i) == 0 {
                    continue;
                }
                req.clear();
                self.th.with_truncations(replica, |ids| {
                    LogReq::encode(&mut req, self.id, n, &body, ids)
                });
                match self.ctx.queue(replica, rtype::LOG, &req) {
                    Ok(h) => {
                        handles.push(h);
                        round |= 1 << i;
                    }
                    Err(_) => {
                        queued = false;
                        break;
                    }
                }
            }
            if queued {
                pending &= !u64::MAX.checked_shl(replicas as u32).unwrap_or(0);
                if pending == 0 {
                    // No other replica: nothing to send.
                    break Ok(());
                }
            } else {
                if self.left_behind() {
                    break Err(AbortReason::EpochChanged);
                }
                if first {
                    // Nothing was sent: the record exists only here, and goes.
                    self.th.log.borrow_mut().truncate(self.id);
                    self.own_record = false;
                    break Err(AbortReason::Timeout);
                }
                // Sent before: committed, so tried again (the flush below sends what
                // was queued, and fails at once if the epoch changed meanwhile).
                if handles.is_empty() {
                    self.ctx.yield_now().await;
                    continue;
                }
            }
            let _ = self.ctx.flush().await;
            // Replicas not queued in this round (a queue failed) stay pending.
            for &h in &handles {
                let i = round.trailing_zeros();
                round &= round - 1;
                if self.ctx.response(h, Ack::is_ok).unwrap_or(false) {
                    pending &= !(1 << i);
                }
            }
            if pending == 0 {
                break Ok(());
            }
            // Some replica may hold the record: the transaction is committed from now
            // on, so it is sent again until every replica has it or the cluster moves
            // to a configuration whose recovery decides it (or this node is fenced:
            // removed, it may never learn that configuration, whose recovery decides
            // it all the same).
            if self.left_behind() {
                break Err(AbortReason::EpochChanged);
            }
            self.th.stats.borrow_mut().log_retries += 1;
            first = false;
        };
        self.bufs.req = req;
        self.bufs.body = body;
        self.bufs.handles = handles;
        result
    }

    async fn log_write(&mut self) -> Result<(), AbortReason> {
        let me = self.th.db.node;
        let mut body = std::mem::take(&mut self.bufs.body);
        body.clear();
        let mut n = 0usize;
        for w in self.writes(|_| true) {
            w.encode(&mut body);
            n += 1;
        }
        // The record's count is 16 bits (and so many writes never fit half a ring).
        let Ok(n) = u16::try_from(n) else {
            self.bufs.body = body;
            return Err(AbortReason::LogRecordTooLarge);
        };
        self.th.log.borrow_mut().append(self.id, me, &body);
        self.own_record = true;
        let mut rec = std::mem::take(&mut self.bufs.req);
        rec.clear();
        format::encode_record(&mut rec, 0, self.id, self.owner, n, &body);
        self.bufs.body = body;
        // The record goes to the backups of the keys written (DrTM+H §5.4): they apply
        // it to their copies when it is truncated, so the commit needs no backup step.
        // Where this node is itself a backup of a key, its own log is one of the
        // record's places and the key's primary gets the record too: else the record
        // would be at R - 1 nodes, and a crash of them (this one included) would leave
        // the primary with neither the record nor (passive ACK, or a commit WRITE that
        // failed) the write, and recovery would abort a transaction reported committed.
        let mut targets = std::mem::take(&mut self.bufs.targets);
        targets.clear();
        let placement = &self.config.placement;
        for it in self.items.iter().filter(|it| it.write.is_some()) {
            let mut backup_here = false;
            for b in placement.backups(it.table, it.key) {
                if b == me {
                    backup_here = true;
                } else {
                    targets.push(b);
                }
            }
            if backup_here {
                targets.push(placement.primary(it.table, it.key));
            }
        }
        targets.sort_unstable();
        targets.dedup();
        let r = if targets.is_empty() {
            Ok(())
        } else {
            self.append_to_rings(&targets, &mut rec).await
        };
        self.bufs.targets = targets;
        self.bufs.req = rec;
        if r.is_err() && !self.left_behind() {
            // Failed before any WRITE was posted (a full ring, an unknown one): the
            // record exists only here, and goes.
            self.th.log.borrow_mut().truncate(self.id);
            self.own_record = false;
        }
        r
    }

    /// Appends the record `rec` (its number set per ring) to this thread's ring at every
    /// replica of `targets`, with one flush.
    async fn append_to_rings(
        &mut self,
        targets: &[NodeId],
        rec: &mut [u8],
    ) -> Result<(), AbortReason> {
        let th = self.th.clone();
        let len = rec.len() as u64;
        {
            let mut rings = th.rings.borrow_mut();
            for &r in targets {
                let w = rings
                    .get(&th.db, th.node, th.thread, r, self.config.epoch)
                    .ok_or(AbortReason::LogRingUnknown)?;
                if len > w.max_record() {
                    return Err(AbortReason::LogRecordTooLarge);
                }
            }
        }
        let mut scratch = Scratch::take(&th);
        let r = self.append_reserved(&th, targets, rec, &mut scratch).await;
        scratch.give_back(&th);
        r
    }

    /// [`Txn::append_to_rings`] once the rings are known and the record fits them.
    async fn append_reserved(
        &mut self,
        th: &TxnThread,
        targets: &[NodeId],
        rec: &mut [u8],
        scratch: &mut Scratch,
    ) -> Result<(), AbortReason> {
        let len = rec.len() as u64;
        let Scratch { res, ops, truncs } = scratch;
        self.reserve_everywhere(th, targets, len, res).await?;

        let ctx = self.ctx;
        let epoch = self.config.epoch;
        let now = ctx.now_ns();
        let max = ctx.cluster().max_onesided.max(8);
        // Bit i: the append at targets[i] failed (replicas are fewer than 64 nodes).
        let mut failed = 0u64;
        {
            let mut rings = th.rings.borrow_mut();
            for (i, (&r, res)) in targets.iter().zip(res.iter()).enumerate() {
                let Some(w) = rings.at(r, epoch) else {
                    failed |= 1 << i;
                    continue;
                };
                // Repairs first: the record's signaled WRITE confirms them.
                queue_repairs(ctx, w, i, false, ops);
                if !queue_pad(ctx, w, i, res, ops) {
                    failed |= 1 << i;
                }
                if failed & (1 << i) == 0 && !queue_record(ctx, w, i, res, rec, max, ops) {
                    failed |= 1 << i;
                }
                queue_truncation(ctx, w, r, i, false, now, truncs);
            }
            rings.stats.truncations_sent += truncs.len() as u64;
        }
        let unresolved = Unresolved {
            th,
            epoch,
            txn: Some(self.id),
            targets,
            res,
            ops,
            truncs,
        };
        flush(ctx, ops).await;
        unresolved.defuse();
        {
            let mut rings = th.rings.borrow_mut();
            for o in ops.iter() {
                let ok = ctx.op_result(o.h).is_ok();
                // A record WRITE that failed stays failed even if this thread's writers
                // moved to a new epoch during the flush (`at` finds none then): it was
                // counted as landed, and the transaction reported committed with its
                // record missing at a backup that had already recovered.
                if o.repair.is_none() && !ok {
                    failed |= 1 << o.at;
                }
                let (Some(w), Some(rep)) = (rings.at(targets[o.at], epoch), o.repair) else {
                    continue;
                };
                if ok {
                    w.repair_landed();
                    rings.stats.repairs += 1;
                } else {
                    w.repair_failed(rep);
                }
            }
            truncations_answered(ctx, &mut rings, targets, truncs, epoch);
        }
        // A record that may have landed anywhere is committed: the failed WRITEs are
        // posted again (same place, same bytes) until they land or the configuration
        // changes (or this node is fenced), whose recovery then decides the
        // transaction.
        while failed != 0 && ctx.epoch() == epoch && !th.db.cluster().fenced() {
            th.stats.borrow_mut().log_retries += failed.count_ones() as u64;
            ops.clear();
            {
                let mut rings = th.rings.borrow_mut();
                for (i, (&r, res)) in targets.iter().zip(res.iter()).enumerate() {
                    if failed & (1 << i) == 0 {
                        continue;
                    }
                    let Some(w) = rings.at(r, epoch) else {
                        continue;
                    };
                    if res.pad.is_none() || queue_pad(ctx, w, i, res, ops) {
                        queue_record(ctx, w, i, res, rec, max, ops);
                    }
                }
            }
            if ops.is_empty() {
                // Nothing could be queued: let the runtime step (and the epoch change).
                ctx.yield_now().await;
                continue;
            }
            flush(ctx, ops).await;
            // A target stays failed unless it had WRITEs this round and all landed.
            let (mut queued, mut errors) = (0u64, 0u64);
            for o in ops.iter() {
                queued |= 1 << o.at;
                if ctx.op_result(o.h).is_err() {
                    errors |= 1 << o.at;
                }
            }
            failed &= !(queued & !errors);
        }
        let mut rings = th.rings.borrow_mut();
        for (i, (&r, res)) in targets.iter().zip(res.iter()).enumerate() {
            let Some(w) = rings.at(r, epoch) else {
                continue;
            };
            if failed & (1 << i) != 0 {
                // Never landed, and the configuration changed: the slot is voided
                // (recovery installs the transaction from the records that exist).
                w.failed(self.id, res);
            } else {
                w.logged(self.id);
            }
        }
        let st = &mut rings.stats;
        let written = targets.len() as u64 - failed.count_ones() as u64;
        st.records_written += written;
        st.bytes_written += written * len;
        st.pads += res.iter().filter(|r| r.pad.is_some()).count() as u64;
        st.write_failures += failed.count_ones() as u64;
        // Only complete WRITEs count: a failed flush whose WRITEs all completed (a
        // truncation timed out, say) still logged the record everywhere.
        if failed != 0 {
            return Err(AbortReason::EpochChanged);
        }
        Ok(())
    }

    /// Reserves `len` bytes in every target's ring (all or none), waiting while one is
    /// full: truncations are sent for full rings (with any repairs that block them) and
    /// their acknowledgements awaited; otherwise the coroutine yields. Gives up with
    /// `LogFull` after `LogRingConfig::full_wait`.
    async fn reserve_everywhere(
        &self,
        th: &TxnThread,
        targets: &[NodeId],
        len: u64,
        out: &mut Vec<Reservation>,
    ) -> Result<(), AbortReason> {
        let ctx = self.ctx;
        let epoch = self.config.epoch;
        let mut deadline = None;
        loop {
            {
                let mut rings = th.rings.borrow_mut();
                let all_fit = targets
                    .iter()
                    .all(|&r| rings.at(r, epoch).is_some_and(|w| w.fits(len)));
                if all_fit {
                    out.clear();
                    for &r in targets {
                        out.extend(rings.at(r, epoch).and_then(|w| w.reserve(self.id, len)));
                    }
                    return if out.len() == targets.len() {
                        Ok(())
                    } else {
                        Err(AbortReason::LogRingUnknown)
                    };
                }
            }
            let now = ctx.now_ns();
            let deadline = *deadline.get_or_insert_with(|| {
                th.rings.borrow_mut().stats.full_waits += 1;
                now + th.db.log_ring_config().full_wait.as_nanos() as u64
            });
            if now >= deadline {
                return Err(AbortReason::LogFull);
            }
            if !self.reclaim(th, targets, len).await {
                // Nothing freed: let the thread's other coroutines go on (their
                // transactions, and the truncations they send) before looking again.
                ctx.yield_now().await;
            }
        }
    }

    /// For every target ring where `len` bytes do not fit: a truncation of what is
    /// reclaimable (if none is out) and the repairs that may block it, in one flush.
    /// Returns whether space was released or a repair landed.
    async fn reclaim(&self, th: &TxnThread, targets: &[NodeId], len: u64) -> bool {
        reclaim_where(self.ctx, th, targets, |w| !w.fits(len)).await
    }
}

/// How long [`TxnThread::drain_rings`] goes on without progress before it gives up:
/// longer than a truncation is taken to be out ([`TRUNCATION_LOST_NS`]).
const DRAIN_PATIENCE_NS: u64 = 2 * TRUNCATION_LOST_NS;

impl TxnThread {
    /// The end of this thread's run (its last worker returned, its installations
    /// done): every ring is truncated as far as its records are installed or voided,
    /// so the replicas apply the last records to their backup copies (what a run's
    /// end compares). Gives up after [`DRAIN_PATIENCE_NS`] without progress (a replica
    /// that does not answer): those records stay for recovery.
    pub(crate) async fn drain_rings(&self, ctx: &Ctx) {
        if self.cfg.policy.log != policy::Log::Write {
            return;
        }
        let mut give_up = ctx.now_ns() + DRAIN_PATIENCE_NS;
        while ctx.now_ns() < give_up {
            let (targets, epoch) = {
                let rings = self.rings.borrow();
                (rings.undrained(), rings.epoch())
            };
            if targets.is_empty() {
                return;
            }
            // The worker's coroutine may still be bound to the epoch of its last
            // transaction; the truncations are this epoch's rings' (see `bind_epoch`).
            ctx.bind_epoch(epoch);
            if reclaim_where(ctx, self, &targets, |w| !w.drained()).await {
                give_up = ctx.now_ns() + DRAIN_PATIENCE_NS;
            } else {
                // Nothing to send yet (a truncation is out): let it come back.
                ctx.yield_now().await;
            }
        }
        self.rings.borrow_mut().stats.drain_gave_up += 1;
    }
}

/// For every target ring where `need`: its repairs and a truncation of what is
/// reclaimable (if none is out and no repair is), in one flush. Returns whether space
/// was released or a repair landed.
async fn reclaim_where(
    ctx: &Ctx,
    th: &TxnThread,
    targets: &[NodeId],
    need: impl Fn(&RingWriter) -> bool,
) -> bool {
    let mut scratch = Scratch::take(th);
    let progress = reclaim_with(ctx, th, targets, need, &mut scratch).await;
    scratch.give_back(th);
    progress
}

async fn reclaim_with(
    ctx: &Ctx,
    th: &TxnThread,
    targets: &[NodeId],
    need: impl Fn(&RingWriter) -> bool,
    scratch: &mut Scratch,
) -> bool {
    let now = ctx.now_ns();
    let Scratch { ops, truncs, .. } = scratch;
    // The rings of the epoch this reclaim starts in; after a change its answers are
    // not theirs.
    let epoch = th.rings.borrow().epoch();
    {
        let mut rings = th.rings.borrow_mut();
        for (i, &r) in targets.iter().enumerate() {
            let Some(w) = rings.at(r, epoch) else {
                continue;
            };
            if !need(w) {
                continue;
            }
            queue_repairs(ctx, w, i, true, ops);
            queue_truncation(ctx, w, r, i, true, now, truncs);
        }
        rings.stats.truncations_sent += truncs.len() as u64;
    }
    if ops.is_empty() && truncs.is_empty() {
        return false;
    }
    let unresolved = Unresolved {
        th,
        epoch,
        txn: None,
        targets,
        res: &[],
        ops,
        truncs,
    };
    flush(ctx, ops).await;
    unresolved.defuse();
    let mut rings = th.rings.borrow_mut();
    let mut progress = false;
    for o in ops.iter() {
        let ok = ctx.op_result(o.h).is_ok();
        if let (Some(w), Some(rep)) = (rings.at(targets[o.at], epoch), o.repair) {
            if ok {
                w.repair_landed();
                rings.stats.repairs += 1;
                progress = true;
            } else {
                w.repair_failed(rep);
            }
        }
    }
    progress | truncations_answered(ctx, &mut rings, targets, truncs, epoch)
}

/// Reads the answers to a flush's truncations (target, request, head asked) into the
/// rings; returns whether one released space.
fn truncations_answered(
    ctx: &Ctx,
    rings: &mut RingWriters,
    targets: &[NodeId],
    truncs: &[(usize, ReqHandle, u64)],
    epoch: u32,
) -> bool {
    let mut released = false;
    for &(i, h, to) in truncs {
        let head = ctx.response(h, RingTruncateResp::ok_head).ok().flatten();
        if rings
            .at(targets[i], epoch)
            .is_some_and(|w| w.truncation_acked(to, head))
        {
            rings.stats.truncations_acked += 1;
            released = true;
        }
    }
    released
}
