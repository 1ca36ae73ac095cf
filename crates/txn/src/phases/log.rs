//! Log (FaSST §5 step 3): the commit record (every write) to each of the coordinator's
//! log replicas; the coordinator's own node is always one and appends in place. Records
//! of transactions installed everywhere are truncated by piggybacking their ids on the
//! next LOG to that replica.

use crate::messages::{rtype, Ack, LogReq};
use crate::policy;
use crate::stats::AbortReason;
use crate::txn::Txn;

impl Txn<'_> {
    pub(crate) async fn log_phase(&mut self) -> Result<(), AbortReason> {
        match self.th.cfg.policy.log {
            policy::Log::Rpc => self.log_rpc().await,
            _ => todo!("issue 17: one-sided phases"),
        }
    }

    async fn log_rpc(&mut self) -> Result<(), AbortReason> {
        let placement = self.th.db.placement;
        let me = self.th.db.node;
        // The records alone (no count): what every replica stores.
        let mut body = std::mem::take(&mut self.bufs.body);
        body.clear();
        let mut n = 0u16;
        for w in self.writes(|_| true) {
            w.encode(&mut body);
            n += 1;
        }
        self.th.log.borrow_mut().append(self.id, me, &body);
        let mut handles = std::mem::take(&mut self.bufs.handles);
        handles.clear();
        let mut req = std::mem::take(&mut self.bufs.req);
        let mut queued = Ok(());
        for replica in placement.log_replicas(me).skip(1) {
            req.clear();
            self.th.with_truncations(replica, |ids| {
                LogReq::encode(&mut req, self.id, n, &body, ids)
            });
            match self.ctx.queue(replica, rtype::LOG, &req) {
                Ok(h) => handles.push(h),
                Err(_) => {
                    queued = Err(AbortReason::Timeout);
                    break;
                }
            }
        }
        self.bufs.req = req;
        self.bufs.body = body;
        if queued.is_err() || handles.is_empty() {
            self.bufs.handles = handles;
            return queued;
        }
        let flushed = self.ctx.flush().await.is_ok();
        let mut result = Ok(());
        for &h in &handles {
            let acked = self.ctx.response(h, Ack::is_ok).unwrap_or(false);
            if !acked || !flushed {
                // The record may sit at some replicas; recovery resolves it as aborted
                // since not all replicas have it.
                self.th.log.borrow_mut().truncate(self.id);
                result = Err(AbortReason::Timeout);
                break;
            }
        }
        self.bufs.handles = handles;
        result
    }
}
