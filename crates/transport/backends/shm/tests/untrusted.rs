//! The cluster directory as untrusted input, nodes in this process: lifecycle errors,
//! exclusive open and restart, exact accounting of corrupt rings, and random garbage in
//! every file (no panic, no fault, no hang).

mod common;

use ambidex_transport::region::Mapping;
use ambidex_transport::{
    AccessError, ClusterConfig, Completion, Datagram, Endpoint, EndpointAddr, LocalBuf,
    OneSidedKind, OneSidedOp, Perms, RemoteAddr, SharedNode,
};
use ambidex_transport_shm::{ShmCluster, ShmNode};
use common::{fresh_dir, inject, RogueRing};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Removes the directory even when the test fails.
struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = ShmCluster::remove(&self.0);
    }
}

fn small_config() -> ClusterConfig {
    let mut c = ClusterConfig::new(2, 2);
    c.mtu = 256;
    c.recv_depth = 16;
    c.max_onesided = 256;
    c
}

fn one_read(ep: &mut dyn Endpoint, remote: RemoteAddr, scratch: u32) -> Completion {
    ep.post(&[OneSidedOp {
        wr_id: 5,
        remote,
        kind: OneSidedKind::Read {
            len: 8,
            dest: LocalBuf {
                region: scratch,
                offset: 0,
            },
        },
        signaled: true,
    }])
    .unwrap();
    let mut out = Vec::new();
    assert_eq!(ep.poll_cq(1, &mut out), 1, "shm completions are immediate");
    out[0]
}

#[test]
fn create_open_and_remove_report_errors() {
    let dir = Dir(fresh_dir("life"));
    let cfg = small_config();
    assert!(
        ShmNode::open(&dir.0, 0).is_err(),
        "opened a missing cluster"
    );
    ShmCluster::create(&dir.0, &cfg).unwrap();
    ShmCluster::create(&dir.0, &cfg).expect("create is idempotent");
    let mut other = cfg.clone();
    other.threads_per_node = 3;
    assert!(
        ShmCluster::create(&dir.0, &other).is_err(),
        "reconfigured a live cluster"
    );
    assert!(
        ShmNode::open(&dir.0, 2).is_err(),
        "opened a node outside the cluster"
    );
    let bad = ClusterConfig::new(0, 1);
    assert!(ShmCluster::create(&fresh_dir("bad"), &bad).is_err());

    // A cluster file that is not one is an error, never a panic.
    let n0 = ShmNode::open(&dir.0, 0).unwrap();
    drop(n0);
    std::fs::write(dir.0.join("cluster.json"), b"{\"nodes\": 65535, garbage").unwrap();
    assert!(ShmNode::open(&dir.0, 0).is_err());
    std::fs::write(dir.0.join("cluster.json"), vec![b'['; 1 << 20]).unwrap();
    assert!(ShmNode::open(&dir.0, 0).is_err());

    ShmCluster::remove(&dir.0).unwrap();
    assert!(!dir.0.exists());
}

