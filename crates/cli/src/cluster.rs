//! How the CLI starts a cluster: which backend, where its nodes live, and how a node
//! process opens its share of it. A `ClusterSpec` is what `ambidex peer` receives, so the
//! same binary runs a node in-process or on its own.
//!
//! Workload runs over `shm` and `udp` run one `ambidex node` process per node: the
//! cluster file ([`ClusterFile`], docs/cluster.md) describes the cluster and the run,
//! and [`NodeProcesses`] starts the nodes and drives them through the line-based JSON
//! control protocol on their stdin/stdout.

use ambidex_transport::local::LocalFabric;
use ambidex_transport::{ClusterConfig, NodeId, SharedNode};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The transport backends the CLI can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// All nodes are threads of this process.
    Local,
    /// One process per node on this host, rings and regions in shared memory.
    Shm,
    /// One process per node, UDP datagrams (loopback here; real hosts with `ambidex node`).
    Udp,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Local => "local",
            Backend::Shm => "shm",
            Backend::Udp => "udp",
        }
    }
}

/// Everything a node process needs to join a cluster.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClusterSpec {
    pub backend: Backend,
    pub config: ClusterConfig,
    /// shm: the cluster directory.
    #[serde(default)]
    pub shm_dir: Option<PathBuf>,
    /// udp: the base address of every node (thread t listens on port + t).
    #[serde(default)]
    pub udp_addrs: Vec<SocketAddr>,
}

impl ClusterSpec {
    /// A spec for a cluster on this host, with fresh shared-memory names or ports.
    pub fn on_this_host(backend: Backend, config: ClusterConfig) -> ClusterSpec {
        let tag = format!("{}-{}", std::process::id(), rand_u32());
        let shm_dir =
            (backend == Backend::Shm).then(|| PathBuf::from(format!("/dev/shm/ambidex-{tag}")));
        let udp_addrs = if backend == Backend::Udp {
            // Spread clusters over the ephemeral range; each node gets a block of ports.
            let base = 20000 + (rand_u32() % 20000) as u16;
            let stride = config.threads_per_node.max(1) + 1;
            (0..config.nodes)
                .map(|n| SocketAddr::from(([127, 0, 0, 1], base + n * stride)))
                .collect()
        } else {
            Vec::new()
        };
        ClusterSpec {
            backend,
            config,
            shm_dir,
            udp_addrs,
        }
    }

    /// Creates whatever the backend keeps outside the nodes (the shm directory).
    pub fn create(&self) -> Result<(), String> {
        match self.backend {
            Backend::Shm => {
                let dir = self
                    .shm_dir
                    .as_ref()
                    .ok_or("shm needs a cluster directory")?;
                shm_create(dir, &self.config)
            }
            _ => Ok(()),
        }
    }

    /// Removes what [`ClusterSpec::create`] made.
    pub fn destroy(&self) {
        if let (Backend::Shm, Some(dir)) = (self.backend, &self.shm_dir) {
            shm_remove(dir);
        }
    }

    /// Opens node `node` of a multi-process cluster in this process.
    pub fn open_node(&self, node: NodeId) -> Result<SharedNode, String> {
        match self.backend {
            Backend::Local => {
                Err("a local cluster lives in one process; it has no node to open".into())
            }
            Backend::Shm => {
                let dir = self
                    .shm_dir
                    .as_ref()
                    .ok_or("shm needs a cluster directory")?;
                shm_open(dir, node)
            }
            Backend::Udp => udp_open(&self.config, &self.udp_addrs, node),
        }
    }
}

fn rand_u32() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    t ^ std::process::id().rotate_left(16)
}

/// A node running outside the driver: a thread of this process or a child process.
pub enum Peer {
    Thread(std::thread::JoinHandle<Result<(), String>>),
    Process(Child),
}

