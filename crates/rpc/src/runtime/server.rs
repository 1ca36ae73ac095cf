//! The server side: handlers run inline in the master step, at most once per request.
//! Each client endpoint has a window of cached responses (the duplicate cache): a
//! retransmitted request gets its cached response, never a second run of its handler,
//! and the client's `ack` watermark lets the server forget older ones.

use super::seq_array::SeqArray;
use super::stats::RpcStats;
use super::State;
use crate::reply::Reply;
use crate::wire;
use ambidex_transport::EndpointAddr;

/// What a handler learns about the request it serves.
#[derive(Clone, Copy, Debug)]
pub struct RequestInfo {
    pub src: EndpointAddr,
    pub rtype: u8,
    /// Sequence number of the request's record (shared by the requests of a group).
    pub seq: u64,
}

/// A request handler: runs inline in the master loop and writes its response into the
/// [`Reply`] (empty when the handler starts). It must not block.
pub type Handler = Box<dyn FnMut(&RequestInfo, &[u8], &mut Reply<'_>)>;

/// The handler table, one per request type (FaSST has one per table and operation).
pub(crate) struct Handlers(Box<[Option<Handler>; 256]>);

impl Handlers {
    pub fn set(&mut self, rtype: u8, h: Handler) {
        self.0[rtype as usize] = Some(h);
    }

    /// Runs the handler of `info.rtype` (if any), appending its response to `resp`;
    /// returns the response status. A response over `max` bytes is dropped.
    #[inline(always)]
    fn run(
        &mut self,
        stats: &mut RpcStats,
        info: &RequestInfo,
        payload: &[u8],
        resp: &mut Vec<u8>,
        max: usize,
    ) -> u8 {
        match self.0[info.rtype as usize].as_mut() {
            Some(h) => {
                stats.requests_served += 1;
                let mut r = Reply::new(resp);
                h(info, payload, &mut r);
                if r.len() > max {
                    r.clear();
                    wire::STATUS_TOO_LARGE
                } else {
                    wire::STATUS_OK
                }
            }
            None => {
                stats.no_handler += 1;
                wire::STATUS_NO_HANDLER
            }
        }
    }
}

/// Server side of one client endpoint: cached responses of its last `window` requests.
struct ClientWindow {
    session: u32,
    /// Every seq below is settled at the client (its `ack`): duplicates are stale.
    base: u64,
    slots: SeqArray<CachedResponse>,
}

/// The response kept for one request of a client's window.
struct CachedResponse {
    seq: u64,
    /// Tag of the response record: its status, or a group's item count.
    tag: u8,
    /// The request came in segments, or as a group (a duplicate must too).
    segmented: bool,
    group: bool,
    /// Step time the response was last sent (resends are rate-limited).
    sent_at: u64,
    resp: Vec<u8>,
}

pub(crate) struct Server {
    pub handlers: Handlers,
    clients: Clients,
}

/// The window of every client endpoint (dense index), created at its first request.
struct Clients(Vec<Option<Box<ClientWindow>>>);

impl Server {
    pub fn new(endpoints: usize) -> Server {
        Server {
            handlers: Handlers(Box::new(std::array::from_fn(|_| None))),
            clients: Clients((0..endpoints).map(|_| None).collect()),
        }
    }

    /// See [`Clients::update`].
    #[inline]
    pub fn client_window(&mut self, s: usize, hdr: &wire::Header, window: usize) {
        self.clients.update(s, hdr, window)
    }
}

impl Clients {
    #[inline(always)]
    fn get(&mut self, s: usize) -> &mut ClientWindow {
        self.0[s].as_deref_mut().expect("client_window first")
    }

    /// The window of client `s`, brought up to date with a request datagram's header
    /// (session and acknowledged watermark).
    #[inline]
    fn update(&mut self, s: usize, hdr: &wire::Header, window: usize) {
        let win = self.0[s].get_or_insert_with(|| {
            Box::new(ClientWindow {
                session: hdr.session,
                base: 0,
                slots: SeqArray::new(window, |_| CachedResponse {
                    seq: 0,
                    tag: 0,
                    segmented: false,
                    group: false,
                    sent_at: 0,
                    resp: Vec::new(),
                }),
            })
        });
        if win.session != hdr.session {
            // A new incarnation of the client: its old requests are void.
            win.session = hdr.session;
            win.base = 0;
            for sl in win.slots.items.iter_mut() {
                sl.seq = 0;
            }
        }
        win.base = win.base.max(hdr.ack);
    }

    /// The slot of client `s`'s request `seq`, emptied for a new response.
    #[inline(always)]
    fn open_slot(&mut self, s: usize, seq: u64, now: u64) -> &mut CachedResponse {
        let sv = self.get(s).slots.at_mut(seq);
        sv.seq = seq;
        sv.sent_at = now;
        sv.resp.clear();
        sv
    }
}

impl State {
    /// A request record from client `s` (whose window `client_window` updated).
    #[inline]
    pub(crate) fn on_request(
        &mut self,
        s: usize,
        src: EndpointAddr,
        hdr: &wire::Header,
        r: &wire::Record<'_>,
    ) {
        let window = self.client.window;
        let win = self.server.clients.get(s);
        if r.seq < win.base {
            self.stats.stale_requests += 1;
            return;
        }
        if r.seq - win.base >= window as u64 {
            self.stats.out_of_window_requests += 1;
            return;
        }
        let sv = win.slots.at(r.seq);
        if sv.seq == r.seq {
            // Executed before: resend the cached response, never rerun the handler. A
            // duplicate must have the original's form, gets the response once (a
            // segmented one at its first segment), and at most once per `resend_gap`: a
            // real client retransmits only after its timeout, and nobody can make this
            // server resend a large response faster than it would answer new requests.
            self.stats.duplicate_requests += 1;
            if r.seg.is_some() == sv.segmented
                && r.group == sv.group
                && r.seg.is_none_or(|g| g.offset == 0)
            {
                // A fresh clock: the step's is read after the poll, and a thread that
                // was descheduled would hold a stale one and turn real retransmissions
                // away.
                let now = self.clock.now_ns();
                if now >= sv.sent_at.saturating_add(self.resend_gap) {
                    self.respond_cached(s, hdr.session, r.seq, now);
                }
            }
            return;
        }
        if r.group {
            // A client never segments a group, and runs no handler of a malformed one.
            let items = match r.seg.is_none() && r.tag > 0 {
                true => wire::request_items(r.payload, r.tag as usize, self.max_parts as usize),
                false => None,
            };
            let Some(items) = items else {
                self.stats.rx_malformed += 1;
                return;
            };
            self.serve_group(s, src, hdr.session, r.seq, r.tag, items);
            return;
        }
        if r.seg.is_some() {
            self.on_segmented_request(s, src, hdr, r);
            return;
        }
        self.serve(s, src, hdr.session, r.seq, r.tag, r.payload, false);
    }

    /// Runs the handler of client `s`'s request `seq` (never run before), keeps its
    /// response in the request's slot of the client window and sends it.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn serve(
        &mut self,
        s: usize,
        src: EndpointAddr,
        session: u32,
        seq: u64,
        tag: u8,
        payload: &[u8],
        segmented: bool,
    ) {
        let sv = self.server.clients.open_slot(s, seq, self.now);
        sv.segmented = segmented;
        sv.group = false;
        let info = RequestInfo {
            src,
            rtype: tag,
            seq,
        };
        sv.tag = self.server.handlers.run(
            &mut self.stats,
            &info,
            payload,
            &mut sv.resp,
            self.max_message,
        );
        self.outbox
            .respond(s, session, seq, sv.tag, false, &sv.resp);
    }

    /// Runs the handlers of client `s`'s group `seq` (checked, never run before) in
    /// order, keeps their responses as one group in the request's slot of the client
    /// window and sends it. The responses of one part of a group (one worker's batch)
    /// share `max_message` bytes: a response that would overflow them gets `TooLarge`.
    #[inline(always)]
    fn serve_group(
        &mut self,
        s: usize,
        src: EndpointAddr,
        session: u32,
        seq: u64,
        count: u8,
        mut items: wire::Items<'_>,
    ) {
        let sv = self.server.clients.open_slot(s, seq, self.now);
        sv.tag = count;
        sv.segmented = false;
        sv.group = true;
        let mut info = RequestInfo { src, rtype: 0, seq };
        // Where the current part's responses start.
        let mut part = 0;
        while items.len_left() > 0 {
            if items.starts_part() {
                part = sv.resp.len();
            }
            let Some((rtype, payload)) = items.next() else {
                break;
            };
            info.rtype = rtype;
            // The item's header first (patched after), then the handler writes its
            // response in place.
            let at = wire::open_item(&mut sv.resp);
            // The part's budget. The whole response stays within the wire's limit
            // because this server accepts at most `max_parts` parts (see there), each at
            // most `max_message` plus the headers of items that found it spent.
            let room = self.max_message.saturating_sub(at - part + wire::ITEM_HDR);
            let status =
                self.server
                    .handlers
                    .run(&mut self.stats, &info, payload, &mut sv.resp, room);
            wire::close_item(&mut sv.resp, at, status);
        }
        self.outbox.respond(s, session, seq, count, true, &sv.resp);
    }

    /// Sends the response kept in the slot of client `s`'s request `seq`.
    #[inline(always)]
    fn respond_cached(&mut self, s: usize, session: u32, seq: u64, now: u64) {
        let sv = self.server.clients.get(s).slots.at_mut(seq);
        sv.sent_at = now;
        self.outbox
            .respond(s, session, seq, sv.tag, sv.group, &sv.resp);
    }

    /// A segment of a request not executed before: runs the handler once the whole
    /// message is in.
    #[inline(never)]
    fn on_segmented_request(
        &mut self,
        s: usize,
        src: EndpointAddr,
        hdr: &wire::Header,
        r: &wire::Record<'_>,
    ) {
        let max = self.max_message;
        // The buffer is borrowed out of the pool (no allocation) while the handler runs.
        let Some((i, whole, total)) = self.reassembled(s, wire::KIND_REQUEST, hdr.session, r, max)
        else {
            return;
        };
        self.serve(s, src, hdr.session, r.seq, r.tag, &whole[..total], true);
        self.reassembly.give_back(i, whole);
    }
}
