//! One node's share of the database: a store table per registered table holding the keys
//! this node is primary or backup for (the operations on its items are in
//! [`crate::actions`]).
//!
//! Every stored value is prefixed by an 8-byte *transaction version*: the id of the
//! transaction that wrote it (unique over the cluster), with bit 63 marking a tombstone.
//! The store's own header version changes with every write too, but it is per item and
//! restarts when an item is recycled; the transaction version names the writer exactly,
//! so validation has no ABA problem and a recorded history gives the exact serialization
//! graph. Deletes leave tombstones so a key's versions form one chain; tombstones are
//! not collected yet (their number is bounded by the keys ever inserted).

use crate::error::{DbError, OutOfRoom, StartupCheckError, TableFull};
use crate::log_ring::{LogRegion, LogRingConfig};
use ambidex_cluster::{ConfigCell, Configuration, NodeState, Placement};
use ambidex_rpc::RpcError;
use ambidex_store::layout::MAGIC;
use ambidex_store::{
    Catalog, Header, LocationCache, LockOwner, LogRegionDesc, Table, TableConfig, TableDesc,
};
use ambidex_transport::{NodeId, NodeTransport, Perms, Region};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// Marks a tombstone in the transaction version word.
pub const TOMBSTONE: u64 = 1 << 63;
/// The transaction version of loaded data (the initial state, "T0" of a history).
pub const LOAD_VERSION: u64 = 1;
/// Bytes of the transaction version prefix of every stored value.
pub const META: usize = 8;

/// A table as the application declares it.
#[derive(Clone, Debug)]
pub struct TableSpec {
    pub id: u32,
    pub name: String,
    /// Every value of the table has exactly this many bytes.
    pub value_size: usize,
    /// Keys (primaries and backups) one node must hold; the store is sized from it.
    pub capacity_per_node: usize,
}

pub struct NodeDb {
    pub node: NodeId,
    /// The configuration this node runs in (its placement changes with the epoch) and
    /// the stage of its epoch, shared with the node's cluster agent.
    cluster: Arc<NodeState>,
    /// Node ids of the cluster and copies per key (fixed for its life).
    nodes: u16,
    replication: u16,
    tables: Vec<Option<(TableSpec, Table)>>,
    /// Every node's table and log region descriptors, set at start-up
    /// ([`NodeDb::set_catalog`]); a restarted node's entries are replaced when it
    /// rejoins ([`NodeDb::replace_in_catalog`]). Threads read it only to fill their own
    /// caches (`RemoteTables`, `RingWriters`), which they drop at every new epoch, so
    /// the lock is off the one-sided hot path.
    catalog: RwLock<Option<Arc<Catalog>>>,
    /// Set when this node has no launcher to hand it the catalog: its thread 0 asks
    /// the other nodes for their descriptors, for at most this long
    /// ([`NodeDb::fetch_catalog_at_start`]).
    catalog_exchange: Mutex<Option<std::time::Duration>>,
    /// One registered region per thread of this node: the destination of its
    /// coroutines' one-sided READs (the start-up check's and the one-sided phases').
    scratch: Vec<Region>,
    /// The start-up check's outcome: remote tables verified, or why it failed.
    verified: Mutex<Option<Result<usize, StartupCheckError>>>,
    /// Requests the handlers answered with `BadRequest` (malformed, unknown table, lock
    /// not held): counted drops of untrusted input.
    pub bad_requests: AtomicU64,
    /// Where remote items live, shared by the node's threads (DrTM+H §5.1): read and
    /// filled by the policies that use it ([`crate::Policy::uses_location_cache`]).
    pub location_cache: LocationCache,
    /// The rings other coordinators WRITE their commit records into (`Log::Write`).
    log_region: LogRegion,
    log_ring_config: LogRingConfig,
    /// The incarnation of the node this database serves (1 at start; a restarted node
    /// is a later one): its threads number their transactions from it.
    incarnation: AtomicU64,
}

/// The transaction version and value of a stored value (always `META` bytes or more:
/// every table stores `META + value_size`).
pub(crate) fn split_meta(buf: &[u8]) -> (u64, &[u8]) {
    let (m, v) = buf.split_at(META.min(buf.len()));
    let mut meta = [0u8; META];
    meta[..m.len()].copy_from_slice(m);
    (u64::from_le_bytes(meta), v)
}

