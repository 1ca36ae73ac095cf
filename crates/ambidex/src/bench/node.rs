//! One node of a cluster whose nodes run in separate processes (`ambidex node`,
//! docs/cluster.md): load this node's share of the workload, run its threads' workers
//! through the phases the launcher calls (warmup, measure, stop), keep serving the other
//! nodes until the launcher says every node's workers have finished, then check this
//! node's data and report.
//!
//! The in-process runner (`ambidex_txn::runner`) keeps its runtimes serving until every
//! worker of the whole cluster has returned, with a counter shared by all nodes; across
//! processes that counter is the launcher's: a node says when its own workers are done
//! ([`RunningNode::workers_done`]) and serves on until [`RunningNode::finish`].

use crate::bench::combine::{replica_digests, NodeReport, ReplicaDigest};
use crate::bench::driver::{make_worker, Tally, WorkloadVisitor, MEASURE, STOP, WARMUP};
use crate::bench::load::build_and_load_node;
use crate::bench::{BenchError, NodeError};
use crate::config::Config;
use crate::workload::{Registry, Workload};
use ambidex_cluster::{ClusterState, Stage};
use ambidex_rpc::RpcStats;
use ambidex_store::{Catalog, LogRegionDesc, TableDesc};
use ambidex_transport::{cputime, CounterSnapshot, NodeId, SharedNode};
use ambidex_txn::log_ring::LogRingConfig;
use ambidex_txn::runner::{spawn_node, Crew, RunSpec, Serve, Worker};
use ambidex_txn::{Configuration, NodeDb, Placement, Policy, RunError, TxnStats};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

type MakeWorker = Box<dyn Fn(Arc<Mutex<Tally>>, Arc<AtomicU8>) -> Worker + Send>;
type Check =
    Box<dyn Fn(&Arc<NodeDb>) -> (Result<serde_json::Value, String>, Vec<ReplicaDigest>) + Send>;

/// A node's final check: its tables had room for everything they were given, then the
/// workload's own share of the check; and its copies' digests.
fn node_check<W: Workload>(wl: Arc<W>) -> Check {
    Box::new(move |db| {
        let check = db
            .room_check()
            .map_err(|e| e.to_string())
            .and_then(|()| wl.check_node(db).map_err(|e| e.to_string()));
        (check, replica_digests(&*wl, db))
    })
}

/// A node whose database is loaded (its tables in regions of its transport), waiting
/// for the cluster's catalog ([`LoadedNode::set_catalog`]) and then the start.
pub struct LoadedNode {
    node: NodeId,
    transport: SharedNode,
    threads: u16,
    /// How every thread is built (RPC, transaction layer, fault injector, coroutines).
    spec: RunSpec,
    /// Records this node's transactions to this JSON-lines file.
    history: Option<std::path::PathBuf>,
    types: usize,
    db: Arc<NodeDb>,
    /// Wall time (s) this node took to build its tables and load its share.
    pub load_seconds: f64,
    make_worker: MakeWorker,
    check: Check,
    /// 1 for a node loaded at the start; a node restarted during the run
    /// ([`rejoin_node`]) is its next incarnation.
    incarnation: u64,
    /// 10 ms buckets of the run that passed before this node started (a restarted node
    /// starts its timeline late; its report pads it so that buckets line up).
    timeline_offset: usize,
}

/// Builds the database of `transport`'s node (opened first: the tables live in regions
/// registered on it) and loads its share of the workload `cfg` describes
/// (`cfg.run.progress`: a progress bar on stderr).
pub fn load_node(
    reg: &Registry,
    cfg: &Config,
    transport: SharedNode,
) -> Result<LoadedNode, NodeError> {
    cfg.validate()?;
    let node = transport.node();
    same_threads(&transport, cfg)?;
    let cfg = &reg.resolve(cfg)?;
    reg.entry(&cfg.run.workload)?.load(
        cfg,
        Load {
            cfg,
            node,
            transport,
        },
    )
}

/// The transport's threads are the run's.
fn same_threads(transport: &SharedNode, cfg: &Config) -> Result<(), NodeError> {
    let transport = transport.config().threads_per_node;
    if transport != cfg.cluster.threads {
        return Err(NodeError::Threads {
            transport,
            run: cfg.cluster.threads,
        });
    }
    Ok(())
}

