//! Multi-process runs: what one node process reports ([`NodeReport`]) and how the
//! launcher combines the reports into the same [`BenchReport`] as an in-process run
//! ([`combine_node_reports`]), comparing every backup's rows with its primary's. A node
//! report arrives from another process, so everything in it is checked.

use crate::bench::driver::{
    assemble_report, BenchReport, ReportParts, Tally, TypeReport, WorkloadVisitor,
};
use crate::bench::report::PolicyReport;
use crate::bench::BenchError;
use crate::config::Config;
use crate::workload::{Registry, Workload};
use ambidex_rpc::RpcStats;
use ambidex_transport::CounterSnapshot;
use ambidex_txn::stats::{LocationCacheStats, LogRingStats, PhaseMap};
use ambidex_txn::{AbortReason, NodeDb, Phase, Placement, Policy, TxnStats};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What one node process reports after a run (the `report` message of the control
/// protocol, docs/cluster.md). Everything is additive over nodes except `max_rss_bytes`
/// (the launcher takes the largest). It arrives from another process: the launcher
/// treats it as untrusted input.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NodeReport {
    /// The reporting node's id.
    pub node: u16,
    /// The transaction policy this node's threads ran (required: the launcher refuses a
    /// report without it, or with another policy than the cluster's).
    pub policy: Policy,
    /// Wall time (s) this node took to build its tables and load its share of the
    /// workload.
    pub load_seconds: f64,
    /// Wall time of this node's measured window (between `measure` and `stop`).
    pub measured_s: f64,
    /// User + system CPU seconds of this node's process over its measured window.
    pub cpu_seconds: f64,
    /// Peak resident set size of this node's process.
    pub max_rss_bytes: u64,
    /// Per transaction type (the workload's order): committed, aborted, found, not found.
    pub per_type: Vec<TypeReport>,
    /// Aborted attempts in the measured window, by abort reason (`AbortReason::name`).
    pub aborts_by_reason: BTreeMap<String, u64>,
    /// The latency histogram of committed transactions (ns) as raw counts:
    /// `[value, count]` per recorded bucket (its highest equivalent value).
    pub latency_ns: Vec<[u64; 2]>,
    /// `TxnStats` of this node's threads (as serialized).
    pub txn_layer: serde_json::Value,
    /// `RpcStats` of this node's threads (as serialized).
    pub rpc: serde_json::Value,
    /// The transport's counters (datagrams, one-sided operations, drops and errors),
    /// summed over this node's endpoints, whole run.
    pub transport_counters: CounterSnapshot,
    /// Worker coroutines of this node that had not returned when the run ended; a
    /// correct run has none.
    pub stuck_workers: usize,
    /// The workload's [`Workload::check_node`] result...
    pub check: serde_json::Value,
    /// ...or the violation it found.
    #[serde(default)]
    pub check_violation: Option<String>,
    /// Digests of the rows this node stores, per (table, primary node): what
    /// [`combine_node_reports`] compares between a primary and its backups.
    #[serde(default)]
    pub replica_digests: Vec<ReplicaDigest>,
    /// Other nodes' tables this node's start-up check verified one-sided.
    #[serde(default)]
    pub remote_tables_verified: u64,
    /// Committed transactions per 10 ms since this node's `start` (warmup included).
    #[serde(default)]
    pub timeline_10ms: Vec<u32>,
    /// When (system clock, ns since the Unix epoch) this node's first commit that
    /// touched a key whose primary was on a node removed during the run ended
    /// (`null`: none).
    #[serde(default)]
    pub first_lost_commit_ns: Option<u64>,
    /// With the etcd manager: the membership events this node's client published
    /// (system clock, ns since the Unix epoch; each change is published by one node).
    #[serde(default)]
    pub manager_events: Vec<ambidex_cluster::Event>,
}

/// An order-independent digest of the rows of `table` in placement partition
/// `partition`, as stored on one node (its primary or one of its backups). Deletes count
/// (as their tombstones); keys that never existed do not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaDigest {
    /// The table's id.
    pub table: u32,
    /// The placement partition (`Placement::partition`) the rows belong to.
    pub partition: u32,
    /// Rows stored, delete tombstones included.
    pub rows: u64,
    /// Wrapping sum of a 64-bit hash of (key, transaction version, value) per row.
    pub sum: u64,
}

