//! The facade's errors: what failed, and whether retrying can help
//! ([`Error::retryable`]).

use crate::codec::DecodeError;
use crate::config::ConfigError;
use crate::schema::SchemaError;
pub use ambidex_txn::AbortReason;

/// Everything the application API can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The transaction aborted (a conflict, a timeout, a failed node...). Retrying can
    /// help when [`AbortReason::is_transient`] says so; `Node::run` already retried
    /// those, so one returned from it is permanent or was not retried.
    #[error("transaction aborted: {reason} ({})", if reason.is_transient() { "retrying may help" } else { "retrying will not help" })]
    Aborted {
        /// Why.
        reason: AbortReason,
    },
    /// Every attempt the retry policy allows aborted for a transient reason.
    #[error("transaction gave up after {attempts} attempts; the last aborted: {last}")]
    GaveUp {
        /// Attempts made.
        attempts: u32,
        /// Why the last one aborted.
        last: AbortReason,
    },
    /// An update or delete of a key that is not there.
    #[error("table {table}: key {key} does not exist")]
    NotFound {
        /// The table's name.
        table: String,
        /// The key, packed.
        key: u64,
    },
    /// An insert of a key that is there.
    #[error("table {table}: key {key} exists already")]
    AlreadyExists {
        /// The table's name.
        table: String,
        /// The key, packed.
        key: u64,
    },
    /// A value larger than its table allows.
    #[error("table {table}: a value of {len} bytes, the table holds at most {max}")]
    ValueTooLarge {
        /// The table's name.
        table: String,
        /// The value's encoded length.
        len: usize,
        /// The table's maximum.
        max: usize,
    },
    /// A stored value did not decode as the table's value type.
    #[error("table {table}: key {key}: the stored value does not decode: {source}")]
    Decode {
        /// The table's name.
        table: String,
        /// The key, packed.
        key: u64,
        /// What was wrong with it.
        source: DecodeError,
    },
    /// A use of a key the transaction does not support: a key read and then written
    /// (fetch keys to write with `get_for_update`: the protocol locks them when it
    /// fetches them), a key deleted and then written, a key inserted and then deleted.
    #[error("table {table}: key {key}: {what}")]
    KeyMisuse {
        /// The table's name.
        table: String,
        /// The key, packed.
        key: u64,
        /// What was done, and what to do instead.
        what: &'static str,
    },
    /// A table handle from another schema.
    #[error("table {0} is not in this cluster's schema")]
    UnknownTable(String),
    /// A node id outside the cluster.
    #[error("node {node} is not in this cluster of {nodes} nodes")]
    NoSuchNode {
        /// The id asked for.
        node: u16,
        /// The cluster's nodes.
        nodes: u16,
    },
    /// The configuration is invalid.
    #[error("configuration: {0}")]
    Config(#[from] ConfigError),
    /// The schema is invalid.
    #[error("schema: {0}")]
    Schema(#[from] SchemaError),
    /// The cluster could not start (its transport or threads).
    #[error("cannot start the cluster: {0}")]
    Start(#[from] StartError),
    /// A node's tables could not be set up (registered, or their descriptors shared).
    #[error("cannot set up a node's tables: {0}")]
    Tables(#[from] ambidex_txn::DbError),
    /// Something the application API does not do (yet): what, and what to do instead.
    #[error("not supported: {0}")]
    NotSupported(&'static str),
    /// The cluster stopped (shut down, or failed: [`Cluster::shutdown`] says why) before
    /// the transaction could run or finish.
    ///
    /// [`Cluster::shutdown`]: crate::Cluster::shutdown
    #[error("the cluster is stopped")]
    Stopped,
    /// The cluster ran, but its end found a failure (a node fenced, a thread lost).
    #[error("the cluster failed: {0}")]
    Failed(#[from] ambidex_txn::RunError),
    /// The thread that ran the cluster panicked.
    #[error("the cluster's thread panicked")]
    ClusterPanicked,
    /// The transaction's closure panicked (its locks were released; the node goes on).
    #[error("the transaction panicked: {0}")]
    Panicked(String),
    /// The application's own error, returned by its closure (never retried).
    #[error(transparent)]
    User(Box<dyn std::error::Error + Send + Sync>),
}

impl Error {
    /// Wraps an application error, so a transaction's closure can return it: the
    /// transaction aborts and `Node::run` returns it as is.
    pub fn user(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Error {
        Error::User(e.into())
    }

    /// Whether running the transaction again can help: a conflict, a timeout, a node
    /// failure the cluster is recovering from, or retries given up that may succeed
    /// later.
    pub fn retryable(&self) -> bool {
        match self {
            Error::Aborted { reason } => reason.is_transient(),
            Error::GaveUp { .. } => true,
            _ => false,
        }
    }

    /// The protocol's abort reason, if the transaction aborted.
    pub fn abort_reason(&self) -> Option<AbortReason> {
        match self {
            Error::Aborted { reason } => Some(*reason),
            Error::GaveUp { last, .. } => Some(*last),
            _ => None,
        }
    }
}

impl From<AbortReason> for Error {
    fn from(reason: AbortReason) -> Error {
        Error::Aborted { reason }
    }
}

/// Why a cluster did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// Its transport could not be opened (the local fabric, an shm directory, udp
    /// sockets).
    #[error("its transport: {0}")]
    Transport(#[source] crate::transports::OpenError),
    /// The thread that runs the cluster could not be spawned.
    #[error("cannot spawn the cluster's thread: {0}")]
    Spawn(#[source] std::io::Error),
    /// Not every node thread started in time.
    #[error("{started} of {want} node threads started within {after:?}")]
    TimedOut {
        /// Threads that started.
        started: usize,
        /// Threads the cluster has.
        want: usize,
        /// How long it waited.
        after: std::time::Duration,
    },
    /// The node threads ended before they all started (and the run said why).
    #[error("the node threads ended before they started: {0}")]
    Ended(#[source] Box<Error>),
    /// A node started on its own ([`Node::start`](crate::Node::start)) could not get
    /// the other nodes' descriptors, or its start-up check of their tables failed.
    #[error("{0}")]
    StartupCheck(#[source] ambidex_txn::StartupCheckError),
    /// A node started on its own with the etcd manager needs the name of its cluster in
    /// etcd (`cluster.etcd_cluster`): no launcher makes one up.
    #[error(
        "Node::start with cluster.manager = \"etcd\" needs cluster.etcd_cluster: the name \
         of the cluster in etcd, the same for every node of it (no launcher makes one up)"
    )]
    NoEtcdCluster,
    /// The cluster in etcd could not be created, read or joined.
    #[error("its membership in etcd: {0}")]
    Membership(#[source] crate::bench::etcd_membership::MembershipError),
    /// The cluster of that name in etcd has another shape than this configuration.
    #[error(
        "cluster {cluster:?} in etcd has {found_nodes} nodes with replication \
         {found_replication}, this configuration {nodes} with replication {replication}: \
         another cluster has that name"
    )]
    EtcdClusterDiffers {
        /// `cluster.etcd_cluster`.
        cluster: String,
        /// The nodes of the cluster in etcd.
        found_nodes: u16,
        /// Its replication.
        found_replication: u16,
        /// The configuration's `cluster.nodes`.
        nodes: u16,
        /// The configuration's `cluster.replication`.
        replication: u16,
    },
    /// The cluster in etcd left its initial configuration (a node was removed, or it
    /// stopped): a node started with [`Node::start`](crate::Node::start) has an empty
    /// database and joins only the initial configuration (a restarted node rejoining is
    /// built for `ambidex bench --restart` only).
    #[error(
        "cluster {cluster:?} in etcd is no longer in its initial configuration (epoch \
         {epoch}{}): node {node} cannot join it with an empty database (name a new \
         cluster in cluster.etcd_cluster)",
        match stopped { Some(why) => format!(", stopped: {why}"), None => String::new() }
    )]
    EtcdClusterMovedOn {
        /// `cluster.etcd_cluster`.
        cluster: String,
        /// The node that started.
        node: u16,
        /// The cluster's epoch in etcd (1: the initial configuration).
        epoch: u32,
        /// Why the cluster stopped, if it did.
        stopped: Option<String>,
    },
    /// The thread of the node's cluster agent could not be spawned.
    #[error("cannot start the cluster agent: {0}")]
    Agent(#[source] std::io::Error),
    /// The manager refused the node before it started (its lease, or its membership).
    #[error("node {node} was fenced by the configuration manager before it started: {why}")]
    Fenced {
        /// The node.
        node: u16,
        /// What the agent was told.
        why: String,
    },
}
