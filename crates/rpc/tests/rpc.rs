//! Behavioural tests of the RPC runtime. Most drive every node's runtime step by step in
//! this one thread, as the deterministic simulator will.

use ambidex_rpc::*;
use ambidex_transport::fault::{FaultConfig, FaultyEndpoint};
use ambidex_transport::local::LocalFabric;
use ambidex_transport::{ClusterConfig, Datagram, Endpoint, EndpointAddr};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

const ECHO: u8 = 1;

fn endpoints(cc: ClusterConfig) -> Vec<Box<dyn Endpoint>> {
    let fabric = LocalFabric::new(cc.clone()).unwrap();
    let mut v = Vec::new();
    for n in 0..cc.nodes {
        let node = fabric.node(n);
        for t in 0..cc.threads_per_node {
            v.push(node.endpoint(t).unwrap());
        }
    }
    v
}

fn runtimes(cc: ClusterConfig, cfg: RuntimeConfig) -> Vec<Runtime> {
    endpoints(cc)
        .into_iter()
        .map(|ep| {
            let mut rt = Runtime::new(ep, cfg.clone()).unwrap();
            rt.register(ECHO, |_, req, resp| resp.extend_from_slice(req));
            rt
        })
        .collect()
}

/// Runtimes over endpoints that drop, reorder and duplicate datagrams (seeded from
/// `seed`, one seed per endpoint), retransmitting after 3 ms; no handlers registered.
fn faulty_runtimes(
    cc: ClusterConfig,
    seed: u64,
    drop: f64,
    reorder: f64,
    duplicate: f64,
) -> Vec<Runtime> {
    let cfg = RuntimeConfig {
        give_up: Duration::from_secs(3),
        ..Default::default()
    };
    endpoints(cc)
        .into_iter()
        .enumerate()
        .map(|(i, ep)| {
            let fc = FaultConfig {
                seed: seed + i as u64,
                drop,
                reorder,
                duplicate,
                ..Default::default()
            };
            Runtime::new(FaultyEndpoint::wrap(ep, fc).unwrap(), cfg.clone()).unwrap()
        })
        .collect()
}

/// Steps every runtime round-robin until all workers are done (or a deadline passes).
fn step_all(rts: &mut [Runtime], limit: Duration) {
    let t0 = Instant::now();
    while rts.iter().any(|r| r.live_tasks() > 0) {
        for r in rts.iter_mut() {
            r.poll_once();
        }
        assert!(t0.elapsed() < limit, "cluster did not finish in {limit:?}");
    }
    // Let servers answer the last requests' duplicates, if any.
    for _ in 0..10 {
        for r in rts.iter_mut() {
            r.poll_once();
        }
    }
}

#[test]
fn batching_and_coalescing_datagram_counts() {
    for coalesce in [true, false] {
        let cfg = RuntimeConfig {
            coalesce,
            ..Default::default()
        };
        let mut rts = runtimes(ClusterConfig::new(3, 1), cfg);
        let ok = Rc::new(Cell::new(0));
        let ok2 = ok.clone();
        rts[0].spawn(move |ctx| async move {
            let mut hs = Vec::new();
            for i in 0..8u8 {
                let node = 1 + (i % 2) as u16;
                hs.push((ctx.queue(node, ECHO, &[i; 32]).unwrap(), i));
            }
            ctx.flush().await.unwrap();
            for (h, i) in hs {
                ctx.response(h, |r| assert_eq!(r, &[i; 32])).unwrap();
                ok2.set(ok2.get() + 1);
            }
        });
        step_all(&mut rts, Duration::from_secs(10));
        assert_eq!(ok.get(), 8);
        let c0 = rts[0].endpoint_counters();
        // 8 requests to 2 nodes: one doorbell; 2 datagrams coalesced, else 8.
        assert_eq!(c0.get("tx_doorbells"), 1, "coalesce={coalesce}");
        assert_eq!(c0.get("tx_datagrams"), if coalesce { 2 } else { 8 });
        for rt in &rts[1..3] {
            let c = rt.endpoint_counters();
            // Each server gets its 4 requests in one poll and answers with one doorbell.
            assert_eq!(c.get("tx_doorbells"), 1, "coalesce={coalesce}");
            assert_eq!(c.get("tx_datagrams"), if coalesce { 1 } else { 4 });
            assert_eq!(rt.stats().requests_served, 4);
        }
        assert_eq!(rts[0].stats().rpcs_completed, 8);
    }
}

/// The one-destination flush copies a batch's group items as one run: batches from two
/// coroutines of one step share a datagram (a group each), a batch larger than a
/// datagram is split into one group per datagram, and without coalescing each request
/// has its own datagram. Every response must match its own request.
#[test]
fn one_destination_batches_coalesce_and_split() {
    for coalesce in [true, false] {
        let cfg = RuntimeConfig {
            coalesce,
            ..Default::default()
        };
        // A small MTU, so that a batch within the credit budget still spans datagrams.
        let mut cc = ClusterConfig::new(2, 1);
        cc.mtu = 512;
        let mut rts = runtimes(cc, cfg);
        // Two workers of one step, 4 requests each; then one batch of 30 (1.3 KB of
        // records, more than one 512-byte datagram).
        let done = Rc::new(Cell::new(0));
        for w in 0..2u8 {
            let done = done.clone();
            rts[0].spawn(move |ctx| async move {
                let hs: Vec<_> = (0..4u8)
                    .map(|i| (ctx.queue(1, ECHO, &[w * 16 + i; 32]).unwrap(), w * 16 + i))
                    .collect();
                ctx.flush().await.unwrap();
                for (h, b) in hs {
                    ctx.response(h, |r| assert_eq!(r, &[b; 32])).unwrap();
                }
                done.set(done.get() + 1);
            });
        }
        step_all(&mut rts, Duration::from_secs(10));
        assert_eq!(done.get(), 2);
        let c0 = rts[0].endpoint_counters();
        assert_eq!(c0.get("tx_doorbells"), 1, "coalesce={coalesce}");
        assert_eq!(c0.get("tx_datagrams"), if coalesce { 1 } else { 8 });

        let big = 30u32;
        assert!(
            rts[0].credits_per_dest() >= big,
            "the batch takes the one-destination path"
        );
        let done2 = done.clone();
        rts[0].spawn(move |ctx| async move {
            let hs: Vec<_> = (0..big)
                .map(|i| {
                    let p = i.to_le_bytes().repeat(8);
                    (ctx.queue(1, ECHO, &p).unwrap(), p)
                })
                .collect();
            ctx.flush().await.unwrap();
            for (h, p) in hs {
                ctx.response(h, |r| assert_eq!(r, &p[..])).unwrap();
            }
            done2.set(done2.get() + 1);
        });
        step_all(&mut rts, Duration::from_secs(10));
        assert_eq!(done.get(), 3);
        let sent = rts[0].endpoint_counters().get("tx_datagrams") - c0.get("tx_datagrams");
        let per_dgram = (512 - wire::DGRAM_HDR - wire::REC_HDR) / (wire::ITEM_HDR + 32);
        let want = if coalesce {
            (big as usize).div_ceil(per_dgram) as u64
        } else {
            big as u64
        };
        assert_eq!(sent, want, "coalesce={coalesce}");
        assert_eq!(rts[0].stats().rpcs_completed, 8 + big as u64);
        assert_eq!(rts[1].stats().requests_served, 8 + big as u64);
    }
}

