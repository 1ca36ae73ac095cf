//! The transport benchmark's cluster ([`BenchCluster`]): node 0 in this process, the
//! others `ambidex peer` processes started and watched by the facade's launcher
//! (`ambidex::bench::launch::NodeProcesses`), or threads with the `local` transport.

use ambidex::bench::launch::{Launch, LaunchError, NodeProcesses};
use ambidex::config::{ClusterSection, ConfigError, Transport};
use ambidex::transports::{self, OpenError};
use ambidex_transport::local::LocalFabric;
use ambidex_transport::{NodeId, SharedNode, TransportError};
use std::time::Duration;

/// A peer's failure, whatever its role's error type.
pub type PeerError = Box<dyn std::error::Error + Send + Sync>;

/// A benchmark cluster that could not be started, or whose peers failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The cluster's section.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The local fabric.
    #[error("the local fabric: {0}")]
    Fabric(#[source] TransportError),
    /// The shm or udp transport.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The peers' cluster spec (`--spec`) could not be encoded or decoded.
    #[error("bad cluster spec: {0}")]
    Spec(#[source] serde_json::Error),
    /// The peer processes.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// Peer threads that failed (`local`).
    #[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    Peers(Vec<PeerError>),
    /// A peer thread panicked.
    #[error("peer thread panicked")]
    PeerPanicked,
}

/// The nodes of a benchmark cluster other than the driver's.
enum Peers {
    Threads(Vec<std::thread::JoinHandle<Result<(), PeerError>>>),
    Processes(Box<NodeProcesses>),
}

/// A running two-or-more-node cluster whose node 0 is driven by this process.
pub struct BenchCluster {
    pub cluster: ClusterSection,
    pub driver: SharedNode,
    peers: Peers,
}

impl BenchCluster {
    /// Starts the cluster: node 0 here, every other node running `ambidex peer --role
    /// ROLE` (on a thread running `local_role` with `local`, in its own process otherwise).
    pub fn start(
        mut cluster: ClusterSection,
        role: &str,
        local_role: fn(SharedNode) -> Result<(), PeerError>,
    ) -> Result<BenchCluster, ClusterError> {
        transports::on_this_host(&mut cluster);
        if cluster.transport == Transport::Local {
            let fabric =
                LocalFabric::new(cluster.cluster_config()?).map_err(ClusterError::Fabric)?;
            let peers = (1..cluster.nodes)
                .map(|n| {
                    let node = fabric.node(n);
                    std::thread::spawn(move || local_role(node))
                })
                .collect();
            return Ok(BenchCluster {
                driver: fabric.node(0),
                cluster,
                peers: Peers::Threads(peers),
            });
        }
        transports::create(&cluster)?;
        let result = (|| {
            let spec = serde_json::to_string(&cluster).map_err(ClusterError::Spec)?;
            let args = |n: u16| -> Vec<String> {
                [
                    "peer",
                    "--role",
                    role,
                    "--node",
                    &n.to_string(),
                    "--spec",
                    &spec,
                ]
                .map(String::from)
                .to_vec()
            };
            let peers = NodeProcesses::spawn(&Launch {
                args: &args,
                nodes: 1..cluster.nodes,
                wrapper: None,
            })?;
            let driver = transports::open_node(&cluster, 0)?;
            Ok((peers, driver))
        })();
        match result {
            Ok((peers, driver)) => Ok(BenchCluster {
                cluster,
                driver,
                peers: Peers::Processes(Box::new(peers)),
            }),
            Err(e) => {
                transports::destroy(&cluster);
                Err(e)
            }
        }
    }

    /// CPU seconds used so far by peer processes (threads are counted with this process).
    pub fn peers_cpu_seconds(&self) -> f64 {
        match &self.peers {
            Peers::Threads(_) => 0.0,
            Peers::Processes(p) => p.cpu_seconds(),
        }
    }

    /// Waits for every peer (5 s) and removes the cluster's files. A peer that failed is
    /// an error, not hidden.
    pub fn finish(self) -> Result<(), ClusterError> {
        let result = match self.peers {
            Peers::Threads(hs) => {
                let mut errors = Vec::new();
                for h in hs {
                    match h.join() {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => errors.push(e),
                        Err(_) => return Err(ClusterError::PeerPanicked),
                    }
                }
                if errors.is_empty() {
                    Ok(())
                } else {
                    Err(ClusterError::Peers(errors))
                }
            }
            Peers::Processes(mut p) => Ok(p.wait_exits(Duration::from_secs(5), "at the end")?),
        };
        drop(self.driver);
        transports::destroy(&self.cluster);
        result
    }
}

/// Opens node `node` of the cluster `spec` (JSON of a [`ClusterSection`]) for a peer.
pub fn open_peer(spec: &str, node: NodeId) -> Result<SharedNode, ClusterError> {
    let cluster: ClusterSection = serde_json::from_str(spec).map_err(ClusterError::Spec)?;
    Ok(transports::open_node(&cluster, node)?)
}
