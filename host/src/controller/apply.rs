//! Writes to the API server: server-side apply with an owner reference (none on a claim), delete
//! by name, and secrets created once. A child whose applied-hash annotation already matches is not written.

use std::collections::BTreeMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use rand::RngExt;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::Error;
use crate::children::INSTANCE_LABEL;
use crate::runtime::{ObjectRef, PodLabels, SecretRequest};

/// Field manager of every write the operator makes.
pub const FIELD_MANAGER: &str = "stateward";
/// Hash of what was last applied, so a converged child is never written again.
pub const APPLIED_HASH: &str = "stateward.dev/applied-hash";

/// Resolves child kinds to API resources once, through discovery.
pub struct Applier {
    client: Client,
    resources: Mutex<BTreeMap<String, ApiResource>>,
}

impl Applier {
    pub fn new(client: Client) -> Self {
        Self { client, resources: Mutex::new(BTreeMap::new()) }
    }

    async fn resource(&self, api_version: &str, kind: &str) -> Result<ApiResource, Error> {
        let key = format!("{api_version}/{kind}");
        if let Some(found) = self.resources.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(found);
        }
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, _caps) = kube::discovery::pinned_kind(&self.client, &gvk)
            .await
            .map_err(|e| Error::api("discover", kind, api_version, e))?;
        if let Ok(mut map) = self.resources.lock() {
            map.insert(key, resource.clone());
        }
        Ok(resource)
    }

    async fn api(&self, api_version: &str, kind: &str, namespace: &str) -> Result<Api<DynamicObject>, Error> {
        let resource = self.resource(api_version, kind).await?;
        Ok(Api::namespaced_with(self.client.clone(), namespace, &resource))
    }

    /// Server-side applies `object` owned by `owner`, unless `observed` already carries the
    /// same applied hash. Returns whether a write was made.
    pub async fn apply(
        &self,
        mut object: Value,
        owner: &Value,
        observed: Option<&Value>,
    ) -> Result<bool, Error> {
        let text = |v: &Value, p: &str| v.pointer(p).and_then(Value::as_str).unwrap_or_default().to_string();
        let (api_version, kind, name, namespace) = (
            text(&object, "/apiVersion"),
            text(&object, "/kind"),
            text(&object, "/metadata/name"),
            text(&object, "/metadata/namespace"),
        );
        // A claim is never made a dependent of the resource: the garbage collector would delete
        // the volume with it whatever retentionPolicy says; plugins delete claims explicitly.
        if kind != "PersistentVolumeClaim" {
            object["metadata"]["ownerReferences"] = json!([owner_reference(owner)]);
        }
        let hash = hex::encode(Sha256::digest(object.to_string().as_bytes()));
        if observed
            .and_then(|o| o.pointer(&format!("/metadata/annotations/{}", APPLIED_HASH.replace('/', "~1"))))
            == Some(&Value::String(hash.clone()))
        {
            return Ok(false);
        }
        object["metadata"]["annotations"][APPLIED_HASH] = Value::String(hash);
        let api = self.api(&api_version, &kind, &namespace).await?;
        if observed.is_none() {
            // Not among this resource's cached children: before creating it, make sure no one
            // else's object of that name is there (a forced apply would take it over, and the
            // garbage collector would delete it with this resource).
            let found = api
                .list_metadata(&ListParams::default().fields(&format!("metadata.name={name}")))
                .await
                .map_err(|e| Error::api("list", &kind, &name, e))?;
            if let Some(why) = found.items.first().and_then(|existing| not_ours(&existing.metadata, owner)) {
                return Err(Error::ObjectConflict { kind, name, why });
            }
        }
        let params = PatchParams::apply(FIELD_MANAGER).force();
        api.patch(&name, &params, &Patch::Apply(&object))
            .await
            .map_err(|e| Error::api("apply", &kind, &name, e))?;
        Ok(true)
    }

    /// Deletes by name; an object already gone is fine. Returns whether a write was made.
    pub async fn delete(&self, target: &ObjectRef, namespace: &str, observed: bool) -> Result<bool, Error> {
        if !observed {
            return Ok(false);
        }
        let api = self.api(&target.api_version, &target.kind, namespace).await?;
        match api.delete(&target.name, &DeleteParams::background()).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
            Err(e) => Err(Error::api("delete", &target.kind, &target.name, e)),
        }
    }

    /// Creates the Secret with random values if it does not exist; adds missing keys to an
    /// existing one; never changes a value that is there. Returns whether a write was made.
    /// A certificate request is created controlled by `owner` (the custom resource): the
    /// certificate keeper fills only Secrets so made (controller/service_certs.rs). Other
    /// Secrets (credentials) carry no owner reference, so `retentionPolicy: Retain` keeps them.
    pub async fn ensure_secret(
        &self,
        request: &SecretRequest,
        namespace: &str,
        existing: Option<&Secret>,
        owner: &Value,
    ) -> Result<bool, Error> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let missing = secret_writes(request, existing.and_then(|s| s.data.as_ref()), namespace)
            .map_err(|reason| Error::Resource(request.name.clone(), reason))?;
        let adopt = existing.and_then(|s| certificate_adoption(request, s, owner));
        let role = existing.and_then(|s| certificate_role_change(request, s, owner, adopt.is_some()));
        if missing.is_empty() && adopt.is_none() && role.is_none() {
            return Ok(false);
        }
        if let Some(existing) = existing {
            let mut patch = json!({ "metadata": { "resourceVersion": existing.metadata.resource_version } });
            if let Some(references) = adopt {
                patch["metadata"]["ownerReferences"] = references;
            }
            if let Some(role) = role {
                patch["metadata"]["labels"] = json!({ super::service_certs::CERTIFICATE_LABEL: role });
            }
            if !missing.is_empty() {
                patch["data"] = json!(missing);
            }
            api.patch(&request.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| Error::api("patch", "Secret", &request.name, e))?;
            return Ok(true);
        }
        let mut labels: BTreeMap<String, String> = request.labels.iter().cloned().collect();
        labels.entry(INSTANCE_LABEL.to_string()).or_default();
        let owner_references = if super::service_certs::is_certificate_request(&request.labels) {
            let reference = serde_json::from_value(owner_reference(owner))
                .map_err(|e| Error::api("create", "Secret", &request.name, kube::Error::SerdeError(e)))?;
            Some(vec![reference])
        } else {
            None
        };
        let secret = Secret {
            metadata: kube::core::ObjectMeta {
                name: Some(request.name.clone()),
                namespace: Some(namespace.to_string()),
                labels: Some(labels),
                owner_references,
                ..Default::default()
            },
            data: Some(missing),
            type_: Some("Opaque".into()),
            ..Default::default()
        };
        match api.create(&PostParams::default(), &secret).await {
            Ok(_) => Ok(true),
            // Someone (a previous run of ours) created it meanwhile: never overwrite.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(e) => Err(Error::api("create", "Secret", &request.name, e)),
        }
    }

    /// Sets (or removes, for `None`) labels and annotations of a Pod of the instance with a
    /// merge patch that touches nothing else; its controller stays its owner. Returns whether
    /// a write was made.
    pub async fn label_pod(
        &self,
        request: &PodLabels,
        namespace: &str,
        current: Option<&Value>,
    ) -> Result<bool, Error> {
        let Some(current) = current else {
            return Err(Error::Resource(
                request.pod.clone(),
                "label-pod: not a pod of this instance (gone, or the plugin does not own v1 Pod)".into(),
            ));
        };
        let changes = |pairs: &[(String, Option<String>)], field: &str| {
            pairs
                .iter()
                .filter(|(k, v)| {
                    current
                        .pointer(&format!("/metadata/{field}"))
                        .and_then(|m| m.get(k))
                        .and_then(Value::as_str)
                        != v.as_deref()
                })
                .map(|(k, v)| (k.clone(), json!(v)))
                .collect::<serde_json::Map<_, _>>()
        };
        let (labels, annotations) =
            (changes(&request.labels, "labels"), changes(&request.annotations, "annotations"));
        if labels.is_empty() && annotations.is_empty() {
            return Ok(false);
        }
        let patch = json!({ "metadata": { "labels": labels, "annotations": annotations } });
        let api: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(self.client.clone(), namespace);
        match api.patch(&request.pod, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => Ok(true),
            // Deleted since it was observed: there is nothing left to label (its replacement
            // starts without the labels, and the next reconcile sees it).
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
            Err(e) => Err(Error::api("patch", "Pod", &request.pod, e)),
        }
    }
}

