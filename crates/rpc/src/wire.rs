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
//! - `flags & FLAG_GROUP`: the record's message is a group of `tag` (1..=255) items, the
//!   coalesced requests of one or more flushes to one endpoint (or their responses, in
//!   order), sharing one `seq`:
//!
//! ```text
//! group     = item{tag}                       (no trailing bytes)
//! item      = tag:u8 len:u32 payload[len & !ITEM_PART]
//!                                             (request type, or response status)
//! ```
//!
//! A group costs one sequence number, one window entry and one record header for all
//! its requests, where separate records would cost one each. Requests are grouped only
//! when small (never segmented); a group's responses may be segmented.
//!
//! A request group may hold the batches of several flushes (of different workers) to
//! one endpoint in one step. Each batch is a *part* of the group: the top bit of a
//! request item's `len` ([`ITEM_PART`]) marks the first item of a part, and the group's
//! first item starts one in any case. The responses of one part share a budget of
//! `max_message` bytes (item headers included; an item that found the budget spent
//! still takes its 5-byte header), so one worker's large responses never fail
//! another's requests. A group has at most [`MAX_PARTS`] parts, so its response is at
//! most `parts * max_message + count * ITEM_HDR` bytes, and the server keeps it within
//! [`MAX_WIRE_MESSAGE`]. Response items carry no flag.

/// Version 2: request group items may carry the part flag ([`ITEM_PART`]).
pub const MAGIC: u16 = 0xADB2;
pub const KIND_REQUEST: u8 = 1;
pub const KIND_RESPONSE: u8 = 2;
pub const DGRAM_HDR: usize = 16;
pub const REC_HDR: usize = 12;
pub const SEG_EXT: usize = 8;
pub const FLAG_SEG: u8 = 1;
pub const FLAG_GROUP: u8 = 2;
pub const ITEM_HDR: usize = 5;
/// Most items in a group (the count is the record's tag).
pub const MAX_ITEMS: usize = 255;
/// In a request item's `len`: the item starts a part of its group (see the module doc).
pub const ITEM_PART: u32 = 1 << 31;
/// Most parts in a request group.
pub const MAX_PARTS: usize = 8;
pub const MAX_RECORDS: usize = 255;
/// Hard wire limit on a segmented message; the runtime's own limit is lower.
pub const MAX_WIRE_MESSAGE: u32 = 16 << 20;

pub const STATUS_OK: u8 = 0;
pub const STATUS_NO_HANDLER: u8 = 1;
pub const STATUS_TOO_LARGE: u8 = 2;
/// Every status is at most this.
pub const STATUS_MAX: u8 = STATUS_TOO_LARGE;

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
    /// The message is a group of `tag` items (see [`group_items`]).
    pub group: bool,
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

/// Validates a whole datagram; on success returns its header and an iterator over its
/// records (which then cannot fail). One pass checks every length; the iterator then
/// reads the validated records without checking them again.
#[inline]
pub fn decode(buf: &[u8]) -> Result<(Header, Records<'_>), WireError> {
    if buf.len() < DGRAM_HDR {
        return Err(WireError::TooShort);
    }
    let h: &[u8; DGRAM_HDR] = buf[..DGRAM_HDR].try_into().expect("length checked");
    if u16::from_le_bytes([h[0], h[1]]) != MAGIC {
        return Err(WireError::BadMagic);
    }
    let kind = h[2];
    if kind != KIND_REQUEST && kind != KIND_RESPONSE {
        return Err(WireError::BadKind);
    }
    let count = h[3];
    if count == 0 {
        return Err(WireError::NoRecords);
    }
    let session = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
    let ack = u64::from_le_bytes([h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15]]);
    let body = &buf[DGRAM_HDR..];
    prefetch(body);
    validate_records(body, count)?;
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