/// The small requests of one flush to one endpoint travel as one group record (one
/// sequence number, one record header), even when the flush interleaves destinations;
/// a request too large for a group goes alone, in segments, between groups. Every
/// response lands at its own request.
#[test]
fn flush_groups_requests_per_destination() {
    let mut rts = runtimes(ClusterConfig::new(3, 1), RuntimeConfig::default());
    let ok = Rc::new(Cell::new(false));
    let ok2 = ok.clone();
    let big_len = 3 * ClusterConfig::new(3, 1).mtu;
    rts[0].spawn(move |ctx| async move {
        // 8 interleaved requests to nodes 1 and 2 (the multi-destination path).
        let mut hs = Vec::new();
        for i in 0..8u8 {
            hs.push((
                ctx.queue(1 + (i % 2) as u16, ECHO, &[i; 32]).unwrap(),
                vec![i; 32],
            ));
        }
        ctx.flush().await.unwrap();
        for (h, p) in &hs {
            ctx.response(*h, |r| assert_eq!(r, &p[..])).unwrap();
        }
        // Small, big, small to one node: the big one is sent alone.
        let big: Vec<u8> = (0..big_len as u32).map(|i| i as u8).collect();
        let hs = [
            (ctx.queue(1, ECHO, b"first").unwrap(), b"first".to_vec()),
            (ctx.queue(1, ECHO, &big).unwrap(), big.clone()),
            (ctx.queue(1, ECHO, b"last").unwrap(), b"last".to_vec()),
        ];
        ctx.flush().await.unwrap();
        for (h, p) in &hs {
            ctx.response(*h, |r| assert_eq!(r, &p[..])).unwrap();
        }
        ok2.set(true);
    });
    // The first flush only: one datagram per server, each a single group of 4 items.
    rts[0].poll_once();
    let c = rts[0].endpoint_counters();
    let group = (wire::DGRAM_HDR + wire::REC_HDR + 4 * (wire::ITEM_HDR + 32)) as u64;
    assert_eq!(c.get("tx_datagrams"), 2);
    assert_eq!(
        c.get("tx_bytes"),
        2 * group,
        "one group record per destination"
    );
    step_all(&mut rts, Duration::from_secs(10));
    assert!(ok.get());
    assert_eq!(rts[0].stats().rpcs_completed, 11);
    assert_eq!(rts[1].stats().requests_served, 7);
    assert_eq!(rts[2].stats().requests_served, 4);
}

/// The responses of a group share one message of at most `max_message` bytes: a
/// response that would overflow it is reported too large, the others arrive (in
/// segments, as together they exceed a datagram).
#[test]
fn group_responses_share_the_message_limit() {
    let mut rts = runtimes(ClusterConfig::new(2, 1), RuntimeConfig::default());
    let max = rts[0].max_message();
    let third = max / 3;
    rts[1].register(2, move |_, req, resp| {
        resp.resize(resp.len() + third, req[0])
    });
    let ok = Rc::new(Cell::new(false));
    let ok2 = ok.clone();
    rts[0].spawn(move |ctx| async move {
        let hs: Vec<_> = (0..4u8).map(|i| ctx.queue(1, 2, &[i]).unwrap()).collect();
        ctx.flush().await.unwrap();
        for (i, h) in hs.iter().enumerate() {
            let r = ctx.response(*h, |r| (r.len(), r.iter().all(|&b| b == i as u8)));
            if i < 2 {
                assert_eq!(r, Ok((third, true)), "response {i}");
            } else {
                assert_eq!(r, Err(RpcError::ResponseTooLarge), "response {i}");
            }
        }
        ok2.set(true);
    });
    step_all(&mut rts, Duration::from_secs(10));
    assert!(ok.get());
    assert_eq!(rts[1].stats().requests_served, 4, "every handler ran once");
}

/// The whole batches of several workers' flushes in one step to one endpoint travel as
/// parts of one group (one seq, so one window entry): up to `wire::MAX_PARTS` of them,
/// then another group in the same datagram. Every worker gets its own responses.
#[test]
fn batches_of_one_step_share_a_group() {
    let mut rts = runtimes(ClusterConfig::new(2, 1), RuntimeConfig::default());
    let seqs = Rc::new(RefCell::new(Vec::new()));
    let seqs2 = seqs.clone();
    rts[1].register(3, move |info, req, resp| {
        seqs2.borrow_mut().push((info.seq, req[0]));
        resp.extend_from_slice(req);
        resp.push(0xee);
    });
    let workers = wire::MAX_PARTS + 2;
    let done = Rc::new(Cell::new(0));
    for w in 0..workers as u8 {
        let done = done.clone();
        rts[0].spawn(move |ctx| async move {
            let hs: Vec<_> = (0..2u8)
                .map(|k| ctx.queue(1, 3, &[w, k, 7]).unwrap())
                .collect();
            ctx.flush().await.unwrap();
            for (k, h) in hs.iter().enumerate() {
                ctx.response(*h, |r| assert_eq!(r, [w, k as u8, 7, 0xee]))
                    .unwrap();
            }
            done.set(done.get() + 1);
        });
    }
    rts[0].poll_once();
    // One datagram: a group of MAX_PARTS batches, then one of the other two.
    let item = (wire::ITEM_HDR + 3) as u64;
    let c = rts[0].endpoint_counters();
    assert_eq!(c.get("tx_datagrams"), 1);
    let want = (wire::DGRAM_HDR + 2 * wire::REC_HDR) as u64 + 2 * workers as u64 * item;
    assert_eq!(c.get("tx_bytes"), want, "two group records");
    step_all(&mut rts, Duration::from_secs(10));
    assert_eq!(done.get(), workers);
    let seqs = seqs.borrow();
    assert_eq!(seqs.len(), 2 * workers);
    // Served in order: the first MAX_PARTS workers' requests share seq 1, the rest 2.
    for (i, &(seq, w)) in seqs.iter().enumerate() {
        assert_eq!(w as usize, i / 2);
        let want = if (w as usize) < wire::MAX_PARTS { 1 } else { 2 };
        assert_eq!(seq, want, "request {i}");
    }
    assert_eq!(rts[0].stats().rpcs_completed, 2 * workers as u64);
    assert_eq!(rts[0].stats().flushes_joined, workers as u64 - 2);
}

/// Each part of a group (one worker's batch) has a response budget of its own: large
/// responses to one worker never make another's fail, even though the group's response
/// then exceeds `max_message` (it travels in segments). Within a part the budget is
/// shared, as in a group of one batch.
#[test]
fn parts_of_a_group_have_their_own_response_budget() {
    let mut rts = runtimes(ClusterConfig::new(2, 1), RuntimeConfig::default());
    let max = rts[0].max_message();
    let big = 2 * max / 3;
    let seqs = Rc::new(RefCell::new(Vec::new()));
    let seqs2 = seqs.clone();
    rts[1].register(2, move |info, req, resp| {
        seqs2.borrow_mut().push(info.seq);
        resp.resize(resp.len() + big, req[0])
    });
    let results = Rc::new(RefCell::new(Vec::new()));
    for (w, n) in [(0u8, 1u8), (1, 1), (2, 2)] {
        let results = results.clone();
        rts[0].spawn(move |ctx| async move {
            let hs: Vec<_> = (0..n)
                .map(|k| ctx.queue(1, 2, &[10 * w + k]).unwrap())
                .collect();
            ctx.flush().await.unwrap();
            for (k, h) in hs.iter().enumerate() {
                let want = 10 * w + k as u8;
                let r = ctx.response(*h, |r| (r.len(), r.iter().all(|&b| b == want)));
                results.borrow_mut().push((w, k, r));
            }
        });
    }
    step_all(&mut rts, Duration::from_secs(10));
    let mut r = results.borrow().clone();
    r.sort_by_key(|x| (x.0, x.1));
    assert_eq!(
        r,
        vec![
            (0, 0, Ok((big, true))),
            (1, 0, Ok((big, true))),
            (2, 0, Ok((big, true))),
            (2, 1, Err(RpcError::ResponseTooLarge)),
        ]
    );
    assert_eq!(*seqs.borrow(), [1; 4], "one group");
    assert_eq!(rts[1].stats().requests_served, 4, "every handler ran once");
}

