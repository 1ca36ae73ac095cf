//! A node's log region (the replica side): one ring per coordinator (node, thread) that
//! logs to this node, registered on its transport so coordinators WRITE records into it
//! one-sided; the head of each ring (what its coordinator has truncated); and the
//! checked reading of a ring, for truncation and for recovery.
//!
//! Which rings: a coordinator logs each record at the backups of the keys it writes
//! (DrTM+H §5.4), which may be any other node, so with R > 1 node m holds a ring for
//! every coordinator thread of every other node: ring `(d − 1) · threads + t` is
//! coordinator (m − d, t)'s, d = 1..nodes−1. (Both sides compute it from the placement;
//! the descriptor says how many rings there are, so a disagreement is an error, not a
//! stray WRITE.) Memory per node: (nodes − 1) × threads × the ring size.
//!
//! Layout: a superblock `[LOG_MAGIC][base][ring_bytes][rings]` (the start-up check
//! READs it), then the rings from `base`. A ring's positions count bytes from its
//! creation (the offset is the position modulo the ring's size), so head and tail are
//! plain numbers and a full ring is `tail − head = ring_bytes`.

use super::format::{self, classify, End, LoggedTxn, SlotHead, SlotKind};
use ambidex_store::{LogRegionDesc, LogRegionError};
use ambidex_transport::{
    NodeId, NodeTransport, Perms, Region, RegionMemory, ThreadId, TransportError,
};
use std::sync::Mutex;
use std::time::Duration;

/// First word of a log region ("AMBXLOG1").
pub const LOG_MAGIC: u64 = 0x3147_4f4c_5842_4d41;
/// Offset of the first ring (a cache line for the superblock).
pub const RING_BASE: u64 = 64;
/// Bytes of the start-up check's READ of the superblock.
pub const SUPERBLOCK: usize = 32;

/// How big each ring is and how long a coordinator waits for room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogRingConfig {
    /// Bytes per ring: 4 MiB by default, about 900 TPC-C new-order records (4.6 KB on
    /// average), so that a coordinator keeps logging for the several milliseconds a
    /// truncation's round trip takes when nodes share a core (sent every 32 records or
    /// at a quarter of a ring): with 256 KiB, tpcc-no under `drtm-r` waited for room in
    /// 28% of its commits. A multiple of 16, at least 256. Memory per node (with
    /// R > 1): (nodes − 1) × threads × this.
    pub ring_bytes: u64,
    /// How long a coordinator whose record does not fit waits for truncations before it
    /// aborts with `log_full`.
    pub full_wait: Duration,
}

impl Default for LogRingConfig {
    fn default() -> Self {
        LogRingConfig {
            ring_bytes: 4 * 1024 * 1024,
            full_wait: Duration::from_millis(500),
        }
    }
}

/// The ring of coordinator (`coordinator`, `thread`) at node `replica`: every other
/// node has one when keys have backups (R > 1).
pub fn ring_index(
    nodes: u16,
    replication: u16,
    threads: u16,
    replica: NodeId,
    coordinator: NodeId,
    thread: ThreadId,
) -> Option<u32> {
    let n = nodes as u32;
    let d = (replica as u32 + n - coordinator as u32 % n) % n;
    (replication > 1 && d >= 1 && d < n && thread < threads)
        .then(|| (d - 1) * threads as u32 + thread as u32)
}

/// Where a ring's reader is: the position of the next slot and its number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingHead {
    pub pos: u64,
    pub seq: u64,
}

impl RingHead {
    /// A fresh ring's head (numbers start at 1, so zeroes are never a slot): the head
    /// of epoch 1.
    pub const START: RingHead = RingHead { pos: 0, seq: 1 };

    /// Bits of a slot number below the epoch's part (see [`RingHead::of_epoch`]).
    const EPOCH_SHIFT: u32 = 40;

