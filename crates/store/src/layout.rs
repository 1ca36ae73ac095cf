//! The byte layout of a table inside its registered region, shared by the owner
//! ([`Table`](crate::Table)) and remote readers ([`crate::remote`]).
//!
//! ```text
//! region:  [superblock 64 B][main buckets B x 64 B][overflow buckets O x 64 B][items C x S]
//!
//! bucket (one 64-byte cache line, 12 slots):
//!   word 0: bits 0..30 overflow link (overflow bucket number + 1, 0 = end of chain)
//!           bit 31     writer lock (main buckets only; owner-local, never taken remotely)
//!           bits 32..63 tags of slots 0..3 (one byte each)
//!   word 1: tags of slots 4..11
//!   words 2..7: item references of slots 2w-4, 2w-3 (u32 each: item number + 1, 0 = empty)
//! ```
//!
//! **Why 12 slots in one line.** A bucket is exactly one cache line, so a local probe is
//! one miss and a remote probe one 64-byte READ (MICA and FaSST use one line with 7
//! slots of 8 bytes). We store the 8-byte key and the header in the item, not in the
//! bucket, so a slot needs only an item number (u32) and a 1-byte tag filter; that
//! fits 12 slots per line (5.3 B per slot instead of 9.1 B). This is what brings a
//! table of 8-byte keys and values under 48 B per item at 90% occupancy: an item is 32 B
//! (header, key, value, tail version) and the buckets add about 8 B per item. With 12
//! slots and 10 keys per main bucket on average at full capacity, about 21% of main
//! buckets overflow into one overflow bucket; with 8-bit tags a lookup probes a wrong
//! item with probability about 11/256.
//!
//! Tags and item references of one slot are in different words, so a reader may see a
//! slot half-updated; that is harmless because the reader always compares the key in the
//! item. A key present throughout a lookup is always found: its slot's bytes never
//! change while it is present, and overflow buckets are never unlinked or reused.
//!
//! **Items** (`S` bytes, 32 or a multiple of 64, never straddling a cache line that
//! another item uses):
//!
//! ```text
//! chunk 0: [H header][K key][data ...][V0 version]
//! chunk j: [data ...............][Vj version]      (64-byte chunks when S >= 64)
//! H = the lock word (below); its version odd = present, even = absent/free
//! Vj = version of the last completed write, or MARKER while a write is in progress
//! ```
//!
//! **The lock word** ([`Header`]): one 8-byte word, so one CPU or one NIC CAS takes the
//! lock and names its holder at once.
//!
//! ```text
//! bit 63      lock
//! bits 57..62 owner node        (6 bits: 64 nodes)
//! bits 50..56 owner thread      (7 bits: 128 threads per node)
//! bits 40..49 owner slot        (10 bits: 1023 transactions in flight per thread,
//!                                and LockOwner::STORE for the store's own short locks)
//! bits 0..39  version           (40 bits)
//! ```
//!
//! An unlocked word has owner 0, so it equals its version; a locked word is
//! `LOCK | owner | version` with the version it was locked at. The owner is the
//! coordinator's (node, thread, transaction slot): a later recovery reads it to find the
//! locks of a failed coordinator, and a holder proves ownership by the whole word. Why
//! these widths: the papers' clusters are 11 (FaSST) to 90 (FaRM) machines, but ambidex
//! targets one rack (16 nodes in DrTM+H), so 64 nodes leave headroom; 128 threads exceed
//! the cores of one machine; 1024 slots exceed the coroutines per thread (FaSST runs
//! about 20). Every owner bit taken from the version shortens its wrap period, so the
//! owner gets no more than it needs.
//!
//! **Version overflow.** A write adds 2 to the version field (an insert or delete adds
//! 1), modulo 2^40 and never carrying into the owner or lock bits ([`Header::bump`]),
//! so present/absent parity is kept. Versions grow; after 2^39 writes of one item (six
//! days at one write per microsecond, faster than one item's lock can be taken and
//! released) the field wraps. Readers only need a version not to recur *during one
//! read*, which a wrap would need 2^39 writes inside one READ to break.
//!
//! **NIC/CPU atomicity (DrTM+H §5.2).** On a real RDMA NIC, a remote CAS is atomic only
//! with other NIC atomics, not with a CPU's CAS on the same word: the NIC reads and
//! writes the word over PCIe. That problem does not arise on ambidex's backends: on
//! `local` and `shm` the "NIC" CAS *is* a CPU atomic on the same memory (the same
//! hardware instruction), and on `udp` the target's poll loop performs the CAS with a
//! CPU atomic. On a real RDMA backend local writers would have to lock through their own
//! NIC too (loopback CAS), as DrTM+H does; [`crate::table::Table`]'s CPU CAS would then
//! be wrong, and that backend would need a table mode that locks via the NIC.
//!
//! **Why a version at the end of every chunk (FaRM's per-line versions, adapted).** The
//! transport guarantees only that a READ loads each aligned word atomically, in ascending
//! order, with acquire ordering. A writer (holding H's lock) first stores MARKER into
//! every Vj, then (after a release fence) the data, then the new version into every Vj,
//! then H. A reader accepts only if H is unlocked with version v and every Vj == v:
//! (Below, "H == v" means H unlocked with version field v; chunk versions hold the version
//! field alone.)
//! - it cannot see data older than v: it loaded H == v with acquire, which the writer
//!   of v stored after that data;
//! - it cannot see data newer than v: a data word written by a later writer comes after
//!   that writer's MARKER store to the same chunk's Vj (release fence in between), and
//!   the reader loads Vj after the data word (Vj is the chunk's highest word), so by
//!   coherence it loads MARKER or a later version, never v again (versions only grow).
//!
//! On a real NIC, which reads whole cache lines atomically but in any order, the same
//! layout works: every line holds a version word and the line's data is consistent with
//! it, so equal versions in all lines mean one write. A local reader uses the cheaper
//! seqlock check (H before and after, acquire fence); it needs no chunk versions.

