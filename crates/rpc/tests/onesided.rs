//! One-sided verbs from worker coroutines, over every backend: a worker on node 0 posts
//! READ, WRITE, CAS and FAA, signaled and unsignaled, to a region registered on node 1,
//! and checks values, in-order effect on one queue, typed error completions (bad key,
//! out of bounds), the report of a failing unsignaled operation, and the counters. On
//! `local` and `shm` node 1's runtime is never polled: its CPU takes no part.

use ambidex_rpc::{Ctx, OneSidedError, RpcError, RpcStats, Runtime, RuntimeConfig};
use ambidex_transport::local::LocalFabric;
use ambidex_transport::region::Region;
use ambidex_transport::{AccessError, ClusterConfig, OpCode, Perms, RegionDesc, SharedNode};
use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

const ECHO: u8 = 7;
const REGION: usize = 4096;

/// What the scenario's worker does besides one-sided operations: with `rpc`, its first
/// batch also carries an echo RPC to node 1 (whose runtime must then be polled).
#[derive(Clone, Copy)]
struct Scenario {
    rpc: bool,
}

/// Node 1's region (all permissions) and node 0's runtime with a scratch region.
struct Setup {
    rt0: Runtime,
    rt1: Runtime,
    target: Region,
    done: Rc<Cell<bool>>,
}

fn setup(nodes: &[SharedNode], cfg: RuntimeConfig, sc: Scenario) -> Setup {
    let rt0 = Runtime::new(nodes[0].endpoint(0).unwrap(), cfg.clone()).unwrap();
    let rt1 = Runtime::new(nodes[1].endpoint(0).unwrap(), cfg).unwrap();
    setup_with(nodes, rt0, rt1, sc)
}

/// `setup` with runtimes built by the caller (with a simulator's clock, say).
fn setup_with(nodes: &[SharedNode], mut rt0: Runtime, mut rt1: Runtime, sc: Scenario) -> Setup {
    let target = nodes[1].register(REGION, Perms::ALL).unwrap();
    let scratch = nodes[0].register(REGION, Perms::ALL).unwrap();
    rt1.register(ECHO, |_, req, resp| resp.extend_from_slice(req));
    // A region of another node is no scratch.
    assert!(rt0.attach_scratch(target.clone(), 1024).is_err());
    rt0.attach_scratch(scratch, 1024).unwrap();
    let done = Rc::new(Cell::new(false));
    let (desc, d) = (target.desc, done.clone());
    rt0.spawn(move |ctx| async move {
        worker(&ctx, desc, sc).await;
        d.set(true);
    });
    Setup {
        rt0,
        rt1,
        target,
        done,
    }
}

fn access(op: OpCode, error: AccessError, signaled: bool) -> OneSidedError {
    OneSidedError::Access {
        op,
        node: 1,
        error,
        signaled,
    }
}

