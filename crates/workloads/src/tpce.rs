//! TPC-E's Customer-Position transaction (frame 1; DrTM+H §5.5, Figure 11):
//! the distributed read-only transaction of DrTM+H's study of read-only transactions,
//! with a small share of market feeds that update the prices it reads.
//!
//! **Tables** (keys pack into 8 bytes; composite keys by shifts):
//! - CUSTOMER `c` → accounts count, tier, tax id and an opaque profile (64 B).
//! - CUSTOMER_ACCOUNT `c << 4 | i` (the customer's i-th account, i < 10) → CA_ID
//!   (`c · 10 + i`), CA_BAL (cents) and the account's holdings count (24 B).
//! - HOLDING_SUMMARY `c << 8 | i << 4 | j` (the account's j-th holding, j < 10) → the
//!   security's id and HS_QTY (16 B).
//! - LAST_TRADE `s` → LT_PRICE, LT_OPEN_PRICE (cents), LT_VOL, LT_DTS, and for the
//!   invariant the row's update count and the stamp of the market feed that last wrote
//!   it (120 B).
//!
//! **Population.** `scale · 5,000` customers per node (scale 1: TPC-E's smallest
//! database, 5,000 customers = five load units of 1,000), at least one per worker thread.
//! Securities: 685 per 1,000 customers (TPC-E's SECURITY cardinality ratio), at least
//! 20; one LAST_TRADE row per security, its price uniform in 20.00–30.00 (EGen's
//! security price range) and its volume uniform in 0–100,000. Each customer has 1–10
//! accounts and each account 1–10 holdings of distinct securities, both uniform (mean
//! 5.5 and 5.5: 30.25 holdings per customer); HS_QTY is a multiple of 100 up to 5,000.
//!
//! **Placement.** A customer, its accounts and their holdings are placed on the
//! customer's home node (keys salted by [`homed_key`], as TPC-C's warehouse rows).
//! Customers are dealt out in blocks per node and round-robin to the node's threads; a
//! worker draws only customers of its own node and thread (DrTM+H's
//! `current_partition`), so CUSTOMER, CUSTOMER_ACCOUNT and HOLDING_SUMMARY reads are
//! local. LAST_TRADE rows have the ordinary hash placement of their key: a customer's
//! securities lie on every node, and the price reads are the distributed part, which
//! is the point of the benchmark.
//!
//! **Transactions** ([`MIX`]: 99% customer_position, 1% market_feed).
//! - `customer_position` (frame 1, read-only): draw a customer; read CUSTOMER; read all
//!   its CUSTOMER_ACCOUNT rows in one `execute` (one doorbell); all their
//!   HOLDING_SUMMARY rows in one `execute`; all the distinct securities' LAST_TRADE
//!   rows in one `execute`; sum HS_QTY × LT_PRICE per account; commit (validation of
//!   every read). Each level's reads are fetched in parallel.
//! - `market_feed`: updates LT_PRICE (new uniform 20.00–30.00), LT_VOL (+ a trade
//!   quantity of 100, 200, 400 or 800), LT_DTS and the stamp of [`FEED_LEN`] distinct
//!   random securities in one read-write transaction. It gives the read-only
//!   transaction's validation real conflicts to catch.
//!
//! **Deviations from TPC-E** (also in `docs/workloads.md`):
//! - Our transaction layer has no range scans: TPC-E's index scans (CA by C_ID, HS by
//!   CA_ID) become deterministic key layouts plus counts kept in the parent row (the
//!   customer row holds its account count, the account row its holdings count).
//! - Population shape: EGen draws 1–4, 2–8 or 5–10 accounts per customer by tier
//!   (20/60/20% of customers; mean about 5) and 2–18 securities per account by tier and
//!   account count; we draw both uniform in 1–10. As in EGen, the counts are a fixed
//!   function of the ids (here a hash), not of the run's seed.
//! - Only the tables the two transactions touch; the profile is an opaque block.
//! - Customer draw: uniform over the worker's own customers, by C_ID. TPC-E draws a
//!   non-uniform customer (EGen's tiered NURand within each load unit) and passes the
//!   tax id instead of C_ID half of the time (a secondary-index lookup).
//! - Frame 2 (trade history of one account, 50% of TPC-E's customer positions) is
//!   skipped, as the paper's Figure 11 measures the read and validation of frame 1.
//! - Each security is read once per transaction (TPC-E reads a price per holding; a
//!   security held by two accounts is read once).
//! - Market feed: 10 tickers per feed (TPC-E: 20), uniform securities; its limit-order
//!   processing (TRADE_REQUEST, TRADE) is not modelled. The mix (TPC-E: customer
//!   position 13%, market feed 1%, and eight more transactions) is 99% / 1%: DrTM+H's
//!   Figure 11 runs customer position alone. The simulator runs 5% market feeds
//!   ([`Tpce::with_feed_percent`]), so that a seed's few hundred transactions meet some.
//!
//! **Invariants** ([`Tpce::check`]):
//! - Σ LT_VOL = the initial Σ + the trade quantities of committed market feeds (counted
//!   by the workers as SmallBank counts its deltas, and by recovery for a feed whose
//!   coordinator died: [`Workload::committed_by_recovery`]).
//! - Snapshots: a feed gives each of its securities a new update count and writes into
//!   each row the (security, count) of all of them. A committed customer position that
//!   read a row stamped by feed f and another of f's securities must have seen that
//!   one at f's count or later, else it saw f half applied (`torn`); likewise every
//!   stamp of the final state (a feed installed at some of its securities only). A
//!   protocol without read validation is caught by it (`--inject-bug skip-validation`
//!   in the simulator: "committed customer position(s) saw a market feed half
//!   applied"). It catches a feed seen half, not every non-serializable view (a cycle
//!   through several feeds and securities the transaction did not read); the
//!   simulator's history check does.
//! - Every committed customer position found all its rows (nothing deletes a row), and
//!   each table has its loaded number of rows.

