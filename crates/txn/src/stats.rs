//! What the transaction layer counts: outcomes, abort reasons, and time per phase.

use serde::{Deserialize, Serialize};
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
    /// A write-set key was locked by another transaction at the lock phase (a lock
    /// taken after execute: a CAS, or a LOCK RPC after a one-sided execute).
    LockedAtLock,
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
    /// A one-sided phase needed a table of another node that the cluster's catalog
    /// does not have (started without a catalog, or an unknown table).
    NoRemoteTable,
    /// A log replica's ring stayed full (records not yet truncated) for the whole wait.
    LogFull,
    /// The commit record is larger than half a log ring.
    LogRecordTooLarge,
    /// A log replica's ring is not known (no catalog, or its descriptor has no ring for
    /// this coordinator).
    LogRingUnknown,
    /// The cluster moved to a new configuration before the transaction's log began;
    /// recovery released its locks.
    EpochChanged,
    /// A node the transaction needed is not a member (it failed and was removed).
    NodeFailed,
    /// This node lost its lease (or was removed): it runs no transaction, and one
    /// whose log began has an outcome only the survivors' recovery knows.
    Fenced,
}

impl AbortReason {
    /// Every reason, so reports can parse names back (`name` of each is distinct).
    pub const ALL: [AbortReason; 17] = [
        AbortReason::LockedAtExecute,
        AbortReason::MissingKey,
        AbortReason::InsertExists,
        AbortReason::LockedAtLock,
        AbortReason::LockedAtValidate,
        AbortReason::VersionChanged,
        AbortReason::TableFull,
        AbortReason::Timeout,
        AbortReason::BadResponse,
        AbortReason::User,
        AbortReason::NoRemoteTable,
        AbortReason::LogFull,
        AbortReason::LogRecordTooLarge,
        AbortReason::LogRingUnknown,
        AbortReason::EpochChanged,
        AbortReason::NodeFailed,
        AbortReason::Fenced,
    ];

    /// True if trying the same transaction again can commit it: a conflict with
    /// another transaction, or a failure the cluster gets over by itself (a timeout, a
    /// full log ring, a reconfiguration). False for the application's own abort, a
    /// missing or existing key, a full table, a malformed answer, a misconfigured
    /// cluster and a fenced node: the same attempt would end the same way.
    pub fn is_transient(self) -> bool {
        match self {
            AbortReason::LockedAtExecute
            | AbortReason::LockedAtLock
            | AbortReason::LockedAtValidate
            | AbortReason::VersionChanged
            | AbortReason::Timeout
            | AbortReason::LogFull
            | AbortReason::EpochChanged
            | AbortReason::NodeFailed => true,
            AbortReason::MissingKey
            | AbortReason::InsertExists
            | AbortReason::TableFull
            | AbortReason::BadResponse
            | AbortReason::User
            | AbortReason::NoRemoteTable
            | AbortReason::LogRecordTooLarge
            | AbortReason::LogRingUnknown
            | AbortReason::Fenced => false,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            AbortReason::LockedAtExecute => "locked_at_execute",
            AbortReason::MissingKey => "missing_key",
            AbortReason::InsertExists => "insert_exists",
            AbortReason::LockedAtLock => "locked_at_lock",
            AbortReason::LockedAtValidate => "locked_at_validate",
            AbortReason::VersionChanged => "version_changed",
            AbortReason::TableFull => "table_full",
            AbortReason::Timeout => "timeout",
            AbortReason::BadResponse => "bad_response",
            AbortReason::User => "user",
            AbortReason::NoRemoteTable => "no_remote_table",
            AbortReason::LogFull => "log_full",
            AbortReason::LogRecordTooLarge => "log_record_too_large",
            AbortReason::LogRingUnknown => "log_ring_unknown",
            AbortReason::EpochChanged => "epoch_changed",
            AbortReason::NodeFailed => "node_failed",
            AbortReason::Fenced => "fenced",
        }
    }
}

impl std::fmt::Display for AbortReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The protocol's phases, for the per-phase breakdown (DrTM+H Figure 15).
///
/// `Lock` is a phase of its own, but with [`crate::policy::Lock::Rpc`] the write-set keys
/// are locked in the execute round trip (FaSST §5 step 1): its time is then part of
/// `Execute`, and `Lock` is not entered (count and time stay 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Execute = 0,
    Lock = 1,
    Validate = 2,
    Log = 3,
    CommitBackup = 4,
    CommitPrimary = 5,
}