/// [`load_node`] for a registered workload.
pub(crate) struct Load<'a> {
    cfg: &'a Config,
    node: NodeId,
    transport: SharedNode,
}
impl WorkloadVisitor<LoadedNode, NodeError> for Load<'_> {
    fn visit<W: Workload>(self, wl: Arc<W>, placement: Placement) -> Result<LoadedNode, NodeError> {
        let cfg = self.cfg;
        let t0 = Instant::now();
        let db = build_and_load_node(
            &*wl,
            placement,
            &self.transport,
            cfg.run.seed,
            cfg.run.progress,
        )?;
        let load_seconds = t0.elapsed().as_secs_f64();
        let seed = cfg.run.seed;
        let retries = cfg.run.retry_aborts;
        let (w1, w2) = (wl.clone(), wl.clone());
        Ok(LoadedNode {
            node: self.node,
            transport: self.transport,
            threads: cfg.cluster.threads,
            spec: cfg.run_spec(cfg.coroutines(), Some(self.node))?,
            history: cfg.run.history_for(self.node),
            types: wl.txn_types().len(),
            db,
            load_seconds,
            make_worker: Box::new(move |total, phase| {
                make_worker(w1.clone(), total, phase, seed, retries)
            }),
            check: node_check(w2),
            incarnation: 1,
            timeline_offset: 0,
        })
    }
}

/// The node of `transport` restarted during a run (`bench --restart`): an empty
/// database with the workload's tables and log rings, in new regions, in `config` (the
/// cluster's current configuration, which no longer has this node as a member), for
/// incarnation `incarnation`. Nothing is loaded: once it joins, re-replication copies
/// its partitions' rows to it. `run_ms`: how long the run has been going (its timeline
/// is padded by that much).
pub fn rejoin_node(
    reg: &Registry,
    cfg: &Config,
    transport: SharedNode,
    config: Configuration,
    incarnation: u64,
    run_ms: f64,
) -> Result<LoadedNode, NodeError> {
    cfg.validate()?;
    if incarnation < 2 {
        return Err(NodeError::Incarnation(incarnation));
    }
    let node = transport.node();
    same_threads(&transport, cfg)?;
    if config.placement.nodes() != cfg.cluster.nodes || config.placement.is_member(node) {
        return Err(NodeError::CannotRejoin {
            node,
            nodes: config.placement.nodes(),
            still_member: config.placement.is_member(node),
        });
    }
    let cfg = &reg.resolve(cfg)?;
    reg.entry(&cfg.run.workload)?.rejoin(
        cfg,
        Rejoin {
            cfg,
            node,
            transport,
            config,
            incarnation,
            run_ms,
        },
    )
}

/// [`rejoin_node`] for a registered workload.
pub(crate) struct Rejoin<'a> {
    cfg: &'a Config,
    node: NodeId,
    transport: SharedNode,
    config: Configuration,
    incarnation: u64,
    run_ms: f64,
}
impl WorkloadVisitor<LoadedNode, NodeError> for Rejoin<'_> {
    fn visit<W: Workload>(
        self,
        wl: Arc<W>,
        _placement: Placement,
    ) -> Result<LoadedNode, NodeError> {
        let cfg = self.cfg;
        let t0 = Instant::now();
        // The tables and rings every node has (`load::build_nodes`, `NodeDb::new`),
        // so its descriptors have the layout the others' threads expect.
        let db = NodeDb::with_config(
            &*self.transport,
            self.config,
            &wl.tables(),
            LogRingConfig::default(),
        )?;
        db.set_incarnation(self.incarnation);
        // Not the first incarnation's transactions again.
        let seed = cfg.run.seed ^ self.incarnation.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let retries = cfg.run.retry_aborts;
        let (w1, w2) = (wl.clone(), wl.clone());
        Ok(LoadedNode {
            node: self.node,
            transport: self.transport,
            threads: cfg.cluster.threads,
            spec: cfg.run_spec(cfg.coroutines(), Some(self.node))?,
            history: cfg.run.history_for(self.node).map(|p| {
                // The first incarnation's file stays as it was.
                let mut s = p.into_os_string();
                s.push(format!(".inc{}", self.incarnation));
                s.into()
            }),
            types: wl.txn_types().len(),
            db,
            load_seconds: t0.elapsed().as_secs_f64(),
            make_worker: Box::new(move |total, phase| {
                make_worker(w1.clone(), total, phase, seed, retries)
            }),
            check: node_check(w2),
            incarnation: self.incarnation,
            timeline_offset: (self.run_ms.max(0.0) / 10.0) as usize,
        })
    }
}

