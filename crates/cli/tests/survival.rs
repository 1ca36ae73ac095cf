//! Runs with the configuration manager on (the default): the launcher hosts it, node
//! processes hold leases from it over their control channel, and a node that dies is
//! reported rather than fatal (docs/cluster.md). The report carries the throughput
//! timeline, the failures and the manager's events.

mod common;

use common::{bench_smallbank, kinds};
use serde_json::Value;

/// Runs `ambidex bench smallbank --transport shm ARGS --json`: (exit success, report,
/// stderr). The report is printed even when the workload's check fails.
fn bench(args: &[&str]) -> (bool, Value, String) {
    bench_over("shm", args)
}

/// [`bench`] over `transport`.
fn bench_over(transport: &str, args: &[&str]) -> (bool, Value, String) {
    let mut all = vec!["--transport", transport];
    all.extend_from_slice(args);
    bench_smallbank(&all)
}

fn timeline(r: &Value) -> Vec<u64> {
    r["timeline_10ms"]
        .as_array()
        .unwrap_or_else(|| panic!("no timeline: {r}"))
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

#[test]
fn with_the_manager_and_no_failure_the_report_has_a_timeline_and_no_failures() {
    let (ok, r, stderr) = bench(&["--duration", "1", "--warmup", "0.3"]);
    assert!(ok, "{stderr}");
    assert_eq!(
        r["config"]["cluster"]["manager"], "embedded",
        "{}",
        r["config"]
    );
    assert_eq!(r["invariant_ok"], true);
    assert!(r["check"]["replica_rows_compared"].as_u64().unwrap() > 0);
    assert_eq!(r["failures"], Value::Array(vec![]));
    assert_eq!(r["kills"], Value::Array(vec![]));
    assert!(r["recovery"].is_null(), "{}", r["recovery"]);
    // No failure: no lease expired (the agents renewed over the control channel).
    assert_eq!(kinds(&r), Vec::<String>::new(), "{}", r["manager_events"]);
    // The timeline covers the whole run (warmup and measured window, 10 ms each):
    // about 130 buckets, and the measured window's buckets hold about the committed
    // count (its edges fall inside a bucket, and each node starts its clock when it
    // receives `start`).
    let t = timeline(&r);
    assert!((100..=400).contains(&t.len()), "{} buckets", t.len());
    let committed = r["committed"].as_u64().unwrap();
    let window: u64 = t.iter().skip(30).take(100).sum();
    let whole: u64 = t.iter().sum();
    assert!(
        whole >= committed,
        "timeline {whole} < committed {committed}"
    );
    let off = (window as f64 - committed as f64).abs() / committed as f64;
    assert!(
        off < 0.2,
        "measured window's buckets sum to {window}, committed {committed}"
    );
}

/// The launcher's side of a failure: node 2 is killed 1 s in; the others run on to the
/// end of the run, the failure and the manager's reaction are in the report (the
/// survivors' recovery and checks: the tests below).
#[test]
fn a_killed_node_is_reported_and_the_others_run_on() {
    let (_ok, r, stderr) = bench(&["--duration", "2", "--warmup", "0.3", "--kill", "2@1"]);
    let failures = r["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{stderr}");
    assert_eq!(failures[0]["node"], 2);
    assert!(
        failures[0]["how"].as_str().unwrap().contains("SIGKILL"),
        "{}",
        failures[0]
    );
    let kills = r["kills"].as_array().unwrap();
    assert_eq!(kills.len(), 1);
    let at = kills[0]["at_ms"].as_f64().unwrap();
    assert!((1000.0..1500.0).contains(&at), "killed at {at} ms");
    // The others were not killed: they reported, and only them.
    assert_eq!(
        r["remote_tables_verified"].as_array().unwrap().len(),
        2,
        "{r}"
    );
    let k = kinds(&r);
    let pos = |what: &str| k.iter().position(|x| x == what);
    let expired = pos("lease-expired").unwrap_or_else(|| panic!("{k:?}"));
    let reconfigured = pos("reconfigured").unwrap_or_else(|| panic!("{k:?}"));
    assert!(expired <= reconfigured, "{k:?}");
    let rc = &r["recovery"];
    let detected = rc["detected_ms"].as_f64().unwrap();
    // Detected once the lease (50 ms) ran out: not before, and not much after.
    assert!((0.0..1000.0).contains(&detected), "{rc}");
    assert!(rc["reconfigured_ms"].as_f64().unwrap() >= detected, "{rc}");
    // Transactions committed after the kill (on the survivors).
    let t = timeline(&r);
    let after: u64 = t.iter().skip(((at + 100.0) / 10.0) as usize).sum();
    assert!(after > 0, "nothing committed after the kill: {t:?}");
    eprintln!("recovery {rc}; events {k:?}; check {}", r["check"]);
}

/// The whole of issue 18 over node processes: node 2 is killed 1 s in, the survivors
/// are reconfigured without it, recover, commit again (transactions on node 2's former
/// partitions too) and pass the checks that can be made after a death: every account
/// is at a surviving primary and every copy of the final placement equals its primary.
/// SmallBank's total balance cannot be checked (the deposits node 2's workers committed
/// died with it): the report says so (`balance_checked: false`, `invariant_ok` absent).
/// One kill run at a time: two clusters of node processes at once on a small machine
/// starve each other's recovery (a FaRM-over-shm run took 1.28 s to recover in CI
/// beside another).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn killed_node_survived(transport: &str, mode: &str) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (ok, r, stderr) = bench_over(
        transport,
        &[
            "--mode",
            mode,
            "--duration",
            "2",
            "--warmup",
            "0.3",
            "--kill",
            "2@1",
        ],
    );
    assert!(ok, "{stderr}");
    assert_eq!(r["failures"].as_array().unwrap().len(), 1, "{stderr}");
    let rc = &r["recovery"];
    let recovered = rc["recovered_ms"]
        .as_f64()
        .unwrap_or_else(|| panic!("not recovered: {rc}; {:?}", kinds(&r)));
    let first = rc["first_commit_ms"]
        .as_f64()
        .unwrap_or_else(|| panic!("no commit on node 2's partitions after the kill: {rc}"));
    // Transactions run again only once every member recovered (stage Run); the first
    // commit on a lost partition comes after that (the system clock of one host; each
    // process samples its base once, so allow them 1 ms apart).
    assert!(first >= recovered - 1.0, "{rc}");
    // A bound with room for a loaded machine: the recovery times themselves are
    // measured by `bench --kill` runs (docs/recovery.md), not asserted here.
    assert!(first < 3000.0, "{rc}");
    let check = &r["check"];
    assert!(check.get("violation").is_none(), "{check}");
    assert_eq!(check["balance_checked"], false, "{check}");
    assert!(
        check["replica_rows_compared"].as_u64().unwrap() > 0,
        "{check}"
    );
    assert!(r.get("invariant_ok").is_none(), "{r}");
    assert_eq!(r["policy"]["preset"], mode, "{}", r["policy"]);
    eprintln!("{transport} {mode}: recovery {rc}; check {check}");
}

