//! The verbs of `kubectl stateward` (the same binary, installed as `kubectl-stateward`) that act
//! on a resource in a cluster: `status`, `promote`, `pause`/`resume`, `hibernate`/`wake`,
//! `fence`/`unfence` and `restart`. Each verb
//! is one write of a field every stateward kind has; what it means for one service (which
//! member goes first, whether there is a primary at all) is the plugin's to decide, and a
//! refusal comes back from its admission check with the field and the reason.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::{bail, Context};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject};
use kube::discovery::{Discovery, Scope};
use kube::{Api, Client, ResourceExt};
use serde_json::{json, Value};

use crate::children::INSTANCE_LABEL;

/// The API group of every kind the operator serves.
pub const GROUP: &str = "stateward.dev";
/// Asks for a switchover to the named pod (PostgreSQL, Redis).
pub const SWITCHOVER_ANNOTATION: &str = "stateward.dev/switchover-to";
/// Lists the pods (a JSON list) taken out of every client Service and kept for inspection.
pub const FENCED_ANNOTATION: &str = "stateward.dev/fenced-instances";
/// Asks for a rolling restart; any new value (the time it was asked) restarts again.
pub const RESTARTED_AT_ANNOTATION: &str = "stateward.dev/restarted-at";
/// Who writes what the verbs write (server-side apply field manager).
const FIELD_MANAGER: &str = "kubectl-stateward";
/// Events shown by `status`.
const STATUS_EVENTS: usize = 10;

/// A resource of one of the operator's kinds, found by name.
pub struct Target {
    pub api: Api<DynamicObject>,
    pub resource: ApiResource,
    pub object: DynamicObject,
}

impl Target {
    fn name(&self) -> String {
        self.object.name_any()
    }

    fn describe(&self) -> String {
        format!("{} {}/{}", self.resource.kind, self.object.namespace().unwrap_or_default(), self.name())
    }
}

/// Finds `name` in `namespace` among the kinds of [`GROUP`] the API server serves (or only
/// `kind`, matched against kind, plural or short name): a name used by two kinds needs `kind`.
pub async fn find(
    client: &Client,
    namespace: &str,
    name: &str,
    kind: Option<&str>,
) -> anyhow::Result<Target> {
    let discovery = Discovery::new(client.clone())
        .filter(&[GROUP])
        .run()
        .await
        .context("discovering the stateward kinds")?;
    let mut found = Vec::new();
    let mut kinds = Vec::new();
    for group in discovery.groups() {
        for (resource, caps) in group.recommended_resources() {
            if caps.scope != Scope::Namespaced || resource.plural.contains('/') {
                continue;
            }
            kinds.push(resource.kind.clone());
            let matches = kind.is_none_or(|k| {
                k.eq_ignore_ascii_case(&resource.kind)
                    || k.eq_ignore_ascii_case(&resource.plural)
                    || k.eq_ignore_ascii_case(resource.plural.trim_end_matches('s'))
            });
            if !matches {
                continue;
            }
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
            if let Some(object) =
                api.get_opt(name).await.with_context(|| format!("reading {} {name}", resource.kind))?
            {
                found.push(Target { api, resource, object });
            }
        }
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        0 if kinds.is_empty() => bail!("the API server serves no {GROUP} kinds: is stateward installed?"),
        0 => bail!(
            "no {} named {name:?} in namespace {namespace:?}",
            kind.map_or_else(|| kinds.join(", "), str::to_string)
        ),
        _ => {
            let all: Vec<String> = found.iter().map(|t| t.resource.kind.clone()).collect();
            bail!("{name:?} names a {}: say which with --kind", all.join(" and a "))
        }
    }
}

/// Merge-patches the resource and reports what the API server (and its admission webhook,
/// which runs the plugin's checks) said.
async fn patch(target: &Target, patch: Value) -> anyhow::Result<()> {
    target
        .api
        .patch(&target.name(), &PatchParams::apply(FIELD_MANAGER), &Patch::Merge(&patch))
        .await
        .map_err(|e| match e {
            kube::Error::Api(s) => anyhow::anyhow!("{} refused: {}", target.describe(), s.message),
            other => anyhow::Error::new(other).context(format!("patching {}", target.describe())),
        })?;
    Ok(())
}

