//! The ordered index (for TPC-C's range scans): a B+tree of u64 keys, owner-local (it
//! does not live in registered memory; remote nodes reach it by RPC).
//!
//! Concurrency is correctness-first: the whole tree sits behind one reader-writer lock,
//! so lookups and scans run in parallel and writers are serialised. Values live only in
//! leaves; inner nodes hold separators (`keys in kids[i] < keys[i] <= keys in kids[i+1]`).
//! Deletion removes emptied nodes (and shrinks the root) but does not merge underfull
//! siblings: a queue-like workload (TPC-C NEW-ORDER inserted at the right, deleted at
//! the left) leaves no empty leaves for scans to walk over, and the height still only
//! grows with inserts.

use std::ops::Bound;
use std::sync::RwLock;

/// Most keys in a node. 32 keys of 8 bytes span a few cache lines; a search inside a
/// node is a binary search.
const MAX_KEYS: usize = 32;

enum Node<V> {
    Leaf { keys: Vec<u64>, vals: Vec<V> },
    Inner { keys: Vec<u64>, kids: Vec<Node<V>> },
}

impl<V: Clone> Node<V> {
    fn empty_leaf() -> Self {
        Node::Leaf {
            keys: Vec::with_capacity(MAX_KEYS + 1),
            vals: Vec::with_capacity(MAX_KEYS + 1),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Node::Leaf { keys, .. } => keys.is_empty(),
            Node::Inner { kids, .. } => kids.is_empty(),
        }
    }

    fn get(&self, key: u64) -> Option<&V> {
        let mut n = self;
        loop {
            match n {
                Node::Leaf { keys, vals } => {
                    return keys.binary_search(&key).ok().map(|i| &vals[i]);
                }
                Node::Inner { keys, kids } => n = &kids[keys.partition_point(|s| *s <= key)],
            }
        }
    }

    /// Inserts; returns the old value and, if this node split, (separator, right half).
    fn insert(&mut self, key: u64, val: V) -> (Option<V>, Option<(u64, Node<V>)>) {
        match self {
            Node::Leaf { keys, vals } => match keys.binary_search(&key) {
                Ok(i) => (Some(std::mem::replace(&mut vals[i], val)), None),
                Err(i) => {
                    keys.insert(i, key);
                    vals.insert(i, val);
                    if keys.len() <= MAX_KEYS {
                        return (None, None);
                    }
                    let mid = keys.len() / 2;
                    let rk = keys.split_off(mid);
                    let rv = vals.split_off(mid);
                    (None, Some((rk[0], Node::Leaf { keys: rk, vals: rv })))
                }
            },
            Node::Inner { keys, kids } => {
                let i = keys.partition_point(|s| *s <= key);
                let (old, split) = kids[i].insert(key, val);
                if let Some((sep, right)) = split {
                    keys.insert(i, sep);
                    kids.insert(i + 1, right);
                    if keys.len() > MAX_KEYS {
                        let mid = keys.len() / 2;
                        let mut rk = keys.split_off(mid);
                        let sep = rk.remove(0);
                        let rkids = kids.split_off(mid + 1);
                        return (
                            old,
                            Some((
                                sep,
                                Node::Inner {
                                    keys: rk,
                                    kids: rkids,
                                },
                            )),
                        );
                    }
                }
                (old, None)
            }
        }
    }

    fn remove(&mut self, key: u64) -> Option<V> {
        match self {
            Node::Leaf { keys, vals } => {
                let i = keys.binary_search(&key).ok()?;
                keys.remove(i);
                Some(vals.remove(i))
            }
            Node::Inner { keys, kids } => {
                let i = keys.partition_point(|s| *s <= key);
                let old = kids[i].remove(key)?;
                if kids[i].is_empty() {
                    // Dropping kid i and the separator on its left (or right for the
                    // first kid) keeps the separator invariant for the neighbours.
                    kids.remove(i);
                    if !keys.is_empty() {
                        keys.remove(i.saturating_sub(1));
                    }
                }
                Some(old)
            }
        }
    }

    /// Visits keys in `[lo, hi]` ascending; stops when `f` returns false.
    fn scan(&self, lo: u64, hi: u64, f: &mut dyn FnMut(u64, &V) -> bool) -> bool {
        match self {
            Node::Leaf { keys, vals } => {
                let start = keys.partition_point(|k| *k < lo);
                for i in start..keys.len() {
                    if keys[i] > hi || !f(keys[i], &vals[i]) {
                        return false;
                    }
                }
                true
            }
            Node::Inner { keys, kids } => {
                let start = keys.partition_point(|s| *s <= lo);
                for i in start..kids.len() {
                    if i > 0 && keys[i - 1] > hi {
                        return false;
                    }
                    if !kids[i].scan(lo, hi, f) {
                        return false;
                    }
                }
                true
            }
        }
    }

