//! The protocol's request handlers, run inline by the RPC master loop of every thread.
//! Requests are untrusted: a malformed one is answered with `BAD_REQUEST` and changes
//! nothing.

use crate::db::NodeDb;
use crate::log::LogReplica;
use crate::wire::{self, rtype, status, LockToken, Reader, WriteKind};
use ambidex_rpc::{RequestInfo, Runtime};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

/// Registers every transaction handler on `rt`.
pub fn register(rt: &mut Runtime, db: Arc<NodeDb>, log: Rc<RefCell<LogReplica>>) {
    let d = db.clone();
    rt.register(rtype::READ, move |_, req, resp| {
        let mut r = Reader::new(req);
        let (Some(table), Some(key), true) = (r.u32(), r.u64(), r.is_empty()) else {
            return resp.push(status::BAD_REQUEST);
        };
        resp.extend_from_slice(&[0; 9]);
        let f = d.read(table, key, resp);
        resp[0] = f.status;
        resp[1..9].copy_from_slice(&f.version.to_le_bytes());
    });
    let d = db.clone();
    rt.register(rtype::LOCK, move |_, req, resp| {
        let mut r = Reader::new(req);
        let (Some(table), Some(key), Some(kind), true) = (
            r.u32(),
            r.u64(),
            r.u8().and_then(WriteKind::from_code),
            r.is_empty(),
        ) else {
            return resp.push(status::BAD_REQUEST);
        };
        resp.extend_from_slice(&[0; 25]);
        let f = d.lock(table, key, kind, resp);
        resp[0] = f.status;
        resp[1..9].copy_from_slice(&f.version.to_le_bytes());
        resp[9..17].copy_from_slice(&f.token.offset.to_le_bytes());
        resp[17..25].copy_from_slice(&f.token.store_version.to_le_bytes());
    });
    let d = db.clone();
    rt.register(rtype::VALIDATE, move |_, req, resp| {
        let mut r = Reader::new(req);
        let (Some(table), Some(key), true) = (r.u32(), r.u64(), r.is_empty()) else {
            return resp.push(status::BAD_REQUEST);
        };
        let f = d.validate(table, key);
        resp.push(f.status);
        resp.extend_from_slice(&f.version.to_le_bytes());
    });
    let d = db.clone();
    rt.register(rtype::UNLOCK, move |_, req, resp| {
        let mut r = Reader::new(req);
        let (Some(table), Some(key), Some(offset), Some(store_version), true) =
            (r.u32(), r.u64(), r.u64(), r.u64(), r.is_empty())
        else {
            return resp.push(status::BAD_REQUEST);
        };
        d.unlock(
            table,
            key,
            LockToken {
                offset,
                store_version,
            },
        );
        resp.push(status::OK);
    });
    let l = log.clone();
    rt.register(rtype::LOG, move |info: &RequestInfo, req, resp| {
        resp.push(if handle_log(&mut l.borrow_mut(), info, req) {
            status::OK
        } else {
            status::BAD_REQUEST
        });
    });
    let l = log;
    rt.register(rtype::TRUNCATE, move |_, req, resp| {
        let mut r = Reader::new(req);
        let ok = take_truncations(&mut r, &mut l.borrow_mut()) && r.is_empty();
        resp.push(if ok { status::OK } else { status::BAD_REQUEST });
    });
    let d = db.clone();
    rt.register(rtype::COMMIT_BACKUP, move |_, req, resp| {
        resp.push(apply_commit(req, |txn, w| d.apply_backup(txn, w)));
    });
    let d = db;
    rt.register(rtype::COMMIT_PRIMARY, move |_, req, resp| {
        resp.push(apply_commit(req, |txn, w| d.commit_primary(txn, w)));
    });
}

/// Validates a whole commit request before applying any of it.
fn apply_commit(req: &[u8], mut apply: impl FnMut(u64, &wire::WriteRec<'_>) -> bool) -> u8 {
    let mut r = Reader::new(req);
    let (Some(txn), Some(n)) = (r.u64(), r.u16()) else {
        return status::BAD_REQUEST;
    };
    let body = r.rest();
    let mut check = Reader::new(body);
    for _ in 0..n {
        if wire::get_write(&mut check).is_none() {
            return status::BAD_REQUEST;
        }
    }
    if !check.is_empty() {
        return status::BAD_REQUEST;
    }
    let mut rd = Reader::new(body);
    let mut ok = true;
    while let Some(w) = wire::get_write(&mut rd) {
        ok &= apply(txn, &w);
    }
    if ok {
        status::OK
    } else {
        status::BAD_REQUEST
    }
}

/// LOG request: `[txn][n][n writes][truncations]`.
fn handle_log(log: &mut LogReplica, info: &RequestInfo, req: &[u8]) -> bool {
    let mut r = Reader::new(req);
    let (Some(txn), Some(n)) = (r.u64(), r.u16()) else {
        return false;
    };
    let start = req.len() - r.rest_len();
    for _ in 0..n {
        if wire::get_write(&mut r).is_none() {
            return false;
        }
    }
    let end = req.len() - r.rest_len();
    if !take_truncations(&mut r, log) || !r.is_empty() {
        return false;
    }
    log.append(txn, info.src.node, &req[start..end]);
    true
}

/// `[count: u16][txn ids]`: records the coordinator knows are installed everywhere.
fn take_truncations(r: &mut Reader<'_>, log: &mut LogReplica) -> bool {
    let Some(n) = r.u16() else { return false };
    for _ in 0..n {
        let Some(id) = r.u64() else { return false };
        log.truncate(id);
    }
    true
}
