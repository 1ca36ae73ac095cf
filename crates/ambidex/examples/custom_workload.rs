//! A workload of one's own, benchmarked and simulated exactly as the built-in ones:
//! counters that transactions increment (read-modify-write of one key) or read in
//! pairs, with the invariant that the counters add up to the increments committed.
//!
//! It implements `ambidex::workload::Workload` (tables, loader, transaction mix, check),
//! registers it under a name, and runs it through the benchmark driver (a 3-node
//! in-process cluster, `ambidex bench`'s report) and through the deterministic simulator
//! (seeds with faults; the history checked for serializability, replicas compared, the
//! invariant checked). Linking `ambidex-cli` too gives it the whole command line:
//! with arguments, this program is `ambidex` with one more workload
//! (`ambidex_cli::main_with`).
//!
//! `cargo run --release --example custom_workload` (the benchmark and 5 seeds), or
//! `cargo run --release --example custom_workload -- bench --workload counters` (any
//! `ambidex` command: `sim --workload counters --seeds 0..100`, `bench --help`...).

use ambidex::schema::per_node_capacity;
use ambidex::workload::{
    primary_rows, Loader, NodeDb, Outcome, Placement, Registrar, Registry, TableSpec, Txn,
    WorkerCtx, Workload, WorkloadArgs, WorkloadError, WorkloadInfo, WriteKind,
};
use ambidex::Config;
use rand::rngs::SmallRng;
use rand::Rng;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

const COUNTERS: u32 = 0;

struct Counters {
    placement: Placement,
    keys: u64,
    /// Increments committed, folded in from every worker.
    increments: AtomicI64,
}

/// What one worker coroutine counted and has not folded in yet.
#[derive(Default)]
struct Local {
    increments: i64,
}

/// The invariant broken: the counters do not add up to the increments committed.
#[derive(Debug, thiserror::Error)]
#[error("{counters} counters add up to {sum}, but {increments} increments committed")]
struct Miscounted {
    counters: usize,
    sum: i64,
    increments: i64,
}

fn counter(b: Option<&[u8]>) -> i64 {
    b.and_then(|b| b.try_into().ok())
        .map_or(0, i64::from_le_bytes)
}

impl Workload for Counters {
    type Local = Local;

    fn name(&self) -> &'static str {
        "counters"
    }

    fn tables(&self) -> Vec<TableSpec> {
        vec![TableSpec {
            id: COUNTERS,
            name: "counters".into(),
            value_size: 8,
            capacity_per_node: per_node_capacity(self.keys, &self.placement),
        }]
    }

    fn txn_types(&self) -> &'static [&'static str] {
        &["increment", "read_pair"]
    }

    fn load_units(&self) -> u64 {
        1
    }

    fn load_unit(
        &self,
        _unit: u64,
        _rng: &mut SmallRng,
        out: &Loader<'_>,
    ) -> Result<(), WorkloadError> {
        for k in 0..self.keys {
            out.put(COUNTERS, k, &0i64.to_le_bytes())?;
        }
        Ok(())
    }

    async fn run_one(
        &self,
        w: &WorkerCtx,
        rng: &mut SmallRng,
        local: &mut Local,
    ) -> (usize, Outcome) {
        let (a, b) = (rng.gen_range(0..self.keys), rng.gen_range(0..self.keys));
        let mut t = Txn::begin(&w.ctx, &w.th);
        if rng.gen_bool(0.5) {
            let c = t.write(COUNTERS, a, WriteKind::Update);
            if let Err(r) = t.execute().await {
                return (0, Outcome::Aborted(r));
            }
            let v = counter(t.get(c)) + 1;
            t.set(c, &v.to_le_bytes());
            match t.commit().await {
                Ok(_) => {
                    local.increments += 1;
                    (0, Outcome::FOUND)
                }
                Err(r) => (0, Outcome::Aborted(r)),
            }
        } else {
            t.read(COUNTERS, a);
            t.read(COUNTERS, b);
            if let Err(r) = t.execute().await {
                return (1, Outcome::Aborted(r));
            }
            match t.commit().await {
                Ok(_) => (1, Outcome::FOUND),
                Err(r) => (1, Outcome::Aborted(r)),
            }
        }
    }

    fn fold_worker(&self, local: &mut Local) {
        let n = std::mem::take(&mut local.increments);
        self.increments.fetch_add(n, Ordering::SeqCst);
    }

    fn finish_worker(&self, mut local: Local) {
        self.fold_worker(&mut local);
    }

    /// An increment whose coordinator died and that recovery committed.
    fn committed_by_recovery(&self, _table: u32, old: Option<&[u8]>, new: Option<&[u8]>) {
        self.increments
            .fetch_add(counter(new) - counter(old), Ordering::SeqCst);
    }

    fn check(&self, dbs: &[Arc<NodeDb>]) -> Result<serde_json::Value, WorkloadError> {
        let rows = primary_rows(dbs, COUNTERS);
        let sum: i64 = rows.iter().map(|(_, v)| counter(Some(v))).sum();
        let increments = self.increments.load(Ordering::SeqCst);
        if rows.len() as u64 != self.keys || sum != increments {
            return Err(Miscounted {
                counters: rows.len(),
                sum,
                increments,
            }
            .into());
        }
        Ok(serde_json::json!({ "counters": rows.len(), "sum": sum }))
    }
}

