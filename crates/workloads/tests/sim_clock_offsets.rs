//! Simulated histories carry each node's clock offset, so real-time bounds from different
//! nodes can be put on one time line: a transaction that read another's write must end
//! after that writer started. Node clocks are skewed by up to 500 ms under `chaos`, so
//! without the offsets the same check fails.

use ambidex::sim::defaults;
use ambidex_history::TxnRecord;
use ambidex_workloads::WorkloadKind;
use std::collections::HashMap;

/// One simulated seed of a built-in workload.
fn run(cfg: &ambidex::Config) -> Result<ambidex::sim::SimReport, ambidex::sim::SimError> {
    ambidex::sim::run(&ambidex_workloads::registry(), cfg)
}

/// (read-from edges checked, edges that violate the order) over the given seeds, with
/// the clock offsets applied or ignored.
fn read_from_order(history: &[TxnRecord], apply_offsets: bool) -> (usize, usize) {
    let by_id: HashMap<u64, &TxnRecord> = history.iter().map(|r| (r.id, r)).collect();
    let on_line = |r: &TxnRecord, t: u64| {
        let off = r
            .clock_offset_us
            .expect("simulated records carry an offset");
        if apply_offsets {
            t as i128 - off as i128
        } else {
            t as i128
        }
    };
    let (mut edges, mut bad) = (0, 0);
    for reader in history.iter().filter(|r| r.is_committed()) {
        for rd in &reader.reads {
            let Some(writer) = by_id.get(&rd.version) else {
                continue; // loaded data or never written
            };
            if writer.id == reader.id || !writer.is_committed() {
                continue;
            }
            edges += 1;
            if on_line(writer, writer.start_us) > on_line(reader, reader.end_us) {
                bad += 1;
            }
        }
    }
    (edges, bad)
}

#[test]
fn offsets_put_every_node_on_one_time_line() {
    let (mut edges, mut bad_with, mut bad_without) = (0, 0, 0);
    // Twelve seeds: with leases (every run has a manager) a seed's 2,000 steps commit
    // fewer cross-node reads than six seeds gave before.
    for seed in 0..12 {
        let mut spec = defaults(WorkloadKind::SmallBank, seed);
        spec.sim.faults = "chaos".into();
        let r = run(&spec).expect("a valid spec");
        assert!(r.passed(), "seed {seed}: {:?}", r.failures);
        assert!(r.history.iter().all(|t| t.clock_offset_us.is_some()));
        let (e, b) = read_from_order(&r.history, true);
        edges += e;
        bad_with += b;
        bad_without += read_from_order(&r.history, false).1;
    }
    assert!(
        edges > 100,
        "too few read-from edges to say anything: {edges}"
    );
    assert_eq!(
        bad_with, 0,
        "{bad_with} of {edges} edges out of order with offsets"
    );
    assert!(
        bad_without > 0,
        "the skew never mattered, so this test shows nothing about the offsets"
    );
}
