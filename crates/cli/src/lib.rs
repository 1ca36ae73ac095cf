//! `ambidex`: the command line of the ambidex transaction system, as a library so that
//! a program that registers its own workloads runs the same commands on them
//! ([`main_with`]): `bench --workload NAME`, `sim --workload NAME`, `node`.

mod bench;
mod cluster;
mod config_args;
mod error;
mod plot;
mod sim;
mod study;

use ambidex::workload::Registry;
use clap::{Parser, Subcommand};
use error::{CheckHistoryError, CliError};
use std::process::ExitCode;
use std::sync::OnceLock;

/// The workloads this process's commands know (set once, by [`main_with`]).
static REGISTRY: OnceLock<Registry> = OnceLock::new();

/// The registry of workloads [`main_with`] was given.
pub(crate) fn registry() -> &'static Registry {
    REGISTRY.get_or_init(Registry::new)
}

#[derive(Parser)]
#[command(
    name = "ambidex",
    version,
    about = "A distributed in-memory transaction processing system"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a benchmark and print its report (with no subcommand: the embedded default).
    #[command(args_conflicts_with_subcommands = true)]
    Bench {
        #[command(subcommand)]
        what: Option<BenchCommand>,
        /// Without a subcommand: the workload run's options (the workload is the config
        /// file's `run.workload`, SmallBank by default).
        #[command(flatten)]
        run: Box<bench::workload::Args>,
    },
    /// Check a recorded history (`bench ... --history FILE`) for serializability.
    CheckHistory {
        file: std::path::PathBuf,
        /// Also run the external Elle-style checker `adya` on an export of the history.
        #[arg(long)]
        adya: bool,
        #[arg(long)]
        json: bool,
    },
    /// Deterministic simulation: the whole cluster in one thread over a simulated network,
    /// from a seed, with faults; every run's history and state are checked.
    Sim(sim::Args),
    /// Reproduce a paper's evaluation on this machine: every figure's points, the
    /// paper's claims checked against them, JSON, Markdown tables and SVGs
    /// (docs/study/README.md).
    #[command(subcommand)]
    Study(study::Command),
    /// Run one node of a cluster described by a configuration file (docs/cluster.md), driven
    /// by JSON commands on stdin; `bench --transport shm|udp` starts one per node.
    Node {
        /// The configuration file (TOML or JSON, docs/cluster.md). Its `[txn]` section is
        /// the transaction policy (a node takes no policy flags: every node must run the
        /// cluster's, which the launcher checks).
        #[arg(long)]
        config: std::path::PathBuf,
        /// Which node of the cluster this process is.
        #[arg(long)]
        node: u16,
        /// No progress bar while loading.
        #[arg(long)]
        no_progress: bool,
        /// This node was killed and starts again during the run (`bench --restart`): it
        /// loads nothing, waits for the `rejoin` command (the cluster's configuration and
        /// its new incarnation), and joins the cluster as that incarnation.
        #[arg(long)]
        rejoin: bool,
    },
    /// Run one node of a benchmark cluster (started by `bench`; not for direct use).
    #[command(hide = true)]
    Peer {
        #[arg(long)]
        role: String,
        #[arg(long)]
        node: u16,
        /// The cluster spec as JSON.
        #[arg(long)]
        spec: String,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Datagram ping-pong and one-sided READ rates between two nodes.
    Transport(bench::transport::Args),
    /// Symmetric all-to-all RPCs, with the raw datagram rate of the same run.
    Rpc(bench::rpc::Args),
    /// The store's hash table against std's HashMap, and memory per item.
    Store(bench::store::Args),
    /// SmallBank (FaSST §6.3): transfers over hot accounts; checks the total balance.
    Smallbank(bench::workload::Args),
    /// TATP (FaSST §6.2): the telecom read-mostly workload, all 7 transactions.
    Tatp(bench::workload::Args),
    /// TPC-C: the full five-transaction mix; checks consistency conditions 1-4.
    Tpcc(bench::workload::Args),
    /// TPC-C NewOrder only, always distributed (DrTM+H's tpcc-no).
    #[command(name = "tpcc-no")]
    TpccNo(bench::workload::Args),
    /// The object store O(r, w) of FaSST §6.1 (`--r`, `--w`).
    #[command(name = "object-store")]
    ObjectStore(bench::workload::Args),
    /// FaSST's stress test: groups of keys read, set or deleted whole; checks that
    /// every committed read and the final state see each group whole or absent.
    Stress(bench::workload::Args),
    /// TPC-E's customer-position transaction (DrTM+H §5.5): a distributed read-only
    /// transaction over a customer's accounts, holdings and their securities' last
    /// trades, with 1% market feeds; checks LAST_TRADE's volume and snapshots.
    Tpce(bench::workload::Args),
}

/// Runs the `ambidex` command line (arguments from the process) with the workloads of
/// `reg`: the `ambidex` binary passes the built-in ones (`ambidex_workloads::registry`);
/// a program that adds its own passes a registry with them too, and its `bench`, `sim`
/// and `node` commands run them (node processes are started from the same binary).
pub fn main_with(reg: Registry) -> ExitCode {
    main_with_args(reg, std::env::args_os())
}

