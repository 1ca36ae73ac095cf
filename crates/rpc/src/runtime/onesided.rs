//! One-sided verbs (READ, WRITE, CAS, FAA) from worker coroutines (DrTM+H §3.2).
//!
//! A worker queues operations beside its RPC requests ([`Ctx::queue_read`] and the
//! like; no I/O), and `ctx.flush().await` hands them to the master, which posts every
//! operation flushed in a step with one `Endpoint::post`, right after the step's
//! request datagrams: one doorbell batch per step, as for datagrams. The master polls
//! the completion queue at the start of each step while completions may come, routes
//! each by its `wr_id` (worker, batch generation, operation) and resumes a worker once
//! every response of its batch and every *signaled* operation of it is in.
//!
//! Why signaled and unsignaled: a completion costs the initiator a CQ entry to poll, so
//! DrTM+H posts most operations unsignaled and relies on *passive ACK*: operations of one
//! (endpoint, node) queue complete in order, so the completion of a signaled one
//! confirms every earlier one on that queue. A flush therefore waits only for its
//! signaled operations. An unsignaled operation's result is known once confirmed
//! ([`OneSidedError::Unconfirmed`] before), or once the transport has nothing
//! outstanding. An unsignaled atomic's old value is never returned (only completions
//! carry it; [`OneSidedError::NoValue`]).
//!
//! A failing unsignaled operation still produces an error completion, and it is never
//! dropped: it is counted (`RpcStats::onesided_failed` and `onesided_unsignaled_failed`),
//! recorded on the operation if its batch is still the worker's current one, and queued
//! for the issuing worker, whose next flush returns `RpcError::UnsignaledFailed` with
//! every such failure (or which can take them earlier with
//! [`Ctx::take_unsignaled_failures`]). A signaled operation's failure is that
//! operation's result, as a failed RPC response is (the flush itself succeeds).
//!
//! READ needs a registered local destination: a runtime gets one scratch region
//! ([`Runtime::attach_scratch`], from `NodeTransport::register` on its own node), cut
//! into one slice per worker; a batch's READs take consecutive ranges of the worker's
//! slice, and [`Ctx::read_result`] copies the bytes out (the transport writes that
//! memory, so no reference into it is handed out). The ranges are free again at the
//! worker's next batch, except those of unsignaled READs not confirmed yet, which the
//! transport may still write.

use super::batch::Phase;
use super::{Ctx, Runtime, State};
use crate::config::RpcError;
use ambidex_transport::region::Region;
use ambidex_transport::{
    AccessError, Completion, Endpoint, LocalBuf, NodeId, OneSidedKind, OneSidedOp, OpCode,
    RegionId, RemoteAddr, TransportError,
};
use std::fmt;

/// A one-sided operation queued in the current batch, returned by [`Ctx::queue_read`]
/// and the like; valid until the worker queues its next batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpHandle(u16);

/// Why a one-sided operation has no (successful) result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OneSidedError {
    /// The operation failed at the target or in the transport (bad key, out of bounds,
    /// no permission, misaligned, timeout...); the target's memory is untouched.
    Access {
        op: OpCode,
        node: NodeId,
        error: AccessError,
        signaled: bool,
    },
    /// Refused when queued, never posted: an unknown node, or more bytes than one
    /// operation may move (`ClusterConfig::max_onesided`).
    Invalid(AccessError),
    /// A READ needs `need` bytes of the worker's scratch slice and only `room` are left
    /// (none without [`Runtime::attach_scratch`]).
    NoScratch { need: usize, room: usize },
    /// Not completed yet, or the handle is not of the worker's current batch.
    NotReady,
    /// Unsignaled and not yet confirmed by a later signaled operation on its queue.
    Unconfirmed,
    /// An unsignaled CAS or FAA: its old value is not returned.
    NoValue,
    /// The query does not fit the operation (`read_result` of a CAS, for example).
    WrongKind,
    /// The flush failed before posting (its requests were refused, or the epoch
    /// changed); never executed.
    NotPosted,
    /// The node is not a member of the current configuration; never posted.
    NotMember(NodeId),
    /// The transport refused the whole post (a misuse; nothing of it was executed).
    Rejected(TransportError),
    /// Queued while a flush of this worker is in progress.
    FlushInProgress,
}

