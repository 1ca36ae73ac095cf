//! Where a key lives: a key hashes to one of a fixed number of *partitions*, and each
//! partition has a replica list, primary first (FaRM §3 maps regions to replica sets
//! the same way). The lists change only through a new [`crate::Configuration`]: a
//! failed node's partitions get a backup promoted and a new backup added
//! ([`Placement::without`]), a node that joins becomes a backup of partitions short of
//! copies ([`Placement::with_member`]).
//!
//! The initial lists are those of hashing over the nodes: with `P = nodes × 64`
//! partitions, partition `p` has replicas `p, p+1, … (mod nodes)`, so `key → partition →
//! primary` equals `hash mod nodes` and the copies are the next R−1 nodes (FaSST §5).
//!
//! A replica added to a partition is *syncing* until the partition's keys have been
//! copied to it: it receives every new write, but is never promoted and never counts as
//! a copy that survives a failure.

use ambidex_transport::NodeId;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Nodes a cluster can have: lock words name at most 64 nodes
/// (`ambidex_store::LockOwner::MAX_NODES`), and member sets are 64-bit masks.
pub const MAX_NODES: u16 = 64;

/// Partitions per node at cluster creation: enough to spread a failed node's
/// partitions over the survivors evenly.
pub const PARTITIONS_PER_NODE: u32 = 64;

/// The largest replication factor (replica lists are at most this long).
pub const MAX_REPLICATION: u16 = 8;

/// Why a placement cannot be built or changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error("a cluster needs between 1 and {MAX_NODES} nodes, not {0}")]
    Nodes(u16),
    #[error("replication factor {replication} must be between 1 and the number of nodes ({nodes}) and at most {MAX_REPLICATION}")]
    Replication { replication: u16, nodes: u16 },
    #[error("node {0} is not a node of this cluster")]
    UnknownNode(NodeId),
    #[error("partition {partition} lost every up-to-date copy (its replicas {replicas:?} failed)")]
    PartitionLost {
        partition: u32,
        replicas: Vec<NodeId>,
    },
    #[error("no member is left")]
    NoMembers,
    #[error("node {0} is a member already")]
    AlreadyMember(NodeId),
    #[error("malformed placement: {0}")]
    Malformed(String),
}

/// The partitioning and replica lists of every table. Cheap to clone (shared lists).
#[derive(Clone, PartialEq, Eq)]
pub struct Placement {
    nodes: u16,
    replication: u16,
    partitions: u32,
    /// Live members, bit i = node i.
    members: u64,
    /// `partitions × replication` entries: replica i of partition p at `p·R + i`,
    /// primary first; the first `len[p]` are present.
    replicas: Arc<[NodeId]>,
    len: Arc<[u8]>,
    /// Per partition, bit i: replica i is syncing.
    syncing: Arc<[u8]>,
}

impl std::fmt::Debug for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Placement")
            .field("nodes", &self.nodes)
            .field("replication", &self.replication)
            .field("partitions", &self.partitions)
            .field("members", &format_args!("{:#x}", self.members))
            .finish_non_exhaustive()
    }
}

impl Placement {
    /// The initial placement of a cluster of `nodes` nodes (ids `0..nodes`, all members)
    /// keeping `replication` copies of every key.
    pub fn new(nodes: u16, replication: u16) -> Result<Placement, PlacementError> {
        if nodes == 0 || nodes > MAX_NODES {
            return Err(PlacementError::Nodes(nodes));
        }
        if replication == 0 || replication > nodes || replication > MAX_REPLICATION {
            return Err(PlacementError::Replication { replication, nodes });
        }
        let partitions = nodes as u32 * PARTITIONS_PER_NODE;
        let r = replication as u32;
        let replicas: Vec<NodeId> = (0..partitions * r)
            .map(|e| ((e / r + e % r) % nodes as u32) as NodeId)
            .collect();
        Ok(Placement {
            nodes,
            replication,
            partitions,
            members: mask_below(nodes),
            replicas: replicas.into(),
            len: vec![replication as u8; partitions as usize].into(),
            syncing: vec![0u8; partitions as usize].into(),
        })
    }

    /// Node ids of the cluster: `0..nodes` (members or not).
    #[inline]
    pub fn nodes(&self) -> u16 {
        self.nodes
    }

    /// Copies every key should have (primary + backups).
    #[inline]
    pub fn replication(&self) -> u16 {
        self.replication
    }

