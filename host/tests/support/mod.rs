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
    wasm_with_features(package, &[])
}

/// Path of the component for a workspace package built with `features`; each feature set gets
/// its own copy of the output, since cargo writes every build of a package to one file.
pub fn wasm_with_features(package: &str, features: &[&str]) -> PathBuf {
    let built = BUILT.get_or_init(|| Mutex::new(Vec::new()));
    let mut built = built.lock().expect("build lock");
    let out = wasm_target_dir().join("wasm32-wasip2/plugin").join(format!("{}.wasm", package.replace('-', "_")));
    let key = if features.is_empty() { package.to_string() } else { format!("{package}+{}", features.join("+")) };
    // Copied out: a later build of the same package with other features overwrites `out`.
    let copy = wasm_target_dir().join("variants").join(format!("{}.wasm", key.replace(['-', '+'], "_")));
    if !built.contains(&key) {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(workspace_root())
            .args(["build", "--quiet", "--target", "wasm32-wasip2", "--profile", "plugin", "-p", package])
            .arg("--target-dir")
            .arg(wasm_target_dir());
        if !features.is_empty() {
            cmd.arg("--features").arg(features.join(","));
        }
        let status = cmd.status().expect("run cargo");
        assert!(status.success(), "building {key} for wasm32-wasip2 failed");
        assert!(out.is_file(), "{} was not produced", out.display());
        std::fs::create_dir_all(copy.parent().expect("variants dir")).expect("variants dir");
        std::fs::copy(&out, &copy).expect("copy the variant");
        built.push(key);
    }
    assert!(copy.is_file(), "{} was not produced", copy.display());
    copy
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