/// A part whose budget the first response used up whole still gets an answer for every
/// request: the later ones as too large, each with its item header past the budget.
#[test]
fn a_spent_budget_still_answers_every_request() {
    let mut rts = runtimes(ClusterConfig::new(2, 1), RuntimeConfig::default());
    let max = rts[0].max_message();
    rts[1].register(2, move |_, req, resp| {
        let n = if req[0] == 0 { max - wire::ITEM_HDR } else { 1 };
        resp.resize(resp.len() + n, 7)
    });
    let ok = Rc::new(Cell::new(false));
    let ok2 = ok.clone();
    rts[0].spawn(move |ctx| async move {
        let hs: Vec<_> = (0..3u8).map(|i| ctx.queue(1, 2, &[i]).unwrap()).collect();
        ctx.flush().await.unwrap();
        let r: Vec<_> = hs.iter().map(|h| ctx.response(*h, |r| r.len())).collect();
        assert_eq!(
            r,
            [
                Ok(max - wire::ITEM_HDR),
                Err(RpcError::ResponseTooLarge),
                Err(RpcError::ResponseTooLarge)
            ]
        );
        ok2.set(true);
    });
    step_all(&mut rts, Duration::from_secs(10));
    assert!(ok.get());
    assert_eq!(rts[0].stats().retransmits, 0);
    assert_eq!(rts[0].stats().rx_bad_segment, 0);
}

/// A group whose items do not match its count, or run past its record, is dropped
/// whole and counted: none of its handlers runs.
#[test]
fn malformed_groups_run_no_handler() {
    let (mut rt, _clock, runs) = echo_server(RuntimeConfig::default());
    let src = EndpointAddr::new(0, 0);
    let item = |tag: u8, p: &[u8]| {
        let mut v = vec![tag];
        v.extend_from_slice(&(p.len() as u32).to_le_bytes());
        v.extend_from_slice(p);
        v
    };
    let datagram = |seq: u64, count: u8, flags: u8, body: &[u8]| {
        let mut d = Vec::new();
        wire::begin(&mut d, wire::KIND_REQUEST, 9, 1);
        d[3] = 1;
        d.extend_from_slice(&seq.to_le_bytes());
        d.extend_from_slice(&[count, flags]);
        d.extend_from_slice(&(body.len() as u16).to_le_bytes());
        d.extend_from_slice(body);
        d
    };
    let two = [item(ECHO, b"ab"), item(ECHO, b"cd")].concat();
    let mut long_item = item(ECHO, b"ab");
    long_item[1] = 200; // runs past the record
    let bad = [
        datagram(1, 3, wire::FLAG_GROUP, &two), // fewer items than counted
        datagram(2, 1, wire::FLAG_GROUP, &two), // trailing bytes
        datagram(3, 0, wire::FLAG_GROUP, &[]),  // empty group
        datagram(4, 1, wire::FLAG_GROUP, &long_item), // item past its record
    ];
    let before = rt.stats().rx_malformed;
    for d in &bad {
        rt.inject(src, d);
    }
    assert_eq!(rt.stats().rx_malformed - before, bad.len() as u64);
    assert_eq!(runs.get(), 0, "a handler of a malformed group ran");
    // The same items, well counted, run both handlers once.
    rt.inject(src, &datagram(5, 2, wire::FLAG_GROUP, &two));
    assert_eq!(runs.get(), 2);
}

/// `respond_first`: a step that serves a request and resumes a worker sends the response
/// with a doorbell of its own before the worker's next request; without it, both leave
/// with one doorbell at the end of the step.
#[test]
fn respond_first_sends_responses_before_resuming() {
    for (first, doorbells) in [(true, 2u64), (false, 1)] {
        let cfg = RuntimeConfig {
            respond_first: first,
            ..Default::default()
        };
        let mut rts = runtimes(ClusterConfig::new(2, 1), cfg);
        let ok = Rc::new(Cell::new(0));
        for rt in rts.iter_mut() {
            let ok = ok.clone();
            rt.spawn(move |ctx| async move {
                let other = 1 - ctx.addr().node;
                for i in 0..2u8 {
                    let h = ctx.queue(other, ECHO, &[i; 16]).unwrap();
                    ctx.flush().await.unwrap();
                    ctx.response(h, |r| assert_eq!(r, &[i; 16])).unwrap();
                }
                ok.set(ok.get() + 1);
            });
        }
        // Step 1 of each: both send their first request.
        rts[0].poll_once();
        rts[1].poll_once();
        // Node 1 serves node 0's request and gets nothing back yet; node 0 then serves
        // node 1's request and gets its response in the same poll, resuming its worker.
        rts[1].poll_once();
        let before = rts[0].endpoint_counters().get("tx_doorbells");
        rts[0].poll_once();
        let c0 = rts[0].endpoint_counters();
        assert_eq!(
            c0.get("tx_doorbells") - before,
            doorbells,
            "respond_first={first}"
        );
        assert_eq!(
            rts[0].stats().resumes,
            2,
            "the worker was resumed in that step"
        );
        step_all(&mut rts, Duration::from_secs(10));
        assert_eq!(ok.get(), 2);
    }
}

/// Many coroutines burst requests at one node that is not polled for a while: credits
/// must hold the burst back so the small receive queue never overflows. The control run
/// with oversized credits shows the test can detect overflow.
#[test]
fn credits_stop_overflow_under_burst() {
    for (credits, expect_overflow) in [(None, false), (Some(64), true)] {
        let mut cc = ClusterConfig::new(2, 1);
        cc.recv_depth = 16;
        let cfg = RuntimeConfig {
            credits,
            coalesce: false,
            ..Default::default()
        };
        let mut rts = runtimes(cc.clone(), cfg);
        if credits.is_none() {
            assert_eq!(rts[0].credits_per_dest(), 4); // min(16 / (2*2), 16 / 2)
        }
        let done = Rc::new(Cell::new(0u32));
        for c in 0..50u32 {
            let done = done.clone();
            rts[0].spawn(move |ctx| async move {
                for k in 0..4u32 {
                    let v = (c * 4 + k).to_le_bytes();
                    let h = ctx.queue(1, ECHO, &v).unwrap();
                    ctx.flush().await.unwrap();
                    ctx.response(h, |r| assert_eq!(r, v)).unwrap();
                }
                done.set(done.get() + 1);
            });
        }
        // Burst: node 0 runs many steps before node 1 polls at all.
        for _ in 0..200 {
            rts[0].poll_once();
        }
        step_all(&mut rts, Duration::from_secs(20));
        assert_eq!(done.get(), 50);
        let drops: u64 = rts
            .iter()
            .map(|r| r.endpoint_counters().get("rx_dropped_queue_full"))
            .sum();
        if expect_overflow {
            assert!(drops > 0, "control run should overflow");
            assert!(rts[0].stats().retransmits > 0);
        } else {
            assert_eq!(drops, 0);
            assert!(
                rts[0].stats().credit_waits > 0,
                "the burst should have waited for credits"
            );
            assert_eq!(rts[0].stats().retransmits, 0);
        }
        assert_eq!(rts[1].stats().requests_served, 200);
    }
}

