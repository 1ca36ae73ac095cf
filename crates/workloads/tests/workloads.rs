//! End-to-end runs of every workload on small in-process clusters: invariants, TATP's
//! population and found rates, TPC-C consistency, and the report's shape.

use ambidex::bench::sweep_coroutines;
use ambidex::config::Transport;
use ambidex::Config;
use ambidex_txn::Placement;
use ambidex_workloads::common::primary_rows;
use ambidex_workloads::tatp::{self, Tatp};
use ambidex_workloads::WorkloadKind;
use std::collections::HashMap;

/// A benchmark run of a built-in workload.
fn run_bench(
    cfg: &ambidex::Config,
) -> Result<ambidex::bench::BenchReport, ambidex::bench::BenchError> {
    ambidex::bench::run_bench(&ambidex_workloads::registry(), cfg)
}

fn cfg(workload: WorkloadKind, scale: f64, duration_s: f64) -> Config {
    let mut c = Config::default();
    c.run.workload = workload.into();
    c.run.coroutines = Some(4);
    c.run.duration_s = duration_s;
    c.run.warmup_s = 0.2;
    c.run.scale = Some(scale);
    c.run.seed = 7;
    c.run.r = 1;
    c.run.w = 0;
    c
}

#[test]
fn smallbank_invariant_holds_after_a_concurrent_run() {
    // Few accounts (hot set of 2 per... 4% of 600) so transactions really conflict.
    let history = std::env::temp_dir().join(format!("ambidex-sb-{}.jsonl", std::process::id()));
    let mut c = cfg(WorkloadKind::SmallBank, 0.001, 1.0);
    c.cluster.threads = 2;
    c.run.history = Some(history.display().to_string());
    let r = run_bench(&c).unwrap();
    assert_eq!(r.invariant_ok, Some(true), "{}", r.check);
    // The recorded history of the whole run is serializable.
    let report = ambidex_history::check_file(&history).unwrap();
    let _ = std::fs::remove_file(&history);
    assert!(report.valid, "{}", report.summary());
    assert!(
        report.committed >= r.committed,
        "history misses transactions"
    );
    assert!(r.committed > 1_000, "{} committed", r.committed);
    assert_eq!(r.stuck_workers, 0);
    assert!(r.aborted > 0, "a contended run should see aborts");
    let delta = r.check["committed_delta_cents"].as_i64().unwrap();
    assert_ne!(delta, 0, "deltas must be counted");
    // Every type ran.
    for (name, t) in &r.per_type {
        assert!(t.committed > 0, "{name} never committed");
    }
    assert!(r.latency_us.p50 > 0.0 && r.latency_us.p99 >= r.latency_us.p50);
}

#[test]
fn smallbank_on_shm() {
    let mut c = cfg(WorkloadKind::SmallBank, 0.01, 0.5);
    c.cluster.transport = Transport::Shm;
    let r = run_bench(&c).unwrap();
    assert_eq!(r.invariant_ok, Some(true), "{}", r.check);
    assert!(r.committed > 100);
    assert_eq!(r.transport, "shm");
    // Every node's start-up check read the other nodes' tables one-sided.
    // SmallBank: 2 tables per node, 3 nodes.
    assert_eq!(r.remote_tables_verified, vec![4; 3]);
}

#[test]
fn in_process_runs_verify_every_other_nodes_tables_at_start_up() {
    // TPC-C: 12 tables per node, 3 nodes.
    let r = run_bench(&cfg(WorkloadKind::Tpcc, 0.01, 0.3)).unwrap();
    assert_eq!(r.remote_tables_verified, vec![24; 3]);
    assert_eq!(r.consistency_ok, Some(true), "{}", r.check);
}

