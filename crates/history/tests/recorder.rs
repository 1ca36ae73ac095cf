//! The recorder writes exactly what the parser reads back.

mod common;

use ambidex_history::{parse_file, parse_str, Outcome, Recorder, TxnHeader, TxnRecord, WriteKind};
use common::Gen;

#[test]
fn disabled_recorder_does_nothing() {
    let rec = Recorder::disabled();
    assert!(!rec.is_enabled());
    let mut t = rec.thread();
    let hdr = TxnHeader {
        id: 1,
        node: 0,
        thread: 0,
        outcome: Outcome::Committed,
        reason: None,
        start_us: 0,
        end_us: 0,
        clock_offset_us: None,
    };
    t.record_with(&hdr, |_| panic!("must not be called when disabled"));
    assert!(rec.flush().is_ok());
    assert_eq!(rec.take_memory(), None);
}

#[test]
fn record_with_matches_owned_records() {
    let rec = Recorder::in_memory();
    let mut t = rec.thread();
    let hdr = TxnHeader {
        id: 4294967301,
        node: 1,
        thread: 2,
        outcome: Outcome::Aborted,
        reason: Some("ver\"sion_changed"),
        start_us: 3,
        end_us: 9,
        clock_offset_us: None,
    };
    // Writes before reads: the builder keeps the arrays apart.
    t.record_with(&hdr, |b| {
        b.write(1, 5, WriteKind::Delete, 77, 4294967301, None);
        b.read(1, 5, 77, Some(&[0x0a, 0xff]));
        b.read(2, 6, 0, None);
        b.write(2, 6, WriteKind::Insert, 0, 4294967301, Some(&[]));
    });
    drop(t);
    let text = String::from_utf8(rec.take_memory().unwrap()).unwrap();
    let recs = parse_str(&text).unwrap();
    assert_eq!(recs.len(), 1);
    let r = &recs[0];
    assert_eq!(r.reason.as_deref(), Some("ver\"sion_changed"));
    assert_eq!(r.reads.len(), 2);
    assert_eq!(r.reads[0].value.as_deref(), Some("0aff"));
    assert_eq!(r.reads[1].value, None);
    assert_eq!(r.writes[0].kind, WriteKind::Delete);
    assert_eq!(r.writes[1].value.as_deref(), Some(""));
    // The owned path writes the same bytes.
    let rec2 = Recorder::in_memory();
    rec2.thread().record(r);
    assert_eq!(
        String::from_utf8(rec2.take_memory().unwrap()).unwrap(),
        text
    );
}

#[test]
fn threads_to_file_roundtrip() {
    let path =
        std::env::temp_dir().join(format!("ambidex-history-rec-{}.jsonl", std::process::id()));
    let recs = Gen {
        txns: 4000,
        ..Gen::default()
    }
    .run(5)
    .recs;
    let rec = Recorder::create(&path).unwrap();
    std::thread::scope(|s| {
        for chunk in recs.chunks(1000) {
            let mut t = rec.thread();
            s.spawn(move || {
                for r in chunk {
                    t.record(r);
                }
            });
        }
    });
    rec.flush().unwrap();
    let mut back = parse_file(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let key = |r: &TxnRecord| r.id;
    let mut want = recs.clone();
    want.sort_by_key(key);
    back.sort_by_key(key);
    assert_eq!(back, want);
    assert!(ambidex_history::check(&back).valid);
}

#[test]
fn create_fails_cleanly_on_bad_path() {
    assert!(Recorder::create("/nonexistent-dir/x/history.jsonl").is_err());
}
