//! # ambidex-cluster: configurations, placement, leases and membership
//!
//! DESIGN.md "Cluster and recovery". What is built:
//!
//! - [`placement`]: keys hash to a fixed set of partitions; each partition has a
//!   replica list (primary first) that changes only with a new configuration: a
//!   failed node's backups are promoted and new backups added, a rejoining node is
//!   added as a backup.
//! - [`config`]: a [`Configuration`] (epoch, incarnations, placement) and the
//!   [`ConfigCell`] a node's threads share it through.
//! - [`membership`]: the configuration manager's state machine, sans IO: leases,
//!   suspicions, the stages of a reconfiguration (adopt, recover, run) and joins.

pub mod config;
pub mod membership;
pub mod placement;

pub use config::{ConfigCell, ConfigView, Configuration};
pub use membership::{ClusterState, Grant, Membership, Refusal, Stage};
pub use placement::{Placement, PlacementError, MAX_NODES};
