//! # ambidex-transport-shm: nodes are processes of one host
//!
//! Every node is a process; receive rings, registered regions, region tables and node
//! counters are files of a *cluster directory* (by default under `/dev/shm`), mapped
//! shared by every process that needs them. It is the `local` backend with mapped files
//! instead of anonymous memory:
//!
//! - a datagram is a record written by the sender into its own single-producer ring inside
//!   the receiver's receive block (FaRM §2's messaging rings); the doorbell is one release
//!   store of the ring's tail plus a futex event count;
//! - a one-sided operation is performed by the *initiator*, on its own mapping of the
//!   target's region file, through [`ambidex_transport::onesided::execute`]: the target's
//!   CPU is really bypassed and CAS/FAA are real atomics on the shared word;
//! - the epoch fence ([`ambidex_transport::fence`], `docs/transport.md`): an initiator
//!   announces itself in its slot of the target's fence file and backs out with
//!   [`AccessError::EpochChanged`] if the target node moved to a newer epoch than its
//!   own; an owner's `set_epoch` raises the node's epoch, then waits for initiators of
//!   older epochs still inside. It never gives up on a live one; the slot of a process
//!   that died inside is reclaimed (`fence_reclaimed`): its node was reopened or closed
//!   since (the slot's tag is the writer's generation), or nobody holds the node's
//!   `.live` lock any more.
//!
//! ## Directory layout
//!
//! | file                       | written by            | content                                   |
//! |----------------------------|-----------------------|-------------------------------------------|
//! | `cluster.json`             | [`ShmCluster::create`]| the [`ClusterConfig`], written once        |
//! | `rx-<node>-<thread>`       | create; senders       | a [`RxBlock`]: one ring per sending endpoint|
//! | `node-<node>.regions`      | the node's process    | region table: header + [`MAX_REGIONS`] entries |
//! | `node-<node>.counters`     | the node; initiators  | node counters (initiators count violations)|
//! | `node-<node>.lock`         | the node's process    | `flock`ed while the node is open           |
//! | `node-<node>.live`         | the node's process    | shared `flock` while open: tells it is alive|
//! | `node-<node>.fence`        | the node; initiators  | epoch fence: the node's epoch + a slot per endpoint|
//! | `region-<node>-<gen>-<id>` | the node's process    | the bytes of one registered region         |
//!
//! ## Trust
//!
//! Every byte read from the directory is untrusted: a process may be killed at any
//! instruction, and a faulty one may write anything. Rings are validated by
//! [`RxConsumer`](ambidex_transport::ring::RxConsumer). Region-table entries are read with a sequence check and validated
//! (generation, id, permission bits, length, key, size of the region file) before a
//! region file is mapped; anything wrong is [`AccessError::UnknownRegion`]. Files are
//! mapped only after checking that they are large enough, so no access can fault.
//! (Truncating a file *after* others mapped it is outside this model: the kernel would
//! raise SIGBUS. Nothing in this crate ever shrinks a file.)
//!
//! ## Restart
//!
//! A node is open in at most one process at a time (an exclusive `flock`, released by the
//! kernel when the process dies). Reopening a node resumes its receive rings where they
//! stood and starts a new *generation* of its region table: every region of the previous
//! process is gone (initiators see `UnknownRegion`, or `BadKey` once the id is reused, as
//! after a NIC reset invalidates its rkeys) and its files are deleted. Closing a node
//! (dropping every handle to it) does the same.
//!
//! Known limit: a sender killed between reserving room in a receive queue and publishing
//! leaks that reservation (at most one batch) from the receiver's `recv_depth`.

use ambidex_transport::counters::{Counter, CounterSnapshot, Counters};
use ambidex_transport::fence::{self, Fence, FenceSlot};
use ambidex_transport::onesided;
use ambidex_transport::region::{random_key, Mapping, Region, RegionMemory};
use ambidex_transport::ring::{self, RxBlock};
use ambidex_transport::ring_endpoint::RingEndpoint;
use ambidex_transport::wait::Scope;
use ambidex_transport::*;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::marker::PhantomData;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Most regions one node may register per generation (the size of its region table).
pub const MAX_REGIONS: usize = 4096;
/// Largest region accepted from a region table (a sanity bound on untrusted lengths).
pub const MAX_REGION_LEN: u64 = 1 << 40;

const CLUSTER_FILE: &str = "cluster.json";
const MAX_CLUSTER_FILE: u64 = 64 * 1024;
const TABLE_MAGIC: u64 = 0x616d_6278_7462_0001; // "ambxtb" v1
const COUNTERS_MAGIC: u64 = 0x616d_6278_6374_0001; // "ambxct" v1
const FENCE_MAGIC: u64 = 0x616d_6278_6665_0001; // "ambxfe" v1

