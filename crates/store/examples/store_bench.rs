//! `cargo run --release -p ambidex-store --example store_bench -- [items] [threads] [seconds]`
//! prints the store benchmark report as JSON.

fn main() {
    let mut cfg = ambidex_store::StoreBenchConfig::default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(v) = args.first().and_then(|s| s.parse().ok()) {
        cfg.items = v;
    }
    if let Some(v) = args.get(1).and_then(|s| s.parse().ok()) {
        cfg.threads = v;
    }
    if let Some(v) = args.get(2).and_then(|s| s.parse().ok()) {
        cfg.seconds = v;
    }
    let r = ambidex_store::run_bench(&cfg);
    println!(
        "{}",
        serde_json::to_string_pretty(&r).expect("report serialises")
    );
}
