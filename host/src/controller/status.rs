//! The status the host writes: the plugin's phase, conditions and extras, plus the host-owned
//! `observedGeneration`, `plugin` and each condition's `lastTransitionTime`, which changes
//! only when that condition's status changes.

use serde_json::{json, Map, Value};

use crate::runtime::{Condition, ConditionStatus, Phase, StatusReport};

fn status_word(s: ConditionStatus) -> &'static str {
    match s {
        ConditionStatus::True => "True",
        ConditionStatus::False => "False",
        ConditionStatus::Unknown => "Unknown",
    }
}

pub fn phase_word(p: Phase) -> &'static str {
    match p {
        Phase::Pending => "Pending",
        Phase::Running => "Running",
        Phase::Scaling => "Scaling",
        Phase::Upgrading => "Upgrading",
        Phase::Failed => "Failed",
        Phase::Deleting => "Deleting",
    }
}

/// Who computed the status: shown as `status.plugin` (name@version) and `status.pluginDigest`.
pub struct PluginStamp<'a> {
    pub name: &'a str,
    pub version: &'a str,
    pub digest: &'a str,
}

/// The full `.status` for `resource` given the plugin's report and the host's own condition
/// from the audit sweep, if any; `now` is RFC 3339.
pub fn desired(resource: &Value, report: &StatusReport, host: Option<&Condition>, plugin: &PluginStamp<'_>, now: &str) -> Value {
    let previous = resource.pointer("/status/conditions").and_then(Value::as_array);
    let conditions: Vec<Value> = report
        .conditions
        .iter()
        .filter(|c| host.is_none_or(|h| h.type_ != c.type_))
        .chain(host)
        .map(|c| condition(c, previous, now))
        .collect();
    let mut status = match &report.extra {
        Value::Object(map) => map.clone(),
        _ => Map::new(),
    };
    status.insert("phase".into(), json!(phase_word(report.phase)));
    status.insert("conditions".into(), Value::Array(conditions));
    status.insert(
        "observedGeneration".into(),
        resource.pointer("/metadata/generation").cloned().unwrap_or(json!(0)),
    );
    status.insert("plugin".into(), json!(format!("{}@{}", plugin.name, plugin.version)));
    status.insert("pluginDigest".into(), json!(format!("sha256:{}", plugin.digest)));
    Value::Object(status)
}

/// A Degraded condition set by the host itself (plugin failure, policy denial), keeping the
/// rest of the current status.
pub fn degraded(resource: &Value, reason: &str, message: &str, now: &str) -> Value {
    let mut status = resource.get("status").cloned().unwrap_or_else(|| json!({}));
    if !status.is_object() {
        status = json!({});
    }
    let previous = resource.pointer("/status/conditions").and_then(Value::as_array);
    let degraded = Condition {
        type_: "Degraded".into(),
        status: ConditionStatus::True,
        reason: reason.into(),
        message: message.chars().take(1024).collect(),
    };
    let mut conditions: Vec<Value> = previous
        .map(|p| p.iter().filter(|c| c["type"] != "Degraded").cloned().collect())
        .unwrap_or_default();
    conditions.push(condition(&degraded, previous, now));
    status["conditions"] = Value::Array(conditions);
    status["observedGeneration"] = resource.pointer("/metadata/generation").cloned().unwrap_or(json!(0));
    status
}

fn condition(c: &Condition, previous: Option<&Vec<Value>>, now: &str) -> Value {
    let status = status_word(c.status);
    let since = previous
        .and_then(|p| p.iter().find(|old| old["type"] == c.type_.as_str()))
        .filter(|old| old["status"] == status)
        .and_then(|old| old.get("lastTransitionTime").cloned())
        .unwrap_or_else(|| json!(now));
    json!({
        "type": c.type_,
        "status": status,
        "reason": c.reason,
        "message": c.message,
        "lastTransitionTime": since,
    })
}

/// Whether writing `desired` would change the stored status.
pub fn differs(resource: &Value, desired: &Value) -> bool {
    resource.get("status") != Some(desired)
}
