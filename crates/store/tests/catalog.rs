//! Table descriptors exchanged between nodes: a table registered on one node is read
//! one-sided by another through a descriptor that travelled as JSON; descriptors that lie
//! about their layout are refused when filed, and wrong or stale keys and regions give
//! an error completion, never a wrong read.

mod common;

use ambidex_store::layout::TableDesc;
use ambidex_store::{
    Catalog, CatalogError, RemoteError, RemoteGet, RemoteReader, Table, TableConfig,
};
use ambidex_transport::local::LocalFabric;
use ambidex_transport::{AccessError, ClusterConfig};
use common::{reader_runtime, run_to_end};

const VS: usize = 16;

/// Node 0's table with keys 0..50 (value = key repeated), and its descriptor as node 1
/// received it.
fn setup() -> (std::sync::Arc<LocalFabric>, Table, TableDesc) {
    let fabric = LocalFabric::new(ClusterConfig::new(2, 1)).unwrap();
    let owner = fabric.node(0);
    let t = Table::create_registered(owner.as_ref(), 7, &TableConfig::new(64, VS)).unwrap();
    for k in 0..50u64 {
        t.insert(k, &[k as u8; VS]).unwrap();
    }
    let wire = serde_json::to_string(&t.desc()).unwrap();
    let got: TableDesc = serde_json::from_str(&wire).unwrap();
    (fabric, t, got)
}

#[test]
fn a_table_is_read_one_sided_through_an_exchanged_descriptor() {
    let (fabric, _t, desc) = setup();
    let mut cat = Catalog::new(2);
    cat.insert(desc).unwrap();
    cat.insert(desc).unwrap(); // the same descriptor twice is harmless
    let d = *cat.get(0, 7).expect("filed");
    assert!(cat.get(1, 7).is_none() && cat.get(0, 8).is_none());

    let reader_node = fabric.node(1);
    let mut rt = reader_runtime(reader_node.as_ref(), 0, 1, d.layout.item_size as usize);
    run_to_end(&mut rt, move |ctx| async move {
        let rd = RemoteReader::new();
        let mut out = vec![0u8; VS];
        for k in [0u64, 13, 49] {
            match rd.get(&ctx, &d, None, k, &mut out).await.unwrap() {
                RemoteGet::Found { .. } => assert_eq!(out, vec![k as u8; VS]),
                RemoteGet::NotFound => panic!("key {k} not found"),
            }
        }
        assert_eq!(
            rd.get(&ctx, &d, None, 50, &mut out).await,
            Ok(RemoteGet::NotFound)
        );
    });
}

#[test]
fn wrong_or_stale_descriptors_fail_never_read_wrong() {
    let (fabric, _t, desc) = setup();
    let reader_node = fabric.node(1);
    let mut rt = reader_runtime(reader_node.as_ref(), 0, 1, desc.layout.item_size as usize);
    let mut stale_key = desc;
    stale_key.region.key ^= 1;
    let mut gone = desc;
    gone.region.id += 100;
    let (reads, stats) = run_to_end(&mut rt, move |ctx| async move {
        let rd = RemoteReader::new();
        let mut out = vec![0u8; VS];
        let reads = [
            rd.get(&ctx, &stale_key, None, 3, &mut out).await,
            rd.get(&ctx, &gone, None, 3, &mut out).await,
        ];
        assert_eq!(out, vec![0u8; VS], "a failed read left data behind");
        (reads, rd.stats())
    });
    assert_eq!(
        reads,
        [
            Err(RemoteError::Access(AccessError::BadKey)),
            Err(RemoteError::Access(AccessError::UnknownRegion))
        ]
    );
    assert_eq!(stats.reads, 0, "no READ succeeded");

    // Descriptors that lie are not filed.
    let mut cat = Catalog::new(2);
    let mut too_long = desc;
    too_long.layout.len = desc.region.len + 64;
    assert!(matches!(
        cat.insert(too_long),
        Err(CatalogError::BadLayout { .. })
    ));
    let mut elsewhere = desc;
    elsewhere.region.node = 5;
    assert!(matches!(
        cat.insert(elsewhere),
        Err(CatalogError::UnknownNode { .. })
    ));
    let mut read_only = desc;
    read_only.region.perms = ambidex_transport::Perms::READ;
    assert!(matches!(
        cat.insert(read_only),
        Err(CatalogError::MissingPerms { .. })
    ));
    cat.insert(desc).unwrap();
    assert!(matches!(
        cat.insert(stale_key),
        Err(CatalogError::Conflict { .. })
    ));
}

#[test]
fn a_catalog_from_another_process_is_checked_as_it_is_read() {
    let (_fabric, _t, desc) = setup();
    let mut cat = Catalog::new(2);
    cat.insert(desc).unwrap();
    let wire = serde_json::to_string(&cat).unwrap();
    let back: Catalog = serde_json::from_str(&wire).unwrap();
    assert_eq!(back, cat);
    // A descriptor whose layout overruns its region, filed under its node by hand.
    let mut v: serde_json::Value = serde_json::from_str(&wire).unwrap();
    let len = desc.region.len + 64;
    v["tables"][0][0]["layout"]["len"] = len.into();
    assert!(serde_json::from_value::<Catalog>(v).is_err());
    // A descriptor filed under another node than its own.
    let mut v: serde_json::Value = serde_json::from_str(&wire).unwrap();
    let d = v["tables"][0][0].clone();
    v["tables"] = serde_json::json!([[], [d]]);
    assert!(serde_json::from_value::<Catalog>(v).is_err());
}

