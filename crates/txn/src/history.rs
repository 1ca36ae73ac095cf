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

/// The write a history records for `it`: its kind and new value, or `None` for a
/// key only read, or written by an aborted transaction that had not chosen a value
/// yet (its write never happened).
pub fn recorded_write<'a>(it: &ItemView<'a>) -> Option<(HKind, Option<&'a [u8]>)> {
    let (kind, value) = match it.write? {
        WriteKind::Insert => (HKind::Insert, it.new_value),
        WriteKind::Update => (HKind::Update, it.new_value),
        WriteKind::Delete => (HKind::Delete, None),
    };
    (value.is_some() || kind == HKind::Delete).then_some((kind, value))
}

/// A record's header; `outcome` None for a pending record (outcome unknown).
fn header(
    id: u64,
    node: NodeId,
    thread: ThreadId,
    outcome: Option<Result<(), AbortReason>>,
    start_ns: u64,
    end_ns: u64,
) -> TxnHeader<'static> {
    TxnHeader {
        id,
        node: node as u32,
        thread: thread as u32,
        outcome: match outcome {
            Some(Ok(())) => Outcome::Committed,
            Some(Err(_)) => Outcome::Aborted,
            None => Outcome::Unknown,
        },
        reason: outcome.and_then(|o| o.err()).map(|r| r.name()),
        start_us: start_ns / 1000,
        end_us: end_ns / 1000,
        clock_offset_us: None,
    }
}

/// Records into one thread's recorder handle.
pub struct RecorderSink(pub ThreadRecorder);

impl RecorderSink {
    fn put(&mut self, header: &TxnHeader<'_>, items: &[ItemView<'_>]) {
        let id = header.id;
        self.0.record_with(header, |b| {
            for it in items {
                b.read(it.table, it.key, it.version, it.exists.then_some(it.value));
                if let Some((k, value)) = recorded_write(it) {
                    b.write(it.table, it.key, k, it.version, id, value);
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
        self.put(
            &header(id, node, thread, Some(outcome), start_ns, end_ns),
            items,
        );
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
        self.put(&header(id, node, thread, None, start_ns, start_ns), items);
    }

    fn flush(&mut self) {
        self.0.flush();
    }
}
