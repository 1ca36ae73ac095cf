//! The one-sided log (`Log::Write`, DrTM+H §5.4, FaRM §2 and §3.4): each coordinator
//! thread owns a ring in every other node's registered memory and appends each commit
//! record with one-sided WRITEs to the backups of the keys it writes; the replica's
//! CPU is not involved until the coordinator, lazily and off the critical path, sends
//! a truncation RPC (DrTM+H: "two-sided primitive to reclaim the log ... lazily, by
//! updating records in-place"), piggybacked on the flush of a later append so it costs
//! no round trip of its own. The replica applies each record it truncates to its
//! backup copies (`crate::actions::apply_logged`: at the primary's version, older
//! records of a key skipped); only records of transactions installed everywhere are
//! truncated, and a record that landed for a transaction that aborted is voided first.
//! A thread's last worker drains its rings at the end of a run.
//!
//! - [`format`](mod@format): the bytes of a ring (records with header and trailer, pads, voids)
//!   and their checked decoding.
//! - `region`: a node's log region (the replica side): its rings, their heads,
//!   truncation, and reading a ring for recovery ([`LogRegion::scan`]).
//! - [`writer`]: a coordinator's state per remote ring (tail, acknowledged head,
//!   records not yet reclaimed).
//!
//! The phase itself is `crate::phases::log`; the truncation handler is in
//! `crate::handlers`.

pub mod format;
pub(crate) mod region;
pub mod writer;

pub use format::{End, LoggedTxn, LoggedWrite, RecordError};
pub use region::{
    ring_index, scan_ring, LogRegion, LogRegionSetupError, LogRingConfig, RingHead, RingRef,
    RingScan, ScanMode,
};
pub use writer::RingWriter;

use crate::db::NodeDb;
use crate::stats::LogRingStats;
use ambidex_transport::{NodeId, ThreadId};

/// One coordinator thread's rings, by replica node (made on first use from the
/// catalog), for one epoch, and its counters.
///
/// The rings restart with every epoch ([`RingWriters::reset`], `LogRegion::restart`):
/// the writers of an epoch exist only in it. Every access names the epoch it is made
/// in, so a transaction or truncation of an older epoch that resumes after the reset
/// finds no writer, and can neither void a slot nor move a head of the new one.
pub struct RingWriters {
    epoch: u32,
    rings: Vec<Option<RingWriter>>,
    pub stats: LogRingStats,
    /// Lists of the log phase, reused by the thread's next appends.
    pub(crate) scratch: Vec<crate::phases::log::Scratch>,
}

impl RingWriters {
    /// A thread's rings in `epoch` (none made yet).
    pub fn new(epoch: u32) -> RingWriters {
        RingWriters {
            epoch,
            rings: Vec::new(),
            stats: LogRingStats::default(),
            scratch: Vec::new(),
        }
    }

    /// The epoch whose rings these are.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// The thread moved to `epoch`: every writer goes (recovery replays what its rings
    /// held and restarts them at [`RingHead::of_epoch`]); the counters stay.
    pub fn reset(&mut self, epoch: u32) {
        self.epoch = epoch;
        self.rings.clear();
    }

    /// The ring of coordinator (`node`, `thread`) at `replica` in `epoch`, made from
    /// the catalog's descriptor of the replica's log region on first use; `None` if
    /// `epoch` is not the rings' epoch, there is no catalog, no descriptor, or the
    /// descriptor has no ring for this coordinator.
    pub fn get(
        &mut self,
        db: &NodeDb,
        node: NodeId,
        thread: ThreadId,
        replica: NodeId,
        epoch: u32,
    ) -> Option<&mut RingWriter> {
        if epoch != self.epoch {
            return None;
        }
        let i = replica as usize;
        if self.rings.len() <= i {
            self.rings.resize_with(i + 1, || None);
        }
        if self.rings[i].is_none() {
            let desc = *db.catalog()?.log_region(replica)?;
            let threads = db.log_region().threads();
            let idx = ring_index(db.nodes(), db.replication(), threads, replica, node, thread)?;
            let off = desc.ring_offset(idx)?;
            let head = RingHead::of_epoch(self.epoch);
            self.rings[i] = Some(RingWriter::starting_at(desc, off, head));
        }
        self.rings[i].as_mut()
    }

    /// The ring at `replica`, if made in `epoch` (the rings' epoch).
    pub fn at(&mut self, replica: NodeId, epoch: u32) -> Option<&mut RingWriter> {
        if epoch != self.epoch {
            return None;
        }
        self.rings.get_mut(replica as usize)?.as_mut()
    }

    /// `txn` is installed everywhere: its records may be reclaimed.
    pub fn installed(&mut self, txn: u64) {
        for w in self.rings.iter_mut().flatten() {
            w.installed(txn);
        }
    }

    /// The replicas whose ring is not drained ([`RingWriter::drained`]).
    pub fn undrained(&self) -> Vec<NodeId> {
        (0..self.rings.len())
            .filter(|&i| self.rings[i].as_ref().is_some_and(|w| !w.drained()))
            .map(|i| i as NodeId)
            .collect()
    }

    /// Records written and not yet released, over every ring.
    pub fn held(&self) -> usize {
        self.rings.iter().flatten().map(|w| w.held()).sum()
    }
}
