//! `ambidex`: the command line of the ambidex transaction system, as a library so that
//! a program that registers its own workloads runs the same commands on them
//! ([`main_with`]): `bench --workload NAME`, `sim --workload NAME`, `node`.

mod bench;
mod cluster;
mod config_args;
mod manager_host;
mod node;
mod plot;
mod sim;
mod study;

use ambidex::workload::Registry;
use clap::{Parser, Subcommand};
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
    if REGISTRY.set(reg).is_err() {
        eprintln!("ambidex: error: main_with was called twice");
        return ExitCode::FAILURE;
    }
    let cli = Cli::parse_from(args);
    let result = match cli.command {
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
            BenchCommand::Store(args) => bench::store::run(&args).map(|r| {
                if args.json {
                    println!(
                        "{}",
                        serde_json::to_string_pretty(&r).expect("report serializes")
                    );
                } else {
                    bench::store::print_summary(&r);
                }
            }),
            BenchCommand::Rpc(args) => bench::rpc::run(&args).map(|r| {
                if args.json {
                    println!(
                        "{}",
                        serde_json::to_string_pretty(&r).expect("report serializes")
                    );
                } else {
                    bench::rpc::print_summary(&args, &r);
                }
            }),
            BenchCommand::Transport(args) => bench::transport::run(&args).map(|r| {
                if args.json {
                    println!(
                        "{}",
                        serde_json::to_string_pretty(&r).expect("report serializes")
                    );
                } else {
                    bench::transport::print_summary(&r);
                }
            }),
        },
        Command::Sim(a) => sim::run(&a).map_err(|e| e.to_string()),
        Command::Study(c) => study::run(&c),
        Command::Node {
            config,
            node,
            no_progress,
            rejoin,
        } => node::run(&config, node, no_progress, rejoin),
        Command::Peer { role, node, spec } => run_peer(&role, node, &spec),
        Command::CheckHistory { file, adya, json } => check_history(&file, adya, json),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ambidex: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `ambidex bench W` (or, with no subcommand, the configured workload: SmallBank on a
/// local 3-node cluster, one thread per node, R = 3 by default).
fn workload(name: Option<&str>, a: &bench::workload::Args) -> Result<(), String> {
    let out = bench::workload::run(name, a)?;
    if a.json {
        let json = match &out {
            bench::workload::Outcome::One(r) => serde_json::to_string_pretty(r),
            bench::workload::Outcome::Sweep(s) => serde_json::to_string_pretty(s),
        };
        println!("{}", json.map_err(|e| e.to_string())?);
    } else {
        bench::workload::print(a, &out);
    }
    // A violated invariant is a failed run, not just a line in the report.
    if let bench::workload::Outcome::One(r) = &out {
        if r.invariant_ok == Some(false) || r.consistency_ok == Some(false) {
            return Err(format!(
                "{}: the workload's consistency check failed (see the report)",
                r.workload
            ));
        }
    }
    Ok(())
}

fn check_history(file: &std::path::Path, adya: bool, json: bool) -> Result<(), String> {
    let recs =
        ambidex::history::parse_file(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let report = ambidex::history::check(&recs);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?
        );
    } else {
        println!("{}", report.summary());
    }
    let mut ok = report.valid;
    if adya {
        let export = file.with_extension("elle.jsonl");
        ambidex::history::export_elle_file(&recs, &export).map_err(|e| e.to_string())?;
        let v = ambidex::history::run_adya(&export).map_err(|e| e.to_string())?;
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
        Err("the history is not serializable".into())
    }
}

fn run_peer(role: &str, node: u16, spec: &str) -> Result<(), String> {
    let transport = cluster::open_peer(spec, node)?;
    match role {
        "bench-transport" => bench::transport::peer(transport),
        other => Err(format!("unknown peer role {other:?}")),
    }
}
