//! Shared history builders for the tests (and the bench example).
#![allow(dead_code)]

use ambidex_history::{encode_hex, Outcome, ReadRecord, TxnRecord, WriteKind, WriteRecord};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// The version the initial load gave every loaded key in hand-built
/// histories (transaction ids start at 100, so it never collides).
pub const INIT: u64 = 1;

/// The value a version carries in these histories: derived from the version
/// so that "same version, same value" holds by construction.
pub fn value_of(version: u64) -> Option<String> {
    Some(encode_hex(&version.to_le_bytes()))
}

/// Builder for hand-written histories. Keys are (table 1, key k).
pub struct T(TxnRecord);

pub fn txn(id: u64) -> T {
    T(TxnRecord {
        id,
        node: (id % 3) as u32,
        thread: (id % 2) as u32,
        outcome: Outcome::Committed,
        reason: None,
        start_us: id,
        end_us: id + 1,
        clock_offset_us: None,
        reads: vec![],
        writes: vec![],
    })
}

impl T {
    /// Reads key `k` at `version` (0 = absent).
    pub fn r(mut self, k: u64, version: u64) -> T {
        let value = if version == 0 {
            None
        } else {
            value_of(version)
        };
        self.0.reads.push(ReadRecord {
            table: 1,
            key: k,
            version,
            value,
        });
        self
    }

    /// Reads a deleted key: the tombstone's version, no value.
    pub fn r_deleted(mut self, k: u64, version: u64) -> T {
        self.0.reads.push(ReadRecord {
            table: 1,
            key: k,
            version,
            value: None,
        });
        self
    }

    /// Updates key `k`, overwriting version `prev`.
    pub fn w(mut self, k: u64, prev: u64) -> T {
        let id = self.0.id;
        self.0.writes.push(WriteRecord {
            table: 1,
            key: k,
            kind: if prev == 0 {
                WriteKind::Insert
            } else {
                WriteKind::Update
            },
            prev_version: prev,
            version: id,
            value: value_of(id),
        });
        self
    }

    pub fn del(mut self, k: u64, prev: u64) -> T {
        let id = self.0.id;
        self.0.writes.push(WriteRecord {
            table: 1,
            key: k,
            kind: WriteKind::Delete,
            prev_version: prev,
            version: id,
            value: None,
        });
        self
    }

    pub fn abort(mut self) -> T {
        self.0.outcome = Outcome::Aborted;
        self.0.reason = Some("version_changed".into());
        self
    }

    pub fn done(self) -> TxnRecord {
        self.0
    }
}

pub fn h(ts: Vec<T>) -> Vec<TxnRecord> {
    ts.into_iter().map(T::done).collect()
}

/// Named histories shared by the DSG and adya tests.
pub mod known {
    use super::*;

    /// Serializable: a chain of read-modify-writes, an aborted transaction,
    /// and a read-only transaction. Key 1 and 2 start loaded (INIT).
    pub fn serializable() -> Vec<TxnRecord> {
        h(vec![
            txn(100).r(1, INIT).w(1, INIT),
            txn(101).r(1, 100).r(2, INIT).w(2, INIT),
            txn(102).r(1, 100).r(2, 101),
            txn(103).r(1, 100).w(1, 100).abort(),
            txn(104).r(1, 100).w(1, 100),
            txn(105).r(2, INIT), // read before 101: anti-depends on it
        ])
    }

    /// Serializable with inserts and deletes: insert, delete (tombstone),
    /// re-insert over the tombstone, and a read of the absent key that
    /// serializes before the first insert.
    pub fn serializable_insert_delete() -> Vec<TxnRecord> {
        h(vec![
            txn(100).r(5, 0).w(5, 0),
            txn(101).r(5, 100).del(5, 100),
            txn(102).r_deleted(5, 101).w(5, 101),
            txn(103).r(5, 0),
            txn(104).r(5, 102).r(6, 0),
        ])
    }

    /// Lost update, as a correct lock-based store would record it: both read
    /// x@INIT and incremented; the second write's prev is the first write,
    /// so the chain is intact but T101 overwrote a version it never read.
    pub fn lost_update() -> Vec<TxnRecord> {
        h(vec![
            txn(100).r(1, INIT).w(1, INIT),
            txn(101).r(1, INIT).w(1, 100),
        ])
    }

    /// Lost update where the store also lost a version: both writes claim
    /// to overwrite INIT (forked chain).
    pub fn lost_update_forked() -> Vec<TxnRecord> {
        h(vec![
            txn(100).r(1, INIT).w(1, INIT),
            txn(101).r(1, INIT).w(1, INIT),
        ])
    }