use ambidex_transport::RegionDesc;
use serde::{Deserialize, Serialize};

pub const LINE: u64 = 64;
/// Slots per bucket (see the module docs for why 12).
pub const SLOTS: usize = 12;
/// Lock bit of an item header; also set in [`MARKER`].
pub const LOCK: u64 = 1 << 63;
/// Stored in chunk versions while a write is in progress; never equal to a version (it
/// has bits above the version field).
pub const MARKER: u64 = u64::MAX;
/// Bits of the version field of a [`Header`].
pub const VERSION_BITS: u32 = 40;
/// The version field of a [`Header`].
pub const VERSION_MASK: u64 = (1 << VERSION_BITS) - 1;
const SLOT_BITS: u32 = 10;
const THREAD_BITS: u32 = 7;
const NODE_BITS: u32 = 6;
const SLOT_SHIFT: u32 = VERSION_BITS;
const THREAD_SHIFT: u32 = SLOT_SHIFT + SLOT_BITS;
const NODE_SHIFT: u32 = THREAD_SHIFT + THREAD_BITS;
const _: () = assert!(
    NODE_SHIFT + NODE_BITS == 63,
    "owner fields fill bits 40..62"
);

/// Who holds an item's lock: a coordinator's node, thread and transaction slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LockOwner {
    pub node: u16,
    pub thread: u16,
    pub slot: u16,
}

/// A [`LockOwner`] field does not fit its bits in the lock word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OwnerRangeError(pub LockOwner);

impl std::fmt::Display for OwnerRangeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "lock owner {:?} out of range (at most 64 nodes, 128 threads, 1023 slots)",
            self.0
        )
    }
}

impl std::error::Error for OwnerRangeError {}

