//! The one-sided log (`Log::Write`): coordinators WRITE their commit records into rings
//! at their log replicas. Transactions commit and the rings hold exactly the records not
//! yet truncated; a tiny ring makes coordinators wait for truncations (none lost); a
//! ring that is never released (its head record torn) ends in `log_full` aborts without
//! being overwritten; torn, stale, garbage and malformed slots are counted, never
//! returned.

mod common;

use ambidex_rpc::Runtime;
use ambidex_transport::local::LocalFabric;
use ambidex_transport::{
    ClusterConfig, Completion, CounterSnapshot, Datagram, Endpoint, EndpointAddr, OneSidedKind,
    OneSidedOp, RegionDesc, TransportError,
};
use ambidex_txn::log_ring::writer::TRUNCATE_EVERY;
use ambidex_txn::log_ring::{format, End, LogRingConfig, RingHead};
use ambidex_txn::messages::{LockToken, WriteRec};
use ambidex_txn::policy::Log;
use ambidex_txn::runner::{self, RunSpec, Worker, WorkerCtx};
use ambidex_txn::{AbortReason, LockOwner, NodeDb, Placement, Policy, TableSpec, Txn, TxnConfig};
use ambidex_txn::{TxnStats, WriteKind};
use common::{Backend, TestCluster};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const ACCOUNTS: u32 = 1;
const N_ACCOUNTS: u64 = 12;
const INITIAL: i64 = 1000;

fn accounts() -> TableSpec {
    TableSpec {
        id: ACCOUNTS,
        name: "accounts".into(),
        value_size: 8,
        capacity_per_node: 1024,
    }
}

fn write_log() -> TxnConfig {
    TxnConfig {
        policy: Policy {
            log: Log::Write,
            ..Policy::fasst()
        },
        ..Default::default()
    }
}

fn cluster(nodes: u16, threads: u16, r: u16, rings: LogRingConfig) -> TestCluster {
    cluster_on(Backend::Local, nodes, threads, r, rings)
}

fn cluster_on(b: Backend, nodes: u16, threads: u16, r: u16, rings: LogRingConfig) -> TestCluster {
    let c = TestCluster::with_log_rings(b, nodes, threads, r, &[accounts()], rings);
    for k in 0..N_ACCOUNTS {
        c.load(ACCOUNTS, k, &INITIAL.to_le_bytes());
    }
    c.set_catalogs();
    c
}

