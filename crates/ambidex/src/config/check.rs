//! Checking a configuration, and turning its sections into the settings of the layers
//! below (`ClusterConfig`, `RuntimeConfig`, `TxnConfig`, `FaultConfig`): each conversion
//! checks what it converts.

use super::error::invalid;
use super::{
    ClusterSection, Config, ConfigError, FaultSection, InjectedBug, ManagerKind, RpcSection,
    Transport, TxnSection,
};
use ambidex_rpc::RuntimeConfig;
use ambidex_transport::fault::FaultConfig;
use ambidex_transport::{ClusterConfig, NodeId};
use ambidex_txn::{LockOwner, Policy, TxnConfig};
use std::net::SocketAddr;
use std::time::Duration;

impl ClusterSection {
    /// The transport's cluster settings.
    pub fn cluster_config(&self) -> Result<ClusterConfig, ConfigError> {
        // Every lock word names its holder's node and thread (LockOwner), so a cluster
        // larger than those fields can name is refused here, before anything starts.
        if self.nodes > LockOwner::MAX_NODES || self.threads > LockOwner::MAX_THREADS {
            return Err(ConfigError::Invalid {
                field: "cluster",
                why: format!(
                    "{} nodes x {} threads: lock words name at most {} nodes and {} threads per node",
                    self.nodes,
                    self.threads,
                    LockOwner::MAX_NODES,
                    LockOwner::MAX_THREADS
                ),
            });
        }
        let mut c = ClusterConfig::new(self.nodes, self.threads);
        if let Some(id) = self.cluster_id {
            c.cluster_id = id;
        }
        if let Some(m) = self.mtu {
            c.mtu = m;
        }
        if let Some(d) = self.recv_depth {
            c.recv_depth = d;
        }
        c.validate().map_err(|e| ConfigError::Invalid {
            field: "cluster",
            why: format!("{e} (nodes {}, threads {})", self.nodes, self.threads),
        })?;
        if !(1..=60_000).contains(&self.lease_ms) {
            return invalid(
                "cluster.lease_ms",
                format!("must be 1..=60000 ms, not {}", self.lease_ms),
            );
        }
        self.rereplication_bytes_per_s()?;
        self.check_etcd()?;
        Ok(c)
    }

    /// `rereplication_mb_per_s` in bytes per second (at least 1 KiB/s, at most 64 GiB/s).
    pub fn rereplication_bytes_per_s(&self) -> Result<u64, ConfigError> {
        let mb = self.rereplication_mb_per_s;
        if !(mb.is_finite() && (1.0 / 1024.0..=65_536.0).contains(&mb)) {
            return invalid(
                "cluster.rereplication_mb_per_s",
                format!("must be 0.001..=65536 MiB/s, not {mb}"),
            );
        }
        Ok((mb * (1u64 << 20) as f64) as u64)
    }

    /// The etcd settings: there with `manager = "etcd"` (in a build that has it), and
    /// only then.
    fn check_etcd(&self) -> Result<(), ConfigError> {
        let etcd = self.manager == ManagerKind::Etcd;
        if etcd && !cfg!(feature = "etcd") {
            return invalid(
                "cluster.manager",
                "this ambidex was built without etcd: build it with `--features etcd`",
            );
        }
        if etcd && self.etcd_endpoints.is_empty() {
            return invalid(
                "cluster.etcd_endpoints",
                "manager = \"etcd\" needs etcd's client URLs, e.g. [\"http://127.0.0.1:2379\"]",
            );
        }
        if !etcd && (!self.etcd_endpoints.is_empty() || self.etcd_cluster.is_some()) {
            return invalid(
                "cluster.manager",
                format!(
                    "etcd_endpoints and etcd_cluster need manager = \"etcd\", not {:?}",
                    self.manager.name()
                ),
            );
        }
        if let Some(name) = &self.etcd_cluster {
            // One segment of the keys' path (`/ambidex/NAME/...`).
            if name.is_empty() || name.contains('/') {
                return invalid(
                    "cluster.etcd_cluster",
                    format!("{name:?} must be one non-empty path segment (no '/')"),
                );
            }
        }
        Ok(())
    }

    /// The membership of a run (`None`: no manager, no leases). With etcd and no
    /// `etcd_cluster`, each call names a fresh cluster: a run creates its own.
    pub fn manager_spec(&self) -> Option<ambidex_txn::runner::ManagerSpec> {
        let lease = Duration::from_millis(self.lease_ms);
        match self.manager {
            ManagerKind::None => None,
            ManagerKind::Embedded => Some(ambidex_txn::runner::ManagerSpec::embedded(lease)),
            #[cfg(feature = "etcd")]
            ManagerKind::Etcd => Some(ambidex_txn::runner::ManagerSpec {
                lease,
                kind: ambidex_txn::runner::ManagerKind::Etcd {
                    endpoints: self.etcd_endpoints.clone(),
                    cluster: self.etcd_cluster.clone().unwrap_or_else(fresh_etcd_cluster),
                },
            }),
            // Refused by `check_etcd`.
            #[cfg(not(feature = "etcd"))]
            ManagerKind::Etcd => None,
        }
    }
}

