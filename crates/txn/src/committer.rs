//! The committers: with passive ACK (DrTM+H §3.2), a transaction returns once its log
//! is complete and its installation ([`CommitJob`]) is finished here, off its critical
//! path, by one of its thread's committer coroutines (as many as workers). A job is
//! handed over only if a committer is idle; otherwise the transaction installs it
//! itself, so jobs never queue.
//!
//! A committer runs a job's steps as the transaction would: backups, every
//! acknowledgement awaited, then primaries, so a job still takes backups-then-primaries
//! in order. A one-sided install's data WRITEs are unsignaled and confirmed by the
//! signaled release CAS behind them on the same queue (passive ACK); the release itself
//! is signaled so that its result is checked. Every acknowledgement is checked: a job
//! that misses one is counted as `committed_incomplete`, its log record is kept for
//! recovery and its lock slot retired; a complete one's record is truncated. The job's
//! buffers go back to the thread.
//!
//! Locks stay held until the primaries' step, so no transaction can read a key of a
//! job between its commit and its installation: a transaction that began after another
//! returned still sees its writes (or a lock, and retries).

use crate::phases::commit::CommitJob;
use crate::TxnThread;
use ambidex_rpc::{Ctx, RpcError};
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

/// The committers' queue, on their thread.
#[derive(Default)]
pub(crate) struct CommitQueue {
    jobs: std::collections::VecDeque<CommitJob>,
    /// Committers waiting for a job.
    waiting: Vec<Waker>,
    /// Jobs taken by a committer and not finished.
    in_flight: usize,
    /// Workers of the thread still running (the committers end when none is and every
    /// job is finished).
    pub live_workers: usize,
    /// Committers spawned on this thread.
    pub running: usize,
    /// Per coroutine: its jobs queued or being installed, and its waker while it waits
    /// for them ([`own_jobs_done`]).
    of_worker: Vec<(u32, Option<Waker>)>,
}

impl CommitQueue {
    pub fn push(&mut self, job: CommitJob) {
        let w = job.worker as usize;
        if self.of_worker.len() <= w {
            self.of_worker.resize_with(w + 1, Default::default);
        }
        self.of_worker[w].0 += 1;
        self.jobs.push_back(job);
        if let Some(w) = self.waiting.pop() {
            w.wake();
        }
    }

    /// Wakes every waiting committer (to see that the workers are done).
    pub fn wake_all(&mut self) {
        for w in self.waiting.drain(..) {
            w.wake();
        }
    }

    /// Whether a committer is free to take one more job at once. A transaction hands
    /// its job over only then, and otherwise installs it itself: jobs never pile up
    /// (they hold their locks and log records until installed), so a thread that
    /// commits faster than its committers install is slowed to their pace.
    pub fn has_idle(&self) -> bool {
        self.waiting.len() > self.jobs.len()
    }

    /// Jobs queued or being installed.
    pub fn pending(&self) -> usize {
        self.jobs.len() + self.in_flight
    }
}

/// Resolves with the next job, or `None` once every worker is done and nothing is
/// left.
struct NextJob<'a> {
    queue: &'a RefCell<CommitQueue>,
}

impl Future for NextJob<'_> {
    type Output = Option<CommitJob>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<CommitJob>> {
        let mut q = self.queue.borrow_mut();
        if let Some(job) = q.jobs.pop_front() {
            q.in_flight += 1;
            return Poll::Ready(Some(job));
        }
        if q.live_workers == 0 {
            return Poll::Ready(None);
        }
        q.waiting.push(cx.waker().clone());
        Poll::Pending
    }
}

/// Resolves once every job of coroutine `worker` is finished.
pub(crate) fn own_jobs_done(th: &TxnThread, worker: u16) -> OwnJobsDone<'_> {
    OwnJobsDone { th, worker }
}

pub(crate) struct OwnJobsDone<'a> {
    th: &'a TxnThread,
    worker: u16,
}

impl Future for OwnJobsDone<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut q = self.th.committer.borrow_mut();
        match q.of_worker.get_mut(self.worker as usize) {
            Some((n, waker)) if *n > 0 => {
                *waker = Some(cx.waker().clone());
                Poll::Pending
            }
            _ => Poll::Ready(()),
        }
    }
}

/// A committer coroutine of `th`'s thread.
pub(crate) async fn run(ctx: Ctx, th: Rc<TxnThread>) {
    while let Some(mut job) = (NextJob {
        queue: &th.committer,
    })
    .await
    {
        // Nothing of a job is sent once the cluster moved on: recovery installs it.
        ctx.bind_epoch(job.config.epoch);
        for primaries in [false, true] {
            if primaries && !job.ok {
                // A backup may not hold the writes: the primaries keep their locks, for
                // recovery (see `phases::commit`).
                break;
            }
            let _in_phase = crate::InPhase::new(
                &th,
                if primaries {
                    crate::Phase::CommitPrimary
                } else {
                    crate::Phase::CommitBackup
                },
            );
            let mut work = job.work();
            if work.queue_step(&ctx, &th, primaries) {
                let flushed = match ctx.flush().await {
                    Ok(()) => true,
                    Err(RpcError::UnsignaledFailed(v)) => {
                        // The job checks its own operations below; these are counted.
                        th.stats.borrow_mut().onesided_unsignaled_failures += v.len() as u64;
                        true
                    }
                    Err(_) => false,
                };
                job.work().check_step(&ctx, flushed, primaries);
            } else if primaries {
                work.check_step(&ctx, true, primaries);
            }
        }
        finish(&th, job);
    }
}

/// A job is done: its log record truncated if it is installed everywhere, else counted
/// (recovery finishes it from the log); its slot and buffers go back to the thread.
fn finish(th: &TxnThread, job: CommitJob) {
    if job.ok {
        th.truncate_later(job.id);
    } else {
        th.stats.borrow_mut().committed_incomplete += 1;
    }
    // An incomplete install may leave a lock naming the slot: it is retired.
    if job.own_slot && job.ok {
        th.give_slot(job.owner);
    }
    {
        let mut q = th.committer.borrow_mut();
        q.in_flight -= 1;
        if let Some((n, waker)) = q.of_worker.get_mut(job.worker as usize) {
            *n -= 1;
            if *n == 0 {
                if let Some(w) = waker.take() {
                    w.wake();
                }
            }
        }
    }
    th.recycle(job.bufs, job.items);
}
