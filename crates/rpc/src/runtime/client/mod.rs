//! The client side: per destination endpoint, credits (request datagrams in flight),
//! sequence numbers and the window of requests in flight (`dest`); how a flush encodes
//! a worker's batch (`flush`); how responses settle requests and resume their workers
//! (`settle`); retransmission and suspicion of silent destinations (`retransmit`).

mod dest;
mod flush;
mod retransmit;
mod settle;

pub(crate) use dest::{DestNeed, Destination};

use ambidex_transport::rtt::RttEstimator;
use ambidex_transport::NodeId;
use dest::NO_SAMPLE;

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
    /// Time between scans: a quarter of the shortest timeout in use, so a request is
    /// retransmitted at most a quarter timeout late.
    pub scan_period: u64,
    /// A new destination's estimator (no samples: the initial timeout).
    pub rtt0: RttEstimator,
    /// Destinations with a round-trip sample pending in this step.
    pub sampled: Vec<u32>,
    pub suspects: Vec<NodeId>,
    pub on_suspect: Option<Box<dyn FnMut(NodeId)>>,
}

impl Client {
    pub fn new(
        session: u32,
        credits: u32,
        window: usize,
        endpoints: usize,
        now: u64,
        rtt0: RttEstimator,
    ) -> Client {
        Client {
            session,
            credits,
            window,
            dests: (0..endpoints).map(|_| None).collect(),
            need: vec![DestNeed::default(); endpoints],
            need_touched: Vec::new(),
            inflight: 0,
            next_scan: now,
            scan_period: scan_period_for(rtt0.rto()),
            rtt0,
            sampled: Vec::with_capacity(endpoints),
            suspects: Vec::new(),
            on_suspect: None,
        }
    }

    /// Ends the round trips measured in this step at `now` (the step's clock read, after
    /// the poll that brought their responses).
    #[inline(never)]
    pub fn take_samples(&mut self, now: u64) {
        for &d in &self.sampled {
            if let Some(dest) = self.dests[d as usize].as_deref_mut() {
                dest.rtt.sample(now.saturating_sub(dest.sample_sent));
                dest.sample_sent = NO_SAMPLE;
                dest.next_backoff = 0;
                // A shorter timeout is scanned for at once; a longer one from the next
                // scan on (`scan_timeouts`).
                self.scan_period = self.scan_period.min(scan_period_for(dest.rtt.rto()));
            }
        }
        self.sampled.clear();
        self.next_scan = self.next_scan.min(now + self.scan_period);
    }

    /// The state of destination `d`, which a flush to it created.
    #[inline(always)]
    pub fn dest(&mut self, d: usize) -> &mut Destination {
        self.dests[d]
            .as_deref_mut()
            .expect("a flush to it created it")
    }
}

/// Scan period for a shortest timeout of `rto` ns: a quarter of it, but no more often than
/// every 50 us (a scan walks every request in flight).
pub(crate) fn scan_period_for(rto: u64) -> u64 {
    (rto / 4).max(50_000)
}
