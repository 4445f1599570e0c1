//! The wasmtime sandbox that runs service plugins (docs/architecture.md, The WIT contract).
//!
//! One [`Sandbox`] (engine, linker, limits, epoch ticker) is shared by every plugin; a
//! [`Plugin`] is a pre-linked component plus what its `info()` said; every call gets a fresh
//! `Store`, so one call can never see another's memory.

mod bindings;
mod cache;
mod contract;
mod declared;
mod error;
mod function_cache;
mod host_state;
mod plan;
mod plugin;
mod registry;
mod sandbox;

pub use contract::Contract;
pub use error::RuntimeError;
pub use function_cache::Reuse;
pub use plan::{
    Action, BasicAuth, ChildKind, Cleanup, Condition, ConditionStatus, Event, EventType, ExecRequest,
    HttpRequest, HttpTarget, HttpTls, ObjectRef, Phase, Plan, PodLabels, Request, RequestLimits, RequestMode,
    Response, SecretRequest, StatusReport,
};
pub use plugin::{CrdVersion, FieldError, KindInfo, Observed, Plugin, PluginInfo};
pub use registry::{LiveRegistry, Registry};
pub use sandbox::{AllocatorKind, Compiler, Lane, Limits, Sandbox};

/// The WIT package this host speaks, and its current version; every version in
/// [`Contract::SERVED`] loads, any other is refused.
pub const WIT_PACKAGE: &str = "stateward:plugin";
pub const WIT_VERSION: &str = "0.2.0";
