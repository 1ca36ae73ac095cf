//! Retransmission and suspicion. A request (or group) without a response by its
//! deadline is sent again, whole, through the outbox; after `max_retries` its
//! destination is suspected (reported to the cluster layer) and every request to it
//! fails, so that a worker never waits forever on a dead node.

use crate::runtime::batch::ReqStatus;
use crate::runtime::State;
use crate::wire;
use ambidex_transport::NodeId;

impl State {
    /// How often a runtime with requests in flight looks for expired deadlines.
    #[inline]
    pub(crate) fn scan_period(&self) -> u64 {
        (self.rto / 4).max(50_000)
    }

    /// Retransmits requests past their deadline; fails them (and suspects their
    /// destination) once the retries are used up.
    #[inline(never)]
    pub(crate) fn scan_timeouts(&mut self) {
        let now = self.now;
        self.client.next_scan = now + self.scan_period();
        let session = self.client.session;
        for d in 0..self.client.dests.len() {
            let Some(dest) = self.client.dests[d].as_deref_mut() else {
                continue;
            };
            if dest.inflight == 0 {
                continue;
            }
            let mut give_up = false;
            for seq in dest.ack..dest.next_seq {
                let e = dest.win.at_mut(seq);
                if !e.live || e.deadline > now {
                    continue;
                }
                if e.retries >= self.cfg.max_retries {
                    give_up = true;
                    break;
                }
                e.retries += 1;
                e.deadline = now + self.rto;
                self.stats.retransmits += 1;
                let e = *e;
                let batches = &self.workers.batches;
                if e.count == 0 {
                    // A lone request, sent in segments.
                    let b = &batches[e.worker as usize];
                    let q = b.reqs[e.first as usize];
                    let payload = &b.arena[q.off as usize..(q.off + q.len) as usize];
                    self.outbox
                        .push_request_segments(d, session, dest.ack, seq, q.rtype, payload);
                    continue;
                }
                // A group, rebuilt from its requests' items (it fit one datagram); its
                // parts' first items carry their flags in the workers' arenas.
                let items = || {
                    let (mut c, mut k) = (e.worker, e.first);
                    (0..e.count).map(move |_| {
                        let b = &batches[c as usize];
                        let q = &b.reqs[k as usize];
                        (c, k) = (q.next_worker, q.next);
                        &b.arena[q.off as usize - wire::ITEM_HDR..(q.off + q.len) as usize]
                    })
                };
                let body = items().map(<[u8]>::len).sum();
                self.outbox
                    .push_group(d, session, dest.ack, seq, e.count, body, items());
            }
            if give_up {
                self.suspect(d);
            }
        }
    }

    /// Destination `d` stayed silent through every retry: its node is suspected, and
    /// every request to it fails (its workers see `RpcError::Timeout`).
    fn suspect(&mut self, d: usize) {
        let node = (d / self.threads) as NodeId;
        self.stats.suspected += 1;
        self.client.suspects.push(node);
        if let Some(cb) = self.client.on_suspect.as_mut() {
            cb(node);
        }
        let dest = self.client.dest(d);
        let (lo, hi) = (dest.ack, dest.next_seq);
        for seq in lo..hi {
            if self.client.dest(d).is_live(seq) {
                self.settle(d, seq, ReqStatus::Failed);
            }
        }
    }
}