impl LockOwner {
    pub const MAX_NODES: u16 = 1 << NODE_BITS;
    pub const MAX_THREADS: u16 = 1 << THREAD_BITS;
    /// Transaction slots are `0..MAX_SLOTS`; the last slot value is [`LockOwner::STORE`]'s.
    pub const MAX_SLOTS: u16 = (1 << SLOT_BITS) - 1;
    /// The owner of the store's own short locks, held only inside one
    /// [`crate::Table`] call (insert, delete, update: loads and backup applies). No
    /// transaction has this slot.
    pub const STORE: LockOwner = LockOwner {
        node: 0,
        thread: 0,
        slot: (1 << SLOT_BITS) - 1,
    };

    /// An owner, if every field fits the lock word.
    pub fn new(node: u16, thread: u16, slot: u16) -> Result<LockOwner, OwnerRangeError> {
        let o = LockOwner { node, thread, slot };
        if node < Self::MAX_NODES && thread < Self::MAX_THREADS && slot < Self::MAX_SLOTS {
            Ok(o)
        } else {
            Err(OwnerRangeError(o))
        }
    }

    /// The owner's bits in place in the lock word (fields are masked to their widths;
    /// [`LockOwner::new`] rejects values that do not fit).
    #[inline]
    pub fn bits(self) -> u64 {
        (self.node as u64 & ((1 << NODE_BITS) - 1)) << NODE_SHIFT
            | (self.thread as u64 & ((1 << THREAD_BITS) - 1)) << THREAD_SHIFT
            | (self.slot as u64 & ((1 << SLOT_BITS) - 1)) << SLOT_SHIFT
    }

    #[inline]
    fn from_bits(w: u64) -> LockOwner {
        LockOwner {
            node: ((w >> NODE_SHIFT) & ((1 << NODE_BITS) - 1)) as u16,
            thread: ((w >> THREAD_SHIFT) & ((1 << THREAD_BITS) - 1)) as u16,
            slot: ((w >> SLOT_SHIFT) & ((1 << SLOT_BITS) - 1)) as u16,
        }
    }
}

/// An item's lock word, unpacked (see the module docs for the bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// `Some` while locked.
    pub owner: Option<LockOwner>,
    /// The version field (odd: present).
    pub version: u64,
}

impl Header {
    /// The word of an unlocked item at `version` (owner cleared).
    #[inline]
    pub fn unlocked(version: u64) -> u64 {
        version & VERSION_MASK
    }

    /// The word of an item at `version` locked by `owner`.
    #[inline]
    pub fn locked(version: u64, owner: LockOwner) -> u64 {
        LOCK | owner.bits() | (version & VERSION_MASK)
    }

    /// The version field of a word.
    #[inline]
    pub fn version_of(word: u64) -> u64 {
        word & VERSION_MASK
    }

    #[inline]
    pub fn is_locked(word: u64) -> bool {
        word & LOCK != 0
    }

    /// `version + by` in the version field (wrapping within it, see the module docs).
    #[inline]
    pub fn bump(version: u64, by: u64) -> u64 {
        version.wrapping_add(by) & VERSION_MASK
    }

    pub fn pack(self) -> u64 {
        match self.owner {
            Some(o) => Self::locked(self.version, o),
            None => Self::unlocked(self.version),
        }
    }

    /// Unpacks a word. An unlocked word with owner bits set (only a misbehaving remote
    /// writes one) unpacks to its version; readers compare versions, not whole words.
    pub fn unpack(word: u64) -> Header {
        Header {
            owner: Self::is_locked(word).then(|| LockOwner::from_bits(word)),
            version: word & VERSION_MASK,
        }
    }
}
/// Bucket word 0: overflow link.
pub const LINK_MASK: u64 = (1 << 31) - 1;
/// Bucket word 0: writer lock.
pub const BUCKET_LOCK: u64 = 1 << 31;
/// Largest value size a table accepts.
pub const MAX_VALUE: usize = 8192;
/// Magic in the superblock, "AMBXTBL1".
pub const MAGIC: u64 = 0x314c_4254_5842_4d41;
/// Default average keys per main bucket at full capacity.
pub const DEFAULT_KEYS_PER_BUCKET: f64 = 10.0;

