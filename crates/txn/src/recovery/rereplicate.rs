//! Re-replication (issue 18; FaRM SOSP'15 §5.4 "data recovery", paced in the
//! background): after a failure the manager gives each partition short of R copies a
//! *syncing* backup on another member. The partition's primary copies every item to
//! it, while transactions go on, and then tells it the partition is done; the backup's
//! agent reports the copy synced, and the manager marks it up to date (then it may be
//! promoted like any other copy).
//!
//! Why it is safe while transactions run: a syncing backup is a backup from the start
//! of the epoch, so every write committed in the epoch reaches it (COMMIT_BACKUP, or
//! its ring). Every copy of a key carries its primary's version (backups apply at the
//! version the primary installs, `actions::apply_backup`), and both a copied item and a
//! committed write are applied only if newer than the copy there
//! (`Table::apply_versioned`). So whichever of the two reaches the backup first, the
//! newer one stays. An item locked at the primary is read at its locked version (the
//! data is unchanged until its commit writes it, and that commit's backup write is
//! newer); a key inserted after the scan passed it reaches the backup by its commit.
//!
//! The copier runs on thread 0 of each primary, one partition list per syncing
//! backup, in COPY requests of [`REQUEST_BYTES`], paced to
//! `TxnConfig::rereplication_bytes_per_s`. It stops when the epoch changes (the new
//! configuration starts its own copies) or the run ends.

use super::RecoveryStats;
use crate::messages::{rtype, Ack, CopiedItem, CopyDoneReq, CopyReq};
use crate::TxnThread;
use ambidex_cluster::Placement;
use ambidex_rpc::Ctx;
use ambidex_store::ReadOutcome;
use ambidex_transport::NodeId;
use std::cell::Cell;

/// Bytes of items per COPY request (one per flush, within any destination's credits).
pub const REQUEST_BYTES: usize = 8 * 1024;
/// Keys read from a table's item list per step.
const SCAN_STEP: u32 = 256;
/// Requests in a row a backup does not take before the copy gives up (it is started
/// again by the next configuration).
const ROUNDS: u32 = 200;

/// Why a copy stopped before it was done.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CopyError {
    #[error("the configuration changed (epoch {0} is over)")]
    EpochChanged(u32),
    #[error("the run ended")]
    Stopped,
    #[error("node {0} did not take copies after {ROUNDS} requests (no answer, or refused: a full table)")]
    Unanswered(NodeId),
}

/// What this node must copy: per syncing backup, the partitions it is primary of.
pub fn work(placement: &Placement, me: NodeId) -> Vec<(NodeId, Vec<u32>)> {
    let mut out: Vec<(NodeId, Vec<u32>)> = Vec::new();
    for (p, i) in placement.syncing() {
        let replicas = placement.replicas_of(p);
        if replicas.first() != Some(&me) {
            continue;
        }
        let Some(&to) = replicas.get(i) else { continue };
        match out.iter_mut().find(|(n, _)| *n == to) {
            Some((_, parts)) => parts.push(p),
            None => out.push((to, vec![p])),
        }
    }
    out
}

/// Sends COPY requests at a given rate.
struct Pacer {
    start_ns: u64,
    bytes_per_s: u64,
    sent: u64,
}

impl Pacer {
    /// Whether `bytes` more may go at `now_ns` (a request's worth is always allowed
    /// ahead, so a slow rate still makes progress).
    fn allows(&self, now_ns: u64, bytes: u64) -> bool {
        let budget = (now_ns.saturating_sub(self.start_ns) as u128 * self.bytes_per_s as u128
            / 1_000_000_000) as u64
            + REQUEST_BYTES as u64;
        self.bytes_per_s == 0 || self.sent + bytes <= budget
    }
}

