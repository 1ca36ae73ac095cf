//! The catalog exchange of nodes started without a launcher (`ambidex::Node::start`):
//! each node asks every other node for its table and log region descriptors over the
//! cluster's own RPCs, and builds the [`Catalog`] the one-sided phases need from the
//! answers (`ambidex bench`'s launcher hands its nodes the catalog instead).
//!
//! Every node's runtime answers DESCRIPTORS requests at all times (the handler is
//! installed with the others, [`crate::handlers::register`]), before its own catalog
//! is set, so a node that starts late gets answers from the nodes already running,
//! and they get its answer once it runs. The asking is done by thread 0 of a node whose
//! database was told to ([`NodeDb::fetch_catalog_at_start`]), right before its start-up
//! check and with its workers gated behind both ([`crate::runner::start_thread`]).
//!
//! ```text
//! DESCRIPTORS req   [version u8][first u16][max_bytes u32]
//!             resp  [status u8][version u8][nodes u16][total u16][first u16][n u16]
//!                   [log region desc][n × table desc]
//! region desc       [node u16][id u32][len u64][key u64][perms u8]                      23 bytes
//! table desc        [table_id u32][region desc][value_size u32][item_size u32]
//!                   [buckets u32][overflow u32][capacity u32][buckets_off u64]
//!                   [overflow_off u64][items_off u64][len u64][seed u64]                87 bytes
//! log region desc   [region desc][base u64][ring_bytes u64][rings u32]                  43 bytes
//! ```
//!
//! An answer is a page: the descriptors `first..first + n` of the node's `total` tables,
//! as many as fit in `max_bytes` (the asker's largest message) and in the answering
//! runtime's own. A TPC-C schema (about 10 tables, under 1 KiB) is one page; the
//! asker asks again from `first + n` until it has all `total`. The log region
//! descriptor is in every page (pages must agree). A node that cannot decode a request
//! (another version) answers the single byte `BadRequest`.

use crate::db::NodeDb;
use crate::error::{CatalogExchangeError, DescriptorsDecodeError};
use crate::messages::{rtype, DecodeError, Reader, RespBuf, Status};
use ambidex_rpc::{Ctx, RpcError};
use ambidex_store::catalog::MAX_TABLE_ID;
use ambidex_store::{Catalog, LogRegionDesc, TableDesc, TableLayout};
use ambidex_transport::{NodeId, Perms, RegionDesc};
use std::time::Duration;

/// The format version of requests and answers.
pub const VERSION: u8 = 1;
/// Bytes of a DESCRIPTORS request.
pub const REQ_BYTES: usize = 7;
const REGION_BYTES: usize = 23;
/// Bytes of one encoded [`TableDesc`].
pub const TABLE_DESC_BYTES: usize = 4 + REGION_BYTES + 5 * 4 + 5 * 8;
/// Bytes of the encoded [`LogRegionDesc`].
pub const LOG_DESC_BYTES: usize = REGION_BYTES + 8 + 8 + 4;
/// Bytes of an answer before its table descriptors.
pub const PAGE_HEAD_BYTES: usize = 10 + LOG_DESC_BYTES;
/// Tables a node can have (ids `0..=MAX_TABLE_ID`).
const MAX_TABLES: u32 = MAX_TABLE_ID + 1;

/// First and longest pause between rounds of asking the nodes that have not answered
/// (each round also waits up to the RPC layer's `give_up` for them).
const BACKOFF_MIN: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_millis(500);

/// "Send me your descriptors from the `first`-th table, in at most `max_bytes`."
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DescriptorsReq {
    pub first: u16,
    pub max_bytes: u32,
}

impl DescriptorsReq {
    pub fn encode(&self) -> [u8; REQ_BYTES] {
        let mut b = [0u8; REQ_BYTES];
        b[0] = VERSION;
        b[1..3].copy_from_slice(&self.first.to_le_bytes());
        b[3..7].copy_from_slice(&self.max_bytes.to_le_bytes());
        b
    }

    /// The request, if `b` is one of this version.
    pub fn decode(b: &[u8]) -> Result<DescriptorsReq, DecodeError> {
        let mut r = Reader::new(b);
        if r.u8()? != VERSION {
            return Err(DecodeError::Rejected);
        }
        let (first, max_bytes) = (r.u16()?, r.u32()?);
        r.end()?;
        Ok(DescriptorsReq { first, max_bytes })
    }
}

