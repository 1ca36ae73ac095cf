//! One node's share of the database: a store table per registered table holding the keys
//! this node is primary or backup for (the operations on its items are in
//! [`crate::actions`]).
//!
//! Every stored value is prefixed by an 8-byte *transaction version*: the id of the
//! transaction that wrote it (unique over the cluster), with bit 63 marking a tombstone.
//! The store's own header version changes with every write too, but it is per item and
//! restarts when an item is recycled; the transaction version names the writer exactly,
//! so validation has no ABA problem and a recorded history gives the exact serialization
//! graph. Deletes leave tombstones so a key's versions form one chain; tombstones are
//! not collected yet (their number is bounded by the keys ever inserted).

use crate::placement::Placement;
use ambidex_store::{Header, LockOwner, Table, TableConfig};
use ambidex_transport::NodeId;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// Marks a tombstone in the transaction version word.
pub const TOMBSTONE: u64 = 1 << 63;
/// The transaction version of loaded data (the initial state, "T0" of a history).
pub const LOAD_VERSION: u64 = 1;
/// Bytes of the transaction version prefix of every stored value.
pub const META: usize = 8;

/// A table as the application declares it.
#[derive(Clone, Debug)]
pub struct TableSpec {
    pub id: u32,
    pub name: String,
    /// Every value of the table has exactly this many bytes.
    pub value_size: usize,
    /// Keys (primaries and backups) one node must hold; the store is sized from it.
    pub capacity_per_node: usize,
}

pub struct NodeDb {
    pub node: NodeId,
    pub placement: Placement,
    tables: Vec<Option<(TableSpec, Table)>>,
    /// Requests the handlers answered with `BadRequest` (malformed, unknown table, lock
    /// not held): counted drops of untrusted input.
    pub bad_requests: AtomicU64,
}

/// The transaction version and value of a stored value (always `META` bytes or more:
/// every table stores `META + value_size`).
pub(crate) fn split_meta(buf: &[u8]) -> (u64, &[u8]) {
    let (m, v) = buf.split_at(META.min(buf.len()));
    let mut meta = [0u8; META];
    meta[..m.len()].copy_from_slice(m);
    (u64::from_le_bytes(meta), v)
}

impl NodeDb {
    pub fn new(
        node: NodeId,
        placement: Placement,
        specs: &[TableSpec],
    ) -> Result<Arc<NodeDb>, String> {
        if placement.nodes > LockOwner::MAX_NODES {
            return Err(format!(
                "{} nodes: lock words name at most {} nodes",
                placement.nodes,
                LockOwner::MAX_NODES
            ));
        }
        let max_id = specs.iter().map(|s| s.id).max().unwrap_or(0) as usize;
        if max_id > 1024 {
            return Err("table ids must be at most 1024".into());
        }
        let mut tables: Vec<Option<(TableSpec, Table)>> = (0..=max_id).map(|_| None).collect();
        for s in specs {
            if tables[s.id as usize].is_some() {
                return Err(format!("table id {} registered twice", s.id));
            }
            let cfg = TableConfig::new(s.capacity_per_node.max(16), META + s.value_size);
            let t = Table::create_anonymous(s.id, &cfg)
                .map_err(|e| format!("cannot create table {} ({}): {e}", s.id, s.name))?;
            tables[s.id as usize] = Some((s.clone(), t));
        }
        Ok(Arc::new(NodeDb {
            node,
            placement,
            tables,
            bad_requests: AtomicU64::new(0),
        }))
    }

    pub(crate) fn table(&self, id: u32) -> Option<&(TableSpec, Table)> {
        self.tables.get(id as usize)?.as_ref()
    }

    pub fn value_size(&self, table: u32) -> Option<usize> {
        self.table(table).map(|(s, _)| s.value_size)
    }

    pub fn spec(&self, table: u32) -> Option<&TableSpec> {
        self.table(table).map(|(s, _)| s)
    }

    /// Stores `value` for `key` if this node holds a copy of it; returns whether it did.
    pub fn load(&self, table: u32, key: u64, value: &[u8]) -> Result<bool, String> {
        if !self.placement.stores(self.node, table, key) {
            return Ok(false);
        }
        let (spec, t) = self
            .table(table)
            .ok_or_else(|| format!("unknown table {table}"))?;
        if value.len() != spec.value_size {
            return Err(format!(
                "value of {} bytes for table {} of {}-byte values",
                value.len(),
                spec.name,
                spec.value_size
            ));
        }
        let mut v = Vec::with_capacity(META + value.len());
        v.extend_from_slice(&LOAD_VERSION.to_le_bytes());
        v.extend_from_slice(value);
        t.insert(key, &v)
            .map_err(|e| format!("loading key {key} into {}: {e}", spec.name))?;
        Ok(true)
    }

    /// The lock word of `key`'s item, unpacked (who holds its lock, and the store
    /// version); `None` if the table or key is unknown here. For recovery and tests.
    pub fn lock_word(&self, table: u32, key: u64) -> Option<Header> {
        self.table(table)?.1.header(key)
    }

    /// Every key this node stores in `table` with its transaction version and value,
    /// tombstones included (for replica-consistency checks).
    pub fn dump(&self, table: u32) -> Vec<(u64, u64, Vec<u8>)> {
        let Some((_, t)) = self.table(table) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        t.for_each(|key, val| {
            let (meta, v) = split_meta(val);
            out.push((key, meta, v.to_vec()));
        });
        out.sort_by_key(|e| e.0);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_nodes_than_lock_words_can_name_is_an_error() {
        let p = |n| Placement::new(n, 1).unwrap();
        assert!(NodeDb::new(0, p(LockOwner::MAX_NODES), &[]).is_ok());
        let e = NodeDb::new(0, p(LockOwner::MAX_NODES + 1), &[])
            .err()
            .expect("65 nodes accepted");
        assert!(e.contains("lock words"), "{e}");
    }
}
