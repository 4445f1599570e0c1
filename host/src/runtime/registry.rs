//! Which plugin serves which kind. Built-in plugins come from a directory of `.wasm` files.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use super::{Plugin, RuntimeError, Sandbox};

/// Plugins indexed by `(group, kind)`; cheap to clone.
#[derive(Clone, Default)]
pub struct Registry {
    by_kind: BTreeMap<(String, String), Arc<Plugin>>,
}

impl Registry {
    /// Loads every `*.wasm` in `dir`, in name order. A file that fails to load is an error:
    /// built-in plugins are part of the release and must all work.
    pub fn load_dir(sandbox: &Arc<Sandbox>, dir: &Path) -> Result<Self, RuntimeError> {
        let read_err = |source| RuntimeError::Read {
            path: dir.display().to_string(),
            source,
        };
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .map_err(read_err)?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "wasm"))
            .collect();
        files.sort();
        let mut registry = Self::default();
        for file in files {
            registry.insert(Arc::new(Plugin::load_file(sandbox, &file)?));
        }
        Ok(registry)
    }

    /// Adds a plugin for every kind it declares, replacing whatever served those kinds.
    pub fn insert(&mut self, plugin: Arc<Plugin>) {
        for kind in &plugin.info().kinds {
            self.by_kind.insert(
                (kind.group.clone(), kind.kind.clone()),
                Arc::clone(&plugin),
            );
        }
    }

    /// The plugin for an object's `apiVersion` (group/version) and `kind`.
    pub fn for_object(&self, api_version: &str, kind: &str) -> Option<&Arc<Plugin>> {
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        self.by_kind.get(&(group.to_string(), kind.to_string()))
    }

    /// Each loaded plugin once, in kind order.
    pub fn plugins(&self) -> Vec<Arc<Plugin>> {
        let mut seen: Vec<Arc<Plugin>> = Vec::new();
        for plugin in self.by_kind.values() {
            if !seen.iter().any(|p| Arc::ptr_eq(p, plugin)) {
                seen.push(Arc::clone(plugin));
            }
        }
        seen
    }
}
