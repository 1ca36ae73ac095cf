//! A node of a running cluster dies (issue 18): with leases and the embedded manager,
//! the survivors are reconfigured without it, recover the transactions in flight from
//! the log records and go on committing, in the same run. Checked afterwards: money is
//! conserved at the primaries of the final configuration, every copy the final
//! configuration names equals its primary, no lock is left, and workers saw the
//! failure as aborts with a reason, never a hang.

mod common;

use ambidex_txn::policy::{Execute, Lock, Policy};
use ambidex_txn::runner::{self, ManagerSpec, RunSpec, Worker, WorkerCtx};
use ambidex_txn::TxnConfig;
use common::bank::{self, ACCOUNTS, COLD, INITIAL, N_ACCOUNTS};
use common::{random_transfer, rng_next, transfer, worker_seed};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One kill test at a time: each runs a whole cluster of polling threads, and two at
/// once on a small machine starve the leases they measure.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn kill_one(policy: Policy, nodes: u16, kill_at: Duration) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let c = bank::cluster(nodes);
    let start = Instant::now();
    let after_kill = Arc::new(AtomicU64::new(0));
    let ak = after_kill.clone();
    let worker: Worker = Arc::new(move |w: WorkerCtx| {
        let ak = ak.clone();
        Box::pin(async move {
            let mut seed = worker_seed(&w, 0x9e37_79b9);
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
        manager: Some(ManagerSpec::embedded(Duration::from_millis(50))),
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
    // A transaction that needs an RPC of the dead node fails with a reason. Under
    // DrTM+R and DrTM+H a transfer may send it none (locks by CAS, reads and log and
    // commit one-sided, into memory an in-process crash leaves in place), so whether one
    // was caught in flight is chance (about 1 run in 6 saw none on a loaded machine).
    let needs_rpc = policy.execute == Execute::Rpc || policy.lock == Lock::Rpc;
    assert!(
        !needs_rpc || reasons.contains_key("epoch_changed") || reasons.contains_key("node_failed"),
        "the failure shows as aborts with a reason: {reasons:?}"
    );
    assert_eq!(
        c.money_at(placement, ACCOUNTS, 0..N_ACCOUNTS),
        INITIAL * N_ACCOUNTS as i64
    );
    // With a member to spare, every partition that lost a copy got a new one, copied
    // from its primary while transactions ran, and reported up to date.
    if nodes > 3 {
        assert!(
            r.events
                .iter()
                .any(|e| matches!(e.what, ambidex_cluster::EventKind::Rereplicated)),
            "re-replicated: {:?} {:?}",
            r.events,
            r.recovery
        );
        assert!(
            r.recovery.items_copied > 0 && r.recovery.partitions_copied > 0,
            "{:?}",
            r.recovery
        );
        for k in (0..N_ACCOUNTS).chain(COLD) {
            assert_eq!(
                placement.replicas(ACCOUNTS, k).len(),
                3,
                "key {k} has 3 copies"
            );
        }
    }
    assert_eq!(placement.syncing().count(), 0, "every copy is up to date");
    c.assert_copies_equal(placement, ACCOUNTS, (0..N_ACCOUNTS).chain(COLD));
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
    kill_one(Policy::fasst(), 3, Duration::from_millis(300));
}

#[test]
fn a_killed_node_is_recovered_from_farm() {
    kill_one(Policy::farm(), 3, Duration::from_millis(300));
}

#[test]
fn a_killed_node_is_recovered_from_drtm_r() {
    kill_one(Policy::drtm_r(), 3, Duration::from_millis(300));
}

#[test]
fn a_killed_node_is_recovered_from_drtm_h() {
    kill_one(Policy::drtm_h(), 3, Duration::from_millis(300));
}

#[test]
fn a_killed_nodes_copies_are_rereplicated_under_fasst() {
    kill_one(Policy::fasst(), 5, Duration::from_millis(300));
}

#[test]
fn a_killed_nodes_copies_are_rereplicated_under_drtm_h() {
    kill_one(Policy::drtm_h(), 5, Duration::from_millis(300));
}

/// The time from a kill to the first commit of a transaction that writes a key whose
/// primary was on the killed node, over 20 kills (3 nodes × 2 threads, R = 3, FaSST).
/// A measurement, not a check: run it by hand,
/// `LEASE_MS=20 cargo test --release -p ambidex-txn --test failover -- --ignored --nocapture times`.
#[test]
#[ignore = "a measurement (20 runs): run by hand"]
fn recovery_times_over_20_kills() {
    let lease = std::env::var("LEASE_MS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let kill_at = Duration::from_millis(200);
    let mut firsts = Vec::new();
    for run in 0..20 {
        let c = bank::cluster(3);
        let lost: Arc<Vec<u64>> = Arc::new(
            (0..N_ACCOUNTS)
                .filter(|&k| c.placement.primary(ACCOUNTS, k) == 2)
                .collect(),
        );
        // Per worker, (start, end) of its commits on lost keys (the runtime's clock, the
        // manager's too), handed over when it returns.
        let commits = Arc::new(std::sync::Mutex::new(Vec::new()));
        let all = commits.clone();
        let worker: Worker = Arc::new(move |w: WorkerCtx| {
            let (all, lost) = (all.clone(), lost.clone());
            Box::pin(async move {
                let mut seed = worker_seed(&w, 0x2545_f491);
                let mut mine = Vec::new();
                while !w.stop.load(Ordering::Relaxed) {
                    let a = lost[(rng_next(&mut seed) % lost.len() as u64) as usize];
                    let b = (a + 1 + rng_next(&mut seed) % (N_ACCOUNTS - 1)) % N_ACCOUNTS;
                    let t0 = w.ctx.now_ns();
                    if transfer(&w, ACCOUNTS, a, b, 1).await {
                        mine.push((t0, w.ctx.now_ns()));
                    }
                }
                all.lock().unwrap().extend(mine);
            })
        });
        let spec = RunSpec {
            coroutines: 3,
            txn: TxnConfig::default(),
            duration: Some(kill_at + Duration::from_millis(400)),
            manager: Some(ManagerSpec::embedded(Duration::from_millis(lease))),
            kill: Some((2, kill_at)),
            ..Default::default()
        };
        let r = runner::run(&c.nodes, &c.dbs, &spec, worker).unwrap();
        let killed = r.killed_at_ns;
        let first = commits
            .lock()
            .unwrap()
            .iter()
            .filter(|&&(t0, _)| t0 >= killed)
            .map(|&(_, t1)| t1)
            .min()
            .expect("a lost key was written again after the kill");
        let ms = (first - killed) as f64 / 1e6;
        let since_kill = |what: fn(&ambidex_cluster::EventKind) -> bool| {
            r.events
                .iter()
                .find(|e| what(&e.what))
                .map(|e| format!("{:.1}", e.at_ns.saturating_sub(killed) as f64 / 1e6))
        };
        eprintln!(
            "run {run}: lease expired {:?} ms, recovered {:?} ms, first commit on a lost key \
             {ms:.1} ms after the kill",
            since_kill(|e| matches!(e, ambidex_cluster::EventKind::LeaseExpired { .. })),
            since_kill(|e| matches!(e, ambidex_cluster::EventKind::Recovered)),
        );
        firsts.push(ms);
    }
    firsts.sort_by(f64::total_cmp);
    eprintln!(
        "lease {lease} ms, 20 kills: first commit on a lost key after the kill: median {:.1} ms, \
         min {:.1}, max {:.1}",
        (firsts[9] + firsts[10]) / 2.0,
        firsts[0],
        firsts[19]
    );
}