fn rng_next(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// What committed: transaction id → its coordinator node and the (key, value) it wrote.
type Committed = Arc<Mutex<HashMap<u64, (u16, Vec<(u64, Vec<u8>)>)>>>;

/// One transfer between two random accounts; its id and writes if it committed.
async fn transfer(
    w: &WorkerCtx,
    seed: &mut u64,
) -> Result<(u64, Vec<(u64, Vec<u8>)>), AbortReason> {
    let a = rng_next(seed) % N_ACCOUNTS;
    let b = (a + 1 + rng_next(seed) % (N_ACCOUNTS - 1)) % N_ACCOUNTS;
    let amount = (rng_next(seed) % 50) as i64;
    let mut t = Txn::begin(&w.ctx, &w.th);
    let ia = t.write(ACCOUNTS, a, WriteKind::Update);
    let ib = t.write(ACCOUNTS, b, WriteKind::Update);
    t.execute().await?;
    let va = i64::from_le_bytes(t.get(ia).unwrap().try_into().unwrap()) - amount;
    let vb = i64::from_le_bytes(t.get(ib).unwrap().try_into().unwrap()) + amount;
    t.set(ia, &va.to_le_bytes());
    t.set(ib, &vb.to_le_bytes());
    let id = t.id();
    t.commit().await?;
    Ok((
        id,
        vec![
            (a, va.to_le_bytes().to_vec()),
            (b, vb.to_le_bytes().to_vec()),
        ],
    ))
}

/// Workers doing `n` transfers each, recording what committed.
fn transfers(n: usize, committed: &Committed) -> Worker {
    let committed = committed.clone();
    Arc::new(move |w: WorkerCtx| {
        let committed = committed.clone();
        Box::pin(async move {
            let mut seed = 0x9e37_79b9 ^ ((w.node as u64) << 32) ^ ((w.thread as u64) << 16)
                | w.coroutine as u64
                | 1;
            for _ in 0..n {
                if let Ok((id, writes)) = transfer(&w, &mut seed).await {
                    committed.lock().unwrap().insert(id, (w.node, writes));
                }
            }
        })
    })
}

fn spec(coroutines: usize) -> RunSpec {
    RunSpec {
        coroutines,
        txn: write_log(),
        ..Default::default()
    }
}

fn assert_money_conserved(c: &TestCluster) {
    c.assert_money_conserved(ACCOUNTS, N_ACCOUNTS, INITIAL);
}

/// Every ring of every node: its records (checked against what committed) and counts.
/// Returns the number of valid records held.
fn check_rings(c: &TestCluster, committed: &Committed) -> u64 {
    let committed = committed.lock().unwrap();
    let mut held = 0;
    for db in &c.dbs {
        let region = db.log_region();
        for ring in region.rings() {
            let (node, thread) = region.owner_of(ring).unwrap();
            let s = region.scan(ring).unwrap();
            assert!(
                matches!(s.end, End::Empty | End::Stale),
                "node {} ring {ring}: {:?}",
                db.node,
                s.end
            );
            assert_eq!((s.malformed, s.torn_bytes), (0, 0));
            assert_eq!(s.valid, s.records.len() as u64);
            let mut last_seq = 0;
            for r in &s.records {
                assert_eq!((r.owner.node, r.owner.thread), (node, thread));
                assert!(r.seq > last_seq, "records out of order");
                last_seq = r.seq;
                let (_, writes) = committed
                    .get(&r.txn)
                    .unwrap_or_else(|| panic!("a record of {:#x}, which did not commit", r.txn));
                let logged: Vec<(u64, Vec<u8>)> =
                    r.writes.iter().map(|w| (w.key, w.value.clone())).collect();
                assert_eq!(&logged, writes, "txn {:#x}: the record differs", r.txn);
                assert!(r.writes.iter().all(|w| w.kind == WriteKind::Update));
            }
            held += s.valid;
        }
    }
    held
}

#[test]
fn write_log_commits_and_rings_hold_exactly_the_untruncated_records_local() {
    commits_and_rings_hold_exactly_the_untruncated_records(Backend::Local);
}

#[test]
fn write_log_commits_and_rings_hold_exactly_the_untruncated_records_shm() {
    commits_and_rings_hold_exactly_the_untruncated_records(Backend::Shm);
}

/// The records a coordinator WRITEs: one per node other than itself that backs a key
/// it wrote, and the key's primary too where the coordinator is one of its backups.
fn records_expected(c: &TestCluster, committed: &Committed) -> u64 {
    let committed = committed.lock().unwrap();
    let mut n = 0;
    for (coordinator, writes) in committed.values() {
        let mut targets: Vec<u16> = writes
            .iter()
            .flat_map(|(k, _)| {
                let backups: Vec<u16> = c.placement.backups(ACCOUNTS, *k).collect();
                let primary = backups
                    .contains(coordinator)
                    .then(|| c.placement.primary(ACCOUNTS, *k));
                backups.into_iter().chain(primary)
            })
            .filter(|b| b != coordinator)
            .collect();
        targets.sort();
        targets.dedup();
        n += targets.len() as u64;
    }
    n
}

fn commits_and_rings_hold_exactly_the_untruncated_records(b: Backend) {
    let c = cluster_on(b, 3, 2, 3, LogRingConfig::default());
    let committed: Committed = Default::default();
    let r = runner::run(&c.nodes, &c.dbs, &spec(3), transfers(120, &committed)).unwrap();
    assert_eq!(r.stuck_workers, 0);
    let st: &TxnStats = &r.txn;
    assert!(st.committed > 100, "too few commits: {st:?}");
    assert_eq!(st.committed, committed.lock().unwrap().len() as u64);
    assert_eq!(st.committed_incomplete, 0);
    assert_money_conserved(&c);
    let lr = st.log_ring;
    // A record at every other backup of the keys written, nothing failed or padded
    // away.
    assert_eq!(
        lr.records_written,
        records_expected(&c, &committed),
        "{lr:?}"
    );
    assert_eq!(
        (lr.write_failures, lr.replica_malformed, lr.replica_torn),
        (0, 0, 0)
    );
    assert!(lr.truncations_acked > 0, "nothing truncated: {lr:?}");
    // Every record was truncated at its replica by the end (each thread's last worker
    // drains its rings) and applied there: the replicas equal their primaries
    // (assert_money_conserved), older records of a key skipped.
    let held = check_rings(&c, &committed);
    assert_eq!(
        (held, lr.replica_records),
        (0, lr.records_written),
        "{lr:?}"
    );
    assert_eq!(lr.backup_refused, 0, "{lr:?}");
    assert!(lr.backup_applied > 0 && lr.backup_older > 0, "{lr:?}");
    // Truncation moved the heads.
    let moved = c
        .dbs
        .iter()
        .flat_map(|db| {
            db.log_region()
                .rings()
                .map(move |i| db.log_region().head(i))
        })
        .filter(|h| h.is_some_and(|h| h.pos > 0))
        .count();
    assert!(moved > 0, "no ring's head moved");
    assert_eq!(st.aborts.get("log_full"), None);
}

#[test]
fn a_tiny_ring_makes_coordinators_wait_and_loses_nothing() {
    let rings = LogRingConfig {
        ring_bytes: 512,
        full_wait: Duration::from_secs(10),
    };
    let c = cluster(2, 1, 2, rings);
    let committed: Committed = Default::default();
    let r = runner::run(&c.nodes, &c.dbs, &spec(4), transfers(60, &committed)).unwrap();
    assert_eq!(r.stuck_workers, 0);
    let st = &r.txn;
    let lr = st.log_ring;
    assert!(st.committed > 50, "too few commits: {st:?}");
    assert_eq!(st.aborts.get("log_full"), None, "{st:?}");
    assert!(lr.full_waits > 0, "the ring never filled: {lr:?}");
    assert!(lr.pads > 0, "the ring never wrapped: {lr:?}");
    assert_eq!(
        lr.records_written,
        records_expected(&c, &committed),
        "{lr:?}"
    );
    assert_money_conserved(&c);
    let held = check_rings(&c, &committed);
    assert_eq!(
        (held, lr.replica_records),
        (0, lr.records_written),
        "{lr:?}"
    );
}

#[test]
fn a_record_larger_than_half_a_ring_aborts_with_its_reason() {
    let rings = LogRingConfig {
        ring_bytes: 256,
        full_wait: Duration::from_secs(10),
    };
    let c = cluster(2, 1, 2, rings);
    let reasons = Arc::new(Mutex::new(Vec::new()));
    let rs = reasons.clone();
    let worker: Worker = Arc::new(move |w: WorkerCtx| {
        let rs = rs.clone();
        Box::pin(async move {
            if w.node != 0 {
                return;
            }
            // Three writes: a record of 32 + 3 × 49 + 16 bytes, over half of 256.
            let mut t = Txn::begin(&w.ctx, &w.th);
            for k in 0..3 {
                t.write(ACCOUNTS, k, WriteKind::Update);
            }
            let outcome = t.commit().await.err();
            rs.lock().unwrap().push(outcome);
        })
    });
    let r = runner::run(&c.nodes, &c.dbs, &spec(1), worker).unwrap();
    assert_eq!(
        *reasons.lock().unwrap(),
        vec![Some(AbortReason::LogRecordTooLarge)]
    );
    assert_eq!(r.txn.aborts.get("log_record_too_large"), Some(&1));
    assert_eq!(r.txn.log_ring.records_written, 0);
    assert_money_conserved(&c);
}

#[test]
fn a_ring_whose_head_record_is_torn_is_never_overwritten_and_ends_in_log_full() {
    let rings = LogRingConfig {
        ring_bytes: 1024,
        full_wait: Duration::from_millis(50),
    };
    let c = cluster(2, 1, 2, rings);
    let replica = c.dbs[1].clone();
    let ring = replica.log_region().ring_of(0, 0).unwrap();
    let ring_off = replica.log_region().desc().ring_offset(ring).unwrap();
    // Where the torn record is, and its bytes as torn.
    type Torn = Arc<Mutex<Option<(u64, Vec<u8>)>>>;
    let torn: Torn = Default::default();
    let outcomes: Arc<Mutex<Vec<Result<(), AbortReason>>>> = Default::default();
    let (t2, o2, rep) = (torn.clone(), outcomes.clone(), replica.clone());
    let worker: Worker = Arc::new(move |w: WorkerCtx| {
        let (torn, outcomes, rep) = (t2.clone(), o2.clone(), rep.clone());
        Box::pin(async move {
            if w.node != 0 {
                return;
            }
            let mut seed = 7;
            for i in 0..40 {
                let r = transfer(&w, &mut seed).await.map(|_| ());
                let full = r == Err(AbortReason::LogFull);
                outcomes.lock().unwrap().push(r);
                let mem = rep.log_region().memory();
                let mut h = [0u8; 16];
                assert!(mem.read(ring_off, &mut h));
                let len = u32::from_le_bytes(h[..4].try_into().unwrap()) as usize;
                // A transfer whose keys node 1 does not back writes no record there.
                if torn.lock().unwrap().is_none() && len > 0 {
                    assert_eq!(r, Ok(()), "{i}");
                    // The first record, at the replica's head: its trailer loses a bit,
                    // as if its WRITE had not finished.
                    let mut rec = vec![0u8; len];
                    assert!(mem.read(ring_off, &mut rec));
                    rec[len - 1] ^= 0x80;
                    assert!(mem.write(ring_off, &rec));
                    *torn.lock().unwrap() = Some((ring_off, rec));
                }
                if full {
                    break;
                }
            }
        })
    });
    let r = runner::run(&c.nodes, &c.dbs, &spec(1), worker).unwrap();
    let outcomes = outcomes.lock().unwrap();
    assert_eq!(
        outcomes.last(),
        Some(&Err(AbortReason::LogFull)),
        "{outcomes:?}"
    );
    assert!(outcomes.len() > 2, "{outcomes:?}");
    let lr = r.txn.log_ring;
    assert!(lr.replica_torn > 0, "the torn record was not seen: {lr:?}");
    assert!(lr.full_waits > 0);
    assert_eq!(r.txn.aborts.get("log_full"), Some(&1));
    // The replica's head never passed the torn record, and it is still there, as torn.
    assert_eq!(replica.log_region().head(ring), Some(RingHead::START));
    let (off, rec) = torn.lock().unwrap().clone().unwrap();
    let mut now = vec![0u8; rec.len()];
    assert!(replica.log_region().memory().read(off, &mut now));
    assert_eq!(now, rec, "an unreleased record was overwritten");
    // Recovery passes over the torn record (a hole) and reads the records after it.
    let s = replica.log_region().scan(ring).unwrap();
    assert_eq!((s.gaps, s.gap_bytes), (1, rec.len() as u64), "{s:?}");
    assert!(s.valid > 0 && s.records.iter().all(|r| r.seq > 1), "{s:?}");
    // The backup applied none of the records behind the torn one (recovery's job), so
    // only the primaries are checked.
    assert_eq!(lr.backup_applied, 0, "{lr:?}");
    c.assert_money_at_primaries(ACCOUNTS, N_ACCOUNTS, INITIAL);
}

// ---- Clusters driven by hand ----

/// A cluster of `nodes` nodes of one thread each, replication `r` and rings of the
/// default size, whose threads the test drives by hand ([`start_by_hand`],
/// [`poll_until`]): the tests below decide which node runs when. The start-up check is
/// skipped (its outcome recorded beforehand).
fn hand_cluster(nodes: u16, r: u16) -> TestCluster {
    let c = cluster(nodes, 1, r, LogRingConfig::default());
    for db in &c.dbs {
        db.record_verification(Ok(0));
    }
    c
}

/// The first `m` keys whose primary is `node`.
fn keys_of(c: &TestCluster, node: u16, m: usize) -> Vec<u64> {
    let keys: Vec<u64> = (0..N_ACCOUNTS)
        .filter(|&k| c.placement.primary(ACCOUNTS, k) == node)
        .take(m)
        .collect();
    assert_eq!(keys.len(), m, "too few keys of node {node}");
    keys
}

/// Starts thread 0 of node `n` on endpoint `ep` with `worker` as each coroutine, to be
/// driven by hand (`poll_once`); `done(c)` runs once coroutine c returned.
fn start_on<F, Fut, D>(
    c: &TestCluster,
    n: usize,
    ep: Box<dyn Endpoint>,
    spec: &RunSpec,
    worker: F,
    done: D,
) -> (Runtime, std::rc::Rc<ambidex_txn::TxnThread>)
where
    F: Fn(WorkerCtx) -> Fut + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
    D: Fn(usize) + 'static,
{
    runner::start_thread(
        ep,
        ambidex_rpc::SystemClock::shared(),
        spec,
        c.dbs[n].clone(),
        None,
        Arc::new(std::sync::atomic::AtomicBool::new(false)),
        worker,
        done,
    )
    .unwrap()
}

/// [`start_on`] the node's own endpoint, nothing called at the coroutines' end.
fn start_by_hand<F, Fut>(
    c: &TestCluster,
    n: usize,
    spec: &RunSpec,
    worker: F,
) -> (Runtime, std::rc::Rc<ambidex_txn::TxnThread>)
where
    F: Fn(WorkerCtx) -> Fut + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    start_on(c, n, c.nodes[n].endpoint(0).unwrap(), spec, worker, |_| {})
}

