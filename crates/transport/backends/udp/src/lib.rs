//! # ambidex-transport-udp: the NIC model over UDP, for nodes on different hosts
//!
//! Endpoint `t` of node `n` is one non-blocking UDP socket bound at
//! `addrs[n].ip : addrs[n].port + t`. Every datagram carries the [`wire`] header (magic,
//! version, cluster id, epoch, kind, source and destination endpoint); anything that does
//! not decode, or belongs to another cluster or epoch or endpoint, is dropped and counted.
//!
//! - **Datagrams**: [`Endpoint::send`] posts a whole batch with one `sendmmsg` (the
//!   doorbell; header and payload are gathered from two iovecs, nothing is copied) and
//!   `poll_recv` drains the socket with `recvmmsg` into preallocated buffers. The receive
//!   queue is the kernel's socket buffer, sized to hold about `recv_depth` small
//!   datagrams; the kernel's drops are read from the socket (SO_RXQ_OVFL on every
//!   received datagram, SO_MEMINFO when counters are read) and counted as
//!   `rx_dropped_queue_full`, so every drop is counted.
//! - **One-sided READ/WRITE/CAS/FAA: the remote CPU IS involved.** Unlike `local`, `shm`
//!   and RDMA, a request travels to the target node's endpoint with the initiator's
//!   thread index (thread 0 if the target has no such thread) and is executed there,
//!   inside that endpoint's `poll_recv`/`poll_cq`/`wait`, with the same checks as every
//!   backend ([`ambidex_transport::onesided`]). So a target thread that stops polling
//!   stops serving one-sided operations, and one-sided latency includes the target's
//!   poll loop. Operations to the initiator's own node run immediately, as in `local`.
//! - **Reliability of one-sided operations** (datagrams may be lost or duplicated): each
//!   (initiator endpoint → target node) stream has a random session id and sequence
//!   numbers. The target executes strictly in order (`seq == expected`), keeps the
//!   responses of the last [`WINDOW`] sequence numbers to answer retransmitted
//!   duplicates without executing them again (a CAS or FAA never runs twice), and drops
//!   anything else. The initiator keeps at most [`WINDOW`] requests in flight per target
//!   node (the rest wait locally), retransmits a request after a timeout derived from
//!   the measured round trip to that node ([`RttEstimator`]: SRTT + 4·RTTVAR within
//!   [`UdpOptions::rto_min`]..=[`UdpOptions::rto_max`], doubling while the node is
//!   silent; Karn's rule), delivers completions in post order per target node, and once
//!   a request has gone unanswered for [`UdpOptions::give_up`] since it was first sent
//!   fails every pending operation to that node with [`AccessError::Timeout`] and starts
//!   a new session (like a QP entering the error state: a timed-out operation may or may
//!   not have executed).
//!
//! There are no hidden threads: all progress (serving requests, retransmitting, landing
//! READ data) happens inside `poll_recv`, `poll_cq`, `wait` and `post`.

mod sys;
pub mod wire;