fn row_hash(key: u64, meta: u64, value: &[u8]) -> u64 {
    // FNV-1a over the value, mixed with the key and the version word.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in value {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mut x = h ^ key.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ meta.rotate_left(29);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// The digests of every table of `db` (after a run, on the quiescent node).
pub fn replica_digests<W: Workload>(wl: &W, db: &NodeDb) -> Vec<ReplicaDigest> {
    let placement = db.placement();
    let mut map: BTreeMap<(u32, u32), ReplicaDigest> = BTreeMap::new();
    for spec in wl.tables() {
        for (key, meta, value) in db.dump(spec.id) {
            // A version-0 tombstone is a key that never existed: an aborted insert leaves
            // one at the primary only. Deletes leave tombstones with their version.
            if meta == ambidex_txn::db::TOMBSTONE {
                continue;
            }
            let partition = placement.partition(spec.id, key);
            let d = map.entry((spec.id, partition)).or_insert(ReplicaDigest {
                table: spec.id,
                partition,
                ..Default::default()
            });
            d.rows += 1;
            d.sum = d.sum.wrapping_add(row_hash(key, meta, value.as_slice()));
        }
    }
    map.into_values().collect()
}

impl NodeReport {
    /// Packs one node's tally and counters.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        node: u16,
        tally: Tally,
        txn: &TxnStats,
        rpc: &RpcStats,
        transport_counters: CounterSnapshot,
        stuck_workers: usize,
        check: Result<serde_json::Value, String>,
        replica_digests: Vec<ReplicaDigest>,
    ) -> NodeReport {
        let (check, check_violation) = match check {
            Ok(v) => (v, None),
            Err(e) => (serde_json::Value::Null, Some(e)),
        };
        NodeReport {
            node,
            timeline_10ms: tally.timeline,
            first_lost_commit_ns: tally.first_lost_commit_ns,
            manager_events: Vec::new(),
            per_type: tally.per_type,
            aborts_by_reason: tally.aborts,
            latency_ns: tally
                .hist
                .iter_recorded()
                .map(|v| [v.value_iterated_to(), v.count_at_value()])
                .collect(),
            txn_layer: serde_json::to_value(txn).unwrap_or_default(),
            rpc: serde_json::to_value(rpc).unwrap_or_default(),
            transport_counters,
            stuck_workers,
            check,
            check_violation,
            replica_digests,
            ..Default::default()
        }
    }
}

/// A node whose transaction policy is not the cluster's: its transactions would follow
/// another protocol than their participants expect (a CAS lock that an RPC commit never
/// releases, a log written where nobody reads it), so the run is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NodePolicyError {
    /// The node's `ready` event or report has no `policy`, or one that does not parse.
    #[error("node {node} did not say which transaction policy it runs: {why}")]
    Unreadable {
        /// The node.
        node: u16,
        /// What is missing or malformed.
        why: String,
    },
    /// The node runs another policy than the cluster's.
    #[error(
        "node {node} runs transaction policy {ran}, the cluster's is {expected}: every node \
         must run the same policy (does its configuration differ from the launcher's?)"
    )]
    Mismatch {
        /// The node.
        node: u16,
        /// The policy the node runs.
        ran: PolicyReport,
        /// The cluster's policy (the launcher's configuration).
        expected: PolicyReport,
    },
}

/// The policy node `node` says it runs (the `policy` of its `ready` event or report).
pub fn node_policy(node: u16, said: Option<&serde_json::Value>) -> Result<Policy, NodePolicyError> {
    let v = said.ok_or_else(|| NodePolicyError::Unreadable {
        node,
        why: "no \"policy\" field".into(),
    })?;
    Policy::deserialize(v).map_err(|e| NodePolicyError::Unreadable {
        node,
        why: e.to_string(),
    })
}

/// Refuses a node that runs `ran` in a cluster that runs `expected`.
pub fn same_policy(node: u16, ran: Policy, expected: Policy) -> Result<(), NodePolicyError> {
    if ran == expected {
        Ok(())
    } else {
        Err(NodePolicyError::Mismatch {
            node,
            ran: ran.into(),
            expected: expected.into(),
        })
    }
}

/// Merges the reports of every node (one per node, any order) into the run's report.
/// `elapsed` is the measured window as the launcher timed it.
pub fn combine_node_reports(
    reg: &Registry,
    cfg: &Config,
    transport: &str,
    elapsed: f64,
    reports: Vec<NodeReport>,
) -> Result<BenchReport, CombineError> {
    combine_live_reports(reg, cfg, transport, elapsed, reports, None)
}

/// As [`combine_node_reports`], for a run in which nodes may have died: `survivors`
/// is the manager's final placement, and the reports are those of the nodes still
/// alive (any subset, at most one each). Replicas are compared over the up-to-date
/// copies of that placement that reported (a dead node's copies are not there to
/// compare; a copy still syncing is not expected to match yet). `None`: every node
/// must report, in the initial placement.
pub fn combine_live_reports(
    reg: &Registry,
    cfg: &Config,
    transport: &str,
    elapsed: f64,
    reports: Vec<NodeReport>,
    survivors: Option<Placement>,
) -> Result<BenchReport, CombineError> {
    let cfg = &reg.resolve(cfg)?;
    reg.entry(&cfg.run.workload)?.combine(
        cfg,
        Combine {
            cfg,
            transport,
            elapsed,
            reports,
            survivors,
        },
    )
}

/// [`combine`] for a registered workload.
pub(crate) struct Combine<'a> {
    cfg: &'a Config,
    transport: &'a str,
    elapsed: f64,
    reports: Vec<NodeReport>,
    survivors: Option<Placement>,
}

