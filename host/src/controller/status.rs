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
/// from the audit sweep, if any; `now` is RFC 3339. With no finding of this process's sweep
/// yet (a new leader: an operator restarted or upgraded), the `PolicyCompliant` condition the
/// status holds stays as it is until the sweep decides: dropping it would take two writes, and
/// a new transition time, to come back to the same verdict.
pub fn desired(
    resource: &Value,
    report: &StatusReport,
    host: Option<&Condition>,
    plugin: &PluginStamp<'_>,
    now: &str,
) -> Value {
    let previous = resource.pointer("/status/conditions").and_then(Value::as_array);
    let held = if host.is_none() { previous.and_then(|p| held_condition(p, SWEEP_CONDITION)) } else { None };
    let host = host.or(held.as_ref());
    let generation = resource.pointer("/metadata/generation").cloned().unwrap_or(json!(0));
    let conditions: Vec<Value> = report
        .conditions
        .iter()
        .filter(|c| host.is_none_or(|h| h.type_ != c.type_))
        .chain(host)
        .map(|c| condition(c, previous, now, &generation))
        .collect();
    let mut status = match &report.extra {
        Value::Object(map) => map.clone(),
        _ => Map::new(),
    };
    status.insert("phase".into(), json!(phase_word(report.phase)));
    status.insert("conditions".into(), Value::Array(conditions));
    status.insert("observedGeneration".into(), generation);
    status.insert("plugin".into(), json!(format!("{}@{}", plugin.name, plugin.version)));
    status.insert("pluginDigest".into(), json!(format!("sha256:{}", plugin.digest)));
    // The host's own records are kept as they are, whatever the plugin reported under their
    // names: a plugin never writes the one-shot ledger.
    for key in HOST_KEYS {
        match resource.pointer(&format!("/status/{key}")) {
            Some(kept) => status.insert((*key).into(), kept.clone()),
            None => status.remove(*key),
        };
    }
    Value::Object(status)
}

/// Keys of `.status` the host writes apart from the reconcile's status: the one-shot requests'
/// ledger (requests/durable.rs).
pub const HOST_KEYS: &[&str] = &["requests"];

/// The JSON merge patch (RFC 7386) that turns `current` into `desired`: what changed, and
/// `null` for every key `desired` no longer has, at any depth (a plain merge of `desired` would
/// keep a field the plugin stopped reporting, such as an error that has cleared, forever).
pub fn merge_patch(current: Option<&Value>, desired: &Value) -> Value {
    match (current, desired) {
        (Some(Value::Object(old)), Value::Object(new)) => {
            let mut patch = Map::new();
            for (key, value) in new {
                if old.get(key) != Some(value) {
                    patch.insert(key.clone(), merge_patch(old.get(key), value));
                }
            }
            for key in old.keys().filter(|k| !new.contains_key(*k)) {
                patch.insert(key.clone(), Value::Null);
            }
            Value::Object(patch)
        }
        // Nothing stored there (or no object): the object is written whole, without the nulls
        // that would only say "absent".
        (_, Value::Object(new)) => Value::Object(
            new.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), merge_patch(None, v)))
                .collect(),
        ),
        (_, other) => other.clone(),
    }
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
    let mut conditions: Vec<Value> =
        previous.map(|p| p.iter().filter(|c| c["type"] != "Degraded").cloned().collect()).unwrap_or_default();
    let generation = resource.pointer("/metadata/generation").cloned().unwrap_or(json!(0));
    conditions.push(condition(&degraded, previous, now, &generation));
    status["conditions"] = Value::Array(conditions);
    status["observedGeneration"] = generation;
    status
}

/// The condition the audit sweep writes (controller/sweep.rs).
pub const SWEEP_CONDITION: &str = "PolicyCompliant";

/// The stored condition of `type_`, as a condition to write again unchanged.
fn held_condition(previous: &[Value], type_: &str) -> Option<Condition> {
    let c = previous.iter().find(|c| c["type"] == type_)?;
    let status = match c["status"].as_str()? {
        "True" => ConditionStatus::True,
        "False" => ConditionStatus::False,
        _ => ConditionStatus::Unknown,
    };
    let text = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    Some(Condition { type_: type_.into(), status, reason: text("reason"), message: text("message") })
}

/// A condition as written: its transition time kept while its status stays, and the
/// generation of the spec it was decided for (a reader can tell a stale verdict).
fn condition(c: &Condition, previous: Option<&Vec<Value>>, now: &str, generation: &Value) -> Value {
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
        "observedGeneration": generation,
    })
}

