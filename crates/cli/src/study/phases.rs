//! `ambidex study phases`: DrTM+H's phase-by-phase study (§5, Figures 7–11), its
//! scaling and end-to-end comparisons (§6, Figures 12–15), on one workload.
//!
//! "Each primitive with the others held fixed": a phase's figure varies that phase's
//! choice and keeps every other phase at DrTM+H's (the `drtm-h` preset), except where
//! the paper fixes another (Figure 9 commits behind a two-sided lock, as DrTM+H had to).

use super::figure::{
    all_of, close, larger, scales_flat, shape_label, Claim, FigureSpec, Series, Shape, Verdict,
};
use ambidex::config::{Commit, Execute, Lock, Log, PassiveAck, TxnSection, Validate};
use ambidex::Config;
use ambidex_workloads::WorkloadKind;

/// A series on `base` with the `drtm-h` preset changed by `f`.
fn drtmh(base: &Config, label: &str, f: impl FnOnce(&mut TxnSection)) -> Series {
    preset(base, label, "drtm-h", f)
}

/// A series on `base` with preset `mode` changed by `f`.
fn preset(base: &Config, label: &str, mode: &str, f: impl FnOnce(&mut TxnSection)) -> Series {
    let mut cfg = base.clone();
    cfg.txn = TxnSection {
        mode: mode.into(),
        ..TxnSection::default()
    };
    f(&mut cfg.txn);
    Series {
        label: label.into(),
        cfg,
    }
}

/// The workload's name as the paper writes it.
fn paper_name(w: WorkloadKind) -> &'static str {
    match w {
        WorkloadKind::TpccNo => "TPC-C/no",
        WorkloadKind::SmallBank => "SmallBank",
        _ => "",
    }
}

