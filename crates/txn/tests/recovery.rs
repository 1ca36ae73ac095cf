//! Recovery of a failed coordinator's transactions from the log records that survive
//! it: a 4-node cluster (R = 3) where node 3 died holding locks, with one transaction
//! logged in the rings of its backups, one not logged at all, and one that wrote a key
//! whose primary was node 3. The survivors move to the configuration without node 3
//! and each replays the records it holds and releases the dead node's locks; then the
//! logged transactions are installed at every replica of the new configuration, the
//! unlogged one left no trace, and no lock is held. A live coordinator's transaction
//! logged before the change is installed under its lock too.

mod common;

use ambidex_cluster::Stage;
use ambidex_store::LockOwner;
use ambidex_txn::log_ring::format;
use ambidex_txn::messages::{LockToken, WriteKind, WriteRec};
use ambidex_txn::recovery::{locks, replay, RecoveryStats};
use ambidex_txn::runner::{self, RunSpec, Worker, WorkerCtx};
use ambidex_txn::{actions, Configuration, NodeDb, Placement, TableSpec};
use common::{Backend, TestCluster};
use std::sync::{Arc, Mutex};

const T: u32 = 1;
const KEYS: u64 = 64;
const INITIAL: i64 = 1000;
const DEAD: u16 = 3;

fn table() -> TableSpec {
    TableSpec {
        id: T,
        name: "accounts".into(),
        value_size: 8,
        capacity_per_node: 256,
    }
}

/// A transaction id of coordinator (`node`, thread 0), as its thread numbers them.
fn txn_of(node: u16, seq: u64) -> u64 {
    let id = (1 << 62) | (node as u64) << 46 | seq;
    assert_eq!(ambidex_txn::coordinator_of(id), (node, 0));
    id
}

fn balance(db: &NodeDb, key: u64) -> (i64, u64) {
    let mut v = Vec::new();
    let f = actions::read(db, T, key, &mut v);
    let Ok(b) = v.try_into() else {
        panic!(
            "key {key} at node {}: {:?}, {:?}",
            db.node,
            f.status,
            db.lock_word(T, key)
        );
    };
    (i64::from_le_bytes(b), f.version)
}

/// Locks `key` at its primary for `owner` (as the dead coordinator's LOCK did).
fn lock(c: &TestCluster, key: u64, owner: LockOwner) -> LockToken {
    let p = c.placement.primary(T, key);
    let mut v = Vec::new();
    let f = actions::lock(&c.dbs[p as usize], T, key, WriteKind::Update, owner, &mut v);
    assert_eq!(f.status, ambidex_txn::messages::Status::Ok);
    f.token
}

/// Appends the commit record of `txn` (writes `key -> value` with their lock tokens)
/// to the dead coordinator's ring at `replica`, after the records already there.
fn append(
    c: &TestCluster,
    replica: u16,
    txn: u64,
    owner: LockOwner,
    writes: &[(u64, i64, LockToken)],
) {
    let mut body = Vec::new();
    for &(key, value, token) in writes {
        WriteRec {
            table: T,
            key,
            kind: WriteKind::Update,
            prev_version: 1,
            token,
            value: &value.to_le_bytes(),
        }
        .encode(&mut body);
    }
    let region = c.dbs[replica as usize].log_region();
    let ring = region.ring_of(owner.node, owner.thread).unwrap();
    let end = region.scan(ring).unwrap().head;
    let mut rec = Vec::new();
    format::encode_record(&mut rec, end.seq, txn, owner, writes.len() as u16, &body);
    let off = region.desc().ring_offset(ring).unwrap();
    assert!(region.memory().write(off + end.pos, &rec));
}

