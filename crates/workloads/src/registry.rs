//! The built-in workloads by name: [`register`] puts each into a [`Registrar`] (the
//! facade's [`Registry`], which the benchmark, node processes and the simulator use), with
//! its defaults for benchmark runs and for simulations.

use crate::{objstore, smallbank, stress, tatp, tpcc, tpce};
use ambidex::config::ConfigError;
use ambidex::workload::{Registrar, Registry, WorkloadArgs, WorkloadError, WorkloadInfo};

/// The built-in workloads, by the names they are registered under.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WorkloadKind {
    /// FaSST's object store O(r, w) (`run.r`, `run.w`).
    ObjectStore,
    Tatp,
    #[default]
    SmallBank,
    /// Full TPC-C mix.
    Tpcc,
    /// DrTM+H's TPC-C variant: NewOrder only, always distributed.
    TpccNo,
    /// FaSST's `stress` correctness workload: groups of keys read, set or deleted whole.
    Stress,
    /// TPC-E's customer-position read-only transaction with 1% market feeds (DrTM+H §5.5).
    Tpce,
}

impl WorkloadKind {
    /// The name it is registered under.
    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::ObjectStore => "object-store",
            WorkloadKind::Tatp => "tatp",
            WorkloadKind::SmallBank => "smallbank",
            WorkloadKind::Tpcc => "tpcc",
            WorkloadKind::TpccNo => "tpcc-no",
            WorkloadKind::Stress => "stress",
            WorkloadKind::Tpce => "tpce",
        }
    }
}

impl std::str::FromStr for WorkloadKind {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        Ok(match s {
            "object-store" | "objstore" | "object" => WorkloadKind::ObjectStore,
            "tatp" => WorkloadKind::Tatp,
            "smallbank" => WorkloadKind::SmallBank,
            "tpcc" => WorkloadKind::Tpcc,
            "tpcc-no" => WorkloadKind::TpccNo,
            "stress" => WorkloadKind::Stress,
            "tpce" => WorkloadKind::Tpce,
            _ => {
                return Err(ConfigError::UnknownName {
                    what: "workload",
                    name: s.to_string(),
                    known: "object-store, tatp, smallbank, tpcc, tpcc-no, stress, tpce",
                })
            }
        })
    }
}

impl From<WorkloadKind> for String {
    fn from(k: WorkloadKind) -> String {
        k.name().to_string()
    }
}

impl PartialEq<WorkloadKind> for String {
    fn eq(&self, k: &WorkloadKind) -> bool {
        self == k.name()
    }
}

/// Market feeds in percent of a simulation's TPC-E transactions (the benchmark's 1%
/// would give a seed's few hundred transactions a few feeds to conflict with).
pub const SIM_TPCE_FEED_PERCENT: u32 = 5;
/// New orders per warehouse the TPC-C tables make room for in a simulation.
pub const SIM_TPCC_ORDER_HEADROOM: u64 = 1_000;
/// TPC-C customers (and initial orders) per district and items at the default sim scale.
pub const SIM_TPCC_CUSTOMERS: u64 = 12;
pub const SIM_TPCC_ITEMS: u64 = 100;

