//! Plain Rust mirrors of the WIT records, so plugins compile and test natively as well as
//! in Wasm; `glue` converts them to the generated bindings one to one.

use serde::Serialize;

/// What a plugin tells the host about itself (`info()`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PluginInfo {
    pub name: String,
    pub version: String,
    pub kinds: Vec<KindInfo>,
    pub owns: Vec<ChildKind>,
}

/// One custom resource kind with the versions its CRD serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KindInfo {
    pub group: String,
    pub kind: String,
    pub plural: String,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub versions: Vec<CrdVersion>,
}

/// One CRD version: schema and printer columns as JSON text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CrdVersion {
    pub name: String,
    pub served: bool,
    pub storage: bool,
    pub deprecated: bool,
    pub schema: String,
    pub printer_columns: String,
}

/// A child kind the plugin may emit; the host refuses any other.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChildKind {
    pub api_version: String,
    pub kind: String,
}

/// A semantic validation failure with the JSON path of the field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FieldError {
    pub path: String,
    pub message: String,
}

impl FieldError {
    /// Shorthand used by every validator.
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self { path: path.into(), message: message.into() }
    }
}

/// What the host observed: the CR (storage version), its children, the time, and the answers
/// to earlier requests.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Observed {
    pub resource: String,
    pub children: Vec<String>,
    pub now_ms: u64,
    pub responses: Vec<Response>,
}

/// The answer to an earlier [`ExecRequest`] or [`HttpRequest`], by the id the plugin gave it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Response {
    pub id: String,
    /// Exit code of an exec, status of an http request; `None` when it did not run to an end.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub truncated: bool,
    /// Why there is no answer (pod gone, timeout, refused by policy, connection failed…).
    pub error: Option<String>,
    pub started_at_ms: u64,
    pub duration_ms: u64,
}

impl Response {
    /// True when the request ran and answered success (exit code 0, or an HTTP 2xx).
    pub fn succeeded(&self) -> bool {
        self.error.is_none() && matches!(self.code, Some(0) | Some(200..=299))
    }
}

/// How often a request is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum RequestMode {
    /// At most once per id, ever (the host keeps it durably).
    Once,
    /// A poll: not again while pending nor within this many milliseconds of its last answer.
    EveryMs(u64),
}

/// Run `command` in a container of a Pod of the instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExecRequest {
    pub id: String,
    pub mode: RequestMode,
    pub pod: String,
    pub container: String,
    pub command: Vec<String>,
    pub stdin: Option<String>,
    pub timeout_ms: u32,
}

/// Where an http request goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum HttpTarget {
    Pod(String),
    Service(String),
}

/// https, verified against `ca_secret`'s `ca.crt` for `server_name`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HttpTls {
    pub ca_secret: String,
    pub server_name: String,
}

/// Basic auth the host reads from a Secret of the instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SecretBasicAuth {
    pub secret: String,
    pub username_key: String,
    pub password_key: String,
}

/// An HTTP(S) request to the running service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HttpRequest {
    pub id: String,
    pub mode: RequestMode,
    pub target: HttpTarget,
    pub port: u16,
    pub tls: Option<HttpTls>,
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Option<String>,
    pub basic_auth: Option<SecretBasicAuth>,
    pub timeout_ms: u32,
}

/// Labels and annotations on a Pod of the instance; `None` removes a key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodLabels {
    pub pod: String,
    pub labels: Vec<(String, Option<String>)>,
    pub annotations: Vec<(String, Option<String>)>,
}

/// Lifecycle phase shown in `.status.phase`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Phase {
    Pending,
    Running,
    Scaling,
    Upgrading,
    Failed,
    Deleting,
}

impl Phase {
    /// The spelling used in `.status.phase` and the CRD enum.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Running => "Running",
            Phase::Scaling => "Scaling",
            Phase::Upgrading => "Upgrading",
            Phase::Failed => "Failed",
            Phase::Deleting => "Deleting",
        }
    }

    /// Every phase, in the order of the CRD enum.
    pub const ALL: [Phase; 6] =
        [Phase::Pending, Phase::Running, Phase::Scaling, Phase::Upgrading, Phase::Failed, Phase::Deleting];
}

/// Kubernetes condition status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

/// One condition; the host adds lastTransitionTime and observedGeneration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Condition {
    pub type_: String,
    pub status: ConditionStatus,
    pub reason: String,
    pub message: String,
}

/// The status the plugin derived; `extra` is a JSON object merged into `.status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StatusReport {
    pub phase: Phase,
    pub conditions: Vec<Condition>,
    pub extra: String,
}

/// A child to delete, by name in the CR's namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ObjectRef {
    pub api_version: String,
    pub kind: String,
    pub name: String,
}

/// A Secret the host fills with random values once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SecretRequest {
    pub name: String,
    pub keys: Vec<(String, u32)>,
    pub labels: Vec<(String, String)>,
    /// (key, template): filled by the host from the Secret's own keys (`{password}`) and
    /// `{namespace}`, so a value made of a password never passes through the plugin.
    pub derived: Vec<(String, String)>,
}

/// One step of a plan; the policy gate sees each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Action {
    Apply(String),
    Delete(ObjectRef),
    EnsureSecret(SecretRequest),
    LabelPod(PodLabels),
    Exec(ExecRequest),
    Http(HttpRequest),
}

/// Kubernetes Event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum EventType {
    Normal,
    Warning,
}

/// An Event the host records on the CR.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Event {
    pub type_: EventType,
    pub reason: String,
    pub message: String,
}

/// The answer of `reconcile`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub actions: Vec<Action>,
    pub status: StatusReport,
    pub events: Vec<Event>,
    pub requeue_after_ms: Option<u64>,
}

/// The answer of `finalize`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cleanup {
    pub actions: Vec<Action>,
    pub events: Vec<Event>,
    pub done: bool,
}

/// Log levels of the host's `log` import.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Level {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}
