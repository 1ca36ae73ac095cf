//! A fault-injecting wrapper for any endpoint: seeded drop, duplication, reordering and
//! delay of outgoing datagrams. One-sided operations pass through untouched (on a real
//! NIC they ride a reliable connection).
//!
//! The same seed and the same sequence of calls give the same decisions; delayed
//! datagrams are released by the [`Clock`](crate::Clock) the endpoint is given (the process's system
//! clock by default), never by reading `Instant` itself.

use crate::clock::{duration_ns, SharedClock, SystemClock};
use crate::counters::{Counter, CounterSnapshot, Counters};
use crate::types::*;
use crate::Endpoint;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::VecDeque;
use std::time::Duration;

/// Probabilities (0.0..=1.0) of each fault, applied to every outgoing datagram.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FaultConfig {
    pub seed: u64,
    pub drop: f64,
    pub duplicate: f64,
    /// Held back until after the next batch this endpoint sends.
    pub reorder: f64,
    /// Held back for a random time up to `max_delay`.
    pub delay: f64,
    pub max_delay: Duration,
}

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig {
            seed: 1,
            drop: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            delay: 0.0,
            max_delay: Duration::from_millis(2),
        }
    }
}

/// Checks that every named fault probability lies within 0..=1.
pub fn check_probabilities(ps: &[(&str, f64)]) -> Result<(), TransportError> {
    for &(name, p) in ps {
        if !(0.0..=1.0).contains(&p) {
            return Err(TransportError::Config(format!(
                "fault probability {name}={p} is not within 0..=1"
            )));
        }
    }
    Ok(())
}

impl FaultConfig {
    pub fn validate(&self) -> Result<(), TransportError> {
        check_probabilities(&[
            ("drop", self.drop),
            ("duplicate", self.duplicate),
            ("reorder", self.reorder),
            ("delay", self.delay),
        ])
    }
}

struct Held {
    dst: EndpointAddr,
    payload: Vec<u8>,
    /// Clock time (ns) at which a delayed datagram is due.
    release: u64,
}

/// An endpoint whose outgoing datagrams suffer the configured faults.
pub struct FaultyEndpoint {
    inner: Box<dyn Endpoint>,
    cfg: FaultConfig,
    rng: SmallRng,
    /// Reordered datagrams, sent after the next batch.
    held: Vec<Held>,
    /// Delayed datagrams, in insertion order (released when due).
    delayed: VecDeque<Held>,
    counters: Counters,
    clock: SharedClock,
}

impl FaultyEndpoint {
    /// Wraps `inner`; delays are timed by the process's system clock.
    pub fn wrap(
        inner: Box<dyn Endpoint>,
        cfg: FaultConfig,
    ) -> Result<Box<dyn Endpoint>, TransportError> {
        Self::wrap_with_clock(inner, cfg, SystemClock::shared())
    }

    /// Wraps `inner`; delays are timed by `clock`.
    pub fn wrap_with_clock(
        inner: Box<dyn Endpoint>,
        cfg: FaultConfig,
        clock: SharedClock,
    ) -> Result<Box<dyn Endpoint>, TransportError> {
        cfg.validate()?;
        let rng = SmallRng::seed_from_u64(
            cfg.seed ^ (inner.addr().node as u64) << 32 ^ (inner.addr().thread as u64) << 48,
        );
        Ok(Box::new(FaultyEndpoint {
            inner,
            cfg,
            rng,
            held: Vec::new(),
            delayed: VecDeque::new(),
            counters: Counters::default(),
            clock,
        }))
    }

    fn release_due(&mut self) {
        if self.delayed.is_empty() {
            return;
        }
        let now = self.clock.now_ns();
        let mut due = Vec::new();
        self.delayed.retain_mut(|h| {
            if h.release <= now {
                due.push(Held {
                    dst: h.dst,
                    payload: std::mem::take(&mut h.payload),
                    release: now,
                });
                false
            } else {
                true
            }
        });
        self.send_owned(&due);
    }

