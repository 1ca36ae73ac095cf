//! Reassembly of messages that came in segments (requests and responses larger than one
//! datagram). The pool is bounded (`RuntimeConfig::reassembly_slots`); when it is full
//! the source holding the most slots loses its oldest message, so that a flood of first
//! segments from one source evicts its own messages, not other clients'.

use super::stats::RpcStats;
use super::State;
use crate::wire::{self, Seg};

/// A message being reassembled from segments.
struct ReassemblySlot {
    active: bool,
    src: u32,
    kind: u8,
    session: u32,
    seq: u64,
    tag: u8,
    total: u32,
    got: u32,
    bits: Vec<u64>,
    buf: Vec<u8>,
    touched: u64,
}

pub(crate) struct Reassembly {
    slots: Vec<ReassemblySlot>,
    max_slots: usize,
    seg_payload: usize,
    /// Scratch of eviction: slots held per source endpoint (all zero between uses).
    held: Vec<u32>,
}

impl Reassembly {
    pub fn new(max_slots: usize, seg_payload: usize, endpoints: usize) -> Reassembly {
        Reassembly {
            slots: Vec::new(),
            max_slots: max_slots.max(1),
            seg_payload,
            held: vec![0; endpoints],
        }
    }

    /// Adds a segment (of record `r`) of a message of at most `max` bytes; returns the
    /// slot once its message is complete (read it with [`Reassembly::take`]).
    #[allow(clippy::too_many_arguments)]
    pub fn add(
        &mut self,
        src: usize,
        kind: u8,
        session: u32,
        r: &wire::Record<'_>,
        seg: Seg,
        max: usize,
        now: u64,
        stats: &mut RpcStats,
    ) -> Option<usize> {
        let sp = self.seg_payload;
        let total = seg.total as usize;
        let off = seg.offset as usize;
        // Segments are cut at fixed boundaries by a sender of the same MTU.
        if total > max || !off.is_multiple_of(sp) || r.payload.len() != sp.min(total - off) {
            stats.rx_bad_segment += 1;
            return None;
        }
        let found = self.slots.iter().position(|x| {
            x.active
                && x.src == src as u32
                && x.kind == kind
                && x.session == session
                && x.seq == r.seq
        });
        let i = match found {
            Some(i) => {
                let x = &self.slots[i];
                if x.total != seg.total || x.tag != r.tag {
                    stats.rx_bad_segment += 1;
                    return None;
                }
                i
            }
            None => {
                let i = self.free_slot(stats)?;
                let x = &mut self.slots[i];
                x.active = true;
                x.src = src as u32;
                x.kind = kind;
                x.session = session;
                x.seq = r.seq;
                x.tag = r.tag;
                x.total = seg.total;
                x.got = 0;
                x.bits.clear();
                x.bits.resize(total.div_ceil(sp).div_ceil(64), 0);
                if x.buf.len() < total {
                    x.buf.resize(total, 0);
                }
                i
            }
        };
        let x = &mut self.slots[i];
        x.touched = now;
        let k = off / sp;
        if x.bits[k / 64] & (1 << (k % 64)) != 0 {
            return None; // duplicate segment
        }
        x.bits[k / 64] |= 1 << (k % 64);
        x.buf[off..off + r.payload.len()].copy_from_slice(r.payload);
        x.got += r.payload.len() as u32;
        (x.got == x.total).then_some(i)
    }

    /// A slot for a new message: an idle one, a new one, or the evicted oldest message
    /// of the source holding the most slots.
    fn free_slot(&mut self, stats: &mut RpcStats) -> Option<usize> {
        if let Some(i) = self.slots.iter().position(|x| !x.active) {
            return Some(i);
        }
        if self.slots.len() < self.max_slots {
            self.slots.push(ReassemblySlot {
                active: false,
                src: 0,
                kind: 0,
                session: 0,
                seq: 0,
                tag: 0,
                total: 0,
                got: 0,
                bits: Vec::new(),
                buf: Vec::new(),
                touched: 0,
            });
            return Some(self.slots.len() - 1);
        }
        stats.reassembly_evicted += 1;
        // One pass to count the slots per source (scratch indexed by source).
        let held = &mut self.held;
        let mut hog = 0;
        for x in &self.slots {
            held[x.src as usize] += 1;
            if held[x.src as usize] > held[hog as usize] {
                hog = x.src;
            }
        }
        for x in &self.slots {
            held[x.src as usize] = 0;
        }
        let (i, _) = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, x)| x.src == hog)
            .min_by_key(|(_, x)| x.touched)?;
        Some(i)
    }

    /// Takes the whole message of completed slot `i` out of the pool (no allocation:
    /// give the buffer back with [`Reassembly::give_back`]); the slot is free again.
    pub fn take(&mut self, i: usize) -> (Vec<u8>, usize) {
        let x = &mut self.slots[i];
        x.active = false;
        (std::mem::take(&mut x.buf), x.total as usize)
    }

    pub fn give_back(&mut self, i: usize, buf: Vec<u8>) {
        self.slots[i].buf = buf;
    }
}

impl State {
    /// Adds segment `r` (of a `kind` message of at most `max` bytes from endpoint `s`,
    /// session `session`) to reassembly; once the message is whole, lends it out as its
    /// slot, buffer and length (give the buffer back with [`Reassembly::give_back`]).
    pub(crate) fn reassembled(
        &mut self,
        s: usize,
        kind: u8,
        session: u32,
        r: &wire::Record<'_>,
        max: usize,
    ) -> Option<(usize, Vec<u8>, usize)> {
        let seg = r.seg.expect("segmented");
        let ra = &mut self.reassembly;
        let i = ra.add(s, kind, session, r, seg, max, self.now, &mut self.stats)?;
        let (whole, total) = ra.take(i);
        Some((i, whole, total))
    }
}