impl WorkloadVisitor<BenchReport, CombineError> for Combine<'_> {
    fn visit<W: Workload>(self, wl: Arc<W>, p: Placement) -> Result<BenchReport, CombineError> {
        let partial = self.survivors.is_some();
        combine(
            self.cfg,
            &*wl,
            self.survivors.unwrap_or(p),
            partial,
            self.transport,
            self.elapsed,
            self.reports,
        )
    }
}

fn combine<W: Workload>(
    cfg: &Config,
    wl: &W,
    placement: Placement,
    partial: bool,
    transport: &str,
    elapsed: f64,
    mut reports: Vec<NodeReport>,
) -> Result<BenchReport, CombineError> {
    reports.sort_by_key(|r| r.node);
    let nodes: Vec<u16> = reports.iter().map(|r| r.node).collect();
    let every = (0..cfg.cluster.nodes).collect::<Vec<_>>();
    let fits = if partial {
        !nodes.is_empty()
            && nodes.windows(2).all(|w| w[0] < w[1])
            && nodes.iter().all(|&n| n < cfg.cluster.nodes)
    } else {
        nodes == every
    };
    if !fits {
        return Err(CombineError::Reports {
            partial,
            nodes: cfg.cluster.nodes,
            got: nodes,
        });
    }
    if placement.nodes() != cfg.cluster.nodes {
        return Err(CombineError::PlacementNodes {
            placement: placement.nodes(),
            run: cfg.cluster.nodes,
        });
    }
    let mut timeline: Vec<u32> = Vec::new();
    let mut first_lost: Option<u64> = None;
    let policy = cfg.policy().map_err(BenchError::from)?;
    let types = wl.txn_types().len();
    let mut tally = Tally::new(types);
    let (mut txn, mut rpc) = (TxnStats::default(), RpcStats::default());
    let mut counters = CounterSnapshot::default();
    let (mut cpu, mut rss, mut stuck, mut load) = (0.0, 0u64, 0usize, 0.0f64);
    let mut parts = Vec::new();
    let mut violations = Vec::new();
    for r in &reports {
        let n = r.node;
        plausible(r).map_err(|what| CombineError::Implausible { node: n, what })?;
        same_policy(n, r.policy, policy)?;
        if r.per_type.len() != types {
            return Err(CombineError::TxnTypes {
                node: n,
                reported: r.per_type.len(),
                types,
            });
        }
        for (a, b) in tally.per_type.iter_mut().zip(&r.per_type) {
            a.committed = a.committed.saturating_add(b.committed);
            a.aborted = a.aborted.saturating_add(b.aborted);
            a.retries = a.retries.saturating_add(b.retries);
            a.gave_up = a.gave_up.saturating_add(b.gave_up);
            a.found = a.found.saturating_add(b.found);
            a.not_found = a.not_found.saturating_add(b.not_found);
        }
        for (k, v) in &r.aborts_by_reason {
            let e = tally.aborts.entry(k.clone()).or_insert(0);
            *e = e.saturating_add(*v);
        }
        for &[value, count] in &r.latency_ns {
            tally
                .hist
                .record_n(value.max(1), count)
                .map_err(|e| CombineError::Histogram {
                    node: n,
                    why: format!("{e:?}"),
                })?;
        }
        let counters_of = |source| CombineError::Counters { node: n, source };
        txn.merge(&txn_stats_from_json(&r.txn_layer).map_err(counters_of)?);
        rpc.merge(&rpc_stats_from_json(&r.rpc).map_err(counters_of)?);
        counters.merge(&r.transport_counters);
        if !(r.cpu_seconds.is_finite() && r.cpu_seconds >= 0.0) {
            return Err(CombineError::CpuSeconds {
                node: n,
                seconds: r.cpu_seconds,
            });
        }
        cpu += r.cpu_seconds;
        rss = rss.max(r.max_rss_bytes);
        stuck = stuck.saturating_add(r.stuck_workers);
        if r.load_seconds.is_finite() {
            load = load.max(r.load_seconds);
        }
        crate::bench::driver::add_timeline(&mut timeline, &r.timeline_10ms);
        first_lost = crate::bench::driver::min_some(first_lost, r.first_lost_commit_ns);
        match &r.check_violation {
            Some(v) => violations.push(format!("node {n}: {v}")),
            None => parts.push(r.check.clone()),
        }
    }
    let check = if !violations.is_empty() {
        Err(violations.join("; "))
    } else {
        wl.check_combine(&parts)
            .map_err(|e| e.to_string())
            .and_then(|summary| {
                let replicas = compare_replicas(&reports, &placement).map_err(|e| e.to_string())?;
                Ok(match summary {
                    serde_json::Value::Object(mut m) => {
                        m.insert("replica_rows_compared".into(), replicas.into());
                        serde_json::Value::Object(m)
                    }
                    // A workload with no invariant of its own (TATP): its replicas were
                    // still compared.
                    serde_json::Value::Null => {
                        serde_json::json!({ "replica_rows_compared": replicas })
                    }
                    other => other,
                })
            })
    };
    let mut r = assemble_report(
        cfg,
        wl,
        ReportParts {
            transport,
            policy,
            coroutines: cfg.coroutines(),
            tally,
            elapsed,
            cpu,
            txn,
            rpc,
            transport_counters: counters,
            max_rss_bytes: rss,
            stuck_workers: stuck,
            check,
        },
    );
    r.load_seconds = load;
    r.remote_tables_verified = reports.iter().map(|n| n.remote_tables_verified).collect();
    r.timeline_10ms = timeline.iter().map(|&c| c as u64).collect();
    r.first_lost_commit_ns = first_lost;
    Ok(r)
}

