//! The earlier contract, served through the current one: a `stateward:plugin@0.1.0` component's
//! answers are lifted to 0.2.0 types (it never plans requests, pod labels or derived keys) and
//! what it is handed is lowered (it never sees responses). Everything after the call speaks
//! 0.2.0 only.

use super::bindings::v0_1::stateward::plugin::types as old;
use super::bindings::v0_2::stateward::plugin::types as new;

/// The version of the contract a component was built against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Contract {
    #[serde(rename = "0.1.0")]
    V0_1,
    #[serde(rename = "0.2.0")]
    V0_2,
}

impl Contract {
    /// Every version this host serves, oldest first.
    pub const SERVED: [Contract; 2] = [Contract::V0_1, Contract::V0_2];

    pub fn version(self) -> &'static str {
        match self {
            Contract::V0_1 => "0.1.0",
            Contract::V0_2 => "0.2.0",
        }
    }

    pub fn parse(version: &str) -> Option<Self> {
        Self::SERVED.into_iter().find(|c| c.version() == version)
    }
}

pub fn observed(o: &new::Observed) -> old::Observed {
    old::Observed { resource: o.resource.clone(), children: o.children.clone(), now_ms: o.now_ms }
}

pub fn info(i: old::PluginInfo) -> new::PluginInfo {
    new::PluginInfo {
        name: i.name,
        version: i.version,
        kinds: i
            .kinds
            .into_iter()
            .map(|k| new::KindInfo {
                group: k.group,
                kind: k.kind,
                plural: k.plural,
                short_names: k.short_names,
                categories: k.categories,
                versions: k
                    .versions
                    .into_iter()
                    .map(|v| new::CrdVersion {
                        name: v.name,
                        served: v.served,
                        storage: v.storage,
                        deprecated: v.deprecated,
                        schema: v.schema,
                        printer_columns: v.printer_columns,
                    })
                    .collect(),
            })
            .collect(),
        owns: i
            .owns
            .into_iter()
            .map(|c| new::ChildKind { api_version: c.api_version, kind: c.kind })
            .collect(),
    }
}

pub fn field_error(e: old::FieldError) -> new::FieldError {
    new::FieldError { path: e.path, message: e.message }
}

pub fn plan(p: old::Plan) -> new::Plan {
    new::Plan {
        actions: p.actions.into_iter().map(action).collect(),
        status: new::StatusReport {
            phase: phase(p.status.phase),
            conditions: p
                .status
                .conditions
                .into_iter()
                .map(|c| new::Condition {
                    type_: c.type_,
                    status: match c.status {
                        old::ConditionStatus::True => new::ConditionStatus::True,
                        old::ConditionStatus::False => new::ConditionStatus::False,
                        old::ConditionStatus::Unknown => new::ConditionStatus::Unknown,
                    },
                    reason: c.reason,
                    message: c.message,
                })
                .collect(),
            extra: p.status.extra,
        },
        events: p.events.into_iter().map(event).collect(),
        requeue_after_ms: p.requeue_after_ms,
    }
}

pub fn cleanup(c: old::Cleanup) -> new::Cleanup {
    new::Cleanup {
        actions: c.actions.into_iter().map(action).collect(),
        events: c.events.into_iter().map(event).collect(),
        done: c.done,
    }
}

fn action(a: old::Action) -> new::Action {
    match a {
        old::Action::Apply(json) => new::Action::Apply(json),
        old::Action::Delete(r) => {
            new::Action::Delete(new::ObjectRef { api_version: r.api_version, kind: r.kind, name: r.name })
        }
        old::Action::EnsureSecret(s) => new::Action::EnsureSecret(new::SecretRequest {
            name: s.name,
            keys: s.keys,
            labels: s.labels,
            derived: Vec::new(),
        }),
    }
}

fn event(e: old::Event) -> new::Event {
    new::Event {
        type_: match e.type_ {
            old::EventType::Normal => new::EventType::Normal,
            old::EventType::Warning => new::EventType::Warning,
        },
        reason: e.reason,
        message: e.message,
    }
}

fn phase(p: old::Phase) -> new::Phase {
    match p {
        old::Phase::Pending => new::Phase::Pending,
        old::Phase::Running => new::Phase::Running,
        old::Phase::Scaling => new::Phase::Scaling,
        old::Phase::Upgrading => new::Phase::Upgrading,
        old::Phase::Failed => new::Phase::Failed,
        old::Phase::Deleting => new::Phase::Deleting,
    }
}