/// How long [`poll_until`] waits: far more than any of these tests needs, so reaching
/// it is a failure, not a slow machine.
const HAND_DEADLINE: Duration = Duration::from_secs(20);

/// Polls the runtimes `rts` in turn until `until()` holds, or [`HAND_DEADLINE`] passed
/// (the caller's assertions then fail).
fn poll_until(rts: &mut [&mut Runtime], until: impl Fn() -> bool) {
    let deadline = Instant::now() + HAND_DEADLINE;
    while !until() && Instant::now() < deadline {
        for rt in rts.iter_mut() {
            rt.poll_once();
        }
    }
}

/// Polls the runtimes `rts` in turn for `d` (for what no event tells the end of).
fn poll_for(rts: &mut [&mut Runtime], d: Duration) {
    let until = Instant::now() + d;
    poll_until(rts, || Instant::now() >= until);
}

// ---- Reading rings of hand-made bytes ----

fn body(keys: &[u64]) -> Vec<u8> {
    let mut b = Vec::new();
    for &key in keys {
        WriteRec {
            table: ACCOUNTS,
            key,
            kind: WriteKind::Update,
            prev_version: 3,
            token: LockToken {
                offset: 64 * key,
                store_version: 2,
            },
            value: &key.to_le_bytes(),
        }
        .encode(&mut b);
    }
    b
}

