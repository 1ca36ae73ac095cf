//! Shared by the udp integration tests: peer processes, port blocks, garbage.

#![allow(dead_code)]

use ambidex_transport::conformance::Fixture;
use ambidex_transport::{ClusterConfig, EndpointAddr, SharedNode};
use ambidex_transport_udp::wire::{self, Body, Packet, ReqOp, Request, Response};
use ambidex_transport_udp::{endpoint_socket_addr, UdpNode};
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::Duration;

pub const PEER: &str = env!("CARGO_BIN_EXE_udp-peer");

/// A peer process, killed on drop.
pub struct Peer(Child);

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `udp-peer` for `node` (behind `prefix`, e.g. `ip netns exec NS`) and waits until
/// its sockets are bound.
pub fn spawn_peer(
    prefix: &[String],
    config: &ClusterConfig,
    addrs: &[SocketAddr],
    node: u16,
    extra: &[String],
) -> Result<Peer, String> {
    let mut argv: Vec<String> = prefix.to_vec();
    argv.push(PEER.to_string());
    let addrs: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
    argv.extend([
        "--config".to_string(),
        serde_json::to_string(config).unwrap(),
        "--addrs".to_string(),
        addrs.join(","),
        "--node".to_string(),
        node.to_string(),
        "--max-secs".to_string(),
        "120".to_string(),
    ]);
    argv.extend(extra.iter().cloned());
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("spawning {}: {e}", argv[0]))?;
    let out = child.stdout.take().unwrap();
    let peer = Peer(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(l) if l.trim() == "ready" => Ok(peer),
        Ok(l) => Err(format!("peer {node} did not start: {l:?}")),
        Err(_) => Err(format!("peer {node} did not report ready")),
    }
}

/// A block of `n` ports no other fixture of this process uses; a random start per
/// process (below the ephemeral range) keeps parallel test binaries apart, and fixtures
/// retry with a new block if a port is taken anyway.
pub fn port_block(n: u16) -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let _ = NEXT.compare_exchange(
        0,
        20_000 + rand::random::<u32>() % 10_000,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    let p = NEXT.fetch_add(n as u32, Ordering::SeqCst);
    if p + n as u32 > 32_000 {
        NEXT.store(20_000, Ordering::SeqCst);
        return port_block(n);
    }
    p as u16
}

pub fn test_config() -> ClusterConfig {
    let mut config = ClusterConfig::new(3, 2);
    config.recv_depth = 256;
    // Stray datagrams of other tests' clusters are dropped, never mistaken for ours.
    config.cluster_id = rand::random();
    config
}

/// Runs `f` on a thread that entered network namespace `ns` (or on a plain thread),
/// so that sockets it creates live there.
pub fn in_netns<T: Send + 'static>(
    ns: Option<String>,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    std::thread::spawn(move || {
        if let Some(ns) = ns {
            let path = format!("/var/run/netns/{ns}");
            let file = std::fs::File::open(&path).expect("open netns");
            use std::os::fd::AsRawFd;
            // SAFETY: setns on this thread only, with a namespace descriptor.
            let r = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(r, 0, "setns {path}: {}", std::io::Error::last_os_error());
        }
        f()
    })
    .join()
    .unwrap()
}

/// A udp cluster: node 0 in this process, every other node a `udp-peer` process.
pub struct UdpFixture {
    pub config: ClusterConfig,
    pub addrs: Vec<SocketAddr>,
    pub driver: SharedNode,
    pub netns: Option<String>,
    _peers: Vec<Peer>,
}

impl UdpFixture {
    pub fn loopback() -> UdpFixture {
        Self::start(
            test_config(),
            None,
            &[],
            |_| IpAddr::from([127, 0, 0, 1]),
            &[],
        )
    }

