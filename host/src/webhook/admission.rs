//! The validating admission webhook: `plugin.validate(new, old)` for what the schema cannot
//! express, then `data.stateward.admission` for who may change what. One audited decision per
//! request (its input carries the plugin's field errors too); every failure denies.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};
use tracing::Instrument as _;

use crate::plugin_call;
use crate::policy::{DecisionContext, DecisionPoint};
use crate::policy_input::{AdmissionRequest, UserInfo};
use crate::runtime::FieldError;
use crate::telemetry::otel::webhook_span;

use super::Webhook;

/// The parts of an `admission.k8s.io/v1` AdmissionRequest the decision needs.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Request {
    #[allow(dead_code)] // the answer echoes the raw uid, whatever its type
    uid: String,
    kind: GroupVersionKind,
    operation: String,
    #[serde(default)]
    user_info: RequestUser,
    #[serde(default)]
    object: Value,
    #[serde(default)]
    old_object: Value,
    #[serde(default)]
    dry_run: bool,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    name: String,
}

#[derive(Debug, Deserialize)]
struct GroupVersionKind {
    #[serde(default)]
    group: String,
    version: String,
    kind: String,
}

#[derive(Debug, Default, Deserialize)]
struct RequestUser {
    #[serde(default)]
    username: String,
    #[serde(default)]
    groups: Vec<String>,
}

/// What the webhook answers, before it is wrapped in an AdmissionReview.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub allowed: bool,
    /// 422 when only the plugin's field checks failed, 403 when policy denied, 400 for a
    /// request that cannot be read.
    pub code: u16,
    pub message: String,
    pub warnings: Vec<String>,
}

impl Answer {
    fn deny(code: u16, message: String) -> Self {
        Self { allowed: false, code, message, warnings: Vec::new() }
    }
}

