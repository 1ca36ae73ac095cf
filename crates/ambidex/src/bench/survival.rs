//! The failure part of a run's report: node processes that died or were killed, the
//! configuration manager's events, and how long the cluster took to notice a failure
//! and get over it ([`Recovery`]). Times are ms since the run's start (when the
//! launcher sent `start`).

use ambidex_cluster::membership::{Event, EventKind};
use serde::Serialize;

/// A node process that died during the run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NodeFailure {
    /// The node's id.
    pub node: u16,
    /// Its process id.
    pub pid: u32,
    /// "was killed by signal 9 (SIGKILL)", "exited with status 1", ...
    pub how: String,
    /// When the launcher saw its control output close.
    pub at_ms: f64,
}

/// A node process the launcher killed (`--kill NODE@SECONDS`), or that killed itself in
/// its commit phase when asked (`--kill NODE@commit:SECONDS`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Kill {
    /// The node's id.
    pub node: u16,
    /// Its process id.
    pub pid: u32,
    /// When it was killed, or killed itself (ms since the run's start).
    pub at_ms: f64,
    /// A commit-phase kill: how many coordinators of the dying thread were between
    /// their first commit-backup write and the end of commit-primary (0: none came
    /// within the node's give-up time, it died anyway); absent for a plain kill.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_commit: Option<u32>,
}

/// A node process started again during the run (`--restart NODE@SECONDS`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Restart {
    /// The node's id.
    pub node: u16,
    /// The process id of its new process.
    pub pid: u32,
    /// Its new incarnation (the first is 1).
    pub incarnation: u64,
    /// When the launcher started its new process (ms since the run's start).
    pub at_ms: f64,
    /// When a configuration that has it as a member again was published (ms since the
    /// run's start; `null` if never).
    pub member_ms: Option<f64>,
    /// When every copy was up to date again after it joined (the manager's
    /// `rereplicated` event; `null` if never).
    pub rereplicated_ms: Option<f64>,
    /// Transactions its new incarnation's workers committed (warmup included).
    pub committed: u64,
}

/// A `--restart NODE@SECONDS` not done: its node was alive at that time, and no
/// `--kill` of it came before (such a restart is for a node that died or was killed
/// from outside).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RestartNotDone {
    /// The node's id.
    pub node: u16,
    /// The restart's time (ms since the run's start).
    pub at_ms: f64,
    /// Why it was not done.
    pub why: String,
}

impl Restart {
    /// Fills in `member_ms` and `rereplicated_ms` from the manager's events.
    pub fn with_events(mut self, events: &[ManagerEvent]) -> Restart {
        let bit = 1u64 << self.node;
        self.member_ms = events
            .iter()
            .find(|e| {
                e.at_ms >= self.at_ms
                    && matches!(e.what, EventKind::Reconfigured { joined, .. } if joined & bit != 0)
            })
            .map(|e| e.at_ms);
        self.rereplicated_ms = self.member_ms.and_then(|m| {
            events
                .iter()
                .find(|e| e.at_ms >= m && e.what == EventKind::Rereplicated)
                .map(|e| e.at_ms)
        });
        self
    }
}

/// One of the manager's events.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ManagerEvent {
    /// When the manager recorded it (ms since the run's start).
    pub at_ms: f64,
    /// The manager's configuration epoch at the event.
    pub epoch: u32,
    /// What happened: a lease expired, a node was revoked, a configuration was
    /// published, adopted, recovered, every copy re-replicated, ...
    pub what: EventKind,
}

impl ManagerEvent {
    /// `e` with its manager time (ns) taken relative to `start_ns` (the same clock).
    pub fn new(e: &Event, start_ns: u64) -> ManagerEvent {
        ManagerEvent {
            at_ms: (e.at_ns as f64 - start_ns as f64) / 1e6,
            epoch: e.epoch,
            what: e.what.clone(),
        }
    }
}

/// The first failure's recovery, in ms after the failure (the first kill, or the
/// first death seen when nothing was killed). A stage not reached is `null`.
///
/// Not built yet: `rereplicated_ms` (every copy up to date again).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Recovery {
    /// The failure, ms since the run's start.
    pub failed_at_ms: f64,
    /// A lease expired or a node was revoked.
    pub detected_ms: Option<f64>,
    /// The next configuration was published.
    pub reconfigured_ms: Option<f64>,
    /// Every member recovered: transactions may run again.
    pub recovered_ms: Option<f64>,
    /// The first commit of a transaction that touched a key whose primary was on a
    /// node the run lost (noted by each node thread once its epoch changed; the
    /// earliest over the surviving nodes, on the system clock the manager's events use:
    /// exact on one host, as good as the hosts' clock sync across hosts).
    pub first_commit_ms: Option<f64>,
}

