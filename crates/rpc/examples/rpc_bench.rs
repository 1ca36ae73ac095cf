//! Runs the RPC benchmark on the local transport and prints the JSON report: the
//! benchmark of `ambidex bench rpc --transport local`, built with this crate alone (quick
//! A/B builds of the runtime). The argument is an `RpcBenchConfig` as JSON.
//! `cargo run --release -p ambidex-rpc --example rpc_bench -- '{"nodes":2,"batch":4}'`

use ambidex_rpc::bench::{run_bench, RpcBenchConfig};
use ambidex_transport::local::LocalFabric;
use ambidex_transport::ClusterConfig;

fn main() {
    let arg = std::env::args().nth(1).unwrap_or_else(|| "{}".into());
    let cfg: RpcBenchConfig = serde_json::from_str(&arg).expect("config JSON");
    let fabric = LocalFabric::new(ClusterConfig::new(cfg.nodes, cfg.threads)).expect("fabric");
    match run_bench(&cfg, fabric.nodes()) {
        Ok(r) => println!("{}", serde_json::to_string_pretty(&r).unwrap()),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
