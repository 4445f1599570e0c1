//! One reconcile against a mocked API server: the real postgres plugin (built as a component),
//! a real policy gate and fixed child caches, with kube's tower-test mock in place of the
//! cluster. Each test asserts exactly which requests the reconcile sends, which the tests
//! against the live cluster can only see indirectly; they need no cluster and run in seconds.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex, OnceLock};

use http::{Method, Request, Response};
use http_body_util::BodyExt as _;
use kube::client::Body;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use kube::Client;
use serde_json::{json, Value};
use stateward_testkit::components::{wasm, wasm_cache_dir, workspace_root};

use super::{backoff, claims, reconcile, sweep, Applier, Context, Error, KindBinding, FINALIZER};
use crate::leader::Leadership;
use crate::policy::{AuditLog, AuditSink, Bundle, BundleFile, FsyncPolicy, Gate, LiveGate, PolicyEngine};
use crate::runtime::{AllocatorKind, Limits, LiveRegistry, Plugin, Registry, Sandbox};
use crate::telemetry::{events, Metrics};

const NAMESPACE: &str = "ns";
const CR_PATH: &str = "/apis/stateward.dev/v1/namespaces/ns/postgresclusters/db";
const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/ns/events";

/// One request the reconcile sent.
#[derive(Debug, Clone)]
struct Call {
    method: Method,
    /// Path and query.
    path: String,
    body: Value,
}

impl Call {
    fn is(&self, method: &Method, path: &str) -> bool {
        self.method == method && self.path.split('?').next() == Some(path)
    }

    /// A write to anything but the custom resource and its Events: a child.
    fn writes_a_child(&self) -> bool {
        self.method != Method::GET && !self.path.starts_with(CR_PATH) && !self.path.starts_with(EVENTS_PATH)
    }
}

/// The API server's answer to one request: a status code and a JSON body; code 0 never
/// answers (a request still running).
type Answer = Box<dyn Fn(&Call) -> (u16, Value) + Send + Sync>;

/// The postgres plugin, built and loaded once per test process.
fn postgres() -> (Arc<Sandbox>, Arc<Plugin>) {
    static LOADED: OnceLock<(Arc<Sandbox>, Arc<Plugin>)> = OnceLock::new();
    let (sandbox, plugin) = LOADED.get_or_init(|| {
        let sandbox =
            Sandbox::new(Limits::default(), AllocatorKind::Auto, Some(wasm_cache_dir())).expect("sandbox");
        let plugin = Plugin::load_file(&sandbox, &wasm("stateward-postgres")).expect("plugin loads");
        (sandbox, Arc::new(plugin))
    });
    (Arc::clone(sandbox), Arc::clone(plugin))
}

/// The shipped policies plus `extra` guardrails, auditing to a file of its own.
fn gate(test: &str, extra: Option<&str>) -> Gate {
    gate_with(test, extra, |_| {})
}

/// Where the gate of `test` audits.
fn audit_path(test: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("stateward-unit-{}-{test}.jsonl", std::process::id()))
}

/// The audit records of `test`'s gate.
fn audit_records(test: &str) -> Vec<Value> {
    std::fs::read_to_string(audit_path(test))
        .expect("audit log")
        .lines()
        .map(|l| serde_json::from_str(l).expect("an audit line is JSON"))
        .collect()
}

/// [`gate`] with the policy data changed by `data`.
fn gate_with(test: &str, extra: Option<&str>, data: impl FnOnce(&mut Value)) -> Gate {
    let mut files = Bundle::from_dir(&workspace_root().join("policies")).expect("bundle").files().to_vec();
    if let Some(rego) = extra {
        files.push(BundleFile { name: "unit_test.rego".into(), contents: rego.into() });
    }
    let file = files.iter_mut().find(|f| f.name == "data.json").expect("policies/data.json");
    let mut value: Value = serde_json::from_str(&file.contents).expect("data.json");
    data(&mut value);
    file.contents = value.to_string();
    let engine = PolicyEngine::compile(&Bundle::from_files(files).expect("bundle")).expect("compile");
    let log = audit_path(test);
    let _ = std::fs::remove_file(&log);
    let audit = AuditLog::open(&AuditSink::File(log), FsyncPolicy::OsBuffered).expect("audit");
    Gate::new(Arc::new(engine), Arc::new(audit))
}