fn rx_name(node: NodeId, thread: ThreadId) -> String {
    format!("rx-{node}-{thread}")
}
fn table_name(node: NodeId) -> String {
    format!("node-{node}.regions")
}
fn counters_name(node: NodeId) -> String {
    format!("node-{node}.counters")
}
fn lock_name(node: NodeId) -> String {
    format!("node-{node}.lock")
}
fn fence_name(node: NodeId) -> String {
    format!("node-{node}.fence")
}
fn live_name(node: NodeId) -> String {
    format!("node-{node}.live")
}
fn region_name(node: NodeId, gen: u64, id: RegionId) -> String {
    format!("region-{node}-{gen}-{id}")
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> TransportError {
    TransportError::Io(format!("{what} {}: {e}", path.display()))
}

// ---- shared structures ------------------------------------------------------------------

/// A `#[repr(C)]` structure of atomics living at the start of a shared mapping.
struct Shm<T> {
    map: Arc<Mapping>,
    _t: PhantomData<T>,
}

impl<T> Clone for Shm<T> {
    fn clone(&self) -> Self {
        Shm {
            map: self.map.clone(),
            _t: PhantomData,
        }
    }
}

/// Marker for types made only of atomics and padding: every bit pattern is valid.
/// # Safety
/// Implementors must be `#[repr(C)]` structures of atomics (any bytes are a valid value).
unsafe trait AnyBits {}

impl<T: AnyBits> Shm<T> {
    fn new(map: Arc<Mapping>) -> Result<Shm<T>, TransportError> {
        if map.len() < std::mem::size_of::<T>() {
            return Err(TransportError::Io(
                "shared file smaller than its layout".into(),
            ));
        }
        Ok(Shm {
            map,
            _t: PhantomData,
        })
    }

    /// Stores zero in every word (atomically: other processes may be adding).
    fn zero(&self) {
        let p = self.map.as_ptr() as *const AtomicU64;
        for i in 0..std::mem::size_of::<T>() / 8 {
            // SAFETY: within the checked length, 8-aligned (page-aligned base).
            unsafe { (*p.add(i)).store(0, Ordering::Relaxed) };
        }
    }

    fn get(&self) -> &T {
        // SAFETY: the mapping is page aligned and large enough (checked in new), lives as
        // long as self, and T is valid for any bytes (AnyBits).
        unsafe { &*(self.map.as_ptr() as *const T) }
    }
}

#[repr(C)]
struct TableHeader {
    magic: AtomicU64,
    cluster_id: AtomicU64,
    node: AtomicU64,
    max_regions: AtomicU64,
    /// Bumped by every process that opens the node; entries of other generations are dead.
    gen: AtomicU64,
    _pad: [AtomicU64; 3],
}

/// One region-table entry, written by the owner with a sequence protocol: `state` is 0
/// while the fields change and the generation once they are valid.
#[repr(C)]
struct TableEntry {
    state: AtomicU64,
    id: AtomicU64,
    len: AtomicU64,
    key: AtomicU64,
    perms: AtomicU64,
    _pad: [AtomicU64; 3],
}

#[repr(C)]
struct TableLayout {
    header: TableHeader,
    entries: [TableEntry; MAX_REGIONS],
}
// SAFETY: atomics only.
unsafe impl AnyBits for TableLayout {}

#[repr(C)]
struct CountersLayout {
    magic: AtomicU64,
    cluster_id: AtomicU64,
    node: AtomicU64,
    _pad: [AtomicU64; 5],
    counters: Counters,
}
// SAFETY: atomics only (Counters is a repr(C) array of AtomicU64).
unsafe impl AnyBits for CountersLayout {}

type Table = Shm<TableLayout>;
type NodeCounters = Shm<CountersLayout>;

/// The header of a node's fence file; one [`FenceSlot`] per endpoint of the cluster
/// follows it (see [`ambidex_transport::fence`]).
#[repr(C)]
struct FenceHeader {
    magic: AtomicU64,
    cluster_id: AtomicU64,
    node: AtomicU64,
    slots: AtomicU64,
    /// The node's epoch: the newest any of its endpoints moved to.
    epoch: AtomicU64,
    _pad: [AtomicU64; 3],
}
// SAFETY: atomics only.
unsafe impl AnyBits for FenceHeader {}

const FENCE_HEADER_LEN: usize = std::mem::size_of::<FenceHeader>();

fn fence_len(slots: usize) -> usize {
    FENCE_HEADER_LEN + slots * std::mem::size_of::<FenceSlot>()
}

/// A node's fence file, mapped.
struct FenceFile {
    hdr: Shm<FenceHeader>,
    slots: usize,
}

impl FenceFile {
    /// Maps a fence file of `slots` slots (`map` is at least `fence_len(slots)` long).
    fn new(map: Arc<Mapping>, slots: usize) -> Result<FenceFile, TransportError> {
        if map.len() < fence_len(slots) {
            return Err(TransportError::Io(
                "fence file smaller than its layout".into(),
            ));
        }
        Ok(FenceFile {
            hdr: Shm::new(map)?,
            slots,
        })
    }

    #[inline]
    fn fence(&self) -> Fence<'_> {
        // SAFETY: the mapping is page aligned and holds `slots` slots after the header
        // (checked in new) and lives as long as self; a FenceSlot is an atomic, valid
        // for any bytes.
        let slots = unsafe {
            std::slice::from_raw_parts(
                self.hdr.map.as_ptr().add(FENCE_HEADER_LEN) as *const FenceSlot,
                self.slots,
            )
        };
        Fence {
            epoch: &self.hdr.get().epoch,
            slots,
        }
    }

    fn format(&self, cluster_id: u64, node: NodeId, epoch: u32) {
        let h = self.hdr.get();
        h.cluster_id.store(cluster_id, Ordering::Relaxed);
        h.node.store(node as u64, Ordering::Relaxed);
        h.slots.store(self.slots as u64, Ordering::Relaxed);
        h.epoch.store(epoch as u64, Ordering::SeqCst);
        h.magic.store(FENCE_MAGIC, Ordering::Release);
    }

    fn check(&self, cluster_id: u64, node: NodeId) -> bool {
        let h = self.hdr.get();
        h.magic.load(Ordering::Acquire) == FENCE_MAGIC
            && h.cluster_id.load(Ordering::Relaxed) == cluster_id
            && h.node.load(Ordering::Relaxed) == node as u64
            && h.slots.load(Ordering::Relaxed) == self.slots as u64
    }
}

