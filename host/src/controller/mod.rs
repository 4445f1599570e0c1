//! The generic controller: one kube-rs Controller per plugin-declared kind, all sharing the
//! child caches, the sandbox, the policy gate and the metrics. The host knows nothing about
//! any one service; everything service-specific comes from the plugin.

mod apply;
mod backoff;
mod children;
mod claims;
mod error;
pub(crate) mod events;
mod reconcile;
mod status;
pub mod sweep;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::controller::{Action as Requeue, Config as ControllerConfig, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;

pub use apply::{APPLIED_HASH, FIELD_MANAGER};
pub use children::INSTANCE_LABEL;
pub use error::Error;

use crate::leader::{self, LeaderConfig, Leadership};
use crate::policy::{Bundle, LiveGate};
use crate::reload::{Reloader, Swap};
use crate::runtime::{LiveRegistry, Plugin, Registry, Sandbox};
use crate::telemetry::{DebugState, Metrics};

/// The finalizer that guards every managed resource until its plugin says cleanup is done.
pub const FINALIZER: &str = "stateward.dev/cleanup";

/// How `stateward run` was asked to behave.
pub struct Settings {
    /// Watch only this namespace (needs only a namespaced Role); all namespaces when `None`.
    pub namespace: Option<String>,
    pub http_addr: SocketAddr,
    pub leader: LeaderConfig,
    /// Reconciles running at once per kind.
    pub concurrency: u16,
    /// How often the audit sweep re-evaluates every resource against the admission policy.
    pub sweep_interval: Duration,
    /// The bundle that serves when no policy ConfigMap exists (hot reload falls back to it).
    pub shipped_bundle: Bundle,
}

/// A kind served by a plugin: how to reach it in the API and which plugin serves it now.
pub struct KindBinding {
    pub group: String,
    pub kind: String,
    pub api_resource: ApiResource,
    /// The build that served when the controller started, should the registry lose the kind.
    started_with: Arc<Plugin>,
}

/// Everything one reconcile needs; shared by all reconciles of a kind.
pub struct Context {
    pub client: Client,
    pub kind: Arc<KindBinding>,
    children: children::Children,
    sandbox: Arc<Sandbox>,
    registry: Arc<LiveRegistry>,
    gate: Arc<LiveGate>,
    metrics: Metrics,
    events: events::Events,
    findings: sweep::Findings,
    claims: claims::NameClaims,
    applier: Arc<apply::Applier>,
    backoff: backoff::Backoff,
    leadership: Leadership,
}

impl Context {
    /// The plugin serving this kind right now; a reconcile keeps the one it started with.
    pub fn plugin(&self) -> Arc<Plugin> {
        self.registry
            .get(&self.kind.group, &self.kind.kind)
            .unwrap_or_else(|| Arc::clone(&self.kind.started_with))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("HTTP server on {addr}: {source}")]
    Http { addr: SocketAddr, source: std::io::Error },
    #[error("child caches never synced: {0}")]
    Sync(String),
    #[error("plugin {plugin} declares kind {kind} without a storage version")]
    NoStorageVersion { plugin: String, kind: String },
}

/// Runs until SIGTERM/SIGINT; losing leadership stops the controllers until it is won back.
pub async fn run(
    client: Client,
    sandbox: Arc<Sandbox>,
    registry: Arc<LiveRegistry>,
    gate: Arc<LiveGate>,
    settings: Settings,
) -> Result<(), RunError> {
    let metrics = Metrics::new();
    let debug = DebugState::default();
    debug.set_policy(gate.current().engine().digest());
    metrics.policy_bundle_loaded(gate.current().engine().digest());
    for p in registry.snapshot().plugins() {
        metrics.plugin_loaded(p.name(), p.version(), p.digest());
    }

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutdown requested");
        let _ = stop_tx.send(true);
    });

    let listener = tokio::net::TcpListener::bind(settings.http_addr)
        .await
        .map_err(|source| RunError::Http { addr: settings.http_addr, source })?;
    tokio::spawn(crate::telemetry::http::serve_listener(listener, metrics.clone(), debug.clone(), stopped()));

    let (mut leadership, leader_task) = leader::spawn(client.clone(), settings.leader.clone(), stopped());
    let (swaps, _) = tokio::sync::broadcast::channel(64);
    let reloader = Reloader {
        client: client.clone(),
        namespace: settings.leader.namespace.clone(),
        sandbox: Arc::clone(&sandbox),
        registry: Arc::clone(&registry),
        gate: Arc::clone(&gate),
        shipped_bundle: settings.shipped_bundle.clone(),
        metrics: metrics.clone(),
        debug: debug.clone(),
        leadership: leadership.clone(),
        events: Arc::new(events::Publisher::new(client.clone(), &settings.leader.identity)),
        swaps: swaps.clone(),
    };
    let mut reloaded = reloader.spawn();

    // Caches are reads: every replica keeps them warm so a takeover starts at once.
    let children = children::Children::start(&client, settings.namespace.as_deref());
    tokio::select! {
        synced = children.wait_until_synced() => synced.map_err(|e| RunError::Sync(e.to_string()))?,
        _ = stopped() => return Ok(()),
    }
    for watch in ["statefulsets", "services", "configmaps", "secrets", "poddisruptionbudgets", "persistentvolumeclaims"] {
        debug.set_watch(watch, true);
    }
    // Controllers start on the plugins and policy the ConfigMaps ask for, not the built-ins.
    tokio::select! {
        _ = reloaded.wait_for(|s| *s) => {}
        _ = stopped() => return Ok(()),
    }
    debug.set_watch("reload-configmaps", true);
    debug.set_ready(true);

    let applier = Arc::new(apply::Applier::new(client.clone()));
    let shared = Shared { client, children, sandbox, registry, gate, metrics, applier, leadership: leadership.clone(), swaps };
    // Lead while we hold the Lease; when it is lost (e.g. the API server was unreachable past
    // the renew deadline) stop every controller before campaigning again, so that there is
    // never a moment with two writers, and never exit for it. A plugin that brings new kinds
    // restarts the controllers so the new kinds get theirs.
    let mut leading = false;
    loop {
        if !leading {
            tracing::info!(identity = %settings.leader.identity, "waiting for leadership");
            tokio::select! {
                _ = leadership.acquired() => {}
                _ = stopped() => break,
            }
            debug.set_leader(true);
            tracing::info!("became leader");
        }
        let tasks = start_controllers(&shared, &settings, &debug, &stopped)?;
        let lost = async {
            loop {
                match leadership.changed().await {
                    Some(false) | None => return,
                    Some(true) => {}
                }
            }
        };
        let mut swaps = shared.swaps.subscribe();
        let new_kinds = async move {
            loop {
                match swaps.recv().await {
                    Ok(Swap::Plugin { new_kinds: true, .. }) => return,
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
                }
            }
        };
        enum Next { Stop, Lost, Restart }
        let next = tokio::select! {
            _ = stopped() => Next::Stop,
            _ = lost => Next::Lost,
            _ = new_kinds => Next::Restart,
        };
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            let _ = task.await;
        }
        match next {
            Next::Stop => break,
            Next::Restart => {
                tracing::info!("a plugin brought new kinds; restarting the controllers");
                leading = true;
            }
            Next::Lost => {
                debug.set_leader(false);
                leading = false;
                tracing::warn!("lost leadership; controllers stopped, campaigning again");
            }
        }
    }
    debug.set_leader(false);
    debug.set_ready(false);
    let _ = tokio::time::timeout(Duration::from_secs(5), leader_task).await;
    Ok(())
}

