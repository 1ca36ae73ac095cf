//! What the simulator checks after every run, on the quiescent cluster, besides the
//! serializability checker and the workload's own invariants: replica consistency, that
//! every committed write is installed (no committed transaction lost), that no lock was
//! left behind; plus the in-memory history sink and the final-state digest.

use ambidex_history::{
    encode_hex, Outcome, ReadRecord, TxnRecord, WriteKind as HKind, WriteRecord,
};
use ambidex_transport::{NodeId, ThreadId};
use ambidex_transport_sim::{hash_bytes, mix, HASH_SEED};
use ambidex_txn::actions;
use ambidex_txn::db::TOMBSTONE;
use ambidex_txn::messages::Status;
use ambidex_txn::{AbortReason, HistorySink, ItemView, NodeDb, Placement};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::sync::Arc;

/// Most problems listed per check (the count of the rest is given).
const MAX_LISTED: usize = 5;

/// Records every finished transaction of a thread into a shared in-memory list, exactly
/// as `ambidex_txn::history::RecorderSink` writes them to a file (no JSON round trip),
/// and keeps the transactions whose log phase started and that have not finished in
/// `pending` (shared by the node's threads): if the node crashes, their outcome is
/// unknown ([`Outcome::Unknown`]).
pub struct MemorySink {
    pub recs: Rc<RefCell<Vec<TxnRecord>>>,
    /// The node's clock offset from simulated time (µs), written into every record.
    pub clock_offset_us: u64,
    /// Transactions of the node that may commit without their coordinator, by id.
    pub pending: Rc<RefCell<BTreeMap<u64, TxnRecord>>>,
}

