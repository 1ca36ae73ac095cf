//! The protocol's RPC messages: one type per request and response, its encoding and its
//! decoding side by side. Every byte from the network is untrusted: decoding checks
//! bounds, codes and trailing bytes and returns a [`DecodeError`], never panics (a
//! handler answers a malformed request with [`Status::BadRequest`], the coordinator
//! treats a malformed response as a failed RPC).
//!
//! ```text
//! READ            req [table u32][key u64]                 resp [status][version u64][value]
//! READ_LOC        req [table][key]                         resp [status][version][offset u64][store_version u64][value]
//! LOCK            req [table][key][kind u8][slot u16]      resp [status][version][offset u64][store_version u64][value]
//! VALIDATE        req [table][key]                         resp [status][version]
//! UNLOCK          req [table][key][slot][offset][store_version]      resp [status]
//! LOG             req [txn u64][n u16][n writes][m u16][m txn ids]   resp [status]
//! COMMIT_BACKUP   req [txn][n][n writes]                   resp [status]
//! COMMIT_PRIMARY  req [txn][slot][n][n writes]             resp [status]
//! TRUNCATE        req [m u16][m txn ids]                   resp [status]
//! RING_TRUNCATE   req [head u64]                           resp [status][head u64]
//! RECOVER         req [n u16][n × (txn u64, write)]        resp [status][m u16][m busy u16]
//! COPY            req [n u16][n × copied item]             resp [status]
//! COPY_DONE       req [n u16][n × partition u32]           resp [status]
//! DESCRIPTORS     req and resp in crate::catalog_exchange (versioned, paged)
//! copied item     [table][key][version u64][len u32][stored value (version prefix + value)]
//! write           [table][key][kind][prev_version u64][offset][store_version][len u32][value]
//! ```
//!
//! A handler that cannot decode a request answers the single byte `BadRequest`; every
//! response decoder accepts that form. Integers are little-endian.

use ambidex_rpc::Reply;
use std::ops::DerefMut;

/// RPC request types of the transaction layer (one per protocol operation).
pub(crate) mod rtype {
    pub const READ: u8 = 32;
    pub const LOCK: u8 = 33;
    pub const VALIDATE: u8 = 34;
    pub const UNLOCK: u8 = 35;
    pub const LOG: u8 = 36;
    pub const COMMIT_BACKUP: u8 = 37;
    pub const COMMIT_PRIMARY: u8 = 38;
    pub const TRUNCATE: u8 = 39;
    /// READ that also returns where the item is and its header version (a hybrid
    /// execute's miss, or any policy that locks, validates or commits one-sided).
    pub const READ_LOC: u8 = 40;
    pub const RING_TRUNCATE: u8 = 41;
    /// Recovery: writes of surviving log records, for a replica of the new configuration.
    pub const RECOVER: u8 = 42;
    /// Re-replication: items of a primary for a replica being brought up to date.
    pub const COPY: u8 = 43;
    /// Re-replication: every item of these partitions was copied.
    pub const COPY_DONE: u8 = 44;
    /// Catalog exchange: the answering node's table and log region descriptors
    /// (encoded in [`crate::catalog_exchange`]).
    pub const DESCRIPTORS: u8 = 45;
}

/// Status byte of every response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    /// Found (and, for LOCK, locked); for the other requests: done.
    Ok = 0,
    /// The key is absent (never inserted, or deleted); the version is its tombstone's.
    Absent = 1,
    /// Locked by another transaction.
    Locked = 2,
    /// Insert of a key that exists.
    Exists = 3,
    /// The request was malformed, named an unknown table, or a lock not held.
    BadRequest = 4,
    /// The table is full.
    Full = 5,
    /// LOCK for an insert: the key is absent and its lock is now held.
    AbsentLocked = 6,
}

impl Status {
    pub fn from_u8(b: u8) -> Result<Status, DecodeError> {
        Ok(match b {
            0 => Status::Ok,
            1 => Status::Absent,
            2 => Status::Locked,
            3 => Status::Exists,
            4 => Status::BadRequest,
            5 => Status::Full,
            6 => Status::AbsentLocked,
            _ => return Err(DecodeError::BadStatus(b)),
        })
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

/// Why bytes did not decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The message ends early.
    Truncated,
    /// Bytes follow the message.
    TrailingBytes,
    BadWriteKind(u8),
    BadStatus(u8),
    /// A well-formed write the receiver's check refused (unknown table, wrong value
    /// size, lock not held).
    Rejected,
    /// A list of writes names one (table, key) twice.
    RepeatedKey,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Truncated => write!(f, "message truncated"),
            DecodeError::TrailingBytes => write!(f, "bytes after the message"),
            DecodeError::BadWriteKind(k) => write!(f, "unknown write kind {k}"),
            DecodeError::BadStatus(s) => write!(f, "unknown status {s}"),
            DecodeError::Rejected => write!(f, "a write was refused"),
            DecodeError::RepeatedKey => write!(f, "a key is written twice"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Write modes of a write-set key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WriteKind {
    Insert,
    Update,
    Delete,
}

impl WriteKind {
    pub fn code(self) -> u8 {
        match self {
            WriteKind::Insert => 1,
            WriteKind::Update => 2,
            WriteKind::Delete => 3,
        }
    }
    pub fn from_code(c: u8) -> Result<WriteKind, DecodeError> {
        match c {
            1 => Ok(WriteKind::Insert),
            2 => Ok(WriteKind::Update),
            3 => Ok(WriteKind::Delete),
            _ => Err(DecodeError::BadWriteKind(c)),
        }
    }
}

/// A bounds-checked reader over untrusted bytes.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).ok_or(DecodeError::Truncated)?;
        let s = self.buf.get(self.pos..end).ok_or(DecodeError::Truncated)?;
        self.pos = end;
        Ok(s)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }
    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    pub fn rest(&mut self) -> &'a [u8] {
        let s = self.buf.get(self.pos..).unwrap_or(&[]);
        self.pos = self.buf.len();
        s
    }
    /// Bytes consumed so far.
    pub fn pos(&self) -> usize {
        self.pos
    }
    /// Succeeds if every byte was consumed.
    pub fn end(&self) -> Result<(), DecodeError> {
        if self.pos >= self.buf.len() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes)
        }
    }
}

