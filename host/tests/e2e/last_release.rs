//! The last release before the HA wave (commit a3d9881) as the upgrade tests make it again:
//! its resources, their status and the children its operator applied, from the fixtures in
//! host/tests/fixtures/last-release (that release's rendered output), applied the way its
//! operator applied them, before this build's operator starts.

use std::path::Path;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use kube::core::DynamicObject;
use kube::Api;
use serde::Deserialize as _;
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};
use stateward_testkit::{LoopbackCert, TestEnv};

/// The text of a fixture file.
pub fn fixture_text(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/last-release").join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The objects of a fixture text, without their namespace.
pub fn documents(text: &str) -> Vec<Value> {
    yaml_serde::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).expect("fixture yaml"))
        .filter(|v| !v.is_null())
        .map(|mut o| {
            if let Some(meta) = o["metadata"].as_object_mut() {
                meta.remove("namespace");
            }
            o
        })
        .collect()
}

/// The controller owner reference that release's applier set on a child of `cr`.
pub fn owner_reference(cr: &Value) -> Value {
    assert!(cr["metadata"]["uid"].is_string(), "a resource the API server made: {cr}");
    json!({
        "apiVersion": cr["apiVersion"], "kind": cr["kind"], "name": cr["metadata"]["name"],
        "uid": cr["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true,
    })
}

/// What the last release's certificate keeper stamped on a pod template mounting the Secret
/// `tls` whose `tls.crt` is `cert_pem` (stamp_pod_template at a3d9881).
pub fn certificate_stamp(tls: &str, cert_pem: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(tls.as_bytes());
    h.update([0]);
    h.update(Sha256::digest(cert_pem));
    hex::encode(h.finalize())
}

/// What this build's keeper stamps: over the certificate and the CAs the pods trust (`tls.crt`
/// then `ca.crt`), so a change of trust rolls them too.
pub fn current_certificate_stamp(tls: &str, cert_pem: &[u8], ca_pem: &[u8]) -> String {
    certificate_stamp(tls, &[cert_pem, ca_pem].concat())
}

/// The children of the resource `cr` from a fixture `text` (its name and image substituted), as
/// that release left them: every object but the Secrets controlled by the resource; the
/// credentials hold a password like the ones its host generated, the certificate Secret `cert`
/// with the expiry annotation its keeper wrote (the Secrets carry no owner reference, as its host
/// created them), and the pod template the keeper's stamp of that certificate. `edit` changes
/// the StatefulSet further.
pub fn children(text: &str, cr: &Value, cert: &LoopbackCert, mut edit: impl FnMut(&mut Value)) -> Vec<Value> {
    let name = cr["metadata"]["name"].as_str().unwrap_or_default();
    let tls = format!("{name}-tls");
    // The certificate lives longer than this (rcgen's default).
    let not_after = k8s_openapi::jiff::Timestamp::now().as_second() + 365 * 24 * 3600;
    let owner = owner_reference(cr);
    let mut objects = documents(text);
    for o in &mut objects {
        let object_name = o["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let kind = o["kind"].as_str().unwrap_or_default().to_string();
        match kind.as_str() {
            "Secret" if object_name == format!("{name}-credentials") => {
                o["stringData"] = json!({ "password": random_password() });
            }
            "Secret" if object_name == tls => {
                o["stringData"] =
                    json!({ "tls.crt": cert.cert_pem, "tls.key": cert.key_pem, "ca.crt": cert.ca_pem });
                o["metadata"]["annotations"]["stateward.dev/cert-not-after"] = json!(not_after.to_string());
            }
            "Secret" => panic!("a Secret the fixture should not have: {object_name}"),
            _ => {
                o["metadata"]["ownerReferences"] = json!([owner]);
                if kind == "StatefulSet" {
                    o["spec"]["template"]["metadata"]["annotations"]["stateward.dev/certificates-sha256"] =
                        json!(certificate_stamp(&tls, cert.cert_pem.as_bytes()));
                    edit(o);
                }
            }
        }
    }
    objects
}

/// A password like the ones that release's host generated (24 characters of its alphabet).
fn random_password() -> String {
    use rand::RngExt as _;
    const ALPHABET: &[u8] = b"ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789";
    let mut rng = rand::rng();
    (0..24).map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())])).collect()
}

