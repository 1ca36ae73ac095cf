//! Local CPU writes and remote one-sided CAS / READ / WRITE on the same hot items at
//! once. Node 0 owns one table; its OS threads increment counters under the item lock
//! (`try_lock`, `read_locked`, `write_locked`, `unlock`) and read them lock-free
//! (`try_get`), while coroutines on nodes 1 and 2 increment the same counters one-sided
//! (`get`, CAS `lock`, `write_unlock`) and check them with one-sided `get`s.
//!
//! Every value is one counter repeated in each 8-byte word, so a torn image shows as
//! unequal words. Every item's version is `1 + 2 × counter` (an insert makes version 1,
//! each increment adds 2), so an image whose data and version come from different
//! writes shows too, even when the value is a single word. At the end each counter must
//! equal the increments all sides report (no lost update), each header must be unlocked
//! at `1 + 2 × counter`, and each chunk version must agree with it.
//!
//! Actors never panic while they may hold a lock (that would hang the others): they
//! record what they saw and stop, and the checks run once everyone is done. Work is
//! bounded in increments per actor; a deadline only turns a hang into a failure. The
//! sides are paced against each other ([`Pace`]) so that they really overlap.
//!
//! Values of 8 bytes (one chunk), 200 bytes (four chunks: per-chunk versions matter)
//! and 4000 bytes (a READ long enough that writes often overlap it).
//!
//! Backends: `local` (threads of this process), `shm` (nodes 1 and 2 are child
//! processes whose one-sided operations are atomics on their own mapping of node 0's
//! region, with no CPU of node 0 involved) and `sim` (one thread steps everything,
//! deterministically, with one-sided loss, duplication and delay). Not `udp`: this crate
//! does not depend on that backend and none of its tests builds a udp cluster.
//!
//! Lost updates and broken locking show on every backend. A torn image only arises
//! when a read and a write really run at the same instant, so on `local` and `shm`
//! such bugs are caught with high probability, not certainty, and `sim` (which runs
//! each one-sided operation whole) cannot produce one.

mod common;

use ambidex_rpc::{Ctx, RpcError, Runtime};
use ambidex_store::layout::{check_image, ItemCheck, ItemShape};
use ambidex_store::{
    Header, ItemLock, LocationCache, LockOwner, ReadOutcome, RemoteError, RemoteGet, RemoteReader,
    StoreError, Table, TableConfig, TableDesc,
};
use ambidex_transport::local::LocalFabric;
use ambidex_transport::{ClusterConfig, NodeTransport, Perms, Region, RegionDesc, RegionMemory};
use ambidex_transport_shm::{ShmCluster, ShmNode};
use ambidex_transport_sim::{SimFaults, SimNet};
use common::reader_runtime;
use serde::{Deserialize, Serialize};
use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Hot keys: few, so both sides meet on them all the time.
const KEYS: u64 = 4;
/// The version of a freshly inserted item (0 bumped by 1).
const BASE: u64 = 1;
const LOCAL_THREADS: u16 = 2;
const REMOTE_NODES: [u16; 2] = [1, 2];
/// Incrementing coroutines per remote node, each its own lock owner.
const WORKERS: u16 = 3;
/// Coroutines per remote node: the incrementers and a reader.
const COROUTINES: usize = WORKERS as usize + 1;
/// Only a hang reaches it; a correct run takes well under a second or two.
const DEADLINE: Duration = Duration::from_secs(30);
/// An item that stays locked or torn this long is broken, not contended (holders keep
/// a lock for microseconds): stop then rather than retry until the deadline.
const STUCK: Duration = Duration::from_secs(2);

/// The tests of this file run one at a time: each wants both cores of a small machine
/// for its two sides, or they would rarely run at the same instant.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// How long an actor has found its item busy.
#[derive(Default)]
struct Stuck(Option<Instant>);

impl Stuck {
    /// Notes a busy attempt; true (with a violation recorded) once busy for [`STUCK`].
    fn busy(&mut self, tally: &mut Tally, what: impl FnOnce() -> String) -> bool {
        let since = *self.0.get_or_insert_with(Instant::now);
        if since.elapsed() < STUCK {
            return false;
        }
        tally
            .violations
            .push(format!("{} stayed locked or torn for {STUCK:?}", what()));
        true
    }

    fn clear(&mut self) {
        self.0 = None;
    }
}

