//! The direct serialization graph (DSG) checker.
//!
//! Because ambidex records exact versions, nothing here is inferred: a read's
//! `version` names its writer (wr), each key's committed writes form a chain
//! through `prev_version` (ww), and a read of version `v` anti-depends on the
//! write whose `prev_version` is `v` (rw). The history is serializable iff this
//! graph over committed transactions is acyclic and no committed read saw an
//! aborted write (Adya's PL-3). The initial load is a virtual transaction T0;
//! it only has outgoing edges, so it can never be on a cycle and is left out
//! of the graph.
//!
//! Work is linear apart from sorting inside each key's group: ops are bucketed
//! per key with a counting sort, cycles are found with an iterative Tarjan
//! SCC (no recursion, so 10^6-transaction histories are fine), and only the
//! cyclic components are searched for a small witness.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::hash::{BuildHasherDefault, Hasher};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::format::{parse_file, Outcome, ParseError, TxnRecord};

/// Error-level findings: any of these means the history is not serializable
/// (cycle kinds, G1a) or contradicts what the transaction layer guarantees.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Anomaly {
    /// A cycle of ww edges only.
    #[serde(rename = "G0")]
    G0,
    /// A committed transaction read a version written by an aborted one.
    #[serde(rename = "G1a")]
    G1a,
    /// A cycle of ww and wr edges (at least one wr).
    #[serde(rename = "G1c")]
    G1c,
    /// A cycle with exactly one rw (anti-dependency) edge.
    #[serde(rename = "G-single")]
    GSingle,
    /// A cycle that needs more than one rw edge.
    #[serde(rename = "G2")]
    G2,
    /// A committed transaction wrote a key over a version other than the one
    /// it read (it overwrote a write it never saw).
    #[serde(rename = "lost-update")]
    LostUpdate,
    /// Two committed writes of one key overwrote the same version, so the
    /// version chain forks (one of them was lost).
    #[serde(rename = "forked-chain")]
    ForkedChain,
    /// A committed write's `prev_version` is a version written by an aborted
    /// transaction: an aborted write was installed.
    #[serde(rename = "dirty-overwrite")]
    DirtyOverwrite,
    /// A key has more than one version that no transaction in the history
    /// wrote (read or overwritten); a complete history has one initial
    /// version per key.
    #[serde(rename = "conflicting-initial-versions")]
    ConflictingInitialVersions,
    /// One (key, version) was seen with two different values.
    #[serde(rename = "value-mismatch")]
    ValueMismatch,
    /// One transaction wrote the same key twice.
    #[serde(rename = "duplicate-write")]
    DuplicateWrite,
    /// Two records share a transaction id.
    #[serde(rename = "duplicate-id")]
    DuplicateId,
}

impl Anomaly {
    pub fn name(self) -> &'static str {
        match self {
            Anomaly::G0 => "G0",
            Anomaly::G1a => "G1a",
            Anomaly::G1c => "G1c",
            Anomaly::GSingle => "G-single",
            Anomaly::G2 => "G2",
            Anomaly::LostUpdate => "lost-update",
            Anomaly::ForkedChain => "forked-chain",
            Anomaly::DirtyOverwrite => "dirty-overwrite",
            Anomaly::ConflictingInitialVersions => "conflicting-initial-versions",
            Anomaly::ValueMismatch => "value-mismatch",
            Anomaly::DuplicateWrite => "duplicate-write",
            Anomaly::DuplicateId => "duplicate-id",
        }
    }

    /// True for the dependency-cycle kinds.
    pub fn is_cycle(self) -> bool {
        matches!(
            self,
            Anomaly::G0 | Anomaly::G1c | Anomaly::GSingle | Anomaly::G2
        )
    }
}

/// Findings that do not affect the verdict.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Warning {
    /// An aborted transaction read a version written by another aborted
    /// transaction (G1a outside the committed history; OCC should not allow
    /// it, but aborted reads are not subject to serializability).
    #[serde(rename = "aborted-read-in-aborted")]
    AbortedReadInAborted,
    /// G-single search hit its step budget in some component; that
    /// component is reported as G2, which may be an overstatement.
    #[serde(rename = "g-single-search-incomplete")]
    GSingleSearchIncomplete,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum EdgeKind {
    Ww,
    Wr,
    Rw,
}

impl EdgeKind {
    fn from_bit(b: u8) -> EdgeKind {
        match b {
            WW => EdgeKind::Ww,
            WR => EdgeKind::Wr,
            _ => EdgeKind::Rw,
        }
    }
}

