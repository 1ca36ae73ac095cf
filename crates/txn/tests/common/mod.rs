//! Shared set-up of the protocol tests: in-process clusters on the local or shm
//! transport, with tables loaded on every replica.

#![allow(dead_code)]

use ambidex_transport::local::LocalFabric;
use ambidex_transport::{ClusterConfig, SharedNode};
use ambidex_txn::log_ring::LogRingConfig;
use ambidex_txn::{NodeDb, Placement, TableSpec};
use std::sync::Arc;

pub enum Backend {
    Local,
    Shm,
}

/// A cluster of `nodes` × `threads` in this process with `tables` created on every node.
pub struct TestCluster {
    pub nodes: Vec<SharedNode>,
    pub dbs: Vec<Arc<NodeDb>>,
    pub placement: Placement,
    shm_dir: Option<std::path::PathBuf>,
    _fabric: Option<Arc<LocalFabric>>,
}

impl TestCluster {
    pub fn new(
        backend: Backend,
        nodes: u16,
        threads: u16,
        replication: u16,
        tables: &[TableSpec],
    ) -> TestCluster {
        Self::with_log_rings(
            backend,
            nodes,
            threads,
            replication,
            tables,
            LogRingConfig::default(),
        )
    }

    /// [`TestCluster::new`] with log rings of `rings`.
    pub fn with_log_rings(
        backend: Backend,
        nodes: u16,
        threads: u16,
        replication: u16,
        tables: &[TableSpec],
        rings: LogRingConfig,
    ) -> TestCluster {
        let config = ClusterConfig::new(nodes, threads);
        let placement = Placement::new(nodes, replication).unwrap();
        let (node_handles, fabric, shm_dir) = match backend {
            Backend::Local => {
                let f = LocalFabric::new(config).unwrap();
                (f.nodes(), Some(f), None)
            }
            Backend::Shm => {
                let dir = std::path::PathBuf::from(format!(
                    "/dev/shm/ambidex-txn-test-{}-{}",
                    std::process::id(),
                    rand::random::<u32>()
                ));
                ambidex_transport_shm::ShmCluster::create(&dir, &config).unwrap();
                let ns = (0..nodes)
                    .map(|n| ambidex_transport_shm::ShmNode::open(&dir, n).unwrap())
                    .collect();
                (ns, None, Some(dir))
            }
        };
        let dbs = node_handles
            .iter()
            .map(|n| NodeDb::with_log_rings(&**n, placement.clone(), tables, rings).unwrap())
            .collect();
        TestCluster {
            nodes: node_handles,
            dbs,
            placement,
            shm_dir,
            _fabric: fabric,
        }
    }

    /// Gives every node the cluster's catalog (tables and log regions).
    pub fn set_catalogs(&self) {
        let cat = NodeDb::catalog_of(&self.dbs).unwrap();
        for db in &self.dbs {
            db.set_catalog(cat.clone()).unwrap();
        }
    }

    /// Loads `key -> value` on every replica of it.
    pub fn load(&self, table: u32, key: u64, value: &[u8]) {
        let mut stored = 0;
        for db in &self.dbs {
            if db.load(table, key, value).unwrap() {
                stored += 1;
            }
        }
        assert_eq!(
            stored,
            self.placement.replication(),
            "key {key} not on R replicas"
        );
    }

    /// Asserts every replica of every key in `table` holds exactly the primary's version
    /// and value (run when the cluster is quiescent). Returns the number of keys checked.
    pub fn assert_replicas_consistent(&self, table: u32) -> usize {
        let mut by_key: std::collections::BTreeMap<u64, Vec<(u16, u64, Vec<u8>)>> =
            Default::default();
        for db in &self.dbs {
            for (key, meta, value) in db.dump(table) {
                by_key.entry(key).or_default().push((db.node, meta, value));
            }
        }
        for (key, copies) in &by_key {
            let p = self.placement.primary(table, *key);
            let primary = copies
                .iter()
                .find(|c| c.0 == p)
                .unwrap_or_else(|| panic!("key {key}: no copy at its primary {p}"));
            let want: Vec<u16> = self.placement.replicas(table, *key).to_vec();
            let mut have: Vec<u16> = copies.iter().map(|c| c.0).collect();
            have.sort();
            let mut want_sorted = want.clone();
            want_sorted.sort();
            assert_eq!(have, want_sorted, "key {key}: copies on the wrong nodes");
            for c in copies {
                assert_eq!(
                    (c.1, &c.2),
                    (primary.1, &primary.2),
                    "key {key}: node {} differs from primary {p}",
                    c.0
                );
            }
        }
        by_key.len()
    }
}

impl TestCluster {
    /// Asserts that the `i64` balances of `table`'s keys `0..n` sum to `n * initial` at
    /// their primaries, and that every replica equals its primary.
    pub fn assert_money_conserved(&self, table: u32, n: u64, initial: i64) {
        self.assert_money_at_primaries(table, n, initial);
        assert_eq!(self.assert_replicas_consistent(table), n as usize);
    }

