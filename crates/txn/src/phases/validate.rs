//! Validate (FaSST §5 step 2, DrTM+H §5.2): the versions of read-only keys again; a key
//! changed, locked or gone aborts the transaction. By VALIDATE RPC, or with
//! [`policy::Validate::Read`] by one READ of the item's header at the address execute
//! learned (a key found absent has no item to READ and is validated by RPC).

use super::execute::onesided_failure;
use crate::actions;
use crate::messages::{rtype, Fetched, Status, ValidateReq, ValidateResp};
use crate::policy;
use crate::stats::AbortReason;
use crate::txn::{Item, Txn};
use ambidex_store::Header;

impl Txn<'_> {
    pub(crate) async fn validate_phase(&mut self) -> Result<(), AbortReason> {
        if self.th.cfg.skip_validation_for_tests {
            return Ok(());
        }
        let by_read = self.th.cfg.policy.validate == policy::Validate::Read;
        let db = self.th.db.clone();
        let mut req = std::mem::take(&mut self.bufs.req);
        let mut any = false;
        let mut failure = None;
        let mut reads = std::mem::take(&mut self.bufs.reads);
        reads.clear();
        for i in 0..self.items.len() {
            let it = &self.items[i];
            if it.write.is_some() {
                continue;
            }
            if let (true, Some(off), false) = (by_read, it.loc, it.home == db.node) {
                let queued = self.remote_table(i).and_then(|t| {
                    self.ctx
                        .queue_read(t.at(off), 8, true)
                        .map_err(|e| onesided_failure(&e))
                });
                match queued {
                    Ok(op) => {
                        reads.push((i, op));
                        any = true;
                    }
                    Err(r) => {
                        failure.get_or_insert(r);
                    }
                }
                continue;
            }
            let it = &mut self.items[i];
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
            let flushed = self.flushed(self.ctx.flush().await);
            for &(i, op) in &reads {
                let r = self
                    .ctx
                    .read_result(op, |b| {
                        u64::from_ne_bytes(
                            b.get(..8).and_then(|w| w.try_into().ok()).unwrap_or([0; 8]),
                        )
                    })
                    .map_err(|e| onesided_failure(&e))
                    .and_then(|word| header_unchanged(&self.items[i], word));
                if let Err(r) = r {
                    failure.get_or_insert(r);
                }
            }
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
        self.bufs.reads = reads;
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

/// Validation of one read-only key by its header word (READ): unlocked at the version
/// execute read.
fn header_unchanged(it: &Item, word: u64) -> Result<(), AbortReason> {
    if word == Header::unlocked(it.hdr) {
        Ok(())
    } else if Header::is_locked(word) && Header::version_of(word) == Header::version_of(it.hdr) {
        Err(AbortReason::LockedAtValidate)
    } else {
        Err(AbortReason::VersionChanged)
    }
}
