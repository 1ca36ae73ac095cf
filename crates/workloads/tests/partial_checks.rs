//! The per-node checks of multi-process runs (`Workload::check_node`, combined by
//! `Workload::check_combine`) agree with the whole-cluster `Workload::check`, catch the
//! same violations, and reject malformed parts without panicking.

use ambidex::bench::build_and_load;
use ambidex::workload::Workload;
use ambidex_txn::{NodeDb, Placement};
use ambidex_workloads::common::primary_rows;
use ambidex_workloads::smallbank::{self, SmallBank};
use ambidex_workloads::tpcc::{Tpcc, TpccParams};
use std::sync::Arc;

fn combined<W: Workload>(
    wl: &W,
    dbs: &[Arc<NodeDb>],
) -> Result<serde_json::Value, ambidex::workload::WorkloadError> {
    let mut parts = Vec::new();
    for db in dbs {
        parts.push(wl.check_node(db)?);
    }
    wl.check_combine(&parts)
}

/// Overwrites the value of `key` in `table` on node `node` (as a faulty replica would).
fn tamper(db: &NodeDb, table: u32, key: u64, f: impl FnOnce(&mut Vec<u8>)) {
    let mut v = Vec::new();
    assert_eq!(
        ambidex_txn::actions::read(db, table, key, &mut v).status,
        ambidex_txn::messages::Status::Ok
    );
    f(&mut v);
    // Applied as a backup applies a committed write (no lock needed), as the next
    // write after this copy's version.
    let version = db.lock_word(table, key).expect("the key is stored").version;
    let w = ambidex_txn::messages::WriteRec {
        table,
        key,
        kind: ambidex_txn::WriteKind::Update,
        prev_version: 0,
        token: ambidex_txn::messages::LockToken {
            offset: 0,
            store_version: version,
        },
        value: &v,
    };
    assert!(ambidex_txn::actions::apply_backup(db, 99, &w));
}

#[test]
fn smallbank_per_node_checks_combine_to_the_cluster_check() {
    let p = Placement::new(3, 3).unwrap();
    let bank = SmallBank::new(p.clone(), 1, 0.01);
    let dbs = build_and_load(&bank, p.clone(), &local_nodes(&p), 5, false).unwrap();
    let whole = bank.check(&dbs).unwrap();
    assert_eq!(combined(&bank, &dbs).unwrap(), whole);
    // One cent more at one primary: both checks fail.
    let rows = primary_rows(&dbs[1..2], smallbank::CHECKING);
    let key = rows[0].0;
    tamper(&dbs[1], smallbank::CHECKING, key, |v| {
        let b = i64::from_le_bytes(v[..8].try_into().unwrap()) + 1;
        v[..8].copy_from_slice(&b.to_le_bytes());
    });
    let e1 = bank.check(&dbs).unwrap_err().to_string();
    let e2 = combined(&bank, &dbs).unwrap_err().to_string();
    assert!(e1.starts_with("total balance") && e2.starts_with("total balance"));
    // Malformed parts are errors.
    assert!(bank.check_combine(&[]).is_err());
    assert!(bank
        .check_combine(&[serde_json::json!({"primary_cents": "x"})])
        .is_err());
    let good = bank.check_node(&dbs[0]).unwrap();
    let mut other = good.clone();
    other["initial_cents"] = serde_json::json!(1);
    assert!(bank
        .check_combine(&[good.clone(), other, good])
        .unwrap_err()
        .to_string()
        .contains("initial total"));
}

/// A node that died sent no part (node processes with a manager): the accounts are still
/// counted, the total is not compared (that node's committed deltas are unknown), and
/// the summary says so.
#[test]
fn smallbank_balance_is_unchecked_without_a_dead_nodes_part() {
    let p = Placement::new(3, 3).unwrap();
    let bank = SmallBank::new(p, 1, 0.01);
    let n = bank.accounts;
    let part = |node: u16, rows: u64, cents: i64| {
        serde_json::json!({
            "node": node, "savings_rows": rows, "checking_rows": rows,
            "primary_cents": cents, "initial_cents": 100, "committed_delta_cents": 5,
        })
    };
    // Every node: the total is checked.
    let all = [part(0, n, 115), part(1, 0, 0), part(2, 0, 0)];
    assert_eq!(bank.check_combine(&all).unwrap()["expected_cents"], 115);
    assert!(bank
        .check_combine(&[part(0, n, 116), part(1, 0, 0), part(2, 0, 0)])
        .is_err());
    // Node 2 missing: not compared, and said so.
    let s = bank
        .check_combine(&[part(0, n, 120), part(1, 0, 0)])
        .unwrap();
    assert_eq!(s["balance_checked"], false, "{s}");
    assert_eq!(s["unaccounted_cents"], 10, "{s}");
    assert!(s["why_unchecked"].as_str().unwrap().contains("[2]"), "{s}");
    // Accounts missing still fail.
    assert!(bank
        .check_combine(&[part(0, n - 1, 120), part(1, 0, 0)])
        .is_err());
}

