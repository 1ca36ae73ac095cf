//! Replays the writes of the records a thread holds to every replica of their keys in
//! the new configuration.

use super::{records, RecoveryStats};
use crate::actions::{self, Recovered};
use crate::messages::{rtype, RecoverReq, RecoverResp, Status, WriteRec};
use crate::TxnThread;
use ambidex_cluster::Placement;
use ambidex_rpc::Ctx;
use ambidex_transport::NodeId;

/// Bytes of writes per RECOVER request: one request per flush, so a few datagrams,
/// within any destination's credits.
const REQUEST_BYTES: usize = 8 * 1024;
/// Rounds a replica is asked again (for entries that met another lock, or requests
/// that failed) before recovery gives up.
const ROUNDS: u32 = 200;

/// Why a thread's recovery could not finish.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecoveryError {
    #[error("node {node} did not take recovered writes after {ROUNDS} rounds ({pending} left)")]
    Unfinished { node: NodeId, pending: usize },
}

/// One write to replay: its transaction and its encoded record.
struct Entry {
    txn: u64,
    write: Vec<u8>,
}

/// Replays every write of the records `th`'s log replica holds (and, with `rings`,
/// of the node's log rings: one thread does it) to every replica `placement` gives
/// its key, this node's own copies in place.
pub async fn replay(
    ctx: &Ctx,
    th: &TxnThread,
    placement: &Placement,
    rings: bool,
) -> Result<RecoveryStats, RecoveryError> {
    let mut st = RecoveryStats::default();
    let nodes = placement.nodes() as usize;
    // Per target node: the entries it must take.
    let mut per: Vec<Vec<usize>> = vec![Vec::new(); nodes];
    let mut entries: Vec<Entry> = Vec::new();
    let skip_dead = th.cfg.recovery_skips_dead_coordinators_for_tests;
    let mut add = |txn: u64, w: &WriteRec<'_>| {
        if skip_dead && !placement.is_member(crate::coordinator_of(txn).0) {
            // The planted bug (tests only): a dead coordinator's writes are dropped.
            return;
        }
        let mut write = Vec::new();
        w.encode(&mut write);
        let i = entries.len();
        entries.push(Entry { txn, write });
        for &r in placement.replicas(w.table, w.key) {
            if let Some(list) = per.get_mut(r as usize) {
                list.push(i);
            }
        }
    };
    st.records += records::in_log(&th.log.borrow(), &mut add);
    ambidex_cluster::rectrace!("node {} replay read {} log records", th.db.node, st.records);
    // Only coordinators that log by WRITE fill rings (the policy is the cluster's): an
    // unwritten ring is read whole, a load per 16 bytes, before it is found empty.
    if rings && th.cfg.policy.log == crate::policy::Log::Write {
        st.records += records::in_rings(&th.db, &mut add);
    }
    let me = th.db.node;
    ambidex_cluster::rectrace!("node {me} replay read {} records", st.records);
    for (node, list) in per.iter().enumerate() {
        st.writes_sent += list.len() as u64;
        if node as NodeId == me {
            apply_here(ctx, th, &entries, list, &mut st).await?;
            ambidex_cluster::rectrace!("node {me} replay applied here {}", list.len());
        }
    }
    for (node, list) in per.into_iter().enumerate() {
        if node as NodeId != me && !list.is_empty() {
            let n = list.len();
            send(ctx, node as NodeId, &entries, list, &mut st).await?;
            ambidex_cluster::rectrace!(
                "node {me} replay sent {n} to {node} busy {}",
                st.busy_retries
            );
        }
    }
    Ok(st)
}

/// Applies `list`'s entries to this node's copies, waiting (yielding) while a key is
/// locked by another transaction.
async fn apply_here(
    ctx: &Ctx,
    th: &TxnThread,
    entries: &[Entry],
    list: &[usize],
    st: &mut RecoveryStats,
) -> Result<(), RecoveryError> {
    let mut pending: Vec<usize> = list.to_vec();
    for _ in 0..ROUNDS {
        pending.retain(|&i| {
            let e = &entries[i];
            let mut r = crate::messages::Reader::new(&e.write);
            let r = match WriteRec::decode(&mut r) {
                Ok(w) => actions::recover_write(&th.db, e.txn, &w),
                Err(_) => Recovered::Refused,
            };
            st.count(r);
            r == Recovered::Busy
        });
        if pending.is_empty() {
            return Ok(());
        }
        ctx.yield_now().await;
    }
    Err(RecoveryError::Unfinished {
        node: th.db.node,
        pending: pending.len(),
    })
}

/// Sends `list`'s entries to `node` in RECOVER requests of at most `REQUEST_BYTES`,
/// one per flush (a flush must fit the destination's credits), and again those it
/// could not take yet (another lock) or whose request failed. Gives up after `ROUNDS`
/// flushes in a row that took nothing.
async fn send(
    ctx: &Ctx,
    node: NodeId,
    entries: &[Entry],
    list: Vec<usize>,
    st: &mut RecoveryStats,
) -> Result<(), RecoveryError> {
    let mut pending: std::collections::VecDeque<usize> = list.into();
    let mut req = Vec::new();
    let mut chunk: Vec<usize> = Vec::new();
    let mut idle_rounds = 0;
    while !pending.is_empty() {
        if idle_rounds >= ROUNDS {
            return Err(RecoveryError::Unfinished {
                node,
                pending: pending.len(),
            });
        }
        RecoverReq::begin(&mut req);
        chunk.clear();
        while let Some(&i) = pending.front() {
            let e = &entries[i];
            if !chunk.is_empty()
                && (req.len() + e.write.len() + 8 > REQUEST_BYTES
                    || chunk.len() == u16::MAX as usize)
            {
                break;
            }
            RecoverReq::push(&mut req, e.txn, &e.write);
            chunk.push(i);
            pending.pop_front();
        }
        let h = ctx.queue(node, rtype::RECOVER, &req).ok();
        let _ = ctx.flush().await;
        let resp = h.and_then(|h| ctx.response(h, RecoverResp::decode).ok()?.ok());
        let taken = match resp {
            Some(RecoverResp {
                status: Status::Ok,
                busy,
            }) => {
                st.busy_retries += busy.len() as u64;
                let again: Vec<usize> = busy
                    .iter()
                    .filter_map(|&b| chunk.get(b as usize).copied())
                    .collect();
                let taken = again.len() < chunk.len();
                pending.extend(again);
                taken
            }
            // Refused whole (malformed: a bug), or no answer: sent again.
            _ => {
                pending.extend(chunk.iter().copied());
                false
            }
        };
        if taken {
            idle_rounds = 0;
        } else {
            idle_rounds += 1;
            ctx.yield_now().await;
        }
    }
    Ok(())
}
