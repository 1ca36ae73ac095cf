//! A handle on one node of a running cluster ([`Node`]), and how it runs an
//! application's transactions: queued to one of the node's threads, run by a job-server
//! coroutine in a retry loop (backoff on transient aborts), the result sent back.

use crate::error::Error;
use crate::retry::RetryPolicy;
use crate::service::{CatchUnwind, Job, Panic, Shared};
use crate::tx::{ReadTx, Tx};
use ambidex_txn::runner::WorkerCtx;
use ambidex_txn::Txn;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;

/// A handle on one node of a running cluster: transactions given to it run on its
/// threads, coordinated by it. Cheap to clone, and usable from any thread.
#[derive(Clone)]
pub struct Node {
    shared: Arc<Shared>,
    id: u16,
    retry: RetryPolicy,
}

/// A transaction given to a node with [`Node::spawn`] or [`Node::spawn_read`]: its
/// result, once it finished.
pub struct TxnHandle<T> {
    rx: Receiver<Result<T, Error>>,
}

impl<T> TxnHandle<T> {
    /// Waits for the transaction; its closure's value once committed, or the error.
    /// On a node's own thread (inside another transaction's closure) it cannot wait,
    /// and says so ([`Error::NotSupported`]): the thread would wait for itself.
    pub fn join(self) -> Result<T, Error> {
        if crate::service::on_node_thread() {
            return Err(Error::NotSupported(
                "waiting for a transaction inside another one (on a node's thread): \
                 run one transaction's work in one closure",
            ));
        }
        self.rx.recv().unwrap_or(Err(Error::Stopped))
    }
}

impl Node {
    pub(crate) fn new(shared: Arc<Shared>, id: u16, retry: RetryPolicy) -> Node {
        Node { shared, id, retry }
    }

    /// The node's id.
    pub fn id(&self) -> u16 {
        self.id
    }