/// What one actor (or a merge of several) did and saw.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Tally {
    /// Increments committed, per key.
    incs: Vec<u64>,
    /// Consistent reads whose words and version were checked.
    reads: u64,
    /// Lock attempts lost (item locked, or changed since it was read).
    lost: u64,
    /// Local lock attempts that found a remote owner in the lock word: proof that the
    /// two sides really contended.
    blocked_by_remote: u64,
    /// Reads that found the item locked or torn and retried.
    busy: u64,
    violations: Vec<String>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            incs: vec![0; KEYS as usize],
            ..Tally::default()
        }
    }

    fn done(&self) -> u64 {
        self.incs.iter().sum()
    }

    fn merge(&mut self, o: &Tally) {
        if self.incs.is_empty() {
            self.incs = vec![0; KEYS as usize];
        }
        for (a, b) in self.incs.iter_mut().zip(&o.incs) {
            *a += b;
        }
        self.reads += o.reads;
        self.lost += o.lost;
        self.blocked_by_remote += o.blocked_by_remote;
        self.busy += o.busy;
        self.violations.extend(o.violations.iter().cloned());
    }
}

/// A value holding counter `n` in every word.
fn image(n: u64, vs: usize) -> Vec<u8> {
    (0..vs / 8).flat_map(|_| n.to_le_bytes()).collect()
}

/// The counter of a value read at `version`, if the value is whole and is the one that
/// version must hold.
fn counter_at(val: &[u8], version: u64) -> Result<u64, String> {
    let first = &val[..8];
    if let Some(i) = val.chunks(8).position(|w| w != first) {
        return Err(format!(
            "torn value at version {version}: word {i} is {:?}, word 0 {:?}",
            &val[i * 8..i * 8 + 8],
            first
        ));
    }
    let n = u64::from_le_bytes(first.try_into().unwrap());
    if version != BASE + 2 * n {
        return Err(format!(
            "counter {n} read at version {version} (its version is {})",
            BASE + 2 * n
        ));
    }
    Ok(n)
}

fn new_table(node: &dyn NodeTransport, vs: usize) -> Table {
    let t = Table::create_registered(node, 5, &TableConfig::new(16, vs)).unwrap();
    for k in 0..KEYS {
        assert_eq!(t.insert(k, &image(0, vs)), Ok(BASE));
    }
    t
}

// ---- the local side -------------------------------------------------------------

/// A lock-free read of `k` on node 0, checked: `Some(Some(counter))`, `Some(None)` if
/// locked, `None` after a violation.
fn local_read(t: &Table, k: u64, buf: &mut [u8], tally: &mut Tally) -> Option<Option<u64>> {
    match t.try_get(k, buf) {
        ReadOutcome::Found { version } => match counter_at(buf, version) {
            Ok(n) => {
                tally.reads += 1;
                Some(Some(n))
            }
            Err(e) => {
                tally
                    .violations
                    .push(format!("local try_get of key {k}: {e}"));
                None
            }
        },
        ReadOutcome::Locked => {
            tally.busy += 1;
            Some(None)
        }
        ReadOutcome::NotFound => {
            tally
                .violations
                .push(format!("local try_get: key {k} vanished"));
            None
        }
    }
}

/// Counts a lost local lock attempt on `k`, and whether a remote node held it.
fn local_lost(t: &Table, k: u64, tally: &mut Tally) {
    tally.lost += 1;
    if let Some(Header { owner: Some(o), .. }) = t.header(k) {
        if o.node != 0 {
            tally.blocked_by_remote += 1;
        }
    }
}

/// Increments the item `lk` holds locked (checking what it read under the lock) and
/// releases it. False after a violation (the lock is released unchanged then).
fn local_increment(t: &Table, lk: ItemLock, k: u64, buf: &mut [u8], tally: &mut Tally) -> bool {
    t.read_locked(&lk, buf).unwrap();
    let n = match counter_at(buf, lk.version) {
        Ok(n) => n,
        Err(e) => {
            t.unlock(lk, false);
            tally
                .violations
                .push(format!("local read of key {k} under its lock: {e}"));
            return false;
        }
    };
    tally.reads += 1;
    t.write_locked(&lk, &image(n + 1, buf.len())).unwrap();
    let nv = t.unlock(lk, true);
    if nv != lk.version + 2 {
        tally.violations.push(format!(
            "local unlock of key {k} locked at {} published {nv}",
            lk.version
        ));
        return false;
    }
    tally.incs[k as usize] += 1;
    true
}

