//! The sandbox against hostile plugins: each misbehaviour fails with its own typed error
//! inside its budget, and a well-behaved call right after still succeeds.

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::{Duration, Instant};

use stateward::runtime::{Limits, Plugin, RuntimeError};
use support::{load, sandbox, sandbox_with, wasm};

fn resource(mode: &str, extra: &str) -> String {
    format!(
        r#"{{"apiVersion":"test.stateward.dev/v1","kind":"HostileThing","metadata":{{"name":"h","namespace":"ns1"}},"spec":{{"mode":"{mode}"{extra}}}}}"#
    )
}

fn reconcile(plugin: &Plugin, mode: &str, extra: &str) -> Result<stateward::runtime::Plan, RuntimeError> {
    plugin.reconcile(&resource(mode, extra), &[], 0, "ns1")
}

/// After any failure, the same plugin must still answer a well-formed call.
fn assert_still_works(plugin: &Plugin) {
    let plan = reconcile(plugin, "ok", "").expect("well-behaved call after a failure");
    assert_eq!(plan.actions.len(), 1);
}

#[test]
fn infinite_loop_is_interrupted_within_budget() {
    let sandbox = sandbox_with(Limits { budget: Duration::from_millis(300), ..Limits::default() });
    let plugin = load(&sandbox, "fixture-hostile");
    let started = Instant::now();
    let err = reconcile(&plugin, "loop", "").expect_err("loop must not finish");
    let took = started.elapsed();
    assert!(matches!(err, RuntimeError::Timeout { .. }), "got {err}");
    assert!(took < Duration::from_millis(300) + Duration::from_secs(1), "took {took:?}");
    assert!(err.to_string().contains("budget"), "{err}");
    assert_still_works(&plugin);
}

/// The tests here run on the machine's default compiler (Winch on x86-64); the budget and the
/// memory cap hold with the other compiler as well.
#[test]
fn the_budget_and_the_memory_cap_hold_with_either_compiler() {
    use stateward::runtime::{AllocatorKind, Compiler, Sandbox};
    for compiler in [Compiler::Winch, Compiler::Cranelift] {
        let limits =
            Limits { budget: Duration::from_millis(300), memory_bytes: 32 << 20, ..Limits::default() };
        let sandbox = Sandbox::with_compiler(limits, AllocatorKind::Auto, compiler, None).expect("sandbox");
        assert_eq!(sandbox.compiler(), compiler);
        let plugin = load(&sandbox, "fixture-hostile");
        let started = Instant::now();
        let err = reconcile(&plugin, "loop", "").expect_err("loop must not finish");
        assert!(matches!(err, RuntimeError::Timeout { .. }), "{compiler:?}: got {err}");
        assert!(
            started.elapsed() < Duration::from_millis(1300),
            "{compiler:?}: took {:?}",
            started.elapsed()
        );
        let err = reconcile(&plugin, "bomb", "").expect_err("bomb must fail");
        assert!(matches!(err, RuntimeError::OutOfMemory { .. }), "{compiler:?}: got {err}");
        assert_still_works(&plugin);
    }
}

#[test]
fn memory_bomb_traps_at_the_cap() {
    let sandbox = sandbox_with(Limits { memory_bytes: 32 << 20, ..Limits::default() });
    let plugin = load(&sandbox, "fixture-hostile");
    let err = reconcile(&plugin, "bomb", "").expect_err("bomb must fail");
    match &err {
        RuntimeError::OutOfMemory { limit, requested, .. } => {
            assert_eq!(*limit, 32 << 20);
            assert!(*requested > *limit);
        }
        other => panic!("expected OutOfMemory, got {other}"),
    }
    assert_still_works(&plugin);
}