/// Registers every built-in workload into `r`. Worker coroutines per thread by default:
/// FaSST's ~20, enough to hide the network latency (FaSST §4.1); 8 for TPC-C, whose
/// transactions are long (DrTM+H finds a small number, e.g. 8, enough to hide RDMA's
/// latency, §3.2).
pub fn register(r: &mut impl Registrar) {
    r.add(
        WorkloadInfo {
            name: "object-store",
            aliases: &["objstore", "object"],
            about: "FaSST's object store O(r, w): r keys read, w of them written (run.r, run.w)",
            default_coroutines: 20,
            default_scale: 0.1,
            // 20 keys per thread.
            sim_scale: 0.00002,
        },
        |a: &WorkloadArgs<'_>| {
            objstore::ObjectStore::new(
                a.placement.clone(),
                a.config.cluster.threads,
                a.scale,
                a.config.objstore(),
            )
        },
    );
    r.add(
        WorkloadInfo {
            name: "tatp",
            aliases: &[],
            about: "TATP: seven transactions on subscribers, NURand ids (FaSST §6.2)",
            default_coroutines: 20,
            default_scale: 0.05,
            // 100 subscribers per node.
            sim_scale: 0.0001,
        },
        |a: &WorkloadArgs<'_>| Ok(tatp::Tatp::new(a.placement.clone(), a.scale)),
    );
    r.add(
        WorkloadInfo {
            name: "smallbank",
            aliases: &[],
            about: "SmallBank: six banking transactions, 4% hot accounts (FaSST §6.3)",
            default_coroutines: 20,
            default_scale: 1.0,
            // 50 accounts per thread; the hot set is 4% of them.
            sim_scale: 0.0005,
        },
        |a: &WorkloadArgs<'_>| {
            Ok(smallbank::SmallBank::new(
                a.placement.clone(),
                a.config.cluster.threads,
                a.scale,
            ))
        },
    );
    for (name, about, only_new_order) in [
        (
            "tpcc",
            "TPC-C's five-transaction mix (consistency conditions 1-4 checked)",
            false,
        ),
        (
            "tpcc-no",
            "DrTM+H's TPC-C variant: NewOrder only, always distributed",
            true,
        ),
    ] {
        r.add(
            WorkloadInfo {
                name,
                aliases: &[],
                about,
                default_coroutines: 8,
                default_scale: 0.1,
                // One warehouse per thread; customers and items below the loader's
                // minimums (SIM_TPCC_CUSTOMERS, SIM_TPCC_ITEMS).
                sim_scale: 0.001,
            },
            move |a: &WorkloadArgs<'_>| tpcc_params(a, only_new_order).map(tpcc::Tpcc::new),
        );
    }
    r.add(
        WorkloadInfo {
            name: "stress",
            aliases: &[],
            about: "FaSST's stress test: groups of keys read, set or deleted whole",
            default_coroutines: 20,
            default_scale: 0.1,
            // 16 groups of 4 keys, the minimum: few enough that reads, sets and deletes
            // of one group really race.
            sim_scale: 0.00001,
        },
        |a: &WorkloadArgs<'_>| Ok(stress::Stress::new(a.placement.clone(), a.scale)),
    );
    r.add(
        WorkloadInfo {
            name: "tpce",
            aliases: &[],
            about: "TPC-E's customer position with 1% market feeds (DrTM+H §5.5)",
            default_coroutines: 20,
            // TPC-E's smallest database, 5,000 customers per node: under a second.
            default_scale: 1.0,
            // 50 customers per node (about 4,500 holdings in all) and 103 securities: a
            // customer position reads about 27 of them and a market feed updates 10, so
            // feeds in flight meet most customer positions.
            sim_scale: 0.01,
        },
        |a: &WorkloadArgs<'_>| {
            let t = tpce::Tpce::new(a.placement.clone(), a.config.cluster.threads, a.scale);
            Ok(if a.simulated {
                t.with_feed_percent(SIM_TPCE_FEED_PERCENT)
            } else {
                t
            })
        },
    );
}

/// A registry of the built-in workloads.
pub fn registry() -> Registry {
    let mut r = Registry::new();
    register(&mut r);
    r
}

/// TPC-C's parameters for a benchmark run or a simulation.
fn tpcc_params(
    a: &WorkloadArgs<'_>,
    only_new_order: bool,
) -> Result<tpcc::TpccParams, WorkloadError> {
    let cfg = a.config;
    if cfg.run.scale.is_some_and(|s| s > 1.0) {
        return Err(ConfigError::Invalid {
            field: "run.scale",
            why: "TPC-C's scale is each warehouse's population, at most 1 (the spec's); \
                  more warehouses: run.warehouses_per_node (--warehouses)"
                .into(),
        }
        .into());
    }
    let threads = cfg.cluster.threads;
    if !a.simulated {
        let mut p = tpcc::TpccParams::new(
            a.placement.clone(),
            threads,
            cfg.warehouses_per_node(),
            a.scale,
            only_new_order,
            cfg.run.warmup_s + cfg.run.duration_s,
        );
        p.outstanding_requests = cfg.run.outstanding_requests;
        return Ok(p);
    }
    let warehouses = cfg.cluster.nodes as u32 * (threads as u32);
    if only_new_order && warehouses < 2 {
        return Err(tpcc::TpccError::TooFewWarehouses { warehouses }.into());
    }
    // One warehouse per thread unless the configuration says otherwise: few enough that
    // a few hundred transactions really conflict.
    let mut p = tpcc::TpccParams::new(
        a.placement.clone(),
        threads,
        cfg.run.warehouses_per_node.unwrap_or(threads as u64),
        a.scale,
        only_new_order,
        0.0,
    );
    p.outstanding_requests = cfg.run.outstanding_requests;
    if cfg.run.scale.is_none() {
        // Smaller than the loader's own minimums: a simulation runs a few hundred
        // transactions, and loading is most of a seed's time.
        p.customers = SIM_TPCC_CUSTOMERS;
        p.initial_orders = SIM_TPCC_CUSTOMERS;
        p.items = SIM_TPCC_ITEMS;
    }
    p.order_headroom = SIM_TPCC_ORDER_HEADROOM;
    Ok(p)
}
