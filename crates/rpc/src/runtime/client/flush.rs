//! A flush: the state machine behind `ctx.flush().await`, and the encoding of a worker's
//! batch into this step's request datagrams. A batch of small requests to one endpoint
//! (the usual case) first tries to join, as a new part, the group an earlier flush of
//! the step built there; then the one-destination fast path; then the general packing
//! (phase 1 checks credits and window room, phase 2 encodes).

use super::Destination;
use crate::config::RpcError;
use crate::runtime::batch::{Phase, ReqStatus};
use crate::runtime::outbox::{open_key, NO_SLOT};
use crate::runtime::State;
use crate::wire;
use std::task::Poll;

impl State {
    /// One poll of worker `id`'s flush: sends its batch (requests when there are
    /// credits, and one-sided operations with them) and then waits until every request
    /// and signaled operation is settled.
    pub(crate) fn flush_poll(&mut self, id: u16) -> Poll<Result<(), RpcError>> {
        let b = &mut self.workers.batches[id as usize];
        match b.phase {
            Phase::Done => return Poll::Ready(Ok(())),
            Phase::InFlight => {
                if b.pending > 0 {
                    return Poll::Pending;
                }
                b.phase = Phase::Done;
                if (b.failed | b.unsignaled_failed) == 0 {
                    return Poll::Ready(Ok(()));
                }
                return Poll::Ready(Err(self.flush_error(id)));
            }
            Phase::Building | Phase::WaitCredit => {
                if b.epoch != self.epoch && (b.ops > 0 || !b.reqs.is_empty()) {
                    // Queued in an older epoch: never sent in this one.
                    return Poll::Ready(Err(self.fail_batch(id, RpcError::EpochChanged)));
                }
                if b.reqs.is_empty() {
                    if b.ops == 0 {
                        b.phase = Phase::Done;
                        if b.unsignaled_failed == 0 {
                            return Poll::Ready(Ok(()));
                        }
                        return Poll::Ready(Err(self.flush_error(id)));
                    }
                    // One-sided operations only.
                    b.pending = 0;
                    b.phase = Phase::InFlight;
                    self.flush_ops(id);
                    return Poll::Pending;
                }
            }
        }
        match self.try_send(id) {
            Ok(true) => {
                let b = &mut self.workers.batches[id as usize];
                b.phase = Phase::InFlight;
                if b.ops > 0 {
                    self.flush_ops(id);
                }
                Poll::Pending
            }
            Ok(false) => {
                self.workers.wait_credit(id);
                self.stats.credit_waits += 1;
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(self.fail_batch(id, e))),
        }
    }

    /// Fails worker `id`'s batch before anything of it was sent, with `e`.
    #[cold]
    fn fail_batch(&mut self, id: u16, e: RpcError) -> RpcError {
        let by_epoch = e == RpcError::EpochChanged;
        let b = &mut self.workers.batches[id as usize];
        b.phase = Phase::Done;
        let status = if by_epoch {
            self.stats.failed_by_epoch += b.reqs.len() as u64 + b.ops as u64;
            ReqStatus::EpochChanged
        } else {
            ReqStatus::Failed
        };
        for q in b.reqs.iter_mut() {
            q.status = status;
        }
        self.drop_ops(id);
        e
    }

    /// Why a finished flush of worker `id` failed: a request timed out, or else
    /// unsignaled operations failed (reported here, once).
    #[cold]
    fn flush_error(&mut self, id: u16) -> RpcError {
        match self.workers.batches[id as usize].timeout(self.threads) {
            Some(e) => e,
            None => RpcError::UnsignaledFailed(self.take_unsignaled_failures(id)),
        }
    }

