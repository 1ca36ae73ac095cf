//! Where a table's owner CPU took transaction locks, so that recovery releases the old
//! epoch's locks by visiting those items rather than every item's header.
//!
//! A pass over every header costs about 12 ns per item (a cache miss each): 19 ms of CPU
//! for the 1.5 M items a node of 5-node TATP holds, most of a recovery's time. The
//! journal makes it proportional to the locks taken since the last trim. It sees only the
//! locks this node's CPU takes ([`crate::Table::try_lock_at`]: LOCK RPCs and coordinators
//! locking their own keys); a one-sided CAS from another node bypasses it, so a cluster
//! that locks by CAS still needs the full pass ([`crate::Table::release_locks_where`]).
//!
//! Entries are never removed when a lock is released (that would cost every commit and
//! abort a search); instead a shard that fills up drops the entries whose item is no
//! longer locked, and grows if most still are. An entry may name an item locked since by
//! another owner, or twice: releasing is by compare-and-swap from the word read, so a
//! stale entry costs one load.

use std::sync::Mutex;

/// Shards: each thread pushes to its own (assigned round-robin on first use), so the
/// mutex is uncontended on the lock path; recovery takes each in turn.
const SHARDS: usize = 16;
/// Entries a shard holds before its first trim.
const FIRST_TRIM: usize = 1024;

/// This thread's shard.
#[inline]
fn my_shard() -> usize {
    crate::thread_slot::thread_slot() % SHARDS
}

struct Shard {
    /// Item offsets locked through this shard's threads.
    offsets: Vec<u64>,
    /// The length at which the next push trims.
    trim_at: usize,
}

/// The journal of one table (see the module docs).
pub struct LockJournal {
    shards: Box<[Mutex<Shard>]>,
}

impl Default for LockJournal {
    fn default() -> Self {
        LockJournal {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        offsets: Vec::new(),
                        trim_at: FIRST_TRIM,
                    })
                })
                .collect(),
        }
    }
}

impl LockJournal {
    /// Notes that the item at `offset` was just locked. `held(off)` says whether an item
    /// is still locked by a transaction (used by a trim).
    #[inline]
    pub fn note(&self, offset: u64, held: impl Fn(u64) -> bool) {
        let mut s = self.shards[my_shard()]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if s.offsets.len() >= s.trim_at {
            s.offsets.retain(|&o| held(o));
            // Amortized O(1) per note: the next trim comes after as many new entries as
            // survived this one (and at least FIRST_TRIM).
            s.trim_at = (2 * s.offsets.len()).max(FIRST_TRIM);
        }
        s.offsets.push(offset);
    }

    /// Calls `f` on every offset noted and not trimmed; keeps those for which it returns
    /// true (a lock left held), drops the others.
    pub fn drain_where(&self, mut f: impl FnMut(u64) -> bool) {
        for shard in self.shards.iter() {
            let mut s = shard.lock().unwrap_or_else(|e| e.into_inner());
            s.offsets.retain(|&o| f(o));
        }
    }

    /// Entries held (trimmed lazily: an upper bound on the locks held; for tests).
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).offsets.len())
            .sum()
    }
}
