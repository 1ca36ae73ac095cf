//! The `ambidex bench` subcommands.
pub mod rpc;
pub mod transport;
pub mod store;
