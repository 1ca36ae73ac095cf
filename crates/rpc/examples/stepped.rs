//! CPU cost per RPC without scheduler noise: two nodes' runtimes stepped alternately in
//! this one thread (as the simulator will), 20 coroutines x batch 4 x 32 B each.
//! `cargo run --release -p ambidex-rpc --example stepped`

use ambidex_rpc::{Runtime, RuntimeConfig};
use ambidex_transport::cputime::thread_cpu_seconds;
use ambidex_transport::local::LocalFabric;
use ambidex_transport::{ClusterConfig, Datagram, EndpointAddr};
use std::cell::Cell;
use std::rc::Rc;

fn main() {
    let batch: u64 = std::env::args()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let fabric = LocalFabric::new(ClusterConfig::new(2, 1)).unwrap();
    // Raw: both endpoints in this thread, 80 pings outstanding each way, echoed.
    let mut eps: Vec<_> = (0..2)
        .map(|n| fabric.node(n).endpoint(0).unwrap())
        .collect();
    let ping = [1u8; 32];
    let pong = [2u8; 32];
    // Optional second argument: master steps per phase (smaller for callgrind).
    let rounds: u64 = std::env::args()
        .nth(2)
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let c0 = thread_cpu_seconds();
    let mut got = 0u64;
    let mut outstanding = [0usize; 2];
    let mut echo: Vec<EndpointAddr> = Vec::new();
    let mut out: Vec<Datagram<'_>> = Vec::new();
    for _ in 0..rounds {
        for i in 0..2 {
            let other = EndpointAddr::new(1 - i as u16, 0);
            while outstanding[i] + batch as usize <= 80 {
                out.clear();
                for _ in 0..batch {
                    out.push(Datagram {
                        dst: other,
                        payload: &ping,
                    });
                }
                eps[i].send(&out).unwrap();
                outstanding[i] += batch as usize;
            }
            echo.clear();
            let mut pongs = 0;
            got += eps[i].poll_recv(64, &mut |s, p| {
                if p[0] == 1 {
                    echo.push(s)
                } else {
                    pongs += 1
                }
            }) as u64;
            outstanding[i] -= pongs;
            if !echo.is_empty() {
                out.clear();
                out.extend(echo.iter().map(|&dst| Datagram {
                    dst,
                    payload: &pong,
                }));
                eps[i].send(&out).unwrap();
            }
        }
    }
    let raw_cpu = thread_cpu_seconds() - c0;
    let raw_rate = got as f64 / raw_cpu;
    drop(eps);
    let fabric = LocalFabric::new(ClusterConfig::new(2, 1)).unwrap();
    let count = Rc::new(Cell::new(0u64));
    let mut rts: Vec<Runtime> = (0..2)
        .map(|n| {
            let mut rt = Runtime::new(
                fabric.node(n).endpoint(0).unwrap(),
                RuntimeConfig::default(),
            )
            .unwrap();
            rt.register(1, |_, req, resp| resp.extend_from_slice(req));
            for _ in 0..20 {
                let count = count.clone();
                rt.spawn(move |ctx| async move {
                    let other = 1 - ctx.addr().node;
                    let p = [0x5au8; 32];
                    loop {
                        for _ in 0..batch {
                            ctx.queue(other, 1, &p).unwrap();
                        }
                        ctx.flush().await.unwrap();
                        count.set(count.get() + batch);
                    }
                });
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
    let cpu = thread_cpu_seconds() - c0;
    let rate = count.get() as f64 / cpu;
    println!(
        "batch {batch}: raw {:.2} M datagrams/CPU-s, rpc {:.2} M RPCs/CPU-s, ratio {:.2}; rpc stats {:?}",
        raw_rate / 1e6,
        rate / 1e6,
        rate / raw_rate,
        rts[0].stats()
    );
}
