//! The driver tries a transaction aborted by a conflict again from the same inputs (as
//! the papers' drivers do), and draws a new one when `run.retry_aborts` is off.
//!
//! The workload here writes one of two hot keys, so its transactions conflict often;
//! every attempt records the input it drew, and the worker's sequence of attempts shows
//! whether an aborted attempt was followed by the same input.

use ambidex::bench::lost::Txn;
use ambidex::bench::run_workload;
use ambidex::workload::{Outcome, Workload};
use ambidex::Config;
use ambidex_txn::runner::WorkerCtx;
use ambidex_txn::{AbortReason, TableSpec, WriteKind};
use ambidex_workloads::common::Loader;
use rand::rngs::SmallRng;
use rand::Rng;
use std::sync::{Arc, Mutex};

const HOT: u32 = 90;

/// Every worker's attempts, in order: (input drawn, how it ended).
#[derive(Default)]
struct Hot {
    attempts: Mutex<Vec<Vec<(u64, Outcome)>>>,
}

impl Workload for Hot {
    type Local = Vec<(u64, Outcome)>;

    fn name(&self) -> &'static str {
        "hot"
    }

    fn tables(&self) -> Vec<TableSpec> {
        vec![TableSpec {
            id: HOT,
            name: "hot".into(),
            value_size: 8,
            capacity_per_node: 1024,
        }]
    }

    fn txn_types(&self) -> &'static [&'static str] {
        &["increment"]
    }

    fn load_units(&self) -> u64 {
        1
    }

    fn load_unit(
        &self,
        _: u64,
        _: &mut SmallRng,
        out: &Loader<'_>,
    ) -> Result<(), ambidex::workload::WorkloadError> {
        for k in 0..2 {
            out.put(HOT, k, &0u64.to_le_bytes())?;
        }
        Ok(())
    }

    async fn run_one(
        &self,
        w: &WorkerCtx,
        rng: &mut SmallRng,
        local: &mut Self::Local,
    ) -> (usize, Outcome) {
        let input: u64 = rng.gen();
        let mut t = Txn::begin(&w.ctx, &w.th);
        let it = t.write(HOT, input % 2, WriteKind::Update);
        let outcome = match t.execute().await {
            Err(r) => Outcome::Aborted(r),
            Ok(()) => {
                let v = u64::from_le_bytes(t.get(it).expect("loaded").try_into().unwrap());
                t.set(it, &(v + 1).to_le_bytes());
                match t.commit().await {
                    Ok(_) => Outcome::FOUND,
                    Err(r) => Outcome::Aborted(r),
                }
            }
        };
        local.push((input, outcome));
        (0, outcome)
    }

    fn finish_worker(&self, local: Self::Local) {
        self.attempts.lock().unwrap().push(local);
    }
}

/// Runs the hot workload; returns (aborted attempts followed by the same input,
/// aborted attempts followed by another) and the report's retries.
fn run(retry: bool) -> (usize, usize, u64) {
    let mut c = Config::default();
    c.cluster.manager = ambidex::config::ManagerKind::None;
    c.run.coroutines = Some(6);
    c.run.duration_s = 0.4;
    c.run.warmup_s = 0.1;
    c.run.retry_aborts = retry;
    let wl = Arc::new(Hot::default());
    let r = run_workload(&c, wl.clone()).unwrap();
    assert!(r.committed > 100, "{} committed", r.committed);
    let (mut same, mut other) = (0, 0);
    for worker in wl.attempts.lock().unwrap().iter() {
        for pair in worker.windows(2) {
            let ((a, first), (b, _)) = (pair[0], pair[1]);
            if let Outcome::Aborted(reason) = first {
                assert!(reason.is_transient(), "{reason:?}");
                assert_ne!(reason, AbortReason::User);
                if a == b {
                    same += 1;
                } else {
                    other += 1;
                }
            }
        }
    }
    (same, other, r.retries)
}

#[test]
fn an_aborted_transaction_is_tried_again_from_the_same_inputs() {
    let (same, other, retries) = run(true);
    assert!(same > 10, "{same} retries seen");
    // A transaction given up after MAX_ATTEMPTS is the only way to another input.
    assert!(other * 10 <= same, "{other} aborts followed by a new input");
    assert!(retries > 0);
}

#[test]
fn without_retries_every_abort_is_followed_by_a_new_draw() {
    let (same, other, retries) = run(false);
    assert!(other > 10, "{other} aborts seen");
    assert_eq!(same, 0);
    assert_eq!(retries, 0);
}
