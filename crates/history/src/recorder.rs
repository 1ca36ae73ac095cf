//! The history recorder: off by default, cheap when on.
//!
//! Each worker thread owns a [`ThreadRecorder`] that serializes records by hand
//! into its own byte buffer (no allocation per record once the buffers are
//! warm). A file recorder then copies each record at once into the thread's
//! segment of the file, mapped with `MAP_SHARED`: the bytes are in the kernel's
//! page cache as soon as the copy ends, so a process killed by SIGKILL leaves
//! every record it finished (a pending record of a transaction whose coordinator
//! dies must be there before the commit phase installs anything). Segments are
//! reserved from a shared cursor under a mutex, about once per [`SEGMENT`]
//! bytes. A killed process's file holds unwritten (NUL) gaps and possibly one
//! torn record per thread; [`salvage`] copies out its complete records. A
//! recorder that finishes normally compacts its file into plain JSON lines.
//! An in-memory recorder hands whole [`CHUNK`]s to a shared buffer instead.

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::format::{Outcome, TxnRecord, WriteKind, HEX};

/// An in-memory recorder's thread buffer is handed over once it holds this many
/// bytes.
pub const CHUNK: usize = 1 << 20;

/// A thread reserves this much of the file at a time (a page multiple, so
/// every mapping starts at a page-aligned offset).
pub const SEGMENT: usize = 256 << 10;

/// The file grows and is mapped this much at a time: a killed process's file
/// ends in at most this many unwritten bytes.
const EXTENT: usize = 16 << 20;

const PAGE: usize = 4096;

/// One mapped stretch of the file.
struct Extent {
    ptr: *mut u8,
    /// File offset of `ptr[0]`.
    off: usize,
    len: usize,
}

struct MapState {
    extents: Vec<Extent>,
    /// The next unreserved file offset.
    next: usize,
    /// Written ranges `(offset, len)` of finished segments.
    used: Vec<(usize, usize)>,
    /// Thread handles that may still write (compaction waits for none).
    live: usize,
}

/// A file written through shared mappings.
struct MapFile {
    file: File,
    state: Mutex<MapState>,
}

// SAFETY: the raw extent pointers are only dereferenced for the byte ranges a
// segment owns (one thread at a time) or, during compaction, with no live
// thread handle; the mappings live until `MapFile` is dropped.
unsafe impl Send for MapFile {}
unsafe impl Sync for MapFile {}

/// A thread's reserved part of the file.
struct Segment {
    ptr: *mut u8,
    off: usize,
    len: usize,
    pos: usize,
}

// SAFETY: a segment's bytes belong to the one thread handle holding it.
unsafe impl Send for Segment {}

impl MapFile {
    fn state(&self) -> std::sync::MutexGuard<'_, MapState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reserves at least `need` bytes that no other segment shares.
    fn reserve(&self, need: usize) -> io::Result<Segment> {
        let len = need.max(SEGMENT).next_multiple_of(PAGE);
        let mut st = self.state();
        if let Some(e) = st.extents.last() {
            if st.next >= e.off && st.next + len <= e.off + e.len {
                let seg = Segment {
                    // SAFETY: in bounds of the extent, checked just above.
                    ptr: unsafe { e.ptr.add(st.next - e.off) },
                    off: st.next,
                    len,
                    pos: 0,
                };
                st.next += len;
                return Ok(seg);
            }
        }
        // A new extent from `next` (the rest of the last one stays unwritten).
        let off = st.next.next_multiple_of(PAGE);
        let elen = len.max(EXTENT);
        self.file.set_len((off + elen) as u64)?;
        // SAFETY: a fresh shared read-write mapping of a file range we just sized.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                elen,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.file.as_raw_fd(),
                off as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = ptr as *mut u8;
        st.extents.push(Extent {
            ptr,
            off,
            len: elen,
        });
        st.next = off + len;
        Ok(Segment {
            ptr,
            off,
            len,
            pos: 0,
        })
    }

