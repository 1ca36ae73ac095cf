//! The encoding of the exchange (round trips, untrusted answers), its paging, and the
//! exchange itself between in-process nodes: the catalog it builds passes the start-up
//! check, a silent node is named, and a corrupted key is caught by the check.

use super::*;
use crate::runner::{self, RunSpec, Worker, WorkerCtx};
use crate::{StartupCheckError, TableSpec};
use ambidex_cluster::Placement;
use ambidex_transport::local::LocalFabric;
use ambidex_transport::{ClusterConfig, SharedNode};
use std::sync::Arc;

fn specs(tables: u32) -> Vec<TableSpec> {
    (1..=tables)
        .map(|id| TableSpec {
            id,
            name: format!("t{id}"),
            value_size: 8 * id as usize,
            capacity_per_node: 64,
        })
        .collect()
}

/// `nodes` nodes of one thread on the local fabric, each with `tables` tables.
fn cluster(nodes: u16, tables: u32) -> (Arc<LocalFabric>, Vec<SharedNode>, Vec<Arc<NodeDb>>) {
    let f = LocalFabric::new(ClusterConfig::new(nodes, 1)).unwrap();
    let placement = Placement::new(nodes, nodes.min(2)).unwrap();
    let ns = f.nodes();
    let dbs = ns
        .iter()
        .map(|n| NodeDb::new(&**n, placement.clone(), &specs(tables)).unwrap())
        .collect();
    (f, ns, dbs)
}

/// The answer of `db` to a request from `first` within `max_bytes`.
fn answer_of(db: &NodeDb, first: u16, max_bytes: u32) -> Vec<u8> {
    let mut out = Vec::new();
    answer(
        db,
        usize::MAX,
        &DescriptorsReq { first, max_bytes }.encode(),
        &mut out,
    );
    out
}

