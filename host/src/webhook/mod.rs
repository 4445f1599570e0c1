//! Admission and conversion webhooks, with a built-in CA and certificate rotation
//! (docs/architecture.md, The three decision points). A concern apart from the controller: it
//! shares the plugins and the policy gate, runs on every replica (the API server may call any of
//! them), and needs no leadership.
//!
//! - [`admission`]: `plugin.validate` then `data.stateward.admission`, audited.
//! - [`conversion`]: `plugin.convert` for the CRDs' versions.
//! - [`intake`]: a review's body bounded in size, memory and time before it takes a slot.
//! - [`tls`]: rustls with a certificate resolver swapped on rotation; the accept loop.
//! - [`certs`]: the built-in CA and serving certificate in a Secret, renewed under a threshold.
//! - [`certmanager`]: `--cert-manager` mode (cert-manager issues, the operator serves).
//! - [`config`]: the ValidatingWebhookConfiguration and CRD conversion stanza, with caBundle.
//!
//! The managed clusters' certificates are a controller's job, from a service CA of their own
//! (`controller/service_certs.rs`, run only while leading).

pub mod admission;
pub mod budget;
pub mod certmanager;
pub mod certs;
pub mod config;
pub mod conversion;
pub mod intake;
pub mod tls;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::response::Json;
use axum::routing::{get, post};
use axum::Router;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use serde_json::Value;
use tokio::net::TcpListener;

use crate::policy::LiveGate;
use crate::runtime::{KindInfo, LiveRegistry, Sandbox};
use crate::telemetry::Metrics;

pub use certs::CertPolicy;
pub use config::Endpoint;
pub use tls::CertResolver;

/// Why the webhook could not do its part.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("binding the webhook port {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("certificate: {0}")]
    Certificate(String),
    #[error("{action}: {source}")]
    Kube { action: &'static str, source: kube::Error },
}

impl WebhookError {
    /// Wraps a kube error with what was being done.
    pub fn kube(action: &'static str) -> impl Fn(kube::Error) -> WebhookError {
        move |source| WebhookError::Kube { action, source }
    }

    /// Short label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            WebhookError::Bind { .. } => "bind",
            WebhookError::Certificate(_) => "certificate",
            WebhookError::Kube { .. } => "kube",
        }
    }
}

/// What the handlers evaluate with: immutable, shared by every request.
pub struct Webhook {
    /// The plugins serving now (follows hot reload).
    pub registry: Arc<LiveRegistry>,
    pub sandbox: Arc<Sandbox>,
    /// The policy gate in force now (follows hot reload).
    pub gate: Arc<LiveGate>,
    /// For the one read admission makes: is a new resource's name taken by another kind.
    pub client: kube::Client,
    /// The process's metrics (plugin calls of validate and convert).
    pub metrics: Metrics,
    /// Name checks this replica may still make ([`admission::NAME_CHECKS_PER_SECOND`]).
    pub name_checks: budget::Budget,
}

impl Webhook {
    /// Every kind the plugins serve now.
    pub fn kinds(&self) -> Vec<KindInfo> {
        self.registry.snapshot().plugins().iter().flat_map(|p| p.info().kinds.clone()).collect()
    }
}

/// Which cluster objects the operator keeps pointed at its webhooks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Configure {
    /// The ValidatingWebhookConfiguration and the CRDs' conversion webhook.
    #[default]
    All,
    /// Only the ValidatingWebhookConfiguration.
    Validating,
    /// Only the CRDs' conversion webhook.
    Conversion,
    /// Nothing (someone else manages them).
    None,
}

/// How `stateward run` serves its webhooks.
#[derive(Debug, Clone)]
pub struct WebhookSettings {
    pub endpoint: Endpoint,
    /// Namespace of the Secret (and the cert-manager objects).
    pub namespace: String,
    /// Secret holding the CA and the serving certificate.
    pub secret: String,
    /// Name of the ValidatingWebhookConfiguration.
    pub configuration: String,
    /// The admission webhook covers these namespaces only (`--namespace` mode).
    pub watched: crate::watched::Watched,
    pub configure: Configure,
    pub cert_manager: bool,
    pub policy: CertPolicy,
}

impl WebhookSettings {
    /// Names the serving certificate must carry: the Service's DNS names, and the URL's host.
    pub fn sans(&self) -> Vec<String> {
        let mut sans = Vec::new();
        if let Some(host) = self.endpoint.url_host() {
            sans.push(host);
        }
        let service = match &self.endpoint {
            Endpoint::Service { name, .. } => name.as_str(),
            Endpoint::Url(_) => config::SERVICE_NAME,
        };
        sans.extend(certs::service_sans(service, &self.namespace));
        sans
    }
}

/// How long one review may take in the server, its body read included: less than the API
/// server waits ([`config::TIMEOUT_SECONDS`]), so a slow or flooding client is cut off and
/// answered before the API server gives up on a legitimate request.
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(8);