fn postgres_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("stateward.dev", "v1", "PostgresCluster"),
        "postgresclusters",
    )
}

/// A PostgresCluster `db` that already carries the finalizer (so the reconcile goes straight
/// to the plugin).
fn cluster(retention: &str) -> Value {
    json!({
        "apiVersion": "stateward.dev/v1",
        "kind": "PostgresCluster",
        "metadata": {
            "name": "db", "namespace": NAMESPACE, "uid": "uid-db", "generation": 1,
            "creationTimestamp": "2026-01-01T00:00:00Z", "finalizers": [FINALIZER],
        },
        "spec": {
            "version": "17.2", "replicas": 1, "storage": {"size": "1Gi"}, "retentionPolicy": retention,
            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "250m", "memory": "128Mi"}},
        }
    })
}

/// The same cluster being deleted.
fn deleted(retention: &str) -> Value {
    let mut cr = cluster(retention);
    cr["metadata"]["deletionTimestamp"] = json!("2026-01-02T00:00:00Z");
    cr
}

/// A StatefulSet child of `db`, as the child cache holds it.
fn statefulset() -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {
            "name": "db", "namespace": NAMESPACE, "uid": "uid-sts",
            "labels": {(crate::children::INSTANCE_LABEL): "db"},
            "ownerReferences": [{"apiVersion": "stateward.dev/v1", "kind": "PostgresCluster", "name": "db", "uid": "uid-db", "controller": true}],
        },
    })
}

/// What a healthy API server answers: discovery of the child kinds, no existing object of a
/// child's name, and writes echoed back (the custom resource for its own patches).
fn healthy(cr: Value) -> Answer {
    Box::new(move |call| {
        let resources = |group_version: &str, list: &[(&str, &str)]| {
            let resources: Vec<Value> = list
                .iter()
                .map(|(name, kind)| json!({"name": name, "singularName": "", "namespaced": true, "kind": kind, "verbs": ["get", "list", "watch", "create", "patch", "delete"]}))
                .collect();
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources})
        };
        match (&call.method, call.path.as_str()) {
            (&Method::GET, "/apis/apps/v1") => {
                (200, resources("apps/v1", &[("statefulsets", "StatefulSet")]))
            }
            (&Method::GET, "/apis/policy/v1") => {
                (200, resources("policy/v1", &[("poddisruptionbudgets", "PodDisruptionBudget")]))
            }
            (&Method::GET, "/api/v1") => (
                200,
                resources(
                    "v1",
                    &[
                        ("services", "Service"),
                        ("configmaps", "ConfigMap"),
                        ("secrets", "Secret"),
                        ("persistentvolumeclaims", "PersistentVolumeClaim"),
                    ],
                ),
            ),
            (&Method::GET, _) => (
                200,
                json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList", "metadata": {}, "items": []}),
            ),
            (&Method::DELETE, _) => (200, json!({"apiVersion": "v1", "kind": "Status", "status": "Success"})),
            (_, path) if path.starts_with(CR_PATH) => (200, cr.clone()),
            _ => (200, call.body.clone()),
        }
    })
}

/// An API server that refuses writes to children with `code`, and otherwise is healthy.
fn refusing_children(cr: Value, code: u16) -> Answer {
    let healthy = healthy(cr);
    Box::new(move |call| {
        if call.writes_a_child() {
            let reason = if code == 422 { "Invalid" } else { "InternalError" };
            let status = json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "message": "refused by the test", "reason": reason, "code": code});
            return (code, status);
        }
        healthy(call)
    })
}

/// A kube client whose every request is recorded and answered by `answer`.
fn mock_client(answer: Answer) -> (Client, Arc<Mutex<Vec<Call>>>) {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    tokio::spawn(async move {
        let mut running = Vec::new();
        while let Some((request, respond)) = handle.next_request().await {
            let (parts, body) = request.into_parts();
            let bytes = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
            let call = Call {
                method: parts.method,
                path: parts.uri.path_and_query().map(ToString::to_string).unwrap_or_default(),
                body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            };
            let (code, reply) = answer(&call);
            log.lock().unwrap().push(call);
            if code == 0 {
                running.push(respond);
                continue;
            }
            let response = Response::builder()
                .status(code)
                .header("content-type", "application/json")
                .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                .unwrap();
            respond.send_response(response);
        }
    });
    (Client::new(service, "default"), seen)
}

