//! One-sided reliability: with 5% of one-sided packets dropped and 5% duplicated (in
//! both directions), every operation completes exactly once and in order, and FAA
//! totals are exact. Also: the window, and timeouts against a silent target.

mod common;

use ambidex_transport::conformance::{self, completions, peer_regions};
use ambidex_transport::*;
use ambidex_transport_udp::{LossConfig, UdpNode, UdpOptions};
use common::{port_block, test_config};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A 2-node cluster in this process: node 1 runs the peer agent on its own threads.
struct Cluster {
    driver: SharedNode,
    stop: Arc<AtomicBool>,
    peer: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(p) = self.peer.take() {
            let _ = p.join();
        }
    }
}

fn addrs(config: &ClusterConfig) -> Vec<SocketAddr> {
    let base = port_block(config.nodes * config.threads_per_node);
    (0..config.nodes)
        .map(|n| SocketAddr::from(([127, 0, 0, 1], base + n * config.threads_per_node)))
        .collect()
}

fn cluster(opts: UdpOptions, serve: bool) -> (Cluster, SharedNode) {
    let mut config = test_config();
    config.nodes = 2;
    let a = addrs(&config);
    let driver = UdpNode::open_with(&config, &a, 0, opts.clone()).unwrap();
    let target = UdpNode::open_with(&config, &a, 1, opts).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let peer = serve.then(|| {
        let (t, s) = (target.clone(), stop.clone());
        std::thread::spawn(move || conformance::run_peer(t, s).unwrap())
    });
    (Cluster { driver, stop, peer }, target)
}

fn lossy() -> UdpOptions {
    UdpOptions {
        rto_initial: Duration::from_millis(2),
        loss: Some(LossConfig {
            seed: 42,
            drop: 0.05,
            duplicate: 0.05,
        }),
        ..UdpOptions::default()
    }
}

#[test]
fn onesided_exactly_once_under_loss_and_duplication() {
    let (c, _target) = cluster(lossy(), true);
    let mut ep0 = c.driver.endpoint(0).unwrap();
    let remote = peer_regions(&mut *ep0, 1)[0];
    let word = remote.at(512);
    const BATCHES: u64 = 150;
    const PER: u64 = 8;
    // Two endpoints, batches of FAAs of which every fourth (and the last) is signaled.
    let run = move |mut ep: Box<dyn Endpoint>, add: u64| {
        let mut seen = Vec::new();
        for b in 0..BATCHES {
            let ops: Vec<OneSidedOp> = (0..PER)
                .map(|i| OneSidedOp {
                    wr_id: b * PER + i,
                    remote: word,
                    kind: OneSidedKind::Faa { add },
                    signaled: i % 4 == 3,
                })
                .collect();
            ep.post(&ops).unwrap();
            for c in completions(&mut *ep, 2) {
                assert_eq!(c.status, Ok(()));
                seen.push(c.wr_id);
            }
        }
        assert_eq!(ep.outstanding(), 0);
        let want: Vec<u64> = (0..BATCHES * PER).filter(|i| i % 4 == 3).collect();
        assert_eq!(
            seen, want,
            "completions missing, duplicated or out of order"
        );
        ep
    };
    let ep1 = c.driver.endpoint(1).unwrap();
    let t = std::thread::spawn(move || run(ep1, 1000));
    let mut ep0 = run(ep0, 1);
    let ep1 = t.join().unwrap();

    // WRITE then READ under the same loss: the data is exact.
    let scratch = c.driver.register(4096, Perms::ALL).unwrap();
    for i in 0..40u64 {
        let data: Vec<u8> = (0..1000)
            .map(|j| (i as u8).wrapping_mul(31) ^ j as u8)
            .collect();
        ep0.post(&[
            OneSidedOp {
                wr_id: 1,
                remote: remote.at(4096 + i * 8),
                kind: OneSidedKind::Write { data: &data },
                signaled: false,
            },
            OneSidedOp {
                wr_id: 2,
                remote: remote.at(4096 + i * 8),
                kind: OneSidedKind::Read {
                    len: 1000,
                    dest: LocalBuf {
                        region: scratch.id(),
                        offset: 8,
                    },
                },
                signaled: true,
            },
        ])
        .unwrap();
        let c = completions(&mut *ep0, 1);
        assert_eq!((c[0].wr_id, c[0].status), (2, Ok(())));
        let mut back = vec![0u8; 1000];
        scratch.mem.read(8, &mut back);
        assert_eq!(back, data);
    }

    ep0.post(&[OneSidedOp {
        wr_id: 9,
        remote: word,
        kind: OneSidedKind::Faa { add: 0 },
        signaled: true,
    }])
    .unwrap();
    let total = completions(&mut *ep0, 1)[0].value;
    assert_eq!(
        total,
        BATCHES * PER * 1001,
        "an FAA was lost or executed twice"
    );
    // Nothing more arrives later (no duplicate completions).
    let mut extra = Vec::new();
    let until = Instant::now() + Duration::from_millis(100);
    while Instant::now() < until {
        ep0.poll_cq(16, &mut extra);
        ep0.wait(Duration::from_millis(5));
    }
    assert!(extra.is_empty(), "late completions: {extra:?}");

    let mut s = ep0.counters();
    s.merge(&ep1.counters());
    eprintln!("driver counters: {:?}", s.drops_and_errors());
    assert!(s.get("fault_dropped") > 0 && s.get("fault_duplicated") > 0);
    assert!(s.get("onesided_retransmits") > 0);
}

