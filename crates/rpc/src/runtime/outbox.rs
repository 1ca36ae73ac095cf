//! The one encoder of outgoing datagrams: flushes, responses and retransmissions all
//! build their records here, per destination endpoint, in place, and a master step
//! sends whatever was built with one doorbell ([`Outbox::send`]). Keeping every writer
//! on one encoder keeps one set of packing rules (records per datagram, the MTU, which
//! records may share a datagram) instead of one per caller.

use crate::wire::{self, Seg};
use ambidex_transport::{Datagram, Endpoint, EndpointAddr, TransportError};

/// What a datagram may be coalesced with: its kind and session (never NO_KEY).
#[inline(always)]
pub(crate) fn open_key(kind: u8, session: u32) -> u64 {
    (kind as u64) << 32 | session as u64
}

/// `DestOutbox::open_key` when no datagram is open.
const NO_KEY: u64 = u64::MAX;
/// No open datagram (`DestOutbox::open`) or no open group (`OpenGroup::pos`).
pub(crate) const NONE: usize = usize::MAX;
/// The open datagram has no credit slot (`DestOutbox::cur_slot`): no flush opened it.
pub(crate) const NO_SLOT: u16 = u16::MAX;

/// Bytes of an endpoint's outgoing buffer kept between steps (beyond, it is freed).
const SHRINK_TX_ABOVE: usize = 1 << 20;

/// How records are cut: one record up to `single_cap` bytes, else segments of
/// `seg_payload` bytes; the MTU, and whether records to one endpoint share datagrams.
#[derive(Clone, Copy, Default)]
pub(crate) struct SendLimits {
    pub single_cap: usize,
    /// Largest request that travels in a group (one item in a fresh datagram); larger
    /// ones are sent alone, in segments.
    pub group_cap: usize,
    pub seg_payload: usize,
    pub mtu: usize,
    pub coalesce: bool,
}

/// The last group built in the open datagram to one endpoint. Later requests of the
/// same flush, or later whole batches (as parts), join it while it is the datagram's
/// last record.
#[derive(Clone, Copy)]
pub(crate) struct OpenGroup {
    /// Its record's position in the buffer (NONE if there is none).
    pub pos: usize,
    /// The flush (`RpcStats::flushes` at the time) that built it.
    pub flush: u64,
    pub seq: u64,
    pub count: u8,
    /// Body bytes.
    pub len: usize,
    pub parts: u8,
    /// Its last request: request `last` of worker `worker`.
    pub last: u16,
    pub worker: u16,
}

/// Outgoing datagrams to one endpoint, built in place. The record count of the open
/// datagram is kept in `open_count` and written into its header when it is closed.
pub(crate) struct DestOutbox {
    /// Zero-initialised scratch; `len` bytes of it are in use.
    pub buf: Vec<u8>,
    pub len: usize,
    bounds: Vec<(u32, u32)>,
    pub open: usize,
    /// `open_key(kind, session)` of the open datagram; NO_KEY if none is open.
    open_key: u64,
    pub open_count: usize,
    /// Credit slot of the open request datagram (NO_SLOT if it has none).
    pub cur_slot: u16,
    touched: bool,
    pub group: OpenGroup,
}

impl Default for DestOutbox {
    fn default() -> Self {
        DestOutbox {
            buf: Vec::new(),
            len: 0,
            bounds: Vec::new(),
            open: NONE,
            open_key: NO_KEY,
            open_count: 0,
            cur_slot: NO_SLOT,
            touched: false,
            group: OpenGroup {
                pos: NONE,
                flush: 0,
                seq: 0,
                count: 0,
                len: 0,
                parts: 0,
                last: 0,
                worker: 0,
            },
        }
    }
}

impl DestOutbox {
    #[inline]
    fn close(&mut self) {
        if self.open != NONE {
            self.buf[self.open + 3] = self.open_count as u8;
            self.bounds.push((self.open as u32, self.len as u32));
            self.open = NONE;
            self.open_key = NO_KEY;
        }
        self.group.pos = NONE;
    }

    /// Whether a record of `rec_len` bytes can join the open datagram, whose kind and
    /// session make `key`.
    #[inline(always)]
    pub fn has_room(&self, key: u64, rec_len: usize, mtu: usize) -> bool {
        self.open_key == key
            && self.open_count < wire::MAX_RECORDS
            && self.len - self.open + rec_len <= mtu
    }

    /// Whether a request of `item` bytes (header included) of flush `flush` can join the
    /// group that flush is building.
    #[inline(always)]
    pub fn joins_group(&self, flush: u64, item: usize, mtu: usize) -> bool {
        self.group.flush == flush && self.group_has_room(1, item, mtu)
    }