/// 1% drop, 5% reorder (and 1% duplication): every RPC completes, each handler runs
/// exactly once per RPC, and responses are correct. Includes segmented messages.
#[test]
fn faults_every_rpc_exactly_once() {
    let executed: Rc<RefCell<HashMap<u64, u32>>> = Rc::default();
    let mut rts = faulty_runtimes(ClusterConfig::new(3, 2), 42, 0.01, 0.05, 0.01);
    for rt in rts.iter_mut() {
        let ex = executed.clone();
        rt.register(ECHO, move |_, req, resp| {
            let id = u64::from_le_bytes(req[..8].try_into().unwrap());
            *ex.borrow_mut().entry(id).or_default() += 1;
            resp.extend_from_slice(req);
            resp.reverse();
        });
    }
    let completed = Rc::new(Cell::new(0u64));
    let per_co = 60u64;
    let cos = 6u64;
    for (ri, rt) in rts.iter_mut().enumerate() {
        for c in 0..cos {
            let completed = completed.clone();
            rt.spawn(move |ctx| async move {
                let me = ctx.addr().node;
                let mut buf = Vec::new();
                for k in 0..per_co {
                    let mut hs = Vec::new();
                    for b in 0..3u64 {
                        let id = ((ri as u64 * 8 + c) * per_co + k) * 4 + b;
                        buf.clear();
                        buf.extend_from_slice(&id.to_le_bytes());
                        // Every 16th request is large enough to be segmented.
                        let len = if id.is_multiple_of(16) { 9000 } else { 24 };
                        buf.extend((8..len).map(|x| (x as u64 ^ id) as u8));
                        // Even workers spread a batch over the nodes; odd ones send it
                        // to one node, where batches of one step share a group.
                        let spread = if c % 2 == 0 { b } else { k };
                        let node = ((me as u64 + 1 + spread) % 3) as u16;
                        hs.push((ctx.queue(node, ECHO, &buf).unwrap(), buf.clone()));
                    }
                    ctx.flush().await.unwrap();
                    for (h, mut want) in hs {
                        want.reverse();
                        ctx.response(h, |r| assert!(r == want.as_slice())).unwrap();
                        completed.set(completed.get() + 1);
                    }
                }
            });
        }
    }
    step_all(&mut rts, Duration::from_secs(60));
    let total = 6 * cos * per_co * 3;
    assert_eq!(completed.get(), total);
    let ex = executed.borrow();
    assert_eq!(ex.len() as u64, total);
    assert!(ex.values().all(|&n| n == 1), "some handler ran twice");
    let mut st = RpcStats::default();
    let mut faults = 0;
    for r in &rts {
        st.merge(&r.stats());
        let c = r.endpoint_counters();
        faults += c.get("fault_dropped") + c.get("fault_reordered");
    }
    assert!(
        faults > 0 && st.retransmits > 0,
        "faults must have happened: {st:?}"
    );
    assert_eq!(st.rpcs_failed, 0);
    assert!(st.flushes_joined > 0, "no batches shared a group: {st:?}");
    eprintln!("fault test stats: {st:?}");
}

#[test]
fn malformed_flood_changes_only_counters() {
    let cc = ClusterConfig::new(3, 1);
    let mut eps = endpoints(cc.clone());
    let mut attacker = eps.pop().unwrap();
    let served = Rc::new(Cell::new(0u64));
    let mut rts: Vec<Runtime> = eps
        .into_iter()
        .map(|ep| {
            let mut rt = Runtime::new(ep, RuntimeConfig::default()).unwrap();
            let s = served.clone();
            rt.register(ECHO, move |_, req, resp| {
                s.set(s.get() + 1);
                resp.extend_from_slice(req);
            });
            rt
        })
        .collect();
    let sessions: Vec<u32> = rts.iter().map(|r| r.session()).collect();
    let done = Rc::new(Cell::new(0u64));
    for (i, rt) in rts.iter_mut().enumerate() {
        let done = done.clone();
        rt.spawn(move |ctx| async move {
            for k in 0..200u32 {
                let v = k.to_le_bytes();
                let h = ctx.queue(1 - i as u16, ECHO, &v).unwrap();
                ctx.flush().await.unwrap();
                ctx.response(h, |r| assert_eq!(r, v)).unwrap();
                done.set(done.get() + 1);
            }
        });
    }
    let mut rng = 0x1234_5678_9abc_def0u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut garbage = Vec::new();
    let t0 = Instant::now();
    while rts.iter().any(|r| r.live_tasks() > 0) {
        assert!(t0.elapsed() < Duration::from_secs(20));
        for dst in 0..2u16 {
            let mut batch: Vec<Vec<u8>> = Vec::new();
            for _ in 0..4 {
                garbage.clear();
                match next() % 4 {
                    // Random bytes.
                    0 => garbage.extend((0..next() % 200).map(|_| next() as u8)),
                    // A request datagram cut short: never valid.
                    1 => {
                        let s = wire::begin(&mut garbage, wire::KIND_REQUEST, 9, 0);
                        wire::push_record(&mut garbage, s, 1 + next() % 100, ECHO, None, &[7; 20]);
                        let cut = next() as usize % garbage.len();
                        garbage.truncate(cut);
                    }
                    // A response with the victim's session but an id it never issued.
                    2 => {
                        let s = wire::begin(
                            &mut garbage,
                            wire::KIND_RESPONSE,
                            sessions[dst as usize],
                            0,
                        );
                        wire::push_record(
                            &mut garbage,
                            s,
                            1_000_000 + next() % 1000,
                            0,
                            None,
                            &[1; 4],
                        );
                    }
                    // A response with a foreign session (stale incarnation).
                    _ => {
                        let s = wire::begin(
                            &mut garbage,
                            wire::KIND_RESPONSE,
                            sessions[dst as usize] ^ 1,
                            0,
                        );
                        wire::push_record(&mut garbage, s, 1 + next() % 50, 0, None, &[1; 4]);
                    }
                }
                batch.push(garbage.clone());
            }
            let dgs: Vec<Datagram<'_>> = batch
                .iter()
                .map(|p| Datagram {
                    dst: EndpointAddr::new(dst, 0),
                    payload: p,
                })
                .collect();
            attacker.send(&dgs).unwrap();
        }
        for r in rts.iter_mut() {
            r.poll_once();
        }
    }
    assert_eq!(done.get(), 400);
    assert_eq!(served.get(), 400, "a malformed datagram ran a handler");
    let mut st = RpcStats::default();
    for r in &rts {
        st.merge(&r.stats());
    }
    assert!(st.rx_malformed > 0 && st.rx_unknown_response > 0, "{st:?}");
    assert_eq!(st.rpcs_failed, 0);
    assert_eq!(st.retransmits, 0);
}