/// The keys `request` has to write into a Secret holding `have`: random values for its
/// missing random keys, and each derived key whose template, filled from the values the Secret
/// will hold, differs from what is there (a key it uses changed). Derived keys are filled in
/// the order given, so a template may use a derived key before it (a URI from a derived user
/// name). The error says which derived key cannot be filled, and why.
fn secret_writes(
    request: &SecretRequest,
    have: Option<&BTreeMap<String, ByteString>>,
    namespace: &str,
) -> Result<BTreeMap<String, ByteString>, String> {
    let mut missing: BTreeMap<String, ByteString> = request
        .keys
        .iter()
        .filter(|(key, _)| !have.is_some_and(|d| d.contains_key(key)))
        .map(|(key, bytes)| (key.clone(), ByteString(random_value(*bytes))))
        .collect();
    let mut values: BTreeMap<String, ByteString> = have.cloned().unwrap_or_default();
    values.extend(missing.clone());
    for (key, template) in &request.derived {
        let value = fill_template(template, &values, namespace)
            .map_err(|reason| format!("derived key {key}: {reason}"))?;
        let value = ByteString(value.into_bytes());
        if values.get(key) != Some(&value) {
            missing.insert(key.clone(), value.clone());
        }
        values.insert(key.clone(), value);
    }
    Ok(missing)
}

