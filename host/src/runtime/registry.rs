//! Which plugin serves which kind. Built-in plugins come from a directory of `.wasm` files.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, PoisonError, RwLock};

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
        let read_err = |source| RuntimeError::Read { path: dir.display().to_string(), source };
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
            self.by_kind.insert((kind.group.clone(), kind.kind.clone()), Arc::clone(&plugin));
        }
    }

    /// The plugin for an object's `apiVersion` (group/version) and `kind`.
    pub fn for_object(&self, api_version: &str, kind: &str) -> Option<&Arc<Plugin>> {
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        self.by_kind.get(&(group.to_string(), kind.to_string()))
    }

    /// The plugin serving `group`/`kind`.
    pub fn get(&self, group: &str, kind: &str) -> Option<&Arc<Plugin>> {
        self.by_kind.get(&(group.to_string(), kind.to_string()))
    }

    /// The plugin of that name, if one is loaded.
    pub fn by_name(&self, name: &str) -> Option<&Arc<Plugin>> {
        self.by_kind.values().find(|p| p.name() == name)
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

/// The plugins serving right now: the built-in ones, each overridden by name by a plugin
/// hot-loaded from a ConfigMap. Swaps are atomic: a reconcile that already took its plugin
/// finishes on it, the next one gets the new build.
pub struct LiveRegistry {
    builtin: Registry,
    state: RwLock<LiveState>,
}

#[derive(Default)]
struct LiveState {
    current: Registry,
    overrides: BTreeMap<String, Arc<Plugin>>,
}

impl LiveRegistry {
    pub fn new(builtin: Registry) -> Self {
        let state = LiveState { current: builtin.clone(), overrides: BTreeMap::new() };
        Self { builtin, state: RwLock::new(state) }
    }

    /// The registry as it is now (a cheap clone of `Arc`s).
    pub fn snapshot(&self) -> Registry {
        self.state.read().unwrap_or_else(PoisonError::into_inner).current.clone()
    }

    /// The plugin serving `group`/`kind` now.
    pub fn get(&self, group: &str, kind: &str) -> Option<Arc<Plugin>> {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        state.current.get(group, kind).cloned()
    }

    /// The plugin serving under `name` now (an override, else the built-in one).
    pub fn by_name(&self, name: &str) -> Option<Arc<Plugin>> {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        state.current.by_name(name).cloned()
    }

    /// The built-in plugin of that name.
    pub fn builtin(&self, name: &str) -> Option<Arc<Plugin>> {
        self.builtin.by_name(name).cloned()
    }

    /// Serves `plugin` under its name from now on, in place of the built-in or earlier override.
    pub fn set_override(&self, plugin: Arc<Plugin>) {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        state.overrides.insert(plugin.name().to_string(), plugin);
        state.current = self.compose(&state.overrides);
    }

    /// Drops the override of `name`; its built-in plugin serves again. Without a built-in of
    /// that name the override stays (a kind never loses its plugin) and `false` is returned.
    pub fn remove_override(&self, name: &str) -> bool {
        if self.builtin.by_name(name).is_none() {
            return false;
        }
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        if state.overrides.remove(name).is_none() {
            return false;
        }
        state.current = self.compose(&state.overrides);
        true
    }

    /// Names of the plugins served from an override.
    pub fn overridden(&self) -> Vec<String> {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        state.overrides.keys().cloned().collect()
    }

    fn compose(&self, overrides: &BTreeMap<String, Arc<Plugin>>) -> Registry {
        let mut registry = Registry::default();
        for plugin in self.builtin.plugins() {
            if !overrides.contains_key(plugin.name()) {
                registry.insert(plugin);
            }
        }
        for plugin in overrides.values() {
            registry.insert(Arc::clone(plugin));
        }
        registry
    }
}
