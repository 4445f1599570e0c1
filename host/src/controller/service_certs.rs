//! Service certificates for managed clusters, service-agnostic and within the WIT contract as
//! it is: a plugin asks for a certificate with an ordinary `ensure-secret` whose labels carry
//! [`CERTIFICATE_LABEL`] (keys `tls.crt`, `tls.key`, `ca.crt` as for any `kubernetes.io/tls`
//! Secret; value `server`, or `peer` when the members also present it to each other). The host
//! then issues it from the instance's own CA instead of filling random bytes, naming the Services
//! its resource controls (plus pod DNS names under headless Services), renews it under the
//! threshold, and stamps the hash of every certificate a pod template mounts (with the CAs it
//! trusts) into [`POD_ANNOTATION`], so the StatefulSet controller rolls the pods one at a time
//! when a certificate changes. No service name appears here: Services, Secrets and pod templates
//! are plain Kubernetes.
//!
//! **One CA per instance.** Each managed resource has a CA of its own, in a Secret
//! ([`instance_ca_name`]) beside its other children, controlled by the resource (it goes with
//! it). Whoever can read Secrets in a namespace can read a cluster's key and CA there; with a CA
//! shared between namespaces that was enough to pass for a member of any other namespace's
//! cluster (a client trusting the CA accepts the server, an Elasticsearch node joins the cluster).
//! With a CA per instance, what one instance's Secrets hold is trusted by that instance alone.
//!
//! Whoever can create Secrets and Services in a namespace can put the label on them, so the
//! label alone proves nothing. A certificate is issued only for a Secret whose controller owner
//! reference names a kind the operator serves (the applier sets it when it creates the Secret,
//! `Applier::ensure_secret`), only for Services controlled by that same resource (same owner
//! uid), and only for full DNS names (`svc.ns.svc`, `…svc.cluster.local`), never a short name
//! that a client in another namespace would resolve to its own Service. A CA Secret that the
//! resource does not control (made by someone else under that name) is never used: the
//! certificate waits, and the keeper says why.
//!
//! **From the shared CA.** Releases before this one issued every cluster's certificate from one
//! service CA in the operator's namespace ([`LEGACY_CA_SECRET`]). A certificate Secret still on it
//! moves to its instance's CA in three steps, each one roll of the pods that mount it, the next
//! taken once every such StatefulSet has rolled ([`CaStep`]): the pods first trust both CAs
//! (certificate unchanged), then present a certificate of the instance CA (still trusting both,
//! so members on either side of the roll accept each other), then trust the instance CA alone.
//!
//! [`CertificateKeeper`] is a controller beside the per-kind ones, started and stopped with them
//! (only while this replica leads) and fed by the same child caches (Secrets and Services
//! carrying the instance label): the controller creates the labelled Secret through
//! `ensure-secret` and never overwrites it afterwards; the keeper makes the instance CA and fills
//! and renews the certificate. The controller stamps the pod template as it applies a
//! StatefulSet ([`stamp_planned`]): a set is created only once its certificates are issued (its
//! pods never start on placeholder bytes, so a new cluster does not roll right after it forms),
//! a renewal is a change of a child and rolls the pods through the set's own update strategy,
//! and a StatefulSet in the middle of a roll keeps its stamp until that roll is done
//! ([`roll_in_progress`]), so rolls never overlap.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::StreamExt;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::children::{ChildChange, Children};
use crate::webhook::certs::{self, CertPolicy, Material};
use crate::webhook::WebhookError;

/// Label of an `ensure-secret` request that asks for a certificate: value `server` (server
/// authentication) or `peer` (server and client authentication).
pub const CERTIFICATE_LABEL: &str = "stateward.dev/certificate";
/// Label of an instance's CA Secret (value `true`).
pub const CA_LABEL: &str = "stateward.dev/service-ca";
/// Annotation of a certificate Secret moving from the shared CA to its instance's
/// ([`CaStep`]): [`TRUSTING_BOTH`], then [`ISSUED_UNDER_BOTH`]; gone once it is done.
pub const MIGRATION_ANNOTATION: &str = "stateward.dev/ca-migration";
/// Annotation of a certificate Secret: the role its certificate was issued for (`server` or
/// `peer`); a certificate issued before roles (no annotation) carried both usages.
pub const ROLE_ANNOTATION: &str = "stateward.dev/cert-role";
/// The pods trust both CAs and still present the shared CA's certificate.
pub const TRUSTING_BOTH: &str = "trusting-both";
/// The pods present the instance CA's certificate and still trust both.
pub const ISSUED_UNDER_BOTH: &str = "issued-under-both";
/// Pod-template annotation: SHA-256 over the certificates the pods mount.
pub const POD_ANNOTATION: &str = "stateward.dev/certificates-sha256";
/// The Secret of the CA that releases before per-instance CAs shared between every cluster, in
/// the operator's namespace (with `--cert-manager`, cert-manager's Secret of that name): read
/// only to move the certificates it issued to their instances' CAs, never written.
pub const LEGACY_CA_SECRET: &str = "stateward-service-ca";
/// JSON pointer to the key above (`/` escaped as `~1`).
const POD_ANNOTATION_POINTER: &str = "/spec/template/metadata/annotations/stateward.dev~1certificates-sha256";
/// JSON pointer to a certificate Secret's expiry annotation, which only an issued one has.
const NOT_AFTER_POINTER: &str = "/metadata/annotations/stateward.dev~1cert-not-after";
/// Where a certificate Secret says which names its certificate carries.
const SANS_POINTER: &str = "/metadata/annotations/stateward.dev~1cert-sans";

/// Whether a [`CERTIFICATE_LABEL`] value asks for a certificate.
fn is_role(value: &str) -> bool {
    matches!(value, "server" | "peer")
}

/// Whether a secret request's labels ask for a certificate.
pub fn is_certificate_request(labels: &[(String, String)]) -> bool {
    labels.iter().any(|(k, v)| k == CERTIFICATE_LABEL && is_role(v))
}

/// The name of an instance's CA Secret, in the instance's namespace.
pub fn instance_ca_name(instance: &str) -> String {
    format!("{instance}-service-ca")
}

/// The controller owner reference of an object created for a managed resource, when it names
/// one of the `served` kinds (group, kind). Owner references are namespaced, so the resource
/// is in the object's own namespace.
pub fn managed_owner_reference<'a>(
    object: &'a Value,
    served: &BTreeSet<(String, String)>,
) -> Option<&'a Value> {
    let references = object.pointer("/metadata/ownerReferences").and_then(Value::as_array)?;
    let controller = references.iter().find(|r| r["controller"] == json!(true))?;
    let api_version = controller["apiVersion"].as_str()?;
    let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
    let kind = controller["kind"].as_str()?;
    controller["uid"].as_str()?;
    controller["name"].as_str()?;
    served.contains(&(group.to_string(), kind.to_string())).then_some(controller)
}

/// The uid of the managed resource an object was created for ([`managed_owner_reference`]).
pub fn managed_owner(object: &Value, served: &BTreeSet<(String, String)>) -> Option<String> {
    managed_owner_reference(object, served).and_then(|r| r["uid"].as_str()).map(str::to_string)
}

