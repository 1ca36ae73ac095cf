//! The location cache (DrTM's location-based cache, DrTM+H's index cache): maps a remote
//! (table, key) to where its item lives, so that one READ fetches it.
//!
//! **Lock-free reads, one cache line per lookup.** The cache is a fixed array of sets,
//! chosen at creation; it never grows. A (table, key) maps to one set by hash. A set is
//! one 64-byte line: a sequence word, a replacement word and [`WAYS`] = 3 ways of two
//! `AtomicU64` words each (the key, and the packed location below). A lookup loads that
//! one line and writes nothing shared (only its own thread's counter line, and a
//! reference bit the first time an entry is hit); writers of a set take the set's
//! sequence word as a tiny spin lock. No `unsafe`: every shared word is an atomic.
//!
//! **Why lock-free is safe here.** Entries are hints: a reader validates every cached
//! location against the item it READs (key and header), and invalidates or overwrites a
//! stale one. Still, the cache itself never returns a location that was not inserted for
//! the same (table, key): the sequence word is a seqlock. A writer makes it odd
//! (compare-and-swap, which also excludes other writers), stores the way's words, and
//! makes it even again (two more than before); a reader loads it, loads the ways, and
//! loads it again after an acquire fence. If the two loads differ, or the first was odd,
//! a writer overlapped the reader, which may have seen a torn way (the key of one entry
//! with the location of another); the reader then retries once and otherwise reports a
//! miss, never the torn location. The counter is 64 bits, so it cannot wrap
//! back to the same value within a read (no ABA). A miss is always safe: the caller walks
//! the bucket chain or asks by RPC.
//!
//! **Location word layout** (bit 0 = least significant):
//!
//! | bits | field | limit |
//! | --- | --- | --- |
//! | 0..35 | `offset / 32` | offset < 2^40 (1 TiB region), a multiple of 32 |
//! | 35..41 | `node` | < 64 (`LockOwner::MAX_NODES`) |
//! | 41..53 | `region` | < 4096 (every backend's `MAX_REGIONS`) |
//! | 53..64 | `table + 1` | table ≤ 2046 (`NodeDb` allows ≤ 1024) |
//!
//! Items start on 32-byte boundaries (the item area starts on a line and item sizes are
//! multiples of 32, see `layout.rs`), so the offset is stored in units of 32. The table
//! is stored plus one so that the all-zero word is the empty way. A location or table
//! that does not fit is not cached (the insert drops any entry of that key and is counted
//! in [`CacheStats::uncacheable`]).
//!
//! **Replacement: CLOCK per set.** A hit sets the way's reference bit (a write only when
//! the bit was clear, so a hot entry costs no write). An insert replaces the key's own
//! way, else an empty way, else runs the set's clock hand: referenced ways lose their
//! bit and are passed over, the first unreferenced one is replaced (second chance: a
//! recently used location survives a sweep). Reference bits are outside the seqlock: a
//! reader that hits an entry as it is replaced may leave its bit on the new entry, which
//! only makes replacement less exact.
//!
//! **Counters.** Hits and misses happen on every lookup from every thread, so one shared
//! counter would put a contended cache line (and a locked instruction) on the fast path.
//! Every counter is therefore kept in per-thread shards, one line each: a thread takes
//! shard `n % 64` by order of first use and adds with a plain load and store; `stats`
//! sums the shards. Two live threads share a shard only once the process has used more
//! than 64 threads; they may then lose increments, so counts are approximate there. The transaction layer also
//! counts hits, misses and stale entries per thread (`TxnStats::location_cache`).

use std::sync::atomic::{fence, AtomicU64, Ordering};

/// Where an item lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loc {
    pub node: u16,
    pub region: u32,
    pub offset: u64,
}

/// Ways per set: with the sequence and replacement words, one 64-byte line.
pub const WAYS: usize = 3;

/// Offsets are stored in units of the item alignment.
const ALIGN_BITS: u32 = 5;
const OFFSET_BITS: u32 = 40 - ALIGN_BITS;
const NODE_BITS: u32 = 6;
const REGION_BITS: u32 = 12;
const TABLE_BITS: u32 = 11;
const NODE_SHIFT: u32 = OFFSET_BITS;
const REGION_SHIFT: u32 = NODE_SHIFT + NODE_BITS;
const TABLE_SHIFT: u32 = REGION_SHIFT + REGION_BITS;
const _: () = assert!(TABLE_SHIFT + TABLE_BITS == 64);

