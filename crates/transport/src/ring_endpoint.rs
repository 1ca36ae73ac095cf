//! What the two ring backends (`local`: threads of one process; `shm`: processes of one
//! host) share in an endpoint: sending into the receivers' rings with one publish per
//! destination per doorbell, polling this endpoint's ring, the completion queue of
//! one-sided operations (both execute them synchronously), parking, and the counters.
//! The backends differ only in how a destination's ring is found and how a region is
//! reached, which they pass in.

use crate::counters::{Counter, CounterSnapshot, Counters};
use crate::ring::{self, RingProducer, RxBlock, RxConsumer};
use crate::types::*;
use crate::wait::{Doorbell, Scope};
use std::sync::Arc;
use std::time::Duration;

/// The doorbell of a ring endpoint: raises its flag and wakes the receiver through the
/// ring's event count (a futex wake only if it sleeps).
pub struct RingWaker {
    block: RxBlock,
    bell: Doorbell,
    scope: Scope,
}

impl crate::EndpointWaker for RingWaker {
    #[inline]
    fn wake(&self) {
        if self.bell.raise() {
            self.block.header().event.notify(self.scope);
        }
    }
}

pub struct RingEndpoint {
    pub addr: EndpointAddr,
    pub epoch: u32,
    consumer: RxConsumer,
    producers: Vec<Option<RingProducer>>,
    /// Address of every sender index (avoids a division per received datagram).
    senders: Vec<EndpointAddr>,
    touched: Vec<usize>,
    /// The completion queue: entries `cq_head..` are not polled yet. A vector with a
    /// head index rather than a `VecDeque`: pushing and draining in bulk costs fewer
    /// instructions, and it is emptied whenever it is drained completely.
    cq: Vec<Completion>,
    cq_head: usize,
    /// This endpoint's own counters (only it writes them).
    pub counters: Counters,
    /// Whom a publish wakes: threads of this process, or processes sharing the ring.
    scope: Scope,
    /// This endpoint's doorbell (`Endpoint::waker`).
    pub waker: Arc<RingWaker>,
}

impl RingEndpoint {
    /// An endpoint at `addr` receiving from `rx`.
    pub fn new(cfg: &ClusterConfig, addr: EndpointAddr, rx: RxBlock, scope: Scope) -> Self {
        let t = cfg.threads_per_node as usize;
        let waker = Arc::new(RingWaker {
            block: rx.clone(),
            bell: Doorbell::default(),
            scope,
        });
        RingEndpoint {
            waker,
            addr,
            epoch: cfg.epoch,
            consumer: RxConsumer::new(rx, cfg.mtu),
            producers: (0..cfg.endpoints()).map(|_| None).collect(),
            senders: (0..cfg.endpoints())
                .map(|i| EndpointAddr::new((i / t) as NodeId, (i % t) as ThreadId))
                .collect(),
            touched: Vec::new(),
            cq: Vec::new(),
            cq_head: 0,
            counters: Counters::default(),
            scope,
        }
    }

