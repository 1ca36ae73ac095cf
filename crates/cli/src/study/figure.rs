//! What a study measures and what it concludes: a figure is a set of series (one
//! configuration each) measured at several coroutine counts (or cluster shapes), and
//! the paper's claims about it, each checked against the points measured here.

use ambidex::bench::BenchReport;
use ambidex::Config;
use serde::Serialize;
use std::collections::BTreeMap;

/// How a figure is drawn (and so which points it needs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Shape {
    /// Median latency against throughput, one line per series over the coroutine sweep
    /// (DrTM+H Figures 7–11 and 14, FaSST Figure 10).
    Curve,
    /// Throughput and latency per series at each coroutine count, as grouped bars
    /// (DrTM+H Figure 13).
    Bars,
    /// Throughput and RPC requests per second per series, as grouped bars (FaSST
    /// Figure 7).
    Rates,
    /// Mean time per protocol phase, stacked, per series at each coroutine count
    /// (DrTM+H Figure 15).
    Phases,
    /// Throughput against the series' cluster shape (FaSST Figures 8 and 9): one bar
    /// per series, labelled by its nodes and threads.
    Scaling,
}

/// One line (or bar group) of a figure: a label and the run's configuration.
pub struct Series {
    pub label: String,
    pub cfg: Config,
}

/// A claim of the paper about one figure, and the check of it against this machine's
/// points.
#[derive(Clone, Copy)]
pub struct Claim {
    /// The paper's words, briefly (with the section it comes from).
    pub text: &'static str,
    pub check: fn(&Points<'_>) -> Verdict,
}

/// Whether a claim holds here, with the numbers that say so.
#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    /// `None`: the points cannot decide it (a series failed, or the margin is inside
    /// the noise of this machine, see [`NOISE`]).
    pub holds: Option<bool>,
    pub evidence: String,
}

/// Relative differences smaller than this are not taken as a difference: on this
/// shared 2-core machine repeated runs of one configuration differ by about this much.
pub const NOISE: f64 = 0.05;

/// A figure to measure.
pub struct FigureSpec {
    /// `drtmh-fig07-tpcc-no`, `fasst-fig08`: the output files' stem.
    pub id: String,
    /// The figure's caption here.
    pub title: String,
    /// Which figure of which paper it reproduces, and what was measured there.
    pub paper: String,
    pub shape: Shape,
    pub series: Vec<Series>,
    /// Coroutine counts per thread each series is measured at.
    pub coroutines: Vec<usize>,
    pub claims: Vec<Claim>,
}

/// The protocol's phases in order, as reports name them (`phase_means_us`).
pub use ambidex::bench::report::PHASE_NAMES as PHASES;

impl FigureSpec {
    /// The figure's number in its paper (`drtmh-fig07-...` is 7).
    pub fn number(&self) -> Option<u32> {
        let rest = self.id.split("-fig").nth(1)?;
        rest.split('-').next()?.parse().ok()
    }
}

/// One measured point.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct Point {
    pub series: String,
    pub coroutines: usize,
    pub nodes: u16,
    pub threads: u16,
    pub committed_per_s: f64,
    pub committed_per_cpu_s: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub abort_rate: f64,
    pub conflict_abort_rate: f64,
    /// Mean µs per phase of committed transactions that ran it.
    pub phase_means_us: BTreeMap<String, f64>,
    /// RPC requests issued per second (the object store's "RPC request rate"), over
    /// the warmup and the measured window (the transport's counters run from the start;
    /// the load is steady over both).
    pub rpc_requests_per_s: f64,
    /// One-sided operations posted per second, over the same time.
    pub one_sided_per_s: f64,
    /// Location-cache hit rate of the execute phase (0 when the cache is unused).
    pub cache_hit_rate: f64,
    /// The policy of the run, phase by phase.
    pub policy: String,
}

impl Point {
    pub fn from_report(series: &str, r: &BenchReport) -> Point {
        let secs = (r.warmup_s + r.duration_s).max(1e-9);
        let o = &r.one_sided;
        let lc = &r.location_cache;
        let lookups = lc.hits + lc.misses;
        Point {
            series: series.to_string(),
            coroutines: r.coroutines,
            nodes: r.nodes,
            threads: r.threads_per_node,
            committed_per_s: r.committed_per_s,
            committed_per_cpu_s: r.committed_per_cpu_s,
            p50_us: r.latency_us.p50,
            p90_us: r.latency_us.p90,
            p99_us: r.latency_us.p99,
            abort_rate: r.abort_rate,
            conflict_abort_rate: r.conflict_abort_rate,
            phase_means_us: r.phase_means_us.clone(),
            rpc_requests_per_s: r.rpc.rpcs_issued as f64 / secs,
            one_sided_per_s: (o.reads + o.writes + o.cas + o.faa) as f64 / secs,
            cache_hit_rate: if lookups == 0 {
                0.0
            } else {
                lc.hits as f64 / lookups as f64
            },
            policy: ambidex::config::policy_phases(&r.policy.policy),
        }
    }
}

/// A figure's points, as its claims read them.
pub struct Points<'a> {
    pub all: &'a [Point],
}

