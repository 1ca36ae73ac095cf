//! The DSG checker on hand-built histories with known answers.

mod common;

use ambidex_history::{check, Anomaly, EdgeKind, TxnRecord};
use common::{h, known, txn, INIT};

fn anomalies(recs: &[TxnRecord]) -> Vec<Anomaly> {
    check(recs).anomalies.keys().copied().collect()
}

#[test]
fn serializable_histories_pass() {
    for (name, recs) in [
        ("rmw chain", known::serializable()),
        ("insert/delete", known::serializable_insert_delete()),
        ("empty", vec![]),
    ] {
        let rep = check(&recs);
        assert!(rep.valid, "{name}: {}", rep.summary());
        assert_eq!(rep.cyclic_components, 0);
    }
    // The rmw chain has each kind of edge, so the graph really was built.
    let rep = check(&known::serializable());
    assert!(
        rep.edges.ww > 0 && rep.edges.wr > 0 && rep.edges.rw > 0,
        "{:?}",
        rep.edges
    );
}

#[test]
fn lost_update() {
    let rep = check(&known::lost_update());
    assert_eq!(
        anomalies(&known::lost_update()),
        vec![Anomaly::GSingle, Anomaly::LostUpdate],
        "{}",
        rep.summary()
    );
    // The witness: T101 -rw-> T100 (it missed 100's write) -ww-> T101.
    let w = rep.witness(Anomaly::GSingle).unwrap();
    let mut kinds: Vec<_> = w.edges.iter().map(|e| (e.from, e.to, e.kind)).collect();
    kinds.sort_by_key(|e| e.0);
    assert_eq!(
        kinds,
        vec![(100, 101, EdgeKind::Ww), (101, 100, EdgeKind::Rw)]
    );
}

#[test]
fn lost_update_forked_chain() {
    let rep = check(&known::lost_update_forked());
    // Both read INIT and both overwrote it: the chain forks, and each
    // anti-depends on the other (two rw edges).
    assert_eq!(
        anomalies(&known::lost_update_forked()),
        vec![Anomaly::G2, Anomaly::ForkedChain],
        "{}",
        rep.summary()
    );
}

#[test]
fn write_skew_is_g2() {
    let rep = check(&known::write_skew());
    assert_eq!(
        anomalies(&known::write_skew()),
        vec![Anomaly::G2],
        "{}",
        rep.summary()
    );
    let w = rep.witness(Anomaly::G2).unwrap();
    assert_eq!(w.edges.len(), 2);
    assert!(w.edges.iter().all(|e| e.kind == EdgeKind::Rw));
}

#[test]
fn read_skew_is_g_single() {
    let rep = check(&known::read_skew());
    assert_eq!(
        anomalies(&known::read_skew()),
        vec![Anomaly::GSingle],
        "{}",
        rep.summary()
    );
    let w = rep.witness(Anomaly::GSingle).unwrap();
    assert_eq!(w.edges.iter().filter(|e| e.kind == EdgeKind::Rw).count(), 1);
    assert_eq!(w.edges.iter().filter(|e| e.kind == EdgeKind::Wr).count(), 1);
}

#[test]
fn g0_g1c_g1a() {
    assert_eq!(anomalies(&known::g0()), vec![Anomaly::G0]);
    assert_eq!(anomalies(&known::g1c()), vec![Anomaly::G1c]);
    let rep = check(&known::g1a());
    assert_eq!(
        anomalies(&known::g1a()),
        vec![Anomaly::G1a],
        "{}",
        rep.summary()
    );
    assert_eq!(rep.witness(Anomaly::G1a).unwrap().txns, vec![101, 100]);
}

#[test]
fn absent_read_anti_depends_on_first_insert() {
    let rep = check(&known::missed_insert());
    assert_eq!(
        anomalies(&known::missed_insert()),
        vec![Anomaly::GSingle],
        "{}",
        rep.summary()
    );
}

#[test]
fn g0_is_reported_over_weaker_cycles_in_one_component() {
    // The G0 pair also has rw edges to a third transaction in the same
    // component; the component is counted once, as G0.
    let recs = h(vec![
        txn(100).w(1, INIT).w(2, 101).r(3, INIT),
        txn(101).w(1, 100).w(2, INIT),
        txn(102).r(1, 101).w(3, INIT),
    ]);
    let rep = check(&recs);
    assert_eq!(rep.cyclic_components, 1, "{}", rep.summary());
    assert_eq!(
        rep.anomalies.keys().copied().collect::<Vec<_>>(),
        vec![Anomaly::G0]
    );
}

#[test]
fn structural_errors() {
    // Same version, two values.
    let mut recs = h(vec![txn(100).r(1, INIT).w(1, INIT), txn(101).r(1, 100)]);
    recs[1].reads[0].value = Some("ff".into());
    assert_eq!(anomalies(&recs), vec![Anomaly::ValueMismatch]);

    // Two different never-written versions of one key.
    let recs = h(vec![txn(100).r(1, INIT), txn(101).r(1, 7)]);
    assert_eq!(anomalies(&recs), vec![Anomaly::ConflictingInitialVersions]);

    // A committed write over an aborted transaction's version.
    let recs = h(vec![txn(100).w(1, INIT).abort(), txn(101).w(1, 100)]);
    assert_eq!(anomalies(&recs), vec![Anomaly::DirtyOverwrite]);

    // Duplicate transaction ids.
    let recs = h(vec![txn(100).r(1, INIT), txn(100).r(2, INIT)]);
    assert_eq!(anomalies(&recs), vec![Anomaly::DuplicateId]);

    // One transaction writing a key twice.
    let recs = h(vec![txn(100).w(1, INIT).w(1, INIT)]);
    assert_eq!(anomalies(&recs), vec![Anomaly::DuplicateWrite]);
}

