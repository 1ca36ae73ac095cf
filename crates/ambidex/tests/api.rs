//! The application API end to end on an in-process 3-node cluster: typed tables,
//! transactions retried on conflict, read-only snapshots, and every error the API
//! promises.

use ambidex::config::InjectedBug;
use ambidex::{AbortReason, Cluster, Config, Error, Json, RetryPolicy, Schema, Table};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// Accounts, in pairs (2k, 2k + 1): transfers move money within a pair, so every
/// pair's sum is constant.
const ACCOUNTS: u64 = 400;
const INITIAL: i64 = 1_000;

fn config() -> Config {
    let mut c = Config::default();
    c.run.coroutines = Some(4);
    c
}

fn bank(c: &Config) -> (Cluster, Table<u64, i64>, Table<u64, i64>) {
    let mut schema = Schema::new();
    let accounts = schema.table::<u64, i64>("accounts", ACCOUNTS).unwrap();
    // Never written: the audits read it to wait a few round trips.
    let idle = schema.table::<u64, i64>("idle", 8).unwrap();
    let cluster = Cluster::local(c, &schema).unwrap();
    let t = accounts.clone();
    cluster
        .node(0)
        .unwrap()
        .run(async move |tx| {
            for k in 0..ACCOUNTS {
                tx.insert(&t, k, &INITIAL)?;
            }
            Ok(())
        })
        .unwrap();
    (cluster, accounts, idle)
}

/// Transfers within pairs of accounts from 3 application threads (one per node, a few
/// at a time), while a fourth audits pairs in read-only transactions until they are
/// done: each audit reads the first account of 8 pairs, then (after 6 round trips to a
/// table nobody writes, as long as a transfer takes) the second ones, and checks every
/// pair's sum. Returns
/// how many audits saw a wrong sum, how many ran, and the total at the end.
fn transfers_and_audits(c: &Config, transfers: usize) -> (usize, usize, i64) {
    let (cluster, accounts, idle) = bank(c);
    let done = Arc::new(AtomicU32::new(0));
    let mut threads = Vec::new();
    for n in 0..3u16 {
        let node = cluster.node(n).unwrap();
        let (t, done) = (accounts.clone(), done.clone());
        threads.push(std::thread::spawn(move || {
            let mut handles = Vec::new();
            for i in 0..transfers as u64 {
                let pair = (i * 37 + n as u64 * 11) % (ACCOUNTS / 2);
                let (from, to) = match i % 2 {
                    0 => (2 * pair, 2 * pair + 1),
                    _ => (2 * pair + 1, 2 * pair),
                };
                let t = t.clone();
                handles.push(
                    node.spawn(async move |tx| {
                        let v = tx.get_many_for_update(&t, &[from, to]).await?;
                        tx.put(&t, from, &(v[0] - 3))?;
                        tx.put(&t, to, &(v[1] + 3))
                    })
                    .unwrap(),
                );
                if handles.len() == 4 {
                    handles.drain(..).for_each(|h| h.join().unwrap());
                }
            }
            handles.into_iter().for_each(|h| h.join().unwrap());
            done.fetch_add(1, Ordering::SeqCst);
        }));
    }
    let node = cluster.node(1).unwrap();
    let (mut wrong, mut audits) = (0, 0);
    while done.load(Ordering::SeqCst) < 3 {
        let (t, idle) = (accounts.clone(), idle.clone());
        let first = audits as u64 * 8 % (ACCOUNTS / 2);
        let pairs: Vec<u64> = (first..first + 8).map(|p| p % (ACCOUNTS / 2)).collect();
        let sums: Vec<i64> = node
            .read(async move |tx| {
                let a: Vec<u64> = pairs.iter().map(|p| 2 * p).collect();
                let b: Vec<u64> = pairs.iter().map(|p| 2 * p + 1).collect();
                let va = tx.get_many(&t, &a).await?;
                for k in 0..6 {
                    tx.get(&idle, k).await?;
                }
                let vb = tx.get_many(&t, &b).await?;
                Ok(va
                    .iter()
                    .zip(&vb)
                    .map(|(x, y)| x.unwrap_or(0) + y.unwrap_or(0))
                    .collect())
            })
            .unwrap();
        audits += 1;
        if sums.iter().any(|&s| s != 2 * INITIAL) {
            wrong += 1;
        }
    }
    for t in threads {
        t.join().unwrap();
    }
    let t = accounts.clone();
    let keys: Vec<u64> = (0..ACCOUNTS).collect();
    let end: i64 = node
        .read(async move |tx| Ok(tx.get_many(&t, &keys).await?.into_iter().flatten().sum()))
        .unwrap();
    let report = cluster.shutdown().unwrap();
    assert!(report.committed >= 3 * transfers as u64);
    (wrong, audits, end)
}

