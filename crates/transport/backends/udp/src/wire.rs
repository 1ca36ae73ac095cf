//! The wire format of every UDP datagram, and its decoder: the front door for untrusted
//! bytes. All integers are little-endian.
//!
//! ```text
//! header (24 bytes, every datagram)
//!   0  u16 magic 0xA3B1      2  u8 version (1)     3  u8 kind (1 data, 2 request, 3 response)
//!   4  u64 cluster id       12  u32 epoch
//!  16  u16 src node         18  u16 src thread    20  u16 dst node    22  u16 dst thread
//! data (kind 1):      the payload (0..=mtu bytes)
//! request (kind 2, 52 bytes, then the WRITE data)
//!   0  u32 session           4  u64 seq           12  u8 op (1 READ, 2 WRITE, 3 CAS, 4 FAA)
//!  13  3 bytes zero         16  u32 region        20  u64 offset      28  u64 key
//!  36  u64 arg1 (READ len, CAS expected, FAA add; else 0)
//!  44  u64 arg2 (CAS new; else 0)
//! response (kind 3, 24 bytes, then the READ data)
//!   0  u32 session           4  u64 seq           12  u8 status (0 ok, else AccessError code)
//!  13  3 bytes zero         16  u64 value (old word of CAS/FAA)
//! ```
//!
//! The decoder is strict (reserved bytes and unused arguments must be zero) so that every
//! accepted datagram re-encodes to exactly its own bytes; the fuzz tests rely on that.

use ambidex_transport::{AccessError, Counter, EndpointAddr};

pub const MAGIC: u16 = 0xA3B1;
pub const VERSION: u8 = 1;
pub const HDR_LEN: usize = 24;
pub const REQ_LEN: usize = 52;
pub const RESP_LEN: usize = 24;

pub const KIND_DATA: u8 = 1;
pub const KIND_REQUEST: u8 = 2;
pub const KIND_RESPONSE: u8 = 3;

const OP_READ: u8 = 1;
const OP_WRITE: u8 = 2;
const OP_CAS: u8 = 3;
const OP_FAA: u8 = 4;

/// Largest datagram any valid configuration produces (a READ response or WRITE request of
/// 61440 bytes), well under the 65507-byte UDP limit.
pub const fn max_datagram(mtu: usize, max_onesided: usize) -> usize {
    let data = HDR_LEN + mtu;
    let req = HDR_LEN + REQ_LEN + max_onesided;
    if data > req {
        data
    } else {
        req
    }
}

/// What the receiving endpoint expects of a datagram.
#[derive(Clone, Debug)]
pub struct Limits {
    pub cluster_id: u64,
    pub epoch: u32,
    pub nodes: u16,
    pub threads: u16,
    /// The receiving endpoint.
    pub me: EndpointAddr,
    pub mtu: usize,
    pub max_onesided: usize,
}

/// Why a datagram was dropped; each maps to one counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    Malformed,
    WrongCluster,
    WrongEpoch,
    UnknownDest,
}

impl DropReason {
    pub fn counter(self) -> Counter {
        match self {
            DropReason::Malformed => Counter::RxDroppedMalformed,
            DropReason::WrongCluster => Counter::RxDroppedWrongCluster,
            DropReason::WrongEpoch => Counter::RxDroppedWrongEpoch,
            DropReason::UnknownDest => Counter::RxDroppedUnknownDest,
        }
    }
}

/// The verb and arguments of a one-sided request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReqOp<'a> {
    Read { len: u32 },
    Write { data: &'a [u8] },
    Cas { expected: u64, new: u64 },
    Faa { add: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request<'a> {
    pub session: u32,
    pub seq: u64,
    pub region: u32,
    pub offset: u64,
    pub key: u64,
    pub op: ReqOp<'a>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Response<'a> {
    pub session: u32,
    pub seq: u64,
    pub status: Result<(), AccessError>,
    pub value: u64,
    pub data: &'a [u8],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Body<'a> {
    Data(&'a [u8]),
    Request(Request<'a>),
    Response(Response<'a>),
}

/// A decoded datagram (cluster id and epoch were checked against [`Limits`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet<'a> {
    pub src: EndpointAddr,
    pub dst: EndpointAddr,
    pub body: Body<'a>,
}

#[inline]
fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}
#[inline]
fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().unwrap())
}
#[inline]
fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().unwrap())
}

