//! `--cert-manager` mode: instead of the built-in CA, cert-manager issues the webhook's serving
//! certificate. The operator renders the Issuer/Certificate objects (a self-signed root, a CA
//! Issuer on it, and the serving Certificate), annotates its webhook configuration and CRDs
//! with `cert-manager.io/inject-ca-from` (cert-manager's CA injector convention), and serves
//! whatever cert-manager keeps in the Secret, reloading it when cert-manager renews it. It also
//! injects the Secret's `ca.crt` itself, so webhooks work where the injector is not installed.

use kube::api::{Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use serde_json::{json, Value};

use super::certs::{CertPolicy, CA_CRT, TLS_CRT, TLS_KEY};
use super::tls::ServingCert;
use super::WebhookError;

/// Name of the serving Certificate (and the value of the inject-ca-from annotation).
pub const CERTIFICATE: &str = "stateward-webhook";
const ROOT_ISSUER: &str = "stateward-selfsigned";
/// The webhook's CA Certificate, and the Secret where cert-manager keeps that CA.
pub const CA_CERTIFICATE: &str = "stateward-webhook-ca";
const CA_ISSUER: &str = "stateward-webhook-ca";

fn go_duration(d: std::time::Duration) -> String {
    format!("{}s", d.as_secs().max(1))
}

/// The cert-manager objects for the webhook's certificate, in apply order.
pub fn render(namespace: &str, secret: &str, names: &[String], policy: &CertPolicy) -> Vec<Value> {
    let (ips, dns): (Vec<&String>, Vec<&String>) =
        names.iter().partition(|n| n.parse::<std::net::IpAddr>().is_ok());
    let labels =
        json!({ "app.kubernetes.io/name": "stateward", "app.kubernetes.io/managed-by": "stateward" });
    let meta = |name: &str| json!({ "name": name, "namespace": namespace, "labels": labels });
    vec![
        json!({ "apiVersion": "cert-manager.io/v1", "kind": "Issuer", "metadata": meta(ROOT_ISSUER), "spec": { "selfSigned": {} } }),
        json!({
            "apiVersion": "cert-manager.io/v1", "kind": "Certificate", "metadata": meta(CA_CERTIFICATE),
            "spec": {
                "isCA": true, "commonName": "stateward-webhook-ca", "secretName": CA_CERTIFICATE,
                "duration": go_duration(policy.ca_lifetime),
                "privateKey": { "algorithm": "ECDSA", "size": 256 },
                "issuerRef": { "name": ROOT_ISSUER, "kind": "Issuer", "group": "cert-manager.io" },
            },
        }),
        json!({ "apiVersion": "cert-manager.io/v1", "kind": "Issuer", "metadata": meta(CA_ISSUER), "spec": { "ca": { "secretName": CA_CERTIFICATE } } }),
        json!({
            "apiVersion": "cert-manager.io/v1", "kind": "Certificate", "metadata": meta(CERTIFICATE),
            "spec": {
                "secretName": secret,
                "dnsNames": dns,
                "ipAddresses": ips,
                "duration": go_duration(policy.cert_lifetime),
                "renewBefore": go_duration(policy.renew_before),
                "usages": ["server auth", "digital signature", "key encipherment"],
                "privateKey": { "algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always" },
                "issuerRef": { "name": CA_ISSUER, "kind": "Issuer", "group": "cert-manager.io" },
            },
        }),
    ]
}

/// `<namespace>/<Certificate>` for the inject-ca-from annotation.
pub fn inject_ca_from(namespace: &str) -> String {
    format!("{namespace}/{CERTIFICATE}")
}

/// Applies the rendered objects (server-side apply, field manager `stateward`).
pub async fn apply(client: &Client, objects: &[Value]) -> Result<(), WebhookError> {
    for object in objects {
        let kind = object["kind"].as_str().unwrap_or_default();
        let plural = if kind == "Issuer" { "issuers" } else { "certificates" };
        let ns = object.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or_default();
        let name = object.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
        let ar =
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("cert-manager.io", "v1", kind), plural);
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
        api.patch(name, &PatchParams::apply("stateward").force(), &Patch::Apply(object))
            .await
            .map_err(WebhookError::kube("applying a cert-manager object"))?;
    }
    Ok(())
}

/// The serving certificate and its CA (PEM) from a cert-manager Secret, once cert-manager
/// has filled it.
pub fn from_secret(
    secret: &k8s_openapi::api::core::v1::Secret,
) -> Option<Result<(ServingCert, String), WebhookError>> {
    let data = secret.data.as_ref()?;
    let text = |k: &str| data.get(k).and_then(|b| String::from_utf8(b.0.clone()).ok());
    let (cert, key, ca) = (text(TLS_CRT)?, text(TLS_KEY)?, text(CA_CRT)?);
    Some(ServingCert::from_pem(&cert, &key).map(|s| (s, ca)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_ca_chain_and_a_serving_certificate() {
        let policy = CertPolicy::default();
        let objs =
            render("ops", "hook-tls", &["127.0.0.1".into(), "stateward-webhook.ops.svc".into()], &policy);
        let kinds: Vec<&str> = objs.iter().filter_map(|o| o["kind"].as_str()).collect();
        // The webhook's chain only: the managed clusters' CAs are per instance, the keeper's.
        assert_eq!(kinds, ["Issuer", "Certificate", "Issuer", "Certificate"]);
        let serving = &objs[3];
        assert_eq!(serving["spec"]["secretName"], "hook-tls");
        assert_eq!(serving["spec"]["dnsNames"], serde_json::json!(["stateward-webhook.ops.svc"]));
        assert_eq!(serving["spec"]["ipAddresses"], serde_json::json!(["127.0.0.1"]));
        assert_eq!(serving["spec"]["renewBefore"], "2592000s");
        assert_eq!(serving["spec"]["issuerRef"]["name"], objs[2]["metadata"]["name"]);
        assert_eq!(objs[2]["spec"]["ca"]["secretName"], objs[1]["spec"]["secretName"]);
        assert_eq!(inject_ca_from("ops"), "ops/stateward-webhook");
    }
}