impl fmt::Display for OneSidedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OneSidedError::Access {
                op,
                node,
                error,
                signaled,
            } => {
                let s = if *signaled { "signaled" } else { "unsignaled" };
                write!(f, "{s} {op:?} on node {node} failed: {}", error.name())
            }
            OneSidedError::Invalid(e) => write!(f, "one-sided operation refused: {}", e.name()),
            OneSidedError::NoScratch { need, room } => {
                write!(f, "READ of {need} bytes: {room} bytes of scratch left")
            }
            OneSidedError::NotReady => write!(f, "one-sided result not ready"),
            OneSidedError::Unconfirmed => write!(f, "unsignaled operation not confirmed yet"),
            OneSidedError::NoValue => write!(f, "an unsignaled atomic returns no old value"),
            OneSidedError::WrongKind => write!(f, "query does not fit the operation"),
            OneSidedError::NotPosted => write!(f, "the flush failed before posting"),
            OneSidedError::NotMember(n) => {
                write!(f, "node {n} is not a member of the configuration")
            }
            OneSidedError::Rejected(e) => write!(f, "post refused: {e}"),
            OneSidedError::FlushInProgress => write!(f, "a flush of this coroutine is in progress"),
        }
    }
}

impl std::error::Error for OneSidedError {}

/// The verb of a queued operation, with its operands owned by the batch.
#[derive(Clone, Copy)]
enum Verb {
    /// `len` bytes into the worker's scratch slice at `at`.
    Read {
        len: u32,
        at: u64,
    },
    /// The bytes `off..off + len` of the worker's data arena.
    Write {
        off: u32,
        len: u32,
    },
    Cas {
        expected: u64,
        new: u64,
    },
    Faa {
        add: u64,
    },
}

