//! One-sided access over the `local` transport: a coroutine of a runtime on node 1 reads
//! node 0's table with READs (and locks/writes it with CAS/WRITE) while node 0's threads
//! update it.

mod common;

use ambidex_rpc::Runtime;
use ambidex_store::{Header, LockOwner, TableDesc};
use ambidex_store::{
    LocationCache, RemoteError, RemoteGet, RemoteReader, StoreError, Table, TableConfig,
};
use ambidex_transport::local::LocalFabric;
use ambidex_transport::{AccessError, ClusterConfig, Perms};
use common::{reader_runtime, run_to_end};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

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
        let mut rt = reader_runtime(node1.as_ref(), 0, 1, desc.layout.item_size as usize);
        let (n, stats) = run_to_end(&mut rt, move |ctx| async move {
            let rd = RemoteReader::new();
            let cache = LocationCache::new(64);
            let mut out = vec![0u8; VS];
            let mut last = vec![0u64; keys as usize];
            let end = ctx.now_ns() + 1_200_000_000;
            let mut n = 0;
            while ctx.now_ns() < end {
                for k in 0..keys {
                    match rd.get(&ctx, &desc, Some(&cache), k, &mut out).await {
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
            (n, rd.stats())
        });
        stop.store(true, Ordering::Relaxed);
        assert!(n > 100, "reads done: {n}");
        assert!(stats.cache_hits > 0);
        eprintln!("remote reads {n}, stats {stats:?}");
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
        // Remote incrementers, one runtime per thread: READ, CAS-lock at the version
        // read, WRITE + unlock.
        for th in 0..2u16 {
            let node1 = node1.clone();
            s.spawn(move || {
                let mut rt = reader_runtime(node1.as_ref(), th, 1, 64);
                run_to_end(&mut rt, move |ctx| async move {
                    let rd = RemoteReader::new();
                    let mut i = 0;
                    while i < per {
                        let k = i % 2;
                        let mut b = [0u8; 8];
                        let (version, offset) = match rd.get(&ctx, &desc, None, k, &mut b).await {
                            Ok(RemoteGet::Found { version, offset }) => (version, offset),
                            Err(RemoteError::Busy) => continue,
                            r => panic!("{r:?}"),
                        };
                        let locked = rd.lock(&ctx, &desc, offset, version, REMOTE).await;
                        if !locked.unwrap() {
                            continue;
                        }
                        let val = (u64::from_le_bytes(b) + 1).to_le_bytes();
                        let nv = rd
                            .write_unlock(&ctx, &desc, offset, k, version, REMOTE, &val)
                            .await;
                        assert_eq!(nv, Ok(version + 2));
                        i += 1;
                    }
                });
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
    let t = Rc::new(owner_table(&fabric, &cfg));
    let desc = t.desc();
    let node1 = fabric.node(1);
    let mut rt = reader_runtime(node1.as_ref(), 0, 1, 64);
    // The owner's table is used between the remote operations, on this same thread.
    run_to_end(&mut rt, move |ctx| async move {
        let rd = RemoteReader::new();
        let cache = LocationCache::new(16);
        let mut out = [0u8; 16];
        let ctx = &ctx;
        t.insert(1, &[1; 16]).unwrap();
        let first = rd.get(ctx, &desc, Some(&cache), 1, &mut out).await;
        assert!(matches!(first, Ok(RemoteGet::Found { .. })));
        let reads = rd.stats().reads;
        rd.get(ctx, &desc, Some(&cache), 1, &mut out).await.unwrap();
        assert_eq!(rd.stats().reads, reads + 1, "a cache hit is one READ");
        assert_eq!(rd.stats().cache_hits, 1);
        // The item is deleted and reused for key 2: the cached location now holds key 2.
        t.delete(1).unwrap();
        t.insert(2, &[2; 16]).unwrap();
        assert_eq!(
            rd.get(ctx, &desc, Some(&cache), 1, &mut out).await,
            Ok(RemoteGet::NotFound)
        );
        assert_eq!(rd.stats().cache_stale, 1);
        t.insert(1, &[3; 16]).unwrap();
        assert!(matches!(
            rd.get(ctx, &desc, Some(&cache), 1, &mut out).await,
            Ok(RemoteGet::Found { .. })
        ));
        assert_eq!(out, [3; 16]);
        // A remote CAS lock is seen by the owner's lockers.
        let Ok(RemoteGet::Found { version, offset }) = rd.get(ctx, &desc, None, 2, &mut out).await
        else {
            panic!()
        };
        assert_eq!(rd.lock(ctx, &desc, offset, version, REMOTE).await, Ok(true));
        // The CAS installed the remote owner in the lock word.
        assert_eq!(
            t.header(2),
            Some(Header {
                owner: Some(REMOTE),
                version
            })
        );
        assert_eq!(t.try_lock(2, OWNER), Err(StoreError::Locked));
        assert_eq!(
            rd.lock(ctx, &desc, offset, version, REMOTE).await,
            Ok(false)
        );
        // An unlock naming another owner changes nothing.
        assert_eq!(
            rd.unlock(ctx, &desc, offset, version, OWNER).await,
            Ok(false)
        );
        assert_eq!(t.try_lock(2, OWNER), Err(StoreError::Locked));
        assert_eq!(
            rd.unlock(ctx, &desc, offset, version, REMOTE).await,
            Ok(true)
        );
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
        assert_eq!(
            rd.lock(ctx, &desc, offset, version, REMOTE).await,
            Ok(false)
        );
        t.unlock(lk, false);
        // A remote lock, WRITE and unlock is visible to the owner.
        assert_eq!(rd.lock(ctx, &desc, offset, version, REMOTE).await, Ok(true));
        let nv = rd
            .write_unlock(ctx, &desc, offset, 2, version, REMOTE, &[7; 16])
            .await;
        assert_eq!(nv, Ok(version + 2));
        let mut b = [0u8; 16];
        assert_eq!(t.get(2, &mut b).unwrap(), version + 2);
        assert_eq!(b, [7; 16]);
        assert_eq!(t.header(2).and_then(|h| h.owner), None);
        // Bad descriptors and keys are errors, not panics.
        let mut bad = desc;
        bad.layout.capacity = u32::MAX;
        assert!(matches!(
            rd.get(ctx, &bad, None, 1, &mut out).await,
            Err(RemoteError::BadDesc(_))
        ));
        let mut badkey = desc;
        badkey.region.key ^= 1;
        assert_eq!(
            rd.get(ctx, &badkey, None, 1, &mut out).await,
            Err(RemoteError::Access(AccessError::BadKey))
        );
        assert_eq!(
            rd.lock(ctx, &badkey, offset, version + 2, REMOTE).await,
            Err(RemoteError::Access(AccessError::BadKey))
        );
        // A refused write_unlock (its unsignaled WRITEs fail first) changes nothing, and
        // its failures are reported by it, not by the next call.
        assert_eq!(
            rd.write_unlock(ctx, &badkey, offset, 2, version + 2, REMOTE, &[9; 16])
                .await,
            Err(RemoteError::Access(AccessError::BadKey))
        );
        assert_eq!(
            rd.get(ctx, &desc, None, 2, &mut out).await,
            Ok(RemoteGet::Found {
                version: version + 2,
                offset
            })
        );
        assert_eq!(out, [7; 16]);
    });
}

/// What a spawned `get` returned, with the value it copied out.
type Got = Rc<RefCell<Option<(Result<RemoteGet, RemoteError>, Vec<u8>)>>>;

/// Spawns a coroutine of `rt` that gets `key` with `rd`; its result lands in the slot.
fn spawn_get(rt: &mut Runtime, rd: &Rc<RemoteReader>, desc: TableDesc, key: u64) -> Got {
    let got: Got = Rc::default();
    let (rd, g) = (rd.clone(), got.clone());
    rt.spawn(move |ctx| async move {
        let mut out = vec![0u8; desc.layout.value_size as usize];
        let r = rd.get(&ctx, &desc, None, key, &mut out).await;
        *g.borrow_mut() = Some((r, out));
    });
    got
}

#[test]
fn a_locked_item_is_read_again_until_its_local_writer_unlocks() {
    let fabric = LocalFabric::new(ClusterConfig::new(2, 1)).unwrap();
    let t = Rc::new(owner_table(&fabric, &TableConfig::new(8, 16)));
    t.insert(5, &[1; 16]).unwrap();
    let desc = t.desc();
    let node1 = fabric.node(1);
    // Coroutines 0, 1 and 3 read (2 only writes locally).
    let mut rt = reader_runtime(node1.as_ref(), 0, 4, 64);
    let rd = Rc::new(RemoteReader::new());

    // 1. The test holds the lock while it steps the runtime: the worker keeps reading.
    let lk = t.lock(5, OWNER).unwrap();
    let got = spawn_get(&mut rt, &rd, desc, 5);
    for _ in 0..200 {
        rt.poll_once();
    }
    assert!(got.borrow().is_none(), "a locked item was returned");
    let retries = rd.stats().retries;
    assert!(retries >= 10, "the worker made progress: {retries} retries");
    t.write_locked(&lk, &[2; 16]).unwrap();
    let v1 = t.unlock(lk, true);
    assert_eq!(v1, lk.version + 2);
    rt.run_until(|_| got.borrow().is_some());
    let (r, out) = got.take().unwrap();
    assert_eq!(
        r,
        Ok(RemoteGet::Found {
            version: v1,
            offset: lk.offset
        })
    );
    assert_eq!(out, [2; 16].to_vec());

    // 2. Another coroutine of the same runtime holds the lock for a while: the reading
    // worker does not block the thread, so the writer gets to unlock.
    let lk = t.lock(5, OWNER).unwrap();
    let got = spawn_get(&mut rt, &rd, desc, 5);
    let (t2, before) = (t.clone(), rd.stats().retries);
    run_to_end(&mut rt, move |ctx| async move {
        for _ in 0..50 {
            ctx.yield_now().await;
        }
        t2.write_locked(&lk, &[3; 16]).unwrap();
        t2.unlock(lk, true)
    });
    rt.run_until(|_| got.borrow().is_some());
    let (r, out) = got.take().unwrap();
    assert_eq!(
        r,
        Ok(RemoteGet::Found {
            version: v1 + 2,
            offset: lk.offset
        })
    );
    assert_eq!(out, [3; 16].to_vec());
    assert!(rd.stats().retries > before);

    // 3. A lock held past the retry budget: `Busy`, and nothing copied out.
    let lk = t.lock(5, OWNER).unwrap();
    let mut short = RemoteReader::new();
    short.max_retries = 3;
    let (r, out, stats) = run_to_end(&mut rt, move |ctx| async move {
        let mut out = [0u8; 16];
        let r = short.get(&ctx, &desc, None, 5, &mut out).await;
        (r, out, short.stats())
    });
    assert_eq!(r, Err(RemoteError::Busy));
    assert_eq!(out, [0; 16]);
    assert_eq!(stats.retries, 4);
    t.unlock(lk, false);
}

#[test]
fn a_torn_item_is_read_again_until_it_is_whole() {
    let fabric = LocalFabric::new(ClusterConfig::new(2, 1)).unwrap();
    let t = owner_table(&fabric, &TableConfig::new(8, 40));
    t.insert(4, &[4; 40]).unwrap();
    let desc = t.desc();
    let node1 = fabric.node(1);
    let mut rt = reader_runtime(node1.as_ref(), 0, 2, 64);
    let rd = Rc::new(RemoteReader::new());
    let r = rd.clone();
    let first = run_to_end(&mut rt, move |ctx| async move {
        r.get(&ctx, &desc, None, 4, &mut [0; 40]).await
    });
    let Ok(RemoteGet::Found { version, offset }) = first else {
        panic!("{first:?}")
    };
    // The owner's region, as a writer in the middle of its stores leaves it: one chunk
    // version still MARKER while the header is unlocked.
    let region = fabric.node(0).region(desc.region.id).unwrap();
    let shape = ambidex_store::layout::ItemShape::new(&desc.layout);
    let at = offset + 8 * *shape.versions.last().unwrap() as u64;
    assert!(region
        .mem
        .write(at, &ambidex_store::layout::MARKER.to_ne_bytes()));
    let got = spawn_get(&mut rt, &rd, desc, 4);
    for _ in 0..100 {
        rt.poll_once();
    }
    assert!(got.borrow().is_none(), "a torn item was returned");
    assert!(rd.stats().retries >= 10);
    assert!(region.mem.write(at, &version.to_ne_bytes()));
    rt.run_until(|_| got.borrow().is_some());
    let (res, out) = got.take().unwrap();
    assert_eq!(res, Ok(RemoteGet::Found { version, offset }));
    assert_eq!(out, [4; 40].to_vec());
}