async fn worker(ctx: &Ctx, r: RegionDesc, sc: Scenario) {
    // 1. Values and in-order effect on the (endpoint, node 1) queue.
    let w = ctx
        .queue_write(r.at(64), b"0123456789abcdef", false)
        .unwrap();
    let rd = ctx.queue_read(r.at(64), 16, true).unwrap();
    let c1 = ctx.queue_cas(r.at(0), 0, 5, true).unwrap();
    let c2 = ctx.queue_cas(r.at(0), 5, 9, true).unwrap();
    let c3 = ctx.queue_cas(r.at(0), 5, 1, true).unwrap(); // fails: the word is 9
    let f1 = ctx.queue_faa(r.at(8), 3, true).unwrap();
    let f2 = ctx.queue_faa(r.at(8), 4, false).unwrap();
    let f3 = ctx.queue_faa(r.at(8), 0, true).unwrap();
    let echo = sc.rpc.then(|| ctx.queue(1, ECHO, b"ping").unwrap());
    // Results are not there before the flush.
    assert_eq!(ctx.atomic_result(c1), Err(OneSidedError::NotReady));
    ctx.flush().await.unwrap();
    ctx.read_result(rd, |b| assert_eq!(b, b"0123456789abcdef"))
        .unwrap();
    assert_eq!(ctx.atomic_result(c1), Ok(0));
    assert_eq!(ctx.atomic_result(c2), Ok(5));
    assert_eq!(ctx.atomic_result(c3), Ok(9));
    assert_eq!(ctx.atomic_result(f1), Ok(0));
    assert_eq!(
        ctx.atomic_result(f3),
        Ok(7),
        "the unsignaled FAA ran in order"
    );
    // Unsignaled: confirmed by the later signaled operations (passive ACK), no old value.
    assert_eq!(ctx.op_result(w), Ok(()));
    assert_eq!(ctx.op_result(f2), Ok(()));
    assert_eq!(ctx.atomic_result(f2), Err(OneSidedError::NoValue));
    assert_eq!(ctx.atomic_result(rd), Err(OneSidedError::WrongKind));
    assert_eq!(ctx.read_result(c1, |_| ()), Err(OneSidedError::WrongKind));
    if let Some(h) = echo {
        ctx.response(h, |b| assert_eq!(b, b"ping")).unwrap();
    }

    // 2. Signaled failures are the operations' results; the flush succeeds.
    let mut bad = r.at(0);
    bad.key ^= 1;
    let e1 = ctx.queue_read(bad, 8, true).unwrap();
    let e2 = ctx.queue_cas(r.at(REGION as u64), 0, 1, true).unwrap();
    let ok = ctx.queue_read(r.at(0), 16, true).unwrap();
    ctx.flush().await.unwrap();
    assert_eq!(
        ctx.read_result(e1, |_| ()),
        Err(access(OpCode::Read, AccessError::BadKey, true))
    );
    assert_eq!(
        ctx.atomic_result(e2),
        Err(access(OpCode::Cas, AccessError::OutOfBounds, true))
    );
    ctx.read_result(ok, |b| {
        assert_eq!(u64::from_le_bytes(b[0..8].try_into().unwrap()), 9);
        assert_eq!(u64::from_le_bytes(b[8..16].try_into().unwrap()), 7);
    })
    .unwrap();

    // 3. A failing unsignaled operation is reported by the flush, once.
    let u = ctx
        .queue_write(r.at(REGION as u64 - 4), b"12345678", false)
        .unwrap();
    let after = ctx.queue_faa(r.at(16), 1, true).unwrap();
    let err = ctx.flush().await.unwrap_err();
    assert_eq!(
        err,
        RpcError::UnsignaledFailed(vec![access(OpCode::Write, AccessError::OutOfBounds, false)])
    );
    assert_eq!(
        ctx.op_result(u),
        Err(access(OpCode::Write, AccessError::OutOfBounds, false))
    );
    assert_eq!(ctx.atomic_result(after), Ok(0));
    assert!(ctx.take_unsignaled_failures().is_empty(), "reported once");

    // 4. A flush of unsignaled operations only returns once they are posted; a later
    // batch's signaled READ on the same queue sees their effect.
    ctx.queue_write(r.at(128), &[0xab; 8], false).unwrap();
    ctx.queue_faa(r.at(16), 10, false).unwrap();
    ctx.flush().await.unwrap();
    let rd = ctx.queue_read(r.at(128), 8, true).unwrap();
    let f = ctx.queue_faa(r.at(16), 0, true).unwrap();
    ctx.flush().await.unwrap();
    ctx.read_result(rd, |b| assert_eq!(b, &[0xab; 8])).unwrap();
    assert_eq!(ctx.atomic_result(f), Ok(11));

    // 5. Refused at queue time: too large, unknown node, no scratch room left.
    let mut far = r.at(0);
    far.node = 9;
    assert_eq!(
        ctx.queue_cas(far, 0, 1, true),
        Err(OneSidedError::Invalid(AccessError::UnknownNode))
    );
    assert_eq!(
        ctx.queue_write(r.at(0), &vec![0; 1 << 20], true),
        Err(OneSidedError::Invalid(AccessError::TooLarge))
    );
    ctx.queue_read(r.at(0), 1000, true).unwrap();
    assert_eq!(
        ctx.queue_read(r.at(0), 100, true),
        Err(OneSidedError::NoScratch {
            need: 100,
            room: 24
        })
    );
    ctx.flush().await.unwrap();

    // 6. A failing unsignaled operation of a batch whose flush did not wait for it (no
    // signaled operation after it) is still reported, by a later flush or on request.
    ctx.queue_cas(bad, 0, 1, false).unwrap();
    // Where the error completion is in before the flush ends (local, shm), the flush
    // reports it; else a later query does.
    let mut seen = match ctx.flush().await {
        Ok(()) => Vec::new(),
        Err(RpcError::UnsignaledFailed(v)) => v,
        Err(e) => panic!("flush: {e}"),
    };
    for _ in 0..100_000 {
        if !seen.is_empty() {
            break;
        }
        ctx.yield_now().await;
        seen = ctx.take_unsignaled_failures();
    }
    assert_eq!(seen, vec![access(OpCode::Cas, AccessError::BadKey, false)]);
}