#[test]
fn segmentation_and_size_limit() {
    let mut rts = runtimes(ClusterConfig::new(2, 1), RuntimeConfig::default());
    let max = rts[0].max_message();
    assert_eq!(max, DEFAULT_MAX_MESSAGE);
    rts[1].register(2, |_, req, resp| {
        // Response 3x the request: segmented too.
        for _ in 0..3 {
            resp.extend_from_slice(req);
        }
    });
    let ok = Rc::new(Cell::new(false));
    let ok2 = ok.clone();
    rts[0].spawn(move |ctx| async move {
        let big: Vec<u8> = (0..20_000u32).map(|i| (i * 7) as u8).collect();
        let h = ctx.queue(1, 2, &big).unwrap();
        let small = ctx.queue(1, ECHO, b"abc").unwrap();
        ctx.flush().await.unwrap();
        ctx.response(h, |r| {
            assert_eq!(r.len(), 60_000);
            assert!(r.chunks(20_000).all(|c| c == big.as_slice()));
        })
        .unwrap();
        ctx.response(small, |r| assert_eq!(r, b"abc")).unwrap();
        // Over the limit: a clear error, nothing sent.
        let e = ctx.queue(1, ECHO, &vec![0; max + 1]).unwrap_err();
        assert_eq!(e, RpcError::TooLarge { len: max + 1, max });
        // A response over the limit is reported as such.
        let h = ctx.queue(1, 2, &vec![1; 30_000]).unwrap();
        ctx.flush().await.unwrap();
        assert_eq!(ctx.response(h, |_| ()), Err(RpcError::ResponseTooLarge));
        // Unknown request type.
        let h = ctx.queue(1, 99, b"x").unwrap();
        ctx.flush().await.unwrap();
        assert_eq!(
            ctx.response(h, |_| ()),
            Err(RpcError::NoHandler { rtype: 99 })
        );
        ok2.set(true);
    });
    step_all(&mut rts, Duration::from_secs(10));
    assert!(ok.get());
}

/// Node 0's runtime with FaSST's setting (no retransmission, the first timeout suspects)
/// on a simulated clock, and node 1's endpoint, which nobody polls (keep it alive).
fn fasst_runtime_beside_a_silent_node() -> (Runtime, Arc<ManualClock>, Box<dyn Endpoint>) {
    let clock = Arc::new(ManualClock::new(1_000));
    let mut eps = endpoints(ClusterConfig::new(2, 1));
    let silent = eps.pop().unwrap();
    let rt =
        Runtime::with_clock(eps.pop().unwrap(), RuntimeConfig::fasst(), clock.clone()).unwrap();
    (rt, clock, silent)
}

/// FaSST setting: no retransmission, the first timeout suspects the destination. The
/// clock is simulated, so this is deterministic.
#[test]
fn silent_destination_is_suspected() {
    let (mut rt, clock, _silent) = fasst_runtime_beside_a_silent_node();
    let seen = Rc::new(Cell::new(0));
    let s2 = seen.clone();
    rt.on_suspect(move |n| {
        assert_eq!(n, 1);
        s2.set(s2.get() + 1)
    });
    let result = Rc::new(RefCell::new(None));
    let r2 = result.clone();
    rt.spawn(move |ctx| async move {
        let h = ctx.queue(1, ECHO, b"hi").unwrap();
        *r2.borrow_mut() = Some((ctx.flush().await, ctx.response(h, |_| ())));
    });
    for _ in 0..100 {
        rt.poll_once();
    }
    assert!(result.borrow().is_none(), "no failure before the timeout");
    clock.advance(999_000_000);
    for _ in 0..40 {
        rt.poll_once();
    }
    assert!(result.borrow().is_none(), "still within 1 s");
    // Timeouts are scanned every timeout/4, so failure is declared within 1.25 s.
    clock.advance(2_000_000);
    for _ in 0..40 {
        rt.poll_once();
    }
    clock.advance(250_000_000);
    // Idle steps read the clock only every few polls.
    for _ in 0..40 {
        rt.poll_once();
    }
    let dest = EndpointAddr::new(1, 0);
    let r = result.borrow().clone().expect("failed after the timeout");
    assert_eq!(r.0, Err(RpcError::Timeout { dest }));
    assert_eq!(r.1, Err(RpcError::Timeout { dest }));
    assert_eq!(rt.stats().suspected, 1);
    assert_eq!(rt.stats().retransmits, 0);
    assert_eq!(rt.take_suspects(), vec![1]);
    assert_eq!(seen.get(), 1);
}

/// Every part of a group to a silent destination fails, each worker with its own
/// error, once the retries are used up.
#[test]
fn silent_destination_fails_every_part() {
    let (mut rt, clock, _silent) = fasst_runtime_beside_a_silent_node();
    let results = Rc::new(RefCell::new(Vec::new()));
    for _ in 0..3 {
        let r2 = results.clone();
        rt.spawn(move |ctx| async move {
            let hs = [
                ctx.queue(1, ECHO, b"a").unwrap(),
                ctx.queue(1, ECHO, b"b").unwrap(),
            ];
            let f = ctx.flush().await;
            let rs: Vec<_> = hs.iter().map(|h| ctx.response(*h, |_| ())).collect();
            r2.borrow_mut().push((f, rs));
        });
    }
    rt.poll_once();
    assert_eq!(rt.endpoint_counters().get("tx_datagrams"), 1);
    for _ in 0..4 {
        clock.advance(600_000_000);
        for _ in 0..40 {
            rt.poll_once();
        }
    }
    let dest = EndpointAddr::new(1, 0);
    let err = Err(RpcError::Timeout { dest });
    let results = results.borrow();
    assert_eq!(results.len(), 3);
    for (f, rs) in results.iter() {
        assert_eq!(f, &err);
        assert_eq!(rs, &vec![err.clone(), err.clone()]);
    }
    assert_eq!(rt.stats().rpcs_failed, 6);
    assert_eq!(rt.live_tasks(), 0);
}

/// Real threads: one runtime per thread, parked when idle.
#[test]
fn threaded_nodes_run() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let fabric = LocalFabric::new(ClusterConfig::new(2, 2)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for n in 0..2 {
        let c = count.clone();
        handles.extend(spawn_node_threads(
            fabric.node(n),
            RuntimeConfig::default(),
            move |rt| {
                rt.register(ECHO, |_, req, resp| resp.extend_from_slice(req));
                let c = c.clone();
                rt.spawn(move |ctx| async move {
                    let other = 1 - ctx.addr().node;
                    for _ in 0..500 {
                        let h = ctx.queue(other, ECHO, b"0123456789").unwrap();
                        ctx.flush().await.unwrap();
                        ctx.response(h, |r| assert_eq!(r, b"0123456789")).unwrap();
                        c.fetch_add(1, Ordering::Relaxed);
                    }
                });
            },
            stop.clone(),
        ));
    }
    let t0 = Instant::now();
    while count.load(Ordering::Relaxed) < 2000 {
        assert!(t0.elapsed() < Duration::from_secs(20));
        std::thread::sleep(Duration::from_millis(1));
    }
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        let st = h.join().unwrap().unwrap();
        assert_eq!(st.rpcs_completed, 500);
    }
}

use std::sync::Arc;

#[test]
fn bench_runs_both_phases() {
    let cfg = bench::RpcBenchConfig {
        duration_s: 0.2,
        ..Default::default()
    };
    let fabric = LocalFabric::new(ClusterConfig::new(2, 1)).unwrap();
    let rep = bench::run_bench(&cfg, fabric.nodes()).unwrap();
    assert!(rep.rpcs > 0 && rep.raw_datagrams > 0, "{rep:?}");
    assert!(rep.rpc_to_raw_ratio > 0.0 && rep.latency_us.p50 > 0.0);
    assert_eq!(
        rep.rpc_stats.rx_malformed, 0,
        "raw-phase datagrams leaked into the RPC phase"
    );
    assert_eq!(rep.rpc_stats.rpcs_failed, 0);
}

