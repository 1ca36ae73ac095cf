//! Plain data types shared by every backend: addresses, configuration, operations and
//! completions.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Index of a node (a machine) in the cluster configuration.
pub type NodeId = u16;
/// Index of a thread (and so of its endpoint) within a node.
pub type ThreadId = u16;
/// Identifier of a registered memory region, unique within its node.
pub type RegionId = u32;

/// The address of one endpoint: datagrams are sent to (node, thread), like a UD QP
/// address handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EndpointAddr {
    pub node: NodeId,
    pub thread: ThreadId,
}

impl EndpointAddr {
    pub const fn new(node: NodeId, thread: ThreadId) -> Self {
        EndpointAddr { node, thread }
    }
}

impl fmt::Display for EndpointAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.node, self.thread)
    }
}

/// Default datagram MTU in bytes (the payload a single datagram may carry).
pub const DEFAULT_MTU: usize = 4096;
/// Default receive-queue depth of an endpoint, in datagrams.
pub const DEFAULT_RECV_DEPTH: usize = 1024;
/// Default largest READ/WRITE a single one-sided operation may move.
pub const DEFAULT_MAX_ONESIDED: usize = 16 * 1024;

/// The shape and limits of a cluster, identical on every node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterConfig {
    /// Distinguishes clusters sharing a network or a host; datagrams of another cluster
    /// are dropped and counted.
    pub cluster_id: u64,
    /// Configuration epoch; datagrams stamped with another epoch are dropped and counted.
    pub epoch: u32,
    pub nodes: u16,
    pub threads_per_node: u16,
    /// Largest datagram payload in bytes.
    pub mtu: usize,
    /// Receive-queue depth of every endpoint, in datagrams.
    pub recv_depth: usize,
    /// Largest READ or WRITE of one one-sided operation, in bytes.
    pub max_onesided: usize,
}

impl ClusterConfig {
    pub fn new(nodes: u16, threads_per_node: u16) -> Self {
        ClusterConfig {
            cluster_id: 0x616d_6269_6465_7801, // "ambidex" + 1
            epoch: 1,
            nodes,
            threads_per_node,
            mtu: DEFAULT_MTU,
            recv_depth: DEFAULT_RECV_DEPTH,
            max_onesided: DEFAULT_MAX_ONESIDED,
        }
    }

    /// Checks the limits a backend relies on; a bad configuration is a clear error.
    pub fn validate(&self) -> Result<(), TransportError> {
        let bad = |why: &str| Err(TransportError::Config(why.to_string()));
        if self.nodes == 0 || self.threads_per_node == 0 {
            return bad("a cluster needs at least one node and one thread per node");
        }
        if self.mtu < 64 || self.mtu > 60 * 1024 {
            return bad("mtu must be between 64 and 61440 bytes");
        }
        if self.recv_depth < 2 || self.recv_depth > 1 << 20 {
            return bad("recv_depth must be between 2 and 1048576 datagrams");
        }
        if self.max_onesided < 8 || self.max_onesided > 60 * 1024 {
            return bad("max_onesided must be between 8 and 61440 bytes");
        }
        Ok(())
    }

    pub fn endpoints(&self) -> usize {
        self.nodes as usize * self.threads_per_node as usize
    }

    pub fn contains(&self, addr: EndpointAddr) -> bool {
        addr.node < self.nodes && addr.thread < self.threads_per_node
    }

    /// Checks a batch of datagrams before any of it is sent: every payload within the
    /// MTU, every destination in the cluster (the `Endpoint::send` contract).
    pub fn check_batch(&self, batch: &[Datagram<'_>]) -> Result<(), TransportError> {
        for d in batch {
            if d.payload.len() > self.mtu {
                return Err(TransportError::TooLarge {
                    len: d.payload.len(),
                    mtu: self.mtu,
                });
            }
            if !self.contains(d.dst) {
                return Err(TransportError::UnknownDestination(d.dst));
            }
        }
        Ok(())
    }

    /// Dense index of an endpoint, node-major.
    pub fn endpoint_index(&self, addr: EndpointAddr) -> usize {
        addr.node as usize * self.threads_per_node as usize + addr.thread as usize
    }
}

/// Access rights of a registered region, as RDMA's access flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Perms(pub u8);

impl Perms {
    pub const READ: Perms = Perms(1);
    pub const WRITE: Perms = Perms(2);
    pub const ATOMIC: Perms = Perms(4);
    pub const ALL: Perms = Perms(7);
    pub const NONE: Perms = Perms(0);

    pub fn contains(self, other: Perms) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Perms {
    type Output = Perms;
    fn bitor(self, rhs: Perms) -> Perms {
        Perms(self.0 | rhs.0)
    }
}

/// What a remote node needs to address a region: like an RDMA (addr, rkey) pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RegionDesc {
    pub node: NodeId,
    pub id: RegionId,
    pub len: u64,
    pub key: u64,
    pub perms: Perms,
}

/// The remote side of a one-sided operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteAddr {
    pub node: NodeId,
    pub region: RegionId,
    pub offset: u64,
    pub key: u64,
}

impl RegionDesc {
    /// The remote address of `offset` within this region.
    pub fn at(&self, offset: u64) -> RemoteAddr {
        RemoteAddr {
            node: self.node,
            region: self.id,
            offset,
            key: self.key,
        }
    }
}

