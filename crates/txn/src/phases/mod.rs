//! The protocol's phases, one module each, as methods of [`crate::Txn`]; each issues
//! its work through the thread's [`crate::Policy`] (only the RPC choices are built).
//!
//! - [`execute`]: read-set values and versions (READ), with the write-set keys' locks
//!   ([`lock`]) in the same round trip.
//! - [`lock`]: LOCK (read under the lock) and UNLOCK; locks of transactions dropped
//!   without commit or abort ("orphans") are released by the thread's next round trip.
//! - [`validate`]: read-only keys' versions again (VALIDATE).
//! - [`log`]: the commit record to the coordinator's log replicas (LOG RPCs, or WRITEs
//!   into log rings with `Log::Write`, see [`crate::log_ring`]).
//! - [`commit`]: COMMIT_BACKUP to every backup, then COMMIT_PRIMARY to every primary.
//!
//! Keys whose primary (or backup) is this node go through [`crate::actions`] directly.

pub mod commit;
pub mod execute;
pub mod lock;
pub mod log;
pub mod validate;

use crate::stats::AbortReason;
use ambidex_rpc::RpcError;

/// Why a queued RPC's response is unusable: the destination is suspected (or the RPC
/// timed out) versus a malformed or refused response.
pub(crate) fn rpc_failure(e: &RpcError, flushed: bool) -> AbortReason {
    match e {
        RpcError::Timeout { .. } => AbortReason::Timeout,
        _ if !flushed => AbortReason::Timeout,
        _ => AbortReason::BadResponse,
    }
}