impl Peer {
    /// Starts `ambidex peer --role ROLE --node N --spec JSON` as a child process.
    pub fn spawn(spec: &ClusterSpec, node: NodeId, role: &str) -> Result<Peer, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find own binary: {e}"))?;
        let spec_json = serde_json::to_string(spec).map_err(|e| e.to_string())?;
        let child = Command::new(exe)
            .args([
                "peer",
                "--role",
                role,
                "--node",
                &node.to_string(),
                "--spec",
                &spec_json,
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start node {node} process: {e}"))?;
        Ok(Peer::Process(child))
    }

    /// CPU seconds used so far by a peer process (0 for threads: the process counts them).
    pub fn cpu_seconds(&self) -> f64 {
        match self {
            Peer::Thread(_) => 0.0,
            Peer::Process(c) => ambidex_transport::cputime::pid_cpu_seconds(c.id()),
        }
    }

    /// Waits for the peer to finish (killing a process that does not within `grace`).
    /// A peer that died on its own is reported as an error, not hidden.
    pub fn finish(self, grace: Duration) -> Result<(), String> {
        match self {
            Peer::Thread(h) => h.join().map_err(|_| "peer thread panicked".to_string())?,
            Peer::Process(mut c) => {
                let deadline = Instant::now() + grace;
                loop {
                    match c.try_wait() {
                        Ok(Some(st)) if st.success() => return Ok(()),
                        Ok(Some(st)) => {
                            return Err(format!("peer process {} exited with {st}", c.id()))
                        }
                        Ok(None) if Instant::now() < deadline => {
                            std::thread::sleep(Duration::from_millis(5))
                        }
                        _ => {
                            let _ = c.kill();
                            let _ = c.wait();
                            return Err(format!("peer process {} did not stop; killed", c.id()));
                        }
                    }
                }
            }
        }
    }
}

/// A running two-or-more-node cluster whose node 0 is driven by this process.
pub struct BenchCluster {
    pub spec: ClusterSpec,
    pub driver: SharedNode,
    pub peers: Vec<Peer>,
}

impl BenchCluster {
    /// Starts the cluster: node 0 here, every other node running `role` (on a thread with
    /// `local`, in its own process otherwise).
    pub fn start(
        backend: Backend,
        config: ClusterConfig,
        role: &str,
        local_role: fn(SharedNode) -> Result<(), String>,
    ) -> Result<BenchCluster, String> {
        let spec = ClusterSpec::on_this_host(backend, config.clone());
        match backend {
            Backend::Local => {
                let fabric = LocalFabric::new(config.clone()).map_err(|e| e.to_string())?;
                let peers = (1..config.nodes)
                    .map(|n| {
                        let node = fabric.node(n);
                        Peer::Thread(std::thread::spawn(move || local_role(node)))
                    })
                    .collect();
                Ok(BenchCluster {
                    spec,
                    driver: fabric.node(0),
                    peers,
                })
            }
            _ => {
                spec.create()?;
                let result = (|| {
                    let peers = (1..config.nodes)
                        .map(|n| Peer::spawn(&spec, n, role))
                        .collect::<Result<Vec<_>, _>>()?;
                    let driver = spec.open_node(0)?;
                    Ok(BenchCluster {
                        spec: spec.clone(),
                        driver,
                        peers,
                    })
                })();
                if result.is_err() {
                    spec.destroy();
                }
                result
            }
        }
    }

    pub fn peers_cpu_seconds(&self) -> f64 {
        self.peers.iter().map(Peer::cpu_seconds).sum()
    }