/// One answer: a node's log region and its table descriptors `first..first + n` of
/// `total`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescriptorsPage {
    /// Nodes of the answering node's cluster.
    pub nodes: u16,
    pub total: u16,
    pub first: u16,
    pub log: LogRegionDesc,
    pub tables: Vec<TableDesc>,
}

impl DescriptorsPage {
    /// Encodes the `Ok` answer.
    pub fn encode<R: RespBuf>(&self, out: &mut R) {
        out.put_u8(Status::Ok as u8);
        out.put_u8(VERSION);
        out.put(&self.nodes.to_le_bytes());
        out.put(&self.total.to_le_bytes());
        out.put(&self.first.to_le_bytes());
        out.put(&(self.tables.len() as u16).to_le_bytes());
        put_log(out, &self.log);
        for d in &self.tables {
            put_table(out, d);
        }
    }

    /// Decodes an answer (untrusted bytes): every count is checked against the bytes
    /// there before anything is allocated.
    pub fn decode(b: &[u8]) -> Result<DescriptorsPage, DescriptorsDecodeError> {
        let mut r = Reader::new(b);
        let status = r.u8().map_err(short)?;
        if status != Status::Ok as u8 {
            return Err(DescriptorsDecodeError::Refused(status));
        }
        let version = r.u8().map_err(short)?;
        if version != VERSION {
            return Err(DescriptorsDecodeError::Version {
                found: version,
                want: VERSION,
            });
        }
        let nodes = r.u16().map_err(short)?;
        let total = r.u16().map_err(short)?;
        let first = r.u16().map_err(short)?;
        let n = r.u16().map_err(short)?;
        if total as u32 > MAX_TABLES {
            return Err(DescriptorsDecodeError::TooManyTables {
                total,
                max: MAX_TABLES,
            });
        }
        if first as u32 + n as u32 > total as u32 {
            return Err(DescriptorsDecodeError::BadRange { first, n, total });
        }
        let log = get_log(&mut r)?;
        let left = b.len() - r.pos();
        let need = n as usize * TABLE_DESC_BYTES;
        if left < need {
            return Err(DescriptorsDecodeError::Truncated);
        }
        if left > need {
            return Err(DescriptorsDecodeError::TrailingBytes(left - need));
        }
        let tables = (0..n)
            .map(|_| get_table(&mut r))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(DescriptorsPage {
            nodes,
            total,
            first,
            log,
            tables,
        })
    }
}

fn short(_: DecodeError) -> DescriptorsDecodeError {
    DescriptorsDecodeError::Truncated
}

fn put_region<R: RespBuf>(out: &mut R, d: &RegionDesc) {
    out.put(&d.node.to_le_bytes());
    out.put(&d.id.to_le_bytes());
    out.put(&d.len.to_le_bytes());
    out.put(&d.key.to_le_bytes());
    out.put_u8(d.perms.0);
}

fn get_region(r: &mut Reader<'_>) -> Result<RegionDesc, DescriptorsDecodeError> {
    let node = r.u16().map_err(short)?;
    let id = r.u32().map_err(short)?;
    let len = r.u64().map_err(short)?;
    let key = r.u64().map_err(short)?;
    let perms = r.u8().map_err(short)?;
    if perms & !Perms::ALL.0 != 0 {
        return Err(DescriptorsDecodeError::BadPerms(perms));
    }
    Ok(RegionDesc {
        node,
        id,
        len,
        key,
        perms: Perms(perms),
    })
}

fn put_log<R: RespBuf>(out: &mut R, d: &LogRegionDesc) {
    put_region(out, &d.region);
    out.put(&d.base.to_le_bytes());
    out.put(&d.ring_bytes.to_le_bytes());
    out.put(&d.rings.to_le_bytes());
}

fn get_log(r: &mut Reader<'_>) -> Result<LogRegionDesc, DescriptorsDecodeError> {
    let region = get_region(r)?;
    Ok(LogRegionDesc {
        region,
        base: r.u64().map_err(short)?,
        ring_bytes: r.u64().map_err(short)?,
        rings: r.u32().map_err(short)?,
    })
}

