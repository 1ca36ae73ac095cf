//! The owner's side of a hash table: every thread of the node uses it at once.
//!
//! - Lookups take no lock: a seqlock read of the item (header before and after, acquire
//!   fence), retried if the header changed.
//! - Updates hold the item's lock, taken with a compare-and-swap that installs the lock
//!   bit and the owner on the header word ([`Header`]), the same word a remote node
//!   locks with a one-sided CAS, so local and remote lockers exclude each other (see
//!   [`crate::layout`] on why a CPU CAS and a NIC CAS are atomic with each other here).
//! - Inserts and deletes hold the main bucket's writer lock (an owner-local bit in bucket
//!   word 0); remote nodes never change buckets (inserts and deletes go to the owner by
//!   RPC, as in FaSST and DrTM+H).
//!
//! Memory written by remote nodes is untrusted: every item reference and overflow link
//! read from the region is range-checked, and chain walks are bounded.

use crate::layout::*;
use crate::lock_journal::LockJournal;
use ambidex_transport::{Region, RegionDesc, RegionMemory, TransportError};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Why a table operation failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreError {
    /// The key is already present (insert).
    Exists,
    /// The key is absent (update, delete, lock).
    NotFound,
    /// The item pool or the overflow buckets are exhausted.
    Full,
    /// The value is not the table's value size.
    BadValueLen {
        got: usize,
        want: usize,
    },
    /// The item is locked (try_* operations) or changed since it was read.
    Locked,
    Layout(LayoutError),
    Transport(TransportError),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Exists => write!(f, "key exists"),
            StoreError::NotFound => write!(f, "key not found"),
            StoreError::Full => write!(f, "table full"),
            StoreError::BadValueLen { got, want } => {
                write!(f, "value of {got} bytes, table stores {want}")
            }
            StoreError::Locked => write!(f, "item locked or changed"),
            StoreError::Layout(e) => write!(f, "{e}"),
            StoreError::Transport(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for StoreError {}

/// Result of a non-blocking read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadOutcome {
    Found { version: u64 },
    NotFound,
    Locked,
}

/// An item locked through [`Table::lock`]: write it with [`Table::write_locked`] and
/// release it with [`Table::unlock`]. The header holds exactly
/// `Header::locked(version, owner)` while it is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemLock {
    /// Offset of the item in the region.
    pub offset: u64,
    /// The version that was locked (the version field, see [`Header`]).
    pub version: u64,
    pub owner: LockOwner,
}

/// What [`Table::release_if`] found at an item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Release {
    /// Not held by a transaction (any more).
    Free,
    /// Held by a transaction the caller keeps.
    Kept,
    Released,
}

/// A MICA-style hash table inside one registered region (see [`crate::layout`]).
pub struct Table {
    mem: RegionMemory,
    base: *const u8,
    desc: TableDesc,
    shape: ItemShape,
    next_item: AtomicU32,
    free_items: Mutex<Vec<u32>>,
    next_overflow: AtomicU32,
    count: AtomicUsize,
    /// Versioned applies refused because the table had no room (see
    /// [`Table::full_refusals`]).
    full_refusals: AtomicU64,
    /// The items this node's CPU locked for transactions (for recovery).
    journal: LockJournal,
}

// SAFETY: `base` points into `mem`, which is kept alive by `self`; all access is atomic.
unsafe impl Send for Table {}
unsafe impl Sync for Table {}

enum Locate {
    /// `h` is the version field.
    Found {
        off: u64,
        h: u64,
    },
    NotFound,
    /// Present (key matches) and locked.
    Locked {
        off: u64,
    },
}

impl Table {
    /// Bytes of region a table created with `cfg` needs.
    pub fn required_len(cfg: &TableConfig) -> Result<usize, StoreError> {
        Ok(TableLayout::for_config(cfg)
            .map_err(StoreError::Layout)?
            .len as usize)
    }

