//! The wasmtime sandbox that runs service plugins (DESIGN.md §4).
//!
//! One [`Sandbox`] (engine, linker, limits, epoch ticker) is shared by every plugin; a
//! [`Plugin`] is a pre-linked component plus what its `info()` said; every call gets a fresh
//! `Store`, so one call can never see another's memory.

mod bindings;
mod cache;
mod error;
mod host_state;
mod plan;
mod plugin;
mod registry;
mod sandbox;

pub use error::RuntimeError;
pub use plan::{
    Action, Cleanup, Condition, ConditionStatus, Event, EventType, ObjectRef, Phase, Plan,
    SecretRequest, StatusReport,
};
pub use plugin::{ChildKind, CrdVersion, FieldError, KindInfo, Plugin, PluginInfo};
pub use registry::{LiveRegistry, Registry};
pub use sandbox::{AllocatorKind, Limits, Sandbox};

/// The WIT package version this host speaks; a plugin built against another is refused.
pub const WIT_PACKAGE: &str = "stateward:plugin";
pub const WIT_VERSION: &str = "0.1.0";
