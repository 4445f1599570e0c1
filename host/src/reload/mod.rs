//! Hot reload from ConfigMaps in the operator's namespace (docs/architecture.md, The three
//! decision points and Threat model): plugin builds (`stateward.dev/plugin=<name>`) and the
//! policy bundle (`stateward.dev/policy=true`).
//!
//! A new build or bundle is vetted completely before it replaces anything; any failure keeps
//! the previous one serving and says why (a Warning Event on the ConfigMap, a failure metric,
//! `/debug/plugins` or `/debug/healthz`). Every replica reloads, so a standby that takes over
//! serves the same plugins; only the leader publishes Events.

pub mod announce;
pub mod plugins;
pub mod policy;

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::events::EventType;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::{broadcast, watch};

use self::announce::{Announcement, Announcer};
use crate::policy::{Bundle, LiveGate, PolicyEngine};
use crate::runtime::{LiveRegistry, Plugin, Sandbox};
use crate::telemetry::{DebugState, Metrics};

/// What changed, for the controllers: requeue every resource of these kinds once; new kinds
/// (a plugin new to this operator) need controllers started.
#[derive(Debug, Clone)]
pub enum Swap {
    Plugin { kinds: Vec<(String, String)>, new_kinds: bool },
    Policy,
}

/// Everything the reloaders share.
#[derive(Clone)]
pub struct Reloader {
    pub client: Client,
    /// The child caches: a build's owned kinds are added before it serves.
    pub children: crate::children::Children,
    /// The operator's own namespace, where the ConfigMaps live.
    pub namespace: String,
    pub sandbox: Arc<Sandbox>,
    pub registry: Arc<LiveRegistry>,
    pub gate: Arc<LiveGate>,
    pub metrics: Metrics,
    pub debug: DebugState,
    /// Events on the ConfigMaps, from the leader only, owed until they are out.
    pub announcer: Arc<Announcer>,
    pub swaps: broadcast::Sender<Swap>,
}

impl Reloader {
    /// Starts both watches; the returned receiver turns true once both have applied what the
    /// first list found, so controllers start on the configured plugins and policy.
    pub fn spawn(self) -> watch::Receiver<bool> {
        let (synced_tx, synced_rx) = watch::channel(false);
        let (plugins_synced, policy_synced) = (watch::channel(false), watch::channel(false));
        tokio::spawn(self.clone().watch_plugins(plugins_synced.0));
        tokio::spawn(self.clone().watch_policy(policy_synced.0));
        tokio::spawn(Arc::clone(&self.announcer).run());
        tokio::spawn(async move {
            let (mut a, mut b) = (plugins_synced.1, policy_synced.1);
            let _ = a.wait_for(|s| *s).await;
            let _ = b.wait_for(|s| *s).await;
            let _ = synced_tx.send(true);
        });
        self.publish_plugins(&BTreeMap::new());
        synced_rx
    }

    fn configmaps(
        &self,
        label: &str,
    ) -> impl futures::Stream<Item = Result<watcher::Event<ConfigMap>, watcher::Error>> + Send {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        watcher(api, watcher::Config::default().labels(label)).default_backoff()
    }

