//! The RPC wire format. Every datagram is untrusted: [`decode`] checks every length
//! against the buffer before use and validates the whole datagram before the caller acts
//! on any record, so a malformed datagram is dropped as a unit.
//!
//! ```text
//! datagram  = header record{count}            (no trailing bytes)
//! header    = magic:u16 kind:u8 count:u8 session:u32 ack:u64          (16 bytes, LE)
//! record    = seq:u64 tag:u8 flags:u8 len:u16 [total:u32 offset:u32] payload[len]
//! ```
//! - `kind`: 1 = requests, 2 = responses; a datagram carries records of one kind (the
//!   records of one datagram are coalesced RPCs to or from one endpoint).
//! - `session`: the requesting endpoint's incarnation nonce (echoed in responses).
//! - `ack`: in requests, the requester's watermark: every request with a smaller `seq`
//!   to this destination is settled, so the server may forget its cached responses.
//! - `tag`: request type in requests; status in responses ([`STATUS_OK`] ...).
//! - `flags & FLAG_SEG`: the record is one segment of a message of `total` bytes,
//!   starting at `offset` (the 8-byte extension is present only then).

pub const MAGIC: u16 = 0xADB1;
pub const KIND_REQUEST: u8 = 1;
pub const KIND_RESPONSE: u8 = 2;
pub const DGRAM_HDR: usize = 16;
pub const REC_HDR: usize = 12;
pub const SEG_EXT: usize = 8;
pub const FLAG_SEG: u8 = 1;
pub const MAX_RECORDS: usize = 255;
/// Hard wire limit on a segmented message; the runtime's own limit is lower.
pub const MAX_WIRE_MESSAGE: u32 = 16 << 20;

pub const STATUS_OK: u8 = 0;
pub const STATUS_NO_HANDLER: u8 = 1;
pub const STATUS_TOO_LARGE: u8 = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: u8,
    pub count: u8,
    pub session: u32,
    pub ack: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seg {
    pub total: u32,
    pub offset: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    pub seq: u64,
    pub tag: u8,
    pub seg: Option<Seg>,
    pub payload: &'a [u8],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    TooShort,
    BadMagic,
    BadKind,
    NoRecords,
    Truncated,
    BadFlags,
    BadSegment,
    ZeroSeq,
    TrailingBytes,
}

#[inline]
fn u16_at(b: &[u8], i: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(i..i + 2)?.try_into().ok()?))
}
#[inline]
fn u32_at(b: &[u8], i: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(i..i + 4)?.try_into().ok()?))
}
#[inline]
fn u64_at(b: &[u8], i: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?))
}

/// Parses one record at the start of `b`; returns it and the rest.
#[inline(always)]
fn parse_record(b: &[u8]) -> Result<(Record<'_>, &[u8]), WireError> {
    let Some((h, after)) = b.split_first_chunk::<REC_HDR>() else {
        return Err(WireError::Truncated);
    };
    let seq = u64::from_le_bytes([h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]]);
    let tag = h[8];
    let flags = h[9];
    let len = u16::from_le_bytes([h[10], h[11]]) as usize;
    if seq == 0 {
        return Err(WireError::ZeroSeq);
    }
    if flags & !FLAG_SEG != 0 {
        return Err(WireError::BadFlags);
    }
    let (seg, body) = if flags & FLAG_SEG != 0 {
        let Some((x, body)) = after.split_first_chunk::<SEG_EXT>() else {
            return Err(WireError::Truncated);
        };
        let total = u32::from_le_bytes([x[0], x[1], x[2], x[3]]);
        let offset = u32::from_le_bytes([x[4], x[5], x[6], x[7]]);
        // A segment is non-empty and lies within its message.
        if len == 0 || total > MAX_WIRE_MESSAGE || (offset as u64 + len as u64) > total as u64 {
            return Err(WireError::BadSegment);
        }
        (Some(Seg { total, offset }), body)
    } else {
        (None, after)
    };
    if body.len() < len {
        return Err(WireError::Truncated);
    }
    let (payload, rest) = body.split_at(len);
    Ok((
        Record {
            seq,
            tag,
            seg,
            payload,
        },
        rest,
    ))
}