    /// Whether `n` more items of `bytes` bytes (headers included) fit the last group
    /// built in the open datagram, which is still its last record.
    #[inline(always)]
    pub fn group_has_room(&self, n: usize, bytes: usize, mtu: usize) -> bool {
        self.group.pos != NONE
            && self.len == self.group.pos + wire::REC_HDR + self.group.len
            && self.group.count as usize + n <= wire::MAX_ITEMS
            && self.len - self.open + bytes <= mtu
    }

    /// Appends items (`body`, `n` of them) to the last group (see `group_has_room`) and
    /// rewrites its header.
    #[inline(always)]
    pub fn grow_group(&mut self, n: usize, body: &[u8]) {
        let at = self.len;
        // In bounds: `open_new` sized the buffer for a whole datagram.
        self.buf[at..at + body.len()].copy_from_slice(body);
        self.len += body.len();
        let g = &mut self.group;
        g.len += body.len();
        g.count += n as u8;
        wire::write_group_header(&mut self.buf, g.pos, g.seq, g.count, g.len as u16);
    }

    /// Writes a group record of `count` items (copied from `body`) at the end of the
    /// open datagram (which `ensure` sized) and makes it the last group (one part, built
    /// by flush `flush` of worker `worker`, whose request `last` it ends with).
    #[inline(always)]
    pub fn put_group(
        &mut self,
        seq: u64,
        count: u8,
        body: &[u8],
        flush: u64,
        worker: u16,
        last: u16,
    ) {
        let pos = self.len;
        let end = pos + wire::REC_HDR + body.len();
        wire::write_group_header(&mut self.buf, pos, seq, count, body.len() as u16);
        self.buf[pos + wire::REC_HDR..end].copy_from_slice(body);
        self.len = end;
        self.open_count += 1;
        self.group = OpenGroup {
            pos,
            flush,
            seq,
            count,
            len: body.len(),
            parts: 1,
            last,
            worker,
        };
    }

    /// Makes room for `n` more bytes.
    #[inline(always)]
    fn room(&mut self, n: usize) {
        if self.len + n > self.buf.len() {
            self.grow(n);
        }
    }

    #[inline(never)]
    fn grow(&mut self, n: usize) {
        let want = (self.len + n).max(2 * self.buf.len()).max(4096);
        self.buf.resize(want, 0);
    }
}

/// This step's outgoing datagrams, per destination endpoint (dense index).
#[derive(Default)]
pub(crate) struct Outbox {
    pub limits: SendLimits,
    pub per: Vec<DestOutbox>,
    touched: Vec<u32>,
    list: Vec<Datagram<'static>>,
}