fn check_end(s: &Setup) -> RpcStats {
    assert!(s.done.get(), "the worker finished");
    let st = s.rt0.stats();
    assert_eq!(st.onesided_reads, 5);
    assert_eq!(st.onesided_writes, 3);
    assert_eq!(st.onesided_cas, 5);
    assert_eq!(st.onesided_faa, 6);
    assert_eq!(st.onesided_failed, 4);
    assert_eq!(st.onesided_unsignaled_failed, 2);
    assert_eq!(st.onesided_stray, 0);
    // The target's memory as its owner sees it.
    let mut b = [0u8; 24];
    assert!(s.target.mem.read(0, &mut b));
    assert_eq!(u64::from_le_bytes(b[0..8].try_into().unwrap()), 9);
    assert_eq!(u64::from_le_bytes(b[8..16].try_into().unwrap()), 7);
    assert_eq!(u64::from_le_bytes(b[16..24].try_into().unwrap()), 11);
    let mut tail = [0u8; 4];
    assert!(s.target.mem.read(REGION as u64 - 4, &mut tail));
    assert_eq!(tail, [0; 4], "the refused WRITE changed nothing");
    st
}

/// Steps node 0 only (node 1's runtime is never polled) until the worker is done.
fn run_alone(s: &mut Setup) {
    for _ in 0..100_000 {
        if s.done.get() {
            break;
        }
        s.rt0.poll_once();
    }
    let st = check_end(s);
    assert_eq!(st.tx_datagrams, 0, "one-sided only: no datagram");
    assert_eq!(
        s.rt1.stats(),
        RpcStats::default(),
        "node 1's runtime did nothing"
    );
}

/// Steps both nodes until the worker is done (bounded by wall time).
fn run_both(s: &mut Setup, mut between: impl FnMut()) {
    let t0 = Instant::now();
    while !s.done.get() && t0.elapsed() < Duration::from_secs(20) {
        s.rt0.poll_once();
        s.rt1.poll_once();
        between();
    }
    let st = check_end(s);
    assert_eq!(st.rpcs_completed, 1);
}

fn local(rpc: bool) -> Setup {
    let fabric = LocalFabric::new(ClusterConfig::new(2, 1)).unwrap();
    setup(&fabric.nodes(), RuntimeConfig::default(), Scenario { rpc })
}

#[test]
fn local_completes_without_the_target_cpu() {
    run_alone(&mut local(false));
}

#[test]
fn local_with_rpcs_in_the_same_flush() {
    run_both(&mut local(true), || {});
}