#[test]
fn survivors_install_logged_transactions_and_release_the_rest() {
    let c = TestCluster::new(Backend::Local, 4, 1, 3, &[table()]);
    for k in 0..KEYS {
        c.load(T, k, &INITIAL.to_le_bytes());
    }
    c.set_catalogs();
    let p = c.placement.clone();
    let key_on = |node: u16, skip: u64| {
        (0..KEYS)
            .filter(|&k| p.primary(T, k) == node)
            .nth(skip as usize)
            .unwrap()
    };
    let owner = |slot| LockOwner::new(DEAD, 0, slot).unwrap();
    // T1: a transfer of 30 from a (primary 0) to b (primary 1), locked and logged at
    // the backups of both keys (nodes other than the dead coordinator).
    let (a, b) = (key_on(0, 0), key_on(1, 0));
    let (ta, tb) = (lock(&c, a, owner(1)), lock(&c, b, owner(1)));
    let t1 = txn_of(DEAD, 1);
    let mut backups: Vec<u16> = p
        .backups(T, a)
        .chain(p.backups(T, b))
        .filter(|&n| n != DEAD)
        .collect();
    backups.sort();
    backups.dedup();
    for &r in &backups {
        append(
            &c,
            r,
            t1,
            owner(1),
            &[(a, INITIAL - 30, ta), (b, INITIAL + 30, tb)],
        );
    }
    // T2: locked key e (primary 2), never logged: it aborts.
    let e = key_on(2, 0);
    lock(&c, e, owner(2));
    // T3 wrote d, whose primary was the dead node itself (its lock died with it), and
    // was logged at d's backups.
    let d = key_on(DEAD, 0);
    // Its lock word's version at the dead primary was the backups' (loaded alike).
    let td = LockToken {
        offset: 0,
        store_version: c.dbs[p.backups(T, d).next().unwrap() as usize]
            .lock_word(T, d)
            .unwrap()
            .version,
    };
    for r in p.backups(T, d).filter(|&n| n != DEAD) {
        append(&c, r, txn_of(DEAD, 2), owner(3), &[(d, 7, td)]);
    }

    // T4, of a live coordinator (node 2): locked g (primary 0) and logged at g's
    // backups, then the configuration changed: its lock is a member's, so only the
    // install under it releases it.
    let g = key_on(0, 1);
    let live = LockOwner::new(2, 0, 4).unwrap();
    let tg = lock(&c, g, live);
    let t4 = txn_of(2, 9);
    for r in p.backups(T, g).filter(|&n| n != DEAD && n != 2) {
        append(&c, r, t4, live, &[(g, 55, tg)]);
    }

    // Node 3 fails: the survivors move to the configuration without it.
    let next = Configuration::initial(4, 3)
        .unwrap()
        .without(1 << DEAD)
        .unwrap();
    for db in &c.dbs[..3] {
        db.cluster().enter(next.clone(), Stage::Recover);
    }
    let stats = Arc::new(Mutex::new(RecoveryStats::default()));
    let st = stats.clone();
    let worker: Worker = Arc::new(move |w: WorkerCtx| {
        let st = st.clone();
        Box::pin(async move {
            let config = w.th.config();
            let mut s = replay::replay(&w.ctx, &w.th, &config.placement, true)
                .await
                .expect("recovery finished");
            s.locks_released += locks::release_non_members(&w.th.db, &config.placement);
            st.lock().unwrap().merge(&s);
        })
    });
    // The dead coordinator logged by WRITE into rings (FaRM's log; recovery reads rings
    // only under such a policy).
    let mut spec = RunSpec {
        coroutines: 1,
        ..Default::default()
    };
    spec.txn.policy = ambidex_txn::Policy::farm();
    runner::run(&c.nodes[..3], &c.dbs[..3], &spec, worker).unwrap();
    let s = *stats.lock().unwrap();
    let np: &Placement = &next.placement;
    // Up-to-date replicas (syncing ones are still being copied).
    let synced = |key: u64| -> Vec<u16> { np.up_to_date_of(np.partition(T, key)).collect() };
    // T1, T3 and T4 installed at their primaries (locks released) and applied at every
    // replica, syncing ones too (recovered writes go to every replica); T2 left e as
    // it was at the up-to-date ones.
    let checks = [
        (a, INITIAL - 30, true),
        (b, INITIAL + 30, true),
        (d, 7, true),
        (g, 55, true),
        (e, INITIAL, false),
    ];
    for (key, want, everywhere) in checks {
        let at = if everywhere {
            np.replicas(T, key).to_vec()
        } else {
            synced(key)
        };
        for r in at {
            let db = &c.dbs[r as usize];
            assert_eq!(balance(db, key).0, want, "key {key} at node {r}");
            assert_eq!(
                db.lock_word(T, key).unwrap().owner,
                None,
                "key {key} locked at {r}"
            );
        }
    }
    // T1's record at every surviving backup of a and b, T3's at d's two, T4's at g's
    // backups but its coordinator's node.
    let t4_records = p.backups(T, g).filter(|&n| n != DEAD && n != 2).count() as u64;
    assert_eq!(s.records, backups.len() as u64 + 2 + t4_records, "{s:?}");
    assert_eq!(s.locks_released, 1, "{s:?}");
    // Money: T1 moved 30, T3 set d to 7, T4 g to 55.
    let total: i64 = (0..KEYS)
        .map(|k| balance(&c.dbs[np.primary(T, k) as usize], k).0)
        .sum();
    assert_eq!(
        total,
        INITIAL * KEYS as i64 - (INITIAL - 7) - (INITIAL - 55)
    );
    // Every up-to-date replica of every key equals its primary in the new
    // configuration.
    for k in 0..KEYS {
        let want = balance(&c.dbs[np.primary(T, k) as usize], k);
        for r in synced(k) {
            assert_eq!(balance(&c.dbs[r as usize], k), want, "key {k} at node {r}");
        }
    }
}
