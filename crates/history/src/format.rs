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
    pub fn validate(&self) -> Result<(), String> {
        if self.id == 0 || self.id > MAX_ID {
            return Err(format!("id {} out of range (must be in 1..2^63)", self.id));
        }
        for r in &self.reads {
            if r.version > MAX_ID {
                return Err(format!(
                    "read of table {} key {}: version {} >= 2^63",
                    r.table, r.key, r.version
                ));
            }
            check_hex(r.value.as_deref())
                .map_err(|e| format!("read of table {} key {}: {e}", r.table, r.key))?;
        }
        for w in &self.writes {
            let at = format!("write of table {} key {}", w.table, w.key);
            if w.version != self.id {
                return Err(format!(
                    "{at}: version {} is not the transaction id {}",
                    w.version, self.id
                ));
            }
            if w.prev_version > MAX_ID {
                return Err(format!("{at}: prev_version {} >= 2^63", w.prev_version));
            }
            check_hex(w.value.as_deref()).map_err(|e| format!("{at}: {e}"))?;
            match (w.kind, &w.value) {
                (WriteKind::Delete, Some(_)) => {
                    return Err(format!("{at}: a delete must have value null"))
                }
                (WriteKind::Update | WriteKind::Insert, None) => {
                    return Err(format!("{at}: an {} must have a value", w.kind.as_str()))
                }
                _ => {}
            }
        }
        Ok(())
    }
}

fn check_hex(v: Option<&str>) -> Result<(), String> {
    let Some(s) = v else { return Ok(()) };
    if s.len() & 1 == 1 {
        return Err(format!(
            "value {:?} has an odd number of hex digits",
            truncate(s)
        ));
    }
    if !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("value {:?} is not hex", truncate(s)));
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
pub fn parse_line(line: &str) -> Result<TxnRecord, String> {
    let rec: TxnRecord = serde_json::from_str(line).map_err(|e| e.to_string())?;
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
        out.push(parse_line(line).map_err(|message| ParseError {
            line: i + 1,
            message,
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
        out.push(parse_line(buf.trim_end()).map_err(|message| ParseError { line, message })?);
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
