//! The runtime's counters: every drop, retransmission and failure is counted here, so
//! that bad input and faults are visible without logging.

use serde::{Deserialize, Serialize};

/// Counters of one runtime; every drop and retransmission is here.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct RpcStats {
    pub rpcs_issued: u64,
    pub rpcs_completed: u64,
    pub rpcs_failed: u64,
    pub flushes: u64,
    /// Flushes whose batch joined another flush's group as a part (no window entry of
    /// its own).
    pub flushes_joined: u64,
    pub requests_served: u64,
    pub no_handler: u64,
    /// Duplicate requests answered from the response cache (handler not rerun).
    pub duplicate_requests: u64,
    /// Duplicates of requests the client already settled (dropped).
    pub stale_requests: u64,
    pub out_of_window_requests: u64,
    pub retransmits: u64,
    pub suspected: u64,
    pub rx_datagrams: u64,
    pub rx_malformed: u64,
    pub rx_unknown_response: u64,
    pub rx_duplicate_response: u64,
    pub rx_bad_segment: u64,
    pub reassembly_evicted: u64,
    pub tx_datagrams: u64,
    pub tx_doorbells: u64,
    pub send_errors: u64,
    pub credit_waits: u64,
    pub resumes: u64,
    /// One-sided operations posted, by verb.
    pub onesided_reads: u64,
    pub onesided_writes: u64,
    pub onesided_cas: u64,
    pub onesided_faa: u64,
    /// One-sided operations that failed (error completions, signaled or not, and
    /// operations of a refused post).
    pub onesided_failed: u64,
    /// Of those, unsignaled ones (each reported to its worker by its next flush).
    pub onesided_unsignaled_failed: u64,
    /// Completions that matched no posted operation (dropped).
    pub onesided_stray: u64,
    /// Epochs this runtime moved to, and the requests and operations of an older epoch
    /// it failed then (in flight or still queued).
    pub epoch_changes: u64,
    pub failed_by_epoch: u64,
    /// Requests and operations refused because their node is not a member.
    pub not_member: u64,
}

impl RpcStats {
    pub fn merge(&mut self, o: &RpcStats) {
        macro_rules! add { ($($f:ident),*) => { $(self.$f += o.$f;)* } }
        add!(
            rpcs_issued,
            rpcs_completed,
            rpcs_failed,
            flushes,
            flushes_joined,
            requests_served,
            no_handler,
            duplicate_requests,
            stale_requests,
            out_of_window_requests,
            retransmits,
            suspected,
            rx_datagrams,
            rx_malformed,
            rx_unknown_response,
            rx_duplicate_response,
            rx_bad_segment,
            reassembly_evicted,
            tx_datagrams,
            tx_doorbells,
            send_errors,
            credit_waits,
            resumes,
            onesided_reads,
            onesided_writes,
            onesided_cas,
            onesided_faa,
            onesided_failed,
            onesided_unsignaled_failed,
            onesided_stray,
            epoch_changes,
            failed_by_epoch,
            not_member
        );
    }
}