/// The tag an incarnation of a node writes in fence slots: its generation.
fn gen_tag(gen: u64) -> u32 {
    (gen & 0x7fff_ffff) as u32
}

impl Table {
    fn format(&self, cluster_id: u64, node: NodeId) {
        let h = &self.get().header;
        h.cluster_id.store(cluster_id, Ordering::Relaxed);
        h.node.store(node as u64, Ordering::Relaxed);
        h.max_regions.store(MAX_REGIONS as u64, Ordering::Relaxed);
        h.magic.store(TABLE_MAGIC, Ordering::Release);
    }

    fn check(&self, cluster_id: u64, node: NodeId) -> bool {
        let h = &self.get().header;
        h.magic.load(Ordering::Acquire) == TABLE_MAGIC
            && h.cluster_id.load(Ordering::Relaxed) == cluster_id
            && h.node.load(Ordering::Relaxed) == node as u64
            && h.max_regions.load(Ordering::Relaxed) == MAX_REGIONS as u64
    }

    #[inline]
    fn gen(&self) -> u64 {
        self.get().header.gen.load(Ordering::Acquire)
    }

    /// Owner only: makes `desc` visible to initiators under generation `gen`.
    fn publish(&self, gen: u64, desc: &RegionDesc) {
        let e = &self.get().entries[desc.id as usize];
        e.state.store(0, Ordering::Relaxed);
        fence(Ordering::Release);
        e.id.store(desc.id as u64, Ordering::Relaxed);
        e.len.store(desc.len, Ordering::Relaxed);
        e.key.store(desc.key, Ordering::Relaxed);
        e.perms.store(desc.perms.0 as u64, Ordering::Relaxed);
        e.state.store(gen, Ordering::Release);
    }

    /// Reads and validates entry `id` of generation `gen`: (len, key, perms).
    fn lookup(&self, gen: u64, id: RegionId) -> Option<(u64, u64, Perms)> {
        let e = self.get().entries.get(id as usize)?;
        let s1 = e.state.load(Ordering::Acquire);
        if gen == 0 || s1 != gen {
            return None;
        }
        let (eid, len, key, perms) = (
            e.id.load(Ordering::Relaxed),
            e.len.load(Ordering::Relaxed),
            e.key.load(Ordering::Relaxed),
            e.perms.load(Ordering::Relaxed),
        );
        fence(Ordering::Acquire);
        if e.state.load(Ordering::Relaxed) != s1 {
            return None; // changed while we read it
        }
        if eid != id as u64
            || len > MAX_REGION_LEN
            || key == 0
            || perms & !(Perms::ALL.0 as u64) != 0
        {
            return None;
        }
        Some((len, key, Perms(perms as u8)))
    }
}

impl NodeCounters {
    fn format(&self, cluster_id: u64, node: NodeId) {
        let c = self.get();
        c.cluster_id.store(cluster_id, Ordering::Relaxed);
        c.node.store(node as u64, Ordering::Relaxed);
        c.magic.store(COUNTERS_MAGIC, Ordering::Release);
    }

    fn check(&self, cluster_id: u64, node: NodeId) -> bool {
        let c = self.get();
        c.magic.load(Ordering::Acquire) == COUNTERS_MAGIC
            && c.cluster_id.load(Ordering::Relaxed) == cluster_id
            && c.node.load(Ordering::Relaxed) == node as u64
    }
}

// ---- files ------------------------------------------------------------------------------

fn open_rw(path: &Path, create: bool) -> Result<File, TransportError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .mode(0o600)
        .open(path)
        .map_err(|e| io_err("cannot open", path, e))
}

/// Maps the first `len` bytes of `file`, refusing files too small for them (touching a
/// mapped page past the end of a file raises SIGBUS).
fn map_file(file: &File, path: &Path, len: usize) -> Result<Arc<Mapping>, TransportError> {
    let size = file
        .metadata()
        .map_err(|e| io_err("cannot stat", path, e))?
        .len();
    if size < len as u64 {
        return Err(TransportError::Io(format!(
            "{} holds {size} bytes, {len} expected",
            path.display()
        )));
    }
    Ok(Arc::new(Mapping::shared_file(file.as_raw_fd(), len)?))
}

