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

/// What the host observed: the CR (storage version), its children, and the time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Observed {
    pub resource: String,
    pub children: Vec<String>,
    pub now_ms: u64,
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
    pub const ALL: [Phase; 6] = [
        Phase::Pending,
        Phase::Running,
        Phase::Scaling,
        Phase::Upgrading,
        Phase::Failed,
        Phase::Deleting,
    ];
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
}

/// One step of a plan; the policy gate sees each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Action {
    Apply(String),
    Delete(ObjectRef),
    EnsureSecret(SecretRequest),
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
