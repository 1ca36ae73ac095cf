//! The conformance suite against the `sim` backend in its threaded mode: node 0 is the
//! driver, the other nodes run the peer agent on threads, and `Endpoint::wait` moves the
//! simulated clock. Every check applies; `malformed_input` skips itself (as for `local`)
//! because nothing outside the process can write into a simulated receive queue.

use ambidex_transport::conformance::{self, Fixture};
use ambidex_transport::{ClusterConfig, SharedNode};
use ambidex_transport_sim::{SimFaults, SimNet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

struct SimFixture {
    config: ClusterConfig,
    driver: SharedNode,
    stop: Arc<AtomicBool>,
    peers: Vec<JoinHandle<()>>,
}

impl SimFixture {
    fn new() -> SimFixture {
        let mut config = ClusterConfig::new(3, 2);
        config.recv_depth = 256;
        let net = SimNet::threaded(config.clone(), 7, SimFaults::none()).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let peers = (1..config.nodes)
            .map(|n| {
                let (node, stop) = (net.node(n), stop.clone());
                std::thread::spawn(move || conformance::run_peer(node, stop).unwrap())
            })
            .collect();
        SimFixture {
            config,
            driver: net.node(0),
            stop,
            peers,
        }
    }
}

impl Drop for SimFixture {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for p in self.peers.drain(..) {
            let _ = p.join();
        }
    }
}

impl Fixture for SimFixture {
    fn config(&self) -> &ClusterConfig {
        &self.config
    }
    fn driver(&self) -> SharedNode {
        self.driver.clone()
    }
}

ambidex_transport::conformance_tests!(SimFixture::new());
