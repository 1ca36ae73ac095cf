//! The `ambidex bench` subcommands.
pub mod transport;