/// A cluster name in etcd no earlier run used: `ambidex-PID-NANOS`.
pub fn fresh_etcd_cluster() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("ambidex-{}-{nanos}", std::process::id())
}

impl Config {
    /// Checks every section (the simulator checks `sim` and its own limits besides).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let c = self.cluster_config()?;
        self.placement()?;
        self.validate_addresses(&c)?;
        self.rpc.runtime_config()?;
        self.txn.txn_config()?;
        if let Some(f) = &self.fault {
            f.fault_config(0)?;
        }
        let r = &self.run;
        if let Some(n) = r.coroutines {
            if !(1..=4096).contains(&n) {
                return invalid("run.coroutines", format!("must be 1..=4096, not {n}"));
            }
        }
        if !(r.duration_s > 0.0 && r.duration_s <= 86400.0) {
            return invalid(
                "run.duration_s",
                format!("must be in (0, 86400] seconds, not {}", r.duration_s),
            );
        }
        if !(0.0..=3600.0).contains(&r.warmup_s) {
            return invalid(
                "run.warmup_s",
                format!("must be in [0, 3600] seconds, not {}", r.warmup_s),
            );
        }
        if let Some(s) = r.scale {
            if !(s > 0.0 && s <= 1000.0) {
                return invalid("run.scale", format!("must be in (0, 1000], not {s}"));
            }
        }
        if r.workload.is_empty() || r.workload.len() > 64 {
            return invalid(
                "run.workload",
                format!("{:?} is not a workload name", r.workload),
            );
        }
        if let Some(n) = r.warehouses_per_node {
            if !(1..=100_000).contains(&n) {
                return invalid(
                    "run.warehouses_per_node",
                    format!("must be 1..=100000, not {n}"),
                );
            }
        }
        if r.r == 0 || r.w > r.r {
            return invalid(
                "run.r",
                format!(
                    "object store: need 1 <= r and w <= r (r {}, w {})",
                    r.r, r.w
                ),
            );
        }
        if r.history.as_deref() == Some("") {
            return invalid("run.history", "is an empty path");
        }
        Ok(())
    }

    fn validate_addresses(&self, c: &ClusterConfig) -> Result<(), ConfigError> {
        let s = &self.cluster;
        if s.transport != Transport::Udp && !s.udp_addrs.is_empty() {
            return invalid("cluster.udp_addrs", "is for the udp transport");
        }
        if s.transport != Transport::Shm && s.shm_dir.is_some() {
            return invalid("cluster.shm_dir", "is for the shm transport");
        }
        if !s.udp_addrs.is_empty() && s.udp_addrs.len() != s.nodes as usize {
            return invalid(
                "cluster.udp_addrs",
                format!(
                    "lists {} addresses for {} nodes",
                    s.udp_addrs.len(),
                    s.nodes
                ),
            );
        }
        let threads = c.threads_per_node;
        let mut seen = std::collections::HashSet::new();
        for (n, a) in s.udp_addrs.iter().enumerate() {
            if a.port() == 0 || a.port() as u32 + threads as u32 > 65536 {
                return invalid(
                    "cluster.udp_addrs",
                    format!(
                        "[{n}] = {a}: ports {}..{} must be within 1..=65535",
                        a.port(),
                        a.port() as u32 + threads as u32
                    ),
                );
            }
            for t in 0..threads {
                if !seen.insert(SocketAddr::new(a.ip(), a.port() + t)) {
                    return invalid(
                        "cluster.udp_addrs",
                        format!("two endpoints share {}:{}", a.ip(), a.port() + t),
                    );
                }
            }
        }
        Ok(())
    }
}

