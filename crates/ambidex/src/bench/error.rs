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

/// The harness's node processes and the CLI still report failures as text.
impl From<BenchError> for String {
    fn from(e: BenchError) -> String {
        e.to_string()
    }
}
