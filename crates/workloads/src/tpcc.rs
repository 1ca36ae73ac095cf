//! TPC-C (TPC-C spec v5.11; DrTM SOSP'15, DrTM+H §5) with the five transactions
//! (NewOrder 45%, Payment 43%, OrderStatus 4%, Delivery 4%, StockLevel 4%), and `tpcc-no`,
//! DrTM+H's variant: NewOrder only, every transaction distributed.
//!
//! **Partitioning.** `warehouses_per_node` warehouses per node (default 24, DrTM+H's 384
//! warehouses on 16 machines), dealt out evenly to its threads. Warehouse w belongs to
//! one thread of one node, its *home*; that thread's coroutines run every transaction
//! whose home warehouse is w, so all warehouse-partitioned rows of w are placed on w's
//! home node. `Placement` has no partition-key hook, so keys carry a salt byte chosen to
//! make the hash land on the home ([`crate::common::homed_key`]); remote accesses (1% of
//! NewOrder items, 15% of Payment customers) are real remote transactions.
//!
//! **Terminals.** Every worker coroutine is a terminal with constant home warehouses
//! (spec §2.4.1.1; DrTM runs one worker per warehouse): coroutine k of C runs its
//! thread's warehouses k, k + C, ... (`Tpcc::terminal_warehouse`). With at least as
//! many warehouses as coroutines no two coroutines of a thread share a warehouse, so
//! conflicts come from the benchmark (remote customers and stock), not from coroutines
//! of one thread racing for one warehouse's D_NEXT_O_ID and YTD rows (75% of attempts
//! aborted that way with one warehouse per thread and 8 coroutines).
//!
//! **Outstanding requests.** NewOrder adds every record it needs to the transaction
//! before it uses any value and fetches them with one `execute` (DrTM+H §6.1: the
//! records are independent, so it speculates past values not fetched yet);
//! `outstanding_requests = false` fetches each remote stock row in its own round trip
//! before looking at the next line, as DrTM+H's phase study (§5) ran it.
//!
//! **Ordered indexes.** The transaction layer has no range scans, so the two scans the
//! mix needs run on the home node's `ambidex::workload::OrderedIndex` (owner-local): NEW_ORDER
//! by (w, d, o_id) (Delivery's oldest new order) and ORDER by (w, d, c_id, o_id)
//! (OrderStatus's last order of a customer). Only home-warehouse transactions scan, and
//! they run on the home node, so every scan is local. NewOrder enters its NEW_ORDER
//! entry just before it commits (and takes it out if the commit fails); Delivery removes
//! its entries right after it commits. So a scan may see an entry whose row is not
//! committed yet, locked or gone (the transaction then aborts on that row), but never
//! misses an order that an order it sees was serialized after. Rows themselves are read and
//! written through the transaction (except StockLevel's, below). StockLevel needs no
//! index: it reads D_NEXT_O_ID and the 20 orders below it by key. ORDER_LINE is keyed by
//! (w, d, o, ol).
//!
//! **Failures.** A node that crashes or is cut off and removed loses its indexes with it;
//! its partitions' backups are promoted. A warehouse is run by the node that is primary
//! of all its home's partitions (its home, until a failure moves them; with the initial
//! replica lists one node takes all of them). When a node starts running a configuration
//! (stage Run: every member has recovered, so every transaction of the failed node is
//! decided and the committed ones installed) in which it runs warehouses it did not,
//! the first of its workers to notice rebuilds their NEW_ORDER and ORDER-by-customer
//! entries from its own copy of the rows (every order below each district's
//! D_NEXT_O_ID), and only then do its threads take them up: a warehouse taken over goes
//! to the thread with the index of its home thread, which draws its transactions'
//! warehouse among its own and those. Entries of the failed node's NewOrders that
//! aborted or whose outcome it never learned go with its indexes; nobody writes a
//! warehouse's orders while it is rebuilt (only the node running it does). A surviving
//! node's own warehouses keep their entries: its coordinators learn the outcome of
//! every transaction (one cut by the reconfiguration returns once recovery decided it).
//! If failures split a home's partitions between several primaries, no node runs its
//! warehouses any more (not reachable with one or two failures from the initial lists).
//! Why a rebuild rather than indexes on every replica: see `Tpcc::refresh`. The check
//! after a run compares, at every member, both indexes of the warehouses it runs with
//! the tables. Tested by `crates/workloads/tests/sim_tpcc_crash.rs` (200 crash seeds, long
//! partitions).
//!
//! **Deviations from the spec** (all stated here and in the report):
//! - Vertical partitioning: the YTD columns and D_NEXT_O_ID live in their own tables
//!   (WAREHOUSE_YTD, DISTRICT_YTD, DISTRICT_NEXT), so Payment's YTD updates do not
//!   invalidate NewOrder's reads of W_TAX / D_TAX and NewOrder's D_NEXT_O_ID update does
//!   not conflict with Payment. Semantics are unchanged.
//! - Rows keep the fields the transactions read or write, at spec sizes (C_DATA 500 B,
//!   S_DIST_xx 24 B, ...); unused address/phone fields are one opaque block per row.
//! - ITEM is read-only and replicated per node (as DrTM): each node has its own copy,
//!   keyed by (node, i_id) and placed on that node, so item reads are local.
//! - The customer last-name index (Payment / OrderStatus by name) is static (names never
//!   change), built once and shared by all nodes (equivalent to a replica per node);
//!   a by-name transaction reads only the chosen (middle) customer's row, not every
//!   customer of that name. With scaled-down customers a drawn last name may have no
//!   customer; it is redrawn.
//! - Items of one order are distinct (redrawn), so no stock row is updated twice.
//! - The 1% NewOrder rollback (unused item id) is an application abort, counted as
//!   aborted with reason `user`.
//! - StockLevel runs at read committed (the spec requires only isolation Level 1 for
//!   it): it reads committed rows directly from the home node's store, without the
//!   transaction layer, and aborts only if a row stays locked while it yields 64 times.
//!   As a serializable transaction of ~400 reads it aborted almost always beside
//!   NewOrder's stock updates.
//! - Delivery runs all ten districts in one transaction and skips districts without new
//!   orders.
//! - HISTORY has no primary key in the spec; rows get ids unique per warehouse and node.
//! - Scale below 1 shrinks ITEM, customers per district and initial orders by the factor
//!   (tests and quick runs); 1.0 is the spec population (100,000 items, 3,000 customers
//!   and 3,000 orders per district, the last 900 of them new orders).
//! - `tpcc-no`: NewOrder only; if no item drew a supply warehouse homed on another node,
//!   one random item is supplied by a warehouse of another node, so every transaction
//!   is distributed (needs ≥ 2 nodes).
//!
//! Consistency conditions 1–4 of the spec (§3.3.2) are checked after a run on the
//! primaries' data, plus agreement of both ordered indexes with the tables.

use crate::common::{
    add_i64, get_i64, homed_key, nurand, part_i64, per_node_capacity, primary_rows, put_i64,
    put_u32, rand_str, urand, Loader, Outcome, Workload, LOGICAL_BITS,
};
use ambidex::workload::local::{self as actions, Status};
use ambidex::workload::OrderedIndex;
use ambidex::workload::Stage;
use ambidex::workload::Txn;
use ambidex::workload::WorkerCtx;
use ambidex::workload::WorkloadError;
use ambidex::workload::{AbortReason, NodeDb, Placement, TableSpec, WriteKind};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::ops::Bound::Included;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, TryLockError};

pub const WAREHOUSE: u32 = 30;
pub const WAREHOUSE_YTD: u32 = 31;
pub const DISTRICT: u32 = 32;
pub const DISTRICT_NEXT: u32 = 33;
pub const DISTRICT_YTD: u32 = 34;
pub const CUSTOMER: u32 = 35;
pub const HISTORY: u32 = 36;
pub const NEW_ORDER: u32 = 37;
pub const ORDER: u32 = 38;
pub const ORDER_LINE: u32 = 39;
pub const ITEM: u32 = 40;
pub const STOCK: u32 = 41;

pub const DISTRICTS: u64 = 10;
pub const SPEC_ITEMS: u64 = 100_000;
pub const SPEC_CUSTOMERS: u64 = 3_000;

pub const TYPES: [&str; 5] = [
    "new_order",
    "payment",
    "order_status",
    "delivery",
    "stock_level",
];
const MIX: [u32; 5] = [45, 88, 92, 96, 100];

// NURand run-time constants C (any values in range satisfy the spec's C_LAST rule here,
// since load and run use different draws of the same function).
const C_LAST_LOAD: u64 = 157;
const C_LAST_RUN: u64 = 223;
const C_ID: u64 = 259;
const C_ITEM: u64 = 7911;

// ----- row layouts (byte offsets) -----
const W_SIZE: usize = 96; // tax | name[10] | address
const W_TAX: usize = 0;
const W_NAME: usize = 8;
const D_SIZE: usize = 96; // tax | name[10] | address
const D_TAX: usize = 0;
const D_NAME: usize = 8;
const C_SIZE: usize = 672;
const C_BALANCE: usize = 0;
const C_YTD_PAYMENT: usize = 8;
const C_PAYMENT_CNT: usize = 16;
const C_DELIVERY_CNT: usize = 24;
const C_DISCOUNT: usize = 32;
const C_CREDIT_LIM: usize = 40;
const C_CREDIT: usize = 48;
const C_LAST: usize = 50;
const C_FIRST: usize = 66;
const C_MIDDLE: usize = 82;
const C_SINCE: usize = 84;
const C_DATA: usize = 172;
const H_SIZE: usize = 64;
const O_SIZE: usize = 40;
const O_C_ID: usize = 0;
const O_ENTRY_D: usize = 8;
const O_CARRIER: usize = 16;
const O_OL_CNT: usize = 24;
const O_ALL_LOCAL: usize = 32;
const OL_SIZE: usize = 64;
const OL_I_ID: usize = 0;
const OL_SUPPLY_W: usize = 8;
const OL_DELIVERY_D: usize = 16;
const OL_QUANTITY: usize = 24;
const OL_AMOUNT: usize = 32;
const OL_DIST_INFO: usize = 40;
const I_SIZE: usize = 96;
const I_PRICE: usize = 0;
const I_IM_ID: usize = 8;
const I_NAME: usize = 16;
const I_DATA: usize = 40;
const S_SIZE: usize = 320;
const S_QUANTITY: usize = 0;
const S_YTD: usize = 8;
const S_ORDER_CNT: usize = 16;
const S_REMOTE_CNT: usize = 24;
const S_DIST: usize = 32;
const S_DATA: usize = 272;