/// Registers the workload: its name, defaults, and how a configuration builds it.
fn register(r: &mut impl Registrar) {
    r.add(
        WorkloadInfo {
            name: "counters",
            aliases: &[],
            about: "counters incremented or read in pairs; they add up to the increments",
            default_coroutines: 8,
            default_scale: 1.0,
            // 16 counters: a seed's few hundred transactions really conflict.
            sim_scale: 0.0016,
        },
        |a: &WorkloadArgs<'_>| {
            Ok(Counters {
                placement: a.placement.clone(),
                keys: ((10_000.0 * a.scale) as u64).max(16),
                increments: AtomicI64::new(0),
            })
        },
    );
}

/// The built-in workloads and this one.
fn registry() -> Registry {
    let mut registry = Registry::new();
    ambidex_workloads::register(&mut registry);
    register(&mut registry);
    registry
}

fn main() -> std::process::ExitCode {
    if std::env::args().len() > 1 {
        return ambidex_cli::main_with(registry());
    }
    match demo() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("custom_workload: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The benchmark and the simulator, called from code.
fn demo() -> Result<(), Box<dyn std::error::Error>> {
    let registry = registry();

    // The benchmark: 3 nodes in this process, every counter on 3 of them.
    let mut cfg = Config::default();
    cfg.run.workload = "counters".into();
    (cfg.run.duration_s, cfg.run.warmup_s) = (0.5, 0.1);
    let r = ambidex::bench::run_bench(&registry, &cfg)?;
    println!(
        "bench: {} committed/s ({} per CPU-second), p50 {:.0} µs, invariant {:?}: {}",
        r.committed_per_s as u64,
        r.committed_per_cpu_s as u64,
        r.latency_us.p50,
        r.invariant_ok,
        r.check
    );
    if r.invariant_ok != Some(true) {
        return Err("the counters' invariant failed".into());
    }

    // The simulator: seeds of the whole cluster in one thread, with network faults.
    for seed in 1..=5 {
        let sim = ambidex::sim::defaults("counters", seed);
        let s = ambidex::sim::run(&registry, &sim)?;
        println!(
            "sim seed {seed}: {} committed, serializable {}, check {}",
            s.committed, s.serializable, s.workload_check
        );
        if !s.passed() {
            return Err(s.failure_report().into());
        }
    }
    Ok(())
}

#[test]
fn runs() {
    demo().unwrap();
    // The command line, as `custom_workload bench --workload counters` runs it.
    let args = [
        "ambidex",
        "bench",
        "--workload",
        "counters",
        "--duration",
        "0.3",
        "--warmup",
        "0",
    ];
    assert_eq!(
        ambidex_cli::main_with_args(registry(), args),
        std::process::ExitCode::SUCCESS
    );
}
