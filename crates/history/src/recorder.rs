//! The history recorder: off by default, cheap when on.
//!
//! Each worker thread owns a [`ThreadRecorder`] that serializes records by hand
//! into its own byte buffer (no allocation per record once the buffers are
//! warm) and hands the buffer to the shared sink in large chunks, so the sink
//! mutex is taken about once per [`CHUNK`] bytes, not once per transaction.
//! Lines from different threads interleave in whole chunks; every line is
//! complete, and the checker does not depend on line order.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::format::{Outcome, TxnRecord, WriteKind, HEX};

/// A thread's buffer is handed to the sink once it holds this many bytes.
pub const CHUNK: usize = 1 << 20;

enum Sink {
    File(File),
    Memory(Vec<u8>),
}

struct Shared {
    sink: Mutex<Sink>,
    /// The first write error; recording itself never fails, the error shows
    /// up at `flush`/`finish`.
    error: Mutex<Option<io::Error>>,
}

impl Shared {
    fn write_chunk(&self, bytes: &[u8]) {
        let mut sink = self.sink.lock().unwrap_or_else(|p| p.into_inner());
        let res = match &mut *sink {
            Sink::File(f) => f.write_all(bytes),
            Sink::Memory(v) => {
                v.extend_from_slice(bytes);
                Ok(())
            }
        };
        if let Err(e) = res {
            let mut err = self.error.lock().unwrap_or_else(|p| p.into_inner());
            err.get_or_insert(e);
        }
    }
}

/// The process-wide recorder handle. Cloning is cheap (an `Arc`); a disabled
/// recorder holds nothing.
#[derive(Clone, Default)]
pub struct Recorder {
    shared: Option<Arc<Shared>>,
}

impl Recorder {
    /// A recorder that records nothing; its thread handles cost a branch.
    pub fn disabled() -> Recorder {
        Recorder { shared: None }
    }

    /// Records to `path` (created or truncated).
    pub fn create(path: impl AsRef<Path>) -> io::Result<Recorder> {
        let f = File::create(path)?;
        Ok(Recorder::with_sink(Sink::File(f)))
    }

    /// Records into memory; read it back with [`Recorder::take_memory`]
    /// (for the simulator and tests, which check without touching disk).
    pub fn in_memory() -> Recorder {
        Recorder::with_sink(Sink::Memory(Vec::new()))
    }

    fn with_sink(sink: Sink) -> Recorder {
        Recorder {
            shared: Some(Arc::new(Shared {
                sink: Mutex::new(sink),
                error: Mutex::new(None),
            })),
        }
    }

    pub fn is_enabled(&self) -> bool {
        self.shared.is_some()
    }

    /// A per-thread handle. Records reach the sink when its buffer fills, on
    /// [`ThreadRecorder::flush`], or when the handle is dropped.
    pub fn thread(&self) -> ThreadRecorder {
        ThreadRecorder {
            shared: self.shared.clone(),
            buf: Vec::new(),
            scratch: Vec::new(),
        }
    }

    /// Flushes the sink (thread handles must have flushed or been dropped
    /// first) and reports the first write error seen so far.
    pub fn flush(&self) -> io::Result<()> {
        let Some(s) = &self.shared else { return Ok(()) };
        if let Some(e) = s.error.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Err(e);
        }
        match &mut *s.sink.lock().unwrap_or_else(|p| p.into_inner()) {
            Sink::File(f) => f.flush(),
            Sink::Memory(_) => Ok(()),
        }
    }

    /// For an in-memory recorder: everything recorded so far (the JSONL
    /// bytes), leaving the buffer empty. `None` for file or disabled ones.
    pub fn take_memory(&self) -> Option<Vec<u8>> {
        let s = self.shared.as_ref()?;
        match &mut *s.sink.lock().unwrap_or_else(|p| p.into_inner()) {
            Sink::Memory(v) => Some(std::mem::take(v)),
            Sink::File(_) => None,
        }
    }
}

/// The fixed part of a record, passed by reference so nothing is copied.
#[derive(Clone, Copy, Debug)]
pub struct TxnHeader<'a> {
    pub id: u64,
    pub node: u32,
    pub thread: u32,
    pub outcome: Outcome,
    pub reason: Option<&'a str>,
    pub start_us: u64,
    pub end_us: u64,
    /// See [`TxnRecord::clock_offset_us`]; `None` for real clusters.
    pub clock_offset_us: Option<u64>,
}

