//! Export to Elle's rw-register history format, and running the `adya`
//! checker (crates.io `adya` 0.1.0, an Elle reimplementation) on it.
//!
//! adya reads JSON lines, one Jepsen operation per line:
//! `{"index":0,"type":"invoke","process":3,"value":[["r","1:5",null],["w","1:5",77]]}`
//! followed by its completion (`"type":"ok"` committed, `"fail"` aborted) on
//! the same process. We emit each transaction as an invoke immediately
//! followed by its completion, so file order carries no real-time meaning;
//! check with `-c serializable`, never `strict-serializable`.
//!
//! Mapping: the register key is the string `"table:key"`; the register value
//! is the *version* (the writer's transaction id, unique per key as Elle
//! requires). A read of a version no transaction in the history wrote (the
//! initial load, or an absent key) is Elle's initial `nil`. A delete writes
//! its version like any write (reads then see that version), so tombstones
//! need no special case.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

use crate::format::{Outcome, TxnRecord};

/// What `export_elle` wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ElleExport {
    pub ops: u64,
    /// Reads exported as `nil` (initial-load or absent versions).
    pub initial_reads: u64,
}

fn elle_key(table: u32, key: u64) -> String {
    format!("{table}:{key}")
}

/// Writes `recs` as an Elle rw-register history (JSON lines). Transactions
/// appear in record order; operation indices are `2i` (invoke) and `2i+1`
/// (completion).
pub fn export_elle(recs: &[TxnRecord], out: impl Write) -> io::Result<ElleExport> {
    // A pending record whose transaction finished is not a second transaction.
    let owned;
    let recs = if recs.iter().any(|r| r.outcome == Outcome::Unknown) {
        let mut v = recs.to_vec();
        crate::format::drop_superseded(&mut v);
        owned = v;
        &owned[..]
    } else {
        recs
    };
    let mut out = BufWriter::new(out);
    // Versions some transaction (committed or aborted) wrote, per key; any
    // other version is the initial state.
    let written: HashSet<(u32, u64, u64)> = recs
        .iter()
        .flat_map(|r| r.writes.iter().map(|w| (w.table, w.key, w.version)))
        .collect();
    let mut stats = ElleExport::default();
    for (i, r) in recs.iter().enumerate() {
        // Reads first, as the transaction layer performs them before it
        // installs writes; Elle takes the first read of a key before any
        // write of it as the external read.
        let mut mops: Vec<Value> = Vec::with_capacity(r.reads.len() + r.writes.len());
        for x in &r.reads {
            let v = if written.contains(&(x.table, x.key, x.version)) {
                json!(x.version)
            } else {
                stats.initial_reads += 1;
                Value::Null
            };
            mops.push(json!(["r", elle_key(x.table, x.key), v]));
        }
        for w in &r.writes {
            mops.push(json!(["w", elle_key(w.table, w.key), w.version]));
        }
        // Distinct (node, thread) pairs are distinct Jepsen processes.
        let process = (r.node as u64) << 20 | r.thread as u64;
        let done = match r.outcome {
            Outcome::Committed => "ok",
            Outcome::Aborted => "fail",
            Outcome::Unknown => "info",
        };
        let invoke = json!({"index": 2 * i, "type": "invoke", "f": "txn", "process": process, "value": mops});
        let complete = json!({"index": 2 * i + 1, "type": done, "f": "txn", "process": process, "value": mops});
        serde_json::to_writer(&mut out, &invoke)?;
        out.write_all(b"\n")?;
        serde_json::to_writer(&mut out, &complete)?;
        out.write_all(b"\n")?;
        stats.ops += 2;
    }
    out.flush()?;
    Ok(stats)
}

pub fn export_elle_file(recs: &[TxnRecord], path: impl AsRef<Path>) -> io::Result<ElleExport> {
    export_elle(recs, File::create(path)?)
}

/// adya's `--transaction-order` file for a history written by
/// [`export_elle`]: completion index -> position in a topological order of
/// the committed ww edges (the exact version chains ambidex recorded). This
/// hands adya our version order, so a check using it is no longer
/// independent of our chain reconstruction. Returns `None` when the ww edges
/// are cyclic (G0): no transaction order exists then.
pub fn transaction_order(recs: &[TxnRecord]) -> Option<Value> {
    use std::collections::HashMap;
    let committed: Vec<usize> = (0..recs.len())
        .filter(|&i| recs[i].outcome == Outcome::Committed)
        .collect();
    let mut writer: HashMap<(u32, u64, u64), usize> = HashMap::new();
    for (n, &i) in committed.iter().enumerate() {
        for w in &recs[i].writes {
            writer.insert((w.table, w.key, w.version), n);
        }
    }
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); committed.len()];
    let mut indeg = vec![0usize; committed.len()];
    for (n, &i) in committed.iter().enumerate() {
        for w in &recs[i].writes {
            if let Some(&p) = writer.get(&(w.table, w.key, w.prev_version)) {
                if p != n {
                    succ[p].push(n);
                    indeg[n] += 1;
                }
            }
        }
    }
    // Kahn's algorithm; ties broken by record order.
    let mut ready: std::collections::VecDeque<usize> =
        (0..committed.len()).filter(|&n| indeg[n] == 0).collect();
    let mut order = serde_json::Map::new();
    let mut pos = 0i64;
    while let Some(n) = ready.pop_front() {
        order.insert((2 * committed[n] + 1).to_string(), json!(pos));
        pos += 1;
        for &m in &succ[n] {
            indeg[m] -= 1;
            if indeg[m] == 0 {
                ready.push_back(m);
            }
        }
    }
    (pos as usize == committed.len()).then_some(Value::Object(order))
}