/// Both sides' progress, in a small region registered on node 0: local threads update
/// it with CPU atomics, remote workers with one-sided FAA and READ. A local increment
/// costs far less than a one-sided one, so unpaced local threads would finish in a
/// burst and the sides would barely overlap. So the local threads never get more than
/// 0.5% of their work ahead of the remote side's fraction: they run at its pace,
/// interleaved with it. (A looser pace lets the fast side do its share in one burst
/// while the slow side catches up: the sides then take turns instead of overlapping.)
/// Remote workers only wait for the local side to start.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
struct Pace {
    board: RegionDesc,
    /// Increments of each local thread and of each remote worker.
    local_incs: u64,
    remote_incs: u64,
    local_planned: u64,
    remote_planned: u64,
}

/// Board words (byte offsets): increments done, and actors stopped, of each side;
/// actors that stopped on a violation (the others then stop too, rather than retry a
/// broken item until the deadline).
const B_LOCAL: u64 = 0;
const B_REMOTE: u64 = 8;
const B_LOCAL_STOPPED: u64 = 16;
const B_REMOTE_STOPPED: u64 = 24;
const B_FAILED: u64 = 32;
const B_WORDS: usize = 5;
const B_LEN: usize = 64;

impl Pace {
    /// A board on `node` for a run of values of `vs` bytes.
    fn new(node: &dyn NodeTransport, vs: usize) -> (Pace, Region) {
        let board = node.register(B_LEN, Perms::ALL).unwrap();
        // Large values cost more per increment: fewer keep the run short.
        let (local_incs, remote_incs) = if vs > 1000 {
            (20_000, 1_000)
        } else {
            (100_000, 2_000)
        };
        let pace = Pace {
            board: board.desc,
            local_incs,
            remote_incs,
            local_planned: local_incs * LOCAL_THREADS as u64,
            remote_planned: remote_incs * WORKERS as u64 * REMOTE_NODES.len() as u64,
        };
        (pace, board)
    }

    fn local_ahead(&self, board: &RegionMemory) -> bool {
        let w = |off| board.word(off).unwrap().load(Ordering::Acquire);
        let (local, remote) = (w(B_LOCAL), w(B_REMOTE));
        let stopped = w(B_REMOTE_STOPPED) == (WORKERS as usize * REMOTE_NODES.len()) as u64;
        !stopped
            && remote < self.remote_planned
            && local * 1000 * self.remote_planned
                > (remote * 1000 + 5 * self.remote_planned) * self.local_planned
    }

    /// Whether the remote side should wait: until a local thread has started.
    fn remote_early(&self, w: [u64; B_WORDS]) -> bool {
        w[(B_LOCAL / 8) as usize] == 0 && w[(B_LOCAL_STOPPED / 8) as usize] == 0
    }
}

/// One OS thread of node 0: `incs` increments under the item lock, with lock-free reads
/// of every key between them.
fn local_actor(
    t: &Table,
    i: u16,
    incs: u64,
    pace: Option<(&Pace, &RegionMemory)>,
    deadline: Instant,
) -> Tally {
    let owner = LockOwner::new(0, i + 1, 0).unwrap();
    let mut buf = vec![0u8; t.value_size()];
    let mut tally = Tally::new();
    let mut spins = 0u32;
    let mut stuck = Stuck::default();
    'run: while tally.done() < incs {
        if Instant::now() > deadline {
            tally.violations.push(format!(
                "local thread {i}: {} of {incs} increments by the deadline",
                tally.done()
            ));
            break;
        }
        for r in 0..KEYS {
            if local_read(t, r, &mut buf, &mut tally).is_none() {
                break 'run;
            }
        }
        if let Some((p, board)) = pace {
            if board.word(B_FAILED).unwrap().load(Ordering::Acquire) != 0 {
                break;
            }
            if p.local_ahead(board) {
                std::thread::yield_now();
                continue;
            }
        }
        let k = (i as u64 + tally.done()) % KEYS;
        match t.try_lock(k, owner) {
            Ok(lk) => {
                spins = 0;
                stuck.clear();
                if !local_increment(t, lk, k, &mut buf, &mut tally) {
                    break;
                }
                if let Some((_, board)) = pace {
                    board.word(B_LOCAL).unwrap().fetch_add(1, Ordering::Release);
                }
            }
            Err(StoreError::Locked) => {
                local_lost(t, k, &mut tally);
                if stuck.busy(&mut tally, || format!("local thread {i}: key {k}")) {
                    break;
                }
                // Lock holders may be descheduled on a small machine.
                spins += 1;
                if spins.is_multiple_of(16) {
                    std::thread::yield_now();
                }
            }
            Err(e) => {
                tally
                    .violations
                    .push(format!("local try_lock of key {k}: {e}"));
                break;
            }
        }
    }
    if let Some((_, board)) = pace {
        let failed = !tally.violations.is_empty() as u64;
        board
            .word(B_FAILED)
            .unwrap()
            .fetch_add(failed, Ordering::Release);
        board
            .word(B_LOCAL_STOPPED)
            .unwrap()
            .fetch_add(1, Ordering::Release);
    }
    tally
}

