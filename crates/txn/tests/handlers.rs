//! White-box tests of the request handlers: crafted requests against one node's
//! database, calling the handler functions directly (no cluster, no runtime). Every
//! refused request must leave the item exactly as it was (value, versions, lock word).

use ambidex_store::{Header, LockOwner};
use ambidex_transport::EndpointAddr;
use ambidex_txn::handlers;
use ambidex_txn::log::LogReplica;
use ambidex_txn::messages::{
    Ack, CommitBackupReq, CommitPrimaryReq, Fetched, LockReq, LockResp, LockToken, LogReq, ReadReq,
    ReadResp, Status, UnlockReq, WriteKind, WriteRec,
};
use ambidex_txn::{NodeDb, Placement, TableSpec};
use std::sync::atomic::Ordering;
use std::sync::Arc;

const T: u32 = 3;
const VS: usize = 16;
/// Coordinator (node 0, thread 1): its requests come from this address.
const ME: EndpointAddr = EndpointAddr::new(0, 1);
const OTHER: EndpointAddr = EndpointAddr::new(0, 2);

/// The table every test here uses.
fn spec() -> TableSpec {
    TableSpec {
        id: T,
        name: "t".into(),
        value_size: VS,
        capacity_per_node: 64,
    }
}

fn db() -> Arc<NodeDb> {
    let spec = spec();
    // One node: it is the primary of every key.
    let fabric =
        ambidex_transport::local::LocalFabric::new(ambidex_transport::ClusterConfig::new(1, 1))
            .unwrap();
    // The fabric may go: the table's memory lives as long as the database.
    let db = NodeDb::new(&*fabric.nodes()[0], Placement::new(1, 1).unwrap(), &[spec]).unwrap();
    for k in 0..4u64 {
        assert!(db.load(T, k, &[k as u8; VS]).unwrap());
    }
    db
}

/// Everything a refused request must not change: value, transaction version, lock word.
fn state(db: &NodeDb, key: u64) -> (Status, u64, Vec<u8>, Option<Header>) {
    let mut v = Vec::new();
    let f = ambidex_txn::actions::read(db, T, key, &mut v);
    (f.status, f.version, v, db.lock_word(T, key))
}

/// Sends a LOCK of `key` for update; returns the response head and value.
fn lock(db: &NodeDb, src: EndpointAddr, key: u64, slot: u16) -> (Fetched, Vec<u8>) {
    let mut req = Vec::new();
    LockReq {
        table: T,
        key,
        kind: WriteKind::Update,
        slot,
    }
    .encode(&mut req);
    let mut resp = Vec::new();
    handlers::lock(db, src, &req, &mut resp);
    let r = LockResp::decode(&resp).unwrap();
    (r.fetched, r.value.to_vec())
}

fn write(key: u64, token: LockToken, value: &[u8]) -> WriteRec<'_> {
    WriteRec {
        table: T,
        key,
        kind: WriteKind::Update,
        prev_version: 1,
        token,
        value,
    }
}

