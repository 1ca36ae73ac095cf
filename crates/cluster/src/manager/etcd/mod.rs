//! The etcd manager: the cluster's state and its nodes' leases live in etcd
//! ([`keys`] has the layout) and there is no manager process. Every node takes the
//! manager's decisions (`membership::decide`) over what it reads from etcd, and the
//! first to publish a new state wins: the publication is an etcd transaction that compares the
//! state key's revision with the one the decision was taken on, so a node that
//! decided on an older state loses and decides again on the newer one.
//!
//! - A node's lease is its `lease/<node>` key, attached to an etcd lease of the
//!   configured lease rounded up to whole seconds (etcd's unit), kept alive by
//!   [`ManagerClient::renew`], which the node calls at a fifth of the lease
//!   ([`crate::LeaseKeeper`]). A member is gone when that key is absent: etcd deleted
//!   it when the lease expired. The node counts its lease from when it sent the
//!   renewal, and never longer than the etcd lease, so it stops serving first.
//! - Once a majority of the other members suspect a node and its key outlived a lease
//!   (and etcd's expiry sweep) since, so it still renews, the first node to see it
//!   re-attaches that node's key to a fresh lease a second longer that nobody renews:
//!   the node is refused ([`Refusal::Revoked`]) and removed when that lease expires,
//!   which is no earlier than the node's own estimate runs out. A dead node is not
//!   revoked: its key expires first.
//! - [`ManagerClient::state_after`] waits on an etcd watch of the cluster's keys;
//!   every event wakes it to read the keys again and decide.
//!
//! etcd's lease TTL is whole seconds and never below its minimum of 1.5 election
//! timeouts (rounded up): with etcd's default settings (100 ms heartbeat, 1 s
//! election timeout) that is 2 s; the tests run etcd with 10 ms and 100 ms and get
//! 1 s leases. etcd looks for expired leases every 500 ms, so a failure is seen
//! between the TTL and the TTL + 0.5 s after the last renewal: tests/etcd.rs measured
//! 1.32-1.47 s with 1 s leases (2.1-2.5 s with etcd's defaults and their 2 s
//! minimum), on a shared 2-core machine, also with three busy loops beside. The 50 ms
//! goal of recovery is the embedded manager's; etcd's is seconds, the price of a
//! manager that survives machines.
//!
//! The client runs a current-thread tokio runtime of its own and blocks on it: its
//! callers are plain threads. Between calls nothing runs; the watch's events wait in
//! the connection until the next call reads them.

mod bootstrap;
mod conn;
pub mod keys;
pub mod local;

pub use bootstrap::{EtcdManager, EtcdReader};
use conn::{unreachable, Conn, CALL_TIMEOUT};

use super::{ManagerClient, ManagerError};
use crate::membership::decide::{self, Change};
use crate::membership::{ClusterState, Event, EventKind, Grant, Refusal, Stage, SUSPICION_TTL_NS};
use ambidex_transport::NodeId;
use etcd_client::{
    Compare, CompareOp, DeleteOptions, PutOptions, Txn, TxnOp, WatchOptions, WatchStream,
};
use keys::{lease_value, Record, Snapshot};
use std::time::{Duration, Instant};

/// How many times a node decides again after losing a publication in a row (each
/// loss means another node published, so the state moves on; this bounds a call).
const MAX_ROUNDS: usize = 16;

/// How long a look for events already arrived waits.
const DRAIN: Duration = Duration::from_millis(1);

/// How often etcd deletes expired leases (its `lessor` checks every 500 ms).
const EXPIRY_SWEEP: Duration = Duration::from_millis(500);

/// How often [`ManagerClient::state_after`] reads when it has no watch (it lost it and
/// could not make a new one).
const POLL: Duration = Duration::from_millis(50);

/// The etcd lease TTL (whole seconds) for a lease of `lease`: rounded up, never
/// shorter, so the etcd lease outlives the node's own estimate.
pub fn ttl_secs(lease: Duration) -> i64 {
    (lease.as_nanos().div_ceil(1_000_000_000) as i64).max(1)
}

