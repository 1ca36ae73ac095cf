//! The lock journal behind [`Table::release_cpu_locks_where`]: after any number of locks
//! taken and released by several threads (enough to trim every shard many times), the
//! journaled release frees exactly the locks still held, as the pass over every header
//! ([`Table::release_locks_where`]) would.

use ambidex_store::{LockOwner, Table, TableConfig};

const KEYS: u64 = 20_000;

fn owner(thread: u16) -> LockOwner {
    LockOwner {
        node: 1,
        thread,
        slot: 3,
    }
}

fn table() -> Table {
    let t = Table::create_anonymous(1, &TableConfig::new(KEYS as usize, 16)).unwrap();
    for k in 0..KEYS {
        t.insert(k, &[0; 16]).unwrap();
    }
    t
}

/// Each of 4 threads locks and releases (commits or aborts) 50,000 times over its own
/// keys and leaves every 97th of its keys locked at the end; some locks stay held
/// across the whole run (the stuck locks of a failed coordinator).
fn churn(t: &Table) -> usize {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..4u16)
            .map(|th| {
                s.spawn(move || {
                    let mine = |i: u64| (i * 4 + th as u64) % (KEYS - 4);
                    // Held from the start to the end (trims must keep them).
                    let stuck = t.try_lock(KEYS - 4 + th as u64, owner(th)).unwrap();
                    let mut held = 1;
                    for i in 2..50_002u64 {
                        let lk = t.try_lock(mine(i), owner(th)).unwrap();
                        if i % 97 == 0 && i > 49_000 {
                            held += 1; // left locked
                        } else {
                            t.unlock(lk, i % 2 == 0);
                        }
                    }
                    let _ = stuck;
                    held
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    })
}

#[test]
fn journaled_release_frees_every_lock_still_held() {
    let t = table();
    let held = churn(&t);
    assert!(held > 4, "the test leaves locks held");
    let released = t.release_cpu_locks_where(|_| true);
    // Every lock is gone: the full pass finds none.
    assert_eq!(
        t.release_locks_where(|_| true),
        0,
        "a lock the journal missed"
    );
    assert_eq!(released, held, "each held lock released once");
    assert_eq!(t.release_cpu_locks_where(|_| true), 0);
    assert_eq!(t.journal_len(), 0, "released entries leave the journal");
}

#[test]
fn journaled_release_keeps_locks_it_is_not_asked_to_release() {
    let t = table();
    let held = churn(&t);
    let others = t.release_cpu_locks_where(|o| o.thread != 2);
    let of_2 = t.release_cpu_locks_where(|o| o.thread == 2);
    assert_eq!(others + of_2, held, "each held lock released once");
    assert_eq!(
        of_2,
        held / 4,
        "thread 2's locks were kept by the first release"
    );
    assert_eq!(t.release_locks_where(|_| true), 0);
}

#[test]
fn the_journal_stays_bounded_by_the_locks_held() {
    let t = table();
    let held = churn(&t);
    // 200,000 locks taken; trims keep about the held ones plus a shard's slack.
    assert!(
        t.journal_len() < held + 16 * 2048,
        "journal of {} entries",
        t.journal_len()
    );
}
