//! Why a benchmark run could not be made (a run that ran and found a violated invariant
//! is a report, not an error: `BenchReport::invariant_ok`).

use crate::config::ConfigError;
use crate::transports::OpenError;
use crate::workload::{UnknownWorkload, WorkloadError};

/// A benchmark run that could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// No workload is registered under the configuration's name.
    #[error(transparent)]
    UnknownWorkload(#[from] UnknownWorkload),
    /// The workload could not be built or loaded (its own error).
    #[error("the workload could not be {what}: {source}")]
    Workload {
        /// `built` or `loaded`.
        what: &'static str,
        /// The workload's error.
        source: WorkloadError,
    },
    /// A coroutine count of 0.
    #[error("threads and coroutines must be at least 1")]
    NoCoroutines,
    /// A node to load outside the cluster.
    #[error("node {node} is outside a cluster of {nodes} nodes")]
    NodeOutsideCluster {
        /// The node.
        node: u16,
        /// The cluster's nodes.
        nodes: u16,
    },
    /// The cluster's transport could not be opened.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// A node's tables could not be set up or loaded.
    #[error(transparent)]
    Tables(#[from] ambidex_txn::DbError),
    /// The run failed (a thread could not start, a node was fenced...).
    #[error(transparent)]
    Run(#[from] ambidex_txn::RunError),
    /// A node's start-up check of the others' tables failed.
    #[error(transparent)]
    StartupCheck(#[from] ambidex_txn::StartupCheckError),
    /// The history file (`run.history`) could not be created or written.
    #[error("the history file {path}: {source}")]
    History {
        /// The file.
        path: String,
        /// What the file system said.
        source: std::io::Error,
    },
    /// The thread timing the run panicked.
    #[error("the run's timer thread panicked")]
    TimerPanicked,
}

/// One node of a run of node processes could not load, start, run or finish
/// ([`bench::node`](crate::bench::node)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// What any run can fail of (configuration, workload, tables, run, history file).
    #[error(transparent)]
    Bench(#[from] BenchError),
    /// The transport was opened with another thread count than the run's.
    #[error("the transport has {transport} threads per node, the run {run}")]
    Threads {
        /// The transport's.
        transport: u16,
        /// The run's.
        run: u16,
    },
    /// A restarted node's incarnation must be 2 or more.
    #[error("a restarted node is a new incarnation (2 or more), not {0}")]
    Incarnation(u64),
    /// A restarted node given a configuration it cannot join.
    #[error(
        "node {node} cannot rejoin in a configuration of {nodes} nodes that {}",
        if *still_member { "still has it" } else { "does not fit it" }
    )]
    CannotRejoin {
        /// The node.
        node: u16,
        /// The configuration's nodes.
        nodes: u16,
        /// The configuration still has the node as a member.
        still_member: bool,
    },
    /// `start` before the catalog.
    #[error(
        "node {0} has no catalog of the cluster's tables; it cannot start (the launcher \
         sends it with the \"catalog\" command before \"start\")"
    )]
    NoCatalog(u16),
    /// The node's history file could not be written.
    #[error("writing the history: {0}")]
    HistoryWrite(#[source] std::io::Error),
    /// One of the node's threads panicked.
    #[error("a node thread panicked")]
    ThreadPanicked,
    /// The run ended during a reconfiguration: the checks need a settled one.
    #[error(
        "the run ended during a reconfiguration (epoch {epoch}, stage {stage}): the checks \
         need a settled configuration"
    )]
    Unsettled {
        /// The final state's epoch.
        epoch: u32,
        /// Its stage.
        stage: String,
    },
    /// The launcher's final configuration is older than the node's.
    #[error(
        "node {node}: the launcher's final configuration (epoch {last}) is older than this \
         node's (epoch {mine})"
    )]
    StaleFinalState {
        /// The node.
        node: u16,
        /// The launcher's epoch.
        last: u32,
        /// The node's epoch.
        mine: u32,
    },
}

impl From<ambidex_txn::DbError> for NodeError {
    fn from(e: ambidex_txn::DbError) -> Self {
        NodeError::Bench(e.into())
    }
}

impl From<ambidex_txn::RunError> for NodeError {
    fn from(e: ambidex_txn::RunError) -> Self {
        NodeError::Bench(e.into())
    }
}

impl From<ambidex_txn::StartupCheckError> for NodeError {
    fn from(e: ambidex_txn::StartupCheckError) -> Self {
        NodeError::Bench(e.into())
    }
}

impl From<ConfigError> for NodeError {
    fn from(e: ConfigError) -> Self {
        NodeError::Bench(e.into())
    }
}

impl From<UnknownWorkload> for NodeError {
    fn from(e: UnknownWorkload) -> Self {
        NodeError::Bench(e.into())
    }
}