/// Bytes of the superblock the start-up check reads (MAGIC, table id, layout length,
/// capacity).
pub const SUPERBLOCK: usize = 32;
/// How long the start-up check READs a superblock again after changes of epoch failed
/// it (the runtime's clock): a bound for a node that never catches up.
const EPOCH_RETRY_NS: u64 = 10_000_000_000;

/// Scratch bytes per coroutine for one-sided READs: one batch's READs (a TPC-C
/// NewOrder's items and buckets take about 12 KiB); a batch that needs more queues the
/// rest in the next round trip.
pub const SCRATCH_PER_WORKER: usize = 16 * 1024;
/// Coroutine ids (per thread) that get a scratch slice: the workers and the layer's own
/// coroutines (start-up check, committer). A coroutine beyond has no one-sided READs.
pub const SCRATCH_WORKERS: usize = 132;
/// Bounds of the location cache's entries: enough for every remote key of a small
/// database, at most 2^21 (about 64 MiB) per node.
const LOCATION_CACHE_MIN: usize = 64;
const LOCATION_CACHE_MAX: usize = 1 << 21;

impl NodeDb {
    /// The incarnation this database serves ([`NodeDb::set_incarnation`]; 1 by
    /// default).
    pub fn incarnation(&self) -> u64 {
        self.incarnation.load(Ordering::Relaxed)
    }

    /// A restarted node's database serves its new incarnation: set before its threads
    /// start, so that no transaction id repeats one of an earlier incarnation.
    pub fn set_incarnation(&self, incarnation: u64) {
        self.incarnation.store(incarnation, Ordering::Relaxed);
    }

    /// The database of `transport`'s node: every table in a region registered on it for
    /// READ, WRITE and atomics (with a fresh key), so other nodes can reach it
    /// one-sided through the descriptors ([`NodeDb::table_descs`]); and its log region
    /// with rings of the default size ([`LogRingConfig`]).
    pub fn new(
        transport: &dyn NodeTransport,
        placement: Placement,
        specs: &[TableSpec],
    ) -> Result<Arc<NodeDb>, DbError> {
        Self::with_log_rings(transport, placement, specs, LogRingConfig::default())
    }

    /// [`NodeDb::new`] with log rings of `rings` (their size is the same on every node
    /// of a cluster in practice; each coordinator uses the size its replica's
    /// descriptor gives).
    pub fn with_log_rings(
        transport: &dyn NodeTransport,
        placement: Placement,
        specs: &[TableSpec],
        rings: LogRingConfig,
    ) -> Result<Arc<NodeDb>, DbError> {
        let config = Configuration {
            epoch: transport.config().epoch,
            incarnations: vec![1; placement.nodes() as usize],
            placement,
        };
        Self::with_config(transport, config, specs, rings)
    }

