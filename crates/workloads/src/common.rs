//! Pieces every workload shares: the workload trait the driver runs, transaction
//! outcomes, fixed-layout row helpers, random draws (NURand), and warehouse-aware key
//! placement through the public [`Placement`] API.

use ambidex_txn::runner::WorkerCtx;
use ambidex_txn::{AbortReason, NodeDb, Placement, TableSpec};
use rand::rngs::SmallRng;
use rand::Rng;
use std::sync::Arc;

/// How one transaction attempt ended, as the workload sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Committed; `found` is false for a transaction that completed without finding its
    /// row (TATP's "not found" cases, counted as committed per WORKLOADS.md).
    Committed { found: bool },
    /// Aborted by the protocol (conflict, timeout) or by the application.
    Aborted(AbortReason),
}

impl Outcome {
    pub const FOUND: Outcome = Outcome::Committed { found: true };
    pub const NOT_FOUND: Outcome = Outcome::Committed { found: false };
}

/// Where rows go while loading. Each loader thread owns some nodes and stores only on
/// them, so no two threads insert into one table (the store's insert path has shared
/// per-table counters that two writers would bounce between cores).
pub struct Loader<'a> {
    pub dbs: &'a [Arc<NodeDb>],
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
    pub fn put(&self, table: u32, key: u64, value: &[u8]) -> Result<(), String> {
        for db in self.dbs {
            if self.owns(db.node) {
                db.load(table, key, value).map_err(|e| e.to_string())?;
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

    fn name(&self) -> &'static str;
    fn tables(&self) -> Vec<TableSpec>;
    /// Names of the transaction types, indexed as `run_one` reports them.
    fn txn_types(&self) -> &'static [&'static str];
    fn load_units(&self) -> u64;
    fn load_unit(&self, unit: u64, rng: &mut SmallRng, out: &Loader<'_>) -> Result<(), String>;
    /// Called once after every unit is loaded (building indexes and such).
    fn after_load(&self, _dbs: &[Arc<NodeDb>]) -> Result<(), String> {
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
    fn check(&self, _dbs: &[Arc<NodeDb>]) -> Result<serde_json::Value, String> {
        Ok(serde_json::Value::Null)
    }

    /// The share of [`Workload::check`] one node computes from its own database, in a
    /// cluster whose nodes run in separate processes (`ambidex node`): partial sums and
    /// counts, or a violation found locally. The node's own process state (this
    /// workload's counters of the workers it ran) goes in too.
    fn check_node(&self, _db: &Arc<NodeDb>) -> Result<serde_json::Value, String> {
        Ok(serde_json::Value::Null)
    }

    /// Combines every node's [`Workload::check_node`] (in node order) into what
    /// [`Workload::check`] returns for the whole cluster: the same summary on success,
    /// the violation on failure. Runs in the launcher, on a workload that was not loaded.
    /// `parts` come from other processes: malformed parts are an error, never a panic.
    fn check_combine(&self, _parts: &[serde_json::Value]) -> Result<serde_json::Value, String> {
        Ok(serde_json::Value::Null)
    }
}

/// Field `name` of a node's partial check, as an i64 (for [`Workload::check_combine`]).
pub fn part_i64(part: &serde_json::Value, node: usize, name: &str) -> Result<i64, String> {
    part.get(name)
        .and_then(serde_json::Value::as_i64)
        .ok_or_else(|| format!("node {node}'s check lacks the integer {name:?}"))
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
pub fn loaded_initial(parts: &[serde_json::Value], name: &str, what: &str) -> Result<i64, String> {
    let first = parts.iter().position(|p| !restarted_part(p)).unwrap_or(0);
    let initial = part_i64(&parts[first], first, name)?;
    for (n, p) in parts.iter().enumerate() {
        if !restarted_part(p) && part_i64(p, n, name)? != initial {
            return Err(format!(
                "node {n} loaded a different {what} than node {first} (another seed or scale?)"
            ));
        }
    }
    Ok(initial)
}

/// The nodes of `0..nodes` with no part from a loaded (not restarted) incarnation: they
/// died, or restarted, and what their workers committed is not in the parts.
pub fn unreported_nodes(parts: &[serde_json::Value], nodes: u16) -> Result<Vec<u16>, String> {
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

// ----- fixed-layout rows -----

#[inline]
pub fn get_i64(b: &[u8], off: usize) -> i64 {
    i64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

#[inline]
pub fn put_i64(b: &mut [u8], off: usize, v: i64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// Adds `delta` to the i64 at `off`.
#[inline]
pub fn add_i64(b: &mut [u8], off: usize, delta: i64) {
    let v = get_i64(b, off);
    put_i64(b, off, v + delta);
}

#[inline]
pub fn get_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}

#[inline]
pub fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

/// Fills `b` with random alphanumeric characters.
pub fn rand_str(rng: &mut SmallRng, b: &mut [u8]) {
    const A: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    for c in b {
        *c = A[rng.gen_range(0..A.len())];
    }
}

/// Uniform in [lo, hi] (inclusive), as the TPC specs write it.
#[inline]
pub fn urand(rng: &mut SmallRng, lo: u64, hi: u64) -> u64 {
    rng.gen_range(lo..=hi)
}

/// TPC's non-uniform random `NURand(A, x, y) = (((rand(0, A) | rand(x, y)) + C) % (y − x + 1)) + x`.
/// TATP's form is the special case x = 1, C = 0.
#[inline]
pub fn nurand(rng: &mut SmallRng, a: u64, x: u64, y: u64, c: u64) -> u64 {
    (((urand(rng, 0, a) | urand(rng, x, y)) + c) % (y - x + 1)) + x
}

/// The A of TATP's NURand for a population of `p` subscribers.
pub fn tatp_nurand_a(p: u64) -> u64 {
    if p <= 1_000_000 {
        65_535
    } else if p <= 10_000_000 {
        1_048_575
    } else {
        2_097_151
    }
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

/// Keys (primaries and backups) a node may have to store if `total` keys are spread by
/// hash, planned for the most failures the data survives: R − 1 nodes lost one after
/// another, each time re-replicated to the survivors, leaves `nodes − R + 1` members
/// holding R copies of everything (at least R members: with fewer, copies are not
/// made), so each stores `total · R / max(R, nodes − R + 1)`; plus slack for the hash's
/// unevenness. Planned for one failure only, a survivor's table filled at the second
/// (5 nodes, R = 3: 3/4 of the keys planned, all of them needed), writes to its new
/// copies failed, and their primaries kept those writes' locks for ever.
/// Regions are mapped lazily, so the room planned and not used costs address space,
/// not memory.
pub fn per_node_capacity(total: u64, p: &Placement) -> usize {
    let (r, n) = (p.replication() as f64, p.nodes() as f64);
    let members_left = (n - r + 1.0).max(r).min(n);
    let share = total as f64 * r / members_left;
    (share * 1.1 + 1024.0) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// The room planned per node holds every copy a node is given after R − 1 nodes
    /// are lost one after another and re-replicated (the placement's own choices). With
    /// the old plan (one failure), 5 nodes of R = 3 overflowed at the second.
    #[test]
    fn the_planned_room_holds_the_copies_after_r_minus_one_failures() {
        let total = 200_000u64;
        for (nodes, r) in [(3u16, 3u16), (4, 3), (5, 3), (6, 3), (8, 3), (5, 2), (7, 2)] {
            let mut p = Placement::new(nodes, r).unwrap();
            let cap = per_node_capacity(total, &p);
            for gone in 0..(r - 1) {
                p = p.without(1 << gone).unwrap();
                for part in 0..p.partitions() {
                    for n in p.replicas_of(part).to_vec() {
                        p.mark_synced(part, n);
                    }
                }
                for n in (0..nodes).filter(|&n| p.is_member(n)) {
                    let held = (0..total).filter(|&k| p.stores(n, 1, k)).count();
                    assert!(
                        held <= cap,
                        "{nodes} nodes, R = {r}, after {} failures: node {n} holds {held} \
                         keys, room for {cap}",
                        gone + 1
                    );
                }
            }
        }
    }

    #[test]
    fn nurand_stays_in_bounds_and_is_skewed() {
        let mut rng = SmallRng::seed_from_u64(7);
        for &(a, x, y) in &[
            (65_535u64, 1u64, 3_000u64),
            (255, 0, 999),
            (1023, 1, 3000),
            (8191, 1, 100_000),
        ] {
            let mut hits = std::collections::HashMap::new();
            for _ in 0..200_000 {
                let v = nurand(&mut rng, a, x, y, 0);
                assert!((x..=y).contains(&v), "NURand({a},{x},{y}) = {v}");
                *hits.entry(v).or_insert(0u32) += 1;
            }
            // Non-uniform: the most drawn value is drawn far more often than the mean.
            let max = *hits.values().max().unwrap() as f64;
            let mean = 200_000.0 / (y - x + 1) as f64;
            assert!(
                max > 2.0 * mean,
                "NURand({a},{x},{y}) looks uniform: max {max}, mean {mean}"
            );
        }
        // The TATP form reaches both ends of [1, P].
        let p = 1000;
        let (mut lo, mut hi) = (u64::MAX, 0);
        for _ in 0..100_000 {
            let v = nurand(&mut rng, tatp_nurand_a(p), 1, p, 0);
            lo = lo.min(v);
            hi = hi.max(v);
        }
        assert_eq!((lo, hi), (1, p));
        assert_eq!(tatp_nurand_a(1_000_000), 65_535);
        assert_eq!(tatp_nurand_a(1_000_001), 1_048_575);
        assert_eq!(tatp_nurand_a(10_000_001), 2_097_151);
    }

    #[test]
    fn homed_keys_land_on_their_home_and_are_distinct() {
        let p = Placement::new(5, 3).unwrap();
        let mut seen = std::collections::HashSet::new();
        for k in 0..2_000u64 {
            for home in 0..5u16 {
                let key = homed_key(&p, 9, k, home);
                assert_eq!(p.primary(9, key), home);
                assert_eq!(key & ((1 << LOGICAL_BITS) - 1), k);
                assert!(seen.insert((key, home)));
            }
        }
    }
}
