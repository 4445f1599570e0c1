//! Cranelift's incremental compilation cache, kept in memory: a new build of a plugin compiles
//! only the functions that differ from the builds this process compiled before it. Most of a
//! new build is the same sdk, serde and service code as the build it replaces, so a hot reload
//! is vetted in a fraction of a full compile. Cranelift only (`--plugin-compiler cranelift`,
//! the default off x86-64): Winch compiles in one pass and keeps no such cache. Reuse is
//! partial: a build moves its static data, so every function addressing data past a change
//! compiles again (about a third of the Redis plugin for a one-line change).
//!
//! Cranelift keys each entry by a SHA-256 over the function's IR and the compiler's settings;
//! the entries are made by this process's own compiler and never read from outside it, so a
//! plugin cannot plant code here, only find its own functions compiled once already. Bounded:
//! the oldest entries go first once their total passes the bound.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Default bound on the compiled functions kept (a build of a plugin leaves about 2 MiB).
pub const DEFAULT_MAX_BYTES: usize = 64 << 20;

#[derive(Debug)]
pub struct FunctionCache {
    entries: Mutex<Entries>,
    max_bytes: usize,
    hits: AtomicU64,
    misses: AtomicU64,
}

#[derive(Debug, Default)]
struct Entries {
    by_key: HashMap<Vec<u8>, Vec<u8>>,
    /// Keys in insertion order, for evicting the oldest first.
    order: VecDeque<Vec<u8>>,
    bytes: usize,
}

/// Functions found compiled, and compiled anew, since the cache began.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reuse {
    pub reused: u64,
    pub compiled: u64,
}

impl Reuse {
    /// What happened between `before` and `self` (one load's share, when loads do not overlap).
    pub fn since(self, before: Reuse) -> Reuse {
        Reuse { reused: self.reused - before.reused, compiled: self.compiled - before.compiled }
    }
}

impl FunctionCache {
    pub fn new(max_bytes: usize) -> Self {
        Self { entries: Mutex::default(), max_bytes, hits: AtomicU64::new(0), misses: AtomicU64::new(0) }
    }

    pub fn reuse(&self) -> Reuse {
        Reuse { reused: self.hits.load(Ordering::Relaxed), compiled: self.misses.load(Ordering::Relaxed) }
    }

    /// Bytes of compiled functions held.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl wasmtime::CacheStore for FunctionCache {
    fn get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        let found = self.lock().by_key.get(key).cloned();
        let counter = if found.is_some() { &self.hits } else { &self.misses };
        counter.fetch_add(1, Ordering::Relaxed);
        found.map(Cow::Owned)
    }

    fn insert(&self, key: &[u8], value: Vec<u8>) -> bool {
        let size = key.len() + value.len();
        if size > self.max_bytes {
            return false;
        }
        let mut entries = self.lock();
        if entries.by_key.contains_key(key) {
            return true;
        }
        while entries.bytes + size > self.max_bytes {
            let Some(oldest) = entries.order.pop_front() else { break };
            if let Some(old) = entries.by_key.remove(&oldest) {
                entries.bytes -= oldest.len() + old.len();
            }
        }
        entries.bytes += size;
        entries.order.push_back(key.to_vec());
        entries.by_key.insert(key.to_vec(), value);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::CacheStore;

    #[test]
    fn the_oldest_entries_go_once_the_bound_is_passed() {
        let cache = FunctionCache::new(30);
        assert!(cache.insert(b"a", vec![0; 9]));
        assert!(cache.insert(b"b", vec![1; 9]));
        assert!(cache.insert(b"c", vec![2; 9]));
        assert_eq!(cache.bytes(), 30);
        assert!(cache.insert(b"d", vec![3; 9]), "room is made for it");
        assert!(cache.get(b"a").is_none(), "the oldest went");
        assert_eq!(cache.get(b"d").as_deref(), Some(&[3u8; 9][..]));
        assert_eq!(cache.bytes(), 30);
        assert!(!cache.insert(b"e", vec![4; 30]), "larger than the whole bound");
        assert_eq!(cache.reuse(), Reuse { reused: 1, compiled: 1 });
    }
}
