//! The protocol's phases, one module each, as methods of [`crate::Txn`]; each issues
//! its work through the thread's [`crate::Policy`] (`docs/transactions.md`).
//!
//! - [`execute`]: values and versions (READ RPC, one-sided READs, the location cache),
//!   with the write-set keys' locks ([`lock`]) in the same round trip when the policy
//!   folds them in.
//! - [`lock`]: LOCK RPC or CAS with a header READ, after execute unless folded into it;
//!   releases; locks of transactions dropped without commit or abort ("orphans") are
//!   released by the thread's next round trip.
//! - [`validate`]: read-only keys' versions again (VALIDATE RPC or a header READ).
//! - [`log`]: the commit record to the coordinator's log replicas (LOG RPCs, or WRITEs
//!   into log rings with `Log::Write`, see [`crate::log_ring`]).
//! - [`commit`]: COMMIT_BACKUP to every backup, then COMMIT_PRIMARY (or one-sided
//!   WRITEs and a releasing CAS) to every primary; inline, or by a committer.
//!
//! Keys whose primary (or backup) is this node go through [`crate::actions`] directly.

pub(crate) mod commit;
pub(crate) mod execute;
pub(crate) mod lock;
pub(crate) mod log;
pub(crate) mod validate;

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
