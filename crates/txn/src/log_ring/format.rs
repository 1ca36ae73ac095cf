//! The bytes of a log ring: commit records, padding markers and void markers, their
//! encoding and their checked decoding.
//!
//! ```text
//! record  header  [len u32][RECORD u32][seq u64][txn u64][node u16][thread u16][slot u16][n u16]
//!         body    n writes as `WriteRec` encodes them (table, key, kind, prev_version,
//!                 lock token, value), then zeroes up to the trailer
//!         trailer [len u32][RECORD u32][seq u64]                       (the last 16 bytes)
//! void    a record's framing with magic VOID (header fields after seq and body ignored)
//! pad     [len u32][PAD u32][seq u64]: the rest of the ring (len bytes) is skipped
//! ```
//!
//! Every slot is 16-byte aligned and a multiple of 16 bytes long, so the space left at
//! the end of a ring is either none or room for a pad. `seq` counts the ring's slots
//! from 1 (pads and voids take one too): a reader expects exactly the next number, so
//! the bytes of an earlier lap (a smaller number) or of no write at all (zeroes) end
//! the log instead of passing for a record.
//!
//! Why header and trailer: a WRITE lands in ascending address order, so once the
//! trailer carries the header's length, magic and number, every byte before it landed
//! (FaRM §2: "length at head and tail"). A record is accepted only if header and trailer
//! agree and its body decodes exactly (n writes, then zero padding shorter than the
//! trailer's alignment, owner = the ring's coordinator); a record framed correctly whose
//! body does not decode is *malformed*: counted and skipped (its framing still says
//! where the next slot starts), never applied or returned. Anything else (a trailer that
//! disagrees, an impossible length, an unknown magic, a number from the future) is
//! *torn* or *garbage* and its bytes are counted: a truncation stops there; recovery
//! looks past it for the next intact slot with a higher number, since a coordinator's
//! concurrent appends may land in any order (`region::ScanMode`).

use crate::messages::{
    put_u16, put_u32, put_u64, DecodeError, LockToken, Reader, WriteKind, WriteRec,
};
use ambidex_store::LockOwner;
use ambidex_transport::{NodeId, ThreadId};

/// Slot alignment (and the padding marker's size).
pub const ALIGN: u64 = ambidex_store::catalog::LOG_RING_ALIGN;
pub const HEADER: usize = 32;
pub const TRAILER: usize = 16;
/// The smallest slot: a record of no write (or a void).
pub const MIN_RECORD: u64 = (HEADER + TRAILER) as u64;

pub const RECORD: u32 = 0x5245_434c; // "LCER"
pub const VOID: u32 = 0x4449_4f56; // "VOID"
pub const PAD: u32 = 0x4441_5050; // "PPAD"

/// Bytes of a record whose writes encode to `body` bytes.
pub fn record_len(body: usize) -> u64 {
    ((HEADER + body + TRAILER) as u64).next_multiple_of(ALIGN)
}

/// Appends a record of `n` writes encoded in `body` to `out` with sequence number
/// `seq` (set another with [`set_seq`]).
pub fn encode_record(out: &mut Vec<u8>, seq: u64, txn: u64, owner: LockOwner, n: u16, body: &[u8]) {
    let start = out.len();
    let len = record_len(body.len());
    put_u32(out, len as u32);
    put_u32(out, RECORD);
    put_u64(out, seq);
    put_u64(out, txn);
    put_u16(out, owner.node);
    put_u16(out, owner.thread);
    put_u16(out, owner.slot);
    put_u16(out, n);
    out.extend_from_slice(body);
    out.resize(start + len as usize - TRAILER, 0);
    put_u32(out, len as u32);
    put_u32(out, RECORD);
    put_u64(out, seq);
}

/// Sets the sequence number of the record (or void) `rec` in header and trailer.
pub fn set_seq(rec: &mut [u8], seq: u64) {
    let n = rec.len();
    if n >= HEADER + TRAILER {
        rec[8..16].copy_from_slice(&seq.to_le_bytes());
        rec[n - 8..].copy_from_slice(&seq.to_le_bytes());
    }
}