/// Where a response is written: an RPC handler's [`Reply`], or a `Vec` (tests, the
/// coordinator's local path).
pub trait RespBuf: DerefMut<Target = [u8]> + for<'v> Extend<&'v u8> {
    fn put(&mut self, s: &[u8]);
    fn put_u8(&mut self, b: u8);
}

impl RespBuf for Vec<u8> {
    #[inline]
    fn put(&mut self, s: &[u8]) {
        self.extend_from_slice(s);
    }
    #[inline]
    fn put_u8(&mut self, b: u8) {
        self.push(b);
    }
}

impl RespBuf for Reply<'_> {
    #[inline]
    fn put(&mut self, s: &[u8]) {
        self.extend_from_slice(s);
    }
    #[inline]
    fn put_u8(&mut self, b: u8) {
        self.push(b);
    }
}

pub(crate) fn put_u16(b: &mut Vec<u8>, v: u16) {
    b.extend_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_le_bytes());
}

/// The item lock a primary hands out with a LOCK response and expects back with
/// COMMIT_PRIMARY / UNLOCK: where the item is and the store version it was locked at.
/// The owner is not in the token: the primary takes it from the request's sender and
/// slot, so a coordinator can only name its own locks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockToken {
    pub offset: u64,
    pub store_version: u64,
}

/// The answer of a read, lock or validation at the key's home (the response head).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fetched {
    pub status: Status,
    /// Transaction version (without the tombstone bit); 0 if never written.
    pub version: u64,
    pub token: LockToken,
}

impl Fetched {
    pub fn just(status: Status) -> Fetched {
        Fetched {
            status,
            version: 0,
            token: LockToken::default(),
        }
    }
}

/// A key request's common part.
fn put_key(b: &mut Vec<u8>, table: u32, key: u64) {
    put_u32(b, table);
    put_u64(b, key);
}

fn get_key(r: &mut Reader<'_>) -> Result<(u32, u64), DecodeError> {
    Ok((r.u32()?, r.u64()?))
}

/// READ request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadReq {
    pub table: u32,
    pub key: u64,
}

impl ReadReq {
    pub fn encode(&self, b: &mut Vec<u8>) {
        put_key(b, self.table, self.key);
    }
    pub fn decode(b: &[u8]) -> Result<ReadReq, DecodeError> {
        let mut r = Reader::new(b);
        let (table, key) = get_key(&mut r)?;
        r.end()?;
        Ok(ReadReq { table, key })
    }
}

/// VALIDATE request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValidateReq {
    pub table: u32,
    pub key: u64,
}

impl ValidateReq {
    pub fn encode(&self, b: &mut Vec<u8>) {
        put_key(b, self.table, self.key);
    }
    pub fn decode(b: &[u8]) -> Result<ValidateReq, DecodeError> {
        let r = ReadReq::decode(b)?;
        Ok(ValidateReq {
            table: r.table,
            key: r.key,
        })
    }
}

/// LOCK request: lock `key` for a write of `kind` by the sender's transaction `slot`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockReq {
    pub table: u32,
    pub key: u64,
    pub kind: WriteKind,
    pub slot: u16,
}

impl LockReq {
    pub fn encode(&self, b: &mut Vec<u8>) {
        put_key(b, self.table, self.key);
        b.push(self.kind.code());
        put_u16(b, self.slot);
    }
    pub fn decode(b: &[u8]) -> Result<LockReq, DecodeError> {
        let mut r = Reader::new(b);
        let (table, key) = get_key(&mut r)?;
        let kind = WriteKind::from_code(r.u8()?)?;
        let slot = r.u16()?;
        r.end()?;
        Ok(LockReq {
            table,
            key,
            kind,
            slot,
        })
    }
}

/// UNLOCK request: release a lock of the sender's transaction `slot` unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnlockReq {
    pub table: u32,
    pub key: u64,
    pub slot: u16,
    pub token: LockToken,
}

impl UnlockReq {
    pub fn encode(&self, b: &mut Vec<u8>) {
        put_key(b, self.table, self.key);
        put_u16(b, self.slot);
        put_u64(b, self.token.offset);
        put_u64(b, self.token.store_version);
    }
    pub fn decode(b: &[u8]) -> Result<UnlockReq, DecodeError> {
        let mut r = Reader::new(b);
        let (table, key) = get_key(&mut r)?;
        let slot = r.u16()?;
        let token = LockToken {
            offset: r.u64()?,
            store_version: r.u64()?,
        };
        r.end()?;
        Ok(UnlockReq {
            table,
            key,
            slot,
            token,
        })
    }
}

