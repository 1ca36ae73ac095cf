//! # ambidex-store: the store layer
//!
//! - `table` ([`Table`]): a MICA-style hash table of cache-line buckets (12 slots) with
//!   overflow chains, inside one registered region, so remote nodes can READ a bucket or
//!   an item and lock an item with one CAS; lock-free consistent reads; layout, the lock
//!   word (lock bit, owner and version: [`LockOwner`], [`Header`]) and the version scheme
//!   that makes one-sided reads safe under word atomicity are in [`layout`].
//! - [`remote`]: one-sided access to a remote table from a coroutine of the RPC runtime,
//!   async on its verbs (READ with retry on torn/locked items, CAS lock naming its owner,
//!   WRITE-and-unlock).
//! - [`catalog`]: every node's table descriptors (region, key, layout) and log region,
//!   exchanged at start-up, checked before use.
//! - `lock_journal`: the items a table's owner locked, for recovery's release.
//! - [`loc_cache`]: the bounded location cache (lock-free reads of one line per lookup,
//!   set-associative, seqlock per set, CLOCK per set).
//! - `btree` ([`OrderedIndex`]): the ordered index (B+tree) for range scans.
//! - [`bench`](mod@bench): the benchmark behind `ambidex bench store`.
//!
//! Modules named without a link are internal to the crate; what other crates use of
//! them is re-exported here.

pub mod bench;
pub(crate) mod btree;
pub mod catalog;
pub mod layout;
pub mod loc_cache;
pub(crate) mod lock_journal;
pub mod remote;
pub(crate) mod table;
mod thread_slot;

pub use bench::{run_bench, StoreBenchConfig, StoreBenchReport};
pub use btree::OrderedIndex;
pub use catalog::{Catalog, CatalogError, LogRegionDesc, LogRegionError};
pub use layout::{Header, LockOwner, OwnerRangeError, TableConfig, TableDesc, TableLayout};
pub use loc_cache::{Loc, LocationCache};
pub use remote::{RemoteError, RemoteGet, RemoteReader, RemoteStats};
pub use table::{ItemLock, ReadOutcome, StoreError, Table};