    /// Where every ring starts again in epoch `epoch` (recovery restarts them: the old
    /// epoch's records are replayed, and its writers' state goes). The numbers of epoch
    /// `e` start at `(e - 1) · 2^40 + 1`, so a slot an earlier epoch left in the ring
    /// has a smaller number and ends the log like an earlier lap's, and writer and
    /// replica agree on the head without a message. Holds while an epoch writes fewer
    /// than 2^40 slots to one ring (12 days at a million a second) and for 2^24 epochs.
    /// The epoch part of this head's slot number (of the epoch whose restart it
    /// follows, modulo 2^24; see [`RingHead::of_epoch`]).
    pub fn epoch(&self) -> u64 {
        self.seq.saturating_sub(1) >> Self::EPOCH_SHIFT
    }

    pub fn of_epoch(epoch: u32) -> RingHead {
        let e = (epoch.saturating_sub(1) as u64) & ((1 << (64 - Self::EPOCH_SHIFT)) - 1);
        RingHead {
            pos: 0,
            seq: (e << Self::EPOCH_SHIFT) | 1,
        }
    }
}

/// What reading a ring found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingScan {
    /// The valid records read, in ring order (recovery only).
    pub records: Vec<LoggedTxn>,
    /// Valid records passed (also when not collected).
    pub valid: u64,
    /// Where reading stopped (after the last slot accepted) and why.
    pub head: RingHead,
    pub end: End,
    /// Records framed correctly whose contents did not decode: skipped, never returned.
    pub malformed: u64,
    pub malformed_bytes: u64,
    /// Void markers (appends that failed) and pads skipped.
    pub voids: u64,
    pub pads: u64,
    /// Recovery only: holes passed over (slots not, or not fully, written, with written
    /// slots after them: a coordinator's concurrent appends land in any order) and their
    /// bytes.
    pub gaps: u64,
    pub gap_bytes: u64,
    /// Bytes of the torn or garbage slot reading stopped at (its claimed length, at most
    /// the rest of the ring; 16 if the length itself is impossible).
    pub torn_bytes: u64,
}

impl RingScan {
    /// Whether reading stopped at a torn or garbage slot (not at the log's normal end).
    pub fn torn(&self) -> bool {
        matches!(self.end, End::Torn | End::Garbage)
    }
}

/// One ring of a log region: where it is and whose it is.
#[derive(Clone, Copy)]
pub struct RingRef<'a> {
    pub mem: &'a RegionMemory,
    /// Offset of the ring in the region, and its size.
    pub off: u64,
    pub bytes: u64,
    /// Its coordinator (every record must name it as the owner).
    pub node: NodeId,
    pub thread: ThreadId,
}

/// How a ring is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanMode {
    /// A truncation up to position `to`: only contiguous valid slots are passed (the
    /// head must never pass a slot that is not there yet); records are checked, not
    /// collected.
    Truncate { to: u64 },
    /// Recovery: every valid record from the head on, for one ring's length; a hole
    /// (a slot not written, with later slots written) is passed over by looking for the
    /// next slot whose framing is intact and whose number is higher.
    Recover,
}

/// The slot at `pos` if it is one of number `seq` (or, with `any_later`, of any higher
/// number): its kind, after its trailer is checked for framed slots.
fn slot_at(
    r: &RingRef<'_>,
    pos: u64,
    seq: u64,
    any_later: bool,
    buf: &mut Vec<u8>,
) -> Result<(SlotKind, u64), (End, u64)> {
    let off = pos % r.bytes;
    let room = r.bytes - off;
    let mut h = [0u8; 16];
    if !r.mem.read(r.off + off, &mut h) {
        return Err((End::Garbage, format::ALIGN));
    }
    let head = SlotHead::parse(&h);
    let want = if any_later && head.seq > seq {
        head.seq
    } else {
        seq
    };
    let torn = |end| {
        let claimed = head.len as u64;
        let bytes = if claimed >= format::ALIGN && claimed <= room {
            claimed
        } else {
            format::ALIGN
        };
        (end, bytes)
    };
    let kind = classify(head, room, want).map_err(torn)?;
    if let SlotKind::Framed { len, .. } = kind {
        buf.resize(len as usize, 0);
        if !r.mem.read(r.off + off, buf) || !format::trailer_matches(buf) {
            return Err(torn(End::Torn));
        }
    }
    Ok((kind, want))
}

