//! A node thread's part in a reconfiguration, driven by its run loop between runtime
//! steps ([`ThreadRecovery::due`] is a few atomic loads):
//!
//! 1. Adopt: once the thread's runtime moved to the new epoch (it fails everything of
//!    the old one; see `ambidex_rpc::epoch`), the thread forgets what belonged to the
//!    old configuration (orphaned locks, which recovery releases; cached locations)
//!    and counts itself adopted.
//! 2. Recover: at stage Recover, a coroutine replays the records the thread holds
//!    ([`super::replay`]; thread 0 first releases every lock of the old epoch, then
//!    replays the node's rings too), drops them (installed at every replica of the new
//!    configuration; thread 0 restarts the rings at the new epoch's head), and counts
//!    the thread recovered.
//!
//! 3. Copy: at stage Run, thread 0 of a primary copies its partitions to their syncing
//!    backups ([`super::rereplicate`]), in a coroutine, while transactions run.
//!
//! Transactions wait for stage Run themselves (`Txn::start`).

use super::{locks, replay, rereplicate, RecoveryStats};
use crate::TxnThread;
use ambidex_cluster::{NodeState, Stage};
use ambidex_rpc::{EpochWatch, Runtime};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

/// A node's configuration as its runtimes follow it.
pub struct NodeWatch(pub Arc<NodeState>);

impl EpochWatch for NodeWatch {
    fn epoch(&self) -> u32 {
        self.0.config.epoch()
    }
    fn members(&self) -> u64 {
        self.0.config.with(|c| c.placement.member_mask())
    }
}

/// One thread's progress through the reconfigurations.
pub struct ThreadRecovery {
    state: Arc<NodeState>,
    adopted: u32,
    /// The epoch whose recovery this thread finished (set by its coroutine).
    recovered: Rc<Cell<u32>>,
    replaying: Rc<Cell<bool>>,
    /// The epoch whose copies this thread looked for (stage Run reached).
    copies_checked: u32,
    /// Ends a copy that is still running (the run's end).
    stop_copy: Rc<Cell<bool>>,
    /// Its recovery and copy coroutines still running (see
    /// [`ThreadRecovery::background_tasks`]).
    background: Rc<Cell<usize>>,
    /// The members and their incarnations when this thread last adopted (nodes that
    /// come back in a new incarnation have their cached locations dropped).
    members: u64,
    incarnations: Vec<u64>,
    /// What its recoveries and copies did, summed.
    pub stats: Rc<RefCell<RecoveryStats>>,
}

impl ThreadRecovery {
    /// The recovery of `th`'s thread, whose runtime is `rt` (already following the
    /// node's epoch: `TxnThread::install` does it).
    pub fn new(rt: &Runtime, th: &TxnThread) -> ThreadRecovery {
        let state = th.db.cluster().clone();
        let c = state.config.load();
        // A thread that starts while its node adopts an epoch (a rejoining node
        // admitted before its threads were up) takes its part in it: it has adopted
        // nothing yet. (Later stages need every thread's adoption, so a thread cannot
        // start in them but where a test drives the stages itself.)
        let done = if state.stage() == Stage::Adopt {
            0
        } else {
            rt.epoch()
        };
        ThreadRecovery {
            members: c.placement.member_mask(),
            incarnations: c.incarnations.clone(),
            state,
            adopted: done,
            recovered: Rc::new(Cell::new(done)),
            replaying: Rc::new(Cell::new(false)),
            copies_checked: done,
            stop_copy: Rc::new(Cell::new(false)),
            background: Rc::new(Cell::new(0)),
            stats: Rc::new(RefCell::new(RecoveryStats::default())),
        }
    }

    /// Whether [`ThreadRecovery::step`] has something to do.
    #[inline]
    pub fn due(&self, rt: &Runtime) -> bool {
        rt.epoch() != self.adopted || self.recovery_due() || self.copies_due()
    }

    #[inline]
    fn recovery_due(&self) -> bool {
        self.recovered.get() != self.adopted
            && !self.replaying.get()
            && self.state.stage() == Stage::Recover
            && self.state.config.epoch() == self.adopted
    }

    /// Once per epoch, at stage Run: whether this node has copies to make.
    #[inline]
    fn copies_due(&self) -> bool {
        self.copies_checked != self.adopted
            && self.recovered.get() == self.adopted
            && self.state.stage() == Stage::Run
            && self.state.config.epoch() == self.adopted
    }

    /// Members of the node's configuration that were not, or were in another
    /// incarnation, when this thread last looked (which it notes).
    fn replaced(&mut self) -> u64 {
        let c = self.state.config.load();
        let members = c.placement.member_mask();
        let mut replaced = members & !self.members;
        for (n, &inc) in c.incarnations.iter().enumerate() {
            if members >> n & 1 == 1 && self.incarnations.get(n) != Some(&inc) {
                replaced |= 1 << n;
            }
        }
        self.members = members;
        self.incarnations.clone_from(&c.incarnations);
        replaced
    }

