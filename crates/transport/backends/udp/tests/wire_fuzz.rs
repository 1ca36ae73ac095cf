//! Fuzzing the decoder, the front door for untrusted bytes: it never panics, accepts
//! only what re-encodes to the same bytes, and round-trips every valid datagram.

use ambidex_transport::{AccessError, EndpointAddr};
use ambidex_transport_udp::wire::{self, Body, Limits, Packet, ReqOp, Request, Response};
use proptest::prelude::*;

fn limits() -> Limits {
    Limits {
        cluster_id: 0xC1,
        epoch: 5,
        nodes: 3,
        threads: 2,
        me: EndpointAddr::new(1, 1),
        mtu: 256,
        max_onesided: 128,
    }
}

/// Accepted bytes must be exactly the encoding of what was decoded.
fn check(bytes: &[u8]) {
    let lim = limits();
    if let Ok(p) = wire::decode(bytes, &lim) {
        let mut again = Vec::new();
        wire::encode(&p, lim.cluster_id, lim.epoch, &mut again);
        assert_eq!(again, bytes, "accepted bytes that do not re-encode: {p:?}");
    }
}

fn status() -> impl Strategy<Value = Result<(), AccessError>> {
    prop_oneof![
        Just(Ok(())),
        (1u8..=9).prop_map(|c| Err(AccessError::from_code(c).unwrap()))
    ]
}

#[derive(Debug, Clone)]
enum Shape {
    Data(Vec<u8>),
    Req(u32, u64, u32, u64, u64, u8, u64, u64, Vec<u8>),
    Resp(u32, u64, Result<(), AccessError>, u64, Vec<u8>),
}

fn shape() -> impl Strategy<Value = Shape> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..=256).prop_map(Shape::Data),
        (
            any::<u32>(),
            any::<u64>(),
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            0u8..4,
            any::<u64>(),
            any::<u64>(),
            prop::collection::vec(any::<u8>(), 0..=128)
        )
            .prop_map(|(s, q, r, o, k, op, a, b, d)| Shape::Req(s, q, r, o, k, op, a, b, d)),
        (
            any::<u32>(),
            any::<u64>(),
            status(),
            any::<u64>(),
            prop::collection::vec(any::<u8>(), 0..=128)
        )
            .prop_map(|(s, q, st, v, d)| Shape::Resp(s, q, st, v, d)),
    ]
}

fn packet(src: EndpointAddr, sh: &Shape) -> Packet<'_> {
    let dst = limits().me;
    let body = match sh {
        Shape::Data(d) => Body::Data(d),
        Shape::Req(session, seq, region, offset, key, op, a, b, d) => Body::Request(Request {
            session: *session,
            seq: *seq,
            region: *region,
            offset: *offset,
            key: *key,
            op: match op {
                0 => ReqOp::Read { len: *a as u32 },
                1 => ReqOp::Write { data: d },
                2 => ReqOp::Cas {
                    expected: *a,
                    new: *b,
                },
                _ => ReqOp::Faa { add: *a },
            },
        }),
        Shape::Resp(session, seq, status, value, d) => Body::Response(Response {
            session: *session,
            seq: *seq,
            status: *status,
            value: *value,
            data: if status.is_ok() { d } else { &[] },
        }),
    };
    Packet { src, dst, body }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        check(&bytes);
    }

    #[test]
    fn random_bodies_behind_a_valid_header(kind in 0u8..5, body in prop::collection::vec(any::<u8>(), 0..600)) {
        let lim = limits();
        let mut b = vec![0u8; wire::HDR_LEN];
        wire::write_header(&mut b, kind, lim.cluster_id, lim.epoch, EndpointAddr::new(2, 0), lim.me);
        b.extend_from_slice(&body);
        check(&b);
    }

    #[test]
    fn valid_packets_round_trip_and_survive_mutation(
        node in 0u16..3, thread in 0u16..2, sh in shape(),
        pos in any::<prop::sample::Index>(), byte in any::<u8>(), cut in any::<prop::sample::Index>(),
    ) {
        let lim = limits();
        let p = packet(EndpointAddr::new(node, thread), &sh);
        let mut bytes = Vec::new();
        wire::encode(&p, lim.cluster_id, lim.epoch, &mut bytes);
        prop_assert_eq!(wire::decode(&bytes, &lim), Ok(p));
        let mut m = bytes.clone();
        let i = pos.index(m.len());
        m[i] = byte;
        check(&m);
        check(&bytes[..cut.index(bytes.len() + 1)]);
    }
}
