//! One configuration, every path: a setting given once in a config file reaches an
//! in-process run (`ambidex bench W --config F`), a node process (`ambidex node --config
//! F --node I`, whose ready event echoes the configuration and the policy it runs), a
//! launcher run of node processes and the simulator (`ambidex sim --config F`); flags
//! beat the file; a preset or a per-phase choice that does not exist is refused by name
//! on every path; the reports carry the policy, one-sided and location-cache parts.

use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

const EXE: &str = env!("CARGO_BIN_EXE_ambidex");

/// Runs `ambidex ARGS` and returns (success, stdout, stderr).
fn ambidex(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(EXE).args(args).output().expect("run ambidex");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

fn json(args: &[&str]) -> Value {
    let (ok, stdout, stderr) = ambidex(args);
    assert!(ok, "ambidex {args:?} failed:\n{stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}\n{stderr}"))
}

/// The distinctive settings every path must see.
fn check_settings(config: &Value, what: &str) {
    assert_eq!(config["rpc"]["give_up_ms"], 700.0, "{what}: {config}");
    assert_eq!(config["txn"]["mode"], "fasst", "{what}: {config}");
    assert_eq!(config["run"]["coroutines"], 3, "{what}: {config}");
    assert_eq!(config["cluster"]["nodes"], 2, "{what}: {config}");
}

/// The `policy` of a fasst run.
fn fasst_policy() -> Value {
    serde_json::json!({"execute": "rpc", "lock": "rpc", "validate": "rpc", "log": "rpc",
        "commit": "rpc", "passive_ack": "off"})
}

/// A fasst report's `policy` (every phase, and the preset), `one_sided` and
/// `location_cache` parts.
fn report_parts(r: &Value, what: &str) {
    let mut want = fasst_policy();
    want["preset"] = "fasst".into();
    assert_eq!(r["policy"], want, "{what}");
    for k in ["reads", "writes", "cas", "faa", "failed"] {
        assert!(
            r["one_sided"][k].is_u64(),
            "{what}: {k} in {}",
            r["one_sided"]
        );
    }
    // The start-up check READs the other node's tables one-sided.
    assert!(r["one_sided"]["reads"].as_u64().unwrap() > 0, "{what}");
    for k in ["hits", "misses", "stale"] {
        assert!(
            r["location_cache"][k].is_u64(),
            "{what}: {k} in {}",
            r["location_cache"]
        );
    }
}

