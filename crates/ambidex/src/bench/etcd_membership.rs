//! The etcd manager for node processes (`cluster.manager = "etcd"`): the launcher
//! creates the run's cluster in etcd ([`bootstrap`]) and reads its final state back
//! ([`final_state`], and [`StateReader`] while it waits to restart a node); each node process connects its agent to etcd itself
//! ([`node_client`]), so no manager call crosses the launcher's control pipes. The
//! membership events are what each node's client published, reported with the node's
//! report ([`NodeReport::manager_events`](crate::bench::NodeReport::manager_events)).
//!
//! Built only with the cargo feature `etcd`; without it every function says so (the
//! configuration refuses `manager = "etcd"` first).

use crate::config::ClusterSection;
use ambidex_cluster::{ClusterState, Event, ManagerClient};
use ambidex_transport::NodeId;
use std::sync::{Arc, Mutex};

/// The run's cluster name and endpoints, or why the section has none.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
fn names(c: &ClusterSection) -> Result<(Vec<&str>, &str), String> {
    let cluster = c
        .etcd_cluster
        .as_deref()
        .ok_or("the launcher names the run's etcd cluster (cluster.etcd_cluster) before it starts the nodes")?;
    Ok((
        c.etcd_endpoints.iter().map(String::as_str).collect(),
        cluster,
    ))
}

#[cfg(not(feature = "etcd"))]
const NOT_BUILT: &str = "this ambidex was built without etcd: build it with `--features etcd`";

/// Creates the run's cluster (`cluster.etcd_cluster`, which must not exist) in the
/// cluster's initial configuration; every member's lease runs from now. Waits up to
/// 10 s for etcd to answer.
pub fn bootstrap(c: &ClusterSection) -> Result<(), String> {
    #[cfg(feature = "etcd")]
    {
        use ambidex_cluster::{Configuration, EtcdManager, ManagerError};
        use std::time::{Duration, Instant};
        let (eps, cluster) = names(c)?;
        let config = Configuration::initial(c.nodes, c.replication).map_err(|e| e.to_string())?;
        let lease = Duration::from_millis(c.lease_ms);
        let start = Instant::now();
        loop {
            match EtcdManager::bootstrap(&eps, cluster, config.clone(), lease) {
                Ok(true) => return Ok(()),
                Ok(false) => {
                    return Err(format!(
                        "cluster {cluster:?} already exists in etcd: a run needs a new one \
                         (leave cluster.etcd_cluster unset for a fresh name)"
                    ))
                }
                Err(ManagerError::Unreachable(_)) if start.elapsed() < Duration::from_secs(10) => {
                    std::thread::sleep(Duration::from_millis(100))
                }
                Err(e) => return Err(format!("cannot create cluster {cluster:?} in etcd: {e}")),
            }
        }
    }
    #[cfg(not(feature = "etcd"))]
    {
        let _ = c;
        Err(NOT_BUILT.into())
    }
}

/// The run's cluster as etcd holds it, and why it stopped, if it did.
pub fn final_state(c: &ClusterSection) -> Result<(ClusterState, Option<String>), String> {
    #[cfg(feature = "etcd")]
    {
        let (eps, cluster) = names(c)?;
        ambidex_cluster::EtcdManager::state(&eps, cluster)
            .map_err(|e| format!("cannot read cluster {cluster:?}'s state from etcd: {e}"))
    }
    #[cfg(not(feature = "etcd"))]
    {
        let _ = c;
        Err(NOT_BUILT.into())
    }
}

/// The run's cluster in etcd, read on one connection kept open (read only): what the
/// launcher polls before it restarts a dead node (`bench --restart`).
pub struct StateReader {
    #[cfg(feature = "etcd")]
    reader: ambidex_cluster::manager::etcd::EtcdReader,
}

impl StateReader {
    /// Connects to the etcd of `c` (`etcd_endpoints`) to read cluster `etcd_cluster`.
    pub fn connect(c: &ClusterSection) -> Result<StateReader, String> {
        #[cfg(feature = "etcd")]
        {
            let (eps, cluster) = names(c)?;
            let reader = ambidex_cluster::manager::etcd::EtcdReader::connect(&eps, cluster)
                .map_err(|e| format!("cannot connect to etcd to read cluster {cluster:?}: {e}"))?;
            Ok(StateReader { reader })
        }
        #[cfg(not(feature = "etcd"))]
        {
            let _ = c;
            Err(NOT_BUILT.into())
        }
    }

    /// The cluster's state now, and why it stopped, if it did.
    pub fn read(&mut self) -> Result<(ClusterState, Option<String>), String> {
        #[cfg(feature = "etcd")]
        {
            self.reader
                .state()
                .map_err(|e| format!("cannot read the cluster's state from etcd: {e}"))
        }
        #[cfg(not(feature = "etcd"))]
        {
            Err(NOT_BUILT.into())
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
) -> Result<Box<dyn ManagerClient>, String> {
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
        .map_err(|e| e.to_string())?;
        Ok(Box::new(client))
    }
    #[cfg(not(feature = "etcd"))]
    {
        let _ = (c, node, incarnation, sink);
        Err(NOT_BUILT.into())
    }
}
