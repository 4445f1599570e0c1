//! Where the API server finds the webhooks: the ValidatingWebhookConfiguration for the
//! plugin-served kinds and the conversion stanza of their CRDs, rendered here (deploy/ and
//! `stateward crds` use the same functions) and kept current with the caBundle at run time.

use kube::api::{Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use serde_json::{json, Value};

use crate::runtime::KindInfo;

use super::WebhookError;

/// Path of the admission webhook.
pub const VALIDATE_PATH: &str = "/validate";
/// Path of the conversion webhook.
pub const CONVERT_PATH: &str = "/convert";
/// Name of the validating webhook inside its configuration.
pub const WEBHOOK_NAME: &str = "validate.stateward.dev";
/// Default Service of the webhook (deploy/webhook/service.yaml).
pub const SERVICE_NAME: &str = "stateward-webhook";
/// Default namespace of the operator (deploy/operator/namespace.yaml).
pub const SERVICE_NAMESPACE: &str = "stateward-system";
/// The annotation cert-manager's CA injector reads (`<namespace>/<Certificate>`).
pub const INJECT_CA_FROM: &str = "cert-manager.io/inject-ca-from";
/// How long the API server waits for a webhook answer.
pub const TIMEOUT_SECONDS: u32 = 10;

/// How the API server reaches the webhook server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// In-cluster: a Service (port 443 forwarding to the pods' 9443).
    Service { namespace: String, name: String },
    /// A base URL such as `https://127.0.0.1:9443` (operator outside the cluster, tests).
    Url(String),
}

impl Default for Endpoint {
    fn default() -> Self {
        Endpoint::Service { namespace: SERVICE_NAMESPACE.into(), name: SERVICE_NAME.into() }
    }
}

impl Endpoint {
    /// `clientConfig` for `path`, with `caBundle` when given (base64 PEM).
    pub fn client_config(&self, path: &str, ca_bundle: Option<&str>) -> Value {
        let mut config = match self {
            Endpoint::Service { namespace, name } => {
                json!({ "service": { "namespace": namespace, "name": name, "path": path, "port": 443 } })
            }
            Endpoint::Url(base) => json!({ "url": format!("{}{path}", base.trim_end_matches('/')) }),
        };
        if let Some(ca) = ca_bundle {
            config["caBundle"] = json!(ca);
        }
        config
    }

    /// The host name or IP the serving certificate must name, for a URL endpoint.
    pub fn url_host(&self) -> Option<String> {
        let Endpoint::Url(base) = self else { return None };
        let rest = base.split_once("://").map_or(base.as_str(), |(_, r)| r);
        let authority = rest.split('/').next().unwrap_or(rest);
        let host = match authority.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or(v6),
            None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
        };
        (!host.is_empty()).then(|| host.to_string())
    }
}

/// The `spec.conversion` of a CRD whose versions the plugin converts.
pub fn crd_conversion(endpoint: &Endpoint, ca_bundle: Option<&str>) -> Value {
    json!({
        "strategy": "Webhook",
        "webhook": {
            "conversionReviewVersions": ["v1"],
            "clientConfig": endpoint.client_config(CONVERT_PATH, ca_bundle),
        },
    })
}

/// What a ValidatingWebhookConfiguration covers.
#[derive(Debug, Clone)]
pub struct Scope<'a> {
    /// Object name of the configuration (cluster-scoped).
    pub name: &'a str,
    /// Only these namespaces (operator in `--namespace` mode); all namespaces when empty.
    pub namespaces: &'a [String],
}