/// One write of a commit record: the unit of LOG, COMMIT_BACKUP and COMMIT_PRIMARY.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteRec<'a> {
    pub table: u32,
    pub key: u64,
    pub kind: WriteKind,
    /// The transaction version the write replaces (seen under the lock).
    pub prev_version: u64,
    /// Primary only: the lock to release.
    pub token: LockToken,
    /// The new value (empty for a delete).
    pub value: &'a [u8],
}

impl<'a> WriteRec<'a> {
    pub fn encode(&self, b: &mut Vec<u8>) {
        put_key(b, self.table, self.key);
        b.push(self.kind.code());
        put_u64(b, self.prev_version);
        put_u64(b, self.token.offset);
        put_u64(b, self.token.store_version);
        put_u32(b, self.value.len() as u32);
        b.extend_from_slice(self.value);
    }
    pub fn decode(r: &mut Reader<'a>) -> Result<WriteRec<'a>, DecodeError> {
        let (table, key) = get_key(r)?;
        let kind = WriteKind::from_code(r.u8()?)?;
        let prev_version = r.u64()?;
        let token = LockToken {
            offset: r.u64()?,
            store_version: r.u64()?,
        };
        let len = r.u32()? as usize;
        let value = r.bytes(len)?;
        Ok(WriteRec {
            table,
            key,
            kind,
            prev_version,
            token,
            value,
        })
    }
}

// The keys of a long write list, sorted to find a repeat (`RepeatCheck`).
thread_local! {
    static SCRATCH: std::cell::RefCell<Vec<(u32, u64)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Finds a (table, key) named twice in a list of writes, as the writes are decoded: a
/// scan of a fixed array for the few writes of a usual transaction (no allocation), a
/// sort of a per-thread scratch list beyond (a request may carry thousands of writes,
/// and a quadratic scan would let it burn CPU).
struct RepeatCheck {
    n: usize,
    small: [(u32, u64); RepeatCheck::SCAN],
}

impl RepeatCheck {
    const SCAN: usize = 16;

    fn new() -> RepeatCheck {
        RepeatCheck {
            n: 0,
            small: [(0, 0); Self::SCAN],
        }
    }

    /// Adds a key; true if it was seen before (only known at once for small lists).
    #[inline]
    fn add(&mut self, k: (u32, u64)) -> bool {
        let i = self.n;
        self.n += 1;
        if i < Self::SCAN {
            let repeat = self.small[..i].contains(&k);
            self.small[i] = k;
            return repeat;
        }
        SCRATCH.with(|s| {
            let mut v = s.borrow_mut();
            if i == Self::SCAN {
                v.clear();
                v.extend_from_slice(&self.small);
            }
            v.push(k);
        });
        false
    }

    /// After the last key: whether a list longer than the scan repeats a key.
    fn repeats_beyond_scan(&self) -> bool {
        self.n > Self::SCAN
            && SCRATCH.with(|s| {
                let mut v = s.borrow_mut();
                v.sort_unstable();
                v.windows(2).any(|w| w[0] == w[1])
            })
    }
}

/// A decoded list of writes: `n` well-formed records in `bytes` (checked once when
/// decoded, so iterating cannot fail).
#[derive(Clone, Copy, Debug)]
pub struct Writes<'a> {
    n: u16,
    bytes: &'a [u8],
}

impl<'a> Writes<'a> {
    /// Reads `[n u16][n writes]`.
    fn decode(r: &mut Reader<'a>) -> Result<Writes<'a>, DecodeError> {
        Self::decode_checked(r, |_| true)
    }

    /// Reads `[n u16][n writes]`, each write also passing `accept` (one pass over the
    /// records for both checks).
    fn decode_checked(
        r: &mut Reader<'a>,
        mut accept: impl FnMut(&WriteRec<'a>) -> bool,
    ) -> Result<Writes<'a>, DecodeError> {
        let n = r.u16()?;
        let start = r.pos();
        let all = r.rest();
        let mut check = Reader::new(all);
        // A coordinator names each key once (`Txn` merges repeats). A list naming one
        // twice would pass each write's own check and then fail half-way through
        // (the first install releases the lock the second names), so it is refused
        // before anything is applied.
        let mut repeats = RepeatCheck::new();
        for _ in 0..n {
            let w = WriteRec::decode(&mut check)?;
            if !accept(&w) {
                return Err(DecodeError::Rejected);
            }
            if repeats.add((w.table, w.key)) {
                return Err(DecodeError::RepeatedKey);
            }
        }
        if repeats.repeats_beyond_scan() {
            return Err(DecodeError::RepeatedKey);
        }
        // Give back what follows the writes.
        let used = check.pos();
        *r = Reader {
            buf: r.buf,
            pos: start + used,
        };
        Ok(Writes {
            n,
            bytes: &all[..used],
        })
    }

    pub fn len(&self) -> usize {
        self.n as usize
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The encoded records (what a log replica stores).
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    pub fn iter(&self) -> impl Iterator<Item = WriteRec<'a>> + 'a {
        let mut r = Reader::new(self.bytes);
        let n = self.n;
        (0..n).map_while(move |_| WriteRec::decode(&mut r).ok())
    }
}

/// Encodes `[n u16][n writes]`: `begin` reserves the count, [`WritesEncoder::push`]
/// appends a record, [`WritesEncoder::finish`] fills the count in.
pub struct WritesEncoder {
    count_at: usize,
    n: u16,
}

impl WritesEncoder {
    pub fn begin(b: &mut Vec<u8>) -> WritesEncoder {
        let count_at = b.len();
        put_u16(b, 0);
        WritesEncoder { count_at, n: 0 }
    }

    pub fn push(&mut self, b: &mut Vec<u8>, w: &WriteRec<'_>) {
        w.encode(b);
        self.n += 1;
    }

    /// Appends already-encoded records (a commit record body of `n` writes).
    pub fn push_encoded(&mut self, b: &mut Vec<u8>, n: u16, records: &[u8]) {
        b.extend_from_slice(records);
        self.n += n;
    }

    pub fn finish(self, b: &mut [u8]) -> u16 {
        b[self.count_at..self.count_at + 2].copy_from_slice(&self.n.to_le_bytes());
        self.n
    }
}

/// `[m u16][m txn ids]`: transactions the coordinator knows are installed everywhere.
#[derive(Clone, Copy, Debug)]
pub struct Truncations<'a> {
    ids: &'a [u8],
}

impl<'a> Truncations<'a> {
    /// Encodes up to `u16::MAX` ids drained from `ids`.
    pub fn encode_drain(b: &mut Vec<u8>, ids: &mut Vec<u64>) {
        let n = ids.len().min(u16::MAX as usize);
        put_u16(b, n as u16);
        for id in ids.drain(..n) {
            put_u64(b, id);
        }
    }

