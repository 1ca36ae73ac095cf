//! Instruction cost of one-sided operations on the shm backend, for `valgrind --tool=callgrind`
//! (deterministic, unlike timings on a shared machine): one process opens nodes 0 and 1 of
//! a fresh cluster and node 0's endpoint posts `N` operations to a region of node 1, in
//! batches of `BATCH` (the last one signaled), polling the completion queue after each.
//!
//! `cargo build --release -p ambidex-transport-shm --example shm_onesided_cost`
//! `valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/examples/shm_onesided_cost N BATCH VERB`
//! with VERB one of `read`, `write`, `cas`. The per-operation cost is the difference of
//! two runs with different `N`, divided by the difference of `N`.

use ambidex_transport::{ClusterConfig, LocalBuf, OneSidedKind, OneSidedOp, Perms};
use ambidex_transport_shm::{ShmCluster, ShmNode};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let batch: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1);
    let verb = args.get(3).cloned().unwrap_or_else(|| "read".into());
    let dir = std::env::temp_dir().join(format!("ambidex-cost-{}", std::process::id()));
    let config = ClusterConfig::new(2, 1);
    ShmCluster::create(&dir, &config).unwrap();
    {
        let n0 = ShmNode::open(&dir, 0).unwrap();
        let n1 = ShmNode::open(&dir, 1).unwrap();
        let target = n1.register(1 << 16, Perms::ALL).unwrap();
        let scratch = n0.register(1 << 16, Perms::ALL).unwrap();
        let mut ep = n0.endpoint(0).unwrap();
        let data = [7u8; 8];
        let mut out = Vec::new();
        let mut done = 0;
        while done < n {
            let k = batch.min(n - done);
            let ops: Vec<OneSidedOp> = (0..k)
                .map(|i| OneSidedOp {
                    wr_id: (done + i) as u64,
                    remote: target.desc.at(64 * i as u64),
                    kind: match verb.as_str() {
                        "write" => OneSidedKind::Write { data: &data },
                        "cas" => OneSidedKind::Cas {
                            expected: 0,
                            new: 0,
                        },
                        _ => OneSidedKind::Read {
                            len: 32,
                            dest: LocalBuf {
                                region: scratch.desc.id,
                                offset: 64 * i as u64,
                            },
                        },
                    },
                    signaled: i + 1 == k,
                })
                .collect();
            ep.post(&ops).unwrap();
            out.clear();
            ep.poll_cq(16, &mut out);
            assert_eq!(out.len(), 1);
            assert_eq!(out[0].status, Ok(()));
            done += k;
        }
    }
    let _ = ShmCluster::remove(&dir);
}