fn record(seq: u64, txn: u64, owner: LockOwner, keys: &[u64]) -> Vec<u8> {
    let mut r = Vec::new();
    format::encode_record(&mut r, seq, txn, owner, keys.len() as u16, &body(keys));
    r
}

#[test]
fn torn_stale_garbage_and_malformed_slots_are_counted_never_returned() {
    let f = LocalFabric::new(ClusterConfig::new(2, 1)).unwrap();
    let rings = LogRingConfig {
        ring_bytes: 1024,
        full_wait: Duration::from_millis(10),
    };
    let p = Placement::new(2, 2).unwrap();
    let db = NodeDb::with_log_rings(&*f.nodes()[1], p, &[accounts()], rings).unwrap();
    let region = db.log_region();
    let ring = region.ring_of(0, 0).unwrap();
    assert_eq!(region.ring_of(1, 0), None, "a node does not log to itself");
    let off = region.desc().ring_offset(ring).unwrap();
    let mem = region.memory();
    let me = LockOwner::new(0, 0, 5).unwrap();
    let put = |pos: u64, b: &[u8]| assert!(mem.write(off + pos, b));

    // Nothing written: an empty log.
    let s = region.scan(ring).unwrap();
    assert_eq!((s.end, s.valid, s.head), (End::Empty, 0, RingHead::START));

    // Records 1 and 2, then 3 is malformed (framed, but its write kind is unknown),
    // 4 names another coordinator, 5 is valid, 6 is torn (trailer missing).
    let r1 = record(1, 101, me, &[1, 2]);
    let r2 = record(2, 102, me, &[3]);
    let mut r3 = record(3, 103, me, &[4]);
    r3[format::HEADER + 12] = 9;
    let r4 = record(4, 104, LockOwner::new(1, 0, 5).unwrap(), &[5]);
    let r5 = record(5, 105, me, &[6, 7]);
    let mut r6 = record(6, 106, me, &[8]);
    let n6 = r6.len();
    r6[n6 - 16..].fill(0);
    let mut pos = 0;
    let mut at = Vec::new();
    for r in [&r1, &r2, &r3, &r4, &r5, &r6] {
        put(pos, r);
        at.push(pos);
        pos += r.len() as u64;
    }
    let s = region.scan(ring).unwrap();
    assert_eq!(s.end, End::Torn);
    assert_eq!(
        s.records.iter().map(|r| r.txn).collect::<Vec<_>>(),
        vec![101, 102, 105]
    );
    assert_eq!(s.records[0].writes.len(), 2);
    assert_eq!(s.records[0].writes[1].token.offset, 128);
    assert_eq!((s.valid, s.malformed), (3, 2));
    assert_eq!(s.malformed_bytes, (r3.len() + r4.len()) as u64);
    assert_eq!(s.torn_bytes, n6 as u64);
    assert_eq!(s.head, RingHead { pos: at[5], seq: 6 });

    // A truncation stops at the torn record, whatever was asked.
    let t = region.truncate(ring, pos).unwrap();
    assert_eq!((t.head.pos, t.valid, t.malformed), (at[5], 3, 2));
    assert!(t.torn());
    assert_eq!(region.head(ring).unwrap().pos, at[5]);
    // Its trailer lands: the record is read, and the rest of the ring is stale or empty.
    put(at[5], &record(6, 106, me, &[8]));
    let s = region.scan(ring).unwrap();
    assert_eq!((s.valid, s.end), (1, End::Empty));
    let t = region.truncate(ring, pos).unwrap();
    assert_eq!((t.head.pos, t.valid, t.end), (pos, 1, End::Limit));

    // Garbage and a number from the future at the head end the log too.
    put(pos, &[0xab; 48]);
    assert_eq!(region.scan(ring).unwrap().end, End::Garbage);
    put(pos, &record(99, 107, me, &[9]));
    assert_eq!(region.scan(ring).unwrap().end, End::Garbage);
    // An impossible length with the expected number: torn.
    let mut bad_len = record(7, 107, me, &[9]);
    bad_len[..4].copy_from_slice(&4000u32.to_le_bytes());
    put(pos, &bad_len);
    assert_eq!(region.scan(ring).unwrap().end, End::Torn);

    // Next lap: a pad to the end, record 8 at the start over the bytes of lap one;
    // record 2 of lap one (stale) after it ends the log.
    let pad_len = 1024 - pos;
    put(pos, &format::pad(pad_len, 7));
    let r8 = record(8, 108, me, &[10, 11]);
    assert_eq!(r8.len(), r1.len());
    put(0, &r8);
    let s = region.scan(ring).unwrap();
    assert_eq!(s.end, End::Stale, "{s:?}");
    assert_eq!(
        s.records.iter().map(|r| r.txn).collect::<Vec<_>>(),
        vec![108]
    );
    assert_eq!((s.pads, s.head.seq), (1, 9));
    assert_eq!(s.head.pos, 1024 + r8.len() as u64);
    // A shorter record 8: what follows is the middle of a record of lap one, which is
    // no slot at all (garbage): the log ends there just the same.
    put(0, &record(8, 108, me, &[10]));
    let s = region.scan(ring).unwrap();
    assert_eq!((s.valid, s.end), (1, End::Garbage));
}

/// An endpoint that spoils the key of the next `budget` one-sided WRITEs into `target`
/// (a region of another node): they complete with an error and change nothing, as a
/// WRITE lost on its way would; everything else passes through.
struct FailingWrites {
    inner: Box<dyn Endpoint>,
    target: RegionDesc,
    budget: u32,
    failed: Arc<AtomicU32>,
}

impl Endpoint for FailingWrites {
    fn addr(&self) -> EndpointAddr {
        self.inner.addr()
    }

    fn config(&self) -> &ClusterConfig {
        self.inner.config()
    }

