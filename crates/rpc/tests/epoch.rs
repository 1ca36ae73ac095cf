//! A runtime following its node's epoch (issue 18): what was queued or in flight in the
//! old epoch fails at once with `EpochChanged`, nothing of it is sent in the new one,
//! and requests to nodes that are no longer members are refused when queued.

use ambidex_rpc::*;
use ambidex_transport::local::LocalFabric;
use ambidex_transport::{ClusterConfig, Endpoint, NodeId};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

const ECHO: u8 = 1;

/// A node's epoch and members, set by the test.
#[derive(Default)]
struct Watch {
    epoch: AtomicU32,
    members: AtomicU64,
}

impl EpochWatch for Watch {
    fn epoch(&self) -> u32 {
        self.epoch.load(Ordering::Acquire)
    }
    fn members(&self) -> u64 {
        self.members.load(Ordering::Acquire)
    }
}

fn watch(epoch: u32, members: u64) -> Arc<Watch> {
    Arc::new(Watch {
        epoch: AtomicU32::new(epoch),
        members: AtomicU64::new(members),
    })
}

/// Runtimes of a 3-node cluster (one thread each) with an echo handler, each following
/// its own watch; returns them with the watches.
fn cluster() -> (Vec<Runtime>, Vec<Arc<Watch>>) {
    let cc = ClusterConfig::new(3, 1);
    let fabric = LocalFabric::new(cc.clone()).unwrap();
    let mut rts = Vec::new();
    let mut ws = Vec::new();
    for n in 0..cc.nodes {
        let ep: Box<dyn Endpoint> = fabric.node(n).endpoint(0).unwrap();
        let mut rt = Runtime::new(ep, RuntimeConfig::default()).unwrap();
        rt.register(ECHO, |_, req, resp| resp.extend_from_slice(req));
        let w = watch(cc.epoch, 0b111);
        rt.follow(w.clone());
        rts.push(rt);
        ws.push(w);
    }
    (rts, ws)
}

/// Polls `rt` enough times that it reads its clock (and so its epoch) at least once.
fn steps(rt: &mut Runtime) {
    for _ in 0..64 {
        rt.poll_once();
    }
}

type Outcome = Rc<RefCell<Option<(Result<(), RpcError>, Result<Vec<u8>, RpcError>)>>>;

/// Spawns a worker on `rt` that sends one echo to `to` and records the outcome.
fn echo(rt: &mut Runtime, to: NodeId) -> Outcome {
    let out: Outcome = Rc::new(RefCell::new(None));
    let o = out.clone();
    rt.spawn(move |ctx| async move {
        let h = ctx.queue(to, ECHO, b"x").unwrap();
        let f = ctx.flush().await;
        *o.borrow_mut() = Some((f, ctx.response(h, |r| r.to_vec())));
    });
    out
}

#[test]
fn a_request_in_flight_fails_when_the_epoch_changes() {
    let (mut rts, ws) = cluster();
    let out = echo(&mut rts[0], 1);
    // Node 1 never polls: the request stays in flight.
    steps(&mut rts[0]);
    assert!(out.borrow().is_none(), "still in flight");
    ws[0].epoch.fetch_add(1, Ordering::SeqCst);
    steps(&mut rts[0]);
    let r = out.borrow().clone().expect("failed at the epoch change");
    assert_eq!(r.0, Err(RpcError::EpochChanged));
    assert_eq!(r.1, Err(RpcError::EpochChanged));
    let s = rts[0].stats();
    assert_eq!((s.epoch_changes, s.failed_by_epoch), (1, 1));
    assert_eq!(rts[0].epoch(), ClusterConfig::new(3, 1).epoch + 1);
}

#[test]
fn both_sides_in_the_new_epoch_talk_and_the_old_epoch_is_dropped() {
    let (mut rts, ws) = cluster();
    // Node 0 moves to the next epoch first: node 1 (still in the old one) drops its
    // request, which is retransmitted and answered once node 1 moves too.
    ws[0].epoch.fetch_add(1, Ordering::SeqCst);
    steps(&mut rts[0]);
    let out = echo(&mut rts[0], 1);
    for _ in 0..200 {
        rts[0].poll_once();
        rts[1].poll_once();
    }
    assert!(
        out.borrow().is_none(),
        "an epoch behind, node 1 drops the request"
    );
    assert!(rts[1].endpoint_counters().get("rx_dropped_wrong_epoch") > 0);
    ws[1].epoch.fetch_add(1, Ordering::SeqCst);
    let t0 = std::time::Instant::now();
    while out.borrow().is_none() {
        rts[0].poll_once();
        rts[1].poll_once();
        assert!(t0.elapsed().as_secs() < 5, "no answer in the new epoch");
    }
    let r = out.borrow().clone().unwrap();
    assert_eq!(r.0, Ok(()));
    assert_eq!(r.1, Ok(b"x".to_vec()));
}

