//! The one configuration of a run, used by every path: in-process runs (`ambidex bench
//! W`), node processes (`ambidex node --config FILE --node I`) and the simulator
//! (`ambidex sim`). A [`Config`] is read from a TOML or JSON file (by extension) laid over
//! the path's defaults ([`Config::read`]), then command-line overrides are set on its
//! fields, then [`Config::validate`] checks it; every bad value is a [`ConfigError`].
//!
//! It lives in `ambidex-workloads` because it names workloads and is turned into the
//! settings of the layers below (`RuntimeConfig`, `TxnConfig`, `ClusterConfig`,
//! `FaultConfig`), all of which this crate already depends on; the simulator and the CLI
//! depend on this crate.
//!
//! Sections: `cluster` (transport and shape), `rpc` (the runtime's user-facing settings),
//! `txn` (the transaction-policy preset), `fault` (the transport's fault injector, node
//! and in-process runs), `run` (workload and its parameters) and `sim` (knobs only the
//! simulator reads).

use ambidex_rpc::RuntimeConfig;
use ambidex_transport::fault::FaultConfig;
use ambidex_transport::{ClusterConfig, NodeId};
use ambidex_txn::{Placement, TxnConfig};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Transaction-policy presets that exist.
pub const PRESETS: &[&str] = &["fasst"];
/// Presets of the papers that are not built yet (named in the error for them).
pub const NOT_BUILT: &[&str] = &["farm", "drtm-r", "drtm-h"];

/// Largest configuration file read (they are a few hundred bytes in practice).
const MAX_FILE_BYTES: u64 = 1 << 20;

/// Everything a run is configured by. Defaults are `ambidex bench`'s.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub cluster: ClusterSection,
    pub rpc: RpcSection,
    pub txn: TxnSection,
    /// The transport's fault injector on every endpoint (off when absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fault: Option<FaultSection>,
    pub run: RunSection,
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
    pub transport: Transport,
    pub nodes: u16,
    /// Threads (runtimes) per node.
    pub threads: u16,
    /// Copies of every key (primary + backups).
    pub replication: u16,
    /// Tells clusters sharing a network apart (default: ambidex's fixed id).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtu: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recv_depth: Option<usize>,
    /// shm: the cluster directory (the launcher makes a fresh one when absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shm_dir: Option<PathBuf>,
    /// udp: every node's base address, `IP:PORT` (thread t listens on PORT + t). The
    /// launcher picks loopback ports when absent.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub udp_addrs: Vec<SocketAddr>,
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
        }
    }
}

/// RPC retransmission and batching. A request unanswered for `retransmit_timeout_ms` is
/// sent again, and after `max_retries` retransmissions its destination is suspected
/// failed and the transaction aborts: size them so that the longest expected outage is
/// shorter than `retransmit_timeout_ms * (max_retries + 1)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RpcSection {
    pub retransmit_timeout_ms: f64,
    pub max_retries: u32,
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
            retransmit_timeout_ms: d.retransmit_timeout.as_secs_f64() * 1000.0,
            max_retries: d.max_retries,
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
}

impl InjectedBug {
    pub fn name(self) -> &'static str {
        match self {
            InjectedBug::SkipValidation => "skip-validation",
        }
    }
}

impl std::str::FromStr for InjectedBug {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "skip-validation" => Ok(InjectedBug::SkipValidation),
            _ => Err(ConfigError::UnknownName {
                what: "injected bug",
                name: s.to_string(),
                known: "skip-validation",
            }),
        }
    }
}

/// The transaction layer: which preset, and (tests only) a broken protocol.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TxnSection {
    /// The primitive preset (DrTM+H Table 4); only `fasst` exists so far.
    pub mode: String,
    /// TEST ONLY: run a deliberately broken protocol.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inject_bug: Option<InjectedBug>,
}

impl Default for TxnSection {
    fn default() -> Self {
        TxnSection {
            mode: "fasst".into(),
            inject_bug: None,
        }
    }
}

/// Probabilities (0..=1) of each fault the transport's injector applies to every
/// datagram a node sends (`ambidex_transport::fault`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FaultSection {
    pub seed: u64,
    pub drop: f64,
    pub duplicate: f64,
    /// Held back until after the endpoint's next batch.
    pub reorder: f64,
    /// Held back for a random time up to `max_delay_us`.
    pub delay: f64,
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

