//! Runs one workload benchmark and prints its report as JSON (what `ambidex bench
//! WORKLOAD` will do once the CLI is wired):
//!
//! ```text
//! cargo run --release -p ambidex-workloads --example bench -- smallbank \
//!     [--nodes 3] [--threads 1] [--coroutines 8] [--replication 3] [--duration 5]
//!     [--warmup 1] [--scale X] [--seed 42] [--transport local|shm] [--r 1 --w 0 --same-node]
//!     [--sweep-coroutines 1,2,4,8,16] [--phase-breakdown] [--plot out.svg]
//! ```

use ambidex_workloads::plot::{plot, Plot};
use ambidex_workloads::{run_bench, sweep_coroutines, BenchConfig};

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let mut cfg = BenchConfig {
        workload: args
            .next()
            .ok_or("usage: bench WORKLOAD [options]")?
            .parse()?,
        ..Default::default()
    };
    let (mut sweep, mut phases, mut plot_path) = (None, false, None);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(format!("{a} needs a value"));
        let num = |v: String| v.parse::<f64>().map_err(|e| format!("{a}: {e}"));
        match a.as_str() {
            "--nodes" => cfg.nodes = num(val()?)? as u16,
            "--threads" => cfg.threads = num(val()?)? as u16,
            "--coroutines" => cfg.coroutines = num(val()?)? as usize,
            "--replication" => cfg.replication = num(val()?)? as u16,
            "--duration" => cfg.duration_s = num(val()?)?,
            "--warmup" => cfg.warmup_s = num(val()?)?,
            "--scale" => cfg.scale = Some(num(val()?)?),
            "--seed" => cfg.seed = num(val()?)? as u64,
            "--transport" => cfg.transport = val()?.parse()?,
            "--r" => cfg.objstore.reads = num(val()?)? as usize,
            "--w" => cfg.objstore.writes = num(val()?)? as usize,
            "--same-node" => cfg.objstore.same_node = true,
            "--no-progress" => cfg.progress = false,
            "--sweep-coroutines" => {
                sweep = Some(
                    val()?
                        .split(',')
                        .map(|s| s.trim().parse::<usize>().map_err(|e| e.to_string()))
                        .collect::<Result<Vec<_>, _>>()?,
                )
            }
            "--phase-breakdown" => phases = true,
            "--plot" => plot_path = Some(std::path::PathBuf::from(val()?)),
            _ => return Err(format!("unknown option {a}")),
        }
    }
    if let Some(counts) = sweep {
        let (points, _) = sweep_coroutines(&cfg, &counts)?;
        if let Some(p) = &plot_path {
            plot(
                Plot::Sweep(&points),
                &format!("{} throughput vs latency", cfg.workload.name()),
                p,
            )?;
        }
        println!(
            "{}",
            serde_json::to_string_pretty(&points).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    let r = run_bench(&cfg)?;
    if phases {
        println!(
            "{}",
            serde_json::to_string_pretty(&r.phase_means_us).map_err(|e| e.to_string())?
        );
        if let Some(p) = &plot_path {
            plot(
                Plot::Phases(&r.phase_means_us),
                &format!("{} mean µs per phase", cfg.workload.name()),
                p,
            )?;
        }
        return Ok(());
    }
    println!(
        "{}",
        serde_json::to_string_pretty(&r).map_err(|e| e.to_string())?
    );
    Ok(())
}
