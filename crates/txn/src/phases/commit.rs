//! Commit (FaSST §5 steps 4–5): COMMIT_BACKUP to every backup of a written key (waiting
//! for every ACK), then COMMIT_PRIMARY to every primary, which installs the value with
//! the transaction's version and releases the lock. Local copies are applied in place
//! through the item actions.

use crate::actions;
use crate::messages::{rtype, Ack, CommitBackupReq, CommitPrimaryReq};
use crate::policy;
use crate::txn::{Item, Txn};

impl Txn<'_> {
    /// Sends each node the writes it must apply: backups, or (`primaries`) primaries.
    /// Returns false if some node did not acknowledge.
    pub(crate) async fn commit_phase(&mut self, primaries: bool) -> bool {
        match self.th.cfg.policy.commit {
            policy::Commit::Rpc => self.commit_rpc(primaries).await,
            _ => todo!("issue 17: one-sided phases"),
        }
    }

    async fn commit_rpc(&mut self, primaries: bool) -> bool {
        let db = self.th.db.clone();
        let placement = db.placement;
        let me = db.node;
        let owner = self.owner;
        let mut targets = std::mem::take(&mut self.bufs.targets);
        targets.clear();
        for it in self.items.iter().filter(|it| it.write.is_some()) {
            if primaries {
                targets.push(it.home);
            } else {
                targets.extend(placement.backups(it.table, it.key));
            }
        }
        targets.sort_unstable();
        targets.dedup();
        let mut ok = true;
        let mut handles = std::mem::take(&mut self.bufs.handles);
        handles.clear();
        let mut req = std::mem::take(&mut self.bufs.req);
        for &node in &targets {
            let holds = |it: &Item| {
                if primaries {
                    it.home == node
                } else {
                    placement.backups(it.table, it.key).any(|b| b == node)
                }
            };
            if node == me {
                for w in self.writes(holds) {
                    ok &= if primaries {
                        actions::install(&db, self.id, &w, owner)
                    } else {
                        actions::apply_backup(&db, self.id, &w)
                    };
                }
                continue;
            }
            req.clear();
            let mut enc = if primaries {
                CommitPrimaryReq::begin(&mut req, self.id, owner.slot)
            } else {
                CommitBackupReq::begin(&mut req, self.id)
            };
            for w in self.writes(holds) {
                enc.push(&mut req, &w);
            }
            enc.finish(&mut req);
            let rt = if primaries {
                rtype::COMMIT_PRIMARY
            } else {
                rtype::COMMIT_BACKUP
            };
            match self.ctx.queue(node, rt, &req) {
                Ok(h) => handles.push(h),
                Err(_) => ok = false,
            }
        }
        self.bufs.req = req;
        self.bufs.targets = targets;
        if !handles.is_empty() {
            let flushed = self.ctx.flush().await;
            ok &= flushed.is_ok();
            for &h in &handles {
                ok &= self.ctx.response(h, Ack::is_ok).unwrap_or(false);
            }
        }
        self.bufs.handles = handles;
        if primaries {
            for it in &mut self.items {
                it.lock = None;
            }
        }
        ok
    }
}