/// The largest table id that can be cached.
pub const MAX_TABLE: u32 = (1 << TABLE_BITS) - 2;

fn mask(bits: u32) -> u64 {
    (1u64 << bits) - 1
}

/// The table field of a location word (`table + 1`, so 0 is never a valid table).
fn table_field(table: u32) -> Option<u64> {
    (table <= MAX_TABLE).then_some((table as u64 + 1) << TABLE_SHIFT)
}

fn encode(table: u32, loc: Loc) -> Option<u64> {
    let t = table_field(table)?;
    let o = loc.offset >> ALIGN_BITS;
    let fits = o <= mask(OFFSET_BITS)
        && loc.offset & mask(ALIGN_BITS) == 0
        && (loc.node as u64) <= mask(NODE_BITS)
        && (loc.region as u64) <= mask(REGION_BITS);
    fits.then_some(t | (loc.region as u64) << REGION_SHIFT | (loc.node as u64) << NODE_SHIFT | o)
}

fn decode(w: u64) -> Loc {
    Loc {
        node: ((w >> NODE_SHIFT) & mask(NODE_BITS)) as u16,
        region: ((w >> REGION_SHIFT) & mask(REGION_BITS)) as u32,
        offset: (w & mask(OFFSET_BITS)) << ALIGN_BITS,
    }
}

const TABLE_MASK: u64 = !((1u64 << TABLE_SHIFT) - 1);

/// Replacement word: bits 0..WAYS are reference bits, bits 8.. the clock hand.
const HAND_SHIFT: u32 = 8;
const REF_MASK: u64 = (1 << WAYS) - 1;

/// One set: exactly one cache line.
#[repr(C, align(64))]
struct Set {
    /// Seqlock: odd while a writer holds the set.
    seq: AtomicU64,
    /// Reference bits and clock hand.
    clock: AtomicU64,
    /// Per way: [key, location word]; location word 0 = empty.
    ways: [[AtomicU64; 2]; WAYS],
}

const _: () = assert!(std::mem::size_of::<Set>() == 64);

impl Set {
    fn new() -> Set {
        Set {
            seq: AtomicU64::new(0),
            clock: AtomicU64::new(0),
            ways: std::array::from_fn(|_| [AtomicU64::new(0), AtomicU64::new(0)]),
        }
    }

    /// The way holding (`tf`, `key`) and its location word, from one consistent snapshot:
    /// `Ok(None)` if absent, `Err(())` if writers overlapped both tries.
    #[inline]
    fn find(&self, tf: u64, key: u64) -> Result<Option<(usize, u64)>, ()> {
        for _ in 0..2 {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 0 {
                // No early exit: selecting without branches avoids a mispredicted branch
                // on which way holds the key (at most one does).
                let (mut w, mut l) = (0, 0);
                for (i, way) in self.ways.iter().enumerate() {
                    let k = way[0].load(Ordering::Relaxed);
                    let x = way[1].load(Ordering::Relaxed);
                    let hit = (k == key) & (x & TABLE_MASK == tf);
                    w = if hit { i } else { w };
                    l = if hit { x } else { l };
                }
                let found = (l != 0).then_some((w, l));
                // Orders the way loads before the re-check (seqlock read side).
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == s1 {
                    return Ok(found);
                }
            }
            std::hint::spin_loop();
        }
        Err(())
    }

    /// The way holding (`tf`, `key`), under the lock.
    fn find_locked(&self, tf: u64, key: u64) -> Option<usize> {
        (0..WAYS).find(|&w| {
            self.ways[w][0].load(Ordering::Relaxed) == key
                && self.ways[w][1].load(Ordering::Relaxed) & TABLE_MASK == tf
        })
    }

    /// Takes the set for writing; returns the (odd) sequence to release with.
    fn lock(&self) -> u64 {
        let mut spins = 0u32;
        loop {
            let s = self.seq.load(Ordering::Relaxed);
            if s & 1 == 0
                && self
                    .seq
                    .compare_exchange_weak(s, s + 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                // Readers that see any of our way stores also see the odd sequence.
                fence(Ordering::Release);
                return s + 1;
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                // The holder may be descheduled (2 cores, many threads): let it run.
                std::thread::yield_now();
            }
        }
    }

    fn unlock(&self, odd: u64) {
        self.seq.store(odd + 1, Ordering::Release);
    }

