//! Where a key lives: its primary is chosen by a hash of (table, key) over the nodes and
//! its backups are the next R−1 nodes of the configuration (FaSST §5, FaRM).

use ambidex_transport::NodeId;

/// Partitioning and replication of every table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub nodes: u16,
    /// Copies of every key (primary + backups), 1 ≤ R ≤ nodes.
    pub replication: u16,
}

impl Placement {
    pub fn new(nodes: u16, replication: u16) -> Result<Placement, String> {
        if nodes == 0 {
            return Err("a cluster needs at least one node".into());
        }
        if replication == 0 || replication > nodes {
            return Err(format!(
                "replication factor {replication} must be between 1 and the number of nodes ({nodes})"
            ));
        }
        Ok(Placement { nodes, replication })
    }

    /// The primary of `key` in `table`.
    #[inline]
    pub fn primary(&self, table: u32, key: u64) -> NodeId {
        (mix(table, key) % self.nodes as u64) as NodeId
    }

    /// The i-th copy (0 = primary) of `key`.
    #[inline]
    pub fn replica(&self, table: u32, key: u64, i: u16) -> NodeId {
        ((self.primary(table, key) as u32 + i as u32) % self.nodes as u32) as NodeId
    }

    /// The backups of `key` (R−1 nodes after the primary).
    pub fn backups(&self, table: u32, key: u64) -> impl Iterator<Item = NodeId> + '_ {
        (1..self.replication).map(move |i| self.replica(table, key, i))
    }

    /// True if `node` stores a copy (primary or backup) of `key`.
    pub fn stores(&self, node: NodeId, table: u32, key: u64) -> bool {
        let p = self.primary(table, key) as u32;
        let d = (node as u32 + self.nodes as u32 - p) % self.nodes as u32;
        d < self.replication as u32
    }

    /// The log replicas of a coordinator: itself and the next R−1 nodes.
    pub fn log_replicas(&self, coordinator: NodeId) -> impl Iterator<Item = NodeId> + '_ {
        (0..self.replication)
            .map(move |i| ((coordinator as u32 + i as u32) % self.nodes as u32) as NodeId)
    }
}

/// A 64-bit mix of (table, key) so that tables are partitioned independently and
/// sequential keys spread over nodes.
#[inline]
fn mix(table: u32, key: u64) -> u64 {
    let mut x = key ^ (table as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_are_distinct_and_cover_r_nodes() {
        for nodes in 1..6u16 {
            for r in 1..=nodes {
                let p = Placement::new(nodes, r).unwrap();
                for key in 0..500u64 {
                    let mut owners: Vec<NodeId> = (0..r).map(|i| p.replica(3, key, i)).collect();
                    assert_eq!(owners[0], p.primary(3, key));
                    for n in 0..nodes {
                        assert_eq!(p.stores(n, 3, key), owners.contains(&n));
                    }
                    owners.sort();
                    owners.dedup();
                    assert_eq!(owners.len(), r as usize);
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
    fn bad_replication_is_an_error() {
        assert!(Placement::new(3, 0).is_err());
        assert!(Placement::new(3, 4).is_err());
        assert!(Placement::new(0, 1).is_err());
    }
}
