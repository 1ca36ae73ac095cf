//! The embedded manager: one [`Membership`] behind a mutex, advanced by a thread of its
//! own at every lease deadline, answering its nodes' calls directly. It runs in the
//! launcher of a cluster (or in the process of an in-process cluster).

use super::{ManagerClient, ManagerError};
use crate::config::Configuration;
use crate::lease::FIRST_GRANT_WITHIN_NS;
use crate::membership::{ClusterState, Event, Grant, Membership, Stage};
use ambidex_transport::clock::SharedClock;
use ambidex_transport::NodeId;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

struct Shared {
    m: Mutex<Membership>,
    /// Signalled at every change of the state.
    changed: Condvar,
    clock: SharedClock,
    stop: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Membership> {
        self.m.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the state machine and wakes the waiters if the revision moved.
    fn with<R>(&self, f: impl FnOnce(&mut Membership, u64) -> R) -> R {
        let now = self.clock.now_ns();
        let mut m = self.lock();
        let before = m.state().revision;
        let r = f(&mut m, now);
        if m.state().revision != before {
            self.changed.notify_all();
        }
        r
    }
}

/// A running embedded manager; dropping it stops its thread.
pub struct EmbeddedManager {
    shared: Arc<Shared>,
    ticker: Option<JoinHandle<()>>,
}

impl EmbeddedManager {
    /// Starts managing a cluster in `config` with leases of `lease`.
    pub fn start(config: Configuration, lease: Duration, clock: SharedClock) -> EmbeddedManager {
        let lease_ns = lease.as_nanos().max(1) as u64;
        let now = clock.now_ns();
        let mut m = Membership::new(config, lease_ns, now);
        m.extend_first_leases(now + FIRST_GRANT_WITHIN_NS.max(lease_ns));
        let shared = Arc::new(Shared {
            m: Mutex::new(m),
            changed: Condvar::new(),
            clock,
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let ticker = std::thread::Builder::new()
            .name("manager".into())
            .spawn(move || tick_loop(&s))
            .ok();
        EmbeddedManager { shared, ticker }
    }

    /// A client for node `node`, incarnation `incarnation`.
    pub fn client(&self, node: NodeId, incarnation: u64) -> EmbeddedClient {
        EmbeddedClient {
            shared: self.shared.clone(),
            node,
            incarnation,
        }
    }

    /// The current state.
    pub fn state(&self) -> ClusterState {
        self.shared.lock().state().clone()
    }

    /// Waits up to `wait` for a state past `revision`.
    pub fn state_after(&self, revision: u64, wait: Duration) -> Option<ClusterState> {
        wait_state(&self.shared, revision, wait)
    }

    /// What happened so far.
    pub fn events(&self) -> Vec<Event> {
        self.shared.lock().events().to_vec()
    }

    /// Why the cluster stopped, if it did.
    pub fn failure(&self) -> Option<String> {
        self.shared.lock().failure().map(str::to_string)
    }
}

impl Drop for EmbeddedManager {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.changed.notify_all();
        if let Some(t) = self.ticker.take() {
            let _ = t.join();
        }
    }
}

/// Ticks the state machine at its next deadline (and at least every few ms, so a
/// join is admitted promptly).
fn tick_loop(s: &Shared) {
    crate::priority::raise_lease_thread();
    while !s.stop.load(Ordering::SeqCst) {
        let now = s.clock.now_ns();
        let wait_ns = {
            let mut m = s.lock();
            if m.tick(now) {
                s.changed.notify_all();
            }
            let step = (m.lease_ns() / 10).clamp(100_000, 5_000_000);
            m.next_deadline().saturating_sub(now).clamp(50_000, step)
        };
        let g = s.lock();
        let _ = s
            .changed
            .wait_timeout(g, Duration::from_nanos(wait_ns))
            .unwrap_or_else(|e| e.into_inner());
    }
}

fn wait_state(s: &Shared, revision: u64, wait: Duration) -> Option<ClusterState> {
    let deadline = std::time::Instant::now() + wait;
    let mut g = s.lock();
    loop {
        if g.state().revision > revision {
            return Some(g.state().clone());
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || s.stop.load(Ordering::SeqCst) {
            return None;
        }
        g = s
            .changed
            .wait_timeout(g, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// One node's handle on an embedded manager.
pub struct EmbeddedClient {
    shared: Arc<Shared>,
    node: NodeId,
    incarnation: u64,
}

impl ManagerClient for EmbeddedClient {
    fn renew(&mut self) -> Result<Grant, ManagerError> {
        let (n, i) = (self.node, self.incarnation);
        Ok(self.shared.with(|m, now| m.renew(n, i, now))?)
    }

    fn state_after(
        &mut self,
        revision: u64,
        wait: Duration,
    ) -> Result<Option<ClusterState>, ManagerError> {
        Ok(wait_state(&self.shared, revision, wait))
    }

    fn ack(&mut self, epoch: u32, stage: Stage) -> Result<(), ManagerError> {
        let (n, i) = (self.node, self.incarnation);
        self.shared.with(|m, now| m.ack(n, i, epoch, stage, now));
        Ok(())
    }

    fn suspect(&mut self, node: NodeId) -> Result<(), ManagerError> {
        let n = self.node;
        self.shared.with(|m, now| m.suspect(n, node, now));
        Ok(())
    }

    fn synced(&mut self, partitions: &[u32]) -> Result<(), ManagerError> {
        let (n, i) = (self.node, self.incarnation);
        self.shared.with(|m, now| {
            for &p in partitions {
                m.synced(n, i, p, now);
            }
        });
        Ok(())
    }

    fn join(&mut self) -> Result<(), ManagerError> {
        let (n, i) = (self.node, self.incarnation);
        Ok(self.shared.with(|m, _| m.join(n, i))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::{Request, Response};
    use ambidex_transport::clock::SystemClock;

    #[test]
    fn a_node_that_stops_renewing_is_removed_and_the_others_follow() {
        let m = EmbeddedManager::start(
            Configuration::initial(3, 3).unwrap(),
            Duration::from_millis(20),
            SystemClock::shared(),
        );
        let mut c: Vec<EmbeddedClient> = (0..3).map(|n| m.client(n, 1)).collect();
        let start = std::time::Instant::now();
        // Every node renews once (a node that never did is on the start-up grace,
        // `FIRST_GRANT_WITHIN_NS`); then nodes 0 and 1 renew every 4 ms, node 2 never.
        c[2].renew().unwrap();
        let state = loop {
            for cl in &mut c[..2] {
                cl.renew().unwrap();
            }
            if let Some(s) = c[0].state_after(1, Duration::from_millis(4)).unwrap() {
                break s;
            }
            assert!(start.elapsed() < Duration::from_secs(5), "never removed");
        };
        assert_eq!((state.config.epoch, state.stage), (2, Stage::Adopt));
        assert!(!state.config.placement.is_member(2));
        for cl in &mut c[..2] {
            cl.ack(2, Stage::Adopt).unwrap();
        }
        let s = m
            .state_after(state.revision, Duration::from_secs(1))
            .unwrap();
        assert_eq!(s.stage, Stage::Recover);
        // Over a channel: the same calls, as messages.
        let mut answered = Vec::new();
        for cl in &mut c[..2] {
            let req: Request = serde_json::from_str(
                &serde_json::to_string(&Request::Ack {
                    epoch: 2,
                    stage: Stage::Recover,
                })
                .unwrap(),
            )
            .unwrap();
            answered.push(req.answer(cl));
        }
        assert_eq!(answered, vec![Response::Done, Response::Done]);
        assert_eq!(m.state().stage, Stage::Run);
        assert!(matches!(
            Request::Renew.answer(&mut c[2]),
            Response::Refused { .. }
        ));
    }
}
