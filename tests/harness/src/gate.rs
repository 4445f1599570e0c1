//! Admission of real-pods tests by weight: how much of the 2-core machine a test's servers take.
//!
//! One global lock let two tests run at once whatever they were: two OpenSearch tests (six
//! JVMs) together, or a one-pod check waiting behind two failover tests. Each test now declares
//! its [`Weight`]; tests run together while their weights fit the capacity
//! (`STATEWARD_REALPODS_CAPACITY`, default [`DEFAULT_CAPACITY`]), heaviest first (the heavy
//! ones are the long ones, so the run ends on light tests that pack well), and a test that
//! changes the cluster for every namespace runs alone. Strict order, no overtaking: a waiting
//! heavy test is never starved by light ones.

use std::sync::Mutex;

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

/// Units of a capacity of 5: two replicated clusters and a light test, or OpenSearch beside a
/// replicated cluster, never two OpenSearch tests at once.
pub const DEFAULT_CAPACITY: u32 = 5;

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
    /// Waiting tests: (weight, ticket); the heaviest, then the earliest, goes next.
    waiting: Vec<(Weight, u64)>,
}

/// Held while a test runs; gives its units back when dropped.
#[derive(Debug)]
pub struct Admitted<'a> {
    gate: &'a Gate,
    units: u32,
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

    /// Waits until a test of `weight` is next in line and fits, then admits it.
    pub async fn admit(&self, weight: Weight) -> Admitted<'_> {
        let units = weight.units(self.capacity.max(1));
        let ticket = {
            let mut s = self.lock();
            let t = s.next_ticket;
            s.next_ticket += 1;
            s.waiting.push((weight, t));
            t
        };
        loop {
            // Registered before the check, so a release between the check and the wait wakes it.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut s = self.lock();
                let next = s.waiting.iter().copied().max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
                if next.map(|n| n.1) == Some(ticket) && s.used + units <= self.capacity.max(1) {
                    s.used += units;
                    s.waiting.retain(|w| w.1 != ticket);
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
    use std::time::Duration;

    /// Admits `weights` in the order given (each registered before the next) into a gate of
    /// `capacity`, each holding for 50 ms; returns the order they were admitted in and the
    /// highest load seen.
    async fn run(capacity: u32, weights: &[Weight]) -> (Vec<usize>, u32) {
        let gate: &'static Gate = Box::leak(Box::new(Gate::new(capacity)));
        let order = Arc::new(Mutex::new(Vec::new()));
        let peak = Arc::new(Mutex::new(0u32));
        // A blocker holds everything until all have queued, so the order is the gate's choice.
        let blocker = gate.admit(Weight::Exclusive).await;
        let mut tasks = Vec::new();
        for (i, w) in weights.iter().copied().enumerate() {
            let (order, peak) = (order.clone(), peak.clone());
            tasks.push(tokio::spawn(async move {
                let _in = gate.admit(w).await;
                order.lock().map(|mut o| o.push(i)).ok();
                let used = gate.lock().used;
                peak.lock().map(|mut p| *p = (*p).max(used)).ok();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(blocker);
        for t in tasks {
            t.await.ok();
        }
        let order = order.lock().map(|o| o.clone()).unwrap_or_default();
        let peak = peak.lock().map(|p| *p).unwrap_or_default();
        (order, peak)
    }

    #[tokio::test]
    async fn heaviest_first_within_the_capacity_and_exclusive_alone() {
        use Weight::*;
        let (order, peak) = run(5, &[Light, Medium, Heavy, Exclusive, Light, Heavy]).await;
        // Exclusive first (alone), then the two heavy ones in turn (3 + 3 > 5), then medium, light.
        assert_eq!(order, vec![3, 2, 5, 1, 0, 4]);
        assert!(peak <= 5, "load {peak} over the capacity");
    }

    #[tokio::test]
    async fn light_tests_share_the_machine() {
        let (order, peak) = run(5, &[Weight::Light; 5]).await;
        assert_eq!(order, vec![0, 1, 2, 3, 4], "equal weights keep their order");
        assert_eq!(peak, 5, "five light tests run at once");
    }
}
