//! Concurrent stress of the owner's table: lock-free readers against writers that hold
//! item locks, inserts and deletes. Every committed value has all its words equal to
//! its version, so a torn read or a value/version mismatch is caught; the final
//! versions count the commits, so a lost update is caught.

use ambidex_store::LockOwner;
use ambidex_store::{ReadOutcome, StoreError, Table, TableConfig};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The lock owner of this test's local lockers.
const OWNER: LockOwner = LockOwner {
    node: 0,
    thread: 1,
    slot: 2,
};

const VS: usize = 200; // four 64-byte chunks

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

#[test]
fn no_torn_reads_no_lost_updates() {
    let keys = 8u64; // few keys: heavy contention
    let cfg = TableConfig {
        buckets: Some(2),
        ..TableConfig::new(64, VS)
    };
    let t = Table::create_anonymous(1, &cfg).unwrap();
    let mut initial = Vec::new();
    for k in 0..keys {
        // Insert with a placeholder, then make the value equal its version.
        t.insert(k, &image(0)).unwrap();
        let lk = t.lock(k, OWNER).unwrap();
        t.write_locked(&lk, &image(lk.version + 2)).unwrap();
        initial.push(t.unlock(lk, true));
    }
    let commits: Vec<AtomicU64> = (0..keys).map(|_| AtomicU64::new(0)).collect();
    let stop = AtomicBool::new(false);
    let reads = AtomicU64::new(0);
    let churn_ok = AtomicU64::new(0);
    let deadline = Instant::now() + Duration::from_millis(1500);
    std::thread::scope(|s| {
        // Writers: lock, check the locked value, write value = next version, commit.
        for w in 0..2u64 {
            let (t, commits, stop) = (&t, &commits, &stop);
            s.spawn(move || {
                let _stop = StopOnDrop(stop);
                let mut i = w;
                while !stop.load(Ordering::Relaxed) {
                    let k = i % keys;
                    i = i
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407)
                        >> 3;
                    let lk = match t.try_lock(k, OWNER) {
                        Ok(lk) => lk,
                        Err(StoreError::Locked) => continue,
                        Err(e) => panic!("{e}"),
                    };
                    let mut cur = vec![0u8; VS];
                    t.read_locked(&lk, &mut cur).unwrap();
                    assert!(
                        consistent(&cur, lk.version),
                        "locked value differs from version"
                    );
                    t.write_locked(&lk, &image(lk.version + 2)).unwrap();
                    assert_eq!(t.unlock(lk, true), lk.version + 2);
                    commits[k as usize].fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        // Churn: inserts and deletes of other keys sharing the buckets and reusing items.
        {
            let (t, stop, churn_ok) = (&t, &stop, &churn_ok);
            s.spawn(move || {
                let _stop = StopOnDrop(stop);
                let mut k = 1000u64;
                while !stop.load(Ordering::Relaxed) {
                    if t.insert(k, &image(1)).is_ok() {
                        let lk = t.lock(k, OWNER).unwrap();
                        t.write_locked(&lk, &image(lk.version + 2)).unwrap();
                        t.unlock(lk, true);
                        t.delete(k).unwrap();
                        churn_ok.fetch_add(1, Ordering::Relaxed);
                    }
                    k = 1000 + (k + 1) % 30;
                }
            });
        }
        // Readers: every read is consistent and versions of a key never go backwards.
        for r in 0..2u64 {
            let (t, stop, reads) = (&t, &stop, &reads);
            s.spawn(move || {
                let _stop = StopOnDrop(stop);
                let mut last = vec![0u64; keys as usize];
                let mut out = vec![0u8; VS];
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for k in 0..keys {
                        match t.try_get(k, &mut out) {
                            ReadOutcome::Found { version } => {
                                assert!(consistent(&out, version), "torn read of {k} at {version}");
                                assert!(version >= last[k as usize], "version went back");
                                last[k as usize] = version;
                                n += 1;
                            }
                            ReadOutcome::Locked => {}
                            ReadOutcome::NotFound => panic!("key {k} vanished"),
                        }
                    }
                    // Churned keys: found means consistent (their values follow the rule
                    // once committed; the insert's placeholder is version-consistent too
                    // only by accident, so accept both rule values).
                    for k in 1000..1030 {
                        if let ReadOutcome::Found { version } = t.try_get(k, &mut out) {
                            assert!(
                                consistent(&out, version) || consistent(&out, 1),
                                "torn read of churned key {k}"
                            );
                        }
                    }
                    if r == 0 && Instant::now() > deadline {
                        stop.store(true, Ordering::Relaxed);
                    }
                }
                reads.fetch_add(n, Ordering::Relaxed);
            });
        }
    });
    let mut out = vec![0u8; VS];
    for k in 0..keys {
        let v = t.get(k, &mut out).unwrap();
        let c = commits[k as usize].load(Ordering::Relaxed);
        assert_eq!(v, initial[k as usize] + 2 * c, "lost update on key {k}");
        assert!(consistent(&out, v));
    }
    let total: u64 = commits.iter().map(|c| c.load(Ordering::Relaxed)).sum();
    assert!(total > 100, "writers made progress: {total}");
    assert!(reads.load(Ordering::Relaxed) > 100);
    assert!(churn_ok.load(Ordering::Relaxed) > 10);
    assert_eq!(t.len(), keys as usize);
}

#[test]
fn parallel_inserts_and_deletes_keep_every_key_once() {
    let t = Table::create_anonymous(
        1,
        &TableConfig {
            buckets: Some(8),
            overflow: Some(400),
            ..TableConfig::new(4000, 16)
        },
    )
    .unwrap();
    std::thread::scope(|s| {
        for w in 0..3u64 {
            let t = &t;
            s.spawn(move || {
                for i in 0..1000u64 {
                    let k = i * 3 + w;
                    t.insert(k, &[w as u8; 16]).unwrap();
                    // Everyone races to insert a shared key: exactly one wins per round.
                    let _ = t.insert(1_000_000 + i, &[9; 16]);
                    if i % 2 == 0 {
                        t.delete(k).unwrap();
                    }
                }
            });
        }
    });
    let mut out = [0u8; 16];
    for w in 0..3u64 {
        for i in 0..1000u64 {
            assert_eq!(t.get(i * 3 + w, &mut out).is_some(), i % 2 == 1);
            assert!(t.get(1_000_000 + i, &mut out).is_some());
        }
    }
    assert_eq!(t.len(), 3 * 500 + 1000);
}