    /// Waits for every peer and removes the cluster's files.
    pub fn finish(self) -> Result<(), String> {
        let mut errors = Vec::new();
        for p in self.peers {
            if let Err(e) = p.finish(Duration::from_secs(5)) {
                errors.push(e);
            }
        }
        self.spec.destroy();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }
}

// The backend crates' entry points (kept together so the CLI's dependency on each
// backend is visible in one place).
fn shm_create(dir: &std::path::Path, config: &ClusterConfig) -> Result<(), String> {
    ambidex_transport_shm::ShmCluster::create(dir, config).map_err(|e| e.to_string())
}
fn shm_remove(dir: &std::path::Path) {
    let _ = ambidex_transport_shm::ShmCluster::remove(dir);
}
fn shm_open(dir: &std::path::Path, node: NodeId) -> Result<SharedNode, String> {
    ambidex_transport_shm::ShmNode::open(dir, node).map_err(|e| e.to_string())
}
fn udp_open(c: &ClusterConfig, a: &[SocketAddr], node: NodeId) -> Result<SharedNode, String> {
    ambidex_transport_udp::UdpNode::open(c, a, node).map_err(|e| e.to_string())
}

/// Every node of a cluster opened in this process (for benchmarks that drive all nodes
/// as threads of one process on any backend). Dropping it removes the shm directory.
pub struct InProcessCluster {
    pub spec: ClusterSpec,
    pub nodes: Vec<SharedNode>,
}

impl InProcessCluster {
    pub fn open(backend: Backend, config: ClusterConfig) -> Result<InProcessCluster, String> {
        let spec = ClusterSpec::on_this_host(backend, config.clone());
        let nodes = match backend {
            Backend::Local => LocalFabric::new(config).map_err(|e| e.to_string())?.nodes(),
            _ => {
                spec.create()?;
                match (0..config.nodes).map(|n| spec.open_node(n)).collect() {
                    Ok(nodes) => nodes,
                    Err(e) => {
                        spec.destroy();
                        return Err(e);
                    }
                }
            }
        };
        Ok(InProcessCluster { spec, nodes })
    }
}

impl Drop for InProcessCluster {
    fn drop(&mut self) {
        self.nodes.clear();
        self.spec.destroy();
    }
}

// ----- the cluster file of `ambidex node` (docs/cluster.md) -----

/// Largest cluster file read (it is a few hundred bytes in practice).
const MAX_FILE_BYTES: u64 = 1 << 20;

/// The file `ambidex node --config FILE --node I` reads: the cluster, and (for the
/// nodes) the run. `ambidex bench --cluster-config FILE` reads the `cluster` part.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    pub cluster: ClusterSection,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunSection>,
}

/// The cluster: transport, shape, addresses, RPC retry settings and injected faults.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    /// `shm` (processes on one host) or `udp` (hosts).
    pub transport: Backend,
    pub nodes: u16,
    /// Threads per node.
    #[serde(default = "one")]
    pub threads: u16,
    /// Tells clusters sharing a network apart (default: ambidex's fixed id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recv_depth: Option<usize>,
    /// shm: the cluster directory (the launcher makes a fresh one when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm_dir: Option<PathBuf>,
    /// udp: every node's base address, `IP:PORT` (thread t listens on PORT + t). The
    /// launcher picks loopback ports when absent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub udp_addrs: Vec<SocketAddr>,
    #[serde(default)]
    pub rpc: RpcSection,
    /// The transport's fault injector on every endpoint of every node (off when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<FaultSection>,
}

fn one() -> u16 {
    1
}

/// RPC retransmission: a request unanswered for `retransmit_timeout_ms` is sent again,
/// and after `max_retries` retransmissions its destination is suspected failed and the
/// transaction aborts. Size them so that the longest expected outage (a partition) is
/// shorter than `retransmit_timeout_ms * max_retries`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RpcSection {
    #[serde(default = "default_rto_ms")]
    pub retransmit_timeout_ms: f64,
    #[serde(default = "default_retries")]
    pub max_retries: u32,
}

fn default_rto_ms() -> f64 {
    ambidex_rpc::RuntimeConfig::default()
        .retransmit_timeout
        .as_secs_f64()
        * 1000.0
}
fn default_retries() -> u32 {
    ambidex_rpc::RuntimeConfig::default().max_retries
}

impl Default for RpcSection {
    fn default() -> Self {
        RpcSection {
            retransmit_timeout_ms: default_rto_ms(),
            max_retries: default_retries(),
        }
    }
}

