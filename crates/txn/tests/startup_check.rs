//! The start-up check: once a node has the cluster's catalog, thread 0 reads every other
//! node's table superblocks one-sided through the descriptors and checks them. A good
//! catalog is verified on every node; a stale one (a wrong key) is an error naming the
//! access error, and nothing wrong is read.

mod common;

use ambidex_cluster::Stage;
use ambidex_store::Catalog;
use ambidex_txn::runner::{self, RunSpec, Worker, WorkerCtx};
use ambidex_txn::{NodeDb, TableSpec};
use common::{Backend, TestCluster};
use std::sync::Arc;
use std::time::Duration;

fn specs() -> Vec<TableSpec> {
    (1..=3)
        .map(|id| TableSpec {
            id,
            name: format!("t{id}"),
            value_size: 8,
            capacity_per_node: 64,
        })
        .collect()
}

/// Workers that return once their node's start-up check has an outcome (or it has no
/// catalog), so the runtimes serve until every check is done.
fn wait_for_checks(dbs: &[Arc<NodeDb>]) -> Worker {
    let dbs = dbs.to_vec();
    Arc::new(move |w: WorkerCtx| {
        let db = dbs[w.node as usize].clone();
        Box::pin(async move {
            while db.catalog().is_some() && db.verification().is_none() {
                w.ctx.yield_now().await;
            }
        })
    })
}

fn run(c: &TestCluster) -> Result<runner::RunResult, String> {
    let spec = RunSpec {
        coroutines: 2,
        ..Default::default()
    };
    runner::run(&c.nodes, &c.dbs, &spec, wait_for_checks(&c.dbs)).map_err(|e| e.to_string())
}

fn check_every_node(backend: Backend) {
    let c = TestCluster::new(backend, 3, 2, 2, &specs());
    let cat = NodeDb::catalog_of(&c.dbs).unwrap();
    assert_eq!(cat.iter().count(), 9);
    for db in &c.dbs {
        assert_eq!(db.table_descs().len(), 3);
        db.set_catalog(cat.clone()).unwrap();
        // Once only.
        assert!(db.set_catalog(cat.clone()).is_err());
    }
    let r = run(&c).unwrap();
    // Every node read the 2 × 3 tables of the two others.
    assert_eq!(r.remote_tables_verified, 18);
    for db in &c.dbs {
        assert_eq!(db.remote_tables_verified(), Ok(6));
    }
}

#[test]
fn every_node_verifies_the_other_nodes_tables_local() {
    check_every_node(Backend::Local);
}

#[test]
fn every_node_verifies_the_other_nodes_tables_shm() {
    check_every_node(Backend::Shm);
}

/// A node that checks while the others are already in a newer epoch (a node joining
/// moves every member's epoch, and a restarted node's check runs during its own join)
/// has its READs fenced at their targets until it catches up: the check READs again
/// then, and passes.
#[test]
fn a_check_fenced_by_a_newer_epoch_passes_once_the_node_catches_up() {
    let c = TestCluster::new(Backend::Local, 3, 1, 2, &specs());
    let cat = NodeDb::catalog_of(&c.dbs).unwrap();
    for db in &c.dbs {
        db.set_catalog(cat.clone()).unwrap();
    }
    let mut newer = (*c.dbs[0].config().load()).clone();
    newer.epoch += 1;
    for db in &c.dbs[..2] {
        db.cluster().enter(newer.clone(), Stage::Run);
    }
    // Node 2 catches up once its check met the fence (a fixed delay flaked on a loaded
    // machine: the check had not started when node 2 caught up), or after 10 s.
    let late = c.dbs[2].clone();
    let targets = [c.nodes[0].clone(), c.nodes[1].clone()];
    let catch_up = std::thread::spawn(move || {
        let t0 = std::time::Instant::now();
        while t0.elapsed() < Duration::from_secs(10)
            && targets
                .iter()
                .all(|n| n.counters().get("onesided_epoch_errors") == 0)
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        // A while more behind the fence: the check READs again meanwhile.
        std::thread::sleep(Duration::from_millis(20));
        late.cluster().enter(newer, Stage::Run);
    });
    let r = run(&c);
    catch_up.join().unwrap();
    assert_eq!(r.unwrap().remote_tables_verified, 18);
    assert_eq!(c.dbs[2].remote_tables_verified(), Ok(6));
    // Its READs did meet the fence (the test tests the retry).
    let fenced = c.nodes[0].counters().get("onesided_epoch_errors")
        + c.nodes[1].counters().get("onesided_epoch_errors");
    assert!(fenced > 0, "{:?}", c.nodes[0].counters());
}

