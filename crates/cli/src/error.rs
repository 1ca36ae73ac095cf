//! What a command of the command line failed with: one variant per subcommand's error
//! type, printed by [`crate::main_with_args`] with its chain of causes.

use crate::bench::workload::BenchCmdError;
use crate::bench::{rpc::RpcBenchError, store::StoreBenchError, transport::TransportBenchError};
use crate::study::StudyError;
use ambidex::bench::node_process::NodeProcessFailed;
use std::error::Error;
use std::path::PathBuf;

/// A command that failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// `main_with` (or `main_with_args`) was called a second time in this process.
    #[error("main_with was called twice")]
    CalledTwice,
    /// `bench transport` (or its peer node).
    #[error(transparent)]
    TransportBench(#[from] TransportBenchError),
    /// `bench rpc`.
    #[error(transparent)]
    RpcBench(#[from] RpcBenchError),
    /// `bench store`.
    #[error(transparent)]
    StoreBench(#[from] StoreBenchError),
    /// `study`.
    #[error(transparent)]
    Study(#[from] StudyError),
    /// `bench WORKLOAD`.
    #[error(transparent)]
    Bench(#[from] BenchCmdError),
    /// `peer` (a node of `bench transport`).
    #[error(transparent)]
    Peer(#[from] crate::cluster::ClusterError),
    /// `node` (a node process).
    #[error(transparent)]
    Node(#[from] NodeProcessFailed),
    /// `check-history`.
    #[error(transparent)]
    CheckHistory(#[from] CheckHistoryError),
    /// A benchmark report that could not be encoded for `--json`.
    #[error("encoding the report as JSON")]
    EncodeReport(#[source] serde_json::Error),
    /// A workload's run that finished with its invariant or consistency check failed.
    #[error("{workload}: the workload's consistency check failed (see the report)")]
    ConsistencyFailed {
        /// The workload's name.
        workload: String,
    },
    /// `peer --role` with a role no benchmark has.
    #[error("unknown peer role {role:?} (the one role is bench-transport)")]
    UnknownPeerRole {
        /// The role given.
        role: String,
    },
    /// `sim`.
    #[error(transparent)]
    Sim(#[from] crate::sim::SimCmdError),
}

/// Why `check-history` failed (or found the history not serializable).
#[derive(Debug, thiserror::Error)]
pub enum CheckHistoryError {
    /// The history file could not be read or has a malformed line.
    #[error("reading the history {}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// Which line and what is wrong with it (or why the file cannot be read).
        #[source]
        source: ambidex::history::ParseError,
    },
    /// The check's report could not be encoded for `--json`.
    #[error("encoding the check's report as JSON")]
    EncodeReport(#[source] serde_json::Error),
    /// The export for adya (`--adya`) could not be written.
    #[error("writing the history's export for adya to {}", path.display())]
    Export {
        /// The export file.
        path: PathBuf,
        /// What the file system said.
        #[source]
        source: std::io::Error,
    },
    /// adya gave no verdict on the export.
    #[error("checking {} with adya", path.display())]
    Adya {
        /// The export file.
        path: PathBuf,
        /// Why adya gave no verdict.
        #[source]
        source: ambidex::history::AdyaError,
    },
    /// The history (or adya's verdict on it) has an anomaly.
    #[error("the history is not serializable")]
    NotSerializable,
}

/// `e` and its causes, `X: caused by Y: caused by Z`. A cause whose text its error
/// already shows (some errors print their source as part of their message) is left out
/// rather than said twice.
pub fn chain(e: &dyn Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let c_text = c.to_string();
        if !text.contains(&c_text) {
            text.push_str(": caused by ");
            text.push_str(&c_text);
        }
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Causes are appended in order, and one already in its error's text is not repeated.
    #[test]
    fn chain_names_every_cause_once() {
        let io = std::io::Error::other("disk full");
        let e = CheckHistoryError::Export {
            path: "h.elle.jsonl".into(),
            source: io,
        };
        assert_eq!(
            chain(&e),
            "writing the history's export for adya to h.elle.jsonl: caused by disk full"
        );
        let spawn = ambidex::history::AdyaError::Spawn {
            binary: "/no/adya".into(),
            source: std::io::Error::other("not found"),
        };
        let e = CheckHistoryError::Adya {
            path: "h.elle.jsonl".into(),
            source: spawn,
        };
        assert_eq!(
            chain(&e),
            "checking h.elle.jsonl with adya: caused by running /no/adya: not found"
        );
    }
}
