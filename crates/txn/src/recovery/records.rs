//! The log records a node holds, as (transaction, write) pairs.

use crate::db::NodeDb;
use crate::log::LogReplica;
use crate::log_ring::format;
use crate::log_ring::region::{scan_ring_with, ScanMode};
use crate::messages::{Reader, WriteRec};

/// Calls `f(txn, write)` for every write of every record in `log` (a thread's log
/// replica). Returns the records read. A record that does not decode whole (it came
/// from the network) is skipped whole: part of a transaction is never replayed.
pub fn in_log(log: &LogReplica, f: &mut dyn FnMut(u64, &WriteRec<'_>)) -> u64 {
    let mut n = 0;
    let mut writes = Vec::new();
    for (txn, rec) in log.iter() {
        writes.clear();
        let mut r = Reader::new(&rec.writes);
        let whole = loop {
            if r.pos() >= rec.writes.len() {
                break true;
            }
            match WriteRec::decode(&mut r) {
                Ok(w) => writes.push(w),
                Err(_) => break false,
            }
        };
        if whole {
            n += 1;
            for w in &writes {
                f(txn, w);
            }
        }
    }
    n
}

/// Calls `f(txn, write)` for every write of every valid record in `db`'s log rings
/// from their heads on (records not truncated yet; holes and torn slots passed over
/// as [`ScanMode::Recover`] reads them). Returns the records read.
pub fn in_rings(db: &NodeDb, f: &mut dyn FnMut(u64, &WriteRec<'_>)) -> u64 {
    let region = db.log_region();
    let mut n = 0;
    for ring in region.rings() {
        let (Some(r), Some(head)) = (region.ring(ring), region.head(ring)) else {
            continue;
        };
        scan_ring_with(&r, head, ScanMode::Recover, &mut |rec| {
            n += 1;
            let (txn, writes) = format::accepted_writes(rec);
            for w in writes {
                f(txn, &w);
            }
        });
    }
    n
}
