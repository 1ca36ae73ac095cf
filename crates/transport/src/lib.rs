//! # ambidex-transport: the NIC model
//!
//! Every layer of ambidex moves bytes only through this crate. Its interface mirrors
//! RDMA verbs (FaSST §2.2, FaRM §2, DrTM+H §2.1) so that the layers above behave the same
//! on every backend:
//!
//! - one [`Endpoint`] per thread (a datagram QP plus a completion queue), connectionless:
//!   it reaches every endpoint of the cluster by (node, thread);
//! - **datagrams**: unreliable, bounded by the MTU, never corrupted or partial; a batch
//!   is posted with one call ([`Endpoint::send`], the doorbell); each endpoint has a
//!   bounded receive queue and a datagram arriving at a full queue is dropped and counted;
//! - **registered regions** ([`NodeTransport::register`]) reached by one-sided READ, WRITE,
//!   CAS and FAA ([`Endpoint::post`]); bad accesses complete with an error, touch nothing
//!   and are counted; operations from one endpoint to one node complete in order;
//! - **epochs**: datagrams of another epoch are dropped at receive, and one-sided
//!   operations are fenced: once `set_epoch(e)` returned at an endpoint of a node, no
//!   operation stamped with an epoch older than `e` reaches that node's memory (it fails
//!   with [`AccessError::EpochChanged`]); see [`fence`] and `docs/transport.md` for what
//!   each backend guarantees and what it does not.
//!
//! The interface is poll-based: backends run no hidden threads that call back into the
//! layers above, so a single-threaded deterministic simulator can drive many nodes.
//!
//! Backends: [`local`] here (threads of one process); `ambidex-transport-shm`
//! (processes of one host), `ambidex-transport-udp` (hosts) and `ambidex-transport-sim`
//! (a deterministic simulated network, every node in one thread) in `backends/`; and the
//! [`fault`] wrapper for any of them. Every backend passes the [`conformance`] suite.
//! The two ring backends (`local`, `shm`) share [`ring`] (the receive rings) and
//! [`ring_endpoint`] (the datagram half of an endpoint).

pub mod clock;
pub mod conformance;
pub mod counters;
pub mod cputime;
pub mod fault;
pub mod fence;
pub mod local;
pub mod onesided;
pub mod region;
pub mod ring;
pub mod ring_endpoint;
pub mod rtt;
pub mod types;
pub mod wait;

pub use clock::{Clock, ManualClock, SharedClock, SystemClock};
pub use counters::{Counter, CounterSnapshot, Counters};
pub use region::{Region, RegionMemory};
pub use types::*;

use std::sync::Arc;
use std::time::Duration;

/// One thread's window onto the network: a datagram queue pair and a completion queue.
///
/// Not shared between threads (`Send`, not `Sync`). Every polling call also drives the
/// backend's own progress (for udp: serving one-sided requests from remote nodes and
/// retransmitting its own).
pub trait Endpoint: Send {
    /// This endpoint's address.
    fn addr(&self) -> EndpointAddr;

    /// The cluster this endpoint belongs to.
    fn config(&self) -> &ClusterConfig;

