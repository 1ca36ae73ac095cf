//! `Node::start`: nodes of one cluster started separately (here three in one process,
//! over shm or udp), under the RPC-only policy and the one-sided ones (whose nodes get
//! the catalog from each other), and the configurations it refuses, with the reason.

use ambidex::config::{ManagerKind, Transport};
use ambidex::{transports, Config, Error, Node, Schema, StartError};
use ambidex_txn::{CatalogExchangeError, StartupCheckError};
use std::time::Duration;

mod common;
use common::{shut_down, start_three, write_and_read_each_others_keys};

fn shm_config() -> Config {
    let mut c = Config::default();
    c.cluster.transport = Transport::Shm;
    c.cluster.manager = ManagerKind::None;
    c.run.coroutines = Some(4);
    transports::on_this_host(&mut c.cluster);
    c
}

/// Three nodes started one by one agree on what the others wrote; then they stop.
#[test]
fn nodes_started_separately_form_one_cluster() {
    let cfg = shm_config();
    transports::create(&cfg.cluster).unwrap();
    let mut schema = Schema::new();
    let kv = schema
        .table_with_max_len::<u64, String>("kv", 100, 32)
        .unwrap();
    let nodes: Vec<_> = (0..3)
        .map(|n| Node::start(&cfg, n, &schema).unwrap())
        .collect();
    write_and_read_each_others_keys(&nodes, &kv);
    let r = shut_down(nodes);
    // RPCs only: no start-up check, no one-sided operation.
    assert_eq!((r.onesided_posted, r.log_records_written), (0, 0));
    assert_eq!(r.committed, 6, "3 inserts and 3 reads");
    transports::destroy(&cfg.cluster);
}

fn config(transport: Transport, preset: &str) -> Config {
    let mut c = Config::default();
    c.cluster.transport = transport;
    c.cluster.manager = ManagerKind::None;
    c.run.coroutines = Some(4);
    c.txn.mode = preset.into();
    transports::on_this_host(&mut c.cluster);
    c
}

/// One-sided operations each node's start-up check posts: a READ of each other
/// node's table and log region (one table here, 3 nodes).
const CHECK_READS: u64 = 3 * 2 * 2;

/// Three nodes started separately under a one-sided policy get each other's
/// descriptors, and their transactions do go one-sided: commit records WRITTEN into the
/// other nodes' log rings, and one-sided operations beyond the start-up check's.
fn one_sided_cluster(transport: Transport, preset: &str, delays: [Duration; 3]) {
    let cfg = config(transport, preset);
    transports::create(&cfg.cluster).unwrap();
    let mut schema = Schema::new();
    let kv = schema
        .table_with_max_len::<u64, String>("kv", 100, 32)
        .unwrap();
    let nodes = start_three(&cfg, &schema, delays);
    write_and_read_each_others_keys(&nodes, &kv);
    let r = shut_down(nodes);
    transports::destroy(&cfg.cluster);
    assert_eq!(r.committed, 6, "3 inserts and 3 reads");
    assert!(r.log_records_written >= 3, "{preset}: {r:?}");
    assert!(
        r.onesided_posted > CHECK_READS + r.log_records_written,
        "{preset}: {r:?}"
    );
}

#[test]
fn drtm_h_runs_on_nodes_started_separately_over_shm() {
    one_sided_cluster(Transport::Shm, "drtm-h", [Duration::ZERO; 3]);
}

#[test]
fn farm_runs_on_nodes_started_separately_over_shm() {
    one_sided_cluster(Transport::Shm, "farm", [Duration::ZERO; 3]);
}

#[test]
fn drtm_h_runs_on_nodes_started_separately_over_udp() {
    one_sided_cluster(Transport::Udp, "drtm-h", [Duration::ZERO; 3]);
}

/// The nodes already running answer a node that starts a second later (and wait for
/// its answer).
#[test]
fn a_node_started_late_still_gets_the_catalog() {
    let late = [Duration::ZERO, Duration::ZERO, Duration::from_secs(1)];
    one_sided_cluster(Transport::Shm, "drtm-h", late);
}

/// A node whose peers never start gives up, naming them.
#[test]
fn a_node_whose_peers_never_start_names_them() {
    let cfg = config(Transport::Shm, "drtm-h");
    transports::create(&cfg.cluster).unwrap();
    let mut schema = Schema::new();
    schema
        .table_with_max_len::<u64, String>("kv", 100, 32)
        .unwrap();
    let t0 = std::time::Instant::now();
    let r = Node::start_within(&cfg, 0, &schema, Duration::from_millis(500));
    transports::destroy(&cfg.cluster);
    match r {
        Err(Error::Start(StartError::StartupCheck(StartupCheckError::CatalogExchange(
            CatalogExchangeError::NoAnswer {
                node: 0, missing, ..
            },
        )))) => assert_eq!(missing, vec![1, 2]),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("started alone"),
    }
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
}

#[test]
fn what_a_node_started_alone_cannot_do_is_refused_with_the_reason() {
    let schema = Schema::new();
    let refused = |c: &Config, needle: &str| match Node::start(c, 0, &schema) {
        Err(Error::NotSupported(why)) => assert!(why.contains(needle), "{why}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("started"),
    };
    let mut c = Config::default();
    c.cluster.manager = ManagerKind::None;
    refused(&c, "Cluster::local");
    let mut c = shm_config();
    c.cluster.manager = ManagerKind::Embedded;
    refused(&c, "etcd");
    // A node id outside the cluster.
    let c = shm_config();
    transports::create(&c.cluster).unwrap();
    assert!(Node::start(&c, 3, &schema).is_err());
    transports::destroy(&c.cluster);
}
