//! Encoding of the transaction protocol's RPC payloads. Every request and response is
//! decoded with bounds checks: a malformed message is rejected (the handler answers
//! `BAD_REQUEST`, the coordinator treats a bad response as a failed RPC), never a panic.

/// RPC request types of the transaction layer (one per protocol operation).
pub mod rtype {
    pub const READ: u8 = 32;
    pub const LOCK: u8 = 33;
    pub const VALIDATE: u8 = 34;
    pub const UNLOCK: u8 = 35;
    pub const LOG: u8 = 36;
    pub const COMMIT_BACKUP: u8 = 37;
    pub const COMMIT_PRIMARY: u8 = 38;
    pub const TRUNCATE: u8 = 39;
}

/// Status byte of READ / LOCK / VALIDATE responses.
pub mod status {
    /// Found (and, for LOCK, locked).
    pub const OK: u8 = 0;
    /// The key is absent (never inserted, or deleted); the version is its tombstone's.
    pub const ABSENT: u8 = 1;
    /// Locked by another transaction.
    pub const LOCKED: u8 = 2;
    /// Insert of a key that exists.
    pub const EXISTS: u8 = 3;
    /// The request was malformed or named an unknown table.
    pub const BAD_REQUEST: u8 = 4;
    /// The table is full.
    pub const FULL: u8 = 5;
    /// LOCK for an insert: the key is absent and its lock is now held.
    pub const ABSENT_LOCKED: u8 = 6;
}

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
    pub fn from_code(c: u8) -> Option<WriteKind> {
        match c {
            1 => Some(WriteKind::Insert),
            2 => Some(WriteKind::Update),
            3 => Some(WriteKind::Delete),
            _ => None,
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
    pub fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }
    pub fn u8(&mut self) -> Option<u8> {
        Some(self.bytes(1)?[0])
    }
    pub fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.bytes(2)?.try_into().ok()?))
    }
    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.bytes(4)?.try_into().ok()?))
    }
    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.bytes(8)?.try_into().ok()?))
    }
    pub fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos..];
        self.pos = self.buf.len();
        s
    }
    pub fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }
    pub fn rest_len(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }
}

pub fn put_u16(b: &mut Vec<u8>, v: u16) {
    b.extend_from_slice(&v.to_le_bytes());
}
pub fn put_u32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_le_bytes());
}
pub fn put_u64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_le_bytes());
}

/// A key request: READ, VALIDATE (table, key) and LOCK (table, key, kind).
pub fn key_request(b: &mut Vec<u8>, table: u32, key: u64, kind: Option<WriteKind>) {
    put_u32(b, table);
    put_u64(b, key);
    if let Some(k) = kind {
        b.push(k.code());
    }
}

/// The item lock a primary hands out with a LOCK response and expects back with
/// COMMIT_PRIMARY / UNLOCK: where the item is and the store version it was locked at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockToken {
    pub offset: u64,
    pub store_version: u64,
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

pub fn put_write(b: &mut Vec<u8>, w: &WriteRec<'_>) {
    put_u32(b, w.table);
    put_u64(b, w.key);
    b.push(w.kind.code());
    put_u64(b, w.prev_version);
    put_u64(b, w.token.offset);
    put_u64(b, w.token.store_version);
    put_u32(b, w.value.len() as u32);
    b.extend_from_slice(w.value);
}

pub fn get_write<'a>(r: &mut Reader<'a>) -> Option<WriteRec<'a>> {
    let table = r.u32()?;
    let key = r.u64()?;
    let kind = WriteKind::from_code(r.u8()?)?;
    let prev_version = r.u64()?;
    let token = LockToken {
        offset: r.u64()?,
        store_version: r.u64()?,
    };
    let len = r.u32()? as usize;
    let value = r.bytes(len)?;
    Some(WriteRec {
        table,
        key,
        kind,
        prev_version,
        token,
        value,
    })
}

/// Header of LOG / COMMIT_* requests: the transaction id and the number of writes.
pub fn put_commit_header(b: &mut Vec<u8>, txn: u64, writes: u16) {
    put_u64(b, txn);
    put_u16(b, writes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_records_round_trip_and_truncations_fail() {
        let w = WriteRec {
            table: 7,
            key: 99,
            kind: WriteKind::Delete,
            prev_version: 5,
            token: LockToken {
                offset: 640,
                store_version: 3,
            },
            value: b"abc",
        };
        let mut b = Vec::new();
        put_write(&mut b, &w);
        assert_eq!(get_write(&mut Reader::new(&b)), Some(w));
        for cut in 0..b.len() {
            assert_eq!(get_write(&mut Reader::new(&b[..cut])), None, "cut at {cut}");
        }
        b[12] = 9; // bad kind
        assert_eq!(get_write(&mut Reader::new(&b)), None);
    }
}
