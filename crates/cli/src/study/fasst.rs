//! `ambidex study fasst`: FaSST's evaluation (§6, Figures 7–10) as shapes on this
//! machine: the object store's three transaction kinds, TATP and SmallBank as the
//! cluster grows, and TATP's throughput–latency curve. Every run is the `fasst` preset.

use super::figure::{
    all_of, larger, scales_flat, shape_label, Claim, FigureSpec, Points, Series, Shape, Verdict,
};
use ambidex::Config;
use ambidex_workloads::WorkloadKind;

fn with(base: &Config, label: &str, f: impl FnOnce(&mut Config)) -> Series {
    let mut cfg = base.clone();
    cfg.txn = Default::default(); // the fasst preset
    f(&mut cfg);
    Series {
        label: label.into(),
        cfg,
    }
}

/// Cluster shapes of the scaling figures: (nodes, threads per node). 3 nodes is the
/// least 3-way replication allows; every shape shares this machine's two cores.
pub const SHAPES: [(u16, u16); 4] = [(3, 1), (4, 1), (5, 1), (3, 2)];

pub fn figures(
    base: &Config,
    shapes: &[(u16, u16)],
    one: usize,
    sweep: &[usize],
) -> Vec<FigureSpec> {
    let objstore = |label: &str, r: usize, w: usize| {
        with(base, label, |c| {
            c.run.workload = WorkloadKind::ObjectStore.into();
            c.run.r = r;
            c.run.w = w;
        })
    };
    let scaling = |w: WorkloadKind| -> Vec<Series> {
        shapes
            .iter()
            .map(|&(n, t)| {
                with(base, &shape_label(n, t), |c| {
                    c.run.workload = w.into();
                    c.cluster.nodes = n;
                    c.cluster.threads = t;
                })
            })
            .collect()
    };
    let scaling_claim = Claim {
        text: "Throughput scales linearly with the cluster (per-machine throughput stays flat as nodes are added); here the nodes share two cores, so linear scaling shows as a flat throughput per CPU-second",
        check: scales_flat,
    };
    vec![
        FigureSpec {
            id: "fasst-fig07-objstore".into(),
            title: "Object store O(1,0), O(4,0), O(4,2): transactions and RPC requests per second".into(),
            paper: "FaSST Figure 7 (§6.1): per-machine transaction throughput and RPC request rate".into(),
            shape: Shape::Rates,
            series: vec![
                objstore("O(1,0)", 1, 0),
                objstore("O(4,0)", 4, 0),
                objstore("O(4,2)", 4, 2),
            ],
            coroutines: vec![one],
            claims: vec![
                Claim {
                    text: "Throughput falls as transactions grow: O(1,0) > O(4,0) > O(4,2) (CIB: 32.3, 4.7, 2.3 Mtps/machine)",
                    check: |p| all_of(vec![
                        larger("committed/s", "O(1,0)", first(p, "O(1,0)", |x| x.committed_per_s), "O(4,0)", first(p, "O(4,0)", |x| x.committed_per_s)),
                        larger("committed/s", "O(4,0)", first(p, "O(4,0)", |x| x.committed_per_s), "O(4,2)", first(p, "O(4,2)", |x| x.committed_per_s)),
                    ]),
                },
                Claim {
                    text: "Doorbell batching raises the RPC request rate from O(1,0) to O(4,0) (CIB: 32.3 to 37.9 Mrps)",
                    check: |p| larger("RPC requests/s", "O(4,0)", first(p, "O(4,0)", |x| x.rpc_requests_per_s), "O(1,0)", first(p, "O(1,0)", |x| x.rpc_requests_per_s)),
                },
            ],
        },
        FigureSpec {
            id: "fasst-fig08-tatp-scaling".into(),
            title: "TATP throughput as the cluster grows".into(),
            paper: "FaSST Figure 8 (§6.2): TATP Mtps per machine against the number of machines".into(),
            shape: Shape::Scaling,
            series: scaling(WorkloadKind::Tatp),
            coroutines: vec![one],
            claims: vec![scaling_claim],
        },
        FigureSpec {
            id: "fasst-fig09-smallbank-scaling".into(),
            title: "SmallBank throughput as the cluster grows".into(),
            paper: "FaSST Figure 9 (§6.3): SmallBank Mtps per machine against the number of machines".into(),
            shape: Shape::Scaling,
            series: scaling(WorkloadKind::SmallBank),
            coroutines: vec![one],
            claims: vec![scaling_claim],
        },
        FigureSpec {
            id: "fasst-fig10-tatp-latency".into(),
            title: "TATP: median and 99th percentile latency against throughput as coroutines grow".into(),
            paper: "FaSST Figure 10 (§6.4): 1 to 19 worker coroutines per thread".into(),
            shape: Shape::Curve,
            series: vec![with(base, "TATP", |c| {
                c.run.workload = WorkloadKind::Tatp.into();
            })],
            coroutines: sweep.to_vec(),
            claims: vec![Claim {
                text: "More coroutines raise throughput several-fold (CIB: 19.7 to 95.7 Mtps, 4.9x from 1 to 19) while median and tail latency grow (2.8 to 12.6 µs, 21.8 to 87.2 µs)",
                check: |p| {
                    let pts = p.of("TATP");
                    let (Some(lo), Some(hi)) = (pts.first(), pts.last()) else {
                        return Verdict { holds: None, evidence: "no points".into() };
                    };
                    all_of(vec![
                        larger(&format!("committed/s at {} vs {} coroutines", hi.coroutines, lo.coroutines), "more", Some(hi.committed_per_s), "fewer", Some(lo.committed_per_s)),
                        larger("p50 µs", "more", Some(hi.p50_us), "fewer", Some(lo.p50_us)),
                        larger("p99 µs", "more", Some(hi.p99_us), "fewer", Some(lo.p99_us)),
                    ])
                },
            }],
        },
    ]
}

/// A series' first point's value.
fn first(p: &Points<'_>, series: &str, f: fn(&super::figure::Point) -> f64) -> Option<f64> {
    p.of(series).first().map(|x| f(x))
}
