//! A node of a running cluster dies (issue 18): with leases and the embedded manager,
//! the survivors are reconfigured without it, recover the transactions in flight from
//! the log records and go on committing, in the same run. Checked afterwards: money is
//! conserved at the primaries of the final configuration, every copy the final
//! configuration names equals its primary, no lock is left, and workers saw the
//! failure as aborts with a reason, never a hang.

mod common;

use ambidex_cluster::Placement;
use ambidex_txn::policy::Policy;
use ambidex_txn::runner::{self, ManagerSpec, RunSpec, Worker, WorkerCtx};
use ambidex_txn::{TableSpec, TxnConfig};
use common::{random_transfer, Backend, TestCluster};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ACCOUNTS: u32 = 1;
const N_ACCOUNTS: u64 = 24;
const INITIAL: i64 = 1000;

/// Sum of the balances at the primaries `placement` names (its members only).
fn money_at_primaries(c: &TestCluster, placement: &Placement) -> i64 {
    (0..N_ACCOUNTS)
        .map(|k| {
            let p = placement.primary(ACCOUNTS, k);
            let mut v = Vec::new();
            ambidex_txn::actions::read(&c.dbs[p as usize], ACCOUNTS, k, &mut v);
            i64::from_le_bytes(v.try_into().unwrap())
        })
        .sum()
}

/// Every copy `placement` lists equals the primary's (version and value).
fn assert_copies_equal(c: &TestCluster, placement: &Placement) {
    for k in 0..N_ACCOUNTS {
        let reps = placement.replicas(ACCOUNTS, k);
        let copy = |n: u16| {
            c.dbs[n as usize]
                .dump(ACCOUNTS)
                .into_iter()
                .find(|(key, _, _)| *key == k)
                .map(|(_, meta, v)| (meta, v))
        };
        let primary = copy(reps[0]).expect("the primary has the key");
        for &r in &reps[1..] {
            assert_eq!(copy(r), Some(primary.clone()), "key {k}: node {r} differs");
        }
    }
}

fn kill_one(policy: Policy, kill_at: Duration) {
    let table = TableSpec {
        id: ACCOUNTS,
        name: "accounts".into(),
        value_size: 8,
        capacity_per_node: 1024,
    };
    let c = TestCluster::new(Backend::Local, 3, 2, 3, &[table]);
    // The one-sided phases and rings need every node's descriptors.
    c.set_catalogs();
    for k in 0..N_ACCOUNTS {
        c.load(ACCOUNTS, k, &INITIAL.to_le_bytes());
    }
    let start = Instant::now();
    let after_kill = Arc::new(AtomicU64::new(0));
    let ak = after_kill.clone();
    let worker: Worker = Arc::new(move |w: WorkerCtx| {
        let ak = ak.clone();
        Box::pin(async move {
            let mut seed = 0x9e37_79b9
                ^ ((w.node as u64) << 32)
                ^ ((w.thread as u64) << 16)
                ^ w.coroutine as u64
                | 1;
            while !w.stop.load(Ordering::Relaxed) {
                if random_transfer(&w, ACCOUNTS, N_ACCOUNTS, &mut seed).await
                    && start.elapsed() > kill_at + Duration::from_millis(5)
                {
                    ak.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    });
    let spec = RunSpec {
        coroutines: 3,
        txn: TxnConfig {
            policy,
            ..Default::default()
        },
        duration: Some(kill_at + Duration::from_millis(1500)),
        manager: Some(ManagerSpec {
            lease: Duration::from_millis(50),
        }),
        kill: Some((2, kill_at)),
        ..Default::default()
    };
    let r = runner::run(&c.nodes, &c.dbs, &spec, worker).unwrap();
    eprintln!(
        "after kill {} committed {} aborts {:?} by_recovery {} incomplete {} epoch {:?} events {:?}",
        after_kill.load(Ordering::Relaxed),
        r.txn.committed,
        r.txn.aborts,
        r.txn.committed_by_recovery,
        r.txn.committed_incomplete,
        r.cluster.as_ref().map(|s| s.config.epoch),
        r.events.iter().map(|e| (e.at_ns.saturating_sub(r.start_ns) / 1000, e.what.clone())).collect::<Vec<_>>()
    );
    assert_eq!(r.killed, Some(2));
    assert_eq!(r.stuck_workers, 0);
    let state = r.cluster.expect("the manager's final state");
    let placement = &state.config.placement;
    assert!(
        !placement.is_member(2),
        "node 2 was removed: {:?}",
        r.events
    );
    assert!(state.config.epoch > 1);
    assert!(
        after_kill.load(Ordering::Relaxed) > 50,
        "the survivors go on committing after the kill: {} ({:?})",
        after_kill.load(Ordering::Relaxed),
        r.txn
    );
    let reasons = &r.txn.aborts;
    assert!(
        reasons.contains_key("epoch_changed") || reasons.contains_key("node_failed"),
        "the failure shows as aborts with a reason: {reasons:?}"
    );
    assert_eq!(
        money_at_primaries(&c, placement),
        INITIAL * N_ACCOUNTS as i64
    );
    assert_copies_equal(&c, placement);
    for n in placement.members() {
        assert_eq!(
            ambidex_txn::recovery::locks::release_all(&c.dbs[n as usize]),
            0,
            "node {n} holds no lock"
        );
    }
}

#[test]
fn a_killed_node_is_recovered_from_fasst() {
    kill_one(Policy::fasst(), Duration::from_millis(300));
}

#[test]
fn a_killed_node_is_recovered_from_farm() {
    kill_one(Policy::farm(), Duration::from_millis(300));
}

#[test]
fn a_killed_node_is_recovered_from_drtm_r() {
    kill_one(Policy::drtm_r(), Duration::from_millis(300));
}

#[test]
fn a_killed_node_is_recovered_from_drtm_h() {
    kill_one(Policy::drtm_h(), Duration::from_millis(300));
}
