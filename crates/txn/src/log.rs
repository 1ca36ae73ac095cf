//! The in-memory coordinator log (FaSST §5 step 3): each node keeps replicas of the
//! commit records of the coordinators whose log replica it is. Memory is assumed
//! battery-backed (non-volatile) as in FaRM and FaSST; ambidex does not write logs to
//! disk.
//!
//! A record is kept until its transaction's updates are installed at every replica; the
//! coordinator then truncates it (piggybacked on its next LOG request to that replica),
//! so the log never grows beyond the transactions in flight.
//!
//! Replicas are per thread: with peer threads, coordinator thread t always logs to thread
//! t of a replica node, so no lock is needed.
//!
//! This is the log of `Log::Rpc` and of every coordinator's own node; with `Log::Write`
//! remote replicas hold the records in rings of registered memory instead
//! ([`crate::log_ring`]), and this replica only counts the rings' truncations.

use crate::stats::LogRingStats;
use ambidex_transport::NodeId;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Transaction ids are unique and well spread in their low bits (a per-thread sequence),
/// so one multiply mixes them enough; unlike SipHash it is cheap and the same in every
/// process (a deterministic simulation relies on that).
#[derive(Default)]
pub struct TxnIdHasher(u64);

impl Hasher for TxnIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ (v >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// Spare record buffers kept for reuse (bounded: the log of one thread's peers).
const SPARE_BUFFERS: usize = 1024;

/// A logged commit record (the writes, encoded as sent).
pub struct LogRecord {
    pub coordinator: NodeId,
    pub writes: Vec<u8>,
}

#[derive(Default)]
pub struct LogReplica {
    records: HashMap<u64, LogRecord, BuildHasherDefault<TxnIdHasher>>,
    spare: Vec<Vec<u8>>,
    bytes: usize,
    pub appended: u64,
    pub truncated: u64,
    /// What the truncations of log rings this thread served found (`replica_*`).
    pub ring: LogRingStats,
}

impl LogReplica {
    pub fn append(&mut self, txn: u64, coordinator: NodeId, writes: &[u8]) {
        self.bytes += writes.len();
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.extend_from_slice(writes);
        if let Some(old) = self.records.insert(
            txn,
            LogRecord {
                coordinator,
                writes: buf,
            },
        ) {
            // A retransmitted LOG of the same transaction replaces its record.
            self.bytes -= old.writes.len();
            self.recycle(old.writes);
        } else {
            self.appended += 1;
        }
    }

    /// Drops every record (recovery installed them everywhere).
    pub fn clear(&mut self) {
        let ids: Vec<u64> = self.records.keys().copied().collect();
        for id in ids {
            self.truncate(id);
        }
    }

    pub fn truncate(&mut self, txn: u64) {
        if let Some(r) = self.records.remove(&txn) {
            self.bytes -= r.writes.len();
            self.truncated += 1;
            self.recycle(r.writes);
        }
    }

    fn recycle(&mut self, mut buf: Vec<u8>) {
        if self.spare.len() < SPARE_BUFFERS {
            buf.clear();
            self.spare.push(buf);
        }
    }

    /// Records still held (transactions not yet known to be installed everywhere).
    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn get(&self, txn: u64) -> Option<&LogRecord> {
        self.records.get(&txn)
    }

    /// Every record held, by transaction (recovery).
    pub fn iter(&self) -> impl Iterator<Item = (u64, &LogRecord)> {
        self.records.iter().map(|(&t, r)| (t, r))
    }
}
