//! Shared reflector caches of every child kind, filtered to objects labelled
//! `stateward.dev/instance`, so observing a resource costs no API read.

use std::collections::{BTreeSet, HashMap};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::reflector::{self, store::Writer, ReflectHandle, Store};
use kube::runtime::utils::{Backoff, ResetTimerBackoff};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::broadcast;

/// The label every child carries: the name of the custom resource it belongs to.
pub const INSTANCE_LABEL: &str = "stateward.dev/instance";

/// One cache per child kind, plus a subscription per controller for change triggers.
#[derive(Clone)]
pub struct Children {
    statefulsets: Cached<StatefulSet>,
    services: Cached<Service>,
    configmaps: Cached<ConfigMap>,
    secrets: Cached<Secret>,
    pdbs: Cached<PodDisruptionBudget>,
    pvcs: Cached<PersistentVolumeClaim>,
    /// Where [`Children::triggers`] subscribes from; never handed out itself.
    sources: Sources,
    /// Relists and deletions, which the shared change streams do not carry (they only
    /// announce objects that exist), so that a deleted child is recreated at once.
    changes: broadcast::Sender<ChildChange>,
}

/// A change to the children that must make their owner reconcile.
#[derive(Clone, Debug)]
pub enum ChildChange {
    /// A watch finished a (re)list: after a gap, objects may have gone without a delete
    /// event, so every resource must be looked at again.
    Relisted,
    /// A child carrying `stateward.dev/instance=<instance>` was deleted.
    Deleted { namespace: String, instance: String },
}

