//! A second *process* reads the table one-sided over the shm transport while the owner
//! process updates it. The test re-runs its own binary as the reader (the ignored test
//! `shm_child_reader`, selected through an environment variable), whose reads are a
//! coroutine of a runtime on node 1.

mod common;

use ambidex_store::LockOwner;
use ambidex_store::{
    LocationCache, RemoteError, RemoteGet, RemoteReader, Table, TableConfig, TableDesc,
};
use ambidex_transport::{ClusterConfig, Perms};
use ambidex_transport_shm::{ShmCluster, ShmNode};
use common::{reader_runtime, run_to_end};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

/// The lock owner of this test's local lockers.
const OWNER: LockOwner = LockOwner {
    node: 0,
    thread: 1,
    slot: 2,
};

const VS: usize = 1000;
const KEYS: u64 = 6;
const ENV: &str = "AMBIDEX_STORE_SHM_DIR";

fn image(version: u64) -> Vec<u8> {
    (0..VS / 8).flat_map(|_| version.to_le_bytes()).collect()
}

fn consistent(out: &[u8], version: u64) -> bool {
    out.chunks(8).all(|c| c == version.to_le_bytes())
}

#[test]
fn second_process_reads_one_sided_while_owner_updates() {
    let dir = std::env::temp_dir().join(format!("ambidex-store-shm-{}", std::process::id()));
    let dir = if PathBuf::from("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm").join(dir.file_name().unwrap())
    } else {
        dir
    };
    let _ = ShmCluster::remove(&dir);
    ShmCluster::create(&dir, &ClusterConfig::new(2, 1)).unwrap();
    let node0 = ShmNode::open(&dir, 0).unwrap();
    let cfg = TableConfig {
        buckets: Some(1),
        ..TableConfig::new(32, VS)
    };
    let region = node0
        .register(Table::required_len(&cfg).unwrap(), Perms::ALL)
        .unwrap();
    let t = Table::create(region, 3, &cfg).unwrap();
    for k in 0..KEYS {
        t.insert(k, &image(0)).unwrap();
        let lk = t.lock(k, OWNER).unwrap();
        t.write_locked(&lk, &image(lk.version + 2)).unwrap();
        t.unlock(lk, true);
    }
    std::fs::write(
        dir.join("table.json"),
        serde_json::to_vec(&t.desc()).unwrap(),
    )
    .unwrap();

    let stop = AtomicBool::new(false);
    let output = std::thread::scope(|s| {
        s.spawn(|| {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let k = i % KEYS;
                i += 1;
                let lk = t.lock(k, OWNER).unwrap();
                t.write_locked(&lk, &image(lk.version + 2)).unwrap();
                t.unlock(lk, true);
            }
        });
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "shm_child_reader",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ENV, &dir)
            .output();
        stop.store(true, Ordering::Relaxed);
        out.unwrap()
    });
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    drop(t);
    drop(node0);
    // The table descriptor is this test's own file; the backend removes only its own.
    let _ = std::fs::remove_file(dir.join("table.json"));
    let _ = ShmCluster::remove(&dir);
    assert!(
        output.status.success(),
        "reader process failed:\n{stdout}\n{stderr}"
    );
    let reads: u64 = stdout
        .lines()
        .find_map(|l| l.split("consistent_reads=").nth(1))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no report from the reader:\n{stdout}\n{stderr}"));
    assert!(reads > 100, "reader made {reads} reads");
}

/// The reader process (run by the test above).
#[test]
#[ignore]
fn shm_child_reader() {
    let Some(dir) = std::env::var_os(ENV).map(PathBuf::from) else {
        return;
    };
    let desc: TableDesc =
        serde_json::from_slice(&std::fs::read(dir.join("table.json")).unwrap()).unwrap();
    let node1 = ShmNode::open(&dir, 1).unwrap();
    let mut rt = reader_runtime(node1.as_ref(), 0, 1, desc.layout.item_size as usize);
    let (n, stats) = run_to_end(&mut rt, move |ctx| async move {
        let rd = RemoteReader::new();
        let cache = LocationCache::new(64);
        let mut out = vec![0u8; VS];
        let mut last = [0u64; KEYS as usize];
        let mut changed = 0u64;
        let mut n = 0u64;
        let end = ctx.now_ns() + 1_500_000_000;
        while ctx.now_ns() < end {
            for k in 0..KEYS {
                match rd.get(&ctx, &desc, Some(&cache), k, &mut out).await {
                    Ok(RemoteGet::Found { version, .. }) => {
                        assert!(
                            consistent(&out, version),
                            "torn read of key {k} at version {version}"
                        );
                        assert!(version >= last[k as usize], "version of {k} went back");
                        if version > last[k as usize] {
                            changed += 1;
                        }
                        last[k as usize] = version;
                        n += 1;
                    }
                    Ok(RemoteGet::NotFound) => panic!("key {k} vanished"),
                    Err(RemoteError::Busy) => {}
                    Err(e) => panic!("{e}"),
                }
            }
        }
        // The owner really was writing while we read.
        assert!(changed > 10, "only {changed} version changes seen");
        (n, rd.stats())
    });
    println!("consistent_reads={n}");
    println!("stats={stats:?}");
}
