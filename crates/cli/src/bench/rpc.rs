//! `ambidex bench rpc`: symmetric all-to-all RPCs (every node is client and server), with
//! the raw datagram rate of the same transport measured in the same run so the RPC
//! layer's cost shows as a ratio. All nodes run as threads of this process.

use ambidex::config::{ClusterSection, Transport};
use ambidex::transports::{InProcess, OpenError};
use ambidex_rpc::bench::{run_bench, RpcBenchConfig, RpcBenchReport};

/// Why `bench rpc` could not run: its flags, the cluster, or the benchmark itself.
#[derive(Debug, thiserror::Error)]
pub enum RpcBenchError {
    /// Fewer than 2 nodes, or no thread, coroutine or request per batch.
    #[error(
        "need --nodes >= 2 and at least one thread, coroutine and request per batch \
         (got --nodes {nodes} --threads {threads} --coroutines {coroutines} --batch {batch})"
    )]
    Shape {
        nodes: u16,
        threads: u16,
        coroutines: u16,
        batch: u16,
    },
    /// `--duration` outside (0, 3600].
    #[error("--duration must be between 0 and 3600 seconds (got {0})")]
    Duration(f64),
    /// `--rounds` outside 1..=100.
    #[error("--rounds must be between 1 and 100 (got {0})")]
    Rounds(u16),
    /// The in-process cluster could not be opened.
    #[error("opening a {transport} cluster of {nodes} nodes")]
    Open {
        /// The transport's name.
        transport: &'static str,
        /// Its nodes.
        nodes: u16,
        /// Why.
        #[source]
        source: OpenError,
    },
    /// The benchmark could not run or finish.
    #[error("the RPC benchmark")]
    Run(#[source] ambidex_rpc::bench::RpcBenchError),
}

#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    #[arg(long, default_value = "local")]
    pub transport: Transport,
    #[arg(long, default_value_t = 2)]
    pub nodes: u16,
    /// Threads (runtimes) per node.
    #[arg(long, default_value_t = 1)]
    pub threads: u16,
    /// Worker coroutines per thread.
    #[arg(long, default_value_t = 20)]
    pub coroutines: u16,
    /// Requests per flush (one doorbell).
    #[arg(long, default_value_t = 4)]
    pub batch: u16,
    /// Request and response payload bytes.
    #[arg(long, default_value_t = 32)]
    pub size: usize,
    /// Send each batch to one node (its requests coalesce into one datagram).
    #[arg(long)]
    pub coalesce: bool,
    /// Empty polls a thread spins before yielding (default: `RuntimeConfig`'s).
    #[arg(long)]
    pub spin_polls: Option<u32>,
    /// Polls after a yield before parking (default: `RuntimeConfig`'s).
    #[arg(long)]
    pub yield_polls: Option<u32>,
    /// Microseconds an idle thread with RPCs in flight keeps polling before it parks
    /// (default: 50 if every node thread has a core, else 0; see `RuntimeConfig::busy_wait`).
    #[arg(long)]
    pub busy_wait_us: Option<u64>,
    /// Seconds of each phase (raw, then RPC) per round.
    #[arg(long, default_value_t = 1.0)]
    pub duration: f64,
    /// Rounds of alternating raw and RPC phases (the figures sum over them).
    #[arg(long, default_value_t = 3)]
    pub rounds: u16,
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &Args) -> Result<RpcBenchReport, RpcBenchError> {
    if a.nodes < 2 || a.threads == 0 || a.coroutines == 0 || a.batch == 0 {
        return Err(RpcBenchError::Shape {
            nodes: a.nodes,
            threads: a.threads,
            coroutines: a.coroutines,
            batch: a.batch,
        });
    }
    if !(a.duration > 0.0 && a.duration <= 3600.0) {
        return Err(RpcBenchError::Duration(a.duration));
    }
    if a.rounds == 0 || a.rounds > 100 {
        return Err(RpcBenchError::Rounds(a.rounds));
    }
    let cluster = InProcess::open(&ClusterSection {
        transport: a.transport,
        nodes: a.nodes,
        threads: a.threads,
        ..ClusterSection::default()
    })
    .map_err(|source| RpcBenchError::Open {
        transport: a.transport.name(),
        nodes: a.nodes,
        source,
    })?;
    let cfg = RpcBenchConfig {
        nodes: a.nodes,
        threads: a.threads,
        coroutines: a.coroutines,
        batch: a.batch,
        size: a.size,
        coalesce: a.coalesce,
        no_coalescing: false,
        spin_polls: a.spin_polls,
        yield_polls: a.yield_polls,
        busy_wait_us: a.busy_wait_us,
        duration_s: a.duration,
        rounds: a.rounds,
    };
    run_bench(&cfg, cluster.nodes.clone()).map_err(RpcBenchError::Run)
}

pub fn print_summary(a: &Args, r: &RpcBenchReport) {
    println!(
        "ambidex RPC benchmark: {} backend, {} nodes x {} threads x {} coroutines, batch {}, {} B, {} rounds",
        a.transport.name(),
        a.nodes,
        a.threads,
        a.coroutines,
        a.batch,
        a.size,
        a.rounds
    );
    println!(
        "  RPCs:      {:>12.0} /s  {:>12.0} per CPU-second   latency p50 {:.1} us  p99 {:.1} us  p99.9 {:.1} us",
        r.rpcs_per_s, r.rpcs_per_cpu_s, r.latency_us.p50, r.latency_us.p99, r.latency_us.p999
    );
    println!(
        "  raw datagrams (same run): {:>12.0} per CPU-second   RPC/raw ratio {:.2}",
        r.raw_datagrams_per_cpu_s, r.rpc_to_raw_ratio
    );
    println!("  retransmits {}  RPC drops {}", r.retransmits, r.rpc_drops);
}