const WW: u8 = 1;
const WR: u8 = 2;
const RW: u8 = 4;
const ALL: u8 = WW | WR | RW;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct WitnessEdge {
    pub from: u64,
    pub to: u64,
    pub kind: EdgeKind,
    pub table: u32,
    pub key: u64,
}

/// A small piece of evidence: for cycles, the cycle's edges in order
/// (`edges[i].to == edges[i+1].from`, the last edge closes it).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Witness {
    pub anomaly: Anomaly,
    pub txns: Vec<u64>,
    #[serde(default)]
    pub edges: Vec<WitnessEdge>,
    pub detail: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct EdgeCounts {
    pub ww: u64,
    pub wr: u64,
    pub rw: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// No error-level finding: the committed history is serializable and
    /// consistent with the format's guarantees.
    pub valid: bool,
    pub transactions: u64,
    pub committed: u64,
    pub aborted: u64,
    pub reads: u64,
    pub writes: u64,
    pub keys: u64,
    pub edges: EdgeCounts,
    /// Strongly connected components with a cycle; each is counted once in
    /// `anomalies`, under its most severe cycle kind.
    pub cyclic_components: u64,
    pub anomalies: BTreeMap<Anomaly, u64>,
    pub warnings: BTreeMap<Warning, u64>,
    /// Up to `MAX_WITNESSES` (5) per anomaly kind.
    pub witnesses: Vec<Witness>,
    /// Pending records (outcome unknown) replaced by their transaction's final
    /// record ([`crate::format::drop_superseded`]).
    #[serde(default)]
    pub pending_superseded: u64,
    /// Transactions left of unknown outcome (their coordinator died), resolved
    /// as committed and as aborted ([`crate::format::resolve_unknown`]).
    #[serde(default)]
    pub unknown_committed: u64,
    #[serde(default)]
    pub unknown_aborted: u64,
}

pub const MAX_WITNESSES: usize = 5;

/// Steps of breadth-first search allowed per cyclic component when looking
/// for a G-single witness, so pathological components stay fast.
const GSINGLE_BUDGET: u64 = 20_000_000;

impl CheckReport {
    pub fn count(&self, a: Anomaly) -> u64 {
        self.anomalies.get(&a).copied().unwrap_or(0)
    }

    pub fn has(&self, a: Anomaly) -> bool {
        self.count(a) > 0
    }

    /// The cycle kinds found, most severe first.
    pub fn cycle_kinds(&self) -> Vec<Anomaly> {
        self.anomalies
            .keys()
            .copied()
            .filter(|a| a.is_cycle())
            .collect()
    }

    pub fn witness(&self, a: Anomaly) -> Option<&Witness> {
        self.witnesses.iter().find(|w| w.anomaly == a)
    }

    fn add(&mut self, w: Witness) {
        let n = self.anomalies.entry(w.anomaly).or_insert(0);
        *n += 1;
        if *n as usize <= MAX_WITNESSES {
            self.witnesses.push(w);
        }
    }

    /// A human-readable summary (for `ambidex check-history`).
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{} transactions ({} committed, {} aborted), {} reads, {} writes, {} keys",
            self.transactions, self.committed, self.aborted, self.reads, self.writes, self.keys
        );
        let _ = writeln!(
            s,
            "edges: {} ww, {} wr, {} rw",
            self.edges.ww, self.edges.wr, self.edges.rw
        );
        if self.unknown_committed + self.unknown_aborted > 0 {
            let _ = writeln!(
                s,
                "coordinator died: {} of unknown outcome, taken as {} committed (seen) and {} aborted",
                self.unknown_committed + self.unknown_aborted,
                self.unknown_committed,
                self.unknown_aborted
            );
        }
        if self.valid {
            let _ = writeln!(s, "serializable: no anomalies found");
        } else {
            let found: Vec<String> = self
                .anomalies
                .iter()
                .map(|(a, n)| format!("{n} {}", a.name()))
                .collect();
            let _ = writeln!(s, "NOT serializable: {}", found.join(", "));
        }
        for (w, n) in &self.warnings {
            let _ = writeln!(
                s,
                "warning: {n} {}",
                serde_json::to_string(w)
                    .unwrap_or_default()
                    .trim_matches('"')
            );
        }
        for w in &self.witnesses {
            let _ = writeln!(s, "\n{}: {}", w.anomaly.name(), w.detail);
            for e in &w.edges {
                let _ = writeln!(
                    s,
                    "  T{} -{}-> T{}   (table {} key {})",
                    e.from,
                    serde_json::to_string(&e.kind)
                        .unwrap_or_default()
                        .trim_matches('"'),
                    e.to,
                    e.table,
                    e.key
                );
            }
        }
        s
    }
}

