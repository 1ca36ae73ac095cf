//! TPC-C at the default scale: 72 warehouses of a 3-node cluster, each run loads
//! hundreds of thousands of rows, so it has a test binary of its own (cargo runs test
//! binaries one after another: it does not starve the short runs of `workloads.rs`).

use ambidex::Config;
use ambidex_workloads::WorkloadKind;

/// A benchmark run of a built-in workload.
fn run_bench(
    cfg: &ambidex::Config,
) -> Result<ambidex::bench::BenchReport, ambidex::bench::BenchError> {
    ambidex::bench::run_bench(&ambidex_workloads::registry(), cfg)
}

/// TPC-C as the papers run it (24 warehouses per node, every coroutine a terminal with
/// its own home warehouses, the full mix): conflicts are the benchmark's own, under 10%
/// of attempts; with one warehouse per node shared by the coroutines (the old default)
/// most attempts conflicted. The report counts attempts and commits both.
#[test]
fn tpcc_at_the_default_scale_conflicts_rarely_and_reports_attempts() {
    let mut c = Config::default();
    c.run.workload = WorkloadKind::Tpcc.into();
    c.run.duration_s = 1.0;
    c.run.warmup_s = 0.2;
    // The default warehouses and coroutines; each warehouse a fifth of the default
    // population (items, customers), which keeps this test's memory and load time low
    // and leaves the conflicts as they are (they come from warehouses and terminals).
    c.run.scale = Some(0.02);
    let r = run_bench(&c).unwrap();
    assert_eq!(r.check["warehouses"], 72, "{}", r.check);
    assert_eq!(r.consistency_ok, Some(true), "{}", r.check);
    assert!(r.committed > 1_000, "{} committed", r.committed);
    assert!(
        r.conflict_abort_rate < 0.10,
        "conflict abort rate {:.3}: {:?}",
        r.conflict_abort_rate,
        r.aborts_by_reason
    );
    assert_eq!(r.attempts, r.committed + r.aborted);
    let per_type_retries: u64 = r.per_type.values().map(|t| t.retries).sum();
    assert_eq!(r.retries, per_type_retries);

    c.run.warehouses_per_node = Some(1);
    let shared = run_bench(&c).unwrap();
    assert_eq!(shared.consistency_ok, Some(true), "{}", shared.check);
    assert!(
        shared.conflict_abort_rate > 0.3,
        "one shared warehouse per node: conflict abort rate {:.3}",
        shared.conflict_abort_rate
    );
    // Conflicts are retried, each counted as an attempt.
    assert!(shared.retries > 0 && shared.attempts > shared.committed);
}
