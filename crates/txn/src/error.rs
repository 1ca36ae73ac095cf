//! The transaction layer's errors of start-up, loading and the end of a run (never of
//! the transaction path, whose aborts are counted reasons: [`crate::AbortReason`]).
//!
//! - [`DbError`]: a node's database could not be built, loaded, or given its catalog.
//! - [`StartupCheckError`]: the start-up check of the other nodes' tables failed.
//! - [`CatalogExchangeError`], [`DescriptorsDecodeError`]: a node without a launcher
//!   could not get the other nodes' descriptors from them ([`crate::catalog_exchange`]).
//! - [`OutOfRoom`]: tables of a node refused committed data for want of room.
//! - [`StartError`]: a node thread could not start.
//! - [`RestartError`]: a killed node could not be started again.
//! - [`EtcdError`]: the etcd manager of an in-process run failed.
//! - [`RunError`]: a run could not start, or failed ([`RunFailure`]s).
//!
//! The log region's own set-up error is [`crate::log_ring::LogRegionSetupError`].

use crate::log_ring::LogRegionSetupError;
use ambidex_cluster::ManagerError;
use ambidex_rpc::RpcError;
use ambidex_store::{CatalogError, StoreError};
use ambidex_transport::{NodeId, RegionId, ThreadId, TransportError};
use std::fmt;
use std::sync::Arc;