    /// Ends a copy still running (its coroutine returns at its next request).
    pub fn stop(&self) {
        self.stop_copy.set(true);
    }

    /// This thread's recovery and copy coroutines still running: not the workload's
    /// (a copy told to stop may still wait for its last request's answer, up to the
    /// RPC give-up time, when the run ends).
    pub fn background_tasks(&self) -> usize {
        self.background.get()
    }

    /// Adopts the runtime's new epoch, or starts this thread's recovery or copies.
    pub fn step(&mut self, rt: &mut Runtime, th: &Rc<TxnThread>) {
        let e = rt.epoch();
        if e != self.adopted {
            self.adopted = e;
            ambidex_cluster::rectrace!("node {} thread {} adopting {e}", th.node, rt.addr().thread);
            th.forget_old_epoch(e, self.replaced());
            self.state.adopted(e);
            ambidex_cluster::rectrace!("node {} thread {} adopted {e}", th.node, rt.addr().thread);
            return;
        }
        if self.copies_due() {
            self.copies_checked = e;
            self.start_copies(rt, th, e);
            return;
        }
        if !self.recovery_due() {
            return;
        }
        self.replaying.set(true);
        let (th, state) = (th.clone(), self.state.clone());
        let (recovered, replaying, stats) = (
            self.recovered.clone(),
            self.replaying.clone(),
            self.stats.clone(),
        );
        ambidex_cluster::rectrace!(
            "node {} thread {} recover start {e}",
            th.node,
            rt.addr().thread
        );
        let running = Running::start(&self.background);
        rt.spawn(move |ctx| async move {
            let _running = running;
            ctx.bind_epoch(e);
            let config = th.config();
            let rings = ctx.addr().thread == 0;
            // Every lock of the old epoch goes first: its transaction either left a
            // record, whose replays (from here and from every other member) apply by
            // version, or aborts. Released after the replays instead, a lock of an
            // aborted transaction would make a replay of an older record to the same
            // key wait for ever.
            let released = if rings {
                locks::release_old_epoch(&th.db, th.cfg.policy.lock)
            } else {
                0
            };
            ambidex_cluster::rectrace!(
                "node {} thread {} released {released}",
                th.node,
                ctx.addr().thread
            );
            // Replays are idempotent: a failed round (a replica that does not answer
            // yet) is tried again while the epoch lasts.
            let mut s = loop {
                match replay::replay(&ctx, &th, &config.placement, rings).await {
                    Ok(s) => break Some(s),
                    Err(_) if ctx.epoch() == e && !state.fenced() => {
                        stats.borrow_mut().replays_repeated += 1;
                        ctx.yield_now().await
                    }
                    Err(_) => break None,
                }
            };
            if let Some(s) = s.as_mut() {
                th.log.borrow_mut().clear();
                if rings {
                    // Replayed: the rings start again where this epoch's writers
                    // begin (before any of them can write: they wait for stage Run).
                    th.db.log_region().restart(e);
                }
                s.locks_released += released;
                stats.borrow_mut().merge(s);
                recovered.set(e);
                state.recovered(e);
                ambidex_cluster::rectrace!(
                    "node {} thread {} recovered {e} records {} writes {} repeated {}",
                    th.node,
                    ctx.addr().thread,
                    s.records,
                    s.writes_sent,
                    stats.borrow().replays_repeated
                );
            }
            replaying.set(false);
        });
    }

    /// Thread 0 of a primary of partitions with syncing backups copies them, in a
    /// coroutine (one per epoch: a copy stopped by the next epoch is redone by it).
    fn start_copies(&self, rt: &mut Runtime, th: &Rc<TxnThread>, e: u32) {
        if rt.addr().thread != 0 {
            return;
        }
        let work = rereplicate::work(&th.config().placement, th.node);
        if work.is_empty() {
            return;
        }
        let (th, stats, stop) = (th.clone(), self.stats.clone(), self.stop_copy.clone());
        let rate = th.cfg.rereplication_bytes_per_s;
        let running = Running::start(&self.background);
        rt.spawn(move |ctx| async move {
            let _running = running;
            ctx.bind_epoch(e);
            let mut s = RecoveryStats::default();
            let r = rereplicate::copy(&ctx, &th, e, &work, rate, &stop, &mut s).await;
            s.copies_unfinished += r.is_err() as u64;
            stats.borrow_mut().merge(&s);
        });
    }
}

/// Counts a background coroutine of a [`ThreadRecovery`] while it lives.
struct Running(Rc<Cell<usize>>);

impl Running {
    fn start(count: &Rc<Cell<usize>>) -> Running {
        count.set(count.get() + 1);
        Running(count.clone())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}