impl Phase {
    pub const COUNT: usize = 6;
    /// Every phase, in protocol order.
    pub const ALL: [Phase; Phase::COUNT] = [
        Phase::Execute,
        Phase::Lock,
        Phase::Validate,
        Phase::Log,
        Phase::CommitBackup,
        Phase::CommitPrimary,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Phase::Execute => "execute",
            Phase::Lock => "lock",
            Phase::Validate => "validate",
            Phase::Log => "log",
            Phase::CommitBackup => "commit_backup",
            Phase::CommitPrimary => "commit_primary",
        }
    }
}

/// Phase names in protocol order.
pub const PHASE_NAMES: [&str; Phase::COUNT] = [
    "execute",
    "lock",
    "validate",
    "log",
    "commit_backup",
    "commit_primary",
];

/// One value per phase, indexed by [`Phase`]; serialized as an array in protocol order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct PhaseMap<T>(pub [T; Phase::COUNT]);

impl<T> std::ops::Index<Phase> for PhaseMap<T> {
    type Output = T;
    #[inline]
    fn index(&self, p: Phase) -> &T {
        &self.0[p as usize]
    }
}

impl<T> std::ops::IndexMut<Phase> for PhaseMap<T> {
    #[inline]
    fn index_mut(&mut self, p: Phase) -> &mut T {
        &mut self.0[p as usize]
    }
}

impl<T> From<[T; Phase::COUNT]> for PhaseMap<T> {
    fn from(a: [T; Phase::COUNT]) -> Self {
        PhaseMap(a)
    }
}

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
    /// Committed by recovery: the cluster changed configuration during its log phase,
    /// after its coordinator's own record was written (counted in `committed` too).
    pub committed_by_recovery: u64,
    /// Nanoseconds spent in each phase by committed transactions, and how many entered it.
    pub phase_ns: PhaseMap<u64>,
    pub phase_count: PhaseMap<u64>,
    /// Log records appended and truncated at this thread's log replica, and still held
    /// (with `Log::Write`, remote appends are one-sided, so the replica counts a ring's
    /// records when it truncates them, and `log_records_held` adds this thread's
    /// records in remote rings not yet released).
    pub log_appended: u64,
    /// Log records sent again to replicas that had not taken them (a LOG RPC or a ring
    /// WRITE failed): once sent, a record is committed, so it is retried until every
    /// replica has it or the configuration changes.
    pub log_retries: u64,
    pub log_truncated: u64,
    pub log_records_held: u64,
    /// The one-sided log (`Log::Write`): this thread's rings as a coordinator, and the
    /// rings it truncated as a replica.
    pub log_ring: LogRingStats,
    /// Location-cache lookups of this thread's coordinators.
    pub location_cache: LocationCacheStats,
    /// Failed unsignaled one-sided operations reported to this thread's workers (each
    /// also decided its phase's outcome where it mattered; counted so that none goes
    /// unnoticed).
    pub onesided_unsignaled_failures: u64,
}

/// How the location cache served one thread's coordinators (DrTM+H §5.1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocationCacheStats {
    /// Lookups that found an address, whose item READ then held the key.
    pub hits: u64,
    /// Lookups that found nothing.
    pub misses: u64,
    /// Lookups that found an address whose item no longer held the key (the entry was
    /// dropped and the key fetched another way).
    pub stale: u64,
}