/// A reconcile's world: the context, the requests it sent, and what keeps it leading.
struct World {
    ctx: Arc<Context>,
    seen: Arc<Mutex<Vec<Call>>>,
    _leading: tokio::sync::watch::Sender<bool>,
}

impl World {
    fn new(test: &str, answer: Answer, gate: Gate, children: &[Value], claims: claims::NameClaims) -> Self {
        let (sandbox, plugin) = postgres();
        Self::serving(
            test,
            answer,
            gate,
            children,
            claims,
            (sandbox, plugin),
            postgres_resource(),
            Arc::new(|_| {}),
        )
    }

    /// A world in which `plugin` serves the kind of `api_resource`; `outcomes` sees every
    /// answer to a request, sent or not.
    #[allow(clippy::too_many_arguments)]
    fn serving(
        test: &str,
        answer: Answer,
        gate: Gate,
        children: &[Value],
        claims: claims::NameClaims,
        (sandbox, plugin): (Arc<Sandbox>, Arc<Plugin>),
        api_resource: ApiResource,
        outcomes: crate::requests::Outcomes,
    ) -> Self {
        let (client, seen) = mock_client(answer);
        let mut registry = Registry::default();
        registry.insert(Arc::clone(&plugin));
        let (leadership, leading) = Leadership::fixed(true);
        let kind = KindBinding {
            group: api_resource.group.clone(),
            kind: api_resource.kind.clone(),
            api_resource: api_resource.clone(),
            started_with: plugin,
        };
        let ctx = Context {
            client: client.clone(),
            kind: Arc::new(kind),
            children: crate::children::Children::fixed(children),
            sandbox,
            registry: Arc::new(LiveRegistry::new(registry)),
            gate: Arc::new(LiveGate::new(gate)),
            metrics: Metrics::new(),
            events: events::Events::new(client.clone(), &format!("unit-{test}"), api_resource),
            findings: sweep::Findings::default(),
            claims,
            applier: Arc::new(Applier::new(client.clone())),
            backoff: backoff::Backoff::default(),
            leadership,
            requests: crate::requests::Requests::new(client, Default::default(), outcomes),
            written: Default::default(),
            issues_certificates: false,
        };
        Self { ctx: Arc::new(ctx), seen, _leading: leading }
    }

    async fn reconcile(&self, cr: &Value) -> Result<kube::runtime::controller::Action, Error> {
        let obj: DynamicObject = serde_json::from_value(cr.clone()).expect("a custom resource");
        reconcile::reconcile(Arc::new(obj), Arc::clone(&self.ctx)).await
    }

    fn calls(&self) -> Vec<Call> {
        self.seen.lock().unwrap().clone()
    }
}

fn shown(calls: &[Call]) -> Vec<String> {
    calls.iter().map(|c| format!("{} {}", c.method, c.path)).collect()
}

/// The Degraded condition of a status patch.
fn degraded_reason(call: &Call) -> Option<&str> {
    let conditions = call.body.pointer("/status/conditions")?.as_array()?;
    let degraded = conditions.iter().find(|c| c["type"] == "Degraded" && c["status"] == "True")?;
    degraded["reason"].as_str()
}

fn event_reasons(calls: &[Call]) -> Vec<&str> {
    calls
        .iter()
        .filter(|c| c.is(&Method::POST, EVENTS_PATH))
        .filter_map(|c| c.body["reason"].as_str())
        .collect()
}

