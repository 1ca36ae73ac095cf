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

use ambidex_transport::NodeId;
use std::collections::HashMap;

/// A logged commit record (the writes, encoded as sent).
pub struct LogRecord {
    pub coordinator: NodeId,
    pub writes: Vec<u8>,
}

#[derive(Default)]
pub struct LogReplica {
    records: HashMap<u64, LogRecord>,
    bytes: usize,
    pub appended: u64,
    pub truncated: u64,
}

impl LogReplica {
    pub fn append(&mut self, txn: u64, coordinator: NodeId, writes: &[u8]) {
        self.bytes += writes.len();
        if let Some(old) = self.records.insert(
            txn,
            LogRecord {
                coordinator,
                writes: writes.to_vec(),
            },
        ) {
            // A retransmitted LOG of the same transaction replaces its record.
            self.bytes -= old.writes.len();
        } else {
            self.appended += 1;
        }
    }

    pub fn truncate(&mut self, txn: u64) {
        if let Some(r) = self.records.remove(&txn) {
            self.bytes -= r.writes.len();
            self.truncated += 1;
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
}
