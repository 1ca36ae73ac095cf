//! A node of a shared-memory cluster running the conformance peer agent, as its own
//! process: `shm-peer DIR NODE [--die-with-parent]`.

use ambidex_transport::conformance::run_peer;
use ambidex_transport_shm::ShmNode;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(dir), Some(node)) = (args.first(), args.get(1).and_then(|n| n.parse().ok())) else {
        eprintln!("usage: shm-peer DIR NODE [--die-with-parent]");
        std::process::exit(2);
    };
    if args.iter().any(|a| a == "--die-with-parent") {
        // Tests spawn peers: a crashed test must not leave them running.
        // SAFETY: prctl with constant arguments.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
        // The parent may have died before prctl took effect.
        // SAFETY: getppid has no preconditions.
        if unsafe { libc::getppid() } == 1 {
            std::process::exit(1);
        }
    }
    let node = match ShmNode::open(&PathBuf::from(dir), node) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("shm-peer: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = run_peer(node, Arc::new(AtomicBool::new(false))) {
        eprintln!("shm-peer: {e}");
        std::process::exit(1);
    }
}
