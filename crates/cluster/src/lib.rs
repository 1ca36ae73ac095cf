//! # ambidex-cluster (not built yet)
//!
//! Membership, configuration epochs, leases and recovery (DESIGN.md "Cluster and
//! recovery"). A later issue builds it; the transport already stamps and checks the
//! epoch on every datagram so stale traffic is rejected once epochs change.