    fn send(&mut self, batch: &[Datagram<'_>]) -> Result<(), TransportError> {
        self.inner.send(batch)
    }

    fn poll_recv(&mut self, max: usize, sink: &mut dyn FnMut(EndpointAddr, &[u8])) -> usize {
        self.inner.poll_recv(max, sink)
    }

    fn post(&mut self, ops: &[OneSidedOp<'_>]) -> Result<(), TransportError> {
        let mut ops = ops.to_vec();
        for op in &mut ops {
            let into_target =
                op.remote.node == self.target.node && op.remote.region == self.target.id;
            if self.budget > 0 && into_target && matches!(op.kind, OneSidedKind::Write { .. }) {
                self.budget -= 1;
                self.failed.fetch_add(1, Ordering::Relaxed);
                op.remote.key ^= 1;
            }
        }
        self.inner.post(&ops)
    }

    fn poll_cq(&mut self, max: usize, out: &mut Vec<Completion>) -> usize {
        self.inner.poll_cq(max, out)
    }

    fn outstanding(&self) -> usize {
        self.inner.outstanding()
    }

    fn wait(&mut self, timeout: Duration) {
        self.inner.wait(timeout)
    }

    fn set_epoch(&mut self, epoch: u32) {
        self.inner.set_epoch(epoch)
    }

    fn counters(&self) -> CounterSnapshot {
        self.inner.counters()
    }

    fn host_threads(&self) -> usize {
        self.inner.host_threads()
    }
}

/// Asserts no key of the table is locked at any node.
fn assert_no_locks(c: &TestCluster) {
    for k in 0..N_ACCOUNTS {
        for db in &c.dbs {
            let h = db.lock_word(ACCOUNTS, k).unwrap();
            assert!(
                h.owner.is_none(),
                "key {k} still locked at node {}",
                db.node
            );
        }
    }
}

/// Commit-forward (issue 18): a ring WRITE that fails once the coordinator's own record
/// exists is posted again (same slot, same bytes) until it lands, and the transaction
/// commits. Node 0's WRITEs into node 2's ring fail three times in a row (the first
/// transaction's append and two retries) while its WRITE into node 1's ring lands at
/// once: the transaction still commits, its record is in each ring exactly once, and
/// every replica applies it (and the later ones) when they are truncated.
#[test]
fn a_failed_log_write_is_sent_again_until_it_lands_and_the_transaction_commits() {
    use std::cell::RefCell;
    use std::rc::Rc;

    const FAILURES: u32 = 3;
    let c = hand_cluster(3, 3);
    // A key of node 0: its backups (nodes 1 and 2) each get the record in their ring.
    let key = keys_of(&c, 0, 1)[0];
    let mut backups: Vec<u16> = c.placement.backups(ACCOUNTS, key).collect();
    backups.sort();
    assert_eq!(backups, vec![1, 2]);
    let failed = Arc::new(AtomicU32::new(0));
    let ep = Box::new(FailingWrites {
        inner: c.nodes[0].endpoint(0).unwrap(),
        target: c.dbs[2].log_region_desc().region,
        budget: FAILURES,
        failed: failed.clone(),
    });
    let n = 3usize;
    // Per transaction: its id, its outcome, and (the first only) its ring at nodes 1
    // and 2 just after it returned (before any truncation).
    type Outcome = (u64, Result<(), AbortReason>);
    let outcomes: Rc<RefCell<Vec<Outcome>>> = Default::default();
    let first_rings: Rc<RefCell<Option<[Vec<u64>; 2]>>> = Default::default();
    let (o, fr, dbs) = (outcomes.clone(), first_rings.clone(), c.dbs.clone());
    let (mut rt0, th0) = start_on(
        &c,
        0,
        ep,
        &spec(1),
        move |w: WorkerCtx| {
            let (o, fr, dbs) = (o.clone(), fr.clone(), dbs.clone());
            async move {
                for i in 0..n {
                    let mut t = Txn::begin(&w.ctx, &w.th);
                    let id = t.id();
                    let ix = t.write(ACCOUNTS, key, WriteKind::Update);
                    let r = async {
                        t.execute().await?;
                        t.set(ix, &(2000 + i as i64).to_le_bytes());
                        t.commit().await
                    }
                    .await;
                    o.borrow_mut().push((id, r.map(|_| ())));
                    if i == 0 {
                        let txns = |db: &NodeDb| {
                            let region = db.log_region();
                            let ring = region.ring_of(0, 0).unwrap();
                            let s = region.scan(ring).unwrap();
                            s.records.iter().map(|r| r.txn).collect::<Vec<_>>()
                        };
                        *fr.borrow_mut() = Some([txns(&dbs[1]), txns(&dbs[2])]);
                    }
                }
            }
        },
        |_| {},
    );
    let (mut rt1, th1) = start_by_hand(&c, 1, &spec(1), |_| async {});
    let (mut rt2, th2) = start_by_hand(&c, 2, &spec(1), |_| async {});
    // Until every transaction returned and node 0's rings are drained (the replicas
    // released, and so applied, every record).
    poll_until(&mut [&mut rt0, &mut rt1, &mut rt2], || {
        outcomes.borrow().len() == n && th0.stats().log_records_held == 0
    });
    let outcomes = outcomes.borrow();
    assert_eq!(outcomes.len(), n, "{outcomes:?}");
    assert!(outcomes.iter().all(|o| o.1.is_ok()), "{outcomes:?}");
    assert_eq!(
        failed.load(Ordering::Relaxed),
        FAILURES,
        "the WRITEs did not fail"
    );
    let st = th0.stats();
    assert_eq!(st.committed, n as u64, "{st:?}");
    assert_eq!(st.committed_incomplete, 0, "{st:?}");
    // One retry round per failed WRITE, each at node 2's ring only.
    assert_eq!(st.log_retries, FAILURES as u64, "{st:?}");
    let lr = st.log_ring;
    // In the end every WRITE landed: none failed, nothing to void.
    assert_eq!(
        (lr.records_written, lr.write_failures, lr.repairs),
        (2 * n as u64, 0, 0),
        "{lr:?}"
    );
    assert_eq!(st.log_records_held, 0, "{st:?}");
    // The first transaction's record, once in each ring (the retry wrote the same slot,
    // not a second record).
    let first = outcomes[0].0;
    let rings = first_rings.borrow().clone().expect("no ring read");
    for (replica, txns) in [1, 2].iter().zip(&rings) {
        assert_eq!(txns, &vec![first], "node {replica}'s ring");
    }
    // Each replica applied every record once, voided none; the copies equal the
    // primary's, which holds the last transaction's value.
    for (replica, th) in [(1, &th1), (2, &th2)] {
        let r = th.stats().log_ring;
        assert_eq!(
            (r.replica_records, r.replica_voids, r.replica_torn),
            (n as u64, 0, 0),
            "node {replica}: {r:?}"
        );
    }
    c.assert_replicas_consistent(ACCOUNTS);
    let mut v = Vec::new();
    ambidex_txn::actions::read(&c.dbs[2], ACCOUNTS, key, &mut v);
    assert_eq!(
        i64::from_le_bytes(v.try_into().unwrap()),
        2000 + n as i64 - 1
    );
    assert_no_locks(&c);
}

/// The ring's void path, which commit-forward keeps for a commit that never returns:
/// a commit dropped at its log flush (its worker dropped mid-transaction) is resolved
/// as aborted though its record landed at the replica. The record is voided by the
/// ring's next flush before any truncation passes it, so neither recovery's reading of
/// the ring nor the replica's apply at truncation ever takes it: the backup's copy of
/// its key keeps its value.
#[test]
fn a_dropped_commits_landed_record_is_voided_and_never_applied() {
    use std::cell::{Cell, RefCell};
    use std::future::Future;
    use std::rc::Rc;
    use std::task::Poll;

    const DROPPED_VALUE: i64 = 4242;
    let c = hand_cluster(2, 2);
    // Keys of node 0 (backup: node 1): the dropped commit writes the first, the later
    // transactions the second, so nothing later overwrites the first at the backup.
    let keys = keys_of(&c, 0, 2);
    let (dropped_key, later_key) = (keys[0], keys[1]);
    let n = TRUNCATE_EVERY as usize * 2;
    /// What the test saw of the dropped transaction's record at node 1.
    #[derive(Debug, Default)]
    struct Seen {
        dropped: Option<u64>,
        first_poll_pending: bool,
        /// Its record in node 1's ring, intact, before the void's flush.
        landed: bool,
        /// Node 1's ring after the next transaction's flush: (the transactions
        /// recovery reads there, voids, the transactions of recovery's replay).
        after_void: Option<(Vec<u64>, u64, Vec<u64>)>,
        committed: usize,
    }
    let seen: Rc<RefCell<Seen>> = Default::default();
    let done = Rc::new(Cell::new(0));
    let (s, d, db1) = (seen.clone(), done.clone(), c.dbs[1].clone());
    let (mut rt0, th0) = start_by_hand(&c, 0, &spec(2), move |w| {
        let (s, d, db1) = (s.clone(), d.clone(), db1.clone());
        async move {
            let ring = db1.log_region().ring_of(0, 0).unwrap();
            let scan = || db1.log_region().scan(ring).unwrap();
            if w.coroutine == 0 {
                let mut t = Txn::begin(&w.ctx, &w.th);
                let ix = t.write(ACCOUNTS, dropped_key, WriteKind::Update);
                t.execute().await.unwrap();
                t.set(ix, &DROPPED_VALUE.to_le_bytes());
                let id = t.id();
                // A key of node 0: the commit's first wait is its log flush.
                let mut commit = Box::pin(t.commit());
                let first = std::future::poll_fn(|cx| Poll::Ready(commit.as_mut().poll(cx))).await;
                drop(commit);
                let mut s = s.borrow_mut();
                s.first_poll_pending = first.is_pending();
                s.dropped = Some(id);
            } else {
                let id = loop {
                    if let Some(id) = s.borrow().dropped {
                        break id;
                    }
                    w.ctx.yield_now().await;
                };
                // The dropped flush's WRITE lands (the local fabric performs it when
                // the batch is posted).
                for _ in 0..10_000 {
                    if scan().records.iter().any(|r| r.txn == id) {
                        s.borrow_mut().landed = true;
                        break;
                    }
                    w.ctx.yield_now().await;
                }
                for i in 0..n {
                    let mut t = Txn::begin(&w.ctx, &w.th);
                    let ix = t.write(ACCOUNTS, later_key, WriteKind::Update);
                    let r = async {
                        t.execute().await?;
                        t.set(ix, &(3000 + i as i64).to_le_bytes());
                        t.commit().await
                    }
                    .await;
                    if r.is_ok() {
                        s.borrow_mut().committed += 1;
                    }
                    if i == 0 {
                        // This flush carried the void; no truncation has passed it.
                        let sc = scan();
                        let mut replayed = Vec::new();
                        ambidex_txn::recovery::records::in_rings(&db1, &mut |txn, _| {
                            replayed.push(txn)
                        });
                        s.borrow_mut().after_void = Some((
                            sc.records.iter().map(|r| r.txn).collect(),
                            sc.voids,
                            replayed,
                        ));
                    }
                }
            }
            d.set(d.get() + 1);
        }
    });
    let (mut rt1, th1) = start_by_hand(&c, 1, &spec(1), |_| async {});
    // Until both coroutines returned and node 0's rings are drained.
    poll_until(&mut [&mut rt0, &mut rt1], || {
        done.get() == 2 && th0.stats().log_records_held == 0
    });
    let seen = seen.borrow();
    assert_eq!(done.get(), 2, "{seen:?}");
    let dropped = seen.dropped.unwrap();
    assert!(
        seen.first_poll_pending,
        "the commit was not at its flush: {seen:?}"
    );
    assert!(
        seen.landed,
        "the dropped commit's record never landed: {seen:?}"
    );
    assert_eq!(seen.committed, n, "{seen:?}");
    // Once voided, recovery reads only the next transaction's record there (and would
    // replay only its write).
    let (records, voids, replayed) = seen.after_void.clone().unwrap();
    assert_eq!(records.len(), 1, "{seen:?}");
    assert!(
        !records.contains(&dropped),
        "recovery reads the voided record: {seen:?}"
    );
    assert_eq!(voids, 1, "{seen:?}");
    assert_eq!(replayed, records, "{seen:?}");
    let st = th0.stats();
    assert_eq!(st.committed, n as u64, "{st:?}");
    assert!(st.log_ring.repairs >= 2, "{:?}", st.log_ring);
    assert_eq!(st.log_records_held, 0, "{st:?}");
    assert!(
        th0.log.borrow().is_empty(),
        "the dropped commit's own record stayed"
    );
    // Node 1 truncated past it as a void, applying every other record.
    let replica = th1.stats().log_ring;
    assert_eq!(
        (replica.replica_voids, replica.replica_records),
        (1, n as u64),
        "{replica:?}"
    );
    // The backup never took the dropped transaction's write: its copy equals the
    // primary's, which never installed it.
    c.assert_replicas_consistent(ACCOUNTS);
    for db in &c.dbs {
        let mut v = Vec::new();
        ambidex_txn::actions::read(db, ACCOUNTS, dropped_key, &mut v);
        assert_eq!(
            i64::from_le_bytes(v.try_into().unwrap()),
            INITIAL,
            "node {}",
            db.node
        );
    }
    assert_no_locks(&c);
}

/// Lost, duplicated and reordered datagrams (truncations and commit RPCs retransmitted,
/// answered at most once): a small ring still loses nothing, and what was written is
/// truncated or still in its ring, exactly.
#[test]
fn truncations_survive_lost_and_duplicated_datagrams() {
    let rings = LogRingConfig {
        ring_bytes: 2048,
        full_wait: Duration::from_secs(20),
    };
    let c = cluster(3, 1, 3, rings);
    let committed: Committed = Default::default();
    let spec = RunSpec {
        fault: Some(ambidex_transport::fault::FaultConfig {
            seed: 17,
            drop: 0.05,
            duplicate: 0.05,
            reorder: 0.05,
            ..Default::default()
        }),
        ..spec(3)
    };
    let r = runner::run(&c.nodes, &c.dbs, &spec, transfers(40, &committed)).unwrap();
    assert_eq!(r.stuck_workers, 0);
    let st = &r.txn;
    let lr = st.log_ring;
    assert!(st.committed > 30, "too few commits: {st:?}");
    assert_eq!(st.aborts.get("log_full"), None, "{st:?}");
    assert!(r.rpc.retransmits > 0, "no datagram was lost: {:?}", r.rpc);
    assert!(lr.truncations_acked > 0, "{lr:?}");
    assert_eq!(lr.write_failures, 0);
    assert_eq!(
        lr.records_written,
        records_expected(&c, &committed),
        "{lr:?}"
    );
    assert_money_conserved(&c);
    let held = check_rings(&c, &committed);
    assert_eq!(
        (held, lr.replica_records),
        (0, lr.records_written),
        "{lr:?}"
    );
}

#[test]
fn bad_ring_sizes_are_clear_errors() {
    let f = LocalFabric::new(ClusterConfig::new(2, 1)).unwrap();
    let p = Placement::new(2, 2).unwrap();
    for ring_bytes in [0, 100, 1000, 128] {
        let rings = LogRingConfig {
            ring_bytes,
            ..Default::default()
        };
        let e = NodeDb::with_log_rings(&*f.nodes()[0], p.clone(), &[], rings)
            .err()
            .expect("a bad ring size accepted")
            .to_string();
        assert!(e.contains("log rings of"), "{e}");
    }
    // Without remote log replicas (R = 1) there are no rings, whatever their size.
    let rings = LogRingConfig {
        ring_bytes: 0,
        ..Default::default()
    };
    let db =
        NodeDb::with_log_rings(&*f.nodes()[0], Placement::new(2, 1).unwrap(), &[], rings).unwrap();
    assert_eq!(db.log_region_desc().rings, 0);
}

/// A transaction whose commit stays incomplete (its primary did not answer) keeps its
/// record in the ring at its keys' backup: truncations never pass it, however many
/// transactions follow, so recovery can still find it (and the backup never applies
/// it before then).
#[test]
fn an_incomplete_commits_record_stays_in_the_ring() {
    use ambidex_rpc::RuntimeConfig;
    use ambidex_txn::policy::{Commit, Execute, Lock, PassiveAck, Validate};
    use std::cell::{Cell, RefCell};
    use std::rc::Rc;

    let c = hand_cluster(3, 3);
    // Keys whose primary is node 1 (backups: nodes 2 and 0). Execute, lock, validate
    // and log are one-sided (the local fabric serves them without node 1's CPU); only
    // the commit's COMMIT_PRIMARY needs node 1. The first transaction writes the first
    // key while node 1 is silent; the later ones write the second.
    let keys = keys_of(&c, 1, 2);
    let mut spec = RunSpec {
        rpc: RuntimeConfig {
            give_up: Duration::from_millis(10),
            ..Default::default()
        },
        ..spec(1)
    };
    spec.txn.policy = Policy {
        execute: Execute::OneSided,
        lock: Lock::Cas,
        validate: Validate::Read,
        log: Log::Write,
        commit: Commit::Rpc,
        passive_ack: PassiveAck::Off,
    };
    let outcomes: Rc<RefCell<Vec<(u64, bool)>>> = Default::default();
    let node1_up = Rc::new(Cell::new(false));
    let (o, up, ks) = (outcomes.clone(), node1_up.clone(), keys.clone());
    let n = TRUNCATE_EVERY as usize * 3;
    let (mut rt0, th0) = start_by_hand(&c, 0, &spec, move |w| {
        let (o, up, ks) = (o.clone(), up.clone(), ks.clone());
        async move {
            for i in 0..n {
                while i > 0 && !up.get() {
                    w.ctx.yield_now().await;
                }
                let mut t = Txn::begin(&w.ctx, &w.th);
                t.write(ACCOUNTS, ks[(i > 0) as usize], WriteKind::Update);
                let id = t.id();
                let ok = t.commit().await.is_ok();
                o.borrow_mut().push((id, ok));
            }
        }
    });
    let (mut rt1, _th1) = start_by_hand(&c, 1, &spec, |_| async {});
    let (mut rt2, th2) = start_by_hand(&c, 2, &spec, |_| async {});
    // Node 1 is silent until the first transaction is done.
    poll_until(&mut [&mut rt0, &mut rt2], || !outcomes.borrow().is_empty());
    node1_up.set(true);
    let all = &mut [&mut rt0, &mut rt1, &mut rt2];
    poll_until(all, || outcomes.borrow().len() >= n);
    // The drain at the worker's end (it cannot pass the incomplete record: it gives up,
    // later than this, so there is no end to wait for).
    poll_for(all, Duration::from_millis(200));
    let outcomes = outcomes.borrow();
    assert_eq!(outcomes.len(), n);
    assert!(outcomes.iter().all(|o| o.1), "{outcomes:?}");
    let st = th0.stats();
    assert_eq!(st.committed_incomplete, 1, "{st:?}");
    // Nothing is reclaimable past the first record, so no truncation was even sent.
    assert_eq!(st.log_ring.truncations_sent, 0, "{:?}", st.log_ring);
    // The first transaction's record is still the first in node 2's ring, and the head
    // is at it; node 0 (a backup too) is the coordinator and has no ring of its own.
    let region = c.dbs[2].log_region();
    let ring = region.ring_of(0, 0).unwrap();
    assert_eq!(region.head(ring), Some(RingHead::START));
    let s = region.scan(ring).unwrap();
    assert_eq!(s.records.first().map(|r| r.txn), Some(outcomes[0].0));
    assert_eq!(s.records.len(), n, "every record after it stays too");
    assert_eq!(s.records[0].writes.len(), 1);
    // Node 2 applied none of them.
    assert_eq!(th2.stats().log_ring.backup_applied, 0);
}

/// A commit dropped while its log WRITEs are out (a worker dropped mid-transaction)
/// leaves nothing that blocks the ring: its slot is voided by the ring's next flush and
/// truncated past like any other; its own node's record is removed.
#[test]
fn a_commit_dropped_at_its_log_flush_does_not_block_the_ring() {
    use std::cell::RefCell;
    use std::future::Future;
    use std::rc::Rc;
    use std::task::Poll;

    let c = hand_cluster(2, 2);
    let keys = keys_of(&c, 0, 2);
    let n = TRUNCATE_EVERY as usize * 3;
    let outcomes: Rc<RefCell<Vec<bool>>> = Default::default();
    let (o, ks) = (outcomes.clone(), keys.clone());
    // Coroutine 0 drops a commit at its log flush (its batch then stays in flight: the
    // runtime does not let a coroutine queue again after dropping a flush, so it stops
    // there); coroutine 1 then runs the thread's next transactions.
    let (mut rt0, th0) = start_by_hand(&c, 0, &spec(2), move |w| {
        let (o, ks) = (o.clone(), ks.clone());
        async move {
            fn txn<'c>(w: &'c WorkerCtx, ks: &[u64]) -> Txn<'c> {
                let mut t = Txn::begin(&w.ctx, &w.th);
                for &k in ks {
                    t.write(ACCOUNTS, k, WriteKind::Update);
                }
                t
            }
            if w.coroutine == 0 {
                // Keys of node 0: the commit's first wait is its log flush.
                let mut commit = Box::pin(txn(&w, &ks).commit());
                let first = std::future::poll_fn(|cx| Poll::Ready(commit.as_mut().poll(cx))).await;
                o.borrow_mut().push(first.is_pending());
                return;
            }
            while o.borrow().is_empty() {
                w.ctx.yield_now().await;
            }
            for _ in 0..n {
                let ok = txn(&w, &ks).commit().await.is_ok();
                o.borrow_mut().push(ok);
            }
        }
    });
    let (mut rt1, th1) = start_by_hand(&c, 1, &spec(1), |_| async {});
    poll_until(&mut [&mut rt0, &mut rt1], || outcomes.borrow().len() > n);
    let outcomes = outcomes.borrow();
    assert_eq!(outcomes.len(), n + 1);
    assert!(outcomes.iter().all(|&ok| ok), "{outcomes:?}");
    let st = th0.stats();
    assert_eq!(st.committed, n as u64);
    assert_eq!(st.committed_incomplete, 0);
    assert!(st.log_ring.repairs >= 2, "{:?}", st.log_ring);
    assert!(st.log_ring.truncations_acked > 0, "{:?}", st.log_ring);
    assert!(
        th0.log.borrow().is_empty(),
        "the dropped commit's own record stayed"
    );
    let region = c.dbs[1].log_region();
    let ring = region.ring_of(0, 0).unwrap();
    assert!(
        region.head(ring).unwrap().pos > 0,
        "the head never passed the slot"
    );
    // The replica truncated past it as a void.
    let replica = th1.stats().log_ring;
    assert_eq!(replica.replica_voids, 1, "{replica:?}");
    assert!(replica.replica_records > 0, "{replica:?}");
}