/// Fills `{key}` with that key's value and `{namespace}` with the namespace.
fn fill_template(
    template: &str,
    values: &BTreeMap<String, ByteString>,
    namespace: &str,
) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = rest[open..].find('}').ok_or("an unclosed '{'")? + open;
        let name = &rest[open + 1..close];
        let value = match name {
            "namespace" => namespace.to_string(),
            key => values
                .get(key)
                .map(|v| String::from_utf8_lossy(&v.0).into_owned())
                .ok_or_else(|| format!("the Secret has no key {key}"))?,
        };
        out.push_str(&value);
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Printable random characters; `bytes` of entropy is the plugin's request.
fn random_value(bytes: u32) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789";
    let mut rng = rand::rng();
    (0..bytes.clamp(8, 1024)).map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())]).collect()
}

/// Why an existing object of a child's name is not the resource's to take, or `None` when it
/// is: controlled by it; controlled by an earlier resource of the same kind and name (deleted,
/// the garbage collector has not got to it yet); or orphaned by one (no controller, the
/// resource's instance label).
fn not_ours(meta: &kube::core::ObjectMeta, owner: &Value) -> Option<String> {
    let field = |p: &str| owner.pointer(p).and_then(Value::as_str).unwrap_or_default();
    let group =
        |api_version: &str| api_version.rsplit_once('/').map(|(g, _)| g.to_string()).unwrap_or_default();
    let controller = meta.owner_references.iter().flatten().find(|r| r.controller == Some(true));
    match controller {
        Some(r) if r.uid == field("/metadata/uid") => None,
        Some(r)
            if r.kind == field("/kind")
                && r.name == field("/metadata/name")
                && group(&r.api_version) == group(field("/apiVersion")) =>
        {
            None
        }
        Some(r) => Some(format!("is controlled by {} {}", r.kind, r.name)),
        None if meta.labels.as_ref().and_then(|l| l.get(INSTANCE_LABEL)).map(String::as_str)
            == Some(field("/metadata/name")) =>
        {
            None
        }
        None => {
            Some(format!("was not created by stateward for {} {}", field("/kind"), field("/metadata/name")))
        }
    }
}

/// The owner references to give an existing certificate Secret that the release before this one
/// made for the resource without any (it carries the labels this request asks for): with the
/// resource as its controller the certificate keeper renews it. None for a Secret that has a
/// controller, or lacks those labels (a Secret of the user's own is never taken).
fn certificate_adoption(request: &SecretRequest, existing: &Secret, owner: &Value) -> Option<Value> {
    if !super::service_certs::is_certificate_request(&request.labels) {
        return None;
    }
    let meta = &existing.metadata;
    let references = meta.owner_references.clone().unwrap_or_default();
    if references.iter().any(|r| r.controller == Some(true)) {
        return None;
    }
    let labels = meta.labels.as_ref()?;
    // The role may differ (a build that asks for `peer` where an earlier one asked for `server`):
    // it is relabelled with the adoption (`certificate_role_change`).
    let certificate = |k: &str| k == super::service_certs::CERTIFICATE_LABEL;
    if !labels.get(super::service_certs::CERTIFICATE_LABEL).is_some_and(|v| v == "server" || v == "peer")
        || !request.labels.iter().all(|(k, v)| certificate(k) || labels.get(k) == Some(v))
    {
        return None;
    }
    let mut all: Vec<Value> = references.iter().filter_map(|r| serde_json::to_value(r).ok()).collect();
    all.push(owner_reference(owner));
    Some(Value::Array(all))
}

