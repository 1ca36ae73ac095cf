//! The ordered index against a BTreeMap model.

use ambidex_store::OrderedIndex;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::ops::Bound;

#[derive(Clone, Debug)]
enum Op {
    Insert(u64, u32),
    InsertNew(u64, u32),
    Remove(u64),
    Get(u64),
    Range(u64, u64, usize, bool),
}

fn op(domain: u64) -> impl Strategy<Value = Op> {
    let k = 0..domain;
    prop_oneof![
        5 => (k.clone(), any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
        1 => (k.clone(), any::<u32>()).prop_map(|(k, v)| Op::InsertNew(k, v)),
        4 => k.clone().prop_map(Op::Remove),
        1 => k.clone().prop_map(Op::Get),
        1 => (k.clone(), k, 0usize..50, any::<bool>()).prop_map(|(a, b, n, r)| Op::Range(a.min(b), a.max(b), n, r)),
    ]
}

fn bound(b: u8, x: u64) -> Bound<u64> {
    match b % 3 {
        0 => Bound::Included(x),
        1 => Bound::Excluded(x),
        _ => Bound::Unbounded,
    }
}

fn in_range(k: u64, lo: Bound<u64>, hi: Bound<u64>) -> bool {
    let above = match lo {
        Bound::Included(x) => k >= x,
        Bound::Excluded(x) => k > x,
        Bound::Unbounded => true,
    };
    let below = match hi {
        Bound::Included(x) => k <= x,
        Bound::Excluded(x) => k < x,
        Bound::Unbounded => true,
    };
    above && below
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn index_matches_model(ops in prop::collection::vec(op(400), 1..1500), bl in any::<u8>(), bh in any::<u8>()) {
        let t = OrderedIndex::new();
        let mut m = BTreeMap::new();
        for op in ops {
            match op {
                Op::Insert(k, v) => prop_assert_eq!(t.insert(k, v), m.insert(k, v)),
                Op::InsertNew(k, v) => {
                    let fresh = !m.contains_key(&k);
                    prop_assert_eq!(t.insert_new(k, v), fresh);
                    if fresh { m.insert(k, v); }
                }
                Op::Remove(k) => prop_assert_eq!(t.remove(k), m.remove(&k)),
                Op::Get(k) => prop_assert_eq!(t.get(k), m.get(&k).copied()),
                Op::Range(a, b, n, rev) => {
                    let (lo, hi) = (bound(bl, a), bound(bh, b));
                    if rev {
                        let want: Vec<(u64, u32)> = m.iter().filter(|(k, _)| in_range(**k, lo, hi)).rev().take(n).map(|(k, v)| (*k, *v)).collect();
                        prop_assert_eq!(t.range_rev(lo, hi, n), want);
                    } else {
                        let want: Vec<(u64, u32)> = m.iter().filter(|(k, _)| in_range(**k, lo, hi)).take(n).map(|(k, v)| (*k, *v)).collect();
                        prop_assert_eq!(t.range(lo, hi, n), want);
                    }
                }
            }
            prop_assert_eq!(t.len(), m.len());
        }
        let all: Vec<(u64, u32)> = m.iter().map(|(k, v)| (*k, *v)).collect();
        prop_assert_eq!(t.range(Bound::Unbounded, Bound::Unbounded, usize::MAX), all.clone());
        let mut rev = all;
        rev.reverse();
        prop_assert_eq!(t.range_rev(Bound::Unbounded, Bound::Unbounded, usize::MAX), rev);
    }
}

#[test]
fn queue_pattern_keeps_scans_short_and_tree_shallow() {
    // TPC-C NEW-ORDER: insert at the right, delete the minimum.
    let t = OrderedIndex::new();
    let mut next_min = 0u64;
    for k in 0..50_000u64 {
        t.insert(k, k);
        if k % 2 == 1 {
            let first = t.range(Bound::Unbounded, Bound::Unbounded, 1);
            assert_eq!(first, vec![(next_min, next_min)]);
            assert_eq!(t.remove(next_min), Some(next_min));
            next_min += 1;
        }
    }
    assert_eq!(t.len(), 25_000);
    assert!(t.depth() <= 5, "depth {}", t.depth());
    for k in next_min..50_000 {
        t.remove(k);
    }
    assert!(t.is_empty());
    assert_eq!(t.depth(), 1);
    assert_eq!(t.range(Bound::Unbounded, Bound::Unbounded, 10), vec![]);
}

#[test]
fn concurrent_readers_and_writers() {
    let t = OrderedIndex::new();
    std::thread::scope(|s| {
        for w in 0..2u64 {
            let t = &t;
            s.spawn(move || {
                for i in 0..20_000u64 {
                    let k = i * 2 + w;
                    t.insert(k, k);
                    if i % 3 == 0 {
                        assert_eq!(t.remove(k), Some(k));
                    }
                }
            });
        }
        let t = &t;
        s.spawn(move || {
            for i in 0..2_000u64 {
                // Every scan is a consistent ascending snapshot of values equal to keys.
                let r = t.range(Bound::Included(i * 10), Bound::Unbounded, 20);
                assert!(r.windows(2).all(|w| w[0].0 < w[1].0));
                assert!(r.iter().all(|(k, v)| k == v && *k >= i * 10));
            }
        });
    });
    let n = (0..20_000u64).filter(|i| i % 3 != 0).count() * 2;
    assert_eq!(t.len(), n);
}
