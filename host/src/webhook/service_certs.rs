//! Service certificates for managed clusters (issue 7, item 4), service-agnostic and within the
//! WIT contract as it is: a plugin asks for a certificate with an ordinary `ensure-secret`
//! whose labels carry [`CERTIFICATE_LABEL`] (keys `tls.crt`, `tls.key`, `ca.crt` as for any
//! `kubernetes.io/tls` Secret). The host then issues from its CA instead of filling random
//! bytes, naming every Service of the same instance in the same plan (plus pod DNS names under
//! headless Services), renews it under the threshold, and stamps the hash of every certificate
//! a pod template mounts into [`POD_ANNOTATION`], so the StatefulSet controller rolls the pods
//! one at a time when a certificate changes. No service name appears here: Services, Secrets
//! and pod templates are plain Kubernetes.
//!
//! [`CertificateKeeper`] does this beside the controller, with the operator's existing
//! permissions (list/watch/patch on Secrets, Services and StatefulSets): the controller creates
//! the labelled Secret through `ensure-secret` and never overwrites it afterwards; the keeper
//! fills and renews it, and patches only the one pod-template annotation (a field the
//! controller's server-side apply does not own, so the two never fight). A StatefulSet in the
//! middle of a roll is stamped only once that roll is done ([`roll_in_progress`]), so rolls
//! never overlap.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::certs::{self, CertPolicy, Material};
use super::WebhookError;

/// Label of an `ensure-secret` request that asks for a server certificate (value `server`).
pub const CERTIFICATE_LABEL: &str = "stateward.dev/certificate";
/// Pod-template annotation: SHA-256 over the certificates the pods mount.
pub const POD_ANNOTATION: &str = "stateward.dev/certificates-sha256";
/// The instance label every child carries.
const INSTANCE_LABEL: &str = "stateward.dev/instance";
/// JSON pointers to the two keys above (`/` escaped as `~1`).
const INSTANCE_POINTER: &str = "/metadata/labels/stateward.dev~1instance";
const POD_ANNOTATION_POINTER: &str = "/spec/template/metadata/annotations/stateward.dev~1certificates-sha256";

/// Whether a secret request's labels ask for a certificate.
pub fn is_certificate_request(labels: &[(String, String)]) -> bool {
    labels.iter().any(|(k, v)| k == CERTIFICATE_LABEL && v == "server")
}

/// DNS names for the Services of `instance` among `objects` (a plan's applied objects): each
/// Service's short, namespaced and cluster-local names, and for a headless Service the
/// wildcard its pods' names fall under.
pub fn service_sans(objects: &[Value], instance: &str, namespace: &str) -> Vec<String> {
    let mut names = BTreeSet::new();
    for o in objects {
        if o["kind"] != "Service" || o.pointer(INSTANCE_POINTER) != Some(&json!(instance)) {
            continue;
        }
        let Some(name) = o.pointer("/metadata/name").and_then(Value::as_str) else {
            continue;
        };
        names.extend(certs::service_sans(name, namespace));
        if o.pointer("/spec/clusterIP").and_then(Value::as_str) == Some("None") {
            names.insert(format!("*.{name}.{namespace}.svc"));
            names.insert(format!("*.{name}.{namespace}.svc.cluster.local"));
        }
    }
    names.into_iter().collect()
}

/// String data (`tls.crt`, `tls.key`, `ca.crt`) and annotations of a certificate Secret.
pub type Issued = (BTreeMap<String, String>, BTreeMap<String, String>);

/// Issues a certificate for `sans` from `ca` (only its CA half is used) as Secret string data
/// and annotations.
pub fn issue(ca: &Material, sans: &[String], policy: &CertPolicy) -> Result<Issued, WebhookError> {
    let mut m = ca.clone();
    certs::renew_serving(&mut m, policy, sans)?;
    let data = BTreeMap::from([
        (certs::TLS_CRT.to_string(), m.cert_pem.clone()),
        (certs::TLS_KEY.to_string(), m.key_pem.clone()),
        (certs::CA_CRT.to_string(), m.ca_pem.clone()),
    ]);
    let annotations = BTreeMap::from([
        (certs::CERT_NOT_AFTER.to_string(), m.cert_not_after.to_string()),
        (certs::CERT_SANS.to_string(), sans.join(",")),
    ]);
    Ok((data, annotations))
}

