//! This program as one node of a cluster whose nodes are separate processes or hosts
//! ([`Node::start`]): its share of the tables in regions of its transport (`shm` or
//! `udp`), its threads serving the other nodes and running this program's transactions.
//!
//! What is built: clusters whose nodes find each other by the configuration alone
//! (`udp` addresses or the `shm` directory), with no configuration manager
//! (`cluster.manager = "none"`: a node that stops stops the cluster's transactions that
//! need it) and a transaction policy of RPCs only (`fasst`, the default). Not built: the
//! one-sided policies need every node's table descriptors (the catalog), which only the
//! launcher of `ambidex bench` exchanges today; leases need a manager the nodes reach
//! (the launcher's, or etcd through `ambidex node`). Both are refused with a clear
//! error.

use crate::cluster::{ClusterReport, DEFAULT_COROUTINES, START_TIMEOUT};
use crate::config::{Config, ManagerKind, Transport};
use crate::error::{Error, StartError};
use crate::node::Node;
use crate::retry::RetryPolicy;
use crate::schema::Schema;
use crate::service::{job_server, Shared};
use ambidex_transport::cputime;
use ambidex_txn::policy::{Commit, Execute, Lock, Log, Validate};
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
    crew: Crew,
    handles: Vec<JoinHandle<()>>,
    started: Instant,
    cpu0: f64,
}

impl Node {
    /// Starts node `id` of the cluster `config` describes in this process, with the
    /// tables of `schema` (the same schema on every node), and returns once its threads
    /// run. Every node of the cluster is a process started the same way, with the same
    /// configuration and schema; transactions that need a node not yet started are
    /// retried until it is (up to the retry policy).
    ///
    /// `config.cluster.transport` must be `udp` (with `udp_addrs`, one per node) or
    /// `shm` (with `shm_dir`, created by `ambidex`'s launcher or
    /// `ambidex::transports::create`), `cluster.manager` must be `"none"`, and the
    /// policy one of RPCs only (see the module's documentation for why).
    pub fn start(config: &Config, id: u16, schema: &Schema) -> Result<NodeProcess, Error> {
        config.validate()?;
        check_supported(config)?;
        let placement = config.placement()?;
        let coroutines = config.run.coroutines.unwrap_or(DEFAULT_COROUTINES);
        let spec = config.run_spec(coroutines, Some(id))?;
        let udp = config.rpc.udp_options()?;
        let transport = crate::transports::open_node_with(&config.cluster, id, udp)
            .map_err(StartError::Transport)?;
        let db = NodeDb::new(&*transport, placement, &schema.specs(&config.placement()?))?;
        let threads = config.cluster.threads;
        let shared = Arc::new(Shared::new(config.cluster.nodes, threads));
        let crew = Crew::new(threads as usize * coroutines);
        let (cpu0, started) = (cputime::process_cpu_seconds(), Instant::now());
        let handles = spawn_node(
            transport,
            db,
            &spec,
            job_server(shared.clone()),
            &crew,
            Serve::UntilDrained,
        );
        let p = NodeProcess {
            node: Node::new(shared.clone(), id, RetryPolicy::default()),
            shared,
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
    let p = config.policy()?;
    let rpc_only = p.execute == Execute::Rpc
        && p.lock == Lock::Rpc
        && p.validate == Validate::Rpc
        && p.log == Log::Rpc
        && p.commit == Commit::Rpc;
    if !rpc_only {
        return Err(unsupported(
            "Node::start runs policies of RPCs only (fasst): the one-sided phases need the \
             cluster's catalog of table descriptors, which only ambidex's launcher exchanges",
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

    /// Waits until every thread's job servers run; the first thread failure if one
    /// came first.
    fn wait_started(&self) -> Result<(), Error> {
        let want = self.shared.threads as usize;
        let t0 = Instant::now();
        while self.shared.started() < want {
            if let Some(e) = self
                .crew
                .error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
            {
                return Err(ambidex_txn::RunError::Failed(vec![e]).into());
            }
            if t0.elapsed() > START_TIMEOUT {
                return Err(StartError::TimedOut {
                    started: self.shared.started(),
                    want,
                    after: START_TIMEOUT,
                }
                .into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
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
        let mut txn = TxnStats::default();
        for r in self
            .crew
            .results
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            txn.merge(&r.0);
        }
        Ok(ClusterReport::new(
            &txn,
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