/// Creates (or re-creates) a zero-filled file of `len` bytes and maps it.
fn create_zeroed(path: &Path, len: usize) -> Result<Arc<Mapping>, TransportError> {
    let f = open_rw(path, true)?;
    // Truncating to 0 first zeroes leftovers of an interrupted create.
    f.set_len(0)
        .and_then(|_| f.set_len(len as u64))
        .map_err(|e| io_err("cannot size", path, e))?;
    map_file(&f, path, len)
}

fn read_config(dir: &Path) -> Result<ClusterConfig, TransportError> {
    let path = dir.join(CLUSTER_FILE);
    let f = File::open(&path).map_err(|e| io_err("cannot open cluster file", &path, e))?;
    let mut buf = Vec::new();
    f.take(MAX_CLUSTER_FILE)
        .read_to_end(&mut buf)
        .map_err(|e| io_err("cannot read", &path, e))?;
    let config: ClusterConfig = serde_json::from_slice(&buf).map_err(|e| {
        TransportError::Config(format!("{} is not a cluster file: {e}", path.display()))
    })?;
    config.validate()?;
    Ok(config)
}

/// Creating and removing cluster directories.
pub struct ShmCluster;

impl ShmCluster {
    /// The default directory of a cluster: under `/dev/shm` (memory, not disk) when it
    /// exists, named after the cluster id and the user.
    pub fn default_dir(cluster_id: u64) -> PathBuf {
        let base = Path::new("/dev/shm");
        let base = if base.is_dir() {
            base.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        base.join(format!("ambidex-{cluster_id:016x}-{uid}"))
    }

    /// Creates the cluster directory `dir` and every file of `config`'s nodes. Idempotent:
    /// succeeds without touching anything if `dir` already holds the same configuration,
    /// fails if it holds another. Call before starting any node.
    pub fn create(dir: &Path, config: &ClusterConfig) -> Result<(), TransportError> {
        config.validate()?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| io_err("cannot create cluster directory", dir, e))?;
        let cluster_file = dir.join(CLUSTER_FILE);
        if cluster_file.exists() {
            let existing = read_config(dir)?;
            if existing != *config {
                return Err(TransportError::Config(format!(
                    "{} already holds another cluster ({existing:?})",
                    dir.display()
                )));
            }
            return Ok(());
        }
        let senders = config.endpoints();
        let ring_bytes = ring::ring_bytes_for(config.mtu, config.recv_depth);
        for n in 0..config.nodes {
            for t in 0..config.threads_per_node {
                let map = create_zeroed(
                    &dir.join(rx_name(n, t)),
                    RxBlock::layout_len(senders, ring_bytes),
                )?;
                RxBlock::init(map, config.cluster_id, senders, ring_bytes);
            }
            let table: Table = Shm::new(create_zeroed(
                &dir.join(table_name(n)),
                std::mem::size_of::<TableLayout>(),
            )?)?;
            table.format(config.cluster_id, n);
            let counters: NodeCounters = Shm::new(create_zeroed(
                &dir.join(counters_name(n)),
                std::mem::size_of::<CountersLayout>(),
            )?)?;
            counters.format(config.cluster_id, n);
            let path = dir.join(fence_name(n));
            let f = FenceFile::new(create_zeroed(&path, fence_len(senders))?, senders)?;
            f.format(config.cluster_id, n, config.epoch);
        }
        // The cluster file comes last and atomically: a directory without one is an
        // interrupted create, which nobody opens and a new create redoes.
        let tmp = dir.join(format!("{CLUSTER_FILE}.tmp"));
        let json =
            serde_json::to_vec_pretty(config).map_err(|e| TransportError::Config(e.to_string()))?;
        {
            use std::io::Write;
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(|e| io_err("cannot write", &tmp, e))?;
            f.write_all(&json)
                .map_err(|e| io_err("cannot write", &tmp, e))?;
        }
        std::fs::rename(&tmp, &cluster_file).map_err(|e| io_err("cannot write", &cluster_file, e))
    }

    /// Removes a cluster directory made by [`ShmCluster::create`]: only the files this
    /// backend names, then the directory (which fails if anything else is in it).
    /// Processes that still map the files keep their memory until they unmap it.
    pub fn remove(dir: &Path) -> Result<(), TransportError> {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_err("cannot list", dir, e)),
        };
        // Listed first, deleted after: unlinking while reading a directory may skip entries.
        let paths: Vec<PathBuf> = entries
            .flatten()
            .filter(|entry| {
                let name = entry.file_name();
                let name = name.to_string_lossy();
                name.starts_with(CLUSTER_FILE)
                    || name.starts_with("rx-")
                    || name.starts_with("node-")
                    || name.starts_with("region-")
            })
            .map(|entry| entry.path())
            .collect();
        for p in paths {
            let _ = std::fs::remove_file(p);
        }
        std::fs::remove_dir(dir).map_err(|e| io_err("cannot remove", dir, e))
    }
}

// ---- a node -----------------------------------------------------------------------------