/// Asserts the reconcile wrote only a Degraded status with `reason` and Events (one of them
/// with that reason).
fn assert_only_degraded(calls: &[Call], reason: &str) {
    let status: Vec<&Call> =
        calls.iter().filter(|c| c.is(&Method::PATCH, &format!("{CR_PATH}/status"))).collect();
    assert_eq!(status.len(), 1, "one status write: {:?}", shown(calls));
    assert_eq!(degraded_reason(status[0]), Some(reason), "{}", status[0].body);
    assert!(event_reasons(calls).contains(&reason), "a {reason} Event: {:?}", shown(calls));
    let other: Vec<String> = calls
        .iter()
        .filter(|c| !c.is(&Method::PATCH, &format!("{CR_PATH}/status")) && !c.is(&Method::POST, EVENTS_PATH))
        .map(|c| format!("{} {}", c.method, c.path))
        .collect();
    assert!(other.is_empty(), "nothing else is sent: {other:?}");
}

const DENY_STATEFULSETS: &str = r#"package stateward.guardrails

deny contains "unit-deny: no StatefulSets here" if {
	input.action.verb == "apply"
	input.action.object.kind == "StatefulSet"
}
"#;

#[tokio::test]
async fn a_policy_deny_applies_nothing() {
    let cr = cluster("Retain");
    let world = World::new(
        "deny",
        healthy(cr.clone()),
        gate("deny", Some(DENY_STATEFULSETS)),
        &[],
        claims::NameClaims::default(),
    );
    let err = world.reconcile(&cr).await.expect_err("the plan is denied");
    assert!(matches!(err, Error::PolicyDenied(ref m) if m.contains("unit-deny")), "{err}");
    let calls = world.calls();
    // One denied action stops the whole plan: not even the allowed Service or ConfigMap is
    // applied, and no child kind is even discovered.
    assert_only_degraded(&calls, "PolicyDenied");
}

#[tokio::test]
async fn an_allowed_plan_is_applied() {
    // The other side of the deny test: the same resource under the shipped policies writes
    // its children (so the deny test's silence is the policy's doing).
    let cr = cluster("Retain");
    let world =
        World::new("allow", healthy(cr.clone()), gate("allow", None), &[], claims::NameClaims::default());
    world.reconcile(&cr).await.expect("the reconcile succeeds");
    let calls = world.calls();
    let applied: Vec<&Call> =
        calls.iter().filter(|c| c.method == Method::PATCH && c.path.contains("fieldManager=")).collect();
    for path in [
        "/apis/apps/v1/namespaces/ns/statefulsets/db",
        "/api/v1/namespaces/ns/services/",
        "/api/v1/namespaces/ns/configmaps/",
    ] {
        assert!(applied.iter().any(|c| c.path.starts_with(path)), "no apply of {path}: {:?}", shown(&calls));
    }
    for call in &applied {
        assert!(call.path.contains("force=true"), "server-side apply is forced: {}", call.path);
        assert_eq!(call.body["metadata"]["ownerReferences"][0]["uid"], "uid-db", "{}", call.path);
    }
    assert!(
        calls.iter().any(|c| c.is(&Method::POST, "/api/v1/namespaces/ns/secrets")),
        "the credentials are created: {:?}",
        shown(&calls)
    );
    assert!(!calls.iter().any(|c| degraded_reason(c).is_some()), "not degraded: {:?}", shown(&calls));
}

/// Name claims in which a RedisCluster `db` (one that has acted) holds the name.
fn redis_holds_db() -> claims::NameClaims {
    let redis = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("stateward.dev", "v1", "RedisCluster"),
        "redisclusters",
    );
    let holder: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "stateward.dev/v1", "kind": "RedisCluster",
        "metadata": {"name": "db", "namespace": NAMESPACE, "uid": "uid-redis", "finalizers": [FINALIZER],
                     "creationTimestamp": "2025-01-01T00:00:00Z"},
    }))
    .expect("a RedisCluster");
    let mut writer = Writer::new(redis.clone());
    for event in [watcher::Event::Init, watcher::Event::InitApply(holder), watcher::Event::InitDone] {
        writer.apply_watcher_event(&event);
    }
    let claims = claims::NameClaims::default();
    claims.add("RedisCluster", redis, writer.as_reader());
    claims
}

