//! The composition root of `stateward run`: every long-running part of the process is started
//! here, and only here (docs/architecture.md, Process wiring). `main.rs` turns the command line
//! into the components (sandbox, plugins, policy gate, metrics) and [`OperatorSettings`];
//! [`run`] starts the HTTP port, the webhooks, leader election, the reloader and the child
//! caches, then runs the controllers ([`crate::controller::Controllers`]) while this replica
//! holds the Lease.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use tokio::sync::watch;

use crate::controller::{self, Applier, Children, ControllerSettings, Controllers, KeeperSettings};
use crate::leader::{self, LeaderConfig};
use crate::policy::LiveGate;
use crate::reload::announce::Announcer;
use crate::reload::Reloader;
use crate::requests::{Outcomes, RequestSettings, Requests};
use crate::runtime::{LiveRegistry, Sandbox};
use crate::telemetry::{events, DebugState, Metrics};
use crate::webhook::{self, WebhookError, WebhookSettings};

/// How `stateward run` was asked to behave.
pub struct OperatorSettings {
    /// The namespaces watched (a Role in each), or every namespace.
    pub watched: crate::watched::Watched,
    pub http_addr: SocketAddr,
    pub leader: LeaderConfig,
    /// Reconciles running at once per kind.
    pub concurrency: u16,
    /// How often the audit sweep re-evaluates every resource against the admission policy.
    pub sweep_interval: Duration,
    /// The webhooks and the address they serve on; `None` when they are off.
    pub webhook: Option<(WebhookSettings, SocketAddr)>,
    /// How often the counted repetitions of unchanged decisions are written to the audit log
    /// (also on losing leadership and at shutdown).
    pub audit_repeat_interval: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("HTTP server on {addr}: {source}")]
    Http { addr: SocketAddr, source: std::io::Error },
    #[error("child caches never synced: {0}")]
    Sync(String),
    #[error(transparent)]
    Webhook(#[from] WebhookError),
    #[error(transparent)]
    Controllers(#[from] controller::RunError),
}

/// Runs the operator until SIGTERM/SIGINT; losing leadership stops the controllers until it is
/// won back, and never ends the process.
pub async fn run(
    client: Client,
    sandbox: Arc<Sandbox>,
    registry: Arc<LiveRegistry>,
    gate: Arc<LiveGate>,
    metrics: Metrics,
    settings: OperatorSettings,
) -> Result<(), RunError> {
    // Every replica serves the webhooks (the API server may call any of them).
    let keeper = match settings.webhook.clone() {
        Some((webhook_settings, addr)) => {
            Some(start_webhooks(&client, &sandbox, &registry, &gate, &metrics, webhook_settings, addr).await?)
        }
        None => None,
    };

    let debug = DebugState::default();
    debug.set_policy(gate.current().digest());
    metrics.policy_bundle_loaded(gate.current().digest());
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
    // Caches are reads: every replica keeps them warm so a takeover starts at once. They hold
    // exactly the kinds the plugins own; a built-in plugin owning a kind that cannot be cached
    // stops the start with the reason (a ConfigMap build is refused instead, by the reloader).
    let children = Children::new(&client, &settings.watched);
    for plugin in registry.snapshot().plugins() {
        children.ensure(crate::reload::owned_kinds(&plugin)).await.map_err(|e| {
            RunError::Sync(format!("plugin {} owns a kind the operator cannot watch: {e}", plugin.name()))
        })?;
    }
    let reloader = Reloader {
        children: children.clone(),
        client: client.clone(),
        namespace: settings.leader.namespace.clone(),
        sandbox: Arc::clone(&sandbox),
        registry: Arc::clone(&registry),
        gate: Arc::clone(&gate),
        metrics: metrics.clone(),
        debug: debug.clone(),
        announcer: Announcer::new(
            events::Publisher::new(client.clone(), &settings.leader.identity),
            leadership.clone(),
        ),
        swaps: swaps.clone(),
    };
    let mut reloaded = reloader.spawn();

    tokio::select! {
        synced = children.wait_until_synced() => synced.map_err(|e| RunError::Sync(e.to_string()))?,
        _ = stopped() => return Ok(()),
    }
    for plural in children.plurals() {
        debug.set_watch(&plural, true);
    }
    // Controllers start on the plugins and policy the ConfigMaps ask for, not the built-ins.
    tokio::select! {
        _ = reloaded.wait_for(|s| *s) => {}
        _ = stopped() => return Ok(()),
    }
    debug.set_watch("reload-configmaps", true);
    debug.set_ready(true);

    let requests = Requests::new(
        client.clone(),
        RequestSettings::default(),
        audit_outcomes(Arc::clone(&gate), metrics.clone()),
    );
    let controllers = Controllers {
        requests,
        applier: Arc::new(Applier::new(client.clone())),
        client,
        children,
        sandbox,
        registry,
        gate: Arc::clone(&gate),
        metrics,
        leadership: leadership.clone(),
        swaps,
        debug: debug.clone(),
        keeper,
        settings: ControllerSettings {
            watched: settings.watched.clone(),
            identity: settings.leader.identity.clone(),
            concurrency: settings.concurrency,
            sweep_interval: settings.sweep_interval,
        },
    };
    // Lead while we hold the Lease; when it is lost (e.g. the API server was unreachable past
    // the renew deadline) stop every controller before campaigning again, so that there is
    // never a moment with two writers, and never exit for it.
    enum Next {
        Stop,
        Lost,
    }
    let repetitions = tokio::spawn({
        let (gate, every) = (Arc::clone(&gate), settings.audit_repeat_interval.max(Duration::from_secs(1)));
        async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                flush_repetitions(&gate, "period").await;
            }
        }
    });
    loop {
        tracing::info!(identity = %settings.leader.identity, "waiting for leadership");
        tokio::select! {
            _ = leadership.acquired() => {}
            _ = stopped() => break,
        }
        debug.set_leader(true);
        tracing::info!("became leader");
        let lost = async {
            loop {
                match leadership.changed().await {
                    Some(false) | None => return,
                    Some(true) => {}
                }
            }
        };
        let until = async {
            tokio::select! {
                _ = stopped() => Next::Stop,
                _ = lost => Next::Lost,
            }
        };
        match controllers.run(&stopped, until).await? {
            Next::Stop => break,
            Next::Lost => {
                debug.set_leader(false);
                tracing::warn!("lost leadership; controllers stopped, campaigning again");
                flush_repetitions(&gate, "leadership lost").await;
            }
        }
    }
    repetitions.abort();
    flush_repetitions(&gate, "shutdown").await;
    debug.set_leader(false);
    debug.set_ready(false);
    let _ = tokio::time::timeout(Duration::from_secs(5), leader_task).await;
    Ok(())
}

