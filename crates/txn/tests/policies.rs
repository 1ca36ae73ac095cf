//! Every phase choice of DrTM+H Table 4 runs the same transactions correctly: transfers
//! between hot accounts keep the total, read-only snapshots of every account that
//! commit see exactly the total, replicas equal their primaries, and recorded
//! histories are serializable. Each policy runs on the local transport and on shm
//! (where one-sided operations bypass the target's CPU).

mod common;

use ambidex_history::{check, parse_str, Recorder};
use ambidex_txn::history::RecorderSink;
use ambidex_txn::policy::{Commit, Execute, Lock, Log, PassiveAck, Validate};
use ambidex_txn::runner::{self, RunSpec, SinkFactory, Worker, WorkerCtx};
use ambidex_txn::{NodeDb, Policy, TableSpec, Txn, TxnConfig, WriteKind};
use common::{Backend, TestCluster};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const T: u32 = 5;
/// Accounts in groups: transfers stay inside a group, so every group's total is an
/// invariant a read-only snapshot of the group can check.
const GROUP: u64 = 6;
const KEYS: u64 = 8 * GROUP;
const START: u64 = 1000;
/// A value of several chunks, so that torn one-sided reads would show.
const VALUE: usize = 120;

fn next(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// A balance repeated over the whole value: a torn read shows as unequal copies.
fn value_of(balance: u64) -> Vec<u8> {
    (0..VALUE / 8).flat_map(|_| balance.to_le_bytes()).collect()
}

fn balance_of(v: &[u8]) -> u64 {
    let b = u64::from_le_bytes(v[..8].try_into().unwrap());
    for c in v.chunks(8) {
        assert_eq!(c, &b.to_le_bytes(), "a torn value was accepted");
    }
    b
}

struct Outcome {
    committed: u64,
    snapshots: u64,
}

fn run_bank(backend: Backend, policy: Policy, per_worker: usize) -> Outcome {
    let table = TableSpec {
        id: T,
        name: "accounts".into(),
        value_size: VALUE,
        capacity_per_node: 256,
    };
    let c = TestCluster::new(backend, 3, 2, 3, &[table]);
    for k in 0..KEYS {
        c.load(T, k, &value_of(START));
    }
    let cat = NodeDb::catalog_of(&c.dbs).unwrap();
    for db in &c.dbs {
        db.set_catalog(cat.clone()).unwrap();
    }
    let recorder = Recorder::in_memory();
    let rec = recorder.clone();
    let sinks: SinkFactory = Arc::new(move |_, _| Box::new(RecorderSink(rec.thread())));
    let snapshots = Arc::new(AtomicU64::new(0));
    let snaps = snapshots.clone();
    let worker: Worker = Arc::new(move |w: WorkerCtx| {
        let snaps = snaps.clone();
        Box::pin(async move {
            let mut seed = 0x5eed
                ^ ((w.node as u64) << 24)
                ^ ((w.thread as u64) << 16)
                ^ ((w.coroutine as u64) << 8)
                | 1;
            for n in 0..per_worker {
                let mut t = Txn::begin(&w.ctx, &w.th);
                if n % 5 == 4 {
                    // A read-only snapshot of one group.
                    let g = next(&mut seed) % (KEYS / GROUP);
                    let ids: Vec<_> = (0..GROUP).map(|k| t.read(T, g * GROUP + k)).collect();
                    if t.execute().await.is_err() {
                        continue;
                    }
                    let sum: u64 = ids.iter().map(|&i| balance_of(t.get(i).unwrap())).sum();
                    if t.commit().await.is_ok() {
                        assert_eq!(sum, GROUP * START, "a committed snapshot saw {sum}");
                        snaps.fetch_add(1, Ordering::Relaxed);
                    }
                    continue;
                }
                let g = next(&mut seed) % (KEYS / GROUP);
                let a = next(&mut seed) % GROUP;
                let b = (a + 1 + next(&mut seed) % (GROUP - 1)) % GROUP;
                let (a, b) = (g * GROUP + a, g * GROUP + b);
                let ia = t.write(T, a, WriteKind::Update);
                let ib = t.write(T, b, WriteKind::Update);
                if t.execute().await.is_err() {
                    continue;
                }
                let (va, vb) = (
                    balance_of(t.get(ia).unwrap()),
                    balance_of(t.get(ib).unwrap()),
                );
                let amount = next(&mut seed) % 10;
                if va < amount {
                    t.abort().await;
                    continue;
                }
                t.set(ia, &value_of(va - amount));
                t.set(ib, &value_of(vb + amount));
                let _ = t.commit().await;
            }
        })
    });
    let spec = RunSpec {
        coroutines: 4,
        txn: TxnConfig {
            policy,
            ..TxnConfig::default()
        },
        history: Some(sinks),
        ..Default::default()
    };
    let r = runner::run(&c.nodes, &c.dbs, &spec, worker).unwrap();
    assert_eq!(r.stuck_workers, 0, "{policy:?}");
    assert_eq!(r.txn.committed_incomplete, 0, "{policy:?}: {:?}", r.txn);
    c.assert_replicas_consistent(T);
    let mut total = 0;
    for (key, _, v) in c.dbs.iter().flat_map(|db| {
        db.dump(T)
            .into_iter()
            .filter(|(k, _, _)| c.placement.primary(T, *k) == db.node)
            .collect::<Vec<_>>()
    }) {
        assert!(key < KEYS);
        total += balance_of(&v);
    }
    assert_eq!(total, KEYS * START, "{policy:?}: money was created or lost");
    for db in &c.dbs {
        for k in 0..KEYS {
            if let Some(h) = db.lock_word(T, k) {
                assert!(h.owner.is_none(), "{policy:?}: key {k} left locked: {h:?}");
            }
        }
    }
    recorder.flush().unwrap();
    let h = String::from_utf8(recorder.take_memory().unwrap()).unwrap();
    let report = check(&parse_str(&h).unwrap());
    assert!(report.valid, "{policy:?}: {}", report.summary());
    Outcome {
        committed: r.txn.committed,
        snapshots: snapshots.load(Ordering::Relaxed),
    }
}

/// The policies under test: the presets and combinations that mix the choices.
fn policies() -> Vec<Policy> {
    let mut v: Vec<Policy> = ambidex_txn::policy::PRESETS
        .iter()
        .map(|p| Policy::preset(p).unwrap())
        .collect();
    for execute in [
        Execute::Rpc,
        Execute::OneSided,
        Execute::Cached,
        Execute::Hybrid,
    ] {
        for (lock, validate) in [(Lock::Rpc, Validate::Read), (Lock::Cas, Validate::Rpc)] {
            v.push(Policy {
                execute,
                lock,
                validate,
                log: if lock == Lock::Rpc {
                    Log::Write
                } else {
                    Log::Rpc
                },
                commit: if lock == Lock::Cas {
                    Commit::Write
                } else {
                    Commit::Rpc
                },
                passive_ack: if execute == Execute::Hybrid {
                    PassiveAck::On
                } else {
                    PassiveAck::Off
                },
            });
        }
    }
    v.push(Policy {
        commit: Commit::Rpc,
        passive_ack: PassiveAck::On,
        ..Policy::fasst()
    });
    v
}

#[test]
fn every_policy_keeps_the_bank_correct_local() {
    for p in policies() {
        let o = run_bank(Backend::Local, p, 60);
        assert!(
            o.committed > 100 && o.snapshots > 0,
            "{p:?}: too few commits: {} {}",
            o.committed,
            o.snapshots
        );
    }
}

#[test]
fn every_policy_keeps_the_bank_correct_shm() {
    for p in policies()
        .into_iter()
        .filter(|p| std::env::var("ONLY").map_or(true, |o| format!("{p:?}").contains(&o)))
    {
        let o = run_bank(Backend::Shm, p, 40);
        assert!(
            o.committed > 50 && o.snapshots > 0,
            "{p:?}: too few commits: {} {}",
            o.committed,
            o.snapshots
        );
    }
}