/// Reads `ring` from `head` (see [`ScanMode`]), at most one ring's length. Every byte is
/// untrusted: nothing here panics on them, malformed records are counted and skipped.
pub fn scan_ring(ring: &RingRef<'_>, head: RingHead, mode: ScanMode) -> RingScan {
    scan_ring_with(ring, head, mode, &mut |_| {})
}

/// [`scan_ring`], calling `accepted` with the bytes of every record accepted, in ring
/// order, before the head passes it.
pub fn scan_ring_with(
    ring: &RingRef<'_>,
    head: RingHead,
    mode: ScanMode,
    accepted: &mut dyn FnMut(&[u8]),
) -> RingScan {
    let lap_end = head.pos.saturating_add(ring.bytes);
    let (limit, recover) = match mode {
        ScanMode::Truncate { to } => (to.min(lap_end), false),
        ScanMode::Recover => (lap_end, true),
    };
    let mut s = RingScan {
        records: Vec::new(),
        valid: 0,
        head,
        end: End::Limit,
        malformed: 0,
        malformed_bytes: 0,
        voids: 0,
        pads: 0,
        gaps: 0,
        gap_bytes: 0,
        torn_bytes: 0,
    };
    let mut buf = Vec::new();
    while s.head.pos < limit {
        let (kind, _) = match slot_at(ring, s.head.pos, s.head.seq, false, &mut buf) {
            Ok(k) => k,
            Err((end, bytes)) => {
                s.end = end;
                s.torn_bytes = if matches!(end, End::Torn | End::Garbage) {
                    bytes
                } else {
                    0
                };
                if recover {
                    if let Some(next) = resync(ring, s.head, limit, &mut buf) {
                        s.gaps += 1;
                        s.gap_bytes += next.pos - s.head.pos;
                        s.head = next;
                        continue;
                    }
                }
                break;
            }
        };
        let len = match kind {
            SlotKind::Pad { len } => {
                s.pads += 1;
                len
            }
            SlotKind::Framed { len, void } => {
                if s.head.pos + len > limit {
                    // A slot that ends past the requested end is not passed over.
                    s.end = End::Limit;
                    break;
                }
                if void {
                    s.voids += 1;
                } else {
                    match format::decode_record(&buf, ring.node, ring.thread, recover) {
                        Ok(r) => {
                            s.valid += 1;
                            s.records.extend(r);
                            accepted(&buf);
                        }
                        Err(_) => {
                            s.malformed += 1;
                            s.malformed_bytes += len;
                        }
                    }
                }
                len
            }
        };
        if s.head.pos + len > limit {
            s.end = End::Limit;
            break;
        }
        s.head = RingHead {
            pos: s.head.pos + len,
            seq: s.head.seq + 1,
        };
        s.end = End::Limit;
        s.torn_bytes = 0;
    }
    s
}

/// The next slot after a hole at `from`: the first aligned position before `limit`
/// holding an intact slot with a higher number (stale slots of an earlier lap have
/// lower numbers, so they are never taken for it).
fn resync(ring: &RingRef<'_>, from: RingHead, limit: u64, buf: &mut Vec<u8>) -> Option<RingHead> {
    let mut pos = from.pos + format::ALIGN;
    // `pos` in the ring, kept without a division per position.
    let mut off = pos % ring.bytes;
    while pos < limit {
        // The slot's number alone first (bytes 8..16 of its header): a position whose
        // number the test below refuses anyway is passed with one load, not a header
        // read and parse. A recovery passes most of a ring this way (never written, or
        // inside records): a header read per position took milliseconds per ring.
        if let Some(w) = ring.mem.word(ring.off + off + 8) {
            let seq = u64::from_le(w.load(std::sync::atomic::Ordering::Acquire));
            if seq <= from.seq || seq - from.seq > (pos - from.pos) / format::ALIGN {
                pos += format::ALIGN;
                off += format::ALIGN;
                if off >= ring.bytes {
                    off -= ring.bytes;
                }
                continue;
            }
        }
        if let Ok((_, seq)) = slot_at(ring, pos, from.seq, true, buf) {
            // Every slot takes 16 bytes or more: a number further ahead than the slots
            // that fit in between is garbage.
            if seq > from.seq && seq - from.seq <= (pos - from.pos) / format::ALIGN {
                return Some(RingHead { pos, seq });
            }
        }
        pos += format::ALIGN;
        off += format::ALIGN;
        if off >= ring.bytes {
            off -= ring.bytes;
        }
    }
    None
}

