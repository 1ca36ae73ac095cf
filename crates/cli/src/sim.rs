//! `ambidex sim`: the whole cluster in one thread over a simulated network, from a seed,
//! with every history checked (`crates/sim`, `docs/simulation.md`).

use ambidex_sim::{FaultProfile, InjectedBug, Scripted, SimReport, SimSpec};
use ambidex_workloads::WorkloadKind;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// smallbank, tatp, tpcc, tpcc-no or object-store.
    #[arg(long, default_value = "smallbank")]
    pub workload: String,
    /// The seed of one run (0 if neither --seed nor --seeds is given).
    #[arg(long, conflicts_with = "seeds")]
    pub seed: Option<u64>,
    /// Many runs: seeds A..B (B excluded) or A..=B. Prints every failing seed with the
    /// command that reproduces it, and exits non-zero if any failed.
    #[arg(long)]
    pub seeds: Option<String>,
    /// Scheduler steps (one node's master step each) before the workers stop.
    #[arg(long, default_value_t = 2000)]
    pub steps: u64,
    /// Fault profile: none, lossy, reorder, partition, pause, onesided, chaos.
    #[arg(long, default_value = "chaos")]
    pub faults: String,
    #[arg(long, default_value_t = 3)]
    pub nodes: u16,
    /// Threads (runtimes) per node.
    #[arg(long, default_value_t = 1)]
    pub threads: u16,
    /// Worker coroutines per thread.
    #[arg(long, default_value_t = 4)]
    pub coroutines: usize,
    #[arg(long, default_value_t = 3)]
    pub replication: u16,
    /// Workload scale (default: a tiny population chosen for contention).
    #[arg(long)]
    pub scale: Option<f64>,
    /// Cut nodes off at a fixed simulated time: NODES@FROM..UNTIL in ms, e.g. 2@1..6 or
    /// 0,1@0.5..3 (repeatable; besides the profile's partitions).
    #[arg(long, value_name = "NODES@FROM..UNTIL")]
    pub partition: Vec<String>,
    /// Do not schedule a node for a while: NODE@FROM..UNTIL in ms (repeatable).
    #[arg(long, value_name = "NODE@FROM..UNTIL")]
    pub pause: Vec<String>,
    /// TEST ONLY: run a deliberately broken protocol (skip-validation).
    #[arg(long)]
    pub inject_bug: Option<String>,
    /// With --seeds: seeds run in parallel on this many threads (each seed is still one
    /// deterministic thread). Default: the number of cores.
    #[arg(long)]
    pub jobs: Option<usize>,
    /// One JSON report (one seed) or a JSON summary (--seeds) on stdout.
    #[arg(long)]
    pub json: bool,
    /// One seed: write its recorded history (JSON lines, docs/history-format.md) to FILE.
    #[arg(long)]
    pub history: Option<PathBuf>,
    /// One seed: print the last N network events.
    #[arg(long, default_value_t = 0)]
    pub trace: usize,
}

/// Parses `A..B` (B excluded) or `A..=B` into the seeds it names.
fn parse_seeds(s: &str) -> Result<std::ops::Range<u64>, String> {
    let bad = || format!("--seeds {s:?}: expected A..B or A..=B with A < B (for example 0..200)");
    let (a, b, inclusive) = if let Some((a, b)) = s.split_once("..=") {
        (a, b, true)
    } else if let Some((a, b)) = s.split_once("..") {
        (a, b, false)
    } else {
        return Err(bad());
    };
    let a: u64 = a.trim().parse().map_err(|_| bad())?;
    let b: u64 = b.trim().parse().map_err(|_| bad())?;
    let end = if inclusive {
        b.checked_add(1).ok_or_else(bad)?
    } else {
        b
    };
    if a >= end {
        return Err(bad());
    }
    if end - a > 10_000_000 {
        return Err(format!("--seeds {s:?}: at most 10000000 seeds per command"));
    }
    Ok(a..end)
}