#[test]
fn node_is_exclusive_and_restarts_with_new_regions() {
    let dir = Dir(fresh_dir("restart"));
    let cfg = small_config();
    ShmCluster::create(&dir.0, &cfg).unwrap();
    let n0 = ShmNode::open(&dir.0, 0).unwrap();
    let mut ep = n0.endpoint(0).unwrap();
    let scratch = n0.register(64, Perms::ALL).unwrap();

    let n1 = ShmNode::open_node(&dir.0, 1).unwrap();
    assert!(ShmNode::open(&dir.0, 1).is_err(), "a node open twice");
    let gen1 = n1.generation();
    let n1: SharedNode = std::sync::Arc::new(n1);
    let region = ambidex_transport::NodeTransport::register(&*n1, 4096, Perms::ALL).unwrap();
    region
        .mem
        .word(0)
        .unwrap()
        .store(42, std::sync::atomic::Ordering::SeqCst);
    let c = one_read(&mut *ep, region.desc.at(0), scratch.id());
    assert_eq!(c.status, Ok(()));
    assert_eq!(
        scratch
            .mem
            .word(0)
            .unwrap()
            .load(std::sync::atomic::Ordering::SeqCst),
        42
    );
    let old_file = dir.0.join(format!("region-1-{gen1}-0"));
    assert!(old_file.exists());
    let old = region.desc;
    drop(region);
    drop(n1); // the node closes: its flock and its regions go with it
    assert_eq!(
        one_read(&mut *ep, old.at(0), scratch.id()).status,
        Err(AccessError::UnknownRegion),
        "a closed node's region still answers"
    );
    // Its receive block's header scribbled over meanwhile: the owner repairs it at open.
    {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.0.join("rx-1-0"))
            .unwrap();
        std::os::unix::fs::FileExt::write_at(&f, &[0xffu8; 64], 0).unwrap();
    }

    let n1 = ShmNode::open_node(&dir.0, 1).expect("reopen after the owner went away");
    assert!(n1.generation() != gen1);
    assert!(
        !old_file.exists(),
        "a dead generation's region file was left behind"
    );
    // The initiator had the old region cached: it must notice the restart.
    assert_eq!(
        one_read(&mut *ep, old.at(0), scratch.id()).status,
        Err(AccessError::UnknownRegion)
    );
    let fresh = ambidex_transport::NodeTransport::register(&n1, 64, Perms::READ).unwrap();
    assert_eq!(fresh.desc.id, old.id, "ids restart with the generation");
    assert_eq!(
        one_read(&mut *ep, old.at(0), scratch.id()).status,
        Err(AccessError::BadKey),
        "a stale key reached a new region"
    );
    assert_eq!(
        one_read(&mut *ep, fresh.desc.at(0), scratch.id()).status,
        Ok(())
    );
    let mut ep1 = ambidex_transport::NodeTransport::endpoint(&n1, 0).unwrap();
    ep.send(&[Datagram {
        dst: ep1.addr(),
        payload: b"after repair",
    }])
    .unwrap();
    let got = ambidex_transport::conformance::recv_n(&mut *ep1, 1, Duration::from_secs(5));
    assert_eq!(got, vec![(ep.addr(), b"after repair".to_vec())]);
    // Violations against node 1 are counted in node 1's shared counters.
    let v = ambidex_transport::NodeTransport::counters(&n1).get("remote_access_violations");
    assert!(v >= 2, "violations not counted at the target: {v}");
}

#[test]
fn corrupt_rings_are_counted_exactly_and_resynchronised() {
    let dir = Dir(fresh_dir("corrupt"));
    let cfg = small_config();
    ShmCluster::create(&dir.0, &cfg).unwrap();
    let n0 = ShmNode::open(&dir.0, 0).unwrap();
    let n1 = ShmNode::open(&dir.0, 1).unwrap();
    let mut rx = n0.endpoint(0).unwrap();
    let dst = rx.addr();
    // One corruption of each kind in every ring of 0.0's block.
    let senders: Vec<usize> = (0..cfg.endpoints()).collect();
    let injected = inject(&cfg, &dir.0, dst, &senders);
    assert_eq!(injected, 4);
    assert_eq!(
        rx.poll_recv(64, &mut |s, p| panic!("delivered garbage from {s}: {p:?}")),
        0
    );
    assert_eq!(rx.counters().get("rx_dropped_corrupt_ring"), 4);

    // Every sender (opened after the corruption) gets through again; a sender that
    // resumes from a misaligned tail loses at most its first doorbell, and it is counted.
    let mut txs: Vec<Box<dyn Endpoint>> = vec![n0.endpoint(1).unwrap()];
    txs.push(n1.endpoint(0).unwrap());
    txs.push(n1.endpoint(1).unwrap());
    let mut received = 0;
    let mut sent = 0;
    for round in 0..3u8 {
        for tx in txs.iter_mut() {
            tx.send(&[Datagram {
                dst,
                payload: &[round; 40],
            }])
            .unwrap();
            sent += 1;
        }
        rx.send(&[Datagram {
            dst,
            payload: &[round; 40],
        }])
        .unwrap();
        sent += 1;
        let got = rx.poll_recv(64, &mut |_, p| assert_eq!(p, &[round; 40]));
        if round > 0 {
            assert_eq!(got, 4, "a resynchronised ring lost a datagram");
        }
        received += got;
    }
    let corrupt = rx.counters().get("rx_dropped_corrupt_ring") - 4;
    assert!(corrupt <= 1);
    assert_eq!(received as u64 + corrupt, sent);
}

