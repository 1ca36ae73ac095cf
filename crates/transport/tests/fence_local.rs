//! The epoch fence under a racing initiator (`local` backend): a thread of node 1 keeps
//! WRITEing increasing values to a word of node 0 in epoch 1 while node 0 moves to
//! epoch 2. Once node 0's `set_epoch` returned, no write lands any more: the word keeps
//! the value it had then, which is the initiator's last successful write, and every
//! later write fails with `EpochChanged`.

use ambidex_transport::local::LocalFabric;
use ambidex_transport::{AccessError, ClusterConfig, OneSidedKind, OneSidedOp, Perms};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

#[test]
fn no_write_of_an_older_epoch_lands_after_set_epoch() {
    let config = ClusterConfig::new(2, 1);
    let fabric = LocalFabric::new(config.clone()).unwrap();
    let (n0, n1) = (fabric.node(0), fabric.node(1));
    let region = n0.register(4096, Perms::ALL).unwrap();
    let desc = region.desc;
    let mut owner = n0.endpoint(0).unwrap();
    let mut ini = n1.endpoint(0).unwrap();
    let written = Arc::new(AtomicU64::new(0));
    let moved = Arc::new(AtomicBool::new(false));
    let (w, m) = (written.clone(), moved.clone());
    let writer = std::thread::spawn(move || {
        let (mut last_ok, mut refused, mut after) = (0u64, 0u64, 0u64);
        let mut out = Vec::new();
        let mut i = 1u64;
        // Until 2000 writes were posted after the owner's set_epoch returned.
        while after < 2000 {
            if m.load(Ordering::Acquire) {
                after += 1;
            }
            let data = i.to_le_bytes();
            ini.post(&[OneSidedOp {
                wr_id: i,
                remote: desc.at(0),
                kind: OneSidedKind::Write { data: &data },
                signaled: true,
            }])
            .unwrap();
            out.clear();
            assert_eq!(ini.poll_cq(1, &mut out), 1);
            match out[0].status {
                Ok(()) => {
                    assert_eq!(refused, 0, "a write succeeded after one was fenced");
                    last_ok = i;
                    w.store(i, Ordering::Release);
                }
                Err(AccessError::EpochChanged) => refused += 1,
                Err(e) => panic!("unexpected error {e:?}"),
            }
            i += 1;
        }
        (last_ok, ini.counters())
    });
    while written.load(Ordering::Acquire) < 1000 {
        std::thread::yield_now();
    }
    owner.set_epoch(config.epoch + 1);
    let word = region.mem.word(0).unwrap();
    let at_fence = word.load(Ordering::SeqCst);
    moved.store(true, Ordering::Release);
    let (last_ok, counters) = writer.join().unwrap();
    assert_eq!(
        word.load(Ordering::SeqCst),
        at_fence,
        "a write of the old epoch landed after set_epoch returned"
    );
    assert_eq!(
        last_ok, at_fence,
        "the last successful write is not the one in memory"
    );
    assert!(n0.counters().get("onesided_epoch_errors") >= 2000);
    assert!(counters.get("onesided_errors") >= 2000);
}
