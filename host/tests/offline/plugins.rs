//! The three service plugins, run as Wasm components through the real sandbox: golden renders
//! of the samples, idempotency, conversion round trips, validation of hostile input, the CRDs
//! in deploy/crds being current, and each component fitting a ConfigMap.
//!
//! STATEWARD_BLESS=1 rewrites the golden files and deploy/crds.

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;
use stateward::policy::{AuditLog, AuditSink, Bundle, BundleFile, FsyncPolicy, Gate, PolicyEngine};
use stateward::render::{parse_documents, render, render_checked, to_yaml};
use stateward::runtime::{Action, Plugin, Registry};
use support::{load, sandbox, wasm, workspace_root};

const PLUGINS: [&str; 3] = ["postgres", "redis", "elasticsearch"];
/// A fixed clock so renders are reproducible.
const NOW_MS: u64 = 1_767_225_600_000;

fn bless() -> bool {
    std::env::var_os("STATEWARD_BLESS").is_some()
}

fn registry() -> Registry {
    let sandbox = sandbox();
    let mut registry = Registry::default();
    for p in PLUGINS {
        registry.insert(Arc::new(load(&sandbox, &format!("stateward-{p}"))));
    }
    registry
}

fn sample(name: &str) -> Value {
    let path = workspace_root().join("deploy/samples").join(format!("{name}.yaml"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    parse_documents(&text, "sample").expect("sample parses").remove(0)
}

fn check_golden(path: PathBuf, actual: &str) {
    if bless() {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, actual).expect("write golden");
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with STATEWARD_BLESS=1 to create it)", path.display()));
    assert_eq!(expected, actual, "{} is stale (STATEWARD_BLESS=1 rewrites it)", path.display());
}

fn applied(plan: &stateward::runtime::Plan) -> Vec<Value> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            Action::Apply { object } => Some(object.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn samples_render_to_their_golden_files() {
    let registry = registry();
    for p in PLUGINS {
        let rendered = render(&registry, sample(p), &[], &[], NOW_MS).expect("render");
        let kinds: Vec<String> = applied(&rendered.plan)
            .iter()
            .map(|o| o["kind"].as_str().unwrap_or_default().to_string())
            .collect();
        for kind in ["StatefulSet", "Service", "ConfigMap", "PodDisruptionBudget"] {
            assert!(kinds.iter().any(|k| k == kind), "{p}: no {kind} in {kinds:?}");
        }
        assert!(
            rendered.plan.actions.iter().any(|a| matches!(a, Action::EnsureSecret { .. })),
            "{p}: no ensure-secret"
        );
        // The component's digest depends on where it was built (paths in panic messages).
        let mut rendered = rendered;
        rendered.plugin.digest = "(digest of the build)".into();
        let yaml = to_yaml(&rendered).expect("yaml");
        check_golden(workspace_root().join("host/tests/golden").join(format!("{p}.yaml")), &yaml);
    }
}

#[test]
fn reconcile_is_idempotent_through_wasm() {
    let registry = registry();
    for p in PLUGINS {
        let first = render(&registry, sample(p), &[], &[], NOW_MS).expect("render");
        let children = applied(&first.plan);
        let second = render(&registry, sample(p), &children, &[], NOW_MS).expect("render again");
        let third = render(&registry, sample(p), &children, &[], NOW_MS).expect("render a third time");
        let a = serde_json::to_string(&second.plan).expect("json");
        let b = serde_json::to_string(&third.plan).expect("json");
        assert_eq!(a, b, "{p}: same observed state must give a byte-identical plan");
        assert_eq!(
            applied(&first.plan),
            applied(&second.plan),
            "{p}: feeding back its own objects must not change what it applies"
        );
        assert_eq!(first.plan.actions.len(), second.plan.actions.len(), "{p}: no new actions");
    }
}

#[test]
fn conversion_round_trips_through_wasm() {
    let registry = registry();
    for p in PLUGINS {
        let original = sample(p);
        let api = original["apiVersion"].as_str().expect("apiVersion").to_string();
        let kind = original["kind"].as_str().expect("kind").to_string();
        let plugin = registry.for_object(&api, &kind).expect("plugin");
        let group = api.split('/').next().expect("group");
        let down = plugin.convert(&original.to_string(), &format!("{group}/v1alpha1")).expect("to v1alpha1");
        assert_eq!(down["apiVersion"], format!("{group}/v1alpha1"));
        assert_ne!(down["spec"], original["spec"], "{p}: the versions must really differ");
        let up = plugin.convert(&down.to_string(), &format!("{group}/v1")).expect("to v1");
        assert_eq!(up["spec"], original["spec"], "{p}: v1 -> v1alpha1 -> v1 lost a field");
        let again = plugin.convert(&up.to_string(), &format!("{group}/v1alpha1")).expect("to v1alpha1");
        assert_eq!(again["spec"], down["spec"], "{p}: v1alpha1 -> v1 -> v1alpha1 lost a field");
    }
}

#[test]
fn validate_survives_garbage_truncated_and_huge_input() {
    let registry = registry();
    let huge = format!("{{\"spec\":{{\"parameters\":{{\"x\":\"{}\"}}}}}}", "a".repeat(1 << 20));
    for plugin in registry.plugins() {
        let good = sample(plugin.name()).to_string();
        let truncated = &good[..good.len() / 2];
        for input in ["", "garbage", "{\"spec\": [1,2,", truncated, huge.as_str(), "[]", "null"] {
            let errors = plugin.validate(input, None).expect("validate must answer, not trap");
            assert!(!errors.is_empty(), "{}: {:.40} must be rejected", plugin.name(), input);
            assert!(errors.iter().all(|e| !e.message.is_empty()));
        }
        assert_eq!(
            plugin.validate(&good, None).expect("validate"),
            vec![],
            "{}: sample must be valid",
            plugin.name()
        );
    }
}

#[test]
fn crds_in_deploy_are_current() {
    let registry = registry();
    let conversion =
        stateward::webhook::config::crd_conversion(&stateward::webhook::Endpoint::default(), None);
    for plugin in registry.plugins() {
        for kind in &plugin.info().kinds {
            let yaml = yaml_serde::to_string(&stateward::crd::render(kind, &conversion)).expect("yaml");
            check_golden(workspace_root().join("deploy/crds").join(stateward::crd::file_name(kind)), &yaml);
        }
    }
}

#[test]
fn each_component_fits_a_configmap_and_imports_only_what_is_linked() {
    let sandbox = sandbox();
    for p in PLUGINS {
        let path = wasm(&format!("stateward-{p}"));
        let size = std::fs::metadata(&path).expect("stat").len();
        let limit = stateward::reload::plugins::max_component_bytes() as u64;
        assert!(size <= limit, "{p}: {size} bytes is over the {limit} a plugin ConfigMap holds");
        let plugin = Plugin::load_file(&sandbox, &path).expect("load");
        for import in plugin.imports() {
            assert!(
                ["wasi:io/", "wasi:cli/", "stateward:plugin/"].iter().any(|a| import.starts_with(a)),
                "{p} imports {import}"
            );
        }
    }
}

/// A guardrail keyed on the digest form the policies document (`sha256:<64 hex>`, as in
/// policies/plugins.rego and the fixtures of policies/*_test.rego).
const DIGEST_GUARDRAIL: &str = r#"package stateward.guardrails

deny contains msg if {
	not regex.match(`^sha256:[0-9a-f]{64}$`, input.plugin.digest)
	msg := sprintf("digest-format: plugin digest %s is not sha256:<64 hex>", [input.plugin.digest])
}
"#;

#[test]
fn guardrails_see_the_plugin_digest_as_the_plugins_decision_does() {
    let registry = registry();
    let mut files = Bundle::from_dir(&workspace_root().join("policies")).expect("bundle").files().to_vec();
    files.push(BundleFile { name: "digest_contract.rego".into(), contents: DIGEST_GUARDRAIL.into() });
    let engine = PolicyEngine::compile(&Bundle::from_files(files).expect("bundle")).expect("compile");
    let dir = std::env::temp_dir().join(format!("stateward-digest-contract-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let log = dir.join("audit.jsonl");
    let audit = AuditLog::open(&AuditSink::File(log.clone()), FsyncPolicy::OsBuffered).expect("audit");
    let gate = Gate::new(Arc::new(engine), Arc::new(audit));
    for p in PLUGINS {
        let rendered = render_checked(&registry, &gate, sample(p), &[], &[], NOW_MS).expect("render");
        let policy = rendered.policy.expect("a verdict");
        let wrong: Vec<_> = policy.denied.iter().filter(|(_, m)| m.starts_with("digest-format")).collect();
        assert!(wrong.is_empty(), "{p}: {wrong:?}");
    }
    // Every guardrails decision carried exactly the digest the plugins decision gets for the
    // same build (policy_input::PluginLoad::of).
    let records: Vec<Value> = std::fs::read_to_string(&log)
        .expect("read audit")
        .lines()
        .map(|l| serde_json::from_str(l).expect("audit line is JSON"))
        .collect();
    assert!(!records.is_empty());
    for plugin in registry.plugins() {
        let load = stateward::policy_input::PluginLoad::of(&plugin, "builtin");
        let ours: Vec<&Value> =
            records.iter().filter(|r| r["input"]["plugin"]["name"] == plugin.name()).collect();
        assert!(!ours.is_empty(), "{}: no guardrails decision", plugin.name());
        for r in ours {
            assert_eq!(r["input"]["plugin"]["digest"], load.digest.as_str(), "{}", plugin.name());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
