//! Validate (FaSST §5 step 2): the versions of read-only keys again; a key changed,
//! locked or gone aborts the transaction.

use crate::actions;
use crate::messages::{rtype, Fetched, Status, ValidateReq, ValidateResp};
use crate::policy;
use crate::stats::AbortReason;
use crate::txn::{Item, Txn};

impl Txn<'_> {
    pub(crate) async fn validate_phase(&mut self) -> Result<(), AbortReason> {
        if self.th.cfg.skip_validation_for_tests {
            return Ok(());
        }
        match self.th.cfg.policy.validate {
            policy::Validate::Rpc => self.validate_rpc().await,
            _ => todo!("issue 17: one-sided phases"),
        }
    }

    async fn validate_rpc(&mut self) -> Result<(), AbortReason> {
        let db = self.th.db.clone();
        let mut req = std::mem::take(&mut self.bufs.req);
        let mut any = false;
        let mut failure = None;
        for it in &mut self.items {
            if it.write.is_some() {
                continue;
            }
            if it.home == db.node {
                if let Err(r) = check_unchanged(it, actions::check_version(&db, it.table, it.key)) {
                    failure.get_or_insert(r);
                }
                continue;
            }
            req.clear();
            ValidateReq {
                table: it.table,
                key: it.key,
            }
            .encode(&mut req);
            match self.ctx.queue(it.home, rtype::VALIDATE, &req) {
                Ok(h) => {
                    it.pending = Some(h);
                    any = true;
                }
                Err(_) => {
                    failure.get_or_insert(AbortReason::Timeout);
                }
            }
        }
        self.bufs.req = req;
        if any {
            let flushed = self.ctx.flush().await.is_ok();
            for it in &mut self.items {
                let Some(h) = it.pending.take() else { continue };
                let r = match self.ctx.response(h, ValidateResp::decode) {
                    Ok(Ok(v)) => check_unchanged(
                        it,
                        Fetched {
                            status: v.status,
                            version: v.version,
                            token: Default::default(),
                        },
                    ),
                    Ok(Err(_)) => Err(AbortReason::BadResponse),
                    // Any failed RPC after a clean flush is a bad response here (as it
                    // always was for validation); a suspected node is a timeout.
                    Err(_) if flushed => Err(AbortReason::BadResponse),
                    Err(_) => Err(AbortReason::Timeout),
                };
                if let Err(r) = r {
                    failure.get_or_insert(r);
                }
            }
        }
        failure.map_or(Ok(()), Err)
    }
}

/// Validation of one read-only key: same existence, same version, not locked.
fn check_unchanged(it: &Item, f: Fetched) -> Result<(), AbortReason> {
    match f.status {
        Status::Locked => Err(AbortReason::LockedAtValidate),
        Status::Ok | Status::Absent => {
            if (f.status == Status::Ok) != it.exists || f.version != it.version {
                Err(AbortReason::VersionChanged)
            } else {
                Ok(())
            }
        }
        _ => Err(AbortReason::BadResponse),
    }
}