// ----- logical keys (≤ 56 bits; salted onto the home node by `homed_key`) -----
fn wd(w: u64, d: u64) -> u64 {
    w << 4 | d
}
pub fn k_district(w: u64, d: u64) -> u64 {
    wd(w, d)
}
pub fn k_customer(w: u64, d: u64, c: u64) -> u64 {
    wd(w, d) << 12 | c
}
pub fn k_order(w: u64, d: u64, o: u64) -> u64 {
    wd(w, d) << 32 | o
}
pub fn k_order_line(w: u64, d: u64, o: u64, ol: u64) -> u64 {
    k_order(w, d, o) << 4 | ol
}
pub fn k_stock(w: u64, i: u64) -> u64 {
    w << 20 | i
}
/// Index key of ORDER by customer: (w, d, c, o) in 60 bits.
fn k_cust_order(w: u64, d: u64, c: u64, o: u64) -> u64 {
    k_customer(w, d, c) << 32 | o
}
/// (w, d, o) of a NEW_ORDER / ORDER logical key.
fn split_order(k: u64) -> (u64, u64, u64) {
    (k >> 36, (k >> 32) & 0xf, k & 0xffff_ffff)
}

const SYLLABLES: [&str; 10] = [
    "BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING",
];

/// The spec's last name of number `n` (0..999), padded with zeros to 16 bytes.
pub fn last_name(n: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    let mut len = 0;
    for digit in [n / 100, (n / 10) % 10, n % 10] {
        for &b in SYLLABLES[digit as usize].as_bytes() {
            out[len] = b;
            len += 1;
        }
    }
    out
}

/// Warehouses per node by default: DrTM+H's 384 warehouses on 16 machines (§5).
pub use ambidex::config::DEFAULT_WAREHOUSES_PER_NODE;

/// New orders one thread commits per second at most, for the room the tables keep for
/// the orders of a run (this machine commits a few thousand per thread; rows a run does
/// not insert cost only address space).
const ORDERS_PER_THREAD_SECOND: f64 = 20_000.0;

/// Population and run parameters.
#[derive(Clone, Debug)]
pub struct TpccParams {
    pub placement: Placement,
    pub threads: u16,
    pub warehouses_per_thread: u64,
    pub warehouses: u64,
    pub items: u64,
    pub customers: u64,
    /// Initial orders per district (= customers); the last 30% are new orders.
    pub initial_orders: u64,
    pub only_new_order: bool,
    /// NewOrder fetches its independent records in parallel (DrTM+H §6.1); false: one
    /// remote record per round trip.
    pub outstanding_requests: bool,
    /// New orders per warehouse the tables must have room for during the run.
    pub order_headroom: u64,
    pub seed: u64,
}

impl TpccParams {
    /// `warehouses_per_node` are dealt out evenly to the node's threads (rounded down to
    /// a multiple of them, at least one each); `scale` (at most 1, the spec's) shrinks
    /// every warehouse's items, customers and orders; `seconds` (warmup + measured)
    /// sizes the room for orders inserted during the run.
    pub fn new(
        placement: Placement,
        threads: u16,
        warehouses_per_node: u64,
        scale: f64,
        only_new_order: bool,
        seconds: f64,
    ) -> TpccParams {
        let whpt = (warehouses_per_node / threads.max(1) as u64).max(1);
        let f = scale.min(1.0);
        let customers = ((SPEC_CUSTOMERS as f64 * f) as u64).max(30);
        let per_warehouse_s = ORDERS_PER_THREAD_SECOND / whpt as f64;
        TpccParams {
            warehouses: whpt * placement.nodes() as u64 * threads as u64,
            placement,
            threads,
            warehouses_per_thread: whpt,
            items: ((SPEC_ITEMS as f64 * f) as u64).max(200),
            customers,
            initial_orders: customers,
            only_new_order,
            outstanding_requests: true,
            order_headroom: ((seconds.max(1.0) * per_warehouse_s) as u64).max(2_000),
            seed: 0x7cc,
        }
    }
}

/// One node's ordered indexes.
struct NodeIndexes {
    /// NEW_ORDER logical keys (w, d, o), each with the token of the NewOrder attempt that
    /// entered it (0: loaded or rebuilt).
    new_order: OrderedIndex<u64>,
    /// Source of those tokens.
    next_token: AtomicU64,
    /// ORDER by customer: (w, d, c, o).
    cust_order: OrderedIndex<()>,
    /// Which warehouses the entries are of, and in which configuration (see
    /// [`Tpcc::refresh`]).
    serves: Mutex<Arc<Serves>>,
}

/// The warehouses a node runs and indexes, as of one configuration.
#[derive(Debug, Default)]
struct Serves {
    /// The epoch these were brought up to date in (0: not yet; the loader's entries are
    /// of the node's home warehouses).
    epoch: u32,
    /// Warehouses whose entries the node's indexes hold, sorted.
    held: Vec<u64>,
    /// Whether the node still runs its home warehouses (false once a failure moved
    /// them to another node while this one stayed or came back, e.g. rejoined).
    home: bool,
    /// Per thread of the node: the warehouses it runs besides its home ones (taken over
    /// from a failed node; `None` for none).
    extra: Vec<Option<Arc<[u64]>>>,
}

/// A violated TPC-C consistency condition (spec §3.3.2.1–4), indexes that disagree with
/// the tables, or parameters TPC-C cannot run with (a malformed partial check from
/// another node is the facade's `PartError`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TpccError {
    /// Warehouses or districts missing at their primaries (or too many).
    #[error(
        "{warehouses} warehouses and {districts} districts found \
         ({expected_warehouses} warehouses expected)"
    )]
    Population {
        /// Warehouses found.
        warehouses: i64,
        /// Districts found.
        districts: i64,
        /// Warehouses there should be (each with `DISTRICTS` districts).
        expected_warehouses: u64,
    },
    /// Condition 1: W_YTD = Σ D_YTD.
    #[error("condition 1: warehouse {warehouse}: W_YTD {w_ytd} != sum(D_YTD) {d_ytd_sum}")]
    WarehouseYtd {
        /// The warehouse.
        warehouse: u64,
        /// Its W_YTD.
        w_ytd: i64,
        /// Σ D_YTD of its districts.
        d_ytd_sum: i64,
    },
    /// A district without orders (every district is loaded with some).
    #[error("district ({warehouse}, {district}) has no orders")]
    NoOrders {
        /// The warehouse.
        warehouse: u64,
        /// The district.
        district: u64,
    },
    /// Condition 2: D_NEXT_O_ID − 1 = max(O_ID) = max(NO_O_ID).
    #[error(
        "condition 2: district ({warehouse}, {district}): D_NEXT_O_ID - 1 = {last_o_id}, \
         max(O_ID) = {max_o_id}, max(NO_O_ID) = {max_no_o_id}"
    )]
    NextOrderId {
        /// The warehouse.
        warehouse: u64,
        /// The district.
        district: u64,
        /// D_NEXT_O_ID − 1.
        last_o_id: u64,
        /// The largest O_ID of its orders.
        max_o_id: u64,
        /// The largest NO_O_ID of its new orders (0: none).
        max_no_o_id: u64,
    },
    /// Condition 3: max(NO_O_ID) − min(NO_O_ID) + 1 = rows in NEW_ORDER.
    #[error(
        "condition 3: district ({warehouse}, {district}): new orders {min_no_o_id}..={max_no_o_id} \
         but {rows} rows"
    )]
    NewOrderGap {
        /// The warehouse.
        warehouse: u64,
        /// The district.
        district: u64,
        /// The smallest NO_O_ID.
        min_no_o_id: u64,
        /// The largest NO_O_ID.
        max_no_o_id: u64,
        /// Its rows in NEW_ORDER.
        rows: u64,
    },
    /// Condition 4: Σ O_OL_CNT = rows in ORDER_LINE.
    #[error(
        "condition 4: district ({warehouse}, {district}): sum(O_OL_CNT) = {ol_cnt_sum} but \
         {order_lines} order lines"
    )]
    OrderLineCount {
        /// The warehouse.
        warehouse: u64,
        /// The district.
        district: u64,
        /// Σ O_OL_CNT of its orders.
        ol_cnt_sum: u64,
        /// Its rows in ORDER_LINE.
        order_lines: u64,
    },
    /// A node could not bring its indexes to its configuration for the check.
    #[error(
        "node {node}: its indexes could not be rebuilt for its configuration (epoch {epoch}, \
         stage {stage:?}): a row of a warehouse it took over was locked or unreadable"
    )]
    IndexRebuild {
        /// The node.
        node: u16,
        /// Its configuration's epoch.
        epoch: u32,
        /// Its stage.
        stage: Stage,
    },
    /// A node's ordered index does not hold exactly the keys of its table.
    #[error(
        "node {node}: {index} index has {entries} entries, table {rows} rows; first difference \
         at position {position} ({indexed:?} indexed, {in_table:?} in the table)"
    )]
    IndexMismatch {
        /// The node.
        node: u16,
        /// The index (`NEW_ORDER`, `ORDER by customer`).
        index: &'static str,
        /// Its entries.
        entries: usize,
        /// The table's rows it should hold.
        rows: usize,
        /// The first position where they differ.
        position: usize,
        /// The index's key there, if any.
        indexed: Option<u64>,
        /// The table's key there, if any.
        in_table: Option<u64>,
    },
    /// The members' indexes do not cover every warehouse.
    #[error("the members' indexes hold {indexed} warehouses of {expected}")]
    IndexedWarehouses {
        /// Warehouses indexed.
        indexed: u64,
        /// Warehouses there are.
        expected: u64,
    },
    /// `tpcc-no` (always distributed) on a single warehouse.
    #[error("tpcc-no needs at least 2 warehouses (nodes × threads ≥ 2, here {warehouses})")]
    TooFewWarehouses {
        /// nodes × threads.
        warehouses: u32,
    },
}

/// Why a warehouse's indexes could not be rebuilt from the node's copy of its rows.
#[derive(Debug, thiserror::Error)]
enum RebuildError {
    #[error("table {table} key {key:#x} is locked")]
    Locked { table: u32, key: u64 },
    #[error("table {table} key {key:#x}: read status {status:?}")]
    Status {
        table: u32,
        key: u64,
        status: Status,
    },
    #[error("warehouse {w} district {d} has no D_NEXT_O_ID row here")]
    NoDistrict { w: u64, d: u64 },
}

