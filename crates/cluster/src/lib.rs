//! # ambidex-cluster: configurations, placement, leases and membership
//!
//! DESIGN.md "Cluster and recovery". What is built (node processes run an agent
//! against the launcher's manager, but no node's threads act on a new configuration
//! yet):
//!
//! - [`placement`]: keys hash to a fixed set of partitions; each partition has a
//!   replica list (primary first) that changes only with a new configuration: a
//!   failed node's backups are promoted and new backups added, a rejoining node is
//!   added as a backup.
//! - `config`: a [`Configuration`] (epoch, incarnations, placement) and the
//!   [`ConfigCell`] a node's threads share it through.
//! - [`membership`]: the configuration manager's state machine, sans IO: leases,
//!   suspicions, the stages of a reconfiguration (adopt, recover, run) and joins.
//! - `lease`: a node's side of its lease ([`LeaseKeeper`]).
//! - `agent`: a node's [`Agent`] thread (renews the lease, follows the manager's state,
//!   acknowledges the stages its threads reached) and the [`NodeState`] the threads
//!   read.
//! - [`manager`]: the manager as a node calls it ([`ManagerClient`]); the embedded
//!   manager ([`EmbeddedManager`]), a client over a node's control channel
//!   ([`manager::channel`]), the stepped manager of the simulator ([`SteppedManager`]),
//!   and the etcd manager (cargo feature `etcd`).
//! - [`priority`]: real-time priority for the lease threads.
//! - [`rectrace`](mod@rectrace): recovery timings on stderr (`AMBIDEX_RECTRACE=1`).
//!
//! Modules named without a link are internal to the crate; what other crates use of
//! them is re-exported here.

pub(crate) mod agent;
pub(crate) mod config;
pub(crate) mod lease;
pub mod manager;
pub mod membership;
pub mod placement;

pub mod priority;
pub mod rectrace;
pub use agent::{Agent, AgentCore, NodeState};
pub use config::{ConfigCell, ConfigView, Configuration};
pub use lease::LeaseKeeper;
pub use manager::channel::{ChannelClient, ChannelInbox};
pub use manager::embedded::{EmbeddedClient, EmbeddedManager};
#[cfg(feature = "etcd")]
pub use manager::etcd::{EtcdClient, EtcdManager};
pub use manager::stepped::{SteppedClient, SteppedManager};
pub use manager::{ManagerClient, ManagerError};
pub use membership::{ClusterState, Event, EventKind, Grant, Membership, Refusal, Stage};
pub use placement::{Placement, PlacementError, MAX_NODES};
