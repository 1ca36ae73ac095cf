//! # ambidex-workloads: the papers' benchmarks
//!
//! The workloads of `WORKLOADS.md`, written against the facade's workload API
//! (`ambidex::workload`) only, with their loaders and invariant checks:
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
//! - [`registry`](mod@registry): [`register`] puts them all into a registry under their names
//!   ([`WorkloadKind`]), with their default scales for benchmarks and simulations; the
//!   benchmark driver (`ambidex::bench`), node processes and the simulator
//!   (`ambidex::sim`) run them from there, as they run an application's workloads.
//!
//! Paper-scale settings (`--scale 1`): object store 1,000,000 keys per thread; TATP
//! 1,000,000 subscribers per node; SmallBank 100,000 accounts per thread; TPC-C one
//! warehouse's spec-size tables, 24 warehouses per node; TPC-E 5,000 customers per node.
//! The default scales (each registration's `default_scale`) keep a 3-node run on a
//! 2-core machine to a few seconds of loading.

pub mod common;
pub mod objstore;
pub mod registry;
pub mod smallbank;
pub mod stress;
pub mod tatp;
pub mod tpcc;
pub mod tpce;

pub use registry::{register, registry, WorkloadKind};
