//! Registered memory: raw mappings shared with remote initiators, accessed with atomics
//! so that one-sided operations and the owner's CPU never race in the Rust sense.
//!
//! The access model every layer above may rely on (and no more):
//! - a READ copies in ascending address order; each aligned 8-byte word is read
//!   atomically with acquire ordering (unaligned edges byte by byte);
//! - a WRITE stores in ascending address order; each aligned 8-byte word atomically with
//!   release ordering;
//! - CAS and FAA are sequentially consistent read-modify-writes of one aligned word and
//!   are atomic against each other and against the owner's CPU atomics on that word.
//!
//! So a READ racing a WRITE may see a mix of old and new words (as an RDMA READ may),
//! never a torn word. Real NICs give whole cache lines at best; the store's per-line
//! versions are designed for the weaker word guarantee.

use crate::types::{Perms, RegionDesc, RegionId, TransportError};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

const HUGE_PAGE: usize = 2 << 20;

/// An owned memory mapping (anonymous or of a shared file), unmapped on drop.
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory; all access goes through atomics.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Zero-filled private anonymous memory (page-aligned, pages materialise on first touch).
    /// Large mappings get huge pages, as RDMA systems register huge pages: a random
    /// lookup in a big table otherwise pays a TLB miss on top of its cache miss. Reserved
    /// huge pages (`/proc/sys/vm/nr_hugepages`) are used when enough are free; otherwise
    /// the mapping asks for transparent huge pages, which the kernel gives when it can.
    pub fn anonymous(len: usize) -> Result<Mapping, TransportError> {
        let private = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        if len >= HUGE_PAGE {
            let rounded = len.next_multiple_of(HUGE_PAGE);
            // Fails at once (ENOMEM) when too few huge pages are reserved.
            if let Ok(m) = Self::map(rounded, private | libc::MAP_HUGETLB, -1) {
                return Ok(m);
            }
        }
        let m = Self::map(len, private, -1)?;
        if m.len >= HUGE_PAGE {
            // SAFETY: advice on our own fresh mapping; failure (THP off) changes nothing.
            unsafe { libc::madvise(m.ptr as *mut libc::c_void, m.len, libc::MADV_HUGEPAGE) };
        }
        Ok(m)
    }

    /// Maps `len` bytes of the file `fd` shared (visible to other processes mapping it).
    pub fn shared_file(fd: libc::c_int, len: usize) -> Result<Mapping, TransportError> {
        Self::map(len, libc::MAP_SHARED, fd)
    }

    fn map(len: usize, flags: libc::c_int, fd: libc::c_int) -> Result<Mapping, TransportError> {
        let len = len.max(1);
        // SAFETY: a fresh mapping chosen by the kernel; checked for failure below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(TransportError::Region(format!(
                "mmap of {len} bytes failed: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(Mapping {
            ptr: ptr as *mut u8,
            len,
        })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len came from a successful mmap.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// A view of registered memory, cheap to clone. Every accessor is bounds-checked by the
/// caller through [`RegionMemory::range_ok`] or panics-free by returning `None`.
#[derive(Clone)]
pub struct RegionMemory {
    ptr: *mut u8,
    len: usize,
    _owner: Arc<Mapping>,
}

// SAFETY: all access is through atomics on memory kept alive by `_owner`.
unsafe impl Send for RegionMemory {}
unsafe impl Sync for RegionMemory {}

impl RegionMemory {
    pub fn new(mapping: Arc<Mapping>, offset: usize, len: usize) -> RegionMemory {
        assert!(offset.checked_add(len).is_some_and(|e| e <= mapping.len()));
        // SAFETY: within the mapping, checked above.
        let ptr = unsafe { mapping.as_ptr().add(offset) };
        RegionMemory {
            ptr,
            len,
            _owner: mapping,
        }
    }