/// Which workload to run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadKind {
    /// FaSST's object store O(r, w) (`run.r`, `run.w`).
    #[serde(alias = "objstore", alias = "object")]
    ObjectStore,
    Tatp,
    #[default]
    #[serde(rename = "smallbank")]
    SmallBank,
    /// Full TPC-C mix.
    Tpcc,
    /// DrTM+H's TPC-C variant: NewOrder only, always distributed.
    TpccNo,
}

impl WorkloadKind {
    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::ObjectStore => "object-store",
            WorkloadKind::Tatp => "tatp",
            WorkloadKind::SmallBank => "smallbank",
            WorkloadKind::Tpcc => "tpcc",
            WorkloadKind::TpccNo => "tpcc-no",
        }
    }

    /// Worker coroutines per thread when none are given: FaSST's ~20, enough to hide the
    /// network latency (FaSST §4.1); 8 for TPC-C, whose transactions are long and contend
    /// on few warehouses at the quick scale.
    pub fn default_coroutines(self) -> usize {
        match self {
            WorkloadKind::Tpcc | WorkloadKind::TpccNo => 8,
            _ => 20,
        }
    }

    /// The scale used when none is given: small enough that a 3-node run loads in a few
    /// seconds on a 2-core machine. Paper scale is 1.0 (see [`RunSection::scale`]).
    pub fn quick_scale(self) -> f64 {
        match self {
            WorkloadKind::ObjectStore => 0.1,
            WorkloadKind::Tatp => 0.05,
            WorkloadKind::SmallBank => 1.0,
            WorkloadKind::Tpcc | WorkloadKind::TpccNo => 0.1,
        }
    }
}

impl std::str::FromStr for WorkloadKind {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        Ok(match s {
            "object-store" | "objstore" | "object" => WorkloadKind::ObjectStore,
            "tatp" => WorkloadKind::Tatp,
            "smallbank" => WorkloadKind::SmallBank,
            "tpcc" => WorkloadKind::Tpcc,
            "tpcc-no" => WorkloadKind::TpccNo,
            _ => {
                return Err(ConfigError::UnknownName {
                    what: "workload",
                    name: s.to_string(),
                    known: "object-store, tatp, smallbank, tpcc, tpcc-no",
                })
            }
        })
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
    pub workload: WorkloadKind,
    /// Worker coroutines per thread (default: the workload's, see
    /// [`WorkloadKind::default_coroutines`]; the simulator's is 4).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub coroutines: Option<usize>,
    /// Measured seconds.
    pub duration_s: f64,
    /// Seconds run before measuring.
    pub warmup_s: f64,
    /// Multiplier of the paper-scale population (default: [`WorkloadKind::quick_scale`],
    /// or the simulator's tiny one). 1.0 is: object store 1,000,000 keys per thread;
    /// TATP 1,000,000 subscribers per node; SmallBank 100,000 accounts per thread; TPC-C
    /// 1 warehouse per thread with spec-size tables.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scale: Option<f64>,
    pub seed: u64,
    /// Object store: keys read (r) and written (w) per transaction.
    pub r: usize,
    pub w: usize,
    /// Object store: allow several keys of a transaction on one primary.
    pub same_node: bool,
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
            workload: WorkloadKind::SmallBank,
            coroutines: None,
            duration_s: 5.0,
            warmup_s: 1.0,
            scale: None,
            seed: 42,
            r: 4,
            w: 2,
            same_node: false,
            history: None,
            progress: false,
        }
    }
}

