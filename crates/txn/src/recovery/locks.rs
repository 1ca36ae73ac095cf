//! Locks of coordinators that are no longer members: their transactions left no log
//! record (else [`super::replay`] installed them and released the lock), so they abort.

use crate::db::NodeDb;
use crate::policy::Lock;
use ambidex_cluster::Placement;

/// Releases every transaction lock in `db`'s tables at an epoch change, as
/// [`release_all`], looking only where locks can be: with `Lock::Rpc` every lock was
/// taken by this node's CPU, which journaled it (a pass over every item header takes
/// most of a large node's recovery); with `Lock::Cas` other nodes lock without it, so
/// every header is looked at. Returns the locks released.
pub fn release_old_epoch(db: &NodeDb, lock: Lock) -> u64 {
    let mut n = 0;
    for t in db.tables() {
        n += match lock {
            Lock::Rpc => t.release_cpu_locks_where(|_| true),
            Lock::Cas => t.release_locks_where(|_| true),
        } as u64;
    }
    n
}

/// Releases every transaction lock in `db`'s tables (not the store's own short ones),
/// looking at every item.
/// Run at stage Recover once this node's records are replayed: every transaction of
/// the old epoch either left a record (its writes are installed by the replays, which
/// apply by version once the lock is gone) or aborts, and no transaction of the new
/// epoch runs before stage Run. Returns the locks released.
pub fn release_all(db: &NodeDb) -> u64 {
    let mut n = 0;
    for t in db.tables() {
        n += t.release_locks_where(|_| true) as u64;
    }
    n
}

/// Releases every lock in `db`'s tables whose owner's node is not a member of
/// `placement`. Returns the locks released.
pub fn release_non_members(db: &NodeDb, placement: &Placement) -> u64 {
    let mut n = 0;
    for t in db.tables() {
        n += t.release_locks_where(|o| !placement.is_member(o.node)) as u64;
    }
    n
}
