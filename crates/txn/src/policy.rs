//! How each phase issues its work (DrTM+H §5, Table 4): per phase, two-sided RPC or a
//! one-sided verb, and whether commit completions are awaited. The four systems of
//! DrTM+H Table 4 are presets ([`Policy::preset`]); any other combination can be given
//! phase by phase.
//!
//! Keys whose primary is the coordinator's own node are always accessed in place,
//! whatever the policy: the choice is about remote keys.

use serde::{Deserialize, Serialize};

/// Execute: how read-set values and versions are fetched (DrTM+H §5.1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Execute {
    /// A READ RPC to the key's primary (FaSST): one round trip, the remote CPU works.
    #[default]
    Rpc,
    /// One-sided READs: the key's bucket (and its overflow chain), then the item; at
    /// least two round trips, no remote CPU (FaRM's execute without a location cache).
    #[serde(rename = "onesided")]
    OneSided,
    /// One-sided READs through the location cache: a hit is one item READ, a miss the
    /// bucket walk of [`Execute::OneSided`], which fills the cache (DrTM+R).
    Cached,
    /// The location cache decides: a hit is one item READ; a miss is a READ RPC that
    /// also returns the item's address, which refills the cache (DrTM+H §6.1).
    Hybrid,
}

/// Lock: how write-set keys are locked (DrTM+H §5.2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Lock {
    /// A LOCK RPC to the key's primary, which locks and reads under the lock. With
    /// [`Execute::Rpc`] it goes in the execute round trip (FaSST §5 step 1); with a
    /// one-sided execute the key is read at execute and the LOCK RPC, sent after,
    /// also checks that its version is still the one read (FaRM's lock at commit).
    #[default]
    Rpc,
    /// A one-sided CAS of the item's header (lock bit and owner), then a READ of the
    /// header posted behind it on the same queue, which shows whether the lock was
    /// taken at the version read at execute (DrTM+R, DrTM+H).
    Cas,
}

/// Validate: how read-only keys' versions are re-checked (DrTM+H §5.2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Validate {
    /// A VALIDATE RPC to the key's primary.
    #[default]
    Rpc,
    /// A one-sided READ of the item's header at the address learned at execute.
    Read,
}

/// Log: where the commit record goes and how (DrTM+H §5.4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Log {
    /// A LOG RPC to each of the coordinator's log replicas (FaSST); the backups then
    /// take the writes by COMMIT_BACKUP RPC in the commit.
    #[default]
    Rpc,
    /// One-sided WRITEs into this coordinator's ring at every backup of the keys
    /// written (FaRM §3.4, DrTM+H §5.4): the backups apply the record when it is
    /// truncated, so the commit has no backup step.
    Write,
}

/// Commit: how the written keys' primaries get their new values (DrTM+H §5.3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Commit {
    /// COMMIT_PRIMARY RPCs (after COMMIT_BACKUP RPCs with `Log::Rpc`).
    #[default]
    Rpc,
    /// At each primary one-sided WRITEs of the value followed on the same queue by the
    /// header's release (after COMMIT_BACKUP RPCs with `Log::Rpc`).
    Write,
}

/// Acknowledgements of commit messages (DrTM+H §3.2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PassiveAck {
    /// The transaction returns once every commit message is acknowledged (FaSST).
    #[default]
    Off,
    /// The transaction returns once its log is complete; its commit messages are sent
    /// and their acknowledgements checked off its critical path.
    On,
}

/// The choice of every phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    pub execute: Execute,
    pub lock: Lock,
    pub validate: Validate,
    pub log: Log,
    pub commit: Commit,
    pub passive_ack: PassiveAck,
}

/// Why a policy cannot be had.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("unknown policy preset {0:?} (known: fasst, farm, drtm-r, drtm-h)")]
    Unknown(String),
}

/// The DrTM+H Table 4 presets (the names [`Policy::preset`] accepts).
pub const PRESETS: &[&str] = &["fasst", "farm", "drtm-r", "drtm-h"];

impl Policy {
    /// FaSST: every phase by RPC.
    pub const fn fasst() -> Policy {
        Policy {
            execute: Execute::Rpc,
            lock: Lock::Rpc,
            validate: Validate::Rpc,
            log: Log::Rpc,
            commit: Commit::Rpc,
            passive_ack: PassiveAck::Off,
        }
    }

    /// FaRM as DrTM+H Table 4 reads it: one-sided execute (no location cache), locks by
    /// RPC and read-set validation by READ, the log by WRITEs, commit by RPC.
    pub const fn farm() -> Policy {
        Policy {
            execute: Execute::OneSided,
            lock: Lock::Rpc,
            validate: Validate::Read,
            log: Log::Write,
            commit: Commit::Rpc,
            passive_ack: PassiveAck::Off,
        }
    }