/// A node whose threads are running (from `start` until `finish`).
pub struct RunningNode {
    node: NodeId,
    policy: Policy,
    db: Arc<NodeDb>,
    load_seconds: f64,
    check: Check,
    phase: Arc<AtomicU8>,
    /// This node's workers (`live`), its serving (`drain`: set by `finish`, every node's
    /// workers are done), the workers' own stop flag (set by `abort`), thread errors.
    crew: Crew,
    handles: Vec<JoinHandle<()>>,
    total: Arc<Mutex<Tally>>,
    types: usize,
    recorder: Option<ambidex_history::Recorder>,
    measure_start: Option<(f64, Instant)>,
    /// (CPU seconds, wall seconds) of the measured window.
    measured: (f64, f64),
    incarnation: u64,
    timeline_offset: usize,
}

impl LoadedNode {
    /// The transaction policy this node's threads will run (what its `ready` event
    /// carries, for the launcher to check against the cluster's).
    pub fn policy(&self) -> Policy {
        self.spec.txn.policy
    }

    /// The descriptors of this node's tables (what its `ready` event carries).
    pub fn table_descs(&self) -> Vec<TableDesc> {
        self.db.table_descs()
    }

    /// The descriptor of this node's log region (its `ready` event carries it too).
    pub fn log_region_desc(&self) -> LogRegionDesc {
        self.db.log_region_desc()
    }

    /// What this node's threads and its cluster agent share (`NodeDb::cluster`).
    pub fn cluster_state(&self) -> Arc<ambidex_cluster::NodeState> {
        self.db.cluster().clone()
    }

    /// This node's incarnation: 1, or more for a node restarted during the run.
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The cluster's catalog (every node's descriptors, from the launcher), once.
    pub fn set_catalog(&self, cat: Catalog) -> Result<(), NodeError> {
        Ok(self.db.set_catalog(cat)?)
    }

    /// Starts every thread of this node on its transport, workers in the warmup phase:
    /// nothing is counted until [`RunningNode::measure`]. Thread 0 runs the start-up
    /// check of the other nodes' tables. Refused without the catalog.
    pub fn start(self) -> Result<RunningNode, NodeError> {
        if self.db.catalog().is_none() {
            return Err(NodeError::NoCatalog(self.node));
        }
        let transport = self.transport;
        let recorder = match &self.history {
            Some(path) => Some(ambidex_history::Recorder::create(path).map_err(|source| {
                BenchError::History {
                    path: path.display().to_string(),
                    source,
                }
            })?),
            None => None,
        };
        let mut spec = self.spec;
        spec.history = recorder.clone().map(|rec| {
            let f: ambidex_txn::runner::SinkFactory =
                Arc::new(move |_, _| Box::new(ambidex_txn::history::RecorderSink(rec.thread())));
            f
        });
        let total = Arc::new(Mutex::new(Tally::new(self.types)));
        let phase = Arc::new(AtomicU8::new(WARMUP));
        let worker: Worker = (self.make_worker)(total.clone(), phase.clone());
        let crew = Crew::new(self.threads as usize * spec.coroutines);
        let handles = spawn_node(
            transport,
            self.db.clone(),
            &spec,
            worker,
            &crew,
            Serve::UntilDrained,
        );
        Ok(RunningNode {
            node: self.node,
            policy: spec.txn.policy,
            db: self.db,
            load_seconds: self.load_seconds,
            check: self.check,
            phase,
            crew,
            handles,
            total,
            types: self.types,
            recorder,
            measure_start: None,
            measured: (0.0, 0.0),
            incarnation: self.incarnation,
            timeline_offset: self.timeline_offset,
        })
    }
}

impl RunningNode {
    /// Starts the measured window: transactions finishing from now on are counted.
    pub fn measure(&mut self) {
        self.measure_start = Some((cputime::process_cpu_seconds(), Instant::now()));
        self.phase.store(MEASURE, Ordering::SeqCst);
    }

    /// Ends the measured window; every worker finishes its transaction and returns.
    pub fn stop(&mut self) {
        self.phase.store(STOP, Ordering::SeqCst);
        if let Some((c0, t0)) = self.measure_start.take() {
            self.measured = (
                cputime::process_cpu_seconds() - c0,
                t0.elapsed().as_secs_f64(),
            );
        }
    }

    /// Node `node` restarted with new regions: its descriptors in this node's catalog
    /// are replaced (`NodeDb::replace_in_catalog`; before the new incarnation joins).
    pub fn replace_in_catalog(
        &self,
        node: NodeId,
        tables: Vec<TableDesc>,
        log: LogRegionDesc,
    ) -> Result<(), NodeError> {
        Ok(self.db.replace_in_catalog(node, tables, log)?)
    }