    /// Number of partitions (fixed for the life of the cluster).
    #[inline]
    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    /// Whether `node` is a live member.
    #[inline]
    pub fn is_member(&self, node: NodeId) -> bool {
        node < self.nodes && self.members & (1 << node) != 0
    }

    /// The live members, in id order.
    pub fn members(&self) -> impl Iterator<Item = NodeId> + '_ {
        (0..self.nodes).filter(|&n| self.is_member(n))
    }

    /// The member mask (bit i = node i).
    pub fn member_mask(&self) -> u64 {
        self.members
    }

    /// The partition of `key` in `table`.
    #[inline]
    pub fn partition(&self, table: u32, key: u64) -> u32 {
        (mix(table, key) % self.partitions as u64) as u32
    }

    /// The replicas of partition `p`, primary first (syncing ones included).
    #[inline]
    pub fn replicas_of(&self, p: u32) -> &[NodeId] {
        let r = self.replication as usize;
        let base = p as usize * r;
        &self.replicas[base..base + self.len[p as usize] as usize]
    }

    /// Which replicas of partition `p` are syncing (bit i = replica i).
    #[inline]
    pub fn syncing_of(&self, p: u32) -> u8 {
        self.syncing[p as usize]
    }

    /// The up-to-date replicas of partition `p` (not syncing), primary first.
    pub fn up_to_date_of(&self, p: u32) -> impl Iterator<Item = NodeId> + '_ {
        let mask = self.syncing[p as usize];
        self.replicas_of(p)
            .iter()
            .enumerate()
            .filter(move |(i, _)| mask & (1 << i) == 0)
            .map(|(_, &n)| n)
    }

    /// The replicas of `key`, primary first.
    #[inline]
    pub fn replicas(&self, table: u32, key: u64) -> &[NodeId] {
        self.replicas_of(self.partition(table, key))
    }

    /// The primary of `key` in `table`.
    #[inline]
    pub fn primary(&self, table: u32, key: u64) -> NodeId {
        let p = self.partition(table, key) as usize;
        self.replicas[p * self.replication as usize]
    }

    /// The backups of `key` (syncing ones included: they take every write).
    pub fn backups(&self, table: u32, key: u64) -> impl Iterator<Item = NodeId> + '_ {
        self.replicas(table, key).iter().skip(1).copied()
    }

    /// True if `node` stores a copy (primary or backup) of `key`.
    #[inline]
    pub fn stores(&self, node: NodeId, table: u32, key: u64) -> bool {
        self.replicas(table, key).contains(&node)
    }

    /// The log replicas of a coordinator (`Log::Rpc`): itself and the next R−1 members
    /// in id order, cyclically.
    pub fn log_replicas(&self, coordinator: NodeId) -> impl Iterator<Item = NodeId> + '_ {
        let n = self.nodes as u32;
        (0..n)
            .map(move |i| ((coordinator as u32 + i) % n) as NodeId)
            .filter(move |&m| m == coordinator || self.is_member(m))
            .take(self.replication as usize)
    }

    /// (partition, replica index) of every syncing replica.
    pub fn syncing(&self) -> impl Iterator<Item = (u32, usize)> + '_ {
        (0..self.partitions).flat_map(move |p| {
            let mask = self.syncing[p as usize];
            (0..self.len[p as usize] as usize)
                .filter(move |i| mask & (1 << i) != 0)
                .map(move |i| (p, i))
        })
    }

    /// The placement once the nodes of `gone` (bit i = node i) have failed: they stop
    /// being members; in each partition they held, the first up-to-date survivor is the
    /// primary, and members that do not hold the partition are added as syncing backups
    /// (the least loaded first) until it has R replicas again or no member is left to
    /// add. An error if a partition kept no up-to-date copy.
    pub fn without(&self, gone: u64) -> Result<Placement, PlacementError> {
        let members = self.members & !gone;
        if members == 0 {
            return Err(PlacementError::NoMembers);
        }
        let mut next = self.edit();
        next.members = members;
        for p in 0..self.partitions {
            let old: Vec<(NodeId, bool)> = next.list(p);
            let kept: Vec<(NodeId, bool)> = old
                .iter()
                .copied()
                .filter(|&(n, _)| gone & (1 << n) == 0)
                .collect();
            if kept.len() == old.len() {
                continue;
            }
            // The primary must hold every committed write: the first up-to-date copy.
            let Some(first) = kept.iter().position(|&(_, syncing)| !syncing) else {
                return Err(PlacementError::PartitionLost {
                    partition: p,
                    replicas: old.iter().map(|&(n, _)| n).collect(),
                });
            };
            let mut list = kept.clone();
            let primary = list.remove(first);
            list.insert(0, primary);
            next.set_list(p, &list);
        }
        next.fill_up();
        Ok(next.finish())
    }

    /// The placement once `node` (re)joins as a new member: it becomes a syncing
    /// backup of every partition short of R replicas.
    pub fn with_member(&self, node: NodeId) -> Result<Placement, PlacementError> {
        if node >= self.nodes {
            return Err(PlacementError::UnknownNode(node));
        }
        // A member is listed with its copies: adding it again would drop them.
        if self.is_member(node) {
            return Err(PlacementError::AlreadyMember(node));
        }
        let mut next = self.edit();
        next.members |= 1 << node;
        next.fill_up();
        Ok(next.finish())
    }

    /// Marks `node`'s copy of partition `p` as up to date. Returns whether it was
    /// syncing.
    pub fn mark_synced(&mut self, p: u32, node: NodeId) -> bool {
        let Some(i) = self.replicas_of(p).iter().position(|&n| n == node) else {
            return false;
        };
        let was = self.syncing[p as usize] & (1 << i) != 0;
        if was {
            // In place unless another placement shares the masks (then copied once).
            Arc::make_mut(&mut self.syncing)[p as usize] &= !(1 << i);
        }
        was
    }

    fn edit(&self) -> Edit {
        Edit {
            r: self.replication as usize,
            nodes: self.nodes,
            partitions: self.partitions,
            members: self.members,
            replicas: self.replicas.to_vec(),
            len: self.len.to_vec(),
            syncing: self.syncing.to_vec(),
        }
    }
}