/// `pause` / `resume`: sets `spec.paused`.
pub async fn set_paused(target: &Target, paused: bool) -> anyhow::Result<String> {
    patch(target, json!({ "spec": { "paused": paused } })).await?;
    Ok(if paused {
        format!("{} paused: the operator changes nothing of it until `resume`", target.describe())
    } else {
        format!("{} resumed", target.describe())
    })
}

/// `hibernate` / `wake`: sets `spec.hibernate`.
pub async fn set_hibernate(target: &Target, hibernate: bool) -> anyhow::Result<String> {
    patch(target, json!({ "spec": { "hibernate": hibernate } })).await?;
    Ok(if hibernate {
        format!(
            "{} hibernating: every pod stops, the volumes and Secrets stay; `wake` starts them again",
            target.describe()
        )
    } else {
        format!("{} waking: the pods start again on their volumes", target.describe())
    })
}

/// `restart`: a new [`RESTARTED_AT_ANNOTATION`]; the plugin rolls the members in its order.
pub async fn restart(target: &Target, now: &str) -> anyhow::Result<String> {
    patch(target, json!({ "metadata": { "annotations": { RESTARTED_AT_ANNOTATION: now } } })).await?;
    Ok(format!("{} restart requested at {now}: members roll one at a time", target.describe()))
}

/// `promote`: asks for a switchover to `pod`, which must be a member of the resource.
pub async fn promote(client: &Client, target: &Target, pod: &str) -> anyhow::Result<String> {
    member(client, target, pod).await?;
    let name = target.name();
    patch(target, json!({ "metadata": { "annotations": { SWITCHOVER_ANNOTATION: pod } } })).await?;
    Ok(format!(
        "{}: switchover to {pod} requested; `kubectl stateward status {name}` follows it",
        target.describe()
    ))
}

/// The pods `annotations` fence, as the plugins read [`FENCED_ANNOTATION`] (a JSON list of pod
/// names). An unreadable value is an error naming the annotation, not an empty list: `fence`
/// would otherwise write over what a user put there.
fn fenced(annotations: &BTreeMap<String, String>) -> anyhow::Result<Vec<String>> {
    let Some(text) = annotations.get(FENCED_ANNOTATION) else { return Ok(Vec::new()) };
    serde_json::from_str(text).with_context(|| {
        format!(
            "metadata.annotations[{FENCED_ANNOTATION}] is {text:?}, not a JSON list of pod names such as \
             [\"db-1\"]: correct it, or `unfence` with no pod to clear it"
        )
    })
}

/// The annotation's new value: the list as JSON text, or null (removed) when no pod is fenced.
fn fenced_value(list: &[String]) -> anyhow::Result<Value> {
    Ok(if list.is_empty() { Value::Null } else { json!(serde_json::to_string(list)?) })
}

/// `fence`: adds `pods`, each a member of the resource, to [`FENCED_ANNOTATION`].
pub async fn fence(client: &Client, target: &Target, pods: &[String]) -> anyhow::Result<String> {
    let mut list = fenced(target.object.annotations())?;
    for pod in pods {
        member(client, target, pod).await?;
    }
    list.extend(pods.iter().cloned());
    list.sort();
    list.dedup();
    set_fenced(target, &list).await?;
    Ok(format!(
        "{}: {} fenced: out of every client Service, the pod kept for inspection; `unfence` brings it back",
        target.describe(),
        pods.join(", ")
    ))
}

