//! The fault injector takes time only from the clock it is given: a delayed datagram
//! stays held, however long the test takes, until that clock passes its release time.

use ambidex_transport::fault::{FaultConfig, FaultyEndpoint};
use ambidex_transport::local::LocalFabric;
use ambidex_transport::{ClusterConfig, Datagram, EndpointAddr, ManualClock};
use std::sync::Arc;
use std::time::Duration;

#[test]
fn delays_follow_the_given_clock() {
    let fabric = LocalFabric::new(ClusterConfig::new(2, 1)).unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    let cfg = FaultConfig {
        delay: 1.0,
        max_delay: Duration::from_millis(1),
        ..FaultConfig::default()
    };
    let raw = fabric.node(0).endpoint(0).unwrap();
    let mut tx = FaultyEndpoint::wrap_with_clock(raw, cfg, clock.clone()).unwrap();
    let mut rx = fabric.node(1).endpoint(0).unwrap();
    let to = EndpointAddr::new(1, 0);
    tx.send(&[Datagram {
        dst: to,
        payload: b"late",
    }])
    .unwrap();

    let received = |rx: &mut Box<dyn ambidex_transport::Endpoint>| {
        let mut got = Vec::new();
        rx.poll_recv(16, &mut |_, p| got.push(p.to_vec()));
        got
    };
    // Real time passes; the injector's clock does not: the datagram stays held.
    std::thread::sleep(Duration::from_millis(5));
    tx.poll_recv(0, &mut |_, _| {});
    assert!(received(&mut rx).is_empty(), "released by wall time");
    // Past the longest delay on the injector's clock, the next poll releases it.
    clock.advance(1_000_000);
    tx.poll_recv(0, &mut |_, _| {});
    assert_eq!(received(&mut rx), vec![b"late".to_vec()]);
}
