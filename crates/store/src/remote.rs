//! One-sided access to a remote table from a worker coroutine of the RPC runtime:
//! lock-free reads (bucket READs, then an item READ, or one item READ on a
//! location-cache hit), CAS locks naming their owner, and the write protocol of
//! [`crate::layout`] as one-sided WRITEs.
//!
//! Asynchronous on the runtime's verbs (`Ctx::queue_read` and the like, posted with the
//! step's doorbell by `ctx.flush().await`): a thread never blocks or spins on a
//! completion, so its other coroutines (and the RPCs it serves) go on while a READ is
//! out. A retry after a locked or torn image is another queue-and-flush round, i.e. at
//! least one master step later. READs land in the runtime's scratch region: each worker
//! needs a slice of [`scratch_per_worker`] bytes ([`attach_scratch`]).
//!
//! Every call flushes the calling worker's batch: queue nothing of your own before it
//! that must outlive it. A call's result is its own operations': unsignaled failures of
//! the worker's earlier operations that its flush learns of are given back to the
//! worker (`Ctx::requeue_unsignaled_failures`), whose next flush reports them.

use crate::layout::*;
use crate::loc_cache::{Loc, LocationCache};
use ambidex_rpc::{Ctx, OneSidedError, OpHandle, RpcError, Runtime};
use ambidex_transport::{AccessError, NodeTransport, Perms};
use std::cell::Cell;

/// Why a remote operation failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RemoteError {
    /// The operation failed at the target or in the transport, or was refused when
    /// queued (unknown node, too large); nothing was read or changed.
    Access(AccessError),
    /// Another one-sided failure (no scratch room, post refused...).
    OneSided(OneSidedError),
    /// The flush failed (a request of the worker's batch timed out, say).
    Rpc(RpcError),
    /// The descriptor is inconsistent, or the value buffer has the wrong size.
    BadDesc(String),
    /// The item stayed locked (or kept changing) for the whole retry budget.
    Busy,
    /// A release found the item's word not locked by the releasing owner (`found`).
    NotLocked { found: u64 },
}

impl std::fmt::Display for RemoteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RemoteError::Access(e) => write!(f, "one-sided access failed: {}", e.name()),
            RemoteError::OneSided(e) => write!(f, "{e}"),
            RemoteError::Rpc(e) => write!(f, "{e}"),
            RemoteError::BadDesc(s) => write!(f, "bad table descriptor: {s}"),
            RemoteError::Busy => write!(f, "item locked"),
            RemoteError::NotLocked { found } => {
                write!(
                    f,
                    "release of an item not held: its word is {:?}",
                    Header::unpack(*found)
                )
            }
        }
    }
}

impl std::error::Error for RemoteError {}

impl From<OneSidedError> for RemoteError {
    fn from(e: OneSidedError) -> Self {
        match e {
            OneSidedError::Access { error, .. } | OneSidedError::Invalid(error) => {
                RemoteError::Access(error)
            }
            e => RemoteError::OneSided(e),
        }
    }
}

impl From<RpcError> for RemoteError {
    fn from(e: RpcError) -> Self {
        match e {
            RpcError::OneSided(e) => e.into(),
            e => RemoteError::Rpc(e),
        }
    }
}

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

/// Scratch bytes one worker needs for READs of items up to `max_item_size` bytes (see
/// [`TableLayout::item_size`]): one READ is out per call at a time.
pub fn scratch_per_worker(max_item_size: usize) -> usize {
    max_item_size.max(LINE as usize).next_multiple_of(64)
}

/// Registers a scratch region on `node` (the runtime's own) and attaches it to `rt`, so
/// that its coroutines `0..workers` (in spawn order) may READ items of up to
/// `max_item_size` bytes; later ones get `RemoteError::OneSided(NoScratch { .. })`.
pub fn attach_scratch(
    rt: &mut Runtime,
    node: &dyn NodeTransport,
    workers: usize,
    max_item_size: usize,
) -> Result<(), RemoteError> {
    let per = scratch_per_worker(max_item_size);
    let region = node
        .register(per * workers.max(1), Perms::ALL)
        .map_err(|e| RemoteError::Rpc(RpcError::Transport(e)))?;
    rt.attach_scratch(region, per)?;
    Ok(())
}

/// Remote table access for the coroutines of one runtime (shared by reference: it holds
/// only the retry budget and counters).
#[derive(Debug)]
pub struct RemoteReader {
    /// Attempts on a locked or torn item before giving up with `Busy`.
    pub max_retries: u32,
    stats: Cell<RemoteStats>,
}

impl Default for RemoteReader {
    fn default() -> Self {
        RemoteReader::new()
    }
}

