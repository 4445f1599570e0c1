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

    pub fn reset(&self, obj: &DynamicObject) {
        if let Ok(mut failures) = self.failures.lock() {
            failures.remove(&key(obj));
        }
    }
}