use crate::common::{
    add_i64, get_i64, get_u32, homed_key, loaded_initial, part_i64, per_node_capacity,
    primary_rows, put_i64, put_u32, rand_str, unreported_nodes, urand, Loader, Outcome, Workload,
};
use ambidex::workload::Txn;
use ambidex::workload::WorkerCtx;
use ambidex::workload::WorkloadError;
use ambidex::workload::{AbortReason, ItemId, NodeDb, Placement, TableSpec, WriteKind};
use rand::rngs::SmallRng;
use rand::Rng;
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

pub const CUSTOMER: u32 = 60;
pub const CUSTOMER_ACCOUNT: u32 = 61;
pub const HOLDING_SUMMARY: u32 = 62;
pub const LAST_TRADE: u32 = 63;

/// Customers per node at scale 1 (TPC-E's smallest database: five load units).
pub const CUSTOMERS_PER_NODE: u64 = 5_000;
/// TPC-E's load unit, and the securities per load unit (SECURITY's cardinality).
pub const LOAD_UNIT: u64 = 1_000;
pub const SECURITIES_PER_LOAD_UNIT: u64 = 685;
/// Fewest securities: a feed's tickers and an account's holdings are distinct.
pub const MIN_SECURITIES: u64 = 20;
pub const MAX_ACCOUNTS: usize = 10;
pub const MAX_HOLDINGS: usize = 10;
/// Securities one market feed updates.
pub const FEED_LEN: usize = 10;
/// Trade quantities of a ticker (EGen's).
const TRADE_QTY: [i64; 4] = [100, 200, 400, 800];
/// Prices in cents: 20.00 to 30.00.
const PRICE: (i64, i64) = (2_000, 3_000);

pub const TYPES: [&str; 2] = ["customer_position", "market_feed"];
/// The mix in percent, in the order of [`TYPES`].
pub const MIX: [u32; 2] = [99, 1];

/// A violation of TPC-E's invariants, or partial checks that cannot be combined (a
/// malformed part's missing field is the facade's `PartError`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TpceError {
    /// Committed customer positions saw a market feed half applied.
    #[error("{positions} committed customer position(s) saw a market feed half applied")]
    TornReads {
        /// How many.
        positions: i64,
    },
    /// Committed customer positions missed a row.
    #[error("{positions} committed customer position(s) missed a row (nothing deletes one)")]
    RowsNotFound {
        /// How many.
        positions: i64,
    },
    /// The final state lacks writes of a market feed another feed's stamp counts.
    #[error(
        "{writes} market feed write(s) missing: security {security} has update count {count}, \
         a feed's stamp gave it {stamped}"
    )]
    TornFinal {
        /// Securities whose count is below a stamp's.
        writes: usize,
        /// The first of them.
        security: u64,
        /// Its update count.
        count: u32,
        /// The count a stamp gave it.
        stamped: u32,
    },
    /// A table has more or fewer rows at their primaries than were loaded.
    #[error("{table} has {found} rows, {loaded} loaded")]
    Rows {
        /// The table's name.
        table: &'static str,
        /// Rows found.
        found: i64,
        /// Rows loaded.
        loaded: u64,
    },
    /// Σ LT_VOL is not the initial volume plus the committed feeds' trades.
    #[error(
        "LAST_TRADE volume {volume} != expected {expected} (initial {initial} + committed \
         feeds' trades {committed_delta})"
    )]
    VolumeNotConserved {
        /// Σ LT_VOL at the primaries.
        volume: i64,
        /// `initial + committed_delta`.
        expected: i64,
        /// Σ LT_VOL as loaded.
        initial: i64,
        /// The quantities the committed market feeds traded.
        committed_delta: i64,
    },
    /// No node's partial check to combine.
    #[error("no node checked its rows")]
    NoParts,
    /// A node's partial check lacks one of its lists.
    #[error("node {node}'s check lacks the list {list:?}")]
    MissingList {
        /// The node whose part it is.
        node: usize,
        /// The list (`seq`, `needed`).
        list: &'static str,
    },
    /// An entry of a node's list is not a pair of integers.
    #[error("node {node}'s {list:?} has a malformed entry")]
    MalformedEntry {
        /// The node whose part it is.
        node: usize,
        /// The list (`seq`, `needed`).
        list: &'static str,
    },
}

// ----- rows -----
pub const CUSTOMER_VALUE: usize = 64;
const C_ACCOUNTS: usize = 0;
const C_TIER: usize = 4;
const C_TAX_ID: usize = 8;
const C_PROFILE: usize = 28;

pub const ACCOUNT_VALUE: usize = 24;
const CA_ID: usize = 0;
const CA_BAL: usize = 8;
const CA_HOLDINGS: usize = 16;

pub const HOLDING_VALUE: usize = 16;
const HS_S_ID: usize = 0;
const HS_QTY: usize = 8;

const LT_PRICE: usize = 0;
const LT_OPEN_PRICE: usize = 8;
const LT_VOL: usize = 16;
const LT_DTS: usize = 24;
/// Update count of the row (market feeds that wrote it).
const LT_SEQ: usize = 32;
/// Entries of the stamp (0 until a feed writes the row).
const LT_STAMP_LEN: usize = 36;
/// The last feed's securities and the update count it gave each: (u32, u32) pairs.
const LT_STAMP: usize = 40;
pub const LAST_TRADE_VALUE: usize = LT_STAMP + FEED_LEN * 8;

