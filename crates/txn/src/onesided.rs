//! What the one-sided phases need to reach remote items (DrTM+H §5): each remote
//! table's descriptor and item shape (from the cluster's catalog), the steps of a
//! lookup by one-sided READs (bucket, overflow chain, item), and the images a
//! one-sided commit WRITEs. The layout itself and why its reads are safe are in
//! `ambidex_store::layout`; this module only applies it to transactions.
//!
//! Every byte a READ returns is untrusted: a bucket's item references are checked
//! against the layout, an item is accepted only if its header is unlocked, every chunk
//! version equals it and the key matches (`layout::check_image`).

use crate::db::{NodeDb, META, TOMBSTONE};
use ambidex_store::layout::{
    check_image, hash, slot_ref, tag_matches, tag_of, value_word, Header, ItemCheck, ItemShape,
    LINE, LINK_MASK, MARKER,
};
use ambidex_store::{LockOwner, TableDesc};
use ambidex_transport::{NodeId, RemoteAddr};
use std::cell::RefCell;
use std::rc::Rc;

/// A remote table as the coordinator reaches it.
pub(crate) struct RemoteTable {
    pub desc: TableDesc,
    pub shape: ItemShape,
}

impl RemoteTable {
    pub fn at(&self, offset: u64) -> RemoteAddr {
        self.desc.region.at(offset)
    }
}

/// Per thread: every remote table, by (node, table), built from the catalog at first
/// use.
#[derive(Default)]
pub(crate) struct RemoteTables {
    /// `[node * tables + table]`; empty until built.
    tables: Vec<Option<Rc<RemoteTable>>>,
    per_node: usize,
}

impl RemoteTables {
    /// Forgets every table: the next use builds them again from the catalog (at a new
    /// epoch, after which a rejoined node's new descriptors apply).
    pub fn clear(&mut self) {
        self.tables.clear();
        self.per_node = 0;
    }

    /// The table `table` of `node`, or `None` if the catalog does not have it (no
    /// catalog, an unknown table, a layout the catalog's checks let through but the
    /// shape cannot use).
    pub fn get(
        cell: &RefCell<RemoteTables>,
        db: &NodeDb,
        node: NodeId,
        table: u32,
    ) -> Option<Rc<RemoteTable>> {
        let mut me = cell.borrow_mut();
        if me.tables.is_empty() {
            me.build(db)?;
        }
        let i = (node as usize)
            .checked_mul(me.per_node)?
            .checked_add(table as usize)?;
        if table as usize >= me.per_node {
            return None;
        }
        me.tables.get(i)?.clone()
    }

    fn build(&mut self, db: &NodeDb) -> Option<()> {
        let cat = db.catalog()?;
        let per_node = cat
            .iter()
            .map(|d| d.table_id as usize + 1)
            .max()
            .unwrap_or(0);
        let nodes = cat.nodes() as usize;
        let mut tables = vec![None; nodes * per_node];
        for d in cat.iter() {
            let i = d.region.node as usize * per_node + d.table_id as usize;
            tables[i] = Some(Rc::new(RemoteTable {
                desc: *d,
                shape: ItemShape::new(&d.layout),
            }));
        }
        self.tables = tables;
        self.per_node = per_node;
        Some(())
    }
}

/// Where a one-sided lookup of a key is: the bucket it reads next, or the item
/// candidates of the bucket it read.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Walk {
    /// The bucket read (its words).
    pub words: [u64; 8],
    /// Slots of that bucket whose tag matches and that were not tried yet.
    pub mask: u32,
    pub hops: u32,
}

/// The first bucket of `key`'s chain.
pub(crate) fn main_bucket(t: &RemoteTable, key: u64) -> u64 {
    let l = &t.desc.layout;
    l.main_bucket_off(hash(key, l.seed))
}

/// Takes a bucket's bytes (a READ's result) into a walk.
pub(crate) fn read_bucket(t: &RemoteTable, key: u64, buf: &[u8], hops: u32) -> Walk {
    let words: [u64; 8] = std::array::from_fn(|i| {
        buf.get(i * 8..i * 8 + 8)
            .map_or(0, |b| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8])))
    });
    let tag = tag_of(hash(key, t.desc.layout.seed));
    Walk {
        mask: tag_matches(words[0], words[1], tag),
        words,
        hops,
    }
}

/// The next step of a walk: an item to READ, the next bucket of the chain, or the end.
pub(crate) enum WalkStep {
    Item(u64),
    Bucket(u64, u32),
    NotFound,
}

pub(crate) fn next_step(t: &RemoteTable, w: &mut Walk) -> WalkStep {
    let l = &t.desc.layout;
    while w.mask != 0 {
        let s = w.mask.trailing_zeros() as usize;
        w.mask &= w.mask - 1;
        if let Some(off) = l.item_off(slot_ref(w.words[2 + s / 2], s)) {
            return WalkStep::Item(off);
        }
    }
    match l.overflow_bucket_off(w.words[0] & LINK_MASK) {
        Some(next) if w.hops <= l.overflow => WalkStep::Bucket(next, w.hops + 1),
        _ => WalkStep::NotFound,
    }
}

/// Bytes of one bucket READ.
pub(crate) const BUCKET_BYTES: u32 = LINE as u32;

/// What an item READ found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ItemRead {
    /// The key, consistent: its header word, transaction version (tombstone bit
    /// cleared), whether it is live, and its value in the caller's buffer.
    Found { hdr: u64, version: u64, live: bool },
    /// Locked by a writer.
    Locked,
    /// A write in progress (chunk versions disagree): read it again.
    Torn,
    /// Another key, or a free item: the location is stale.
    Miss,
}