    /// DrTM+R: everything one-sided (execute through the location cache, CAS locks,
    /// READ validation, WRITE log and commit); its HTM for local transactions is not
    /// modelled (DrTM+H §6.3 disables it too).
    pub const fn drtm_r() -> Policy {
        Policy {
            execute: Execute::Cached,
            lock: Lock::Cas,
            validate: Validate::Read,
            log: Log::Write,
            commit: Commit::Write,
            passive_ack: PassiveAck::Off,
        }
    }

    /// DrTM+H: hybrid execute, CAS locks and READ validation (the CPU/NIC atomicity
    /// issue of §5.2 does not arise on ambidex's backends), WRITE log, and, since locks
    /// are CAS, one-sided commit (§6.1), with passive ACK.
    pub const fn drtm_h() -> Policy {
        Policy {
            execute: Execute::Hybrid,
            lock: Lock::Cas,
            validate: Validate::Read,
            log: Log::Write,
            commit: Commit::Write,
            passive_ack: PassiveAck::On,
        }
    }

    /// A DrTM+H Table 4 preset by name.
    pub fn preset(name: &str) -> Result<Policy, PolicyError> {
        match name {
            "fasst" => Ok(Policy::fasst()),
            "farm" => Ok(Policy::farm()),
            "drtm-r" => Ok(Policy::drtm_r()),
            "drtm-h" => Ok(Policy::drtm_h()),
            other => Err(PolicyError::Unknown(other.to_string())),
        }
    }

    /// The preset this policy equals, if any.
    pub fn preset_name(&self) -> Option<&'static str> {
        PRESETS
            .iter()
            .copied()
            .find(|p| Policy::preset(p).as_ref() == Ok(self))
    }

    /// Whether execute must learn items' addresses and header versions (for a CAS
    /// lock, a header READ, a one-sided commit or the location cache).
    pub fn needs_locations(&self) -> bool {
        self.execute != Execute::Rpc
            || self.lock == Lock::Cas
            || self.validate == Validate::Read
            || self.commit == Commit::Write
    }

    /// Whether every phase is by RPC (FaSST): no node reaches another's regions, so no
    /// catalog of descriptors is needed.
    pub fn is_rpc_only(&self) -> bool {
        self.execute == Execute::Rpc
            && self.lock == Lock::Rpc
            && self.validate == Validate::Rpc
            && self.log == Log::Rpc
            && self.commit == Commit::Rpc
    }

    /// Whether the location cache is read and filled.
    pub fn uses_location_cache(&self) -> bool {
        matches!(self.execute, Execute::Cached | Execute::Hybrid)
    }

    /// Whether write-set keys are locked in the execute round trip (FaSST's folded
    /// lock) rather than in a lock phase after execute.
    pub fn lock_at_execute(&self) -> bool {
        self.execute == Execute::Rpc && self.lock == Lock::Rpc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_and_serde() {
        assert_eq!(Policy::preset("fasst"), Ok(Policy::fasst()));
        assert_eq!(Policy::default(), Policy::fasst());
        for p in PRESETS {
            let pol = Policy::preset(p).unwrap();
            assert_eq!(pol.preset_name(), Some(*p));
            let j = serde_json::to_string(&pol).unwrap();
            assert_eq!(serde_json::from_str::<Policy>(&j).unwrap(), pol);
        }
        assert!(matches!(
            Policy::preset("nope"),
            Err(PolicyError::Unknown(_))
        ));
        let j = serde_json::to_string(&Policy::drtm_h()).unwrap();
        assert!(j.contains("\"execute\":\"hybrid\""), "{j}");
        let one_sided = j.replacen("\"hybrid\"", "\"onesided\"", 1);
        let p: Policy = serde_json::from_str(&one_sided).unwrap();
        assert_eq!(p.execute, Execute::OneSided);
        assert_eq!(p.preset_name(), None);
        assert!(serde_json::from_str::<Policy>(&j.replacen("\"hybrid\"", "\"magic\"", 1)).is_err());
        assert!(Policy::fasst().lock_at_execute() && !Policy::fasst().needs_locations());
        assert!(Policy::fasst().is_rpc_only());
        for p in ["farm", "drtm-r", "drtm-h"] {
            assert!(!Policy::preset(p).unwrap().is_rpc_only(), "{p}");
        }
        assert!(!Policy::farm().lock_at_execute() && Policy::farm().needs_locations());
    }
}
