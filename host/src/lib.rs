//! stateward: a Kubernetes operator host that delegates each service's logic to a sandboxed
//! WebAssembly plugin and gates every change through Rego policy.
#![forbid(unsafe_code)]

pub mod policy;
pub mod runtime;
