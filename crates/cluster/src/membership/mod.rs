//! The configuration manager's state machine, sans IO: it is driven by the time passed
//! in and by what nodes report (lease renewals, suspicions, acknowledgements, joins,
//! finished copies), and answers with the [`ClusterState`] every node must follow. The
//! embedded manager runs one. Its decisions are the pure functions of `decide`: with
//! etcd, every node takes them over what it reads from etcd and the first to publish a
//! new state wins (a compare-and-swap on the state key's revision).
//!
//! A reconfiguration (FaRM SOSP'15 §5, simplified to a cluster-wide pause):
//!
//! 1. A member's lease expires: it stopped renewing, or a majority of the other
//!    members suspected it and the manager stopped renewing it. Removal always waits
//!    for the lease to run out, and a node stops serving when its own (shorter)
//!    estimate of the lease runs out, so a removed node is no longer serving.
//! 2. The manager publishes the next configuration (epoch + 1: the failed nodes'
//!    backups promoted, new backups added) at stage [`Stage::Adopt`]. Each member moves
//!    its threads to the new epoch (from then on it sends nothing of the old epoch and
//!    drops what arrives of it) and acknowledges.
//! 3. Once every member has, stage [`Stage::Recover`]: each member decides the
//!    transactions in flight from the log records it holds and installs them at the new
//!    replicas, releases the failed coordinators' locks, and acknowledges.
//! 4. Once every member has, stage [`Stage::Run`]: transactions start again; new
//!    backups are brought up to date in the background and reported synced.
//!
//! A failure during a reconfiguration starts the next one (epoch + 2) at once. A
//! restarted node joins as a new incarnation once the cluster runs; the join is a
//! reconfiguration too (it is made a backup of the partitions short of copies).

pub(crate) mod decide;

use crate::config::Configuration;
use ambidex_transport::NodeId;
use serde::{Deserialize, Serialize};

/// Where the cluster is in its current epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    /// Members move to the new epoch.
    Adopt,
    /// Members recover the transactions in flight.
    Recover,
    /// Transactions run.
    Run,
}

/// What every node follows: the configuration and the stage of its epoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterState {
    pub config: Configuration,
    pub stage: Stage,
    /// Changes with every published change (stages, synced copies); never goes back.
    pub revision: u64,
}

/// What a node is told when it renews its lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// The lease runs until this manager time (ns); the node counts from when it sent
    /// the renewal, which is earlier.
    pub until_ns: u64,
    /// The manager's current epoch and revision: a node behind fetches the state.
    pub epoch: u32,
    pub revision: u64,
}

/// Why the manager refuses a node.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum Refusal {
    #[error("node {node} is not a member (incarnation {incarnation}); it must join again")]
    NotMember { node: NodeId, incarnation: u64 },
    #[error("node {node}: incarnation {got} is older than the member's {member}")]
    StaleIncarnation { node: NodeId, got: u64, member: u64 },
    #[error("node {node} is suspected: its lease is not renewed")]
    Revoked { node: NodeId },
    #[error("node {0} is not a node of this cluster")]
    UnknownNode(NodeId),
    #[error("the cluster cannot go on: {0}")]
    Failed(String),
}

/// A moment of a reconfiguration, for reports (manager time, ns).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub at_ns: u64,
    pub epoch: u32,
    pub what: EventKind,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventKind {
    /// A member's lease expired (bit i = node i).
    LeaseExpired { nodes: u64 },
    /// A majority suspected the node: its lease is no longer renewed.
    Revoked { node: NodeId },
    /// A new configuration was published (stage Adopt).
    Reconfigured { removed: u64, joined: u64 },
    /// Every member adopted it (stage Recover).
    Adopted,
    /// Every member recovered (stage Run).
    Recovered,
    /// Every copy of every partition is up to date again.
    Rereplicated,
    /// Members (bit i = node i) that did not acknowledge a stage within
    /// [`STAGE_TIMEOUT_MIN_NS`] (or 100 leases): their leases are revoked, and they are
    /// removed as expired.
    StageTimedOut { nodes: u64 },
    /// The cluster cannot go on (a partition lost every copy).
    Failed { why: String },
}