fn put_table<R: RespBuf>(out: &mut R, d: &TableDesc) {
    out.put(&d.table_id.to_le_bytes());
    put_region(out, &d.region);
    let l = &d.layout;
    for w in [l.value_size, l.item_size, l.buckets, l.overflow, l.capacity] {
        out.put(&w.to_le_bytes());
    }
    for w in [l.buckets_off, l.overflow_off, l.items_off, l.len, l.seed] {
        out.put(&w.to_le_bytes());
    }
}

fn get_table(r: &mut Reader<'_>) -> Result<TableDesc, DescriptorsDecodeError> {
    let table_id = r.u32().map_err(short)?;
    let region = get_region(r)?;
    let mut u32s = [0u32; 5];
    for w in &mut u32s {
        *w = r.u32().map_err(short)?;
    }
    let mut u64s = [0u64; 5];
    for w in &mut u64s {
        *w = r.u64().map_err(short)?;
    }
    let [value_size, item_size, buckets, overflow, capacity] = u32s;
    let [buckets_off, overflow_off, items_off, len, seed] = u64s;
    Ok(TableDesc {
        table_id,
        region,
        layout: TableLayout {
            value_size,
            item_size,
            buckets,
            overflow,
            capacity,
            buckets_off,
            overflow_off,
            items_off,
            len,
            seed,
        },
    })
}

/// The DESCRIPTORS handler: this node's descriptors from the requested one, as many as
/// fit both the asker's `max_bytes` and `own_max` (this runtime's largest message). A
/// request that does not decode is answered `BadRequest` and counted.
pub fn answer<R: RespBuf>(db: &NodeDb, own_max: usize, req: &[u8], resp: &mut R) {
    let Ok(q) = DescriptorsReq::decode(req) else {
        db.bad_requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        resp.put_u8(Status::BadRequest as u8);
        return;
    };
    let all = db.table_descs();
    let room = (q.max_bytes as usize).min(own_max);
    let fit = room.saturating_sub(PAGE_HEAD_BYTES) / TABLE_DESC_BYTES;
    let first = (q.first as usize).min(all.len());
    let n = fit.min(all.len() - first).min(u16::MAX as usize);
    DescriptorsPage {
        nodes: db.nodes(),
        // At most MAX_TABLES (NodeDb refuses larger ids).
        total: all.len() as u16,
        first: first as u16,
        log: db.log_region_desc(),
        tables: all[first..first + n].to_vec(),
    }
    .encode(resp);
}

/// What one node asked has sent so far.
#[derive(Clone, Debug)]
pub struct PeerAnswers {
    pub peer: NodeId,
    /// Bytes this node asks the peer to fit an answer in (halved after a
    /// `ResponseTooLarge`).
    pub max_bytes: u32,
    total: Option<u16>,
    log: Option<LogRegionDesc>,
    tables: Vec<TableDesc>,
}

impl PeerAnswers {
    /// Nothing from `peer` yet; pages of at most `max_bytes`.
    pub fn new(peer: NodeId, max_bytes: u32) -> PeerAnswers {
        PeerAnswers {
            peer,
            max_bytes,
            total: None,
            log: None,
            tables: Vec::new(),
        }
    }

    /// The request for the next page.
    pub fn request(&self) -> DescriptorsReq {
        DescriptorsReq {
            first: self.tables.len() as u16,
            max_bytes: self.max_bytes,
        }
    }

    /// Whether every page is in.
    pub fn complete(&self) -> bool {
        self.total == Some(self.tables.len() as u16)
    }

    /// Takes the answer `page` to [`PeerAnswers::request`] of node `me` (of a cluster
    /// of `nodes`): it must be of this cluster, about the peer, follow the pages
    /// before it and make progress.
    pub fn take(
        &mut self,
        me: NodeId,
        nodes: u16,
        page: DescriptorsPage,
    ) -> Result<(), CatalogExchangeError> {
        let bad = |why| CatalogExchangeError::Inconsistent {
            node: me,
            peer: self.peer,
            why,
        };
        if page.nodes != nodes {
            return Err(bad("it is a node of a cluster of another size"));
        }
        if page.log.region.node != self.peer
            || page.tables.iter().any(|d| d.region.node != self.peer)
        {
            return Err(bad("a descriptor names another node"));
        }
        if page.first as usize != self.tables.len() {
            return Err(bad("a page does not start where it was asked to"));
        }
        if self.total.is_some_and(|t| t != page.total) || self.log.is_some_and(|l| l != page.log) {
            return Err(bad("its pages disagree"));
        }
        if page.tables.is_empty() && page.first < page.total {
            return Err(bad("a page holds no descriptor (the pages are too small)"));
        }
        self.total = Some(page.total);
        self.log = Some(page.log);
        self.tables.extend(page.tables);
        Ok(())
    }

