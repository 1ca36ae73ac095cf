//! Fuzzing of everything that touches received bytes: the wire decoder alone and the
//! runtime's whole receive path. Random bytes and mutated valid datagrams must never
//! panic; they may only move counters (and, when a mutation happens to yield a valid
//! request, run a handler).

use ambidex_rpc::wire::{self, Seg};
use ambidex_rpc::{Runtime, RuntimeConfig};
use ambidex_transport::local::LocalFabric;
use ambidex_transport::{ClusterConfig, EndpointAddr};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

#[path = "common/mutation.rs"]
mod mutation;
use mutation::{mutate, mutation, Mutation};

#[derive(Debug, Clone)]
struct Rec {
    seq: u64,
    tag: u8,
    seg: Option<(u32, u32)>,
    payload: Vec<u8>,
}

fn rec() -> impl Strategy<Value = Rec> {
    (
        1u64..40,
        0u8..4,
        prop::option::of((0u32..20_000, 0u32..20_000)),
        prop::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(|(seq, tag, seg, payload)| Rec {
            seq,
            tag,
            seg,
            payload,
        })
}

fn valid_datagram() -> impl Strategy<Value = Vec<u8>> {
    (
        1u8..3,
        any::<u32>(),
        0u64..40,
        prop::collection::vec(rec(), 1..6),
    )
        .prop_map(|(kind, session, ack, recs)| {
            let mut b = Vec::new();
            let s = wire::begin(&mut b, kind, session, ack);
            for r in recs {
                // A segment carries at least one byte.
                let seg = r.seg.filter(|_| !r.payload.is_empty()).map(|(t, o)| Seg {
                    total: t.max(o + r.payload.len() as u32),
                    offset: o,
                });
                wire::push_record(&mut b, s, r.seq, r.tag, seg, &r.payload);
            }
            b
        })
}

fn check_decode(b: &[u8]) {
    if let Ok((h, recs)) = wire::decode(b) {
        let mut n = 0;
        for r in recs {
            n += 1;
            if let Some(s) = r.seg {
                assert!(s.offset as u64 + r.payload.len() as u64 <= s.total as u64);
            }
        }
        assert_eq!(n, h.count as usize);
    }
}

/// Group bodies: items (tag, payload) encoded as `tag:u8 len:u32 payload`.
fn group_body(items: &[(u8, Vec<u8>)]) -> Vec<u8> {
    let mut b = Vec::new();
    for (tag, p) in items {
        b.push(*tag);
        b.extend_from_slice(&(p.len() as u32).to_le_bytes());
        b.extend_from_slice(p);
    }
    b
}

/// If `group_items` accepts a body, its (unchecked) iterator yields exactly `count`
/// items that tile the body, each with a tag `tag_ok` accepts.
fn check_group(b: &[u8], count: usize) {
    let tag_ok = |t: u8| t < 200;
    let Some(items) = wire::group_items(b, count, tag_ok) else {
        return;
    };
    let mut at = 0;
    let mut n = 0;
    for (tag, payload) in items {
        assert!(tag_ok(tag));
        assert_eq!(b[at], tag);
        let len = u32::from_le_bytes(b[at + 1..at + 5].try_into().unwrap()) as usize;
        assert_eq!(payload, &b[at + wire::ITEM_HDR..at + wire::ITEM_HDR + len]);
        at += wire::ITEM_HDR + len;
        n += 1;
    }
    assert_eq!((n, at), (count, b.len()));
}

/// If `request_items` accepts a body, its iterator yields exactly `count` items that
/// tile the body (lengths without the part flag), in at most `MAX_PARTS` parts, and
/// `starts_part` reports each item's flag.
fn check_request_group(b: &[u8], count: usize) {
    let Some(mut items) = wire::request_items(b, count, wire::MAX_PARTS) else {
        return;
    };
    let (mut at, mut n, mut parts) = (0, 0, 1);
    while items.len_left() > 0 {
        let part = items.starts_part();
        let (tag, payload) = items.next().unwrap();
        let raw = u32::from_le_bytes(b[at + 1..at + 5].try_into().unwrap());
        assert_eq!(part, raw & wire::ITEM_PART != 0);
        parts += (n > 0 && part) as usize;
        let len = (raw & !wire::ITEM_PART) as usize;
        assert_eq!(b[at], tag);
        assert_eq!(payload, &b[at + wire::ITEM_HDR..at + wire::ITEM_HDR + len]);
        at += wire::ITEM_HDR + len;
        n += 1;
    }
    assert!(items.next().is_none());
    assert_eq!((n, at), (count, b.len()));
    assert!(parts <= wire::MAX_PARTS);
}

/// Runs `check` on a valid body `b` of `n` items, on it mutated by `ms` (with `n` and
/// with `count` items), and on `random` bytes of `count` items.
fn check_variants(
    b: &[u8],
    n: usize,
    ms: &[Mutation],
    random: &[u8],
    count: usize,
    check: fn(&[u8], usize),
) {
    check(b, n);
    let mut m = b.to_vec();
    mutate(&mut m, ms);
    check(&m, n);
    check(&m, count);
    check(random, count);
}

proptest! {
    #![proptest_config(Config { cases: 2000, ..Config::default() })]

    #[test]
    fn request_items_valid_flagged_mutated_and_random(
        items in prop::collection::vec((any::<u8>(), prop::collection::vec(any::<u8>(), 0..20), any::<bool>()), 1..14),
        ms in prop::collection::vec(mutation(), 0..4),
        random in prop::collection::vec(any::<u8>(), 0..120),
        count in 0usize..16,
    ) {
        let mut b = group_body(&items.iter().map(|(t, p, _)| (*t, p.clone())).collect::<Vec<_>>());
        // Flag the chosen items as part starts.
        let mut at = 0;
        for (_, p, part) in &items {
            if *part {
                b[at + 4] |= 0x80;
            }
            at += wire::ITEM_HDR + p.len();
        }
        let parts = 1 + items.iter().skip(1).filter(|x| x.2).count();
        prop_assert_eq!(wire::request_items(&b, items.len(), wire::MAX_PARTS).is_some(), parts <= wire::MAX_PARTS);
        // A response group never carries the flag.
        prop_assert_eq!(wire::group_items(&b, items.len(), |_| true).is_some(), parts == 1 && !items[0].2);
        check_variants(&b, items.len(), &ms, &random, count, check_request_group);
    }

    #[test]
    fn group_items_valid_mutated_and_random(
        items in prop::collection::vec((0u8..255, prop::collection::vec(any::<u8>(), 0..40)), 1..12),
        ms in prop::collection::vec(mutation(), 0..4),
        random in prop::collection::vec(any::<u8>(), 0..120),
        count in 0usize..14,
    ) {
        let b = group_body(&items);
        let ok = items.iter().all(|(t, _)| *t < 200);
        prop_assert_eq!(wire::group_items(&b, items.len(), |t| t < 200).is_some(), ok);
        check_variants(&b, items.len(), &ms, &random, count, check_group);
    }

    #[test]
    fn decode_random_bytes(b in prop::collection::vec(any::<u8>(), 0..300)) {
        check_decode(&b);
    }

    #[test]
    fn decode_mutated_valid(b in valid_datagram(), ms in prop::collection::vec(mutation(), 1..4)) {
        prop_assert!(wire::decode(&b).is_ok(), "generator must produce valid datagrams");
        let mut b = b;
        mutate(&mut b, &ms);
        check_decode(&b);
    }
}

/// The runtime's receive path (dedup windows, response matching, reassembly) fed with
/// random and mutated datagrams from every source, interleaved with its own traffic.
#[test]
fn runtime_receive_path_never_panics() {
    let cc = ClusterConfig::new(2, 2);
    let fabric = LocalFabric::new(cc).unwrap();
    let mut rt = Runtime::new(
        fabric.node(0).endpoint(0).unwrap(),
        RuntimeConfig::default(),
    )
    .unwrap();
    rt.register(1, |_, req, resp| resp.extend_from_slice(req));
    rt.spawn(|ctx| async move {
        // Outstanding requests give forged responses something to (mis)match.
        for _ in 0..3 {
            let _ = ctx.queue(1, 1, &[5; 40]);
            let _ = ctx.queue(1, 1, &vec![6; 9000]);
            let _ = ctx.flush().await;
        }
    });
    let mut runner = TestRunner::new(Config {
        cases: 3000,
        ..Config::default()
    });
    let strat = (
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..200),
            (valid_datagram(), prop::collection::vec(mutation(), 0..3)).prop_map(|(mut b, m)| {
                mutate(&mut b, &m);
                b
            }),
        ],
        0u16..2,
        0u16..2,
    );
    let rt_ref = std::cell::RefCell::new(&mut rt);
    runner
        .run(&strat, |(bytes, node, thread)| {
            let mut rt = rt_ref.borrow_mut();
            rt.inject(EndpointAddr::new(node, thread), &bytes);
            rt.poll_once();
            Ok(())
        })
        .unwrap();
    let st = rt.stats();
    assert!(st.rx_malformed > 0, "{st:?}");
}
