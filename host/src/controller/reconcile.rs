//! One reconcile, in one readable place: observe → plugin → policy → apply → status.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams};
use kube::core::DynamicObject;
use kube::runtime::controller::Action as Requeue;
use kube::{Api, ResourceExt};
use serde_json::{json, Value};
use tracing::Instrument;

use super::dispatch::{self, Scene};
use super::status::{self, PluginStamp};
use super::{Context, Error, FINALIZER};
use crate::plugin_call;
use crate::requests::Owner;
use crate::runtime::{Action, EventType, Observed, Plugin, StatusReport};

/// How long a converged resource waits before it is looked at again without any event.
const RESYNC: Duration = Duration::from_secs(600);

#[tracing::instrument(skip_all, fields(kind = %ctx.kind.kind, namespace = obj.namespace().unwrap_or_default(), name = %obj.name_any(), generation = obj.metadata.generation.unwrap_or_default(), result = tracing::field::Empty, otel.status_code = tracing::field::Empty))]
pub async fn reconcile(obj: Arc<DynamicObject>, ctx: Arc<Context>) -> Result<Requeue, Error> {
    let started = Instant::now();
    let result = run(&obj, &ctx).await;
    let label = match &result {
        Ok(_) => "success",
        Err(e) => e.label(),
    };
    let span = tracing::Span::current();
    span.record("result", label);
    if result.is_err() {
        span.record("otel.status_code", "ERROR");
    }
    ctx.metrics.reconcile(&ctx.kind.kind, label, started.elapsed().as_secs_f64());
    if result.is_ok() {
        ctx.backoff.reset(&obj);
    }
    result
}

async fn run(obj: &DynamicObject, ctx: &Context) -> Result<Requeue, Error> {
    if !ctx.leadership.is_leader() {
        return Err(Error::NotLeader);
    }
    let mut resource =
        serde_json::to_value(obj).map_err(|e| Error::Resource(obj.name_any(), e.to_string()))?;
    ctx.written.freshest(&uid(obj), &version(obj), &mut resource);
    let namespace = obj.namespace().unwrap_or_default();
    let name = obj.name_any();
    let plugin = ctx.plugin();

    if let Some(holder) = ctx.claims.holder(obj, &ctx.kind.kind).await? {
        return refuse_name_conflict(obj, ctx, &resource, holder).await;
    }
    let mut children = tracing::info_span!("observe").in_scope(|| ctx.children.observe(&namespace, &name));
    // A child controlled by another object (an earlier resource of this name that the garbage
    // collector has not reached yet) is not this resource's to change or delete.
    children.retain(|child| !controlled_by_other(child, &ctx.kind.kind, obj.metadata.uid.as_deref()));
    let child_text = plugin_children(&children, ctx.issues_certificates);
    let resource_text = resource.to_string();
    let now_ms = now_ms();

    if obj.metadata.deletion_timestamp.is_some() {
        return finalize(obj, ctx, &plugin, &resource, &children, child_text, now_ms).await;
    }
    if let Some(version) = ensure_finalizer(obj, ctx).await? {
        // The status below is written over this version too (see [`super::written`]).
        resource["metadata"]["resourceVersion"] = json!(version);
    }

    let owner = Owner { kind: ctx.kind.kind.clone(), namespace: namespace.clone(), name: name.clone() };
    let responses = ctx.requests.responses(&owner, &crate::requests::records(&resource));
    let ns = namespace.clone();
    let call = plugin_call::call(&ctx.sandbox, &ctx.metrics, &plugin, "reconcile", move |guest| {
        let observed =
            Observed { resource: &resource_text, children: &child_text, now_ms, responses: &responses };
        guest.reconcile_observed(&observed, &ns)
    })
    .await?;
    let plan = match call {
        Ok(plan) => plan,
        Err(err) => {
            crate::guardrails::record_refusal(&ctx.gate.current(), &plugin, &resource, &err);
            let err = Error::Plugin(err);
            degrade(obj, ctx, &resource, &err).await;
            return Err(err);
        }
    };

    check_guardrails(obj, ctx, &plugin, &resource, &children, &plan.actions, Some(&plan.status)).await?;

    // Requests go first and never wait: their answers come in a later reconcile.
    let scene = Scene {
        owner: &owner,
        resource: &resource,
        children: &children,
        api: cr_api(obj, ctx),
        plugin: plugin.name(),
        now_ms,
        leadership: &ctx.leadership,
    };
    let recorded = dispatch::dispatch(&ctx.requests, &scene, &plan.actions).await;
    ctx.requests.retain(&owner, &planned_ids(&plan.actions));
    if let Some(stored) = recorded {
        // The one-shot records are the newest write: the status below goes over them.
        remember(obj, ctx, superseded(obj, &resource), &stored);
        resource = stored;
    }
    let certificates = Certificates {
        requested: requested_certificates(&plan.actions),
        // Read only when a StatefulSet is created: not worked out for a converged resource.
        names: creates_statefulset(&plan.actions, &children)
            .then(|| certificate_names(&plan.actions, &children, &resource, &namespace))
            .flatten(),
    };
    let mut waiting = false;
    for action in plan.actions.iter().filter(|a| !a.is_request()) {
        match execute(ctx, action, &resource, &namespace, &children, &certificates).await {
            Ok(Applied::Done) => {}
            Ok(Applied::Waiting) => waiting = true,
            Err(err) => {
                // What needs the user (someone else's object in the way, the API server refusing the
                // object: a quota, an admission policy, an invalid field) goes to status and an
                // Event; a transient failure is only retried.
                if err.needs_the_user() {
                    degrade(obj, ctx, &resource, &err).await;
                }
                return Err(err);
            }
        }
    }

    let stamp = PluginStamp { name: plugin.name(), version: plugin.version(), digest: plugin.digest() };
    let finding = ctx.findings.get(&namespace, &name).map(|f| f.condition());
    let desired = status::desired(&resource, &plan.status, finding.as_ref(), &stamp, &now_rfc3339());
    if status::differs(&resource, &desired) {
        write_status(obj, ctx, &resource, &status::merge_patch(resource.get("status"), &desired)).await?;
    }
    // Phase changes arrive as the plugin's own events (the sdk emits PhaseChanged).
    for event in &plan.events {
        ctx.events.publish(obj, event.type_, &event.reason, &event.message).await;
    }
    let requeue = plan.requeue_after.unwrap_or(RESYNC);
    // A set waiting for its certificate is created on the Secret's change; this is the fallback.
    Ok(Requeue::requeue(if waiting { requeue.min(WAITING_RECHECK) } else { requeue }))
}

