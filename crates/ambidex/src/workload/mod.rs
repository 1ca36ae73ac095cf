//! What a workload is to the harness: the [`Workload`] trait the benchmark driver, node
//! processes and the simulator run (its tables, its loader, its transaction mix, its
//! invariant checks), transaction outcomes, the [`Loader`] rows go through, and helpers
//! for checks and key placement. A workload is made by a factory registered under its
//! name in a [`Registry`] (`registry`), so `ambidex bench` and `ambidex sim` run an
//! application's workload exactly as the built-in ones.
//!
//! Workloads run on the transaction layer's own API for speed: [`Txn`] (keys are `u64`,
//! values fixed-size bytes, tables numbered) inside worker coroutines ([`WorkerCtx`]);
//! the typed API of [`crate::Tx`] is for applications.

mod registry;

pub use registry::{Registrar, Registry, UnknownWorkload, WorkloadArgs, WorkloadInfo};

/// The transaction type workloads run (the transaction layer's, noting commits that
/// touched a failed node's data for the survival report).
pub use crate::bench::lost::Txn;
pub use ambidex_cluster::Stage;
pub use ambidex_store::OrderedIndex;
pub use ambidex_txn::runner::WorkerCtx;
pub use ambidex_txn::{
    AbortReason, Committed, Configuration, ItemId, NodeDb, Placement, TableSpec, WriteKind,
};

use rand::rngs::SmallRng;
use std::sync::Arc;

/// What a workload's own code fails with (a row it could not load, a violated
/// invariant, a malformed partial check from another node): any error type, so an
/// application's workload returns its own (`"text".into()` and `format!(..).into()`
/// work too).
pub type WorkloadError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Node-local access for workloads that keep per-node state beside the store (TPC-C's
/// owner-local order indexes): reading this node's copy of a key without a transaction.
pub mod local {
    pub use ambidex_txn::actions::read;
    pub use ambidex_txn::messages::Status;
}

/// How one transaction attempt ended, as the workload sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Committed.
    Committed {
        /// False for a transaction that completed without finding its row (TATP's "not
        /// found" cases, counted as committed per WORKLOADS.md).
        found: bool,
    },
    /// Aborted by the protocol (conflict, timeout) or by the application.
    Aborted(AbortReason),
}

impl Outcome {
    /// Committed, having found its row(s).
    pub const FOUND: Outcome = Outcome::Committed { found: true };
    /// Committed without finding its row.
    pub const NOT_FOUND: Outcome = Outcome::Committed { found: false };
}

/// Where rows go while loading. Each loader thread owns some nodes and stores only on
/// them, so no two threads insert into one table (the store's insert path has shared
/// per-table counters that two writers would bounce between cores).
pub struct Loader<'a> {
    dbs: &'a [Arc<NodeDb>],
    mine: Vec<bool>,
    first: bool,
}

impl<'a> Loader<'a> {
    /// A loader writing to the nodes `mine` selects (indexed by node id); `first` marks
    /// the one loader thread that performs the workload's process-wide side effects
    /// (sums, counters). `dbs` may hold every node's database (one process runs the
    /// whole cluster) or only some (a node process of a multi-process cluster).
    pub fn new(dbs: &'a [Arc<NodeDb>], mine: Vec<bool>, first: bool) -> Loader<'a> {
        Loader { dbs, mine, first }
    }

    /// Stores `key` on each of its replicas among this loader's nodes.
    pub fn put(&self, table: u32, key: u64, value: &[u8]) -> Result<(), ambidex_txn::DbError> {
        for db in self.dbs {
            if self.owns(db.node) {
                db.load(table, key, value)?;
            }
        }
        Ok(())
    }

    /// True if this loader writes node `node` (per-node side effects such as indexes).
    pub fn owns(&self, node: u16) -> bool {
        self.mine.get(node as usize).copied().unwrap_or(false)
    }

    /// True for exactly one loader thread.
    pub fn is_first(&self) -> bool {
        self.first
    }
}

/// A benchmark workload: its tables, its loader, and its transaction mix.
///
/// Loading is split into `load_units()` independent units, each with its own
/// deterministic random stream: every loader thread generates every unit and stores the
/// rows of its own nodes, so side effects outside the store must be guarded with
/// [`Loader::owns`] / [`Loader::is_first`]. A worker calls `run_one` in a loop.
pub trait Workload: Send + Sync + 'static {
    /// Per-worker-coroutine state (counters the workload checks at the end).
    type Local: Default + 'static;

