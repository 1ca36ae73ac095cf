//! When the first transaction that touched a failed node's data committed
//! (`recovery.first_commit_ms` in the report, docs/cluster.md): the transaction type the
//! workloads use ([`Txn`], a thin wrapper of `ambidex_txn::Txn`) notes, once its node's
//! epoch moved past the run's first configuration, whether a key it reads or writes had
//! its primary on a node that is no longer a member; the first such commit of each node
//! thread is kept. Before any epoch change a transaction pays one comparison of its
//! runtime's epoch at begin; nothing is allocated per transaction.

use ambidex_rpc::Ctx;
use ambidex_txn::runner::WorkerCtx;
use ambidex_txn::{AbortReason, Committed, Configuration, ItemId, Phase, TxnThread, WriteKind};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The death [`arm_commit_kill`] asks for: called with how many of the calling thread's
/// coordinators are in the commit window; it does not return (the process ends).
pub type Die = Arc<dyn Fn(CommitMoment) + Send + Sync>;

/// The moment a commit-phase kill found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommitMoment {
    /// Coordinators (and committers) of the dying thread between their first
    /// commit-backup write and the end of commit-primary.
    pub in_commit: u32,
    /// Milliseconds from arming to this moment.
    pub waited_ms: u64,
}

/// Set once a commit-phase kill is armed: the only cost to a transaction before that
/// is this load at begin.
static COMMIT_KILL_ARMED: AtomicBool = AtomicBool::new(false);
static COMMIT_KILL: Mutex<Option<(Instant, Die)>> = Mutex::new(None);

/// For this long after arming, a moment needs [`SEVERAL`] coordinators in the commit
/// window; then one is enough; after [`GIVE_UP`] the node dies at the next begin
/// whatever its coordinators do, or (no transaction begins) from a watchdog thread
/// shortly after: the moment says so (`in_commit` 0).
const PREFER_SEVERAL: Duration = Duration::from_millis(200);
const SEVERAL: u32 = 2;
const GIVE_UP: Duration = Duration::from_secs(1);

/// Transactions that began (and looked) since arming, for the give-up's message.
static BEGINS_ARMED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Transactions that began on this process's threads since the commit-phase kill was
/// armed (a give-up with none means its workers were not running transactions).
pub fn begins_since_armed() -> u64 {
    BEGINS_ARMED.load(Ordering::Relaxed)
}

/// `bench --kill NODE@commit:SECONDS`: from now on, the next transaction to begin on a
/// thread of this process while other coordinators of that thread are in the commit
/// phase (suspended between their first commit-backup write and the end of
/// commit-primary: `TxnThread::in_phase`) calls `die` (which kills the process).
/// Several at once are preferred for a while (`PREFER_SEVERAL`).
pub fn arm_commit_kill(die: Die) {
    let at = Instant::now();
    *COMMIT_KILL.lock().unwrap_or_else(|e| e.into_inner()) = Some((at, die.clone()));
    COMMIT_KILL_ARMED.store(true, Ordering::SeqCst);
    // The node dies even if no transaction begins any more (its workers wait for the
    // cluster, say): a kill asked for is never silently skipped.
    let watchdog = move || {
        std::thread::sleep(GIVE_UP + Duration::from_millis(100));
        die(CommitMoment {
            in_commit: 0,
            waited_ms: at.elapsed().as_millis() as u64,
        });
    };
    if std::thread::Builder::new()
        .name("commit-kill".into())
        .spawn(watchdog)
        .is_err()
    {
        eprintln!("ambidex: no watchdog thread for the commit-phase kill");
    }
}

/// How many of `th`'s coordinators are in the commit window now.
fn in_commit(th: &TxnThread) -> u32 {
    th.in_phase(Phase::CommitBackup) + th.in_phase(Phase::CommitPrimary)
}

/// The moment to die, if now is one: `n` in the commit window, `waited` since arming.
fn commit_moment(n: u32, waited: Duration) -> Option<CommitMoment> {
    let need = if waited < PREFER_SEVERAL { SEVERAL } else { 1 };
    (n >= need || waited >= GIVE_UP).then_some(CommitMoment {
        in_commit: n,
        waited_ms: waited.as_millis() as u64,
    })
}

#[cold]
fn maybe_die_in_commit(th: &TxnThread) {
    let armed = COMMIT_KILL
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let Some((at, die)) = armed else { return };
    BEGINS_ARMED.fetch_add(1, Ordering::Relaxed);
    if let Some(m) = commit_moment(in_commit(th), at.elapsed()) {
        die(m);
    }
}

/// One node thread's watch (its coroutines share it).
struct Watch {
    /// The run's first configuration, as this thread saw it when its first worker began.
    base: Rc<Configuration>,
    /// The run this watch is of (the node's timeline zero).
    t0: Instant,
    /// When (the runtime's clock, ns: the system clock every process of a host shares
    /// with the launcher's manager) the first commit that touched a lost primary ended.
    first_ns: Cell<Option<u64>>,
}

thread_local! {
    static WATCH: RefCell<Option<Rc<Watch>>> = const { RefCell::new(None) };
}

