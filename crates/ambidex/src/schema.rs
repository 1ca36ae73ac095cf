//! Declaring tables: a [`Schema`] lists a cluster's tables before it starts (every node
//! creates every table in a region of its transport at start-up, sized for its share of
//! the rows); each declaration returns a typed [`Table`] handle that transactions use.

use crate::codec::{Key, Slot, Value};
use ambidex_txn::{Placement, TableSpec};
use std::marker::PhantomData;
use std::sync::Arc;

/// Largest value a table may hold, in bytes (its slot, prefix included, must fit the
/// store's items, which one-sided READs fetch whole).
pub const MAX_VALUE_LEN: usize = 16 * 1024;

/// Most tables a schema may declare.
pub const MAX_TABLES: usize = 1024;

/// A schema that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// Two tables have one name.
    #[error("table {0} is declared twice")]
    Duplicate(String),
    /// A table name is empty or longer than 64 bytes.
    #[error("table name {0:?} must be 1 to 64 bytes")]
    BadName(String),
    /// A variable-length value type was declared without a maximum length.
    #[error(
        "table {0}: its values have no fixed size: declare it with Schema::table_with_max_len"
    )]
    NeedsMaxLen(String),
    /// The maximum value length is 0 or larger than [`MAX_VALUE_LEN`].
    #[error(
        "table {table}: a maximum value length of {len} bytes (allowed: 1 to {MAX_VALUE_LEN})"
    )]
    BadMaxLen {
        /// The table.
        table: String,
        /// The length asked for.
        len: usize,
    },
    /// A table of no rows.
    #[error("table {0}: rows must be at least 1")]
    NoRows(String),
    /// More than [`MAX_TABLES`] tables.
    #[error("more than {MAX_TABLES} tables")]
    TooManyTables,
}

/// One declared table, untyped.
#[derive(Clone, Debug)]
pub(crate) struct TableDef {
    pub(crate) id: u32,
    pub(crate) name: Arc<str>,
    pub(crate) slot: Slot,
    /// Rows the application plans to store (primaries; copies are added when sizing).
    pub(crate) rows: u64,
}

/// The tables of a cluster, declared before it starts.
///
/// ```
/// use ambidex::Schema;
/// let mut schema = Schema::new();
/// let balances = schema.table::<u64, i64>("balances", 10_000)?;
/// let names = schema.table_with_max_len::<u64, String>("names", 10_000, 64)?;
/// # let _ = (balances, names);
/// # Ok::<(), ambidex::SchemaError>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct Schema {
    pub(crate) tables: Vec<TableDef>,
}

impl Schema {
    /// A schema without tables.
    pub fn new() -> Schema {
        Schema::default()
    }

    /// Declares table `name` of keys `K` and fixed-size values `V` (integers, `bool`,
    /// byte arrays, or a [`Value`] with a [`Value::SIZE`]), with room for `rows` rows.
    pub fn table<K: Key, V: Value>(
        &mut self,
        name: &str,
        rows: u64,
    ) -> Result<Table<K, V>, SchemaError> {
        match V::SIZE {
            Some(n) if n <= MAX_VALUE_LEN => self.add(name, rows, Slot::Fixed(n)),
            Some(n) => Err(SchemaError::BadMaxLen {
                table: name.into(),
                len: n,
            }),
            None => Err(SchemaError::NeedsMaxLen(name.into())),
        }
    }

    /// Declares table `name` of keys `K` and values `V` of up to `max_len` encoded bytes
    /// each (strings, byte vectors, [`Json`](crate::Json) records...), with room for
    /// `rows` rows. Every row takes the room of the largest value, plus 4 bytes.
    pub fn table_with_max_len<K: Key, V: Value>(
        &mut self,
        name: &str,
        rows: u64,
        max_len: usize,
    ) -> Result<Table<K, V>, SchemaError> {
        if max_len == 0 || max_len > MAX_VALUE_LEN {
            return Err(SchemaError::BadMaxLen {
                table: name.into(),
                len: max_len,
            });
        }
        let slot = match V::SIZE {
            Some(n) if n <= max_len => Slot::Fixed(n),
            _ => Slot::Variable { max: max_len },
        };
        self.add(name, rows, slot)
    }

