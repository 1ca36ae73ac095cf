//! A shm cluster for tests: node 0 (the driver) in this process, every other node an
//! `shm-peer` process running the conformance peer agent.

#![allow(dead_code)]

use ambidex_transport::conformance::Fixture;
use ambidex_transport::region::Mapping;
use ambidex_transport::ring::{self, RxBlock};
use ambidex_transport::{ClusterConfig, EndpointAddr, NodeId, SharedNode};
use ambidex_transport_shm::{ShmCluster, ShmNode};
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// A fresh, unique directory name (not created).
pub fn fresh_dir(tag: &str) -> PathBuf {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let base = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    base.join(format!(
        "ambidex-test-{tag}-{}-{}-{nanos}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ))
}

pub fn test_config() -> ClusterConfig {
    let mut config = ClusterConfig::new(3, 2);
    config.recv_depth = 256;
    config.cluster_id ^= std::process::id() as u64;
    config
}

pub struct ShmFixture {
    pub dir: PathBuf,
    pub config: ClusterConfig,
    pub driver: SharedNode,
    pub peers: Vec<Option<Child>>,
}

impl ShmFixture {
    pub fn new() -> ShmFixture {
        Self::with(test_config())
    }

    pub fn with(config: ClusterConfig) -> ShmFixture {
        let dir = fresh_dir("conf");
        ShmCluster::create(&dir, &config).expect("create cluster");
        let driver = ShmNode::open(&dir, 0).expect("open driver node");
        let mut f = ShmFixture {
            dir,
            config,
            driver,
            peers: Vec::new(),
        };
        f.peers.push(None); // node 0 is this process
        for n in 1..f.config.nodes {
            let c = f.spawn(n);
            f.peers.push(Some(c));
        }
        f
    }

    fn spawn(&self, n: NodeId) -> Child {
        Command::new(env!("CARGO_BIN_EXE_shm-peer"))
            .arg(&self.dir)
            .arg(n.to_string())
            .arg("--die-with-parent")
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn shm-peer")
    }

    /// SIGKILLs node `n`'s process and reaps it.
    pub fn kill(&mut self, n: NodeId) {
        if let Some(mut c) = self.peers[n as usize].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts a new process for node `n` (after [`ShmFixture::kill`]).
    pub fn restart(&mut self, n: NodeId) {
        self.kill(n);
        let c = self.spawn(n);
        self.peers[n as usize] = Some(c);
    }
}

impl Drop for ShmFixture {
    fn drop(&mut self) {
        for n in 1..self.config.nodes {
            self.kill(n);
        }
        let _ = ShmCluster::remove(&self.dir);
    }
}

impl Fixture for ShmFixture {
    fn config(&self) -> &ClusterConfig {
        &self.config
    }

    fn driver(&self) -> SharedNode {
        self.driver.clone()
    }

    fn inject_garbage(&self, dst: EndpointAddr) -> Option<u64> {
        // A rogue process writing into rings of dst's receive block that no live sender
        // uses during the check (node 1 thread 0 answers the suite's echo).
        let idle: Vec<usize> = (0..self.config.endpoints())
            .filter(|&s| s != self.config.endpoint_index(EndpointAddr::new(1, 0)))
            .take(4)
            .collect();
        Some(inject(&self.config, &self.dir, dst, &idle))
    }
}

/// Raw access to the ring of `sender` in a receive block, as a rogue writer sees it.
pub struct RogueRing {
    map: Arc<Mapping>,
    base: usize,
    pub cap: u64,
}

impl RogueRing {
    pub fn open(
        cfg: &ClusterConfig,
        dir: &std::path::Path,
        dst: EndpointAddr,
        sender: usize,
    ) -> RogueRing {
        let senders = cfg.endpoints();
        let rb = ring::ring_bytes_for(cfg.mtu, cfg.recv_depth);
        let path = dir.join(format!("rx-{}-{}", dst.node, dst.thread));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .expect("open rx file");
        let len = RxBlock::layout_len(senders, rb);
        let map = Arc::new(Mapping::shared_file(file.as_raw_fd(), len).unwrap());
        RogueRing {
            map,
            base: RxBlock::layout_len(sender, rb),
            cap: rb as u64,
        }
    }

    fn ctl_len(&self) -> usize {
        let rb = self.cap as usize;
        RxBlock::layout_len(1, rb) - RxBlock::layout_len(0, rb) - rb
    }

    fn word(&self, off: usize) -> *mut u64 {
        assert!(off + 8 <= self.map.len());
        unsafe { self.map.as_ptr().add(off) as *mut u64 }
    }

    /// The ring's tail (its control block starts with it).
    pub fn tail(&self) -> u64 {
        unsafe { self.word(self.base).read_volatile() }
    }

    pub fn set_tail(&self, t: u64) {
        unsafe { self.word(self.base).write_volatile(t) }
    }

    /// Writes a record header at ring position `pos`.
    pub fn write_header(&self, pos: u64, len: u32, epoch: u32) {
        let off = self.base + self.ctl_len() + ((pos % self.cap) as usize & !7);
        let v = (len as u64) | ((epoch as u64) << 32);
        unsafe { self.word(off).write_volatile(v) }
    }

    /// Rings the receiver's doorbell.
    pub fn notify(&self, cfg: &ClusterConfig) {
        let rb = self.cap as usize;
        // (A header scribbled over by another rogue refuses to attach: no doorbell then.)
        if let Ok(block) = RxBlock::attach(self.map.clone(), cfg.cluster_id, cfg.endpoints(), rb) {
            block
                .header()
                .event
                .notify(ambidex_transport::wait::Scope::Shared);
        }
    }
}

/// Publishes four kinds of corrupt records into the rings of `senders` (one kind each,
/// cycling) of `dst`'s receive block; returns how many were injected.
pub fn inject(
    cfg: &ClusterConfig,
    dir: &std::path::Path,
    dst: EndpointAddr,
    senders: &[usize],
) -> u64 {
    let mut n = 0;
    let mut last = None;
    for (i, &s) in senders.iter().enumerate() {
        let r = RogueRing::open(cfg, dir, dst, s);
        let t = r.tail();
        match i % 4 {
            // A record longer than the MTU.
            0 => {
                r.write_header(t, cfg.mtu as u32 + 1, cfg.epoch);
                r.set_tail(t + 8 + (cfg.mtu as u64 + 8));
            }
            // A tail far beyond the head.
            1 => r.set_tail(t + 100 * r.cap),
            // A misaligned tail, cutting a record.
            2 => {
                r.write_header(t, 40, cfg.epoch);
                r.set_tail(t + 12);
            }
            // A wrap marker jumping past the tail.
            _ => {
                r.write_header(t, u32::MAX, cfg.epoch);
                r.set_tail(t + 8);
            }
        }
        n += 1;
        last = Some(r);
    }
    if let Some(r) = last {
        r.notify(cfg);
    }
    n
}