#[tokio::test]
async fn a_name_conflict_writes_nothing_but_its_status() {
    let cr = cluster("Delete");
    let world = World::new(
        "conflict",
        healthy(cr.clone()),
        gate("conflict", None),
        &[statefulset()],
        redis_holds_db(),
    );
    let err = world.reconcile(&cr).await.expect_err("the name is taken");
    assert!(matches!(err, Error::NameConflict(ref h) if h.kind == "RedisCluster"), "{err}");
    assert_only_degraded(&world.calls(), "NameConflict");
}

#[tokio::test]
async fn a_deleted_name_conflict_drops_its_finalizer_without_cleanup() {
    // retentionPolicy Delete and a StatefulSet of the name in the cache: the cleanup would
    // delete it, but it is the holder's.
    let cr = deleted("Delete");
    let world = World::new(
        "conflict-deleted",
        healthy(cr.clone()),
        gate("conflict-deleted", None),
        &[statefulset()],
        redis_holds_db(),
    );
    world.reconcile(&cr).await.expect("the finalizer is removed");
    let calls = world.calls();
    assert!(!calls.iter().any(Call::writes_a_child), "no cleanup: {:?}", shown(&calls));
    let patches: Vec<&Call> = calls.iter().filter(|c| c.is(&Method::PATCH, CR_PATH)).collect();
    assert_eq!(patches.len(), 1, "{:?}", shown(&calls));
    assert_eq!(patches[0].body[1], json!({"op": "remove", "path": "/metadata/finalizers/0"}));
    assert_eq!(event_reasons(&calls), ["NameConflict"]);
}

/// Whether `calls` removed the finalizer (a JSON patch of the resource itself).
fn removed_finalizer(calls: &[Call]) -> bool {
    calls
        .iter()
        .filter(|c| c.is(&Method::PATCH, CR_PATH))
        .any(|c| c.body.as_array().is_some_and(|ops| ops.iter().any(|op| op["op"] == "remove")))
}

#[tokio::test]
async fn finalize_keeps_the_finalizer_until_the_plugin_is_done() {
    // retentionPolicy Delete with the StatefulSet still there: the plugin deletes it and is
    // not done, so the finalizer stays and the resource is looked at again soon.
    let cr = deleted("Delete");
    let world = World::new(
        "finalize",
        healthy(cr.clone()),
        gate("finalize", None),
        &[statefulset()],
        claims::NameClaims::default(),
    );
    let requeue = world.reconcile(&cr).await.expect("cleanup runs");
    assert_eq!(requeue, kube::runtime::controller::Action::requeue(std::time::Duration::from_secs(2)));
    let calls = world.calls();
    assert!(
        calls.iter().any(|c| c.is(&Method::DELETE, "/apis/apps/v1/namespaces/ns/statefulsets/db")),
        "the StatefulSet is deleted: {:?}",
        shown(&calls)
    );
    assert!(!removed_finalizer(&calls), "the finalizer stays: {:?}", shown(&calls));
    assert!(event_reasons(&calls).contains(&"Finalizing"), "{:?}", event_reasons(&calls));

    // Once nothing is left, the plugin is done and the finalizer goes.
    let world = World::new(
        "finalize-done",
        healthy(cr.clone()),
        gate("finalize-done", None),
        &[],
        claims::NameClaims::default(),
    );
    let requeue = world.reconcile(&cr).await.expect("cleanup is done");
    assert_eq!(requeue, kube::runtime::controller::Action::await_change());
    let calls = world.calls();
    assert!(removed_finalizer(&calls), "the finalizer is removed: {:?}", shown(&calls));
    assert!(!calls.iter().any(Call::writes_a_child), "nothing left to delete: {:?}", shown(&calls));
}