/// Parses and checks a history file.
pub fn check_file(path: impl AsRef<Path>) -> Result<CheckReport, CheckFileError> {
    let path = path.as_ref();
    let recs = parse_file(path).map_err(|source| CheckFileError {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(check(&recs))
}

/// Why [`check_file`] could not check a history file: it could not be read or a line
/// of it is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {source}", .path.display())]
pub struct CheckFileError {
    /// The history file.
    pub path: PathBuf,
    /// The line (0: the file itself) and what is wrong with it.
    #[source]
    pub source: ParseError,
}

/// FxHash: keys here are small integers from the history; DoS resistance
/// is not needed and SipHash would dominate indexing time.
#[derive(Default, Clone, Copy)]
struct Fx(u64);

impl Hasher for Fx {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(n as u64);
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<Fx>>;

/// A value's identity for the consistency check. Unequal hashes imply
/// unequal values, so a collision can only hide a mismatch, never invent one.
fn value_hash(v: Option<&str>) -> u64 {
    let Some(s) = v else { return 0 };
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h = (h ^ b.to_ascii_lowercase() as u64).wrapping_mul(0x100_0000_01b3);
    }
    h | 1 // never 0, which is "null"
}

const CW: u8 = 0; // committed write
const AW: u8 = 1; // aborted write
const CR: u8 = 2; // committed read
const AR: u8 = 3; // aborted read

#[derive(Clone, Copy, Default)]
struct Op {
    version: u64,
    prev: u64,
    vhash: u64,
    rec: u32,
    kind: u8,
}

struct Edge {
    from: u32,
    to: u32,
    kind: u8,
    key: u32,
}

/// Checks a history. Record order does not matter.
pub fn check(recs: &[TxnRecord]) -> CheckReport {
    if recs.iter().any(|r| r.outcome == Outcome::Unknown) {
        // A pending record whose transaction finished is replaced by its final
        // record; each left of unknown outcome is committed if anyone saw it.
        let mut resolved = recs.to_vec();
        let superseded = crate::format::drop_superseded(&mut resolved);
        let (c, a) = crate::format::resolve_unknown(&mut resolved, |_| false);
        let mut rep = check(&resolved);
        rep.pending_superseded = superseded;
        rep.unknown_committed = c;
        rep.unknown_aborted = a;
        return rep;
    }
    let mut rep = CheckReport {
        transactions: recs.len() as u64,
        ..CheckReport::default()
    };

    // Committed transactions are graph nodes, numbered in record order.
    let mut node_of = vec![u32::MAX; recs.len()];
    let mut rec_of: Vec<u32> = Vec::new();
    for (i, r) in recs.iter().enumerate() {
        if r.outcome == Outcome::Committed {
            node_of[i] = rec_of.len() as u32;
            rec_of.push(i as u32);
        }
        rep.reads += r.reads.len() as u64;
        rep.writes += r.writes.len() as u64;
    }
    rep.committed = rec_of.len() as u64;
    rep.aborted = rep.transactions - rep.committed;

    duplicate_ids(recs, &mut rep);
    lost_updates(recs, &mut rep);

    // Intern keys and bucket every op by key (counting sort).
    let mut key_idx: FxMap<(u32, u64), u32> = FxMap::default();
    let mut keys: Vec<(u32, u64)> = Vec::new();
    let mut op_key: Vec<u32> = Vec::with_capacity((rep.reads + rep.writes) as usize);
    let mut intern = |t: u32, k: u64| -> u32 {
        *key_idx.entry((t, k)).or_insert_with(|| {
            keys.push((t, k));
            keys.len() as u32 - 1
        })
    };
    for r in recs {
        for x in &r.reads {
            op_key.push(intern(x.table, x.key));
        }
        for w in &r.writes {
            op_key.push(intern(w.table, w.key));
        }
    }
    drop(key_idx);
    rep.keys = keys.len() as u64;
    let mut start = vec![0u32; keys.len() + 1];
    for &k in &op_key {
        start[k as usize + 1] += 1;
    }
    for i in 0..keys.len() {
        start[i + 1] += start[i];
    }
    let mut fill = start.clone();
    let mut ops = vec![Op::default(); op_key.len()];
    let mut j = 0;
    for (i, r) in recs.iter().enumerate() {
        let committed = r.outcome == Outcome::Committed;
        for x in &r.reads {
            let k = op_key[j] as usize;
            j += 1;
            ops[fill[k] as usize] = Op {
                version: x.version,
                prev: 0,
                vhash: value_hash(x.value.as_deref()),
                rec: i as u32,
                kind: if committed { CR } else { AR },
            };
            fill[k] += 1;
        }
        for w in &r.writes {
            let k = op_key[j] as usize;
            j += 1;
            ops[fill[k] as usize] = Op {
                version: w.version,
                prev: w.prev_version,
                vhash: value_hash(w.value.as_deref()),
                rec: i as u32,
                kind: if committed { CW } else { AW },
            };
            fill[k] += 1;
        }
    }
    drop(op_key);
    drop(fill);

    let mut edges: Vec<Edge> = Vec::new();
    let mut kc = KeyScratch::default();
    for k in 0..keys.len() {
        let group = &ops[start[k] as usize..start[k + 1] as usize];
        check_key(
            k as u32, keys[k], group, recs, &node_of, &mut kc, &mut edges, &mut rep,
        );
    }
    drop(ops);

    for e in &edges {
        match e.kind {
            WW => rep.edges.ww += 1,
            WR => rep.edges.wr += 1,
            _ => rep.edges.rw += 1,
        }
    }
    let g = Graph::new(rec_of.len(), edges);
    let ctx = Ctx {
        g: &g,
        recs,
        rec_of: &rec_of,
        keys: &keys,
    };
    cycles(&ctx, &mut rep);

    rep.valid = rep.anomalies.is_empty();
    rep
}

fn duplicate_ids(recs: &[TxnRecord], rep: &mut CheckReport) {
    let mut ids: Vec<(u64, u32)> = recs
        .iter()
        .enumerate()
        .map(|(i, r)| (r.id, i as u32))
        .collect();
    ids.sort_unstable();
    for w in ids.windows(2) {
        if w[0].0 == w[1].0 {
            rep.add(Witness {
                anomaly: Anomaly::DuplicateId,
                txns: vec![w[0].0],
                edges: vec![],
                detail: format!("two records have id {}", w[0].0),
            });
        }
    }
}

/// A committed transaction that read key k at version v and wrote k over a
/// different version overwrote a write it never saw.
fn lost_updates(recs: &[TxnRecord], rep: &mut CheckReport) {
    for r in recs.iter().filter(|r| r.outcome == Outcome::Committed) {
        if r.reads.is_empty() || r.writes.is_empty() {
            continue;
        }
        // Transactions are usually small; index only the big ones.
        let big = r.reads.len() * r.writes.len() > 1024;
        let index: FxMap<(u32, u64), Vec<u64>> = if big {
            let mut m: FxMap<(u32, u64), Vec<u64>> = FxMap::default();
            for x in &r.reads {
                m.entry((x.table, x.key)).or_default().push(x.version);
            }
            m
        } else {
            FxMap::default()
        };
        for w in &r.writes {
            let stale = |v: u64| v != w.prev_version && v != r.id;
            let bad = if big {
                index
                    .get(&(w.table, w.key))
                    .and_then(|vs| vs.iter().copied().find(|&v| stale(v)))
            } else {
                r.reads
                    .iter()
                    .filter(|x| x.table == w.table && x.key == w.key)
                    .map(|x| x.version)
                    .find(|&v| stale(v))
            };
            if let Some(v) = bad {
                rep.add(Witness {
                    anomaly: Anomaly::LostUpdate,
                    txns: vec![r.id, w.prev_version],
                    edges: vec![],
                    detail: format!(
                        "T{} read table {} key {} at version {v} but its write overwrote version {}",
                        r.id, w.table, w.key, w.prev_version
                    ),
                });
            }
        }
    }
}

#[derive(Default)]
struct KeyScratch {
    /// Committed writes (version, prev, node, rec), sorted by version.
    cw: Vec<(u64, u64, u32, u32)>,
    /// Indices into `cw`, sorted by prev.
    by_prev: Vec<u32>,
    /// Aborted writes (version, rec), sorted by version.
    aw: Vec<(u64, u32)>,
    roots: Vec<u32>,
    initial: Vec<u64>,
    values: Vec<(u64, u64, u32)>,
}

#[allow(clippy::too_many_arguments)]
fn check_key(
    kidx: u32,
    (table, key): (u32, u64),
    group: &[Op],
    recs: &[TxnRecord],
    node_of: &[u32],
    s: &mut KeyScratch,
    edges: &mut Vec<Edge>,
    rep: &mut CheckReport,
) {
    s.cw.clear();
    s.aw.clear();
    s.by_prev.clear();
    s.roots.clear();
    s.initial.clear();
    s.values.clear();
    for op in group {
        s.values.push((op.version, op.vhash, op.rec));
        match op.kind {
            CW => {
                s.cw.push((op.version, op.prev, node_of[op.rec as usize], op.rec))
            }
            AW => s.aw.push((op.version, op.rec)),
            _ => {}
        }
    }
    let id = |rec: u32| recs[rec as usize].id;
    let at = format!("table {table} key {key}");

    // One write per (transaction, key): a second is a malformed record.
    s.cw.sort_unstable();
    let before = s.cw.len();
    s.cw.dedup_by_key(|w| w.0);
    if s.cw.len() != before {
        rep.add(Witness {
            anomaly: Anomaly::DuplicateWrite,
            txns: vec![],
            edges: vec![],
            detail: format!("{at}: some committed transaction wrote it more than once"),
        });
    }
    s.aw.sort_unstable();
    s.aw.dedup_by_key(|w| w.0);
    let cw = &s.cw;
    let committed_writer = |v: u64| cw.binary_search_by_key(&v, |w| w.0).ok();
    let aborted_writer = |v: u64| {
        s.aw.binary_search_by_key(&v, |w| w.0)
            .ok()
            .map(|i| s.aw[i].1)
    };

    s.by_prev.extend(0..cw.len() as u32);
    s.by_prev.sort_unstable_by_key(|&i| cw[i as usize].1);
    for p in s.by_prev.windows(2) {
        let (a, b) = (cw[p[0] as usize], cw[p[1] as usize]);
        if a.1 == b.1 {
            rep.add(Witness {
                anomaly: Anomaly::ForkedChain,
                txns: vec![id(a.3), id(b.3)],
                edges: vec![],
                detail: format!(
                    "{at}: T{} and T{} both overwrote version {}",
                    id(a.3),
                    id(b.3),
                    a.1
                ),
            });
        }
    }
    let successors = |v: u64| -> &[u32] {
        let lo = s.by_prev.partition_point(|&i| cw[i as usize].1 < v);
        let hi = s.by_prev.partition_point(|&i| cw[i as usize].1 <= v);
        &s.by_prev[lo..hi]
    };

    // ww edges along the chain; writes over unknown versions are roots.
    for (i, w) in cw.iter().enumerate() {
        match committed_writer(w.1) {
            Some(p) => edges.push(Edge {
                from: cw[p].2,
                to: w.2,
                kind: WW,
                key: kidx,
            }),
            None => {
                s.roots.push(i as u32);
                if let Some(a) = aborted_writer(w.1) {
                    rep.add(Witness {
                        anomaly: Anomaly::DirtyOverwrite,
                        txns: vec![id(w.3), id(a)],
                        edges: vec![],
                        detail: format!(
                            "{at}: T{} overwrote version {}, written by aborted T{}",
                            id(w.3),
                            w.1,
                            id(a)
                        ),
                    });
                } else {
                    s.initial.push(w.1);
                }
            }
        }
    }

    for op in group {
        match op.kind {
            CR => {
                let reader = node_of[op.rec as usize];
                let v = op.version;
                if let Some(wi) = committed_writer(v) {
                    let w = cw[wi].2;
                    if w != reader {
                        edges.push(Edge {
                            from: w,
                            to: reader,
                            kind: WR,
                            key: kidx,
                        });
                    }
                    for &si in successors(v) {
                        let t = cw[si as usize].2;
                        if t != reader {
                            edges.push(Edge {
                                from: reader,
                                to: t,
                                kind: RW,
                                key: kidx,
                            });
                        }
                    }
                } else if let Some(a) = aborted_writer(v) {
                    rep.add(Witness {
                        anomaly: Anomaly::G1a,
                        txns: vec![id(op.rec), id(a)],
                        edges: vec![],
                        detail: format!(
                            "{at}: committed T{} read version {v}, written by aborted T{}",
                            id(op.rec),
                            id(a)
                        ),
                    });
                } else {
                    // An initial (T0) version: it precedes every chain root.
                    s.initial.push(v);
                    let succ = successors(v);
                    let succ = if succ.is_empty() { &s.roots[..] } else { succ };
                    for &si in succ {
                        let t = cw[si as usize].2;
                        if t != reader {
                            edges.push(Edge {
                                from: reader,
                                to: t,
                                kind: RW,
                                key: kidx,
                            });
                        }
                    }
                }
            }
            AR => {
                if let Some(a) = aborted_writer(op.version) {
                    if a != op.rec {
                        *rep.warnings
                            .entry(Warning::AbortedReadInAborted)
                            .or_insert(0) += 1;
                    }
                }
            }
            _ => {}
        }
    }

    s.initial.sort_unstable();
    s.initial.dedup();
    if s.initial.len() > 1 {
        rep.add(Witness {
            anomaly: Anomaly::ConflictingInitialVersions,
            txns: vec![],
            edges: vec![],
            detail: format!(
                "{at}: versions {:?} were read or overwritten but written by no transaction in the history",
                &s.initial[..s.initial.len().min(8)]
            ),
        });
    }

    s.values.sort_unstable();
    for p in s.values.windows(2) {
        if p[0].0 == p[1].0 && p[0].1 != p[1].1 {
            rep.add(Witness {
                anomaly: Anomaly::ValueMismatch,
                txns: vec![id(p[0].2), id(p[1].2)],
                edges: vec![],
                detail: format!(
                    "{at}: version {} seen with different values by T{} and T{}",
                    p[0].0,
                    id(p[0].2),
                    id(p[1].2)
                ),
            });
            break; // one report per key is enough
        }
    }
}

/// Adjacency in CSR form.
struct Graph {
    offs: Vec<u32>,
    to: Vec<u32>,
    kind: Vec<u8>,
    key: Vec<u32>,
}

impl Graph {
    fn new(n: usize, edges: Vec<Edge>) -> Graph {
        let mut offs = vec![0u32; n + 1];
        for e in &edges {
            offs[e.from as usize + 1] += 1;
        }
        for i in 0..n {
            offs[i + 1] += offs[i];
        }
        let mut fill = offs.clone();
        let m = edges.len();
        let (mut to, mut kind, mut key) = (vec![0u32; m], vec![0u8; m], vec![0u32; m]);
        for e in edges {
            let p = fill[e.from as usize] as usize;
            fill[e.from as usize] += 1;
            to[p] = e.to;
            kind[p] = e.kind;
            key[p] = e.key;
        }
        Graph {
            offs,
            to,
            kind,
            key,
        }
    }

    fn len(&self) -> usize {
        self.offs.len() - 1
    }

    fn out(&self, v: u32) -> std::ops::Range<usize> {
        self.offs[v as usize] as usize..self.offs[v as usize + 1] as usize
    }
}

struct Ctx<'a> {
    g: &'a Graph,
    recs: &'a [TxnRecord],
    rec_of: &'a [u32],
    keys: &'a [(u32, u64)],
}

impl Ctx<'_> {
    fn id(&self, node: u32) -> u64 {
        self.recs[self.rec_of[node as usize] as usize].id
    }

    fn witness_edges(&self, path: &[usize], from: u32) -> Vec<WitnessEdge> {
        let mut out = Vec::with_capacity(path.len());
        let mut cur = from;
        for &e in path {
            let to = self.g.to[e];
            let (table, key) = self.keys[self.g.key[e] as usize];
            out.push(WitnessEdge {
                from: self.id(cur),
                to: self.id(to),
                kind: EdgeKind::from_bit(self.g.kind[e]),
                table,
                key,
            });
            cur = to;
        }
        out
    }
}