impl ClusterSection {
    /// The transport's cluster settings.
    pub fn cluster_config(&self) -> Result<ClusterConfig, ConfigError> {
        let mut c = ClusterConfig::new(self.nodes, self.threads);
        if let Some(id) = self.cluster_id {
            c.cluster_id = id;
        }
        if let Some(m) = self.mtu {
            c.mtu = m;
        }
        if let Some(d) = self.recv_depth {
            c.recv_depth = d;
        }
        c.validate().map_err(|e| ConfigError::Invalid {
            field: "cluster",
            why: format!("{e} (nodes {}, threads {})", self.nodes, self.threads),
        })?;
        Ok(c)
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

/// Knobs only the simulator reads (`docs/simulation.md`); checked by `ambidex-sim`.
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

/// What is wrong with a configuration.
#[derive(Clone, Debug, PartialEq)]
pub enum ConfigError {
    /// The file cannot be opened or read.
    Io { path: PathBuf, error: String },
    /// The file is over [`MAX_FILE_BYTES`].
    TooLarge { path: PathBuf },
    /// The file's extension is neither `.toml` nor `.json`.
    Extension { path: PathBuf },
    /// The file is not valid TOML/JSON, or has unknown fields or values of a wrong type.
    Parse { path: PathBuf, error: String },
    /// A name that is not one of the known ones.
    UnknownName {
        what: &'static str,
        name: String,
        known: &'static str,
    },
    /// A transaction-policy preset that does not exist (or is not built yet).
    UnknownMode { mode: String },
    /// A value out of its range, or settings that contradict each other.
    Invalid { field: &'static str, why: String },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Io { path, error } => {
                write!(f, "cannot read config file {}: {error}", path.display())
            }
            ConfigError::TooLarge { path } => write!(
                f,
                "config file {} is larger than {MAX_FILE_BYTES} bytes",
                path.display()
            ),
            ConfigError::Extension { path } => write!(
                f,
                "config file {}: the name must end in .toml or .json",
                path.display()
            ),
            ConfigError::Parse { path, error } => {
                write!(f, "config file {}: {error}", path.display())
            }
            ConfigError::UnknownName { what, name, known } => {
                write!(f, "unknown {what} {name:?} ({known})")
            }
            ConfigError::UnknownMode { mode } => {
                let not_built = NOT_BUILT.contains(&mode.as_str());
                write!(
                    f,
                    "txn.mode (--mode) {mode:?}: {}; the presets are: {} (farm, drtm-r and \
                     drtm-h need one-sided phases, not built yet)",
                    if not_built {
                        "this preset is not built yet"
                    } else {
                        "no such preset"
                    },
                    PRESETS.join(", ")
                )
            }
            ConfigError::Invalid { field, why } => write!(f, "{field}: {why}"),
        }
    }
}

impl std::error::Error for ConfigError {}

impl From<ConfigError> for String {
    fn from(e: ConfigError) -> String {
        e.to_string()
    }
}

fn invalid<T>(field: &'static str, why: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError::Invalid {
        field,
        why: why.into(),
    })
}

