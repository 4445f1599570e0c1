//! The generic controller: one kube-rs Controller per plugin-declared kind, all sharing the
//! child caches, the sandbox, the policy gate and the metrics. The host knows nothing about
//! any one service; everything service-specific comes from the plugin. [`Controllers::run`]
//! starts the controllers only; the process around them (HTTP port, leader election, reloader,
//! caches, webhooks) is wired by [`crate::operator`].

mod apply;
mod backoff;
mod claims;
mod dispatch;
mod error;
pub mod panics;
mod reconcile;
pub mod service_certs;
mod status;
pub mod sweep;
#[cfg(test)]
mod tests;
mod written;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::controller::{Action as Requeue, Config as ControllerConfig, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};

pub use crate::children::{Children, INSTANCE_LABEL};
pub use apply::{Applier, APPLIED_HASH, FIELD_MANAGER};
pub use error::Error;
pub use service_certs::{CertificateKeeper, KeeperSettings};

use crate::leader::Leadership;
use crate::policy::LiveGate;
use crate::reload::Swap;
use crate::requests::Requests;
use crate::runtime::{LiveRegistry, Plugin, Registry, Sandbox};
use crate::telemetry::{events, DebugState, Metrics};
use crate::watched::Watched;

/// The finalizer that guards every managed resource until its plugin says cleanup is done.
pub const FINALIZER: &str = "stateward.dev/cleanup";

/// How the controllers behave.
pub struct ControllerSettings {
    /// The namespaces watched: a controller per kind and namespace listed, or one per kind
    /// for every namespace.
    pub watched: Watched,
    /// This replica's identity (the reporting instance of its Events).
    pub identity: String,
    /// Reconciles running at once per kind.
    pub concurrency: u16,
    /// How often the audit sweep re-evaluates every resource against the admission policy.
    pub sweep_interval: Duration,
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
    children: Children,
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
    requests: Arc<Requests>,
    /// The status last written to each resource, until the cache has it.
    written: written::Written,
    /// Whether the certificate keeper runs: StatefulSets are then stamped with the
    /// certificates they mount, and created only once those are issued.
    issues_certificates: bool,
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
    #[error("plugin {plugin} declares kind {kind} without a storage version")]
    NoStorageVersion { plugin: String, kind: String },
}

/// What every kind's controller shares; built once by the composition root
/// ([`crate::operator`]), which runs them while this replica leads.
pub struct Controllers {
    pub client: Client,
    /// The child caches, started and synced by the caller.
    pub children: Children,
    pub sandbox: Arc<Sandbox>,
    pub registry: Arc<LiveRegistry>,
    pub gate: Arc<LiveGate>,
    pub metrics: Metrics,
    /// Every kind's writes (it caches API discovery for the life of the process).
    pub applier: Arc<Applier>,
    /// Checked again by every reconcile before it writes.
    pub leadership: Leadership,
    /// Requests to the running services (plans' `exec` and `http`).
    pub requests: Arc<Requests>,
    /// Plugin and policy swaps from the reloader.
    pub swaps: tokio::sync::broadcast::Sender<Swap>,
    pub debug: DebugState,
    /// The certificate keeper's CA and lifetimes; `None` when the webhooks (and so their CA)
    /// are off.
    pub keeper: Option<KeeperSettings>,
    pub settings: ControllerSettings,
}

impl Controllers {
    /// Runs one controller per plugin-declared kind, and the certificate keeper, until `until`
    /// resolves, then stops them all and returns its output. A plugin that brings new kinds restarts the controllers so
    /// the new kinds get theirs. `stopped` makes the futures a controller shuts down
    /// gracefully on.
    pub async fn run<S, F, T>(
        &self,
        stopped: &S,
        until: impl std::future::Future<Output = T>,
    ) -> Result<T, RunError>
    where
        S: Fn() -> F,
        F: std::future::Future<Output = ()> + Send + Sync + 'static,
    {
        let mut until = std::pin::pin!(until);
        loop {
            // Every kind a plugin owns is cached before its controller starts (a plugin whose
            // kinds cannot be was refused at load; the built-in ones were checked at start).
            let owned = self
                .registry
                .snapshot()
                .plugins()
                .iter()
                .flat_map(|p| crate::reload::owned_kinds(p))
                .collect::<Vec<_>>();
            if let Err(e) = self.children.ensure(owned).await {
                tracing::error!(error = %e, "a child kind cannot be cached; plans that touch it fail");
            }
            let tasks = start_controllers(self, stopped)?;
            let mut swaps = self.swaps.subscribe();
            let new_kinds = async move {
                loop {
                    match swaps.recv().await {
                        Ok(Swap::Plugin { new_kinds: true, .. }) => return,
                        Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                            std::future::pending::<()>().await
                        }
                    }
                }
            };
            let done = tokio::select! {
                done = &mut until => Some(done),
                _ = new_kinds => None,
            };
            for task in &tasks {
                task.abort();
            }
            for task in tasks {
                let _ = task.await;
            }
            match done {
                Some(done) => return Ok(done),
                None => tracing::info!("a plugin brought new kinds; restarting the controllers"),
            }
        }
    }
}

