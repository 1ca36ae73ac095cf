//! One destination endpoint's credits and window: every request datagram holds credits
//! (FaSST §4.4: with the computed budget no receive queue overflows), and every request
//! or group in flight holds a window entry, indexed by sequence number, until its
//! response (or failure) retires it.

use super::Client;
use crate::config::RpcError;
use crate::runtime::batch::{endpoint_of, WorkerBatch, Workers};
use crate::runtime::seq_array::SeqArray;
use crate::wire;
use ambidex_transport::rtt::RttEstimator;

/// A request (or group) in flight.
#[derive(Clone, Copy, Default)]
pub(crate) struct WindowEntry {
    pub seq: u64,
    pub live: bool,
    /// Items of the group this seq carries (its first request is `first` of worker
    /// `worker`, the others follow `QueuedRequest::next` and `next_worker`); 0 for a lone
    /// request sent as its own (segmented) message.
    pub count: u8,
    /// Parts of the group (workers' batches): its response may take `max_message` each.
    pub parts: u8,
    pub worker: u16,
    pub first: u16,
    /// Credit slot of its datagram(s).
    pub slot: u16,
    /// Retransmissions so far (Karn's rule: a retransmitted request gives no sample).
    pub retries: u32,
    /// Step time of its first transmission: the start of its round trip and of its
    /// give-up time.
    pub sent: u64,
    pub deadline: u64,
}

/// The credits held by one request datagram (or by the segments of one message): they
/// return when its last window entry retires.
#[derive(Clone, Copy, Default)]
pub(crate) struct CreditSlot {
    remaining: u16,
    weight: u16,
}

/// Client side of one destination endpoint.
pub(crate) struct Destination {
    pub credits: u32,
    slot_free: Vec<u16>,
    slots: Vec<CreditSlot>,
    pub next_seq: u64,
    /// Every seq below is settled (sent in request headers as `ack`).
    pub ack: u64,
    pub win: SeqArray<WindowEntry>,
    /// Window entries in flight.
    pub inflight: u32,
    /// Round trips to this endpoint, and the retransmission timeout they give.
    pub rtt: RttEstimator,
    /// Send time of the oldest request settled in this step that was sent once (its
    /// round trip ends at the step's clock read); `NO_SAMPLE` if none.
    pub sample_sent: u64,
    /// The timeout doubles at most once per timeout period: before this time, further
    /// expiries belong to the same loss (TCP's one timer per connection).
    pub next_backoff: u64,
}

/// `Destination::sample_sent` without a pending sample.
pub(crate) const NO_SAMPLE: u64 = u64::MAX;

impl Destination {
    pub fn new(credits: u32, window: usize, rtt: RttEstimator) -> Destination {
        Destination {
            credits,
            slot_free: (0..credits as u16).rev().collect(),
            slots: vec![CreditSlot::default(); credits as usize],
            next_seq: 1,
            ack: 1,
            win: SeqArray::new(window, |_| WindowEntry::default()),
            inflight: 0,
            rtt,
            sample_sent: NO_SAMPLE,
            next_backoff: 0,
        }
    }

    /// Window entries free now.
    #[inline(always)]
    pub fn room(&self, window: usize) -> usize {
        window - (self.next_seq - self.ack) as usize
    }

    /// Opens the window entry of the next seq: `count` items (0: a lone request) of
    /// worker `worker`'s batch from its request `first`, in credit slot `slot`, sent at
    /// `now` and due one timeout later. Returns the seq.
    #[inline(always)]
    pub fn open_entry(&mut self, count: u8, worker: u16, first: u16, slot: u16, now: u64) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.slots[slot as usize].remaining += 1;
        *self.win.at_mut(seq) = WindowEntry {
            seq,
            live: true,
            count,
            parts: 1,
            worker,
            first,
            slot,
            retries: 0,
            sent: now,
            deadline: now + self.rtt.rto(),
        };
        self.inflight += 1;
        seq
    }

    /// Takes a credit slot worth `weight` credits (the caller checked there are).
    pub fn alloc_slot(&mut self, weight: u16) -> u16 {
        let s = self
            .slot_free
            .pop()
            .expect("credit accounting: a slot per credit");
        self.slots[s as usize] = CreditSlot {
            remaining: 0,
            weight,
        };
        self.credits -= weight as u32;
        s
    }

    /// Whether `seq` is a live entry (not settled, not a stale slot of the window).
    #[inline(always)]
    pub fn is_live(&self, seq: u64) -> bool {
        let e = self.win.at(seq);
        e.live && e.seq == seq
    }

    /// Frees the live window entry `seq`: moves the acknowledged watermark and, with the
    /// last entry of its datagram, returns the datagram's credits (and wakes the workers
    /// waiting for some). Returns the entry.
    #[inline(always)]
    pub fn retire(&mut self, seq: u64, workers: &mut Workers) -> WindowEntry {
        let e = self.win.at_mut(seq);
        e.live = false;
        let e = *e;
        // The entry at `ack` is live unless it is this one (ack is the lowest unsettled
        // seq), so the watermark moves only when the oldest entry settles.
        if seq == self.ack {
            self.ack += 1;
            while self.ack < self.next_seq && !self.win.at(self.ack).live {
                self.ack += 1;
            }
        }
        let slot = &mut self.slots[e.slot as usize];
        slot.remaining -= 1;
        if slot.remaining == 0 {
            self.credits += slot.weight as u32;
            self.slot_free.push(e.slot);
            if !workers.credit_waiters.is_empty() {
                workers.wake_credit_waiters();
            }
        }
        e
    }
}

/// Per-destination needs of one flush (scratch).
#[derive(Clone, Copy, Default)]
pub(crate) struct DestNeed {
    fill: usize,
    /// Records in the datagram being filled, items in its last group.
    count: usize,
    items: usize,
    dgrams: usize,
    reqs: usize,
}

impl Client {
    /// Phase 1 of a general flush: what `batch` needs per destination (mirrors the
    /// packing of `encode_batch` as if every destination started a fresh datagram:
    /// starting in a datagram already open never takes more new ones, so it is an upper
    /// bound; window entries are bounded by the requests). Creates the destinations.
    /// Ok(false) if some destination lacks credits or window room now; an error if the
    /// batch could never fit a destination's whole budget.
    #[inline(never)]
    pub fn check_needs(
        &mut self,
        batch: &WorkerBatch,
        mtu: usize,
        coalesce: bool,
        group_cap: usize,
        seg_payload: usize,
        threads: usize,
    ) -> Result<bool, RpcError> {
        for q in &batch.reqs {
            let n = &mut self.need[q.dest as usize];
            if n.reqs == 0 {
                self.need_touched.push(q.dest);
            }
            n.reqs += 1;
            let len = q.len as usize;
            if len > group_cap {
                n.dgrams += len.div_ceil(seg_payload);
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
            let n = std::mem::take(&mut self.need[d as usize]);
            let dest = self.dests[d as usize].get_or_insert_with(|| {
                Box::new(Destination::new(self.credits, self.window, self.rtt0))
            });
            if n.dgrams > self.credits as usize || n.reqs > self.window {
                err = Some(RpcError::BatchTooLarge {
                    dest: endpoint_of(d as usize, threads),
                    datagrams: n.dgrams,
                    requests: n.reqs,
                });
            }
            if n.dgrams > dest.credits as usize || n.reqs > dest.room(self.window) {
                short = true;
            }
        }
        self.need_touched.clear();
        if let Some(e) = err {
            return Err(e);
        }
        Ok(!short)
    }
}
