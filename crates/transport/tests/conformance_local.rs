//! The conformance suite against the `local` backend: node 0 is the driver, the other
//! nodes run the peer agent on threads of this process.

use ambidex_transport::conformance::{self, Fixture};
use ambidex_transport::local::LocalFabric;
use ambidex_transport::{ClusterConfig, SharedNode};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

struct LocalFixture {
    config: ClusterConfig,
    driver: SharedNode,
    stop: Arc<AtomicBool>,
    peers: Vec<JoinHandle<()>>,
}

impl LocalFixture {
    fn new() -> LocalFixture {
        let mut config = ClusterConfig::new(3, 2);
        config.recv_depth = 256;
        let fabric = LocalFabric::new(config.clone()).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let peers = (1..config.nodes)
            .map(|n| {
                let (node, stop) = (fabric.node(n), stop.clone());
                std::thread::spawn(move || conformance::run_peer(node, stop).unwrap())
            })
            .collect();
        LocalFixture {
            config,
            driver: fabric.node(0),
            stop,
            peers,
        }
    }
}

impl Drop for LocalFixture {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for p in self.peers.drain(..) {
            let _ = p.join();
        }
    }
}

impl Fixture for LocalFixture {
    fn config(&self) -> &ClusterConfig {
        &self.config
    }
    fn driver(&self) -> SharedNode {
        self.driver.clone()
    }
}

ambidex_transport::conformance_tests!(LocalFixture::new());

/// Every node of the local backend shares this host's cores.
#[test]
fn local_host_threads_count_every_endpoint() {
    let fabric = LocalFabric::new(ClusterConfig::new(3, 2)).unwrap();
    let ep = fabric.node(1).endpoint(0).unwrap();
    assert_eq!(ep.host_threads(), 6);
}