// ---- the remote side ------------------------------------------------------------

/// A one-sided read of `k`, checked: its version and offset, or `None` if the item
/// stayed busy (counted) or a violation was recorded (then `tally.violations` grew).
async fn remote_read(
    ctx: &Ctx,
    rd: &RemoteReader,
    desc: &TableDesc,
    cache: &LocationCache,
    k: u64,
    out: &mut [u8],
    tally: &mut Tally,
) -> Option<(u64, u64, u64)> {
    match rd.get(ctx, desc, Some(cache), k, out).await {
        Ok(RemoteGet::Found { version, offset }) => match counter_at(out, version) {
            Ok(n) => {
                tally.reads += 1;
                Some((n, version, offset))
            }
            Err(e) => {
                tally.violations.push(format!("remote get of key {k}: {e}"));
                None
            }
        },
        Err(RemoteError::Busy) => {
            tally.busy += 1;
            None
        }
        r => {
            tally
                .violations
                .push(format!("remote get of key {k}: {r:?}"));
            None
        }
    }
}

/// One coroutine of a remote node: `incs` one-sided increments (READ, CAS lock at the
/// version read, WRITEs and CAS release), with a checked READ of another key before
/// each.
async fn remote_worker(
    ctx: Ctx,
    rd: Rc<RemoteReader>,
    desc: TableDesc,
    owner: LockOwner,
    incs: u64,
    pace: Option<Pace>,
    deadline: Instant,
) -> Tally {
    let vs = desc.layout.value_size as usize;
    let cache = LocationCache::new(64);
    let mut out = vec![0u8; vs];
    let mut tally = Tally::new();
    let who = format!("node {} worker {}", owner.node, owner.slot);
    let mut stuck = Stuck::default();
    while tally.done() < incs {
        if Instant::now() > deadline {
            tally.violations.push(format!(
                "{who}: {} of {incs} increments by the deadline",
                tally.done()
            ));
            break;
        }
        if let Some(p) = &pace {
            match board_read(&ctx, p).await {
                Ok(w) if w[(B_FAILED / 8) as usize] != 0 => break,
                Ok(w) if p.remote_early(w) => continue,
                Ok(_) => {}
                Err(e) => {
                    tally.violations.push(format!("{who}: board READ: {e}"));
                    break;
                }
            }
        }
        let k = (owner.node as u64 + owner.slot as u64 + tally.done()) % KEYS;
        let seen = tally.violations.len();
        remote_read(
            &ctx,
            &rd,
            &desc,
            &cache,
            (k + 1) % KEYS,
            &mut out,
            &mut tally,
        )
        .await;
        let got = remote_read(&ctx, &rd, &desc, &cache, k, &mut out, &mut tally).await;
        if tally.violations.len() > seen {
            break;
        }
        let Some((n, version, offset)) = got else {
            if stuck.busy(&mut tally, || format!("{who}: key {k}")) {
                break;
            }
            continue;
        };
        stuck.clear();
        match rd.lock(&ctx, &desc, offset, version, owner).await {
            Ok(true) => {}
            Ok(false) => {
                tally.lost += 1;
                continue;
            }
            Err(e) => {
                tally
                    .violations
                    .push(format!("{who}: lock of key {k}: {e}"));
                break;
            }
        }
        let r = rd
            .write_unlock(&ctx, &desc, offset, k, version, owner, &image(n + 1, vs))
            .await;
        if r != Ok(version + 2) {
            tally.violations.push(format!(
                "{who}: write_unlock of key {k} locked at {version}: {r:?}"
            ));
            break;
        }
        tally.incs[k as usize] += 1;
        if let Some(p) = &pace {
            if let Err(e) = board_add(&ctx, p, B_REMOTE).await {
                tally.violations.push(format!("{who}: board FAA: {e}"));
                break;
            }
        }
    }
    if let Some(p) = &pace {
        // A failure here leaves the local side waiting until the deadline, which
        // records it.
        if !tally.violations.is_empty() {
            let _ = board_add(&ctx, p, B_FAILED).await;
        }
        let _ = board_add(&ctx, p, B_REMOTE_STOPPED).await;
    }
    tally
}

/// The board's words, READ one-sided.
async fn board_read(ctx: &Ctx, p: &Pace) -> Result<[u64; B_WORDS], RpcError> {
    let h = ctx.queue_read(p.board.at(0), 8 * B_WORDS as u32, true)?;
    ctx.flush().await?;
    Ok(ctx.read_result(h, |b| {
        std::array::from_fn(|i| u64::from_ne_bytes(b[i * 8..i * 8 + 8].try_into().unwrap()))
    })?)
}

