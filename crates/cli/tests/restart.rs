//! Issue 18 over node processes, the parts beyond a plain kill: `--restart NODE@SECONDS`
//! (the launcher starts a dead node again with the same id and an empty database; it
//! rejoins as a new incarnation, is re-replicated into and runs the workload again),
//! after a `--kill` or after a kill from outside (the test SIGKILLs the node's pid),
//! and `--kill NODE@commit:SECONDS` (the node SIGKILLs itself while its coordinators are
//! in the commit phase). Each run is checked as the survival tests check a kill: exit
//! 0, every account at a surviving primary and replicas equal to their primaries
//! (`check`), and commits after the failure; a restart also that the node is a member
//! again, was re-replicated into (its copies are compared) and committed itself.
//! (`survival_etcd.rs` restarts a node under the etcd manager with the same checks.)

mod common;

use common::{check_restart, committed_after, kinds, Launched};
use serde_json::Value;
use std::time::Duration;

/// One cluster of node processes at a time (see survival.rs).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `ambidex bench WORKLOAD --scale 0.05 --duration D --warmup 0.3 ARGS --json`:
/// (exit success, report, stderr).
fn bench(workload: &str, duration: &str, args: &[&str]) -> (bool, Value, String) {
    let head = ["--warmup", "0.3", "--duration", duration];
    common::bench_workload(workload, &[&head[..], args].concat())
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
    eprintln!(
        "{transport} {mode}: restarts {} recovery {} check {}",
        r["restarts"], r["recovery"], r["check"]
    );
    check_restart(ok, &r, &stderr, 2, 700.0);
    let killed = r["kills"][0]["at_ms"].as_f64().unwrap();
    assert!(r["restarts"][0]["at_ms"].as_f64().unwrap() > killed, "{r}");
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
    // Times count from the death the node reported (its closed output can be seen
    // tens of ms later on a loaded host): detection after it, the first commit on its
    // keys after every member recovered.
    let detected = rc["detected_ms"].as_f64().unwrap_or_else(|| panic!("{rc}"));
    assert!(detected >= 0.0, "{rc}");
    let first = rc["first_commit_ms"]
        .as_f64()
        .unwrap_or_else(|| panic!("{rc}"));
    assert!(first >= rc["recovered_ms"].as_f64().unwrap() - 1.0, "{rc}");
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

/// Node 1 is SIGKILLed by the test itself, by its pid (from the launcher's stderr),
/// about 0.5 s into the run; `--restart 1@1.2`, with no `--kill` of node 1, starts it
/// again, and it rejoins as a node killed by `--kill` does. `--restart 2@0.4` finds
/// node 2 alive: it is not restarted, and the report and stderr say so.
#[test]
fn a_node_killed_from_outside_is_restarted_and_a_live_one_is_not() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut run = Launched::bench_shm(
        "smallbank",
        &[
            "--duration",
            "2.5",
            "--restart",
            "1@1.2",
            "--restart",
            "2@0.4",
        ],
    );
    let pids = run.until_running();
    let victim = pids.iter().find(|&&(n, _)| n == 1).map(|&(_, p)| p);
    let victim = victim.unwrap_or_else(|| panic!("no pid of node 1: {pids:?}"));
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: kill(2) of the node process the launcher reported as node 1's.
    assert_eq!(unsafe { libc::kill(victim, libc::SIGKILL) }, 0);
    let (ok, r, stderr) = run.finish();
    eprintln!(
        "killed from outside: failures {} restarts {} not done {} recovery {}",
        r["failures"], r["restarts"], r["restarts_not_done"], r["recovery"]
    );
    // Not a kill of the launcher's: a death, of the pid the test killed.
    assert_eq!(r["kills"], Value::Array(vec![]), "{stderr}");
    let f = &r["failures"][0];
    assert_eq!(f["node"], 1, "{stderr}");
    assert_eq!(f["pid"], victim, "{stderr}");
    assert!(f["how"].as_str().unwrap().contains("SIGKILL"), "{f}");
    check_restart(ok, &r, &stderr, 1, 1200.0);
    // Node 2 was alive at 0.4 s: a note, not a restart, not a failed run.
    let nd = r["restarts_not_done"].as_array().unwrap();
    assert_eq!(nd.len(), 1, "{stderr}");
    assert_eq!(nd[0]["node"], 2, "{}", nd[0]);
    assert!(
        nd[0]["why"].as_str().unwrap().contains("alive"),
        "{}",
        nd[0]
    );
    assert!(stderr.contains("note: node 2"), "{stderr}");
}

#[test]
fn bad_restarts_are_clear_errors() {
    for (args, says) in [
        (
            vec![
                "--kill",
                "2@0.2",
                "--restart",
                "2@0.4",
                "--restart",
                "2@0.6",
            ],
            "again before being killed again",
        ),
        (
            vec!["--restart", "2@0.4", "--restart", "2@0.4"],
            "the same restart twice",
        ),
        (vec!["--restart", "3@0.5"], "the cluster has nodes 0..3"),
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
            "through a configuration manager",
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
