//! Where every node's tables are: the [`TableDesc`] (region id, access key, layout) of
//! each (node, table), learned at start-up as RDMA systems exchange rkeys out of band;
//! and where every node's log rings are: its [`LogRegionDesc`] (the region that
//! coordinators WRITE their commit records into, DrTM+H §5.4).
//! In one process the nodes' catalogs are filled directly; across processes the
//! launcher gathers each node's descriptors and hands every node the whole set, and
//! nodes started without a launcher ask each other for theirs
//! (`ambidex_txn::catalog_exchange`).
//!
//! A descriptor is a claim by another process, so it is checked before it is kept (its
//! layout fits its region, it names the node it is filed under). What cannot be checked
//! here, a key or region id that is wrong or stale (the owner restarted), is caught by
//! the target's NIC model: the access completes with an error (`BadKey`,
//! `UnknownRegion`, `OutOfBounds`) and touches nothing, so a stale catalog yields an
//! error and an abort, never a wrong read.

use crate::layout::{LayoutError, TableDesc};
use ambidex_transport::{NodeId, Perms, RegionDesc};
use serde::{Deserialize, Serialize};

/// Largest table id a catalog files (the transaction layer's limit too).
pub const MAX_TABLE_ID: u32 = 1024;

/// Why a descriptor was not filed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    /// The descriptor's node is outside the cluster.
    #[error("table descriptor of node {node} in a cluster of {nodes}")]
    UnknownNode { node: NodeId, nodes: u16 },
    /// The table id is above [`MAX_TABLE_ID`].
    #[error("table id {0} above the limit {MAX_TABLE_ID}")]
    TableIdTooLarge(u32),
    /// The layout does not fit the region, or is malformed.
    #[error("node {node} table {table}: bad descriptor: {why}")]
    BadLayout {
        node: NodeId,
        table: u32,
        /// What the layout check found.
        #[source]
        why: LayoutError,
    },
    /// The region does not allow what the protocol needs (READ, WRITE and atomics).
    #[error("node {node} table {table}: region not registered for READ, WRITE and atomics")]
    MissingPerms { node: NodeId, table: u32 },
    /// A different descriptor is already filed for this (node, table).
    #[error("node {node} table {table}: a different descriptor is already known")]
    Conflict { node: NodeId, table: u32 },
    /// A log region descriptor whose rings do not fit its region, are misaligned, or
    /// whose region does not allow READ and WRITE.
    #[error("node {node}: bad log region descriptor: {why}")]
    BadLogRegion {
        node: NodeId,
        /// What [`LogRegionDesc::validate`] found.
        #[source]
        why: LogRegionError,
    },
    /// A different log region is already filed for this node.
    #[error("node {node}: a different log region descriptor is already known")]
    LogConflict { node: NodeId },
}

/// Why a [`LogRegionDesc`] is not a usable log region ([`LogRegionDesc::validate`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LogRegionError {
    /// The region does not allow READ (the start-up check) and WRITE (the records).
    #[error("region not registered for READ and WRITE")]
    MissingPerms,
    /// The first ring is not [`LOG_RING_ALIGN`]-aligned or starts inside the 32-byte
    /// superblock.
    #[error("first ring at {base} (misaligned or inside the superblock)")]
    BadBase {
        /// Offset of the first ring.
        base: u64,
    },
    /// The ring size is not a multiple of [`LOG_RING_ALIGN`] or is below
    /// [`LOG_RING_MIN_BYTES`].
    #[error(
        "ring of {ring_bytes} bytes (a multiple of {LOG_RING_ALIGN}, at least {LOG_RING_MIN_BYTES})"
    )]
    BadRingSize {
        /// Bytes per ring.
        ring_bytes: u64,
    },
    /// The rings run past the end of the region (or their extent overflows).
    #[error(
        "{rings} rings of {ring_bytes} bytes from {base} overrun a region of {region_len} bytes"
    )]
    Overrun {
        /// Number of rings.
        rings: u32,
        /// Bytes per ring.
        ring_bytes: u64,
        /// Offset of the first ring.
        base: u64,
        /// Bytes of the region.
        region_len: u64,
    },
}

