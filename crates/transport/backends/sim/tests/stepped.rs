//! The `sim` backend in its stepped (deterministic) mode: the test owns time. Checks
//! determinism, the seeded faults, partitions, crash and restart, and one-sided
//! operations under faults.

use ambidex_transport::{
    AccessError, ClusterConfig, Completion, Datagram, Endpoint, EndpointAddr, LocalBuf,
    OneSidedKind, OneSidedOp, Perms,
};
use ambidex_transport_sim::{SimFaults, SimNet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Advances time to the next event (or by `step` if none) and processes it.
fn tick(net: &SimNet, step: u64) {
    let t = net.next_event_time().unwrap_or(net.now() + step);
    net.advance_to(t);
}

fn recv_all(ep: &mut dyn Endpoint) -> Vec<(EndpointAddr, Vec<u8>)> {
    let mut got = Vec::new();
    ep.poll_recv(usize::MAX, &mut |s, p| got.push((s, p.to_vec())));
    got
}

/// Drives the network until quiet, collecting everything endpoint `ep` receives.
fn drain_into(net: &SimNet, ep: &mut dyn Endpoint) -> Vec<(EndpointAddr, Vec<u8>)> {
    let mut got = Vec::new();
    while net.next_event_time().is_some() {
        tick(net, 1000);
        got.extend(recv_all(ep));
    }
    got.extend(recv_all(ep));
    got
}

fn lossy() -> SimFaults {
    SimFaults {
        drop: 0.1,
        duplicate: 0.05,
        reorder: 0.2,
        delay: 0.05,
        max_delay_ns: 200_000,
        ..SimFaults::none()
    }
}

/// A small conversation between two nodes: node 0 sends numbered datagrams, node 1
/// echoes what arrives. Returns the trace hash and what node 0 got back.
fn conversation(seed: u64, faults: SimFaults) -> (u64, Vec<u32>) {
    let net = SimNet::new(ClusterConfig::new(2, 1), seed, faults).unwrap();
    let mut a = net.node(0).endpoint(0).unwrap();
    let mut b = net.node(1).endpoint(0).unwrap();
    let mut back = Vec::new();
    for round in 0..50u32 {
        let msgs: Vec<[u8; 4]> = (0..4).map(|i| (round * 4 + i).to_le_bytes()).collect();
        let batch: Vec<Datagram> = msgs
            .iter()
            .map(|m| Datagram {
                dst: b.addr(),
                payload: m,
            })
            .collect();
        a.send(&batch).unwrap();
        for _ in 0..3 {
            tick(&net, 1000);
            let got = recv_all(&mut *b);
            let echo: Vec<Datagram> = got
                .iter()
                .map(|(s, p)| Datagram {
                    dst: *s,
                    payload: p,
                })
                .collect();
            b.send(&echo).unwrap();
            for (_, p) in recv_all(&mut *a) {
                back.push(u32::from_le_bytes(p.try_into().unwrap()));
            }
        }
    }
    for (_, p) in drain_into(&net, &mut *a) {
        back.push(u32::from_le_bytes(p.try_into().unwrap()));
    }
    (net.trace_hash(), back)
}

#[test]
fn same_seed_same_run_other_seed_other_run() {
    let (h1, got1) = conversation(11, lossy());
    let (h2, got2) = conversation(11, lossy());
    assert_eq!(h1, h2, "same seed, different trace");
    assert_eq!(got1, got2);
    let (h3, got3) = conversation(12, lossy());
    assert_ne!(h1, h3, "different seeds gave the same trace");
    assert_ne!(got1, got3);
}

#[test]
fn faults_drop_duplicate_and_reorder() {
    let net = SimNet::new(ClusterConfig::new(2, 1), 3, lossy()).unwrap();
    let mut a = net.node(0).endpoint(0).unwrap();
    let mut b = net.node(1).endpoint(0).unwrap();
    let n = 2000u32;
    let msgs: Vec<[u8; 4]> = (0..n).map(|i| i.to_le_bytes()).collect();
    for chunk in msgs.chunks(16) {
        let batch: Vec<Datagram> = chunk
            .iter()
            .map(|m| Datagram {
                dst: b.addr(),
                payload: m,
            })
            .collect();
        a.send(&batch).unwrap();
        // Let some time pass between batches, draining b so its queue never fills.
        let now = net.now();
        net.advance_to(now + 2_000);
        let _ = recv_all(&mut *b);
    }
    net.advance_to(u64::MAX / 2);
    let _ = recv_all(&mut *b);
    let s = net.stats();
    assert_eq!(s.datagrams_sent, n as u64);
    let rate = |x: u64| x as f64 / n as f64;
    assert!((rate(s.dropped_fault) - 0.1).abs() < 0.03, "{s:?}");
    assert!((rate(s.duplicated) - 0.05 * 0.9).abs() < 0.03, "{s:?}");
    assert!(s.reordered > 0 && s.delayed > 0, "{s:?}");
    assert_eq!(
        s.datagrams_delivered,
        n as u64 - s.dropped_fault + s.duplicated,
        "{s:?}"
    );
    let c = a.counters();
    assert_eq!(c.get("fault_dropped"), s.dropped_fault);
    assert_eq!(c.get("fault_duplicated"), s.duplicated);
}

#[test]
fn datagrams_arrive_out_of_order_under_reordering() {
    let net = SimNet::new(ClusterConfig::new(2, 1), 5, lossy()).unwrap();
    let mut a = net.node(0).endpoint(0).unwrap();
    let mut b = net.node(1).endpoint(0).unwrap();
    let msgs: Vec<[u8; 4]> = (0..200u32).map(|i| i.to_le_bytes()).collect();
    for m in &msgs {
        a.send(&[Datagram {
            dst: b.addr(),
            payload: m,
        }])
        .unwrap();
        let now = net.now();
        net.advance_to(now + 1_000);
    }
    let got: Vec<u32> = drain_into(&net, &mut *b)
        .into_iter()
        .map(|(_, p)| u32::from_le_bytes(p.try_into().unwrap()))
        .collect();
    assert!(got.windows(2).any(|w| w[0] > w[1]), "never reordered");
}

#[test]
fn stepped_wait_does_not_move_time() {
    let net = SimNet::new(ClusterConfig::new(2, 1), 1, SimFaults::none()).unwrap();
    let mut a = net.node(0).endpoint(0).unwrap();
    let t0 = net.now();
    a.wait(Duration::from_secs(1));
    assert_eq!(net.now(), t0);
}

#[test]
fn receive_queue_is_bounded_and_drops_are_counted() {
    let mut cfg = ClusterConfig::new(2, 1);
    cfg.recv_depth = 16;
    let net = SimNet::new(cfg, 1, SimFaults::none()).unwrap();
    let mut a = net.node(0).endpoint(0).unwrap();
    let mut b = net.node(1).endpoint(0).unwrap();
    let m = [1u8; 8];
    a.send(&vec![
        Datagram {
            dst: b.addr(),
            payload: &m
        };
        40
    ])
    .unwrap();
    net.advance_to(1_000_000);
    assert_eq!(recv_all(&mut *b).len(), 16);
    assert_eq!(b.counters().get("rx_dropped_queue_full"), 24);
}

#[test]
fn partitions_cut_links_for_their_window_only() {
    let net = SimNet::new(ClusterConfig::new(3, 1), 1, SimFaults::none()).unwrap();
    let mut eps: Vec<Box<dyn Endpoint>> =
        (0..3).map(|n| net.node(n).endpoint(0).unwrap()).collect();
    net.partition(&[2], 100_000, 200_000);
    let send_all = |eps: &mut Vec<Box<dyn Endpoint>>| {
        for (i, j) in [(0, 1), (0, 2), (2, 1), (1, 0)] {
            let dst = eps[j].addr();
            eps[i].send(&[Datagram { dst, payload: b"x" }]).unwrap();
        }
    };
    let count = |net: &SimNet, eps: &mut Vec<Box<dyn Endpoint>>, until: u64| {
        net.advance_to(until);
        eps.iter_mut()
            .map(|e| recv_all(&mut **e).len())
            .collect::<Vec<_>>()
    };
    send_all(&mut eps);
    assert_eq!(
        count(&net, &mut eps, 50_000),
        vec![1, 2, 1],
        "before the window"
    );
    net.advance_to(120_000);
    assert!(net.is_cut(0, 2) && net.is_cut(2, 1) && !net.is_cut(0, 1));
    send_all(&mut eps);
    // Node 2 is cut off: 0 -> 2 and 2 -> 1 are lost, 0 <-> 1 still works.
    assert_eq!(
        count(&net, &mut eps, 150_000),
        vec![1, 1, 0],
        "inside the window"
    );
    assert_eq!(net.stats().dropped_partition, 2);
    net.advance_to(200_000);
    assert!(!net.is_cut(0, 2));
    send_all(&mut eps);
    assert_eq!(
        count(&net, &mut eps, 300_000),
        vec![1, 2, 1],
        "after healing"
    );
}

fn faa(remote: ambidex_transport::RegionDesc, wr_id: u64) -> OneSidedOp<'static> {
    OneSidedOp {
        wr_id,
        remote: remote.at(0),
        kind: OneSidedKind::Faa { add: 1 },
        signaled: true,
    }
}

