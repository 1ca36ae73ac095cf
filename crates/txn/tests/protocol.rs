//! The transaction protocol end to end on in-process clusters: conservation under
//! concurrent transfers, replica consistency, inserts and deletes, log truncation, and
//! both transports with R = 1, 2, 3.

mod common;

use ambidex_txn::runner::{self, RunSpec, Worker, WorkerCtx};
use ambidex_txn::{AbortReason, TableSpec, Txn, WriteKind};
use common::{random_transfer, rng_next, worker_seed, Backend, TestCluster};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

const ACCOUNTS: u32 = 1;

fn accounts_table() -> TableSpec {
    TableSpec {
        id: ACCOUNTS,
        name: "accounts".into(),
        value_size: 8,
        capacity_per_node: 1024,
    }
}

/// Random transfers between a few hot accounts: the total never changes, and after the
/// run every replica equals its primary.
fn transfers(backend: Backend, nodes: u16, replication: u16) {
    const N_ACCOUNTS: u64 = 12;
    const INITIAL: i64 = 1000;
    let c = TestCluster::new(backend, nodes, 2, replication, &[accounts_table()]);
    for k in 0..N_ACCOUNTS {
        c.load(ACCOUNTS, k, &INITIAL.to_le_bytes());
    }
    let committed = Arc::new(AtomicU64::new(0));
    let com = committed.clone();
    let worker: Worker = Arc::new(move |w: WorkerCtx| {
        let com = com.clone();
        Box::pin(async move {
            let mut seed = worker_seed(&w, 0x1234_5678);
            for _ in 0..150 {
                if random_transfer(&w, ACCOUNTS, N_ACCOUNTS, &mut seed).await {
                    com.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    });
    let spec = RunSpec {
        coroutines: 3,
        ..Default::default()
    };
    let r = runner::run(&c.nodes, &c.dbs, &spec, worker).unwrap();
    assert_eq!(r.stuck_workers, 0);
    assert!(
        committed.load(Ordering::Relaxed) > 100,
        "too few commits: {:?}",
        r.txn
    );
    assert_eq!(r.txn.committed, committed.load(Ordering::Relaxed));
    // Sum at the primaries, and replicas equal to them.
    c.assert_money_conserved(ACCOUNTS, N_ACCOUNTS, INITIAL);
    // Logs are truncated: at most the last transactions of each coordinator remain.
    let held: u64 = r.log_records_held.iter().sum();
    assert!(
        held <= (nodes as u64) * 2 * 3 * 2,
        "log not truncated: {held} records held"
    );
}

#[test]
fn transfers_local_r1() {
    transfers(Backend::Local, 3, 1);
}
#[test]
fn transfers_local_r2() {
    transfers(Backend::Local, 3, 2);
}
#[test]
fn transfers_local_r3() {
    transfers(Backend::Local, 3, 3);
}
#[test]
fn transfers_shm_r1() {
    transfers(Backend::Shm, 3, 1);
}
#[test]
fn transfers_shm_r2() {
    transfers(Backend::Shm, 3, 2);
}
#[test]
fn transfers_shm_r3() {
    transfers(Backend::Shm, 3, 3);
}

/// Inserts and deletes go through the same path and replicate; inserting an existing key
/// and deleting a missing one abort with their reasons.
#[test]
fn inserts_and_deletes_replicate() {
    let c = TestCluster::new(Backend::Local, 3, 1, 3, &[accounts_table()]);
    let live = Arc::new(AtomicI64::new(0));
    let lv = live.clone();
    let worker: Worker = Arc::new(move |w: WorkerCtx| {
        let lv = lv.clone();
        Box::pin(async move {
            let mut seed = 99 ^ ((w.node as u64) << 20) ^ w.coroutine as u64 | 1;
            for _ in 0..200 {
                let key = rng_next(&mut seed) % 40;
                let insert = rng_next(&mut seed).is_multiple_of(2);
                let mut t = Txn::begin(&w.ctx, &w.th);
                let kind = if insert {
                    WriteKind::Insert
                } else {
                    WriteKind::Delete
                };
                let i = t.write(ACCOUNTS, key, kind);
                match t.execute().await {
                    Ok(()) => {}
                    Err(AbortReason::InsertExists) | Err(AbortReason::MissingKey) => continue,
                    Err(_) => continue,
                }
                if insert {
                    // An insert that got its lock found the key absent.
                    assert!(t.get(i).is_none(), "insert of key {key} reads as present");
                    t.set(i, &key.to_le_bytes());
                }
                if t.commit().await.is_ok() {
                    lv.fetch_add(if insert { 1 } else { -1 }, Ordering::Relaxed);
                }
            }
        })
    });
    let spec = RunSpec {
        coroutines: 2,
        ..Default::default()
    };
    let r = runner::run(&c.nodes, &c.dbs, &spec, worker).unwrap();
    assert_eq!(r.stuck_workers, 0);
    assert!(r.txn.aborts.get("insert_exists").copied().unwrap_or(0) > 0);
    assert!(r.txn.aborts.get("missing_key").copied().unwrap_or(0) > 0);
    c.assert_replicas_consistent(ACCOUNTS);
    // Live keys at the primaries match the committed inserts minus deletes, with values.
    let mut n_live = 0;
    for key in 0..40u64 {
        let p = c.placement.primary(ACCOUNTS, key);
        let mut v = Vec::new();
        let f = ambidex_txn::actions::read(&c.dbs[p as usize], ACCOUNTS, key, &mut v);
        if f.status == ambidex_txn::messages::Status::Ok {
            assert_eq!(v, key.to_le_bytes());
            n_live += 1;
        }
    }
    assert_eq!(n_live, live.load(Ordering::Relaxed));
}

/// A worker that panics fails the run with the panic's message; the other nodes'
/// workers stop and the run returns (it used to wait for the dead worker for ever).
#[test]
fn a_panicking_worker_fails_the_run_instead_of_hanging() {
    let c = TestCluster::new(Backend::Local, 3, 1, 2, &[accounts_table()]);
    let worker: Worker = Arc::new(move |w: WorkerCtx| {
        Box::pin(async move {
            if w.node == 1 && w.coroutine == 0 {
                panic!("planted worker panic");
            }
            while !w.stop.load(Ordering::Relaxed) {
                w.ctx.yield_now().await;
            }
        })
    });
    let spec = RunSpec {
        coroutines: 2,
        ..Default::default()
    };
    let started = std::time::Instant::now();
    let e = runner::run(&c.nodes, &c.dbs, &spec, worker)
        .err()
        .expect("a panicking worker passed")
        .to_string();
    assert!(e.contains("planted worker panic"), "{e}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}