/// Reuses a vector's allocation for another lifetime (it is emptied first).
fn recycle<'a, 'b>(mut v: Vec<Datagram<'a>>) -> Vec<Datagram<'b>> {
    v.clear();
    v.into_iter().map(|_| unreachable!()).collect()
}

impl Outbox {
    pub fn new(limits: SendLimits, endpoints: usize) -> Outbox {
        Outbox {
            limits,
            per: (0..endpoints).map(|_| DestOutbox::default()).collect(),
            ..Default::default()
        }
    }

    /// Ensures an open datagram to `d` with room for a record of `rec_len` bytes; returns
    /// true if a new datagram was opened. `alone` forces a fresh datagram (segments).
    #[inline(always)]
    pub fn ensure(
        &mut self,
        d: usize,
        kind: u8,
        session: u32,
        ack: u64,
        rec_len: usize,
        alone: bool,
    ) -> bool {
        let lim = self.limits;
        if lim.coalesce && !alone && self.per[d].has_room(open_key(kind, session), rec_len, lim.mtu)
        {
            return false;
        }
        self.open_new(d, kind, session, ack);
        true
    }

    #[inline(never)]
    pub fn open_new(&mut self, d: usize, kind: u8, session: u32, ack: u64) {
        let t = &mut self.per[d];
        t.close();
        if !t.touched {
            t.touched = true;
            self.touched.push(d as u32);
        }
        // Room for a whole datagram: records pushed into it need no check of their own.
        t.room(self.limits.mtu);
        t.open = t.len;
        wire::write_header(&mut t.buf, t.len, kind, session, ack);
        t.len += wire::DGRAM_HDR;
        t.open_key = open_key(kind, session);
        t.open_count = 0;
        t.cur_slot = NO_SLOT;
    }

    #[inline(always)]
    fn push(&mut self, d: usize, seq: u64, tag: u8, seg: Option<Seg>, group: bool, payload: &[u8]) {
        let t = &mut self.per[d];
        debug_assert!(t.open != NONE, "ensure before push");
        // `ensure` checked that the record fits the datagram, which `open_new` sized (and
        // the slicing in `write_record` checks it again).
        debug_assert!(t.len + wire::record_len(payload.len(), seg.is_some()) <= t.buf.len());
        t.len = wire::write_record(&mut t.buf, t.len, seq, tag, seg, group, payload);
        t.open_count += 1;
    }

    /// A message too large for one record: each segment in a datagram of its own.
    #[allow(clippy::too_many_arguments)]
    pub fn push_segments(
        &mut self,
        d: usize,
        kind: u8,
        session: u32,
        ack: u64,
        seq: u64,
        tag: u8,
        payload: &[u8],
        group: bool,
    ) {
        let sp = self.limits.seg_payload;
        let total = payload.len() as u32;
        for (k, chunk) in payload.chunks(sp).enumerate() {
            self.ensure(
                d,
                kind,
                session,
                ack,
                wire::record_len(chunk.len(), true),
                true,
            );
            let seg = Seg {
                total,
                offset: (k * sp) as u32,
            };
            self.push(d, seq, tag, Some(seg), group, chunk);
            self.per[d].close();
        }
    }

    /// A request too large for a group (`seq`, of type `rtype`), alone in segments.
    pub fn push_request_segments(
        &mut self,
        d: usize,
        session: u32,
        ack: u64,
        seq: u64,
        rtype: u8,
        payload: &[u8],
    ) {
        self.push_segments(
            d,
            wire::KIND_REQUEST,
            session,
            ack,
            seq,
            rtype,
            payload,
            false,
        );
    }

    /// A response (`tag`: its status, or a group's item count) to request `seq` of
    /// client `d`: one record if it fits, else segments.
    #[inline(always)]
    pub fn respond(&mut self, d: usize, session: u32, seq: u64, tag: u8, group: bool, resp: &[u8]) {
        if resp.len() <= self.limits.single_cap {
            let rec_len = wire::record_len(resp.len(), false);
            self.ensure(d, wire::KIND_RESPONSE, session, 0, rec_len, false);
            self.push(d, seq, tag, None, group, resp);
        } else {
            self.push_segments(d, wire::KIND_RESPONSE, session, 0, seq, tag, resp, group);
        }
    }

    /// A request group rebuilt from its `count` items (`body` bytes in all, headers
    /// included), as a retransmission does: in the open request datagram if it fits.
    #[allow(clippy::too_many_arguments)]
    pub fn push_group<'a>(
        &mut self,
        d: usize,
        session: u32,
        ack: u64,
        seq: u64,
        count: u8,
        body: usize,
        items: impl Iterator<Item = &'a [u8]>,
    ) {
        self.ensure(
            d,
            wire::KIND_REQUEST,
            session,
            ack,
            wire::REC_HDR + body,
            false,
        );
        let t = &mut self.per[d];
        let pos = t.len;
        wire::write_group_header(&mut t.buf, pos, seq, count, body as u16);
        let mut at = pos + wire::REC_HDR;
        for item in items {
            t.buf[at..at + item.len()].copy_from_slice(item);
            at += item.len();
        }
        debug_assert_eq!(at, pos + wire::REC_HDR + body);
        t.len = at;
        t.open_count += 1;
    }

    pub fn is_empty(&self) -> bool {
        self.touched.is_empty()
    }

    /// Sends everything built so far with one doorbell; returns the datagram count.
    pub fn send(
        &mut self,
        ep: &mut dyn Endpoint,
        threads: usize,
    ) -> (usize, Result<(), TransportError>) {
        let mut list: Vec<Datagram<'_>> = recycle(std::mem::take(&mut self.list));
        for &d in &self.touched {
            self.per[d as usize].close();
        }
        for &d in &self.touched {
            let t = &self.per[d as usize];
            let dst =
                EndpointAddr::new((d as usize / threads) as u16, (d as usize % threads) as u16);
            for &(s, e) in &t.bounds {
                list.push(Datagram {
                    dst,
                    payload: &t.buf[s as usize..e as usize],
                });
            }
        }
        let n = list.len();
        let r = if n > 0 { ep.send(&list) } else { Ok(()) };
        self.list = recycle(list);
        for &d in &self.touched {
            let t = &mut self.per[d as usize];
            t.len = 0;
            t.bounds.clear();
            t.touched = false;
            // A burst of large responses must not pin its memory for good.
            if t.buf.len() > SHRINK_TX_ABOVE {
                t.buf = Vec::new();
            }
        }
        self.touched.clear();
        (n, r)
    }
}