/// The recovery from the first failure (`None` without one). `first_lost_commit_ms`:
/// [`BenchReport::first_lost_commit_ns`](crate::bench::BenchReport::first_lost_commit_ns),
/// in ms since the run's start.
pub fn recovery(
    kills: &[Kill],
    failures: &[NodeFailure],
    events: &[ManagerEvent],
    first_lost_commit_ms: Option<f64>,
) -> Option<Recovery> {
    let failed = kills
        .iter()
        .map(|k| k.at_ms)
        .reduce(f64::min)
        .or_else(|| failures.iter().map(|f| f.at_ms).reduce(f64::min))?;
    // The first event of a kind at or after the failure (events before it belong to
    // something else, e.g. a slow node's lease).
    let first = |after: f64, is: &dyn Fn(&EventKind) -> bool| {
        events
            .iter()
            .find(|e| e.at_ms >= after && is(&e.what))
            .map(|e| e.at_ms)
    };
    let detected = first(failed, &|w| {
        matches!(
            w,
            EventKind::LeaseExpired { .. } | EventKind::Revoked { .. }
        )
    });
    let reconfigured =
        detected.and_then(|d| first(d, &|w| matches!(w, EventKind::Reconfigured { .. })));
    let recovered = reconfigured.and_then(|r| first(r, &|w| matches!(w, EventKind::Recovered)));
    let since = |t: Option<f64>| t.map(|t| t - failed);
    Some(Recovery {
        failed_at_ms: failed,
        detected_ms: since(detected),
        reconfigured_ms: since(reconfigured),
        recovered_ms: since(recovered),
        first_commit_ms: since(first_lost_commit_ms),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_is_a_member_at_the_reconfiguration_that_joins_it() {
        let events = [
            ev(
                1050.0,
                EventKind::Reconfigured {
                    removed: 4,
                    joined: 0,
                },
            ),
            ev(1060.0, EventKind::Recovered),
            ev(1300.0, EventKind::Rereplicated),
            // Another node joining is not this one.
            ev(
                1500.0,
                EventKind::Reconfigured {
                    removed: 0,
                    joined: 2,
                },
            ),
            ev(
                1510.0,
                EventKind::Reconfigured {
                    removed: 0,
                    joined: 4,
                },
            ),
            ev(1700.0, EventKind::Rereplicated),
        ];
        let r = Restart {
            node: 2,
            pid: 7,
            incarnation: 2,
            at_ms: 1200.0,
            member_ms: None,
            rereplicated_ms: None,
            committed: 0,
        };
        let r2 = r.clone().with_events(&events);
        assert_eq!(
            (r2.member_ms, r2.rereplicated_ms),
            (Some(1510.0), Some(1700.0))
        );
        // Not joined (yet): both null.
        let r3 = r.with_events(&events[..4]);
        assert_eq!((r3.member_ms, r3.rereplicated_ms), (None, None));
    }

    fn ev(at_ms: f64, what: EventKind) -> ManagerEvent {
        ManagerEvent {
            at_ms,
            epoch: 2,
            what,
        }
    }

    #[test]
    fn recovery_times_follow_the_first_failure() {
        assert_eq!(recovery(&[], &[], &[], None), None);
        let kill = Kill {
            node: 2,
            pid: 9,
            at_ms: 1000.0,
            in_commit: None,
        };
        let events = [
            ev(500.0, EventKind::LeaseExpired { nodes: 2 }),
            ev(1060.0, EventKind::LeaseExpired { nodes: 4 }),
            ev(
                1061.0,
                EventKind::Reconfigured {
                    removed: 4,
                    joined: 0,
                },
            ),
            ev(1070.0, EventKind::Adopted),
            ev(1080.0, EventKind::Recovered),
        ];
        let r = recovery(std::slice::from_ref(&kill), &[], &events, Some(1095.5)).unwrap();
        assert_eq!(r.failed_at_ms, 1000.0);
        assert_eq!(r.detected_ms, Some(60.0));
        assert_eq!(r.reconfigured_ms, Some(61.0));
        assert_eq!(r.recovered_ms, Some(80.0));
        assert_eq!(r.first_commit_ms, Some(95.5));
        // Not recovered (yet): null; a death without a kill counts from the death.
        let f = NodeFailure {
            node: 1,
            pid: 8,
            how: "x".into(),
            at_ms: 1050.0,
        };
        let r = recovery(&[], &[f], &events[..3], None).unwrap();
        assert_eq!(
            (
                r.failed_at_ms,
                r.detected_ms,
                r.recovered_ms,
                r.first_commit_ms
            ),
            (1050.0, Some(10.0), None, None)
        );
    }
}