/// Copies every item of the partitions `work` lists to their syncing backups, in
/// `epoch`, then tells each backup its partitions are done. `stop` ends it early.
pub async fn copy(
    ctx: &Ctx,
    th: &TxnThread,
    epoch: u32,
    work: &[(NodeId, Vec<u32>)],
    bytes_per_s: u64,
    stop: &Cell<bool>,
    st: &mut RecoveryStats,
) -> Result<(), CopyError> {
    let config = th.config();
    if config.epoch != epoch {
        return Err(CopyError::EpochChanged(epoch));
    }
    let placement = &config.placement;
    let mut pacer = Pacer {
        start_ns: ctx.now_ns(),
        bytes_per_s,
        sent: 0,
    };
    let mut wanted = vec![false; placement.partitions() as usize];
    let mut req = Vec::new();
    let mut keys = Vec::new();
    for (to, parts) in work {
        wanted.fill(false);
        for &p in parts {
            wanted[p as usize] = true;
        }
        CopyReq::begin(&mut req);
        for t in th.db.tables() {
            let table = t.desc().table_id;
            let mut value = vec![0u8; t.value_size()];
            let mut from = 1;
            loop {
                keys.clear();
                let Some(next) = t.keys_from(from, SCAN_STEP, &mut keys) else {
                    break;
                };
                from = next;
                for &key in &keys {
                    if !wanted[placement.partition(table, key) as usize] {
                        continue;
                    }
                    let version = loop {
                        match t.try_get(key, &mut value) {
                            ReadOutcome::Found { version } => break Some(version),
                            ReadOutcome::NotFound => break None,
                            // Being written: its commit reaches the backup anyway, but
                            // the item is still copied once released.
                            ReadOutcome::Locked => {
                                check(ctx, epoch, stop)?;
                                ctx.yield_now().await;
                            }
                        }
                    };
                    let Some(version) = version else { continue };
                    let item = CopiedItem {
                        table,
                        key,
                        version,
                        stored: &value,
                    };
                    CopyReq::push(&mut req, &item);
                    st.items_copied += 1;
                    if req.len() >= REQUEST_BYTES || items_in(&req) == u16::MAX {
                        send(ctx, *to, rtype::COPY, &req, epoch, stop, &mut pacer, st).await?;
                        CopyReq::begin(&mut req);
                    }
                }
            }
        }
        if items_in(&req) > 0 {
            send(ctx, *to, rtype::COPY, &req, epoch, stop, &mut pacer, st).await?;
        }
        CopyDoneReq::encode(parts, &mut req);
        send(
            ctx,
            *to,
            rtype::COPY_DONE,
            &req,
            epoch,
            stop,
            &mut pacer,
            st,
        )
        .await?;
        st.partitions_copied += parts.len() as u64;
    }
    Ok(())
}

/// The items of a COPY request being built (its count is 16 bits).
fn items_in(req: &[u8]) -> u16 {
    u16::from_le_bytes([req[0], req[1]])
}

fn check(ctx: &Ctx, epoch: u32, stop: &Cell<bool>) -> Result<(), CopyError> {
    if stop.get() {
        Err(CopyError::Stopped)
    } else if ctx.epoch() != epoch {
        Err(CopyError::EpochChanged(epoch))
    } else {
        Ok(())
    }
}

/// Sends one request once the pacer allows it, again until the backup takes it.
#[allow(clippy::too_many_arguments)]
async fn send(
    ctx: &Ctx,
    to: NodeId,
    rtype: u8,
    req: &[u8],
    epoch: u32,
    stop: &Cell<bool>,
    pacer: &mut Pacer,
    st: &mut RecoveryStats,
) -> Result<(), CopyError> {
    while !pacer.allows(ctx.now_ns(), req.len() as u64) {
        check(ctx, epoch, stop)?;
        ctx.yield_now().await;
    }
    for _ in 0..ROUNDS {
        check(ctx, epoch, stop)?;
        let h = ctx.queue(to, rtype, req).ok();
        let _ = ctx.flush().await;
        if h.is_some_and(|h| ctx.response(h, Ack::is_ok).unwrap_or(false)) {
            pacer.sent += req.len() as u64;
            st.copy_requests += 1;
            st.copy_bytes += req.len() as u64;
            return Ok(());
        }
        ctx.yield_now().await;
    }
    Err(CopyError::Unanswered(to))
}
