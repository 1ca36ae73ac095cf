//! Any sequence of failures and rejoins keeps a placement well formed: every listed
//! replica is a member and listed once, the primary is up to date, a partition has R
//! replicas whenever R members exist, and an up-to-date copy survives every failure
//! that leaves one (the change is refused only when none is left).

use ambidex_cluster::{Placement, PlacementError};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Change {
    Fail(u16),
    Join(u16),
    Sync(u16),
}

fn change(nodes: u16) -> impl Strategy<Value = Change> {
    prop_oneof![
        (0..nodes).prop_map(Change::Fail),
        (0..nodes).prop_map(Change::Join),
        (0..nodes).prop_map(Change::Sync),
    ]
}

fn well_formed(p: &Placement) -> Result<(), String> {
    let members = p.members().count();
    for part in 0..p.partitions() {
        let list = p.replicas_of(part);
        let sync = p.syncing_of(part);
        if list.is_empty() || sync & 1 != 0 {
            return Err(format!("partition {part}: {list:?} syncing {sync:#b}"));
        }
        for (i, &n) in list.iter().enumerate() {
            if !p.is_member(n) || list[..i].contains(&n) {
                return Err(format!(
                    "partition {part}: {list:?} ({n} not a member or twice)"
                ));
            }
        }
        let want = (p.replication() as usize).min(members);
        if list.len() != want {
            return Err(format!(
                "partition {part}: {} replicas, want {want}",
                list.len()
            ));
        }
    }
    Ok(())
}

fn up_to_date(p: &Placement, part: u32) -> Vec<u16> {
    p.up_to_date_of(part).collect()
}

proptest! {
    #[test]
    fn changes_keep_placements_well_formed(
        (nodes, r, changes) in (1u16..11).prop_flat_map(|n| (Just(n), 1..=n.min(ambidex_cluster::placement::MAX_REPLICATION)))
            .prop_flat_map(|(n, r)| (Just(n), Just(r), prop::collection::vec(change(n), 0..24)))
    ) {
        let mut p = Placement::new(nodes, r).unwrap();
        prop_assert!(well_formed(&p).is_ok());
        for c in changes {
            match c {
                Change::Fail(n) if p.is_member(n) => {
                    let lost = (0..p.partitions())
                        .find(|&x| up_to_date(&p, x).iter().all(|&m| m == n));
                    match p.without(1 << n) {
                        Ok(q) => {
                            prop_assert!(lost.is_none(), "partition {:?} lost all copies", lost);
                            for x in 0..p.partitions() {
                                // Every surviving up-to-date copy stays listed, up to date.
                                for m in up_to_date(&p, x).into_iter().filter(|&m| m != n) {
                                    prop_assert!(up_to_date(&q, x).contains(&m));
                                }
                            }
                            p = q;
                        }
                        Err(PlacementError::PartitionLost { .. }) => prop_assert!(lost.is_some()),
                        Err(PlacementError::NoMembers) => prop_assert_eq!(p.members().count(), 1),
                        Err(e) => prop_assert!(false, "{}", e),
                    }
                }
                Change::Join(n) if !p.is_member(n) => p = p.with_member(n).unwrap(),
                Change::Sync(n) => {
                    for x in 0..p.partitions() {
                        p.mark_synced(x, n);
                    }
                }
                _ => {}
            }
            let w = well_formed(&p);
            prop_assert!(w.is_ok(), "{}", w.unwrap_err());
            let s = serde_json::to_string(&p).unwrap();
            prop_assert_eq!(&serde_json::from_str::<Placement>(&s).unwrap(), &p);
        }
    }
}
