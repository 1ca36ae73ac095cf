//! Recording histories: a [`HistorySink`] that writes every finished transaction of a
//! thread in the JSON-lines format of `docs/history-format.md` through the history
//! crate's recorder (off unless a recorder file is given; cheap when on), and every
//! transaction entering its log phase as a pending record of outcome unknown.
//!
//! Every fetched key is a read (write-set keys are read under their lock, W ⊆ R) with the
//! transaction version seen; every write-set key is a write installing the transaction's
//! id over the version read. Writes of aborted transactions are recorded too, so a
//! checker can tell an aborted read.

use crate::{AbortReason, HistorySink, ItemView, WriteKind};
use ambidex_history::{Outcome, ThreadRecorder, TxnHeader, WriteKind as HKind};
use ambidex_transport::{NodeId, ThreadId};

/// Records into one thread's recorder handle.
pub struct RecorderSink(pub ThreadRecorder);

impl RecorderSink {
    fn put(&mut self, header: &TxnHeader<'_>, items: &[ItemView<'_>]) {
        let id = header.id;
        self.0.record_with(header, |b| {
            for it in items {
                b.read(it.table, it.key, it.version, it.exists.then_some(it.value));
                if let Some(kind) = it.write {
                    let (k, value) = match kind {
                        WriteKind::Insert => (HKind::Insert, it.new_value),
                        WriteKind::Update => (HKind::Update, it.new_value),
                        WriteKind::Delete => (HKind::Delete, None),
                    };
                    // An aborted transaction may not have chosen a value yet: its
                    // write never happened, so there is nothing to record.
                    if value.is_some() || k == HKind::Delete {
                        b.write(it.table, it.key, k, it.version, id, value);
                    }
                }
            }
        });
    }
}

impl HistorySink for RecorderSink {
    fn record(
        &mut self,
        id: u64,
        node: NodeId,
        thread: ThreadId,
        outcome: Result<(), AbortReason>,
        start_ns: u64,
        end_ns: u64,
        items: &[ItemView<'_>],
    ) {
        let header = TxnHeader {
            id,
            node: node as u32,
            thread: thread as u32,
            outcome: if outcome.is_ok() {
                Outcome::Committed
            } else {
                Outcome::Aborted
            },
            reason: outcome.err().map(|r| r.name()),
            start_us: start_ns / 1000,
            end_us: end_ns / 1000,
            clock_offset_us: None,
        };
        self.put(&header, items);
    }

    /// The log phase starts: a record of outcome unknown goes to the file now
    /// (a file recorder's records survive the process being killed), so if
    /// the coordinator dies before the final record, the checker still knows
    /// the writes another node may install. The final record supersedes it.
    fn pending(
        &mut self,
        id: u64,
        node: NodeId,
        thread: ThreadId,
        start_ns: u64,
        items: &[ItemView<'_>],
    ) {
        let header = TxnHeader {
            id,
            node: node as u32,
            thread: thread as u32,
            outcome: Outcome::Unknown,
            reason: None,
            start_us: start_ns / 1000,
            end_us: start_ns / 1000,
            clock_offset_us: None,
        };
        self.put(&header, items);
    }

    fn flush(&mut self) {
        self.0.flush();
    }
}