impl RpcSection {
    /// The runtime settings (the rest at `RuntimeConfig`'s defaults).
    pub fn runtime_config(&self) -> Result<RuntimeConfig, ConfigError> {
        let within = |name: &'static str, ms: f64, lo: f64, hi: f64| {
            if ms.is_finite() && (lo..=hi).contains(&ms) {
                Ok(())
            } else {
                invalid(name, format!("must be within {lo}..={hi}, not {ms}"))
            }
        };
        let (min, max, give_up) = (self.rto_min_ms, self.rto_max_ms, self.give_up_ms);
        within("rpc.rto_min_ms", min, 0.01, 60_000.0)?;
        within("rpc.rto_max_ms", max, min, 60_000.0)?;
        within("rpc.give_up_ms", give_up, min, 3_600_000.0)?;
        if self.credits == Some(0) {
            return invalid("rpc.credits", "must be at least 1");
        }
        Ok(RuntimeConfig {
            // Whole nanoseconds, rounded: 1 ms stays exactly 1 ms (the simulator's runs
            // depend on it bit for bit).
            rto_min: ms_duration(min),
            rto_max: ms_duration(max),
            give_up: ms_duration(give_up),
            coalesce: self.coalesce,
            credits: self.credits,
            ..RuntimeConfig::default()
        })
    }

    /// How long a request may go unanswered before its destination is suspected.
    pub fn give_up_after(&self) -> Duration {
        ms_duration(self.give_up_ms.clamp(0.0, 3_600_000.0))
    }

    /// The udp backend's one-sided retransmission with these bounds and give-up time,
    /// as a NIC's retry budget is set with the RPC timeouts (for
    /// `UdpNode::open_with`; the rest at `UdpOptions`' defaults).
    pub fn udp_options(&self) -> Result<ambidex_transport_udp::UdpOptions, ConfigError> {
        let rt = self.runtime_config()?;
        Ok(ambidex_transport_udp::UdpOptions {
            rto_min: rt.rto_min,
            rto_max: rt.rto_max,
            give_up: rt.give_up,
            ..Default::default()
        })
    }
}

/// `ms` milliseconds in whole nanoseconds, rounded (NaN: zero).
fn ms_duration(ms: f64) -> Duration {
    Duration::from_nanos((ms * 1e6).round() as u64)
}

impl TxnSection {
    /// Checks `mode` against the presets.
    pub fn check_mode(mode: &str) -> Result<(), ConfigError> {
        Policy::preset(mode)
            .map(|_| ())
            .map_err(|_| ConfigError::UnknownMode {
                mode: mode.to_string(),
            })
    }

    /// The transaction layer's settings: the one place the preset and the per-phase
    /// overrides become the run's `Policy` (every path, and every report, takes it from
    /// here).
    pub fn txn_config(&self) -> Result<TxnConfig, ConfigError> {
        Ok(TxnConfig {
            policy: self.resolve_policy()?,
            skip_validation_for_tests: self.inject_bug == Some(InjectedBug::SkipValidation),
            recovery_skips_dead_coordinators_for_tests: self.inject_bug
                == Some(InjectedBug::RecoverySkipsDeadCoordinators),
            // `cluster.rereplication_mb_per_s`, set by `run_spec`.
            rereplication_bytes_per_s: ambidex_txn::REREPLICATION_BYTES_PER_S,
        })
    }
}

impl FaultSection {
    /// The injector's configuration for node `node` (each node gets its own stream).
    pub fn fault_config(&self, node: NodeId) -> Result<FaultConfig, ConfigError> {
        if self.max_delay_us > 10_000_000 {
            return invalid("fault.max_delay_us", "must be at most 10000000 (10 s)");
        }
        let cfg = FaultConfig {
            seed: self
                .seed
                .wrapping_add((node as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
            drop: self.drop,
            duplicate: self.duplicate,
            reorder: self.reorder,
            delay: self.delay,
            max_delay: Duration::from_micros(self.max_delay_us),
        };
        cfg.validate().map_err(|e| ConfigError::Invalid {
            field: "fault",
            why: e.to_string(),
        })?;
        Ok(cfg)
    }
}

impl Config {
    /// How every (node, thread) of a run of this configuration is built: the one place
    /// the configuration becomes the runner's settings (RPC, transaction layer, fault
    /// injector of node `node`, or node 0's for an in-process run, leases), for
    /// in-process runs, node processes and the application API alike. `coroutines` per
    /// thread; no duration, history, kill or restart (the caller adds those).
    pub fn run_spec(
        &self,
        coroutines: usize,
        node: Option<NodeId>,
    ) -> Result<ambidex_txn::runner::RunSpec, ConfigError> {
        Ok(ambidex_txn::runner::RunSpec {
            coroutines,
            rpc: self.rpc.runtime_config()?,
            txn: TxnConfig {
                rereplication_bytes_per_s: self.cluster.rereplication_bytes_per_s()?,
                ..self.txn.txn_config()?
            },
            fault: match &self.fault {
                Some(f) => Some(f.fault_config(node.unwrap_or(0))?),
                None => None,
            },
            duration: None,
            history: None,
            manager: self.cluster.manager_spec(),
            kill: None,
            restart: None,
            fresh_db: None,
        })
    }
}
