//! A backup's versioned apply: writes of one key reaching a backup in any order leave
//! the copy at the newest one, with the primary's version.
use ambidex_store::{Table, TableConfig};
use proptest::prelude::*;

fn table() -> Table {
    Table::create_anonymous(7, &TableConfig::new(64, 24)).unwrap()
}

fn val(seed: u8) -> Vec<u8> {
    vec![seed; 24]
}

#[test]
fn newer_applies_older_and_equal_are_skipped() {
    let t = table();
    // Absent: inserted at the given version.
    assert_eq!(t.apply_versioned(5, &val(1), 7), Ok(true));
    let mut out = vec![0u8; 24];
    assert_eq!(t.get(5, &mut out), Some(7));
    assert_eq!(out, val(1));
    assert_eq!(t.apply_versioned(5, &val(2), 5), Ok(false));
    assert_eq!(t.apply_versioned(5, &val(3), 7), Ok(false));
    assert_eq!(t.get(5, &mut out), Some(7));
    assert_eq!(out, val(1));
    assert_eq!(t.apply_versioned(5, &val(4), 9), Ok(true));
    assert_eq!(t.get(5, &mut out), Some(9));
    assert_eq!(out, val(4));
    assert_eq!(t.len(), 1);
}

#[test]
fn versions_of_absent_items_are_refused() {
    let t = table();
    // Even versions name a free item; bits above the mask are lock bits.
    assert!(t.apply_versioned(5, &val(1), 8).is_err());
    assert!(t.apply_versioned(5, &val(1), 1 << 63 | 9).is_err());
    assert!(t.apply_versioned(5, &[0u8; 3], 9).is_err());
    assert_eq!(t.len(), 0);
}

proptest! {
    /// Any delivery order of a key's writes ends at the last one.
    #[test]
    fn any_order_ends_at_the_newest(order in Just((0..12u8).collect::<Vec<_>>()).prop_shuffle(),
                                    dup in proptest::collection::vec(0..12usize, 0..6)) {
        let t = table();
        let mut writes: Vec<u8> = order.clone();
        writes.extend(dup.iter().map(|&i| order[i]));
        for w in writes {
            t.apply_versioned(1, &val(w), 1 + 2 * w as u64).unwrap();
        }
        let mut out = vec![0u8; 24];
        prop_assert_eq!(t.get(1, &mut out), Some(1 + 2 * 11));
        prop_assert_eq!(out, val(11));
    }
}

/// A scan by item number finds every present key once, in any number of steps, and
/// a copy made from it by versioned apply equals the table.
#[test]
fn keys_from_lists_every_present_key_once() {
    let t = table();
    for k in 0..40u64 {
        t.insert(k * 3, &val(k as u8)).unwrap();
    }
    t.delete(9).unwrap();
    let mut keys = Vec::new();
    let mut from = 1;
    while let Some(next) = t.keys_from(from, 7, &mut keys) {
        assert!(next > from);
        from = next;
    }
    keys.sort_unstable();
    let all: Vec<u64> = (0..40u64).map(|k| k * 3).filter(|&k| k != 9).collect();
    assert_eq!(keys, all);
    let copy = table();
    let mut out = vec![0u8; 24];
    for &k in &keys {
        let v = t.get(k, &mut out).unwrap();
        assert_eq!(copy.apply_versioned(k, &out, v), Ok(true));
    }
    let dump = |t: &Table| {
        let mut d = Vec::new();
        t.for_each(|k, v| d.push((k, v.to_vec())));
        d.sort();
        d
    };
    assert_eq!(dump(&copy), dump(&t));
}
