//! The command-line side of the one configuration (`ambidex::Config`): `--config
//! FILE` and the flags every run command shares. A flag given beats the file, the file
//! beats the command's defaults.

use ambidex::config::{
    Commit, ConfigError, Execute, Lock, Log, ManagerKind, PassiveAck, PhaseChoice, Validate,
};
use ambidex::Config;
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
    /// Configuration manager: `embedded` (the launcher hosts it; nodes hold leases and a
    /// node that dies is reported, not fatal), `etcd` (leases and state in the etcd at
    /// --etcd; a build with `--features etcd`) or `none` (a node that dies fails the
    /// run) [default: embedded].
    #[arg(long, value_name = "KIND")]
    pub manager: Option<ManagerKind>,
    /// etcd's client URLs, comma-separated (with --manager etcd).
    #[arg(long, value_name = "URLS", value_delimiter = ',')]
    pub etcd: Option<Vec<String>>,
    /// Lease period in ms with a manager; nodes renew at a fifth of it [default: 50].
    #[arg(long, value_name = "MS")]
    pub lease_ms: Option<u64>,
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
    /// TPC-C: warehouses per node, dealt out evenly to its threads [default: 24, as
    /// DrTM+H's 384 warehouses on 16 machines; 1 per thread in the simulator].
    #[arg(long, value_name = "N")]
    pub warehouses: Option<u64>,
    /// TPC-C NewOrder: fetch its independent records in parallel (on, DrTM+H §6.1) or
    /// one remote record per round trip (off, DrTM+H §5's phase study) [default: on].
    #[arg(long, value_name = "ON_OFF", value_parser = clap::builder::BoolishValueParser::new())]
    pub outstanding_requests: Option<bool>,
    /// Try a transaction aborted by a conflict or a transient failure again from the
    /// same inputs (on, as the papers' drivers do), or draw a new one (off) [default: on].
    #[arg(long, value_name = "ON_OFF", value_parser = clap::builder::BoolishValueParser::new())]
    pub retry_aborts: Option<bool>,
    /// The transaction-policy preset (DrTM+H Table 4): fasst (every phase by RPC), farm,
    /// drtm-r or drtm-h [default: fasst]. The per-phase flags below override its choices.
    #[arg(long, value_name = "PRESET")]
    pub mode: Option<String>,
    /// Execute phase: READ RPCs (rpc), one-sided READs of bucket then item (onesided),
    /// one-sided READs through the location cache (cached), or a cache hit READ and a
    /// miss RPC (hybrid). Overrides the preset's (`txn.execute`).
    #[arg(long, value_name = "HOW", value_parser = choice::<Execute>())]
    pub execute: Option<Execute>,
    /// Lock phase: LOCK RPCs (rpc) or one-sided CAS (cas). Overrides the preset's.
    #[arg(long, value_name = "HOW", value_parser = choice::<Lock>())]
    pub lock: Option<Lock>,
    /// Validate phase: VALIDATE RPCs (rpc) or one-sided READs of headers (read).
    /// Overrides the preset's.
    #[arg(long, value_name = "HOW", value_parser = choice::<Validate>())]
    pub validate: Option<Validate>,
    /// Log phase: LOG RPCs (rpc) or one-sided WRITEs into log rings (write). Overrides
    /// the preset's.
    #[arg(long, value_name = "HOW", value_parser = choice::<Log>())]
    pub log: Option<Log>,
    /// Commit phase at primaries: COMMIT RPCs (rpc) or one-sided WRITEs (write).
    /// Overrides the preset's.
    #[arg(long, value_name = "HOW", value_parser = choice::<Commit>())]
    pub commit: Option<Commit>,
    /// Passive ACK of commit messages (DrTM+H §3.2): on or off. Overrides the preset's.
    #[arg(long, value_name = "ON_OFF", value_parser = choice::<PassiveAck>())]
    pub passive_ack: Option<PassiveAck>,
    /// Floor of the RPC retransmission timeout in ms, which otherwise follows the
    /// measured round trip [default: 0.5; 1 in the simulator].
    #[arg(long)]
    pub rpc_rto_min_ms: Option<f64>,
    /// Ceiling of the RPC retransmission timeout in ms, up to which it doubles while a
    /// destination is silent [default: 100; 1 in the simulator].
    #[arg(long)]
    pub rpc_rto_max_ms: Option<f64>,
    /// An RPC request unanswered this long (ms) after it was first sent has its
    /// destination suspected [default: 1000; 51 in the simulator].
    #[arg(long)]
    pub rpc_give_up_ms: Option<f64>,
}

impl ConfigArgs {
    /// `base` (the command's defaults), then the file, then these flags. Not validated:
    /// the caller sets its own flags first. Only reading the file can fail, so its
    /// error is the configuration's own.
    pub fn resolve(&self, base: &Config) -> Result<Config, ConfigError> {
        let mut c = match &self.config {
            Some(path) => Config::read(path, base)?,
            None => base.clone(),
        };
        set(&mut c.cluster.nodes, self.nodes);
        set(&mut c.cluster.threads, self.threads);
        set(&mut c.cluster.replication, self.replication);
        set(&mut c.cluster.manager, self.manager);
        set(&mut c.cluster.lease_ms, self.lease_ms);
        set(&mut c.cluster.etcd_endpoints, self.etcd.clone());
        if self.coroutines.is_some() {
            c.run.coroutines = self.coroutines;
        }
        if self.scale.is_some() {
            c.run.scale = self.scale;
        }
        if self.warehouses.is_some() {
            c.run.warehouses_per_node = self.warehouses;
        }
        set(&mut c.run.outstanding_requests, self.outstanding_requests);
        set(&mut c.run.retry_aborts, self.retry_aborts);
        set(&mut c.txn.mode, self.mode.clone());
        // A flag replaces the file's key for its phase; both override the preset.
        if self.execute.is_some() {
            c.txn.execute = self.execute;
        }
        if self.lock.is_some() {
            c.txn.lock = self.lock;
        }
        if self.validate.is_some() {
            c.txn.validate = self.validate;
        }
        if self.log.is_some() {
            c.txn.log = self.log;
        }
        if self.commit.is_some() {
            c.txn.commit = self.commit;
        }
        if self.passive_ack.is_some() {
            c.txn.passive_ack = self.passive_ack;
        }
        set(&mut c.rpc.rto_min_ms, self.rpc_rto_min_ms);
        set(&mut c.rpc.rto_max_ms, self.rpc_rto_max_ms);
        set(&mut c.rpc.give_up_ms, self.rpc_give_up_ms);
        Ok(c)
    }
}

/// The parser of one phase's flag: the choice's names are its possible values (listed
/// by `--help`, and by clap's error for any other value).
fn choice<T: PhaseChoice>() -> impl clap::builder::TypedValueParser<Value = T> {
    use clap::builder::{PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(T::NAMES.iter().copied()).try_map(|s: String| T::parse(&s))
}

/// Sets `slot` to the flag's value if the flag was given.
pub fn set<T>(slot: &mut T, flag: Option<T>) {
    if let Some(v) = flag {
        *slot = v;
    }
}
