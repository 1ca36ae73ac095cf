//! # ambidex
//!
//! Serializable, replicated ACID transactions over a partitioned in-memory key-value
//! store.

pub mod config;
pub mod transports;

pub use config::{Config, ConfigError};
