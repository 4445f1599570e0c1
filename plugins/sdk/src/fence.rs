//! Fencing, the same for every kind: the annotation [`FENCED_ANNOTATION`] lists pods (a JSON
//! list of names) that must take no client traffic while they are kept for inspection.
//!
//! Every pod carries [`FENCED_LABEL`] (`"true"` on a fenced one, `"false"` on the others) and
//! every client Service selects `"false"`: a fenced pod leaves them all at once, and a pod made
//! again joins them once it is labelled. The headless Service keeps every pod, as it gives them
//! their names (replication and discovery go through it). What stops a fenced server from
//! writing is the plugin's (it reads [`crate::spec::Cluster::fenced`]).

use serde_json::Value;

use crate::live::PodView;
use crate::status::{cond, condition_message, condition_status};
use crate::types::{Action, Condition, ConditionStatus, Event, EventType, FieldError, PodLabels};

/// The annotation listing the pods to fence, e.g. `["pg-1"]`.
pub const FENCED_ANNOTATION: &str = "stateward.dev/fenced-instances";
/// The label every pod carries and every client Service selects `"false"` on.
pub const FENCED_LABEL: &str = "stateward.dev/fenced";
/// The condition saying which pods are fenced.
pub const FENCED_CONDITION: &str = "Fenced";
/// Longest list accepted (more names than any cluster has pods).
const MAX_FENCED: usize = 64;

fn path() -> String {
    format!("metadata.annotations[{FENCED_ANNOTATION}]")
}

/// The pods the annotation of `obj` fences, sorted, each once; an error names the annotation.
pub fn parse(obj: &Value, errs: &mut Vec<FieldError>) -> Vec<String> {
    let Some(value) = obj.pointer("/metadata/annotations").and_then(|a| a.get(FENCED_ANNOTATION)) else {
        return Vec::new();
    };
    let list: Result<Vec<String>, String> = match value.as_str() {
        Some(text) => serde_json::from_str(text).map_err(|e| e.to_string()),
        None => Err("not a string".into()),
    };
    match list {
        Ok(mut names) if names.len() <= MAX_FENCED => {
            names.sort_unstable();
            names.dedup();
            if let Some(bad) = names.iter().find(|n| n.is_empty() || n.len() > 63) {
                errs.push(FieldError::new(path(), format!("{bad:?} is not a pod name")));
            }
            names
        }
        Ok(_) => {
            errs.push(FieldError::new(path(), format!("lists more than {MAX_FENCED} pods")));
            Vec::new()
        }
        Err(why) => {
            errs.push(FieldError::new(
                path(),
                format!("must be a JSON list of pod names, e.g. [\"db-1\"] ({why})"),
            ));
            Vec::new()
        }
    }
}

/// The fenced pods that are not `members` of the cluster as specified.
pub fn check_members(fenced: &[String], members: &[String]) -> Vec<FieldError> {
    fenced
        .iter()
        .filter(|f| !members.contains(f))
        .map(|f| {
            FieldError::new(
                path(),
                format!(
                    "{f} is not a pod of this cluster ({}): unfence it first to scale it away",
                    members.join(", ")
                ),
            )
        })
        .collect()
}

/// The label changes that put each pod's [`FENCED_LABEL`] right.
pub fn labels(fenced: &[String], pods: &[PodView]) -> Vec<Action> {
    pods.iter()
        .filter(|p| !p.deleting)
        .filter_map(|p| {
            let want = if fenced.contains(&p.name) { "true" } else { "false" };
            (p.labels.get(FENCED_LABEL).map(String::as_str) != Some(want)).then(|| {
                Action::LabelPod(PodLabels {
                    pod: p.name.clone(),
                    labels: vec![(FENCED_LABEL.into(), Some(want.into()))],
                    annotations: Vec::new(),
                })
            })
        })
        .collect()
}

/// The `Fenced` condition (None when nothing is or was fenced) and the event of a change, from
/// the fenced pods and the status as last written.
pub fn report(fenced: &[String], status: Option<&Value>) -> (Option<Condition>, Option<Event>) {
    let was = condition_status(status, FENCED_CONDITION) == Some("True");
    if fenced.is_empty() {
        if condition_status(status, FENCED_CONDITION).is_none() {
            return (None, None);
        }
        let c = cond(FENCED_CONDITION, ConditionStatus::False, "NoneFenced", "no pod is fenced".into());
        let event = was.then(|| Event {
            type_: EventType::Normal,
            reason: "Unfenced".into(),
            message: "no pod is fenced: every pod is back in the Services".into(),
        });
        return (Some(c), event);
    }
    let message = format!("{} out of every client Service and kept for inspection", fenced.join(", "));
    let changed = !was || condition_message(status, FENCED_CONDITION) != Some(message.as_str());
    let event = changed.then(|| Event {
        type_: EventType::Normal,
        reason: "Fenced".into(),
        message: message.clone(),
    });
    (Some(cond(FENCED_CONDITION, ConditionStatus::True, "PodsFenced", message)), event)
}

/// What a server's writes need, from whether its pod is fenced and whether the server holds
/// writes back now (as its plugin observed it): each plugin has its own way to stop writes and
/// to take them again, and this one rule for when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writes {
    /// Fenced and still taking writes: stop them.
    Stop,
    /// Not fenced (any more) and holding writes back: take them again.
    Resume,
}

impl Writes {
    /// `fence` or `unfence`, for request ids.
    pub fn verb(self) -> &'static str {
        match self {
            Writes::Stop => "fence",
            Writes::Resume => "unfence",
        }
    }
}

/// The change `pod`'s server needs (None: none), `held` saying whether it holds writes back.
pub fn writes(fenced: &[String], pod: &str, held: bool) -> Option<Writes> {
    match (fenced.iter().any(|p| p == pod), held) {
        (true, false) => Some(Writes::Stop),
        (false, true) => Some(Writes::Resume),
        _ => None,
    }
}
