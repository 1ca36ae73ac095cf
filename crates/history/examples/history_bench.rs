//! Measures the recorder's cost per record and the checker's speed.
//! `cargo run --release -p ambidex-history --example history_bench [TXNS]`

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use ambidex_history::{check, parse_file, Outcome, Recorder, TxnHeader, WriteKind};

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let dir = std::env::temp_dir();
    let path = dir.join(format!(
        "ambidex-history-bench-{}.jsonl",
        std::process::id()
    ));

    // Recording: a typical small transaction (2 reads, 2 writes of 40-byte
    // values), via the allocation-free record_with path.
    let value = [0x5au8; 40];
    // /dev/null isolates the recorder's CPU cost from the disk's speed.
    let modes = [
        ("disabled", Recorder::disabled()),
        ("/dev/null", Recorder::create("/dev/null").unwrap()),
        ("file", Recorder::create(&path).unwrap()),
    ];
    for (label, rec) in modes {
        let mut t = rec.thread();
        let start = Instant::now();
        for i in 0..n as u64 {
            let hdr = TxnHeader {
                id: (1 << 32) | (i + 1),
                node: 1,
                thread: 0,
                outcome: Outcome::Committed,
                reason: None,
                start_us: i,
                end_us: i + 3,
                clock_offset_us: None,
            };
            t.record_with(&hdr, |b| {
                b.read(1, i % 1000, 7, Some(&value));
                b.read(2, i % 777, 9, Some(&value));
                b.write(1, i % 1000, WriteKind::Update, 7, hdr.id, Some(&value));
                b.write(2, i % 777, WriteKind::Update, 9, hdr.id, Some(&value));
            });
        }
        drop(t);
        rec.flush().unwrap();
        let el = start.elapsed();
        println!(
            "record ({label}): {n} records in {el:?} = {:.1} ns/record",
            el.as_nanos() as f64 / n as f64
        );
    }
    let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    println!(
        "  file: {:.1} MB, {:.0} bytes/record",
        bytes as f64 / 1e6,
        bytes as f64 / n as f64
    );

    // Checking: a random serial history of n transactions over 100k keys.
    let s = common::Gen {
        txns: n,
        keys: 50_000,
        ..common::Gen::default()
    }
    .run(1);
    let rec = Recorder::create(&path).unwrap();
    let mut t = rec.thread();
    for r in &s.recs {
        t.record(r);
    }
    drop(t);
    rec.flush().unwrap();
    let bytes = std::fs::metadata(&path).unwrap().len();
    let start = Instant::now();
    let recs = parse_file(&path).unwrap();
    let parsed = start.elapsed();
    let start = Instant::now();
    let rep = check(&recs);
    let checked = start.elapsed();
    println!(
        "check: {} txns ({} reads, {} writes, {:.0} MB): parse {parsed:?}, check {checked:?}; valid={}",
        rep.transactions,
        rep.reads,
        rep.writes,
        bytes as f64 / 1e6,
        rep.valid
    );
    // The same history plus one read-skew transaction: the cost of
    // finding and classifying a cycle in a big graph.
    let mut recs = recs;
    let w = recs
        .iter()
        .position(|r| r.is_committed() && r.writes.len() >= 2)
        .unwrap();
    let (w0, w1, id) = (
        recs[w].writes[0].clone(),
        recs[w].writes[1].clone(),
        recs[w].id,
    );
    let mut skew = common::txn(1 << 50).done();
    skew.reads.push(ambidex_history::ReadRecord {
        table: w0.table,
        key: w0.key,
        version: id,
        value: w0.value,
    });
    let old = recs
        .iter()
        .flat_map(|r| r.writes.iter())
        .find(|x| x.version == w1.prev_version && x.key == w1.key);
    let value = old.map_or_else(|| common::value_of(w1.prev_version), |x| x.value.clone());
    let value = if w1.prev_version == 0 { None } else { value };
    skew.reads.push(ambidex_history::ReadRecord {
        table: w1.table,
        key: w1.key,
        version: w1.prev_version,
        value,
    });
    recs.push(skew);
    let start = Instant::now();
    let rep = check(&recs);
    println!(
        "check (+1 read-skew txn): {:?}, anomalies {:?}",
        start.elapsed(),
        rep.anomalies
    );
    std::fs::remove_file(&path).unwrap();
}