    fn decode(r: &mut Reader<'a>) -> Result<Truncations<'a>, DecodeError> {
        let n = r.u16()? as usize;
        Ok(Truncations {
            ids: r.bytes(n * 8)?,
        })
    }

    pub fn iter(&self) -> impl Iterator<Item = u64> + 'a {
        self.ids
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
    }
}

/// LOG request: the commit record of transaction `txn`, and truncations piggybacked.
#[derive(Clone, Copy, Debug)]
pub struct LogReq<'a> {
    pub txn: u64,
    pub writes: Writes<'a>,
    pub truncations: Truncations<'a>,
}

impl<'a> LogReq<'a> {
    /// Encodes a LOG of the `n` records in `records` and drains `truncate` into it.
    pub fn encode(b: &mut Vec<u8>, txn: u64, n: u16, records: &[u8], truncate: &mut Vec<u64>) {
        put_u64(b, txn);
        let mut w = WritesEncoder::begin(b);
        w.push_encoded(b, n, records);
        w.finish(b);
        Truncations::encode_drain(b, truncate);
    }
    pub fn decode(b: &'a [u8]) -> Result<LogReq<'a>, DecodeError> {
        let mut r = Reader::new(b);
        let txn = r.u64()?;
        let writes = Writes::decode(&mut r)?;
        let truncations = Truncations::decode(&mut r)?;
        r.end()?;
        Ok(LogReq {
            txn,
            writes,
            truncations,
        })
    }
}

/// TRUNCATE request.
#[derive(Clone, Copy, Debug)]
pub struct TruncateReq<'a> {
    pub ids: Truncations<'a>,
}

impl<'a> TruncateReq<'a> {
    pub fn encode(b: &mut Vec<u8>, ids: &mut Vec<u64>) {
        Truncations::encode_drain(b, ids);
    }
    pub fn decode(b: &'a [u8]) -> Result<TruncateReq<'a>, DecodeError> {
        let mut r = Reader::new(b);
        let ids = Truncations::decode(&mut r)?;
        r.end()?;
        Ok(TruncateReq { ids })
    }
}

// ---- The one-sided log's truncation (`Log::Write`, `crate::log_ring`) ----

/// RING_TRUNCATE request: the sender's ring at this log replica may be released up to
/// ring position `head` (the replica checks every record on the way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingTruncateReq {
    pub head: u64,
}

impl RingTruncateReq {
    pub fn encode(&self, b: &mut Vec<u8>) {
        put_u64(b, self.head);
    }
    /// The encoding without a buffer (it has a fixed size).
    pub fn to_bytes(&self) -> [u8; 8] {
        self.head.to_le_bytes()
    }
    pub fn decode(b: &[u8]) -> Result<RingTruncateReq, DecodeError> {
        let mut r = Reader::new(b);
        let head = r.u64()?;
        r.end()?;
        Ok(RingTruncateReq { head })
    }
}

/// RING_TRUNCATE response: the ring's head after the truncation (short of the one asked
/// for if a record on the way was torn or missing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingTruncateResp {
    pub status: Status,
    pub head: u64,
}

impl RingTruncateResp {
    pub fn encode<R: RespBuf>(&self, out: &mut R) {
        out.put_u8(self.status as u8);
        out.put(&self.head.to_le_bytes());
    }
    pub fn decode(b: &[u8]) -> Result<RingTruncateResp, DecodeError> {
        let mut r = Reader::new(b);
        let status = head(&mut r)?;
        if status == Status::BadRequest && b.len() == 1 {
            return Ok(RingTruncateResp { status, head: 0 });
        }
        let head = r.u64()?;
        r.end()?;
        Ok(RingTruncateResp { status, head })
    }
    /// The head of an `Ok` response, if `b` is one.
    pub fn ok_head(b: &[u8]) -> Option<u64> {
        match RingTruncateResp::decode(b) {
            Ok(RingTruncateResp {
                status: Status::Ok,
                head,
            }) => Some(head),
            _ => None,
        }
    }
}