    /// The workload's name in reports (usually the name it is registered under).
    fn name(&self) -> &'static str;
    /// The tables it uses: id, name, value size and the keys one node must hold.
    fn tables(&self) -> Vec<TableSpec>;
    /// Names of the transaction types, indexed as `run_one` reports them.
    fn txn_types(&self) -> &'static [&'static str];
    /// How many independent units loading is split into.
    fn load_units(&self) -> u64;
    /// Generates unit `unit` (of `0..load_units()`) from `rng`, that unit's own stream,
    /// and stores its rows through `out`.
    fn load_unit(
        &self,
        unit: u64,
        rng: &mut SmallRng,
        out: &Loader<'_>,
    ) -> Result<(), WorkloadError>;
    /// Called once after every unit is loaded (building indexes and such).
    fn after_load(&self, _dbs: &[Arc<NodeDb>]) -> Result<(), WorkloadError> {
        Ok(())
    }

    /// Runs one transaction of a type drawn from the mix; returns its type (an index
    /// into `txn_types`) and how it ended.
    #[allow(async_fn_in_trait)]
    async fn run_one(
        &self,
        w: &WorkerCtx,
        rng: &mut SmallRng,
        local: &mut Self::Local,
    ) -> (usize, Outcome);

    /// Per type, the found/committed rate the spec expects (TATP), if any.
    fn expected_found_rates(&self) -> Vec<Option<f64>> {
        Vec::new()
    }

    /// Folds a finished worker's state into the workload's totals.
    fn finish_worker(&self, _local: Self::Local) {}

    /// Folds what a running worker counted so far into the workload's totals (the
    /// simulator does it after every transaction, so what a worker of a crashed node
    /// counted is not lost with it); [`Workload::finish_worker`] folds the rest.
    fn fold_worker(&self, _local: &mut Self::Local) {}

    /// A write of a transaction whose coordinator died before it could count it, and
    /// that recovery committed: the value it overwrote and the value it wrote (`None`:
    /// absent or deleted). For invariants kept by counting commits (SmallBank's total).
    fn committed_by_recovery(&self, _table: u32, _old: Option<&[u8]>, _new: Option<&[u8]>) {}

    /// Checks the workload's invariants on the quiescent cluster; returns a JSON summary
    /// on success and the violation on failure.
    fn check(&self, _dbs: &[Arc<NodeDb>]) -> Result<serde_json::Value, WorkloadError> {
        Ok(serde_json::Value::Null)
    }

    /// How a check's summary reads in the report: `(invariant_ok, consistency_ok)`. By
    /// default a passing or failing check is an invariant (none is reported for a
    /// workload without a check, whose summary is null); TPC-C reports its consistency
    /// conditions, and a check that could not be made (SmallBank's total after a node
    /// died with its deltas) is neither.
    fn check_verdict(&self, summary: &serde_json::Value, ok: bool) -> (Option<bool>, Option<bool>) {
        (if summary.is_null() { None } else { Some(ok) }, None)
    }

    /// The share of [`Workload::check`] one node computes from its own database, in a
    /// cluster whose nodes run in separate processes (`ambidex node`): partial sums and
    /// counts, or a violation found locally. The node's own process state (this
    /// workload's counters of the workers it ran) goes in too.
    fn check_node(&self, _db: &Arc<NodeDb>) -> Result<serde_json::Value, WorkloadError> {
        Ok(serde_json::Value::Null)
    }

    /// Combines every node's [`Workload::check_node`] (in node order) into what
    /// [`Workload::check`] returns for the whole cluster: the same summary on success,
    /// the violation on failure. Runs in the launcher, on a workload that was not loaded.
    /// `parts` come from other processes: malformed parts are an error, never a panic.
    fn check_combine(
        &self,
        _parts: &[serde_json::Value],
    ) -> Result<serde_json::Value, WorkloadError> {
        Ok(serde_json::Value::Null)
    }
}

/// A node's partial check ([`Workload::check_node`]) that cannot be combined: it comes
/// from another process, so it is checked, never trusted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PartError {
    /// A field the combination needs is missing or not an integer.
    #[error("node {node}'s check lacks the integer {name:?}")]
    Missing {
        /// The node whose part it is.
        node: usize,
        /// The field.
        name: String,
    },
    /// Two loaded nodes report different initial totals.
    #[error("node {node} loaded a different {what} than node {first} (another seed or scale?)")]
    Differs {
        /// What differs.
        what: String,
        /// The node that differs.
        node: usize,
        /// The first loaded node, which the others are compared with.
        first: usize,
    },
}

