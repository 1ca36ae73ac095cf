//! Named event counters. Every drop, error and retransmission of the transport is counted
//! here and exported in reports; nothing fails silently.
//!
//! The set is a `#[repr(C)]` array of atomics so that it can live in shared memory: a
//! sender increments the receiver's drop counters directly, as a NIC would count an
//! overflowing receive queue.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($name:ident => $text:literal,)*) => {
        /// One counted event kind.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Counter { $($name,)* }

        /// Names in report order, indexed by `Counter as usize`.
        pub const COUNTER_NAMES: &[&str] = &[$($text,)*];
    };
}

counters! {
    TxDatagrams => "tx_datagrams",
    TxDoorbells => "tx_doorbells",
    TxBytes => "tx_bytes",
    RxDatagrams => "rx_datagrams",
    RxBytes => "rx_bytes",
    RxDroppedQueueFull => "rx_dropped_queue_full",
    RxDroppedMalformed => "rx_dropped_malformed",
    RxDroppedWrongCluster => "rx_dropped_wrong_cluster",
    RxDroppedWrongEpoch => "rx_dropped_wrong_epoch",
    RxDroppedUnknownDest => "rx_dropped_unknown_dest",
    RxDroppedCorruptRing => "rx_dropped_corrupt_ring",
    OnesidedPosted => "onesided_posted",
    OnesidedErrors => "onesided_errors",
    OnesidedRetransmits => "onesided_retransmits",
    RemoteAccessViolations => "remote_access_violations",
    FaultDropped => "fault_dropped",
    FaultDuplicated => "fault_duplicated",
    FaultReordered => "fault_reordered",
    FaultDelayed => "fault_delayed",
    OnesidedEpochErrors => "onesided_epoch_errors",
    FenceWaits => "fence_waits",
    FenceReclaimed => "fence_reclaimed",
}

pub const NUM_COUNTERS: usize = COUNTER_NAMES.len();

/// A set of counters, safe to place in shared memory (all-zero bytes is a valid value).
#[repr(C)]
pub struct Counters {
    values: [AtomicU64; NUM_COUNTERS],
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            values: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Counters {
    #[inline]
    pub fn add(&self, c: Counter, n: u64) {
        if n != 0 {
            self.values[c as usize].fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Adds to a counter that only the calling thread writes (an endpoint's own): a plain
    /// load and store, no read-modify-write on the hot path.
    #[inline]
    pub fn add_owned(&self, c: Counter, n: u64) {
        let v = &self.values[c as usize];
        v.store(v.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }

    #[inline]
    pub fn get(&self, c: Counter) -> u64 {
        self.values[c as usize].load(Ordering::Relaxed)
    }

    pub fn snapshot(&self) -> CounterSnapshot {
        let mut s = CounterSnapshot::default();
        for (i, name) in COUNTER_NAMES.iter().enumerate() {
            s.0.insert((*name).to_string(), self.values[i].load(Ordering::Relaxed));
        }
        s
    }
}

/// A point-in-time copy of counters, mergeable across endpoints, nodes and processes.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CounterSnapshot(pub BTreeMap<String, u64>);

impl CounterSnapshot {
    pub fn get(&self, name: &str) -> u64 {
        self.0.get(name).copied().unwrap_or(0)
    }

    pub fn merge(&mut self, other: &CounterSnapshot) {
        for (k, v) in &other.0 {
            *self.0.entry(k.clone()).or_insert(0) += v;
        }
    }

    /// Counters that record a loss or an error (everything a report must show).
    pub fn drops_and_errors(&self) -> CounterSnapshot {
        CounterSnapshot(
            self.0
                .iter()
                .filter(|(k, _)| {
                    k.contains("dropped")
                        || k.contains("error")
                        || k.contains("violation")
                        || k.contains("retransmit")
                        || k.starts_with("fault_")
                })
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
        )
    }
}
