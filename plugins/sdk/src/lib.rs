//! Guest-side helpers shared by the service plugins: plain mirrors of the WIT types, the
//! [`Service`] trait a plugin implements, builders for the Kubernetes children, status
//! derivation, CRD schema pieces and version conversion.
//!
//! A plugin crate compiles natively (tests, the host's benchmark) and, for `wasm32`, as a
//! component whose exports `export_plugin!` generates.

pub mod builders;
pub mod convert;
pub mod driver;
pub mod fence;
pub mod json;
pub mod live;
pub mod params;
pub mod redundancy;
pub mod scheduling;
pub mod schema;
pub mod spec;
pub mod status;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod types;

pub use types::*;

/// The WIT bindings (generated; Wasm only).
#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code, missing_docs, clippy::all)]
pub mod bindings {
    wit_bindgen::generate!({
        world: "plugin",
        path: "../../wit/v0.2",
        pub_export_macro: true,
        default_bindings_module: "stateward_sdk::bindings",
    });
}

#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
pub mod glue;

/// What every service plugin implements; the same functions the WIT `service` interface exports.
pub trait Service {
    /// Name, version, kinds with their CRD versions, and the child kinds the plugin may emit.
    fn info() -> PluginInfo;
    /// Checks the schema cannot express; `old` is present on update.
    fn validate(new: &str, old: Option<&str>) -> Vec<FieldError>;
    /// Observed state in, plan out; a pure function.
    fn reconcile(input: Observed) -> Result<Plan, String>;
    /// Cleanup before the finalizer is removed.
    fn finalize(input: Observed) -> Result<Cleanup, String>;
    /// Converts an object of one of the plugin's kinds to `to_version`.
    fn convert(object: &str, to_version: &str) -> Result<String, String>;
}

/// Writes a line to the host's log; a no-op when compiled natively.
pub fn log(level: Level, message: &str) {
    #[cfg(target_arch = "wasm32")]
    glue::log(level, message);
    #[cfg(not(target_arch = "wasm32"))]
    let _ = (level, message);
}

/// Exports a [`Service`] implementation as the component's `stateward:plugin/service`.
///
/// Expands to nothing outside `wasm32`, so the same crate also builds as a native rlib.
#[macro_export]
macro_rules! export_plugin {
    ($ty:ident) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            struct StatewardExport;
            impl $crate::glue::Guest for StatewardExport {
                fn info() -> $crate::bindings::stateward::plugin::types::PluginInfo {
                    $crate::glue::info::<$ty>()
                }
                fn validate(
                    new: ::std::string::String,
                    old: ::std::option::Option<::std::string::String>,
                ) -> ::std::vec::Vec<$crate::bindings::stateward::plugin::types::FieldError> {
                    $crate::glue::validate::<$ty>(new, old)
                }
                fn reconcile(
                    input: $crate::bindings::stateward::plugin::types::Observed,
                ) -> ::std::result::Result<
                    $crate::bindings::stateward::plugin::types::Plan,
                    ::std::string::String,
                > {
                    $crate::glue::reconcile::<$ty>(input)
                }
                fn finalize(
                    input: $crate::bindings::stateward::plugin::types::Observed,
                ) -> ::std::result::Result<
                    $crate::bindings::stateward::plugin::types::Cleanup,
                    ::std::string::String,
                > {
                    $crate::glue::finalize::<$ty>(input)
                }
                fn convert(
                    object: ::std::string::String,
                    to_version: ::std::string::String,
                ) -> ::std::result::Result<::std::string::String, ::std::string::String> {
                    $crate::glue::convert::<$ty>(object, to_version)
                }
            }
    $crate::bindings::export!(StatewardExport with_types_in $crate::bindings);
        };
    };
}
