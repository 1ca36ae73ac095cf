//! The epoch fence against initiators in other processes: an owner's `set_epoch` waits
//! for an initiator that is inside its fence in an older epoch while that process lives,
//! and returns (reclaiming the slot) once it was SIGKILLed there.
//!
//! "Inside the fence" is made deterministic: the child process opens node 1 and stores
//! in its slot of node 0's fence file exactly what an endpoint stores while it performs
//! an operation (`fence::slot_value` of its tag and epoch), then stays there, as a
//! process stopped or killed in the middle of an operation would.

mod common;

use ambidex_transport::fence;
use ambidex_transport::{
    ClusterConfig, EndpointAddr, NodeTransport, OneSidedKind, OneSidedOp, Perms, RegionDesc,
};
use ambidex_transport_shm::{ShmCluster, ShmNode};
use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const CHILD_ENV: &str = "AMBIDEX_FENCE_TEST_CHILD";
const WRITER_ENV: &str = "AMBIDEX_FENCE_TEST_WRITER";
/// The fence file's header; slot `i` follows at `HEADER + 64 * i`.
const HEADER: u64 = 64;

fn config() -> ClusterConfig {
    let mut c = ClusterConfig::new(2, 2);
    c.recv_depth = 64;
    c.cluster_id ^= std::process::id() as u64;
    c
}

/// Kills the child process however the test ends (a failed assertion must not leave it
/// sleeping forever, holding the test harness's output pipe).
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Not a test on its own: the child process's body (runs only when re-executed).
#[test]
fn fence_child() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let node = ShmNode::open_node(&dir, 1).expect("child opens node 1");
    let cfg = ambidex_transport::NodeTransport::config(&node).clone();
    let slot = cfg.endpoint_index(EndpointAddr::new(1, 0)) as u64;
    let tag = (node.generation() & 0x7fff_ffff) as u32;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("node-0.fence"))
        .unwrap();
    f.write_all_at(
        &fence::slot_value(tag, cfg.epoch).to_le_bytes(),
        HEADER + 64 * slot,
    )
    .unwrap();
    println!("inside");
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn set_epoch_waits_for_a_live_initiator_and_reclaims_a_killed_one() {
    let dir = common::fresh_dir("fence");
    let config = config();
    ShmCluster::create(&dir, &config).unwrap();
    let node = ShmNode::open(&dir, 0).unwrap();
    let mut child = KillOnDrop(
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "fence_child", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &dir)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = BufReader::new(child.0.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("inside") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "child died");
    }

    let mut ep = node.endpoint(0).unwrap();
    let (tx, rx) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        ep.set_epoch(config.epoch + 1);
        tx.send(()).unwrap();
        ep
    });
    // The initiator is alive and inside with the old epoch: the owner must wait. (A
    // slow machine only makes this wait longer; it cannot make it pass wrongly.)
    assert_eq!(
        rx.recv_timeout(Duration::from_millis(500)),
        Err(mpsc::RecvTimeoutError::Timeout),
        "set_epoch returned while an initiator of the old epoch was inside"
    );
    drop(child);
    rx.recv_timeout(Duration::from_secs(60))
        .expect("set_epoch still waits for a SIGKILLed initiator");
    let ep = waiter.join().unwrap();
    assert_eq!(node.counters().get("fence_reclaimed"), 1);
    assert!(ep.counters().get("fence_waits") >= 1);
    drop(ep);
    drop(node);
    let _ = ShmCluster::remove(&dir);
}

/// Not a test on its own: the racing writer's body (runs only when re-executed). Opens
/// node 1 and WRITEs 1, 2, 3, ... to word 0 of the region of node 0 described in the
/// environment, in the configuration's epoch, until killed.
#[test]
fn fence_writer() {
    let Ok(arg) = std::env::var(WRITER_ENV) else {
        return;
    };
    let (dir, desc) = arg.split_once(';').unwrap();
    let bytes: Vec<u8> = (0..desc.len() / 2)
        .map(|i| u8::from_str_radix(&desc[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let desc = RegionDesc::decode(&bytes).unwrap();
    let node = ShmNode::open(&PathBuf::from(dir), 1).expect("writer opens node 1");
    let mut ep = node.endpoint(0).unwrap();
    let mut out = Vec::new();
    println!("writing");
    for i in 1u64.. {
        let data = i.to_le_bytes();
        ep.post(&[OneSidedOp {
            wr_id: i,
            remote: desc.at(0),
            kind: OneSidedKind::Write { data: &data },
            signaled: false,
        }])
        .unwrap();
        out.clear();
        ep.poll_cq(16, &mut out);
    }
}

/// A process WRITEs a word of node 0 in a loop in the old epoch while node 0 moves on:
/// once `set_epoch` returned, the word never changes again although the writer keeps
/// trying (its attempts are counted at node 0 as `onesided_epoch_errors`).
#[test]
fn no_write_of_an_older_epoch_lands_after_set_epoch_across_processes() {
    let dir = common::fresh_dir("fence-race");
    let config = config();
    ShmCluster::create(&dir, &config).unwrap();
    let node = ShmNode::open(&dir, 0).unwrap();
    let region = node.register(4096, Perms::ALL).unwrap();
    let desc: String = region
        .desc
        .encode()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut child = KillOnDrop(
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "fence_writer", "--nocapture", "--test-threads=1"])
            .env(WRITER_ENV, format!("{};{desc}", dir.display()))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = BufReader::new(child.0.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("writing") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "writer died");
    }
    let word = region.mem.word(0).unwrap();
    while word.load(std::sync::atomic::Ordering::SeqCst) < 1000 {
        std::thread::yield_now();
    }
    let mut ep = node.endpoint(0).unwrap();
    ep.set_epoch(config.epoch + 1);
    let at_fence = word.load(std::sync::atomic::Ordering::SeqCst);
    let refused = |n: &dyn NodeTransport| n.counters().get("onesided_epoch_errors");
    // Until the writer was refused 5000 times, or a write landed (a broken fence).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while refused(&*node) < 5000
        && word.load(std::sync::atomic::Ordering::SeqCst) == at_fence
        && std::time::Instant::now() < deadline
    {
        std::thread::yield_now();
    }
    assert_eq!(
        word.load(std::sync::atomic::Ordering::SeqCst),
        at_fence,
        "a write of the old epoch landed after set_epoch returned"
    );
    assert!(refused(&*node) >= 5000, "the writer was not refused");
    drop(child);
    drop(ep);
    drop(node);
    let _ = ShmCluster::remove(&dir);
}