/// State of one open node, shared by its endpoints.
struct NodeShared {
    dir: PathBuf,
    config: ClusterConfig,
    node: NodeId,
    /// This process's generation of the node's region table.
    gen: u64,
    ring_bytes: usize,
    /// Every endpoint's receive block, attached on first use.
    blocks: Vec<OnceLock<RxBlock>>,
    /// Every node's region table and counters, attached on first use (own: at open).
    tables: Vec<OnceLock<Table>>,
    counters: Vec<OnceLock<NodeCounters>>,
    /// Every node's epoch fence, attached on first use (own: at open).
    fences: Vec<OnceLock<FenceFile>>,
    /// This node's regions, indexed by id; append-only so lookups take no lock.
    regions: Box<[OnceLock<Region>]>,
    next_region: AtomicU32,
    taken: Vec<AtomicBool>,
    /// Remote regions mapped by this process, shared by its endpoints' caches.
    mapped: Mutex<HashMap<(NodeId, u64, RegionId), Region>>,
    /// Holds the node's exclusive flock while open.
    _lock: File,
    /// Holds a shared flock on `node-<n>.live` while open: an owner that can lock it
    /// exclusively knows that no process of the node can run any more (see `slot_dead`).
    _live: File,
}

impl NodeShared {
    fn block(&self, idx: usize) -> Result<&RxBlock, TransportError> {
        let cell = &self.blocks[idx];
        if let Some(b) = cell.get() {
            return Ok(b);
        }
        let t = self.config.threads_per_node;
        let (n, th) = ((idx / t as usize) as NodeId, (idx % t as usize) as ThreadId);
        let path = self.dir.join(rx_name(n, th));
        let senders = self.config.endpoints();
        let map = map_file(
            &open_rw(&path, false)?,
            &path,
            RxBlock::layout_len(senders, self.ring_bytes),
        )?;
        let b = RxBlock::attach(map, self.config.cluster_id, senders, self.ring_bytes)
            .map_err(|e| TransportError::Io(format!("{}: {e}", path.display())))?;
        let _ = cell.set(b);
        Ok(cell.get().expect("just set"))
    }

    #[inline]
    fn table(&self, n: NodeId) -> Option<&Table> {
        let cell = self.tables.get(n as usize)?;
        match cell.get() {
            Some(t) => Some(t),
            None => self.attach_table(n, cell),
        }
    }

    #[cold]
    fn attach_table<'a>(&self, n: NodeId, cell: &'a OnceLock<Table>) -> Option<&'a Table> {
        let path = self.dir.join(table_name(n));
        let file = open_rw(&path, false).ok()?;
        let t: Table =
            Shm::new(map_file(&file, &path, std::mem::size_of::<TableLayout>()).ok()?).ok()?;
        if !t.check(self.config.cluster_id, n) {
            return None;
        }
        let _ = cell.set(t);
        cell.get()
    }

    fn node_counters(&self, n: NodeId) -> Option<&Counters> {
        let cell = self.counters.get(n as usize)?;
        if let Some(c) = cell.get() {
            return Some(&c.get().counters);
        }
        let path = self.dir.join(counters_name(n));
        let file = open_rw(&path, false).ok()?;
        let c: NodeCounters =
            Shm::new(map_file(&file, &path, std::mem::size_of::<CountersLayout>()).ok()?).ok()?;
        if !c.check(self.config.cluster_id, n) {
            return None;
        }
        let _ = cell.set(c);
        cell.get().map(|c| &c.get().counters)
    }

    #[inline]
    fn fence(&self, n: NodeId) -> Option<&FenceFile> {
        let cell = self.fences.get(n as usize)?;
        match cell.get() {
            Some(f) => Some(f),
            None => self.attach_fence(n, cell),
        }
    }

    #[cold]
    fn attach_fence<'a>(&self, n: NodeId, cell: &'a OnceLock<FenceFile>) -> Option<&'a FenceFile> {
        let path = self.dir.join(fence_name(n));
        let file = open_rw(&path, false).ok()?;
        let slots = self.config.endpoints();
        let f = FenceFile::new(map_file(&file, &path, fence_len(slots)).ok()?, slots).ok()?;
        if !f.check(self.config.cluster_id, n) {
            return None;
        }
        let _ = cell.set(f);
        cell.get()
    }

    /// Whether the initiator that stored `v` in slot `slot` of this node's fence can no
    /// longer access memory: its node's process is gone. Either the node was reopened or
    /// closed since (its generation differs from the slot's tag; a node is reopened only
    /// once its previous process released its lock, so exited), or nobody holds the
    /// node's `.live` lock (the kernel releases it when the process exits, after the
    /// process's memory is gone). Asked only about slots that stay busy.
    fn slot_dead(&self, slot: usize, v: u64) -> bool {
        let t = self.config.threads_per_node as usize;
        let n = (slot / t) as NodeId;
        if n == self.node {
            return fence::slot_tag(v) != gen_tag(self.gen);
        }
        if let Some(table) = self.table(n) {
            if fence::slot_tag(v) != gen_tag(table.gen()) {
                return true;
            }
        }
        let Ok(f) = open_rw(&self.dir.join(live_name(n)), false) else {
            // No liveness file: the node never opened with this version; its process
            // cannot be told dead, so it is waited for.
            return false;
        };
        // SAFETY: flock on a valid descriptor; the lock goes with the file on return.
        unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
    }

    #[inline]
    fn own_region(&self, id: RegionId) -> Option<&Region> {
        self.regions.get(id as usize)?.get()
    }

    /// Maps region `id` of node `n` as described by generation `gen` of its table.
    fn map_region(&self, table: &Table, n: NodeId, gen: u64, id: RegionId) -> Option<Region> {
        let (len, key, perms) = table.lookup(gen, id)?;
        let mut mapped = self.mapped.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = mapped.get(&(n, gen, id)) {
            return Some(r.clone());
        }
        let path = self.dir.join(region_name(n, gen, id));
        let file = open_rw(&path, false).ok()?;
        let map = map_file(&file, &path, len as usize).ok()?;
        let region = Region {
            desc: RegionDesc {
                node: n,
                id,
                len,
                key,
                perms,
            },
            mem: RegionMemory::new(map, 0, len as usize),
        };
        // Regions of dead generations are never looked up again: drop their mappings.
        mapped.retain(|k, _| k.0 != n || k.1 == gen);
        mapped.insert((n, gen, id), region.clone());
        Some(region)
    }
}