/// xorshift64*: deterministic, dependency-free.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Overwrites one aligned word of `path` (the whole file is mapped by a rogue writer).
fn scribble(cfg: &ClusterConfig, path: &Path, rng: &mut Rng, near_start: bool) {
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
    else {
        return;
    };
    let size = f.metadata().map(|m| m.len()).unwrap_or(0) as usize;
    if size < 8 {
        return;
    }
    let map = Mapping::shared_file(f.as_raw_fd(), size).unwrap();
    let word = |off: usize| unsafe { map.as_ptr().add(off) as *mut u64 };
    let name = path.file_name().unwrap().to_string_lossy().to_string();
    if let (Some(rest), true) = (name.strip_prefix("rx-"), rng.below(2) == 0) {
        // A rogue sender: a bad record and/or a bad tail in one ring.
        let mut it = rest.split('-').map(|x| x.parse::<u16>().unwrap());
        let dst = EndpointAddr::new(it.next().unwrap(), it.next().unwrap());
        let r = RogueRing::open(cfg, path.parent().unwrap(), dst, rng.below(4) as usize);
        let t = r.tail();
        if rng.below(2) == 0 {
            let len = [rng.next() as u32, u32::MAX, rng.below(300) as u32][rng.below(3) as usize];
            r.write_header(t, len, cfg.epoch);
        }
        let nt = match rng.below(4) {
            0 => t.wrapping_add(rng.below(600)),
            1 => t.wrapping_sub(rng.below(600)),
            2 => t.wrapping_add(rng.below(8) * r.cap),
            _ => rng.next(),
        };
        r.set_tail(nt);
        r.notify(cfg);
        return;
    }
    if name.ends_with(".regions") && rng.below(2) == 0 {
        // A plausible entry of the current generation (header word 4), to get past the
        // generation check into the field validation.
        let gen = unsafe { word(32).read_volatile() };
        let id = rng.below(8) as usize;
        let e = 64 + 64 * id;
        let len = [rng.below(1 << 14), 1 << 41, u64::MAX, 64, 4096][rng.below(5) as usize];
        let fields = [gen, id as u64, len, rng.next() | 1, rng.below(9)];
        for (i, v) in fields.into_iter().enumerate().rev() {
            unsafe { word(e + 8 * i).write_volatile(v) };
        }
        return;
    }
    let span = if near_start {
        size.min(64 * 1024)
    } else {
        size
    };
    let off = (rng.below(span as u64 / 8) * 8) as usize;
    let p = word(off);
    let old = unsafe { p.read_volatile() };
    let v = match rng.below(6) {
        0 => rng.next(),
        1 => old.wrapping_add(rng.below(64)),
        2 => old.wrapping_sub(rng.below(64)),
        3 => rng.below(1 << 20),
        4 => u64::MAX - rng.below(16),
        _ => 0,
    };
    unsafe { p.write_volatile(v) };
}

