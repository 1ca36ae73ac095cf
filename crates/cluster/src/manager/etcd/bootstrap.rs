//! Creating a cluster in etcd.

use super::conn::Conn;
use super::keys::{lease_value, Record};
use super::ttl_secs;
use crate::config::Configuration;
use crate::manager::ManagerError;
use crate::membership::{ClusterState, Stage};
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use std::time::Duration;

/// Creates clusters in etcd.
pub struct EtcdManager;

impl EtcdManager {
    /// Creates cluster `cluster` in `config` (stage Run) unless it exists; every
    /// member's lease runs for `lease` from now, so the nodes have that long to
    /// connect. Returns whether it created it.
    pub fn bootstrap(
        endpoints: &[&str],
        cluster: &str,
        config: Configuration,
        lease: Duration,
    ) -> Result<bool, ManagerError> {
        config
            .check()
            .map_err(|e| ManagerError::Protocol(e.to_string()))?;
        let mut c = Conn::open(endpoints, cluster)?;
        let (lease_id, _) = c.grant(ttl_secs(lease))?;
        let mut ops = Vec::new();
        for n in config.placement.members() {
            ops.push(TxnOp::put(
                c.keys.lease(n),
                lease_value(config.incarnations[n as usize], false),
                Some(PutOptions::new().with_lease(lease_id)),
            ));
        }
        let record = Record {
            state: ClusterState {
                config,
                stage: Stage::Run,
                revision: 1,
            },
            failed: None,
        };
        ops.push(TxnOp::put(c.keys.state(), record.encode(), None));
        let created = c.txn(
            Txn::new()
                .when([Compare::create_revision(
                    c.keys.state(),
                    CompareOp::Equal,
                    0,
                )])
                .and_then(ops),
        )?;
        if !created {
            let mut l = c.client.lease_client();
            c.run(l.revoke(lease_id))?;
        }
        Ok(created)
    }

    /// Reads cluster `cluster`'s state as etcd holds it (read only: no lease is taken,
    /// nothing is written), and why it stopped, if it did. An error if it was never
    /// bootstrapped. What a launcher reports at the end of a run.
    pub fn state(
        endpoints: &[&str],
        cluster: &str,
    ) -> Result<(ClusterState, Option<String>), ManagerError> {
        EtcdReader::connect(endpoints, cluster)?.state()
    }
}

/// A read-only view of one cluster's state in etcd, on one connection kept open: what
/// a launcher polls while it waits for a dead node to be removed before it restarts
/// it. It takes no lease and writes nothing.
pub struct EtcdReader {
    conn: Conn,
}

impl EtcdReader {
    pub fn connect(endpoints: &[&str], cluster: &str) -> Result<EtcdReader, ManagerError> {
        Ok(EtcdReader {
            conn: Conn::open(endpoints, cluster)?,
        })
    }

    /// The cluster's state as etcd holds it now, and why it stopped, if it did. An
    /// error if it was never bootstrapped.
    pub fn state(&mut self) -> Result<(ClusterState, Option<String>), ManagerError> {
        match self.conn.read()?.0 {
            Some(snap) => Ok((snap.record.state, snap.record.failed)),
            None => Err(ManagerError::Protocol(format!(
                "cluster {} has no state in etcd (not bootstrapped)",
                self.conn.keys.root()
            ))),
        }
    }
}
