//! This program as one node of a cluster whose nodes are separate processes or hosts
//! ([`Node::start`]): its share of the tables in regions of its transport (`shm` or
//! `udp`), its threads serving the other nodes and running this program's transactions.
//!
//! What is built: clusters whose nodes find each other by the configuration alone
//! (`udp` addresses or the `shm` directory), under every transaction policy, with no
//! configuration manager or with etcd's:
//!
//! - `cluster.manager = "none"`: no leases; a node that stops stops the cluster's
//!   transactions that need it.
//! - `cluster.manager = "etcd"` (cargo feature `etcd`; a build without it refuses the
//!   configuration): leases, failure detection and reconfiguration in etcd, as for
//!   `ambidex bench` node processes. Every node names the same cluster in etcd
//!   (`cluster.etcd_cluster`, required: no launcher makes one up); the first to start
//!   creates it in the initial configuration (`etcd_membership::bootstrap_or_read`),
//!   the others check that the one there has the configuration's shape and is still in
//!   its initial configuration. Each node's agent holds its lease in etcd on its own
//!   client and moves the node's threads through each new configuration. A node shut
//!   down ([`NodeProcess::shutdown`]), or dead, stops renewing its lease: once etcd
//!   expires it the others remove it and go on. Every node's lease runs from the
//!   cluster's creation: start every node within a lease (etcd counts whole seconds)
//!   of the first, or the others remove it before it runs. A removed node cannot come
//!   back (a node started again has an empty database: rejoining is built for
//!   `ambidex bench --restart` only).
//!
//! The one-sided policies (`farm`, `drtm-r`, `drtm-h`) need every node's table and log
//! region descriptors (the catalog): with no launcher to hand them out, the nodes ask
//! each other over the cluster's own RPCs when they start
//! (`ambidex_txn::catalog_exchange`), so [`Node::start`] returns once every other node
//! has answered and this node's start-up check of their tables passed (with etcd, they
//! ask in the initial configuration, the one every node starts in).
//!
//! Not built: the embedded manager (it lives in a host process, `ambidex bench`'s
//! launcher), refused with a clear error pointing to etcd.

use crate::bench::etcd_membership;
use crate::cluster::{ClusterReport, DEFAULT_COROUTINES, START_TIMEOUT};
use crate::config::{Config, ManagerKind, Transport};
use crate::error::{Error, StartError};
use crate::node::Node;
use crate::retry::RetryPolicy;
use crate::schema::Schema;
use crate::service::{job_server, Shared};
use ambidex_cluster::Agent;
use ambidex_transport::clock::SystemClock;
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
    /// With the etcd manager: this node's cluster agent, holding its lease and
    /// following the membership, from the start until [`NodeProcess::shutdown`].
    agent: Option<Agent>,
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
    /// `ambidex::transports::create`), and `cluster.manager` `"none"` or `"etcd"`.
    ///
    /// With `"etcd"` (cargo feature `etcd`), `cluster.etcd_cluster` names the cluster
    /// in etcd (the same on every node; [`StartError::NoEtcdCluster`] without it): the
    /// first node creates it there, the others check it has this configuration's shape
    /// ([`StartError::EtcdClusterDiffers`]) and is still in its initial configuration
    /// ([`StartError::EtcdClusterMovedOn`]). Then this node's agent holds its lease in
    /// etcd until [`NodeProcess::shutdown`], and `start` returns once the first lease
    /// is granted too. A node that stops or dies is removed by the others once its
    /// lease expires, and they go on without it ([`NodeProcess::epoch`] moves on).
    /// Start every node within a lease (at least a second) of the first: each node's
    /// lease runs from the cluster's creation. `"embedded"` is refused
    /// ([`Error::NotSupported`]): see the module's documentation.
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
        // With etcd: the cluster exists in etcd (this node made it, or checked the one
        // there), and this node's agent holds its lease before its threads start.
        let agent = start_agent(config, id, &db)?;
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
            agent,
            started,
            cpu0,
        };
        p.wait_started()?;
        Ok(p)
    }
}