fn completions_until_quiet(net: &SimNet, ep: &mut dyn Endpoint) -> Vec<Completion> {
    let mut out = Vec::new();
    while net.next_event_time().is_some() {
        tick(net, 1000);
        ep.poll_cq(usize::MAX, &mut out);
    }
    ep.poll_cq(usize::MAX, &mut out);
    out
}

#[test]
fn onesided_operations_to_a_partitioned_node_retry_then_time_out() {
    let faults = SimFaults {
        onesided_rto_ns: 10_000,
        onesided_retries: 3,
        ..SimFaults::none()
    };
    let net = SimNet::new(ClusterConfig::new(2, 1), 1, faults).unwrap();
    let region = net.node(1).register(4096, Perms::ALL).unwrap();
    let mut a = net.node(0).endpoint(0).unwrap();
    // A short cut (shorter than the retries): the operation gets through late.
    net.partition(&[1], 0, 25_000);
    a.post(&[faa(region.desc, 1)]).unwrap();
    let c = completions_until_quiet(&net, &mut *a);
    assert_eq!(c.len(), 1);
    assert_eq!((c[0].wr_id, c[0].status, c[0].value), (1, Ok(()), 0));
    assert!(net.stats().onesided_retransmits >= 2);
    // A long cut: Timeout, and the word is untouched.
    let t = net.now();
    net.partition(&[1], t, t + 1_000_000);
    a.post(&[faa(region.desc, 2)]).unwrap();
    let c = completions_until_quiet(&net, &mut *a);
    assert_eq!(c.len(), 1);
    assert_eq!((c[0].wr_id, c[0].status), (2, Err(AccessError::Timeout)));
    assert_eq!(region.mem.word(0).unwrap().load(Ordering::SeqCst), 1);
    assert_eq!(a.outstanding(), 0);
    assert!(a.counters().get("onesided_errors") >= 1);
}

