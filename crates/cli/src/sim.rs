//! `ambidex sim`: the whole cluster in one thread over a simulated network, from a seed,
//! with every history checked (`crates/sim`, `docs/simulation.md`).

use crate::config_args::{set, ConfigArgs};
use ambidex::bench::report::{one_sided_line, policy_line};
use ambidex::bench::PolicyReport;
use ambidex::config::InjectedBug;
use ambidex::sim::SimReport;
use ambidex::Config;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub cfg: ConfigArgs,
    /// The workload, by its registered name: smallbank, tatp, tpcc, tpcc-no,
    /// object-store, stress, tpce, or one the program registered [default: smallbank].
    #[arg(long)]
    pub workload: Option<String>,
    /// The seed of one run (the config's `run.seed`, 0 by default, if neither --seed nor
    /// --seeds is given).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Many runs: seeds A..B (B excluded) or A..=B. Prints every failing seed with the
    /// command that reproduces it, and exits non-zero if any failed.
    #[arg(long)]
    pub seeds: Option<String>,
    /// Scheduler steps (one node's master step each) before the workers stop [default: 2000].
    #[arg(long)]
    pub steps: Option<u64>,
    /// Fault profile: none, lossy, reorder, partition, pause, onesided, chaos, crash
    /// (one node crashes in a protocol phase, or two during recovery), crash-restart
    /// (as crash, then each crashed node restarts empty as a new incarnation and
    /// rejoins), long-partition (one node cut off for longer than the give-up time)
    /// [default: chaos].
    #[arg(long)]
    pub faults: Option<String>,
    /// Cut nodes off at a fixed simulated time: NODES@FROM..UNTIL in ms, e.g. 2@1..6 or
    /// 0,1@0.5..3 (repeatable; besides the profile's partitions; replaces the config's).
    #[arg(long, value_name = "NODES@FROM..UNTIL")]
    pub partition: Vec<String>,
    /// Do not schedule a node for a while: NODE@FROM..UNTIL in ms (repeatable).
    #[arg(long, value_name = "NODE@FROM..UNTIL")]
    pub pause: Vec<String>,
    /// TEST ONLY: run a deliberately broken protocol (skip-validation,
    /// recovery-skips-dead-coordinators, joiner-serves-old-epoch).
    #[arg(long)]
    pub inject_bug: Option<InjectedBug>,
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
    #[arg(long)]
    pub trace: Option<usize>,
}

