//! How the CLI starts a cluster: which backend, where its nodes live, and how a node
//! process opens its share of it. A `ClusterSpec` is what `ambidex peer` (and later
//! `ambidex node`) receives, so the same binary runs a node in-process or on its own.

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
