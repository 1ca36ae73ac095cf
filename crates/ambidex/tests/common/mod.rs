//! What the `Node::start` tests share: three nodes of one cluster started from three
//! threads of this process, and each writing its key and reading every node's.

use ambidex::{ClusterReport, Config, Node, NodeProcess, Schema, Table};
use std::time::Duration;

/// Starts nodes `0..3` of `cfg`, each from its own thread (under a one-sided policy or
/// with etcd each `Node::start` returns once the others are there), node `n` after
/// `delays[n]`.
pub fn start_three(cfg: &Config, schema: &Schema, delays: [Duration; 3]) -> Vec<NodeProcess> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..3u16)
            .map(|n| {
                s.spawn(move || {
                    std::thread::sleep(delays[n as usize]);
                    Node::start(cfg, n, schema)
                })
            })
            .collect();
        hs.into_iter()
            .enumerate()
            .map(|(n, h)| {
                h.join()
                    .unwrap()
                    .unwrap_or_else(|e| panic!("node {n}: {e}"))
            })
            .collect()
    })
}

/// Each node inserts key `n` and reads every node's.
pub fn write_and_read_each_others_keys(nodes: &[NodeProcess], kv: &Table<u64, String>) {
    for (n, node) in nodes.iter().enumerate() {
        let t = kv.clone();
        node.run(async move |tx| tx.insert(&t, n as u64, &format!("from node {n}")))
            .unwrap_or_else(|e| panic!("node {n}: {e}"));
    }
    for node in nodes {
        let t = kv.clone();
        let all = node
            .read(async move |tx| tx.get_many(&t, &[0, 1, 2]).await)
            .unwrap();
        let want: Vec<_> = (0..3).map(|n| Some(format!("from node {n}"))).collect();
        assert_eq!(all, want, "node {} reads every node's write", node.id());
    }
}

/// Shuts every node down; their reports, summed.
#[allow(dead_code)] // used by node_start.rs only
pub fn shut_down(nodes: Vec<NodeProcess>) -> ClusterReport {
    let mut sum = ClusterReport::default();
    for node in nodes {
        let r = node.shutdown().unwrap();
        sum.committed += r.committed;
        sum.read_only_committed += r.read_only_committed;
        sum.onesided_posted += r.onesided_posted;
        sum.log_records_written += r.log_records_written;
    }
    sum
}