/// Largest counter accepted from a node report: far above any real run, and low enough
/// that sums over nodes cannot overflow.
const MAX_COUNT: u64 = 1 << 56;

/// Rejects counters no run can produce (a node report is input from another process).
fn plausible(r: &NodeReport) -> Result<(), Implausible> {
    let big = |what: &str, value: u64| {
        if value > MAX_COUNT {
            Err(Implausible::Count {
                what: what.into(),
                value,
            })
        } else {
            Ok(())
        }
    };
    for t in &r.per_type {
        for v in [
            t.committed,
            t.aborted,
            t.retries,
            t.gave_up,
            t.found,
            t.not_found,
        ] {
            big("a transaction count", v)?;
        }
    }
    for (k, v) in &r.aborts_by_reason {
        big(k, *v)?;
    }
    for [_, c] in &r.latency_ns {
        big("a latency count", *c)?;
    }
    for (k, v) in &r.transport_counters.0 {
        big(k, *v)?;
    }
    big("stuck_workers", r.stuck_workers as u64)?;
    if r.timeline_10ms.len() > crate::bench::driver::TIMELINE_MAX_BUCKETS {
        return Err(Implausible::Timeline(r.timeline_10ms.len()));
    }
    for (what, x) in [("txn_layer", &r.txn_layer), ("rpc", &r.rpc)] {
        let mut stack = vec![x];
        while let Some(v) = stack.pop() {
            match v {
                serde_json::Value::Number(n) => {
                    big(what, n.as_u64().unwrap_or(0))?;
                }
                serde_json::Value::Array(a) => stack.extend(a),
                serde_json::Value::Object(m) => stack.extend(m.values()),
                _ => {}
            }
        }
    }
    Ok(())
}

/// Every backup holds exactly its primary's rows (same keys, versions and values) once
/// the cluster is quiescent. Returns the backup rows compared.
fn compare_replicas(reports: &[NodeReport], placement: &Placement) -> Result<u64, ReplicaError> {
    // (table, partition) -> per holding node, its digest.
    let mut groups: BTreeMap<(u32, u32), BTreeMap<u16, ReplicaDigest>> = BTreeMap::new();
    let reported: Vec<u16> = reports.iter().map(|r| r.node).collect();
    // A node the manager removed while it still ran (its lease ran out) holds copies
    // nobody reads any more: they are not compared.
    for r in reports.iter().filter(|r| placement.is_member(r.node)) {
        for d in &r.replica_digests {
            groups
                .entry((d.table, d.partition))
                .or_default()
                .insert(r.node, *d);
        }
    }
    let mut compared = 0u64;
    for ((table, partition), holders) in &groups {
        if *partition >= placement.partitions() {
            return Err(ReplicaError::NoSuchPartition {
                partition: *partition,
                partitions: placement.partitions(),
            });
        }
        let all = placement.replicas_of(*partition);
        // The up-to-date copies whose node reported (every copy, in a run where no
        // node died): a dead node's rows are not there, a syncing copy's are partial.
        let replicas: Vec<u16> = placement
            .up_to_date_of(*partition)
            .filter(|n| reported.contains(n))
            .collect();
        let Some(&primary) = replicas.first() else {
            continue;
        };
        let missing = |_: u16| ReplicaDigest {
            table: *table,
            partition: *partition,
            ..Default::default()
        };
        let reference = holders.get(&primary).copied().unwrap_or(missing(primary));
        for &b in &replicas[1..] {
            let got = holders.get(&b).copied().unwrap_or(missing(b));
            if got != reference {
                return Err(ReplicaError::Differ {
                    table: *table,
                    partition: *partition,
                    primary,
                    primary_digest: reference,
                    backup: b,
                    backup_digest: got,
                });
            }
            compared += got.rows;
        }
        if let Some(extra) = holders.keys().find(|n| !all.contains(n)) {
            return Err(ReplicaError::NotAReplica {
                node: *extra,
                table: *table,
                partition: *partition,
                replicas: all.to_vec(),
            });
        }
    }
    Ok(compared)
}

// Node reports carry `RpcStats` (serde) and `TxnStats` as JSON. `TxnStats` keys its
// aborts by `&'static str`, so it is rebuilt field by field (a unit test checks that no
// field is missed).

