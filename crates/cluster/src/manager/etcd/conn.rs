//! The etcd manager's connection: an etcd client and the current-thread runtime that
//! drives it, every call bounded by [`CALL_TIMEOUT`].

use super::keys::{Keys, Kv, Snapshot};
use crate::manager::ManagerError;
use etcd_client::{Client, ConnectOptions, GetOptions, PutOptions, Txn};
use std::future::Future;
use std::time::Duration;
use tokio::runtime::Runtime;

/// How long one etcd call may take before the manager counts as unreachable.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// An etcd call failed: the manager is unreachable (for this call).
pub fn unreachable(e: impl std::fmt::Display) -> ManagerError {
    ManagerError::Unreachable(e.to_string())
}

/// A connection to etcd and the runtime that drives it.
pub(super) struct Conn {
    pub rt: Runtime,
    pub client: Client,
    pub keys: Keys,
}

impl Conn {
    pub fn open(endpoints: &[&str], cluster: &str) -> Result<Conn, ManagerError> {
        let keys = Keys::new(cluster)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(unreachable)?;
        let opts = ConnectOptions::new()
            .with_connect_timeout(CALL_TIMEOUT)
            .with_timeout(CALL_TIMEOUT);
        let client = rt
            .block_on(Client::connect(endpoints, Some(opts)))
            .map_err(unreachable)?;
        Ok(Conn { rt, client, keys })
    }

    /// Runs `f` for at most `limit`; `None` if it did not finish.
    pub fn within<T>(&self, limit: Duration, f: impl Future<Output = T>) -> Option<T> {
        // The timer needs the runtime's context: made inside it.
        self.rt
            .block_on(async { tokio::time::timeout(limit, f).await.ok() })
    }

    /// Runs `f` to completion, at most [`CALL_TIMEOUT`].
    pub fn run<T, E: std::fmt::Display>(
        &self,
        f: impl Future<Output = Result<T, E>>,
    ) -> Result<T, ManagerError> {
        match self.within(CALL_TIMEOUT, f) {
            Some(r) => r.map_err(unreachable),
            None => Err(ManagerError::Unreachable("etcd call timed out".into())),
        }
    }

    /// Reads every key of the cluster; `None` if it has no state (not bootstrapped).
    /// Also returns the etcd revision read at.
    pub fn read(&mut self) -> Result<(Option<Snapshot>, i64), ManagerError> {
        let mut kv = self.client.kv_client();
        let root = self.keys.root().to_string();
        let resp = self.run(kv.get(root, Some(GetOptions::new().with_prefix())))?;
        let at = resp.header().map_or(0, |h| h.revision());
        let snap = Snapshot::parse(
            &self.keys,
            resp.kvs().iter().map(|k| Kv {
                key: k.key(),
                value: k.value(),
                mod_revision: k.mod_revision(),
                lease: k.lease(),
            }),
        )?;
        Ok((snap, at))
    }

    pub fn grant(&mut self, ttl: i64) -> Result<(i64, i64), ManagerError> {
        let mut l = self.client.lease_client();
        let g = self.run(l.grant(ttl, None))?;
        Ok((g.id(), g.ttl()))
    }

    pub fn txn(&mut self, t: Txn) -> Result<bool, ManagerError> {
        let mut kv = self.client.kv_client();
        Ok(self.run(kv.txn(t))?.succeeded())
    }

    pub fn put(&mut self, key: String, value: String, lease: i64) -> Result<(), ManagerError> {
        let mut kv = self.client.kv_client();
        let opts = (lease != 0).then(|| PutOptions::new().with_lease(lease));
        self.run(kv.put(key, value, opts)).map(drop)
    }
}
