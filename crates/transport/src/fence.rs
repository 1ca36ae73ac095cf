//! The epoch fence of one-sided operations, for backends whose *initiator* performs the
//! operation on the target's memory (`local`, `shm`).
//!
//! Every node has a fence: a word holding the highest epoch any of its endpoints moved
//! to, and one slot per endpoint of the cluster (a cache line each, written only by that
//! endpoint). An initiator *enters* the fence of the node it accesses before touching
//! its memory: it stores its epoch in its slot, then reads the fence word, and backs out
//! if its epoch is older. It *leaves* (clears its slot) when the operations are done. An
//! owner's `set_epoch(e)` *raises* the fence: it stores `e` in the word, then waits until
//! no slot holds an epoch older than `e`.
//!
//! Both sides use sequentially consistent accesses (a store then a load on each side, as
//! in Dekker's algorithm), so either the initiator sees the raised word and backs out, or
//! the owner sees the slot and waits for it to clear. Hence the guarantee: **once
//! [`Fence::raise`] with `e` returns, no operation stamped with an epoch older than `e`
//! touches the node's memory**, unless the slot was reclaimed because its writer could no
//! longer run (see [`Fence::raise`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// One initiator's slot: 0 when idle, else [`slot_value`] of the epoch it operates in.
/// A cache line of its own, so initiators do not share lines with each other.
#[repr(C, align(64))]
#[derive(Default)]
pub struct FenceSlot(pub AtomicU64);

const ACTIVE: u64 = 1 << 63;

/// The value an initiator stores in its slot: an active bit, the initiator's tag (its
/// incarnation, so that an owner can tell a dead incarnation's stale slot from a live
/// one's) and its epoch.
#[inline]
pub fn slot_value(tag: u32, epoch: u32) -> u64 {
    ACTIVE | ((tag as u64 & 0x7fff_ffff) << 32) | epoch as u64
}

/// The tag of a slot value (31 bits).
#[inline]
pub fn slot_tag(v: u64) -> u32 {
    ((v >> 32) & 0x7fff_ffff) as u32
}

/// A node's fence: its epoch word and the slots of every endpoint of the cluster.
#[derive(Clone, Copy)]
pub struct Fence<'a> {
    pub epoch: &'a AtomicU64,
    pub slots: &'a [FenceSlot],
}

/// How [`Fence::raise`] went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RaiseStats {
    /// Slots that held an older epoch when looked at (operations the owner waited for).
    pub waited: u64,
    /// Slots cleared because their writer was dead.
    pub reclaimed: u64,
}

impl Fence<'_> {
    /// Initiator: enters the fence in slot `slot` for operations of `epoch`. Returns
    /// false, holding nothing, if the node moved to a newer epoch (or `slot` does not
    /// exist). On true, call [`Fence::leave`] when done with the node's memory.
    #[inline]
    pub fn enter(&self, slot: usize, tag: u32, epoch: u32) -> bool {
        let Some(s) = self.slots.get(slot) else {
            return false;
        };
        s.0.store(slot_value(tag, epoch), Ordering::SeqCst);
        if (epoch as u64) < self.epoch.load(Ordering::SeqCst) {
            s.0.store(0, Ordering::Release);
            return false;
        }
        true
    }

    /// Initiator: leaves the fence entered in `slot`; every access made inside it is
    /// visible to an owner that then sees the slot clear.
    #[inline]
    pub fn leave(&self, slot: usize) {
        if let Some(s) = self.slots.get(slot) {
            s.0.store(0, Ordering::Release);
        }
    }

    /// The node's current epoch (the highest any of its endpoints moved to).
    pub fn current(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Owner: raises the node's epoch to at least `epoch`, then waits until every
    /// initiator inside the fence with an older epoch has left. It never gives up on a
    /// live initiator: a slot is abandoned only when `dead(slot, value)` says that the
    /// initiator which stored `value` can no longer access memory (its process is gone);
    /// it is asked only after the slot stayed busy for a while, about once a millisecond.
    pub fn raise(&self, epoch: u32, mut dead: impl FnMut(usize, u64) -> bool) -> RaiseStats {
        self.epoch.fetch_max(epoch as u64, Ordering::SeqCst);
        let mut stats = RaiseStats::default();
        for (i, s) in self.slots.iter().enumerate() {
            let mut spins = 0u32;
            loop {
                let v = s.0.load(Ordering::SeqCst);
                if v & ACTIVE == 0 || (v as u32) >= epoch {
                    break;
                }
                if spins == 0 {
                    stats.waited += 1;
                }
                spins = spins.saturating_add(1);
                if spins < 64 {
                    std::hint::spin_loop();
                } else if spins < 1024 {
                    std::thread::yield_now();
                } else {
                    if dead(i, v)
                        && s.0
                            .compare_exchange(v, 0, Ordering::SeqCst, Ordering::SeqCst)
                            .is_ok()
                    {
                        stats.reclaimed += 1;
                        continue;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fence(n: usize) -> (AtomicU64, Vec<FenceSlot>) {
        (
            AtomicU64::new(1),
            (0..n).map(|_| FenceSlot::default()).collect(),
        )
    }

    #[test]
    fn older_epochs_back_out() {
        let (w, s) = fence(2);
        let f = Fence {
            epoch: &w,
            slots: &s,
        };
        assert!(f.enter(0, 1, 1));
        f.leave(0);
        assert_eq!(f.raise(2, |_, _| false), RaiseStats::default());
        assert!(!f.enter(0, 1, 1), "an older epoch entered");
        assert_eq!(
            s[0].0.load(Ordering::SeqCst),
            0,
            "a refused entry holds its slot"
        );
        assert!(f.enter(1, 1, 2));
        assert!(f.enter(0, 1, 3), "a newer epoch is not refused");
        f.leave(0);
        f.leave(1);
        assert!(!f.enter(5, 1, 2), "a slot outside the fence");
    }

    #[test]
    fn raise_waits_for_older_slots_and_reclaims_dead_ones() {
        let (w, s) = fence(3);
        let f = Fence {
            epoch: &w,
            slots: &s,
        };
        assert!(f.enter(0, 7, 1));
        assert!(f.enter(1, 7, 1));
        // Slot 0's writer is dead: reclaimed. Slot 1's leaves from another thread, once
        // the raise has waited for it long enough to ask whether it is dead (a fixed
        // sleep instead raced with a loaded machine's slow reclaim of slot 0).
        let asked_about_1 = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|sc| {
            let (s1, asked) = (&s[1], &asked_about_1);
            sc.spawn(move || {
                while !asked.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                s1.0.store(0, Ordering::Release);
            });
            let st = f.raise(2, |i, v| {
                if i == 1 {
                    asked_about_1.store(true, Ordering::Release);
                }
                i == 0 && slot_tag(v) == 7
            });
            assert_eq!(st.waited, 2);
            assert_eq!(st.reclaimed, 1);
        });
        assert!(s.iter().all(|x| x.0.load(Ordering::SeqCst) == 0));
        assert_eq!(f.current(), 2);
    }
}
