//! Location cache micro-benchmark: the lock-free cache (`ambidex_store::LocationCache`)
//! against the previous mutex-per-set implementation (kept here only for comparison), in
//! the same run: get (hit, miss) and insert, 1 and 2 threads, at a size that fits in L2
//! and at 2^21 entries (the largest `NodeDb` creates).
//!
//! `cargo bench -p ambidex-store --bench loc_cache` prints ns/op per thread (the best of
//! `REPS` runs, since the machine is shared) and the ratio old/new.
//! `.../loc_cache callgrind old|new N` does the fill and then N hitting gets at the small
//! size, for `valgrind --tool=callgrind` (instructions per get = difference of two N / N).

use ambidex_store::loc_cache::Loc;
use ambidex_store::LocationCache;
use std::hint::black_box;
use std::sync::Barrier;
use std::time::Instant;

mod old {
    //! The mutex-per-set cache as of c57ac1c (8 ways of 32-byte entries, CLOCK).
    use ambidex_store::loc_cache::Loc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;

    const WAYS: usize = 8;

    #[derive(Clone, Copy)]
    struct Entry {
        table: u32,
        key: u64,
        loc: Loc,
        valid: bool,
        referenced: bool,
    }

    const EMPTY: Entry = Entry {
        table: 0,
        key: 0,
        loc: Loc {
            node: 0,
            region: 0,
            offset: 0,
        },
        valid: false,
        referenced: false,
    };

    struct Set {
        ways: [Entry; WAYS],
        hand: u8,
    }

    pub struct LocationCache {
        sets: Box<[Mutex<Set>]>,
        hits: AtomicU64,
        misses: AtomicU64,
        inserts: AtomicU64,
        evictions: AtomicU64,
    }

    impl LocationCache {
        pub fn new(entries: usize) -> LocationCache {
            let sets = entries.div_ceil(WAYS).max(1);
            LocationCache {
                sets: (0..sets)
                    .map(|_| {
                        Mutex::new(Set {
                            ways: [EMPTY; WAYS],
                            hand: 0,
                        })
                    })
                    .collect(),
                hits: AtomicU64::new(0),
                misses: AtomicU64::new(0),
                inserts: AtomicU64::new(0),
                evictions: AtomicU64::new(0),
            }
        }

        pub fn memory_bytes(&self) -> usize {
            self.sets.len() * std::mem::size_of::<Mutex<Set>>()
        }

        fn set(&self, table: u32, key: u64) -> std::sync::MutexGuard<'_, Set> {
            let h = ambidex_store::layout::hash(key, 0x5bd1_e995 ^ ((table as u64) << 32));
            let i = ((h as u128 * self.sets.len() as u128) >> 64) as usize;
            self.sets[i].lock().unwrap_or_else(|e| e.into_inner())
        }

        pub fn get(&self, table: u32, key: u64) -> Option<Loc> {
            let mut s = self.set(table, key);
            for e in s.ways.iter_mut() {
                if e.valid && e.table == table && e.key == key {
                    e.referenced = true;
                    self.hits.fetch_add(1, Ordering::Relaxed);
                    return Some(e.loc);
                }
            }
            self.misses.fetch_add(1, Ordering::Relaxed);
            None
        }