/// What taking warehouses over after failures did (reported by [`Tpcc::check`] as
/// `failover` once some warehouse changed hands).
#[derive(Default)]
struct Failover {
    /// Warehouses whose indexes a node rebuilt: by a worker, by the final check.
    rebuilt_by_workers: AtomicU64,
    rebuilt_by_check: AtomicU64,
    /// Rebuilds that met a row they could not read and were tried again later.
    rebuild_failures: AtomicU64,
    /// Transactions committed on a warehouse run by a node other than its home, per type.
    committed_taken_over: [AtomicU64; 5],
}

/// A worker coroutine's view of what its thread runs (`Serves::extra`), refreshed
/// when the node's epoch changes.
#[derive(Default)]
pub struct TpccLocal {
    /// The epoch this is of (0: not looked up yet).
    epoch: u32,
    /// `!Serves::home`.
    lost_home: bool,
    extra: Option<Arc<[u64]>>,
}

pub struct Tpcc {
    pub p: TpccParams,
    idx: Vec<NodeIndexes>,
    failover: Failover,
    /// (w, d, last-name number) -> customer ids sorted by first name.
    names: HashMap<u64, Vec<u16>>,
    history_seq: AtomicU64,
}

fn name_key(w: u64, d: u64, last: u64) -> u64 {
    wd(w, d) << 12 | last
}

impl Tpcc {
    pub fn new(p: TpccParams) -> Tpcc {
        let homes = |n: u16| -> Vec<u64> {
            let per_node = p.warehouses_per_thread * p.threads as u64;
            (n as u64 * per_node + 1..=(n as u64 + 1) * per_node).collect()
        };
        let idx = (0..p.placement.nodes())
            .map(|n| NodeIndexes {
                new_order: OrderedIndex::new(),
                next_token: AtomicU64::new(0),
                cust_order: OrderedIndex::new(),
                serves: Mutex::new(Arc::new(Serves {
                    epoch: 0,
                    held: homes(n),
                    home: true,
                    extra: vec![None; p.threads as usize],
                })),
            })
            .collect();
        let mut names: HashMap<u64, Vec<(u64, [u8; 16])>> = HashMap::new();
        for w in 1..=p.warehouses {
            for d in 1..=DISTRICTS {
                for c in 1..=p.customers {
                    let (last, first) = Self::customer_name(&p, w, d, c);
                    names
                        .entry(name_key(w, d, last))
                        .or_default()
                        .push((c, first));
                }
            }
        }
        let names = names
            .into_iter()
            .map(|(k, mut v)| {
                v.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
                (k, v.into_iter().map(|(c, _)| c as u16).collect())
            })
            .collect();
        Tpcc {
            p,
            idx,
            failover: Failover::default(),
            names,
            history_seq: AtomicU64::new(1),
        }
    }

