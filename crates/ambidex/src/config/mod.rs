//! The one configuration of a run, used by every path: in-process runs (`ambidex bench
//! W`), node processes (`ambidex node --config FILE --node I`) and the simulator
//! (`ambidex sim`). A [`Config`] is read from a TOML or JSON file (by extension) laid over
//! the path's defaults ([`Config::read`]), then command-line overrides are set on its
//! fields, then [`Config::validate`] checks it; every bad value is a [`ConfigError`].
//!
//! It lives in the facade (`ambidex`) because it is turned into the settings of the
//! layers below (`RuntimeConfig`, `TxnConfig`, `ClusterConfig`, `FaultConfig`,
//! `RunSpec`: [`Config::run_spec`]) and every path above (the application API, the
//! workloads, the simulator, the CLI) takes it.
//!
//! Sections: `cluster` (transport and shape), `rpc` (the runtime's user-facing settings),
//! `txn` (the transaction-policy preset and per-phase overrides), `fault` (the transport's fault injector, node
//! and in-process runs), `run` (workload and its parameters) and `sim` (knobs only the
//! simulator reads).
//!
//! Files: the types and their defaults here; [`ConfigError`] in `error`; reading a file
//! over a path's defaults in `file`; checking and converting to the layers' settings in
//! `check`; the per-phase policy keys and their names in `policy`.

mod check;
mod error;
mod file;
mod policy;
#[cfg(test)]
mod tests;

pub use check::fresh_etcd_cluster;
pub use error::ConfigError;
pub use policy::{describe as describe_policy, phases as policy_phases, PhaseChoice};

use ambidex_rpc::RuntimeConfig;
use ambidex_transport::{ClusterConfig, NodeId};
use ambidex_txn::Placement;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

/// The transaction-policy presets (DrTM+H Table 4): the transaction layer's own list.
pub use ambidex_txn::policy::PRESETS;
/// The per-phase choices a `[txn]` section may override.
pub use ambidex_txn::policy::{Commit, Execute, Lock, Log, PassiveAck, Validate};

/// TPC-C's warehouses per node by default: DrTM+H's 384 warehouses on 16 machines (§5).
pub const DEFAULT_WAREHOUSES_PER_NODE: u64 = 24;

/// Worker coroutines per thread when neither the configuration nor its workload says.
pub const DEFAULT_COROUTINES: usize = 20;

/// Everything a run is configured by. Defaults are `ambidex bench`'s.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `[cluster]`: the transport and the cluster's shape.
    pub cluster: ClusterSection,
    /// `[rpc]`: retransmission and batching of the RPC runtime.
    pub rpc: RpcSection,
    /// `[txn]`: the transaction policy.
    pub txn: TxnSection,
    /// The transport's fault injector on every endpoint (off when absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fault: Option<FaultSection>,
    /// `[run]`: the workload and its parameters.
    pub run: RunSection,
    /// `[sim]`: what only the simulator reads.
    pub sim: SimSection,
}

/// The transport backends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// Every node is a thread of this process.
    #[default]
    Local,
    /// Processes on one host, rings and regions in shared memory.
    Shm,
    /// Hosts (or processes on loopback), UDP datagrams.
    Udp,
}

impl Transport {
    /// The name a configuration and the command line give it: `local`, `shm`, `udp`.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Local => "local",
            Transport::Shm => "shm",
            Transport::Udp => "udp",
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Transport {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "local" => Ok(Transport::Local),
            "shm" => Ok(Transport::Shm),
            "udp" => Ok(Transport::Udp),
            _ => Err(ConfigError::UnknownName {
                what: "transport",
                name: s.to_string(),
                known: "local, shm, udp",
            }),
        }
    }
}

/// The cluster: transport, shape, addresses, replication.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSection {
    /// How the nodes exchange datagrams and reach each other's regions.
    pub transport: Transport,
    /// Nodes in the cluster (ids 0..nodes).
    pub nodes: u16,
    /// Threads (runtimes) per node.
    pub threads: u16,
    /// Copies of every key (primary + backups).
    pub replication: u16,
    /// Tells clusters sharing a network apart (default: ambidex's fixed id).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<u64>,
    /// Largest datagram payload in bytes (default: the transport's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtu: Option<usize>,
    /// Receive-queue depth of every endpoint, in datagrams (default: the transport's);
    /// the RPC credits are derived from it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recv_depth: Option<usize>,
    /// shm: the cluster directory (the launcher makes a fresh one when absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shm_dir: Option<PathBuf>,
    /// udp: every node's base address, `IP:PORT` (thread t listens on PORT + t). The
    /// launcher picks loopback ports when absent.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub udp_addrs: Vec<SocketAddr>,
    /// Who decides the cluster's membership: `embedded` (the launcher, or the process of
    /// an in-process run, hosts the configuration manager; node processes hold leases
    /// from it), `etcd` (the state and the leases live in the etcd at `etcd_endpoints`;
    /// builds with the cargo feature `etcd` only) or `none` (no leases: a node that
    /// dies fails the run).
    pub manager: ManagerKind,
    /// With `manager = "etcd"`: etcd's client URLs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub etcd_endpoints: Vec<String>,
    /// With `manager = "etcd"`: the cluster's name in etcd (its keys' prefix). It must
    /// not exist yet: each run creates it. Default: a fresh name per run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etcd_cluster: Option<String>,
    /// The lease period (ms) with a manager; nodes renew at a fifth of it.
    pub lease_ms: u64,
    /// After a failure, how fast each primary copies its partitions to their new
    /// backups (MiB/s per node), in the background while transactions run.
    pub rereplication_mb_per_s: f64,
}

