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

pub mod config;
pub mod placement;

pub use config::{ConfigCell, ConfigView, Configuration};
pub use placement::{Placement, PlacementError, MAX_NODES};