    /// Encodes worker `id`'s batch into this step's outgoing datagrams (sent with one
    /// doorbell at the end of the step) if every destination has the credits and window
    /// room; Ok(false) if it must wait.
    fn try_send(&mut self, id: u16) -> Result<bool, RpcError> {
        let b = &self.workers.batches[id as usize];
        // The usual case: the batch joins a group of this step as a part (it needs no
        // credit or window entry of its own).
        if !b.multi && !b.big && self.join_group(id) {
            return Ok(true);
        }
        // Fast path: a batch of single-datagram requests to one destination needs at
        // most one credit and one window entry per request.
        let b = &self.workers.batches[id as usize];
        let fast = !b.multi
            && !b.big
            && match self.client.dests[b.dest0 as usize].as_deref() {
                Some(dest) => {
                    let n = b.reqs.len();
                    n <= dest.credits as usize && n <= dest.room(self.client.window)
                }
                None => false,
            };
        if fast {
            self.encode_one_dest(id);
            return Ok(true);
        }
        let lim = self.outbox.limits;
        let b = &self.workers.batches[id as usize];
        if !self.client.check_needs(
            b,
            lim.mtu,
            lim.coalesce,
            lim.group_cap,
            lim.seg_payload,
            self.threads,
        )? {
            return Ok(false);
        }
        self.encode_batch(id);
        Ok(true)
    }

    /// Phase 2 of a general flush (needs checked): assigns sequence numbers and credits,
    /// encodes. `now` is from this master step (deadlines are coarse: timeout/4 scans).
    /// The small requests to one destination form groups (one seq each); a group may
    /// start in a request datagram to that destination opened earlier in this step (by
    /// another flush): a datagram holds one credit however many flushes share it.
    #[inline(never)]
    fn encode_batch(&mut self, id: u16) {
        let lim = self.outbox.limits;
        let now = self.now;
        let session = self.client.session;
        let flush = self.stats.flushes;
        let b = &mut self.workers.batches[id as usize];
        let nreq = b.reqs.len();
        let mut entries = 0u64;
        for i in 0..nreq {
            let q = b.reqs[i];
            let d = q.dest as usize;
            let dest: &mut Destination = self.client.dests[d]
                .as_deref_mut()
                .expect("created in phase 1");
            let (lo, hi) = (q.off as usize, (q.off + q.len) as usize);
            if q.len as usize > lim.group_cap {
                // Alone, in segments, each holding a credit.
                let segs = (hi - lo).div_ceil(lim.seg_payload);
                let slot = dest.alloc_slot(segs as u16);
                let seq = dest.open_entry(0, id, i as u16, slot, now);
                self.outbox.push_request_segments(
                    d,
                    session,
                    dest.ack,
                    seq,
                    q.rtype,
                    &b.arena[lo..hi],
                );
                entries += 1;
                continue;
            }
            let item = &b.arena[lo - wire::ITEM_HDR..hi];
            let t = &mut self.outbox.per[d];
            if lim.coalesce && t.joins_group(flush, item.len(), lim.mtu) {
                t.grow_group(1, item);
                // The group is this flush's: its last request is this worker's.
                b.reqs[t.group.last as usize].next = i as u16;
                t.group.last = i as u16;
                dest.win.at_mut(t.group.seq).count += 1;
                continue;
            }
            // A new group: in the open request datagram if it fits and holds a credit
            // (one holding only retransmissions has none), else in a fresh one.
            if !self.outbox.ensure(
                d,
                wire::KIND_REQUEST,
                session,
                dest.ack,
                wire::REC_HDR + item.len(),
                false,
            ) && self.outbox.per[d].cur_slot == NO_SLOT
            {
                self.outbox
                    .open_new(d, wire::KIND_REQUEST, session, dest.ack);
            }
            let t = &mut self.outbox.per[d];
            if t.cur_slot == NO_SLOT {
                t.cur_slot = dest.alloc_slot(1);
            }
            let seq = dest.open_entry(1, id, i as u16, t.cur_slot, now);
            t.put_group(seq, 1, item, flush, id, i as u16);
            entries += 1;
        }
        b.pending = nreq as u32;
        self.client.inflight += entries;
        self.flushed(nreq);
    }

    /// Counts a flush of `nreq` requests that took window entries, and makes sure a
    /// retransmission scan is due.
    #[inline(always)]
    fn flushed(&mut self, nreq: usize) {
        self.stats.rpcs_issued += nreq as u64;
        self.stats.flushes += 1;
        if self.client.next_scan <= self.now {
            self.client.next_scan = self.now + self.client.scan_period;
        }
    }