    /// The deterministic (last-name number, first name) of a customer: the first third of
    /// a district's customers get names 0.., the rest NURand(255, 0, 999) (spec §4.3.2.3).
    fn customer_name(p: &TpccParams, w: u64, d: u64, c: u64) -> (u64, [u8; 16]) {
        let mut rng = SmallRng::seed_from_u64(
            p.seed ^ k_customer(w, d, c).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
        let last = if c <= p.customers / 3 && c <= 1000 {
            c - 1
        } else {
            nurand(&mut rng, 255, 0, 999, C_LAST_LOAD)
        };
        let mut first = [0u8; 16];
        let len = rng.gen_range(8..=16);
        rand_str(&mut rng, &mut first[..len]);
        (last, first)
    }

    /// Node of warehouse w (1-based): warehouses are dealt out per thread, threads per node.
    pub fn home_of(&self, w: u64) -> u16 {
        (((w - 1) / self.p.warehouses_per_thread) / self.p.threads as u64) as u16
    }

    fn key(&self, table: u32, logical: u64, w: u64) -> u64 {
        homed_key(&self.p.placement, table, logical, self.home_of(w))
    }

    fn item_key(&self, node: u16, i: u64) -> u64 {
        homed_key(&self.p.placement, ITEM, (node as u64) << 20 | i, node)
    }

    /// The warehouse of the next transaction: one of the thread's own, or (after a
    /// failover) of those it took over, uniformly; `None` if the thread runs none (its
    /// own moved to another node). Without any taken over, the draw is the same as
    /// before failovers existed.
    fn home_warehouse(&self, w: &WorkerCtx, rng: &mut SmallRng, local: &TpccLocal) -> Option<u64> {
        let g = w.node as u64 * self.p.threads as u64 + w.thread as u64;
        let whpt = self.p.warehouses_per_thread;
        match (&local.extra, local.lost_home) {
            (None, false) => Some(g * whpt + 1 + Self::terminal_warehouse(w, whpt, rng)),
            (None, true) => None,
            (Some(extra), false) => {
                let i = rng.gen_range(0..whpt + extra.len() as u64);
                Some(if i < whpt {
                    g * whpt + 1 + i
                } else {
                    extra[(i - whpt) as usize]
                })
            }
            (Some(extra), true) => Some(extra[rng.gen_range(0..extra.len())]),
        }
    }

    /// The index among its thread's `whpt` warehouses of a worker coroutine's next home
    /// warehouse. Every coroutine is a terminal with constant home warehouses (spec
    /// §2.4.1.1; DrTM runs one worker per warehouse): coroutine k of C runs the thread's
    /// warehouses k, k + C, k + 2C, ..., so with at least as many warehouses as
    /// coroutines no two coroutines of a thread share one, and the conflicts are the
    /// benchmark's own (remote customers and stock); with fewer, coroutine k runs
    /// warehouse k mod `whpt` with the others that map to it.
    fn terminal_warehouse(w: &WorkerCtx, whpt: u64, rng: &mut SmallRng) -> u64 {
        let (c, k) = (w.coroutines.max(1) as u64, w.coroutine as u64);
        if whpt < c {
            return k % whpt;
        }
        let mine = (whpt - k).div_ceil(c);
        k + c * rng.gen_range(0..mine)
    }

    /// Brings `local` to the node's current configuration (one atomic load when it is
    /// already there).
    #[inline]
    fn follow(&self, w: &WorkerCtx, local: &mut TpccLocal) {
        if w.th.db.cluster().config.epoch() == local.epoch {
            return;
        }
        if let Some(s) = self.refresh(&w.th.db, false) {
            local.epoch = s.epoch;
            local.lost_home = !s.home;
            local.extra = s.extra.get(w.thread as usize).cloned().flatten();
        }
    }

    /// Per initial home node: the node that is now primary of every partition that
    /// node was primary of at the start, `None` if they are split between several (a
    /// warehouse's rows lie in its home's partitions; the workload's scans and
    /// StockLevel's direct reads need them all at one node).
    fn successors(&self, now: &Placement) -> Vec<Option<u16>> {
        let init = &self.p.placement;
        if now.partitions() != init.partitions() || now.nodes() != init.nodes() {
            // Not a configuration of this cluster: nothing moves.
            return (0..init.nodes()).map(Some).collect();
        }
        let mut to: Vec<Option<Option<u16>>> = vec![None; init.nodes() as usize];
        for part in 0..init.partitions() {
            let (Some(&h), Some(&p)) = (
                init.replicas_of(part).first(),
                now.replicas_of(part).first(),
            ) else {
                continue;
            };
            let e = &mut to[h as usize];
            *e = match *e {
                None => Some(Some(p)),
                Some(Some(q)) if q == p => Some(Some(p)),
                _ => Some(None),
            };
        }
        to.into_iter().map(Option::flatten).collect()
    }

    /// The warehouses node `n` runs in placement `now`: those whose home's partitions
    /// all have `n` as primary, sorted.
    fn served_by(&self, now: &Placement, n: u16) -> Vec<u64> {
        let to = self.successors(now);
        (1..=self.p.warehouses)
            .filter(|&w| to.get(self.home_of(w) as usize).copied().flatten() == Some(n))
            .collect()
    }

    /// Brings node `db.node`'s indexes to the warehouses it runs in its current
    /// configuration, once that configuration runs (`wait`: for the final check, on a
    /// quiescent cluster). Returns what the node runs, or `None` while the configuration
    /// is not running yet, while another thread is at it (unless `wait`), or if a
    /// rebuild failed (tried again at the next call).
    ///
    /// Why a rebuild at promotion, and not indexes on every replica updated at commit:
    /// the indexes are kept outside transactions, so a backup could only learn of a
    /// commit from the commit messages, which would need a hook in the transaction
    /// layer and cost every commit; and a node's entries of transactions whose
    /// coordinator died would still be wrong. A warehouse's index is instead rebuilt from
    /// the node's own copy of the warehouse's rows when the node starts running it: at
    /// stage Run of the configuration that made it primary, every member has recovered
    /// (every transaction of the failed node is decided, committed ones installed, its
    /// locks released), and nobody else writes the warehouse's NEW_ORDER and ORDER rows
    /// (only the node running a warehouse inserts and delivers its orders, and this node's
    /// workers take the warehouse up only once its entries are in). The failed node's
    /// entries (of aborted NewOrders, or of transactions whose outcome it never learned)
    /// go with it. A node's own warehouses keep their entries: its coordinators learn
    /// every outcome (one cut by a reconfiguration returns once recovery decided it).
    /// Steady state pays one atomic load per transaction ([`Tpcc::follow`]).
    fn refresh(&self, db: &NodeDb, wait: bool) -> Option<Arc<Serves>> {
        let ix = self.idx.get(db.node as usize)?;
        let mut g = if wait {
            ix.serves.lock().unwrap_or_else(|e| e.into_inner())
        } else {
            match ix.serves.try_lock() {
                Ok(g) => g,
                Err(TryLockError::Poisoned(e)) => e.into_inner(),
                Err(TryLockError::WouldBlock) => return None,
            }
        };
        let state = db.cluster();
        let config = state.config.load();
        if g.epoch == config.epoch {
            return Some(g.clone());
        }
        // The stage is stored before the configuration (`NodeState::enter`): read
        // between two reads of the same epoch, Run is that epoch's. The final check
        // (`wait`) runs on a quiescent cluster whose recovery is over, though a node's
        // agent may not have heard of stage Run yet.
        if !wait && (state.stage() != Stage::Run || state.config.epoch() != config.epoch) {
            return None;
        }
        let target = self.served_by(&config.placement, db.node);
        for &w in g.held.iter().filter(|w| target.binary_search(w).is_err()) {
            Self::drop_warehouse(ix, w);
        }
        let mut rebuilt = 0;
        for &w in target.iter().filter(|w| g.held.binary_search(w).is_err()) {
            if self.rebuild_warehouse(ix, db, w).is_err() {
                Self::drop_warehouse(ix, w);
                self.failover
                    .rebuild_failures
                    .fetch_add(1, Ordering::Relaxed);
                // The warehouses rebuilt so far are rebuilt again next time.
                let held = g
                    .held
                    .iter()
                    .copied()
                    .filter(|w| target.binary_search(w).is_ok());
                *g = Arc::new(Serves {
                    epoch: 0,
                    held: held.collect(),
                    home: g.home,
                    extra: g.extra.clone(),
                });
                return None;
            }
            rebuilt += 1;
        }
        let counter = if wait {
            &self.failover.rebuilt_by_check
        } else {
            &self.failover.rebuilt_by_workers
        };
        counter.fetch_add(rebuilt, Ordering::Relaxed);
        let threads = self.p.threads as u64;
        let extra = (0..threads)
            .map(|t| {
                // A warehouse taken over goes to the thread of the same index as its
                // home thread.
                let mine: Vec<u64> = target
                    .iter()
                    .copied()
                    .filter(|&w| {
                        self.home_of(w) != db.node
                            && ((w - 1) / self.p.warehouses_per_thread) % threads == t
                    })
                    .collect();
                (!mine.is_empty()).then(|| Arc::from(mine))
            })
            .collect();
        *g = Arc::new(Serves {
            epoch: config.epoch,
            home: target.iter().any(|&w| self.home_of(w) == db.node),
            held: target,
            extra,
        });
        Some(g.clone())
    }

    /// Removes warehouse `w`'s entries from a node's indexes.
    fn drop_warehouse(ix: &NodeIndexes, w: u64) {
        let mut keys = Vec::new();
        let (lo, hi) = (k_order(w, 0, 0), k_order(w + 1, 0, 0) - 1);
        ix.new_order.scan(Included(lo), Included(hi), |k, _| {
            keys.push(k);
            true
        });
        for k in keys.drain(..) {
            ix.new_order.remove(k);
        }
        let (lo, hi) = (k_cust_order(w, 0, 0, 0), k_cust_order(w + 1, 0, 0, 0) - 1);
        ix.cust_order.scan(Included(lo), Included(hi), |k, _| {
            keys.push(k);
            true
        });
        for k in keys {
            ix.cust_order.remove(k);
        }
    }

    /// Enters warehouse `w`'s orders and new orders into a node's indexes from the
    /// node's copy of its rows (the node is their primary): every order below each
    /// district's D_NEXT_O_ID (orders are numbered densely from 1).
    fn rebuild_warehouse(&self, ix: &NodeIndexes, db: &NodeDb, w: u64) -> Result<(), RebuildError> {
        Self::drop_warehouse(ix, w);
        let mut buf = Vec::with_capacity(O_SIZE);
        let mut read = |table: u32, logical: u64| -> Result<Option<i64>, RebuildError> {
            let key = self.key(table, logical, w);
            buf.clear();
            match actions::read(db, table, key, &mut buf).status {
                Status::Ok if buf.len() >= 8 => Ok(Some(get_i64(&buf, 0))),
                Status::Absent => Ok(None),
                Status::Locked => Err(RebuildError::Locked { table, key }),
                status => Err(RebuildError::Status { table, key, status }),
            }
        };
        for d in 1..=DISTRICTS {
            let next =
                read(DISTRICT_NEXT, k_district(w, d))?.ok_or(RebuildError::NoDistrict { w, d })?;
            for o in 1..next.max(1) as u64 {
                // O_C_ID is the row's first field.
                if let Some(c) = read(ORDER, k_order(w, d, o))? {
                    ix.cust_order.insert(k_cust_order(w, d, c as u64, o), ());
                }
                if read(NEW_ORDER, k_order(w, d, o))?.is_some() {
                    ix.new_order.insert(k_order(w, d, o), 0);
                }
            }
        }
        Ok(())
    }

    fn other_warehouse(&self, w: u64, rng: &mut SmallRng) -> u64 {
        let o = rng.gen_range(1..self.p.warehouses);
        if o >= w {
            o + 1
        } else {
            o
        }
    }

    /// A warehouse homed on a node other than `node`, uniformly.
    fn other_node_warehouse(&self, node: u16, rng: &mut SmallRng) -> u64 {
        let per_node = self.p.warehouses_per_thread * self.p.threads as u64;
        let o = rng.gen_range(0..self.p.warehouses - per_node);
        let first_of_node = node as u64 * per_node;
        if o >= first_of_node {
            o + per_node + 1
        } else {
            o + 1
        }
    }

    fn customer_id(&self, rng: &mut SmallRng) -> u64 {
        nurand(rng, 1023, 1, self.p.customers, C_ID)
    }

    /// 60%: by last name (the middle customer of that name), else by id.
    fn pick_customer(&self, w: u64, d: u64, rng: &mut SmallRng) -> u64 {
        if urand(rng, 1, 100) <= 60 {
            for _ in 0..100 {
                let last = nurand(rng, 255, 0, 999, C_LAST_RUN);
                if let Some(ids) = self.names.get(&name_key(w, d, last)) {
                    return ids[ids.len().div_ceil(2) - 1] as u64;
                }
            }
        }
        self.customer_id(rng)
    }

    async fn new_order(&self, w: &WorkerCtx, rng: &mut SmallRng, wid: u64) -> Outcome {
        let d = urand(rng, 1, DISTRICTS);
        let c = self.customer_id(rng);
        let ol_cnt = urand(rng, 5, 15) as usize;
        let rollback = urand(rng, 1, 100) == 1;
        let mut lines = [(0u64, 0u64, 0u64); 15];
        for l in 0..ol_cnt {
            let i = loop {
                let i = nurand(rng, 8191, 1, self.p.items, C_ITEM);
                if !lines[..l].iter().any(|x| x.0 == i) {
                    break i;
                }
            };
            let supply = if self.p.warehouses > 1 && urand(rng, 1, 100) == 1 {
                self.other_warehouse(wid, rng)
            } else {
                wid
            };
            lines[l] = (i, supply, urand(rng, 1, 10));
        }
        // tpcc-no: every transaction distributed, so at least one supply warehouse is
        // homed on another node (with several warehouses per node, a remote warehouse
        // may well be on this one).
        let home = self.home_of(wid);
        if self.p.only_new_order
            && self.p.placement.nodes() > 1
            && lines[..ol_cnt].iter().all(|l| self.home_of(l.1) == home)
        {
            let l = rng.gen_range(0..ol_cnt);
            lines[l].1 = self.other_node_warehouse(home, rng);
        }
        if rollback {
            lines[ol_cnt - 1].0 = self.p.items + 1; // an unused item id
        }
        let all_local = lines[..ol_cnt].iter().all(|l| l.1 == wid);

        let mut t = Txn::begin(&w.ctx, &w.th);
        let wh = t.read(WAREHOUSE, self.key(WAREHOUSE, wid, wid));
        let dist = t.read(DISTRICT, self.key(DISTRICT, k_district(wid, d), wid));
        let next = t.write(
            DISTRICT_NEXT,
            self.key(DISTRICT_NEXT, k_district(wid, d), wid),
            WriteKind::Update,
        );
        let cust = t.read(CUSTOMER, self.key(CUSTOMER, k_customer(wid, d, c), wid));
        let mut items = [0usize; 15];
        let mut stocks = [0usize; 15];
        for (l, &(i, supply, _)) in lines[..ol_cnt].iter().enumerate() {
            items[l] = t.read(ITEM, self.item_key(w.node, i));
            if i <= self.p.items {
                stocks[l] = t.write(
                    STOCK,
                    self.key(STOCK, k_stock(supply, i), supply),
                    WriteKind::Update,
                );
            }
            // Without outstanding requests a remote stock row is fetched before the
            // next line is looked at: one round trip per remote record, as a
            // transaction that does not speculate past values it has not read yet.
            if !self.p.outstanding_requests && self.home_of(supply) != home {
                if let Err(r) = t.execute().await {
                    return Outcome::Aborted(r);
                }
            }
        }
        // With outstanding requests (DrTM+H §6.1) every record the order needs is
        // fetched here at once: they are independent, so none waits for another.
        if let Err(r) = t.execute().await {
            return Outcome::Aborted(r);
        }
        if rollback {
            debug_assert!(t.get(items[ol_cnt - 1]).is_none());
            t.abort().await;
            return Outcome::Aborted(AbortReason::User);
        }
        let (Some(wv), Some(dv), Some(nv), Some(cv)) =
            (t.get(wh), t.get(dist), t.get(next), t.get(cust))
        else {
            t.abort().await;
            return Outcome::Aborted(AbortReason::MissingKey);
        };
        let w_tax = get_i64(wv, W_TAX);
        let d_tax = get_i64(dv, D_TAX);
        let o_id = get_i64(nv, 0) as u64;
        let discount = get_i64(cv, C_DISCOUNT);
        t.set(next, &((o_id + 1) as i64).to_le_bytes());
        let now = w.ctx.now_ns() as i64;
        let mut total = 0i64;
        let mut ol_rows = [[0u8; OL_SIZE]; 15];
        for (l, &(i, supply, qty)) in lines[..ol_cnt].iter().enumerate() {
            let Some(iv) = t.get(items[l]) else {
                t.abort().await;
                return Outcome::Aborted(AbortReason::MissingKey);
            };
            let price = get_i64(iv, I_PRICE);
            let mut s = [0u8; S_SIZE];
            s.copy_from_slice(t.get(stocks[l]).expect("locked stock row"));
            let q = get_i64(&s, S_QUANTITY);
            let qty = qty as i64;
            put_i64(
                &mut s,
                S_QUANTITY,
                if q >= qty + 10 { q - qty } else { q - qty + 91 },
            );
            add_i64(&mut s, S_YTD, qty);
            add_i64(&mut s, S_ORDER_CNT, 1);
            if supply != wid {
                add_i64(&mut s, S_REMOTE_CNT, 1);
            }
            let amount = qty * price;
            total += amount;
            let row = &mut ol_rows[l];
            put_i64(row, OL_I_ID, i as i64);
            put_i64(row, OL_SUPPLY_W, supply as i64);
            put_i64(row, OL_QUANTITY, qty);
            put_i64(row, OL_AMOUNT, amount);
            let dist_off = S_DIST + (d as usize - 1) * 24;
            row[OL_DIST_INFO..OL_DIST_INFO + 24].copy_from_slice(&s[dist_off..dist_off + 24]);
            t.set(stocks[l], &s);
        }
        // The order's total is an output of the transaction only (spec §2.4.3.5).
        let _total = total * (10_000 - discount) * (10_000 + w_tax + d_tax) / 100_000_000;
        let mut o = [0u8; O_SIZE];
        put_i64(&mut o, O_C_ID, c as i64);
        put_i64(&mut o, O_ENTRY_D, now);
        put_i64(&mut o, O_OL_CNT, ol_cnt as i64);
        put_i64(&mut o, O_ALL_LOCAL, all_local as i64);
        let oi = t.write(
            ORDER,
            self.key(ORDER, k_order(wid, d, o_id), wid),
            WriteKind::Insert,
        );
        t.set(oi, &o);
        let ni = t.write(
            NEW_ORDER,
            self.key(NEW_ORDER, k_order(wid, d, o_id), wid),
            WriteKind::Insert,
        );
        t.set(ni, &(o_id as i64).to_le_bytes());
        for (l, row) in ol_rows[..ol_cnt].iter().enumerate() {
            let k = self.key(ORDER_LINE, k_order_line(wid, d, o_id, l as u64 + 1), wid);
            let it = t.write(ORDER_LINE, k, WriteKind::Insert);
            t.set(it, row);
        }
        // The NEW_ORDER entry goes into the index before the commit, not after it. The
        // commit unlocks D_NEXT_O_ID at the primary before this coroutine hears back, so
        // the next NewOrder of the district can commit and enter order o + 1 first; a
        // Delivery scanning then would take o + 1 and leave o behind (found by
        // `ambidex sim --workload tpcc --seed 192 --faults chaos`: condition 2 broken,
        // history still serializable since the scan is outside the transaction). Entered
        // early, the entry's row is locked or absent until the commit, and a Delivery
        // that picks it aborts on that row.
        //
        // The entry is entered only if absent: under a policy that locks after execute
        // (DrTM+H §5.2), two NewOrders of a district can both read the same D_NEXT_O_ID
        // before either locks it; the second must not overwrite the first's entry (its
        // abort would then remove the entry of an order that commits, found by
        // `ambidex sim --workload tpcc --seed 36 --faults none --mode drtm-r`). The
        // second's commit would fail on the order's rows anyway.
        let ix = &self.idx[w.node as usize];
        let k = k_order(wid, d, o_id);
        let token = ix.next_token.fetch_add(1, Ordering::Relaxed) + 1;
        if !ix.new_order.insert_new(k, token) {
            t.abort().await;
            return Outcome::Aborted(AbortReason::LockedAtExecute);
        }
        match t.commit().await {
            Ok(_) => {
                ix.cust_order.insert(k_cust_order(wid, d, c, o_id), ());
                Outcome::FOUND
            }
            Err(r) => {
                // Order o_id is free again; a later attempt may have entered it already.
                if ix.new_order.get(k) == Some(token) {
                    ix.new_order.remove(k);
                }
                Outcome::Aborted(r)
            }
        }
    }

    async fn payment(&self, w: &WorkerCtx, rng: &mut SmallRng, wid: u64) -> Outcome {
        let d = urand(rng, 1, DISTRICTS);
        let (cw, cd) = if self.p.warehouses > 1 && urand(rng, 1, 100) <= 15 {
            (self.other_warehouse(wid, rng), urand(rng, 1, DISTRICTS))
        } else {
            (wid, d)
        };
        let c = self.pick_customer(cw, cd, rng);
        let amount = urand(rng, 100, 500_000) as i64;
        let mut t = Txn::begin(&w.ctx, &w.th);
        let wh = t.read(WAREHOUSE, self.key(WAREHOUSE, wid, wid));
        let wy = t.write(
            WAREHOUSE_YTD,
            self.key(WAREHOUSE_YTD, wid, wid),
            WriteKind::Update,
        );
        let dist = t.read(DISTRICT, self.key(DISTRICT, k_district(wid, d), wid));
        let dy = t.write(
            DISTRICT_YTD,
            self.key(DISTRICT_YTD, k_district(wid, d), wid),
            WriteKind::Update,
        );
        let cust = t.write(
            CUSTOMER,
            self.key(CUSTOMER, k_customer(cw, cd, c), cw),
            WriteKind::Update,
        );
        // The node's id in the key: after a failover another node's process runs this
        // warehouse, with its own counter (bits 32..39; load-time ids have bit 39).
        let seq = self.history_seq.fetch_add(1, Ordering::Relaxed) & 0xffff_ffff;
        let hk = wid << 40 | (w.node as u64) << 32 | seq;
        let hist = t.write(HISTORY, self.key(HISTORY, hk, wid), WriteKind::Insert);
        if let Err(r) = t.execute().await {
            return Outcome::Aborted(r);
        }
        let (Some(wv), Some(wyv), Some(dv), Some(dyv), Some(cv)) =
            (t.get(wh), t.get(wy), t.get(dist), t.get(dy), t.get(cust))
        else {
            t.abort().await;
            return Outcome::Aborted(AbortReason::MissingKey);
        };
        let mut h = [0u8; H_SIZE];
        put_u32(&mut h, 0, c as u32);
        put_u32(&mut h, 4, cd as u32);
        put_u32(&mut h, 8, cw as u32);
        put_u32(&mut h, 12, d as u32);
        put_u32(&mut h, 16, wid as u32);
        put_i64(&mut h, 24, w.ctx.now_ns() as i64);
        put_i64(&mut h, 32, amount);
        h[40..50].copy_from_slice(&wv[W_NAME..W_NAME + 10]);
        h[54..64].copy_from_slice(&dv[D_NAME..D_NAME + 10]);
        let w_ytd = (get_i64(wyv, 0) + amount).to_le_bytes();
        let d_ytd = (get_i64(dyv, 0) + amount).to_le_bytes();
        let mut cr = [0u8; C_SIZE];
        cr.copy_from_slice(cv);
        add_i64(&mut cr, C_BALANCE, -amount);
        add_i64(&mut cr, C_YTD_PAYMENT, amount);
        add_i64(&mut cr, C_PAYMENT_CNT, 1);
        if &cr[C_CREDIT..C_CREDIT + 2] == b"BC" {
            // New C_DATA: the payment's ids and amount, then the old data, cut to 500 B.
            let entry = format!("{c} {cd} {cw} {d} {wid} {amount} ");
            let mut data = Vec::with_capacity(500 + entry.len());
            data.extend_from_slice(entry.as_bytes());
            data.extend_from_slice(&cr[C_DATA..C_DATA + 500]);
            cr[C_DATA..C_DATA + 500].copy_from_slice(&data[..500]);
        }
        t.set(wy, &w_ytd);
        t.set(dy, &d_ytd);
        t.set(cust, &cr);
        t.set(hist, &h);
        match t.commit().await {
            Ok(_) => Outcome::FOUND,
            Err(r) => Outcome::Aborted(r),
        }
    }

    async fn order_status(&self, w: &WorkerCtx, rng: &mut SmallRng, wid: u64) -> Outcome {
        let d = urand(rng, 1, DISTRICTS);
        let c = self.pick_customer(wid, d, rng);
        let mut t = Txn::begin(&w.ctx, &w.th);
        let cust = t.read(CUSTOMER, self.key(CUSTOMER, k_customer(wid, d, c), wid));
        let last = self.idx[w.node as usize].cust_order.range_rev(
            Included(k_cust_order(wid, d, c, 0)),
            Included(k_cust_order(wid, d, c, 0xffff_ffff)),
            1,
        );
        let order = last.first().map(|&(k, ())| {
            let o = k & 0xffff_ffff;
            (o, t.read(ORDER, self.key(ORDER, k_order(wid, d, o), wid)))
        });
        if let Err(r) = t.execute().await {
            return Outcome::Aborted(r);
        }
        let mut found = t.get(cust).is_some();
        match order.and_then(|(o, oi)| t.get(oi).map(|v| (o, get_i64(v, O_OL_CNT) as u64))) {
            Some((o, ol_cnt)) => {
                for ol in 1..=ol_cnt {
                    t.read(
                        ORDER_LINE,
                        self.key(ORDER_LINE, k_order_line(wid, d, o, ol), wid),
                    );
                }
                if let Err(r) = t.execute().await {
                    return Outcome::Aborted(r);
                }
            }
            None => found = false,
        }
        match t.commit().await {
            Ok(_) => Outcome::Committed { found },
            Err(r) => Outcome::Aborted(r),
        }
    }

    async fn delivery(&self, w: &WorkerCtx, rng: &mut SmallRng, wid: u64) -> Outcome {
        let carrier = urand(rng, 1, 10) as i64;
        let ix = &self.idx[w.node as usize];
        let mut t = Txn::begin(&w.ctx, &w.th);
        // Per district with a new order: (d, o, NEW_ORDER item, ORDER item).
        let mut picks = Vec::with_capacity(DISTRICTS as usize);
        for d in 1..=DISTRICTS {
            let oldest = ix.new_order.range(
                Included(k_order(wid, d, 0)),
                Included(k_order(wid, d, 0xffff_ffff)),
                1,
            );
            if let Some(&(k, _)) = oldest.first() {
                let o = k & 0xffff_ffff;
                let no = t.write(NEW_ORDER, self.key(NEW_ORDER, k, wid), WriteKind::Delete);
                let oi = t.write(ORDER, self.key(ORDER, k, wid), WriteKind::Update);
                picks.push((d, o, no, oi));
            }
        }
        if let Err(r) = t.execute().await {
            return Outcome::Aborted(r);
        }
        // Per pick: (ORDER_LINE items, CUSTOMER item).
        let mut lines = Vec::with_capacity(picks.len());
        for &(d, o, _, oi) in &picks {
            let ov = t.get(oi).expect("locked order");
            let (c, ol_cnt) = (get_i64(ov, O_C_ID) as u64, get_i64(ov, O_OL_CNT) as u64);
            let ols: Vec<usize> = (1..=ol_cnt)
                .map(|ol| {
                    t.write(
                        ORDER_LINE,
                        self.key(ORDER_LINE, k_order_line(wid, d, o, ol), wid),
                        WriteKind::Update,
                    )
                })
                .collect();
            let ci = t.write(
                CUSTOMER,
                self.key(CUSTOMER, k_customer(wid, d, c), wid),
                WriteKind::Update,
            );
            lines.push((ols, ci));
        }
        if let Err(r) = t.execute().await {
            return Outcome::Aborted(r);
        }
        let now = w.ctx.now_ns() as i64;
        for (&(_, _, _, oi), (ols, ci)) in picks.iter().zip(&lines) {
            let mut o = [0u8; O_SIZE];
            o.copy_from_slice(t.get(oi).expect("locked order"));
            put_i64(&mut o, O_CARRIER, carrier);
            t.set(oi, &o);
            let mut sum = 0;
            for &li in ols {
                let mut l = [0u8; OL_SIZE];
                l.copy_from_slice(t.get(li).expect("locked order line"));
                sum += get_i64(&l, OL_AMOUNT);
                put_i64(&mut l, OL_DELIVERY_D, now);
                t.set(li, &l);
            }
            let mut c = [0u8; C_SIZE];
            c.copy_from_slice(t.get(*ci).expect("locked customer"));
            add_i64(&mut c, C_BALANCE, sum);
            add_i64(&mut c, C_DELIVERY_CNT, 1);
            t.set(*ci, &c);
        }
        let found = !picks.is_empty();
        match t.commit().await {
            Ok(_) => {
                for &(d, o, _, _) in &picks {
                    ix.new_order.remove(k_order(wid, d, o));
                }
                Outcome::Committed { found }
            }
            Err(r) => Outcome::Aborted(r),
        }
    }

    /// StockLevel at read-committed isolation, which the spec allows for it (§3.4.0.1,
    /// Table 3-1: Stock-Level needs only Level 1, no dirty reads). Every row it reads is
    /// of the home warehouse, hence at this node's store: it reads committed values
    /// directly there (yielding to the lock holder while a row is locked), with no
    /// validation, so it cannot be aborted by the NewOrders it runs beside. It is not
    /// seen by the transaction layer's counters.
    async fn stock_level(&self, w: &WorkerCtx, rng: &mut SmallRng, wid: u64) -> Outcome {
        let d = urand(rng, 1, DISTRICTS);
        let threshold = urand(rng, 10, 20) as i64;
        let db = &w.th.db;
        let mut buf = Vec::with_capacity(S_SIZE);
        macro_rules! read {
            ($table:expr, $logical:expr) => {{
                match self
                    .read_committed(w, db, $table, self.key($table, $logical, wid), &mut buf)
                    .await
                {
                    Ok(found) => found.then(|| &buf[..]),
                    Err(r) => return Outcome::Aborted(r),
                }
            }};
        }
        let Some(next) = read!(DISTRICT_NEXT, k_district(wid, d)).map(|v| get_i64(v, 0) as u64)
        else {
            return Outcome::Aborted(AbortReason::MissingKey);
        };
        let mut item_ids = Vec::with_capacity(300);
        for o in next.saturating_sub(20).max(1)..next {
            let cnt = read!(ORDER, k_order(wid, d, o))
                .map(|v| get_i64(v, O_OL_CNT) as u64)
                .unwrap_or(0);
            for ol in 1..=cnt {
                if let Some(v) = read!(ORDER_LINE, k_order_line(wid, d, o, ol)) {
                    item_ids.push(get_i64(v, OL_I_ID) as u64);
                }
            }
        }
        item_ids.sort_unstable();
        item_ids.dedup();
        let mut _low = 0;
        for &i in &item_ids {
            if read!(STOCK, k_stock(wid, i)).is_some_and(|v| get_i64(v, S_QUANTITY) < threshold) {
                _low += 1;
            }
        }
        Outcome::FOUND
    }

    /// Reads the committed value of a key whose primary is this node into `buf`; true if
    /// it exists. A locked key is retried after yielding (its holder may be a coroutine
    /// of this thread) a few times; then the read gives up (busy-waiting longer takes the
    /// CPU from the lock holders on an oversubscribed machine).
    async fn read_committed(
        &self,
        w: &WorkerCtx,
        db: &NodeDb,
        table: u32,
        key: u64,
        buf: &mut Vec<u8>,
    ) -> Result<bool, AbortReason> {
        debug_assert_eq!(db.placement().primary(table, key), db.node);
        for _ in 0..64 {
            buf.clear();
            match actions::read(db, table, key, buf).status {
                Status::Ok => return Ok(true),
                Status::Absent => return Ok(false),
                Status::Locked => w.ctx.yield_now().await,
                _ => return Err(AbortReason::BadResponse),
            }
        }
        Err(AbortReason::LockedAtExecute)
    }

    /// TPC-C consistency conditions 1–4 (spec §3.3.2.1–4) on the primaries' rows, and
    /// the NEW_ORDER index against the table. Returns per-condition counts checked.
    pub fn check_consistency(
        &self,
        dbs: &[Arc<NodeDb>],
    ) -> Result<serde_json::Value, WorkloadError> {
        self.consistency(dbs, None)
    }

    /// [`Tpcc::check_consistency`] on every node of `dbs` (`only`: `None`), or on the
    /// warehouses homed at node `only` (whose rows all have their primary there, so the
    /// conditions hold per node; a multi-process run checks each node in its process).
    fn consistency(
        &self,
        dbs: &[Arc<NodeDb>],
        only: Option<u16>,
    ) -> Result<serde_json::Value, WorkloadError> {
        // A node checks the warehouses it runs in its configuration (its home ones
        // unless some failed over).
        let expected_warehouses = match only {
            None => self.p.warehouses,
            Some(n) => {
                dbs.iter()
                    .find(|d| d.node == n)
                    .map_or(0, |d| self.served_by(&d.placement(), n).len()) as u64
            }
        };
        let mask = (1u64 << LOGICAL_BITS) - 1;
        let logical = |table| -> Vec<(u64, Vec<u8>)> {
            primary_rows(dbs, table)
                .into_iter()
                .map(|(k, v)| (k & mask, v))
                .collect()
        };
        let w_ytd: BTreeMap<u64, i64> = logical(WAREHOUSE_YTD)
            .into_iter()
            .map(|(k, v)| (k, get_i64(&v, 0)))
            .collect();
        let d_ytd: BTreeMap<u64, i64> = logical(DISTRICT_YTD)
            .into_iter()
            .map(|(k, v)| (k, get_i64(&v, 0)))
            .collect();
        let d_next: BTreeMap<u64, u64> = logical(DISTRICT_NEXT)
            .into_iter()
            .map(|(k, v)| (k, get_i64(&v, 0) as u64))
            .collect();
        if w_ytd.len() as u64 != expected_warehouses
            || d_next.len() as u64 != expected_warehouses * DISTRICTS
        {
            return Err(TpccError::Population {
                warehouses: w_ytd.len() as i64,
                districts: d_next.len() as i64,
                expected_warehouses,
            }
            .into());
        }
        // Condition 1: W_YTD = Σ D_YTD.
        for (&w, &ytd) in &w_ytd {
            let sum: i64 = (1..=DISTRICTS)
                .map(|d| d_ytd.get(&wd(w, d)).copied().unwrap_or(0))
                .sum();
            if sum != ytd {
                return Err(TpccError::WarehouseYtd {
                    warehouse: w,
                    w_ytd: ytd,
                    d_ytd_sum: sum,
                }
                .into());
            }
        }
        // Per district: max O_ID, Σ O_OL_CNT; NEW_ORDER min, max, count; ORDER_LINE count.
        #[derive(Default)]
        struct Dist {
            max_o: u64,
            ol_cnt_sum: u64,
            no_min: u64,
            no_max: u64,
            no_count: u64,
            ol_rows: u64,
        }
        let mut dist: BTreeMap<u64, Dist> = BTreeMap::new();
        let orders = logical(ORDER);
        for (k, v) in &orders {
            let (w, d, o) = split_order(*k);
            let e = dist.entry(wd(w, d)).or_default();
            e.max_o = e.max_o.max(o);
            e.ol_cnt_sum += get_i64(v, O_OL_CNT) as u64;
        }
        let new_orders = logical(NEW_ORDER);
        for (k, _) in &new_orders {
            let (w, d, o) = split_order(*k);
            let e = dist.entry(wd(w, d)).or_default();
            e.no_min = if e.no_count == 0 { o } else { e.no_min.min(o) };
            e.no_max = e.no_max.max(o);
            e.no_count += 1;
        }
        let mut ol_total = 0u64;
        for (k, _) in logical(ORDER_LINE) {
            let (w, d, _) = split_order(k >> 4);
            dist.entry(wd(w, d)).or_default().ol_rows += 1;
            ol_total += 1;
        }
        for (&key, &next) in &d_next {
            let (w, d) = (key >> 4, key & 0xf);
            let e = dist.get(&key).ok_or(TpccError::NoOrders {
                warehouse: w,
                district: d,
            })?;
            // Condition 2: D_NEXT_O_ID − 1 = max(O_ID) = max(NO_O_ID).
            if next - 1 != e.max_o || (e.no_count > 0 && e.no_max != e.max_o) {
                return Err(TpccError::NextOrderId {
                    warehouse: w,
                    district: d,
                    last_o_id: next - 1,
                    max_o_id: e.max_o,
                    max_no_o_id: e.no_max,
                }
                .into());
            }
            // Condition 3: max(NO_O_ID) − min(NO_O_ID) + 1 = rows in NEW_ORDER.
            if e.no_count > 0 && e.no_max - e.no_min + 1 != e.no_count {
                return Err(TpccError::NewOrderGap {
                    warehouse: w,
                    district: d,
                    min_no_o_id: e.no_min,
                    max_no_o_id: e.no_max,
                    rows: e.no_count,
                }
                .into());
            }
            // Condition 4: Σ O_OL_CNT = rows in ORDER_LINE.
            if e.ol_cnt_sum != e.ol_rows {
                return Err(TpccError::OrderLineCount {
                    warehouse: w,
                    district: d,
                    ol_cnt_sum: e.ol_cnt_sum,
                    order_lines: e.ol_rows,
                }
                .into());
            }
        }
        // The ordered indexes agree with the tables: at each member, the entries of the
        // warehouses it runs, brought to its configuration first (as the node does
        // before its next transaction; a no-op if a worker did). A node that left
        // has no indexes any more.
        let mut indexed_warehouses = 0;
        for db in dbs
            .iter()
            .filter(|d| (only.is_none() || only == Some(d.node)) && d.placement().is_member(d.node))
        {
            let n = db.node;
            let s = self
                .refresh(db, true)
                .ok_or_else(|| TpccError::IndexRebuild {
                    node: n,
                    epoch: db.cluster().config.epoch(),
                    stage: db.cluster().stage(),
                })?;
            indexed_warehouses += s.held.len() as u64;
            let held = |k: u64| s.held.binary_search(&split_order(k).0).is_ok();
            let ix = &self.idx[n as usize];
            let table: Vec<u64> = new_orders
                .iter()
                .map(|e| e.0)
                .filter(|&k| held(k))
                .collect();
            compare(n, "NEW_ORDER", &ix.new_order, table)?;
            let table: Vec<u64> = orders
                .iter()
                .filter(|e| held(e.0))
                .map(|(k, v)| {
                    let (w, d, o) = split_order(*k);
                    k_cust_order(w, d, get_i64(v, O_C_ID) as u64, o)
                })
                .collect();
            compare(n, "ORDER by customer", &ix.cust_order, table)?;
        }
        if indexed_warehouses != expected_warehouses {
            return Err(TpccError::IndexedWarehouses {
                indexed: indexed_warehouses,
                expected: expected_warehouses,
            }
            .into());
        }
        Ok(serde_json::json!({
            "warehouses": w_ytd.len(),
            "districts": d_next.len(),
            "orders": dist.values().map(|d| d.max_o).sum::<u64>(),
            "new_orders": new_orders.len(),
            "order_lines": ol_total,
        }))
    }

    fn load_district(
        &self,
        w: u64,
        d: u64,
        rng: &mut SmallRng,
        out: &Loader<'_>,
    ) -> Result<(), WorkloadError> {
        let p = &self.p;
        // The home node's indexes are filled by the loader thread that owns that node.
        let ix = out
            .owns(self.home_of(w))
            .then(|| &self.idx[self.home_of(w) as usize]);
        let mut dv = [0u8; D_SIZE];
        put_i64(&mut dv, D_TAX, rng.gen_range(0..=2000));
        rand_str(rng, &mut dv[D_NAME..D_NAME + 10]);
        rand_str(rng, &mut dv[18..]);
        out.put(DISTRICT, self.key(DISTRICT, k_district(w, d), w), &dv)?;
        out.put(
            DISTRICT_NEXT,
            self.key(DISTRICT_NEXT, k_district(w, d), w),
            &((p.initial_orders + 1) as i64).to_le_bytes(),
        )?;
        out.put(
            DISTRICT_YTD,
            self.key(DISTRICT_YTD, k_district(w, d), w),
            &3_000_000i64.to_le_bytes(),
        )?;
        for c in 1..=p.customers {
            let (last, first) = Self::customer_name(p, w, d, c);
            let mut cv = vec![0u8; C_SIZE];
            put_i64(&mut cv, C_BALANCE, -1000);
            put_i64(&mut cv, C_YTD_PAYMENT, 1000);
            put_i64(&mut cv, C_PAYMENT_CNT, 1);
            put_i64(&mut cv, C_DISCOUNT, rng.gen_range(0..=5000));
            put_i64(&mut cv, C_CREDIT_LIM, 5_000_000);
            cv[C_CREDIT..C_CREDIT + 2].copy_from_slice(if rng.gen_range(0..10) == 0 {
                b"BC"
            } else {
                b"GC"
            });
            cv[C_LAST..C_LAST + 16].copy_from_slice(&last_name(last));
            cv[C_FIRST..C_FIRST + 16].copy_from_slice(&first);
            cv[C_MIDDLE..C_MIDDLE + 2].copy_from_slice(b"OE");
            put_i64(&mut cv, C_SINCE, 1);
            rand_str(rng, &mut cv[C_SINCE + 8..C_DATA]);
            let dl = rng.gen_range(300..=500);
            rand_str(rng, &mut cv[C_DATA..C_DATA + dl]);
            out.put(CUSTOMER, self.key(CUSTOMER, k_customer(w, d, c), w), &cv)?;
            let mut h = [0u8; H_SIZE];
            put_u32(&mut h, 0, c as u32);
            put_u32(&mut h, 4, d as u32);
            put_u32(&mut h, 8, w as u32);
            put_u32(&mut h, 12, d as u32);
            put_u32(&mut h, 16, w as u32);
            put_i64(&mut h, 32, 1000);
            // Load-time history ids sit above any run-time id of this warehouse.
            let hk = w << 40 | 1 << 39 | k_customer(0, d, c);
            out.put(HISTORY, self.key(HISTORY, hk, w), &h)?;
        }
        // Orders: one per customer in a random permutation; the last 30% are new orders.
        let mut cids: Vec<u64> = (1..=p.customers).collect();
        cids.shuffle(rng);
        let first_new = p.initial_orders - p.initial_orders * 3 / 10 + 1;
        for o in 1..=p.initial_orders {
            let c = cids[(o - 1) as usize];
            let delivered = o < first_new;
            let ol_cnt = urand(rng, 5, 15);
            let mut ov = [0u8; O_SIZE];
            put_i64(&mut ov, O_C_ID, c as i64);
            put_i64(&mut ov, O_ENTRY_D, 1);
            put_i64(
                &mut ov,
                O_CARRIER,
                if delivered {
                    urand(rng, 1, 10) as i64
                } else {
                    0
                },
            );
            put_i64(&mut ov, O_OL_CNT, ol_cnt as i64);
            put_i64(&mut ov, O_ALL_LOCAL, 1);
            out.put(ORDER, self.key(ORDER, k_order(w, d, o), w), &ov)?;
            if let Some(ix) = ix {
                ix.cust_order.insert(k_cust_order(w, d, c, o), ());
            }
            for ol in 1..=ol_cnt {
                let mut lv = [0u8; OL_SIZE];
                put_i64(&mut lv, OL_I_ID, urand(rng, 1, p.items) as i64);
                put_i64(&mut lv, OL_SUPPLY_W, w as i64);
                put_i64(&mut lv, OL_DELIVERY_D, if delivered { 1 } else { 0 });
                put_i64(&mut lv, OL_QUANTITY, 5);
                put_i64(
                    &mut lv,
                    OL_AMOUNT,
                    if delivered {
                        0
                    } else {
                        urand(rng, 1, 999_999) as i64
                    },
                );
                rand_str(rng, &mut lv[OL_DIST_INFO..OL_DIST_INFO + 24]);
                out.put(
                    ORDER_LINE,
                    self.key(ORDER_LINE, k_order_line(w, d, o, ol), w),
                    &lv,
                )?;
            }
            if !delivered {
                out.put(
                    NEW_ORDER,
                    self.key(NEW_ORDER, k_order(w, d, o), w),
                    &(o as i64).to_le_bytes(),
                )?;
                if let Some(ix) = ix {
                    ix.new_order.insert(k_order(w, d, o), 0);
                }
            }
        }
        Ok(())
    }

    fn item_row(rng: &mut SmallRng) -> [u8; I_SIZE] {
        let mut v = [0u8; I_SIZE];
        put_i64(&mut v, I_PRICE, rng.gen_range(100..=10_000));
        put_i64(&mut v, I_IM_ID, rng.gen_range(1..=10_000));
        rand_str(rng, &mut v[I_NAME..I_NAME + 24]);
        rand_str(rng, &mut v[I_DATA..I_DATA + 50]);
        v
    }

    fn stock_chunks(&self) -> u64 {
        self.p.items.div_ceil(STOCK_CHUNK)
    }
}

/// Stock / item rows per load unit.
const STOCK_CHUNK: u64 = 2048;

impl Workload for Tpcc {
    type Local = TpccLocal;