/// The configuration manager of a run (`cluster.manager`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ManagerKind {
    /// No manager, no leases: a node that dies fails the run.
    None,
    /// One manager in the launcher (or this process, for an in-process run).
    #[default]
    Embedded,
    /// The state and the leases in etcd; every node takes the manager's decisions.
    Etcd,
}

impl ManagerKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            ManagerKind::None => "none",
            ManagerKind::Embedded => "embedded",
            ManagerKind::Etcd => "etcd",
        }
    }
}

impl std::str::FromStr for ManagerKind {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "none" => Ok(ManagerKind::None),
            "embedded" => Ok(ManagerKind::Embedded),
            "etcd" => Ok(ManagerKind::Etcd),
            _ => Err(ConfigError::UnknownName {
                what: "manager",
                name: s.to_string(),
                known: "none, embedded, etcd",
            }),
        }
    }
}

impl Default for ClusterSection {
    fn default() -> Self {
        ClusterSection {
            transport: Transport::Local,
            nodes: 3,
            threads: 1,
            replication: 3,
            cluster_id: None,
            mtu: None,
            recv_depth: None,
            shm_dir: None,
            udp_addrs: Vec::new(),
            manager: ManagerKind::Embedded,
            etcd_endpoints: Vec::new(),
            etcd_cluster: None,
            lease_ms: 50,
            rereplication_mb_per_s: (ambidex_txn::REREPLICATION_BYTES_PER_S >> 20) as f64,
        }
    }
}

/// RPC retransmission and batching. A request unanswered for a timeout derived from the
/// measured round trip (at least `rto_min_ms`, at most `rto_max_ms`, doubling while the
/// destination stays silent) is sent again; one unanswered `give_up_ms` after it was
/// first sent has its destination suspected failed and the transaction aborts: make
/// `give_up_ms` longer than the longest expected outage. `rto_min_ms = give_up_ms`
/// means no retransmission (FaSST).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RpcSection {
    /// Floor of the retransmission timeout (ms), which otherwise follows the measured
    /// round trip.
    pub rto_min_ms: f64,
    /// Ceiling of the retransmission timeout (ms), which doubles on every expiry.
    pub rto_max_ms: f64,
    /// A request unanswered this long (ms) after it was first sent fails, and its
    /// destination is suspected failed.
    pub give_up_ms: f64,
    /// Coalesce requests (and responses) to one endpoint into one datagram.
    pub coalesce: bool,
    /// Overrides the per-(thread, destination) credit budget derived from recv_depth.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credits: Option<u32>,
}

impl Default for RpcSection {
    fn default() -> Self {
        let d = RuntimeConfig::default();
        RpcSection {
            rto_min_ms: d.rto_min.as_secs_f64() * 1000.0,
            rto_max_ms: d.rto_max.as_secs_f64() * 1000.0,
            give_up_ms: d.give_up.as_secs_f64() * 1000.0,
            coalesce: d.coalesce,
            credits: d.credits,
        }
    }
}

/// A deliberately broken protocol, to show that the checks catch it (tests only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InjectedBug {
    /// `TxnConfig::skip_validation_for_tests`: commit without validating the read set.
    SkipValidation,
    /// `TxnConfig::recovery_skips_dead_coordinators_for_tests`: recovery drops the log
    /// records of a dead coordinator's transactions.
    RecoverySkipsDeadCoordinators,
    /// The simulator restarts a crashed node in the configuration that still has its
    /// crashed incarnation as a member, so the new one answers that epoch's requests
    /// from its empty store (`crash-restart` profile; no effect elsewhere).
    JoinerServesOldEpoch,
}