/// Why `ambidex sim` failed: a bad command line or configuration, a simulation that
/// could not be made, a report that could not be written, or failing seeds.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimCmdError {
    /// `--config FILE` or a flag is refused.
    #[error(transparent)]
    Flags(ambidex::config::ConfigError),
    /// `--seeds` is not a range of seeds.
    #[error("--seeds {arg:?}: expected A..B or A..=B with A < B (for example 0..200)")]
    BadSeeds {
        /// The argument given.
        arg: String,
    },
    /// `--seeds` names more seeds than one command runs.
    #[error("--seeds {arg:?}: at most {MAX_SEEDS} seeds per command, not {count}")]
    TooManySeeds {
        /// The argument given.
        arg: String,
        /// The seeds it names.
        count: u64,
    },
    /// Both `--seed` and `--seeds`.
    #[error("--seed and --seeds: give one of them")]
    SeedAndSeeds,
    /// `--history` or `--trace` with `--seeds`.
    #[error("--history and --trace need a single --seed")]
    OneSeedOnly,
    /// No workload is registered under the name given.
    #[error(transparent)]
    UnknownWorkload(#[from] ambidex::workload::UnknownWorkload),
    /// The simulation's configuration is refused.
    #[error(transparent)]
    Config(#[from] ambidex::sim::SimConfigError),
    /// The transaction policy is refused.
    #[error(transparent)]
    Policy(#[from] ambidex::config::ConfigError),
    /// A seed's simulation could not be made.
    #[error(transparent)]
    Sim(#[from] ambidex::sim::SimError),
    /// The recorded history could not be written.
    #[error("cannot write the history to {path}: {source}")]
    History {
        /// The file.
        path: String,
        /// What the file system said.
        source: std::io::Error,
    },
    /// The JSON report could not be made.
    #[error("the JSON report: {0}")]
    Json(#[from] serde_json::Error),
    /// The seed's checks failed.
    #[error("seed {seed} failed {checks} check(s); reproduce with: {command}")]
    Failed {
        /// The seed.
        seed: u64,
        /// Its failed checks.
        checks: usize,
        /// The command that reproduces it.
        command: String,
    },
    /// Some of the seeds failed their checks.
    #[error("{failed} of {seeds} seeds failed")]
    SeedsFailed {
        /// Seeds that failed.
        failed: usize,
        /// Seeds run.
        seeds: usize,
    },
}

/// Most seeds one `--seeds` runs.
const MAX_SEEDS: u64 = 10_000_000;

/// Parses `A..B` (B excluded) or `A..=B` into the seeds it names.
fn parse_seeds(s: &str) -> Result<std::ops::Range<u64>, SimCmdError> {
    let bad = || SimCmdError::BadSeeds { arg: s.to_string() };
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
    if end - a > MAX_SEEDS {
        return Err(SimCmdError::TooManySeeds {
            arg: s.to_string(),
            count: end - a,
        });
    }
    Ok(a..end)
}

/// The simulation's configuration: the simulator's defaults, `--config FILE`, then the
/// flags; validated.
fn config(a: &Args) -> Result<Config, SimCmdError> {
    let mut c = a
        .cfg
        .resolve(&ambidex::sim::defaults("smallbank", 0))
        .map_err(SimCmdError::Flags)?;
    set(&mut c.run.workload, a.workload.clone());
    crate::registry().entry_exists(&c.run.workload)?;
    set(&mut c.run.seed, a.seed);
    set(&mut c.sim.steps, a.steps);
    set(&mut c.sim.faults, a.faults.clone());
    set(&mut c.sim.trace, a.trace);
    if !a.partition.is_empty() {
        c.sim.partitions = a.partition.clone();
    }
    if !a.pause.is_empty() {
        c.sim.pauses = a.pause.clone();
    }
    if a.inject_bug.is_some() {
        c.txn.inject_bug = a.inject_bug;
    }
    if let Some(h) = &a.history {
        c.run.history = Some(h.display().to_string());
    }
    ambidex::sim::validate(&c)?;
    Ok(c)
}

/// The reproducing command of a run, with `--config FILE` if the run had one.
fn reproduce(a: &Args, command: &str) -> String {
    match &a.cfg.config {
        Some(p) => command.replacen(
            "ambidex sim",
            &format!("ambidex sim --config {}", p.display()),
            1,
        ),
        None => command.to_string(),
    }
}

/// Runs `ambidex sim`: one seed, or many (`--seeds`).
pub fn run(a: &Args) -> Result<(), SimCmdError> {
    if a.seed.is_some() && a.seeds.is_some() {
        return Err(SimCmdError::SeedAndSeeds);
    }
    let cfg = config(a)?;
    match &a.seeds {
        Some(range) => {
            if cfg.run.history.is_some() || cfg.sim.trace > 0 {
                return Err(SimCmdError::OneSeedOnly);
            }
            many(a, &cfg, parse_seeds(range)?)
        }
        None => one(a, &cfg),
    }
}

fn first_line(s: &str, max: usize) -> String {
    let mut l: String = s.chars().take(max).collect();
    if s.chars().count() > max {
        l.push('…');
    }
    l
}

fn one(a: &Args, cfg: &Config) -> Result<(), SimCmdError> {
    let t0 = Instant::now();
    let mut r = ambidex::sim::run(crate::registry(), cfg)?;
    r.command = reproduce(a, &r.command);
    let wall = t0.elapsed().as_secs_f64();
    if let Some(path) = &cfg.run.history {
        let mut text = String::new();
        for rec in &r.history {
            text.push_str(&ambidex::history::format::to_line(rec));
            text.push('\n');
        }
        std::fs::write(path, text).map_err(|source| SimCmdError::History {
            path: path.clone(),
            source,
        })?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print_one(&r, wall);
    }
    if r.passed() {
        Ok(())
    } else {
        Err(SimCmdError::Failed {
            seed: r.seed,
            checks: r.failures.len(),
            command: r.command,
        })
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
    println!("  {}", policy_line(&r.policy));
    println!(
        "  rpc: {} issued, {} retransmits, {} duplicate requests served from the cache, {} failed",
        r.rpc.rpcs_issued, r.rpc.retransmits, r.rpc.duplicate_requests, r.rpc.rpcs_failed
    );
    println!("  {}", one_sided_line(&r.one_sided, &r.location_cache));
    for c in &r.crashes {
        println!(
            "  crash: node {} at {:.3} ms, target {} ({}; in {})",
            c.node,
            c.at_ns as f64 / 1e6,
            c.target,
            if c.hit { "hit" } else { "missed" },
            if c.phases.is_empty() {
                "no phase".to_string()
            } else {
                c.phases.join(", ")
            }
        );
    }
    let ms =
        |t: Option<u64>| t.map_or("never".to_string(), |t| format!("{:.3} ms", t as f64 / 1e6));
    for x in &r.restarts {
        println!(
            "  restart: node {} (crashed at {:.3} ms, removed {}) at {:.3} ms as incarnation {}{}; a member again {}, every copy synced {}; {} committed by it; its start-up check verified {} other tables",
            x.node,
            x.crashed_at_ns as f64 / 1e6,
            ms(x.removed_at_ns),
            x.at_ns as f64 / 1e6,
            x.incarnation,
            if x.before_removal { " (before its removal)" } else { "" },
            ms(x.rejoined_at_ns),
            ms(x.rereplicated_at_ns),
            x.committed,
            x.remote_tables_verified
        );
    }
    if let Some((n, from, until)) = r.long_partition {
        println!(
            "  long partition: node {n} cut off {:.3}..{:.3} ms",
            from as f64 / 1e6,
            until as f64 / 1e6
        );
    }
    println!(
        "  cluster: epoch {}, stage {}, members {:#b}; {} manager event(s); recovery: {} record(s), {} write(s) sent, {} lock(s) released; {} transaction(s) of unknown outcome taken as committed, {} as aborted",
        r.cluster.epoch,
        r.cluster.stage,
        r.cluster.members,
        r.cluster.events.len(),
        r.recovery.records,
        r.recovery.writes_sent,
        r.recovery.locks_released,
        r.unknown_committed,
        r.unknown_aborted
    );
    println!(
        "  history: {} transactions, serializable={}; workload check: {}",
        r.history_transactions, r.serializable, r.workload_check
    );
    println!(
        "  start-up check: {} other nodes' tables read one-sided and verified",
        r.remote_tables_verified
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
    remote_tables_verified: u64,
    run_hash: String,
    failures: Vec<String>,
    command: String,
}

fn many(a: &Args, template: &Config, seeds: std::ops::Range<u64>) -> Result<(), SimCmdError> {
    let jobs = a
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, 256);
    let count = (seeds.end - seeds.start) as usize;
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Result<SeedLine, ambidex::sim::SimError>>> = Mutex::new(Vec::new());
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..jobs.min(count) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return;
                }
                let mut cfg = template.clone();
                cfg.run.seed = seeds.start + i as u64;
                let line = ambidex::sim::run(crate::registry(), &cfg).map(|r| SeedLine {
                    seed: r.seed,
                    passed: r.passed(),
                    committed: r.committed,
                    aborted: r.aborted,
                    remote_tables_verified: r.remote_tables_verified,
                    run_hash: r.run_hash,
                    failures: r.failures,
                    command: reproduce(a, &r.command),
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
    let policy = PolicyReport::from(template.policy()?);
    let committed: u64 = lines.iter().map(|l| l.committed).sum();
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "workload": template.run.workload.as_str(),
                "faults": template.sim.faults,
                "steps": template.sim.steps,
                "policy": policy,
                "seeds": lines.len(),
                "failed": failed.len(),
                "seconds": wall,
                "seeds_per_s": lines.len() as f64 / wall.max(1e-9),
                "jobs": jobs,
                "runs": lines,
            }))?
        );
    } else {
        for l in &failed {
            println!("FAIL seed {}: {}", l.seed, first_line(&l.failures[0], 300));
            println!("  reproduce: {}", l.command);
        }
        println!(
            "sim {} {} faults={}{} steps={} seeds {}..{}: {} run, {} failed; {:.1} committed per seed; {:.1} s, {:.1} seeds/s ({} jobs)",
            template.run.workload.as_str(),
            policy_line(&policy),
            template.sim.faults,
            template
                .txn
                .inject_bug
                .map(|b| format!(" inject-bug={}", b.name()))
                .unwrap_or_default(),
            template.sim.steps,
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
        Err(SimCmdError::SeedsFailed {
            failed: failed.len(),
            seeds: lines.len(),
        })
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