    fn name(&self) -> &'static str {
        if self.p.only_new_order {
            "tpcc-no"
        } else {
            "tpcc"
        }
    }

    fn tables(&self) -> Vec<TableSpec> {
        let p = &self.p;
        let wh = p.warehouses;
        let dists = wh * DISTRICTS;
        let orders = dists * p.initial_orders + wh * p.order_headroom;
        let cap = |rows: u64| per_node_capacity(rows, &p.placement);
        let t = |id, name: &str, size, rows| TableSpec {
            id,
            name: name.into(),
            value_size: size,
            capacity_per_node: cap(rows),
        };
        vec![
            t(WAREHOUSE, "warehouse", W_SIZE, wh),
            t(WAREHOUSE_YTD, "warehouse_ytd", 8, wh),
            t(DISTRICT, "district", D_SIZE, dists),
            t(DISTRICT_NEXT, "district_next", 8, dists),
            t(DISTRICT_YTD, "district_ytd", 8, dists),
            t(CUSTOMER, "customer", C_SIZE, dists * p.customers),
            t(
                HISTORY,
                "history",
                H_SIZE,
                dists * p.customers + wh * p.order_headroom * 2,
            ),
            t(
                NEW_ORDER,
                "new_order",
                8,
                dists * p.initial_orders + wh * p.order_headroom,
            ),
            t(ORDER, "order", O_SIZE, orders),
            t(ORDER_LINE, "order_line", OL_SIZE, orders * 15),
            // A copy per node, placed on that node: each node holds R copies' worth.
            t(ITEM, "item", I_SIZE, p.items * p.placement.nodes() as u64),
            t(STOCK, "stock", S_SIZE, wh * p.items),
        ]
    }

