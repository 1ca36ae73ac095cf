//! This program as one node of a cluster whose nodes are separate processes or hosts
//! ([`Node::start`]): its share of the tables in regions of its transport (`shm` or
//! `udp`), its threads serving the other nodes and running this program's transactions.
//!
//! What is built: clusters whose nodes find each other by the configuration alone
//! (`udp` addresses or the `shm` directory), with no configuration manager
//! (`cluster.manager = "none"`: a node that stops stops the cluster's transactions that
//! need it), under every transaction policy. The one-sided policies (`farm`, `drtm-r`,
//! `drtm-h`) need every node's table and log region descriptors (the catalog): with no
//! launcher to hand them out, the nodes ask each other over the cluster's own RPCs
//! when they start (`ambidex_txn::catalog_exchange`), so [`Node::start`] returns once
//! every other node has answered and this node's start-up check of their tables passed.
//! Not built: leases need a manager the nodes reach (the launcher's, or etcd through
//! `ambidex node`); they are refused with a clear error.

use crate::cluster::{ClusterReport, DEFAULT_COROUTINES, START_TIMEOUT};
use crate::config::{Config, ManagerKind, Transport};
use crate::error::{Error, StartError};
use crate::node::Node;
use crate::retry::RetryPolicy;
use crate::schema::Schema;
use crate::service::{job_server, Shared};
use ambidex_transport::{cputime, CounterSnapshot};
use ambidex_txn::runner::{spawn_node, Crew, Serve};
use ambidex_txn::{NodeDb, TxnStats};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// This process's node of a multi-process cluster, running ([`Node::start`]). It derefs
/// to its [`Node`] handle (`node.run(...)`); [`NodeProcess::shutdown`] stops it.
pub struct NodeProcess {
    node: Node,
    shared: Arc<Shared>,
    db: Arc<NodeDb>,
    /// How long start-up may take: [`START_TIMEOUT`], plus the catalog exchange's
    /// bound when the node asks the others for their descriptors.
    start_timeout: Duration,
    crew: Crew,
    handles: Vec<JoinHandle<()>>,
    started: Instant,
    cpu0: f64,
}

impl Node {
    /// Starts node `id` of the cluster `config` describes in this process, with the
    /// tables of `schema` (the same schema on every node), and returns once its threads
    /// run. Every node of the cluster is a process started the same way, with the same
    /// configuration and schema.
    ///
    /// Under an RPC-only policy (`fasst`, the default) it returns at once: transactions
    /// that need a node not yet started are retried until it is (up to the retry
    /// policy). Under a one-sided policy (`farm`, `drtm-r`, `drtm-h`) it first asks
    /// every other node for its table and log region descriptors, again until each
    /// answered (for at most a minute: [`Node::start_within`] sets the bound), then
    /// reads their tables' superblocks one-sided through them (the start-up check), and
    /// returns once both are done: start the nodes of such a cluster concurrently (each
    /// from its own process or thread), not one after another's return. A node that
    /// never answers is an error naming it.
    ///
    /// `config.cluster.transport` must be `udp` (with `udp_addrs`, one per node) or
    /// `shm` (with `shm_dir`, created by `ambidex`'s launcher or
    /// `ambidex::transports::create`), and `cluster.manager` must be `"none"` (see the
    /// module's documentation for why).
    pub fn start(config: &Config, id: u16, schema: &Schema) -> Result<NodeProcess, Error> {
        Self::start_within(config, id, schema, START_TIMEOUT)
    }

