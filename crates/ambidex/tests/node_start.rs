//! `Node::start`: nodes of one cluster started separately (here three in one process,
//! over shm), and the configurations it refuses, with the reason.

use ambidex::config::{ManagerKind, Transport};
use ambidex::{transports, Config, Error, Node, Schema};

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
    for (n, node) in nodes.iter().enumerate() {
        let t = kv.clone();
        node.run(async move |tx| tx.insert(&t, n as u64, &format!("from node {n}")))
            .unwrap();
    }
    for node in &nodes {
        let t = kv.clone();
        let all = node
            .read(async move |tx| tx.get_many(&t, &[0, 1, 2]).await)
            .unwrap();
        let want: Vec<_> = (0..3).map(|n| Some(format!("from node {n}"))).collect();
        assert_eq!(all, want, "node {} reads every node's write", node.id());
    }
    let mut committed = 0;
    for node in nodes {
        committed += node.shutdown().unwrap().committed;
    }
    assert_eq!(committed, 6, "3 inserts and 3 reads");
    transports::destroy(&cfg.cluster);
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
    refused(&c, "manager");
    let mut c = shm_config();
    c.txn.mode = "drtm-h".into();
    refused(&c, "RPCs only");
    // A node id outside the cluster.
    let c = shm_config();
    transports::create(&c.cluster).unwrap();
    assert!(Node::start(&c, 3, &schema).is_err());
    transports::destroy(&c.cluster);
}
