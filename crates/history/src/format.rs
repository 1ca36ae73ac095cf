//! The history record format: one JSON object per line, one line per
//! transaction (committed or aborted). See `docs/history-format.md`.
//!
//! Parsing treats the file as untrusted input: every malformed line becomes a
//! [`ParseError`] naming the line, never a panic.

use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Ids and versions live in 63 bits (the store's item header keeps a lock bit).
pub const MAX_ID: u64 = (1 << 63) - 1;

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Committed,
    Aborted,
    /// Indeterminate: the coordinator died while another node could still commit it
    /// (its log record may survive). The checkers take it as committed if any other
    /// transaction saw one of its writes, as aborted otherwise ([`resolve_unknown`]).
    Unknown,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Committed => "committed",
            Outcome::Aborted => "aborted",
            Outcome::Unknown => "unknown",
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum WriteKind {
    Update,
    Insert,
    Delete,
}

impl WriteKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WriteKind::Update => "update",
            WriteKind::Insert => "insert",
            WriteKind::Delete => "delete",
        }
    }
}

/// A read: the version and value the transaction saw. `version: 0` with
/// `value: None` means the key was absent.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ReadRecord {
    pub table: u32,
    pub key: u64,
    pub version: u64,
    /// Lowercase hex bytes; `None` for an absent or deleted key.
    pub value: Option<String>,
}

/// A write. For a committed transaction `version` is the transaction id and
/// `prev_version` the version it overwrote (0 if the key was absent).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct WriteRecord {
    pub table: u32,
    pub key: u64,
    pub kind: WriteKind,
    pub prev_version: u64,
    pub version: u64,
    /// Lowercase hex bytes; `None` exactly for deletes.
    pub value: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct TxnRecord {
    pub id: u64,
    pub node: u32,
    pub thread: u32,
    pub outcome: Outcome,
    /// Why an aborted transaction aborted ("locked", "version_changed", ...).
    #[serde(default)]
    pub reason: Option<String>,
    pub start_us: u64,
    pub end_us: u64,
    /// How far ahead of the run's reference time the coordinator's clock was (µs), when
    /// known (simulated runs): `start_us - clock_offset_us` is on one time line for
    /// every node, so an external checker can order events across nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_offset_us: Option<u64>,
    #[serde(default)]
    pub reads: Vec<ReadRecord>,
    #[serde(default)]
    pub writes: Vec<WriteRecord>,
}

/// Drops the records of unknown outcome of transactions that also have a
/// definite record. A file recorder writes a pending record (outcome
/// `unknown`) when a transaction's log phase starts and its final record when
/// it finishes, so only a coordinator killed in between leaves the pending
/// record alone. Returns how many were dropped.
pub fn drop_superseded(recs: &mut Vec<TxnRecord>) -> u64 {
    use std::collections::HashSet;
    if recs.iter().all(|r| r.outcome != Outcome::Unknown) {
        return 0;
    }
    let decided: HashSet<u64> = recs
        .iter()
        .filter(|r| r.outcome != Outcome::Unknown)
        .map(|r| r.id)
        .collect();
    let before = recs.len();
    recs.retain(|r| r.outcome != Outcome::Unknown || !decided.contains(&r.id));
    (before - recs.len()) as u64
}

/// Decides every transaction of unknown outcome: committed if another transaction
/// read one of its versions or overwrote one, or if `installed` says one of its writes
/// is in the store (the caller knows the final state), else aborted (nobody can have
/// seen it). Returns how many were taken as (committed, aborted).
pub fn resolve_unknown(
    recs: &mut [TxnRecord],
    installed: impl Fn(&WriteRecord) -> bool,
) -> (u64, u64) {
    use std::collections::BTreeSet;
    if recs.iter().all(|r| r.outcome != Outcome::Unknown) {
        return (0, 0);
    }
    let mut seen: BTreeSet<u64> = BTreeSet::new();
    for r in recs.iter() {
        seen.extend(r.reads.iter().map(|x| x.version).filter(|&v| v != r.id));
        seen.extend(
            r.writes
                .iter()
                .map(|w| w.prev_version)
                .filter(|&v| v != r.id),
        );
    }
    let (mut c, mut a) = (0, 0);
    for r in recs.iter_mut().filter(|r| r.outcome == Outcome::Unknown) {
        let committed =
            !r.writes.is_empty() && (seen.contains(&r.id) || r.writes.iter().any(&installed));
        if committed {
            r.outcome = Outcome::Committed;
            c += 1;
        } else {
            r.outcome = Outcome::Aborted;
            a += 1;
        }
        r.reason = Some(format!(
            "unknown outcome, taken as {}",
            if committed { "committed" } else { "aborted" }
        ));
    }
    (c, a)
}

