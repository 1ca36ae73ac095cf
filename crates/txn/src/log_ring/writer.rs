//! The coordinator side of a log ring: per replica node, where this thread's next
//! record goes (the tail), how far the replica has acknowledged truncation (the head),
//! and the records between, until they can be reclaimed.
//!
//! Space is reused only after the replica acknowledged a truncation past it, so a
//! WRITE never lands on a record the replica has not released. A record is reclaimable
//! once its transaction is installed everywhere (`TxnThread::truncate_later`); one whose
//! commit was incomplete stays, and with it every later record of the ring, until
//! recovery resolves it (so a ring can fill; the coordinator then aborts with
//! `log_full` after waiting, never overwrites). Recovery replays every ring and
//! restarts it in the new epoch, whose writers start afresh
//! (`RingWriters::reset`, `region::RingHead::of_epoch`). An append that failed at a replica
//! leaves its slot uncertain there (nothing, part, or all of it); the slot is rewritten
//! as a void marker by the ring's next flush ([`RingWriter::take_repairs`]) so the
//! records after it stay readable.

use super::format;
use super::region::RingHead;
use ambidex_store::LogRegionDesc;
use ambidex_transport::RemoteAddr;
use std::collections::VecDeque;

/// Records reclaimable before a truncation is piggybacked on the next append (or fewer
/// once half the ring is in use).
pub const TRUNCATE_EVERY: u32 = 32;
/// A truncation unanswered this long is taken as lost (its coroutine may have been
/// dropped), so another may be sent; a late answer is still used.
pub const TRUNCATION_LOST_NS: u64 = 1_000_000_000;
/// A truncation answered without freeing anything (the replica's head stopped at a slot
/// not landed or not yet repaired) is not sent again before this long: sent again at
/// once, a drain or a full ring's wait would send them back to back.
pub const TRUNCATION_RETRY_NS: u64 = 100_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Reserved; its WRITE is out.
    Writing,
    /// Landed at the replica; its transaction is not installed everywhere yet.
    Logged,
    /// May be truncated (installed everywhere, or voided).
    Done,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    txn: u64,
    end: u64,
    state: State,
}

/// Where one append goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// A pad first (position, number), when the record does not fit before the ring's
    /// end.
    pub pad: Option<(u64, u64)>,
    pub pos: u64,
    pub seq: u64,
    pub len: u64,
}

/// A WRITE that repairs a failed append: a pad or a void's header or trailer.
#[derive(Clone, Copy, Debug)]
pub struct Repair {
    pub pos: u64,
    bytes: [u8; format::HEADER],
    len: usize,
}

