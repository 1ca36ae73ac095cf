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

/// Committed transactions in the timeline from `ms` on.
pub fn committed_after(r: &Value, ms: f64) -> u64 {
    r["timeline_10ms"]
        .as_array()
        .unwrap()
        .iter()
        .skip((ms / 10.0).ceil() as usize)
        .map(|v| v.as_u64().unwrap())
        .sum()
}

/// Checks a run (3 nodes, SmallBank at scale 0.05) in which node `node` died and was
/// restarted once, not before `not_before_ms`: it exited 0 (`ok`), the node came back
/// as incarnation 2, was a member again, re-replicated into, and committed; the
/// cluster committed after it joined; every node reported; the check passed with every
/// copy compared (node `node`'s included).
pub fn check_restart(ok: bool, r: &Value, stderr: &str, node: u64, not_before_ms: f64) {
    assert!(ok, "{stderr}");
    assert_eq!(r["failures"].as_array().unwrap().len(), 1, "{stderr}");
    let rs = r["restarts"].as_array().unwrap();
    assert_eq!(rs.len(), 1, "{stderr}");
    let rs = &rs[0];
    assert_eq!(
        (rs["node"].as_u64(), rs["incarnation"].as_u64()),
        (Some(node), Some(2)),
        "{rs}"
    );
    let at = rs["at_ms"].as_f64().unwrap();
    assert!(at >= not_before_ms, "{rs}");
    // A member again (a reconfiguration that joined it), after its restart, and
    // re-replicated into: every copy up to date.
    let member = rs["member_ms"]
        .as_f64()
        .unwrap_or_else(|| panic!("never a member again: {rs}; {:?}", kinds(r)));
    assert!(member >= at, "{rs}");
    let rereplicated = rs["rereplicated_ms"]
        .as_f64()
        .unwrap_or_else(|| panic!("never re-replicated: {rs}; {:?}", kinds(r)));
    assert!(rereplicated >= member, "{rs}");
    // Its own workers ran again, and the cluster committed after it joined.
    assert!(rs["committed"].as_u64().unwrap() > 0, "{rs}");
    assert!(committed_after(r, member + 100.0) > 0, "{rs}");
    // It reported: its start-up check read the others' tables too.
    assert_eq!(
        r["remote_tables_verified"].as_array().unwrap().len(),
        3,
        "{}",
        r["remote_tables_verified"]
    );
    // The checks: every account at a primary, and every copy of the final placement
    // equal to its primary: 15000 accounts x 2 tables, each with 2 backups, the
    // restarted node's included (a copy still syncing would not be compared).
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

/// The node pids of the launcher's line "ambidex: started 3 shm node processes
/// (node=pid: 0=11 1=12 2=13)", or `None` for another line.
#[allow(dead_code)]
pub fn node_pids(line: &str) -> Option<Vec<(u16, i32)>> {
    let list = line.split("node=pid: ").nth(1)?;
    list.trim_end_matches(')')
        .split_whitespace()
        .map(|kv| {
            let (n, p) = kv.split_once('=')?;
            Some((n.parse().ok()?, p.parse().ok()?))
        })
        .collect()
}

/// A launcher started with its output piped: stderr lines arrive on `lines` as they are
/// printed (to act on the node pids while the run goes on), the stdout report at the end.
pub struct Launched {
    pub child: std::process::Child,
    pub lines: std::sync::mpsc::Receiver<String>,
    report: std::thread::JoinHandle<std::io::Result<Vec<u8>>>,
    /// The stderr lines read so far.
    pub seen: Vec<String>,
}

impl Launched {
    /// Starts `ambidex bench WORKLOAD --transport shm --scale 0.05 --warmup 0.3 ARGS
    /// --json --no-progress`.
    pub fn bench_shm(workload: &str, args: &[&str]) -> Launched {
        let mut all = vec!["bench", workload, "--transport", "shm", "--scale", "0.05"];
        all.extend(["--warmup", "0.3"]);
        all.extend(args);
        Launched::start(&all)
    }

    /// Starts `ambidex ARGS --json --no-progress`.
    pub fn start(args: &[&str]) -> Launched {
        use std::io::{BufRead, BufReader};
        use std::process::Stdio;
        let mut child = Command::new(EXE)
            .args(args)
            .args(["--json", "--no-progress"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run ambidex");
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // The report comes on stdout at the end; read on a thread of its own.
        let mut stdout = child.stdout.take().unwrap();
        let report = std::thread::spawn(move || {
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut stdout, &mut v).map(|_| v)
        });
        Launched {
            child,
            lines,
            report,
            seen: Vec::new(),
        }
    }

    /// Reads stderr until a line satisfies `f` (within 60 s), returning it.
    pub fn until(&mut self, what: &str, f: impl Fn(&str) -> bool) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let line = self
                .lines
                .recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
                .unwrap_or_else(|_| panic!("never saw {what}: {:?}", self.seen));
            self.seen.push(line.clone());
            if f(&line) {
                return line;
            }
        }
    }

    /// Waits for "... running", returning the node pids the launcher printed first.
    pub fn until_running(&mut self) -> Vec<(u16, i32)> {
        let line = self.until("the node pids", |l| node_pids(l).is_some());
        self.until("the run start", |l| l.contains("running"));
        node_pids(&line).unwrap()
    }

    /// Waits for the exit: (exit success, report, every stderr line).
    pub fn finish(mut self) -> (bool, Value, String) {
        let status = self.child.wait().unwrap();
        let out = self.report.join().unwrap().unwrap();
        while let Ok(l) = self.lines.recv_timeout(std::time::Duration::from_secs(2)) {
            self.seen.push(l);
        }
        let stderr = self.seen.join("\n");
        let r: Value = serde_json::from_slice(&out)
            .unwrap_or_else(|e| panic!("no JSON report ({e}, {status}):\n{stderr}"));
        (status.success(), r, stderr)
    }
}