/// Applies `objects` as that release's host did: server-side apply, field manager `stateward`,
/// forced. The manager matters: this build applies with the same one, so what that release set
/// and this one no longer does (a container's command or arguments, the rolling-update
/// partition, a Service's pod-name selector) goes with its first apply, as in a real upgrade.
pub fn apply(env: &TestEnv, objects: &[Value]) {
    let list = json!({ "apiVersion": "v1", "kind": "List", "items": objects });
    let out = super::kubectl_stdin(
        env,
        &[
            "apply",
            "-n",
            &env.namespace,
            "--server-side",
            "--field-manager=stateward",
            "--force-conflicts",
            "-f",
            "-",
        ],
        &list.to_string(),
    );
    assert!(
        out.status.success(),
        "applying the last release's objects: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The status that release left on a converged three-member cluster: its host's phase,
/// conditions, observedGeneration and plugin stamp (`plugin`), and its plugin's fields `extra`.
fn status(generation: i64, plugin: &str, extra: Value) -> Value {
    let now = format!("{:.0}", k8s_openapi::jiff::Timestamp::now());
    let condition = |type_: &str, status: &str, reason: &str, message: &str| json!({ "type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": now });
    let mut status = json!({
        "phase": "Running",
        "conditions": [
            condition("Available", "True", "AllReplicasReady", "3 of 3 replicas ready"),
            condition("Progressing", "False", "Converged", "3 of 3 replicas ready"),
            condition("Degraded", "False", "AsExpected", "nothing has failed"),
        ],
        "observedGeneration": generation,
        "plugin": plugin,
        "readyReplicas": 3,
    });
    if let (Some(s), Some(e)) = (status.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    status
}

/// Makes the resource `cr` as that release left it, before this build's operator runs: created
/// with its finalizer, its status written ([`status`] with `plugin` and its fields `extra`), and
/// its children applied (`children` of the resource as made). The CRDs are this build's (the
/// old status fits them); the operator's start would install them, so that is done here first.
/// Returns the resource.
pub async fn make(
    env: &TestEnv,
    api: &Api<DynamicObject>,
    mut cr: Value,
    plugin: &str,
    extra: Value,
    children: impl FnOnce(&Value) -> Vec<Value>,
) -> Value {
    super::prepare(env);
    let name = cr["metadata"]["name"].as_str().unwrap_or_default().to_string();
    cr["metadata"]["finalizers"] = json!([super::FINALIZER]);
    super::apply(env, &env.namespace, &cr);
    let created = super::get_cr(api, &name).await.expect("the resource");
    let generation = created.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(1);
    let status = status(generation, plugin, extra);
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&json!({ "status": status })))
        .await
        .expect("the last release's status");
    apply(env, &children(&created));
    created
}

/// The pods of the cluster `instance` (none on an error: the caller polls).
pub async fn instance_pods(env: &TestEnv, instance: &str) -> Vec<Pod> {
    let pods: Api<Pod> = env.api();
    let by_instance = ListParams::default().labels(&format!("{}={instance}", super::INSTANCE_LABEL));
    pods.list(&by_instance).await.map(|l| l.items).unwrap_or_default()
}

/// Whether the pod is Ready.
pub fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The StatefulSet `name` and its pods as a takeover is watched: each poll records every pod's
/// uid (a pod made again under its name is another).
#[derive(Default)]
pub struct Rollout {
    /// Pod name → every uid seen under it.
    pub uids: std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
}

/// One poll of a [`Rollout`].
pub struct Seen {
    pub statefulset: Option<k8s_openapi::api::apps::v1::StatefulSet>,
    /// Its `updateStrategy` is `OnDelete` (this build's).
    pub on_delete: bool,
    /// Its controller has seen its latest spec.
    pub observed: bool,
    pub revision: Option<String>,
    /// The pods of `pods` not Ready on that revision (or going away).
    pub outdated: Vec<String>,
}

impl Rollout {
    /// Polls the StatefulSet `name` and the pods of the instance, `pods` the ones expected.
    pub async fn poll(&mut self, env: &TestEnv, name: &str, pods: &[String]) -> Seen {
        let now = instance_pods(env, name).await;
        for p in &now {
            self.uids
                .entry(p.metadata.name.clone().unwrap_or_default())
                .or_default()
                .insert(p.metadata.uid.clone().unwrap_or_default());
        }
        let sets: Api<k8s_openapi::api::apps::v1::StatefulSet> = env.api();
        let set = sets.get_opt(name).await.ok().flatten();
        let on_delete = set
            .as_ref()
            .and_then(|s| s.spec.as_ref())
            .and_then(|s| s.update_strategy.as_ref())
            .and_then(|u| u.type_.as_deref())
            == Some("OnDelete");
        let observed = set.as_ref().is_some_and(|s| {
            s.status.as_ref().and_then(|st| st.observed_generation) == s.metadata.generation
        });
        let revision = set.as_ref().and_then(|s| s.status.as_ref()).and_then(|s| s.update_revision.clone());
        let on_revision = |p: &Pod| {
            p.metadata.deletion_timestamp.is_none()
                && ready(p)
                && revision.is_some()
                && p.metadata.labels.as_ref().and_then(|l| l.get("controller-revision-hash"))
                    == revision.as_ref()
        };
        let outdated = pods
            .iter()
            .filter(|n| !now.iter().any(|p| p.metadata.name.as_ref() == Some(*n) && on_revision(p)))
            .cloned()
            .collect();
        Seen { statefulset: set, on_delete, observed, revision, outdated }
    }

    /// Pods made again since the first poll.
    pub fn replaced(&self) -> usize {
        self.uids.values().map(|u| u.len().saturating_sub(1)).sum()
    }
}
