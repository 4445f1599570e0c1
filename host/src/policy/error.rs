//! The one error type of the policy module.

use std::path::PathBuf;

/// Everything that can go wrong while loading, evaluating or auditing policy. Variants are
/// named after the action that failed; [`PolicyError::label`] gives a stable metric label.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// A bundle file or directory could not be read.
    #[error("reading policy bundle {path}: {source}")]
    ReadBundle {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A `.rego` module did not parse.
    #[error("parsing policy {file}: {message}")]
    ParsePolicy {
        /// Bundle-relative file name.
        file: String,
        /// The parser's message.
        message: String,
    },
    /// A `.json` data document did not parse or conflicts with another.
    #[error("loading policy data {file}: {message}")]
    LoadData {
        /// Bundle-relative file name.
        file: String,
        /// What was wrong.
        message: String,
    },
    /// The bundle parsed but does not compile, or its configuration is invalid.
    #[error("compiling policy bundle: {0}")]
    CompileBundle(String),
    /// The bundle breaks an evaluation bound: it calls a builtin sized by its argument, or an
    /// evaluation (first evaluation, a test) ran past its time limit. Refused like a broken one.
    #[error("policy bundle breaks an evaluation bound: {0}")]
    Bound(String),
    /// The bundle compiled but some of its `test_*` rules fail: the bundle is rejected whole.
    #[error("policy bundle tests failed: {0}")]
    TestBundle(String),
    /// A query failed to evaluate.
    #[error("evaluating {path}: {message}")]
    Evaluate {
        /// The queried path, e.g. `data.stateward.guardrails.deny`.
        path: String,
        /// The evaluator's message.
        message: String,
    },
    /// An input document could not be read or parsed.
    #[error("reading input {path}: {message}")]
    ReadInput {
        /// The input file.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
    /// The audit sink could not be opened (or its chain could not be resumed).
    #[error("opening audit log {path}: {message}")]
    OpenAudit {
        /// The audit file.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
    /// An audit record could not be written; the decision it belongs to is denied.
    #[error("writing audit record: {0}")]
    WriteAudit(String),
    /// An audit file could not be read for verification.
    #[error("reading audit log {path}: {source}")]
    ReadAudit {
        /// The audit file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl PolicyError {
    /// A short, stable, low-cardinality name for metrics and Event reasons.
    pub fn label(&self) -> &'static str {
        match self {
            Self::ReadBundle { .. } => "read_bundle",
            Self::ParsePolicy { .. } => "parse_policy",
            Self::LoadData { .. } => "load_data",
            Self::CompileBundle(_) => "compile_bundle",
            Self::Bound(_) => "bound",
            Self::TestBundle(_) => "test_bundle",
            Self::Evaluate { .. } => "evaluate",
            Self::ReadInput { .. } => "read_input",
            Self::OpenAudit { .. } => "open_audit",
            Self::WriteAudit(_) => "write_audit",
            Self::ReadAudit { .. } => "read_audit",
        }
    }
}