#[test]
fn a_stale_key_fails_the_start_up_check_with_bad_key() {
    let c = TestCluster::new(Backend::Local, 3, 1, 2, &specs());
    let good = NodeDb::catalog_of(&c.dbs).unwrap();
    // Node 0 gets a catalog in which node 1's table 2 has a stale key.
    let mut stale = Catalog::new(3);
    for d in good.iter() {
        let mut d = *d;
        if d.region.node == 1 && d.table_id == 2 {
            d.region.key ^= 0x5a5a;
        }
        stale.insert(d).unwrap();
    }
    for n in 0..3 {
        stale.insert_log(*good.log_region(n).unwrap()).unwrap();
    }
    c.dbs[0].set_catalog(stale).unwrap();
    let e = run(&c)
        .err()
        .expect("a stale key passed the start-up check");
    assert!(e.contains("bad_key"), "{e}");
    assert!(e.contains("node 1's table 2"), "{e}");
    assert!(e.starts_with("node 0:"), "{e}");
    assert_eq!(
        c.dbs[0].remote_tables_verified().map_err(|e| e.to_string()),
        Err(e.clone())
    );
    // The target counted the refused access and nothing was read or changed.
    let v = c.nodes[1].counters().get("remote_access_violations");
    assert!(v > 0, "{:?}", c.nodes[1].counters());
}

#[test]
fn a_stale_log_region_key_fails_the_start_up_check() {
    let c = TestCluster::new(Backend::Local, 3, 1, 3, &specs());
    let good = NodeDb::catalog_of(&c.dbs).unwrap();
    // Node 0 gets a catalog in which node 2's log region has a stale key.
    let mut stale = Catalog::new(3);
    for d in good.iter() {
        stale.insert(*d).unwrap();
    }
    for n in 0..3 {
        let mut l = *good.log_region(n).unwrap();
        if n == 2 {
            l.region.key ^= 0x77;
        }
        stale.insert_log(l).unwrap();
    }
    c.dbs[0].set_catalog(stale).unwrap();
    let e = run(&c)
        .err()
        .expect("a stale log region passed the start-up check");
    assert!(e.contains("node 2's log region"), "{e}");
    assert!(e.contains("bad_key"), "{e}");
    assert!(e.starts_with("node 0:"), "{e}");
}

#[test]
fn a_catalog_without_log_regions_is_refused() {
    let c = TestCluster::new(Backend::Local, 2, 1, 2, &specs());
    let good = NodeDb::catalog_of(&c.dbs).unwrap();
    let mut tables_only = Catalog::new(2);
    tables_only.extend(good.iter().copied()).unwrap();
    let e = c.dbs[0]
        .set_catalog(tables_only.clone())
        .unwrap_err()
        .to_string();
    assert!(e.contains("own log region"), "{e}");
    // Its own, but not the other node's.
    tables_only
        .insert_log(*good.log_region(0).unwrap())
        .unwrap();
    let e = c.dbs[0].set_catalog(tables_only).unwrap_err().to_string();
    assert!(e.contains("no log region of node 1"), "{e}");
}

#[test]
fn a_catalog_without_this_nodes_own_tables_is_refused() {
    let c = TestCluster::new(Backend::Local, 2, 1, 2, &specs());
    let other = TestCluster::new(Backend::Local, 2, 1, 2, &specs());
    // A catalog of another cluster (the regions and keys of other transports).
    let cat = NodeDb::catalog_of(&other.dbs).unwrap();
    let e = c.dbs[0].set_catalog(cat).unwrap_err().to_string();
    assert!(e.contains("own tables"), "{e}");
    assert!(c.dbs[0].catalog().is_none());
    assert!(c.dbs[0].remote_tables_verified().is_err());
}
