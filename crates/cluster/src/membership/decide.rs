//! The manager's decisions as pure functions of a [`ClusterState`] and of what the
//! manager observed (whose leases hold, who acknowledged, who asks to join, who is
//! suspected). Both managers take them: the embedded [`Membership`] over what it
//! counts itself, the etcd manager over what every node reads from etcd, so they
//! cannot disagree on what happens next.
//!
//! [`Membership`]: super::Membership

use super::{ClusterState, EventKind, Refusal, Stage};
use crate::placement::PlacementError;
use ambidex_transport::NodeId;

/// One change of the state, as decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Publish this state (what happened, for reports, in order).
    Publish {
        state: ClusterState,
        events: Vec<EventKind>,
    },
    /// The cluster cannot go on.
    Fail { why: String },
}

/// Why `node` (as `incarnation`) may not act as a member of `state`.
pub fn check_member(state: &ClusterState, node: NodeId, incarnation: u64) -> Result<(), Refusal> {
    let Some(&member) = state.config.incarnations.get(node as usize) else {
        return Err(Refusal::UnknownNode(node));
    };
    if !state.config.placement.is_member(node) || incarnation > member {
        return Err(Refusal::NotMember { node, incarnation });
    }
    if incarnation < member {
        return Err(Refusal::StaleIncarnation {
            node,
            got: incarnation,
            member,
        });
    }
    Ok(())
}

/// Why `node` may not join `state` as `incarnation` (it must be newer than any before).
pub fn check_join(state: &ClusterState, node: NodeId, incarnation: u64) -> Result<(), Refusal> {
    let Some(&member) = state.config.incarnations.get(node as usize) else {
        return Err(Refusal::UnknownNode(node));
    };
    if incarnation <= member {
        return Err(Refusal::StaleIncarnation {
            node,
            got: incarnation,
            member,
        });
    }
    Ok(())
}

/// The joiners of `joining` (node, incarnation) that still wait: newer than the member.
pub fn waiting<'a>(
    state: &'a ClusterState,
    joining: &'a [(NodeId, u64)],
) -> impl Iterator<Item = (NodeId, u64)> + 'a {
    joining
        .iter()
        .copied()
        .filter(|&(n, inc)| check_join(state, n, inc).is_ok())
}

/// The members that are gone (bit i = node i): their lease does not hold (`alive`,
/// bit i = node i's lease holds), or a newer incarnation of them asks to join (the
/// member restarted).
pub fn gone(state: &ClusterState, alive: u64, joining: &[(NodeId, u64)]) -> u64 {
    let members = state.config.placement.member_mask();
    let restarted = waiting(state, joining).fold(0u64, |m, (n, _)| m | (1 << n));
    members & (!alive | restarted)
}

/// The next state once the members of `gone` are removed: the next epoch, at Adopt.
pub fn remove(state: &ClusterState, gone: u64) -> Change {
    match state.config.without(gone) {
        Ok(config) => publish(
            state,
            config,
            vec![
                EventKind::LeaseExpired { nodes: gone },
                EventKind::Reconfigured {
                    removed: gone,
                    joined: 0,
                },
            ],
        ),
        Err(e) => fail(e),
    }
}

/// The next stage once the members of `acked` acknowledged the current one; `None`
/// while a member has not (or the cluster runs: nothing to acknowledge).
pub fn after_acks(state: &ClusterState, acked: u64) -> Option<ClusterState> {
    let members = state.config.placement.member_mask();
    if state.stage == Stage::Run || acked & members != members {
        return None;
    }
    let mut next = state.clone();
    next.revision += 1;
    next.stage = match state.stage {
        Stage::Adopt => Stage::Recover,
        _ => Stage::Run,
    };
    Some(next)
}

/// What moving from `state` to `next` (a stage change) reports.
pub fn stage_events(next: &ClusterState) -> Vec<EventKind> {
    match next.stage {
        Stage::Recover => vec![EventKind::Adopted],
        Stage::Run if next.config.placement.syncing().next().is_none() => {
            vec![EventKind::Recovered, EventKind::Rereplicated]
        }
        _ => vec![EventKind::Recovered],
    }
}

/// The next state once the waiting joiners are made members (only while the cluster
/// runs); `None` if there are none or the cluster is reconfiguring.
pub fn admit(state: &ClusterState, joining: &[(NodeId, u64)]) -> Option<Change> {
    if state.stage != Stage::Run {
        return None;
    }
    let mut next = state.config.clone();
    let mut joined = 0u64;
    for (n, inc) in waiting(state, joining) {
        if state.config.placement.is_member(n) || joined & (1 << n) != 0 {
            // Its old incarnation is removed first ([`gone`]); a node listed twice
            // joins once.
            continue;
        }
        match next.with_member(n, inc) {
            Ok(c) => next = c,
            Err(e) => return Some(fail(e)),
        }
        joined |= 1 << n;
    }
    if joined == 0 {
        return None;
    }
    next.epoch = state.config.epoch + 1;
    Some(publish(
        state,
        next,
        vec![EventKind::Reconfigured { removed: 0, joined }],
    ))
}