/// Why a node's database could not be built ([`crate::NodeDb::with_config`]), loaded
/// ([`crate::NodeDb::load`]) or given its catalog ([`crate::NodeDb::set_catalog`],
/// [`crate::NodeDb::replace_in_catalog`], [`crate::NodeDb::catalog_of`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DbError {
    /// The placement has more nodes than a lock word can name.
    #[error("{nodes} nodes: lock words name at most {max} nodes")]
    TooManyNodes {
        /// Nodes of the placement.
        nodes: u16,
        /// Nodes a lock word can name.
        max: u16,
    },
    /// A table id is above the limit.
    #[error("table ids must be at most {max} (table {table})")]
    TableIdTooLarge {
        /// The largest table id given.
        table: u32,
        /// The limit.
        max: u32,
    },
    /// Two table specs have the same id.
    #[error("table id {table} registered twice")]
    DuplicateTable {
        /// The id.
        table: u32,
    },
    /// The store could not create a table in a registered region.
    #[error("cannot create table {table} ({name}) on node {node}: {source}")]
    CreateTable {
        /// This node.
        node: NodeId,
        /// The table's id.
        table: u32,
        /// The table's name.
        name: String,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// The transport refused a thread's scratch region (one-sided READs land there).
    #[error("node {node}: cannot register the scratch region of thread {thread}: {source}")]
    Scratch {
        /// This node.
        node: NodeId,
        /// The thread.
        thread: ThreadId,
        /// The transport's error.
        #[source]
        source: TransportError,
    },
    /// The node's log region could not be made.
    #[error(transparent)]
    LogRegion(#[from] LogRegionSetupError),
    /// A descriptor of node `node`'s database was refused by the catalog.
    #[error("node {node}: {source}")]
    Catalog {
        /// The node whose descriptor it is.
        node: NodeId,
        /// Why the catalog refused it.
        #[source]
        source: CatalogError,
    },
    /// The catalog given is of a cluster of another size.
    #[error("node {node}: a catalog of {catalog} nodes for a cluster of {cluster}")]
    CatalogSize {
        /// This node.
        node: NodeId,
        /// Nodes of the catalog.
        catalog: u16,
        /// Nodes of this cluster.
        cluster: u16,
    },
    /// The catalog's descriptors of this node's tables are not this node's.
    #[error("node {node}: the catalog does not hold this node's own tables as they are")]
    CatalogOwnTables {
        /// This node.
        node: NodeId,
    },
    /// The catalog's descriptor of this node's log region is not this node's.
    #[error("node {node}: the catalog does not hold this node's own log region as it is")]
    CatalogOwnLogRegion {
        /// This node.
        node: NodeId,
    },
    /// The catalog lacks a node's log region.
    #[error("node {node}: the catalog has no log region of node {of}")]
    CatalogNoLogRegion {
        /// This node.
        node: NodeId,
        /// The node whose log region is missing.
        of: NodeId,
    },
    /// The catalog holds another number of tables of a node than this node has.
    #[error("node {node}: the catalog has {catalog} tables of node {of}, this node {mine}")]
    CatalogTableCount {
        /// This node.
        node: NodeId,
        /// The node whose tables differ.
        of: NodeId,
        /// Its tables in the catalog.
        catalog: usize,
        /// This node's tables.
        mine: usize,
    },
    /// [`crate::NodeDb::set_catalog`] was called a second time.
    #[error("node {node}: the catalog is already set")]
    CatalogAlreadySet {
        /// This node.
        node: NodeId,
    },
    /// [`crate::NodeDb::replace_in_catalog`] was asked to replace this node's own
    /// descriptors.
    #[error("node {node}: its own descriptors are replaced by a new database, not an update")]
    ReplaceOwn {
        /// This node.
        node: NodeId,
    },
    /// [`crate::NodeDb::replace_in_catalog`] before any catalog was set.
    #[error("node {node}: no catalog to update")]
    NoCatalog {
        /// This node.
        node: NodeId,
    },
    /// A restarted node came back with another number of tables than this node has.
    #[error("node {node}: node {restarted} restarted with {tables} tables, this node has {mine}")]
    RestartedTableCount {
        /// This node.
        node: NodeId,
        /// The restarted node.
        restarted: NodeId,
        /// Its tables.
        tables: usize,
        /// This node's tables.
        mine: usize,
    },
    /// The catalog refused a restarted node's new descriptors.
    #[error("node {node}: node {restarted}'s new descriptors: {source}")]
    RestartedDescriptors {
        /// This node.
        node: NodeId,
        /// The restarted node.
        restarted: NodeId,
        /// Why the catalog refused them.
        #[source]
        source: CatalogError,
    },
    /// Loading into a table this node does not have.
    #[error("node {node}: unknown table {table}")]
    UnknownTable {
        /// This node.
        node: NodeId,
        /// The table id.
        table: u32,
    },
    /// Loading a value of the wrong size for its table.
    #[error("node {node}: value of {len} bytes for table {name} of {expected}-byte values")]
    ValueSize {
        /// This node.
        node: NodeId,
        /// The table's name.
        name: String,
        /// Bytes of the value given.
        len: usize,
        /// Bytes of the table's values.
        expected: usize,
    },
    /// The store refused a loaded key (e.g. the table is full).
    #[error("node {node}: loading key {key} into {name}: {source}")]
    Load {
        /// This node.
        node: NodeId,
        /// The key.
        key: u64,
        /// The table's name.
        name: String,
        /// The store's error.
        #[source]
        source: StoreError,
    },
}

/// Why a node's start-up check of the other nodes' tables and log regions failed, or
/// why it has no outcome ([`crate::NodeDb::verify_remote_tables`],
/// [`crate::NodeDb::remote_tables_verified`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StartupCheckError {
    /// The check ran before the catalog was set.
    #[error("node {node}: no catalog to verify")]
    NoCatalog {
        /// This node.
        node: NodeId,
    },
    /// The READ of a table's superblock failed (a wrong or stale key, region, length).
    #[error(
        "node {node}: start-up check of node {owner}'s table {table} (region {region}) \
         failed: {source}"
    )]
    TableRead {
        /// This node.
        node: NodeId,
        /// The table's node.
        owner: NodeId,
        /// The table id.
        table: u32,
        /// The table's region on its node.
        region: RegionId,
        /// The READ's error.
        #[source]
        source: RpcError,
    },
    /// A table's superblock does not match its descriptor.
    #[error(
        "node {node}: start-up check of node {owner}'s table {table} (region {region}) \
         failed: superblock (magic, table, len) = {:#x}, {}, {} but the descriptor says \
         {:#x}, {}, {}",
        .found[0], .found[1], .found[2], .want[0], .want[1], .want[2]
    )]
    TableMismatch {
        /// This node.
        node: NodeId,
        /// The table's node.
        owner: NodeId,
        /// The table id.
        table: u32,
        /// The table's region on its node.
        region: RegionId,
        /// The superblock's magic, table id and layout length.
        found: [u64; 3],
        /// What the descriptor says they are.
        want: [u64; 3],
    },
    /// A member's log region is not in the catalog.
    #[error("node {node}: start-up check of node {owner}'s log region failed: not in the catalog")]
    LogMissing {
        /// This node.
        node: NodeId,
        /// The log region's node.
        owner: NodeId,
    },
    /// The READ of a log region's superblock failed.
    #[error("node {node}: start-up check of node {owner}'s log region failed: {source}")]
    LogRead {
        /// This node.
        node: NodeId,
        /// The log region's node.
        owner: NodeId,
        /// The READ's error.
        #[source]
        source: RpcError,
    },
    /// A log region's superblock does not match its descriptor.
    #[error(
        "node {node}: start-up check of node {owner}'s log region failed: superblock \
         (magic, base, ring bytes, rings) = {found:#x?} but the descriptor says {want:#x?}"
    )]
    LogMismatch {
        /// This node.
        node: NodeId,
        /// The log region's node.
        owner: NodeId,
        /// The superblock's words.
        found: [u64; 4],
        /// What the descriptor says they are.
        want: [u64; 4],
    },
    /// A restarted node stopped (fenced, or the run ended) before it was admitted.
    #[error("node {node}: stopped before it joined the cluster")]
    NotJoined {
        /// This node.
        node: NodeId,
    },
    /// The node started without a catalog, so no check ran.
    #[error("node {node}: started without a catalog")]
    NoCatalogAtStart {
        /// This node.
        node: NodeId,
    },
    /// The check did not finish (or did not run).
    #[error("node {node}: the start-up check of the other nodes' tables did not finish")]
    Unfinished {
        /// This node.
        node: NodeId,
    },
    /// The node was to ask the others for the catalog ([`crate::catalog_exchange`]),
    /// and could not get it: no check ran.
    #[error(transparent)]
    CatalogExchange(#[from] CatalogExchangeError),
}