/// Adds 1 to the board word at `off` with a one-sided FAA.
async fn board_add(ctx: &Ctx, p: &Pace, off: u64) -> Result<(), RpcError> {
    let h = ctx.queue_faa(p.board.at(off), 1, true)?;
    ctx.flush().await?;
    ctx.atomic_result(h)?;
    Ok(())
}

/// The remote node `n`'s side on `rt`: its incrementing workers and one reader that
/// READs every key while they run (more READs racing the writers: a torn image is
/// only seen by a READ that overlaps a write), spawned; their merged tally (and the
/// reader's retries) once `rt` has run them to the end. `rt` needs scratch for
/// [`COROUTINES`].
fn spawn_remote_workers(
    rt: &mut Runtime,
    n: u16,
    desc: TableDesc,
    incs: u64,
    pace: Option<Pace>,
    deadline: Instant,
) -> (Rc<RefCell<Tally>>, Rc<RemoteReader>) {
    let rd = Rc::new(RemoteReader::new());
    let total = Rc::new(RefCell::new(Tally::new()));
    let live = Rc::new(Cell::new(WORKERS));
    for w in 0..WORKERS {
        let owner = LockOwner::new(n, 0, w + 1).unwrap();
        let (rd, total, live) = (rd.clone(), total.clone(), live.clone());
        rt.spawn(move |ctx| async move {
            let t = remote_worker(ctx, rd, desc, owner, incs, pace, deadline).await;
            total.borrow_mut().merge(&t);
            live.set(live.get() - 1);
        });
    }
    let (r, total2) = (rd.clone(), total.clone());
    rt.spawn(move |ctx| async move {
        let cache = LocationCache::new(64);
        let mut out = vec![0u8; desc.layout.value_size as usize];
        let mut tally = Tally::new();
        'run: while live.get() > 0 {
            for k in 0..KEYS {
                remote_read(&ctx, &r, &desc, &cache, k, &mut out, &mut tally).await;
                if !tally.violations.is_empty() {
                    break 'run;
                }
            }
        }
        total2.borrow_mut().merge(&tally);
    });
    (total, rd)
}

fn remote_tally(total: &Rc<RefCell<Tally>>, rd: &RemoteReader) -> Tally {
    let mut t = total.borrow().clone();
    t.busy += rd.stats().retries;
    t
}

// ---- the checks -----------------------------------------------------------------

/// Final checks over every side's tally: `(name, tally, planned increments)`.
fn verify(t: &Table, sides: &[(String, Tally, u64)]) -> Tally {
    let mut all = Tally::new();
    for (name, s, _) in sides {
        eprintln!(
            "{name}: {} increments, {} checked reads, {} lost lock races ({} to a remote \
             owner), {} busy reads",
            s.done(),
            s.reads,
            s.lost,
            s.blocked_by_remote,
            s.busy
        );
        all.merge(s);
    }
    assert!(
        all.violations.is_empty(),
        "{} violations, first ones: {:#?}",
        all.violations.len(),
        &all.violations[..all.violations.len().min(8)]
    );
    for (name, s, planned) in sides {
        assert_eq!(s.done(), *planned, "{name} did not finish its increments");
        assert!(s.reads > 0, "{name} checked no read");
    }
    let shape = ItemShape::new(t.layout());
    let mut buf = vec![0u8; t.value_size()];
    let mut img = vec![0u8; shape.item_size];
    for k in 0..KEYS {
        let want = all.incs[k as usize];
        assert_eq!(
            t.header(k),
            Some(Header {
                owner: None,
                version: BASE + 2 * want
            }),
            "key {k}: left locked, or its version is not 1 + 2 per increment ({want})"
        );
        let v = t.get(k, &mut buf).unwrap();
        assert_eq!(
            counter_at(&buf, v),
            Ok(want),
            "key {k}: lost updates (counter vs increments of all sides)"
        );
        // What a remote reader would see: every chunk version agrees with the header.
        let (off, _) = t.locate_item(k).unwrap();
        assert!(t.memory().read(off, &mut img));
        assert_eq!(
            check_image(&shape, &img, k, &mut buf),
            ItemCheck::Ok(BASE + 2 * want),
            "key {k}: chunk versions disagree with the header"
        );
    }
    all
}

// ---- local backend --------------------------------------------------------------