    fn retire(&self, seg: &Segment) {
        if seg.pos > 0 {
            self.state().used.push((seg.off, seg.pos));
        }
    }

    /// With no thread writing: moves the written ranges together, unmaps, and
    /// cuts the file to the records, so a finished file is plain JSON lines.
    fn compact(&self) -> io::Result<()> {
        let mut st = self.state();
        if st.live > 0 {
            return Ok(());
        }
        st.used.sort_unstable();
        let mut dst = 0usize;
        let mut tmp = Vec::new();
        for &(off, len) in &st.used {
            if off != dst {
                tmp.clear();
                tmp.resize(len, 0);
                self.file.read_exact_at(&mut tmp, off as u64)?;
                self.file.write_all_at(&tmp, dst as u64)?;
            }
            dst += len;
        }
        for e in st.extents.drain(..) {
            // SAFETY: unmapping a mapping we made; no segment is live.
            unsafe { libc::munmap(e.ptr as *mut libc::c_void, e.len) };
        }
        self.file.set_len(dst as u64)?;
        st.used = if dst > 0 { vec![(0, dst)] } else { Vec::new() };
        st.next = dst;
        Ok(())
    }
}

impl Drop for MapFile {
    fn drop(&mut self) {
        let _ = self.compact();
    }
}

enum Sink {
    File(MapFile),
    Memory(Mutex<Vec<u8>>),
}

struct Shared {
    sink: Sink,
    /// The first write error; recording itself never fails, the error shows
    /// up at `flush`.
    error: Mutex<Option<io::Error>>,
}

impl Shared {
    fn note_error(&self, e: io::Error) {
        let mut err = self.error.lock().unwrap_or_else(|p| p.into_inner());
        err.get_or_insert(e);
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

    /// Records to `path` (created or truncated), through shared mappings: the
    /// records survive the process being killed (see the module docs).
    pub fn create(path: impl AsRef<Path>) -> io::Result<Recorder> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        Ok(Recorder::with_sink(Sink::File(MapFile {
            file,
            state: Mutex::new(MapState {
                extents: Vec::new(),
                next: 0,
                used: Vec::new(),
                live: 0,
            }),
        })))
    }

    /// Records into memory; read it back with [`Recorder::take_memory`]
    /// (for the simulator and tests, which check without touching disk).
    pub fn in_memory() -> Recorder {
        Recorder::with_sink(Sink::Memory(Mutex::new(Vec::new())))
    }

    fn with_sink(sink: Sink) -> Recorder {
        Recorder {
            shared: Some(Arc::new(Shared {
                sink,
                error: Mutex::new(None),
            })),
        }
    }

    pub fn is_enabled(&self) -> bool {
        self.shared.is_some()
    }

    /// A per-thread handle. In a file recorder each record is in the file
    /// when `record_with` returns; in memory, records reach the shared buffer
    /// when the thread's buffer fills, on [`ThreadRecorder::flush`], or when
    /// the handle is dropped.
    pub fn thread(&self) -> ThreadRecorder {
        if let Some(Sink::File(m)) = self.shared.as_deref().map(|s| &s.sink) {
            m.state().live += 1;
        }
        ThreadRecorder {
            shared: self.shared.clone(),
            buf: Vec::new(),
            scratch: Vec::new(),
            seg: None,
        }
    }

    /// Reports the first write error seen so far; for a file, once every
    /// thread handle is dropped, compacts it into plain JSON lines.
    pub fn flush(&self) -> io::Result<()> {
        let Some(s) = &self.shared else { return Ok(()) };
        if let Some(e) = s.error.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Err(e);
        }
        match &s.sink {
            Sink::File(m) => m.compact(),
            Sink::Memory(_) => Ok(()),
        }
    }

    /// For an in-memory recorder: everything recorded so far (the JSONL
    /// bytes), leaving the buffer empty. `None` for file or disabled ones.
    pub fn take_memory(&self) -> Option<Vec<u8>> {
        let s = self.shared.as_ref()?;
        match &s.sink {
            Sink::Memory(v) => Some(std::mem::take(
                &mut *v.lock().unwrap_or_else(|p| p.into_inner()),
            )),
            Sink::File(_) => None,
        }
    }
}

