//! One reconcile, in one readable place: observe → plugin → policy → apply → status.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams};
use kube::core::DynamicObject;
use kube::runtime::controller::Action as Requeue;
use kube::{Api, ResourceExt};
use serde_json::{json, Value};
use tracing::Instrument;

use super::status::{self, PluginStamp};
use super::{Context, Error, FINALIZER};
use crate::runtime::{Action, EventType, Plugin};

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
    let resource = serde_json::to_value(obj).map_err(|e| Error::Resource(obj.name_any(), e.to_string()))?;
    let namespace = obj.namespace().unwrap_or_default();
    let name = obj.name_any();
    let plugin = ctx.plugin();

    if let Some(holder) = ctx.claims.holder(obj, &ctx.kind.kind).await? {
        return refuse_name_conflict(obj, ctx, &resource, holder).await;
    }
    let mut children = tracing::info_span!("observe").in_scope(|| ctx.children.observe(&namespace, &name));
    // A child controlled by another object (an earlier resource of this name that the garbage
    // collector has not reached yet) is not this resource's to change or delete.
    children.retain(|child| !controlled_by_other(child, obj.metadata.uid.as_deref()));
    let child_text: Vec<String> = children.iter().map(Value::to_string).collect();
    let resource_text = resource.to_string();
    let now_ms = now_ms();

    if obj.metadata.deletion_timestamp.is_some() {
        return finalize(obj, ctx, &plugin, &resource, &children, child_text, now_ms).await;
    }
    ensure_finalizer(obj, ctx).await?;

    let call = {
        let (guest, ns) = (Arc::clone(&plugin), namespace.clone());
        let span = plugin_span(&plugin, "reconcile");
        let started = Instant::now();
        let in_call = span.clone();
        let _probation = if plugin.on_probation() { plugin.probation_permit().await } else { None };
        let answer = ctx
            .sandbox
            .run_blocking(move || in_call.in_scope(|| guest.reconcile(&resource_text, &child_text, now_ms, &ns)))
            .await?;
        let elapsed = started.elapsed();
        span.record("elapsed_ms", millis(elapsed));
        ctx.metrics.plugin_call(plugin.name(), "reconcile", elapsed.as_secs_f64());
        answer
    };
    let plan = match call {
        Ok(plan) => plan,
        Err(err) => {
            if err.is_trap() {
                ctx.metrics.plugin_trap(plugin.name(), err.label());
            }
            let err = Error::Plugin(err);
            degrade(obj, ctx, &resource, &err).await;
            return Err(err);
        }
    };

    gate(obj, ctx, &plugin, &resource, &plan.actions).await?;

    for action in &plan.actions {
        if let Err(err) = execute(ctx, action, &resource, &namespace, &children).await {
            // What needs the user (someone else's object in the way, the API server refusing the
            // object: a quota, an admission policy, an invalid field) goes to status and an
            // Event; a transient failure is only retried.
            if err.needs_the_user() {
                degrade(obj, ctx, &resource, &err).await;
            }
            return Err(err);
        }
    }

    let stamp = PluginStamp { name: plugin.name(), version: plugin.version(), digest: plugin.digest() };
    let finding = ctx.findings.get(&namespace, &name).map(|f| f.condition());
    let desired = status::desired(&resource, &plan.status, finding.as_ref(), &stamp, &now_rfc3339());
    if status::differs(&resource, &desired) {
        write_status(obj, ctx, &desired).await?;
    }
    // Phase changes arrive as the plugin's own events (the sdk emits PhaseChanged).
    for event in &plan.events {
        ctx.events.publish(obj, event.type_, &event.reason, &event.message).await;
    }
    Ok(Requeue::requeue(plan.requeue_after.unwrap_or(RESYNC)))
}

