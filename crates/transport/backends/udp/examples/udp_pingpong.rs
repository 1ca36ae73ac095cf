//! Datagram ping-pong between two processes on loopback: node 0 sends a batch of
//! `--batch` (16) datagrams of `--size` (32) bytes with one doorbell, node 1 echoes each
//! batch with one doorbell. Reports datagrams (both directions) per CPU-second of both
//! processes, the measure of the transport's per-datagram cost.
//!
//! ```text
//! cargo run --release -p ambidex-transport-udp --example udp_pingpong -- [--secs 3] [--batch 16] [--size 32] [--port 41000] [--no-gso]
//! ```

use ambidex_transport::cputime;
use ambidex_transport::{ClusterConfig, Datagram, EndpointAddr};
use ambidex_transport_udp::{UdpNode, UdpOptions};
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let (secs, batch, size) = (
        arg("--secs", 3),
        arg("--batch", 16) as usize,
        arg("--size", 32) as usize,
    );
    let port = arg("--port", 41000) as u16;
    let mut config = ClusterConfig::new(2, 1);
    config.cluster_id = 0x7069_6e67;
    let addrs: Vec<SocketAddr> = vec![
        SocketAddr::from(([127, 0, 0, 1], port)),
        SocketAddr::from(([127, 0, 0, 1], port + 1)),
    ];
    let gso = !std::env::args().any(|a| a == "--no-gso");
    let opts = UdpOptions {
        gso,
        ..UdpOptions::default()
    };
    if std::env::args().any(|a| a == "--pong") {
        return pong(&config, &addrs, opts);
    }
    let node = UdpNode::open_with(&config, &addrs, 0, opts).expect("open node 0");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--pong", "--port", &port.to_string()])
        .args(if gso { &[][..] } else { &["--no-gso"][..] })
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn pong");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    let mut ep = node.endpoint(0).unwrap();
    let payload = vec![b'p'; size];
    let msgs = vec![
        Datagram {
            dst: EndpointAddr::new(1, 0),
            payload: &payload
        };
        batch
    ];
    let cpu0 = cputime::process_cpu_seconds();
    let start = Instant::now();
    let (mut received, mut resent) = (0u64, 0u64);
    while start.elapsed() < Duration::from_secs(secs) {
        ep.send(&msgs).unwrap();
        let mut got = 0;
        let deadline = Instant::now() + Duration::from_millis(100);
        while got < batch && Instant::now() < deadline {
            let n = ep.poll_recv(64, &mut |_, _| {});
            if n == 0 {
                ep.wait(Duration::from_millis(10));
            }
            got += n;
        }
        if got < batch {
            resent += 1; // a datagram was lost: start the next round anyway
        }
        received += got as u64;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = cputime::process_cpu_seconds() - cpu0;
    ep.send(&[Datagram {
        dst: EndpointAddr::new(1, 0),
        payload: b"Q",
    }])
    .unwrap();
    let line = lines.next().unwrap().unwrap();
    let mut it = line.split_whitespace();
    let pong_received: u64 = it.next().unwrap().parse().unwrap();
    let pong_cpu: f64 = it.next().unwrap().parse().unwrap();
    let _ = child.wait();
    let total = received + pong_received;
    let total_cpu = cpu + pong_cpu;
    println!(
        "udp ping-pong (gso {gso}): batch {batch} x {size} B, {elapsed:.2} s wall, {total} datagrams ({:.0}/s wall), \
         CPU {cpu:.2} s + {pong_cpu:.2} s => {:.3} M datagrams per CPU-second; stalled rounds {resent}; counters {:?}",
        total as f64 / elapsed,
        total as f64 / total_cpu / 1e6,
        ep.counters().drops_and_errors()
    );
}

fn pong(config: &ClusterConfig, addrs: &[SocketAddr], opts: UdpOptions) {
    let node = UdpNode::open_with(config, addrs, 1, opts).expect("open node 1");
    println!("ready");
    std::io::stdout().flush().unwrap();
    let mut ep = node.endpoint(0).unwrap();
    let cpu0 = cputime::process_cpu_seconds();
    let (mut received, mut quit) = (0u64, false);
    let mut lens: Vec<usize> = Vec::with_capacity(64);
    let buf = vec![b'q'; 4096];
    let started = Instant::now();
    while !quit && started.elapsed() < Duration::from_secs(600) {
        lens.clear();
        let n = ep.poll_recv(64, &mut |_, p| {
            if p == b"Q" {
                quit = true;
            } else {
                lens.push(p.len());
            }
        });
        if n == 0 {
            ep.wait(Duration::from_millis(10));
            continue;
        }
        received += lens.len() as u64;
        let back: Vec<Datagram> = lens
            .iter()
            .map(|&l| Datagram {
                dst: EndpointAddr::new(0, 0),
                payload: &buf[..l],
            })
            .collect();
        ep.send(&back).unwrap();
    }
    println!("{received} {}", cputime::process_cpu_seconds() - cpu0);
}