/// This node's log region: its rings and their heads.
pub struct LogRegion {
    region: Region,
    desc: LogRegionDesc,
    nodes: u16,
    replication: u16,
    threads: u16,
    /// Per ring: how far its coordinator has truncated (only the truncation handler
    /// moves it; a mutex since any of the node's threads may serve it).
    heads: Vec<Mutex<RingHead>>,
}

/// Why a node's log region could not be made ([`LogRegion::create`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LogRegionSetupError {
    /// The configured ring size is not a multiple of the alignment or is too small.
    #[error(
        "node {node}: log rings of {ring_bytes} bytes (a multiple of {align}, at least {min})"
    )]
    RingSize {
        /// This node.
        node: NodeId,
        /// The configured bytes per ring.
        ring_bytes: u64,
        /// What a ring's size must be a multiple of.
        align: u64,
        /// The smallest ring.
        min: u64,
    },
    /// The region's size (rings times ring size, plus the superblock) overflows.
    #[error("node {node}: log rings of {ring_bytes} bytes overflow ({rings} rings)")]
    Overflow {
        /// This node.
        node: NodeId,
        /// Rings the region needs.
        rings: u32,
        /// The configured bytes per ring.
        ring_bytes: u64,
    },
    /// The transport refused the region.
    #[error("node {node}: cannot register the log region ({len} bytes): {source}")]
    Register {
        /// This node.
        node: NodeId,
        /// Bytes of the region.
        len: u64,
        /// The transport's error.
        #[source]
        source: TransportError,
    },
    /// The region's descriptor fails the catalog's check.
    #[error("node {node}: log ring configuration: {source}")]
    Descriptor {
        /// This node.
        node: NodeId,
        /// What the check found.
        #[source]
        source: LogRegionError,
    },
    /// The region has no room for its superblock.
    #[error("node {node}: log region too small for its superblock")]
    SuperblockTooSmall {
        /// This node.
        node: NodeId,
    },
}