impl InjectedBug {
    /// Its name in a configuration and on the command line (`--inject-bug NAME`).
    pub fn name(self) -> &'static str {
        match self {
            InjectedBug::SkipValidation => "skip-validation",
            InjectedBug::RecoverySkipsDeadCoordinators => "recovery-skips-dead-coordinators",
            InjectedBug::JoinerServesOldEpoch => "joiner-serves-old-epoch",
        }
    }
}

impl std::str::FromStr for InjectedBug {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "skip-validation" => Ok(InjectedBug::SkipValidation),
            "recovery-skips-dead-coordinators" => Ok(InjectedBug::RecoverySkipsDeadCoordinators),
            "joiner-serves-old-epoch" => Ok(InjectedBug::JoinerServesOldEpoch),
            _ => Err(ConfigError::UnknownName {
                what: "injected bug",
                name: s.to_string(),
                known: "skip-validation, recovery-skips-dead-coordinators, joiner-serves-old-epoch",
            }),
        }
    }
}

/// The transaction layer: the policy (a preset, then per-phase overrides) and (tests
/// only) a broken protocol. [`TxnSection::txn_config`] is the one place they become the
/// run's `Policy`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TxnSection {
    /// The preset (DrTM+H Table 4): `fasst`, `farm`, `drtm-r` or `drtm-h`.
    pub mode: String,
    /// Overrides the preset's execute: `rpc`, `onesided`, `cached`, `hybrid`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execute: Option<Execute>,
    /// Overrides the preset's lock: `rpc`, `cas`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock: Option<Lock>,
    /// Overrides the preset's validate: `rpc`, `read`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub validate: Option<Validate>,
    /// Overrides the preset's log: `rpc`, `write`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log: Option<Log>,
    /// Overrides the preset's commit: `rpc`, `write`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<Commit>,
    /// Overrides the preset's passive ACK: `on`, `off`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub passive_ack: Option<PassiveAck>,
    /// TEST ONLY: run a deliberately broken protocol.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inject_bug: Option<InjectedBug>,
}

impl Default for TxnSection {
    fn default() -> Self {
        TxnSection {
            mode: "fasst".into(),
            execute: None,
            lock: None,
            validate: None,
            log: None,
            commit: None,
            passive_ack: None,
            inject_bug: None,
        }
    }
}

/// Probabilities (0..=1) of each fault the transport's injector applies to every
/// datagram a node sends (`ambidex_transport::fault`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FaultSection {
    /// Seed of the injector's random stream (each node's is derived from it).
    pub seed: u64,
    /// Dropped.
    pub drop: f64,
    /// Delivered twice.
    pub duplicate: f64,
    /// Held back until after the endpoint's next batch.
    pub reorder: f64,
    /// Held back for a random time up to `max_delay_us`.
    pub delay: f64,
    /// Longest delay (µs) of a delayed datagram; at most 10 s.
    pub max_delay_us: u64,
}

impl Default for FaultSection {
    fn default() -> Self {
        FaultSection {
            seed: 1,
            drop: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            delay: 0.0,
            max_delay_us: 2000,
        }
    }
}

/// O(r, w) parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ObjStoreParams {
    /// Keys read per transaction (r).
    pub reads: usize,
    /// Of those, keys updated (w ≤ r).
    pub writes: usize,
    /// Allow several keys of a transaction on one primary (default: distinct primaries
    /// where r ≤ nodes, as FaSST's O(r, w) avoids coalescing).
    pub same_node: bool,
}

/// The run every node performs: the workload and its parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunSection {
    /// The workload's name, as registered (`ambidex_workloads` registers the built-in
    /// ones: smallbank, tatp, tpcc, tpcc-no, object-store, stress, tpce).
    pub workload: String,
    /// Worker coroutines per thread (default: the workload's, see
    /// its registration's `default_coroutines`; the simulator's is 4).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub coroutines: Option<usize>,
    /// Measured seconds.
    pub duration_s: f64,
    /// Seconds run before measuring.
    pub warmup_s: f64,
    /// Multiplier of the paper-scale population (default: its registration's `default_scale`,
    /// or the simulator's tiny one). 1.0 is: object store 1,000,000 keys per thread;
    /// TATP 1,000,000 subscribers per node; SmallBank 100,000 accounts per thread; TPC-C
    /// spec-size tables per warehouse (at most 1; its size is `warehouses_per_node`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scale: Option<f64>,
    /// Seed of the loader's and the workers' random streams (the simulator: of the
    /// whole run).
    pub seed: u64,
    /// Object store: keys read per transaction (r).
    pub r: usize,
    /// Object store: of those, keys written (w).
    pub w: usize,
    /// Object store: allow several keys of a transaction on one primary.
    pub same_node: bool,
    /// TPC-C: warehouses per node (default [`DEFAULT_WAREHOUSES_PER_NODE`], DrTM+H's
    /// 384 warehouses on 16 machines), dealt out evenly to its threads (rounded down to
    /// a multiple of the threads, at least one per thread).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warehouses_per_node: Option<u64>,
    /// TPC-C NewOrder: fetch its independent records (stock rows of every supply
    /// warehouse, items) in parallel, speculating past values not yet used (DrTM+H
    /// §6.1, outstanding requests); off: one record per round trip, in the order the
    /// transaction uses them (DrTM+H §5's phase study).
    pub outstanding_requests: bool,
    /// Try a transaction aborted for a transient reason (a conflict, a timeout, a
    /// reconfiguration) again from the same inputs, as the papers' drivers do, up to
    /// `MAX_ATTEMPTS` times; off: every worker draws a new transaction after an abort.
    pub retry_aborts: bool,
    /// Record every transaction to this JSON-lines file (docs/history-format.md). A
    /// node process writes it with `{node}` replaced by its id, or `.nodeI` appended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history: Option<String>,
    /// Show a progress bar while loading: the command line's choice, not a setting of
    /// the file.
    #[serde(skip)]
    pub progress: bool,
}