    /// This handle with a different retry policy.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Node {
        self.retry = retry;
        self
    }

    /// Runs a read-write transaction on this node and waits for it: `f` reads and
    /// stages writes through its [`Tx`]; when it returns `Ok`, the transaction commits
    /// and `run` returns the value. An abort for a transient reason (a conflict, a
    /// timeout) runs `f` again, from the start, after a backoff (up to the retry
    /// policy's attempts: [`Error::GaveUp`]); any other error aborts the transaction and
    /// is returned. `f` may run several times, so its effects outside the transaction
    /// should be idempotent.
    ///
    /// ```no_run
    /// # use ambidex::{Cluster, Config, Schema};
    /// # let mut schema = Schema::new();
    /// # let balances = schema.table::<u64, i64>("balances", 100)?;
    /// # let cluster = Cluster::local(&Config::default(), &schema)?;
    /// let node = cluster.node(0)?;
    /// let t = balances.clone();
    /// node.run(async move |tx| {
    ///     let b = tx.get_for_update(&t, 7).await?;
    ///     tx.put(&t, 7, &(b + 100))
    /// })?;
    /// # Ok::<(), ambidex::Error>(())
    /// ```
    pub fn run<T, F>(&self, f: F) -> Result<T, Error>
    where
        F: AsyncFnMut(&mut Tx<'_>) -> Result<T, Error> + Send + 'static,
        T: Send + 'static,
    {
        self.spawn(f)?.join()
    }

    /// [`Node::run`] without waiting: the transaction is queued on one of the node's
    /// threads, which run up to `run.coroutines` transactions each at once; join the
    /// handle for its result.
    pub fn spawn<T, F>(&self, f: F) -> Result<TxnHandle<T>, Error>
    where
        F: AsyncFnMut(&mut Tx<'_>) -> Result<T, Error> + Send + 'static,
        T: Send + 'static,
    {
        self.queue(move |w, retry| {
            Box::pin(async move {
                let mut f = f;
                retrying(&w, &retry, async |w: &WorkerCtx| {
                    let mut tx = Tx::new(Txn::begin(&w.ctx, &w.th));
                    let out = CatchUnwind(Box::pin(f(&mut tx))).await;
                    finish(&mut tx, out).await
                })
                .await
            })
        })
    }

    /// Queues `run` (a transaction's retry loop) on one of the node's threads; its
    /// result comes back through the handle.
    fn queue<T, R>(&self, run: R) -> Result<TxnHandle<T>, Error>
    where
        T: Send + 'static,
        R: FnOnce(Rc<WorkerCtx>, RetryPolicy) -> Pin<Box<dyn Future<Output = Result<T, Error>>>>
            + Send
            + 'static,
    {
        let (tx, rx) = sync_channel(1);
        let retry = self.retry;
        let job: Job = Box::new(move |w: Rc<WorkerCtx>| {
            Box::pin(async move {
                let _ = tx.send(run(w, retry).await);
            })
        });
        self.shared.submit(self.id, job)?;
        Ok(TxnHandle { rx })
    }

    /// Runs a read-only transaction on this node and waits for it: every value `f`
    /// reads is of one serializable snapshot (retried as [`Node::run`] is).
    pub fn read<T, F>(&self, f: F) -> Result<T, Error>
    where
        F: AsyncFnMut(&mut ReadTx<'_>) -> Result<T, Error> + Send + 'static,
        T: Send + 'static,
    {
        self.spawn_read(f)?.join()
    }

    /// [`Node::read`] without waiting.
    pub fn spawn_read<T, F>(&self, f: F) -> Result<TxnHandle<T>, Error>
    where
        F: AsyncFnMut(&mut ReadTx<'_>) -> Result<T, Error> + Send + 'static,
        T: Send + 'static,
    {
        self.queue(move |w, retry| {
            Box::pin(async move {
                let mut f = f;
                retrying(&w, &retry, async |w: &WorkerCtx| {
                    let mut rtx = ReadTx {
                        tx: Tx::new(Txn::begin(&w.ctx, &w.th)),
                    };
                    let out = CatchUnwind(Box::pin(f(&mut rtx))).await;
                    finish(&mut rtx.tx, out).await
                })
                .await
            })
        })
    }
}

/// What one attempt's closure and commit came to.
enum Attempt<T> {
    Done(T),
    /// Aborted (the transaction is over); the error to return or retry.
    Failed(Error),
}

/// Runs attempts (`attempt`: the closure on a fresh transaction, then its commit or
/// abort) until one commits, an error is not worth a retry, or the retry policy gives
/// up; with a backoff before each retry.
async fn retrying<T>(
    w: &WorkerCtx,
    retry: &RetryPolicy,
    mut attempt: impl AsyncFnMut(&WorkerCtx) -> Attempt<T>,
) -> Result<T, Error> {
    let mut jitter = SmallRng::seed_from_u64(jitter_seed(w));
    let mut n = 1;
    loop {
        let a = attempt(w).await;
        match retried(a, n, retry) {
            Ok(v) => return v,
            Err(()) => {
                backoff(w, retry.backoff_ns(n, &mut jitter)).await;
                n += 1;
            }
        }
    }
}

/// Commits after a closure that returned `Ok`, aborts after one that failed.
async fn finish<T>(tx: &mut Tx<'_>, out: Result<Result<T, Error>, Panic>) -> Attempt<T> {
    match out {
        Ok(Ok(v)) => match tx.commit().await {
            Ok(()) => Attempt::Done(v),
            Err(e) => Attempt::Failed(e),
        },
        Ok(Err(e)) => {
            tx.abort().await;
            Attempt::Failed(e)
        }
        // The closure's future is gone mid-transaction: abort what is left of it
        // (dropping an unfinished transaction releases its locks too).
        Err(panic) => {
            tx.abort().await;
            Attempt::Failed(Error::Panicked(panic.0))
        }
    }
}

/// The result to return, or `Err(())` to retry.
fn retried<T>(a: Attempt<T>, attempt: u32, retry: &RetryPolicy) -> Result<Result<T, Error>, ()> {
    let e = match a {
        Attempt::Done(v) => return Ok(Ok(v)),
        Attempt::Failed(e) => e,
    };
    if !e.retryable() {
        return Ok(Err(e));
    }
    if attempt >= retry.max_attempts {
        return Ok(Err(match e.abort_reason() {
            Some(last) if retry.max_attempts > 1 => Error::GaveUp {
                attempts: attempt,
                last,
            },
            _ => e,
        }));
    }
    Err(())
}

async fn backoff(w: &WorkerCtx, ns: u64) {
    let until = w.ctx.now_ns() + ns;
    while w.ctx.now_ns() < until {
        w.ctx.pause().await;
    }
}

fn jitter_seed(w: &WorkerCtx) -> u64 {
    ((w.node as u64) << 48) ^ ((w.thread as u64) << 32) ^ (w.coroutine as u64) ^ w.ctx.now_ns()
}
