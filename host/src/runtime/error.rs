//! Every way loading or calling a plugin can fail, each with a label for metrics and Events.

use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("cannot configure the wasmtime engine: {0}")]
    Engine(String),
    #[error("cannot read plugin file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("plugin is not a valid WebAssembly component: {0}")]
    NotAComponent(String),
    #[error("plugin imports {}, which stateward never provides (allowed: wasi:io/*, wasi:cli/*, wasi:random/*, {}/*)", imports.join(", "), super::WIT_PACKAGE)]
    ForbiddenImport { imports: Vec<String> },
    #[error(
        "plugin was built for WIT `{found}`, this host speaks `{}` versions {}",
        super::WIT_PACKAGE,
        super::Contract::SERVED.map(super::Contract::version).join(", ")
    )]
    WitVersion { found: String },
    #[error("plugin exports no `{}/service` interface", super::WIT_PACKAGE)]
    MissingExport,
    #[error("plugin declares {declared} {what}, over the limit of {limit} per call")]
    TooManyResources { what: &'static str, declared: usize, limit: usize },
    #[error("cannot link plugin: {0}")]
    Link(String),
    #[error("precompiled cache at {path}: {reason}")]
    Cache { path: String, reason: String },
    #[error("plugin {plugin} `{export}` ran past its {budget:?} budget and was interrupted")]
    Timeout { plugin: String, export: &'static str, budget: Duration },
    #[error(
        "plugin {plugin} `{export}` tried to grow its memory to {requested} bytes, over the {limit}-byte cap"
    )]
    OutOfMemory { plugin: String, export: &'static str, requested: usize, limit: usize },
    #[error("plugin {plugin} `{export}` trapped: {message}")]
    Trap { plugin: String, export: &'static str, message: String },
    #[error("plugin {plugin} `{export}` returned {size} bytes, over the {limit}-byte output cap")]
    OutputTooLarge { plugin: String, export: &'static str, size: usize, limit: usize },
    #[error("plugin {plugin} returned a malformed plan: {reason}")]
    MalformedPlan { plugin: String, reason: String },
    #[error(
        "plugin {plugin} emitted {api_version} {kind} `{name}`, a kind it does not declare in info().owns"
    )]
    UndeclaredKind { plugin: String, api_version: String, kind: String, name: String },
    #[error("plugin {plugin} emitted {kind} `{name}` into namespace `{namespace}`, outside the resource's namespace `{expected}`")]
    ForeignNamespace { plugin: String, kind: String, name: String, namespace: String, expected: String },
    #[error("plugin {plugin} `{export}` failed: {message}")]
    Plugin { plugin: String, export: &'static str, message: String },
    #[error("the host refused the plan of plugin {plugin} whole (nothing applied, nothing sent): {reason}")]
    RequestsRefused { plugin: String, reason: String },
}

impl RuntimeError {
    /// A short, bounded label for metrics (`reason`) and Event reasons.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Engine(_) => "engine",
            Self::Read { .. } => "read",
            Self::NotAComponent(_) => "not_a_component",
            Self::ForbiddenImport { .. } => "forbidden_import",
            Self::WitVersion { .. } => "wit_version",
            Self::MissingExport => "missing_export",
            Self::TooManyResources { .. } => "too_many_resources",
            Self::Link(_) => "link",
            Self::Cache { .. } => "cache",
            Self::Timeout { .. } => "timeout",
            Self::OutOfMemory { .. } => "out_of_memory",
            Self::Trap { .. } => "trap",
            Self::OutputTooLarge { .. } => "output_too_large",
            Self::MalformedPlan { .. } => "malformed_plan",
            Self::UndeclaredKind { .. } => "undeclared_kind",
            Self::ForeignNamespace { .. } => "foreign_namespace",
            Self::Plugin { .. } => "plugin_error",
            Self::RequestsRefused { .. } => "requests_refused",
        }
    }

    /// True when the host itself refused what the plugin answered (a plan too large, malformed,
    /// emitting an undeclared kind or into another namespace, or asking too much of the running
    /// service): a decision about the plugin's output, audited like a policy denial.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            Self::OutputTooLarge { .. }
                | Self::MalformedPlan { .. }
                | Self::UndeclaredKind { .. }
                | Self::ForeignNamespace { .. }
                | Self::RequestsRefused { .. }
        )
    }

    /// True for failures of the sandbox itself (trap, timeout, memory), counted as traps.
    pub fn is_trap(&self) -> bool {
        matches!(self, Self::Timeout { .. } | Self::OutOfMemory { .. } | Self::Trap { .. })
    }
}