/// Every figure of the study on `base`'s workload (SmallBank or TPC-C/no), and Figure
/// 11 on TPC-E customer-position (`tpce`: the same cluster with that workload).
pub fn figures(base: &Config, tpce: &Config, sweep: &[usize], ends: &[usize]) -> Vec<FigureSpec> {
    let w = if base.run.workload == WorkloadKind::TpccNo {
        WorkloadKind::TpccNo
    } else {
        WorkloadKind::SmallBank
    };
    let name = paper_name(w);
    let tag = w.name();
    let tpcc = w == WorkloadKind::TpccNo;
    let mut figs = Vec::new();
    // DrTM+H's phase study (§5) ran without outstanding requests in the execution
    // phase (§6.1); its end-to-end comparisons (§6) with them. Only TPC-C's NewOrder
    // has independent remote records for them to overlap.
    let with_or = base;
    let mut no_or = base.clone();
    no_or.run.outstanding_requests = !tpcc;
    let base = &no_or;

    figs.push(FigureSpec {
        id: format!("drtmh-fig07-execute-{tag}"),
        title: format!("{name}: the execution phase by RPC, one-sided READs, one-sided READs with the location cache"),
        paper: "DrTM+H Figure 7 (§5.1): throughput against median latency as coroutines grow; other phases as DrTM+H".into(),
        shape: Shape::Curve,
        series: vec![
            drtmh(base, "Two-sided", |t| t.execute = Some(Execute::Rpc)),
            drtmh(base, "One-sided", |t| t.execute = Some(Execute::OneSided)),
            drtmh(base, "One-sided/Cache", |t| t.execute = Some(Execute::Cached)),
        ],
        coroutines: sweep.to_vec(),
        claims: {
            let mut c = vec![
                Claim {
                    text: "One-sided/Cache has a higher peak throughput than Two-sided (TPC-C/no up to 1.45x, SmallBank up to 1.36x)",
                    check: |p| larger("peak committed/s", "One-sided/Cache", p.peak("One-sided/Cache"), "Two-sided", p.peak("Two-sided")),
                },
                Claim {
                    text: "One-sided/Cache has a lower median latency than Two-sided (TPC-C/no: 69% of it)",
                    check: |p| larger("p50 µs at the fewest coroutines", "Two-sided", p.low_load_p50("Two-sided"), "One-sided/Cache", p.low_load_p50("One-sided/Cache")),
                },
            ];
            if tpcc {
                c.push(Claim {
                    text: "Two-sided beats One-sided without the cache at few coroutines (up to 1.28x), but with many coroutines One-sided's peak is higher (about 13%): it spares the busy remote CPU",
                    check: |p| {
                        let low = p.of("Two-sided").first().map(|x| x.coroutines).unwrap_or(1);
                        all_of(vec![
                            larger("committed/s at the fewest coroutines", "Two-sided", p.at("Two-sided", low).map(|x| x.committed_per_s), "One-sided", p.at("One-sided", low).map(|x| x.committed_per_s)),
                            larger("peak committed/s", "One-sided", p.peak("One-sided"), "Two-sided", p.peak("Two-sided")),
                        ])
                    },
                });
            } else {
                c.push(Claim {
                    text: "Two-sided beats One-sided without the cache in peak throughput (up to 2.01x): one-sided needs a lookup READ and the item READ",
                    check: |p| larger("peak committed/s", "Two-sided", p.peak("Two-sided"), "One-sided", p.peak("One-sided")),
                });
            }
            c
        },
    });

    figs.push(FigureSpec {
        id: format!("drtmh-fig08-lock-{tag}"),
        title: format!("{name}: locking in the validation phase by RPC or one-sided CAS"),
        paper: "DrTM+H Figure 8 (§5.2): throughput against median latency; other phases as DrTM+H".into(),
        shape: Shape::Curve,
        series: vec![
            drtmh(base, "Two-sided", |t| t.lock = Some(Lock::Rpc)),
            drtmh(base, "One-sided (CAS)", |t| t.lock = Some(Lock::Cas)),
        ],
        coroutines: sweep.to_vec(),
        claims: vec![Claim {
            text: "One-sided CAS locking is faster than two-sided: lower median latency (though it may peak lower)",
            check: |p| larger("p50 µs at the fewest coroutines", "Two-sided", p.low_load_p50("Two-sided"), "One-sided (CAS)", p.low_load_p50("One-sided (CAS)")),
        }],
    });

    figs.push(FigureSpec {
        id: format!("drtmh-fig09-commit-{tag}"),
        title: format!("{name}: the commit phase by RPC or one-sided WRITEs, with and without passive ACK"),
        paper: "DrTM+H Figure 9 (§5.3): throughput against median latency; locks by RPC (as the paper had to), other phases as DrTM+H".into(),
        shape: Shape::Curve,
        series: vec![
            drtmh(base, "Two-sided", |t| {
                t.lock = Some(Lock::Rpc);
                t.commit = Some(Commit::Rpc);
                t.passive_ack = Some(PassiveAck::Off);
            }),
            drtmh(base, "One-sided", |t| {
                t.lock = Some(Lock::Rpc);
                t.commit = Some(Commit::Write);
                t.passive_ack = Some(PassiveAck::Off);
            }),
            drtmh(base, "Two-sided + PA", |t| {
                t.lock = Some(Lock::Rpc);
                t.commit = Some(Commit::Rpc);
                t.passive_ack = Some(PassiveAck::On);
            }),
            drtmh(base, "One-sided + PA", |t| {
                t.lock = Some(Lock::Rpc);
                t.commit = Some(Commit::Write);
                t.passive_ack = Some(PassiveAck::On);
            }),
        ],
        coroutines: sweep.to_vec(),
        claims: vec![
            Claim {
                text: "Without passive ACK, one-sided WRITEs commit faster than RPCs (the receiver's CPU is spared)",
                check: |p| larger("peak committed/s", "One-sided", p.peak("One-sided"), "Two-sided", p.peak("Two-sided")),
            },
            Claim {
                text: "With passive ACK, two-sided commit is faster than one-sided (doorbell batching on the sender, no replies)",
                check: |p| larger("peak committed/s", "Two-sided + PA", p.peak("Two-sided + PA"), "One-sided + PA", p.peak("One-sided + PA")),
            },
        ],
    });

    figs.push(FigureSpec {
        id: format!("drtmh-fig10-log-{tag}"),
        title: format!("{name}: the logging phase by RPC or one-sided WRITEs"),
        paper: "DrTM+H Figure 10 (§5.4): throughput against median latency; other phases as DrTM+H".into(),
        shape: Shape::Curve,
        series: vec![
            drtmh(base, "Two-sided", |t| t.log = Some(Log::Rpc)),
            drtmh(base, "One-sided", |t| t.log = Some(Log::Write)),
        ],
        coroutines: sweep.to_vec(),
        claims: vec![Claim {
            text: "One-sided logging always has higher throughput and lower latency (TPC-C/no up to 1.29x, SmallBank up to 1.12x)",
            check: |p| all_of(vec![
                larger("peak committed/s", "One-sided", p.peak("One-sided"), "Two-sided", p.peak("Two-sided")),
                larger("p50 µs at the fewest coroutines", "Two-sided", p.low_load_p50("Two-sided"), "One-sided", p.low_load_p50("One-sided")),
            ]),
        }],
    });

    {
        figs.push(FigureSpec {
        id: "drtmh-fig11-readonly-tpce".into(),
        title: "TPC-E customer-position: the read-only transaction's read and validation phases".into(),
        paper: "DrTM+H Figure 11 (§5.5): throughput against median latency".into(),
        shape: Shape::Curve,
        series: vec![
            drtmh(tpce, "Two-sided", |t| {
                t.execute = Some(Execute::Rpc);
                t.validate = Some(Validate::Rpc);
            }),
            drtmh(tpce, "One-sided", |t| {
                t.execute = Some(Execute::OneSided);
                t.validate = Some(Validate::Read);
            }),
            drtmh(tpce, "One-sided/Cache", |t| {
                t.execute = Some(Execute::Cached);
                t.validate = Some(Validate::Read);
            }),
        ],
        coroutines: sweep.to_vec(),
        claims: vec![
            Claim {
                text: "One-sided reads and validation beat two-sided by about 10% in peak throughput, at about 80% of its median latency",
                check: |p| all_of(vec![
                    larger("peak committed/s", "One-sided", p.peak("One-sided"), "Two-sided", p.peak("Two-sided")),
                    larger("p50 µs at the fewest coroutines", "Two-sided", p.low_load_p50("Two-sided"), "One-sided", p.low_load_p50("One-sided")),
                ]),
            },
            Claim {
                text: "The location cache adds close to 20% peak throughput over One-sided and cuts its median latency by more than 20%",
                check: |p| all_of(vec![
                    larger("peak committed/s", "One-sided/Cache", p.peak("One-sided/Cache"), "One-sided", p.peak("One-sided")),
                    larger("p50 µs at the fewest coroutines", "One-sided", p.low_load_p50("One-sided"), "One-sided/Cache", p.low_load_p50("One-sided/Cache")),
                ]),
            },
        ],
    });
    }

    figs.push(scaling(with_or, name, tag, ends));
    figs.push(factor_analysis(with_or, name, tag, ends, tpcc));
    figs.push(presets_end_to_end(with_or, name, tag, sweep, tpcc));
    figs.push(latency_breakdown(with_or, name, tag, ends));
    figs
}

