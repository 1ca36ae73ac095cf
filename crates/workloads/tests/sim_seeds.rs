//! The simulator in CI: at least 200 seeds per workload under the `chaos` fault profile
//! must pass every check; every profile passes a few seeds; the same seed gives the same
//! run bit for bit; and a deliberately broken protocol (a test-only flag) is caught by
//! some seed of the CI range, and that seed reproduces the failure exactly.

use ambidex::sim::{command, defaults, FaultProfile, InjectedBug, Scripted, SimReport, PROFILES};
use ambidex::Config;
use ambidex_workloads::WorkloadKind;
use std::time::Instant;

/// One simulated seed of a built-in workload.
fn run(cfg: &Config) -> Result<SimReport, ambidex::sim::SimError> {
    ambidex::sim::run(&ambidex_workloads::registry(), cfg)
}

/// Seeds every workload runs in CI, and the steps of each run.
const CI_SEEDS: u64 = 200;
const CI_STEPS: u64 = 2_000;

fn spec(workload: WorkloadKind, seed: u64, faults: &str) -> Config {
    let mut c = defaults(workload, seed);
    c.sim.steps = CI_STEPS;
    c.sim.faults = faults.into();
    c
}

/// [`spec`] with the DrTM+H Table 4 preset `mode`.
fn spec_mode(workload: WorkloadKind, mode: &str, seed: u64, faults: &str) -> Config {
    with(spec(workload, seed, faults), |c| c.txn.mode = mode.into())
}

/// `c` changed by `f`.
fn with(mut c: Config, f: impl FnOnce(&mut Config)) -> Config {
    f(&mut c);
    c
}

/// Runs `seeds` and fails listing every failing seed with its reproducing command.
fn sweep(workload: WorkloadKind, faults: &str, seeds: std::ops::Range<u64>) -> Vec<SimReport> {
    sweep_mode(workload, "fasst", faults, seeds)
}

/// [`sweep`] under the preset `mode`.
fn sweep_mode(
    workload: WorkloadKind,
    mode: &str,
    faults: &str,
    seeds: std::ops::Range<u64>,
) -> Vec<SimReport> {
    sweep_seeds(workload, mode, faults, seeds)
}

