//! What the etcd manager keeps in etcd, under `/ambidex/<cluster>/`, and how a read of
//! it is checked. Everything read is untrusted (another program may write there): a
//! key or value that does not parse is a [`ManagerError::Protocol`], never a panic.
//!
//! | key | value | lifetime |
//! | --- | --- | --- |
//! | `state` | JSON [`Record`] | changed only by a transaction comparing its revision |
//! | `lease/<node>` | the incarnation (20 digits), `/revoked` once a majority suspected it | attached to the node's etcd lease; a revoked one to a lease nobody renews |
//! | `ack/<epoch>/<stage>/<node>` | the incarnation | deleted with every new state |
//! | `suspect/<node>/<reporter>` | empty | attached to a lease of [`SUSPICION_TTL_NS`]; deleted when `node` leaves or joins the members |
//! | `join/<node>` | the incarnation | ignored once that incarnation is the member |
//!
//! [`SUSPICION_TTL_NS`]: crate::membership::SUSPICION_TTL_NS

use crate::manager::ManagerError;
use crate::membership::decide;
use crate::membership::{ClusterState, Stage};
use ambidex_transport::NodeId;
use serde::{Deserialize, Serialize};

/// The value of the `state` key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    pub state: ClusterState,
    /// Why the cluster cannot go on, once it cannot (every call is refused then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}

impl Record {
    pub fn encode(&self) -> String {
        // A Record holds only maps, strings and numbers: serializing cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    fn decode(v: &[u8]) -> Result<Record, ManagerError> {
        let r: Record = serde_json::from_slice(v).map_err(|e| bad(format!("state: {e}")))?;
        r.state
            .config
            .check()
            .map_err(|e| bad(format!("state: {e}")))?;
        Ok(r)
    }
}

/// The names of one cluster's keys.
#[derive(Clone, Debug)]
pub struct Keys {
    root: String,
}

impl Keys {
    /// The keys of cluster `name` (not empty, no `/`: it is one path segment).
    pub fn new(name: &str) -> Result<Keys, ManagerError> {
        if name.is_empty() || name.contains('/') {
            return Err(ManagerError::Protocol(format!(
                "cluster name {name:?} must be one non-empty path segment"
            )));
        }
        Ok(Keys {
            root: format!("/ambidex/{name}/"),
        })
    }

    /// The prefix of every key of the cluster.
    pub fn root(&self) -> &str {
        &self.root
    }

    pub fn state(&self) -> String {
        format!("{}state", self.root)
    }

    pub fn lease(&self, node: NodeId) -> String {
        format!("{}lease/{node}", self.root)
    }

    pub fn acks(&self) -> String {
        format!("{}ack/", self.root)
    }

    pub fn ack(&self, epoch: u32, stage: Stage, node: NodeId) -> String {
        format!("{}ack/{epoch}/{}/{node}", self.root, stage_name(stage))
    }

    pub fn suspect(&self, node: NodeId, reporter: NodeId) -> String {
        format!("{}suspect/{node}/{reporter}", self.root)
    }

    /// The prefix of every suspicion of `node`.
    pub fn suspicions_of(&self, node: NodeId) -> String {
        format!("{}suspect/{node}/", self.root)
    }

    pub fn join(&self, node: NodeId) -> String {
        format!("{}join/{node}", self.root)
    }
}

fn stage_name(s: Stage) -> &'static str {
    match s {
        Stage::Adopt => "adopt",
        Stage::Recover => "recover",
        Stage::Run => "run",
    }
}

fn stage_named(s: &str) -> Option<Stage> {
    [Stage::Adopt, Stage::Recover, Stage::Run]
        .into_iter()
        .find(|&x| stage_name(x) == s)
}

/// The value of a `lease/<node>` key. Fixed width, so that etcd's byte-wise value
/// comparison orders incarnations (a connecting node never overwrites a newer one).
pub fn lease_value(incarnation: u64, revoked: bool) -> String {
    if revoked {
        format!("{incarnation:020}/revoked")
    } else {
        format!("{incarnation:020}")
    }
}

/// One key as read from etcd.
#[derive(Clone, Copy, Debug)]
pub struct Kv<'a> {
    pub key: &'a [u8],
    pub value: &'a [u8],
    pub mod_revision: i64,
    /// The etcd lease it is attached to (0: none).
    pub lease: i64,
}

