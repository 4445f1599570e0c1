//! Shared reflector caches of exactly the child kinds the loaded plugins own (their
//! `info().owns`, plus Secrets, which `ensure-secret` and the certificate keeper read), filtered
//! to objects labelled `stateward.dev/instance`, so observing a resource costs no API read.
//!
//! A kind is added when a plugin that owns it loads ([`Children::ensure`]): the API server must
//! know it (discovery), it must be namespaced, and the operator must be allowed to list it;
//! otherwise the plugin is refused with the reason. Caches are never dropped while the process
//! runs (a plugin swapped out may come back; an idle cache costs one watch).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::ListParams;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::discovery::Scope;
use kube::runtime::reflector::{self, store::Writer, Store};
use kube::runtime::utils::{Backoff, ResetTimerBackoff};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource, ResourceExt};
use serde_json::Value;
use tokio::sync::broadcast;

use crate::watched::Watched;

/// The label every child carries: the name of the custom resource it belongs to.
pub const INSTANCE_LABEL: &str = "stateward.dev/instance";

/// Kinds cached whatever the plugins own: `ensure-secret` and the certificate keeper read
/// Secrets.
pub const ALWAYS_CACHED: [(&str, &str); 1] = [("v1", "Secret")];

/// How long a new kind's first list may take before the plugin owning it is refused.
const SYNC_TIMEOUT: Duration = Duration::from_secs(30);

/// A child kind, as plugins declare it: (apiVersion, kind).
pub type ChildKindKey = (String, String);

/// Why a kind cannot be cached, and so why a plugin owning it cannot serve.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("the API server does not serve {api_version} {kind}: {reason}")]
    Unknown { api_version: String, kind: String, reason: String },
    #[error("{api_version} {kind} is cluster-scoped; a plugin may only own namespaced kinds")]
    ClusterScoped { api_version: String, kind: String },
    #[error("the operator may not list {api_version} {kind}: {reason} (grant list and watch in its RBAC)")]
    Forbidden { api_version: String, kind: String, reason: String },
    #[error("the cache of {api_version} {kind} did not sync within {SYNC_TIMEOUT:?}")]
    NotSynced { api_version: String, kind: String },
}

/// The caches of every child kind, plus a subscription per controller to their changes.
#[derive(Clone)]
pub struct Children {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    watched: Watched,
    caches: RwLock<BTreeMap<ChildKindKey, Arc<Cached>>>,
    /// One `ensure` at a time, so two plugins owning a new kind start one watch.
    adding: tokio::sync::Mutex<()>,
    /// Relists and deletions, which the shared change streams do not carry (they only
    /// announce objects that exist), so that a deleted child is recreated at once.
    changes: broadcast::Sender<ChildChange>,
}

/// A change to the children that must make their owner reconcile.
#[derive(Clone, Debug)]
pub enum ChildChange {
    /// A watch finished a (re)list: after a gap, objects may have gone without a delete
    /// event, so every resource must be looked at again. Also what a listener that fell
    /// behind gets instead of what it missed.
    Relisted,
    /// A child was created or changed (after the cache took it in).
    Changed(Arc<DynamicObject>),
    /// A child carrying `stateward.dev/instance=<instance>` was deleted.
    Deleted { namespace: String, instance: String },
}

/// One kind's caches: one per watched scope (every namespace, or each namespace listed).
struct Cached {
    resource: ApiResource,
    parts: Vec<Part>,
}

/// One watch's cache of a kind and its index by instance.
struct Part {
    /// The namespace it covers; `None`: every namespace.
    namespace: Option<String>,
    store: Store<DynamicObject>,
    index: Arc<RwLock<Index>>,
}

impl Cached {
    /// The cache holding `namespace`'s objects, if one is watched.
    fn part(&self, namespace: &str) -> Option<&Part> {
        self.parts.iter().find(|p| p.namespace.as_deref().is_none_or(|n| n == namespace))
    }
}