fn spec(a: &Args) -> Result<SimSpec, String> {
    let workload: WorkloadKind = a.workload.parse()?;
    let mut s = SimSpec::new(workload, a.seed.unwrap_or(0));
    s.steps = a.steps;
    s.faults = FaultProfile::named(&a.faults)?;
    s.nodes = a.nodes;
    s.threads = a.threads;
    s.coroutines = a.coroutines;
    s.replication = a.replication;
    s.scale = a.scale;
    s.bug = a
        .inject_bug
        .as_deref()
        .map(str::parse::<InjectedBug>)
        .transpose()?;
    s.trace_events = a.trace;
    for p in &a.partition {
        s.script.push(Scripted::parse(p, false)?);
    }
    for p in &a.pause {
        s.script.push(Scripted::parse(p, true)?);
    }
    s.validate()?;
    Ok(s)
}

pub fn run(a: &Args) -> Result<(), String> {
    let spec = spec(a)?;
    match &a.seeds {
        Some(range) => {
            if a.history.is_some() || a.trace > 0 {
                return Err("--history and --trace need a single --seed".into());
            }
            many(a, &spec, parse_seeds(range)?)
        }
        None => one(a, &spec),
    }
}

fn first_line(s: &str, max: usize) -> String {
    let mut l: String = s.chars().take(max).collect();
    if s.chars().count() > max {
        l.push('…');
    }
    l
}

fn one(a: &Args, spec: &SimSpec) -> Result<(), String> {
    let t0 = Instant::now();
    let r = ambidex_sim::run(spec)?;
    let wall = t0.elapsed().as_secs_f64();
    if let Some(path) = &a.history {
        let mut text = String::new();
        for rec in &r.history {
            text.push_str(&ambidex_history::format::to_line(rec));
            text.push('\n');
        }
        std::fs::write(path, text)
            .map_err(|e| format!("cannot write the history to {}: {e}", path.display()))?;
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&r).map_err(|e| e.to_string())?
        );
    } else {
        print_one(&r, wall);
    }
    if r.passed() {
        Ok(())
    } else {
        Err(format!(
            "seed {} failed {} check(s); reproduce with: {}",
            r.seed,
            r.failures.len(),
            r.command
        ))
    }
}

fn print_one(r: &SimReport, wall: f64) {
    println!(
        "sim {} seed {} faults={}{}: {}",
        r.workload,
        r.seed,
        r.faults,
        r.bug
            .as_deref()
            .map(|b| format!(" inject-bug={b}"))
            .unwrap_or_default(),
        if r.passed() { "PASS" } else { "FAIL" }
    );
    let aborts: Vec<String> = r
        .aborts_by_reason
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    println!(
        "  {} steps (+{} quiescing), {:.3} ms simulated, {:.3} s wall; {} committed, {} aborted ({})",
        r.steps,
        r.quiesce_steps,
        r.sim_time_ns as f64 / 1e6,
        wall,
        r.committed,
        r.aborted,
        if aborts.is_empty() {
            "none".into()
        } else {
            aborts.join(", ")
        }
    );
    let n = &r.net;
    println!(
        "  network: {} datagrams sent, {} delivered; dropped {} (fault) {} (partition) {} (queue full); {} duplicated, {} reordered, {} delayed; {} partitions, {} pauses",
        n.datagrams_sent,
        n.datagrams_delivered,
        n.dropped_fault,
        n.dropped_partition,
        n.dropped_queue_full,
        n.duplicated,
        n.reordered,
        n.delayed,
        r.partitions,
        r.pauses
    );
    println!(
        "  rpc: {} issued, {} retransmits, {} duplicate requests served from the cache, {} failed",
        r.rpc.rpcs_issued, r.rpc.retransmits, r.rpc.duplicate_requests, r.rpc.rpcs_failed
    );
    println!(
        "  history: {} transactions, serializable={}; workload check: {}",
        r.history_transactions, r.serializable, r.workload_check
    );
    println!(
        "  run hash {} (network {}, state {})",
        r.run_hash, r.trace_hash, r.state_digest
    );
    for f in &r.failures {
        println!("  FAILED {f}");
    }
    if !r.trace_tail.is_empty() {
        println!("  last {} network events:", r.trace_tail.len());
        for l in &r.trace_tail {
            println!("    {l}");
        }
    }
    if !r.passed() {
        println!("  reproduce: {}", r.command);
    }
}