/// Starts one controller per plugin-declared kind.
fn start_controllers<S, F>(
    shared: &Controllers,
    stopped: &S,
) -> Result<Vec<tokio::task::JoinHandle<()>>, RunError>
where
    S: Fn() -> F,
    F: std::future::Future<Output = ()> + Send + Sync + 'static,
{
    let (settings, debug) = (&shared.settings, &shared.debug);
    let registry: Registry = shared.registry.snapshot();
    let claims = claims::NameClaims::default();
    let mut built = Vec::new();
    let mut counting = Vec::new();
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
            debug.set_watch(&kind.plural, true);
            let mut stores = Vec::new();
            for scope in settings.watched.scopes() {
                let ctx = Arc::new(Context {
                    client: shared.client.clone(),
                    kind: Arc::clone(&binding),
                    children: shared.children.clone(),
                    sandbox: Arc::clone(&shared.sandbox),
                    registry: Arc::clone(&shared.registry),
                    gate: Arc::clone(&shared.gate),
                    metrics: shared.metrics.clone(),
                    events: events::Events::new(
                        shared.client.clone(),
                        &settings.identity,
                        api_resource.clone(),
                    ),
                    findings: sweep::Findings::default(),
                    claims: claims.clone(),
                    applier: Arc::clone(&shared.applier),
                    backoff: backoff::Backoff::default(),
                    leadership: shared.leadership.clone(),
                    requests: Arc::clone(&shared.requests),
                    written: written::Written::default(),
                    issues_certificates: shared.keeper.is_some(),
                });
                let api = crate::watched::api(&shared.client, scope.as_deref(), &api_resource);
                let watching = Controller::new_with(api, watcher::Config::default(), api_resource.clone());
                claims.add(&kind.kind, api_resource.clone(), watching.store());
                stores.push(watching.store());
                let triggers = SwapTriggers::new(&shared.swaps, &kind.group, &kind.kind);
                built.push((ctx, watching, triggers));
            }
            counting.push(tokio::spawn(count_phases(stores, shared.metrics.clone(), kind.kind.clone())));
        }
    }
    // The certificate keeper writes too: it runs with the controllers, only while leading, and
    // issues only for Secrets controlled by a resource of a kind they serve.
    let served = registry
        .plugins()
        .iter()
        .flat_map(|p| p.info().kinds.iter().map(|k| (k.group.clone(), k.kind.clone())))
        .collect();
    let keeper = shared.keeper.clone().map(|settings| {
        let keeper = CertificateKeeper {
            client: shared.client.clone(),
            children: shared.children.clone(),
            settings,
            served,
        };
        tokio::spawn(keeper.run())
    });
    // Every kind's cache is in the claims before the first reconcile asks who holds a name.
    Ok(keeper
        .into_iter()
        .chain(counting)
        .chain(built.into_iter().map(|(ctx, watching, triggers)| {
            let kind = ctx.kind.kind.clone();
            let running =
                controller(ctx, watching, settings.concurrency, settings.sweep_interval, triggers, stopped());
            panics::supervise(debug, &kind, running)
        }))
        .collect())
}

/// Reasons to look at every resource of a kind again, from outside its watches.
struct SwapTriggers {
    /// A new plugin build for this kind: requeue every resource once.
    plugin_swapped: futures::stream::BoxStream<'static, ()>,
    /// A new policy bundle: sweep, and requeue everything once (the guardrails changed).
    policy_swapped: futures::stream::BoxStream<'static, ()>,
    policy_swapped_for_sweep: futures::stream::BoxStream<'static, ()>,
}

