//! The protocol's request handlers, run inline by the RPC master loop of every thread:
//! each decodes its request ([`crate::messages`]), acts through the item actions
//! ([`crate::actions`]) and encodes its response. Requests are untrusted: one that does
//! not decode, names an unknown table, carries a value of the wrong size or a lock its
//! sender does not hold is answered with `BadRequest`, changes nothing, and is counted
//! in [`NodeDb::bad_requests`].
//!
//! The handlers are plain functions of (database, sender, request, response buffer), so
//! tests call them directly without a cluster; [`register`] installs them on a runtime.

use crate::actions;
use crate::db::NodeDb;
use crate::log::LogReplica;
use crate::log_ring::{format, RingHead};
use crate::messages::{
    rtype, Ack, CommitBackupReq, CommitPrimaryReq, CopyDoneReq, CopyReq, LockReq, LockResp, LogReq,
    ReadReq, ReadResp, RecoverReq, RecoverResp, RespBuf, RingTruncateReq, RingTruncateResp, Status,
    TruncateReq, UnlockReq, ValidateReq, ValidateResp,
};
use ambidex_cluster::{ConfigView, Configuration, Placement};
use ambidex_rpc::{RequestInfo, Runtime};
use ambidex_store::LockOwner;
use ambidex_transport::EndpointAddr;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Registers every transaction handler on `rt`.
pub fn register(
    rt: &mut Runtime,
    db: Arc<NodeDb>,
    view: Rc<ConfigView>,
    log: Rc<RefCell<LogReplica>>,
) {
    let d = db.clone();
    rt.register(rtype::READ, move |_, req, resp| read(&d, req, resp));
    let d = db.clone();
    rt.register(rtype::READ_LOC, move |_, req, resp| {
        read_located(&d, req, resp)
    });
    let d = db.clone();
    rt.register(rtype::LOCK, move |i: &RequestInfo, req, resp| {
        lock(&d, i.src, req, resp)
    });
    let d = db.clone();
    rt.register(rtype::VALIDATE, move |_, req, resp| validate(&d, req, resp));
    let d = db.clone();
    rt.register(rtype::UNLOCK, move |i: &RequestInfo, req, resp| {
        unlock(&d, i.src, req, resp)
    });
    let (d, l) = (db.clone(), log.clone());
    rt.register(rtype::LOG, move |i: &RequestInfo, req, resp| {
        append_log(&d, &mut l.borrow_mut(), i.src, req, resp)
    });
    let (d, l) = (db.clone(), log.clone());
    rt.register(rtype::TRUNCATE, move |_, req, resp| {
        truncate(&d, &mut l.borrow_mut(), req, resp)
    });
    let d = db.clone();
    rt.register(rtype::RING_TRUNCATE, move |i: &RequestInfo, req, resp| {
        let config = view.get(d.config());
        truncate_ring(&d, &config, &mut log.borrow_mut(), i.src, req, resp)
    });
    let d = db.clone();
    rt.register(rtype::RECOVER, move |_, req, resp| recover(&d, req, resp));
    let d = db.clone();
    rt.register(rtype::COPY, move |_, req, resp| copy(&d, req, resp));
    let d = db.clone();
    rt.register(rtype::COPY_DONE, move |_, req, resp| {
        copy_done(&d, req, resp)
    });
    // Answered at all times, before this node's own catalog is set: a node that starts
    // later asks the ones already running.
    let (d, max) = (db.clone(), rt.max_message());
    rt.register(rtype::DESCRIPTORS, move |_, req, resp| {
        crate::catalog_exchange::answer(&d, max, req, resp)
    });
    let d = db.clone();
    rt.register(rtype::COMMIT_BACKUP, move |_, req, resp| {
        commit_backup(&d, req, resp)
    });
    let d = db;
    rt.register(rtype::COMMIT_PRIMARY, move |i: &RequestInfo, req, resp| {
        commit_primary(&d, i.src, req, resp)
    });
}

