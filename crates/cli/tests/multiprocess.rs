//! Multi-process runs: `ambidex bench W --transport shm|udp` starts one `ambidex node`
//! process per node, drives them through the control protocol and combines their
//! reports (docs/cluster.md). Checks that invariants hold across processes, that the
//! report keeps the in-process shape, that a node killed mid-run is reported (not
//! hidden) without hanging, and that bad input to `ambidex node` is a clear error.

mod common;

use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_ambidex");

/// Runs `ambidex ARGS --json` and returns (report, stderr); panics with stderr on failure.
fn bench(args: &[&str]) -> (Value, String) {
    let out = Command::new(EXE)
        .args(args)
        .args(["--json", "--no-progress"])
        .output()
        .expect("run ambidex");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        out.status.success(),
        "ambidex {args:?} failed ({}):\n{stderr}",
        out.status
    );
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("report is not JSON ({e}):\n{stderr}"));
    (report, stderr)
}

fn shm_dirs_of(pid: u32) -> Vec<String> {
    let prefix = format!("ambidex-{pid}-");
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().to_string())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

fn common_checks(r: &Value, transport: &str) {
    assert_eq!(r["transport"], transport);
    assert_eq!(r["nodes"], 3);
    assert_eq!(r["replication"], 3);
    assert!(r["committed"].as_u64().unwrap() > 100, "{r}");
    assert_eq!(r["stuck_workers"], 0);
    assert!(r["cpu_seconds"].as_f64().unwrap() > 0.0);
    assert!(r["max_rss_bytes"].as_u64().unwrap() > 1 << 20);
    assert!(r["latency_us"]["p50"].as_f64().unwrap() > 0.0);
    assert!(r["latency_us"]["p99"].as_f64() >= r["latency_us"]["p50"].as_f64());
    // Every backup row was compared with its primary's.
    assert!(
        r["check"]["replica_rows_compared"].as_u64().unwrap() > 0,
        "{r}"
    );
    let per_type: u64 = r["per_type"]
        .as_object()
        .unwrap()
        .values()
        .map(|t| t["committed"].as_u64().unwrap())
        .sum();
    assert_eq!(per_type, r["committed"].as_u64().unwrap());
    assert!(r["rpc"]["rpcs_completed"].as_u64().unwrap() > 0);
    assert!(r["transport_counters"]["tx_datagrams"].as_u64().unwrap() > 0);
    policy_checks(r);
}

/// The policy, one-sided and location-cache parts of a report: every field there, and
/// the one-sided counts summed from every node's `rpc` counters.
fn policy_checks(r: &Value) {
    for k in [
        "execute",
        "lock",
        "validate",
        "log",
        "commit",
        "passive_ack",
    ] {
        assert!(r["policy"][k].is_string(), "{k}: {}", r["policy"]);
    }
    for (k, rpc) in [
        ("reads", "onesided_reads"),
        ("writes", "onesided_writes"),
        ("cas", "onesided_cas"),
        ("faa", "onesided_faa"),
        ("failed", "onesided_failed"),
    ] {
        assert_eq!(r["one_sided"][k], r["rpc"][rpc], "{k}: {}", r["one_sided"]);
    }
    // Every node's start-up check READ the other nodes' tables one-sided.
    assert!(
        r["one_sided"]["reads"].as_u64().unwrap() > 0,
        "{}",
        r["one_sided"]
    );
    for k in ["hits", "misses", "stale"] {
        assert_eq!(
            r["location_cache"][k], r["txn_layer"]["location_cache"][k],
            "{k}: {}",
            r["location_cache"]
        );
    }
}

/// The key paths of a report (object keys, recursively), for shape comparisons.
fn shape(v: &Value, prefix: &str, out: &mut Vec<String>) {
    if let Value::Object(m) = v {
        for (k, x) in m {
            let p = format!("{prefix}/{k}");
            // Free-form or content-dependent parts (the config echo names where the nodes
            // met only for node processes).
            if !["check", "per_type", "aborts_by_reason", "aborts", "config"].contains(&k.as_str())
            {
                shape(x, &p, out);
            }
            out.push(p);
        }
    }
}

