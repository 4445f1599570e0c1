//! The host's tests that need no cluster: the CLI, the configs the plugins render run for real,
//! hot reload in process, the plugins as components, the policy gate (regorus, the real `opa`,
//! the evaluation bounds), the sandbox and telemetry. One test binary with a module per concern,
//! so the suite compiles and links these once instead of once per file.
//!
//! Run: `cargo test -p stateward --test offline` (a module alone: `-- policy_gate::`).

#[path = "../support/mod.rs"]
mod support;

mod chart;
mod cli;
mod configs;
mod hot_reload;
mod plugins;
mod policy_bounds;
mod policy_gate;
mod policy_opa;
mod requests;
mod sandbox;
mod telemetry;