impl Repair {
    fn new(pos: u64, b: &[u8]) -> Repair {
        let mut bytes = [0u8; format::HEADER];
        bytes[..b.len()].copy_from_slice(b);
        Repair {
            pos,
            bytes,
            len: b.len(),
        }
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// This coordinator thread's ring at one replica node.
pub struct RingWriter {
    ring: LogRegionDesc,
    ring_off: u64,
    tail: u64,
    next_seq: u64,
    /// The replica's head as it acknowledged it.
    acked: u64,
    /// Slots from `acked` in ring order (a pad is part of its record's entry).
    entries: VecDeque<(u64, Entry)>,
    /// How many entries at the front are done: what a truncation may reclaim, kept as
    /// entries finish so that neither finding a transaction's entry nor computing the
    /// reclaimable head walks the (often long) done prefix.
    done_prefix: usize,
    /// When the truncation that is out was sent (one at a time).
    truncating: Option<u64>,
    /// When the last truncation was sent, and whether its answer freed nothing.
    last_sent: u64,
    stalled: bool,
    /// Entries made reclaimable since the last truncation was sent.
    since_truncate: u32,
    repairs: Vec<Repair>,
    /// Repairs taken and not yet landed or given back: no truncation is sent meanwhile,
    /// since the replica applies every record a truncation passes and a voided
    /// transaction's record may still be intact there.
    repairs_out: usize,
}

impl RingWriter {
    /// The writer of ring `ring_off` of `desc` (the replica's log region), from a
    /// fresh ring's head.
    pub fn new(desc: LogRegionDesc, ring_off: u64) -> RingWriter {
        RingWriter::starting_at(desc, ring_off, RingHead::START)
    }

    /// The writer of a ring whose replica's head is `head` (a ring restarted in a new
    /// epoch: [`RingHead::of_epoch`]).
    pub fn starting_at(desc: LogRegionDesc, ring_off: u64, head: RingHead) -> RingWriter {
        RingWriter {
            ring: desc,
            ring_off,
            tail: head.pos,
            next_seq: head.seq,
            acked: head.pos,
            entries: VecDeque::new(),
            done_prefix: 0,
            truncating: None,
            last_sent: 0,
            stalled: false,
            since_truncate: 0,
            repairs: Vec::new(),
            repairs_out: 0,
        }
    }

    pub fn ring_bytes(&self) -> u64 {
        self.ring.ring_bytes
    }

    /// The largest record: half a ring, so a record always fits an empty ring even
    /// after a pad to the ring's end (and its length fits the header's 32 bits).
    pub fn max_record(&self) -> u64 {
        (self.ring.ring_bytes / 2).min(u32::MAX as u64 & !(format::ALIGN - 1))
    }

    /// The remote address of ring position `pos`.
    pub fn addr(&self, pos: u64) -> RemoteAddr {
        self.ring
            .region
            .at(self.ring_off + pos % self.ring.ring_bytes)
    }

    /// Bytes reserved and not yet released by the replica.
    pub fn used(&self) -> u64 {
        self.tail - self.acked
    }

    /// The bytes a record of `len` takes from the tail (with its pad).
    fn need(&self, len: u64) -> (u64, Option<u64>) {
        let room = self.ring.ring_bytes - self.tail % self.ring.ring_bytes;
        if room < len {
            (room + len, Some(room))
        } else {
            (len, None)
        }
    }

    /// Whether a record of `len` bytes fits now.
    pub fn fits(&self, len: u64) -> bool {
        self.used() + self.need(len).0 <= self.ring.ring_bytes
    }

    /// Takes the space of a record of `len` bytes of transaction `txn` (check
    /// [`RingWriter::fits`] first: `None` if it does not fit).
    pub fn reserve(&mut self, txn: u64, len: u64) -> Option<Reservation> {
        if !self.fits(len) {
            return None;
        }
        let (need, pad) = self.need(len);
        let start = self.tail;
        let pad = pad.map(|_| {
            let p = (start, self.next_seq);
            self.next_seq += 1;
            p
        });
        let r = Reservation {
            pad,
            pos: start + (need - len),
            seq: self.next_seq,
            len,
        };
        self.next_seq += 1;
        self.tail += need;
        self.entries.push_back((
            start,
            Entry {
                txn,
                end: self.tail,
                state: State::Writing,
            },
        ));
        Some(r)
    }

    /// The unfinished entry of `txn` (the done prefix holds none).
    fn entry(&mut self, txn: u64) -> Option<&mut Entry> {
        self.entries
            .range_mut(self.done_prefix..)
            .map(|(_, e)| e)
            .find(|e| e.txn == txn && e.state != State::Done)
    }

    /// `txn`'s unfinished entry is done: counted for the next truncation, and the done
    /// prefix grown past it if it was the first unfinished one.
    fn finish(&mut self, txn: u64) {
        if let Some(e) = self.entry(txn) {
            e.state = State::Done;
            self.since_truncate += 1;
        }
        self.grow_done_prefix();
    }

    fn grow_done_prefix(&mut self) {
        while self
            .entries
            .get(self.done_prefix)
            .is_some_and(|(_, e)| e.state == State::Done)
        {
            self.done_prefix += 1;
        }
    }

    /// The append of `txn` landed.
    pub fn logged(&mut self, txn: u64) {
        if let Some(e) = self.entry(txn) {
            e.state = State::Logged;
        }
    }

    /// `txn` is installed everywhere: its record may go.
    pub fn installed(&mut self, txn: u64) {
        self.finish(txn);
    }

    /// The append `r` of `txn` failed here: its slot is rewritten as a void (and its
    /// pad again), by the next flush, and may then be truncated.
    pub fn failed(&mut self, txn: u64, r: &Reservation) {
        if let Some((pos, seq)) = r.pad {
            let len = self.ring.ring_bytes - pos % self.ring.ring_bytes;
            self.repairs.push(Repair::new(pos, &format::pad(len, seq)));
        }
        let (h, t) = format::void(r.len, r.seq);
        self.repairs.push(Repair::new(r.pos, &h));
        self.repairs
            .push(Repair::new(r.pos + r.len - format::TRAILER as u64, &t));
        self.finish(txn);
    }

    /// Repairs to send with the next flush (given back with [`RingWriter::repair_failed`]
    /// if they do not land).
    pub fn take_repairs(&mut self) -> Vec<Repair> {
        self.repairs_out += self.repairs.len();
        std::mem::take(&mut self.repairs)
    }

    /// A repair taken did not land: it goes with the next flush.
    pub fn repair_failed(&mut self, r: Repair) {
        self.repairs_out = self.repairs_out.saturating_sub(1);
        self.repairs.push(r);
    }

    /// A repair taken landed.
    pub fn repair_landed(&mut self) {
        self.repairs_out = self.repairs_out.saturating_sub(1);
    }

    /// How far the replica may truncate: past every slot reclaimable from the head on.
    pub fn reclaimable(&self) -> u64 {
        match self.done_prefix.checked_sub(1) {
            Some(last) => self.entries[last].1.end,
            None => self.acked,
        }
    }

    /// The head to send a truncation for at time `now_ns`, if one is due: none is out,
    /// no repair waits or is out (the replica applies what it truncates, so a void
    /// must land first), something is reclaimable, and either `urgent` (the ring is
    /// full), enough records are, or a quarter of the ring is in use.
    pub fn truncation_due(&self, urgent: bool, now_ns: u64) -> Option<u64> {
        if self.has_repairs() || self.repairs_out > 0 {
            return None;
        }
        let to = self.reclaimable();
        let due = urgent
            || self.since_truncate >= TRUNCATE_EVERY
            || self.used() >= self.ring.ring_bytes / 4;
        let out = self
            .truncating
            .is_some_and(|t| now_ns.saturating_sub(t) < TRUNCATION_LOST_NS);
        let resting = self.stalled && now_ns.saturating_sub(self.last_sent) < TRUNCATION_RETRY_NS;
        (!out && !resting && to > self.acked && due).then_some(to)
    }

    /// A truncation was sent at `now_ns`.
    pub fn truncation_sent(&mut self, now_ns: u64) {
        self.truncating = Some(now_ns);
        self.last_sent = now_ns;
        self.since_truncate = 0;
    }

    /// Whether a truncation is out.
    pub fn truncating(&self) -> bool {
        self.truncating.is_some()
    }

    /// Whether everything reclaimable is truncated and no repair waits or is out.
    pub fn drained(&self) -> bool {
        self.reclaimable() <= self.acked && !self.has_repairs() && self.repairs_out == 0
    }

    /// Whether repairs wait to be sent.
    pub fn has_repairs(&self) -> bool {
        !self.repairs.is_empty()
    }

    /// The replica answered a truncation to `asked` with its head `head` (untrusted: a
    /// head outside what was asked changes nothing). Returns whether space was freed.
    pub fn truncation_acked(&mut self, asked: u64, head: Option<u64>) -> bool {
        self.truncating = None;
        let Some(h) = head.filter(|&h| h > self.acked && h <= asked) else {
            self.stalled = true;
            return false;
        };
        self.stalled = false;
        self.acked = h;
        while self.entries.front().is_some_and(|(_, e)| e.end <= h) {
            // Entries up to what was asked are done (`asked` came from `reclaimable`),
            // so they leave the prefix; the re-count after is for any other caller.
            self.entries.pop_front();
            self.done_prefix = self.done_prefix.saturating_sub(1);
        }
        self.grow_done_prefix();
        true
    }

    /// Records reserved and not yet released by the replica.
    pub fn held(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ambidex_transport::{Perms, RegionDesc};

    fn writer(ring_bytes: u64) -> RingWriter {
        let region = RegionDesc {
            node: 1,
            id: 3,
            len: 64 + ring_bytes,
            key: 9,
            perms: Perms::READ | Perms::WRITE,
        };
        let d = LogRegionDesc {
            region,
            base: 64,
            ring_bytes,
            rings: 1,
        };
        RingWriter::new(d, 64)
    }

    /// The reclaimable head is the end of the done prefix, kept as entries finish in
    /// any order and as truncations (whole or partial) are acknowledged: checked against
    /// a walk of every entry after each step of a seeded random history.
    #[test]
    fn the_done_prefix_matches_a_walk_of_the_entries() {
        let walk = |w: &RingWriter| {
            let mut head = w.acked;
            for (_, e) in &w.entries {
                if e.state != State::Done {
                    break;
                }
                head = e.end;
            }
            head
        };
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let mut w = writer(1 << 16);
        let (mut txn, mut open) = (0u64, Vec::new());
        for _ in 0..20_000 {
            match next(4) {
                0 | 1 => {
                    if w.fits(64) {
                        txn += 1;
                        w.reserve(txn, 64).unwrap();
                        open.push(txn);
                    }
                }
                2 if !open.is_empty() => {
                    let t = open.swap_remove(next(open.len() as u64) as usize);
                    w.logged(t);
                    w.installed(t);
                }
                _ => {
                    let to = w.reclaimable();
                    if to > w.acked {
                        // The replica may free less than asked.
                        let head = w.acked + 1 + next(to - w.acked);
                        let head = w
                            .entries
                            .iter()
                            .map(|(_, e)| e.end)
                            .find(|&end| end >= head)
                            .unwrap_or(to);
                        w.truncation_sent(0);
                        assert!(w.truncation_acked(to, Some(head)));
                    }
                }
            }
            assert_eq!(w.reclaimable(), walk(&w));
        }
        assert!(txn > 1000, "the history did little: {txn} records");
    }

    #[test]
    fn space_is_reused_only_after_the_replica_acknowledges() {
        let mut w = writer(512);
        let a = w.reserve(1, 192).unwrap();
        let b = w.reserve(2, 192).unwrap();
        assert_eq!((a.pos, a.seq, b.pos, b.seq), (0, 1, 192, 2));
        // 128 bytes left before the end: the next record needs a pad, which does not
        // fit until the replica releases something.
        assert!(!w.fits(192));
        w.logged(1);
        w.logged(2);
        w.installed(2);
        assert_eq!(
            w.reclaimable(),
            0,
            "record 1 is not installed: nothing goes"
        );
        w.installed(1);
        assert_eq!(
            w.truncation_due(false, 0),
            Some(384),
            "more than a quarter of the ring is in use"
        );
        assert_eq!(w.truncation_due(true, 0), Some(384));
        w.truncation_sent(0);
        assert_eq!(w.truncation_due(true, 5), None, "one truncation at a time");
        assert_eq!(
            w.truncation_due(true, TRUNCATION_LOST_NS),
            Some(384),
            "unless the one out is lost"
        );
        assert!(!w.fits(192), "not acknowledged yet");
        // A head the replica was not asked for changes nothing.
        assert!(!w.truncation_acked(384, Some(400)));
        w.truncation_sent(0);
        assert!(w.truncation_acked(384, Some(384)));
        let c = w.reserve(3, 192).unwrap();
        assert_eq!(c.pad, Some((384, 3)));
        assert_eq!((c.pos, c.seq), (512, 4));
        assert_eq!(w.addr(c.pos).offset, 64);
        // A failed append is voided and may then be truncated.
        w.failed(3, &c);
        let repairs = w.take_repairs();
        assert_eq!(repairs.len(), 3);
        assert_eq!(repairs[0].pos, 384);
        assert_eq!(repairs[2].pos, 512 + 192 - 16);
        assert_eq!(w.reclaimable(), 704);
        // No truncation goes out before the void lands (the replica would apply the
        // record if it were still intact), nor while a repair waits to be sent again.
        assert_eq!(w.truncation_due(true, 0), None);
        let mut repairs = repairs.into_iter();
        w.repair_failed(repairs.next().unwrap());
        w.repair_landed();
        w.repair_landed();
        assert_eq!(w.truncation_due(true, 0), None);
        let again = w.take_repairs();
        assert_eq!(again.len(), 1);
        assert_eq!(w.truncation_due(true, 0), None);
        w.repair_landed();
        assert_eq!(w.truncation_due(true, 0), Some(704));
    }
}