/// How soon a reconcile whose StatefulSet waits for a certificate looks again at the latest.
const WAITING_RECHECK: Duration = Duration::from_secs(2);

/// Whether an action was carried out or waits for something outside the plan.
enum Applied {
    Done,
    /// A StatefulSet not created yet: a certificate it mounts is not issued yet.
    Waiting,
}

/// What a StatefulSet's certificates are checked against when it is created.
struct Certificates {
    /// The Secrets the plan asks to be server certificates.
    requested: BTreeSet<String>,
    /// The names they must carry: those of every Service the plan applies, once all are
    /// observed (see `service_certs::stamp_planned`); None when no check applies.
    names: Option<Result<String, String>>,
}

/// The children as the plugin is shown them: Secrets without their values; when this operator
/// keeps the certificates (`certificates`), a StatefulSet this reconcile is about to stamp with a
/// renewed certificate without its update revision, which is not yet the one its pods will be
/// made from (see `service_certs::restamp_pending`).
fn plugin_children(children: &[Value], certificates: bool) -> Vec<String> {
    children
        .iter()
        .map(|child| {
            if certificates && super::service_certs::restamp_pending(child, children) {
                let mut set = child.clone();
                if let Some(status) = set.get_mut("status").and_then(Value::as_object_mut) {
                    status.remove("updateRevision");
                }
                set.to_string()
            } else {
                crate::children::plugin_view(child)
            }
        })
        .collect()
}

/// Whether the plan applies a StatefulSet that is not among `children` yet.
fn creates_statefulset(actions: &[Action], children: &[Value]) -> bool {
    actions.iter().any(|a| match a {
        Action::Apply { object } if object["kind"] == "StatefulSet" => !children
            .iter()
            .any(|c| c["kind"] == "StatefulSet" && c["metadata"]["name"] == object["metadata"]["name"]),
        _ => false,
    })
}

