//! A peer process SIGKILLed in the middle of a stream of sends must not disturb anyone:
//! the datagrams it published arrive whole, the driver and the other peer keep working,
//! and a new process for the killed node works again.

mod common;

use ambidex_transport::conformance::{completions, drain, peer_regions, recv_n};
use ambidex_transport::{
    AccessError, Datagram, Endpoint, EndpointAddr, LocalBuf, OneSidedKind, OneSidedOp, Perms,
    RegionDesc,
};
use common::ShmFixture;
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(10);

/// The peer agent's commands (see ambidex_transport::conformance).
const CMD_ECHO: u8 = b'E';
const CMD_FLOOD: u8 = b'F';

fn flood_cmd(n: u32, size: u32) -> Vec<u8> {
    let mut cmd = vec![CMD_FLOOD];
    cmd.extend_from_slice(&n.to_le_bytes());
    cmd.extend_from_slice(&size.to_le_bytes());
    cmd
}

/// Echo round trip through `peer`, retried (a freshly started process may still be
/// opening its node).
fn echo(ep: &mut dyn Endpoint, peer: EndpointAddr, tag: u8) {
    let msg = [CMD_ECHO, tag, 1, 2, 3];
    for _ in 0..5 {
        ep.send(&[Datagram {
            dst: peer,
            payload: &msg,
        }])
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            let mut ok = false;
            ep.poll_recv(64, &mut |s, p| {
                assert!(p.first() == Some(&CMD_ECHO), "garbage delivered: {p:?}");
                ok |= s == peer && p == msg;
            });
            if ok {
                return;
            }
            ep.wait(Duration::from_millis(1));
        }
    }
    panic!("no echo from {peer}");
}

/// WRITE then READ back 32 bytes of `remote` (must succeed).
fn write_read(ep: &mut dyn Endpoint, remote: &RegionDesc, scratch: u32, seed: u8) {
    let data: Vec<u8> = (0..32u8).map(|i| i ^ seed).collect();
    ep.post(&[
        OneSidedOp {
            wr_id: 1,
            remote: remote.at(64),
            kind: OneSidedKind::Write { data: &data },
            signaled: false,
        },
        OneSidedOp {
            wr_id: 2,
            remote: remote.at(64),
            kind: OneSidedKind::Read {
                len: 32,
                dest: LocalBuf {
                    region: scratch,
                    offset: 0,
                },
            },
            signaled: true,
        },
    ])
    .unwrap();
    let c = completions(ep, 1);
    assert_eq!((c[0].wr_id, c[0].status), (2, Ok(())));
}

fn read_status(
    ep: &mut dyn Endpoint,
    remote: &RegionDesc,
    scratch: u32,
) -> Result<(), AccessError> {
    ep.post(&[OneSidedOp {
        wr_id: 9,
        remote: remote.at(0),
        kind: OneSidedKind::Read {
            len: 8,
            dest: LocalBuf {
                region: scratch,
                offset: 0,
            },
        },
        signaled: true,
    }])
    .unwrap();
    completions(ep, 1)[0].status
}

#[test]
fn sigkill_mid_send_leaves_others_working() {
    let mut f = ShmFixture::new();
    let node = f.driver.clone();
    let mut ep0 = node.endpoint(0).unwrap();
    let mut ep1 = node.endpoint(1).unwrap();
    let scratch = node.register(4096, Perms::ALL).unwrap();
    let flooder = EndpointAddr::new(1, 0);
    let survivor = EndpointAddr::new(2, 0);
    let r2 = peer_regions(&mut *ep0, 2)[0];
    let mut r1 = peer_regions(&mut *ep0, 1)[0];
    for round in 0..3u32 {
        // Node 1 floods endpoint 0.1 (far more than it can send before being killed).
        let size = 24 + 40 * round as usize;
        ep1.send(&[Datagram {
            dst: flooder,
            payload: &flood_cmd(50_000_000, size as u32),
        }])
        .unwrap();
        let want = vec![b'f'; size];
        let check = |s: EndpointAddr, p: &[u8]| {
            assert_eq!(s, flooder, "datagram from an unexpected source");
            assert!(p == want.as_slice(), "garbage delivered: {} bytes", p.len());
        };
        // Keep the ring draining so the flooder is pushing records, not counting drops,
        // when it dies.
        let mut got = 0;
        let deadline = Instant::now() + LONG;
        while got < 3000 + 1000 * round as usize {
            assert!(Instant::now() < deadline, "flood did not arrive");
            got += ep1.poll_recv(256, &mut |s, p| check(s, p));
        }
        f.kill(1);
        // What it published before dying arrives whole.
        let late = drain(&mut *ep1, Duration::from_millis(100));
        for (s, p) in &late {
            check(*s, p);
        }

        // Everyone else keeps working: datagrams and one-sided operations to node 2, and
        // between the driver's own endpoints.
        echo(&mut *ep0, survivor, round as u8);
        write_read(&mut *ep0, &r2, scratch.id(), round as u8);
        ep0.send(&[Datagram {
            dst: ep1.addr(),
            payload: &[CMD_ECHO, 7],
        }])
        .unwrap();
        let own = recv_n(&mut *ep1, 1, LONG);
        assert_eq!(own, vec![(ep0.addr(), vec![CMD_ECHO, 7])]);

        // A new process for node 1 works again; the dead process's regions are gone.
        f.restart(1);
        echo(&mut *ep0, flooder, 100 + round as u8);
        let fresh = peer_regions(&mut *ep0, 1)[0];
        // Its ids are reused with fresh keys, so a stale descriptor fails on its key.
        let stale = read_status(&mut *ep0, &r1, scratch.id());
        assert!(
            matches!(stale, Err(AccessError::BadKey | AccessError::UnknownRegion)),
            "a region of the killed process still answers: {stale:?}"
        );
        write_read(&mut *ep0, &fresh, scratch.id(), 50 + round as u8);
        r1 = fresh;
    }
    // The endpoint that received the floods still receives.
    echo(&mut *ep1, survivor, 200);
    assert_eq!(ep1.counters().get("rx_dropped_corrupt_ring"), 0);
}
