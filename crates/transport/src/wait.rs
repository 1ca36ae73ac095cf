//! Parking for pollers: an event count on a 32-bit word, usable across processes (the
//! word may live in shared memory) through the non-private futex calls.
//!
//! A receiver reads the count, announces itself as a sleeper, checks its queues again and
//! sleeps only if they are empty and the count is unchanged. A sender publishes, fences
//! and then checks for sleepers; only if there is one does it bump the count and wake it.
//! The two store-then-load sequences (Dekker's pattern) guarantee that either the sender
//! sees the sleeper or the sleeper sees the work, so an idle node costs no CPU and a busy
//! sender pays a fence and one load per doorbell.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

/// The shared words of one event count. `#[repr(C)]`, all-zero is valid.
#[repr(C)]
#[derive(Default)]
pub struct EventCount {
    pub count: AtomicU32,
    pub sleepers: AtomicU32,
}

impl EventCount {
    /// Called by a producer after publishing work. `scope` must be the one the sleeper
    /// waits with.
    #[inline]
    pub fn notify(&self, scope: Scope) {
        // The publishing store may be a mere release store (a ring's tail), and a later
        // load may pass a release store (x86 reorders a store with a later load). Without
        // this fence the producer could read "no sleeper" while the sleeper still reads
        // the old tail, and the sleeper would miss the wake-up for a whole timeout.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) != 0 {
            self.count.fetch_add(1, Ordering::SeqCst);
            futex_wake(&self.count, scope);
        }
    }

    /// The current count, to pass to [`EventCount::wait`].
    #[inline]
    pub fn observe(&self) -> u32 {
        self.count.load(Ordering::SeqCst)
    }

    /// Sleeps until the count differs from `observed` or `timeout` passes, unless
    /// `ready()` (re-checked after registering as a sleeper) says work is there.
    pub fn wait(
        &self,
        observed: u32,
        timeout: Duration,
        scope: Scope,
        ready: impl FnOnce() -> bool,
    ) {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        if !ready() && self.count.load(Ordering::SeqCst) == observed {
            futex_wait(&self.count, observed, timeout, scope);
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The flag of an endpoint's doorbell ([`crate::EndpointWaker`]), shared by the
/// threads that ring it and the poller that parks. The ringer publishes its work,
/// raises the flag and, if it raised it, wakes a sleeper (a fence and a sleeper check in
/// the backend); the poller checks the flag after announcing itself as a sleeper and
/// takes it when its wait ends. While the flag is up (the poller has not parked since the
/// last ring, as on a busy thread), ringing costs a fence and a load.
#[derive(Default)]
pub struct Doorbell {
    rung: AtomicBool,
}

impl Doorbell {
    /// Raises the flag after the caller published its work; true if it was down, and
    /// the caller must then wake a sleeper (with its own fence before the check).
    #[inline]
    pub fn raise(&self) -> bool {
        // The work must be visible before the flag is read: a poller that takes the flag
        // after this load resumes its coroutines after taking it, and they see the work.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.rung.load(Ordering::Relaxed) {
            return false;
        }
        self.rung.store(true, Ordering::Release);
        true
    }

    /// Whether the flag is up (the poller's check after announcing itself a sleeper).
    #[inline]
    pub fn is_up(&self) -> bool {
        self.rung.load(Ordering::SeqCst)
    }

    /// Lowers the flag; whether it was up.
    #[inline]
    pub fn take(&self) -> bool {
        self.rung.load(Ordering::Relaxed) && self.rung.swap(false, Ordering::AcqRel)
    }
}

/// Who may wait on or wake an event count: only this process's threads (cheaper: the
/// kernel keys the futex by address) or any process mapping the shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Process,
    Shared,
}

impl Scope {
    fn op(self, op: libc::c_int) -> libc::c_int {
        match self {
            Scope::Process => op | libc::FUTEX_PRIVATE_FLAG,
            Scope::Shared => op,
        }
    }
}

fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration, scope: Scope) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: word is a valid aligned u32; a spurious or failed wait is harmless.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word as *const AtomicU32,
            scope.op(libc::FUTEX_WAIT),
            expected,
            &ts as *const libc::timespec,
        );
    }
}

fn futex_wake(word: &AtomicU32, scope: Scope) {
    // SAFETY: word is a valid aligned u32.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word as *const AtomicU32,
            scope.op(libc::FUTEX_WAKE),
            i32::MAX,
        );
    }
}

/// Spin briefly, then park: the idle policy of every poller. On a machine with fewer
/// cores than busy threads, a poller that only spins steals the slice of the thread it
/// waits for; one that parks at once pays a wake-up on every message.
pub struct Backoff {
    idle_polls: u32,
}

impl Backoff {
    /// Empty polls before the first park.
    pub const SPINS: u32 = 16;

    pub fn new() -> Backoff {
        Backoff { idle_polls: 0 }
    }

    /// Call after a poll that found work.
    #[inline]
    pub fn reset(&mut self) {
        self.idle_polls = 0;
    }

    /// Call after a poll that found nothing: spins, then yields, then parks on `ep`.
    pub fn idle(&mut self, ep: &mut dyn crate::Endpoint) {
        self.idle_polls = self.idle_polls.saturating_add(1);
        if self.idle_polls < Self::SPINS {
            std::hint::spin_loop();
        } else if self.idle_polls < 2 * Self::SPINS {
            std::thread::yield_now();
        } else {
            ep.wait(Duration::from_millis(1));
        }
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}