/// Field `name` of a node's partial check, as an i64 (for [`Workload::check_combine`]).
pub fn part_i64(part: &serde_json::Value, node: usize, name: &str) -> Result<i64, PartError> {
    part.get(name)
        .and_then(serde_json::Value::as_i64)
        .ok_or_else(|| PartError::Missing {
            node,
            name: name.to_string(),
        })
}

/// Whether a node's partial check comes from a restarted incarnation (`"incarnation"` 2
/// or more, node processes): it loaded nothing and counted only its new incarnation's
/// work, so its rows count but its initial totals do not.
pub fn restarted_part(part: &serde_json::Value) -> bool {
    part.get("incarnation")
        .and_then(serde_json::Value::as_u64)
        .is_some_and(|i| i > 1)
}

/// The initial total `name` (`what`, in an error) every loaded node's part reports
/// (restarted ones aside); an error if two loaded nodes disagree (another seed or scale).
pub fn loaded_initial(
    parts: &[serde_json::Value],
    name: &str,
    what: &str,
) -> Result<i64, PartError> {
    let first = parts.iter().position(|p| !restarted_part(p)).unwrap_or(0);
    let initial = part_i64(&parts[first], first, name)?;
    for (n, p) in parts.iter().enumerate() {
        if !restarted_part(p) && part_i64(p, n, name)? != initial {
            return Err(PartError::Differs {
                what: what.to_string(),
                node: n,
                first,
            });
        }
    }
    Ok(initial)
}

/// The nodes of `0..nodes` with no part from a loaded (not restarted) incarnation: they
/// died, or restarted, and what their workers committed is not in the parts.
pub fn unreported_nodes(parts: &[serde_json::Value], nodes: u16) -> Result<Vec<u16>, PartError> {
    let reported: Vec<i64> = parts
        .iter()
        .enumerate()
        .filter(|(_, p)| !restarted_part(p))
        .map(|(n, p)| part_i64(p, n, "node"))
        .collect::<Result<_, _>>()?;
    Ok((0..nodes)
        .filter(|n| !reported.contains(&(*n as i64)))
        .collect())
}

/// Every live row of `table` at its primary: (key, value), sorted by key. Reads the
/// quiescent store directly (for invariant checks after a run).
pub fn primary_rows(dbs: &[Arc<NodeDb>], table: u32) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    for db in dbs {
        for (key, meta, value) in db.dump(table) {
            if meta & ambidex_txn::db::TOMBSTONE == 0
                && db.placement().primary(table, key) == db.node
            {
                out.push((key, value));
            }
        }
    }
    out.sort_unstable_by_key(|e| e.0);
    out
}

// ----- placement -----

/// Bits of a logical key that [`homed_key`] keeps; the top byte is the salt.
pub const LOGICAL_BITS: u32 = 56;

/// The physical key of logical key `k` of `table` whose primary is `home`.
///
/// `Placement` chooses a key's primary by a hash of (table, key) and has no hook for a
/// partition key, so warehouse-partitioned TPC-C rows are given keys whose hash lands on
/// the warehouse's home: the top byte of the key is a salt, the smallest one for which
/// `Placement::primary` gives `home` (about `nodes` tries, each a few nanoseconds). Only
/// the public `primary` function is used, so this stays correct if the hash changes.
/// The salted key is recomputed, never stored, so lookups by logical key stay exact.
#[inline]
pub fn homed_key(p: &Placement, table: u32, k: u64, home: u16) -> u64 {
    debug_assert!(
        k < 1 << LOGICAL_BITS,
        "logical key {k:#x} needs more than 56 bits"
    );
    for salt in 0..=255u64 {
        let key = salt << LOGICAL_BITS | k;
        if p.primary(table, key) == home {
            return key;
        }
    }
    // Probability (1 - 1/n)^256: never for real clusters; a clear failure otherwise.
    panic!("no salt places key {k:#x} of table {table} on node {home}");
}

/// Per-thread SmallRng seeds that differ by node, thread and coroutine.
pub fn worker_seed(seed: u64, node: u16, thread: u16, coroutine: usize) -> u64 {
    let mut x = seed ^ 0x5851_f42d_4c95_7f2d;
    for v in [node as u64, thread as u64, coroutine as u64] {
        x = (x ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^= x >> 29;
    }
    x
}