/// A decision taken on one read, to be published ([`EtcdClient::publish`]).
#[derive(Clone, Debug)]
pub struct Pending {
    record: Record,
    /// The state key's revision the decision was taken on.
    on: i64,
    /// Whether the acknowledgements are for an older state then (a new epoch or stage).
    clears_acks: bool,
    /// Bit i: node i leaves or joins the members: its suspicions are deleted. They
    /// were of its old incarnation (or of a node no longer a member), and would
    /// otherwise outlive its return by up to their TTL and revoke the new incarnation
    /// (the embedded manager forgets a removed node's suspicions likewise).
    clears_suspicions: u64,
    /// What it reports, once published; and the epoch decided on.
    events: Vec<EventKind>,
    from_epoch: u32,
}

impl Pending {
    /// The state it publishes.
    pub fn state(&self) -> &ClusterState {
        &self.record.state
    }
}

/// One node's handle on the etcd manager.
pub struct EtcdClient {
    conn: Conn,
    node: NodeId,
    incarnation: u64,
    lease_id: i64,
    ttl: i64,
    keep_alive: Option<(etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream)>,
    watch: Option<WatchStream>,
    /// The last read.
    last: Snapshot,
    /// The etcd revision of the last read: a new watch starts after it.
    read_at: i64,
    epoch_start: Instant,
    /// Watches made again after one broke or was cancelled (for reports).
    watch_restarts: u64,
    /// What this node published (other nodes publish the rest).
    events: Vec<Event>,
    /// Members a majority suspects, and since when this node saw it (see
    /// [`EtcdClient::revoke_suspected`]).
    suspected_since: Vec<(NodeId, Instant)>,
}

impl EtcdClient {
    /// Connects node `node`, incarnation `incarnation`, to cluster `cluster` (which
    /// must have been bootstrapped) and takes its lease: an etcd lease of `lease`
    /// rounded up to seconds. A restarted node then calls [`ManagerClient::join`].
    pub fn connect(
        endpoints: &[&str],
        cluster: &str,
        node: NodeId,
        incarnation: u64,
        lease: Duration,
    ) -> Result<EtcdClient, ManagerError> {
        let mut conn = Conn::open(endpoints, cluster)?;
        let not_bootstrapped = |conn: &Conn| {
            ManagerError::Protocol(format!(
                "cluster {} has no state in etcd (not bootstrapped)",
                conn.keys.root()
            ))
        };
        // Checked first: no lease key is left under a cluster that does not exist.
        if conn.read()?.0.is_none() {
            return Err(not_bootstrapped(&conn));
        }
        let (lease_id, ttl) = conn.grant(ttl_secs(lease))?;
        let key = conn.keys.lease(node);
        let mine = lease_value(incarnation, false);
        // Never over a newer incarnation's key, nor over this incarnation's revoked one
        // (both compare greater).
        conn.txn(
            Txn::new()
                .when([Compare::value(
                    key.clone(),
                    CompareOp::Greater,
                    mine.clone(),
                )])
                .or_else([TxnOp::put(
                    key,
                    mine,
                    Some(PutOptions::new().with_lease(lease_id)),
                )]),
        )?;
        let (snap, read_at) = conn.read()?;
        let Some(last) = snap else {
            return Err(not_bootstrapped(&conn));
        };
        let mut c = EtcdClient {
            conn,
            node,
            incarnation,
            lease_id,
            ttl,
            keep_alive: None,
            watch: None,
            last,
            read_at,
            epoch_start: Instant::now(),
            watch_restarts: 0,
            events: Vec::new(),
            suspected_since: Vec::new(),
        };
        c.rewatch();
        Ok(c)
    }

    /// The etcd lease TTL granted, in seconds (etcd may raise it to its minimum).
    pub fn ttl_secs(&self) -> i64 {
        self.ttl
    }

    /// What this node published, at node time (ns since it connected): each change is
    /// published by the one node whose transaction won, so a report merges every
    /// node's.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// How many times the watch of the cluster's keys broke and was made again.
    pub fn watch_restarts(&self) -> u64 {
        self.watch_restarts
    }

    /// The state as last read.
    pub fn state(&self) -> &ClusterState {
        self.last.state()
    }

    /// Why the cluster stopped, if it did (as last read).
    pub fn failure(&self) -> Option<&str> {
        self.last.record.failed.as_deref()
    }

    fn now_ns(&self) -> u64 {
        self.epoch_start.elapsed().as_nanos() as u64
    }

