//! A throw-away etcd on loopback: one `etcd` process (Debian's `etcd-server`) with a
//! temporary data directory and free ports, killed and removed when dropped. What the
//! tests run the etcd manager against, and what a user can start for a one-machine
//! cluster with `cluster.manager = "etcd"`.
//!
//! It runs with a 10 ms heartbeat and a 100 ms election timeout: etcd's minimum lease
//! TTL is 1.5 election timeouts rounded up to a second, so leases of 1 s are granted as
//! asked (with etcd's defaults, 100 ms and 1 s, the minimum is 2 s).

use super::EtcdManager;
use crate::manager::ManagerError;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long [`LocalEtcd::start`] waits for etcd to serve.
const READY_WITHIN: Duration = Duration::from_secs(20);

/// Why a [`LocalEtcd`] could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LocalEtcdError {
    /// No `etcd` binary on the PATH.
    #[error("`etcd` is not installed (apt-get install etcd-server)")]
    NotInstalled,
    #[error("cannot start etcd: {0}")]
    Start(String),
    /// It started but did not answer in time (its log is at `log`).
    #[error("etcd does not serve after {READY_WITHIN:?}: {why} (log {log})")]
    NotServing { why: String, log: String },
}

/// A running etcd, killed (and its data removed) when dropped.
pub struct LocalEtcd {
    child: Child,
    dir: PathBuf,
    endpoint: String,
}

fn free_port() -> Result<u16, LocalEtcdError> {
    let l = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| LocalEtcdError::Start(format!("no free loopback port: {e}")))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| LocalEtcdError::Start(e.to_string()))
}

/// Whether an `etcd` binary can be run.
pub fn installed() -> bool {
    Command::new("etcd")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl LocalEtcd {
    /// Starts etcd (its files in a fresh directory named after `name` under the
    /// system's temporary directory) and waits until it serves.
    pub fn start(name: &str) -> Result<LocalEtcd, LocalEtcdError> {
        if !installed() {
            return Err(LocalEtcdError::NotInstalled);
        }
        let dir = std::env::temp_dir().join(format!(
            "ambidex-etcd-{}-{name}-{}",
            std::process::id(),
            free_port()?
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let start_err =
            |e: std::io::Error| LocalEtcdError::Start(format!("{}: {e}", dir.display()));
        std::fs::create_dir_all(&dir).map_err(start_err)?;
        let (client, peer) = (free_port()?, free_port()?);
        let endpoint = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = std::fs::File::create(dir.join("etcd.log")).map_err(start_err)?;
        let child = Command::new("etcd")
            .args(["--name", "t", "--data-dir"])
            .arg(dir.join("data"))
            .args(["--listen-client-urls", &endpoint])
            .args(["--advertise-client-urls", &endpoint])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("t={peer_url}")])
            .args(["--heartbeat-interval", "10", "--election-timeout", "100"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| LocalEtcdError::Start(e.to_string()))?;
        let etcd = LocalEtcd {
            child,
            dir,
            endpoint,
        };
        // Serving once a read of a cluster that does not exist answers that it does not.
        let start = Instant::now();
        loop {
            match EtcdManager::state(&[etcd.endpoint.as_str()], "probe") {
                Err(ManagerError::Unreachable(why)) => {
                    if start.elapsed() >= READY_WITHIN {
                        return Err(LocalEtcdError::NotServing {
                            why,
                            log: etcd.log().display().to_string(),
                        });
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                _ => return Ok(etcd),
            }
        }
    }

    /// For tests: [`LocalEtcd::start`], or `None` (with the reason on stderr) when etcd
    /// is not installed, except under CI (the `CI` variable set), where it must be
    /// (.ci/run installs it). Panics if it is installed and does not start.
    pub fn start_for_test(test: &str) -> Option<LocalEtcd> {
        match LocalEtcd::start(test) {
            Ok(e) => Some(e),
            Err(LocalEtcdError::NotInstalled) => {
                assert!(
                    std::env::var_os("CI").is_none(),
                    "etcd is not installed; .ci/run installs Debian's etcd-server"
                );
                eprintln!("{test}: skipped: {}", LocalEtcdError::NotInstalled);
                None
            }
            Err(e) => panic!("{test}: {e}"),
        }
    }

    /// Its client URL (`http://127.0.0.1:PORT`).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Its one endpoint, as the managers take them.
    pub fn endpoints(&self) -> [&str; 1] {
        [self.endpoint.as_str()]
    }

    /// etcd's own log (stderr).
    pub fn log(&self) -> PathBuf {
        self.dir.join("etcd.log")
    }

    /// Its directory (data and log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
