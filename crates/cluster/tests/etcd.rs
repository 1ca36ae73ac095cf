//! The etcd manager against a real etcd (Debian's `etcd-server`, which .ci/run
//! installs), one per test on loopback ([`LocalEtcd`]: 1 s leases are granted as
//! asked). Without `etcd` the tests print why and pass, except under CI, where it must
//! be there.

use ambidex_cluster::manager::etcd::keys::lease_value;
use ambidex_cluster::manager::etcd::local::LocalEtcd;
use ambidex_cluster::manager::etcd::ttl_secs;
use ambidex_cluster::{
    ClusterState, Configuration, EtcdClient, EtcdManager, ManagerClient, ManagerError, Refusal,
    Stage,
};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// The test's etcd, with what the tests do to it.
struct Etcd(LocalEtcd);

impl Etcd {
    /// Starts etcd, or says why it cannot and returns `None`.
    fn start(test: &str) -> Option<Etcd> {
        LocalEtcd::start_for_test(test).map(Etcd)
    }

    fn endpoints(&self) -> [&str; 1] {
        self.0.endpoints()
    }

    /// Bootstraps `cluster`, waiting for etcd to serve.
    fn bootstrap(&self, cluster: &str, c: Configuration, lease: Duration) {
        let start = Instant::now();
        loop {
            match EtcdManager::bootstrap(&self.endpoints(), cluster, c.clone(), lease) {
                Ok(created) => {
                    assert!(created, "a new cluster");
                    return;
                }
                Err(ManagerError::Unreachable(e)) if start.elapsed() < Duration::from_secs(20) => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("bootstrap: {e}; etcd log {:?}", self.0.log()),
            }
        }
    }

    fn connect(&self, cluster: &str, node: u16, inc: u64, lease: Duration) -> EtcdClient {
        EtcdClient::connect(&self.endpoints(), cluster, node, inc, lease).unwrap()
    }

    /// Writes `key` = `value` directly (what another program could do).
    fn put_raw(&self, key: &str, value: &str) {
        self.raw(|mut c| async move { c.put(key, value, None).await.map(drop) });
    }

    fn delete_raw(&self, key: &str) {
        self.raw(|mut c| async move { c.delete(key, None).await.map(drop) });
    }

    fn raw<F: std::future::Future<Output = Result<(), etcd_client::Error>>>(
        &self,
        f: impl FnOnce(etcd_client::Client) -> F,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let c = etcd_client::Client::connect(self.endpoints(), None)
                .await
                .unwrap();
            f(c).await.unwrap();
        });
    }
}

/// Renews every client's lease.
fn renew(cs: &mut [&mut EtcdClient]) {
    for c in cs.iter_mut() {
        c.renew().unwrap();
    }
}

/// Waits (renewing `others` every 200 ms, a fifth of the lease) until `c` sees a
/// state past `revision`.
fn next_state(
    c: &mut EtcdClient,
    others: &mut [&mut EtcdClient],
    revision: u64,
    limit: Duration,
) -> ClusterState {
    let start = Instant::now();
    loop {
        c.renew().unwrap();
        renew(others);
        if let Some(s) = c.state_after(revision, Duration::from_millis(200)).unwrap() {
            return s;
        }
        assert!(start.elapsed() < limit, "no state past revision {revision}");
    }
}

/// Every client acknowledges `stage` of `s`; returns the state that follows.
fn ack_all(cs: &mut [&mut EtcdClient], s: &ClusterState) -> ClusterState {
    for c in cs.iter_mut() {
        c.ack(s.config.epoch, s.stage).unwrap();
    }
    let (first, rest) = cs.split_first_mut().unwrap();
    next_state(first, rest, s.revision, Duration::from_secs(5))
}

const LEASE: Duration = Duration::from_secs(1);