/// Why a node could not get the cluster's catalog from the other nodes
/// ([`crate::catalog_exchange::fetch_catalog`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CatalogExchangeError {
    /// Some nodes never answered (not started, unreachable) within the time allowed.
    #[error(
        "node {node}: no descriptors from node(s) {missing:?} within {after:?} (are they \
         started, with the same configuration?)"
    )]
    NoAnswer {
        /// This node.
        node: NodeId,
        /// The nodes that never answered.
        missing: Vec<NodeId>,
        /// How long this node asked.
        after: std::time::Duration,
    },
    /// A node's answer did not decode.
    #[error("node {node}: node {peer}'s descriptors: {source}")]
    BadAnswer {
        /// This node.
        node: NodeId,
        /// The node that answered.
        peer: NodeId,
        /// What was wrong with it.
        #[source]
        source: DescriptorsDecodeError,
    },
    /// A node's answer decoded but does not fit this cluster or its earlier pages.
    #[error("node {node}: node {peer}'s descriptors: {why}")]
    Inconsistent {
        /// This node.
        node: NodeId,
        /// The node that answered.
        peer: NodeId,
        /// What did not fit.
        why: &'static str,
    },
    /// A node's descriptors were refused by the catalog's checks (a layout that does
    /// not fit its region, missing permissions, a bad log region).
    #[error("node {node}: node {peer}'s descriptors: {source}")]
    Catalog {
        /// This node.
        node: NodeId,
        /// The node that answered.
        peer: NodeId,
        /// The catalog's check.
        #[source]
        source: CatalogError,
    },
    /// A request could not be sent, or was answered with an RPC error other than a
    /// timeout (a node without the handler: another version of ambidex).
    #[error("node {node}: asking node {peer} for its descriptors: {source}")]
    Rpc {
        /// This node.
        node: NodeId,
        /// The node asked.
        peer: NodeId,
        /// The RPC error.
        #[source]
        source: RpcError,
    },
    /// The catalog built from the answers was refused by this node's database.
    #[error(transparent)]
    Set(#[from] DbError),
}

/// Why an answer to a descriptors request did not decode
/// ([`crate::catalog_exchange::DescriptorsPage::decode`]). Answers are untrusted bytes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DescriptorsDecodeError {
    /// The answer ends early (or claims more descriptors than it holds).
    #[error("answer truncated")]
    Truncated,
    /// Bytes follow the answer.
    #[error("{0} bytes after the answer")]
    TrailingBytes(usize),
    /// The node refused the request (its status byte; `BadRequest` if it could not
    /// decode it, for instance of another format version).
    #[error("the node refused the request (status {0})")]
    Refused(u8),
    /// The answer is of another format version.
    #[error("format version {found}, this node reads {want}")]
    Version {
        /// The answer's version.
        found: u8,
        /// The version this node reads.
        want: u8,
    },
    /// The answer claims more tables than a node can have.
    #[error("{total} tables (at most {max})")]
    TooManyTables {
        /// Tables claimed.
        total: u16,
        /// The limit.
        max: u32,
    },
    /// The page's descriptors run past the tables it claims.
    #[error("descriptors {first}..{first}+{n} of {total} tables")]
    BadRange {
        /// The page's first descriptor.
        first: u16,
        /// Descriptors in the page.
        n: u16,
        /// Tables claimed.
        total: u16,
    },
    /// A region's permission bits include unknown ones.
    #[error("unknown permission bits {0:#x}")]
    BadPerms(u8),
}

