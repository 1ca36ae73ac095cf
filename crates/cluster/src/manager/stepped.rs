//! A manager without a thread or a clock of its own, for a deterministic simulator:
//! one [`Membership`] advanced by [`SteppedManager::tick`] at the simulated times the
//! caller chooses, answering its nodes' calls at once (a call never waits: the state
//! asked for is the current one or none). The caller runs everything in one thread,
//! so the calls happen in its order.

use super::{ManagerClient, ManagerError};
use crate::config::Configuration;
use crate::membership::{ClusterState, Event, Grant, Membership, Stage};
use ambidex_transport::NodeId;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

struct Shared {
    m: Mutex<Membership>,
    /// The manager's time (ns): the last tick's.
    now: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Membership> {
        self.m.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> u64 {
        self.now.load(Ordering::Acquire)
    }
}

/// A [`Membership`] driven by the caller's time.
#[derive(Clone)]
pub struct SteppedManager {
    shared: Arc<Shared>,
}

impl SteppedManager {
    /// Manages a cluster in `config` with leases of `lease`, starting at `now`.
    pub fn new(config: Configuration, lease: Duration, now: u64) -> SteppedManager {
        let lease_ns = lease.as_nanos().max(1) as u64;
        SteppedManager {
            shared: Arc::new(Shared {
                m: Mutex::new(Membership::new(config, lease_ns, now)),
                now: AtomicU64::new(now),
            }),
        }
    }

    /// Moves the manager's time to `now` (never back) and advances the state machine;
    /// returns whether the state changed.
    pub fn tick(&self, now: u64) -> bool {
        let now = self.shared.now.fetch_max(now, Ordering::AcqRel).max(now);
        self.shared.lock().tick(now)
    }

    /// The next time a tick may change something.
    pub fn next_deadline(&self) -> u64 {
        self.shared.lock().next_deadline()
    }

    /// A client for node `node`, incarnation `incarnation`.
    pub fn client(&self, node: NodeId, incarnation: u64) -> SteppedClient {
        SteppedClient {
            shared: self.shared.clone(),
            node,
            incarnation,
        }
    }

    /// The current epoch and stage (without copying the configuration).
    pub fn epoch_stage(&self) -> (u32, Stage) {
        let m = self.shared.lock();
        (m.state().config.epoch, m.state().stage)
    }

    /// The members now (bit i: node i).
    pub fn members(&self) -> u64 {
        self.shared.lock().state().config.placement.member_mask()
    }

    /// The current state.
    pub fn state(&self) -> ClusterState {
        self.shared.lock().state().clone()
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

/// One node's handle on a [`SteppedManager`].
pub struct SteppedClient {
    shared: Arc<Shared>,
    node: NodeId,
    incarnation: u64,
}

impl ManagerClient for SteppedClient {
    fn renew(&mut self) -> Result<Grant, ManagerError> {
        let now = self.shared.now();
        Ok(self.shared.lock().renew(self.node, self.incarnation, now)?)
    }

    /// Never waits: the state if it is past `revision`, else `None`.
    fn state_after(
        &mut self,
        revision: u64,
        _wait: Duration,
    ) -> Result<Option<ClusterState>, ManagerError> {
        let m = self.shared.lock();
        Ok((m.state().revision > revision).then(|| m.state().clone()))
    }

    fn ack(&mut self, epoch: u32, stage: Stage) -> Result<(), ManagerError> {
        let now = self.shared.now();
        self.shared
            .lock()
            .ack(self.node, self.incarnation, epoch, stage, now);
        Ok(())
    }

    fn suspect(&mut self, node: NodeId) -> Result<(), ManagerError> {
        let now = self.shared.now();
        self.shared.lock().suspect(self.node, node, now);
        Ok(())
    }

    fn synced(&mut self, partitions: &[u32]) -> Result<(), ManagerError> {
        let now = self.shared.now();
        let mut m = self.shared.lock();
        for &p in partitions {
            m.synced(self.node, self.incarnation, p, now);
        }
        Ok(())
    }

    fn join(&mut self) -> Result<(), ManagerError> {
        Ok(self.shared.lock().join(self.node, self.incarnation)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{AgentCore, NodeState};

    /// Three stepped agents on simulated time; node 2's stops: the others adopt,
    /// recover and run without it, all in one thread, without waiting.
    #[test]
    fn stepped_agents_follow_a_stepped_manager() {
        let lease = Duration::from_millis(10);
        let config = Configuration::initial(3, 3).unwrap();
        let m = SteppedManager::new(config.clone(), lease, 0);
        let states: Vec<_> = (0..3).map(|_| NodeState::new(config.clone(), 1)).collect();
        let mut agents: Vec<_> = states.iter().map(|s| AgentCore::new(lease, 0, s)).collect();
        let mut clients: Vec<_> = (0..3).map(|n| m.client(n, 1)).collect();
        let mut now = 0;
        while now < 100_000_000 {
            m.tick(now);
            let live = if now < 20_000_000 { 3 } else { 2 };
            for n in 0..live {
                let s = &states[n];
                assert!(agents[n].step(now, &mut clients[n], s));
                // The "thread": adopts and recovers at once.
                let e = s.config.epoch();
                s.adopted(e);
                if s.stage() == Stage::Recover {
                    s.recovered(e);
                }
            }
            now += 1_000_000;
        }
        let st = m.state();
        assert_eq!((st.config.epoch, st.stage), (2, Stage::Run));
        assert!(!st.config.placement.is_member(2));
        assert!(states[0].running(now) && states[1].running(now));
        assert_eq!(states[0].config.epoch(), 2);
        // Node 2's lease ran out on its own clock.
        assert!(!states[2].serving(now));
    }
}