/// A commit dropped while its flush carries a truncation: the truncation is no longer
/// taken as out, and the drain at the thread's end still brings every backup up to
/// date (it once gave up at once, the backup left stale).
#[test]
fn the_drain_completes_after_a_dropped_flush_that_carried_a_truncation() {
    use std::cell::{Cell, RefCell};
    use std::future::Future;
    use std::rc::Rc;
    use std::task::Poll;

    let c = hand_cluster(2, 2);
    let keys = keys_of(&c, 0, 2);
    let before = TRUNCATE_EVERY as usize;
    let phase: Rc<Cell<u32>> = Default::default();
    let done: Rc<Cell<u32>> = Default::default();
    let dropped_pending: Rc<RefCell<Option<bool>>> = Default::default();
    let (p, ks, dp) = (phase.clone(), keys.clone(), dropped_pending.clone());
    let d2 = done.clone();
    let (mut rt0, th0) = start_on(
        &c,
        0,
        c.nodes[0].endpoint(0).unwrap(),
        &spec(2),
        move |w: WorkerCtx| {
            let (p, ks, dp) = (p.clone(), ks.clone(), dp.clone());
            async move {
                fn txn<'c>(w: &'c WorkerCtx, ks: &[u64]) -> Txn<'c> {
                    let mut t = Txn::begin(&w.ctx, &w.th);
                    for &k in ks {
                        t.write(ACCOUNTS, k, WriteKind::Update);
                    }
                    t
                }
                if w.coroutine == 1 {
                    for _ in 0..before {
                        txn(&w, &ks).commit().await.unwrap();
                    }
                    p.set(1);
                    while p.get() < 2 {
                        w.ctx.yield_now().await;
                    }
                    for _ in 0..5 {
                        txn(&w, &ks).commit().await.unwrap();
                    }
                    return;
                }
                while p.get() < 1 {
                    w.ctx.yield_now().await;
                }
                let mut commit = Box::pin(txn(&w, &ks).commit());
                let first = std::future::poll_fn(|cx| Poll::Ready(commit.as_mut().poll(cx))).await;
                *dp.borrow_mut() = Some(first.is_pending());
                drop(commit);
                p.set(2);
            }
        },
        move |_| d2.set(d2.get() + 1),
    );
    let (mut rt1, th1) = start_by_hand(&c, 1, &spec(1), |_| async {});
    let start = Instant::now();
    let all = &mut [&mut rt0, &mut rt1];
    poll_until(all, || done.get() >= 2);
    // Not held up by the dropped truncation until it is taken as lost (1 s).
    let took = start.elapsed();
    assert!(took < Duration::from_millis(700), "{took:?}");
    // The drain at the thread's end: until every record is released.
    poll_until(all, || th0.stats().log_records_held == 0);
    assert_eq!(done.get(), 2);
    assert_eq!(*dropped_pending.borrow(), Some(true));
    let lr = th0.stats().log_ring;
    assert_eq!(lr.drain_gave_up, 0, "{lr:?}");
    assert!(lr.truncations_sent > lr.truncations_acked, "{lr:?}");
    assert_eq!(th0.stats().log_records_held, 0);
    assert!(th1.stats().log_ring.replica_voids > 0);
    c.assert_replicas_consistent(ACCOUNTS);
}