    /// Reads the cluster's keys.
    fn read(&mut self) -> Result<&Snapshot, ManagerError> {
        let (snap, at) = self.conn.read()?;
        self.last = snap.ok_or_else(|| {
            ManagerError::Protocol(format!("the state under {} is gone", self.conn.keys.root()))
        })?;
        self.read_at = at;
        Ok(&self.last)
    }

    /// Reads, and takes the decision due on what it read, if any: revokes the lease of
    /// a node a majority suspects (at once), and returns the next state to publish.
    pub fn decide(&mut self) -> Result<Option<Pending>, ManagerError> {
        self.read()?;
        if self.last.record.failed.is_some() {
            return Ok(None);
        }
        self.revoke_suspected()?;
        let s = &self.last;
        let joining = s.live_joiners();
        let change = decide::next_change(s.state(), s.alive(), s.acked(), &joining);
        let (record, events) = match change {
            None => return Ok(None),
            Some(Change::Publish { state, events }) => (
                Record {
                    state,
                    failed: None,
                },
                events,
            ),
            Some(Change::Fail { why }) => (
                Record {
                    state: s.state().clone(),
                    failed: Some(why.clone()),
                },
                vec![EventKind::Failed { why }],
            ),
        };
        let (before, after) = (
            s.state().config.placement.member_mask(),
            record.state.config.placement.member_mask(),
        );
        Ok(Some(Pending {
            clears_suspicions: before ^ after,
            clears_acks: record.state.stage != s.state().stage
                || record.state.config.epoch != s.state().config.epoch,
            record,
            on: s.state_mod_revision,
            events,
            from_epoch: s.state().config.epoch,
        }))
    }

    /// Publishes `p` unless the state changed since it was decided on. Returns whether
    /// it did.
    pub fn publish(&mut self, p: Pending) -> Result<bool, ManagerError> {
        let keys = &self.conn.keys;
        let mut ops = vec![TxnOp::put(keys.state(), p.record.encode(), None)];
        if p.clears_acks {
            ops.push(TxnOp::delete(
                keys.acks(),
                Some(DeleteOptions::new().with_prefix()),
            ));
        }
        for n in (0..64).filter(|n| p.clears_suspicions & (1 << n) != 0) {
            ops.push(TxnOp::delete(
                keys.suspicions_of(n),
                Some(DeleteOptions::new().with_prefix()),
            ));
        }
        let t = Txn::new()
            .when([Compare::mod_revision(keys.state(), CompareOp::Equal, p.on)])
            .and_then(ops);
        let won = self.conn.txn(t)?;
        if won {
            let at_ns = self.now_ns();
            let epoch = p.record.state.config.epoch;
            for what in p.events {
                // The expiry happened in the old epoch (as Membership reports it).
                let epoch = match what {
                    EventKind::LeaseExpired { .. } => p.from_epoch,
                    _ => epoch,
                };
                self.events.push(Event { at_ns, epoch, what });
            }
        }
        Ok(won)
    }

    /// Takes every decision due, deciding again whenever another node published first.
    fn advance(&mut self) -> Result<(), ManagerError> {
        for _ in 0..MAX_ROUNDS {
            match self.decide()? {
                None => return Ok(()),
                Some(p) => {
                    // Won or lost, the state moved: decide again on the new one.
                    self.publish(p)?;
                }
            }
        }
        Ok(())
    }