/// Per-node scratch arrays, reused across searches; each search restores
/// what it touched, so repeated searches in small components stay cheap.
struct Scratch {
    index: Vec<u32>,
    low: Vec<u32>,
    on_stack: Vec<bool>,
    /// Membership of the component being searched (a stamp per search).
    member: Vec<u32>,
    seen: Vec<u32>,
    parent: Vec<u32>,
    stamp: u32,
}

const UNVISITED: u32 = u32::MAX;

impl Scratch {
    fn new(n: usize) -> Scratch {
        Scratch {
            index: vec![UNVISITED; n],
            low: vec![0; n],
            on_stack: vec![false; n],
            member: vec![0; n],
            seen: vec![0; n],
            parent: vec![0; n],
            stamp: 0,
        }
    }

    fn next_stamp(&mut self) -> u32 {
        self.stamp += 1;
        self.stamp
    }
}

/// Nontrivial strongly connected components of the subgraph induced by
/// `nodes` (those with `member == mark`, or all if `mark == 0`) using edges
/// whose kind is in `mask`. Iterative Tarjan.
fn sccs(g: &Graph, nodes: &[u32], mark: u32, mask: u8, sc: &mut Scratch) -> Vec<Vec<u32>> {
    let inside = |sc: &Scratch, v: u32| mark == 0 || sc.member[v as usize] == mark;
    let mut out = Vec::new();
    let mut counter = 0u32;
    let mut stack: Vec<u32> = Vec::new();
    let mut call: Vec<(u32, usize)> = Vec::new();
    let mut visited: Vec<u32> = Vec::new();
    for &s in nodes {
        if sc.index[s as usize] != UNVISITED {
            continue;
        }
        let enter = |v: u32,
                     sc: &mut Scratch,
                     counter: &mut u32,
                     stack: &mut Vec<u32>,
                     visited: &mut Vec<u32>| {
            sc.index[v as usize] = *counter;
            sc.low[v as usize] = *counter;
            *counter += 1;
            sc.on_stack[v as usize] = true;
            stack.push(v);
            visited.push(v);
        };
        enter(s, sc, &mut counter, &mut stack, &mut visited);
        call.push((s, g.offs[s as usize] as usize));
        while let Some(&mut (v, ref mut ei)) = call.last_mut() {
            let end = g.offs[v as usize + 1] as usize;
            if *ei < end {
                let e = *ei;
                *ei += 1;
                let w = g.to[e];
                if g.kind[e] & mask == 0 || !inside(sc, w) {
                    continue;
                }
                if sc.index[w as usize] == UNVISITED {
                    enter(w, sc, &mut counter, &mut stack, &mut visited);
                    call.push((w, g.offs[w as usize] as usize));
                } else if sc.on_stack[w as usize] {
                    sc.low[v as usize] = sc.low[v as usize].min(sc.index[w as usize]);
                }
            } else {
                call.pop();
                if let Some(&(u, _)) = call.last() {
                    sc.low[u as usize] = sc.low[u as usize].min(sc.low[v as usize]);
                }
                if sc.low[v as usize] == sc.index[v as usize] {
                    let mut comp = Vec::new();
                    loop {
                        let w = stack.pop().expect("tarjan stack holds v");
                        sc.on_stack[w as usize] = false;
                        comp.push(w);
                        if w == v {
                            break;
                        }
                    }
                    if comp.len() > 1 {
                        out.push(comp);
                    }
                }
            }
        }
    }
    for v in visited {
        sc.index[v as usize] = UNVISITED;
    }
    out
}

