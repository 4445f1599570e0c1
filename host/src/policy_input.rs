//! The input documents of the three decision points, built here and nowhere else
//! (docs/architecture.md, The three decision points): what the host hands to
//! `stateward.guardrails`, `stateward.admission` and `stateward.plugins`, from the host's own
//! types (a loaded [`Plugin`], a plan's [`Action`], an admission request, a cached resource).
//! The policy gate decides on these documents; policies/*.rego read them. The contract tests
//! below hold the documents to the fixtures the policy tests use (policies/*_test.rego and
//! policies/testdata), and every field the shipped rego reads from `input` to what is built here.
//!
//! The conversion of a document into Rego values is the engine's (policy/input.rs).

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::runtime::{Action, FieldError, HttpTarget, Plugin, StatusReport};

/// A Kubernetes kind, as plugins declare the kinds they own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KindRef {
    /// e.g. `apps/v1`.
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    /// e.g. `StatefulSet`.
    pub kind: String,
}

/// The plugin whose plan is checked (guardrails input `plugin`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanAuthor {
    /// Plugin name.
    pub name: String,
    /// Plugin version.
    pub version: String,
    /// `sha256:<hex>` of the component.
    pub digest: String,
    /// Kinds the plugin declares it owns (policy input `plugin.owns`).
    pub owns: Vec<KindRef>,
}

impl PlanAuthor {
    /// The author of `plugin`'s plans: its identity, `sha256:`-prefixed digest and owned kinds.
    pub fn of(plugin: &Plugin) -> Self {
        Self {
            name: plugin.name().to_string(),
            version: plugin.version().to_string(),
            digest: plugin.prefixed_digest(),
            owns: plugin
                .info()
                .owns
                .iter()
                .map(|c| KindRef { api_version: c.api_version.clone(), kind: c.kind.clone() })
                .collect(),
        }
    }

    /// The `plugin` member of a guardrails input, shared by every action of a plan.
    pub fn document(&self) -> Value {
        json!({ "name": self.name, "version": self.version, "digest": self.digest, "owns": self.owns })
    }
}

/// One action of a plan, independent of wasmtime types. `object` is Kubernetes-shaped: an
/// apply carries the object, a delete `{apiVersion, kind, metadata:{name, namespace}}`, an
/// ensure-secret `{apiVersion:"v1", kind:"Secret", metadata:{name, namespace}, keys}`.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedAction {
    /// `apply`, `delete`, `ensure-secret`, `label-pod`, `exec`, `http` or `status`.
    pub verb: String,
    /// The object acted on.
    pub object: Value,
}

impl PlannedAction {
    /// The object a policy sees for each verb of `action` planned for `resource`: the applied
    /// object itself, or a skeleton naming what is deleted or which Secret keys are ensured
    /// (never any value). A request or a label change names its Pod (or Service) with the
    /// labels the host observed on it in `children` (none when it is not one of them), so a
    /// policy can tell the instance's own pods from any other; stdin and bodies appear as
    /// their size only.
    pub fn of(action: &Action, resource: &Value, children: &[Value]) -> Self {
        let ns = resource.pointer("/metadata/namespace").cloned().unwrap_or(Value::Null);
        let target = |kind: &str, name: &str| {
            let seen = children
                .iter()
                .find(|c| c["apiVersion"] == "v1" && c["kind"] == kind && c["metadata"]["name"] == name);
            let labels =
                seen.and_then(|c| c.pointer("/metadata/labels").cloned()).unwrap_or_else(|| json!({}));
            json!({
                "apiVersion": "v1", "kind": kind,
                "metadata": {"name": name, "namespace": ns, "labels": labels},
                "declaredPorts": seen.map(declared_ports).unwrap_or_default(),
            })
        };
        let object = match action {
            Action::Apply { object } => object.clone(),
            Action::Delete { target } => json!({
                "apiVersion": target.api_version, "kind": target.kind,
                "metadata": {"name": target.name, "namespace": ns},
            }),
            Action::EnsureSecret { secret } => json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": secret.name, "namespace": ns},
                "keys": secret.keys.iter().map(|(k, _)| k).collect::<Vec<_>>(),
                "derivedKeys": secret.derived.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            }),
            Action::LabelPod { pods } => {
                let pairs = |p: &[(String, Option<String>)]| {
                    p.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>()
                };
                let mut object = target("Pod", &pods.pod);
                object["set"] =
                    json!({"labels": pairs(&pods.labels), "annotations": pairs(&pods.annotations)});
                object
            }
            Action::Exec { request } => {
                let e = &request.what;
                let mut object = target("Pod", &e.pod);
                object["exec"] = json!({
                    "id": request.id, "mode": request.mode, "timeoutMs": request.timeout.as_millis() as u64,
                    "container": e.container, "command": e.command,
                    "stdinBytes": e.stdin.as_ref().map_or(0, String::len),
                });
                object
            }
            Action::Http { request } => {
                let h = &request.what;
                let mut object = match &h.target {
                    HttpTarget::Pod(name) => target("Pod", name),
                    HttpTarget::Service(name) => target("Service", name),
                };
                object["http"] = json!({
                    "id": request.id, "mode": request.mode, "timeoutMs": request.timeout.as_millis() as u64,
                    "port": h.port, "method": h.method, "path": h.path, "tls": h.tls.is_some(),
                    "headers": h.headers.iter().map(|(k, _)| k).collect::<Vec<_>>(),
                    "bodyBytes": h.body.as_ref().map_or(0, String::len),
                    "basicAuthSecret": h.basic_auth.as_ref().map(|a| &a.secret),
                });
                object
            }
        };
        Self { verb: action.verb().to_string(), object }
    }
}

