//! A killed node restarted with the same id rejoins (issue 18): in the same run, node 2
//! is killed, removed by the others, then started again with an empty database as a
//! new incarnation; it joins, is made a syncing backup of every partition short of
//! copies, is copied to by their primaries while transactions run, and becomes a full
//! backup. Checked afterwards: the rejoined node is a member with its new incarnation,
//! every partition has 3 up-to-date copies, its copies equal their primaries, money is
//! conserved, no lock is held, and it coordinated transactions itself.

mod common;

use ambidex_cluster::EventKind;
use ambidex_txn::log_ring::LogRingConfig;
use ambidex_txn::policy::Policy;
use ambidex_txn::runner::{self, DbFactory, ManagerSpec, RunSpec, Worker, WorkerCtx};
use ambidex_txn::{NodeDb, TxnConfig};
use common::bank::{self, table, ACCOUNTS, COLD, INITIAL, N_ACCOUNTS};
use common::{random_transfer, worker_seed};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One cluster test at a time: each runs a whole cluster of polling threads, and two
/// at once on a small machine starve the leases they rely on.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn kill_and_rejoin(policy: Policy, nodes: u16, kill_at: Duration, restart_at: Duration) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut c = bank::cluster(nodes);
    let start = Instant::now();
    // Commits coordinated by the rejoined node.
    let by_rejoined = Arc::new(AtomicU64::new(0));
    let br = by_rejoined.clone();
    let worker: Worker = Arc::new(move |w: WorkerCtx| {
        let br = br.clone();
        Box::pin(async move {
            let mut seed = worker_seed(&w, 0x51ed_2701 ^ start.elapsed().as_nanos() as u64);
            // Until node 2 rejoined and every copy is up to date (as this node sees
            // it), and a while after the restart; the run's duration is only a bound.
            let mine = std::cell::Cell::new(0u64);
            // The rejoined node's workers commit a few of their own first.
            let done = || {
                (w.node != 2 || mine.get() >= 20)
                    && start.elapsed() > restart_at + Duration::from_millis(600)
                    && w.th.db.config().with(|c| {
                        c.incarnations[2] == 2
                            && c.placement.is_member(2)
                            && c.placement.syncing().next().is_none()
                    })
            };
            while !w.stop.load(Ordering::Relaxed) && !done() {
                if random_transfer(&w, ACCOUNTS, N_ACCOUNTS, &mut seed).await
                    && w.node == 2
                    && start.elapsed() > restart_at
                {
                    br.fetch_add(1, Ordering::Relaxed);
                    mine.set(mine.get() + 1);
                }
            }
        })
    });
    let fresh_db: DbFactory = Arc::new(|node, config| {
        NodeDb::with_config(&**node, config, &[table()], LogRingConfig::default())
    });
    let spec = RunSpec {
        coroutines: 3,
        txn: TxnConfig {
            policy,
            ..Default::default()
        },
        duration: Some(restart_at + Duration::from_secs(10)),
        manager: Some(ManagerSpec::embedded(Duration::from_millis(50))),
        kill: Some((2, kill_at)),
        restart: Some((2, restart_at)),
        fresh_db: Some(fresh_db),
        ..Default::default()
    };
    let r = runner::run(&c.nodes, &c.dbs, &spec, worker).unwrap();
    let since = |ns: u64| ns.saturating_sub(r.start_ns) / 1000;
    eprintln!(
        "committed {} by the rejoined node {} aborts {:?} recovery {:?} restarted at {:?} us, \
         events {:?}",
        r.txn.committed,
        by_rejoined.load(Ordering::Relaxed),
        r.txn.aborts,
        r.recovery,
        r.restarted.as_ref().map(|x| since(x.at_ns)),
        r.events
            .iter()
            .map(|e| (since(e.at_ns), e.epoch, e.what.clone()))
            .collect::<Vec<_>>()
    );
    assert_eq!(r.killed, Some(2));
    assert_eq!(r.stuck_workers, 0);
    let rejoined = r.restarted.clone().expect("node 2 restarted");
    assert_eq!((rejoined.node, rejoined.incarnation), (2, 2));
    assert!(rejoined.at_ns > r.killed_at_ns);
    let state = r.cluster.expect("the manager's final state");
    let config = &state.config;
    let placement = &config.placement;
    assert!(placement.is_member(2), "node 2 rejoined: {:?}", r.events);
    assert_eq!(config.incarnations[2], 2, "as its new incarnation");
    assert!(
        config.epoch >= 3,
        "removed, then admitted: {}",
        config.epoch
    );
    assert!(
        r.events.iter().any(|e| matches!(
            e.what,
            EventKind::Reconfigured { joined, .. } if joined & (1 << 2) != 0
        )),
        "the join is a reconfiguration: {:?}",
        r.events
    );
    assert_eq!(
        placement.syncing().count(),
        0,
        "every copy is up to date: {config:?}"
    );
    assert!(
        r.recovery.items_copied > 0 && r.recovery.partitions_copied > 0,
        "{:?}",
        r.recovery
    );
    assert_eq!(
        rejoined.db.cluster().config.load().incarnations[2],
        2,
        "the rejoined node runs in a configuration that has it"
    );
    for k in (0..N_ACCOUNTS).chain(COLD) {
        assert_eq!(
            placement.replicas(ACCOUNTS, k).len(),
            3,
            "key {k}: 3 copies"
        );
    }
    // From here on node 2 is its new incarnation.
    c.dbs[2] = rejoined.db.clone();
    assert_eq!(
        c.money_at(placement, ACCOUNTS, 0..N_ACCOUNTS),
        INITIAL * N_ACCOUNTS as i64,
        "money conserved"
    );
    c.assert_copies_equal(placement, ACCOUNTS, (0..N_ACCOUNTS).chain(COLD));
    let held_by_2 = (0..N_ACCOUNTS)
        .chain(COLD)
        .filter(|&k| placement.replicas(ACCOUNTS, k).contains(&2))
        .count();
    if nodes == 3 {
        // R = 3 of 3: every partition was short of a copy, so it holds every key. (With
        // 5 nodes re-replication restored 3 copies before the join: none is short, and
        // the joiner holds none; placement does not rebalance onto it.)
        assert_eq!(held_by_2, (N_ACCOUNTS + COLD.end - COLD.start) as usize);
    }
    assert_eq!(
        rejoined.db.dump(ACCOUNTS).len(),
        held_by_2,
        "the rejoined node holds exactly the keys it is a replica of"
    );
    for n in placement.members() {
        assert_eq!(
            ambidex_txn::recovery::locks::release_all(&c.dbs[n as usize]),
            0,
            "node {n} holds no lock"
        );
    }
    assert!(
        by_rejoined.load(Ordering::Relaxed) > 0,
        "the rejoined node coordinates transactions: {:?}",
        r.txn
    );
    assert!(r.remote_tables_verified > 0);
}

#[test]
fn a_restarted_node_rejoins_under_fasst() {
    kill_and_rejoin(
        Policy::fasst(),
        3,
        Duration::from_millis(300),
        Duration::from_millis(600),
    );
}

#[test]
fn a_restarted_node_rejoins_under_farm() {
    kill_and_rejoin(
        Policy::farm(),
        3,
        Duration::from_millis(300),
        Duration::from_millis(600),
    );
}

#[test]
fn a_restarted_node_rejoins_under_drtm_h() {
    kill_and_rejoin(
        Policy::drtm_h(),
        3,
        Duration::from_millis(300),
        Duration::from_millis(600),
    );
}

#[test]
fn a_restarted_node_rejoins_a_cluster_of_five() {
    kill_and_rejoin(
        Policy::fasst(),
        5,
        Duration::from_millis(300),
        Duration::from_millis(600),
    );
}