#[test]
fn tatp_population_has_the_spec_shape() {
    let p = Placement::new(3, 2).unwrap();
    let t = Tatp::new(p.clone(), 0.01); // 10,000 subscribers per node
    let dbs = ambidex::bench::build_and_load(&t, p.clone(), &local_nodes(&p), 3, false).unwrap();
    let n = t.subscribers as usize;
    assert_eq!(n, 30_000);
    assert_eq!(primary_rows(&dbs, tatp::SUBSCRIBER).len(), n);
    let per_sub = |table| {
        let mut m: HashMap<u64, u32> = HashMap::new();
        for (k, _) in primary_rows(&dbs, table) {
            *m.entry(k >> 2).or_default() += 1;
        }
        m
    };
    for table in [tatp::ACCESS_INFO, tatp::SPECIAL_FACILITY] {
        let m = per_sub(table);
        assert_eq!(m.len(), n, "every subscriber has rows in table {table}");
        assert!(m.values().all(|&c| (1..=4).contains(&c)));
        let mean = m.values().sum::<u32>() as f64 / n as f64;
        assert!(
            (mean - 2.5).abs() < 0.03,
            "table {table}: {mean} rows per subscriber"
        );
    }
    let sf = primary_rows(&dbs, tatp::SPECIAL_FACILITY);
    let active = sf.iter().filter(|(_, v)| v[0] == 1).count() as f64 / sf.len() as f64;
    assert!((active - 0.85).abs() < 0.01, "is_active rate {active}");
    // CALL_FORWARDING: each (SF row, start time) with probability 0.5, only under SF rows.
    let sf_keys: std::collections::HashSet<u64> = sf.iter().map(|e| e.0).collect();
    let cf = primary_rows(&dbs, tatp::CALL_FORWARDING);
    assert!(cf.iter().all(|(k, v)| {
        let (s, ty, st) = (k >> 4, (k >> 2) & 3, (k & 3) * 8);
        sf_keys.contains(&(s << 2 | ty)) && v[0] as u64 > st && v[0] as u64 <= st + 8
    }));
    let ratio = cf.len() as f64 / (3.0 * sf.len() as f64);
    assert!((ratio - 0.5).abs() < 0.01, "CALL_FORWARDING fill {ratio}");
}

#[test]
fn tatp_found_rates_match_the_expected_rates() {
    let r = run_bench(&cfg(WorkloadKind::Tatp, 0.005, 2.0)).unwrap();
    assert!(r.committed > 5_000, "{} committed", r.committed);
    assert_eq!(r.stuck_workers, 0);
    for (name, t) in &r.per_type {
        let expected = t.expected_found_rate.unwrap();
        // A tolerance of ~4 standard deviations of the measured rate, at least 1%.
        let sd = (expected * (1.0 - expected) / t.committed.max(1) as f64).sqrt();
        let tol = (4.0 * sd).max(0.01);
        assert!(t.committed > 50, "{name}: only {} committed", t.committed);
        assert!(
            (t.found_rate - expected).abs() < tol,
            "{name}: found {:.4}, expected {expected:.4} ± {tol:.4} ({} committed)",
            t.found_rate,
            t.committed
        );
    }
    // The mix: GET_SUBSCRIBER_DATA 35%, UPDATE_LOCATION 14%.
    let total = (r.committed + r.aborted) as f64;
    let share = |n: &str| (r.per_type[n].committed + r.per_type[n].aborted) as f64 / total;
    assert!((share("get_subscriber_data") - 0.35).abs() < 0.02);
    assert!((share("update_location") - 0.14).abs() < 0.02);
}

#[test]
fn tpcc_consistency_holds_after_a_run() {
    let mut c = cfg(WorkloadKind::Tpcc, 0.01, 1.5);
    c.run.coroutines = Some(6);
    // One warehouse per node, shared by its coroutines: conflicts on every table.
    c.run.warehouses_per_node = Some(1);
    let r = run_bench(&c).unwrap();
    assert_eq!(r.consistency_ok, Some(true), "{}", r.check);
    assert_eq!(r.stuck_workers, 0);
    for (name, t) in &r.per_type {
        assert!(t.committed > 0, "{name} never committed: {:?}", r.per_type);
    }
    // NewOrder's 1% rollbacks are application aborts.
    assert!(
        r.aborts_by_reason.get("user").copied().unwrap_or(0) > 0,
        "{:?}",
        r.aborts_by_reason
    );
    let orders_loaded = 3 * 10 * 30;
    assert!(r.check["orders"].as_u64().unwrap() > orders_loaded);
}

