//! Where every node's tables are: the [`TableDesc`] (region id, access key, layout) of
//! each (node, table), learned at start-up as RDMA systems exchange rkeys out of band.
//! In one process the nodes' catalogs are filled directly; across processes the
//! launcher gathers each node's descriptors and hands every node the whole set.
//!
//! A descriptor is a claim by another process, so it is checked before it is kept (its
//! layout fits its region, it names the node it is filed under). What cannot be checked
//! here, a key or region id that is wrong or stale (the owner restarted), is caught by
//! the target's NIC model: the access completes with an error (`BadKey`,
//! `UnknownRegion`, `OutOfBounds`) and touches nothing, so a stale catalog yields an
//! error and an abort, never a wrong read.

use crate::layout::TableDesc;
use ambidex_transport::{NodeId, Perms};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Largest table id a catalog files (the transaction layer's limit too).
pub const MAX_TABLE_ID: u32 = 1024;

/// Why a descriptor was not filed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CatalogError {
    /// The descriptor's node is outside the cluster.
    UnknownNode { node: NodeId, nodes: u16 },
    /// The table id is above [`MAX_TABLE_ID`].
    TableIdTooLarge(u32),
    /// The layout does not fit the region, or is malformed.
    BadLayout {
        node: NodeId,
        table: u32,
        why: String,
    },
    /// The region does not allow what the protocol needs (READ, WRITE and atomics).
    MissingPerms { node: NodeId, table: u32 },
    /// A different descriptor is already filed for this (node, table).
    Conflict { node: NodeId, table: u32 },
}

impl fmt::Display for CatalogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CatalogError::UnknownNode { node, nodes } => {
                write!(f, "table descriptor of node {node} in a cluster of {nodes}")
            }
            CatalogError::TableIdTooLarge(t) => {
                write!(f, "table id {t} above the limit {MAX_TABLE_ID}")
            }
            CatalogError::BadLayout { node, table, why } => {
                write!(f, "node {node} table {table}: bad descriptor: {why}")
            }
            CatalogError::MissingPerms { node, table } => write!(
                f,
                "node {node} table {table}: region not registered for READ, WRITE and atomics"
            ),
            CatalogError::Conflict { node, table } => write!(
                f,
                "node {node} table {table}: a different descriptor is already known"
            ),
        }
    }
}

impl std::error::Error for CatalogError {}

/// The tables of every node of one cluster, by (node, table id). Deserialized catalogs
/// (from another process) are rebuilt through [`Catalog::insert`], so every descriptor
/// is checked and the lists are in order whatever the bytes said.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "CatalogWire")]
pub struct Catalog {
    nodes: u16,
    /// `tables[node]`: that node's descriptors, sorted by table id.
    tables: Vec<Vec<TableDesc>>,
}

/// A catalog as it travels: the same fields, not yet checked.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CatalogWire {
    nodes: u16,
    tables: Vec<Vec<TableDesc>>,
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
        Ok(c)
    }
}

impl Catalog {
    /// An empty catalog of a cluster of `nodes` nodes.
    pub fn new(nodes: u16) -> Catalog {
        Catalog {
            nodes,
            tables: vec![Vec::new(); nodes as usize],
        }
    }

    pub fn nodes(&self) -> u16 {
        self.nodes
    }

    /// Checks `desc` and files it under its node. Filing the same descriptor twice is
    /// harmless; a different one for the same (node, table) is a [`CatalogError::Conflict`]
    /// (a restarted owner's tables come with a new catalog, not an update).
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
            .map_err(|e| CatalogError::BadLayout {
                node,
                table,
                why: e.to_string(),
            })?;
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
}