/// The manager's state machine.
pub struct Membership {
    state: ClusterState,
    lease_ns: u64,
    /// Per node id: when its lease runs out (manager time).
    expiry: Vec<u64>,
    /// Members whose renewals are refused (suspected by a majority).
    revoked: u64,
    /// Members on the start-up grace, not granted a lease yet
    /// ([`Membership::extend_first_leases`]).
    ungranted: u64,
    /// Per suspected node: (reporter, when) of its recent suspicions.
    suspicions: Vec<Vec<(NodeId, u64)>>,
    /// Members that acknowledged the current stage.
    acked: u64,
    /// Nodes waiting to join: (node, incarnation).
    joining: Vec<(NodeId, u64)>,
    failed: Option<String>,
    /// Since when the change due would stop the cluster (see [`FATAL_GRACE_MIN_NS`]).
    failing_since: Option<u64>,
    /// The (epoch, stage) the cluster is in and since when (see [`STAGE_TIMEOUT_MIN_NS`]).
    stage_since: (u32, Stage, u64),
    /// When [`Membership::tick`] last ran (see [`STALL_NS_OF_LEASE`]).
    last_tick: u64,
    events: Vec<Event>,
}

/// A change that would stop the cluster for good (every member's lease ran out, or
/// every copy of a partition is on nodes whose lease did) waits this long, or 10
/// leases if longer, before it is made: with every lease out at once the likelier
/// cause is this manager not hearing the renewals in time (its host starved: on a
/// loaded 2-core host a 10 ms lease ran out for every node of a 3-node cluster at once)
/// than every node dying together, and renewals that arrive meanwhile revive the
/// leases. Nodes stop serving on their own clocks when their leases run out, so the
/// wait is safe; it only delays the failure of a cluster that really lost them.
pub const FATAL_GRACE_MIN_NS: u64 = 500_000_000;

/// A member that renews its lease but does not acknowledge a stage for this long (or
/// 100 leases if longer) would hold the whole cluster in that stage: its lease is
/// revoked and it is removed. Seen on a loaded host: a reconfiguration stuck in stage
/// Adopt from the middle of a run to its end. Stages take milliseconds.
pub const STAGE_TIMEOUT_MIN_NS: u64 = 1_000_000_000;

/// A gap between two ticks longer than the lease over this divisor is a stall of the
/// manager itself (its host did not run it: a stopped or starved process), not of the
/// members: it heard no renewal meanwhile, so the leases that ran out then say nothing
/// about them, and each member gets a lease from the tick after the stall to be heard
/// (its renewals wait in the channel). Seen: a launcher stopped for 100–200 ms removed
/// live members at its first tick, before reading their queued renewals. A member
/// that really failed is removed one lease later; never before its own lease ran out.
pub const STALL_NS_OF_LEASE: u64 = 2;

/// How long a suspicion counts.
pub const SUSPICION_TTL_NS: u64 = 5_000_000_000;

impl Membership {
    /// A manager of a cluster starting in `config` (stage Run), every member's lease
    /// running until `now + lease`.
    pub fn new(config: Configuration, lease_ns: u64, now: u64) -> Membership {
        let n = config.placement.nodes() as usize;
        Membership {
            state: ClusterState {
                config,
                stage: Stage::Run,
                revision: 1,
            },
            lease_ns,
            expiry: vec![now + lease_ns; n],
            revoked: 0,
            ungranted: 0,
            suspicions: vec![Vec::new(); n],
            acked: 0,
            joining: Vec::new(),
            failed: None,
            failing_since: None,
            stage_since: (0, Stage::Run, now),
            last_tick: now,
            events: Vec::new(),
        }
    }

    /// Lets every member's first lease run until at least `until` (manager time), or
    /// until its first renewal, whichever comes first: see the lease keeper's grace for
    /// a first grant (`FIRST_GRANT_WITHIN_NS`, 1 s).
    pub fn extend_first_leases(&mut self, until: u64) {
        for e in &mut self.expiry {
            *e = (*e).max(until);
        }
        self.ungranted = self.members();
    }

