//! One-sided access to a remote table through an [`Endpoint`]: lock-free reads (bucket
//! READs, then an item READ, or one item READ on a location-cache hit), CAS locks, and
//! the write protocol of [`crate::layout`] as one-sided WRITEs.
//!
//! Synchronous for now: each call posts, then polls the completion queue until its
//! completion arrives (waiting on the endpoint when nothing is there). The helper
//! consumes the endpoint's completions while it runs, so callers must not have other
//! operations outstanding on it.

use crate::layout::*;
use crate::loc_cache::{Loc, LocationCache};
use ambidex_transport::clock::{duration_ns, SharedClock, SystemClock};
use ambidex_transport::{
    AccessError, Completion, Endpoint, LocalBuf, NodeTransport, OneSidedKind, OneSidedOp, Perms,
    Region, TransportError,
};
use std::time::Duration;

/// Why a remote operation failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RemoteError {
    /// The operation completed with an error.
    Access(AccessError),
    /// The transport refused to post.
    Post(TransportError),
    /// The descriptor is inconsistent, or the value buffer has the wrong size.
    BadDesc(String),
    /// The item stayed locked (or kept changing) for the whole retry budget.
    Busy,
    /// No completion within the deadline.
    Timeout,
}

impl std::fmt::Display for RemoteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RemoteError::Access(e) => write!(f, "one-sided access failed: {}", e.name()),
            RemoteError::Post(e) => write!(f, "{e}"),
            RemoteError::BadDesc(s) => write!(f, "bad table descriptor: {s}"),
            RemoteError::Busy => write!(f, "item locked"),
            RemoteError::Timeout => write!(f, "no completion"),
        }
    }
}

impl std::error::Error for RemoteError {}

/// A consistent remote read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteGet {
    Found {
        version: u64,
        /// Where the item is (usable for a later CAS lock or validation READ).
        offset: u64,
    },
    NotFound,
}

/// Counts of what the reader did (for reports and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RemoteStats {
    pub reads: u64,
    pub cache_hits: u64,
    pub cache_stale: u64,
    pub retries: u64,
}

/// Per-thread helper: owns a small registered scratch region where READs land.
pub struct RemoteReader {
    scratch: Region,
    buf: Vec<u8>,
    next_wr: u64,
    cq: Vec<Completion>,
    /// Attempts on a locked or torn item before giving up with `Busy`.
    pub max_retries: u32,
    /// How long to wait for one completion.
    pub deadline: Duration,
    pub stats: RemoteStats,
    /// Times `deadline` (the process's system clock unless given one).
    clock: SharedClock,
}

fn bad(s: &str) -> RemoteError {
    RemoteError::BadDesc(s.to_string())
}

impl RemoteReader {
    /// Registers a scratch region on `node` large enough for items of up to
    /// `max_item_size` bytes (see [`TableLayout::item_size`]).
    pub fn new(node: &dyn NodeTransport, max_item_size: usize) -> Result<Self, TransportError> {
        let len = max_item_size.max(LINE as usize).next_multiple_of(64);
        let scratch = node.register(len, Perms::ALL)?;
        Ok(RemoteReader {
            scratch,
            buf: vec![0; len],
            next_wr: 1,
            cq: Vec::with_capacity(16),
            max_retries: 10_000,
            deadline: Duration::from_secs(10),
            stats: RemoteStats::default(),
            clock: SystemClock::shared(),
        })
    }

    /// Times completions by `clock` instead of the process's system clock.
    pub fn with_clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// Whether `deadline` has passed since `start_ns`.
    fn expired(&self, start_ns: u64) -> bool {
        self.clock.now_ns().saturating_sub(start_ns) > duration_ns(self.deadline)
    }

    fn check_desc(&self, t: &TableDesc) -> Result<ItemShape, RemoteError> {
        t.layout
            .validate(t.region.len)
            .map_err(|e| RemoteError::BadDesc(e.to_string()))?;
        if t.layout.item_size as usize > self.scratch.mem.len() {
            return Err(bad("items larger than the scratch buffer"));
        }
        Ok(ItemShape::new(&t.layout))
    }

    /// Posts one operation and waits for its completion; returns the completion value.
    fn run(&mut self, ep: &mut dyn Endpoint, op: OneSidedOp<'_>) -> Result<u64, RemoteError> {
        let wr_id = op.wr_id;
        ep.post(&[op]).map_err(RemoteError::Post)?;
        let start = self.clock.now_ns();
        loop {
            self.cq.clear();
            ep.poll_cq(16, &mut self.cq);
            if let Some(c) = self.cq.iter().find(|c| c.wr_id == wr_id) {
                return c.status.map(|_| c.value).map_err(RemoteError::Access);
            }
            if self.expired(start) {
                return Err(RemoteError::Timeout);
            }
            ep.wait(Duration::from_micros(200));
        }
    }