/// Shortest path (as edge indices) from `src` to `dst` inside the component
/// marked `mark`, over edges in `mask`; `src == dst` finds a shortest cycle.
/// Gives up after `budget` edge scans.
fn bfs_path(
    g: &Graph,
    src: u32,
    dst: u32,
    mark: u32,
    mask: u8,
    sc: &mut Scratch,
    budget: &mut u64,
) -> Option<Vec<usize>> {
    let stamp = sc.next_stamp();
    let mut queue = std::collections::VecDeque::new();
    queue.push_back(src);
    sc.seen[src as usize] = stamp;
    while let Some(v) = queue.pop_front() {
        for e in g.out(v) {
            if *budget == 0 {
                return None;
            }
            *budget -= 1;
            let w = g.to[e];
            if g.kind[e] & mask == 0 || sc.member[w as usize] != mark {
                continue;
            }
            if w == dst {
                let mut path = vec![e];
                let mut cur = v;
                while cur != src {
                    let pe = sc.parent[cur as usize] as usize;
                    path.push(pe);
                    cur = source_of(g, pe);
                }
                path.reverse();
                return Some(path);
            }
            if sc.seen[w as usize] != stamp {
                sc.seen[w as usize] = stamp;
                sc.parent[w as usize] = e as u32;
                queue.push_back(w);
            }
        }
    }
    None
}

