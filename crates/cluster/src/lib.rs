//! # ambidex-cluster (not built yet)
//!
//! Membership, configuration epochs, leases and recovery (DESIGN.md "Cluster and
//! recovery") are a later issue; nothing here runs today. What exists below it: the
//! transport stamps an epoch on every datagram and drops datagrams whose epoch differs
//! from its own, but nothing ever changes the epoch (it is fixed at start-up), so no
//! traffic is "stale" yet; and the RPC runtime reports destinations it suspects
//! (`Runtime::take_suspects`), which only make the waiting transactions abort: no
//! component acts on a suspicion. One dead node stops a run.