/// Answers a request that cannot be served with the bare `BadRequest` and counts it.
fn refuse<R: RespBuf>(db: &NodeDb, resp: &mut R) {
    db.bad_requests.fetch_add(1, Ordering::Relaxed);
    Ack {
        status: Status::BadRequest,
    }
    .encode(resp);
}

/// The owner of the locks of the sender's transaction `slot`: the sender's own node and
/// thread, so a coordinator can name only its own locks.
fn owner_of(src: EndpointAddr, slot: u16) -> Option<LockOwner> {
    LockOwner::new(src.node, src.thread, slot).ok()
}

/// Answers `Ok`, or refuses.
fn ack<R: RespBuf>(db: &NodeDb, ok: bool, resp: &mut R) {
    if ok {
        Ack { status: Status::Ok }.encode(resp);
    } else {
        refuse(db, resp);
    }
}

pub fn read<R: RespBuf>(db: &NodeDb, req: &[u8], resp: &mut R) {
    let Ok(r) = ReadReq::decode(req) else {
        return refuse(db, resp);
    };
    ReadResp::encode_with(resp, |out| actions::read(db, r.table, r.key, out));
}

/// READ_LOC: a READ answered in the LOCK response's form, the token naming where the
/// item is and its (unlocked) header word.
pub fn read_located<R: RespBuf>(db: &NodeDb, req: &[u8], resp: &mut R) {
    let Ok(r) = ReadReq::decode(req) else {
        return refuse(db, resp);
    };
    LockResp::encode_with(resp, |out| actions::read_located(db, r.table, r.key, out));
}

pub fn lock<R: RespBuf>(db: &NodeDb, src: EndpointAddr, req: &[u8], resp: &mut R) {
    let Ok(r) = LockReq::decode(req) else {
        return refuse(db, resp);
    };
    let Some(owner) = owner_of(src, r.slot) else {
        return refuse(db, resp);
    };
    LockResp::encode_with(resp, |out| {
        actions::lock(db, r.table, r.key, r.kind, owner, out)
    });
}

pub fn validate<R: RespBuf>(db: &NodeDb, req: &[u8], resp: &mut R) {
    let Ok(r) = ValidateReq::decode(req) else {
        return refuse(db, resp);
    };
    let f = actions::check_version(db, r.table, r.key);
    ValidateResp {
        status: f.status,
        version: f.version,
    }
    .encode(resp);
}

/// Releases a lock unchanged. Releasing a lock that is not (or no longer) held is a
/// no-op answered `Ok`: an abort may race with nothing, and repeating it is harmless.
pub fn unlock<R: RespBuf>(db: &NodeDb, src: EndpointAddr, req: &[u8], resp: &mut R) {
    let Ok(r) = UnlockReq::decode(req) else {
        return refuse(db, resp);
    };
    let Some(owner) = owner_of(src, r.slot) else {
        return refuse(db, resp);
    };
    actions::release(db, r.table, r.key, r.token, owner);
    ack(db, true, resp);
}

/// Appends a commit record of the sender's transaction to this node's log replica.
pub fn append_log<R: RespBuf>(
    db: &NodeDb,
    log: &mut LogReplica,
    src: EndpointAddr,
    req: &[u8],
    resp: &mut R,
) {
    let Ok(r) = LogReq::decode(req) else {
        return refuse(db, resp);
    };
    for id in r.truncations.iter() {
        log.truncate(id);
    }
    log.append(r.txn, src.node, r.writes.bytes());
    ack(db, true, resp);
}

pub fn truncate<R: RespBuf>(db: &NodeDb, log: &mut LogReplica, req: &[u8], resp: &mut R) {
    let Ok(r) = TruncateReq::decode(req) else {
        return refuse(db, resp);
    };
    for id in r.ids.iter() {
        log.truncate(id);
    }
    ack(db, true, resp);
}