/// Customers a loader unit generates (not TPC-E's load unit: smaller, for parallel
/// loading).
const UNIT: u64 = 256;

fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Accounts of customer `c` (1–10, a fixed function of `c`).
pub fn accounts_of(c: u64) -> usize {
    1 + (mix64(c << 8 | 0xff) % MAX_ACCOUNTS as u64) as usize
}

/// Holdings of account `i` of customer `c` (1–10, a fixed function of the ids).
pub fn holdings_of(c: u64, i: usize) -> usize {
    1 + (mix64(c << 8 | i as u64) % MAX_HOLDINGS as u64) as usize
}

pub fn account_key(c: u64, i: usize) -> u64 {
    c << 4 | i as u64
}

pub fn holding_key(c: u64, i: usize, j: usize) -> u64 {
    c << 8 | (i as u64) << 4 | j as u64
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

/// A LAST_TRADE row's update count and stamp (empty until a feed wrote it).
fn stamp(v: &[u8]) -> (u32, impl Iterator<Item = (u64, u32)> + '_) {
    let n = (get_u32(v, LT_STAMP_LEN) as usize).min(FEED_LEN);
    let entries = (0..n).map(move |k| {
        let o = LT_STAMP + k * 8;
        (get_u32(v, o) as u64, get_u32(v, o + 4))
    });
    (get_u32(v, LT_SEQ), entries)
}

/// Whether reads of LAST_TRADE rows, as (security, row), saw every feed whole: for each
/// row's stamp entry (a, n) of a security a also read, a was seen at count ≥ n.
/// `seen` is sorted by security.
pub fn snapshot_consistent<'a>(
    seen: &[(u64, u32)],
    mut rows: impl Iterator<Item = &'a [u8]>,
) -> bool {
    rows.all(|v| {
        stamp(v)
            .1
            .all(|(a, n)| match seen.binary_search_by_key(&a, |e| e.0) {
                Ok(i) => seen[i].1 >= n,
                Err(_) => true,
            })
    })
}

pub struct Tpce {
    pub customers: u64,
    pub customers_per_node: u64,
    pub securities: u64,
    pub accounts: u64,
    pub holdings: u64,
    threads: u64,
    feed_percent: u32,
    placement: Placement,
    initial_volume: AtomicI64,
    /// Trade quantities of committed market feeds (whole run).
    volume_delta: AtomicI64,
    feeds: AtomicU64,
    positions: AtomicU64,
    /// Committed customer positions that saw a feed half applied.
    torn: AtomicU64,
    /// Committed customer positions that missed a row.
    not_found: AtomicU64,
}

/// What one worker counted (folded into the workload's totals).
#[derive(Default)]
pub struct Local {
    volume_delta: i64,
    feeds: u64,
    positions: u64,
    torn: u64,
    not_found: u64,
}

impl Tpce {
    pub fn new(placement: Placement, threads: u16, scale: f64) -> Tpce {
        let threads = threads.max(1) as u64;
        let per_node = ((CUSTOMERS_PER_NODE as f64 * scale) as u64).max(threads);
        let customers = per_node * placement.nodes() as u64;
        let securities = (customers * SECURITIES_PER_LOAD_UNIT)
            .div_ceil(LOAD_UNIT)
            .max(MIN_SECURITIES);
        let (mut accounts, mut holdings) = (0, 0);
        for c in 0..customers {
            let n = accounts_of(c);
            accounts += n as u64;
            holdings += (0..n).map(|i| holdings_of(c, i) as u64).sum::<u64>();
        }
        Tpce {
            customers,
            customers_per_node: per_node,
            securities,
            accounts,
            holdings,
            threads,
            feed_percent: MIX[1],
            placement,
            initial_volume: AtomicI64::new(0),
            volume_delta: AtomicI64::new(0),
            feeds: AtomicU64::new(0),
            positions: AtomicU64::new(0),
            torn: AtomicU64::new(0),
            not_found: AtomicU64::new(0),
        }
    }

    /// The same workload with market feeds at `percent` of transactions (the simulator
    /// raises it so that its few hundred transactions meet some feeds).
    pub fn with_feed_percent(mut self, percent: u32) -> Tpce {
        self.feed_percent = percent.min(100);
        self
    }

    /// Home node of customer `c`.
    pub fn home_of(&self, c: u64) -> u16 {
        (c / self.customers_per_node) as u16
    }

    fn key(&self, table: u32, logical: u64, c: u64) -> u64 {
        homed_key(&self.placement, table, logical, self.home_of(c))
    }

    /// A customer of the worker's node and thread, uniformly: customers of a node are
    /// dealt round-robin to its threads.
    fn draw_customer(&self, node: u16, thread: u16, rng: &mut SmallRng) -> u64 {
        let t = thread as u64 % self.threads;
        let mine = (self.customers_per_node - t).div_ceil(self.threads);
        node as u64 * self.customers_per_node + t + rng.gen_range(0..mine) * self.threads
    }

    /// Σ LT_VOL expected now (initial + committed trade quantities).
    pub fn expected_volume(&self) -> i64 {
        self.initial_volume.load(Ordering::SeqCst) + self.volume_delta.load(Ordering::SeqCst)
    }