/// The one change due now, in the order a manager applies them: removals first (a
/// failure during a reconfiguration starts the next one), then the next stage, then
/// joins. `alive`, `acked`: bit i = node i's lease holds, node i acknowledged the
/// current stage (of the current epoch, as the member's incarnation).
pub fn next_change(
    state: &ClusterState,
    alive: u64,
    acked: u64,
    joining: &[(NodeId, u64)],
) -> Option<Change> {
    let g = gone(state, alive, joining);
    if g != 0 {
        return Some(remove(state, g));
    }
    if let Some(next) = after_acks(state, acked) {
        let events = stage_events(&next);
        return Some(Change::Publish {
            state: next,
            events,
        });
    }
    admit(state, joining)
}

/// Whether the suspicions of `reporters` (bit i = node i) revoke `node`'s lease: a
/// majority of the other members must suspect it. Reporters that are not members, and
/// the node itself, do not count.
pub fn revokes(state: &ClusterState, node: NodeId, reporters: u64) -> bool {
    let members = state.config.placement.member_mask();
    if node >= 64 || members & (1 << node) == 0 {
        return false;
    }
    let others = members & !(1 << node);
    (reporters & others).count_ones() * 2 > others.count_ones()
}

/// Marks `node`'s copy of partition `p` synced in `state` (a new revision); returns
/// whether it was syncing. Nothing changes for a partition out of range.
pub fn mark_synced(state: &mut ClusterState, node: NodeId, p: u32) -> bool {
    if p >= state.config.placement.partitions() || !state.config.placement.mark_synced(p, node) {
        return false;
    }
    state.revision += 1;
    true
}

fn publish(state: &ClusterState, config: crate::Configuration, events: Vec<EventKind>) -> Change {
    Change::Publish {
        state: ClusterState {
            config,
            stage: Stage::Adopt,
            revision: state.revision + 1,
        },
        events,
    }
}

fn fail(e: PlacementError) -> Change {
    Change::Fail { why: e.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Configuration;

    fn running(nodes: u16, r: u16) -> ClusterState {
        ClusterState {
            config: Configuration::initial(nodes, r).unwrap(),
            stage: Stage::Run,
            revision: 1,
        }
    }

    #[test]
    fn removals_come_before_stages_and_joins() {
        let s = running(3, 3);
        assert_eq!(next_change(&s, 0b111, 0, &[]), None);
        let Some(Change::Publish { state, events }) = next_change(&s, 0b011, 0, &[(1, 2)]) else {
            panic!("node 2 is gone and node 1 restarted");
        };
        assert_eq!(
            (state.config.epoch, state.stage, state.revision),
            (2, Stage::Adopt, 2)
        );
        assert_eq!(state.config.placement.member_mask(), 0b001);
        assert_eq!(events[0], EventKind::LeaseExpired { nodes: 0b110 });
        // Stages move only once every member acknowledged.
        assert_eq!(next_change(&state, 0b001, 0, &[]), None);
        assert!(next_change(&state, 0b001, 0b001, &[]).is_some());
        assert_eq!(after_acks(&state, 0), None);
        let rec = after_acks(&state, 0b001).unwrap();
        assert_eq!((rec.stage, rec.revision), (Stage::Recover, 3));
        let run = after_acks(&rec, 0b001).unwrap();
        assert_eq!(run.stage, Stage::Run);
        // Joins wait for the run, and a stale incarnation never joins.
        assert_eq!(admit(&state, &[(2, 2)]), None);
        assert_eq!(admit(&run, &[(2, 1)]), None);
        let Some(Change::Publish { state: j, .. }) = admit(&run, &[(2, 2), (2, 2)]) else {
            panic!("node 2 joins");
        };
        assert_eq!((j.config.epoch, j.config.incarnations[2]), (3, 2));
    }

    #[test]
    fn a_majority_of_the_others_revokes() {
        let s = running(5, 3);
        assert!(!revokes(&s, 4, 0b0011));
        assert!(revokes(&s, 4, 0b0111));
        // The node's own report and non-members' do not count.
        assert!(!revokes(&s, 4, 0b1_0011));
        assert!(!revokes(&s, 63, u64::MAX));
        assert!(!revokes(&s, 200, u64::MAX));
    }

    #[test]
    fn losing_every_copy_is_a_failure() {
        let s = running(3, 1);
        assert!(matches!(
            next_change(&s, 0b001, 0, &[]),
            Some(Change::Fail { .. })
        ));
    }
}
