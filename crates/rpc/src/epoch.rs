//! The cluster's epoch as a runtime follows it (issue 18). The cluster layer owns the
//! configuration; a runtime only needs its epoch, stamped on every datagram, and its
//! members, the only nodes it sends to. When the epoch changes, the runtime fails every
//! request and one-sided operation of the old one ([`RpcError::EpochChanged`]): an
//! answer stamped with the old epoch would be dropped anyway, and nothing queued in the
//! old epoch may execute in the new one, where recovery has decided its transaction.
//!
//! [`RpcError::EpochChanged`]: crate::RpcError::EpochChanged

use ambidex_transport::NodeId;

/// What a runtime reads of its node's configuration (one atomic load per check; the
/// runtime checks when it reads its clock).
pub trait EpochWatch: Send + Sync {
    /// The node's current epoch.
    fn epoch(&self) -> u32;
    /// The members of that epoch, bit `n` for node `n` (nodes 64 and up are always
    /// taken as members).
    fn members(&self) -> u64;
}

/// Whether `node` is in `mask` (see [`EpochWatch::members`]).
#[inline(always)]
pub fn is_member(mask: u64, node: NodeId) -> bool {
    node >= 64 || mask & (1u64 << node) != 0
}