    /// Asserts that the `i64` balances of `table`'s keys `0..n` sum to `n * initial` at
    /// their primaries.
    pub fn assert_money_at_primaries(&self, table: u32, n: u64, initial: i64) {
        let total = self.money_at(&self.placement, table, 0..n);
        assert_eq!(total, initial * n as i64, "money created or destroyed");
    }

    /// The sum of the `i64` balances of `keys` of `table` at the primaries `placement`
    /// names (a later configuration's, after a failure).
    pub fn money_at(
        &self,
        placement: &Placement,
        table: u32,
        keys: impl Iterator<Item = u64>,
    ) -> i64 {
        keys.map(|k| {
            let p = placement.primary(table, k);
            let mut v = Vec::new();
            ambidex_txn::actions::read(&self.dbs[p as usize], table, k, &mut v);
            i64::from_le_bytes(v.try_into().unwrap())
        })
        .sum()
    }

    /// Asserts that every copy `placement` lists of `keys` of `table` equals its
    /// primary's (version and value).
    pub fn assert_copies_equal(
        &self,
        placement: &Placement,
        table: u32,
        keys: impl Iterator<Item = u64>,
    ) {
        for k in keys {
            let reps = placement.replicas(table, k);
            let copy = |n: u16| {
                self.dbs[n as usize]
                    .dump(table)
                    .into_iter()
                    .find(|(key, _, _)| *key == k)
                    .map(|(_, meta, v)| (meta, v))
            };
            let primary = copy(reps[0]).expect("the primary has the key");
            for &r in &reps[1..] {
                assert_eq!(copy(r), Some(primary.clone()), "key {k}: node {r} differs");
            }
        }
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        if let Some(d) = &self.shm_dir {
            let _ = ambidex_transport_shm::ShmCluster::remove(d);
        }
    }
}

/// The seed of worker `w`'s random numbers ([`rng_next`]): `salt` mixed with its node,
/// thread and coroutine (odd, so never the xorshift's stuck zero).
pub fn worker_seed(w: &ambidex_txn::runner::WorkerCtx, salt: u64) -> u64 {
    salt ^ ((w.node as u64) << 32) ^ ((w.thread as u64) << 16) ^ w.coroutine as u64 | 1
}

/// xorshift64: the tests' seeded random numbers.
pub fn rng_next(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// One transfer of a random amount between two random accounts of `n` in `table`
/// (little-endian `i64` balances), on `w`'s coordinator. True if it committed.
pub async fn random_transfer(
    w: &ambidex_txn::runner::WorkerCtx,
    table: u32,
    n: u64,
    seed: &mut u64,
) -> bool {
    let a = rng_next(seed) % n;
    let b = (a + 1 + rng_next(seed) % (n - 1)) % n;
    let amount = (rng_next(seed) % 50) as i64;
    transfer(w, table, a, b, amount).await
}

/// Moves `amount` from account `a` to account `b` of `table` on `w`'s coordinator. True
/// if it committed.
pub async fn transfer(
    w: &ambidex_txn::runner::WorkerCtx,
    table: u32,
    a: u64,
    b: u64,
    amount: i64,
) -> bool {
    use ambidex_txn::{Txn, WriteKind};
    let mut t = Txn::begin(&w.ctx, &w.th);
    let ia = t.write(table, a, WriteKind::Update);
    let ib = t.write(table, b, WriteKind::Update);
    if t.execute().await.is_err() {
        return false;
    }
    let va = i64::from_le_bytes(t.get(ia).unwrap().try_into().unwrap());
    let vb = i64::from_le_bytes(t.get(ib).unwrap().try_into().unwrap());
    t.set(ia, &(va - amount).to_le_bytes());
    t.set(ib, &(vb + amount).to_le_bytes());
    t.commit().await.is_ok()
}

/// The bank the kill tests run (`failover.rs`, `failover_etcd.rs`, `rejoin.rs`): one
/// table of accounts, each starting with `INITIAL`, plus keys no transaction touches.
pub mod bank {
    use super::{Backend, TestCluster};
    use ambidex_txn::TableSpec;

    pub const ACCOUNTS: u32 = 1;
    pub const N_ACCOUNTS: u64 = 24;
    pub const INITIAL: i64 = 1000;
    /// Keys no transaction touches: after a kill only re-replication brings them to a
    /// new copy.
    pub const COLD: std::ops::Range<u64> = 1000..1048;

    pub fn table() -> TableSpec {
        TableSpec {
            id: ACCOUNTS,
            name: "accounts".into(),
            value_size: 8,
            capacity_per_node: 1024,
        }
    }

    /// `nodes` × 2 threads, R = 3, every node's catalog set (the one-sided phases and
    /// rings need every node's descriptors), the accounts and the cold keys loaded.
    pub fn cluster(nodes: u16) -> TestCluster {
        let c = TestCluster::new(Backend::Local, nodes, 2, 3, &[table()]);
        c.set_catalogs();
        for k in 0..N_ACCOUNTS {
            c.load(ACCOUNTS, k, &INITIAL.to_le_bytes());
        }
        for k in COLD {
            c.load(ACCOUNTS, k, &(k as i64).to_le_bytes());
        }
        c
    }
}