/// The tail of edge `e` (CSR stores heads only).
fn source_of(g: &Graph, e: usize) -> u32 {
    (g.offs.partition_point(|&o| o as usize <= e) - 1) as u32
}

fn cycles(ctx: &Ctx, rep: &mut CheckReport) {
    let g = ctx.g;
    let mut sc = Scratch::new(g.len());
    let all: Vec<u32> = (0..g.len() as u32).collect();
    let comps = sccs(g, &all, 0, ALL, &mut sc);
    rep.cyclic_components = comps.len() as u64;
    for comp in comps {
        let mark = sc.next_stamp();
        for &v in &comp {
            sc.member[v as usize] = mark;
        }
        classify(ctx, &comp, mark, &mut sc, rep);
    }
}

/// Reports the most severe cycle kind in one cyclic component, with a short
/// witness cycle.
fn classify(ctx: &Ctx, comp: &[u32], mark: u32, sc: &mut Scratch, rep: &mut CheckReport) {
    let g = ctx.g;
    let mut unlimited = u64::MAX;
    // G0, then G1c: a cycle within the ww (resp. ww+wr) subgraph.
    for (kind, mask) in [(Anomaly::G0, WW), (Anomaly::G1c, WW | WR)] {
        if let Some(sub) = sccs(g, comp, mark, mask, sc).into_iter().next() {
            let submark = sc.next_stamp();
            for &v in &sub {
                sc.member[v as usize] = submark;
            }
            let path = bfs_path(g, sub[0], sub[0], submark, mask, sc, &mut unlimited)
                .expect("an SCC has a cycle");
            for &v in comp {
                sc.member[v as usize] = mark;
            }
            return report_cycle(ctx, kind, sub[0], &path, rep);
        }
    }
    // G-single: an rw edge u->v closed by a ww/wr path v ~> u.
    let mut budget = GSINGLE_BUDGET;
    let mut best: Option<(u32, Vec<usize>)> = None;
    'search: for &u in comp {
        for e in g.out(u) {
            let v = g.to[e];
            if g.kind[e] != RW || sc.member[v as usize] != mark {
                continue;
            }
            if let Some(p) = bfs_path(g, v, u, mark, WW | WR, sc, &mut budget) {
                let mut path = vec![e];
                path.extend(p);
                if !matches!(&best, Some(b) if b.1.len() <= path.len()) {
                    best = Some((u, path));
                }
                if best.as_ref().is_some_and(|b| b.1.len() <= 2) {
                    break 'search; // no shorter cycle exists
                }
            }
            if budget == 0 {
                break 'search;
            }
        }
    }
    if let Some((u, path)) = best {
        return report_cycle(ctx, Anomaly::GSingle, u, &path, rep);
    }
    if budget == 0 {
        *rep.warnings
            .entry(Warning::GSingleSearchIncomplete)
            .or_insert(0) += 1;
    }
    let path =
        bfs_path(g, comp[0], comp[0], mark, ALL, sc, &mut unlimited).expect("an SCC has a cycle");
    report_cycle(ctx, Anomaly::G2, comp[0], &path, rep)
}