        pub fn insert(&self, table: u32, key: u64, loc: Loc) {
            self.inserts.fetch_add(1, Ordering::Relaxed);
            let mut s = self.set(table, key);
            let new = Entry {
                table,
                key,
                loc,
                valid: true,
                referenced: false,
            };
            if let Some(e) = s
                .ways
                .iter_mut()
                .find(|e| e.valid && e.table == table && e.key == key)
            {
                *e = Entry {
                    referenced: e.referenced,
                    ..new
                };
                return;
            }
            if let Some(e) = s.ways.iter_mut().find(|e| !e.valid) {
                *e = new;
                return;
            }
            loop {
                let h = s.hand as usize % WAYS;
                s.hand = ((h + 1) % WAYS) as u8;
                let e = &mut s.ways[h];
                if e.referenced {
                    e.referenced = false;
                } else {
                    *e = new;
                    self.evictions.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
        }
    }
}

trait Cache: Sync {
    fn get(&self, table: u32, key: u64) -> Option<Loc>;
    fn insert(&self, table: u32, key: u64, loc: Loc);
    fn memory_bytes(&self) -> usize;
}

impl Cache for old::LocationCache {
    #[inline]
    fn get(&self, table: u32, key: u64) -> Option<Loc> {
        old::LocationCache::get(self, table, key)
    }
    #[inline]
    fn insert(&self, table: u32, key: u64, loc: Loc) {
        old::LocationCache::insert(self, table, key, loc)
    }
    fn memory_bytes(&self) -> usize {
        old::LocationCache::memory_bytes(self)
    }
}

impl Cache for LocationCache {
    #[inline]
    fn get(&self, table: u32, key: u64) -> Option<Loc> {
        LocationCache::get(self, table, key)
    }
    #[inline]
    fn insert(&self, table: u32, key: u64, loc: Loc) {
        LocationCache::insert(self, table, key, loc)
    }
    fn memory_bytes(&self) -> usize {
        LocationCache::memory_bytes(self)
    }
}

const TABLE: u32 = 3;
const REPS: usize = 5;

fn loc_of(key: u64) -> Loc {
    Loc {
        node: (key % 5) as u16,
        region: 1,
        offset: (key & 0xff_ffff) * 64,
    }
}

/// Spreads key ids over u64 (keys are hashed anyway; this only avoids tiny keys).
fn key_of(i: u64) -> u64 {
    i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x1234
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn shuffle(&mut self, v: &mut [u64]) {
        for i in (1..v.len()).rev() {
            let j = (self.next() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
    }
}

/// Inserts key ids 0..n and returns the keys present afterwards.
fn fill<C: Cache>(c: &C, n: u64) -> Vec<u64> {
    for i in 0..n {
        c.insert(TABLE, key_of(i), loc_of(key_of(i)));
    }
    (0..n)
        .map(key_of)
        .filter(|&k| c.get(TABLE, k).is_some())
        .collect()
}

#[derive(Clone, Copy, PartialEq)]
enum Op {
    GetHit,
    GetMiss,
    Insert,
}

/// ns per op per thread: `threads` threads each run `ops` operations over their own
/// shuffled copy of `keys`, started together; the wall time of the slowest.
fn run<C: Cache>(c: &C, keys: &[u64], op: Op, threads: usize, ops: usize) -> f64 {
    let lists: Vec<Vec<u64>> = (0..threads)
        .map(|t| {
            let mut v = keys.to_vec();
            Rng(0x2545_f491_4f6c_dd1d ^ ((t as u64 + 1) * 0x9e37)).shuffle(&mut v);
            v
        })
        .collect();
    let barrier = Barrier::new(threads);
    let times: Vec<f64> = std::thread::scope(|s| {
        let hs: Vec<_> = lists
            .iter()
            .map(|list| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    let t0 = Instant::now();
                    let mut found = 0usize;
                    let mut i = 0;
                    for _ in 0..ops {
                        let k = list[i];
                        i += 1;
                        if i == list.len() {
                            i = 0;
                        }
                        match op {
                            Op::GetHit | Op::GetMiss => {
                                found += black_box(c.get(TABLE, black_box(k))).is_some() as usize
                            }
                            Op::Insert => c.insert(TABLE, k, loc_of(k)),
                        }
                    }
                    let dt = t0.elapsed().as_secs_f64();
                    match op {
                        Op::GetHit => assert_eq!(found, ops, "every key is present"),
                        Op::GetMiss => assert_eq!(found, 0),
                        Op::Insert => {}
                    }
                    dt
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    times.into_iter().fold(0.0, f64::max) * 1e9 / ops as f64
}

/// The best of `REPS` runs each, old and new alternating, so that load from other
/// processes hits both alike.
fn best<O: Cache, N: Cache>(
    (o, ko): (&O, &[u64]),
    (n, kn): (&N, &[u64]),
    op: Op,
    threads: usize,
    ops: usize,
) -> (f64, f64) {
    let (mut to, mut tn) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..REPS {
        to = to.min(run(o, ko, op, threads, ops));
        tn = tn.min(run(n, kn, op, threads, ops));
    }
    (to, tn)
}

fn bench_size(entries: usize, ops: usize) {
    let o = old::LocationCache::new(entries);
    let n = LocationCache::new(entries);
    // Half full: most keys fit their set; the hit lists hold only the keys present.
    let fill_n = entries as u64 / 2;
    let o_hit = fill(&o, fill_n);
    let n_hit = fill(&n, fill_n);
    let miss: Vec<u64> = (0..fill_n).map(|i| key_of(i + (1 << 40))).collect();
    let ins: Vec<u64> = (0..2 * entries as u64)
        .map(|i| key_of(i + (1 << 41)))
        .collect();
    println!(
        "entries {entries}: old {} KiB ({} hit keys), new {} KiB ({} hit keys)",
        Cache::memory_bytes(&o) / 1024,
        o_hit.len(),
        Cache::memory_bytes(&n) / 1024,
        n_hit.len()
    );
    println!(
        "  {:<9} {:>7} {:>10} {:>10} {:>9}",
        "op", "threads", "old ns/op", "new ns/op", "old/new"
    );
    for (name, op) in [
        ("get hit", Op::GetHit),
        ("get miss", Op::GetMiss),
        ("insert", Op::Insert),
    ] {
        for threads in [1, 2] {
            let (ko, kn) = match op {
                Op::GetHit => (&o_hit, &n_hit),
                Op::GetMiss => (&miss, &miss),
                Op::Insert => (&ins, &ins),
            };
            let (to, tn) = best((&o, ko), (&n, kn), op, threads, ops);
            println!(
                "  {name:<9} {threads:>7} {to:>10.1} {tn:>10.1} {:>9.2}",
                to / tn
            );
        }
    }
}

const SMALL: usize = 1 << 14;

fn callgrind(which: &str, gets: usize) {
    let o = old::LocationCache::new(SMALL);
    let n = LocationCache::new(SMALL);
    let (keys, c): (Vec<u64>, &dyn Fn(u64) -> bool) = match which {
        "old" => (fill(&o, SMALL as u64 / 2), &|k| o.get(TABLE, k).is_some()),
        "new" => (fill(&n, SMALL as u64 / 2), &|k| n.get(TABLE, k).is_some()),
        _ => panic!("callgrind old|new N"),
    };
    let mut found = 0;
    for i in 0..gets {
        found += black_box(c(black_box(keys[i % keys.len()]))) as usize;
    }
    println!("{which}: {found} hits of {gets} gets");
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    if args.first().map(String::as_str) == Some("callgrind") {
        let n = args
            .get(2)
            .and_then(|s| s.parse().ok())
            .unwrap_or(1_000_000);
        return callgrind(args.get(1).map(String::as_str).unwrap_or("new"), n);
    }
    println!("location cache: old = mutex per set of 8, new = lock-free line of 3 ways");
    bench_size(SMALL, 4_000_000);
    bench_size(1 << 21, 4_000_000);
}
