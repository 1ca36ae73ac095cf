//! The DSG checker on random histories: serial executions must pass,
//! perturbed ones must match a brute-force oracle, and perturbations that
//! provably close a cycle must be rejected.

mod common;

use ambidex_history::{check, TxnRecord};
use common::{brute_force_serializable, value_of, Gen};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

#[test]
fn random_serial_histories_are_serializable() {
    for seed in 0..40 {
        let s = Gen::default().run(seed);
        let rep = check(&s.recs);
        assert!(rep.valid, "seed {seed}: {}", rep.summary());
        assert!(
            rep.edges.rw > 0,
            "seed {seed}: too little contention to mean anything"
        );
    }
    // One larger, hotter history.
    let s = Gen {
        txns: 20_000,
        keys: 50,
        ..Gen::default()
    }
    .run(99);
    let rep = check(&s.recs);
    assert!(rep.valid, "{}", rep.summary());
}

/// Every (version, value) a key had in a history: committed writes plus its
/// initial version (what the first write overwrote or a read saw).
fn versions_of(recs: &[TxnRecord], table: u32, key: u64) -> Vec<(u64, Option<String>)> {
    let mut out = Vec::new();
    for r in recs.iter().filter(|r| r.is_committed()) {
        for w in r.writes.iter().filter(|w| w.table == table && w.key == key) {
            out.push((w.version, w.value.clone()));
        }
    }
    let written: Vec<u64> = out.iter().map(|v| v.0).collect();
    for r in recs.iter().filter(|r| r.is_committed()) {
        for x in r.reads.iter().filter(|x| x.table == table && x.key == key) {
            if !written.contains(&x.version) && !out.iter().any(|v| v.0 == x.version) {
                out.push((x.version, x.value.clone()));
            }
        }
        for w in r.writes.iter().filter(|w| w.table == table && w.key == key) {
            if !written.contains(&w.prev_version) && !out.iter().any(|v| v.0 == w.prev_version) {
                // Loaded keys carry value_of(version); absent ones none.
                let v = if w.prev_version == 0 {
                    None
                } else {
                    value_of(w.prev_version)
                };
                out.push((w.prev_version, v));
            }
        }
    }
    out
}

#[test]
fn perturbed_small_histories_match_brute_force() {
    let gen = Gen {
        keys: 3,
        tables: 1,
        txns: 7,
        max_reads: 2,
        max_writes: 2,
        abort_pct: 10,
    };
    let mut rng = SmallRng::seed_from_u64(7);
    let (mut rejected, mut accepted) = (0, 0);
    for seed in 0..1500 {
        let mut recs = gen.run(seed).recs;
        // Point one committed read at another version of its key (never the
        // reader's own write: reading your own uncommitted version is not a
        // store read).
        let readers: Vec<usize> = (0..recs.len())
            .filter(|&i| recs[i].is_committed() && !recs[i].reads.is_empty())
            .collect();
        if readers.is_empty() {
            continue;
        }
        let ri = readers[rng.gen_range(0..readers.len())];
        let xi = rng.gen_range(0..recs[ri].reads.len());
        let (t, k, v) = (
            recs[ri].reads[xi].table,
            recs[ri].reads[xi].key,
            recs[ri].reads[xi].version,
        );
        let own = recs[ri].id;
        let cands: Vec<_> = versions_of(&recs, t, k)
            .into_iter()
            .filter(|c| c.0 != v && c.0 != own)
            .collect();
        if cands.is_empty() {
            continue;
        }
        let (nv, nval) = cands[rng.gen_range(0..cands.len())].clone();
        recs[ri].reads[xi].version = nv;
        recs[ri].reads[xi].value = nval;

        let oracle = brute_force_serializable(&recs);
        let rep = check(&recs);
        assert_eq!(
            rep.valid,
            oracle,
            "seed {seed}: oracle says {oracle}\n{}\n{:#?}",
            rep.summary(),
            recs
        );
        if oracle {
            accepted += 1;
        } else {
            rejected += 1;
        }
    }
    println!("perturbed: {rejected} rejected, {accepted} still serializable");
    // Both outcomes must actually occur for this test to mean anything.
    assert!(
        rejected > 100 && accepted > 100,
        "rejected {rejected}, accepted {accepted}"
    );
}

#[test]
fn perturbations_closing_a_cycle_are_rejected() {
    let mut hits = 0;
    for seed in 0..30 {
        let s = Gen {
            txns: 2_000,
            ..Gen::default()
        }
        .run(1000 + seed);
        let mut recs = s.recs;
        // Serial position of each record.
        let mut pos = vec![0; recs.len()];
        for (p, &i) in s.order.iter().enumerate() {
            pos[i] = p;
        }
        let mut by_pos = s.order.clone();
        by_pos.retain(|&i| recs[i].is_committed());
        // Find committed T (reads x, writes y) and a later committed W that
        // writes both x and y. W's y-write follows T's in y's chain, so
        // T ~ww~> W; making T read W's x closes W -wr-> T.
        let mut done = false;
        'outer: for (a, &ti) in by_pos.iter().enumerate() {
            let t = &recs[ti];
            for (xi, x) in t.reads.iter().enumerate() {
                for y in &t.writes {
                    if (y.table, y.key) == (x.table, x.key) {
                        continue;
                    }
                    for &wi in &by_pos[a + 1..] {
                        let w = &recs[wi];
                        let wx = w
                            .writes
                            .iter()
                            .find(|v| (v.table, v.key) == (x.table, x.key));
                        let wy = w
                            .writes
                            .iter()
                            .any(|v| (v.table, v.key) == (y.table, y.key));
                        if let (Some(wx), true) = (wx, wy) {
                            let (nv, nval) = (wx.version, wx.value.clone());
                            assert!(pos[wi] > pos[ti]);
                            recs[ti].reads[xi].version = nv;
                            recs[ti].reads[xi].value = nval;
                            done = true;
                            break 'outer;
                        }
                    }
                }
            }
        }
        if !done {
            continue;
        }
        hits += 1;
        let rep = check(&recs);
        assert!(
            !rep.valid && !rep.cycle_kinds().is_empty(),
            "seed {seed}: {}",
            rep.summary()
        );
    }
    assert!(hits >= 20, "only {hits} perturbations found");
}
