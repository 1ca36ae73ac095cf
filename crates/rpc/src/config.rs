//! Runtime settings, the credit formula and errors.

use crate::runtime::OneSidedError;
use ambidex_transport::{
    ring, AccessError, ClusterConfig, EndpointAddr, NodeId, ThreadId, TransportError,
};
use std::fmt;
use std::time::Duration;

/// Which thread of a destination node a request goes to (`Ctx::queue`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadMap {
    /// Thread i talks to thread i (FaSST's peer threads): each endpoint then receives
    /// requests from one thread per node, which keeps the credit budget large.
    Peer,
    /// Every request goes to this thread; any thread of any node may then send to it.
    Fixed(ThreadId),
}

pub use ambidex_transport::rtt::DEFAULT_RTO_MIN;

/// Default largest RPC message (request or response) in bytes; see [`RuntimeConfig::max_message`].
pub const DEFAULT_MAX_MESSAGE: usize = 64 * 1024;

#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// Floor of the retransmission timeout, which otherwise follows the measured round
    /// trip to each destination endpoint (SRTT + 4·RTTVAR, RFC 6298). It keeps a peer
    /// that is merely descheduled from being flooded with retransmissions: see
    /// [`DEFAULT_RTO_MIN`] for the measurement behind the default.
    pub rto_min: Duration,
    /// Ceiling of the timeout, which doubles on every expiry until a fresh sample.
    pub rto_max: Duration,
    /// The timeout before a destination's first round trip is measured.
    pub rto_initial: Duration,
    /// A request unanswered this long after it was first sent fails
    /// ([`RpcError::Timeout`]) and its destination's node is suspected (`take_suspects`,
    /// `on_suspect`). The timeouts are capped by it, so `rto_min == give_up` means no
    /// retransmission at all (FaSST, [`RuntimeConfig::fasst`]).
    pub give_up: Duration,
    /// Coalesce requests (and responses) to one endpoint into one datagram.
    pub coalesce: bool,
    pub thread_map: ThreadMap,
    /// Overrides the computed per-(thread, destination) credit budget (datagrams).
    pub credits: Option<u32>,
    /// Requests in flight per (thread, destination endpoint): the duplicate-suppression
    /// window. Rounded up to a power of two.
    pub window: u32,
    /// Largest request or response in bytes (segmented above one datagram). Capped by
    /// `credits * segment payload` and by the wire limit.
    pub max_message: usize,
    /// Datagrams taken from the receive queue per master poll.
    pub poll_batch: usize,
    /// Empty polls before `run*` parks the thread in `Endpoint::wait`. Short: a master
    /// step of the peer takes far longer than a few empty polls, so spinning longer mostly
    /// burns CPU (and, on an oversubscribed machine, the peer's time slice).
    pub spin_polls: u32,
    /// After `spin_polls`, empty polls each preceded by a `sched_yield` before parking.
    /// With more busy threads than cores (3 nodes on 2 cores) the awaited thread is often
    /// runnable on this core, and a yield hands it the core for far less than a park and
    /// a futex wake-up (SmallBank: about 1.5x the throughput per CPU-second of 0 here).
    /// With a core to spare, a yield returns at once and costs one system call.
    pub yield_polls: u32,
    /// While requests are in flight and something arrived less than this long ago, an
    /// idle thread keeps polling (each poll after a `sched_yield`) instead of parking:
    /// the responses are on their way, and a park costs the sender a futex wake-up and
    /// this thread a context switch per exchange (2 nodes on 2 cores: about 1.5x the
    /// RPCs per CPU-second). 0: park as soon as the spin and yield polls are used up.
    /// `None` (the default): `AUTO_BUSY_WAIT` (50 µs) if every polling thread on this host
    /// has a core of its own (`Endpoint::host_threads` <= available cores), else 0 — with
    /// more pollers than cores, waiting busily takes the core from the very thread that
    /// would answer (3 nodes on 2 cores: 2-20% fewer transactions per CPU-second).
    pub busy_wait: Option<Duration>,
    /// Longest park in `Endpoint::wait`.
    pub max_wait: Duration,
    /// Incarnation nonce of this endpoint's requests; derived from the clock and the
    /// address if `None` (a simulator passes its own for determinism).
    pub session: Option<u32>,
    /// Reassembly buffers per thread (messages being reassembled at once).
    pub reassembly_slots: usize,
    /// Send the responses of a poll before resuming the coroutines it made ready (FaSST
    /// §4: the responses of one poll go out as one batch). The peer then works on them
    /// while this thread runs its coroutines; sent together at the end of the step, the
    /// two threads of a 2-node cluster take turns instead.
    pub respond_first: bool,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            rto_min: DEFAULT_RTO_MIN,
            rto_max: Duration::from_millis(100),
            rto_initial: Duration::from_millis(5),
            give_up: Duration::from_secs(1),
            coalesce: true,
            thread_map: ThreadMap::Peer,
            credits: None,
            window: 256,
            max_message: DEFAULT_MAX_MESSAGE,
            poll_batch: 64,
            spin_polls: 16,
            yield_polls: 2,
            busy_wait: None,
            max_wait: Duration::from_millis(1),
            session: None,
            reassembly_slots: 8,
            respond_first: true,
        }
    }
}