    fn txn_types(&self) -> &'static [&'static str] {
        &TYPES
    }

    /// Districts first, then (warehouse, stock chunk), then (node, item chunk).
    fn load_units(&self) -> u64 {
        let p = &self.p;
        p.warehouses * DISTRICTS
            + p.warehouses * self.stock_chunks()
            + p.placement.nodes() as u64 * self.stock_chunks()
    }

    fn load_unit(
        &self,
        unit: u64,
        rng: &mut SmallRng,
        out: &Loader<'_>,
    ) -> Result<(), WorkloadError> {
        let p = &self.p;
        let dist_units = p.warehouses * DISTRICTS;
        let chunks = self.stock_chunks();
        if unit < dist_units {
            return self.load_district(unit / DISTRICTS + 1, unit % DISTRICTS + 1, rng, out);
        }
        let u = unit - dist_units;
        if u < p.warehouses * chunks {
            let (w, chunk) = (u / chunks + 1, u % chunks);
            if chunk == 0 {
                let mut wv = [0u8; W_SIZE];
                put_i64(&mut wv, W_TAX, rng.gen_range(0..=2000));
                rand_str(rng, &mut wv[W_NAME..W_NAME + 10]);
                rand_str(rng, &mut wv[18..]);
                out.put(WAREHOUSE, self.key(WAREHOUSE, w, w), &wv)?;
                out.put(
                    WAREHOUSE_YTD,
                    self.key(WAREHOUSE_YTD, w, w),
                    &30_000_000i64.to_le_bytes(),
                )?;
            }
            for i in chunk * STOCK_CHUNK + 1..=((chunk + 1) * STOCK_CHUNK).min(p.items) {
                let mut s = [0u8; S_SIZE];
                put_i64(&mut s, S_QUANTITY, rng.gen_range(10..=100));
                rand_str(rng, &mut s[S_DIST..S_DATA]);
                let dl = rng.gen_range(26..=48);
                rand_str(rng, &mut s[S_DATA..S_DATA + dl]);
                out.put(STOCK, self.key(STOCK, k_stock(w, i), w), &s)?;
            }
            return Ok(());
        }
        let u = u - p.warehouses * chunks;
        let (node, chunk) = ((u / chunks) as u16, u % chunks);
        for i in chunk * STOCK_CHUNK + 1..=((chunk + 1) * STOCK_CHUNK).min(p.items) {
            // Every node's copy has the same content: the row's stream depends on i only.
            let mut irng = SmallRng::seed_from_u64(p.seed ^ i.wrapping_mul(0xA24B_AED4_963E_E407));
            out.put(ITEM, self.item_key(node, i), &Self::item_row(&mut irng))?;
        }
        Ok(())
    }

    async fn run_one(
        &self,
        w: &WorkerCtx,
        rng: &mut SmallRng,
        local: &mut TpccLocal,
    ) -> (usize, Outcome) {
        let ty = if self.p.only_new_order {
            0
        } else {
            let x = rng.gen_range(0..100);
            MIX.iter().position(|&m| x < m).expect("mix sums to 100")
        };
        self.follow(w, local);
        let Some(wid) = self.home_warehouse(w, rng, local) else {
            // This node runs no warehouse any more (its own moved to the node that
            // took over its partitions): nothing to do but let the others run.
            w.ctx.yield_now().await;
            return (ty, Outcome::Aborted(AbortReason::NodeFailed));
        };
        let out = match ty {
            0 => self.new_order(w, rng, wid).await,
            1 => self.payment(w, rng, wid).await,
            2 => self.order_status(w, rng, wid).await,
            3 => self.delivery(w, rng, wid).await,
            _ => self.stock_level(w, rng, wid).await,
        };
        if local.extra.is_some()
            && matches!(out, Outcome::Committed { .. })
            && self.home_of(wid) != w.node
        {
            self.failover.committed_taken_over[ty].fetch_add(1, Ordering::Relaxed);
        }
        (ty, out)
    }

    /// The consistency summary, with `failover` (what taking warehouses over did) once
    /// some warehouse changed hands.
    /// TPC-C's consistency conditions.
    fn check_verdict(
        &self,
        _summary: &serde_json::Value,
        ok: bool,
    ) -> (Option<bool>, Option<bool>) {
        (None, Some(ok))
    }

    fn check(&self, dbs: &[Arc<NodeDb>]) -> Result<serde_json::Value, WorkloadError> {
        let mut v = self.check_consistency(dbs)?;
        let f = &self.failover;
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let rebuilt = load(&f.rebuilt_by_workers) + load(&f.rebuilt_by_check);
        if let (true, Some(m)) = (rebuilt > 0, v.as_object_mut()) {
            let committed: serde_json::Map<_, _> = TYPES
                .iter()
                .zip(&f.committed_taken_over)
                .map(|(t, c)| (t.to_string(), load(c).into()))
                .collect();
            m.insert(
                "failover".into(),
                serde_json::json!({
                    "rebuilt_by_workers": load(&f.rebuilt_by_workers),
                    "rebuilt_by_check": load(&f.rebuilt_by_check),
                    "rebuild_failures": load(&f.rebuild_failures),
                    "committed_taken_over": committed,
                }),
            );
        }
        Ok(v)
    }

    fn check_node(&self, db: &Arc<NodeDb>) -> Result<serde_json::Value, WorkloadError> {
        self.consistency(std::slice::from_ref(db), Some(db.node))
    }

    /// Every node checked its own warehouses; the cluster's summary is the sum, and
    /// every warehouse must have been found at its home.
    fn check_combine(
        &self,
        parts: &[serde_json::Value],
    ) -> Result<serde_json::Value, WorkloadError> {
        const FIELDS: [&str; 5] = [
            "warehouses",
            "districts",
            "orders",
            "new_orders",
            "order_lines",
        ];
        let mut sums = [0i64; 5];
        for (n, p) in parts.iter().enumerate() {
            for (sum, f) in sums.iter_mut().zip(FIELDS) {
                *sum = sum.saturating_add(part_i64(p, n, f)?);
            }
        }
        if sums[0] as u64 != self.p.warehouses || sums[1] as u64 != self.p.warehouses * DISTRICTS {
            return Err(TpccError::Population {
                warehouses: sums[0],
                districts: sums[1],
                expected_warehouses: self.p.warehouses,
            }
            .into());
        }
        Ok(FIELDS
            .iter()
            .zip(sums)
            .map(|(f, v)| (f.to_string(), serde_json::Value::from(v)))
            .collect::<serde_json::Map<_, _>>()
            .into())
    }
}

