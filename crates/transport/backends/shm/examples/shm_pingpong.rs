//! Quick measurement of the shm backend between two processes (this binary re-executes
//! itself as node 1):
//!
//! - datagram ping-pong: node 0 sends a batch of 16 datagrams of 32 bytes (one doorbell),
//!   node 1 echoes the batch back (one doorbell), repeat;
//! - one-sided READs: node 0 posts batches of 16 READs of 32 bytes of a region of node 1
//!   (last one signaled) while node 1's CPU sleeps.
//!
//! Work is divided by the CPU seconds of both processes.
//!
//! `cargo run --release -p ambidex-transport-shm --example shm_pingpong [SECONDS [WINDOW]]`
//! (WINDOW: batches in flight in the ping-pong, 1 by default).

use ambidex_transport::cputime::{pid_cpu_seconds, process_cpu_seconds};
use ambidex_transport::{
    ClusterConfig, Datagram, Endpoint, EndpointAddr, LocalBuf, OneSidedKind, OneSidedOp, Perms,
    RegionDesc,
};
use ambidex_transport_shm::{ShmCluster, ShmNode};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const BATCH: usize = 16;
const SIZE: usize = 32;

/// Spins on `poll` (true = progress), parking on the endpoint after a while idle.
struct Idle(u32);
impl Idle {
    fn step(&mut self, ep: &mut dyn Endpoint, progressed: bool) {
        if progressed {
            self.0 = 0;
        } else {
            // Spin, then yield (the partner may share our core), then park.
            self.0 += 1;
            if self.0 < 256 {
                std::hint::spin_loop();
            } else if self.0 < 512 {
                std::thread::yield_now();
            } else {
                ep.wait(Duration::from_millis(1));
            }
        }
    }
}