    /// The state every node must follow.
    pub fn state(&self) -> &ClusterState {
        &self.state
    }

    pub fn lease_ns(&self) -> u64 {
        self.lease_ns
    }

    /// What happened so far.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// Why the cluster stopped, if it did.
    pub fn failure(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    fn members(&self) -> u64 {
        self.state.config.placement.member_mask()
    }

    fn check_member(&self, node: NodeId, incarnation: u64) -> Result<(), Refusal> {
        if let Some(why) = &self.failed {
            return Err(Refusal::Failed(why.clone()));
        }
        decide::check_member(&self.state, node, incarnation)
    }

    /// Renews `node`'s lease (the running incarnation of a member, not revoked).
    pub fn renew(&mut self, node: NodeId, incarnation: u64, now: u64) -> Result<Grant, Refusal> {
        self.check_member(node, incarnation)?;
        if self.revoked & (1 << node) != 0 {
            return Err(Refusal::Revoked { node });
        }
        let e = &mut self.expiry[node as usize];
        if self.ungranted & (1 << node) != 0 {
            // The first grant ends the start-up grace: the node held no lease before.
            self.ungranted &= !(1 << node);
            *e = now + self.lease_ns;
        } else {
            // A lease granted never shrinks.
            *e = (*e).max(now + self.lease_ns);
        }
        Ok(Grant {
            until_ns: *e,
            epoch: self.state.config.epoch,
            revision: self.state.revision,
        })
    }

    /// `reporter` could not reach `node` (its RPCs gave up). Once a majority of the
    /// other members suspect it, its lease is no longer renewed: it is removed when the
    /// lease runs out.
    pub fn suspect(&mut self, reporter: NodeId, node: NodeId, now: u64) {
        let members = self.members();
        let known = |n: NodeId| (n as usize) < self.suspicions.len() && members & (1 << n) != 0;
        if reporter == node || !known(reporter) || !known(node) {
            return;
        }
        let list = &mut self.suspicions[node as usize];
        list.retain(|&(r, t)| r != reporter && now.saturating_sub(t) < SUSPICION_TTL_NS);
        list.push((reporter, now));
        let reporters = list.iter().fold(0u64, |m, &(r, _)| m | (1 << r));
        if decide::revokes(&self.state, node, reporters) && self.revoked & (1 << node) == 0 {
            self.revoked |= 1 << node;
            self.push_event(now, EventKind::Revoked { node });
        }
    }

    /// `node` (incarnation) moved to `epoch`'s `stage`.
    pub fn ack(&mut self, node: NodeId, incarnation: u64, epoch: u32, stage: Stage, now: u64) {
        if self.check_member(node, incarnation).is_err()
            || epoch != self.state.config.epoch
            || stage != self.state.stage
        {
            return;
        }
        self.acked |= 1 << node;
        if let Some(next) = decide::after_acks(&self.state, self.acked) {
            self.acked = 0;
            self.state = next;
            for ev in decide::stage_events(&self.state) {
                self.push_event(now, ev);
            }
        }
    }

    /// A restarted `node` asks to join as `incarnation` (greater than any before). It
    /// is added once the cluster runs and its previous incarnation is removed.
    pub fn join(&mut self, node: NodeId, incarnation: u64) -> Result<(), Refusal> {
        if let Some(why) = &self.failed {
            return Err(Refusal::Failed(why.clone()));
        }
        decide::check_join(&self.state, node, incarnation)?;
        self.joining.retain(|&(n, _)| n != node);
        self.joining.push((node, incarnation));
        Ok(())
    }

    /// `node` holds an up-to-date copy of partition `p` now.
    pub fn synced(&mut self, node: NodeId, incarnation: u64, p: u32, now: u64) {
        if self.check_member(node, incarnation).is_err() {
            return;
        }
        if decide::mark_synced(&mut self.state, node, p)
            && self.state.config.placement.syncing().next().is_none()
        {
            self.push_event(now, EventKind::Rereplicated);
        }
    }

    /// Advances time: removes members whose lease ran out and admits joiners. Returns
    /// whether the state changed.
    pub fn tick(&mut self, now: u64) -> bool {
        if self.failed.is_some() {
            return false;
        }
        self.forgive_own_stall(now);
        self.revoke_stuck(now);
        let alive = (0..self.expiry.len())
            .filter(|&n| now <= self.expiry[n])
            .fold(0u64, |m, n| m | (1 << n));
        let change = decide::next_change(&self.state, alive, self.acked, &self.joining);
        if !matches!(change, Some(decide::Change::Fail { .. })) {
            self.failing_since = None;
        }
        match change {
            None => false,
            Some(decide::Change::Fail { why }) => {
                let since = *self.failing_since.get_or_insert(now);
                let grace = FATAL_GRACE_MIN_NS.max(self.lease_ns.saturating_mul(10));
                if now.saturating_sub(since) < grace {
                    return false;
                }
                self.push_event(now, EventKind::Failed { why: why.clone() });
                self.failed = Some(why);
                true
            }
            Some(decide::Change::Publish { state, events }) => {
                self.apply(state, events, now);
                true
            }
        }
    }

    /// After a stall of this manager (see [`STALL_NS_OF_LEASE`]), gives every member not
    /// revoked a lease from `now`.
    fn forgive_own_stall(&mut self, now: u64) {
        let gap = now.saturating_sub(self.last_tick);
        self.last_tick = now;
        if gap <= self.lease_ns / STALL_NS_OF_LEASE {
            return;
        }
        let keep = self.members() & !self.revoked;
        for n in (0..self.expiry.len()).filter(|&n| keep >> n & 1 == 1) {
            self.expiry[n] = self.expiry[n].max(now + self.lease_ns);
        }
        // The stage timeout counts the manager's time too: not the stall.
        self.stage_since.2 = self.stage_since.2.saturating_add(gap);
    }

    /// Revokes the members that hold the current stage past its timeout (see
    /// [`STAGE_TIMEOUT_MIN_NS`]): their leases end now, so the next change removes them.
    fn revoke_stuck(&mut self, now: u64) {
        let at = (self.state.config.epoch, self.state.stage);
        if (self.stage_since.0, self.stage_since.1) != at {
            self.stage_since = (at.0, at.1, now);
            return;
        }
        let timeout = STAGE_TIMEOUT_MIN_NS.max(self.lease_ns.saturating_mul(100));
        if at.1 == Stage::Run || now.saturating_sub(self.stage_since.2) < timeout {
            return;
        }
        let stuck = self.members() & !self.acked & !self.revoked;
        if stuck == 0 {
            return;
        }
        self.revoked |= stuck;
        for n in 0..self.expiry.len() {
            if stuck >> n & 1 == 1 {
                self.expiry[n] = 0;
            }
        }
        self.push_event(now, EventKind::StageTimedOut { nodes: stuck });
    }

    /// Installs a state decided by [`decide`], with what follows from it here.
    fn apply(&mut self, state: ClusterState, events: Vec<EventKind>, now: u64) {
        let before = self.members();
        let after = state.config.placement.member_mask();
        let removed = before & !after;
        let joined = after & !before;
        for n in 0..self.suspicions.len() {
            if removed & (1 << n) != 0 {
                self.suspicions[n].clear();
            }
            // A joiner's lease starts now: it renews as soon as it adopts.
            if joined & (1 << n) != 0 {
                self.expiry[n] = now + self.lease_ns;
            }
        }
        self.revoked &= !removed;
        self.joining.retain(|&(n, _)| joined & (1 << n) == 0);
        let epoch_before = self.state.config.epoch;
        self.state = state;
        self.acked = 0;
        for ev in events {
            // The expiry happened in the old epoch.
            let epoch = match ev {
                EventKind::LeaseExpired { .. } => epoch_before,
                _ => self.state.config.epoch,
            };
            self.events.push(Event {
                at_ns: now,
                epoch,
                what: ev,
            });
        }
    }

    /// The next time [`Membership::tick`] may change something.
    pub fn next_deadline(&self) -> u64 {
        let members = self.members();
        (0..self.expiry.len())
            .filter(|&n| members & (1 << n) != 0)
            .map(|n| self.expiry[n] + 1)
            .min()
            .unwrap_or(u64::MAX)
    }

    fn push_event(&mut self, at_ns: u64, what: EventKind) {
        self.events.push(Event {
            at_ns,
            epoch: self.state.config.epoch,
            what,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn three() -> Membership {
        Membership::new(Configuration::initial(3, 3).unwrap(), 20 * MS, 0)
    }

    /// Ticks every millisecond from the last tick to `t` (a manager that runs all
    /// along, as the embedded one's ticker does), returning whether any tick changed the
    /// state. A single `tick` far ahead is a stall of the manager (see
    /// [`STALL_NS_OF_LEASE`]).
    fn tick_to(m: &mut Membership, t: u64) -> bool {
        let mut changed = false;
        let mut now = m.last_tick;
        while now + MS < t {
            now += MS;
            changed |= m.tick(now);
        }
        changed | m.tick(t)
    }

    fn ack_all(m: &mut Membership, stage: Stage, now: u64) {
        let c = m.state().config.clone();
        for n in c.placement.members() {
            m.ack(n, c.incarnations[n as usize], c.epoch, stage, now);
        }
    }

    #[test]
    fn a_silent_member_is_removed_when_its_lease_runs_out() {
        let mut m = three();
        let mut changed_at = None;
        for t in (0..60).map(|i| i * 4 * MS) {
            m.renew(0, 1, t).unwrap();
            m.renew(1, 1, t).unwrap();
            if m.tick(t) {
                changed_at = Some(t);
                break;
            }
        }
        assert_eq!(
            changed_at,
            Some(24 * MS),
            "the first tick past the 20 ms lease"
        );
        let s = m.state().clone();
        assert_eq!((s.config.epoch, s.stage), (2, Stage::Adopt));
        assert!(!s.config.placement.is_member(2));
        assert_eq!(
            m.renew(2, 1, 30 * MS),
            Err(Refusal::NotMember {
                node: 2,
                incarnation: 1
            })
        );
        ack_all(&mut m, Stage::Adopt, 31 * MS);
        assert_eq!(m.state().stage, Stage::Recover);
        // A stale acknowledgement (of the old epoch) changes nothing.
        m.ack(0, 1, 1, Stage::Recover, 32 * MS);
        ack_all(&mut m, Stage::Recover, 33 * MS);
        assert_eq!(m.state().stage, Stage::Run);
        let kinds: Vec<_> = m.events().iter().map(|e| e.what.clone()).collect();
        assert!(matches!(kinds[0], EventKind::LeaseExpired { nodes: 0b100 }));
        assert!(matches!(
            kinds[1],
            EventKind::Reconfigured { removed: 0b100, .. }
        ));
        assert_eq!(kinds[2..4], [EventKind::Adopted, EventKind::Recovered]);
    }

    #[test]
    fn a_majority_must_suspect_before_a_lease_is_revoked() {
        let mut m = three();
        m.suspect(0, 2, 0);
        m.renew(2, 1, MS)
            .expect("one of two others is not a majority");
        m.suspect(1, 2, MS);
        assert_eq!(m.renew(2, 1, 2 * MS), Err(Refusal::Revoked { node: 2 }));
        // Removed only once the lease granted runs out.
        m.renew(0, 1, 15 * MS).unwrap();
        m.renew(1, 1, 15 * MS).unwrap();
        assert!(!tick_to(&mut m, 20 * MS));
        assert!(tick_to(&mut m, 22 * MS));
        assert!(!m.state().config.placement.is_member(2));
    }

    #[test]
    fn a_failure_during_a_reconfiguration_starts_the_next_one() {
        let mut m = Membership::new(Configuration::initial(5, 3).unwrap(), 20 * MS, 0);
        for n in 0..4 {
            m.renew(n, 1, 10 * MS).unwrap();
        }
        assert!(tick_to(&mut m, 21 * MS));
        assert_eq!(m.state().config.epoch, 2);
        m.ack(0, 1, 2, Stage::Adopt, 22 * MS);
        // Node 3 dies before acknowledging.
        for n in 0..3 {
            m.renew(n, 1, 25 * MS).unwrap();
        }
        assert!(tick_to(&mut m, 31 * MS));
        let s = m.state();
        assert_eq!((s.config.epoch, s.stage), (3, Stage::Adopt));
        assert_eq!(
            s.config.placement.members().collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
    }

    #[test]
    fn a_restarted_node_joins_as_a_new_incarnation_once_the_cluster_runs() {
        let mut m = three();
        m.renew(0, 1, 10 * MS).unwrap();
        m.renew(1, 1, 10 * MS).unwrap();
        assert!(tick_to(&mut m, 25 * MS));
        m.join(2, 5).unwrap();
        assert!(
            !tick_to(&mut m, 26 * MS),
            "not while the removal is being recovered"
        );
        ack_all(&mut m, Stage::Adopt, 26 * MS);
        ack_all(&mut m, Stage::Recover, 27 * MS);
        m.renew(0, 1, 27 * MS).unwrap();
        m.renew(1, 1, 27 * MS).unwrap();
        assert!(tick_to(&mut m, 28 * MS));
        let c = m.state().config.clone();
        assert_eq!((c.epoch, c.incarnations[2]), (3, 5));
        assert!(c.placement.is_member(2));
        assert_eq!(
            c.placement.syncing().count(),
            c.placement.partitions() as usize
        );
        assert_eq!(
            m.join(2, 4),
            Err(Refusal::StaleIncarnation {
                node: 2,
                got: 4,
                member: 5
            })
        );
        ack_all(&mut m, Stage::Adopt, 29 * MS);
        ack_all(&mut m, Stage::Recover, 29 * MS);
        for p in 0..c.placement.partitions() {
            m.synced(2, 5, p, 40 * MS);
        }
        assert!(matches!(
            m.events().last().unwrap().what,
            EventKind::Rereplicated
        ));
    }

    #[test]
    fn the_start_up_grace_lasts_until_the_first_grant() {
        let mut m = three();
        m.extend_first_leases(1_000 * MS);
        // Nobody renewed by 30 ms: still members (the grace).
        assert!(!tick_to(&mut m, 30 * MS));
        // Nodes 0 and 1 renew; node 2 never does.
        m.renew(0, 1, 40 * MS).unwrap();
        m.renew(1, 1, 40 * MS).unwrap();
        // Their leases run from the grant (20 ms), not to the grace's end.
        m.renew(0, 1, 55 * MS).unwrap();
        assert!(tick_to(&mut m, 70 * MS), "node 1's lease ran out at 60 ms");
        assert!(!m.state().config.placement.is_member(1));
        assert!(
            m.state().config.placement.is_member(2),
            "node 2 is on the grace"
        );
    }

    #[test]
    fn losing_every_copy_stops_the_cluster_with_the_reason() {
        let mut m = Membership::new(Configuration::initial(3, 1).unwrap(), 20 * MS, 0);
        m.renew(0, 1, 10 * MS).unwrap();
        m.renew(1, 1, 10 * MS).unwrap();
        // Not at once: renewals may just be late.
        assert!(!tick_to(&mut m, 25 * MS));
        assert!(m.failure().is_none());
        // Nodes 0 and 1 renew on; node 2 (the only copy of some partitions) does not:
        // its lease runs out at 20 ms, and the failure waits the grace from 21 ms.
        let end = 21 * MS + FATAL_GRACE_MIN_NS;
        m.renew(0, 1, end - 5 * MS).unwrap();
        m.renew(1, 1, end - 5 * MS).unwrap();
        assert!(!tick_to(&mut m, end - 1));
        assert!(tick_to(&mut m, end));
        let why = m
            .failure()
            .expect("a partition with one copy was lost")
            .to_string();
        assert!(why.contains("lost every up-to-date copy"), "{why}");
        assert!(matches!(
            m.renew(0, 1, 26 * MS + FATAL_GRACE_MIN_NS),
            Err(Refusal::Failed(_))
        ));
    }

    #[test]
    fn a_member_that_never_acknowledges_a_stage_is_removed_after_the_timeout() {
        let mut m = three();
        for n in 0..3 {
            m.renew(n, 1, 10 * MS).unwrap();
        }
        // Node 2 dies: epoch 2 at Adopt; node 1 renews on but never acknowledges.
        m.renew(0, 1, 25 * MS).unwrap();
        m.renew(1, 1, 25 * MS).unwrap();
        assert!(tick_to(&mut m, 31 * MS));
        assert_eq!((m.state().config.epoch, m.state().stage), (2, Stage::Adopt));
        m.ack(0, 1, 2, Stage::Adopt, 32 * MS);
        let timeout = STAGE_TIMEOUT_MIN_NS.max(100 * 20 * MS);
        let mut t = 32 * MS;
        while t < 31 * MS + timeout {
            for n in 0..2 {
                m.renew(n, 1, t).unwrap();
            }
            tick_to(&mut m, t);
            t += 5 * MS;
        }
        assert_eq!(m.state().config.epoch, 2, "held in Adopt until the timeout");
        m.renew(0, 1, t).unwrap();
        tick_to(&mut m, t);
        m.renew(0, 1, t + MS).unwrap();
        tick_to(&mut m, t + MS);
        let s = m.state();
        assert_eq!(s.config.epoch, 3, "{:?}", m.events());
        assert_eq!(s.config.placement.member_mask(), 0b001);
        assert!(m
            .events()
            .iter()
            .any(|e| e.what == EventKind::StageTimedOut { nodes: 0b010 }));
        assert!(m.renew(1, 1, t + 2 * MS).is_err());
    }

    /// The manager's host stops it for 190 ms; when it runs again it has read node 0's
    /// queued renewal but not yet the others'. It removes nobody: every member gets a
    /// lease from the stall's end to be heard. Node 2, which really is silent, is
    /// removed one lease later. (Without the stall rule the first tick removed the live
    /// nodes 1 and 2.)
    #[test]
    fn a_stall_of_the_manager_removes_no_member_it_did_not_hear() {
        let mut m = three();
        for t in (1..=10).map(|i| i * MS) {
            for n in 0..3 {
                m.renew(n, 1, t).unwrap();
            }
            assert!(!m.tick(t));
        }
        m.renew(0, 1, 200 * MS).unwrap();
        assert!(!m.tick(200 * MS), "{:?}", m.events());
        assert_eq!(m.state().config.placement.member_mask(), 0b111);
        let mut t = 201 * MS;
        while t < 220 * MS {
            m.renew(0, 1, t).unwrap();
            m.renew(1, 1, t).unwrap();
            assert!(!m.tick(t), "at {t}: {:?}", m.events());
            t += MS;
        }
        m.renew(0, 1, 221 * MS).unwrap();
        m.renew(1, 1, 221 * MS).unwrap();
        assert!(tick_to(&mut m, 222 * MS));
        assert_eq!(m.state().config.placement.member_mask(), 0b011);
    }

    /// Every lease out at once with the manager running all along (its ticks came, the
    /// renewals did not: the channel, not the manager, was starved): nothing is decided
    /// for the grace, and the late renewals revive the leases.
    #[test]
    fn leases_that_all_run_out_at_once_are_revived_by_late_renewals() {
        let mut m = three();
        for n in 0..3 {
            m.renew(n, 1, 10 * MS).unwrap();
        }
        // Every lease runs out: nothing is decided yet.
        assert!(!tick_to(&mut m, 100 * MS));
        assert!(m.failure().is_none());
        assert_eq!(m.state().config.epoch, 1);
        // The renewals come in late, and the cluster runs on in the same configuration.
        for n in 0..3 {
            m.renew(n, 1, 150 * MS).unwrap();
        }
        assert!(!tick_to(&mut m, 151 * MS));
        for n in 0..3 {
            m.renew(n, 1, 151 * MS + FATAL_GRACE_MIN_NS).unwrap();
        }
        assert!(!tick_to(&mut m, 151 * MS + FATAL_GRACE_MIN_NS));
        assert!(m.failure().is_none());
        assert_eq!(m.state().config.placement.member_mask(), 0b111);
    }
}