/// A padding marker covering `len` bytes (to the end of the ring).
pub fn pad(len: u64, seq: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&(len as u32).to_le_bytes());
    b[4..8].copy_from_slice(&PAD.to_le_bytes());
    b[8..16].copy_from_slice(&seq.to_le_bytes());
    b
}

/// The header and trailer of a void marker over a slot of `len` bytes: written at the
/// slot's start and at `len - TRAILER` (the bytes between are skipped).
pub fn void(len: u64, seq: u64) -> ([u8; HEADER], [u8; TRAILER]) {
    let mut h = [0u8; HEADER];
    h[0..4].copy_from_slice(&(len as u32).to_le_bytes());
    h[4..8].copy_from_slice(&VOID.to_le_bytes());
    h[8..16].copy_from_slice(&seq.to_le_bytes());
    let mut t = [0u8; TRAILER];
    t.copy_from_slice(&h[..TRAILER]);
    (h, t)
}

/// A slot's header, as read (untrusted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotHead {
    pub len: u32,
    pub magic: u32,
    pub seq: u64,
}

impl SlotHead {
    /// The first 16 bytes of a slot.
    pub fn parse(b: &[u8; 16]) -> SlotHead {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut s = [0u8; 8];
        s.copy_from_slice(&b[8..16]);
        SlotHead {
            len: u32_at(0),
            magic: u32_at(4),
            seq: u64::from_le_bytes(s),
        }
    }
}

/// What a slot whose header carries the expected number is, before its body is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotKind {
    /// A record or void of `len` bytes: read them and check with [`decode_record`].
    Framed { len: u64, void: bool },
    /// A padding marker: the rest of the ring (`len` bytes) is skipped.
    Pad { len: u64 },
}

/// Why the log ends at a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum End {
    /// Never written (zeroes).
    Empty,
    /// A slot of an earlier lap (a smaller number): the normal end of a ring in use.
    Stale,
    /// The expected number, but the length is impossible or the trailer disagrees: a
    /// record not (fully) written.
    Torn,
    /// Not a slot: unknown magic or a number from the future. Normal past the end of a
    /// ring that wrapped (the middle of an earlier lap's record), else corruption.
    Garbage,
    /// The requested end was reached (a truncation), or a whole ring was read.
    Limit,
}

/// Classifies a slot at `room` bytes from the end of its ring, expecting number `seq`.
pub fn classify(h: SlotHead, room: u64, seq: u64) -> Result<SlotKind, End> {
    if h == (SlotHead {
        len: 0,
        magic: 0,
        seq: 0,
    }) {
        return Err(End::Empty);
    }
    if !matches!(h.magic, RECORD | VOID | PAD) {
        return Err(End::Garbage);
    }
    if h.seq < seq {
        return Err(End::Stale);
    }
    if h.seq > seq {
        return Err(End::Garbage);
    }
    let len = h.len as u64;
    if h.magic == PAD {
        // A pad always runs to the end of the ring.
        return if len == room && len >= ALIGN && len.is_multiple_of(ALIGN) {
            Ok(SlotKind::Pad { len })
        } else {
            Err(End::Torn)
        };
    }
    if len < MIN_RECORD || !len.is_multiple_of(ALIGN) || len > room {
        return Err(End::Torn);
    }
    Ok(SlotKind::Framed {
        len,
        void: h.magic == VOID,
    })
}

/// One write of a logged transaction (owned: what recovery replays).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedWrite {
    pub table: u32,
    pub key: u64,
    pub kind: WriteKind,
    pub prev_version: u64,
    pub token: LockToken,
    pub value: Vec<u8>,
}

/// A commit record read back from a ring: what recovery needs to decide and replay the
/// transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedTxn {
    /// The record's number in its ring.
    pub seq: u64,
    pub txn: u64,
    /// The coordinator's lock owner (its node, thread and transaction slot).
    pub owner: LockOwner,
    pub writes: Vec<LoggedWrite>,
}

