//! The configuration's unit tests: defaults, files, typed errors, presets.

use super::*;
use ambidex_rpc::RuntimeConfig;
use std::path::Path;
use std::time::Duration;

fn file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ambx-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn defaults_are_todays() {
    let c = Config::default();
    c.validate().unwrap();
    assert_eq!(
        (c.cluster.nodes, c.cluster.threads, c.cluster.replication),
        (3, 1, 3)
    );
    assert_eq!(c.cluster.transport, Transport::Local);
    assert_eq!(
        (c.run.workload.as_str(), c.run.coroutines, c.run.scale),
        ("smallbank", None, None),
        "the workload's own defaults apply (its registration's)"
    );
    assert_eq!(
        (c.run.duration_s, c.run.warmup_s, c.run.seed),
        (5.0, 1.0, 42)
    );
    let rt = c.rpc.runtime_config().unwrap();
    let d = RuntimeConfig::default();
    assert_eq!(
        (rt.rto_min, rt.rto_max, rt.give_up),
        (d.rto_min, d.rto_max, d.give_up)
    );
    assert_eq!(c.rpc.give_up_after(), d.give_up);
    // The udp backend's one-sided operations give up when the RPCs do.
    let mut r = c.rpc.clone();
    r.give_up_ms = 8000.0;
    let u = r.udp_options().unwrap();
    assert_eq!((u.rto_min, u.give_up), (d.rto_min, Duration::from_secs(8)));
    assert!(!c.txn.txn_config().unwrap().skip_validation_for_tests);
}

#[test]
fn toml_and_json_files_read_the_same_over_the_base() {
    let t = file(
        "a.toml",
        "[cluster]\nnodes = 4\n[rpc]\ngive_up_ms = 7\n[txn]\nmode = \"fasst\"\n\
         [run]\nworkload = \"tpcc\"\ncoroutines = 3\n",
    );
    let j = file(
        "a.json",
        r#"{"cluster": {"nodes": 4}, "rpc": {"give_up_ms": 7}, "txn": {"mode": "fasst"},
            "run": {"workload": "tpcc", "coroutines": 3}}"#,
    );
    let a = Config::read(&t, &Config::default()).unwrap();
    let b = Config::read(&j, &Config::default()).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.cluster.nodes, 4);
    assert_eq!(a.cluster.threads, 1, "left out: the base's");
    assert_eq!(a.run.workload, "tpcc");
    assert_eq!(a.rpc.give_up_ms, 7.0);
    assert_eq!(a.run.coroutines, Some(3));
    a.validate().unwrap();
    // What the file leaves out keeps the base's value (the simulator's base differs).
    let mut base = Config::default();
    base.rpc.rto_min_ms = 1.0;
    let s = Config::read(&t, &base).unwrap();
    assert_eq!((s.rpc.rto_min_ms, s.rpc.give_up_ms), (1.0, 7.0));
    // A written file reads back the same, in either format.
    for name in ["w.json", "w.toml"] {
        let w = file(name, "");
        a.write(&w).unwrap();
        assert_eq!(Config::read(&w, &Config::default()).unwrap(), a, "{name}");
    }
}