/// What a table is created with.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TableConfig {
    /// Items the table must hold (the item pool size).
    pub capacity: usize,
    /// Fixed value size in bytes (0..=8192).
    pub value_size: usize,
    /// Main buckets; `None` means `capacity / 10` (tests force tiny values for chains).
    pub buckets: Option<usize>,
    /// Overflow buckets; `None` means 25% of the main buckets plus 8.
    pub overflow: Option<usize>,
    /// Hash seed; remote readers take it from the [`TableDesc`].
    pub seed: u64,
}

impl TableConfig {
    pub fn new(capacity: usize, value_size: usize) -> TableConfig {
        TableConfig {
            capacity,
            value_size,
            buckets: None,
            overflow: None,
            seed: 0x9e37_79b9_7f4a_7c15,
        }
    }
}

/// Offsets and sizes of a table in its region. Part of the [`TableDesc`] sent to remote
/// nodes, so it is validated before use ([`TableLayout::validate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableLayout {
    pub value_size: u32,
    pub item_size: u32,
    pub buckets: u32,
    pub overflow: u32,
    pub capacity: u32,
    pub buckets_off: u64,
    pub overflow_off: u64,
    pub items_off: u64,
    pub len: u64,
    pub seed: u64,
}

/// Everything a remote node needs to read a table one-sided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableDesc {
    /// Caller-chosen id, the location cache's namespace.
    pub table_id: u32,
    pub region: RegionDesc,
    pub layout: TableLayout,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LayoutError {
    BadConfig(String),
    RegionTooSmall { need: u64, have: u64 },
}

impl std::fmt::Display for LayoutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LayoutError::BadConfig(s) => write!(f, "bad table layout: {s}"),
            LayoutError::RegionTooSmall { need, have } => {
                write!(f, "region of {have} bytes is too small, table needs {need}")
            }
        }
    }
}

impl std::error::Error for LayoutError {}

fn item_size_for(value_size: usize) -> u64 {
    let words = value_size.div_ceil(8) as u64;
    if words <= 1 {
        32
    } else if words <= 5 {
        64
    } else {
        64 * (1 + (words - 5).div_ceil(7))
    }
}

impl TableLayout {
    /// The layout for `cfg`.
    pub fn for_config(cfg: &TableConfig) -> Result<TableLayout, LayoutError> {
        let bad = |s: &str| Err(LayoutError::BadConfig(s.to_string()));
        if cfg.value_size > MAX_VALUE {
            return bad("value size above 8192 bytes");
        }
        if cfg.capacity == 0 || cfg.capacity >= u32::MAX as usize - 1 {
            return bad("capacity must be between 1 and 2^32 - 2 items");
        }
        let buckets = cfg.buckets.unwrap_or_else(|| {
            ((cfg.capacity as f64 / DEFAULT_KEYS_PER_BUCKET).ceil() as usize).max(1)
        });
        let overflow = cfg.overflow.unwrap_or(buckets / 4 + 8);
        if buckets == 0 || buckets > u32::MAX as usize || overflow >= LINK_MASK as usize {
            return bad("bucket counts out of range");
        }
        let item_size = item_size_for(cfg.value_size);
        let buckets_off = LINE;
        let overflow_off = buckets_off + buckets as u64 * LINE;
        let items_off = overflow_off + overflow as u64 * LINE;
        let len = items_off + cfg.capacity as u64 * item_size;
        Ok(TableLayout {
            value_size: cfg.value_size as u32,
            item_size: item_size as u32,
            buckets: buckets as u32,
            overflow: overflow as u32,
            capacity: cfg.capacity as u32,
            buckets_off,
            overflow_off,
            items_off,
            len,
            seed: cfg.seed,
        })
    }