/// DrTM+H Figure 12: DrTM+H as the cluster grows, at the sweep's most coroutines.
fn scaling(base: &Config, name: &str, tag: &str, ends: &[usize]) -> FigureSpec {
    let most = ends.last().copied().unwrap_or(1);
    let series = [3u16, 4, 5]
        .into_iter()
        .map(|n| {
            let mut s = preset(
                base,
                &shape_label(n, base.cluster.threads),
                "drtm-h",
                |_| {},
            );
            s.cfg.cluster.nodes = n;
            s
        })
        .collect();
    FigureSpec {
        id: format!("drtmh-fig12-scaling-{tag}"),
        title: format!("{name}: DrTM+H as the cluster grows"),
        paper: "DrTM+H Figure 12 (§6.2): DrTM+H's throughput as machines are added".into(),
        shape: Shape::Scaling,
        series,
        coroutines: vec![most],
        claims: vec![Claim {
            text: "DrTM+H scales linearly with the machines (per-machine throughput stays flat); here the nodes share two cores, so linear scaling shows as a flat throughput per CPU-second",
            check: scales_flat,
        }],
    }
}

/// The factor analysis' steps, cumulative (DrTM+H Figure 13): FaSST, then (TPC-C/no)
/// outstanding requests, then each phase moved to DrTM+H's choice in turn, ending at
/// the `drtm-h` preset. The paper's text does not give its figure's steps; these are
/// DrTM+H's choices of §6.1 in the order of the protocol's cost.
pub const FACTOR_STEPS: [&str; 7] = [
    "Two-sided (FaSST)",
    "+ outstanding requests",
    "+ one-sided log",
    "+ hybrid execute",
    "+ CAS lock, READ validate",
    "+ one-sided commit",
    "+ passive ACK (DrTM+H)",
];