/// What the one-sided log did (DrTM+H §5.4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogRingStats {
    /// Coordinator: records WRITTEN to remote rings (one per replica), their bytes,
    /// and pads to a ring's end.
    pub records_written: u64,
    pub bytes_written: u64,
    pub pads: u64,
    /// Coordinator: appends that failed at a replica (their slots voided), and void
    /// repairs landed.
    pub write_failures: u64,
    pub repairs: u64,
    /// Coordinator: transactions that found a ring full and waited.
    pub full_waits: u64,
    /// Coordinator: truncations sent (piggybacked or, with a full ring, alone) and
    /// acknowledged with released space.
    pub truncations_sent: u64,
    pub truncations_acked: u64,
    /// Replica: records passed by truncations (valid), voids skipped, malformed
    /// records (framed but undecodable: skipped, never applied) and truncations that
    /// stopped early at a torn or garbage slot.
    pub replica_records: u64,
    pub replica_voids: u64,
    pub replica_malformed: u64,
    pub replica_torn: u64,
    /// Replica: writes of truncated records applied to this node's backup copies,
    /// skipped because the copy was already newer (records of one key from different
    /// coordinators land in any order), and refused (the write does not fit its table:
    /// counted, never applied).
    pub backup_applied: u64,
    pub backup_older: u64,
    pub backup_refused: u64,
    /// Replica: truncations that moved nothing because the ring still held an older
    /// epoch's records (left to recovery's replay).
    #[serde(default)]
    pub truncations_deferred: u64,
    /// Coordinator: end-of-run drains that gave up with records left (a replica that
    /// did not answer; recovery's records).
    pub drain_gave_up: u64,
}

impl LogRingStats {
    pub fn merge(&mut self, o: &LogRingStats) {
        self.records_written += o.records_written;
        self.bytes_written += o.bytes_written;
        self.pads += o.pads;
        self.write_failures += o.write_failures;
        self.repairs += o.repairs;
        self.full_waits += o.full_waits;
        self.truncations_sent += o.truncations_sent;
        self.truncations_acked += o.truncations_acked;
        self.replica_records += o.replica_records;
        self.replica_voids += o.replica_voids;
        self.replica_malformed += o.replica_malformed;
        self.replica_torn += o.replica_torn;
        self.backup_applied += o.backup_applied;
        self.backup_older += o.backup_older;
        self.backup_refused += o.backup_refused;
        self.truncations_deferred += o.truncations_deferred;
        self.drain_gave_up += o.drain_gave_up;
    }
}

impl LocationCacheStats {
    pub fn merge(&mut self, o: &LocationCacheStats) {
        self.hits += o.hits;
        self.misses += o.misses;
        self.stale += o.stale;
    }
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
        self.committed_by_recovery += o.committed_by_recovery;
        self.log_retries += o.log_retries;
        for p in Phase::ALL {
            self.phase_ns[p] += o.phase_ns[p];
            self.phase_count[p] += o.phase_count[p];
        }
        self.log_appended += o.log_appended;
        self.log_truncated += o.log_truncated;
        self.log_records_held += o.log_records_held;
        self.location_cache.merge(&o.location_cache);
        self.onesided_unsignaled_failures += o.onesided_unsignaled_failures;
        self.log_ring.merge(&o.log_ring);
    }

    /// Mean microseconds per phase of committed transactions that ran the phase.
    pub fn phase_means_us(&self) -> BTreeMap<&'static str, f64> {
        Phase::ALL
            .iter()
            .map(|&p| {
                let m = if self.phase_count[p] == 0 {
                    0.0
                } else {
                    self.phase_ns[p] as f64 / self.phase_count[p] as f64 / 1000.0
                };
                (p.name(), m)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_abort_reason_is_listed_once_with_its_own_name() {
        let mut names: Vec<&str> = AbortReason::ALL.iter().map(|r| r.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), AbortReason::ALL.len());
        // A new reason must be added to ALL: this match stops compiling without it.
        for r in AbortReason::ALL {
            let listed = match r {
                AbortReason::LockedAtExecute
                | AbortReason::MissingKey
                | AbortReason::InsertExists
                | AbortReason::LockedAtLock
                | AbortReason::LockedAtValidate
                | AbortReason::VersionChanged
                | AbortReason::TableFull
                | AbortReason::Timeout
                | AbortReason::BadResponse
                | AbortReason::User
                | AbortReason::NoRemoteTable
                | AbortReason::LogFull
                | AbortReason::LogRecordTooLarge
                | AbortReason::LogRingUnknown
                | AbortReason::EpochChanged
                | AbortReason::NodeFailed
                | AbortReason::Fenced => true,
            };
            assert!(listed);
        }
    }

    #[test]
    fn phase_names_follow_the_enum() {
        for (i, p) in Phase::ALL.iter().enumerate() {
            assert_eq!(*p as usize, i);
            assert_eq!(PHASE_NAMES[i], p.name());
        }
    }
}