/// Runs `once` (a whole checked run) until the two sides met on some lock: whether they
/// did is up to the scheduler (on a loaded two-core machine both sides may get one core
/// between them, and then meet only when a lock holder is preempted), whereas every run
/// must pass every check.
fn until_overlap(mut once: impl FnMut() -> Tally) {
    for _ in 0..8 {
        if once().blocked_by_remote > 0 {
            return;
        }
        eprintln!("no local lock attempt met a remote owner; again");
    }
    panic!("in 8 runs, no local lock attempt ever met a remote owner: the sides never overlapped");
}

/// One checked run on the `local` backend; its merged tally.
fn run_local(vs: usize) -> Tally {
    let _serial = serial();
    let fabric = LocalFabric::new(ClusterConfig::new(3, 1)).unwrap();
    let node0 = fabric.node(0);
    let t = new_table(node0.as_ref(), vs);
    let desc = t.desc();
    let (pace, board) = Pace::new(node0.as_ref(), vs);
    let deadline = Instant::now() + DEADLINE;
    let remote_planned = pace.remote_incs * WORKERS as u64;
    let sides = std::thread::scope(|s| {
        let remotes: Vec<_> = REMOTE_NODES
            .iter()
            .map(|&n| {
                let node = fabric.node(n);
                s.spawn(move || {
                    let item = desc.layout.item_size as usize;
                    let mut rt = reader_runtime(node.as_ref(), 0, COROUTINES, item);
                    let (total, rd) = spawn_remote_workers(
                        &mut rt,
                        n,
                        desc,
                        pace.remote_incs,
                        Some(pace),
                        deadline,
                    );
                    rt.run();
                    remote_tally(&total, &rd)
                })
            })
            .collect();
        let locals: Vec<_> = (0..LOCAL_THREADS)
            .map(|i| {
                let (t, pace, board) = (&t, &pace, &board.mem);
                s.spawn(move || local_actor(t, i, pace.local_incs, Some((pace, board)), deadline))
            })
            .collect();
        let mut sides = Vec::new();
        for (i, h) in locals.into_iter().enumerate() {
            sides.push((
                format!("local thread {i}"),
                h.join().unwrap(),
                pace.local_incs,
            ));
        }
        for (n, h) in REMOTE_NODES.iter().zip(remotes) {
            sides.push((format!("node {n}"), h.join().unwrap(), remote_planned));
        }
        sides
    });
    verify(&t, &sides)
}

#[test]
fn local_backend_mixed_increments_of_one_word_values() {
    until_overlap(|| run_local(8));
}

#[test]
fn local_backend_mixed_increments_of_multi_chunk_values() {
    until_overlap(|| run_local(200));
}

// ---- shm backend: nodes 1 and 2 are child processes ------------------------------

const ENV_DIR: &str = "AMBIDEX_STORE_MIXED_DIR";
const ENV_NODE: &str = "AMBIDEX_STORE_MIXED_NODE";

/// Removes the cluster directory when the test ends, however it ends.
struct ShmDir(PathBuf);

impl Drop for ShmDir {
    fn drop(&mut self) {
        // The descriptor and ready files are this test's own; the backend removes only
        // its own files.
        for f in ["table.json", "ready-1", "ready-2", "go"] {
            let _ = std::fs::remove_file(self.0.join(f));
        }
        let _ = ShmCluster::remove(&self.0);
    }
}

fn shm_dir(vs: usize) -> PathBuf {
    let name = format!("ambidex-store-mixed-{}-{vs}", std::process::id());
    let base = PathBuf::from("/dev/shm");
    if base.is_dir() {
        base.join(name)
    } else {
        std::env::temp_dir().join(name)
    }
}

