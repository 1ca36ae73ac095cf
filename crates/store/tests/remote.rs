//! One-sided access over the `local` transport: a thread of node 1 reads node 0's table
//! with READs (and locks/writes it with CAS/WRITE) while node 0's threads update it.

use ambidex_store::{Header, LockOwner};
use ambidex_store::{
    LocationCache, RemoteError, RemoteGet, RemoteReader, StoreError, Table, TableConfig,
};
use ambidex_transport::local::LocalFabric;
use ambidex_transport::{AccessError, ClusterConfig, Perms};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The lock owner of this test's local lockers.
const OWNER: LockOwner = LockOwner {
    node: 0,
    thread: 1,
    slot: 2,
};
/// The lock owner of the remote node's CAS locks.
const REMOTE: LockOwner = LockOwner {
    node: 1,
    thread: 0,
    slot: 5,
};

const VS: usize = 4000; // 72 chunks: a READ spans many writer stores

fn image(version: u64) -> Vec<u8> {
    (0..VS / 8).flat_map(|_| version.to_le_bytes()).collect()
}

/// Sets the stop flag when dropped, so a panicking thread stops the others.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn consistent(out: &[u8], version: u64) -> bool {
    out.chunks(8).all(|c| c == version.to_le_bytes())
}

fn owner_table(fabric: &std::sync::Arc<LocalFabric>, cfg: &TableConfig) -> Table {
    let node0 = fabric.node(0);
    let region = node0
        .register(Table::required_len(cfg).unwrap(), Perms::ALL)
        .unwrap();
    Table::create(region, 7, cfg).unwrap()
}