#[test]
fn a_silent_node_is_removed_the_rest_recover_and_it_rejoins_as_a_new_incarnation() {
    let Some(etcd) = Etcd::start("remove") else {
        return;
    };
    etcd.bootstrap("c", Configuration::initial(3, 3).unwrap(), LEASE);
    let mut c0 = etcd.connect("c", 0, 1, LEASE);
    let mut c1 = etcd.connect("c", 1, 1, LEASE);
    let mut c2 = etcd.connect("c", 2, 1, LEASE);
    assert_eq!(c0.ttl_secs(), ttl_secs(LEASE), "etcd grants 1 s leases");
    renew(&mut [&mut c0, &mut c1, &mut c2]);
    assert_eq!(c0.state(), c1.state());
    assert_eq!(c1.state(), c2.state());
    assert_eq!((c0.state().config.epoch, c0.state().stage), (1, Stage::Run));

    // Node 2 renews one last time and dies.
    let last_renewal = Instant::now();
    c2.renew().unwrap();
    drop(c2);
    let s = next_state(&mut c0, &mut [&mut c1], 1, Duration::from_secs(10));
    let detected = last_renewal.elapsed();
    eprintln!(
        "etcd manager: node 2's failure seen {} ms after its last renewal (lease {} ms, etcd TTL {} s)",
        detected.as_millis(),
        LEASE.as_millis(),
        c0.ttl_secs()
    );
    // Never before the node's own lease ran out (it may still serve until then), and
    // within the TTL, etcd's 500 ms scan for expired leases and a renewal period.
    assert!(detected >= LEASE, "removed after {detected:?}");
    assert!(
        detected < LEASE + Duration::from_millis(1_500),
        "removed after {detected:?}"
    );
    assert_eq!((s.config.epoch, s.stage), (2, Stage::Adopt));
    assert!(!s.config.placement.is_member(2));
    let seen_by_1 = next_state(&mut c1, &mut [&mut c0], 1, Duration::from_secs(2));
    assert_eq!(seen_by_1, s);

    let s = ack_all(&mut [&mut c0, &mut c1], &s);
    assert_eq!((s.config.epoch, s.stage), (2, Stage::Recover));
    let s = ack_all(&mut [&mut c1, &mut c0], &s);
    assert_eq!((s.config.epoch, s.stage), (2, Stage::Run));

    // The old incarnation is refused; the restarted node joins as incarnation 2.
    let mut old = etcd.connect("c", 2, 1, LEASE);
    assert!(matches!(
        old.renew(),
        Err(ManagerError::Refused(Refusal::NotMember { node: 2, .. }))
    ));
    let mut c2 = etcd.connect("c", 2, 2, LEASE);
    assert!(matches!(
        old.join(),
        Err(ManagerError::Refused(Refusal::StaleIncarnation { .. }))
    ));
    c2.join().unwrap();
    let s = next_state(&mut c0, &mut [&mut c1], s.revision, Duration::from_secs(5));
    assert_eq!((s.config.epoch, s.stage), (3, Stage::Adopt));
    assert_eq!(s.config.incarnations, vec![1, 1, 2]);
    assert!(s.config.placement.is_member(2));
    let s = ack_all(&mut [&mut c0, &mut c1, &mut c2], &s);
    let s = ack_all(&mut [&mut c0, &mut c1, &mut c2], &s);
    assert_eq!((s.config.epoch, s.stage), (3, Stage::Run));
    let g = c2.renew().unwrap();
    assert_eq!((g.epoch, g.revision), (3, s.revision));

    // Its copies, once synced, are published in the state.
    let syncing: Vec<u32> = s.config.placement.syncing().map(|(p, _)| p).collect();
    assert!(!syncing.is_empty());
    c2.synced(&syncing).unwrap();
    let s = next_state(
        &mut c0,
        &mut [&mut c1, &mut c2],
        s.revision,
        Duration::from_secs(5),
    );
    assert_eq!(s.config.placement.syncing().count(), 0);
    assert_eq!(s.config.epoch, 3);

    // Each change was published by one node; together they tell the whole story.
    use ambidex_cluster::membership::EventKind as K;
    let events: Vec<_> = [&c0, &c1, &c2]
        .iter()
        .flat_map(|c| c.events().iter().map(|e| (e.epoch, e.what.clone())))
        .collect();
    let removal = [
        (1, K::LeaseExpired { nodes: 0b100 }),
        (
            2,
            K::Reconfigured {
                removed: 0b100,
                joined: 0,
            },
        ),
    ];
    // Whichever node won each change, each was published once.
    let count = |k: &K| events.iter().filter(|(_, w)| w == k).count();
    for e in &removal {
        assert_eq!(count(&e.1), 1, "{e:?} in {events:?}");
        assert!(events.contains(e), "{e:?} in {events:?}");
    }
    assert_eq!((count(&K::Adopted), count(&K::Recovered)), (2, 2));
    // Two members hold every copy they can once epoch 2 runs; epoch 3's joiner syncs.
    let rereplicated: Vec<u32> = events
        .iter()
        .filter(|(_, w)| *w == K::Rereplicated)
        .map(|(e, _)| *e)
        .collect();
    assert_eq!(rereplicated, vec![2, 3]);
}

