//! TATP (FaSST §6.2, TATP spec v1.0): SUBSCRIBER, ACCESS_INFO, SPECIAL_FACILITY and
//! CALL_FORWARDING with the seven transactions in the spec's mix.
//!
//! - Population: `scale · 1,000,000` subscribers per node (paper scale: 1,000,000 per
//!   node). Each subscriber has 1–4 ACCESS_INFO and 1–4 SPECIAL_FACILITY rows with
//!   distinct random types; `is_active` is 1 with probability 85%.
//! - Deviation (as FaSST): CALL_FORWARDING is loaded in its steady state rather than the
//!   spec's initial state: for each SPECIAL_FACILITY row and each start time in {0, 8, 16}
//!   a row exists with probability 0.5, so INSERT/DELETE_CALL_FORWARDING keep their
//!   31.25% success rates over a long run.
//! - `s_id = NURand(A, 1, P)` with A = 65535 (P ≤ 1M), 1048575 (P ≤ 10M), else 2097151.
//! - Deviation: `sub_nbr` is `s_id` as a 15-digit string, so the sub_nbr → s_id lookup of
//!   UPDATE_LOCATION and INSERT/DELETE_CALL_FORWARDING is computed, not an index read.
//! - Keys pack into 8 bytes: SUBSCRIBER s_id; ACCESS_INFO and SPECIAL_FACILITY
//!   `s_id << 2 | type − 1`; CALL_FORWARDING `s_id << 4 | (sf_type − 1) << 2 | start / 8`.
//!   Values: SUBSCRIBER 40 B, ACCESS_INFO 16 B, SPECIAL_FACILITY 8 B, CALL_FORWARDING 16 B.
//!   Tables are partitioned by key hash, no locality (as FaSST and FaRM).
//! - Expected success rates (the report's `expected_found_rate`): GET_ACCESS_DATA and
//!   UPDATE_SUBSCRIBER_DATA 62.5%, INSERT/DELETE_CALL_FORWARDING 31.25%, and
//!   GET_NEW_DESTINATION computed exactly for this population with the spec's predicate
//!   (`sf.is_active = 1 AND cf.start_time <= start_time AND end_time < cf.end_time`,
//!   start_time ∈ {0, 8, 16}, end_time uniform in 1..24, cf.end_time = cf.start_time +
//!   U(1, 8)): 15.8% ([`expected_get_new_destination_rate`]). WORKLOADS.md says "about
//!   20%"; this implementation measures 15.7–15.8%, matching the computation.
//! - A transaction that finds no matching row is a valid completed transaction, counted
//!   as committed with `found = false`. Where the row's absence is discovered by the
//!   transaction layer (update/delete of a missing key, insert of an existing one) or by
//!   the application (missing SPECIAL_FACILITY before an insert), the transaction layer
//!   has aborted it (rolling back any other write, as the spec's failed transaction), so
//!   the layer's own `TxnStats` count those under `missing_key` / `insert_exists` /
//!   `user`; the benchmark report counts them as not-found completions.

use crate::common::{
    nurand, per_node_capacity, put_u32, tatp_nurand_a, urand, Loader, Outcome, Workload,
};
use ambidex::workload::Txn;
use ambidex::workload::WorkerCtx;
use ambidex::workload::WorkloadError;
use ambidex::workload::{AbortReason, Placement, TableSpec, WriteKind};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::Rng;

pub const SUBSCRIBER: u32 = 10;
pub const ACCESS_INFO: u32 = 11;
pub const SPECIAL_FACILITY: u32 = 12;
pub const CALL_FORWARDING: u32 = 13;

pub const SUBSCRIBERS_PER_NODE: u64 = 1_000_000;

pub const TYPES: [&str; 7] = [
    "get_subscriber_data",
    "get_new_destination",
    "get_access_data",
    "update_subscriber_data",
    "update_location",
    "insert_call_forwarding",
    "delete_call_forwarding",
];
/// Cumulative mix in percent, in the order of [`TYPES`] (35/10/35/2/14/2/2).
const MIX: [u32; 7] = [35, 45, 80, 82, 96, 98, 100];

