//! Issue 18: a second failure after a kill, of a node that is alive. Five shm node
//! processes of SmallBank (R = 3, 20 ms leases): node 2 is killed, and soon after the
//! test stops node 3 (SIGSTOP) for 150 ms, as an overloaded host deschedules a process.
//! Its lease runs out, the manager removes it, and the three members left must hold
//! every copy between them. Checked: exit 0, both removals in the manager's events,
//! every account present at a primary, replicas equal to their primaries, no table
//! out of room (the nodes' checks fail otherwise), and the removed node's workers ended
//! at their first `fenced` abort.
//!
//! Before the tables were sized for R − 1 failures (they were for one), the survivors'
//! tables filled during the second re-replication: backups refused committed writes,
//! their primaries kept those writes' locks for ever, and the check found accounts
//! missing (and, under TATP, a backup with rows its primary hid behind locks).

mod common;

use common::Launched;
use std::time::Duration;

/// One cluster of node processes at a time (see survival.rs).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_live_node_stalled_past_its_lease_after_a_kill_is_removed_and_nothing_is_lost() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut run = Launched::bench_shm(
        "smallbank",
        &[
            "--nodes",
            "5",
            "--lease-ms",
            "20",
            "--duration",
            "2.5",
            "--kill",
            "2@0.6",
        ],
    );
    let pids = run.until_running();
    let stalled = pids
        .iter()
        .find(|&&(n, _)| n == 3)
        .map(|&(_, p)| p)
        .unwrap_or_else(|| panic!("no pid of node 3: {pids:?}"));
    run.until("node 2's death", |l| {
        l.contains("node 2") && l.contains("killed by signal")
    });
    std::thread::sleep(Duration::from_millis(50));
    // SAFETY: kill(2) of the node process the launcher reported as node 3's.
    assert_eq!(unsafe { libc::kill(stalled, libc::SIGSTOP) }, 0);
    std::thread::sleep(Duration::from_millis(150));
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(stalled, libc::SIGCONT) }, 0);
    let (ok, r, stderr) = run.finish();
    let removed: Vec<u64> = r["manager_events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["what"]["reconfigured"]["removed"].as_u64())
        .collect();
    eprintln!(
        "removed {removed:?}, invariant {}, check {}",
        r["invariant_ok"], r["check"]
    );
    assert!(
        removed.iter().any(|m| m & (1 << 2) != 0),
        "node 2 removed: {removed:?}\n{stderr}"
    );
    assert!(
        removed.iter().any(|m| m & (1 << 3) != 0),
        "node 3, stalled past its lease, removed: {removed:?}\n{stderr}"
    );
    assert!(ok, "exit 0: {}\n{stderr}", r["check"]);
    // Every account at a primary and every copy equal to its primary (the balance is
    // not summed: the dead node's committed deltas died with it).
    let check = &r["check"];
    assert!(check.get("violation").is_none(), "{check}");
    assert!(
        check["replica_rows_compared"].as_u64().unwrap() > 0,
        "{check}"
    );
    assert!(r["committed"].as_u64().unwrap() > 0);
    // The removed node's workers ended at their first `fenced` abort (one each), rather
    // than abort at once for the rest of the run.
    let fenced = r["aborts_by_reason"]["fenced"].as_u64().unwrap_or(0);
    let workers = r["coroutines"].as_u64().unwrap() * r["threads_per_node"].as_u64().unwrap();
    assert!(
        fenced <= workers,
        "{fenced} fenced aborts, {workers} workers a node"
    );
    assert_eq!(r["stuck_workers"], 0);
}

/// The launcher, which hosts the embedded manager, is stopped for 150 ms right after a
/// kill (its host starved it). When it runs again it has heard no renewal for 7
/// leases: it must not take that for the members' silence, and the members must not
/// give up on it. Checked: exit 0, only the killed node removed, no `failed` event, and
/// the checks pass. Before the stall rule and the agents' patience, such runs removed
/// live members or failed the cluster ("no member is left"), or ended stuck in stage
/// Adopt (members had fenced themselves when a call to the stopped manager timed out).
#[test]
fn a_stalled_manager_removes_no_live_member() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut run = Launched::bench_shm(
        "smallbank",
        &["--lease-ms", "20", "--duration", "2", "--kill", "2@0.6"],
    );
    run.until_running();
    run.until("node 2's death", |l| {
        l.contains("node 2") && l.contains("killed by signal")
    });
    std::thread::sleep(Duration::from_millis(5));
    let launcher = run.child.id() as i32;
    // SAFETY: kill(2) of the launcher this test started.
    assert_eq!(unsafe { libc::kill(launcher, libc::SIGSTOP) }, 0);
    std::thread::sleep(Duration::from_millis(150));
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(launcher, libc::SIGCONT) }, 0);
    let (ok, r, stderr) = run.finish();
    let events = &r["manager_events"];
    eprintln!("events {events}");
    let removed: Vec<u64> = events
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["what"]["reconfigured"]["removed"].as_u64())
        .collect();
    assert_eq!(
        removed,
        vec![1 << 2],
        "only node 2 removed: {events}\n{stderr}"
    );
    assert!(
        !events.to_string().contains("failed"),
        "no failure: {events}"
    );
    assert!(ok, "exit 0: {}\n{stderr}", r["check"]);
    let check = &r["check"];
    assert!(check.get("violation").is_none(), "{check}");
}
