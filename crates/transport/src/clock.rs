//! The one source of time for everything above the operating system: the fault injector,
//! the udp backend's retransmission timers, the store's remote access, the RPC runtime
//! and the transaction layer all read a [`Clock`] they are given, never `Instant`. The
//! simulator gives every node a [`ManualClock`] it advances itself, so it owns all time
//! and a seed replays bit for bit.
//!
//! A process has one system clock ([`SystemClock::shared`]): every thread's timestamps
//! come from the same base, so the real-time bounds a history records on two threads of
//! one process are comparable.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A monotonic source of nanoseconds.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now_ns(&self) -> u64;
}

/// A clock shared by the parts of a node (or of a whole process).
pub type SharedClock = Arc<dyn Clock>;

/// Wall-clock time: monotonic (`Instant`) but offset to the Unix epoch, so values also
/// differ across process restarts (the runtime derives its session nonce from it) and
/// are roughly comparable across the processes of one host.
#[derive(Debug)]
pub struct SystemClock {
    base: Instant,
    base_unix_ns: u64,
}

impl SystemClock {
    pub fn new() -> Self {
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        SystemClock {
            base: Instant::now(),
            base_unix_ns: unix,
        }
    }

    /// The process's one system clock (made on first use).
    pub fn shared() -> SharedClock {
        static PROCESS: OnceLock<SharedClock> = OnceLock::new();
        PROCESS.get_or_init(|| Arc::new(SystemClock::new())).clone()
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        self.base_unix_ns + self.base.elapsed().as_nanos() as u64
    }
}

/// Time that moves only when told to (for simulators and deterministic tests).
#[derive(Debug, Default)]
pub struct ManualClock {
    ns: AtomicU64,
}

impl ManualClock {
    pub fn new(start_ns: u64) -> Self {
        ManualClock {
            ns: AtomicU64::new(start_ns),
        }
    }

    pub fn set(&self, ns: u64) {
        self.ns.store(ns, Ordering::Relaxed);
    }

    pub fn advance(&self, ns: u64) {
        self.ns.fetch_add(ns, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        self.ns.load(Ordering::Relaxed)
    }
}

/// Nanoseconds of a duration, saturating (a timeout of years is "never").
pub fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