/// Where a node's log rings are: one ring of `ring_bytes` per coordinator (node,
/// thread) that logs to this node, the i-th at `base + i * ring_bytes` of `region`.
/// Which coordinator owns ring i is the transaction layer's business (it knows the
/// placement); the catalog checks only that the rings fit the region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LogRegionDesc {
    pub region: RegionDesc,
    /// Offset of the first ring (the bytes before it hold the region's superblock).
    pub base: u64,
    pub ring_bytes: u64,
    pub rings: u32,
}

/// Rings and records are 16-byte aligned (so a padding marker always fits the end of a
/// ring), and a ring smaller than this holds no useful record.
pub const LOG_RING_ALIGN: u64 = 16;
pub const LOG_RING_MIN_BYTES: u64 = 256;

impl LogRegionDesc {
    /// Checks that the rings fit the region and are aligned, and that the region
    /// allows READ (the start-up check) and WRITE (the records).
    pub fn validate(&self) -> Result<(), LogRegionError> {
        if !self.region.perms.contains(Perms::READ | Perms::WRITE) {
            return Err(LogRegionError::MissingPerms);
        }
        if !self.base.is_multiple_of(LOG_RING_ALIGN) || self.base < 32 {
            return Err(LogRegionError::BadBase { base: self.base });
        }
        if self.rings > 0
            && (!self.ring_bytes.is_multiple_of(LOG_RING_ALIGN)
                || self.ring_bytes < LOG_RING_MIN_BYTES)
        {
            return Err(LogRegionError::BadRingSize {
                ring_bytes: self.ring_bytes,
            });
        }
        let end = (self.rings as u64)
            .checked_mul(self.ring_bytes)
            .and_then(|b| b.checked_add(self.base));
        match end {
            Some(e) if e <= self.region.len => Ok(()),
            _ => Err(LogRegionError::Overrun {
                rings: self.rings,
                ring_bytes: self.ring_bytes,
                base: self.base,
                region_len: self.region.len,
            }),
        }
    }

    /// Offset of ring `i` in the region, if the region has it.
    pub fn ring_offset(&self, i: u32) -> Option<u64> {
        (i < self.rings).then(|| self.base + i as u64 * self.ring_bytes)
    }
}

/// The tables and log regions of every node of one cluster, by (node, table id).
/// Deserialized catalogs (from another process) are rebuilt through [`Catalog::insert`]
/// and [`Catalog::insert_log`], so every descriptor is checked and the lists are in
/// order whatever the bytes said.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "CatalogWire")]
pub struct Catalog {
    nodes: u16,
    /// `tables[node]`: that node's descriptors, sorted by table id.
    tables: Vec<Vec<TableDesc>>,
    /// `logs[node]`: that node's log region, once filed.
    logs: Vec<Option<LogRegionDesc>>,
}

/// A catalog as it travels: the same fields, not yet checked. `logs` may be absent (a
/// catalog of tables only); whoever needs the log regions checks they are there.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CatalogWire {
    nodes: u16,
    tables: Vec<Vec<TableDesc>>,
    #[serde(default)]
    logs: Vec<Option<LogRegionDesc>>,
}

impl TryFrom<CatalogWire> for Catalog {
    type Error = CatalogError;

    fn try_from(w: CatalogWire) -> Result<Catalog, CatalogError> {
        let mut c = Catalog::new(w.nodes);
        for (node, list) in w.tables.into_iter().enumerate() {
            for d in list {
                if d.region.node as usize != node {
                    return Err(CatalogError::UnknownNode {
                        node: d.region.node,
                        nodes: w.nodes,
                    });
                }
                c.insert(d)?;
            }
        }
        for (node, log) in w.logs.into_iter().enumerate() {
            let Some(d) = log else { continue };
            if d.region.node as usize != node {
                return Err(CatalogError::UnknownNode {
                    node: d.region.node,
                    nodes: w.nodes,
                });
            }
            c.insert_log(d)?;
        }
        Ok(c)
    }
}

impl Catalog {
    /// An empty catalog of a cluster of `nodes` nodes.
    pub fn new(nodes: u16) -> Catalog {
        Catalog {
            nodes,
            tables: vec![Vec::new(); nodes as usize],
            logs: vec![None; nodes as usize],
        }
    }

    pub fn nodes(&self) -> u16 {
        self.nodes
    }

