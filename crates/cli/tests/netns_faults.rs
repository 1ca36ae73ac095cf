//! A real-network fault test: three network namespaces joined by veth pairs to a bridge
//! (in a fourth namespace), one `ambidex node` process per namespace over the udp
//! transport, SmallBank for a bounded time under
//!
//! - random loss of 0.1% and 1% of incoming UDP datagrams on every node (iptables
//!   `-m statistic --mode random` DROP rules inside the namespaces: this kernel has no
//!   netem),
//! - a scripted partition of node 2 (DROP everything in and out of its namespace for
//!   1.5 s, then remove the rules), and
//! - the transport's own fault injector (delay, reordering, duplication),
//!
//! checking after every run the SmallBank total, the replicas against their primaries,
//! and the recorded history: serializable, every committed transaction id exactly once,
//! every read of a committed version (so no committed transaction was lost or applied
//! twice). It prints the throughput of each run relative to the run without loss, and
//! checks that 1% loss keeps at least half of it (a lost datagram costs about a round
//! trip, not a fixed timeout).
//!
//! Needs root, `ip` (iproute2) and `iptables`; without them it prints why and passes.
//! Every namespace (and with it every veth, bridge and rule) is deleted at the end, also
//! when the test fails (a drop guard).

use serde_json::Value;
use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_ambidex");
const NODES: u16 = 3;
const PORT: u16 = 7000;

/// Writes past the test harness's output capture, so the figures show in CI logs.
fn say(s: &str) {
    let mut e = std::io::stderr();
    let _ = writeln!(e, "{s}");
}

fn have(cmd: &str) -> bool {
    Command::new(cmd)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
        || Command::new(cmd)
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok()
}

fn run(args: &[&str]) -> Result<String, String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).to_string())
}

/// The namespaces of this test; dropping it deletes them all (veths, the bridge and
/// every iptables rule live inside them and go with them).
struct Netns {
    prefix: String,
    made: Vec<String>,
}

impl Netns {
    fn node(&self, n: u16) -> String {
        format!("{}-n{n}", self.prefix)
    }

    fn add(&mut self, name: &str) -> Result<(), String> {
        run(&["ip", "netns", "add", name])?;
        self.made.push(name.to_string());
        Ok(())
    }

    fn exec(&self, ns: &str, args: &[&str]) -> Result<String, String> {
        let mut v = vec!["ip", "netns", "exec", ns];
        v.extend_from_slice(args);
        run(&v)
    }

    /// Three node namespaces on one bridge: node i is 10.213.S.(i+1)/24 on its eth0.
    fn build(subnet: u8) -> Result<Netns, String> {
        let mut ns = Netns {
            prefix: format!("ambx-{}", std::process::id()),
            made: Vec::new(),
        };
        let br = format!("{}-br", ns.prefix);
        ns.add(&br)?;
        ns.exec(&br, &["ip", "link", "add", "br0", "type", "bridge"])?;
        ns.exec(&br, &["ip", "link", "set", "br0", "up"])?;
        for i in 0..NODES {
            let node = ns.node(i);
            ns.add(&node)?;
            let port = format!("p{i}");
            // Both ends are created inside their namespaces: nothing appears in the
            // host's namespace, even briefly.
            run(&[
                "ip", "link", "add", "name", "eth0", "netns", &node, "type", "veth", "peer",
                "name", &port, "netns", &br,
            ])?;
            ns.exec(&br, &["ip", "link", "set", &port, "master", "br0"])?;
            ns.exec(&br, &["ip", "link", "set", &port, "up"])?;
            let addr = format!("10.213.{subnet}.{}/24", i + 1);
            ns.exec(&node, &["ip", "addr", "add", &addr, "dev", "eth0"])?;
            ns.exec(&node, &["ip", "link", "set", "eth0", "up"])?;
            ns.exec(&node, &["ip", "link", "set", "lo", "up"])?;
        }
        Ok(ns)
    }

