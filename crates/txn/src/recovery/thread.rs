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
//! Transactions wait for stage Run themselves (`Txn::start`).

use super::{locks, replay, RecoveryStats};
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
    /// What its recoveries did, summed.
    pub stats: Rc<RefCell<RecoveryStats>>,
}

impl ThreadRecovery {
    /// The recovery of `th`'s thread, whose runtime is `rt` (already following the
    /// node's epoch: `TxnThread::install` does it).
    pub fn new(rt: &Runtime, th: &TxnThread) -> ThreadRecovery {
        ThreadRecovery {
            state: th.db.cluster().clone(),
            adopted: rt.epoch(),
            recovered: Rc::new(Cell::new(rt.epoch())),
            replaying: Rc::new(Cell::new(false)),
            stats: Rc::new(RefCell::new(RecoveryStats::default())),
        }
    }

    /// Whether [`ThreadRecovery::step`] has something to do.
    #[inline]
    pub fn due(&self, rt: &Runtime) -> bool {
        rt.epoch() != self.adopted
            || (self.recovered.get() != self.adopted
                && !self.replaying.get()
                && self.state.stage() == Stage::Recover
                && self.state.config.epoch() == self.adopted)
    }

    /// Adopts the runtime's new epoch, or starts this thread's recovery.
    pub fn step(&mut self, rt: &mut Runtime, th: &Rc<TxnThread>) {
        let e = rt.epoch();
        if e != self.adopted {
            self.adopted = e;
            th.forget_old_epoch(e);
            self.state.adopted(e);
            return;
        }
        if !self.due(rt) {
            return;
        }
        self.replaying.set(true);
        let (th, state) = (th.clone(), self.state.clone());
        let (recovered, replaying, stats) = (
            self.recovered.clone(),
            self.replaying.clone(),
            self.stats.clone(),
        );
        rt.spawn(move |ctx| async move {
            ctx.bind_epoch(e);
            let config = th.config();
            let rings = ctx.addr().thread == 0;
            // Every lock of the old epoch goes first: its transaction either left a
            // record, whose replays (from here and from every other member) apply by
            // version, or aborts. Released after the replays instead, a lock of an
            // aborted transaction would make a replay of an older record to the same
            // key wait for ever.
            let released = if rings { locks::release_all(&th.db) } else { 0 };
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
            }
            replaying.set(false);
        });
    }
}
