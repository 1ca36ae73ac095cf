//! Brings a cluster's node threads up, the same way for every path: one runtime per
//! (node, thread) with the transaction layer installed and `coroutines` workers spawned
//! ([`start_thread`]). In-process runs ([`run`]: every node of the cluster in this
//! process, any transport) and node processes (`ambidex::bench::node`: one node) run
//! each (node, thread) on an OS thread of its own ([`spawn_node`]); the simulator calls
//! [`start_thread`] and steps the runtimes itself, in one thread.
//!
//! Runtimes keep serving requests until the run says so ([`Serve`]): in-process, until
//! every worker of the whole cluster has finished, so no node stops answering while
//! another still needs it; in a node process, until the launcher says every node's
//! workers are done.

use crate::error::{
    DbError, EtcdError, RestartError, RunError, RunFailure, StartError, StartupCheckError,
};
use crate::recovery::{RecoveryStats, ThreadRecovery};
use crate::{HistorySink, NodeDb, TxnConfig, TxnStats, TxnThread};
use ambidex_cluster::{Agent, ClusterState, Configuration, EmbeddedManager, Event, ManagerClient};
use ambidex_rpc::{Clock, Ctx, RpcStats, Runtime, RuntimeConfig, SharedClock, SystemClock};
use ambidex_transport::fault::{FaultConfig, FaultyEndpoint};
use ambidex_transport::{cputime, CounterSnapshot, Endpoint, NodeId, SharedNode, ThreadId};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What a worker coroutine gets.
pub struct WorkerCtx {
    pub ctx: Ctx,
    pub th: Rc<TxnThread>,
    pub node: NodeId,
    pub thread: ThreadId,
    pub coroutine: usize,
    /// The thread's worker coroutines (`RunSpec::coroutines`): `coroutine` is one of
    /// `0..coroutines`.
    pub coroutines: usize,
    /// Set when the run's duration is over; workers finish their transaction and return.
    pub stop: Arc<AtomicBool>,
}

/// Makes the future of one worker coroutine (called on the worker's own thread).
pub type Worker = Arc<dyn Fn(WorkerCtx) -> Pin<Box<dyn Future<Output = ()>>> + Send + Sync>;

/// Makes the history sink of one (node, thread), if histories are recorded.
pub type SinkFactory = Arc<dyn Fn(NodeId, ThreadId) -> Box<dyn HistorySink> + Send + Sync>;

/// Makes the empty database of a restarted node on its transport, in the cluster's
/// current configuration (which it is not a member of): the same tables, capacities and
/// log rings as the other nodes', in new regions (`NodeDb::with_config`).
pub type DbFactory =
    Arc<dyn Fn(&SharedNode, Configuration) -> Result<Arc<NodeDb>, DbError> + Send + Sync>;

#[derive(Clone)]
pub struct RunSpec {
    pub coroutines: usize,
    pub rpc: RuntimeConfig,
    pub txn: TxnConfig,
    /// Wraps every endpoint in the transport's fault injector.
    pub fault: Option<FaultConfig>,
    /// Stop the workers after this long (`None`: they finish on their own).
    pub duration: Option<Duration>,
    pub history: Option<SinkFactory>,
    /// Leases and reconfiguration (issue 18): with `Some`, an in-process run starts an
    /// embedded manager and one agent per node ([`run`]); node processes get theirs
    /// from their launcher. `None`: no leases, the configuration never changes.
    pub manager: Option<ManagerSpec>,
    /// In-process runs with a manager: node `.0`'s threads and agent stop dead `.1`
    /// after the start (a crash: no goodbye, its memory left as it was).
    pub kill: Option<(NodeId, Duration)>,
    /// In-process runs with a manager: the killed node starts again `.1` after the
    /// start (once the others removed it) as a new incarnation with an empty database
    /// made by `fresh_db`; it joins and is brought up to date by re-replication.
    pub restart: Option<(NodeId, Duration)>,
    /// Makes the restarted node's database (needed with `restart`).
    pub fresh_db: Option<DbFactory>,
}

/// How a run's nodes hold leases.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManagerSpec {
    /// The lease period; renewed at a fifth of it.
    pub lease: Duration,
    /// Which manager an in-process run starts (node processes ignore it).
    pub kind: ManagerKind,
}

impl ManagerSpec {
    /// Leases of `lease` from an embedded manager (the default).
    pub fn embedded(lease: Duration) -> ManagerSpec {
        ManagerSpec {
            lease,
            kind: ManagerKind::Embedded,
        }
    }
}