impl Verb {
    fn opcode(self) -> OpCode {
        match self {
            Verb::Read { .. } => OpCode::Read,
            Verb::Write { .. } => OpCode::Write,
            Verb::Cas { .. } => OpCode::Cas,
            Verb::Faa { .. } => OpCode::Faa,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum OpState {
    Queued,
    /// Posted; `qseq` is its position on its node's queue.
    Posted,
    /// Completed (signaled), with the old word for CAS and FAA.
    Done(u64),
    Failed(AccessError),
    NotPosted,
    Rejected,
}

#[derive(Clone, Copy)]
struct QueuedOp {
    remote: RemoteAddr,
    verb: Verb,
    signaled: bool,
    state: OpState,
    qseq: u64,
}

/// One worker's operations. Reset when the worker queues the first operation of a
/// new batch (`WorkerBatch::ops` is 0 then); `gen` tells late completions of an older
/// batch apart. Its WRITE payloads are in `OneSided::data`, apart, so that the post
/// can borrow them while it updates the operations.
#[derive(Default)]
struct WorkerOps {
    gen: u32,
    ops: Vec<QueuedOp>,
    /// Signaled operations of the batch (what its flush waits for), and unsignaled
    /// READs (the only operations whose scratch a next batch may have to keep): counted
    /// as they are queued, so neither the flush nor the next batch scans for them.
    signaled: u32,
    unsignaled_reads: u32,
    /// Bytes of the worker's scratch slice taken: by this batch's READs, after those
    /// `held`.
    scratch_used: usize,
    /// Length of the worker's scratch slice (0 if it has none): worked out when a batch
    /// begins (and by `attach_scratch`), not per READ.
    scratch_len: usize,
    /// Unsignaled READs of earlier batches not confirmed yet: (node, queue position,
    /// end of their range in the slice).
    held: Vec<(NodeId, u64, usize)>,
    /// Unsignaled failures not yet reported to the worker.
    failures: Vec<OneSidedError>,
}

struct Scratch {
    id: RegionId,
    region: Region,
    per_worker: usize,
}

/// The runtime's one-sided state: scratch, every worker's operations, the per-node
/// queue positions used for passive ACK, and this step's post list.
#[derive(Default)]
pub(crate) struct OneSided {
    scratch: Option<Scratch>,
    workers: Vec<WorkerOps>,
    /// Per worker: its batch's WRITE payloads, copied at queue time (like inline data),
    /// so the caller's buffer need not outlive the call.
    data: Vec<Vec<u8>>,
    /// Workers whose operations go out with this step's post, in flush order.
    to_post: Vec<u16>,
    list: Vec<OneSidedOp<'static>>,
    /// Per target node: operations posted, and the last queue position confirmed (by a
    /// completion on that queue, or by the transport having nothing outstanding).
    posted: Vec<u64>,
    confirmed: Vec<u64>,
    /// Signaled operations posted and not completed.
    signaled_waiting: u64,
    /// Completions may be due: poll the completion queue at the next step.
    pub need_cq: bool,
    cq: Vec<Completion>,
    read_buf: Vec<u8>,
    /// Why the last refused post was refused.
    rejected: Option<TransportError>,
    /// Per target node: whether its operations timed out, and it was suspected, with
    /// none answered since.
    silence_reported: Vec<bool>,
}

/// Completions taken per `poll_cq` call, and calls per master step.
const CQ_BATCH: usize = 64;
const CQ_ROUNDS: usize = 4;

/// Reuses a vector's allocation for another lifetime (it is emptied first).
fn recycle<'a, 'b>(mut v: Vec<OneSidedOp<'a>>) -> Vec<OneSidedOp<'b>> {
    v.clear();
    v.into_iter().map(|_| unreachable!()).collect()
}

/// The length of worker `id`'s slice of `scratch` (0 if none or it does not fit).
fn slice_len(scratch: Option<&Scratch>, id: u16) -> usize {
    match scratch {
        Some(s) if (id as usize + 1) * s.per_worker <= s.region.mem.len() => s.per_worker,
        _ => 0,
    }
}

fn wr_id(gen: u32, worker: u16, idx: u16) -> u64 {
    (gen as u64) << 32 | (worker as u64) << 16 | idx as u64
}

impl OneSided {
    pub fn new(nodes: usize) -> OneSided {
        OneSided {
            posted: vec![0; nodes],
            confirmed: vec![0; nodes],
            silence_reported: vec![false; nodes],
            ..Default::default()
        }
    }

    /// Whether operations were flushed in this step and await the step's post.
    #[inline(always)]
    pub fn has_posts(&self) -> bool {
        !self.to_post.is_empty()
    }

    /// Starts worker `id`'s operations of a new batch. The unsignaled READs of earlier
    /// batches that are not confirmed yet keep their scratch ranges (the transport may
    /// still write them): the new batch's READs start after the last of them.
    fn begin_batch(&mut self, id: u16) {
        let i = id as usize;
        if self.workers.len() <= i {
            self.workers.resize_with(i + 1, WorkerOps::default);
            self.data.resize_with(i + 1, Vec::new);
        }
        let (w, confirmed) = (&mut self.workers[i], &self.confirmed);
        // Usually there is nothing to keep: skip the scans.
        if w.unsignaled_reads > 0 || !w.held.is_empty() {
            let done = |node: NodeId, qseq: u64| confirmed[node as usize] >= qseq;
            if w.unsignaled_reads > 0 {
                for o in &w.ops {
                    if let Verb::Read { len, at } = o.verb {
                        if !o.signaled && o.state == OpState::Posted && !done(o.remote.node, o.qseq)
                        {
                            w.held
                                .push((o.remote.node, o.qseq, at as usize + len as usize));
                        }
                    }
                }
            }
            w.held.retain(|&(n, q, _)| !done(n, q));
            w.scratch_used = w.held.iter().map(|h| h.2).max().unwrap_or(0);
        } else {
            w.scratch_used = 0;
        }
        w.scratch_len = slice_len(self.scratch.as_ref(), id);
        w.gen = w.gen.wrapping_add(1);
        w.ops.clear();
        w.signaled = 0;
        w.unsignaled_reads = 0;
        self.data[i].clear();
    }

    fn op(&self, worker: u16, h: OpHandle) -> Option<&QueuedOp> {
        self.workers.get(worker as usize)?.ops.get(h.0 as usize)
    }

    /// Whether the posted operation `op` is confirmed (completed on its queue).
    fn is_confirmed(&self, op: &QueuedOp) -> bool {
        self.confirmed
            .get(op.remote.node as usize)
            .is_some_and(|&c| op.qseq <= c)
    }
}

impl State {
    /// Queues an operation of worker `id` (checked by the caller, except its phase).
    /// Inlined into each `Ctx::queue_*`, where `verb` is known, so the matches on it
    /// fold away.
    #[inline(always)]
    fn queue_op(
        &mut self,
        id: u16,
        remote: RemoteAddr,
        verb: Verb,
        signaled: bool,
        data: &[u8],
    ) -> Result<OpHandle, OneSidedError> {
        if remote.node >= self.cluster.nodes {
            return Err(OneSidedError::Invalid(AccessError::UnknownNode));
        }
        if !self.member(remote.node) {
            return Err(OneSidedError::NotMember(remote.node));
        }
        let epoch = self.epoch;
        let b = &mut self.workers.batches[id as usize];
        match b.phase {
            Phase::Building => {}
            Phase::Done => b.reset(),
            Phase::WaitCredit | Phase::InFlight => return Err(OneSidedError::FlushInProgress),
        }
        if b.ops == 0 && b.reqs.is_empty() {
            b.epoch = if b.bound != 0 { b.bound } else { epoch };
        }
        if b.ops == u16::MAX {
            return Err(OneSidedError::Invalid(AccessError::TooLarge));
        }
        if b.ops == 0 {
            self.onesided.begin_batch(id);
        }
        let w = &mut self.onesided.workers[id as usize];
        let verb = match verb {
            Verb::Read { len, .. } => {
                // What is left of the worker's slice of the scratch region.
                let room = w.scratch_len.saturating_sub(w.scratch_used);
                if len as usize > room {
                    return Err(OneSidedError::NoScratch {
                        need: len as usize,
                        room,
                    });
                }
                let at = w.scratch_used as u64;
                w.scratch_used += len as usize;
                Verb::Read { len, at }
            }
            Verb::Write { .. } => {
                let wd = &mut self.onesided.data[id as usize];
                let off = wd.len() as u32;
                wd.extend_from_slice(data);
                Verb::Write {
                    off,
                    len: data.len() as u32,
                }
            }
            v => v,
        };
        let idx = w.ops.len() as u16;
        // Branches, not two flag additions, which the compiler vectorises (longer).
        if signaled {
            w.signaled += 1;
        } else if matches!(verb, Verb::Read { .. }) {
            w.unsignaled_reads += 1;
        }
        w.ops.push(QueuedOp {
            remote,
            verb,
            signaled,
            state: OpState::Queued,
            qseq: 0,
        });
        b.ops += 1;
        Ok(OpHandle(idx))
    }

    /// Worker `id`'s flush sends its operations with this step's post; its batch waits
    /// for the signaled ones.
    pub(crate) fn flush_ops(&mut self, id: u16) {
        let signaled = self.onesided.workers[id as usize].signaled;
        self.workers.batches[id as usize].pending += signaled;
        self.onesided.to_post.push(id);
    }

    /// The flush of worker `id` failed before posting: its operations never run.
    pub(crate) fn drop_ops(&mut self, id: u16) {
        if self.workers.batches[id as usize].ops > 0 {
            for o in self.onesided.workers[id as usize].ops.iter_mut() {
                o.state = OpState::NotPosted;
            }
        }
    }

    /// Posts the operations flushed in this step with one doorbell.
    pub(crate) fn post_ops(&mut self, ep: &mut dyn Endpoint) {
        let os = &mut self.onesided;
        let stats = &mut self.stats;
        let (scratch, per) = os.scratch.as_ref().map_or((0, 0), |s| (s.id, s.per_worker));
        let mut list: Vec<OneSidedOp<'_>> = recycle(std::mem::take(&mut os.list));
        // One pass: each operation's queue position (for passive ACK), the counters, and
        // its work request, which borrows its WRITE payload from `os.data`.
        for &id in &os.to_post {
            let w = &mut os.workers[id as usize];
            let data = &os.data[id as usize];
            os.signaled_waiting += w.signaled as u64;
            let gen = w.gen;
            // `extend` over an exact-size iterator reserves once per worker.
            list.extend(w.ops.iter_mut().enumerate().map(|(i, o)| {
                let posted = &mut os.posted[o.remote.node as usize];
                *posted += 1;
                o.qseq = *posted;
                o.state = OpState::Posted;
                let kind = match o.verb {
                    Verb::Read { len, at } => {
                        stats.onesided_reads += 1;
                        OneSidedKind::Read {
                            len,
                            dest: LocalBuf {
                                region: scratch,
                                offset: (id as usize * per) as u64 + at,
                            },
                        }
                    }
                    Verb::Write { off, len } => {
                        stats.onesided_writes += 1;
                        OneSidedKind::Write {
                            data: &data[off as usize..(off + len) as usize],
                        }
                    }
                    Verb::Cas { expected, new } => {
                        stats.onesided_cas += 1;
                        OneSidedKind::Cas { expected, new }
                    }
                    Verb::Faa { add } => {
                        stats.onesided_faa += 1;
                        OneSidedKind::Faa { add }
                    }
                };
                OneSidedOp {
                    wr_id: wr_id(gen, id, i as u16),
                    remote: o.remote,
                    kind,
                    signaled: o.signaled,
                }
            }));
        }
        let r = ep.post(&list);
        os.list = recycle(list);
        os.need_cq = true;
        if let Err(e) = r {
            // Checked at queue time, so only a misuse gets here; nothing was posted.
            self.stats.send_errors += 1;
            self.reject_posts(e);
        } else {
            // Workers waiting for no signaled operation (and no response) go on at the
            // next step: their operations are posted.
            for &id in &self.onesided.to_post {
                if self.workers.batches[id as usize].pending == 0 {
                    self.workers.make_ready(id);
                }
            }
        }
        self.onesided.to_post.clear();
    }

    /// The whole post was refused: every operation of it fails, and its workers resume.
    #[cold]
    fn reject_posts(&mut self, e: TransportError) {
        let os = &mut self.onesided;
        os.rejected = Some(e.clone());
        for &id in &os.to_post {
            let w = &mut os.workers[id as usize];
            let b = &mut self.workers.batches[id as usize];
            for o in w.ops.iter_mut() {
                o.state = OpState::Rejected;
                os.posted[o.remote.node as usize] -= 1;
                self.stats.onesided_failed += 1;
                if o.signaled {
                    os.signaled_waiting -= 1;
                    b.settled(id, 1, &mut self.workers.ready);
                } else {
                    self.stats.onesided_unsignaled_failed += 1;
                    w.failures.push(OneSidedError::Rejected(e.clone()));
                    b.unsignaled_failed += 1;
                }
            }
            if b.pending == 0 && !b.in_ready {
                b.in_ready = true;
                self.workers.ready.push(id);
            }
        }
    }

    /// Polls the completion queue and routes each completion to its operation.
    pub(crate) fn poll_completions(&mut self, ep: &mut dyn Endpoint) {
        let mut cq = std::mem::take(&mut self.onesided.cq);
        // Read before draining: if nothing was in flight then, every posted operation's
        // completion (the failed ones') is already queued and this drain sees it. Read
        // after, a completion arriving between the drain and the read would be missed
        // while its operation counted as confirmed.
        let idle_before = ep.outstanding() == 0;
        // A bounded amount per step, as for datagrams; the rest waits for the next one.
        let mut full = false;
        for _ in 0..CQ_ROUNDS {
            cq.clear();
            let n = ep.poll_cq(CQ_BATCH, &mut cq);
            for c in &cq {
                self.on_completion(c);
            }
            full = n == CQ_BATCH;
            if !full {
                break;
            }
        }
        self.onesided.cq = cq;
        let os = &mut self.onesided;
        if full {
            os.need_cq = true;
            return;
        }
        if idle_before {
            // Nothing was in flight: every posted operation has completed, and the
            // failed ones have had their completions (just drained).
            os.confirmed.copy_from_slice(&os.posted);
        }
        os.need_cq = os.signaled_waiting > 0 || ep.outstanding() > 0;
    }

    /// Notes whether node `node` answered an operation. A one-sided `Timeout` is the
    /// NIC's give-up (each backend's retry budget is the RPC give-up time), so its
    /// target is suspected as an RPC destination silent that long is
    /// ([`State::report_suspect`]): once per silence, since one-sided presets may send
    /// the target no RPC at all.
    fn note_answer(&mut self, node: NodeId, status: Result<(), AccessError>) {
        let Some(reported) = self.onesided.silence_reported.get_mut(node as usize) else {
            return;
        };
        if status != Err(AccessError::Timeout) {
            // Any other outcome, an error included, came from the target's NIC.
            *reported = false;
        } else if !*reported {
            *reported = true;
            self.report_suspect(node);
        }
    }

    fn on_completion(&mut self, c: &Completion) {
        self.note_answer(c.node, c.status);
        let (gen, id, idx) = (
            (c.wr_id >> 32) as u32,
            (c.wr_id >> 16) as u16,
            c.wr_id as u16,
        );
        let os = &mut self.onesided;
        let Some(w) = os.workers.get_mut(id as usize) else {
            self.stats.onesided_stray += 1;
            if c.status.is_err() {
                self.stats.onesided_failed += 1;
            }
            return;
        };
        let current = w.gen == gen;
        let op = w
            .ops
            .get_mut(idx as usize)
            .filter(|o| current && o.state == OpState::Posted && o.verb.opcode() == c.op);
        let Some(op) = op else {
            // Not an operation of the worker's current batch. Signaled operations are
            // always waited for, so this is a late failure of an unsignaled one of an
            // older batch: still reported to its worker.
            match c.status {
                Err(error) => {
                    let e = OneSidedError::Access {
                        op: c.op,
                        node: c.node,
                        error,
                        signaled: false,
                    };
                    self.stats.onesided_failed += 1;
                    self.stats.onesided_unsignaled_failed += 1;
                    w.failures.push(e);
                    self.workers.batches[id as usize].unsignaled_failed += 1;
                }
                Ok(()) => self.stats.onesided_stray += 1,
            }
            return;
        };
        let n = op.remote.node as usize;
        // Completions of one queue arrive in order: this one confirms every earlier
        // operation on the queue (passive ACK).
        os.confirmed[n] = os.confirmed[n].max(op.qseq);
        let b = &mut self.workers.batches[id as usize];
        match c.status {
            Ok(()) => op.state = OpState::Done(c.value),
            Err(error) => {
                op.state = OpState::Failed(error);
                self.stats.onesided_failed += 1;
                if !op.signaled {
                    self.stats.onesided_unsignaled_failed += 1;
                    w.failures.push(OneSidedError::Access {
                        op: c.op,
                        node: op.remote.node,
                        error,
                        signaled: false,
                    });
                    b.unsignaled_failed += 1;
                }
            }
        }
        if op.signaled {
            os.signaled_waiting -= 1;
            b.settled(id, 1, &mut self.workers.ready);
        }
    }

    /// Worker `id`'s unsignaled failures not yet reported (cleared).
    pub(crate) fn take_unsignaled_failures(&mut self, id: u16) -> Vec<OneSidedError> {
        self.workers.batches[id as usize].unsignaled_failed = 0;
        match self.onesided.workers.get_mut(id as usize) {
            Some(w) => std::mem::take(&mut w.failures),
            None => Vec::new(),
        }
    }

    /// Gives worker `id` back unsignaled failures it took but cannot report itself:
    /// its next flush (or `take_unsignaled_failures`) reports them again.
    pub(crate) fn requeue_unsignaled_failures(&mut self, id: u16, v: Vec<OneSidedError>) {
        if v.is_empty() {
            return;
        }
        let Some(w) = self.onesided.workers.get_mut(id as usize) else {
            return;
        };
        self.workers.batches[id as usize].unsignaled_failed += v.len() as u32;
        w.failures.extend(v);
    }

    /// The outcome of operation `h` of worker `id`'s current batch: the old word for
    /// CAS and FAA (0 otherwise).
    fn op_outcome(&self, id: u16, h: OpHandle) -> Result<(QueuedOp, u64), OneSidedError> {
        let b = &self.workers.batches[id as usize];
        if h.0 >= b.ops {
            return Err(OneSidedError::NotReady);
        }
        let op = *self.onesided.op(id, h).ok_or(OneSidedError::NotReady)?;
        let fail = |error| OneSidedError::Access {
            op: op.verb.opcode(),
            node: op.remote.node,
            error,
            signaled: op.signaled,
        };
        match op.state {
            OpState::Done(v) => Ok((op, v)),
            OpState::Failed(e) => Err(fail(e)),
            OpState::Queued => Err(OneSidedError::NotReady),
            OpState::NotPosted => Err(OneSidedError::NotPosted),
            OpState::Rejected => Err(OneSidedError::Rejected(
                self.onesided
                    .rejected
                    .clone()
                    .unwrap_or(TransportError::Config(String::new())),
            )),
            OpState::Posted if op.signaled => Err(OneSidedError::NotReady),
            OpState::Posted if self.onesided.is_confirmed(&op) => match op.verb {
                Verb::Cas { .. } | Verb::Faa { .. } => Err(OneSidedError::NoValue),
                _ => Ok((op, 0)),
            },
            OpState::Posted => Err(OneSidedError::Unconfirmed),
        }
    }
}

impl Runtime {
    /// Gives the runtime a registered region of its own node as the destination of its
    /// workers' READs: worker i gets bytes `[i * per_worker, (i + 1) * per_worker)` (a
    /// worker whose slice does not fit gets [`OneSidedError::NoScratch`]). Replaces any
    /// earlier one; call it before workers queue READs.
    pub fn attach_scratch(&mut self, region: Region, per_worker: usize) -> Result<(), RpcError> {
        let mut core = self.core.borrow_mut();
        let st = &mut core.st;
        if region.desc.node != st.me.node {
            return Err(RpcError::Config(format!(
                "scratch region of node {} given to a runtime of node {}",
                region.desc.node, st.me.node
            )));
        }
        let os = &mut st.onesided;
        os.scratch = Some(Scratch {
            id: region.id(),
            region,
            per_worker,
        });
        // Batches being built see the new slice at once, as when it was looked up per
        // READ.
        for (i, w) in os.workers.iter_mut().enumerate() {
            w.scratch_len = slice_len(os.scratch.as_ref(), i as u16);
        }
        Ok(())
    }
}

impl Ctx {
    /// Queues a READ of `len` bytes at `remote` into this worker's scratch slice (no
    /// I/O); read them after the flush with [`Ctx::read_result`].
    pub fn queue_read(
        &self,
        remote: RemoteAddr,
        len: u32,
        signaled: bool,
    ) -> Result<OpHandle, OneSidedError> {
        let mut core = self.core.borrow_mut();
        let st = &mut core.st;
        if len as usize > st.cluster.max_onesided {
            return Err(OneSidedError::Invalid(AccessError::TooLarge));
        }
        st.queue_op(self.id, remote, Verb::Read { len, at: 0 }, signaled, &[])
    }

    /// Queues a WRITE of `data` (copied now) to `remote`.
    pub fn queue_write(
        &self,
        remote: RemoteAddr,
        data: &[u8],
        signaled: bool,
    ) -> Result<OpHandle, OneSidedError> {
        let mut core = self.core.borrow_mut();
        let st = &mut core.st;
        if data.len() > st.cluster.max_onesided {
            return Err(OneSidedError::Invalid(AccessError::TooLarge));
        }
        let verb = Verb::Write { off: 0, len: 0 };
        st.queue_op(self.id, remote, verb, signaled, data)
    }

    /// Queues an 8-byte compare-and-swap at `remote` (8-byte aligned); a signaled one's
    /// old word comes from [`Ctx::atomic_result`].
    pub fn queue_cas(
        &self,
        remote: RemoteAddr,
        expected: u64,
        new: u64,
        signaled: bool,
    ) -> Result<OpHandle, OneSidedError> {
        let verb = Verb::Cas { expected, new };
        self.core
            .borrow_mut()
            .st
            .queue_op(self.id, remote, verb, signaled, &[])
    }

    /// Queues an 8-byte fetch-and-add at `remote` (8-byte aligned).
    pub fn queue_faa(
        &self,
        remote: RemoteAddr,
        add: u64,
        signaled: bool,
    ) -> Result<OpHandle, OneSidedError> {
        let verb = Verb::Faa { add };
        self.core
            .borrow_mut()
            .st
            .queue_op(self.id, remote, verb, signaled, &[])
    }

    /// Whether operation `h` completed successfully (for any verb; an unsignaled one
    /// once confirmed).
    pub fn op_result(&self, h: OpHandle) -> Result<(), OneSidedError> {
        let core = self.core.borrow();
        match core.st.op_outcome(self.id, h) {
            Ok(_) | Err(OneSidedError::NoValue) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Runs `f` on the bytes READ `h` fetched (a copy out of the scratch region).
    pub fn read_result<R>(
        &self,
        h: OpHandle,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, OneSidedError> {
        let mut core = self.core.borrow_mut();
        let st = &mut core.st;
        let (op, _) = st.op_outcome(self.id, h)?;
        let Verb::Read { len, at } = op.verb else {
            return Err(OneSidedError::WrongKind);
        };
        let os = &mut st.onesided;
        let scratch = os.scratch.as_ref().ok_or(OneSidedError::NotReady)?;
        os.read_buf.resize(len as usize, 0);
        let at = (self.id as usize * scratch.per_worker) as u64 + at;
        if !scratch.region.mem.read(at, &mut os.read_buf) {
            return Err(OneSidedError::NoScratch {
                need: len as usize,
                room: 0,
            });
        }
        Ok(f(&os.read_buf))
    }

    /// The old word of CAS or FAA `h` (signaled: an unsignaled one returns none).
    pub fn atomic_result(&self, h: OpHandle) -> Result<u64, OneSidedError> {
        let core = self.core.borrow();
        let (op, v) = core.st.op_outcome(self.id, h)?;
        match op.verb {
            Verb::Cas { .. } | Verb::Faa { .. } => Ok(v),
            _ => Err(OneSidedError::WrongKind),
        }
    }

    /// This worker's unsignaled operations that failed and were not reported yet (by a
    /// flush or an earlier call); reporting clears them.
    pub fn take_unsignaled_failures(&self) -> Vec<OneSidedError> {
        self.core.borrow_mut().st.take_unsignaled_failures(self.id)
    }

    /// Puts back failures taken from a flush's `RpcError::UnsignaledFailed` (or from
    /// [`Ctx::take_unsignaled_failures`]) that this caller does not report: a helper
    /// whose own operation succeeded must not fail because of the worker's earlier
    /// unsignaled operations, nor drop their failures. The next flush reports them.
    pub fn requeue_unsignaled_failures(&self, v: Vec<OneSidedError>) {
        self.core
            .borrow_mut()
            .st
            .requeue_unsignaled_failures(self.id, v)
    }
}
