//! Worker coroutines: spawning, the [`Ctx`] a worker reaches its runtime through, and
//! the futures it awaits ([`Flush`], [`YieldNow`]). The RPC path needs no wakers: the
//! master queues a worker directly once its batch is in. Wakers exist for foreign
//! futures a worker may await; waking one marks the task for the next step.

use super::batch::{ReqHandle, WorkerBatch};
use super::{Core, Runtime};
use crate::config::RpcError;
use ambidex_transport::{ClusterConfig, EndpointAddr, NodeId};
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

pub(crate) type Task = Pin<Box<dyn Future<Output = ()>>>;

/// Marks a task for polling when a foreign future wakes it.
pub(crate) struct TaskWake {
    pub flag: AtomicBool,
    any: Arc<AtomicBool>,
}

impl Wake for TaskWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.flag.store(true, Ordering::Release);
        self.any.store(true, Ordering::Release);
    }
}

/// The executor's tasks, indexed by worker id.
pub(crate) struct Tasks {
    pub tasks: Vec<Option<Task>>,
    pub wakes: Vec<Arc<TaskWake>>,
    pub wakers: Vec<Waker>,
    /// Some task was woken by a foreign future since the last step.
    pub any_woken: Arc<AtomicBool>,
    /// Tasks not finished yet.
    pub live: usize,
}

impl Tasks {
    pub fn new() -> Tasks {
        Tasks {
            tasks: Vec::new(),
            wakes: Vec::new(),
            wakers: Vec::new(),
            any_woken: Arc::new(AtomicBool::new(false)),
            live: 0,
        }
    }

    /// Adds the tasks woken by foreign futures to `run`; whether there were any.
    #[inline]
    pub fn take_woken(&mut self, run: &mut Vec<u16>) -> bool {
        if !(self.any_woken.load(Ordering::Relaxed)
            && self.any_woken.swap(false, Ordering::Acquire))
        {
            return false;
        }
        for (i, w) in self.wakes.iter().enumerate() {
            if w.flag.swap(false, Ordering::Acquire) {
                run.push(i as u16);
            }
        }
        true
    }

    /// Polls task `id` once.
    #[inline(always)]
    pub fn resume(&mut self, id: usize) {
        if let Some(task) = self.tasks[id].as_mut() {
            let mut cx = Context::from_waker(&self.wakers[id]);
            if task.as_mut().poll(&mut cx).is_ready() {
                self.tasks[id] = None;
                self.live -= 1;
            }
        }
    }
}

impl Runtime {
    /// Spawns a worker coroutine; it first runs at the next step.
    pub fn spawn<F, Fut>(&mut self, f: F)
    where
        F: FnOnce(Ctx) -> Fut,
        Fut: Future<Output = ()> + 'static,
    {
        let t = &mut self.tasks;
        let id = t.tasks.len();
        assert!(id < u16::MAX as usize, "too many coroutines");
        let ctx = Ctx {
            core: self.core.clone(),
            id: id as u16,
        };
        t.tasks.push(Some(Box::pin(f(ctx))));
        let w = Arc::new(TaskWake {
            flag: AtomicBool::new(false),
            any: t.any_woken.clone(),
        });
        t.wakers.push(Waker::from(w.clone()));
        t.wakes.push(w);
        t.live += 1;
        let mut core = self.core.borrow_mut();
        core.st.workers.batches.push(WorkerBatch::new());
        core.st.workers.make_ready(id as u16);
    }
}

/// A worker coroutine's handle on its runtime.
#[derive(Clone)]
pub struct Ctx {
    pub(crate) core: Rc<RefCell<Core>>,
    pub(crate) id: u16,
}

impl Ctx {
    /// Queues a request to `node` (thread chosen by the [`ThreadMap`](crate::ThreadMap))
    /// without I/O.
    #[inline]
    pub fn queue(&self, node: NodeId, rtype: u8, payload: &[u8]) -> Result<ReqHandle, RpcError> {
        let mut core = self.core.borrow_mut();
        let st = &mut core.st;
        // The thread is valid for every node (checked when the runtime was built).
        if node >= st.cluster.nodes {
            return Err(RpcError::UnknownDestination(EndpointAddr::new(
                node,
                st.queue_thread,
            )));
        }
        let d = node as usize * st.threads + st.queue_thread as usize;
        st.queue_index(self.id, node, d, rtype, payload)
    }

    /// Queues a request to an explicit endpoint (credits assume the
    /// [`ThreadMap`](crate::ThreadMap)).
    pub fn queue_to(
        &self,
        addr: EndpointAddr,
        rtype: u8,
        payload: &[u8],
    ) -> Result<ReqHandle, RpcError> {
        let mut core = self.core.borrow_mut();
        let st = &mut core.st;
        if !st.cluster.contains(addr) {
            return Err(RpcError::UnknownDestination(addr));
        }
        let d = st.ep_index(addr);
        st.queue_index(self.id, addr.node, d, rtype, payload)
    }

