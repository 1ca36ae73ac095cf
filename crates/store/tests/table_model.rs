//! The hash table against a BTreeMap model, with tiny bucket counts so that overflow
//! chains, slot reuse and item reuse are exercised.
use ambidex_store::{Header, LockOwner};

/// The lock owner of this test's local lockers.
const OWNER: LockOwner = LockOwner {
    node: 0,
    thread: 1,
    slot: 2,
};
/// Another transaction of the same thread.
const OTHER: LockOwner = LockOwner {
    node: 0,
    thread: 1,
    slot: 3,
};

use ambidex_store::layout::{check_image, ItemCheck, ItemShape};
use ambidex_store::{ReadOutcome, StoreError, Table, TableConfig};
use proptest::prelude::*;
use std::collections::BTreeMap;

fn key(i: u64) -> u64 {
    match i {
        0 => 0,
        1 => u64::MAX,
        _ => i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
    }
}

fn value(vs: usize, seed: u8, k: u64) -> Vec<u8> {
    (0..vs).map(|i| seed ^ (i as u8) ^ (k as u8)).collect()
}

#[derive(Clone, Debug)]
enum Op {
    Insert(u64, u8),
    Update(u64, u8),
    Delete(u64),
    Get(u64),
    LockWrite(u64, u8, bool),
}

fn op() -> impl Strategy<Value = Op> {
    let k = 0u64..40;
    prop_oneof![
        3 => (k.clone(), any::<u8>()).prop_map(|(k, s)| Op::Insert(key(k), s)),
        2 => (k.clone(), any::<u8>()).prop_map(|(k, s)| Op::Update(key(k), s)),
        2 => k.clone().prop_map(|k| Op::Delete(key(k))),
        2 => k.clone().prop_map(|k| Op::Get(key(k))),
        1 => (k, any::<u8>(), any::<bool>()).prop_map(|(k, s, c)| Op::LockWrite(key(k), s, c)),
    ]
}

fn check_get(
    t: &Table,
    model: &BTreeMap<u64, (Vec<u8>, u64)>,
    k: u64,
) -> Result<(), TestCaseError> {
    let mut out = vec![0u8; t.value_size()];
    match (t.try_get(k, &mut out), model.get(&k)) {
        (ReadOutcome::Found { version }, Some((v, mv))) => {
            prop_assert_eq!(&out, v);
            prop_assert_eq!(version, *mv);
            prop_assert_eq!(version & 1, 1);
            // The image a remote READ would get passes the one-sided check too.
            let lk = t.locate_item(k).unwrap().0;
            let shape = ItemShape::new(t.layout());
            let mut img = vec![0u8; shape.item_size];
            prop_assert!(t.memory().read(lk, &mut img));
            let mut rout = vec![0u8; t.value_size()];
            prop_assert_eq!(
                check_image(&shape, &img, k, &mut rout),
                ItemCheck::Ok(version)
            );
            prop_assert_eq!(&rout, v);
            prop_assert_eq!(check_image(&shape, &img, k ^ 1, &mut rout), ItemCheck::Miss);
        }
        (ReadOutcome::NotFound, None) => {}
        (got, want) => prop_assert!(false, "key {k}: got {got:?}, model {want:?}"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]
    #[test]
    fn table_matches_model(
        ops in prop::collection::vec(op(), 1..250),
        vs in prop::sample::select(vec![0usize, 5, 8, 40, 41, 100]),
        buckets in 1usize..4,
        seed in any::<u64>(),
    ) {
        let cfg = TableConfig { capacity: 48, value_size: vs, buckets: Some(buckets), overflow: Some(16), seed };
        let t = Table::create_anonymous(1, &cfg).unwrap();
        let mut model: BTreeMap<u64, (Vec<u8>, u64)> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Insert(k, s) => {
                    let v = value(vs, s, k);
                    match (t.insert(k, &v), model.contains_key(&k)) {
                        (Ok(ver), false) => { model.insert(k, (v, ver)); }
                        (Err(StoreError::Exists), true) => {}
                        (r, present) => prop_assert!(false, "insert {k}: {r:?}, present {present}"),
                    }
                }
                Op::Update(k, s) => {
                    let v = value(vs, s, k);
                    match (t.update(k, &v), model.get_mut(&k)) {
                        (Ok(ver), Some(e)) => {
                            prop_assert!(ver > e.1);
                            *e = (v, ver);
                        }
                        (Err(StoreError::NotFound), None) => {}
                        (r, m) => prop_assert!(false, "update {k}: {r:?}, model {m:?}"),
                    }
                }
                Op::Delete(k) => {
                    match (t.delete(k), model.remove(&k)) {
                        (Ok(()), Some(_)) | (Err(StoreError::NotFound), None) => {}
                        (r, m) => prop_assert!(false, "delete {k}: {r:?}, model {m:?}"),
                    }
                }
                Op::Get(_) => {}
                Op::LockWrite(k, s, commit) => {
                    match (t.try_lock(k, OWNER), model.get_mut(&k)) {
                        (Ok(lk), Some(e)) => {
                            prop_assert_eq!(lk.version, e.1);
                            let mut out = vec![0u8; vs];
                            let mut buf = vec![0u8; vs];
                            prop_assert_eq!(t.try_get(k, &mut out), ReadOutcome::Locked);
                            // The lock word names its owner; a second locker is refused.
                            prop_assert_eq!(
                                t.header(k),
                                Some(Header { owner: Some(OWNER), version: e.1 })
                            );
                            prop_assert!(t.holds_lock(&lk, k));
                            prop_assert_eq!(t.try_lock(k, OTHER), Err(StoreError::Locked));
                            t.read_locked(&lk, &mut buf).unwrap();
                            prop_assert_eq!(&buf, &e.0);
                            if commit {
                                let v = value(vs, s, k);
                                t.write_locked(&lk, &v).unwrap();
                                let nv = t.unlock(lk, true);
                                prop_assert!(nv > e.1);
                                *e = (v, nv);
                            } else {
                                prop_assert_eq!(t.unlock(lk, false), e.1);
                            }
                            prop_assert_eq!(t.header(k).and_then(|h| h.owner), None);
                            prop_assert!(!t.holds_lock(&lk, k));
                        }
                        (Err(StoreError::NotFound), None) => {}
                        (r, m) => prop_assert!(false, "lock {k}: {r:?}, model {m:?}"),
                    }
                }
            }
            let k = match op { Op::Insert(k, _) | Op::Update(k, _) | Op::Delete(k) | Op::Get(k) | Op::LockWrite(k, _, _) => k };
            check_get(&t, &model, k)?;
            prop_assert_eq!(t.len(), model.len());
        }
        for i in 0..40 {
            check_get(&t, &model, key(i))?;
        }
    }
}

