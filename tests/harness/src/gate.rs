//! Admission of real-pods tests by weight: how much of the 2-core machine a test's servers take.
//!
//! One global lock let two tests run at once whatever they were: two OpenSearch tests (six
//! JVMs) together, or a one-pod check waiting behind two failover tests. Each test now declares
//! its [`Weight`]; tests run together while their weights fit the capacity
//! (`STATEWARD_REALPODS_CAPACITY`, default [`DEFAULT_CAPACITY`]), heaviest first and, among
//! equals, longest first by the last run's durations (so the run ends on short tests that
//! pack well, not on a long one alone), and a test that
//! changes the cluster for every namespace runs alone. A lighter test may go ahead of a heavier
//! one that does not fit yet (it fills the room the running ones leave), but never ahead of an
//! exclusive one, which would otherwise wait for the machine to empty by chance. Each release
//! offers the room to the heaviest first, so a heavy test gets in as soon as one ends.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;

/// How much of the machine a real-pods test takes while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Weight {
    /// One or two small pods (a PostgreSQL or Redis server, a client).
    Light,
    /// A replicated cluster (three servers, Sentinels or standbys) with the operator and a writer.
    Medium,
    /// JVMs: OpenSearch nodes.
    Heavy,
    /// Changes the cluster for every namespace (cluster-wide webhooks), or loads the machine so
    /// much that no other test may share it: runs alone.
    Exclusive,
}

/// Units of a capacity of 4: two replicated clusters, or OpenSearch beside a light test, never
/// two OpenSearch tests at once. (At 5, a Redis roll's write gap beside two other clusters
/// reached 14 s against its 5 s target.)
pub const DEFAULT_CAPACITY: u32 = 4;

impl Weight {
    fn units(self, capacity: u32) -> u32 {
        match self {
            Weight::Light => 1,
            Weight::Medium => 2,
            Weight::Heavy => 3,
            Weight::Exclusive => capacity,
        }
        .min(capacity)
    }
}

/// The gate every real-pods test of a process passes (see the module documentation).
#[derive(Debug)]
pub struct Gate {
    capacity: u32,
    state: Mutex<State>,
    changed: Notify,
}

#[derive(Debug, Default)]
struct State {
    used: u32,
    next_ticket: u64,
    /// Waiting tests: (weight, expected seconds, ticket); the heaviest, then the longest, then
    /// the earliest goes next.
    waiting: Vec<(Weight, u64, u64)>,
}

/// Held while a test runs; gives its units back when dropped.
#[derive(Debug)]
pub struct Admitted<'a> {
    gate: &'a Gate,
    units: u32,
}

impl State {
    /// The waiting test to admit now: in order of weight (then arrival), the first that fits,
    /// none past an exclusive one.
    fn next_to_admit(&self, capacity: u32) -> Option<u64> {
        let mut line = self.waiting.clone();
        line.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
        for (weight, _, ticket) in line {
            if self.used + weight.units(capacity) <= capacity {
                return Some(ticket);
            }
            if weight == Weight::Exclusive {
                return None;
            }
        }
        None
    }
}

impl Gate {
    /// A gate of `capacity` units.
    pub const fn new(capacity: u32) -> Gate {
        Gate {
            capacity,
            state: Mutex::new(State { used: 0, next_ticket: 0, waiting: Vec::new() }),
            changed: Notify::const_new(),
        }
    }

