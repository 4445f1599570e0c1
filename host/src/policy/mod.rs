//! Rego policy engine, decisions and the audit log (see docs/architecture.md, The three decision points).
//!
//! - [`bundle`]: the `.rego`/`.json` sources of a bundle and their digest.
//! - [`engine`]: a bundle compiled once into a warmed regorus engine, cloned per decision.
//! - [`floor`]: the started-with bundle as a floor a hot-loaded bundle adds to, never weakens.
//! - [`gate`]: typed decision points (plan guardrails, admission, plugin load), enforcement
//!   modes, one audited decision per call; every failure is a deny.
//! - [`audit`]: the hash-chained JSON-lines decision log (named chains, segments) and its
//!   verifiers.
//! - [`repeats`]: unchanged repetitions of a guardrails decision, counted and written as one
//!   record per period instead of one each.
//! - [`checkpoint`]: Ed25519-signed checkpoints of a chain's head.
//! - [`cli`]: library halves of the `policy test`, `policy eval` and `audit verify` commands.

pub mod audit;
pub mod bundle;
pub mod checkpoint;
pub mod cli;
pub mod engine;
mod error;
pub mod floor;
pub mod gate;
mod input;
pub mod repeats;

pub use audit::{AuditLog, AuditSettings, AuditSink, FsyncPolicy};
pub use bundle::{Bundle, BundleFile};
pub use engine::{DecisionPoint, Evaluation, Mode, PolicyEngine};
pub use error::PolicyError;
pub use gate::{ActionVerdict, DecisionContext, Gate, LiveGate, PlanVerdict, Verdict};
// The input documents are built in crate::policy_input; named here too, as the gate's API.
pub use crate::policy_input::resource as resource_input;
pub use crate::policy_input::{AdmissionRequest, KindRef, PlanAuthor, PlannedAction, PluginLoad, UserInfo};