    /// Write skew: each reads both keys and writes the other one.
    pub fn write_skew() -> Vec<TxnRecord> {
        h(vec![
            txn(100).r(1, INIT).r(2, INIT).w(1, INIT),
            txn(101).r(1, INIT).r(2, INIT).w(2, INIT),
        ])
    }

    /// G-single (read skew): T101 sees T100's y but not its x.
    pub fn read_skew() -> Vec<TxnRecord> {
        h(vec![
            txn(100).r(1, INIT).r(2, INIT).w(1, INIT).w(2, INIT),
            txn(101).r(1, INIT).r(2, 100),
        ])
    }

    /// G0 (dirty write): blind writes installed in opposite orders on x, y.
    pub fn g0() -> Vec<TxnRecord> {
        h(vec![
            txn(100).w(1, INIT).w(2, 101),
            txn(101).w(1, 100).w(2, INIT),
        ])
    }

    /// G1c: each reads the other's write.
    pub fn g1c() -> Vec<TxnRecord> {
        h(vec![
            txn(100).w(1, INIT).r(2, 101),
            txn(101).w(2, INIT).r(1, 100),
        ])
    }

    /// G1a: a committed read of an aborted write.
    pub fn g1a() -> Vec<TxnRecord> {
        h(vec![
            txn(100).r(1, INIT).w(1, INIT).abort(),
            txn(101).r(1, 100),
            txn(102).r(1, INIT).w(1, INIT),
        ])
    }

    /// A read of the absent key anti-depends on its first insert: T101
    /// missed T100's insert of key 5, yet saw T100's insert of key 6.
    pub fn missed_insert() -> Vec<TxnRecord> {
        h(vec![
            txn(100).r(5, 0).w(5, 0).w(6, 0),
            txn(101).r(5, 0).r(6, 100),
        ])
    }
}

/// A random serial execution, recorded (in shuffled order).
pub struct Gen {
    pub keys: u64,
    pub tables: u32,
    pub txns: usize,
    pub max_reads: usize,
    pub max_writes: usize,
    pub abort_pct: u32,
}

impl Default for Gen {
    fn default() -> Gen {
        Gen {
            keys: 20,
            tables: 2,
            txns: 300,
            max_reads: 4,
            max_writes: 3,
            abort_pct: 20,
        }
    }
}

/// The generated history plus the serial order it came from.
pub struct Serial {
    pub recs: Vec<TxnRecord>,
    /// Record indices in serial (commit) order, committed and aborted.
    pub order: Vec<usize>,
}

impl Gen {
    pub fn run(&self, seed: u64) -> Serial {
        let mut rng = SmallRng::seed_from_u64(seed);
        let nkeys = self.keys as usize * self.tables as usize;
        // Current (version, value) per key; odd keys start absent, even ones
        // loaded with a per-key version below any transaction id.
        let mut state: Vec<(u64, Option<String>)> = (0..nkeys)
            .map(|i| {
                if i % 2 == 1 {
                    (0, None)
                } else {
                    (1 + i as u64, value_of(1 + i as u64))
                }
            })
            .collect();
        let key_of = |i: usize| {
            (
                (i / self.keys as usize) as u32,
                (i % self.keys as usize) as u64,
            )
        };
        let mut recs = Vec::with_capacity(self.txns);
        for n in 0..self.txns {
            // ids look like ambidex's (node in the high bits, a sequence below) and
            // never equal a load version, as the format requires.
            let node = rng.gen_range(0..4u64);
            let id = ((node + 1) << 32) | (n as u64 + 1);
            let committed = rng.gen_range(0..100) >= self.abort_pct;
            let mut rec = TxnRecord {
                id,
                node: node as u32,
                thread: rng.gen_range(0..4),
                outcome: if committed {
                    Outcome::Committed
                } else {
                    Outcome::Aborted
                },
                reason: (!committed).then(|| "locked".to_string()),
                start_us: n as u64 * 10,
                end_us: n as u64 * 10 + 5,
                clock_offset_us: None,
                reads: vec![],
                writes: vec![],
            };
            // Distinct keys without shuffling the whole key space.
            let picks: Vec<usize> = rand::seq::index::sample(
                &mut rng,
                nkeys,
                nkeys.min(self.max_reads + self.max_writes),
            )
            .into_vec();
            let nr = rng.gen_range(0..=self.max_reads.min(picks.len()));
            let nw = rng.gen_range(0..=self.max_writes).max(usize::from(nr == 0));
            // Writes overlap reads often (read-modify-write), like OCC code.
            let reads: Vec<usize> = picks[..nr].to_vec();
            let mut writes: Vec<usize> = Vec::new();
            for i in 0..nw {
                let k = if i < nr && rng.gen_bool(0.6) {
                    picks[i]
                } else {
                    picks[(nr + i) % picks.len()]
                };
                if !writes.contains(&k) {
                    writes.push(k);
                }
            }
            for &k in &reads {
                let (t, key) = key_of(k);
                let (v, val) = state[k].clone();
                rec.reads.push(ReadRecord {
                    table: t,
                    key,
                    version: v,
                    value: val,
                });
            }
            for &k in &writes {
                let (t, key) = key_of(k);
                let (prev, prev_val) = &state[k];
                let kind = match prev_val {
                    None => WriteKind::Insert,
                    Some(_) if rng.gen_range(0..5) == 0 => WriteKind::Delete,
                    Some(_) => WriteKind::Update,
                };
                let value = match kind {
                    WriteKind::Delete => None,
                    _ => Some(encode_hex(&rng.gen::<u64>().to_le_bytes())),
                };
                rec.writes.push(WriteRecord {
                    table: t,
                    key,
                    kind,
                    prev_version: *prev,
                    version: id,
                    value,
                });
            }
            if committed {
                for w in &rec.writes {
                    let k = w.table as usize * self.keys as usize + w.key as usize;
                    state[k] = (id, w.value.clone());
                }
            }
            recs.push(rec);
        }
        // The recorder writes in no particular order; neither does this.
        let mut perm: Vec<usize> = (0..recs.len()).collect();
        perm.shuffle(&mut rng);
        let mut shuffled = vec![None; recs.len()];
        for (serial_pos, &file_pos) in perm.iter().enumerate() {
            shuffled[file_pos] = Some(recs[serial_pos].clone());
        }
        Serial {
            recs: shuffled.into_iter().map(Option::unwrap).collect(),
            order: perm,
        }
    }
}

