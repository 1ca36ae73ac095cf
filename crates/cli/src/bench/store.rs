//! `ambidex bench store`: the hash table against `std::collections::HashMap` with the same
//! keys in the same run (lookups and updates, one thread and all threads), and memory
//! per item.

use ambidex_store::bench::{run_bench, StoreBenchConfig, StoreBenchReport};

/// Flags `bench store` cannot run with.
#[derive(Debug, thiserror::Error)]
pub enum StoreBenchError {
    /// `--items` outside 1000..=500000000.
    #[error("--items must be between 1000 and 500000000 (got {0})")]
    Items(usize),
    /// `--duration` outside (0, 600].
    #[error("--duration must be between 0 and 600 seconds (got {0})")]
    Duration(f64),
    /// `--threads 0`.
    #[error("--threads must be at least 1")]
    NoThreads,
}

#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Items in the 8-byte-key / 40-byte-value table (created 90% full).
    #[arg(long, default_value_t = 1_000_000)]
    pub items: usize,
    /// Threads of the all-thread measurements (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 1.0)]
    pub duration: f64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &Args) -> Result<StoreBenchReport, StoreBenchError> {
    if a.items < 1000 || a.items > 500_000_000 {
        return Err(StoreBenchError::Items(a.items));
    }
    if !(a.duration > 0.0 && a.duration <= 600.0) {
        return Err(StoreBenchError::Duration(a.duration));
    }
    let mut cfg = StoreBenchConfig {
        items: a.items,
        seconds: a.duration,
        seed: a.seed,
        ..Default::default()
    };
    if let Some(t) = a.threads {
        if t == 0 {
            return Err(StoreBenchError::NoThreads);
        }
        cfg.threads = t;
    }
    Ok(run_bench(&cfg))
}

pub fn print_summary(r: &StoreBenchReport) {
    println!(
        "ambidex store benchmark: {} items, 8-byte keys, {}-byte values",
        r.items, r.value_size
    );
    println!(
        "  lookups, 1 thread:   {:>12.0}/s   HashMap {:>12.0}/s   ratio {:.2}",
        r.lookups_per_s, r.hashmap_lookups_per_s, r.lookup_ratio
    );
    println!(
        "  updates, 1 thread:   {:>12.0}/s   HashMap {:>12.0}/s   ratio {:.2}",
        r.updates_per_s, r.hashmap_updates_per_s, r.update_ratio
    );
    println!(
        "  lookups, {} threads: {:>12.0}/s   HashMap {:>12.0}/s   ratio {:.2}",
        r.threads,
        r.all_threads_lookups_per_s,
        r.all_threads_hashmap_lookups_per_s,
        r.all_threads_lookup_ratio
    );
    println!(
        "  memory: {:.1} B/item for 8/40 at {:.0}% occupancy; {:.1} B/item for 8/8 at 90% (raw {:.0} B)",
        r.bytes_per_item_8_40,
        r.occupancy_8_40 * 100.0,
        r.bytes_per_item_8_8_at_90pct,
        r.raw_bytes_per_item_8_8
    );
}