/// `unfence`: takes `pods` (every pod when empty, whatever the annotation holds) off
/// [`FENCED_ANNOTATION`].
pub async fn unfence(target: &Target, pods: &[String]) -> anyhow::Result<String> {
    let list: Vec<String> = if pods.is_empty() {
        Vec::new()
    } else {
        fenced(target.object.annotations())?.into_iter().filter(|p| !pods.contains(p)).collect()
    };
    set_fenced(target, &list).await?;
    Ok(if list.is_empty() {
        format!("{}: no pod fenced", target.describe())
    } else {
        format!("{}: still fenced: {}", target.describe(), list.join(", "))
    })
}

async fn set_fenced(target: &Target, list: &[String]) -> anyhow::Result<()> {
    let body = fence_patch(target.object.resource_version().as_deref(), list)?;
    patch(target, body).await.map_err(|e| {
        if format!("{e:#}").contains("the object has been modified") {
            e.context(format!("{FENCED_ANNOTATION} changed since it was read: run the command again"))
        } else {
            e
        }
    })
}

/// The patch that sets the fenced list over the version read (`resource_version`): a list
/// someone changed meanwhile is refused by the API server (409), never written over.
fn fence_patch(resource_version: Option<&str>, list: &[String]) -> anyhow::Result<Value> {
    let mut metadata = json!({ "annotations": { FENCED_ANNOTATION: fenced_value(list)? } });
    if let Some(v) = resource_version {
        metadata["resourceVersion"] = json!(v);
    }
    Ok(json!({ "metadata": metadata }))
}

/// `text` for a terminal: control characters (escape sequences, carriage returns, newlines
/// that would forge lines) shown as `\u{…}`. Plugins and users write what `status` prints.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { format!("\\u{{{:x}}}", c as u32) } else { c.to_string() })
        .collect()
}

/// The component every Event of the operator names as its reporter; an Event from another
/// reporter is shown as such, never among the policy's decisions.
const REPORTER: &str = "stateward";

/// Fails unless `pod` is a pod of the resource.
async fn member(client: &Client, target: &Target, pod: &str) -> anyhow::Result<()> {
    let namespace = target.object.namespace().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let found = pods.get_opt(pod).await.with_context(|| format!("reading pod {pod}"))?;
    match found {
        Some(p) if p.labels().get(INSTANCE_LABEL) == Some(&target.name()) => Ok(()),
        Some(_) => bail!("pod {pod} is not a member of {}", target.describe()),
        None => bail!("no pod {pod} in namespace {namespace:?}"),
    }
}

/// `status`: phase, conditions, the service's own status fields (roles, lag…), the policy's
/// decisions about it and its last Events.
pub async fn status(client: &Client, target: &Target) -> anyhow::Result<String> {
    let namespace = target.object.namespace().unwrap_or_default();
    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    let selector =
        format!("involvedObject.name={},involvedObject.kind={}", target.name(), target.resource.kind);
    let mut list =
        events.list(&ListParams::default().fields(&selector)).await.context("listing Events")?.items;
    list.sort_by_key(|e| e.last_timestamp.clone().map(|t| t.0).or(e.event_time.clone().map(|t| t.0)));
    let object = serde_json::to_value(&target.object)?;
    let status = object.get("status").cloned().unwrap_or(Value::Null);
    Ok(render_status(&target.describe(), &object, &status, &list))
}