/// A placement being changed.
struct Edit {
    r: usize,
    nodes: u16,
    partitions: u32,
    members: u64,
    replicas: Vec<NodeId>,
    len: Vec<u8>,
    syncing: Vec<u8>,
}

impl Edit {
    fn list(&self, p: u32) -> Vec<(NodeId, bool)> {
        let base = p as usize * self.r;
        (0..self.len[p as usize] as usize)
            .map(|i| {
                (
                    self.replicas[base + i],
                    self.syncing[p as usize] & (1 << i) != 0,
                )
            })
            .collect()
    }

    fn set_list(&mut self, p: u32, list: &[(NodeId, bool)]) {
        let base = p as usize * self.r;
        let mut mask = 0u8;
        for (i, &(n, s)) in list.iter().enumerate() {
            self.replicas[base + i] = n;
            mask |= (s as u8) << i;
        }
        for i in list.len()..self.r {
            self.replicas[base + i] = NodeId::MAX;
        }
        self.len[p as usize] = list.len() as u8;
        self.syncing[p as usize] = mask;
    }

    /// Adds syncing backups to partitions short of R replicas: for each, the member
    /// not holding it with the fewest replicas (ties: the lowest id after the primary,
    /// cyclically, so the choice is deterministic and spread).
    fn fill_up(&mut self) {
        let mut load = vec![0u32; self.nodes as usize];
        for p in 0..self.partitions {
            for (n, _) in self.list(p) {
                load[n as usize] += 1;
            }
        }
        for p in 0..self.partitions {
            let mut list = self.list(p);
            if list.len() >= self.r {
                continue;
            }
            while list.len() < self.r {
                let start = list.first().map_or(0, |&(n, _)| n as u32 + 1);
                let pick = (0..self.nodes as u32)
                    .map(|i| ((start + i) % self.nodes as u32) as NodeId)
                    .filter(|&n| self.members & (1 << n) != 0)
                    .filter(|&n| list.iter().all(|&(m, _)| m != n))
                    .min_by_key(|&n| load[n as usize]);
                let Some(n) = pick else { break };
                load[n as usize] += 1;
                // A partition with no replica left would have been refused already.
                list.push((n, true));
            }
            self.set_list(p, &list);
        }
    }

    fn finish(self) -> Placement {
        Placement {
            nodes: self.nodes,
            replication: self.r as u16,
            partitions: self.partitions,
            members: self.members,
            replicas: self.replicas.into(),
            len: self.len.into(),
            syncing: self.syncing.into(),
        }
    }
}