impl PlannedAction {
    /// The status write of a plan (verb `status`): the resource itself, with the top-level
    /// fields the plugin reports beside phase and conditions and their size as JSON (the
    /// values are not copied into every decision's audit record).
    pub fn status(report: &StatusReport, resource: &Value) -> Self {
        let meta = |k: &str| resource.pointer(&format!("/metadata/{k}")).cloned().unwrap_or(Value::Null);
        let keys: Vec<&String> = report.extra.as_object().map(|m| m.keys().collect()).unwrap_or_default();
        let object = json!({
            "apiVersion": resource.get("apiVersion").cloned().unwrap_or(Value::Null),
            "kind": resource.get("kind").cloned().unwrap_or(Value::Null),
            "metadata": {"name": meta("name"), "namespace": meta("namespace")},
            "status": {"keys": keys, "bytes": report.extra.to_string().len()},
        });
        Self { verb: "status".to_string(), object }
    }
}

/// The ports an observed Pod's containers or a Service declare.
fn declared_ports(object: &Value) -> Vec<Value> {
    let pod = object.pointer("/spec/containers").and_then(Value::as_array).into_iter().flatten();
    let pod_ports =
        pod.flat_map(|c| c["ports"].as_array().into_iter().flatten()).map(|p| p["containerPort"].clone());
    let service = object.pointer("/spec/ports").and_then(Value::as_array).into_iter().flatten();
    pod_ports.chain(service.map(|p| p["port"].clone())).filter(Value::is_number).collect()
}

/// The guardrails `resource` member `{apiVersion, kind, namespace, name, generation, spec}`
/// of a full custom resource.
pub fn resource(cr: &Value) -> Value {
    let meta = |k: &str| cr.pointer(&format!("/metadata/{k}")).cloned().unwrap_or(Value::Null);
    json!({
        "apiVersion": cr.get("apiVersion").cloned().unwrap_or(Value::Null),
        "kind": cr.get("kind").cloned().unwrap_or(Value::Null),
        "namespace": meta("namespace"),
        "name": meta("name"),
        "generation": meta("generation"),
        "spec": cr.get("spec").cloned().unwrap_or(Value::Null),
    })
}

/// One guardrails input `{plugin, resource, action:{verb, object}}`: `plugin` is
/// [`PlanAuthor::document`], `resource` the block of [`resource`].
pub fn guardrails(plugin: &Value, resource: &Value, action: &PlannedAction) -> Value {
    json!({
        "plugin": plugin,
        "resource": resource,
        "action": {"verb": action.verb, "object": action.object},
    })
}

/// The admission request's essentials (input of `stateward.admission`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    /// `CREATE`, `UPDATE`, `DELETE`, or `AUDIT` from the audit sweep.
    pub operation: String,
    /// The requesting user.
    pub user_info: UserInfo,
    /// The new object (`null` on DELETE).
    #[serde(default)]
    pub object: Value,
    /// The old object (`null` on CREATE).
    #[serde(default)]
    pub old_object: Value,
    /// Whether the request is a dry run.
    #[serde(default)]
    pub dry_run: bool,
}

/// The requesting user of an admission request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserInfo {
    /// User name.
    pub username: String,
    /// Groups, e.g. `stateward:admins`.
    #[serde(default)]
    pub groups: Vec<String>,
}