impl LogRegion {
    /// Registers the log region of `transport`'s node (READ and WRITE, a fresh key)
    /// with a ring per coordinator (node, thread) that logs here, and writes its
    /// superblock.
    pub fn create(
        transport: &dyn NodeTransport,
        nodes: u16,
        replication: u16,
        cfg: &LogRingConfig,
    ) -> Result<LogRegion, LogRegionSetupError> {
        let node = transport.node();
        let threads = transport.config().threads_per_node;
        let rings = if replication > 1 {
            (nodes as u32 - 1) * threads as u32
        } else {
            0
        };
        let ring_bytes = cfg.ring_bytes;
        // Checked before registering (a region is never given back).
        let (align, min) = (
            ambidex_store::catalog::LOG_RING_ALIGN,
            ambidex_store::catalog::LOG_RING_MIN_BYTES,
        );
        if rings > 0 && (!ring_bytes.is_multiple_of(align) || ring_bytes < min) {
            return Err(LogRegionSetupError::RingSize {
                node,
                ring_bytes,
                align,
                min,
            });
        }
        let len = (rings as u64)
            .checked_mul(ring_bytes)
            .and_then(|b| b.checked_add(RING_BASE))
            .ok_or(LogRegionSetupError::Overflow {
                node,
                rings,
                ring_bytes,
            })?;
        let region = transport
            .register(len as usize, Perms::READ | Perms::WRITE)
            .map_err(|source| LogRegionSetupError::Register { node, len, source })?;
        let desc = LogRegionDesc {
            region: region.desc,
            base: RING_BASE,
            ring_bytes,
            rings,
        };
        desc.validate()
            .map_err(|source| LogRegionSetupError::Descriptor { node, source })?;
        let mut sb = Vec::with_capacity(SUPERBLOCK);
        for w in Self::superblock_of(&desc) {
            sb.extend_from_slice(&w.to_le_bytes());
        }
        if !region.mem.write(0, &sb) {
            return Err(LogRegionSetupError::SuperblockTooSmall { node });
        }
        // This node reads its rings whole only in a recovery (their writers are remote,
        // and with some policies nobody writes them): page them in now, so that the
        // recovery does not take a page fault per page of every ring (milliseconds).
        let mut off = 0;
        while off < len {
            if let Some(w) = region.mem.word(off) {
                std::hint::black_box(w.load(std::sync::atomic::Ordering::Relaxed));
            }
            off += 4096;
        }
        Ok(LogRegion {
            region,
            desc,
            nodes,
            replication,
            threads,
            heads: (0..rings).map(|_| Mutex::new(RingHead::START)).collect(),
        })
    }

    /// The superblock words a log region with descriptor `d` holds.
    pub fn superblock_of(d: &LogRegionDesc) -> [u64; 4] {
        [LOG_MAGIC, d.base, d.ring_bytes, d.rings as u64]
    }

    pub fn desc(&self) -> LogRegionDesc {
        self.desc
    }

    /// The ring of coordinator (`node`, `thread`) here, if it logs to this node.
    pub fn ring_of(&self, node: NodeId, thread: ThreadId) -> Option<u32> {
        ring_index(
            self.nodes,
            self.replication,
            self.threads,
            self.desc.region.node,
            node,
            thread,
        )
        .filter(|&i| i < self.desc.rings)
    }

    /// The coordinator (node, thread) whose ring `ring` is.
    pub fn owner_of(&self, ring: u32) -> Option<(NodeId, ThreadId)> {
        if ring >= self.desc.rings || self.threads == 0 {
            return None;
        }
        let d = ring / self.threads as u32 + 1;
        let n = self.nodes as u32;
        let node = (self.desc.region.node as u32 + n - d % n) % n;
        Some((node as NodeId, (ring % self.threads as u32) as ThreadId))
    }

    /// Threads per node (rings per coordinator node).
    pub fn threads(&self) -> u16 {
        self.threads
    }

    /// Every ring's index here.
    pub fn rings(&self) -> std::ops::Range<u32> {
        0..self.desc.rings
    }

    fn lock_head(&self, ring: u32) -> Option<std::sync::MutexGuard<'_, RingHead>> {
        let m = self.heads.get(ring as usize)?;
        Some(m.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The head of `ring`.
    pub fn head(&self, ring: u32) -> Option<RingHead> {
        self.lock_head(ring).map(|h| *h)
    }

    /// Ring `ring` of this region.
    pub fn ring(&self, ring: u32) -> Option<RingRef<'_>> {
        let (node, thread) = self.owner_of(ring)?;
        Some(RingRef {
            mem: &self.region.mem,
            off: self.desc.ring_offset(ring)?,
            bytes: self.desc.ring_bytes,
            node,
            thread,
        })
    }

    /// Recovery's view of `ring`: every valid record from its head to the last one
    /// (at most one ring, passing over holes), with what was skipped and why reading
    /// stopped. Malformed records are counted, never returned.
    pub fn scan(&self, ring: u32) -> Option<RingScan> {
        let head = self.head(ring)?;
        Some(scan_ring(&self.ring(ring)?, head, ScanMode::Recover))
    }