/// [`main_with`] on the arguments `args` (the first is the program's name), as a
/// program that builds its own command line, or a test, calls it. Once per process: the
/// registry is the process's.
pub fn main_with_args<I, T>(reg: Registry, args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    match dispatch(reg, args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ambidex: error: {}", error::chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// Sets the registry and runs the command `args` asks for.
fn dispatch<I, T>(reg: Registry, args: I) -> Result<(), CliError>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    if REGISTRY.set(reg).is_err() {
        return Err(CliError::CalledTwice);
    }
    let cli = Cli::parse_from(args);
    match cli.command {
        Command::Bench { what: None, run } => workload(None, &run),
        Command::Bench {
            what: Some(what), ..
        } => match what {
            BenchCommand::Smallbank(a) => workload(Some("smallbank"), &a),
            BenchCommand::Tatp(a) => workload(Some("tatp"), &a),
            BenchCommand::Tpcc(a) => workload(Some("tpcc"), &a),
            BenchCommand::TpccNo(a) => workload(Some("tpcc-no"), &a),
            BenchCommand::ObjectStore(a) => workload(Some("object-store"), &a),
            BenchCommand::Stress(a) => workload(Some("stress"), &a),
            BenchCommand::Tpce(a) => workload(Some("tpce"), &a),
            BenchCommand::Store(args) => {
                let r = bench::store::run(&args)?;
                if args.json {
                    print_json(&r)
                } else {
                    bench::store::print_summary(&r);
                    Ok(())
                }
            }
            BenchCommand::Rpc(args) => {
                let r = bench::rpc::run(&args)?;
                if args.json {
                    print_json(&r)
                } else {
                    bench::rpc::print_summary(&args, &r);
                    Ok(())
                }
            }
            BenchCommand::Transport(args) => {
                let r = bench::transport::run(&args)?;
                if args.json {
                    print_json(&r)
                } else {
                    bench::transport::print_summary(&r);
                    Ok(())
                }
            }
        },
        Command::Sim(a) => Ok(sim::run(&a)?),
        Command::Study(c) => Ok(study::run(&c)?),
        Command::Node {
            config,
            node,
            no_progress,
            rejoin,
        } => ambidex::bench::node_process::run(registry(), &config, node, no_progress, rejoin)
            .map_err(CliError::from),
        Command::Peer { role, node, spec } => run_peer(&role, node, &spec),
        Command::CheckHistory { file, adya, json } => Ok(check_history(&file, adya, json)?),
    }
}

/// Prints a report as pretty JSON on stdout (`--json`).
fn print_json(report: &impl serde::Serialize) -> Result<(), CliError> {
    let json = serde_json::to_string_pretty(report).map_err(CliError::EncodeReport)?;
    println!("{json}");
    Ok(())
}

/// `ambidex bench W` (or, with no subcommand, the configured workload: SmallBank on a
/// local 3-node cluster, one thread per node, R = 3 by default).
fn workload(name: Option<&str>, a: &bench::workload::Args) -> Result<(), CliError> {
    let out = bench::workload::run(name, a)?;
    if a.json {
        match &out {
            bench::workload::Outcome::One(r) => print_json(r)?,
            bench::workload::Outcome::Sweep(s) => print_json(s)?,
        }
    } else {
        bench::workload::print(a, &out);
    }
    // A violated invariant is a failed run, not just a line in the report.
    if let bench::workload::Outcome::One(r) = &out {
        if r.invariant_ok == Some(false) || r.consistency_ok == Some(false) {
            return Err(CliError::ConsistencyFailed {
                workload: r.workload.clone(),
            });
        }
    }
    Ok(())
}

fn check_history(file: &std::path::Path, adya: bool, json: bool) -> Result<(), CheckHistoryError> {
    let recs = ambidex::history::parse_file(file).map_err(|source| CheckHistoryError::Parse {
        path: file.to_path_buf(),
        source,
    })?;
    let report = ambidex::history::check(&recs);
    if json {
        let text =
            serde_json::to_string_pretty(&report).map_err(CheckHistoryError::EncodeReport)?;
        println!("{text}");
    } else {
        println!("{}", report.summary());
    }
    let mut ok = report.valid;
    if adya {
        let export = file.with_extension("elle.jsonl");
        ambidex::history::export_elle_file(&recs, &export).map_err(|source| {
            CheckHistoryError::Export {
                path: export.clone(),
                source,
            }
        })?;
        let v = ambidex::history::run_adya(&export).map_err(|source| CheckHistoryError::Adya {
            path: export.clone(),
            source,
        })?;
        println!(
            "adya ({}): valid={:?} {:?}",
            export.display(),
            v.valid,
            v.anomaly_types
        );
        ok &= v.valid != Some(false);
    }
    if ok {
        Ok(())
    } else {
        Err(CheckHistoryError::NotSerializable)
    }
}

fn run_peer(role: &str, node: u16, spec: &str) -> Result<(), CliError> {
    let transport = cluster::open_peer(spec, node)?;
    match role {
        "bench-transport" => Ok(bench::transport::peer(transport)?),
        other => Err(CliError::UnknownPeerRole { role: other.into() }),
    }
}