/// The certificate role to write on an existing certificate Secret of this resource (controlled
/// by it, or being adopted) whose label names another role than the plugin asks for now: the
/// keeper then issues a certificate with the usages of the new role. None otherwise.
fn certificate_role_change(
    request: &SecretRequest,
    existing: &Secret,
    owner: &Value,
    adopting: bool,
) -> Option<String> {
    let label = super::service_certs::CERTIFICATE_LABEL;
    let wanted = request.labels.iter().find(|(k, _)| k == label).map(|(_, v)| v.clone())?;
    let ours =
        adopting
            || existing.metadata.owner_references.iter().flatten().any(|r| {
                r.controller == Some(true) && owner["metadata"]["uid"].as_str() == Some(r.uid.as_str())
            });
    let now = existing.metadata.labels.as_ref().and_then(|l| l.get(label));
    (ours && super::service_certs::is_certificate_request(&request.labels) && now != Some(&wanted))
        .then_some(wanted)
}

/// The controller owner reference to the custom resource.
pub fn owner_reference(owner: &Value) -> Value {
    json!({
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::{certificate_adoption, certificate_role_change, not_ours, secret_writes};
    use crate::runtime::SecretRequest;
    use k8s_openapi::ByteString;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn text(map: &BTreeMap<String, ByteString>, key: &str) -> String {
        String::from_utf8_lossy(&map[key].0).into_owned()
    }

    /// A URI key filled by the host from the Secret's own keys, one of them derived itself: on
    /// creation (nothing there yet), once everything is there (nothing to write), and after the
    /// password changed (only the URI is rewritten).
    #[test]
    fn derived_keys_are_filled_from_the_secrets_keys_and_earlier_derived_ones() {
        let request = SecretRequest {
            name: "app".into(),
            keys: vec![("password".into(), 24)],
            labels: vec![],
            derived: vec![
                ("username".into(), "app".into()),
                ("uri".into(), "postgresql://{username}:{password}@db.{namespace}.svc:5432/app".into()),
            ],
        };
        let first = secret_writes(&request, None, "ns").expect("filled");
        let password = text(&first, "password");
        assert_eq!(password.len(), 24);
        assert_eq!(text(&first, "username"), "app");
        assert_eq!(text(&first, "uri"), format!("postgresql://app:{password}@db.ns.svc:5432/app"));

        let again = secret_writes(&request, Some(&first), "ns").expect("filled");
        assert!(again.is_empty(), "nothing changed: {:?}", again.keys().collect::<Vec<_>>());

        let mut rotated = first.clone();
        rotated.insert("password".into(), ByteString(b"new-password".to_vec()));
        let writes = secret_writes(&request, Some(&rotated), "ns").expect("filled");
        assert_eq!(writes.keys().collect::<Vec<_>>(), ["uri"]);
        assert_eq!(text(&writes, "uri"), "postgresql://app:new-password@db.ns.svc:5432/app");

        let unknown = SecretRequest { derived: vec![("uri".into(), "{nope}".into())], ..request };
        let err = secret_writes(&unknown, None, "ns").map(|_| ()).expect_err("an unknown key");
        assert_eq!(err, "derived key uri: the Secret has no key nope");
    }

    fn meta(value: serde_json::Value) -> kube::core::ObjectMeta {
        serde_json::from_value(value).unwrap_or_default()
    }

    #[test]
    fn only_this_resource_or_its_earlier_self_may_take_an_object() {
        let owner = json!({"apiVersion": "stateward.dev/v1", "kind": "RedisCluster", "metadata": {"name": "cache", "uid": "u2"}});
        let controlled = |kind: &str, name: &str, uid: &str| {
            meta(
                json!({"name": "cache", "ownerReferences": [{"apiVersion": "stateward.dev/v1", "kind": kind, "name": name, "uid": uid, "controller": true}]}),
            )
        };
        assert_eq!(not_ours(&controlled("RedisCluster", "cache", "u2"), &owner), None);
        assert_eq!(
            not_ours(&controlled("RedisCluster", "cache", "u1"), &owner),
            None,
            "an earlier RedisCluster cache"
        );
        assert_eq!(
            not_ours(&controlled("PostgresCluster", "cache", "u3"), &owner).as_deref(),
            Some("is controlled by PostgresCluster cache")
        );
        assert_eq!(
            not_ours(&controlled("RedisCluster", "other", "u4"), &owner).as_deref(),
            Some("is controlled by RedisCluster other")
        );
        let orphan = meta(json!({"name": "cache", "labels": {"stateward.dev/instance": "cache"}}));
        assert_eq!(not_ours(&orphan, &owner), None, "orphaned by an earlier resource of this name");
        let users = meta(json!({"name": "cache", "labels": {"app": "web"}}));
        assert_eq!(
            not_ours(&users, &owner).as_deref(),
            Some("was not created by stateward for RedisCluster cache")
        );
    }

    #[test]
    fn a_certificate_secret_an_earlier_release_left_without_owner_is_adopted_and_no_other() {
        let owner = json!({ "apiVersion": "stateward.dev/v1", "kind": "PostgresCluster", "metadata": { "name": "db", "uid": "u-1" } });
        let request = SecretRequest {
            name: "db-tls".into(),
            keys: Vec::new(),
            labels: vec![
                ("stateward.dev/certificate".into(), "server".into()),
                ("stateward.dev/instance".into(), "db".into()),
            ],
            derived: Vec::new(),
        };
        let secret = |meta: serde_json::Value| k8s_openapi::api::core::v1::Secret {
            metadata: serde_json::from_value(meta).expect("meta"),
            ..Default::default()
        };
        let labelled = json!({ "stateward.dev/certificate": "server", "stateward.dev/instance": "db" });
        let old = secret(json!({ "name": "db-tls", "labels": labelled }));
        let refs = certificate_adoption(&request, &old, &owner).expect("adopted");
        assert_eq!(refs[0]["uid"], "u-1");
        assert_eq!(refs[0]["controller"], true);
        // Already controlled (by us or anyone): left alone.
        let owned = secret(json!({ "name": "db-tls", "labels": labelled, "ownerReferences": [
            { "apiVersion": "v1", "kind": "X", "name": "x", "uid": "u-9", "controller": true } ] }));
        assert_eq!(certificate_adoption(&request, &owned, &owner), None);
        // The user's own Secret of that name (no certificate label): never taken.
        let users = secret(json!({ "name": "db-tls", "labels": { "stateward.dev/instance": "db" } }));
        assert_eq!(certificate_adoption(&request, &users, &owner), None);
        // Not a certificate request: credentials never get an owner (Retain keeps them).
        let credentials =
            SecretRequest { labels: vec![("stateward.dev/instance".into(), "db".into())], ..request };
        assert_eq!(certificate_adoption(&credentials, &old, &owner), None);
    }

    /// A build asking for a `peer` certificate where an earlier one asked for `server` relabels
    /// the resource's own Secret (and one it adopts), so the keeper issues the new usages; a
    /// Secret of someone else's, or with the role asked for, is left alone.
    #[test]
    fn the_certificate_role_follows_the_request_on_the_resources_own_secret() {
        let owner = json!({ "apiVersion": "stateward.dev/v1", "kind": "ElasticsearchCluster", "metadata": { "name": "es", "uid": "u-1" } });
        let request = SecretRequest {
            name: "es-tls".into(),
            keys: Vec::new(),
            labels: vec![
                ("stateward.dev/certificate".into(), "peer".into()),
                ("stateward.dev/instance".into(), "es".into()),
            ],
            derived: Vec::new(),
        };
        let secret = |meta: serde_json::Value| k8s_openapi::api::core::v1::Secret {
            metadata: serde_json::from_value(meta).expect("meta"),
            ..Default::default()
        };
        let labels =
            |role: &str| json!({ "stateward.dev/certificate": role, "stateward.dev/instance": "es" });
        let controlled = |role: &str, uid: &str| {
            secret(json!({ "name": "es-tls", "labels": labels(role), "ownerReferences": [
                { "apiVersion": "stateward.dev/v1", "kind": "ElasticsearchCluster", "name": "es", "uid": uid, "controller": true } ] }))
        };
        let change = |s: &k8s_openapi::api::core::v1::Secret, adopting| {
            certificate_role_change(&request, s, &owner, adopting)
        };
        assert_eq!(change(&controlled("server", "u-1"), false).as_deref(), Some("peer"));
        assert_eq!(change(&controlled("peer", "u-1"), false), None, "already the role asked for");
        assert_eq!(change(&controlled("server", "u-9"), false), None, "another resource's");
        let old = secret(json!({ "name": "es-tls", "labels": labels("server") }));
        assert!(certificate_adoption(&request, &old, &owner).is_some(), "adopted whatever its role");
        assert_eq!(change(&old, true).as_deref(), Some("peer"), "relabelled as it is adopted");
    }
}