    /// Moves `ring`'s head to `to` (its coordinator's truncation): every slot between is
    /// checked on the way, and the head stops early at a torn or missing slot (the
    /// coordinator asks again later). Returns the scan; its `head` is the new head. A
    /// `to` behind the head changes nothing.
    pub fn truncate(&self, ring: u32, to: u64) -> Option<RingScan> {
        let epoch = self.head(ring)?.epoch();
        self.truncate_applying(ring, to, epoch, &mut |_| {})?.ok()
    }

    /// [`LogRegion::truncate`], calling `apply` with every record passed, in ring order,
    /// before the head moves past it (under the ring's head lock: one truncation of a
    /// ring at a time), if the ring was restarted in the epoch whose part is `epoch`
    /// ([`RingHead::epoch`]). A ring still holding an older epoch's records is left
    /// as it is for recovery's replay: `Err` with its head.
    pub fn truncate_applying(
        &self,
        ring: u32,
        to: u64,
        epoch: u64,
        apply: &mut dyn FnMut(&[u8]),
    ) -> Option<Result<RingScan, RingHead>> {
        let r = self.ring(ring)?;
        let mut head = self.lock_head(ring)?;
        if head.epoch() != epoch {
            return Some(Err(*head));
        }
        let s = scan_ring_with(&r, *head, ScanMode::Truncate { to }, apply);
        *head = s.head;
        Some(Ok(s))
    }

    /// Starts every ring again at [`RingHead::of_epoch`]`(epoch)`, where the writers of
    /// `epoch` begin. Recovery calls it once it replayed the rings, before the epoch's
    /// first transaction: what they held is installed at every replica of the new
    /// configuration, and a record behind the old heads (one its writer could not yet
    /// resolve) would otherwise keep every later one from being truncated.
    pub fn restart(&self, epoch: u32) {
        for ring in self.rings() {
            if let Some(mut h) = self.lock_head(ring) {
                *h = RingHead::of_epoch(epoch);
            }
        }
    }

    /// The region's memory (its owner's view; tests and recovery tools).
    pub fn memory(&self) -> &RegionMemory {
        &self.region.mem
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log_ring::writer::RingWriter;
    use ambidex_store::LockOwner;
    use ambidex_transport::{Perms, RegionDesc};

    const RING: u64 = 1024;

    fn one_ring() -> (RegionMemory, LogRegionDesc) {
        let mem = RegionMemory::anonymous((RING_BASE + RING) as usize).unwrap();
        let desc = LogRegionDesc {
            region: RegionDesc {
                node: 1,
                id: 1,
                len: RING_BASE + RING,
                key: 1,
                perms: Perms::READ | Perms::WRITE,
            },
            base: RING_BASE,
            ring_bytes: RING,
            rings: 1,
        };
        (mem, desc)
    }

    /// The one ring of [`one_ring`]'s memory, of coordinator (0, 0).
    fn ring_ref(mem: &RegionMemory) -> RingRef<'_> {
        RingRef {
            mem,
            off: RING_BASE,
            bytes: RING,
            node: 0,
            thread: 0,
        }
    }

    /// Appends a record of `txn` with `w` and lands it in `mem`; returns its end.
    fn append(mem: &RegionMemory, w: &mut RingWriter, txn: u64) -> u64 {
        let owner = LockOwner::new(0, 0, 1).unwrap();
        let mut r = Vec::new();
        format::encode_record(&mut r, 0, txn, owner, 0, &[0u8; 0]);
        let res = w.reserve(txn, r.len() as u64).unwrap();
        format::set_seq(&mut r, res.seq);
        assert!(mem.write(RING_BASE + res.pos % RING, &r));
        w.logged(txn);
        res.pos + res.len
    }