/// Whether a certificate Secret (its annotations as issued) needs a new certificate: missing,
/// under the threshold, or for other names.
pub fn renewal_due(
    annotations: Option<&BTreeMap<String, String>>,
    sans: &[String],
    policy: &CertPolicy,
    now_unix: i64,
) -> bool {
    let Some(a) = annotations else { return true };
    let not_after = a
        .get(certs::CERT_NOT_AFTER)
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap_or(0);
    let threshold = i64::try_from(policy.renew_before.as_secs()).unwrap_or(i64::MAX);
    let names: Vec<&str> = a
        .get(certs::CERT_SANS)
        .map(|s| s.split(',').collect())
        .unwrap_or_default();
    not_after - now_unix < threshold || names != sans.iter().map(String::as_str).collect::<Vec<_>>()
}

/// Names of the Secrets a pod template mounts (secret volumes and projected sources).
pub fn mounted_secrets(pod_template: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for v in pod_template
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(n) = v.pointer("/secret/secretName").and_then(Value::as_str) {
            out.insert(n.to_string());
        }
        for s in v
            .pointer("/projected/sources")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(n) = s.pointer("/secret/name").and_then(Value::as_str) {
                out.insert(n.to_string());
            }
        }
    }
    out
}

/// Stamps [`POD_ANNOTATION`] on a StatefulSet's pod template from the `tls.crt` of every
/// certificate Secret it mounts (`certificates`: Secret name → PEM). Returns whether the
/// template mounts any; the value depends only on the certificates, so an unchanged
/// certificate never rolls a pod and a renewed one rolls them (one at a time, the
/// StatefulSet's RollingUpdate).
pub fn stamp_pod_template(statefulset: &mut Value, certificates: &BTreeMap<String, String>) -> bool {
    let Some(template) = statefulset.pointer_mut("/spec/template") else {
        return false;
    };
    let mounted: Vec<(&String, &String)> = mounted_secrets(template)
        .into_iter()
        .filter_map(|n| certificates.get_key_value(&n))
        .collect();
    if mounted.is_empty() {
        return false;
    }
    let mut h = Sha256::new();
    for (name, pem) in mounted {
        h.update(name.as_bytes());
        h.update([0]);
        h.update(Sha256::digest(pem.as_bytes()));
    }
    let digest = hex::encode(h.finalize());
    if !template["metadata"].is_object() {
        template["metadata"] = json!({});
    }
    if !template["metadata"]["annotations"].is_object() {
        template["metadata"]["annotations"] = json!({});
    }
    template["metadata"]["annotations"][POD_ANNOTATION] = json!(digest);
    true
}

/// Whether a StatefulSet (as JSON) is in the middle of a rolling update: its controller has not
/// yet observed the current spec, or its pods are not all on the update revision. The keeper
/// does not re-stamp such a set: a new stamp mid-roll would start a second roll over the
/// first (the pods already replaced restart again) for no gain, since the renewed Secret is
/// already written and its old certificate is still valid for `renew_before`. The stamp
/// follows on a later pass, once the roll is done. Sets that do not roll on their own
/// (`OnDelete`, a partition) are never held back: their revisions differ by design.
pub fn roll_in_progress(statefulset: &Value) -> bool {
    let strategy = statefulset.pointer("/spec/updateStrategy");
    let rolling = strategy
        .and_then(|s| s.get("type"))
        .and_then(Value::as_str)
        .is_none_or(|t| t == "RollingUpdate");
    let partition = strategy
        .and_then(|s| s.pointer("/rollingUpdate/partition"))
        .and_then(Value::as_i64)
        .unwrap_or(0);
    if !rolling || partition > 0 {
        return false;
    }
    let generation = statefulset.pointer("/metadata/generation").and_then(Value::as_i64);
    let observed = statefulset.pointer("/status/observedGeneration").and_then(Value::as_i64);
    let current = statefulset.pointer("/status/currentRevision").and_then(Value::as_str);
    let update = statefulset.pointer("/status/updateRevision").and_then(Value::as_str);
    observed < generation || update.is_none() || current != update
}