impl AdmissionRequest {
    /// The audit sweep's request for an existing resource: operation `AUDIT` by `user` (no
    /// groups), no old object, a dry run.
    pub fn audit(object: Value, user: &str) -> Self {
        Self {
            operation: "AUDIT".into(),
            user_info: UserInfo { username: user.into(), groups: Vec::new() },
            object,
            old_object: Value::Null,
            dry_run: true,
        }
    }

    /// The admission input `{operation, userInfo:{username, groups}, object, oldObject,
    /// dryRun}`, plus `fieldErrors:[{path, message}]` when the plugin's `validate` was asked
    /// (the webhook; the audit sweep asks no plugin).
    pub fn document(&self, field_errors: Option<&[FieldError]>) -> Value {
        let mut input = json!({
            "operation": self.operation,
            "userInfo": {"username": self.user_info.username, "groups": self.user_info.groups},
            "object": self.object,
            "oldObject": self.old_object,
            "dryRun": self.dry_run,
        });
        if let Some(errors) = field_errors {
            input["fieldErrors"] = json!(errors
                .iter()
                .map(|e| json!({"path": e.path, "message": e.message}))
                .collect::<Vec<_>>());
        }
        input
    }
}

/// A spec larger than this (its JSON) is kept in an admission record as its digest and size.
pub const RECORDED_SPEC_BYTES: usize = 16 * 1024;
/// An annotation or label value larger than this is kept as its digest and size
/// (`kubectl.kubernetes.io/last-applied-configuration` holds a whole object).
pub const RECORDED_VALUE_BYTES: usize = 1024;

/// What the audit keeps of an admission input: all of it but the objects, of which it keeps
/// what admission rules read (apiVersion, kind, metadata's name, namespace, uid, generation,
/// labels and annotations, and the spec) with the digest and size of the whole object. Status
/// and managed fields are left out, and large values are kept as their digest and size
/// ([`RECORDED_SPEC_BYTES`], [`RECORDED_VALUE_BYTES`]): a flood of reviews of large objects
/// writes small records.
pub fn admission_record(input: &Value) -> Value {
    let mut recorded = input.clone();
    for key in ["object", "oldObject"] {
        if let Some(object) = recorded.get_mut(key) {
            *object = object_record(object);
        }
    }
    recorded
}

fn digest_of(text: &str) -> Value {
    use sha2::Digest as _;
    json!({ "sha256": hex::encode(sha2::Sha256::digest(text.as_bytes())), "bytes": text.len() })
}

fn object_record(object: &Value) -> Value {
    if !object.is_object() {
        return object.clone();
    }
    let small = |v: &Value, limit: usize| {
        let text = v.to_string();
        if text.len() > limit {
            digest_of(&text)
        } else {
            v.clone()
        }
    };
    let values = |v: Option<&Value>| -> Value {
        let Some(map) = v.and_then(Value::as_object) else { return json!({}) };
        map.iter().map(|(k, v)| (k.clone(), small(v, RECORDED_VALUE_BYTES))).collect()
    };
    let meta = &object["metadata"];
    let mut recorded = json!({
        "apiVersion": object["apiVersion"],
        "kind": object["kind"],
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
            "generation": meta["generation"],
            "labels": values(meta.get("labels")),
            "annotations": values(meta.get("annotations")),
        },
        "whole": digest_of(&object.to_string()),
    });
    if let Some(spec) = object.get("spec") {
        recorded["spec"] = small(spec, RECORDED_SPEC_BYTES);
    }
    recorded
}

/// A plugin build about to load (input of `stateward.plugins`). A ConfigMap build is decided
/// twice: `before-compile`, on what the ConfigMap alone tells (name, digest, size, labels; no
/// version or kinds yet), so a build the policy refuses is never compiled or run; and `loaded`,
/// once `info()` has told its version and kinds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginLoad {
    /// Plugin name.
    pub name: String,
    /// Plugin version (empty before compilation).
    pub version: String,
    /// `sha256:<hex>` of the component.
    pub digest: String,
    /// Component size in bytes.
    pub size: u64,
    /// Kinds it declares (empty before compilation).
    pub kinds: Vec<KindRef>,
    /// Where the build comes from: [`PluginLoad::BUILTIN`] or [`PluginLoad::CONFIGMAP`].
    #[serde(default)]
    pub source: String,
    /// [`PluginLoad::BEFORE_COMPILE`] or [`PluginLoad::LOADED`].
    #[serde(default)]
    pub stage: String,
    /// The ConfigMap a hot-loaded build comes in.
    #[serde(default, rename = "configMap", skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapRef>,
}

