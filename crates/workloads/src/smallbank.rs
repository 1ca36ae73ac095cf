//! SmallBank (FaSST §6.3, DrTM+H §5): SAVINGS and CHECKING, custid -> balance.
//!
//! - 100,000 accounts per worker thread at scale 1 (accounts = scale · 100,000 ·
//!   nodes · threads); the hot set is the first 4% of account ids (spread over nodes by
//!   the hash placement). Each *transaction* is hot with probability 90% and then draws
//!   all its accounts uniformly from the hot set, otherwise from all accounts; the second
//!   account of a two-account transaction is redrawn until it differs from the first.
//! - Balances are integer cents (i64), so the conservation check is exact. Initial
//!   balances are uniform in [10,000.00, 50,000.00] per account and table.
//! - Deviation: the ACCOUNTS table (name -> custid) is folded into the custid keys; no
//!   transaction looks accounts up by name.
//! - SendPayment with a.checking < 5.00 is an application abort (reason `user`), reported
//!   as aborted under its type.
//! - Invariant: Σ balances = initial Σ + committed deltas of DepositChecking (+1.30),
//!   TransactSavings (+20.20) and WriteCheck (−5.00, or −6.00 with the penalty);
//!   Amalgamate and SendPayment move money.

use crate::common::{
    get_i64, loaded_initial, part_i64, per_node_capacity, primary_rows, unreported_nodes, Loader,
    Outcome, Workload,
};
use ambidex::workload::Txn;
use ambidex::workload::WorkerCtx;
use ambidex::workload::WorkloadError;
use ambidex::workload::{AbortReason, NodeDb, Placement, TableSpec, WriteKind};
use rand::rngs::SmallRng;
use rand::Rng;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

pub const SAVINGS: u32 = 1;
pub const CHECKING: u32 = 2;

pub const ACCOUNTS_PER_THREAD: u64 = 100_000;
/// Percent of accounts that are hot, and percent of transactions that pick hot accounts.
pub const HOT_PERCENT: u64 = 4;
pub const HOT_TXN_PERCENT: u32 = 90;

pub const TYPES: [&str; 6] = [
    "amalgamate",
    "balance",
    "deposit_checking",
    "send_payment",
    "transact_savings",
    "write_check",
];
/// Cumulative mix in percent, in the order of [`TYPES`].
const MIX: [u32; 6] = [15, 30, 45, 70, 85, 100];

pub const DEPOSIT_CENTS: i64 = 130;
pub const TRANSACT_SAVINGS_CENTS: i64 = 2_020;
pub const SEND_PAYMENT_CENTS: i64 = 500;
pub const WRITE_CHECK_CENTS: i64 = 500;
pub const WRITE_CHECK_PENALTY_CENTS: i64 = 100;

/// A violation of SmallBank's invariants, or partial checks that cannot be combined (a
/// malformed part is the facade's `PartError`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SmallBankError {
    /// The balances do not add up to the initial total plus the committed deltas.
    #[error(
        "total balance {total} != expected {expected} (initial {initial} + committed deltas \
         {committed_delta}, in cents)"
    )]
    MoneyNotConserved {
        /// Σ balances at the primaries, in cents.
        total: i64,
        /// `initial + committed_delta`.
        expected: i64,
        /// Σ balances as loaded.
        initial: i64,
        /// Σ of the committed transactions' deposits and withdrawals.
        committed_delta: i64,
    },
    /// A table has more or fewer accounts at their primaries than were loaded.
    #[error("table {table} has {found} accounts, {loaded} loaded")]
    Accounts {
        /// The table (`SAVINGS` or `CHECKING`).
        table: u32,
        /// Accounts found.
        found: i64,
        /// Accounts loaded.
        loaded: u64,
    },
    /// No node's partial check to combine.
    #[error("no node checked its accounts")]
    NoParts,
}

pub struct SmallBank {
    pub accounts: u64,
    pub hot: u64,
    placement: Placement,
    initial_total: AtomicI64,
    /// Committed balance changes of the three money-creating types (whole run).
    delta: AtomicI64,
}