    async fn customer_position(&self, w: &WorkerCtx, c: u64, local: &mut Local) -> Outcome {
        let mut t = Txn::begin(&w.ctx, &w.th);
        let ci = t.read(CUSTOMER, self.key(CUSTOMER, c, c));
        if let Err(r) = t.execute().await {
            return Outcome::Aborted(r);
        }
        let mut missing = false;
        let n_acct = match t.get(ci) {
            Some(v) => (get_u32(v, C_ACCOUNTS) as usize).min(MAX_ACCOUNTS),
            None => {
                missing = true;
                0
            }
        };
        // Accounts, in one round.
        let mut accts = [0 as ItemId; MAX_ACCOUNTS];
        for (i, a) in accts.iter_mut().enumerate().take(n_acct) {
            *a = t.read(
                CUSTOMER_ACCOUNT,
                self.key(CUSTOMER_ACCOUNT, account_key(c, i), c),
            );
        }
        if n_acct > 0 {
            if let Err(r) = t.execute().await {
                return Outcome::Aborted(r);
            }
        }
        // Holdings of every account, in one round.
        let mut holds = [[0 as ItemId; MAX_HOLDINGS]; MAX_ACCOUNTS];
        let mut n_hold = [0usize; MAX_ACCOUNTS];
        for i in 0..n_acct {
            let Some(v) = t.get(accts[i]) else {
                missing = true;
                continue;
            };
            n_hold[i] = (get_u32(v, CA_HOLDINGS) as usize).min(MAX_HOLDINGS);
            for (j, h) in holds[i].iter_mut().enumerate().take(n_hold[i]) {
                *h = t.read(
                    HOLDING_SUMMARY,
                    self.key(HOLDING_SUMMARY, holding_key(c, i, j), c),
                );
            }
        }
        if n_hold.iter().any(|&n| n > 0) {
            if let Err(r) = t.execute().await {
                return Outcome::Aborted(r);
            }
        }
        // The last trade of every security held, in one round (a key read twice is one
        // item of the transaction).
        let mut lts = [[(0 as ItemId, 0u64, 0i64); MAX_HOLDINGS]; MAX_ACCOUNTS];
        for i in 0..n_acct {
            for j in 0..n_hold[i] {
                let Some(v) = t.get(holds[i][j]) else {
                    missing = true;
                    n_hold[i] = j;
                    break;
                };
                let (s, qty) = (u64_at(v, HS_S_ID), get_i64(v, HS_QTY));
                lts[i][j] = (t.read(LAST_TRADE, s), s, qty);
            }
        }
        if n_hold.iter().any(|&n| n > 0) {
            if let Err(r) = t.execute().await {
                return Outcome::Aborted(r);
            }
        }
        // Each account's market value; the distinct securities seen, with their counts.
        let mut assets = [0i64; MAX_ACCOUNTS];
        let mut seen = [(0u64, 0u32, 0 as ItemId); MAX_ACCOUNTS * MAX_HOLDINGS];
        let mut n_seen = 0;
        for i in 0..n_acct {
            for &(it, s, qty) in &lts[i][..n_hold[i]] {
                let Some(v) = t.get(it) else {
                    missing = true;
                    continue;
                };
                assets[i] = assets[i].wrapping_add(qty.wrapping_mul(get_i64(v, LT_PRICE)));
                if !seen[..n_seen].iter().any(|e| e.0 == s) {
                    seen[n_seen] = (s, stamp(v).0, it);
                    n_seen += 1;
                }
            }
        }
        std::hint::black_box(&assets);
        let seen = &mut seen[..n_seen];
        seen.sort_unstable_by_key(|e| e.0);
        let mut counts = [(0u64, 0u32); MAX_ACCOUNTS * MAX_HOLDINGS];
        for (c, e) in counts.iter_mut().zip(seen.iter()) {
            *c = (e.0, e.1);
        }
        let torn = !snapshot_consistent(&counts[..n_seen], seen.iter().filter_map(|e| t.get(e.2)));
        match t.commit().await {
            Ok(_) => {
                local.positions += 1;
                local.torn += torn as u64;
                if missing {
                    local.not_found += 1;
                    Outcome::NOT_FOUND
                } else {
                    Outcome::FOUND
                }
            }
            Err(r) => Outcome::Aborted(r),
        }
    }

    async fn market_feed(&self, w: &WorkerCtx, rng: &mut SmallRng, local: &mut Local) -> Outcome {
        let mut secs = [0u64; FEED_LEN];
        for k in 0..FEED_LEN {
            secs[k] = loop {
                let s = rng.gen_range(0..self.securities);
                if !secs[..k].contains(&s) {
                    break s;
                }
            };
        }
        secs.sort_unstable();
        let mut t = Txn::begin(&w.ctx, &w.th);
        let items: [ItemId; FEED_LEN] =
            std::array::from_fn(|k| t.write(LAST_TRADE, secs[k], WriteKind::Update));
        if let Err(r) = t.execute().await {
            return Outcome::Aborted(r);
        }
        let mut rows = [[0u8; LAST_TRADE_VALUE]; FEED_LEN];
        for k in 0..FEED_LEN {
            match t.get(items[k]) {
                Some(v) if v.len() >= LAST_TRADE_VALUE => {
                    rows[k].copy_from_slice(&v[..LAST_TRADE_VALUE])
                }
                _ => {
                    t.abort().await;
                    return Outcome::Aborted(AbortReason::User);
                }
            }
        }
        let now = w.ctx.step_ns();
        let mut traded = 0i64;
        let mut stamp = [0u8; FEED_LEN * 8];
        for (k, row) in rows.iter_mut().enumerate() {
            let seq = get_u32(row, LT_SEQ).wrapping_add(1);
            put_u32(row, LT_SEQ, seq);
            put_u32(&mut stamp, k * 8, secs[k] as u32);
            put_u32(&mut stamp, k * 8 + 4, seq);
        }
        for (k, row) in rows.iter_mut().enumerate() {
            let qty = TRADE_QTY[rng.gen_range(0..TRADE_QTY.len())];
            traded += qty;
            put_i64(row, LT_PRICE, rng.gen_range(PRICE.0..=PRICE.1));
            add_i64(row, LT_VOL, qty);
            row[LT_DTS..LT_DTS + 8].copy_from_slice(&now.to_le_bytes());
            put_u32(row, LT_STAMP_LEN, FEED_LEN as u32);
            row[LT_STAMP..].copy_from_slice(&stamp);
            t.set(items[k], row);
        }
        match t.commit().await {
            Ok(_) => {
                local.volume_delta += traded;
                local.feeds += 1;
                Outcome::FOUND
            }
            Err(r) => Outcome::Aborted(r),
        }
    }