/// What [`salvage`] copied and skipped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Salvaged {
    /// Complete records copied.
    pub records: u64,
    /// Fragments skipped: pieces of records a kill cut off mid-copy (one torn
    /// record may leave two, its start and its end).
    pub torn: u64,
}

/// Copies the complete records of a history file, finished or left by a
/// killed process, to `out` as plain JSON lines: unwritten (NUL) stretches are
/// dropped and a torn record is skipped and counted, not an error. A line with
/// no NUL byte in it is a record copied whole and goes through unparsed; pieces
/// next to NUL bytes are kept only if they parse as a record.
pub fn salvage(mut input: impl BufRead, out: &mut impl Write) -> io::Result<Salvaged> {
    let mut got = Salvaged::default();
    let mut line = Vec::new();
    loop {
        line.clear();
        if input.read_until(b'\n', &mut line)? == 0 {
            return Ok(got);
        }
        let whole = line.last() == Some(&b'\n');
        let body = if whole {
            &line[..line.len() - 1]
        } else {
            &line[..]
        };
        if whole && !body.contains(&0) {
            if !body.trim_ascii().is_empty() {
                out.write_all(&line)?;
                got.records += 1;
            }
            continue;
        }
        for piece in body.split(|&b| b == 0) {
            if piece.trim_ascii().is_empty() {
                continue;
            }
            let ok = std::str::from_utf8(piece)
                .ok()
                .is_some_and(|t| crate::format::parse_line(t).is_ok());
            if ok {
                out.write_all(piece)?;
                out.write_all(b"\n")?;
                got.records += 1;
            } else {
                got.torn += 1;
            }
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
    /// A file recorder's current segment.
    seg: Option<Segment>,
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
        self.emit();
    }

    /// A file recorder copies the finished record into its segment now; an
    /// in-memory one waits for a whole chunk.
    fn emit(&mut self) {
        let Some(s) = self.shared.as_deref() else {
            return;
        };
        let Sink::File(m) = &s.sink else {
            if self.buf.len() >= CHUNK {
                self.flush();
            }
            return;
        };
        let n = self.buf.len();
        if self.seg.as_ref().is_none_or(|g| g.len - g.pos < n) {
            if let Some(old) = self.seg.take() {
                m.retire(&old);
            }
            match m.reserve(n) {
                Ok(g) => self.seg = Some(g),
                Err(e) => {
                    s.note_error(e);
                    self.buf.clear();
                    return;
                }
            }
        }
        let g = self.seg.as_mut().expect("reserved above");
        // SAFETY: `pos + n <= len` and the segment's bytes are this handle's.
        unsafe { std::ptr::copy_nonoverlapping(self.buf.as_ptr(), g.ptr.add(g.pos), n) };
        g.pos += n;
        self.buf.clear();
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

    /// Hands the buffered records to the shared sink (a file recorder has
    /// none buffered).
    pub fn flush(&mut self) {
        if let Some(s) = &self.shared {
            if let Sink::Memory(v) = &s.sink {
                if !self.buf.is_empty() {
                    v.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .extend_from_slice(&self.buf);
                    self.buf.clear();
                }
            }
        }
    }
}

impl Drop for ThreadRecorder {
    fn drop(&mut self) {
        self.flush();
        if let Some(Sink::File(m)) = self.shared.as_deref().map(|s| &s.sink) {
            if let Some(g) = self.seg.take() {
                m.retire(&g);
            }
            m.state().live -= 1;
        }
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
