//! Transaction recovery on a new configuration (issue 18; FaRM SOSP'15 §5.3,
//! simplified). Runs at stage Recover, once every member has moved to the new epoch,
//! so no write of the old epoch can still land, and before any transaction of the new
//! epoch starts.
//!
//! The decision rule: a transaction whose log record survives at any member is
//! committed. A record exists only once its transaction locked and validated its keys;
//! a transaction reported committed has its record at every replica, so with fewer
//! than R failures one survives. A transaction with no surviving record was never
//! reported committed (its coordinator died before its log was complete), so it is
//! aborted: its locks are released.
//!
//! The rule needs a coordinator never to abort a transaction once its own record is
//! written: a failed LOG or ring WRITE is sent again until it lands or the
//! configuration changes, and then the transaction is committed by this recovery
//! (`phases::log`, `Txn::commit`). Node threads run it through `thread` when their
//! node has a manager (in-process runs with `RunSpec::manager`, and node processes).
//!
//! - [`records`]: the writes of every record a node holds: its threads' log replicas
//!   (`Log::Rpc` records and every coordinator's own) and its log rings (`Log::Write`).
//! - [`replay`]: sends each write to every replica of its key in the new configuration
//!   (RECOVER), where [`crate::actions::recover_write`] installs it under the
//!   coordinator's surviving lock or applies it to an older copy, by version, so the
//!   same write recovered from several records changes nothing twice.
//! - [`locks`]: releases every lock of the old epoch (thread 0 of each member, before
//!   its replays: see `thread`).
//! - `rereplicate`: a primary copies its partitions to their syncing backups, paced,
//!   while transactions run (thread 0, at stage Run).
//! - `thread`: a node thread's adopt, recover and copy steps between runtime steps.

pub mod locks;
pub mod records;
pub mod replay;
pub(crate) mod rereplicate;
pub(crate) mod thread;

pub use thread::{NodeWatch, ThreadRecovery};

/// What one thread's recovery did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RecoveryStats {
    /// Log records read (rings and log replicas).
    pub records: u64,
    /// Writes sent to a replica (or applied locally), counted per replica.
    pub writes_sent: u64,
    /// Replicas' outcomes.
    pub installed: u64,
    pub applied: u64,
    pub older: u64,
    /// Entries sent again after meeting another lock.
    pub busy_retries: u64,
    /// Writes a replica refused (malformed or foreign records).
    pub refused: u64,
    /// Locks of the old epoch released.
    pub locks_released: u64,
    /// Replays started again after one could not finish (a replica kept a key
    /// locked, or did not answer).
    pub replays_repeated: u64,
    /// Re-replication (this node as a primary): items copied to syncing backups, the
    /// COPY and COPY_DONE requests taken and their bytes, partitions done, and copies
    /// that stopped before they were done (an epoch change, the run's end, a backup
    /// that did not answer).
    pub items_copied: u64,
    pub copy_requests: u64,
    pub copy_bytes: u64,
    pub partitions_copied: u64,
    pub copies_unfinished: u64,
}

impl RecoveryStats {
    pub fn merge(&mut self, o: &RecoveryStats) {
        self.records += o.records;
        self.writes_sent += o.writes_sent;
        self.installed += o.installed;
        self.applied += o.applied;
        self.older += o.older;
        self.busy_retries += o.busy_retries;
        self.refused += o.refused;
        self.locks_released += o.locks_released;
        self.replays_repeated += o.replays_repeated;
        self.items_copied += o.items_copied;
        self.copy_requests += o.copy_requests;
        self.copy_bytes += o.copy_bytes;
        self.partitions_copied += o.partitions_copied;
        self.copies_unfinished += o.copies_unfinished;
    }

    /// Counts a replica's outcome of one write.
    pub(crate) fn count(&mut self, r: crate::actions::Recovered) {
        use crate::actions::Recovered::*;
        match r {
            Installed => self.installed += 1,
            Applied => self.applied += 1,
            Older => self.older += 1,
            Busy => self.busy_retries += 1,
            Refused => self.refused += 1,
        }
    }
}