fn render_status(title: &str, object: &Value, status: &Value, events: &[Event]) -> String {
    let mut out = String::new();
    let text = |v: &Value| printable(&v.as_str().map_or_else(|| v.to_string(), str::to_string));
    let _ = writeln!(out, "{}", printable(title));
    let _ = writeln!(
        out,
        "  phase {}   plugin {}   observed generation {} of {}",
        status.get("phase").map_or_else(|| "-".into(), text),
        status.get("plugin").map_or_else(|| "-".into(), text),
        status.get("observedGeneration").map_or_else(|| "-".into(), text),
        object.pointer("/metadata/generation").map_or_else(|| "-".into(), text),
    );
    if object.pointer("/spec/paused") == Some(&json!(true)) {
        let _ = writeln!(out, "  paused: the operator changes nothing until `kubectl stateward resume`");
    }
    if object.pointer("/spec/hibernate") == Some(&json!(true)) {
        let _ = writeln!(out, "  hibernate: no pod runs, the data stays, until `kubectl stateward wake`");
    }
    let _ = writeln!(out, "\nConditions:");
    for c in status.get("conditions").and_then(Value::as_array).into_iter().flatten() {
        let _ = writeln!(
            out,
            "  {:<18} {:<8} {:<24} {}",
            text(&c["type"]),
            text(&c["status"]),
            text(&c["reason"]),
            text(&c["message"])
        );
    }
    let own: serde_json::Map<String, Value> = status
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| {
            !["phase", "conditions", "observedGeneration", "plugin", "pluginDigest"].contains(&k.as_str())
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if !own.is_empty() {
        let _ = writeln!(out, "\nService status (roles, lag, health, as the plugin observes them):");
        let yaml = yaml_serde::to_string(&own).unwrap_or_default();
        for line in yaml.lines() {
            let _ = writeln!(out, "  {}", printable(line));
        }
    }
    let line = |e: &Event| {
        let when = e
            .last_timestamp
            .as_ref()
            .map(|t| t.0.to_string())
            .or(e.event_time.as_ref().map(|t| t.0.to_string()));
        let from = match e.reporting_component.as_deref() {
            Some(REPORTER) => String::new(),
            other => format!(" [reported by {}, not the operator]", printable(other.unwrap_or("no one"))),
        };
        format!(
            "  {:<20} {:<8} {:<22} {} (x{}){from}",
            when.unwrap_or_default(),
            printable(e.type_.as_deref().unwrap_or_default()),
            printable(e.reason.as_deref().unwrap_or_default()),
            printable(e.message.as_deref().unwrap_or_default()),
            e.count.unwrap_or(1)
        )
    };
    let policy: Vec<&Event> = events
        .iter()
        .filter(|e| e.reason.as_deref().is_some_and(|r| r.starts_with("Policy")))
        .filter(|e| e.reporting_component.as_deref() == Some(REPORTER))
        .collect();
    let _ = writeln!(out, "\nPolicy decisions (denials and warnings; every decision is in the audit log):");
    if policy.is_empty() {
        let _ = writeln!(out, "  none recorded as Events");
    }
    for e in policy.iter().rev().take(STATUS_EVENTS).rev() {
        let _ = writeln!(out, "{}", line(e));
    }
    let _ = writeln!(out, "\nEvents (last {STATUS_EVENTS}):");
    for e in events.iter().rev().take(STATUS_EVENTS).rev() {
        let _ = writeln!(out, "{}", line(e));
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn event(reason: &str, message: &str) -> Event {
        Event {
            reason: Some(reason.into()),
            message: Some(message.into()),
            type_: Some("Normal".into()),
            reporting_component: Some(REPORTER.into()),
            ..Event::default()
        }
    }

    /// [hardening-2] 9: what plugins and users wrote reaches the terminal without its control
    /// characters, and a `Policy*` Event someone else posted is not shown as a decision.
    #[test]
    fn status_prints_no_control_characters_and_no_forged_decisions() {
        let object = json!({"metadata": {"generation": 1}});
        let status = json!({
            "phase": "Running\u{1b}[2J",
            "conditions": [{"type": "Available", "status": "True", "reason": "Ok", "message": "fine\r\nPolicyDenied: forged line"}],
            "note": "\u{1b}]0;title\u{7}",
        });
        let mut forged = event("PolicyDenied", "privileged: the operator denied nothing");
        forged.reporting_component = Some("mallory".into());
        let text = render_status("PostgresCluster db/main\u{1b}[31m", &object, &status, &[forged]);
        assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "{text:?}");
        assert!(
            text.contains("Running\\u{1b}[2J") && text.contains("fine\\u{d}\\u{a}PolicyDenied"),
            "{text}"
        );
        let policy = text.split("Policy decisions").nth(1).unwrap().split("Events (last").next().unwrap();
        assert!(policy.contains("none recorded") && !policy.contains("forged"), "{text}");
        assert!(text.contains("[reported by mallory, not the operator]"), "{text}");
    }

    /// [hardening-2] 9: `fence` writes over the version it read, so a list changed meanwhile is
    /// refused by the API server instead of lost.
    #[test]
    fn the_fence_patch_carries_the_version_it_read() {
        let patch = fence_patch(Some("42"), &["db-1".to_string()]).unwrap();
        assert_eq!(patch["metadata"]["resourceVersion"], "42");
        assert_eq!(patch["metadata"]["annotations"][FENCED_ANNOTATION], "[\"db-1\"]");
        assert_eq!(
            fence_patch(Some("7"), &[]).unwrap()["metadata"]["annotations"][FENCED_ANNOTATION],
            Value::Null
        );
    }

    /// The host cannot use the sdk (it knows no service), so the annotation's format is written
    /// in both: what `fence` writes is what every plugin reads, and what a plugin refuses the
    /// host refuses too.
    #[test]
    fn the_fence_annotation_is_written_as_the_plugins_read_it_and_bad_values_are_refused() {
        assert_eq!(FENCED_ANNOTATION, stateward_sdk::fence::FENCED_ANNOTATION);
        let list = vec!["db-0".to_string(), "db-2".to_string()];
        let value = fenced_value(&list).unwrap();
        let object = json!({"metadata": {"annotations": {FENCED_ANNOTATION: value}}});
        let mut errs = Vec::new();
        assert_eq!(stateward_sdk::fence::parse(&object, &mut errs), list);
        assert!(errs.is_empty(), "{errs:?}");
        let annotations =
            BTreeMap::from([(FENCED_ANNOTATION.to_string(), value.as_str().unwrap().to_string())]);
        assert_eq!(fenced(&annotations).unwrap(), list);
        assert_eq!(fenced(&BTreeMap::new()).unwrap(), Vec::<String>::new());
        assert_eq!(fenced_value(&[]).unwrap(), Value::Null);

        let bad = BTreeMap::from([(FENCED_ANNOTATION.to_string(), "db-1".to_string())]);
        let err = format!("{:#}", fenced(&bad).unwrap_err());
        assert!(
            err.contains("metadata.annotations[stateward.dev/fenced-instances]") && err.contains("\"db-1\""),
            "{err}"
        );
        let object = json!({"metadata": {"annotations": {FENCED_ANNOTATION: "db-1"}}});
        stateward_sdk::fence::parse(&object, &mut errs);
        assert_eq!(errs.len(), 1, "the plugins refuse it too: {errs:?}");
    }

    #[test]
    fn status_shows_conditions_service_fields_policy_and_events() {
        let object = json!({"metadata": {"generation": 4}, "spec": {"paused": true}});
        let status = json!({
            "phase": "Running", "plugin": "postgres@1", "observedGeneration": 4, "pluginDigest": "sha256:x",
            "conditions": [{"type": "Available", "status": "True", "reason": "AllReplicasReady", "message": "3 of 3"}],
            "currentPrimary": "main-1",
        });
        let events =
            [event("PhaseChanged", "phase Pending -> Running"), event("PolicyWarning", "single replica")];
        let text = render_status("PostgresCluster db/main", &object, &status, &events);
        assert!(text.contains("phase Running   plugin postgres@1   observed generation 4 of 4"), "{text}");
        assert!(text.contains("paused:"), "{text}");
        assert!(text.contains("Available") && text.contains("AllReplicasReady"), "{text}");
        assert!(text.contains("currentPrimary: main-1"), "{text}");
        assert!(!text.contains("pluginDigest"), "{text}");
        let policy = text.split("Policy decisions").nth(1).unwrap().split("Events (last").next().unwrap();
        assert!(policy.contains("single replica") && !policy.contains("Pending -> Running"), "{text}");
        assert!(text.split("Events (last").nth(1).unwrap().contains("Pending -> Running"), "{text}");
    }
}
