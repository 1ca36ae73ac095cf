//! Time for the runtime comes only through [`Clock`], so a deterministic simulator can
//! supply simulated time (a [`ManualClock`] it advances itself). The clock types live in
//! the transport crate, the lowest layer, so every layer reads the same one.

pub use ambidex_transport::clock::{Clock, ManualClock, SharedClock, SystemClock};
