//! What is wrong with a simulation's configuration, before anything runs.

use crate::config::ConfigError;
use crate::workload::UnknownWorkload;

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

/// The simulator's set-up still reports its other failures as text.
impl From<SimConfigError> for String {
    fn from(e: SimConfigError) -> String {
        e.to_string()
    }
}