/// What every kind's controller shares.
struct Shared {
    client: Client,
    children: children::Children,
    sandbox: Arc<Sandbox>,
    registry: Arc<LiveRegistry>,
    gate: Arc<LiveGate>,
    metrics: Metrics,
    applier: Arc<apply::Applier>,
    leadership: Leadership,
    swaps: tokio::sync::broadcast::Sender<Swap>,
}

/// Starts one controller per plugin-declared kind.
fn start_controllers<S, F>(
    shared: &Shared,
    settings: &Settings,
    debug: &DebugState,
    stopped: &S,
) -> Result<Vec<tokio::task::JoinHandle<()>>, RunError>
where
    S: Fn() -> F,
    F: std::future::Future<Output = ()> + Send + Sync + 'static,
{
    let registry: Registry = shared.registry.snapshot();
    let claims = claims::NameClaims::default();
    let mut built = Vec::new();
    for plugin in registry.plugins() {
        for kind in &plugin.info().kinds {
            let storage = kind.storage_version().ok_or_else(|| RunError::NoStorageVersion {
                plugin: plugin.name().to_string(),
                kind: kind.kind.clone(),
            })?;
            let gvk = GroupVersionKind::gvk(&kind.group, &storage.name, &kind.kind);
            let api_resource = ApiResource::from_gvk_with_plural(&gvk, &kind.plural);
            let binding = Arc::new(KindBinding {
                group: kind.group.clone(),
                kind: kind.kind.clone(),
                api_resource: api_resource.clone(),
                started_with: Arc::clone(&plugin),
            });
            let ctx = Arc::new(Context {
                client: shared.client.clone(),
                kind: binding,
                children: shared.children.clone(),
                sandbox: Arc::clone(&shared.sandbox),
                registry: Arc::clone(&shared.registry),
                gate: Arc::clone(&shared.gate),
                metrics: shared.metrics.clone(),
                events: events::Events::new(shared.client.clone(), &settings.leader.identity, api_resource.clone()),
                findings: sweep::Findings::default(),
                claims: claims.clone(),
                applier: Arc::clone(&shared.applier),
                backoff: backoff::Backoff::default(),
                leadership: shared.leadership.clone(),
            });
            debug.set_watch(&kind.plural, true);
            let api: Api<DynamicObject> = match &settings.namespace {
                Some(ns) => Api::namespaced_with(shared.client.clone(), ns, &api_resource),
                None => Api::all_with(shared.client.clone(), &api_resource),
            };
            let watching = Controller::new_with(api, watcher::Config::default(), api_resource.clone());
            claims.add(&kind.kind, api_resource, watching.store());
            let triggers = Triggers::new(&shared.swaps, &kind.group, &kind.kind);
            built.push((ctx, watching, triggers));
        }
    }
    // Every kind's cache is in the claims before the first reconcile asks who holds a name.
    Ok(built
        .into_iter()
        .map(|(ctx, watching, triggers)| {
            tokio::spawn(controller(ctx, watching, settings.concurrency, settings.sweep_interval, triggers, stopped()))
        })
        .collect())
}