/// Releases the sender's log ring up to the position asked (its own ring only: the
/// ring is found from the sender's node and thread). Every record on the way is checked
/// and counted (malformed ones are skipped, never applied); the head stops early at a
/// torn or missing slot, and the response says where it is.
pub fn truncate_ring<R: RespBuf>(
    db: &NodeDb,
    config: &Configuration,
    log: &mut LogReplica,
    src: EndpointAddr,
    req: &[u8],
    resp: &mut R,
) {
    let Ok(r) = RingTruncateReq::decode(req) else {
        return refuse(db, resp);
    };
    let region = db.log_region();
    let placement = &config.placement;
    let Some(ring) = region.ring_of(src.node, src.thread) else {
        return refuse(db, resp);
    };
    let (mut applied, mut older, mut refused) = (0u64, 0u64, 0u64);
    // The records truncated are committed and installed at their primaries: this
    // node's backup copies of the keys they wrote take them now (DrTM+H §5.4, FaRM
    // §3.4), older ones skipped by version.
    let mut apply = |rec: &[u8]| {
        let (txn, writes) = format::accepted_writes(rec);
        for w in writes {
            if placement.primary(w.table, w.key) == db.node
                || !placement.stores(db.node, w.table, w.key)
            {
                continue;
            }
            match actions::apply_logged(db, txn, &w) {
                Ok(true) => applied += 1,
                Ok(false) => older += 1,
                Err(_) => refused += 1,
            }
        }
    };
    // A ring not yet restarted in this node's epoch holds records of an older one:
    // which copies they go to is the old placement's business, so they are left to
    // recovery's replay (before the restart) and nothing moves. Applied with the new
    // placement, a promoted backup would skip them as their primary while the head
    // passed them, and lose them.
    let epoch = RingHead::of_epoch(config.epoch).epoch();
    let scan = match region.truncate_applying(ring, r.head, epoch, &mut apply) {
        Some(Ok(scan)) => scan,
        Some(Err(head)) => {
            log.ring.truncations_deferred += 1;
            return RingTruncateResp {
                status: Status::Ok,
                head: head.pos,
            }
            .encode(resp);
        }
        None => return refuse(db, resp),
    };
    let st = &mut log.ring;
    st.backup_applied += applied;
    st.backup_older += older;
    st.backup_refused += refused;
    st.replica_records += scan.valid;
    st.replica_voids += scan.voids;
    st.replica_malformed += scan.malformed;
    st.replica_torn += scan.torn() as u64;
    log.truncated += scan.valid;
    RingTruncateResp {
        status: Status::Ok,
        head: scan.head.pos,
    }
    .encode(resp);
}

