//! Receive queues in memory: one receive block per endpoint, holding one single-producer
//! byte ring per sending endpoint (FaRM §2's messaging rings) plus a shared header with
//! the queue's occupancy, its event count and its counters.
//!
//! The same layout serves the `local` backend (anonymous memory) and the `shm` backend
//! (a shared file mapped by every process of the host). A ring has exactly one writer, so
//! a sender killed in the middle of a send leaves at most an unpublished record in its
//! own ring: nothing another sender wrote is affected. Because the block may be shared
//! with other processes, the consumer validates every header word it reads and treats an
//! impossible value as a corrupt ring (counted, skipped), never as a reason to panic.
//!
//! A record is `[len: u32][epoch: u32][payload][padding to 8]`; `len == WRAP` tells the
//! consumer to continue at the start of the buffer.

use crate::counters::{Counter, Counters};
use crate::region::Mapping;
use crate::wait::EventCount;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const RX_MAGIC: u64 = 0x616d_6278_7278_0001; // "ambxrx" v1
const WRAP: u32 = u32::MAX;
const REC_HDR: usize = 8;
/// Largest tail a producer resumes from; keeps position arithmetic far from overflow.
const MAX_POS: u64 = (1 << 62) - 1;

/// Header of a receive block. `#[repr(C)]`, all-zero is valid, lives in shared memory.
#[repr(C, align(64))]
pub struct RxHeader {
    magic: AtomicU64,
    cluster_id: AtomicU64,
    senders: AtomicU64,
    ring_bytes: AtomicU64,
    _pad0: [u8; 32],
    /// The receiver parks on it; senders wake it (see `wait`).
    pub event: EventCount,
    _pad1: [u8; 56],
    /// Datagrams published and not yet consumed, over all rings (the receive-queue
    /// occupancy that `recv_depth` bounds).
    pub queued: AtomicU64,
    _pad2: [u8; 56],
    /// The receiving endpoint's counters; senders add the drops they cause.
    pub counters: Counters,
}

#[repr(C, align(64))]
struct RingCtl {
    tail: AtomicU64,
    _pad0: [u8; 56],
    head: AtomicU64,
    _pad1: [u8; 56],
}

fn round8(n: usize) -> usize {
    (n + 7) & !7
}

fn header_len() -> usize {
    round8(std::mem::size_of::<RxHeader>()).next_multiple_of(64)
}

/// Bytes of ring per sender: at least `min(depth, 64)` full-MTU records, a power of two.
pub fn ring_bytes_for(mtu: usize, recv_depth: usize) -> usize {
    let want = recv_depth.clamp(4, 64) * (REC_HDR + round8(mtu));
    want.next_power_of_two()
}

/// Why [`RxBlock::attach`] refused a mapping: its header does not describe a receive block
/// of this cluster with the expected layout.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RxBlockError {
    /// The mapping is shorter than a receive block's header.
    #[error("receive block smaller than its header ({len} bytes, header needs {header})")]
    TooSmall {
        /// Bytes mapped.
        len: usize,
        /// Bytes of the header.
        header: usize,
    },
    /// The header's magic word is not the receive-block magic: never formatted, or
    /// overwritten.
    #[error("receive block not initialised (bad magic {found:#x})")]
    BadMagic {
        /// The magic word found.
        found: u64,
    },
    /// The block was formatted for another cluster id.
    #[error("receive block belongs to another cluster (cluster id {found}, expected {expected})")]
    OtherCluster {
        /// The cluster id in the header.
        found: u64,
        /// This process's cluster id.
        expected: u64,
    },
    /// The header's sender count or ring size differs from this configuration's, or the
    /// mapping is too short for that layout.
    #[error(
        "receive block layout does not match the cluster configuration \
         ({senders} senders of {ring_bytes} ring bytes in {len} mapped bytes; \
         expected {expected_senders} senders of {expected_ring_bytes} bytes in {need})"
    )]
    LayoutMismatch {
        /// Senders recorded in the header.
        senders: u64,
        /// Ring bytes per sender recorded in the header.
        ring_bytes: u64,
        /// Bytes mapped.
        len: usize,
        /// Senders this configuration expects.
        expected_senders: usize,
        /// Ring bytes per sender this configuration expects.
        expected_ring_bytes: usize,
        /// Bytes the expected layout needs.
        need: usize,
    },
}