    fn fold(&self, l: &mut Local) {
        let l = std::mem::take(l);
        self.volume_delta
            .fetch_add(l.volume_delta, Ordering::SeqCst);
        self.feeds.fetch_add(l.feeds, Ordering::SeqCst);
        self.positions.fetch_add(l.positions, Ordering::SeqCst);
        self.torn.fetch_add(l.torn, Ordering::SeqCst);
        self.not_found.fetch_add(l.not_found, Ordering::SeqCst);
    }

    /// The read-side violations counted by the workers, as an error.
    fn read_violations(torn: i64, not_found: i64) -> Result<(), TpceError> {
        if torn > 0 {
            return Err(TpceError::TornReads { positions: torn });
        }
        if not_found > 0 {
            return Err(TpceError::RowsNotFound {
                positions: not_found,
            });
        }
        Ok(())
    }
}

/// Σ LT_VOL of LAST_TRADE rows, the update count of each, and the largest count any
/// stamp gives each security (the final snapshot check: count ≥ stamped count).
struct LastTrades {
    rows: u64,
    volume: i64,
    seq: HashMap<u64, u32>,
    needed: HashMap<u64, u32>,
}

impl LastTrades {
    fn of(dbs: &[Arc<NodeDb>]) -> LastTrades {
        let mut lt = LastTrades {
            rows: 0,
            volume: 0,
            seq: HashMap::new(),
            needed: HashMap::new(),
        };
        for (s, v) in primary_rows(dbs, LAST_TRADE) {
            if v.len() < LAST_TRADE_VALUE {
                continue;
            }
            lt.rows += 1;
            lt.volume = lt.volume.wrapping_add(get_i64(&v, LT_VOL));
            let (seq, entries) = stamp(&v);
            if seq > 0 {
                lt.seq.insert(s, seq);
            }
            for (a, n) in entries {
                let e = lt.needed.entry(a).or_insert(0);
                *e = (*e).max(n);
            }
        }
        lt
    }
}

/// The first security whose final update count is below what a stamp gave it.
fn torn_final(seq: &HashMap<u64, u32>, needed: &HashMap<u64, u32>) -> Result<(), TpceError> {
    let mut bad: Vec<_> = needed
        .iter()
        .filter(|(a, n)| seq.get(a).copied().unwrap_or(0) < **n)
        .collect();
    bad.sort_unstable();
    match bad.first() {
        None => Ok(()),
        Some(&(&security, &stamped)) => Err(TpceError::TornFinal {
            writes: bad.len(),
            security,
            count: seq.get(&security).copied().unwrap_or(0),
            stamped,
        }),
    }
}

impl Workload for Tpce {
    type Local = Local;

