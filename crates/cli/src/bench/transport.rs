//! `ambidex bench transport`: datagram ping-pong and one-sided READ rates between two
//! nodes, per second and per CPU-second of every thread and process involved.
//!
//! The ping-pong is pipelined: the driver keeps `window` batches of `batch` datagrams in
//! flight and the peer echoes every poll's worth of datagrams with one doorbell.
//! `datagram.ops` counts datagrams delivered in both directions. The READ test keeps
//! `window` batches of `batch` READs in flight, only the last of each batch signaled.

use crate::cluster::{BenchCluster, ClusterError};
use ambidex::config::{ClusterSection, Transport};
use ambidex_transport::cputime;
use ambidex_transport::wait::Backoff;
use ambidex_transport::*;
use serde::Serialize;
use std::time::{Duration, Instant};

const CTRL: u8 = 0xC0;
const REGION_LEN: usize = 1 << 20;
/// Times a control command is sent before the peer counts as silent (500 ms each).
const ASK_TRIES: u32 = 20;

/// Why `bench transport` (or its peer node) could not run.
#[derive(Debug, thiserror::Error)]
pub enum TransportBenchError {
    /// `--size`, `--batch` or `--window` is 0.
    #[error(
        "--size, --batch and --window must be at least 1 \
         (got --size {size} --batch {batch} --window {window})"
    )]
    Zero {
        size: usize,
        batch: usize,
        window: usize,
    },
    /// `--duration` outside (0, 3600].
    #[error("--duration must be between 0 and 3600 seconds (got {0})")]
    Duration(f64),
    /// `--size` over the MTU or the largest one-sided operation.
    #[error("--size must be at most {max} bytes (got {size})")]
    SizeTooLarge { size: usize, max: usize },
    /// More datagrams in flight than the receive queue holds.
    #[error(
        "--batch x --window must not exceed the receive depth ({depth}) \
         (got {batch} x {window})"
    )]
    WindowTooDeep {
        batch: usize,
        window: usize,
        depth: usize,
    },
    /// The benchmark's cluster could not be started, or a peer failed.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// A transport operation refused (opening an endpoint, registering a region,
    /// sending, posting READs).
    #[error("{what}")]
    Transport {
        /// The operation: `sending datagrams to node 1`.
        what: &'static str,
        /// The transport's error.
        #[source]
        source: TransportError,
    },
    /// A one-sided READ completed with an error.
    #[error("READ failed: {}", .0.name())]
    ReadFailed(AccessError),
    /// The peer's region descriptor did not decode.
    #[error("peer sent a malformed region descriptor ({len} bytes)")]
    MalformedRegion { len: usize },
    /// The peer's counters did not decode.
    #[error("peer sent malformed counters")]
    MalformedCounters(#[source] serde_json::Error),
    /// The peer's counters could not be encoded for the driver.
    #[error("encoding this node's counters")]
    EncodeCounters(#[source] serde_json::Error),
    /// The peer answered none of the tries of a control command.
    #[error(
        "peer did not answer control command '{}' in {ASK_TRIES} tries of 500 ms",
        *.cmd as char
    )]
    NoAnswer { cmd: u8 },
}

/// `what` failed with the transport's error.
fn transport(what: &'static str) -> impl FnOnce(TransportError) -> TransportBenchError {
    move |source| TransportBenchError::Transport { what, source }
}

#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Transport backend.
    #[arg(long, default_value = "local")]
    pub transport: Transport,
    /// Payload bytes of each datagram and each READ.
    #[arg(long, default_value_t = 32)]
    pub size: usize,
    /// Datagrams (or READs) posted with one doorbell.
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Batches kept in flight.
    #[arg(long, default_value_t = 4)]
    pub window: usize,
    /// Measured seconds per test (after a short warm-up).
    #[arg(long, default_value_t = 2.0)]
    pub duration: f64,
    /// Print one JSON object on stdout instead of a summary.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
pub struct Rate {
    pub ops: u64,
    pub seconds: f64,
    pub ops_per_s: f64,
    pub cpu_seconds: f64,
    pub ops_per_cpu_s: f64,
}

