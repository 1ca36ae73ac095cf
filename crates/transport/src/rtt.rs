//! A retransmission timeout derived from measured round trips, as TCP computes it
//! (RFC 6298, after Jacobson and Karels) and eRPC keeps one per session: a smoothed round
//! trip (SRTT) and its mean deviation (RTTVAR), RTO = SRTT + 4·RTTVAR within
//! [`RttEstimator::new`]'s bounds, doubled on every timeout and reset by the next sample.
//!
//! The callers keep Karn's rule: a request that was retransmitted gives no sample (its
//! response may answer either copy). All times are nanoseconds of a [`Clock`](crate::Clock)
//! the caller reads, so a simulator's runs stay deterministic. Integer arithmetic only:
//! the gains 1/8 and 1/4 are shifts.

use std::time::Duration;

/// Default floor of the retransmission timeout (the RPC runtime's and the udp backend's).
/// Round trips are tens of µs, but with 3 nodes on 2 cores a descheduled peer answers
/// after 1–6 ms, so a timeout near the measured round trip mostly retransmits for
/// nothing. Measured on the namespace test (`crates/cli/tests/netns_faults.rs`,
/// SmallBank, 3 s per run) by floor: loss-free runs retransmitted 934 and 9,450 times
/// with 0.3 ms (the latter while another build ran), 113–399 with 0.5 ms, 72–201 with
/// 1 ms, ~480 with 2 ms (loaded) and 0–15 with 5 ms; at 1% loss SmallBank committed
/// 82–84k/s with 0.5 ms against 68–69k/s with 1 ms, 36k/s with 2 ms (busier) and
/// 29k/s with 5 ms (about 100k/s without loss). 0.5 ms buys most of the recovery for
/// ~0.1% spurious retransmissions.
pub const DEFAULT_RTO_MIN: Duration = Duration::from_micros(500);

/// One destination's round-trip estimate and retransmission timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RttEstimator {
    /// Smoothed round trip (ns); meaningless until `sampled`.
    srtt: u64,
    /// Mean deviation of the round trip (ns).
    rttvar: u64,
    sampled: bool,
    /// SRTT + 4·RTTVAR within the bounds (the timeout without backoff).
    base: u64,
    /// The timeout in effect: `base` doubled once per timeout since the last sample.
    rto: u64,
    /// Timeouts since the last sample.
    backoffs: u32,
    min: u64,
    max: u64,
}

impl RttEstimator {
    /// An estimator without samples: its timeout is `initial` until the first sample.
    /// Every timeout stays within `min..=max` (`max` is raised to `min` if below it).
    pub fn new(initial: u64, min: u64, max: u64) -> RttEstimator {
        let max = max.max(min);
        let rto = initial.clamp(min, max);
        RttEstimator {
            srtt: 0,
            rttvar: 0,
            sampled: false,
            base: rto,
            rto,
            backoffs: 0,
            min,
            max,
        }
    }

    /// The retransmission timeout in effect (ns).
    #[inline(always)]
    pub fn rto(&self) -> u64 {
        self.rto
    }

    /// The smoothed round trip (ns), once there is a sample.
    pub fn srtt(&self) -> Option<u64> {
        self.sampled.then_some(self.srtt)
    }

    /// The round trip's mean deviation (ns), once there is a sample.
    pub fn rttvar(&self) -> Option<u64> {
        self.sampled.then_some(self.rttvar)
    }

    /// Timeouts since the last sample.
    pub fn backoffs(&self) -> u32 {
        self.backoffs
    }

    /// Takes the round trip `rtt` (ns) of a request sent once (Karn's rule is the
    /// caller's) and ends any backoff (RFC 6298 §2.2–2.3, §5.7).
    #[inline]
    pub fn sample(&mut self, rtt: u64) {
        if self.sampled {
            let err = self.srtt.abs_diff(rtt);
            self.rttvar = self.rttvar - self.rttvar / 4 + err / 4;
            self.srtt = self.srtt - self.srtt / 8 + rtt / 8;
        } else {
            self.srtt = rtt;
            self.rttvar = rtt / 2;
            self.sampled = true;
        }
        self.base = self
            .srtt
            .saturating_add(self.rttvar.saturating_mul(4))
            .clamp(self.min, self.max);
        self.rto = self.base;
        self.backoffs = 0;
    }

    /// A timeout expired: doubles the timeout up to the bound (RFC 6298 §5.5), so a
    /// destination that stopped answering is probed ever less often.
    #[inline]
    pub fn back_off(&mut self) {
        self.backoffs = self.backoffs.saturating_add(1);
        self.rto = self.rto.saturating_mul(2).min(self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;
    const MS: u64 = 1_000_000;

    #[test]
    fn the_first_sample_sets_srtt_and_half_of_it_as_variance() {
        let mut e = RttEstimator::new(5 * MS, 0, 100 * MS);
        assert_eq!((e.rto(), e.srtt()), (5 * MS, None));
        e.sample(100 * US);
        assert_eq!(e.srtt(), Some(100 * US));
        assert_eq!(e.rttvar(), Some(50 * US));
        assert_eq!(e.rto(), 300 * US, "SRTT + 4 * RTTVAR");
    }

    #[test]
    fn converges_to_a_steady_round_trip() {
        let mut e = RttEstimator::new(5 * MS, 10 * US, 100 * MS);
        e.sample(2 * MS); // an outlier first
        for _ in 0..200 {
            e.sample(40 * US);
        }
        let srtt = e.srtt().unwrap();
        assert!(srtt.abs_diff(40 * US) <= US / 10, "srtt {srtt}");
        assert!(e.rttvar().unwrap() <= US / 10, "{e:?}");
        assert!(e.rto().abs_diff(40 * US) <= US, "rto {}", e.rto());
    }

    #[test]
    fn variance_widens_the_timeout() {
        let mut e = RttEstimator::new(5 * MS, 0, 100 * MS);
        for i in 0..100 {
            e.sample(if i % 2 == 0 { 20 * US } else { 220 * US });
        }
        // SRTT near 120 us, RTTVAR near 100 us: a timeout beyond the slow samples.
        assert!(e.rto() > 400 * US && e.rto() < 600 * US, "{e:?}");
    }

    #[test]
    fn backoff_doubles_up_to_the_bound_and_a_sample_resets_it() {
        let mut e = RttEstimator::new(MS, MS, 10 * MS);
        e.back_off();
        assert_eq!(e.rto(), 2 * MS);
        e.back_off();
        assert_eq!(e.rto(), 4 * MS);
        e.back_off();
        e.back_off();
        assert_eq!(e.rto(), 10 * MS, "capped");
        assert_eq!(e.backoffs(), 4);
        e.sample(100 * US);
        assert_eq!(
            (e.rto(), e.backoffs()),
            (MS, 0),
            "clamped to min, backoff gone"
        );
    }

    #[test]
    fn clamps_to_the_bounds() {
        let mut e = RttEstimator::new(0, 500 * US, 2 * MS);
        assert_eq!(e.rto(), 500 * US, "initial below min");
        e.sample(US);
        assert_eq!(e.rto(), 500 * US);
        e.sample(50 * MS);
        assert_eq!(e.rto(), 2 * MS);
        let e = RttEstimator::new(u64::MAX, 3, 1);
        assert_eq!(e.rto(), 3, "max raised to min");
        let mut e = RttEstimator::new(MS, 0, u64::MAX);
        e.sample(u64::MAX);
        e.sample(u64::MAX);
        assert_eq!(e.rto(), u64::MAX, "saturates, never wraps");
    }
}