impl Default for RunSection {
    fn default() -> Self {
        RunSection {
            workload: "smallbank".into(),
            coroutines: None,
            duration_s: 5.0,
            warmup_s: 1.0,
            scale: None,
            seed: 42,
            r: 4,
            w: 2,
            same_node: false,
            warehouses_per_node: None,
            outstanding_requests: true,
            retry_aborts: true,
            history: None,
            progress: false,
        }
    }
}

impl RunSection {
    /// The path node `node` records its history to, if any.
    pub fn history_for(&self, node: NodeId) -> Option<PathBuf> {
        self.history.as_ref().map(|h| {
            if h.contains("{node}") {
                PathBuf::from(h.replace("{node}", &node.to_string()))
            } else {
                PathBuf::from(format!("{h}.node{node}"))
            }
        })
    }
}

/// Knobs only the simulator reads (`docs/simulation.md`); checked by `ambidex::sim::validate`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimSection {
    /// Scheduler steps (one runtime's master step each) before the workers stop.
    pub steps: u64,
    /// Fault profile: none, lossy, reorder, partition, pause, onesided, chaos.
    pub faults: String,
    /// Scripted partitions, `NODES@FROM..UNTIL` in ms of simulated time.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub partitions: Vec<String>,
    /// Scripted pauses, `NODE@FROM..UNTIL` in ms.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pauses: Vec<String>,
    /// Keep the last this-many network events in the report (0: none).
    pub trace: usize,
}

impl Default for SimSection {
    fn default() -> Self {
        SimSection {
            steps: 2_000,
            faults: "chaos".into(),
            partitions: Vec::new(),
            pauses: Vec::new(),
            trace: 0,
        }
    }
}

impl Config {
    /// Worker coroutines per thread: `run.coroutines`, else [`DEFAULT_COROUTINES`]. A
    /// configuration resolved by a workload registry (`Registry::resolve`) has its
    /// workload's default filled in.
    pub fn coroutines(&self) -> usize {
        self.run.coroutines.unwrap_or(DEFAULT_COROUTINES)
    }

    /// The workload's scale: `run.scale`, else 1 (resolved by a registry: the
    /// workload's default).
    pub fn scale(&self) -> f64 {
        self.run.scale.unwrap_or(1.0)
    }

    /// TPC-C's warehouses per node (`run.warehouses_per_node`, default DrTM+H's 24).
    pub fn warehouses_per_node(&self) -> u64 {
        self.run
            .warehouses_per_node
            .unwrap_or(DEFAULT_WAREHOUSES_PER_NODE)
    }

    /// The object store's O(r, w) parameters (`run.r`, `run.w`, `run.same_node`).
    pub fn objstore(&self) -> ObjStoreParams {
        ObjStoreParams {
            reads: self.run.r,
            writes: self.run.w,
            same_node: self.run.same_node,
        }
    }

    pub(crate) fn placement(&self) -> Result<Placement, ConfigError> {
        Placement::new(self.cluster.nodes, self.cluster.replication).map_err(|e| {
            ConfigError::Invalid {
                field: "cluster.replication",
                why: e.to_string(),
            }
        })
    }

    /// The transport's cluster settings.
    pub fn cluster_config(&self) -> Result<ClusterConfig, ConfigError> {
        self.cluster.cluster_config()
    }

    /// The run's transaction policy, as [`TxnSection::txn_config`] makes it.
    pub fn policy(&self) -> Result<ambidex_txn::Policy, ConfigError> {
        Ok(self.txn.txn_config()?.policy)
    }
}
