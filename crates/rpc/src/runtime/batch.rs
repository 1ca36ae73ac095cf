//! A worker's batch: the requests it queued since its last flush and, once they are in,
//! their responses. Payloads are kept as group items (`wire::extend_item`), so a flush
//! copies them into datagrams as they are; buffers keep their capacity across batches,
//! so a steady state allocates nothing.

use crate::config::RpcError;
use crate::wire;
use ambidex_transport::EndpointAddr;

/// A queued request of the current batch, returned by [`Ctx::queue`](super::Ctx::queue).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReqHandle(pub(crate) u16);

/// Where a worker's batch is between `queue` and the end of its flush.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Phase {
    Building,
    WaitCredit,
    InFlight,
    Done,
}

/// The settled statuses have the values of their wire statuses, so that reading one
/// off the wire is a range check.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub(crate) enum ReqStatus {
    Ok = wire::STATUS_OK,
    NoHandler = wire::STATUS_NO_HANDLER,
    TooLarge = wire::STATUS_TOO_LARGE,
    /// Not settled yet.
    Queued,
    Failed,
    /// Failed by a change of epoch ([`RpcError::EpochChanged`]).
    EpochChanged,
}

impl ReqStatus {
    /// Settled without a response.
    #[inline(always)]
    pub fn failed(self) -> bool {
        matches!(self, ReqStatus::Failed | ReqStatus::EpochChanged)
    }
}

/// The response status of a record tag (None: no such status).
#[inline(always)]
pub(crate) fn status_of(tag: u8) -> Option<ReqStatus> {
    match tag {
        wire::STATUS_OK => Some(ReqStatus::Ok),
        wire::STATUS_NO_HANDLER => Some(ReqStatus::NoHandler),
        wire::STATUS_TOO_LARGE => Some(ReqStatus::TooLarge),
        _ => None,
    }
}

/// The endpoint of dense index `d` in a cluster of `threads` threads per node.
#[inline]
pub(crate) fn endpoint_of(d: usize, threads: usize) -> EndpointAddr {
    EndpointAddr::new((d / threads) as u16, (d % threads) as u16)
}

/// One request of a batch: where its payload is in the request arena and, once in,
/// where its response is in the response arena.
#[derive(Clone, Copy)]
#[repr(align(32))] // a power-of-two stride: indexing is a shift
pub(crate) struct QueuedRequest {
    pub dest: u32,
    pub rtype: u8,
    pub status: ReqStatus,
    /// Next request of its group: request `next` of worker `next_worker` (queued as the
    /// next request of the batch; a flush that groups otherwise, or another worker's
    /// batch joining the group, rewrites it). Not followed past a group's last request.
    pub next: u16,
    pub next_worker: u16,
    pub off: u32,
    pub len: u32,
    pub roff: u32,
    pub rlen: u32,
}

/// A worker coroutine's batch.
pub(crate) struct WorkerBatch {
    pub reqs: Vec<QueuedRequest>,
    pub arena: Vec<u8>,
    /// Responses of the batch, appended as they come in (each request gets at most one).
    pub rarena: Vec<u8>,
    pub pending: u32,
    /// Requests of the batch settled as failed.
    pub failed: u32,
    pub phase: Phase,
    pub in_ready: bool,
    pub waiting_credit: bool,
    /// Destination of the batch's first request; `multi` once another one joins.
    pub dest0: u32,
    pub multi: bool,
    /// Some request of the batch needs segments.
    pub big: bool,
    /// One-sided operations queued in the batch (kept in `OneSided`).
    pub ops: u16,
    /// Unsignaled operations of this worker that failed and were not reported yet
    /// (their details are in `OneSided`): the next flush reports them.
    pub unsignaled_failed: u32,
    /// The epoch its first request or operation was queued in: a batch of an older
    /// epoch is failed, never sent.
    pub epoch: u32,
    /// The epoch the coroutine works for ([`Ctx::bind_epoch`](super::Ctx::bind_epoch);
    /// 0: the runtime's, whatever it is when a batch starts).
    pub bound: u32,
}

impl WorkerBatch {
    pub fn new() -> WorkerBatch {
        WorkerBatch {
            reqs: Vec::new(),
            arena: Vec::new(),
            rarena: Vec::new(),
            pending: 0,
            failed: 0,
            phase: Phase::Building,
            in_ready: false,
            waiting_credit: false,
            dest0: 0,
            multi: false,
            big: false,
            ops: 0,
            unsignaled_failed: 0,
            epoch: 0,
            bound: 0,
        }
    }

    /// Starts a new batch after a finished flush (buffers keep their capacity).
    #[inline(always)]
    pub fn reset(&mut self) {
        self.reqs.clear();
        self.arena.clear();
        self.rarena.clear();
        self.failed = 0;
        self.ops = 0;
        self.phase = Phase::Building;
    }