/// Reasons to look at every resource of a kind again, from outside its watches.
struct Triggers {
    /// A new plugin build for this kind: requeue every resource once.
    plugin_swapped: futures::stream::BoxStream<'static, ()>,
    /// A new policy bundle: sweep, and requeue everything once (the guardrails changed).
    policy_swapped: futures::stream::BoxStream<'static, ()>,
    policy_swapped_for_sweep: futures::stream::BoxStream<'static, ()>,
}

impl Triggers {
    fn new(swaps: &tokio::sync::broadcast::Sender<Swap>, group: &str, kind: &str) -> Self {
        let key = (group.to_string(), kind.to_string());
        let stream = |filter: Box<dyn Fn(&Swap) -> bool + Send + Sync>| {
            futures::stream::unfold((swaps.subscribe(), filter), |(mut rx, filter)| async move {
                loop {
                    match rx.recv().await {
                        Ok(swap) if filter(&swap) => return Some(((), (rx, filter))),
                        Ok(_) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => return Some(((), (rx, filter))),
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                    }
                }
            })
            .boxed()
        };
        let is_policy = || Box::new(|s: &Swap| matches!(s, Swap::Policy)) as Box<dyn Fn(&Swap) -> bool + Send + Sync>;
        Self {
            plugin_swapped: stream(Box::new(move |s| matches!(s, Swap::Plugin { kinds, .. } if kinds.contains(&key)))),
            policy_swapped: stream(is_policy()),
            policy_swapped_for_sweep: stream(is_policy()),
        }
    }
}

