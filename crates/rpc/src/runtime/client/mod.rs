//! The client side: per destination endpoint, credits (request datagrams in flight),
//! sequence numbers and the window of requests in flight (`dest`); how a flush encodes
//! a worker's batch (`flush`); how responses settle requests and resume their workers
//! (`settle`); retransmission and suspicion of silent destinations (`retransmit`).

mod dest;
mod flush;
mod retransmit;
mod settle;

pub(crate) use dest::{DestNeed, Destination};

use ambidex_transport::NodeId;

pub(crate) struct Client {
    /// Incarnation nonce of this runtime's requests.
    pub session: u32,
    /// Request datagrams in flight per destination endpoint.
    pub credits: u32,
    /// Window entries per destination (a power of two).
    pub window: usize,
    /// Per destination endpoint (dense index), created at the first flush to it.
    pub dests: Vec<Option<Box<Destination>>>,
    /// Scratch of a flush's check of its needs, per destination.
    pub need: Vec<DestNeed>,
    pub need_touched: Vec<u32>,
    /// Window entries in flight (a group is one).
    pub inflight: u64,
    /// Step time of the next retransmission scan.
    pub next_scan: u64,
    pub suspects: Vec<NodeId>,
    pub on_suspect: Option<Box<dyn FnMut(NodeId)>>,
}

impl Client {
    pub fn new(session: u32, credits: u32, window: usize, endpoints: usize, now: u64) -> Client {
        Client {
            session,
            credits,
            window,
            dests: (0..endpoints).map(|_| None).collect(),
            need: vec![DestNeed::default(); endpoints],
            need_touched: Vec::new(),
            inflight: 0,
            next_scan: now,
            suspects: Vec::new(),
            on_suspect: None,
        }
    }

    /// The state of destination `d`, which a flush to it created.
    #[inline(always)]
    pub fn dest(&mut self, d: usize) -> &mut Destination {
        self.dests[d]
            .as_deref_mut()
            .expect("a flush to it created it")
    }
}