    /// Writes way `w` (under the lock).
    fn put(&self, w: usize, key: u64, loc: u64) {
        self.ways[w][0].store(key, Ordering::Relaxed);
        self.ways[w][1].store(loc, Ordering::Relaxed);
    }

    /// Clears way `w`'s reference bit (under the lock; readers may set bits concurrently).
    fn clear_ref(&self, w: usize) {
        if self.clock.load(Ordering::Relaxed) & 1 << w != 0 {
            self.clock.fetch_and(!(1 << w), Ordering::Relaxed);
        }
    }
}

/// Hit/miss/eviction counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    /// Every count is approximate beyond 64 threads (see the module docs).
    pub hits: u64,
    pub misses: u64,
    pub inserts: u64,
    pub evictions: u64,
    pub invalidations: u64,
    /// Inserts whose table or location does not fit the packed word.
    pub uncacheable: u64,
}

const SHARDS: usize = 64;

/// One thread's counts, on its own line.
#[repr(align(64))]
#[derive(Default)]
struct Shard {
    hits: AtomicU64,
    misses: AtomicU64,
    inserts: AtomicU64,
    evictions: AtomicU64,
    invalidations: AtomicU64,
    uncacheable: AtomicU64,
}

#[inline]
fn my_shard() -> usize {
    crate::thread_slot::thread_slot() % SHARDS
}

/// A thread-private counter: load and store, no locked instruction.
#[inline]
fn bump(c: &AtomicU64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
}

pub struct LocationCache {
    sets: Box<[Set]>,
    shards: Box<[Shard]>,
}

impl LocationCache {
    /// A cache of at least `entries` entries (rounded up to whole sets of [`WAYS`]).
    pub fn new(entries: usize) -> LocationCache {
        let sets = entries.div_ceil(WAYS).max(1);
        LocationCache {
            sets: (0..sets).map(|_| Set::new()).collect(),
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
        }
    }

    /// How many entries the cache can hold.
    pub fn capacity(&self) -> usize {
        self.sets.len() * WAYS
    }

