//! A token bucket: how often something may happen, with a burst. The webhook spends one per
//! name check of a CREATE review (two list calls to the API server), so a peer flooding the
//! port with reviews cannot turn into a flood of the API server, which the reconciles share.

use std::sync::{Mutex, PoisonError};
use std::time::Instant;

/// `rate` tokens a second, at most `burst` saved up.
#[derive(Debug)]
pub struct Budget {
    rate: f64,
    burst: f64,
    state: Mutex<(Instant, f64)>,
}

impl Budget {
    /// A full bucket.
    pub fn new(rate: f64, burst: f64) -> Self {
        Self { rate, burst, state: Mutex::new((Instant::now(), burst)) }
    }

    /// Takes one token if there is one.
    pub fn take(&self) -> bool {
        self.take_at(Instant::now())
    }

    fn take_at(&self, now: Instant) -> bool {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (last, tokens) = *state;
        let elapsed = now.saturating_duration_since(last).as_secs_f64();
        let tokens = (tokens + elapsed * self.rate).min(self.burst);
        let taken = tokens >= 1.0;
        *state = (now.max(last), if taken { tokens - 1.0 } else { tokens });
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_burst_then_the_rate() {
        let budget = Budget::new(10.0, 3.0);
        let t0 = Instant::now();
        assert_eq!((0..5).filter(|_| budget.take_at(t0)).count(), 3);
        assert!(!budget.take_at(t0 + Duration::from_millis(50)));
        assert!(budget.take_at(t0 + Duration::from_millis(110)));
        assert!(!budget.take_at(t0 + Duration::from_millis(120)));
        // Saved up for a long time: never more than the burst.
        let later = t0 + Duration::from_secs(60);
        assert_eq!((0..10).filter(|_| budget.take_at(later)).count(), 3);
    }
}
