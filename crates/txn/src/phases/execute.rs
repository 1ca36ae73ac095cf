//! Execute (FaSST §5 step 1): fetch the values and versions of read-set keys; write-set
//! keys are locked and read under the lock in the same round trip ([`super::lock`]).

use super::rpc_failure;
use crate::actions;
use crate::messages::{DecodeError, Fetched, ReadReq, ReadResp, Status, WriteKind};
use crate::policy;
use crate::stats::AbortReason;
use crate::txn::{Item, Txn};
use ambidex_rpc::ReqHandle;

impl Txn<'_> {
    /// Fetches every key not yet fetched with one doorbell. The caller aborts on error.
    pub(crate) async fn execute_phase(&mut self) -> Result<(), AbortReason> {
        match self.th.cfg.policy.execute {
            policy::Execute::Rpc => self.execute_rpc().await,
            _ => todo!("issue 17: one-sided phases"),
        }
    }

    async fn execute_rpc(&mut self) -> Result<(), AbortReason> {
        let db = self.th.db.clone();
        let me = db.node;
        let mut any_remote = self.queue_orphans();
        let mut failure = None;
        let mut req = std::mem::take(&mut self.bufs.req);
        for i in 0..self.items.len() {
            let it = &self.items[i];
            if it.fetched {
                continue;
            }
            if it.write.is_some() {
                match self.lock_item(i, &mut req) {
                    Ok(remote) => any_remote |= remote,
                    Err(r) => {
                        failure.get_or_insert(r);
                    }
                }
                continue;
            }
            let it = &mut self.items[i];
            if it.home == me {
                let mut val = std::mem::take(&mut it.value);
                val.clear();
                let f = actions::read(&db, it.table, it.key, &mut val);
                if let Err(r) = absorb(it, f, val) {
                    failure.get_or_insert(r);
                }
                continue;
            }
            req.clear();
            ReadReq {
                table: it.table,
                key: it.key,
            }
            .encode(&mut req);
            match self.ctx.queue(it.home, crate::messages::rtype::READ, &req) {
                Ok(h) => {
                    it.pending = Some(h);
                    any_remote = true;
                }
                Err(_) => {
                    failure.get_or_insert(AbortReason::Timeout);
                }
            }
        }
        self.bufs.req = req;
        if any_remote {
            let flushed = self.ctx.flush().await.is_ok();
            for i in 0..self.items.len() {
                let Some(h) = self.items[i].pending.take() else {
                    continue;
                };
                let r = if self.items[i].write.is_some() {
                    self.absorb_lock_response(i, h, flushed)
                } else {
                    self.absorb_read_response(i, h, flushed)
                };
                if let Err(r) = r {
                    failure.get_or_insert(r);
                }
            }
        }
        failure.map_or(Ok(()), Err)
    }

    #[inline]
    fn absorb_read_response(
        &mut self,
        i: usize,
        h: ReqHandle,
        flushed: bool,
    ) -> Result<(), AbortReason> {
        self.take_fetch(i, h, flushed, |b| {
            ReadResp::decode(b).map(|r| {
                let f = Fetched {
                    status: r.status,
                    version: r.version,
                    token: Default::default(),
                };
                (f, r.value)
            })
        })
    }

    /// Takes the READ or LOCK response `h` of item `i` (decoded by `decode` into its
    /// head and value) into the item.
    #[inline]
    pub(crate) fn take_fetch(
        &mut self,
        i: usize,
        h: ReqHandle,
        flushed: bool,
        decode: impl FnOnce(&[u8]) -> Result<(Fetched, &[u8]), DecodeError>,
    ) -> Result<(), AbortReason> {
        let it = &mut self.items[i];
        let mut val = std::mem::take(&mut it.value);
        val.clear();
        let parsed = self.ctx.response(h, |b| {
            decode(b).map(|(f, value)| {
                val.extend_from_slice(value);
                f
            })
        });
        match parsed {
            Ok(Ok(f)) => absorb(it, f, val),
            Ok(Err(_)) => {
                it.value = val;
                Err(AbortReason::BadResponse)
            }
            Err(e) => {
                it.value = val;
                Err(rpc_failure(&e, flushed))
            }
        }
    }
}

/// Takes a READ/LOCK answer into the item, or says why the transaction must abort.
pub(crate) fn absorb(it: &mut Item, f: Fetched, val: Vec<u8>) -> Result<(), AbortReason> {
    // The item keeps the buffer whatever happens (it is reused by later transactions).
    it.value = val;
    if f.status != Status::Ok {
        it.value.clear();
    }
    if !matches!(f.status, Status::Ok | Status::Absent | Status::AbsentLocked) {
        // Nothing was read (locked, exists, full, malformed): the key stays unfetched so
        // it is neither used nor recorded as a read.
        it.fetched = false;
    } else {
        it.fetched = true;
        it.version = f.version;
    }
    match f.status {
        Status::Ok => {
            it.exists = true;
            if it.write.is_some() {
                it.lock = Some(f.token);
            }
            Ok(())
        }
        Status::Absent => {
            it.exists = false;
            // Update or delete of an absent key fails; a read of one is fine.
            if it.write.is_some() {
                Err(AbortReason::MissingKey)
            } else {
                Ok(())
            }
        }
        Status::AbsentLocked if it.write == Some(WriteKind::Insert) => {
            it.exists = false;
            it.lock = Some(f.token);
            Ok(())
        }
        Status::Locked => Err(AbortReason::LockedAtExecute),
        Status::Exists => Err(AbortReason::InsertExists),
        Status::Full => Err(AbortReason::TableFull),
        _ => Err(AbortReason::BadResponse),
    }
}