/// A record of `items` as the history format has it.
#[allow(clippy::too_many_arguments)]
fn to_record(
    id: u64,
    node: NodeId,
    thread: ThreadId,
    outcome: Outcome,
    reason: Option<String>,
    (start_ns, end_ns): (u64, u64),
    clock_offset_us: u64,
    items: &[ItemView<'_>],
) -> TxnRecord {
    let mut reads = Vec::with_capacity(items.len());
    let mut writes = Vec::new();
    for it in items {
        reads.push(ReadRecord {
            table: it.table,
            key: it.key,
            version: it.version,
            value: it.exists.then(|| encode_hex(it.value)),
        });
        // The same writes as the file recorder records.
        if let Some((kind, value)) = ambidex_txn::history::recorded_write(it) {
            writes.push(WriteRecord {
                table: it.table,
                key: it.key,
                kind,
                prev_version: it.version,
                version: id,
                value: value.map(encode_hex),
            });
        }
    }
    TxnRecord {
        id,
        node: node as u32,
        thread: thread as u32,
        outcome,
        reason,
        start_us: start_ns / 1000,
        end_us: end_ns / 1000,
        clock_offset_us: Some(clock_offset_us),
        reads,
        writes,
    }
}

impl HistorySink for MemorySink {
    fn record(
        &mut self,
        id: u64,
        node: NodeId,
        thread: ThreadId,
        outcome: Result<(), AbortReason>,
        start_ns: u64,
        end_ns: u64,
        items: &[ItemView<'_>],
    ) {
        self.pending.borrow_mut().remove(&id);
        self.recs.borrow_mut().push(to_record(
            id,
            node,
            thread,
            if outcome.is_ok() {
                Outcome::Committed
            } else {
                Outcome::Aborted
            },
            outcome.err().map(|r| r.name().to_string()),
            (start_ns, end_ns),
            self.clock_offset_us,
            items,
        ));
    }

    fn pending(
        &mut self,
        id: u64,
        node: NodeId,
        thread: ThreadId,
        start_ns: u64,
        items: &[ItemView<'_>],
    ) {
        let r = to_record(
            id,
            node,
            thread,
            Outcome::Unknown,
            None,
            (start_ns, start_ns),
            self.clock_offset_us,
            items,
        );
        self.pending.borrow_mut().insert(id, r);
    }
}

/// Collects up to MAX_LISTED problems of one kind and counts the rest.
struct Problems {
    what: &'static str,
    listed: Vec<String>,
    total: usize,
}

impl Problems {
    fn new(what: &'static str) -> Problems {
        Problems {
            what,
            listed: Vec::new(),
            total: 0,
        }
    }

    fn add(&mut self, p: impl FnOnce() -> String) {
        self.total += 1;
        if self.listed.len() < MAX_LISTED {
            self.listed.push(p());
        }
    }

    fn into_failure(self) -> Option<String> {
        if self.total == 0 {
            return None;
        }
        let more = if self.total > self.listed.len() {
            format!("; and {} more", self.total - self.listed.len())
        } else {
            String::new()
        };
        Some(format!(
            "{}: {} problem(s): {}{more}",
            self.what,
            self.total,
            self.listed.join("; ")
        ))
    }
}

/// True for a stored value that is a tombstone nobody ever wrote (an aborted insert's
/// placeholder at the primary): equivalent to no entry at all.
fn never_written(meta: u64) -> bool {
    meta == TOMBSTONE
}

/// A stored row: (node, key, meta = transaction version with the tombstone bit, value).
type Row = (NodeId, u64, u64, Vec<u8>);
/// The copies of one key: (node, meta, value).
type Copies<'a> = Vec<(NodeId, u64, &'a [u8])>;

/// Every node's stored rows of every table, read once after the run.
pub struct Dump {
    /// Per table id, every row of every node, tombstones included.
    tables: Vec<(u32, Vec<Row>)>,
}

impl Dump {
    /// The rows of every node (the tests' dump; a run dumps its members only).
    #[cfg(test)]
    pub fn of(dbs: &[Arc<NodeDb>], tables: &[u32]) -> Dump {
        Dump::of_members(dbs, tables, u64::MAX)
    }

    /// The rows of the nodes in `members` (bit i: node i) only: a node removed from
    /// the cluster (crashed, or cut off and fenced) holds nothing that counts.
    pub fn of_members(dbs: &[Arc<NodeDb>], tables: &[u32], members: u64) -> Dump {
        Dump {
            tables: tables
                .iter()
                .map(|&t| {
                    let rows = dbs
                        .iter()
                        .filter(|db| members & (1 << db.node) != 0)
                        .flat_map(|db| {
                            db.dump(t)
                                .into_iter()
                                .map(move |(k, m, v)| (db.node, k, m, v))
                        })
                        .collect();
                    (t, rows)
                })
                .collect(),
        }
    }

    /// A digest of every node's stored data (keys, versions, values), table by table.
    pub fn digest(&self) -> u64 {
        let mut h = HASH_SEED;
        for (t, rows) in &self.tables {
            h = mix(h, *t as u64);
            for (node, key, meta, value) in rows {
                h = hash_bytes(mix(mix(mix(h, *node as u64), *key), *meta), value);
            }
        }
        h
    }
}

/// Every replica of every key holds exactly its primary's version and value, and copies
/// exist exactly on the key's replicas.
pub fn replica_consistency(
    dbs: &[Arc<NodeDb>],
    placement: &Placement,
    dump: &Dump,
) -> Option<String> {
    let mut pr = Problems::new("replica consistency");
    for (table, rows) in &dump.tables {
        let table = *table;
        let mut by_key: BTreeMap<u64, Copies<'_>> = BTreeMap::new();
        for (node, key, meta, value) in rows {
            if !never_written(*meta) {
                by_key.entry(*key).or_default().push((*node, *meta, value));
            }
        }
        for (key, copies) in &by_key {
            let p = placement.primary(table, *key);
            let want = placement.replicas(table, *key);
            for c in copies.iter().filter(|c| !want.contains(&c.0)) {
                pr.add(|| {
                    format!(
                        "table {table} key {key}: a copy on node {}, not a replica",
                        c.0
                    )
                });
            }
            let Some(primary) = copies.iter().find(|c| c.0 == p) else {
                let locked =
                    actions::check_version(&dbs[p as usize], table, *key).status == Status::Locked;
                pr.add(|| {
                    format!(
                        "table {table} key {key}: no copy at its primary {p}{}",
                        if locked {
                            " (the key is still locked there)"
                        } else {
                            ""
                        }
                    )
                });
                continue;
            };
            for &n in &want[1..] {
                match copies.iter().find(|c| c.0 == n) {
                    None => pr.add(|| {
                        format!("table {table} key {key}: backup {n} has no copy (primary {p} has version {:#x})", primary.1)
                    }),
                    Some(c) => {
                        let same = c.1 == primary.1 && (c.1 & TOMBSTONE != 0 || c.2 == primary.2);
                        if !same {
                            pr.add(|| {
                                format!(
                                    "table {table} key {key}: backup {n} has version {:#x}, primary {p} has {:#x}{}",
                                    c.1,
                                    primary.1,
                                    if c.1 == primary.1 { " (values differ)" } else { "" }
                                )
                            });
                        }
                    }
                }
            }
        }
    }
    pr.into_failure()
}

/// Every key's chain of committed writes ends at the version its primary holds, with the
/// committed value: no committed write was lost or left half-installed.
pub fn committed_writes_installed(
    dbs: &[Arc<NodeDb>],
    placement: &Placement,
    recs: &[TxnRecord],
) -> Option<String> {
    let mut chains: BTreeMap<(u32, u64), Vec<&WriteRecord>> = BTreeMap::new();
    for r in recs.iter().filter(|r| r.is_committed()) {
        for w in &r.writes {
            chains.entry((w.table, w.key)).or_default().push(w);
        }
    }
    let mut pr = Problems::new("committed writes installed");
    let mut buf = Vec::new();
    for ((table, key), ws) in &chains {
        let overwritten: BTreeSet<u64> = ws.iter().map(|w| w.prev_version).collect();
        let heads: Vec<&&WriteRecord> = ws
            .iter()
            .filter(|w| !overwritten.contains(&w.version))
            .collect();
        if heads.len() != 1 {
            // A fork (or a cycle) of the version chain; the serializability checker
            // names it, here it only means there is no single last write to look for.
            pr.add(|| {
                format!(
                    "table {table} key {key}: {} last committed writes, not one",
                    heads.len()
                )
            });
            continue;
        }
        let h = heads[0];
        let p = placement.primary(*table, *key);
        buf.clear();
        let f = actions::read(&dbs[p as usize], *table, *key, &mut buf);
        let ok = match h.kind {
            HKind::Delete => f.status == Status::Absent && f.version == h.version,
            _ => {
                f.status == Status::Ok
                    && f.version == h.version
                    && h.value.as_deref() == Some(encode_hex(&buf).as_str())
            }
        };
        if !ok {
            pr.add(|| {
                format!(
                    "table {table} key {key}: the last committed write is T{} ({:?}), primary {p} has version {:#x} (status {})",
                    h.version, h.kind, f.version, f.status
                )
            });
        }
    }
    pr.into_failure()
}

/// No lock is held anywhere once the cluster is quiescent: every key any transaction
/// wrote (or tried to) is unlocked at its primary.
pub fn no_locks_held(
    dbs: &[Arc<NodeDb>],
    placement: &Placement,
    recs: &[TxnRecord],
) -> Option<String> {
    let keys: BTreeSet<(u32, u64)> = recs
        .iter()
        .flat_map(|r| r.writes.iter().map(|w| (w.table, w.key)))
        .collect();
    let mut pr = Problems::new("locks released");
    for (table, key) in keys {
        let p = placement.primary(table, key);
        if actions::check_version(&dbs[p as usize], table, key).status == Status::Locked {
            pr.add(|| format!("table {table} key {key} is still locked at its primary {p}"));
        }
    }
    pr.into_failure()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ambidex_txn::messages::{LockToken, WriteRec};
    use ambidex_txn::LockOwner;
    use ambidex_txn::WriteKind;
    /// The owner of these tests' locks.
    const OWNER: LockOwner = LockOwner {
        node: 0,
        thread: 0,
        slot: 0,
    };
    use ambidex_txn::TableSpec;

    const T: u32 = 5;

    fn cluster() -> (Vec<Arc<NodeDb>>, Placement) {
        let p = Placement::new(3, 3).unwrap();
        let spec = TableSpec {
            id: T,
            name: "t".into(),
            value_size: 8,
            capacity_per_node: 64,
        };
        let fabric =
            ambidex_transport::local::LocalFabric::new(ambidex_transport::ClusterConfig::new(3, 1))
                .unwrap();
        let dbs: Vec<Arc<NodeDb>> = fabric
            .nodes()
            .iter()
            .map(|n| NodeDb::new(&**n, p.clone(), std::slice::from_ref(&spec)).unwrap())
            .collect();
        for k in 0..10u64 {
            for db in &dbs {
                db.load(T, k, &k.to_le_bytes()).unwrap();
            }
        }
        (dbs, p)
    }

    fn write(key: u64, prev: u64, value: &[u8]) -> WriteRec<'_> {
        WriteRec {
            table: T,
            key,
            kind: WriteKind::Update,
            prev_version: prev,
            token: LockToken {
                offset: 0,
                store_version: 0,
            },
            value,
        }
    }

    /// `write` as the next write after `db`'s copy of `key` (a backup applies it at
    /// the version it names).
    fn next_write<'a>(db: &NodeDb, key: u64, prev: u64, value: &'a [u8]) -> WriteRec<'a> {
        let store_version = db.lock_word(T, key).expect("the key is stored").version;
        WriteRec {
            token: LockToken {
                offset: 0,
                store_version,
            },
            ..write(key, prev, value)
        }
    }

    fn committed(id: u64, key: u64, prev: u64, value: &[u8]) -> TxnRecord {
        TxnRecord {
            id,
            node: 0,
            thread: 0,
            outcome: Outcome::Committed,
            reason: None,
            start_us: 0,
            end_us: 1,
            clock_offset_us: None,
            reads: vec![],
            writes: vec![WriteRecord {
                table: T,
                key,
                kind: HKind::Update,
                prev_version: prev,
                version: id,
                value: Some(encode_hex(value)),
            }],
        }
    }

    #[test]
    fn a_consistent_cluster_passes_every_check() {
        let (dbs, p) = cluster();
        let dump = Dump::of(&dbs, &[T]);
        assert_eq!(replica_consistency(&dbs, &p, &dump), None);
        assert_eq!(committed_writes_installed(&dbs, &p, &[]), None);
        assert_eq!(no_locks_held(&dbs, &p, &[]), None);
    }

    #[test]
    fn a_diverged_backup_is_reported() {
        let (dbs, p) = cluster();
        let key = 3;
        let backup = p.replicas(T, key)[1];
        assert!(actions::apply_backup(
            &dbs[backup as usize],
            77,
            &next_write(&dbs[backup as usize], key, 1, &[9; 8])
        ));
        let f = replica_consistency(&dbs, &p, &Dump::of(&dbs, &[T])).expect("divergence missed");
        assert!(
            f.contains(&format!("key {key}: backup {backup} has version 0x4d")),
            "{f}"
        );
    }

    #[test]
    fn a_committed_write_that_was_never_installed_is_reported() {
        let (dbs, p) = cluster();
        let f = committed_writes_installed(&dbs, &p, &[committed(1 << 62 | 5, 4, 1, &[1; 8])])
            .expect("lost commit missed");
        assert!(f.contains("table 5 key 4: the last committed write"), "{f}");
        // Installed at the primary (version and value): passes.
        let id = 1 << 62 | 6;
        let prim = p.primary(T, 4) as usize;
        let mut v = Vec::new();
        let fetched = actions::lock(&dbs[prim], T, 4, WriteKind::Update, OWNER, &mut v);
        let w = WriteRec {
            token: fetched.token,
            ..write(4, 1, &[2; 8])
        };
        assert!(actions::install(&dbs[prim], id, &w, OWNER));
        assert_eq!(
            committed_writes_installed(&dbs, &p, &[committed(id, 4, 1, &[2; 8])]),
            None
        );
        // Installed with another value than the one committed: reported.
        assert!(committed_writes_installed(&dbs, &p, &[committed(id, 4, 1, &[3; 8])]).is_some());
    }

    #[test]
    fn a_lock_left_held_is_reported() {
        let (dbs, p) = cluster();
        let prim = p.primary(T, 2) as usize;
        let mut v = Vec::new();
        let f = actions::lock(&dbs[prim], T, 2, WriteKind::Update, OWNER, &mut v);
        assert_eq!(f.status, Status::Ok);
        let mut rec = committed(1 << 62 | 9, 2, 1, &[1; 8]);
        rec.outcome = Outcome::Aborted;
        let r = no_locks_held(&dbs, &p, &[rec]).expect("held lock missed");
        assert!(r.contains("key 2 is still locked"), "{r}");
        // The dump skips a locked item, so the replica check also sees it.
        let r = replica_consistency(&dbs, &p, &Dump::of(&dbs, &[T])).unwrap();
        assert!(r.contains("still locked"), "{r}");
    }

    #[test]
    fn the_digest_changes_with_any_stored_byte() {
        let (dbs, p) = cluster();
        let d0 = Dump::of(&dbs, &[T]).digest();
        assert_eq!(d0, Dump::of(&dbs, &[T]).digest());
        let b = p.replicas(T, 1)[2];
        let v = [1, 0, 0, 0, 0, 0, 0, 1];
        assert!(actions::apply_backup(
            &dbs[b as usize],
            1,
            &next_write(&dbs[b as usize], 1, 1, &v)
        ));
        assert_ne!(d0, Dump::of(&dbs, &[T]).digest());
    }
}
