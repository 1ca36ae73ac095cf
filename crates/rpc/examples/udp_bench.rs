//! The RPC benchmark over the udp backend on loopback (all nodes in this process).
//! `cargo run --release -p ambidex-rpc --example udp_bench -- '{"nodes":2,"batch":4}'`
use ambidex_rpc::bench::{run_bench, RpcBenchConfig};
use ambidex_transport::ClusterConfig;
use ambidex_transport_udp::UdpNode;
use std::net::SocketAddr;

fn main() {
    let arg = std::env::args().nth(1).unwrap_or_else(|| "{}".into());
    let cfg: RpcBenchConfig = serde_json::from_str(&arg).expect("config JSON");
    let cc = ClusterConfig::new(cfg.nodes, cfg.threads);
    let addrs: Vec<SocketAddr> = (0..cfg.nodes)
        .map(|n| format!("127.0.0.1:{}", 47100 + 10 * n).parse().unwrap())
        .collect();
    let nodes = (0..cfg.nodes)
        .map(|n| UdpNode::open(&cc, &addrs, n).expect("udp node"))
        .collect();
    match run_bench(&cfg, nodes) {
        Ok(r) => println!("{}", serde_json::to_string_pretty(&r).unwrap()),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