    fn wr(&mut self) -> u64 {
        self.next_wr = self.next_wr.wrapping_add(1);
        self.next_wr
    }

    /// READs `len` bytes at `offset` of the table's region into `self.buf[..len]`.
    fn read(
        &mut self,
        ep: &mut dyn Endpoint,
        t: &TableDesc,
        offset: u64,
        len: usize,
    ) -> Result<(), RemoteError> {
        let wr_id = self.wr();
        let dest = LocalBuf {
            region: self.scratch.desc.id,
            offset: 0,
        };
        self.run(
            ep,
            OneSidedOp {
                wr_id,
                remote: t.region.at(offset),
                kind: OneSidedKind::Read {
                    len: len as u32,
                    dest,
                },
                signaled: true,
            },
        )?;
        self.stats.reads += 1;
        self.scratch.mem.read(0, &mut self.buf[..len]);
        Ok(())
    }

    /// READs the item at `off` until it is consistent: `Ok(Some(version))` if it holds
    /// `key`, `Ok(None)` if it is absent or holds another key.
    fn read_item(
        &mut self,
        ep: &mut dyn Endpoint,
        t: &TableDesc,
        shape: &ItemShape,
        off: u64,
        key: u64,
        out: &mut [u8],
    ) -> Result<Option<u64>, RemoteError> {
        let n = shape.item_size;
        for attempt in 0..=self.max_retries {
            self.read(ep, t, off, n)?;
            match check_image(shape, &self.buf[..n], key, out) {
                ItemCheck::Ok(v) => return Ok(Some(v)),
                ItemCheck::Miss => return Ok(None),
                ItemCheck::Busy => {
                    self.stats.retries += 1;
                    if attempt > 8 {
                        std::thread::yield_now();
                    }
                }
            }
        }
        Err(RemoteError::Busy)
    }