/// The manager behind an in-process run's agents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ManagerKind {
    /// An [`EmbeddedManager`] in this process: `RunResult::cluster` is its final state
    /// and `RunResult::events` its events.
    Embedded,
    /// The etcd manager (cargo feature `etcd`): [`run`] bootstraps cluster `cluster` in
    /// the etcd at `endpoints` (it must not exist yet) from node 0's configuration and
    /// connects one `EtcdClient` per node. etcd rounds the lease up to whole seconds
    /// and to its minimum. `RunResult::cluster` is the state read back from etcd at the
    /// end; `RunResult::events` merges what each node's client published (each change
    /// is published by one node), on the run's clock.
    #[cfg(feature = "etcd")]
    Etcd {
        endpoints: Vec<String>,
        cluster: String,
    },
}

impl Default for RunSpec {
    fn default() -> Self {
        RunSpec {
            coroutines: 4,
            rpc: RuntimeConfig::default(),
            txn: TxnConfig::default(),
            fault: None,
            duration: None,
            history: None,
            manager: None,
            kill: None,
            restart: None,
            fresh_db: None,
        }
    }
}

/// What a run produced.
#[derive(Default)]
pub struct RunResult {
    pub txn: TxnStats,
    pub rpc: RpcStats,
    pub transport: CounterSnapshot,
    pub elapsed: Duration,
    pub cpu_seconds: f64,
    /// Log records still held per (node, thread) when the run ended.
    pub log_records_held: Vec<u64>,
    /// Workers that did not finish (stuck); a correct run has none.
    pub stuck_workers: usize,
    /// Other nodes' tables the nodes' start-up checks read one-sided and verified
    /// (summed over the nodes; 0 for nodes without a catalog).
    pub remote_tables_verified: usize,
    /// With a manager: its state at the end (the final configuration) and its events
    /// (manager time, ns), and when the run started on that clock.
    pub cluster: Option<ClusterState>,
    pub events: Vec<Event>,
    pub start_ns: u64,
    /// The node killed (`RunSpec::kill`), if it was, and when (the manager's clock,
    /// as `start_ns`).
    pub killed: Option<NodeId>,
    pub killed_at_ns: u64,
    /// What the node threads' recoveries and re-replication did, summed.
    pub recovery: RecoveryStats,
    /// The node restarted (`RunSpec::restart`), if it was.
    pub restarted: Option<Restarted>,
}

/// A node restarted during a run.
#[derive(Clone)]
pub struct Restarted {
    pub node: NodeId,
    /// When its new incarnation started (the manager's clock, as `RunResult::start_ns`).
    pub at_ns: u64,
    pub incarnation: u64,
    /// Its new database (the old one is the caller's, as it was at the crash).
    pub db: Arc<NodeDb>,
}