impl SwapTriggers {
    fn new(swaps: &tokio::sync::broadcast::Sender<Swap>, group: &str, kind: &str) -> Self {
        let key = (group.to_string(), kind.to_string());
        let stream = |filter: Box<dyn Fn(&Swap) -> bool + Send + Sync>| {
            futures::stream::unfold((swaps.subscribe(), filter), |(mut rx, filter)| async move {
                loop {
                    match rx.recv().await {
                        Ok(swap) if filter(&swap) => return Some(((), (rx, filter))),
                        Ok(_) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                            return Some(((), (rx, filter)))
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                    }
                }
            })
            .boxed()
        };
        let is_policy =
            || Box::new(|s: &Swap| matches!(s, Swap::Policy)) as Box<dyn Fn(&Swap) -> bool + Send + Sync>;
        Self {
            plugin_swapped: stream(Box::new(
                move |s| matches!(s, Swap::Plugin { kinds, .. } if kinds.contains(&key)),
            )),
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
    triggers: SwapTriggers,
    stop: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let ar = ctx.kind.api_resource.clone();
    let (swept_tx, swept_rx) = tokio::sync::mpsc::unbounded_channel();
    let sweeping = sweep::run(
        Arc::clone(&ctx),
        controller.store(),
        sweep_interval,
        triggers.policy_swapped_for_sweep,
        swept_tx,
    );
    let swept = futures::stream::unfold(swept_rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) });
    let running =
        controller
            .with_config(ControllerConfig::default().concurrency(concurrency))
            .reconcile_all_on(ctx.children.changes().filter_map(|c| async move {
                matches!(c, crate::children::ChildChange::Relisted).then_some(())
            }))
            .reconcile_all_on(triggers.plugin_swapped)
            .reconcile_all_on(triggers.policy_swapped)
            .reconcile_on(swept)
            .reconcile_on(ctx.requests.woken().filter_map({
                let (ar, kind) = (ar.clone(), ctx.kind.kind.clone());
                move |owner| {
                    let target = (owner.kind == kind)
                        .then(|| ObjectRef::new_with(&owner.name, ar.clone()).within(&owner.namespace));
                    async move { target }
                }
            }))
            // Any change to a cached child (every kind a plugin owns) wakes its resource.
            .reconcile_on(ctx.children.changes().filter_map({
                let ar = ar.clone();
                move |c| {
                    let target = match c {
                        crate::children::ChildChange::Changed(child) => mapper(&ar, child),
                        crate::children::ChildChange::Deleted { namespace, instance } => {
                            Some(ObjectRef::new_with(&instance, ar.clone()).within(&namespace))
                        }
                        crate::children::ChildChange::Relisted => None,
                    };
                    async move { target }
                }
            }))
            .graceful_shutdown_on(stop)
            .run(
                |obj, ctx| async move {
                    let (metrics, kind) = (ctx.metrics.clone(), ctx.kind.kind.clone());
                    panics::catch_panic(&metrics, &kind, reconcile::reconcile(obj, ctx)).await
                },
                error_policy,
                Arc::clone(&ctx),
            )
            .for_each(|result| async move {
                if let Err(err) = result {
                    tracing::debug!(error = %err, "controller event");
                }
            });
    // The sweep ends with the controller: the select drops it when the run stream ends.
    tokio::select! {
        _ = running => {}
        _ = sweeping => {}
    }
}

/// Keeps `stateward_managed_resources{kind,phase}` current from the caches of the kind's
/// controllers (one per namespace watched).
async fn count_phases(
    stores: Vec<kube::runtime::reflector::Store<DynamicObject>>,
    metrics: Metrics,
    kind: String,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    loop {
        tick.tick().await;
        let mut counts: std::collections::BTreeMap<String, i64> = std::collections::BTreeMap::new();
        for obj in stores.iter().flat_map(|s| s.state()) {
            let phase = obj.data.pointer("/status/phase").and_then(|p| p.as_str()).unwrap_or("Pending");
            *counts.entry(phase.to_string()).or_default() += 1;
        }
        metrics.managed_resources(&kind, &counts);
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
    let delay = ctx.backoff.after(&obj, err.is_transport());
    tracing::warn!(kind = %ctx.kind.kind, name = %obj.name_any(), error = %err, retry_in = ?delay, "reconcile failed");
    Requeue::requeue(delay)
}
