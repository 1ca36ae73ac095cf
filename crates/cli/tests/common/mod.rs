//! What the kill tests of node processes share (`survival.rs`, `survival_etcd.rs`,
//! `restart.rs`, `kill_history.rs`).

#![allow(dead_code)]

use serde_json::Value;
use std::process::Command;

pub const EXE: &str = env!("CARGO_BIN_EXE_ambidex");

/// Runs `ambidex bench WORKLOAD --scale 0.05 ARGS --json`: (exit success, report,
/// stderr). The report is printed even when the workload's check fails.
pub fn bench_workload(workload: &str, args: &[&str]) -> (bool, Value, String) {
    let out = Command::new(EXE)
        .args(["bench", workload, "--scale", "0.05"])
        .args(args)
        .args(["--json", "--no-progress"])
        .output()
        .expect("run ambidex");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON report ({e}, {}):\n{stderr}", out.status));
    (out.status.success(), report, stderr)
}

/// [`bench_workload`] of SmallBank.
pub fn bench_smallbank(args: &[&str]) -> (bool, Value, String) {
    bench_workload("smallbank", args)
}

/// `ambidex bench smallbank --transport shm --duration 1 ARGS` is refused with an
/// error that contains `says`.
pub fn assert_refused(args: &[&str], says: &str) {
    let out = Command::new(EXE)
        .args([
            "bench",
            "smallbank",
            "--transport",
            "shm",
            "--duration",
            "1",
        ])
        .args(args)
        .args(["--json", "--no-progress"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?}");
    assert!(stderr.contains(says), "{args:?}: {stderr}");
}

/// The kinds of the report's manager events, in order.
pub fn kinds(r: &Value) -> Vec<String> {
    r["manager_events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| match &e["what"] {
            Value::String(s) => s.clone(),
            Value::Object(m) => m.keys().next().unwrap().clone(),
            other => panic!("event {other}"),
        })
        .collect()
}
