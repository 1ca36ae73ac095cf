//! The multi-process launcher: a benchmark run whose every node is its own process
//! (`ambidex bench --transport shm|udp`).
//!
//! [`run_node_processes`] starts one process of this program per node
//! (`PROGRAM node --config FILE --node N`, optionally through a wrapper such as
//! `ip netns exec ns{node}` or `ssh host{node}`), drives each through the line-based
//! JSON control protocol on its stdin and stdout (docs/cluster.md; the node's side is
//! [`node_process`](crate::bench::node_process)), gives every node the cluster's catalog
//! of table descriptors, hosts the embedded configuration manager or bootstraps the run's cluster in etcd, kills and restarts
//! nodes when asked ([`KillSpec`], [`RestartSpec`]), and combines the nodes' reports.
//! [`NodeProcesses`] is the launcher itself: it watches the processes continuously and
//! reports a node that dies by name, pid and exit status ([`LaunchError::Node`]).

mod catalog;
mod error;
mod exit;
mod faults;
mod manager_host;
mod processes;
mod run;

pub use catalog::CatalogError;
pub use error::{Ending, LaunchError, ManagerHostError, NodeTrouble, OutputTrouble};
pub use faults::{check_kills, check_restarts, FaultError, KillSpec, RestartSpec};
pub use processes::{Death, Killed, Launch, NodeProcesses, NotRestarted, Restarted, StateView};
pub use run::{run_node_processes, LaunchOptions};
