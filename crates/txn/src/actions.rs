//! Item actions: what the protocol does to one item of a node's store. The coordinator
//! runs them directly for keys whose primary is its own node, and the RPC handlers run
//! them for requests from other nodes, so both paths behave the same (TiKV's
//! `storage/txn/actions` play this role for its commands).
//!
//! Locks are taken and checked with a [`LockOwner`]: the coordinator's node, thread and
//! transaction slot. A lock token or commit naming a lock that this owner does not hold
//! on that key changes nothing.

use crate::db::{split_meta, NodeDb, META, TOMBSTONE};
use crate::messages::{Fetched, LockToken, Status, WriteKind, WriteRec};
use ambidex_store::{Header, ItemLock, LockOwner, ReadOutcome, StoreError, Table};
use std::cell::RefCell;

thread_local! {
    /// The stored form of one value (version prefix + value), reused by every action.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Reads `key`: its status, transaction version, and (found) value appended to `out`.
pub fn read(db: &NodeDb, table: u32, key: u64, out: &mut impl for<'v> Extend<&'v u8>) -> Fetched {
    read_into(db, table, key, Some(out))
}

/// Reads `key` like [`read`], also returning where its item is and its header word
/// (`token`: offset and unlocked store version) so that the coordinator can later lock
/// it with a CAS, validate it with a header READ, or find it through the location cache.
pub fn read_located(
    db: &NodeDb,
    table: u32,
    key: u64,
    out: &mut impl for<'v> Extend<&'v u8>,
) -> Fetched {
    with_table(db, table, |t, buf| match t.try_get_located(key, buf) {
        (ReadOutcome::NotFound, _) => Fetched::just(Status::Absent),
        (ReadOutcome::Locked, _) => Fetched::just(Status::Locked),
        (ReadOutcome::Found { version: h }, offset) => {
            let (meta, val) = split_meta(buf);
            let mut f = Fetched::just(Status::Ok);
            f.version = meta & !TOMBSTONE;
            f.token = LockToken {
                offset,
                store_version: h,
            };
            if meta & TOMBSTONE != 0 {
                f.status = Status::Absent;
            } else {
                out.extend(val);
            }
            f
        }
    })
}

/// The current status and transaction version of `key` (validation).
pub fn check_version(db: &NodeDb, table: u32, key: u64) -> Fetched {
    read_into(db, table, key, None::<&mut Vec<u8>>)
}

/// Runs `f` on `table`'s store and this thread's scratch buffer sized for one stored
/// value; `BadRequest` if the table is unknown here.
#[inline]
fn with_table(db: &NodeDb, table: u32, f: impl FnOnce(&Table, &mut Vec<u8>) -> Fetched) -> Fetched {
    let Some((spec, t)) = db.table(table) else {
        return Fetched::just(Status::BadRequest);
    };
    SCRATCH.with(|s| {
        let mut buf = s.borrow_mut();
        buf.resize(META + spec.value_size, 0);
        f(t, &mut buf)
    })
}

fn read_into(
    db: &NodeDb,
    table: u32,
    key: u64,
    out: Option<&mut impl for<'v> Extend<&'v u8>>,
) -> Fetched {
    with_table(db, table, |t, buf| match t.try_get(key, buf) {
        ReadOutcome::NotFound => Fetched::just(Status::Absent),
        ReadOutcome::Locked => Fetched::just(Status::Locked),
        ReadOutcome::Found { .. } => {
            let (meta, val) = split_meta(buf);
            let mut f = Fetched::just(Status::Ok);
            f.version = meta & !TOMBSTONE;
            if meta & TOMBSTONE != 0 {
                f.status = Status::Absent;
            } else if let Some(out) = out {
                out.extend(val);
            }
            f
        }
    })
}

/// Locks `key` for `owner`'s write of `kind` and reads it under the lock. On `Ok`
/// (present) and `AbsentLocked` (an insert of an absent key) `owner` holds the lock (the
/// token names it); on any other status nothing is held.
pub fn lock(
    db: &NodeDb,
    table: u32,
    key: u64,
    kind: WriteKind,
    owner: LockOwner,
    out: &mut impl for<'v> Extend<&'v u8>,
) -> Fetched {
    with_table(db, table, |t, buf| {
        let lk = match t.try_lock_read(key, owner, buf) {
            Ok(lk) => lk,
            Err(StoreError::Locked) => return Fetched::just(Status::Locked),
            Err(StoreError::NotFound) if kind == WriteKind::Insert => {
                // Insert a locked tombstone that never existed (version 0).
                buf.iter_mut().for_each(|b| *b = 0);
                buf[..META].copy_from_slice(&TOMBSTONE.to_le_bytes());
                match t.insert_and_lock(key, buf, owner) {
                    Ok(lk) => lk,
                    Err(StoreError::Exists) | Err(StoreError::Locked) => {
                        return Fetched::just(Status::Locked)
                    }
                    Err(StoreError::Full) => return Fetched::just(Status::Full),
                    Err(_) => return Fetched::just(Status::BadRequest),
                }
            }
            Err(StoreError::NotFound) => return Fetched::just(Status::Absent),
            Err(_) => return Fetched::just(Status::BadRequest),
        };
        let (meta, val) = split_meta(buf);
        let live = meta & TOMBSTONE == 0;
        let st = match (kind, live) {
            (WriteKind::Insert, true) => Status::Exists,
            (WriteKind::Insert, false) => Status::AbsentLocked,
            (_, true) => Status::Ok,
            (_, false) => Status::Absent,
        };
        if st != Status::Ok && st != Status::AbsentLocked {
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

/// The lock `token` names, if `owner` holds it on `key`.
fn held(
    db: &NodeDb,
    table: u32,
    key: u64,
    token: LockToken,
    owner: LockOwner,
) -> Option<(usize, &Table, ItemLock)> {
    let (spec, t) = db.table(table)?;
    let lk = ItemLock {
        offset: token.offset,
        version: token.store_version,
        owner,
    };
    t.holds_lock(&lk, key).then_some((spec.value_size, t, lk))
}

/// Releases a lock taken by [`lock`] without changing the item (abort). A token that
/// does not name a lock `owner` holds on `key` changes nothing (and gives `false`).
pub fn release(db: &NodeDb, table: u32, key: u64, token: LockToken, owner: LockOwner) -> bool {
    match held(db, table, key, token, owner) {
        Some((_, t, lk)) => {
            t.unlock(lk, false);
            true
        }
        None => false,
    }
}

/// Whether `w` can be applied here: a known table and a value of its size (a delete
/// carries no value); at a primary (`owner` given) also a lock `owner` holds. The
/// handlers check every write of a request (while decoding it) before applying any, so
/// a bad request changes nothing.
pub fn check_write(db: &NodeDb, w: &WriteRec<'_>, owner: Option<LockOwner>) -> bool {
    let Some((spec, _)) = db.table(w.table) else {
        return false;
    };
    let size_ok = match w.kind {
        WriteKind::Delete => w.value.is_empty(),
        _ => w.value.len() == spec.value_size,
    };
    size_ok
        && match owner {
            Some(o) => held(db, w.table, w.key, w.token, o).is_some(),
            None => true,
        }
}

/// The stored form of a write (transaction version `txn` + value; a delete's is a
/// tombstone of zeroes) into `out`; false if the value is not of `value_size` bytes.
pub(crate) fn stored_value(
    txn: u64,
    w: &WriteRec<'_>,
    value_size: usize,
    out: &mut Vec<u8>,
) -> bool {
    out.clear();
    match w.kind {
        WriteKind::Delete => {
            out.extend_from_slice(&(txn | TOMBSTONE).to_le_bytes());
            out.resize(META + value_size, 0);
        }
        _ => {
            if w.value.len() != value_size {
                return false;
            }
            out.extend_from_slice(&txn.to_le_bytes());
            out.extend_from_slice(w.value);
        }
    }
    true
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
        stored_value(txn, w, value_size, &mut v).then(|| f(&v))
    })
}

/// Installs a committed write at the primary: new value, transaction version `txn`, and
/// the lock released (owner cleared). False, changing nothing, if `owner` does not hold
/// the lock the write names.
pub fn install(db: &NodeDb, txn: u64, w: &WriteRec<'_>, owner: LockOwner) -> bool {
    let Some((size, t, lk)) = held(db, w.table, w.key, w.token, owner) else {
        return false;
    };
    // A value of the wrong size (handlers rule it out with check_writes first) writes
    // nothing and releases the lock unchanged.
    let ok = with_stored_value(txn, w, size, |v| t.write_locked(&lk, v).is_ok()).unwrap_or(false);
    t.unlock(lk, ok);
    ok
}

/// Applies a committed write from a log record at a backup (`Log::Write`: a replica
/// applies the records its coordinators truncate, and a coordinator its own copies):
/// at the version the primary installs it with (the locked version + 2, as
/// [`ambidex_store::Table::unlock`] and the one-sided install publish), unless the copy
/// is already newer, since records of one key from different coordinators' rings are
/// applied in any order. Returns whether it was applied (false: the copy was newer);
/// an error if the write does not fit the table (unknown table, value size, version).
pub fn apply_logged(db: &NodeDb, txn: u64, w: &WriteRec<'_>) -> Result<bool, StoreError> {
    let Some((spec, t)) = db.table(w.table) else {
        return Err(StoreError::NotFound);
    };
    let version = Header::bump(w.token.store_version, 2);
    with_stored_value(txn, w, spec.value_size, |v| {
        t.apply_versioned(w.key, v, version)
    })
    .unwrap_or(Err(StoreError::BadValueLen {
        got: w.value.len(),
        want: spec.value_size,
    }))
}

/// Applies a committed write at a backup (COMMIT_BACKUP): at the version the primary
/// installs it with, as [`apply_logged`] does, so every copy of a key carries its
/// primary's version. The primary holds the key's lock until every backup
/// acknowledged, so backups see the writes of one key in commit order; the version
/// still matters for a backup that is being re-replicated, whose copy of the key may
/// arrive from the primary before or after this write (`recovery::rereplicate`).
/// Returns false if the write does not fit the table.
pub fn apply_backup(db: &NodeDb, txn: u64, w: &WriteRec<'_>) -> bool {
    apply_logged(db, txn, w).is_ok()
}

/// What recovery did with one write of a surviving log record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recovered {
    /// Installed at the primary that still held the transaction's lock (released).
    Installed,
    /// Applied to a copy older than the write (a promoted primary, a backup).
    Applied,
    /// The copy already has this write or a newer one.
    Older,
    /// Locked by another transaction: asked again once that one is released.
    Busy,
    /// The write does not fit this node's table (a malformed or foreign record).
    Refused,
}

/// Recovery of one write of transaction `txn` (committed: a log record of it
/// survived), at any replica of the new configuration. Where the coordinator's lock is
/// still held (its node and thread, at the version the record's token names) the
/// write is installed and the lock released, as the commit would have; elsewhere it is
/// applied if the copy is older than the version the install gives, so a write
/// recovered from several records, or already installed, changes nothing.
pub fn recover_write(db: &NodeDb, txn: u64, w: &WriteRec<'_>) -> Recovered {
    let Some((spec, t)) = db.table(w.table) else {
        return Recovered::Refused;
    };
    if !check_write(db, w, None) {
        return Recovered::Refused;
    }
    let version = Header::bump(w.token.store_version, 2);
    let (node, thread) = crate::coordinator_of(txn);
    match t.header(w.key) {
        Some(Header {
            owner: Some(o),
            version: v,
        }) => {
            // Its own lock, taken at the version the record names: no other transaction
            // of that thread can hold it at that version, since this one never
            // released it (it was logged, so it commits).
            let own = o.node == node && o.thread == thread;
            if own && v == Header::version_of(w.token.store_version) && install(db, txn, w, o) {
                return Recovered::Installed;
            }
            if Header::version_of(v) >= version {
                Recovered::Older
            } else {
                Recovered::Busy
            }
        }
        _ => match with_stored_value(txn, w, spec.value_size, |val| {
            t.apply_versioned(w.key, val, version)
        }) {
            Some(Ok(true)) => Recovered::Applied,
            Some(Ok(false)) => Recovered::Older,
            _ => Recovered::Refused,
        },
    }
}