#[test]
fn transfers_keep_the_total_and_every_snapshot_sees_it() {
    let (wrong, audits, end) = transfers_and_audits(&config(), 2000);
    assert_eq!(end, ACCOUNTS as i64 * INITIAL);
    assert_eq!(
        wrong, 0,
        "read-only sums that missed the total, of {audits}"
    );
    assert!(
        audits >= 10,
        "only {audits} audits ran beside the transfers"
    );
}

/// The audit above catches a protocol that skips validation: read-only sums that mix
/// states before and after a transfer.
#[test]
fn the_audit_catches_a_protocol_without_validation() {
    let mut c = config();
    c.txn.inject_bug = Some(InjectedBug::SkipValidation);
    let mut seen = Vec::new();
    for _ in 0..5 {
        let (wrong, audits, end) = transfers_and_audits(&c, 2000);
        seen.push((wrong, audits, end));
        if wrong > 0 || end != ACCOUNTS as i64 * INITIAL {
            return;
        }
    }
    panic!("five runs without validation looked serializable (wrong, audits, end): {seen:?}");
}

#[test]
fn errors_say_what_failed_and_whether_to_retry() {
    let mut schema = Schema::new();
    let nums = schema.table::<u64, i64>("nums", 100).unwrap();
    let names = schema
        .table_with_max_len::<u32, String>("names", 100, 8)
        .unwrap();
    let cluster = Cluster::local(&config(), &schema).unwrap();
    let node = cluster.node(2).unwrap();

    let t = nums.clone();
    let e = node
        .run(async move |tx| tx.get_for_update(&t, 5).await.map(|_| ()))
        .unwrap_err();
    assert!(
        matches!(&e, Error::NotFound { table, key: 5 } if table == "nums"),
        "{e}"
    );
    assert!(!e.retryable());

    let t = nums.clone();
    node.run(async move |tx| tx.insert(&t, 5, &1)).unwrap();
    let t = nums.clone();
    let e = node.run(async move |tx| tx.insert(&t, 5, &2)).unwrap_err();
    assert!(matches!(&e, Error::AlreadyExists { key: 5, .. }), "{e}");

    let t = names.clone();
    let e = node
        .run(async move |tx| tx.insert(&t, 1, &"nine char".to_string()))
        .unwrap_err();
    assert!(
        matches!(&e, Error::ValueTooLarge { len: 9, max: 8, .. }),
        "{e}"
    );

    // Read, then written: refused with what to do instead.
    let t = nums.clone();
    let e = node
        .run(async move |tx| {
            tx.get(&t, 5).await?;
            tx.put(&t, 5, &3)
        })
        .unwrap_err();
    assert!(e.to_string().contains("get_for_update"), "{e}");

    // The application's own error: returned as is, not retried, nothing written.
    let runs = Arc::new(AtomicU32::new(0));
    let (t, r) = (nums.clone(), runs.clone());
    let e = node
        .run(async move |tx| {
            r.fetch_add(1, Ordering::SeqCst);
            tx.put(&t, 5, &100)?;
            Err::<(), _>(Error::user("insufficient funds"))
        })
        .unwrap_err();
    assert_eq!(e.to_string(), "insufficient funds");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // A panicking closure fails its transaction only; its locks are released.
    let t = nums.clone();
    let e = node
        .run(async move |tx| -> Result<(), Error> {
            tx.get_for_update(&t, 5).await?;
            panic!("bug in the application")
        })
        .unwrap_err();
    assert!(
        matches!(&e, Error::Panicked(m) if m.contains("bug in the application")),
        "{e}"
    );
    let t = nums.clone();
    let v = node
        .run(async move |tx| {
            let v = tx.get_for_update(&t, 5).await?;
            tx.put(&t, 5, &(v + 1))?;
            // A transaction reads its own writes.
            tx.get(&t, 5).await
        })
        .unwrap();
    assert_eq!(v, Some(2));

    // A transient abort is retried up to the policy's attempts, then given up.
    let few = RetryPolicy {
        max_attempts: 3,
        ..RetryPolicy::default()
    };
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let e = node
        .clone()
        .with_retry(few)
        .run(async move |_tx| {
            r.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>(Error::from(AbortReason::LockedAtExecute))
        })
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::GaveUp {
                attempts: 3,
                last: AbortReason::LockedAtExecute
            }
        ),
        "{e}"
    );
    assert!(e.retryable());
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    // Without retries, the abort itself comes back.
    let e = node
        .clone()
        .with_retry(RetryPolicy::never())
        .run(async move |_tx| Err::<(), _>(Error::from(AbortReason::VersionChanged)))
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Aborted {
                reason: AbortReason::VersionChanged
            }
        ),
        "{e}"
    );
    assert!(matches!(
        cluster.node(3),
        Err(Error::NoSuchNode { node: 3, nodes: 3 })
    ));

    // A transaction that waits for another inside its closure is refused, not hung.
    let (t, n) = (nums.clone(), node.clone());
    let e = node
        .run(async move |_tx| {
            let t = t.clone();
            n.run(async move |tx| tx.get(&t, 5).await).map(|_| ())
        })
        .unwrap_err();
    assert!(matches!(e, Error::NotSupported(_)), "{e}");

    cluster.shutdown().unwrap();
    let t = nums.clone();
    assert!(matches!(
        node.run(async move |tx| tx.get(&t, 5).await),
        Err(Error::Stopped)
    ));
}