    /// Builds a table in zeroed registered memory; `region.desc` is what remote nodes get
    /// through [`Table::desc`]. The region may be larger than needed.
    pub fn create(region: Region, table_id: u32, cfg: &TableConfig) -> Result<Table, StoreError> {
        let layout = TableLayout::for_config(cfg).map_err(StoreError::Layout)?;
        layout
            .validate(region.mem.len() as u64)
            .map_err(StoreError::Layout)?;
        if !(region.mem.as_ptr() as usize).is_multiple_of(LINE as usize) {
            return Err(StoreError::Layout(LayoutError::BadConfig(
                "region not cache-line aligned".into(),
            )));
        }
        let mem = region.mem.clone();
        advise_huge_pages(&mem, layout.len as usize);
        // Superblock: lets a reader of raw memory recognise the table.
        for (i, w) in [MAGIC, table_id as u64, layout.len, layout.capacity as u64]
            .into_iter()
            .enumerate()
        {
            if let Some(a) = mem.word(8 * i as u64) {
                a.store(w, Ordering::Release);
            }
        }
        Ok(Table {
            base: mem.as_ptr(),
            mem,
            desc: TableDesc {
                table_id,
                region: region.desc,
                layout,
            },
            shape: ItemShape::new(&layout),
            next_item: AtomicU32::new(0),
            free_items: Mutex::new(Vec::new()),
            next_overflow: AtomicU32::new(0),
            count: AtomicUsize::new(0),
            full_refusals: AtomicU64::new(0),
            journal: LockJournal::default(),
        })
    }

    /// Builds a table in a region registered on `node` for READ, WRITE and atomics, so
    /// other nodes can reach it one-sided through [`Table::desc`].
    pub fn create_registered(
        node: &dyn ambidex_transport::NodeTransport,
        table_id: u32,
        cfg: &TableConfig,
    ) -> Result<Table, StoreError> {
        let len = Self::required_len(cfg)?;
        let region = node
            .register(len, ambidex_transport::Perms::ALL)
            .map_err(StoreError::Transport)?;
        Self::create(region, table_id, cfg)
    }

    /// A table in fresh anonymous memory (not registered: for local use and benchmarks).
    pub fn create_anonymous(table_id: u32, cfg: &TableConfig) -> Result<Table, StoreError> {
        let len = Self::required_len(cfg)?;
        let mem = RegionMemory::anonymous(len).map_err(StoreError::Transport)?;
        let desc = RegionDesc {
            node: 0,
            id: u32::MAX,
            len: len as u64,
            key: 0,
            perms: ambidex_transport::Perms::NONE,
        };
        Self::create(Region { desc, mem }, table_id, cfg)
    }

    /// What remote nodes need to read this table one-sided.
    pub fn desc(&self) -> TableDesc {
        self.desc
    }

    pub fn layout(&self) -> &TableLayout {
        &self.desc.layout
    }

    pub fn memory(&self) -> &RegionMemory {
        &self.mem
    }

    /// Bytes of registered memory the table occupies.
    pub fn region_bytes(&self) -> usize {
        self.desc.layout.len as usize
    }

    pub fn value_size(&self) -> usize {
        self.shape.value_size
    }

    pub fn capacity(&self) -> usize {
        self.desc.layout.capacity as usize
    }

