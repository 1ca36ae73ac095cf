//! # ambidex-store (in progress)