#[test]
fn variable_length_values_deletes_and_read_your_writes() {
    #[derive(serde::Serialize, serde::Deserialize, Clone, Debug, PartialEq)]
    struct Profile {
        name: String,
        tags: Vec<String>,
    }
    let mut schema = Schema::new();
    let profiles = schema
        .table_with_max_len::<(u32, u32), Json<Profile>>("profiles", 100, 200)
        .unwrap();
    let cluster = Cluster::local(&config(), &schema).unwrap();
    let node = cluster.node(1).unwrap();
    let p = Profile {
        name: "ada".into(),
        tags: vec!["math".into(), "engines".into()],
    };
    let (t, p2) = (profiles.clone(), p.clone());
    node.run(async move |tx| tx.insert(&t, (7, 1), &Json(p2.clone())))
        .unwrap();
    let t = profiles.clone();
    let got = node.read(async move |tx| tx.get(&t, (7, 1)).await).unwrap();
    assert_eq!(got, Some(Json(p)));
    let t = profiles.clone();
    let after = node
        .run(async move |tx| {
            tx.get_for_update(&t, (7, 1)).await?;
            tx.delete(&t, (7, 1))?;
            tx.get(&t, (7, 1)).await
        })
        .unwrap();
    assert_eq!(after, None);
    let t = profiles.clone();
    assert_eq!(
        node.read(async move |tx| tx.get(&t, (7, 1)).await).unwrap(),
        None
    );
    cluster.shutdown().unwrap();
}