#[test]
fn smallbank_over_shm_node_processes_keeps_the_invariant_and_the_report_shape() {
    let history = std::env::temp_dir().join(format!("ambx-mp-{}.jsonl", std::process::id()));
    let h = history.display().to_string();
    let args = [
        "bench",
        "smallbank",
        "--transport",
        "shm",
        "--replication",
        "3",
        "--scale",
        "0.05",
        "--duration",
        "1.5",
        "--warmup",
        "0.3",
        "--history",
        &h,
    ];
    let (r, stderr) = bench(&args);
    common_checks(&r, "shm");
    assert_eq!(r["invariant_ok"], true, "{}", r["check"]);
    // Each node process read the other two nodes' 2 SmallBank tables one-sided through
    // the descriptors the launcher exchanged (over shm, by mapping the other
    // processes' region files).
    assert_eq!(
        r["remote_tables_verified"],
        serde_json::json!([4, 4, 4]),
        "{}",
        r["remote_tables_verified"]
    );
    assert!(r["check"]["committed_delta_cents"].as_i64().unwrap() != 0);
    assert!(stderr.contains("started 3 shm node processes"), "{stderr}");
    // The nodes' histories were merged into one file, and it is serializable.
    let report = ambidex::history::check_file(&history).unwrap();
    let _ = std::fs::remove_file(&history);
    assert!(report.valid, "{}", report.summary());
    assert!(report.committed >= r["committed"].as_u64().unwrap());
    for n in 0..3 {
        assert!(!std::path::Path::new(&format!("{h}.node{n}")).exists());
    }
    // Same report shape as the in-process run.
    let (inproc, _) = bench(&[
        "bench",
        "smallbank",
        "--transport",
        "shm",
        "--in-process",
        "--scale",
        "0.05",
        "--duration",
        "0.5",
        "--warmup",
        "0.1",
    ]);
    assert_eq!(inproc["invariant_ok"], true);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    shape(&r, "", &mut a);
    shape(&inproc, "", &mut b);
    a.sort();
    b.sort();
    assert_eq!(a, b, "multi-process and in-process reports differ in shape");
}

#[test]
fn tpcc_over_shm_node_processes_keeps_consistency() {
    let (r, _) = bench(&[
        "bench",
        "tpcc",
        "--transport",
        "shm",
        "--warehouses",
        "1",
        "--replication",
        "3",
        "--duration",
        "1.5",
        "--warmup",
        "0.3",
    ]);
    common_checks(&r, "shm");
    assert_eq!(r["consistency_ok"], true, "{}", r["check"]);
    assert_eq!(r["check"]["warehouses"], 3);
    assert_eq!(r["check"]["districts"], 30);
    assert!(r["per_type"]["new_order"]["committed"].as_u64().unwrap() > 0);
}

#[test]
fn smallbank_over_udp_loopback_node_processes() {
    let (r, stderr) = bench(&[
        "bench",
        "smallbank",
        "--transport",
        "udp",
        "--scale",
        "0.05",
        "--duration",
        "1.5",
        "--warmup",
        "0.3",
        // The transport's own fault injector, through the node config.
        "--fault-reorder",
        "0.01",
        "--fault-delay",
        "0.01",
        "--fault-duplicate",
        "0.005",
    ]);
    common_checks(&r, "udp");
    assert_eq!(r["invariant_ok"], true, "{}", r["check"]);
    assert!(stderr.contains("started 3 udp node processes"), "{stderr}");
    let c = &r["transport_counters"];
    assert!(c["fault_reordered"].as_u64().unwrap() > 0, "{c}");
    assert!(c["fault_delayed"].as_u64().unwrap() > 0, "{c}");
    assert!(c["fault_duplicated"].as_u64().unwrap() > 0, "{c}");
}

