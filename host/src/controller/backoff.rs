//! Per-object exponential backoff after errors, reset by the next success.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use kube::core::DynamicObject;
use kube::ResourceExt;

const BASE: Duration = Duration::from_millis(500);
const MAX: Duration = Duration::from_secs(300);

#[derive(Default)]
pub struct Backoff {
    failures: Mutex<HashMap<String, u32>>,
}

fn key(obj: &DynamicObject) -> String {
    format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())
}

impl Backoff {
    /// The delay before retrying `obj`, doubling with each consecutive failure.
    pub fn next(&self, obj: &DynamicObject) -> Duration {
        let Ok(mut failures) = self.failures.lock() else { return MAX };
        let n = failures.entry(key(obj)).or_insert(0);
        *n = n.saturating_add(1);
        BASE.saturating_mul(1u32 << (*n - 1).min(10)).min(MAX)
    }

    /// The delay before retrying `obj` after an error. A dropped connection (`transport`) is
    /// tried again a fifth as late, 100 ms the first time: the API server refused nothing, and
    /// a plugin swap or a failover may be waiting on this reconcile.
    pub fn after(&self, obj: &DynamicObject, transport: bool) -> Duration {
        let delay = self.next(obj);
        if transport {
            delay / 5
        } else {
            delay
        }
    }

    pub fn reset(&self, obj: &DynamicObject) {
        if let Ok(mut failures) = self.failures.lock() {
            failures.remove(&key(obj));
        }
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_connection_is_retried_sooner_and_both_back_off() {
        let obj: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "stateward.dev/v1", "kind": "RedisCluster",
            "metadata": {"name": "r", "namespace": "ns"},
        }))
        .expect("object");
        let backoff = Backoff::default();
        assert_eq!(backoff.after(&obj, true), Duration::from_millis(100));
        assert_eq!(backoff.after(&obj, true), Duration::from_millis(200));
        backoff.reset(&obj);
        assert_eq!(backoff.after(&obj, false), Duration::from_millis(500));
        assert_eq!(backoff.after(&obj, false), Duration::from_secs(1));
    }
}
