//! The guardrails on the live path: a plugin (the hostile fixture) plans a privileged
//! StatefulSet next to a harmless ConfigMap. The whole plan is held back: the resource shows
//! Degraded/PolicyDenied with the rule's message, nothing of the plan reaches the API server,
//! and the denial is in the audit log, whose chain verifies.

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use crate::e2e;
use crate::support;

use std::process::Command;
use std::time::Duration;

use e2e::*;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::Api;
use serde_json::json;
use stateward_testkit::TestEnv;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn privileged_plan_is_denied_audited_and_never_applied() {
    let env = TestEnv::new("policy").await.unwrap();
    let dir = tempdir::Dir::new("policy-plugins");
    std::fs::copy(support::wasm("fixture-hostile"), dir.0.join("hostile.wasm")).unwrap();

    // The fixture's CRD, rendered from its info() like deploy/crds.
    let crds = Command::new(env!("CARGO_BIN_EXE_stateward"))
        .args(["crds", "--plugin-dir"])
        .arg(&dir.0)
        .output()
        .unwrap();
    assert!(crds.status.success(), "{}", String::from_utf8_lossy(&crds.stderr));
    let out =
        kubectl_stdin(&env, &["apply", "--server-side", "-f", "-"], &String::from_utf8_lossy(&crds.stdout));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    stateward_testkit::wait_established(env.kubeconfig(), &["hostilethings.test.stateward.dev"]).unwrap();

    // The shipped bundle, with the fixture on the plugins allow-list (the operator checks its
    // built-in plugins against plugins.rego before it starts).
    let policies = tempdir::Dir::new("policy-bundle");
    for entry in std::fs::read_dir(workspace_root().join("policies")).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, policies.0.join(path.file_name().unwrap())).unwrap();
        }
    }
    let data_path = policies.0.join("data.json");
    let mut data: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&data_path).unwrap()).unwrap();
    data["stateward"]["config"]["plugins"]["allowed"]["hostile"] = json!({"digests": []});
    std::fs::write(&data_path, data.to_string()).unwrap();

    // A policy ConfigMap that would switch the guardrails off: the guardrails package with no
    // rule in it and no tests, every rule the plan breaks set to dryrun. It is a layer over the
    // bundle the operator starts with, which stays the floor (policy::floor): the plan is
    // still denied.
    let mut layer: serde_json::Map<String, serde_json::Value> = serde_json::Map::new();
    for entry in std::fs::read_dir(&policies.0).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let bundled = name.ends_with(".rego") || name.ends_with(".json");
        if path.is_file() && bundled && !name.starts_with("guardrails") {
            layer.insert(name, std::fs::read_to_string(&path).unwrap().into());
        }
    }
    // A guardrails package that denies nothing: as the whole bundle, it would allow any plan.
    layer.insert("guardrails-off.rego".into(), "package stateward.guardrails\n\ndeny := set()\n".into());
    let mut layer_data = data.clone();
    layer_data["stateward"]["config"]["enforcement"]["guardrails"] =
        json!({"privileged": "dryrun", "run-as-non-root": "dryrun", "resource-limits": "dryrun"});
    layer.insert("data.json".into(), layer_data.to_string().into());
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "weaker", "labels": {"stateward.dev/policy": "true"}}, "data": layer});
    let out = kubectl_stdin(&env, &["apply", "-n", &env.namespace, "-f", "-"], &cm.to_string());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let floor_digest = stateward::policy::Bundle::from_dir(&policies.0).unwrap().digest().to_string();

    let mut op = Operator::start_with(
        &env,
        "policy",
        OperatorOpts {
            namespace: env.namespace.clone(),
            lease_namespace: env.namespace.clone(),
            plugin_dir: Some(dir.0.clone()),
            policy_dir: Some(policies.0.clone()),
            ..Default::default()
        },
    );
    op.wait_ready(Duration::from_secs(60)).await;
    // The layer is in force (the controllers start once the reloaders applied what they found).
    let (health, _) = wait_for("the policy ConfigMap in force", Duration::from_secs(30), || {
        let (_, health) = op.get("/debug/healthz").unwrap();
        let health: serde_json::Value = serde_json::from_str(&health).unwrap();
        let in_force = health["policy"]["bundleDigest"].as_str().unwrap_or_default().to_string();
        let done = !in_force.is_empty() && in_force != floor_digest;
        async move {
            if done {
                Ok(health)
            } else {
                Err(format!("not yet: {health}"))
            }
        }
    })
    .await;
    assert!(health["policy"]["lastRejection"].is_null(), "{health}");

    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("test.stateward.dev", "v1", "HostileThing"),
        "hostilethings",
    );
    let things: Api<DynamicObject> = Api::namespaced_with(env.client.clone(), &env.namespace, &ar);
    apply(
        &env,
        &env.namespace,
        &json!({
            "apiVersion": "test.stateward.dev/v1", "kind": "HostileThing",
            "metadata": {"name": "h"}, "spec": {"mode": "privileged"},
        }),
    );
    let (message, took) = wait_for("Degraded/PolicyDenied on the resource", Duration::from_secs(60), || {
        let things = things.clone();
        async move {
            let cr = get_cr(&things, "h").await.ok_or("CR not found")?;
            let degraded = cr
                .pointer("/status/conditions")
                .and_then(|c| c.as_array())
                .and_then(|c| c.iter().find(|c| c["type"] == "Degraded" && c["status"] == "True"))
                .cloned()
                .ok_or_else(|| format!("no Degraded=True yet: {}", summary(&cr)))?;
            if degraded["reason"] != "PolicyDenied" {
                return Err(format!("Degraded for {}", degraded["reason"]));
            }
            Ok(degraded["message"].as_str().unwrap_or_default().to_string())
        }
    })
    .await;
    eprintln!("policy: denied within {took:.1?}: {message}");
    assert!(message.contains("privileged"), "{message}");

    // Held back for good: give the operator its retries, then nothing of the plan exists.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let sts: Api<StatefulSet> = env.api();
    let cms: Api<ConfigMap> = env.api();
    assert!(
        sts.get_opt("root").await.unwrap().is_none(),
        "the privileged StatefulSet reached the API server"
    );
    assert!(
        cms.get_opt("harmless").await.unwrap().is_none(),
        "an allowed action of a denied plan was applied"
    );

    let audit = std::fs::read_to_string(&op.audit).unwrap();
    let denial = audit
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|r| {
            r["path"].as_str().is_some_and(|p| p.contains("guardrails"))
                && r.to_string().contains("privileged")
        })
        .expect("the denial is audited");
    assert_eq!(denial["requested_by"], "plugin/hostile");
    let verify = Command::new(env!("CARGO_BIN_EXE_stateward"))
        .args(["audit", "verify"])
        .arg(&op.audit)
        .output()
        .unwrap();
    assert!(verify.status.success(), "audit chain: {}", String::from_utf8_lossy(&verify.stdout));

    // Let the namespace go even though the operator is about to stop.
    op.kill9();
    let _ = things
        .patch("h", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}})))
        .await;
}
