//! What is wrong with a simulation's configuration, before anything runs, and why a
//! simulation could not be made.

use crate::bench::BenchError;
use crate::config::ConfigError;
use crate::workload::UnknownWorkload;
use ambidex_cluster::PlacementError;
use ambidex_store::CatalogError;
use ambidex_transport::TransportError;
use ambidex_txn::{DbError, StartError};

/// A simulation that cannot run as configured.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SimConfigError {
    /// A setting outside the simulator's limits.
    #[error("{what} must be {allowed}, not {got}")]
    OutOfRange {
        /// The setting.
        what: &'static str,
        /// What it may be.
        allowed: &'static str,
        /// What it is.
        got: String,
    },
    /// No fault profile has this name.
    #[error("unknown fault profile {name:?} (one of: {})", super::PROFILES.join(", "))]
    UnknownProfile {
        /// The name given.
        name: String,
    },
    /// A scripted partition or pause that does not parse, or does not fit the cluster.
    #[error("{flag} {arg:?}: {why}")]
    Script {
        /// `--partition` or `--pause`.
        flag: &'static str,
        /// The argument given.
        arg: String,
        /// What is wrong with it.
        why: String,
    },
    /// The cluster's shape is invalid (replication against nodes).
    #[error("{0}")]
    Shape(String),
    /// What the configuration itself refuses.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// No workload is registered under the configuration's name.
    #[error(transparent)]
    UnknownWorkload(#[from] UnknownWorkload),
}

/// A simulation that could not be made (a run whose checks fail is a report with
/// `failures`, not an error).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// The configuration is refused.
    #[error(transparent)]
    Config(#[from] SimConfigError),
    /// The workload could not be built, or its tables set up or loaded (as the
    /// benchmark's set-up reports it: the workload's own error, the tables').
    #[error(transparent)]
    Setup(#[from] BenchError),
    /// The simulated network refused the cluster's shape.
    #[error("the simulated network could not be made: {0}")]
    Net(#[source] TransportError),
    /// A node thread could not start.
    #[error("a node thread could not start: {0}")]
    Start(#[from] StartError),
}

impl From<ConfigError> for SimError {
    fn from(e: ConfigError) -> SimError {
        SimError::Config(e.into())
    }
}

impl From<UnknownWorkload> for SimError {
    fn from(e: UnknownWorkload) -> SimError {
        SimError::Config(e.into())
    }
}

/// Why a crashed node could not be restarted (a failure of the run, in its report).
#[derive(Debug, thiserror::Error)]
pub(crate) enum RestartError {
    /// Every other node is crashed or not a member: none has a configuration to join.
    #[error("no survivor to rejoin")]
    NoSurvivor,
    /// The survivors' configuration without its crashed incarnation cannot be made.
    #[error("its configuration without its old incarnation: {0}")]
    Configuration(#[source] PlacementError),
    /// Its endpoints could not be taken again.
    #[error("its transport: {0}")]
    Transport(#[source] TransportError),
    /// Its fresh database could not be made, or refused the catalog.
    #[error(transparent)]
    Tables(#[from] DbError),
    /// The catalog refused its new regions.
    #[error("the catalog refused its new regions: {0}")]
    Catalog(#[from] CatalogError),
    /// Every worker slot kept for restarts is taken.
    #[error("no worker slot left ({slots} slots)")]
    NoSlot {
        /// The slots of the run.
        slots: usize,
    },
    /// One of its threads could not start.
    #[error(transparent)]
    Start(#[from] StartError),
}
