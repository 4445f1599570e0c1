//! The plugins and fixtures as WebAssembly components (built once per test binary by the
//! testkit), loaded into a sandbox.
#![allow(clippy::expect_used)]
#![allow(dead_code)]

use std::sync::Arc;

use stateward::runtime::{AllocatorKind, Limits, Plugin, Sandbox};
// Every test binary uses a different part of these.
#[allow(unused_imports)]
pub use stateward_testkit::components::{
    multi_memory, wasm, wasm_cache_dir, wasm_target_dir, wasm_with_features, workspace_root,
};

pub fn sandbox_with(limits: Limits) -> Arc<Sandbox> {
    Sandbox::new(limits, AllocatorKind::Auto, Some(wasm_cache_dir())).expect("sandbox")
}

pub fn sandbox() -> Arc<Sandbox> {
    sandbox_with(Limits::default())
}

pub fn load(sandbox: &Arc<Sandbox>, package: &str) -> Plugin {
    Plugin::load_file(sandbox, &wasm(package)).expect("plugin loads")
}

/// The libtest name of the test `name` in the module `module_path` (its `module_path!()`): the
/// path without the crate's name, as `--exact` wants it to run that test alone in a child
/// process, whichever test binary the module is folded into.
pub fn test_name(module_path: &str, name: &str) -> String {
    match module_path.split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_string(),
    }
}