#[test]
fn aborted_transactions_are_not_checked_but_warned() {
    // Aborted T101 saw an inconsistent snapshot (read skew) and aborted
    // T100's write: neither is an error, the second is a warning.
    let recs = h(vec![
        txn(100).r(1, INIT).w(1, INIT).abort(),
        txn(102).r(1, INIT).r(2, INIT).w(1, INIT).w(2, INIT),
        txn(101).r(1, 100).r(2, 102).abort(),
    ]);
    let rep = check(&recs);
    assert!(rep.valid, "{}", rep.summary());
    assert_eq!(rep.warnings.len(), 1);
}

#[test]
fn record_order_does_not_matter() {
    let mut recs = known::read_skew();
    recs.reverse();
    assert_eq!(anomalies(&recs), vec![Anomaly::GSingle]);
}

#[test]
fn report_serializes_and_summarizes() {
    let rep = check(&known::write_skew());
    let json = serde_json::to_string(&rep).unwrap();
    assert!(json.contains("\"G2\":1"), "{json}");
    let back: ambidex_history::CheckReport = serde_json::from_str(&json).unwrap();
    assert_eq!(back, rep);
    let s = rep.summary();
    assert!(s.contains("NOT serializable: 1 G2"), "{s}");
    assert!(
        s.contains("T100 -rw-> T101") || s.contains("T101 -rw-> T100"),
        "{s}"
    );
}

#[test]
fn check_file_reports_parse_errors_and_results() {
    let dir = std::env::temp_dir().join(format!("ambidex-history-dsg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.jsonl");
    let lines: Vec<String> = known::read_skew()
        .iter()
        .map(ambidex_history::format::to_line)
        .collect();
    std::fs::write(&good, lines.join("\n")).unwrap();
    let rep = ambidex_history::check_file(&good).unwrap();
    assert!(rep.has(Anomaly::GSingle));
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, format!("{}\n{{\"id\":1}}\n", lines[0])).unwrap();
    let err = ambidex_history::check_file(&bad).unwrap_err();
    assert!(err.to_string().contains("line 2"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A transaction of unknown outcome (its coordinator died) is committed if another
/// transaction saw one of its writes, aborted otherwise: either way the history checks.
#[test]
fn unknown_outcomes_are_committed_if_seen() {
    use ambidex_history::{resolve_unknown, Outcome};
    let unknown = |t: common::T| {
        let mut r = t.done();
        r.outcome = Outcome::Unknown;
        r
    };
    // T100 (unknown) wrote key 1; T101 read its version and overwrote it.
    let seen = vec![
        unknown(txn(100).r(1, INIT).w(1, INIT)),
        txn(101).r(1, 100).w(1, 100).done(),
    ];
    assert!(check(&seen).valid, "{}", check(&seen).summary());
    let mut r = seen.clone();
    assert_eq!(resolve_unknown(&mut r, |_| false), (1, 0));
    assert!(r[0].is_committed());
    // Nobody saw T102's write: aborted, and a later reader of the initial version is
    // fine. Unless the store holds it: committed.
    let unseen = vec![
        unknown(txn(102).r(2, INIT).w(2, INIT)),
        txn(103).r(2, INIT).done(),
    ];
    assert!(check(&unseen).valid, "{}", check(&unseen).summary());
    let mut r = unseen.clone();
    assert_eq!(resolve_unknown(&mut r, |_| false), (0, 1));
    let mut r = unseen;
    assert_eq!(resolve_unknown(&mut r, |w| w.version == 102), (1, 0));
    // The format names the outcome "unknown".
    let lines = serde_json::to_string(&seen[0]).unwrap();
    assert!(lines.contains("\"outcome\":\"unknown\""), "{lines}");
}

/// A file recorder writes a pending record (outcome unknown) when the log phase starts
/// and the final record when the transaction ends: the final one replaces it (no
/// duplicate id). A pending record left alone (the coordinator was killed) is resolved
/// as the simulator resolves it.
#[test]
fn pending_records_are_superseded_by_final_ones() {
    use ambidex_history::{drop_superseded, Outcome};
    let unknown = |t: common::T| {
        let mut r = t.done();
        r.outcome = Outcome::Unknown;
        r
    };
    let recs = vec![
        unknown(txn(100).r(1, INIT).w(1, INIT)),
        txn(100).r(1, INIT).w(1, INIT).done(),
        // T102's coordinator died after its log phase began; T103 overwrote its write.
        unknown(txn(102).r(2, INIT).w(2, INIT)),
        txn(103).r(2, 102).w(2, 102).done(),
        txn(104).r(1, 100).done(),
    ];
    let rep = check(&recs);
    assert!(rep.valid, "{}", rep.summary());
    assert_eq!(rep.pending_superseded, 1);
    assert_eq!((rep.unknown_committed, rep.unknown_aborted), (1, 0));
    assert_eq!(rep.transactions, 4);
    let mut r = recs.clone();
    assert_eq!(drop_superseded(&mut r), 1);
    assert_eq!(r.len(), 4);
    assert!(
        rep.summary().contains("1 of unknown outcome"),
        "{}",
        rep.summary()
    );
}
