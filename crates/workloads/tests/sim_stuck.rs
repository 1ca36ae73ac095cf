//! A coroutine that never finishes is reported as stuck, by node, thread and coroutine,
//! instead of hanging the simulator.

use ambidex::sim::{defaults, run_with};
use ambidex_txn::runner::WorkerCtx;
use ambidex_txn::TableSpec;
use ambidex_workloads::common::{Loader, Outcome, Workload};
use ambidex_workloads::WorkloadKind;
use rand::rngs::SmallRng;
use std::sync::Arc;

/// Coroutine 1 of node 2 waits forever in its first transaction; the others do nothing.
struct Hang;

impl Workload for Hang {
    type Local = ();
    fn name(&self) -> &'static str {
        "hang"
    }
    fn tables(&self) -> Vec<TableSpec> {
        vec![TableSpec {
            id: 1,
            name: "t".into(),
            value_size: 8,
            capacity_per_node: 16,
        }]
    }
    fn txn_types(&self) -> &'static [&'static str] {
        &["wait"]
    }
    fn load_units(&self) -> u64 {
        0
    }
    fn load_unit(
        &self,
        _: u64,
        _: &mut SmallRng,
        _: &Loader<'_>,
    ) -> Result<(), ambidex::workload::WorkloadError> {
        Ok(())
    }
    async fn run_one(&self, w: &WorkerCtx, _: &mut SmallRng, _: &mut ()) -> (usize, Outcome) {
        if (w.node, w.coroutine) == (2, 1) {
            std::future::pending::<()>().await;
        }
        (0, Outcome::FOUND)
    }
}

#[test]
fn a_coroutine_that_never_returns_is_reported_stuck() {
    let mut spec = defaults(WorkloadKind::SmallBank, 1);
    spec.sim.steps = 200;
    spec.sim.faults = "none".into();
    let r = run_with(&spec, Arc::new(Hang)).unwrap();
    assert!(!r.passed());
    assert_eq!(r.failures.len(), 1, "{:?}", r.failures);
    let f = &r.failures[0];
    assert!(
        f.contains("1 coroutine(s) stuck [node 2 thread 0 coroutine 1]"),
        "{f}"
    );
}
