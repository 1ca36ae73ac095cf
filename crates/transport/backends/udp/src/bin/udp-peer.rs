//! A udp node running the conformance peer agent, for tests across processes and
//! network namespaces.
//!
//! ```text
//! udp-peer --config '<ClusterConfig JSON>' --addrs IP:PORT,IP:PORT,... --node N
//!          [--max-secs S] [--loss DROP,DUP,SEED]
//! ```
//! Prints `ready` once every endpoint socket is bound, then serves until a STOP command,
//! `--max-secs` (default 300) or the death of its parent.

use ambidex_transport::conformance;
use ambidex_transport::ClusterConfig;
use ambidex_transport_udp::{LossConfig, UdpNode, UdpOptions};
use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn usage(why: &str) -> ! {
    eprintln!("udp-peer: {why}");
    eprintln!(
        "usage: udp-peer --config JSON --addrs IP:PORT,... --node N [--max-secs S] [--loss DROP,DUP,SEED]"
    );
    std::process::exit(2);
}

fn main() {
    // A test that dies must not leave peers behind.
    // SAFETY: prctl with PR_SET_PDEATHSIG only sets a flag of this process.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    let (mut config, mut addrs, mut node, mut max_secs, mut loss) =
        (None, None, None, 300u64, None);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || {
            args.next()
                .unwrap_or_else(|| usage(&format!("{a} needs a value")))
        };
        match a.as_str() {
            "--config" => {
                config = Some(
                    serde_json::from_str::<ClusterConfig>(&val())
                        .unwrap_or_else(|e| usage(&format!("bad --config: {e}"))),
                )
            }
            "--addrs" => {
                addrs = Some(
                    val()
                        .split(',')
                        .map(|s| s.parse::<SocketAddr>())
                        .collect::<Result<Vec<_>, _>>()
                        .unwrap_or_else(|e| usage(&format!("bad --addrs: {e}"))),
                )
            }
            "--node" => node = Some(val().parse::<u16>().unwrap_or_else(|_| usage("bad --node"))),
            "--max-secs" => max_secs = val().parse().unwrap_or_else(|_| usage("bad --max-secs")),
            "--loss" => {
                let v: Vec<String> = val().split(',').map(str::to_string).collect();
                let f = |i: usize| v.get(i).and_then(|s| s.parse::<f64>().ok());
                match (f(0), f(1), v.get(2).and_then(|s| s.parse::<u64>().ok())) {
                    (Some(drop), Some(duplicate), Some(seed)) => {
                        loss = Some(LossConfig {
                            seed,
                            drop,
                            duplicate,
                        })
                    }
                    _ => usage("bad --loss"),
                }
            }
            _ => usage(&format!("unknown argument {a}")),
        }
    }
    let config = config.unwrap_or_else(|| usage("--config is required"));
    let addrs = addrs.unwrap_or_else(|| usage("--addrs is required"));
    let node = node.unwrap_or_else(|| usage("--node is required"));
    let opts = UdpOptions {
        loss,
        ..UdpOptions::default()
    };
    let transport = match UdpNode::open_with(&config, &addrs, node, opts) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("udp-peer: {e}");
            std::process::exit(1);
        }
    };
    println!("ready");
    let _ = std::io::stdout().flush();
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(max_secs));
        s.store(true, Ordering::Relaxed);
    });
    if let Err(e) = conformance::run_peer(transport, stop) {
        eprintln!("udp-peer: {e}");
        std::process::exit(1);
    }
}