/// Fails unless node `n`'s index `ix` (named `what`) holds exactly the keys `table`.
fn compare<V: Clone>(
    n: u16,
    what: &'static str,
    ix: &OrderedIndex<V>,
    mut table: Vec<u64>,
) -> Result<(), TpccError> {
    let mut indexed = Vec::new();
    ix.scan(
        std::ops::Bound::Unbounded,
        std::ops::Bound::Unbounded,
        |k, _| {
            indexed.push(k);
            true
        },
    );
    table.sort_unstable();
    if indexed == table {
        return Ok(());
    }
    let diff = indexed
        .iter()
        .zip(&table)
        .position(|(a, b)| a != b)
        .unwrap_or(indexed.len().min(table.len()));
    Err(TpccError::IndexMismatch {
        node: n,
        index: what,
        entries: indexed.len(),
        rows: table.len(),
        position: diff,
        indexed: indexed.get(diff).copied(),
        in_table: table.get(diff).copied(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ambidex::bench::load::build_and_load;
    use ambidex::transports::InProcess;

    /// TPC-C loaded on 3 nodes × 1 thread, R = 3 (warehouse n + 1 at node n).
    fn loaded() -> (Tpcc, Vec<Arc<NodeDb>>) {
        let p = Placement::new(3, 3).unwrap();
        let t = Tpcc::new(TpccParams::new(p.clone(), 1, 1, 0.02, false, 1.0));
        let cluster = ambidex::config::ClusterSection::default();
        let nodes = InProcess::open(&cluster).unwrap().nodes.clone();
        let dbs = build_and_load(&t, p, &nodes, 5, false).unwrap();
        (t, dbs)
    }

    /// Node `ix`'s index keys in `lo..=hi`.
    fn keys<V: Clone>(ix: &OrderedIndex<V>, lo: u64, hi: u64) -> Vec<u64> {
        let mut out = Vec::new();
        ix.scan(Included(lo), Included(hi), |k, _| {
            out.push(k);
            true
        });
        out
    }

    #[test]
    fn a_failed_nodes_warehouses_go_to_the_node_promoted_for_all_its_partitions() {
        let p = Placement::new(3, 3).unwrap();
        let t = Tpcc::new(TpccParams::new(p.clone(), 1, 1, 0.02, false, 1.0));
        for n in 0..3 {
            assert_eq!(t.served_by(&p, n), vec![n as u64 + 1]);
        }
        // Node 1's replica lists are 1, 2, 0: node 2 is promoted for every partition.
        let one = p.without(1 << 1).unwrap();
        assert_eq!(t.served_by(&one, 0), vec![1]);
        assert_eq!(t.served_by(&one, 1), Vec::<u64>::new());
        assert_eq!(t.served_by(&one, 2), vec![2, 3]);
        let two = one.without(1 << 2).unwrap();
        assert_eq!(t.served_by(&two, 0), vec![1, 2, 3]);
    }

    #[test]
    fn the_promoted_node_rebuilds_the_indexes_of_the_warehouses_it_takes_over() {
        let (t, dbs) = loaded();
        // Node 1 (warehouse 2) fails; its loaded entries are what the rebuild must find.
        let (lo, hi) = (k_order(2, 0, 0), k_order(3, 0, 0) - 1);
        let (clo, chi) = (k_cust_order(2, 0, 0, 0), k_cust_order(3, 0, 0, 0) - 1);
        let want_no = keys(&t.idx[1].new_order, lo, hi);
        let want_co = keys(&t.idx[1].cust_order, clo, chi);
        assert!(!want_no.is_empty() && want_co.len() > want_no.len());
        let next = dbs[0].config().load().without(1 << 1).unwrap();
        for db in &dbs {
            db.cluster().enter(next.clone(), Stage::Adopt);
        }
        // Before the members recovered, node 2 neither rebuilds nor runs warehouse 2.
        assert!(t.refresh(&dbs[2], false).is_none());
        assert!(keys(&t.idx[2].new_order, lo, hi).is_empty());
        for db in &dbs {
            db.cluster().enter(next.clone(), Stage::Run);
        }
        let s = t.refresh(&dbs[2], false).expect("running");
        assert_eq!(
            (s.epoch, &s.held[..], s.home),
            (next.epoch, &[2, 3][..], true)
        );
        assert_eq!(s.extra[0].as_deref(), Some(&[2][..]));
        assert_eq!(keys(&t.idx[2].new_order, lo, hi), want_no);
        assert_eq!(keys(&t.idx[2].cust_order, clo, chi), want_co);
        let v = t.check(&dbs).unwrap();
        assert_eq!(v["failover"]["rebuilt_by_workers"], 1, "{v}");
        assert_eq!(v["failover"]["rebuilt_by_check"], 0, "{v}");
        // An entry the table does not have (as a dead coordinator's NewOrder would
        // leave) fails the check, and so does a missing one.
        t.idx[2].new_order.insert(k_order(2, 1, 999), 7);
        let e = t.check(&dbs).unwrap_err();
        assert!(e.to_string().contains("node 2: NEW_ORDER index"), "{e}");
        t.idx[2].new_order.remove(k_order(2, 1, 999));
        t.idx[2].cust_order.remove(want_co[0]);
        let e = t.check(&dbs).unwrap_err();
        assert!(
            e.to_string().contains("node 2: ORDER by customer index"),
            "{e}"
        );
    }
}
