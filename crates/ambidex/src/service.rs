//! How application threads hand transactions to a node's threads.
//!
//! Every (node, thread) runs `coroutines` job servers: worker coroutines that take jobs
//! (a transaction's closure, its retry loop and the channel its result goes back on)
//! from their thread's queue and run them; so a thread runs up to `coroutines`
//! transactions at once, interleaved at every round trip. An idle job server pauses
//! ([`ambidex_rpc::Ctx::pause`]): its thread then parks for at most 200 µs at a time,
//! which bounds how late it sees a new job (not a wake-up per job: the queue has no
//! doorbell into the transport's park).

use crate::error::Error;
use ambidex_txn::runner::{Worker, WorkerCtx};
use std::collections::VecDeque;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

/// A transaction to run on some coroutine of a node's thread.
pub(crate) type Job = Box<dyn FnOnce(Rc<WorkerCtx>) -> Pin<Box<dyn Future<Output = ()>>> + Send>;

/// One (node, thread)'s queue of jobs.
#[derive(Default)]
struct Queue {
    jobs: Mutex<Jobs>,
    /// Jobs queued (read without the lock by idle job servers).
    len: AtomicUsize,
}

#[derive(Default)]
struct Jobs {
    q: VecDeque<Job>,
    /// No job is taken any more: the cluster stopped.
    closed: bool,
}

/// What the application's handles and the job servers share.
pub(crate) struct Shared {
    pub(crate) nodes: u16,
    pub(crate) threads: u16,
    queues: Vec<Queue>,
    /// Round-robin over a node's threads, per node.
    next: Vec<AtomicUsize>,
    /// Shutting down: job servers return once their queue is empty.
    stopping: AtomicBool,
    /// Threads whose job servers run (the start-up check passed).
    started: AtomicUsize,
}

impl Shared {
    pub(crate) fn new(nodes: u16, threads: u16) -> Shared {
        let n = nodes as usize * threads as usize;
        Shared {
            nodes,
            threads,
            queues: (0..n).map(|_| Queue::default()).collect(),
            next: (0..nodes).map(|_| AtomicUsize::new(0)).collect(),
            stopping: AtomicBool::new(false),
            started: AtomicUsize::new(0),
        }
    }

    fn queue(&self, node: u16, thread: u16) -> &Queue {
        &self.queues[node as usize * self.threads as usize + thread as usize]
    }

    /// Queues `job` on one of `node`'s threads (in turn).
    pub(crate) fn submit(&self, node: u16, job: Job) -> Result<(), Error> {
        if node >= self.nodes {
            return Err(Error::NoSuchNode {
                node,
                nodes: self.nodes,
            });
        }
        if self.stopping.load(Ordering::SeqCst) {
            return Err(Error::Stopped);
        }
        let t = self.next[node as usize].fetch_add(1, Ordering::Relaxed) % self.threads as usize;
        let q = self.queue(node, t as u16);
        let mut jobs = q.jobs.lock().unwrap_or_else(|e| e.into_inner());
        if jobs.closed {
            return Err(Error::Stopped);
        }
        jobs.q.push_back(job);
        q.len.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn take(&self, node: u16, thread: u16) -> Option<Job> {
        let q = self.queue(node, thread);
        if q.len.load(Ordering::SeqCst) == 0 {
            return None;
        }
        let mut jobs = q.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let j = jobs.q.pop_front()?;
        q.len.fetch_sub(1, Ordering::SeqCst);
        Some(j)
    }

    /// Job servers finish the jobs queued, then return.
    pub(crate) fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Threads whose job servers run.
    pub(crate) fn started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }

    /// Closes every queue and drops the jobs left (their callers get
    /// [`Error::Stopped`]): once no job server runs.
    pub(crate) fn close(&self) {
        self.stop();
        for q in &self.queues {
            let dropped = {
                let mut jobs = q.jobs.lock().unwrap_or_else(|e| e.into_inner());
                jobs.closed = true;
                q.len.store(0, Ordering::SeqCst);
                std::mem::take(&mut jobs.q)
            };
            drop(dropped);
        }
    }
}

thread_local! {
    /// Set on a node's threads: waiting there for a transaction would stop the very
    /// thread that has to run it.
    static NODE_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// True on a node's own threads (inside a transaction's closure, for instance).
pub(crate) fn on_node_thread() -> bool {
    NODE_THREAD.with(|f| f.get())
}

/// The worker every coroutine of every node thread runs: jobs from its thread's queue
/// until the cluster stops and the queue is empty.
pub(crate) fn job_server(shared: Arc<Shared>) -> Worker {
    Arc::new(move |w: WorkerCtx| {
        let shared = shared.clone();
        Box::pin(async move {
            if w.coroutine == 0 {
                NODE_THREAD.with(|f| f.set(true));
                shared.started.fetch_add(1, Ordering::SeqCst);
            }
            let w = Rc::new(w);
            loop {
                match shared.take(w.node, w.thread) {
                    Some(job) => job(w.clone()).await,
                    None if shared.stopping() => return,
                    None => w.ctx.pause().await,
                }
            }
        })
    })
}

/// A future that turns a panic while polling `0` into `Err(Panic)`, so an
/// application's closure that panics fails its own transaction, not the node's thread.
pub(crate) struct CatchUnwind<'f, T>(pub(crate) Pin<Box<dyn Future<Output = T> + 'f>>);

/// A closure's panic, by its message.
pub(crate) struct Panic(pub(crate) String);

impl<T> Future for CatchUnwind<'_, T> {
    type Output = Result<T, Panic>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let f = &mut self.0;
        match std::panic::catch_unwind(AssertUnwindSafe(|| f.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Err(p) => Poll::Ready(Err(Panic(panic_message(&*p)))),
        }
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".into()
    }
}
