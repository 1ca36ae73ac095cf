//! One node's share of the database: a store table per registered table holding the keys
//! this node is primary or backup for, and the operations the protocol's handlers (and
//! the coordinator, for keys that are local) perform on it.
//!
//! Every stored value is prefixed by an 8-byte *transaction version*: the id of the
//! transaction that wrote it (unique over the cluster), with bit 63 marking a tombstone.
//! The store's own header version changes with every write too, but it is per item and
//! restarts when an item is recycled; the transaction version names the writer exactly,
//! so validation has no ABA problem and a recorded history gives the exact serialization
//! graph. Deletes leave tombstones so a key's versions form one chain; tombstones are
//! not collected yet (their number is bounded by the keys ever inserted).

use crate::placement::Placement;
use crate::wire::{status, LockToken, WriteKind, WriteRec};
use ambidex_store::{ItemLock, ReadOutcome, StoreError, Table, TableConfig};
use ambidex_transport::NodeId;
use std::cell::RefCell;
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

/// The answer of a read, lock or validation at the key's home.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fetched {
    pub status: u8,
    /// Transaction version (without the tombstone bit); 0 if never written.
    pub version: u64,
    pub token: LockToken,
}

impl Fetched {
    fn just(status: u8) -> Fetched {
        Fetched {
            status,
            version: 0,
            token: LockToken {
                offset: 0,
                store_version: 0,
            },
        }
    }
}

pub struct NodeDb {
    pub node: NodeId,
    pub placement: Placement,
    tables: Vec<Option<(TableSpec, Table)>>,
}

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

fn split_meta(buf: &[u8]) -> (u64, &[u8]) {
    let meta = u64::from_le_bytes(buf[..META].try_into().expect("meta prefix"));
    (meta, &buf[META..])
}