#[tokio::test]
async fn an_api_refusal_degrades_and_a_server_error_is_only_retried() {
    let cr = cluster("Retain");
    // 422: the API server refuses the object as such; retrying cannot help, so the user is told.
    let world = World::new(
        "refused",
        refusing_children(cr.clone(), 422),
        gate("refused", None),
        &[],
        claims::NameClaims::default(),
    );
    let err = world.reconcile(&cr).await.expect_err("the apply is refused");
    assert_eq!(err.label(), "api_error", "{err}");
    assert!(err.to_string().contains("refused by the test (422 Invalid)"), "{err}");
    let calls = world.calls();
    let writes: Vec<&Call> = calls.iter().filter(|c| c.writes_a_child()).collect();
    assert_eq!(writes.len(), 1, "the plan stops at the first refusal: {:?}", shown(&calls));
    let status: Vec<&Call> =
        calls.iter().filter(|c| c.is(&Method::PATCH, &format!("{CR_PATH}/status"))).collect();
    assert_eq!(status.len(), 1, "{:?}", shown(&calls));
    assert_eq!(degraded_reason(status[0]), Some("ApiError"), "{}", status[0].body);
    assert_eq!(event_reasons(&calls), ["ApiError"]);

    // 500: transient; the controller retries with backoff and the status is left alone.
    let world = World::new(
        "failing",
        refusing_children(cr.clone(), 500),
        gate("failing", None),
        &[],
        claims::NameClaims::default(),
    );
    let err = world.reconcile(&cr).await.expect_err("the apply fails");
    assert_eq!(err.label(), "api_error", "{err}");
    let calls = world.calls();
    assert_eq!(calls.iter().filter(|c| c.writes_a_child()).count(), 1, "{:?}", shown(&calls));
    assert!(
        !calls.iter().any(|c| c.path.starts_with(CR_PATH) || c.path.starts_with(EVENTS_PATH)),
        "no status, no Event: {:?}",
        shown(&calls)
    );
}

/// The hostile fixture (its `spec.mode` picks what it asks), built and loaded once.
fn hostile() -> (Arc<Sandbox>, Arc<Plugin>) {
    static LOADED: OnceLock<(Arc<Sandbox>, Arc<Plugin>)> = OnceLock::new();
    let (sandbox, plugin) = LOADED.get_or_init(|| {
        let (sandbox, _) = postgres();
        let plugin = Plugin::load_file(&sandbox, &wasm("fixture-hostile")).expect("fixture loads");
        (sandbox, Arc::new(plugin))
    });
    (Arc::clone(sandbox), Arc::clone(plugin))
}

const HOSTILE_PATH: &str = "/apis/test.stateward.dev/v1/namespaces/ns/hostilethings/h";

fn hostile_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("test.stateward.dev", "v1", "HostileThing"),
        "hostilethings",
    )
}

fn hostile_cr(mode: &str) -> Value {
    json!({
        "apiVersion": "test.stateward.dev/v1", "kind": "HostileThing",
        "metadata": {"name": "h", "namespace": NAMESPACE, "uid": "uid-h", "generation": 1,
                     "creationTimestamp": "2026-01-01T00:00:00Z", "finalizers": [FINALIZER]},
        "spec": {"mode": mode},
    })
}

/// The hostile plugin's own pod h-0, running, with a port.
fn hostile_pod() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "h-0", "namespace": NAMESPACE, "labels": {(crate::children::INSTANCE_LABEL): "h"}},
        "spec": {"containers": [{"name": "main", "ports": [{"containerPort": 8080}]}]},
        "status": {"podIP": "10.0.0.9", "containerStatuses": [{"name": "main", "state": {"running": {}}}]},
    })
}

/// A gate that lets the hostile plugin load and run `psql` in its pods.
fn hostile_gate(test: &str) -> Gate {
    gate_with(test, None, |data| {
        data["stateward"]["config"]["plugins"]["allowed"]["hostile"] = json!({"digests": []});
        data["stateward"]["config"]["guardrails"]["exec_commands"]["hostile"] = json!(["psql"]);
    })
}