#[derive(serde::Serialize)]
struct SeedLine {
    seed: u64,
    passed: bool,
    committed: u64,
    aborted: u64,
    run_hash: String,
    failures: Vec<String>,
    command: String,
}

fn many(a: &Args, template: &SimSpec, seeds: std::ops::Range<u64>) -> Result<(), String> {
    let jobs = a
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, 256);
    let count = (seeds.end - seeds.start) as usize;
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Result<SeedLine, String>>> = Mutex::new(Vec::new());
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..jobs.min(count) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return;
                }
                let mut spec = template.clone();
                spec.seed = seeds.start + i as u64;
                let line = ambidex_sim::run(&spec).map(|r| SeedLine {
                    seed: r.seed,
                    passed: r.passed(),
                    committed: r.committed,
                    aborted: r.aborted,
                    run_hash: r.run_hash,
                    failures: r.failures,
                    command: r.command,
                });
                if let Ok(l) = &line {
                    if !l.passed && !a.json {
                        eprintln!(
                            "(seed {} failed; listed with its command at the end)",
                            l.seed
                        );
                    }
                }
                results.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            });
        }
    });
    let wall = t0.elapsed().as_secs_f64();
    let mut lines = Vec::new();
    for r in results.into_inner().unwrap_or_else(|p| p.into_inner()) {
        lines.push(r?);
    }
    lines.sort_by_key(|l| l.seed);
    let failed: Vec<&SeedLine> = lines.iter().filter(|l| !l.passed).collect();
    let committed: u64 = lines.iter().map(|l| l.committed).sum();
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "workload": template.workload.name(),
                "faults": template.faults.name,
                "steps": template.steps,
                "seeds": lines.len(),
                "failed": failed.len(),
                "seconds": wall,
                "seeds_per_s": lines.len() as f64 / wall.max(1e-9),
                "jobs": jobs,
                "runs": lines,
            }))
            .map_err(|e| e.to_string())?
        );
    } else {
        for l in &failed {
            println!("FAIL seed {}: {}", l.seed, first_line(&l.failures[0], 300));
            println!("  reproduce: {}", l.command);
        }
        println!(
            "sim {} faults={}{} steps={} seeds {}..{}: {} run, {} failed; {:.1} committed per seed; {:.1} s, {:.1} seeds/s ({} jobs)",
            template.workload.name(),
            template.faults.name,
            template
                .bug
                .map(|b| format!(" inject-bug={}", b.name()))
                .unwrap_or_default(),
            template.steps,
            seeds.start,
            seeds.end,
            lines.len(),
            failed.len(),
            committed as f64 / lines.len().max(1) as f64,
            wall,
            lines.len() as f64 / wall.max(1e-9),
            jobs
        );
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("{} of {} seeds failed", failed.len(), lines.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::parse_seeds;

    #[test]
    fn seed_ranges_parse_or_fail_clearly() {
        assert_eq!(parse_seeds("0..200").unwrap(), 0..200);
        assert_eq!(parse_seeds("5..=5").unwrap(), 5..6);
        for bad in [
            "",
            "5",
            "5..5",
            "9..3",
            "a..b",
            "1..=18446744073709551615",
            "-1..3",
        ] {
            assert!(parse_seeds(bad).is_err(), "{bad:?}");
        }
        assert!(parse_seeds("0..20000000").is_err());
    }
}