    /// Fresh zeroed private memory of `len` bytes.
    pub fn anonymous(len: usize) -> Result<RegionMemory, TransportError> {
        let m = Arc::new(Mapping::anonymous(len)?);
        Ok(RegionMemory::new(m, 0, len))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// True if `[offset, offset+len)` lies inside the region.
    #[inline]
    pub fn range_ok(&self, offset: u64, len: usize) -> bool {
        offset
            .checked_add(len as u64)
            .is_some_and(|end| end <= self.len as u64)
    }

    /// The aligned word at `offset`, or `None` if misaligned or out of bounds.
    #[inline]
    pub fn word(&self, offset: u64) -> Option<&AtomicU64> {
        if !offset.is_multiple_of(8)
            || !self.range_ok(offset, 8)
            || !(self.ptr as usize).is_multiple_of(8)
        {
            return None;
        }
        // SAFETY: in bounds, aligned, memory lives as long as self.
        Some(unsafe { &*(self.ptr.add(offset as usize) as *const AtomicU64) })
    }

    #[inline]
    fn byte(&self, offset: usize) -> &AtomicU8 {
        // SAFETY: callers check bounds.
        unsafe { &*(self.ptr.add(offset) as *const AtomicU8) }
    }

    /// Copies `out.len()` bytes from `offset` in ascending order (see module docs).
    /// Returns false, copying nothing, if the range is out of bounds.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> bool {
        if !self.range_ok(offset, out.len()) {
            return false;
        }
        let start = offset as usize;
        let mut i = 0;
        let n = out.len();
        while i < n && !(self.ptr as usize + start + i).is_multiple_of(8) {
            out[i] = self.byte(start + i).load(Ordering::Acquire);
            i += 1;
        }
        while i + 8 <= n {
            // SAFETY: aligned (loop above) and in bounds (checked range).
            let w = unsafe { &*(self.ptr.add(start + i) as *const AtomicU64) };
            out[i..i + 8].copy_from_slice(&w.load(Ordering::Acquire).to_ne_bytes());
            i += 8;
        }
        while i < n {
            out[i] = self.byte(start + i).load(Ordering::Acquire);
            i += 1;
        }
        true
    }

    /// Stores `data` at `offset` in ascending order (see module docs). Returns false,
    /// writing nothing, if the range is out of bounds.
    pub fn write(&self, offset: u64, data: &[u8]) -> bool {
        if !self.range_ok(offset, data.len()) {
            return false;
        }
        let start = offset as usize;
        let mut i = 0;
        let n = data.len();
        while i < n && !(self.ptr as usize + start + i).is_multiple_of(8) {
            self.byte(start + i).store(data[i], Ordering::Release);
            i += 1;
        }
        while i + 8 <= n {
            // SAFETY: aligned and in bounds.
            let w = unsafe { &*(self.ptr.add(start + i) as *const AtomicU64) };
            let mut b = [0u8; 8];
            b.copy_from_slice(&data[i..i + 8]);
            w.store(u64::from_ne_bytes(b), Ordering::Release);
            i += 8;
        }
        while i < n {
            self.byte(start + i).store(data[i], Ordering::Release);
            i += 1;
        }
        true
    }

    /// Copies `len` bytes from `src` at `src_off` into `self` at `dst_off`, word by word,
    /// without an intermediate buffer (a READ landing in local registered memory).
    #[inline]
    pub fn copy_from(&self, dst_off: u64, src: &RegionMemory, src_off: u64, len: usize) -> bool {
        if !self.range_ok(dst_off, len) || !src.range_ok(src_off, len) {
            return false;
        }
        // SAFETY: both ranges are in bounds (checked above).
        let (d, s) = unsafe {
            (
                self.ptr.add(dst_off as usize),
                src.ptr.add(src_off as usize),
            )
        };
        if (d as usize | s as usize | len).is_multiple_of(8) {
            // The common case (aligned items): word to word, no bounce buffer. Counted in
            // words, not `step_by(8)` bytes, which costs twice the instructions per word.
            let (d, s) = (d as *const AtomicU64, s as *const AtomicU64);
            for i in 0..len / 8 {
                // SAFETY: aligned and in bounds (word i ends at 8 * (i + 1) <= len).
                let (dw, sw) = unsafe { (&*d.add(i), &*s.add(i)) };
                dw.store(sw.load(Ordering::Acquire), Ordering::Release);
            }
            return true;
        }
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 256];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(buf.len());
            // SAFETY: `read` overwrites all n bytes before they are read.
            let chunk =
                unsafe { &mut *(&mut buf[..n] as *mut [std::mem::MaybeUninit<u8>] as *mut [u8]) };
            src.read(src_off + done as u64, chunk);
            self.write(dst_off + done as u64, chunk);
            done += n;
        }
        true
    }

    /// Zeroes the whole region (used when a shared file is created).
    pub fn zero(&self) {
        let z = [0u8; 256];
        let mut off = 0;
        while off < self.len {
            let n = (self.len - off).min(z.len());
            self.write(off as u64, &z[..n]);
            off += n;
        }
    }
}