#[test]
fn remote_reads_are_never_torn_while_owner_updates() {
    let fabric = LocalFabric::new(ClusterConfig::new(2, 2)).unwrap();
    let cfg = TableConfig {
        buckets: Some(2),
        ..TableConfig::new(64, VS)
    };
    let t = owner_table(&fabric, &cfg);
    let keys = 6u64;
    for k in 0..keys {
        t.insert(k, &image(0)).unwrap();
        let lk = t.lock(k, OWNER).unwrap();
        t.write_locked(&lk, &image(lk.version + 2)).unwrap();
        t.unlock(lk, true);
    }
    let desc = t.desc();
    let stop = AtomicBool::new(false);
    let node1 = fabric.node(1);
    let cache = LocationCache::new(64);
    std::thread::scope(|s| {
        for w in 0..2u64 {
            let (t, stop) = (&t, &stop);
            s.spawn(move || {
                let mut i = w;
                while !stop.load(Ordering::Relaxed) {
                    let k = i % keys;
                    i += 1 + w;
                    let lk = t.lock(k, OWNER).unwrap();
                    t.write_locked(&lk, &image(lk.version + 2)).unwrap();
                    t.unlock(lk, true);
                }
            });
        }
        let _stop = StopOnDrop(&stop);
        let mut ep = node1.endpoint(0).unwrap();
        let mut rd = RemoteReader::new(node1.as_ref(), desc.layout.item_size as usize).unwrap();
        let mut out = vec![0u8; VS];
        let mut last = vec![0u64; keys as usize];
        let deadline = Instant::now() + Duration::from_millis(1200);
        let mut n = 0;
        while Instant::now() < deadline {
            for k in 0..keys {
                match rd.get(ep.as_mut(), &desc, Some(&cache), k, &mut out) {
                    Ok(RemoteGet::Found { version, .. }) => {
                        assert!(consistent(&out, version), "torn remote read of {k}");
                        assert!(version >= last[k as usize]);
                        last[k as usize] = version;
                        n += 1;
                    }
                    Ok(RemoteGet::NotFound) => panic!("key {k} vanished"),
                    Err(RemoteError::Busy) => {}
                    Err(e) => panic!("{e}"),
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        assert!(n > 100, "reads done: {n}");
        assert!(rd.stats.cache_hits > 0);
        eprintln!("remote reads {n}, stats {:?}", rd.stats);
    });
}

#[test]
fn remote_and_local_lockers_lose_no_update() {
    let fabric = LocalFabric::new(ClusterConfig::new(2, 2)).unwrap();
    let cfg = TableConfig::new(16, 8);
    let t = owner_table(&fabric, &cfg);
    for k in 0..2u64 {
        t.insert(k, &0u64.to_le_bytes()).unwrap();
    }
    let desc = t.desc();
    let node1 = fabric.node(1);
    let per = 600u64;
    let local_done = AtomicU64::new(0);
    std::thread::scope(|s| {
        // Local incrementer.
        {
            let (t, local_done) = (&t, &local_done);
            s.spawn(move || {
                for i in 0..per {
                    let k = i % 2;
                    let lk = t.lock(k, OWNER).unwrap();
                    let mut b = [0u8; 8];
                    t.read_locked(&lk, &mut b).unwrap();
                    t.write_locked(&lk, &(u64::from_le_bytes(b) + 1).to_le_bytes())
                        .unwrap();
                    t.unlock(lk, true);
                    local_done.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        // Remote incrementers: READ, CAS-lock at the version read, WRITE + unlock.
        for th in 0..2u16 {
            let node1 = node1.clone();
            s.spawn(move || {
                let mut ep = node1.endpoint(th).unwrap();
                let mut rd = RemoteReader::new(node1.as_ref(), 64).unwrap();
                let mut i = 0;
                while i < per {
                    let k = i % 2;
                    let mut b = [0u8; 8];
                    let (version, offset) = match rd.get(ep.as_mut(), &desc, None, k, &mut b) {
                        Ok(RemoteGet::Found { version, offset }) => (version, offset),
                        Err(RemoteError::Busy) => continue,
                        r => panic!("{r:?}"),
                    };
                    if !rd
                        .lock(ep.as_mut(), &desc, offset, version, REMOTE)
                        .unwrap()
                    {
                        continue;
                    }
                    let nv = rd
                        .write_unlock(
                            ep.as_mut(),
                            &desc,
                            offset,
                            k,
                            version,
                            &(u64::from_le_bytes(b) + 1).to_le_bytes(),
                        )
                        .unwrap();
                    assert_eq!(nv, version + 2);
                    i += 1;
                }
            });
        }
    });
    let mut b = [0u8; 8];
    let total: u64 = (0..2u64)
        .map(|k| {
            t.get(k, &mut b).unwrap();
            u64::from_le_bytes(b)
        })
        .sum();
    assert_eq!(total, 3 * per, "lost updates");
    assert_eq!(local_done.load(Ordering::Relaxed), per);
}

#[test]
fn stale_cached_locations_are_detected() {
    let fabric = LocalFabric::new(ClusterConfig::new(2, 1)).unwrap();
    let cfg = TableConfig::new(8, 16);
    let t = owner_table(&fabric, &cfg);
    let desc = t.desc();
    let node1 = fabric.node(1);
    let mut ep = node1.endpoint(0).unwrap();
    let mut rd = RemoteReader::new(node1.as_ref(), 64).unwrap();
    let cache = LocationCache::new(16);
    let mut out = [0u8; 16];
    t.insert(1, &[1; 16]).unwrap();
    let first = rd
        .get(ep.as_mut(), &desc, Some(&cache), 1, &mut out)
        .unwrap();
    assert!(matches!(first, RemoteGet::Found { .. }));
    let reads = rd.stats.reads;
    rd.get(ep.as_mut(), &desc, Some(&cache), 1, &mut out)
        .unwrap();
    assert_eq!(rd.stats.reads, reads + 1, "a cache hit is one READ");
    // The item is deleted and reused for key 2: the cached location now holds key 2.
    t.delete(1).unwrap();
    t.insert(2, &[2; 16]).unwrap();
    assert_eq!(
        rd.get(ep.as_mut(), &desc, Some(&cache), 1, &mut out)
            .unwrap(),
        RemoteGet::NotFound
    );
    assert_eq!(rd.stats.cache_stale, 1);
    t.insert(1, &[3; 16]).unwrap();
    assert!(matches!(
        rd.get(ep.as_mut(), &desc, Some(&cache), 1, &mut out)
            .unwrap(),
        RemoteGet::Found { .. }
    ));
    assert_eq!(out, [3; 16]);
    // A remote CAS lock is seen by the owner's lockers.
    let RemoteGet::Found { version, offset } =
        rd.get(ep.as_mut(), &desc, None, 2, &mut out).unwrap()
    else {
        panic!()
    };
    assert!(rd
        .lock(ep.as_mut(), &desc, offset, version, REMOTE)
        .unwrap());
    // The CAS installed the remote owner in the lock word.
    assert_eq!(
        t.header(2),
        Some(Header {
            owner: Some(REMOTE),
            version
        })
    );
    assert_eq!(t.try_lock(2, OWNER), Err(StoreError::Locked));
    assert!(!rd
        .lock(ep.as_mut(), &desc, offset, version, REMOTE)
        .unwrap());
    // An unlock naming another owner changes nothing.
    rd.unlock(ep.as_mut(), &desc, offset, version, OWNER)
        .unwrap();
    assert_eq!(t.try_lock(2, OWNER), Err(StoreError::Locked));
    rd.unlock(ep.as_mut(), &desc, offset, version, REMOTE)
        .unwrap();
    assert_eq!(
        t.header(2),
        Some(Header {
            owner: None,
            version
        })
    );
    let lk = t.try_lock(2, OWNER).unwrap();
    assert_eq!(t.header(2).and_then(|h| h.owner), Some(OWNER));
    // The owner's lock refuses the remote CAS.
    assert!(!rd
        .lock(ep.as_mut(), &desc, offset, version, REMOTE)
        .unwrap());
    t.unlock(lk, false);
    // Bad descriptors and keys are errors, not panics.
    let mut bad = desc;
    bad.layout.capacity = u32::MAX;
    assert!(matches!(
        rd.get(ep.as_mut(), &bad, None, 1, &mut out),
        Err(RemoteError::BadDesc(_))
    ));
    let mut badkey = desc;
    badkey.region.key ^= 1;
    assert_eq!(
        rd.get(ep.as_mut(), &badkey, None, 1, &mut out),
        Err(RemoteError::Access(AccessError::BadKey))
    );
}
