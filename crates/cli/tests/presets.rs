//! Every one-sided preset of DrTM+H Table 4 (`farm`, `drtm-r`, `drtm-h`; `fasst` is
//! the other tests' default) runs every workload in process, over shm node processes
//! and over udp node processes, and passes the workload's checks (SmallBank's
//! invariant, TPC-C's consistency conditions, replicas equal to primaries where the
//! workload compares them) and the history checker, with its one-sided phases really
//! used.

use serde_json::Value;
use std::process::Command;

const EXE: &str = env!("CARGO_BIN_EXE_ambidex");

/// Runs `ambidex bench WORKLOAD --mode MODE ...` with a history, checks the report and
/// the history; returns the report.
fn run(mode: &str, workload: &str, transport: &[&str]) -> Value {
    let history = std::env::temp_dir().join(format!(
        "ambx-preset-{}-{mode}-{workload}-{}.jsonl",
        std::process::id(),
        transport.join("")
    ));
    let h = history.display().to_string();
    let mut args = vec![
        "bench",
        workload,
        "--mode",
        mode,
        "--duration",
        "0.6",
        "--warmup",
        "0.1",
        "--history",
        &h,
        "--json",
        "--no-progress",
    ];
    args.extend_from_slice(transport);
    if workload != "tpcc" && workload != "tpcc-no" {
        args.extend_from_slice(&["--scale", "0.02"]);
    } else {
        // One warehouse per node: its coroutines share it, so the presets' locks and
        // validation really meet conflicts.
        args.extend_from_slice(&["--warehouses", "1"]);
    }
    let out = Command::new(EXE).args(&args).output().expect("run ambidex");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "ambidex {args:?} failed:\n{stderr}");
    let r: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: report is not JSON ({e}):\n{stderr}"));
    let what = format!("{mode} {workload} {transport:?}");
    assert!(r["committed"].as_u64().unwrap() > 20, "{what}: {r}");
    assert_eq!(r["stuck_workers"], 0, "{what}");
    match workload {
        "smallbank" | "tpce" => assert_eq!(r["invariant_ok"], true, "{what}: {}", r["check"]),
        "tpcc" | "tpcc-no" => assert_eq!(r["consistency_ok"], true, "{what}: {}", r["check"]),
        _ => {}
    }
    if let Some(n) = r["check"]["replica_rows_compared"].as_u64() {
        assert!(n > 0, "{what}: no replica compared");
    }
    let report = ambidex::history::check_file(&history).unwrap();
    let _ = std::fs::remove_file(&history);
    assert!(report.valid, "{what}: {}", report.summary());
    // The preset's one-sided phases ran (the start-up check's READs aside).
    let rpc = &r["rpc"];
    assert!(
        rpc["onesided_writes"].as_u64().unwrap() > 0,
        "{what}: no WRITE (log)"
    );
    assert!(
        rpc["onesided_reads"].as_u64().unwrap() > 10,
        "{what}: no READ"
    );
    if mode != "farm" {
        assert!(
            rpc["onesided_cas"].as_u64().unwrap() > 0,
            "{what}: no CAS lock"
        );
    }
    r
}

const WORKLOADS: [&str; 4] = ["smallbank", "tatp", "tpcc", "object-store"];

fn every_workload(mode: &str, transport: &[&str]) {
    for w in WORKLOADS {
        run(mode, w, transport);
    }
}

#[test]
fn farm_in_process() {
    every_workload("farm", &[]);
}

#[test]
fn drtm_r_in_process() {
    every_workload("drtm-r", &[]);
}

#[test]
fn drtm_h_in_process() {
    every_workload("drtm-h", &[]);
}

#[test]
fn farm_over_shm_processes() {
    every_workload("farm", &["--transport", "shm"]);
}

#[test]
fn drtm_r_over_shm_processes() {
    every_workload("drtm-r", &["--transport", "shm"]);
}

#[test]
fn drtm_h_over_shm_processes() {
    every_workload("drtm-h", &["--transport", "shm"]);
}

#[test]
fn farm_over_udp_processes() {
    every_workload("farm", &["--transport", "udp"]);
}

#[test]
fn drtm_r_over_udp_processes() {
    every_workload("drtm-r", &["--transport", "udp"]);
}

#[test]
fn drtm_h_over_udp_processes() {
    every_workload("drtm-h", &["--transport", "udp"]);
}

/// TPC-E's customer position over shm node processes under DrTM+H: each node checks its
/// own rows and its workers' counts (`check_node`), the launcher combines them
/// (`check_combine`), and the volume and feed-snapshot invariants hold.
#[test]
fn tpce_over_shm_processes_under_drtm_h() {
    let r = run("drtm-h", "tpce", &["--transport", "shm"]);
    let c = &r["check"];
    assert!(c["committed_positions"].as_i64().unwrap() > 0, "{c}");
    assert_eq!(c["volume"], c["expected_volume"], "{c}");
    assert_eq!(c["torn"], 0, "{c}");
}