/// A server runtime on node 1 of a 2-node cluster with a manual clock, serving ECHO
/// and counting handler runs; datagrams are injected as if from node 0.
fn echo_server(cfg: RuntimeConfig) -> (Runtime, Arc<ManualClock>, Rc<Cell<u32>>) {
    let fabric = LocalFabric::new(ClusterConfig::new(2, 1)).unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let mut rt =
        Runtime::with_clock(fabric.node(1).endpoint(0).unwrap(), cfg, clock.clone()).unwrap();
    let runs = Rc::new(Cell::new(0));
    let runs2 = runs.clone();
    rt.register(ECHO, move |_, req, resp| {
        runs2.set(runs2.get() + 1);
        resp.extend_from_slice(req);
    });
    (rt, clock, runs)
}

/// The request datagrams of one message of `len` bytes (seq 1, `session`), in segments.
fn segmented_request(session: u32, len: usize) -> Vec<Vec<u8>> {
    let mtu = ClusterConfig::new(2, 1).mtu;
    let sp = mtu - wire::DGRAM_HDR - wire::REC_HDR - wire::SEG_EXT;
    let msg: Vec<u8> = (0..len as u32).map(|i| i as u8).collect();
    msg.chunks(sp)
        .enumerate()
        .map(|(k, chunk)| {
            let mut d = Vec::new();
            let s = wire::begin(&mut d, wire::KIND_REQUEST, session, 1);
            let seg = wire::Seg {
                total: len as u32,
                offset: (k * sp) as u32,
            };
            wire::push_record(&mut d, s, 1, ECHO, Some(seg), chunk);
            d
        })
        .collect()
}

fn tx_datagrams(rt: &Runtime) -> u64 {
    rt.endpoint_counters().get("tx_datagrams")
}

/// A segmented request sent twice (its client retransmitted every segment after its
/// timeout) runs its handler once, and the duplicate gets the cached response once, not
/// once per segment.
#[test]
fn retransmitted_segmented_request_is_answered_once() {
    let (mut rt, clock, runs) = echo_server(RuntimeConfig::default());
    let sp = ClusterConfig::new(2, 1).mtu - wire::DGRAM_HDR - wire::REC_HDR - wire::SEG_EXT;
    let segments = segmented_request(77, 3 * sp - 100);
    assert_eq!(segments.len(), 3);
    let client = EndpointAddr::new(0, 0);
    for round in 0..2 {
        let before = tx_datagrams(&rt);
        for d in &segments {
            rt.inject(client, d);
        }
        rt.poll_once();
        // The response is as long as the request: three segments, each its own datagram.
        assert_eq!(tx_datagrams(&rt) - before, 3, "round {round}");
        clock.advance(RuntimeConfig::default().rto_min.as_nanos() as u64);
    }
    assert_eq!(runs.get(), 1);
    let st = rt.stats();
    assert_eq!(st.requests_served, 1);
    assert_eq!(st.duplicate_requests, 3);
}

/// Duplicates cannot make a server repeat itself faster than it would answer new
/// requests: a datagram repeating one seq 255 times, a small record claiming the seq of
/// a large (segmented) request, and duplicates sooner than a retransmission timeout all
/// get nothing (found by fuzzing: one 3 KB datagram made 4,335 datagrams, 17 MiB).
#[test]
fn duplicate_requests_do_not_amplify() {
    let (mut rt, clock, runs) = echo_server(RuntimeConfig::default());
    let client = EndpointAddr::new(0, 0);
    let max = rt.max_message();
    let session = 0xa77a_c4e5;
    // A large request, served once: its 64 KiB response is cached.
    for d in segmented_request(session, max) {
        rt.inject(client, &d);
    }
    rt.poll_once();
    assert_eq!(runs.get(), 1);
    // One datagram: 255 empty records, all seq 1 (the large request's).
    let mut d = Vec::new();
    let s = wire::begin(&mut d, wire::KIND_REQUEST, session, 0);
    for _ in 0..wire::MAX_RECORDS {
        wire::push_record(&mut d, s, 1, ECHO, None, &[]);
    }
    let before = tx_datagrams(&rt);
    for _ in 0..4 {
        rt.inject(client, &d);
        rt.poll_once();
        clock.advance(1_000_000_000);
    }
    assert_eq!(tx_datagrams(&rt), before, "answered a bogus duplicate");
    // A small request and its duplicates: one resend per timeout, no more.
    let small = |seq: u64| {
        let mut d = Vec::new();
        let s = wire::begin(&mut d, wire::KIND_REQUEST, session, 0);
        wire::push_record(&mut d, s, seq, ECHO, None, b"abc");
        d
    };
    rt.inject(client, &small(2));
    rt.poll_once();
    assert_eq!(runs.get(), 2);
    let before = tx_datagrams(&rt);
    for _ in 0..10 {
        rt.inject(client, &small(2));
        rt.poll_once();
    }
    assert_eq!(tx_datagrams(&rt), before, "resent sooner than a timeout");
    clock.advance(RuntimeConfig::default().rto_min.as_nanos() as u64);
    rt.inject(client, &small(2));
    rt.poll_once();
    assert_eq!(
        tx_datagrams(&rt),
        before + 1,
        "a real retransmission is answered"
    );
    assert_eq!(runs.get(), 2);
    assert!(rt.stats().rx_malformed >= 4 * (wire::MAX_RECORDS as u64 - 1));
}

/// A flood of first segments from one source cannot evict another source's message
/// from the reassembly pool: the source holding the most slots loses one.
#[test]
fn reassembly_flood_does_not_starve_other_sources() {
    let cc = ClusterConfig::new(2, 1);
    let fabric = LocalFabric::new(cc.clone()).unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let cfg = RuntimeConfig {
        give_up: Duration::from_millis(120),
        ..Default::default()
    };
    let mut client = Runtime::with_clock(
        fabric.node(0).endpoint(0).unwrap(),
        cfg.clone(),
        clock.clone(),
    )
    .unwrap();
    let mut server = Runtime::with_clock(
        fabric.node(1).endpoint(0).unwrap(),
        RuntimeConfig {
            poll_batch: 1,
            ..cfg.clone()
        },
        clock.clone(),
    )
    .unwrap();
    server.register(ECHO, |_, req, resp| resp.extend_from_slice(req));
    let sp = cc.mtu - wire::DGRAM_HDR - wire::REC_HDR - wire::SEG_EXT;
    let result = Rc::new(RefCell::new(None));
    let r2 = result.clone();
    client.spawn(move |ctx| async move {
        let h = ctx.queue(1, ECHO, &vec![7u8; 2 * sp + 10]).unwrap();
        let f = ctx.flush().await;
        *r2.borrow_mut() = Some((f, ctx.response(h, |r| r.len())));
    });
    let mut flood_seq = 1u64;
    let mut rounds = 0;
    while result.borrow().is_none() {
        client.poll_once();
        for _ in 0..cfg.reassembly_slots {
            let mut d = Vec::new();
            let s = wire::begin(&mut d, wire::KIND_REQUEST, 0xbad, 0);
            let seg = wire::Seg {
                total: 2 * sp as u32,
                offset: 0,
            };
            wire::push_record(&mut d, s, flood_seq % 200 + 1, 0, Some(seg), &vec![0; sp]);
            flood_seq += 1;
            // From another cluster address than the honest client's.
            server.inject(EndpointAddr::new(1, 0), &d);
        }
        server.poll_once();
        clock.advance(1_000_000);
        rounds += 1;
        assert!(rounds < 100_000);
    }
    let r = result.borrow().clone().unwrap();
    assert_eq!(r.1, Ok(2 * sp + 10), "{r:?}, {:?}", server.stats());
    assert!(
        server.stats().reassembly_evicted > 0,
        "the flood filled the pool"
    );
}