fn bad(s: &str) -> RemoteError {
    RemoteError::BadDesc(s.to_string())
}

/// Flushes the worker's batch (its operations go out with the step's doorbell). The
/// flush also reports unsignaled failures of the worker's *earlier* batches; those are
/// not this call's, and failing it for them would hide the result of what it did (a
/// CAS that took a lock, say). They are given back to the worker, whose next flush
/// reports them. `own` are this call's unsignaled operations: their failures are the
/// caller's to read with `op_result`, so one matching report each is dropped here.
async fn flush(ctx: &Ctx, own: &[OpHandle]) -> Result<(), RemoteError> {
    match ctx.flush().await {
        Ok(()) => Ok(()),
        Err(RpcError::UnsignaledFailed(mut reported)) => {
            for &h in own {
                if let Err(e) = ctx.op_result(h) {
                    if let Some(i) = reported.iter().position(|r| *r == e) {
                        reported.swap_remove(i);
                    }
                }
            }
            ctx.requeue_unsignaled_failures(reported);
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

impl RemoteReader {
    pub fn new() -> Self {
        RemoteReader {
            max_retries: 10_000,
            stats: Cell::new(RemoteStats::default()),
        }
    }

    pub fn stats(&self) -> RemoteStats {
        self.stats.get()
    }

    fn count(&self, f: impl FnOnce(&mut RemoteStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    /// Checks the descriptor against itself and the cluster, so that nothing is queued
    /// that the runtime would refuse half-way through a batch.
    fn check_desc(&self, ctx: &Ctx, t: &TableDesc) -> Result<ItemShape, RemoteError> {
        t.layout
            .validate(t.region.len)
            .map_err(|e| RemoteError::BadDesc(e.to_string()))?;
        let c = ctx.cluster();
        if t.region.node >= c.nodes {
            return Err(RemoteError::Access(AccessError::UnknownNode));
        }
        if t.layout.item_size as usize > c.max_onesided {
            return Err(RemoteError::Access(AccessError::TooLarge));
        }
        Ok(ItemShape::new(&t.layout))
    }

    /// READs `len` bytes at `offset` of the table's region and runs `f` on them.
    async fn read<R>(
        &self,
        ctx: &Ctx,
        t: &TableDesc,
        offset: u64,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, RemoteError> {
        let h = ctx.queue_read(t.region.at(offset), len as u32, true)?;
        flush(ctx, &[]).await?;
        let r = ctx.read_result(h, f)?;
        self.count(|s| s.reads += 1);
        Ok(r)
    }

    /// READs the item at `off` until it is consistent: `Ok(Some(version))` if it holds
    /// `key` (its value then in `out`), `Ok(None)` if it is absent or holds another key.
    async fn read_item(
        &self,
        ctx: &Ctx,
        t: &TableDesc,
        shape: &ItemShape,
        off: u64,
        key: u64,
        out: &mut [u8],
    ) -> Result<Option<u64>, RemoteError> {
        for _ in 0..=self.max_retries {
            let check = self
                .read(ctx, t, off, shape.item_size, |img| {
                    check_image(shape, img, key, out)
                })
                .await?;
            match check {
                ItemCheck::Ok(v) => return Ok(Some(v)),
                ItemCheck::Miss => return Ok(None),
                ItemCheck::Busy => self.count(|s| s.retries += 1),
            }
        }
        Err(RemoteError::Busy)
    }

    /// Reads `key` from the remote table into `out` (the table's value size): one item
    /// READ on a location-cache hit, else bucket READs along the chain and an item READ.
    /// Fills `cache` with the item's location when found. A locked or torn item is read
    /// again, up to `max_retries` times (`Busy` then); `out` is written only by a
    /// consistent read of `key`.
    pub async fn get(
        &self,
        ctx: &Ctx,
        t: &TableDesc,
        cache: Option<&LocationCache>,
        key: u64,
        out: &mut [u8],
    ) -> Result<RemoteGet, RemoteError> {
        let shape = self.check_desc(ctx, t)?;
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
                    let found = self.read_item(ctx, t, &shape, loc.offset, key, out).await?;
                    if let Some(version) = found {
                        self.count(|s| s.cache_hits += 1);
                        return Ok(RemoteGet::Found {
                            version,
                            offset: loc.offset,
                        });
                    }
                }
                self.count(|s| s.cache_stale += 1);
                c.invalidate(t.table_id, key);
            }
        }
        let h = hash(key, l.seed);
        let tag = tag_of(h);
        let mut b = l.main_bucket_off(h);
        let mut hops = 0;
        loop {
            let bucket: [u64; 8] = self
                .read(ctx, t, b, LINE as usize, |buf| {
                    std::array::from_fn(|i| {
                        u64::from_ne_bytes(buf[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]))
                    })
                })
                .await?;
            let mut m = tag_matches(bucket[0], bucket[1], tag);
            while m != 0 {
                let s = m.trailing_zeros() as usize;
                m &= m - 1;
                let Some(off) = l.item_off(slot_ref(bucket[2 + s / 2], s)) else {
                    continue;
                };
                if let Some(version) = self.read_item(ctx, t, &shape, off, key, out).await? {
                    if let Some(c) = cache {
                        let loc = Loc {
                            node: t.region.node,
                            region: t.region.id,
                            offset: off,
                        };
                        c.insert(t.table_id, key, loc);
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

    /// One signaled CAS of the item header at `offset`; returns the old word.
    async fn cas(
        &self,
        ctx: &Ctx,
        t: &TableDesc,
        offset: u64,
        expected: u64,
        new: u64,
    ) -> Result<u64, RemoteError> {
        self.check_desc(ctx, t)?;
        if t.layout.item_at(offset).is_none() {
            return Err(bad("offset is not an item"));
        }
        let h = ctx.queue_cas(t.region.at(offset), expected, new, true)?;
        flush(ctx, &[]).await?;
        Ok(ctx.atomic_result(h)?)
    }

    /// Locks the item at `offset` for `owner` with a one-sided CAS if it is still
    /// unlocked at `version` (the CAS installs lock bit, owner and version in one word,
    /// see [`Header`]). Returns whether the lock was taken.
    pub async fn lock(
        &self,
        ctx: &Ctx,
        t: &TableDesc,
        offset: u64,
        version: u64,
        owner: LockOwner,
    ) -> Result<bool, RemoteError> {
        let (old, new) = (Header::unlocked(version), Header::locked(version, owner));
        Ok(self.cas(ctx, t, offset, old, new).await? == old)
    }

    /// Releases a lock `owner` took with [`RemoteReader::lock`] without changing the
    /// item. Returns whether it was released: the CAS fails, changing nothing, if
    /// `owner` does not hold it at `version`.
    pub async fn unlock(
        &self,
        ctx: &Ctx,
        t: &TableDesc,
        offset: u64,
        version: u64,
        owner: LockOwner,
    ) -> Result<bool, RemoteError> {
        let (old, new) = (Header::locked(version, owner), Header::unlocked(version));
        Ok(self.cas(ctx, t, offset, old, new).await? == old)
    }

    /// Writes `val` into an item `owner` holds locked at `version` and releases it with
    /// version + 2, as one batch on one queue, in order like the local write protocol:
    /// chunk versions to MARKER, then key, data and new chunk versions in ascending
    /// order (unsignaled WRITEs), then the release (signaled: its completion confirms
    /// the others, passive ACK). Returns the new version.
    ///
    /// The release is a CAS from the locked word, not a WRITE of the new header: a
    /// reliable connection may execute a retransmitted WRITE twice (RDMA re-executes
    /// duplicate READ/WRITE requests; the `sim` backend does too), and a second header
    /// WRITE landing after another node locked the item would erase that lock. Atomics
    /// are never re-executed. A release that does not find the lock held reports
    /// [`RemoteError::NotLocked`] (the data WRITEs went through: the caller broke the
    /// protocol by writing an item it did not hold).
    #[allow(clippy::too_many_arguments)]
    pub async fn write_unlock(
        &self,
        ctx: &Ctx,
        t: &TableDesc,
        offset: u64,
        key: u64,
        version: u64,
        owner: LockOwner,
        val: &[u8],
    ) -> Result<u64, RemoteError> {
        let shape = self.check_desc(ctx, t)?;
        if val.len() != shape.value_size {
            return Err(bad("value size differs from the table's"));
        }
        if t.layout.item_at(offset).is_none() {
            return Err(bad("offset is not an item"));
        }
        let nv = Header::bump(version, 2);
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
        // Checked above: no operation of the batch can be refused when queued.
        let mut ops: Vec<OpHandle> = Vec::with_capacity(shape.versions.len() + 2);
        for &c in &shape.versions {
            let at = t.region.at(offset + 8 * c as u64);
            ops.push(ctx.queue_write(at, &MARKER.to_ne_bytes(), false)?);
        }
        ops.push(ctx.queue_write(t.region.at(offset + 8), &img[8..], false)?);
        let held = Header::locked(version, owner);
        let release = ctx.queue_cas(t.region.at(offset), held, nv, true)?;
        flush(ctx, &ops).await?;
        for h in ops {
            ctx.op_result(h)?;
        }
        let found = ctx.atomic_result(release)?;
        if found != held {
            return Err(RemoteError::NotLocked { found });
        }
        Ok(nv)
    }
}
