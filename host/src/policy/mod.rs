//! Rego policy engine, decisions and the audit log (see DESIGN.md §6).
//!
//! - [`bundle`]: the `.rego`/`.json` sources of a bundle and their digest.
//! - [`engine`]: a bundle compiled once into a warmed regorus engine, cloned per decision.
//! - [`gate`]: typed decision points (plan guardrails, admission, plugin load), enforcement
//!   modes, one audited decision per call; every failure is a deny.
//! - [`audit`]: the hash-chained JSON-lines decision log and its verifier.
//! - [`cli`]: library halves of the `policy test`, `policy eval` and `audit verify` commands.

pub mod audit;
pub mod bundle;
pub mod cli;
pub mod engine;
mod error;
mod input;
pub mod gate;

pub use audit::{AuditLog, AuditSink, FsyncPolicy};
pub use bundle::{Bundle, BundleFile};
pub use engine::{DecisionPoint, Evaluation, Mode, PolicyEngine};
pub use error::PolicyError;
pub use gate::{
    resource_input, ActionVerdict, AdmissionRequest, DecisionContext, Gate, KindRef, PlanVerdict,
    PlannedAction, LiveGate, PluginLoad, PluginRef, UserInfo, Verdict,
};
