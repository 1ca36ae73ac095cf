//! Settling: a response (whole, a group, or reassembled from segments) completes its
//! window entry and the requests it carries, copies their responses into their workers'
//! response arenas, and queues each worker whose whole batch is in. Every response is
//! checked against the live window first; anything else is counted and dropped.

use super::dest::NO_SAMPLE;
use super::Destination;
use crate::runtime::batch::{status_of, ReqStatus, Workers};
use crate::runtime::State;
use crate::wire;

impl Destination {
    /// Completes (or fails) the live window entry `seq` (see [`Destination::retire`])
    /// with `status` for every request it carries, and `resp` (a whole response) as the
    /// response of a lone request. Returns the requests settled. The caller counts the
    /// entry out of `inflight` (its own and the destination's) and the requests into the
    /// completed or failed counters.
    #[inline(always)]
    pub fn settle_entry(
        &mut self,
        seq: u64,
        status: ReqStatus,
        resp: Option<&[u8]>,
        workers: &mut Workers,
    ) -> u32 {
        let e = self.retire(seq, workers);
        let n = (e.count as u32).max(1);
        let batches = &mut workers.batches;
        if let Some(p) = resp {
            let b = &mut batches[e.worker as usize];
            let q = &mut b.reqs[e.first as usize];
            q.roff = b.rarena.len() as u32;
            q.rlen = p.len() as u32;
            wire::extend_bytes(&mut b.rarena, p);
        }
        // The items of one worker are consecutive in a group (its part).
        let (mut c, mut k, mut run) = (e.worker, e.first, 0);
        for left in (0..n).rev() {
            let b = &mut batches[c as usize];
            let q = &mut b.reqs[k as usize];
            q.status = status;
            run += 1;
            let (nc, nk) = (q.next_worker, q.next);
            if left == 0 || nc != c {
                if status.failed() {
                    b.failed += run;
                }
                b.settled(c, run, &mut workers.ready);
                run = 0;
            }
            (c, k) = (nc, nk);
        }
        n
    }

    /// Completes the live group `seq` with its response `body`; false (and nothing
    /// changed) if the body is not one well-formed response per request.
    #[inline(always)]
    pub fn settle_group(&mut self, seq: u64, body: &[u8], workers: &mut Workers) -> bool {
        let count = self.win.at(seq).count as usize;
        let Some(mut items) = wire::group_items(body, count, |t| t <= wire::STATUS_MAX) else {
            return false;
        };
        let e = self.retire(seq, workers);
        // Part by part (a worker's consecutive items): one copy into the worker's response
        // arena, of which each request's response is a range.
        let b0 = body.as_ptr() as usize;
        let (mut c, mut k, mut lo) = (e.worker, e.first, 0usize);
        while items.len_left() > 0 {
            let b = &mut workers.batches[c as usize];
            let base = b.rarena.len();
            let (mut run, mut hi, mut next_worker) = (0u32, lo, c);
            for (tag, payload) in items.by_ref() {
                let q = &mut b.reqs[k as usize];
                let at = payload.as_ptr() as usize - b0;
                q.roff = (base + at - lo) as u32;
                q.rlen = payload.len() as u32;
                q.status = status_of(tag).unwrap_or(ReqStatus::TooLarge);
                (run, hi) = (run + 1, at + payload.len());
                (next_worker, k) = (q.next_worker, q.next);
                if next_worker != c {
                    break;
                }
            }
            wire::extend_bytes(&mut b.rarena, &body[lo..hi]);
            b.settled(c, run, &mut workers.ready);
            (c, lo) = (next_worker, hi);
        }
        true
    }
}