/// What an idle poller does after its `idle`-th empty poll in a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleStep {
    Spin,
    Yield,
    Park,
}

/// Busy-wait bound of the `busy_wait: None` setting when every poller has a core.
pub const AUTO_BUSY_WAIT: Duration = Duration::from_micros(50);

impl RuntimeConfig {
    /// The busy-wait bound in effect for a thread on a host with `host_threads` polling
    /// threads (see [`RuntimeConfig::busy_wait`]).
    pub fn busy_wait_for(&self, host_threads: usize) -> Duration {
        self.busy_wait.unwrap_or_else(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            if host_threads <= cores {
                AUTO_BUSY_WAIT
            } else {
                Duration::ZERO
            }
        })
    }

    /// The idle policy of [`Runtime::run_until`](crate::Runtime::run_until) (and of the
    /// RPC benchmark's raw phase): `spin_polls` spins, then `yield_polls` yields, then a
    /// park, except that it keeps yielding while `busy()` (asked only past the spins:
    /// it may read a clock) says responses are due.
    pub fn idle_step(&self, idle: u32, busy: impl FnOnce() -> bool) -> IdleStep {
        if idle < self.spin_polls {
            IdleStep::Spin
        } else if idle < self.spin_polls.saturating_add(self.yield_polls) || busy() {
            IdleStep::Yield
        } else {
            IdleStep::Park
        }
    }

    /// FaSST's behaviour (§4.3): no retransmission; the first timeout (1 s) declares the
    /// destination failed.
    pub fn fasst() -> Self {
        let s = Duration::from_secs(1);
        RuntimeConfig {
            rto_min: s,
            rto_max: s,
            rto_initial: s,
            give_up: s,
            ..Default::default()
        }
    }

    /// The retransmission timeout's bounds in effect, in ns: (initial, min, max), with
    /// `rto_min <= rto_max <= give_up` (a timeout beyond the give-up time would never be
    /// used).
    pub fn rto_bounds_ns(&self) -> (u64, u64, u64) {
        let ns = |d: Duration| d.as_nanos().min(u64::MAX as u128) as u64;
        let give_up = ns(self.give_up).max(1);
        let max = ns(self.rto_max).clamp(1, give_up);
        let min = ns(self.rto_min).clamp(1, max);
        (ns(self.rto_initial).clamp(min, max), min, max)
    }

    /// Endpoints that may send requests to one endpoint.
    pub fn senders_per_endpoint(&self, c: &ClusterConfig) -> usize {
        match self.thread_map {
            ThreadMap::Peer => c.nodes as usize,
            ThreadMap::Fixed(_) => c.endpoints(),
        }
    }

    /// Per-(thread, destination) budget of request datagrams in flight.
    ///
    /// FaSST §4.4 provisions N·c·m receive slots per queue; here the queue depth R is
    /// given and the budget C is derived from it. An endpoint's receive queue holds the
    /// requests of its S senders (≤ C each) plus the responses to its own requests to S
    /// destinations (one response datagram per request datagram, ≤ C each), so
    /// `2·S·C ≤ R`. In the ring backends each (sender → receiver) ring, which holds at
    /// least min(R, 64) full datagrams, carries the sender's requests (≤ C) and its
    /// responses to the receiver's requests (≤ C), so `2·C ≤ min(R, 64)`.
    pub fn credits_for(&self, c: &ClusterConfig) -> Result<u32, RpcError> {
        if let Some(cr) = self.credits {
            return if cr == 0 {
                Err(RpcError::Config("credits must be at least 1".into()))
            } else {
                Ok(cr)
            };
        }
        let s = self.senders_per_endpoint(c).max(1);
        let by_queue = c.recv_depth / (2 * s);
        let by_ring = c.recv_depth.min(64) / 2;
        let cr = by_queue.min(by_ring);
        if cr == 0 {
            return Err(RpcError::Config(format!(
                "recv_depth {} is too small for {s} senders per endpoint (needs >= {})",
                c.recv_depth,
                2 * s
            )));
        }
        Ok(cr as u32)
    }

    /// Kept for reference: ring capacity of the ring backends, in bytes.
    pub fn ring_bytes(c: &ClusterConfig) -> usize {
        ring::ring_bytes_for(c.mtu, c.recv_depth)
    }
}

