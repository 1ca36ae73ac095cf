//! The parts of a run's report that say how its transactions used the NIC: the policy
//! every phase ran with ([`PolicyReport`]), the one-sided verbs posted
//! ([`OneSidedCounts`]) and the location cache's lookups. Shared by the benchmark's
//! report (in-process and combined from node processes) and the simulator's.

use crate::config::{describe_policy, PhaseChoice};
use ambidex_rpc::RpcStats;
use ambidex_txn::stats::LocationCacheStats;
use ambidex_txn::Policy;

/// The protocol's phases in order, as reports name them (`BenchReport::phase_means_us`).
pub use ambidex_txn::stats::PHASE_NAMES;
use serde::Serialize;

/// The policy a run used: every phase's choice (the serde form of `Policy`) and, when it
/// equals one, the DrTM+H Table 4 preset's name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PolicyReport {
    /// The preset the policy equals (`fasst`, `farm`, `drtm-r`, `drtm-h`); `None`
    /// (omitted from the JSON) for a policy that is no preset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preset: Option<&'static str>,
    /// Every phase's choice, flattened into the report's object (`"execute": "rpc"`, ...).
    #[serde(flatten)]
    pub policy: Policy,
}

impl From<Policy> for PolicyReport {
    fn from(policy: Policy) -> Self {
        PolicyReport {
            preset: policy.preset_name(),
            policy,
        }
    }
}

impl std::fmt::Display for PolicyReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&describe_policy(&self.policy))
    }
}

/// One-sided operations posted by every thread of every node, by verb, and those that
/// failed (summed `RpcStats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OneSidedCounts {
    /// READs.
    pub reads: u64,
    /// WRITEs.
    pub writes: u64,
    /// Compare-and-swaps.
    pub cas: u64,
    /// Fetch-and-adds.
    pub faa: u64,
    /// Operations that failed: error completions, signaled or not, and the operations
    /// of a refused post.
    pub failed: u64,
}

impl From<&RpcStats> for OneSidedCounts {
    fn from(s: &RpcStats) -> Self {
        OneSidedCounts {
            reads: s.onesided_reads,
            writes: s.onesided_writes,
            cas: s.onesided_cas,
            faa: s.onesided_faa,
            failed: s.onesided_failed,
        }
    }
}

/// The text summary's line for the policy.
pub fn policy_line(p: &PolicyReport) -> String {
    match p.preset {
        Some(name) => format!(
            "policy {name} ({})",
            crate::config::policy_phases(&p.policy)
        ),
        None => format!("policy {p}"),
    }
}

/// The text summary's line for the one-sided counts and the location cache. The hit
/// ratio counts stale entries as misses: each cost the lookup's READ and another fetch.
pub fn one_sided_line(o: &OneSidedCounts, c: &LocationCacheStats) -> String {
    let lookups = c.hits + c.misses + c.stale;
    let ratio = if lookups == 0 {
        "-".to_string()
    } else {
        format!("{:.1}%", c.hits as f64 * 100.0 / lookups as f64)
    };
    format!(
        "one-sided: {} reads, {} writes, {} CAS, {} FAA, {} failed; location cache: {} hits, \
         {} misses, {} stale (hit ratio {ratio})",
        o.reads, o.writes, o.cas, o.faa, o.failed, c.hits, c.misses, c.stale
    )
}

/// The flags that give `p` on a command line (for reproducing commands): none for
/// `fasst` (the default), `--mode P` for another preset, and every phase's flag for a
/// policy that is no preset (so the command does not depend on the preset it started
/// from).
pub fn policy_flags(p: &Policy) -> String {
    use ambidex_txn::policy::{Commit, Execute, Lock, Log, PassiveAck, Validate};
    match p.preset_name() {
        Some("fasst") => String::new(),
        Some(name) => format!(" --mode {name}"),
        None => format!(
            " {} {} {} {} {} {} {} {} {} {} {} {}",
            Execute::FLAG,
            p.execute.name(),
            Lock::FLAG,
            p.lock.name(),
            Validate::FLAG,
            p.validate.name(),
            Log::FLAG,
            p.log.name(),
            Commit::FLAG,
            p.commit.name(),
            PassiveAck::FLAG,
            p.passive_ack.name()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ambidex_txn::policy::{Execute, PassiveAck};

    #[test]
    fn the_policy_report_is_the_policy_plus_its_preset() {
        let v = serde_json::to_value(PolicyReport::from(Policy::farm())).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"preset": "farm", "execute": "onesided", "lock": "rpc",
                "validate": "read", "log": "write", "commit": "rpc", "passive_ack": "off"})
        );
        let mut p = Policy::drtm_h();
        p.passive_ack = PassiveAck::Off;
        let v = serde_json::to_value(PolicyReport::from(p)).unwrap();
        assert!(v.get("preset").is_none(), "{v}");
        assert_eq!(v["execute"], "hybrid");
        assert!(policy_line(&p.into()).contains("no preset"));
        assert!(policy_line(&Policy::fasst().into()).starts_with("policy fasst (execute rpc"));
    }

    #[test]
    fn policy_flags_reproduce_the_policy() {
        assert_eq!(policy_flags(&Policy::fasst()), "");
        assert_eq!(policy_flags(&Policy::drtm_r()), " --mode drtm-r");
        let mut p = Policy::fasst();
        p.execute = Execute::Cached;
        p.passive_ack = PassiveAck::On;
        assert_eq!(
            policy_flags(&p),
            " --execute cached --lock rpc --validate rpc --log rpc --commit rpc --passive-ack on"
        );
    }

    #[test]
    fn the_one_sided_line_names_counts_and_ratio() {
        let s = RpcStats {
            onesided_reads: 7,
            onesided_cas: 2,
            ..Default::default()
        };
        let c = LocationCacheStats {
            hits: 3,
            misses: 1,
            stale: 0,
        };
        let l = one_sided_line(&(&s).into(), &c);
        assert!(l.contains("7 reads") && l.contains("2 CAS"), "{l}");
        assert!(l.contains("hit ratio 75.0%"), "{l}");
        let l = one_sided_line(&OneSidedCounts::default(), &LocationCacheStats::default());
        assert!(l.contains("hit ratio -"), "{l}");
    }
}
