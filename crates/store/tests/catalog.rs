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
