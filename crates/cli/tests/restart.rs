//! Issue 18 over node processes, the parts beyond a plain kill: `--restart NODE@SECONDS`
//! (the launcher starts a killed node again with the same id and an empty database; it
//! rejoins as a new incarnation, is re-replicated into and runs the workload again) and
//! `--kill NODE@commit:SECONDS` (the node SIGKILLs itself while its coordinators are in
//! the commit phase). Each run is checked as the survival tests check a kill: exit 0,
//! every account at a surviving primary and replicas equal to their primaries
//! (`check`), and commits after the failure; a restart also that the node is a member
//! again, was re-replicated into (its copies are compared) and committed itself.

mod common;

use common::kinds;
use serde_json::Value;

/// One cluster of node processes at a time (see survival.rs).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `ambidex bench WORKLOAD --scale 0.05 --duration D --warmup 0.3 ARGS --json`:
/// (exit success, report, stderr).
fn bench(workload: &str, duration: &str, args: &[&str]) -> (bool, Value, String) {
    let head = ["--warmup", "0.3", "--duration", duration];
    common::bench_workload(workload, &[&head[..], args].concat())
}

/// Committed transactions in the timeline from `ms` on.
fn committed_after(r: &Value, ms: f64) -> u64 {
    r["timeline_10ms"]
        .as_array()
        .unwrap()
        .iter()
        .skip((ms / 10.0).ceil() as usize)
        .map(|v| v.as_u64().unwrap())
        .sum()
}

/// Node 2 of 3 is killed 0.5 s in and restarted at 0.7 s under a one-sided preset
/// (its new regions must reach the survivors' catalogs: their log WRITEs and reads go
/// to it once it is a member).
fn kill_and_restart(transport: &str, mode: &str) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (ok, r, stderr) = bench(
        "smallbank",
        "2.5",
        &[
            "--transport",
            transport,
            "--mode",
            mode,
            "--kill",
            "2@0.5",
            "--restart",
            "2@0.7",
        ],
    );
    assert!(ok, "{stderr}");
    eprintln!(
        "{transport} {mode}: restarts {} recovery {} check {}",
        r["restarts"], r["recovery"], r["check"]
    );
    assert_eq!(r["failures"].as_array().unwrap().len(), 1, "{stderr}");
    let rs = r["restarts"].as_array().unwrap();
    assert_eq!(rs.len(), 1, "{stderr}");
    let rs = &rs[0];
    assert_eq!(
        (rs["node"].as_u64(), rs["incarnation"].as_u64()),
        (Some(2), Some(2))
    );
    let at = rs["at_ms"].as_f64().unwrap();
    let killed = r["kills"][0]["at_ms"].as_f64().unwrap();
    assert!(at >= 700.0 && at > killed, "{rs}");
    // A member again (a reconfiguration that joined it), after its restart, and
    // re-replicated into: every copy up to date.
    let member = rs["member_ms"]
        .as_f64()
        .unwrap_or_else(|| panic!("never a member again: {rs}; {:?}", kinds(&r)));
    assert!(member >= at, "{rs}");
    let rereplicated = rs["rereplicated_ms"]
        .as_f64()
        .unwrap_or_else(|| panic!("never re-replicated: {rs}; {:?}", kinds(&r)));
    assert!(rereplicated >= member, "{rs}");
    // Its own workers ran again, and the cluster committed after it joined.
    assert!(rs["committed"].as_u64().unwrap() > 0, "{rs}");
    assert!(committed_after(&r, member + 100.0) > 0, "{rs}");
    // It reported: its start-up check read the others' tables too.
    assert_eq!(
        r["remote_tables_verified"].as_array().unwrap().len(),
        3,
        "{}",
        r["remote_tables_verified"]
    );
    // The checks: every account at a primary, and every copy of the final placement
    // equal to its primary: 15000 accounts x 2 tables, each with 2 backups, node 2's
    // included (a copy still syncing would not be compared).
    let check = &r["check"];
    assert!(check.get("violation").is_none(), "{check}");
    assert_eq!(check["balance_checked"], false, "{check}");
    assert_eq!(check["replica_rows_compared"], 60000, "{check}");
    assert!(
        r["recovery"]["first_commit_ms"].as_f64().is_some(),
        "{}",
        r["recovery"]
    );
}