/// A connection whose operation timed out is in the error state (an RC queue pair's
/// retry count exceeded): the operations queued behind it fail with it, at once, not one
/// give-up time each in turn; a later post starts afresh.
#[test]
fn a_timeout_fails_the_operations_queued_behind_it_at_once() {
    let faults = SimFaults {
        onesided_rto_ns: 10_000,
        onesided_retries: 3,
        ..SimFaults::none()
    };
    let net = SimNet::new(ClusterConfig::new(2, 1), 1, faults).unwrap();
    let region = net.node(1).register(4096, Perms::ALL).unwrap();
    let mut a = net.node(0).endpoint(0).unwrap();
    net.crash(1);
    let ops: Vec<_> = (1..=20).map(|i| faa(region.desc, i)).collect();
    a.post(&ops).unwrap();
    let c = completions_until_quiet(&net, &mut *a);
    assert_eq!(c.len(), 20);
    for (i, c) in c.iter().enumerate() {
        assert_eq!(
            (c.wr_id, c.status),
            (i as u64 + 1, Err(AccessError::Timeout))
        );
    }
    // One give-up time (4 tries of 10 µs plus latencies), not 20.
    assert!(net.now() < 100_000, "done at {} ns", net.now());
    let s = net.stats();
    assert_eq!((s.onesided_timeouts, s.onesided_flushed), (1, 19));
    assert_eq!(a.outstanding(), 0);
    assert_eq!(a.counters().get("onesided_errors"), 20);
    // The connection starts again: the restarted node's memory is reached.
    net.restart(1);
    a.post(&[faa(region.desc, 21)]).unwrap();
    let c = completions_until_quiet(&net, &mut *a);
    assert_eq!((c[0].wr_id, c[0].status, c[0].value), (21, Ok(()), 0));
}

