//! The committer: with passive ACK (DrTM+H §3.2), a transaction returns once its log is
//! complete and its installation ([`CommitJob`]) is finished here, off its critical
//! path, by one coroutine per thread.
//!
//! Each round trip of the committer carries the primaries' step of the jobs whose
//! backups were acknowledged in the previous one and the backups' step of the jobs that
//! arrived since, so a job still takes backups-then-primaries in order, while many jobs
//! share each doorbell. A one-sided install's data WRITEs are unsignaled and confirmed
//! by the signaled release CAS behind them on the same queue (passive ACK); the
//! release itself is signaled so that its result is checked. Every acknowledgement is
//! checked: a job that misses one is counted as
//! `committed_incomplete` and its log record is kept for recovery; a complete one's
//! record is truncated. The job's lock slot and buffers go back to the thread.
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

/// The committer's queue, on its thread.
#[derive(Default)]
pub(crate) struct CommitQueue {
    jobs: Vec<CommitJob>,
    waker: Option<Waker>,
    /// Jobs taken by the committer and not finished.
    in_flight: usize,
    /// Workers of the thread still running (the committer ends when none is and every
    /// job is finished).
    pub live_workers: usize,
    /// A committer was spawned on this thread.
    pub running: bool,
}

impl CommitQueue {
    pub fn push(&mut self, job: CommitJob) {
        self.jobs.push(job);
        self.wake();
    }

    pub fn wake(&mut self) {
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    /// Jobs queued or being installed.
    pub fn pending(&self) -> usize {
        self.jobs.len() + self.in_flight
    }
}

/// Resolves with the queued jobs (moved into `into`): at once if there are any or
/// `busy`, else when a worker queues one; `false` once every worker is done and
/// nothing is left.
struct NextJobs<'a> {
    queue: &'a RefCell<CommitQueue>,
    into: &'a mut Vec<CommitJob>,
    busy: bool,
}

impl Future for NextJobs<'_> {
    type Output = bool;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<bool> {
        let me = self.get_mut();
        let mut q = me.queue.borrow_mut();
        if !q.jobs.is_empty() || me.busy {
            q.in_flight += q.jobs.len();
            me.into.append(&mut q.jobs);
            return Poll::Ready(true);
        }
        if q.live_workers == 0 && q.in_flight == 0 {
            return Poll::Ready(false);
        }
        q.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// The committer coroutine of `th`'s thread.
pub(crate) async fn run(ctx: Ctx, th: Rc<TxnThread>) {
    let mut fresh: Vec<CommitJob> = Vec::new();
    let mut backed: Vec<CommitJob> = Vec::new();
    loop {
        let more = NextJobs {
            queue: &th.committer,
            into: &mut fresh,
            busy: !backed.is_empty(),
        }
        .await;
        if !more {
            break;
        }
        let mut any = false;
        for job in &mut backed {
            any |= job.work().queue_step(&ctx, &th, true);
        }
        for job in &mut fresh {
            any |= job.work().queue_step(&ctx, &th, false);
        }
        let flushed = !any
            || match ctx.flush().await {
                Ok(()) => true,
                Err(RpcError::UnsignaledFailed(v)) => {
                    // Each job checks its own operations below; these are counted.
                    th.stats.borrow_mut().onesided_unsignaled_failures += v.len() as u64;
                    true
                }
                Err(_) => false,
            };
        for mut job in backed.drain(..) {
            job.work().check_step(&ctx, flushed, true);
            finish(&th, job);
        }
        for mut job in fresh.drain(..) {
            job.work().check_step(&ctx, flushed, false);
            backed.push(job);
        }
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
    th.committer.borrow_mut().in_flight -= 1;
    th.recycle(job.bufs, job.items);
}