#[test]
fn unknown_fields_and_bad_files_are_typed_errors() {
    let base = Config::default();
    for (name, text) in [
        ("u.toml", "[rpc]\nmax_retrys = 7\n"),
        ("u2.toml", "[clusterr]\nnodes = 3\n"),
        ("u.json", r#"{"run": {"workload": 7}}"#),
        ("t.json", r#"{"cluster": {"nodes": -1}}"#),
        ("n.json", "{ not json"),
        ("a.json", "[1, 2]"),
        ("n.toml", "nodes = = 3"),
    ] {
        match Config::read(&file(name, text), &base) {
            Err(ConfigError::Parse { .. }) => {}
            other => panic!("{name}: {other:?}"),
        }
    }
    assert!(matches!(
        Config::read(&file("x.yaml", "a: 1"), &base),
        Err(ConfigError::Extension { .. })
    ));
    assert!(matches!(
        Config::read(Path::new("/nonexistent/x.toml"), &base),
        Err(ConfigError::Io { .. })
    ));
    let e = Config::read(&file("u3.toml", "[rpc]\nmax_retrys = 7\n"), &base).unwrap_err();
    assert!(e.to_string().contains("max_retrys"), "{e}");
}

#[test]
fn bad_values_are_typed_errors() {
    let field = |c: Config| match c.validate() {
        Err(ConfigError::Invalid { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    let mut c = Config::default();
    c.rpc.rto_min_ms = -1.0;
    assert_eq!(field(c), "rpc.rto_min_ms");
    let mut c = Config::default();
    c.rpc.rto_max_ms = c.rpc.rto_min_ms / 2.0;
    assert_eq!(field(c), "rpc.rto_max_ms");
    let mut c = Config::default();
    c.rpc.give_up_ms = c.rpc.rto_min_ms / 2.0;
    assert_eq!(field(c), "rpc.give_up_ms");
    let mut c = Config::default();
    c.rpc.give_up_ms = f64::NAN;
    assert_eq!(field(c), "rpc.give_up_ms");
    // FaSST's setting (no retransmission, failed after 1 s) is expressible.
    let mut c = Config::default();
    (c.rpc.rto_min_ms, c.rpc.rto_max_ms, c.rpc.give_up_ms) = (1000.0, 1000.0, 1000.0);
    let rt = c.rpc.runtime_config().unwrap();
    let f = RuntimeConfig::fasst();
    assert_eq!(rt.rto_bounds_ns(), f.rto_bounds_ns());
    assert_eq!(rt.give_up, f.give_up);
    let mut c = Config::default();
    c.cluster.replication = 4;
    assert_eq!(field(c), "cluster.replication");
    let mut c = Config::default();
    c.cluster.nodes = 0;
    assert_eq!(field(c), "cluster");
    // More nodes or threads than a lock word can name (found in review: 129 threads
    // reached a panic at start-up).
    let mut c = Config::default();
    c.cluster.threads = 129;
    assert_eq!(field(c), "cluster");
    let mut c = Config::default();
    c.cluster.nodes = 65;
    c.cluster.replication = 3;
    assert_eq!(field(c), "cluster");
    let mut c = Config::default();
    c.run.coroutines = Some(0);
    assert_eq!(field(c), "run.coroutines");
    let mut c = Config::default();
    c.run.scale = Some(f64::NAN);
    assert_eq!(field(c), "run.scale");
    let mut c = Config::default();
    c.run.w = 5;
    assert_eq!(field(c), "run.r");
    let c = Config {
        fault: Some(FaultSection {
            drop: 2.0,
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(field(c), "fault");
    let mut c = Config::default();
    c.cluster.udp_addrs = vec!["127.0.0.1:1".parse().unwrap()];
    assert_eq!(field(c), "cluster.udp_addrs");
    let mut c = Config::default();
    c.cluster.transport = Transport::Udp;
    c.cluster.udp_addrs = vec!["127.0.0.1:65535".parse().unwrap(); 3];
    assert_eq!(field(c), "cluster.udp_addrs");
    for lease in [0, 60_001] {
        let mut c = Config::default();
        c.cluster.lease_ms = lease;
        assert_eq!(field(c), "cluster.lease_ms");
    }
    for rate in [0.0, -1.0, f64::NAN, 1e9] {
        let mut c = Config::default();
        c.cluster.rereplication_mb_per_s = rate;
        assert_eq!(field(c), "cluster.rereplication_mb_per_s");
    }
}

#[test]
fn the_rereplication_pace_is_a_key_in_mib_per_second() {
    let c = Config::default();
    let spec = c.run_spec(1, None).unwrap();
    assert_eq!(
        spec.txn.rereplication_bytes_per_s,
        ambidex_txn::REREPLICATION_BYTES_PER_S
    );
    let c = Config::read(
        &file("r.toml", "[cluster]\nrereplication_mb_per_s = 8\n"),
        &Config::default(),
    )
    .unwrap();
    let spec = c.run_spec(1, None).unwrap();
    assert_eq!(spec.txn.rereplication_bytes_per_s, 8 << 20);
}

#[test]
fn the_manager_is_embedded_by_default_and_none_turns_leases_off() {
    let c = Config::default();
    assert_eq!(c.cluster.manager, crate::config::ManagerKind::Embedded);
    let spec = c.run_spec(1, None).unwrap();
    assert_eq!(
        spec.manager.map(|m| m.lease),
        Some(std::time::Duration::from_millis(50))
    );
    let base = Config::default();
    let c = Config::read(
        &file("m.toml", "[cluster]\nmanager = \"none\"\nlease_ms = 200\n"),
        &base,
    )
    .unwrap();
    assert_eq!(c.cluster.manager, crate::config::ManagerKind::None);
    assert_eq!(c.cluster.lease_ms, 200);
    assert!(c.run_spec(1, None).unwrap().manager.is_none());
    // etcd needs its endpoints, and a build with the `etcd` feature.
    let field = |c: Config| match c.validate() {
        Err(ConfigError::Invalid { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    let c = Config::read(&file("m2.toml", "[cluster]\nmanager = \"etcd\"\n"), &base).unwrap();
    let needs = if cfg!(feature = "etcd") {
        "cluster.etcd_endpoints"
    } else {
        "cluster.manager"
    };
    assert_eq!(field(c), needs);
    let mut c = Config::default();
    c.cluster.etcd_endpoints = vec!["http://127.0.0.1:2379".into()];
    assert_eq!(field(c), "cluster.manager", "endpoints without etcd");
    assert!("zookeeper".parse::<crate::config::ManagerKind>().is_err());
}

#[test]
fn every_preset_exists_and_unknown_ones_are_named() {
    let mut c = Config::default();
    assert_eq!(c.policy().unwrap(), ambidex_txn::Policy::fasst());
    for mode in PRESETS {
        c.txn.mode = mode.to_string();
        c.validate().unwrap();
        let p = c.txn.txn_config().unwrap().policy;
        assert_eq!(p, ambidex_txn::Policy::preset(mode).unwrap());
        assert_eq!(p.preset_name(), Some(*mode));
    }
    c.txn.mode = "nonsense".into();
    let e = c.validate().unwrap_err();
    assert_eq!(
        e,
        ConfigError::UnknownMode {
            mode: "nonsense".into()
        }
    );
    let s = e.to_string();
    assert!(s.contains("txn.mode") && s.contains("\"nonsense\""), "{s}");
    for name in ["fasst", "farm", "drtm-r", "drtm-h"] {
        assert!(s.contains(name), "{s}");
    }
    assert!(!s.contains("not built"), "{s}");
    c.txn.mode = "fasst".into();
    c.txn.inject_bug = Some(InjectedBug::SkipValidation);
    assert!(c.txn.txn_config().unwrap().skip_validation_for_tests);
    assert!(matches!(
        "skip".parse::<InjectedBug>(),
        Err(ConfigError::UnknownName { .. })
    ));
}

#[test]
fn per_phase_keys_override_the_preset() {
    use ambidex_txn::Policy;
    // A key left out keeps the preset's choice; a key given replaces it.
    let f = file(
        "p.toml",
        "[txn]\nmode = \"drtm-h\"\npassive_ack = \"off\"\nexecute = \"cached\"\n",
    );
    let c = Config::read(&f, &Config::default()).unwrap();
    c.validate().unwrap();
    let p = c.policy().unwrap();
    assert_eq!(
        p,
        Policy {
            execute: Execute::Cached,
            passive_ack: PassiveAck::Off,
            ..Policy::drtm_h()
        }
    );
    // ...which is DrTM+R's policy, so it is reported as that preset.
    assert_eq!(p.preset_name(), Some("drtm-r"));
    // The same in JSON, every key, every name.
    let j = file(
        "p.json",
        r#"{"txn": {"mode": "fasst", "execute": "onesided", "lock": "cas",
            "validate": "read", "log": "write", "commit": "write", "passive_ack": "on"}}"#,
    );
    let c = Config::read(&j, &Config::default()).unwrap();
    assert_eq!(
        c.policy().unwrap(),
        Policy {
            execute: Execute::OneSided,
            lock: Lock::Cas,
            validate: Validate::Read,
            log: Log::Write,
            commit: Commit::Write,
            passive_ack: PassiveAck::On,
        }
    );
    assert_eq!(c.policy().unwrap().preset_name(), None);
    for (key, names) in [
        ("execute", Execute::NAMES),
        ("lock", Lock::NAMES),
        ("validate", Validate::NAMES),
        ("log", Log::NAMES),
        ("commit", Commit::NAMES),
        ("passive_ack", PassiveAck::NAMES),
    ] {
        for n in names {
            let v = serde_json::json!({ "txn": { key: n } });
            let c = Config::over(&Config::default(), v).unwrap();
            let got = serde_json::to_value(c.policy().unwrap()).unwrap();
            assert_eq!(got[key], *n, "{key} = {n}");
        }
    }
    // Overrides are written for node processes and read back the same; absent ones are
    // not written at all.
    let w = file("pw.json", "");
    c.write(&w).unwrap();
    assert_eq!(Config::read(&w, &Config::default()).unwrap(), c);
    let text = serde_json::to_string(&Config::default()).unwrap();
    assert!(!text.contains("passive_ack"), "{text}");
}

#[test]
fn bad_per_phase_values_name_the_field_and_the_choices() {
    let base = Config::default();
    for (name, text, field, allowed) in [
        (
            "b1.toml",
            "[txn]\nexecute = \"magic\"\n",
            "txn.execute",
            "rpc, onesided, cached, hybrid",
        ),
        ("b2.toml", "[txn]\nlock = \"RPC\"\n", "txn.lock", "rpc, cas"),
        (
            "b3.json",
            r#"{"txn": {"validate": "write"}}"#,
            "txn.validate",
            "rpc, read",
        ),
        ("b4.toml", "[txn]\nlog = \"\"\n", "txn.log", "rpc, write"),
        (
            "b5.toml",
            "[txn]\ncommit = \"cas\"\n",
            "txn.commit",
            "rpc, write",
        ),
        (
            "b6.toml",
            "[txn]\npassive_ack = \"yes\"\n",
            "txn.passive_ack",
            "on, off",
        ),
    ] {
        let e = Config::read(&file(name, text), &base).unwrap_err();
        assert!(
            matches!(&e, ConfigError::UnknownChoice { field: f, .. } if *f == field),
            "{name}: {e:?}"
        );
        let s = e.to_string();
        assert!(s.contains(field) && s.contains(allowed), "{name}: {s}");
    }
    // A value of the wrong type, and an unknown key, are serde's errors (naming them).
    for (name, text, want) in [
        ("b7.toml", "[txn]\npassive_ack = true\n", "boolean"),
        ("b8.toml", "[txn]\nexecution = \"rpc\"\n", "execution"),
        ("b9.json", r#"{"txn": {"Lock": "cas"}}"#, "Lock"),
    ] {
        match Config::read(&file(name, text), &base) {
            Err(e @ ConfigError::Parse { .. }) => {
                assert!(e.to_string().contains(want), "{name}: {e}")
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    assert!(matches!(
        Execute::parse("hybrid "),
        Err(ConfigError::UnknownChoice {
            flag: "--execute",
            ..
        })
    ));
    assert_eq!(PassiveAck::parse("on"), Ok(PassiveAck::On));
}