/// The ConfigMap carrying a build: its name and labels.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigMapRef {
    pub name: String,
    pub labels: std::collections::BTreeMap<String, String>,
}

impl PluginLoad {
    /// A build from the plugin directory (the image).
    pub const BUILTIN: &'static str = "builtin";
    /// A build from a ConfigMap (hot reload).
    pub const CONFIGMAP: &'static str = "configmap";
    /// Decided on the ConfigMap alone, before anything is compiled.
    pub const BEFORE_COMPILE: &'static str = "before-compile";
    /// Decided on the loaded build, after `info()`.
    pub const LOADED: &'static str = "loaded";

    /// The `stateward.plugins` input for a loaded build from `source`; its kinds as
    /// `group/storageVersion`.
    pub fn of(plugin: &Plugin, source: &str) -> Self {
        Self {
            name: plugin.name().to_string(),
            version: plugin.version().to_string(),
            digest: plugin.prefixed_digest(),
            size: plugin.size() as u64,
            kinds: plugin
                .info()
                .kinds
                .iter()
                .map(|k| KindRef {
                    api_version: format!(
                        "{}/{}",
                        k.group,
                        k.storage_version().map_or("", |v| v.name.as_str())
                    ),
                    kind: k.kind.clone(),
                })
                .collect(),
            source: source.to_string(),
            stage: Self::LOADED.to_string(),
            config_map: None,
        }
    }

    /// The input for a ConfigMap build before it is compiled: `name` from its label, the
    /// digest and size of its bytes.
    pub fn before_compile(name: &str, digest: &str, size: usize, config_map: ConfigMapRef) -> Self {
        Self {
            name: name.to_string(),
            digest: digest.to_string(),
            size: size as u64,
            source: Self::CONFIGMAP.to_string(),
            stage: Self::BEFORE_COMPILE.to_string(),
            config_map: Some(config_map),
            ..Self::default()
        }
    }

    /// The plugins input `{name, version, digest, size, kinds:[{apiVersion, kind}], source,
    /// stage, configMap?}`.
    pub fn document(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

#[cfg(test)]
#[allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]
mod tests {
    //! Contract tests: the documents built above against what the policies read and what
    //! their tests feed them.
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::policy::{Bundle, PolicyEngine};

    fn policies() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies")
    }

    /// Where a document stops being the host's and becomes a Kubernetes object (whose fields
    /// are the cluster's, not this contract's).
    const OPAQUE: &[&[&str]] = &[&["object"], &["oldObject"], &["action", "object"], &["resource", "spec"]];

    fn opaque(path: &[String]) -> bool {
        OPAQUE.iter().any(|o| o.len() == path.len() && o.iter().zip(path).all(|(a, b)| a == b))
    }

    /// Every key path of `doc` down to the opaque members (arrays of objects look at their
    /// elements' keys, under the array's path).
    fn shape(doc: &Value) -> BTreeSet<Vec<String>> {
        fn walk(v: &Value, path: &mut Vec<String>, out: &mut BTreeSet<Vec<String>>) {
            if !path.is_empty() {
                out.insert(path.clone());
            }
            if opaque(path) {
                return;
            }
            match v {
                Value::Object(map) => {
                    for (k, v) in map {
                        path.push(k.clone());
                        walk(v, path, out);
                        path.pop();
                    }
                }
                Value::Array(items) => {
                    for item in items.iter().filter(|i| i.is_object()) {
                        if let Value::Object(map) = item {
                            for (k, v) in map {
                                path.push(k.clone());
                                walk(v, path, out);
                                path.pop();
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        let mut out = BTreeSet::new();
        walk(doc, &mut Vec::new(), &mut out);
        out
    }

    /// Every path the rego of `file` reads from `input`: `input.a.b` and
    /// `object.get(input, "a", …)` / `object.get(input, ["a", "b"], …)`. Indexing
    /// (`input.x[i]`) stops a path.
    fn read_paths(rego: &str) -> BTreeSet<Vec<String>> {
        let mut out = BTreeSet::new();
        for (i, _) in rego.match_indices("input.") {
            let before = rego[..i].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.') {
                continue;
            }
            let rest = &rego[i + "input.".len()..];
            let end =
                rest.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.')).unwrap_or(rest.len());
            let path: Vec<String> =
                rest[..end].split('.').filter(|s| !s.is_empty()).map(str::to_string).collect();
            if !path.is_empty() {
                out.insert(path);
            }
        }
        for (i, _) in rego.match_indices("object.get(input, ") {
            let rest = &rego[i + "object.get(input, ".len()..];
            let path: Vec<String> = if let Some(list) = rest.strip_prefix('[') {
                let list = &list[..list.find(']').expect("a closed path list")];
                list.split(',').map(|s| s.trim().trim_matches('"').to_string()).collect()
            } else {
                let quoted = rest.strip_prefix('"').expect("a quoted key");
                vec![quoted[..quoted.find('"').expect("a closed key")].to_string()]
            };
            out.insert(path);
        }
        out
    }

    /// Whether `path` is in a document of `shape`: every segment up to an opaque member.
    fn covered(shape: &BTreeSet<Vec<String>>, path: &[String]) -> bool {
        (1..=path.len()).all(|n| {
            let prefix = &path[..n];
            shape.contains(prefix) || (1..n).any(|m| opaque(&path[..m]))
        })
    }

    fn author() -> PlanAuthor {
        PlanAuthor {
            name: "postgres".into(),
            version: "0.1.0".into(),
            digest: format!("sha256:{}", "0".repeat(64)),
            owns: vec![KindRef { api_version: "apps/v1".into(), kind: "StatefulSet".into() }],
        }
    }

    fn cr() -> Value {
        json!({
            "apiVersion": "stateward.dev/v1alpha1", "kind": "PostgresCluster",
            "metadata": {"name": "main", "namespace": "db", "generation": 3, "uid": "u"},
            "spec": {"replicas": 3}, "status": {"phase": "Ready"},
        })
    }

    /// A guardrails document as the host builds it, for each verb.
    fn guardrails_documents() -> Vec<Value> {
        let plugin = author().document();
        let resource = resource(&cr());
        let actions = [
            PlannedAction {
                verb: "apply".into(),
                object: json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "main"}}),
            },
            PlannedAction {
                verb: "delete".into(),
                object: json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "old", "namespace": "db"}}),
            },
        ];
        actions.iter().map(|a| guardrails(&plugin, &resource, a)).collect()
    }