#[test]
fn window_bounds_inflight_and_keeps_order() {
    let (c, _target) = cluster(UdpOptions::default(), true);
    let mut ep = c.driver.endpoint(0).unwrap();
    let word = peer_regions(&mut *ep, 1)[0].at(0);
    let ops: Vec<OneSidedOp> = (0..300)
        .map(|i| OneSidedOp {
            wr_id: i,
            remote: word,
            kind: OneSidedKind::Faa { add: 1 },
            signaled: true,
        })
        .collect();
    ep.post(&ops).unwrap();
    assert_eq!(ep.outstanding(), 300);
    let got = completions(&mut *ep, 300);
    assert_eq!(ep.outstanding(), 0);
    let values: Vec<u64> = got.iter().map(|c| c.value).collect();
    assert_eq!(
        values,
        (0..300).collect::<Vec<u64>>(),
        "executed out of order"
    );
    let ids: Vec<u64> = got.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, (0..300).collect::<Vec<u64>>());
}

#[test]
fn silent_target_times_out_then_recovers() {
    let give_up = Duration::from_millis(30);
    let opts = UdpOptions {
        rto_initial: Duration::from_millis(1),
        rto_max: Duration::from_millis(4),
        give_up,
        ..UdpOptions::default()
    };
    // Node 1's sockets are bound but nobody polls them.
    let (c, target) = cluster(opts, false);
    let region = target.register(4096, Perms::ALL).unwrap();
    let mut ep = c.driver.endpoint(0).unwrap();
    let ops: Vec<OneSidedOp> = (0..40)
        .map(|i| OneSidedOp {
            wr_id: i,
            remote: region.desc.at(0),
            kind: OneSidedKind::Write { data: b"12345678" },
            signaled: i == 39,
        })
        .collect();
    // Before the post, which sends the first requests.
    let start = Instant::now();
    ep.post(&ops).unwrap();
    let got = completions(&mut *ep, 40);
    // The give-up time runs from the first transmission, whatever the retransmissions.
    let took = start.elapsed();
    assert!(took >= give_up && took < Duration::from_secs(2), "{took:?}");
    assert!(ep.counters().get("onesided_retransmits") >= 4);
    assert!(got.iter().all(|c| c.status == Err(AccessError::Timeout)));
    let ids: Vec<u64> = got.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, (0..40).collect::<Vec<u64>>());
    assert_eq!(ep.outstanding(), 0);
    assert_eq!(ep.counters().get("onesided_errors"), 40);

    // The target comes alive: a new session starts and works.
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let server = std::thread::spawn(move || {
        let mut tep = target.endpoint(0).unwrap();
        while !s.load(Ordering::Relaxed) {
            tep.poll_recv(64, &mut |_, _| {});
            tep.wait(Duration::from_millis(1));
        }
    });
    ep.post(&[OneSidedOp {
        wr_id: 100,
        remote: region.desc.at(8),
        kind: OneSidedKind::Cas {
            expected: 0,
            new: 7,
        },
        signaled: true,
    }])
    .unwrap();
    let c2 = completions(&mut *ep, 1);
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap();
    assert_eq!((c2[0].wr_id, c2[0].status, c2[0].value), (100, Ok(()), 0));
    assert_eq!(region.mem.word(8).unwrap().load(Ordering::SeqCst), 7);
    drop(c);
}

/// Nodes at loopback addresses share this host; a node elsewhere does not.
#[test]
fn host_threads_count_nodes_on_this_host() {
    let mut config = test_config();
    config.nodes = 3;
    config.threads_per_node = 2;
    let base = port_block(6);
    let addrs = vec![
        SocketAddr::from(([127, 0, 0, 1], base)),
        SocketAddr::from(([127, 0, 0, 2], base + 2)),
        // Never bound or sent to: only node 0 is opened, and nothing is sent.
        SocketAddr::from(([10, 213, 9, 9], base + 4)),
    ];
    let node = UdpNode::open(&config, &addrs, 0).unwrap();
    let ep = node.endpoint(0).unwrap();
    assert_eq!(ep.host_threads(), 4);
}