/// Lays `over` onto `base`: objects merge key by key, anything else replaces.
fn merge(base: &mut serde_json::Value, over: serde_json::Value) {
    match (base, over) {
        (serde_json::Value::Object(b), serde_json::Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

impl Config {
    /// Reads a TOML (`.toml`) or JSON (`.json`) file laid over `base` (the path's
    /// defaults): what the file leaves out keeps `base`'s value. Not yet validated.
    pub fn read(path: &Path, base: &Config) -> Result<Config, ConfigError> {
        use std::io::Read;
        let io = |e: std::io::Error| ConfigError::Io {
            path: path.to_path_buf(),
            error: e.to_string(),
        };
        let mut text = String::new();
        std::fs::File::open(path)
            .map_err(io)?
            .take(MAX_FILE_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(io)?;
        if text.len() as u64 > MAX_FILE_BYTES {
            return Err(ConfigError::TooLarge {
                path: path.to_path_buf(),
            });
        }
        let parse = |error: String| ConfigError::Parse {
            path: path.to_path_buf(),
            error,
        };
        let value: serde_json::Value = match path.extension().and_then(|e| e.to_str()) {
            Some("toml") => toml::from_str(&text).map_err(|e| parse(e.to_string()))?,
            Some("json") => serde_json::from_str(&text).map_err(|e| parse(e.to_string()))?,
            _ => {
                return Err(ConfigError::Extension {
                    path: path.to_path_buf(),
                })
            }
        };
        Config::over(base, value).map_err(parse)
    }

    /// `over` (a parsed file) laid onto `base`.
    pub fn over(base: &Config, over: serde_json::Value) -> Result<Config, String> {
        if !over.is_object() {
            return Err("the configuration must be a table (object) of sections".into());
        }
        let mut v = serde_json::to_value(base).map_err(|e| e.to_string())?;
        merge(&mut v, over);
        let mut c: Config = serde_json::from_value(v).map_err(|e| e.to_string())?;
        c.run.progress = base.run.progress;
        Ok(c)
    }

    /// Writes the configuration (JSON) for node processes.
    pub fn write(&self, path: &Path) -> Result<(), ConfigError> {
        let text = serde_json::to_string_pretty(self).expect("a config serializes");
        std::fs::write(path, text + "\n").map_err(|e| ConfigError::Io {
            path: path.to_path_buf(),
            error: e.to_string(),
        })
    }

    /// Worker coroutines per thread.
    pub fn coroutines(&self) -> usize {
        self.run
            .coroutines
            .unwrap_or_else(|| self.run.workload.default_coroutines())
    }

    /// The workload's scale.
    pub fn scale(&self) -> f64 {
        self.run
            .scale
            .unwrap_or_else(|| self.run.workload.quick_scale())
    }

    pub fn objstore(&self) -> ObjStoreParams {
        ObjStoreParams {
            reads: self.run.r,
            writes: self.run.w,
            same_node: self.run.same_node,
        }
    }

    pub fn placement(&self) -> Result<Placement, ConfigError> {
        Placement::new(self.cluster.nodes, self.cluster.replication).map_err(|e| {
            ConfigError::Invalid {
                field: "cluster.replication",
                why: e,
            }
        })
    }

    /// The transport's cluster settings.
    pub fn cluster_config(&self) -> Result<ClusterConfig, ConfigError> {
        self.cluster.cluster_config()
    }

    /// Checks every section (the simulator checks `sim` and its own limits besides).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let c = self.cluster_config()?;
        self.placement()?;
        self.validate_addresses(&c)?;
        self.rpc.runtime_config()?;
        self.txn.txn_config()?;
        if let Some(f) = &self.fault {
            f.fault_config(0)?;
        }
        let r = &self.run;
        if let Some(n) = r.coroutines {
            if !(1..=4096).contains(&n) {
                return invalid("run.coroutines", format!("must be 1..=4096, not {n}"));
            }
        }
        if !(r.duration_s > 0.0 && r.duration_s <= 86400.0) {
            return invalid(
                "run.duration_s",
                format!("must be in (0, 86400] seconds, not {}", r.duration_s),
            );
        }
        if !(0.0..=3600.0).contains(&r.warmup_s) {
            return invalid(
                "run.warmup_s",
                format!("must be in [0, 3600] seconds, not {}", r.warmup_s),
            );
        }
        if let Some(s) = r.scale {
            if !(s > 0.0 && s <= 1000.0) {
                return invalid("run.scale", format!("must be in (0, 1000], not {s}"));
            }
        }
        if r.r == 0 || r.w > r.r {
            return invalid(
                "run.r",
                format!(
                    "object store: need 1 <= r and w <= r (r {}, w {})",
                    r.r, r.w
                ),
            );
        }
        if r.history.as_deref() == Some("") {
            return invalid("run.history", "is an empty path");
        }
        Ok(())
    }

    fn validate_addresses(&self, c: &ClusterConfig) -> Result<(), ConfigError> {
        let s = &self.cluster;
        if s.transport != Transport::Udp && !s.udp_addrs.is_empty() {
            return invalid("cluster.udp_addrs", "is for the udp transport");
        }
        if s.transport != Transport::Shm && s.shm_dir.is_some() {
            return invalid("cluster.shm_dir", "is for the shm transport");
        }
        if !s.udp_addrs.is_empty() && s.udp_addrs.len() != s.nodes as usize {
            return invalid(
                "cluster.udp_addrs",
                format!(
                    "lists {} addresses for {} nodes",
                    s.udp_addrs.len(),
                    s.nodes
                ),
            );
        }
        let threads = c.threads_per_node;
        let mut seen = std::collections::HashSet::new();
        for (n, a) in s.udp_addrs.iter().enumerate() {
            if a.port() == 0 || a.port() as u32 + threads as u32 > 65536 {
                return invalid(
                    "cluster.udp_addrs",
                    format!(
                        "[{n}] = {a}: ports {}..{} must be within 1..=65535",
                        a.port(),
                        a.port() as u32 + threads as u32
                    ),
                );
            }
            for t in 0..threads {
                if !seen.insert(SocketAddr::new(a.ip(), a.port() + t)) {
                    return invalid(
                        "cluster.udp_addrs",
                        format!("two endpoints share {}:{}", a.ip(), a.port() + t),
                    );
                }
            }
        }
        Ok(())
    }
}

impl RpcSection {
    /// The runtime settings (the rest at `RuntimeConfig`'s defaults).
    pub fn runtime_config(&self) -> Result<RuntimeConfig, ConfigError> {
        let ms = self.retransmit_timeout_ms;
        if !(ms.is_finite() && (0.1..=60_000.0).contains(&ms)) {
            return invalid(
                "rpc.retransmit_timeout_ms",
                format!("must be within 0.1..=60000, not {ms}"),
            );
        }
        if self.max_retries > 1_000_000 {
            return invalid(
                "rpc.max_retries",
                format!("must be at most 1000000, not {}", self.max_retries),
            );
        }
        if self.credits == Some(0) {
            return invalid("rpc.credits", "must be at least 1");
        }
        Ok(RuntimeConfig {
            // Whole nanoseconds, rounded: 1 ms stays exactly 1 ms (the simulator's runs
            // depend on it bit for bit).
            retransmit_timeout: Duration::from_nanos((ms * 1e6).round() as u64),
            max_retries: self.max_retries,
            coalesce: self.coalesce,
            credits: self.credits,
            ..RuntimeConfig::default()
        })
    }

    /// How long a request may go unanswered before its destination is suspected.
    pub fn give_up_after(&self) -> Duration {
        Duration::from_secs_f64(
            (self.retransmit_timeout_ms.clamp(0.0, 60_000.0) / 1000.0)
                * (self.max_retries.min(1_000_000) as f64 + 1.0),
        )
    }
}

impl TxnSection {
    /// Checks `mode` against the presets that exist.
    pub fn check_mode(mode: &str) -> Result<(), ConfigError> {
        if PRESETS.contains(&mode) {
            Ok(())
        } else {
            Err(ConfigError::UnknownMode {
                mode: mode.to_string(),
            })
        }
    }

    /// The transaction layer's settings: the one place a preset becomes a `TxnConfig`.
    pub fn txn_config(&self) -> Result<TxnConfig, ConfigError> {
        Self::check_mode(&self.mode)?;
        // Struct update on purpose: TxnConfig may grow fields (presets).
        #[allow(clippy::needless_update)]
        Ok(TxnConfig {
            skip_validation_for_tests: self.inject_bug == Some(InjectedBug::SkipValidation),
            ..TxnConfig::default()
        })
    }
}

impl FaultSection {
    /// The injector's configuration for node `node` (each node gets its own stream).
    pub fn fault_config(&self, node: NodeId) -> Result<FaultConfig, ConfigError> {
        if self.max_delay_us > 10_000_000 {
            return invalid("fault.max_delay_us", "must be at most 10000000 (10 s)");
        }
        let cfg = FaultConfig {
            seed: self
                .seed
                .wrapping_add((node as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
            drop: self.drop,
            duplicate: self.duplicate,
            reorder: self.reorder,
            delay: self.delay,
            max_delay: Duration::from_micros(self.max_delay_us),
        };
        cfg.validate().map_err(|e| ConfigError::Invalid {
            field: "fault",
            why: e.to_string(),
        })?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ambx-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn defaults_are_todays() {
        let c = Config::default();
        c.validate().unwrap();
        assert_eq!(
            (c.cluster.nodes, c.cluster.threads, c.cluster.replication),
            (3, 1, 3)
        );
        assert_eq!(c.cluster.transport, Transport::Local);
        assert_eq!(c.coroutines(), 20);
        assert_eq!(c.scale(), 1.0);
        assert_eq!(
            (c.run.duration_s, c.run.warmup_s, c.run.seed),
            (5.0, 1.0, 42)
        );
        let rt = c.rpc.runtime_config().unwrap();
        let d = RuntimeConfig::default();
        assert_eq!(rt.retransmit_timeout, d.retransmit_timeout);
        assert_eq!(rt.max_retries, d.max_retries);
        assert!(!c.txn.txn_config().unwrap().skip_validation_for_tests);
    }

    #[test]
    fn toml_and_json_files_read_the_same_over_the_base() {
        let t = file(
            "a.toml",
            "[cluster]\nnodes = 4\n[rpc]\nmax_retries = 7\n[txn]\nmode = \"fasst\"\n\
             [run]\nworkload = \"tpcc\"\ncoroutines = 3\n",
        );
        let j = file(
            "a.json",
            r#"{"cluster": {"nodes": 4}, "rpc": {"max_retries": 7}, "txn": {"mode": "fasst"},
                "run": {"workload": "tpcc", "coroutines": 3}}"#,
        );
        let a = Config::read(&t, &Config::default()).unwrap();
        let b = Config::read(&j, &Config::default()).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.cluster.nodes, 4);
        assert_eq!(a.cluster.threads, 1, "left out: the base's");
        // Every workload name reads as the command line spells it.
        for w in [
            "object-store",
            "objstore",
            "tatp",
            "smallbank",
            "tpcc",
            "tpcc-no",
        ] {
            let v = serde_json::json!({ "run": { "workload": w } });
            let c = Config::over(&Config::default(), v).unwrap();
            assert_eq!(c.run.workload, w.parse().unwrap());
            assert_eq!(
                c.run.workload.name().parse::<WorkloadKind>(),
                Ok(c.run.workload)
            );
        }
        assert_eq!(a.rpc.max_retries, 7);
        assert_eq!(a.coroutines(), 3);
        a.validate().unwrap();
        // What the file leaves out keeps the base's value (the simulator's base differs).
        let mut base = Config::default();
        base.rpc.retransmit_timeout_ms = 1.0;
        let s = Config::read(&t, &base).unwrap();
        assert_eq!((s.rpc.retransmit_timeout_ms, s.rpc.max_retries), (1.0, 7));
        // A written file reads back the same.
        let w = file("w.json", "");
        a.write(&w).unwrap();
        assert_eq!(Config::read(&w, &Config::default()).unwrap(), a);
    }

    #[test]
    fn unknown_fields_and_bad_files_are_typed_errors() {
        let base = Config::default();
        for (name, text) in [
            ("u.toml", "[rpc]\nmax_retrys = 7\n"),
            ("u2.toml", "[clusterr]\nnodes = 3\n"),
            ("u.json", r#"{"run": {"workload": "bank"}}"#),
            ("t.json", r#"{"cluster": {"nodes": -1}}"#),
            ("n.json", "{ not json"),
            ("a.json", "[1, 2]"),
            ("n.toml", "nodes = = 3"),
        ] {
            match Config::read(&file(name, text), &base) {
                Err(ConfigError::Parse { .. }) => {}
                other => panic!("{name}: {other:?}"),
            }
        }
        assert!(matches!(
            Config::read(&file("x.yaml", "a: 1"), &base),
            Err(ConfigError::Extension { .. })
        ));
        assert!(matches!(
            Config::read(Path::new("/nonexistent/x.toml"), &base),
            Err(ConfigError::Io { .. })
        ));
        let e = Config::read(&file("u3.toml", "[rpc]\nmax_retrys = 7\n"), &base).unwrap_err();
        assert!(e.to_string().contains("max_retrys"), "{e}");
    }

    #[test]
    fn bad_values_are_typed_errors() {
        let field = |c: Config| match c.validate() {
            Err(ConfigError::Invalid { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        let mut c = Config::default();
        c.rpc.retransmit_timeout_ms = -1.0;
        assert_eq!(field(c), "rpc.retransmit_timeout_ms");
        let mut c = Config::default();
        c.cluster.replication = 4;
        assert_eq!(field(c), "cluster.replication");
        let mut c = Config::default();
        c.cluster.nodes = 0;
        assert_eq!(field(c), "cluster");
        let mut c = Config::default();
        c.run.coroutines = Some(0);
        assert_eq!(field(c), "run.coroutines");
        let mut c = Config::default();
        c.run.scale = Some(f64::NAN);
        assert_eq!(field(c), "run.scale");
        let mut c = Config::default();
        c.run.w = 5;
        assert_eq!(field(c), "run.r");
        let c = Config {
            fault: Some(FaultSection {
                drop: 2.0,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(field(c), "fault");
        let mut c = Config::default();
        c.cluster.udp_addrs = vec!["127.0.0.1:1".parse().unwrap()];
        assert_eq!(field(c), "cluster.udp_addrs");
        let mut c = Config::default();
        c.cluster.transport = Transport::Udp;
        c.cluster.udp_addrs = vec!["127.0.0.1:65535".parse().unwrap(); 3];
        assert_eq!(field(c), "cluster.udp_addrs");
    }

    #[test]
    fn only_the_fasst_preset_exists_and_others_are_named() {
        let mut c = Config::default();
        for mode in ["farm", "drtm-h", "nonsense"] {
            c.txn.mode = mode.into();
            let e = c.validate().unwrap_err();
            assert_eq!(e, ConfigError::UnknownMode { mode: mode.into() });
            let s = e.to_string();
            for name in ["fasst", "farm", "drtm-r", "drtm-h"] {
                assert!(s.contains(name), "{s}");
            }
        }
        c.txn.mode = "fasst".into();
        c.txn.inject_bug = Some(InjectedBug::SkipValidation);
        assert!(c.txn.txn_config().unwrap().skip_validation_for_tests);
        assert!(matches!(
            "skip".parse::<InjectedBug>(),
            Err(ConfigError::UnknownName { .. })
        ));
    }
}