    /// Items present.
    pub fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Versioned applies ([`Table::apply_versioned`]: a backup's, a copy's or a
    /// recovery's write of committed data) refused so far because the table had no
    /// room: data a node was asked to store and could not, which a run must report
    /// rather than lose quietly. (A transaction's insert refused at its primary is an
    /// abort, not counted here.)
    pub fn full_refusals(&self) -> u64 {
        self.full_refusals.load(Ordering::Relaxed)
    }

    /// Overflow buckets linked so far.
    pub fn overflow_used(&self) -> usize {
        (self.next_overflow.load(Ordering::Relaxed) as usize).min(self.layout().overflow as usize)
    }

    #[inline]
    fn w(&self, off: u64) -> &AtomicU64 {
        debug_assert!(off.is_multiple_of(8) && off + 8 <= self.desc.layout.len);
        // SAFETY: every offset passed here is derived from the validated layout (bucket
        // and item offsets are range-checked before use), so it is aligned and in bounds.
        unsafe { &*(self.base.add(off as usize) as *const AtomicU64) }
    }

    #[inline]
    fn hdr(&self, item: u64) -> &AtomicU64 {
        self.w(item)
    }

    fn check_value(&self, val: &[u8]) -> Result<(), StoreError> {
        if val.len() != self.shape.value_size {
            return Err(StoreError::BadValueLen {
                got: val.len(),
                want: self.shape.value_size,
            });
        }
        Ok(())
    }

    /// Seqlock read of the item at `off`: copies the value if `out` is given.
    #[inline]
    fn read_item(&self, off: u64, key: u64, out: Option<&mut [u8]>) -> (ItemCheck, u64) {
        let mut out = out;
        loop {
            let h1 = self.hdr(off).load(Ordering::Acquire);
            if Header::is_locked(h1) {
                return (ItemCheck::Busy, h1);
            }
            if Header::version_of(h1) & 1 == 0 {
                return (ItemCheck::Miss, h1);
            }
            let k = self.w(off + 8).load(Ordering::Relaxed);
            if k == key {
                if let Some(o) = out.as_deref_mut() {
                    copy_words_out(&self.shape, o, |i| {
                        self.w(off + 8 * i as u64).load(Ordering::Relaxed)
                    });
                }
            }
            fence(Ordering::Acquire);
            if self.hdr(off).load(Ordering::Relaxed) == h1 {
                let r = if k == key {
                    ItemCheck::Ok(Header::version_of(h1))
                } else {
                    ItemCheck::Miss
                };
                return (r, h1);
            }
            std::hint::spin_loop();
        }
    }

    /// Finds `key`'s item without locking; copies the value if asked.
    fn locate(&self, key: u64, mut out: Option<&mut [u8]>) -> Locate {
        let l = &self.desc.layout;
        let h = hash(key, l.seed);
        let tag = tag_of(h);
        let mut b = l.main_bucket_off(h);
        let mut hops = 0u32;
        loop {
            let w0 = self.w(b).load(Ordering::Acquire);
            let w1 = self.w(b + 8).load(Ordering::Acquire);
            let mut m = tag_matches(w0, w1, tag);
            while m != 0 {
                let s = m.trailing_zeros() as usize;
                m &= m - 1;
                let r = slot_ref(
                    self.w(b + 16 + 8 * (s as u64 / 2)).load(Ordering::Acquire),
                    s,
                );
                let Some(off) = l.item_off(r) else { continue };
                match self.read_item(off, key, out.as_deref_mut()) {
                    (ItemCheck::Ok(h), _) => return Locate::Found { off, h },
                    (ItemCheck::Busy, h) => {
                        // Locked: it is ours only if the key matches (stable while locked).
                        if self.w(off + 8).load(Ordering::Acquire) == key
                            && Header::version_of(h) & 1 == 1
                        {
                            return Locate::Locked { off };
                        }
                    }
                    (ItemCheck::Miss, _) => {}
                }
            }
            match l.overflow_bucket_off(w0 & LINK_MASK) {
                Some(next) if hops <= l.overflow => {
                    b = next;
                    hops += 1;
                }
                _ => return Locate::NotFound,
            }
        }
    }

    /// Reads `key` into `out` (at least `value_size` bytes) without blocking.
    pub fn try_get(&self, key: u64, out: &mut [u8]) -> ReadOutcome {
        match self.locate(key, Some(out)) {
            Locate::Found { h, .. } => ReadOutcome::Found { version: h },
            Locate::NotFound => ReadOutcome::NotFound,
            Locate::Locked { .. } => ReadOutcome::Locked,
        }
    }

    /// Like [`Table::try_get`], also giving the item's offset (0 if not found): what the
    /// location cache and a later one-sided lock or header READ need.
    pub fn try_get_located(&self, key: u64, out: &mut [u8]) -> (ReadOutcome, u64) {
        match self.locate(key, Some(out)) {
            Locate::Found { h, off } => (ReadOutcome::Found { version: h }, off),
            Locate::NotFound => (ReadOutcome::NotFound, 0),
            Locate::Locked { off } => (ReadOutcome::Locked, off),
        }
    }

    /// Reads `key` into `out`, waiting while its item is locked; returns the version.
    pub fn get(&self, key: u64, out: &mut [u8]) -> Option<u64> {
        let mut spins = 0u32;
        loop {
            match self.try_get(key, out) {
                ReadOutcome::Found { version } => return Some(version),
                ReadOutcome::NotFound => return None,
                ReadOutcome::Locked => backoff(&mut spins),
            }
        }
    }

    /// The offset and version of `key`'s item (what the location cache stores), as the
    /// lock `owner` would take it.
    #[inline]
    fn locate_for(&self, key: u64, owner: LockOwner) -> Result<ItemLock, StoreError> {
        match self.locate(key, None) {
            Locate::Found { off, h } => Ok(ItemLock {
                offset: off,
                version: h,
                owner,
            }),
            Locate::NotFound => Err(StoreError::NotFound),
            Locate::Locked { .. } => Err(StoreError::Locked),
        }
    }

    /// The offset and version of `key`'s item (what the location cache stores).
    pub fn locate_item(&self, key: u64) -> Result<(u64, u64), StoreError> {
        self.locate_for(key, LockOwner::STORE)
            .map(|lk| (lk.offset, lk.version))
    }

    /// Locks `key`'s item for `owner` with a CAS on its header (the word remote nodes
    /// CAS too). Fails with `Locked` if someone holds it.
    #[inline]
    pub fn try_lock(&self, key: u64, owner: LockOwner) -> Result<ItemLock, StoreError> {
        let lk = self.locate_for(key, owner)?;
        self.try_lock_at(lk.offset, lk.version, owner)?;
        Ok(lk)
    }

    /// Locks the item at `offset` for `owner` if it is unlocked at `version`.
    #[inline]
    pub fn try_lock_at(
        &self,
        offset: u64,
        version: u64,
        owner: LockOwner,
    ) -> Result<(), StoreError> {
        let l = &self.desc.layout;
        if l.item_at(offset).is_none() || version & !VERSION_MASK != 0 || version & 1 != 1 {
            return Err(StoreError::NotFound);
        }
        self.hdr(offset)
            .compare_exchange(
                Header::unlocked(version),
                Header::locked(version, owner),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .map_err(|_| StoreError::Locked)?;
        if owner != LockOwner::STORE {
            self.journal.note(offset, |o| self.txn_locked(o));
        }
        Ok(())
    }

    /// Whether the item at `off` (an offset noted by the journal: a valid item) is
    /// locked by a transaction.
    fn txn_locked(&self, off: u64) -> bool {
        Header::unpack(self.hdr(off).load(Ordering::Acquire))
            .owner
            .is_some_and(|o| o != LockOwner::STORE)
    }

    /// Locks `key`'s item for `owner` and copies its value out under the lock (the
    /// transaction layer's "read and lock in one round trip", FaSST §5 step 1).
    pub fn try_lock_read(
        &self,
        key: u64,
        owner: LockOwner,
        out: &mut [u8],
    ) -> Result<ItemLock, StoreError> {
        let lk = self.try_lock(key, owner)?;
        if let Err(e) = self.read_locked(&lk, out) {
            self.unlock(lk, false);
            return Err(e);
        }
        Ok(lk)
    }

    /// Inserts `key` with `val` and locks it for `owner`. `Locked` if another thread
    /// locked the new item first (the item stays, unlocked, with `val`).
    pub fn insert_and_lock(
        &self,
        key: u64,
        val: &[u8],
        owner: LockOwner,
    ) -> Result<ItemLock, StoreError> {
        self.insert(key, val)?;
        self.try_lock(key, owner)
    }

    /// True if `lk` names an item that holds `key` and is locked by `lk.owner` at
    /// `lk.version`: checks a lock token that came back over the network before acting
    /// on it.
    pub fn holds_lock(&self, lk: &ItemLock, key: u64) -> bool {
        self.desc.layout.item_at(lk.offset).is_some()
            && self.hdr(lk.offset).load(Ordering::Acquire) == Header::locked(lk.version, lk.owner)
            && self.w(lk.offset + 8).load(Ordering::Acquire) == key
    }

    /// The lock word of `key`'s item, unpacked (who holds it; for recovery and tests).
    /// `None` if the key is absent.
    pub fn header(&self, key: u64) -> Option<Header> {
        match self.locate(key, None) {
            Locate::Found { off, .. } | Locate::Locked { off } => {
                Some(Header::unpack(self.hdr(off).load(Ordering::Acquire)))
            }
            Locate::NotFound => None,
        }
    }

    /// Releases every lock whose owner `dead` selects, without changing the item (as an
    /// abort's release): recovery frees the locks of failed coordinators whose
    /// transactions no log record survived. A lock released meanwhile by its holder is
    /// left alone (compare-and-swap from the word read). Returns the locks released.
    pub fn release_locks_where(&self, mut dead: impl FnMut(LockOwner) -> bool) -> usize {
        let l = &self.desc.layout;
        let used = self.next_item.load(Ordering::Acquire).min(l.capacity);
        (1..=used)
            .filter_map(|r| l.item_off(r))
            .filter(|&off| self.release_if(off, &mut dead) == Release::Released)
            .count()
    }

    /// [`Table::release_locks_where`] over the locks this node's CPU took (the lock
    /// journal: LOCK RPCs and local coordinators), not every item: complete only where
    /// no node locks by one-sided CAS. Returns the locks released.
    pub fn release_cpu_locks_where(&self, mut dead: impl FnMut(LockOwner) -> bool) -> usize {
        let mut released = 0;
        self.journal
            .drain_where(|off| match self.release_if(off, &mut dead) {
                Release::Kept => true,
                Release::Released => {
                    released += 1;
                    false
                }
                Release::Free => false,
            });
        released
    }

    /// Releases the item at `off` if a transaction `dead` selects holds it (the
    /// store's own short locks belong to a live thread of this node). The release is a
    /// compare-and-swap from the word read, so a lock released meanwhile by its holder
    /// is left alone; the chunk versions still hold the locked version (an abort never
    /// wrote data), so the item reads as it was.
    fn release_if(&self, off: u64, dead: &mut impl FnMut(LockOwner) -> bool) -> Release {
        let h = self.hdr(off).load(Ordering::Acquire);
        match Header::unpack(h).owner {
            Some(o) if o != LockOwner::STORE && !dead(o) => Release::Kept,
            Some(o) if o != LockOwner::STORE => {
                let cas = self.hdr(off).compare_exchange(
                    h,
                    Header::unlocked(h),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
                if cas.is_ok() {
                    Release::Released
                } else {
                    Release::Free
                }
            }
            _ => Release::Free,
        }
    }

    /// Entries in the lock journal (an upper bound on the locks the CPU took that are
    /// held; for tests).
    pub fn journal_len(&self) -> usize {
        self.journal.len()
    }

    /// Appends to `out` the keys of present items (locked or not; deleted keys keep
    /// their item as a tombstone value) among item numbers `from..from + max`; returns
    /// where to go on, or `None` past the last item. Safe while the table is written:
    /// items are never freed, so a present item's key never changes. For scans that
    /// read each key afterwards (re-replication).
    pub fn keys_from(&self, from: u32, max: u32, out: &mut Vec<u64>) -> Option<u32> {
        let l = &self.desc.layout;
        let used = self.next_item.load(Ordering::Acquire).min(l.capacity);
        let from = from.max(1);
        if from > used {
            return None;
        }
        let end = used.min(from.saturating_add(max.max(1)) - 1);
        for r in from..=end {
            let Some(off) = l.item_off(r) else { continue };
            if Header::version_of(self.hdr(off).load(Ordering::Acquire)) & 1 == 1 {
                out.push(self.w(off + 8).load(Ordering::Acquire));
            }
        }
        Some(end + 1)
    }

    /// Calls `f(key, value)` for every present item. Only meaningful while no thread
    /// writes the table (replica-consistency checks after a run); locked items are skipped.
    pub fn for_each(&self, mut f: impl FnMut(u64, &[u8])) {
        let l = &self.desc.layout;
        let used = self.next_item.load(Ordering::Acquire).min(l.capacity);
        let mut buf = vec![0u8; self.value_size()];
        for r in 1..=used {
            let Some(off) = l.item_off(r) else { continue };
            let h = self.hdr(off).load(Ordering::Acquire);
            if Header::is_locked(h) || h & 1 == 0 {
                continue;
            }
            let key = self.w(off + 8).load(Ordering::Acquire);
            let lk = ItemLock {
                offset: off,
                version: h,
                owner: LockOwner::STORE,
            };
            if self.read_locked(&lk, &mut buf).is_ok() {
                f(key, &buf);
            }
        }
    }

    /// Locks `key`'s item for `owner`, waiting for other holders.
    pub fn lock(&self, key: u64, owner: LockOwner) -> Result<ItemLock, StoreError> {
        let mut spins = 0u32;
        loop {
            match self.try_lock(key, owner) {
                Err(StoreError::Locked) => backoff(&mut spins),
                r => return r,
            }
        }
    }

    /// Writes a new value into an item this node holds locked (the new version is
    /// published by [`Table::unlock`] with `commit`).
    pub fn write_locked(&self, lk: &ItemLock, val: &[u8]) -> Result<(), StoreError> {
        self.check_value(val)?;
        if self.desc.layout.item_at(lk.offset).is_none() {
            return Err(StoreError::NotFound);
        }
        self.write_data(lk.offset, None, val);
        Ok(())
    }

    /// Reads the value of an item this node holds locked (stable while locked).
    pub fn read_locked(&self, lk: &ItemLock, out: &mut [u8]) -> Result<(), StoreError> {
        if self.desc.layout.item_at(lk.offset).is_none() {
            return Err(StoreError::NotFound);
        }
        let off = lk.offset;
        copy_words_out(&self.shape, out, |i| {
            self.w(off + 8 * i as u64).load(Ordering::Acquire)
        });
        Ok(())
    }

    /// Releases a lock (the owner is cleared): with `commit` the version advances by 2
    /// (readers see a change, and the chunk versions are set to it); without, the old
    /// version is restored. An abort must not follow [`Table::write_locked`] (OCC writes
    /// only when it commits): readers would take the new data for the old version.
    pub fn unlock(&self, lk: ItemLock, commit: bool) -> u64 {
        if self.desc.layout.item_at(lk.offset).is_none() {
            return lk.version;
        }
        let v = if commit {
            Header::bump(lk.version, 2)
        } else {
            Header::version_of(lk.version)
        };
        self.publish(lk.offset, v);
        v
    }

    /// Chunk versions to MARKER, then data (the write protocol of [`crate::layout`]).
    /// The caller holds the item's lock.
    fn write_data(&self, off: u64, key: Option<u64>, val: &[u8]) {
        // Orders the lock CAS before the stores below for local seqlock readers.
        fence(Ordering::Release);
        for &v in &self.shape.versions {
            self.w(off + 8 * v as u64).store(MARKER, Ordering::Relaxed);
        }
        // Any reader that sees a data word below also sees the markers.
        fence(Ordering::Release);
        if let Some(k) = key {
            self.w(off + 8).store(k, Ordering::Relaxed);
        }
        for (i, &w) in self.shape.data.iter().enumerate() {
            self.w(off + 8 * w as u64)
                .store(value_word(val, i), Ordering::Relaxed);
        }
    }

    /// Chunk versions then header to version `v` (unlocked, owner cleared).
    fn publish(&self, off: u64, v: u64) {
        let v = Header::unlocked(v);
        for &c in &self.shape.versions {
            self.w(off + 8 * c as u64).store(v, Ordering::Release);
        }
        self.hdr(off).store(v, Ordering::Release);
    }

    /// Replaces `key`'s value, waiting for the item's lock; returns the new version.
    pub fn update(&self, key: u64, val: &[u8]) -> Result<u64, StoreError> {
        self.check_value(val)?;
        let lk = self.lock(key, LockOwner::STORE)?;
        self.write_data(lk.offset, None, val);
        Ok(self.unlock(lk, true))
    }

    /// Applies a replicated write at a backup: `key`'s copy here takes `val` at
    /// `version` (its primary's version after the write) unless it is already at
    /// `version` or later, since writes of one key may reach a backup out of commit
    /// order (from different coordinators' logs, FaRM §3.4's version check). An absent
    /// key is inserted at `version`. Returns whether the write was applied; a version
    /// that is not a present item's (odd, within the mask) is refused as `NotFound`.
    /// Versions are compared as numbers: a key's primary version only grows (its item
    /// is never freed once committed) and wraps only after 2^47 writes.
    pub fn apply_versioned(&self, key: u64, val: &[u8], version: u64) -> Result<bool, StoreError> {
        self.check_value(val)?;
        if version & !VERSION_MASK != 0 || version & 1 != 1 {
            return Err(StoreError::NotFound);
        }
        loop {
            match self.lock(key, LockOwner::STORE) {
                Ok(lk) => {
                    if Header::version_of(lk.version) >= version {
                        self.unlock(lk, false);
                        return Ok(false);
                    }
                    self.write_data(lk.offset, None, val);
                    self.publish(lk.offset, version);
                    return Ok(true);
                }
                Err(StoreError::NotFound) => match self.insert_with(key, val, Some(version)) {
                    Ok(_) => return Ok(true),
                    // Inserted meanwhile by another thread: compare with it.
                    Err(StoreError::Exists) => continue,
                    Err(StoreError::Full) => {
                        self.full_refusals.fetch_add(1, Ordering::Relaxed);
                        return Err(StoreError::Full);
                    }
                    Err(e) => return Err(e),
                },
                Err(e) => return Err(e),
            }
        }
    }

    fn lock_bucket(&self, b: u64) {
        let w = self.w(b);
        let mut spins = 0;
        loop {
            if w.fetch_or(BUCKET_LOCK, Ordering::Acquire) & BUCKET_LOCK == 0 {
                return;
            }
            while w.load(Ordering::Relaxed) & BUCKET_LOCK != 0 {
                backoff(&mut spins);
            }
        }
    }

    fn unlock_bucket(&self, b: u64) {
        self.w(b).fetch_and(!BUCKET_LOCK, Ordering::Release);
    }

    /// Calls `f(bucket, slot, item_off)` for the occupied slots of `key`'s chain whose
    /// tag matches, then returns the first empty slot and the chain's last bucket. The
    /// caller holds the main bucket's lock, so the items' keys are stable.
    fn scan_chain(
        &self,
        main: u64,
        tag: u8,
        mut f: impl FnMut(u64, usize, u64) -> bool,
    ) -> (Option<(u64, usize)>, u64) {
        let l = &self.desc.layout;
        let mut b = main;
        let mut empty = None;
        let mut hops = 0;
        loop {
            let w0 = self.w(b).load(Ordering::Acquire);
            let w1 = self.w(b + 8).load(Ordering::Acquire);
            let m = tag_matches(w0, w1, tag);
            for s in 0..SLOTS {
                let r = slot_ref(
                    self.w(b + 16 + 8 * (s as u64 / 2)).load(Ordering::Acquire),
                    s,
                );
                match l.item_off(r) {
                    None => {
                        if empty.is_none() {
                            empty = Some((b, s));
                        }
                    }
                    Some(off) if m & (1 << s) != 0 => {
                        if f(b, s, off) {
                            return (empty, b);
                        }
                    }
                    Some(_) => {}
                }
            }
            match l.overflow_bucket_off(w0 & LINK_MASK) {
                Some(next) if hops <= l.overflow => {
                    b = next;
                    hops += 1;
                }
                _ => return (empty, b),
            }
        }
    }

    fn set_slot(&self, b: u64, s: usize, r: u32, tag: u8) {
        let rw = self.w(b + 16 + 8 * (s as u64 / 2));
        let sh = 32 * (s % 2);
        let old = rw.load(Ordering::Relaxed);
        let new_ref = (old & !(0xffff_ffffu64 << sh)) | ((r as u64) << sh);
        let (wi, tsh) = tag_pos(s);
        let tw = self.w(b + 8 * wi as u64);
        let new_tag = |old: u64| (old & !(0xffu64 << tsh)) | ((tag as u64) << tsh);
        if r != 0 {
            // Reference first, then the tag that makes readers look at it.
            rw.store(new_ref, Ordering::Release);
            let o = tw.load(Ordering::Relaxed);
            tw.store(new_tag(o), Ordering::Release);
        } else {
            let o = tw.load(Ordering::Relaxed);
            tw.store(new_tag(o), Ordering::Release);
            rw.store(new_ref, Ordering::Release);
        }
    }

    fn alloc_item(&self) -> Option<u32> {
        if let Some(i) = self
            .free_items
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
        {
            return Some(i);
        }
        let cap = self.desc.layout.capacity;
        let n = self
            .next_item
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < cap).then_some(n + 1)
            })
            .ok()?;
        Some(n)
    }