#[test]
fn tatp_over_udp_reports_found_rates() {
    let (r, _) = bench(&[
        "bench",
        "tatp",
        "--transport",
        "udp",
        "--scale",
        "0.01",
        "--duration",
        "1",
        "--warmup",
        "0.2",
    ]);
    let t = &r["per_type"]["get_subscriber_data"];
    assert!(t["committed"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(t["found_rate"], 1.0);
    assert_eq!(t["expected_found_rate"], 1.0);
}

/// A per-phase flag given to the launcher reaches every node process (each node's
/// `ready` event and report say the policy it runs, and the launcher refuses one that
/// is not the cluster's); a node started with another policy, here by a wrapper that
/// edits node 1's copy of the configuration, is refused before anything runs. Passive
/// ACK is the choice used because the RPC phases of this build accept it.
#[test]
fn per_phase_flags_reach_node_processes_and_a_mismatch_is_refused() {
    let run = [
        "bench",
        "smallbank",
        "--transport",
        "shm",
        "--scale",
        "0.01",
        "--duration",
        "0.5",
        "--warmup",
        "0.1",
    ];
    let (r, _) = bench(&[&run[..], &["--passive-ack", "on"]].concat());
    assert_eq!(r["invariant_ok"], true, "{}", r["check"]);
    assert_eq!(r["policy"]["passive_ack"], "on", "{}", r["policy"]);
    assert_eq!(r["policy"]["execute"], "rpc", "{}", r["policy"]);
    assert!(r["policy"].get("preset").is_none(), "{}", r["policy"]);
    assert_eq!(r["config"]["txn"]["passive_ack"], "on");
    policy_checks(&r);

    // Node 1 is given a configuration with passive ACK on; the cluster runs fasst.
    let dir = std::env::temp_dir().join(format!("ambx-mp-policy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let wrap = dir.join("wrap.sh");
    std::fs::write(
        &wrap,
        "#!/bin/sh\n\
         # wrap.sh NODE EXE node --config FILE ARGS...: node 1 gets an edited copy of FILE.\n\
         n=\"$1\"; shift\n\
         if [ \"$n\" = 1 ]; then\n\
           exe=\"$1\"; cmd=\"$2\"; cfg=\"$4\"; shift 4\n\
           sed 's/\"mode\": \"fasst\"/\"mode\": \"fasst\", \"passive_ack\": \"on\"/' \"$cfg\" > \"$cfg.node1.json\"\n\
           exec \"$exe\" \"$cmd\" --config \"$cfg.node1.json\" \"$@\"\n\
         fi\n\
         exec \"$@\"\n",
    )
    .unwrap();
    let wrapper = format!("sh {} {{node}}", wrap.display());
    let t0 = Instant::now();
    let child = Command::new(EXE)
        .args(run)
        .args(["--node-wrapper", &wrapper, "--json", "--no-progress"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let launcher = child.id();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("node 1 runs transaction policy no preset: execute rpc")
            && stderr.contains("passive-ack on")
            && stderr.contains("the cluster's is fasst"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(t0.elapsed() < Duration::from_secs(60));
    assert!(
        shm_dirs_of(launcher).is_empty(),
        "the run's shm directory is left"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Kills node 1 with SIGKILL while the run is measuring, without a manager: the
/// launcher must fail with a message naming the node and the signal, promptly, and
/// leave no node process or shm directory behind. (With the manager on, the default,
/// the run goes on without the node: tests/survival.rs.)
#[test]
fn a_node_killed_mid_run_is_reported_and_nothing_hangs() {
    let mut child = Command::new(EXE)
        .args([
            "bench",
            "smallbank",
            "--manager",
            "none",
            "--transport",
            "shm",
            "--scale",
            "0.05",
            "--duration",
            "60",
            "--warmup",
            "0.2",
            "--json",
            "--no-progress",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let launcher = child.id();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    let mut pids: Vec<(u16, i32)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    // "ambidex: started 3 shm node processes (node=pid: 0=11 1=12 2=13)", then "running".
    loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("launcher never got running: {lines:?}"));
        if let Some(p) = common::node_pids(&line) {
            pids = p;
        }
        let running = line.contains("running");
        lines.push(line);
        if running {
            break;
        }
    }
    assert_eq!(pids.len(), 3, "{lines:?}");
    assert_eq!(shm_dirs_of(launcher).len(), 1, "the run's shm directory");
    std::thread::sleep(Duration::from_millis(700));
    let victim = pids[1].1;
    assert_eq!(unsafe { libc::kill(victim, libc::SIGKILL) }, 0);
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("the launcher hung after node 1 was killed: {lines:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    while let Ok(l) = rx.recv_timeout(Duration::from_secs(2)) {
        lines.push(l);
    }
    let all = lines.join("\n");
    assert!(!status.success(), "{all}");
    let msg = lines
        .iter()
        .find(|l| l.contains("error"))
        .unwrap_or_else(|| panic!("no error line: {all}"));
    assert!(msg.contains("node 1"), "{msg}");
    assert!(msg.contains(&format!("pid {victim}")), "{msg}");
    assert!(msg.contains("signal 9") && msg.contains("SIGKILL"), "{msg}");
    eprintln!(
        "launcher exited {status} {:.2} s after the kill: {msg}",
        t0.elapsed().as_secs_f64()
    );
    // Every other node was stopped and reaped; the shm directory is gone.
    for (n, pid) in &pids {
        let alive = unsafe { libc::kill(*pid, 0) } == 0;
        assert!(!alive, "node {n} (pid {pid}) is still running");
    }
    assert!(
        shm_dirs_of(launcher).is_empty(),
        "shm directory left behind"
    );
}

fn node_config(dir: &std::path::Path, text: &str) -> std::path::PathBuf {
    let p = dir.join("cluster.json");
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn bad_cluster_files_and_commands_are_clear_errors() {
    let dir = std::env::temp_dir().join(format!("ambx-mp-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let run_node = |cfg: &std::path::Path, stdin: &str| {
        let mut c = Command::new(EXE)
            .args(["node", "--config", cfg.to_str().unwrap(), "--node", "0"])
            .args(["--no-progress"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut w = c.stdin.take().unwrap();
        let _ = w.write_all(stdin.as_bytes());
        drop(w);
        let out = c.wait_with_output().unwrap();
        (
            out.status,
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    for (text, want) in [
        ("{ not json", "config file"),
        ("{\"cluster\": {\"transport\": \"udp\", \"nodes\": 3}}", "udp_addrs"),
        ("{\"cluster\": {\"transport\": \"local\"}}", "a node process needs"),
        (
            "{\"cluster\": {\"transport\": \"tcp\", \"nodes\": 3}, \"run\": {\"workload\": \"smallbank\"}}",
            "unknown variant",
        ),
        (
            "{\"cluster\": {\"transport\": \"udp\", \"nodes\": 3, \"udp_addrs\": [\"127.0.0.1:1\"]}, \"run\": {\"workload\": \"smallbank\"}}",
            "1 addresses for 3 nodes",
        ),
        (
            "{\"cluster\": {\"transport\": \"udp\", \"nodes\": 1, \"replication\": 1, \"udp_addrs\": [\"127.0.0.1:65535\"]}, \"rpc\": {\"give_up_ms\": 500, \"rto_min_ms\": -1}}",
            "rto_min_ms",
        ),
        (
            "{\"cluster\": {\"transport\": \"udp\", \"nodes\": 1, \"replication\": 1, \"udp_addrs\": [\"127.0.0.1:9\"]}, \"fault\": {\"drop\": 2}}",
            "fault",
        ),
        (
            "{\"cluster\": {\"transport\": \"udp\", \"nodes\": 1, \"replication\": 1, \"udp_addrs\": [\"127.0.0.1:9\"]}, \"run\": {\"workload\": \"bank\"}}",
            "bank",
        ),
        (
            "{\"cluster\": {\"transport\": \"udp\", \"nodes\": 1, \"replication\": 1, \"udp_addrs\": [\"127.0.0.1:9\"]}, \"txn\": {\"mode\": \"farm-ish\"}}",
            "\"farm-ish\": no such preset",
        ),
        (
            "{\"cluster\": {\"transport\": \"udp\", \"nodes\": 1, \"replication\": 1, \"udp_addrs\": [\"127.0.0.1:9\"]}, \"txn\": {\"lock\": \"mutex\"}}",
            "txn.lock (--lock) \"mutex\": no such choice; the choices are: rpc, cas",
        ),
        (
            "{\"cluster\": {\"transport\": \"udp\", \"nodes\": 1, \"extra\": 1}, \"run\": {\"workload\": \"smallbank\"}}",
            "unknown field",
        ),
    ] {
        let cfg = node_config(&dir, text);
        let (st, stdout, stderr) = run_node(&cfg, "");
        assert!(!st.success(), "{text}");
        assert!(stderr.contains(want), "{text}: want {want:?} in {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        // The error also goes to the launcher, as an event.
        let ev: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
        assert_eq!(ev["event"], "error", "{stdout}");
    }
    // A valid one-node cluster that is sent a bad command.
    let port = 20000 + (std::process::id() % 20000) as u16;
    let cfg = node_config(
        &dir,
        &format!(
            "{{\"cluster\": {{\"transport\": \"udp\", \"nodes\": 1, \"replication\": 1, \"udp_addrs\": [\"127.0.0.1:{port}\"]}}, \
             \"run\": {{\"workload\": \"smallbank\", \"scale\": 0.001}}}}"
        ),
    );
    let (st, stdout, stderr) = run_node(&cfg, "{\"cmd\":\"launch\"}\n");
    assert_eq!(st.code(), Some(1), "{stderr}");
    let events: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events[0]["event"], "ready", "{stdout}");
    assert_eq!(events[1]["event"], "error", "{stdout}");
    assert!(events[1]["message"].as_str().unwrap().contains("launch"));
    // Commands out of order are refused.
    let (st, stdout, _) = run_node(&cfg, "stop\n");
    assert_eq!(st.code(), Some(1));
    assert!(stdout.contains("not valid while loaded"), "{stdout}");
    // A node refuses to start without the catalog.
    let (st, stdout, _) = run_node(&cfg, "start\n");
    assert_eq!(st.code(), Some(1));
    assert!(stdout.contains("no catalog"), "{stdout}");
    // End of input before the report stops the node with status 3.
    let mut n = HandNode::spawn(&cfg, 0);
    let cat = catalog_of(&[n.ready.clone()]);
    n.send(&catalog_cmd(&cat));
    n.send("start\nmeasure\n");
    let (st, stdout, stderr) = n.end();
    assert_eq!(st.code(), Some(3), "{stdout}\n{stderr}");
    // A person can drive a node by hand: the whole protocol on a one-node cluster.
    let mut n = HandNode::spawn(&cfg, 0);
    let cat = catalog_of(&[n.ready.clone()]);
    n.send(&catalog_cmd(&cat));
    n.send("start\nmeasure\nstop\nfinish\n");
    let (st, stdout, stderr) = n.end();
    assert!(st.success(), "{stdout}\n{stderr}");
    let last: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(last["event"], "report", "{stdout}");
    assert_eq!(last["report"]["node"], 0);
    assert_eq!(last["report"]["remote_tables_verified"], 0);
    assert!(last["report"]["check"]["initial_cents"].as_i64().unwrap() > 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// An `ambidex node` process driven by hand: spawned, its `ready` read.
struct HandNode {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    out: BufReader<std::process::ChildStdout>,
    ready: Value,
}

impl HandNode {
    fn spawn(cfg: &std::path::Path, node: u16) -> HandNode {
        let mut child = Command::new(EXE)
            .args(["node", "--config", cfg.to_str().unwrap()])
            .args(["--node", &node.to_string(), "--no-progress"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let ready: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
        assert_eq!(ready["event"], "ready", "node {node}: {line}");
        HandNode {
            child,
            stdin,
            out,
            ready,
        }
    }

    fn send(&mut self, text: &str) {
        let w = self.stdin.as_mut().unwrap();
        w.write_all(text.as_bytes()).unwrap();
        w.flush().unwrap();
    }

    /// Closes its input and returns (status, the rest of stdout, stderr).
    fn end(mut self) -> (std::process::ExitStatus, String, String) {
        drop(self.stdin.take());
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut self.out, &mut rest);
        let out = self.child.wait_with_output().unwrap();
        (
            out.status,
            rest,
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    }
}

/// The catalog of the nodes whose `ready` events are `readies` (in node order), as the
/// launcher builds it.
fn catalog_of(readies: &[Value]) -> Value {
    serde_json::json!({
        "nodes": readies.len(),
        "tables": readies.iter().map(|r| r["tables"].clone()).collect::<Vec<_>>(),
        "logs": readies.iter().map(|r| r["log_region"].clone()).collect::<Vec<_>>(),
    })
}

fn catalog_cmd(cat: &Value) -> String {
    format!(
        "{}\n",
        serde_json::json!({ "cmd": "catalog", "catalog": cat })
    )
}

/// Two node processes over udp driven by hand; node 0 is given a catalog whose key of
/// node 1's table 2 is stale. Its start-up check READs that table one-sided across the
/// process boundary, gets the target's `bad_key` error completion, and node 0 fails
/// with an error naming the table; node 1, given the right catalog, verifies node 0's
/// tables.
#[test]
fn a_stale_descriptor_fails_the_start_up_check_across_processes() {
    let dir = std::env::temp_dir().join(format!("ambx-mp-stale-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let port = 20000 + ((std::process::id() + 7919) % 20000) as u16;
    let cfg = node_config(
        &dir,
        &format!(
            "{{\"cluster\": {{\"transport\": \"udp\", \"nodes\": 2, \"replication\": 2, \
             \"udp_addrs\": [\"127.0.0.1:{port}\", \"127.0.0.1:{}\"]}}, \
             \"run\": {{\"workload\": \"smallbank\", \"scale\": 0.001}}}}",
            port + 100
        ),
    );
    let mut n0 = HandNode::spawn(&cfg, 0);
    let mut n1 = HandNode::spawn(&cfg, 1);
    let good = catalog_of(&[n0.ready.clone(), n1.ready.clone()]);
    assert_eq!(good["tables"][1].as_array().unwrap().len(), 2);
    let mut stale = good.clone();
    assert_eq!(stale["tables"][1][1]["table_id"], 2);
    let key = &mut stale["tables"][1][1]["region"]["key"];
    *key = (key.as_u64().unwrap() ^ 0x5a5a).into();
    n1.send(&catalog_cmd(&good));
    n1.send("start\n");
    n0.send(&catalog_cmd(&stale));
    n0.send("start\n");
    // Node 0 reports the failed check as an error event and exits 1.
    let mut line = String::new();
    let mut events = Vec::new();
    while n0.out.read_line(&mut line).unwrap_or(0) > 0 {
        events.push(line.trim().to_string());
        if line.contains("\"error\"") {
            break;
        }
        line.clear();
    }
    let (st, _, stderr) = n0.end();
    assert_eq!(st.code(), Some(1), "{events:?}\n{stderr}");
    let ev: Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert_eq!(ev["event"], "error", "{events:?}");
    let msg = ev["message"].as_str().unwrap();
    assert!(msg.contains("bad_key"), "{msg}");
    assert!(msg.contains("node 1's table 2"), "{msg}");
    let _ = n1.child.kill();
    let _ = n1.end();
    let _ = std::fs::remove_dir_all(&dir);
}