use ambidex_transport::clock::{duration_ns, SharedClock, SystemClock};
use ambidex_transport::counters::{Counter, CounterSnapshot, Counters};
use ambidex_transport::local::RegionTable;
use ambidex_transport::onesided;
use ambidex_transport::rtt::{RttEstimator, DEFAULT_RTO_MIN};
use ambidex_transport::wait::Doorbell;
use ambidex_transport::EndpointWaker;
use ambidex_transport::{
    AccessError, ClusterConfig, Completion, Datagram, Endpoint, EndpointAddr, LocalBuf, NodeId,
    NodeTransport, OneSidedKind, OneSidedOp, OpCode, Perms, Region, RegionId, RemoteAddr,
    SharedNode, ThreadId, TransportError,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::cell::Cell;
use std::collections::VecDeque;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use sys::RawAddr;
use wire::{Body, Packet, ReqOp, Request, Response, HDR_LEN};

/// Most one-sided requests in flight per (initiator endpoint, target node), and the
/// number of responses a target keeps per stream for duplicates. Part of the protocol:
/// every node must use the same value.
pub const WINDOW: usize = 32;

/// Receive slots per `recvmmsg` call.
const SLOTS: usize = 32;
/// Most `recvmmsg` rounds one `poll_recv` makes, so a flood cannot pin the caller.
const MAX_ROUNDS: usize = 16;
/// Recycled buffers kept for stash entries and request packets.
const MAX_SPARE: usize = 256;

/// Tuning of the one-sided reliability protocol, and a test-only loss injector.
#[derive(Clone, Debug)]
pub struct UdpOptions {
    /// Retransmission timeout before the first round trip to a node is measured.
    pub rto_initial: Duration,
    /// Floor of the measured retransmission timeout (a descheduled target answers late;
    /// see [`DEFAULT_RTO_MIN`]).
    pub rto_min: Duration,
    /// Ceiling of the retransmission timeout, which doubles while a node is silent.
    pub rto_max: Duration,
    /// A request unanswered this long after it was first sent fails its node's
    /// operations with `Timeout`. The same default as the RPC runtime's `give_up`, as a
    /// NIC's retry budget and the RPC timeouts are set together.
    pub give_up: Duration,
    /// How long `send` waits for room in a full kernel send buffer before giving up.
    pub send_patience: Duration,
    /// Drops and duplicates one-sided requests and responses this node sends (tests).
    pub loss: Option<LossConfig>,
    /// Sends runs of equal-sized datagrams to one endpoint as one UDP GSO message
    /// (UDP_SEGMENT): the kernel cuts them into ordinary datagrams, so receivers see no
    /// difference, and the stack is traversed once per run. Turned off by itself if the
    /// kernel or the route refuses it.
    pub gso: bool,
    /// Times retransmissions and the send buffer's patience (the process's system clock
    /// unless a test or a simulator brings its own).
    pub clock: SharedClock,
}

impl Default for UdpOptions {
    fn default() -> Self {
        UdpOptions {
            rto_initial: Duration::from_millis(5),
            rto_min: DEFAULT_RTO_MIN,
            rto_max: Duration::from_millis(100),
            give_up: Duration::from_secs(1),
            send_patience: Duration::from_millis(50),
            loss: None,
            gso: true,
            clock: SystemClock::shared(),
        }
    }
}

impl UdpOptions {
    /// A fresh estimator of these bounds (the ceiling at most `give_up`).
    fn estimator(&self) -> RttEstimator {
        let give_up = duration_ns(self.give_up).max(1);
        let max = duration_ns(self.rto_max).clamp(1, give_up);
        let min = duration_ns(self.rto_min).clamp(1, max);
        RttEstimator::new(duration_ns(self.rto_initial), min, max)
    }
}

/// Seeded loss and duplication of the one-sided packets a node sends. Datagrams are left
/// alone (wrap the endpoint in `ambidex_transport::fault` for those).
#[derive(Clone, Debug)]
pub struct LossConfig {
    pub seed: u64,
    pub drop: f64,
    pub duplicate: f64,
}

/// Opens the udp transport of one node.
pub struct UdpNode {
    sh: Arc<Shared>,
}

struct Shared {
    config: ClusterConfig,
    node: NodeId,
    opts: UdpOptions,
    /// Kernel address of every endpoint of the cluster, by dense endpoint index.
    dests: Vec<RawAddr>,
    /// This node's sockets, bound at open so that early datagrams queue; taken once each.
    sockets: Vec<Mutex<Option<UdpSocket>>>,
    /// Endpoints of nodes at this node's IP address (or, for a loopback address, at any
    /// loopback address): they run on this host.
    host_threads: usize,
    regions: RegionTable,
    counters: Counters,
}

/// The socket address of endpoint `a`: its node's base address, port + thread.
pub fn endpoint_socket_addr(addrs: &[SocketAddr], a: EndpointAddr) -> Option<SocketAddr> {
    let base = addrs.get(a.node as usize)?;
    let port = base.port().checked_add(a.thread)?;
    Some(SocketAddr::new(base.ip(), port))
}

impl UdpNode {
    /// Opens node `node` of the cluster whose node base addresses are `addrs`, binding
    /// all of its endpoints' sockets.
    pub fn open(
        config: &ClusterConfig,
        addrs: &[SocketAddr],
        node: NodeId,
    ) -> Result<SharedNode, TransportError> {
        Self::open_with(config, addrs, node, UdpOptions::default())
    }

    /// As [`UdpNode::open`], with explicit protocol options.
    pub fn open_with(
        config: &ClusterConfig,
        addrs: &[SocketAddr],
        node: NodeId,
        opts: UdpOptions,
    ) -> Result<SharedNode, TransportError> {
        Ok(Arc::new(Self::open_node(config, addrs, node, opts)?))
    }

    /// As [`UdpNode::open_with`], returning the concrete type.
    pub fn open_node(
        config: &ClusterConfig,
        addrs: &[SocketAddr],
        node: NodeId,
        opts: UdpOptions,
    ) -> Result<UdpNode, TransportError> {
        config.validate()?;
        let bad = |s: String| Err(TransportError::Config(s));
        if addrs.len() != config.nodes as usize {
            return bad(format!(
                "{} node addresses for a cluster of {} nodes",
                addrs.len(),
                config.nodes
            ));
        }
        if node >= config.nodes {
            return bad(format!("node {node} outside a cluster of {}", config.nodes));
        }
        if addrs.iter().any(|a| a.is_ipv4() != addrs[0].is_ipv4()) {
            return bad("node addresses mix IPv4 and IPv6".into());
        }
        if let Some(p) = &opts.loss {
            if !(0.0..=1.0).contains(&p.drop) || !(0.0..=1.0).contains(&p.duplicate) {
                return bad("loss probabilities must be within 0..=1".into());
            }
        }
        let mut dests = Vec::with_capacity(config.endpoints());
        for n in 0..config.nodes {
            for t in 0..config.threads_per_node {
                let Some(a) = endpoint_socket_addr(addrs, EndpointAddr::new(n, t)) else {
                    return bad(format!("node {n}: base port + {t} threads exceeds 65535"));
                };
                dests.push(RawAddr::new(a));
            }
        }
        // The receive queue is the socket buffer: room for about recv_depth small
        // datagrams (the kernel charges ~800 B-1 KiB of buffer per small datagram, so
        // fewer MTU-sized ones fit).
        let rcvbuf = config.recv_depth * 1024;
        let mut sockets = Vec::new();
        for t in 0..config.threads_per_node {
            let a = endpoint_socket_addr(addrs, EndpointAddr::new(node, t)).unwrap();
            let s = sys::bind(a, rcvbuf).map_err(|e| {
                TransportError::Io(format!("binding endpoint {node}.{t} at {a}: {e}"))
            })?;
            sockets.push(Mutex::new(Some(s)));
        }
        let me = addrs[node as usize].ip();
        let same_host = |ip: std::net::IpAddr| ip == me || (ip.is_loopback() && me.is_loopback());
        let host_threads =
            addrs.iter().filter(|a| same_host(a.ip())).count() * config.threads_per_node as usize;
        Ok(UdpNode {
            sh: Arc::new(Shared {
                config: config.clone(),
                node,
                opts,
                dests,
                sockets,
                host_threads,
                regions: RegionTable::new(node),
                counters: Counters::default(),
            }),
        })
    }
}

impl NodeTransport for UdpNode {
    fn node(&self) -> NodeId {
        self.sh.node
    }

    fn config(&self) -> &ClusterConfig {
        &self.sh.config
    }

    fn register(&self, len: usize, perms: Perms) -> Result<Region, TransportError> {
        self.sh.regions.register(len, perms)
    }

    fn region(&self, id: RegionId) -> Option<Region> {
        self.sh.regions.get(id).cloned()
    }

    fn endpoint(&self, thread: ThreadId) -> Result<Box<dyn Endpoint>, TransportError> {
        let addr = EndpointAddr::new(self.sh.node, thread);
        if !self.sh.config.contains(addr) {
            return Err(TransportError::UnknownDestination(addr));
        }
        let sock = self.sh.sockets[thread as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| TransportError::Config(format!("endpoint {addr} already taken")))?;
        Ok(Box::new(UdpEndpoint::new(self.sh.clone(), addr, sock)))
    }

    fn counters(&self) -> CounterSnapshot {
        self.sh.counters.snapshot()
    }
}

// ---- batched socket I/O ---------------------------------------------------------------

/// Reusable `mmsghdr`/`iovec` arrays. They hold raw pointers into buffers of the owning
/// endpoint, rebuilt before each call.
#[derive(Default)]
struct MsgVecs {
    iovs: Vec<libc::iovec>,
    msgs: Vec<libc::mmsghdr>,
}

// SAFETY: the pointers are only dereferenced by the kernel during a call made by the
// endpoint that owns both the arrays and the buffers they point into.
unsafe impl Send for MsgVecs {}

fn msghdr(name: &RawAddr, iov: *mut libc::iovec, iovlen: usize) -> libc::mmsghdr {
    // SAFETY: all-zero is a valid mmsghdr (null pointers, zero lengths).
    let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
    m.msg_hdr.msg_name = &name.storage as *const _ as *mut libc::c_void;
    m.msg_hdr.msg_namelen = name.len;
    m.msg_hdr.msg_iov = iov;
    m.msg_hdr.msg_iovlen = iovlen as _;
    m
}

/// Preallocated receive buffers for one `recvmmsg` of up to [`SLOTS`] datagrams.
struct Rx {
    bufs: Vec<u8>,
    slot_len: usize,
    ctrl: Vec<[u64; 8]>,
    io: MsgVecs,
}

impl Rx {
    fn new(slot_len: usize) -> Rx {
        let mut rx = Rx {
            bufs: vec![0u8; slot_len * SLOTS],
            slot_len,
            ctrl: vec![[0u64; 8]; SLOTS],
            io: MsgVecs::default(),
        };
        for i in 0..SLOTS {
            rx.io.iovs.push(libc::iovec {
                // SAFETY: within bufs, which is never resized.
                iov_base: unsafe { rx.bufs.as_mut_ptr().add(i * slot_len) } as *mut libc::c_void,
                iov_len: slot_len,
            });
        }
        for i in 0..SLOTS {
            // SAFETY: all-zero is a valid mmsghdr.
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            m.msg_hdr.msg_iov = &mut rx.io.iovs[i];
            m.msg_hdr.msg_iovlen = 1;
            m.msg_hdr.msg_control = rx.ctrl[i].as_mut_ptr() as *mut libc::c_void;
            rx.io.msgs.push(m);
        }
        rx
    }

    /// Receives up to `want` (<= SLOTS) datagrams without blocking.
    fn recv(&mut self, fd: RawFd, want: usize) -> usize {
        for m in &mut self.io.msgs[..want] {
            m.msg_hdr.msg_controllen = std::mem::size_of::<[u64; 8]>() as _;
            m.msg_hdr.msg_flags = 0;
            m.msg_len = 0;
        }
        // SAFETY: every header points at a slot buffer and control buffer owned by self.
        let r = unsafe {
            libc::recvmmsg(
                fd,
                self.io.msgs.as_mut_ptr(),
                want as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        r.max(0) as usize
    }

    /// Slot `i` of the last `recv`: its bytes, whether the datagram was longer than the
    /// slot, and the socket's cumulative drop count if the kernel attached it.
    fn slot(&self, i: usize) -> (&[u8], bool, Option<u32>) {
        let m = &self.io.msgs[i];
        let len = (m.msg_len as usize).min(self.slot_len);
        let trunc = m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
        let mut ovfl = None;
        // SAFETY: the kernel filled msg_control/msg_controllen of this header.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&m.msg_hdr);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == sys::SO_RXQ_OVFL {
                    ovfl = Some((libc::CMSG_DATA(c) as *const u32).read_unaligned());
                }
                c = libc::CMSG_NXTHDR(&m.msg_hdr, c);
            }
        }
        let start = i * self.slot_len;
        (&self.bufs[start..start + len], trunc, ovfl)
    }
}