/// Per-worker balance delta of committed transactions.
#[derive(Default)]
pub struct Local {
    delta: i64,
}

/// Accounts of one transaction: whether it drew from the hot set, and two distinct ids
/// (the second is unused by one-account transactions).
pub fn draw_accounts(rng: &mut SmallRng, accounts: u64, hot: u64) -> (bool, u64, u64) {
    let is_hot = rng.gen_range(0..100) < HOT_TXN_PERCENT;
    let range = if is_hot { hot } else { accounts };
    let a = rng.gen_range(0..range);
    let mut b = rng.gen_range(0..range);
    while b == a && range > 1 {
        b = rng.gen_range(0..range);
    }
    (is_hot, a, b)
}

fn bal(v: Option<&[u8]>) -> i64 {
    v.map(|v| get_i64(v, 0)).unwrap_or(0)
}

impl SmallBank {
    pub fn new(placement: Placement, threads: u16, scale: f64) -> SmallBank {
        let accounts = ((ACCOUNTS_PER_THREAD as f64 * scale) as u64
            * placement.nodes() as u64
            * threads as u64)
            .max(50);
        SmallBank {
            accounts,
            hot: (accounts * HOT_PERCENT / 100).max(2),
            placement,
            initial_total: AtomicI64::new(0),
            delta: AtomicI64::new(0),
        }
    }

    /// Σ of all balances expected now (initial + committed deltas).
    pub fn expected_total(&self) -> i64 {
        self.initial_total.load(Ordering::SeqCst) + self.delta.load(Ordering::SeqCst)
    }

    async fn txn(&self, w: &WorkerCtx, ty: usize, a: u64, b: u64, local: &mut Local) -> Outcome {
        let mut t = Txn::begin(&w.ctx, &w.th);
        let mut delta = 0;
        match ty {
            0 => {
                // Amalgamate: all of a's money to b's checking.
                let sa = t.write(SAVINGS, a, WriteKind::Update);
                let ca = t.write(CHECKING, a, WriteKind::Update);
                let cb = t.write(CHECKING, b, WriteKind::Update);
                if let Err(r) = t.execute().await {
                    return Outcome::Aborted(r);
                }
                let total = bal(t.get(sa)) + bal(t.get(ca));
                let nb = bal(t.get(cb)) + total;
                t.set(sa, &0i64.to_le_bytes());
                t.set(ca, &0i64.to_le_bytes());
                t.set(cb, &nb.to_le_bytes());
            }
            1 => {
                t.read(SAVINGS, a);
                t.read(CHECKING, a);
                if let Err(r) = t.execute().await {
                    return Outcome::Aborted(r);
                }
            }
            2 => {
                let ca = t.write(CHECKING, a, WriteKind::Update);
                if let Err(r) = t.execute().await {
                    return Outcome::Aborted(r);
                }
                t.set(ca, &(bal(t.get(ca)) + DEPOSIT_CENTS).to_le_bytes());
                delta = DEPOSIT_CENTS;
            }
            3 => {
                let ca = t.write(CHECKING, a, WriteKind::Update);
                let cb = t.write(CHECKING, b, WriteKind::Update);
                if let Err(r) = t.execute().await {
                    return Outcome::Aborted(r);
                }
                let (va, vb) = (bal(t.get(ca)), bal(t.get(cb)));
                if va < SEND_PAYMENT_CENTS {
                    t.abort().await;
                    return Outcome::Aborted(AbortReason::User);
                }
                t.set(ca, &(va - SEND_PAYMENT_CENTS).to_le_bytes());
                t.set(cb, &(vb + SEND_PAYMENT_CENTS).to_le_bytes());
            }
            4 => {
                let sa = t.write(SAVINGS, a, WriteKind::Update);
                if let Err(r) = t.execute().await {
                    return Outcome::Aborted(r);
                }
                t.set(sa, &(bal(t.get(sa)) + TRANSACT_SAVINGS_CENTS).to_le_bytes());
                delta = TRANSACT_SAVINGS_CENTS;
            }
            _ => {
                let sa = t.read(SAVINGS, a);
                let ca = t.write(CHECKING, a, WriteKind::Update);
                if let Err(r) = t.execute().await {
                    return Outcome::Aborted(r);
                }
                let (s, c) = (bal(t.get(sa)), bal(t.get(ca)));
                let amount = if s + c < WRITE_CHECK_CENTS {
                    WRITE_CHECK_CENTS + WRITE_CHECK_PENALTY_CENTS
                } else {
                    WRITE_CHECK_CENTS
                };
                t.set(ca, &(c - amount).to_le_bytes());
                delta = -amount;
            }
        }
        match t.commit().await {
            Ok(_) => {
                local.delta += delta;
                Outcome::FOUND
            }
            Err(r) => Outcome::Aborted(r),
        }
    }
}

