//! # ambidex
//!
//! Serializable, replicated ACID transactions over a partitioned in-memory key-value
//! store: optimistic concurrency control with two-phase commit over a coordinator log
//! and primary-backup replication (FaSST, FaRM, DrTM+H), every phase by RPC or by
//! one-sided verbs of an RDMA-shaped transport, per the transaction policy.
//!
//! This crate is the one public entry point. An application declares its tables, starts
//! a cluster (or makes itself one node of one), and runs transactions as closures.
//!
//! ## A replicated bank in a few lines
//!
//! ```
//! use ambidex::{Cluster, Config, Error, Schema};
//!
//! # fn main() -> Result<(), Error> {
//! // Tables first: typed keys and values, and the rows to make room for.
//! let mut schema = Schema::new();
//! let accounts = schema.table::<u64, i64>("accounts", 1_000)?;
//!
//! // Three nodes in this process (the default configuration), every row on all three.
//! let cluster = Cluster::local(&Config::default(), &schema)?;
//! let node = cluster.node(0)?;
//!
//! let t = accounts.clone();
//! node.run(async move |tx| {
//!     tx.insert(&t, 1, &100)?;
//!     tx.insert(&t, 2, &0)
//! })?;
//!
//! // A transfer: both rows fetched (and locked) in one round trip, written at commit.
//! // A conflict with another transaction aborts it; `run` retries it after a backoff.
//! let t = accounts.clone();
//! node.run(async move |tx| {
//!     let b = tx.get_many_for_update(&t, &[1, 2]).await?;
//!     if b[0] < 30 {
//!         return Err(Error::user("insufficient funds")); // aborts, not retried
//!     }
//!     tx.put(&t, 1, &(b[0] - 30))?;
//!     tx.put(&t, 2, &(b[1] + 30))
//! })?;
//!
//! // A read-only transaction sees one serializable snapshot.
//! let t = accounts.clone();
//! let total: i64 = cluster.node(2)?.read(async move |tx| {
//!     Ok(tx.get_many(&t, &[1, 2]).await?.into_iter().flatten().sum())
//! })?;
//! assert_eq!(total, 100);
//! cluster.shutdown()?;
//! # Ok(())
//! # }
//! ```
//!
//! ## The pieces
//!
//! - **Tables** ([`Schema`], [`Table`]): keys are any [`Key`] (integers, pairs of `u32`,
//!   8 bytes) packed into the store's 8-byte keys; values any [`Value`] (integers,
//!   strings, bytes, [`Json`] records, or an application's own encoding), fixed-size or
//!   up to a maximum length per table.
//! - **Clusters and nodes**: [`Cluster::local`] starts every node in this process (over
//!   the `local` transport, or `shm`/`udp`); [`Node::start`] makes this program one node
//!   of a cluster whose nodes are separate processes or hosts (`udp` or `shm`; see
//!   [`NodeProcess`] for what it supports). The [`Config`] (a TOML or JSON file, or
//!   built in code) gives the shape: nodes, threads per node, replication, transport,
//!   transaction policy (`fasst`, `farm`, `drtm-r`, `drtm-h`).
//! - **Transactions**: [`Node::run`] (read-write, [`Tx`]), [`Node::read`] (read-only,
//!   [`ReadTx`]); [`Node::spawn`] queues one without waiting, so many run at once on a
//!   node's threads (each runs up to `run.coroutines` concurrently, interleaved at every
//!   round trip). Transient aborts are retried by the [`RetryPolicy`]; a closure may run
//!   several times.
//! - **Errors** ([`Error`]): what failed, and [`Error::retryable`] says whether running
//!   the transaction again can help.
//!
//! ## Benchmarks and simulation of one's own workload
//!
//! A benchmark workload implements [`workload::Workload`] (tables, loader, transaction
//! mix on the transaction layer's raw API, invariant checks) and is registered by name in
//! a [`workload::Registry`]: [`bench::run_bench`] runs it on a cluster and reports
//! throughput, latency and aborts as `ambidex bench` does, and [`sim::run`] runs seeds of
//! the whole cluster in one thread with faults and checks every history, as
//! `ambidex sim` does. The papers' workloads (`ambidex-workloads`) are registered the
//! same way. `examples/custom_workload.rs` shows one.
//!
//! ## Examples
//!
//! `examples/bank_transfer.rs` (transfers from every node of a 3-node cluster),
//! `examples/counter_service.rs` (3 node processes over UDP on loopback) and
//! `examples/custom_workload.rs`; each is also a test, so CI runs them.

#![warn(missing_docs)]

pub mod bench;
mod cluster;
pub mod codec;
pub mod config;
mod error;
mod node;
mod process;
pub mod retry;
pub mod schema;
mod service;
pub mod sim;
pub mod transports;
mod tx;
pub mod workload;

/// Transaction histories: the format runs record (`run.history`), the serializability
/// checker, the export for the external checker `adya`, and the merge of node
/// processes' histories.
pub use ambidex_history as history;

pub use cluster::{Cluster, ClusterReport, DEFAULT_COROUTINES};
pub use codec::{DecodeError, Json, Key, Value};
pub use config::{Config, ConfigError};
pub use error::{AbortReason, Error, StartError};
pub use node::{Node, TxnHandle};
pub use process::NodeProcess;
pub use retry::RetryPolicy;
pub use schema::{Schema, SchemaError, Table};
pub use tx::{ReadTx, Tx};
