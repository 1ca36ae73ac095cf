//! The `local` backend: every node is a set of threads of this process. Receive queues
//! are lock-free rings in ordinary memory and one-sided operations are direct atomic
//! memory operations on the target's region, so the target's CPU is really bypassed.
//! This is the embedded default.
//!
//! As the initiator touches the target's memory itself, every node has an epoch
//! [`fence`](crate::fence): an operation stamped with an epoch older than the target
//! node's (the newest any of its endpoints moved to) fails with
//! [`AccessError::EpochChanged`] and touches nothing, and an endpoint's `set_epoch`
//! returns only once no operation of an older epoch is still running on its node's
//! memory.

use crate::counters::{Counter, CounterSnapshot, Counters};
use crate::fence::{Fence, FenceSlot};
use crate::onesided;
use crate::region::{random_key, Mapping, Region, RegionMemory};
use crate::ring::{self, RxBlock};
use crate::ring_endpoint::RingEndpoint;
use crate::types::*;
use crate::wait::Scope;
use crate::{Endpoint, NodeTransport, SharedNode};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// Most regions one node may register.
pub const MAX_REGIONS: usize = 4096;

/// The regions of one node, indexed by id. Append-only, so lookups take no lock.
pub struct RegionTable {
    node: NodeId,
    slots: Box<[OnceLock<Region>]>,
    next: AtomicU32,
}

impl RegionTable {
    pub fn new(node: NodeId) -> RegionTable {
        RegionTable {
            node,
            slots: (0..MAX_REGIONS).map(|_| OnceLock::new()).collect(),
            next: AtomicU32::new(0),
        }
    }

    /// Registers fresh anonymous memory.
    pub fn register(&self, len: usize, perms: Perms) -> Result<Region, TransportError> {
        let mem = RegionMemory::anonymous(len)?;
        self.insert(mem, perms)
    }

    /// Registers existing memory under the next id.
    pub fn insert(&self, mem: RegionMemory, perms: Perms) -> Result<Region, TransportError> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let slot = self.slots.get(id as usize).ok_or_else(|| {
            TransportError::Region(format!("more than {MAX_REGIONS} regions on one node"))
        })?;
        let desc = RegionDesc {
            node: self.node,
            id,
            len: mem.len() as u64,
            key: random_key(),
            perms,
        };
        let region = Region { desc, mem };
        let _ = slot.set(region.clone());
        Ok(region)
    }

    #[inline]
    pub fn get(&self, id: RegionId) -> Option<&Region> {
        self.slots.get(id as usize)?.get()
    }
}

struct NodeState {
    rx: Vec<RxBlock>,
    taken: Vec<AtomicBool>,
    regions: RegionTable,
    counters: Counters,
    /// The epoch fence of this node's memory: its epoch and one slot per endpoint.
    fence_epoch: AtomicU64,
    fence_slots: Box<[FenceSlot]>,
}

impl NodeState {
    fn fence(&self) -> Fence<'_> {
        Fence {
            epoch: &self.fence_epoch,
            slots: &self.fence_slots,
        }
    }
}

/// A whole cluster inside this process.
pub struct LocalFabric {
    config: ClusterConfig,
    nodes: Vec<NodeState>,
}

impl LocalFabric {
    pub fn new(config: ClusterConfig) -> Result<Arc<LocalFabric>, TransportError> {
        config.validate()?;
        let senders = config.endpoints();
        let ring_bytes = ring::ring_bytes_for(config.mtu, config.recv_depth);
        let mut nodes = Vec::new();
        for n in 0..config.nodes {
            let mut rx = Vec::new();
            for _ in 0..config.threads_per_node {
                let map = Arc::new(Mapping::anonymous(RxBlock::layout_len(
                    senders, ring_bytes,
                ))?);
                rx.push(RxBlock::init(map, config.cluster_id, senders, ring_bytes));
            }
            nodes.push(NodeState {
                rx,
                taken: (0..config.threads_per_node)
                    .map(|_| AtomicBool::new(false))
                    .collect(),
                regions: RegionTable::new(n),
                counters: Counters::default(),
                fence_epoch: AtomicU64::new(config.epoch as u64),
                fence_slots: (0..senders).map(|_| FenceSlot::default()).collect(),
            });
        }
        Ok(Arc::new(LocalFabric { config, nodes }))
    }

    /// The transport of node `n`.
    pub fn node(self: &Arc<Self>, n: NodeId) -> SharedNode {
        assert!(n < self.config.nodes, "node {n} outside the cluster");
        Arc::new(LocalNode {
            fabric: self.clone(),
            node: n,
        })
    }

    /// Every node's transport, in order.
    pub fn nodes(self: &Arc<Self>) -> Vec<SharedNode> {
        (0..self.config.nodes).map(|n| self.node(n)).collect()
    }
}

struct LocalNode {
    fabric: Arc<LocalFabric>,
    node: NodeId,
}

impl NodeTransport for LocalNode {
    fn node(&self) -> NodeId {
        self.node
    }

    fn config(&self) -> &ClusterConfig {
        &self.fabric.config
    }