/// Names of the cached children of each instance, so that observing one resource looks up its
/// own children instead of scanning every child of the kind (which made each reconcile O(N)
/// and the operator's CPU grow as N², benches/scale.rs). Updated from the watch events just
/// before the cache is, so a name it lists may be missing from the cache for a moment (then
/// skipped), never the other way round.
#[derive(Default)]
struct Index {
    /// (namespace, instance) → child names.
    by_instance: HashMap<(String, String), BTreeSet<String>>,
    /// (namespace, name) → instance, to move or drop an entry when a child changes.
    instance_of: HashMap<(String, String), String>,
    /// Entries of a relist in progress, swapped in when it completes.
    relisting: Option<Vec<(String, String, String)>>,
}

/// (namespace, name, instance) of a labelled child.
fn index_key<K: Resource>(child: &K) -> Option<(String, String, String)> {
    let instance = child.labels().get(INSTANCE_LABEL)?.clone();
    Some((child.namespace()?, child.name_any(), instance))
}

impl Index {
    fn insert(&mut self, (ns, name, instance): (String, String, String)) {
        if let Some(old) = self.instance_of.insert((ns.clone(), name.clone()), instance.clone()) {
            if old != instance {
                self.forget(&ns, &name, &old);
            }
        }
        self.by_instance.entry((ns, instance)).or_default().insert(name);
    }

    fn forget(&mut self, ns: &str, name: &str, instance: &str) {
        let key = (ns.to_string(), instance.to_string());
        if let Some(names) = self.by_instance.get_mut(&key) {
            names.remove(name);
            if names.is_empty() {
                self.by_instance.remove(&key);
            }
        }
    }

    fn update<K: Resource>(&mut self, event: &watcher::Event<K>) {
        match event {
            watcher::Event::Init => self.relisting = Some(Vec::new()),
            watcher::Event::InitApply(child) => {
                if let Some(key) = index_key(child) {
                    self.relisting.get_or_insert_with(Vec::new).push(key);
                }
            }
            watcher::Event::InitDone => {
                let listed = self.relisting.take().unwrap_or_default();
                self.by_instance.clear();
                self.instance_of.clear();
                for key in listed {
                    self.insert(key);
                }
            }
            watcher::Event::Apply(child) => match index_key(child) {
                Some(key) => self.insert(key),
                None => self.remove(&child.namespace().unwrap_or_default(), &child.name_any()),
            },
            watcher::Event::Delete(child) => {
                self.remove(&child.namespace().unwrap_or_default(), &child.name_any());
            }
        }
    }

    fn remove(&mut self, ns: &str, name: &str) {
        if let Some(instance) = self.instance_of.remove(&(ns.to_string(), name.to_string())) {
            self.forget(ns, name, &instance);
        }
    }