    /// [`Node::start`] that waits at most `peers` (plus one RPC `give_up`) for every
    /// other node's descriptors under a one-sided policy; the error then names the
    /// nodes that did not answer. (An RPC-only policy waits for no other node.)
    pub fn start_within(
        config: &Config,
        id: u16,
        schema: &Schema,
        peers: Duration,
    ) -> Result<NodeProcess, Error> {
        config.validate()?;
        check_supported(config)?;
        let placement = config.placement()?;
        let coroutines = config.run.coroutines.unwrap_or(DEFAULT_COROUTINES);
        let spec = config.run_spec(coroutines, Some(id))?;
        let udp = config.rpc.udp_options()?;
        let transport = crate::transports::open_node_with(&config.cluster, id, udp)
            .map_err(StartError::Transport)?;
        let db = NodeDb::new(&*transport, placement, &schema.specs(&config.placement()?))?;
        let mut start_timeout = START_TIMEOUT;
        if !spec.txn.policy.is_rpc_only() {
            // No launcher hands out the catalog: thread 0 asks the other nodes before
            // its start-up check, and the job servers start after both.
            db.fetch_catalog_at_start(peers)?;
            start_timeout += peers + spec.rpc.give_up;
        }
        let threads = config.cluster.threads;
        let shared = Arc::new(Shared::new(config.cluster.nodes, threads));
        let crew = Crew::new(threads as usize * coroutines);
        let (cpu0, started) = (cputime::process_cpu_seconds(), Instant::now());
        let handles = spawn_node(
            transport,
            db.clone(),
            &spec,
            job_server(shared.clone()),
            &crew,
            Serve::UntilDrained,
        );
        let p = NodeProcess {
            node: Node::new(shared.clone(), id, RetryPolicy::default()),
            shared,
            db,
            start_timeout,
            crew,
            handles,
            started,
            cpu0,
        };
        p.wait_started()?;
        Ok(p)
    }
}

/// Refuses what a node started on its own cannot do yet, saying why.
fn check_supported(config: &Config) -> Result<(), Error> {
    let unsupported = |what: &'static str| Error::NotSupported(what);
    if config.cluster.transport == Transport::Local {
        return Err(unsupported(
            "a local cluster lives in one process: start it with Cluster::local",
        ));
    }
    if config.cluster.manager != ManagerKind::None {
        return Err(unsupported(
            "Node::start runs without a configuration manager (cluster.manager = \"none\"); \
             leases need the launcher's manager or etcd (ambidex node)",
        ));
    }
    Ok(())
}

impl std::ops::Deref for NodeProcess {
    type Target = Node;
    fn deref(&self) -> &Node {
        &self.node
    }
}

impl NodeProcess {
    /// A handle on this node (cheap to clone, usable from any thread).
    pub fn node(&self) -> Node {
        self.node.clone()
    }

    /// Waits until every thread's job servers run (after the catalog exchange and the
    /// start-up check, if the node makes them); the first thread failure, or the
    /// exchange's or check's, if one came first.
    fn wait_started(&self) -> Result<(), Error> {
        let want = self.shared.threads as usize;
        let t0 = Instant::now();
        loop {
            if let Some(e) = self
                .crew
                .error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
            {
                return Err(ambidex_txn::RunError::Failed(vec![e]).into());
            }
            // A failed check lets the job servers start (with nothing to serve).
            if let Some(Err(e)) = self.db.verification() {
                return Err(StartError::StartupCheck(e).into());
            }
            if self.shared.started() >= want {
                return Ok(());
            }
            if t0.elapsed() > self.start_timeout {
                return Err(StartError::TimedOut {
                    started: self.shared.started(),
                    want,
                    after: self.start_timeout,
                }
                .into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Stops this node: the transactions queued run first, then its threads stop
    /// serving the others (stop a node once the others no longer need it: its share of
    /// the data goes with it). Returns what its threads did.
    pub fn shutdown(mut self) -> Result<ClusterReport, Error> {
        self.finish()
    }

    fn finish(&mut self) -> Result<ClusterReport, Error> {
        self.shared.stop();
        // The job servers return once their queues are empty; the runtimes serve on
        // until drained.
        while self.crew.live.load(Ordering::SeqCst) > 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.crew.drain.store(true, Ordering::SeqCst);
        let mut panicked = false;
        for h in self.handles.drain(..) {
            panicked |= h.join().is_err();
        }
        self.shared.close();
        if panicked {
            return Err(Error::ClusterPanicked);
        }
        if let Some(e) = self
            .crew
            .error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            return Err(ambidex_txn::RunError::Failed(vec![e]).into());
        }
        let (mut txn, mut transport) = (TxnStats::default(), CounterSnapshot::default());
        for r in self
            .crew
            .results
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            txn.merge(&r.0);
            transport.merge(&r.2);
        }
        Ok(ClusterReport::new(
            &txn,
            &transport,
            self.started.elapsed(),
            cputime::process_cpu_seconds() - self.cpu0,
        ))
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        if !self.handles.is_empty() {
            let _ = self.finish();
        }
    }
}