/// Writes the common header into `out[..HDR_LEN]`.
#[inline]
pub fn write_header(
    out: &mut [u8],
    kind: u8,
    cluster_id: u64,
    epoch: u32,
    src: EndpointAddr,
    dst: EndpointAddr,
) {
    out[0..2].copy_from_slice(&MAGIC.to_le_bytes());
    out[2] = VERSION;
    out[3] = kind;
    out[4..12].copy_from_slice(&cluster_id.to_le_bytes());
    out[12..16].copy_from_slice(&epoch.to_le_bytes());
    out[16..18].copy_from_slice(&src.node.to_le_bytes());
    out[18..20].copy_from_slice(&src.thread.to_le_bytes());
    out[20..22].copy_from_slice(&dst.node.to_le_bytes());
    out[22..24].copy_from_slice(&dst.thread.to_le_bytes());
}

/// The epoch stamped on a datagram long enough to have a header, whatever else it holds.
pub fn epoch_of(b: &[u8]) -> Option<u32> {
    (b.len() >= HDR_LEN).then(|| u32_at(b, 12))
}

/// Re-stamps the epoch of an already encoded datagram (retransmissions after
/// `set_epoch`).
#[inline]
pub fn set_epoch(pkt: &mut [u8], epoch: u32) {
    pkt[12..16].copy_from_slice(&epoch.to_le_bytes());
}

/// Appends the encoding of `p` to `out`.
pub fn encode(p: &Packet<'_>, cluster_id: u64, epoch: u32, out: &mut Vec<u8>) {
    let start = out.len();
    out.resize(start + HDR_LEN, 0);
    let kind = match p.body {
        Body::Data(_) => KIND_DATA,
        Body::Request(_) => KIND_REQUEST,
        Body::Response(_) => KIND_RESPONSE,
    };
    write_header(&mut out[start..], kind, cluster_id, epoch, p.src, p.dst);
    match p.body {
        Body::Data(d) => out.extend_from_slice(d),
        Body::Request(r) => {
            let (op, a1, a2, data): (u8, u64, u64, &[u8]) = match r.op {
                ReqOp::Read { len } => (OP_READ, len as u64, 0, &[]),
                ReqOp::Write { data } => (OP_WRITE, 0, 0, data),
                ReqOp::Cas { expected, new } => (OP_CAS, expected, new, &[]),
                ReqOp::Faa { add } => (OP_FAA, add, 0, &[]),
            };
            out.extend_from_slice(&r.session.to_le_bytes());
            out.extend_from_slice(&r.seq.to_le_bytes());
            out.extend_from_slice(&[op, 0, 0, 0]);
            out.extend_from_slice(&r.region.to_le_bytes());
            out.extend_from_slice(&r.offset.to_le_bytes());
            out.extend_from_slice(&r.key.to_le_bytes());
            out.extend_from_slice(&a1.to_le_bytes());
            out.extend_from_slice(&a2.to_le_bytes());
            out.extend_from_slice(data);
        }
        Body::Response(r) => {
            out.extend_from_slice(&r.session.to_le_bytes());
            out.extend_from_slice(&r.seq.to_le_bytes());
            let status = match r.status {
                Ok(()) => 0,
                Err(e) => e.code(),
            };
            out.extend_from_slice(&[status, 0, 0, 0]);
            out.extend_from_slice(&r.value.to_le_bytes());
            out.extend_from_slice(r.data);
        }
    }
}

