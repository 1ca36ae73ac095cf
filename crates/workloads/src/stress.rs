//! FaSST's `stress` correctness workload (../shared/WORKLOADS.md "Stress"): a table of
//! u64 → u64 whose keys come in groups of [`GROUP`] consecutive keys. A transaction
//! picks a group and reads all of its keys, sets all of them to one random value, or
//! deletes all of them. The invariant: a committed read sees every key of its group
//! with one identical value, or none of them; and so does the final state.
//!
//! Groups are aligned (group g is keys g·GROUP .. g·GROUP + GROUP − 1): with overlapping
//! ranges no such invariant holds. A set of a deleted group inserts its keys: it first
//! tries updates and, when the group is absent (`missing_key`), inserts them in a new
//! transaction. A group partly present is a violation: a committed read that sees one
//! is counted, and the final state's check names it.

use crate::common::{part_i64, primary_rows, Loader, Outcome, Workload};
use ambidex::workload::Txn;
use ambidex::workload::WorkerCtx;
use ambidex::workload::WorkloadError;
use ambidex::workload::{AbortReason, NodeDb, Placement, TableSpec, WriteKind};
use rand::rngs::SmallRng;
use rand::Rng;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub const STRESS: u32 = 40;
/// Keys per group (a transaction's keys).
pub const GROUP: u64 = 4;
/// Groups per node at scale 1.
pub const GROUPS_PER_NODE: u64 = 250_000;
pub const VALUE_SIZE: usize = 8;

const TYPES: &[&str] = &["read", "set", "delete"];
/// The mix, in percent: read, set, delete.
const MIX: [u32; 3] = [40, 40, 20];

/// A violation of the stress test's invariant (a malformed partial check from another
/// node is the facade's `PartError`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StressError {
    /// Committed reads saw a group partly present or with differing values.
    #[error("{reads} committed read(s) saw a group neither whole nor absent")]
    TornReads {
        /// How many.
        reads: u64,
    },
    /// The final state has a group partly present or with differing values.
    #[error("group {group} ends with {present} of {GROUP} keys present (or differing values)")]
    TornGroup {
        /// The group.
        group: u64,
        /// Its keys present.
        present: usize,
    },
}

pub struct Stress {
    pub groups: u64,
    placement: Placement,
    /// Committed reads that saw a group neither whole nor absent.
    read_violations: AtomicU64,
    /// Committed reads (this process's workers).
    reads: AtomicU64,
}

impl Stress {
    pub fn new(placement: Placement, scale: f64) -> Stress {
        let groups = ((GROUPS_PER_NODE as f64 * scale) as u64 * placement.nodes() as u64).max(16);
        Stress {
            groups,
            placement,
            read_violations: AtomicU64::new(0),
            reads: AtomicU64::new(0),
        }
    }

    /// Key `i` of group `g`.
    fn key(g: u64, i: usize) -> u64 {
        g * GROUP + i as u64
    }

    /// Whether the values a read saw (`None`: absent) are a whole group or none of it.
    pub fn consistent(seen: &[Option<u64>]) -> bool {
        match seen.first() {
            None => true,
            Some(first) => seen.iter().all(|v| v == first),
        }
    }

    async fn read(&self, w: &WorkerCtx, g: u64) -> Outcome {
        let mut t = Txn::begin(&w.ctx, &w.th);
        let items: [_; GROUP as usize] = std::array::from_fn(|i| t.read(STRESS, Self::key(g, i)));
        if let Err(r) = t.execute().await {
            return Outcome::Aborted(r);
        }
        let seen: [Option<u64>; GROUP as usize] = std::array::from_fn(|i| {
            t.get(items[i])
                .and_then(|v| v.get(..8))
                .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
        });
        match t.commit().await {
            Ok(_) => {
                self.reads.fetch_add(1, Ordering::Relaxed);
                if !Self::consistent(&seen) {
                    self.read_violations.fetch_add(1, Ordering::Relaxed);
                }
                if seen[0].is_some() {
                    Outcome::FOUND
                } else {
                    Outcome::NOT_FOUND
                }
            }
            Err(r) => Outcome::Aborted(r),
        }
    }

    async fn write_all(&self, w: &WorkerCtx, g: u64, kind: WriteKind, value: u64) -> Outcome {
        let mut t = Txn::begin(&w.ctx, &w.th);
        let items: [_; GROUP as usize] =
            std::array::from_fn(|i| t.write(STRESS, Self::key(g, i), kind));
        if let Err(r) = t.execute().await {
            return Outcome::Aborted(r);
        }
        if kind != WriteKind::Delete {
            for &it in &items {
                t.set(it, &value.to_le_bytes());
            }
        }
        match t.commit().await {
            Ok(_) => Outcome::FOUND,
            Err(r) => Outcome::Aborted(r),
        }
    }
}