/// Why a framed record's contents were refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordError {
    /// Header and trailer disagree (the record is torn).
    TrailerMismatch,
    /// The owner is not the ring's coordinator, or does not fit a lock word.
    WrongOwner,
    /// A write did not decode, or bytes other than zero padding follow the writes.
    Body(DecodeError),
}

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordError::TrailerMismatch => write!(f, "header and trailer disagree"),
            RecordError::WrongOwner => write!(f, "owner is not the ring's coordinator"),
            RecordError::Body(e) => write!(f, "body: {e}"),
        }
    }
}

impl std::error::Error for RecordError {}

/// Whether the trailer of the framed slot `b` (all its bytes) repeats its header.
pub fn trailer_matches(b: &[u8]) -> bool {
    let n = b.len();
    n >= HEADER + TRAILER && b[n - TRAILER..] == b[..TRAILER]
}

/// Decodes the record `b` (a framed slot's bytes, header and trailer included) of the
/// ring of coordinator (`node`, `thread`). `want` selects whether the writes are
/// copied out (recovery) or only checked (truncation).
pub fn decode_record(
    b: &[u8],
    node: NodeId,
    thread: ThreadId,
    want: bool,
) -> Result<Option<LoggedTxn>, RecordError> {
    if !trailer_matches(b) {
        return Err(RecordError::TrailerMismatch);
    }
    let mut r = Reader::new(&b[..b.len() - TRAILER]);
    let field = |e| RecordError::Body(e);
    let _head = r.bytes(8).map_err(field)?;
    let seq = r.u64().map_err(field)?;
    let txn = r.u64().map_err(field)?;
    let (on, ot, os) = (
        r.u16().map_err(field)?,
        r.u16().map_err(field)?,
        r.u16().map_err(field)?,
    );
    let n = r.u16().map_err(field)?;
    let owner = LockOwner::new(on, ot, os).map_err(|_| RecordError::WrongOwner)?;
    if on != node || ot != thread {
        return Err(RecordError::WrongOwner);
    }
    let mut writes = Vec::new();
    for _ in 0..n {
        let w = WriteRec::decode(&mut r).map_err(field)?;
        if want {
            writes.push(LoggedWrite {
                table: w.table,
                key: w.key,
                kind: w.kind,
                prev_version: w.prev_version,
                token: w.token,
                value: w.value.to_vec(),
            });
        }
    }
    let rest = r.rest();
    if rest.len() >= ALIGN as usize || rest.iter().any(|&x| x != 0) {
        return Err(RecordError::Body(DecodeError::TrailingBytes));
    }
    Ok(want.then_some(LoggedTxn {
        seq,
        txn,
        owner,
        writes,
    }))
}