    fn names(&self, ns: &str, instance: &str) -> Vec<String> {
        self.by_instance
            .get(&(ns.to_string(), instance.to_string()))
            .map(|names| names.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// Retries a broken child watch quickly, doubling from 0.5 s to at most 5 s: until it is
/// back, a deleted child goes unnoticed (kube's default waits up to 30 s).
fn watch_backoff() -> ResetTimerBackoff<Doubling> {
    ResetTimerBackoff::new(Doubling::default(), Duration::from_secs(60))
}

#[derive(Default)]
struct Doubling {
    failures: u32,
}

impl Iterator for Doubling {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        let delay = Duration::from_millis(500).saturating_mul(1 << self.failures.min(4));
        self.failures = self.failures.saturating_add(1);
        Some(delay.min(Duration::from_secs(5)))
    }
}

impl Backoff for Doubling {
    fn reset(&mut self) {
        self.failures = 0;
    }
}

impl Children {
    /// No caches yet: [`Children::ensure`] adds the kinds plugins own.
    pub fn new(client: &Client, watched: &Watched) -> Self {
        let (changes, _) = broadcast::channel(1024);
        Self {
            inner: Arc::new(Inner {
                client: client.clone(),
                watched: watched.clone(),
                caches: RwLock::new(BTreeMap::new()),
                adding: tokio::sync::Mutex::new(()),
                changes,
            }),
        }
    }

    /// Caches every kind of `kinds` (and [`ALWAYS_CACHED`]) not cached yet, each checked and
    /// listed before this returns. Returns whether a kind was added; the first kind that
    /// cannot be cached is the error, and the kinds after it are not added.
    pub async fn ensure(&self, kinds: impl IntoIterator<Item = ChildKindKey>) -> Result<bool, WatchError> {
        let _one_at_a_time = self.inner.adding.lock().await;
        let wanted: BTreeSet<ChildKindKey> =
            ALWAYS_CACHED.iter().map(|(a, k)| ((*a).to_string(), (*k).to_string())).chain(kinds).collect();
        let mut added = false;
        for key in wanted {
            if self.read().contains_key(&key) {
                continue;
            }
            let cached = self.start(&key).await?;
            self.inner.caches.write().unwrap_or_else(PoisonError::into_inner).insert(key, Arc::new(cached));
            added = true;
        }
        Ok(added)
    }

    /// Discovers and checks one kind, and starts its watch in every watched scope, waiting
    /// for each one's first list.
    async fn start(&self, (api_version, kind): &ChildKindKey) -> Result<Cached, WatchError> {
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version.as_str()),
        };
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, caps) = kube::discovery::pinned_kind(&self.inner.client, &gvk).await.map_err(|e| {
            WatchError::Unknown {
                api_version: api_version.clone(),
                kind: kind.clone(),
                reason: e.to_string(),
            }
        })?;
        if caps.scope != Scope::Namespaced {
            return Err(WatchError::ClusterScoped { api_version: api_version.clone(), kind: kind.clone() });
        }
        let mut parts = Vec::new();
        for scope in self.inner.watched.scopes() {
            parts.push(self.start_watch(api_version, kind, &resource, scope).await?);
        }
        Ok(Cached { resource, parts })
    }

    /// Starts the watch of one kind in `scope` and waits for its first list.
    async fn start_watch(
        &self,
        api_version: &str,
        kind: &str,
        resource: &ApiResource,
        scope: Option<String>,
    ) -> Result<Part, WatchError> {
        let api = crate::watched::api(&self.inner.client, scope.as_deref(), resource);
        // A list of one proves the permission before a watch would retry a 403 forever.
        api.list_metadata(&ListParams::default().labels(INSTANCE_LABEL).limit(1)).await.map_err(|e| {
            WatchError::Forbidden {
                api_version: api_version.to_string(),
                kind: kind.to_string(),
                reason: match &scope {
                    Some(ns) => format!("in namespace {ns}: {e}"),
                    None => e.to_string(),
                },
            }
        })?;
        // Not kube's shared reflector: its subscriptions need a dynamic type with a Default,
        // which a discovered kind has not. Changes go out on `changes` instead, a broadcast
        // that never holds the watch back (a listener that falls behind gets `Relisted`).
        let writer: Writer<DynamicObject> = Writer::new(resource.clone());
        let store = writer.as_reader();
        let index = Arc::new(RwLock::new(Index::default()));
        let indexing = Arc::clone(&index);
        let changes = self.inner.changes.clone();
        let name = format!("{api_version} {kind}");
        let stream = watcher(api, watcher::Config::default().labels(INSTANCE_LABEL))
            .backoff(watch_backoff())
            // managedFields are never read from the cache and are often the larger part of a
            // child's metadata: dropped before caching, they do not cost memory per child.
            .modify(|child| child.meta_mut().managed_fields = None)
            .map(move |event| {
                if let Ok(event) = &event {
                    indexing.write().unwrap_or_else(PoisonError::into_inner).update(event);
                }
                event
            })
            .reflect(writer)
            .for_each(move |event| {
                match event {
                    // Sending fails only while no controller listens; nothing is lost then.
                    Ok(watcher::Event::InitDone) => drop(changes.send(ChildChange::Relisted)),
                    Ok(watcher::Event::Apply(child)) => {
                        drop(changes.send(ChildChange::Changed(Arc::new(child))))
                    }
                    Ok(watcher::Event::Delete(child)) => {
                        if let (Some(namespace), Some(instance)) =
                            (child.namespace(), child.labels().get(INSTANCE_LABEL).cloned())
                        {
                            drop(changes.send(ChildChange::Deleted { namespace, instance }));
                        }
                    }
                    Ok(_) => {}
                    Err(err) => tracing::warn!(kind = %name, error = %err, "child watch error; retrying"),
                }
                std::future::ready(())
            });
        tokio::spawn(stream);
        match tokio::time::timeout(SYNC_TIMEOUT, store.wait_until_ready()).await {
            Ok(Ok(())) => {}
            _ => {
                return Err(WatchError::NotSynced {
                    api_version: api_version.to_string(),
                    kind: kind.to_string(),
                })
            }
        }
        Ok(Part { namespace: scope, store, index })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<ChildKindKey, Arc<Cached>>> {
        self.inner.caches.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn cached(&self, api_version: &str, kind: &str) -> Option<Arc<Cached>> {
        self.read().get(&(api_version.to_string(), kind.to_string())).cloned()
    }

    /// The plural names of the kinds cached now (e.g. `statefulsets`), for `/debug`.
    pub fn plurals(&self) -> Vec<String> {
        self.read().values().map(|c| c.resource.plural.clone()).collect()
    }

    /// Every change from now on; a listener that fell behind gets `Relisted` instead of
    /// what it missed.
    pub fn changes(&self) -> impl futures::Stream<Item = ChildChange> + Send + 'static {
        futures::stream::unfold(self.inner.changes.subscribe(), |mut rx| async move {
            let change = match rx.recv().await {
                Ok(change) => change,
                Err(broadcast::error::RecvError::Lagged(_)) => ChildChange::Relisted,
                Err(broadcast::error::RecvError::Closed) => return None,
            };
            Some((change, rx))
        })
    }

    /// Resolves once every cache has listed; nothing may be written before that.
    pub async fn wait_until_synced(&self) -> Result<(), reflector::store::WriterDropped> {
        let stores: Vec<Store<DynamicObject>> =
            self.read().values().flat_map(|c| c.parts.iter().map(|p| p.store.clone())).collect();
        for store in stores {
            store.wait_until_ready().await?;
        }
        Ok(())
    }

    /// Every child of `namespace/name`, as JSON with apiVersion and kind, in a stable order
    /// (by kind, then name).
    pub fn observe(&self, namespace: &str, name: &str) -> Vec<Value> {
        let mut out = Vec::new();
        for cached in self.read().values() {
            collect(cached, namespace, name, &mut out);
        }
        out
    }

    /// The cached objects of a built-in kind that pass `filter`, as their typed struct.
    fn typed<K: Resource<DynamicType = ()> + serde::de::DeserializeOwned>(
        &self,
        filter: impl Fn(&DynamicObject) -> bool,
    ) -> Vec<Arc<K>> {
        let Some(cached) = self.cached(&K::api_version(&()), &K::kind(&())) else { return Vec::new() };
        cached
            .parts
            .iter()
            .flat_map(|p| p.store.state())
            .filter(|o| filter(o))
            .filter_map(|o| o.as_ref().clone().try_parse().ok().map(Arc::new))
            .collect()
    }

    pub fn secret(&self, namespace: &str, name: &str) -> Option<Arc<Secret>> {
        let cached = self.cached("v1", "Secret")?;
        let key = reflector::ObjectRef::new_with(name, cached.resource.clone()).within(namespace);
        cached.part(namespace)?.store.get(&key)?.as_ref().clone().try_parse().ok().map(Arc::new)
    }

    /// Every cached Secret (all carry the instance label).
    pub fn secrets(&self) -> Vec<Arc<Secret>> {
        self.typed(|_| true)
    }

    /// Every cached Service (all carry the instance label); none when no plugin owns Services.
    pub fn services(&self) -> Vec<Arc<Service>> {
        self.typed(|_| true)
    }

    /// The cached StatefulSets of `namespace` (all carry the instance label).
    pub fn statefulsets(&self, namespace: &str) -> Vec<Arc<StatefulSet>> {
        self.typed(|o| o.metadata.namespace.as_deref() == Some(namespace))
    }
}