/// The ValidatingWebhookConfiguration for `kinds`: CREATE, UPDATE and DELETE of each kind at
/// its storage version (matchPolicy Equivalent sends requests made at other versions too,
/// converted), fail closed, no side effects (so dry-run requests reach it).
pub fn validating_configuration(
    scope: &Scope<'_>,
    endpoint: &Endpoint,
    kinds: &[&KindInfo],
    ca_bundle: Option<&str>,
) -> Value {
    let rules: Vec<Value> = kinds
        .iter()
        .map(|k| {
            json!({
                "apiGroups": [k.group],
                "apiVersions": [k.storage_version().map_or("v1", |v| v.name.as_str())],
                "operations": ["CREATE", "UPDATE", "DELETE"],
                "resources": [k.plural],
                "scope": "Namespaced",
            })
        })
        .collect();
    let mut webhook = json!({
        "name": WEBHOOK_NAME,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Fail",
        "matchPolicy": "Equivalent",
        "timeoutSeconds": TIMEOUT_SECONDS,
        "rules": rules,
        "clientConfig": endpoint.client_config(VALIDATE_PATH, ca_bundle),
    });
    if !scope.namespaces.is_empty() {
        webhook["namespaceSelector"] = json!({
            "matchExpressions": [{ "key": "kubernetes.io/metadata.name", "operator": "In", "values": scope.namespaces }],
        });
    }
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {
            "name": scope.name,
            // No app.kubernetes.io/managed-by: that label is the installer's (deploy/ says
            // stateward, Helm says Helm and deletes on uninstall only what still says so).
            "labels": { "app.kubernetes.io/name": "stateward" },
        },
        "webhooks": [webhook],
    })
}

fn dynamic(client: &Client, group: &str, version: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural),
    )
}

/// What an apply does when the configuration is not there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IfAbsent {
    /// Make it: this replica starts, or the CA or the kinds changed.
    Create,
    /// Leave it gone: a periodic refresh. An uninstall deletes the configuration and then the
    /// operator; a refresh between the two would bring back a configuration that fails closed
    /// with no webhook left behind it.
    Leave,
}

/// Applies the whole configuration (server-side apply, field manager `stateward`, forced:
/// the operator owns it). Whether it was applied: false when it was gone and `if_absent`
/// said to leave it so.
pub async fn apply_validating(
    client: &Client,
    config: &Value,
    if_absent: IfAbsent,
) -> Result<bool, WebhookError> {
    let api = dynamic(
        client,
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingWebhookConfiguration",
        "validatingwebhookconfigurations",
    );
    let name = config.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    if if_absent == IfAbsent::Leave {
        // An empty merge patch writes nothing and answers 404 when the object is gone, with the
        // verb the operator already has on it by name (no get).
        match api.patch(name, &PatchParams::default(), &Patch::Merge(json!({}))).await {
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(false),
            Err(e) => return Err(WebhookError::kube("looking for the ValidatingWebhookConfiguration")(e)),
            Ok(_) => {}
        }
    }
    api.patch(name, &PatchParams::apply("stateward").force(), &Patch::Apply(config))
        .await
        .map_err(WebhookError::kube("applying the ValidatingWebhookConfiguration"))?;
    Ok(true)
}