/// Asks for every cache line of a datagram at once. A datagram fresh from another core
/// misses in this core's cache on every line, and validation walks it record by record
/// (each position comes from the previous record's length), so without this the misses
/// are taken one after another instead of overlapping.
#[inline(always)]
fn prefetch(b: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let mut off = 64;
        while off < b.len() {
            // SAFETY: a prefetch of an address inside `b` has no effect on memory.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(b.as_ptr().add(off) as *const i8) };
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = b;
}

/// Checks that `body` is exactly `count` well-formed records.
#[inline(always)]
fn validate_records(body: &[u8], count: u8) -> Result<(), WireError> {
    let n = body.len();
    let p = body.as_ptr();
    let mut pos = 0usize;
    for _ in 0..count {
        if n - pos < REC_HDR {
            return Err(WireError::Truncated);
        }
        // SAFETY: REC_HDR bytes at pos are inside `body` (checked above).
        let (seq, flags, len) = unsafe {
            let q = p.add(pos);
            (
                u64::from_le_bytes(std::ptr::read_unaligned(q as *const [u8; 8])),
                *q.add(9),
                u16::from_le_bytes(std::ptr::read_unaligned(q.add(10) as *const [u8; 2])) as usize,
            )
        };
        if seq == 0 {
            return Err(WireError::ZeroSeq);
        }
        if flags & !(FLAG_SEG | FLAG_GROUP) != 0 {
            return Err(WireError::BadFlags);
        }
        pos += REC_HDR;
        if flags & FLAG_SEG != 0 {
            if n - pos < SEG_EXT {
                return Err(WireError::Truncated);
            }
            // SAFETY: SEG_EXT bytes at pos are inside `body` (checked above).
            let (total, offset) = unsafe {
                let q = p.add(pos);
                (
                    u32::from_le_bytes(std::ptr::read_unaligned(q as *const [u8; 4])),
                    u32::from_le_bytes(std::ptr::read_unaligned(q.add(4) as *const [u8; 4])),
                )
            };
            // A segment is non-empty and lies within its message.
            if len == 0 || total > MAX_WIRE_MESSAGE || (offset as u64 + len as u64) > total as u64 {
                return Err(WireError::BadSegment);
            }
            pos += SEG_EXT;
        }
        if n - pos < len {
            return Err(WireError::Truncated);
        }
        pos += len;
    }
    if pos != n {
        return Err(WireError::TrailingBytes);
    }
    Ok(())
}

/// Records of a validated datagram.
pub struct Records<'a> {
    /// Invariant (established by [`decode`]): exactly `left` well-formed records.
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
        // SAFETY: `decode` validated that `rest` holds `left + 1` well-formed records, so
        // every offset read here lies inside it.
        unsafe {
            let b = self.rest;
            let q = b.as_ptr();
            let seq = u64::from_le_bytes(std::ptr::read_unaligned(q as *const [u8; 8]));
            let tag = *q.add(8);
            let flags = *q.add(9);
            let len =
                u16::from_le_bytes(std::ptr::read_unaligned(q.add(10) as *const [u8; 2])) as usize;
            let (seg, hdr) = if flags & FLAG_SEG != 0 {
                let x = q.add(REC_HDR);
                (
                    Some(Seg {
                        total: u32::from_le_bytes(std::ptr::read_unaligned(x as *const [u8; 4])),
                        offset: u32::from_le_bytes(std::ptr::read_unaligned(
                            x.add(4) as *const [u8; 4]
                        )),
                    }),
                    REC_HDR + SEG_EXT,
                )
            } else {
                (None, REC_HDR)
            };
            let payload = std::slice::from_raw_parts(q.add(hdr), len);
            self.rest = b.get_unchecked(hdr + len..);
            Some(Record {
                seq,
                tag,
                seg,
                group: flags & FLAG_GROUP != 0,
                payload,
            })
        }
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
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_record(
    buf: &mut [u8],
    pos: usize,
    seq: u64,
    tag: u8,
    seg: Option<Seg>,
    group: bool,
    payload: &[u8],
) -> usize {
    let ext = if seg.is_some() { SEG_EXT } else { 0 };
    let end = pos + REC_HDR + ext + payload.len();
    // One check for the whole record; the writes below stay inside it.
    assert!(end <= buf.len(), "record does not fit its buffer");
    let mut h = [0u8; REC_HDR];
    h[0..8].copy_from_slice(&seq.to_le_bytes());
    h[8] = tag;
    h[9] = if seg.is_some() { FLAG_SEG } else { 0 } | if group { FLAG_GROUP } else { 0 };
    h[10..12].copy_from_slice(&(payload.len() as u16).to_le_bytes());
    // SAFETY: pos + REC_HDR + ext + payload.len() <= buf.len() (asserted above).
    unsafe {
        let d = buf.as_mut_ptr().add(pos);
        std::ptr::write_unaligned(d as *mut [u8; REC_HDR], h);
        if let Some(s) = seg {
            let mut x = [0u8; SEG_EXT];
            x[0..4].copy_from_slice(&s.total.to_le_bytes());
            x[4..8].copy_from_slice(&s.offset.to_le_bytes());
            std::ptr::write_unaligned(d.add(REC_HDR) as *mut [u8; SEG_EXT], x);
        }
        copy_raw(d.add(REC_HDR + ext), payload.as_ptr(), payload.len());
    }
    end
}

/// Copies `n` bytes from `s` to `d`, inlined for the small payloads of typical RPCs (a
/// libc call costs more than the copy itself there).
///
/// # Safety
/// `s` must be readable and `d` writable for `n` bytes, and the ranges must not overlap.
#[inline(always)]
unsafe fn copy_raw(d: *mut u8, s: *const u8, n: usize) {
    use std::ptr::{read_unaligned as rd, write_unaligned as wr};
    if n > 32 {
        std::ptr::copy_nonoverlapping(s, d, n);
    } else if n >= 16 {
        // Two possibly overlapping chunks cover the n bytes.
        let a = rd(s as *const [u8; 16]);
        let b = rd(s.add(n - 16) as *const [u8; 16]);
        wr(d as *mut [u8; 16], a);
        wr(d.add(n - 16) as *mut [u8; 16], b);
    } else if n >= 8 {
        let a = rd(s as *const u64);
        let b = rd(s.add(n - 8) as *const u64);
        wr(d as *mut u64, a);
        wr(d.add(n - 8) as *mut u64, b);
    } else if n >= 4 {
        let a = rd(s as *const u32);
        let b = rd(s.add(n - 4) as *const u32);
        wr(d as *mut u32, a);
        wr(d.add(n - 4) as *mut u32, b);
    } else if n > 0 {
        let a = *s;
        let b = *s.add(n / 2);
        let c = *s.add(n - 1);
        *d = a;
        *d.add(n / 2) = b;
        *d.add(n - 1) = c;
    }
}

/// `v.extend_from_slice(src)` with the inlined small copy.
#[inline(always)]
pub(crate) fn extend_bytes(v: &mut Vec<u8>, src: &[u8]) {
    let n = src.len();
    v.reserve(n);
    let old = v.len();
    // SAFETY: `reserve` made room for n more bytes, all written before `set_len`; `src`
    // cannot alias the spare capacity of `v`.
    unsafe {
        copy_raw(v.as_mut_ptr().add(old), src.as_ptr(), n);
        v.set_len(old + n);
    }
}

/// Appends a group item: a request to a worker's batch (so that a flush copies whole
/// items instead of re-encoding them; `part` flags the batch's first request), or a
/// response to a group's; returns the payload's offset.
#[inline(always)]
pub(crate) fn extend_item(v: &mut Vec<u8>, tag: u8, payload: &[u8], part: bool) -> usize {
    let n = payload.len();
    debug_assert!(n < ITEM_PART as usize);
    v.reserve(ITEM_HDR + n);
    let old = v.len();
    let mut h = [0u8; ITEM_HDR];
    h[0] = tag;
    h[1..5].copy_from_slice(&(n as u32 | if part { ITEM_PART } else { 0 }).to_le_bytes());
    // SAFETY: `reserve` made room for ITEM_HDR + n more bytes, all written before
    // `set_len`; `payload` cannot alias the spare capacity of `v`.
    unsafe {
        let d = v.as_mut_ptr().add(old);
        std::ptr::write_unaligned(d as *mut [u8; ITEM_HDR], h);
        copy_raw(d.add(ITEM_HDR), payload.as_ptr(), n);
        v.set_len(old + ITEM_HDR + n);
    }
    old + ITEM_HDR
}

/// Opens an item at the end of `v` (its header written by [`close_item`] once its
/// payload follows); returns the header's offset.
#[inline(always)]
pub(crate) fn open_item(v: &mut Vec<u8>) -> usize {
    let at = v.len();
    v.reserve(ITEM_HDR);
    // SAFETY: `reserve` made room for the ITEM_HDR bytes written before `set_len`.
    unsafe {
        std::ptr::write_unaligned(v.as_mut_ptr().add(at) as *mut [u8; ITEM_HDR], [0; ITEM_HDR]);
        v.set_len(at + ITEM_HDR);
    }
    at
}

/// Writes the header of the item opened at `at`: `tag`, and the bytes after it.
#[inline(always)]
pub(crate) fn close_item(v: &mut [u8], at: usize, tag: u8) {
    let n = (v.len() - at - ITEM_HDR) as u32;
    let mut h = [0u8; ITEM_HDR];
    h[0] = tag;
    h[1..5].copy_from_slice(&n.to_le_bytes());
    let d: &mut [u8; ITEM_HDR] = (&mut v[at..at + ITEM_HDR]).try_into().unwrap();
    *d = h;
}

/// Writes the header of a group record at `buf[pos..pos + REC_HDR]`: `count` items in
/// `len` bytes.
#[inline(always)]
pub(crate) fn write_group_header(buf: &mut [u8], pos: usize, seq: u64, count: u8, len: u16) {
    let mut h = [0u8; REC_HDR];
    h[0..8].copy_from_slice(&seq.to_le_bytes());
    h[8] = count;
    h[9] = FLAG_GROUP;
    h[10..12].copy_from_slice(&len.to_le_bytes());
    let d: &mut [u8; REC_HDR] = (&mut buf[pos..pos + REC_HDR]).try_into().unwrap();
    *d = h;
}

/// The items of a group body of responses, as (tag, payload) pairs, if `body` is
/// exactly `count` well-formed items whose tags `tag_ok` accepts (checked here, before
/// any is read). Response items carry no part flag: in a body under 2 GiB (anything
/// longer is refused) a flagged length cannot fit.
#[inline(always)]
pub fn group_items(body: &[u8], count: usize, tag_ok: impl Fn(u8) -> bool) -> Option<Items<'_>> {
    if body.len() >= ITEM_PART as usize {
        return None;
    }
    check_items::<false>(body, count, tag_ok, 1)
}

