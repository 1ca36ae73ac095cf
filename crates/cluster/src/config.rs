//! A configuration (Vertical Paxos, FaRM's): the epoch, who is a member (and which
//! incarnation of each node id), and the placement. Only the configuration manager
//! makes a new one, always with a higher epoch; a node adopts it whole.
//!
//! [`ConfigCell`] is how a node's threads share the configuration they run in: one
//! atomic load tells a thread whether its cached copy is current.

use crate::placement::{Placement, PlacementError};
use ambidex_transport::NodeId;
use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

/// One configuration of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Configuration {
    /// Stamped on every datagram and one-sided operation; work of an older epoch is
    /// refused. The first configuration has epoch 1.
    pub epoch: u32,
    /// Per node id: the incarnation that is (or last was) the member; 0 = none yet. A
    /// node restarted with the same id is a new incarnation.
    pub incarnations: Vec<u64>,
    pub placement: Placement,
}

impl Configuration {
    /// The first configuration of a cluster of `nodes` nodes, each in its first
    /// incarnation.
    pub fn initial(nodes: u16, replication: u16) -> Result<Configuration, PlacementError> {
        Ok(Configuration {
            epoch: 1,
            incarnations: vec![1; nodes as usize],
            placement: Placement::new(nodes, replication)?,
        })
    }

    /// The next configuration once the nodes of `gone` (bit i = node i) failed.
    pub fn without(&self, gone: u64) -> Result<Configuration, PlacementError> {
        Ok(Configuration {
            epoch: self.epoch + 1,
            incarnations: self.incarnations.clone(),
            placement: self.placement.without(gone)?,
        })
    }

    /// The next configuration once `node` joined again as `incarnation`.
    pub fn with_member(
        &self,
        node: NodeId,
        incarnation: u64,
    ) -> Result<Configuration, PlacementError> {
        let mut incarnations = self.incarnations.clone();
        *incarnations
            .get_mut(node as usize)
            .ok_or(PlacementError::UnknownNode(node))? = incarnation;
        Ok(Configuration {
            epoch: self.epoch + 1,
            incarnations,
            placement: self.placement.with_member(node)?,
        })
    }

    /// Checks what a deserialized configuration must satisfy beyond its placement.
    pub fn check(&self) -> Result<(), PlacementError> {
        if self.epoch == 0 {
            return Err(PlacementError::Malformed("epoch 0".into()));
        }
        if self.incarnations.len() != self.placement.nodes() as usize {
            return Err(PlacementError::Malformed(format!(
                "{} incarnations for {} nodes",
                self.incarnations.len(),
                self.placement.nodes()
            )));
        }
        Ok(())
    }
}

/// The configuration a node's threads run in, shared by them: read without a lock
/// (`arc-swap`), the epoch with one atomic load.
pub struct ConfigCell {
    epoch: AtomicU32,
    current: ArcSwap<Configuration>,
    /// Serializes writers (a store compares epochs first).
    write: Mutex<()>,
}

impl ConfigCell {
    pub fn new(c: Configuration) -> ConfigCell {
        ConfigCell {
            epoch: AtomicU32::new(c.epoch),
            current: ArcSwap::from_pointee(c),
            write: Mutex::new(()),
        }
    }

    /// The current epoch (one atomic load).
    #[inline]
    pub fn epoch(&self) -> u32 {
        self.epoch.load(Ordering::Acquire)
    }

    /// The current configuration.
    pub fn load(&self) -> Arc<Configuration> {
        self.current.load_full()
    }

    /// The current placement, for a short look (no reference count taken).
    pub fn with<R>(&self, f: impl FnOnce(&Configuration) -> R) -> R {
        f(&self.current.load())
    }

    /// Installs `c` if its epoch is newer than the current one; returns whether it did.
    pub fn store(&self, c: Configuration) -> bool {
        let _w = self.write.lock().unwrap_or_else(|e| e.into_inner());
        if c.epoch <= self.current.load().epoch {
            return false;
        }
        let epoch = c.epoch;
        self.current.store(Arc::new(c));
        self.epoch.store(epoch, Ordering::Release);
        true
    }

    /// Updates the current configuration in place without a new epoch (a replica
    /// finished syncing: nothing a thread must react to).
    pub fn update_same_epoch(&self, f: impl FnOnce(&mut Configuration)) {
        let _w = self.write.lock().unwrap_or_else(|e| e.into_inner());
        let cur = self.current.load_full();
        let mut c = (*cur).clone();
        f(&mut c);
        c.epoch = cur.epoch;
        self.current.store(Arc::new(c));
    }
}

/// A thread's copy of its node's configuration, refreshed when the epoch moves. Not
/// shared between threads: handing out its copy costs no atomic operation.
pub struct ConfigView {
    cached: RefCell<Rc<Configuration>>,
}

impl ConfigView {
    pub fn new(cell: &ConfigCell) -> ConfigView {
        ConfigView {
            cached: RefCell::new(Rc::new((*cell.load()).clone())),
        }
    }

    /// The current configuration: the cached one unless `cell`'s epoch moved.
    #[inline]
    pub fn get(&self, cell: &ConfigCell) -> Rc<Configuration> {
        let mut c = self.cached.borrow_mut();
        if cell.epoch() != c.epoch {
            *c = Rc::new((*cell.load()).clone());
        }
        c.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_only_moves_forward() {
        let c = Configuration::initial(3, 3).unwrap();
        let cell = ConfigCell::new(c.clone());
        let view = ConfigView::new(&cell);
        assert_eq!(view.get(&cell).epoch, 1);
        let next = c.without(1 << 2).unwrap();
        assert!(cell.store(next.clone()));
        assert!(!cell.store(next));
        assert!(!cell.store(c));
        assert_eq!(cell.epoch(), 2);
        assert_eq!(view.get(&cell).epoch, 2);
        assert!(!view.get(&cell).placement.is_member(2));
    }

    #[test]
    fn rejoining_is_a_new_incarnation() {
        let c = Configuration::initial(3, 3).unwrap();
        let d = c.without(1 << 1).unwrap().with_member(1, 7).unwrap();
        assert_eq!(d.epoch, 3);
        assert_eq!(d.incarnations, vec![1, 7, 1]);
        assert!(d.check().is_ok());
        let s = serde_json::to_string(&d).unwrap();
        assert_eq!(serde_json::from_str::<Configuration>(&s).unwrap(), d);
    }
}