/// An endpoint's move to a new epoch fails its operations of the old one still queued,
/// at once (as the udp backend's does): one to a node that left the configuration does
/// not wait out its retries. Those that already executed complete as they did.
#[test]
fn set_epoch_fails_the_old_epochs_operations_at_once() {
    let net = SimNet::new(ClusterConfig::new(3, 1), 1, SimFaults::none()).unwrap();
    let live = net.node(1).register(4096, Perms::ALL).unwrap();
    let dead = net.node(2).register(4096, Perms::ALL).unwrap();
    let mut a = net.node(0).endpoint(0).unwrap();
    a.post(&[faa(live.desc, 1)]).unwrap();
    // Executed at node 1, its completion still on the way back.
    while net.stats().onesided_executed == 0 {
        tick(&net, 1000);
    }
    net.crash(2);
    a.post(&[faa(dead.desc, 2), faa(dead.desc, 3), faa(live.desc, 4)])
        .unwrap();
    let t = net.now();
    a.set_epoch(2);
    let c = completions_until_quiet(&net, &mut *a);
    let got: Vec<_> = c.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(got.len(), 4);
    assert!(got.contains(&(1, Ok(()))), "{got:?}");
    for w in [2, 3, 4] {
        assert!(
            got.contains(&(w, Err(AccessError::EpochChanged))),
            "{got:?}"
        );
    }
    // No retry budget waited out: done within a network latency.
    assert!(net.now() - t < 50_000, "done {} ns after", net.now() - t);
    assert_eq!(live.mem.word(0).unwrap().load(Ordering::SeqCst), 1);
    assert_eq!(net.stats().onesided_flushed, 3);
    assert_eq!(a.outstanding(), 0);
    // The same epoch again changes nothing; the new epoch's operations run.
    a.set_epoch(2);
    a.post(&[faa(live.desc, 5)]).unwrap();
    let c = completions_until_quiet(&net, &mut *a);
    assert_eq!((c[0].wr_id, c[0].status, c[0].value), (5, Ok(()), 1));
}

#[test]
fn onesided_operations_stay_in_order_under_faults() {
    let faults = SimFaults {
        onesided_loss: 0.2,
        onesided_duplicate: 0.2,
        onesided_delay: 0.2,
        max_delay_ns: 100_000,
        onesided_rto_ns: 20_000,
        onesided_retries: 50,
        ..SimFaults::none()
    };
    for seed in 0..20 {
        let net = SimNet::new(ClusterConfig::new(2, 1), seed, faults.clone()).unwrap();
        let remote = net.node(1).register(4096, Perms::ALL).unwrap();
        let local = net.node(0).register(4096, Perms::ALL).unwrap();
        let mut a = net.node(0).endpoint(0).unwrap();
        let values: Vec<[u8; 8]> = (1..=32u64).map(|v| v.to_le_bytes()).collect();
        let mut ops: Vec<OneSidedOp> = values
            .iter()
            .enumerate()
            .map(|(i, v)| OneSidedOp {
                wr_id: i as u64,
                remote: remote.desc.at(64),
                kind: OneSidedKind::Write { data: v },
                signaled: i % 8 == 7,
            })
            .collect();
        ops.push(OneSidedOp {
            wr_id: 100,
            remote: remote.desc.at(64),
            kind: OneSidedKind::Read {
                len: 8,
                dest: LocalBuf {
                    region: local.desc.id,
                    offset: 0,
                },
            },
            signaled: true,
        });
        a.post(&ops).unwrap();
        assert_eq!(a.outstanding(), 33);
        let c = completions_until_quiet(&net, &mut *a);
        let ids: Vec<u64> = c.iter().map(|c| c.wr_id).collect();
        assert_eq!(ids, vec![7, 15, 23, 31, 100], "seed {seed}");
        assert!(c.iter().all(|c| c.status.is_ok()));
        assert_eq!(local.mem.word(0).unwrap().load(Ordering::SeqCst), 32);
        assert_eq!(a.outstanding(), 0);
    }
}