/// Refuses what a node started on its own cannot do, saying why.
fn check_supported(config: &Config) -> Result<(), Error> {
    let unsupported = |what: &'static str| Error::NotSupported(what);
    if config.cluster.transport == Transport::Local {
        return Err(unsupported(
            "a local cluster lives in one process: start it with Cluster::local",
        ));
    }
    match config.cluster.manager {
        ManagerKind::None => Ok(()),
        ManagerKind::Embedded => Err(unsupported(
            "the embedded configuration manager lives in a host process (ambidex bench's \
             launcher), which nodes started with Node::start do not have: use \
             cluster.manager = \"etcd\" (with the cargo feature etcd) for leases and \
             reconfiguration, or \"none\"",
        )),
        // `Config::validate` refused it first in a build without etcd.
        ManagerKind::Etcd if config.cluster.etcd_cluster.is_none() => {
            Err(StartError::NoEtcdCluster.into())
        }
        ManagerKind::Etcd => Ok(()),
    }
}

/// With the etcd manager: makes sure cluster `cluster.etcd_cluster` exists in etcd in
/// this configuration's shape (the first node to get here creates it in the initial
/// configuration; the others check the one there is that configuration still), then
/// starts node `id`'s agent on its own etcd client (incarnation 1), sharing the node's
/// state with its threads (`NodeDb::cluster`), as `ambidex node` does. `None` without
/// a manager.
fn start_agent(config: &Config, id: u16, db: &NodeDb) -> Result<Option<Agent>, Error> {
    let c = &config.cluster;
    let Some(manager) = c.manager_spec() else {
        return Ok(None);
    };
    let cluster = c.etcd_cluster.clone().ok_or(StartError::NoEtcdCluster)?;
    if let Some((state, stopped)) =
        etcd_membership::bootstrap_or_read(c).map_err(StartError::Membership)?
    {
        let p = &state.config.placement;
        if (p.nodes(), p.replication()) != (c.nodes, c.replication) {
            return Err(StartError::EtcdClusterDiffers {
                cluster,
                found_nodes: p.nodes(),
                found_replication: p.replication(),
                nodes: c.nodes,
                replication: c.replication,
            }
            .into());
        }
        // This node's database is new and in the initial configuration: it can be a
        // member of that one only.
        if state.config.epoch != db.config().epoch() || stopped.is_some() {
            return Err(StartError::EtcdClusterMovedOn {
                cluster,
                node: id,
                epoch: state.config.epoch,
                stopped,
            }
            .into());
        }
    }
    // The events this node's client publishes are not reported (no launcher merges
    // them); `ambidex bench` reports them.
    let client = etcd_membership::node_client(c, id, 1, Default::default())
        .map_err(StartError::Membership)?;
    let agent = Agent::start(
        format!("agent{id}"),
        client,
        db.cluster().clone(),
        manager.lease,
        SystemClock::shared(),
    )
    .map_err(StartError::Agent)?;
    Ok(Some(agent))
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

    /// The epoch of the configuration this node is in: 1 at the start; with the etcd
    /// manager, each reconfiguration (a node removed) moves it on.
    pub fn epoch(&self) -> u32 {
        self.db.cluster().config.epoch()
    }

    /// The nodes of the configuration this node is in (every node of the cluster but
    /// those the manager removed).
    pub fn members(&self) -> Vec<u16> {
        self.db
            .cluster()
            .config
            .with(|c| c.placement.members().collect())
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
            // With a manager, the node's first lease too (its threads serve only then).
            let state = self.db.cluster();
            if self.agent.is_some() && state.fenced() {
                return Err(StartError::Fenced {
                    node: self.node.id(),
                    why: state.why().unwrap_or_default(),
                }
                .into());
            }
            let leased = self.agent.is_none() || state.serving(SystemClock::shared().now_ns());
            if self.shared.started() >= want && leased {
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
    ///
    /// With the etcd manager, its agent stops with it: its lease is no longer renewed,
    /// and once etcd expires it (a lease, rounded up to whole seconds) the other nodes
    /// reconfigure without it and go on (as long as every partition keeps a copy on
    /// them); until then their transactions that need this node wait or are retried.
    /// It cannot come back: a node started again has an empty database.
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
        // This node no longer serves: its lease goes, and the others remove it once
        // the manager sees it expire.
        drop(self.agent.take());
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