/// The items of a group body of requests, if `body` is exactly `count` well-formed
/// items in at most `max_parts` (1..=[`MAX_PARTS`]) parts (see [`Items::starts_part`]).
#[inline(always)]
pub fn request_items(body: &[u8], count: usize, max_parts: usize) -> Option<Items<'_>> {
    check_items::<true>(body, count, |_| true, max_parts.clamp(1, MAX_PARTS))
}

/// `count` items in at most `max_parts` parts. With `PARTS` a length's part flag is
/// taken off (and counted); without, the length is read whole, so that a flagged one
/// fails the bounds check exactly when the iterator's masked reading would differ.
#[inline(always)]
fn check_items<const PARTS: bool>(
    body: &[u8],
    count: usize,
    tag_ok: impl Fn(u8) -> bool,
    max_parts: usize,
) -> Option<Items<'_>> {
    let (p, n) = (body.as_ptr(), body.len());
    let mut pos = 0usize;
    // The first item starts a part whether flagged or not.
    let mut parts = 1;
    for k in 0..count {
        if n - pos < ITEM_HDR {
            return None;
        }
        // SAFETY: ITEM_HDR bytes at pos are inside `body` (checked above).
        let (tag, raw) = unsafe {
            let q = p.add(pos);
            (
                *q,
                u32::from_le_bytes(std::ptr::read_unaligned(q.add(1) as *const [u8; 4])),
            )
        };
        let len = if PARTS {
            parts += (k > 0 && raw & ITEM_PART != 0) as usize;
            raw & !ITEM_PART
        } else {
            raw
        };
        pos += ITEM_HDR;
        if !tag_ok(tag) || n - pos < len as usize {
            return None;
        }
        pos += len as usize;
    }
    (pos == n && parts <= max_parts).then_some(Items {
        rest: body,
        left: count,
    })
}

