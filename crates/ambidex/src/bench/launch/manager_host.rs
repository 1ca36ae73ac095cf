//! The launcher's configuration manager (`cluster.manager = "embedded"`): one
//! [`EmbeddedManager`] for the node processes of a run, in the cluster's initial
//! configuration (the one every `NodeDb` starts in). The node processes call it over
//! their control channel: each node's reader thread answers its calls
//! ([`answer_line`]), and a thread of its own pushes every new state to every node
//! ([`ManagerHost::start_pushing`]).

use super::error::ManagerHostError;
use ambidex_cluster::manager::channel::{answer_call, ChannelError, ToNode};
use ambidex_cluster::membership::Event;
use ambidex_cluster::{ClusterState, Configuration, EmbeddedManager};
use ambidex_transport::clock::{SharedClock, SystemClock};
use std::process::ChildStdin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// A node's stdin, written by the main thread (commands), its reader thread (answers)
/// and the pusher (states): one line at a time under the lock. `None` once closed.
pub type Stdin = Arc<Mutex<Option<ChildStdin>>>;

/// Writes `line` (and a newline) to `stdin`; false if it is closed or the write failed.
pub fn write_line(stdin: &Stdin, line: &str) -> bool {
    use std::io::Write;
    let mut g = stdin.lock().unwrap_or_else(|e| e.into_inner());
    match g.as_mut() {
        Some(w) => w
            .write_all(line.as_bytes())
            .and_then(|_| w.write_all(b"\n"))
            .and_then(|_| w.flush())
            .is_ok(),
        None => false,
    }
}

/// The manager of one run and its pusher thread; dropping it stops both.
pub struct ManagerHost {
    manager: Arc<EmbeddedManager>,
    clock: SharedClock,
    /// Manager time when the run started (`start` was sent).
    start_ns: u64,
    stop: Arc<AtomicBool>,
    pusher: Option<JoinHandle<()>>,
}

impl ManagerHost {
    /// Starts managing a cluster of `nodes` nodes and `replication` copies with leases
    /// of `lease`. Every member's first lease runs from now: start it just before the
    /// nodes are told to start (loading does not count against it).
    pub fn start(
        nodes: u16,
        replication: u16,
        lease: Duration,
    ) -> Result<ManagerHost, ManagerHostError> {
        let config = Configuration::initial(nodes, replication)?;
        let clock = SystemClock::shared();
        let manager = Arc::new(EmbeddedManager::start(config, lease, clock.clone()));
        Ok(ManagerHost {
            manager,
            start_ns: clock.now_ns(),
            clock,
            stop: Arc::new(AtomicBool::new(false)),
            pusher: None,
        })
    }

    /// The manager (the nodes' calls are answered on it).
    pub fn manager(&self) -> Arc<EmbeddedManager> {
        self.manager.clone()
    }

    /// Marks now as the run's start (events are reported relative to it).
    pub fn mark_start(&mut self) {
        self.start_ns = self.clock.now_ns();
    }

    /// Manager time of the run's start, ns.
    pub fn start_ns(&self) -> u64 {
        self.start_ns
    }

    /// Pushes the current state, then every new one, to each of `stdins` (a closed
    /// one, a dead node's, is skipped).
    pub fn start_pushing(&mut self, stdins: Vec<Stdin>) -> Result<(), ManagerHostError> {
        let (m, stop) = (self.manager.clone(), self.stop.clone());
        let h = std::thread::Builder::new()
            .name("manager-push".into())
            .spawn(move || {
                // New states reach the agents through here (a lease thread too).
                ambidex_cluster::priority::raise_lease_thread();
                let mut revision = 0;
                while !stop.load(Ordering::SeqCst) {
                    let Some(s) = m.state_after(revision, Duration::from_millis(50)) else {
                        continue;
                    };
                    revision = s.revision;
                    ambidex_cluster::rectrace!(
                        "launcher push rev {} epoch {} stage {:?}",
                        s.revision,
                        s.config.epoch,
                        s.stage
                    );
                    let line = push_line(s);
                    for w in &stdins {
                        write_line(w, &line);
                    }
                }
            })
            .map_err(ManagerHostError::Pusher)?;
        self.pusher = Some(h);
        Ok(())
    }

    /// The membership's events so far.
    pub fn events(&self) -> Vec<Event> {
        self.manager.events()
    }

    /// The membership's state now.
    pub fn state(&self) -> ClusterState {
        self.manager.state()
    }
}

impl Drop for ManagerHost {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.pusher.take() {
            let _ = h.join();
        }
    }
}

fn push_line(s: ClusterState) -> String {
    serde_json::json!({ "manager": ToNode::Push(Box::new(s)).to_value() }).to_string()
}

/// Answers node `node`'s manager call `msg` (the `manager` object of its event) on
/// `manager` as the node's incarnation `incarnation` (1, or more for a node process
/// restarted during the run); the line to write back to it, or why the call cannot be
/// read.
pub fn answer_line(
    manager: &EmbeddedManager,
    node: u16,
    incarnation: u64,
    msg: &serde_json::Value,
) -> Result<String, ChannelError> {
    let mut client = manager.client(node, incarnation);
    let a = answer_call(msg, &mut client)?;
    Ok(serde_json::json!({ "manager": a.to_value() }).to_string())
}