    /// Bytes used (fixed at creation): the sets and the counter shards.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<LocationCache>()
            + self.sets.len() * std::mem::size_of::<Set>()
            + self.shards.len() * std::mem::size_of::<Shard>()
    }

    #[inline]
    fn set(&self, table: u32, key: u64) -> &Set {
        let h = crate::layout::hash(key, 0x5bd1_e995 ^ ((table as u64) << 32));
        let i = ((h as u128 * self.sets.len() as u128) >> 64) as usize;
        &self.sets[i]
    }

    /// This thread's counters.
    #[inline]
    fn shard(&self) -> &Shard {
        &self.shards[my_shard()]
    }

    #[inline]
    pub fn get(&self, table: u32, key: u64) -> Option<Loc> {
        let shard = self.shard();
        let found = table_field(table).and_then(|tf| {
            let s = self.set(table, key);
            let (w, l) = s.find(tf, key).ok().flatten()?;
            // Set the reference bit only if clear: a hot entry costs no write.
            if s.clock.load(Ordering::Relaxed) & (1 << w) == 0 {
                s.clock.fetch_or(1 << w, Ordering::Relaxed);
            }
            Some(decode(l))
        });
        bump(if found.is_some() {
            &shard.hits
        } else {
            &shard.misses
        });
        found
    }

    pub fn insert(&self, table: u32, key: u64, loc: Loc) {
        let Some(new) = encode(table, loc) else {
            bump(&self.shard().uncacheable);
            // The key's old location (if any) is now known to be stale.
            self.invalidate(table, key);
            return;
        };
        bump(&self.shard().inserts);
        let tf = new & TABLE_MASK;
        let s = self.set(table, key);
        let odd = s.lock();
        // The key's own way keeps its reference bit.
        if let Some(w) = s.find_locked(tf, key) {
            s.put(w, key, new);
        } else if let Some(w) = (0..WAYS).find(|&w| s.ways[w][1].load(Ordering::Relaxed) == 0) {
            s.clear_ref(w);
            s.put(w, key, new);
        } else {
            // CLOCK: at most WAYS + 1 steps, since the first pass clears every bit.
            let c = s.clock.load(Ordering::Relaxed);
            let mut hand = (c >> HAND_SHIFT) as usize % WAYS;
            let mut refs = c & REF_MASK;
            while refs & (1 << hand) != 0 {
                refs &= !(1 << hand);
                hand = (hand + 1) % WAYS;
            }
            let victim = hand;
            // One xor clears the bits the sweep passed (set in `c`, and only lock holders
            // clear bits, so they are still set) and moves the hand (only lock holders
            // move it). A bit a reader sets meanwhile is kept.
            let passed = c & REF_MASK & !refs;
            let old_hand = (c >> HAND_SHIFT) & 0xff;
            let next = ((victim + 1) % WAYS) as u64;
            s.clock
                .fetch_xor(passed | (old_hand ^ next) << HAND_SHIFT, Ordering::Relaxed);
            s.put(victim, key, new);
            bump(&self.shard().evictions);
        }
        s.unlock(odd);
    }

    pub fn invalidate(&self, table: u32, key: u64) {
        let Some(tf) = table_field(table) else {
            return;
        };
        let s = self.set(table, key);
        // Most calls follow a stale hit, but skip the lock when there is nothing to drop.
        if s.find(tf, key) == Ok(None) {
            return;
        }
        let odd = s.lock();
        if let Some(w) = s.find_locked(tf, key) {
            s.put(w, 0, 0);
            s.clear_ref(w);
            bump(&self.shard().invalidations);
        }
        s.unlock(odd);
    }

    /// Drops every entry whose location is on a node of `nodes` (bit i = node i), in one
    /// pass over the cache (for example after a node was replaced: its items moved).
    pub fn invalidate_nodes(&self, nodes: u64) {
        if nodes == 0 {
            return;
        }
        let on = |w: u64| w != 0 && nodes >> ((w >> NODE_SHIFT) & mask(NODE_BITS)) & 1 == 1;
        for s in self.sets.iter() {
            // Lock only the sets that hold such an entry (checked again under the lock).
            let has = s.ways.iter().any(|w| on(w[1].load(Ordering::Relaxed)));
            if !has && s.seq.load(Ordering::Relaxed) & 1 == 0 {
                continue;
            }
            let odd = s.lock();
            for w in 0..WAYS {
                if on(s.ways[w][1].load(Ordering::Relaxed)) {
                    s.put(w, 0, 0);
                    s.clear_ref(w);
                }
            }
            s.unlock(odd);
        }
    }

    /// Drops every entry of `table` (for example after the table moved).
    pub fn invalidate_table(&self, table: u32) {
        let Some(tf) = table_field(table) else {
            return;
        };
        let has = |s: &Set| {
            s.ways
                .iter()
                .any(|w| w[1].load(Ordering::Relaxed) & TABLE_MASK == tf)
        };
        for s in self.sets.iter() {
            // Lock only the sets that hold the table (checked again under the lock).
            if !has(s) && s.seq.load(Ordering::Relaxed) & 1 == 0 {
                continue;
            }
            let odd = s.lock();
            for w in 0..WAYS {
                if s.ways[w][1].load(Ordering::Relaxed) & TABLE_MASK == tf {
                    s.put(w, 0, 0);
                    s.clear_ref(w);
                }
            }
            s.unlock(odd);
        }
    }

    pub fn stats(&self) -> CacheStats {
        let sum = |f: fn(&Shard) -> &AtomicU64| {
            self.shards
                .iter()
                .map(|s| f(s).load(Ordering::Relaxed))
                .sum()
        };
        CacheStats {
            hits: sum(|s| &s.hits),
            misses: sum(|s| &s.misses),
            inserts: sum(|s| &s.inserts),
            evictions: sum(|s| &s.evictions),
            invalidations: sum(|s| &s.invalidations),
            uncacheable: sum(|s| &s.uncacheable),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// A location at item `o` (offsets are 32-byte aligned).
    fn loc(o: u64) -> Loc {
        Loc {
            node: 1,
            region: 2,
            offset: o * 32,
        }
    }

    #[test]
    fn one_line_per_set_and_honest_memory() {
        let c = LocationCache::new(1 << 21);
        assert!(c.capacity() >= 1 << 21 && c.capacity() < (1 << 21) + WAYS);
        let sets = c.capacity() / WAYS;
        assert!(c.memory_bytes() >= sets * 64);
        assert!(c.memory_bytes() < sets * 64 + 8192);
        assert_eq!(c.sets.as_ptr() as usize % 64, 0, "sets are line-aligned");
    }

    #[test]
    fn bounded_and_exact() {
        let c = LocationCache::new(64);
        assert!(c.capacity() >= 64 && c.capacity() < 64 + WAYS);
        for k in 0..1000u64 {
            c.insert(7, k, loc(k * 64));
        }
        let present: Vec<u64> = (0..1000).filter(|&k| c.get(7, k).is_some()).collect();
        assert!(
            present.len() <= c.capacity() && present.len() >= 32,
            "{}",
            present.len()
        );
        for &k in &present {
            assert_eq!(c.get(7, k), Some(loc(k * 64)));
            assert_eq!(c.get(8, k), None, "tables are separate namespaces");
        }
        let st = c.stats();
        assert_eq!(st.inserts, 1000);
        assert!(st.evictions >= 1000 - c.capacity() as u64);
        assert_eq!(st.hits, 2 * present.len() as u64);
        assert_eq!(
            st.misses,
            1000 - present.len() as u64 + present.len() as u64
        );
        c.invalidate(7, present[0]);
        assert_eq!(c.get(7, present[0]), None);
        assert_eq!(c.stats().invalidations, 1);
        c.invalidate(7, present[0]);
        assert_eq!(c.stats().invalidations, 1, "nothing left to invalidate");
        c.insert(8, present[1], loc(5));
        c.invalidate_table(7);
        assert!((0..1000).all(|k| c.get(7, k).is_none()));
        assert_eq!(c.get(8, present[1]), Some(loc(5)), "other tables stay");
    }

    #[test]
    fn invalidating_nodes_drops_only_their_entries() {
        let c = LocationCache::new(1 << 12);
        let on = |node: u16, o: u64| Loc { node, ..loc(o) };
        for k in 0..100u64 {
            c.insert(1 + (k % 2) as u32, k, on((k % 4) as u16, k));
        }
        c.invalidate_nodes(0);
        c.invalidate_nodes(1 << 3 | 1 << 9);
        for k in 0..100u64 {
            let want = (k % 4 != 3).then(|| on((k % 4) as u16, k));
            assert_eq!(c.get(1 + (k % 2) as u32, k), want, "key {k}");
        }
    }

    #[test]
    fn same_key_in_two_tables() {
        let c = LocationCache::new(3);
        c.insert(1, 42, loc(1));
        c.insert(2, 42, loc(2));
        assert_eq!(c.get(1, 42), Some(loc(1)));
        assert_eq!(c.get(2, 42), Some(loc(2)));
        c.invalidate(1, 42);
        assert_eq!((c.get(1, 42), c.get(2, 42)), (None, Some(loc(2))));
    }

    #[test]
    fn clock_keeps_referenced_entries() {
        // One set: the referenced entry survives a sweep of insertions.
        let c = LocationCache::new(WAYS);
        for k in 0..WAYS as u64 {
            c.insert(1, k, loc(k));
        }
        assert!(c.get(1, 1).is_some());
        for k in 100..100 + WAYS as u64 - 1 {
            c.insert(1, k, loc(k));
        }
        assert_eq!(c.get(1, 1), Some(loc(1)));
        // Overwrite keeps one entry per key.
        c.insert(1, 1, loc(99));
        assert_eq!(c.get(1, 1), Some(loc(99)));
        assert_eq!(
            (0..200).filter(|&k| c.get(1, k).is_some()).count(),
            WAYS,
            "one entry per key"
        );
    }

    #[test]
    fn what_does_not_fit_is_not_cached() {
        let c = LocationCache::new(64);
        let ok = Loc {
            node: 63,
            region: 4095,
            offset: (1 << 40) - 32,
        };
        c.insert(MAX_TABLE, 1, ok);
        assert_eq!(c.get(MAX_TABLE, 1), Some(ok), "the limits fit");
        c.insert(MAX_TABLE + 1, 1, ok);
        assert_eq!(c.get(MAX_TABLE + 1, 1), None);
        c.insert(u32::MAX, 1, ok);
        assert_eq!(c.get(u32::MAX, 1), None);
        for bad in [
            Loc { node: 64, ..ok },
            Loc { region: 4096, ..ok },
            Loc {
                offset: 1 << 40,
                ..ok
            },
            Loc { offset: 16, ..ok },
        ] {
            c.insert(3, 9, loc(1));
            c.insert(3, 9, bad);
            assert_eq!(c.get(3, 9), None, "a stale entry is dropped: {bad:?}");
        }
        assert_eq!(c.stats().uncacheable, 6);
        assert_eq!(encode(5, ok).map(decode), Some(ok));
    }

    /// The location stress-inserted for (table, key), version `v`: every field is derived
    /// from (table, key), so a location of any other key is detectable.
    fn stress_loc(table: u32, key: u64, v: u64) -> Loc {
        Loc {
            node: (key % 61) as u16,
            region: table * 7,
            offset: ((table as u64) << 30 | key << 4 | v) << 5,
        }
    }

    /// `l` is one of the locations inserted for (table, key).
    fn stress_ok(table: u32, key: u64, l: Loc) -> bool {
        l == stress_loc(table, key, (l.offset >> 5) & 15)
    }

    #[test]
    fn concurrent_gets_see_only_their_own_key() {
        // A small cache and few keys: sets are written while they are read.
        let c = LocationCache::new(24);
        let threads = 4;
        let iters = 4_000_000u64;
        let hits = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..threads)
                .map(|t| {
                    let c = &c;
                    sc.spawn(move || {
                        let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t;
                        let mut hits = 0u64;
                        for _ in 0..iters {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            let table = (x >> 60) as u32 % 3;
                            let key = (x >> 8) % 64;
                            match x % 8 {
                                0..=2 => c.insert(table, key, stress_loc(table, key, x >> 40 & 15)),
                                3 => c.invalidate(table, key),
                                _ => {
                                    if let Some(l) = c.get(table, key) {
                                        assert!(
                                            stress_ok(table, key, l),
                                            "({table}, {key}) -> {l:?}, not its own location"
                                        );
                                        hits += 1;
                                    }
                                }
                            }
                        }
                        hits
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
        });
        assert!(hits > 0);
        for table in 0..3 {
            for key in 0..64 {
                if let Some(l) = c.get(table, key) {
                    assert!(stress_ok(table, key, l));
                }
            }
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u32, u64, u64),
        Get(u32, u64),
        Invalidate(u32, u64),
        InvalidateTable(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            // Offsets past 2^40 or not 32-aligned are not cacheable.
            2 => (0..3u32, 0..40u64, 0..(1u64 << 41)).prop_map(|(t, k, o)| Op::Insert(t, k, o)),
            4 => (0..3u32, 0..40u64, 0..(1u64 << 36)).prop_map(|(t, k, o)| Op::Insert(t, k, o * 32)),
            4 => (0..3u32, 0..40u64).prop_map(|(t, k)| Op::Get(t, k)),
            1 => (0..3u32, 0..40u64).prop_map(|(t, k)| Op::Invalidate(t, k)),
            1 => (0..3u32).prop_map(Op::InvalidateTable),
        ]
    }

    proptest! {
        /// Against a map of the last location inserted per (table, key): a get returns
        /// nothing or exactly that; an insert is readable at once; an invalidated key or
        /// table is gone; the cache never holds more than its capacity.
        #[test]
        fn matches_a_model(entries in 1usize..20, ops in prop::collection::vec(op(), 1..300)) {
            let c = LocationCache::new(entries);
            let mut model: HashMap<(u32, u64), Loc> = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert(t, k, o) => {
                        let l = Loc { offset: o, ..loc(0) };
                        c.insert(t, k, l);
                        if o < 1 << 40 && o % 32 == 0 {
                            model.insert((t, k), l);
                            prop_assert_eq!(c.get(t, k), Some(l));
                        } else {
                            model.remove(&(t, k));
                            prop_assert_eq!(c.get(t, k), None);
                        }
                    }
                    Op::Get(t, k) => {
                        let g = c.get(t, k);
                        prop_assert!(g.is_none() || g == model.get(&(t, k)).copied());
                    }
                    Op::Invalidate(t, k) => {
                        c.invalidate(t, k);
                        model.remove(&(t, k));
                        prop_assert_eq!(c.get(t, k), None);
                    }
                    Op::InvalidateTable(t) => {
                        c.invalidate_table(t);
                        model.retain(|&(mt, _), _| mt != t);
                    }
                }
                let present = (0..3u32)
                    .flat_map(|t| (0..40u64).map(move |k| (t, k)))
                    .filter(|&(t, k)| c.get(t, k).is_some())
                    .count();
                prop_assert!(present <= c.capacity());
            }
        }
    }
}