impl NodeDb {
    pub fn new(
        node: NodeId,
        placement: Placement,
        specs: &[TableSpec],
    ) -> Result<Arc<NodeDb>, String> {
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
        }))
    }

    fn table(&self, id: u32) -> Option<&(TableSpec, Table)> {
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

    /// Reads `key`: its status, transaction version, and (found) value appended to `out`
    /// (a `Vec<u8>`, or an RPC handler's `Reply`).
    pub fn read(&self, table: u32, key: u64, out: &mut impl for<'v> Extend<&'v u8>) -> Fetched {
        self.read_into(table, key, Some(out))
    }

    /// The current status and transaction version of `key` (validation).
    pub fn validate(&self, table: u32, key: u64) -> Fetched {
        self.read_into(table, key, None::<&mut Vec<u8>>)
    }

    fn read_into(
        &self,
        table: u32,
        key: u64,
        out: Option<&mut impl for<'v> Extend<&'v u8>>,
    ) -> Fetched {
        let Some((spec, t)) = self.table(table) else {
            return Fetched::just(status::BAD_REQUEST);
        };
        SCRATCH.with(|s| {
            let mut buf = s.borrow_mut();
            buf.resize(META + spec.value_size, 0);
            match t.try_get(key, &mut buf) {
                ReadOutcome::NotFound => Fetched::just(status::ABSENT),
                ReadOutcome::Locked => Fetched::just(status::LOCKED),
                ReadOutcome::Found { .. } => {
                    let (meta, val) = split_meta(&buf);
                    let mut f = Fetched::just(status::OK);
                    f.version = meta & !TOMBSTONE;
                    if meta & TOMBSTONE != 0 {
                        f.status = status::ABSENT;
                    } else if let Some(out) = out {
                        out.extend(val);
                    }
                    f
                }
            }
        })
    }

    /// Locks `key` for a write of `kind` and reads it under the lock. On `OK` (present)
    /// and `ABSENT_LOCKED` (an insert of an absent key) the caller holds the lock (the
    /// token releases it); on any other status nothing is held.
    pub fn lock(
        &self,
        table: u32,
        key: u64,
        kind: WriteKind,
        out: &mut impl for<'v> Extend<&'v u8>,
    ) -> Fetched {
        let Some((spec, t)) = self.table(table) else {
            return Fetched::just(status::BAD_REQUEST);
        };
        SCRATCH.with(|s| {
            let mut buf = s.borrow_mut();
            buf.resize(META + spec.value_size, 0);
            let lk = match t.try_lock_read(key, &mut buf) {
                Ok(lk) => lk,
                Err(StoreError::Locked) => return Fetched::just(status::LOCKED),
                Err(StoreError::NotFound) if kind == WriteKind::Insert => {
                    // Insert a locked tombstone that never existed (version 0).
                    buf.iter_mut().for_each(|b| *b = 0);
                    buf[..META].copy_from_slice(&TOMBSTONE.to_le_bytes());
                    match t.insert_and_lock(key, &buf) {
                        Ok(lk) => lk,
                        Err(StoreError::Exists) | Err(StoreError::Locked) => {
                            return Fetched::just(status::LOCKED)
                        }
                        Err(StoreError::Full) => return Fetched::just(status::FULL),
                        Err(_) => return Fetched::just(status::BAD_REQUEST),
                    }
                }
                Err(StoreError::NotFound) => return Fetched::just(status::ABSENT),
                Err(_) => return Fetched::just(status::BAD_REQUEST),
            };
            let (meta, val) = split_meta(&buf);
            let live = meta & TOMBSTONE == 0;
            let st = match (kind, live) {
                (WriteKind::Insert, true) => status::EXISTS,
                (WriteKind::Insert, false) => status::ABSENT_LOCKED,
                (_, true) => status::OK,
                (_, false) => status::ABSENT,
            };
            if st != status::OK && st != status::ABSENT_LOCKED {
                t.unlock(lk, false);
            } else if live {
                out.extend(val);
            }
            Fetched {
                status: st,
                version: meta & !TOMBSTONE,
                token: LockToken {
                    offset: lk.offset,
                    store_version: lk.version,
                },
            }
        })
    }

    fn held(
        &self,
        table: u32,
        key: u64,
        token: LockToken,
    ) -> Option<(&TableSpec, &Table, ItemLock)> {
        let (spec, t) = self.table(table)?;
        let lk = ItemLock {
            offset: token.offset,
            version: token.store_version,
        };
        t.holds_lock(&lk, key).then_some((spec, t, lk))
    }

    /// Releases a lock taken by [`NodeDb::lock`] without changing the item. A token that
    /// does not name a lock held on `key` is ignored (and reported as `false`).
    pub fn unlock(&self, table: u32, key: u64, token: LockToken) -> bool {
        match self.held(table, key, token) {
            Some((_, t, lk)) => {
                t.unlock(lk, false);
                true
            }
            None => false,
        }
    }

    /// Runs `f` on the stored form of a write (version prefix + value) built in this
    /// thread's scratch buffer; `None` if the value has the wrong size.
    fn with_stored_value<R>(
        txn: u64,
        w: &WriteRec<'_>,
        value_size: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Option<R> {
        SCRATCH.with(|s| {
            let mut v = s.borrow_mut();
            v.clear();
            match w.kind {
                WriteKind::Delete => {
                    v.extend_from_slice(&(txn | TOMBSTONE).to_le_bytes());
                    v.resize(META + value_size, 0);
                }
                _ => {
                    if w.value.len() != value_size {
                        return None;
                    }
                    v.extend_from_slice(&txn.to_le_bytes());
                    v.extend_from_slice(w.value);
                }
            }
            Some(f(&v))
        })
    }

    /// Installs a committed write at the primary: new value, transaction version `txn`,
    /// and the lock released. False if the request does not match a held lock.
    pub fn commit_primary(&self, txn: u64, w: &WriteRec<'_>) -> bool {
        let Some((spec, t, lk)) = self.held(w.table, w.key, w.token) else {
            return false;
        };
        let ok =
            Self::with_stored_value(txn, w, spec.value_size, |v| t.write_locked(&lk, v).is_ok())
                .unwrap_or(false);
        t.unlock(lk, ok);
        ok
    }

    /// Applies a committed write at a backup. The primary holds the key's lock until every
    /// backup acknowledged, so backups see the writes of one key in commit order.
    pub fn apply_backup(&self, txn: u64, w: &WriteRec<'_>) -> bool {
        let Some((spec, t)) = self.table(w.table) else {
            return false;
        };
        Self::with_stored_value(txn, w, spec.value_size, |v| loop {
            match t.update(w.key, v) {
                Ok(_) => return true,
                Err(StoreError::NotFound) => match t.insert(w.key, v) {
                    Ok(_) => return true,
                    Err(StoreError::Exists) => continue,
                    Err(_) => return false,
                },
                Err(_) => return false,
            }
        })
        .unwrap_or(false)
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