fn json_u64(v: &serde_json::Value, name: &str) -> Result<u64, CounterError> {
    match v.get(name) {
        None => Ok(0),
        Some(x) => x
            .as_u64()
            .ok_or_else(|| CounterError::NotInteger(name.into())),
    }
}

fn rpc_stats_from_json(v: &serde_json::Value) -> Result<RpcStats, CounterError> {
    if !v.is_object() {
        return Err(CounterError::NotObject("RPC counters"));
    }
    RpcStats::deserialize(v).map_err(|source| CounterError::Json {
        name: "RPC counters".into(),
        source,
    })
}

/// The `&'static str` `TxnStats::aborts` keys by: a known reason's name (every node
/// runs the same build, so any other name is an error).
fn intern_reason(name: &str) -> Result<&'static str, CounterError> {
    AbortReason::ALL
        .iter()
        .find(|r| r.name() == name)
        .map(|r| r.name())
        .ok_or_else(|| CounterError::UnknownAbortReason(name.into()))
}

#[allow(clippy::needless_update)]
fn txn_stats_from_json(v: &serde_json::Value) -> Result<TxnStats, CounterError> {
    if !v.is_object() {
        return Err(CounterError::NotObject("transaction-layer counters"));
    }
    let g = |name: &str| json_u64(v, name);
    let arr = |name: &str| -> Result<PhaseMap<u64>, CounterError> {
        let mut out = PhaseMap::<u64>::default();
        if let Some(a) = v.get(name) {
            let a = a
                .as_array()
                .filter(|a| a.len() == Phase::COUNT)
                .ok_or_else(|| CounterError::NotPhaseArray(name.into()))?;
            for (o, x) in out.0.iter_mut().zip(a) {
                *o = x
                    .as_u64()
                    .ok_or_else(|| CounterError::NotInteger(name.into()))?;
            }
        }
        Ok(out)
    };
    let mut aborts = BTreeMap::new();
    if let Some(m) = v.get("aborts") {
        let m = m.as_object().ok_or(CounterError::NotObject("\"aborts\""))?;
        for (k, x) in m {
            let n = x
                .as_u64()
                .ok_or_else(|| CounterError::NotInteger(format!("aborts.{k}")))?;
            aborts.insert(intern_reason(k)?, n);
        }
    }
    let location_cache = nested::<LocationCacheStats>(v, "location_cache")?;
    let log_ring = nested::<LogRingStats>(v, "log_ring")?;
    Ok(TxnStats {
        committed: g("committed")?,
        aborted: g("aborted")?,
        aborts,
        read_only_committed: g("read_only_committed")?,
        committed_incomplete: g("committed_incomplete")?,
        committed_by_recovery: g("committed_by_recovery")?,
        phase_ns: arr("phase_ns")?,
        phase_count: arr("phase_count")?,
        log_appended: g("log_appended")?,
        log_retries: g("log_retries")?,
        log_truncated: g("log_truncated")?,
        log_records_held: g("log_records_held")?,
        location_cache,
        log_ring,
        onesided_unsignaled_failures: g("onesided_unsignaled_failures")?,
        ..Default::default()
    })
}

/// A nested counter object of the transaction-layer stats (absent: zeroes).
fn nested<T: Default + for<'de> Deserialize<'de>>(
    v: &serde_json::Value,
    name: &str,
) -> Result<T, CounterError> {
    match v.get(name) {
        None => Ok(T::default()),
        Some(x) => T::deserialize(x).map_err(|source| CounterError::Json {
            name: name.into(),
            source,
        }),
    }
}

