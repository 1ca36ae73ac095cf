//! `ambidex`: the command line of the ambidex transaction system.

mod bench;
mod cluster;

use clap::{FromArgMatches, Parser, Subcommand};
use std::process::ExitCode;

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
    Bench {
        #[command(subcommand)]
        what: Option<BenchCommand>,
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench { what } => match what.unwrap_or_else(default_bench) {
            BenchCommand::Store(args) => bench::store::run(&args).map(|r| {
                if args.json {
                    println!("{}", serde_json::to_string_pretty(&r).expect("report serializes"));
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
        Command::Peer { role, node, spec } => run_peer(&role, node, &spec),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ambidex: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The benchmark `ambidex bench` runs with no subcommand.
fn default_bench() -> BenchCommand {
    BenchCommand::Transport(defaults())
}

/// The value of an argument group with every option at its default.
fn defaults<A: clap::Args + FromArgMatches>() -> A {
    let m = A::augment_args(clap::Command::new("defaults")).get_matches_from(["defaults"]);
    A::from_arg_matches(&m).expect("defaults parse")
}

fn run_peer(role: &str, node: u16, spec: &str) -> Result<(), String> {
    let spec: cluster::ClusterSpec =
        serde_json::from_str(spec).map_err(|e| format!("bad cluster spec: {e}"))?;
    let transport = spec.open_node(node)?;
    match role {
        "bench-transport" => bench::transport::peer(transport),
        other => Err(format!("unknown peer role {other:?}")),
    }
}