const SUB_SIZE: usize = 40;
const AI_SIZE: usize = 16;
const SF_SIZE: usize = 8;
const CF_SIZE: usize = 16;
/// SUBSCRIBER layout: bits (u16) | hex nibbles (5 B) | byte2 (10 B) | msc u32 | vlr u32 | sub_nbr (15 B).
const SUB_BITS: usize = 0;
const SUB_VLR: usize = 21;
/// SPECIAL_FACILITY layout: is_active | error_cntrl | data_a | data_b (5 B).
const SF_ACTIVE: usize = 0;
const SF_DATA_A: usize = 2;
/// CALL_FORWARDING layout: end_time | numberx (15 B).
const CF_END: usize = 0;

pub const START_TIMES: [u64; 3] = [0, 8, 16];

pub fn sub_key(s: u64) -> u64 {
    s
}
pub fn ai_key(s: u64, ai_type: u64) -> u64 {
    s << 2 | (ai_type - 1)
}
pub fn sf_key(s: u64, sf_type: u64) -> u64 {
    s << 2 | (sf_type - 1)
}
pub fn cf_key(s: u64, sf_type: u64, start: u64) -> u64 {
    s << 4 | (sf_type - 1) << 2 | (start / 8)
}

/// `s_id` as the 15-digit `sub_nbr` string (the spec's derivation).
pub fn sub_nbr(s: u64) -> [u8; 15] {
    let mut b = [b'0'; 15];
    let mut x = s;
    for c in b.iter_mut().rev() {
        *c = b'0' + (x % 10) as u8;
        x /= 10;
    }
    b
}

pub struct Tatp {
    pub subscribers: u64,
    a: u64,
    placement: Placement,
}

/// Exact expected success rate of GET_NEW_DESTINATION for the steady-state population:
/// the SPECIAL_FACILITY row exists (5/8) and is active (0.85), and some CALL_FORWARDING
/// row with `start ≤ start_time` exists (½ each) with `end_time < cf.end_time`.
pub fn expected_get_new_destination_rate() -> f64 {
    let mut p_cf = 0.0;
    for &st in &START_TIMES {
        for end_time in 1..=24u64 {
            // P(no qualifying row) over the rows with start ≤ st.
            let mut none = 1.0;
            for &cs in START_TIMES.iter().filter(|&&cs| cs <= st) {
                // cf.end = cs + U(1, 8); qualifies iff end_time < cf.end.
                let ok = (1..=8u64).filter(|d| end_time < cs + d).count() as f64 / 8.0;
                none *= 1.0 - 0.5 * ok;
            }
            p_cf += (1.0 - none) / (3.0 * 24.0);
        }
    }
    0.625 * 0.85 * p_cf
}

impl Tatp {
    pub fn new(placement: Placement, scale: f64) -> Tatp {
        let subscribers =
            ((SUBSCRIBERS_PER_NODE as f64 * scale) as u64 * placement.nodes() as u64).max(16);
        Tatp {
            subscribers,
            a: tatp_nurand_a(subscribers),
            placement,
        }
    }

    fn s_id(&self, rng: &mut SmallRng) -> u64 {
        nurand(rng, self.a, 1, self.subscribers, 0)
    }

