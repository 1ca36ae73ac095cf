//! Remote increments from several coroutines of one runtime over the simulator, with
//! seeded one-sided loss, duplication and delay, while the owner's thread holds item
//! locks across steps: no update is lost, no read is torn and versions only grow.

mod common;

use ambidex_store::{LockOwner, RemoteError, RemoteGet, RemoteReader, Table, TableConfig};
use ambidex_transport::ClusterConfig;
use ambidex_transport_sim::{SimFaults, SimNet};
use common::reader_runtime;
use std::cell::Cell;
use std::rc::Rc;

const OWNER: LockOwner = LockOwner {
    node: 0,
    thread: 0,
    slot: 1,
};
const VS: usize = 200; // several chunks
const KEYS: u64 = 3;

fn image(n: u64) -> Vec<u8> {
    (0..VS / 8).flat_map(|_| n.to_le_bytes()).collect()
}

/// The counter an image holds, if it is whole.
fn counter(out: &[u8]) -> Option<u64> {
    let n = &out[..8];
    out.chunks(8)
        .all(|c| c == n)
        .then(|| u64::from_le_bytes(n.try_into().unwrap()))
}

/// Runs one seed; returns the owner's increments, the remote retries and the one-sided
/// retransmissions.
fn run(seed: u64) -> (u64, u64, u64) {
    let faults = SimFaults {
        onesided_loss: 0.1,
        onesided_duplicate: 0.1,
        onesided_delay: 0.2,
        ..SimFaults::default()
    };
    let net = SimNet::new(ClusterConfig::new(2, 1), seed, faults).unwrap();
    let t = Table::create_registered(net.node(0).as_ref(), 9, &TableConfig::new(16, VS)).unwrap();
    for k in 0..KEYS {
        t.insert(k, &image(0)).unwrap();
    }
    let desc = t.desc();
    let node1 = net.node(1);
    let (workers, rounds) = (4u64, 30u64);
    let mut rt = reader_runtime(node1.as_ref(), 0, workers as usize, 256);
    let rd = Rc::new(RemoteReader::new());
    let done = Rc::new(Cell::new(0));
    for w in 0..workers {
        let (rd, done) = (rd.clone(), done.clone());
        // Each worker locks as its own owner (a slot per coroutine).
        let me = LockOwner {
            node: 1,
            thread: 0,
            slot: w as u16 + 1,
        };
        rt.spawn(move |ctx| async move {
            let mut last = [0u64; KEYS as usize];
            let mut out = vec![0u8; VS];
            let mut i = 0;
            while i < rounds {
                let k = (w + i) % KEYS;
                let (version, offset) = match rd.get(&ctx, &desc, None, k, &mut out).await {
                    Ok(RemoteGet::Found { version, offset }) => (version, offset),
                    Err(RemoteError::Busy) => continue,
                    r => panic!("{r:?}"),
                };
                let n = counter(&out).expect("torn remote read");
                assert!(version >= last[k as usize], "version of {k} went back");
                last[k as usize] = version;
                if !rd.lock(&ctx, &desc, offset, version, me).await.unwrap() {
                    continue;
                }
                let nv = rd
                    .write_unlock(&ctx, &desc, offset, k, version, me, &image(n + 1))
                    .await;
                assert_eq!(nv, Ok(version + 2));
                i += 1;
            }
            done.set(done.get() + 1);
        });
    }
    // The owner's thread steps the runtime and the network; it takes a free item's lock
    // whenever it holds none, checks at every step that the lock is still its own (a
    // remote release must never erase it, even when the network re-executes a
    // duplicated request), and increments and releases it up to 16 steps later.
    let mut held: Option<(ambidex_store::ItemLock, u64)> = None;
    let mut local = 0u64;
    for step in 0u64.. {
        if done.get() == workers {
            break;
        }
        assert!(step < 1_000_000, "the workers made no progress");
        rt.poll_once();
        let next = net.next_event_time().unwrap_or(net.now() + 1_000);
        net.advance_to(next);
        if let Some((lk, k)) = &held {
            assert!(
                t.holds_lock(lk, *k),
                "seed {seed} step {step}: the owner's lock on {k} was erased: {:?}",
                t.header(*k)
            );
        }
        match held.take() {
            None => {
                held = t
                    .try_lock(step % KEYS, OWNER)
                    .ok()
                    .map(|lk| (lk, step % KEYS))
            }
            Some((lk, _)) if step % 16 == 15 => {
                let mut b = vec![0u8; VS];
                t.read_locked(&lk, &mut b).unwrap();
                t.write_locked(&lk, &image(counter(&b).unwrap() + 1))
                    .unwrap();
                t.unlock(lk, true);
                local += 1;
            }
            h => held = h,
        }
    }
    if let Some((lk, _)) = held {
        t.unlock(lk, false);
    }
    let mut b = vec![0u8; VS];
    let total: u64 = (0..KEYS)
        .map(|k| {
            t.get(k, &mut b).unwrap();
            counter(&b).unwrap()
        })
        .sum();
    assert_eq!(
        total,
        workers * rounds + local,
        "lost updates (seed {seed})"
    );
    (local, rd.stats().retries, net.stats().onesided_retransmits)
}

