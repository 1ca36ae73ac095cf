//! # ambidex-rpc (in progress)