    /// Files every descriptor of the peer in `cat` (checked there).
    fn file(&self, me: NodeId, cat: &mut Catalog) -> Result<(), CatalogExchangeError> {
        let e = |source| CatalogExchangeError::Catalog {
            node: me,
            peer: self.peer,
            source,
        };
        cat.extend(self.tables.iter().copied()).map_err(e)?;
        if let Some(l) = self.log {
            cat.insert_log(l).map_err(e)?;
        }
        Ok(())
    }
}

/// Asks every other node for its descriptors, in rounds: each round asks the nodes not
/// complete yet for their next page at once (one flush), and, if some did not answer,
/// waits a backoff (10 ms doubling to 500 ms) before the next. A node that has not
/// answered within `within` (plus up to one RPC `give_up` for the last round) is an
/// error naming every such node; a bad answer is an error at once (asking again would
/// not help). Returns the catalog of every node's descriptors, this node's own
/// included. `max_bytes`: the largest message this runtime takes.
pub async fn fetch_catalog(
    ctx: &Ctx,
    db: &NodeDb,
    max_bytes: usize,
    within: Duration,
) -> Result<Catalog, CatalogExchangeError> {
    let (me, nodes) = (db.node, db.nodes());
    let max_bytes = max_bytes.min(u32::MAX as usize) as u32;
    let mut peers: Vec<PeerAnswers> = (0..nodes)
        .filter(|&n| n != me)
        .map(|n| PeerAnswers::new(n, max_bytes))
        .collect();
    let start = ctx.now_ns();
    let deadline = start.saturating_add(within.as_nanos().min(u64::MAX as u128) as u64);
    let mut backoff = BACKOFF_MIN;
    loop {
        let mut asked = Vec::new();
        for (i, p) in peers.iter().enumerate().filter(|(_, p)| !p.complete()) {
            let h = ctx
                .queue(p.peer, rtype::DESCRIPTORS, &p.request().encode())
                .map_err(|source| CatalogExchangeError::Rpc {
                    node: me,
                    peer: p.peer,
                    source,
                })?;
            asked.push((i, h));
        }
        if asked.is_empty() {
            break;
        }
        // Failures are per request, read below.
        let _ = ctx.flush().await;
        let mut silent = false;
        for (i, h) in asked {
            let p = &mut peers[i];
            match ctx.response(h, DescriptorsPage::decode) {
                Ok(Ok(page)) => p.take(me, nodes, page)?,
                Ok(Err(source)) => {
                    return Err(CatalogExchangeError::BadAnswer {
                        node: me,
                        peer: p.peer,
                        source,
                    })
                }
                Err(RpcError::ResponseTooLarge) if p.max_bytes as usize > PAGE_HEAD_BYTES => {
                    // The answering runtime's room was smaller than it thought.
                    p.max_bytes /= 2;
                }
                Err(RpcError::Timeout { .. }) => silent = true,
                Err(source) => {
                    return Err(CatalogExchangeError::Rpc {
                        node: me,
                        peer: p.peer,
                        source,
                    })
                }
            }
        }
        if !silent {
            backoff = BACKOFF_MIN;
            continue;
        }
        let now = ctx.now_ns();
        if now >= deadline {
            return Err(CatalogExchangeError::NoAnswer {
                node: me,
                missing: peers
                    .iter()
                    .filter(|p| !p.complete())
                    .map(|p| p.peer)
                    .collect(),
                after: Duration::from_nanos(now - start),
            });
        }
        let until = now.saturating_add(backoff.as_nanos() as u64).min(deadline);
        while ctx.now_ns() < until {
            ctx.pause().await;
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
    let mut cat = Catalog::new(nodes);
    cat.extend(db.table_descs())
        .and_then(|()| cat.insert_log(db.log_region_desc()))
        .map_err(|source| CatalogExchangeError::Catalog {
            node: me,
            peer: me,
            source,
        })?;
    for p in &peers {
        p.file(me, &mut cat)?;
    }
    Ok(cat)
}

#[cfg(test)]
mod tests;