#[test]
fn shm_completes_without_the_target_cpu() {
    use ambidex_transport_shm::{ShmCluster, ShmNode};
    let mut config = ClusterConfig::new(2, 1);
    config.recv_depth = 256;
    config.cluster_id ^= std::process::id() as u64;
    let base = match std::path::Path::new("/dev/shm").is_dir() {
        true => std::path::PathBuf::from("/dev/shm"),
        false => std::env::temp_dir(),
    };
    let dir = base.join(format!("ambidex-rpc-onesided-{}", std::process::id()));
    let _ = ShmCluster::remove(&dir);
    ShmCluster::create(&dir, &config).unwrap();
    let nodes = [
        ShmNode::open(&dir, 0).unwrap(),
        ShmNode::open(&dir, 1).unwrap(),
    ];
    let mut s = setup(&nodes, RuntimeConfig::default(), Scenario { rpc: false });
    run_alone(&mut s);
    drop(s);
    drop(nodes);
    ShmCluster::remove(&dir).unwrap();
}

#[test]
fn udp_target_serves_from_its_poll_loop() {
    use ambidex_transport_udp::UdpNode;
    let config = ClusterConfig::new(2, 1);
    // Ports from the process id, so parallel test binaries do not collide.
    let base = 20_000 + (std::process::id() % 20_000) as u16 * 2;
    let addrs: Vec<std::net::SocketAddr> = (0..2)
        .map(|n| format!("127.0.0.1:{}", base + n).parse().unwrap())
        .collect();
    let nodes: Vec<SharedNode> = (0..2)
        .map(|n| UdpNode::open(&config, &addrs, n).unwrap())
        .collect();
    let mut s = setup(&nodes, RuntimeConfig::default(), Scenario { rpc: true });
    run_both(&mut s, || {});
}

#[test]
fn sim_with_onesided_loss_delay_and_reordering() {
    use ambidex_rpc::ManualClock;
    use ambidex_transport_sim::{SimFaults, SimNet};
    use std::sync::Arc;
    let mut retransmits = 0;
    for seed in 1..=4u64 {
        let faults = SimFaults {
            reorder: 0.2,
            onesided_loss: 0.2,
            onesided_duplicate: 0.1,
            onesided_delay: 0.2,
            ..SimFaults::default()
        };
        let net = SimNet::new(ClusterConfig::new(2, 1), seed, faults).unwrap();
        let nodes = net.nodes();
        let clock = Arc::new(ManualClock::new(0));
        let mk = |n: usize| {
            let ep = nodes[n].endpoint(0).unwrap();
            Runtime::with_clock(ep, RuntimeConfig::default(), clock.clone()).unwrap()
        };
        let (rt0, rt1) = (mk(0), mk(1));
        let mut s = setup_with(&nodes, rt0, rt1, Scenario { rpc: true });
        run_both(&mut s, || {
            let t = net.next_event_time().unwrap_or(net.now() + 1_000);
            net.advance_to(t);
            clock.set(net.now());
        });
        retransmits += net.stats().onesided_retransmits;
    }
    assert!(retransmits > 0, "one-sided faults happened");
}