/// The names of the Services the plan applies, once every one of them is among `children`.
fn certificate_names(
    actions: &[Action],
    children: &[Value],
    resource: &Value,
    namespace: &str,
) -> Option<Result<String, String>> {
    let uid = resource.pointer("/metadata/uid").and_then(Value::as_str)?;
    let planned = actions.iter().filter_map(|a| match a {
        Action::Apply { object } if object["apiVersion"] == "v1" && object["kind"] == "Service" => {
            object.pointer("/metadata/name").and_then(Value::as_str)
        }
        _ => None,
    });
    for name in planned {
        let seen = children.iter().any(|c| c["kind"] == "Service" && c["metadata"]["name"] == name);
        if !seen {
            return Some(Err(format!("waiting for Service {name} to be observed before its certificate")));
        }
    }
    Some(Ok(super::service_certs::service_sans(children, uid, namespace).join(",")))
}

/// The Secrets the plan asks to be server certificates.
fn requested_certificates(actions: &[Action]) -> BTreeSet<String> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::EnsureSecret { secret }
                if super::service_certs::is_certificate_request(&secret.labels) =>
            {
                Some(secret.name.clone())
            }
            _ => None,
        })
        .collect()
}

/// The ids of the plan's requests.
fn planned_ids(actions: &[Action]) -> HashSet<&str> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Exec { request } => Some(request.id.as_str()),
            Action::Http { request } => Some(request.id.as_str()),
            _ => None,
        })
        .collect()
}

/// Evaluates the guardrails for every action; any enforced deny stops the whole plan.
async fn check_guardrails(
    obj: &DynamicObject,
    ctx: &Context,
    plugin: &Plugin,
    resource: &Value,
    children: &[Value],
    actions: &[Action],
    status: Option<&StatusReport>,
) -> Result<(), Error> {
    let span = tracing::info_span!(
        "policy.eval",
        path = "data.stateward.guardrails",
        result = tracing::field::Empty,
        decisions = i64::try_from(actions.len() + usize::from(status.is_some())).unwrap_or(i64::MAX),
        decision_id = tracing::field::Empty
    );
    let started = Instant::now();
    let verdict = span.in_scope(|| {
        crate::guardrails::check(&ctx.gate.current(), plugin, resource, children, actions, status)
    });
    let result = if verdict.allowed() { "allow" } else { "deny" };
    span.record("result", result);
    // One decision per action; their ids lead to the audit records (comma-separated).
    let ids: Vec<&str> = verdict.actions.iter().map(|a| a.verdict.decision_id.as_str()).collect();
    span.record("decision_id", ids.join(","));
    ctx.metrics.policy_decision("guardrails", result, started.elapsed().as_secs_f64());
    for (target, message) in verdict.warnings() {
        ctx.events.publish(obj, EventType::Warning, "PolicyWarning", &format!("{target}: {message}")).await;
    }
    if verdict.allowed() {
        return Ok(());
    }
    let messages: Vec<String> = verdict.denials().into_iter().map(|(t, m)| format!("{t}: {m}")).collect();
    let err = Error::PolicyDenied(messages.join("; "));
    degrade(obj, ctx, resource, &err).await;
    Err(err)
}

/// One action in its own `apply` span (kind, name, verb, and whether it wrote).
async fn execute(
    ctx: &Context,
    action: &Action,
    resource: &Value,
    namespace: &str,
    children: &[Value],
    certificates: &Certificates,
) -> Result<Applied, Error> {
    let (kind, name) = match action {
        Action::Apply { object } => {
            let s = |p: &str| object.pointer(p).and_then(Value::as_str).unwrap_or_default().to_owned();
            (s("/kind"), s("/metadata/name"))
        }
        Action::Delete { target } => (target.kind.clone(), target.name.clone()),
        Action::EnsureSecret { secret } => ("Secret".to_owned(), secret.name.clone()),
        Action::LabelPod { pods } => ("Pod".to_owned(), pods.pod.clone()),
        // Requests are dispatched, never executed here.
        Action::Exec { request } => ("Pod".to_owned(), request.what.pod.clone()),
        Action::Http { request } => ("Http".to_owned(), request.id.clone()),
    };
    let span = tracing::info_span!("apply", kind, name, verb = action.verb(), wrote = tracing::field::Empty);
    execute_one(ctx, action, resource, namespace, children, certificates).instrument(span).await
}

