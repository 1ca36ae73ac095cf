//! The conformance suite across two network namespaces joined by a veth pair: node 0
//! (this process, via setns on the thread that opens its sockets) in one, nodes 1 and 2
//! (`ip netns exec NS udp-peer`) in the other. Needs root and iproute2; skipped
//! otherwise. Every namespace (and with it the veth pair) is deleted on drop, even when
//! a check fails. No traffic leaves the namespaces created here.

mod common;

use ambidex_transport::conformance;
use common::{test_config, UdpFixture};
use std::net::IpAddr;
use std::process::{Command, Stdio};

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Two namespaces joined by a veth pair; deleted on drop.
struct Netns {
    names: Vec<String>,
    subnet: u8,
}

impl Netns {
    fn create() -> Result<Netns, String> {
        let pid = std::process::id();
        let a = format!("ambx-udp-{pid}-a");
        let b = format!("ambx-udp-{pid}-b");
        let subnet = (pid % 250) as u8 + 1;
        let mut ns = Netns {
            names: Vec::new(),
            subnet,
        };
        for n in [&a, &b] {
            ip(&["netns", "add", n])?;
            ns.names.push(n.clone());
        }
        // Both ends are created directly inside the namespaces: the host's network is
        // never touched.
        let (va, vb) = (
            format!("axa{}", pid % 100_000),
            format!("axb{}", pid % 100_000),
        );
        ip(&[
            "link", "add", &va, "netns", &a, "type", "veth", "peer", "name", &vb, "netns", &b,
        ])?;
        for (n, dev, host) in [(&a, &va, 1), (&b, &vb, 2)] {
            ip(&[
                "-n",
                n,
                "addr",
                "add",
                &format!("10.213.{subnet}.{host}/24"),
                "dev",
                dev,
            ])?;
            ip(&["-n", n, "link", "set", dev, "up"])?;
            ip(&["-n", n, "link", "set", "lo", "up"])?;
        }
        Ok(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.names {
            if let Err(e) = ip(&["netns", "del", n]) {
                eprintln!("netns cleanup: {e}");
            }
        }
    }
}

#[test]
fn conformance_across_namespaces() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("netns: skipped, not running as root");
        return;
    }
    if Command::new("ip").arg("-V").output().is_err() {
        eprintln!("netns: skipped, iproute2 (`ip`) is not installed");
        return;
    }
    let ns = match Netns::create() {
        Ok(ns) => ns,
        Err(e) => {
            eprintln!("netns: skipped, cannot create namespaces: {e}");
            return;
        }
    };
    let subnet = ns.subnet;
    let peer_prefix: Vec<Vec<String>> = (0..3)
        .map(|_| {
            vec![
                "ip".into(),
                "netns".into(),
                "exec".into(),
                ns.names[1].clone(),
            ]
        })
        .collect();
    let fixture = || {
        UdpFixture::start(
            test_config(),
            Some(ns.names[0].clone()),
            &peer_prefix,
            |n| IpAddr::from([10, 213, subnet, if n == 0 { 1 } else { 2 }]),
            &[],
        )
    };
    type Check = fn(&dyn conformance::Fixture);
    let checks: [(&str, Check); 11] = [
        ("datagram_echo", conformance::datagram_echo),
        ("datagram_batch", conformance::datagram_batch),
        (
            "datagram_all_endpoints",
            conformance::datagram_all_endpoints,
        ),
        ("datagram_errors", conformance::datagram_errors),
        (
            "receive_queue_overflow",
            conformance::receive_queue_overflow,
        ),
        ("epoch_mismatch", conformance::epoch_mismatch),
        ("onesided_read_write", conformance::onesided_read_write),
        ("onesided_in_order", conformance::onesided_in_order),
        ("onesided_errors", conformance::onesided_errors),
        ("onesided_atomics", conformance::onesided_atomics),
        ("malformed_input", conformance::malformed_input),
    ];
    for (name, check) in checks {
        let f = fixture();
        eprintln!("netns: {name}");
        check(&f);
    }
    drop(ns);
}