    /// Checks that an (untrusted) layout is self-consistent and fits `region_len`, so
    /// every offset derived from it is in bounds.
    pub fn validate(&self, region_len: u64) -> Result<(), LayoutError> {
        let bad = |s: &str| Err(LayoutError::BadConfig(s.to_string()));
        if self.value_size as usize > MAX_VALUE
            || self.item_size as u64 != item_size_for(self.value_size as usize)
        {
            return bad("item size does not match value size");
        }
        if self.buckets == 0 || self.capacity == 0 || self.overflow as u64 >= LINK_MASK {
            return bad("empty table");
        }
        if !self.buckets_off.is_multiple_of(LINE)
            || !self.overflow_off.is_multiple_of(LINE)
            || !self.items_off.is_multiple_of(LINE)
        {
            return bad("misaligned section");
        }
        let b_end = self.buckets_off.checked_add(self.buckets as u64 * LINE);
        let o_end = self.overflow_off.checked_add(self.overflow as u64 * LINE);
        let i_end = self
            .items_off
            .checked_add(self.capacity as u64 * self.item_size as u64);
        match (b_end, o_end, i_end) {
            (Some(b), Some(o), Some(i))
                if b <= self.overflow_off && o <= self.items_off && i <= self.len => {}
            _ => return bad("sections overlap or overflow"),
        }
        if self.len > region_len {
            return Err(LayoutError::RegionTooSmall {
                need: self.len,
                have: region_len,
            });
        }
        Ok(())
    }

    #[inline]
    pub fn main_bucket_off(&self, hash: u64) -> u64 {
        let b = ((hash as u128 * self.buckets as u128) >> 64) as u64;
        self.buckets_off + b * LINE
    }

    /// Offset of overflow bucket `link` (1-based), or `None` if the link is not valid.
    #[inline]
    pub fn overflow_bucket_off(&self, link: u64) -> Option<u64> {
        if link == 0 || link > self.overflow as u64 {
            return None;
        }
        Some(self.overflow_off + (link - 1) * LINE)
    }

    /// Offset of item `r - 1` for a slot reference `r`, or `None` if empty or invalid.
    #[inline]
    pub fn item_off(&self, r: u32) -> Option<u64> {
        if r == 0 || r > self.capacity {
            return None;
        }
        Some(self.items_off + (r as u64 - 1) * self.item_size as u64)
    }

    /// The item number at `off`, if `off` is the start of an item.
    pub fn item_at(&self, off: u64) -> Option<u32> {
        let rel = off.checked_sub(self.items_off)?;
        if rel % self.item_size as u64 != 0 {
            return None;
        }
        let n = rel / self.item_size as u64;
        (n < self.capacity as u64).then_some(n as u32)
    }
}

/// Word positions inside an item, derived from the layout.
#[derive(Clone, Debug)]
pub struct ItemShape {
    /// Word index of each 8-byte data word, in value order.
    pub data: Vec<u32>,
    /// Word index of each chunk version.
    pub versions: Vec<u32>,
    pub value_size: usize,
    pub item_size: usize,
    /// One chunk: data words are contiguous from word 2.
    pub single_chunk: bool,
}

impl ItemShape {
    pub fn new(l: &TableLayout) -> ItemShape {
        let words = (l.item_size / 8) as usize;
        let chunk = words.min(8);
        let mut data = Vec::new();
        let mut versions = Vec::new();
        for w in 0..words {
            if w % chunk == chunk - 1 {
                versions.push(w as u32);
            } else if w >= 2 {
                data.push(w as u32);
            }
        }
        data.truncate((l.value_size as usize).div_ceil(8));
        let single_chunk = versions.len() == 1;
        ItemShape {
            data,
            versions,
            value_size: l.value_size as usize,
            item_size: l.item_size as usize,
            single_chunk,
        }
    }
}

/// The table's hash of a key (murmur3's finalizer: cheap, and every input bit reaches
/// the high bits used for the bucket and the low byte used for the tag).
#[inline]
pub fn hash(key: u64, seed: u64) -> u64 {
    let mut h = key ^ seed;
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h
}

#[inline]
pub fn tag_of(hash: u64) -> u8 {
    hash as u8
}