    fn admission_documents() -> Vec<Value> {
        let user = UserInfo { username: "bob".into(), groups: vec!["developers".into()] };
        let webhook = AdmissionRequest {
            operation: "UPDATE".into(),
            user_info: user,
            object: cr(),
            old_object: cr(),
            dry_run: false,
        };
        let errors = [FieldError { path: "spec.replicas".into(), message: "too many".into() }];
        vec![webhook.document(Some(&errors)), AdmissionRequest::audit(cr(), "system:sweep").document(None)]
    }

    fn plugins_documents() -> Vec<Value> {
        let load = PluginLoad {
            name: "postgres".into(),
            version: "0.1.0".into(),
            digest: format!("sha256:{}", "0".repeat(64)),
            size: 1000,
            kinds: vec![KindRef {
                api_version: "stateward.dev/v1alpha1".into(),
                kind: "PostgresCluster".into(),
            }],
            source: PluginLoad::CONFIGMAP.into(),
            stage: PluginLoad::LOADED.into(),
            config_map: None,
        };
        let labels = [("stateward.dev/plugin".to_string(), "postgres".to_string())].into();
        let before = PluginLoad::before_compile(
            "postgres",
            &load.digest,
            1000,
            ConfigMapRef { name: "stateward-plugin-postgres".into(), labels },
        );
        vec![load.document(), before.document()]
    }

    fn built(point: &str) -> Vec<Value> {
        match point {
            "guardrails" => guardrails_documents(),
            "admission" => admission_documents(),
            "plugins" => plugins_documents(),
            _ => panic!("no decision point {point}"),
        }
    }

    fn union(docs: &[Value]) -> BTreeSet<Vec<String>> {
        docs.iter().flat_map(shape).collect()
    }

    const POINTS: [&str; 3] = ["guardrails", "admission", "plugins"];

    #[test]
    fn every_field_the_policies_read_is_one_the_host_builds() {
        for point in POINTS {
            let rego = std::fs::read_to_string(policies().join(format!("{point}.rego"))).expect("rego");
            let reads = read_paths(&rego);
            assert!(!reads.is_empty(), "{point}.rego reads nothing from input?");
            let host = union(&built(point));
            let missing: Vec<_> = reads.iter().filter(|p| !covered(&host, p)).collect();
            assert!(missing.is_empty(), "{point}.rego reads input fields the host never sends: {missing:?}");
        }
    }

