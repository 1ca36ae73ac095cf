//! Restarts in the simulator (issue 18): under the `crash-restart` profile every seed
//! crashes a node in a protocol phase (or two, the second during the recovery from the
//! first) and restarts each as a new incarnation with a fresh empty database, some
//! before the manager removed the crashed incarnation, the others 1-4 leases after.
//! The run goes on until each is a member again with every copy up to date, and a
//! while longer; then every check passes over the final members, the restarted ones
//! included (their copies equal their primaries, the history checker accepts, the
//! workload's invariant holds, no lock is held). 200 seeds per workload, the preset
//! cycling with the seed over the four of DrTM+H Table 4; TPC-C is left out (a
//! rejoined node gets none of its warehouses back).

use ambidex::sim::{defaults, InjectedBug, SimReport};
use ambidex::Config;
use ambidex_workloads::WorkloadKind;
use std::time::Instant;

/// One simulated seed of a built-in workload.
fn run(cfg: &ambidex::Config) -> Result<ambidex::sim::SimReport, ambidex::sim::SimError> {
    ambidex::sim::run(&ambidex_workloads::registry(), cfg)
}

const CI_SEEDS: u64 = 200;
const CI_STEPS: u64 = 2_000;

fn spec(workload: WorkloadKind, seed: u64) -> Config {
    let mut c = defaults(workload, seed);
    c.sim.steps = CI_STEPS;
    c.sim.faults = "crash-restart".into();
    let presets = ambidex_txn::policy::PRESETS;
    c.txn.mode = presets[(seed % presets.len() as u64) as usize].into();
    c
}

/// Runs `seeds` and fails listing every failing seed with its reproducing command;
/// checks what every seed must show of its restarts, and returns the reports.
fn restart_sweep(workload: WorkloadKind, seeds: std::ops::Range<u64>) -> Vec<SimReport> {
    let t0 = Instant::now();
    let reports: Vec<SimReport> = seeds
        .map(|s| run(&spec(workload, s)).expect("a valid spec"))
        .collect();
    let failed: Vec<String> = reports
        .iter()
        .filter(|r| !r.passed())
        .map(|r| format!("seed {}: {:?}\n  {}", r.seed, r.failures, r.command))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} {} seeds failed:\n{}",
        failed.len(),
        reports.len(),
        workload.name(),
        failed.join("\n")
    );
    let (mut early, mut late, mut two) = (0, 0, 0);
    let mut gap_ms = Vec::new();
    for r in &reports {
        let seed = r.seed;
        assert_eq!(
            r.restarts.len(),
            r.crashes.len(),
            "seed {seed}: every crashed node restarts: {:?} {:?}",
            r.crashes,
            r.restarts
        );
        assert!(!r.crashes.is_empty(), "seed {seed}: no crash");
        two += (r.crashes.len() == 2) as u32;
        for x in &r.restarts {
            let (Some(rejoined), Some(synced)) = (x.rejoined_at_ns, x.rereplicated_at_ns) else {
                panic!(
                    "seed {seed}: node {} never rejoined or never synced: {x:?}",
                    x.node
                );
            };
            assert_eq!(x.incarnation, 2, "seed {seed}: {x:?}");
            assert!(x.remote_tables_verified > 0, "seed {seed}: {x:?}");
            assert!(
                x.at_ns < rejoined && rejoined <= synced,
                "seed {seed}: {x:?}"
            );
            assert_ne!(
                r.cluster.members & (1 << x.node),
                0,
                "seed {seed}: node {} is a member at the end",
                x.node
            );
            // Removed (by its lease, or because it restarted), then admitted.
            assert!(
                x.removed_at_ns.is_some_and(|t| t <= rejoined),
                "seed {seed}: {x:?}"
            );
            if x.before_removal {
                early += 1;
            } else {
                late += 1;
            }
            gap_ms.push((synced - x.at_ns) as f64 / 1e6);
        }
        // A removal and an admission at least (two crashes' removals, or their
        // restarts' admissions, may come in one reconfiguration).
        assert!(r.cluster.epoch >= 3, "seed {seed}: {:?}", r.cluster);
    }
    let committed: u64 = reports
        .iter()
        .flat_map(|r| &r.restarts)
        .map(|x| x.committed)
        .sum();
    gap_ms.sort_by(f64::total_cmp);
    eprintln!(
        "{} crash-restart: {} seeds in {:.1} s; restarts before removal {early}, after {late}, \
         seeds with two {two}; restart to every copy synced: median {:.1} ms, max {:.1} ms \
         (simulated); restarted incarnations committed {committed}",
        workload.name(),
        reports.len(),
        t0.elapsed().as_secs_f64(),
        gap_ms[gap_ms.len() / 2],
        gap_ms[gap_ms.len() - 1],
    );
    assert!(
        early > 0 && late > 0,
        "restarts before removal {early}, after {late}"
    );
    assert!(two > 0, "no seed restarted two nodes");
    assert!(
        committed > 0,
        "no restarted incarnation committed a transaction"
    );
    reports
}

