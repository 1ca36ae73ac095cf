//! `Node::start` with the etcd manager (`cluster.manager = "etcd"`): three nodes over
//! shm, in one process here, each holding its lease in a loopback etcd (Debian's
//! `etcd-server`, which .ci/run installs; `LocalEtcd`); one shut down is removed once
//! its lease expires, and the other two go on. Without `etcd` the tests print why and
//! pass, except under CI, where it must be there. Built with the crate's `etcd` feature
//! (its dev-dependency on itself turns it on).

use ambidex::bench::etcd_membership;
use ambidex::config::{ManagerKind, Transport};
use ambidex::{transports, Config, Error, Node, Schema, StartError, Table};
use ambidex_cluster::manager::etcd::local::LocalEtcd;
use std::time::{Duration, Instant};

mod common;
use common::{start_three, write_and_read_each_others_keys};

/// Three nodes over shm with the etcd manager at `etcd`, cluster `name` in it, leases
/// of a second, under transaction mode `preset`.
fn config(etcd: &LocalEtcd, name: &str, preset: &str) -> Config {
    let mut c = Config::default();
    c.cluster.transport = Transport::Shm;
    c.cluster.manager = ManagerKind::Etcd;
    c.cluster.etcd_endpoints = vec![etcd.endpoint().into()];
    c.cluster.etcd_cluster = Some(name.into());
    c.cluster.lease_ms = 1000;
    c.run.coroutines = Some(4);
    c.txn.mode = preset.into();
    transports::on_this_host(&mut c.cluster);
    c
}

fn kv_schema() -> (Schema, Table<u64, String>) {
    let mut schema = Schema::new();
    let kv = schema
        .table_with_max_len::<u64, String>("kv", 1000, 32)
        .unwrap();
    (schema, kv)
}

/// Three nodes commit; node 2 is shut down; once etcd expired its lease the other two
/// have moved to a configuration without it and commit again (and still read what
/// node 2 wrote: its partitions had copies on them).
#[test]
fn the_others_go_on_once_etcd_removed_a_node_shut_down() {
    let Some(etcd) = LocalEtcd::start_for_test("node-start-survive") else {
        return;
    };
    let cfg = config(&etcd, "survive", "fasst");
    transports::create(&cfg.cluster).unwrap();
    let (schema, kv) = kv_schema();
    let mut nodes = start_three(&cfg, &schema, [Duration::ZERO; 3]);
    for node in &nodes {
        assert_eq!((node.epoch(), node.members()), (1, vec![0, 1, 2]));
    }
    write_and_read_each_others_keys(&nodes, &kv);

    let gone = nodes.pop().unwrap();
    let t0 = Instant::now();
    gone.shutdown().unwrap();
    // Each survivor inserts its key once its transactions run again (the retry policy
    // gives up while the cluster waits for etcd: try again until the deadline).
    let deadline = t0 + Duration::from_secs(60);
    for (n, node) in nodes.iter().enumerate() {
        let key = 10 + n as u64;
        loop {
            let t = kv.clone();
            match node.run(async move |tx| tx.insert(&t, key, &"after".to_string())) {
                Ok(()) => break,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("node {n}: {e}; again");
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("node {n} commits nothing within 60 s of node 2's end: {e}"),
            }
        }
    }
    eprintln!("the survivors commit {:?} after node 2's end", t0.elapsed());
    for node in &nodes {
        assert!(
            node.epoch() >= 2,
            "node {}: epoch {}",
            node.id(),
            node.epoch()
        );
        assert_eq!(node.members(), vec![0, 1], "node {}", node.id());
        let t = kv.clone();
        let all = node
            .read(async move |tx| tx.get_many(&t, &[0, 1, 2, 10, 11]).await)
            .unwrap();
        let mut want: Vec<_> = (0..3).map(|n| Some(format!("from node {n}"))).collect();
        want.extend([Some("after".into()), Some("after".into())]);
        assert_eq!(all, want, "node {}", node.id());
    }
    // The state in etcd says the same.
    let (state, stopped) = etcd_membership::final_state(&cfg.cluster).unwrap();
    assert_eq!(stopped, None);
    assert!(state.config.epoch >= 2, "{state:?}");
    assert!(!state.config.placement.is_member(2), "{state:?}");
    for node in nodes {
        node.shutdown().unwrap();
    }
    transports::destroy(&cfg.cluster);
}

/// Under a one-sided policy the nodes get each other's catalog with the manager on
/// (they ask in the initial configuration, which etcd holds too), and commit.
#[test]
fn one_sided_nodes_with_etcd_get_the_catalog_and_commit() {
    let Some(etcd) = LocalEtcd::start_for_test("node-start-onesided") else {
        return;
    };
    let cfg = config(&etcd, "onesided", "drtm-h");
    transports::create(&cfg.cluster).unwrap();
    let (schema, kv) = kv_schema();
    let nodes = start_three(&cfg, &schema, [Duration::ZERO; 3]);
    write_and_read_each_others_keys(&nodes, &kv);
    for node in &nodes {
        assert_eq!(node.epoch(), 1, "node {}: no reconfiguration", node.id());
    }
    let mut log_records = 0;
    // (Each node shut down leaves the cluster: the later ones reconfigure.)
    for node in nodes {
        log_records += node.shutdown().unwrap().log_records_written;
    }
    assert!(log_records >= 3, "{log_records}");
    transports::destroy(&cfg.cluster);
}

/// A node of a cluster whose name in etcd is another cluster's (another shape) is
/// refused, saying so; a configuration naming no cluster in etcd too.
#[test]
fn a_cluster_of_another_shape_in_etcd_is_refused() {
    let Some(etcd) = LocalEtcd::start_for_test("node-start-shape") else {
        return;
    };
    let cfg = config(&etcd, "shape", "fasst");
    let mut two = cfg.cluster.clone();
    two.nodes = 2;
    two.replication = 2;
    etcd_membership::bootstrap(&two).unwrap();
    transports::create(&cfg.cluster).unwrap();
    let (schema, _) = kv_schema();
    match Node::start(&cfg, 0, &schema) {
        Err(Error::Start(StartError::EtcdClusterDiffers {
            found_nodes: 2,
            nodes: 3,
            ..
        })) => {}
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("started in another cluster"),
    }
    let mut unnamed = cfg.clone();
    unnamed.cluster.etcd_cluster = None;
    match Node::start(&unnamed, 0, &schema) {
        Err(e @ Error::Start(StartError::NoEtcdCluster)) => {
            assert!(e.to_string().contains("etcd_cluster"), "{e}")
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("started with no cluster in etcd"),
    }
    transports::destroy(&cfg.cluster);
}
