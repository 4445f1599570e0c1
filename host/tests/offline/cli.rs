//! The offline CLI as a user runs it: render (with the guardrails' verdict), plugin inspect,
//! crds, and policy test.

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use support::{wasm, workspace_root};

fn plugin_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("stateward-cli-plugins-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for p in ["postgres", "redis", "elasticsearch"] {
        std::fs::copy(wasm(&format!("stateward-{p}")), dir.join(format!("{p}.wasm"))).unwrap();
    }
    dir
}

fn stateward(plugins: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stateward"))
        .current_dir(workspace_root())
        .env("STATEWARD_PLUGIN_DIR", plugins)
        .env("STATEWARD_WASM_CACHE", support::wasm_cache_dir())
        .args(args)
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
fn render_shows_manifests_and_the_policy_verdict() {
    let plugins = plugin_dir();
    let out = stateward(&plugins, &["render", "-f", "deploy/samples/postgres.yaml", "--now-ms", "0"]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("kind: StatefulSet"));
    assert!(stdout.contains("# policy: allowed"));

    let json = stateward(
        &plugins,
        &["render", "-f", "deploy/samples/redis.yaml", "--output", "json", "--now-ms", "0"],
    );
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).expect("json output");
    assert_eq!(value["policy"]["allowed"], true);
    assert_eq!(value["plugin"]["name"], "redis");

    // A bundle that allows no registry holds the whole plan back, and says why.
    let strict = std::env::temp_dir().join(format!("stateward-cli-policies-{}", std::process::id()));
    std::fs::create_dir_all(&strict).unwrap();
    for entry in std::fs::read_dir(workspace_root().join("policies")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name.ends_with(".rego") && !name.ends_with("_test.rego") {
            std::fs::copy(&path, strict.join(&name)).unwrap();
        }
    }
    let data = std::fs::read_to_string(workspace_root().join("policies/data.json")).unwrap();
    let mut data: serde_json::Value = serde_json::from_str(&data).unwrap();
    data["stateward"]["config"]["guardrails"]["allowed_registries"] =
        serde_json::json!(["registry.example.internal/"]);
    std::fs::write(strict.join("data.json"), data.to_string()).unwrap();
    let out = stateward(
        &plugins,
        &[
            "render",
            "-f",
            "deploy/samples/postgres.yaml",
            "--now-ms",
            "0",
            "--policy-dir",
            strict.to_str().unwrap(),
        ],
    );
    assert!(!out.status.success(), "a denied plan must exit non-zero");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("# policy: DENIED"), "{stdout}");
    assert!(stdout.contains("image-registry"), "{stdout}");
}

#[test]
fn bad_input_gets_a_clear_error() {
    let plugins = plugin_dir();
    let bad = std::env::temp_dir().join(format!("stateward-cli-bad-{}.yaml", std::process::id()));
    std::fs::write(&bad, "apiVersion: stateward.dev/v1\nkind: NoSuchCluster\nmetadata: {name: x}\n").unwrap();
    let out = stateward(&plugins, &["render", "-f", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(text(&out).contains("no loaded plugin serves stateward.dev/v1 NoSuchCluster"), "{}", text(&out));
    std::fs::write(&bad, "{ not: [yaml").unwrap();
    let out = stateward(&plugins, &["render", "-f", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(text(&out).contains("resource file"), "{}", text(&out));
}

/// Logs written to a pipe (a file, a CI log) are plain text: no terminal colour codes. A spec
/// the plugin cannot use makes it log a warning, which the host writes as a log line.
#[test]
fn logs_into_a_pipe_carry_no_colour_codes() {
    let plugins = plugin_dir();
    let file = std::env::temp_dir().join(format!("stateward-cli-warn-{}.yaml", std::process::id()));
    let cr = "apiVersion: stateward.dev/v1\nkind: PostgresCluster\nmetadata: {name: x, namespace: db}\n\
              spec: {version: \"15\", replicas: 0, storage: {size: 1Gi}}\n";
    std::fs::write(&file, cr).unwrap();
    let out = stateward(&plugins, &["render", "-f", file.to_str().unwrap()]);
    let logs = String::from_utf8_lossy(&out.stderr);
    assert!(logs.contains("WARN") && logs.contains("invalid spec"), "{}", text(&out));
    assert!(!logs.contains('\u{1b}'), "colour codes in {logs:?}");
}

#[test]
fn plugin_inspect_lists_identity_and_imports() {
    let plugins = plugin_dir();
    let out = stateward(&plugins, &["plugin", "inspect", plugins.join("redis.wasm").to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "name:     redis",
        "kind:     RedisCluster.stateward.dev",
        "digest:   sha256:",
        "stateward:plugin/service@0.2.0",
        "contract: stateward:plugin@0.2.0",
        "wasi:io/",
    ] {
        assert!(stdout.contains(needle), "missing {needle} in\n{stdout}");
    }
}

#[test]
fn crds_command_matches_deploy_crds() {
    let plugins = plugin_dir();
    let out_dir = std::env::temp_dir().join(format!("stateward-cli-crds-{}", std::process::id()));
    let out = stateward(&plugins, &["crds", "--out-dir", out_dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    for entry in std::fs::read_dir(workspace_root().join("deploy/crds")).unwrap() {
        let path = entry.unwrap().path();
        let generated = std::fs::read_to_string(out_dir.join(path.file_name().unwrap())).unwrap();
        assert_eq!(generated, std::fs::read_to_string(&path).unwrap(), "{} is stale", path.display());
    }
}

/// A pod never starts on a floor whose data is not the document its spec pins: `run` stops
/// before anything else (no plugin compiled, no cluster asked), naming both digests.
#[test]
fn run_refuses_a_floor_other_than_the_pinned_one() {
    let plugins = plugin_dir();
    let pinned = "0".repeat(64);
    let out = stateward(&plugins, &["run", "--policy-dir", "policies", "--policy-data-sha256", &pinned]);
    assert!(!out.status.success(), "started on another floor: {}", text(&out));
    let data = std::fs::read(workspace_root().join("policies/data.json")).unwrap();
    let actual = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&data));
    let said = text(&out);
    assert!(
        said.contains(&actual) && said.contains(&pinned) && said.contains("--policy-data-sha256"),
        "{said}"
    );
}