impl TxnRecord {
    pub fn is_committed(&self) -> bool {
        self.outcome == Outcome::Committed
    }

    /// Checks the per-record invariants the format promises; the checker
    /// relies on them (e.g. `version == id` is what names a write's author).
    pub fn validate(&self) -> Result<(), RecordError> {
        if self.id == 0 || self.id > MAX_ID {
            return Err(RecordError::IdOutOfRange { id: self.id });
        }
        for r in &self.reads {
            let (table, key) = (r.table, r.key);
            if r.version > MAX_ID {
                return Err(RecordError::ReadVersionTooLarge {
                    table,
                    key,
                    version: r.version,
                });
            }
            check_hex(r.value.as_deref()).map_err(|why| RecordError::ReadValue {
                table,
                key,
                why,
            })?;
        }
        for w in &self.writes {
            let (table, key) = (w.table, w.key);
            if w.version != self.id {
                return Err(RecordError::WriteVersion {
                    table,
                    key,
                    version: w.version,
                    id: self.id,
                });
            }
            if w.prev_version > MAX_ID {
                return Err(RecordError::PrevVersionTooLarge {
                    table,
                    key,
                    prev_version: w.prev_version,
                });
            }
            check_hex(w.value.as_deref()).map_err(|why| RecordError::WriteValue {
                table,
                key,
                why,
            })?;
            match (w.kind, &w.value) {
                (WriteKind::Delete, Some(_)) => {
                    return Err(RecordError::DeleteWithValue { table, key })
                }
                (WriteKind::Update | WriteKind::Insert, None) => {
                    return Err(RecordError::MissingValue {
                        table,
                        key,
                        kind: w.kind,
                    })
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// A record that breaks one of the format's per-record invariants
/// ([`TxnRecord::validate`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The transaction id is 0 or at least 2^63.
    #[error("id {id} out of range (must be in 1..2^63)")]
    IdOutOfRange {
        /// The record's id.
        id: u64,
    },
    /// A read's version is at least 2^63.
    #[error("read of table {table} key {key}: version {version} >= 2^63")]
    ReadVersionTooLarge {
        /// Table of the read.
        table: u32,
        /// Key of the read.
        key: u64,
        /// The version read.
        version: u64,
    },
    /// A read's value is not the format's hex encoding.
    #[error("read of table {table} key {key}: {why}")]
    ReadValue {
        /// Table of the read.
        table: u32,
        /// Key of the read.
        key: u64,
        /// What is wrong with the value.
        #[source]
        why: HexError,
    },
    /// A write's version is not the transaction's id (the id names a write's author).
    #[error("write of table {table} key {key}: version {version} is not the transaction id {id}")]
    WriteVersion {
        /// Table of the write.
        table: u32,
        /// Key of the write.
        key: u64,
        /// The write's version.
        version: u64,
        /// The record's id.
        id: u64,
    },
    /// A write's `prev_version` is at least 2^63.
    #[error("write of table {table} key {key}: prev_version {prev_version} >= 2^63")]
    PrevVersionTooLarge {
        /// Table of the write.
        table: u32,
        /// Key of the write.
        key: u64,
        /// The version it claims to overwrite.
        prev_version: u64,
    },
    /// A write's value is not the format's hex encoding.
    #[error("write of table {table} key {key}: {why}")]
    WriteValue {
        /// Table of the write.
        table: u32,
        /// Key of the write.
        key: u64,
        /// What is wrong with the value.
        #[source]
        why: HexError,
    },
    /// A delete carries a value (it must be null).
    #[error("write of table {table} key {key}: a delete must have value null")]
    DeleteWithValue {
        /// Table of the write.
        table: u32,
        /// Key of the write.
        key: u64,
    },
    /// An update or insert has no value.
    #[error("write of table {table} key {key}: an {} must have a value", .kind.as_str())]
    MissingValue {
        /// Table of the write.
        table: u32,
        /// Key of the write.
        key: u64,
        /// The write's kind (update or insert).
        kind: WriteKind,
    },
}

/// A record value that is not the format's hex encoding. The value is kept truncated
/// to its first 40 characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HexError {
    /// The value has an odd number of characters.
    #[error("value {0:?} has an odd number of hex digits")]
    OddLength(String),
    /// The value has a character that is not a hex digit.
    #[error("value {0:?} is not hex")]
    NotHex(String),
}

/// Why one history line is not a record ([`parse_line`]).
#[derive(Debug, thiserror::Error)]
pub enum LineError {
    /// The line is not JSON of a record's shape.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// The record breaks an invariant of the format.
    #[error(transparent)]
    Invalid(#[from] RecordError),
}

fn check_hex(v: Option<&str>) -> Result<(), HexError> {
    let Some(s) = v else { return Ok(()) };
    if s.len() & 1 == 1 {
        return Err(HexError::OddLength(truncate(s).to_owned()));
    }
    if !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(HexError::NotHex(truncate(s).to_owned()));
    }
    Ok(())
}

fn truncate(s: &str) -> &str {
    match s.char_indices().nth(40) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// Lowercase hex of `bytes`, the format's value encoding.
pub fn encode_hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 15) as usize] as char);
    }
    s
}