impl Drop for NodeShared {
    /// Closing a node unregisters its regions, as its death would: a new generation
    /// makes every entry dead for initiators, and the files go.
    fn drop(&mut self) {
        if let Some(t) = self.tables[self.node as usize].get() {
            let mut gen = self.gen.wrapping_add(1);
            if gen == 0 {
                gen = 1;
            }
            t.get().header.gen.store(gen, Ordering::Release);
        }
        remove_region_files(&self.dir, self.node);
    }
}

fn remove_region_files(dir: &Path, node: NodeId) {
    let prefix = format!("region-{node}-");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    // Listed first, deleted after: unlinking while reading a directory may skip entries.
    let paths: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect();
    for p in paths {
        let _ = std::fs::remove_file(p);
    }
}

/// A node of a shared-memory cluster, open in this process.
pub struct ShmNode {
    shared: Arc<NodeShared>,
}

impl ShmNode {
    /// Opens node `node` of the cluster in `dir` (made by [`ShmCluster::create`]). Fails
    /// if another live process has it open. Reopening after the previous process died
    /// resumes its receive rings and starts a new generation of its regions.
    pub fn open(dir: &Path, node: NodeId) -> Result<SharedNode, TransportError> {
        Ok(Arc::new(Self::open_node(dir, node)?))
    }

    /// As [`ShmNode::open`], returning the concrete type.
    pub fn open_node(dir: &Path, node: NodeId) -> Result<ShmNode, TransportError> {
        let config = read_config(dir)?;
        if node >= config.nodes {
            return Err(TransportError::Config(format!(
                "node {node} is not in the cluster of {} nodes",
                config.nodes
            )));
        }
        let lock_path = dir.join(lock_name(node));
        let lock = open_rw(&lock_path, true)?;
        // SAFETY: flock on a valid descriptor.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(TransportError::Config(format!(
                "node {node} of {} is already open in another process",
                dir.display()
            )));
        }
        let cid = config.cluster_id;

        // Own counters: kept across restarts; reformatted if unrecognisable.
        let path = dir.join(counters_name(node));
        let file = open_rw(&path, true)?;
        let clen = std::mem::size_of::<CountersLayout>();
        if file.metadata().map(|m| m.len()).unwrap_or(0) < clen as u64 {
            file.set_len(clen as u64)
                .map_err(|e| io_err("cannot size", &path, e))?;
        }
        let counters: NodeCounters = Shm::new(map_file(&file, &path, clen)?)?;
        if !counters.check(cid, node) {
            counters.zero();
            counters.format(cid, node);
        }

        // Own region table: a new generation, every previous entry dead.
        let path = dir.join(table_name(node));
        let file = open_rw(&path, true)?;
        let tlen = std::mem::size_of::<TableLayout>();
        if file.metadata().map(|m| m.len()).unwrap_or(0) < tlen as u64 {
            file.set_len(tlen as u64)
                .map_err(|e| io_err("cannot size", &path, e))?;
        }
        let table: Table = Shm::new(map_file(&file, &path, tlen)?)?;
        table.format(cid, node);
        let mut gen = table.gen().wrapping_add(1);
        if gen == 0 {
            gen = 1;
        }
        for e in table.get().entries.iter() {
            e.state.store(0, Ordering::Relaxed);
        }
        table.get().header.gen.store(gen, Ordering::Release);
        // Region files of previous generations: their process is gone.
        remove_region_files(dir, node);

        // Own fence: the epoch restarts at the configuration's; slots are left alone
        // (initiators may be inside, on the previous generation's regions). Created if
        // the cluster directory predates fences.
        let path = dir.join(fence_name(node));
        let file = open_rw(&path, true)?;
        let slots = config.endpoints();
        let flen = fence_len(slots);
        if file.metadata().map(|m| m.len()).unwrap_or(0) < flen as u64 {
            file.set_len(flen as u64)
                .map_err(|e| io_err("cannot size", &path, e))?;
        }
        let own_fence = FenceFile::new(map_file(&file, &path, flen)?, slots)?;
        own_fence.format(cid, node, config.epoch);
        let live_path = dir.join(live_name(node));
        let live = open_rw(&live_path, true)?;
        // Blocking: an owner checking whether this node is dead holds it only briefly.
        // SAFETY: flock on a valid descriptor.
        if unsafe { libc::flock(live.as_raw_fd(), libc::LOCK_SH) } != 0 {
            return Err(io_err(
                "cannot lock",
                &live_path,
                std::io::Error::last_os_error(),
            ));
        }

        let tables: Vec<OnceLock<Table>> = (0..config.nodes).map(|_| OnceLock::new()).collect();
        let _ = tables[node as usize].set(table);
        let node_counters: Vec<OnceLock<NodeCounters>> =
            (0..config.nodes).map(|_| OnceLock::new()).collect();
        let _ = node_counters[node as usize].set(counters);
        let fences: Vec<OnceLock<FenceFile>> = (0..config.nodes).map(|_| OnceLock::new()).collect();
        let _ = fences[node as usize].set(own_fence);
        let shared = NodeShared {
            dir: dir.to_path_buf(),
            node,
            gen,
            ring_bytes: ring::ring_bytes_for(config.mtu, config.recv_depth),
            blocks: (0..config.endpoints()).map(|_| OnceLock::new()).collect(),
            tables,
            counters: node_counters,
            fences,
            regions: (0..MAX_REGIONS).map(|_| OnceLock::new()).collect(),
            next_region: AtomicU32::new(0),
            taken: (0..config.threads_per_node)
                .map(|_| AtomicBool::new(false))
                .collect(),
            mapped: Mutex::new(HashMap::new()),
            _lock: lock,
            _live: live,
            config,
        };
        // This node owns its receive blocks: a header that no longer attaches (scribbled
        // over) is rewritten in place, rings untouched (the consumer validates those).
        // Fail now, not at the first endpoint, if one is still unusable.
        for t in 0..shared.config.threads_per_node {
            let idx = shared.config.endpoint_index(EndpointAddr::new(node, t));
            if shared.block(idx).is_err() {
                let path = dir.join(rx_name(node, t));
                let senders = shared.config.endpoints();
                let len = RxBlock::layout_len(senders, shared.ring_bytes);
                let map = map_file(&open_rw(&path, false)?, &path, len)?;
                RxBlock::init(map, cid, senders, shared.ring_bytes);
                shared.block(idx)?;
            }
        }
        Ok(ShmNode {
            shared: Arc::new(shared),
        })
    }

    /// The generation of this node's regions (bumped by every open).
    pub fn generation(&self) -> u64 {
        self.shared.gen
    }
}