/// The HTTP routes; handlers only extract and delegate.
pub fn router(webhook: Arc<Webhook>) -> Router {
    async fn validate(State(w): State<Arc<Webhook>>, Json(body): Json<Value>) -> Json<Value> {
        Json(admission::review(w, body).await)
    }
    async fn convert(State(w): State<Arc<Webhook>>, Json(body): Json<Value>) -> Json<Value> {
        Json(conversion::review(w, body).await)
    }
    let routes = Router::new()
        .route(config::VALIDATE_PATH, post(validate))
        .route(config::CONVERT_PATH, post(convert))
        .route("/healthz", get(|| async { "ok" }))
        .layer(axum::extract::DefaultBodyLimit::max(intake::REVIEW_BODY_LIMIT))
        .with_state(webhook);
    intake::bounded(routes, REVIEW_TIMEOUT, intake::Budgets::default())
}

/// Binds the webhook port (before anything else, so a taken port fails the start).
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, WebhookError> {
    TcpListener::bind(addr).await.map_err(|source| WebhookError::Bind { addr, source })
}

/// Serves the webhooks on `listener` and keeps certificates and configurations current until
/// `stopped`. Errors of the certificate loop are logged and retried; serving never stops for
/// them (the last good certificate stays).
pub async fn run(
    client: Client,
    listener: TcpListener,
    webhook: Arc<Webhook>,
    settings: WebhookSettings,
    stopped: impl Future<Output = ()> + Send + 'static,
) -> Result<(), WebhookError> {
    let resolver = Arc::new(CertResolver::default());
    let server_config = tls::server_config(Arc::clone(&resolver))?;
    let limits = tls::ConnectionLimits::default();
    let server = tls::serve(listener, server_config, router(Arc::clone(&webhook)), limits, stopped);
    let keeper = keep_certificates(client, resolver, settings, webhook);
    tokio::select! {
        () = server => Ok(()),
        () = keeper => Ok(()),
    }
}

/// Re-applies configurations at least this often even when nothing changed (someone may have
/// re-applied deploy/ over them); such a refresh never makes a configuration that is gone.
const RECONFIGURE_EVERY: Duration = Duration::from_secs(60);

/// After a CA change, how long the API server gets to load the new caBundle before the
/// certificate signed by the new CA is served.
const TRUST_GRACE: Duration = Duration::from_secs(2);
/// cert-manager renews on its own schedule: look at its Secret at least this often.
const CERT_MANAGER_POLL: Duration = Duration::from_secs(5);

/// The CAs the configurations trust: the current one, and after a CA change the previous one
/// for a while, so certificates of either CA (e.g. a replica that has not switched yet) verify.
#[derive(Debug, Default)]
struct Trust {
    current: Option<String>,
    previous: Option<(String, Instant)>,
}

impl Trust {
    /// Records the CA now in use; true when it changed from a known one.
    fn observe(&mut self, ca_pem: &str) -> bool {
        match &self.current {
            Some(c) if c == ca_pem => false,
            Some(c) => {
                self.previous = Some((c.clone(), Instant::now()));
                self.current = Some(ca_pem.to_string());
                true
            }
            None => {
                self.current = Some(ca_pem.to_string());
                false
            }
        }
    }

    /// The caBundle (base64 PEM): the current CA plus the previous one until `keep` has passed.
    fn bundle(&mut self, keep: Duration) -> String {
        use base64::Engine as _;
        if self.previous.as_ref().is_some_and(|(_, since)| since.elapsed() > keep) {
            self.previous = None;
        }
        let mut pem = self.current.clone().unwrap_or_default();
        if let Some((prev, _)) = &self.previous {
            if !pem.ends_with('\n') {
                pem.push('\n');
            }
            pem.push_str(prev);
        }
        base64::engine::general_purpose::STANDARD.encode(pem.as_bytes())
    }
}

/// Fetches the serving certificate and its CA from the Secret (renewing first in built-in
/// mode), without serving it yet.
async fn fetch(
    settings: &WebhookSettings,
    builtin: &certs::BuiltinCa,
    secrets: &Api<Secret>,
) -> Result<(tls::ServingCert, String), WebhookError> {
    if !settings.cert_manager {
        let m = builtin.sync().await?;
        return Ok((m.serving()?, m.ca_pem));
    }
    match secrets.get_opt(&settings.secret).await {
        Ok(Some(secret)) => certmanager::from_secret(&secret).unwrap_or_else(|| {
            Err(WebhookError::Certificate("cert-manager has not filled the Secret yet".into()))
        }),
        Ok(None) => Err(WebhookError::Certificate("waiting for cert-manager to create the Secret".into())),
        Err(e) => Err(WebhookError::kube("reading the webhook Secret")(e)),
    }
}