    /// `driver_ns`: namespace of node 0; `peer_prefix[n]`: command prefix of node n;
    /// `ip(n)`: address of node n.
    pub fn start(
        config: ClusterConfig,
        driver_ns: Option<String>,
        peer_prefix: &[Vec<String>],
        ip: impl Fn(u16) -> IpAddr,
        extra: &[String],
    ) -> UdpFixture {
        let t = config.threads_per_node;
        let mut last = String::new();
        for _attempt in 0..8 {
            let base = port_block(config.nodes * t);
            let addrs: Vec<SocketAddr> = (0..config.nodes)
                .map(|n| SocketAddr::new(ip(n), base + n * t))
                .collect();
            let (c, a) = (config.clone(), addrs.clone());
            let driver = match in_netns(driver_ns.clone(), move || UdpNode::open(&c, &a, 0)) {
                Ok(d) => d,
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            let mut peers = Vec::new();
            for n in 1..config.nodes {
                let prefix = peer_prefix.get(n as usize).cloned().unwrap_or_default();
                match spawn_peer(&prefix, &config, &addrs, n, extra) {
                    Ok(p) => peers.push(p),
                    Err(e) => {
                        last = e;
                        break;
                    }
                }
            }
            if peers.len() == config.nodes as usize - 1 {
                return UdpFixture {
                    config,
                    addrs,
                    driver,
                    netns: driver_ns,
                    _peers: peers,
                };
            }
        }
        panic!("could not start a udp cluster: {last}");
    }
}

impl Fixture for UdpFixture {
    fn config(&self) -> &ClusterConfig {
        &self.config
    }
    fn driver(&self) -> SharedNode {
        self.driver.clone()
    }
    fn exact_depth(&self) -> bool {
        false
    }
    fn inject_garbage(&self, dst: EndpointAddr) -> Option<u64> {
        let to = endpoint_socket_addr(&self.addrs, dst)?;
        let items = garbage(&self.config, dst);
        let n = items.len() as u64;
        in_netns(self.netns.clone(), move || {
            let any: SocketAddr = if to.is_ipv4() {
                "0.0.0.0:0".parse().unwrap()
            } else {
                "[::]:0".parse().unwrap()
            };
            let s = UdpSocket::bind(any).unwrap();
            for (_, g) in &items {
                s.send_to(g, to).unwrap();
            }
        });
        Some(n)
    }
}

/// Malformed datagrams for endpoint `me`, each with the counter it must land in.
pub fn garbage(cfg: &ClusterConfig, me: EndpointAddr) -> Vec<(&'static str, Vec<u8>)> {
    let src = EndpointAddr::new(1, 0);
    let enc = |p: Packet, cluster: u64, epoch: u32| {
        let mut v = Vec::new();
        wire::encode(&p, cluster, epoch, &mut v);
        v
    };
    let data = |src, dst, payload: &'static [u8]| Packet {
        src,
        dst,
        body: Body::Data(payload),
    };
    let good = enc(data(src, me, b"hello"), cfg.cluster_id, cfg.epoch);
    let m = "rx_dropped_malformed";
    let mut out: Vec<(&'static str, Vec<u8>)> = Vec::new();
    for len in [1usize, 7, 50, 300] {
        out.push((m, (0..len).map(|_| rand::random::<u8>()).collect()));
    }
    for len in [0usize, 1, 12, wire::HDR_LEN - 1] {
        out.push((m, good[..len].to_vec()));
    }
    for (i, x) in [(0usize, 0x5Au8), (2, 0x09), (3, 0x00), (3, 0x77)] {
        let mut b = good.clone();
        b[i] = x;
        out.push((m, b));
    }
    let other = if me.thread == 0 { 1 } else { 0 };
    out.push((
        "rx_dropped_wrong_cluster",
        enc(data(src, me, b"x"), cfg.cluster_id ^ 1, cfg.epoch),
    ));
    out.push((
        "rx_dropped_wrong_epoch",
        enc(data(src, me, b"x"), cfg.cluster_id, cfg.epoch + 1),
    ));
    let u = "rx_dropped_unknown_dest";
    for (s, d) in [
        (src, EndpointAddr::new(me.node, other)),
        (src, EndpointAddr::new(me.node + 1, me.thread)),
        (EndpointAddr::new(cfg.nodes, 0), me),
        (EndpointAddr::new(0, cfg.threads_per_node), me),
    ] {
        out.push((u, enc(data(s, d, b"x"), cfg.cluster_id, cfg.epoch)));
    }
    // Oversized: over the MTU, and over any valid datagram (truncated by the kernel).
    let mut big = good[..wire::HDR_LEN].to_vec();
    big.resize(wire::HDR_LEN + cfg.mtu + 1, b'o');
    out.push((m, big));
    let mut huge = good[..wire::HDR_LEN].to_vec();
    huge.resize(65_000, b'h');
    out.push((m, huge));
    // One-sided packets with bad bodies.
    let req = Packet {
        src,
        dst: me,
        body: Body::Request(Request {
            session: 1,
            seq: 0,
            region: 0,
            offset: 0,
            key: 1,
            op: ReqOp::Faa { add: 1 },
        }),
    };
    let r = enc(req, cfg.cluster_id, cfg.epoch);
    out.push((m, r[..r.len() - 1].to_vec()));
    let mut badop = r.clone();
    badop[wire::HDR_LEN + 12] = 9;
    out.push((m, badop));
    let resp = Packet {
        src,
        dst: me,
        body: Body::Response(Response {
            session: 1,
            seq: 0,
            status: Ok(()),
            value: 0,
            data: &[],
        }),
    };
    let mut badstatus = enc(resp, cfg.cluster_id, cfg.epoch);
    badstatus[wire::HDR_LEN + 12] = 200;
    out.push((m, badstatus));
    out
}