#[test]
fn tpcc_new_order_only_is_consistent() {
    let r = run_bench(&cfg(WorkloadKind::TpccNo, 0.01, 1.0)).unwrap();
    assert_eq!(r.consistency_ok, Some(true), "{}", r.check);
    assert_eq!(r.per_type.values().filter(|t| t.committed > 0).count(), 1);
    assert!(r.per_type["new_order"].committed > 100);
}

/// TPC-E's customer position with 1% market feeds, under FaSST's preset and DrTM+H's
/// (one-sided reads and validation, passive ACK): LAST_TRADE's volume equals the
/// initial one plus the committed feeds' trades, no committed customer position saw a
/// feed half applied or missed a row, and the recorded history is serializable. At
/// 103 securities the feeds really conflict with the customer positions.
#[test]
fn tpce_invariants_hold_under_fasst_and_drtm_h() {
    for mode in ["fasst", "drtm-h"] {
        let history =
            std::env::temp_dir().join(format!("ambidex-tpce-{mode}-{}.jsonl", std::process::id()));
        let mut c = cfg(WorkloadKind::Tpce, 0.01, 0.6);
        c.cluster.threads = 2;
        c.txn.mode = mode.into();
        c.run.history = Some(history.display().to_string());
        let r = run_bench(&c).unwrap();
        assert_eq!(r.invariant_ok, Some(true), "{mode}: {}", r.check);
        let report = ambidex_history::check_file(&history).unwrap();
        let _ = std::fs::remove_file(&history);
        assert!(report.valid, "{mode}: {}", report.summary());
        assert_eq!(r.stuck_workers, 0);
        let (cp, mf) = (&r.per_type["customer_position"], &r.per_type["market_feed"]);
        assert!(cp.committed > 100, "{mode}: {:?}", r.per_type);
        assert!(mf.committed > 0, "{mode}: {:?}", r.per_type);
        assert_eq!((cp.not_found, cp.found_rate), (0, 1.0), "{mode}");
        assert!(r.check["committed_feeds"].as_u64().unwrap() > 0);
        assert!(r.check["committed_positions"].as_u64().unwrap() >= cp.committed);
        // Customer positions are read-only commits; feeds conflict with them.
        assert!(r.txn_layer.read_only_committed >= cp.committed, "{mode}");
        assert!(r.aborted > 0, "{mode}: no conflict at 103 securities");
    }
}

#[test]
fn object_store_runs_and_sweeps() {
    let mut base = cfg(WorkloadKind::ObjectStore, 0.01, 0.4);
    (base.run.r, base.run.w, base.run.warmup_s) = (3, 1, 0.1);
    let (points, reports) =
        sweep_coroutines(&ambidex_workloads::registry(), &base, &[1, 4]).unwrap();
    assert_eq!(points.len(), 2);
    assert_eq!((points[0].coroutines, points[1].coroutines), (1, 4));
    for r in &reports {
        assert!(r.committed > 100, "{} committed", r.committed);
        // Every transaction wrote one key: the layer saw no read-only commits.
        assert_eq!(r.txn_layer.read_only_committed, 0);
    }
}

/// Node transports of an in-process local fabric for placement `p` (the tables live in
/// their regions; the memory outlives the fabric).
fn local_nodes(p: &ambidex_txn::Placement) -> Vec<ambidex_transport::SharedNode> {
    ambidex_transport::local::LocalFabric::new(ambidex_transport::ClusterConfig::new(p.nodes(), 1))
        .unwrap()
        .nodes()
}