impl NodeTransport for ShmNode {
    fn node(&self) -> NodeId {
        self.shared.node
    }

    fn config(&self) -> &ClusterConfig {
        &self.shared.config
    }

    fn register(&self, len: usize, perms: Perms) -> Result<Region, TransportError> {
        let sh = &*self.shared;
        if len as u64 > MAX_REGION_LEN {
            return Err(TransportError::Region(format!(
                "{len} bytes exceeds the largest region ({MAX_REGION_LEN})"
            )));
        }
        let id = sh.next_region.fetch_add(1, Ordering::Relaxed);
        let slot = sh.regions.get(id as usize).ok_or_else(|| {
            TransportError::Region(format!("more than {MAX_REGIONS} regions on one node"))
        })?;
        let path = sh.dir.join(region_name(sh.node, sh.gen, id));
        // A file of our own generation can only be a stray: replace it.
        let _ = std::fs::remove_file(&path);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| io_err("cannot create region file", &path, e))?;
        file.set_len(len.max(1) as u64)
            .map_err(|e| io_err("cannot size", &path, e))?;
        let map = map_file(&file, &path, len)?;
        let desc = RegionDesc {
            node: sh.node,
            id,
            len: len as u64,
            key: random_key(),
            perms,
        };
        let region = Region {
            desc,
            mem: RegionMemory::new(map, 0, len),
        };
        let _ = slot.set(region.clone());
        if let Some(t) = sh.tables[sh.node as usize].get() {
            t.publish(sh.gen, &desc);
        }
        Ok(region)
    }

    fn region(&self, id: RegionId) -> Option<Region> {
        self.shared.own_region(id).cloned()
    }

    fn endpoint(&self, thread: ThreadId) -> Result<Box<dyn Endpoint>, TransportError> {
        let sh = &self.shared;
        let cfg = &sh.config;
        let addr = EndpointAddr::new(sh.node, thread);
        if !cfg.contains(addr) {
            return Err(TransportError::UnknownDestination(addr));
        }
        if sh.taken[thread as usize].swap(true, Ordering::AcqRel) {
            return Err(TransportError::Config(format!(
                "endpoint {addr} already taken"
            )));
        }
        let block = match sh.block(cfg.endpoint_index(addr)) {
            Ok(b) => b.clone(),
            Err(e) => {
                sh.taken[thread as usize].store(false, Ordering::Release);
                return Err(e);
            }
        };
        Ok(Box::new(ShmEndpoint {
            ring: RingEndpoint::new(cfg, addr, block, Scope::Shared),
            remote: (0..cfg.nodes)
                .map(|_| RemoteCache {
                    gen: 0,
                    regions: Vec::new(),
                })
                .collect(),
            shared: sh.clone(),
        }))
    }

    fn counters(&self) -> CounterSnapshot {
        match self.shared.counters[self.shared.node as usize].get() {
            Some(c) => c.get().counters.snapshot(),
            None => CounterSnapshot::default(),
        }
    }
}