    #[test]
    fn the_corpus_inputs_have_the_shape_the_host_builds() {
        for point in POINTS {
            let text =
                std::fs::read_to_string(policies().join(format!("testdata/{point}.jsonl"))).expect("corpus");
            let host = union(&built(point));
            let mut corpus = BTreeSet::new();
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                let case: Value = serde_json::from_str(line).expect("a JSON line");
                let fields = shape(&case["input"]);
                let extra: Vec<_> = fields.difference(&host).collect();
                assert!(
                    extra.is_empty(),
                    "{point} case {}: fields the host never sends: {extra:?}",
                    case["name"]
                );
                corpus.extend(fields);
            }
            // fieldErrors is the webhook's addition; the shipped admission rules do not read it.
            let unexercised: Vec<_> = host
                .difference(&corpus)
                .filter(|p| p.first().map(String::as_str) != Some("fieldErrors"))
                .collect();
            assert!(unexercised.is_empty(), "{point}: host fields no corpus case carries: {unexercised:?}");
        }
    }

    /// The inputs the `*_test.rego` helpers build (`apply(o)`, `req(..)`, `load(..)`),
    /// evaluated from the shipped bundle, have exactly the host's members.
    #[test]
    fn the_rego_tests_build_the_inputs_the_host_builds() {
        let bundle = Bundle::from_dir(&policies()).expect("bundle");
        let engine = PolicyEngine::compile(&bundle).expect("compile");
        let cases = [
            (
                "guardrails",
                r#"data.stateward.guardrails_test.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}})"#,
            ),
            (
                "admission",
                "data.stateward.admission_test.req(\"UPDATE\", data.stateward.admission_test.dev, {}, {})",
            ),
            (
                "plugins",
                "data.stateward.plugins_test.load(\"postgres\", data.stateward.plugins_test.digest_a, 1000)",
            ),
        ];
        for (point, query) in cases {
            let doc = engine.query(query, &Value::Null).expect("the helper evaluates");
            assert!(doc.is_object(), "{point}: {query} gave {doc}");
            let host = union(&built(point));
            let fields = shape(&doc);
            let extra: Vec<_> = fields.difference(&host).collect();
            assert!(extra.is_empty(), "{point}: the rego tests feed fields the host never sends: {extra:?}");
            let top = |s: &BTreeSet<Vec<String>>| -> BTreeSet<String> {
                s.iter().filter(|p| p.len() == 1 && p[0] != "fieldErrors").map(|p| p[0].clone()).collect()
            };
            assert_eq!(top(&fields), top(&host), "{point}: top-level members");
        }
    }

    #[test]
    fn documents_carry_the_prefixed_digest_and_the_resource_block() {
        let doc = &guardrails_documents()[0];
        assert!(doc["plugin"]["digest"].as_str().is_some_and(|d| d.starts_with("sha256:")));
        assert_eq!(
            doc["resource"],
            json!({"apiVersion": "stateward.dev/v1alpha1", "kind": "PostgresCluster", "namespace": "db",
                   "name": "main", "generation": 3, "spec": {"replicas": 3}})
        );
        let audit = AdmissionRequest::audit(cr(), "u").document(None);
        assert_eq!(audit["operation"], "AUDIT");
        assert_eq!(audit["oldObject"], Value::Null);
        assert!(audit.get("fieldErrors").is_none());
        // The serde form (what `Gate::admit` and `Gate::plugin_load` serialise) is the document.
        let req = AdmissionRequest::audit(cr(), "u");
        assert_eq!(serde_json::to_value(&req).expect("serialise"), req.document(None));
        let load = plugins_documents().remove(0);
        let typed: PluginLoad = serde_json::from_value(load.clone()).expect("PluginLoad");
        assert_eq!(serde_json::to_value(&typed).expect("serialise"), load);
    }

    #[test]
    fn the_path_reader_finds_what_the_rego_reads() {
        let paths = read_paths(
            "x := input.action.object\ny := object.get(input, [\"userInfo\", \"username\"], \"\")\nz := object.get(input, \"name\", \"\")\nw := my_input.a",
        );
        let want: BTreeSet<Vec<String>> = [
            vec!["action".to_string(), "object".to_string()],
            vec!["userInfo".to_string(), "username".to_string()],
            vec!["name".to_string()],
        ]
        .into_iter()
        .collect();
        assert_eq!(paths, want);
    }
}
