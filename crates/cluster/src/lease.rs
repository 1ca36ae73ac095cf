//! A node's side of its lease (FaRM SOSP'15 §4: renewed at a fifth of the lease, so a
//! few lost or late renewals do not lose it). The node counts its lease from when it
//! *sent* the renewal the manager granted, which is before the manager counted it, so
//! the node stops serving no later than the manager may remove it (on one host both
//! read the same clock; across hosts this assumes a bound on clock drift, as FaRM
//! does).

/// How long a member has, from when a real-time manager starts, to get its first
/// renewal granted (at least a lease). Starting node processes on a loaded machine can
/// take longer than a short lease; a node serves only once granted, so this grace
/// costs nothing but a slower removal of a node that never started.
pub const FIRST_GRANT_WITHIN_NS: u64 = 1_000_000_000;

/// The lease state of one node.
#[derive(Clone, Debug)]
pub struct LeaseKeeper {
    lease_ns: u64,
    valid_until: u64,
    next_renewal: u64,
}

impl LeaseKeeper {
    /// A node that holds no lease yet (it renews at once).
    pub fn new(lease_ns: u64) -> LeaseKeeper {
        LeaseKeeper {
            lease_ns,
            valid_until: 0,
            next_renewal: 0,
        }
    }

    pub fn lease_ns(&self) -> u64 {
        self.lease_ns
    }

    /// How often a renewal is sent: a fifth of the lease.
    pub fn period_ns(&self) -> u64 {
        (self.lease_ns / 5).max(1)
    }

    /// Whether a renewal is due at `now`.
    pub fn due(&self, now: u64) -> bool {
        now >= self.next_renewal
    }

    /// A renewal is being sent at `now` (returns the time to hand back to
    /// [`LeaseKeeper::granted`]).
    pub fn sending(&mut self, now: u64) -> u64 {
        self.next_renewal = now + self.period_ns();
        now
    }

    /// The renewal sent at `sent_at` was granted.
    pub fn granted(&mut self, sent_at: u64) {
        self.valid_until = self.valid_until.max(sent_at + self.lease_ns);
    }

    /// The manager refused: the lease is void now.
    pub fn revoked(&mut self) {
        self.valid_until = 0;
    }

    /// Whether this node may serve at `now`.
    pub fn valid(&self, now: u64) -> bool {
        now < self.valid_until
    }

    /// When the lease runs out (node time).
    pub fn valid_until(&self) -> u64 {
        self.valid_until
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_counts_from_the_renewal_sent() {
        let mut l = LeaseKeeper::new(10_000);
        assert!(!l.valid(0) && l.due(0));
        let t = l.sending(100);
        assert!(!l.due(1_000) && l.due(2_100));
        l.granted(t);
        assert!(l.valid(10_099) && !l.valid(10_100));
        // A late answer to an older renewal never shortens it.
        l.granted(50);
        assert_eq!(l.valid_until(), 10_100);
        l.revoked();
        assert!(!l.valid(200));
    }
}