    async fn txn(&self, w: &WorkerCtx, ty: usize, rng: &mut SmallRng) -> Outcome {
        let s = self.s_id(rng);
        let mut t = Txn::begin(&w.ctx, &w.th);
        macro_rules! exec {
            () => {
                if let Err(r) = t.execute().await {
                    return Outcome::Aborted(r);
                }
            };
        }
        let mut found = true;
        match ty {
            0 => {
                let i = t.read(SUBSCRIBER, sub_key(s));
                exec!();
                found = t.get(i).is_some();
            }
            1 => {
                let sf_type = urand(rng, 1, 4);
                let start_time = START_TIMES[rng.gen_range(0..3)];
                let end_time = urand(rng, 1, 24);
                let sf = t.read(SPECIAL_FACILITY, sf_key(s, sf_type));
                let mut cfs = [None; 3];
                for (i, &st) in START_TIMES
                    .iter()
                    .enumerate()
                    .filter(|(_, &st)| st <= start_time)
                {
                    cfs[i] = Some(t.read(CALL_FORWARDING, cf_key(s, sf_type, st)));
                }
                exec!();
                let active = t.get(sf).is_some_and(|v| v[SF_ACTIVE] == 1);
                found = active
                    && cfs
                        .iter()
                        .flatten()
                        .any(|&c| t.get(c).is_some_and(|v| end_time < v[CF_END] as u64));
            }
            2 => {
                let i = t.read(ACCESS_INFO, ai_key(s, urand(rng, 1, 4)));
                exec!();
                found = t.get(i).is_some();
            }
            3 => {
                let sub = t.write(SUBSCRIBER, sub_key(s), WriteKind::Update);
                let sf = t.write(
                    SPECIAL_FACILITY,
                    sf_key(s, urand(rng, 1, 4)),
                    WriteKind::Update,
                );
                match t.execute().await {
                    Ok(()) => {}
                    // SUBSCRIBER always exists: the SPECIAL_FACILITY row is missing.
                    Err(AbortReason::MissingKey) => return Outcome::NOT_FOUND,
                    Err(r) => return Outcome::Aborted(r),
                }
                let mut v = t.get(sub).expect("locked row").to_vec();
                let bits = u16::from_le_bytes([v[SUB_BITS], v[SUB_BITS + 1]]);
                let bits = (bits & !1) | rng.gen_range(0..2u16);
                v[SUB_BITS..SUB_BITS + 2].copy_from_slice(&bits.to_le_bytes());
                t.set(sub, &v);
                let mut f = t.get(sf).expect("locked row").to_vec();
                f[SF_DATA_A] = rng.gen();
                t.set(sf, &f);
            }
            4 => {
                let sub = t.write(SUBSCRIBER, sub_key(s), WriteKind::Update);
                exec!();
                let mut v = t.get(sub).expect("locked row").to_vec();
                put_u32(&mut v, SUB_VLR, rng.gen());
                t.set(sub, &v);
            }
            5 => {
                let sf_type = urand(rng, 1, 4);
                let start = START_TIMES[rng.gen_range(0..3)];
                let end = start + urand(rng, 1, 8);
                let sfs: Vec<_> = (1..=4)
                    .map(|ty| t.read(SPECIAL_FACILITY, sf_key(s, ty)))
                    .collect();
                let cf = t.write(
                    CALL_FORWARDING,
                    cf_key(s, sf_type, start),
                    WriteKind::Insert,
                );
                match t.execute().await {
                    Ok(()) => {}
                    Err(AbortReason::InsertExists) => return Outcome::NOT_FOUND,
                    Err(r) => return Outcome::Aborted(r),
                }
                if t.get(sfs[sf_type as usize - 1]).is_none() {
                    t.abort().await;
                    return Outcome::NOT_FOUND;
                }
                let mut v = [0u8; CF_SIZE];
                v[CF_END] = end as u8;
                v[1..16].copy_from_slice(&sub_nbr(rng.gen_range(1..1_000_000_000_000_000)));
                t.set(cf, &v);
            }
            _ => {
                let sf_type = urand(rng, 1, 4);
                let start = START_TIMES[rng.gen_range(0..3)];
                t.write(
                    CALL_FORWARDING,
                    cf_key(s, sf_type, start),
                    WriteKind::Delete,
                );
                match t.execute().await {
                    Ok(()) => {}
                    Err(AbortReason::MissingKey) => return Outcome::NOT_FOUND,
                    Err(r) => return Outcome::Aborted(r),
                }
            }
        }
        match t.commit().await {
            Ok(_) => Outcome::Committed { found },
            Err(r) => Outcome::Aborted(r),
        }
    }
}

/// Subscribers loaded per load unit.
const UNIT: u64 = 1024;

impl Workload for Tatp {
    type Local = ();