/// RECOVER request: writes of committed transactions recovered from surviving log
/// records, each with its transaction, for a replica of the new configuration.
#[derive(Clone, Copy, Debug)]
pub struct RecoverReq<'a> {
    n: u16,
    bytes: &'a [u8],
}

impl<'a> RecoverReq<'a> {
    /// Appends one (transaction, write) entry to a request being built in `b` (start
    /// it with [`RecoverReq::begin`]): `write` is a [`WriteRec`] as
    /// [`WriteRec::encode`] wrote it. Returns the entries so far.
    pub fn push(b: &mut Vec<u8>, txn: u64, write: &[u8]) -> u16 {
        put_u64(b, txn);
        b.extend_from_slice(write);
        let n = u16::from_le_bytes([b[0], b[1]]) + 1;
        b[..2].copy_from_slice(&n.to_le_bytes());
        n
    }

    /// Starts a request in `b` (cleared).
    pub fn begin(b: &mut Vec<u8>) {
        b.clear();
        b.extend_from_slice(&0u16.to_le_bytes());
    }

    /// Checks every entry (a malformed request is refused whole).
    pub fn decode(b: &'a [u8]) -> Result<RecoverReq<'a>, DecodeError> {
        let mut r = Reader::new(b);
        let n = r.u16()?;
        let bytes = r.rest();
        let mut check = Reader::new(bytes);
        for _ in 0..n {
            check.u64()?;
            WriteRec::decode(&mut check)?;
        }
        check.end()?;
        Ok(RecoverReq { n, bytes })
    }

    pub fn len(&self) -> u16 {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The (transaction, write) entries (checked by `decode`).
    pub fn entries(&self) -> impl Iterator<Item = (u64, WriteRec<'a>)> + 'a {
        let mut r = Reader::new(self.bytes);
        (0..self.n).map_while(move |_| Some((r.u64().ok()?, WriteRec::decode(&mut r).ok()?)))
    }
}

/// RECOVER response: the entries (by index) that met another transaction's lock and
/// must be sent again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoverResp {
    pub status: Status,
    pub busy: Vec<u16>,
}

impl RecoverResp {
    pub fn encode<R: RespBuf>(status: Status, busy: &[u16], out: &mut R) {
        out.put_u8(status as u8);
        out.put(&(busy.len() as u16).to_le_bytes());
        for i in busy {
            out.put(&i.to_le_bytes());
        }
    }
    pub fn decode(b: &[u8]) -> Result<RecoverResp, DecodeError> {
        let mut r = Reader::new(b);
        let status = head(&mut r)?;
        if status == Status::BadRequest && b.len() == 1 {
            return Ok(RecoverResp {
                status,
                busy: Vec::new(),
            });
        }
        let n = r.u16()?;
        let busy = (0..n).map(|_| r.u16()).collect::<Result<Vec<_>, _>>()?;
        r.end()?;
        Ok(RecoverResp { status, busy })
    }
}

/// One item a primary copies to a replica being brought up to date: its store
/// version and its stored bytes (the transaction version prefix and the value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopiedItem<'a> {
    pub table: u32,
    pub key: u64,
    pub version: u64,
    pub stored: &'a [u8],
}

impl<'a> CopiedItem<'a> {
    fn decode(r: &mut Reader<'a>) -> Result<CopiedItem<'a>, DecodeError> {
        let (table, key) = get_key(r)?;
        let version = r.u64()?;
        let len = r.u32()? as usize;
        let stored = r.bytes(len)?;
        Ok(CopiedItem {
            table,
            key,
            version,
            stored,
        })
    }
}

/// COPY request: items for a replica being re-replicated.
#[derive(Clone, Copy, Debug)]
pub struct CopyReq<'a> {
    n: u16,
    bytes: &'a [u8],
}

impl<'a> CopyReq<'a> {
    /// Starts a request in `b` (cleared).
    pub fn begin(b: &mut Vec<u8>) {
        b.clear();
        b.extend_from_slice(&0u16.to_le_bytes());
    }

    /// Appends an item to a request begun in `b`; returns the items so far.
    pub fn push(b: &mut Vec<u8>, item: &CopiedItem<'_>) -> u16 {
        put_key(b, item.table, item.key);
        put_u64(b, item.version);
        put_u32(b, item.stored.len() as u32);
        b.extend_from_slice(item.stored);
        let n = u16::from_le_bytes([b[0], b[1]]) + 1;
        b[..2].copy_from_slice(&n.to_le_bytes());
        n
    }

