//! Pieces the built-in workloads share: fixed-layout row helpers and the TPC specs'
//! random draws (NURand); the workload trait, outcomes, the loader, check helpers and
//! key placement come from the facade (`ambidex::workload`).

pub use ambidex::workload::{
    homed_key, loaded_initial, part_i64, primary_rows, restarted_part, unreported_nodes,
    worker_seed, Loader, Outcome, Workload, LOGICAL_BITS,
};
use rand::rngs::SmallRng;
use rand::Rng;

// ----- fixed-layout rows -----

#[inline]
pub fn get_i64(b: &[u8], off: usize) -> i64 {
    i64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

#[inline]
pub fn put_i64(b: &mut [u8], off: usize, v: i64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// Adds `delta` to the i64 at `off`.
#[inline]
pub fn add_i64(b: &mut [u8], off: usize, delta: i64) {
    let v = get_i64(b, off);
    put_i64(b, off, v + delta);
}

#[inline]
pub fn get_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}

#[inline]
pub fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

/// Fills `b` with random alphanumeric characters.
pub fn rand_str(rng: &mut SmallRng, b: &mut [u8]) {
    const A: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    for c in b {
        *c = A[rng.gen_range(0..A.len())];
    }
}

/// Uniform in [lo, hi] (inclusive), as the TPC specs write it.
#[inline]
pub fn urand(rng: &mut SmallRng, lo: u64, hi: u64) -> u64 {
    rng.gen_range(lo..=hi)
}

/// TPC's non-uniform random `NURand(A, x, y) = (((rand(0, A) | rand(x, y)) + C) % (y − x + 1)) + x`.
/// TATP's form is the special case x = 1, C = 0.
#[inline]
pub fn nurand(rng: &mut SmallRng, a: u64, x: u64, y: u64, c: u64) -> u64 {
    (((urand(rng, 0, a) | urand(rng, x, y)) + c) % (y - x + 1)) + x
}

/// The A of TATP's NURand for a population of `p` subscribers.
pub fn tatp_nurand_a(p: u64) -> u64 {
    if p <= 1_000_000 {
        65_535
    } else if p <= 10_000_000 {
        1_048_575
    } else {
        2_097_151
    }
}

/// How many keys a node's table is sized for (the facade's rule, shared by every table).
pub use ambidex::schema::per_node_capacity;

#[cfg(test)]
mod tests {
    use super::*;
    use ambidex::workload::Placement;
    use rand::SeedableRng;

    /// The room planned per node holds every copy a node is given after R − 1 nodes
    /// are lost one after another and re-replicated (the placement's own choices). With
    /// the old plan (one failure), 5 nodes of R = 3 overflowed at the second.
    #[test]
    fn the_planned_room_holds_the_copies_after_r_minus_one_failures() {
        let total = 200_000u64;
        for (nodes, r) in [(3u16, 3u16), (4, 3), (5, 3), (6, 3), (8, 3), (5, 2), (7, 2)] {
            let mut p = Placement::new(nodes, r).unwrap();
            let cap = per_node_capacity(total, &p);
            for gone in 0..(r - 1) {
                p = p.without(1 << gone).unwrap();
                for part in 0..p.partitions() {
                    for n in p.replicas_of(part).to_vec() {
                        p.mark_synced(part, n);
                    }
                }
                for n in (0..nodes).filter(|&n| p.is_member(n)) {
                    let held = (0..total).filter(|&k| p.stores(n, 1, k)).count();
                    assert!(
                        held <= cap,
                        "{nodes} nodes, R = {r}, after {} failures: node {n} holds {held} \
                         keys, room for {cap}",
                        gone + 1
                    );
                }
            }
        }
    }

    #[test]
    fn nurand_stays_in_bounds_and_is_skewed() {
        let mut rng = SmallRng::seed_from_u64(7);
        for &(a, x, y) in &[
            (65_535u64, 1u64, 3_000u64),
            (255, 0, 999),
            (1023, 1, 3000),
            (8191, 1, 100_000),
        ] {
            let mut hits = std::collections::HashMap::new();
            for _ in 0..200_000 {
                let v = nurand(&mut rng, a, x, y, 0);
                assert!((x..=y).contains(&v), "NURand({a},{x},{y}) = {v}");
                *hits.entry(v).or_insert(0u32) += 1;
            }
            // Non-uniform: the most drawn value is drawn far more often than the mean.
            let max = *hits.values().max().unwrap() as f64;
            let mean = 200_000.0 / (y - x + 1) as f64;
            assert!(
                max > 2.0 * mean,
                "NURand({a},{x},{y}) looks uniform: max {max}, mean {mean}"
            );
        }
        // The TATP form reaches both ends of [1, P].
        let p = 1000;
        let (mut lo, mut hi) = (u64::MAX, 0);
        for _ in 0..100_000 {
            let v = nurand(&mut rng, tatp_nurand_a(p), 1, p, 0);
            lo = lo.min(v);
            hi = hi.max(v);
        }
        assert_eq!((lo, hi), (1, p));
        assert_eq!(tatp_nurand_a(1_000_000), 65_535);
        assert_eq!(tatp_nurand_a(1_000_001), 1_048_575);
        assert_eq!(tatp_nurand_a(10_000_001), 2_097_151);
    }

    #[test]
    fn homed_keys_land_on_their_home_and_are_distinct() {
        let p = Placement::new(5, 3).unwrap();
        let mut seen = std::collections::HashSet::new();
        for k in 0..2_000u64 {
            for home in 0..5u16 {
                let key = homed_key(&p, 9, k, home);
                assert_eq!(p.primary(9, key), home);
                assert_eq!(key & ((1 << LOGICAL_BITS) - 1), k);
                assert!(seen.insert((key, home)));
            }
        }
    }
}