#[test]
fn requests_round_trip_and_bad_ones_are_refused() {
    let q = DescriptorsReq {
        first: 7,
        max_bytes: 65_536,
    };
    let b = q.encode();
    assert_eq!(DescriptorsReq::decode(&b), Ok(q));
    assert_eq!(DescriptorsReq::decode(&b[..6]), Err(DecodeError::Truncated));
    let mut long = b.to_vec();
    long.push(0);
    assert_eq!(
        DescriptorsReq::decode(&long),
        Err(DecodeError::TrailingBytes)
    );
    let mut v2 = b;
    v2[0] = VERSION + 1;
    assert!(DescriptorsReq::decode(&v2).is_err());
    // The handler answers a bad request with the bare BadRequest, and counts it.
    let (_f, _, dbs) = cluster(2, 1);
    let mut out = Vec::new();
    answer(&dbs[0], usize::MAX, &v2, &mut out);
    assert_eq!(out, [Status::BadRequest as u8]);
    assert_eq!(
        DescriptorsPage::decode(&out),
        Err(DescriptorsDecodeError::Refused(Status::BadRequest as u8))
    );
    assert_eq!(
        dbs[0]
            .bad_requests
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[test]
fn an_answer_round_trips() {
    let (_f, _, dbs) = cluster(2, 3);
    let b = answer_of(&dbs[1], 0, 65_536);
    assert_eq!(b.len(), PAGE_HEAD_BYTES + 3 * TABLE_DESC_BYTES);
    let page = DescriptorsPage::decode(&b).unwrap();
    assert_eq!(page.nodes, 2);
    assert_eq!((page.first, page.total), (0, 3));
    assert_eq!(page.tables, dbs[1].table_descs());
    assert_eq!(page.log, dbs[1].log_region_desc());
}

#[test]
fn truncated_trailing_and_foreign_answers_are_errors_not_panics() {
    let (_f, _, dbs) = cluster(2, 2);
    let b = answer_of(&dbs[1], 0, 65_536);
    for len in 0..b.len() {
        assert!(
            DescriptorsPage::decode(&b[..len]).is_err(),
            "a prefix of {len} bytes decoded"
        );
    }
    let mut long = b.clone();
    long.extend_from_slice(&[0, 0, 0]);
    assert_eq!(
        DescriptorsPage::decode(&long),
        Err(DescriptorsDecodeError::TrailingBytes(3))
    );
    let mut v = b.clone();
    v[1] = 9;
    assert_eq!(
        DescriptorsPage::decode(&v),
        Err(DescriptorsDecodeError::Version {
            found: 9,
            want: VERSION
        })
    );
    let mut perms = b.clone();
    // The log region's permission byte: after the 10-byte head, node, id, len, key.
    perms[10 + 2 + 4 + 8 + 8] = 0x80 | Perms::ALL.0;
    assert_eq!(
        DescriptorsPage::decode(&perms),
        Err(DescriptorsDecodeError::BadPerms(0x87))
    );
}

/// Counts of the head (total at 4, first at 6, n at 8) that do not match the bytes.
#[test]
fn absurd_counts_are_errors_before_anything_is_allocated() {
    let (_f, _, dbs) = cluster(2, 2);
    let b = answer_of(&dbs[1], 0, 65_536);
    let with = |at: usize, v: u16| {
        let mut c = b.clone();
        c[at..at + 2].copy_from_slice(&v.to_le_bytes());
        DescriptorsPage::decode(&c)
    };
    assert_eq!(
        with(4, u16::MAX),
        Err(DescriptorsDecodeError::TooManyTables {
            total: u16::MAX,
            max: MAX_TABLES
        })
    );
    // More descriptors than tables.
    assert_eq!(
        with(8, 3),
        Err(DescriptorsDecodeError::BadRange {
            first: 0,
            n: 3,
            total: 2
        })
    );
    // More descriptors than bytes (with a total that allows them).
    let mut c = b.clone();
    c[4..6].copy_from_slice(&1000u16.to_le_bytes());
    c[8..10].copy_from_slice(&1000u16.to_le_bytes());
    assert_eq!(
        DescriptorsPage::decode(&c),
        Err(DescriptorsDecodeError::Truncated)
    );
    // Fewer than the bytes hold.
    assert_eq!(
        with(8, 1),
        Err(DescriptorsDecodeError::TrailingBytes(TABLE_DESC_BYTES))
    );
}

/// Every single-byte change of an answer either decodes or is an error, never a
/// panic; and whatever decodes is then checked by the catalog or the page's asker.
#[test]
fn any_corrupted_answer_is_handled() {
    let (_f, _, dbs) = cluster(3, 2);
    let b = answer_of(&dbs[1], 0, 65_536);
    for i in 0..b.len() {
        for x in [0x01u8, 0x80, 0xff] {
            let mut c = b.clone();
            c[i] ^= x;
            if let Ok(page) = DescriptorsPage::decode(&c) {
                let mut p = PeerAnswers::new(1, 65_536);
                if p.take(0, 3, page).is_ok() {
                    let mut cat = Catalog::new(3);
                    let _ = p.file(0, &mut cat);
                }
            }
        }
    }
}

#[test]
fn descriptors_that_do_not_fit_one_message_come_in_pages() {
    let (_f, _, dbs) = cluster(2, 12);
    let all = dbs[1].table_descs();
    // Room for 5 descriptors per page.
    let max = (PAGE_HEAD_BYTES + 5 * TABLE_DESC_BYTES + 10) as u32;
    let mut p = PeerAnswers::new(1, max);
    let mut pages = 0;
    while !p.complete() {
        let q = p.request();
        let b = answer_of(&dbs[1], q.first, q.max_bytes);
        assert!(b.len() <= max as usize);
        p.take(0, 2, DescriptorsPage::decode(&b).unwrap()).unwrap();
        pages += 1;
    }
    assert_eq!(pages, 3, "5 + 5 + 2");
    assert_eq!(p.tables, all);
    // The answering runtime's own limit counts too.
    let mut out = Vec::new();
    let q = DescriptorsReq {
        first: 0,
        max_bytes: u32::MAX,
    };
    answer(&dbs[1], max as usize, &q.encode(), &mut out);
    assert_eq!(DescriptorsPage::decode(&out).unwrap().tables.len(), 5);
    // A page too small for one descriptor makes no progress: an error, not a loop.
    let mut p = PeerAnswers::new(1, PAGE_HEAD_BYTES as u32);
    let b = answer_of(&dbs[1], 0, p.max_bytes);
    assert!(matches!(
        p.take(0, 2, DescriptorsPage::decode(&b).unwrap()),
        Err(CatalogExchangeError::Inconsistent { .. })
    ));
}

#[test]
fn answers_that_do_not_fit_the_asker_are_refused() {
    let (_f, _, dbs) = cluster(3, 12);
    let page = |db: &NodeDb, first| DescriptorsPage::decode(&answer_of(db, first, 1000)).unwrap();
    let take = |peer, nodes, pg| PeerAnswers::new(peer, 1000).take(0, nodes, pg);
    let why = |r: Result<(), CatalogExchangeError>| match r {
        Err(CatalogExchangeError::Inconsistent { why, .. }) => why,
        r => panic!("{r:?}"),
    };
    assert!(take(1, 3, page(&dbs[1], 0)).is_ok());
    assert!(why(take(1, 4, page(&dbs[1], 0))).contains("another size"));
    // Node 2's answer taken for node 1's.
    assert!(why(take(1, 3, page(&dbs[2], 0))).contains("another node"));
    assert!(why(take(1, 3, page(&dbs[1], 3))).contains("where it was asked"));
    let mut p = PeerAnswers::new(1, 1000);
    p.take(0, 3, page(&dbs[1], 0)).unwrap();
    let mut other = page(&dbs[1], p.request().first);
    other.total -= 1;
    assert!(why(p.take(0, 3, other)).contains("disagree"));
}

/// Workers that return once their node's start-up check has an outcome (at once on a
/// node that runs none).
fn wait_for_checks(dbs: &[Arc<NodeDb>]) -> Worker {
    let dbs = dbs.to_vec();
    Arc::new(move |w: WorkerCtx| {
        let db = dbs[w.node as usize].clone();
        Box::pin(async move {
            while db.checks_at_start() && db.verification().is_none() {
                w.ctx.pause().await;
            }
        })
    })
}

fn spec() -> RunSpec {
    RunSpec {
        coroutines: 1,
        ..Default::default()
    }
}

#[test]
fn nodes_without_a_launcher_get_the_catalog_from_each_other() {
    let (_f, ns, dbs) = cluster(3, 3);
    for db in &dbs {
        db.fetch_catalog_at_start(Duration::from_secs(20)).unwrap();
    }
    let r = runner::run(&ns, &dbs, &spec(), wait_for_checks(&dbs)).unwrap();
    assert_eq!(r.remote_tables_verified, 3 * 2 * 3);
    let want = NodeDb::catalog_of(&dbs).unwrap();
    for db in &dbs {
        assert_eq!(db.remote_tables_verified(), Ok(6));
        assert_eq!(*db.catalog().unwrap(), want);
    }
}

#[test]
fn a_node_that_never_answers_is_named() {
    let (_f, ns, dbs) = cluster(3, 1);
    dbs[0]
        .fetch_catalog_at_start(Duration::from_millis(300))
        .unwrap();
    let mut spec = spec();
    spec.rpc.give_up = Duration::from_millis(200);
    // Node 1 runs (and answers), node 2 never starts.
    let r = runner::run(&ns[..2], &dbs[..2], &spec, wait_for_checks(&dbs[..2]));
    assert!(r.is_err(), "the run's end reports node 0's failed exchange");
    match dbs[0].verification() {
        Some(Err(StartupCheckError::CatalogExchange(CatalogExchangeError::NoAnswer {
            node: 0,
            missing,
            after,
        }))) => {
            assert_eq!(missing, vec![2]);
            assert!(after >= Duration::from_millis(300), "{after:?}");
        }
        v => panic!("{v:?}"),
    }
    assert!(dbs[0].catalog().is_none());
}

/// The planted bug: one access key corrupted in node 1's encoded answer to node 0. The
/// answer decodes and the catalog takes it (a key cannot be checked there), but node
/// 0's start-up check READs node 1's table with it and fails, naming the table.
#[test]
fn a_corrupted_key_in_an_answer_fails_the_start_up_check() {
    let (_f, ns, dbs) = cluster(3, 2);
    let good = NodeDb::catalog_of(&dbs).unwrap();
    for db in &dbs[1..] {
        db.set_catalog(good.clone()).unwrap();
    }
    let mut cat = Catalog::new(3);
    cat.extend(dbs[0].table_descs()).unwrap();
    cat.insert_log(dbs[0].log_region_desc()).unwrap();
    for peer in 1..3u16 {
        let mut b = answer_of(&dbs[peer as usize], 0, 65_536);
        if peer == 1 {
            // The first table's key: after the head, table id, node, region id, len.
            b[PAGE_HEAD_BYTES + 4 + 2 + 4 + 8] ^= 0x10;
        }
        let mut p = PeerAnswers::new(peer, 65_536);
        p.take(0, 3, DescriptorsPage::decode(&b).unwrap()).unwrap();
        p.file(0, &mut cat).unwrap();
    }
    dbs[0].set_catalog(cat).unwrap();
    let r = runner::run(&ns, &dbs, &spec(), wait_for_checks(&dbs));
    assert!(r.is_err());
    match dbs[0].verification() {
        Some(Err(StartupCheckError::TableRead {
            node: 0,
            owner: 1,
            table: 1,
            ..
        })) => {}
        v => panic!("{v:?}"),
    }
    assert_eq!(dbs[1].remote_tables_verified(), Ok(4));
}