fn mask_below(n: u16) -> u64 {
    if n >= 64 {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

/// A 64-bit mix of (table, key) so that tables are partitioned independently and
/// sequential keys spread over partitions.
#[inline]
fn mix(table: u32, key: u64) -> u64 {
    let mut x = key ^ (table as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// The serialized form: checked when read back (it comes from a manager or a file).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlacementRepr {
    nodes: u16,
    replication: u16,
    partitions: u32,
    members: u64,
    /// Per partition: its replicas, primary first.
    replicas: Vec<Vec<NodeId>>,
    /// Per partition: syncing replicas (bit i = replica i).
    syncing: Vec<u8>,
}

impl Serialize for Placement {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        PlacementRepr {
            nodes: self.nodes,
            replication: self.replication,
            partitions: self.partitions,
            members: self.members,
            replicas: (0..self.partitions)
                .map(|p| self.replicas_of(p).to_vec())
                .collect(),
            syncing: self.syncing.to_vec(),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Placement {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Placement, D::Error> {
        let r = PlacementRepr::deserialize(d)?;
        Placement::try_from(r).map_err(serde::de::Error::custom)
    }
}

impl TryFrom<PlacementRepr> for Placement {
    type Error = PlacementError;

    fn try_from(r: PlacementRepr) -> Result<Placement, PlacementError> {
        let bad = |s: String| Err(PlacementError::Malformed(s));
        let base = Placement::new(r.nodes, r.replication)?;
        if r.partitions != base.partitions {
            return bad(format!(
                "{} partitions for {} nodes (want {})",
                r.partitions, r.nodes, base.partitions
            ));
        }
        if r.members & !mask_below(r.nodes) != 0 || r.members == 0 {
            return bad(format!(
                "member mask {:#x} for {} nodes",
                r.members, r.nodes
            ));
        }
        if r.replicas.len() != r.partitions as usize || r.syncing.len() != r.partitions as usize {
            return bad("one replica list and one syncing mask per partition".into());
        }
        let mut e = base.edit();
        e.members = r.members;
        for (p, (list, &sync)) in r.replicas.iter().zip(&r.syncing).enumerate() {
            if list.is_empty() || list.len() > r.replication as usize {
                return bad(format!("partition {p} has {} replicas", list.len()));
            }
            // In u16: a list of 8 would shift a u8 by its width.
            if (sync as u16) >> list.len() != 0 || sync & 1 != 0 {
                return bad(format!("partition {p}: syncing mask {sync:#x}"));
            }
            for (i, &n) in list.iter().enumerate() {
                if n >= r.nodes || list[..i].contains(&n) {
                    return bad(format!("partition {p}: replica {n} unknown or repeated"));
                }
            }
            // What every change keeps: replicas are members, and a partition has R of
            // them whenever R members exist.
            let members = r.members.count_ones() as usize;
            if list.iter().any(|&n| r.members & (1 << n) == 0)
                || list.len() != members.min(r.replication as usize)
            {
                return bad(format!(
                    "partition {p}: replicas {list:?} are not {} members",
                    members.min(r.replication as usize)
                ));
            }
            let with: Vec<(NodeId, bool)> = list
                .iter()
                .enumerate()
                .map(|(i, &n)| (n, sync & (1 << i) != 0))
                .collect();
            e.set_list(p as u32, &with);
        }
        Ok(e.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initial_replicas_are_hash_mod_nodes_and_the_next_ones() {
        for nodes in 1..7u16 {
            for r in 1..=nodes {
                let p = Placement::new(nodes, r).unwrap();
                for key in 0..500u64 {
                    let owners = p.replicas(3, key);
                    assert_eq!(owners.len(), r as usize);
                    let h = (mix(3, key) % nodes as u64) as NodeId;
                    assert_eq!(owners[0], h);
                    for (i, &o) in owners.iter().enumerate() {
                        assert_eq!(o, ((h as usize + i) % nodes as usize) as NodeId);
                    }
                    for n in 0..nodes {
                        assert_eq!(p.stores(n, 3, key), owners.contains(&n));
                    }
                }
            }
        }
    }

    #[test]
    fn keys_spread_over_nodes() {
        let p = Placement::new(3, 3).unwrap();
        let mut count = [0u32; 3];
        for key in 0..30_000u64 {
            count[p.primary(1, key) as usize] += 1;
        }
        assert!(
            count.iter().all(|&c| (9_000..11_000).contains(&c)),
            "{count:?}"
        );
    }

    #[test]
    fn bad_shapes_are_errors() {
        assert!(Placement::new(3, 0).is_err());
        assert!(Placement::new(3, 4).is_err());
        assert!(Placement::new(0, 1).is_err());
        assert!(Placement::new(65, 1).is_err());
    }

    #[test]
    fn a_failure_promotes_the_next_copy_and_adds_a_syncing_backup() {
        let p = Placement::new(5, 3).unwrap();
        let q = p.without(1 << 2).unwrap();
        assert!(!q.is_member(2));
        for part in 0..p.partitions() {
            let (old, new) = (p.replicas_of(part), q.replicas_of(part));
            assert!(!new.contains(&2));
            assert_eq!(new.len(), 3, "partition {part}: {new:?}");
            if old[0] == 2 {
                assert_eq!(new[0], old[1], "the first backup is promoted");
            } else {
                assert_eq!(new[0], old[0], "primaries of other partitions stay");
            }
            let added = new.iter().filter(|n| !old.contains(n)).count();
            let syncing = q.syncing_of(part).count_ones() as usize;
            assert_eq!(added, syncing);
            assert_eq!(added, old.contains(&2) as usize);
        }
    }

    #[test]
    fn three_nodes_lose_one_copy_and_get_it_back_when_it_rejoins() {
        let p = Placement::new(3, 3).unwrap();
        let q = p.without(1 << 1).unwrap();
        assert!((0..q.partitions()).all(|x| q.replicas_of(x).len() == 2));
        let back = q.with_member(1).unwrap();
        for x in 0..back.partitions() {
            let l = back.replicas_of(x);
            assert_eq!(l.len(), 3);
            assert_eq!(l[2], 1, "the rejoined node is the new last backup");
            assert_eq!(back.syncing_of(x), 0b100);
        }
        let mut synced = back.clone();
        for x in 0..back.partitions() {
            assert!(synced.mark_synced(x, 1));
        }
        assert_eq!(synced.syncing().count(), 0);
    }

    #[test]
    fn losing_every_up_to_date_copy_is_an_error() {
        let p = Placement::new(3, 2).unwrap();
        let q = p.without(1 << 0).unwrap();
        // Partitions once on {0, 1} now have 1 (up to date) and a syncing 2.
        let e = q.without(1 << 1).unwrap_err();
        assert!(matches!(e, PlacementError::PartitionLost { .. }), "{e}");
        assert!(matches!(p.without(0b111), Err(PlacementError::NoMembers)));
    }

    #[test]
    fn log_replicas_skip_non_members() {
        let p = Placement::new(4, 3).unwrap();
        assert_eq!(p.log_replicas(3).collect::<Vec<_>>(), vec![3, 0, 1]);
        let q = p.without(1 << 0).unwrap();
        assert_eq!(q.log_replicas(3).collect::<Vec<_>>(), vec![3, 1, 2]);
    }

    #[test]
    fn eight_copies_round_trip_with_a_syncing_one() {
        let p = Placement::new(9, 8).unwrap().without(1).unwrap();
        assert!(p.syncing().next().is_some());
        let s = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<Placement>(&s).unwrap(), p);
    }

    #[test]
    fn a_member_cannot_join_again() {
        let p = Placement::new(3, 1).unwrap();
        assert_eq!(p.with_member(0), Err(PlacementError::AlreadyMember(0)));
    }

    #[test]
    fn serde_round_trips_and_refuses_malformed_lists() {
        let p = Placement::new(5, 3).unwrap().without(1 << 4).unwrap();
        let s = serde_json::to_string(&p).unwrap();
        let back: Placement = serde_json::from_str(&s).unwrap();
        assert_eq!(back, p);
        let mut v: serde_json::Value = serde_json::from_str(&s).unwrap();
        v["replicas"][3] = serde_json::json!([1, 1]);
        assert!(serde_json::from_value::<Placement>(v.clone()).is_err());
        v["replicas"][3] = serde_json::json!([9]);
        assert!(serde_json::from_value::<Placement>(v.clone()).is_err());
        v["replicas"][3] = serde_json::json!([]);
        assert!(serde_json::from_value::<Placement>(v.clone()).is_err());
        // Node 4 failed: listing it, or keeping fewer copies than members allow, is not
        // a placement any change makes.
        v["replicas"][3] = serde_json::json!([0, 1, 4]);
        assert!(serde_json::from_value::<Placement>(v.clone()).is_err());
        v["replicas"][3] = serde_json::json!([0, 1]);
        assert!(serde_json::from_value::<Placement>(v).is_err());
    }
}
