//! stateward: a Kubernetes operator host that delegates each service's logic to a sandboxed
//! WebAssembly plugin and gates every change through Rego policy.
#![deny(unsafe_code)]

pub mod controller;
pub mod crd;
pub mod leader;
pub mod plan_gate;
pub mod policy;
pub mod reload;
pub mod render;
pub mod runtime;
pub mod telemetry;
pub mod webhook;