impl RpcSection {
    pub fn runtime_config(&self) -> Result<ambidex_rpc::RuntimeConfig, String> {
        let ms = self.retransmit_timeout_ms;
        if !(ms.is_finite() && (0.1..=60_000.0).contains(&ms)) {
            return Err(format!(
                "rpc.retransmit_timeout_ms must be within 0.1..=60000, not {ms}"
            ));
        }
        if self.max_retries > 1_000_000 {
            return Err("rpc.max_retries must be at most 1000000".into());
        }
        Ok(ambidex_rpc::RuntimeConfig {
            retransmit_timeout: Duration::from_secs_f64(ms / 1000.0),
            max_retries: self.max_retries,
            ..Default::default()
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

/// Probabilities (0..=1) of each fault the transport's injector applies to every
/// datagram a node sends (`ambidex_transport::fault`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultSection {
    #[serde(default = "default_fault_seed")]
    pub seed: u64,
    #[serde(default)]
    pub drop: f64,
    #[serde(default)]
    pub duplicate: f64,
    /// Held back until after the endpoint's next batch.
    #[serde(default)]
    pub reorder: f64,
    /// Held back for a random time up to `max_delay_us`.
    #[serde(default)]
    pub delay: f64,
    #[serde(default = "default_max_delay_us")]
    pub max_delay_us: u64,
}

fn default_fault_seed() -> u64 {
    1
}
fn default_max_delay_us() -> u64 {
    2000
}

impl FaultSection {
    /// The injector's configuration for node `node` (each node gets its own stream).
    pub fn fault_config(
        &self,
        node: NodeId,
    ) -> Result<ambidex_transport::fault::FaultConfig, String> {
        if self.max_delay_us > 10_000_000 {
            return Err("fault.max_delay_us must be at most 10000000 (10 s)".into());
        }
        let cfg = ambidex_transport::fault::FaultConfig {
            seed: self
                .seed
                .wrapping_add((node as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
            drop: self.drop,
            duplicate: self.duplicate,
            reorder: self.reorder,
            delay: self.delay,
            max_delay: Duration::from_micros(self.max_delay_us),
        };
        cfg.validate().map_err(|e| format!("fault: {e}"))?;
        Ok(cfg)
    }
}

/// The run every node performs: the workload and its parameters (what `ambidex bench`
/// takes on its command line).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSection {
    /// `smallbank`, `tatp`, `tpcc`, `tpcc-no` or `object-store`.
    pub workload: String,
    #[serde(default = "default_coroutines")]
    pub coroutines: usize,
    #[serde(default = "default_replication")]
    pub replication: u16,
    /// Population multiplier (default: the workload's quick scale).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<f64>,
    #[serde(default = "default_seed")]
    pub seed: u64,
    #[serde(default = "default_warmup")]
    pub warmup_s: f64,
    #[serde(default = "default_duration")]
    pub duration_s: f64,
    /// Object store: keys read (r) and written (w) per transaction.
    #[serde(default = "default_r")]
    pub r: usize,
    #[serde(default = "default_w")]
    pub w: usize,
    #[serde(default)]
    pub same_node: bool,
    /// Record each node's transactions: node I writes this path with `{node}` replaced
    /// by I, or with `.nodeI` appended if it has no `{node}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<String>,
}

fn default_coroutines() -> usize {
    8
}
fn default_replication() -> u16 {
    3
}
fn default_seed() -> u64 {
    42
}
fn default_warmup() -> f64 {
    1.0
}
fn default_duration() -> f64 {
    5.0
}
fn default_r() -> usize {
    4
}
fn default_w() -> usize {
    2
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

impl ClusterFile {
    /// Reads and checks a cluster file (JSON). Every problem is a clear error.
    pub fn read(path: &std::path::Path) -> Result<ClusterFile, String> {
        use std::io::Read;
        let f = std::fs::File::open(path)
            .map_err(|e| format!("cannot open cluster file {}: {e}", path.display()))?;
        let mut text = String::new();
        f.take(MAX_FILE_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|e| format!("cannot read cluster file {}: {e}", path.display()))?;
        if text.len() as u64 > MAX_FILE_BYTES {
            return Err(format!(
                "cluster file {} is larger than {MAX_FILE_BYTES} bytes",
                path.display()
            ));
        }
        let file: ClusterFile = serde_json::from_str(&text)
            .map_err(|e| format!("cluster file {}: {e}", path.display()))?;
        file.cluster
            .validate()
            .map_err(|e| format!("cluster file {}: {e}", path.display()))?;
        Ok(file)
    }

    /// Writes the file (JSON) for the node processes.
    pub fn write(&self, path: &std::path::Path) -> Result<(), String> {
        let text = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n")
            .map_err(|e| format!("cannot write cluster file {}: {e}", path.display()))
    }
}

impl ClusterSection {
    pub fn cluster_config(&self) -> Result<ClusterConfig, String> {
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
        c.validate().map_err(|e| e.to_string())?;
        Ok(c)
    }

    /// Checks what can be checked without the run (addresses, limits, probabilities).
    pub fn validate(&self) -> Result<(), String> {
        let c = self.cluster_config()?;
        match self.transport {
            Backend::Local => {
                return Err("transport \"local\" keeps every node in one process; \
                     a cluster file needs \"shm\" or \"udp\""
                    .into())
            }
            Backend::Shm => {
                if !self.udp_addrs.is_empty() {
                    return Err("udp_addrs is for the udp transport".into());
                }
            }
            Backend::Udp => {
                if !self.udp_addrs.is_empty() && self.udp_addrs.len() != self.nodes as usize {
                    return Err(format!(
                        "udp_addrs lists {} addresses for {} nodes",
                        self.udp_addrs.len(),
                        self.nodes
                    ));
                }
                for (n, a) in self.udp_addrs.iter().enumerate() {
                    if a.port() == 0 || a.port() as u32 + c.threads_per_node as u32 > 65536 {
                        return Err(format!(
                            "udp_addrs[{n}] = {a}: ports {}..{} must be within 1..=65535",
                            a.port(),
                            a.port() as u32 + c.threads_per_node as u32
                        ));
                    }
                }
                let mut seen = std::collections::HashSet::new();
                for a in &self.udp_addrs {
                    for t in 0..c.threads_per_node {
                        if !seen.insert(SocketAddr::new(a.ip(), a.port() + t)) {
                            return Err(format!(
                                "udp_addrs: two endpoints share {}:{}",
                                a.ip(),
                                a.port() + t
                            ));
                        }
                    }
                }
            }
        }
        self.rpc.runtime_config()?;
        if let Some(f) = &self.fault {
            f.fault_config(0)?;
        }
        Ok(())
    }

    /// The spec a node opens its transport from (the shm directory and udp addresses
    /// must be filled in by now).
    pub fn spec(&self) -> Result<ClusterSpec, String> {
        self.validate()?;
        let spec = ClusterSpec {
            backend: self.transport,
            config: self.cluster_config()?,
            shm_dir: self.shm_dir.clone(),
            udp_addrs: self.udp_addrs.clone(),
        };
        match spec.backend {
            Backend::Shm if spec.shm_dir.is_none() => {
                Err("an shm cluster needs its shm_dir".into())
            }
            Backend::Udp if spec.udp_addrs.is_empty() => {
                Err("a udp cluster needs udp_addrs (one base address per node)".into())
            }
            _ => Ok(spec),
        }
    }
}

// ----- the launcher's side of the control protocol (docs/cluster.md) -----

/// Longest control line accepted from a node (reports are a few KiB).
const MAX_LINE: u64 = 16 << 20;

enum FromNode {
    Line(String),
    /// The node closed its stdout (it exited, or is about to).
    Eof,
    /// A line that cannot be read (too long, not UTF-8, read error).
    Bad(String),
}

struct NodeProc {
    child: Child,
    stdin: Option<std::process::ChildStdin>,
    eof: bool,
}

/// The node processes of one run, driven through their stdin/stdout. Dropping it kills
/// every node that is still running.
pub struct NodeProcesses {
    procs: Vec<NodeProc>,
    rx: std::sync::mpsc::Receiver<(u16, FromNode)>,
    /// Events that arrived while waiting for another kind (kept in order per node).
    pending: Vec<std::collections::VecDeque<serde_json::Value>>,
}

/// How each node process is started: `wrapper` (with `{node}` replaced by the node id)
/// is put in front of `ambidex node --config FILE --node I`, e.g. `ip netns exec ns{node}`
/// or `ssh host{node}`.
pub struct Launch<'a> {
    pub config: &'a std::path::Path,
    pub nodes: u16,
    pub wrapper: Option<&'a str>,
    /// Show the loading progress bar of node 0 (the others load silently).
    pub progress: bool,
}

impl NodeProcesses {
    pub fn spawn(l: &Launch<'_>) -> Result<NodeProcesses, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find own binary: {e}"))?;
        let (tx, rx) = std::sync::mpsc::channel();
        let mut np = NodeProcesses {
            procs: Vec::new(),
            rx,
            pending: vec![Default::default(); l.nodes as usize],
        };
        for n in 0..l.nodes {
            let mut argv: Vec<String> = match l.wrapper {
                Some(w) => w
                    .split_whitespace()
                    .map(|a| a.replace("{node}", &n.to_string()))
                    .collect(),
                None => Vec::new(),
            };
            argv.push(exe.display().to_string());
            argv.extend([
                "node".to_string(),
                "--config".to_string(),
                l.config.display().to_string(),
                "--node".to_string(),
                n.to_string(),
            ]);
            if !(l.progress && n == 0) {
                argv.push("--no-progress".into());
            }
            let mut child = Command::new(&argv[0])
                .args(&argv[1..])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|e| format!("cannot start node {n} ({}): {e}", argv.join(" ")))?;
            let stdout = child.stdout.take().expect("piped stdout");
            let stdin = child.stdin.take();
            let tx = tx.clone();
            std::thread::spawn(move || read_lines(n, stdout, tx));
            np.procs.push(NodeProc {
                child,
                stdin,
                eof: false,
            });
        }
        Ok(np)
    }

    pub fn pids(&self) -> Vec<u32> {
        self.procs.iter().map(|p| p.child.id()).collect()
    }

    /// Sends `{"cmd": CMD}` to every node.
    pub fn send_all(&mut self, cmd: &str) -> Result<(), String> {
        use std::io::Write;
        let line = format!("{}\n", serde_json::json!({ "cmd": cmd }));
        for n in 0..self.procs.len() {
            let ok = match self.procs[n].stdin.as_mut() {
                Some(w) => w.write_all(line.as_bytes()).and_then(|_| w.flush()).is_ok(),
                None => false,
            };
            if !ok {
                return Err(self.failure(n as u16, &format!("could not be sent {cmd:?}")));
            }
        }
        Ok(())
    }

    /// Waits until every node has sent event `event`; returns them in node order. A
    /// node that dies, reports an error or stays silent past `timeout` fails the wait.
    pub fn wait_all(
        &mut self,
        event: &str,
        timeout: Duration,
    ) -> Result<Vec<serde_json::Value>, String> {
        let deadline = Instant::now() + timeout;
        let n = self.procs.len();
        let mut got: Vec<Option<serde_json::Value>> = vec![None; n];
        loop {
            for (i, slot) in got.iter_mut().enumerate() {
                if slot.is_none() {
                    if let Some(v) = self.take_pending(i, event)? {
                        *slot = Some(v);
                    }
                }
            }
            if got.iter().all(Option::is_some) {
                return Ok(got.into_iter().map(Option::unwrap).collect());
            }
            if let Some(i) = (0..n).find(|&i| got[i].is_none() && self.procs[i].eof) {
                return Err(self.failure(
                    i as u16,
                    &format!("died before sending {event:?} (its control output closed)"),
                ));
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<String> = got
                    .iter()
                    .enumerate()
                    .filter(|(_, g)| g.is_none())
                    .map(|(i, _)| i.to_string())
                    .collect();
                let first = missing[0].parse::<u16>().unwrap_or(0);
                return Err(self.failure(
                    first,
                    &format!(
                        "sent no {event:?} within {:.0} s (nodes still silent: {})",
                        timeout.as_secs_f64(),
                        missing.join(", ")
                    ),
                ));
            }
            self.pump(deadline - now)?;
        }
    }

    /// Lets `d` pass while watching the nodes: any death or error ends it early.
    pub fn watch(&mut self, d: Duration) -> Result<(), String> {
        let deadline = Instant::now() + d;
        loop {
            for i in 0..self.procs.len() {
                // Nothing is expected now: an event here is an error report, or early.
                if let Some(msg) = self.pending[i].front().and_then(error_report) {
                    return Err(self.failure(i as u16, &format!("reported an error: {msg}")));
                }
            }
            if let Some(i) = (0..self.procs.len()).find(|&i| self.procs[i].eof) {
                return Err(
                    self.failure(i as u16, "died during the run (its control output closed)")
                );
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(());
            }
            self.pump(deadline - now)?;
        }
    }

    /// Receives what the nodes sent within `d` into the pending queues.
    fn pump(&mut self, d: Duration) -> Result<(), String> {
        let first = match self.rx.recv_timeout(d.min(Duration::from_millis(100))) {
            Ok(m) => m,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => return Ok(()),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err("every node's output closed".into())
            }
        };
        let mut msgs = vec![first];
        while let Ok(m) = self.rx.try_recv() {
            msgs.push(m);
        }
        for (n, m) in msgs {
            match m {
                FromNode::Line(line) => {
                    let v: serde_json::Value = match serde_json::from_str(&line) {
                        Ok(v @ serde_json::Value::Object(_)) => v,
                        _ => {
                            let shown: String = line.chars().take(200).collect();
                            return Err(self
                                .failure(n, &format!("sent a malformed control line: {shown:?}")));
                        }
                    };
                    if v.get("event").and_then(|e| e.as_str()).is_none() {
                        return Err(self.failure(n, "sent a control line without \"event\""));
                    }
                    if let Some(q) = self.pending.get_mut(n as usize) {
                        q.push_back(v);
                    }
                }
                FromNode::Bad(why) => return Err(self.failure(n, &why)),
                FromNode::Eof => {
                    // Events it sent before closing are still honoured by the waits;
                    // a node that closes while something is expected of it has failed.
                    if let Some(p) = self.procs.get_mut(n as usize) {
                        p.eof = true;
                    }
                }
            }
        }
        Ok(())
    }

    /// Takes node `i`'s next event if it is `event`; an `error` event fails.
    fn take_pending(&mut self, i: usize, event: &str) -> Result<Option<serde_json::Value>, String> {
        let Some(front) = self.pending[i].front() else {
            return Ok(None);
        };
        if let Some(msg) = error_report(front) {
            return Err(self.failure(i as u16, &format!("reported an error: {msg}")));
        }
        let kind = front.get("event").and_then(|e| e.as_str()).unwrap_or("");
        if kind == event {
            return Ok(self.pending[i].pop_front());
        }
        let kind = kind.to_string();
        Err(self.failure(
            i as u16,
            &format!("sent {kind:?} while the launcher waited for {event:?}"),
        ))
    }

    /// Waits for every node to exit by itself within `grace`; a node that does not,
    /// or exits with a failure, is an error.
    pub fn wait_exits(&mut self, grace: Duration) -> Result<(), String> {
        for p in &mut self.procs {
            p.stdin = None;
        }
        let deadline = Instant::now() + grace;
        for n in 0..self.procs.len() {
            loop {
                match self.procs[n].child.try_wait() {
                    Ok(Some(st)) if st.success() => break,
                    Ok(Some(st)) => {
                        let why = describe_exit(st);
                        return Err(self.fail_all(format!(
                            "node {n} (pid {}) {why} after its report",
                            self.procs[n].child.id()
                        )));
                    }
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    _ => {
                        return Err(self.fail_all(format!(
                            "node {n} (pid {}) did not exit after its report",
                            self.procs[n].child.id()
                        )))
                    }
                }
            }
        }
        Ok(())
    }

    /// The failure of node `n` as a message naming it and how it ended, after killing
    /// every node.
    fn failure(&mut self, n: u16, what: &str) -> String {
        let pid = self
            .procs
            .get(n as usize)
            .map(|p| p.child.id())
            .unwrap_or(0);
        // Give a node that is exiting a moment to be reaped, so its status is known.
        let mut status = None;
        if let Some(p) = self.procs.get_mut(n as usize) {
            let until = Instant::now() + Duration::from_secs(2);
            loop {
                match p.child.try_wait() {
                    Ok(Some(st)) => {
                        status = Some(st);
                        break;
                    }
                    Ok(None) if Instant::now() < until => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    _ => break,
                }
            }
        }
        let how = match status {
            Some(st) => format!("; it {}", describe_exit(st)),
            None => "; it was still running and was killed".to_string(),
        };
        self.fail_all(format!("node {n} (pid {pid}) {what}{how}"))
    }

    fn fail_all(&mut self, msg: String) -> String {
        self.kill_all();
        msg
    }

    /// Kills every node still running and reaps them.
    pub fn kill_all(&mut self) {
        for p in &mut self.procs {
            p.stdin = None;
            if let Ok(None) = p.child.try_wait() {
                let _ = p.child.kill();
            }
            let _ = p.child.wait();
        }
    }
}

impl Drop for NodeProcesses {
    fn drop(&mut self) {
        self.kill_all();
    }
}

fn read_lines(
    n: u16,
    out: std::process::ChildStdout,
    tx: std::sync::mpsc::Sender<(u16, FromNode)>,
) {
    use std::io::{BufRead, Read};
    let mut r = std::io::BufReader::new(out);
    loop {
        let mut buf = Vec::new();
        match (&mut r).take(MAX_LINE).read_until(b'\n', &mut buf) {
            Ok(0) => {
                let _ = tx.send((n, FromNode::Eof));
                return;
            }
            Ok(_) if buf.last() != Some(&b'\n') && buf.len() as u64 >= MAX_LINE => {
                let _ = tx.send((
                    n,
                    FromNode::Bad(format!("sent a control line over {MAX_LINE} bytes")),
                ));
                return;
            }
            Ok(_) => {
                let msg = match String::from_utf8(buf) {
                    Ok(s) => FromNode::Line(s.trim_end().to_string()),
                    Err(_) => FromNode::Bad("sent a control line that is not UTF-8".into()),
                };
                let stop = matches!(msg, FromNode::Bad(_));
                if tx.send((n, msg)).is_err() || stop {
                    return;
                }
            }
            Err(e) => {
                let _ = tx.send((n, FromNode::Bad(format!("control output unreadable: {e}"))));
                return;
            }
        }
    }
}

/// "exited with status 3", "was killed by signal 9 (SIGKILL)".
pub fn describe_exit(st: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    if let Some(code) = st.code() {
        return format!("exited with status {code}");
    }
    match st.signal() {
        Some(sig) => {
            let name = match sig {
                libc::SIGHUP => "SIGHUP",
                libc::SIGINT => "SIGINT",
                libc::SIGQUIT => "SIGQUIT",
                libc::SIGILL => "SIGILL",
                libc::SIGABRT => "SIGABRT",
                libc::SIGBUS => "SIGBUS",
                libc::SIGFPE => "SIGFPE",
                libc::SIGKILL => "SIGKILL",
                libc::SIGSEGV => "SIGSEGV",
                libc::SIGPIPE => "SIGPIPE",
                libc::SIGTERM => "SIGTERM",
                _ => "",
            };
            if name.is_empty() {
                format!("was killed by signal {sig}")
            } else {
                format!("was killed by signal {sig} ({name})")
            }
        }
        None => format!("ended ({st})"),
    }
}

/// The message of a node's `error` event (None for any other event).
fn error_report(ev: &serde_json::Value) -> Option<String> {
    if ev.get("event").and_then(|e| e.as_str()) != Some("error") {
        return None;
    }
    let msg = ev.get("message").and_then(|m| m.as_str());
    Some(msg.unwrap_or("(no message)").to_string())
}