async fn execute_one(
    ctx: &Context,
    action: &Action,
    resource: &Value,
    namespace: &str,
    children: &[Value],
    certificates: &Certificates,
) -> Result<Applied, Error> {
    let observed = |api_version: &str, kind: &str, name: &str| {
        children
            .iter()
            .find(|c| c["apiVersion"] == api_version && c["kind"] == kind && c["metadata"]["name"] == name)
    };
    if !ctx.leadership.is_leader() {
        return Err(Error::NotLeader);
    }
    let wrote = match action {
        Action::Apply { object } => {
            let s = |p: &str| object.pointer(p).and_then(Value::as_str).unwrap_or_default();
            let current = observed(s("/apiVersion"), s("/kind"), s("/metadata/name"));
            let mut object = object.clone();
            if ctx.issues_certificates && s("/apiVersion") == "apps/v1" && s("/kind") == "StatefulSet" {
                if let Err(waiting) = super::service_certs::stamp_planned(
                    &mut object,
                    current,
                    children,
                    &certificates.requested,
                    certificates.names.as_ref(),
                ) {
                    tracing::debug!(reason = %waiting, "StatefulSet not created yet");
                    return Ok(Applied::Waiting);
                }
            }
            let wrote = ctx.applier.apply(object, resource, current).await?;
            if wrote {
                ctx.metrics.api_write("apply", s("/kind"));
            }
            wrote
        }
        Action::Delete { target } => {
            let present = observed(&target.api_version, &target.kind, &target.name).is_some();
            let wrote = ctx.applier.delete(target, namespace, present).await?;
            if wrote {
                ctx.metrics.api_write("delete", &target.kind);
            }
            wrote
        }
        Action::EnsureSecret { secret } => {
            let existing = ctx.children.secret(namespace, &secret.name);
            let wrote = ctx.applier.ensure_secret(secret, namespace, existing.as_deref(), resource).await?;
            if wrote {
                ctx.metrics.api_write("ensure-secret", "Secret");
            }
            wrote
        }
        Action::LabelPod { pods } => {
            let current = observed("v1", "Pod", &pods.pod);
            let wrote = ctx.applier.label_pod(pods, namespace, current).await?;
            if wrote {
                ctx.metrics.api_write("label-pod", "Pod");
            }
            wrote
        }
        Action::Exec { .. } | Action::Http { .. } => false,
    };
    tracing::Span::current().record("wrote", wrote);
    tracing::debug!(verb = action.verb(), wrote, "action");
    Ok(Applied::Done)
}

async fn finalize(
    obj: &DynamicObject,
    ctx: &Context,
    plugin: &Arc<Plugin>,
    resource: &Value,
    children: &[Value],
    child_text: Vec<String>,
    now_ms: u64,
) -> Result<Requeue, Error> {
    if !obj.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Requeue::await_change());
    }
    let namespace = obj.namespace().unwrap_or_default();
    let (ns, text) = (namespace.clone(), resource.to_string());
    let owner = Owner { kind: ctx.kind.kind.clone(), namespace: namespace.clone(), name: obj.name_any() };
    let responses = ctx.requests.responses(&owner, &crate::requests::records(resource));
    let cleanup = plugin_call::call(&ctx.sandbox, &ctx.metrics, plugin, "finalize", move |guest| {
        let observed = Observed { resource: &text, children: &child_text, now_ms, responses: &responses };
        guest.finalize_observed(&observed, &ns)
    })
    .await?
    .inspect_err(|err| crate::guardrails::record_refusal(&ctx.gate.current(), plugin, resource, err))
    .map_err(Error::Plugin)?;
    check_guardrails(obj, ctx, plugin, resource, children, &cleanup.actions, None).await?;
    let scene = Scene {
        owner: &owner,
        resource,
        children,
        api: cr_api(obj, ctx),
        plugin: plugin.name(),
        now_ms,
        leadership: &ctx.leadership,
    };
    dispatch::dispatch(&ctx.requests, &scene, &cleanup.actions).await;
    ctx.requests.retain(&owner, &planned_ids(&cleanup.actions));
    let certificates = Certificates { requested: requested_certificates(&cleanup.actions), names: None };
    for action in cleanup.actions.iter().filter(|a| !a.is_request()) {
        execute(ctx, action, resource, &namespace, children, &certificates).await?;
    }
    for event in &cleanup.events {
        ctx.events.publish(obj, event.type_, &event.reason, &event.message).await;
    }
    if !cleanup.done {
        ctx.events.publish(obj, EventType::Normal, "Finalizing", "waiting for cleanup to finish").await;
        return Ok(Requeue::requeue(Duration::from_secs(2)));
    }
    remove_finalizer(obj, ctx).await?;
    ctx.requests.retain(&owner, &HashSet::new());
    Ok(Requeue::await_change())
}

