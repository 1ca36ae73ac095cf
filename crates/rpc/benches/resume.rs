//! Cost of resuming a worker coroutine (FaSST §4.1 measures 13–20 ns with Boost).
//! `cargo bench -p ambidex-rpc --bench resume`
//!
//! Each coroutine loops on `yield_now()`, which takes the same path as an RPC completion
//! (the master queues the worker, then polls its future). One `poll_once` resumes every
//! coroutine once and also polls the (empty) endpoint once, so with K coroutines the
//! endpoint poll is amortised over K resumes; "executor only" subtracts it.

use ambidex_rpc::{Runtime, RuntimeConfig};
use ambidex_transport::local::LocalFabric;
use ambidex_transport::ClusterConfig;
use std::time::Instant;

fn measure(coroutines: u16, rounds: u32) -> (f64, f64) {
    let fabric = LocalFabric::new(ClusterConfig::new(1, 1)).unwrap();
    let mut rt = Runtime::new(
        fabric.node(0).endpoint(0).unwrap(),
        RuntimeConfig::default(),
    )
    .unwrap();
    for _ in 0..coroutines {
        rt.spawn(move |ctx| async move {
            for _ in 0..rounds {
                ctx.yield_now().await;
            }
        });
    }
    rt.poll_once(); // first run of each coroutine
    let t0 = Instant::now();
    let mut steps = 0u64;
    while rt.live_tasks() > 0 {
        rt.poll_once();
        steps += 1;
    }
    let total = t0.elapsed().as_nanos() as f64;
    // The same number of steps with nothing to resume: the master's own cost.
    let t1 = Instant::now();
    for _ in 0..steps {
        rt.poll_once();
    }
    let empty = t1.elapsed().as_nanos() as f64;
    let resumes = coroutines as f64 * rounds as f64;
    (total / resumes, (total - empty) / resumes)
}

fn main() {
    for k in [1u16, 20, 100] {
        let rounds = 2_000_000 / k as u32;
        let mut best = (f64::MAX, f64::MAX);
        for _ in 0..3 {
            let m = measure(k, rounds);
            if m.0 < best.0 {
                best = m;
            }
        }
        println!(
            "coroutines={k:4}: {:6.1} ns per resume incl. master step, {:6.1} ns executor only",
            best.0, best.1
        );
    }
}