/// Inverse of [`encode_hex`] (accepts either case); `None` if not hex.
pub fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if s.len() & 1 == 1 {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    s.as_bytes()
        .chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

pub(crate) const HEX: &[u8; 16] = b"0123456789abcdef";

/// A malformed history line. `line` is 1-based; 0 means the file itself
/// could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}", self.message)
        } else {
            write!(f, "line {}: {}", self.line, self.message)
        }
    }
}

impl std::error::Error for ParseError {}

/// Parses one line (without its newline).
pub fn parse_line(line: &str) -> Result<TxnRecord, LineError> {
    let rec: TxnRecord = serde_json::from_str(line)?;
    rec.validate()?;
    Ok(rec)
}

/// Parses a whole JSONL history; blank lines are skipped.
pub fn parse_str(text: &str) -> Result<Vec<TxnRecord>, ParseError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        out.push(parse_line(line).map_err(|e| ParseError {
            line: i + 1,
            message: e.to_string(),
        })?);
    }
    Ok(out)
}

/// Streams a JSONL history from a reader, reusing one line buffer.
pub fn parse_reader(mut r: impl BufRead) -> Result<Vec<TxnRecord>, ParseError> {
    let mut out = Vec::new();
    let mut buf = String::new();
    let mut line = 0;
    loop {
        buf.clear();
        line += 1;
        match r.read_line(&mut buf) {
            Ok(0) => return Ok(out),
            Ok(_) => {}
            Err(e) => {
                return Err(ParseError {
                    line,
                    message: format!("read error: {e}"),
                })
            }
        }
        if buf.trim().is_empty() {
            continue;
        }
        out.push(parse_line(buf.trim_end()).map_err(|e| ParseError {
            line,
            message: e.to_string(),
        })?);
    }
}

pub fn parse_file(path: impl AsRef<Path>) -> Result<Vec<TxnRecord>, ParseError> {
    let path = path.as_ref();
    let f = File::open(path).map_err(|e| ParseError {
        line: 0,
        message: format!("{}: {e}", path.display()),
    })?;
    parse_reader(BufReader::with_capacity(1 << 20, f))
}

/// One record as a JSON line (no trailing newline).
pub fn to_line(rec: &TxnRecord) -> String {
    serde_json::to_string(rec).expect("a TxnRecord always serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_roundtrip() {
        let b = [0u8, 1, 0xab, 0xff];
        assert_eq!(encode_hex(&b), "0001abff");
        assert_eq!(decode_hex("0001ABff").unwrap(), b);
        assert_eq!(decode_hex("0g"), None);
        assert_eq!(decode_hex("abc"), None);
    }
}