#[test]
fn crash_kills_endpoints_and_restart_brings_a_new_incarnation() {
    let net: Arc<SimNet> = SimNet::new(ClusterConfig::new(2, 1), 1, SimFaults::none()).unwrap();
    let region = net.node(1).register(4096, Perms::ALL).unwrap();
    region.mem.write(0, &7u64.to_le_bytes());
    let mut a = net.node(0).endpoint(0).unwrap();
    let mut b = net.node(1).endpoint(0).unwrap();
    // In flight when node 1 crashes: lost.
    a.send(&[Datagram {
        dst: b.addr(),
        payload: b"lost",
    }])
    .unwrap();
    net.crash(1);
    assert!(!net.is_up(1));
    net.advance_to(1_000_000);
    assert!(recv_all(&mut *b).is_empty());
    assert_eq!(net.stats().dropped_node_down, 1);
    // The old endpoint is dead: its sends go nowhere.
    b.send(&[Datagram {
        dst: a.addr(),
        payload: b"ghost",
    }])
    .unwrap();
    assert!(
        net.node(1).endpoint(0).is_err(),
        "a down node hands out endpoints"
    );
    // One-sided operations to the crashed node time out.
    a.post(&[faa(region.desc, 9)]).unwrap();
    let c = completions_until_quiet(&net, &mut *a);
    assert_eq!(c[0].status, Err(AccessError::Timeout));
    assert!(recv_all(&mut *a).is_empty());
    // Restart: a new endpoint works, the old one stays dead, memory survived.
    net.restart(1);
    let mut b2 = net.node(1).endpoint(0).unwrap();
    a.send(&[Datagram {
        dst: b2.addr(),
        payload: b"hello",
    }])
    .unwrap();
    net.advance_to(net.now() + 1_000_000);
    assert!(recv_all(&mut *b).is_empty(), "a dead endpoint received");
    assert_eq!(recv_all(&mut *b2), vec![(a.addr(), b"hello".to_vec())]);
    a.post(&[faa(region.desc, 10)]).unwrap();
    let c = completions_until_quiet(&net, &mut *a);
    assert_eq!(
        (c[0].status, c[0].value),
        (Ok(()), 7),
        "memory lost in the crash"
    );
    let s = net.stats();
    assert_eq!((s.crashes, s.restarts), (1, 1));
}

#[test]
fn crash_of_the_initiator_discards_its_operations() {
    let net = SimNet::new(ClusterConfig::new(2, 1), 1, SimFaults::none()).unwrap();
    let region = net.node(1).register(4096, Perms::ALL).unwrap();
    let mut a = net.node(0).endpoint(0).unwrap();
    a.post(&[faa(region.desc, 1), faa(region.desc, 2)]).unwrap();
    net.crash(0);
    net.advance_to(10_000_000);
    assert_eq!(net.in_flight(), 0);
    let mut out = Vec::new();
    assert_eq!(a.poll_cq(16, &mut out), 0);
    assert_eq!(a.outstanding(), 0);
    assert_eq!(region.mem.word(0).unwrap().load(Ordering::SeqCst), 0);
}

#[test]
fn region_keys_come_from_the_seed() {
    let keys = |seed| {
        let net = SimNet::new(ClusterConfig::new(2, 1), seed, SimFaults::none()).unwrap();
        (0..4)
            .map(|_| net.node(1).register(64, Perms::ALL).unwrap().desc.key)
            .collect::<Vec<_>>()
    };
    assert_eq!(keys(5), keys(5));
    assert_ne!(keys(5), keys(6));
}