#[test]
fn a_batch_queued_in_the_old_epoch_is_never_sent() {
    let (mut rts, ws) = cluster();
    let out: Outcome = Rc::new(RefCell::new(None));
    let o = out.clone();
    let w0 = ws[0].clone();
    rts[0].spawn(move |ctx| async move {
        let h = ctx.queue(1, ECHO, b"x").unwrap();
        // The epoch changes between the queue and the flush.
        w0.epoch.fetch_add(1, Ordering::SeqCst);
        ctx.yield_now().await;
        ctx.yield_now().await;
        let f = ctx.flush().await;
        *o.borrow_mut() = Some((f, ctx.response(h, |r| r.to_vec())));
    });
    ws[1].epoch.fetch_add(1, Ordering::SeqCst);
    for _ in 0..200 {
        rts[0].poll_once();
        rts[1].poll_once();
    }
    let r = out.borrow().clone().expect("the flush returned");
    assert_eq!(r.0, Err(RpcError::EpochChanged));
    assert_eq!(r.1, Err(RpcError::EpochChanged));
    assert_eq!(rts[1].stats().requests_served, 0, "nothing reached node 1");
}

#[test]
fn requests_to_a_removed_node_are_refused_when_queued() {
    let (mut rts, ws) = cluster();
    ws[0].members.store(0b011, Ordering::SeqCst);
    ws[0].epoch.fetch_add(1, Ordering::SeqCst);
    steps(&mut rts[0]);
    let out: Rc<RefCell<Option<Result<ReqHandle, RpcError>>>> = Rc::new(RefCell::new(None));
    let o = out.clone();
    rts[0].spawn(move |ctx| async move {
        *o.borrow_mut() = Some(ctx.queue(2, ECHO, b"x"));
    });
    steps(&mut rts[0]);
    assert_eq!(out.borrow().clone(), Some(Err(RpcError::NotMember(2))));
    assert_eq!(rts[0].stats().not_member, 1);
}

/// A passive-ACK install to a node that crashed (unsignaled WRITEs, then the signaled
/// release CAS, on one queue) ends when the cluster moves on without it: the epoch
/// change fails the old epoch's operations still in flight, whatever their number,
/// without waiting out the NIC's retries for each in turn (simulated network, stepped).
#[test]
fn onesided_operations_to_a_node_that_left_fail_at_the_epoch_change() {
    use ambidex_rpc::ManualClock;
    use ambidex_transport::{AccessError, Perms};
    use ambidex_transport_sim::{SimFaults, SimNet};
    let net = SimNet::new(ClusterConfig::new(3, 1), 5, SimFaults::default()).unwrap();
    let nodes = net.nodes();
    let target = nodes[2].register(4096, Perms::ALL).unwrap();
    let clock = Arc::new(ManualClock::new(0));
    let ep = nodes[0].endpoint(0).unwrap();
    let mut rt = Runtime::with_clock(ep, RuntimeConfig::default(), clock.clone()).unwrap();
    let w = watch(ClusterConfig::new(3, 1).epoch, 0b111);
    rt.follow(w.clone());
    let out = Rc::new(RefCell::new(None));
    let (o, r) = (out.clone(), target.desc);
    rt.spawn(move |ctx| async move {
        for i in 0..30 {
            ctx.queue_write(r.at(8 + 8 * i), &[1; 8], false).unwrap();
        }
        let cas = ctx.queue_cas(r.at(0), 0, 1, true).unwrap();
        let f = ctx.flush().await;
        *o.borrow_mut() = Some((f, ctx.atomic_result(cas)));
    });
    rt.poll_once();
    net.crash(2);
    let step = |rt: &mut Runtime| {
        rt.poll_once();
        let t = net.next_event_time().unwrap_or(net.now() + 1_000);
        net.advance_to(t.min(net.now() + 10_000));
        clock.set(net.now());
    };
    // The NIC retries (a give-up time of several ms): nothing completes yet.
    while net.now() < 1_000_000 {
        step(&mut rt);
    }
    assert!(
        out.borrow().is_none(),
        "completed while node 2 was a member"
    );
    w.members.store(0b011, Ordering::SeqCst);
    w.epoch.fetch_add(1, Ordering::SeqCst);
    let moved = net.now();
    while out.borrow().is_none() && net.now() < moved + 200_000_000 {
        step(&mut rt);
    }
    let waited = net.now() - moved;
    let r = out.borrow().clone().expect("the install never ended");
    assert!(
        waited < 1_000_000,
        "ended {waited} ns after the epoch change"
    );
    assert!(
        matches!(
            r.1,
            Err(OneSidedError::Access {
                error: AccessError::EpochChanged,
                ..
            })
        ),
        "{r:?}"
    );
    assert!(
        matches!(r.0, Err(RpcError::UnsignaledFailed(ref v)) if v.len() == 30),
        "{r:?}"
    );
}
