//! What the kill tests of node processes share (`survival.rs`, `survival_etcd.rs`).

#![allow(dead_code)]

use serde_json::Value;
use std::process::Command;

pub const EXE: &str = env!("CARGO_BIN_EXE_ambidex");

/// Runs `ambidex bench smallbank --scale 0.05 ARGS --json`: (exit success, report,
/// stderr). The report is printed even when the workload's check fails.
pub fn bench_smallbank(args: &[&str]) -> (bool, Value, String) {
    let out = Command::new(EXE)
        .args(["bench", "smallbank", "--scale", "0.05"])
        .args(args)
        .args(["--json", "--no-progress"])
        .output()
        .expect("run ambidex");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON report ({e}, {}):\n{stderr}", out.status));
    (out.status.success(), report, stderr)
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