#[test]
fn a_restarted_node_rejoins_over_udp_under_farm() {
    kill_and_restart("udp", "farm");
}

#[test]
fn a_restarted_node_rejoins_over_shm_under_drtm_h() {
    kill_and_restart("shm", "drtm-h");
}

/// Node `node` is told to die 1 s in, at a moment its coordinators are in the commit
/// phase; the others go on and pass the checks.
fn commit_phase_kill(workload: &str, transport: &str, node: &str) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let kill = format!("{node}@commit:1");
    let (ok, r, stderr) = bench(workload, "2", &["--transport", transport, "--kill", &kill]);
    assert!(ok, "{stderr}");
    eprintln!(
        "{workload} {transport}: kills {} recovery {} check {}",
        r["kills"], r["recovery"], r["check"]
    );
    let kills = r["kills"].as_array().unwrap();
    assert_eq!(kills.len(), 1, "{stderr}");
    assert_eq!(
        kills[0]["node"].as_u64().map(|n| n.to_string()).as_deref(),
        Some(node)
    );
    // It died in the window, not at the give-up.
    let in_commit = kills[0]["in_commit"]
        .as_u64()
        .unwrap_or_else(|| panic!("{}", kills[0]));
    assert!(in_commit >= 1, "{}", kills[0]);
    let failures = r["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{stderr}");
    assert!(
        failures[0]["how"].as_str().unwrap().contains("SIGKILL"),
        "{}",
        failures[0]
    );
    let at = kills[0]["at_ms"].as_f64().unwrap();
    assert!(at >= 1000.0, "{}", kills[0]);
    let rc = &r["recovery"];
    assert!(
        rc["recovered_ms"].as_f64().is_some(),
        "{rc}; {:?}",
        kinds(&r)
    );
    assert!(rc["first_commit_ms"].as_f64().is_some(), "{rc}");
    assert!(committed_after(&r, at + 200.0) > 0);
    // A replica difference, or (SmallBank) an account missing at the primaries, would
    // be a violation and a failed exit.
    let check = &r["check"];
    assert!(check.get("violation").is_none(), "{check}");
    if workload == "smallbank" {
        assert_eq!(check["balance_checked"], false, "{check}");
        assert!(
            check["replica_rows_compared"].as_u64().unwrap() > 0,
            "{check}"
        );
    }
}

#[test]
fn a_commit_phase_kill_is_survived_smallbank_over_udp() {
    commit_phase_kill("smallbank", "udp", "2");
}

#[test]
fn a_commit_phase_kill_is_survived_tatp_over_shm() {
    commit_phase_kill("tatp", "shm", "1");
}

#[test]
fn bad_restarts_are_clear_errors() {
    for (args, says) in [
        (vec!["--restart", "2@1"], "only a node killed before"),
        (
            vec!["--kill", "2@1", "--restart", "2@0.5"],
            "only a node killed before",
        ),
        (
            vec!["--kill", "1@0.5", "--restart", "2@1"],
            "only a node killed before",
        ),
        (
            vec!["--kill", "2@0.5", "--restart", "2@9"],
            "before the run ends",
        ),
        (
            vec!["--kill", "2@0.5", "--restart", "2@commit:1"],
            "NODE@SECONDS",
        ),
        (
            vec!["--kill", "2@0.5", "--restart", "2@1", "--manager", "none"],
            "embedded manager",
        ),
        (vec!["--kill", "2@commit:x"], "seconds"),
        (vec!["--kill", "2@commit:1.5"], "must leave 1.2 s"),
        (
            vec!["--kill", "2@commit:1", "--in-process"],
            "node processes",
        ),
    ] {
        common::assert_refused(&args, says);
    }
}
