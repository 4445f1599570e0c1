//! Shared reflector caches of every child kind, filtered to objects labelled
//! `stateward.dev/instance`, so observing a resource costs no API read.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
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
    pub statefulsets: Store<StatefulSet>,
    pub services: Store<Service>,
    pub configmaps: Store<ConfigMap>,
    pub secrets: Store<Secret>,
    pub pdbs: Store<PodDisruptionBudget>,
    pub pvcs: Store<PersistentVolumeClaim>,
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
) -> (Store<K>, ReflectHandle<K>)
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
    let stream = watcher(api::<K>(client, namespace), config)
        .backoff(watch_backoff())
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
    (store, handle)
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
        self.statefulsets.wait_until_ready().await?;
        self.services.wait_until_ready().await?;
        self.configmaps.wait_until_ready().await?;
        self.secrets.wait_until_ready().await?;
        self.pdbs.wait_until_ready().await?;
        self.pvcs.wait_until_ready().await
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
            .get(&reflector::ObjectRef::new(name).within(namespace))
    }
}

fn collect<K>(store: &Store<K>, namespace: &str, name: &str, out: &mut Vec<Value>)
where
    K: Resource<DynamicType = ()> + Clone + Serialize + 'static,
{
    let mut found: Vec<Arc<K>> = store
        .state()
        .into_iter()
        .filter(|o| o.namespace().as_deref() == Some(namespace))
        .filter(|o| o.labels().get(INSTANCE_LABEL).map(String::as_str) == Some(name))
        .collect();
    found.sort_by_key(|o| o.name_any());
    for object in found {
        if let Ok(mut value) = serde_json::to_value(object.as_ref()) {
            // k8s-openapi omits apiVersion/kind on the typed struct's serialisation only when
            // constructed by hand; objects from the API carry them, but make sure.
            value["apiVersion"] = Value::String(K::api_version(&()).to_string());
            value["kind"] = Value::String(K::kind(&()).to_string());
            if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.remove("managedFields");
            }
            out.push(value);
        }
    }
}
