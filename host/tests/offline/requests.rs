//! Requests to the running service (WIT 0.2), offline: a hostile plugin's requests are refused
//! before anything is sent — by the guardrails or by the host's plan checks, audited either
//! way — and a component built against the earlier contract (0.1.0, kept as a fixture) still
//! loads and plans.

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::sync::Arc;

use serde_json::{json, Value};
use stateward::policy::{AuditLog, AuditSink, Bundle, FsyncPolicy, Gate, PolicyEngine};
use stateward::render::{render, render_checked};
use stateward::runtime::{Action, Contract, Plugin, Registry, Response};
use support::{load, sandbox, workspace_root};

fn hostile_registry() -> Registry {
    let mut registry = Registry::default();
    registry.insert(Arc::new(load(&sandbox(), "fixture-hostile")));
    registry
}

fn hostile(mode: &str) -> Value {
    json!({
        "apiVersion": "test.stateward.dev/v1", "kind": "HostileThing",
        "metadata": {"name": "h", "namespace": "ns1"},
        "spec": {"mode": mode},
    })
}

/// A Pod of the instance `h`, as the host would observe it.
fn own_pod() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "h-0", "namespace": "ns1", "labels": {"stateward.dev/instance": "h"}},
        "spec": {"containers": [{"name": "main", "ports": [{"containerPort": 8080}]}]},
    })
}

struct Audited {
    gate: Gate,
    log: std::path::PathBuf,
    dir: std::path::PathBuf,
}

impl Audited {
    fn new(name: &str) -> Self {
        let engine =
            PolicyEngine::compile(&Bundle::from_dir(&workspace_root().join("policies")).expect("bundle"))
                .expect("compile");
        let dir = std::env::temp_dir().join(format!("stateward-requests-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        let log = dir.join("audit.jsonl");
        let audit = AuditLog::open(&AuditSink::File(log.clone()), FsyncPolicy::OsBuffered).expect("audit");
        Self { gate: Gate::new(Arc::new(engine), Arc::new(audit)), log, dir }
    }

    fn records(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .expect("read audit")
            .lines()
            .map(|l| serde_json::from_str(l).expect("audit line is JSON"))
            .collect()
    }
}

impl Drop for Audited {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn requests_the_guardrails_refuse_are_denied_with_the_rule_and_audited() {
    let registry = hostile_registry();
    let audited = Audited::new("deny");
    for (mode, rule, verb) in [
        ("exec-foreign", "foreign-target", "exec"),
        ("exec-unlisted", "exec-command-not-allowed", "exec"),
        ("http-foreign", "foreign-target", "http"),
    ] {
        let rendered =
            render_checked(&registry, &audited.gate, hostile(mode), &[own_pod()], &[], 0).expect("render");
        let policy = rendered.policy.expect("a verdict");
        assert!(!policy.allowed, "{mode}: must be denied");
        assert!(
            policy.denied.iter().any(|(_, m)| m.starts_with(&format!("{rule}: "))),
            "{mode}: expected {rule}, got {:?}",
            policy.denied
        );
        let records = audited.records();
        let audited_denial = records.iter().any(|r| {
            r["input"]["action"]["verb"] == verb
                && r["result"]["enforced"]["denied"]
                    .as_array()
                    .is_some_and(|d| d.iter().any(|m| m.as_str().is_some_and(|m| m.starts_with(rule))))
        });
        assert!(audited_denial, "{mode}: no audit record of the denial");
    }
}

#[test]
fn a_flood_of_requests_a_huge_stdin_or_a_busy_poll_is_refused_before_policy_with_a_clear_reason_and_audited()
{
    let registry = hostile_registry();
    let audited = Audited::new("refused");
    for (mode, reason) in [
        ("requests-flood", "the plan has 10000 requests; at most 32 are allowed in one plan"),
        ("stdin-10mb", "request x: 10485760 bytes of input (stdin or body); at most 65536 are allowed"),
        ("poll-every-0", "request x: mode every 0 ms; a poll may run at most every 500 ms"),
    ] {
        let before = audited.records().len();
        let err = render_checked(&registry, &audited.gate, hostile(mode), &[own_pod()], &[], 0)
            .expect_err("refused");
        let text = err.to_string();
        assert!(text.contains(reason) && text.contains("nothing sent"), "{mode}: {text}");
        // One audit record of the host's refusal, no guardrails decision (policy never asked).
        let records = audited.records();
        let new = &records[before..];
        assert_eq!(new.len(), 1, "{mode}: {new:?}");
        assert_eq!(new[0]["result"]["refusedBy"], "host", "{mode}: {}", new[0]);
        assert_eq!(new[0]["input"]["action"]["refused"], "requests_refused", "{mode}: {}", new[0]);
        let denied = new[0]["result"]["enforced"]["denied"].to_string();
        assert!(denied.contains(reason), "{mode}: {denied}");
    }
}

#[test]
fn recorded_responses_reach_the_plugin_offline() {
    let mut registry = Registry::default();
    registry.insert(Arc::new(load(&sandbox(), "stateward-postgres")));
    let text =
        std::fs::read_to_string(workspace_root().join("deploy/samples/postgres.yaml")).expect("sample");
    let mut sample = stateward::render::parse_documents(&text, "sample").expect("parse").remove(0);
    sample["metadata"]["namespace"] = json!("db");
    let name = sample["metadata"]["name"].as_str().expect("name").to_string();
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("{name}-0"), "namespace": "db", "uid": "0a1b2c3d-4e5f",
                     "labels": {"stateward.dev/instance": name}},
        "status": {"containerStatuses": [{"name": "postgres", "state": {"running": {}}}]},
    });
    let without = render(&registry, sample.clone(), std::slice::from_ref(&pod), &[], 0).expect("render");
    let polls: Vec<&Action> = without.plan.actions.iter().filter(|a| a.is_request()).collect();
    assert_eq!(polls.len(), 1, "one poll per running instance");
    let answer = Response {
        // The poll of this pod's incarnation (uid prefix, restarts).
        id: format!("stats-{name}-0-0a1b2c3d-r0"),
        code: Some(0),
        stdout: "f|12|100|0/3000148|0/3000148|1||\n".into(),
        ..Response::default()
    };
    let with = render(&registry, sample, &[pod], &[answer], 0).expect("render");
    let instances = &with.plan.status.extra["instances"];
    assert_eq!(instances[0]["role"], "primary", "{instances}");
    assert_eq!(instances[0]["maxConnections"], 100);
    assert_eq!(with.plan.status.extra["currentPrimary"], format!("{name}-0"), "confirmed by its answer");
}