/// Evaluates the guardrails for every action; any enforced deny stops the whole plan.
async fn gate(obj: &DynamicObject, ctx: &Context, plugin: &Plugin, resource: &Value, actions: &[Action]) -> Result<(), Error> {
    let span = tracing::info_span!("policy.eval", path = "data.stateward.guardrails", result = tracing::field::Empty, decisions = i64::try_from(actions.len()).unwrap_or(i64::MAX), decision_id = tracing::field::Empty);
    let started = Instant::now();
    let verdict = span.in_scope(|| crate::plan_gate::check(&ctx.gate.current(), plugin, resource, actions));
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
async fn execute(ctx: &Context, action: &Action, resource: &Value, namespace: &str, children: &[Value]) -> Result<(), Error> {
    let (kind, name) = match action {
        Action::Apply { object } => {
            let s = |p: &str| object.pointer(p).and_then(Value::as_str).unwrap_or_default().to_owned();
            (s("/kind"), s("/metadata/name"))
        }
        Action::Delete { target } => (target.kind.clone(), target.name.clone()),
        Action::EnsureSecret { secret } => ("Secret".to_owned(), secret.name.clone()),
    };
    let span = tracing::info_span!("apply", kind, name, verb = action.verb(), wrote = tracing::field::Empty);
    execute_one(ctx, action, resource, namespace, children).instrument(span).await
}

async fn execute_one(ctx: &Context, action: &Action, resource: &Value, namespace: &str, children: &[Value]) -> Result<(), Error> {
    let observed = |api_version: &str, kind: &str, name: &str| {
        children.iter().find(|c| c["apiVersion"] == api_version && c["kind"] == kind && c["metadata"]["name"] == name)
    };
    if !ctx.leadership.is_leader() {
        return Err(Error::NotLeader);
    }
    let wrote = match action {
        Action::Apply { object } => {
            let s = |p: &str| object.pointer(p).and_then(Value::as_str).unwrap_or_default();
            let current = observed(s("/apiVersion"), s("/kind"), s("/metadata/name"));
            let wrote = ctx.applier.apply(object.clone(), resource, current).await?;
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
            let wrote = ctx.applier.ensure_secret(secret, namespace, existing.as_deref()).await?;
            if wrote {
                ctx.metrics.api_write("ensure-secret", "Secret");
            }
            wrote
        }
    };
    tracing::Span::current().record("wrote", wrote);
    tracing::debug!(verb = action.verb(), wrote, "action");
    Ok(())
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
    let cleanup = {
        let _probation = if plugin.on_probation() { plugin.probation_permit().await } else { None };
        let (plugin, ns, text) = (Arc::clone(plugin), namespace.clone(), resource.to_string());
        let span = plugin_span(&plugin, "finalize");
        let started = Instant::now();
        let in_call = span.clone();
        let answer = ctx.sandbox.run_blocking(move || in_call.in_scope(|| plugin.finalize(&text, &child_text, now_ms, &ns))).await?;
        span.record("elapsed_ms", millis(started.elapsed()));
        answer.map_err(Error::Plugin)?
    };
    gate(obj, ctx, plugin, resource, &cleanup.actions).await?;
    for action in &cleanup.actions {
        execute(ctx, action, resource, &namespace, children).await?;
    }
    for event in &cleanup.events {
        ctx.events.publish(obj, event.type_, &event.reason, &event.message).await;
    }
    if !cleanup.done {
        ctx.events.publish(obj, EventType::Normal, "Finalizing", "waiting for cleanup to finish").await;
        return Ok(Requeue::requeue(Duration::from_secs(2)));
    }
    remove_finalizer(obj, ctx).await?;
    Ok(Requeue::await_change())
}

/// A resource whose name another kind's resource holds never acts: not even its cleanup,
/// since the objects named after it are the holder's. Deleting it only drops our finalizer.
async fn refuse_name_conflict(obj: &DynamicObject, ctx: &Context, resource: &Value, holder: super::claims::Holder) -> Result<Requeue, Error> {
    let err = Error::NameConflict(holder);
    if obj.metadata.deletion_timestamp.is_some() {
        ctx.events.publish(obj, EventType::Warning, err.reason(), &format!("deleted without cleanup: {err}")).await;
        remove_finalizer(obj, ctx).await?;
        return Ok(Requeue::await_change());
    }
    degrade(obj, ctx, resource, &err).await;
    Err(err)
}

fn controlled_by_other(child: &Value, uid: Option<&str>) -> bool {
    let refs = child.pointer("/metadata/ownerReferences").and_then(Value::as_array);
    let controller = refs.into_iter().flatten().find(|r| r["controller"] == Value::Bool(true));
    controller.is_some_and(|r| r["uid"].as_str() != uid)
}

/// Milliseconds with microsecond resolution, for span attributes people read.
fn millis(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// The `plugin.call` span: plugin, version, export, and the call's wall time once it returns.
/// The plugin's `log` lines are emitted inside it, so they become its span events.
fn plugin_span(plugin: &Plugin, export: &'static str) -> tracing::Span {
    tracing::info_span!("plugin.call", plugin = plugin.name(), version = plugin.version(), export, elapsed_ms = tracing::field::Empty)
}

fn cr_api(obj: &DynamicObject, ctx: &Context) -> Api<DynamicObject> {
    Api::namespaced_with(ctx.client.clone(), &obj.namespace().unwrap_or_default(), &ctx.kind.api_resource)
}

async fn ensure_finalizer(obj: &DynamicObject, ctx: &Context) -> Result<(), Error> {
    if obj.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(());
    }
    let patch = if obj.metadata.finalizers.as_ref().is_none_or(Vec::is_empty) {
        json!([{"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}])
    } else {
        json!([{"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}])
    };
    patch_cr(obj, ctx, patch, "add finalizer").await
}

async fn remove_finalizer(obj: &DynamicObject, ctx: &Context) -> Result<(), Error> {
    let Some(index) = obj.finalizers().iter().position(|f| f == FINALIZER) else {
        return Ok(());
    };
    let path = format!("/metadata/finalizers/{index}");
    let patch = json!([{"op": "test", "path": path, "value": FINALIZER}, {"op": "remove", "path": path}]);
    patch_cr(obj, ctx, patch, "remove finalizer").await
}

async fn patch_cr(obj: &DynamicObject, ctx: &Context, patch: Value, verb: &'static str) -> Result<(), Error> {
    let patch: json_patch::Patch =
        serde_json::from_value(patch).map_err(|e| Error::Resource(obj.name_any(), e.to_string()))?;
    cr_api(obj, ctx)
        .patch(&obj.name_any(), &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .map_err(|e| Error::api(verb, &ctx.kind.kind, &obj.name_any(), e))?;
    ctx.metrics.api_write("patch", &ctx.kind.kind);
    Ok(())
}

async fn write_status(obj: &DynamicObject, ctx: &Context, status: &Value) -> Result<(), Error> {
    let patch = json!({ "status": status });
    cr_api(obj, ctx)
        .patch_status(&obj.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .instrument(tracing::info_span!("status"))
        .await
        .map_err(|e| Error::api("patch status", &ctx.kind.kind, &obj.name_any(), e))?;
    ctx.metrics.api_write("status", &ctx.kind.kind);
    Ok(())
}

/// Marks the resource Degraded with the failure's reason and says so in an Event.
async fn degrade(obj: &DynamicObject, ctx: &Context, resource: &Value, err: &Error) {
    let message = err.to_string();
    let status = status::degraded(resource, err.reason(), &message, &now_rfc3339());
    if status::differs(resource, &status) {
        if let Err(e) = write_status(obj, ctx, &status).await {
            tracing::warn!(error = %e, "cannot record the failure in status");
        }
    }
    ctx.events.publish(obj, EventType::Warning, err.reason(), &message).await;
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn now_rfc3339() -> String {
    jiff::Timestamp::now().round(jiff::Unit::Second).map(|t| t.to_string()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::controlled_by_other;
    use serde_json::json;

    #[test]
    fn only_a_foreign_controller_hides_a_child() {
        let child = |refs: serde_json::Value| json!({"metadata": {"name": "db", "ownerReferences": refs}});
        let ours = Some("uid-1");
        assert!(!controlled_by_other(&json!({"metadata": {"name": "data-db-0"}}), ours), "a claim has no owner");
        assert!(!controlled_by_other(&child(json!([{"uid": "uid-1", "controller": true}])), ours));
        assert!(controlled_by_other(&child(json!([{"uid": "uid-0", "controller": true}])), ours), "an earlier resource of the name");
        assert!(!controlled_by_other(&child(json!([{"uid": "uid-9"}])), ours), "a plain owner is not a controller");
    }
}