impl State {
    /// The response records of one datagram from destination `s` (its session is ours).
    /// Whole responses settle inline, with the destination looked up once and the
    /// counters added once per datagram; segments go through reassembly. The oldest
    /// request settled that was sent once gives the round-trip sample, taken at the
    /// step's clock read (`Client::take_samples`); segmented responses give none.
    #[inline(always)]
    pub(crate) fn on_responses(&mut self, s: usize, recs: wire::Records<'_>) {
        let (mut entries, mut reqs) = (0u64, 0u64);
        let mut oldest = NO_SAMPLE;
        let mut dest = self.client.dest(s);
        for r in recs {
            if r.seq >= dest.next_seq {
                self.stats.rx_unknown_response += 1;
                continue;
            }
            let e = dest.win.at(r.seq);
            if r.seq < dest.ack || !e.live || e.seq != r.seq {
                self.stats.rx_duplicate_response += 1;
                continue;
            }
            // A group's response is a group of as many items; a lone request's is not.
            let count = e.count;
            // Karn's rule: a retransmitted request's response may answer either copy.
            let sent = if e.retries == 0 { e.sent } else { NO_SAMPLE };
            if r.group != (count > 0) || (r.group && r.tag != count) {
                self.stats.rx_malformed += 1;
                continue;
            }
            if r.group {
                if r.seg.is_some() {
                    self.on_segmented_response(s, &r, ReqStatus::Ok);
                    dest = self.client.dest(s);
                } else if dest.settle_group(r.seq, r.payload, &mut self.workers) {
                    entries += 1;
                    reqs += count as u64;
                    oldest = oldest.min(sent);
                } else {
                    self.stats.rx_malformed += 1;
                }
                continue;
            }
            let Some(status) = status_of(r.tag) else {
                self.stats.rx_malformed += 1;
                continue;
            };
            if r.seg.is_some() {
                self.on_segmented_response(s, &r, status);
                dest = self.client.dest(s);
                continue;
            }
            entries += 1;
            reqs += 1;
            oldest = oldest.min(sent);
            dest.settle_entry(r.seq, status, Some(r.payload), &mut self.workers);
        }
        if entries > 0 {
            dest.inflight -= entries as u32;
            let first = oldest != NO_SAMPLE && dest.sample_sent == NO_SAMPLE;
            dest.sample_sent = dest.sample_sent.min(oldest);
            self.client.inflight -= entries;
            self.stats.rpcs_completed += reqs;
            if first {
                self.client.sampled.push(s as u32);
            }
        }
    }

    /// A segment of a live request's (or group's) response: settles it once the message
    /// is whole.
    #[inline(never)]
    fn on_segmented_response(&mut self, s: usize, r: &wire::Record<'_>, status: ReqStatus) {
        // A group's response takes up to `max_message` per part, plus the header of
        // every item (one that found its part's budget spent still has one). The caller
        // checked that `r.seq` is live.
        let e = *self.client.dest(s).win.at(r.seq);
        let max = match e.count {
            0 => self.max_message,
            n => self.max_message * e.parts.max(1) as usize + n as usize * wire::ITEM_HDR,
        };
        let session = self.client.session;
        let Some((i, whole, total)) = self.reassembled(s, wire::KIND_RESPONSE, session, r, max)
        else {
            return;
        };
        let body = &whole[..total];
        if e.count > 0 {
            let dest = self.client.dest(s);
            if dest.settle_group(r.seq, body, &mut self.workers) {
                dest.inflight -= 1;
                self.client.inflight -= 1;
                self.stats.rpcs_completed += e.count as u64;
            } else {
                self.stats.rx_malformed += 1;
            }
        } else {
            let b = &mut self.workers.batches[e.worker as usize];
            let q = &mut b.reqs[e.first as usize];
            q.roff = b.rarena.len() as u32;
            q.rlen = total as u32;
            b.rarena.extend_from_slice(body);
            self.settle(s, r.seq, status);
        }
        self.reassembly.give_back(i, whole);
    }

    /// Completes (or fails) the live window entry `seq` to destination `s` with every
    /// request it carries: frees the entry and, with the last entry of its datagram, the
    /// datagram's credits.
    pub(crate) fn settle(&mut self, s: usize, seq: u64, status: ReqStatus) {
        let dest = self.client.dest(s);
        let n = dest.settle_entry(seq, status, None, &mut self.workers) as u64;
        dest.inflight -= 1;
        self.client.inflight -= 1;
        if status.failed() {
            self.stats.rpcs_failed += n;
        } else {
            self.stats.rpcs_completed += n;
        }
    }
}