impl Workload for Stress {
    type Local = ();

    fn name(&self) -> &'static str {
        "stress"
    }

    fn tables(&self) -> Vec<TableSpec> {
        vec![TableSpec {
            id: STRESS,
            name: "stress".into(),
            value_size: VALUE_SIZE,
            capacity_per_node: crate::common::per_node_capacity(
                self.groups * GROUP,
                &self.placement,
            ),
        }]
    }

    fn txn_types(&self) -> &'static [&'static str] {
        TYPES
    }

    fn load_units(&self) -> u64 {
        self.groups.div_ceil(1024)
    }

    fn load_unit(
        &self,
        unit: u64,
        rng: &mut SmallRng,
        out: &Loader<'_>,
    ) -> Result<(), WorkloadError> {
        for g in unit * 1024..((unit + 1) * 1024).min(self.groups) {
            let v: u64 = rng.gen();
            for i in 0..GROUP as usize {
                out.put(STRESS, Self::key(g, i), &v.to_le_bytes())?;
            }
        }
        Ok(())
    }

    async fn run_one(&self, w: &WorkerCtx, rng: &mut SmallRng, _: &mut ()) -> (usize, Outcome) {
        let g = rng.gen_range(0..self.groups);
        let pick = rng.gen_range(0..100u32);
        let ty = if pick < MIX[0] {
            0
        } else if pick < MIX[0] + MIX[1] {
            1
        } else {
            2
        };
        let outcome = match ty {
            0 => self.read(w, g).await,
            1 => {
                let v: u64 = rng.gen();
                match self.write_all(w, g, WriteKind::Update, v).await {
                    // The group is deleted: it is inserted again, whole.
                    Outcome::Aborted(AbortReason::MissingKey) => {
                        self.write_all(w, g, WriteKind::Insert, v).await
                    }
                    o => o,
                }
            }
            // A delete of a deleted group aborts with `missing_key`.
            _ => self.write_all(w, g, WriteKind::Delete, 0).await,
        };
        (ty, outcome)
    }

    fn check(&self, dbs: &[Arc<NodeDb>]) -> Result<serde_json::Value, WorkloadError> {
        let violations = self.read_violations.load(Ordering::Relaxed);
        if violations > 0 {
            return Err(StressError::TornReads { reads: violations }.into());
        }
        // The final state: every group whole (one value) or absent.
        let rows = primary_rows(dbs, STRESS);
        let mut i = 0;
        let mut whole = 0u64;
        while i < rows.len() {
            let g = rows[i].0 / GROUP;
            let mut j = i;
            while j < rows.len() && rows[j].0 / GROUP == g {
                j += 1;
            }
            let group = &rows[i..j];
            if group.len() as u64 != GROUP || group.iter().any(|r| r.1 != group[0].1) {
                return Err(StressError::TornGroup {
                    group: g,
                    present: group.len(),
                }
                .into());
            }
            whole += 1;
            i = j;
        }
        Ok(serde_json::json!({
            "committed_reads": self.reads.load(Ordering::Relaxed),
            "read_violations": 0,
            "groups": self.groups,
            "groups_present": whole,
        }))
    }

    fn check_node(&self, _db: &Arc<NodeDb>) -> Result<serde_json::Value, WorkloadError> {
        // A group's keys have different primaries: the final state is checked in
        // process and in the simulator, not across node processes (not built).
        Ok(serde_json::json!({
            "committed_reads": self.reads.load(Ordering::Relaxed),
            "read_violations": self.read_violations.load(Ordering::Relaxed),
        }))
    }

    fn check_combine(
        &self,
        parts: &[serde_json::Value],
    ) -> Result<serde_json::Value, WorkloadError> {
        let (mut reads, mut bad) = (0i64, 0i64);
        for (n, p) in parts.iter().enumerate() {
            reads = reads.saturating_add(part_i64(p, n, "committed_reads")?);
            bad = bad.saturating_add(part_i64(p, n, "read_violations")?);
        }
        if bad > 0 {
            return Err(StressError::TornReads { reads: bad as u64 }.into());
        }
        Ok(serde_json::json!({ "committed_reads": reads, "read_violations": 0 }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_is_consistent_only_if_whole_or_absent() {
        assert!(Stress::consistent(&[Some(3), Some(3), Some(3), Some(3)]));
        assert!(Stress::consistent(&[None, None, None, None]));
        assert!(!Stress::consistent(&[Some(3), Some(4), Some(3), Some(3)]));
        assert!(!Stress::consistent(&[Some(3), None, Some(3), Some(3)]));
    }
}