#[test]
fn random_garbage_in_every_file_is_survived() {
    // A hang is a failure too.
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(120));
        eprintln!("random_garbage_in_every_file_is_survived: hung");
        std::process::abort();
    });
    let dir = Dir(fresh_dir("fuzz"));
    let cfg = small_config();
    ShmCluster::create(&dir.0, &cfg).unwrap();
    let nodes = [
        ShmNode::open(&dir.0, 0).unwrap(),
        ShmNode::open(&dir.0, 1).unwrap(),
    ];
    let mut eps: Vec<Box<dyn Endpoint>> = Vec::new();
    let mut regions = Vec::new();
    for n in &nodes {
        for t in 0..cfg.threads_per_node {
            eps.push(n.endpoint(t).unwrap());
        }
        regions.push(n.register(512, Perms::ALL).unwrap());
        regions.push(n.register(64, Perms::READ).unwrap());
    }
    let scratch = [regions[0].id(), regions[2].id()];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let payload = [0xabu8; 256];
    let data = [7u8; 64];
    for round in 0..400 {
        // Scribble over a few words of random files of the directory.
        let files: Vec<PathBuf> = std::fs::read_dir(&dir.0)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| !p.to_string_lossy().ends_with(".lock"))
            .collect();
        for _ in 0..1 + rng.below(4) {
            let f = &files[rng.below(files.len() as u64) as usize];
            let near_start = rng.below(2) == 0;
            scribble(&cfg, f, &mut rng, near_start);
        }
        for (i, ep) in eps.iter_mut().enumerate() {
            ep.poll_recv(64, &mut |s, p| {
                assert!(cfg.contains(s) && p.len() <= cfg.mtu, "impossible datagram");
            });
            let batch: Vec<Datagram> = (0..1 + rng.below(20))
                .map(|_| Datagram {
                    dst: EndpointAddr::new(rng.below(2) as u16, rng.below(2) as u16),
                    payload: &payload[..rng.below(257) as usize],
                })
                .collect();
            ep.send(&batch).unwrap();
            let mut ops = Vec::new();
            for k in 0..8 {
                let r = &regions[rng.below(regions.len() as u64) as usize];
                let mut remote = r.desc.at(rng.below(600));
                if rng.below(4) == 0 {
                    remote.region = rng.below(8) as u32;
                }
                if rng.below(8) == 0 {
                    remote.key = rng.next();
                }
                let kind = match rng.below(4) {
                    0 => OneSidedKind::Read {
                        len: rng.below(300) as u32,
                        dest: LocalBuf {
                            region: scratch[i / 2],
                            offset: rng.below(512),
                        },
                    },
                    1 => OneSidedKind::Write {
                        data: &data[..rng.below(65) as usize],
                    },
                    2 => OneSidedKind::Cas {
                        expected: 0,
                        new: round,
                    },
                    _ => OneSidedKind::Faa { add: 1 },
                };
                ops.push(OneSidedOp {
                    wr_id: k,
                    remote,
                    kind,
                    signaled: rng.below(2) == 0,
                });
            }
            ep.post(&ops).unwrap();
            let mut out = Vec::new();
            ep.poll_cq(64, &mut out);
            ep.wait(Duration::from_micros(10));
            let _ = ep.counters();
        }
        let _ = ambidex_transport::NodeTransport::counters(&*nodes[0]);
    }
    // The garbage did reach the checks (this test is not vacuous).
    let corrupt: u64 = eps
        .iter()
        .map(|e| e.counters().get("rx_dropped_corrupt_ring"))
        .sum();
    let errors: u64 = eps
        .iter()
        .map(|e| e.counters().get("onesided_errors"))
        .sum();
    let delivered: u64 = eps.iter().map(|e| e.counters().get("rx_datagrams")).sum();
    eprintln!("garbage survived: {corrupt} corrupt rings, {errors} one-sided errors, {delivered} delivered");
    assert!(corrupt > 0 && errors > 0 && delivered > 0);
    // Whatever the files hold, reopening is an error or a working node, never a crash.
    drop(eps);
    drop(nodes);
    for n in 0..2 {
        let _ = ShmNode::open(&dir.0, n).map(|node| node.endpoint(0).map(|_| ()));
    }
}
