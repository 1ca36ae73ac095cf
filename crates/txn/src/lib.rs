//! # ambidex-txn (not built yet)
//!
//! The transaction layer of DESIGN.md: OCC with two-phase commit, a coordinator log and
//! primary-backup replication (FaSST §5), with a per-phase choice of one-sided or
//! two-sided primitive (DrTM+H). It is the subject of a later issue; this crate holds no
//! code yet so that the workspace already shows the layers.