/// One worker thread's recording handle (`Send`, not shared).
pub struct ThreadRecorder {
    shared: Option<Arc<Shared>>,
    buf: Vec<u8>,
    /// The `writes` array under construction, so reads and writes may be
    /// added in any order.
    scratch: Vec<u8>,
}

impl ThreadRecorder {
    pub fn is_enabled(&self) -> bool {
        self.shared.is_some()
    }

    /// Records one transaction without building a [`TxnRecord`]: `f` adds the
    /// reads and writes from the caller's own data structures. When recording
    /// is disabled `f` is not called at all.
    #[inline]
    pub fn record_with(&mut self, header: &TxnHeader<'_>, f: impl FnOnce(&mut TxnBuilder<'_>)) {
        if self.shared.is_none() {
            return;
        }
        self.record_slow(header, f);
    }

    fn record_slow(&mut self, h: &TxnHeader<'_>, f: impl FnOnce(&mut TxnBuilder<'_>)) {
        let buf = &mut self.buf;
        buf.extend_from_slice(b"{\"id\":");
        put_u64(buf, h.id);
        buf.extend_from_slice(b",\"node\":");
        put_u64(buf, h.node as u64);
        buf.extend_from_slice(b",\"thread\":");
        put_u64(buf, h.thread as u64);
        buf.extend_from_slice(b",\"outcome\":\"");
        buf.extend_from_slice(h.outcome.as_str().as_bytes());
        buf.extend_from_slice(b"\",\"reason\":");
        match h.reason {
            Some(r) => put_str(buf, r),
            None => buf.extend_from_slice(b"null"),
        }
        buf.extend_from_slice(b",\"start_us\":");
        put_u64(buf, h.start_us);
        buf.extend_from_slice(b",\"end_us\":");
        put_u64(buf, h.end_us);
        if let Some(off) = h.clock_offset_us {
            buf.extend_from_slice(b",\"clock_offset_us\":");
            put_u64(buf, off);
        }
        buf.extend_from_slice(b",\"reads\":[");
        self.scratch.clear();
        let mut b = TxnBuilder {
            reads: buf,
            writes: &mut self.scratch,
            n_reads: 0,
            n_writes: 0,
        };
        f(&mut b);
        buf.extend_from_slice(b"],\"writes\":[");
        buf.extend_from_slice(&self.scratch);
        buf.extend_from_slice(b"]}\n");
        if buf.len() >= CHUNK {
            self.flush();
        }
    }

    /// Records an owned record (convenience; `record_with` avoids building it).
    pub fn record(&mut self, rec: &TxnRecord) {
        let header = TxnHeader {
            id: rec.id,
            node: rec.node,
            thread: rec.thread,
            outcome: rec.outcome,
            reason: rec.reason.as_deref(),
            start_us: rec.start_us,
            end_us: rec.end_us,
            clock_offset_us: rec.clock_offset_us,
        };
        self.record_with(&header, |b| {
            for r in &rec.reads {
                b.read_hex(r.table, r.key, r.version, r.value.as_deref());
            }
            for w in &rec.writes {
                b.write_hex(
                    w.table,
                    w.key,
                    w.kind,
                    w.prev_version,
                    w.version,
                    w.value.as_deref(),
                );
            }
        });
    }

    /// Hands the buffered records to the shared sink.
    pub fn flush(&mut self) {
        if let Some(s) = &self.shared {
            if !self.buf.is_empty() {
                s.write_chunk(&self.buf);
                self.buf.clear();
            }
        }
    }
}

impl Drop for ThreadRecorder {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Adds reads and writes to the record being built by `record_with`.
pub struct TxnBuilder<'a> {
    reads: &'a mut Vec<u8>,
    writes: &'a mut Vec<u8>,
    n_reads: usize,
    n_writes: usize,
}

