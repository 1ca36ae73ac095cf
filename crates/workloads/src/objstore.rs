//! FaSST's transactional object store O(r, w) (FaSST §6.1): 8-byte keys, 40-byte values,
//! `scale · 1,000,000` keys per worker thread (paper scale: 1,000,000). A transaction
//! reads exactly r uniform keys and updates exactly w of them (FaSST's generator met r and
//! w only on average). By default the r keys have distinct primaries, so no two requests
//! of a transaction coalesce; with r > nodes that is impossible, and the keys are spread
//! as evenly as possible (at most ⌈r / nodes⌉ per primary) — a deviation that matters
//! only on clusters smaller than r. `same_node` lifts the restriction.
//!
//! Each update increments a counter in the value's first 8 bytes.

use crate::common::{add_i64, per_node_capacity, Loader, Outcome, Workload};
use ambidex::config::ObjStoreParams;
use ambidex::workload::Txn;
use ambidex::workload::WorkerCtx;
use ambidex::workload::WorkloadError;
use ambidex::workload::{Placement, TableSpec, WriteKind};
use rand::rngs::SmallRng;
use rand::Rng;

pub const OBJECTS: u32 = 20;
pub const KEYS_PER_THREAD: u64 = 1_000_000;
pub const VALUE_SIZE: usize = 40;
/// Most keys in one transaction.
pub const MAX_KEYS: usize = 64;

/// What the object store refuses.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ObjectStoreError {
    /// Reads and writes per transaction outside `1 ≤ r ≤ MAX_KEYS`, `w ≤ r`.
    #[error("O(r, w) needs 1 ≤ r ≤ {MAX_KEYS} and w ≤ r (got r = {reads}, w = {writes})")]
    BadShape {
        /// Keys read (r).
        reads: usize,
        /// Keys written (w).
        writes: usize,
    },
}

pub struct ObjectStore {
    pub keys: u64,
    pub params: ObjStoreParams,
    placement: Placement,
    /// Most keys of one transaction on one primary.
    per_node: usize,
}

impl ObjectStore {
    pub fn new(
        placement: Placement,
        threads: u16,
        scale: f64,
        params: ObjStoreParams,
    ) -> Result<ObjectStore, WorkloadError> {
        if params.reads == 0 || params.writes > params.reads || params.reads > MAX_KEYS {
            return Err(ObjectStoreError::BadShape {
                reads: params.reads,
                writes: params.writes,
            }
            .into());
        }
        let keys =
            ((KEYS_PER_THREAD as f64 * scale) as u64 * placement.nodes() as u64 * threads as u64)
                .max(params.reads as u64 * 4);
        let per_node = if params.same_node {
            params.reads
        } else {
            params.reads.div_ceil(placement.nodes() as usize)
        };
        Ok(ObjectStore {
            keys,
            params,
            placement,
            per_node,
        })
    }

    /// Draws the r distinct keys of one transaction into `out` (the first w are updated).
    pub fn gen_keys(&self, rng: &mut SmallRng, out: &mut Vec<u64>) {
        out.clear();
        let mut on_node = [0u8; 256];
        while out.len() < self.params.reads {
            let k = rng.gen_range(0..self.keys);
            if out.contains(&k) {
                continue;
            }
            let p = self.placement.primary(OBJECTS, k) as usize;
            if !self.params.same_node {
                if on_node[p % 256] as usize >= self.per_node {
                    continue;
                }
                on_node[p % 256] += 1;
            }
            out.push(k);
        }
    }
}

#[derive(Default)]
pub struct Local {
    keys: Vec<u64>,
}

const UNIT: u64 = 4096;

impl Workload for ObjectStore {
    type Local = Local;