    /// Reads `key` from the remote table into `out` (the table's value size): one item
    /// READ on a location-cache hit, else bucket READs along the chain and an item READ.
    /// Fills `cache` with the item's location when found.
    pub fn get(
        &mut self,
        ep: &mut dyn Endpoint,
        t: &TableDesc,
        cache: Option<&LocationCache>,
        key: u64,
        out: &mut [u8],
    ) -> Result<RemoteGet, RemoteError> {
        let shape = self.check_desc(t)?;
        if out.len() < shape.value_size {
            return Err(bad("output buffer smaller than the value size"));
        }
        let l = t.layout;
        if let Some(c) = cache {
            if let Some(loc) = c.get(t.table_id, key) {
                if loc.node == t.region.node
                    && loc.region == t.region.id
                    && l.item_at(loc.offset).is_some()
                {
                    if let Some(version) = self.read_item(ep, t, &shape, loc.offset, key, out)? {
                        self.stats.cache_hits += 1;
                        return Ok(RemoteGet::Found {
                            version,
                            offset: loc.offset,
                        });
                    }
                }
                self.stats.cache_stale += 1;
                c.invalidate(t.table_id, key);
            }
        }
        let h = hash(key, l.seed);
        let tag = tag_of(h);
        let mut b = l.main_bucket_off(h);
        let mut hops = 0;
        loop {
            self.read(ep, t, b, LINE as usize)?;
            let word = |buf: &[u8], i: usize| {
                u64::from_ne_bytes(buf[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]))
            };
            let bucket: [u64; 8] = std::array::from_fn(|i| word(&self.buf, i));
            let mut m = tag_matches(bucket[0], bucket[1], tag);
            while m != 0 {
                let s = m.trailing_zeros() as usize;
                m &= m - 1;
                let Some(off) = l.item_off(slot_ref(bucket[2 + s / 2], s)) else {
                    continue;
                };
                if let Some(version) = self.read_item(ep, t, &shape, off, key, out)? {
                    if let Some(c) = cache {
                        c.insert(
                            t.table_id,
                            key,
                            Loc {
                                node: t.region.node,
                                region: t.region.id,
                                offset: off,
                            },
                        );
                    }
                    return Ok(RemoteGet::Found {
                        version,
                        offset: off,
                    });
                }
            }
            match l.overflow_bucket_off(bucket[0] & LINK_MASK) {
                Some(next) if hops <= l.overflow => {
                    b = next;
                    hops += 1;
                }
                _ => return Ok(RemoteGet::NotFound),
            }
        }
    }

    /// Locks the item at `offset` for `owner` with a one-sided CAS if it is still
    /// unlocked at `version` (the CAS installs lock bit, owner and version in one word,
    /// see [`Header`]). Returns whether the lock was taken.
    pub fn lock(
        &mut self,
        ep: &mut dyn Endpoint,
        t: &TableDesc,
        offset: u64,
        version: u64,
        owner: LockOwner,
    ) -> Result<bool, RemoteError> {
        self.check_desc(t)?;
        if t.layout.item_at(offset).is_none() {
            return Err(bad("offset is not an item"));
        }
        let wr_id = self.wr();
        let old = self.run(
            ep,
            OneSidedOp {
                wr_id,
                remote: t.region.at(offset),
                kind: OneSidedKind::Cas {
                    expected: Header::unlocked(version),
                    new: Header::locked(version, owner),
                },
                signaled: true,
            },
        )?;
        Ok(old == Header::unlocked(version))
    }

    /// Releases a lock `owner` took with [`RemoteReader::lock`] without changing the
    /// item (the CAS fails, changing nothing, if `owner` does not hold it).
    pub fn unlock(
        &mut self,
        ep: &mut dyn Endpoint,
        t: &TableDesc,
        offset: u64,
        version: u64,
        owner: LockOwner,
    ) -> Result<(), RemoteError> {
        self.check_desc(t)?;
        let wr_id = self.wr();
        self.run(
            ep,
            OneSidedOp {
                wr_id,
                remote: t.region.at(offset),
                kind: OneSidedKind::Cas {
                    expected: Header::locked(version, owner),
                    new: Header::unlocked(version),
                },
                signaled: true,
            },
        )?;
        Ok(())
    }

    /// Writes `val` into an item this thread holds locked at `version` and releases it
    /// with version + 2, as one batch of WRITEs (in order, like the local write protocol:
    /// chunk versions to MARKER, then key, data and new chunk versions in ascending
    /// order, then the header). Returns the new version.
    pub fn write_unlock(
        &mut self,
        ep: &mut dyn Endpoint,
        t: &TableDesc,
        offset: u64,
        key: u64,
        version: u64,
        val: &[u8],
    ) -> Result<u64, RemoteError> {
        let shape = self.check_desc(t)?;
        if val.len() != shape.value_size {
            return Err(bad("value size differs from the table's"));
        }
        if t.layout.item_at(offset).is_none() {
            return Err(bad("offset is not an item"));
        }
        let nv = Header::bump(version, 2);
        let marker = MARKER.to_ne_bytes();
        let mut img = vec![0u8; shape.item_size];
        img[8..16].copy_from_slice(&key.to_ne_bytes());
        for (i, &w) in shape.data.iter().enumerate() {
            let s = w as usize * 8;
            img[s..s + 8].copy_from_slice(&value_word(val, i).to_ne_bytes());
        }
        for &c in &shape.versions {
            let s = c as usize * 8;
            img[s..s + 8].copy_from_slice(&nv.to_ne_bytes());
        }
        let hdr = nv.to_ne_bytes();
        let mut ops: Vec<OneSidedOp<'_>> = Vec::with_capacity(shape.versions.len() + 2);
        let base = self.next_wr;
        for (i, &c) in shape.versions.iter().enumerate() {
            ops.push(OneSidedOp {
                wr_id: base + 1 + i as u64,
                remote: t.region.at(offset + 8 * c as u64),
                kind: OneSidedKind::Write { data: &marker },
                signaled: false,
            });
        }
        ops.push(OneSidedOp {
            wr_id: base + 100,
            remote: t.region.at(offset + 8),
            kind: OneSidedKind::Write { data: &img[8..] },
            signaled: false,
        });
        let last = base + 101;
        ops.push(OneSidedOp {
            wr_id: last,
            remote: t.region.at(offset),
            kind: OneSidedKind::Write { data: &hdr },
            signaled: true,
        });
        self.next_wr = last;
        ep.post(&ops).map_err(RemoteError::Post)?;
        let start = self.clock.now_ns();
        loop {
            self.cq.clear();
            ep.poll_cq(16, &mut self.cq);
            for c in &self.cq {
                if c.wr_id > base && c.wr_id <= last {
                    if let Err(e) = c.status {
                        return Err(RemoteError::Access(e));
                    }
                    if c.wr_id == last {
                        return Ok(nv);
                    }
                }
            }
            if self.expired(start) {
                return Err(RemoteError::Timeout);
            }
            ep.wait(Duration::from_micros(200));
        }
    }
}
