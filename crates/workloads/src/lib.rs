//! # ambidex-workloads: the papers' benchmarks
//!
//! The workloads of `WORKLOADS.md` on the transaction layer (`ambidex-txn`), their
//! parallel loaders and invariant checks, and the driver behind `ambidex bench WORKLOAD`:
//!
//! - [`objstore`]: FaSST's object store O(r, w) (§6.1).
//! - [`tatp`]: TATP, all seven transactions, NURand subscriber ids (FaSST §6.2).
//! - [`smallbank`]: SmallBank, six transactions, 4% hot accounts for 90% of transactions
//!   (FaSST §6.3, DrTM+H §5); exact money invariant.
//! - [`tpcc`]: TPC-C's five-transaction mix and DrTM+H's `tpcc-no`; consistency
//!   conditions 1–4.
//! - [`stress`]: FaSST's stress test (groups of keys read, set or deleted whole).
//! - [`tpce`]: TPC-E's customer position, a distributed read-only transaction, with 1%
//!   market feeds (DrTM+H §5.5); LAST_TRADE's volume and feed-snapshot invariants.
//! - [`config`]: [`Config`], the one configuration of every path (in-process, node
//!   processes, simulator); [`transports`] opens a configured cluster's nodes.
//! - [`driver`]: [`Config`] → [`run_bench`] → [`BenchReport`] (a transaction aborted
//!   for a transient reason is retried from the same inputs; attempts and commits are
//!   both reported); [`run_workload`] for a workload built outside this crate;
//!   [`sweep_coroutines`] for the throughput–latency curve (FaSST Figure 10); [`plot`] draws it, or the
//!   per-phase breakdown, as SVG; [`report`] holds the report's policy, one-sided and
//!   location-cache parts, shared with the simulator.
//!
//! [`run_bench`] runs every node in one process (local fabric, or shm with every node
//! opened here); [`node`] runs one node of a cluster whose nodes are separate processes
//! (`ambidex node`, driven by `ambidex bench --transport shm|udp`), and
//! [`combine_node_reports`] ([`combine`]) merges their reports into the same
//! [`BenchReport`]; [`load`] builds and loads every path's databases.
//!
//! Paper-scale settings (`--scale 1`): object store 1,000,000 keys per thread; TATP
//! 1,000,000 subscribers per node; SmallBank 100,000 accounts per thread; TPC-C one
//! warehouse's spec-size tables, 24 warehouses per node; TPC-E 5,000 customers per node.
//! The default scales ([`WorkloadKind::quick_scale`]) keep a 3-node run on a 2-core
//! machine to a few seconds of loading.

pub mod combine;
pub mod common;
pub mod driver;
pub mod etcd_membership;
pub mod load;
pub mod lost;
pub mod node;
pub mod objstore;
pub mod plot;
pub mod report;
pub mod smallbank;
pub mod stress;
pub mod survival;
pub mod tatp;
pub mod tpcc;
pub mod tpce;

/// The configuration and transports live in the facade (`ambidex`).
pub use ambidex::{config, transports};
pub use combine::{combine_node_reports, NodeReport};
pub use common::{Outcome, Workload};
pub use config::{Config, ConfigError, ObjStoreParams, Transport, WorkloadKind};
pub use driver::{
    run_bench, run_workload, sweep_coroutines, BenchReport, LatencyUs, SweepPoint, TypeReport,
};
pub use load::build_and_load;
pub use report::{OneSidedCounts, PolicyReport};