/// Random batches (mixed destinations, sizes from empty to segmented, some to this
/// node itself) over a lossy, reordering network: every response lands at its own
/// request.
#[test]
fn random_batches_get_their_own_responses() {
    let mut rts = faulty_runtimes(ClusterConfig::new(3, 1), 7, 0.02, 0.05, 0.02);
    for rt in rts.iter_mut() {
        // The response is the request reversed, plus its length: a mix-up shows.
        rt.register(ECHO, |_, req, resp| {
            resp.extend(req.iter().rev());
            resp.extend_from_slice(&(req.len() as u32).to_le_bytes());
        });
    }
    let expect = |p: &[u8]| {
        let mut v: Vec<u8> = p.iter().rev().copied().collect();
        v.extend_from_slice(&(p.len() as u32).to_le_bytes());
        v
    };
    let done = Rc::new(Cell::new(0));
    for w in 0..4u64 {
        let done = done.clone();
        rts[w as usize % 3].spawn(move |ctx| async move {
            let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ w;
            let mut next = move || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            for round in 0..60 {
                let n = 1 + next() % 12;
                let mut hs = Vec::new();
                for k in 0..n {
                    let node = (next() % 3) as u16;
                    let len = match next() % 10 {
                        0 => 0,
                        1 => 3000 + (next() % 5000) as usize,
                        _ => (next() % 200) as usize,
                    };
                    let p: Vec<u8> = (0..len).map(|i| (i as u64 ^ k ^ round) as u8).collect();
                    hs.push((ctx.queue(node, ECHO, &p).unwrap(), expect(&p)));
                }
                ctx.flush().await.unwrap();
                for (h, want) in &hs {
                    ctx.response(*h, |r| assert_eq!(r, &want[..], "round {round}"))
                        .unwrap();
                }
            }
            done.set(done.get() + 1);
        });
    }
    step_all(&mut rts, Duration::from_secs(60));
    assert_eq!(done.get(), 4);
}

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

/// An endpoint that loses the datagrams it is told to (a shared switch), for losses at
/// exact moments.
struct Lossy {
    inner: Box<dyn Endpoint>,
    /// Datagrams still to drop.
    drop_next: Arc<AtomicU32>,
}