/// Brute-force serializability oracle for small histories: is there an
/// order of the committed transactions in which every read sees the latest
/// version and every write overwrites the latest version? Initial versions
/// are whatever the history itself implies (a version no committed
/// transaction wrote).
pub fn brute_force_serializable(recs: &[TxnRecord]) -> bool {
    use std::collections::HashMap;
    let committed: Vec<&TxnRecord> = recs.iter().filter(|r| r.is_committed()).collect();
    assert!(committed.len() <= 8, "oracle is factorial");
    let written: std::collections::HashSet<(u32, u64, u64)> = committed
        .iter()
        .flat_map(|r| r.writes.iter().map(|w| (w.table, w.key, w.version)))
        .collect();
    let aborted_written: std::collections::HashSet<(u32, u64, u64)> = recs
        .iter()
        .filter(|r| !r.is_committed())
        .flat_map(|r| r.writes.iter().map(|w| (w.table, w.key, w.version)))
        .collect();
    // Initial version per key: the unique version read or overwritten that
    // no committed transaction wrote.
    let mut init: HashMap<(u32, u64), u64> = HashMap::new();
    for r in &committed {
        let seen = r.reads.iter().map(|x| (x.table, x.key, x.version));
        let over = r.writes.iter().map(|w| (w.table, w.key, w.prev_version));
        for (t, k, v) in seen.chain(over) {
            if aborted_written.contains(&(t, k, v)) {
                return false; // G1a / dirty overwrite
            }
            if !written.contains(&(t, k, v)) {
                if let Some(&old) = init.get(&(t, k)) {
                    if old != v {
                        return false;
                    }
                }
                init.insert((t, k), v);
            }
        }
    }
    let mut idx: Vec<usize> = (0..committed.len()).collect();
    let ok = |order: &[usize]| -> bool {
        let mut cur = init.clone();
        for &i in order {
            let r = committed[i];
            for x in &r.reads {
                if cur.get(&(x.table, x.key)) != Some(&x.version) {
                    return false;
                }
            }
            for w in &r.writes {
                if cur.get(&(w.table, w.key)) != Some(&w.prev_version) {
                    return false;
                }
                cur.insert((w.table, w.key), w.version);
            }
        }
        true
    };
    permutations(&mut idx, 0, &ok)
}

fn permutations(v: &mut Vec<usize>, k: usize, ok: &dyn Fn(&[usize]) -> bool) -> bool {
    if k == v.len() {
        return ok(v);
    }
    for i in k..v.len() {
        v.swap(k, i);
        if permutations(v, k + 1, ok) {
            return true;
        }
        v.swap(k, i);
    }
    false
}
