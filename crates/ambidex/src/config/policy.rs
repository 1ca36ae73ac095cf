//! The transaction policy of a run: `txn.mode` names a DrTM+H Table 4 preset, and the
//! optional per-phase keys of `[txn]` (`execute`, `lock`, `validate`, `log`, `commit`,
//! `passive_ack`) override the preset's choice phase by phase. The keys and the
//! command-line flags spell each choice as the policy enums' serde names
//! ([`PhaseChoice`]), so a file, a flag and a report all read the same.

use super::{ConfigError, TxnSection};
use ambidex_txn::policy::{Commit, Execute, Lock, Log, PassiveAck, Validate};
use ambidex_txn::Policy;

/// One phase's choice, as the `[txn]` key and its flag spell it.
pub trait PhaseChoice: Copy + Eq + Send + Sync + 'static {
    /// The configuration field (`txn.execute`).
    const FIELD: &'static str;
    /// The command-line flag (`--execute`).
    const FLAG: &'static str;
    /// Every choice, in the order the help lists them.
    const ALL: &'static [Self];
    /// Their names, in the same order.
    const NAMES: &'static [&'static str];
    /// The serde name of this choice.
    fn name(self) -> &'static str;
    /// The choice named `s`, if any.
    fn from_name(s: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|c| c.name() == s)
    }
    /// The choice named `s`, or the error naming the field and the allowed names.
    fn parse(s: &str) -> Result<Self, ConfigError> {
        Self::from_name(s).ok_or_else(|| ConfigError::UnknownChoice {
            field: Self::FIELD,
            flag: Self::FLAG,
            value: s.to_string(),
            allowed: Self::NAMES,
        })
    }
}

/// One list per enum gives `ALL`, `NAMES` and the (exhaustive) `name` match, so a
/// variant added to a policy enum fails to compile here until it is named.
macro_rules! phase_choice {
    ($ty:ident, $key:literal, $flag:literal: $($v:ident = $n:literal),+ $(,)?) => {
        impl PhaseChoice for $ty {
            const FIELD: &'static str = concat!("txn.", $key);
            const FLAG: &'static str = $flag;
            const ALL: &'static [$ty] = &[$($ty::$v),+];
            const NAMES: &'static [&'static str] = &[$($n),+];
            fn name(self) -> &'static str {
                match self {
                    $($ty::$v => $n),+
                }
            }
        }
    };
}

phase_choice!(Execute, "execute", "--execute":
    Rpc = "rpc", OneSided = "onesided", Cached = "cached", Hybrid = "hybrid");
phase_choice!(Lock, "lock", "--lock": Rpc = "rpc", Cas = "cas");
phase_choice!(Validate, "validate", "--validate": Rpc = "rpc", Read = "read");
phase_choice!(Log, "log", "--log": Rpc = "rpc", Write = "write");
phase_choice!(Commit, "commit", "--commit": Rpc = "rpc", Write = "write");
phase_choice!(PassiveAck, "passive_ack", "--passive-ack": On = "on", Off = "off");

/// A policy as people read it: its preset's name, or every phase's choice.
pub fn describe(p: &Policy) -> String {
    match p.preset_name() {
        Some(name) => name.to_string(),
        None => format!("no preset: {}", phases(p)),
    }
}

/// Every phase's choice, `execute onesided, lock rpc, ...`.
pub fn phases(p: &Policy) -> String {
    format!(
        "execute {}, lock {}, validate {}, log {}, commit {}, passive-ack {}",
        p.execute.name(),
        p.lock.name(),
        p.validate.name(),
        p.log.name(),
        p.commit.name(),
        p.passive_ack.name()
    )
}

/// Checks the per-phase keys of a file's `[txn]` table before serde reads them, so that
/// an unknown name is an error naming the field and the allowed names (serde's own
/// message names neither the section nor the key). Values of a wrong type are left to
/// serde.
pub(super) fn check_file(file: &serde_json::Value) -> Result<(), ConfigError> {
    fn one<T: PhaseChoice>(txn: &serde_json::Value) -> Result<(), ConfigError> {
        let key = &T::FIELD["txn.".len()..];
        match txn.get(key) {
            Some(serde_json::Value::String(s)) => T::parse(s).map(|_| ()),
            _ => Ok(()),
        }
    }
    let Some(txn) = file.get("txn") else {
        return Ok(());
    };
    one::<Execute>(txn)?;
    one::<Lock>(txn)?;
    one::<Validate>(txn)?;
    one::<Log>(txn)?;
    one::<Commit>(txn)?;
    one::<PassiveAck>(txn)
}

impl TxnSection {
    /// The preset `mode`, then each per-phase key given.
    pub(super) fn resolve_policy(&self) -> Result<Policy, ConfigError> {
        let mut p = Policy::preset(&self.mode).map_err(|_| ConfigError::UnknownMode {
            mode: self.mode.clone(),
        })?;
        override_with(&mut p.execute, self.execute);
        override_with(&mut p.lock, self.lock);
        override_with(&mut p.validate, self.validate);
        override_with(&mut p.log, self.log);
        override_with(&mut p.commit, self.commit);
        override_with(&mut p.passive_ack, self.passive_ack);
        Ok(p)
    }
}

fn override_with<T>(slot: &mut T, v: Option<T>) {
    if let Some(v) = v {
        *slot = v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names are the policy enums' serde names, both ways.
    fn names_are_serdes<T>()
    where
        T: PhaseChoice + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        assert_eq!(T::ALL.len(), T::NAMES.len());
        for (c, n) in T::ALL.iter().zip(T::NAMES) {
            assert_eq!(c.name(), *n);
            assert_eq!(serde_json::to_value(c).unwrap(), serde_json::json!(n));
            assert_eq!(
                serde_json::from_value::<T>(serde_json::json!(n)).unwrap(),
                *c
            );
            assert_eq!(T::from_name(n), Some(*c));
        }
        assert_eq!(T::from_name("nope"), None);
        assert!(T::FLAG.starts_with("--"));
    }

    #[test]
    fn choice_names_are_the_policy_enums_serde_names() {
        names_are_serdes::<Execute>();
        names_are_serdes::<Lock>();
        names_are_serdes::<Validate>();
        names_are_serdes::<Log>();
        names_are_serdes::<Commit>();
        names_are_serdes::<PassiveAck>();
    }

    #[test]
    fn a_policy_is_described_by_preset_or_by_phase() {
        assert_eq!(describe(&Policy::drtm_h()), "drtm-h");
        let mut p = Policy::fasst();
        p.passive_ack = PassiveAck::On;
        assert_eq!(
            describe(&p),
            "no preset: execute rpc, lock rpc, validate rpc, log rpc, commit rpc, passive-ack on"
        );
    }
}