/// Errors a worker sees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RpcError {
    /// The message exceeds the runtime's limit (`max` bytes).
    TooLarge {
        len: usize,
        max: usize,
    },
    /// One flush needs more datagrams or requests to one destination than its whole
    /// budget; it could never be sent.
    BatchTooLarge {
        dest: EndpointAddr,
        datagrams: usize,
        requests: usize,
    },
    UnknownDestination(EndpointAddr),
    /// The destination had no handler for the request type.
    NoHandler {
        rtype: u8,
    },
    /// The handler's response exceeded the limit.
    ResponseTooLarge,
    /// No response within the give-up time; the destination is suspected to have failed.
    Timeout {
        dest: EndpointAddr,
    },
    /// The response is not in yet (or the handle is not from the current batch).
    NotReady,
    /// `queue` while a flush of this coroutine is still in progress.
    FlushInProgress,
    /// A one-sided operation's error (see [`OneSidedError`]), through `?`.
    OneSided(OneSidedError),
    /// Unsignaled one-sided operations of this worker failed since they were last
    /// reported (returned once by a flush, after its own requests and operations are
    /// in: the batch itself went through).
    UnsignaledFailed(Vec<OneSidedError>),
    Transport(TransportError),
    Config(String),
    /// The cluster moved to a new epoch while the request was queued or in flight: it
    /// was failed (it may have executed in the old epoch, never in the new one).
    EpochChanged,
    /// The node is not a member of the current configuration.
    NotMember(NodeId),
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RpcError::TooLarge { len, max } => {
                write!(f, "RPC message of {len} bytes exceeds the limit of {max} bytes")
            }
            RpcError::BatchTooLarge {
                dest,
                datagrams,
                requests,
            } => write!(
                f,
                "batch needs {datagrams} datagrams / {requests} requests to {dest}, more than its budget"
            ),
            RpcError::UnknownDestination(a) => write!(f, "destination {a} is not in the cluster"),
            RpcError::NoHandler { rtype } => write!(f, "no handler for request type {rtype}"),
            RpcError::ResponseTooLarge => write!(f, "response exceeded the message limit"),
            RpcError::Timeout { dest } => write!(f, "no response from {dest}; suspected failed"),
            RpcError::NotReady => write!(f, "response not ready"),
            RpcError::FlushInProgress => write!(f, "a flush of this coroutine is in progress"),
            RpcError::OneSided(e) => write!(f, "{e}"),
            RpcError::UnsignaledFailed(v) => match v.first() {
                Some(e) => write!(f, "{} unsignaled operations failed, first: {e}", v.len()),
                None => write!(f, "unsignaled operations failed"),
            },
            RpcError::Transport(e) => write!(f, "{e}"),
            RpcError::Config(s) => write!(f, "bad RPC configuration: {s}"),
            RpcError::EpochChanged => {
                write!(f, "the cluster moved to a new configuration; the request was failed")
            }
            RpcError::NotMember(n) => write!(f, "node {n} is not a member of the configuration"),
        }
    }
}

impl RpcError {
    /// Whether a change of epoch failed the request or operation (it says nothing about
    /// its target: the same one may succeed in the new epoch).
    pub fn is_epoch_change(&self) -> bool {
        matches!(
            self,
            RpcError::EpochChanged
                | RpcError::OneSided(OneSidedError::Access {
                    error: AccessError::EpochChanged,
                    ..
                })
        )
    }
}

impl std::error::Error for RpcError {}

impl From<OneSidedError> for RpcError {
    fn from(e: OneSidedError) -> Self {
        RpcError::OneSided(e)
    }
}

impl From<TransportError> for RpcError {
    fn from(e: TransportError) -> Self {
        RpcError::Transport(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_wait_is_automatic_only_without_oversubscription() {
        let auto = RuntimeConfig::default();
        assert_eq!(
            auto.busy_wait_for(1),
            AUTO_BUSY_WAIT,
            "one poller always has a core"
        );
        assert_eq!(auto.busy_wait_for(usize::MAX), Duration::ZERO);
        let fixed = RuntimeConfig {
            busy_wait: Some(Duration::from_micros(7)),
            ..Default::default()
        };
        assert_eq!(fixed.busy_wait_for(usize::MAX), Duration::from_micros(7));
    }

    #[test]
    fn idle_steps_spin_then_yield_then_park_unless_busy() {
        let c = RuntimeConfig {
            spin_polls: 2,
            yield_polls: 1,
            ..Default::default()
        };
        let never = || -> bool { panic!("busy() asked while spinning") };
        assert_eq!(c.idle_step(1, never), IdleStep::Spin);
        assert_eq!(c.idle_step(2, || false), IdleStep::Yield);
        assert_eq!(c.idle_step(3, || false), IdleStep::Park);
        assert_eq!(c.idle_step(3, || true), IdleStep::Yield);
    }
}
