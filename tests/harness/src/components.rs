//! Builds workspace packages as WebAssembly components once per test process: the plugins and
//! the hostile fixtures. Here rather than in one test module so that the host's unit tests
//! (src/controller/tests.rs) and its integration tests build them the same way.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// The workspace this crate belongs to.
///
/// Found from the running test's package (cargo sets `CARGO_MANIFEST_DIR` when it runs a test)
/// before this crate's own build-time path: cargo does not rebuild a crate whose checkout only
/// moved, so with one target dir shared by two checkouts the build-time path may name the
/// other one (or a clone since removed).
pub fn workspace_root() -> PathBuf {
    let built_here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let running = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from);
    let found = running
        .iter()
        .chain([&built_here])
        .find_map(|dir| dir.ancestors().find(|d| is_workspace_root(d)).map(PathBuf::from));
    found.unwrap_or_else(|| built_here.ancestors().nth(2).map(PathBuf::from).unwrap_or_default())
}

fn is_workspace_root(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("Cargo.toml")).is_ok_and(|text| text.contains("[workspace]"))
}

/// Wasm builds get their own target dir so they never wait on the lock of the build that
/// is running the tests.
pub fn wasm_target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
        .join("wasm")
}

/// Precompiled components shared by every test process, so a plugin compiles once per build.
pub fn wasm_cache_dir() -> PathBuf {
    wasm_target_dir().join("precompiled")
}

static BUILT: OnceLock<Mutex<Vec<String>>> = OnceLock::new();

/// Path of the component for a workspace package, built with the `plugin` profile.
pub fn wasm(package: &str) -> PathBuf {
    wasm_with_features(package, &[])
}

/// Path of the component for a workspace package built with `features`; each feature set gets
/// its own copy of the output, since cargo writes every build of a package to one file.
/// Panics (failing the test) when the build fails.
#[allow(clippy::expect_used, clippy::panic)]
pub fn wasm_with_features(package: &str, features: &[&str]) -> PathBuf {
    let built = BUILT.get_or_init(|| Mutex::new(Vec::new()));
    let mut built = built.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let out =
        wasm_target_dir().join("wasm32-wasip2/plugin").join(format!("{}.wasm", package.replace('-', "_")));
    let key =
        if features.is_empty() { package.to_string() } else { format!("{package}+{}", features.join("+")) };
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

/// The multi-memory hostile component (tests/fixtures/multi-memory): `memories` memories of
/// `pages` 64 KiB pages and `tables` extra tables. The fixture program writes it; it runs from
/// the wasm target dir, so its encoders never touch the features of the build running the tests.
#[allow(clippy::expect_used)]
pub fn multi_memory(memories: u32, pages: u32, tables: u32) -> Vec<u8> {
    let out =
        wasm_target_dir().join("variants").join(format!("multi_memory_{memories}x{pages}_{tables}t.wasm"));
    std::fs::create_dir_all(out.parent().expect("variants dir")).expect("variants dir");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(workspace_root())
        .args(["run", "--quiet", "-p", "fixture-multi-memory", "--target-dir"])
        .arg(wasm_target_dir())
        .arg("--")
        .arg(workspace_root().join("wit").join("v0.2"))
        .args([memories.to_string(), pages.to_string(), tables.to_string()])
        .arg(&out)
        .status()
        .expect("run cargo");
    assert!(status.success(), "the multi-memory fixture failed");
    std::fs::read(&out).expect("read the multi-memory fixture")
}