// ---- an endpoint ------------------------------------------------------------------------

/// An endpoint's cache of one remote node's mapped regions, valid for one generation.
struct RemoteCache {
    gen: u64,
    regions: Vec<Option<Region>>,
}

struct ShmEndpoint {
    ring: RingEndpoint,
    remote: Vec<RemoteCache>,
    shared: Arc<NodeShared>,
}

/// Region `id` of remote node `n`, from the endpoint's cache or freshly validated and
/// mapped. Costs one shared load (the table's generation) when cached.
#[inline]
fn remote_region<'a>(
    sh: &NodeShared,
    cache: &'a mut RemoteCache,
    n: NodeId,
    id: RegionId,
) -> Result<&'a Region, AccessError> {
    let table = sh.table(n).ok_or(AccessError::UnknownRegion)?;
    let gen = table.gen();
    if gen != cache.gen {
        // The node restarted: its old regions are gone.
        cache.regions.clear();
        cache.gen = gen;
    }
    let i = id as usize;
    if i >= MAX_REGIONS {
        return Err(AccessError::UnknownRegion);
    }
    let hit = matches!(cache.regions.get(i), Some(Some(_)));
    if !hit {
        let r = sh
            .map_region(table, n, gen, id)
            .ok_or(AccessError::UnknownRegion)?;
        if cache.regions.len() <= i {
            cache.regions.resize(i + 1, None);
        }
        cache.regions[i] = Some(r);
    }
    cache.regions[i].as_ref().ok_or(AccessError::UnknownRegion)
}

impl Endpoint for ShmEndpoint {
    ambidex_transport::delegate_to_ring_endpoint!();

    fn config(&self) -> &ClusterConfig {
        &self.shared.config
    }

    fn send(&mut self, batch: &[Datagram<'_>]) -> Result<(), TransportError> {
        let sh = &self.shared;
        // A receiver whose block is missing or corrupt: nothing can land there.
        self.ring
            .send(&sh.config, batch, |idx| sh.block(idx).ok().cloned())
    }

    fn set_epoch(&mut self, epoch: u32) {
        self.ring.epoch = epoch;
        let sh = &*self.shared;
        if let Some(f) = sh.fence(sh.node) {
            let r = f.fence().raise(epoch, |slot, v| sh.slot_dead(slot, v));
            self.ring.counters.add_owned(Counter::FenceWaits, r.waited);
            if let Some(c) = sh.node_counters(sh.node) {
                c.add(Counter::FenceReclaimed, r.reclaimed);
            }
        }
    }

    fn post(&mut self, ops: &[OneSidedOp<'_>]) -> Result<(), TransportError> {
        let sh = &*self.shared;
        let max = sh.config.max_onesided;
        let local = |id: RegionId| sh.own_region(id).map(|r| &r.mem);
        let slot = sh.config.endpoint_index(self.ring.addr);
        let (tag, epoch) = (gen_tag(sh.gen), self.ring.epoch);
        // The node whose fence this endpoint is inside (or was refused by): a run of
        // operations to one node enters it once.
        let mut fenced: Option<(NodeId, Result<Fence<'_>, AccessError>)> = None;
        for op in ops {
            let n = op.remote.node;
            let entry = if n >= sh.config.nodes {
                Err(AccessError::UnknownNode)
            } else {
                match fenced {
                    Some((f, entry)) if f == n => entry.map(|_| ()),
                    _ => {
                        if let Some((_, Ok(f))) = fenced {
                            f.leave(slot);
                        }
                        let entry = match sh.fence(n) {
                            // No usable fence file: none of the node's regions is usable.
                            None => Err(AccessError::UnknownRegion),
                            Some(f) if f.fence().enter(slot, tag, epoch) => Ok(f.fence()),
                            Some(_) => Err(AccessError::EpochChanged),
                        };
                        fenced = Some((n, entry));
                        entry.map(|_| ())
                    }
                }
            };
            let result = if let Err(e) = entry {
                Err(e)
            } else if n == sh.node {
                match sh.own_region(op.remote.region) {
                    None => Err(AccessError::UnknownRegion),
                    Some(r) => onesided::execute(r, &op.remote, &op.kind, max, &local),
                }
            } else {
                match remote_region(sh, &mut self.remote[n as usize], n, op.remote.region) {
                    Err(e) => Err(e),
                    Ok(r) => onesided::execute(r, &op.remote, &op.kind, max, &local),
                }
            };
            if let Some(e) = self.ring.complete(op, n, result) {
                // Counted at the target, as its NIC would.
                let c = match e {
                    AccessError::UnknownNode | AccessError::BadLocalBuffer => None,
                    AccessError::EpochChanged => Some(Counter::OnesidedEpochErrors),
                    _ => Some(Counter::RemoteAccessViolations),
                };
                if let (Some(c), Some(nc)) = (c, sh.node_counters(n)) {
                    nc.add(c, 1);
                }
            }
        }
        if let Some((_, Ok(f))) = fenced {
            f.leave(slot);
        }
        self.ring
            .counters
            .add_owned(Counter::OnesidedPosted, ops.len() as u64);
        Ok(())
    }
}
