//! Builds the plugins and fixtures as WebAssembly components once per test binary.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use stateward::runtime::{AllocatorKind, Limits, Plugin, Sandbox};

pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default()
}

/// Wasm builds get their own target dir so they never wait on the lock of the build that
/// is running these tests.
pub fn wasm_target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
        .join("wasm")
}

static BUILT: OnceLock<Mutex<Vec<String>>> = OnceLock::new();

/// Path of the component for a workspace package, built with the `plugin` profile.
pub fn wasm(package: &str) -> PathBuf {
    let built = BUILT.get_or_init(|| Mutex::new(Vec::new()));
    let mut built = built.lock().expect("build lock");
    let out = wasm_target_dir()
        .join("wasm32-wasip2/plugin")
        .join(format!("{}.wasm", package.replace('-', "_")));
    if !built.iter().any(|p| p == package) {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .current_dir(workspace_root())
            .args(["build", "--quiet", "--target", "wasm32-wasip2", "--profile", "plugin", "-p", package])
            .arg("--target-dir")
            .arg(wasm_target_dir())
            .status()
            .expect("run cargo");
        assert!(status.success(), "building {package} for wasm32-wasip2 failed");
        built.push(package.to_string());
    }
    assert!(out.is_file(), "{} was not produced", out.display());
    out
}

/// Precompiled components shared by every test process, so a plugin compiles once per build.
pub fn wasm_cache_dir() -> PathBuf {
    wasm_target_dir().join("precompiled")
}

pub fn sandbox_with(limits: Limits) -> Arc<Sandbox> {
    Sandbox::new(limits, AllocatorKind::Auto, Some(wasm_cache_dir())).expect("sandbox")
}

pub fn sandbox() -> Arc<Sandbox> {
    sandbox_with(Limits::default())
}

pub fn load(sandbox: &Arc<Sandbox>, package: &str) -> Plugin {
    Plugin::load_file(sandbox, &wasm(package)).expect("plugin loads")
}