    fn send_owned(&mut self, items: &[Held]) {
        if items.is_empty() {
            return;
        }
        let batch: Vec<Datagram<'_>> = items
            .iter()
            .map(|h| Datagram {
                dst: h.dst,
                payload: &h.payload,
            })
            .collect();
        // Already validated when first posted.
        let _ = self.inner.send(&batch);
    }
}

impl Endpoint for FaultyEndpoint {
    fn addr(&self) -> EndpointAddr {
        self.inner.addr()
    }

    fn config(&self) -> &ClusterConfig {
        self.inner.config()
    }

    fn send(&mut self, batch: &[Datagram<'_>]) -> Result<(), TransportError> {
        let cfg = self.inner.config();
        cfg.check_batch(batch)?;
        let mut now_batch: Vec<Datagram<'_>> = Vec::with_capacity(batch.len());
        let mut new_held = Vec::new();
        let now = self.clock.now_ns();
        for d in batch {
            if self.rng.gen_bool(self.cfg.drop) {
                self.counters.add(Counter::FaultDropped, 1);
                continue;
            }
            let copies = if self.rng.gen_bool(self.cfg.duplicate) {
                self.counters.add(Counter::FaultDuplicated, 1);
                2
            } else {
                1
            };
            for _ in 0..copies {
                if self.rng.gen_bool(self.cfg.delay) {
                    self.counters.add(Counter::FaultDelayed, 1);
                    let max = duration_ns(self.cfg.max_delay).max(1);
                    let release = now.saturating_add(self.rng.gen_range(0..max));
                    self.delayed.push_back(Held {
                        dst: d.dst,
                        payload: d.payload.to_vec(),
                        release,
                    });
                } else if self.rng.gen_bool(self.cfg.reorder) {
                    self.counters.add(Counter::FaultReordered, 1);
                    new_held.push(Held {
                        dst: d.dst,
                        payload: d.payload.to_vec(),
                        release: now,
                    });
                } else {
                    now_batch.push(*d);
                }
            }
        }
        if !now_batch.is_empty() {
            self.inner.send(&now_batch)?;
        }
        // Datagrams held back by the previous batch go out after this one.
        let previous = std::mem::replace(&mut self.held, new_held);
        self.send_owned(&previous);
        self.release_due();
        Ok(())
    }

    fn poll_recv(&mut self, max: usize, sink: &mut dyn FnMut(EndpointAddr, &[u8])) -> usize {
        self.release_due();
        self.inner.poll_recv(max, sink)
    }

    fn post(&mut self, ops: &[OneSidedOp<'_>]) -> Result<(), TransportError> {
        self.inner.post(ops)
    }

    fn poll_cq(&mut self, max: usize, out: &mut Vec<Completion>) -> usize {
        self.release_due();
        self.inner.poll_cq(max, out)
    }

    fn outstanding(&self) -> usize {
        self.inner.outstanding()
    }

    fn wait(&mut self, timeout: Duration) {
        self.release_due();
        // Held-back datagrams must not wait for a next batch that never comes.
        if !self.held.is_empty() {
            let held = std::mem::take(&mut self.held);
            self.send_owned(&held);
        }
        let timeout = match self.delayed.iter().map(|h| h.release).min() {
            Some(t) => timeout.min(Duration::from_nanos(t.saturating_sub(self.clock.now_ns()))),
            None => timeout,
        };
        self.inner.wait(timeout);
        self.release_due();
    }

    fn set_epoch(&mut self, epoch: u32) {
        self.inner.set_epoch(epoch)
    }

    fn host_threads(&self) -> usize {
        self.inner.host_threads()
    }

    fn waker(&self) -> Option<std::sync::Arc<dyn crate::EndpointWaker>> {
        self.inner.waker()
    }

    fn counters(&self) -> CounterSnapshot {
        let mut s = self.inner.counters();
        s.merge(&self.counters.snapshot());
        s
    }
}
