//! The store benchmark: lookup and update throughput of the hash table against
//! `std::collections::HashMap` (default hasher) on the same keys, in the same run, with
//! one thread and with all threads; and the memory per item.
//!
//! Baselines: the all-thread HashMap lookups share one read-only map (no lock, the best
//! case for HashMap); the all-thread HashMap updates go through a `Mutex`, since a
//! `HashMap` cannot be updated concurrently otherwise.

use crate::layout::TableConfig;
use crate::table::Table;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StoreBenchConfig {
    /// Items in the 8/40 table (which is created 90% full).
    pub items: usize,
    /// Threads of the all-thread measurements.
    pub threads: usize,
    /// Seconds per measurement.
    pub seconds: f64,
    pub seed: u64,
}

impl Default for StoreBenchConfig {
    fn default() -> Self {
        StoreBenchConfig {
            items: 1_000_000,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            seconds: 1.0,
            seed: 1,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct StoreBenchReport {
    pub items: usize,
    pub threads: usize,
    pub seconds_per_measurement: f64,
    pub key_size: usize,
    pub value_size: usize,
    pub lookups_per_s: f64,
    pub hashmap_lookups_per_s: f64,
    /// ours / HashMap.
    pub lookup_ratio: f64,
    pub updates_per_s: f64,
    pub hashmap_updates_per_s: f64,
    pub update_ratio: f64,
    pub all_threads_lookups_per_s: f64,
    pub all_threads_hashmap_lookups_per_s: f64,
    pub all_threads_lookup_ratio: f64,
    pub all_threads_updates_per_s: f64,
    /// Through a `Mutex<HashMap>`.
    pub all_threads_hashmap_updates_per_s: f64,
    pub all_threads_update_ratio: f64,
    /// Region bytes / items of the 8/40 table at 90% occupancy.
    pub bytes_per_item_8_40: f64,
    /// Estimate for the HashMap (its buckets and control bytes, no allocator overhead).
    pub hashmap_bytes_per_item_8_40: f64,
    pub occupancy_8_40: f64,
    /// Region bytes / items of an 8/8 table filled to 90% of its capacity.
    pub bytes_per_item_8_8_at_90pct: f64,
    /// key + value + header for 8/8.
    pub raw_bytes_per_item_8_8: f64,
    pub overflow_buckets_used_8_40: usize,
    pub overflow_buckets_8_40: usize,
}

/// A cheap per-thread random index stream, the same for both maps.
struct Idx(u64);

impl Idx {
    #[inline]
    fn next(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 as u128 * n as u128) >> 64) as usize
    }
}

/// Runs `op` in batches for `secs` on `threads` threads; returns total ops per second.
fn measure<F>(threads: usize, secs: f64, op: F) -> f64
where
    F: Fn(&mut Idx) + Sync,
{
    let dur = Duration::from_secs_f64(secs.max(0.01));
    let total: u64 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads.max(1))
            .map(|t| {
                let op = &op;
                s.spawn(move || {
                    let mut idx = Idx(0x9e37_79b9_7f4a_7c15 ^ ((t as u64 + 1) * 0x1234_5678_9abc));
                    let start = Instant::now();
                    let mut n = 0u64;
                    while start.elapsed() < dur {
                        for _ in 0..1024 {
                            op(&mut idx);
                        }
                        n += 1024;
                    }
                    (n, start.elapsed())
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                let (n, el) = h.join().unwrap_or((0, dur));
                (n as f64 / el.as_secs_f64()) as u64
            })
            .sum()
    });
    total as f64
}

/// Measures `a` and `b` alternately in `ROUNDS` rounds of `secs / ROUNDS` each;
/// returns their mean rates.
fn paired<A, B>(threads: usize, secs: f64, a: &A, b: &B) -> (f64, f64)
where
    A: Fn(&mut Idx) + Sync,
    B: Fn(&mut Idx) + Sync,
{
    const ROUNDS: usize = 5;
    let s = secs / ROUNDS as f64;
    let (mut ra, mut rb) = (0.0, 0.0);
    for _ in 0..ROUNDS {
        ra += measure(threads, s, a);
        rb += measure(threads, s, b);
    }
    (ra / ROUNDS as f64, rb / ROUNDS as f64)
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// Bytes/item of an 8/8 table filled to 90% of its capacity.
fn bytes_8_8(capacity: usize, seed: u64) -> f64 {
    let t = match Table::create_anonymous(2, &TableConfig::new(capacity, 8)) {
        Ok(t) => t,
        Err(_) => return f64::NAN,
    };
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x88);
    let want = capacity * 9 / 10;
    let mut n = 0;
    while n < want {
        match t.insert(rng.gen(), &[7u8; 8]) {
            Ok(_) => n += 1,
            Err(crate::table::StoreError::Exists) => {}
            Err(_) => return f64::NAN,
        }
    }
    t.region_bytes() as f64 / n as f64
}

