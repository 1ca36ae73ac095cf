//! The benchmark harness: runs any registered [`Workload`](crate::workload::Workload) on
//! a cluster and reports what it did (`ambidex bench`).
//!
//! - [`driver`]: [`Config`](crate::Config) → [`run_bench`] → [`BenchReport`] (a
//!   transaction aborted for a transient reason is retried from the same inputs;
//!   attempts and commits are both reported); [`run_workload`] for a workload value
//!   built by the caller; [`sweep_coroutines`] for the throughput–latency curve (FaSST
//!   Figure 10); [`report`] holds the report's policy, one-sided and location-cache
//!   parts, shared with the simulator.
//! - [`run_bench`] runs every node in one process (local fabric, or shm/udp with every
//!   node opened here); [`launch::run_node_processes`] runs every node as its own
//!   process (`ambidex bench --transport shm|udp`): [`launch`] starts and drives them,
//!   [`node_process`] is one of them (`ambidex node`), [`node`] its database and
//!   threads, and [`combine_node_reports`] ([`combine`]) merges their reports into the
//!   same [`BenchReport`]; [`load`] builds and loads every path's databases.
//! - [`survival`] and [`lost`]: what a run with failures reports (kills, restarts,
//!   recovery, the first commit that touched a failed node's data);
//!   [`etcd_membership`]: a run's membership kept in etcd.

pub mod combine;
pub mod driver;
mod error;
pub mod etcd_membership;
pub mod launch;
pub mod load;
pub mod lost;
pub mod node;
pub mod node_process;
pub mod report;
pub mod survival;

pub use combine::{combine_node_reports, NodeReport};
pub use driver::{
    run_bench, run_workload, sweep_coroutines, BenchReport, LatencyUs, SweepPoint, TypeReport,
};
pub use error::{BenchError, NodeError};
pub use load::build_and_load;
pub use report::{OneSidedCounts, PolicyReport};
