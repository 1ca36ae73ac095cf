//! The simulator in CI: at least 200 seeds per workload under the `chaos` fault profile
//! must pass every check; every profile passes a few seeds; the same seed gives the same
//! run bit for bit; and a deliberately broken protocol (a test-only flag) is caught by
//! some seed of the CI range, and that seed reproduces the failure exactly.

use ambidex_sim::{run, FaultProfile, InjectedBug, Scripted, SimReport, SimSpec, PROFILES};
use ambidex_workloads::WorkloadKind;
use std::time::Instant;

/// Seeds every workload runs in CI, and the steps of each run.
const CI_SEEDS: u64 = 200;
const CI_STEPS: u64 = 2_000;

fn spec(workload: WorkloadKind, seed: u64, faults: &str) -> SimSpec {
    SimSpec {
        steps: CI_STEPS,
        faults: FaultProfile::named(faults).unwrap(),
        ..SimSpec::new(workload, seed)
    }
}

/// Runs `seeds` and fails listing every failing seed with its reproducing command.
fn sweep(workload: WorkloadKind, faults: &str, seeds: std::ops::Range<u64>) -> Vec<SimReport> {
    let t0 = Instant::now();
    let n = seeds.end - seeds.start;
    let reports: Vec<SimReport> = seeds
        .map(|s| run(&spec(workload, s, faults)).expect("a valid spec"))
        .collect();
    let failed: Vec<String> = reports
        .iter()
        .filter(|r| !r.passed())
        .map(|r| {
            format!(
                "seed {}: {}\n  reproduce: {}",
                r.seed,
                r.failures.join("\n  "),
                r.command
            )
        })
        .collect();
    let committed: u64 = reports.iter().map(|r| r.committed).sum();
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "{} {faults}: {n} seeds in {secs:.2} s ({:.0} seeds/s), {:.0} committed per seed, {} partitions, {} pauses",
        workload.name(),
        n as f64 / secs,
        committed as f64 / n as f64,
        reports.iter().map(|r| r.partitions).sum::<u64>(),
        reports.iter().map(|r| r.pauses).sum::<u64>(),
    );
    assert!(
        failed.is_empty(),
        "{} of {n} seeds failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
    // The runs did real work.
    assert!(
        committed >= 5 * n,
        "only {committed} commits over {n} seeds"
    );
    reports
}

fn faults_were_injected(reports: &[SimReport]) {
    let sum = |f: fn(&SimReport) -> u64| reports.iter().map(f).sum::<u64>();
    assert!(sum(|r| r.net.dropped_fault) > 0, "no datagram dropped");
    assert!(sum(|r| r.net.duplicated) > 0, "no datagram duplicated");
    assert!(sum(|r| r.net.reordered) > 0, "no datagram reordered");
    assert!(
        sum(|r| r.net.dropped_partition) > 0,
        "no partition cut a datagram"
    );
    assert!(sum(|r| r.partitions) > 0 && sum(|r| r.pauses) > 0);
    assert!(sum(|r| r.rpc.retransmits) > 0, "nothing was retransmitted");
    assert!(
        sum(|r| r.rpc.duplicate_requests) > 0,
        "no duplicate request reached a server"
    );
}

#[test]
fn smallbank_ci_seeds_pass_under_chaos() {
    let r = sweep(WorkloadKind::SmallBank, "chaos", 0..CI_SEEDS);
    faults_were_injected(&r);
}

#[test]
fn tatp_ci_seeds_pass_under_chaos() {
    let r = sweep(WorkloadKind::Tatp, "chaos", 0..CI_SEEDS);
    faults_were_injected(&r);
}

#[test]
fn tpcc_ci_seeds_pass_under_chaos() {
    let r = sweep(WorkloadKind::Tpcc, "chaos", 0..CI_SEEDS);
    faults_were_injected(&r);
}

#[test]
fn object_store_ci_seeds_pass_under_chaos() {
    let r = sweep(WorkloadKind::ObjectStore, "chaos", 0..CI_SEEDS);
    faults_were_injected(&r);
}

#[test]
fn every_profile_passes_a_few_seeds_of_every_workload() {
    for w in [
        WorkloadKind::SmallBank,
        WorkloadKind::Tatp,
        WorkloadKind::Tpcc,
        WorkloadKind::TpccNo,
        WorkloadKind::ObjectStore,
    ] {
        for p in PROFILES {
            sweep(w, p, 1000..1004);
        }
    }
}

#[test]
fn the_same_seed_gives_the_same_run_bit_for_bit() {
    for w in [WorkloadKind::SmallBank, WorkloadKind::Tpcc] {
        let a = run(&spec(w, 42, "chaos")).unwrap();
        let b = run(&spec(w, 42, "chaos")).unwrap();
        assert_eq!(
            (&a.trace_hash, &a.state_digest, &a.run_hash),
            (&b.trace_hash, &b.state_digest, &b.run_hash)
        );
        assert_eq!(
            (a.committed, a.aborted, a.sim_time_ns),
            (b.committed, b.aborted, b.sim_time_ns)
        );
        assert_eq!(a.history, b.history, "histories differ");
        assert_eq!(a.net, b.net);
        let c = run(&spec(w, 43, "chaos")).unwrap();
        assert_ne!(
            a.trace_hash, c.trace_hash,
            "seeds 42 and 43 ran identically"
        );
        assert_ne!(a.run_hash, c.run_hash);
    }
}