    /// Adds worker `id`'s batch (small requests to one destination) to the last group
    /// of the open datagram to that destination, if another worker's flush built it in
    /// this step and the batch fits, as a new part: no window entry, record or credit of
    /// its own (the group's datagram holds a credit: a flush opened it). Returns whether
    /// it did.
    #[inline(always)]
    fn join_group(&mut self, id: u16) -> bool {
        let b = &self.workers.batches[id as usize];
        let (d, nreq, bytes) = (b.dest0 as usize, b.reqs.len(), b.arena.len());
        let t = &mut self.outbox.per[d];
        if !(self.outbox.limits.coalesce
            && t.group.parts < self.max_parts
            && t.group_has_room(nreq, bytes, self.outbox.limits.mtu))
        {
            return false;
        }
        debug_assert!(t.group.worker != id, "a worker flushes once per step");
        let last = &mut self.workers.batches[t.group.worker as usize].reqs[t.group.last as usize];
        (last.next, last.next_worker) = (0, id);
        t.grow_group(nreq, &self.workers.batches[id as usize].arena);
        t.group.parts += 1;
        (t.group.last, t.group.worker) = ((nreq - 1) as u16, id);
        let e = self.client.dest(d).win.at_mut(t.group.seq);
        e.count += nreq as u8;
        e.parts += 1;
        self.workers.batches[id as usize].pending = nreq as u32;
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
        let lim = self.outbox.limits;
        let mtu = lim.mtu;
        let now = self.now;
        let session = self.client.session;
        let key = open_key(wire::KIND_REQUEST, session);
        let flush = self.stats.flushes;
        let b = &mut self.workers.batches[id as usize];
        let (d, nreq) = (b.dest0 as usize, b.reqs.len());
        let dest = self.client.dests[d]
            .as_deref_mut()
            .expect("checked by try_send");
        let out = &mut self.outbox;
        // Without coalescing every request is a group of one in its own datagram.
        let most = if lim.coalesce { wire::MAX_ITEMS } else { 1 };
        let mut entries = 0u32;
        let mut i = 0;
        // The usual case first (after `join_group`): the whole batch, one group, joins
        // the open datagram.
        let t = &mut out.per[d];
        if lim.coalesce
            && nreq <= wire::MAX_ITEMS
            && t.cur_slot != NO_SLOT
            && t.has_room(key, wire::REC_HDR + b.arena.len(), mtu)
        {
            let seq = dest.open_entry(nreq as u8, id, 0, t.cur_slot, now);
            t.put_group(seq, nreq as u8, &b.arena, flush, id, (nreq - 1) as u16);
            (entries, i) = (1, nreq);
        }
        while i < nreq {
            let lo = b.reqs[i].off as usize - wire::ITEM_HDR;
            let first = b.reqs[i].off as usize + b.reqs[i].len as usize - lo;
            // Join the open request datagram if the first request fits and it holds a
            // credit (one holding only retransmissions has none), else open one.
            let t = &out.per[d];
            if !(lim.coalesce
                && t.cur_slot != NO_SLOT
                && t.has_room(key, wire::REC_HDR + first, mtu))
            {
                out.open_new(d, wire::KIND_REQUEST, session, dest.ack);
                out.per[d].cur_slot = dest.alloc_slot(1);
            }
            let t = &mut out.per[d];
            // The requests that fit: a run of the arena (usually all of it).
            let room = mtu - (t.len - t.open) - wire::REC_HDR;
            let (mut j, mut hi) = (i + 1, lo + first);
            if i == 0 && nreq <= most && b.arena.len() <= room {
                (j, hi) = (nreq, b.arena.len());
            }
            let last = nreq.min(i + most);
            while j < last {
                let e = (b.reqs[j].off + b.reqs[j].len) as usize;
                if e - lo > room {
                    break;
                }
                hi = e;
                j += 1;
            }
            // The group's requests are consecutive: `QueuedRequest::next` as queued.
            let seq = dest.open_entry((j - i) as u8, id, i as u16, t.cur_slot, now);
            t.put_group(
                seq,
                (j - i) as u8,
                &b.arena[lo..hi],
                flush,
                id,
                (j - 1) as u16,
            );
            entries += 1;
            i = j;
        }
        b.pending = nreq as u32;
        self.client.inflight += entries as u64;
        self.flushed(nreq);
    }
}