/// Where a READ deposits its data: a region registered on the initiator's own node
/// (like an RDMA local SGE with an lkey).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalBuf {
    pub region: RegionId,
    pub offset: u64,
}

/// The verb of a one-sided operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OneSidedKind<'a> {
    /// Copy `len` bytes from the remote address into `dest`.
    Read { len: u32, dest: LocalBuf },
    /// Copy `data` to the remote address (the payload is captured at post time, like
    /// inline data).
    Write { data: &'a [u8] },
    /// 8-byte compare-and-swap on an 8-byte aligned word; the completion carries the old value.
    Cas { expected: u64, new: u64 },
    /// 8-byte fetch-and-add on an 8-byte aligned word; the completion carries the old value.
    Faa { add: u64 },
}

/// A one-sided operation posted to an endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OneSidedOp<'a> {
    /// Returned in the completion, chosen by the caller.
    pub wr_id: u64,
    pub remote: RemoteAddr,
    pub kind: OneSidedKind<'a>,
    /// Unsignaled operations produce a completion only if they fail; a later signaled
    /// operation to the same node confirms them (operations complete in order).
    pub signaled: bool,
}

/// The opcode of a completed operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpCode {
    Read,
    Write,
    Cas,
    Faa,
}

impl OneSidedKind<'_> {
    pub fn opcode(&self) -> OpCode {
        match self {
            OneSidedKind::Read { .. } => OpCode::Read,
            OneSidedKind::Write { .. } => OpCode::Write,
            OneSidedKind::Cas { .. } => OpCode::Cas,
            OneSidedKind::Faa { .. } => OpCode::Faa,
        }
    }
}

/// Why a one-sided operation failed. The target's memory is untouched in every case.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AccessError {
    UnknownNode,
    UnknownRegion,
    BadKey,
    OutOfBounds,
    NoPermission,
    Misaligned,
    TooLarge,
    /// The local destination buffer of a READ is not a valid local region range.
    BadLocalBuffer,
    /// No answer from the target after the backend's retries (udp, sim); the operations
    /// queued behind it to that node fail with it.
    Timeout,
    /// The operation's epoch is over: either the initiating endpoint moved to a new
    /// epoch while the operation was in flight (udp, sim), or the target node had already
    /// moved to a newer epoch than the initiator's (the epoch fence: `local`, `shm`,
    /// `sim`, and udp's target). The target's memory is untouched.
    EpochChanged,
}

impl AccessError {
    pub fn name(self) -> &'static str {
        match self {
            AccessError::UnknownNode => "unknown_node",
            AccessError::UnknownRegion => "unknown_region",
            AccessError::BadKey => "bad_key",
            AccessError::OutOfBounds => "out_of_bounds",
            AccessError::NoPermission => "no_permission",
            AccessError::Misaligned => "misaligned",
            AccessError::TooLarge => "too_large",
            AccessError::BadLocalBuffer => "bad_local_buffer",
            AccessError::Timeout => "timeout",
            AccessError::EpochChanged => "epoch_changed",
        }
    }

    pub fn code(self) -> u8 {
        self as u8 + 1
    }

    pub fn from_code(code: u8) -> Option<AccessError> {
        use AccessError::*;
        const ALL: [AccessError; 10] = [
            UnknownNode,
            UnknownRegion,
            BadKey,
            OutOfBounds,
            NoPermission,
            Misaligned,
            TooLarge,
            BadLocalBuffer,
            Timeout,
            EpochChanged,
        ];
        ALL.get((code as usize).checked_sub(1)?).copied()
    }
}

/// An entry of the completion queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    pub op: OpCode,
    pub node: NodeId,
    pub status: Result<(), AccessError>,
    /// Old value of the word for CAS and FAA; 0 otherwise.
    pub value: u64,
}

impl Completion {
    /// The completion of `op` on `node` with `result` (the word's old value for CAS and
    /// FAA), if one is due: a signaled operation always completes, an unsignaled one
    /// only if it failed.
    pub fn of(
        op: &OneSidedOp<'_>,
        node: NodeId,
        result: Result<u64, AccessError>,
    ) -> Option<Completion> {
        (op.signaled || result.is_err()).then(|| Completion {
            wr_id: op.wr_id,
            op: op.kind.opcode(),
            node,
            status: result.map(|_| ()),
            value: result.unwrap_or(0),
        })
    }
}

/// A datagram to send.
#[derive(Clone, Copy, Debug)]
pub struct Datagram<'a> {
    pub dst: EndpointAddr,
    pub payload: &'a [u8],
}

/// Errors returned to the caller for misuse (never for network events, which are
/// counted drops).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransportError {
    Config(String),
    TooLarge { len: usize, mtu: usize },
    UnknownDestination(EndpointAddr),
    Io(String),
    Region(String),
}

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransportError::Config(s) => write!(f, "bad transport configuration: {s}"),
            TransportError::TooLarge { len, mtu } => {
                write!(f, "datagram of {len} bytes exceeds the MTU of {mtu} bytes")
            }
            TransportError::UnknownDestination(a) => {
                write!(f, "destination endpoint {a} is not in the cluster")
            }
            TransportError::Io(s) => write!(f, "transport I/O error: {s}"),
            TransportError::Region(s) => write!(f, "memory registration failed: {s}"),
        }
    }
}

impl std::error::Error for TransportError {}

impl From<std::io::Error> for TransportError {
    fn from(e: std::io::Error) -> Self {
        TransportError::Io(e.to_string())
    }
}