    /// Sends the queued batch with one doorbell and resolves when every response (or
    /// failure) is in. `Err(Timeout)` if some destination was suspected.
    pub fn flush(&self) -> Flush<'_> {
        Flush { ctx: self }
    }

    /// Runs `f` on the response to `h` (valid until the next `queue`).
    pub fn response<R>(&self, h: ReqHandle, f: impl FnOnce(&[u8]) -> R) -> Result<R, RpcError> {
        let core = self.core.borrow();
        let st = &core.st;
        st.workers.batches[self.id as usize]
            .response(h, st.threads)
            .map(f)
    }

    /// Yields to the master once (the coroutine is resumed at the next step).
    pub fn yield_now(&self) -> YieldNow<'_> {
        YieldNow {
            ctx: self,
            yielded: false,
        }
    }

    /// Waits for a condition nothing here signals (the node's stage, another thread's
    /// progress): resumed at the next step that reads the clock (one with work, every
    /// few idle polls, or after a park), and its resumption is not work for the idle
    /// policy, so a thread whose coroutines all wait like this spins briefly, yields,
    /// then parks (for at most `PAUSE_PARK`, 200 µs, at a time)
    /// instead of polling flat out. Work that another thread can ring for should use
    /// [`Ctx::idle`], which lets the thread park longer. With [`Ctx::yield_now`] in such a loop, every
    /// step has work: on a host with more polling threads than cores, the threads that
    /// wait then take the cores from the ones they wait for.
    pub fn pause(&self) -> Pause<'_> {
        Pause {
            ctx: self,
            paused: false,
        }
    }

    /// Waits for work from outside the runtime that the waiter rings the runtime's
    /// doorbell for ([`Runtime::waker`]), for example an application thread's job queue:
    /// as [`Ctx::pause`] (resumed at the next step that reads the clock, which includes
    /// the first step after any park, and not work), except that the runtime may park
    /// for its full `max_wait` (or until a retransmission is due) while every coroutine
    /// waits like this. A condition nobody rings for needs `pause` instead. On an
    /// endpoint without a doorbell this is `pause`.
    pub fn idle(&self) -> Idle<'_> {
        Idle {
            ctx: self,
            idle: false,
        }
    }

    /// The endpoint's doorbell (see [`Runtime::waker`]).
    pub fn waker(&self) -> Option<Arc<dyn ambidex_transport::EndpointWaker>> {
        self.core.borrow().ep.waker()
    }

    /// The runtime's clock.
    pub fn now_ns(&self) -> u64 {
        self.core.borrow().st.clock.now_ns()
    }

    /// The time the runtime read at the start of the current master step: no clock read,
    /// and within one step of [`Ctx::now_ns`] for a coroutine the step resumed (a step
    /// that resumes coroutines always reads the clock). For per-transaction timings,
    /// where a clock read per phase would cost more than the phase's bookkeeping.
    #[inline]
    pub fn step_ns(&self) -> u64 {
        self.core.borrow().st.now
    }

    pub fn addr(&self) -> EndpointAddr {
        self.core.borrow().st.me
    }

    pub fn cluster(&self) -> ClusterConfig {
        self.core.borrow().st.cluster.clone()
    }

    /// The epoch the runtime sends in now (see [`crate::Runtime::follow`]).
    #[inline]
    pub fn epoch(&self) -> u32 {
        self.core.borrow().st.epoch
    }

    /// Binds this coroutine's next batches to `epoch` (0: unbound, the runtime's): a
    /// transaction binds its coroutine to the epoch it began in, so that nothing it
    /// queues after the cluster moved on is ever sent (its flush fails with
    /// `EpochChanged`), whenever it queues it.
    #[inline]
    pub fn bind_epoch(&self, epoch: u32) {
        self.core.borrow_mut().st.workers.batches[self.id as usize].bound = epoch;
    }

    /// [`Ctx::bind_epoch`] if the runtime is in `epoch` now; returns whether it is (one
    /// borrow of the runtime for both, on a transaction's start).
    #[inline]
    pub fn bind_current_epoch(&self, epoch: u32) -> bool {
        let mut core = self.core.borrow_mut();
        let st = &mut core.st;
        if st.epoch != epoch {
            return false;
        }
        st.workers.batches[self.id as usize].bound = epoch;
        true
    }

    /// This coroutine's index in its runtime.
    pub fn id(&self) -> u16 {
        self.id
    }
}

/// Future of [`Ctx::flush`].
pub struct Flush<'a> {
    ctx: &'a Ctx,
}

impl Future for Flush<'_> {
    type Output = Result<(), RpcError>;
    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.ctx.core.borrow_mut().st.flush_poll(self.ctx.id)
    }
}

/// Future of [`Ctx::pause`].
pub struct Pause<'a> {
    ctx: &'a Ctx,
    paused: bool,
}

impl Future for Pause<'_> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        if self.paused {
            return Poll::Ready(());
        }
        self.paused = true;
        let workers = &mut self.ctx.core.borrow_mut().st.workers;
        workers.paused.push(self.ctx.id);
        workers.pausing += 1;
        Poll::Pending
    }
}

/// Future of [`Ctx::idle`].
pub struct Idle<'a> {
    ctx: &'a Ctx,
    idle: bool,
}

impl Future for Idle<'_> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        if self.idle {
            return Poll::Ready(());
        }
        self.idle = true;
        self.ctx
            .core
            .borrow_mut()
            .st
            .workers
            .paused
            .push(self.ctx.id);
        Poll::Pending
    }
}

/// Future of [`Ctx::yield_now`].
pub struct YieldNow<'a> {
    ctx: &'a Ctx,
    yielded: bool,
}

impl Future for YieldNow<'_> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        if self.yielded {
            return Poll::Ready(());
        }
        self.yielded = true;
        self.ctx
            .core
            .borrow_mut()
            .st
            .workers
            .make_ready(self.ctx.id);
        Poll::Pending
    }
}