/// Packets generated by the transport itself (one-sided requests, responses and their
/// retransmissions), gathered during a progress step and sent with one `sendmmsg`.
struct Out {
    arena: Vec<u8>,
    items: Vec<(usize, usize, usize)>,
    io: MsgVecs,
    loss: Option<(SmallRng, LossConfig)>,
}

impl Out {
    fn push(&mut self, pkt: &[u8], dst: usize, counters: &Counters) {
        let mut copies = 1;
        if let Some((rng, p)) = &mut self.loss {
            if rng.gen_bool(p.drop) {
                counters.add(Counter::FaultDropped, 1);
                return;
            }
            if rng.gen_bool(p.duplicate) {
                counters.add(Counter::FaultDuplicated, 1);
                copies = 2;
            }
        }
        for _ in 0..copies {
            self.items.push((self.arena.len(), pkt.len(), dst));
            self.arena.extend_from_slice(pkt);
        }
    }

    fn flush(&mut self, fd: RawFd, dests: &[RawAddr], opts: &UdpOptions) {
        if self.items.is_empty() {
            return;
        }
        self.io.iovs.clear();
        for &(off, len, _) in &self.items {
            self.io.iovs.push(libc::iovec {
                // SAFETY: within the arena, which is not modified until the send is done.
                iov_base: unsafe { self.arena.as_mut_ptr().add(off) } as *mut libc::c_void,
                iov_len: len,
            });
        }
        self.io.msgs.clear();
        for (i, &(_, _, dst)) in self.items.iter().enumerate() {
            let iov = &mut self.io.iovs[i] as *mut libc::iovec;
            self.io.msgs.push(msghdr(&dests[dst], iov, 1));
        }
        // A packet the kernel refuses is recovered like a lost one (retransmission).
        sys::send_all(
            fd,
            &mut self.io.msgs,
            opts.send_patience,
            &*opts.clock,
            &mut |_| {},
        );
        self.items.clear();
        self.arena.clear();
    }
}

// ---- one-sided state ------------------------------------------------------------------

/// An operation posted to a remote node and not yet delivered to the completion queue.
struct Pending {
    wr_id: u64,
    op: OpCode,
    signaled: bool,
    /// Where a READ lands, and its length.
    read: Option<(LocalBuf, u32)>,
    /// The encoded request, kept for retransmission.
    pkt: Vec<u8>,
    /// Clock time (ns) of the next retransmission.
    deadline: u64,
    /// Clock time (ns) of the first transmission.
    sent: u64,
    retries: u32,
    done: Option<(Result<(), AccessError>, u64)>,
}

