//! The location cache (DrTM's location-based cache, DrTM+H's index cache): maps a remote
//! (table, key) to where its item lives, so that one READ fetches it.
//!
//! **Bounded memory, set-associative with CLOCK per set.** The cache has a fixed number
//! of sets of 8 ways, chosen at creation (about 32 bytes per entry); it never grows. A
//! (table, key) maps to one set by hash. A hit sets the entry's reference bit; an insert
//! into a full set runs the set's clock hand, clearing reference bits until it finds an
//! unreferenced entry, and replaces it (second chance: recently used locations survive a
//! sweep, so a skewed working set stays cached). Each set has its own small mutex: sets
//! are independent, so threads rarely contend.
//!
//! Entries are hints: a reader validates every cached location against the item it
//! READs (key and header), and invalidates or overwrites a stale one. Any access that
//! learns an address (a remote lookup, an RPC reply carrying an offset) should `insert`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Where an item lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loc {
    pub node: u16,
    pub region: u32,
    pub offset: u64,
}

const WAYS: usize = 8;

#[derive(Clone, Copy)]
struct Entry {
    table: u32,
    key: u64,
    loc: Loc,
    valid: bool,
    referenced: bool,
}

const EMPTY: Entry = Entry {
    table: 0,
    key: 0,
    loc: Loc {
        node: 0,
        region: 0,
        offset: 0,
    },
    valid: false,
    referenced: false,
};

struct Set {
    ways: [Entry; WAYS],
    hand: u8,
}

/// Hit/miss/eviction counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub inserts: u64,
    pub evictions: u64,
    pub invalidations: u64,
}

pub struct LocationCache {
    sets: Box<[Mutex<Set>]>,
    hits: AtomicU64,
    misses: AtomicU64,
    inserts: AtomicU64,
    evictions: AtomicU64,
    invalidations: AtomicU64,
}

impl LocationCache {
    /// A cache of at least `entries` entries (rounded up to whole sets of 8).
    pub fn new(entries: usize) -> LocationCache {
        let sets = entries.div_ceil(WAYS).max(1);
        LocationCache {
            sets: (0..sets)
                .map(|_| {
                    Mutex::new(Set {
                        ways: [EMPTY; WAYS],
                        hand: 0,
                    })
                })
                .collect(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            inserts: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            invalidations: AtomicU64::new(0),
        }
    }

    /// How many entries the cache can hold.
    pub fn capacity(&self) -> usize {
        self.sets.len() * WAYS
    }

    /// Approximate bytes used (fixed at creation).
    pub fn memory_bytes(&self) -> usize {
        self.sets.len() * std::mem::size_of::<Mutex<Set>>()
    }

    fn set(&self, table: u32, key: u64) -> std::sync::MutexGuard<'_, Set> {
        let h = crate::layout::hash(key, 0x5bd1_e995 ^ ((table as u64) << 32));
        let i = ((h as u128 * self.sets.len() as u128) >> 64) as usize;
        self.sets[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn get(&self, table: u32, key: u64) -> Option<Loc> {
        let mut s = self.set(table, key);
        for e in s.ways.iter_mut() {
            if e.valid && e.table == table && e.key == key {
                e.referenced = true;
                self.hits.fetch_add(1, Ordering::Relaxed);
                return Some(e.loc);
            }
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        None
    }

    pub fn insert(&self, table: u32, key: u64, loc: Loc) {
        self.inserts.fetch_add(1, Ordering::Relaxed);
        let mut s = self.set(table, key);
        let new = Entry {
            table,
            key,
            loc,
            valid: true,
            referenced: false,
        };
        if let Some(e) = s
            .ways
            .iter_mut()
            .find(|e| e.valid && e.table == table && e.key == key)
        {
            *e = Entry {
                referenced: e.referenced,
                ..new
            };
            return;
        }
        if let Some(e) = s.ways.iter_mut().find(|e| !e.valid) {
            *e = new;
            return;
        }
        // CLOCK: at most two sweeps, since the first clears every reference bit.
        loop {
            let h = s.hand as usize % WAYS;
            s.hand = ((h + 1) % WAYS) as u8;
            let e = &mut s.ways[h];
            if e.referenced {
                e.referenced = false;
            } else {
                *e = new;
                self.evictions.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }

    pub fn invalidate(&self, table: u32, key: u64) {
        let mut s = self.set(table, key);
        for e in s.ways.iter_mut() {
            if e.valid && e.table == table && e.key == key {
                e.valid = false;
                self.invalidations.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Drops every entry of `table` (for example after the table moved).
    pub fn invalidate_table(&self, table: u32) {
        for set in self.sets.iter() {
            let mut s = set.lock().unwrap_or_else(|e| e.into_inner());
            for e in s.ways.iter_mut() {
                if e.valid && e.table == table {
                    e.valid = false;
                }
            }
        }
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            inserts: self.inserts.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            invalidations: self.invalidations.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(o: u64) -> Loc {
        Loc {
            node: 1,
            region: 2,
            offset: o,
        }
    }

    #[test]
    fn bounded_and_exact() {
        let c = LocationCache::new(64);
        assert_eq!(c.capacity(), 64);
        for k in 0..1000u64 {
            c.insert(7, k, loc(k * 64));
        }
        let present: Vec<u64> = (0..1000).filter(|&k| c.get(7, k).is_some()).collect();
        assert!(
            present.len() <= 64 && present.len() >= 32,
            "{}",
            present.len()
        );
        for &k in &present {
            assert_eq!(c.get(7, k), Some(loc(k * 64)));
            assert_eq!(c.get(8, k), None, "tables are separate namespaces");
        }
        assert!(c.stats().evictions >= 1000 - 64);
        c.invalidate(7, present[0]);
        assert_eq!(c.get(7, present[0]), None);
        c.invalidate_table(7);
        assert!((0..1000).all(|k| c.get(7, k).is_none()));
    }

    #[test]
    fn clock_keeps_referenced_entries() {
        // One set: the referenced entry survives a full sweep of insertions.
        let c = LocationCache::new(8);
        for k in 0..8u64 {
            c.insert(1, k, loc(k));
        }
        assert!(c.get(1, 3).is_some());
        for k in 100..107u64 {
            c.insert(1, k, loc(k));
        }
        assert_eq!(c.get(1, 3), Some(loc(3)));
        // Overwrite keeps one entry per key.
        c.insert(1, 3, loc(99));
        assert_eq!(c.get(1, 3), Some(loc(99)));
    }
}