impl<'a> Points<'a> {
    /// The points of one series, in coroutine order.
    pub fn of(&self, series: &str) -> Vec<&'a Point> {
        let mut v: Vec<&Point> = self.all.iter().filter(|p| p.series == series).collect();
        v.sort_by_key(|p| p.coroutines);
        v
    }

    /// A series' point at `coroutines`.
    pub fn at(&self, series: &str, coroutines: usize) -> Option<&'a Point> {
        self.all
            .iter()
            .find(|p| p.series == series && p.coroutines == coroutines)
    }

    /// A series' highest throughput over its sweep.
    pub fn peak(&self, series: &str) -> Option<f64> {
        self.of(series)
            .iter()
            .map(|p| p.committed_per_s)
            .reduce(f64::max)
    }

    /// A series' median latency at its fewest coroutines (the unloaded latency).
    pub fn low_load_p50(&self, series: &str) -> Option<f64> {
        self.of(series).first().map(|p| p.p50_us)
    }
}

/// A scaling series' label.
pub fn shape_label(nodes: u16, threads: u16) -> String {
    format!("{nodes} nodes x {threads} threads")
}

/// Linear scaling: committed per CPU-second of the largest cluster within 15% of the
/// smallest's (both at one thread per node).
pub fn scales_flat(p: &Points<'_>) -> Verdict {
    let one_thread: Vec<_> = p.all.iter().filter(|x| x.threads == 1).collect();
    let (Some(small), Some(big)) = (
        one_thread.iter().min_by_key(|x| x.nodes),
        one_thread.iter().max_by_key(|x| x.nodes),
    ) else {
        return Verdict {
            holds: None,
            evidence: "no one-thread points".into(),
        };
    };
    close(
        "committed per CPU-second",
        &format!("{} nodes", big.nodes),
        Some(big.committed_per_cpu_s),
        &format!("{} nodes", small.nodes),
        Some(small.committed_per_cpu_s),
        0.15,
    )
}

/// `a / b`, the ratio a claim compares.
pub fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        f64::INFINITY
    }
}

/// The verdict on "`a` is larger than `b`" (`what` names the quantity): holds if by more
/// than the noise, fails if smaller by more than it, undecided in between.
pub fn larger(what: &str, a_name: &str, a: Option<f64>, b_name: &str, b: Option<f64>) -> Verdict {
    let (Some(a), Some(b)) = (a, b) else {
        return Verdict {
            holds: None,
            evidence: format!("{what}: a series has no points"),
        };
    };
    let r = ratio(a, b);
    let holds = if r > 1.0 + NOISE {
        Some(true)
    } else if r < 1.0 - NOISE {
        Some(false)
    } else {
        None
    };
    Verdict {
        holds,
        evidence: format!(
            "{what}: {a_name} {} vs {b_name} {} ({r:.2}x)",
            fmt_num(a),
            fmt_num(b)
        ),
    }
}

/// The verdict on "`a` is about `b`": holds if they differ by at most `tol` (relative
/// to `b`), fails otherwise.
pub fn close(
    what: &str,
    a_name: &str,
    a: Option<f64>,
    b_name: &str,
    b: Option<f64>,
    tol: f64,
) -> Verdict {
    let (Some(a), Some(b)) = (a, b) else {
        return Verdict {
            holds: None,
            evidence: format!("{what}: a series has no points"),
        };
    };
    let r = ratio(a, b);
    Verdict {
        holds: Some((r - 1.0).abs() <= tol),
        evidence: format!(
            "{what}: {a_name} {} vs {b_name} {} ({r:.2}x; within {:.0}% counts as comparable)",
            fmt_num(a),
            fmt_num(b),
            tol * 100.0
        ),
    }
}

/// Joins several verdicts: holds if all hold, fails if any fails, else undecided.
pub fn all_of(parts: Vec<Verdict>) -> Verdict {
    let holds = if parts.iter().any(|v| v.holds == Some(false)) {
        Some(false)
    } else if parts.iter().all(|v| v.holds == Some(true)) {
        Some(true)
    } else {
        None
    };
    Verdict {
        holds,
        evidence: parts
            .into_iter()
            .map(|v| v.evidence)
            .collect::<Vec<_>>()
            .join("; "),
    }
}

/// A number as the tables print it: three significant digits, k/M suffixes.
pub fn fmt_num(x: f64) -> String {
    let a = x.abs();
    if a >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}k", x / 1e3)
    } else if a >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else if a >= 100.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_difference_inside_the_noise_is_undecided_and_outside_it_decides() {
        let v = larger("t", "a", Some(103.0), "b", Some(100.0));
        assert_eq!(v.holds, None);
        assert_eq!(
            larger("t", "a", Some(120.0), "b", Some(100.0)).holds,
            Some(true)
        );
        assert_eq!(
            larger("t", "a", Some(80.0), "b", Some(100.0)).holds,
            Some(false)
        );
        assert_eq!(larger("t", "a", None, "b", Some(100.0)).holds, None);
        let joined = all_of(vec![
            larger("x", "a", Some(2.0), "b", Some(1.0)),
            larger("y", "a", Some(1.0), "b", Some(2.0)),
        ]);
        assert_eq!(joined.holds, Some(false));
        assert!(joined.evidence.contains("2.00x") && joined.evidence.contains("0.50x"));
    }
}