/// Validates a whole datagram; on success returns its header and an iterator over its
/// records (which then cannot fail).
#[inline]
pub fn decode(buf: &[u8]) -> Result<(Header, Records<'_>), WireError> {
    if buf.len() < DGRAM_HDR {
        return Err(WireError::TooShort);
    }
    if u16_at(buf, 0) != Some(MAGIC) {
        return Err(WireError::BadMagic);
    }
    let kind = buf[2];
    if kind != KIND_REQUEST && kind != KIND_RESPONSE {
        return Err(WireError::BadKind);
    }
    let count = buf[3];
    if count == 0 {
        return Err(WireError::NoRecords);
    }
    let session = u32_at(buf, 4).ok_or(WireError::TooShort)?;
    let ack = u64_at(buf, 8).ok_or(WireError::TooShort)?;
    let body = &buf[DGRAM_HDR..];
    let mut rest = body;
    for _ in 0..count {
        rest = parse_record(rest)?.1;
    }
    if !rest.is_empty() {
        return Err(WireError::TrailingBytes);
    }
    Ok((
        Header {
            kind,
            count,
            session,
            ack,
        },
        Records {
            rest: body,
            left: count,
        },
    ))
}

/// Records of a validated datagram.
pub struct Records<'a> {
    rest: &'a [u8],
    left: u8,
}

impl<'a> Iterator for Records<'a> {
    type Item = Record<'a>;
    #[inline(always)]
    fn next(&mut self) -> Option<Record<'a>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        // Validated by `decode`; a failure here would only end the iteration.
        let (r, rest) = parse_record(self.rest).ok()?;
        self.rest = rest;
        Some(r)
    }
}

/// Appends a datagram header with no records; returns its start offset in `buf`.
#[inline]
pub fn begin(buf: &mut Vec<u8>, kind: u8, session: u32, ack: u64) -> usize {
    let start = buf.len();
    let mut h = [0u8; DGRAM_HDR];
    h[0..2].copy_from_slice(&MAGIC.to_le_bytes());
    h[2] = kind;
    h[4..8].copy_from_slice(&session.to_le_bytes());
    h[8..16].copy_from_slice(&ack.to_le_bytes());
    buf.extend_from_slice(&h);
    start
}

/// Bytes a record with `len` payload bytes takes.
#[inline]
pub fn record_len(len: usize, segmented: bool) -> usize {
    REC_HDR + if segmented { SEG_EXT } else { 0 } + len
}

/// Appends a record to the datagram that starts at `start` (the caller checked the MTU
/// and the record count).
pub fn push_record(
    buf: &mut Vec<u8>,
    start: usize,
    seq: u64,
    tag: u8,
    seg: Option<Seg>,
    payload: &[u8],
) {
    debug_assert!(buf[start + 3] < MAX_RECORDS as u8);
    buf[start + 3] += 1;
    put_record(buf, seq, tag, seg, payload);
}

/// Writes a datagram header with no records at `buf[pos..pos + DGRAM_HDR]` (which the
/// caller sized).
#[inline(always)]
pub(crate) fn write_header(buf: &mut [u8], pos: usize, kind: u8, session: u32, ack: u64) {
    let h: &mut [u8; DGRAM_HDR] = (&mut buf[pos..pos + DGRAM_HDR]).try_into().unwrap();
    h[0..2].copy_from_slice(&MAGIC.to_le_bytes());
    h[2] = kind;
    h[3] = 0;
    h[4..8].copy_from_slice(&session.to_le_bytes());
    h[8..16].copy_from_slice(&ack.to_le_bytes());
}

