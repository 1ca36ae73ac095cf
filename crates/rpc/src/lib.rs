//! # ambidex-rpc: FaSST-style datagram RPCs and the per-thread coroutine runtime
//!
//! One OS thread per core runs one [`Runtime`]: a *master* loop that polls the thread's
//! endpoint, runs request handlers inline, sends all responses of one poll with one
//! doorbell, and resumes *worker* coroutines (Rust `async` tasks) only when every
//! response they wait for is in (FaSST §4.1–4.2).
//!
//! ```ignore
//! let mut rt = Runtime::new(endpoint, RuntimeConfig::default())?;
//! rt.register(ECHO, |_info, req, resp| resp.extend_from_slice(req));
//! rt.spawn(|ctx| async move {
//!     let a = ctx.queue(1, ECHO, b"x").unwrap();   // no I/O yet
//!     let b = ctx.queue(2, ECHO, b"y").unwrap();
//!     ctx.flush().await.unwrap();                   // one doorbell; resumes when both are in
//!     ctx.response(a, |r| assert_eq!(r, b"x")).unwrap();
//! });
//! rt.run();                       // or step it: rt.poll_once()
//! ```
//!
//! - Requests to one endpoint are coalesced into one datagram. A master step sends the
//!   responses of its poll with one doorbell before it resumes any worker (so the peer
//!   works on them meanwhile), then the requests of every flush of the step with a
//!   second one: requests of several workers to one endpoint share datagrams.
//! - Idle policy ([`Runtime::run_until`]): a few empty polls, a few after a
//!   `sched_yield`, then a park in `Endpoint::wait`; while RPCs are in flight and every
//!   polling thread of the host has a core, it keeps polling for up to
//!   [`RuntimeConfig::busy_wait`] first. See `docs/rpc.md`.
//! - Credits bound the request datagrams in flight per (thread, destination) so no
//!   receive queue overflows ([`RuntimeConfig::credits_for`]).
//! - Lost datagrams: retransmission after a timeout derived from the measured round trip
//!   to each destination ([`RttEstimator`], RFC 6298); the server caches the responses
//!   of a bounded window of request ids per client, so handlers run at most once;
//!   destinations that leave a request unanswered for [`RuntimeConfig::give_up`] are
//!   reported as suspected ([`Runtime::take_suspects`]).
//! - Messages up to [`Runtime::max_message`] bytes are segmented and reassembled.
//! - One-sided READ, WRITE, CAS and FAA are queued beside requests
//!   ([`Ctx::queue_read`] and the like) and posted with the step's doorbell; a flush
//!   waits for its signaled ones, and failing unsignaled ones are reported, never
//!   dropped ([`RpcError::UnsignaledFailed`]).
//! - Every received byte is untrusted ([`wire::decode`]); malformed and unexpected
//!   datagrams are dropped and counted in [`RpcStats`].
//!
//! The runtime has no global state and no hidden threads, and time comes from a
//! [`Clock`], so a simulator can drive many nodes' runtimes step by step in one thread.

pub mod bench;
pub(crate) mod clock;
pub(crate) mod config;
pub(crate) mod epoch;
pub(crate) mod reply;
pub(crate) mod runtime;
pub mod wire;

pub use ambidex_transport::rtt::RttEstimator;
pub use clock::{Clock, ManualClock, SharedClock, SystemClock};
pub use config::{
    IdleStep, RpcError, RuntimeConfig, ThreadMap, DEFAULT_MAX_MESSAGE, DEFAULT_RTO_MIN,
};
pub use epoch::EpochWatch;
pub use reply::Reply;
pub use runtime::{
    Ctx, Flush, Handler, Idle, OneSidedError, OpHandle, Pause, ReqHandle, RequestInfo, RpcStats,
    Runtime, YieldNow,
};

use ambidex_transport::SharedNode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Runs one runtime per thread of `node` (thread t takes endpoint t), each set up by
/// `setup` on its own thread, until `stop` is set; returns each thread's stats.
pub fn spawn_node_threads<F>(
    node: SharedNode,
    cfg: RuntimeConfig,
    setup: F,
    stop: Arc<AtomicBool>,
) -> Vec<JoinHandle<Result<RpcStats, RpcError>>>
where
    F: Fn(&mut Runtime) + Send + Sync + 'static,
{
    let setup = Arc::new(setup);
    (0..node.config().threads_per_node)
        .map(|t| {
            let (node, cfg, setup, stop) = (node.clone(), cfg.clone(), setup.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut rt = Runtime::new(node.endpoint(t)?, cfg)?;
                setup(&mut rt);
                rt.run_until(|_| stop.load(Ordering::Relaxed));
                Ok(rt.stats())
            })
        })
        .collect()
}
