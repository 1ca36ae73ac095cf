//! What the transaction layer counts: outcomes, abort reasons, and time per phase.

use serde::Serialize;
use std::collections::BTreeMap;

/// Why a transaction aborted. Every abort is counted under its reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AbortReason {
    /// A read- or write-set key was locked during execute.
    LockedAtExecute,
    /// Update or delete of a key that does not exist.
    MissingKey,
    /// Insert of a key that exists.
    InsertExists,
    /// A read-set key was locked at validation.
    LockedAtValidate,
    /// A read-set key's version changed between execute and validation.
    VersionChanged,
    /// The table at a key's home is full.
    TableFull,
    /// A node did not answer after the RPC layer's retries.
    Timeout,
    /// A response was malformed.
    BadResponse,
    /// The application aborted (for example SmallBank's insufficient funds).
    User,
}

impl AbortReason {
    pub fn name(self) -> &'static str {
        match self {
            AbortReason::LockedAtExecute => "locked_at_execute",
            AbortReason::MissingKey => "missing_key",
            AbortReason::InsertExists => "insert_exists",
            AbortReason::LockedAtValidate => "locked_at_validate",
            AbortReason::VersionChanged => "version_changed",
            AbortReason::TableFull => "table_full",
            AbortReason::Timeout => "timeout",
            AbortReason::BadResponse => "bad_response",
            AbortReason::User => "user",
        }
    }
}

impl std::fmt::Display for AbortReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The protocol's phases, for the per-phase breakdown (DrTM+H Figure 15).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Execute = 0,
    Validate = 1,
    Log = 2,
    CommitBackup = 3,
    CommitPrimary = 4,
}

pub const PHASE_NAMES: [&str; 5] = [
    "execute",
    "validate",
    "log",
    "commit_backup",
    "commit_primary",
];

/// Counters of one thread's coordinators (merge them for a node or a cluster).
#[derive(Clone, Debug, Default, Serialize)]
pub struct TxnStats {
    pub committed: u64,
    pub aborted: u64,
    pub aborts: BTreeMap<&'static str, u64>,
    pub read_only_committed: u64,
    /// Committed after the log was written but with some commit RPC unanswered: the
    /// decision is durable in the logs; recovery finishes the installation.
    pub committed_incomplete: u64,
    /// Nanoseconds spent in each phase by committed transactions, and how many entered it.
    pub phase_ns: [u64; 5],
    pub phase_count: [u64; 5],
    /// Log records appended and truncated at this thread's log replica.
    pub log_appended: u64,
    pub log_truncated: u64,
    pub log_records_held: u64,
}

impl TxnStats {
    pub fn abort(&mut self, r: AbortReason) {
        self.aborted += 1;
        *self.aborts.entry(r.name()).or_insert(0) += 1;
    }

    pub fn merge(&mut self, o: &TxnStats) {
        self.committed += o.committed;
        self.aborted += o.aborted;
        for (k, v) in &o.aborts {
            *self.aborts.entry(k).or_insert(0) += v;
        }
        self.read_only_committed += o.read_only_committed;
        self.committed_incomplete += o.committed_incomplete;
        for i in 0..5 {
            self.phase_ns[i] += o.phase_ns[i];
            self.phase_count[i] += o.phase_count[i];
        }
        self.log_appended += o.log_appended;
        self.log_truncated += o.log_truncated;
        self.log_records_held += o.log_records_held;
    }

    /// Mean microseconds per phase of committed transactions that ran the phase.
    pub fn phase_means_us(&self) -> BTreeMap<&'static str, f64> {
        (0..5)
            .map(|i| {
                let m = if self.phase_count[i] == 0 {
                    0.0
                } else {
                    self.phase_ns[i] as f64 / self.phase_count[i] as f64 / 1000.0
                };
                (PHASE_NAMES[i], m)
            })
            .collect()
    }
}