/// The initiator's stream to one target node. `ops[i]` has sequence `front_seq + i`;
/// those below `sent_upto` have been transmitted.
struct Peer {
    session: u32,
    front_seq: u64,
    sent_upto: u64,
    ops: VecDeque<Pending>,
    /// Round trips to the node, and the retransmission timeout they give.
    rtt: RttEstimator,
    /// The timeout doubles at most once per timeout period (one loss, one doubling).
    next_backoff: u64,
}

fn new_session(old: u32) -> u32 {
    loop {
        let s: u32 = rand::random();
        if s != old {
            return s;
        }
    }
}

/// The target's view of one initiator endpoint's stream.
struct Stream {
    session: u32,
    /// The session replaced last, whose stale packets must not reset the stream again.
    prev_session: u32,
    expected: u64,
    /// Responses of the last WINDOW sequence numbers, at `seq % WINDOW`.
    cache: Vec<(u64, Vec<u8>)>,
}

impl Stream {
    fn new(session: u32, prev_session: u32) -> Stream {
        Stream {
            session,
            prev_session,
            expected: 0,
            cache: (0..WINDOW).map(|_| (u64::MAX, Vec::new())).collect(),
        }
    }
}

// ---- the endpoint ---------------------------------------------------------------------

struct UdpEndpoint {
    rx: Rx,
    core: Core,
    /// The doorbell; `None` if no eventfd could be made (then `wait` is as before).
    waker: Option<Arc<UdpWaker>>,
}

/// A udp endpoint's doorbell: an eventfd its `wait` polls together with the socket,
/// written only while the endpoint sleeps.
struct UdpWaker {
    bell: Doorbell,
    sleeping: AtomicBool,
    efd: OwnedFd,
}

impl EndpointWaker for UdpWaker {
    fn wake(&self) {
        if self.bell.raise() {
            // Dekker with `wait`: either it sees the flag or this sees it sleeping.
            std::sync::atomic::fence(Ordering::SeqCst);
            if self.sleeping.load(Ordering::SeqCst) {
                sys::eventfd_ring(self.efd.as_raw_fd());
            }
        }
    }
}

struct Core {
    sh: Arc<Shared>,
    addr: EndpointAddr,
    lim: wire::Limits,
    sock: UdpSocket,
    counters: Counters,
    /// The kernel's cumulative drop count already added to `rx_dropped_queue_full`.
    kdrops: Cell<u32>,
    tx_hdrs: Vec<[u8; HDR_LEN]>,
    tx: MsgVecs,
    /// Datagram ranges of the batch being sent, one message each, and their GSO cmsgs.
    tx_groups: Vec<(usize, usize)>,
    tx_ctrl: Vec<[u64; 4]>,
    tx_failed: Vec<usize>,
    gso: bool,
    out: Out,
    /// Datagrams received while progressing one-sided work but not yet asked for.
    stash: VecDeque<(EndpointAddr, Vec<u8>)>,
    /// The stash has not grown since a `poll_recv(0, ..)` declined it, so `wait` may
    /// sleep despite it.
    stash_ignored: bool,
    spare: Vec<Vec<u8>>,
    peers: Vec<Peer>,
    streams: Vec<Option<Stream>>,
    cq: VecDeque<Completion>,
    outstanding: usize,
    /// Earliest retransmission deadline (clock ns) of an in-flight request.
    next_deadline: Option<u64>,
}

impl UdpEndpoint {
    fn new(sh: Arc<Shared>, addr: EndpointAddr, sock: UdpSocket) -> UdpEndpoint {
        let cfg = &sh.config;
        let lim = wire::Limits {
            cluster_id: cfg.cluster_id,
            epoch: cfg.epoch,
            nodes: cfg.nodes,
            threads: cfg.threads_per_node,
            me: addr,
            mtu: cfg.mtu,
            max_onesided: cfg.max_onesided,
        };
        // One byte more than any valid datagram, so oversized ones show as truncated.
        let slot_len = wire::max_datagram(cfg.mtu, cfg.max_onesided) + 1;
        let loss = sh.opts.loss.clone().map(|l| {
            let seed =
                l.seed ^ (cfg.endpoint_index(addr) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            (SmallRng::seed_from_u64(seed), l)
        });
        let rtt = sh.opts.estimator();
        let peers = (0..cfg.nodes)
            .map(|_| Peer {
                session: new_session(0),
                front_seq: 0,
                sent_upto: 0,
                ops: VecDeque::new(),
                rtt,
                next_backoff: 0,
            })
            .collect();
        let streams = (0..cfg.endpoints()).map(|_| None).collect();
        let waker = sys::eventfd().ok().map(|efd| {
            Arc::new(UdpWaker {
                bell: Doorbell::default(),
                sleeping: AtomicBool::new(false),
                efd,
            })
        });
        UdpEndpoint {
            waker,
            rx: Rx::new(slot_len),
            core: Core {
                lim,
                addr,
                sock,
                counters: Counters::default(),
                kdrops: Cell::new(0),
                tx_hdrs: Vec::new(),
                tx: MsgVecs::default(),
                tx_groups: Vec::new(),
                tx_ctrl: Vec::new(),
                tx_failed: Vec::new(),
                gso: sh.opts.gso,
                out: Out {
                    arena: Vec::new(),
                    items: Vec::new(),
                    io: MsgVecs::default(),
                    loss,
                },
                stash: VecDeque::new(),
                stash_ignored: false,
                spare: Vec::new(),
                peers,
                streams,
                cq: VecDeque::new(),
                outstanding: 0,
                next_deadline: None,
                sh,
            },
        }
    }

    /// Receives and handles datagrams: one-sided packets are served or applied, data
    /// datagrams go to `sink` while fewer than `max` were delivered and to the stash
    /// after that. With `max == 0` it makes one round, purely for progress.
    fn progress(&mut self, max: usize, sink: &mut dyn FnMut(EndpointAddr, &[u8])) -> usize {
        let mut delivered = self.core.deliver_stash(max, sink);
        let fd = self.core.sock.as_raw_fd();
        for _ in 0..MAX_ROUNDS {
            let want = if max == 0 {
                SLOTS
            } else if delivered < max {
                (max - delivered).min(SLOTS)
            } else {
                break;
            };
            let n = self.rx.recv(fd, want);
            for i in 0..n {
                let (bytes, trunc, ovfl) = self.rx.slot(i);
                self.core
                    .handle(bytes, trunc, ovfl, &mut delivered, max, sink);
            }
            if n < want || max == 0 {
                break;
            }
        }
        self.core.after_progress();
        delivered
    }
}

impl Core {
    fn cfg(&self) -> &ClusterConfig {
        &self.sh.config
    }