/// Node reports that cannot be combined into the run's report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CombineError {
    /// Not one report per node (or per surviving node).
    #[error(
        "expected one report from each of {}nodes 0..{nodes}, got nodes {got:?}",
        if *partial { "some of the " } else { "" }
    )]
    Reports {
        /// Nodes may have died (any subset reports).
        partial: bool,
        /// The cluster's nodes.
        nodes: u16,
        /// The nodes that reported.
        got: Vec<u16>,
    },
    /// The final placement is of another cluster.
    #[error("the final placement has {placement} nodes, the run {run}")]
    PlacementNodes {
        /// The placement's nodes.
        placement: u16,
        /// The run's.
        run: u16,
    },
    /// A report with a counter no run can produce.
    #[error("node {node}'s report: {what}")]
    Implausible {
        /// The node.
        node: u16,
        /// What.
        what: Implausible,
    },
    /// A node runs another transaction policy than the run's.
    #[error(transparent)]
    Policy(#[from] NodePolicyError),
    /// A report with another number of transaction types than the workload's.
    #[error("node {node} reported {reported} transaction types, the workload has {types}")]
    TxnTypes {
        /// The node.
        node: u16,
        /// Its count.
        reported: usize,
        /// The workload's.
        types: usize,
    },
    /// A latency histogram that cannot be recorded.
    #[error("node {node}'s latency histogram: {why}")]
    Histogram {
        /// The node.
        node: u16,
        /// The histogram's complaint.
        why: String,
    },
    /// Counters that do not parse.
    #[error("node {node}: {source}")]
    Counters {
        /// The node.
        node: u16,
        /// What is wrong with them.
        #[source]
        source: CounterError,
    },
    /// A CPU time that is no time.
    #[error("node {node} reported {seconds} CPU seconds")]
    CpuSeconds {
        /// The node.
        node: u16,
        /// What it said.
        seconds: f64,
    },
    /// The configuration or the workload's registration.
    #[error(transparent)]
    Bench(#[from] BenchError),
}

impl From<crate::workload::UnknownWorkload> for CombineError {
    fn from(e: crate::workload::UnknownWorkload) -> Self {
        CombineError::Bench(e.into())
    }
}

/// A count in a node report that no run can produce.
#[derive(Debug, thiserror::Error)]
pub enum Implausible {
    /// A counter above 2^56, far above any real run.
    #[error("{what} = {value} is implausible")]
    Count {
        /// Which counter.
        what: String,
        /// Its value.
        value: u64,
    },
    /// A timeline longer than any run.
    #[error("a timeline of {0} buckets is implausible")]
    Timeline(usize),
}

/// Serialized counters of a node report that do not parse.
#[derive(Debug, thiserror::Error)]
pub enum CounterError {
    /// Not a JSON object.
    #[error("{0} are not a JSON object")]
    NotObject(&'static str),
    /// A counter that is not a non-negative integer.
    #[error("counter {0:?} is not a non-negative integer")]
    NotInteger(String),
    /// A per-phase counter that is not an array of one counter per phase.
    #[error("{0:?} is not an array of {count} counters", count = Phase::COUNT)]
    NotPhaseArray(String),
    /// An abort reason this build does not have.
    #[error("unknown abort reason {0:?}")]
    UnknownAbortReason(String),
    /// A nested object that does not deserialize.
    #[error("{name}: {source}")]
    Json {
        /// Which.
        name: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
}

/// Copies of a partition that disagree once the cluster is quiescent (a failed check,
/// reported in the run's `check`).
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    /// Rows of a partition the placement does not have.
    #[error("a node reports rows of partition {partition}, of {partitions} partitions")]
    NoSuchPartition {
        /// The partition.
        partition: u32,
        /// The placement's partitions.
        partitions: u32,
    },
    /// A backup whose rows differ from its primary's.
    #[error(
        "replicas differ: table {table}, partition {partition}: primary node {primary} has \
         {} rows (digest {:#x}), its backup node {backup} has {} rows (digest {:#x})",
        primary_digest.rows, primary_digest.sum, backup_digest.rows, backup_digest.sum
    )]
    Differ {
        /// The table.
        table: u32,
        /// The partition.
        partition: u32,
        /// The primary.
        primary: u16,
        /// Its rows' digest.
        primary_digest: ReplicaDigest,
        /// The backup.
        backup: u16,
        /// Its rows' digest.
        backup_digest: ReplicaDigest,
    },
    /// A node holding rows of a partition it is no replica of.
    #[error(
        "node {node} stores rows of table {table}, partition {partition}, but is not one of \
         its replicas {replicas:?}"
    )]
    NotAReplica {
        /// The node.
        node: u16,
        /// The table.
        table: u32,
        /// The partition.
        partition: u32,
        /// Its replicas.
        replicas: Vec<u16>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field of the serialized stats comes back: a field added to `RpcStats` or
    /// `TxnStats` without being added here fails this test.
    #[test]
    fn stats_round_trip_through_json() {
        let mut v = serde_json::to_value(RpcStats::default()).unwrap();
        for (i, (_, x)) in v.as_object_mut().unwrap().iter_mut().enumerate() {
            *x = (i as u64 + 1).into();
        }
        let back = serde_json::to_value(rpc_stats_from_json(&v).unwrap()).unwrap();
        assert_eq!(back, v);

        let mut t = TxnStats::default();
        for (i, r) in AbortReason::ALL.iter().enumerate() {
            t.aborts.insert(r.name(), i as u64 + 1);
        }
        let mut v = serde_json::to_value(&t).unwrap();
        for (i, (k, x)) in v.as_object_mut().unwrap().iter_mut().enumerate() {
            match k.as_str() {
                "aborts" => {}
                "phase_ns" | "phase_count" => {
                    *x = serde_json::json!([i, i + 1, i + 2, i + 3, i + 4, i + 5]);
                }
                "location_cache" | "log_ring" => {
                    for (j, (_, c)) in x.as_object_mut().unwrap().iter_mut().enumerate() {
                        *c = (i as u64 * 10 + j as u64 + 1).into();
                    }
                }
                _ => *x = (i as u64 + 100).into(),
            }
        }
        let back = serde_json::to_value(txn_stats_from_json(&v).unwrap()).unwrap();
        assert_eq!(back, v);
        // Malformed input is an error, not a panic.
        assert!(txn_stats_from_json(&serde_json::json!({"phase_ns": [1]})).is_err());
        assert!(txn_stats_from_json(&serde_json::json!({"location_cache": 3})).is_err());
        assert!(txn_stats_from_json(&serde_json::json!({"location_cache": {"hits": -1}})).is_err());
        assert!(rpc_stats_from_json(&serde_json::json!({"retransmits": -1})).is_err());
        assert!(rpc_stats_from_json(&serde_json::json!([])).is_err());
    }

    /// A workload with six transaction types and no data, registered under the
    /// configuration's default name: what combining reports needs of one.
    struct Idle;

    impl Workload for Idle {
        type Local = ();
        fn name(&self) -> &'static str {
            "idle"
        }
        fn tables(&self) -> Vec<ambidex_txn::TableSpec> {
            Vec::new()
        }
        fn txn_types(&self) -> &'static [&'static str] {
            &["a", "b", "c", "d", "e", "f"]
        }
        fn load_units(&self) -> u64 {
            0
        }
        fn load_unit(
            &self,
            _unit: u64,
            _rng: &mut rand::rngs::SmallRng,
            _out: &crate::workload::Loader<'_>,
        ) -> Result<(), crate::workload::WorkloadError> {
            Ok(())
        }
        async fn run_one(
            &self,
            _w: &ambidex_txn::runner::WorkerCtx,
            _rng: &mut rand::rngs::SmallRng,
            _local: &mut (),
        ) -> (usize, crate::workload::Outcome) {
            (0, crate::workload::Outcome::FOUND)
        }
    }

    fn registry() -> Registry {
        use crate::workload::{Registrar, WorkloadInfo};
        let mut r = Registry::new();
        r.add(
            WorkloadInfo {
                name: "smallbank",
                aliases: &[],
                about: "no data, six types",
                default_coroutines: 1,
                default_scale: 1.0,
                sim_scale: 1.0,
            },
            |_: &crate::workload::WorkloadArgs<'_>| Ok(Idle),
        );
        r
    }

    /// A well-formed report of `node` with nothing in it.
    fn plain_report(node: u16) -> NodeReport {
        NodeReport {
            node,
            per_type: vec![TypeReport::default(); 6],
            txn_layer: serde_json::to_value(TxnStats::default()).unwrap(),
            rpc: serde_json::to_value(RpcStats::default()).unwrap(),
            ..Default::default()
        }
    }

    #[test]
    fn implausible_node_reports_are_errors_not_panics() {
        let mut cfg = Config::default();
        cfg.run.scale = Some(0.001);
        let good = plain_report;
        let mut bad = good(1);
        bad.per_type[0].committed = u64::MAX;
        let e = combine_node_reports(&registry(), &cfg, "udp", 1.0, vec![good(0), bad, good(2)]);
        assert!(matches!(e, Err(CombineError::Implausible { node: 1, .. })));
        let mut bad = good(2);
        bad.rpc["retransmits"] = serde_json::json!(u64::MAX);
        assert!(
            combine_node_reports(&registry(), &cfg, "udp", 1.0, vec![good(0), good(1), bad])
                .is_err()
        );
        let mut bad = good(0);
        bad.latency_ns = vec![[u64::MAX, 1]];
        assert!(
            combine_node_reports(&registry(), &cfg, "udp", 1.0, vec![bad, good(1), good(2)])
                .is_err()
        );
        // A missing node, or one twice.
        assert!(
            combine_node_reports(&registry(), &cfg, "udp", 1.0, vec![good(0), good(1)]).is_err()
        );
        assert!(combine_node_reports(
            &registry(),
            &cfg,
            "udp",
            1.0,
            vec![good(0), good(1), good(1)]
        )
        .is_err());
    }

    /// A node that ran another policy than the cluster's is refused by name, and a
    /// report or `ready` event that does not say its policy is refused too.
    #[test]
    fn a_node_with_another_policy_is_refused() {
        let mut cfg = Config::default();
        cfg.run.scale = Some(0.001);
        let good = plain_report;
        combine_node_reports(
            &registry(),
            &cfg,
            "udp",
            1.0,
            vec![good(0), good(1), good(2)],
        )
        .unwrap();
        let mut odd = good(2);
        odd.policy.passive_ack = ambidex_txn::policy::PassiveAck::On;
        let e = combine_node_reports(
            &registry(),
            &cfg,
            "udp",
            1.0,
            vec![good(0), good(1), odd.clone()],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("node 2 runs transaction policy no preset:")
                && e.contains("passive-ack on")
                && e.contains("the cluster's is fasst"),
            "{e}"
        );
        // The same policy given by overrides is the same policy.
        cfg.txn.passive_ack = Some(ambidex_txn::policy::PassiveAck::On);
        let mut all = vec![odd.clone(), odd.clone(), odd];
        for (n, r) in all.iter_mut().enumerate() {
            r.node = n as u16;
        }
        let r = combine_node_reports(&registry(), &cfg, "udp", 1.0, all).unwrap();
        assert_eq!(r.policy.preset, None);
        assert_eq!(
            r.policy.policy.passive_ack,
            ambidex_txn::policy::PassiveAck::On
        );

        let mut v = serde_json::to_value(good(0)).unwrap();
        assert_eq!(node_policy(0, v.get("policy")), Ok(Policy::fasst()));
        v.as_object_mut().unwrap().remove("policy");
        assert!(serde_json::from_value::<NodeReport>(v.clone()).is_err());
        assert!(matches!(
            node_policy(0, v.get("policy")),
            Err(NodePolicyError::Unreadable { node: 0, .. })
        ));
        let bad = serde_json::json!({"execute": "magic"});
        assert!(node_policy(1, Some(&bad)).is_err());
        assert_eq!(
            same_policy(1, Policy::farm(), Policy::fasst()),
            Err(NodePolicyError::Mismatch {
                node: 1,
                ran: Policy::farm().into(),
                expected: Policy::fasst().into()
            })
        );
    }

    #[test]
    fn location_cache_counters_are_summed_over_nodes() {
        let mut cfg = Config::default();
        cfg.run.scale = Some(0.001);
        let node = |node: u16, hits: u64| {
            let mut t = TxnStats::default();
            t.location_cache.hits = hits;
            t.location_cache.stale = 1;
            let rpc = RpcStats {
                onesided_reads: 10 + hits,
                onesided_failed: 1,
                ..Default::default()
            };
            NodeReport {
                node,
                per_type: vec![TypeReport::default(); 6],
                txn_layer: serde_json::to_value(t).unwrap(),
                rpc: serde_json::to_value(rpc).unwrap(),
                ..Default::default()
            }
        };
        let r = combine_node_reports(
            &registry(),
            &cfg,
            "shm",
            1.0,
            vec![node(0, 1), node(1, 2), node(2, 3)],
        )
        .unwrap();
        assert_eq!((r.location_cache.hits, r.location_cache.stale), (6, 3));
        assert_eq!((r.one_sided.reads, r.one_sided.failed), (36, 3));
        assert_eq!(r.policy.preset, Some("fasst"));
    }

    /// A node's report of one replica digest.
    fn digest_report(node: u16, table: u32, partition: u32, rows: u64, sum: u64) -> NodeReport {
        NodeReport {
            node,
            replica_digests: vec![ReplicaDigest {
                table,
                partition,
                rows,
                sum,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn replica_comparison_finds_a_diverging_backup() {
        let p = Placement::new(3, 2).unwrap();
        // Partition 0 is on nodes 0 and 1; partition 2 on 2 and 0.
        let d = digest_report;
        // Node 0's rows are backed up on node 1.
        let ok = [d(0, 1, 0, 5, 77), d(1, 1, 0, 5, 77), d(2, 9, 2, 0, 0)];
        assert_eq!(compare_replicas(&ok, &p).unwrap(), 5);
        let bad = [d(0, 1, 0, 5, 77), d(1, 1, 0, 5, 78), d(2, 9, 2, 0, 0)];
        assert!(matches!(
            compare_replicas(&bad, &p),
            Err(ReplicaError::Differ { backup: 1, .. })
        ));
        let stray = [d(0, 1, 0, 5, 77), d(1, 1, 0, 5, 77), d(2, 1, 0, 1, 1)];
        assert!(matches!(
            compare_replicas(&stray, &p),
            Err(ReplicaError::NotAReplica { node: 2, .. })
        ));
    }

    /// Node 2 died: the final placement promotes its partitions' backups and adds
    /// syncing copies; the survivors' up-to-date copies are still compared.
    #[test]
    fn replica_comparison_after_a_death_covers_the_survivors_only() {
        let p = Placement::new(3, 2).unwrap();
        let after = p.without(1 << 2).unwrap();
        let d = digest_report;
        // Partition 2 was on nodes 2 and 0: node 0 alone is up to date now (node 2's
        // copy is gone, the new backup is syncing and has nothing yet).
        let ok = [d(0, 1, 2, 5, 77), d(1, 1, 0, 0, 0)];
        assert!(compare_replicas(&ok, &after).is_ok());
        // A divergence between survivors is still found.
        let bad = [d(0, 1, 0, 5, 77), d(1, 1, 0, 5, 78)];
        assert!(matches!(
            compare_replicas(&bad, &after),
            Err(ReplicaError::Differ { backup: 1, .. })
        ));
        // Against the initial placement, the missing node 2 is a failure.
        let full = [d(0, 1, 2, 5, 77), d(1, 9, 0, 0, 0), d(2, 9, 1, 0, 0)];
        assert!(compare_replicas(&full[..2], &p).is_ok());
        let e = combine_live_reports(
            &registry(),
            &Config::default(),
            "shm",
            1.0,
            full[..2].to_vec(),
            None,
        );
        assert!(
            matches!(&e, Err(CombineError::Reports { got, .. }) if got == &[0, 1]),
            "{e:?}"
        );
    }
}