fn child(dir: PathBuf) {
    let node = ShmNode::open(&dir, 1).expect("open node 1");
    let region = node.register(1 << 20, Perms::ALL).unwrap();
    let mut ep = node.endpoint(0).unwrap();
    let driver = EndpointAddr::new(0, 0);
    ep.send(&[Datagram {
        dst: driver,
        payload: &region.desc.encode(),
    }])
    .unwrap();
    let mut bufs = vec![[0u8; 64]; 256];
    let mut lens = vec![0usize; 256];
    let mut idle = Idle(0);
    loop {
        let mut n = 0;
        let mut stop = false;
        ep.poll_recv(256, &mut |_, p| {
            if p == b"stop" {
                stop = true;
            }
            let l = p.len().min(64);
            bufs[n][..l].copy_from_slice(&p[..l]);
            lens[n] = l;
            n += 1;
        });
        if stop {
            return;
        }
        if n > 0 {
            let batch: Vec<Datagram> = (0..n)
                .map(|i| Datagram {
                    dst: driver,
                    payload: &bufs[i][..lens[i]],
                })
                .collect();
            ep.send(&batch).unwrap();
        }
        idle.step(&mut *ep, n > 0);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        return child(PathBuf::from(&args[2]));
    }
    let secs: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(2.0);
    let window: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1);
    let mut config = ClusterConfig::new(2, 1);
    config.cluster_id ^= std::process::id() as u64;
    let dir = ShmCluster::default_dir(config.cluster_id);
    let _ = ShmCluster::remove(&dir);
    ShmCluster::create(&dir, &config).unwrap();
    let node = ShmNode::open(&dir, 0).unwrap();
    let mut ep = node.endpoint(0).unwrap();
    let mut kid = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("--child")
        .arg(&dir)
        .spawn()
        .unwrap();
    let peer = EndpointAddr::new(1, 0);
    let mut desc = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while desc.is_none() && Instant::now() < deadline {
        ep.poll_recv(1, &mut |_, p| desc = RegionDesc::decode(p));
        ep.wait(Duration::from_millis(1));
    }
    let desc = desc.expect("node 1 did not start");
    let scratch = node.register(1 << 16, Perms::ALL).unwrap();

    // Datagram ping-pong.
    let payload = [7u8; SIZE];
    let batch = vec![
        Datagram {
            dst: peer,
            payload: &payload
        };
        BATCH
    ];
    let mut idle = Idle(0);
    // `window` batches in flight (1 = strict ping-pong); a new batch goes out whenever a
    // batch's worth has come back.
    let run = |ep: &mut dyn Endpoint, idle: &mut Idle, rounds: u64| {
        let mut in_flight = 0;
        let mut sent = 0;
        let mut back = 0;
        while back < rounds as usize * BATCH {
            while in_flight + BATCH <= window * BATCH && sent < rounds as usize * BATCH {
                ep.send(&batch).unwrap();
                in_flight += BATCH;
                sent += BATCH;
            }
            let n = ep.poll_recv(BATCH * window, &mut |_, _| {});
            back += n;
            in_flight -= n;
            idle.step(ep, n > 0);
        }
    };
    run(&mut *ep, &mut idle, 10_000); // warm-up
    let (c0, k0, t0) = (
        process_cpu_seconds(),
        pid_cpu_seconds(kid.id()),
        Instant::now(),
    );
    let mut rounds = 0u64;
    while t0.elapsed().as_secs_f64() < secs {
        run(&mut *ep, &mut idle, 1000);
        rounds += 1000;
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = (process_cpu_seconds() - c0) + (pid_cpu_seconds(kid.id()) - k0);
    let dgrams = (rounds * BATCH as u64 * 2) as f64; // both directions
    println!(
        "datagram ping-pong, batches of {BATCH} x {SIZE} B, window {window}: {:.2} M datagrams/s wall, {:.2} M datagrams per CPU-second ({:.2} CPU s over {wall:.2} s; {:.2} us per batch)",
        dgrams / wall / 1e6,
        dgrams / cpu / 1e6,
        cpu,
        wall / rounds as f64 * 1e6
    );

    // The same batches looped back to this endpoint: the CPU cost of the datagram path
    // itself, without cross-process cache traffic or scheduling.
    let me = ep.addr();
    let self_batch = vec![
        Datagram {
            dst: me,
            payload: &payload
        };
        BATCH
    ];
    let (c0, t0) = (process_cpu_seconds(), Instant::now());
    let mut n = 0u64;
    while t0.elapsed().as_secs_f64() < secs / 2.0 {
        for _ in 0..10_000 {
            ep.send(&self_batch).unwrap();
            let mut got = 0;
            while got < BATCH {
                got += ep.poll_recv(BATCH, &mut |_, _| {});
            }
        }
        n += 10_000 * BATCH as u64;
    }
    let cpu = process_cpu_seconds() - c0;
    println!(
        "loopback to own endpoint, batches of {BATCH} x {SIZE} B: {:.2} M datagrams (sent and received) per CPU-second",
        n as f64 / cpu / 1e6
    );

    // One-sided READs while node 1 sleeps (let it park first).
    std::thread::sleep(Duration::from_millis(50));
    let ops: Vec<OneSidedOp> = (0..BATCH)
        .map(|i| OneSidedOp {
            wr_id: i as u64,
            remote: desc.at((i * 64) as u64),
            kind: OneSidedKind::Read {
                len: SIZE as u32,
                dest: LocalBuf {
                    region: scratch.id(),
                    offset: (i * 64) as u64,
                },
            },
            signaled: i == BATCH - 1,
        })
        .collect();
    let mut out = Vec::with_capacity(64);
    let (c0, k0, t0) = (
        process_cpu_seconds(),
        pid_cpu_seconds(kid.id()),
        Instant::now(),
    );
    let mut reads = 0u64;
    while t0.elapsed().as_secs_f64() < secs {
        for _ in 0..10_000 {
            ep.post(&ops).unwrap();
            out.clear();
            while ep.poll_cq(64, &mut out) == 0 {}
            assert!(out[0].status.is_ok());
        }
        reads += 10_000 * BATCH as u64;
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = (process_cpu_seconds() - c0) + (pid_cpu_seconds(kid.id()) - k0);
    let kid_cpu = pid_cpu_seconds(kid.id()) - k0;
    println!(
        "one-sided READ, batches of {BATCH} x {SIZE} B: {:.2} M READs/s wall, {:.2} M READs per CPU-second ({:.2} CPU s, {kid_cpu:.2} of them node 1's, over {wall:.2} s)",
        reads as f64 / wall / 1e6,
        reads as f64 / cpu / 1e6,
        cpu
    );

    ep.send(&[Datagram {
        dst: peer,
        payload: b"stop",
    }])
    .unwrap();
    let _ = kid.wait();
    drop(ep);
    drop(node);
    ShmCluster::remove(&dir).unwrap();
}