    /// Visits keys in `[lo, hi]` descending.
    fn scan_rev(&self, lo: u64, hi: u64, f: &mut dyn FnMut(u64, &V) -> bool) -> bool {
        match self {
            Node::Leaf { keys, vals } => {
                let end = keys.partition_point(|k| *k <= hi);
                for i in (0..end).rev() {
                    if keys[i] < lo || !f(keys[i], &vals[i]) {
                        return false;
                    }
                }
                true
            }
            Node::Inner { keys, kids } => {
                let end = keys.partition_point(|s| *s <= hi);
                for i in (0..=end.min(kids.len().saturating_sub(1))).rev() {
                    if !kids[i].scan_rev(lo, hi, f) {
                        return false;
                    }
                    // Everything left of separator keys[i-1] is below it.
                    if i > 0 && keys[i - 1] <= lo {
                        return false;
                    }
                }
                true
            }
        }
    }

    fn depth(&self) -> usize {
        match self {
            Node::Leaf { .. } => 1,
            Node::Inner { kids, .. } => 1 + kids.first().map_or(0, |k| k.depth()),
        }
    }
}

struct Tree<V> {
    root: Node<V>,
    len: usize,
}

/// A concurrent ordered map from u64 keys to `V`.
pub struct OrderedIndex<V> {
    tree: RwLock<Tree<V>>,
}

impl<V: Clone> Default for OrderedIndex<V> {
    fn default() -> Self {
        Self::new()
    }
}

fn bounds(lo: Bound<u64>, hi: Bound<u64>) -> Option<(u64, u64)> {
    let lo = match lo {
        Bound::Included(x) => x,
        Bound::Excluded(x) => x.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let hi = match hi {
        Bound::Included(x) => x,
        Bound::Excluded(x) => x.checked_sub(1)?,
        Bound::Unbounded => u64::MAX,
    };
    (lo <= hi).then_some((lo, hi))
}

impl<V: Clone> OrderedIndex<V> {
    pub fn new() -> Self {
        OrderedIndex {
            tree: RwLock::new(Tree {
                root: Node::empty_leaf(),
                len: 0,
            }),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Tree<V>> {
        self.tree.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Tree<V>> {
        self.tree.write().unwrap_or_else(|e| e.into_inner())
    }

    pub fn get(&self, key: u64) -> Option<V> {
        self.read().root.get(key).cloned()
    }

    /// Inserts or replaces; returns the previous value.
    pub fn insert(&self, key: u64, val: V) -> Option<V> {
        let mut t = self.write();
        let (old, split) = t.root.insert(key, val);
        if let Some((sep, right)) = split {
            let left = std::mem::replace(&mut t.root, Node::empty_leaf());
            t.root = Node::Inner {
                keys: vec![sep],
                kids: vec![left, right],
            };
        }
        if old.is_none() {
            t.len += 1;
        }
        old
    }

    /// Inserts only if absent; returns false if the key was present.
    pub fn insert_new(&self, key: u64, val: V) -> bool {
        let mut t = self.write();
        if t.root.get(key).is_some() {
            return false;
        }
        let (_, split) = t.root.insert(key, val);
        if let Some((sep, right)) = split {
            let left = std::mem::replace(&mut t.root, Node::empty_leaf());
            t.root = Node::Inner {
                keys: vec![sep],
                kids: vec![left, right],
            };
        }
        t.len += 1;
        true
    }

    pub fn remove(&self, key: u64) -> Option<V> {
        let mut t = self.write();
        let old = t.root.remove(key)?;
        t.len -= 1;
        loop {
            match &mut t.root {
                Node::Inner { kids, .. } if kids.len() == 1 => {
                    let only = kids.pop().unwrap_or_else(Node::empty_leaf);
                    t.root = only;
                }
                Node::Inner { kids, .. } if kids.is_empty() => t.root = Node::empty_leaf(),
                _ => break,
            }
        }
        Some(old)
    }

    pub fn len(&self) -> usize {
        self.read().len
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn depth(&self) -> usize {
        self.read().root.depth()
    }

    /// Visits the keys in the range in ascending order until `f` returns false.
    pub fn scan(&self, lo: Bound<u64>, hi: Bound<u64>, mut f: impl FnMut(u64, &V) -> bool) {
        if let Some((lo, hi)) = bounds(lo, hi) {
            self.read().root.scan(lo, hi, &mut f);
        }
    }

    /// Visits the keys in the range in descending order until `f` returns false.
    pub fn scan_rev(&self, lo: Bound<u64>, hi: Bound<u64>, mut f: impl FnMut(u64, &V) -> bool) {
        if let Some((lo, hi)) = bounds(lo, hi) {
            self.read().root.scan_rev(lo, hi, &mut f);
        }
    }

    /// Up to `limit` entries of the range, ascending.
    pub fn range(&self, lo: Bound<u64>, hi: Bound<u64>, limit: usize) -> Vec<(u64, V)> {
        let mut out = Vec::new();
        if limit == 0 {
            return out;
        }
        self.scan(lo, hi, |k, v| {
            out.push((k, v.clone()));
            out.len() < limit
        });
        out
    }

    /// Up to `limit` entries of the range, descending.
    pub fn range_rev(&self, lo: Bound<u64>, hi: Bound<u64>, limit: usize) -> Vec<(u64, V)> {
        let mut out = Vec::new();
        if limit == 0 {
            return out;
        }
        self.scan_rev(lo, hi, |k, v| {
            out.push((k, v.clone()));
            out.len() < limit
        });
        out
    }
}