    /// Re-attaches to a lease nobody renews the key of every member a majority of the
    /// others suspect (the first node to see it does; the others' transactions fail),
    /// once its key outlived a lease and etcd's expiry sweep since this node first saw
    /// the majority. A dead node's key is gone by then (it stopped renewing before it
    /// was suspected), so its removal waits for its own lease only; revoking at once
    /// would delay it to the revoking lease's end, a whole lease and a second later. A
    /// node that still renews (cut off from the others, not from etcd) is revoked then.
    fn revoke_suspected(&mut self) -> Result<(), ManagerError> {
        let s = &self.last;
        let suspected: Vec<(NodeId, keys::LeaseKey)> = s
            .state()
            .config
            .placement
            .members()
            .filter_map(|n| s.leases[n as usize].map(|l| (n, l)))
            .filter(|(n, l)| !l.revoked && decide::revokes(s.state(), *n, s.reporters(*n)))
            .collect();
        self.suspected_since
            .retain(|(n, _)| suspected.iter().any(|(m, _)| m == n));
        let now = Instant::now();
        let wait = Duration::from_secs(self.ttl.max(0) as u64) + EXPIRY_SWEEP;
        let mut due = Vec::new();
        for (n, l) in suspected {
            match self.suspected_since.iter().find(|(m, _)| *m == n) {
                None => self.suspected_since.push((n, now)),
                Some((_, since)) if now.duration_since(*since) >= wait => due.push((n, l)),
                Some(_) => {}
            }
        }
        for (n, l) in due {
            // A second more than the node's own lease: a renewal it sent just before
            // this revocation commits may extend its own estimate by a whole lease.
            let (lease, _) = self.conn.grant(self.ttl + 1)?;
            let key = self.conn.keys.lease(n);
            let won = self.conn.txn(
                Txn::new()
                    .when([Compare::mod_revision(
                        key.clone(),
                        CompareOp::Equal,
                        l.mod_revision,
                    )])
                    .and_then([TxnOp::put(
                        key,
                        lease_value(l.incarnation, true),
                        Some(PutOptions::new().with_lease(lease)),
                    )]),
            )?;
            if won {
                let (at_ns, epoch) = (self.now_ns(), self.last.state().config.epoch);
                self.events.push(Event {
                    at_ns,
                    epoch,
                    what: EventKind::Revoked { node: n },
                });
            }
        }
        Ok(())
    }

    /// Starts watching the cluster's keys from after the last read.
    fn rewatch(&mut self) {
        let mut w = self.conn.client.watch_client();
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(self.read_at + 1);
        self.watch = self
            .conn
            .run(w.watch(self.conn.keys.root().to_string(), Some(opts)))
            .ok();
    }

    /// Waits up to `wait` for a change of the cluster's keys; returns whether one came
    /// (or may have: without a watch it polls).
    fn wait_change(&mut self, wait: Duration) -> bool {
        let Some(w) = &mut self.watch else {
            std::thread::sleep(wait.min(POLL));
            self.rewatch();
            return true;
        };
        // At least DRAIN: the connection's task runs only inside this call, and must
        // get to read what already arrived.
        let mut limit = wait.max(DRAIN);
        let mut changed = false;
        for _ in 0..64 {
            match self.conn.within(limit, w.message()) {
                None => return changed,
                Some(Ok(Some(m))) if !m.canceled() => changed = true,
                // Cancelled (compacted past) or broken: read again and start a new one.
                Some(_) => {
                    self.watch = None;
                    self.watch_restarts += 1;
                    return true;
                }
            }
            // Events that came together cost one read.
            limit = DRAIN;
        }
        changed
    }

    /// This node's lease key says it is revoked (or names another incarnation).
    fn check_lease_key(&self) -> Result<(), Refusal> {
        let (node, incarnation) = (self.node, self.incarnation);
        match self.last.leases.get(node as usize).copied().flatten() {
            Some(l) if l.incarnation == incarnation && l.revoked => Err(Refusal::Revoked { node }),
            Some(l) if l.incarnation == incarnation && l.lease == self.lease_id => Ok(()),
            Some(l) if l.incarnation > incarnation => Err(Refusal::StaleIncarnation {
                node,
                got: incarnation,
                member: l.incarnation,
            }),
            // Expired, or held by a lease of another connection of this incarnation.
            _ => Err(Refusal::NotMember { node, incarnation }),
        }
    }

    fn check_failed(&self) -> Result<(), Refusal> {
        match &self.last.record.failed {
            Some(why) => Err(Refusal::Failed(why.clone())),
            None => Ok(()),
        }
    }

    /// One keep-alive of this node's etcd lease; returns the TTL left (0: expired).
    fn keep_alive(&mut self) -> Result<i64, ManagerError> {
        if self.keep_alive.is_none() {
            let mut l = self.conn.client.lease_client();
            self.keep_alive = Some(self.conn.run(l.keep_alive(self.lease_id))?);
        }
        let Some((keeper, stream)) = &mut self.keep_alive else {
            return Err(unreachable("no keep-alive stream"));
        };
        let r = self.conn.within(CALL_TIMEOUT, async {
            keeper.keep_alive().await?;
            stream.message().await
        });
        match r {
            Some(Ok(Some(resp))) => Ok(resp.ttl()),
            Some(Ok(None)) => {
                self.keep_alive = None;
                Err(unreachable("the keep-alive stream ended"))
            }
            Some(Err(e)) => {
                self.keep_alive = None;
                Err(unreachable(e))
            }
            None => {
                // An answer may still come; a new stream will not confuse it with the
                // next renewal's.
                self.keep_alive = None;
                Err(unreachable("lease keep-alive timed out"))
            }
        }
    }
}

