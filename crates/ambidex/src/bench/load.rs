//! Building and loading the nodes' databases, the same way on every path: every unit of
//! the workload is generated from its own seeded stream (so the data depends neither on
//! the thread nor on the number of threads), and each node's tables are written by one
//! thread only, in unit order.

use super::BenchError;
use crate::workload::{worker_seed, Loader, Workload, WorkloadError};
use ambidex_transport::SharedNode;
use ambidex_txn::{NodeDb, Placement};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// Creates one database per node (in regions of `transports[n]`, node n's) with the
/// workload's tables, loads them in parallel and gives every node the cluster's catalog.
pub fn build_and_load<W: Workload>(
    wl: &W,
    placement: Placement,
    transports: &[SharedNode],
    seed: u64,
    progress: bool,
) -> Result<Vec<Arc<NodeDb>>, BenchError> {
    let opts = LoadOptions {
        progress,
        ..Default::default()
    };
    build_nodes(wl, placement, transports, seed, &opts)
}

/// Creates and loads the database of `transport`'s node only (a node process of a
/// multi-process cluster): every unit is generated, and only this node's rows are
/// stored. Its catalog comes later, from the launcher.
pub fn build_and_load_node<W: Workload>(
    wl: &W,
    placement: Placement,
    transport: &SharedNode,
    seed: u64,
    progress: bool,
) -> Result<Arc<NodeDb>, BenchError> {
    let node = transport.node();
    if node >= placement.nodes() {
        return Err(BenchError::NodeOutsideCluster {
            node,
            nodes: placement.nodes(),
        });
    }
    let opts = LoadOptions {
        progress,
        no_catalog: true,
        ..Default::default()
    };
    let mut dbs = build_nodes(wl, placement, std::slice::from_ref(transport), seed, &opts)?;
    Ok(dbs.pop().expect("one database"))
}

/// How [`build_nodes`] loads.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// A progress bar on stderr.
    pub progress: bool,
    /// Loading threads (`None`: one per node, up to the cores; the simulator loads in
    /// its own thread, `Some(1)`).
    pub threads: Option<usize>,
    /// Caps every table's rows per node (the simulator's short runs need little room).
    pub max_capacity: Option<usize>,
    /// Leave the catalog unset even when every node is built here (a node process: its
    /// catalog comes from the launcher, even in a one-node cluster).
    pub no_catalog: bool,
}

/// The databases of the nodes of `transports` (tables in regions registered on each
/// node's transport), with the workload's tables, loaded: the one way every path
/// (in-process runs, node processes, the simulator) builds its nodes' data. When
/// `transports` are every node of the cluster, every node gets the cluster's catalog
/// (in process, the descriptors are exchanged directly).
pub fn build_nodes<W: Workload>(
    wl: &W,
    placement: Placement,
    transports: &[SharedNode],
    seed: u64,
    opts: &LoadOptions,
) -> Result<Vec<Arc<NodeDb>>, BenchError> {
    let mut specs = wl.tables();
    if let Some(cap) = opts.max_capacity {
        for s in &mut specs {
            s.capacity_per_node = s.capacity_per_node.min(cap);
        }
    }
    let dbs: Vec<Arc<NodeDb>> = transports
        .iter()
        .map(|t| NodeDb::new(&**t, placement.clone(), &specs))
        .collect::<Result<_, _>>()?;
    load_parallel(wl, &dbs, seed, opts).map_err(|source| BenchError::Workload {
        what: "loaded",
        source,
    })?;
    wl.after_load(&dbs).map_err(|source| BenchError::Workload {
        what: "loaded",
        source,
    })?;
    if !opts.no_catalog
        && dbs.len() == placement.nodes() as usize
        && dbs.iter().enumerate().all(|(i, d)| d.node as usize == i)
    {
        let cat = NodeDb::catalog_of(&dbs)?;
        for db in &dbs {
            db.set_catalog(cat.clone())?;
        }
    }
    Ok(dbs)
}

fn load_parallel<W: Workload>(
    wl: &W,
    dbs: &[Arc<NodeDb>],
    seed: u64,
    opts: &LoadOptions,
) -> Result<(), WorkloadError> {
    let units = wl.load_units();
    let nodes = dbs.iter().map(|d| d.node as usize + 1).max().unwrap_or(0);
    // One thread per group of nodes; generation (cheap) is repeated by every thread so
    // that each node's tables are written by one thread only.
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let threads = opts
        .threads
        .unwrap_or_else(|| dbs.len().min(cores.max(2)))
        .clamp(1, dbs.len().max(1));
    let bar = if opts.progress {
        let b = indicatif::ProgressBar::with_draw_target(
            Some(units),
            indicatif::ProgressDrawTarget::stderr(),
        );
        b.set_style(
            indicatif::ProgressStyle::with_template("loading {msg} [{bar:40}] {pos}/{len} ({eta})")
                .expect("template")
                .progress_chars("=> "),
        );
        b.set_message(wl.name());
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let failed = std::sync::atomic::AtomicBool::new(false);
    let err: Mutex<Option<WorkloadError>> = Mutex::new(None);
    // Thread t writes the databases at positions t, t + threads, ...
    let work = |t: usize| {
        let mut mine = vec![false; nodes];
        for (i, db) in dbs.iter().enumerate() {
            if i % threads == t {
                mine[db.node as usize] = true;
            }
        }
        let loader = Loader::new(dbs, mine, t == 0);
        for u in 0..units {
            if failed.load(Ordering::Relaxed) {
                return;
            }
            // A stream per unit: the data depends neither on the thread nor on the number
            // of threads.
            let mut rng = SmallRng::seed_from_u64(worker_seed(seed, 0xffff, 0xffff, u as usize));
            if let Err(e) = wl.load_unit(u, &mut rng, &loader) {
                failed.store(true, Ordering::Relaxed);
                *err.lock().unwrap() = Some(e);
                return;
            }
            if t == 0 && u % 64 == 63 {
                bar.inc(64);
            }
        }
    };
    if threads == 1 {
        // In the caller's thread (the simulator runs many seeds, each in one thread).
        work(0);
    } else {
        std::thread::scope(|s| {
            for t in 0..threads {
                let work = &work;
                s.spawn(move || work(t));
            }
        });
    }
    bar.finish_and_clear();
    match err.into_inner().unwrap() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