/// The transaction and the writes of a record [`decode_record`] accepted (`b` is the
/// same bytes): what a replica applies when its coordinator truncates the record.
pub fn accepted_writes(b: &[u8]) -> (u64, impl Iterator<Item = WriteRec<'_>>) {
    let field = |at: usize, len: usize| b.get(at..at + len).unwrap_or(&[]);
    let txn = u64::from_le_bytes(field(16, 8).try_into().unwrap_or([0; 8]));
    let n = u16::from_le_bytes(field(30, 2).try_into().unwrap_or([0; 2]));
    let body = b
        .get(HEADER..b.len().saturating_sub(TRAILER))
        .unwrap_or(&[]);
    let mut r = Reader::new(body);
    // Accepted records decode: an error (not expected) just ends the writes.
    let writes = (0..n).map_while(move |_| WriteRec::decode(&mut r).ok());
    (txn, writes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> LockOwner {
        LockOwner::new(2, 1, 7).unwrap()
    }

    fn body() -> (Vec<u8>, Vec<LoggedWrite>) {
        let ws = [
            LoggedWrite {
                table: 3,
                key: 11,
                kind: WriteKind::Update,
                prev_version: 5,
                token: LockToken {
                    offset: 640,
                    store_version: 4,
                },
                value: b"value-one".to_vec(),
            },
            LoggedWrite {
                table: 4,
                key: 12,
                kind: WriteKind::Delete,
                prev_version: 9,
                token: LockToken::default(),
                value: Vec::new(),
            },
        ];
        let mut b = Vec::new();
        for w in &ws {
            WriteRec {
                table: w.table,
                key: w.key,
                kind: w.kind,
                prev_version: w.prev_version,
                token: w.token,
                value: &w.value,
            }
            .encode(&mut b);
        }
        (b, ws.to_vec())
    }

    #[test]
    fn records_round_trip() {
        let (b, ws) = body();
        let mut rec = Vec::new();
        encode_record(&mut rec, 1, 99, owner(), 2, &b);
        assert_eq!(rec.len() as u64, record_len(b.len()));
        assert!(rec.len().is_multiple_of(ALIGN as usize));
        set_seq(&mut rec, 42);
        let h = SlotHead::parse(rec[..16].try_into().unwrap());
        assert_eq!(
            classify(h, 1 << 20, 42),
            Ok(SlotKind::Framed {
                len: rec.len() as u64,
                void: false
            })
        );
        let t = decode_record(&rec, 2, 1, true).unwrap().unwrap();
        assert_eq!((t.seq, t.txn, t.owner, t.writes), (42, 99, owner(), ws));
        assert_eq!(decode_record(&rec, 2, 1, false), Ok(None));
    }

    #[test]
    fn torn_stale_and_malformed_slots_are_refused() {
        let (b, _) = body();
        let mut rec = Vec::new();
        encode_record(&mut rec, 5, 99, owner(), 2, &b);
        let head = |r: &[u8]| SlotHead::parse(r[..16].try_into().unwrap());
        // Stale lap, future number, unknown magic, never written.
        assert_eq!(classify(head(&rec), 4096, 6), Err(End::Stale));
        assert_eq!(classify(head(&rec), 4096, 4), Err(End::Garbage));
        let mut g = rec.clone();
        g[4] ^= 1;
        assert_eq!(classify(head(&g), 4096, 5), Err(End::Garbage));
        assert_eq!(classify(head(&[0; 16]), 4096, 5), Err(End::Empty));
        // Impossible lengths.
        for len in [0u32, 17, 40, 8192] {
            let mut t = rec.clone();
            t[..4].copy_from_slice(&len.to_le_bytes());
            assert_eq!(classify(head(&t), 4096, 5), Err(End::Torn), "len {len}");
        }
        assert_eq!(
            classify(head(&rec), rec.len() as u64 - 16, 5),
            Err(End::Torn)
        );
        // Missing or mismatched trailer.
        for at in [rec.len() - 16, rec.len() - 8, rec.len() - 1] {
            let mut t = rec.clone();
            t[at] ^= 0x40;
            assert_eq!(
                decode_record(&t, 2, 1, true),
                Err(RecordError::TrailerMismatch)
            );
        }
        // A framed record whose body does not decode, or names another coordinator.
        let mut t = rec.clone();
        t[HEADER + 12] = 9; // the first write's kind
        assert!(matches!(
            decode_record(&t, 2, 1, true),
            Err(RecordError::Body(DecodeError::BadWriteKind(9)))
        ));
        let mut t = rec.clone();
        t[30..32].copy_from_slice(&3u16.to_le_bytes()); // three writes claimed
        assert!(matches!(
            decode_record(&t, 2, 1, true),
            Err(RecordError::Body(_))
        ));
        let mut t = rec.clone();
        t[30..32].copy_from_slice(&1u16.to_le_bytes()); // the second write left over
        assert!(matches!(
            decode_record(&t, 2, 1, true),
            Err(RecordError::Body(DecodeError::TrailingBytes))
        ));
        assert_eq!(
            decode_record(&rec, 2, 0, true),
            Err(RecordError::WrongOwner)
        );
        // Pads run to the end of the ring, exactly.
        let p = pad(64, 5);
        assert_eq!(classify(head(&p), 64, 5), Ok(SlotKind::Pad { len: 64 }));
        assert_eq!(classify(head(&p), 80, 5), Err(End::Torn));
        // Voids are framed like records.
        let (vh, vt) = void(96, 5);
        let mut v = vec![0xee; 96];
        v[..HEADER].copy_from_slice(&vh);
        v[96 - TRAILER..].copy_from_slice(&vt);
        assert_eq!(
            classify(head(&v), 4096, 5),
            Ok(SlotKind::Framed {
                len: 96,
                void: true
            })
        );
        assert!(trailer_matches(&v));
    }
}