#[test]
fn smallbank_ci_seeds_pass_under_restarts() {
    restart_sweep(WorkloadKind::SmallBank, 0..CI_SEEDS);
}

#[test]
fn tatp_ci_seeds_pass_under_restarts() {
    restart_sweep(WorkloadKind::Tatp, 0..CI_SEEDS);
}

#[test]
fn object_store_ci_seeds_pass_under_restarts() {
    restart_sweep(WorkloadKind::ObjectStore, 0..CI_SEEDS);
}

/// A restart seed with two crashes and two restarts (seed 6 % 7 aims at recovery) and
/// one with one are the same run bit for bit when run again.
#[test]
fn a_restart_seed_gives_the_same_run_bit_for_bit() {
    for seed in [6, 0] {
        let a = run(&spec(WorkloadKind::SmallBank, seed)).unwrap();
        let b = run(&spec(WorkloadKind::SmallBank, seed)).unwrap();
        assert!(a.passed(), "{:?}", a.failures);
        assert!(!a.restarts.is_empty());
        assert_eq!(a.restarts.len(), if seed == 6 { 2 } else { 1 });
        assert_eq!(
            (&a.trace_hash, &a.state_digest, &a.run_hash),
            (&b.trace_hash, &b.state_digest, &b.run_hash)
        );
    }
}

/// With the `joiner-serves-old-epoch` bug (a node restarted before its crashed
/// incarnation was removed starts in the configuration that still has that
/// incarnation as a member, so it answers that epoch's reads from its empty store),
/// some CI seed fails, and its command reproduces the failure exactly; without the bug
/// the seed passes.
#[test]
fn a_joiner_serving_its_old_incarnations_epoch_is_caught() {
    let bugged = |seed| {
        let mut c = spec(WorkloadKind::SmallBank, seed);
        c.txn.inject_bug = Some(InjectedBug::JoinerServesOldEpoch);
        c
    };
    let r = (0..CI_SEEDS)
        .map(|s| run(&bugged(s)).unwrap())
        .find(|r| !r.passed())
        .expect("no seed caught a joiner serving its old incarnation's epoch");
    eprintln!(
        "seed {} caught it: {:?}\n  {}",
        r.seed, r.failures, r.command
    );
    assert!(
        r.restarts.iter().any(|x| x.before_removal),
        "{:?}",
        r.restarts
    );
    assert!(r
        .command
        .contains("--faults crash-restart --inject-bug joiner-serves-old-epoch"));
    let again = run(&bugged(r.seed)).unwrap();
    assert_eq!(again.run_hash, r.run_hash);
    assert_eq!(again.failures, r.failures);
    let fixed = run(&spec(WorkloadKind::SmallBank, r.seed)).unwrap();
    assert!(fixed.passed(), "{:?}", fixed.failures);
}