/// Answers one AdmissionReview (any JSON in, always an AdmissionReview out).
pub async fn review(webhook: Arc<Webhook>, body: Value) -> Value {
    let uid = body.pointer("/request/uid").cloned().unwrap_or(Value::String(String::new()));
    let answer = match body.get("request").cloned().map(serde_json::from_value::<Request>) {
        Some(Ok(req)) => {
            let span = webhook_span("validate", &req.kind.kind, &req.namespace, &req.name);
            span.record("operation", req.operation.as_str());
            span.record("user", req.user_info.username.as_str());
            span.record("dry_run", req.dry_run);
            let answer = decide(webhook, req).instrument(span.clone()).await;
            span.record("result", if answer.allowed { "allow" } else { "deny" });
            answer
        }
        Some(Err(e)) => Answer::deny(400, format!("malformed AdmissionRequest: {e}")),
        None => Answer::deny(400, "AdmissionReview without a request".into()),
    };
    let mut response = json!({ "uid": uid, "allowed": answer.allowed });
    if !answer.allowed {
        let reason = match answer.code {
            403 => "Forbidden",
            422 => "Invalid",
            _ => "BadRequest",
        };
        response["status"] = json!({ "code": answer.code, "reason": reason, "message": answer.message });
    }
    if !answer.warnings.is_empty() {
        response["warnings"] = json!(answer.warnings);
    }
    json!({ "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response })
}

async fn decide(webhook: Arc<Webhook>, req: Request) -> Answer {
    let api_version = if req.kind.group.is_empty() {
        req.kind.version.clone()
    } else {
        format!("{}/{}", req.kind.group, req.kind.version)
    };
    let Some(plugin) = webhook.registry.get(&req.kind.group, &req.kind.kind) else {
        return Answer::deny(403, format!("no plugin serves {} {api_version}", req.kind.kind));
    };
    let mut warnings = Vec::new();
    let mut field_errors = if req.operation == "CREATE" || req.operation == "UPDATE" {
        let new = req.object.to_string();
        let old = (req.operation == "UPDATE").then(|| req.old_object.to_string());
        let call = plugin_call::call(&webhook.sandbox, &webhook.metrics, &plugin, "validate", move |guest| {
            guest.validate(&new, old.as_deref())
        })
        .await;
        match call {
            Ok(Ok(errors)) => errors,
            Ok(Err(e)) => vec![FieldError { path: String::new(), message: format!("plugin-error: {e}") }],
            Err(e) => vec![FieldError { path: String::new(), message: format!("plugin-error: {e}") }],
        }
    } else {
        Vec::new()
    };
    if req.operation == "CREATE" && !webhook.name_checks.take() {
        warnings.push(format!(
            "metadata.name: not checked against the other kinds (more than {NAME_CHECKS_PER_SECOND} creates a second); the operator refuses a taken name when it reconciles"
        ));
    } else if req.operation == "CREATE" {
        let name = req.object.pointer("/metadata/name").and_then(Value::as_str).unwrap_or(&req.name);
        // Bounded well inside the API server's webhook timeout: a slow or broken list of
        // another kind must not turn into a refused create (the webhook fails closed).
        let check = tokio::time::timeout(
            NAME_CHECK_TIMEOUT,
            name_taken(&webhook, &req.kind.kind, &req.namespace, name),
        )
        .await;
        match check.unwrap_or_else(|_| Err(format!("no answer within {NAME_CHECK_TIMEOUT:?}"))) {
            Ok(None) => {}
            Ok(Some(holder)) => field_errors.push(FieldError {
                path: "metadata.name".into(),
                message: format!(
                    "{holder} {name} already exists in this namespace; children, volumes and credentials are named after \
                     their resource, so a name serves one resource across kinds: choose another"
                ),
            }),
            // The controller refuses a taken name anyway (controller/claims.rs); this check
            // only says so sooner, so it does not block a create it could not make.
            Err(e) => warnings.push(format!("metadata.name: could not check whether another kind uses this name: {e}")),
        }
    }
    let request = AdmissionRequest {
        operation: req.operation.clone(),
        user_info: UserInfo {
            username: req.user_info.username.clone(),
            groups: req.user_info.groups.clone(),
        },
        object: req.object,
        old_object: req.old_object,
        dry_run: req.dry_run,
    };
    let input = request.document(Some(&field_errors));
    let gate = webhook.gate.current();
    let user = req.user_info.username.clone();
    // Taken here, in the request's span: the blocking task below runs outside it.
    let decision = DecisionContext::in_current_span(String::new());
    // Evaluation is CPU work and the audit write may fsync: off the reactor.
    let verdict =
        tokio::task::spawn_blocking(move || gate.decide(&decision, &user, DecisionPoint::Admission, &input))
            .await;
    let verdict = match verdict {
        Ok(v) => v,
        Err(e) => return Answer::deny(403, format!("policy-error: decision task failed: {e}")),
    };
    let mut messages: Vec<String> = field_errors
        .iter()
        .map(|e| if e.path.is_empty() { e.message.clone() } else { format!("{}: {}", e.path, e.message) })
        .collect();
    messages.extend(verdict.denied.iter().cloned());
    let code = if verdict.allowed() { 422 } else { 403 };
    Answer {
        allowed: messages.is_empty(),
        code,
        message: messages.join("; "),
        warnings: warnings.into_iter().chain(verdict.warned).collect(),
    }
}

/// Name checks per second a replica makes at most (each lists the other kinds by name on the
/// API server), after a burst of twice as many: reviews past it skip the check with a warning.
/// Whoever reaches the webhook port can send reviews (the webhook does not authenticate its
/// client), so without a bound each forged CREATE review would cost the API server, which the
/// reconciles share, two list calls.
pub const NAME_CHECKS_PER_SECOND: f64 = 10.0;

/// The budget of [`NAME_CHECKS_PER_SECOND`].
pub fn name_check_budget() -> super::budget::Budget {
    super::budget::Budget::new(NAME_CHECKS_PER_SECOND, 2.0 * NAME_CHECKS_PER_SECOND)
}

/// How long admission waits to learn whether a new resource's name is taken.
const NAME_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The kind of another resource named `name` in `namespace`, among the kinds served now.
async fn name_taken(
    webhook: &Webhook,
    kind: &str,
    namespace: &str,
    name: &str,
) -> Result<Option<String>, String> {
    if name.is_empty() {
        return Ok(None);
    }
    for other in webhook.kinds().into_iter().filter(|k| k.kind != kind) {
        let Some(storage) = other.storage_version() else { continue };
        let gvk = kube::core::GroupVersionKind::gvk(&other.group, &storage.name, &other.kind);
        let resource = kube::core::ApiResource::from_gvk_with_plural(&gvk, &other.plural);
        let api: kube::Api<kube::core::DynamicObject> =
            kube::Api::namespaced_with(webhook.client.clone(), namespace, &resource);
        let found = api
            .list_metadata(&kube::api::ListParams::default().fields(&format!("metadata.name={name}")))
            .await
            .map_err(|e| e.to_string())?;
        if !found.items.is_empty() {
            return Ok(Some(other.kind));
        }
    }
    Ok(None)
}