    /// Drops `p` of the UDP datagrams arriving at every node.
    fn set_loss(&self, p: f64) -> Result<(), String> {
        for i in 0..NODES {
            let node = self.node(i);
            self.exec(&node, &["iptables", "-F", "INPUT"])?;
            if p > 0.0 {
                let prob = format!("{p}");
                self.exec(
                    &node,
                    &[
                        "iptables",
                        "-A",
                        "INPUT",
                        "-p",
                        "udp",
                        "-m",
                        "statistic",
                        "--mode",
                        "random",
                        "--probability",
                        &prob,
                        "-j",
                        "DROP",
                    ],
                )?;
            }
        }
        Ok(())
    }

    /// Packets the INPUT and OUTPUT DROP rules of every node matched so far.
    fn dropped(&self) -> u64 {
        let mut total = 0;
        for i in 0..NODES {
            for chain in ["INPUT", "OUTPUT"] {
                if let Ok(out) =
                    self.exec(&self.node(i), &["iptables", "-L", chain, "-v", "-n", "-x"])
                {
                    total += out
                        .lines()
                        .filter(|l| l.contains("DROP"))
                        .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
                        .sum::<u64>();
                }
            }
        }
        total
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in self.made.iter().rev() {
            let _ = Command::new("ip")
                .args(["netns", "del", n])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Kills the launcher (and so its nodes) if the test fails while it runs.
struct Launcher(std::process::Child);

impl Drop for Launcher {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

struct Outcome {
    report: Value,
    /// Packets dropped by the DROP rules during the run.
    dropped: u64,
}

/// Runs SmallBank over the namespaces; `during` runs once the nodes are measuring.
fn bench(
    ns: &Netns,
    config: &std::path::Path,
    history: &std::path::Path,
    duration: f64,
    extra: &[&str],
    during: Option<&dyn Fn() -> Result<(), String>>,
) -> Result<Outcome, String> {
    let dropped0 = ns.dropped();
    let wrapper = format!("ip netns exec {}-n{{node}}", ns.prefix);
    let dur = duration.to_string();
    let mut args = vec![
        "bench",
        "smallbank",
        "--config",
        config.to_str().unwrap(),
        "--node-wrapper",
        &wrapper,
        "--scale",
        "0.05",
        "--replication",
        "3",
        "--coroutines",
        "8",
        "--warmup",
        "0.5",
        "--duration",
        &dur,
        "--history",
        history.to_str().unwrap(),
        "--json",
        "--no-progress",
    ];
    args.extend_from_slice(extra);
    let mut child = Launcher(
        Command::new(EXE)
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?,
    );
    let stderr = child.0.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let mut log = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    if let Some(f) = during {
        loop {
            let l = rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .map_err(|_| format!("the launcher did not start running: {log:?}"))?;
            let running = l.contains("running");
            log.push(l);
            if running {
                break;
            }
        }
        f()?;
    }
    let mut stdout = String::new();
    std::io::Read::read_to_string(child.0.stdout.as_mut().unwrap(), &mut stdout)
        .map_err(|e| e.to_string())?;
    let status = child.0.wait().map_err(|e| e.to_string())?;
    while let Ok(l) = rx.recv_timeout(Duration::from_millis(200)) {
        log.push(l);
    }
    if !status.success() {
        return Err(format!("bench failed ({status}):\n{}", log.join("\n")));
    }
    let report: Value = serde_json::from_str(&stdout)
        .map_err(|e| format!("report is not JSON ({e}): {}", log.join("\n")))?;
    Ok(Outcome {
        report,
        dropped: ns.dropped() - dropped0,
    })
}

/// The checks every run must pass: SmallBank's total, replicas, and the history.
fn check_run(name: &str, o: &Outcome, history: &std::path::Path) -> Result<(), String> {
    let r = &o.report;
    let fail = |what: String| Err(format!("{name}: {what}"));
    if r["invariant_ok"] != true {
        return fail(format!("the total balance is wrong: {}", r["check"]));
    }
    if r["check"]["replica_rows_compared"].as_u64().unwrap_or(0) == 0 {
        return fail(format!("replicas were not compared: {}", r["check"]));
    }
    if r["stuck_workers"] != 0 {
        return fail(format!("{} workers stuck", r["stuck_workers"]));
    }
    if r["rpc"]["suspected"] != 0 {
        return fail(format!(
            "{} destinations suspected: the retry settings must outlast the faults",
            r["rpc"]["suspected"]
        ));
    }
    if r["txn_layer"]["committed_incomplete"] != 0 {
        return fail("a transaction committed without reaching every replica".into());
    }
    // Every committed transaction appears exactly once and every read saw a committed
    // version (the checker's duplicate-id and G1a/lost-update/forked-chain checks).
    let recs = ambidex::history::parse_file(history).map_err(|e| format!("{name}: {e}"))?;
    let mut ids = HashSet::new();
    let mut committed = 0u64;
    for rec in &recs {
        if rec.is_committed() {
            committed += 1;
            if !ids.insert(rec.id) {
                return fail(format!("transaction {} is in the history twice", rec.id));
            }
        }
    }
    let report = ambidex::history::check(&recs);
    if !report.valid {
        return fail(format!("history: {}", report.summary()));
    }
    let counted = r["committed"].as_u64().unwrap_or(0);
    if committed < counted {
        return fail(format!(
            "the history has {committed} committed transactions, the run counted {counted}"
        ));
    }
    let _ = std::fs::remove_file(history);
    Ok(())
}

#[test]
fn smallbank_survives_loss_partition_and_injected_faults_across_namespaces() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        say("netns_faults: SKIPPED: needs root (network namespaces and iptables)");
        return;
    }
    for tool in ["ip", "iptables"] {
        if !have(tool) {
            say(&format!(
                "netns_faults: SKIPPED: `{tool}` is not installed (apt-get install -y {})",
                if tool == "ip" { "iproute2" } else { "iptables" }
            ));
            return;
        }
    }
    let t_start = Instant::now();
    let subnet = (std::process::id() % 200 + 20) as u8;
    let ns = Netns::build(subnet).expect("building the namespaces");
    let dir = std::env::temp_dir().join(format!("ambx-netns-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let history = dir.join("history.jsonl");
    let config = dir.join("cluster.json");
    let addrs: Vec<String> = (0..NODES)
        .map(|i| format!("10.213.{subnet}.{}:{PORT}", i + 1))
        .collect();
    // Give up on a request only after 8 s: a 1.5 s partition never makes a node suspect
    // another (suspicion would abort transactions whose commit is under way). The
    // retransmission timeout is the runtime's own (from the measured round trip).
    std::fs::write(
        &config,
        serde_json::json!({
            "cluster": {
                "transport": "udp",
                "nodes": NODES,
                "threads": 1,
                "udp_addrs": addrs,
            },
            "rpc": { "give_up_ms": 8000 }
        })
        .to_string(),
    )
    .unwrap();

    // (run, committed/s, committed per CPU-s, retransmits, iptables drops, committed)
    let mut table: Vec<(String, f64, f64, u64, u64, u64)> = Vec::new();
    let mut record = |name: &str, o: &Outcome| {
        let r = &o.report;
        table.push((
            name.to_string(),
            r["committed_per_s"].as_f64().unwrap_or(0.0),
            r["committed_per_cpu_s"].as_f64().unwrap_or(0.0),
            r["rpc"]["retransmits"].as_u64().unwrap_or(0),
            o.dropped,
            r["committed"].as_u64().unwrap_or(0),
        ));
    };
    let duration = 3.0;

    // 0%, 0.1% and 1% random loss.
    for (name, p) in [("loss 0%", 0.0), ("loss 0.1%", 0.001), ("loss 1%", 0.01)] {
        ns.set_loss(p).unwrap();
        let o = bench(&ns, &config, &history, duration, &[], None).unwrap();
        check_run(name, &o, &history).unwrap();
        if p > 0.0 {
            assert!(o.dropped > 0, "{name}: the loss rules dropped nothing");
        }
        record(name, &o);
    }
    ns.set_loss(0.0).unwrap();

    // Node 2 partitioned for 1.5 s in the middle of a 4 s measured window.
    let victim = ns.node(2);
    let partition_drops = std::cell::Cell::new(0);
    let partition = || -> Result<(), String> {
        // Warmup (0.5 s), then 1 s into the measured window.
        std::thread::sleep(Duration::from_millis(500 + 1000));
        for chain in ["INPUT", "OUTPUT"] {
            ns.exec(&victim, &["iptables", "-I", chain, "-j", "DROP"])?;
        }
        std::thread::sleep(Duration::from_millis(1500));
        partition_drops.set(ns.dropped());
        for chain in ["INPUT", "OUTPUT"] {
            ns.exec(&victim, &["iptables", "-D", chain, "-j", "DROP"])?;
        }
        Ok(())
    };
    let mut o = bench(&ns, &config, &history, 4.0, &[], Some(&partition)).unwrap();
    o.dropped = partition_drops.get();
    check_run("partition", &o, &history).unwrap();
    assert!(o.dropped > 0, "the partition dropped nothing");
    assert!(o.report["rpc"]["retransmits"].as_u64().unwrap() > 0);
    record("partition 1.5s", &o);

    // The transport's own fault injector: delay, reordering and duplication.
    let o = bench(
        &ns,
        &config,
        &history,
        duration,
        &[
            "--fault-delay",
            "0.02",
            "--fault-max-delay-us",
            "3000",
            "--fault-reorder",
            "0.02",
            "--fault-duplicate",
            "0.01",
            "--fault-seed",
            "7",
        ],
        None,
    )
    .unwrap();
    check_run("injector", &o, &history).unwrap();
    let c = &o.report["transport_counters"];
    for k in ["fault_delayed", "fault_reordered", "fault_duplicated"] {
        assert!(c[k].as_u64().unwrap() > 0, "{k}: {c}");
    }
    record("injector d2%+r2%+dup1%", &o);

    // The 0% run again: on a shared machine, the spread of the two is the noise floor.
    let o = bench(&ns, &config, &history, duration, &[], None).unwrap();
    check_run("loss 0% (again)", &o, &history).unwrap();
    record("loss 0% (again)", &o);

    let last = table.len() - 1;
    let base = ((table[0].1 + table[last].1) / 2.0).max(1e-9);
    let base_cpu = ((table[0].2 + table[last].2) / 2.0).max(1e-9);
    say("netns_faults: SmallBank, 3 udp nodes in 3 namespaces, R=3, 1 thread x 8 coroutines");
    say("  (relative to the mean of the two 0% runs; per CPU-s is steadier on a busy machine)");
    say("  run                      committed/s  vs 0%  per CPU-s  vs 0%  committed  retransmits  iptables drops");
    for (name, rate, cpu_rate, retx, dropped, committed) in &table {
        say(&format!(
            "  {name:<24} {rate:>11.0}  {:>5.2}  {cpu_rate:>9.0}  {:>5.2}  {committed:>9}  {retx:>11}  {dropped:>14}",
            rate / base,
            cpu_rate / base_cpu
        ));
    }
    say(&format!(
        "  every run: invariant, replicas and history OK; total {:.1} s",
        t_start.elapsed().as_secs_f64()
    ));
    // A lost datagram costs about one retransmission timeout from the measured round
    // trip, so 1% loss keeps most of the throughput: 0.82-0.93 of the 0% runs in six
    // runs here, against 0.18-0.32 with a fixed 10 ms timeout. The bound is looser than
    // that because the 0% runs themselves spread by up to +-30% while another build
    // shares the machine; it still fails with fixed timeouts of 5 ms and more (0.30).
    let at_1 = table[2].1 / base;
    assert!(
        at_1 >= 0.5,
        "1% loss kept only {at_1:.2} of the loss-free throughput"
    );
    drop(ns);
    let _ = std::fs::remove_dir_all(&dir);
}