#[test]
fn one_config_file_reaches_every_path() {
    let dir = std::env::temp_dir().join(format!("ambx-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let port = 21000 + (std::process::id() % 15000) as u16;
    let file = dir.join("run.toml");
    std::fs::write(
        &file,
        format!(
            "# one file for the in-process run, the node processes and the simulator\n\
             [cluster]\ntransport = \"udp\"\nnodes = 2\nreplication = 2\n\
             udp_addrs = [\"127.0.0.1:{port}\", \"127.0.0.1:{}\"]\n\
             [rpc]\ngive_up_ms = 700\n\
             [txn]\nmode = \"fasst\"\n\
             [run]\nworkload = \"smallbank\"\ncoroutines = 3\nscale = 0.001\n\
             duration_s = 0.3\nwarmup_s = 0.1\n\
             [sim]\nsteps = 300\nfaults = \"none\"\n",
            port + 10
        ),
    )
    .unwrap();
    let f = file.to_str().unwrap();

    // In-process: every node opened in this process.
    let in_process = |extra: &[&str]| {
        let base = [
            "bench",
            "smallbank",
            "--config",
            f,
            "--in-process",
            "--json",
        ];
        json(&[&base[..], extra].concat())
    };
    let r = in_process(&[]);
    check_settings(&r["config"], "in-process");
    assert_eq!(r["coroutines"], 3);
    assert_eq!(r["mode"], "fasst");
    assert_eq!(r["invariant_ok"], true, "{}", r["check"]);
    report_parts(&r, "in-process");

    // A node process: its ready event echoes the configuration it loaded.
    let mut node = Command::new(EXE)
        .args(["node", "--config", f, "--node", "1", "--no-progress"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(node.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let ready: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(ready["event"], "ready", "{line}");
    check_settings(&ready["config"], "node process");
    assert_eq!(ready["policy"], fasst_policy(), "{line}");
    let mut stdin = node.stdin.take().unwrap();
    stdin.write_all(b"abort\n").unwrap();
    drop(stdin);
    assert_eq!(node.wait().unwrap().code(), Some(2));

    // The launcher and its node processes.
    let r = json(&[
        "bench",
        "smallbank",
        "--config",
        f,
        "--json",
        "--no-progress",
    ]);
    check_settings(&r["config"], "launcher");
    assert_eq!(
        (r["transport"].as_str(), r["nodes"].as_u64()),
        (Some("udp"), Some(2))
    );
    assert_eq!(r["invariant_ok"], true, "{}", r["check"]);
    report_parts(&r, "launcher");

    // The simulator: the same file, its own network.
    let s = json(&["sim", "--config", f, "--seed", "5", "--json"]);
    check_settings(&s["config"], "sim");
    report_parts(&s, "sim");
    assert_eq!(s["config"]["sim"]["steps"], 300);
    assert!(s["failures"].as_array().unwrap().is_empty(), "{s}");
    assert!(s["command"].as_str().unwrap().contains("--config"), "{s}");

    // Flags beat the file.
    let r = in_process(&["--coroutines", "5", "--rpc-give-up-ms", "900"]);
    assert_eq!(r["coroutines"], 5);
    assert_eq!(r["config"]["rpc"]["give_up_ms"], 900.0);
    assert_eq!(
        r["config"]["cluster"]["nodes"], 2,
        "the rest still from the file"
    );
    let s = json(&[
        "sim", "--config", f, "--seed", "5", "--json", "--steps", "100",
    ]);
    assert_eq!(s["config"]["sim"]["steps"], 100);
    assert_eq!(s["config"]["rpc"]["give_up_ms"], 700.0);

    // Without a workload subcommand, the file names the workload.
    let objstore = dir.join("objstore.toml");
    std::fs::write(
        &objstore,
        "[run]\nworkload = \"object-store\"\nscale = 0.001\nduration_s = 0.2\nwarmup_s = 0\n",
    )
    .unwrap();
    let o = objstore.to_str().unwrap();
    let r = json(&["bench", "--config", o, "--json", "--no-progress"]);
    assert_eq!(r["workload"], "object-store");
    let r = json(&["bench", "tatp", "--config", o, "--json", "--no-progress"]);
    assert_eq!(r["workload"], "tatp", "the subcommand beats the file");

    // A preset that does not exist is refused, naming the presets, on every path.
    for args in [
        vec!["bench", "smallbank", "--mode", "farmer"],
        vec![
            "bench",
            "smallbank",
            "--transport",
            "shm",
            "--mode",
            "farmer",
        ],
        vec!["bench", "smallbank", "--config", f, "--mode", "farmer"],
        vec!["sim", "--mode", "farmer"],
        vec!["sim", "--config", f, "--mode", "farmer"],
    ] {
        let (ok, _, stderr) = ambidex(&args);
        assert!(!ok, "{args:?}");
        assert!(
            stderr.contains("txn.mode (--mode) \"farmer\": no such preset")
                && stderr.contains("fasst, farm, drtm-r, drtm-h"),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    // A per-phase flag with a value that does not exist: clap names the flag and the
    // choices, on every command that takes it.
    for (flag, value, choices) in [
        ("--execute", "magic", "rpc, onesided, cached, hybrid"),
        ("--lock", "mutex", "rpc, cas"),
        ("--validate", "write", "rpc, read"),
        ("--log", "disk", "rpc, write"),
        ("--commit", "cas", "rpc, write"),
        ("--passive-ack", "yes", "on, off"),
    ] {
        for cmd in [&["bench", "smallbank"][..], &["bench"], &["sim"]] {
            let (ok, _, stderr) = ambidex(&[cmd, &[flag, value]].concat());
            assert!(!ok, "{cmd:?} {flag}");
            assert!(
                stderr.contains(&format!("'{value}'"))
                    && stderr.contains(flag)
                    && stderr.contains(choices),
                "{cmd:?} {flag}: {stderr}"
            );
        }
    }
    // Every preset, and per-phase keys over it, reach a node process, which says the
    // policy it will run (these runs stop before any transaction).
    for (txn, want) in [
        (
            r#"{"mode": "farm"}"#,
            serde_json::json!({"execute": "onesided", "lock": "rpc", "validate": "read",
                "log": "write", "commit": "rpc", "passive_ack": "off"}),
        ),
        (
            r#"{"mode": "drtm-h", "execute": "cached", "passive_ack": "off"}"#,
            serde_json::json!({"execute": "cached", "lock": "cas", "validate": "read",
                "log": "write", "commit": "write", "passive_ack": "off"}),
        ),
    ] {
        let cfg = dir.join("policy.json");
        std::fs::write(
            &cfg,
            format!(
                "{{\"cluster\": {{\"transport\": \"udp\", \"nodes\": 2, \"replication\": 2, \
                 \"udp_addrs\": [\"127.0.0.1:{port}\", \"127.0.0.1:{}\"]}}, \
                 \"run\": {{\"scale\": 0.001}}, \"txn\": {txn}}}",
                port + 10
            ),
        )
        .unwrap();
        let mut node = Command::new(EXE)
            .args(["node", "--config", cfg.to_str().unwrap(), "--node", "0"])
            .arg("--no-progress")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(node.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let ready: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!(ready["event"], "ready", "{line}");
        assert_eq!(ready["policy"], want, "{txn}");
        let mut stdin = node.stdin.take().unwrap();
        stdin.write_all(b"abort\n").unwrap();
        drop(stdin);
        assert_eq!(node.wait().unwrap().code(), Some(2));
    }
    let bad = dir.join("badphase.toml");
    std::fs::write(&bad, "[txn]\ncommit = \"cas\"\n").unwrap();
    let b = bad.to_str().unwrap();
    for args in [
        vec!["bench", "smallbank", "--config", b],
        vec!["sim", "--config", b],
        vec!["node", "--config", b, "--node", "0"],
    ] {
        let (ok, _, stderr) = ambidex(&args);
        assert!(!ok, "{args:?}");
        assert!(
            stderr.contains(
                "txn.commit (--commit) \"cas\": no such choice; the choices are: rpc, write"
            ),
            "{args:?}: {stderr}"
        );
    }
    // A flag beats the file's key for its phase.
    let over = dir.join("over.toml");
    std::fs::write(
        &over,
        "[txn]\npassive_ack = \"on\"\n[run]\nscale = 0.001\nduration_s = 0.2\nwarmup_s = 0\n",
    )
    .unwrap();
    let o = over.to_str().unwrap();
    let r = json(&[
        "bench",
        "smallbank",
        "--config",
        o,
        "--passive-ack",
        "off",
        "--json",
        "--no-progress",
    ]);
    assert_eq!(r["policy"]["preset"], "fasst", "{}", r["policy"]);
    assert_eq!(r["config"]["txn"]["passive_ack"], "off");

    // Unknown fields and bad values in a file are errors, not panics, on every path.
    let bad = dir.join("bad.toml");
    for (text, want) in [
        ("[rpc]\nmax_retrys = 7\n", "max_retrys"),
        ("[rpc]\nrto_min_ms = 0\n", "rpc.rto_min_ms"),
        ("[run]\ncoroutines = 0\n", "coroutines"),
    ] {
        std::fs::write(&bad, text).unwrap();
        let b = bad.to_str().unwrap();
        for args in [
            vec!["bench", "smallbank", "--config", b],
            vec!["sim", "--config", b],
            vec!["node", "--config", b, "--node", "0"],
        ] {
            let (ok, _, stderr) = ambidex(&args);
            assert!(!ok, "{args:?} {text}");
            assert!(stderr.contains(want), "{args:?} {text}: {stderr}");
            assert!(!stderr.contains("panicked"), "{stderr}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--help` of every command that takes them documents the preset and per-phase flags
/// with their choices.
#[test]
fn help_documents_the_policy_flags() {
    for cmd in [
        &["bench", "smallbank"][..],
        &["bench"],
        &["bench", "tpcc"],
        &["sim"],
    ] {
        let (ok, stdout, stderr) = ambidex(&[cmd, &["--help"]].concat());
        assert!(ok, "{cmd:?}: {stderr}");
        for want in [
            "--mode <PRESET>",
            "fasst",
            "drtm-h",
            "--execute <HOW>",
            "--lock <HOW>",
            "--validate <HOW>",
            "--log <HOW>",
            "--commit <HOW>",
            "--passive-ack <ON_OFF>",
            "rpc, onesided, cached, hybrid",
            "rpc, cas",
            "rpc, read",
            "on, off",
        ] {
            assert!(stdout.contains(want), "{cmd:?}: {want:?} not in\n{stdout}");
        }
    }
}

/// The text summary names the policy and the one-sided and location-cache counts.
#[test]
fn the_text_summary_names_the_policy_and_one_sided_counts() {
    let (ok, stdout, stderr) = ambidex(&[
        "bench",
        "smallbank",
        "--scale",
        "0.01",
        "--duration",
        "0.2",
        "--warmup",
        "0",
        "--no-progress",
    ]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains(
            "policy fasst (execute rpc, lock rpc, validate rpc, log rpc, commit rpc, passive-ack off)"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("one-sided: ") && stdout.contains("location cache: 0 hits"),
        "{stdout}"
    );
    let (ok, stdout, stderr) = ambidex(&[
        "sim",
        "--seed",
        "1",
        "--steps",
        "100",
        "--faults",
        "none",
        "--passive-ack",
        "on",
    ]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("policy no preset: execute rpc"), "{stdout}");
    assert!(stdout.contains("passive-ack on"), "{stdout}");
    assert!(stdout.contains("one-sided: "), "{stdout}");
}