/// Applies a transaction's writes at a backup; the whole request is checked first.
/// Takes writes recovered from surviving log records (a member's recovery, at stage
/// Recover; the members of the current epoch are trusted, as for their log rings; the
/// transport drops what other epochs send): each installed
/// under its coordinator's lock, applied to an older copy, or skipped. Answers with
/// the entries that met another transaction's lock, to be sent again; writes that do
/// not fit a table are counted as bad requests and not sent again.
pub fn recover<R: RespBuf>(db: &NodeDb, req: &[u8], resp: &mut R) {
    // Only while the cluster recovers: a late or crafted RECOVER in any other stage
    // could overwrite what transactions committed since.
    if db.cluster().stage() != ambidex_cluster::Stage::Recover {
        return refuse(db, resp);
    }
    let Ok(r) = RecoverReq::decode(req) else {
        return refuse(db, resp);
    };
    let mut busy = Vec::new();
    for (i, (txn, w)) in r.entries().enumerate() {
        match actions::recover_write(db, txn, &w) {
            actions::Recovered::Busy => busy.push(i as u16),
            actions::Recovered::Refused => {
                db.bad_requests.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }
    RecoverResp::encode(Status::Ok, &busy, resp);
}

/// Whether this node holds a syncing copy of partition `p` in the running epoch: the
/// only copies COPY and COPY_DONE may change (a late or crafted one changes nothing
/// else, and nothing during recovery).
fn syncing_here(db: &NodeDb, placement: &Placement, p: u32) -> bool {
    let me = db.node;
    p < placement.partitions()
        && placement
            .replicas_of(p)
            .iter()
            .position(|&n| n == me)
            .is_some_and(|i| placement.syncing_of(p) & (1 << i) != 0)
}

/// Applies a primary's copies of its items to this node's syncing copies, each only if
/// newer than the copy here (a transaction's write may have reached it first:
/// backups take every write while syncing). Refused whole if any item is not for a
/// syncing copy here or does not fit its table.
pub fn copy<R: RespBuf>(db: &NodeDb, req: &[u8], resp: &mut R) {
    if db.cluster().stage() != ambidex_cluster::Stage::Run {
        return refuse(db, resp);
    }
    let Ok(r) = CopyReq::decode(req) else {
        return refuse(db, resp);
    };
    let ok = db.config().with(|c| {
        r.items().all(|it| {
            syncing_here(db, &c.placement, c.placement.partition(it.table, it.key))
                && db
                    .table(it.table)
                    .is_some_and(|(spec, _)| it.stored.len() == crate::db::META + spec.value_size)
        })
    });
    if !ok {
        return refuse(db, resp);
    }
    // An item that cannot be stored (the table is full) fails the request: the copy
    // must never be reported done without it.
    let mut full = false;
    for it in r.items() {
        if let Some((_, t)) = db.table(it.table) {
            full |= t.apply_versioned(it.key, it.stored, it.version).is_err();
        }
    }
    if full {
        db.bad_requests.fetch_add(1, Ordering::Relaxed);
        return Ack {
            status: Status::Full,
        }
        .encode(resp);
    }
    ack(db, true, resp);
}

/// The primary copied every item of these partitions here: the copies are up to date
/// (later writes reach them as backups), which the node's agent reports.
pub fn copy_done<R: RespBuf>(db: &NodeDb, req: &[u8], resp: &mut R) {
    if db.cluster().stage() != ambidex_cluster::Stage::Run {
        return refuse(db, resp);
    }
    let Ok(r) = CopyDoneReq::decode(req) else {
        return refuse(db, resp);
    };
    let (epoch, ok) = db.config().with(|c| {
        (
            c.epoch,
            r.partitions
                .iter()
                .all(|&p| syncing_here(db, &c.placement, p)),
        )
    });
    if !ok {
        return refuse(db, resp);
    }
    for p in r.partitions {
        db.cluster().synced(epoch, p);
    }
    ack(db, true, resp);
}

pub fn commit_backup<R: RespBuf>(db: &NodeDb, req: &[u8], resp: &mut R) {
    let Ok(r) = CommitBackupReq::decode_checked(req, |w| actions::check_write(db, w, None)) else {
        return refuse(db, resp);
    };
    let mut ok = true;
    for w in r.writes.iter() {
        ok &= actions::apply_backup(db, r.txn, &w);
    }
    ack(db, ok, resp);
}

/// Installs a transaction's writes at their primary and releases its locks; refused,
/// changing nothing, unless the sender's transaction holds every lock named.
pub fn commit_primary<R: RespBuf>(db: &NodeDb, src: EndpointAddr, req: &[u8], resp: &mut R) {
    let decoded = CommitPrimaryReq::decode_checked(req, |slot, w| {
        owner_of(src, slot).is_some_and(|o| actions::check_write(db, w, Some(o)))
    });
    let Ok(r) = decoded else {
        return refuse(db, resp);
    };
    let Some(owner) = owner_of(src, r.slot) else {
        return refuse(db, resp);
    };
    let mut ok = true;
    for w in r.writes.iter() {
        ok &= actions::install(db, r.txn, &w, owner);
    }
    ack(db, ok, resp);
}
