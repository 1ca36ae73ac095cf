//! # ambidex-workloads (not built yet)
//!
//! The papers' workloads (object store, TATP, SmallBank, TPC-C) arrive with the
//! workloads issue; until then the CLI benchmarks the transport and RPC layers directly.