impl TxnBuilder<'_> {
    /// A read that saw `version` and `value` (`None`: key absent/deleted).
    pub fn read(&mut self, table: u32, key: u64, version: u64, value: Option<&[u8]>) {
        self.read_start(table, key, version);
        put_bytes_hex(self.reads, value);
        self.reads.push(b'}');
    }

    /// Like [`read`](Self::read) with an already hex-encoded value.
    pub fn read_hex(&mut self, table: u32, key: u64, version: u64, hex: Option<&str>) {
        self.read_start(table, key, version);
        put_hex_str(self.reads, hex);
        self.reads.push(b'}');
    }

    fn read_start(&mut self, table: u32, key: u64, version: u64) {
        let b = &mut *self.reads;
        if self.n_reads > 0 {
            b.push(b',');
        }
        self.n_reads += 1;
        b.extend_from_slice(b"{\"table\":");
        put_u64(b, table as u64);
        b.extend_from_slice(b",\"key\":");
        put_u64(b, key);
        b.extend_from_slice(b",\"version\":");
        put_u64(b, version);
        b.extend_from_slice(b",\"value\":");
    }

    /// A write of `value` (`None` for deletes) installing `version` over
    /// `prev_version`.
    pub fn write(
        &mut self,
        table: u32,
        key: u64,
        kind: WriteKind,
        prev_version: u64,
        version: u64,
        value: Option<&[u8]>,
    ) {
        self.write_start(table, key, kind, prev_version, version);
        put_bytes_hex(self.writes, value);
        self.writes.push(b'}');
    }

    pub fn write_hex(
        &mut self,
        table: u32,
        key: u64,
        kind: WriteKind,
        prev_version: u64,
        version: u64,
        hex: Option<&str>,
    ) {
        self.write_start(table, key, kind, prev_version, version);
        put_hex_str(self.writes, hex);
        self.writes.push(b'}');
    }

    fn write_start(
        &mut self,
        table: u32,
        key: u64,
        kind: WriteKind,
        prev_version: u64,
        version: u64,
    ) {
        let b = &mut *self.writes;
        if self.n_writes > 0 {
            b.push(b',');
        }
        self.n_writes += 1;
        b.extend_from_slice(b"{\"table\":");
        put_u64(b, table as u64);
        b.extend_from_slice(b",\"key\":");
        put_u64(b, key);
        b.extend_from_slice(b",\"kind\":\"");
        b.extend_from_slice(kind.as_str().as_bytes());
        b.extend_from_slice(b"\",\"prev_version\":");
        put_u64(b, prev_version);
        b.extend_from_slice(b",\"version\":");
        put_u64(b, version);
        b.extend_from_slice(b",\"value\":");
    }
}

fn put_u64(b: &mut Vec<u8>, mut n: u64) {
    let mut tmp = [0u8; 20];
    let mut i = tmp.len();
    loop {
        i -= 1;
        tmp[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    b.extend_from_slice(&tmp[i..]);
}

fn put_bytes_hex(b: &mut Vec<u8>, v: Option<&[u8]>) {
    let Some(v) = v else {
        b.extend_from_slice(b"null");
        return;
    };
    b.push(b'"');
    // Resize once and fill in place: per-byte `push` re-checks capacity.
    let start = b.len();
    b.resize(start + v.len() * 2, 0);
    for (out, &x) in b[start..].chunks_exact_mut(2).zip(v) {
        out[0] = HEX[(x >> 4) as usize];
        out[1] = HEX[(x & 15) as usize];
    }
    b.push(b'"');
}

/// Writes an already-encoded hex value; anything else is escaped as a string
/// so the line stays valid JSON (the parser then reports it as non-hex).
fn put_hex_str(b: &mut Vec<u8>, v: Option<&str>) {
    match v {
        None => b.extend_from_slice(b"null"),
        Some(s) if s.bytes().all(|c| c.is_ascii_hexdigit()) => {
            b.push(b'"');
            b.extend_from_slice(s.as_bytes());
            b.push(b'"');
        }
        Some(s) => put_str(b, s),
    }
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.push(b'"');
    for c in s.chars() {
        match c {
            '"' => b.extend_from_slice(b"\\\""),
            '\\' => b.extend_from_slice(b"\\\\"),
            c if (c as u32) < 0x20 => {
                b.extend_from_slice(b"\\u00");
                b.push(HEX[(c as u32 >> 4) as usize]);
                b.push(HEX[(c as u32 & 15) as usize]);
            }
            c => {
                let mut tmp = [0u8; 4];
                b.extend_from_slice(c.encode_utf8(&mut tmp).as_bytes());
            }
        }
    }
    b.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn u64_digits() {
        for n in [0u64, 7, 10, 99, 4294967301, u64::MAX] {
            let mut b = Vec::new();
            put_u64(&mut b, n);
            assert_eq!(String::from_utf8(b).unwrap(), n.to_string());
        }
    }

    #[test]
    fn escapes_reason() {
        let mut b = Vec::new();
        put_str(&mut b, "a\"b\\c\n");
        let s: String = serde_json::from_slice(&b).unwrap();
        assert_eq!(s, "a\"b\\c\n");
    }
}
