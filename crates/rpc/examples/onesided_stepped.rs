//! CPU cost per one-sided READ through the runtime, beside the cost per RPC of the same
//! shape, without scheduler noise: two nodes' runtimes stepped alternately in this one
//! thread, 20 coroutines per node each queueing `batch` operations per flush. Node 0's
//! coroutines READ 32 B of node 1's registered region; the RPC phase echoes 32 B.
//! `cargo run --release -p ambidex-rpc --example onesided_stepped [batch] [rounds]
//! [rpc|read|write|cas]` (`write` and `cas`: that phase only, signaled 32 B WRITEs or
//! CASes instead of the READs)
//! (for `valgrind --tool=callgrind`, divide the inclusive cost of `poll_once` under
//! `run` by the operations counted.)

use ambidex_rpc::{Runtime, RuntimeConfig};
use ambidex_transport::cputime::thread_cpu_seconds;
use ambidex_transport::local::LocalFabric;
use ambidex_transport::{ClusterConfig, Perms};
use std::cell::Cell;
use std::rc::Rc;

const WORKERS: usize = 20;

/// What node 0's workers issue.
#[derive(Clone, Copy, PartialEq)]
enum Op {
    Rpc,
    Read,
    Write,
    Cas,
}

/// Steps two runtimes for `rounds`; node 0's workers issue `op`. Returns operations per
/// CPU-second.
fn run(batch: u64, rounds: u64, op: Op) -> f64 {
    let fabric = LocalFabric::new(ClusterConfig::new(2, 1)).unwrap();
    let target = fabric.node(1).register(4096, Perms::ALL).unwrap();
    let count = Rc::new(Cell::new(0u64));
    let mut rts: Vec<Runtime> = (0..2u16)
        .map(|n| {
            let node = fabric.node(n);
            let mut rt = Runtime::new(node.endpoint(0).unwrap(), RuntimeConfig::default()).unwrap();
            rt.register(1, |_, req, resp| resp.extend_from_slice(req));
            if n == 0 {
                let scratch = node
                    .register(WORKERS * 32 * batch as usize, Perms::ALL)
                    .unwrap();
                rt.attach_scratch(scratch, 32 * batch as usize).unwrap();
                for _ in 0..WORKERS {
                    let (count, at) = (count.clone(), target.desc.at(0));
                    rt.spawn(move |ctx| async move {
                        let p = [0x5au8; 32];
                        loop {
                            for _ in 0..batch {
                                match op {
                                    Op::Rpc => drop(ctx.queue(1, 1, &p).unwrap()),
                                    Op::Read => drop(ctx.queue_read(at, 32, true).unwrap()),
                                    Op::Write => drop(ctx.queue_write(at, &p, true).unwrap()),
                                    Op::Cas => drop(ctx.queue_cas(at, 0, 0, true).unwrap()),
                                }
                            }
                            ctx.flush().await.unwrap();
                            count.set(count.get() + batch);
                        }
                    });
                }
            }
            rt
        })
        .collect();
    let c0 = thread_cpu_seconds();
    for _ in 0..rounds {
        for rt in rts.iter_mut() {
            rt.poll_once();
        }
    }
    if std::env::var_os("COUNT").is_some() {
        eprintln!("{} operations", count.get());
    }
    count.get() as f64 / (thread_cpu_seconds() - c0)
}

fn main() {
    let arg = |i: usize, d: u64| {
        std::env::args()
            .nth(i)
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (batch, rounds) = (arg(1, 4), arg(2, 200_000));
    // Third argument `rpc`, `read`, `write` or `cas`: that phase only (for callgrind).
    let only = std::env::args().nth(3);
    let one_sided = match only.as_deref() {
        Some("write") => Op::Write,
        Some("cas") => Op::Cas,
        _ => Op::Read,
    };
    let rpc = match only.as_deref() {
        None | Some("rpc") => run(batch, rounds, Op::Rpc),
        _ => f64::NAN,
    };
    let reads = match only.as_deref() {
        Some("rpc") => f64::NAN,
        _ => run(batch, rounds, one_sided),
    };
    println!(
        "batch {batch}: {:.2} M RPCs/CPU-s, {:.2} M one-sided READs/CPU-s ({:.2}x)",
        rpc / 1e6,
        reads / 1e6,
        reads / rpc
    );
}