fn report_cycle(ctx: &Ctx, kind: Anomaly, from: u32, path: &[usize], rep: &mut CheckReport) {
    let edges = ctx.witness_edges(path, from);
    let txns: Vec<u64> = edges.iter().map(|e| e.from).collect();
    let rw = edges.iter().filter(|e| e.kind == EdgeKind::Rw).count();
    let detail = format!(
        "cycle of {} transactions ({} rw edge{}): {}",
        txns.len(),
        rw,
        if rw == 1 { "" } else { "s" },
        txns.iter()
            .map(|t| format!("T{t}"))
            .collect::<Vec<_>>()
            .join(" -> ")
    );
    rep.add(Witness {
        anomaly: kind,
        txns,
        edges,
        detail,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tarjan_finds_nested_cycles() {
        // 0->1->2->0 and 3->4->3, 2->3.
        let mk = |f: u32, t: u32| Edge {
            from: f,
            to: t,
            kind: WW,
            key: 0,
        };
        let g = Graph::new(
            5,
            vec![mk(0, 1), mk(1, 2), mk(2, 0), mk(2, 3), mk(3, 4), mk(4, 3)],
        );
        let mut sc = Scratch::new(5);
        let all: Vec<u32> = (0..5).collect();
        let mut c: Vec<Vec<u32>> = sccs(&g, &all, 0, ALL, &mut sc)
            .into_iter()
            .map(|mut v| {
                v.sort();
                v
            })
            .collect();
        c.sort();
        assert_eq!(c, vec![vec![0, 1, 2], vec![3, 4]]);
        assert_eq!(source_of(&g, 3), 2);
    }

    #[test]
    fn long_chain_no_stack_overflow() {
        let n = 300_000u32;
        let edges = (0..n)
            .map(|i| Edge {
                from: i,
                to: (i + 1) % n,
                kind: WW,
                key: 0,
            })
            .collect();
        let g = Graph::new(n as usize, edges);
        let mut sc = Scratch::new(n as usize);
        let all: Vec<u32> = (0..n).collect();
        let c = sccs(&g, &all, 0, ALL, &mut sc);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].len(), n as usize);
    }
}
