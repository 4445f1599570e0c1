//! Status derivation from the observed StatefulSet: phase, conditions, events, requeue.

use serde_json::Value;

use crate::json::{at, i64_at, str_at};
use crate::spec::Cluster;
use crate::types::{Condition, ConditionStatus, Event, EventType, Phase};

/// Requeue while something is still moving.
pub const REQUEUE_PROGRESSING_MS: u64 = 10_000;
/// Requeue while converged but not every replica is ready.
pub const REQUEUE_DEGRADED_MS: u64 = 30_000;

/// What the plugin concluded about the cluster's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Derived {
    pub phase: Phase,
    pub conditions: Vec<Condition>,
    pub ready_replicas: i64,
    pub requeue_after_ms: Option<u64>,
}

/// Finds a child by kind and name.
pub fn find_child<'a>(children: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    children
        .iter()
        .find(|c| str_at(c, &["kind"]) == Some(kind) && str_at(c, &["metadata", "name"]) == Some(name))
}

/// The StatefulSets of a cluster's member sets read as one, for [`derive`]: counts summed, a
/// roll or a generation not yet observed in any set is one of the whole. `None` while any set
/// does not exist yet.
pub fn combine(sets: &[Option<&Value>]) -> Option<Value> {
    let sets: Vec<&Value> = sets.iter().copied().collect::<Option<_>>()?;
    let (first, rest) = sets.split_first()?;
    if rest.is_empty() {
        return Some((*first).clone());
    }
    let sum = |path: &[&str]| sets.iter().map(|s| i64_at(s, path).unwrap_or(0)).sum::<i64>();
    let rolling = sets.iter().any(|s| {
        let update = str_at(s, &["status", "updateRevision"]);
        update.is_some() && str_at(s, &["status", "currentRevision"]) != update
    });
    let lagging = sets.iter().any(|s| {
        i64_at(s, &["status", "observedGeneration"]).unwrap_or(0)
            < i64_at(s, &["metadata", "generation"]).unwrap_or(0)
    });
    let mut out = (*first).clone();
    let odd = sets.iter().find(|s| image(s) != image(first)).copied().unwrap_or(first);
    out["spec"]["template"] = odd["spec"]["template"].clone();
    out["spec"]["replicas"] = serde_json::json!(sum(&["spec", "replicas"]));
    out["metadata"]["generation"] = serde_json::json!(1);
    out["status"] = serde_json::json!({
        "replicas": sum(&["status", "replicas"]),
        "readyReplicas": sum(&["status", "readyReplicas"]),
        "updatedReplicas": sum(&["status", "updatedReplicas"]),
        "observedGeneration": if lagging { 0 } else { 1 },
        "currentRevision": "current",
        "updateRevision": if rolling { "update" } else { "current" },
    });
    Some(out)
}

/// The image of a StatefulSet's first container.
fn image(sts: &Value) -> Option<&str> {
    at(sts, &["spec", "template", "spec", "containers"])
        .and_then(|c| c.get(0))
        .and_then(|c| str_at(c, &["image"]))
}

pub(crate) fn cond(type_: &str, status: ConditionStatus, reason: &str, message: String) -> Condition {
    Condition { type_: type_.into(), status, reason: reason.into(), message }
}