fn factor_analysis(base: &Config, name: &str, tag: &str, ends: &[usize], tpcc: bool) -> FigureSpec {
    let step = |n: usize| -> Series {
        let mut s = preset(base, FACTOR_STEPS[n], "fasst", |t| {
            if n >= 2 {
                t.log = Some(Log::Write);
            }
            if n >= 3 {
                t.execute = Some(Execute::Hybrid);
            }
            if n >= 4 {
                t.lock = Some(Lock::Cas);
                t.validate = Some(Validate::Read);
            }
            if n >= 5 {
                t.commit = Some(Commit::Write);
            }
            if n >= 6 {
                t.passive_ack = Some(PassiveAck::On);
            }
        });
        s.cfg.run.outstanding_requests = n >= 1 || !tpcc;
        s
    };
    // SmallBank fetches its one or two accounts at once either way: no step of its own.
    let steps: Vec<usize> = (0..FACTOR_STEPS.len())
        .filter(|&n| tpcc || n != 1)
        .collect();
    FigureSpec {
        id: format!("drtmh-fig13-factors-{tag}"),
        title: format!("{name}: DrTM+H's choices added one at a time, at the fewest and most coroutines"),
        paper: "DrTM+H Figure 13 (§6.2): throughput and median/tail latency, optimizations cumulative from left to right, 1 and 16 coroutines".into(),
        shape: Shape::Bars,
        series: steps.into_iter().map(step).collect(),
        coroutines: ends.to_vec(),
        claims: vec![
            Claim {
                text: "With one coroutine (servers underloaded), DrTM+H's one-sided choices give much higher throughput and lower latency than two-sided",
                check: |p| {
                    let (first, last) = (FACTOR_STEPS[0], FACTOR_STEPS[FACTOR_STEPS.len() - 1]);
                    let c = p.of(first).first().map(|x| x.coroutines).unwrap_or(1);
                    all_of(vec![
                        larger("committed/s at the fewest coroutines", last, p.at(last, c).map(|x| x.committed_per_s), first, p.at(first, c).map(|x| x.committed_per_s)),
                        larger("p50 µs at the fewest coroutines", first, p.at(first, c).map(|x| x.p50_us), last, p.at(last, c).map(|x| x.p50_us)),
                    ])
                },
            },
            Claim {
                text: "With 16 coroutines two-sided comes close to one-sided in throughput (the gap narrows), while DrTM+H keeps lower median and tail latency",
                check: |p| {
                    let (first, last) = (FACTOR_STEPS[0], FACTOR_STEPS[FACTOR_STEPS.len() - 1]);
                    let cs: Vec<usize> = p.of(first).iter().map(|x| x.coroutines).collect();
                    let (Some(&lo), Some(&hi)) = (cs.first(), cs.last()) else {
                        return Verdict { holds: None, evidence: "no points".into() };
                    };
                    let gain = |c: usize| match (p.at(last, c), p.at(first, c)) {
                        (Some(a), Some(b)) => Some(a.committed_per_s / b.committed_per_s.max(1e-9)),
                        _ => None,
                    };
                    all_of(vec![
                        larger(&format!("DrTM+H's throughput gain over two-sided, at {lo} vs {hi} coroutines"), &format!("at {lo}"), gain(lo), &format!("at {hi}"), gain(hi)),
                        larger(&format!("p50 µs at {hi} coroutines"), first, p.at(first, hi).map(|x| x.p50_us), last, p.at(last, hi).map(|x| x.p50_us)),
                        larger(&format!("p90 µs at {hi} coroutines"), first, p.at(first, hi).map(|x| x.p90_us), last, p.at(last, hi).map(|x| x.p90_us)),
                    ])
                },
            },
        ],
    }
}

