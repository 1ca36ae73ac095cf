//! The cluster's catalog, from the descriptors every node process sent with `ready`.

use ambidex_store::{Catalog, CatalogError as FilingError, LogRegionDesc, TableDesc};

/// A node's descriptors that cannot be filed into the catalog.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// Its `tables` are missing or malformed.
    #[error("node {node} sent no valid table descriptors: {source}")]
    Tables {
        /// The node.
        node: usize,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// Its `log_region` is missing or malformed.
    #[error("node {node} sent no valid log region descriptor: {source}")]
    LogRegion {
        /// The node.
        node: usize,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// It sent a descriptor of another node's table or log region.
    #[error("node {node} sent the descriptor of a {what} of node {of}")]
    OtherNode {
        /// The node.
        node: usize,
        /// "table" or "log region".
        what: &'static str,
        /// The node the descriptor is of.
        of: u16,
    },
    /// The catalog refused a descriptor.
    #[error("node {node}'s {what} descriptor refused: {source}")]
    Refused {
        /// The node.
        node: usize,
        /// "table" or "log region".
        what: &'static str,
        /// Why.
        #[source]
        source: FilingError,
    },
}

/// Files every node's `tables` and `log_region` (the descriptors of its `ready` event,
/// `readies` in node order from node `first`) into the catalog of a cluster of `nodes`;
/// a missing, malformed or refused descriptor is an error naming the node.
pub fn catalog_from_ready(
    readies: &[serde_json::Value],
    first: u16,
    nodes: u16,
) -> Result<Catalog, CatalogError> {
    let mut cat = Catalog::new(nodes);
    for (i, r) in readies.iter().enumerate() {
        let n = first as usize + i;
        let descs: Vec<TableDesc> =
            serde_json::from_value(r.get("tables").cloned().unwrap_or_default())
                .map_err(|source| CatalogError::Tables { node: n, source })?;
        for d in descs {
            if d.region.node as usize != n {
                return Err(CatalogError::OtherNode {
                    node: n,
                    what: "table",
                    of: d.region.node,
                });
            }
            cat.insert(d).map_err(|source| CatalogError::Refused {
                node: n,
                what: "table",
                source,
            })?;
        }
        let log: LogRegionDesc =
            serde_json::from_value(r.get("log_region").cloned().unwrap_or_default())
                .map_err(|source| CatalogError::LogRegion { node: n, source })?;
        if log.region.node as usize != n {
            return Err(CatalogError::OtherNode {
                node: n,
                what: "log region",
                of: log.region.node,
            });
        }
        cat.insert_log(log)
            .map_err(|source| CatalogError::Refused {
                node: n,
                what: "log region",
                source,
            })?;
    }
    Ok(cat)
}

#[cfg(test)]
mod tests {
    use super::catalog_from_ready;
    use ambidex_store::{Table, TableConfig};
    use ambidex_transport::local::LocalFabric;
    use ambidex_transport::ClusterConfig;
    use serde_json::{json, Value};

    /// The `ready` events of a 2-node cluster with one table and a log region per node.
    fn readies() -> Vec<Value> {
        let f = LocalFabric::new(ClusterConfig::new(2, 1)).unwrap();
        f.nodes()
            .iter()
            .map(|n| {
                let t = Table::create_registered(&**n, 7, &TableConfig::new(64, 16)).unwrap();
                let perms = ambidex_transport::Perms::READ | ambidex_transport::Perms::WRITE;
                let log = ambidex_store::LogRegionDesc {
                    region: n.register(64 + 1024, perms).unwrap().desc,
                    base: 64,
                    ring_bytes: 1024,
                    rings: 1,
                };
                json!({ "event": "ready", "node": n.node(), "tables": [t.desc()], "log_region": log })
            })
            .collect()
    }

    #[test]
    fn the_launcher_files_every_nodes_descriptors_and_names_a_bad_node() {
        let r = readies();
        let cat = catalog_from_ready(&r, 0, 2).unwrap();
        assert_eq!(cat.iter().count(), 2);
        assert_eq!(cat.get(1, 7).unwrap().region.node, 1);
        assert_eq!(cat.log_region(1).unwrap().region.node, 1);
        // No log region, or another node's.
        let mut bad = r.clone();
        bad[0].as_object_mut().unwrap().remove("log_region");
        let e = catalog_from_ready(&bad, 0, 2).unwrap_err().to_string();
        assert!(e.starts_with("node 0 sent no valid log region"), "{e}");
        let mut bad = r.clone();
        bad[1]["log_region"] = r[0]["log_region"].clone();
        let e = catalog_from_ready(&bad, 0, 2).unwrap_err().to_string();
        assert!(
            e.contains("node 1 sent the descriptor of a log region of node 0"),
            "{e}"
        );
        let mut bad = r.clone();
        bad[1]["log_region"]["ring_bytes"] = 4096.into();
        let e = catalog_from_ready(&bad, 0, 2).unwrap_err().to_string();
        assert!(e.contains("node 1's log region descriptor refused"), "{e}");
        // No descriptors at all.
        let mut bad = r.clone();
        bad[1].as_object_mut().unwrap().remove("tables");
        let e = catalog_from_ready(&bad, 0, 2).unwrap_err().to_string();
        assert!(e.starts_with("node 1 "), "{e}");
        // A descriptor of another node's table.
        let mut bad = r.clone();
        bad[1]["tables"] = r[0]["tables"].clone();
        let e = catalog_from_ready(&bad, 0, 2).unwrap_err().to_string();
        assert!(
            e.contains("node 1 sent the descriptor of a table of node 0"),
            "{e}"
        );
        // A layout that does not fit its region.
        let mut bad = r.clone();
        bad[0]["tables"][0]["region"]["len"] = 64.into();
        let e = catalog_from_ready(&bad, 0, 2).unwrap_err().to_string();
        assert!(e.contains("node 0's table descriptor refused"), "{e}");
        // Read-only regions are refused.
        let mut bad = r;
        bad[1]["tables"][0]["region"]["perms"] = json!(1);
        let e = catalog_from_ready(&bad, 0, 2).unwrap_err().to_string();
        assert!(e.contains("node 1"), "{e}");
    }
}
