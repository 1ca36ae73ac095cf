//! # ambidex
//!
//! Serializable, replicated ACID transactions over a partitioned in-memory key-value
//! store.

pub mod bench;
pub mod codec;
mod cluster;
pub mod config;
mod error;
pub mod retry;
pub mod schema;
mod service;
pub mod sim;
pub mod transports;
mod tx;
pub mod workload;

pub use cluster::{Cluster, ClusterReport, Node, TxnHandle, DEFAULT_COROUTINES};
pub use codec::{DecodeError, Json, Key, Value};
pub use config::{Config, ConfigError};
pub use error::{AbortReason, Error, StartError};
pub use retry::RetryPolicy;
pub use schema::{Schema, SchemaError, Table};
pub use tx::{ReadTx, Tx};