#[test]
fn a_component_of_the_earlier_contract_loads_and_plans_beside_the_current_ones() {
    let fixture = workspace_root().join("tests/fixtures/contract-0.1/redis.wasm");
    let old = Plugin::load_file(&sandbox(), &fixture).expect("a 0.1.0 component loads");
    assert_eq!(old.contract(), Contract::V0_1);
    assert!(old.exports().iter().any(|e| e == "stateward:plugin/service@0.1.0"), "{:?}", old.exports());
    let current = load(&sandbox(), "stateward-postgres");
    assert_eq!(current.contract(), Contract::V0_2);
    let mut registry = Registry::default();
    registry.insert(Arc::new(old));
    registry.insert(Arc::new(current));
    let text = std::fs::read_to_string(workspace_root().join("deploy/samples/redis.yaml")).expect("sample");
    let sample = stateward::render::parse_documents(&text, "sample").expect("parse").remove(0);
    let rendered = render(&registry, sample, &[], &[], 0).expect("the 0.1.0 plugin plans");
    assert!(rendered
        .plan
        .actions
        .iter()
        .any(|a| matches!(a, Action::Apply { object } if object["kind"] == "StatefulSet")));
    assert!(!rendered.plan.actions.iter().any(Action::is_request), "0.1.0 never asks the running service");
    // `plugin inspect` says which contract each uses.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_stateward"))
        .args(["plugin", "inspect"])
        .arg(&fixture)
        .output()
        .expect("run inspect");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("contract: stateward:plugin@0.1.0"), "{text}");
}
