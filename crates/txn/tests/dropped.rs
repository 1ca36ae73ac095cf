//! A transaction dropped without commit or abort releases its locks: local ones at
//! once, remote ones with its thread's next round trip.

mod common;

use ambidex_txn::runner::{self, RunSpec, Worker, WorkerCtx};
use ambidex_txn::{TableSpec, Txn, WriteKind};
use common::{Backend, TestCluster};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const T: u32 = 1;
const KEYS: u64 = 32;

/// Three local nodes, one thread each, with keys 0..KEYS of table T loaded.
fn loaded_cluster() -> TestCluster {
    let spec = TableSpec {
        id: T,
        name: "t".into(),
        value_size: 8,
        capacity_per_node: 256,
    };
    let c = TestCluster::new(Backend::Local, 3, 1, 1, &[spec]);
    for k in 0..KEYS {
        c.load(T, k, &k.to_le_bytes());
    }
    c
}

/// Runs `worker` as the one coroutine of every node until all return; none may stick.
fn run_one_coroutine_per_node(c: &TestCluster, worker: Worker) -> runner::RunResult {
    let spec = RunSpec {
        coroutines: 1,
        ..Default::default()
    };
    let r = runner::run(&c.nodes, &c.dbs, &spec, worker).unwrap();
    assert_eq!(r.stuck_workers, 0);
    r
}

#[test]
fn dropped_transactions_leak_no_locks() {
    let c = loaded_cluster();
    let placement = c.placement.clone();
    let dropped_with_locks = Arc::new(AtomicUsize::new(0));
    // Counts every way a lock outlived its dropped transaction's promise (asserted after
    // the run: a panic inside a worker would stall the cluster instead of failing).
    let held_after_drop = Arc::new(AtomicUsize::new(0));
    let (dw, hd) = (dropped_with_locks.clone(), held_after_drop.clone());
    let dbs = c.dbs.clone();
    let wp = placement.clone();
    let worker: Worker = Arc::new(move |w: WorkerCtx| {
        let (dw, hd, dbs) = (dw.clone(), hd.clone(), dbs.clone());
        let placement = wp.clone();
        Box::pin(async move {
            let me = w.node;
            let local = (0..KEYS).find(|&k| placement.primary(T, k) == me).unwrap();
            let remote: Vec<u64> = (0..KEYS)
                .filter(|&k| placement.primary(T, k) != me)
                .take(2)
                .collect();
            for round in 0..20u64 {
                let mut t = Txn::begin(&w.ctx, &w.th);
                let l = t.write(T, local, WriteKind::Update);
                for &k in &remote {
                    t.write(T, k, WriteKind::Update);
                }
                if t.execute().await.is_ok() {
                    dw.fetch_add(1, Ordering::Relaxed);
                    let _ = l;
                    // Dropped holding three locks: the local one is free at once.
                    drop(t);
                    let db = &w.th.db;
                    if db.lock_word(T, local).and_then(|h| h.owner).is_some() {
                        hd.fetch_add(1, Ordering::Relaxed);
                    }
                    if w.th.orphaned_locks() != 2 {
                        hd.fetch_add(1, Ordering::Relaxed);
                    }
                } else {
                    drop(t);
                }
                // The next transaction's round trip releases the orphans.
                let mut t2 = Txn::begin(&w.ctx, &w.th);
                t2.read(T, remote[(round % 2) as usize]);
                let _ = t2.execute().await;
                // t2 only reads, and this thread runs one coroutine: a remote key still
                // locked by this thread is an orphan that was not released.
                for &k in &remote {
                    let home = &dbs[placement.primary(T, k) as usize];
                    let owner = home.lock_word(T, k).and_then(|h| h.owner);
                    if owner.is_some_and(|o| o.node == me && o.thread == w.thread) {
                        hd.fetch_add(1, Ordering::Relaxed);
                    }
                }
                let _ = t2.commit().await;
            }
        })
    });
    let r = run_one_coroutine_per_node(&c, worker);
    assert!(dropped_with_locks.load(Ordering::Relaxed) > 0);
    assert_eq!(held_after_drop.load(Ordering::Relaxed), 0);
    // Quiescent: no key is locked anywhere.
    for k in 0..KEYS {
        let p = placement.primary(T, k) as usize;
        let h = c.dbs[p].lock_word(T, k).unwrap();
        assert_eq!(h.owner, None, "key {k} still locked by {:?}", h.owner);
    }
    // Each dropped transaction that held locks is counted as an abort.
    assert!(r.txn.aborted >= dropped_with_locks.load(Ordering::Relaxed) as u64);
}

/// A transaction dropped while its LOCKs are in flight cannot name them (their
/// responses never reach it), so its slot is retired: no later transaction of the
/// thread shares its lock owner. (Such a lock stays until recovery frees it by owner.)
#[test]
fn a_slot_with_a_lock_in_flight_is_never_reused() {
    let c = loaded_cluster();
    let placement = c.placement.clone();
    let reused = Arc::new(AtomicUsize::new(0));
    let checked = Arc::new(AtomicUsize::new(0));
    let (ru, ck) = (reused.clone(), checked.clone());
    let worker: Worker = Arc::new(move |w: WorkerCtx| {
        let (ru, ck) = (ru.clone(), ck.clone());
        let placement = placement.clone();
        Box::pin(async move {
            if w.node != 0 {
                return;
            }
            let remote = (0..KEYS).find(|&k| placement.primary(T, k) != 0).unwrap();
            let mut t = Txn::begin(&w.ctx, &w.th);
            t.write(T, remote, WriteKind::Update);
            let dropped = t.owner();
            {
                // Poll the execute once: its LOCK is queued and sent, then the future
                // is dropped before the response comes back.
                let mut fut = std::pin::pin!(t.execute());
                std::future::poll_fn(|cx| {
                    let _ = fut.as_mut().poll(cx);
                    std::task::Poll::Ready(())
                })
                .await;
            }
            drop(t);
            for _ in 0..50 {
                let t = Txn::begin(&w.ctx, &w.th);
                ck.fetch_add(1, Ordering::Relaxed);
                if t.owner() == dropped {
                    ru.fetch_add(1, Ordering::Relaxed);
                }
                drop(t);
            }
        })
    });
    run_one_coroutine_per_node(&c, worker);
    assert_eq!(checked.load(Ordering::Relaxed), 50);
    assert_eq!(
        reused.load(Ordering::Relaxed),
        0,
        "the retired slot was given out again"
    );
}