/// A receive block mapped in this process.
#[derive(Clone)]
pub struct RxBlock {
    map: Arc<Mapping>,
    senders: usize,
    ring_bytes: usize,
}

impl RxBlock {
    /// Total bytes of a block for `senders` rings of `ring_bytes` each.
    pub fn layout_len(senders: usize, ring_bytes: usize) -> usize {
        header_len() + senders * (std::mem::size_of::<RingCtl>() + ring_bytes)
    }

    /// Formats a fresh (zeroed) mapping as a receive block.
    pub fn init(map: Arc<Mapping>, cluster_id: u64, senders: usize, ring_bytes: usize) -> RxBlock {
        assert!(ring_bytes.is_power_of_two() && map.len() >= Self::layout_len(senders, ring_bytes));
        let b = RxBlock {
            map,
            senders,
            ring_bytes,
        };
        let h = b.header();
        h.cluster_id.store(cluster_id, Ordering::Relaxed);
        h.senders.store(senders as u64, Ordering::Relaxed);
        h.ring_bytes.store(ring_bytes as u64, Ordering::Relaxed);
        h.magic.store(RX_MAGIC, Ordering::Release);
        b
    }

    /// Attaches to a block formatted by someone else, checking that its header agrees with
    /// what this process expects and fits the mapping.
    pub fn attach(
        map: Arc<Mapping>,
        cluster_id: u64,
        senders: usize,
        ring_bytes: usize,
    ) -> Result<RxBlock, RxBlockError> {
        if map.len() < header_len() {
            return Err(RxBlockError::TooSmall {
                len: map.len(),
                header: header_len(),
            });
        }
        let b = RxBlock {
            map,
            senders,
            ring_bytes,
        };
        let h = b.header();
        let magic = h.magic.load(Ordering::Acquire);
        if magic != RX_MAGIC {
            return Err(RxBlockError::BadMagic { found: magic });
        }
        let found_cluster = h.cluster_id.load(Ordering::Relaxed);
        if found_cluster != cluster_id {
            return Err(RxBlockError::OtherCluster {
                found: found_cluster,
                expected: cluster_id,
            });
        }
        let (found_senders, found_ring_bytes) = (
            h.senders.load(Ordering::Relaxed),
            h.ring_bytes.load(Ordering::Relaxed),
        );
        let need = Self::layout_len(senders, ring_bytes);
        if found_senders != senders as u64
            || found_ring_bytes != ring_bytes as u64
            || b.map.len() < need
        {
            return Err(RxBlockError::LayoutMismatch {
                senders: found_senders,
                ring_bytes: found_ring_bytes,
                len: b.map.len(),
                expected_senders: senders,
                expected_ring_bytes: ring_bytes,
                need,
            });
        }
        Ok(b)
    }

    pub fn header(&self) -> &RxHeader {
        // SAFETY: the mapping is at least header_len() bytes, page aligned, and RxHeader
        // is valid for any bit pattern (atomics and padding).
        unsafe { &*(self.map.as_ptr() as *const RxHeader) }
    }

    fn ring_base(&self, sender: usize) -> *mut u8 {
        debug_assert!(sender < self.senders);
        // SAFETY: within layout_len, checked at init/attach.
        unsafe {
            self.map
                .as_ptr()
                .add(header_len() + sender * (std::mem::size_of::<RingCtl>() + self.ring_bytes))
        }
    }

    fn ctl(&self, sender: usize) -> &RingCtl {
        // SAFETY: see ring_base; RingCtl is atomics and padding.
        unsafe { &*(self.ring_base(sender) as *const RingCtl) }
    }

    fn data(&self, sender: usize) -> *mut u8 {
        // SAFETY: the data area follows the control block.
        unsafe { self.ring_base(sender).add(std::mem::size_of::<RingCtl>()) }
    }

    pub fn senders(&self) -> usize {
        self.senders
    }
}

