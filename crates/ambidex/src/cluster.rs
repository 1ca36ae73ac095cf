//! A running cluster and its nodes: [`Cluster::local`] starts every node of a cluster in
//! this process; a [`Node`] handle runs transactions on one of them.

use crate::config::Config;
use crate::error::{Error, StartError};
use crate::retry::RetryPolicy;
use crate::schema::Schema;
use crate::service::{job_server, CatchUnwind, Job, Shared};
use crate::transports::InProcess;
use crate::tx::{ReadTx, Tx};
use ambidex_txn::runner::{self, RunResult, WorkerCtx};
use ambidex_txn::{NodeDb, Txn};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Transactions each node thread runs at once by default (its job-server coroutines),
/// when the configuration's `run.coroutines` does not say.
pub const DEFAULT_COROUTINES: usize = 16;

/// How long [`Cluster::local`] waits for every node thread to start (its tables checked
/// by the other nodes) before it gives up.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A cluster whose nodes all run in this process (one OS thread per node thread), over
/// the configured transport (`local` by default; `shm` and `udp` work too, with every
/// node opened here). Dropping it shuts it down; [`Cluster::shutdown`] also says how
/// the run ended.
pub struct Cluster {
    shared: Arc<Shared>,
    runner: Option<JoinHandle<Result<RunResult, ambidex_txn::RunError>>>,
    retry: RetryPolicy,
}

/// What a cluster did, reported when it shuts down.
#[derive(Clone, Debug, Default)]
pub struct ClusterReport {
    /// Transactions committed (attempts, every node).
    pub committed: u64,
    /// Of those, read-only.
    pub read_only_committed: u64,
    /// Attempts aborted.
    pub aborted: u64,
    /// Aborted attempts per reason.
    pub aborts: BTreeMap<String, u64>,
    /// How long the cluster ran.
    pub elapsed: Duration,
    /// CPU time this process used meanwhile.
    pub cpu_seconds: f64,
}

impl Cluster {
    /// Starts every node of the cluster `config` describes in this process, with the
    /// tables of `schema` (empty), and returns once every node thread runs.
    ///
    /// `config.cluster` gives the shape (nodes, threads per node, replication) and the
    /// transport, `config.txn` the transaction policy (`fasst` by default), `config.rpc`
    /// the RPC settings, `run.coroutines` the transactions each thread runs at once.
    pub fn local(config: &Config, schema: &Schema) -> Result<Cluster, Error> {
        config.validate()?;
        let placement = config.placement()?;
        let coroutines = config.run.coroutines.unwrap_or(DEFAULT_COROUTINES);
        let mut spec = config.run_spec(coroutines, None)?;
        spec.duration = None;
        let udp = config.rpc.udp_options()?;
        let transports =
            InProcess::open_with(&config.cluster, udp).map_err(StartError::Transport)?;
        let specs = schema.specs(&placement);
        let dbs: Vec<Arc<NodeDb>> = transports
            .nodes
            .iter()
            .map(|t| NodeDb::new(&**t, placement.clone(), &specs))
            .collect::<Result<_, _>>()?;
        let cat = NodeDb::catalog_of(&dbs)?;
        for db in &dbs {
            db.set_catalog(cat.clone())?;
        }
        let shared = Arc::new(Shared::new(config.cluster.nodes, config.cluster.threads));
        let worker = job_server(shared.clone());
        let runner = std::thread::Builder::new()
            .name("ambidex-cluster".into())
            .spawn(move || {
                let r = runner::run(&transports.nodes, &dbs, &spec, worker);
                drop(transports);
                r
            })
            .map_err(StartError::Spawn)?;
        let mut cluster = Cluster {
            shared,
            runner: Some(runner),
            retry: RetryPolicy::default(),
        };
        cluster.wait_started()?;
        Ok(cluster)
    }