/// A resource whose name another kind's resource holds never acts: not even its cleanup,
/// since the objects named after it are the holder's. Deleting it only drops our finalizer.
async fn refuse_name_conflict(
    obj: &DynamicObject,
    ctx: &Context,
    resource: &Value,
    holder: super::claims::Holder,
) -> Result<Requeue, Error> {
    let err = Error::NameConflict(holder);
    if obj.metadata.deletion_timestamp.is_some() {
        ctx.events
            .publish(obj, EventType::Warning, err.reason(), &format!("deleted without cleanup: {err}"))
            .await;
        remove_finalizer(obj, ctx).await?;
        return Ok(Requeue::await_change());
    }
    degrade(obj, ctx, resource, &err).await;
    Err(err)
}

/// Whether another resource of this kind controls `child` (a Pod controlled by the
/// resource's StatefulSet is the resource's own).
fn controlled_by_other(child: &Value, kind: &str, uid: Option<&str>) -> bool {
    let refs = child.pointer("/metadata/ownerReferences").and_then(Value::as_array);
    let controller = refs.into_iter().flatten().find(|r| r["controller"] == Value::Bool(true));
    controller.is_some_and(|r| r["kind"] == kind && r["uid"].as_str() != uid)
}

fn cr_api(obj: &DynamicObject, ctx: &Context) -> Api<DynamicObject> {
    Api::namespaced_with(ctx.client.clone(), &obj.namespace().unwrap_or_default(), &ctx.kind.api_resource)
}