    fn name(&self) -> &'static str {
        "object-store"
    }

    fn tables(&self) -> Vec<TableSpec> {
        vec![TableSpec {
            id: OBJECTS,
            name: "objects".into(),
            value_size: VALUE_SIZE,
            capacity_per_node: per_node_capacity(self.keys, &self.placement),
        }]
    }

    fn txn_types(&self) -> &'static [&'static str] {
        &["o_r_w"]
    }

    fn load_units(&self) -> u64 {
        self.keys.div_ceil(UNIT)
    }

    fn load_unit(
        &self,
        unit: u64,
        rng: &mut SmallRng,
        out: &Loader<'_>,
    ) -> Result<(), WorkloadError> {
        let mut v = [0u8; VALUE_SIZE];
        for k in unit * UNIT..((unit + 1) * UNIT).min(self.keys) {
            rng.fill(&mut v[8..]);
            out.put(OBJECTS, k, &v)?;
        }
        Ok(())
    }

    async fn run_one(
        &self,
        w: &WorkerCtx,
        rng: &mut SmallRng,
        local: &mut Local,
    ) -> (usize, Outcome) {
        let mut keys = std::mem::take(&mut local.keys);
        self.gen_keys(rng, &mut keys);
        let outcome = async {
            let mut t = Txn::begin(&w.ctx, &w.th);
            let mut items = [0usize; MAX_KEYS];
            for (i, &k) in keys.iter().enumerate() {
                items[i] = if i < self.params.writes {
                    t.write(OBJECTS, k, WriteKind::Update)
                } else {
                    t.read(OBJECTS, k)
                };
            }
            if let Err(r) = t.execute().await {
                return Outcome::Aborted(r);
            }
            for &it in &items[..self.params.writes] {
                let mut v = [0u8; VALUE_SIZE];
                v.copy_from_slice(t.get(it).expect("loaded key"));
                add_i64(&mut v, 0, 1);
                t.set(it, &v);
            }
            match t.commit().await {
                Ok(_) => Outcome::FOUND,
                Err(r) => Outcome::Aborted(r),
            }
        }
        .await;
        local.keys = keys;
        (0, outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn store(nodes: u16, reads: usize, writes: usize, same_node: bool) -> ObjectStore {
        let p = Placement::new(nodes, nodes.min(3)).unwrap();
        ObjectStore::new(
            p,
            1,
            0.01,
            ObjStoreParams {
                reads,
                writes,
                same_node,
            },
        )
        .unwrap()
    }

    #[test]
    fn exactly_r_distinct_keys_on_distinct_primaries() {
        let mut rng = SmallRng::seed_from_u64(3);
        let mut keys = Vec::new();
        for (nodes, r) in [(3u16, 1usize), (3, 2), (3, 3), (5, 4), (8, 8)] {
            let s = store(nodes, r, r / 2, false);
            let p = s.placement.clone();
            for _ in 0..2_000 {
                s.gen_keys(&mut rng, &mut keys);
                assert_eq!(keys.len(), r);
                let mut prim: Vec<u16> = keys.iter().map(|&k| p.primary(OBJECTS, k)).collect();
                prim.sort_unstable();
                prim.dedup();
                assert_eq!(prim.len(), r, "keys {keys:?} share a primary");
                assert!(keys.iter().all(|&k| k < s.keys));
            }
        }
    }

    #[test]
    fn more_keys_than_nodes_spread_evenly_and_same_node_allows_sharing() {
        let mut rng = SmallRng::seed_from_u64(4);
        let mut keys = Vec::new();
        let s = store(3, 4, 2, false);
        for _ in 0..2_000 {
            s.gen_keys(&mut rng, &mut keys);
            let mut per = [0; 3];
            for &k in &keys {
                per[s.placement.primary(OBJECTS, k) as usize] += 1;
            }
            assert!(per.iter().all(|&c| c <= 2), "{per:?}");
            let mut d = keys.clone();
            d.sort_unstable();
            d.dedup();
            assert_eq!(d.len(), 4);
        }
        let s = store(3, 3, 0, true);
        let shared = (0..2_000)
            .filter(|_| {
                s.gen_keys(&mut rng, &mut keys);
                let mut prim: Vec<u16> = keys
                    .iter()
                    .map(|&k| s.placement.primary(OBJECTS, k))
                    .collect();
                prim.sort_unstable();
                prim.dedup();
                prim.len() < 3
            })
            .count();
        assert!(
            shared > 1_000,
            "same_node should let keys share primaries ({shared}/2000)"
        );
        assert!(ObjectStore::new(
            Placement::new(3, 3).unwrap(),
            1,
            0.01,
            ObjStoreParams {
                reads: 2,
                writes: 3,
                same_node: false
            }
        )
        .is_err());
    }
}
