//! Fault profiles: what the simulated network and scheduler do to a run, by name.
//!
//! Every run has a configuration manager and leases (10 ms of simulated time; see
//! [`LEASE`](super::LEASE)). The first profiles keep to faults the nodes ride out
//! without a reconfiguration: lost, duplicated, reordered and delayed datagrams and
//! one-sided operations, partitions that heal, and node pauses (a node not scheduled
//! for a while, as a long GC pause or a descheduled VM), all shorter than the RPC
//! layer's give-up time (`rpc.give_up_ms`, see [`defaults`](super::defaults)) and than
//! a lease.
//!
//! Three profiles make the cluster reconfigure:
//! - `crash` crashes one node per seed ([`ambidex_transport_sim::SimNet::crash`]) in a
//!   protocol phase chosen by the seed (execute, lock, validate, log, commit backups,
//!   commit primaries), or crashes a second node during the recovery from a first
//!   crash ("recovery"): the manager removes it when its lease runs out, the survivors
//!   adopt the new configuration, recover from the logs and run on. A crashed node
//!   stays down.
//! - `crash-restart` crashes as `crash` does, then restarts each crashed node (same id,
//!   a fresh empty database, threads and agent, a new incarnation): a quarter of the
//!   seeds 0.2 ms to half a lease after the crash, before the manager can have removed
//!   it (its join makes the manager remove the crashed incarnation), the others 1-4
//!   leases after the removal. It joins through the manager, is made a backup of the
//!   partitions short of copies and copied to by their primaries, and its threads run
//!   the workload again. The run goes on until every restarted node is a member again
//!   and every copy is up to date.
//! - `long-partition` cuts one node off for 2–3× the give-up time: the others suspect
//!   it, the manager revokes and removes it, it is fenced, and it stays out once the
//!   partition heals (it is no member any more).

use ambidex_transport_sim::SimFaults;
use serde::Serialize;

/// One named fault profile.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FaultProfile {
    /// Its name (`sim.faults`, `--faults`), one of [`PROFILES`].
    pub name: &'static str,
    /// The network's seeded faults.
    pub net: SimFaults,
    /// Mean simulated time between partitions (0: none); each isolates a random
    /// non-empty proper subset of the nodes for a duration in `partition_ns`.
    pub partition_every_ns: u64,
    /// A partition's duration (simulated ns), uniform in `[min, max]`.
    pub partition_ns: (u64, u64),
    /// Mean simulated time between node pauses (0: none), each lasting `pause_ns`.
    pub pause_every_ns: u64,
    /// A pause's duration (simulated ns), uniform in `[min, max]`.
    pub pause_ns: (u64, u64),
    /// Each node's clock is offset by up to this much (nodes' clocks are not synchronized).
    pub clock_skew_ns: u64,
    /// Crash one node per seed in a phase the seed chooses (see the module's docs).
    pub crash: bool,
    /// Restart each crashed node as a new incarnation that rejoins.
    pub restart: bool,
    /// Cut one node off for this many times the RPC give-up time (0: never).
    pub long_partition: (f64, f64),
}

/// The profile names `--faults` accepts, in help order.
pub const PROFILES: [&str; 10] = [
    "none",
    "lossy",
    "reorder",
    "partition",
    "pause",
    "onesided",
    "chaos",
    "crash",
    "crash-restart",
    "long-partition",
];

const US: u64 = 1_000;
const MS: u64 = 1_000_000;

impl FaultProfile {
    /// The profile called `name`, or an error listing the known ones.
    pub fn named(name: &str) -> Result<FaultProfile, super::SimConfigError> {
        let quiet = FaultProfile {
            name: "none",
            net: SimFaults::none(),
            partition_every_ns: 0,
            partition_ns: (0, 0),
            pause_every_ns: 0,
            pause_ns: (0, 0),
            clock_skew_ns: 0,
            crash: false,
            restart: false,
            long_partition: (0.0, 0.0),
        };
        // Light network faults for the profiles that reconfigure.
        let light = SimFaults {
            drop: 0.01,
            duplicate: 0.01,
            reorder: 0.05,
            reorder_window_ns: 50 * US,
            delay: 0.01,
            max_delay_ns: MS,
            onesided_loss: 0.01,
            onesided_duplicate: 0.01,
            ..SimFaults::none()
        };
        Ok(match name {
            "none" => quiet,
            "lossy" => FaultProfile {
                name: "lossy",
                net: SimFaults {
                    drop: 0.03,
                    duplicate: 0.02,
                    ..SimFaults::none()
                },
                ..quiet
            },
            // Delays beyond the retransmission timeout cause spurious retransmissions,
            // so duplicates of requests reach handlers after their original.
            "reorder" => FaultProfile {
                name: "reorder",
                net: SimFaults {
                    reorder: 0.2,
                    reorder_window_ns: 50 * US,
                    delay: 0.03,
                    max_delay_ns: 3 * MS,
                    ..SimFaults::none()
                },
                ..quiet
            },
            "partition" => FaultProfile {
                name: "partition",
                partition_every_ns: MS,
                partition_ns: (50 * US, 10 * MS),
                ..quiet
            },
            "pause" => FaultProfile {
                name: "pause",
                pause_every_ns: MS,
                pause_ns: (20 * US, 5 * MS),
                clock_skew_ns: 500 * MS,
                ..quiet
            },
            // The protocol uses no one-sided operations yet; this profile is for layers
            // that will (and exercises the network's RC model in the meantime).
            "onesided" => FaultProfile {
                name: "onesided",
                net: SimFaults {
                    onesided_loss: 0.05,
                    onesided_duplicate: 0.05,
                    onesided_delay: 0.05,
                    max_delay_ns: 2 * MS,
                    ..SimFaults::none()
                },
                ..quiet
            },
            "chaos" => FaultProfile {
                name: "chaos",
                net: SimFaults {
                    drop: 0.02,
                    duplicate: 0.02,
                    reorder: 0.1,
                    reorder_window_ns: 50 * US,
                    delay: 0.02,
                    max_delay_ns: 2 * MS,
                    onesided_loss: 0.02,
                    onesided_duplicate: 0.02,
                    onesided_delay: 0.02,
                    ..SimFaults::none()
                },
                partition_every_ns: MS,
                partition_ns: (50 * US, 5 * MS),
                pause_every_ns: MS,
                pause_ns: (20 * US, 3 * MS),
                clock_skew_ns: 500 * MS,
                ..quiet
            },
            "crash" => FaultProfile {
                name: "crash",
                net: light.clone(),
                pause_every_ns: 2 * MS,
                pause_ns: (20 * US, MS),
                clock_skew_ns: 500 * MS,
                crash: true,
                ..quiet
            },
            "crash-restart" => FaultProfile {
                name: "crash-restart",
                restart: true,
                ..FaultProfile::named("crash")?
            },
            "long-partition" => FaultProfile {
                name: "long-partition",
                net: light,
                clock_skew_ns: 500 * MS,
                long_partition: (2.0, 3.0),
                ..quiet
            },
            other => {
                return Err(super::SimConfigError::UnknownProfile {
                    name: other.to_string(),
                })
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_profile_is_valid() {
        for name in PROFILES {
            let p = FaultProfile::named(name).unwrap();
            assert_eq!(p.name, name);
            p.net.validate().unwrap();
            assert!(p.partition_ns.0 <= p.partition_ns.1 && p.pause_ns.0 <= p.pause_ns.1);
        }
        assert!(FaultProfile::named("earthquake").is_err());
    }
}