/// A `lease/<node>` key as read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseKey {
    pub incarnation: u64,
    pub revoked: bool,
    pub lease: i64,
    pub mod_revision: i64,
}

/// Everything of one cluster read at one etcd revision.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub record: Record,
    /// The `state` key's modification revision: what a publication compares.
    pub state_mod_revision: i64,
    /// Per node id: its lease key, if present.
    pub leases: Vec<Option<LeaseKey>>,
    /// (epoch, stage, node, incarnation).
    pub acks: Vec<(u32, Stage, NodeId, u64)>,
    /// (suspected node, reporter).
    pub suspicions: Vec<(NodeId, NodeId)>,
    /// (node, incarnation).
    pub joining: Vec<(NodeId, u64)>,
}

fn bad(why: String) -> ManagerError {
    ManagerError::Protocol(why)
}

fn number<T: std::str::FromStr>(s: &str, what: &str) -> Result<T, ManagerError> {
    // `parse` alone takes a leading '+'; keys and values are written as plain digits.
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad(format!("{what}: {s:?} is not a number")));
    }
    s.parse()
        .map_err(|_| bad(format!("{what}: {s:?} is out of range")))
}

fn text<'a>(b: &'a [u8], what: &str) -> Result<&'a str, ManagerError> {
    std::str::from_utf8(b).map_err(|_| bad(format!("{what}: not UTF-8")))
}