/// A region registered on this node: its descriptor (to hand to remote nodes) and its
/// memory (for the owner's CPU).
#[derive(Clone)]
pub struct Region {
    pub desc: RegionDesc,
    pub mem: RegionMemory,
}

impl Region {
    pub fn id(&self) -> RegionId {
        self.desc.id
    }
    pub fn key(&self) -> u64 {
        self.desc.key
    }
    pub fn perms(&self) -> Perms {
        self.desc.perms
    }
}

/// A random, non-zero 64-bit access key.
pub fn random_key() -> u64 {
    loop {
        let k: u64 = rand::random();
        if k != 0 {
            return k;
        }
    }
}

impl RegionDesc {
    /// Wire size of [`RegionDesc::encode`].
    pub const WIRE_LEN: usize = 2 + 4 + 8 + 8 + 1;

    /// Encodes the descriptor for an out-of-band exchange (as rkeys are exchanged).
    pub fn encode(&self) -> [u8; Self::WIRE_LEN] {
        let mut b = [0u8; Self::WIRE_LEN];
        b[0..2].copy_from_slice(&self.node.to_le_bytes());
        b[2..6].copy_from_slice(&self.id.to_le_bytes());
        b[6..14].copy_from_slice(&self.len.to_le_bytes());
        b[14..22].copy_from_slice(&self.key.to_le_bytes());
        b[22] = self.perms.0;
        b
    }

    /// Decodes an untrusted descriptor; `None` if the bytes are not one.
    pub fn decode(b: &[u8]) -> Option<RegionDesc> {
        if b.len() != Self::WIRE_LEN || b[22] & !Perms::ALL.0 != 0 {
            return None;
        }
        Some(RegionDesc {
            node: u16::from_le_bytes(b[0..2].try_into().ok()?),
            id: u32::from_le_bytes(b[2..6].try_into().ok()?),
            len: u64::from_le_bytes(b[6..14].try_into().ok()?),
            key: u64::from_le_bytes(b[14..22].try_into().ok()?),
            perms: Perms(b[22]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Free reserved huge pages, from /proc/meminfo.
    /// Reserved huge pages free and not promised to a mapping already made (another
    /// process's mapping holds its pages from `mmap` on, before it touches them).
    fn free_huge_pages() -> Option<u64> {
        let info = std::fs::read_to_string("/proc/meminfo").ok()?;
        let field = |name: &str| -> Option<u64> {
            let line = info.lines().find(|l| l.starts_with(name))?;
            line.split_whitespace().nth(1)?.parse().ok()
        };
        Some(field("HugePages_Free:")?.saturating_sub(field("HugePages_Rsvd:")?))
    }

    /// The kernel page size of the mapping that contains `addr`, from
    /// /proc/self/smaps (per mapping: other tests of the binary take and free huge
    /// pages concurrently, so the global free count cannot tell whose they are).
    fn kernel_page_size(addr: *mut u8) -> Option<u64> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let a = addr as u64;
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((lo, hi)) = range.split_once('-') {
                    if let (Ok(lo), Ok(hi)) =
                        (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16))
                    {
                        inside = lo <= a && a < hi;
                        continue;
                    }
                }
            }
            if inside {
                if let Some(v) = line.strip_prefix("KernelPageSize:") {
                    return v
                        .split_whitespace()
                        .next()?
                        .parse::<u64>()
                        .ok()
                        .map(|k| k * 1024);
                }
            }
        }
        None
    }

    #[test]
    fn large_mappings_take_reserved_huge_pages() {
        if free_huge_pages().unwrap_or(0) < 2 {
            eprintln!("skipped: fewer than 2 free reserved huge pages (nr_hugepages)");
            return;
        }
        let m = RegionMemory::anonymous(HUGE_PAGE + 4096).unwrap();
        assert!(m.write(0, &[1]));
        assert!(m.write(HUGE_PAGE as u64, &[1]));
        // Other processes (and tests) take reserved pages too: a fallback to small
        // pages is a failure only if enough were free after it.
        let kps = kernel_page_size(m.as_ptr());
        let free = free_huge_pages().unwrap_or(0);
        assert!(
            kps == Some(HUGE_PAGE as u64) || free < 2,
            "a {}-byte region has pages of {kps:?} bytes though {free} reserved huge pages are free",
            m.len()
        );
        // Small regions never take one.
        let small = RegionMemory::anonymous(4096).unwrap();
        assert!(small.write(0, &[1]));
        assert_eq!(kernel_page_size(small.as_ptr()), Some(4096));
    }
}
