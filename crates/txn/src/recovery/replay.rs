//! Replays the writes of the records a thread holds to every replica of their keys in
//! the new configuration.

use super::{records, RecoveryStats};
use crate::actions::{self, Recovered};
use crate::messages::{rtype, RecoverReq, RecoverResp, Status, WriteRec};
use crate::TxnThread;
use ambidex_cluster::Placement;
use ambidex_rpc::Ctx;
use ambidex_transport::NodeId;

/// Bytes of writes per RECOVER request (well under the RPC layer's message limit).
const REQUEST_BYTES: usize = 32 * 1024;
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
    let mut add = |txn: u64, w: &WriteRec<'_>| {
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
    if rings {
        st.records += records::in_rings(&th.db, &mut add);
    }
    let me = th.db.node;
    for (node, list) in per.iter().enumerate() {
        st.writes_sent += list.len() as u64;
        if node as NodeId == me {
            apply_here(ctx, th, &entries, list, &mut st).await?;
        }
    }
    for (node, list) in per.into_iter().enumerate() {
        if node as NodeId != me && !list.is_empty() {
            send(ctx, node as NodeId, &entries, list, &mut st).await?;
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

/// Sends `list`'s entries to `node` in RECOVER requests, again for those it could not
/// take yet (another lock) or whose request failed.
async fn send(
    ctx: &Ctx,
    node: NodeId,
    entries: &[Entry],
    list: Vec<usize>,
    st: &mut RecoveryStats,
) -> Result<(), RecoveryError> {
    let mut pending = list;
    let mut req = Vec::new();
    for _ in 0..ROUNDS {
        // The requests of this round: (handle, entry indices).
        let mut out = Vec::new();
        let mut chunk: Vec<usize> = Vec::new();
        RecoverReq::begin(&mut req);
        let flush_chunk = |req: &mut Vec<u8>, chunk: &mut Vec<usize>, out: &mut Vec<_>| {
            if chunk.is_empty() {
                return;
            }
            match ctx.queue(node, rtype::RECOVER, req) {
                Ok(h) => out.push((Some(h), std::mem::take(chunk))),
                Err(_) => out.push((None, std::mem::take(chunk))),
            }
            RecoverReq::begin(req);
        };
        for &i in &pending {
            let e = &entries[i];
            if req.len() + e.write.len() + 8 > REQUEST_BYTES || chunk.len() == u16::MAX as usize {
                flush_chunk(&mut req, &mut chunk, &mut out);
            }
            RecoverReq::push(&mut req, e.txn, &e.write);
            chunk.push(i);
        }
        flush_chunk(&mut req, &mut chunk, &mut out);
        let _ = ctx.flush().await;
        let mut again = Vec::new();
        for (h, chunk) in out {
            let resp = h.and_then(|h| ctx.response(h, RecoverResp::decode).ok()?.ok());
            match resp {
                Some(RecoverResp {
                    status: Status::Ok,
                    busy,
                }) => {
                    st.busy_retries += busy.len() as u64;
                    again.extend(busy.iter().filter_map(|&b| chunk.get(b as usize)));
                }
                // Refused whole (malformed: a bug), or no answer: sent again.
                _ => again.extend(chunk),
            }
        }
        pending = again;
        if pending.is_empty() {
            return Ok(());
        }
        ctx.yield_now().await;
    }
    Err(RecoveryError::Unfinished {
        node,
        pending: pending.len(),
    })
}
