//! The `local` backend: every node is a set of threads of this process. Receive queues
//! are lock-free rings in ordinary memory and one-sided operations are direct atomic
//! memory operations on the target's region, so the target's CPU is really bypassed.
//! This is the embedded default.

use crate::counters::{Counter, CounterSnapshot, Counters};
use crate::onesided;
use crate::region::{random_key, Mapping, Region, RegionMemory};
use crate::ring::{self, RingProducer, RxBlock, RxConsumer};
use crate::types::*;
use crate::wait::Scope;
use crate::{Endpoint, NodeTransport, SharedNode};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

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
            addr,
            epoch: cfg.epoch,
            consumer: RxConsumer::new(st.rx[thread as usize].clone(), cfg.mtu),
            producers: (0..cfg.endpoints()).map(|_| None).collect(),
            senders: (0..cfg.endpoints())
                .map(|i| {
                    let t = cfg.threads_per_node as usize;
                    EndpointAddr::new((i / t) as NodeId, (i % t) as ThreadId)
                })
                .collect(),
            touched: Vec::new(),
            cq: VecDeque::new(),
            counters: Counters::default(),
            fabric: self.fabric.clone(),
        }))
    }

    fn counters(&self) -> CounterSnapshot {
        self.fabric.nodes[self.node as usize].counters.snapshot()
    }
}

struct LocalEndpoint {
    addr: EndpointAddr,
    epoch: u32,
    consumer: RxConsumer,
    producers: Vec<Option<RingProducer>>,
    /// Address of every sender index (avoids a division per received datagram).
    senders: Vec<EndpointAddr>,
    touched: Vec<usize>,
    cq: VecDeque<Completion>,
    counters: Counters,
    fabric: Arc<LocalFabric>,
}

impl LocalEndpoint {
    fn producer(&mut self, dst: usize) -> &mut RingProducer {
        let cfg = &self.fabric.config;
        let me = cfg.endpoint_index(self.addr);
        let fabric = &self.fabric;
        self.producers[dst].get_or_insert_with(|| {
            let t = cfg.threads_per_node as usize;
            RingProducer::new(fabric.nodes[dst / t].rx[dst % t].clone(), me)
        })
    }
}

impl Endpoint for LocalEndpoint {
    fn addr(&self) -> EndpointAddr {
        self.addr
    }

    fn config(&self) -> &ClusterConfig {
        &self.fabric.config
    }

    fn send(&mut self, batch: &[Datagram<'_>]) -> Result<(), TransportError> {
        let cfg = &self.fabric.config;
        cfg.check_batch(batch)?;
        let depth = cfg.recv_depth;
        let epoch = self.epoch;
        let mut bytes = 0u64;
        let mut i = 0;
        while i < batch.len() {
            // Runs of datagrams to one destination reserve queue room with one atomic.
            let dst = batch[i].dst;
            let mut j = i + 1;
            while j < batch.len() && batch[j].dst == dst {
                j += 1;
            }
            let idx = self.fabric.config.endpoint_index(dst);
            let prod = self.producer(idx);
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
                    p.header().event.notify(Scope::Process);
                }
            }
        }
        self.touched.clear();
        self.counters
            .add_owned(Counter::TxDatagrams, batch.len() as u64);
        self.counters.add_owned(Counter::TxBytes, bytes);
        self.counters.add_owned(Counter::TxDoorbells, 1);
        Ok(())
    }

    fn poll_recv(&mut self, max: usize, sink: &mut dyn FnMut(EndpointAddr, &[u8])) -> usize {
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

    fn post(&mut self, ops: &[OneSidedOp<'_>]) -> Result<(), TransportError> {
        let fabric = &self.fabric;
        let me = &fabric.nodes[self.addr.node as usize];
        let local = |id: RegionId| me.regions.get(id).map(|r| &r.mem);
        for op in ops {
            let result = match fabric.nodes.get(op.remote.node as usize) {
                None => Err(AccessError::UnknownNode),
                Some(target) => match target.regions.get(op.remote.region) {
                    None => Err(AccessError::UnknownRegion),
                    Some(region) => onesided::execute(
                        region,
                        &op.remote,
                        &op.kind,
                        fabric.config.max_onesided,
                        &local,
                    ),
                },
            };
            if let Err(e) = result {
                self.counters.add_owned(Counter::OnesidedErrors, 1);
                if e != AccessError::UnknownNode && e != AccessError::BadLocalBuffer {
                    fabric.nodes[op.remote.node as usize]
                        .counters
                        .add(Counter::RemoteAccessViolations, 1);
                }
            }
            if op.signaled || result.is_err() {
                self.cq.push_back(Completion {
                    wr_id: op.wr_id,
                    op: op.kind.opcode(),
                    node: op.remote.node,
                    status: result.map(|_| ()),
                    value: result.unwrap_or(0),
                });
            }
        }
        self.counters
            .add_owned(Counter::OnesidedPosted, ops.len() as u64);
        Ok(())
    }

    fn poll_cq(&mut self, max: usize, out: &mut Vec<Completion>) -> usize {
        let n = max.min(self.cq.len());
        out.extend(self.cq.drain(..n));
        n
    }

    fn outstanding(&self) -> usize {
        0
    }

    fn wait(&mut self, timeout: Duration) {
        if !self.cq.is_empty() {
            return;
        }
        let ev = self.consumer.header().event.observe();
        if self.consumer.has_pending() {
            return;
        }
        let consumer = &self.consumer;
        consumer
            .header()
            .event
            .wait(ev, timeout, Scope::Process, || consumer.has_pending());
    }

    fn host_threads(&self) -> usize {
        // Every node of this backend runs on this host.
        self.config().endpoints()
    }

    fn set_epoch(&mut self, epoch: u32) {
        self.epoch = epoch;
    }

    fn counters(&self) -> CounterSnapshot {
        let mut s = self.counters.snapshot();
        s.merge(&self.consumer.header().counters.snapshot());
        s
    }
}
