//! `ambidex study phases|fasst --quick` end to end on a tiny population: every figure of
//! the study gets its points (every series at every coroutine count), a verdict on each
//! of the paper's claims, a Markdown section and an SVG with its axes and legend.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

const EXE: &str = env!("CARGO_BIN_EXE_ambidex");

fn out_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ambx-study-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Runs `ambidex study ARGS --out DIR` with short windows; returns study.json.
fn study(args: &[&str], dir: &Path) -> Value {
    let out = Command::new(EXE)
        .arg("study")
        .args(args)
        .args(["--quick", "--duration", "0.15", "--warmup", "0.05", "--out"])
        .arg(dir)
        .output()
        .expect("run ambidex study");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "study {args:?} failed:\n{stderr}\n{stdout}"
    );
    // The summary names every figure with its verdict.
    assert!(stdout.contains("ambidex study"), "{stdout}");
    let json = std::fs::read_to_string(dir.join("study.json")).expect("study.json");
    serde_json::from_str(&json).expect("study.json is JSON")
}

/// Every figure: its points cover every series at every coroutine count, each claim
/// has a verdict, its SVG exists with axis titles and every series in the legend, and
/// study.md has its section and table.
fn check_shapes(s: &Value, dir: &Path, want_figures: &[&str]) {
    assert_eq!(
        s["failures"].as_array().map(Vec::len),
        Some(0),
        "{}",
        s["failures"]
    );
    let figures = s["figures"].as_array().expect("figures");
    let ids: Vec<&str> = figures.iter().map(|f| f["id"].as_str().unwrap()).collect();
    assert_eq!(ids, want_figures);
    let md = std::fs::read_to_string(dir.join("study.md")).expect("study.md");
    assert!(md.contains("Does the paper's conclusion hold here?"));
    for f in figures {
        let id = f["id"].as_str().unwrap();
        let series = f["series"].as_array().unwrap();
        let coroutines = f["coroutines"].as_array().unwrap();
        let points = f["points"].as_array().unwrap();
        assert_eq!(
            points.len(),
            series.len() * coroutines.len(),
            "{id}: one point per series and coroutine count"
        );
        for p in points {
            assert!(p["committed_per_s"].as_f64().unwrap() > 0.0, "{id}: {p}");
            assert!(p["p50_us"].as_f64().unwrap() > 0.0, "{id}: {p}");
            let label = p["series"].as_str().unwrap();
            assert!(series.iter().any(|s| s["label"] == label), "{id}: {label}");
        }
        let claims = f["claims"].as_array().unwrap();
        assert!(!claims.is_empty(), "{id} checks no claim");
        for c in claims {
            assert!(c["holds"].is_boolean() || c["holds"].is_null(), "{id}: {c}");
            assert!(!c["evidence"].as_str().unwrap().is_empty());
        }
        assert!(
            ["holds", "does not hold", "partly", "undecided"]
                .contains(&f["verdict"].as_str().unwrap()),
            "{id}"
        );
        let svg = std::fs::read_to_string(dir.join(format!("{id}.svg")))
            .unwrap_or_else(|e| panic!("{id}.svg: {e}"));
        assert!(svg.starts_with("<svg"), "{id}.svg");
        for s in series {
            let label = s["label"].as_str().unwrap().replace('&', "&amp;");
            assert!(svg.contains(&label), "{id}.svg has no legend entry {label}");
        }
        assert!(
            md.contains(&format!("## {id}")),
            "study.md has no section {id}"
        );
        assert!(md.contains(&format!("![{id}]({id}.svg)")));
    }
}

#[test]
fn study_phases_quick_writes_every_figure() {
    let dir = out_dir("phases");
    let s = study(
        &["phases", "--workload", "smallbank", "--scale", "0.01"],
        &dir,
    );
    assert_eq!(s["study"], "phases-smallbank");
    check_shapes(
        &s,
        &dir,
        &[
            "drtmh-fig07-execute-smallbank",
            "drtmh-fig08-lock-smallbank",
            "drtmh-fig09-commit-smallbank",
            "drtmh-fig10-log-smallbank",
            "drtmh-fig11-readonly-tpce",
            "drtmh-fig12-scaling-smallbank",
            "drtmh-fig13-factors-smallbank",
            "drtmh-fig14-presets-smallbank",
            "drtmh-fig15-breakdown-smallbank",
        ],
    );
    // The quick sweep is the fewest and the most coroutines.
    assert_eq!(s["figures"][0]["coroutines"], serde_json::json!([1, 16]));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn study_fasst_quick_writes_every_figure() {
    let dir = out_dir("fasst");
    let s = study(&["fasst", "--scale", "0.005"], &dir);
    assert_eq!(s["study"], "fasst");
    check_shapes(
        &s,
        &dir,
        &[
            "fasst-fig07-objstore",
            "fasst-fig08-tatp-scaling",
            "fasst-fig09-smallbank-scaling",
            "fasst-fig10-tatp-latency",
        ],
    );
    // --replot measures nothing: it writes the same report and the SVGs again from
    // study.json.
    std::fs::remove_file(dir.join("fasst-fig10-tatp-latency.svg")).unwrap();
    let out = Command::new(EXE)
        .args([
            "study", "fasst", "--scale", "0.005", "--quick", "--replot", "--out",
        ])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("study.json")).unwrap()).unwrap();
    for (a, b) in s["figures"]
        .as_array()
        .unwrap()
        .iter()
        .zip(again["figures"].as_array().unwrap())
    {
        assert_eq!(
            a["points"].as_array().unwrap().len(),
            b["points"].as_array().unwrap().len()
        );
        assert_eq!(a["verdict"], b["verdict"]);
    }
    assert_eq!(s["command"], again["command"]);
    assert!(dir.join("fasst-fig10-tatp-latency.svg").exists());
    // A directory of another study is refused.
    let out = Command::new(EXE)
        .args(["study", "phases", "--quick", "--replot", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("holds study fasst"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn study_refuses_a_workload_the_paper_did_not_study() {
    let out = Command::new(EXE)
        .args(["study", "phases", "--workload", "tatp", "--quick"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("smallbank or tpcc-no"));
}

#[test]
fn study_figures_runs_only_those_and_refuses_unknown_ones() {
    let dir = out_dir("figures");
    let s = study(
        &[
            "phases",
            "--workload",
            "smallbank",
            "--scale",
            "0.01",
            "--figures",
            "8,12",
        ],
        &dir,
    );
    check_shapes(
        &s,
        &dir,
        &[
            "drtmh-fig08-lock-smallbank",
            "drtmh-fig12-scaling-smallbank",
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new(EXE)
        .args(["study", "fasst", "--quick", "--figures", "11"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("has no figure 11"));
}