pub fn run_bench(cfg: &StoreBenchConfig) -> StoreBenchReport {
    const V: usize = 40;
    let items = cfg.items.max(1);
    let threads = cfg.threads.max(1);
    let mut rng = SmallRng::seed_from_u64(cfg.seed);
    let capacity = (items as f64 / 0.9).ceil() as usize;
    let table = Table::create_anonymous(1, &TableConfig::new(capacity, V))
        .expect("table of the configured size");
    let mut map: HashMap<u64, [u8; V]> = HashMap::new();
    let mut keys = Vec::with_capacity(items);
    while keys.len() < items {
        let k: u64 = rng.gen();
        let mut v = [0u8; V];
        v[..8].copy_from_slice(&k.to_le_bytes());
        if table.insert(k, &v).is_ok() {
            map.insert(k, v);
            keys.push(k);
        }
    }
    let keys = &keys;
    let n = keys.len();
    let secs = cfg.seconds;

    let ours_lookup = |i: &mut Idx| {
        let mut out = [0u8; V];
        black_box(table.get(keys[i.next(n)], &mut out));
        black_box(&out);
    };
    let map_ref = &map;
    let map_lookup = |i: &mut Idx| {
        let mut out = [0u8; V];
        if let Some(v) = map_ref.get(&keys[i.next(n)]) {
            out = *v;
        }
        black_box(&out);
    };
    let ours_update = |i: &mut Idx| {
        let k = keys[i.next(n)];
        let mut v = [1u8; V];
        v[..8].copy_from_slice(&k.to_le_bytes());
        black_box(table.update(k, &v).ok());
    };

    // Ours and HashMap alternate in short rounds so that load from other processes on
    // a shared machine hits both alike.
    let (lookups, hashmap_lookups) = paired(1, secs, &ours_lookup, &map_lookup);
    let (all_lookups, all_hashmap_lookups) = paired(threads, secs, &ours_lookup, &map_lookup);
    let updates = measure(1, secs, ours_update);
    let all_updates = measure(threads, secs, ours_update);

    let map_bytes = {
        let buckets = (map.capacity() * 8 / 7).next_power_of_two() as f64;
        buckets * (8.0 + V as f64 + 1.0) / n as f64
    };
    let shared = Mutex::new(map);
    let map_update = |i: &mut Idx| {
        let k = keys[i.next(n)];
        let mut g = shared.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = g.get_mut(&k) {
            v[8..].fill(1);
        }
    };
    // Single thread: the mutex is uncontended, so lock it once per batch instead.
    let hashmap_updates = {
        let mut g = shared.lock().unwrap_or_else(|e| e.into_inner());
        let m = &mut *g;
        let dur = Duration::from_secs_f64(secs.max(0.01));
        let mut idx = Idx(0x2545_f491_4f6c_dd1d);
        let start = Instant::now();
        let mut ops = 0u64;
        while start.elapsed() < dur {
            for _ in 0..1024 {
                let k = keys[idx.next(n)];
                if let Some(v) = m.get_mut(&k) {
                    v[8..].fill(1);
                }
            }
            ops += 1024;
        }
        ops as f64 / start.elapsed().as_secs_f64()
    };
    let all_hashmap_updates = measure(threads, secs, map_update);

    StoreBenchReport {
        items: n,
        threads,
        seconds_per_measurement: secs,
        key_size: 8,
        value_size: V,
        lookups_per_s: lookups,
        hashmap_lookups_per_s: hashmap_lookups,
        lookup_ratio: ratio(lookups, hashmap_lookups),
        updates_per_s: updates,
        hashmap_updates_per_s: hashmap_updates,
        update_ratio: ratio(updates, hashmap_updates),
        all_threads_lookups_per_s: all_lookups,
        all_threads_hashmap_lookups_per_s: all_hashmap_lookups,
        all_threads_lookup_ratio: ratio(all_lookups, all_hashmap_lookups),
        all_threads_updates_per_s: all_updates,
        all_threads_hashmap_updates_per_s: all_hashmap_updates,
        all_threads_update_ratio: ratio(all_updates, all_hashmap_updates),
        bytes_per_item_8_40: table.region_bytes() as f64 / n as f64,
        hashmap_bytes_per_item_8_40: map_bytes,
        occupancy_8_40: n as f64 / table.capacity() as f64,
        bytes_per_item_8_8_at_90pct: bytes_8_8(items, cfg.seed),
        raw_bytes_per_item_8_8: 24.0,
        overflow_buckets_used_8_40: table.overflow_used(),
        overflow_buckets_8_40: table.layout().overflow as usize,
    }
}