#[test]
fn a_majority_suspicion_revokes_the_lease_and_removal_waits_for_it() {
    let Some(etcd) = Etcd::start("suspect") else {
        return;
    };
    etcd.bootstrap("s", Configuration::initial(3, 3).unwrap(), LEASE);
    let mut c: Vec<EtcdClient> = (0..3).map(|n| etcd.connect("s", n, 1, LEASE)).collect();
    for x in &mut c {
        x.renew().unwrap();
    }
    c[0].suspect(2).unwrap();
    c[2].renew().expect("one of two others is not a majority");
    let suspected_at = Instant::now();
    c[1].suspect(2).unwrap();
    // Node 2 still renews: once its key outlived a lease and etcd's expiry sweep since
    // the majority, a member revokes it at its next renewal (a dead node's key would be
    // gone by then, and its removal not delayed by a revocation).
    c[2].renew().expect("not revoked before a lease passed");
    let revoked_at = loop {
        std::thread::sleep(LEASE / 5);
        c[0].renew().unwrap();
        c[1].renew().unwrap();
        match c[2].renew() {
            Ok(_) => assert!(
                suspected_at.elapsed() < Duration::from_secs(10),
                "never revoked"
            ),
            Err(ManagerError::Refused(Refusal::Revoked { node: 2 })) => break Instant::now(),
            Err(e) => panic!("{e}"),
        }
    };
    let waited = revoked_at - suspected_at;
    assert!(waited >= LEASE, "revoked {waited:?} after the majority");
    let [c0, c1, _] = &mut c[..] else {
        unreachable!()
    };
    let s = next_state(c0, &mut [c1], 1, Duration::from_secs(10));
    let after = revoked_at.elapsed();
    eprintln!(
        "etcd manager: a live node revoked {} ms after a majority suspected it, removed {} ms after that",
        waited.as_millis(),
        after.as_millis()
    );
    assert!(after >= LEASE, "removed {after:?} after the revocation");
    assert!(!s.config.placement.is_member(2));
}

