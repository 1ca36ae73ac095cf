//! The failures a run of node processes is asked to cause (`--kill`, `--restart`), and
//! their checks against the run's configuration before anything starts.

use crate::Config;
use std::fmt;

/// Kill node `node` `seconds` after the run started (`--kill NODE@SECONDS`), or have it
/// kill itself then at its next moment in the commit phase (`NODE@commit:SECONDS`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KillSpec {
    /// The node.
    pub node: u16,
    /// Seconds after `start` was sent (warmup included).
    pub seconds: f64,
    /// The node kills itself in its commit phase (after `seconds`).
    pub in_commit: bool,
}

/// Start dead node `node` again `seconds` after the run started (`--restart
/// NODE@SECONDS`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RestartSpec {
    /// The node.
    pub node: u16,
    /// Seconds after `start` was sent.
    pub seconds: f64,
}

impl fmt::Display for KillSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let commit = if self.in_commit { "commit:" } else { "" };
        write!(f, "--kill {}@{commit}{}", self.node, self.seconds)
    }
}

impl fmt::Display for RestartSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "--restart {}@{}", self.node, self.seconds)
    }
}

/// A kill or restart the run cannot do.
#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    /// A commit-phase kill too late to find its moment within the run.
    #[error(
        "{kill}: a commit-phase kill must leave 1.2 s of the run (SECONDS <= warmup + \
         duration - 1.2 = {:.1})", run - 1.2
    )]
    CommitKillTooLate {
        /// The kill.
        kill: KillSpec,
        /// The run's warmup and duration, seconds.
        run: f64,
    },
    /// A kill of a node the cluster does not have.
    #[error("{kill}: the cluster has nodes 0..{nodes}")]
    KillNoSuchNode {
        /// The kill.
        kill: KillSpec,
        /// The cluster's nodes.
        nodes: u16,
    },
    /// A kill outside the run.
    #[error(
        "{kill}: the time must be after the start and before the run ends (0 < SECONDS < \
         warmup + duration = {run})"
    )]
    KillOutsideRun {
        /// The kill.
        kill: KillSpec,
        /// The run's warmup and duration, seconds.
        run: f64,
    },
    /// A restart in a cluster with no manager to rejoin through.
    #[error(
        "{0}: a restarted node rejoins through a configuration manager (--manager \
         embedded or etcd)"
    )]
    RestartWithoutManager(RestartSpec),
    /// A restart of a node the cluster does not have.
    #[error("{restart}: the cluster has nodes 0..{nodes}")]
    RestartNoSuchNode {
        /// The restart.
        restart: RestartSpec,
        /// The cluster's nodes.
        nodes: u16,
    },
    /// A restart outside the run.
    #[error(
        "{restart}: the time must be before the run ends (0 < SECONDS < warmup + \
         duration = {run})"
    )]
    RestartOutsideRun {
        /// The restart.
        restart: RestartSpec,
        /// The run's warmup and duration, seconds.
        run: f64,
    },
    /// The same restart twice.
    #[error("{0}: the same restart twice")]
    RestartTwice(RestartSpec),
    /// A node restarted again without a kill in between.
    #[error(
        "{restart}: node {} is restarted at {previous} s and again before being killed \
         again (--kill {}@SECONDS, {previous} < SECONDS < {})",
        restart.node, restart.node, restart.seconds
    )]
    RestartNotKilledAgain {
        /// The restart.
        restart: RestartSpec,
        /// When the node was restarted before.
        previous: f64,
    },
}

/// Refuses kills of nodes the run does not have, or outside the run (after the start,
/// before the end of the measured window).
pub fn check_kills(kills: &[KillSpec], cfg: &Config) -> Result<(), FaultError> {
    let run = cfg.run.warmup_s + cfg.run.duration_s;
    for &kill in kills {
        // A node that finds no moment in its commit phase dies at its give-up (1 s,
        // `ambidex::bench::lost`): still inside the run.
        if kill.in_commit && kill.seconds + 1.2 > run {
            return Err(FaultError::CommitKillTooLate { kill, run });
        }
        if kill.node >= cfg.cluster.nodes {
            return Err(FaultError::KillNoSuchNode {
                kill,
                nodes: cfg.cluster.nodes,
            });
        }
        if !(kill.seconds > 0.0 && kill.seconds < run) {
            return Err(FaultError::KillOutsideRun { kill, run });
        }
    }
    Ok(())
}

/// Refuses restarts outside the run, without a manager (the restarted node joins
/// through it), or of a node restarted before and not killed again since. Returns, per
/// restart, whether a `--kill` of its node comes before it (after the node's previous
/// restart, if any): such a restart waits for that death, any other one restarts the
/// node only if it is dead at its time (killed from outside, or it died).
pub fn check_restarts(
    restarts: &[RestartSpec],
    kills: &[KillSpec],
    cfg: &Config,
) -> Result<Vec<bool>, FaultError> {
    let run = cfg.run.warmup_s + cfg.run.duration_s;
    let mut after_kill = Vec::new();
    for &r in restarts {
        if cfg.cluster.manager_spec().is_none() {
            return Err(FaultError::RestartWithoutManager(r));
        }
        if r.node >= cfg.cluster.nodes {
            return Err(FaultError::RestartNoSuchNode {
                restart: r,
                nodes: cfg.cluster.nodes,
            });
        }
        if !(r.seconds > 0.0 && r.seconds < run) {
            return Err(FaultError::RestartOutsideRun { restart: r, run });
        }
        let same_node = restarts.iter().filter(|o| o.node == r.node);
        if same_node.clone().filter(|o| o.seconds == r.seconds).count() > 1 {
            return Err(FaultError::RestartTwice(r));
        }
        // The node's previous restart, if any.
        let previous = same_node
            .map(|o| o.seconds)
            .filter(|&t| t < r.seconds)
            .fold(None, |m: Option<f64>, t| Some(m.map_or(t, |m| m.max(t))));
        let killed_since = |from: f64| {
            kills
                .iter()
                .any(|k| k.node == r.node && k.seconds > from && k.seconds < r.seconds)
        };
        if let Some(previous) = previous {
            if !killed_since(previous) {
                return Err(FaultError::RestartNotKilledAgain {
                    restart: r,
                    previous,
                });
            }
        }
        after_kill.push(killed_since(previous.unwrap_or(f64::NEG_INFINITY)));
    }
    Ok(after_kill)
}