/// Derives the status from the observed StatefulSet (if any) and the image the plan wants.
pub fn derive(cluster: &Cluster, sts: Option<&Value>, desired_image: &str) -> Derived {
    use ConditionStatus::{False, True};
    let desired = cluster.spec.replicas;
    let Some(sts) = sts else {
        let phase = if cluster.deleting { Phase::Deleting } else { Phase::Pending };
        return Derived {
            phase,
            conditions: vec![
                cond("Available", False, "StatefulSetMissing", "the StatefulSet does not exist yet".into()),
                cond("Progressing", True, "Creating", format!("creating {desired} replicas")),
                cond("Degraded", False, "AsExpected", "nothing has failed".into()),
            ],
            ready_replicas: 0,
            requeue_after_ms: Some(REQUEUE_PROGRESSING_MS),
        };
    };
    let spec_replicas = i64_at(sts, &["spec", "replicas"]).unwrap_or(1);
    let replicas = i64_at(sts, &["status", "replicas"]).unwrap_or(0);
    let ready = i64_at(sts, &["status", "readyReplicas"]).unwrap_or(0);
    let updated = i64_at(sts, &["status", "updatedReplicas"]).unwrap_or(0);
    let current_rev = str_at(sts, &["status", "currentRevision"]);
    let update_rev = str_at(sts, &["status", "updateRevision"]);
    let generation = i64_at(sts, &["metadata", "generation"]).unwrap_or(0);
    let seen_generation = i64_at(sts, &["status", "observedGeneration"]).unwrap_or(0);
    let image = image(sts);
    let creating = matches!(cluster.last_phase.as_deref(), None | Some("Pending"));
    // A rollout replaces pods one at a time, so the pod count dips while it runs: look at
    // revisions and images before counting replicas, or an upgrade reads as scaling.
    // Only revisions tell a rollout: pod counts (updatedReplicas among them) move while
    // pods are added or removed too.
    // Under `OnDelete` the StatefulSet controller (before Kubernetes 1.36) never moves
    // currentRevision to updateRevision: there, every pod on the update revision ends the roll.
    let on_delete = str_at(sts, &["spec", "updateStrategy", "type"]) == Some("OnDelete");
    let revisions_differ = update_rev.is_some() && current_rev != update_rev;
    // The pod such a roll has just deleted is missing from the count until it is made again:
    // while the phase already says Upgrading, that gap is the roll's, not a scale.
    let roll_gap = on_delete
        && revisions_differ
        && replicas < desired
        && cluster.last_phase.as_deref() == Some("Upgrading");
    let rolling =
        image != Some(desired_image) || (revisions_differ && (!on_delete || updated < replicas)) || roll_gap;
    let generation_lag = seen_generation < generation;

    let (phase, reason, message) = if cluster.deleting {
        (Phase::Deleting, "Deleting", "the cluster is being deleted".to_string())
    } else if spec_replicas != desired {
        (Phase::Scaling, "Scaling", format!("scaling from {replicas} to {desired} replicas"))
    } else if creating && (ready < desired || generation_lag) {
        (Phase::Pending, "Creating", format!("{ready} of {desired} replicas ready"))
    } else if rolling {
        (Phase::Upgrading, "RollingUpdate", format!("{updated} of {desired} replicas updated"))
    } else if generation_lag {
        // The StatefulSet controller has not looked at the last change yet. A pod count
        // away from the target means scaling; otherwise keep the phase that change started
        // (the resource read here may predate our own last status write).
        if replicas != desired || cluster.last_phase.as_deref() == Some("Scaling") {
            (Phase::Scaling, "Scaling", format!("scaling from {replicas} to {desired} replicas"))
        } else {
            (Phase::Upgrading, "RollingUpdate", format!("{updated} of {desired} replicas updated"))
        }
    } else if replicas != desired {
        (Phase::Scaling, "Scaling", format!("scaling from {replicas} to {desired} replicas"))
    } else {
        (Phase::Running, "Converged", format!("{ready} of {desired} replicas ready"))
    };
    let progressing = phase != Phase::Running;
    let degraded = phase == Phase::Running && ready < desired;
    let available = if ready >= desired {
        cond("Available", True, "AllReplicasReady", format!("{ready} of {desired} replicas ready"))
    } else if ready > 0 {
        cond("Available", True, "SomeReplicasReady", format!("{ready} of {desired} replicas ready"))
    } else {
        cond("Available", False, "NoReplicasReady", format!("0 of {desired} replicas ready"))
    };
    let progressing_c = if progressing {
        cond("Progressing", True, reason, message)
    } else {
        cond("Progressing", False, "Converged", message)
    };
    let degraded_c = if degraded {
        cond(
            "Degraded",
            True,
            "ReplicasNotReady",
            format!("{} of {desired} replicas not ready", desired - ready),
        )
    } else {
        cond("Degraded", False, "AsExpected", "nothing has failed".into())
    };
    Derived {
        phase,
        conditions: vec![available, progressing_c, degraded_c],
        ready_replicas: ready,
        requeue_after_ms: if progressing {
            Some(REQUEUE_PROGRESSING_MS)
        } else if degraded {
            Some(REQUEUE_DEGRADED_MS)
        } else {
            None
        },
    }
}