/// Checks an item image (a READ's result) for `key` and copies its value (without the
/// transaction version) into `value` on success. `stored` is scratch of at least the
/// table's stored value size.
pub(crate) fn read_item(
    t: &RemoteTable,
    img: &[u8],
    key: u64,
    stored: &mut Vec<u8>,
    value: &mut Vec<u8>,
) -> ItemRead {
    let h = img.get(..8).map_or(MARKER, |b| {
        u64::from_ne_bytes(b.try_into().unwrap_or([0; 8]))
    });
    if Header::is_locked(h) {
        // Locked items are the key's only if the key word matches; a foreign locked
        // item is a stale location.
        let k = img
            .get(8..16)
            .map_or(0, |b| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8])));
        return if k == key && Header::version_of(h) & 1 == 1 {
            ItemRead::Locked
        } else {
            ItemRead::Miss
        };
    }
    stored.clear();
    stored.resize(t.shape.value_size, 0);
    match check_image(&t.shape, img, key, stored) {
        ItemCheck::Ok(v) => {
            if stored.len() < META {
                return ItemRead::Miss;
            }
            let meta = u64::from_le_bytes(stored[..META].try_into().unwrap_or([0; 8]));
            let live = meta & TOMBSTONE == 0;
            value.clear();
            if live {
                value.extend_from_slice(&stored[META..]);
            }
            ItemRead::Found {
                hdr: Header::unlocked(v),
                version: meta & !TOMBSTONE,
                live,
            }
        }
        ItemCheck::Busy => ItemRead::Torn,
        ItemCheck::Miss => ItemRead::Miss,
    }
}

/// The WRITEs that install `stored` (transaction version + value) into an item locked
/// at header version `version` by `owner`, and the release, as `layout`'s write
/// protocol orders them on one queue: every chunk version to MARKER, then key, data
/// and new chunk versions in one WRITE, then a CAS from the locked word to the new
/// version. The release is a CAS, not a WRITE of the header: a retransmitted WRITE may
/// execute twice on a real NIC, and a late header WRITE would erase a later lock.
#[derive(Default)]
pub(crate) struct CommitImage {
    /// (offset, bytes) of each WRITE, in posting order.
    pub writes: Vec<(u64, std::ops::Range<usize>)>,
    pub bytes: Vec<u8>,
    /// The release CAS: (expected, new).
    pub release: (u64, u64),
}

pub(crate) fn commit_image(
    t: &RemoteTable,
    offset: u64,
    key: u64,
    version: u64,
    owner: LockOwner,
    stored: &[u8],
    out: &mut CommitImage,
) {
    let shape = &t.shape;
    let nv = Header::bump(version, 2);
    out.writes.clear();
    out.bytes.clear();
    for &c in &shape.versions {
        let at = out.bytes.len();
        out.bytes.extend_from_slice(&MARKER.to_ne_bytes());
        out.writes.push((offset + 8 * c as u64, at..at + 8));
    }
    let at = out.bytes.len();
    out.bytes.resize(at + shape.item_size - 8, 0);
    let img = &mut out.bytes[at..];
    img[..8].copy_from_slice(&key.to_ne_bytes());
    for (i, &w) in shape.data.iter().enumerate() {
        let s = w as usize * 8 - 8;
        img[s..s + 8].copy_from_slice(&value_word(stored, i).to_ne_bytes());
    }
    for &c in &shape.versions {
        let s = c as usize * 8 - 8;
        img[s..s + 8].copy_from_slice(&nv.to_ne_bytes());
    }
    out.writes.push((offset + 8, at..out.bytes.len()));
    out.release = (Header::locked(version, owner), Header::unlocked(nv));
}

#[cfg(test)]
mod tests {
    use super::*;
    use ambidex_store::{Table, TableConfig};

    /// The image a one-sided commit writes reads back, through the table's own local
    /// reader, as the value it carries.
    #[test]
    fn commit_image_matches_the_local_write_protocol() {
        for value_size in [8usize, 40, 200] {
            let cfg = TableConfig::new(64, META + value_size);
            let t = Table::create_anonymous(3, &cfg).unwrap();
            let mut stored = vec![0u8; META + value_size];
            stored[..8].copy_from_slice(&7u64.to_le_bytes());
            t.insert(42, &stored).unwrap();
            let (off, ver) = t.locate_item(42).unwrap();
            let owner = LockOwner::new(1, 2, 3).unwrap();
            t.try_lock_at(off, ver, owner).unwrap();
            let rt = RemoteTable {
                desc: t.desc(),
                shape: ItemShape::new(t.layout()),
            };
            let mut new = vec![0u8; META + value_size];
            new[..8].copy_from_slice(&99u64.to_le_bytes());
            for (i, b) in new[8..].iter_mut().enumerate() {
                *b = i as u8 ^ 0x5a;
            }
            let mut img = CommitImage::default();
            commit_image(&rt, off, 42, ver, owner, &new, &mut img);
            let mem = t.memory();
            for (at, r) in &img.writes {
                assert!(mem.write(*at, &img.bytes[r.clone()]));
            }
            let (old, nv) = img.release;
            let hdr = mem.word(off).unwrap();
            let sc = std::sync::atomic::Ordering::SeqCst;
            assert_eq!(hdr.compare_exchange(old, nv, sc, sc), Ok(old));
            let mut out = vec![0u8; META + value_size];
            assert!(t.get(42, &mut out).is_some());
            assert_eq!(out, new, "value size {value_size}");
            assert_eq!(Header::version_of(nv), Header::version_of(ver) + 2);
        }
    }
}