/// One kind's cache and its index by instance.
struct Cached<K: Resource<DynamicType = ()> + Clone + 'static> {
    store: Store<K>,
    index: Arc<RwLock<Index>>,
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Clone for Cached<K> {
    fn clone(&self) -> Self {
        Self { store: self.store.clone(), index: Arc::clone(&self.index) }
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

/// Change streams of every child kind, one set per controller ([`Children::triggers`]).
pub struct Triggers {
    pub statefulsets: ReflectHandle<StatefulSet>,
    pub services: ReflectHandle<Service>,
    pub configmaps: ReflectHandle<ConfigMap>,
    pub secrets: ReflectHandle<Secret>,
    pub pdbs: ReflectHandle<PodDisruptionBudget>,
    pub pvcs: ReflectHandle<PersistentVolumeClaim>,
}

/// The subscription source of one shared child stream. A subscriber of kube's shared reflector
/// that stops reading holds the reflector back once the channel's 1024 slots are full, and the
/// cache then never changes again (found by benches/scale.rs: at 300 resources every
/// StatefulSet went ready while the operator kept seeing 0 ready pods). So the source receiver
/// is read by a task of its own that drops what it reads, and each controller gets a clone made
/// from it, which starts at the source's position.
#[derive(Clone)]
struct Source<K>(Arc<Mutex<Pin<Box<ReflectHandle<K>>>>>)
where
    K: Resource<DynamicType = ()> + Clone + 'static;

impl<K> Source<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    fn new(handle: ReflectHandle<K>) -> Self {
        let source = Source(Arc::new(Mutex::new(Box::pin(handle))));
        let drained = source.clone();
        tokio::spawn(async move {
            // kube's handle answers Pending without a wake-up when the announced object was
            // deleted meanwhile; the tick polls again so the source never stays behind.
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                let next = futures::future::poll_fn(|cx| futures::Stream::poll_next(drained.lock().as_mut(), cx));
                tokio::select! {
                    item = next => if item.is_none() { return },
                    _ = tick.tick() => {}
                }
            }
        });
        source
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pin<Box<ReflectHandle<K>>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn subscribe(&self) -> ReflectHandle<K> {
        self.lock().as_ref().get_ref().clone()
    }
}

#[derive(Clone)]
struct Sources {
    statefulsets: Source<StatefulSet>,
    services: Source<Service>,
    configmaps: Source<ConfigMap>,
    secrets: Source<Secret>,
    pdbs: Source<PodDisruptionBudget>,
    pvcs: Source<PersistentVolumeClaim>,
}

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Starts one watch per kind; the streams retry with backoff forever and never end on error.
fn start<K>(
    client: &Client,
    namespace: Option<&str>,
    changes: &broadcast::Sender<ChildChange>,
) -> (Cached<K>, ReflectHandle<K>)
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer): (Store<K>, Writer<K>) = reflector::store_shared(1024);
    let handle = writer
        .subscribe()
        .expect("store_shared always gives a subscribable writer");
    let config = watcher::Config::default().labels(INSTANCE_LABEL);
    let changes = changes.clone();
    let index = Arc::new(RwLock::new(Index::default()));
    let indexing = Arc::clone(&index);
    let stream = watcher(api::<K>(client, namespace), config)
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
        .reflect_shared(writer)
        .for_each(move |event| {
            match event {
                // Sending fails only while no controller listens; nothing is lost then.
                Ok(watcher::Event::InitDone) => drop(changes.send(ChildChange::Relisted)),
                Ok(watcher::Event::Delete(child)) => {
                    if let (Some(namespace), Some(instance)) =
                        (child.namespace(), child.labels().get(INSTANCE_LABEL).cloned())
                    {
                        drop(changes.send(ChildChange::Deleted { namespace, instance }));
                    }
                }
                Ok(_) => {}
                Err(err) => {
                    tracing::warn!(kind = std::any::type_name::<K>(), error = %err, "child watch error; retrying")
                }
            }
            std::future::ready(())
        });
    tokio::spawn(stream);
    (Cached { store, index }, handle)
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
    pub fn start(client: &Client, namespace: Option<&str>) -> Self {
        let (changes, _) = broadcast::channel(1024);
        let (statefulsets, t1) = start(client, namespace, &changes);
        let (services, t2) = start(client, namespace, &changes);
        let (configmaps, t3) = start(client, namespace, &changes);
        let (secrets, t4) = start(client, namespace, &changes);
        let (pdbs, t5) = start(client, namespace, &changes);
        let (pvcs, t6) = start(client, namespace, &changes);
        Self {
            changes,
            statefulsets,
            services,
            configmaps,
            secrets,
            pdbs,
            pvcs,
            sources: Sources {
                statefulsets: Source::new(t1),
                services: Source::new(t2),
                configmaps: Source::new(t3),
                secrets: Source::new(t4),
                pdbs: Source::new(t5),
                pvcs: Source::new(t6),
            },
        }
    }

    /// Fresh subscriptions to every child kind's changes, for one controller: it must keep
    /// reading them (a kube Controller does) or drop them.
    pub fn triggers(&self) -> Triggers {
        let s = &self.sources;
        Triggers {
            statefulsets: s.statefulsets.subscribe(),
            services: s.services.subscribe(),
            configmaps: s.configmaps.subscribe(),
            secrets: s.secrets.subscribe(),
            pdbs: s.pdbs.subscribe(),
            pvcs: s.pvcs.subscribe(),
        }
    }

    /// Every change from now on; a listener that fell behind gets `Relisted` instead of
    /// what it missed.
    pub fn changes(&self) -> impl futures::Stream<Item = ChildChange> + Send + 'static {
        futures::stream::unfold(self.changes.subscribe(), |mut rx| async move {
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
        self.statefulsets.store.wait_until_ready().await?;
        self.services.store.wait_until_ready().await?;
        self.configmaps.store.wait_until_ready().await?;
        self.secrets.store.wait_until_ready().await?;
        self.pdbs.store.wait_until_ready().await?;
        self.pvcs.store.wait_until_ready().await
    }

    /// Every child of `namespace/name`, as JSON with apiVersion and kind, in a stable order.
    pub fn observe(&self, namespace: &str, name: &str) -> Vec<Value> {
        let mut out = Vec::new();
        collect(&self.statefulsets, namespace, name, &mut out);
        collect(&self.services, namespace, name, &mut out);
        collect(&self.configmaps, namespace, name, &mut out);
        collect(&self.secrets, namespace, name, &mut out);
        collect(&self.pdbs, namespace, name, &mut out);
        collect(&self.pvcs, namespace, name, &mut out);
        out
    }

    pub fn secret(&self, namespace: &str, name: &str) -> Option<Arc<Secret>> {
        self.secrets
            .store
            .get(&reflector::ObjectRef::new(name).within(namespace))
    }
}

fn collect<K>(cached: &Cached<K>, namespace: &str, name: &str, out: &mut Vec<Value>)
where
    K: Resource<DynamicType = ()> + Clone + Serialize + 'static,
{
    let names = cached.index.read().unwrap_or_else(PoisonError::into_inner).names(namespace, name);
    // Sorted by name (the index keeps names ordered); the label is checked again on the cached
    // object itself, which may be newer than the index.
    let found = names.iter().filter_map(|child| {
        cached
            .store
            .get(&reflector::ObjectRef::new(child).within(namespace))
            .filter(|o| o.labels().get(INSTANCE_LABEL).map(String::as_str) == Some(name))
    });
    for object in found {
        if let Ok(mut value) = serde_json::to_value(object.as_ref()) {
            // k8s-openapi omits apiVersion/kind on the typed struct's serialisation only when
            // constructed by hand; objects from the API carry them, but make sure.
            value["apiVersion"] = Value::String(K::api_version(&()).to_string());
            value["kind"] = Value::String(K::kind(&()).to_string());
            out.push(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn child(ns: &str, name: &str, instance: Option<&str>) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.namespace = Some(ns.into());
        cm.metadata.name = Some(name.into());
        cm.metadata.labels = instance.map(|i| [(INSTANCE_LABEL.to_string(), i.to_string())].into());
        cm
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
