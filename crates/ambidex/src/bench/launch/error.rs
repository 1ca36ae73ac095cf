//! What can stop a run of node processes: the launcher's errors, and the troubles of
//! one node it reports by name, pid and how the process ended.

use super::catalog::CatalogError;
use super::faults::FaultError;
use crate::bench::combine::{CombineError, NodePolicyError};
use crate::bench::etcd_membership::MembershipError;
use crate::bench::BenchError;
use crate::config::ConfigError;
use crate::transports::OpenError;
use std::fmt;
use std::process::ExitStatus;

/// A run of node processes that could not be made or did not finish.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The launcher starts node processes of its own binary, and could not find it.
    #[error("cannot find this program's own binary to start the node processes: {0}")]
    OwnBinary(#[source] std::io::Error),
    /// A node process could not be started.
    #[error("cannot start node {node} ({argv}): {source}")]
    Spawn {
        /// The node.
        node: u16,
        /// Its command line.
        argv: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A node failed the run; every node was killed.
    #[error("node {node} (pid {pid}) {trouble}; it {ending}")]
    Node {
        /// The node.
        node: u16,
        /// Its process.
        pid: u32,
        /// What it did (or did not do).
        trouble: NodeTrouble,
        /// How its process ended.
        ending: Ending,
    },
    /// Fewer nodes than the run has sent an event the launcher waited for.
    #[error("{got} of {of} nodes sent {event:?} (the others died)")]
    Partial {
        /// The event.
        event: String,
        /// How many sent it.
        got: usize,
        /// How many nodes the run has.
        of: usize,
    },
    /// A kill or restart named a node the launcher did not start.
    #[error("node {node} is not one of the node processes")]
    NotANode {
        /// The node.
        node: u16,
    },
    /// A restart needs the membership, and the run has no manager.
    #[error("--restart needs a configuration manager (embedded or etcd)")]
    NoManager,
    /// Every node's control output closed.
    #[error("every node's output closed")]
    AllOutputsClosed,
    /// A node to restart is not in the manager's configuration.
    #[error("node {node} is not in the manager's configuration")]
    NotInConfiguration {
        /// The node.
        node: u16,
    },
    /// A restarted node died before it was ready.
    #[error("node {node} died again before it was ready")]
    DiedAgain {
        /// The node.
        node: u16,
    },
    /// A restart came before every node had said `ready`.
    #[error("a restart needs every node's ready event first")]
    NoReadies,
    /// The catalog could not be made from the nodes' descriptors.
    #[error("{}{source}", restarting.map(|n| format!("restarting node {n}: ")).unwrap_or_default())]
    Catalog {
        /// The node being restarted, if the catalog was made for its restart.
        restarting: Option<u16>,
        /// Why.
        #[source]
        source: CatalogError,
    },
    /// A node's process ended badly, or not at all, when it should have exited.
    #[error("node {node} (pid {pid}) {ending} {when}")]
    Exit {
        /// The node.
        node: u16,
        /// Its process.
        pid: u32,
        /// How it ended.
        ending: Ending,
        /// When ("after its report").
        when: String,
    },
    /// A kill or restart of the run is not one it can do.
    #[error(transparent)]
    Fault(#[from] FaultError),
    /// `--node-timeout` out of range.
    #[error("--node-timeout must be in (0, 86400] seconds, not {0}")]
    NodeTimeout(f64),
    /// Restarts the run was asked for did not happen.
    #[error(
        "{count} restart(s) not done before the run ended (the node must be dead and \
         removed by the manager first: is the kill early enough?){}",
        last_read.as_ref().map(|e| format!("; the last read of the membership failed: {e}")).unwrap_or_default()
    )]
    RestartsNotDone {
        /// How many.
        count: usize,
        /// Why the last read of the membership failed, if it did.
        last_read: Option<String>,
    },
    /// A node's report does not parse.
    #[error("node {node} sent a malformed report: {source}")]
    Report {
        /// The node.
        node: u16,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// A node sent another node's report.
    #[error("node {node} sent the report of node {other}")]
    ReportOfOther {
        /// The node.
        node: u16,
        /// The report's node.
        other: u16,
    },
    /// The run's scratch directory could not be made.
    #[error("cannot create {path}: {source}")]
    ScratchDir {
        /// The directory.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The nodes' history files could not be merged.
    #[error("{what}: {source}")]
    History {
        /// What was being done, with the paths.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The membership (etcd) stopped the cluster: it could not go on.
    #[error("the cluster could not go on: {0}")]
    ClusterStopped(String),
    /// The run's configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The cluster's transport could not be made.
    #[error(transparent)]
    Transport(#[from] OpenError),
    /// A node runs another transaction policy than the cluster's.
    #[error(transparent)]
    Policy(#[from] NodePolicyError),
    /// The run's membership in etcd.
    #[error(transparent)]
    Membership(#[from] MembershipError),
    /// The launcher's manager.
    #[error(transparent)]
    Manager(#[from] ManagerHostError),
    /// The nodes' reports could not be combined.
    #[error(transparent)]
    Combine(#[from] CombineError),
    /// The run's configuration, workload or files.
    #[error(transparent)]
    Bench(#[from] Box<BenchError>),
}

impl From<BenchError> for LaunchError {
    fn from(e: BenchError) -> Self {
        LaunchError::Bench(Box::new(e))
    }
}

/// What a node did that failed the run.
#[derive(Debug, thiserror::Error)]
pub enum NodeTrouble {
    /// Its control output closed before an event the launcher waited for.
    #[error("died before sending {event:?} (its control output closed)")]
    DiedBefore {
        /// The event.
        event: String,
    },
    /// It did not send an event in time.
    #[error(
        "sent no {event:?} within {seconds:.0} s{}",
        if silent.is_empty() { String::new() } else {
            format!(" (nodes still silent: {})",
                silent.iter().map(u16::to_string).collect::<Vec<_>>().join(", "))
        }
    )]
    Silent {
        /// The event.
        event: String,
        /// How long the launcher waited.
        seconds: f64,
        /// Every node still silent.
        silent: Vec<u16>,
    },
    /// It reported an error (its message).
    #[error("reported an error: {0}")]
    Reported(String),
    /// A control line that is not a JSON object.
    #[error("sent a malformed control line: {0:?}")]
    Malformed(String),
    /// A control line without `event`.
    #[error("sent a control line without \"event\"")]
    NoEvent,
    /// Another event than the one the launcher waited for.
    #[error("sent {got:?} while the launcher waited for {want:?}")]
    Unexpected {
        /// What it sent.
        got: String,
        /// What the launcher waited for.
        want: String,
    },
    /// A command could not be written to it.
    #[error("could not be sent {0}")]
    NotSent(String),
    /// It died while the run went on, and deaths fail the run.
    #[error("died during the run (its control output closed)")]
    DiedDuringRun,
    /// Its control output could not be read.
    #[error(transparent)]
    Output(#[from] OutputTrouble),
    /// A restarted node runs another transaction policy.
    #[error("restarted with a transaction policy other than the cluster's")]
    OtherPolicy,
}

/// A node's control output that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum OutputTrouble {
    /// A line longer than the launcher reads.
    #[error("sent a control line over {0} bytes")]
    TooLong(u64),
    /// A line that is not UTF-8.
    #[error("sent a control line that is not UTF-8")]
    NotUtf8,
    /// The pipe failed.
    #[error("control output unreadable: {0}")]
    Unreadable(#[source] std::io::Error),
    /// A manager call with no manager to answer it.
    #[error(
        "sent a manager call, but the run has no manager (is its configuration the launcher's?)"
    )]
    NoManager,
    /// A manager call that cannot be read.
    #[error("sent a bad manager call: {0}")]
    BadManagerCall(#[source] ambidex_cluster::manager::channel::ChannelError),
}

/// How a node's process ended, as the launcher saw it.
#[derive(Debug)]
pub enum Ending {
    /// It exited or was killed by a signal.
    Exited(ExitStatus),
    /// It still ran, and the launcher killed it.
    KilledRunning,
    /// It still ran.
    Running,
}

impl fmt::Display for Ending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ending::Exited(st) => f.write_str(&super::exit::describe_exit(*st)),
            Ending::KilledRunning => f.write_str("was still running and was killed"),
            Ending::Running => f.write_str("did not exit"),
        }
    }
}

/// The launcher's embedded manager could not start.
#[derive(Debug, thiserror::Error)]
pub enum ManagerHostError {
    /// The cluster's shape has no initial configuration.
    #[error("the cluster's initial configuration: {0}")]
    Placement(#[from] ambidex_cluster::PlacementError),
    /// The thread that pushes states to the nodes.
    #[error("cannot start the manager's pusher: {0}")]
    Pusher(#[source] std::io::Error),
}