#[test]
fn a_killed_node_is_survived_over_shm_under_fasst() {
    killed_node_survived("shm", "fasst");
}

#[test]
fn a_killed_node_is_survived_over_shm_under_farm() {
    killed_node_survived("shm", "farm");
}

#[test]
fn a_killed_node_is_survived_over_shm_under_drtm_r() {
    killed_node_survived("shm", "drtm-r");
}

#[test]
fn a_killed_node_is_survived_over_shm_under_drtm_h() {
    killed_node_survived("shm", "drtm-h");
}

#[test]
fn a_killed_node_is_survived_over_udp_under_fasst() {
    killed_node_survived("udp", "fasst");
}

#[test]
fn a_killed_node_is_survived_over_udp_under_farm() {
    killed_node_survived("udp", "farm");
}

#[test]
fn a_killed_node_is_survived_over_udp_under_drtm_r() {
    killed_node_survived("udp", "drtm-r");
}

#[test]
fn a_killed_node_is_survived_over_udp_under_drtm_h() {
    killed_node_survived("udp", "drtm-h");
}

#[test]
fn bad_kills_are_clear_errors() {
    for (args, says) in [
        (vec!["--kill", "3@1"], "nodes 0..3"),
        (vec!["--kill", "1@0"], "after the start"),
        (vec!["--kill", "1@9"], "before the run ends"),
        (vec!["--kill", "1"], "NODE@SECONDS"),
        (vec!["--kill", "x@1"], "node"),
        (vec!["--kill", "1@1", "--in-process"], "node processes"),
    ] {
        common::assert_refused(&args, says);
    }
}
