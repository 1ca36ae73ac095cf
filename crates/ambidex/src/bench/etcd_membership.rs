//! The etcd manager for node processes (`cluster.manager = "etcd"`): the launcher
//! creates the run's cluster in etcd ([`bootstrap`]) and reads its final state back
//! ([`final_state`], and [`StateReader`] while it waits to restart a node); each node process connects its agent to etcd itself
//! ([`node_client`]), so no manager call crosses the launcher's control pipes. A node
//! started on its own (`ambidex::Node::start`) has no launcher: it creates the cluster
//! itself if no other node of it did yet, or reads the one there
//! ([`bootstrap_or_read`]), and connects its agent the same way. The
//! membership events are what each node's client published, reported with the node's
//! report ([`NodeReport::manager_events`](crate::bench::NodeReport::manager_events)).
//!
//! Built only with the cargo feature `etcd`; without it every function says so (the
//! configuration refuses `manager = "etcd"` first).

use crate::config::ClusterSection;
use ambidex_cluster::{ClusterState, Event, ManagerClient};
use ambidex_transport::NodeId;
use std::sync::{Arc, Mutex};

/// The run's membership in etcd could not be made, read or joined.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MembershipError {
    /// This build has no etcd client.
    #[error("this ambidex was built without etcd: build it with `--features etcd`")]
    NotBuilt,
    /// The section names no etcd cluster.
    #[error(
        "the launcher names the run's etcd cluster (cluster.etcd_cluster) before it starts \
         the nodes"
    )]
    NoClusterName,
    /// The cluster's shape has no initial configuration.
    #[error("the cluster's initial configuration: {0}")]
    Placement(#[from] ambidex_cluster::PlacementError),
    /// The run's cluster is in etcd already.
    #[error(
        "cluster {0:?} already exists in etcd: a run needs a new one (leave \
         cluster.etcd_cluster unset for a fresh name)"
    )]
    Exists(String),
    /// etcd refused or did not answer.
    #[error("cannot {what} cluster {cluster:?} in etcd: {source}")]
    Etcd {
        /// "create", "read the state of", "connect to read".
        what: &'static str,
        /// The run's cluster.
        cluster: String,
        /// What the client said.
        #[source]
        source: ambidex_cluster::ManagerError,
    },
    /// A node's client could not connect.
    #[error("node {node} cannot connect to etcd: {source}")]
    Client {
        /// The node.
        node: NodeId,
        /// What the client said.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// The run's cluster name and endpoints, or why the section has none.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
fn names(c: &ClusterSection) -> Result<(Vec<&str>, &str), MembershipError> {
    let cluster = c
        .etcd_cluster
        .as_deref()
        .ok_or(MembershipError::NoClusterName)?;
    Ok((
        c.etcd_endpoints.iter().map(String::as_str).collect(),
        cluster,
    ))
}

/// Creates the run's cluster (`cluster.etcd_cluster`, which must not exist) in the
/// cluster's initial configuration; every member's lease runs from now. Waits up to
/// 10 s for etcd to answer.
pub fn bootstrap(c: &ClusterSection) -> Result<(), MembershipError> {
    match create(c)? {
        true => Ok(()),
        false => Err(MembershipError::Exists(names(c)?.1.into())),
    }
}

/// The cluster `cluster.etcd_cluster` as a node started on its own
/// (`ambidex::Node::start`) finds it: created now by this call in the cluster's initial
/// configuration (`None`; every member's lease runs from now), or already there (made
/// by another node of it): its state, and why it stopped, if it did. Waits up to 10 s
/// for etcd to answer.
pub fn bootstrap_or_read(
    c: &ClusterSection,
) -> Result<Option<(ClusterState, Option<String>)>, MembershipError> {
    match create(c)? {
        true => Ok(None),
        false => final_state(c).map(Some),
    }
}

/// Creates cluster `cluster.etcd_cluster` in the initial configuration: false if it
/// exists already (then nothing is written).
fn create(c: &ClusterSection) -> Result<bool, MembershipError> {
    #[cfg(feature = "etcd")]
    {
        use ambidex_cluster::{Configuration, EtcdManager, ManagerError};
        use std::time::{Duration, Instant};
        let (eps, cluster) = names(c)?;
        let config = Configuration::initial(c.nodes, c.replication)?;
        let lease = Duration::from_millis(c.lease_ms);
        let start = Instant::now();
        loop {
            match EtcdManager::bootstrap(&eps, cluster, config.clone(), lease) {
                Ok(created) => return Ok(created),
                Err(ManagerError::Unreachable(_)) if start.elapsed() < Duration::from_secs(10) => {
                    std::thread::sleep(Duration::from_millis(100))
                }
                Err(source) => {
                    return Err(MembershipError::Etcd {
                        what: "create",
                        cluster: cluster.into(),
                        source,
                    })
                }
            }
        }
    }
    #[cfg(not(feature = "etcd"))]
    {
        let _ = c;
        Err(MembershipError::NotBuilt)
    }
}

/// The run's cluster as etcd holds it, and why it stopped, if it did.
pub fn final_state(c: &ClusterSection) -> Result<(ClusterState, Option<String>), MembershipError> {
    #[cfg(feature = "etcd")]
    {
        let (eps, cluster) = names(c)?;
        ambidex_cluster::EtcdManager::state(&eps, cluster).map_err(|source| MembershipError::Etcd {
            what: "read the state of",
            cluster: cluster.into(),
            source,
        })
    }
    #[cfg(not(feature = "etcd"))]
    {
        let _ = c;
        Err(MembershipError::NotBuilt)
    }
}

/// The run's cluster in etcd, read on one connection kept open (read only): what the
/// launcher polls before it restarts a dead node (`bench --restart`).
pub struct StateReader {
    #[cfg(feature = "etcd")]
    reader: ambidex_cluster::manager::etcd::EtcdReader,
    #[cfg(feature = "etcd")]
    cluster: String,
}

impl StateReader {
    /// Connects to the etcd of `c` (`etcd_endpoints`) to read cluster `etcd_cluster`.
    pub fn connect(c: &ClusterSection) -> Result<StateReader, MembershipError> {
        #[cfg(feature = "etcd")]
        {
            let (eps, cluster) = names(c)?;
            let reader = ambidex_cluster::manager::etcd::EtcdReader::connect(&eps, cluster)
                .map_err(|source| MembershipError::Etcd {
                    what: "connect to read",
                    cluster: cluster.into(),
                    source,
                })?;
            Ok(StateReader {
                reader,
                cluster: cluster.into(),
            })
        }
        #[cfg(not(feature = "etcd"))]
        {
            let _ = c;
            Err(MembershipError::NotBuilt)
        }
    }

    /// The cluster's state now, and why it stopped, if it did.
    pub fn read(&mut self) -> Result<(ClusterState, Option<String>), MembershipError> {
        #[cfg(feature = "etcd")]
        {
            let cluster = self.cluster.clone();
            self.reader.state().map_err(|source| MembershipError::Etcd {
                what: "read the state of",
                cluster,
                source,
            })
        }
        #[cfg(not(feature = "etcd"))]
        {
            Err(MembershipError::NotBuilt)
        }
    }
}

/// Node `node`'s client of the run's cluster in etcd as incarnation `incarnation` (1,
/// or the next one of a restarted node, which then joins), whose published events go
/// to `sink` when it is dropped, on the system clock.
pub fn node_client(
    c: &ClusterSection,
    node: NodeId,
    incarnation: u64,
    sink: Arc<Mutex<Vec<Event>>>,
) -> Result<Box<dyn ManagerClient>, MembershipError> {
    #[cfg(feature = "etcd")]
    {
        let (_, cluster) = names(c)?;
        let clock = ambidex_transport::clock::SystemClock::shared();
        let client = ambidex_txn::runner::etcd::Recording::connect(
            &c.etcd_endpoints,
            cluster,
            (node, incarnation),
            std::time::Duration::from_millis(c.lease_ms),
            &clock,
            sink,
        )
        .map_err(|source| MembershipError::Client {
            node,
            source: Box::new(source),
        })?;
        Ok(Box::new(client))
    }
    #[cfg(not(feature = "etcd"))]
    {
        let _ = (c, node, incarnation, sink);
        Err(MembershipError::NotBuilt)
    }
}