async fn keep_certificates(
    client: Client,
    resolver: Arc<CertResolver>,
    settings: WebhookSettings,
    webhook: Arc<Webhook>,
) {
    let mut interval = settings.policy.check_interval();
    if settings.cert_manager {
        interval = interval.min(CERT_MANAGER_POLL);
    }
    // A replica lags a CA change by at most one interval; trust the old CA well past that.
    let keep_previous = interval * 3 + RECONFIGURE_EVERY;
    let mut configured: Option<(String, Vec<String>, Instant)> = None;
    let mut trust = Trust::default();
    let builtin = certs::BuiltinCa::new(
        client.clone(),
        &settings.namespace,
        &settings.secret,
        settings.policy.clone(),
        settings.sans(),
    );
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &settings.namespace);
    let mut rendered_cert_manager = false;
    loop {
        if settings.cert_manager && !rendered_cert_manager {
            let objects = certmanager::render(
                &settings.namespace,
                &settings.secret,
                &settings.sans(),
                &settings.policy,
            );
            match certmanager::apply(&client, &objects).await {
                Ok(()) => rendered_cert_manager = true,
                Err(e) => {
                    tracing::warn!(error = %e, "cert-manager objects not applied (is cert-manager installed?)")
                }
            }
        }
        match fetch(&settings, &builtin, &secrets).await {
            Ok((cert, ca_pem)) => {
                let ca_changed = trust.observe(&ca_pem);
                let bundle = trust.bundle(keep_previous);
                let kinds = webhook.kinds();
                let names: Vec<String> = kinds.iter().map(|k| format!("{}.{}", k.plural, k.group)).collect();
                let changed = configured.as_ref().is_none_or(|(b, n, _)| *b != bundle || *n != names);
                let due = configured.as_ref().is_some_and(|(_, _, at)| at.elapsed() > RECONFIGURE_EVERY);
                if changed || due {
                    let if_absent = if changed { config::IfAbsent::Create } else { config::IfAbsent::Leave };
                    match configure(&client, &settings, &kinds, &bundle, if_absent).await {
                        Ok(()) => configured = Some((bundle, names, Instant::now())),
                        Err(e) => tracing::warn!(error = %e, "webhook configuration not updated; retrying"),
                    }
                }
                if ca_changed {
                    tracing::info!("webhook CA changed: both CAs trusted, new certificate served shortly");
                    tokio::time::sleep(TRUST_GRACE).await;
                }
                resolver.set(cert);
            }
            Err(e) => {
                tracing::warn!(error = %e, label = e.label(), "webhook certificate not ready; retrying")
            }
        }
        tokio::time::sleep(interval).await;
    }
}

/// Points the ValidatingWebhookConfiguration and the CRDs at this webhook with `bundle`.
async fn configure(
    client: &Client,
    settings: &WebhookSettings,
    kinds: &[KindInfo],
    bundle: &str,
    if_absent: config::IfAbsent,
) -> Result<(), WebhookError> {
    let inject_from = settings.cert_manager.then(|| certmanager::inject_ca_from(&settings.namespace));
    if matches!(settings.configure, Configure::All | Configure::Validating) {
        let scope = config::Scope { name: &settings.configuration, namespaces: settings.watched.names() };
        let refs: Vec<&KindInfo> = kinds.iter().collect();
        let mut vwc = config::validating_configuration(&scope, &settings.endpoint, &refs, Some(bundle));
        if let Some(from) = &inject_from {
            vwc["metadata"]["annotations"] = serde_json::json!({ config::INJECT_CA_FROM: from });
        }
        if !config::apply_validating(client, &vwc, if_absent).await? {
            tracing::warn!(
                configuration = %settings.configuration,
                "the ValidatingWebhookConfiguration is gone (an uninstall?); not made again until a restart or a change of CA or kinds"
            );
        }
    }
    if matches!(settings.configure, Configure::All | Configure::Conversion) {
        for kind in kinds.iter().filter(|k| k.versions.len() > 1) {
            config::patch_crd_conversion(
                client,
                kind,
                &settings.endpoint,
                Some(bundle),
                inject_from.as_deref(),
            )
            .await?;
        }
    }
    tracing::info!(configuration = %settings.configuration, "webhook configuration points at this webhook");
    Ok(())
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn a_new_ca_is_trusted_beside_the_previous_one_for_a_while() {
        use base64::Engine as _;
        let decode = |b: String| {
            String::from_utf8(base64::engine::general_purpose::STANDARD.decode(b).unwrap_or_default())
                .unwrap_or_default()
        };
        let mut trust = Trust::default();
        assert!(!trust.observe("A\n"));
        assert_eq!(decode(trust.bundle(Duration::from_secs(60))), "A\n");
        assert!(!trust.observe("A\n"));
        assert!(trust.observe("B\n"));
        assert_eq!(decode(trust.bundle(Duration::from_secs(60))), "B\nA\n");
        assert_eq!(decode(trust.bundle(Duration::ZERO)), "B\n");
    }
}