    fn register(&self, len: usize, perms: Perms) -> Result<Region, TransportError> {
        self.fabric.nodes[self.node as usize]
            .regions
            .register(len, perms)
    }

    fn region(&self, id: RegionId) -> Option<Region> {
        self.fabric.nodes[self.node as usize]
            .regions
            .get(id)
            .cloned()
    }

    fn endpoint(&self, thread: ThreadId) -> Result<Box<dyn Endpoint>, TransportError> {
        let cfg = &self.fabric.config;
        let addr = EndpointAddr::new(self.node, thread);
        if !cfg.contains(addr) {
            return Err(TransportError::UnknownDestination(addr));
        }
        let st = &self.fabric.nodes[self.node as usize];
        if st.taken[thread as usize].swap(true, Ordering::AcqRel) {
            return Err(TransportError::Config(format!(
                "endpoint {addr} already taken"
            )));
        }
        Ok(Box::new(LocalEndpoint {
            ring: RingEndpoint::new(cfg, addr, st.rx[thread as usize].clone(), Scope::Process),
            fabric: self.fabric.clone(),
        }))
    }

    fn counters(&self) -> CounterSnapshot {
        self.fabric.nodes[self.node as usize].counters.snapshot()
    }

    /// The endpoints are released: a new incarnation takes them on the same receive
    /// rings, whose consumers and producers resume from the positions kept in the
    /// rings (what the old incarnation left unread is of an older epoch, and dropped).
    fn restart(&self) -> Result<(), TransportError> {
        for t in &self.fabric.nodes[self.node as usize].taken {
            t.store(false, Ordering::Release);
        }
        Ok(())
    }
}

struct LocalEndpoint {
    ring: RingEndpoint,
    fabric: Arc<LocalFabric>,
}

impl Endpoint for LocalEndpoint {
    crate::delegate_to_ring_endpoint!();

    fn config(&self) -> &ClusterConfig {
        &self.fabric.config
    }

    fn send(&mut self, batch: &[Datagram<'_>]) -> Result<(), TransportError> {
        let fabric = &self.fabric;
        let t = fabric.config.threads_per_node as usize;
        self.ring.send(&fabric.config, batch, |dst| {
            Some(fabric.nodes[dst / t].rx[dst % t].clone())
        })
    }

    fn set_epoch(&mut self, epoch: u32) {
        self.ring.epoch = epoch;
        let st = &self.fabric.nodes[self.ring.addr.node as usize];
        // Threads of this process cannot die alone: every slot's writer is alive.
        let r = st.fence().raise(epoch, |_, _| false);
        self.ring.counters.add_owned(Counter::FenceWaits, r.waited);
    }

    fn post(&mut self, ops: &[OneSidedOp<'_>]) -> Result<(), TransportError> {
        let fabric = &self.fabric;
        let me = &fabric.nodes[self.ring.addr.node as usize];
        let local = |id: RegionId| me.regions.get(id).map(|r| &r.mem);
        let slot = fabric.config.endpoint_index(self.ring.addr);
        let epoch = self.ring.epoch;
        // The region of the previous operation: a batch usually targets one region, and
        // region tables are append-only, so a region found once stays valid.
        let mut last: Option<(NodeId, RegionId, &Region)> = None;
        // The node whose fence this endpoint is inside (or was refused by): a run of
        // operations to one node enters it once.
        let mut fenced: Option<(NodeId, bool)> = None;
        for op in ops {
            let (node, id) = (op.remote.node, op.remote.region);
            let target = match fabric.nodes.get(node as usize) {
                None => Err(AccessError::UnknownNode),
                Some(t) => {
                    let inside = match fenced {
                        Some((n, inside)) if n == node => inside,
                        _ => {
                            if let Some((n, true)) = fenced {
                                fabric.nodes[n as usize].fence().leave(slot);
                            }
                            let inside = t.fence().enter(slot, 1, epoch);
                            fenced = Some((node, inside));
                            inside
                        }
                    };
                    if !inside {
                        Err(AccessError::EpochChanged)
                    } else {
                        match last {
                            Some((n, r, region)) if n == node && r == id => Ok(region),
                            _ => t.regions.get(id).ok_or(AccessError::UnknownRegion),
                        }
                    }
                }
            };
            let result = target.and_then(|region| {
                last = Some((node, id, region));
                onesided::execute(
                    region,
                    &op.remote,
                    &op.kind,
                    fabric.config.max_onesided,
                    &local,
                )
            });
            if let Some(e) = self.ring.complete(op, op.remote.node, result) {
                let c = match e {
                    AccessError::UnknownNode | AccessError::BadLocalBuffer => None,
                    AccessError::EpochChanged => Some(Counter::OnesidedEpochErrors),
                    _ => Some(Counter::RemoteAccessViolations),
                };
                if let Some(c) = c {
                    fabric.nodes[op.remote.node as usize].counters.add(c, 1);
                }
            }
        }
        if let Some((n, true)) = fenced {
            fabric.nodes[n as usize].fence().leave(slot);
        }
        self.ring
            .counters
            .add_owned(Counter::OnesidedPosted, ops.len() as u64);
        Ok(())
    }
}