/// Bit `s` set for every slot `s` whose tag equals `tag`, from bucket words 0 and 1.
#[inline]
pub fn tag_matches(w0: u64, w1: u64, tag: u8) -> u32 {
    const LO: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    let pat = (tag as u64).wrapping_mul(0x0101_0101_0101_0101);
    // Exact zero-byte detection: 0x80 in every byte of x that is zero.
    let zero = |x: u64| !(((x & LO).wrapping_add(LO)) | x | LO);
    // Tags 0..3 are the high half of word 0; the low half (link, lock) must not match.
    let m0 = zero((w0 ^ pat) | 0x0000_0000_ffff_ffff) >> 32;
    let m1 = zero(w1 ^ pat);
    // Gather the 0x80 flag of byte i into bit i (the bytes of `x >> 7` are 0 or 1).
    let gather = |m: u64| ((m >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56) as u32;
    gather(m0) | (gather(m1) << 4)
}

/// The item reference of slot `s` from its bucket word (word `2 + s / 2`).
#[inline]
pub fn slot_ref(word: u64, s: usize) -> u32 {
    (word >> (32 * (s % 2))) as u32
}

/// Position of slot `s`'s tag: (word index, bit shift).
#[inline]
pub fn tag_pos(s: usize) -> (usize, u32) {
    if s < 4 {
        (0, 32 + 8 * s as u32)
    } else {
        (1, 8 * (s as u32 - 4))
    }
}

/// The result of checking one item image (remote) or one seqlock read (local).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItemCheck {
    /// Present, key matches, consistent: the version.
    Ok(u64),
    /// Locked or torn: retry.
    Busy,
    /// Present with another key, or absent.
    Miss,
}

/// Validates an item image read one-sided (untrusted bytes) and copies the value to
/// `out`. `img.len()` must be the layout's item size.
pub fn check_image(shape: &ItemShape, img: &[u8], key: u64, out: &mut [u8]) -> ItemCheck {
    let word = |i: u32| -> u64 {
        let s = i as usize * 8;
        match img.get(s..s + 8) {
            Some(b) => u64::from_ne_bytes(b.try_into().unwrap_or([0; 8])),
            None => MARKER,
        }
    };
    let h = word(0);
    if Header::is_locked(h) {
        return ItemCheck::Busy;
    }
    // Chunk versions hold the version field alone; an unlocked header is compared by it.
    let v = Header::version_of(h);
    if v & 1 == 0 {
        return ItemCheck::Miss;
    }
    if shape.versions.iter().any(|&c| word(c) != v) {
        return ItemCheck::Busy;
    }
    if word(1) != key {
        return ItemCheck::Miss;
    }
    copy_words_out(shape, out, word);
    ItemCheck::Ok(v)
}

/// Copies the value's data words (fetched by `get`) into `out`.
#[inline]
pub fn copy_words_out(shape: &ItemShape, out: &mut [u8], mut get: impl FnMut(u32) -> u64) {
    let n = shape.value_size.min(out.len());
    if shape.single_chunk {
        // Data words are 2, 3, ...: no index table on the common path.
        let mut chunks = out[..n].chunks_exact_mut(8);
        let mut w = 2;
        for c in &mut chunks {
            c.copy_from_slice(&get(w).to_ne_bytes());
            w += 1;
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let l = rest.len();
            rest.copy_from_slice(&get(w).to_ne_bytes()[..l]);
        }
        return;
    }
    for (i, &w) in shape.data.iter().enumerate() {
        let start = i * 8;
        if start >= n {
            break;
        }
        let b = get(w).to_ne_bytes();
        if start + 8 <= n {
            // Constant-length copy: inlined, no memmove call per word.
            out[start..start + 8].copy_from_slice(&b);
        } else {
            out[start..n].copy_from_slice(&b[..n - start]);
        }
    }
}

