//! The operator's plain HTTP port (docs/architecture.md, Telemetry): Prometheus metrics, the kubelet's liveness and
//! readiness probes, and JSON debug views of what the process has loaded and is watching.
//!
//! The controller owns the facts and pushes them into [`DebugState`]; the handlers here only
//! read a snapshot, so a slow scrape or probe never waits on reconcile work.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Json};
use axum::routing::get;
use axum::Router;
use serde_json::{json, Value};
use tokio::net::TcpListener;

use super::Metrics;

/// Content type of the OpenMetrics text exposition that [`Metrics::encode`] produces; Prometheus
/// picks its parser from this header, so it must name OpenMetrics, not the classic text format.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Shared, cheaply cloned view of the operator's state for the health and debug endpoints.
/// The controller calls the setters as things change; the HTTP handlers only read.
#[derive(Clone, Debug, Default)]
pub struct DebugState {
    inner: Arc<RwLock<DebugInfo>>,
}

#[derive(Debug, Default)]
struct DebugInfo {
    ready: bool,
    leader: bool,
    /// `Null` until the first `set_plugins`; reported as an empty list.
    plugins: Value,
    policy_bundle_digest: Option<String>,
    /// Why the latest policy ConfigMap bundle was refused (cleared when one is accepted).
    policy_rejection: Option<Value>,
    /// Ordered so the JSON output is stable between calls.
    watches: BTreeMap<String, bool>,
    /// Each kind's controller task: `None` while it runs, why it is gone once it died.
    controllers: BTreeMap<String, Option<String>>,
}

impl DebugState {
    // A panic while holding the lock cannot leave these plain fields half-written in a way that
    // matters for a debug view, so a poisoned lock is used as is rather than failing the probe.
    fn read(&self) -> RwLockReadGuard<'_, DebugInfo> {
        self.inner.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, DebugInfo> {
        self.inner.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets what `/readyz` answers: 200 once the caches are synced and plugins loaded, 503 before
    /// (and again during shutdown), so Kubernetes routes nothing to a replica that is not ready.
    pub fn set_ready(&self, ready: bool) {
        self.write().ready = ready;
    }

    /// Records whether this replica currently holds the leader Lease (only the leader writes).
    pub fn set_leader(&self, leader: bool) {
        self.write().leader = leader;
    }

    /// Replaces the loaded-plugin list: a JSON array of
    /// `{name, version, digest, kinds, loadedAt, lastError}` objects, served as given.
    pub fn set_plugins(&self, plugins: Value) {
        self.write().plugins = plugins;
    }

    /// Records the digest of the policy bundle in force, so an operator can tell which policy
    /// version gated the decisions it sees in the audit log.
    pub fn set_policy(&self, bundle_digest: &str) {
        self.write().policy_bundle_digest = Some(bundle_digest.to_owned());
    }

    /// Records why the latest policy bundle from ConfigMaps was refused; `None` once one loads.
    pub fn set_policy_rejection(&self, rejection: Option<Value>) {
        self.write().policy_rejection = rejection;
    }

    /// Records whether one watch (reflector) has completed its initial list; one entry per name.
    pub fn set_watch(&self, name: &str, synced: bool) {
        self.write().watches.insert(name.to_owned(), synced);
    }

    /// Records that a kind's controller task runs (again, after a restart of the controllers).
    pub fn controller_started(&self, kind: &str) {
        self.write().controllers.insert(kind.to_owned(), None);
    }

    /// Records that a kind's controller task ended or panicked: that kind is no longer
    /// reconciled, so `/readyz` answers 503 until the controllers are started again.
    pub fn controller_died(&self, kind: &str, why: &str) {
        self.write().controllers.insert(kind.to_owned(), Some(why.to_owned()));
    }

    /// The `/debug/healthz` document: `{ready, leader, plugins, policy: {bundleDigest},
    /// watches: {name: synced}, controllers: {kind: "running" | why it died}}`.
    pub fn snapshot(&self) -> Value {
        let info = self.read();
        let controllers: BTreeMap<&String, &str> =
            info.controllers.iter().map(|(k, died)| (k, died.as_deref().unwrap_or("running"))).collect();
        json!({
            "ready": info.is_ready(),
            "leader": info.leader,
            "plugins": plugins_or_empty(&info.plugins),
            "policy": { "bundleDigest": info.policy_bundle_digest, "lastRejection": info.policy_rejection },
            "watches": info.watches,
            "controllers": controllers,
        })
    }

    fn plugins(&self) -> Value {
        plugins_or_empty(&self.read().plugins)
    }

    fn is_ready(&self) -> bool {
        self.read().is_ready()
    }
}

impl DebugInfo {
    /// Ready, and no controller task has died.
    fn is_ready(&self) -> bool {
        self.ready && self.controllers.values().all(Option::is_none)
    }
}

fn plugins_or_empty(plugins: &Value) -> Value {
    match plugins {
        Value::Null => Value::Array(Vec::new()),
        other => other.clone(),
    }
}

/// What every handler gets: the registry to encode and the state to report.
#[derive(Clone)]
struct AppState {
    metrics: Metrics,
    debug: DebugState,
}

/// The routes of the HTTP port, without binding anything; public so a caller can mount them
/// under its own server or drive them in-process.
pub fn router(metrics: Metrics, state: DebugState) -> Router {
    Router::new()
        .route("/metrics", get(metrics_text))
        .route("/debug/metrics", get(metrics_text))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/debug/healthz", get(debug_healthz))
        .route("/debug/plugins", get(debug_plugins))
        .with_state(AppState { metrics, debug: state })
}

/// Binds `addr` and serves the routes until `shutdown` completes, then lets in-flight requests
/// finish (axum's graceful shutdown) before returning.
pub async fn serve(
    addr: SocketAddr,
    metrics: Metrics,
    state: DebugState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    serve_listener(listener, metrics, state, shutdown).await
}

/// As [`serve`], on a listener the caller already bound: lets a test bind port 0 and read the
/// real port from the listener without a window in which another process could take it.
pub async fn serve_listener(
    listener: TcpListener,
    metrics: Metrics,
    state: DebugState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving metrics, health and debug endpoints");
    }
    axum::serve(listener, router(metrics, state)).with_graceful_shutdown(shutdown).await
}

async fn metrics_text(State(app): State<AppState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], app.metrics.encode())
}

/// Liveness: answering at all is the signal, so this never looks at the state.
async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(app): State<AppState>) -> (StatusCode, &'static str) {
    if app.debug.is_ready() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

async fn debug_healthz(State(app): State<AppState>) -> Json<Value> {
    Json(app.debug.snapshot())
}

async fn debug_plugins(State(app): State<AppState>) -> Json<Value> {
    Json(app.debug.plugins())
}