/// Many workers' operations share each step's post; completions find their workers by
/// `wr_id`, and every FAA (signaled or not) lands exactly once.
fn many_workers(nodes: &[SharedNode], mut between: impl FnMut()) {
    let target = nodes[1].register(REGION, Perms::ALL).unwrap();
    let mut rt = Runtime::new(nodes[0].endpoint(0).unwrap(), RuntimeConfig::default()).unwrap();
    let (workers, rounds) = (8u64, 50u64);
    let done = Rc::new(Cell::new(0));
    for w in 0..workers {
        let (r, done) = (target.desc, done.clone());
        rt.spawn(move |ctx| async move {
            let mut last = 0;
            for i in 0..rounds {
                ctx.queue_faa(r.at(0), 1, false).unwrap();
                let h = ctx.queue_faa(r.at(0), 1, true).unwrap();
                let mine = ctx.queue_faa(r.at(8 * (w + 1)), 1, true).unwrap();
                ctx.flush().await.unwrap();
                // The shared word only grows (this worker's own unsignaled FAA came
                // first); the worker's own word counts its rounds.
                let v = ctx.atomic_result(h).unwrap();
                assert!(v > last || i == 0, "{v} after {last}");
                last = v;
                assert_eq!(ctx.atomic_result(mine), Ok(i));
            }
            done.set(done.get() + 1);
        });
    }
    let t0 = Instant::now();
    while done.get() < workers && t0.elapsed() < Duration::from_secs(20) {
        rt.poll_once();
        between();
    }
    assert_eq!(done.get(), workers);
    let word = |off: u64| {
        let mut b = [0u8; 8];
        assert!(target.mem.read(off, &mut b));
        u64::from_le_bytes(b)
    };
    assert_eq!(word(0), 2 * workers * rounds);
    for w in 0..workers {
        assert_eq!(word(8 * (w + 1)), rounds);
    }
    let st = rt.stats();
    assert_eq!(st.onesided_faa, 3 * workers * rounds);
    assert_eq!((st.onesided_failed, st.onesided_stray), (0, 0));
}

#[test]
fn local_many_workers_share_the_steps_post() {
    let fabric = LocalFabric::new(ClusterConfig::new(2, 1)).unwrap();
    many_workers(&fabric.nodes(), || {});
}

#[test]
fn sim_many_workers_under_onesided_loss() {
    use ambidex_transport_sim::{SimFaults, SimNet};
    let faults = SimFaults {
        onesided_loss: 0.1,
        onesided_duplicate: 0.1,
        onesided_delay: 0.2,
        ..SimFaults::default()
    };
    let net = SimNet::new(ClusterConfig::new(2, 1), 7, faults).unwrap();
    many_workers(&net.nodes(), || {
        let t = net.next_event_time().unwrap_or(net.now() + 1_000);
        net.advance_to(t);
    });
}

/// An unsignaled READ that is not confirmed keeps its scratch range: the transport may
/// still write it, so the worker's next batch must not read into it (sim: the READ is
/// still in flight when the flush of unsignaled operations returns).
#[test]
fn sim_unconfirmed_unsignaled_read_keeps_its_scratch() {
    use ambidex_transport_sim::{SimFaults, SimNet};
    let net = SimNet::new(ClusterConfig::new(2, 1), 3, SimFaults::default()).unwrap();
    let nodes = net.nodes();
    let target = nodes[1].register(REGION, Perms::ALL).unwrap();
    assert!(target.mem.write(0, &[0x5a; 16]));
    let mut rt = Runtime::new(nodes[0].endpoint(0).unwrap(), RuntimeConfig::default()).unwrap();
    rt.attach_scratch(nodes[0].register(REGION, Perms::ALL).unwrap(), 1024)
        .unwrap();
    let done = Rc::new(Cell::new(false));
    let (r, d) = (target.desc, done.clone());
    rt.spawn(move |ctx| async move {
        ctx.queue_read(r.at(0), 1000, false).unwrap();
        ctx.flush().await.unwrap();
        assert_eq!(
            ctx.queue_read(r.at(0), 100, true),
            Err(OneSidedError::NoScratch {
                need: 100,
                room: 24
            }),
            "the unconfirmed READ holds 1000 bytes"
        );
        let mut h = None;
        for _ in 0..10_000 {
            ctx.yield_now().await;
            if let Ok(x) = ctx.queue_read(r.at(0), 100, true) {
                h = Some(x);
                break;
            }
        }
        ctx.flush().await.unwrap();
        ctx.read_result(h.expect("confirmed in time"), |b| {
            assert_eq!(&b[..16], &[0x5a; 16])
        })
        .unwrap();
        d.set(true);
    });
    for _ in 0..100_000 {
        if done.get() {
            break;
        }
        rt.poll_once();
        let t = net.next_event_time().unwrap_or(net.now() + 1_000);
        net.advance_to(t);
    }
    assert!(done.get());
}