    /// Checks every item (a malformed request is refused whole).
    pub fn decode(b: &'a [u8]) -> Result<CopyReq<'a>, DecodeError> {
        let mut r = Reader::new(b);
        let n = r.u16()?;
        let bytes = r.rest();
        let mut check = Reader::new(bytes);
        for _ in 0..n {
            CopiedItem::decode(&mut check)?;
        }
        check.end()?;
        Ok(CopyReq { n, bytes })
    }

    /// The items (checked by `decode`).
    pub fn items(&self) -> impl Iterator<Item = CopiedItem<'a>> + 'a {
        let mut r = Reader::new(self.bytes);
        (0..self.n).map_while(move |_| CopiedItem::decode(&mut r).ok())
    }
}

/// COPY_DONE request: the partitions whose items were all copied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyDoneReq {
    pub partitions: Vec<u32>,
}

impl CopyDoneReq {
    pub fn encode(partitions: &[u32], b: &mut Vec<u8>) {
        b.clear();
        b.extend_from_slice(&(partitions.len() as u16).to_le_bytes());
        for p in partitions {
            put_u32(b, *p);
        }
    }
    pub fn decode(b: &[u8]) -> Result<CopyDoneReq, DecodeError> {
        let mut r = Reader::new(b);
        let n = r.u16()?;
        let partitions = (0..n).map(|_| r.u32()).collect::<Result<Vec<_>, _>>()?;
        r.end()?;
        Ok(CopyDoneReq { partitions })
    }
}

/// COMMIT_BACKUP request: writes a backup applies.
#[derive(Clone, Copy, Debug)]
pub struct CommitBackupReq<'a> {
    pub txn: u64,
    pub writes: Writes<'a>,
}

impl<'a> CommitBackupReq<'a> {
    /// Starts the request; push the writes into the returned encoder, then finish it.
    pub fn begin(b: &mut Vec<u8>, txn: u64) -> WritesEncoder {
        put_u64(b, txn);
        WritesEncoder::begin(b)
    }
    pub fn decode(b: &'a [u8]) -> Result<CommitBackupReq<'a>, DecodeError> {
        Self::decode_checked(b, |_| true)
    }
    /// Decodes, refusing the request unless every write passes `accept`.
    pub fn decode_checked(
        b: &'a [u8],
        accept: impl FnMut(&WriteRec<'a>) -> bool,
    ) -> Result<CommitBackupReq<'a>, DecodeError> {
        let mut r = Reader::new(b);
        let txn = r.u64()?;
        let writes = Writes::decode_checked(&mut r, accept)?;
        r.end()?;
        Ok(CommitBackupReq { txn, writes })
    }
}

/// COMMIT_PRIMARY request: writes a primary installs, releasing the locks of the
/// sender's transaction `slot`.
#[derive(Clone, Copy, Debug)]
pub struct CommitPrimaryReq<'a> {
    pub txn: u64,
    pub slot: u16,
    pub writes: Writes<'a>,
}

impl<'a> CommitPrimaryReq<'a> {
    /// Starts the request; push the writes into the returned encoder, then finish it.
    pub fn begin(b: &mut Vec<u8>, txn: u64, slot: u16) -> WritesEncoder {
        put_u64(b, txn);
        put_u16(b, slot);
        WritesEncoder::begin(b)
    }
    pub fn decode(b: &'a [u8]) -> Result<CommitPrimaryReq<'a>, DecodeError> {
        Self::decode_checked(b, |_, _| true)
    }
    /// Decodes, refusing the request unless every write passes `accept` (given the
    /// request's slot, since a primary checks the sender's locks).
    pub fn decode_checked(
        b: &'a [u8],
        mut accept: impl FnMut(u16, &WriteRec<'a>) -> bool,
    ) -> Result<CommitPrimaryReq<'a>, DecodeError> {
        let mut r = Reader::new(b);
        let txn = r.u64()?;
        let slot = r.u16()?;
        let writes = Writes::decode_checked(&mut r, |w| accept(slot, w))?;
        r.end()?;
        Ok(CommitPrimaryReq { txn, slot, writes })
    }
}

/// Decodes a status byte; the one-byte form of every response is a bare status.
fn head(r: &mut Reader<'_>) -> Result<Status, DecodeError> {
    Status::from_u8(r.u8()?)
}

/// Writes a READ or LOCK response (`TOKEN`: LOCK's, with the lock token): the head is
/// reserved, `act` appends the value and returns the head, which is filled in. (A const
/// parameter keeps the head's length a constant, so reserving it is inlined stores.)
#[inline]
fn encode_fetch<const TOKEN: bool, R: RespBuf>(out: &mut R, act: impl FnOnce(&mut R) -> Fetched) {
    if TOKEN {
        out.put(&[0; 25]);
    } else {
        out.put(&[0; 9]);
    }
    let f = act(out);
    out[0] = f.status as u8;
    out[1..9].copy_from_slice(&f.version.to_le_bytes());
    if TOKEN {
        out[9..17].copy_from_slice(&f.token.offset.to_le_bytes());
        out[17..25].copy_from_slice(&f.token.store_version.to_le_bytes());
    }
}

/// Decodes a READ or LOCK response (also its bare `BadRequest` form).
#[inline]
fn decode_fetch<const TOKEN: bool>(b: &[u8]) -> Result<(Fetched, &[u8]), DecodeError> {
    let mut r = Reader::new(b);
    let status = head(&mut r)?;
    if status == Status::BadRequest && b.len() == 1 {
        return Ok((Fetched::just(status), &[]));
    }
    let version = r.u64()?;
    let token = if TOKEN {
        LockToken {
            offset: r.u64()?,
            store_version: r.u64()?,
        }
    } else {
        LockToken::default()
    };
    let f = Fetched {
        status,
        version,
        token,
    };
    Ok((f, r.rest()))
}

/// READ response: status, transaction version, then the value (found keys only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadResp<'a> {
    pub status: Status,
    pub version: u64,
    pub value: &'a [u8],
}