#[test]
fn tpcc_per_node_checks_combine_to_the_cluster_check() {
    let p = Placement::new(3, 2).unwrap();
    let t = Tpcc::new(TpccParams::new(p.clone(), 1, 1, 0.02, false, 1.0));
    let dbs = build_and_load(&t, p.clone(), &local_nodes(&p), 5, false).unwrap();
    let whole = t.check(&dbs).unwrap();
    assert_eq!(combined(&t, &dbs).unwrap(), whole);
    assert_eq!(whole["warehouses"], 3);
    // A node missing its warehouse's parts cannot pass.
    let parts: Vec<_> = dbs[..2].iter().map(|d| t.check_node(d).unwrap()).collect();
    assert!(t.check_combine(&parts).is_err());
    assert!(t.check_combine(&[serde_json::json!(null)]).is_err());
}

/// Node transports of an in-process local fabric for placement `p` (the tables live in
/// their regions; the memory outlives the fabric).
fn local_nodes(p: &ambidex_txn::Placement) -> Vec<ambidex_transport::SharedNode> {
    ambidex_transport::local::LocalFabric::new(ambidex_transport::ClusterConfig::new(p.nodes(), 1))
        .unwrap()
        .nodes()
}

/// After a death, every node checks under the manager's final configuration
/// (`check_under`): a node left in an older epoch would count its primaries with the
/// old placement, and the dead node's accounts would be missing from the combination.
#[test]
fn nodes_left_in_different_epochs_check_under_the_final_configuration() {
    use ambidex::bench::node::check_under;
    use ambidex_cluster::{ClusterState, Configuration, Stage};
    let p = Placement::new(3, 3).unwrap();
    let bank = SmallBank::new(p.clone(), 1, 0.01);
    let dbs = build_and_load(&bank, p.clone(), &local_nodes(&p), 5, false).unwrap();
    let last = ClusterState {
        config: Configuration::initial(3, 3)
            .unwrap()
            .without(1 << 2)
            .unwrap(),
        stage: Stage::Run,
        revision: 9,
    };
    // Node 2 died; one survivor moved to epoch 2, the other's agent stopped before it
    // did. The one that moved is one that gained none of node 2's partitions (if
    // either did not), so the combination misses the partitions the other gained.
    let first = Configuration::initial(3, 3).unwrap();
    let gained = |n: u16| {
        primary_rows(&dbs[2..], smallbank::CHECKING)
            .iter()
            .any(|&(k, _)| last.config.placement.primary(smallbank::CHECKING, k) == n)
    };
    let moved: usize = if gained(0) { 1 } else { 0 };
    assert!(gained(1 - moved as u16), "node 2's partitions went nowhere");
    let survivors = &dbs[..2];
    survivors[moved]
        .cluster()
        .enter(last.config.clone(), Stage::Run);
    let e = combined(&bank, survivors).unwrap_err().to_string();
    assert!(e.contains("accounts"), "{e}");
    // A final state mid-reconfiguration, or older than a node's, is refused.
    let adopt = ClusterState {
        stage: Stage::Adopt,
        ..last.clone()
    };
    assert!(check_under(&dbs[1], Some(&adopt)).is_err());
    let older = ClusterState {
        config: first,
        ..last.clone()
    };
    assert!(check_under(&survivors[moved], Some(&older)).is_err());
    for db in survivors {
        check_under(db, Some(&last)).unwrap();
    }
    let v = combined(&bank, survivors).unwrap();
    assert_eq!(v["balance_checked"], false, "{v}");
}