    /// Waits until every node thread's job servers run; the run's error if it ended.
    fn wait_started(&mut self) -> Result<(), Error> {
        let want = self.shared.nodes as usize * self.shared.threads as usize;
        let t0 = Instant::now();
        while self.shared.started() < want {
            let ended = self.runner.as_ref().is_none_or(|h| h.is_finished());
            if ended || t0.elapsed() > START_TIMEOUT {
                let started = self.shared.started();
                return Err(match self.finish() {
                    Err(e) => StartError::Ended(Box::new(e)),
                    Ok(_) if ended => StartError::Ended(Box::new(Error::Stopped)),
                    Ok(_) => StartError::TimedOut {
                        started,
                        want,
                        after: START_TIMEOUT,
                    },
                }
                .into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// The cluster's nodes.
    pub fn nodes(&self) -> u16 {
        self.shared.nodes
    }

    /// A handle on node `id`, which runs the transactions given to it with this
    /// cluster's retry policy ([`Cluster::set_retry`]).
    pub fn node(&self, id: u16) -> Result<Node, Error> {
        if id >= self.shared.nodes {
            return Err(Error::NoSuchNode {
                node: id,
                nodes: self.shared.nodes,
            });
        }
        Ok(Node {
            shared: self.shared.clone(),
            id,
            retry: self.retry,
        })
    }

    /// Sets how the nodes handed out from now on retry aborted transactions.
    pub fn set_retry(&mut self, retry: RetryPolicy) {
        self.retry = retry;
    }

    /// Stops the cluster: the transactions queued run first, new ones get
    /// [`Error::Stopped`]. Returns what the cluster did, or why it failed.
    pub fn shutdown(mut self) -> Result<ClusterReport, Error> {
        self.finish()
    }

    fn finish(&mut self) -> Result<ClusterReport, Error> {
        self.shared.stop();
        let Some(h) = self.runner.take() else {
            return Err(Error::Stopped);
        };
        let r = h.join();
        self.shared.close();
        let r = r.map_err(|_| Error::ClusterPanicked)??;
        let mut aborts = BTreeMap::new();
        for (k, v) in &r.txn.aborts {
            aborts.insert(k.to_string(), *v);
        }
        Ok(ClusterReport {
            committed: r.txn.committed,
            read_only_committed: r.txn.read_only_committed,
            aborted: r.txn.aborted,
            aborts,
            elapsed: r.elapsed,
            cpu_seconds: r.cpu_seconds,
        })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.runner.is_some() {
            let _ = self.finish();
        }
    }
}

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
    pub fn join(self) -> Result<T, Error> {
        self.rx.recv().unwrap_or(Err(Error::Stopped))
    }
}

impl Node {
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
        let (tx, rx) = sync_channel(1);
        let retry = self.retry;
        let job: Job = Box::new(move |w: Rc<WorkerCtx>| {
            Box::pin(async move {
                let mut f = f;
                let r = read_write(&w, &mut f, &retry).await;
                let _ = tx.send(r);
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
        let (tx, rx) = sync_channel(1);
        let retry = self.retry;
        let job: Job = Box::new(move |w: Rc<WorkerCtx>| {
            Box::pin(async move {
                let mut f = f;
                let r = read_only(&w, &mut f, &retry).await;
                let _ = tx.send(r);
            })
        });
        self.shared.submit(self.id, job)?;
        Ok(TxnHandle { rx })
    }
}

/// What one attempt's closure and commit came to.
enum Attempt<T> {
    Done(T),
    /// Aborted (the transaction is over); the error to return or retry.
    Failed(Error),
}

/// Runs `f` in read-write transactions until one commits, an error is not worth a
/// retry, or the retry policy gives up.
async fn read_write<T, F>(
    w: &WorkerCtx,
    f: &mut F,
    retry: &RetryPolicy,
) -> Result<T, Error>
where
    F: AsyncFnMut(&mut Tx<'_>) -> Result<T, Error>,
{
    let mut jitter = SmallRng::seed_from_u64(jitter_seed(w));
    let mut attempt = 1;
    loop {
        let mut tx = Tx::new(Txn::begin(&w.ctx, &w.th));
        let out = CatchUnwind(Box::pin(f(&mut tx))).await;
        let a = finish(&mut tx, out).await;
        match retried(a, attempt, retry) {
            Ok(v) => return v,
            Err(()) => {
                backoff(w, retry.backoff_ns(attempt, &mut jitter)).await;
                attempt += 1;
            }
        }
    }
}

/// [`read_write`] for read-only transactions.
async fn read_only<T, F>(
    w: &WorkerCtx,
    f: &mut F,
    retry: &RetryPolicy,
) -> Result<T, Error>
where
    F: AsyncFnMut(&mut ReadTx<'_>) -> Result<T, Error>,
{
    let mut jitter = SmallRng::seed_from_u64(jitter_seed(w));
    let mut attempt = 1;
    loop {
        let mut rtx = ReadTx {
            tx: Tx::new(Txn::begin(&w.ctx, &w.th)),
        };
        let out = CatchUnwind(Box::pin(f(&mut rtx))).await;
        let a = finish(&mut rtx.tx, out).await;
        match retried(a, attempt, retry) {
            Ok(v) => return v,
            Err(()) => {
                backoff(w, retry.backoff_ns(attempt, &mut jitter)).await;
                attempt += 1;
            }
        }
    }
}

/// Commits after a closure that returned `Ok`, aborts after one that failed.
async fn finish<T>(tx: &mut Tx<'_>, out: Result<Result<T, Error>, String>) -> Attempt<T> {
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
            Attempt::Failed(Error::Panicked(panic))
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
