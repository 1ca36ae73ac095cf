//! Where a cluster's nodes meet: creating, opening and removing the transport of a
//! [`ClusterSection`] (local fabric, shm directory, udp addresses). Used by in-process
//! runs (every node opened here, [`InProcess`]), node processes (one node,
//! [`open_node`]) and the launcher ([`on_this_host`], [`create`], [`destroy`]).

use crate::config::{ClusterSection, ConfigError, Transport};
use ambidex_transport::local::LocalFabric;
use ambidex_transport::{NodeId, SharedNode, TransportError};
use ambidex_transport_udp::UdpOptions;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

/// Fills in what `c` leaves to this host: a fresh shm directory, or loopback ports.
pub fn on_this_host(c: &mut ClusterSection) {
    static N: AtomicU32 = AtomicU32::new(0);
    let tag = format!(
        "{}-{}",
        std::process::id(),
        rand_u32() ^ N.fetch_add(1, Ordering::Relaxed)
    );
    if c.transport == Transport::Shm && c.shm_dir.is_none() {
        c.shm_dir = Some(PathBuf::from(format!("/dev/shm/ambidex-{tag}")));
    }
    if c.transport == Transport::Udp && c.udp_addrs.is_empty() {
        // Spread clusters over the ephemeral range; each node gets a block of ports.
        let base = 20000 + (rand_u32() % 20000) as u16;
        let stride = c.threads.max(1) + 1;
        c.udp_addrs = (0..c.nodes)
            .map(|n| SocketAddr::from(([127, 0, 0, 1], base + n * stride)))
            .collect();
    }
}

fn rand_u32() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    t ^ std::process::id().rotate_left(16)
}

/// Why a cluster's transport could not be created or a node of it opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The cluster's settings are invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// An shm cluster without its directory (`cluster.shm_dir`).
    #[error("an shm cluster needs its shm_dir")]
    NoShmDir,
    /// A udp cluster without its nodes' addresses (`cluster.udp_addrs`).
    #[error("a udp cluster needs udp_addrs (one base address per node)")]
    NoUdpAddrs,
    /// A node of a `local` cluster, which lives in one process.
    #[error("a local cluster lives in one process; it has no node to open")]
    LocalNode,
    /// A node id outside the cluster.
    #[error("node {node} is not in this {nodes}-node cluster")]
    NoSuchNode {
        /// The id asked for.
        node: NodeId,
        /// The cluster's nodes.
        nodes: u16,
    },
    /// The backend refused (a missing or foreign shm directory, a port in use...).
    #[error(transparent)]
    Transport(#[from] TransportError),
}

/// Creates whatever the backend keeps outside the nodes (the shm directory).
pub fn create(c: &ClusterSection) -> Result<(), OpenError> {
    if c.transport == Transport::Shm {
        let dir = c.shm_dir.as_ref().ok_or(OpenError::NoShmDir)?;
        ambidex_transport_shm::ShmCluster::create(dir, &c.cluster_config()?)?;
    }
    Ok(())
}

/// Removes what [`create`] made.
pub fn destroy(c: &ClusterSection) {
    if let (Transport::Shm, Some(dir)) = (c.transport, &c.shm_dir) {
        let _ = ambidex_transport_shm::ShmCluster::remove(dir);
    }
}

/// Opens node `node` of a multi-process cluster in this process (udp: one-sided
/// retransmission at the backend's defaults).
pub fn open_node(c: &ClusterSection, node: NodeId) -> Result<SharedNode, OpenError> {
    open_node_with(c, node, UdpOptions::default())
}

/// [`open_node`] with the udp backend's one-sided retransmission set by `udp` (a
/// workload run passes `RpcSection::udp_options`, so one-sided operations give up when
/// its RPCs do).
pub fn open_node_with(
    c: &ClusterSection,
    node: NodeId,
    udp: UdpOptions,
) -> Result<SharedNode, OpenError> {
    if node >= c.nodes {
        return Err(OpenError::NoSuchNode {
            node,
            nodes: c.nodes,
        });
    }
    match c.transport {
        Transport::Local => Err(OpenError::LocalNode),
        Transport::Shm => {
            let dir = c.shm_dir.as_ref().ok_or(OpenError::NoShmDir)?;
            Ok(ambidex_transport_shm::ShmNode::open(dir, node)?)
        }
        Transport::Udp => {
            if c.udp_addrs.is_empty() {
                return Err(OpenError::NoUdpAddrs);
            }
            let cfg = c.cluster_config()?;
            Ok(ambidex_transport_udp::UdpNode::open_with(
                &cfg,
                &c.udp_addrs,
                node,
                udp,
            )?)
        }
    }
}

/// Every node of a cluster opened in this process. Dropping it removes the shm directory.
pub struct InProcess {
    cluster: ClusterSection,
    /// Every node's transport, indexed by node id.
    pub nodes: Vec<SharedNode>,
    _fabric: Option<std::sync::Arc<LocalFabric>>,
}

impl InProcess {
    /// Opens every node of `c` here (fresh shm directory or loopback ports if `c` has none).
    pub fn open(c: &ClusterSection) -> Result<InProcess, OpenError> {
        Self::open_with(c, UdpOptions::default())
    }

    /// [`InProcess::open`] with the udp backend's options (see [`open_node_with`]).
    pub fn open_with(c: &ClusterSection, udp: UdpOptions) -> Result<InProcess, OpenError> {
        let mut c = c.clone();
        on_this_host(&mut c);
        if c.transport == Transport::Local {
            let f = LocalFabric::new(c.cluster_config()?)?;
            return Ok(InProcess {
                nodes: f.nodes(),
                cluster: c,
                _fabric: Some(f),
            });
        }
        create(&c)?;
        let mut ip = InProcess {
            nodes: Vec::new(),
            cluster: c,
            _fabric: None,
        };
        for n in 0..ip.cluster.nodes {
            ip.nodes.push(open_node_with(&ip.cluster, n, udp.clone())?);
        }
        Ok(ip)
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.nodes.clear();
        destroy(&self.cluster);
    }
}