fn commit_primary_req(txn: u64, slot: u16, writes: &[WriteRec<'_>]) -> Vec<u8> {
    let mut b = Vec::new();
    let mut enc = CommitPrimaryReq::begin(&mut b, txn, slot);
    for w in writes {
        enc.push(&mut b, w);
    }
    enc.finish(&mut b);
    b
}

fn status_of(resp: &[u8]) -> Status {
    Ack::decode(resp).unwrap().status
}

fn commit_primary(db: &NodeDb, src: EndpointAddr, req: &[u8]) -> Status {
    let mut resp = Vec::new();
    handlers::commit_primary(db, src, req, &mut resp);
    status_of(&resp)
}

#[test]
fn lock_on_a_locked_key_is_refused_and_changes_nothing() {
    let db = db();
    let (r, value) = lock(&db, ME, 1, 5);
    assert_eq!(r.status, Status::Ok);
    assert_eq!(value, [1u8; VS]);
    let owner = LockOwner::new(0, 1, 5).unwrap();
    assert_eq!(db.lock_word(T, 1).unwrap().owner, Some(owner));
    let before = state(&db, 1);
    // Another coordinator, and another transaction of the same thread.
    for (src, slot) in [(OTHER, 5), (ME, 6), (ME, 5)] {
        let (r2, r2_value) = lock(&db, src, 1, slot);
        assert_eq!(r2.status, Status::Locked);
        assert!(r2_value.is_empty());
        assert_eq!(state(&db, 1), before);
    }
}

#[test]
fn commit_with_a_stale_or_foreign_token_is_refused_and_changes_nothing() {
    let db = db();
    let (r, _) = lock(&db, ME, 2, 7);
    let tok = r.token;
    let before = state(&db, 2);
    let v = [9u8; VS];
    let bad_tokens = [
        LockToken {
            store_version: tok.store_version + 2,
            ..tok
        },
        LockToken {
            store_version: tok.store_version.wrapping_sub(2),
            ..tok
        },
        LockToken {
            offset: tok.offset + 64,
            ..tok
        },
        LockToken {
            offset: tok.offset + 1,
            ..tok
        },
        LockToken::default(),
    ];
    for bad in bad_tokens {
        let req = commit_primary_req(1 << 62 | 1, 7, &[write(2, bad, &v)]);
        assert_eq!(commit_primary(&db, ME, &req), Status::BadRequest, "{bad:?}");
        assert_eq!(state(&db, 2), before);
    }
    // The right token, but sent by another owner (another slot, another thread).
    let req = commit_primary_req(1 << 62 | 1, 8, &[write(2, tok, &v)]);
    assert_eq!(commit_primary(&db, ME, &req), Status::BadRequest);
    let req = commit_primary_req(1 << 62 | 1, 7, &[write(2, tok, &v)]);
    assert_eq!(commit_primary(&db, OTHER, &req), Status::BadRequest);
    assert_eq!(state(&db, 2), before);
    // One good write and one bad: nothing of it is applied.
    let (r3, _) = lock(&db, ME, 3, 7);
    let before3 = state(&db, 3);
    let req = commit_primary_req(
        1 << 62 | 1,
        7,
        &[write(3, r3.token, &v), write(2, bad_tokens[0], &v)],
    );
    assert_eq!(commit_primary(&db, ME, &req), Status::BadRequest);
    assert_eq!(state(&db, 3), before3);
    assert_eq!(state(&db, 2), before);
    assert!(db.bad_requests.load(Ordering::Relaxed) >= 8);
    // An UNLOCK with a stale token releases nothing either.
    let mut req = Vec::new();
    UnlockReq {
        table: T,
        key: 2,
        slot: 7,
        token: bad_tokens[0],
    }
    .encode(&mut req);
    let mut resp = Vec::new();
    handlers::unlock(&db, ME, &req, &mut resp);
    assert_eq!(state(&db, 2), before);
}

#[test]
fn malformed_requests_get_bad_request_and_change_nothing() {
    let db = db();
    let (r, _) = lock(&db, ME, 0, 1);
    let tok = r.token;
    let before: Vec<_> = (0..4).map(|k| state(&db, k)).collect();
    let v = [7u8; VS];
    let good = commit_primary_req(1 << 62 | 3, 1, &[write(0, tok, &v)]);
    let mut bodies: Vec<(&str, Vec<u8>)> = Vec::new();
    for cut in [0, 1, 8, 10, 12, good.len() - 1] {
        bodies.push(("truncated", good[..cut].to_vec()));
    }
    let mut extra = good.clone();
    extra.push(0);
    bodies.push(("extra byte", extra));
    bodies.push((
        "bad table",
        commit_primary_req(
            1 << 62 | 3,
            1,
            &[WriteRec {
                table: 999,
                ..write(0, tok, &v)
            }],
        ),
    ));
    let mut bad_kind = good.clone();
    // [txn 8][slot 2][n 2][table 4][key 8][kind]
    bad_kind[8 + 2 + 2 + 4 + 8] = 9;
    bodies.push(("bad write kind", bad_kind));
    let big = [7u8; VS + 1];
    bodies.push((
        "oversized value",
        commit_primary_req(1 << 62 | 3, 1, &[write(0, tok, &big)]),
    ));
    bodies.push((
        "short value",
        commit_primary_req(1 << 62 | 3, 1, &[write(0, tok, &v[..VS - 1])]),
    ));
    let mut huge_len = good.clone();
    // The value length field claims more bytes than follow.
    let len_at = 8 + 2 + 2 + 4 + 8 + 1 + 8 + 8 + 8;
    huge_len[len_at..len_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    bodies.push(("value length past the end", huge_len));
    let mut more_writes = good.clone();
    more_writes[10..12].copy_from_slice(&2u16.to_le_bytes());
    bodies.push(("count above the writes", more_writes));
    for (what, body) in &bodies {
        assert_eq!(commit_primary(&db, ME, body), Status::BadRequest, "{what}");
        let mut resp = Vec::new();
        // The same bodies as a backup's commit (their layout differs by the slot, so
        // they are malformed there too, or name unknown tables / bad values).
        handlers::commit_backup(&db, body, &mut resp);
        assert_eq!(status_of(&resp), Status::BadRequest, "backup: {what}");
        let after: Vec<_> = (0..4).map(|k| state(&db, k)).collect();
        assert_eq!(after, before, "{what} changed the store");
    }
    // Backups check their whole request too: a bad table after a good write applies
    // neither.
    let mut b = Vec::new();
    let mut enc = CommitBackupReq::begin(&mut b, 1 << 62 | 4);
    enc.push(&mut b, &write(1, LockToken::default(), &v));
    enc.push(
        &mut b,
        &WriteRec {
            table: 999,
            ..write(1, LockToken::default(), &v)
        },
    );
    enc.finish(&mut b);
    let mut resp = Vec::new();
    handlers::commit_backup(&db, &b, &mut resp);
    assert_eq!(status_of(&resp), Status::BadRequest);
    // Key requests: truncated, extra, bad kind, bad table.
    let mut lreq = Vec::new();
    LockReq {
        table: T,
        key: 1,
        kind: WriteKind::Update,
        slot: 2,
    }
    .encode(&mut lreq);
    let mut bad = vec![lreq[..lreq.len() - 1].to_vec(), {
        let mut e = lreq.clone();
        e.push(1);
        e
    }];
    let mut k = lreq.clone();
    k[12] = 0;
    bad.push(k);
    let mut s = lreq.clone();
    s[13..15].copy_from_slice(&u16::MAX.to_le_bytes()); // slot out of range
    bad.push(s);
    for body in &bad {
        let mut resp = Vec::new();
        handlers::lock(&db, ME, body, &mut resp);
        assert_eq!(resp, [Status::BadRequest as u8]);
    }
    let mut rreq = Vec::new();
    ReadReq { table: 999, key: 1 }.encode(&mut rreq);
    let mut resp = Vec::new();
    handlers::read(&db, &rreq, &mut resp);
    assert_eq!(ReadResp::decode(&resp).unwrap().status, Status::BadRequest);
    let mut resp = Vec::new();
    handlers::read(&db, &rreq[..5], &mut resp);
    assert_eq!(resp, [Status::BadRequest as u8]);
    // A malformed LOG appends nothing.
    let mut log = LogReplica::default();
    let mut lb = Vec::new();
    LogReq::encode(&mut lb, 5, 0, &[], &mut Vec::new());
    lb.push(0);
    let mut resp = Vec::new();
    handlers::append_log(&db, &mut log, ME, &lb, &mut resp);
    assert_eq!(status_of(&resp), Status::BadRequest);
    assert!(log.is_empty());
    let after: Vec<_> = (0..4).map(|k| state(&db, k)).collect();
    assert_eq!(after, before);
}

#[test]
fn lock_then_commit_installs_the_value_and_releases_the_lock() {
    let db = db();
    let (_, _, _, h0) = state(&db, 1);
    let h0 = h0.unwrap();
    assert_eq!(h0.owner, None);
    let (r, _) = lock(&db, ME, 1, 4);
    assert_eq!(r.status, Status::Ok);
    assert_eq!(r.version, 1, "the load version");
    let owner = LockOwner::new(ME.node, ME.thread, 4).unwrap();
    assert_eq!(
        db.lock_word(T, 1),
        Some(Header {
            owner: Some(owner),
            version: h0.version
        })
    );
    let txn = 1 << 62 | 77;
    let v = [0xabu8; VS];
    let req = commit_primary_req(txn, 4, &[write(1, r.token, &v)]);
    assert_eq!(commit_primary(&db, ME, &req), Status::Ok);
    let (st, version, value, h) = state(&db, 1);
    assert_eq!((st, version, value), (Status::Ok, txn, v.to_vec()));
    assert_eq!(
        h,
        Some(Header {
            owner: None,
            version: h0.version + 2
        }),
        "store version advanced by one write, owner cleared"
    );
    // The lock is free again: another coordinator takes it.
    assert_eq!(lock(&db, OTHER, 1, 0).0.status, Status::Ok);
    // A repeated commit (its lock is gone) is refused and changes nothing.
    let before = state(&db, 1);
    assert_eq!(commit_primary(&db, ME, &req), Status::BadRequest);
    assert_eq!(state(&db, 1), before);
}

#[test]
fn unlock_releases_only_the_senders_lock() {
    let db = db();
    let before = state(&db, 2);
    let (r, _) = lock(&db, ME, 2, 9);
    let mut req = Vec::new();
    UnlockReq {
        table: T,
        key: 2,
        slot: 9,
        token: r.token,
    }
    .encode(&mut req);
    let mut resp = Vec::new();
    handlers::unlock(&db, OTHER, &req, &mut resp);
    assert_eq!(db.lock_word(T, 2).unwrap().owner.map(|o| o.slot), Some(9));
    let mut resp = Vec::new();
    handlers::unlock(&db, ME, &req, &mut resp);
    assert_eq!(status_of(&resp), Status::Ok);
    assert_eq!(state(&db, 2), before, "an abort restores the item exactly");
}

/// A COMMIT_PRIMARY naming one held lock twice would pass each write's own check, then
/// install the first and fail the second (its lock already released). It is refused
/// whole, and changes nothing; so is a long list with a repeat (the sorted check).
#[test]
fn a_commit_naming_a_key_twice_is_refused_and_changes_nothing() {
    let db = db();
    let (r, _) = lock(&db, ME, 1, 4);
    assert_eq!(r.status, Status::Ok);
    let before = state(&db, 1);
    let v = [0xcdu8; VS];
    let req = commit_primary_req(
        1 << 62 | 9,
        4,
        &[write(1, r.token, &v), write(1, r.token, &v)],
    );
    assert_eq!(commit_primary(&db, ME, &req), Status::BadRequest);
    assert_eq!(state(&db, 1), before);
    let many: Vec<WriteRec<'_>> = (0..40).map(|_| write(1, r.token, &v)).collect();
    let req = commit_primary_req(1 << 62 | 9, 4, &many);
    assert_eq!(commit_primary(&db, ME, &req), Status::BadRequest);
    assert_eq!(state(&db, 1), before);
    // The lock is still the sender's: a correct commit goes through.
    let req = commit_primary_req(1 << 62 | 9, 4, &[write(1, r.token, &v)]);
    assert_eq!(commit_primary(&db, ME, &req), Status::Ok);
}

/// RING_TRUNCATE: a malformed request, or one from a coordinator that does not log to
/// this node, is refused and counted; a good one moves the sender's ring head past the
/// records it checked (a malformed record on the way is counted, never applied).
#[test]
fn ring_truncations_are_checked_and_move_only_the_senders_ring() {
    use ambidex_txn::log_ring::format;
    use ambidex_txn::messages::{RingTruncateReq, RingTruncateResp};
    let fabric =
        ambidex_transport::local::LocalFabric::new(ambidex_transport::ClusterConfig::new(2, 2))
            .unwrap();
    let db = NodeDb::new(&*fabric.nodes()[1], Placement::new(2, 2).unwrap(), &[]).unwrap();
    let region = db.log_region();
    let coord = EndpointAddr::new(0, 1);
    let ring = region.ring_of(coord.node, coord.thread).unwrap();
    let off = region.desc().ring_offset(ring).unwrap();
    let owner = LockOwner::new(0, 1, 3).unwrap();
    let mut recs = Vec::new();
    for seq in 1..=3u64 {
        let mut r = Vec::new();
        format::encode_record(&mut r, seq, 100 + seq, owner, 0, &[]);
        recs.push(r);
    }
    // Record 3 claims a write it does not hold: malformed.
    recs[2][30] = 1;
    let mut pos = 0u64;
    for r in &recs {
        assert!(region.memory().write(off + pos, r));
        pos += r.len() as u64;
    }
    let mut log = LogReplica::default();
    let truncate = |log: &mut LogReplica, src, req: &[u8]| {
        let mut resp = Vec::new();
        handlers::truncate_ring(&db, &db.config().load(), log, src, req, &mut resp);
        resp
    };
    // Malformed, or from a node that does not log here (node 1 itself), or from a
    // thread beyond the cluster's.
    let good = RingTruncateReq { head: pos }.to_bytes();
    for (src, req) in [
        (coord, &good[..7]),
        (EndpointAddr::new(1, 0), &good[..]),
        (EndpointAddr::new(0, 9), &good[..]),
    ] {
        let resp = truncate(&mut log, src, req);
        assert_eq!(resp, [Status::BadRequest as u8], "{src:?}");
    }
    assert_eq!(db.bad_requests.load(Ordering::Relaxed), 3);
    assert_eq!(region.head(ring).unwrap().pos, 0);
    // The other thread's ring is untouched by this one's truncation.
    let other = region.ring_of(0, 0).unwrap();
    let resp = truncate(&mut log, coord, &good);
    assert_eq!(RingTruncateResp::ok_head(&resp), Some(pos));
    assert_eq!(region.head(ring).unwrap().pos, pos);
    assert_eq!(region.head(other).unwrap().pos, 0);
    assert_eq!(
        (
            log.ring.replica_records,
            log.ring.replica_malformed,
            log.truncated
        ),
        (2, 1, 2)
    );
    // Asking again (a retransmission) or for less changes nothing.
    let resp = truncate(&mut log, coord, &RingTruncateReq { head: 16 }.to_bytes());
    assert_eq!(RingTruncateResp::ok_head(&resp), Some(pos));
    assert_eq!(log.ring.replica_records, 2);
}

/// A ring that still holds records of an older epoch is not truncated with the new
/// placement: there a promoted backup would skip a record's write as the key's primary
/// while its head passed the record, and the write would be lost before recovery's
/// replay read the ring. The truncation moves nothing until the ring restarts.
#[test]
fn a_ring_of_an_older_epoch_is_not_truncated_with_the_new_placement() {
    use ambidex_cluster::Stage;
    use ambidex_txn::log_ring::format;
    use ambidex_txn::messages::{RingTruncateReq, RingTruncateResp};
    let spec = spec();
    let fabric =
        ambidex_transport::local::LocalFabric::new(ambidex_transport::ClusterConfig::new(3, 1))
            .unwrap();
    let placement = Placement::new(3, 3).unwrap();
    let db = NodeDb::new(&*fabric.nodes()[0], placement.clone(), &[spec]).unwrap();
    // A key node 0 backs up for primary 2 (then promoted when node 2 goes).
    let key = (0..10_000u64)
        .find(|&k| placement.replicas(T, k) == [2, 0, 1])
        .expect("a key on [2, 0, 1]");
    assert!(db.load(T, key, &[1; VS]).unwrap());
    // Coordinator (1, 0) logged a committed write of it in its ring here.
    let region = db.log_region();
    let coord = EndpointAddr::new(1, 0);
    let ring = region.ring_of(coord.node, coord.thread).unwrap();
    let off = region.desc().ring_offset(ring).unwrap();
    let token = LockToken {
        offset: 0,
        store_version: db.lock_word(T, key).unwrap().version,
    };
    let mut body = Vec::new();
    write(key, token, &[7; VS]).encode(&mut body);
    let mut rec = Vec::new();
    let owner = LockOwner::new(1, 0, 3).unwrap();
    format::encode_record(&mut rec, 1, 1 << 62 | 5, owner, 1, &body);
    assert!(region.memory().write(off, &rec));
    // Node 2 fails: node 0 runs in epoch 2, where it is the key's primary, before its
    // recovery replayed the ring.
    let mut next = (*db.config().load()).clone();
    next.epoch = 2;
    next.placement = placement.without(1 << 2).unwrap();
    assert_eq!(next.placement.primary(T, key), 0);
    db.cluster().enter(next.clone(), Stage::Recover);
    let mut log = LogReplica::default();
    let mut resp = Vec::new();
    let req = RingTruncateReq {
        head: rec.len() as u64,
    }
    .to_bytes();
    handlers::truncate_ring(&db, &next, &mut log, coord, &req, &mut resp);
    assert_eq!(RingTruncateResp::ok_head(&resp), Some(0), "nothing moved");
    assert_eq!(region.head(ring).unwrap().pos, 0);
    assert_eq!(log.ring.truncations_deferred, 1);
    // The record is still there for recovery's replay.
    let scan = region.scan(ring).unwrap();
    assert_eq!(scan.records.len(), 1);
    // Once replayed, the ring restarts in epoch 2 and truncations of epoch 2 go on.
    region.restart(2);
    resp.clear();
    handlers::truncate_ring(
        &db,
        &next,
        &mut log,
        coord,
        &RingTruncateReq { head: 0 }.to_bytes(),
        &mut resp,
    );
    assert_eq!(RingTruncateResp::ok_head(&resp), Some(0));
    assert_eq!(log.ring.truncations_deferred, 1);
}