#[test]
fn oversized_output_is_refused() {
    // 100 MB of output: with room to build it in memory, the output cap must catch it.
    let roomy = sandbox_with(Limits { memory_bytes: 512 << 20, ..Limits::default() });
    let plugin = load(&roomy, "fixture-hostile");
    let err = reconcile(&plugin, "output", r#","outputBytes":"100000000""#).expect_err("too big");
    match &err {
        RuntimeError::OutputTooLarge { size, limit, .. } => {
            assert!(*size >= 100_000_000);
            assert_eq!(*limit, 4 << 20);
        }
        other => panic!("expected OutputTooLarge, got {other}"),
    }
    // Under the default 64 MiB memory cap the same plugin cannot even build it.
    let small = load(&sandbox(), "fixture-hostile");
    let err = reconcile(&small, "output", r#","outputBytes":"100000000""#).expect_err("too big");
    assert!(matches!(err, RuntimeError::OutOfMemory { .. }), "got {err}");
    assert_still_works(&plugin);
}

#[test]
fn guest_panic_is_a_trap_with_its_message() {
    let plugin = load(&sandbox(), "fixture-hostile");
    let err = reconcile(&plugin, "panic", "").expect_err("panic must fail");
    assert!(matches!(err, RuntimeError::Trap { .. }), "got {err}");
    assert!(err.to_string().contains("panicked on purpose"), "{err}");
    assert_still_works(&plugin);
}

#[test]
fn undeclared_kind_is_refused() {
    let plugin = load(&sandbox(), "fixture-hostile");
    let err = reconcile(&plugin, "cluster-role-binding", "").expect_err("must refuse");
    match &err {
        RuntimeError::UndeclaredKind { kind, .. } => assert_eq!(kind, "ClusterRoleBinding"),
        other => panic!("expected UndeclaredKind, got {other}"),
    }
    assert_still_works(&plugin);
}

#[test]
fn other_namespace_is_refused() {
    let plugin = load(&sandbox(), "fixture-hostile");
    let err = reconcile(&plugin, "other-namespace", "").expect_err("must refuse");
    match &err {
        RuntimeError::ForeignNamespace { namespace, expected, .. } => {
            assert_eq!(namespace, "kube-system");
            assert_eq!(expected, "ns1");
        }
        other => panic!("expected ForeignNamespace, got {other}"),
    }
    assert_still_works(&plugin);
}

#[test]
fn malformed_json_is_refused() {
    let plugin = load(&sandbox(), "fixture-hostile");
    let err = reconcile(&plugin, "garbage", "").expect_err("must refuse");
    assert!(matches!(err, RuntimeError::MalformedPlan { .. }), "got {err}");
    assert_still_works(&plugin);
}

#[test]
fn namespace_is_forced_to_the_resources() {
    let plugin = load(&sandbox(), "fixture-hostile");
    let plan = reconcile(&plugin, "ok", "").expect("plan");
    let stateward::runtime::Action::Apply { object } = &plan.actions[0] else {
        panic!("expected an apply");
    };
    assert_eq!(object["metadata"]["namespace"], "ns1");
}

#[test]
fn component_importing_sockets_is_refused_naming_the_import() {
    let err = Plugin::load_file(&sandbox(), &wasm("fixture-sockets")).expect_err("must refuse");
    match &err {
        RuntimeError::ForbiddenImport { imports } => {
            assert!(imports.iter().any(|i| i.starts_with("wasi:sockets/")), "imports {imports:?}");
            assert!(imports.iter().all(|i| !i.starts_with("wasi:io/")), "io is allowed: {imports:?}");
        }
        other => panic!("expected ForbiddenImport, got {other}"),
    }
    assert!(err.to_string().contains("wasi:sockets/"), "{err}");
}

#[test]
fn wrong_wit_version_is_refused() {
    let err = Plugin::load_file(&sandbox(), &wasm("fixture-wrong-wit")).expect_err("must refuse");
    match &err {
        RuntimeError::WitVersion { found } => assert!(found.contains("@9.0.0"), "{found}"),
        other => panic!("expected WitVersion, got {other}"),
    }
}

#[test]
fn non_component_file_is_refused() {
    let err = Plugin::load(&sandbox(), b"\0asm\x01\0\0\0").expect_err("core module is no component");
    assert!(matches!(err, RuntimeError::NotAComponent(_)), "got {err}");
    let err = Plugin::load(&sandbox(), b"hello, not wasm").expect_err("text is no component");
    assert!(matches!(err, RuntimeError::NotAComponent(_)), "got {err}");
}

#[test]
fn precompiled_cache_serves_a_second_start() {
    let dir = std::env::temp_dir().join(format!("stateward-cache-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let bytes = std::fs::read(wasm("fixture-hostile")).expect("read");
    let make = || {
        stateward::runtime::Sandbox::new(
            Limits::default(),
            stateward::runtime::AllocatorKind::Auto,
            Some(dir.clone()),
        )
        .expect("sandbox")
    };
    let first = Plugin::load(&make(), &bytes).expect("first load");
    assert!(!first.loaded_from_cache());
    let second = Plugin::load(&make(), &bytes).expect("second load");
    assert!(second.loaded_from_cache(), "second start must load from the cache");
    assert_eq!(first.digest(), second.digest());
    assert_still_works(&second);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every export goes through `plugin_call::call`: each call is timed per export, and a trap is
/// counted, whichever export it came from.
#[test]
fn every_export_is_timed_and_its_traps_counted_through_one_call() {
    use stateward::plugin_call::call;
    use stateward::telemetry::Metrics;
    use std::sync::Arc;

    let sandbox = sandbox();
    let plugin = Arc::new(load(&sandbox, "fixture-hostile"));
    let metrics = Metrics::new();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let ok = resource("ok", "");
        let plan = call(&sandbox, &metrics, &plugin, "reconcile", move |p| p.reconcile(&ok, &[], 0, "ns1"))
            .await
            .expect("the call runs");
        assert_eq!(plan.expect("a plan").actions.len(), 1);
        let panics = resource("panic", "");
        let trapped =
            call(&sandbox, &metrics, &plugin, "reconcile", move |p| p.reconcile(&panics, &[], 0, "ns1"))
                .await
                .expect("the call runs");
        assert!(matches!(trapped, Err(RuntimeError::Trap { .. })), "{trapped:?}");
        let ok = resource("ok", "");
        let cleanup = call(&sandbox, &metrics, &plugin, "finalize", move |p| p.finalize(&ok, &[], 0, "ns1"))
            .await
            .expect("the call runs")
            .expect("a cleanup");
        assert!(cleanup.done);
        let errors = call(&sandbox, &metrics, &plugin, "validate", |p| p.validate("{}", None))
            .await
            .expect("the call runs")
            .expect("field errors");
        assert!(errors.is_empty(), "{errors:?}");
        let object = resource("ok", "");
        call(&sandbox, &metrics, &plugin, "convert", move |p| p.convert(&object, "test.stateward.dev/v1"))
            .await
            .expect("the call runs")
            .expect("converted");
    });
    let text = metrics.encode();
    let name = plugin.name();
    for (export, n) in [("reconcile", 2), ("finalize", 1), ("validate", 1), ("convert", 1)] {
        let line = format!(
            "stateward_plugin_call_duration_seconds_count{{plugin=\"{name}\",export=\"{export}\"}} {n}"
        );
        assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
    }
    let traps = format!("stateward_plugin_traps_total{{plugin=\"{name}\",reason=\"trap\"}} 1");
    assert!(text.lines().any(|l| l == traps), "no {traps:?} in\n{text}");
}

#[test]
fn events_past_the_cap_and_status_the_host_owns_or_too_large_are_refused() {
    let plugin = load(&sandbox(), "fixture-hostile");
    for (mode, expected) in [
        ("events-flood", "17 events in one plan (at most 16)"),
        ("status-host-field", "status.extra may not set requests"),
        ("status-huge", "status.extra is 70008 bytes (at most 65536)"),
    ] {
        let err = reconcile(&plugin, mode, "").expect_err(mode);
        assert!(matches!(err, RuntimeError::MalformedPlan { .. }), "{mode}: got {err}");
        assert!(err.to_string().contains(expected), "{mode}: {err}");
    }
    assert_still_works(&plugin);
}

#[test]
fn a_plugin_sees_secrets_as_names_and_keys_only() {
    let mut registry = stateward::runtime::Registry::default();
    registry.insert(std::sync::Arc::new(load(&sandbox(), "fixture-hostile")));
    let resource: serde_json::Value = serde_json::from_str(&resource("echo-children", "")).unwrap();
    let secret = serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "h-credentials", "namespace": "ns1", "labels": {"stateward.dev/instance": "h"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\"data\":{\"password\":\"aHVudGVyMg==\"}}"}},
        "data": {"password": "aHVudGVyMg=="},
    });
    let rendered = stateward::render::render(&registry, resource, &[secret], &[], 0).expect("render");
    let seen = &rendered.plan.status.extra["children"][0];
    assert_eq!(seen["metadata"]["name"], "h-credentials");
    assert_eq!(seen["data"], serde_json::json!({"password": ""}), "keys only: {seen}");
    assert!(!seen.to_string().contains("aHVudGVyMg=="), "a value crossed into the plugin: {seen}");
}