    /// Waits until a test of `weight`, expected to take `expected` (the last run's duration;
    /// zero when unknown), is next in line and fits, then admits it.
    pub async fn admit(&self, weight: Weight, expected: Duration) -> Admitted<'_> {
        let units = weight.units(self.capacity.max(1));
        let ticket = {
            let mut s = self.lock();
            let t = s.next_ticket;
            s.next_ticket += 1;
            s.waiting.push((weight, expected.as_secs(), t));
            t
        };
        loop {
            // Registered before the check, so a release between the check and the wait wakes it.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut s = self.lock();
                if s.next_to_admit(self.capacity.max(1)) == Some(ticket) {
                    s.used += units;
                    s.waiting.retain(|w| w.2 != ticket);
                    drop(s);
                    // The next in line may fit beside this one.
                    self.changed.notify_waiters();
                    return Admitted { gate: self, units };
                }
            }
            changed.await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A test that panicked while holding the lock left consistent numbers (no await inside).
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        self.gate.lock().used -= self.units;
        self.gate.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Admits `weights` in the order given (each registered before the next) into a gate of
    /// `capacity`, each holding for 50 ms; returns the order they were admitted in, the highest
    /// load seen and the most heavy tests seen at once.
    async fn run(capacity: u32, weights: &[Weight]) -> (Vec<usize>, u32, u32) {
        let gate: &'static Gate = Box::leak(Box::new(Gate::new(capacity)));
        let seen = Arc::new(Mutex::new((Vec::new(), 0u32, 0u32, 0u32)));
        // A blocker holds everything until all have queued, so the order is the gate's choice.
        let blocker = gate.admit(Weight::Exclusive, Duration::ZERO).await;
        let mut tasks = Vec::new();
        for (i, w) in weights.iter().copied().enumerate() {
            let seen = seen.clone();
            tasks.push(tokio::spawn(async move {
                let _in = gate.admit(w, Duration::ZERO).await;
                let used = gate.lock().used;
                if let Ok(mut s) = seen.lock() {
                    s.0.push(i);
                    s.1 = s.1.max(used);
                    s.3 += u32::from(w == Weight::Heavy);
                    s.2 = s.2.max(s.3);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                if let Ok(mut s) = seen.lock() {
                    s.3 -= u32::from(w == Weight::Heavy);
                }
            }));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(blocker);
        for t in tasks {
            t.await.ok();
        }
        let s = seen.lock().map(|s| s.clone()).unwrap_or_default();
        (s.0, s.1, s.2)
    }

    #[tokio::test]
    async fn heaviest_first_lighter_ones_fill_the_room_and_exclusive_alone() {
        use Weight::*;
        let (order, peak, heavies) = run(5, &[Light, Medium, Heavy, Exclusive, Light, Heavy]).await;
        // Exclusive first (alone), then the first heavy one; the second does not fit beside it
        // (3 + 3 > 5), so the medium one fills the room; the rest as room is made.
        assert_eq!(order[..3], [3, 2, 1], "{order:?}");
        assert_eq!(order.len(), 6);
        assert!(peak <= 5, "load {peak} over the capacity");
        assert_eq!(heavies, 1, "two heavy tests at once");
    }

    #[tokio::test]
    async fn nothing_goes_ahead_of_an_exclusive_test() {
        let gate: &'static Gate = Box::leak(Box::new(Gate::new(5)));
        let order = Arc::new(Mutex::new(Vec::new()));
        let running = gate.admit(Weight::Medium, Duration::ZERO).await;
        let mut tasks = Vec::new();
        for (name, weight) in [("exclusive", Weight::Exclusive), ("light", Weight::Light)] {
            let order = order.clone();
            tasks.push(tokio::spawn(async move {
                let _in = gate.admit(weight, Duration::ZERO).await;
                order.lock().map(|mut o| o.push(name)).ok();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
        let before = order.lock().map(|o| o.clone()).unwrap_or_default();
        assert!(before.is_empty(), "the light test fits beside the running one but waits: {before:?}");
        drop(running);
        for t in tasks {
            t.await.ok();
        }
        assert_eq!(order.lock().map(|o| o.clone()).unwrap_or_default(), ["exclusive", "light"]);
    }

    #[tokio::test]
    async fn among_equals_the_longest_goes_first() {
        let gate: &'static Gate = Box::leak(Box::new(Gate::new(2)));
        let order = Arc::new(Mutex::new(Vec::new()));
        let blocker = gate.admit(Weight::Exclusive, Duration::ZERO).await;
        let mut tasks = Vec::new();
        for (name, secs) in [("short", 10), ("unknown", 0), ("long", 300)] {
            let order = order.clone();
            tasks.push(tokio::spawn(async move {
                let _in = gate.admit(Weight::Medium, Duration::from_secs(secs)).await;
                order.lock().map(|mut o| o.push(name)).ok();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(blocker);
        for t in tasks {
            t.await.ok();
        }
        assert_eq!(order.lock().map(|o| o.clone()).unwrap_or_default(), ["long", "short", "unknown"]);
    }

    #[tokio::test]
    async fn light_tests_share_the_machine() {
        let (order, peak, _) = run(5, &[Weight::Light; 5]).await;
        assert_eq!(order, vec![0, 1, 2, 3, 4], "equal weights keep their order");
        assert_eq!(peak, 5, "five light tests run at once");
    }
}
