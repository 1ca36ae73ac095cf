//! A running cluster and its nodes: [`Cluster::local`] starts every node of a cluster in
//! this process; a [`Node`] handle runs transactions on one of them.

use crate::config::Config;
use crate::error::{Error, StartError};
use crate::node::Node;
use crate::retry::RetryPolicy;
use crate::schema::Schema;
use crate::service::{job_server, Shared};
use crate::transports::InProcess;
use ambidex_txn::runner::{self, RunResult};
use ambidex_txn::NodeDb;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Transactions each node thread runs at once by default (its job-server coroutines),
/// when the configuration's `run.coroutines` does not say.
pub const DEFAULT_COROUTINES: usize = 16;

/// How long [`Cluster::local`] waits for every node thread to start (its tables checked
/// by the other nodes) before it gives up.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A cluster whose nodes all run in this process (one OS thread per node thread), over
/// the configured transport (`local` by default; `shm` and `udp` work too, with every
/// node opened here). Dropping it shuts it down; [`Cluster::shutdown`] also says how
/// the run ended.
pub struct Cluster {
    shared: Arc<Shared>,
    runner: Option<JoinHandle<Result<RunResult, ambidex_txn::RunError>>>,
    retry: RetryPolicy,
}

/// What a cluster (or a node: [`NodeProcess::shutdown`](crate::NodeProcess::shutdown))
/// did, reported when it shuts down.
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
    /// One-sided operations (READ, WRITE, CAS, FAA) the nodes' endpoints posted: the
    /// one-sided phases' and the start-up check's (0 under an RPC-only policy but for
    /// the check).
    pub onesided_posted: u64,
    /// Commit records the coordinators WROTE one-sided into other nodes' log rings
    /// (policies with `log = "write"`).
    pub log_records_written: u64,
}

impl ClusterReport {
    pub(crate) fn new(
        txn: &ambidex_txn::TxnStats,
        transport: &ambidex_transport::CounterSnapshot,
        elapsed: Duration,
        cpu_seconds: f64,
    ) -> Self {
        ClusterReport {
            onesided_posted: transport.get("onesided_posted"),
            log_records_written: txn.log_ring.records_written,
            committed: txn.committed,
            read_only_committed: txn.read_only_committed,
            aborted: txn.aborted,
            aborts: txn
                .aborts
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            elapsed,
            cpu_seconds,
        }
    }
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
        Ok(Node::new(self.shared.clone(), id, self.retry))
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
        Ok(ClusterReport::new(
            &r.txn,
            &r.transport,
            r.elapsed,
            r.cpu_seconds,
        ))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.runner.is_some() {
            let _ = self.finish();
        }
    }
}
