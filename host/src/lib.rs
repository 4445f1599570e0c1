//! stateward: a Kubernetes operator host that delegates each service's logic to a sandboxed
//! WebAssembly plugin and gates every change through Rego policy.
#![deny(unsafe_code)]

pub mod children;
pub mod controller;
pub mod crd;
pub mod guardrails;
pub mod kubectl;
pub mod leader;
pub mod operator;
pub mod plugin_call;
pub mod policy;
pub mod policy_input;
pub mod reload;
pub mod render;
pub mod requests;
pub mod runtime;
pub mod telemetry;
pub mod watched;
pub mod webhook;