    /// The database of `transport`'s node running in `config` (its epoch is the
    /// transport's, and the node one of its members; or, for a restarted node that
    /// will join, the cluster's current configuration, which it is not a member of).
    pub fn with_config(
        transport: &dyn NodeTransport,
        config: Configuration,
        specs: &[TableSpec],
        rings: LogRingConfig,
    ) -> Result<Arc<NodeDb>, DbError> {
        let node = transport.node();
        let placement = &config.placement;
        if placement.nodes() > LockOwner::MAX_NODES {
            return Err(DbError::TooManyNodes {
                nodes: placement.nodes(),
                max: LockOwner::MAX_NODES,
            });
        }
        let max_id = specs.iter().map(|s| s.id).max().unwrap_or(0);
        if max_id > 1024 {
            return Err(DbError::TableIdTooLarge {
                table: max_id,
                max: 1024,
            });
        }
        let max_id = max_id as usize;
        let mut tables: Vec<Option<(TableSpec, Table)>> = (0..=max_id).map(|_| None).collect();
        for s in specs {
            if tables[s.id as usize].is_some() {
                return Err(DbError::DuplicateTable { table: s.id });
            }
            let cfg = TableConfig::new(s.capacity_per_node.max(16), META + s.value_size);
            let t = Table::create_registered(transport, s.id, &cfg).map_err(|source| {
                DbError::CreateTable {
                    node,
                    table: s.id,
                    name: s.name.clone(),
                    source,
                }
            })?;
            tables[s.id as usize] = Some((s.clone(), t));
        }
        let threads = transport.config().threads_per_node;
        let scratch = (0..threads)
            .map(|t| {
                transport
                    .register(SCRATCH_PER_WORKER * SCRATCH_WORKERS, Perms::ALL)
                    .map_err(|source| DbError::Scratch {
                        node,
                        thread: t,
                        source,
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let remote_keys: usize = specs
            .iter()
            .map(|s| s.capacity_per_node)
            .sum::<usize>()
            .saturating_mul(placement.nodes().saturating_sub(1) as usize);
        let cache_entries = remote_keys.clamp(LOCATION_CACHE_MIN, LOCATION_CACHE_MAX);
        let (nodes, replication) = (placement.nodes(), placement.replication());
        let log_region = LogRegion::create(transport, nodes, replication, &rings)?;
        // Its writers start at the head of the epoch they are made in.
        log_region.restart(config.epoch);
        Ok(Arc::new(NodeDb {
            log_region,
            log_ring_config: rings,
            node,
            cluster: NodeState::new(config, transport.config().threads_per_node as u32),
            nodes,
            replication,
            location_cache: LocationCache::new(cache_entries),
            tables,
            catalog: RwLock::new(None),
            catalog_exchange: Mutex::new(None),
            scratch,
            verified: Mutex::new(None),
            bad_requests: AtomicU64::new(0),
            incarnation: AtomicU64::new(1),
        }))
    }

    /// The configuration this node runs in, shared by its threads.
    pub fn config(&self) -> &ConfigCell {
        &self.cluster.config
    }

    /// What the node's threads and its cluster agent share.
    pub fn cluster(&self) -> &Arc<NodeState> {
        &self.cluster
    }

    /// The current placement.
    pub fn placement(&self) -> Placement {
        self.config().with(|c| c.placement.clone())
    }

    /// Node ids of the cluster (`0..nodes`; fixed for its life).
    pub fn nodes(&self) -> u16 {
        self.nodes
    }

    /// Copies every key should have.
    pub fn replication(&self) -> u16 {
        self.replication
    }

    /// The descriptors of this node's tables, by table id.
    pub fn table_descs(&self) -> Vec<TableDesc> {
        self.tables
            .iter()
            .flatten()
            .map(|(_, t)| t.desc())
            .collect()
    }

    /// The descriptor of this node's log region.
    pub fn log_region_desc(&self) -> LogRegionDesc {
        self.log_region.desc()
    }

    /// This node's log region (the rings it holds as a log replica).
    pub fn log_region(&self) -> &LogRegion {
        &self.log_region
    }

    /// The size of this node's rings and how long its coordinators wait for room.
    pub fn log_ring_config(&self) -> LogRingConfig {
        self.log_ring_config
    }

    /// The catalog of a cluster whose every node's database is in `dbs` (in process).
    pub fn catalog_of(dbs: &[Arc<NodeDb>]) -> Result<Catalog, DbError> {
        let nodes = dbs.first().map_or(0, |d| d.nodes);
        let mut cat = Catalog::new(nodes);
        for db in dbs {
            cat.extend(db.table_descs())
                .and_then(|()| cat.insert_log(db.log_region_desc()))
                .map_err(|source| DbError::Catalog {
                    node: db.node,
                    source,
                })?;
        }
        Ok(cat)
    }

    /// Sets the cluster's catalog, once: it must be of this cluster and hold this
    /// node's own tables as they are.
    pub fn set_catalog(&self, cat: Catalog) -> Result<(), DbError> {
        // Every descriptor is checked already: a `Catalog` is built only by filing
        // (`Catalog::insert`), and one from another process is filed again when it is
        // deserialized.
        let node = self.node;
        if cat.nodes() != self.nodes {
            return Err(DbError::CatalogSize {
                node,
                catalog: cat.nodes(),
                cluster: self.nodes,
            });
        }
        let mine = self.table_descs();
        if cat.of_node(node) != mine.as_slice() {
            return Err(DbError::CatalogOwnTables { node });
        }
        if cat.log_region(node) != Some(&self.log_region_desc()) {
            return Err(DbError::CatalogOwnLogRegion { node });
        }
        for n in 0..cat.nodes() {
            if cat.log_region(n).is_none() {
                return Err(DbError::CatalogNoLogRegion { node, of: n });
            }
            if cat.of_node(n).len() != mine.len() {
                return Err(DbError::CatalogTableCount {
                    node,
                    of: n,
                    catalog: cat.of_node(n).len(),
                    mine: mine.len(),
                });
            }
        }
        let mut slot = self.catalog.write().unwrap_or_else(|e| e.into_inner());
        if slot.is_some() {
            return Err(DbError::CatalogAlreadySet { node });
        }
        *slot = Some(Arc::new(cat));
        Ok(())
    }

    /// Node `node` restarted with new regions (`tables`, `log`: its new database's
    /// [`NodeDb::table_descs`] and [`NodeDb::log_region_desc`]): they replace its old
    /// descriptors here. Called before the new incarnation joins; this node's threads
    /// take them when they move to the epoch that admits it (until then it is not a
    /// member, so nothing reaches it).
    pub fn replace_in_catalog(
        &self,
        node: NodeId,
        tables: Vec<TableDesc>,
        log: LogRegionDesc,
    ) -> Result<(), DbError> {
        if node == self.node {
            return Err(DbError::ReplaceOwn { node });
        }
        let mut slot = self.catalog.write().unwrap_or_else(|e| e.into_inner());
        let cat = slot
            .as_ref()
            .ok_or(DbError::NoCatalog { node: self.node })?;
        if tables.len() != cat.of_node(self.node).len() {
            return Err(DbError::RestartedTableCount {
                node: self.node,
                restarted: node,
                tables: tables.len(),
                mine: cat.of_node(self.node).len(),
            });
        }
        let mut next = (**cat).clone();
        next.replace_node(node, tables, Some(log))
            .map_err(|source| DbError::RestartedDescriptors {
                node: self.node,
                restarted: node,
                source,
            })?;
        *slot = Some(Arc::new(next));
        Ok(())
    }

    /// This node has no launcher to give it the catalog: when its threads start
    /// ([`crate::runner::start_thread`]), thread 0 asks every other node for its
    /// descriptors ([`crate::catalog_exchange::fetch_catalog`]), for at most `within`,
    /// sets the catalog, then runs the start-up check; the workers wait for both. Call
    /// before the threads start; refused once the catalog is set.
    pub fn fetch_catalog_at_start(&self, within: std::time::Duration) -> Result<(), DbError> {
        if self.catalog().is_some() {
            return Err(DbError::CatalogAlreadySet { node: self.node });
        }
        *self
            .catalog_exchange
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(within);
        Ok(())
    }

    /// How long thread 0 asks the other nodes for the catalog, if it is to
    /// ([`NodeDb::fetch_catalog_at_start`]).
    pub fn catalog_exchange(&self) -> Option<std::time::Duration> {
        *self
            .catalog_exchange
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Whether this node runs the start-up check (and gates its workers behind it): it
    /// has the catalog, or will ask the other nodes for it.
    pub fn checks_at_start(&self) -> bool {
        self.catalog().is_some() || self.catalog_exchange().is_some()
    }

    /// The cluster's catalog, once set.
    pub fn catalog(&self) -> Option<Arc<Catalog>> {
        self.catalog
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Tables of other nodes in the catalog (what the start-up check reads).
    pub fn remote_tables(&self) -> usize {
        self.catalog().map_or(0, |c| {
            c.iter().filter(|d| d.region.node != self.node).count()
        })
    }

    /// The start-up check, run by one coroutine of one thread of this node once the
    /// catalog is set ([`crate::runner::start_thread`] does it on thread 0): READs the
    /// superblock of every other node's table one-sided through its descriptor and
    /// checks MAGIC, table id and layout length; then the superblock of every other
    /// node's log region (its magic and ring geometry), so a stale log descriptor
    /// fails here rather than at the first commit. Returns the number of tables
    /// verified (log regions are checked, not counted); an error completion (a wrong
    /// or stale key, region, length) or a mismatch is an error naming the node and
    /// table or log region. Needs [`NodeDb::scratch_region`] attached to `ctx`'s
    /// runtime.
    pub async fn verify_remote_tables(
        &self,
        ctx: &ambidex_rpc::Ctx,
    ) -> Result<usize, StartupCheckError> {
        let node = self.node;
        let cat = self
            .catalog()
            .ok_or(StartupCheckError::NoCatalog { node })?;
        let descs: Vec<TableDesc> = cat
            .iter()
            .filter(|d| d.region.node != self.node)
            // Only members are reached (a node removed before the check is not).
            .filter(|d| self.config().with(|c| c.placement.is_member(d.region.node)))
            .copied()
            .collect();
        let mut verified = 0;
        // A node removed while the check runs (it failed meanwhile) is not reached: its
        // READ's failure is not the check's.
        let gone = |n: NodeId| !self.config().with(|c| c.placement.is_member(n));
        // One READ per batch: a batch's READs share this coroutine's scratch slice.
        for d in &descs {
            let (owner, table, region) = (d.region.node, d.table_id, d.region.id);
            let found = match self.read_superblock(ctx, d.region.at(0)).await {
                Ok(w) => [w[0], w[1], w[2]],
                Err(_) if gone(owner) => continue,
                Err(source) => {
                    return Err(StartupCheckError::TableRead {
                        node,
                        owner,
                        table,
                        region,
                        source,
                    })
                }
            };
            let want = [MAGIC, d.table_id as u64, d.layout.len];
            if found != want {
                return Err(StartupCheckError::TableMismatch {
                    node,
                    owner,
                    table,
                    region,
                    found,
                    want,
                });
            }
            verified += 1;
        }
        let members = self.config().with(|c| c.placement.member_mask());
        for owner in (0..cat.nodes()).filter(|&n| n != node && members & (1 << n) != 0) {
            let d = cat
                .log_region(owner)
                .ok_or(StartupCheckError::LogMissing { node, owner })?;
            let found = match self.read_superblock(ctx, d.region.at(0)).await {
                Ok(w) => w,
                Err(_) if gone(owner) => continue,
                Err(source) => {
                    return Err(StartupCheckError::LogRead {
                        node,
                        owner,
                        source,
                    })
                }
            };
            let want = LogRegion::superblock_of(d);
            if found != want {
                return Err(StartupCheckError::LogMismatch {
                    node,
                    owner,
                    found,
                    want,
                });
            }
        }
        Ok(verified)
    }

    /// READs the 4 words at `at` (one signaled READ, flushed alone), again after a
    /// change of epoch failed it: a node joining or leaving while the check runs moves
    /// every member to a new epoch, and a READ of the old one is fenced at its target
    /// (or failed here) without saying anything about the table. Retried for at most
    /// [`EPOCH_RETRY_NS`] of the runtime's clock.
    async fn read_superblock(
        &self,
        ctx: &ambidex_rpc::Ctx,
        at: ambidex_transport::RemoteAddr,
    ) -> Result<[u64; 4], RpcError> {
        let start = ctx.now_ns();
        loop {
            match Self::read_superblock_once(ctx, at).await {
                Err(e)
                    if e.is_epoch_change()
                        && ctx.now_ns().saturating_sub(start) < EPOCH_RETRY_NS =>
                {
                    ctx.yield_now().await
                }
                r => return r,
            }
        }
    }

    async fn read_superblock_once(
        ctx: &ambidex_rpc::Ctx,
        at: ambidex_transport::RemoteAddr,
    ) -> Result<[u64; 4], RpcError> {
        let h = ctx.queue_read(at, SUPERBLOCK as u32, true)?;
        ctx.flush().await?;
        Ok(ctx.read_result(h, |b| {
            std::array::from_fn(|i| {
                b.get(8 * i..8 * i + 8)
                    .and_then(|w| w.try_into().ok())
                    .map_or(0, u64::from_le_bytes)
            })
        })?)
    }

    /// The region thread `thread`'s coroutines READ into, and the bytes per coroutine id
    /// (attach it with `Runtime::attach_scratch`). `None` for a thread this node does
    /// not have.
    pub fn scratch_region(&self, thread: u16) -> Option<(Region, usize)> {
        let r = self.scratch.get(thread as usize)?;
        Some((r.clone(), SCRATCH_PER_WORKER))
    }

    /// Records the start-up check's outcome (the first one counts).
    pub fn record_verification(&self, r: Result<usize, StartupCheckError>) {
        self.verified.lock().unwrap().get_or_insert(r);
    }

    /// The start-up check's outcome: `None` if it has not finished (or no catalog).
    pub fn verification(&self) -> Option<Result<usize, StartupCheckError>> {
        self.verified.lock().unwrap().clone()
    }

    /// The number of remote tables the start-up check verified, or why there is none
    /// (it failed, did not run, or did not finish): never a silent zero.
    pub fn remote_tables_verified(&self) -> Result<usize, StartupCheckError> {
        let node = self.node;
        match self.verification() {
            Some(r) => r,
            None if !self.checks_at_start() => Err(StartupCheckError::NoCatalogAtStart { node }),
            None => Err(StartupCheckError::Unfinished { node }),
        }
    }

    /// This node's tables.
    pub(crate) fn tables(&self) -> impl Iterator<Item = &Table> {
        self.tables.iter().flatten().map(|(_, t)| t)
    }

    pub(crate) fn table(&self, id: u32) -> Option<&(TableSpec, Table)> {
        self.tables.get(id as usize)?.as_ref()
    }

    pub fn value_size(&self, table: u32) -> Option<usize> {
        self.table(table).map(|(s, _)| s.value_size)
    }

    pub fn spec(&self, table: u32) -> Option<&TableSpec> {
        self.table(table).map(|(s, _)| s)
    }

    /// Stores `value` for `key` if this node holds a copy of it; returns whether it did.
    pub fn load(&self, table: u32, key: u64, value: &[u8]) -> Result<bool, DbError> {
        let node = self.node;
        if !self.config().with(|c| c.placement.stores(node, table, key)) {
            return Ok(false);
        }
        let (spec, t) = self
            .table(table)
            .ok_or(DbError::UnknownTable { node, table })?;
        if value.len() != spec.value_size {
            return Err(DbError::ValueSize {
                node,
                name: spec.name.clone(),
                len: value.len(),
                expected: spec.value_size,
            });
        }
        let mut v = Vec::with_capacity(META + value.len());
        v.extend_from_slice(&LOAD_VERSION.to_le_bytes());
        v.extend_from_slice(value);
        t.insert(key, &v).map_err(|source| DbError::Load {
            node,
            key,
            name: spec.name.clone(),
            source,
        })?;
        Ok(true)
    }

    /// The lock word of `key`'s item, unpacked (who holds its lock, and the store
    /// version); `None` if the table or key is unknown here. For recovery and tests.
    pub fn lock_word(&self, table: u32, key: u64) -> Option<Header> {
        self.table(table)?.1.header(key)
    }

    /// An error naming every table of this node that refused committed data for want
    /// of room (a backup's, a copy's or a recovery's write: [`Table::full_refusals`]),
    /// so a run that met one is not a sound run. (The caller names the node.)
    pub fn room_check(&self) -> Result<(), OutOfRoom> {
        let tables: Vec<TableFull> = self
            .tables
            .iter()
            .flatten()
            .filter(|(_, t)| t.full_refusals() > 0)
            .map(|(spec, t)| TableFull {
                table: spec.id,
                name: spec.name.clone(),
                capacity: t.capacity(),
                refusals: t.full_refusals(),
            })
            .collect();
        if tables.is_empty() {
            Ok(())
        } else {
            Err(OutOfRoom { tables })
        }
    }

    /// Every key this node stores in `table` with its transaction version and value,
    /// tombstones included (for replica-consistency checks).
    pub fn dump(&self, table: u32) -> Vec<(u64, u64, Vec<u8>)> {
        let Some((_, t)) = self.table(table) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        t.for_each(|key, val| {
            let (meta, v) = split_meta(val);
            out.push((key, meta, v.to_vec()));
        });
        out.sort_by_key(|e| e.0);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_nodes_than_lock_words_can_name_is_an_error() {
        // Placements refuse them, so a database is never built for them.
        assert_eq!(ambidex_cluster::MAX_NODES, LockOwner::MAX_NODES);
        let f =
            ambidex_transport::local::LocalFabric::new(ambidex_transport::ClusterConfig::new(1, 1))
                .unwrap();
        let t = &*f.nodes()[0];
        let p = Placement::new(LockOwner::MAX_NODES, 1).unwrap();
        assert!(NodeDb::new(t, p, &[]).is_ok());
        assert!(Placement::new(LockOwner::MAX_NODES + 1, 1).is_err());
    }
}
