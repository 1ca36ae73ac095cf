//! The command-line side of the one configuration (`ambidex_workloads::Config`): `--config
//! FILE` and the flags every run command shares. A flag given beats the file, the file
//! beats the command's defaults.

use ambidex_workloads::Config;
use std::path::PathBuf;

/// `--config FILE` and the cluster, RPC and transaction flags of `bench W` and `sim`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct ConfigArgs {
    /// Read the configuration from this TOML (.toml) or JSON (.json) file
    /// (docs/cluster.md); flags given beside it override its values.
    #[arg(long, value_name = "FILE", alias = "cluster-config")]
    pub config: Option<PathBuf>,
    /// Nodes in the cluster [default: 3].
    #[arg(long)]
    pub nodes: Option<u16>,
    /// Threads (runtimes) per node [default: 1].
    #[arg(long)]
    pub threads: Option<u16>,
    /// Worker coroutines per thread [default: 20; 8 for TPC-C; 4 in the simulator].
    #[arg(long)]
    pub coroutines: Option<usize>,
    /// Copies of every key (primary + backups) [default: 3].
    #[arg(long)]
    pub replication: Option<u16>,
    /// Population as a multiple of the papers' (1.0 = paper scale; default: a quick size
    /// per workload, see docs/workloads.md, or the simulator's tiny one).
    #[arg(long)]
    pub scale: Option<f64>,
    /// The primitive preset; only `fasst` (RPCs for every phase) exists so far.
    #[arg(long)]
    pub mode: Option<String>,
    /// RPC retransmission timeout in ms [default: 20; 1 in the simulator].
    #[arg(long)]
    pub rpc_timeout_ms: Option<f64>,
    /// RPC retransmissions before a destination is suspected [default: 50].
    #[arg(long)]
    pub rpc_retries: Option<u32>,
}

impl ConfigArgs {
    /// `base` (the command's defaults), then the file, then these flags. Not validated:
    /// the caller sets its own flags first.
    pub fn resolve(&self, base: &Config) -> Result<Config, String> {
        let mut c = match &self.config {
            Some(path) => Config::read(path, base)?,
            None => base.clone(),
        };
        set(&mut c.cluster.nodes, self.nodes);
        set(&mut c.cluster.threads, self.threads);
        set(&mut c.cluster.replication, self.replication);
        if self.coroutines.is_some() {
            c.run.coroutines = self.coroutines;
        }
        if self.scale.is_some() {
            c.run.scale = self.scale;
        }
        set(&mut c.txn.mode, self.mode.clone());
        set(&mut c.rpc.retransmit_timeout_ms, self.rpc_timeout_ms);
        set(&mut c.rpc.max_retries, self.rpc_retries);
        Ok(c)
    }
}

/// Sets `slot` to the flag's value if the flag was given.
pub fn set<T>(slot: &mut T, flag: Option<T>) {
    if let Some(v) = flag {
        *slot = v;
    }
}