/// One kind's controller: its own watch of the custom resources, triggered also by any child
/// carrying the instance label, by plugin and policy swaps, and by the audit sweep.
async fn controller(
    ctx: Arc<Context>,
    controller: Controller<DynamicObject>,
    concurrency: u16,
    sweep_interval: Duration,
    triggers: Triggers,
    stop: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let ar = ctx.kind.api_resource.clone();
    let t = ctx.children.triggers();
    let counting = count_phases(controller.store(), Arc::clone(&ctx));
    let (swept_tx, swept_rx) = tokio::sync::mpsc::unbounded_channel();
    let sweeping = sweep::run(Arc::clone(&ctx), controller.store(), sweep_interval, triggers.policy_swapped_for_sweep, swept_tx);
    let swept = futures::stream::unfold(swept_rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) });
    let running = controller
        .with_config(ControllerConfig::default().concurrency(concurrency))
        .watches_shared_stream(t.statefulsets, { let ar = ar.clone(); move |c| mapper(&ar, c) })
        .watches_shared_stream(t.services, { let ar = ar.clone(); move |c| mapper(&ar, c) })
        .watches_shared_stream(t.configmaps, { let ar = ar.clone(); move |c| mapper(&ar, c) })
        .watches_shared_stream(t.secrets, { let ar = ar.clone(); move |c| mapper(&ar, c) })
        .watches_shared_stream(t.pdbs, { let ar = ar.clone(); move |c| mapper(&ar, c) })
        .watches_shared_stream(t.pvcs, { let ar = ar.clone(); move |c| mapper(&ar, c) })
        .reconcile_all_on(ctx.children.changes().filter_map(|c| async move {
            matches!(c, children::ChildChange::Relisted).then_some(())
        }))
        .reconcile_all_on(triggers.plugin_swapped)
        .reconcile_all_on(triggers.policy_swapped)
        .reconcile_on(swept)
        .reconcile_on(ctx.children.changes().filter_map({
            let ar = ar.clone();
            move |c| {
                let target = match c {
                    children::ChildChange::Deleted { namespace, instance } => {
                        Some(ObjectRef::new_with(&instance, ar.clone()).within(&namespace))
                    }
                    children::ChildChange::Relisted => None,
                };
                async move { target }
            }
        }))
        .graceful_shutdown_on(stop)
        .run(reconcile::reconcile, error_policy, Arc::clone(&ctx))
        .for_each(|result| async move {
            if let Err(err) = result {
                tracing::debug!(error = %err, "controller event");
            }
        });
    // The counter and the sweep end with the controller: the select drops them when the run
    // stream ends.
    tokio::select! {
        _ = running => {}
        _ = counting => {}
        _ = sweeping => {}
    }
}

/// Keeps `stateward_managed_resources{kind,phase}` current from the controller's own cache.
async fn count_phases(store: kube::runtime::reflector::Store<DynamicObject>, ctx: Arc<Context>) {
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    loop {
        tick.tick().await;
        let mut counts: std::collections::BTreeMap<String, i64> = std::collections::BTreeMap::new();
        for obj in store.state() {
            let phase = obj.data.pointer("/status/phase").and_then(|p| p.as_str()).unwrap_or("Pending");
            *counts.entry(phase.to_string()).or_default() += 1;
        }
        ctx.metrics.managed_resources(&ctx.kind.kind, &counts);
    }
}

/// A child points at the resource named by its instance label, in its own namespace.
/// The custom resource a child change wakes. A child whose controller owner is one of our
/// kinds wakes only that kind's controller (the other two would reconcile a name they do not
/// have); a child without one (a claim made from a volumeClaimTemplate) wakes every kind.
fn mapper<K: kube::Resource>(ar: &ApiResource, child: Arc<K>) -> Option<ObjectRef<DynamicObject>> {
    let name = child.labels().get(INSTANCE_LABEL)?.clone();
    let owner = child.owner_references().iter().find(|o| o.controller == Some(true));
    if let Some(owner) = owner.filter(|o| o.api_version.starts_with(&format!("{}/", ar.group))) {
        if owner.kind != ar.kind {
            return None;
        }
    }
    Some(ObjectRef::new_with(&name, ar.clone()).within(&child.namespace()?))
}

fn error_policy(obj: Arc<DynamicObject>, err: &Error, ctx: Arc<Context>) -> Requeue {
    let delay = ctx.backoff.next(&obj);
    tracing::warn!(kind = %ctx.kind.kind, name = %obj.name_any(), error = %err, retry_in = ?delay, "reconcile failed");
    Requeue::requeue(delay)
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
