//! How application threads hand transactions to a node's threads.
//!
//! Every (node, thread) runs `coroutines` job servers: worker coroutines that take jobs
//! (a transaction's closure, its retry loop and the channel its result goes back on)
//! from their thread's queue and run them; so a thread runs up to `coroutines`
//! transactions at once, interleaved at every round trip. An idle job server waits with
//! [`ambidex_rpc::Ctx::idle`], so an idle thread parks for the runtime's whole
//! `max_wait`; queuing a job rings the doorbell of its thread's endpoint
//! ([`ambidex_rpc::Runtime::waker`]), which ends the park at once. Ringing costs a
//! fence and a load unless the thread sleeps.

use crate::error::Error;
use ambidex_transport::EndpointWaker;
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
    /// The doorbell of the thread's runtime, once its job servers run (replaced when
    /// the node restarts in process).
    waker: Option<Arc<dyn EndpointWaker>>,
}

impl Jobs {
    fn wake(&self) {
        if let Some(w) = &self.waker {
            w.wake();
        }
    }
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
        jobs.wake();
        Ok(())
    }

    /// Registers the doorbell of (node, thread)'s runtime (its job servers wait idle).
    fn set_waker(&self, node: u16, thread: u16, waker: Option<Arc<dyn EndpointWaker>>) {
        let q = self.queue(node, thread);
        q.jobs.lock().unwrap_or_else(|e| e.into_inner()).waker = waker;
    }

    /// Rings every thread's doorbell, so that idle job servers look again.
    fn wake_all(&self) {
        for q in &self.queues {
            q.jobs.lock().unwrap_or_else(|e| e.into_inner()).wake();
        }
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
        self.wake_all();
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
                // Before any job server of this thread waits (they start in order).
                shared.set_waker(w.node, w.thread, w.ctx.waker());
                shared.started.fetch_add(1, Ordering::SeqCst);
            }
            let w = Rc::new(w);
            loop {
                match shared.take(w.node, w.thread) {
                    Some(job) => job(w.clone()).await,
                    None if shared.stopping() => return,
                    None => w.ctx.idle().await,
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

#[cfg(test)]
mod tests {
    use crate::{Cluster, Config, Schema};
    use std::time::{Duration, Instant};

    /// Queuing a job rings its thread's doorbell (only its thread's), and stopping
    /// rings every thread's, so idle job servers look at their queue again.
    #[test]
    fn submitting_and_stopping_ring_the_doorbell() {
        use super::{Job, Shared};
        use ambidex_transport::EndpointWaker;
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        struct Count(AtomicUsize);
        impl EndpointWaker for Count {
            fn wake(&self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let shared = Shared::new(2, 1);
        let rings: Vec<_> = (0..2)
            .map(|_| Arc::new(Count(AtomicUsize::new(0))))
            .collect();
        for (n, r) in rings.iter().enumerate() {
            shared.set_waker(n as u16, 0, Some(r.clone()));
        }
        let job: Job = Box::new(|_| Box::pin(async {}));
        shared.submit(1, job).unwrap();
        let count = |n: usize| rings[n].0.load(Ordering::SeqCst);
        assert_eq!((count(0), count(1)), (0, 1));
        shared.stop();
        assert_eq!((count(0), count(1)), (1, 2));
    }

    /// End to end on an idle cluster (its threads parked on their doorbells): jobs
    /// queued after an idle spell run on every node, and shutdown stays prompt. (That
    /// only the doorbell ends such a park is tested in ambidex-rpc,
    /// `idle_coroutine_resumed_by_doorbell`.)
    #[test]
    fn doorbell_wakes_idle_threads() {
        let mut schema = Schema::new();
        let t = schema.table::<u64, u64>("t", 100).unwrap();
        let cluster = Cluster::local(&Config::default(), &schema).unwrap();
        std::thread::sleep(Duration::from_millis(500));
        for n in 0..cluster.nodes() {
            let t = t.clone();
            cluster
                .node(n)
                .unwrap()
                .run(async move |tx| {
                    tx.insert(&t, n as u64, &1)?;
                    Ok(())
                })
                .unwrap();
        }
        std::thread::sleep(Duration::from_millis(500));
        let s = Instant::now();
        cluster.shutdown().unwrap();
        assert!(
            s.elapsed() < Duration::from_secs(10),
            "shutdown took {:?}",
            s.elapsed()
        );
    }
}
