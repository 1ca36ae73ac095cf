//! Restarts in the simulator (issue 18): under the `crash-restart` profile every seed
//! crashes a node in a protocol phase (or two, the second during the recovery from the
//! first), restarts each as a new incarnation with a fresh empty database, and the run
//! goes on until it is a member again with every copy up to date; then every check
//! passes over the final members, the restarted ones included.

use ambidex_sim::{defaults, run, SimReport};
use ambidex_workloads::{Config, WorkloadKind};
use std::time::Instant;

const CI_STEPS: u64 = 2_000;

fn spec(workload: WorkloadKind, seed: u64) -> Config {
    let mut c = defaults(workload, seed);
    c.sim.steps = CI_STEPS;
    c.sim.faults = "crash-restart".into();
    c
}

fn one(workload: WorkloadKind, seed: u64) -> SimReport {
    run(&spec(workload, seed)).unwrap()
}

#[test]
fn probe() {
    let w = match std::env::var("W").as_deref() {
        Ok("tatp") => WorkloadKind::Tatp,
        Ok("objstore") => WorkloadKind::ObjectStore,
        _ => WorkloadKind::SmallBank,
    };
    let n: u64 = std::env::var("N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let t0 = Instant::now();
    let mut bad = 0;
    for seed in 0..n {
        let r = one(w, seed);
        if !r.passed() {
            bad += 1;
            eprintln!(
                "seed {seed} FAILED: {:?}\n  crashes {:?}\n  restarts {:?}\n  events {:?}",
                r.failures, r.crashes, r.restarts, r.cluster.events
            );
        } else {
            eprintln!(
                "seed {seed} ok: restarts {:?} steps {} sim {} ms",
                r.restarts,
                r.steps,
                r.sim_time_ns / 1_000_000
            );
        }
    }
    eprintln!("{bad} failed of {n} in {:?}", t0.elapsed());
}
