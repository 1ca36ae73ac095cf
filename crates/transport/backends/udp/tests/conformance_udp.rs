//! The conformance suite against the udp backend on loopback: node 0 is this process,
//! nodes 1 and 2 are `udp-peer` processes with fresh ports per test.

mod common;

use ambidex_transport::conformance::{drain, recv_n};
use ambidex_transport::{Datagram, EndpointAddr};
use common::{garbage, UdpFixture};
use std::collections::BTreeMap;
use std::time::Duration;

ambidex_transport::conformance_tests!(UdpFixture::loopback());

/// Every kind of garbage lands in exactly its own counter, and nothing is delivered.
#[test]
fn garbage_is_counted_by_reason() {
    let f = UdpFixture::loopback();
    let mut ep = f.driver.endpoint(0).unwrap();
    let items = garbage(&f.config, ep.addr());
    let mut want: BTreeMap<&str, u64> = BTreeMap::new();
    for (c, _) in &items {
        *want.entry(c).or_default() += 1;
    }
    use ambidex_transport::conformance::Fixture;
    f.inject_garbage(ep.addr()).unwrap();
    assert!(drain(&mut *ep, Duration::from_millis(300)).is_empty());
    let got = ep.counters();
    for (c, n) in want {
        assert_eq!(got.get(c), n, "counter {c}");
    }
    // The endpoint still works.
    ep.send(&[Datagram {
        dst: EndpointAddr::new(2, 1),
        payload: b"E!",
    }])
    .unwrap();
    assert_eq!(recv_n(&mut *ep, 1, Duration::from_secs(10)).len(), 1);
}

/// The kernel really drops a flood beyond the socket buffer, and every drop is counted
/// (the suite's overflow check would also pass if nothing were dropped).
#[test]
fn kernel_drops_are_counted() {
    let f = UdpFixture::loopback();
    let mut ep = f.driver.endpoint(0).unwrap();
    let n = 8 * f.config.recv_depth as u32;
    let mut cmd = vec![b'F'];
    cmd.extend_from_slice(&n.to_le_bytes());
    cmd.extend_from_slice(&32u32.to_le_bytes());
    ep.send(&[Datagram {
        dst: EndpointAddr::new(1, 1),
        payload: &cmd,
    }])
    .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let got = drain(&mut *ep, Duration::from_millis(300)).len() as u64;
    let dropped = ep.counters().get("rx_dropped_queue_full");
    eprintln!("flood of {n}: {got} received, {dropped} dropped by the kernel");
    assert!(dropped > 0, "the socket buffer held a flood of {n}");
    assert_eq!(got + dropped, n as u64);
}