/// The writing side of one ring (one sender to one receiver).
pub struct RingProducer {
    block: RxBlock,
    sender: usize,
    tail: u64,
    head_cache: u64,
    published: u64,
}

impl RingProducer {
    pub fn new(block: RxBlock, sender: usize) -> RingProducer {
        // Resume from the shared tail so a restarted sender continues where it stopped.
        let mut tail = block.ctl(sender).tail.load(Ordering::Acquire);
        let head = block.ctl(sender).head.load(Ordering::Acquire);
        // Only a rogue writer can leave a misaligned or absurd tail: continue from an
        // aligned, small one, rounding up so as not to fall behind the consumer's head
        // (the consumer counts the jump as corruption and resyncs).
        if !tail.is_multiple_of(8) || tail > MAX_POS {
            tail = ((tail & MAX_POS) + 7) & !7;
        }
        RingProducer {
            block,
            sender,
            tail,
            head_cache: head,
            published: tail,
        }
    }

    pub fn header(&self) -> &RxHeader {
        self.block.header()
    }

    /// Writes one record (not yet visible). Returns false if the ring is full.
    #[inline]
    pub fn push(&mut self, epoch: u32, payload: &[u8]) -> bool {
        let cap = self.block.ring_bytes as u64;
        let rec = (REC_HDR + round8(payload.len())) as u64;
        let pos = self.tail & (cap - 1);
        let contiguous = cap - pos;
        let need = if rec <= contiguous {
            rec
        } else {
            contiguous + rec
        };
        // Wrapping: head_cache comes from shared memory and may be garbage.
        let used = self.tail.wrapping_sub(self.head_cache);
        if used > cap || need > cap - used {
            let head = self.block.ctl(self.sender).head.load(Ordering::Acquire);
            // A head beyond our tail or too far behind can only come from corruption;
            // treat the ring as full rather than overwrite unread data.
            if head > self.tail || self.tail - head > cap {
                return false;
            }
            self.head_cache = head;
            if need > cap - (self.tail - head) {
                return false;
            }
        }
        let data = self.block.data(self.sender);
        let mut pos = pos as usize;
        if rec > contiguous {
            // SAFETY: pos is 8-aligned and < cap, so 8 bytes fit.
            unsafe { (data.add(pos) as *mut u32).write(WRAP) };
            self.tail += contiguous;
            pos = 0;
        }
        // SAFETY: rec bytes fit at pos (checked above); the consumer does not read them
        // before the release store of tail in publish().
        unsafe {
            let p = data.add(pos);
            prefetch_for_write(p, rec as usize);
            (p as *mut u32).write(payload.len() as u32);
            (p.add(4) as *mut u32).write(epoch);
            std::ptr::copy_nonoverlapping(payload.as_ptr(), p.add(REC_HDR), payload.len());
        }
        self.tail += rec;
        true
    }

    /// Makes every pushed record visible to the receiver (the doorbell). Returns whether
    /// anything new was published.
    #[inline]
    pub fn publish(&mut self) -> bool {
        if self.tail == self.published {
            return false;
        }
        self.block
            .ctl(self.sender)
            .tail
            .store(self.tail, Ordering::Release);
        self.published = self.tail;
        true
    }
}