/// Caches holding exactly the given children, with no watch behind them: for reconcile tests
/// against a mocked API server, which must see no child watch requests.
#[cfg(test)]
#[allow(clippy::panic)]
impl Children {
    /// `objects` are children as JSON with apiVersion and kind; each lands in its kind's cache.
    /// Secrets are cached even when there is none, as in a running operator.
    pub(crate) fn fixed(objects: &[Value]) -> Self {
        let client_config = kube::Config::new("http://127.0.0.1:9".parse().unwrap_or_default());
        let client = Client::try_from(client_config).unwrap_or_else(|e| panic!("a client: {e}"));
        let children = Self::new(&client, &Watched::All);
        let mut kinds: BTreeSet<ChildKindKey> =
            ALWAYS_CACHED.iter().map(|(a, k)| ((*a).to_string(), (*k).to_string())).collect();
        for o in objects {
            if let (Some(a), Some(k)) = (o["apiVersion"].as_str(), o["kind"].as_str()) {
                kinds.insert((a.to_string(), k.to_string()));
            }
        }
        for (api_version, kind) in kinds {
            let (group, version) = api_version.split_once('/').unwrap_or(("", api_version.as_str()));
            let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &kind));
            let mut writer: Writer<DynamicObject> = Writer::new(resource.clone());
            let mut index = Index::default();
            let mut events = vec![watcher::Event::Init];
            for o in objects
                .iter()
                .filter(|o| o["apiVersion"] == api_version.as_str() && o["kind"] == kind.as_str())
            {
                let object: DynamicObject =
                    serde_json::from_value(o.clone()).unwrap_or_else(|e| panic!("a child object: {e}"));
                events.push(watcher::Event::InitApply(object));
            }
            events.push(watcher::Event::InitDone);
            for event in &events {
                index.update(event);
                writer.apply_watcher_event(event);
            }
            let part =
                Part { namespace: None, store: writer.as_reader(), index: Arc::new(RwLock::new(index)) };
            let cached = Cached { resource, parts: vec![part] };
            children
                .inner
                .caches
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .insert((api_version, kind), Arc::new(cached));
        }
        children
    }
}