/// Decodes one received datagram, or says why it must be dropped. Never panics.
pub fn decode<'a>(b: &'a [u8], lim: &Limits) -> Result<Packet<'a>, DropReason> {
    use DropReason::*;
    if b.len() < HDR_LEN || u16_at(b, 0) != MAGIC || b[2] != VERSION {
        return Err(Malformed);
    }
    let kind = b[3];
    if !(KIND_DATA..=KIND_RESPONSE).contains(&kind) {
        return Err(Malformed);
    }
    if u64_at(b, 4) != lim.cluster_id {
        return Err(WrongCluster);
    }
    if u32_at(b, 12) != lim.epoch {
        return Err(WrongEpoch);
    }
    let src = EndpointAddr::new(u16_at(b, 16), u16_at(b, 18));
    let dst = EndpointAddr::new(u16_at(b, 20), u16_at(b, 22));
    if dst != lim.me || src.node >= lim.nodes || src.thread >= lim.threads {
        return Err(UnknownDest);
    }
    let rest = &b[HDR_LEN..];
    let body = match kind {
        KIND_DATA => {
            if rest.len() > lim.mtu {
                return Err(Malformed);
            }
            Body::Data(rest)
        }
        KIND_REQUEST => {
            if rest.len() < REQ_LEN || rest[13..16] != [0, 0, 0] {
                return Err(Malformed);
            }
            let (a1, a2) = (u64_at(rest, 36), u64_at(rest, 44));
            let data = &rest[REQ_LEN..];
            let op = match rest[12] {
                OP_READ if a1 <= u32::MAX as u64 && a2 == 0 && data.is_empty() => {
                    ReqOp::Read { len: a1 as u32 }
                }
                OP_WRITE if a1 == 0 && a2 == 0 && data.len() <= lim.max_onesided => {
                    ReqOp::Write { data }
                }
                OP_CAS if data.is_empty() => ReqOp::Cas {
                    expected: a1,
                    new: a2,
                },
                OP_FAA if a2 == 0 && data.is_empty() => ReqOp::Faa { add: a1 },
                _ => return Err(Malformed),
            };
            Body::Request(Request {
                session: u32_at(rest, 0),
                seq: u64_at(rest, 4),
                region: u32_at(rest, 16),
                offset: u64_at(rest, 20),
                key: u64_at(rest, 28),
                op,
            })
        }
        _ => {
            if rest.len() < RESP_LEN || rest[13..16] != [0, 0, 0] {
                return Err(Malformed);
            }
            let status = match rest[12] {
                0 => Ok(()),
                c => Err(AccessError::from_code(c).ok_or(Malformed)?),
            };
            let data = &rest[RESP_LEN..];
            // Only a successful READ carries data.
            if data.len() > lim.max_onesided || (status.is_err() && !data.is_empty()) {
                return Err(Malformed);
            }
            Body::Response(Response {
                session: u32_at(rest, 0),
                seq: u64_at(rest, 4),
                status,
                value: u64_at(rest, 16),
                data,
            })
        }
    };
    Ok(Packet { src, dst, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lim() -> Limits {
        Limits {
            cluster_id: 7,
            epoch: 3,
            nodes: 3,
            threads: 2,
            me: EndpointAddr::new(0, 1),
            mtu: 100,
            max_onesided: 64,
        }
    }

    #[test]
    fn each_check_has_its_reason() {
        let l = lim();
        let p = Packet {
            src: EndpointAddr::new(2, 1),
            dst: l.me,
            body: Body::Data(b"hi"),
        };
        let mut ok = Vec::new();
        encode(&p, 7, 3, &mut ok);
        assert_eq!(decode(&ok, &l), Ok(p));
        let mut v = Vec::new();
        encode(&p, 8, 3, &mut v);
        assert_eq!(decode(&v, &l), Err(DropReason::WrongCluster));
        v.clear();
        encode(&p, 7, 4, &mut v);
        assert_eq!(decode(&v, &l), Err(DropReason::WrongEpoch));
        for dst in [EndpointAddr::new(0, 0), EndpointAddr::new(1, 1)] {
            v.clear();
            encode(&Packet { dst, ..p }, 7, 3, &mut v);
            assert_eq!(decode(&v, &l), Err(DropReason::UnknownDest));
        }
        v.clear();
        encode(
            &Packet {
                src: EndpointAddr::new(3, 0),
                ..p
            },
            7,
            3,
            &mut v,
        );
        assert_eq!(decode(&v, &l), Err(DropReason::UnknownDest));
        assert_eq!(decode(&ok[..HDR_LEN - 1], &l), Err(DropReason::Malformed));
        let mut big = ok.clone();
        big.resize(HDR_LEN + 101, 0);
        assert_eq!(decode(&big, &l), Err(DropReason::Malformed));
        let mut m = ok.clone();
        m[0] ^= 1;
        assert_eq!(decode(&m, &l), Err(DropReason::Malformed));
    }
}