/// The sandbox tests extended to requests, at the controller: a plugin asking to exec into a
/// pod of another instance, to run a command its policy data does not list, to send http to
/// another instance's Service, 10,000 requests in one plan, or 10 MB of stdin. Each plan is
/// refused whole with a clear reason (by the guardrails, or by the host before them), audited
/// in one record, and nothing is sent: no exec through the API server, no answer of any
/// request, no child written; only the Degraded status and its Event.
#[tokio::test]
async fn requests_a_plugin_may_not_make_are_refused_audited_and_never_sent() {
    let resource = hostile_resource();
    // Its own pod, running, with a port; `psql` is listed for it, so that the flood and the
    // big stdin (exec `psql` in that pod) would pass the guardrails: the host refuses them.
    let own_pod = hostile_pod();
    for (mode, reason, message) in [
        ("exec-foreign", "PolicyDenied", "foreign-target: exec to Pod someone-else-0"),
        ("exec-unlisted", "PolicyDenied", "exec-command-not-allowed: plugin hostile may not run sh"),
        ("http-foreign", "PolicyDenied", "foreign-target: http to Service someone-else"),
        (
            "requests-flood",
            "RequestsRefused",
            "the plan has 10000 requests; at most 32 are allowed in one plan",
        ),
        (
            "stdin-10mb",
            "RequestsRefused",
            "request x: 10485760 bytes of input (stdin or body); at most 65536 are allowed",
        ),
    ] {
        let test = format!("hostile-{mode}");
        let cr = hostile_cr(mode);
        let gate = hostile_gate(&test);
        let answered = Arc::new(Mutex::new(Vec::<String>::new()));
        let seen = Arc::clone(&answered);
        let outcomes: crate::requests::Outcomes = Arc::new(move |o: &crate::requests::Outcome<'_>| {
            seen.lock().unwrap().push(o.response.id.clone())
        });
        let world = World::serving(
            &test,
            healthy(cr.clone()),
            gate,
            std::slice::from_ref(&own_pod),
            claims::NameClaims::default(),
            hostile(),
            resource.clone(),
            outcomes,
        );
        let err = world.reconcile(&cr).await.expect_err("refused");
        assert_eq!(err.reason(), reason, "{mode}: {err}");
        assert!(err.to_string().contains(message), "{mode}: {err}");

        // Nothing sent: only the Degraded status and its Event went to the API server.
        let calls = world.calls();
        let status: Vec<&Call> =
            calls.iter().filter(|c| c.is(&Method::PATCH, &format!("{HOSTILE_PATH}/status"))).collect();
        assert_eq!(status.len(), 1, "{mode}: one status write: {:?}", shown(&calls));
        assert_eq!(degraded_reason(status[0]), Some(reason), "{mode}: {}", status[0].body);
        let message_in_status =
            status[0].body.pointer("/status/conditions").and_then(Value::as_array).is_some_and(|cs| {
                cs.iter().any(|c| {
                    c["type"] == "Degraded" && c["message"].as_str().is_some_and(|m| m.contains(message))
                })
            });
        assert!(message_in_status, "{mode}: the reason is in status: {}", status[0].body);
        assert_eq!(event_reasons(&calls), [reason], "{mode}: {:?}", shown(&calls));
        let other: Vec<String> = calls
            .iter()
            .filter(|c| {
                !c.is(&Method::PATCH, &format!("{HOSTILE_PATH}/status")) && !c.is(&Method::POST, EVENTS_PATH)
            })
            .map(|c| format!("{} {}", c.method, c.path))
            .collect();
        assert!(other.is_empty(), "{mode}: nothing else is sent (no exec): {other:?}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(
            answered.lock().unwrap().is_empty(),
            "{mode}: no request answered: {:?}",
            answered.lock().unwrap()
        );

        // Audited: one denied record naming the reason.
        let denied: Vec<Value> = audit_records(&test)
            .into_iter()
            .filter(|r| r["result"]["enforced"]["allowed"] == false)
            .collect();
        assert_eq!(denied.len(), 1, "{mode}: one audited refusal: {denied:?}");
        let messages = denied[0]["result"]["enforced"]["denied"].to_string();
        assert!(messages.contains(message), "{mode}: {messages}");
        assert_eq!(denied[0]["requested_by"], "plugin/hostile", "{mode}: {}", denied[0]);
        if reason == "RequestsRefused" {
            assert_eq!(denied[0]["result"]["refusedBy"], "host", "{mode}: {}", denied[0]);
            assert_eq!(denied[0]["input"]["resource"]["name"], "h", "{mode}: {}", denied[0]);
            assert!(messages.contains("host-refused: "), "{mode}: {messages}");
        }
        let _ = std::fs::remove_file(audit_path(&test));
    }
}

