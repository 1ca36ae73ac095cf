//! Issue 18's "the history checkers accept" over node processes: a node killed with
//! SIGKILL mid-run (plainly, in its commit phase, and killed then restarted) leaves
//! its history in its file (the recorder writes through a shared mapping, so the
//! kernel keeps every finished record), the launcher merges it with the others', and
//! the merged history is serializable with no anomaly. It holds the dead node's
//! committed transactions, and the ones whose coordinator died after the log phase
//! began appear with outcome `unknown` (resolved as the simulator resolves them).

mod common;

use ambidex::history::{check, parse_file, Outcome};
use common::EXE;
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

/// One cluster of node processes at a time (see survival.rs).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `ambidex bench smallbank` over `transport` with `args` and `--history`: the report,
/// the merged history's path and the launcher's line about the merge.
fn bench_recorded(name: &str, transport: &str, args: &[&str]) -> (Value, PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("ambidex-kill-history-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("{name}.jsonl"));
    let out = Command::new(EXE)
        .args(["bench", "smallbank", "--scale", "0.05", "--warmup", "0.3"])
        .args(["--duration", "2", "--transport", transport])
        .args(args)
        .arg("--history")
        .arg(&file)
        .args(["--json", "--no-progress"])
        .output()
        .expect("run ambidex");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON report ({e}):\n{stderr}"));
    let merge = stderr
        .lines()
        .find(|l| l.contains("history:"))
        .unwrap_or_else(|| panic!("the launcher did not say how it merged: {stderr}"))
        .to_string();
    (report, file, merge)
}

/// Checks the merged history of a run in which node 2 was killed: serializable, no
/// anomaly, and node 2's transactions in it. Returns how many of node 2's
/// transactions were left of unknown outcome.
fn dead_node_history_checks(name: &str, transport: &str, args: &[&str]) -> u64 {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (r, file, merge) = bench_recorded(name, transport, args);
    assert_eq!(
        r["failures"].as_array().unwrap().len(),
        1,
        "{}",
        r["failures"]
    );
    let recs = parse_file(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let _ = std::fs::remove_file(&file);
    let rep = check(&recs);
    eprintln!(
        "{name}: merge {merge}; {}",
        rep.summary().lines().take(4).collect::<Vec<_>>().join("; ")
    );
    assert!(rep.valid, "{}", rep.summary());
    assert!(rep.anomalies.is_empty(), "{:?}", rep.anomalies);
    // The dead node's committed transactions are there (the kill came 1 s in).
    let committed_by_2 = recs
        .iter()
        .filter(|x| x.node == 2 && x.outcome == Outcome::Committed)
        .count();
    assert!(committed_by_2 > 100, "node 2 committed {committed_by_2}");
    // Every pending record is either replaced by its final one or stands for a
    // transaction of node 2 (the only coordinator that died).
    let decided: std::collections::HashSet<u64> = recs
        .iter()
        .filter(|x| x.outcome != Outcome::Unknown)
        .map(|x| x.id)
        .collect();
    let left: Vec<_> = recs
        .iter()
        .filter(|x| x.outcome == Outcome::Unknown && !decided.contains(&x.id))
        .collect();
    assert!(left.iter().all(|x| x.node == 2), "{:?}", left.first());
    assert_eq!(
        rep.unknown_committed + rep.unknown_aborted,
        left.len() as u64
    );
    left.len() as u64
}

#[test]
fn a_killed_node_history_checks_over_udp() {
    dead_node_history_checks("udp-kill", "udp", &["--kill", "2@1"]);
}

/// Killed while its coordinators are in the commit phase: some transactions had begun
/// their log phase and not finished, so they are in the history of unknown outcome.
#[test]
fn a_commit_phase_kill_history_checks_over_shm() {
    let unknown = dead_node_history_checks("shm-commit-kill", "shm", &["--kill", "2@commit:1"]);
    assert!(unknown > 0, "no transaction of unknown outcome");
}

/// Killed and restarted: the dead incarnation's file and the new one's (`.inc2`) are
/// both merged, and the new incarnation's ids are not the dead one's (ids are versions).
#[test]
fn a_restarted_node_history_checks_over_shm() {
    dead_node_history_checks(
        "shm-restart",
        "shm",
        &["--kill", "2@0.5", "--restart", "2@0.7"],
    );
}