    fn name(&self) -> &'static str {
        "tpce"
    }

    fn tables(&self) -> Vec<TableSpec> {
        let p = &self.placement;
        vec![
            TableSpec {
                id: CUSTOMER,
                name: "customer".into(),
                value_size: CUSTOMER_VALUE,
                capacity_per_node: per_node_capacity(self.customers, p),
            },
            TableSpec {
                id: CUSTOMER_ACCOUNT,
                name: "customer_account".into(),
                value_size: ACCOUNT_VALUE,
                capacity_per_node: per_node_capacity(self.accounts, p),
            },
            TableSpec {
                id: HOLDING_SUMMARY,
                name: "holding_summary".into(),
                value_size: HOLDING_VALUE,
                capacity_per_node: per_node_capacity(self.holdings, p),
            },
            TableSpec {
                id: LAST_TRADE,
                name: "last_trade".into(),
                value_size: LAST_TRADE_VALUE,
                capacity_per_node: per_node_capacity(self.securities, p),
            },
        ]
    }

    fn txn_types(&self) -> &'static [&'static str] {
        &TYPES
    }

    fn expected_found_rates(&self) -> Vec<Option<f64>> {
        vec![Some(1.0), Some(1.0)]
    }

    fn load_units(&self) -> u64 {
        self.customers.div_ceil(UNIT)
    }

    fn load_unit(
        &self,
        unit: u64,
        rng: &mut SmallRng,
        out: &Loader<'_>,
    ) -> Result<(), WorkloadError> {
        let end = ((unit + 1) * UNIT).min(self.customers);
        let mut cust = [0u8; CUSTOMER_VALUE];
        let mut acct = [0u8; ACCOUNT_VALUE];
        let mut hold = [0u8; HOLDING_VALUE];
        for c in unit * UNIT..end {
            let n_acct = accounts_of(c);
            put_u32(&mut cust, C_ACCOUNTS, n_acct as u32);
            // EGen's tiers: 20% tier 1, 60% tier 2, 20% tier 3.
            let tier = match rng.gen_range(0..100) {
                0..20 => 1,
                20..80 => 2,
                _ => 3,
            };
            put_u32(&mut cust, C_TIER, tier);
            rand_str(rng, &mut cust[C_TAX_ID..C_TAX_ID + 20]);
            rand_str(rng, &mut cust[C_PROFILE..]);
            out.put(CUSTOMER, self.key(CUSTOMER, c, c), &cust)?;
            for i in 0..n_acct {
                let n_hold = holdings_of(c, i);
                acct[CA_ID..CA_ID + 8].copy_from_slice(&(c * 10 + i as u64).to_le_bytes());
                put_i64(&mut acct, CA_BAL, rng.gen_range(0..=999_999_999i64));
                put_u32(&mut acct, CA_HOLDINGS, n_hold as u32);
                out.put(
                    CUSTOMER_ACCOUNT,
                    self.key(CUSTOMER_ACCOUNT, account_key(c, i), c),
                    &acct,
                )?;
                let mut secs = [u64::MAX; MAX_HOLDINGS];
                for j in 0..n_hold {
                    secs[j] = loop {
                        let s = rng.gen_range(0..self.securities);
                        if !secs[..j].contains(&s) {
                            break s;
                        }
                    };
                    hold[HS_S_ID..HS_S_ID + 8].copy_from_slice(&secs[j].to_le_bytes());
                    put_i64(&mut hold, HS_QTY, 100 * urand(rng, 1, 50) as i64);
                    out.put(
                        HOLDING_SUMMARY,
                        self.key(HOLDING_SUMMARY, holding_key(c, i, j), c),
                        &hold,
                    )?;
                }
            }
        }
        // This unit's share of the securities.
        let units = self.load_units();
        let (s0, s1) = (
            self.securities * unit / units,
            self.securities * (unit + 1) / units,
        );
        let mut volume = 0i64;
        let mut lt = [0u8; LAST_TRADE_VALUE];
        for s in s0..s1 {
            let price = rng.gen_range(PRICE.0..=PRICE.1);
            let vol = rng.gen_range(0..=100_000i64);
            volume += vol;
            put_i64(&mut lt, LT_PRICE, price);
            put_i64(&mut lt, LT_OPEN_PRICE, price);
            put_i64(&mut lt, LT_VOL, vol);
            out.put(LAST_TRADE, s, &lt)?;
        }
        if out.is_first() {
            self.initial_volume.fetch_add(volume, Ordering::SeqCst);
        }
        Ok(())
    }

    async fn run_one(
        &self,
        w: &WorkerCtx,
        rng: &mut SmallRng,
        local: &mut Local,
    ) -> (usize, Outcome) {
        if rng.gen_range(0..100) < self.feed_percent {
            (1, self.market_feed(w, rng, local).await)
        } else {
            let c = self.draw_customer(w.node, w.thread, rng);
            (0, self.customer_position(w, c, local).await)
        }
    }

    fn finish_worker(&self, mut local: Local) {
        self.fold(&mut local);
    }

    fn fold_worker(&self, local: &mut Local) {
        self.fold(local);
    }

    fn committed_by_recovery(&self, table: u32, old: Option<&[u8]>, new: Option<&[u8]>) {
        if table == LAST_TRADE {
            let vol = |v: Option<&[u8]>| {
                v.filter(|v| v.len() >= LT_VOL + 8)
                    .map_or(0, |v| get_i64(v, LT_VOL))
            };
            self.volume_delta
                .fetch_add(vol(new).wrapping_sub(vol(old)), Ordering::SeqCst);
        }
    }

    fn check(&self, dbs: &[Arc<NodeDb>]) -> Result<serde_json::Value, WorkloadError> {
        Self::read_violations(
            self.torn.load(Ordering::SeqCst) as i64,
            self.not_found.load(Ordering::SeqCst) as i64,
        )?;
        for (table, id, loaded) in [
            ("CUSTOMER", CUSTOMER, self.customers),
            ("CUSTOMER_ACCOUNT", CUSTOMER_ACCOUNT, self.accounts),
            ("HOLDING_SUMMARY", HOLDING_SUMMARY, self.holdings),
        ] {
            let n = primary_rows(dbs, id).len() as u64;
            if n != loaded {
                return Err(TpceError::Rows {
                    table,
                    found: n as i64,
                    loaded,
                }
                .into());
            }
        }
        let lt = LastTrades::of(dbs);
        if lt.rows != self.securities {
            return Err(TpceError::Rows {
                table: "LAST_TRADE",
                found: lt.rows as i64,
                loaded: self.securities,
            }
            .into());
        }
        torn_final(&lt.seq, &lt.needed)?;
        let (initial, committed_delta) = (
            self.initial_volume.load(Ordering::SeqCst),
            self.volume_delta.load(Ordering::SeqCst),
        );
        // As `expected_volume`, from the values the error reports.
        let expected = initial + committed_delta;
        let summary = serde_json::json!({
            "volume": lt.volume,
            "expected_volume": expected,
            "initial_volume": initial,
            "committed_volume_delta": committed_delta,
            "committed_feeds": self.feeds.load(Ordering::SeqCst),
            "committed_positions": self.positions.load(Ordering::SeqCst),
            "securities_updated": lt.seq.len(),
            "torn": 0,
            "not_found": 0,
        });
        if lt.volume != expected {
            return Err(TpceError::VolumeNotConserved {
                volume: lt.volume,
                expected,
                initial,
                committed_delta,
            }
            .into());
        }
        Ok(summary)
    }

    /// This node's primaries (row counts; LAST_TRADE's volume, update counts and the
    /// counts its stamps require), the counters of the workers this process ran and the
    /// initial volume (every node process computes it: each generates every unit).
    fn check_node(&self, db: &Arc<NodeDb>) -> Result<serde_json::Value, WorkloadError> {
        let dbs = std::slice::from_ref(db);
        let lt = LastTrades::of(dbs);
        let pairs = |m: &HashMap<u64, u32>| {
            let mut v: Vec<[u64; 2]> = m.iter().map(|(&a, &n)| [a, n as u64]).collect();
            v.sort_unstable();
            v
        };
        Ok(serde_json::json!({
            "node": db.node,
            "customer_rows": primary_rows(dbs, CUSTOMER).len() as u64,
            "account_rows": primary_rows(dbs, CUSTOMER_ACCOUNT).len() as u64,
            "holding_rows": primary_rows(dbs, HOLDING_SUMMARY).len() as u64,
            "last_trade_rows": lt.rows,
            "primary_volume": lt.volume,
            "seq": pairs(&lt.seq),
            "needed": pairs(&lt.needed),
            "initial_volume": self.initial_volume.load(Ordering::SeqCst),
            "committed_volume_delta": self.volume_delta.load(Ordering::SeqCst),
            "committed_feeds": self.feeds.load(Ordering::SeqCst) as i64,
            "committed_positions": self.positions.load(Ordering::SeqCst) as i64,
            "torn": self.torn.load(Ordering::SeqCst) as i64,
            "not_found": self.not_found.load(Ordering::SeqCst) as i64,
        }))
    }

    fn check_combine(
        &self,
        parts: &[serde_json::Value],
    ) -> Result<serde_json::Value, WorkloadError> {
        if parts.is_empty() {
            return Err(TpceError::NoParts.into());
        }
        // As SmallBank: a restarted node loaded nothing and counted only its new
        // incarnation's feeds; its rows count, its initial volume does not, and the
        // volume is unchecked as after a death.
        let initial = loaded_initial(parts, "initial_volume", "initial volume")?;
        let (mut volume, mut delta, mut feeds, mut positions) = (0i64, 0i64, 0i64, 0i64);
        let (mut torn, mut not_found) = (0i64, 0i64);
        let mut rows = [0i64; 4];
        let (mut seq, mut needed) = (HashMap::new(), HashMap::<u64, u32>::new());
        for (n, p) in parts.iter().enumerate() {
            volume = volume.saturating_add(part_i64(p, n, "primary_volume")?);
            delta = delta.saturating_add(part_i64(p, n, "committed_volume_delta")?);
            feeds = feeds.saturating_add(part_i64(p, n, "committed_feeds")?);
            positions = positions.saturating_add(part_i64(p, n, "committed_positions")?);
            torn = torn.saturating_add(part_i64(p, n, "torn")?);
            not_found = not_found.saturating_add(part_i64(p, n, "not_found")?);
            for (k, name) in [
                "customer_rows",
                "account_rows",
                "holding_rows",
                "last_trade_rows",
            ]
            .iter()
            .enumerate()
            {
                rows[k] += part_i64(p, n, name)?;
            }
            for (name, into) in [("seq", &mut seq), ("needed", &mut needed)] {
                let list = p.get(name).and_then(serde_json::Value::as_array).ok_or(
                    TpceError::MissingList {
                        node: n,
                        list: name,
                    },
                )?;
                for e in list {
                    let pair = e
                        .as_array()
                        .and_then(|a| Some((a.first()?.as_u64()?, a.get(1)?.as_u64()?)))
                        .ok_or(TpceError::MalformedEntry {
                            node: n,
                            list: name,
                        })?;
                    let v = into.entry(pair.0).or_insert(0);
                    *v = (*v).max(pair.1.min(u32::MAX as u64) as u32);
                }
            }
        }
        Self::read_violations(torn, not_found)?;
        for ((name, n), loaded) in [
            "CUSTOMER",
            "CUSTOMER_ACCOUNT",
            "HOLDING_SUMMARY",
            "LAST_TRADE",
        ]
        .iter()
        .zip(rows)
        .zip([
            self.customers,
            self.accounts,
            self.holdings,
            self.securities,
        ]) {
            if n as u64 != loaded {
                return Err(TpceError::Rows {
                    table: name,
                    found: n,
                    loaded,
                }
                .into());
            }
        }
        torn_final(&seq, &needed)?;
        let expected = initial.saturating_add(delta);
        let missing = unreported_nodes(parts, self.placement.nodes())?;
        if !missing.is_empty() {
            return Ok(serde_json::json!({
                "volume": volume,
                "initial_volume": initial,
                "committed_volume_delta": delta,
                "committed_feeds": feeds,
                "committed_positions": positions,
                "volume_checked": false,
                "why_unchecked": format!(
                    "node(s) {missing:?} did not report (died) or restarted: the feeds \
                     their first incarnation's workers committed are unknown"
                ),
                "unaccounted_volume": volume.saturating_sub(expected),
            }));
        }
        let summary = serde_json::json!({
            "volume": volume,
            "expected_volume": expected,
            "initial_volume": initial,
            "committed_volume_delta": delta,
            "committed_feeds": feeds,
            "committed_positions": positions,
            "securities_updated": seq.len(),
            "torn": 0,
            "not_found": 0,
        });
        if volume != expected {
            return Err(TpceError::VolumeNotConserved {
                volume,
                expected,
                initial,
                committed_delta: delta,
            }
            .into());
        }
        Ok(summary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn population_follows_tpce_ratios() {
        let p = Placement::new(3, 3).unwrap();
        let e = Tpce::new(p, 2, 1.0);
        assert_eq!(e.customers, 15_000);
        assert_eq!(e.securities, 15_000 * 685 / 1000);
        let mean_acct = e.accounts as f64 / e.customers as f64;
        let mean_hold = e.holdings as f64 / e.accounts as f64;
        assert!((mean_acct - 5.5).abs() < 0.1, "{mean_acct}");
        assert!((mean_hold - 5.5).abs() < 0.1, "{mean_hold}");
        for c in 0..1000 {
            assert!((1..=10).contains(&accounts_of(c)));
            for i in 0..accounts_of(c) {
                assert!((1..=10).contains(&holdings_of(c, i)));
            }
        }
        // Tiny scales keep a customer per thread and enough securities.
        let tiny = Tpce::new(Placement::new(3, 3).unwrap(), 4, 0.0);
        assert_eq!((tiny.customers_per_node, tiny.securities), (4, 20));
    }

    #[test]
    fn a_worker_draws_only_its_own_customers() {
        let e = Tpce::new(Placement::new(3, 3).unwrap(), 3, 0.002); // 10 per node
        assert_eq!(e.customers_per_node, 10);
        let mut rng = SmallRng::seed_from_u64(3);
        let mut seen = std::collections::HashSet::new();
        for node in 0..3u16 {
            for thread in 0..3u16 {
                for _ in 0..500 {
                    let c = e.draw_customer(node, thread, &mut rng);
                    assert_eq!(e.home_of(c), node);
                    assert_eq!((c % e.customers_per_node) % 3, thread as u64);
                    seen.insert(c);
                }
            }
        }
        assert_eq!(
            seen.len() as u64,
            e.customers,
            "some customer is never drawn"
        );
    }

    fn row(seq: u32, stamp: &[(u32, u32)]) -> Vec<u8> {
        let mut v = vec![0u8; LAST_TRADE_VALUE];
        put_u32(&mut v, LT_SEQ, seq);
        put_u32(&mut v, LT_STAMP_LEN, stamp.len() as u32);
        for (k, &(a, n)) in stamp.iter().enumerate() {
            put_u32(&mut v, LT_STAMP + k * 8, a);
            put_u32(&mut v, LT_STAMP + k * 8 + 4, n);
        }
        v
    }

    #[test]
    fn a_feed_seen_half_applied_is_torn() {
        // Feed f gave security 1 count 3 and security 2 count 5.
        let r1 = row(3, &[(1, 3), (2, 5)]);
        let r2_old = row(4, &[(2, 4), (7, 1)]);
        let r2_new = row(5, &[(1, 3), (2, 5)]);
        let r2_later = row(6, &[(2, 6), (9, 2)]);
        let ok = |seen: &[(u64, u32)], rows: &[&Vec<u8>]| {
            snapshot_consistent(seen, rows.iter().map(|v| &v[..]))
        };
        assert!(ok(&[(1, 3), (2, 5)], &[&r1, &r2_new]));
        assert!(ok(&[(1, 3), (2, 6)], &[&r1, &r2_later]));
        assert!(!ok(&[(1, 3), (2, 4)], &[&r1, &r2_old]));
        // Security 2 alone: nothing to compare with.
        assert!(ok(&[(2, 4)], &[&r2_old]));
        let seq = HashMap::from([(1, 3), (2, 4)]);
        let needed = HashMap::from([(1, 3), (2, 5)]);
        assert!(torn_final(&seq, &needed).is_err());
        assert!(torn_final(&HashMap::from([(1, 3), (2, 5)]), &needed).is_ok());
    }

    /// Node parts that add up, and each way one can fail: a volume off, a torn read
    /// counted on one node, a stamp whose security lags on another node, a row missing,
    /// a malformed part (an error, not a panic); a node that did not report leaves the
    /// volume unchecked.
    #[test]
    fn node_parts_combine_into_the_check() {
        let e = Tpce::new(Placement::new(3, 3).unwrap(), 1, 0.002);
        let part = |n: u64, vol: i64| {
            serde_json::json!({
                "node": n,
                "customer_rows": if n == 0 { e.customers } else { 0 },
                "account_rows": if n == 0 { e.accounts } else { 0 },
                "holding_rows": if n == 0 { e.holdings } else { 0 },
                "last_trade_rows": if n == 0 { e.securities } else { 0 },
                "primary_volume": vol,
                "seq": [[n, 2]],
                "needed": [[0, 2], [1, 2]],
                "initial_volume": 1000,
                "committed_volume_delta": 100,
                "committed_feeds": 1,
                "committed_positions": 5,
                "torn": 0,
                "not_found": 0,
            })
        };
        let good = || vec![part(0, 700), part(1, 600), part(2, 0)];
        let ok = e.check_combine(&good()).unwrap();
        assert_eq!(ok["expected_volume"], 1300);
        assert_eq!(ok["committed_positions"], 15);
        let mut off = good();
        off[2]["primary_volume"] = 1.into();
        assert!(e
            .check_combine(&off)
            .unwrap_err()
            .to_string()
            .contains("volume"));
        let mut torn = good();
        torn[1]["torn"] = 1.into();
        assert!(e
            .check_combine(&torn)
            .unwrap_err()
            .to_string()
            .contains("half applied"));
        let mut lag = good();
        lag[2]["needed"] = serde_json::json!([[1, 3]]);
        assert!(e
            .check_combine(&lag)
            .unwrap_err()
            .to_string()
            .contains("security 1"));
        let mut short = good();
        short[0]["holding_rows"] = (e.holdings - 1).into();
        assert!(e
            .check_combine(&short)
            .unwrap_err()
            .to_string()
            .contains("HOLDING_SUMMARY"));
        let mut bad = good();
        bad[1]["seq"] = serde_json::json!([["x"]]);
        assert!(e.check_combine(&bad).is_err());
        bad[1] = serde_json::json!({});
        assert!(e.check_combine(&bad).is_err());
        let died = e.check_combine(&good()[..2]).unwrap();
        assert_eq!(died["volume_checked"], false);
    }
}