/// An API server that keeps what status patches of the resource at `path` write (each a new
/// resourceVersion) in `stored` and answers them with the stored resource, refuses a patch
/// naming another resourceVersion than the stored one (409, as the API server does), and is
/// otherwise healthy.
fn storing_status(cr: Value, path: &'static str, stored: Arc<Mutex<Value>>) -> Answer {
    *stored.lock().unwrap() = cr.clone();
    let healthy = healthy(cr);
    Box::new(move |call| {
        if call.path.contains("/exec?") {
            // A command still running: no answer changes the status between reconciles.
            return (0, Value::Null);
        }
        if call.is(&Method::PATCH, &format!("{path}/status")) {
            let mut cr = stored.lock().unwrap();
            let precondition = call.body.pointer("/metadata/resourceVersion");
            if precondition.is_some_and(|v| Some(v) != cr.pointer("/metadata/resourceVersion")) {
                let conflict = json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "message": "the object has been modified", "reason": "Conflict", "code": 409});
                return (409, conflict);
            }
            json_patch::merge(&mut cr, &call.body);
            let version: u64 = cr["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap();
            cr["metadata"]["resourceVersion"] = json!((version + 1).to_string());
            return (200, cr.clone());
        }
        healthy(call)
    })
}

/// A reconcile that starts before the cache has the previous status write (the watch delivers
/// it after the API server's answer) reads the status as written, so it does not write again:
/// it used to see every condition as new and write only to move `lastTransitionTime`s, one
/// extra write per change of a resource (the scale benchmark counts them).
#[tokio::test]
async fn a_reconcile_on_a_cache_behind_its_own_status_write_does_not_write_again() {
    let mut cr = cluster("Retain");
    cr["metadata"]["resourceVersion"] = json!("7");
    let world = World::new(
        "stale-cache",
        storing_status(cr.clone(), CR_PATH, Arc::default()),
        gate("stale-cache", None),
        &[],
        claims::NameClaims::default(),
    );
    let status_path = format!("{CR_PATH}/status");
    let status_writes = |calls: &[Call]| calls.iter().filter(|c| c.is(&Method::PATCH, &status_path)).count();
    world.reconcile(&cr).await.expect("the first reconcile succeeds");
    assert_eq!(status_writes(&world.calls()), 1, "{:?}", shown(&world.calls()));
    // The cache still holds version 7, without the status.
    world.reconcile(&cr).await.expect("the second reconcile succeeds");
    assert_eq!(
        status_writes(&world.calls()),
        1,
        "written again over a stale read: {:?}",
        shown(&world.calls())
    );
}

/// Each one-shot request is recorded in status before it is sent, with the version it was
/// decided on as the precondition. Two in one plan: the second is recorded over the version the
/// first was stored at. A reconcile on a cache behind this replica's own status write: over the
/// version that write was stored at. Both used to name the version read from the cache, got a
/// 409, and the request waited for a later reconcile (CI: a switchover's promotion delayed
/// until the cache caught up, its write gap over the bound).
#[tokio::test]
async fn one_shot_requests_are_recorded_over_the_newest_version_even_from_a_stale_cache() {
    let mut cr = hostile_cr("once-rounds");
    cr["metadata"]["resourceVersion"] = json!("7");
    let stored = Arc::new(Mutex::new(Value::Null));
    let world = World::serving(
        "once-rounds",
        storing_status(cr.clone(), HOSTILE_PATH, Arc::clone(&stored)),
        hostile_gate("once-rounds"),
        &[hostile_pod()],
        claims::NameClaims::default(),
        hostile(),
        hostile_resource(),
        Arc::new(|_| {}),
    );
    world.reconcile(&cr).await.expect("round 0");
    // The cache still holds version 7: no records, no rounds.
    world.reconcile(&cr).await.expect("round 1");
    let stored = stored.lock().unwrap().clone();
    let mut recorded: Vec<&String> = stored
        .pointer("/status/requests")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(id, _)| id)
        .collect();
    recorded.sort();
    assert_eq!(recorded, ["r0-a", "r0-b", "r1-a", "r1-b"], "{}", stored["status"]);
    assert_eq!(stored.pointer("/status/onceRound"), Some(&json!(2)), "{}", stored["status"]);
    let _ = std::fs::remove_file(audit_path("once-rounds"));
}
