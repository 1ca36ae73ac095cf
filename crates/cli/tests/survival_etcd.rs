//! Node processes with the etcd manager (`--manager etcd --etcd URL`): the launcher
//! creates the run's cluster in etcd, each node's agent holds its lease in etcd itself,
//! and a node killed mid-run is removed when etcd's lease expires; the survivors
//! recover, commit again (on the killed node's partitions too) and pass the checks;
//! restarted (`--restart`), it rejoins through etcd as its next incarnation and is
//! re-replicated into.
//! etcd is Debian's `etcd-server` on loopback (`LocalEtcd`, 1 s leases); without it
//! the test prints why and passes, except under CI (.ci/run installs it).
//!
//! The `ambidex` binary these tests run has etcd: the crate's dev-dependency on
//! ambidex-workloads turns its `etcd` feature on for test builds.

mod common;

use ambidex_cluster::manager::etcd::local::LocalEtcd;
use common::{bench_smallbank as bench, check_restart, kinds, EXE};
use std::process::Command;

#[test]
fn a_killed_node_process_is_removed_by_etcd_and_the_survivors_recover() {
    let Some(etcd) = LocalEtcd::start_for_test("survival") else {
        return;
    };
    let (ok, r, stderr) = bench(&[
        "--transport",
        "udp",
        "--manager",
        "etcd",
        "--etcd",
        etcd.endpoint(),
        "--lease-ms",
        "1000",
        // The survivors give up on node 2, and suspect it, long before etcd expires it.
        "--rpc-give-up-ms",
        "600",
        "--duration",
        "4",
        "--warmup",
        "0.3",
        "--kill",
        "2@1",
    ]);
    assert!(ok, "{stderr}");
    assert_eq!(r["config"]["cluster"]["manager"], "etcd", "{}", r["config"]);
    assert_eq!(r["failures"].as_array().unwrap().len(), 1, "{stderr}");
    let k = kinds(&r);
    let pos = |what: &str| k.iter().position(|x| x == what);
    let expired = pos("lease-expired").unwrap_or_else(|| panic!("{k:?}"));
    let reconfigured = pos("reconfigured").unwrap_or_else(|| panic!("{k:?}"));
    assert!(expired <= reconfigured, "{k:?}");
    let rc = &r["recovery"];
    // etcd deletes the dead node's key between its 1 s TTL and 0.5 s after (its expiry
    // sweep), counted from its last renewal, before the kill. The survivors suspect it
    // long before that, and must not revoke it (a revocation would hold its key for a
    // lease and a second more: about 3.3 s).
    let reconfigured = rc["reconfigured_ms"]
        .as_f64()
        .unwrap_or_else(|| panic!("{rc}"));
    assert!((500.0..2200.0).contains(&reconfigured), "{rc}; {k:?}");
    assert!(!k.contains(&"revoked".to_string()), "{k:?}");
    assert!(rc["recovered_ms"].as_f64().is_some(), "{rc}");
    let first = rc["first_commit_ms"]
        .as_f64()
        .unwrap_or_else(|| panic!("no commit on node 2's partitions after the kill: {rc}"));
    // After the new configuration. (Not necessarily after the `recovered` event: the
    // node that publishes stage Run times its event once etcd answered, and another
    // node may have started on it by then.)
    assert!(first >= reconfigured, "{rc}");
    let check = &r["check"];
    assert!(check.get("violation").is_none(), "{check}");
    assert_eq!(check["balance_checked"], false, "{check}");
    assert!(
        check["replica_rows_compared"].as_u64().unwrap() > 0,
        "{check}"
    );
    eprintln!("etcd over udp: recovery {rc}; events {k:?}");
}

/// Node 2 is killed 0.5 s in and restarted as soon after 0.7 s as etcd removed it (its
/// key expires 1-1.5 s after its last renewal): the launcher reads the membership from
/// etcd, and the new process's client joins as incarnation 2.
#[test]
fn a_killed_node_process_restarts_and_rejoins_through_etcd() {
    let Some(etcd) = LocalEtcd::start_for_test("restart") else {
        return;
    };
    let (ok, r, stderr) = bench(&[
        "--transport",
        "udp",
        "--manager",
        "etcd",
        "--etcd",
        etcd.endpoint(),
        "--lease-ms",
        "1000",
        "--rpc-give-up-ms",
        "600",
        "--duration",
        "4",
        "--warmup",
        "0.3",
        "--kill",
        "2@0.5",
        "--restart",
        "2@0.7",
    ]);
    eprintln!(
        "etcd restart over udp: restarts {} recovery {} events {}",
        r["restarts"], r["recovery"], r["manager_events"]
    );
    check_restart(ok, &r, &stderr, 2, 700.0);
    assert_eq!(r["config"]["cluster"]["manager"], "etcd", "{}", r["config"]);
    // Restarted only once etcd removed the dead incarnation (a reconfiguration before
    // the restart), and admitted by a later one.
    let k = kinds(&r);
    let at = r["restarts"][0]["at_ms"].as_f64().unwrap();
    let rc = &r["recovery"];
    let removed = rc["failed_at_ms"].as_f64().unwrap()
        + rc["reconfigured_ms"]
            .as_f64()
            .unwrap_or_else(|| panic!("{rc}"));
    assert!(removed <= at, "{rc}; {}; {k:?}", r["restarts"]);
    // The survivors suspected the dead incarnation before etcd removed it: those
    // suspicions must not revoke the new one (they outlive the restart otherwise).
    assert!(!k.contains(&"revoked".to_string()), "{k:?}");
}

#[test]
fn the_etcd_manager_needs_its_endpoints() {
    let out = Command::new(EXE)
        .args([
            "bench",
            "smallbank",
            "--transport",
            "udp",
            "--manager",
            "etcd",
        ])
        .args(["--duration", "1", "--json", "--no-progress"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("etcd_endpoints"), "{stderr}");
}