impl Snapshot {
    /// Checks and sorts what a read of [`Keys::root`] returned.
    pub fn parse<'a>(
        keys: &Keys,
        kvs: impl IntoIterator<Item = Kv<'a>>,
    ) -> Result<Option<Snapshot>, ManagerError> {
        let mut state = None;
        let mut leases = Vec::new();
        let mut acks = Vec::new();
        let mut suspicions = Vec::new();
        let mut joining = Vec::new();
        for kv in kvs {
            let key = text(kv.key, "key")?;
            let Some(rest) = key.strip_prefix(keys.root()) else {
                return Err(bad(format!("key {key:?} is outside {}", keys.root())));
            };
            let parts: Vec<&str> = rest.split('/').collect();
            match parts[..] {
                ["state"] => state = Some((Record::decode(kv.value)?, kv.mod_revision)),
                ["lease", n] => {
                    let v = text(kv.value, key)?;
                    let (inc, revoked) = match v.strip_suffix("/revoked") {
                        Some(i) => (i, true),
                        None => (v, false),
                    };
                    let l = LeaseKey {
                        incarnation: number(inc, key)?,
                        revoked,
                        lease: kv.lease,
                        mod_revision: kv.mod_revision,
                    };
                    leases.push((number::<NodeId>(n, key)?, l));
                }
                ["ack", e, s, n] => {
                    let stage = stage_named(s).ok_or_else(|| bad(format!("{key}: stage")))?;
                    acks.push((
                        number(e, key)?,
                        stage,
                        number(n, key)?,
                        number(text(kv.value, key)?, key)?,
                    ));
                }
                ["suspect", n, r] => suspicions.push((number(n, key)?, number(r, key)?)),
                ["join", n] => joining.push((number(n, key)?, number(text(kv.value, key)?, key)?)),
                _ => return Err(bad(format!("unknown key {key:?}"))),
            }
        }
        let Some((record, state_mod_revision)) = state else {
            return Ok(None);
        };
        let nodes = record.state.config.incarnations.len();
        let known = |n: NodeId| -> Result<NodeId, ManagerError> {
            if (n as usize) < nodes {
                Ok(n)
            } else {
                Err(bad(format!("node {n} is not one of the {nodes} nodes")))
            }
        };
        let mut per_node = vec![None; nodes];
        for (n, l) in leases {
            per_node[known(n)? as usize] = Some(l);
        }
        for &(_, _, n, _) in &acks {
            known(n)?;
        }
        for &(n, r) in &suspicions {
            known(n)?;
            known(r)?;
        }
        for &(n, _) in &joining {
            known(n)?;
        }
        Ok(Some(Snapshot {
            record,
            state_mod_revision,
            leases: per_node,
            acks,
            suspicions,
            joining,
        }))
    }

    pub fn state(&self) -> &ClusterState {
        &self.record.state
    }

    /// Bit i: node i's lease holds for the member's incarnation.
    pub fn alive(&self) -> u64 {
        let inc = &self.state().config.incarnations;
        self.leases
            .iter()
            .enumerate()
            .filter(|(n, l)| matches!(l, Some(l) if l.incarnation == inc[*n]))
            .fold(0, |m, (n, _)| m | (1 << n))
    }

    /// The joiners whose lease holds (for their new incarnation): one that died while
    /// it waited is not made a member only to be removed again.
    pub fn live_joiners(&self) -> Vec<(NodeId, u64)> {
        self.joining
            .iter()
            .copied()
            .filter(|&(n, i)| {
                matches!(self.leases[n as usize], Some(l) if l.incarnation == i && !l.revoked)
            })
            .collect()
    }

    /// Bit i: node i (as the member's incarnation) acknowledged the current stage.
    pub fn acked(&self) -> u64 {
        let s = self.state();
        self.acks
            .iter()
            .filter(|&&(e, st, n, i)| {
                e == s.config.epoch && st == s.stage && decide::check_member(s, n, i).is_ok()
            })
            .fold(0, |m, &(_, _, n, _)| m | (1 << n))
    }

    /// Bit i: node i suspects `node`.
    pub fn reporters(&self, node: NodeId) -> u64 {
        self.suspicions
            .iter()
            .filter(|&&(n, _)| n == node)
            .fold(0, |m, &(_, r)| m | (1 << r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Configuration;

    fn kv<'a>(key: &'a str, value: &'a str) -> Kv<'a> {
        Kv {
            key: key.as_bytes(),
            value: value.as_bytes(),
            mod_revision: 7,
            lease: 9,
        }
    }

    fn record() -> String {
        Record {
            state: ClusterState {
                config: Configuration::initial(3, 3).unwrap(),
                stage: Stage::Adopt,
                revision: 1,
            },
            failed: None,
        }
        .encode()
    }

    #[test]
    fn a_read_is_sorted_by_key() {
        let k = Keys::new("c").unwrap();
        let rec = record();
        let l0 = lease_value(1, false);
        let l2 = lease_value(1, true);
        let s = Snapshot::parse(
            &k,
            [
                kv("/ambidex/c/state", &rec),
                kv(&k.lease(0), &l0),
                kv(&k.lease(2), &l2),
                kv(&k.ack(1, Stage::Adopt, 0), "1"),
                kv(&k.ack(1, Stage::Adopt, 1), "3"),
                kv(&k.suspect(2, 0), ""),
                kv(&k.join(1), "4"),
                kv(&k.join(2), "4"),
                kv(&k.lease(1), &lease_value(4, false)),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(s.alive(), 0b101, "node 1's key names its next incarnation");
        assert_eq!(
            s.live_joiners(),
            vec![(1, 4)],
            "node 2's joiner has no lease"
        );
        assert!(s.leases[2].unwrap().revoked);
        assert_eq!(s.acked(), 0b001, "node 1's ack names another incarnation");
        assert_eq!(s.reporters(2), 0b001);
        assert!(Snapshot::parse(&k, []).unwrap().is_none());
    }

    #[test]
    fn malformed_keys_and_values_are_protocol_errors() {
        let k = Keys::new("c").unwrap();
        let rec = record();
        let cases: &[(&str, &str)] = &[
            ("/ambidex/c/state", "{"),
            ("/ambidex/c/state", "{\"state\":1}"),
            ("/ambidex/c/lease/0", "x"),
            ("/ambidex/c/lease/0", "+1"),
            ("/ambidex/c/lease/9", "1"),
            ("/ambidex/c/lease/99999999", "1"),
            ("/ambidex/c/ack/1/later/0", "1"),
            ("/ambidex/c/ack/1/adopt", "1"),
            ("/ambidex/c/suspect/0/x", ""),
            ("/ambidex/c/join/0", ""),
            ("/ambidex/c/other", ""),
            ("/ambidex/d/state", ""),
        ];
        for &(key, value) in cases {
            let r = Snapshot::parse(&k, [kv("/ambidex/c/state", &rec), kv(key, value)]);
            assert!(
                matches!(r, Err(ManagerError::Protocol(_))),
                "{key} = {value:?}: {r:?}"
            );
        }
        let r = Snapshot::parse(
            &k,
            [Kv {
                key: b"/ambidex/c/\xff",
                ..kv("", "")
            }],
        );
        assert!(matches!(r, Err(ManagerError::Protocol(_))));
        assert!(Keys::new("a/b").is_err() && Keys::new("").is_err());
    }
}