/// Tables of a node that refused committed data for want of room
/// ([`crate::NodeDb::room_check`]): the run is not a sound one. The caller names the
/// node.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "out of room: {} (raise the tables' capacity_per_node)",
    Joined(.tables, "; ")
)]
pub struct OutOfRoom {
    /// Every table that refused writes.
    pub tables: Vec<TableFull>,
}

/// One table that refused committed writes for want of room (part of [`OutOfRoom`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("table {name} ({capacity} items of room) refused {refusals} committed writes")]
pub struct TableFull {
    /// The table's id.
    pub table: u32,
    /// The table's name.
    pub name: String,
    /// Items the table has room for.
    pub capacity: usize,
    /// Committed writes it refused.
    pub refusals: u64,
}

/// Why a node thread could not start ([`crate::runner::start_thread`],
/// [`crate::runner::spawn_node`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StartError {
    /// The transport refused the thread's endpoint.
    #[error("endpoint {node}.{thread}: {source}")]
    Endpoint {
        /// The node.
        node: NodeId,
        /// The thread.
        thread: ThreadId,
        /// The transport's error.
        #[source]
        source: TransportError,
    },
    /// The fault injector refused its configuration.
    #[error("fault injector of thread {node}.{thread}: {source}")]
    FaultInjector {
        /// The node.
        node: NodeId,
        /// The thread.
        thread: ThreadId,
        /// The injector's error.
        #[source]
        source: TransportError,
    },
    /// The RPC runtime refused its configuration.
    #[error("RPC runtime of thread {node}.{thread}: {source}")]
    Runtime {
        /// The node.
        node: NodeId,
        /// The thread.
        thread: ThreadId,
        /// The runtime's error.
        #[source]
        source: RpcError,
    },
    /// The node's database has no scratch region for this thread.
    #[error("node {node} has no thread {thread}")]
    NoScratch {
        /// The node.
        node: NodeId,
        /// The thread.
        thread: ThreadId,
    },
    /// The runtime refused the thread's scratch region.
    #[error("scratch of thread {node}.{thread}: {source}")]
    Scratch {
        /// The node.
        node: NodeId,
        /// The thread.
        thread: ThreadId,
        /// The runtime's error.
        #[source]
        source: RpcError,
    },
}

/// Why the etcd manager of an in-process run failed (cargo feature `etcd`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EtcdError {
    /// The cluster could not be created in etcd.
    #[error("cannot bootstrap cluster {cluster} in etcd: {source}")]
    Bootstrap {
        /// The cluster's name in etcd.
        cluster: String,
        /// The manager's error.
        #[source]
        source: ManagerError,
    },
    /// The cluster exists in etcd already (a run needs a new one).
    #[error("cluster {cluster} already exists in etcd: a run needs a new one")]
    Exists {
        /// The cluster's name in etcd.
        cluster: String,
    },
    /// A node's client could not connect.
    #[error("node {node} cannot connect to etcd: {source}")]
    Connect {
        /// The node.
        node: NodeId,
        /// The manager's error.
        #[source]
        source: ManagerError,
    },
    /// The cluster's final state could not be read back.
    #[error("cannot read cluster {cluster}'s final state: {source}")]
    FinalState {
        /// The cluster's name in etcd.
        cluster: String,
        /// The manager's error.
        #[source]
        source: ManagerError,
    },
}

