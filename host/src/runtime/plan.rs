//! The host's own view of what a plugin answered: plain serde types, checked before use.
//!
//! Every applied object is parsed, its apiVersion/kind must be one the plugin declared in
//! `info().owns`, and its namespace is forced to the resource's (a different one is an error).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::bindings::v0_2::stateward::plugin::types as wit;
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
    Apply {
        object: Value,
    },
    Delete {
        target: ObjectRef,
    },
    EnsureSecret {
        secret: SecretRequest,
    },
    /// Labels and annotations on a Pod of the instance (its controller stays its owner).
    LabelPod {
        pods: PodLabels,
    },
    /// A request to the running service; see [`Request`].
    Exec {
        request: Request<ExecRequest>,
    },
    Http {
        request: Request<HttpRequest>,
    },
}

impl Action {
    pub fn verb(&self) -> &'static str {
        match self {
            Self::Apply { .. } => "apply",
            Self::Delete { .. } => "delete",
            Self::EnsureSecret { .. } => "ensure-secret",
            Self::LabelPod { .. } => "label-pod",
            Self::Exec { .. } => "exec",
            Self::Http { .. } => "http",
        }
    }

    /// Whether this action asks something of the running service rather than writing to the API.
    pub fn is_request(&self) -> bool {
        matches!(self, Self::Exec { .. } | Self::Http { .. })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodLabels {
    pub pod: String,
    /// A value of `None` removes the key.
    pub labels: Vec<(String, Option<String>)>,
    pub annotations: Vec<(String, Option<String>)>,
}

/// How often a request is sent: once per id ever (kept durably), or as a poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RequestMode {
    Once,
    /// Not sent again while pending, nor within this long of its last answer.
    Every(#[serde(with = "plain_millis")] Duration),
}

/// A request of a plan: an id the plugin chose, its mode, and what to do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Request<T> {
    pub id: String,
    pub mode: RequestMode,
    #[serde(with = "plain_millis")]
    pub timeout: Duration,
    #[serde(flatten)]
    pub what: T,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecRequest {
    pub pod: String,
    pub container: String,
    pub command: Vec<String>,
    /// Never logged nor handed to policy: only its size is.
    #[serde(skip)]
    pub stdin: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum HttpTarget {
    Pod(String),
    Service(String),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpTls {
    pub ca_secret: String,
    pub server_name: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BasicAuth {
    pub secret: String,
    pub username_key: String,
    pub password_key: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRequest {
    pub target: HttpTarget,
    pub port: u16,
    pub tls: Option<HttpTls>,
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    /// Never logged nor handed to policy: only its size is.
    #[serde(skip)]
    pub body: Option<String>,
    pub basic_auth: Option<BasicAuth>,
}

/// The answer to a request, handed back to the plugin in the next `observed.responses`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Response {
    pub id: String,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub truncated: bool,
    pub error: Option<String>,
    pub started_at_ms: u64,
    pub duration_ms: u64,
}

impl Response {
    pub fn to_wit(&self) -> wit::Response {
        wit::Response {
            id: self.id.clone(),
            code: self.code,
            stdout: self.stdout.clone(),
            stderr: self.stderr.clone(),
            truncated: self.truncated,
            error: self.error.clone(),
            started_at_ms: self.started_at_ms,
            duration_ms: self.duration_ms,
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
    /// Keys filled from a template over the Secret's own keys (`{password}`) and `{namespace}`.
    pub derived: Vec<(String, String)>,
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

/// A kind of child object a plugin declares in `info().owns`: the only kinds its plans may
/// apply or delete.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChildKind {
    pub api_version: String,
    pub kind: String,
}

/// What a plan is checked against: who produced it, what it may emit, and where.
pub(super) struct PlanRules<'a> {
    pub plugin: &'a str,
    pub owns: &'a [ChildKind],
    pub namespace: &'a str,
    pub limits: &'a RequestLimits,
}

/// Host limits on what a plan reports, whatever policy says (the guardrails' `status-too-large`
/// may set a lower bound for status): status is readable by anyone who may read the resource,
/// and every event is an API write.
pub const MAX_STATUS_EXTRA_BYTES: usize = 64 * 1024;
pub const MAX_EVENTS: usize = 16;
pub const MAX_EVENT_REASON_BYTES: usize = 128;
pub const MAX_EVENT_MESSAGE_BYTES: usize = 1024;

/// Status fields the host writes on its own schedule, which a plugin's `status.extra` may not
/// set: the request ledger keeps one-shot requests from being sent twice. (Phase, conditions,
/// `observedGeneration`, `plugin` and `pluginDigest` the host overwrites on every status write.)
pub const HOST_STATUS_FIELDS: [&str; 1] = ["requests"];

/// `text` cut to at most `max` bytes, on a character boundary.
fn cut(mut text: String, max: usize) -> String {
    if text.len() > max {
        let end = (0..=max).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
        text.truncate(end);
    }
    text
}

/// What one plan may ask of the running service; a plan past these is refused whole, before
/// policy is asked and before anything is sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestLimits {
    /// Requests (exec and http) in one plan.
    pub per_plan: usize,
    /// Bytes of one exec's stdin or one http request's body.
    pub input_bytes: usize,
    /// The longest timeout a request may ask for.
    pub max_timeout: Duration,
    /// The shortest interval a poll may ask for (the shipped plugins poll every 2 s, every
    /// 500 ms while a switchover runs): a poll every 0 ms would be a busy loop through the
    /// API server.
    pub min_interval: Duration,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            per_plan: 32,
            input_bytes: 64 * 1024,
            max_timeout: Duration::from_secs(300),
            min_interval: Duration::from_millis(500),
        }
    }
}

impl PlanRules<'_> {
    fn malformed(&self, reason: impl Into<String>) -> RuntimeError {
        RuntimeError::MalformedPlan { plugin: self.plugin.to_string(), reason: reason.into() }
    }

    fn refused(&self, reason: impl Into<String>) -> RuntimeError {
        RuntimeError::RequestsRefused { plugin: self.plugin.to_string(), reason: reason.into() }
    }

    /// The plan's requests against the limits: how many, and how much each sends. Checked
    /// before anything else is made of the plan (its size included), so that the refusal names
    /// the request that went too far.
    pub fn check_requests(&self, actions: &[wit::Action]) -> Result<(), RuntimeError> {
        let requests =
            actions.iter().filter(|a| matches!(a, wit::Action::Exec(_) | wit::Action::Http(_))).count();
        if requests > self.limits.per_plan {
            return Err(self.refused(format!(
                "the plan has {requests} requests; at most {} are allowed in one plan",
                self.limits.per_plan
            )));
        }
        for action in actions {
            let (id, input) = match action {
                wit::Action::Exec(e) => (&e.id, e.stdin.as_ref()),
                wit::Action::Http(h) => (&h.id, h.body.as_ref()),
                _ => continue,
            };
            self.check_input(id, input)?;
        }
        Ok(())
    }

    fn check_input(&self, id: &str, input: Option<&String>) -> Result<(), RuntimeError> {
        let size = input.map_or(0, String::len);
        if size > self.limits.input_bytes {
            return Err(self.refused(format!(
                "request {}: {size} bytes of input (stdin or body); at most {} are allowed",
                id.chars().take(80).collect::<String>(),
                self.limits.input_bytes
            )));
        }
        Ok(())
    }

    fn check_kind(&self, api_version: &str, kind: &str, name: &str) -> Result<(), RuntimeError> {
        if self.owns.iter().any(|c| c.api_version == api_version && c.kind == kind) {
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
        self.check_requests(&actions)?;
        let actions: Vec<Action> = actions.into_iter().map(|a| self.action(a)).collect::<Result<_, _>>()?;
        let mut ids = std::collections::HashSet::new();
        for action in &actions {
            let id = match action {
                Action::Exec { request } => &request.id,
                Action::Http { request } => &request.id,
                _ => continue,
            };
            if !ids.insert(id.as_str()) {
                return Err(self.refused(format!("two requests of the plan have the id \"{id}\"")));
            }
        }
        Ok(actions)
    }

    /// Checks what every request shares: its id, its timeout and the size of what it sends.
    fn request<T>(
        &self,
        id: String,
        mode: wit::RequestMode,
        timeout_ms: u32,
        input: Option<&String>,
        what: T,
    ) -> Result<Request<T>, RuntimeError> {
        let id_ok = !id.is_empty()
            && id.len() <= 63
            && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
        if !id_ok {
            return Err(self.refused(format!(
                "request id \"{}\" must be 1-63 characters of letters, digits, '-', '.' or '_'",
                id.chars().take(80).collect::<String>()
            )));
        }
        let timeout = Duration::from_millis(u64::from(timeout_ms));
        if timeout.is_zero() || timeout > self.limits.max_timeout {
            return Err(self.refused(format!(
                "request {id}: timeout-ms {timeout_ms} must be between 1 and {}",
                self.limits.max_timeout.as_millis()
            )));
        }
        self.check_input(&id, input)?;
        let mode = match mode {
            wit::RequestMode::Once => RequestMode::Once,
            wit::RequestMode::Every(ms) if Duration::from_millis(ms) < self.limits.min_interval => {
                return Err(self.refused(format!(
                    "request {id}: mode every {ms} ms; a poll may run at most every {} ms",
                    self.limits.min_interval.as_millis()
                )));
            }
            wit::RequestMode::Every(ms) => RequestMode::Every(Duration::from_millis(ms)),
        };
        Ok(Request { id, mode, timeout, what })
    }

    fn action(&self, action: wit::Action) -> Result<Action, RuntimeError> {
        Ok(match action {
            wit::Action::Apply(json) => Action::Apply { object: self.object(&json)? },
            wit::Action::Delete(r) => {
                self.check_kind(&r.api_version, &r.kind, &r.name)?;
                if r.name.is_empty() {
                    return Err(self.malformed(format!("delete of a {} without a name", r.kind)));
                }
                Action::Delete {
                    target: ObjectRef { api_version: r.api_version, kind: r.kind, name: r.name },
                }
            }
            wit::Action::EnsureSecret(s) => {
                if s.name.is_empty() || s.keys.is_empty() {
                    return Err(self.malformed("ensure-secret needs a name and at least one key"));
                }
                let derived: Vec<(String, String)> =
                    s.derived.into_iter().map(|d| (d.key, d.template)).collect();
                if let Some((key, _)) = derived.iter().find(|(k, _)| s.keys.iter().any(|(r, _)| r == k)) {
                    return Err(self.malformed(format!(
                        "ensure-secret {}: key {key} is both random and derived",
                        s.name
                    )));
                }
                Action::EnsureSecret {
                    secret: SecretRequest { name: s.name, keys: s.keys, labels: s.labels, derived },
                }
            }
            wit::Action::LabelPod(p) => {
                if p.pod.is_empty() || (p.labels.is_empty() && p.annotations.is_empty()) {
                    return Err(self.malformed("label-pod needs a pod and at least one label or annotation"));
                }
                Action::LabelPod {
                    pods: PodLabels { pod: p.pod, labels: p.labels, annotations: p.annotations },
                }
            }
            wit::Action::Exec(e) => {
                if e.pod.is_empty() || e.container.is_empty() || e.command.is_empty() {
                    return Err(
                        self.refused(format!("exec {}: needs a pod, a container and a command", e.id))
                    );
                }
                let what =
                    ExecRequest { pod: e.pod, container: e.container, command: e.command, stdin: None };
                let mut request = self.request(e.id, e.mode, e.timeout_ms, e.stdin.as_ref(), what)?;
                request.what.stdin = e.stdin;
                Action::Exec { request }
            }
            wit::Action::Http(h) => {
                let target = match h.target {
                    wit::HttpTarget::Pod(name) => HttpTarget::Pod(name),
                    wit::HttpTarget::Service(name) => HttpTarget::Service(name),
                };
                if !h.path.starts_with('/') || h.method.is_empty() || h.port == 0 {
                    return Err(self.refused(format!(
                        "http {}: needs a method, a port and a path starting with '/'",
                        h.id
                    )));
                }
                let what = HttpRequest {
                    target,
                    port: h.port,
                    tls: h.tls.map(|t| HttpTls { ca_secret: t.ca_secret, server_name: t.server_name }),
                    method: h.method,
                    path: h.path,
                    headers: h.headers,
                    body: None,
                    basic_auth: h.basic_auth.map(|a| BasicAuth {
                        secret: a.secret,
                        username_key: a.username_key,
                        password_key: a.password_key,
                    }),
                };
                let mut request = self.request(h.id, h.mode, h.timeout_ms, h.body.as_ref(), what)?;
                request.what.body = h.body;
                Action::Http { request }
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
        let kind = field(&object, &["kind"]).ok_or_else(|| self.malformed("applied object has no kind"))?;
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

    /// The plan's events, at most [`MAX_EVENTS`], each reason a short word; a message longer
    /// than [`MAX_EVENT_MESSAGE_BYTES`] is cut (as the API server would store no more).
    pub fn events(&self, events: Vec<wit::Event>) -> Result<Vec<Event>, RuntimeError> {
        if events.len() > MAX_EVENTS {
            return Err(self.malformed(format!("{} events in one plan (at most {MAX_EVENTS})", events.len())));
        }
        events
            .into_iter()
            .map(|e| {
                if e.reason.is_empty() || e.reason.len() > MAX_EVENT_REASON_BYTES {
                    return Err(self.malformed(format!(
                        "event reason must be 1 to {MAX_EVENT_REASON_BYTES} bytes, got {}",
                        e.reason.len()
                    )));
                }
                Ok(Event {
                    type_: match e.type_ {
                        wit::EventType::Normal => EventType::Normal,
                        wit::EventType::Warning => EventType::Warning,
                    },
                    reason: e.reason,
                    message: cut(e.message, MAX_EVENT_MESSAGE_BYTES),
                })
            })
            .collect()
    }

    pub fn status(&self, status: wit::StatusReport) -> Result<StatusReport, RuntimeError> {
        if status.extra.len() > MAX_STATUS_EXTRA_BYTES {
            return Err(self.malformed(format!(
                "status.extra is {} bytes (at most {MAX_STATUS_EXTRA_BYTES})",
                status.extra.len()
            )));
        }
        let extra: Value = if status.extra.trim().is_empty() {
            Value::Object(Default::default())
        } else {
            serde_json::from_str(&status.extra)
                .map_err(|e| self.malformed(format!("status.extra is not JSON: {e}")))?
        };
        let Some(fields) = extra.as_object() else {
            return Err(self.malformed("status.extra must be a JSON object"));
        };
        if let Some(key) = fields.keys().find(|k| HOST_STATUS_FIELDS.contains(&k.as_str())) {
            return Err(self.malformed(format!("status.extra may not set {key}: the host owns status.{key}")));
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

/// A duration as whole milliseconds (status and policy input).
mod plain_millis {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
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