    /// True once every worker of this node has returned (the node still serves
    /// requests); an error if a thread of this node failed.
    pub fn workers_done(&self) -> Result<bool, NodeError> {
        if let Some(e) = self.crew.error.lock().unwrap().clone() {
            return Err(RunError::Failed(vec![e]).into());
        }
        if let Some(Err(e)) = self.db.verification() {
            return Err(e.into());
        }
        Ok(self.crew.live.load(Ordering::SeqCst) == 0)
    }

    /// Every node's workers are done: stops serving, checks this node's data and
    /// returns its report. With `last`, the manager's final state, this node checks
    /// under that configuration (see [`check_under`]).
    pub fn finish(mut self, last: Option<&ClusterState>) -> Result<NodeReport, NodeError> {
        self.phase.store(STOP, Ordering::SeqCst);
        self.crew.drain.store(true, Ordering::SeqCst);
        for h in std::mem::take(&mut self.handles) {
            h.join().map_err(|_| NodeError::ThreadPanicked)?;
        }
        if let Some(e) = self.crew.error.lock().unwrap().clone() {
            return Err(RunError::Failed(vec![e]).into());
        }
        if let Some(rec) = &self.recorder {
            rec.flush().map_err(NodeError::HistoryWrite)?;
        }
        let (mut txn, mut rpc) = (TxnStats::default(), RpcStats::default());
        let mut counters = CounterSnapshot::default();
        let mut stuck = 0;
        for (t, r, c, s) in self.crew.results.lock().unwrap().iter() {
            txn.merge(t);
            rpc.merge(r);
            counters.merge(c);
            stuck += s;
        }
        let tally = std::mem::replace(&mut *self.total.lock().unwrap(), Tally::new(self.types));
        check_under(&self.db, last)?;
        let (mut check, digests) = (self.check)(&self.db);
        if self.incarnation > 1 {
            // A restarted node loaded nothing and counted only its new incarnation's
            // work: the combined check must not take it for a node loaded at the start.
            if let Ok(serde_json::Value::Object(m)) = &mut check {
                m.insert("incarnation".into(), self.incarnation.into());
            }
        }
        let mut r = NodeReport::new(
            self.node, tally, &txn, &rpc, counters, stuck, check, digests,
        );
        r.policy = self.policy;
        r.load_seconds = self.load_seconds;
        r.remote_tables_verified = self.db.remote_tables_verified()? as u64;
        r.cpu_seconds = self.measured.0;
        r.measured_s = self.measured.1;
        r.max_rss_bytes = cputime::max_rss_bytes();
        if self.timeline_offset > 0 && !r.timeline_10ms.is_empty() {
            let mut t = vec![0; self.timeline_offset];
            t.append(&mut r.timeline_10ms);
            r.timeline_10ms = t;
        }
        Ok(r)
    }

    /// Stops the workers and the threads without a report (the run failed elsewhere).
    pub fn abort(self) {
        self.crew.stop.store(true, Ordering::SeqCst);
        self.phase.store(STOP, Ordering::SeqCst);
        self.crew.drain.store(true, Ordering::SeqCst);
    }
}

/// Moves `db` (its threads stopped) to the manager's final configuration before its
/// check. Each node counts the rows it is primary of, so the nodes must count with
/// one placement: a node whose agent stopped before it saw the last epoch would
/// otherwise count a partition the new primary counts too, or one no node counts.
/// A final state that is not at stage Run (the run ended mid-reconfiguration) cannot be
/// checked this way: an error. Without `last` (no manager), nothing changes.
pub fn check_under(db: &NodeDb, last: Option<&ClusterState>) -> Result<(), NodeError> {
    let Some(last) = last else { return Ok(()) };
    if last.stage != Stage::Run {
        return Err(NodeError::Unsettled {
            epoch: last.config.epoch,
            stage: format!("{:?}", last.stage),
        });
    }
    let state = db.cluster();
    let epoch = state.config.epoch();
    if last.config.epoch < epoch {
        return Err(NodeError::StaleFinalState {
            node: db.node,
            last: last.config.epoch,
            mine: epoch,
        });
    }
    // The same epoch has the same primaries (the configurations may differ only in
    // which new copies are synced), so only a newer one is entered.
    if last.config.epoch > epoch {
        state.enter(last.config.clone(), Stage::Run);
    }
    Ok(())
}