/// Asks for write ownership of every cache line of `[p, p + len)` at once. The lines of a
/// ring were last read by the receiver's core; without this a large record's copy takes
/// their ownership transfers one after another.
#[inline(always)]
fn prefetch_for_write(p: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if len > 128 {
        let mut off = 0;
        while off < len {
            // SAFETY: prefetchw has no architectural effect; the range is the record's.
            unsafe {
                std::arch::asm!("prefetchw [{0}]", in(reg) p.add(off), options(nostack, preserves_flags, readonly));
            }
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}

/// The reading side of a receive block: consumes every sender's ring.
pub struct RxConsumer {
    block: RxBlock,
    heads: Vec<u64>,
    next: usize,
    mtu: usize,
}

impl RxConsumer {
    pub fn new(block: RxBlock, mtu: usize) -> RxConsumer {
        let heads = (0..block.senders)
            .map(|s| block.ctl(s).head.load(Ordering::Acquire))
            .collect();
        RxConsumer {
            block,
            heads,
            next: 0,
            mtu,
        }
    }

    pub fn header(&self) -> &RxHeader {
        self.block.header()
    }

    /// True if some ring may hold unread records.
    pub fn has_pending(&self) -> bool {
        (0..self.block.senders)
            .any(|s| self.block.ctl(s).tail.load(Ordering::SeqCst) != self.heads[s])
    }

    /// Delivers up to `max` records as (sender index, epoch, payload). Validates every
    /// header; a corrupt ring is skipped to its tail and counted.
    pub fn poll(&mut self, max: usize, sink: &mut dyn FnMut(usize, u32, &[u8])) -> usize {
        let senders = self.block.senders;
        let cap = self.block.ring_bytes as u64;
        let counters = &self.block.header().counters;
        let mut delivered = 0;
        for i in 0..senders {
            let s = (self.next + i) % senders;
            if delivered >= max {
                break;
            }
            let ctl = self.block.ctl(s);
            let tail = ctl.tail.load(Ordering::Acquire);
            let mut head = self.heads[s];
            if tail == head {
                continue;
            }
            if tail < head || tail - head > cap {
                counters.add(Counter::RxDroppedCorruptRing, 1);
                self.heads[s] = tail;
                ctl.head.store(tail, Ordering::Release);
                continue;
            }
            let data = self.block.data(s);
            let mut n = 0;
            while head < tail && delivered < max {
                let pos = (head & (cap - 1)) as usize;
                // Heads and tails are shared words: a misaligned one is corruption (and
                // would make the header read below misaligned).
                if !pos.is_multiple_of(8) {
                    counters.add(Counter::RxDroppedCorruptRing, 1);
                    head = tail;
                    break;
                }
                // SAFETY: pos is 8-aligned (checked) and < cap.
                let len = unsafe { (data.add(pos) as *const u32).read_volatile() };
                // Compared against tail - head (not head + x > tail) so that no garbage
                // value can overflow.
                if len == WRAP {
                    let skip = cap - pos as u64;
                    if skip > tail - head {
                        counters.add(Counter::RxDroppedCorruptRing, 1);
                        head = tail;
                        break;
                    }
                    head += skip;
                    continue;
                }
                let rec = (REC_HDR + round8(len as usize)) as u64;
                if len as usize > self.mtu || pos as u64 + rec > cap || rec > tail - head {
                    counters.add(Counter::RxDroppedCorruptRing, 1);
                    head = tail;
                    break;
                }
                // SAFETY: the record lies inside the buffer (checked above).
                let epoch = unsafe { (data.add(pos + 4) as *const u32).read_volatile() };
                let payload =
                    unsafe { std::slice::from_raw_parts(data.add(pos + REC_HDR), len as usize) };
                sink(s, epoch, payload);
                head += rec;
                n += 1;
                delivered += 1;
            }
            self.heads[s] = head;
            ctl.head.store(head, Ordering::Release);
            if n > 0 {
                let q = &self.block.header().queued;
                // Saturating: a sender killed between reserving and publishing could
                // otherwise leave the count skewed.
                let _ = q.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |v| {
                    Some(v.saturating_sub(n))
                });
            }
        }
        self.next = (self.next + 1) % senders.max(1);
        delivered
    }
}

/// Reserves room for `n` datagrams in a receive queue of `depth`; returns how many fit.
/// The rest must be counted as dropped by the caller.
#[inline]
pub fn reserve(header: &RxHeader, depth: usize, n: u64) -> u64 {
    let prev = header.queued.fetch_add(n, Ordering::AcqRel);
    let room = (depth as u64).saturating_sub(prev);
    let granted = room.min(n);
    if granted < n {
        header.queued.fetch_sub(n - granted, Ordering::AcqRel);
    }
    granted
}

/// Returns unused reservations (records that did not fit in the ring).
#[inline]
pub fn unreserve(header: &RxHeader, n: u64) {
    if n > 0 {
        let _ = header
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(n))
            });
    }
}