/// adya's answer for one history file.
#[derive(Debug, Clone, PartialEq)]
pub struct AdyaVerdict {
    /// `Some(true)` valid, `Some(false)` anomalies found, `None` unknown
    /// (e.g. no dependencies could be inferred).
    pub valid: Option<bool>,
    /// Anomaly type names as adya reports them ("G2-item", "lost-update"...).
    pub anomaly_types: Vec<String>,
    /// The weakest consistency models the anomalies rule out.
    pub not: Vec<String>,
    pub exit_code: i32,
    /// adya's full JSON report.
    pub report: Value,
}

impl AdyaVerdict {
    pub fn has(&self, kind: &str) -> bool {
        self.anomaly_types.iter().any(|t| t == kind)
    }
}

/// How to run adya.
#[derive(Debug, Clone)]
pub struct AdyaOptions {
    /// The binary; default: `$ADYA_BIN`, else `adya` on `PATH`, else
    /// `~/.cargo/bin/adya`.
    pub binary: Option<PathBuf>,
    /// Consistency model to check (`-c`).
    pub model: String,
    /// `--wfr-keys`: a transaction's write of a key follows the version it
    /// read. True of any system that installs writes after reading (OCC
    /// included), and it is what lets adya order versions past the first.
    pub wfr_keys: bool,
    /// `--transaction-order FILE` (see [`transaction_order`]).
    pub transaction_order: Option<PathBuf>,
}

impl Default for AdyaOptions {
    fn default() -> Self {
        AdyaOptions {
            binary: None,
            model: "serializable".into(),
            wfr_keys: true,
            transaction_order: None,
        }
    }
}

pub const ADYA_INSTALL: &str = "cargo install adya --version 0.1.0 --locked";

/// Finds the adya binary (see [`AdyaOptions::binary`]).
pub fn find_adya() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ADYA_BIN") {
        let p = PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join("adya");
            if p.is_file() {
                return Some(p);
            }
        }
    }
    let home = std::env::var_os("HOME")?;
    let p = PathBuf::from(home).join(".cargo/bin/adya");
    p.is_file().then_some(p)
}

/// Why adya gave no verdict ([`run_adya`], [`run_adya_with`]).
#[derive(Debug, thiserror::Error)]
pub enum AdyaError {
    /// No binary was given and none was found (see [`find_adya`]).
    #[error("adya binary not found (set ADYA_BIN or run `{ADYA_INSTALL}`)")]
    NotFound,
    /// The binary could not be started.
    #[error("running {}: {source}", .binary.display())]
    Spawn {
        /// The binary.
        binary: PathBuf,
        /// The error starting it.
        #[source]
        source: io::Error,
    },
    /// adya exited with a code other than 0 (valid), 1 (anomalies) or 2 (unknown).
    #[error("adya exited with {code}: {stderr}")]
    Failed {
        /// The exit code (-1: killed by a signal).
        code: i32,
        /// adya's standard error, trimmed.
        stderr: String,
    },
    /// adya's standard output is not a JSON report.
    #[error("adya printed no JSON report ({source}); stderr: {stderr}")]
    NoReport {
        /// The JSON error.
        #[source]
        source: serde_json::Error,
        /// adya's standard error, trimmed.
        stderr: String,
    },
}

/// Runs `adya check -m rw-register -c serializable --wfr-keys --json PATH` on
/// an exported history.
pub fn run_adya(path: impl AsRef<Path>) -> Result<AdyaVerdict, AdyaError> {
    run_adya_with(path, &AdyaOptions::default())
}

/// Runs adya on an exported history as `opts` says.
pub fn run_adya_with(path: impl AsRef<Path>, opts: &AdyaOptions) -> Result<AdyaVerdict, AdyaError> {
    let bin = match &opts.binary {
        Some(b) => b.clone(),
        None => find_adya().ok_or(AdyaError::NotFound)?,
    };
    let mut cmd = Command::new(&bin);
    cmd.args(["check", "-m", "rw-register", "-c", &opts.model, "--json"]);
    if opts.wfr_keys {
        cmd.arg("--wfr-keys");
    }
    if let Some(t) = &opts.transaction_order {
        cmd.arg("--transaction-order").arg(t);
    }
    cmd.arg(path.as_ref());
    let out = match cmd.output() {
        Ok(out) => out,
        Err(source) => {
            return Err(AdyaError::Spawn {
                binary: bin,
                source,
            })
        }
    };
    let code = out.status.code().unwrap_or(-1);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Exit 0 valid, 1 anomalies, 2 unknown, 3 error (adya's convention).
    if !(0..=2).contains(&code) {
        return Err(AdyaError::Failed {
            code,
            stderr: stderr.trim().to_owned(),
        });
    }
    let report: Value =
        serde_json::from_slice(&out.stdout).map_err(|source| AdyaError::NoReport {
            source,
            stderr: stderr.trim().to_owned(),
        })?;
    let valid = match &report["valid"] {
        Value::Bool(b) => Some(*b),
        _ => None,
    };
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    Ok(AdyaVerdict {
        valid,
        anomaly_types: strings(&report["anomaly_types"]),
        not: strings(&report["not"]),
        exit_code: code,
        report,
    })
}