fn presets_end_to_end(
    base: &Config,
    name: &str,
    tag: &str,
    sweep: &[usize],
    tpcc: bool,
) -> FigureSpec {
    let mut claims = vec![Claim {
        text: "DrTM+H has the best throughput of the four designs and, at 16 coroutines, the lowest median latency",
        check: |p| {
            let hi = p.of("DrTM+H").last().map(|x| x.coroutines).unwrap_or(16);
            let mut parts = Vec::new();
            for other in ["FaSST", "FaRM", "DrTM+R"] {
                parts.push(larger("peak committed/s", "DrTM+H", p.peak("DrTM+H"), other, p.peak(other)));
                parts.push(larger(&format!("p50 µs at {hi} coroutines"), other, p.at(other, hi).map(|x| x.p50_us), "DrTM+H", p.at("DrTM+H", hi).map(|x| x.p50_us)));
            }
            all_of(parts)
        },
    }];
    if tpcc {
        claims.push(Claim {
            text: "On TPC-C/no, FaRM and DrTM+R outperform FaSST (one-sided suits a CPU-intensive workload), and DrTM+R outperforms FaRM (cache, CAS locks)",
            check: |p| all_of(vec![
                larger("peak committed/s", "FaRM", p.peak("FaRM"), "FaSST", p.peak("FaSST")),
                larger("peak committed/s", "DrTM+R", p.peak("DrTM+R"), "FaSST", p.peak("FaSST")),
                larger("peak committed/s", "DrTM+R", p.peak("DrTM+R"), "FaRM", p.peak("FaRM")),
            ]),
        });
    } else {
        claims.push(Claim {
            text: "On SmallBank, FaSST is comparable to FaRM (two-sided is faster at execution than one-sided without a cache)",
            check: |p| close("peak committed/s", "FaSST", p.peak("FaSST"), "FaRM", p.peak("FaRM"), 0.10),
        });
    }
    FigureSpec {
        id: format!("drtmh-fig14-presets-{tag}"),
        title: format!("{name}: the four designs end to end"),
        paper: "DrTM+H Figure 14 (§6.3): throughput against median latency of FaSST, FaRM, DrTM+R and DrTM+H emulated on one codebase".into(),
        shape: Shape::Curve,
        series: preset_series(base),
        coroutines: sweep.to_vec(),
        claims,
    }
}

/// The four DrTM+H Table 4 presets, labelled as the paper names the systems.
fn preset_series(base: &Config) -> Vec<Series> {
    [
        ("FaSST", "fasst"),
        ("FaRM", "farm"),
        ("DrTM+R", "drtm-r"),
        ("DrTM+H", "drtm-h"),
    ]
    .into_iter()
    .map(|(label, mode)| preset(base, label, mode, |_| {}))
    .collect()
}

fn latency_breakdown(base: &Config, name: &str, tag: &str, ends: &[usize]) -> FigureSpec {
    FigureSpec {
        id: format!("drtmh-fig15-breakdown-{tag}"),
        title: format!("{name}: mean time per phase of the four designs"),
        paper: "DrTM+H Figure 15 (§6.3): latency breakdown per phase, 1 and 16 coroutines".into(),
        shape: Shape::Phases,
        series: preset_series(base),
        coroutines: ends.to_vec(),
        claims: vec![
            Claim {
                text: "At one coroutine, one-sided READs shorten the execution phase: FaRM's by 13% and DrTM+R's (with the cache) by 41% against FaSST's",
                check: |p| {
                    let c = p.of("FaSST").first().map(|x| x.coroutines).unwrap_or(1);
                    let e = |s: &str| p.at(s, c).map(|x| x.phase_means_us.get("execute").copied().unwrap_or(0.0));
                    all_of(vec![
                        larger("execute µs", "FaSST", e("FaSST"), "FaRM", e("FaRM")),
                        larger("execute µs", "FaSST", e("FaSST"), "DrTM+R", e("DrTM+R")),
                    ])
                },
            },
            Claim {
                text: "One-sided WRITEs shorten the logging phase (DrTM+R by 69%, FaRM by 75% against FaSST's)",
                check: |p| {
                    let c = p.of("FaSST").first().map(|x| x.coroutines).unwrap_or(1);
                    let l = |s: &str| p.at(s, c).map(|x| x.phase_means_us.get("log").copied().unwrap_or(0.0));
                    all_of(vec![
                        larger("log µs", "FaSST", l("FaSST"), "FaRM", l("FaRM")),
                        larger("log µs", "FaSST", l("FaSST"), "DrTM+R", l("DrTM+R")),
                    ])
                },
            },
            Claim {
                text: "DrTM+H has the shortest commit phase (passive ACK takes the acknowledgements off the critical path)",
                check: |p| {
                    let c = p.of("FaSST").first().map(|x| x.coroutines).unwrap_or(1);
                    let commit = |s: &str| p.at(s, c).map(|x| {
                        x.phase_means_us.get("commit_backup").copied().unwrap_or(0.0)
                            + x.phase_means_us.get("commit_primary").copied().unwrap_or(0.0)
                    });
                    all_of(["FaSST", "FaRM", "DrTM+R"].iter().map(|o| larger("commit µs (backups + primaries)", o, commit(o), "DrTM+H", commit("DrTM+H"))).collect())
                },
            },
        ],
    }
}