    /// Posts a batch of datagrams with one doorbell. The whole batch is checked first: a
    /// datagram over the MTU or to an endpoint outside the cluster is an error and
    /// nothing is sent. Accepted datagrams may still be lost (unreliable delivery).
    fn send(&mut self, batch: &[Datagram<'_>]) -> Result<(), TransportError>;

    /// Delivers up to `max` received datagrams to `sink` (source address, payload) and
    /// returns how many. The payload slice is valid only during the call.
    fn poll_recv(&mut self, max: usize, sink: &mut dyn FnMut(EndpointAddr, &[u8])) -> usize;

    /// Posts a batch of one-sided operations with one doorbell. Access errors are
    /// reported as error completions, not here; `Err` means the batch itself is malformed
    /// (for example a WRITE larger than `max_onesided`) and nothing was posted.
    fn post(&mut self, ops: &[OneSidedOp<'_>]) -> Result<(), TransportError>;

    /// Appends up to `max` completions to `out` and returns how many. Signaled operations
    /// always complete; unsignaled ones only if they fail.
    fn poll_cq(&mut self, max: usize, out: &mut Vec<Completion>) -> usize;

    /// Number of posted one-sided operations not yet completed (or confirmed).
    fn outstanding(&self) -> usize;

    /// Blocks until a datagram or completion may be ready, or `timeout` passes. Pollers
    /// call this after spinning briefly, so an idle thread yields its core.
    fn wait(&mut self, timeout: Duration);

    /// Changes the epoch stamped on outgoing datagrams and one-sided operations and
    /// required of incoming ones. Raises this node's epoch fence: when it returns, no
    /// one-sided operation of an older epoch is still running on this node's memory or
    /// will run there (`local`, `shm`, `sim`; `udp` per endpoint). In `local` and `shm`
    /// it waits for operations of an older epoch in progress, as long as their initiator
    /// lives (see [`fence`]). This endpoint's own operations still in flight fail with
    /// `AccessError::EpochChanged` (`udp`, `sim`; `local` and `shm` complete every
    /// operation within `post`), as a reset queue pair flushes its work requests: the
    /// runtime relies on it to resume a coroutine waiting on a node that left.
    fn set_epoch(&mut self, epoch: u32);

    /// This endpoint's counters (including drops counted on its behalf by senders).
    fn counters(&self) -> CounterSnapshot;

    /// A doorbell other threads ring to end this endpoint's current or next
    /// [`Endpoint::wait`] early (work for the poller that came from outside the
    /// network). `None` if the backend has none (`sim`, single-threaded, needs none).
    fn waker(&self) -> Option<Arc<dyn EndpointWaker>> {
        None
    }

    /// Polling threads of the cluster that run on this host (they share its cores). A
    /// poller may busy-wait for responses only when each of them has a core of its own.
    fn host_threads(&self) -> usize {
        self.config().threads_per_node as usize
    }
}

/// The doorbell of one endpoint ([`Endpoint::waker`]): cheap to clone (an `Arc`) and
/// usable from any thread.
pub trait EndpointWaker: Send + Sync {
    /// Ends the endpoint's current [`Endpoint::wait`], or its next one if it is not
    /// waiting. Work published before this call is visible to the poller once its wait
    /// returns. Costs a fence and a load when the poller is not parked.
    fn wake(&self);
}

/// One node's transport: registers memory and hands out one endpoint per thread.
pub trait NodeTransport: Send + Sync {
    fn node(&self) -> NodeId;

    fn config(&self) -> &ClusterConfig;

    /// Registers `len` zeroed bytes with `perms` and a fresh random key.
    fn register(&self, len: usize, perms: Perms) -> Result<Region, TransportError>;

    /// The region `id` registered on this node, if any.
    fn region(&self, id: RegionId) -> Option<Region>;

    /// The endpoint of `thread`; each thread's endpoint can be taken once.
    fn endpoint(&self, thread: ThreadId) -> Result<Box<dyn Endpoint>, TransportError>;

    /// Node-wide counters (for example remote access violations against its regions).
    fn counters(&self) -> CounterSnapshot;

    /// This node crashed and starts again in this process as a new incarnation (an
    /// in-process restart): its endpoints can be taken again. Every thread of the old
    /// incarnation must have stopped for good (its endpoints are never used again).
    /// Regions already registered stay (battery-backed, as in `sim`); the new
    /// incarnation registers its own. Backends whose nodes are processes restart by
    /// starting a new process, not through this.
    fn restart(&self) -> Result<(), TransportError> {
        Err(TransportError::Config(format!(
            "node {}: this transport cannot restart a node in process",
            self.node()
        )))
    }
}

/// A node transport shared by the threads of a node.
pub type SharedNode = Arc<dyn NodeTransport>;
