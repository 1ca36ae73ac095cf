//! Retransmission and suspicion. A request (or group) without a response by its
//! deadline is sent again, whole, through the outbox. The deadline is one retransmission
//! timeout of its destination endpoint after sending: the measured round trip plus four
//! deviations (`RttEstimator`), so a lost datagram costs about a round trip rather than a
//! fixed timeout; expiries double the destination's timeout (once per timeout period)
//! until a request sent once is answered. A request still unanswered `give_up` after it was first sent has
//! its destination suspected (reported to the cluster layer) and every request to it
//! fails, so that a worker never waits forever on a dead node.

use super::scan_period_for;
use crate::runtime::batch::ReqStatus;
use crate::runtime::State;
use crate::wire;
use ambidex_transport::NodeId;

impl State {
    /// Retransmits requests past their deadline; fails them (and suspects their
    /// destination) once one has waited `give_up`. Sets the next scan from the shortest
    /// timeout in use.
    #[inline(never)]
    pub(crate) fn scan_timeouts(&mut self) {
        let now = self.now;
        let give_up = self.give_up;
        let session = self.client.session;
        let mut shortest = self.client.rtt0.rto();
        for d in 0..self.client.dests.len() {
            let Some(dest) = self.client.dests[d].as_deref_mut() else {
                continue;
            };
            if dest.inflight == 0 {
                shortest = shortest.min(dest.rtt.rto());
                continue;
            }
            let (mut backed_off, mut dead) = (false, false);
            for seq in dest.ack..dest.next_seq {
                let e = dest.win.at_mut(seq);
                if !e.live || e.deadline > now {
                    continue;
                }
                // Deadlines never pass `sent + give_up`, so this is on time.
                if now.saturating_sub(e.sent) >= give_up {
                    dead = true;
                    break;
                }
                // Expiries within one timeout period are one loss (TCP has one timer
                // per connection): one doubling. Doubling at each scan that finds one
                // would reach `rto_max` after a single burst of losses.
                if !backed_off && now >= dest.next_backoff {
                    backed_off = true;
                    dest.rtt.back_off();
                    dest.next_backoff = now.saturating_add(dest.rtt.rto());
                }
                e.retries += 1;
                e.deadline = now
                    .saturating_add(dest.rtt.rto())
                    .min(e.sent.saturating_add(give_up));
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
            if dead {
                self.suspect(d);
            } else {
                shortest = shortest.min(dest.rtt.rto());
            }
        }
        self.client.scan_period = scan_period_for(shortest);
        self.client.next_scan = now + self.client.scan_period;
    }

    /// Node `node` is suspected failed: reported to the cluster layer.
    pub(crate) fn report_suspect(&mut self, node: NodeId) {
        self.stats.suspected += 1;
        self.client.suspects.push(node);
        if let Some(cb) = self.client.on_suspect.as_mut() {
            cb(node);
        }
    }

    /// Destination `d` left a request unanswered for `give_up`: its node is suspected, and
    /// every request to it fails (its workers see `RpcError::Timeout`).
    fn suspect(&mut self, d: usize) {
        self.report_suspect((d / self.threads) as NodeId);
        let dest = self.client.dest(d);
        let (lo, hi) = (dest.ack, dest.next_seq);
        for seq in lo..hi {
            if self.client.dest(d).is_live(seq) {
                self.settle(d, seq, ReqStatus::Failed);
            }
        }
    }
}
