//! The host's own view of what a plugin answered: plain serde types, checked before use.
//!
//! Every applied object is parsed, its apiVersion/kind must be one the plugin declared in
//! `info().owns`, and its namespace is forced to the resource's (a different one is an error).

use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use super::bindings::stateward::plugin::types as wit;
use super::plugin::ChildKind;
use super::RuntimeError;

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    pub actions: Vec<Action>,
    pub status: StatusReport,
    pub events: Vec<Event>,
    #[serde(skip_serializing_if = "Option::is_none", with = "millis")]
    pub requeue_after: Option<Duration>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Cleanup {
    pub actions: Vec<Action>,
    pub events: Vec<Event>,
    pub done: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase", tag = "verb")]
pub enum Action {
    /// Server-side apply of this object (namespace already forced to the resource's).
    Apply { object: Value },
    Delete { target: ObjectRef },
    EnsureSecret { secret: SecretRequest },
}

impl Action {
    pub fn verb(&self) -> &'static str {
        match self {
            Self::Apply { .. } => "apply",
            Self::Delete { .. } => "delete",
            Self::EnsureSecret { .. } => "ensure-secret",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    pub api_version: String,
    pub kind: String,
    pub name: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretRequest {
    pub name: String,
    /// Key names and how many random bytes each gets.
    pub keys: Vec<(String, u32)>,
    pub labels: Vec<(String, String)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Phase {
    Pending,
    Running,
    Scaling,
    Upgrading,
    Failed,
    Deleting,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: ConditionStatus,
    pub reason: String,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StatusReport {
    pub phase: Phase,
    pub conditions: Vec<Condition>,
    /// Service-specific fields merged into `.status`.
    pub extra: Value,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum EventType {
    Normal,
    Warning,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Event {
    #[serde(rename = "type")]
    pub type_: EventType,
    pub reason: String,
    pub message: String,
}

/// What a plan is checked against: who produced it, what it may emit, and where.
pub(super) struct PlanRules<'a> {
    pub plugin: &'a str,
    pub owns: &'a [ChildKind],
    pub namespace: &'a str,
}

impl PlanRules<'_> {
    fn malformed(&self, reason: impl Into<String>) -> RuntimeError {
        RuntimeError::MalformedPlan {
            plugin: self.plugin.to_string(),
            reason: reason.into(),
        }
    }

    fn check_kind(&self, api_version: &str, kind: &str, name: &str) -> Result<(), RuntimeError> {
        if self
            .owns
            .iter()
            .any(|c| c.api_version == api_version && c.kind == kind)
        {
            return Ok(());
        }
        Err(RuntimeError::UndeclaredKind {
            plugin: self.plugin.to_string(),
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            name: name.to_string(),
        })
    }

    pub fn actions(&self, actions: Vec<wit::Action>) -> Result<Vec<Action>, RuntimeError> {
        actions.into_iter().map(|a| self.action(a)).collect()
    }

    fn action(&self, action: wit::Action) -> Result<Action, RuntimeError> {
        Ok(match action {
            wit::Action::Apply(json) => Action::Apply {
                object: self.object(&json)?,
            },
            wit::Action::Delete(r) => {
                self.check_kind(&r.api_version, &r.kind, &r.name)?;
                if r.name.is_empty() {
                    return Err(self.malformed(format!("delete of a {} without a name", r.kind)));
                }
                Action::Delete {
                    target: ObjectRef {
                        api_version: r.api_version,
                        kind: r.kind,
                        name: r.name,
                    },
                }
            }
            wit::Action::EnsureSecret(s) => {
                if s.name.is_empty() || s.keys.is_empty() {
                    return Err(self.malformed("ensure-secret needs a name and at least one key"));
                }
                Action::EnsureSecret {
                    secret: SecretRequest {
                        name: s.name,
                        keys: s.keys,
                        labels: s.labels,
                    },
                }
            }
        })
    }

    /// Parses one applied object, checks its kind and namespace, and forces the namespace.
    fn object(&self, json: &str) -> Result<Value, RuntimeError> {
        let mut object: Value = serde_json::from_str(json)
            .map_err(|e| self.malformed(format!("applied object is not JSON: {e}")))?;
        let field = |v: &Value, path: &[&str]| -> Option<String> {
            let mut cur = v;
            for p in path {
                cur = cur.get(p)?;
            }
            cur.as_str().map(str::to_string)
        };
        let api_version = field(&object, &["apiVersion"])
            .ok_or_else(|| self.malformed("applied object has no apiVersion"))?;
        let kind =
            field(&object, &["kind"]).ok_or_else(|| self.malformed("applied object has no kind"))?;
        let name = field(&object, &["metadata", "name"])
            .filter(|n| !n.is_empty())
            .ok_or_else(|| self.malformed(format!("applied {kind} has no metadata.name")))?;
        self.check_kind(&api_version, &kind, &name)?;
        if let Some(ns) = field(&object, &["metadata", "namespace"]) {
            if ns != self.namespace {
                return Err(RuntimeError::ForeignNamespace {
                    plugin: self.plugin.to_string(),
                    kind,
                    name,
                    namespace: ns,
                    expected: self.namespace.to_string(),
                });
            }
        }
        if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("namespace".into(), Value::String(self.namespace.to_string()));
        }
        Ok(object)
    }

    pub fn events(events: Vec<wit::Event>) -> Vec<Event> {
        events
            .into_iter()
            .map(|e| Event {
                type_: match e.type_ {
                    wit::EventType::Normal => EventType::Normal,
                    wit::EventType::Warning => EventType::Warning,
                },
                reason: e.reason,
                message: e.message,
            })
            .collect()
    }

    pub fn status(&self, status: wit::StatusReport) -> Result<StatusReport, RuntimeError> {
        let extra: Value = if status.extra.trim().is_empty() {
            Value::Object(Default::default())
        } else {
            serde_json::from_str(&status.extra)
                .map_err(|e| self.malformed(format!("status.extra is not JSON: {e}")))?
        };
        if !extra.is_object() {
            return Err(self.malformed("status.extra must be a JSON object"));
        }
        Ok(StatusReport {
            phase: match status.phase {
                wit::Phase::Pending => Phase::Pending,
                wit::Phase::Running => Phase::Running,
                wit::Phase::Scaling => Phase::Scaling,
                wit::Phase::Upgrading => Phase::Upgrading,
                wit::Phase::Failed => Phase::Failed,
                wit::Phase::Deleting => Phase::Deleting,
            },
            conditions: status
                .conditions
                .into_iter()
                .map(|c| Condition {
                    type_: c.type_,
                    status: match c.status {
                        wit::ConditionStatus::True => ConditionStatus::True,
                        wit::ConditionStatus::False => ConditionStatus::False,
                        wit::ConditionStatus::Unknown => ConditionStatus::Unknown,
                    },
                    reason: c.reason,
                    message: c.message,
                })
                .collect(),
            extra,
        })
    }
}

mod millis {
    use serde::Serializer;
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_u128(d.as_millis()),
            None => s.serialize_none(),
        }
    }
}