    /// A ring restarted in a new epoch (recovery replayed it) reads as empty although
    /// the old epoch's records are still in its bytes, at the very positions the new
    /// epoch's writer starts from; the new records are then read and truncated as
    /// usual. Without the epoch in the numbers, the old records would pass for new
    /// ones.
    #[test]
    fn a_ring_restarted_in_a_new_epoch_never_reads_the_old_epochs_records() {
        let (mem, desc) = one_ring();
        let r = ring_ref(&mem);
        let mut old = RingWriter::new(desc, RING_BASE);
        for txn in [1, 2, 3] {
            append(&mem, &mut old, txn);
        }
        assert_eq!(RingHead::of_epoch(1), RingHead::START);
        let head = RingHead::of_epoch(2);
        assert!(head.seq > 3 && head.pos == 0);
        let s = scan_ring(&r, head, ScanMode::Recover);
        assert_eq!((s.valid, s.gaps, s.end), (0, 0, End::Stale), "{s:?}");
        // The new epoch writes one record over the first old one.
        let mut new = RingWriter::starting_at(desc, RING_BASE, head);
        let end = append(&mem, &mut new, 7);
        let s = scan_ring(&r, head, ScanMode::Recover);
        assert_eq!(s.records.iter().map(|r| r.txn).collect::<Vec<_>>(), vec![7]);
        assert_eq!(s.end, End::Stale, "the old records after it end the log");
        new.installed(7);
        assert_eq!(new.reclaimable(), end);
        let t = scan_ring(&r, head, ScanMode::Truncate { to: end });
        assert_eq!((t.head.pos, t.valid, t.end), (end, 1, End::Limit));
        // Far epochs still order above nearer ones.
        assert!(RingHead::of_epoch(1 << 20).seq > RingHead::of_epoch((1 << 20) - 1).seq);
    }

    /// An append whose WRITE failed half-way is voided by the writer's repairs: readers
    /// skip it and read the records after it; a truncation passes it only once the
    /// repairs have landed.
    #[test]
    fn a_failed_append_is_voided_and_the_records_after_it_stay_readable() {
        let (mem, desc) = one_ring();
        let mut w = RingWriter::new(desc, RING_BASE);
        let owner = LockOwner::new(0, 0, 1).unwrap();
        let mut recs = Vec::new();
        for txn in [11, 12, 13] {
            let mut r = Vec::new();
            format::encode_record(&mut r, 0, txn, owner, 0, &[0u8; 0]);
            let res = w.reserve(txn, r.len() as u64).unwrap();
            format::set_seq(&mut r, res.seq);
            recs.push((txn, res, r));
        }
        let land = |pos: u64, b: &[u8]| assert!(mem.write(RING_BASE + pos % RING, b));
        // 11 and 13 land; only the first 16 bytes of 12 do.
        land(recs[0].1.pos, &recs[0].2);
        land(recs[1].1.pos, &recs[1].2[..16]);
        land(recs[2].1.pos, &recs[2].2);
        let r = ring_ref(&mem);
        let scan = |head| scan_ring(&r, head, ScanMode::Recover);
        let s = scan(RingHead::START);
        // Recovery passes over the torn 12 to 13.
        assert_eq!((s.valid, s.gaps, s.end), (2, 1, End::Empty), "{s:?}");
        assert_eq!(s.gap_bytes, recs[1].1.len);
        w.logged(11);
        w.failed(12, &recs[1].1);
        w.logged(13);
        w.installed(11);
        w.installed(13);
        let to = w.reclaimable();
        assert_eq!(to, recs[2].1.pos + recs[2].1.len);
        // Before the repairs land, a truncation stops at the torn record.
        let t = scan_ring(&r, RingHead::START, ScanMode::Truncate { to });
        assert_eq!((t.head.pos, t.end), (recs[1].1.pos, End::Torn));
        for r in w.take_repairs() {
            land(r.pos, r.bytes());
        }
        let s = scan(RingHead::START);
        assert_eq!(
            s.records.iter().map(|r| r.txn).collect::<Vec<_>>(),
            vec![11, 13]
        );
        assert_eq!((s.voids, s.gaps, s.end), (1, 0, End::Empty));
        let t = scan_ring(&r, RingHead::START, ScanMode::Truncate { to });
        assert_eq!(
            (t.head.pos, t.valid, t.voids, t.end),
            (to, 2, 1, End::Limit)
        );
    }
}