    /// Checks `desc` and files it under its node. Filing the same descriptor twice is
    /// harmless; a different one for the same (node, table) is a [`CatalogError::Conflict`]
    /// (a restarted owner's descriptors replace its old ones: [`Catalog::replace_node`]).
    pub fn insert(&mut self, desc: TableDesc) -> Result<(), CatalogError> {
        let (node, table) = (desc.region.node, desc.table_id);
        if node >= self.nodes {
            return Err(CatalogError::UnknownNode {
                node,
                nodes: self.nodes,
            });
        }
        if table > MAX_TABLE_ID {
            return Err(CatalogError::TableIdTooLarge(table));
        }
        desc.layout
            .validate(desc.region.len)
            .map_err(|why| CatalogError::BadLayout { node, table, why })?;
        if !desc.region.perms.contains(Perms::ALL) {
            return Err(CatalogError::MissingPerms { node, table });
        }
        let list = &mut self.tables[node as usize];
        match list.binary_search_by_key(&table, |d| d.table_id) {
            Ok(i) if list[i] == desc => Ok(()),
            Ok(_) => Err(CatalogError::Conflict { node, table }),
            Err(i) => {
                list.insert(i, desc);
                Ok(())
            }
        }
    }

    /// Files every descriptor of `descs` (all or nothing is not needed: a failure
    /// stops start-up).
    pub fn extend(
        &mut self,
        descs: impl IntoIterator<Item = TableDesc>,
    ) -> Result<(), CatalogError> {
        descs.into_iter().try_for_each(|d| self.insert(d))
    }

    /// The descriptor of `table` on `node`, if known.
    pub fn get(&self, node: NodeId, table: u32) -> Option<&TableDesc> {
        let list = self.tables.get(node as usize)?;
        list.binary_search_by_key(&table, |d| d.table_id)
            .ok()
            .map(|i| &list[i])
    }

    /// Every descriptor of `node`.
    pub fn of_node(&self, node: NodeId) -> &[TableDesc] {
        self.tables.get(node as usize).map_or(&[], |v| v.as_slice())
    }

    /// Every descriptor, node by node.
    pub fn iter(&self) -> impl Iterator<Item = &TableDesc> {
        self.tables.iter().flatten()
    }

    /// Checks `desc` and files it as its node's log region. Filing the same one twice is
    /// harmless; a different one is a [`CatalogError::LogConflict`].
    pub fn insert_log(&mut self, desc: LogRegionDesc) -> Result<(), CatalogError> {
        let node = desc.region.node;
        if node >= self.nodes {
            return Err(CatalogError::UnknownNode {
                node,
                nodes: self.nodes,
            });
        }
        desc.validate()
            .map_err(|why| CatalogError::BadLogRegion { node, why })?;
        match &mut self.logs[node as usize] {
            Some(d) if *d == desc => Ok(()),
            Some(_) => Err(CatalogError::LogConflict { node }),
            slot => {
                *slot = Some(desc);
                Ok(())
            }
        }
    }

    /// `node` restarted with new regions: its table descriptors become `tables` and its
    /// log region `log`, each checked as [`Catalog::insert`] does. On an error the
    /// catalog is left as it was.
    pub fn replace_node(
        &mut self,
        node: NodeId,
        tables: impl IntoIterator<Item = TableDesc>,
        log: Option<LogRegionDesc>,
    ) -> Result<(), CatalogError> {
        if node >= self.nodes {
            return Err(CatalogError::UnknownNode {
                node,
                nodes: self.nodes,
            });
        }
        let mut next = self.clone();
        next.tables[node as usize].clear();
        next.logs[node as usize] = None;
        for d in tables {
            if d.region.node != node {
                return Err(CatalogError::UnknownNode {
                    node: d.region.node,
                    nodes: self.nodes,
                });
            }
            next.insert(d)?;
        }
        if let Some(d) = log {
            if d.region.node != node {
                return Err(CatalogError::UnknownNode {
                    node: d.region.node,
                    nodes: self.nodes,
                });
            }
            next.insert_log(d)?;
        }
        *self = next;
        Ok(())
    }

    /// The log region of `node`, if filed.
    pub fn log_region(&self, node: NodeId) -> Option<&LogRegionDesc> {
        self.logs.get(node as usize)?.as_ref()
    }
}