/// Accounts loaded per load unit.
const UNIT: u64 = 1024;

impl Workload for SmallBank {
    type Local = Local;

    fn name(&self) -> &'static str {
        "smallbank"
    }

    fn tables(&self) -> Vec<TableSpec> {
        let cap = per_node_capacity(self.accounts, &self.placement);
        vec![
            TableSpec {
                id: SAVINGS,
                name: "savings".into(),
                value_size: 8,
                capacity_per_node: cap,
            },
            TableSpec {
                id: CHECKING,
                name: "checking".into(),
                value_size: 8,
                capacity_per_node: cap,
            },
        ]
    }

    fn txn_types(&self) -> &'static [&'static str] {
        &TYPES
    }

    fn load_units(&self) -> u64 {
        self.accounts.div_ceil(UNIT)
    }

    fn load_unit(
        &self,
        unit: u64,
        rng: &mut SmallRng,
        out: &Loader<'_>,
    ) -> Result<(), WorkloadError> {
        let mut sum = 0i64;
        let end = ((unit + 1) * UNIT).min(self.accounts);
        for id in unit * UNIT..end {
            for table in [SAVINGS, CHECKING] {
                let v = rng.gen_range(1_000_000..=5_000_000i64);
                sum += v;
                out.put(table, id, &v.to_le_bytes())?;
            }
        }
        if out.is_first() {
            self.initial_total.fetch_add(sum, Ordering::SeqCst);
        }
        Ok(())
    }

    async fn run_one(
        &self,
        w: &WorkerCtx,
        rng: &mut SmallRng,
        local: &mut Local,
    ) -> (usize, Outcome) {
        let x = rng.gen_range(0..100);
        let ty = MIX.iter().position(|&m| x < m).expect("mix sums to 100");
        let (_, a, b) = draw_accounts(rng, self.accounts, self.hot);
        (ty, self.txn(w, ty, a, b, local).await)
    }

    fn finish_worker(&self, local: Local) {
        self.delta.fetch_add(local.delta, Ordering::SeqCst);
    }

    fn fold_worker(&self, local: &mut Local) {
        self.delta
            .fetch_add(std::mem::take(&mut local.delta), Ordering::SeqCst);
    }

    fn committed_by_recovery(&self, table: u32, old: Option<&[u8]>, new: Option<&[u8]>) {
        if table == SAVINGS || table == CHECKING {
            let bal = |v: Option<&[u8]>| v.filter(|v| v.len() >= 8).map_or(0, |v| get_i64(v, 0));
            self.delta
                .fetch_add(bal(new).wrapping_sub(bal(old)), Ordering::SeqCst);
        }
    }

    /// The money invariant; not checked (neither true nor false) when a node died with
    /// its committed deltas.
    fn check_verdict(&self, summary: &serde_json::Value, ok: bool) -> (Option<bool>, Option<bool>) {
        if summary["balance_checked"] == false {
            (None, None)
        } else {
            (Some(ok), None)
        }
    }

    fn check(&self, dbs: &[Arc<NodeDb>]) -> Result<serde_json::Value, WorkloadError> {
        let mut total = 0i64;
        for table in [SAVINGS, CHECKING] {
            let rows = primary_rows(dbs, table);
            if rows.len() as u64 != self.accounts {
                return Err(SmallBankError::Accounts {
                    table,
                    found: rows.len() as i64,
                    loaded: self.accounts,
                }
                .into());
            }
            total += rows.iter().map(|(_, v)| get_i64(v, 0)).sum::<i64>();
        }
        let (initial, committed_delta) = (
            self.initial_total.load(Ordering::SeqCst),
            self.delta.load(Ordering::SeqCst),
        );
        // As `expected_total`, from the values the error reports.
        let expected = initial + committed_delta;
        if total != expected {
            return Err(SmallBankError::MoneyNotConserved {
                total,
                expected,
                initial,
                committed_delta,
            }
            .into());
        }
        Ok(serde_json::json!({
            "total_cents": total,
            "expected_cents": expected,
            "initial_cents": initial,
            "committed_delta_cents": committed_delta,
        }))
    }

    /// This node's primaries: their count and balance per table, with the committed
    /// deltas of the workers this process ran and the initial total (which every node
    /// process computes, since each generates every account while loading).
    fn check_node(&self, db: &Arc<NodeDb>) -> Result<serde_json::Value, WorkloadError> {
        let dbs = std::slice::from_ref(db);
        let mut out = serde_json::Map::new();
        let mut total = 0i64;
        for (name, table) in [("savings", SAVINGS), ("checking", CHECKING)] {
            let rows = primary_rows(dbs, table);
            total += rows.iter().map(|(_, v)| get_i64(v, 0)).sum::<i64>();
            out.insert(format!("{name}_rows"), (rows.len() as u64).into());
        }
        out.insert("node".into(), db.node.into());
        out.insert("primary_cents".into(), total.into());
        out.insert(
            "initial_cents".into(),
            self.initial_total.load(Ordering::SeqCst).into(),
        );
        out.insert(
            "committed_delta_cents".into(),
            self.delta.load(Ordering::SeqCst).into(),
        );
        Ok(out.into())
    }

    fn check_combine(
        &self,
        parts: &[serde_json::Value],
    ) -> Result<serde_json::Value, WorkloadError> {
        if parts.is_empty() {
            return Err(SmallBankError::NoParts.into());
        }
        // A node restarted during the run loaded nothing and counted only its new
        // incarnation's deltas: its rows count, its initial total does not, and the
        // balance is unchecked as after a death.
        let initial = loaded_initial(parts, "initial_cents", "initial total")?;
        let (mut total, mut delta) = (0i64, 0i64);
        let mut rows = [0i64; 2];
        for (n, p) in parts.iter().enumerate() {
            total = total.saturating_add(part_i64(p, n, "primary_cents")?);
            delta = delta.saturating_add(part_i64(p, n, "committed_delta_cents")?);
            rows[0] += part_i64(p, n, "savings_rows")?;
            rows[1] += part_i64(p, n, "checking_rows")?;
        }
        for (table, n) in [(SAVINGS, rows[0]), (CHECKING, rows[1])] {
            if n as u64 != self.accounts {
                return Err(SmallBankError::Accounts {
                    table,
                    found: n,
                    loaded: self.accounts,
                }
                .into());
            }
        }
        let expected = initial.saturating_add(delta);
        // A node that died during the run (node processes with a manager) sent no
        // part: the deposits and withdrawals its workers committed died with it, so the
        // total cannot be checked. The accounts (all rows at the surviving primaries)
        // and the replicas still are; `balance_checked` says the rest was not.
        let missing = unreported_nodes(parts, self.placement.nodes())?;
        if !missing.is_empty() {
            return Ok(serde_json::json!({
                "total_cents": total,
                "initial_cents": initial,
                "committed_delta_cents": delta,
                "balance_checked": false,
                "why_unchecked": format!(
                    "node(s) {missing:?} did not report (died) or restarted: the balance \
                     changes their first incarnation's workers committed are unknown"
                ),
                "unaccounted_cents": total.saturating_sub(expected),
            }));
        }
        if total != expected {
            return Err(SmallBankError::MoneyNotConserved {
                total,
                expected,
                initial,
                committed_delta: delta,
            }
            .into());
        }
        Ok(serde_json::json!({
            "total_cents": total,
            "expected_cents": expected,
            "initial_cents": initial,
            "committed_delta_cents": delta,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// 90% of transactions draw from the hot set (the first 4% of ids), not 10%: one
    /// public implementation had this inverted.
    #[test]
    fn ninety_percent_of_transactions_are_hot() {
        let bank = SmallBank::new(Placement::new(3, 3).unwrap(), 1, 1.0);
        assert_eq!(bank.accounts, 300_000);
        assert_eq!(bank.hot, 12_000);
        let mut rng = SmallRng::seed_from_u64(1);
        let n = 200_000;
        let (mut hot_txns, mut both_in_hot_set, mut touched_hot) = (0, 0, 0);
        for _ in 0..n {
            let (is_hot, a, b) = draw_accounts(&mut rng, bank.accounts, bank.hot);
            assert_ne!(a, b);
            assert!(a < bank.accounts && b < bank.accounts);
            if is_hot {
                hot_txns += 1;
                assert!(
                    a < bank.hot && b < bank.hot,
                    "a hot transaction left the hot set"
                );
            }
            if a < bank.hot && b < bank.hot {
                both_in_hot_set += 1;
            }
            if a < bank.hot {
                touched_hot += 1;
            }
        }
        let frac = |x: u32| x as f64 / n as f64;
        assert!(
            (frac(hot_txns) - 0.90).abs() < 0.005,
            "hot transactions: {}",
            frac(hot_txns)
        );
        // Uniform draws land in the hot set 4% of the time: 0.9 + 0.1 · 0.04.
        assert!(
            (frac(touched_hot) - 0.904).abs() < 0.005,
            "accounts in the hot set: {}",
            frac(touched_hot)
        );
        assert!(frac(both_in_hot_set) > 0.89);
        // The hot set is spread over the nodes by the placement hash.
        let p = Placement::new(3, 3).unwrap();
        let mut per_node = [0u32; 3];
        for id in 0..bank.hot {
            per_node[p.primary(CHECKING, id) as usize] += 1;
        }
        assert!(per_node.iter().all(|&c| c > 3_600), "{per_node:?}");
    }

    /// A wrong total is a `SmallBankError` carrying the numbers (initial totals are
    /// per loaded node, deltas summed over the nodes).
    #[test]
    fn a_wrong_total_is_reported_with_its_numbers() {
        let bank = SmallBank::new(Placement::new(3, 3).unwrap(), 1, 0.01);
        let part = |node: u16, rows: u64, cents: i64| {
            serde_json::json!({
                "node": node, "savings_rows": rows, "checking_rows": rows,
                "primary_cents": cents, "initial_cents": 100, "committed_delta_cents": 5,
            })
        };
        let n = bank.accounts;
        let e = bank
            .check_combine(&[part(0, n, 116), part(1, 0, 0), part(2, 0, 0)])
            .unwrap_err();
        assert_eq!(
            e.downcast_ref::<SmallBankError>(),
            Some(&SmallBankError::MoneyNotConserved {
                total: 116,
                expected: 115,
                initial: 100,
                committed_delta: 15,
            }),
            "{e}"
        );
        let e = bank
            .check_combine(&[part(0, n - 1, 115), part(1, 0, 0), part(2, 0, 0)])
            .unwrap_err();
        assert_eq!(
            e.downcast_ref::<SmallBankError>(),
            Some(&SmallBankError::Accounts {
                table: SAVINGS,
                found: n as i64 - 1,
                loaded: n,
            }),
            "{e}"
        );
    }

    #[test]
    fn mix_matches_the_spec() {
        let mut rng = SmallRng::seed_from_u64(2);
        let mut count = [0u32; 6];
        for _ in 0..100_000 {
            let x = rng.gen_range(0..100);
            count[MIX.iter().position(|&m| x < m).unwrap()] += 1;
        }
        let want = [15.0, 15.0, 15.0, 25.0, 15.0, 15.0];
        for (c, w) in count.iter().zip(want) {
            assert!((*c as f64 / 1000.0 - w).abs() < 0.7, "{count:?}");
        }
    }
}