/// With validation switched off (the test-only `skip_validation_for_tests` flag), some
/// seed of the CI range fails, and running that seed again fails identically.
#[test]
fn an_injected_protocol_bug_is_found_and_its_seed_reproduces_it() {
    let bugged = |seed| SimSpec {
        bug: Some(InjectedBug::SkipValidation),
        ..spec(WorkloadKind::SmallBank, seed, "chaos")
    };
    let found = (0..CI_SEEDS).find_map(|s| {
        let r = run(&bugged(s)).unwrap();
        (!r.passed()).then_some(r)
    });
    let r = found.expect("no CI seed caught a protocol without validation");
    eprintln!(
        "injected bug caught by seed {} ({}):\n  {}",
        r.seed,
        r.command,
        r.failures.join("\n  ")
    );
    assert!(r.command.contains("--inject-bug skip-validation"));
    assert!(
        !r.serializable,
        "the serializability checker missed it: {:?}",
        r.failures
    );
    let again = run(&bugged(r.seed)).unwrap();
    assert_eq!(again.failures, r.failures);
    assert_eq!(again.run_hash, r.run_hash);
    // The same seed with the correct protocol passes.
    let fixed = run(&spec(WorkloadKind::SmallBank, r.seed, "chaos")).unwrap();
    assert!(fixed.passed(), "{:?}", fixed.failures);
}

#[test]
fn bad_specs_are_clear_errors() {
    let ok = spec(WorkloadKind::SmallBank, 1, "none");
    for (what, bad) in [
        (
            "nodes",
            SimSpec {
                nodes: 0,
                ..ok.clone()
            },
        ),
        (
            "replication",
            SimSpec {
                replication: 4,
                ..ok.clone()
            },
        ),
        (
            "coroutines",
            SimSpec {
                coroutines: 0,
                ..ok.clone()
            },
        ),
        (
            "threads",
            SimSpec {
                threads: 100,
                ..ok.clone()
            },
        ),
        (
            "scale",
            SimSpec {
                scale: Some(f64::NAN),
                ..ok.clone()
            },
        ),
        (
            "scale",
            SimSpec {
                scale: Some(-1.0),
                ..ok.clone()
            },
        ),
        (
            "tpcc-no",
            SimSpec {
                nodes: 1,
                replication: 1,
                ..spec(WorkloadKind::TpccNo, 1, "none")
            },
        ),
    ] {
        let e = run(&bad).expect_err(what);
        assert!(e.contains(what), "{what}: {e}");
    }
    assert!(FaultProfile::named("meteor").unwrap_err().contains("chaos"));
    assert!("skip".parse::<InjectedBug>().is_err());
}

#[test]
fn one_node_and_many_threads_work_too() {
    for (nodes, threads, r) in [(1, 1, 1), (2, 2, 2), (4, 1, 3)] {
        for w in [WorkloadKind::SmallBank, WorkloadKind::Tpcc] {
            let s = SimSpec {
                nodes,
                threads,
                replication: r,
                ..spec(w, 7, "chaos")
            };
            let rep = run(&s).unwrap();
            assert!(rep.passed(), "{}: {:?}", s.command(), rep.failures);
            assert!(rep.committed > 0, "{}", s.command());
        }
    }
}

#[test]
fn scripted_partitions_and_pauses_happen_when_asked() {
    let s = SimSpec {
        script: vec![
            Scripted::parse("2@0.1..3", false).unwrap(),
            Scripted::parse("0,1@4..4.5", false).unwrap(),
            Scripted::parse("1@0.2..2", true).unwrap(),
        ],
        ..spec(WorkloadKind::SmallBank, 3, "none")
    };
    assert!(s
        .command()
        .ends_with("--partition 2@0.1..3 --partition 0,1@4..4.5 --pause 1@0.2..2"));
    let r = run(&s).unwrap();
    assert!(r.passed(), "{:?}", r.failures);
    assert_eq!((r.partitions, r.pauses), (2, 1));
    assert!(
        r.net.dropped_partition > 0,
        "the scripted partition cut nothing"
    );
    assert!(r.rpc.retransmits > 0);
    // Without the script the same seed runs differently.
    let plain = run(&spec(WorkloadKind::SmallBank, 3, "none")).unwrap();
    assert_ne!(plain.run_hash, r.run_hash);
    for bad in ["2", "2@3..1", "x@1..2", "1@a..2", "1@-1..2", "1@1..inf"] {
        assert!(Scripted::parse(bad, false).is_err(), "{bad}");
    }
    assert!(
        Scripted::parse("0,1@1..2", true).is_err(),
        "a pause of two nodes"
    );
    for bad in ["0,1,2@1..2", "5@1..2"] {
        let s = SimSpec {
            script: vec![Scripted::parse(bad, false).unwrap()],
            ..spec(WorkloadKind::SmallBank, 3, "none")
        };
        assert!(run(&s).unwrap_err().contains("--partition"), "{bad}");
    }
}