/// Waits until every remote node process is ready to start.
fn wait_ready(dir: &Path, children: &mut [std::process::Child]) {
    let deadline = Instant::now() + DEADLINE;
    let ready = |n: u16| dir.join(format!("ready-{n}")).exists();
    while !REMOTE_NODES.iter().all(|&n| ready(n)) {
        for (&n, c) in REMOTE_NODES.iter().zip(children.iter_mut()) {
            if let Ok(Some(st)) = c.try_wait() {
                assert!(
                    ready(n),
                    "node {n}'s process exited before it was ready: {st}"
                );
            }
        }
        assert!(
            Instant::now() < deadline,
            "remote node processes never got ready"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A remote node process's tally, from its output.
fn child_tally(n: u16, out: std::process::Output) -> Tally {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "node {n} process failed:\n{stdout}\n{stderr}"
    );
    stdout
        .lines()
        .find_map(|l| l.split("TALLY ").nth(1))
        .and_then(|j| serde_json::from_str(j).ok())
        .unwrap_or_else(|| panic!("no tally from node {n}:\n{stdout}\n{stderr}"))
}

/// One checked run on the `shm` backend; its merged tally.
fn run_shm(vs: usize) -> Tally {
    let _serial = serial();
    let dir = shm_dir(vs);
    let _ = ShmCluster::remove(&dir);
    ShmCluster::create(&dir, &ClusterConfig::new(3, 1)).unwrap();
    let _cleanup = ShmDir(dir.clone());
    let node0 = ShmNode::open(&dir, 0).unwrap();
    let t = new_table(node0.as_ref(), vs);
    let (pace, board) = Pace::new(node0.as_ref(), vs);
    std::fs::write(
        dir.join("table.json"),
        serde_json::to_vec(&(t.desc(), pace)).unwrap(),
    )
    .unwrap();
    let mut children: Vec<_> = REMOTE_NODES
        .iter()
        .map(|n| {
            Command::new(std::env::current_exe().unwrap())
                .args([
                    "shm_mixed_child",
                    "--exact",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(ENV_DIR, &dir)
                .env(ENV_NODE, n.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    wait_ready(&dir, &mut children);
    std::fs::write(dir.join("go"), b"").unwrap();
    let deadline = Instant::now() + DEADLINE;
    let (mut sides, outputs) = std::thread::scope(|s| {
        let hs: Vec<_> = (0..LOCAL_THREADS)
            .map(|i| {
                let (t, pace, board) = (&t, &pace, &board.mem);
                s.spawn(move || local_actor(t, i, pace.local_incs, Some((pace, board)), deadline))
            })
            .collect();
        let sides: Vec<_> = hs
            .into_iter()
            .enumerate()
            .map(|(i, h)| {
                (
                    format!("local thread {i}"),
                    h.join().unwrap(),
                    pace.local_incs,
                )
            })
            .collect();
        let outs: Vec<_> = children
            .into_iter()
            .map(|c| c.wait_with_output().unwrap())
            .collect();
        (sides, outs)
    });
    let remote_planned = pace.remote_incs * WORKERS as u64;
    for (&n, out) in REMOTE_NODES.iter().zip(outputs) {
        sides.push((
            format!("node {n} (process)"),
            child_tally(n, out),
            remote_planned,
        ));
    }
    verify(&t, &sides)
}

#[test]
fn local_backend_mixed_increments_of_large_values() {
    until_overlap(|| run_local(4000));
}

#[test]
fn shm_backend_mixed_increments_of_large_values() {
    until_overlap(|| run_shm(4000));
}

#[test]
fn shm_backend_mixed_increments_of_one_word_values() {
    until_overlap(|| run_shm(8));
}

#[test]
fn shm_backend_mixed_increments_of_multi_chunk_values() {
    until_overlap(|| run_shm(200));
}

/// A remote node's process (run by the shm tests above).
#[test]
#[ignore]
fn shm_mixed_child() {
    let (Some(dir), Some(n)) = (std::env::var_os(ENV_DIR), std::env::var_os(ENV_NODE)) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let n: u16 = n.to_str().unwrap().parse().unwrap();
    let (desc, pace): (TableDesc, Pace) =
        serde_json::from_slice(&std::fs::read(dir.join("table.json")).unwrap()).unwrap();
    let node = ShmNode::open(&dir, n).unwrap();
    let mut rt = reader_runtime(node.as_ref(), 0, COROUTINES, desc.layout.item_size as usize);
    let deadline = Instant::now() + DEADLINE;
    let (total, rd) =
        spawn_remote_workers(&mut rt, n, desc, pace.remote_incs, Some(pace), deadline);
    std::fs::write(dir.join(format!("ready-{n}")), b"").unwrap();
    // All sides start together, so that they overlap.
    while !dir.join("go").exists() {
        assert!(Instant::now() < deadline, "never told to start");
        std::thread::sleep(Duration::from_micros(100));
    }
    rt.run();
    let tally = remote_tally(&total, &rd);
    println!("TALLY {}", serde_json::to_string(&tally).unwrap());
}

// ---- sim backend: one thread steps both sides ------------------------------------

const SIM_LOCAL_INCS: u64 = 40;
const SIM_REMOTE_INCS: u64 = 15;

/// A local actor of the sim test: it holds a lock across a few steps of the network
/// (as a transaction would), so remote operations meet it locked.
struct SimLocal {
    i: u16,
    owner: LockOwner,
    held: Option<(ItemLock, u64, u64)>,
    tally: Tally,
    stopped: bool,
}

impl SimLocal {
    fn step(&mut self, t: &Table, step: u64, buf: &mut [u8]) {
        if self.stopped {
            return;
        }
        let tally = &mut self.tally;
        if local_read(t, step % KEYS, buf, tally).is_none() {
            self.stopped = true;
            return;
        }
        match self.held.take() {
            None if tally.done() < SIM_LOCAL_INCS => {
                let k = (self.i as u64 + tally.done()) % KEYS;
                match t.try_lock(k, self.owner) {
                    Ok(lk) => self.held = Some((lk, k, step + (step * 7 + self.i as u64) % 9)),
                    Err(StoreError::Locked) => local_lost(t, k, tally),
                    Err(e) => {
                        tally
                            .violations
                            .push(format!("local try_lock of key {k}: {e}"));
                        self.stopped = true;
                    }
                }
            }
            None => {}
            Some((lk, k, until)) => {
                // A remote release must never erase a lock it does not hold, even when
                // the network re-executes a duplicated WRITE.
                if !t.holds_lock(&lk, k) {
                    tally.violations.push(format!(
                        "step {step}: local lock on key {k} erased: {:?}",
                        t.header(k)
                    ));
                    self.stopped = true;
                } else if step >= until {
                    self.stopped = !local_increment(t, lk, k, buf, tally);
                } else {
                    self.held = Some((lk, k, until));
                }
            }
        }
    }

    fn finished(&self) -> bool {
        self.stopped || (self.held.is_none() && self.tally.done() >= SIM_LOCAL_INCS)
    }
}

/// One seeded run; the tallies of every side.
fn run_sim(vs: usize, seed: u64) -> Vec<(String, Tally, u64)> {
    let faults = SimFaults {
        onesided_loss: 0.05,
        onesided_duplicate: 0.1,
        onesided_delay: 0.2,
        ..SimFaults::default()
    };
    let net = SimNet::new(ClusterConfig::new(3, 1), seed, faults).unwrap();
    let t = new_table(net.node(0).as_ref(), vs);
    let desc = t.desc();
    let deadline = Instant::now() + DEADLINE;
    let mut rts = Vec::new();
    for &n in &REMOTE_NODES {
        let mut rt = reader_runtime(
            net.node(n).as_ref(),
            0,
            COROUTINES,
            desc.layout.item_size as usize,
        );
        let (total, rd) = spawn_remote_workers(&mut rt, n, desc, SIM_REMOTE_INCS, None, deadline);
        rts.push((n, rt, total, rd));
    }
    let mut locals: Vec<_> = (0..LOCAL_THREADS)
        .map(|i| SimLocal {
            i,
            owner: LockOwner::new(0, i + 1, 0).unwrap(),
            held: None,
            tally: Tally::new(),
            stopped: false,
        })
        .collect();
    let mut buf = vec![0u8; vs];
    for step in 0u64.. {
        let remote_done = rts.iter().all(|(_, rt, _, _)| rt.live_tasks() == 0);
        if remote_done && locals.iter().all(SimLocal::finished) {
            break;
        }
        // A broken run stops here and `verify` says why: a violation a local actor saw
        // (remote workers' are in their tallies once they stop), or work not finished.
        let failed = locals.iter().any(|l| !l.tally.violations.is_empty());
        if failed || step == 2_000_000 {
            eprintln!("seed {seed}: stopped at step {step}");
            break;
        }
        for (_, rt, _, _) in rts.iter_mut() {
            rt.poll_once();
        }
        for l in locals.iter_mut() {
            l.step(&t, step, &mut buf);
        }
        let next = net.next_event_time().unwrap_or(net.now() + 1_000);
        net.advance_to(next);
    }
    let mut sides: Vec<_> = locals
        .into_iter()
        .map(|l| {
            (
                format!("seed {seed} local {}", l.i),
                l.tally,
                SIM_LOCAL_INCS,
            )
        })
        .collect();
    for (n, _, total, rd) in &rts {
        let planned = SIM_REMOTE_INCS * WORKERS as u64;
        sides.push((
            format!("seed {seed} node {n}"),
            remote_tally(total, rd),
            planned,
        ));
    }
    verify(&t, &sides);
    sides
}

#[test]
fn sim_backend_mixed_increments_under_onesided_faults() {
    let _serial = serial();
    let mut all = Tally::new();
    for vs in [8, 200] {
        for seed in 1..=20 {
            for (_, s, _) in run_sim(vs, seed) {
                all.merge(&s);
            }
        }
    }
    assert!(all.blocked_by_remote > 0, "local lockers met remote owners");
    assert!(all.lost > 0 && all.busy > 0, "the sides contended: {all:?}");
}
