//! Conversions between the SDK's plain types and the generated WIT bindings (Wasm only).

use crate::bindings::exports::stateward::plugin::service as export;
use crate::bindings::stateward::plugin::types as wit;
use crate::types::*;

/// Adapts a [`crate::Service`] to the generated `Guest` trait; `export_plugin!` calls these.
pub fn info<S: crate::Service>() -> wit::PluginInfo {
    let i = S::info();
    wit::PluginInfo {
        name: i.name,
        version: i.version,
        kinds: i.kinds.into_iter().map(kind).collect(),
        owns: i
            .owns
            .into_iter()
            .map(|c| wit::ChildKind { api_version: c.api_version, kind: c.kind })
            .collect(),
    }
}

/// See [`info`].
pub fn validate<S: crate::Service>(new: String, old: Option<String>) -> Vec<wit::FieldError> {
    S::validate(&new, old.as_deref())
        .into_iter()
        .map(|e| wit::FieldError { path: e.path, message: e.message })
        .collect()
}

/// See [`info`].
pub fn reconcile<S: crate::Service>(input: wit::Observed) -> Result<wit::Plan, String> {
    let plan = S::reconcile(observed(input))?;
    Ok(wit::Plan {
        actions: plan.actions.into_iter().map(action).collect(),
        status: wit::StatusReport {
            phase: phase(plan.status.phase),
            conditions: plan.status.conditions.into_iter().map(condition).collect(),
            extra: plan.status.extra,
        },
        events: plan.events.into_iter().map(event).collect(),
        requeue_after_ms: plan.requeue_after_ms,
    })
}

/// See [`info`].
pub fn finalize<S: crate::Service>(input: wit::Observed) -> Result<wit::Cleanup, String> {
    let c = S::finalize(observed(input))?;
    Ok(wit::Cleanup {
        actions: c.actions.into_iter().map(action).collect(),
        events: c.events.into_iter().map(event).collect(),
        done: c.done,
    })
}

/// See [`info`].
pub fn convert<S: crate::Service>(object: String, to_version: String) -> Result<String, String> {
    S::convert(&object, &to_version)
}

/// Sends one line to the host's log.
pub fn log(level: Level, message: &str) {
    use crate::bindings::stateward::plugin::host::{self, Level as L};
    let l = match level {
        Level::Trace => L::Trace,
        Level::Debug => L::Debug,
        Level::Info => L::Info,
        Level::Warn => L::Warn,
        Level::Error => L::Error,
    };
    host::log(l, message);
}

fn observed(o: wit::Observed) -> Observed {
    Observed {
        resource: o.resource,
        children: o.children,
        now_ms: o.now_ms,
        responses: o
            .responses
            .into_iter()
            .map(|r| Response {
                id: r.id,
                code: r.code,
                stdout: r.stdout,
                stderr: r.stderr,
                truncated: r.truncated,
                error: r.error,
                started_at_ms: r.started_at_ms,
                duration_ms: r.duration_ms,
            })
            .collect(),
    }
}

fn mode(m: RequestMode) -> wit::RequestMode {
    match m {
        RequestMode::Once => wit::RequestMode::Once,
        RequestMode::EveryMs(ms) => wit::RequestMode::Every(ms),
    }
}

fn kind(k: KindInfo) -> wit::KindInfo {
    wit::KindInfo {
        group: k.group,
        kind: k.kind,
        plural: k.plural,
        short_names: k.short_names,
        categories: k.categories,
        versions: k
            .versions
            .into_iter()
            .map(|v| wit::CrdVersion {
                name: v.name,
                served: v.served,
                storage: v.storage,
                deprecated: v.deprecated,
                schema: v.schema,
                printer_columns: v.printer_columns,
            })
            .collect(),
    }
}

fn phase(p: Phase) -> wit::Phase {
    match p {
        Phase::Pending => wit::Phase::Pending,
        Phase::Running => wit::Phase::Running,
        Phase::Scaling => wit::Phase::Scaling,
        Phase::Upgrading => wit::Phase::Upgrading,
        Phase::Failed => wit::Phase::Failed,
        Phase::Deleting => wit::Phase::Deleting,
    }
}

fn condition(c: Condition) -> wit::Condition {
    wit::Condition {
        type_: c.type_,
        status: match c.status {
            ConditionStatus::True => wit::ConditionStatus::True,
            ConditionStatus::False => wit::ConditionStatus::False,
            ConditionStatus::Unknown => wit::ConditionStatus::Unknown,
        },
        reason: c.reason,
        message: c.message,
    }
}

fn event(e: Event) -> wit::Event {
    wit::Event {
        type_: match e.type_ {
            EventType::Normal => wit::EventType::Normal,
            EventType::Warning => wit::EventType::Warning,
        },
        reason: e.reason,
        message: e.message,
    }
}

fn action(a: Action) -> wit::Action {
    match a {
        Action::Apply(json) => wit::Action::Apply(json),
        Action::Delete(r) => {
            wit::Action::Delete(wit::ObjectRef { api_version: r.api_version, kind: r.kind, name: r.name })
        }
        Action::EnsureSecret(s) => wit::Action::EnsureSecret(wit::SecretRequest {
            name: s.name,
            keys: s.keys,
            labels: s.labels,
            derived: s.derived.into_iter().map(|(key, template)| wit::DerivedKey { key, template }).collect(),
        }),
        Action::LabelPod(p) => {
            wit::Action::LabelPod(wit::PodLabels { pod: p.pod, labels: p.labels, annotations: p.annotations })
        }
        Action::Exec(e) => wit::Action::Exec(wit::ExecRequest {
            id: e.id,
            mode: mode(e.mode),
            pod: e.pod,
            container: e.container,
            command: e.command,
            stdin: e.stdin,
            timeout_ms: e.timeout_ms,
        }),
        Action::Http(h) => wit::Action::Http(wit::HttpRequest {
            id: h.id,
            mode: mode(h.mode),
            target: match h.target {
                HttpTarget::Pod(p) => wit::HttpTarget::Pod(p),
                HttpTarget::Service(s) => wit::HttpTarget::Service(s),
            },
            port: h.port,
            tls: h.tls.map(|t| wit::HttpTls { ca_secret: t.ca_secret, server_name: t.server_name }),
            method: h.method,
            path: h.path,
            headers: h.headers,
            body: h.body,
            basic_auth: h.basic_auth.map(|a| wit::SecretBasicAuth {
                secret: a.secret,
                username_key: a.username_key,
                password_key: a.password_key,
            }),
            timeout_ms: h.timeout_ms,
        }),
    }
}

#[doc(hidden)]
pub use export::Guest;