    /// Inserts a new key; returns its version.
    pub fn insert(&self, key: u64, val: &[u8]) -> Result<u64, StoreError> {
        self.insert_with(key, val, None)
    }

    /// [`Table::insert`], at `version` if given (else the item's next version).
    fn insert_with(&self, key: u64, val: &[u8], version: Option<u64>) -> Result<u64, StoreError> {
        self.check_value(val)?;
        let l = &self.desc.layout;
        let h = hash(key, l.seed);
        let tag = tag_of(h);
        let main = l.main_bucket_off(h);
        self.lock_bucket(main);
        let r = self.insert_locked(main, key, tag, val, version);
        self.unlock_bucket(main);
        if r.is_ok() {
            self.count.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    fn insert_locked(
        &self,
        main: u64,
        key: u64,
        tag: u8,
        val: &[u8],
        version: Option<u64>,
    ) -> Result<u64, StoreError> {
        let l = &self.desc.layout;
        let mut exists = false;
        let (empty, last) = self.scan_chain(main, tag, |_, _, off| {
            let h = self.hdr(off).load(Ordering::Acquire);
            exists = h & 1 == 1 && self.w(off + 8).load(Ordering::Acquire) == key;
            exists
        });
        if exists {
            return Err(StoreError::Exists);
        }
        let (b, s) = match empty {
            Some(e) => e,
            None => {
                let n = self.next_overflow.fetch_add(1, Ordering::Relaxed);
                if n >= l.overflow {
                    return Err(StoreError::Full);
                }
                let nb = l
                    .overflow_bucket_off(n as u64 + 1)
                    .ok_or(StoreError::Full)?;
                let lw = self.w(last);
                let old = lw.load(Ordering::Relaxed);
                lw.store((old & !LINK_MASK) | (n as u64 + 1), Ordering::Release);
                (nb, 0)
            }
        };
        // An item whose header someone else has locked (only a misbehaving remote could
        // lock a free item) is left aside.
        let (item, off, v) = loop {
            let item = self.alloc_item().ok_or(StoreError::Full)?;
            let off = l.item_off(item + 1).ok_or(StoreError::Full)?;
            let old = self.hdr(off).load(Ordering::Acquire);
            if !Header::is_locked(old)
                && old & 1 == 0
                && self
                    .hdr(off)
                    .compare_exchange(
                        old,
                        Header::locked(old, LockOwner::STORE),
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    )
                    .is_ok()
            {
                break (item, off, Header::version_of(old));
            }
        };
        self.write_data(off, Some(key), val);
        let nv = version.unwrap_or_else(|| Header::bump(v, 1));
        self.publish(off, nv);
        self.set_slot(b, s, item + 1, tag);
        Ok(nv)
    }

    /// Removes `key`, waiting for its item's lock.
    pub fn delete(&self, key: u64) -> Result<(), StoreError> {
        let l = &self.desc.layout;
        let h = hash(key, l.seed);
        let tag = tag_of(h);
        let main = l.main_bucket_off(h);
        self.lock_bucket(main);
        let mut found = None;
        self.scan_chain(main, tag, |b, s, off| {
            let hd = self.hdr(off).load(Ordering::Acquire);
            if hd & 1 == 1 && self.w(off + 8).load(Ordering::Acquire) == key {
                found = Some((b, s, off));
                true
            } else {
                false
            }
        });
        let Some((b, s, off)) = found else {
            self.unlock_bucket(main);
            return Err(StoreError::NotFound);
        };
        let mut spins = 0;
        let v = loop {
            let v = self.hdr(off).load(Ordering::Acquire);
            if !Header::is_locked(v)
                && self
                    .hdr(off)
                    .compare_exchange(
                        v,
                        Header::locked(v, LockOwner::STORE),
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    )
                    .is_ok()
            {
                break Header::version_of(v);
            }
            backoff(&mut spins);
        };
        self.set_slot(b, s, 0, 0);
        // Even version: absent. Data and chunk versions stay; a reader holding the old
        // location sees the absent header.
        self.hdr(off)
            .store(Header::unlocked(Header::bump(v, 1)), Ordering::Release);
        self.unlock_bucket(main);
        if let Some(item) = l.item_at(off) {
            self.free_items
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(item);
        }
        self.count.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Asks for transparent huge pages on the table's memory: lookups touch two random
/// lines (bucket, item) of a large region, and with 4 KiB pages each costs a TLB miss
/// and a page walk. Registered memory is pinned in huge pages on real NICs too. Advice
/// only: ignored where not supported (for example shared-file mappings).
fn advise_huge_pages(mem: &RegionMemory, len: usize) {
    const HUGE: usize = 2 << 20;
    let start = (mem.as_ptr() as usize).next_multiple_of(HUGE);
    let end = (mem.as_ptr() as usize + len.min(mem.len())) & !(HUGE - 1);
    if end > start {
        // SAFETY: the range lies inside the mapping; madvise does not change its contents.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

/// Spin briefly, then yield: lock holders on a 2-core machine may be descheduled.
#[inline]
pub(crate) fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}