impl ManagerClient for EtcdClient {
    fn renew(&mut self) -> Result<Grant, ManagerError> {
        let sent = self.now_ns();
        let ttl = self.keep_alive()?;
        self.advance()?;
        self.check_failed()?;
        decide::check_member(self.last.state(), self.node, self.incarnation)?;
        if ttl <= 0 {
            // The etcd lease expired: the key is gone, and this node with it.
            return Err(Refusal::NotMember {
                node: self.node,
                incarnation: self.incarnation,
            }
            .into());
        }
        self.check_lease_key()?;
        let s = self.last.state();
        Ok(Grant {
            until_ns: sent + ttl as u64 * 1_000_000_000,
            epoch: s.config.epoch,
            revision: s.revision,
        })
    }

    fn state_after(
        &mut self,
        revision: u64,
        wait: Duration,
    ) -> Result<Option<ClusterState>, ManagerError> {
        let deadline = Instant::now() + wait;
        // Events that came since the last call first.
        let mut changed = self.wait_change(Duration::ZERO);
        loop {
            if changed {
                self.advance()?;
                if self.watch.is_none() {
                    self.rewatch();
                }
            }
            if self.last.state().revision > revision {
                return Ok(Some(self.last.state().clone()));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            changed = self.wait_change(left);
        }
    }

    fn ack(&mut self, epoch: u32, stage: Stage) -> Result<(), ManagerError> {
        if stage == Stage::Run {
            return Ok(());
        }
        let key = self.conn.keys.ack(epoch, stage, self.node);
        self.conn.put(key, self.incarnation.to_string(), 0)?;
        self.advance()
    }

    fn suspect(&mut self, node: NodeId) -> Result<(), ManagerError> {
        // A suspicion of a non-member counts for nothing (nor does one of a
        // removed node, whose suspicions are deleted with its removal).
        if node == self.node
            || node as usize >= self.last.leases.len()
            || !self.last.state().config.placement.is_member(node)
        {
            return Ok(());
        }
        // The suspicion lapses with its etcd lease.
        let (lease, _) = self
            .conn
            .grant(SUSPICION_TTL_NS.div_ceil(1_000_000_000) as i64)?;
        let key = self.conn.keys.suspect(node, self.node);
        self.conn.put(key, String::new(), lease)?;
        self.advance()
    }

    fn synced(&mut self, partitions: &[u32]) -> Result<(), ManagerError> {
        for _ in 0..MAX_ROUNDS {
            self.advance()?;
            let s = self.last.state();
            if self.check_failed().is_err()
                || decide::check_member(s, self.node, self.incarnation).is_err()
            {
                return Ok(());
            }
            let mut next = s.clone();
            let mut any = false;
            for &p in partitions {
                any |= decide::mark_synced(&mut next, self.node, p);
            }
            if !any {
                return Ok(());
            }
            // One new revision for the whole batch.
            next.revision = s.revision + 1;
            let events = if next.config.placement.syncing().next().is_none() {
                vec![EventKind::Rereplicated]
            } else {
                Vec::new()
            };
            let p = Pending {
                from_epoch: next.config.epoch,
                record: Record {
                    state: next,
                    failed: None,
                },
                on: self.last.state_mod_revision,
                clears_acks: false,
                clears_suspicions: 0,
                events,
            };
            if self.publish(p)? {
                return Ok(());
            }
        }
        Err(ManagerError::Unreachable(
            "synced copies not published: the state kept changing".into(),
        ))
    }

    /// The node must go on calling [`ManagerClient::renew`] while it waits (refused
    /// until it is a member): that keeps its etcd lease, and a joiner whose lease
    /// expired is not admitted.
    fn join(&mut self) -> Result<(), ManagerError> {
        self.advance()?;
        self.check_failed()?;
        decide::check_join(self.last.state(), self.node, self.incarnation)?;
        let key = self.conn.keys.join(self.node);
        self.conn.put(key, self.incarnation.to_string(), 0)?;
        self.advance()
    }
}