impl<'a> ReadResp<'a> {
    /// Writes the response of `act`, which appends the value and returns the head.
    #[inline]
    pub fn encode_with<R: RespBuf>(out: &mut R, act: impl FnOnce(&mut R) -> Fetched) {
        encode_fetch::<false, R>(out, act);
    }

    pub fn decode(b: &'a [u8]) -> Result<ReadResp<'a>, DecodeError> {
        let (f, value) = decode_fetch::<false>(b)?;
        Ok(ReadResp {
            status: f.status,
            version: f.version,
            value,
        })
    }
}

/// LOCK response: status, transaction version, lock token, then the value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockResp<'a> {
    pub fetched: Fetched,
    pub value: &'a [u8],
}

impl<'a> LockResp<'a> {
    /// Writes the response of `act`, which appends the value and returns the head.
    #[inline]
    pub fn encode_with<R: RespBuf>(out: &mut R, act: impl FnOnce(&mut R) -> Fetched) {
        encode_fetch::<true, R>(out, act);
    }

    pub fn decode(b: &'a [u8]) -> Result<LockResp<'a>, DecodeError> {
        let (fetched, value) = decode_fetch::<true>(b)?;
        Ok(LockResp { fetched, value })
    }
}

/// VALIDATE response: status and transaction version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValidateResp {
    pub status: Status,
    pub version: u64,
}

impl ValidateResp {
    pub fn encode<R: RespBuf>(&self, out: &mut R) {
        out.put_u8(self.status as u8);
        out.put(&self.version.to_le_bytes());
    }
    pub fn decode(b: &[u8]) -> Result<ValidateResp, DecodeError> {
        let mut r = Reader::new(b);
        let status = head(&mut r)?;
        if status == Status::BadRequest && b.len() == 1 {
            return Ok(ValidateResp { status, version: 0 });
        }
        let version = r.u64()?;
        r.end()?;
        Ok(ValidateResp { status, version })
    }
}

/// The response of UNLOCK, LOG, COMMIT_* and TRUNCATE: a status alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ack {
    pub status: Status,
}