/// Called by each worker as it starts: the first of a thread sets the thread's watch up
/// (a node thread runs one run's workers; a new run's first worker replaces it).
pub(crate) fn start_worker(w: &WorkerCtx, t0: Instant) {
    WATCH.with(|cell| {
        let mut g = cell.borrow_mut();
        if g.as_ref().is_some_and(|x| x.t0 == t0) {
            return;
        }
        *g = Some(Rc::new(Watch {
            base: w.th.config(),
            t0,
            first_ns: Cell::new(None),
        }));
    });
}

/// When this thread's first commit that touched a lost primary ended (ns on the
/// runtime's clock), in the run whose workers were made at `t0`.
pub(crate) fn first_commit_ns(t0: Instant) -> Option<u64> {
    WATCH.with(|cell| {
        cell.borrow()
            .as_ref()
            .filter(|x| x.t0 == t0)
            .and_then(|x| x.first_ns.get())
    })
}

/// What an armed transaction checks its keys against.
struct Armed {
    watch: Rc<Watch>,
    now: Rc<Configuration>,
}

impl Armed {
    fn lost(&self, table: u32, key: u64) -> bool {
        !self
            .now
            .placement
            .is_member(self.watch.base.placement.primary(table, key))
    }
}

/// `ambidex_txn::Txn` with the check above; the same methods.
pub struct Txn<'c> {
    t: ambidex_txn::Txn<'c>,
    ctx: &'c Ctx,
    /// Set once the epoch changed and this thread has not recorded its first commit.
    armed: Option<Armed>,
    touched: bool,
}

impl<'c> Txn<'c> {
    /// Begins a transaction of this thread's coordinator. With a commit-phase kill armed
    /// ([`arm_commit_kill`]), this is where the process may die.
    pub fn begin(ctx: &'c Ctx, th: &Rc<TxnThread>) -> Txn<'c> {
        if COMMIT_KILL_ARMED.load(Ordering::Relaxed) {
            // The other coroutines of this thread are suspended where they are: some
            // may be in the middle of their commit phase.
            maybe_die_in_commit(th);
        }
        let t = ambidex_txn::Txn::begin(ctx, th);
        // The first configuration's epoch is 1 (`Configuration::initial`).
        let armed = if ctx.epoch() > 1 {
            WATCH.with(|cell| {
                cell.borrow()
                    .as_ref()
                    .filter(|x| x.first_ns.get().is_none() && x.base.epoch != ctx.epoch())
                    .map(|x| Armed {
                        watch: x.clone(),
                        now: th.config(),
                    })
            })
        } else {
            None
        };
        Txn {
            t,
            ctx,
            armed,
            touched: false,
        }
    }

    #[inline]
    fn note(&mut self, table: u32, key: u64) {
        if let Some(a) = &self.armed {
            if !self.touched && a.lost(table, key) {
                self.touched = true;
            }
        }
    }

    /// Adds `key` to the read set (no I/O until [`Txn::execute`]).
    pub fn read(&mut self, table: u32, key: u64) -> ItemId {
        self.note(table, key);
        self.t.read(table, key)
    }

    /// Adds `key` to the write set with `kind` (no I/O until [`Txn::execute`]).
    pub fn write(&mut self, table: u32, key: u64, kind: WriteKind) -> ItemId {
        self.note(table, key);
        self.t.write(table, key, kind)
    }

    /// The value fetched for `item` (`None` if the key is absent or not yet fetched).
    pub fn get(&self, item: ItemId) -> Option<&[u8]> {
        self.t.get(item)
    }

    /// Sets the value an insert or update of `item` commits; panics if `item` is not an
    /// insert or update of this transaction.
    pub fn set(&mut self, item: ItemId, value: &[u8]) {
        self.t.set(item, value)
    }

    /// Fetches every key added since the last call with one doorbell: values and
    /// versions of the read set, locks for the write set. On failure the transaction is
    /// aborted (its locks released) and the reason returned.
    pub async fn execute(&mut self) -> Result<(), AbortReason> {
        self.t.execute().await
    }

    /// Aborts: releases every lock held and counts the abort as the application's.
    pub async fn abort(self) {
        self.t.abort().await
    }

    /// Runs the commit protocol; returns the committed transaction, or why it aborted.
    pub async fn commit(self) -> Result<Committed, AbortReason> {
        let r = self.t.commit().await;
        if let (Ok(_), Some(a), true) = (&r, &self.armed, self.touched) {
            if a.watch.first_ns.get().is_none() {
                a.watch.first_ns.set(Some(self.ctx.now_ns()));
            }
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_kill_prefers_several_coordinators_then_one_then_gives_up() {
        let ms = Duration::from_millis;
        // Early on, one coordinator in the window is not enough; two are.
        assert_eq!(commit_moment(0, ms(10)), None);
        assert_eq!(commit_moment(1, ms(10)), None);
        assert_eq!(
            commit_moment(2, ms(10)),
            Some(CommitMoment {
                in_commit: 2,
                waited_ms: 10
            })
        );
        // Later one is.
        assert_eq!(commit_moment(0, ms(300)), None);
        assert_eq!(commit_moment(1, ms(300)).map(|m| m.in_commit), Some(1));
        // After the give-up, any moment, and it says none was in the window.
        assert_eq!(commit_moment(0, GIVE_UP).map(|m| m.in_commit), Some(0));
    }
}