    fn name(&self) -> &'static str {
        "tatp"
    }

    fn tables(&self) -> Vec<TableSpec> {
        let p = self.subscribers;
        let cap = |rows: u64| per_node_capacity(rows, &self.placement);
        vec![
            TableSpec {
                id: SUBSCRIBER,
                name: "subscriber".into(),
                value_size: SUB_SIZE,
                capacity_per_node: cap(p),
            },
            TableSpec {
                id: ACCESS_INFO,
                name: "access_info".into(),
                value_size: AI_SIZE,
                capacity_per_node: cap(p * 11 / 4),
            },
            TableSpec {
                id: SPECIAL_FACILITY,
                name: "special_facility".into(),
                value_size: SF_SIZE,
                capacity_per_node: cap(p * 11 / 4),
            },
            // 3.75 rows per subscriber on average, plus the (locked, then tombstone) keys
            // inserts touch during a run.
            TableSpec {
                id: CALL_FORWARDING,
                name: "call_forwarding".into(),
                value_size: CF_SIZE,
                capacity_per_node: cap(p * 5 + 100_000),
            },
        ]
    }

    fn txn_types(&self) -> &'static [&'static str] {
        &TYPES
    }

    fn expected_found_rates(&self) -> Vec<Option<f64>> {
        vec![
            Some(1.0),
            Some(expected_get_new_destination_rate()),
            Some(0.625),
            Some(0.625),
            Some(1.0),
            Some(0.3125),
            Some(0.3125),
        ]
    }

    fn load_units(&self) -> u64 {
        self.subscribers.div_ceil(UNIT)
    }

    fn load_unit(
        &self,
        unit: u64,
        rng: &mut SmallRng,
        out: &Loader<'_>,
    ) -> Result<(), WorkloadError> {
        let first = unit * UNIT + 1;
        let last = ((unit + 1) * UNIT).min(self.subscribers);
        let mut types = [1u64, 2, 3, 4];
        for s in first..=last {
            let mut v = [0u8; SUB_SIZE];
            rng.fill(&mut v[..25]);
            v[25..40].copy_from_slice(&sub_nbr(s));
            out.put(SUBSCRIBER, sub_key(s), &v)?;
            types.shuffle(rng);
            for &ty in &types[..urand(rng, 1, 4) as usize] {
                let mut v = [0u8; AI_SIZE];
                rng.fill(&mut v[..10]);
                out.put(ACCESS_INFO, ai_key(s, ty), &v)?;
            }
            types.shuffle(rng);
            for &ty in &types[..urand(rng, 1, 4) as usize] {
                let mut v = [0u8; SF_SIZE];
                rng.fill(&mut v[..]);
                v[SF_ACTIVE] = rng.gen_bool(0.85) as u8;
                out.put(SPECIAL_FACILITY, sf_key(s, ty), &v)?;
                for &st in &START_TIMES {
                    if rng.gen_bool(0.5) {
                        let mut c = [0u8; CF_SIZE];
                        c[CF_END] = (st + urand(rng, 1, 8)) as u8;
                        c[1..16].copy_from_slice(&sub_nbr(rng.gen_range(1..1_000_000_000_000_000)));
                        out.put(CALL_FORWARDING, cf_key(s, ty, st), &c)?;
                    }
                }
            }
        }
        Ok(())
    }

    async fn run_one(&self, w: &WorkerCtx, rng: &mut SmallRng, _: &mut ()) -> (usize, Outcome) {
        let x = rng.gen_range(0..100);
        let ty = MIX.iter().position(|&m| x < m).expect("mix sums to 100");
        (ty, self.txn(w, ty, rng).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_new_destination_rate_of_the_steady_state_population() {
        // 5/8 · 0.85 · P(a qualifying CALL_FORWARDING row) with the spec's predicate; see the
        // report: WORKLOADS.md says "about 20%", the predicate gives 15.8%.
        let r = expected_get_new_destination_rate();
        assert!((r - 0.158_176).abs() < 1e-5, "{r}");
    }

    #[test]
    fn keys_are_distinct_per_table() {
        let mut seen = std::collections::HashSet::new();
        for s in 1..200u64 {
            for ty in 1..=4 {
                assert!(seen.insert((ACCESS_INFO, ai_key(s, ty))));
                for &st in &START_TIMES {
                    assert!(seen.insert((CALL_FORWARDING, cf_key(s, ty, st))));
                }
            }
        }
        assert_eq!(&sub_nbr(42), b"000000000000042");
    }
}