/// Runs `worker` on every thread of every node until all workers return (or the
/// duration passes and they notice `stop`). `nodes[i]` and `dbs[i]` are node i.
pub fn run(
    nodes: &[SharedNode],
    dbs: &[Arc<NodeDb>],
    spec: &RunSpec,
    worker: Worker,
) -> Result<RunResult, RunError> {
    if nodes.len() != dbs.len() || nodes.is_empty() {
        return Err(RunError::NodeCount {
            nodes: nodes.len(),
            dbs: dbs.len(),
        });
    }
    if let Some((n, _)) = spec.restart {
        if spec.manager.is_none() || spec.fresh_db.is_none() || spec.kill.map(|k| k.0) != Some(n) {
            return Err(RunError::RestartSpec { node: n });
        }
    }
    let threads = nodes[0].config().threads_per_node;
    let crew = Crew::new(nodes.len() * threads as usize * spec.coroutines);
    let clock = SystemClock::shared();
    // Leases: the manager and every node's agent run beside the node threads.
    let manager = match &spec.manager {
        None => None,
        Some(m) => Some(Manager::start(m, dbs, clock.clone())?),
    };
    let mut agents: Vec<Option<Agent>> = Vec::new();
    if let (Some(m), Some(ms)) = (&manager, &spec.manager) {
        for db in dbs {
            let incarnation = db.config().load().incarnations[db.node as usize];
            let a = Agent::start(
                format!("agent{}", db.node),
                m.client(db, incarnation, ms.lease, &clock)?,
                db.cluster().clone(),
                ms.lease,
                clock.clone(),
            )
            .map_err(|e| RunError::Agent {
                node: db.node,
                source: Arc::new(e),
            })?;
            agents.push(Some(a));
        }
    }
    let cpu0 = cputime::process_cpu_seconds();
    let start = Instant::now();
    let start_ns = clock.now_ns();
    // Per node, its threads.
    let mut handles = Vec::new();
    let mut dead = Vec::new();
    for (node, db) in nodes.iter().zip(dbs) {
        let d = Arc::new(AtomicBool::new(false));
        handles.push(spawn_node_until(
            node.clone(),
            db.clone(),
            spec,
            worker.clone(),
            &crew,
            Serve::UntilAllWorkersDone,
            d.clone(),
        ));
        dead.push(d);
    }
    let mut killed = None;
    let mut killed_at_ns = 0;
    // Every node's current database (a restarted node's new one).
    let mut current: Vec<Arc<NodeDb>> = dbs.to_vec();
    let mut restarted: Option<Restarted> = None;
    let until = spec.duration.unwrap_or(Duration::MAX);
    while start.elapsed() < until && crew.live.load(Ordering::SeqCst) > 0 {
        if let (Some((n, at)), Some(k), None, Some(m)) =
            (spec.restart, killed, &restarted, &manager)
        {
            // Once the others removed the dead incarnation: its descriptors change in
            // their catalogs, which must not happen while it is a member (a thread
            // filling its caches would reach the new, empty regions in an epoch that
            // still counts the old incarnation's copies).
            let removed = current
                .iter()
                .filter(|d| d.node != n)
                .all(|d| !d.config().with(|c| c.placement.is_member(n)));
            if n == k && start.elapsed() >= at && removed {
                // Its old threads stopped (they return at the kill): its endpoints can
                // be taken again.
                for h in std::mem::take(&mut handles[n as usize]) {
                    if h.join().is_err() {
                        crew.fail(RunFailure::KilledThreadPanicked { node: n });
                    }
                }
                let args = RestartArgs {
                    node: n,
                    nodes,
                    current: &current,
                    spec,
                    worker: &worker,
                    crew: &crew,
                    manager: m,
                    clock: &clock,
                };
                match restart_node(args) {
                    Ok((agent, r, hs)) => {
                        agents[n as usize] = Some(agent);
                        handles[n as usize] = hs;
                        current[n as usize] = r.db.clone();
                        restarted = Some(r);
                    }
                    Err(e) => {
                        crew.fail(e.into());
                        break;
                    }
                }
            }
        }
        if let Some((n, at)) = spec.kill {
            if killed.is_none() && start.elapsed() >= at && (n as usize) < dead.len() {
                if let Some(a) = agents.get_mut(n as usize) {
                    a.take();
                }
                dead[n as usize].store(true, Ordering::SeqCst);
                killed = Some(n);
                killed_at_ns = clock.now_ns();
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    crew.stop.store(true, Ordering::SeqCst);
    let mut errors = Vec::new();
    for h in handles.into_iter().flatten() {
        if h.join().is_err() {
            errors.push(RunFailure::NodeThreadPanicked);
        }
    }
    errors.extend(crew.error.lock().unwrap().take());
    // All at once: stopped one by one, the first could lose its lease while the last
    // stop, and be removed from the final configuration.
    for a in agents.iter().flatten() {
        a.signal_stop();
    }
    drop(agents);
    let (cluster, events) = match &manager {
        Some(m) => match m.finish() {
            Ok((state, events, failure)) => {
                if let Some(why) = failure {
                    errors.push(RunFailure::ClusterStopped { why });
                }
                (Some(state), events)
            }
            Err(e) => {
                errors.push(e.into());
                (None, Vec::new())
            }
        },
        None => (None, Vec::new()),
    };
    // The node killed and not restarted is not checked.
    let gone = killed.filter(|_| restarted.is_none());
    for db in &current {
        if Some(db.node) != gone && db.cluster().fenced() {
            errors.push(RunFailure::Fenced {
                node: db.node,
                why: db.cluster().why().unwrap_or_default(),
            });
        }
    }
    let mut verified = 0;
    for db in current
        .iter()
        .filter(|d| d.checks_at_start() && Some(d.node) != gone)
    {
        match db.remote_tables_verified() {
            Ok(n) => verified += n,
            Err(e) => errors.push(e.into()),
        }
    }
    if !errors.is_empty() {
        return Err(RunError::Failed(errors));
    }
    let mut r = RunResult {
        elapsed: start.elapsed(),
        cpu_seconds: cputime::process_cpu_seconds() - cpu0,
        remote_tables_verified: verified,
        cluster,
        events,
        start_ns,
        killed,
        killed_at_ns,
        recovery: *crew.recovery.lock().unwrap(),
        restarted,
        ..Default::default()
    };
    for (txn, rpc, tr, stuck) in crew.results.lock().unwrap().iter() {
        r.txn.merge(txn);
        r.rpc.merge(rpc);
        r.transport.merge(tr);
        r.log_records_held.push(txn.log_records_held);
        r.stuck_workers += stuck;
    }
    Ok(r)
}

/// The manager of an in-process run.
enum Manager {
    Embedded(EmbeddedManager),
    #[cfg(feature = "etcd")]
    Etcd {
        endpoints: Vec<String>,
        cluster: String,
        /// What each node's client published, moved here when the client is dropped
        /// (with its agent).
        events: Arc<Mutex<Vec<Event>>>,
    },
}

impl Manager {
    fn start(
        spec: &ManagerSpec,
        dbs: &[Arc<NodeDb>],
        clock: SharedClock,
    ) -> Result<Manager, EtcdError> {
        let config = (*dbs[0].config().load()).clone();
        match &spec.kind {
            ManagerKind::Embedded => Ok(Manager::Embedded(EmbeddedManager::start(
                config, spec.lease, clock,
            ))),
            #[cfg(feature = "etcd")]
            ManagerKind::Etcd { endpoints, cluster } => {
                let eps: Vec<&str> = endpoints.iter().map(String::as_str).collect();
                let created =
                    ambidex_cluster::EtcdManager::bootstrap(&eps, cluster, config, spec.lease)
                        .map_err(|source| EtcdError::Bootstrap {
                            cluster: cluster.clone(),
                            source,
                        })?;
                if !created {
                    return Err(EtcdError::Exists {
                        cluster: cluster.clone(),
                    });
                }
                Ok(Manager::Etcd {
                    endpoints: endpoints.clone(),
                    cluster: cluster.clone(),
                    events: Arc::default(),
                })
            }
        }
    }

    /// Node `db.node`'s handle on the manager (`lease` and `clock` are the etcd
    /// client's).
    #[cfg_attr(not(feature = "etcd"), allow(unused_variables))]
    fn client(
        &self,
        db: &NodeDb,
        incarnation: u64,
        lease: Duration,
        clock: &SharedClock,
    ) -> Result<Box<dyn ManagerClient>, EtcdError> {
        match self {
            Manager::Embedded(m) => Ok(Box::new(m.client(db.node, incarnation))),
            #[cfg(feature = "etcd")]
            Manager::Etcd {
                endpoints,
                cluster,
                events,
            } => {
                let c = etcd::Recording::connect(
                    endpoints,
                    cluster,
                    (db.node, incarnation),
                    lease,
                    clock,
                    events.clone(),
                )?;
                Ok(Box::new(c))
            }
        }
    }

    /// The final state, the events in time order and why the cluster stopped, if it
    /// did (after the agents are gone).
    fn finish(&self) -> Result<(ClusterState, Vec<Event>, Option<String>), EtcdError> {
        match self {
            Manager::Embedded(m) => Ok((m.state(), m.events(), m.failure())),
            #[cfg(feature = "etcd")]
            Manager::Etcd {
                endpoints,
                cluster,
                events,
            } => {
                let eps: Vec<&str> = endpoints.iter().map(String::as_str).collect();
                let (state, failed) =
                    ambidex_cluster::EtcdManager::state(&eps, cluster).map_err(|source| {
                        EtcdError::FinalState {
                            cluster: cluster.clone(),
                            source,
                        }
                    })?;
                let mut events = events.lock().unwrap_or_else(|e| e.into_inner()).clone();
                events.sort_by_key(|e| e.at_ns);
                Ok((state, events, failed))
            }
        }
    }
}

/// A node's etcd client that records what it published (in-process runs and node
/// processes report the manager's events from these).
#[cfg(feature = "etcd")]
pub mod etcd {
    use crate::error::EtcdError;
    use ambidex_cluster::{
        ClusterState, EtcdClient, Event, Grant, ManagerClient, ManagerError, Stage,
    };
    use ambidex_rpc::SharedClock;
    use ambidex_transport::NodeId;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// A node's etcd client that hands what it published over to `sink` when it is
    /// dropped (with its agent, at the end or at a kill), on the run's clock.
    pub struct Recording {
        inner: EtcdClient,
        /// The run's clock when the client connected (its own clock's zero).
        offset_ns: u64,
        sink: Arc<Mutex<Vec<Event>>>,
    }

    impl Recording {
        /// Connects node `member.0` (incarnation `member.1`) to cluster `cluster` in
        /// the etcd at `endpoints`, with leases of `lease`; its events go to `sink`,
        /// on `clock`.
        pub fn connect(
            endpoints: &[String],
            cluster: &str,
            member: (NodeId, u64),
            lease: Duration,
            clock: &SharedClock,
            sink: Arc<Mutex<Vec<Event>>>,
        ) -> Result<Recording, EtcdError> {
            let eps: Vec<&str> = endpoints.iter().map(String::as_str).collect();
            let (node, incarnation) = member;
            let inner = EtcdClient::connect(&eps, cluster, node, incarnation, lease)
                .map_err(|source| EtcdError::Connect { node, source })?;
            // The client counts its events from when it connected.
            Ok(Recording {
                inner,
                offset_ns: clock.now_ns(),
                sink,
            })
        }
    }

    impl Drop for Recording {
        fn drop(&mut self) {
            let mut sink = self.sink.lock().unwrap_or_else(|e| e.into_inner());
            sink.extend(self.inner.events().iter().map(|e| Event {
                at_ns: e.at_ns + self.offset_ns,
                ..e.clone()
            }));
        }
    }

    impl ManagerClient for Recording {
        fn renew(&mut self) -> Result<Grant, ManagerError> {
            self.inner.renew()
        }
        fn state_after(
            &mut self,
            revision: u64,
            wait: Duration,
        ) -> Result<Option<ClusterState>, ManagerError> {
            self.inner.state_after(revision, wait)
        }
        fn ack(&mut self, epoch: u32, stage: Stage) -> Result<(), ManagerError> {
            self.inner.ack(epoch, stage)
        }
        fn suspect(&mut self, node: NodeId) -> Result<(), ManagerError> {
            self.inner.suspect(node)
        }
        fn synced(&mut self, partitions: &[u32]) -> Result<(), ManagerError> {
            self.inner.synced(partitions)
        }
        fn join(&mut self) -> Result<(), ManagerError> {
            self.inner.join()
        }
    }
}

/// What [`restart_node`] needs of the run.
struct RestartArgs<'a> {
    node: NodeId,
    nodes: &'a [SharedNode],
    current: &'a [Arc<NodeDb>],
    spec: &'a RunSpec,
    worker: &'a Worker,
    crew: &'a Crew,
    manager: &'a Manager,
    clock: &'a SharedClock,
}

/// Starts killed node `a.node` again (its old threads have stopped): its endpoints are
/// released, a new empty database is made in the survivors' configuration with the
/// next incarnation, every node's catalog gets its new descriptors (the joiner the
/// whole catalog), and its agent (joining) and threads start. Its threads wait, holding
/// no lease, until the agent moved them to the configuration that admits it.
fn restart_node(
    a: RestartArgs<'_>,
) -> Result<(Agent, Restarted, Vec<JoinHandle<()>>), RestartError> {
    let (n, at_ns) = (a.node, a.clock.now_ns());
    let (fresh, ms) = match (&a.spec.fresh_db, &a.spec.manager) {
        (Some(f), Some(m)) => (f, m),
        _ => return Err(RestartError::Spec { node: n }),
    };
    let transport = a
        .nodes
        .get(n as usize)
        .ok_or(RestartError::NoNode { node: n })?;
    let survivor = a
        .current
        .iter()
        .find(|d| d.node != n)
        .ok_or(RestartError::NobodyToRejoin { node: n })?;
    let config = (*survivor.config().load()).clone();
    let incarnation = config
        .incarnations
        .get(n as usize)
        .map(|i| i + 1)
        .ok_or(RestartError::NotInConfiguration { node: n })?;
    transport
        .restart()
        .map_err(|source| RestartError::Transport { node: n, source })?;
    let db = fresh(transport, config)?;
    db.set_incarnation(incarnation);
    if db.node != n {
        return Err(RestartError::WrongNode {
            node: n,
            got: db.node,
        });
    }
    if let Some(cat) = survivor.catalog() {
        let (tables, log) = (db.table_descs(), db.log_region_desc());
        let mut whole = (*cat).clone();
        whole
            .replace_node(n, tables.clone(), Some(log))
            .map_err(|source| RestartError::Descriptors { node: n, source })?;
        db.set_catalog(whole)?;
        for d in a.current.iter().filter(|d| d.node != n) {
            d.replace_in_catalog(n, tables.clone(), log)?;
        }
    }
    let agent = Agent::join(
        format!("agent{n}"),
        a.manager.client(&db, incarnation, ms.lease, a.clock)?,
        db.cluster().clone(),
        ms.lease,
        a.clock.clone(),
        n,
        incarnation,
    )
    .map_err(|e| RestartError::Agent {
        node: n,
        source: Arc::new(e),
    })?;
    let threads = transport.config().threads_per_node as usize;
    a.crew
        .live
        .fetch_add(threads * a.spec.coroutines, Ordering::SeqCst);
    let handles = spawn_node_until(
        transport.clone(),
        db.clone(),
        a.spec,
        a.worker.clone(),
        a.crew,
        Serve::UntilAllWorkersDone,
        Arc::new(AtomicBool::new(false)),
    );
    let r = Restarted {
        node: n,
        at_ns,
        incarnation,
        db,
    };
    Ok((agent, r, handles))
}

/// What the threads of a run share.
#[derive(Clone)]
pub struct Crew {
    /// Workers still running.
    pub live: Arc<AtomicUsize>,
    /// The workers' stop flag: they finish their transaction and return.
    pub stop: Arc<AtomicBool>,
    /// Set when the runtimes may stop serving (with [`Serve::UntilDrained`]).
    pub drain: Arc<AtomicBool>,
    /// The first failure of a thread (it could not start, or panicked) or of a restart.
    pub error: Arc<Mutex<Option<RunFailure>>>,
    /// What each thread reported when it ended.
    pub results: Arc<Mutex<Vec<ThreadResult>>>,
    /// The threads' recovery counters, summed as they end.
    pub recovery: Arc<Mutex<RecoveryStats>>,
}

impl Crew {
    /// The state of a run of `workers` workers in all.
    pub fn new(workers: usize) -> Crew {
        Crew {
            live: Arc::new(AtomicUsize::new(workers)),
            stop: Arc::new(AtomicBool::new(false)),
            drain: Arc::new(AtomicBool::new(false)),
            error: Arc::new(Mutex::new(None)),
            results: Arc::new(Mutex::new(Vec::new())),
            recovery: Arc::new(Mutex::new(RecoveryStats::default())),
        }
    }

    fn fail(&self, e: RunFailure) {
        self.error.lock().unwrap().get_or_insert(e);
    }
}

/// Until when a node thread's runtime serves requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Serve {
    /// Until every worker of the [`Crew`] has returned (every node is in this process).
    UntilAllWorkersDone,
    /// Until [`Crew::drain`] is set (a node process: the launcher knows the other nodes).
    UntilDrained,
}

/// Starts one OS thread per thread of `node` (named `nodeN-tT`), each running
/// [`start_thread`] and serving until `serve` says, then [`finish_thread`] into
/// `crew.results`. A thread that cannot start records its error in `crew.error` and
/// counts its workers as done.
pub fn spawn_node(
    node: SharedNode,
    db: Arc<NodeDb>,
    spec: &RunSpec,
    worker: Worker,
    crew: &Crew,
    serve: Serve,
) -> Vec<JoinHandle<()>> {
    let alive = Arc::new(AtomicBool::new(false));
    spawn_node_until(node, db, spec, worker, crew, serve, alive)
}

/// [`spawn_node`] whose threads stop dead once `dead` is set (an in-process crash:
/// they return without finishing, their workers counted as done).
fn spawn_node_until(
    node: SharedNode,
    db: Arc<NodeDb>,
    spec: &RunSpec,
    worker: Worker,
    crew: &Crew,
    serve: Serve,
    dead: Arc<AtomicBool>,
) -> Vec<JoinHandle<()>> {
    let n = node.node();
    let coroutines = spec.coroutines;
    let mut handles = Vec::new();
    for t in 0..node.config().threads_per_node {
        let (node, db, spec, worker, crew2, dead) = (
            node.clone(),
            db.clone(),
            spec.clone(),
            worker.clone(),
            crew.clone(),
            dead.clone(),
        );
        let spawned = std::thread::Builder::new()
            .name(format!("node{n}-t{t}"))
            .spawn(move || {
                let crew = crew2;
                let history = spec.history.as_ref().map(|f| f(n, t));
                let live = crew.live.clone();
                // Workers of this thread that returned: a panic counts the rest as done.
                let returned = Rc::new(std::cell::Cell::new(0usize));
                let ret = returned.clone();
                let started = node
                    .endpoint(t)
                    .map_err(|source| StartError::Endpoint {
                        node: n,
                        thread: t,
                        source,
                    })
                    .and_then(|ep| {
                        start_thread(
                            ep,
                            SystemClock::shared(),
                            &spec,
                            db,
                            history,
                            crew.stop.clone(),
                            move |w| worker(w),
                            move |_| {
                                ret.set(ret.get() + 1);
                                live.fetch_sub(1, Ordering::SeqCst);
                            },
                        )
                    });
                let (mut rt, th) = match started {
                    Ok(x) => x,
                    Err(e) => {
                        crew.fail(e.into());
                        crew.live.fetch_sub(coroutines, Ordering::SeqCst);
                        return;
                    }
                };
                // A panic in a worker (a bug, or a test's assertion) must fail the run,
                // not hang it: the other threads wait for every worker to return.
                let mut recovery = ThreadRecovery::new(&rt, &th);
                let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let done = || {
                        dead.load(Ordering::Relaxed)
                            || match serve {
                                Serve::UntilAllWorkersDone => crew.live.load(Ordering::SeqCst) == 0,
                                Serve::UntilDrained => crew.drain.load(Ordering::SeqCst),
                            }
                    };
                    loop {
                        rt.run_until(|rt| done() || recovery.due(rt));
                        if done() {
                            break;
                        }
                        recovery.step(&mut rt, &th);
                    }
                    recovery.stop();
                }));
                // Workers that will never return (a crash, a panic) count as done, so
                // the others' run can end.
                let give_up_rest = || {
                    crew.live
                        .fetch_sub(coroutines.saturating_sub(returned.get()), Ordering::SeqCst)
                };
                if dead.load(Ordering::SeqCst) {
                    give_up_rest();
                    // Crashed: nothing more of this thread runs. Its endpoint stays
                    // registered (as a dead machine's NIC still takes datagrams), so
                    // the runtime is leaked, not dropped.
                    std::mem::forget(rt);
                    return;
                }
                if let Err(p) = served {
                    let what = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "a panic".into());
                    crew.fail(RunFailure::ThreadPanicked {
                        node: n,
                        thread: t,
                        what,
                    });
                    crew.stop.store(true, Ordering::SeqCst);
                    give_up_rest();
                    return;
                }
                let r = finish_thread(&mut rt, &th, || recovery.background_tasks());
                crew.results.lock().unwrap().push(r);
                // After the finish: a copy stopped by the run's end counted itself.
                crew.recovery
                    .lock()
                    .unwrap()
                    .merge(&recovery.stats.borrow());
            });
        match spawned {
            Ok(h) => handles.push(h),
            Err(e) => {
                crew.fail(RunFailure::Spawn {
                    node: n,
                    thread: t,
                    source: Arc::new(e),
                });
                crew.live.fetch_sub(coroutines, Ordering::SeqCst);
            }
        }
    }
    handles
}