#[test]
fn full_table_reports_full_and_stays_consistent() {
    let cfg = TableConfig::new(20, 8);
    let t = Table::create_anonymous(1, &cfg).unwrap();
    let mut ok = Vec::new();
    let mut full = 0;
    for k in 0..40u64 {
        match t.insert(k, &k.to_le_bytes()) {
            Ok(_) => ok.push(k),
            Err(StoreError::Full) => full += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(ok.len(), 20);
    assert_eq!(full, 20);
    // A transaction's insert refused is the caller's abort, not counted; a versioned
    // apply (committed data at a backup) refused is.
    assert_eq!(t.full_refusals(), 0);
    assert_eq!(t.apply_versioned(500, &[5; 8], 3), Err(StoreError::Full));
    assert_eq!(t.full_refusals(), 1, "a refused apply is counted");
    let mut out = [0u8; 8];
    for &k in &ok {
        assert!(t.get(k, &mut out).is_some());
        assert_eq!(out, k.to_le_bytes());
    }
    // Deleting frees an item for the next insert.
    t.delete(ok[3]).unwrap();
    assert!(t.insert(100, &[1; 8]).is_ok());
    assert_eq!(t.insert(101, &[1; 8]), Err(StoreError::Full));
    assert_eq!(
        t.insert(102, &[1; 7]),
        Err(StoreError::BadValueLen { got: 7, want: 8 })
    );
}

#[test]
fn memory_at_90_percent_is_under_48_bytes_per_item() {
    let cap = 200_000;
    let t = Table::create_anonymous(1, &TableConfig::new(cap, 8)).unwrap();
    let n = cap * 9 / 10;
    for k in 0..n as u64 {
        t.insert(k.wrapping_mul(0x2545_f491_4f6c_dd1d), &[1; 8])
            .unwrap();
    }
    let per_item = t.region_bytes() as f64 / n as f64;
    assert!(per_item <= 48.0, "{per_item} bytes per item");
    // The whole capacity must fit too (overflow buckets are sized for it).
    for k in n as u64..cap as u64 {
        t.insert(k.wrapping_mul(0x2545_f491_4f6c_dd1d), &[1; 8])
            .unwrap();
    }
}