/// Why a killed node could not be started again during a run
/// (`RunSpec::restart`).
#[derive(Clone, Debug, thiserror::Error)]
pub enum RestartError {
    /// The run has no manager or no `RunSpec::fresh_db`.
    #[error("restarting node {node} needs a manager and a fresh_db")]
    Spec {
        /// The node.
        node: NodeId,
    },
    /// The run has no transport for the node.
    #[error("no node {node} to restart")]
    NoNode {
        /// The node.
        node: NodeId,
    },
    /// No other node is left to take the configuration from.
    #[error("node {node} has nobody to rejoin")]
    NobodyToRejoin {
        /// The node.
        node: NodeId,
    },
    /// The survivors' configuration has no incarnation of the node.
    #[error("node {node} is not in the configuration")]
    NotInConfiguration {
        /// The node.
        node: NodeId,
    },
    /// The node's transport could not restart.
    #[error("cannot restart node {node}: {source}")]
    Transport {
        /// The node.
        node: NodeId,
        /// The transport's error.
        #[source]
        source: TransportError,
    },
    /// The fresh database is another node's.
    #[error("the fresh database of node {node} is node {got}'s")]
    WrongNode {
        /// The node restarted.
        node: NodeId,
        /// The node of the database made.
        got: NodeId,
    },
    /// The catalog refused the node's new descriptors.
    #[error("node {node}'s new descriptors: {source}")]
    Descriptors {
        /// The node.
        node: NodeId,
        /// Why the catalog refused them.
        #[source]
        source: CatalogError,
    },
    /// The fresh database could not be made, or a catalog could not take its
    /// descriptors.
    #[error(transparent)]
    Db(#[from] DbError),
    /// The node's etcd client could not connect.
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    /// The node's cluster agent could not start.
    #[error("cannot start node {node}'s agent: {source}")]
    Agent {
        /// The node.
        node: NodeId,
        /// The agent's error.
        #[source]
        source: Arc<std::io::Error>,
    },
}

/// One failure of a run's threads, nodes or manager (several make a
/// [`RunError::Failed`]).
#[derive(Clone, Debug, thiserror::Error)]
pub enum RunFailure {
    /// A node thread panicked outside its workers (its join failed).
    #[error("a node thread panicked")]
    NodeThreadPanicked,
    /// A thread of the killed node panicked.
    #[error("a thread of killed node {node} panicked")]
    KilledThreadPanicked {
        /// The killed node.
        node: NodeId,
    },
    /// A worker (or the runtime) of a thread panicked.
    #[error("thread {thread} of node {node} panicked: {what}")]
    ThreadPanicked {
        /// The node.
        node: NodeId,
        /// The thread.
        thread: ThreadId,
        /// The panic's message.
        what: String,
    },
    /// The OS refused a node thread.
    #[error("cannot start thread {thread} of node {node}: {source}")]
    Spawn {
        /// The node.
        node: NodeId,
        /// The thread.
        thread: ThreadId,
        /// The OS's error.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// A node thread could not start.
    #[error(transparent)]
    Start(#[from] StartError),
    /// The killed node could not be started again.
    #[error(transparent)]
    Restart(#[from] RestartError),
    /// The manager stopped the cluster (no configuration could go on).
    #[error("the cluster could not go on: {why}")]
    ClusterStopped {
        /// The manager's reason.
        why: String,
    },
    /// The etcd manager's final state could not be read.
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    /// A node was fenced (it lost its lease or was removed) while it should have run.
    #[error("node {node} was fenced: {why}")]
    Fenced {
        /// The node.
        node: NodeId,
        /// Why, as its agent says.
        why: String,
    },
    /// A node's start-up check failed or did not finish.
    #[error(transparent)]
    Check(#[from] StartupCheckError),
}

/// Why an in-process run ([`crate::runner::run`]) could not start or failed.
#[derive(Clone, Debug, thiserror::Error)]
pub enum RunError {
    /// The numbers of transports and databases differ, or are zero.
    #[error("one database per node is needed ({nodes} nodes, {dbs} databases)")]
    NodeCount {
        /// Transports given.
        nodes: usize,
        /// Databases given.
        dbs: usize,
    },
    /// `RunSpec::restart` without a manager, a `fresh_db`, or that node killed.
    #[error("restarting node {node} needs a manager, RunSpec::fresh_db, and node {node} killed")]
    RestartSpec {
        /// The node to restart.
        node: NodeId,
    },
    /// The etcd manager could not be set up.
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    /// A node's cluster agent could not start.
    #[error("cannot start node {node}'s agent: {source}")]
    Agent {
        /// The node.
        node: NodeId,
        /// The agent's error.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The run went, and failed: every failure, in the order found (joined by "; ").
    #[error("{}", Joined(.0, "; "))]
    Failed(Vec<RunFailure>),
}

/// Displays the items of a slice joined by a separator.
struct Joined<'a, T>(&'a [T], &'static str);

impl<T: fmt::Display> fmt::Display for Joined<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, x) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(self.1)?;
            }
            write!(f, "{x}")?;
        }
        Ok(())
    }
}