#[test]
fn sim_coroutines_increment_remotely_under_onesided_faults() {
    let (mut local, mut retries, mut retransmits) = (0, 0, 0);
    for seed in 1..=30 {
        let (l, r, x) = run(seed);
        local += l;
        retries += r;
        retransmits += x;
    }
    assert!(retransmits > 0, "one-sided faults happened");
    assert!(local > 0, "the owner took part");
    assert!(retries > 0, "remote reads met locked items");
}

/// An unsignaled WRITE of an earlier batch fails at the target after its flush; the
/// next flush (a lock's CAS) learns of it. The lock's result is still the CAS's own
/// (the lock was taken), and the earlier failure is not lost: it is reported to the
/// worker afterwards.
#[test]
fn a_lock_is_its_own_result_and_earlier_failures_are_kept() {
    let net = SimNet::new(ClusterConfig::new(2, 1), 7, SimFaults::default()).unwrap();
    let t = Table::create_registered(net.node(0).as_ref(), 9, &TableConfig::new(16, 8)).unwrap();
    t.insert(1, &[0u8; 8]).unwrap();
    let desc = t.desc();
    let mut rt = reader_runtime(net.node(1).as_ref(), 0, 1, 64);
    let me = LockOwner {
        node: 1,
        thread: 0,
        slot: 3,
    };
    type Seen = (Result<bool, RemoteError>, Vec<ambidex_rpc::OneSidedError>);
    let out: Rc<std::cell::RefCell<Option<Seen>>> = Default::default();
    let o = out.clone();
    rt.spawn(move |ctx| async move {
        let rd = RemoteReader::new();
        let (version, offset) = match rd.get(&ctx, &desc, None, 1, &mut [0u8; 8]).await {
            Ok(RemoteGet::Found { version, offset }) => (version, offset),
            r => panic!("{r:?}"),
        };
        // An unsignaled WRITE past the region's end: it fails at the target, later.
        ctx.queue_write(desc.region.at(desc.region.len + 64), &[1u8; 8], false)
            .unwrap();
        assert!(ctx.flush().await.is_ok(), "the failure is not known yet");
        let locked = rd.lock(&ctx, &desc, offset, version, me).await;
        *o.borrow_mut() = Some((locked, ctx.take_unsignaled_failures()));
    });
    for _ in 0..100_000 {
        if out.borrow().is_some() {
            break;
        }
        rt.poll_once();
        let next = net.next_event_time().unwrap_or(net.now() + 1_000);
        net.advance_to(next);
    }
    let (locked, earlier) = out.borrow_mut().take().expect("the worker finished");
    assert_eq!(locked, Ok(true));
    assert_eq!(t.header(1).unwrap().owner, Some(me));
    assert_eq!(
        earlier.len(),
        1,
        "the earlier failure was dropped: {earlier:?}"
    );
}