/// Writes the audit log's counted repetitions (`policy::repeats`) off the reactor: the write
/// may fsync. A failure is logged; the next plan's sync fails closed on a failed log.
async fn flush_repetitions(gate: &Arc<LiveGate>, when: &'static str) {
    let gate = gate.current();
    match tokio::task::spawn_blocking(move || gate.flush_repetitions()).await {
        Ok(Ok(0)) => {}
        Ok(Ok(n)) => tracing::debug!(records = n, when, "audit repetitions written"),
        Ok(Err(e)) => tracing::error!(error = %e, when, "cannot write the audit repetitions"),
        Err(e) => tracing::error!(error = %e, when, "audit repetitions task failed"),
    }
}

/// Binds the webhook port and serves the admission and conversion webhooks; returns what the
/// certificate keeper (a controller, run while leading) needs to issue the managed clusters'
/// certificates from the service CA.
async fn start_webhooks(
    client: &Client,
    sandbox: &Arc<Sandbox>,
    registry: &Arc<LiveRegistry>,
    gate: &Arc<LiveGate>,
    metrics: &Metrics,
    settings: WebhookSettings,
    addr: SocketAddr,
) -> Result<KeeperSettings, WebhookError> {
    let state = webhook::Webhook {
        registry: Arc::clone(registry),
        sandbox: Arc::clone(sandbox),
        gate: Arc::clone(gate),
        client: client.clone(),
        metrics: metrics.clone(),
        name_checks: webhook::admission::name_check_budget(),
    };
    let listener = webhook::bind(addr).await?;
    // The managed clusters' certificates (labelled ensure-secret) come from a CA per instance,
    // never the webhook's; the CA earlier releases shared is read only to move away from it.
    let keeper = KeeperSettings {
        legacy_ca_secret: (
            settings.namespace.clone(),
            controller::service_certs::LEGACY_CA_SECRET.to_string(),
        ),
        cert_manager: settings.cert_manager,
        policy: settings.policy.clone(),
    };
    let client = client.clone();
    tokio::spawn(async move {
        if let Err(e) =
            webhook::run(client, listener, Arc::new(state), settings, std::future::pending()).await
        {
            tracing::error!(error = %e, "webhook server stopped");
        }
    });
    Ok(keeper)
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

/// Every answer is audited: its target as policy saw it and how it ended, with the sizes and
/// a digest of its output (never the output, stdin or credentials); and counted. A poll's
/// answers that end as its last written one did are counted as its repetitions.
fn audit_outcomes(gate: Arc<LiveGate>, metrics: Metrics) -> Outcomes {
    Arc::new(move |answer: &crate::requests::Outcome<'_>| {
        let response = answer.response;
        let (outcome, class) = (answer.audited(), answer.class());
        if let Err(e) = gate.current().record_outcome(answer.requested_by, answer.audit, outcome, class) {
            tracing::error!(error = %e, id = %response.id, "cannot audit a request's outcome");
        }
        let verb = answer.audit.get("verb").and_then(serde_json::Value::as_str).unwrap_or("request");
        let result = match (answer.sent, response.error.is_some()) {
            (false, _) => "not_sent",
            (true, true) => "error",
            (true, false) => "ok",
        };
        let seconds = answer.sent.then(|| response.duration_ms as f64 / 1000.0);
        metrics.request(verb, result, seconds);
    })
}