    /// Points two iovecs per datagram at its header in `tx_hdrs` and its payload: the
    /// kernel gathers them, the payload is not copied.
    fn rebuild_iovs(&mut self, batch: &[Datagram<'_>]) {
        self.tx.iovs.clear();
        for (h, d) in self.tx_hdrs.iter_mut().zip(batch) {
            self.tx.iovs.push(libc::iovec {
                iov_base: h.as_mut_ptr() as *mut libc::c_void,
                iov_len: HDR_LEN,
            });
            self.tx.iovs.push(libc::iovec {
                iov_base: d.payload.as_ptr() as *mut libc::c_void,
                iov_len: d.payload.len(),
            });
        }
    }

    /// Sends `batch` (iovecs already built) with one sendmmsg, as one message per
    /// datagram or, with `gso`, one message per run of equal-sized datagrams to one
    /// endpoint. Returns how many datagrams were not sent; their indices are left in
    /// `tx_failed`.
    fn send_groups(&mut self, batch: &[Datagram<'_>], gso: bool) -> usize {
        self.tx_groups.clear();
        let mut i = 0;
        while i < batch.len() {
            let (dst, len) = (batch[i].dst, batch[i].payload.len());
            let seg = HDR_LEN + len;
            let mut j = i + 1;
            if gso {
                while j < batch.len()
                    && j - i < sys::GSO_MAX_SEGMENTS
                    && (j - i + 1) * seg <= sys::GSO_MAX_BYTES
                    && batch[j].dst == dst
                    && batch[j].payload.len() == len
                {
                    j += 1;
                }
            }
            self.tx_groups.push((i, j));
            i = j;
        }
        self.tx_ctrl.clear();
        self.tx_ctrl.resize(self.tx_groups.len(), [0; 4]);
        self.tx.msgs.clear();
        let cfg = &self.sh.config;
        for (g, &(i, j)) in self.tx_groups.iter().enumerate() {
            let iov = &mut self.tx.iovs[2 * i] as *mut libc::iovec;
            let mut m = msghdr(
                &self.sh.dests[cfg.endpoint_index(batch[i].dst)],
                iov,
                2 * (j - i),
            );
            if j - i > 1 {
                let seg = (HDR_LEN + batch[i].payload.len()) as u16;
                let clen = sys::gso_cmsg(&mut self.tx_ctrl[g], seg);
                m.msg_hdr.msg_control = self.tx_ctrl[g].as_mut_ptr() as *mut libc::c_void;
                m.msg_hdr.msg_controllen = clen as _;
            }
            self.tx.msgs.push(m);
        }
        self.tx_failed.clear();
        let (groups, failed) = (&self.tx_groups, &mut self.tx_failed);
        sys::send_all(
            self.sock.as_raw_fd(),
            &mut self.tx.msgs,
            self.sh.opts.send_patience,
            &*self.sh.opts.clock,
            &mut |g| failed.extend(groups[g].0..groups[g].1),
        );
        self.tx_failed.len()
    }

    fn fold_kernel_drops(&self, total: u32) {
        let d = total.wrapping_sub(self.kdrops.get());
        // Values arrive out of order across datagrams; only count forward movement.
        if d != 0 && d < 1 << 31 {
            self.kdrops.set(total);
            self.counters.add(Counter::RxDroppedQueueFull, d as u64);
        }
    }

    fn take_buf(&mut self) -> Vec<u8> {
        let mut b = self.spare.pop().unwrap_or_default();
        b.clear();
        b
    }

    fn give_buf(&mut self, b: Vec<u8>) {
        if self.spare.len() < MAX_SPARE {
            self.spare.push(b);
        }
    }

    fn deliver_stash(&mut self, max: usize, sink: &mut dyn FnMut(EndpointAddr, &[u8])) -> usize {
        let mut n = 0;
        while n < max {
            let Some((src, p)) = self.stash.pop_front() else {
                break;
            };
            sink(src, &p);
            self.counters.add(Counter::RxDatagrams, 1);
            self.counters.add(Counter::RxBytes, p.len() as u64);
            self.give_buf(p);
            n += 1;
        }
        n
    }

    fn handle(
        &mut self,
        bytes: &[u8],
        trunc: bool,
        ovfl: Option<u32>,
        delivered: &mut usize,
        max: usize,
        sink: &mut dyn FnMut(EndpointAddr, &[u8]),
    ) {
        if let Some(v) = ovfl {
            self.fold_kernel_drops(v);
        }
        if trunc {
            self.counters.add(Counter::RxDroppedMalformed, 1);
            return;
        }
        let p = match wire::decode(bytes, &self.lim) {
            Ok(p) => p,
            Err(wire::DropReason::WrongEpoch) if self.refuse_old_request(bytes) => return,
            Err(why) => {
                self.counters.add(why.counter(), 1);
                return;
            }
        };
        match p.body {
            Body::Data(d) => {
                if *delivered < max {
                    sink(p.src, d);
                    *delivered += 1;
                    self.counters.add(Counter::RxDatagrams, 1);
                    self.counters.add(Counter::RxBytes, d.len() as u64);
                } else if self.stash.len() >= self.cfg().recv_depth {
                    // The application is not draining: the queue is full.
                    self.counters.add(Counter::RxDroppedQueueFull, 1);
                } else {
                    let mut b = self.take_buf();
                    b.extend_from_slice(d);
                    self.stash.push_back((p.src, b));
                    self.stash_ignored = false;
                }
            }
            Body::Request(r) => self.serve(p.src, &r),
            Body::Response(r) => self.on_response(p.src, &r),
        }
    }

    /// Target side, the epoch fence: a valid request stamped with an epoch older than
    /// this endpoint's is never executed; it is answered at once with `EpochChanged`,
    /// stamped with the request's own epoch so that the initiator (still in it) accepts
    /// the answer, and counted as `onesided_epoch_errors`. The stream's state does not
    /// move. Returns false if `bytes` is not such a request (then it is dropped as usual).
    fn refuse_old_request(&mut self, bytes: &[u8]) -> bool {
        let Some(epoch) = wire::epoch_of(bytes) else {
            return false;
        };
        if epoch >= self.lim.epoch {
            return false;
        }
        let lim = wire::Limits {
            epoch,
            ..self.lim.clone()
        };
        let Ok(p) = wire::decode(bytes, &lim) else {
            return false;
        };
        let Body::Request(r) = p.body else {
            return false;
        };
        let resp = Packet {
            src: self.addr,
            dst: p.src,
            body: Body::Response(Response {
                session: r.session,
                seq: r.seq,
                status: Err(AccessError::EpochChanged),
                value: 0,
                data: &[],
            }),
        };
        let mut buf = self.take_buf();
        wire::encode(&resp, self.lim.cluster_id, epoch, &mut buf);
        let idx = self.cfg().endpoint_index(p.src);
        self.out.push(&buf, idx, &self.counters);
        self.give_buf(buf);
        self.counters.add(Counter::OnesidedEpochErrors, 1);
        true
    }

    /// Target side: executes a request in sequence order, or answers a duplicate from
    /// the response cache.
    fn serve(&mut self, src: EndpointAddr, r: &Request<'_>) {
        let idx = self.cfg().endpoint_index(src);
        let slot = &mut self.streams[idx];
        match slot {
            None if r.seq == 0 => *slot = Some(Stream::new(r.session, 0)),
            None => return,
            Some(st) if st.session != r.session => {
                // A new session starts at 0; anything else is stale.
                if r.seq != 0 || r.session == st.prev_session {
                    return;
                }
                *st = Stream::new(r.session, st.session);
            }
            Some(_) => {}
        }
        let st = slot.as_mut().unwrap();
        if r.seq == st.expected {
            let sh = &self.sh;
            let (status, value, read) = execute(sh, self.addr.node, r);
            let (cseq, buf) = &mut st.cache[(r.seq % WINDOW as u64) as usize];
            *cseq = r.seq;
            buf.clear();
            let resp = Packet {
                src: self.addr,
                dst: src,
                body: Body::Response(Response {
                    session: r.session,
                    seq: r.seq,
                    status,
                    value,
                    data: &[],
                }),
            };
            wire::encode(&resp, self.lim.cluster_id, self.lim.epoch, buf);
            if let Some((region, len)) = read {
                let at = buf.len();
                buf.resize(at + len, 0);
                region.mem.read(r.offset, &mut buf[at..]);
            }
            st.expected += 1;
            self.out.push(buf, idx, &self.counters);
        } else if r.seq < st.expected && st.expected - r.seq <= WINDOW as u64 {
            let (cseq, buf) = &mut st.cache[(r.seq % WINDOW as u64) as usize];
            if *cseq == r.seq {
                wire::set_epoch(buf, self.lim.epoch);
                self.out.push(buf, idx, &self.counters);
            }
        }
    }

    /// Initiator side: records the result of an in-flight operation.
    fn on_response(&mut self, src: EndpointAddr, r: &Response<'_>) {
        let x = src.node as usize;
        let peer = &mut self.peers[x];
        if r.session != peer.session || r.seq < peer.front_seq || r.seq >= peer.sent_upto {
            return; // stale or duplicate
        }
        let op = &mut peer.ops[(r.seq - peer.front_seq) as usize];
        if op.done.is_some() {
            return;
        }
        let now = self.sh.opts.clock.now_ns();
        // Karn's rule: the response to a retransmitted request may answer either copy.
        if op.retries == 0 {
            peer.rtt.sample(now.saturating_sub(op.sent));
            peer.next_backoff = 0;
        }
        let status = match (r.status, op.read) {
            (Ok(()), Some((dest, len))) => {
                if r.data.len() != len as usize {
                    self.counters.add(Counter::RxDroppedMalformed, 1);
                    return;
                }
                match self.sh.regions.get(dest.region) {
                    Some(reg) if reg.mem.write(dest.offset, r.data) => Ok(()),
                    _ => Err(AccessError::BadLocalBuffer),
                }
            }
            (Ok(()), None) if !r.data.is_empty() => {
                self.counters.add(Counter::RxDroppedMalformed, 1);
                return;
            }
            (s, _) => s,
        };
        op.done = Some((status, r.value));
        self.deliver(x);
        self.pump(x, now);
    }

    /// Moves the finished operations at the head of node `x`'s stream to the completion
    /// queue, in post order.
    fn deliver(&mut self, x: usize) {
        while self.peers[x].ops.front().is_some_and(|o| o.done.is_some()) {
            let peer = &mut self.peers[x];
            let o = peer.ops.pop_front().unwrap();
            peer.front_seq += 1;
            self.outstanding -= 1;
            let (status, value) = o.done.unwrap();
            if status.is_err() {
                self.counters.add(Counter::OnesidedErrors, 1);
            }
            if o.signaled || status.is_err() {
                self.cq.push_back(Completion {
                    wr_id: o.wr_id,
                    op: o.op,
                    node: x as NodeId,
                    status,
                    value,
                });
            }
            self.give_buf(o.pkt);
        }
    }

    fn target_endpoint(&self, node: usize) -> usize {
        let t = self.cfg().threads_per_node;
        let thread = if self.addr.thread < t {
            self.addr.thread
        } else {
            0
        };
        self.cfg()
            .endpoint_index(EndpointAddr::new(node as NodeId, thread))
    }

    fn now(&self) -> u64 {
        self.sh.opts.clock.now_ns()
    }

    /// Transmits node `x`'s queued operations as far as the window allows.
    fn pump(&mut self, x: usize, now: u64) {
        let dst = self.target_endpoint(x);
        let peer = &mut self.peers[x];
        // At most `give_up` (the estimator's ceiling) after sending.
        let deadline = now.saturating_add(peer.rtt.rto());
        let end = peer.front_seq + peer.ops.len() as u64;
        let mut sent = false;
        while peer.sent_upto < end && peer.sent_upto < peer.front_seq + WINDOW as u64 {
            let op = &mut peer.ops[(peer.sent_upto - peer.front_seq) as usize];
            wire::set_epoch(&mut op.pkt, self.lim.epoch);
            op.deadline = deadline;
            op.sent = now;
            self.out.push(&op.pkt, dst, &self.counters);
            peer.sent_upto += 1;
            sent = true;
        }
        if sent && self.next_deadline.is_none_or(|d| deadline < d) {
            self.next_deadline = Some(deadline);
        }
    }

    /// Retransmits overdue requests; fails a node's stream whose request has waited
    /// `give_up` since it was first sent.
    fn run_timers(&mut self, now: u64) {
        let give_up = duration_ns(self.sh.opts.give_up);
        let mut next: Option<u64> = None;
        for x in 0..self.peers.len() {
            let dst = self.target_endpoint(x);
            let mut failed = false;
            let inflight = (self.peers[x].sent_upto - self.peers[x].front_seq) as usize;
            for i in 0..inflight {
                let (sent, deadline, done) = {
                    let o = &self.peers[x].ops[i];
                    (o.sent, o.deadline, o.done.is_some())
                };
                if done {
                    continue;
                }
                if deadline <= now {
                    // Deadlines never pass `sent + give_up`, so this is on time.
                    if now.saturating_sub(sent) >= give_up {
                        failed = true;
                        break;
                    }
                    let peer = &mut self.peers[x];
                    if now >= peer.next_backoff {
                        peer.rtt.back_off();
                        peer.next_backoff = now.saturating_add(peer.rtt.rto());
                    }
                    let d = now
                        .saturating_add(peer.rtt.rto())
                        .min(sent.saturating_add(give_up));
                    let o = &mut peer.ops[i];
                    o.retries += 1;
                    o.deadline = d;
                    wire::set_epoch(&mut o.pkt, self.lim.epoch);
                    self.out.push(&o.pkt, dst, &self.counters);
                    self.counters.add(Counter::OnesidedRetransmits, 1);
                }
                let d = self.peers[x].ops[i].deadline;
                next = Some(next.map_or(d, |n: u64| n.min(d)));
            }
            if failed {
                self.fail_peer(x, AccessError::Timeout);
            }
        }
        self.next_deadline = next;
    }

    /// Completes every pending operation to node `x` with `why` and starts a new
    /// session, as a QP that enters the error state flushes its work requests.
    fn fail_peer(&mut self, x: usize, why: AccessError) {
        for o in self.peers[x].ops.iter_mut() {
            if o.done.is_none() {
                o.done = Some((Err(why), 0));
            }
        }
        self.deliver(x);
        let peer = &mut self.peers[x];
        peer.session = new_session(peer.session);
        peer.front_seq = 0;
        peer.sent_upto = 0;
    }

    fn after_progress(&mut self) {
        if self.outstanding > 0 {
            if let Some(d) = self.next_deadline {
                let now = self.now();
                if d <= now {
                    self.run_timers(now);
                }
            }
        }
        self.out
            .flush(self.sock.as_raw_fd(), &self.sh.dests, &self.sh.opts);
    }

    /// Runs an operation on this node's own memory at once (as the local backend does).
    fn execute_local(&mut self, op: &OneSidedOp<'_>) -> Result<u64, AccessError> {
        let sh = &self.sh;
        let Some(region) = sh.regions.get(op.remote.region) else {
            sh.counters.add(Counter::RemoteAccessViolations, 1);
            return Err(AccessError::UnknownRegion);
        };
        let local = |id: RegionId| sh.regions.get(id).map(|r| &r.mem);
        let r = onesided::execute(region, &op.remote, &op.kind, sh.config.max_onesided, &local);
        if let Err(e) = r {
            if e != AccessError::BadLocalBuffer {
                sh.counters.add(Counter::RemoteAccessViolations, 1);
            }
        }
        r
    }
}

/// Target side: checks and performs a request on this node's memory. Returns the status,
/// the old word (CAS/FAA), and for a successful READ the region to copy from.
fn execute<'s>(
    sh: &'s Shared,
    node: NodeId,
    r: &Request<'_>,
) -> (Result<(), AccessError>, u64, Option<(&'s Region, usize)>) {
    let remote = RemoteAddr {
        node,
        region: r.region,
        offset: r.offset,
        key: r.key,
    };
    let max = sh.config.max_onesided;
    let res = match sh.regions.get(r.region) {
        None => Err(AccessError::UnknownRegion),
        Some(region) => match r.op {
            // The data travels in the response, so check here and copy when encoding.
            ReqOp::Read { len } => {
                let kind = OneSidedKind::Read {
                    len,
                    dest: LocalBuf {
                        region: 0,
                        offset: 0,
                    },
                };
                onesided::check(region, &remote, &kind, max)
                    .map(|()| (0, Some((region, len as usize))))
            }
            op => {
                let kind = match op {
                    ReqOp::Write { data } => OneSidedKind::Write { data },
                    ReqOp::Cas { expected, new } => OneSidedKind::Cas { expected, new },
                    ReqOp::Faa { add } => OneSidedKind::Faa { add },
                    ReqOp::Read { .. } => unreachable!(),
                };
                onesided::execute(region, &remote, &kind, max, &|_| None).map(|v| (v, None))
            }
        },
    };
    match res {
        Ok((v, read)) => (Ok(()), v, read),
        Err(e) => {
            sh.counters.add(Counter::RemoteAccessViolations, 1);
            (Err(e), 0, None)
        }
    }
}

impl Endpoint for UdpEndpoint {
    fn addr(&self) -> EndpointAddr {
        self.core.addr
    }

    fn config(&self) -> &ClusterConfig {
        &self.core.sh.config
    }

    fn send(&mut self, batch: &[Datagram<'_>]) -> Result<(), TransportError> {
        let c = &mut self.core;
        let cfg = &c.sh.config;
        cfg.check_batch(batch)?;
        if batch.is_empty() {
            return Ok(());
        }
        c.tx_hdrs.clear();
        for d in batch {
            let mut h = [0u8; HDR_LEN];
            wire::write_header(
                &mut h,
                wire::KIND_DATA,
                c.lim.cluster_id,
                c.lim.epoch,
                c.addr,
                d.dst,
            );
            c.tx_hdrs.push(h);
        }
        c.rebuild_iovs(batch);
        let failed = c.send_groups(batch, c.gso);
        let gso_failed = failed > 0
            && c.tx_groups
                .iter()
                .any(|&(i, j)| j - i > 1 && c.tx_failed.contains(&i));
        let failed = if gso_failed {
            // Probably GSO refused (no checksum offload on the route): resend the failed
            // datagrams one message each, and stop using GSO.
            c.gso = false;
            let again: Vec<Datagram> = c.tx_failed.iter().map(|&i| batch[i]).collect();
            let hdrs: Vec<[u8; HDR_LEN]> = c.tx_failed.iter().map(|&i| c.tx_hdrs[i]).collect();
            c.tx_hdrs.clear();
            c.tx_hdrs.extend(hdrs);
            c.rebuild_iovs(&again);
            c.send_groups(&again, false)
        } else {
            failed
        };
        let bytes: usize = batch.iter().map(|d| d.payload.len()).sum();
        c.counters.add(Counter::TxDoorbells, 1);
        c.counters
            .add(Counter::TxDatagrams, (batch.len() - failed) as u64);
        c.counters.add(Counter::TxBytes, bytes as u64);
        // The kernel's transmit queue stayed full (or refused the datagram): a queue-full
        // drop, counted here because the receiver never sees it.
        c.counters.add(Counter::RxDroppedQueueFull, failed as u64);
        Ok(())
    }

    fn poll_recv(&mut self, max: usize, sink: &mut dyn FnMut(EndpointAddr, &[u8])) -> usize {
        let n = self.progress(max, sink);
        // A caller that asked for nothing has seen the stash; wait need not wake for it.
        self.core.stash_ignored = max == 0;
        n
    }

    fn post(&mut self, ops: &[OneSidedOp<'_>]) -> Result<(), TransportError> {
        let max = self.core.cfg().max_onesided;
        for op in ops {
            if let OneSidedKind::Write { data } = op.kind {
                if data.len() > max {
                    return Err(TransportError::TooLarge {
                        len: data.len(),
                        mtu: max,
                    });
                }
            }
        }
        let c = &mut self.core;
        let nodes = c.cfg().nodes;
        let mut touched = false;
        for op in ops {
            let n = op.remote.node;
            if n >= nodes || n == c.addr.node {
                let r = if n >= nodes {
                    Err(AccessError::UnknownNode)
                } else {
                    c.execute_local(op)
                };
                if r.is_err() {
                    c.counters.add(Counter::OnesidedErrors, 1);
                }
                c.cq.extend(Completion::of(op, n, r));
                continue;
            }
            let (rop, read) = match op.kind {
                OneSidedKind::Read { len, dest } => (ReqOp::Read { len }, Some((dest, len))),
                OneSidedKind::Write { data } => (ReqOp::Write { data }, None),
                OneSidedKind::Cas { expected, new } => (ReqOp::Cas { expected, new }, None),
                OneSidedKind::Faa { add } => (ReqOp::Faa { add }, None),
            };
            let dst_ep = c.target_endpoint(n as usize);
            let t = c.cfg().threads_per_node as usize;
            let peer = &c.peers[n as usize];
            let req = Packet {
                src: c.addr,
                dst: EndpointAddr::new(n, (dst_ep % t) as ThreadId),
                body: Body::Request(Request {
                    session: peer.session,
                    seq: peer.front_seq + peer.ops.len() as u64,
                    region: op.remote.region,
                    offset: op.remote.offset,
                    key: op.remote.key,
                    op: rop,
                }),
            };
            let mut pkt = c.take_buf();
            wire::encode(&req, c.lim.cluster_id, c.lim.epoch, &mut pkt);
            c.peers[n as usize].ops.push_back(Pending {
                wr_id: op.wr_id,
                op: op.kind.opcode(),
                signaled: op.signaled,
                read,
                pkt,
                deadline: 0,
                sent: 0,
                retries: 0,
                done: None,
            });
            c.outstanding += 1;
            touched = true;
        }
        c.counters.add(Counter::OnesidedPosted, ops.len() as u64);
        if touched {
            let now = c.now();
            for x in 0..c.peers.len() {
                c.pump(x, now);
            }
            c.out.flush(c.sock.as_raw_fd(), &c.sh.dests, &c.sh.opts);
        }
        Ok(())
    }

    fn poll_cq(&mut self, max: usize, out: &mut Vec<Completion>) -> usize {
        self.progress(0, &mut |_, _| {});
        let n = max.min(self.core.cq.len());
        out.extend(self.core.cq.drain(..n));
        n
    }

    fn outstanding(&self) -> usize {
        self.core.outstanding
    }

    fn wait(&mut self, timeout: Duration) {
        let c = &mut self.core;
        if !c.cq.is_empty() || (!c.stash.is_empty() && !c.stash_ignored) {
            return;
        }
        let mut t = timeout;
        if c.outstanding > 0 {
            if let Some(d) = c.next_deadline {
                t = t.min(Duration::from_nanos(d.saturating_sub(c.now())));
            }
        }
        match &self.waker {
            None => {
                sys::wait_fd(c.sock.as_raw_fd(), libc::POLLIN, t);
            }
            Some(w) => {
                if w.bell.take() {
                    return;
                }
                w.sleeping.store(true, Ordering::SeqCst);
                std::sync::atomic::fence(Ordering::SeqCst);
                if !w.bell.is_up() && sys::wait_fd_or_bell(c.sock.as_raw_fd(), w.efd.as_raw_fd(), t)
                {
                    sys::eventfd_clear(w.efd.as_raw_fd());
                }
                w.sleeping.store(false, Ordering::Relaxed);
                // A ring during the wait has done its job: the caller steps next.
                w.bell.take();
            }
        }
        c.after_progress();
    }

    fn waker(&self) -> Option<Arc<dyn EndpointWaker>> {
        self.waker.clone().map(|w| w as Arc<dyn EndpointWaker>)
    }

    fn set_epoch(&mut self, epoch: u32) {
        if self.core.lim.epoch == epoch {
            return;
        }
        self.core.lim.epoch = epoch;
        // Operations of the old epoch must not execute in the new one, where recovery
        // decided their transactions: fail them all and start new sessions, as a reset
        // queue pair flushes its work requests.
        for x in 0..self.core.peers.len() {
            self.core.fail_peer(x, AccessError::EpochChanged);
        }
    }

    fn host_threads(&self) -> usize {
        self.core.sh.host_threads
    }

    fn counters(&self) -> CounterSnapshot {
        let c = &self.core;
        if let Some(total) = sys::kernel_drops(c.sock.as_raw_fd()) {
            c.fold_kernel_drops(total);
        }
        c.counters.snapshot()
    }
}