/// Runs `seeds` of `workload` under the preset `mode` and the profile `faults`; every
/// one must pass. Returns the reports.
fn sweep_seeds(
    workload: WorkloadKind,
    mode: &str,
    faults: &str,
    seeds: impl Iterator<Item = u64>,
) -> Vec<SimReport> {
    let t0 = Instant::now();
    let reports: Vec<SimReport> = seeds
        .map(|s| run(&spec_mode(workload, mode, s, faults)).expect("a valid spec"))
        .collect();
    let n = reports.len() as u64;
    let failed: Vec<String> = reports
        .iter()
        .filter(|r| !r.passed())
        .map(SimReport::failure_report)
        .collect();
    let committed: u64 = reports.iter().map(|r| r.committed).sum();
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "{} {mode} {faults}: {n} seeds in {secs:.2} s ({:.0} seeds/s), {:.0} committed per seed, {} partitions, {} pauses",
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
    // Every node's start-up check read every other node's tables one-sided.
    for r in &reports {
        let nodes = r.config.cluster.nodes as u64;
        // (nodes × (nodes − 1) × tables per node)
        let v = r.remote_tables_verified;
        assert!(
            v > 0 && v % (nodes * (nodes - 1)) == 0,
            "seed {}: {v}",
            r.seed
        );
    }
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
    // The one-sided presets send few datagrams (with a one-sided log, no commit RPC
    // goes to backups): a partition may meet only their one-sided operations.
    assert!(
        sum(|r| r.net.dropped_partition + r.net.onesided_partitioned) > 0,
        "no partition cut a datagram or a one-sided operation"
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

/// FaSST's stress workload: groups of keys read, set or deleted whole, under chaos and
/// crashes with the preset cycling; its invariant (a committed read sees a group whole
/// or absent, and so does the final state) holds on every seed. Planted, a protocol
/// without validation is caught by the invariant itself, not only by the history
/// checker.
#[test]
fn stress_ci_seeds_pass_and_catch_a_protocol_without_validation() {
    let presets = ambidex_txn::policy::PRESETS;
    for faults in ["chaos", "crash"] {
        let mut reads = 0;
        for s in 0..CI_SEEDS {
            let mode = presets[s as usize % presets.len()];
            let r = run(&spec_mode(WorkloadKind::Stress, mode, s, faults)).expect("a valid spec");
            assert!(r.passed(), "{}", r.failure_report());
            reads += r.workload_check["committed_reads"].as_u64().unwrap_or(0);
        }
        assert!(reads > 0, "{faults}: no committed read was checked");
    }
    assert!(
        caught_without_validation(WorkloadKind::Stress, "neither whole nor absent").is_some(),
        "no seed's stress invariant caught a protocol without validation"
    );
}

/// The first of seeds 0..20 of `w` (reorder faults, 8,000 steps) whose run with a
/// protocol without validation fails a check whose message contains `needle`, with
/// that message.
fn caught_without_validation(w: WorkloadKind, needle: &str) -> Option<(u64, String)> {
    (0..20).find_map(|seed| {
        let bugged = with(spec(w, seed, "reorder"), |c| {
            c.sim.steps = 8_000;
            c.txn.inject_bug = Some(InjectedBug::SkipValidation);
        });
        let r = run(&bugged).unwrap();
        r.failures
            .iter()
            .find(|f| f.contains(needle))
            .map(|f| (r.seed, f.clone()))
    })
}

/// TPC-E's customer position (DrTM+H §5.5) with the simulator's 5% market feeds:
/// 200 chaos seeds with the preset cycling, crash seeds (50 under FaSST, 30 each under
/// FaRM and DrTM+R, each settling soon after its crash; DrTM+H's are the test below); the
/// workload's invariants (LAST_TRADE volume, every feed seen whole, every row found)
/// hold on every seed, and a protocol without validation is caught by the invariant
/// itself: a committed customer position saw a market feed half applied.
#[test]
fn tpce_ci_seeds_pass_and_catch_a_protocol_without_validation() {
    let presets = ambidex_txn::policy::PRESETS;
    let mut positions = 0;
    for s in 0..CI_SEEDS {
        let mode = presets[s as usize % presets.len()];
        let r = run(&spec_mode(WorkloadKind::Tpce, mode, s, "chaos")).expect("a valid spec");
        assert!(r.passed(), "{}", r.failure_report());
        positions += r.workload_check["committed_positions"]
            .as_u64()
            .unwrap_or(0);
    }
    assert!(positions > 0, "no committed customer position was checked");
    crash_sweep(WorkloadKind::Tpce, "fasst", &(0..50).collect::<Vec<_>>());
    for mode in ["farm", "drtm-r"] {
        settle_soon(mode, &sweep_seeds(WorkloadKind::Tpce, mode, "crash", 0..30));
    }
    let caught = caught_without_validation(WorkloadKind::Tpce, "saw a market feed half applied");
    let (seed, failure) =
        caught.expect("no seed's TPC-E invariant caught a protocol without validation");
    eprintln!("tpce: a protocol without validation caught by seed {seed}: {failure}");
}

/// TPC-E crash seeds under DrTM+H. Once 4 of seeds 0..40 (0, 3, 22, 39) never
/// quiesced: a survivor's passive-ACK install (a market feed's WRITEs and releasing
/// CASes at 10 primaries) was queued on its connection to the crashed node behind ~35
/// operations, and the simulated NIC let each wait out its own give-up time (50 ms) in
/// turn and failed none at the epoch change, so the install, and its coroutine's next
/// transaction waiting for it, ended 1.6-2 s later, past the quiescing budget. Now a
/// timeout fails what is queued behind it and an epoch change fails the old epoch's
/// operations at once (as an RC queue pair in the error state, and as udp does).
#[test]
fn tpce_crash_seeds_pass_under_drtm_h() {
    let r = crash_sweep(WorkloadKind::Tpce, "drtm-h", &(0..100).collect::<Vec<_>>());
    settle_soon("drtm-h", &r);
}

/// Every crash seed settled soon after its crash: no survivor waited out a dead node's
/// one-sided operations one by one (before, FaRM and DrTM+R TPC-E crash seeds ran 1-2 s
/// of simulated time, 0.6 s of wall time each, and DrTM+H's up to the quiescing budget).
fn settle_soon(mode: &str, reports: &[SimReport]) {
    let mut slowest = (0, 0);
    for x in reports {
        assert!(
            !x.crashes.is_empty() && x.cluster.epoch > 1,
            "{mode} seed {}",
            x.seed
        );
        assert!(
            x.sim_time_ns < 250_000_000,
            "{mode} seed {} took {} ms of simulated time: {}",
            x.seed,
            x.sim_time_ns / 1_000_000,
            x.command
        );
        slowest = slowest.max((x.sim_time_ns, x.seed));
    }
    eprintln!(
        "{mode} crash seeds: the slowest took {} ms of simulated time (seed {})",
        slowest.0 / 1_000_000,
        slowest.1
    );
}

/// The transactions' one-sided operations met the profile's faults: lost and
/// retransmitted, executed twice, and every kind of operation of the preset was used.
fn onesided_faults_hit_transactions(mode: &str, reports: &[SimReport]) {
    let sum = |f: fn(&SimReport) -> u64| reports.iter().map(f).sum::<u64>();
    // The start-up check's READs are not the transactions': at most one per remote
    // table, in a calm phase.
    let reads = sum(|r| r.rpc.onesided_reads) - sum(|r| r.remote_tables_verified);
    assert!(reads > 0, "{mode}: no transaction READ");
    assert!(
        sum(|r| r.net.onesided_retransmits) > 0,
        "{mode}: no one-sided op lost"
    );
    assert!(
        sum(|r| r.net.onesided_reexecuted) > 0,
        "{mode}: no one-sided op executed twice"
    );
    let p = ambidex_txn::Policy::preset(mode).unwrap();
    if p.lock == ambidex_txn::policy::Lock::Cas {
        assert!(sum(|r| r.rpc.onesided_cas) > 0, "{mode}: no CAS");
    }
    if p.commit == ambidex_txn::policy::Commit::Write || p.log == ambidex_txn::policy::Log::Write {
        assert!(sum(|r| r.rpc.onesided_writes) > 0, "{mode}: no WRITE");
    }
    if p.uses_location_cache() {
        assert!(
            sum(|r| r.txn_layer.location_cache.hits) > 0,
            "{mode}: the location cache never hit"
        );
    }
}

/// Every one-sided preset under `chaos`: the CI seeds of every workload.
fn preset_sweeps(mode: &str) {
    for w in [
        WorkloadKind::SmallBank,
        WorkloadKind::Tatp,
        WorkloadKind::Tpcc,
        WorkloadKind::ObjectStore,
    ] {
        let r = sweep_mode(w, mode, "chaos", 0..CI_SEEDS);
        faults_were_injected(&r);
        onesided_faults_hit_transactions(mode, &r);
    }
}

#[test]
fn farm_ci_seeds_pass_under_chaos() {
    preset_sweeps("farm");
}

#[test]
fn drtm_r_ci_seeds_pass_under_chaos() {
    preset_sweeps("drtm-r");
}

#[test]
fn drtm_h_ci_seeds_pass_under_chaos() {
    preset_sweeps("drtm-h");
}

#[test]
fn every_profile_passes_a_few_seeds_of_every_workload() {
    for w in [
        WorkloadKind::SmallBank,
        WorkloadKind::Tatp,
        WorkloadKind::Tpcc,
        WorkloadKind::TpccNo,
        WorkloadKind::ObjectStore,
        WorkloadKind::Tpce,
    ] {
        for p in PROFILES {
            sweep(w, p, 1000..1004);
        }
    }
}

#[test]
fn the_same_seed_gives_the_same_run_bit_for_bit() {
    for (w, faults, seed) in [
        (WorkloadKind::SmallBank, "chaos", 42),
        (WorkloadKind::Tpcc, "chaos", 42),
        // Two crashes, the second during the recovery from the first (seed 41 % 7 = 6).
        (WorkloadKind::SmallBank, "crash", 41),
    ] {
        let a = run(&spec(w, seed, faults)).unwrap();
        let b = run(&spec(w, seed, faults)).unwrap();
        if faults == "crash" {
            assert_eq!(a.crashes.len(), 2, "{:?}", a.crashes);
            assert_eq!(a.cluster.epoch, b.cluster.epoch);
        }
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
        let c = run(&spec(w, seed + 1, faults)).unwrap();
        assert_ne!(
            a.trace_hash,
            c.trace_hash,
            "seeds {seed} and {} ran identically",
            seed + 1
        );
        assert_ne!(a.run_hash, c.run_hash);
    }
}

/// With validation switched off (the test-only `skip_validation_for_tests` flag), some
/// seed of the CI range fails under every preset, and running that seed again fails
/// identically.
#[test]
fn an_injected_protocol_bug_is_found_and_its_seed_reproduces_it() {
    for mode in ambidex_txn::policy::PRESETS {
        let bugged = |seed| {
            with(
                spec_mode(WorkloadKind::SmallBank, mode, seed, "chaos"),
                |c| c.txn.inject_bug = Some(InjectedBug::SkipValidation),
            )
        };
        let found = (0..CI_SEEDS).find_map(|s| {
            let r = run(&bugged(s)).unwrap();
            (!r.passed()).then_some(r)
        });
        let r = found
            .unwrap_or_else(|| panic!("{mode}: no CI seed caught a protocol without validation"));
        eprintln!(
            "{mode}: injected bug caught by seed {} ({}):\n  {}",
            r.seed,
            r.command,
            r.failures.join("\n  ")
        );
        assert!(r.command.contains("--inject-bug skip-validation"));
        assert!(
            r.command.contains(mode) || *mode == "fasst",
            "{}",
            r.command
        );
        assert!(
            !r.serializable,
            "{mode}: the serializability checker missed it: {:?}",
            r.failures
        );
        let again = run(&bugged(r.seed)).unwrap();
        assert_eq!(again.failures, r.failures);
        assert_eq!(again.run_hash, r.run_hash);
        // The same seed with the correct protocol passes.
        let fixed = run(&spec_mode(WorkloadKind::SmallBank, mode, r.seed, "chaos")).unwrap();
        assert!(fixed.passed(), "{mode}: {:?}", fixed.failures);
    }
}

#[test]
fn bad_specs_are_clear_errors() {
    let ok = spec(WorkloadKind::SmallBank, 1, "none");
    for (what, bad) in [
        ("nodes", with(ok.clone(), |c| c.cluster.nodes = 0)),
        (
            "replication",
            with(ok.clone(), |c| c.cluster.replication = 4),
        ),
        (
            "coroutines",
            with(ok.clone(), |c| c.run.coroutines = Some(0)),
        ),
        ("threads", with(ok.clone(), |c| c.cluster.threads = 100)),
        ("scale", with(ok.clone(), |c| c.run.scale = Some(f64::NAN))),
        ("scale", with(ok.clone(), |c| c.run.scale = Some(-1.0))),
        (
            "chaos",
            with(ok.clone(), |c| c.sim.faults = "meteor".into()),
        ),
        (
            "nonsense",
            with(ok.clone(), |c| c.txn.mode = "nonsense".into()),
        ),
        ("rto_min_ms", with(ok.clone(), |c| c.rpc.rto_min_ms = 0.0)),
        (
            "tpcc-no",
            with(spec(WorkloadKind::TpccNo, 1, "none"), |c| {
                (c.cluster.nodes, c.cluster.replication) = (1, 1)
            }),
        ),
    ] {
        let e = run(&bad).expect_err(what).to_string();
        assert!(e.contains(what), "{what}: {e}");
    }
    let e = FaultProfile::named("meteor").unwrap_err();
    assert!(
        matches!(&e, ambidex::sim::SimConfigError::UnknownProfile { name } if name == "meteor")
    );
    assert!(e.to_string().contains("chaos"), "{e}");
    assert!("skip".parse::<InjectedBug>().is_err());
}

#[test]
fn one_node_and_many_threads_work_too() {
    for (nodes, threads, r) in [(1, 1, 1), (2, 2, 2), (4, 1, 3)] {
        for w in [WorkloadKind::SmallBank, WorkloadKind::Tpcc] {
            let s = with(spec(w, 7, "chaos"), |c| {
                (c.cluster.nodes, c.cluster.threads, c.cluster.replication) = (nodes, threads, r)
            });
            let rep = run(&s).unwrap();
            assert!(rep.passed(), "{}: {:?}", command(&s), rep.failures);
            assert!(rep.committed > 0, "{}", command(&s));
        }
    }
}

#[test]
fn scripted_partitions_and_pauses_happen_when_asked() {
    let s = with(spec(WorkloadKind::SmallBank, 3, "none"), |c| {
        c.sim.partitions = vec!["2@0.1..3".into(), "0,1@4..4.5".into()];
        c.sim.pauses = vec!["1@0.2..2".into()];
    });
    assert!(command(&s).ends_with("--partition 2@0.1..3 --partition 0,1@4..4.5 --pause 1@0.2..2"));
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
        let s = with(spec(WorkloadKind::SmallBank, 3, "none"), |c| {
            c.sim.partitions = vec![bad.into()]
        });
        assert!(
            run(&s).unwrap_err().to_string().contains("--partition"),
            "{bad}"
        );
    }
}

/// The policy a run used is in its report and in its reproducing command: a preset by
/// `--mode`, any other policy phase by phase. (Only the RPC phases run in this build, so
/// the run uses passive ACK, which they accept; the others are checked by command only.)
#[test]
fn the_policy_is_reported_and_reproduced() {
    use ambidex::config::PassiveAck;
    let s = with(spec(WorkloadKind::SmallBank, 2, "none"), |c| {
        c.txn.passive_ack = Some(PassiveAck::On)
    });
    let r = run(&s).unwrap();
    assert!(r.passed(), "{:?}", r.failures);
    assert_eq!(r.policy.preset, None);
    assert_eq!(r.policy.policy.passive_ack, PassiveAck::On);
    assert!(
        r.command.contains(
            "--execute rpc --lock rpc --validate rpc --log rpc --commit rpc --passive-ack on"
        ),
        "{}",
        r.command
    );
    let j = serde_json::to_value(&r).unwrap();
    for k in [
        "execute",
        "lock",
        "validate",
        "log",
        "commit",
        "passive_ack",
    ] {
        assert!(j["policy"][k].is_string(), "{k}: {}", j["policy"]);
    }
    for k in ["reads", "writes", "cas", "faa", "failed"] {
        assert!(j["one_sided"][k].is_u64(), "{k}: {}", j["one_sided"]);
    }
    for k in ["hits", "misses", "stale"] {
        assert!(
            j["location_cache"][k].is_u64(),
            "{k}: {}",
            j["location_cache"]
        );
    }
    // The start-up check's one-sided READs are counted.
    assert!(r.one_sided.reads > 0, "{:?}", r.one_sided);
    let f = run(&spec(WorkloadKind::SmallBank, 2, "none")).unwrap();
    assert_eq!(f.policy.preset, Some("fasst"));
    assert!(!f.command.contains("--mode") && !f.command.contains("--execute"));
    for p in ["farm", "drtm-r", "drtm-h"] {
        let c = with(spec(WorkloadKind::SmallBank, 2, "none"), |c| {
            c.txn.mode = p.into()
        });
        assert!(
            command(&c).ends_with(&format!("--mode {p}")),
            "{}",
            command(&c)
        );
    }
}

/// Crash seeds of `workload` under `mode`: every seed crashes a node (two for the
/// seeds aiming at recovery), the cluster reconfigures without it and every check
/// passes over the members left. Returns the reports.
fn crash_sweep(workload: WorkloadKind, mode: &str, seeds: &[u64]) -> Vec<SimReport> {
    let r = sweep_seeds(workload, mode, "crash", seeds.iter().copied());
    let mut hits: std::collections::BTreeMap<String, (u32, u32)> = Default::default();
    for x in &r {
        let want = if x
            .crashes
            .first()
            .is_some_and(|c| c.target == "before recovery")
        {
            2
        } else {
            1
        };
        assert_eq!(x.crashes.len(), want, "seed {}: {:?}", x.seed, x.crashes);
        assert!(
            x.cluster.epoch > want as u32,
            "seed {}: {:?}",
            x.seed,
            x.cluster
        );
        for c in &x.crashes {
            assert_eq!(x.cluster.members & (1 << c.node), 0, "seed {}", x.seed);
        }
        let c = x.crashes.last().expect("a crash");
        let h = hits.entry(c.target.clone()).or_default();
        h.0 += c.hit as u32;
        h.1 += 1;
    }
    let sum = |f: fn(&SimReport) -> u64| r.iter().map(f).sum::<u64>();
    eprintln!(
        "{} {mode} crash: phases hit/aimed at {hits:?}; recovery replayed {} records, released {} locks; {} transactions of unknown outcome taken as committed, {} as aborted",
        workload.name(),
        sum(|x| x.recovery.records),
        sum(|x| x.recovery.locks_released),
        sum(|x| x.unknown_committed),
        sum(|x| x.unknown_aborted),
    );
    // Every phase a coordinator waits in was hit by some seed (the lock phase only
    // exists where locks are not taken at execute; the backups' commit step of DrTM+R
    // was never seen waiting: not a target it can be crashed in by this profile).
    let p = ambidex_txn::Policy::preset(mode).unwrap();
    for (target, (hit, _)) in &hits {
        if (target == "lock" && p.lock_at_execute())
            || (target == "commit_backup" && mode != "fasst")
        {
            continue;
        }
        assert!(
            *hit > 0,
            "{mode}: no seed crashed a node in {target}: {hits:?}"
        );
    }
    assert!(sum(|x| x.recovery.records) > 0);
    r
}

/// The issue's crash seeds: 200 per workload (SmallBank, TATP, the object store), the
/// preset cycling with the seed over the four of DrTM+H Table 4 (50 seeds each, while
/// the phase aimed at cycles over seven: every preset meets every target). TPC-C's
/// crash seeds are its own test (its ordered indexes). See `docs/simulation.md`.
fn crash_seeds_of_every_preset(workload: WorkloadKind) {
    let presets = ambidex_txn::policy::PRESETS;
    for (i, mode) in presets.iter().enumerate() {
        let seeds: Vec<u64> = (0..CI_SEEDS)
            .filter(|s| s % presets.len() as u64 == i as u64)
            .collect();
        crash_sweep(workload, mode, &seeds);
    }
}

#[test]
fn smallbank_ci_seeds_pass_under_crashes() {
    crash_seeds_of_every_preset(WorkloadKind::SmallBank);
}

#[test]
fn tatp_ci_seeds_pass_under_crashes() {
    crash_seeds_of_every_preset(WorkloadKind::Tatp);
}

#[test]
fn object_store_ci_seeds_pass_under_crashes() {
    crash_seeds_of_every_preset(WorkloadKind::ObjectStore);
}

/// With 5 nodes a crash leaves partitions short of copies that the survivors can
/// hold: each gets a syncing backup that its primary copies into while transactions go
/// on (paced). The run quiesces only once every copy is synced, and the replica check
/// then compares them with their primaries. 100 seeds each of SmallBank and TATP, the
/// preset cycling (with 3 nodes and R = 3 no copy is ever made after a crash).
#[test]
fn five_node_crash_seeds_rereplicate_and_pass() {
    let presets = ambidex_txn::policy::PRESETS;
    for w in [WorkloadKind::SmallBank, WorkloadKind::Tatp] {
        let t0 = Instant::now();
        let mut copied = 0;
        for s in 0..100u64 {
            let mode = presets[s as usize % presets.len()];
            let c = with(spec_mode(w, mode, s, "crash"), |c| c.cluster.nodes = 5);
            let r = run(&c).expect("a valid spec");
            assert!(r.passed(), "{}", r.failure_report());
            assert!(
                r.cluster.events.iter().any(|e| e.contains("Rereplicated")),
                "{mode} seed {s}: copies never synced: {:?}",
                r.cluster
            );
            copied += r.recovery.items_copied;
        }
        eprintln!(
            "{} 5 nodes crash: 100 seeds in {:.1} s, {copied} items copied",
            w.name(),
            t0.elapsed().as_secs_f64()
        );
        assert!(copied > 0);
    }
}

/// Five nodes, crash-restart: the restarted node rejoins a cluster that keeps running
/// without it, is copied to (the crash made it short of copies), and its start-up check
/// passes once it runs. 60 seeds each of SmallBank and TATP, the preset cycling. Before
/// the simulator waited for the rejoined node's check, about 1 seed in 5 ended first
/// and failed with "stopped before it joined the cluster".
#[test]
fn five_node_crash_restart_seeds_rejoin_and_pass() {
    let presets = ambidex_txn::policy::PRESETS;
    for w in [WorkloadKind::SmallBank, WorkloadKind::Tatp] {
        let mut rejoined = 0;
        for s in 0..60u64 {
            let mode = presets[s as usize % presets.len()];
            let c = with(spec_mode(w, mode, s, "crash-restart"), |c| {
                c.cluster.nodes = 5
            });
            let r = run(&c).expect("a valid spec");
            assert!(r.passed(), "{}", r.failure_report());
            rejoined += r
                .restarts
                .iter()
                .filter(|x| x.rejoined_at_ns.is_some() && x.remote_tables_verified > 0)
                .count();
        }
        assert!(
            rejoined >= 30,
            "{}: {rejoined} of 60 rejoined and checked",
            w.name()
        );
    }
}

/// A node cut off for 2–3× the give-up time is suspected (by its RPCs' give-up, or its
/// one-sided operations' timeouts under the one-sided presets), removed and fenced, and
/// stays out once the partition heals; the others run on and every check passes over
/// them. 40 seeds per workload, the preset cycling with the seed.
#[test]
fn a_node_cut_off_past_the_give_up_time_is_removed_and_stays_out() {
    let presets = ambidex_txn::policy::PRESETS;
    for w in [WorkloadKind::SmallBank, WorkloadKind::Tatp] {
        for (i, mode) in presets.iter().enumerate() {
            let seeds = (0..40u64).filter(|s| s % presets.len() as u64 == i as u64);
            let r = sweep_seeds(w, mode, "long-partition", seeds);
            for x in &r {
                let (node, from, until) = x.long_partition.expect("a long partition");
                let give_up = x.config.rpc.give_up_ms * 1e6;
                assert!((until - from) as f64 >= 2.0 * give_up, "seed {}", x.seed);
                assert_eq!(
                    x.cluster.members & (1 << node),
                    0,
                    "{mode} seed {}: {:?}",
                    x.seed,
                    x.cluster
                );
                assert_eq!(
                    x.cluster.epoch, 2,
                    "{mode} seed {}: {:?}",
                    x.seed, x.cluster
                );
                assert!(
                    x.cluster.events.iter().any(|e| e.contains("Revoked")),
                    "{mode} seed {}: {:?}",
                    x.seed,
                    x.cluster.events
                );
            }
        }
    }
}

/// With recovery dropping a dead coordinator's log records (the test-only
/// `recovery-skips-dead-coordinators` bug), some crash seed of the CI range fails, and
/// running it again fails identically; the correct protocol passes it.
#[test]
fn a_recovery_bug_is_found_by_a_crash_seed_and_its_seed_reproduces_it() {
    let bugged = |seed| {
        with(spec(WorkloadKind::SmallBank, seed, "crash"), |c| {
            c.txn.inject_bug = Some(InjectedBug::RecoverySkipsDeadCoordinators)
        })
    };
    let r = (0..CI_SEEDS)
        .find_map(|s| {
            let r = run(&bugged(s)).unwrap();
            (!r.passed()).then_some(r)
        })
        .expect("no crash seed caught recovery dropping a dead coordinator's records");
    eprintln!(
        "recovery bug caught by seed {} ({}):\n  {}",
        r.seed,
        r.command,
        r.failures.join("\n  ")
    );
    assert!(r
        .command
        .contains("--faults crash --inject-bug recovery-skips-dead-coordinators"));
    let again = run(&bugged(r.seed)).unwrap();
    assert_eq!(again.failures, r.failures);
    assert_eq!(again.run_hash, r.run_hash);
    let fixed = run(&spec(WorkloadKind::SmallBank, r.seed, "crash")).unwrap();
    assert!(fixed.passed(), "{:?}", fixed.failures);
}