/// Whether writing `desired` would change the stored status.
pub fn differs(resource: &Value, desired: &Value) -> bool {
    resource.get("status") != Some(desired)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp() -> PluginStamp<'static> {
        PluginStamp { name: "p", version: "1", digest: "d" }
    }

    fn report(extra: Value) -> StatusReport {
        StatusReport { phase: Phase::Running, conditions: vec![], extra }
    }

    /// A field the plugin stops reporting goes from the stored status (it used to stay: an
    /// error that had cleared was still shown beside the healthy answer, and the status was
    /// written again on every reconcile, since it never matched).
    #[test]
    fn a_field_the_plugin_no_longer_reports_is_removed() {
        let stored = json!({"status": {
            "phase": "Running", "conditions": [], "observedGeneration": 0, "plugin": "p@1", "pluginDigest": "sha256:d",
            "clusterHealth": {"status": "red", "error": "connecting: refused", "nodes": 0},
            "gone": 1,
        }});
        let desired = desired(
            &stored,
            &report(json!({"clusterHealth": {"status": "green", "nodes": 1}})),
            None,
            &stamp(),
            "now",
        );
        assert!(differs(&stored, &desired));
        let patch = merge_patch(stored.get("status"), &desired);
        assert_eq!(
            patch,
            json!({"clusterHealth": {"status": "green", "error": null, "nodes": 1}, "gone": null})
        );
        let mut written = stored["status"].clone();
        json_patch::merge(&mut written, &patch);
        assert_eq!(written, desired, "the patch makes the stored status the desired one");
        let after = json!({"status": written});
        assert!(!differs(&after, &desired), "then nothing to write");
    }

    /// Each condition says which generation of the spec it was decided for.
    #[test]
    fn every_condition_carries_the_generation_it_was_decided_for() {
        let resource = json!({"metadata": {"generation": 7}, "status": {}});
        let available = Condition {
            type_: "Available".into(),
            status: ConditionStatus::True,
            reason: "AllReplicasReady".into(),
            message: "3 of 3".into(),
        };
        let mut r = report(json!({}));
        r.conditions = vec![available];
        let d = desired(&resource, &r, None, &stamp(), "now");
        assert_eq!(d["conditions"][0]["observedGeneration"], 7, "{d}");
        assert_eq!(d["observedGeneration"], 7);
        let failed = degraded(&resource, "PluginFailed", "trap", "now");
        assert_eq!(failed["conditions"][0]["observedGeneration"], 7, "{failed}");
    }

    /// A new leader has no sweep finding yet: the stored verdict stays, transition time and all,
    /// so a restarted operator writes nothing; a finding replaces it.
    #[test]
    fn the_sweeps_last_verdict_holds_until_the_sweep_decides() {
        let verdict = json!({"type": "PolicyCompliant", "status": "False", "reason": "PolicyViolation",
                             "message": "no-latest: image tag latest", "lastTransitionTime": "then",
                             "observedGeneration": 0});
        let stored = json!({"status": {
            "phase": "Running", "conditions": [verdict], "observedGeneration": 0, "plugin": "p@1", "pluginDigest": "sha256:d",
        }});
        let d = desired(&stored, &report(json!({})), None, &stamp(), "now");
        assert!(!differs(&stored, &d), "nothing to write: {d}");
        let compliant = Condition {
            type_: SWEEP_CONDITION.into(),
            status: ConditionStatus::True,
            reason: "Compliant".into(),
            message: "admitted".into(),
        };
        let d = desired(&stored, &report(json!({})), Some(&compliant), &stamp(), "now");
        assert_eq!(d["conditions"][0]["status"], "True");
        assert_eq!(d["conditions"][0]["lastTransitionTime"], "now");
        // Never held from nothing.
        let bare = json!({"status": {"phase": "Running", "conditions": []}});
        assert_eq!(desired(&bare, &report(json!({})), None, &stamp(), "now")["conditions"], json!([]));
    }

    /// The one-shot ledger is the host's: kept through the reconcile's status, never taken from
    /// what the plugin reports.
    #[test]
    fn the_one_shot_ledger_is_kept_and_never_the_plugins() {
        let ledger = json!({"promote": {"state": "Sent", "sentAtMs": 5}});
        let stored = json!({"status": {"phase": "Running", "requests": ledger}});
        let forged = report(json!({"requests": {"promote": {"state": "Answered", "code": 0}}}));
        let d = desired(&stored, &forged, None, &stamp(), "now");
        assert_eq!(d["requests"], ledger);
        assert!(merge_patch(stored.get("status"), &d).get("requests").is_none(), "left alone");
        let fresh = desired(&json!({}), &forged, None, &stamp(), "now");
        assert!(fresh.get("requests").is_none(), "a plugin cannot start a ledger: {fresh}");
    }
}