impl Rate {
    fn new(ops: u64, seconds: f64, cpu_seconds: f64) -> Rate {
        Rate {
            ops,
            seconds,
            ops_per_s: ops as f64 / seconds.max(1e-9),
            cpu_seconds,
            ops_per_cpu_s: ops as f64 / cpu_seconds.max(1e-9),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub transport: &'static str,
    pub remote_cpu_involved: bool,
    pub size: usize,
    pub batch: usize,
    pub window: usize,
    pub datagram: Rate,
    pub read: Rate,
    /// Every drop and error counter of both nodes.
    pub counters: CounterSnapshot,
}

pub fn run(args: &Args) -> Result<Report, TransportBenchError> {
    if args.batch == 0 || args.window == 0 || args.size == 0 {
        return Err(TransportBenchError::Zero {
            size: args.size,
            batch: args.batch,
            window: args.window,
        });
    }
    if !(args.duration > 0.0 && args.duration <= 3600.0) {
        return Err(TransportBenchError::Duration(args.duration));
    }
    let config = ClusterConfig::new(2, 1);
    if args.size > config.mtu || args.size > config.max_onesided {
        return Err(TransportBenchError::SizeTooLarge {
            size: args.size,
            max: config.mtu.min(config.max_onesided),
        });
    }
    // Saturating: a product past usize is over any receive depth too.
    if args.batch.saturating_mul(args.window) > config.recv_depth {
        return Err(TransportBenchError::WindowTooDeep {
            batch: args.batch,
            window: args.window,
            depth: config.recv_depth,
        });
    }
    let cluster = BenchCluster::start(
        ClusterSection {
            transport: args.transport,
            nodes: config.nodes,
            threads: config.threads_per_node,
            ..ClusterSection::default()
        },
        "bench-transport",
        |node| Ok(peer(node)?),
    )?;
    let result = drive(args, &cluster);
    let finished = cluster.finish();
    let report = result?;
    finished?;
    Ok(report)
}

fn drive(args: &Args, cluster: &BenchCluster) -> Result<Report, TransportBenchError> {
    let node = cluster.driver.clone();
    let mut ep = node
        .endpoint(0)
        .map_err(transport("opening the driver's endpoint"))?;
    let peer = EndpointAddr::new(1, 0);
    let remote = {
        let r = ask(&mut *ep, peer, b'r')?;
        RegionDesc::decode(&r).ok_or(TransportBenchError::MalformedRegion { len: r.len() })?
    };
    let cpu = || cputime::process_cpu_seconds() + cluster.peers_cpu_seconds();
    let warmup = Duration::from_secs_f64((args.duration / 5.0).min(0.5));
    let measure = Duration::from_secs_f64(args.duration);

    // Datagram ping-pong.
    let payload = vec![0u8; args.size];
    let batch: Vec<Datagram> = vec![
        Datagram {
            dst: peer,
            payload: &payload
        };
        args.batch
    ];
    let mut outstanding = 0usize;
    let mut received = 0u64;
    let mut backoff = Backoff::new();
    let mut last_rx = Instant::now();
    let start = Instant::now();
    let mut t0 = None;
    loop {
        let now = Instant::now();
        if t0.is_none() && now - start >= warmup {
            t0 = Some((now, received, cpu()));
        }
        if let Some((t, _, _)) = t0 {
            if now - t >= measure {
                break;
            }
        }
        while outstanding + args.batch <= args.batch * args.window {
            ep.send(&batch)
                .map_err(transport("sending datagrams to the peer"))?;
            outstanding += args.batch;
        }
        let n = ep.poll_recv(256, &mut |_, p| debug_assert!(p.first() != Some(&CTRL)));
        if n > 0 {
            received += n as u64;
            outstanding = outstanding.saturating_sub(n);
            last_rx = now;
            backoff.reset();
        } else if now - last_rx > Duration::from_millis(50) {
            // Lost datagrams (udp under overload): refill the window rather than stall.
            outstanding = 0;
            last_rx = now;
        } else {
            backoff.idle(&mut *ep);
        }
    }
    let (t, r0, c0) = t0.expect("measurement started");
    let datagram = Rate::new(2 * (received - r0), t.elapsed().as_secs_f64(), cpu() - c0);
    // Let echoes in flight drain before the next test.
    let quiet = Instant::now();
    while quiet.elapsed() < Duration::from_millis(50) {
        if ep.poll_recv(256, &mut |_, _| {}) == 0 {
            ep.wait(Duration::from_millis(1));
        }
    }

    // One-sided READs.
    let scratch = node
        .register(args.size * args.batch, Perms::ALL)
        .map_err(transport("registering the READs' local buffer"))?;
    let slots = (remote.len as usize / args.size.next_multiple_of(8)).max(1) as u64;
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut ops: Vec<OneSidedOp> = Vec::with_capacity(args.batch);
    let mut cq = Vec::new();
    let mut in_flight = 0usize;
    let mut reads = 0u64;
    let start = Instant::now();
    let mut t0 = None;
    loop {
        let now = Instant::now();
        if t0.is_none() && now - start >= warmup {
            t0 = Some((now, reads, cpu()));
        }
        if let Some((t, _, _)) = t0 {
            if now - t >= measure {
                break;
            }
        }
        while in_flight < args.window {
            ops.clear();
            for i in 0..args.batch {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let off = (rng % slots) * args.size.next_multiple_of(8) as u64;
                ops.push(OneSidedOp {
                    wr_id: i as u64,
                    remote: remote.at(off),
                    kind: OneSidedKind::Read {
                        len: args.size as u32,
                        dest: LocalBuf {
                            region: scratch.id(),
                            offset: (i * args.size) as u64,
                        },
                    },
                    signaled: i + 1 == args.batch,
                });
            }
            ep.post(&ops)
                .map_err(transport("posting READs to the peer"))?;
            in_flight += 1;
        }
        cq.clear();
        let n = ep.poll_cq(64, &mut cq);
        for c in &cq {
            if let Err(e) = c.status {
                return Err(TransportBenchError::ReadFailed(e));
            }
        }
        if n > 0 {
            in_flight -= n;
            reads += (n * args.batch) as u64;
            backoff.reset();
        } else {
            backoff.idle(&mut *ep);
        }
    }
    let (t, r0, c0) = t0.expect("measurement started");
    let read = Rate::new(reads - r0, t.elapsed().as_secs_f64(), cpu() - c0);
    // Drain the remaining completions so the peer sees no traffic when asked to stop.
    let deadline = Instant::now() + Duration::from_secs(5);
    while ep.outstanding() > 0 && Instant::now() < deadline {
        cq.clear();
        if ep.poll_cq(64, &mut cq) == 0 {
            ep.poll_recv(0, &mut |_, _| {});
            ep.wait(Duration::from_millis(1));
        }
    }

    let mut counters = ep.counters();
    counters.merge(&node.counters());
    let peer_counters: CounterSnapshot = serde_json::from_slice(&ask(&mut *ep, peer, b'c')?)
        .map_err(TransportBenchError::MalformedCounters)?;
    counters.merge(&peer_counters);
    ask(&mut *ep, peer, b'q')?;
    Ok(Report {
        transport: args.transport.name(),
        remote_cpu_involved: args.transport == Transport::Udp,
        size: args.size,
        batch: args.batch,
        window: args.window,
        datagram,
        read,
        counters: counters.drops_and_errors(),
    })
}

/// Sends a control command to the peer and returns the reply's body.
fn ask(ep: &mut dyn Endpoint, peer: EndpointAddr, cmd: u8) -> Result<Vec<u8>, TransportBenchError> {
    for _ in 0..ASK_TRIES {
        ep.send(&[Datagram {
            dst: peer,
            payload: &[CTRL, cmd],
        }])
        .map_err(transport("sending a control command to the peer"))?;
        let deadline = Instant::now() + Duration::from_millis(500);
        while Instant::now() < deadline {
            let mut reply = None;
            ep.poll_recv(256, &mut |src, p| {
                if src == peer && p.len() >= 2 && p[0] == CTRL && p[1] == cmd {
                    reply = Some(p[2..].to_vec());
                }
            });
            if let Some(r) = reply {
                return Ok(r);
            }
            ep.wait(Duration::from_millis(1));
        }
    }
    Err(TransportBenchError::NoAnswer { cmd })
}

/// The peer node: echoes every poll's datagrams back with one doorbell, serves its region
/// to one-sided READs, answers control commands.
pub fn peer(node: SharedNode) -> Result<(), TransportBenchError> {
    let region = node
        .register(REGION_LEN, Perms::READ)
        .map_err(transport("registering the region the driver READs"))?;
    let mut ep = node
        .endpoint(0)
        .map_err(transport("opening the peer's endpoint"))?;
    let mut data: Vec<u8> = Vec::with_capacity(256 * 64);
    let mut echo: Vec<(EndpointAddr, usize, usize)> = Vec::with_capacity(256);
    let mut ctrl: Vec<(EndpointAddr, u8)> = Vec::new();
    let mut backoff = Backoff::new();
    loop {
        data.clear();
        echo.clear();
        ctrl.clear();
        let n = ep.poll_recv(256, &mut |src, p| {
            if p.len() == 2 && p[0] == CTRL {
                ctrl.push((src, p[1]));
            } else {
                echo.push((src, data.len(), p.len()));
                data.extend_from_slice(p);
            }
        });
        if n == 0 {
            backoff.idle(&mut *ep);
            continue;
        }
        backoff.reset();
        if !echo.is_empty() {
            let batch: Vec<Datagram> = echo
                .iter()
                .map(|&(dst, off, len)| Datagram {
                    dst,
                    payload: &data[off..off + len],
                })
                .collect();
            ep.send(&batch)
                .map_err(transport("echoing datagrams to the driver"))?;
        }
        for &(src, cmd) in &ctrl {
            let body: Vec<u8> = match cmd {
                b'r' => region.desc.encode().to_vec(),
                b'c' => {
                    let mut c = ep.counters();
                    c.merge(&node.counters());
                    serde_json::to_vec(&c).map_err(TransportBenchError::EncodeCounters)?
                }
                b'q' => Vec::new(),
                _ => continue,
            };
            let mut reply = vec![CTRL, cmd];
            reply.extend_from_slice(&body);
            ep.send(&[Datagram {
                dst: src,
                payload: &reply,
            }])
            .map_err(transport("answering the driver's control command"))?;
            if cmd == b'q' {
                // Keep answering briefly in case the reply is lost and the driver asks again.
                let until = Instant::now() + Duration::from_millis(100);
                while Instant::now() < until {
                    ep.poll_recv(256, &mut |_, _| {});
                    ep.wait(Duration::from_millis(5));
                }
                return Ok(());
            }
        }
    }
}

pub fn print_summary(r: &Report) {
    println!(
        "ambidex transport benchmark: {} backend, 2 nodes",
        r.transport
    );
    println!(
        "  datagram ping-pong ({} B, batch {}, window {}): {:>12.0} datagrams/s  {:>12.0} per CPU-second",
        r.size, r.batch, r.window, r.datagram.ops_per_s, r.datagram.ops_per_cpu_s
    );
    println!(
        "  one-sided READ ({} B, batch {}):               {:>12.0} READs/s      {:>12.0} per CPU-second",
        r.size, r.batch, r.read.ops_per_s, r.read.ops_per_cpu_s
    );
    if r.remote_cpu_involved {
        println!("  note: with udp, one-sided operations are served by the target's CPU");
    }
    let nonzero: Vec<String> = r
        .counters
        .0
        .iter()
        .filter(|(_, v)| **v > 0)
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    println!(
        "  drops/errors: {}",
        if nonzero.is_empty() {
            "none".into()
        } else {
            nonzero.join(" ")
        }
    );
}