    fn add<K: Key, V: Value>(
        &mut self,
        name: &str,
        rows: u64,
        slot: Slot,
    ) -> Result<Table<K, V>, SchemaError> {
        if name.is_empty() || name.len() > 64 {
            return Err(SchemaError::BadName(name.into()));
        }
        if self.tables.iter().any(|t| &*t.name == name) {
            return Err(SchemaError::Duplicate(name.into()));
        }
        if rows == 0 {
            return Err(SchemaError::NoRows(name.into()));
        }
        if self.tables.len() >= MAX_TABLES {
            return Err(SchemaError::TooManyTables);
        }
        let def = TableDef {
            id: self.tables.len() as u32,
            name: name.into(),
            slot,
            rows,
        };
        let t = Table {
            id: def.id,
            name: def.name.clone(),
            slot,
            _types: PhantomData,
        };
        self.tables.push(def);
        Ok(t)
    }

    /// The store's table specifications for a cluster of `placement`'s shape.
    pub(crate) fn specs(&self, placement: &Placement) -> Vec<TableSpec> {
        self.tables
            .iter()
            .map(|t| TableSpec {
                id: t.id,
                name: t.name.to_string(),
                value_size: t.slot.size(),
                capacity_per_node: per_node_capacity(t.rows, placement),
            })
            .collect()
    }
}

/// A typed handle on a declared table: keys `K`, values `V`. Cheap to clone; valid in
/// the clusters started with the schema that declared it.
pub struct Table<K, V> {
    pub(crate) id: u32,
    pub(crate) name: Arc<str>,
    pub(crate) slot: Slot,
    _types: PhantomData<fn(K) -> V>,
}

impl<K, V> Clone for Table<K, V> {
    fn clone(&self) -> Self {
        Table {
            id: self.id,
            name: self.name.clone(),
            slot: self.slot,
            _types: PhantomData,
        }
    }
}

impl<K, V> std::fmt::Debug for Table<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("id", &self.id)
            .field("name", &self.name)
            .finish()
    }
}

impl<K, V> Table<K, V> {
    /// The table's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The table's id in the store (its position in the schema).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The largest encoded value the table holds.
    pub fn max_value_len(&self) -> usize {
        self.slot.max_value()
    }
}

/// Keys (primaries and backups) a node may have to store if `total` keys are spread by
/// hash, planned for the most failures the data survives: R − 1 nodes lost one after
/// another, each time re-replicated to the survivors, leaves `nodes − R + 1` members
/// holding R copies of everything (at least R members: with fewer, copies are not
/// made), so each stores `total · R / max(R, nodes − R + 1)`; plus slack for the hash's
/// unevenness. Planned for one failure only, a survivor's table filled at the second
/// (5 nodes, R = 3: 3/4 of the keys planned, all of them needed), writes to its new
/// copies failed, and their primaries kept those writes' locks for ever.
/// Regions are mapped lazily, so the room planned and not used costs address space,
/// not memory.
pub fn per_node_capacity(total: u64, p: &Placement) -> usize {
    let (r, n) = (p.replication() as f64, p.nodes() as f64);
    let members_left = (n - r + 1.0).max(r).min(n);
    let share = total as f64 * r / members_left;
    (share * 1.1 + 1024.0) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_declarations_are_refused_with_the_reason() {
        let mut s = Schema::new();
        s.table::<u64, i64>("a", 10).unwrap();
        assert_eq!(
            s.table::<u64, i64>("a", 10).unwrap_err(),
            SchemaError::Duplicate("a".into())
        );
        assert_eq!(
            s.table::<u64, String>("b", 10).unwrap_err(),
            SchemaError::NeedsMaxLen("b".into())
        );
        assert!(matches!(
            s.table_with_max_len::<u64, String>("b", 10, MAX_VALUE_LEN + 1),
            Err(SchemaError::BadMaxLen { .. })
        ));
        assert_eq!(
            s.table::<u64, i64>("", 10).unwrap_err(),
            SchemaError::BadName(String::new())
        );
        assert_eq!(
            s.table::<u64, i64>("c", 0).unwrap_err(),
            SchemaError::NoRows("c".into())
        );
        let t = s.table_with_max_len::<u64, String>("d", 10, 32).unwrap();
        assert_eq!((t.id(), t.max_value_len()), (1, 32));
        // A fixed-size type in a table with a maximum keeps its fixed slot.
        let f = s.table_with_max_len::<u64, u32>("e", 10, 32).unwrap();
        assert_eq!(f.slot, Slot::Fixed(4));
    }
}