/// The status of a CR whose spec cannot be used: phase Failed, Degraded/InvalidSpec.
pub fn invalid_spec(message: String) -> Derived {
    use ConditionStatus::{False, True, Unknown};
    Derived {
        phase: Phase::Failed,
        conditions: vec![
            cond("Available", Unknown, "InvalidSpec", "the spec cannot be reconciled".into()),
            cond("Progressing", False, "InvalidSpec", "waiting for a valid spec".into()),
            cond("Degraded", True, "InvalidSpec", message),
        ],
        ready_replicas: 0,
        requeue_after_ms: None,
    }
}

/// An Event when the phase changes from the one last written.
pub fn phase_event(last: Option<&str>, phase: Phase) -> Option<Event> {
    if last == Some(phase.as_str()) {
        return None;
    }
    Some(Event {
        type_: if phase == Phase::Failed { EventType::Warning } else { EventType::Normal },
        reason: "PhaseChanged".into(),
        message: format!("phase {} -> {}", last.unwrap_or("(none)"), phase.as_str()),
    })
}

/// The condition a paused resource carries.
pub const PAUSED_CONDITION: &str = "Paused";

/// The condition a hibernating resource carries: False while its pods stop, True once none runs.
pub const HIBERNATED_CONDITION: &str = "Hibernated";

/// The condition `type_` in the status as last written.
fn written_condition<'a>(status: Option<&'a Value>, type_: &str) -> Option<&'a Value> {
    status
        .and_then(|s| s.get("conditions"))
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
}

/// The status (`True`, `False`…) of the condition `type_` in the status as last written.
pub fn condition_status<'a>(status: Option<&'a Value>, type_: &str) -> Option<&'a str> {
    written_condition(status, type_).and_then(|c| c["status"].as_str())
}

/// The message of the condition `type_` in the status as last written.
pub fn condition_message<'a>(status: Option<&'a Value>, type_: &str) -> Option<&'a str> {
    written_condition(status, type_).and_then(|c| c["message"].as_str())
}

/// The reason of the condition `type_` in the status as last written.
pub fn condition_reason<'a>(status: Option<&'a Value>, type_: &str) -> Option<&'a str> {
    written_condition(status, type_).and_then(|c| c["reason"].as_str())
}

/// Whether the status as last written says the resource is paused.
pub fn was_paused(status: Option<&Value>) -> bool {
    condition_status(status, PAUSED_CONDITION) == Some("True")
}

/// The status fields as last written other than those the host writes itself on every status
/// write: what the plugin observed and decided last (roles, formation, a switchover…).
pub fn kept_fields(status: Option<&Value>) -> serde_json::Map<String, Value> {
    let mut extra = status.and_then(Value::as_object).cloned().unwrap_or_default();
    for key in ["phase", "conditions", "observedGeneration", "pluginDigest", "requests"] {
        extra.remove(key);
    }
    extra
}

/// What a paused resource reports: the status as last written (phase, conditions, service
/// fields), plus `Paused=True`, so a reader sees both the last known state and why a spec
/// change is not taking effect. Returns the phase, the conditions and the extra fields.
pub fn paused(status: Option<&Value>) -> (Phase, Vec<Condition>, serde_json::Map<String, Value>) {
    let phase = status
        .and_then(|s| s.get("phase"))
        .and_then(Value::as_str)
        .and_then(|p| Phase::ALL.into_iter().find(|known| known.as_str() == p))
        .unwrap_or(Phase::Pending);
    let mut conditions: Vec<Condition> = status
        .and_then(|s| s.get("conditions"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|c| c["type"] != PAUSED_CONDITION)
        .filter_map(|c| {
            let status = match c.get("status")?.as_str()? {
                "True" => ConditionStatus::True,
                "False" => ConditionStatus::False,
                _ => ConditionStatus::Unknown,
            };
            Some(cond(
                c.get("type")?.as_str()?,
                status,
                c["reason"].as_str().unwrap_or(""),
                c["message"].as_str().unwrap_or("").into(),
            ))
        })
        .collect();
    conditions.push(cond(
        PAUSED_CONDITION,
        ConditionStatus::True,
        "SpecPaused",
        "spec.paused is true: the operator changes nothing until it is false".into(),
    ));
    (phase, conditions, kept_fields(status))
}
