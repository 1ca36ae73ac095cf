//! An in-process restart (`local` backend): a crashed node's endpoints can be taken
//! again by its new incarnation, which receives what is sent to it from then on and
//! drops what its old incarnation left unread (an older epoch).

use ambidex_transport::local::LocalFabric;
use ambidex_transport::{ClusterConfig, Datagram, EndpointAddr};

#[test]
fn a_restarted_node_takes_its_endpoints_again() {
    let fabric = LocalFabric::new(ClusterConfig::new(2, 1)).unwrap();
    let (n0, n1) = (fabric.node(0), fabric.node(1));
    let mut a = n0.endpoint(0).unwrap();
    let old = n1.endpoint(0).unwrap();
    assert!(n1.endpoint(0).is_err(), "an endpoint is taken once");
    let to1 = EndpointAddr::new(1, 0);
    // Left unread by the old incarnation (epoch 1).
    a.send(&[Datagram {
        dst: to1,
        payload: b"old",
    }])
    .unwrap();
    // The old incarnation is dead: its endpoint is never used again.
    std::mem::forget(old);
    n1.restart().unwrap();
    let mut new = n1.endpoint(0).unwrap();
    assert!(n1.endpoint(0).is_err(), "taken again, once");
    a.set_epoch(2);
    new.set_epoch(2);
    a.send(&[Datagram {
        dst: to1,
        payload: b"new",
    }])
    .unwrap();
    let mut got = Vec::new();
    for _ in 0..100 {
        new.poll_recv(16, &mut |_, p| got.push(p.to_vec()));
        if !got.is_empty() {
            break;
        }
    }
    assert_eq!(got, vec![b"new".to_vec()]);
}