    /// `Endpoint::send`. `ring(i)` gives the receive ring of endpoint index `i` the first
    /// time this endpoint sends there; `None` (no such ring, or a corrupt one) drops the
    /// datagrams as `RxDroppedUnknownDest`.
    pub fn send(
        &mut self,
        cfg: &ClusterConfig,
        batch: &[Datagram<'_>],
        mut ring: impl FnMut(usize) -> Option<RxBlock>,
    ) -> Result<(), TransportError> {
        cfg.check_batch(batch)?;
        let depth = cfg.recv_depth;
        let me = cfg.endpoint_index(self.addr);
        let epoch = self.epoch;
        let (mut bytes, mut unreachable) = (0u64, 0u64);
        let mut i = 0;
        while i < batch.len() {
            // Runs of datagrams to one destination reserve queue room with one atomic.
            let dst = batch[i].dst;
            let mut j = i + 1;
            while j < batch.len() && batch[j].dst == dst {
                j += 1;
            }
            let idx = cfg.endpoint_index(dst);
            if self.producers[idx].is_none() {
                match ring(idx) {
                    Some(b) => self.producers[idx] = Some(RingProducer::new(b, me)),
                    None => {
                        unreachable += (j - i) as u64;
                        i = j;
                        continue;
                    }
                }
            }
            let prod = self.producers[idx].as_mut().expect("attached above");
            let granted = ring::reserve(prod.header(), depth, (j - i) as u64);
            let mut pushed = 0;
            for d in &batch[i..i + granted as usize] {
                if !prod.push(epoch, d.payload) {
                    break;
                }
                bytes += d.payload.len() as u64;
                pushed += 1;
            }
            ring::unreserve(prod.header(), granted - pushed);
            prod.header()
                .counters
                .add(Counter::RxDroppedQueueFull, (j - i) as u64 - pushed);
            if pushed > 0 && !self.touched.contains(&idx) {
                self.touched.push(idx);
            }
            i = j;
        }
        for k in 0..self.touched.len() {
            let idx = self.touched[k];
            if let Some(p) = self.producers[idx].as_mut() {
                if p.publish() {
                    p.header().event.notify(self.scope);
                }
            }
        }
        self.touched.clear();
        let c = &self.counters;
        if unreachable > 0 {
            c.add_owned(Counter::RxDroppedUnknownDest, unreachable);
        }
        c.add_owned(Counter::TxDatagrams, batch.len() as u64);
        c.add_owned(Counter::TxBytes, bytes);
        c.add_owned(Counter::TxDoorbells, 1);
        Ok(())
    }

    /// `Endpoint::poll_recv`: datagrams of another epoch are dropped and counted.
    pub fn poll_recv(&mut self, max: usize, sink: &mut dyn FnMut(EndpointAddr, &[u8])) -> usize {
        let senders = &self.senders;
        let epoch = self.epoch;
        let mut wrong_epoch = 0;
        let mut bytes = 0;
        let n = self.consumer.poll(max, &mut |s, e, payload| {
            if e != epoch {
                wrong_epoch += 1;
                return;
            }
            bytes += payload.len() as u64;
            sink(senders[s], payload);
        });
        if n > 0 {
            // Only this endpoint writes these (senders add only drops).
            let c = &self.consumer.header().counters;
            c.add_owned(Counter::RxDroppedWrongEpoch, wrong_epoch);
            c.add_owned(Counter::RxDatagrams, n as u64 - wrong_epoch);
            c.add_owned(Counter::RxBytes, bytes);
        }
        n - wrong_epoch as usize
    }

    /// Records the outcome of a one-sided operation executed at `node`: a completion if
    /// it was signaled or failed, and the error count. Returns the error, if any, so that
    /// the backend can count a violation at the target.
    pub fn complete(
        &mut self,
        op: &OneSidedOp<'_>,
        node: NodeId,
        result: Result<u64, AccessError>,
    ) -> Option<AccessError> {
        if result.is_err() {
            self.counters.add_owned(Counter::OnesidedErrors, 1);
        }
        if let Some(c) = Completion::of(op, node, result) {
            self.cq.push(c);
        }
        result.err()
    }

    /// `Endpoint::poll_cq`.
    pub fn poll_cq(&mut self, max: usize, out: &mut Vec<Completion>) -> usize {
        let h = self.cq_head;
        let n = max.min(self.cq.len() - h);
        out.extend_from_slice(&self.cq[h..h + n]);
        if h + n == self.cq.len() {
            self.cq.clear();
            self.cq_head = 0;
        } else {
            self.cq_head = h + n;
            // A poller that never catches up must not grow the queue for good.
            if self.cq_head >= 4096 {
                self.cq.drain(..self.cq_head);
                self.cq_head = 0;
            }
        }
        n
    }

    /// `Endpoint::wait`: parks until a datagram may be in the ring, the doorbell rings
    /// or `timeout` passes.
    pub fn wait(&mut self, timeout: Duration) {
        if self.cq_head < self.cq.len() || self.waker.bell.take() {
            return;
        }
        let ev = self.consumer.header().event.observe();
        if self.consumer.has_pending() {
            return;
        }
        let consumer = &self.consumer;
        let bell = &self.waker.bell;
        consumer.header().event.wait(ev, timeout, self.scope, || {
            consumer.has_pending() || bell.is_up()
        });
        // A ring during the wait has done its job: the caller steps next.
        bell.take();
    }

    /// `Endpoint::counters`: this endpoint's and its receive ring's.
    pub fn counters(&self) -> CounterSnapshot {
        let mut s = self.counters.snapshot();
        s.merge(&self.consumer.header().counters.snapshot());
        s
    }
}

/// The `Endpoint` methods a ring backend's endpoint hands straight to its
/// `RingEndpoint` (in a field named `ring`); the backend writes `config`, `send`, `post`
/// and `set_epoch` (which also raises the node's [`crate::fence`]) itself.
#[macro_export]
macro_rules! delegate_to_ring_endpoint {
    () => {
        fn addr(&self) -> $crate::types::EndpointAddr {
            self.ring.addr
        }

        fn poll_recv(
            &mut self,
            max: usize,
            sink: &mut dyn FnMut($crate::types::EndpointAddr, &[u8]),
        ) -> usize {
            self.ring.poll_recv(max, sink)
        }

        fn poll_cq(&mut self, max: usize, out: &mut Vec<$crate::types::Completion>) -> usize {
            self.ring.poll_cq(max, out)
        }

        fn outstanding(&self) -> usize {
            // One-sided operations complete inside `post`.
            0
        }

        fn wait(&mut self, timeout: std::time::Duration) {
            self.ring.wait(timeout)
        }

        fn host_threads(&self) -> usize {
            // Every node of a ring backend runs on this host.
            self.config().endpoints()
        }

        fn counters(&self) -> $crate::counters::CounterSnapshot {
            self.ring.counters()
        }

        fn waker(&self) -> Option<std::sync::Arc<dyn $crate::EndpointWaker>> {
            Some(self.ring.waker.clone())
        }
    };
}