impl Ack {
    pub fn encode<R: RespBuf>(&self, out: &mut R) {
        out.put_u8(self.status as u8);
    }
    pub fn decode(b: &[u8]) -> Result<Ack, DecodeError> {
        let mut r = Reader::new(b);
        let status = head(&mut r)?;
        r.end()?;
        Ok(Ack { status })
    }
    /// True if `b` decodes to an `Ok` acknowledgement.
    pub fn is_ok(b: &[u8]) -> bool {
        matches!(Ack::decode(b), Ok(Ack { status: Status::Ok }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec() -> WriteRec<'static> {
        WriteRec {
            table: 7,
            key: 99,
            kind: WriteKind::Delete,
            prev_version: 5,
            token: LockToken {
                offset: 640,
                store_version: 3,
            },
            value: b"abc",
        }
    }

    #[test]
    fn write_records_round_trip_and_truncations_fail() {
        let w = rec();
        let mut b = Vec::new();
        w.encode(&mut b);
        assert_eq!(WriteRec::decode(&mut Reader::new(&b)), Ok(w));
        for cut in 0..b.len() {
            assert_eq!(
                WriteRec::decode(&mut Reader::new(&b[..cut])),
                Err(DecodeError::Truncated),
                "cut at {cut}"
            );
        }
        b[12] = 9; // bad kind
        assert_eq!(
            WriteRec::decode(&mut Reader::new(&b)),
            Err(DecodeError::BadWriteKind(9))
        );
    }

    #[test]
    fn requests_round_trip_and_reject_every_cut_and_extra_byte() {
        let mut b = Vec::new();
        let enc = CommitPrimaryReq::begin(&mut b, 42, 3);
        let mut enc = enc;
        let other = WriteRec { key: 100, ..rec() };
        enc.push(&mut b, &rec());
        enc.push(&mut b, &other);
        assert_eq!(enc.finish(&mut b), 2);
        let d = CommitPrimaryReq::decode(&b).unwrap();
        assert_eq!((d.txn, d.slot, d.writes.len()), (42, 3, 2));
        assert_eq!(d.writes.iter().collect::<Vec<_>>(), vec![rec(), other]);
        // Long lists: distinct keys pass; a repeat past the scanned prefix, of a key
        // inside it or past it, is found by the sort.
        let list = |keys: &[u64]| {
            let mut b = Vec::new();
            let mut enc = CommitPrimaryReq::begin(&mut b, 42, 3);
            for &key in keys {
                enc.push(&mut b, &WriteRec { key, ..rec() });
            }
            enc.finish(&mut b);
            CommitPrimaryReq::decode(&b).map(|d| d.writes.len())
        };
        let distinct: Vec<u64> = (0..30).collect();
        assert_eq!(list(&distinct), Ok(30));
        for (at, of) in [(25, 3), (29, 20)] {
            let mut keys = distinct.clone();
            keys[at] = keys[of];
            assert_eq!(
                list(&keys),
                Err(DecodeError::RepeatedKey),
                "{at} repeats {of}"
            );
        }
        // The same key twice is refused.
        let mut twice = Vec::new();
        let mut enc = CommitPrimaryReq::begin(&mut twice, 42, 3);
        enc.push(&mut twice, &rec());
        enc.push(&mut twice, &rec());
        enc.finish(&mut twice);
        assert_eq!(
            CommitPrimaryReq::decode(&twice).err(),
            Some(DecodeError::RepeatedKey)
        );
        let records = d.writes.bytes().to_vec();
        for cut in 0..b.len() {
            assert!(CommitPrimaryReq::decode(&b[..cut]).is_err(), "cut at {cut}");
        }
        b.push(0);
        assert_eq!(
            CommitPrimaryReq::decode(&b).err(),
            Some(DecodeError::TrailingBytes)
        );

        let mut rb = Vec::new();
        let mut tr = vec![1, 2, 3];
        LogReq::encode(&mut rb, 9, 2, &records, &mut tr);
        assert!(tr.is_empty());
        let l = LogReq::decode(&rb).unwrap();
        assert_eq!(l.writes.len(), 2);
        assert_eq!(l.truncations.iter().collect::<Vec<_>>(), vec![1, 2, 3]);
        for cut in 0..rb.len() {
            assert!(LogReq::decode(&rb[..cut]).is_err(), "cut at {cut}");
        }

        let lr = LockReq {
            table: 1,
            key: 2,
            kind: WriteKind::Insert,
            slot: 4,
        };
        let mut lb = Vec::new();
        lr.encode(&mut lb);
        assert_eq!(LockReq::decode(&lb), Ok(lr));
        lb.push(1);
        assert_eq!(LockReq::decode(&lb), Err(DecodeError::TrailingBytes));
    }

    #[test]
    fn responses_round_trip_and_accept_the_bare_bad_request() {
        let f = Fetched {
            status: Status::Ok,
            version: 77,
            token: LockToken {
                offset: 64,
                store_version: 9,
            },
        };
        let mut b = Vec::new();
        LockResp::encode_with(&mut b, |o: &mut Vec<u8>| {
            o.extend_from_slice(b"val");
            f
        });
        let d = LockResp::decode(&b).unwrap();
        assert_eq!((d.fetched, d.value), (f, &b"val"[..]));
        let bare = [Status::BadRequest as u8];
        assert_eq!(
            LockResp::decode(&bare).unwrap().fetched.status,
            Status::BadRequest
        );
        assert_eq!(ReadResp::decode(&bare).unwrap().status, Status::BadRequest);
        assert_eq!(
            ValidateResp::decode(&bare).unwrap().status,
            Status::BadRequest
        );
        assert_eq!(ReadResp::decode(&[9]), Err(DecodeError::BadStatus(9)));
        assert_eq!(ReadResp::decode(&[0, 1]), Err(DecodeError::Truncated));
        assert!(!Ack::is_ok(&[0, 0]));
        assert!(Ack::is_ok(&[0]));
    }

    #[test]
    fn copies_round_trip_and_reject_every_cut_and_extra_byte() {
        let items = [
            CopiedItem {
                table: 3,
                key: 77,
                version: 9,
                stored: &[1, 2, 3, 4],
            },
            CopiedItem {
                table: 4,
                key: 1 << 40,
                version: 11,
                stored: &[],
            },
        ];
        let mut b = Vec::new();
        CopyReq::begin(&mut b);
        for it in &items {
            CopyReq::push(&mut b, it);
        }
        let d = CopyReq::decode(&b).unwrap();
        assert_eq!(d.items().collect::<Vec<_>>(), items);
        for cut in 0..b.len() {
            assert!(CopyReq::decode(&b[..cut]).is_err(), "cut at {cut}");
        }
        b.push(0);
        assert_eq!(CopyReq::decode(&b).err(), Some(DecodeError::TrailingBytes));
        let mut b = Vec::new();
        CopyDoneReq::encode(&[5, 9], &mut b);
        assert_eq!(
            CopyDoneReq::decode(&b),
            Ok(CopyDoneReq {
                partitions: vec![5, 9]
            })
        );
        for cut in 0..b.len() {
            assert!(CopyDoneReq::decode(&b[..cut]).is_err(), "cut at {cut}");
        }
        b.push(0);
        assert_eq!(CopyDoneReq::decode(&b), Err(DecodeError::TrailingBytes));
    }

    #[test]
    fn ring_truncations_round_trip_and_reject_every_cut_and_extra_byte() {
        let mut b = Vec::new();
        RingTruncateReq { head: 4096 }.encode(&mut b);
        assert_eq!(
            RingTruncateReq::decode(&b),
            Ok(RingTruncateReq { head: 4096 })
        );
        for cut in 0..b.len() {
            assert_eq!(
                RingTruncateReq::decode(&b[..cut]),
                Err(DecodeError::Truncated)
            );
        }
        b.push(0);
        assert_eq!(RingTruncateReq::decode(&b), Err(DecodeError::TrailingBytes));
        let mut r = Vec::new();
        RingTruncateResp {
            status: Status::Ok,
            head: 640,
        }
        .encode(&mut r);
        assert_eq!(RingTruncateResp::ok_head(&r), Some(640));
        for cut in 1..r.len() {
            assert_eq!(
                RingTruncateResp::decode(&r[..cut]),
                Err(DecodeError::Truncated)
            );
        }
        r.push(1);
        assert_eq!(RingTruncateResp::ok_head(&r), None);
        let bare = [Status::BadRequest as u8];
        assert_eq!(
            RingTruncateResp::decode(&bare).unwrap().status,
            Status::BadRequest
        );
        assert_eq!(RingTruncateResp::ok_head(&bare), None);
        assert_eq!(
            RingTruncateResp::decode(&[9]),
            Err(DecodeError::BadStatus(9))
        );
    }
}
