//! Adversarial fuzzing of the runtime's receive path with a live cluster: 3 runtimes on
//! the local transport (nodes 0 and 1 run workers issuing echo RPCs, node 2 only
//! serves), with random and mutated-valid datagrams injected into them between master
//! steps. Checks: no panic; honest RPCs complete with their own payloads unless the
//! attacker forged the victim's session; the datagrams a runtime sends per step stay
//! within a small factor of what was injected into it; allocation stays bounded.
//!
//! FUZZ_RUNTIME_CASES sets the case count (300 here, enough for CI; thousands for a
//! deeper run). It found the duplicate amplification and the reassembly starvation that
//! `tests/rpc.rs::duplicate_requests_do_not_amplify` and
//! `reassembly_flood_does_not_starve_other_sources` now pin down.

use ambidex_rpc::wire::{self, Seg};
use ambidex_rpc::{ManualClock, RpcError, Runtime, RuntimeConfig};
use ambidex_transport::local::LocalFabric;
use ambidex_transport::{ClusterConfig, EndpointAddr};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

#[path = "common/mutation.rs"]
mod mutation;
use mutation::{mutate, mutation, Mutation};

// ---------------------------------------------------------------------------------------
// Per-thread allocation accounting (tests of this file run on several threads).

struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn note(d: isize) {
    let _ = LIVE.try_with(|l| {
        let v = l.get() + d;
        l.set(v);
        let _ = PEAK.try_with(|p| {
            if v > p.get() {
                p.set(v)
            }
        });
    });
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note(l.size() as isize);
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        note(-(l.size() as isize));
        System.dealloc(p, l)
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note(l.size() as isize);
        System.alloc_zeroed(l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        note(n as isize - l.size() as isize);
        System.realloc(p, l, n)
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Bytes allocated (and not freed) by this thread; resets the peak to it.
fn live_reset_peak() -> isize {
    let v = LIVE.with(|l| l.get());
    PEAK.with(|p| p.set(v));
    v
}
fn peak() -> isize {
    PEAK.with(|p| p.get())
}

// ---------------------------------------------------------------------------------------
// The cluster.

const ECHO: u8 = 1;
const NODES: u16 = 3;
const WORKERS: usize = 2;
const ROUNDS: u32 = 6;

#[derive(Clone, Copy, Debug)]
struct Params {
    mtu: usize,
    window: u32,
    slots: usize,
    max_message: usize,
}

const PARAMS: [Params; 3] = [
    Params {
        mtu: 512,
        window: 8,
        slots: 2,
        max_message: 2048,
    },
    Params {
        mtu: 256,
        window: 4,
        slots: 1,
        max_message: 1024,
    },
    Params {
        mtu: 1024,
        window: 64,
        slots: 4,
        max_message: 4096,
    },
];

impl Params {
    fn sp(&self) -> usize {
        self.mtu - wire::DGRAM_HDR - wire::REC_HDR - wire::SEG_EXT
    }
    fn single_cap(&self) -> usize {
        self.mtu - wire::DGRAM_HDR - wire::REC_HDR
    }
    fn max_segs(&self) -> usize {
        self.max_message.div_ceil(self.sp())
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Correct,
    Wrong,
    Err(RpcError),
}

struct Cluster {
    clock: Arc<ManualClock>,
    rts: Vec<Runtime>,
    sessions: Vec<u32>,
    log: Rc<RefCell<Vec<(usize, Outcome)>>>,
    runs: Rc<Cell<u64>>,
}

fn session_of(i: usize) -> u32 {
    0x5e55_0000 + i as u32
}

impl Cluster {
    fn new(p: Params) -> Cluster {
        let mut cc = ClusterConfig::new(NODES, 1);
        cc.mtu = p.mtu;
        cc.recv_depth = 256;
        let fabric = LocalFabric::new(cc.clone()).unwrap();
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let log = Rc::new(RefCell::new(Vec::new()));
        let runs = Rc::new(Cell::new(0u64));
        let mut rts = Vec::new();
        for n in 0..NODES {
            let cfg = RuntimeConfig {
                window: p.window,
                reassembly_slots: p.slots,
                max_message: p.max_message,
                session: Some(session_of(n as usize)),
                ..Default::default()
            };
            let mut rt =
                Runtime::with_clock(fabric.node(n).endpoint(0).unwrap(), cfg, clock.clone())
                    .unwrap();
            let r = runs.clone();
            rt.register(ECHO, move |_, req, resp| {
                r.set(r.get() + 1);
                resp.extend_from_slice(req)
            });
            rts.push(rt);
        }
        let sessions = (0..NODES as usize).map(session_of).collect();
        let max = rts[0].max_message();
        for (w, rt) in rts.iter_mut().take(WORKERS).enumerate() {
            let log = log.clone();
            let (sc, sp) = (p.single_cap(), p.sp());
            rt.spawn(move |ctx| async move {
                for round in 0..ROUNDS {
                    let mut hs = Vec::new();
                    for k in 0..3u32 {
                        let node = ((w as u32 + 1 + k % 2) % NODES as u32) as u16;
                        // Mostly small; one segmented request every other round.
                        let len = match (round + k) % 4 {
                            0 if k == 2 => (sc + 1 + (round as usize * 37) % sp).min(max),
                            _ => 8 + (round * 3 + k) as usize,
                        };
                        let v: Vec<u8> = (0..len)
                            .map(|i| (i as u32 ^ (w as u32) << 6 ^ round << 3 ^ k) as u8)
                            .collect();
                        hs.push((ctx.queue(node, ECHO, &v).unwrap(), v));
                    }
                    let r = ctx.flush().await;
                    for (h, v) in hs {
                        let o = match ctx.response(h, |b| b == &v[..]) {
                            Ok(true) => Outcome::Correct,
                            Ok(false) => Outcome::Wrong,
                            Err(e) => Outcome::Err(e),
                        };
                        log.borrow_mut().push((w, o));
                    }
                    if r.is_err() {
                        // A suspected destination: keep going, the log has the errors.
                    }
                }
            });
        }
        Cluster {
            clock,
            rts,
            sessions,
            log,
            runs,
        }
    }

    fn tx(&self, i: usize) -> u64 {
        self.rts[i].endpoint_counters().get("tx_datagrams")
    }
}

// ---------------------------------------------------------------------------------------
// Attack datagrams, abstract until materialised against a cluster's parameters.

#[derive(Debug, Clone)]
enum SeqSel {
    Small(u64),
    NearMax(u64),
    Any(u64),
    /// A seq this case used before (most recent first): duplicates.
    Recent(u8),
}

#[derive(Debug, Clone)]
enum SessSel {
    /// The target's own session (a forged response) / the claimed client's (a forged request).
    Forged,
    OtherNode(usize),
    Any(u32),
}

#[derive(Debug, Clone)]
enum AckSel {
    Zero,
    Small(u64),
    NearMax(u64),
    Any(u64),
}

#[derive(Debug, Clone)]
enum SegSel {
    None,
    /// Segment k of a message of `total_frac`/255 of max_message (plus a little), cut at
    /// the runtime's boundaries.
    Aligned {
        k: u8,
        total: u16,
    },
    Raw {
        total: u32,
        offset: u32,
    },
}

#[derive(Debug, Clone)]
enum LenSel {
    Small(u8),
    Sp,
    SingleCap,
    Any(u16),
}

#[derive(Debug, Clone)]
struct RecSpec {
    seq: SeqSel,
    tag: u8,
    seg: SegSel,
    len: LenSel,
    fill: u8,
    repeat: u8,
}

#[derive(Debug, Clone)]
struct DgSpec {
    kind: u8,
    sess: SessSel,
    ack: AckSel,
    recs: Vec<RecSpec>,
    muts: Vec<Mutation>,
}

#[derive(Debug, Clone)]
enum Payload {
    Random(Vec<u8>),
    Built(DgSpec),
    /// New records under the header (and target and source) of an earlier injection.
    SameHeader(u8, Vec<RecSpec>),
}

#[derive(Debug, Clone)]
enum Action {
    Inject {
        target: usize,
        src: (u16, u16),
        payload: Payload,
    },
    Poll(u8),
    Advance(u32),
}

fn seq_sel() -> impl Strategy<Value = SeqSel> {
    prop_oneof![
        6 => (1u64..40).prop_map(SeqSel::Small),
        1 => (0u64..4).prop_map(SeqSel::NearMax),
        1 => any::<u64>().prop_map(SeqSel::Any),
        4 => (0u8..4).prop_map(SeqSel::Recent),
    ]
}

fn rec_spec() -> impl Strategy<Value = RecSpec> {
    (
        seq_sel(),
        prop_oneof![4 => Just(ECHO), 3 => Just(0u8), 1 => any::<u8>()],
        prop_oneof![
            4 => Just(SegSel::None),
            4 => (0u8..12, any::<u16>()).prop_map(|(k, total)| SegSel::Aligned { k, total }),
            1 => (any::<u32>(), any::<u32>()).prop_map(|(total, offset)| SegSel::Raw { total, offset }),
        ],
        prop_oneof![
            4 => any::<u8>().prop_map(LenSel::Small),
            1 => Just(LenSel::Sp),
            1 => Just(LenSel::SingleCap),
            1 => any::<u16>().prop_map(LenSel::Any),
        ],
        any::<u8>(),
        prop_oneof![4 => Just(1u8), 2 => 2u8..8, 2 => 8u8..255],
    )
        .prop_map(|(seq, tag, seg, len, fill, repeat)| RecSpec {
            seq,
            tag,
            seg,
            len,
            fill,
            repeat,
        })
}

fn dg_spec() -> impl Strategy<Value = DgSpec> {
    (
        prop_oneof![Just(wire::KIND_REQUEST), Just(wire::KIND_RESPONSE)],
        prop_oneof![
            1 => Just(SessSel::Forged),
            3 => (0usize..NODES as usize).prop_map(SessSel::OtherNode),
            1 => any::<u32>().prop_map(SessSel::Any),
        ],
        prop_oneof![
            3 => Just(AckSel::Zero),
            3 => (0u64..40).prop_map(AckSel::Small),
            1 => (0u64..4).prop_map(AckSel::NearMax),
            1 => any::<u64>().prop_map(AckSel::Any),
        ],
        prop::collection::vec(rec_spec(), 1..5),
        prop_oneof![4 => Just(vec![]), 1 => prop::collection::vec(mutation(), 1..3)],
    )
        .prop_map(|(kind, sess, ack, recs, muts)| DgSpec {
            kind,
            sess,
            ack,
            recs,
            muts,
        })
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        8 => (
            0usize..NODES as usize,
            prop_oneof![8 => (0u16..NODES, Just(0u16)), 1 => (0u16..5, 0u16..3)],
            prop_oneof![
                1 => prop::collection::vec(any::<u8>(), 0..120).prop_map(Payload::Random),
                6 => dg_spec().prop_map(Payload::Built),
                3 => (0u8..4, prop::collection::vec(rec_spec(), 1..4))
                    .prop_map(|(k, r)| Payload::SameHeader(k, r)),
            ],
        )
            .prop_map(|(target, src, payload)| Action::Inject {
                target,
                src,
                payload
            }),
        2 => (1u8..4).prop_map(Action::Poll),
        1 => (0u32..30_000_000).prop_map(Action::Advance),
    ]
}

/// Builds the datagram (never longer than the MTU, as a network would deliver it).
fn materialise(
    p: &Params,
    sessions: &[u32],
    target: usize,
    src: (u16, u16),
    d: &DgSpec,
    recent: &mut Vec<u64>,
) -> Vec<u8> {
    let session = match d.sess {
        SessSel::Forged => {
            if d.kind == wire::KIND_RESPONSE {
                sessions[target]
            } else {
                sessions[(src.0 as usize).min(sessions.len() - 1)]
            }
        }
        SessSel::OtherNode(n) => sessions[n] ^ 0x8000_0000,
        SessSel::Any(s) => s,
    };
    let ack = match d.ack {
        AckSel::Zero => 0,
        AckSel::Small(a) => a,
        AckSel::NearMax(a) => u64::MAX - a,
        AckSel::Any(a) => a,
    };
    let mut b = Vec::new();
    wire::begin(&mut b, d.kind, session, ack);
    push_recs(p, &mut b, &d.recs, recent);
    mutate(&mut b, &d.muts);
    b.truncate(p.mtu);
    b
}

/// Appends records to the datagram in `b` (staying within the MTU and record limit).
fn push_recs(p: &Params, b: &mut Vec<u8>, recs: &[RecSpec], recent: &mut Vec<u64>) {
    let sp = p.sp();
    let s = 0;
    let mut count = b[3] as usize;
    'outer: for r in recs {
        let seq = match r.seq {
            SeqSel::Small(x) => x,
            SeqSel::NearMax(x) => u64::MAX - x,
            SeqSel::Any(x) => x.max(1),
            SeqSel::Recent(k) => recent.iter().rev().nth(k as usize).copied().unwrap_or(1),
        };
        recent.push(seq);
        let (seg, len) = match r.seg {
            SegSel::None => (
                None,
                match r.len {
                    LenSel::Small(n) => n as usize,
                    LenSel::Sp => sp,
                    LenSel::SingleCap => p.single_cap(),
                    LenSel::Any(n) => n as usize % (p.mtu + 1),
                },
            ),
            SegSel::Aligned { k, total } => {
                let total = (total as usize % (p.max_message + 2)).max(1);
                let segs = total.div_ceil(sp);
                let k = k as usize % segs;
                let off = k * sp;
                let len = sp.min(total - off);
                (
                    Some(Seg {
                        total: total as u32,
                        offset: off as u32,
                    }),
                    len,
                )
            }
            SegSel::Raw { total, offset } => {
                let total = total % (wire::MAX_WIRE_MESSAGE + 2);
                let offset = offset % total.max(1);
                let len = match r.len {
                    LenSel::Small(n) => n as usize,
                    _ => sp,
                }
                .max(1)
                .min((total - offset).max(1) as usize);
                (Some(Seg { total, offset }), len)
            }
        };
        let payload: Vec<u8> = (0..len).map(|i| r.fill.wrapping_add(i as u8)).collect();
        for _ in 0..r.repeat {
            if count == wire::MAX_RECORDS || b.len() + wire::record_len(len, seg.is_some()) > p.mtu
            {
                break 'outer;
            }
            wire::push_record(b, s, seq, r.tag, seg, &payload);
            count += 1;
        }
    }
}

/// Whether a datagram carries a forged session: a response with the target's session, or
/// a request with the session of the cluster endpoint it claims to come from.
fn forged(sessions: &[u32], target: usize, src: (u16, u16), b: &[u8]) -> bool {
    let Ok((h, _)) = wire::decode(b) else {
        return false;
    };
    if h.kind == wire::KIND_RESPONSE {
        h.session == sessions[target]
    } else {
        src.1 == 0 && (src.0 as usize) < sessions.len() && h.session == sessions[src.0 as usize]
    }
}

// ---------------------------------------------------------------------------------------
// The property.

#[derive(Default, Debug)]
struct CaseReport {
    max_tx_per_step: u64,
    max_ratio: f64,
    forged_at: Vec<usize>,
    stats: ambidex_rpc::RpcStats,
    max_grown: isize,
    wrong: u64,
    errors: u64,
}

fn run_case(p: Params, actions: &[Action]) -> Result<CaseReport, TestCaseError> {
    let base = live_reset_peak();
    let mut c = Cluster::new(p);
    let after_build = live_reset_peak();
    let n = c.rts.len();
    let mut pending = vec![0u64; n];
    let mut last: Vec<ambidex_rpc::RpcStats> = c.rts.iter().map(|r| r.stats()).collect();
    let mut forged_to = vec![false; n];
    let mut rep = CaseReport::default();
    let mut recent = Vec::new();
    let mut headers: Vec<(usize, (u16, u16), [u8; wire::DGRAM_HDR])> = Vec::new();
    // What one received datagram may legitimately cause: one whole segmented response
    // per record of a full request datagram is the honest worst case here (a worker's
    // datagram carries at most 3 records), so allow one segmented response plus one.
    let per_rx = p.max_segs() as u64 + 1;
    let step = |c: &mut Cluster,
                pending: &mut [u64],
                last: &mut [ambidex_rpc::RpcStats],
                rep: &mut CaseReport|
     -> Result<(), TestCaseError> {
        for i in 0..n {
            // Since the end of this runtime's last step (injections act at once).
            let (tx0, s0) = (c.tx(i), last[i].clone());
            c.rts[i].poll_once();
            let s1 = c.rts[i].stats();
            let d = c.tx(i) - tx0;
            // Datagrams received in this step (polled, plus injected since the last one).
            let rx = s1.rx_datagrams - s0.rx_datagrams;
            // Requests this runtime originated (new or retransmitted), each up to
            // max_segs datagrams.
            let own = (s1.rpcs_issued - s0.rpcs_issued + s1.retransmits - s0.retransmits)
                * p.max_segs() as u64;
            rep.max_tx_per_step = rep.max_tx_per_step.max(d);
            if pending[i] > 0 && d > own {
                rep.max_ratio = rep.max_ratio.max((d - own) as f64 / rx as f64);
            }
            let limit = own + per_rx * rx;
            prop_assert!(
                d <= limit,
                "node {i} sent {d} datagrams in one step after receiving {rx} ({} injected); limit {limit}; {:?}",
                pending[i],
                s1
            );
            pending[i] = 0;
            last[i] = s1;
        }
        c.clock.advance(100_000);
        Ok(())
    };
    for a in actions {
        match a {
            Action::Inject {
                target,
                src,
                payload,
            } => {
                let (target, src) = match payload {
                    Payload::SameHeader(k, _) if !headers.is_empty() => {
                        let (t, s, _) = headers[headers.len() - 1 - (*k as usize % headers.len())];
                        (t, s)
                    }
                    _ => (*target, *src),
                };
                let (target, src) = (&target, &src);
                let b = match payload {
                    Payload::Random(b) => b.clone(),
                    Payload::Built(d) => {
                        materialise(&p, &c.sessions, *target, *src, d, &mut recent)
                    }
                    Payload::SameHeader(k, recs) => {
                        let mut b = match headers.len() {
                            0 => {
                                let mut b = Vec::new();
                                wire::begin(&mut b, wire::KIND_REQUEST, 1, 0);
                                b
                            }
                            n => headers[n - 1 - (*k as usize % n)].2.to_vec(),
                        };
                        b[3] = 0;
                        push_recs(&p, &mut b, recs, &mut recent);
                        b
                    }
                };
                if b.len() >= wire::DGRAM_HDR {
                    let h: [u8; wire::DGRAM_HDR] = b[..wire::DGRAM_HDR].try_into().unwrap();
                    headers.push((*target, *src, h));
                }
                if forged(&c.sessions, *target, *src, &b) {
                    // A forged request hurts the client it claims to be; a forged response its target.
                    let victim = if b[2] == wire::KIND_RESPONSE {
                        *target
                    } else {
                        src.0 as usize
                    };
                    forged_to[victim] = true;
                    rep.forged_at.push(victim);
                }
                c.rts[*target].inject(EndpointAddr::new(src.0, src.1), &b);
                pending[*target] += 1;
            }
            Action::Poll(k) => {
                for _ in 0..*k {
                    step(&mut c, &mut pending, &mut last, &mut rep)?;
                }
            }
            Action::Advance(ns) => c.clock.advance(*ns as u64),
        }
        step(&mut c, &mut pending, &mut last, &mut rep)?;
    }
    // Honest traffic only from here: every worker must finish (retransmission heals
    // drops; a request fails only after the give-up time, 1 s).
    let mut steps = 0;
    while c.rts.iter().any(|r| r.live_tasks() > 0) {
        step(&mut c, &mut pending, &mut last, &mut rep)?;
        c.clock.advance(900_000);
        steps += 1;
        prop_assert!(
            steps < 20_000,
            "workers hang: {:?}",
            c.rts.iter().map(|r| r.stats()).collect::<Vec<_>>()
        );
    }
    for _ in 0..5 {
        step(&mut c, &mut pending, &mut last, &mut rep)?;
    }
    let log = c.log.borrow();
    rep.wrong = log.iter().filter(|x| x.1 == Outcome::Wrong).count() as u64;
    rep.errors = log
        .iter()
        .filter(|x| matches!(x.1, Outcome::Err(_)))
        .count() as u64;
    prop_assert_eq!(log.len(), WORKERS * ROUNDS as usize * 3);
    for (w, o) in log.iter() {
        if !forged_to[*w] {
            prop_assert_eq!(
                o,
                &Outcome::Correct,
                "worker {} without forged traffic: {:?}",
                w,
                c.rts[*w].stats()
            );
        }
    }
    // Memory: state the runtimes keep is bounded by their configuration (client windows
    // of cached responses, reassembly buffers, one step's outgoing datagrams).
    let cfg_bound = n as isize
        * (n as isize * p.window as isize * p.max_message as isize
            + p.slots as isize * p.max_message as isize
            + 64 * p.mtu as isize * 8);
    let grown = peak() - after_build;
    prop_assert!(
        grown <= cfg_bound + (1 << 20),
        "allocation grew by {grown} bytes (bound {cfg_bound})"
    );
    let _ = (base, c.runs.get());
    for r in &c.rts {
        rep.stats.merge(&r.stats());
    }
    rep.max_grown = grown;
    Ok(rep)
}

fn cases() -> u32 {
    std::env::var("FUZZ_RUNTIME_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300)
}

#[test]
fn runtime_cluster_under_attack() {
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        max_shrink_iters: 20_000,
        ..Config::default()
    });
    let strat = (0usize..PARAMS.len(), prop::collection::vec(action(), 1..40));
    let worst = RefCell::new((0u64, 0f64, 0isize));
    // Cases with forged traffic; honest RPCs answered wrongly / failed in them.
    let forged = RefCell::new((0u64, 0u64, 0u64));
    let total = RefCell::new(ambidex_rpc::RpcStats::default());
    let r = runner.run(&strat, |(pi, actions)| {
        let rep = run_case(PARAMS[pi], &actions)?;
        let mut w = worst.borrow_mut();
        w.0 = w.0.max(rep.max_tx_per_step);
        w.1 = w.1.max(rep.max_ratio);
        w.2 = w.2.max(rep.max_grown);
        total.borrow_mut().merge(&rep.stats);
        let mut f = forged.borrow_mut();
        f.0 += !rep.forged_at.is_empty() as u64;
        f.1 += rep.wrong;
        f.2 += rep.errors;
        Ok(())
    });
    eprintln!(
        "worst step: {:?} (datagrams, datagrams per received, bytes allocated)",
        worst.borrow()
    );
    eprintln!(
        "cases with forged sessions, wrong answers and failed RPCs in them: {:?}",
        forged.borrow()
    );
    eprintln!("coverage (all runtimes, all cases): {:#?}", total.borrow());
    r.unwrap();
}
