//! The recorder writes exactly what the parser reads back.

mod common;

use ambidex_history::{
    parse_file, parse_str, salvage, Outcome, Recorder, Salvaged, TxnHeader, TxnRecord, WriteKind,
};
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

/// A record of `n` bytes of value (so records cross segment ends and one can
/// exceed a whole segment).
fn big(id: u64, n: usize) -> TxnRecord {
    TxnRecord {
        id,
        node: 2,
        thread: 1,
        outcome: if id.is_multiple_of(3) {
            Outcome::Unknown
        } else {
            Outcome::Committed
        },
        reason: None,
        start_us: id,
        end_us: id + 1,
        clock_offset_us: None,
        reads: vec![],
        writes: vec![ambidex_history::WriteRecord {
            table: 1,
            key: id,
            kind: WriteKind::Insert,
            prev_version: 0,
            version: id,
            value: Some("ab".repeat(n)),
        }],
    }
}

/// Many threads, records crossing their segments' ends and one larger than a
/// segment: the finished file is plain JSON lines (no unwritten gaps left).
#[test]
fn a_finished_file_is_compacted_to_plain_lines() {
    let path =
        std::env::temp_dir().join(format!("ambidex-history-big-{}.jsonl", std::process::id()));
    let rec = Recorder::create(&path).unwrap();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let mut th = rec.thread();
            s.spawn(move || {
                for i in 0..400u64 {
                    let id = 1 + t * 1000 + i;
                    let n = if t == 0 && i == 7 {
                        ambidex_history::recorder::SEGMENT
                    } else {
                        (i as usize * 37) % 3000
                    };
                    th.record(&big(id, n));
                }
            });
        }
    });
    rec.flush().unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert!(
        !bytes.contains(&0),
        "unwritten bytes left in a finished file"
    );
    let back = parse_file(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(back.len(), 1600);
    assert!(back.iter().any(
        |r| r.writes[0].value.as_ref().unwrap().len() == 2 * ambidex_history::recorder::SEGMENT
    ));
}

/// The child half of `records_survive_sigkill` (run only by it): records, says so,
/// waits to be killed.
#[test]
#[ignore = "the child process of records_survive_sigkill"]
fn sigkill_child() {
    let Ok(path) = std::env::var("AMBIDEX_HISTORY_KILL_CHILD") else {
        eprintln!("sigkill_child is run by records_survive_sigkill");
        return;
    };
    let rec = Recorder::create(&path).unwrap();
    let mut th = rec.thread();
    for id in 1..=1000u64 {
        th.record(&big(id, (id as usize * 13) % 500));
    }
    println!("recorded");
    use std::io::Write;
    std::io::stdout().flush().unwrap();
    loop {
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

/// A process killed with SIGKILL after recording leaves every record in its file (no
/// flush, no destructor ran): the salvaged file holds all of them.
#[test]
fn records_survive_sigkill() {
    use std::io::BufRead;
    let path =
        std::env::temp_dir().join(format!("ambidex-history-kill-{}.jsonl", std::process::id()));
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "sigkill_child", "--ignored", "--nocapture"])
        .env("AMBIDEX_HISTORY_KILL_CHILD", &path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = std::io::BufReader::new(child.stdout.take().unwrap());
    let said = out
        .lines()
        .map_while(Result::ok)
        .any(|l| l.contains("recorded"));
    assert!(said, "the child did not record");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let f = std::fs::File::open(&path).unwrap();
    let mut clean = Vec::new();
    let got = salvage(std::io::BufReader::new(f), &mut clean).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(
        got,
        Salvaged {
            records: 1000,
            torn: 0
        }
    );
    let back = parse_str(std::str::from_utf8(&clean).unwrap()).unwrap();
    let mut ids: Vec<u64> = back.iter().map(|r| r.id).collect();
    ids.sort_unstable();
    assert_eq!(ids, (1..=1000).collect::<Vec<_>>());
    assert_eq!(
        back.iter()
            .filter(|r| r.outcome == Outcome::Unknown)
            .count(),
        333
    );
}

/// What a kill leaves: complete lines, a record torn mid-copy (its start, NULs, and
/// possibly its end, as a copy that stores head and tail first leaves), the next
/// segment's records right after the NULs, and a NUL tail. Complete records are kept,
/// torn pieces counted.
#[test]
fn salvage_skips_torn_records_and_counts_them() {
    let line = |id| format!("{}\n", ambidex_history::format::to_line(&big(id, 3)));
    let mut b = Vec::new();
    b.extend_from_slice(line(1).as_bytes());
    let torn = line(2);
    b.extend_from_slice(&torn.as_bytes()[..20]);
    b.extend_from_slice(&[0; 100]);
    b.extend_from_slice(line(3).as_bytes());
    // Head and tail stored, middle not.
    let t4 = line(4);
    b.extend_from_slice(&t4.as_bytes()[..10]);
    b.extend_from_slice(&vec![0; t4.len() - 20]);
    b.extend_from_slice(&t4.as_bytes()[t4.len() - 10..]);
    b.extend_from_slice(line(5).as_bytes());
    // The last record, cut, then the unwritten rest of the extent.
    b.extend_from_slice(&line(6).as_bytes()[..30]);
    b.extend_from_slice(&[0; 4096]);
    let mut out = Vec::new();
    let got = salvage(&b[..], &mut out).unwrap();
    assert_eq!(
        got,
        Salvaged {
            records: 3,
            torn: 4
        }
    );
    let ids: Vec<u64> = parse_str(std::str::from_utf8(&out).unwrap())
        .unwrap()
        .iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(ids, [1, 3, 5]);
    // A finished file goes through as it is.
    let mut again = Vec::new();
    assert_eq!(
        salvage(&out[..], &mut again).unwrap(),
        Salvaged {
            records: 3,
            torn: 0
        }
    );
    assert_eq!(again, out);
}
