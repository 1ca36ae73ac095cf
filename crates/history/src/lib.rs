//! Transaction histories for ambidex: the JSON-lines record format
//! (`docs/history-format.md`), a cheap per-thread recorder, and two
//! serializability checks: our own direct-serialization-graph checker over
//! the exact recorded versions (the internal `dsg` module: [`check`],
//! [`check_file`]), and an export to Elle's rw-register format for the
//! independent `adya` checker ([`elle`]).

pub(crate) mod dsg;
pub mod elle;
pub mod format;
pub mod recorder;

pub use dsg::{
    check, check_file, Anomaly, CheckFileError, CheckReport, EdgeCounts, EdgeKind, Warning,
    Witness, WitnessEdge,
};
pub use elle::{
    export_elle, export_elle_file, run_adya, run_adya_with, AdyaError, AdyaOptions, AdyaVerdict,
};
pub use format::{
    decode_hex, drop_superseded, encode_hex, parse_file, parse_reader, parse_str, resolve_unknown,
    HexError, LineError, Outcome, ParseError, ReadRecord, RecordError, TxnRecord, WriteKind,
    WriteRecord,
};
pub use recorder::{salvage, Recorder, Salvaged, ThreadRecorder, TxnBuilder, TxnHeader};