    async fn watch_plugins(self, synced: watch::Sender<bool>) {
        // ConfigMap name → (plugin name, digest) of what it last delivered, accepted or not.
        let mut seen: BTreeMap<String, (String, String)> = BTreeMap::new();
        // Plugin name → the ConfigMap whose build serves it.
        let mut active: BTreeMap<String, String> = BTreeMap::new();
        let mut rejected: BTreeMap<String, plugins::Rejection> = BTreeMap::new();
        let mut listing: Option<Vec<String>> = None;
        let mut events = std::pin::pin!(self.configmaps(plugins::PLUGIN_LABEL));
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Init) => listing = Some(Vec::new()),
                Ok(watcher::Event::InitApply(cm)) | Ok(watcher::Event::Apply(cm)) => {
                    if let Some(l) = listing.as_mut() {
                        l.push(cm.name_any());
                    }
                    self.plugin_configmap(&cm, &mut seen, &mut active, &mut rejected).await;
                }
                Ok(watcher::Event::Delete(cm)) => {
                    self.plugin_configmap_gone(&cm.name_any(), &mut seen, &mut active, &mut rejected)
                }
                Ok(watcher::Event::InitDone) => {
                    let present = listing.take().unwrap_or_default();
                    let gone: Vec<String> = seen.keys().filter(|n| !present.contains(n)).cloned().collect();
                    for name in gone {
                        self.plugin_configmap_gone(&name, &mut seen, &mut active, &mut rejected);
                    }
                    let _ = synced.send(true);
                }
                Err(err) => tracing::warn!(error = %err, "watching plugin ConfigMaps"),
            }
        }
    }

    async fn plugin_configmap(
        &self,
        cm: &ConfigMap,
        seen: &mut BTreeMap<String, (String, String)>,
        active: &mut BTreeMap<String, String>,
        rejected: &mut BTreeMap<String, plugins::Rejection>,
    ) {
        let cm_name = cm.name_any();
        let name = cm.labels().get(plugins::PLUGIN_LABEL).cloned().unwrap_or_default();
        // The annotation and the shipped bytes' own digest: any change to either is vetted again.
        let shipped = plugins::shipped(cm)
            .map_or_else(|_| String::new(), |(key, bytes)| format!("{key} {}", plugins::digest_of(bytes)));
        let fingerprint = (
            name.clone(),
            format!(
                "{} {shipped}",
                cm.annotations().get(plugins::DIGEST_ANNOTATION).map_or("", String::as_str)
            ),
        );
        if seen.get(&cm_name) == Some(&fingerprint) {
            return; // a relist or a metadata-only change: nothing new to load
        }
        seen.insert(cm_name.clone(), fingerprint);
        let started = std::time::Instant::now();
        let (cm2, sandbox, gate, registry) =
            (cm.clone(), Arc::clone(&self.sandbox), self.gate.current(), Arc::clone(&self.registry));
        let vetted = tokio::task::spawn_blocking(move || plugins::vet(&cm2, &sandbox, &gate, &registry))
            .await
            .unwrap_or_else(|e| {
                Err(plugins::Rejection { plugin: name.clone(), reason: "internal", message: e.to_string() })
            });
        // The kinds it owns must be cached (known to the API server, namespaced, listable)
        // before it may plan for them.
        let vetted = match vetted {
            Ok(plugin) => match self.children.ensure(owned_kinds(&plugin)).await {
                Ok(added) => Ok((plugin, added)),
                Err(e) => Err(plugins::Rejection {
                    plugin: plugin.name().to_string(),
                    reason: "unwatchable_kind",
                    message: e.to_string(),
                }),
            },
            Err(rejection) => Err(rejection),
        };
        // /debug/plugins says what came of the build as soon as it is counted, before its Event
        // (an API call, slow on a busy machine).
        let (kind, reason, message) = match vetted {
            Ok((plugin, new_child_kinds)) => {
                rejected.remove(&cm_name);
                active.insert(plugin.name().to_string(), cm_name.clone());
                self.swap(Arc::new(plugin), &cm_name, started.elapsed(), new_child_kinds);
                let key = plugins::shipped(cm).map_or(plugins::WASM_KEY, |(key, _)| key);
                (EventType::Normal, "PluginLoaded", format!("loaded from binaryData[\"{key}\"]"))
            }
            Err(rejection) => {
                tracing::warn!(configmap = %cm_name, plugin = %rejection.plugin, reason = rejection.reason, message = %rejection.message, "plugin rejected; the previous build keeps serving");
                self.metrics.plugin_load_failure(&rejection.plugin, rejection.reason);
                let message =
                    format!("{}: {}; the previous build keeps serving", rejection.reason, rejection.message);
                rejected.insert(cm_name, rejection);
                (EventType::Warning, "PluginRejected", message)
            }
        };
        self.publish_plugins(rejected);
        self.event(cm, kind, reason, &message).await;
    }

    /// Serves `plugin` from now on; the controllers restart when it brings kinds (its own or
    /// child kinds) they do not watch yet.
    fn swap(&self, plugin: Arc<Plugin>, cm_name: &str, took: std::time::Duration, new_child_kinds: bool) {
        let new_kinds = self.registry.by_name(plugin.name()).is_none() || new_child_kinds;
        let kinds = plugin.info().kinds.iter().map(|k| (k.group.clone(), k.kind.clone())).collect();
        self.metrics.plugin_loaded(plugin.name(), plugin.version(), plugin.digest());
        tracing::info!(
            plugin = plugin.name(),
            version = plugin.version(),
            digest = plugin.digest(),
            configmap = cm_name,
            vet_ms = took.as_millis() as u64,
            compiler = plugin.compiler().as_str(),
            compile_ms = plugin.compile_time().as_millis() as u64,
            functions_compiled = plugin.compile_reuse().compiled,
            functions_reused = plugin.compile_reuse().reused,
            "plugin swapped in"
        );
        self.registry.set_override(plugin);
        let _ = self.swaps.send(Swap::Plugin { kinds, new_kinds });
    }

    fn plugin_configmap_gone(
        &self,
        cm_name: &str,
        seen: &mut BTreeMap<String, (String, String)>,
        active: &mut BTreeMap<String, String>,
        rejected: &mut BTreeMap<String, plugins::Rejection>,
    ) {
        rejected.remove(cm_name);
        seen.remove(cm_name);
        self.announcer.forget(&format!("plugin/{cm_name}"));
        // Only the ConfigMap whose build serves matters; a rejected one going changes nothing.
        let Some(name) = active.iter().find(|(_, cm)| *cm == cm_name).map(|(n, _)| n.clone()) else {
            return self.publish_plugins(rejected);
        };
        active.remove(&name);
        if self.registry.remove_override(&name) {
            if let Some(builtin) = self.registry.builtin(&name) {
                self.metrics.plugin_loaded(builtin.name(), builtin.version(), builtin.digest());
                let kinds = builtin.info().kinds.iter().map(|k| (k.group.clone(), k.kind.clone())).collect();
                tracing::info!(plugin = %name, configmap = cm_name, "plugin ConfigMap deleted; the built-in build serves again");
                let _ = self.swaps.send(Swap::Plugin { kinds, new_kinds: false });
            }
        } else if self.registry.overridden().contains(&name) {
            tracing::warn!(plugin = %name, configmap = cm_name, "plugin ConfigMap deleted but no built-in build exists; the loaded build keeps serving");
        }
        self.publish_plugins(rejected);
    }

    /// `/debug/plugins`: what serves, where it came from, and the latest rejection per ConfigMap.
    fn publish_plugins(&self, rejected: &BTreeMap<String, plugins::Rejection>) {
        let overridden = self.registry.overridden();
        let mut list: Vec<serde_json::Value> = self
            .registry
            .snapshot()
            .plugins()
            .iter()
            .map(|p| {
                json!({"name": p.name(), "version": p.version(), "digest": format!("sha256:{}", p.digest()),
                "source": if overridden.iter().any(|n| n == p.name()) { "configmap" } else { "builtin" },
                "kinds": p.info().kinds.iter().map(|k| &k.kind).collect::<Vec<_>>()})
            })
            .collect();
        for (cm, r) in rejected {
            list.push(json!({"name": r.plugin, "configMap": cm, "rejected": {"reason": r.reason, "message": r.message}}));
        }
        self.debug.set_plugins(serde_json::Value::Array(list));
    }

    async fn watch_policy(self, synced: watch::Sender<bool>) {
        let mut current: BTreeMap<String, ConfigMap> = BTreeMap::new();
        let mut listing: Option<BTreeMap<String, ConfigMap>> = None;
        let mut events = std::pin::pin!(self.configmaps(&format!("{}=true", policy::POLICY_LABEL)));
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Init) => listing = Some(BTreeMap::new()),
                Ok(watcher::Event::InitApply(cm)) => {
                    listing.get_or_insert_with(BTreeMap::new).insert(cm.name_any(), cm);
                }
                Ok(watcher::Event::InitDone) => {
                    current = listing.take().unwrap_or_default();
                    self.apply_policy(&current).await;
                    let _ = synced.send(true);
                }
                Ok(watcher::Event::Apply(cm)) => {
                    current.insert(cm.name_any(), cm);
                    self.apply_policy(&current).await;
                }
                Ok(watcher::Event::Delete(cm)) => {
                    current.remove(&cm.name_any());
                    self.announcer.forget(&format!("policy/{}", cm.name_any()));
                    self.apply_policy(&current).await;
                }
                Err(err) => tracing::warn!(error = %err, "watching policy ConfigMaps"),
            }
        }
    }

    async fn apply_policy(&self, configmaps: &BTreeMap<String, ConfigMap>) {
        // The ConfigMaps' bundle is a layer over the floor (the bundle the operator started
        // with, crate::policy::floor); none means the floor alone.
        let bundle = match policy::bundle_of(configmaps) {
            Ok(bundle) => bundle,
            Err(rejection) => return self.policy_rejected(configmaps, rejection).await,
        };
        let current = self.gate.current().layer().map(|l| l.digest().to_string());
        if bundle.as_ref().map(Bundle::digest) == current.as_deref() {
            return;
        }
        let Some(bundle) = bundle else {
            return self.policy_swapped(configmaps, None).await;
        };
        // Awaited with a timeout: a bundle that outlasts it is refused (its evaluations are
        // bounded each, so the blocking thread ends soon after).
        let checking = tokio::task::spawn_blocking(move || policy::vet(&bundle));
        let vetted = match tokio::time::timeout(policy::VET_TIMEOUT, checking).await {
            Ok(joined) => joined.unwrap_or_else(|e| {
                Err(policy::BundleRejection { reason: "internal", message: e.to_string() })
            }),
            Err(_) => Err(policy::BundleRejection {
                reason: "timeout",
                message: format!("checking the bundle took over {:?}", policy::VET_TIMEOUT),
            }),
        };
        match vetted {
            Ok(engine) => self.policy_swapped(configmaps, Some(Arc::new(engine))).await,
            Err(rejection) => self.policy_rejected(configmaps, rejection).await,
        }
    }

    /// Puts `layer` over the floor (none: the floor alone) and says so.
    async fn policy_swapped(
        &self,
        configmaps: &BTreeMap<String, ConfigMap>,
        layer: Option<Arc<PolicyEngine>>,
    ) {
        let gate = self.gate.current().with_layer(layer);
        let digest = gate.digest().to_string();
        self.gate.replace(gate);
        self.debug.set_policy(&digest);
        self.debug.set_policy_rejection(None);
        self.metrics.policy_bundle_loaded(&digest);
        tracing::info!(bundle = %digest, configmaps = %policy::names(configmaps), "policy bundle swapped in");
        for cm in configmaps.values() {
            self.event(cm, EventType::Normal, "PolicyLoaded", &format!("bundle {digest} is in force")).await;
        }
        let _ = self.swaps.send(Swap::Policy);
    }

    async fn policy_rejected(
        &self,
        configmaps: &BTreeMap<String, ConfigMap>,
        rejection: policy::BundleRejection,
    ) {
        let active = self.gate.current().digest().to_string();
        tracing::warn!(reason = rejection.reason, message = %rejection.message, active = %active, "policy bundle rejected; the last good bundle stays in force");
        self.metrics.policy_bundle_failure(rejection.reason);
        self.debug
            .set_policy_rejection(Some(json!({"reason": rejection.reason, "message": rejection.message})));
        for cm in configmaps.values() {
            let note = format!("{}: {}; bundle {active} stays in force", rejection.reason, rejection.message);
            self.event(cm, EventType::Warning, "PolicyRejected", &note).await;
        }
    }

    /// An Event on the ConfigMap, from the leader only: a standby owes it until it leads
    /// (reason `Plugin…` or `Policy…`; the newer of each about one ConfigMap supersedes).
    async fn event(&self, cm: &ConfigMap, type_: EventType, reason: &str, note: &str) {
        let family = if reason.starts_with("Policy") { "policy" } else { "plugin" };
        let announcement = Announcement {
            reference: cm.object_ref(&()),
            type_,
            reason: reason.to_string(),
            note: note.to_string(),
        };
        self.announcer.announce(&format!("{family}/{}", cm.name_any()), announcement).await;
    }
}

/// The child kinds a plugin owns, as the caches key them.
pub fn owned_kinds(plugin: &Plugin) -> Vec<(String, String)> {
    plugin.info().owns.iter().map(|c| (c.api_version.clone(), c.kind.clone())).collect()
}