/// Issues and renews the certificate Secrets of managed clusters and stamps their
/// StatefulSets, from the webhook's CA (built-in mode).
pub struct CertificateKeeper {
    pub client: kube::Client,
    /// Watched namespace; all when `None`.
    pub namespace: Option<String>,
    /// The Secret holding the CA (namespace, name): the webhook's built-in one, or with
    /// `--cert-manager` the CA Secret cert-manager keeps for the operator's CA Issuer.
    pub ca_secret: (String, String),
    /// Whether `ca_secret` is cert-manager's (CA in `tls.crt`/`tls.key`).
    pub cert_manager: bool,
    pub policy: CertPolicy,
}

impl CertificateKeeper {
    fn api<K>(&self, namespace: Option<&str>) -> kube::Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        match namespace.or(self.namespace.as_deref()) {
            Some(ns) => kube::Api::namespaced(self.client.clone(), ns),
            None => kube::Api::all(self.client.clone()),
        }
    }

    /// Runs [`Self::sync`] every check interval, and half a second after a certificate Secret
    /// or an instance's Service is created or changed: a new cluster's Secret starts with
    /// placeholder bytes from `ensure-secret`, and its pods cannot serve TLS until it holds a
    /// real certificate (the interval is up to a minute with the default lifetimes). A pass
    /// lists Secrets, Services and StatefulSets once each, whatever the number of clusters.
    /// Errors are logged.
    pub async fn run(self) {
        use futures::StreamExt;
        use kube::runtime::{watcher, WatchStreamExt};
        use k8s_openapi::api::core::v1::{Secret, Service};
        use kube::core::PartialObjectMeta;
        let wake = std::sync::Arc::new(tokio::sync::Notify::new());
        // A certificate needs its Secret and the instance's Services (its names): a change to
        // either wakes a pass.
        let secrets: kube::Api<PartialObjectMeta<Secret>> = self.api(None);
        let services: kube::Api<PartialObjectMeta<Service>> = self.api(None);
        let secret_events = watcher::watcher(secrets, watcher::Config::default().labels(&format!("{CERTIFICATE_LABEL}=server")))
            .default_backoff()
            .map(|e| matches!(e, Ok(watcher::Event::Apply(_))));
        let service_events = watcher::watcher(services, watcher::Config::default().labels(INSTANCE_LABEL))
            .default_backoff()
            .map(|e| matches!(e, Ok(watcher::Event::Apply(_))));
        let notify = std::sync::Arc::clone(&wake);
        tokio::spawn(async move {
            let mut events = std::pin::pin!(futures::stream::select(secret_events, service_events));
            while let Some(changed) = events.next().await {
                if changed {
                    notify.notify_one();
                }
            }
        });
        loop {
            match self.sync().await {
                Ok(n) if n > 0 => tracing::info!(issued = n, "service certificates issued"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "service certificates not kept; retrying"),
            }
            tokio::select! {
                () = tokio::time::sleep(self.policy.check_interval()) => {}
                // A plan writes its Secret and Services within moments: one pass for the lot.
                () = wake.notified() => tokio::time::sleep(std::time::Duration::from_millis(500)).await,
            }
        }
    }

    /// One pass: issue what is due, then stamp every StatefulSet that mounts a certificate.
    /// Returns how many certificates were issued.
    pub async fn sync(&self) -> Result<usize, WebhookError> {
        use k8s_openapi::api::apps::v1::StatefulSet;
        use k8s_openapi::api::core::v1::{Secret, Service};
        use kube::api::{ListParams, Patch, PatchParams};
        let ca_api: kube::Api<Secret> = kube::Api::namespaced(self.client.clone(), &self.ca_secret.0);
        let Some(ca) = ca_api
            .get_opt(&self.ca_secret.1)
            .await
            .map_err(WebhookError::kube("reading the CA Secret"))?
            .as_ref()
            .and_then(|secret| if self.cert_manager { certs::ca_from_cert_manager(secret) } else { Material::from_secret(secret) })
        else {
            return Ok(0);
        };
        let secrets: kube::Api<Secret> = self.api(None);
        let wanted = secrets
            .list(&ListParams::default().labels(&format!("{CERTIFICATE_LABEL}=server")))
            .await
            .map_err(WebhookError::kube("listing certificate Secrets"))?;
        // Every instance's Services in one call (a pass costs the same for 1 or 1000 clusters).
        let services: kube::Api<Service> = self.api(None);
        let mut services_by_ns: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        for service in services
            .list(&ListParams::default().labels(INSTANCE_LABEL))
            .await
            .map_err(WebhookError::kube("listing the instances' Services"))?
        {
            let Some(ns) = service.metadata.namespace.clone() else { continue };
            if let Ok(mut value) = serde_json::to_value(&service) {
                value["kind"] = json!("Service");
                services_by_ns.entry(ns).or_default().push(value);
            }
        }
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let mut issued = 0;
        let mut by_namespace: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for secret in wanted {
            let (Some(ns), Some(name)) = (secret.metadata.namespace.clone(), secret.metadata.name.clone()) else {
                continue;
            };
            let Some(instance) = secret
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(INSTANCE_LABEL))
                .cloned()
            else {
                continue;
            };
            let objects = services_by_ns.get(&ns).map(Vec::as_slice).unwrap_or_default();
            let sans = service_sans(objects, &instance, &ns);
            let text = |k: &str| {
                secret
                    .data
                    .as_ref()
                    .and_then(|d| d.get(k))
                    .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                    .unwrap_or_default()
            };
            let current_ca = text(certs::CA_CRT) == ca.ca_pem;
            let pem = if sans.is_empty() {
                continue;
            } else if current_ca && !renewal_due(secret.metadata.annotations.as_ref(), &sans, &self.policy, now) {
                text(certs::TLS_CRT)
            } else {
                let (data, annotations) = issue(&ca, &sans, &self.policy)?;
                let patch = json!({
                    "metadata": { "resourceVersion": secret.metadata.resource_version, "annotations": annotations },
                    "type": "Opaque",
                    "stringData": data,
                });
                let api: kube::Api<Secret> = self.api(Some(&ns));
                match api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                    Ok(_) => issued += 1,
                    // Another replica renewed it first; the next pass reads its result.
                    Err(kube::Error::Api(s)) if s.code == 409 => continue,
                    Err(e) => return Err(WebhookError::kube("writing a certificate Secret")(e)),
                }
                data.get(certs::TLS_CRT).cloned().unwrap_or_default()
            };
            by_namespace.entry(ns).or_default().insert(name, pem);
        }
        for (ns, certificates) in by_namespace {
            let sets: kube::Api<StatefulSet> = self.api(Some(&ns));
            let listed = sets
                .list(&ListParams::default().labels(INSTANCE_LABEL))
                .await
                .map_err(WebhookError::kube("listing StatefulSets"))?;
            for sts in listed {
                let Some(name) = sts.metadata.name.clone() else {
                    continue;
                };
                let mut value = serde_json::to_value(&sts).unwrap_or_default();
                let before = value.pointer(POD_ANNOTATION_POINTER).cloned();
                if !stamp_pod_template(&mut value, &certificates) {
                    continue;
                }
                let after = value.pointer(POD_ANNOTATION_POINTER).cloned();
                if before != after && roll_in_progress(&value) {
                    tracing::debug!(namespace = %ns, statefulset = %name, "certificate changed; stamping after the roll in progress");
                } else if before != after {
                    let patch =
                        json!({ "spec": { "template": { "metadata": { "annotations": { POD_ANNOTATION: after } } } } });
                    sets.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .map_err(WebhookError::kube("stamping a StatefulSet"))?;
                    tracing::info!(namespace = %ns, statefulset = %name, "certificate changed: pods roll");
                }
            }
        }
        Ok(issued)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    fn service(name: &str, instance: &str, headless: bool) -> Value {
        let mut s = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": {INSTANCE_LABEL: instance}}, "spec": {}});
        if headless {
            s["spec"]["clusterIP"] = json!("None");
        }
        s
    }

    #[test]
    fn pointers_name_the_keys() {
        assert_eq!(
            INSTANCE_POINTER,
            format!("/metadata/labels/{}", INSTANCE_LABEL.replacen('/', "~1", 1))
        );
        assert_eq!(
            POD_ANNOTATION_POINTER,
            format!(
                "/spec/template/metadata/annotations/{}",
                POD_ANNOTATION.replacen('/', "~1", 1)
            )
        );
    }

    #[test]
    fn names_come_from_the_instance_services_only() {
        let objects = vec![
            service("db", "db", false),
            service("db-headless", "db", true),
            service("other", "other", false),
            json!({"kind": "ConfigMap"}),
        ];
        let sans = service_sans(&objects, "db", "ns");
        assert!(sans.contains(&"db.ns.svc".to_string()));
        assert!(sans.contains(&"*.db-headless.ns.svc.cluster.local".to_string()));
        assert!(!sans.iter().any(|n| n.starts_with("other")), "{sans:?}");
        assert!(
            !sans.iter().any(|n| n.starts_with("*.db.")),
            "a non-headless Service got a wildcard: {sans:?}"
        );
    }

    #[test]
    fn a_ca_from_cert_manager_issues_certificates_that_chain_to_it() {
        use rustls::client::danger::ServerCertVerifier as _;
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
        // A CA with a subject of its own, stored as cert-manager stores an isCA Certificate.
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(rcgen::DnType::CommonName, "some other CA");
        params.distinguished_name.push(rcgen::DnType::OrganizationName, "cert-manager test");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.not_after = time::OffsetDateTime::now_utc() + time::Duration::days(2);
        let ca_cert = params.self_signed(&key).expect("ca");
        let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
            "metadata": {"name": "stateward-webhook-ca"},
            "data": {
                "tls.crt": base64_of(&ca_cert.pem()), "tls.key": base64_of(&key.serialize_pem()), "ca.crt": base64_of(&ca_cert.pem()),
            },
        }))
        .expect("secret");
        let ca = certs::ca_from_cert_manager(&secret).expect("a CA");
        let not_after = params.not_after.unix_timestamp();
        assert!((ca.ca_not_after - not_after).abs() <= 1, "expiry read from the certificate");
        let policy = CertPolicy::default();
        let sans = service_sans(&[service("db", "db", false)], "db", "ns");
        let (data, _) = issue(&ca, &sans, &policy).expect("issue");
        assert_eq!(data["ca.crt"], ca_cert.pem());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(ca_cert.pem().as_bytes()).expect("pem")).expect("root");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider).build().expect("verifier");
        let leaf = CertificateDer::from_pem_slice(data["tls.crt"].as_bytes()).expect("leaf");
        verifier
            .verify_server_cert(&leaf, &[], &ServerName::try_from("db.ns.svc").expect("name"), &[], UnixTime::now())
            .expect("chains to the cert-manager CA");
        assert!(certs::ca_from_cert_manager(&k8s_openapi::api::core::v1::Secret::default()).is_none());
    }

    fn base64_of(text: &str) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(text)
    }

    #[test]
    fn issued_certificate_verifies_for_a_pod_name_under_the_headless_service() {
        use rustls::client::danger::ServerCertVerifier as _;
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
        let policy = CertPolicy {
            cert_lifetime: Duration::from_secs(3600),
            renew_before: Duration::from_secs(600),
            ca_lifetime: Duration::from_secs(86400),
        };
        let ca = certs::issue_all(&policy, &["unused".to_string()]).expect("ca");
        let sans = service_sans(&[service("db-headless", "db", true)], "db", "ns");
        let (data, annotations) = issue(&ca, &sans, &policy).expect("issue");
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(data["ca.crt"].as_bytes()).expect("ca pem"))
            .expect("root");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .expect("verifier");
        let leaf = CertificateDer::from_pem_slice(data["tls.crt"].as_bytes()).expect("leaf");
        let pod = ServerName::try_from("db-0.db-headless.ns.svc.cluster.local").expect("name");
        verifier
            .verify_server_cert(&leaf, &[], &pod, &[], UnixTime::now())
            .expect("pod name verifies");
        let stranger = ServerName::try_from("db-0.other.ns.svc.cluster.local").expect("name");
        assert!(verifier
            .verify_server_cert(&leaf, &[], &stranger, &[], UnixTime::now())
            .is_err());

        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        assert!(!renewal_due(Some(&annotations), &sans, &policy, now));
        assert!(
            renewal_due(Some(&annotations), &sans, &policy, now + 3100),
            "under the threshold"
        );
        assert!(
            renewal_due(Some(&annotations), &["x".to_string()], &policy, now),
            "names changed"
        );
        assert!(renewal_due(None, &sans, &policy, now));
    }

    #[test]
    fn a_rolling_statefulset_is_not_restamped_until_its_roll_is_done() {
        let sts = |strategy: Value, generation: i64, status: Value| {
            json!({"metadata": {"generation": generation}, "spec": {"updateStrategy": strategy}, "status": status})
        };
        let rolling = json!({"type": "RollingUpdate"});
        let done = json!({"observedGeneration": 2, "currentRevision": "a", "updateRevision": "a"});
        assert!(!roll_in_progress(&sts(rolling.clone(), 2, done.clone())), "rolled out");
        assert!(
            !roll_in_progress(&json!({"metadata": {"generation": 2}, "spec": {}, "status": done})),
            "RollingUpdate is the default"
        );
        assert!(
            roll_in_progress(&sts(rolling.clone(), 3, json!({"observedGeneration": 2, "currentRevision": "a", "updateRevision": "a"}))),
            "new spec not yet observed"
        );
        let mid = json!({"observedGeneration": 2, "currentRevision": "a", "updateRevision": "b"});
        assert!(roll_in_progress(&sts(rolling, 2, mid.clone())), "pods on two revisions");
        assert!(
            roll_in_progress(&json!({"metadata": {"generation": 1}, "spec": {}})),
            "no status yet"
        );
        assert!(!roll_in_progress(&sts(json!({"type": "OnDelete"}), 2, mid.clone())));
        assert!(!roll_in_progress(&sts(
            json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 2}}),
            2,
            mid
        )));
    }

    #[test]
    fn pod_template_hash_follows_mounted_certificates_only() {
        let sts = |volumes: Value| json!({"kind": "StatefulSet", "spec": {"template": {"spec": {"volumes": volumes}}}});
        let mut mounted = sts(
            json!([{"name": "tls", "secret": {"secretName": "db-tls"}}, {"name": "p", "projected": {"sources": [{"secret": {"name": "db-extra"}}]}}]),
        );
        let certs_a = BTreeMap::from([("db-tls".to_string(), "A".to_string())]);
        let certs_b = BTreeMap::from([("db-tls".to_string(), "B".to_string())]);
        assert!(stamp_pod_template(&mut mounted, &certs_a));
        let a = mounted["spec"]["template"]["metadata"]["annotations"][POD_ANNOTATION].clone();
        assert!(stamp_pod_template(&mut mounted, &certs_a));
        assert_eq!(
            mounted["spec"]["template"]["metadata"]["annotations"][POD_ANNOTATION], a,
            "same certificate, same hash"
        );
        assert!(stamp_pod_template(&mut mounted, &certs_b));
        assert_ne!(
            mounted["spec"]["template"]["metadata"]["annotations"][POD_ANNOTATION], a,
            "a renewed certificate must roll"
        );
        let mut unrelated = sts(json!([{"name": "cfg", "configMap": {"name": "db-config"}}]));
        assert!(!stamp_pod_template(&mut unrelated, &certs_a));
        assert!(unrelated["spec"]["template"].get("metadata").is_none());
        assert!(is_certificate_request(&[(
            CERTIFICATE_LABEL.to_string(),
            "server".to_string()
        )]));
        assert!(!is_certificate_request(&[]));
    }
}