/// Full DNS names for the Services among `objects` controlled by the resource with uid
/// `owner` (its controller owner reference): each Service's namespaced and cluster-local
/// names, and for a headless Service the wildcard its pods' names fall under. No short name:
/// `db` or `db.ns` are resolved relative to the client's own namespace or search path.
pub fn service_sans(objects: &[Value], owner: &str, namespace: &str) -> Vec<String> {
    let mut names = BTreeSet::new();
    for o in objects {
        let controlled =
            o.pointer("/metadata/ownerReferences").and_then(Value::as_array).is_some_and(|refs| {
                refs.iter().any(|r| r["controller"] == json!(true) && r["uid"] == json!(owner))
            });
        if o["kind"] != "Service" || !controlled {
            continue;
        }
        let Some(name) = o.pointer("/metadata/name").and_then(Value::as_str) else {
            continue;
        };
        names.insert(format!("{name}.{namespace}.svc"));
        names.insert(format!("{name}.{namespace}.svc.cluster.local"));
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
/// and annotations: for serving clients, and with `peer` also for members authenticating to
/// each other.
pub fn issue(
    ca: &Material,
    sans: &[String],
    policy: &CertPolicy,
    peer: bool,
) -> Result<Issued, WebhookError> {
    let mut m = ca.clone();
    if peer {
        certs::renew_member(&mut m, policy, sans)?;
    } else {
        certs::renew_serving(&mut m, policy, sans)?;
    }
    let data = BTreeMap::from([
        (certs::TLS_CRT.to_string(), m.cert_pem.clone()),
        (certs::TLS_KEY.to_string(), m.key_pem.clone()),
        (certs::CA_CRT.to_string(), m.ca_pem.clone()),
    ]);
    let annotations = BTreeMap::from([
        (certs::CERT_NOT_AFTER.to_string(), m.cert_not_after.to_string()),
        (certs::CERT_SANS.to_string(), sans.join(",")),
        (ROLE_ANNOTATION.to_string(), if peer { "peer" } else { "server" }.to_string()),
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
    let not_after = a.get(certs::CERT_NOT_AFTER).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
    let threshold = i64::try_from(policy.renew_before.as_secs()).unwrap_or(i64::MAX);
    let names: Vec<&str> = a.get(certs::CERT_SANS).map(|s| s.split(',').collect()).unwrap_or_default();
    not_after - now_unix < threshold || names != sans.iter().map(String::as_str).collect::<Vec<_>>()
}

/// Names of the Secrets a pod template mounts (secret volumes and projected sources).
pub fn mounted_secrets(pod_template: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for v in pod_template.pointer("/spec/volumes").and_then(Value::as_array).into_iter().flatten() {
        if let Some(n) = v.pointer("/secret/secretName").and_then(Value::as_str) {
            out.insert(n.to_string());
        }
        for s in v.pointer("/projected/sources").and_then(Value::as_array).into_iter().flatten() {
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
    let mounted: Vec<(&String, &String)> =
        mounted_secrets(template).into_iter().filter_map(|n| certificates.get_key_value(&n)).collect();
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

/// Stamps a StatefulSet a plan applies with the certificates its pods mount, as their Secrets
/// among `children` hold them now (`requested`: the certificate Secrets the same plan asks
/// for, which may not exist yet). The controller applies the stamp with the rest of the set, so
/// the annotation has one writer, and a renewed certificate (its Secret changed: a child
/// change, so a reconcile) rolls the pods through the plugin's own update strategy.
///
/// A set that does not exist yet is not created before every certificate it mounts is issued:
/// its pods would start with the placeholder bytes `ensure-secret` wrote and restart at once
/// for the real certificate. `Err` says which Secret it waits for; the keeper issues within a
/// second of the Secret and the Services existing, and that write wakes the reconcile. An
/// existing set keeps its stamp while a certificate is missing, and while it rolls (see
/// [`roll_in_progress`]).
pub fn stamp_planned(
    statefulset: &mut Value,
    existing: Option<&Value>,
    children: &[Value],
    requested: &BTreeSet<String>,
    names: Option<&Result<String, String>>,
) -> Result<(), String> {
    let Some(template) = statefulset.pointer("/spec/template") else {
        return Ok(());
    };
    let certificate_secrets: BTreeMap<&str, &Value> = children
        .iter()
        .filter(|c| is_certificate_secret(c))
        .filter_map(|c| Some((c.pointer("/metadata/name")?.as_str()?, c)))
        .collect();
    let mut certificates = BTreeMap::new();
    let mut missing = None;
    for name in mounted_secrets(template) {
        if !requested.contains(&name) && !certificate_secrets.contains_key(name.as_str()) {
            continue;
        }
        let issued = certificate_secrets.get(name.as_str()).and_then(|secret| {
            // A new StatefulSet waits for a certificate that names every Service (one issued
            // while some were not there yet is issued again as they come, which would roll
            // the pods just made).
            if let (None, Some(Ok(names))) = (existing, names) {
                let carried = secret.pointer(SANS_POINTER).and_then(Value::as_str).unwrap_or_default();
                if carried != names {
                    return None;
                }
            }
            issued_pem(secret)
        });
        match issued {
            Some(pem) => {
                certificates.insert(name, pem);
            }
            None => missing = Some(name),
        }
    }
    let live = existing.and_then(|e| e.pointer(POD_ANNOTATION_POINTER)).cloned();
    let keep_live = |statefulset: &mut Value| {
        if let (Some(live), Some(template)) = (live.clone(), statefulset.pointer_mut("/spec/template")) {
            if !template["metadata"].is_object() {
                template["metadata"] = json!({});
            }
            if !template["metadata"]["annotations"].is_object() {
                template["metadata"]["annotations"] = json!({});
            }
            template["metadata"]["annotations"][POD_ANNOTATION] = live;
        }
    };
    let mounts_certificates = missing.is_some() || !certificates.is_empty();
    if let (None, true, Some(Err(why))) = (existing, mounts_certificates, names) {
        return Err(why.clone());
    }
    match (missing, existing) {
        (Some(name), None) => {
            return Err(format!("waiting for the certificate in Secret {name} to be issued"))
        }
        (Some(_), Some(_)) => keep_live(statefulset),
        (None, _) => {
            stamp_pod_template(statefulset, &certificates);
            let stamped = statefulset.pointer(POD_ANNOTATION_POINTER).cloned();
            if live.is_some() && stamped != live && existing.is_some_and(roll_in_progress) {
                keep_live(statefulset);
            }
        }
    }
    Ok(())
}

/// A Secret asking to be a certificate ([`CERTIFICATE_LABEL`]).
fn is_certificate_secret(c: &Value) -> bool {
    c["apiVersion"] == "v1"
        && c["kind"] == "Secret"
        && c.pointer("/metadata/labels")
            .and_then(|l| l.get(CERTIFICATE_LABEL))
            .and_then(Value::as_str)
            .is_some_and(is_role)
}

/// What the pods of a certificate Secret are made with, once the keeper has issued it (it writes
/// the expiry with it): the certificate (`tls.crt`) and the CAs they trust (`ca.crt`), PEM, so a
/// change of either rolls them.
fn issued_pem(secret: &Value) -> Option<String> {
    use base64::Engine as _;
    secret.pointer(NOT_AFTER_POINTER)?;
    let text = |key: &str| {
        let encoded = secret.pointer(&format!("/data/{key}"))?.as_str()?;
        String::from_utf8(base64::engine::general_purpose::STANDARD.decode(encoded).ok()?).ok()
    };
    let mut pem = text(certs::TLS_CRT)?;
    if let Some(trusted) = text(certs::CA_CRT) {
        pem.push_str(&trusted);
    }
    Some(pem)
}

/// Whether this reconcile's apply will stamp the cached StatefulSet `statefulset` anew (a
/// certificate it mounts was renewed): an `OnDelete` set (the plugin replaces its pods itself)
/// whose every mounted certificate is issued and whose stamp differs from theirs. Until the new
/// stamp is applied and seen, its update revision is the one the pods are leaving, not the one
/// they will be made from: the plugin is shown the set without it (as after any change of the
/// template it renders, see the template hash), so that a plugin rolling several sets in an order
/// does not take a set whose new stamp the cache has not caught up with for one with nothing to
/// roll. Sets that roll by themselves are left alone (see [`roll_in_progress`]). A mounted
/// certificate an earlier release issued (no names recorded with it) is about to be issued again,
/// so its set is pending too: a plugin taking such a cluster over would otherwise restart a pod
/// on the old stamp and again on the new one.
pub fn restamp_pending(statefulset: &Value, children: &[Value]) -> bool {
    if statefulset["kind"] != "StatefulSet"
        || statefulset.pointer("/spec/updateStrategy/type").and_then(Value::as_str) != Some("OnDelete")
    {
        return false;
    }
    let Some(template) = statefulset.pointer("/spec/template") else {
        return false;
    };
    let mounted = mounted_secrets(template);
    let mut certificates = BTreeMap::new();
    for secret in children.iter().filter(|c| is_certificate_secret(c)) {
        let name = secret.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
        if !mounted.contains(name) {
            continue;
        }
        // One not issued yet: the stamp applied is the one there (see `stamp_planned`).
        let Some(pem) = issued_pem(secret) else { return false };
        if secret.pointer(SANS_POINTER).is_none() {
            return true;
        }
        certificates.insert(name.to_string(), pem);
    }
    let mut planned = statefulset.clone();
    stamp_pod_template(&mut planned, &certificates)
        && planned.pointer(POD_ANNOTATION_POINTER) != statefulset.pointer(POD_ANNOTATION_POINTER)
}

/// Whether a StatefulSet (as JSON) is in the middle of a rolling update: its controller has not
/// yet observed the current spec, or its pods are not all on the update revision. Such a set
/// is not re-stamped: a new stamp mid-roll would start a second roll over the
/// first (the pods already replaced restart again) for no gain, since the renewed Secret is
/// already written and its old certificate is still valid for `renew_before`. The stamp
/// follows on a later pass, once the roll is done. Sets that do not roll on their own
/// (`OnDelete`, a partition) are never held back: their revisions differ by design.
pub fn roll_in_progress(statefulset: &Value) -> bool {
    let strategy = statefulset.pointer("/spec/updateStrategy");
    let rolling =
        strategy.and_then(|s| s.get("type")).and_then(Value::as_str).is_none_or(|t| t == "RollingUpdate");
    let partition =
        strategy.and_then(|s| s.pointer("/rollingUpdate/partition")).and_then(Value::as_i64).unwrap_or(0);
    if !rolling || partition > 0 {
        return false;
    }
    let generation = statefulset.pointer("/metadata/generation").and_then(Value::as_i64);
    let observed = statefulset.pointer("/status/observedGeneration").and_then(Value::as_i64);
    let current = statefulset.pointer("/status/currentRevision").and_then(Value::as_str);
    let update = statefulset.pointer("/status/updateRevision").and_then(Value::as_str);
    observed < generation || update.is_none() || current != update
}

/// Where a certificate Secret is on its way to (or on) its instance's CA; see the module's
/// documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaStep {
    /// Issued by the instance CA and trusting it alone: renewed when due.
    Current,
    /// A placeholder, or issued by a CA that is neither the instance's nor the shared one (an
    /// instance CA renewed, the shared one gone): issue from the instance CA.
    Issue,
    /// Issued by the shared CA and trusting it alone: trust the instance CA beside it, the
    /// certificate unchanged.
    TrustBoth,
    /// Trusting both, and rolled: present a certificate of the instance CA, still trusting both.
    IssueUnderBoth,
    /// Presenting the instance CA's certificate, and rolled: trust the instance CA alone.
    DropShared,
    /// A step taken, its roll not done yet.
    Rolling,
}

/// The step due for a certificate Secret trusting `trusted` (its `ca.crt`), at `migration` (its
/// [`MIGRATION_ANNOTATION`]), with the instance CA `instance_ca` and the shared CA `shared_ca`
/// (PEM), when the pods that mount it have `rolled` to what it holds now.
pub fn ca_step(
    trusted: &str,
    migration: Option<&str>,
    instance_ca: &str,
    shared_ca: Option<&str>,
    rolled: bool,
) -> CaStep {
    let next = match migration {
        Some(TRUSTING_BOTH) => CaStep::IssueUnderBoth,
        Some(ISSUED_UNDER_BOTH) => CaStep::DropShared,
        _ if trusted == instance_ca => return CaStep::Current,
        _ if shared_ca.is_some_and(|shared| shared == trusted) => return CaStep::TrustBoth,
        _ => return CaStep::Issue,
    };
    if rolled {
        next
    } else {
        CaStep::Rolling
    }
}

/// Whether every StatefulSet among `sets` that mounts the certificate Secret `name` runs pods
/// made with what the certificate Secrets (`certificates`: name → what [`issued_pem`] reads) hold
/// now: its template carries their stamp, its controller has seen it, and every replica is on
/// its update revision and ready. True when no set mounts it.
pub fn rolled_out(name: &str, certificates: &BTreeMap<String, String>, sets: &[Value]) -> bool {
    sets.iter().all(|set| {
        let Some(template) = set.pointer("/spec/template") else { return true };
        if !mounted_secrets(template).contains(name) {
            return true;
        }
        let mut planned = set.clone();
        stamp_pod_template(&mut planned, certificates);
        let number = |pointer: &str| set.pointer(pointer).and_then(Value::as_i64);
        let replicas = number("/spec/replicas").unwrap_or(1);
        planned.pointer(POD_ANNOTATION_POINTER) == set.pointer(POD_ANNOTATION_POINTER)
            && number("/status/observedGeneration") >= number("/metadata/generation")
            && number("/status/updatedReplicas").unwrap_or(0) == replicas
            && number("/status/readyReplicas").unwrap_or(0) == replicas
            && number("/status/replicas").unwrap_or(0) == replicas
    })
}

/// How long certificates live, and where the CA of releases before per-instance CAs is (the
/// keeper runs only when the webhooks do, with their lifetimes).
#[derive(Debug, Clone)]
pub struct KeeperSettings {
    /// The Secret of the shared CA of earlier releases (namespace, name): [`LEGACY_CA_SECRET`]
    /// in the operator's namespace. Read, never written.
    pub legacy_ca_secret: (String, String),
    /// Whether `legacy_ca_secret` is cert-manager's (CA in `tls.crt`/`tls.key`).
    pub cert_manager: bool,
    pub policy: CertPolicy,
}

/// Issues and renews the certificate Secrets of managed clusters from their instances' CAs.
pub struct CertificateKeeper {
    pub client: kube::Client,
    /// The controllers' child caches (objects carrying the instance label).
    pub children: Children,
    pub settings: KeeperSettings,
    /// The kinds the operator serves (group, kind): a certificate Secret must be controlled by
    /// a resource of one of them.
    pub served: BTreeSet<(String, String)>,
}

/// Whether a cached Secret asks for a certificate ([`CERTIFICATE_LABEL`]).
fn wants_certificate(secret: &impl kube::Resource) -> bool {
    kube::ResourceExt::labels(secret).get(CERTIFICATE_LABEL).is_some_and(|v| is_role(v))
}

impl CertificateKeeper {
    /// Runs [`Self::sync`] every check interval, and half a second after a certificate Secret
    /// or an instance's Service is created or changed (as the child caches announce them): a
    /// new cluster's Secret starts with placeholder bytes from `ensure-secret`, and its pods
    /// cannot serve TLS until it holds a real certificate (the interval is up to a minute with
    /// the default lifetimes). A pass reads the caches, whatever the number of clusters.
    /// Errors are logged. Runs until dropped or aborted (with the controllers).
    pub async fn run(self) {
        let wake = Arc::new(tokio::sync::Notify::new());
        // A certificate needs its Secret and the instance's Services (its names), a step of a
        // move to the instance CA the roll of its StatefulSets: a change to any wakes a pass.
        // The changes are read all the time, also during a pass.
        let changes = self.children.changes().filter(|change| {
            let wakes = match change {
                ChildChange::Changed(child) => {
                    let kind = child.types.as_ref().map(|t| (t.api_version.as_str(), t.kind.as_str()));
                    kind == Some(("v1", "Service"))
                        || (kind == Some(("v1", "Secret")) && wants_certificate(child.as_ref()))
                        || (kind == Some(("apps/v1", "StatefulSet")) && self.migrating())
                }
                ChildChange::Relisted | ChildChange::Deleted { .. } => false,
            };
            std::future::ready(wakes)
        });
        let watching = {
            let wake = Arc::clone(&wake);
            async move {
                let mut events = std::pin::pin!(changes);
                while events.next().await.is_some() {
                    wake.notify_one();
                }
                std::future::pending::<()>().await
            }
        };
        let keeping = async {
            loop {
                match self.sync().await {
                    Ok(n) if n > 0 => tracing::info!(written = n, "service certificates written"),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "service certificates not kept; retrying"),
                }
                tokio::select! {
                    () = tokio::time::sleep(self.settings.policy.check_interval()) => {}
                    // A plan writes its Secret and Services within moments: one pass for the lot.
                    () = wake.notified() => tokio::time::sleep(std::time::Duration::from_millis(500)).await,
                }
            }
        };
        tokio::select! {
            () = watching => {}
            () = keeping => {}
        }
    }

    /// Whether any certificate Secret is moving to its instance's CA (then a StatefulSet's roll
    /// may let it take its next step).
    fn migrating(&self) -> bool {
        self.children.secrets().iter().any(|s| {
            wants_certificate(s.as_ref())
                && kube::ResourceExt::annotations(s.as_ref()).contains_key(MIGRATION_ANNOTATION)
        })
    }

    /// The shared CA of earlier releases, if its Secret is still there.
    async fn shared_ca(&self) -> Result<Option<Material>, WebhookError> {
        use k8s_openapi::api::core::v1::Secret;
        let (namespace, name) = &self.settings.legacy_ca_secret;
        let api: kube::Api<Secret> = kube::Api::namespaced(self.client.clone(), namespace);
        let found = api.get_opt(name).await.map_err(WebhookError::kube("reading the shared service CA"))?;
        Ok(found.as_ref().and_then(|secret| {
            if self.settings.cert_manager {
                certs::ca_from_cert_manager(secret)
            } else {
                Material::ca_from_secret(secret)
            }
        }))
    }

    /// The CA of the instance `owner` (its controller owner reference, in `namespace`), from the
    /// child cache: made on first use and made anew when less than a certificate's lifetime is
    /// left (a write guarded by the resourceVersion read, so a replica that led a moment ago
    /// cannot race it; on a conflict the next pass reads the result). `None` until there is
    /// one. A Secret of that name the resource does not control is an error: never used, never
    /// overwritten.
    async fn instance_ca(&self, namespace: &str, owner: &Value) -> Result<Option<Material>, WebhookError> {
        use k8s_openapi::api::core::v1::Secret;
        use kube::api::PostParams;
        let (instance, uid) = (owner["name"].as_str().unwrap_or_default(), owner["uid"].as_str());
        let name = instance_ca_name(instance);
        let cached = self.children.secret(namespace, &name);
        if let Some(secret) = &cached {
            let controlled = secret
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|r| r.controller == Some(true) && Some(r.uid.as_str()) == uid);
            if !controlled {
                return Err(WebhookError::Certificate(format!(
                    "Secret {namespace}/{name} is not the CA of {instance} (the resource does not control it): \
                     its certificates are issued once that Secret is removed"
                )));
            }
            let stored = Material::ca_from_secret(secret);
            if let Some(ca) = stored.filter(|ca| !certs::ca_due(ca, &self.settings.policy)) {
                return Ok(Some(ca));
            }
        }
        let ca = certs::issue_ca_for(&self.settings.policy, certs::SERVICE_CA_COMMON_NAME, uid)?;
        let api: kube::Api<Secret> = kube::Api::namespaced(self.client.clone(), namespace);
        let written = match cached {
            None => {
                let mut secret = Secret::default();
                secret.metadata.name = Some(name.clone());
                secret.metadata.labels = Some(BTreeMap::from([
                    (crate::children::INSTANCE_LABEL.to_string(), instance.to_string()),
                    (CA_LABEL.to_string(), "true".to_string()),
                    ("app.kubernetes.io/managed-by".to_string(), "stateward".to_string()),
                ]));
                secret.metadata.owner_references = Some(vec![serde_json::from_value(owner.clone())
                    .map_err(|e| {
                        WebhookError::Certificate(format!("owner reference of {instance}: {e}"))
                    })?]);
                api.create(&PostParams::default(), &ca.ca_into_secret(secret)).await
            }
            // A merge patch over the version read: the operator patches Secrets, it does not
            // replace them.
            Some(existing) => {
                let renewed = ca.ca_into_secret(Secret::default());
                let patch = json!({
                    "metadata": {
                        "resourceVersion": existing.metadata.resource_version,
                        "annotations": renewed.metadata.annotations,
                    },
                    "data": renewed.data,
                });
                api.patch(&name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)).await
            }
        };
        match written {
            Ok(_) => {
                tracing::info!(namespace, instance, not_after = ca.ca_not_after, "instance CA issued");
                Ok(Some(ca))
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(None),
            Err(e) => Err(WebhookError::kube("writing an instance CA")(e)),
        }
    }

    /// One pass: issue what is due, and take the next step of every certificate moving to its
    /// instance's CA whose pods have rolled (the controllers stamp the StatefulSets,
    /// [`stamp_planned`]). Returns how many certificate Secrets were written. An instance whose
    /// CA cannot be had is logged and skipped; the others are kept.
    pub async fn sync(&self) -> Result<usize, WebhookError> {
        use k8s_openapi::api::core::v1::Secret;
        use kube::api::{Patch, PatchParams};
        let wanted: Vec<Value> = self
            .children
            .secrets()
            .into_iter()
            .filter(|s| wants_certificate(s.as_ref()))
            .filter_map(|s| serde_json::to_value(s.as_ref()).ok())
            .map(|mut v| {
                v["apiVersion"] = json!("v1");
                v["kind"] = json!("Secret");
                v
            })
            .collect();
        // Every managed resource's Services, from the cache (a pass costs no API read).
        let mut services_by_ns: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        for service in self.children.services() {
            let Some(ns) = service.metadata.namespace.clone() else { continue };
            if let Ok(mut value) = serde_json::to_value(service.as_ref()) {
                value["kind"] = json!("Service");
                services_by_ns.entry(ns).or_default().push(value);
            }
        }
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        // Read once a pass, and only when a certificate is not on its instance's CA.
        let mut shared: Option<Option<Material>> = None;
        let mut cas: BTreeMap<(String, String), Option<Material>> = BTreeMap::new();
        let mut written = 0;
        for secret in &wanted {
            let text = |pointer: &str| secret.pointer(pointer).and_then(Value::as_str).map(str::to_string);
            let (Some(ns), Some(name)) = (text("/metadata/namespace"), text("/metadata/name")) else {
                continue;
            };
            // Only a Secret the operator created for a resource it manages.
            let Some(owner) = managed_owner_reference(secret, &self.served).cloned() else {
                continue;
            };
            let uid = owner["uid"].as_str().unwrap_or_default();
            let objects = services_by_ns.get(&ns).map(Vec::as_slice).unwrap_or_default();
            let sans = service_sans(objects, uid, &ns);
            if sans.is_empty() {
                continue;
            }
            let key = (ns.clone(), uid.to_string());
            if !cas.contains_key(&key) {
                let ca = self.instance_ca(&ns, &owner).await.unwrap_or_else(|e| {
                    tracing::warn!(namespace = %ns, secret = %name, error = %e, "certificate not issued");
                    None
                });
                cas.insert(key.clone(), ca);
            }
            let Some(ca) = cas.get(&key).cloned().flatten() else { continue };
            let data = |key: &str| {
                use base64::Engine as _;
                secret
                    .pointer(&format!("/data/{key}"))
                    .and_then(Value::as_str)
                    .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default()
            };
            let trusted = data(certs::CA_CRT);
            let migration =
                text(&format!("/metadata/annotations/{}", MIGRATION_ANNOTATION.replace('/', "~1")));
            if trusted != ca.ca_pem && migration.is_none() && shared.is_none() {
                shared = Some(self.shared_ca().await?);
            }
            let rolled = migration.is_none() || {
                let in_namespace = |v: &&Value| {
                    v.pointer("/metadata/namespace").and_then(Value::as_str) == Some(ns.as_str())
                };
                let certificates: BTreeMap<String, String> = wanted
                    .iter()
                    .filter(in_namespace)
                    .filter_map(|s| {
                        Some((s.pointer("/metadata/name")?.as_str()?.to_string(), issued_pem(s)?))
                    })
                    .collect();
                let sets: Vec<Value> = self
                    .children
                    .statefulsets(&ns)
                    .iter()
                    .filter_map(|s| serde_json::to_value(s.as_ref()).ok())
                    .collect();
                rolled_out(&name, &certificates, &sets)
            };
            let shared_pem = shared.as_ref().and_then(Option::as_ref).map(|m| m.ca_pem.as_str());
            let step = ca_step(&trusted, migration.as_deref(), &ca.ca_pem, shared_pem, rolled);
            let role = secret
                .pointer("/metadata/labels")
                .and_then(|l| l.get(CERTIFICATE_LABEL))
                .and_then(Value::as_str);
            let peer = role == Some("peer");
            let annotations_now: BTreeMap<String, String> =
                serde_json::from_value(secret.pointer("/metadata/annotations").cloned().unwrap_or(json!({})))
                    .unwrap_or_default();
            // Issued for another role than asked for now (the plugin changed it).
            let role_changed = annotations_now.get(ROLE_ANNOTATION).map_or("peer", String::as_str)
                != role.unwrap_or("server");
            // (string data, annotations, the migration annotation afterwards)
            let (data, annotations, next): (
                BTreeMap<String, String>,
                BTreeMap<String, String>,
                Option<&str>,
            ) = match step {
                CaStep::Rolling => continue,
                CaStep::Current => {
                    if !role_changed
                        && !renewal_due(Some(&annotations_now), &sans, &self.settings.policy, now)
                    {
                        continue;
                    }
                    let (data, annotations) = issue(&ca, &sans, &self.settings.policy, peer)?;
                    (data, annotations, None)
                }
                CaStep::Issue => {
                    let (data, annotations) = issue(&ca, &sans, &self.settings.policy, peer)?;
                    (data, annotations, None)
                }
                CaStep::TrustBoth => (
                    BTreeMap::from([(certs::CA_CRT.to_string(), format!("{}{trusted}", ca.ca_pem))]),
                    BTreeMap::new(),
                    Some(TRUSTING_BOTH),
                ),
                CaStep::IssueUnderBoth => {
                    let (mut data, annotations) = issue(&ca, &sans, &self.settings.policy, peer)?;
                    data.insert(certs::CA_CRT.to_string(), trusted.clone());
                    (data, annotations, Some(ISSUED_UNDER_BOTH))
                }
                CaStep::DropShared => {
                    (BTreeMap::from([(certs::CA_CRT.to_string(), ca.ca_pem.clone())]), BTreeMap::new(), None)
                }
            };
            let mut annotations: serde_json::Map<String, Value> =
                annotations.into_iter().map(|(k, v)| (k, json!(v))).collect();
            annotations.insert(MIGRATION_ANNOTATION.to_string(), next.map_or(Value::Null, |n| json!(n)));
            let patch = json!({
                "metadata": { "resourceVersion": secret.pointer("/metadata/resourceVersion"), "annotations": annotations },
                "type": "Opaque",
                "stringData": data,
            });
            let api: kube::Api<Secret> = kube::Api::namespaced(self.client.clone(), &ns);
            match api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => {
                    written += 1;
                    if step != CaStep::Current && step != CaStep::Issue {
                        tracing::info!(namespace = %ns, secret = %name, step = ?step, "certificate moving to its instance's CA");
                    }
                }
                // The cached Secret was behind (or someone else wrote it first); the next
                // pass reads the result.
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(WebhookError::kube("writing a certificate Secret")(e)),
            }
        }
        Ok(written)
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A Service controlled by the resource with uid `owner`.
    fn service(name: &str, owner: &str, headless: bool) -> Value {
        let mut s = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name,
            "labels": {crate::children::INSTANCE_LABEL: owner},
            "ownerReferences": [{"apiVersion": "stateward.dev/v1", "kind": "PostgresCluster", "name": owner, "uid": owner, "controller": true}]}, "spec": {}});
        if headless {
            s["spec"]["clusterIP"] = json!("None");
        }
        s
    }

    #[test]
    fn pointers_name_the_keys() {
        assert_eq!(
            POD_ANNOTATION_POINTER,
            format!("/spec/template/metadata/annotations/{}", POD_ANNOTATION.replacen('/', "~1", 1))
        );
        assert_eq!(
            NOT_AFTER_POINTER,
            format!("/metadata/annotations/{}", certs::CERT_NOT_AFTER.replacen('/', "~1", 1))
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

    /// Finding 5: only full DNS names (a short name verifies for another namespace's Service of
    /// that name), and only Services the resource controls: the instance label, which anyone
    /// who can create a Service in the namespace can set, names nothing.
    #[test]
    fn names_are_full_and_only_of_services_the_resource_controls() {
        let mut labelled_only = service("evil", "db", false);
        labelled_only["metadata"]["ownerReferences"] = json!([]);
        let mut controlled_by_other = service("other", "db", false);
        controlled_by_other["metadata"]["ownerReferences"][0]["uid"] = json!("someone-else");
        let sans =
            service_sans(&[service("db", "db", false), labelled_only, controlled_by_other], "db", "ns");
        assert_eq!(sans, ["db.ns.svc", "db.ns.svc.cluster.local"]);
    }

    /// Finding 5: a certificate Secret counts only when its controller owner reference names a
    /// served kind; a labelled Secret of a namespace editor's (no owner, or owned by anything
    /// else) does not.
    #[test]
    fn only_secrets_controlled_by_a_served_kind_get_certificates() {
        let served = BTreeSet::from([("stateward.dev".to_string(), "PostgresCluster".to_string())]);
        let secret =
            |refs: Value| json!({"kind": "Secret", "metadata": {"name": "db-tls", "ownerReferences": refs}});
        let ours = json!({"apiVersion": "stateward.dev/v1", "kind": "PostgresCluster", "name": "db", "uid": "u1", "controller": true});
        assert_eq!(managed_owner(&secret(json!([ours.clone()])), &served).as_deref(), Some("u1"));
        assert_eq!(managed_owner(&json!({"metadata": {"name": "db-tls"}}), &served), None, "no owner");
        let mut not_controller = ours.clone();
        not_controller["controller"] = json!(false);
        assert_eq!(managed_owner(&secret(json!([not_controller])), &served), None);
        let configmap =
            json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u2", "controller": true});
        assert_eq!(managed_owner(&secret(json!([configmap])), &served), None, "not a served kind");
        let mut other_group = ours;
        other_group["apiVersion"] = json!("evil.example/v1");
        assert_eq!(managed_owner(&secret(json!([other_group])), &served), None, "same kind, other group");
    }

    /// Finding 5: the service CA is a CA of its own, so a service certificate never verifies
    /// against the webhook's CA.
    #[test]
    fn service_certificates_do_not_chain_to_the_webhook_ca() {
        use rustls::client::danger::ServerCertVerifier as _;
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
        let policy = CertPolicy::default();
        let webhook = certs::issue_all(&policy, &["stateward-webhook.ops.svc".to_string()]).expect("webhook");
        let service_ca = certs::issue_ca(&policy, certs::SERVICE_CA_COMMON_NAME).expect("service CA");
        let back =
            Material::ca_from_secret(&service_ca.ca_into_secret(Default::default())).expect("read back");
        assert_eq!(back.ca_pem, service_ca.ca_pem);
        let (data, _) =
            issue(&back, &["stateward-webhook.ops.svc".to_string()], &policy, false).expect("issue");
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(webhook.ca_pem.as_bytes()).expect("pem")).expect("root");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .expect("verifier");
        let leaf = CertificateDer::from_pem_slice(data["tls.crt"].as_bytes()).expect("leaf");
        let name = ServerName::try_from("stateward-webhook.ops.svc").expect("name");
        assert!(verifier.verify_server_cert(&leaf, &[], &name, &[], UnixTime::now()).is_err());
        assert_ne!(data["ca.crt"], webhook.ca_pem);
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
        let (data, _) = issue(&ca, &sans, &policy, true).expect("issue");
        assert_eq!(data["ca.crt"], ca_cert.pem());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(ca_cert.pem().as_bytes()).expect("pem")).expect("root");
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(roots.clone(), provider.clone())
                .build()
                .expect("verifier");
        let leaf = CertificateDer::from_pem_slice(data["tls.crt"].as_bytes()).expect("leaf");
        // Members also present it to each other (Elasticsearch's transport layer): a client
        // certificate as well.
        let members = rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider)
            .build()
            .expect("client verifier");
        members.verify_client_cert(&leaf, &[], UnixTime::now()).expect("a member presents it as a client");
        verifier
            .verify_server_cert(
                &leaf,
                &[],
                &ServerName::try_from("db.ns.svc").expect("name"),
                &[],
                UnixTime::now(),
            )
            .expect("chains to the cert-manager CA");
        assert!(certs::ca_from_cert_manager(&k8s_openapi::api::core::v1::Secret::default()).is_none());
    }

    fn base64_of(text: &str) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(text)
    }

    #[test]
    fn issued_certificate_verifies_for_a_pod_name_under_the_headless_service_and_as_a_member_client() {
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
        let (data, annotations) = issue(&ca, &sans, &policy, true).expect("issue");
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(data["ca.crt"].as_bytes()).expect("ca pem")).expect("root");
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(roots.clone(), provider.clone())
                .build()
                .expect("verifier");
        let leaf = CertificateDer::from_pem_slice(data["tls.crt"].as_bytes()).expect("leaf");
        // Members also present it to each other (Elasticsearch's transport layer): a client
        // certificate as well.
        let members = rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider)
            .build()
            .expect("client verifier");
        members.verify_client_cert(&leaf, &[], UnixTime::now()).expect("a member presents it as a client");
        let pod = ServerName::try_from("db-0.db-headless.ns.svc.cluster.local").expect("name");
        verifier.verify_server_cert(&leaf, &[], &pod, &[], UnixTime::now()).expect("pod name verifies");
        let stranger = ServerName::try_from("db-0.other.ns.svc.cluster.local").expect("name");
        assert!(verifier.verify_server_cert(&leaf, &[], &stranger, &[], UnixTime::now()).is_err());

        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        assert!(!renewal_due(Some(&annotations), &sans, &policy, now));
        assert!(renewal_due(Some(&annotations), &sans, &policy, now + 3100), "under the threshold");
        assert!(renewal_due(Some(&annotations), &["x".to_string()], &policy, now), "names changed");
        assert!(renewal_due(None, &sans, &policy, now));
    }

    #[test]
    fn a_rolling_statefulset_is_not_restamped_until_its_roll_is_done() {
        let sts = |strategy: Value, generation: i64, status: Value| json!({"metadata": {"generation": generation}, "spec": {"updateStrategy": strategy}, "status": status});
        let rolling = json!({"type": "RollingUpdate"});
        let done = json!({"observedGeneration": 2, "currentRevision": "a", "updateRevision": "a"});
        assert!(!roll_in_progress(&sts(rolling.clone(), 2, done.clone())), "rolled out");
        assert!(
            !roll_in_progress(&json!({"metadata": {"generation": 2}, "spec": {}, "status": done})),
            "RollingUpdate is the default"
        );
        assert!(
            roll_in_progress(&sts(
                rolling.clone(),
                3,
                json!({"observedGeneration": 2, "currentRevision": "a", "updateRevision": "a"})
            )),
            "new spec not yet observed"
        );
        let mid = json!({"observedGeneration": 2, "currentRevision": "a", "updateRevision": "b"});
        assert!(roll_in_progress(&sts(rolling, 2, mid.clone())), "pods on two revisions");
        assert!(roll_in_progress(&json!({"metadata": {"generation": 1}, "spec": {}})), "no status yet");
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
        assert!(is_certificate_request(&[(CERTIFICATE_LABEL.to_string(), "server".to_string())]));
        assert!(!is_certificate_request(&[]));
    }

    /// A cached OnDelete set whose certificate was renewed is to be stamped anew by this
    /// reconcile: its update revision is hidden from the plugin until then; not a set that
    /// carries the stamp already, one whose certificate is not issued, or one that rolls itself.
    #[test]
    fn an_on_delete_set_about_to_be_stamped_anew_is_pending() {
        let secret = |crt: &str| {
            json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "db-tls", "labels": {CERTIFICATE_LABEL: "server"},
                             "annotations": {certs::CERT_NOT_AFTER: "1", certs::CERT_SANS: "db.ns.svc"}},
                "data": {"tls.crt": base64_of(crt)}})
        };
        let mut sts = json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"},
            "spec": {"updateStrategy": {"type": "OnDelete"},
                     "template": {"spec": {"volumes": [{"name": "tls", "secret": {"secretName": "db-tls"}}]}}},
            "status": {"updateRevision": "db-1"}});
        stamp_pod_template(&mut sts, &BTreeMap::from([("db-tls".to_string(), "A".to_string())]));
        assert!(!restamp_pending(&sts, &[secret("A")]), "stamped with the certificate it has");
        assert!(restamp_pending(&sts, &[secret("B")]), "renewed: the next apply stamps it anew");
        let mut placeholder = secret("B");
        placeholder["metadata"]["annotations"] = json!({});
        assert!(!restamp_pending(&sts, &[placeholder]), "not issued: the stamp stays");
        let mut rolling = sts.clone();
        rolling["spec"]["updateStrategy"] = json!({"type": "RollingUpdate"});
        assert!(!restamp_pending(&rolling, &[secret("B")]), "rolls by itself");
        assert!(!restamp_pending(&secret("B"), &[secret("B")]), "not a StatefulSet");
        let mut earlier = secret("A");
        earlier["metadata"]["annotations"] = json!({certs::CERT_NOT_AFTER: "1"});
        assert!(restamp_pending(&sts, &[earlier]), "an earlier release's certificate, to be issued again");
    }

    /// A planned StatefulSet waits for its certificates before it is created (its pods would
    /// start on placeholder bytes and roll at once), is stamped from the issued ones, keeps its
    /// stamp while a certificate is missing or it rolls, and is left alone when it mounts none.
    #[test]
    fn a_planned_statefulset_is_created_only_with_its_certificates_and_stamped_from_them() {
        let planned = || {
            json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"},
                   "spec": {"template": {"spec": {"volumes": [{"name": "tls", "secret": {"secretName": "db-tls"}}]}}}})
        };
        let secret = |crt: Option<&str>| {
            let mut s = json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "db-tls", "labels": {CERTIFICATE_LABEL: "server"}},
                "data": {"tls.crt": base64_of("placeholder")}});
            if let Some(crt) = crt {
                s["metadata"]["annotations"] = json!({certs::CERT_NOT_AFTER: "1"});
                s["data"]["tls.crt"] = json!(base64_of(crt));
            }
            s
        };
        let requested = BTreeSet::from(["db-tls".to_string()]);
        let stamp = |v: &Value| v.pointer(POD_ANNOTATION_POINTER).cloned();

        // Asked for in this plan, not there yet; there with its placeholder: not created.
        let err = stamp_planned(&mut planned(), None, &[], &requested, None).expect_err("waits");
        assert!(err.contains("db-tls"), "{err}");
        stamp_planned(&mut planned(), None, &[secret(None)], &BTreeSet::new(), None).expect_err("waits");

        // Issued: created with the stamp of the certificate.
        let mut a = planned();
        stamp_planned(&mut a, None, &[secret(Some("A"))], &requested, None).expect("created");
        let mut expected = planned();
        stamp_pod_template(&mut expected, &BTreeMap::from([("db-tls".to_string(), "A".to_string())]));
        assert_eq!(stamp(&a), stamp(&expected));
        assert!(stamp(&a).is_some());

        // Renewed: the new stamp, unless the set is rolling (then the one it has).
        let done = json!({"observedGeneration": 1, "currentRevision": "r", "updateRevision": "r"});
        let mut existing = a.clone();
        existing["metadata"]["generation"] = json!(1);
        existing["status"] = done;
        let mut b = planned();
        stamp_planned(&mut b, Some(&existing), &[secret(Some("B"))], &requested, None).expect("applied");
        assert!(stamp(&b).is_some() && stamp(&b) != stamp(&a), "a renewal rolls");
        existing["status"]["updateRevision"] = json!("s");
        let mut held = planned();
        stamp_planned(&mut held, Some(&existing), &[secret(Some("B"))], &requested, None).expect("applied");
        assert_eq!(stamp(&held), stamp(&a), "no second roll over the one in progress");

        // The Secret gone (recreated with a placeholder): the set keeps what it has.
        let mut kept = planned();
        stamp_planned(&mut kept, Some(&existing), &[secret(None)], &requested, None).expect("applied");
        assert_eq!(stamp(&kept), stamp(&a));

        // Mounting no certificate Secret: applied as planned.
        let mut plain = json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
            "spec": {"template": {"spec": {"volumes": [{"name": "c", "configMap": {"name": "db-config"}}]}}}});
        let before = plain.clone();
        stamp_planned(&mut plain, None, &[secret(None)], &requested, None).expect("applied");
        assert_eq!(plain, before);

        // A new set waits until every planned Service is observed and its certificate names
        // them all (one issued before the last Service came is issued again, and would roll
        // the pods just made); an existing set is not held by it.
        let mut named = secret(Some("A"));
        named["metadata"]["annotations"][certs::CERT_SANS] = json!("a.ns.svc");
        let pending = Err("waiting for Service db-rw to be observed".to_string());
        let err = stamp_planned(&mut planned(), None, &[named.clone()], &requested, Some(&pending))
            .expect_err("waits for the Services");
        assert!(err.contains("db-rw"), "{err}");
        let all = Ok("a.ns.svc,b.ns.svc".to_string());
        let err = stamp_planned(&mut planned(), None, &[named.clone()], &requested, Some(&all))
            .expect_err("waits for a certificate naming both");
        assert!(err.contains("db-tls"), "{err}");
        named["metadata"]["annotations"][certs::CERT_SANS] = json!("a.ns.svc,b.ns.svc");
        stamp_planned(&mut planned(), None, &[named.clone()], &requested, Some(&all)).expect("created");
        stamp_planned(&mut planned(), Some(&existing), &[secret(Some("B"))], &requested, Some(&pending))
            .expect("an existing set is applied");
    }

    /// A verifier of server certificates for names under `ca_pem`, and one of client
    /// certificates (a member accepting another).
    fn verifiers(
        ca_pem: &str,
    ) -> (Arc<rustls::client::WebPkiServerVerifier>, Arc<dyn rustls::server::danger::ClientCertVerifier>)
    {
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::CertificateDer;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(cert.expect("pem")).expect("root");
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server =
            rustls::client::WebPkiServerVerifier::builder_with_provider(roots.clone(), provider.clone())
                .build()
                .expect("verifier");
        let client = rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider)
            .build()
            .expect("verifier");
        (server, client)
    }

    /// The leaf of a PEM chain.
    fn leaf(pem: &str) -> rustls::pki_types::CertificateDer<'static> {
        use rustls::pki_types::pem::PemObject as _;
        rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).expect("leaf")
    }

    /// A certificate of one instance's CA is refused by everything that trusts another's, as a
    /// server and as a member; a `server` certificate serves and is no client certificate, a
    /// `peer` one is both.
    #[test]
    fn an_instance_ca_vouches_for_its_own_certificates_only_and_usages_follow_the_role() {
        use rustls::client::danger::ServerCertVerifier as _;
        use rustls::pki_types::{ServerName, UnixTime};
        let policy = CertPolicy::default();
        let a = certs::issue_ca_for(&policy, certs::SERVICE_CA_COMMON_NAME, Some("uid-a")).expect("CA a");
        let b = certs::issue_ca_for(&policy, certs::SERVICE_CA_COMMON_NAME, Some("uid-b")).expect("CA b");
        let names = |ns: &str| service_sans(&[service("db", "db", false)], "db", ns);
        let (a_peer, _) = issue(&a, &names("a"), &policy, true).expect("issue");
        let (b_server, _) = issue(&b, &names("b"), &policy, false).expect("issue");
        let (b_peer, _) = issue(&b, &names("b"), &policy, true).expect("issue");
        let (b_servers, b_members) = verifiers(&b.ca_pem);
        let now = UnixTime::now();
        let b_name = ServerName::try_from("db.b.svc").expect("name");
        b_servers
            .verify_server_cert(&leaf(&b_server["tls.crt"]), &[], &b_name, &[], now)
            .expect("b serves b");
        assert!(
            b_servers.verify_server_cert(&leaf(&a_peer["tls.crt"]), &[], &b_name, &[], now).is_err(),
            "b's clients accepted a's certificate"
        );
        let a_name = ServerName::try_from("db.a.svc").expect("name");
        assert!(
            b_servers.verify_server_cert(&leaf(&a_peer["tls.crt"]), &[], &a_name, &[], now).is_err(),
            "b's CA vouched for a's own name"
        );
        assert!(b_members.verify_client_cert(&leaf(&a_peer["tls.crt"]), &[], now).is_err(), "a joined b");
        b_members.verify_client_cert(&leaf(&b_peer["tls.crt"]), &[], now).expect("a member of b");
        assert!(
            b_members.verify_client_cert(&leaf(&b_server["tls.crt"]), &[], now).is_err(),
            "a server certificate authenticated a client"
        );
    }

    /// From the shared CA: trust both (certificate unchanged), then the instance CA's
    /// certificate under both, then the instance CA alone, each step after its roll; a Secret on
    /// no CA it knows is issued at once.
    #[test]
    fn a_certificate_moves_from_the_shared_ca_one_roll_at_a_time() {
        let (instance, shared) = ("INSTANCE", "SHARED");
        let both = format!("{instance}{shared}");
        assert_eq!(ca_step(shared, None, instance, Some(shared), true), CaStep::TrustBoth);
        assert_eq!(ca_step(&both, Some(TRUSTING_BOTH), instance, None, false), CaStep::Rolling);
        assert_eq!(ca_step(&both, Some(TRUSTING_BOTH), instance, None, true), CaStep::IssueUnderBoth);
        assert_eq!(ca_step(&both, Some(ISSUED_UNDER_BOTH), instance, None, false), CaStep::Rolling);
        assert_eq!(ca_step(&both, Some(ISSUED_UNDER_BOTH), instance, None, true), CaStep::DropShared);
        assert_eq!(ca_step(instance, None, instance, Some(shared), true), CaStep::Current);
        assert_eq!(ca_step("placeholder", None, instance, Some(shared), true), CaStep::Issue);
        assert_eq!(ca_step(shared, None, instance, None, true), CaStep::Issue, "the shared CA gone");
    }

    /// A step waits for every StatefulSet mounting the Secret to carry the stamp of what the
    /// Secrets hold now, observed, with every replica updated and ready.
    #[test]
    fn a_roll_is_done_when_every_mounting_set_runs_the_current_certificates() {
        let certificates = BTreeMap::from([("db-tls".to_string(), "NOW".to_string())]);
        let set = |stamp_of: &str, status: Value| {
            let mut sts = json!({"kind": "StatefulSet", "metadata": {"generation": 2},
                "spec": {"replicas": 3, "template": {"spec": {"volumes": [{"name": "tls", "secret": {"secretName": "db-tls"}}]}}},
                "status": status});
            stamp_pod_template(&mut sts, &BTreeMap::from([("db-tls".to_string(), stamp_of.to_string())]));
            sts
        };
        let done = json!({"observedGeneration": 2, "replicas": 3, "updatedReplicas": 3, "readyReplicas": 3});
        assert!(rolled_out("db-tls", &certificates, &[set("NOW", done.clone())]));
        assert!(!rolled_out("db-tls", &certificates, &[set("BEFORE", done.clone())]), "not stamped yet");
        let mut unseen = done.clone();
        unseen["observedGeneration"] = json!(1);
        assert!(!rolled_out("db-tls", &certificates, &[set("NOW", unseen)]), "stamp not observed");
        let mut mid = done.clone();
        mid["updatedReplicas"] = json!(2);
        assert!(!rolled_out("db-tls", &certificates, &[set("NOW", mid)]), "one pod left");
        let mut unready = done;
        unready["readyReplicas"] = json!(2);
        assert!(!rolled_out("db-tls", &certificates, &[set("NOW", unready)]), "one pod not ready");
        let other = json!({"kind": "StatefulSet", "spec": {"template": {"spec": {"volumes": []}}}});
        assert!(rolled_out("db-tls", &certificates, &[other]), "mounts nothing of it");
    }
}