/// A log region descriptor of node `node` with `rings` rings of `ring_bytes`.
fn log_desc(node: u16, rings: u32, ring_bytes: u64) -> ambidex_store::LogRegionDesc {
    ambidex_store::LogRegionDesc {
        region: ambidex_transport::RegionDesc {
            node,
            id: 4,
            len: 64 + rings as u64 * ring_bytes,
            key: 77,
            perms: ambidex_transport::Perms::READ | ambidex_transport::Perms::WRITE,
        },
        base: 64,
        ring_bytes,
        rings,
    }
}

#[test]
fn log_regions_are_checked_when_filed_and_when_read() {
    let mut cat = Catalog::new(2);
    let good = log_desc(1, 4, 1024);
    cat.insert_log(good).unwrap();
    cat.insert_log(good).unwrap(); // the same twice is harmless
    assert_eq!(cat.log_region(1), Some(&good));
    assert_eq!(cat.log_region(0), None);
    assert_eq!(good.ring_offset(3), Some(64 + 3 * 1024));
    assert_eq!(good.ring_offset(4), None);
    let mut other = good;
    other.region.key ^= 1;
    assert!(matches!(
        cat.insert_log(other),
        Err(CatalogError::LogConflict { node: 1 })
    ));
    // Rings that overrun the region, are misaligned or too small, or start inside the
    // superblock; a region without WRITE; a node outside the cluster.
    let mut bad = Vec::new();
    let mut d = good;
    d.region.len -= 1;
    bad.push(d);
    let mut d = good;
    d.ring_bytes = 1000;
    bad.push(d);
    bad.push(log_desc(1, 1, 128));
    let mut d = good;
    d.base = 8;
    bad.push(d);
    let mut d = good;
    d.rings = u32::MAX;
    d.ring_bytes = u64::MAX - 15;
    bad.push(d);
    let mut d = good;
    d.region.perms = ambidex_transport::Perms::READ;
    bad.push(d);
    for d in bad {
        assert!(
            matches!(
                Catalog::new(2).insert_log(d),
                Err(CatalogError::BadLogRegion { node: 1, .. })
            ),
            "{d:?} filed"
        );
    }
    assert!(matches!(
        Catalog::new(2).insert_log(log_desc(2, 1, 1024)),
        Err(CatalogError::UnknownNode { .. })
    ));

    // Across processes: the log regions travel with the tables and are filed again.
    let (_fabric, _t, desc) = setup();
    cat.insert(desc).unwrap();
    let wire = serde_json::to_string(&cat).unwrap();
    let back: Catalog = serde_json::from_str(&wire).unwrap();
    assert_eq!(back, cat);
    assert_eq!(back.log_region(1), Some(&good));
    let mut v: serde_json::Value = serde_json::from_str(&wire).unwrap();
    v["logs"][1]["ring_bytes"] = 1000.into();
    assert!(serde_json::from_value::<Catalog>(v).is_err());
    let mut v: serde_json::Value = serde_json::from_str(&wire).unwrap();
    v["logs"] = serde_json::json!([v["logs"][1].clone(), null]);
    assert!(
        serde_json::from_value::<Catalog>(v).is_err(),
        "a log region filed under another node"
    );
    // A catalog of tables only still reads (without log regions).
    let mut v: serde_json::Value = serde_json::from_str(&wire).unwrap();
    v.as_object_mut().unwrap().remove("logs");
    let tables_only: Catalog = serde_json::from_value(v).unwrap();
    assert_eq!(tables_only.log_region(1), None);
}

/// A restarted node's new descriptors replace its old ones; a bad one leaves the
/// catalog as it was.
#[test]
fn a_restarted_nodes_descriptors_replace_its_old_ones() {
    let (_fabric, _t, desc) = setup();
    let mut cat = Catalog::new(2);
    cat.insert(desc).unwrap();
    cat.insert_log(log_desc(0, 4, 1024)).unwrap();
    let mut new = desc;
    new.region.id += 1;
    new.region.key ^= 0xff;
    assert!(matches!(
        cat.insert(new),
        Err(CatalogError::Conflict { node: 0, table: 7 })
    ));
    let mut new_log = log_desc(0, 4, 1024);
    new_log.region.key = 78;
    cat.replace_node(0, [new], Some(new_log)).unwrap();
    assert_eq!(cat.get(0, 7), Some(&new));
    assert_eq!(cat.log_region(0), Some(&new_log));
    let before = cat.clone();
    let mut bad = new_log;
    bad.ring_bytes = 1000;
    assert!(cat.replace_node(0, [desc], Some(bad)).is_err());
    assert!(cat.replace_node(0, [], Some(log_desc(1, 4, 1024))).is_err());
    assert!(cat.replace_node(2, [], None).is_err());
    assert_eq!(cat, before);
}