/// Adds the finalizer if it is missing; the resource's version after the patch, if it patched.
async fn ensure_finalizer(obj: &DynamicObject, ctx: &Context) -> Result<Option<String>, Error> {
    if obj.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(None);
    }
    let patch = if obj.metadata.finalizers.as_ref().is_none_or(Vec::is_empty) {
        json!([{"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}])
    } else {
        json!([{"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}])
    };
    patch_cr(obj, ctx, patch, "add finalizer").await.map(|patched| patched.resource_version())
}

async fn remove_finalizer(obj: &DynamicObject, ctx: &Context) -> Result<(), Error> {
    let Some(index) = obj.finalizers().iter().position(|f| f == FINALIZER) else {
        return Ok(());
    };
    let path = format!("/metadata/finalizers/{index}");
    let patch = json!([{"op": "test", "path": path, "value": FINALIZER}, {"op": "remove", "path": path}]);
    patch_cr(obj, ctx, patch, "remove finalizer").await?;
    ctx.written.forget(&uid(obj));
    Ok(())
}

async fn patch_cr(
    obj: &DynamicObject,
    ctx: &Context,
    patch: Value,
    verb: &'static str,
) -> Result<DynamicObject, Error> {
    let patch: json_patch::Patch =
        serde_json::from_value(patch).map_err(|e| Error::Resource(obj.name_any(), e.to_string()))?;
    let target = CrWrite { api: cr_api(obj, ctx), leadership: &ctx.leadership, kind: &ctx.kind.kind };
    let patched = target.json_patch(&obj.name_any(), patch, verb).await?;
    ctx.metrics.api_write("patch", &ctx.kind.kind);
    Ok(patched)
}

/// Writes `status`, a merge patch of `.status` (see [`status::merge_patch`]) over `resource` as
/// this reconcile read it, and remembers what the API server stored until the cache has it.
async fn write_status(
    obj: &DynamicObject,
    ctx: &Context,
    resource: &Value,
    status: &Value,
) -> Result<(), Error> {
    let target = CrWrite { api: cr_api(obj, ctx), leadership: &ctx.leadership, kind: &ctx.kind.kind };
    tracing::debug!(name = %obj.name_any(), patch = %status, "status write");
    let stored = target.status(&obj.name_any(), status).instrument(tracing::info_span!("status")).await?;
    ctx.metrics.api_write("status", &ctx.kind.kind);
    remember(obj, ctx, superseded(obj, resource), &serde_json::to_value(stored).unwrap_or_default());
    Ok(())
}

/// The versions a write over `resource` supersedes: the cached one and the one it was made over.
fn superseded(obj: &DynamicObject, resource: &Value) -> Vec<String> {
    let mut superseded = vec![version(obj)];
    if let Some(read) = resource.pointer("/metadata/resourceVersion").and_then(Value::as_str) {
        if read != superseded[0] {
            superseded.push(read.to_string());
        }
    }
    superseded
}

/// Remembers `stored`, what the API server answered a status write with, until the cache has it.
fn remember(obj: &DynamicObject, ctx: &Context, superseded: Vec<String>, stored: &Value) {
    let stored_version = stored.pointer("/metadata/resourceVersion").and_then(Value::as_str);
    match (stored.get("status"), stored_version) {
        (Some(status), Some(v)) => ctx.written.remember(&uid(obj), superseded, status.clone(), v.to_string()),
        _ => ctx.written.forget(&uid(obj)),
    }
}

fn uid(obj: &DynamicObject) -> String {
    obj.uid().unwrap_or_default()
}

fn version(obj: &DynamicObject) -> String {
    obj.resource_version().unwrap_or_default()
}

/// The custom resource's own writes (finalizer, status). Like every child write
/// ([`execute_one`]), each asks right before it is sent whether this replica still leads: a
/// reconcile that began as leader may outlive the Lease (hardening finding 8).
struct CrWrite<'a> {
    api: Api<DynamicObject>,
    leadership: &'a crate::leader::Leadership,
    kind: &'a str,
}

impl CrWrite<'_> {
    async fn json_patch(
        &self,
        name: &str,
        patch: json_patch::Patch,
        verb: &'static str,
    ) -> Result<DynamicObject, Error> {
        if !self.leadership.is_leader() {
            return Err(Error::NotLeader);
        }
        self.api
            .patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
            .await
            .map_err(|e| Error::api(verb, self.kind, name, e))
    }

    async fn status(&self, name: &str, status: &Value) -> Result<DynamicObject, Error> {
        if !self.leadership.is_leader() {
            return Err(Error::NotLeader);
        }
        let patch = json!({ "status": status });
        self.api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| Error::api("patch status", self.kind, name, e))
    }
}

/// Marks the resource Degraded with the failure's reason and says so in an Event.
async fn degrade(obj: &DynamicObject, ctx: &Context, resource: &Value, err: &Error) {
    let message = err.to_string();
    let status = status::degraded(resource, err.reason(), &message, &now_rfc3339());
    if status::differs(resource, &status) {
        if let Err(e) =
            write_status(obj, ctx, resource, &status::merge_patch(resource.get("status"), &status)).await
        {
            tracing::warn!(error = %e, "cannot record the failure in status");
        }
    }
    ctx.events.publish(obj, EventType::Warning, err.reason(), &message).await;
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn now_rfc3339() -> String {
    jiff::Timestamp::now().round(jiff::Unit::Second).map(|t| t.to_string()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::controlled_by_other;
    use serde_json::json;

    /// The plugin sees no update revision for an OnDelete set whose certificate was renewed
    /// (its apply is yet to stamp it), the revision of every other set, and no Secret value.
    #[test]
    #[allow(clippy::expect_used)]
    fn the_plugin_is_not_shown_the_revision_of_a_set_about_to_be_stamped_anew() {
        use base64::Engine as _;
        let b64 = |t: &str| base64::engine::general_purpose::STANDARD.encode(t);
        let secret = json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "db-tls", "labels": {"stateward.dev/certificate": "server"},
                         "annotations": {"stateward.dev/cert-not-after": "1", "stateward.dev/cert-sans": "db.ns.svc"}},
            "data": {"tls.crt": b64("renewed"), "tls.key": b64("secret key")}});
        let set = |name: &str, stamp: &str| {
            json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name},
                "spec": {"updateStrategy": {"type": "OnDelete"}, "template": {
                    "metadata": {"annotations": {"stateward.dev/certificates-sha256": stamp}},
                    "spec": {"volumes": [{"name": "tls", "secret": {"secretName": "db-tls"}}]}}},
                "status": {"updateRevision": format!("{name}-1")}})
        };
        let mut current = set("db-b", "");
        crate::controller::service_certs::stamp_pod_template(
            &mut current,
            &std::collections::BTreeMap::from([("db-tls".to_string(), "renewed".to_string())]),
        );
        let children = [secret, set("db-a", "the old certificate's"), current];
        let unkept: Vec<serde_json::Value> = super::plugin_children(&children, false)
            .iter()
            .map(|t| serde_json::from_str(t).expect("json"))
            .collect();
        assert_eq!(unkept[1]["status"]["updateRevision"], "db-a-1", "no keeper: no stamp to wait for");
        let seen: Vec<serde_json::Value> = super::plugin_children(&children, true)
            .iter()
            .map(|t| serde_json::from_str(t).expect("json"))
            .collect();
        assert_eq!(seen[0]["data"]["tls.key"], "", "no Secret value");
        assert!(seen[1]["status"].get("updateRevision").is_none(), "{}", seen[1]);
        assert_eq!(seen[2]["status"]["updateRevision"], "db-b-1");
    }

    /// Hardening finding 8: a finalizer or status write of a replica that does not lead is
    /// refused before it is sent (the API server here is a closed port: a write that went out
    /// would fail with a connection error instead).
    #[tokio::test]
    #[allow(clippy::expect_used)]
    async fn resource_writes_check_leadership_first() {
        use super::{CrWrite, Error};
        let closed =
            std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
        let config = kube::Config::new(format!("http://127.0.0.1:{closed}").parse().expect("url"));
        let client = kube::Client::try_from(config).expect("client");
        let (leadership, task) = crate::leader::spawn(
            client.clone(),
            crate::leader::LeaderConfig::new("default", "lease", "me"),
            std::future::pending::<()>(),
        );
        let ar = kube::core::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("stateward.dev", "v1", "PostgresCluster"),
            "postgresclusters",
        );
        let target = CrWrite {
            api: kube::Api::<kube::core::DynamicObject>::namespaced_with(client, "default", &ar),
            leadership: &leadership,
            kind: "PostgresCluster",
        };
        let status = target.status("db", &json!({"phase": "Running"})).await;
        assert!(matches!(status, Err(Error::NotLeader)), "status written without leadership: {status:?}");
        let patch = json_patch::Patch(Vec::new());
        let finalizer = target.json_patch("db", patch, "remove finalizer").await;
        assert!(
            matches!(finalizer, Err(Error::NotLeader)),
            "finalizer written without leadership: {finalizer:?}"
        );
        task.abort();
    }

    #[test]
    fn only_a_foreign_controller_hides_a_child() {
        let child = |refs: serde_json::Value| json!({"metadata": {"name": "db", "ownerReferences": refs}});
        let ours = Some("uid-1");
        let other = |child: &serde_json::Value| controlled_by_other(child, "PostgresCluster", ours);
        assert!(!other(&json!({"metadata": {"name": "data-db-0"}})), "a claim has no owner");
        assert!(!other(&child(json!([{"kind": "PostgresCluster", "uid": "uid-1", "controller": true}]))));
        assert!(
            other(&child(json!([{"kind": "PostgresCluster", "uid": "uid-0", "controller": true}]))),
            "an earlier resource of the name"
        );
        assert!(
            !other(&child(json!([{"kind": "PostgresCluster", "uid": "uid-9"}]))),
            "a plain owner is not a controller"
        );
        assert!(
            !other(&child(json!([{"kind": "StatefulSet", "uid": "sts-1", "controller": true}]))),
            "a pod of the resource's StatefulSet is the resource's"
        );
    }
}
