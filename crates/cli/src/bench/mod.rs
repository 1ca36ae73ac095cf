//! The `ambidex bench` subcommands.
pub mod rpc;
pub mod store;
pub mod transport;
pub mod workload;