/// Writes a record at `buf[pos..]` (which the caller sized for
/// `REC_HDR + SEG_EXT + payload.len()` bytes); returns the position after it. The
/// record is not counted in its datagram's header.
#[inline(always)]
pub(crate) fn write_record(
    buf: &mut [u8],
    pos: usize,
    seq: u64,
    tag: u8,
    seg: Option<Seg>,
    payload: &[u8],
) -> usize {
    let h: &mut [u8; REC_HDR] = (&mut buf[pos..pos + REC_HDR]).try_into().unwrap();
    h[0..8].copy_from_slice(&seq.to_le_bytes());
    h[8] = tag;
    h[10..12].copy_from_slice(&(payload.len() as u16).to_le_bytes());
    let mut p = pos + REC_HDR;
    match seg {
        None => h[9] = 0,
        Some(s) => {
            h[9] = FLAG_SEG;
            let x: &mut [u8; SEG_EXT] = (&mut buf[p..p + SEG_EXT]).try_into().unwrap();
            x[0..4].copy_from_slice(&s.total.to_le_bytes());
            x[4..8].copy_from_slice(&s.offset.to_le_bytes());
            p += SEG_EXT;
        }
    }
    let end = p + payload.len();
    buf[p..end].copy_from_slice(payload);
    end
}

/// Appends a record without counting it in its datagram's header (the runtime writes
/// the count when it closes the datagram).
#[inline(always)]
pub(crate) fn put_record(buf: &mut Vec<u8>, seq: u64, tag: u8, seg: Option<Seg>, payload: &[u8]) {
    let mut h = [0u8; REC_HDR + SEG_EXT];
    h[0..8].copy_from_slice(&seq.to_le_bytes());
    h[8] = tag;
    h[10..12].copy_from_slice(&(payload.len() as u16).to_le_bytes());
    match seg {
        None => {
            buf.reserve(REC_HDR + payload.len());
            buf.extend_from_slice(&h[..REC_HDR]);
        }
        Some(s) => {
            h[9] = FLAG_SEG;
            h[12..16].copy_from_slice(&s.total.to_le_bytes());
            h[16..20].copy_from_slice(&s.offset.to_le_bytes());
            buf.reserve(REC_HDR + SEG_EXT + payload.len());
            buf.extend_from_slice(&h);
        }
    }
    buf.extend_from_slice(payload);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let mut b = Vec::new();
        let s = begin(&mut b, KIND_REQUEST, 7, 3);
        push_record(&mut b, s, 5, 9, None, b"hello");
        push_record(
            &mut b,
            s,
            6,
            1,
            Some(Seg {
                total: 10,
                offset: 4,
            }),
            b"abc",
        );
        let (h, recs) = decode(&b).unwrap();
        assert_eq!((h.kind, h.count, h.session, h.ack), (KIND_REQUEST, 2, 7, 3));
        let v: Vec<_> = recs.collect();
        assert_eq!(v.len(), 2);
        assert_eq!((v[0].seq, v[0].tag, v[0].payload), (5, 9, &b"hello"[..]));
        assert_eq!(
            v[1].seg,
            Some(Seg {
                total: 10,
                offset: 4
            })
        );
        // Any truncation or trailing byte invalidates the whole datagram.
        for cut in 0..b.len() {
            assert!(decode(&b[..cut]).is_err(), "cut {cut}");
        }
        let mut longer = b.clone();
        longer.push(0);
        assert_eq!(decode(&longer).err(), Some(WireError::TrailingBytes));
    }

    #[test]
    fn bad_segments_rejected() {
        let mut b = Vec::new();
        let s = begin(&mut b, KIND_RESPONSE, 1, 0);
        push_record(
            &mut b,
            s,
            1,
            0,
            Some(Seg {
                total: 4,
                offset: 2,
            }),
            b"abc",
        );
        assert_eq!(decode(&b).err(), Some(WireError::BadSegment));
    }
}