/// Builds one (node, thread): the runtime on `ep` (through the fault injector if
/// `spec.fault`), reading `clock`; the transaction layer on it with `db`; the history
/// sink; and `spec.coroutines` workers, coroutine c running `worker(WorkerCtx { .. c })`.
/// `done(c)` runs once coroutine c's worker returned and every installation its
/// transactions left to the committer (passive ACK) is finished.
/// `spec.duration` and `spec.history` are the caller's business.
#[allow(clippy::too_many_arguments)]
pub fn start_thread<F, Fut, D>(
    ep: Box<dyn Endpoint>,
    clock: Arc<dyn Clock>,
    spec: &RunSpec,
    db: Arc<NodeDb>,
    history: Option<Box<dyn HistorySink>>,
    stop: Arc<AtomicBool>,
    worker: F,
    done: D,
) -> Result<(Runtime, Rc<TxnThread>), StartError>
where
    F: Fn(WorkerCtx) -> Fut + 'static,
    Fut: Future<Output = ()> + 'static,
    D: Fn(usize) + 'static,
{
    let addr = ep.addr();
    let (node, thread) = (addr.node, addr.thread);
    let ep = match &spec.fault {
        Some(f) => {
            FaultyEndpoint::wrap(ep, f.clone()).map_err(|source| StartError::FaultInjector {
                node,
                thread,
                source,
            })?
        }
        None => ep,
    };
    let mut rt =
        Runtime::with_clock(ep, spec.rpc.clone(), clock).map_err(|source| StartError::Runtime {
            node,
            thread,
            source,
        })?;
    let th = TxnThread::install(&mut rt, db.clone(), spec.txn.clone());
    if let Some(h) = history {
        th.set_history(h);
    }
    // The start-up check of the other nodes' tables (once the catalog is known, or
    // after asking the other nodes for it), on thread 0, by a coroutine spawned after
    // the workers (their ids stay 0..coroutines); the workers wait for it.
    let verify = addr.thread == 0 && db.checks_at_start();
    let max_message = rt.max_message();
    let (scratch, per_worker) = db
        .scratch_region(addr.thread)
        .ok_or(StartError::NoScratch { node, thread })?;
    rt.attach_scratch(scratch, per_worker)
        .map_err(|source| StartError::Scratch {
            node,
            thread,
            source,
        })?;
    let (worker, done) = (Rc::new(worker), Rc::new(done));
    // With a catalog (or one to ask for), every thread's workers start once the node's
    // start-up check has passed; if it (or the exchange) failed they start with `stop`
    // set (they return at once, and the run reports the error).
    let gated = db.checks_at_start();
    let exchanging = db.catalog_exchange().is_some();
    let coroutines = spec.coroutines;
    for c in 0..coroutines {
        let (th, worker, stop, db) = (th.clone(), worker.clone(), stop.clone(), db.clone());
        let done = done.clone();
        th.worker_started();
        rt.spawn(move |ctx| async move {
            let (done_ctx, done_th) = (ctx.clone(), th.clone());
            while gated && !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match db.verification() {
                    // A catalog exchange can wait seconds for a node starting late:
                    // yielding workers would spin the cores meanwhile.
                    None if exchanging => ctx.pause().await,
                    None => ctx.yield_now().await,
                    Some(Ok(_)) => break,
                    Some(Err(_)) => stop.store(true, std::sync::atomic::Ordering::SeqCst),
                }
            }
            worker(WorkerCtx {
                ctx,
                th,
                node: addr.node,
                thread: addr.thread,
                coroutine: c,
                coroutines,
                stop,
            })
            .await;
            // With passive ACK, the worker's installations finish before it counts
            // as done (the run's end checks replicas and invariants).
            done_th.worker_finished(&done_ctx).await;
            done(c);
        });
    }
    if verify {
        rt.spawn(move |ctx| async move {
            // No launcher gave this node the catalog: the other nodes do.
            if let (None, Some(within)) = (db.catalog(), db.catalog_exchange()) {
                let got = crate::catalog_exchange::fetch_catalog(&ctx, &db, max_message, within)
                    .await
                    .and_then(|cat| Ok(db.set_catalog(cat)?));
                if let Err(e) = got {
                    db.record_verification(Err(e.into()));
                    return;
                }
            }
            let state = db.cluster().clone();
            let member = || state.config.with(|c| c.placement.is_member(db.node));
            // A restarted node checks once it is admitted and running: until then it
            // is not a member, and the others' tables are not its business yet.
            if !member() {
                while !(member() && state.running(ctx.step_ns())) {
                    if state.fenced() || stop.load(Ordering::Relaxed) {
                        db.record_verification(Err(StartupCheckError::NotJoined { node: db.node }));
                        return;
                    }
                    ctx.yield_now().await;
                }
            }
            // A check cut short by a new epoch (a READ failed with it) is made again.
            let r = loop {
                let e = state.config.epoch();
                let r = db.verify_remote_tables(&ctx).await;
                if r.is_ok() || state.config.epoch() == e || state.fenced() {
                    break r;
                }
            };
            db.record_verification(r);
        });
    }
    // After the start-up check's coroutine, whose id must stay within the scratch.
    TxnThread::spawn_committers(&th, &mut rt, spec.coroutines);
    Ok((rt, th))
}

/// What a node thread reports when it ends: its transaction and RPC counters, its
/// transport counters, and how many of its coroutines had not finished.
pub type ThreadResult = (TxnStats, RpcStats, CounterSnapshot, usize);

/// The end of a node thread whose workers are done: serves 20 ms more so that the last
/// responses and retransmissions land, flushes its history, and reports. `background`
/// counts the thread's own recovery and copy coroutines still running, which are not
/// counted as stuck workers.
pub fn finish_thread(
    rt: &mut Runtime,
    th: &TxnThread,
    background: impl Fn() -> usize,
) -> ThreadResult {
    let until = Instant::now() + Duration::from_millis(20);
    rt.run_until(|_| Instant::now() >= until);
    let stuck = rt.live_tasks().saturating_sub(background());
    if let Some(mut h) = th.take_history() {
        h.flush();
    }
    (th.stats(), rt.stats(), rt.endpoint_counters(), stuck)
}
