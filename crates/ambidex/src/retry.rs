//! How transactions that abort for a transient reason (a conflict, a timeout, a
//! reconfiguration) are tried again: the same policy for the application API's
//! `Node::run` and the benchmark driver's workers.

use rand::rngs::SmallRng;
use rand::Rng;
use std::time::Duration;

/// Attempts of one transaction at most by default: the first and 99 retries. A
/// transaction that keeps meeting a lock that is not released (one held for a failed
/// coordinator until recovery decides it) is given up then, not tried for ever.
pub const MAX_ATTEMPTS: u32 = 100;

/// How a transaction is retried: up to `max_attempts` attempts, waiting before each
/// retry a random time in the upper half of a window that doubles from `min_backoff` to
/// `max_backoff` (randomized so that two transactions that met do not meet again at
/// their retries).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts at most (1: never retried).
    pub max_attempts: u32,
    /// The first retry's window.
    pub min_backoff: Duration,
    /// The largest window.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            max_attempts: MAX_ATTEMPTS,
            min_backoff: Duration::from_micros(16),
            max_backoff: Duration::from_millis(4),
        }
    }
}

impl RetryPolicy {
    /// No retries: the first abort is returned.
    pub fn never() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        }
    }

    /// How long to wait (ns) before retry number `attempt` (1 for the first retry).
    pub fn backoff_ns(&self, attempt: u32, jitter: &mut SmallRng) -> u64 {
        let min = (self.min_backoff.as_nanos() as u64).max(1);
        let max = (self.max_backoff.as_nanos() as u64).max(min);
        let window = min
            .saturating_mul(1u64 << attempt.saturating_sub(1).min(20))
            .min(max);
        jitter.gen_range(window / 2..=window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn the_window_doubles_up_to_its_cap() {
        let p = RetryPolicy::default();
        let mut r = SmallRng::seed_from_u64(1);
        for _ in 0..100 {
            let first = p.backoff_ns(1, &mut r);
            assert!((8_000..=16_000).contains(&first), "{first}");
            let third = p.backoff_ns(3, &mut r);
            assert!((32_000..=64_000).contains(&third), "{third}");
            let late = p.backoff_ns(60, &mut r);
            assert!((2_000_000..=4_000_000).contains(&late), "{late}");
        }
    }
}