    /// Queues a request of worker `id` to endpoint index `d`; a payload above
    /// `group_cap` will travel alone, in segments. The caller checked the message limit.
    #[inline(always)]
    pub fn push(
        &mut self,
        id: u16,
        d: u32,
        rtype: u8,
        payload: &[u8],
        group_cap: usize,
        threads: usize,
    ) -> Result<ReqHandle, RpcError> {
        match self.phase {
            Phase::Building => {}
            Phase::Done => self.reset(),
            Phase::WaitCredit | Phase::InFlight => return Err(RpcError::FlushInProgress),
        }
        let idx = self.reqs.len();
        if idx >= u16::MAX as usize {
            return Err(RpcError::BatchTooLarge {
                dest: endpoint_of(d as usize, threads),
                datagrams: idx,
                requests: idx,
            });
        }
        if idx == 0 {
            self.dest0 = d;
            self.multi = false;
            self.big = false;
        } else if d != self.dest0 {
            self.multi = true;
        }
        if payload.len() > group_cap {
            self.big = true;
            // Offsets into the arena are u32. Only large requests can reach that: below
            // u16::MAX requests of at most one datagram each stay far under 4 GiB.
            if self.arena.len() + wire::ITEM_HDR + payload.len() > u32::MAX as usize {
                return Err(RpcError::BatchTooLarge {
                    dest: endpoint_of(d as usize, threads),
                    datagrams: idx,
                    requests: idx + 1,
                });
            }
        }
        // The arena holds each request as a group item, ready to be copied; the batch's
        // first starts a part of whatever group it goes into.
        let off = wire::extend_item(&mut self.arena, rtype, payload, idx == 0);
        self.reqs.push(QueuedRequest {
            dest: d,
            rtype,
            status: ReqStatus::Queued,
            next: idx as u16 + 1,
            next_worker: id,
            off: off as u32,
            len: payload.len() as u32,
            roff: 0,
            rlen: 0,
        });
        Ok(ReqHandle(idx as u16))
    }

    /// Counts `n` settled requests out of the batch (of worker `id`); queues the worker
    /// on `ready` once its batch is complete.
    #[inline(always)]
    pub fn settled(&mut self, id: u16, n: u32, ready: &mut Vec<u16>) {
        self.pending -= n;
        if self.pending == 0 && !self.in_ready {
            self.in_ready = true;
            ready.push(id);
        }
    }

    /// Why the batch's first failed request failed, if one did.
    pub fn timeout(&self, threads: usize) -> Option<RpcError> {
        let q = self.reqs.iter().find(|q| q.status.failed())?;
        Some(match q.status {
            ReqStatus::EpochChanged => RpcError::EpochChanged,
            _ => RpcError::Timeout {
                dest: endpoint_of(q.dest as usize, threads),
            },
        })
    }

    /// The response to request `h`, or why there is none.
    #[inline]
    pub fn response(&self, h: ReqHandle, threads: usize) -> Result<&[u8], RpcError> {
        let Some(q) = self.reqs.get(h.0 as usize) else {
            return Err(RpcError::NotReady);
        };
        match q.status {
            ReqStatus::Ok => Ok(&self.rarena[q.roff as usize..(q.roff + q.rlen) as usize]),
            ReqStatus::NoHandler => Err(RpcError::NoHandler { rtype: q.rtype }),
            ReqStatus::TooLarge => Err(RpcError::ResponseTooLarge),
            ReqStatus::Failed => Err(RpcError::Timeout {
                dest: endpoint_of(q.dest as usize, threads),
            }),
            ReqStatus::EpochChanged => Err(RpcError::EpochChanged),
            ReqStatus::Queued => Err(RpcError::NotReady),
        }
    }
}

/// Every worker's batch, and the queues of workers to resume: `ready` (resumed at the
/// next step) and `credit_waiters` (made ready when a credit returns).
#[derive(Default)]
pub(crate) struct Workers {
    pub batches: Vec<WorkerBatch>,
    pub ready: Vec<u16>,
    pub credit_waiters: Vec<u16>,
    /// Workers in [`Ctx::pause`](crate::Ctx::pause) or [`Ctx::idle`](crate::Ctx::idle):
    /// resumed at the next step that reads the clock, and not counted as work.
    pub paused: Vec<u16>,
    /// How many of `paused` are in `pause` (they cap a park at `PAUSE_PARK`; the
    /// others wait for the doorbell).
    pub pausing: u32,
}

impl Workers {
    /// Queues worker `id` for the next step (once).
    pub fn make_ready(&mut self, id: u16) {
        let b = &mut self.batches[id as usize];
        if !b.in_ready {
            b.in_ready = true;
            self.ready.push(id);
        }
    }

    /// Parks worker `id` until a credit returns.
    pub fn wait_credit(&mut self, id: u16) {
        let b = &mut self.batches[id as usize];
        b.phase = Phase::WaitCredit;
        if !b.waiting_credit {
            b.waiting_credit = true;
            self.credit_waiters.push(id);
        }
    }

    /// A credit came back: every worker waiting for one tries its flush again.
    #[inline(never)]
    pub fn wake_credit_waiters(&mut self) {
        for &w in self.credit_waiters.iter() {
            let b = &mut self.batches[w as usize];
            b.waiting_credit = false;
            if !b.in_ready {
                b.in_ready = true;
                self.ready.push(w);
            }
        }
        self.credit_waiters.clear();
    }
}
