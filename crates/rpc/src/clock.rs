//! Time for the runtime comes only through [`Clock`], so a deterministic simulator can
//! supply simulated time (a [`ManualClock`] it advances itself).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A monotonic source of nanoseconds.
pub trait Clock: Send + Sync {
    fn now_ns(&self) -> u64;
}

/// Wall-clock time: monotonic (`Instant`) but offset to the Unix epoch, so values also
/// differ across process restarts (the runtime derives its session nonce from it).
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

    pub fn shared() -> Arc<dyn Clock> {
        Arc::new(SystemClock::new())
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
#[derive(Default)]
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
