//! Re-replication's requests are untrusted: a COPY or COPY_DONE for a copy that is
//! not syncing on the receiving node, outside stage Run, or malformed, is refused,
//! counted, and changes nothing; for a syncing copy, a COPY applies only what is newer.

mod common;

use ambidex_cluster::Stage;
use ambidex_txn::handlers::{copy, copy_done};
use ambidex_txn::messages::{CopiedItem, CopyDoneReq, CopyReq, Status};
use ambidex_txn::TableSpec;
use common::{Backend, TestCluster};
use std::sync::atomic::Ordering;

const T: u32 = 1;

fn cluster() -> TestCluster {
    let table = TableSpec {
        id: T,
        name: "t".into(),
        value_size: 8,
        capacity_per_node: 256,
    };
    let c = TestCluster::new(Backend::Local, 4, 1, 3, &[table]);
    for k in 0..64 {
        c.load(T, k, &[1; 8]);
    }
    c
}

/// The stored bytes of a copied value (transaction version 5, then `v`).
fn stored(v: u8) -> Vec<u8> {
    let mut b = 5u64.to_le_bytes().to_vec();
    b.extend_from_slice(&[v; 8]);
    b
}

fn request(key: u64, version: u64, s: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    CopyReq::begin(&mut b);
    CopyReq::push(
        &mut b,
        &CopiedItem {
            table: T,
            key,
            version,
            stored: s,
        },
    );
    b
}

fn value(c: &TestCluster, node: usize, key: u64) -> Vec<u8> {
    let mut v = Vec::new();
    ambidex_txn::actions::read(&c.dbs[node], T, key, &mut v);
    v
}

#[test]
fn copies_reach_only_syncing_copies_in_stage_run() {
    let c = cluster();
    let key = 7;
    let db = &c.dbs[c.placement.replicas(T, key)[1] as usize];
    let node = db.node as usize;
    // Not syncing: refused and counted, nothing changes.
    let mut resp = Vec::new();
    copy(db, &request(key, 99, &stored(9)), &mut resp);
    assert_eq!(resp, [Status::BadRequest as u8]);
    assert_eq!(value(&c, node, key), [1; 8]);
    let mut done = Vec::new();
    CopyDoneReq::encode(&[c.placement.partition(T, key)], &mut done);
    resp.clear();
    copy_done(db, &done, &mut resp);
    assert_eq!(resp, [Status::BadRequest as u8]);
    assert_eq!(db.bad_requests.load(Ordering::Relaxed), 2);

    // Node 3 fails: its partitions get syncing copies elsewhere.
    let gone = 3u16;
    let mut next = (*db.config().load()).clone();
    next.epoch += 1;
    next.placement = next.placement.without(1 << gone).unwrap();
    let (p, i) = next.placement.syncing().next().expect("a syncing copy");
    let target = next.placement.replicas_of(p)[i] as usize;
    let key = (0..1_000_000)
        .find(|&k| next.placement.partition(T, k) == p)
        .expect("a key of the partition");
    let db = &c.dbs[target];
    let before = db.bad_requests.load(Ordering::Relaxed);
    db.cluster().enter(next.clone(), Stage::Recover);
    resp.clear();
    copy(db, &request(key, 99, &stored(9)), &mut resp);
    assert_eq!(resp, [Status::BadRequest as u8], "not before stage Run");
    db.cluster().enter(next.clone(), Stage::Run);
    resp.clear();
    copy(db, &request(key, 99, &stored(9)), &mut resp);
    assert_eq!(resp, [Status::Ok as u8]);
    assert_eq!(value(&c, target, key), [9; 8]);
    // An older copy than the one there changes nothing.
    resp.clear();
    copy(db, &request(key, 3, &stored(4)), &mut resp);
    assert_eq!(resp, [Status::Ok as u8]);
    assert_eq!(value(&c, target, key), [9; 8]);
    // A value of the wrong size, or a malformed request: refused whole.
    resp.clear();
    copy(db, &request(key, 101, &[0; 3]), &mut resp);
    assert_eq!(resp, [Status::BadRequest as u8]);
    resp.clear();
    let mut cut = request(key, 101, &stored(2));
    cut.pop();
    copy(db, &cut, &mut resp);
    assert_eq!(resp, [Status::BadRequest as u8]);
    assert_eq!(value(&c, target, key), [9; 8]);
    assert_eq!(db.bad_requests.load(Ordering::Relaxed), before + 3);
    // A copy that cannot be stored (the table is full) is never taken as done: the
    // request fails with Full (its primary sends it again, then gives up).
    let mut answers = Vec::new();
    for k in (key + 1..u64::MAX)
        .filter(|&k| next.placement.partition(T, k) == p)
        .take(600)
    {
        resp.clear();
        copy(db, &request(k, 1, &stored(3)), &mut resp);
        answers.push(resp[0]);
    }
    assert_eq!(answers[0], Status::Ok as u8);
    assert_eq!(
        answers.last(),
        Some(&(Status::Full as u8)),
        "the table fills"
    );
    // And the node's room check, which every run's final check passes through, names it.
    let e = db
        .room_check()
        .expect_err("a full table passed the room check")
        .to_string();
    assert!(e.contains("out of room: table"), "{e}");
    assert!(e.contains("refused"), "{e}");
    assert!(c.dbs[(target + 1) % c.dbs.len()].room_check().is_ok());
    // Done: accepted for the syncing partition (the agent reports it).
    CopyDoneReq::encode(&[p], &mut done);
    resp.clear();
    copy_done(db, &done, &mut resp);
    assert_eq!(resp, [Status::Ok as u8]);
}