#[test]
fn racing_publications_make_exactly_one_new_epoch() {
    let Some(etcd) = Etcd::start("race") else {
        return;
    };
    // Long leases: nothing expires during the test.
    let lease = Duration::from_secs(10);
    etcd.bootstrap("r", Configuration::initial(3, 3).unwrap(), lease);
    let mut a = etcd.connect("r", 0, 1, lease);
    let mut b = etcd.connect("r", 1, 1, lease);
    // Node 2 restarted (as another program would write it): both decide to remove its
    // old incarnation, on the same state.
    etcd.put_raw("/ambidex/r/lease/2", &lease_value(2, false));
    etcd.put_raw("/ambidex/r/join/2", "2");
    let pa = a.decide().unwrap().expect("a decision");
    let pb = b.decide().unwrap().expect("a decision");
    let pb_late = pb.clone();
    assert_eq!(pa.state(), pb.state());
    assert_eq!(pa.state().config.epoch, 2);
    let gate = Arc::new(Barrier::new(2));
    let race = |mut c: EtcdClient, p, gate: Arc<Barrier>| {
        std::thread::spawn(move || {
            gate.wait();
            let won = c.publish(p).unwrap();
            (won, c)
        })
    };
    let ta = race(a, pa, gate.clone());
    let tb = race(b, pb, gate);
    let (wa, mut a) = ta.join().unwrap();
    let (wb, mut b) = tb.join().unwrap();
    assert!(wa ^ wb, "exactly one publication wins (a {wa}, b {wb})");
    let s = a.state_after(1, Duration::from_secs(2)).unwrap().unwrap();
    assert_eq!((s.config.epoch, s.revision, s.stage), (2, 2, Stage::Adopt));
    // A decision published late never overwrites the newer state.
    assert!(!b.publish(pb_late).unwrap());
    assert_eq!(
        b.state_after(1, Duration::from_secs(1)).unwrap(),
        Some(s.clone())
    );
    let next = a.decide().unwrap();
    assert!(next.is_none(), "nothing more is due: {next:?}");
}

#[test]
fn malformed_keys_in_etcd_are_protocol_errors() {
    let Some(etcd) = Etcd::start("malformed") else {
        return;
    };
    let lease = Duration::from_secs(10);
    etcd.bootstrap("other", Configuration::initial(1, 1).unwrap(), lease);
    let r = EtcdClient::connect(&etcd.endpoints(), "m", 0, 1, lease).map(|_| ());
    assert!(
        matches!(r, Err(ManagerError::Protocol(_))),
        "not bootstrapped: {r:?}"
    );
    etcd.bootstrap("m", Configuration::initial(3, 3).unwrap(), lease);
    let mut c = etcd.connect("m", 0, 1, lease);
    c.renew().unwrap();
    etcd.put_raw("/ambidex/m/lease/99", "1");
    let r = c.renew();
    assert!(matches!(r, Err(ManagerError::Protocol(_))), "{r:?}");
    etcd.delete_raw("/ambidex/m/lease/99");
    c.renew().unwrap();
    etcd.put_raw("/ambidex/m/state", "{\"state\": \"nonsense\"}");
    let r = c.state_after(1, Duration::from_millis(500));
    assert!(matches!(r, Err(ManagerError::Protocol(_))), "{r:?}");
}

#[test]
fn state_after_waits_on_a_watch_that_outlives_the_call_timeout() {
    let Some(etcd) = Etcd::start("watch") else {
        return;
    };
    let lease = Duration::from_secs(10);
    etcd.bootstrap("w", Configuration::initial(3, 3).unwrap(), lease);
    let mut a = etcd.connect("w", 0, 1, lease);
    let waiter = std::thread::spawn(move || {
        let start = Instant::now();
        let s = a.state_after(1, Duration::from_secs(6)).unwrap();
        (s, start.elapsed(), a)
    });
    std::thread::sleep(Duration::from_millis(2_500));
    let put_at = Instant::now();
    etcd.put_raw("/ambidex/w/lease/2", &lease_value(2, false));
    etcd.put_raw("/ambidex/w/join/2", "2");
    let (s, waited, a) = waiter.join().unwrap();
    let s = s.expect("the change is seen");
    eprintln!(
        "etcd manager: a change seen {} ms after it was written, by a call waiting {} ms",
        put_at.elapsed().as_millis(),
        waited.as_millis()
    );
    assert_eq!((s.config.epoch, s.stage), (2, Stage::Adopt));
    assert!(waited >= Duration::from_millis(2_500), "{waited:?}");
    assert!(put_at.elapsed() < Duration::from_secs(1));
    assert_eq!(a.watch_restarts(), 0, "the watch lasted");
}