impl Endpoint for Lossy {
    fn addr(&self) -> EndpointAddr {
        self.inner.addr()
    }
    fn config(&self) -> &ClusterConfig {
        self.inner.config()
    }
    fn send(&mut self, batch: &[Datagram<'_>]) -> Result<(), ambidex_transport::TransportError> {
        let mut keep = Vec::new();
        for d in batch {
            let drop = self.drop_next.load(Relaxed);
            if drop > 0 {
                self.drop_next.store(drop - 1, Relaxed);
            } else {
                keep.push(*d);
            }
        }
        self.inner.send(&keep)
    }
    fn poll_recv(&mut self, max: usize, sink: &mut dyn FnMut(EndpointAddr, &[u8])) -> usize {
        self.inner.poll_recv(max, sink)
    }
    fn post(
        &mut self,
        ops: &[ambidex_transport::OneSidedOp<'_>],
    ) -> Result<(), ambidex_transport::TransportError> {
        self.inner.post(ops)
    }
    fn poll_cq(&mut self, max: usize, out: &mut Vec<ambidex_transport::Completion>) -> usize {
        self.inner.poll_cq(max, out)
    }
    fn outstanding(&self) -> usize {
        self.inner.outstanding()
    }
    fn wait(&mut self, timeout: Duration) {
        self.inner.wait(timeout)
    }
    fn set_epoch(&mut self, epoch: u32) {
        self.inner.set_epoch(epoch)
    }
    fn counters(&self) -> ambidex_transport::CounterSnapshot {
        self.inner.counters()
    }
}

const US: u64 = 1_000;
/// Simulated time per step of the pair below: the round trip is one step.
const STEP: u64 = 10 * US;

/// A client (node 0, its datagrams lost on command) and an ECHO server (node 1) on one
/// manual clock; one client worker sends `n` requests one after another, each flush's
/// simulated duration pushed to the returned log.
struct Pair {
    client: Runtime,
    server: Runtime,
    clock: Arc<ManualClock>,
    drop_next: Arc<AtomicU32>,
    /// Requests the worker may still start.
    go: Rc<Cell<u32>>,
    /// (start, end) in clock ns of each finished request.
    done: Rc<RefCell<Vec<(u64, u64)>>>,
}

impl Pair {
    fn new(cfg: RuntimeConfig) -> Pair {
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let mut eps = endpoints(ClusterConfig::new(2, 1));
        let drop_next = Arc::new(AtomicU32::new(0));
        let server_ep = eps.pop().unwrap();
        let lossy = Lossy {
            inner: eps.pop().unwrap(),
            drop_next: drop_next.clone(),
        };
        let mut client = Runtime::with_clock(Box::new(lossy), cfg.clone(), clock.clone()).unwrap();
        let mut server = Runtime::with_clock(server_ep, cfg, clock.clone()).unwrap();
        server.register(ECHO, |_, req, resp| resp.extend_from_slice(req));
        let (go, done) = (Rc::new(Cell::new(0u32)), Rc::new(RefCell::new(Vec::new())));
        let (g, d, c) = (go.clone(), done.clone(), clock.clone());
        client.spawn(move |ctx| async move {
            loop {
                while g.get() == 0 {
                    ctx.yield_now().await;
                }
                g.set(g.get() - 1);
                let t0 = c.now_ns();
                let h = ctx.queue(1, ECHO, b"ping").unwrap();
                ctx.flush().await.unwrap();
                ctx.response(h, |r| assert_eq!(r, b"ping")).unwrap();
                d.borrow_mut().push((t0, c.now_ns()));
            }
        });
        Pair {
            client,
            server,
            clock,
            drop_next,
            go,
            done,
        }
    }

    /// Steps both runtimes (the server only if `serve`) and then the clock, `n` times.
    fn steps(&mut self, n: u32, serve: bool) {
        for _ in 0..n {
            self.client.poll_once();
            if serve {
                self.server.poll_once();
            }
            self.clock.advance(STEP);
        }
    }

    /// Runs `n` requests one after another, each answered within a step.
    fn warm_up(&mut self, n: u32) {
        self.go.set(n);
        let want = self.done.borrow().len() + n as usize;
        for _ in 0..10 * n + 1000 {
            if self.done.borrow().len() == want {
                return;
            }
            self.steps(1, true);
        }
        panic!("warm-up did not finish");
    }

    fn rtt(&self) -> RttEstimator {
        self.client.rtt_to(EndpointAddr::new(1, 0)).unwrap()
    }
}

fn fast_rto() -> RuntimeConfig {
    RuntimeConfig {
        rto_min: Duration::from_micros(300),
        ..Default::default()
    }
}

/// A lost request costs about one retransmission timeout, which follows the measured
/// round trip (here below `rto_min`, so the floor), not a fixed 20 ms.
#[test]
fn a_lost_request_is_recovered_after_about_one_rto() {
    let mut p = Pair::new(fast_rto());
    p.warm_up(50);
    let srtt = p.rtt().srtt().unwrap();
    assert!(
        srtt <= 2 * STEP,
        "the estimate follows the {STEP} ns round trip: {srtt}"
    );
    let rto = p.rtt().rto();
    assert_eq!(rto, 300 * US, "the floor");
    assert_eq!(p.client.stats().retransmits, 0);
    p.drop_next.store(1, Relaxed);
    p.warm_up(1);
    let (t0, t1) = *p.done.borrow().last().unwrap();
    let took = t1 - t0;
    // The deadline, then at most a quarter timeout until the scan sees it, then the
    // round trip of the retransmission.
    assert!(took >= rto, "recovered before the timeout: {took} ns");
    assert!(
        took <= rto + rto / 4 + 3 * STEP,
        "recovered after {took} ns, timeout {rto} ns"
    );
    assert_eq!(p.client.stats().retransmits, 1);
}

/// Every expiry doubles the destination's timeout (a silent destination is probed ever
/// less often), and the next request answered at its first transmission resets it.
#[test]
fn retransmissions_back_off_until_a_fresh_sample() {
    let mut p = Pair::new(fast_rto());
    p.warm_up(20);
    let rto = p.rtt().rto();
    p.go.set(1);
    // The server stays silent: note when each retransmission goes out.
    let mut at = Vec::new();
    let t0 = p.clock.now_ns();
    let mut seen = p.client.stats().retransmits;
    while at.len() < 4 {
        p.steps(1, false);
        let r = p.client.stats().retransmits;
        if r > seen {
            at.push(p.clock.now_ns() - t0);
            seen = r;
        }
        assert!(p.clock.now_ns() - t0 < 100 * rto, "{at:?}");
    }
    let gaps: Vec<u64> = at.windows(2).map(|w| w[1] - w[0]).collect();
    for (k, g) in gaps.iter().enumerate() {
        // Timeout 2^(k+1) * rto, seen within a quarter of it (plus a step).
        let want = rto << (k + 1);
        assert!(
            *g >= want && *g <= want + want / 4 + STEP,
            "gap {k}: {g} ns, want {want} ns ({at:?})"
        );
    }
    assert_eq!(p.rtt().backoffs(), 4);
    // The server answers: the retransmitted request gives no sample, so the backoff
    // stays; a request answered at once ends it.
    p.steps(3, true);
    assert_eq!(p.rtt().backoffs(), 4, "a retransmitted request was sampled");
    p.warm_up(1);
    assert_eq!((p.rtt().backoffs(), p.rtt().rto()), (0, rto));
}

/// Karn's rule: a request answered only after its retransmission says nothing about the
/// round trip (its response may answer either copy), so a slow answer from a
/// descheduled peer does not inflate the estimate.
#[test]
fn retransmitted_requests_give_no_sample() {
    let mut p = Pair::new(fast_rto());
    p.warm_up(50);
    let before = p.rtt().srtt().unwrap();
    p.go.set(1);
    // 3 ms of silence, then the answer (to the original and its retransmissions).
    p.steps(300, false);
    assert!(p.client.stats().retransmits >= 2);
    p.steps(3, true);
    assert_eq!(p.done.borrow().len(), 51);
    assert_eq!(p.rtt().srtt(), Some(before), "{:?}", p.rtt());
}

/// The give-up time runs from a request's first transmission, whatever the
/// retransmissions: a silent destination is suspected after `give_up`, not before.
#[test]
fn a_silent_destination_is_suspected_after_the_give_up_time() {
    let give_up = Duration::from_millis(50);
    let mut p = Pair::new(RuntimeConfig {
        give_up,
        ..fast_rto()
    });
    p.warm_up(5);
    let failed = Rc::new(RefCell::new(None));
    let f2 = failed.clone();
    let c = p.clock.clone();
    p.client.spawn(move |ctx| async move {
        let t0 = c.now_ns();
        ctx.queue(1, ECHO, b"x").unwrap();
        let r = ctx.flush().await;
        *f2.borrow_mut() = Some((r, c.now_ns() - t0));
    });
    let g = give_up.as_nanos() as u64;
    p.steps((g / STEP) as u32 - 2, false);
    assert!(failed.borrow().is_none(), "failed before the give-up time");
    assert!(p.client.stats().retransmits > 3, "retransmitted meanwhile");
    assert!(p.client.take_suspects().is_empty());
    // Scans come every quarter of the shortest timeout in use (at most the initial one).
    let late = RuntimeConfig::default().rto_initial.as_nanos() as u64 / 4 + 3 * STEP;
    p.steps((late / STEP) as u32 + 2, false);
    let (r, took) = failed
        .borrow()
        .clone()
        .expect("failed after the give-up time");
    let dest = EndpointAddr::new(1, 0);
    assert_eq!(r, Err(RpcError::Timeout { dest }));
    assert!(took >= g && took <= g + late, "failed after {took} ns");
    assert_eq!(p.client.take_suspects(), vec![1]);
    assert_eq!(p.client.stats().suspected, 1);
}

/// Requests sent a little apart and lost together expire at different scans, but are
/// one loss: the timeout doubles once per timeout period, not once per expiry (which
/// would reach `rto_max` after one burst).
#[test]
fn one_burst_of_losses_doubles_the_timeout_once() {
    let mut p = Pair::new(fast_rto());
    p.warm_up(20);
    let rto = p.rtt().rto();
    // Three requests, 100 us apart, to a server that stays silent.
    for _ in 0..3 {
        p.client.spawn(|ctx| async move {
            ctx.queue(1, ECHO, b"x").unwrap();
            let _ = ctx.flush().await;
        });
        p.steps((100 * US / STEP) as u32, false);
    }
    // By 650 us after the first was sent, all three have expired (at 300, 400 and 500
    // us) and were retransmitted at the scans (every 150 us once doubled), all within
    // the doubled period of the first expiry.
    p.steps(((650 * US - 300 * US) / STEP) as u32, false);
    assert_eq!(p.client.stats().retransmits, 3);
    assert_eq!(p.rtt().backoffs(), 1, "{:?}", p.rtt());
    assert_eq!(p.rtt().rto(), 2 * rto);
}

/// A coroutine in `Ctx::idle` lets its thread park for the whole `max_wait` (here 30 s,
/// so only the doorbell can resume it in time), and a ring of the runtime's waker from
/// another thread ends the park; the resumption is not counted as received work.
#[test]
fn idle_coroutine_resumed_by_doorbell() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let cfg = RuntimeConfig {
        max_wait: Duration::from_secs(30),
        ..Default::default()
    };
    let mut rt = runtimes(ClusterConfig::new(1, 1), cfg).pop().unwrap();
    let flag = Arc::new(AtomicBool::new(false));
    let f = flag.clone();
    let wakes = Rc::new(Cell::new(0));
    let w = wakes.clone();
    rt.spawn(move |ctx| async move {
        while !f.load(Ordering::SeqCst) {
            w.set(w.get() + 1);
            ctx.idle().await;
        }
    });
    let waker = rt.waker().expect("local endpoints have a doorbell");
    let ringer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        flag.store(true, Ordering::SeqCst);
        waker.wake();
    });
    let t0 = Instant::now();
    rt.run();
    ringer.join().unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t0.elapsed()
    );
    assert_eq!(rt.stats().rx_datagrams, 0);
    // Resumed at clock-reading steps while spinning, then parked for good until the ring.
    assert!(wakes.get() < 1000, "resumed {} times", wakes.get());
}