/// What a plugin sees of an observed child, as JSON text: everything, except that a Secret
/// shows its keys with empty values (and loses `last-applied-configuration`, which would
/// repeat them). Plugins name Secrets and keys; the host reads the values it needs itself.
pub fn plugin_view(child: &Value) -> String {
    if child["apiVersion"] != "v1" || child["kind"] != "Secret" {
        return child.to_string();
    }
    let mut secret = child.clone();
    for field in ["data", "stringData"] {
        if let Some(values) = secret.get_mut(field).and_then(Value::as_object_mut) {
            values.values_mut().for_each(|v| *v = Value::String(String::new()));
        }
    }
    if let Some(annotations) = secret.pointer_mut("/metadata/annotations").and_then(Value::as_object_mut) {
        annotations.remove(LAST_APPLIED);
    }
    secret.to_string()
}

/// `kubectl apply` keeps the whole object, Secret values included, in this annotation.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

fn collect(cached: &Cached, namespace: &str, name: &str, out: &mut Vec<Value>) {
    let Some(part) = cached.part(namespace) else { return };
    let names = part.index.read().unwrap_or_else(PoisonError::into_inner).names(namespace, name);
    // Sorted by name (the index keeps names ordered); the label is checked again on the cached
    // object itself, which may be newer than the index.
    let found = names.iter().filter_map(|child| {
        part.store
            .get(&reflector::ObjectRef::new_with(child, cached.resource.clone()).within(namespace))
            .filter(|o| o.labels().get(INSTANCE_LABEL).map(String::as_str) == Some(name))
    });
    for object in found {
        if let Ok(mut value) = serde_json::to_value(object.as_ref()) {
            // A dynamic object carries its type from the API; make sure of it all the same.
            value["apiVersion"] = Value::String(cached.resource.api_version.clone());
            value["kind"] = Value::String(cached.resource.kind.clone());
            out.push(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn child(ns: &str, name: &str, instance: Option<&str>) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.namespace = Some(ns.into());
        cm.metadata.name = Some(name.into());
        cm.metadata.labels = instance.map(|i| [(INSTANCE_LABEL.to_string(), i.to_string())].into());
        cm
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn plugins_see_secret_keys_never_values() {
        let secret = serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": "db-credentials", "annotations": {
                LAST_APPLIED: r#"{"data":{"password":"c2VjcmV0"}}"#, "keep": "me" } },
            "data": { "password": "c2VjcmV0", "username": "cG9zdGdyZXM=" },
            "stringData": { "token": "plain" },
        });
        let seen: Value = serde_json::from_str(&plugin_view(&secret)).unwrap();
        assert_eq!(seen["data"], serde_json::json!({ "password": "", "username": "" }));
        assert_eq!(seen["stringData"], serde_json::json!({ "token": "" }));
        assert_eq!(seen["metadata"]["annotations"], serde_json::json!({ "keep": "me" }));
        let text = plugin_view(&secret);
        assert!(!text.contains("c2VjcmV0") && !text.contains("plain"), "{text}");
        // Other kinds pass unchanged.
        let config = serde_json::json!({ "apiVersion": "v1", "kind": "ConfigMap", "data": { "a": "b" } });
        assert_eq!(plugin_view(&config), config.to_string());
    }

    #[test]
    fn the_index_follows_applies_relabels_deletes_and_relists() {
        let mut index = Index::default();
        index.update(&watcher::Event::Apply(child("a", "db-config", Some("db"))));
        index.update(&watcher::Event::Apply(child("a", "db-scripts", Some("db"))));
        index.update(&watcher::Event::Apply(child("b", "db-config", Some("db"))));
        assert_eq!(index.names("a", "db"), ["db-config", "db-scripts"]);
        assert_eq!(index.names("b", "db"), ["db-config"]);

        // Relabelled to another instance, then unlabelled: it moves, then goes.
        index.update(&watcher::Event::Apply(child("a", "db-scripts", Some("cache"))));
        assert_eq!(index.names("a", "db"), ["db-config"]);
        assert_eq!(index.names("a", "cache"), ["db-scripts"]);
        index.update(&watcher::Event::Apply(child("a", "db-scripts", None)));
        assert!(index.names("a", "cache").is_empty());

        index.update(&watcher::Event::Delete(child("a", "db-config", Some("db"))));
        assert!(index.names("a", "db").is_empty());

        // A relist replaces everything once it is done, not before.
        index.update::<ConfigMap>(&watcher::Event::Init);
        index.update(&watcher::Event::InitApply(child("c", "x", Some("y"))));
        assert_eq!(index.names("b", "db"), ["db-config"]);
        index.update::<ConfigMap>(&watcher::Event::InitDone);
        assert!(index.names("b", "db").is_empty());
        assert_eq!(index.names("c", "y"), ["x"]);
    }
}
