//! The status this replica last wrote to each resource, until its cache has caught up.
//!
//! The API server answers a status write before the watch delivers it to the cache. A reconcile
//! that starts in between (a pod changed, a request answered) reads the status from before the
//! write: every condition looks new, so it writes again only to move `lastTransitionTime`, and
//! the resource is written twice per change. While the cache still holds a version this replica
//! has written over, a reconcile reads the status the API server answered with instead.
//!
//! Versions are compared for equality only (they are opaque): a cached version that is not one
//! of those written over is at or past the write, or someone else's, and the cache is trusted.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::Value;

/// At most this many resources are remembered; a reconcile forgets its own entry as soon as the
/// cache catches up, so only resources whose caches lag are held.
const MAX_REMEMBERED: usize = 10_000;

#[derive(Default)]
pub struct Written {
    by_uid: Mutex<HashMap<String, Record>>,
}

struct Record {
    /// The versions the write was made over (the one read, and the finalizer's in between).
    superseded: Vec<String>,
    /// `.status` as the API server stored it.
    status: Value,
    /// The resourceVersion the API server gave the write: a write preconditioned on what this
    /// reconcile read (a one-shot request's record) must name it, not the stale cached one.
    version: String,
}

impl Written {
    /// Remembers that `status` was stored at `version` over the versions in `superseded`.
    pub fn remember(&self, uid: &str, superseded: Vec<String>, status: Value, version: String) {
        let mut map = self.by_uid.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if map.len() >= MAX_REMEMBERED && !map.contains_key(uid) {
            map.clear();
        }
        map.insert(uid.to_string(), Record { superseded, status, version });
    }

    /// `resource` as read from the cache, with the status (and resourceVersion) last written
    /// over its version if the cache has not caught up with that write yet.
    pub fn freshest(&self, uid: &str, version: &str, resource: &mut Value) {
        let mut map = self.by_uid.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(record) = map.get(uid) else { return };
        if record.superseded.iter().any(|v| v == version) {
            resource["status"] = record.status.clone();
            resource["metadata"]["resourceVersion"] = Value::String(record.version.clone());
        } else {
            map.remove(uid);
        }
    }

    pub fn forget(&self, uid: &str) {
        self.by_uid.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_stale_read_gets_the_written_status_until_the_cache_catches_up() {
        let written = Written::default();
        written.remember("u", vec!["1".into(), "2".into()], json!({"phase": "Running"}), "3".into());
        let mut stale = json!({"metadata": {"resourceVersion": "2"}, "status": {"phase": "Pending"}});
        written.freshest("u", "2", &mut stale);
        assert_eq!(stale["status"]["phase"], "Running");
        assert_eq!(stale["metadata"]["resourceVersion"], "3", "a precondition names the stored version");
        let mut other = json!({"status": {"phase": "Pending"}});
        written.freshest("v", "2", &mut other);
        assert_eq!(other["status"]["phase"], "Pending", "another resource is untouched");
        // The cache at the write's own version (or any other): trusted, and the record dropped.
        let mut caught_up = json!({"status": {"phase": "Scaling"}});
        written.freshest("u", "3", &mut caught_up);
        assert_eq!(caught_up["status"]["phase"], "Scaling");
        let mut again = json!({"status": {"phase": "Pending"}});
        written.freshest("u", "1", &mut again);
        assert_eq!(again["status"]["phase"], "Pending", "forgotten once caught up");
    }
}