/// The data word `i` of a value (zero-padded at the end).
#[inline]
pub fn value_word(val: &[u8], i: usize) -> u64 {
    let start = i * 8;
    if start + 8 <= val.len() {
        u64::from_ne_bytes(val[start..start + 8].try_into().unwrap_or([0; 8]))
    } else {
        let mut b = [0u8; 8];
        if start < val.len() {
            b[..val.len() - start].copy_from_slice(&val[start..]);
        }
        u64::from_ne_bytes(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn item_sizes_and_shapes() {
        assert_eq!(item_size_for(8), 32);
        assert_eq!(item_size_for(40), 64);
        assert_eq!(item_size_for(41), 128);
        assert_eq!(item_size_for(96), 128);
        assert_eq!(item_size_for(97), 192);
        let l = TableLayout::for_config(&TableConfig::new(10, 200)).unwrap();
        let s = ItemShape::new(&l);
        assert_eq!(s.data.len(), 25);
        assert_eq!(s.versions, vec![7, 15, 23, 31]);
        assert!(!s.data.iter().any(|d| s.versions.contains(d) || *d < 2));
        let l8 = TableLayout::for_config(&TableConfig::new(10, 8)).unwrap();
        let s8 = ItemShape::new(&l8);
        assert_eq!((s8.data.clone(), s8.versions.clone()), (vec![2], vec![3]));
        l.validate(l.len).unwrap();
        assert!(l.validate(l.len - 1).is_err());
    }

    #[test]
    fn lock_words_pack_and_unpack() {
        let o = LockOwner::new(63, 127, 1022).unwrap();
        for v in [1, 2, 77, VERSION_MASK] {
            let w = Header::locked(v, o);
            assert_eq!(
                Header::unpack(w),
                Header {
                    owner: Some(o),
                    version: v
                }
            );
            assert_eq!(Header::unpack(w).pack(), w);
            assert_eq!(
                Header::unpack(Header::unlocked(v)),
                Header {
                    owner: None,
                    version: v
                }
            );
            assert_ne!(w, MARKER);
            assert_ne!(Header::unlocked(v), MARKER);
        }
        let o0 = LockOwner::new(0, 0, 0).unwrap();
        assert_ne!(Header::locked(5, o0), Header::unlocked(5));
        assert!(LockOwner::new(64, 0, 0).is_err());
        assert!(LockOwner::new(0, 128, 0).is_err());
        assert!(LockOwner::new(0, 0, 1023).is_err(), "the store's own slot");
        // Distinct owners give distinct words.
        let a = LockOwner::new(1, 2, 3).unwrap();
        let b = LockOwner::new(3, 2, 1).unwrap();
        assert_ne!(Header::locked(9, a), Header::locked(9, b));
    }

    #[test]
    fn version_overflow_stays_in_its_field_and_keeps_parity() {
        let top = VERSION_MASK; // odd: present
        assert_eq!(Header::bump(top, 2), 1);
        assert_eq!(Header::bump(top - 1, 2), 0);
        assert_eq!(Header::bump(top, 1), 0);
        let o = LockOwner::new(5, 6, 7).unwrap();
        let w = Header::locked(Header::bump(top, 2), o);
        assert_eq!(
            Header::unpack(w).owner,
            Some(o),
            "a bump never carries into the owner"
        );
    }

    #[test]
    fn tag_matching_is_exact() {
        let mut w0 = 0x1234u64; // link bits must not match
        let mut w1 = 0u64;
        let tags = [7u8, 0, 7, 255, 1, 7, 7, 0, 128, 127, 7, 6];
        for (s, &t) in tags.iter().enumerate() {
            let (w, sh) = tag_pos(s);
            if w == 0 {
                w0 |= (t as u64) << sh;
            } else {
                w1 |= (t as u64) << sh;
            }
        }
        for probe in [0u8, 7, 255, 128, 127, 6, 1, 3] {
            let want: u32 = tags
                .iter()
                .enumerate()
                .filter(|(_, &t)| t == probe)
                .map(|(s, _)| 1 << s)
                .sum();
            assert_eq!(tag_matches(w0, w1, probe), want, "tag {probe}");
        }
    }
}