/// Points the CRD of `kind` at the conversion webhook. A merge patch replaces the whole
/// clientConfig (so a `url` never sits beside a `service` left by another field manager).
pub async fn patch_crd_conversion(
    client: &Client,
    kind: &KindInfo,
    endpoint: &Endpoint,
    ca_bundle: Option<&str>,
    inject_from: Option<&str>,
) -> Result<(), WebhookError> {
    let api = dynamic(
        client,
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
    );
    let mut client_config = endpoint.client_config(CONVERT_PATH, ca_bundle);
    match endpoint {
        Endpoint::Url(_) => client_config["service"] = Value::Null,
        Endpoint::Service { .. } => client_config["url"] = Value::Null,
    }
    let mut patch = json!({ "spec": { "conversion": {
        "strategy": "Webhook",
        "webhook": { "conversionReviewVersions": ["v1"], "clientConfig": client_config },
    } } });
    if let Some(from) = inject_from {
        patch["metadata"] = json!({ "annotations": { INJECT_CA_FROM: from } });
    }
    let name = format!("{}.{}", kind.plural, kind.group);
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(WebhookError::kube("patching a CRD's conversion webhook"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_hosts() {
        let host = |u: &str| Endpoint::Url(u.into()).url_host();
        assert_eq!(host("https://127.0.0.1:9443").as_deref(), Some("127.0.0.1"));
        assert_eq!(host("https://[::1]:9443/x").as_deref(), Some("::1"));
        assert_eq!(host("https://hook.example:8443").as_deref(), Some("hook.example"));
        assert_eq!(Endpoint::default().url_host(), None);
    }

    #[test]
    fn client_configs() {
        let svc = Endpoint::default().client_config(VALIDATE_PATH, Some("Q0E="));
        assert_eq!(svc["service"]["name"], SERVICE_NAME);
        assert_eq!(svc["service"]["path"], VALIDATE_PATH);
        assert_eq!(svc["caBundle"], "Q0E=");
        let url = Endpoint::Url("https://127.0.0.1:9/".into()).client_config(CONVERT_PATH, None);
        assert_eq!(url, json!({ "url": "https://127.0.0.1:9/convert" }));
    }

    /// A client answering each request with the next `(status, body)`, and what it was asked:
    /// (method, content type).
    fn scripted(answers: Vec<(u16, Value)>) -> (Client, tokio::task::JoinHandle<Vec<(String, String)>>) {
        use http::{Request, Response};
        use kube::client::Body;
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let server = tokio::spawn(async move {
            let mut seen = Vec::new();
            for (code, body) in answers {
                let Some((request, respond)) = handle.next_request().await else { break };
                let kind = request.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("");
                seen.push((request.method().to_string(), kind.to_string()));
                let bytes = serde_json::to_vec(&body).unwrap_or_default();
                #[allow(clippy::expect_used)]
                let response = Response::builder().status(code).body(Body::from(bytes)).expect("a response");
                respond.send_response(response);
            }
            seen
        });
        (Client::new(service, "default"), server)
    }

    #[test]
    fn the_configuration_leaves_the_installers_label_alone() {
        let scope = Scope { name: "stateward", namespaces: &[] };
        let vwc = validating_configuration(&scope, &Endpoint::default(), &[], Some("Q0E="));
        assert_eq!(vwc["metadata"]["labels"], json!({ "app.kubernetes.io/name": "stateward" }));
    }

    /// A set of namespaces watched: admission covers exactly them.
    #[test]
    fn the_configuration_selects_the_namespaces_watched() {
        let names = ["billing".to_string(), "shop".to_string()];
        let vwc = validating_configuration(
            &Scope { name: "stateward", namespaces: &names },
            &Endpoint::default(),
            &[],
            None,
        );
        assert_eq!(
            vwc["webhooks"][0]["namespaceSelector"]["matchExpressions"][0],
            json!({ "key": "kubernetes.io/metadata.name", "operator": "In", "values": ["billing", "shop"] })
        );
        let all = validating_configuration(
            &Scope { name: "stateward", namespaces: &[] },
            &Endpoint::default(),
            &[],
            None,
        );
        assert!(all["webhooks"][0].get("namespaceSelector").is_none());
    }

    fn configuration() -> Value {
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
               "metadata": {"name": "stateward"}, "webhooks": []})
    }

    #[tokio::test]
    async fn a_refresh_leaves_a_removed_configuration_removed_and_a_start_makes_it() {
        let gone = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
                          "message": "validatingwebhookconfigurations \"stateward\" not found"});
        let (client, server) = scripted(vec![(404, gone)]);
        let applied = apply_validating(&client, &configuration(), IfAbsent::Leave).await;
        drop(client);
        assert!(matches!(applied, Ok(false)), "{applied:?}");
        let seen = server.await.unwrap_or_default();
        assert_eq!(
            seen,
            [("PATCH".to_string(), "application/merge-patch+json".to_string())],
            "only the probe"
        );

        // Present: probed, then applied. At a start: applied at once (creating it).
        let (client, server) = scripted(vec![(200, configuration()), (200, configuration())]);
        assert!(matches!(apply_validating(&client, &configuration(), IfAbsent::Leave).await, Ok(true)));
        drop(client);
        let kinds: Vec<String> = server.await.unwrap_or_default().into_iter().map(|(_, k)| k).collect();
        assert_eq!(kinds, ["application/merge-patch+json", "application/apply-patch+yaml"]);
        let (client, server) = scripted(vec![(201, configuration())]);
        assert!(matches!(apply_validating(&client, &configuration(), IfAbsent::Create).await, Ok(true)));
        drop(client);
        let kinds: Vec<String> = server.await.unwrap_or_default().into_iter().map(|(_, k)| k).collect();
        assert_eq!(kinds, ["application/apply-patch+yaml"]);
    }
}