/// The items of a group body that [`group_items`] or [`request_items`] checked.
pub struct Items<'a> {
    /// Invariant (established by `check_items`): exactly `left` well-formed items, each
    /// `len` read without the part flag (a response length never has it).
    rest: &'a [u8],
    left: usize,
}

impl Items<'_> {
    /// Items not yet read.
    pub fn len_left(&self) -> usize {
        self.left
    }

    /// Whether the next item carries the part flag (request groups only).
    #[inline(always)]
    pub fn starts_part(&self) -> bool {
        // SAFETY: with an item left, its header lies inside `rest` (see `Items::next`).
        self.left > 0
            && unsafe {
                let q = self.rest.as_ptr();
                u32::from_le_bytes(std::ptr::read_unaligned(q.add(1) as *const [u8; 4])) & ITEM_PART
                    != 0
            }
    }
}

impl<'a> Iterator for Items<'a> {
    type Item = (u8, &'a [u8]);
    #[inline(always)]
    fn next(&mut self) -> Option<(u8, &'a [u8])> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        // SAFETY: `check_items` checked that `rest` holds `left + 1` well-formed items,
        // lengths read without the part flag as here, so the header and payload read
        // here lie inside it.
        unsafe {
            let q = self.rest.as_ptr();
            let len = u32::from_le_bytes(std::ptr::read_unaligned(q.add(1) as *const [u8; 4]))
                & !ITEM_PART;
            let payload = std::slice::from_raw_parts(q.add(ITEM_HDR), len as usize);
            self.rest = self.rest.get_unchecked(ITEM_HDR + len as usize..);
            Some((*q, payload))
        }
    }
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
    fn small_copies_match() {
        let src: Vec<u8> = (0..100u8).collect();
        for n in 0..=80 {
            let mut v = vec![0xee; 3];
            extend_bytes(&mut v, &src[..n]);
            assert_eq!(&v[..3], &[0xee; 3]);
            assert_eq!(&v[3..], &src[..n], "len {n}");
        }
    }

    #[test]
    fn written_records_decode() {
        for n in [0usize, 1, 3, 7, 8, 15, 16, 31, 32, 33, 100] {
            let payload: Vec<u8> = (0..n as u8).collect();
            let mut buf = vec![0u8; 512];
            write_header(&mut buf, 0, KIND_REQUEST, 3, 1);
            let p = write_record(&mut buf, DGRAM_HDR, 9, 4, None, false, &payload);
            let seg = Some(Seg {
                total: 1000,
                offset: 10,
            });
            let end = write_record(&mut buf, p, 10, 5, seg, true, &payload);
            buf[3] = 2;
            buf.truncate(end);
            if n == 0 {
                // An empty segment is invalid.
                assert_eq!(decode(&buf).err(), Some(WireError::BadSegment));
                continue;
            }
            let (_, recs) = decode(&buf).unwrap();
            let v: Vec<_> = recs.collect();
            assert_eq!(
                (v[0].seq, v[0].tag, v[0].seg, v[0].payload),
                (9, 4, None, &payload[..])
            );
            assert_eq!(
                (v[1].seq, v[1].tag, v[1].seg, v[1].payload),
                (10, 5, seg, &payload[..])
            );
            assert!(!v[0].group && v[1].group);
        }
    }

    #[test]
    fn group_items_roundtrip_and_reject_bad_bodies() {
        let mut body = Vec::new();
        let a = extend_item(&mut body, 7, b"abc", false);
        let b = extend_item(&mut body, 8, b"", false);
        let c = extend_item(&mut body, 9, &[5u8; 40], false);
        assert_eq!((a, b, c), (5, 13, 18));
        assert!(group_items(&body, 3, |_| true).is_some());
        let v: Vec<_> = group_items(&body, 3, |_| true).unwrap().collect();
        assert_eq!(
            v,
            vec![(7, &b"abc"[..]), (8, &b""[..]), (9, &[5u8; 40][..])]
        );
        // The count must match exactly, every tag must pass, nothing may trail.
        assert!(group_items(&body, 2, |_| true).is_none());
        assert!(group_items(&body, 4, |_| true).is_none());
        assert!(group_items(&body, 3, |t| t != 8).is_none());
        for cut in 0..body.len() {
            assert!(
                group_items(&body[..cut], 3, |_| true).is_none(),
                "cut {cut}"
            );
        }
        let mut longer = body.clone();
        longer.push(0);
        assert!(group_items(&longer, 3, |_| true).is_none());
        // A group header decodes as a group record of `count` items.
        let mut buf = vec![0u8; DGRAM_HDR + REC_HDR + body.len()];
        write_header(&mut buf, 0, KIND_REQUEST, 1, 1);
        write_group_header(&mut buf, DGRAM_HDR, 4, 3, body.len() as u16);
        buf[DGRAM_HDR + REC_HDR..].copy_from_slice(&body);
        buf[3] = 1;
        let (_, mut recs) = decode(&buf).unwrap();
        let r = recs.next().unwrap();
        assert_eq!((r.seq, r.tag, r.group, r.payload), (4, 3, true, &body[..]));
        buf[DGRAM_HDR + 9] = 4;
        assert_eq!(decode(&buf).err(), Some(WireError::BadFlags));
    }

    #[test]
    fn request_groups_have_parts() {
        // Three batches: [a b] [c] [d e]; every batch's first request is flagged.
        let mut body = Vec::new();
        for (i, part) in [true, false, true, true, false].into_iter().enumerate() {
            extend_item(&mut body, i as u8, &[i as u8; 3], part);
        }
        // Three parts: too many for a server that takes two.
        assert!(request_items(&body, 5, 2).is_none());
        let mut items = request_items(&body, 5, 3).expect("valid");
        let mut seen = Vec::new();
        while items.len_left() > 0 {
            let part = items.starts_part();
            let (tag, payload) = items.next().unwrap();
            assert_eq!(payload, &[tag; 3]);
            seen.push(part);
        }
        assert_eq!(seen, [true, false, true, true, false]);
        // A response group never carries the flag.
        assert!(group_items(&body, 5, |_| true).is_none());
        // Up to MAX_PARTS parts (an unflagged first item starts one too).
        for (first, flagged, ok) in [(false, MAX_PARTS - 1, true), (true, MAX_PARTS, false)] {
            let mut body = Vec::new();
            extend_item(&mut body, 0, b"x", first);
            for _ in 0..flagged {
                extend_item(&mut body, 0, b"y", true);
            }
            assert_eq!(request_items(&body, flagged + 1, MAX_PARTS).is_some(), ok);
            // One part more than allowed.
            extend_item(&mut body, 0, b"z", true);
            assert!(request_items(&body, flagged + 2, MAX_PARTS).is_none());
        }
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
