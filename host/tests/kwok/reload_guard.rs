//! The shipped ValidatingAdmissionPolicy (deploy/operator/reload-configmaps-policy.yaml)
//! against the local cluster's real kube-apiserver: the operator's ServiceAccount (here by
//! impersonation, with RBAC that would let it) may not create, change or delete a ConfigMap
//! carrying the hot-reload labels, or the policy floor's, in its namespace; any other
//! ConfigMap it may write.
//!
//! The policy is cluster-scoped and applied as shipped; it only concerns a ServiceAccount
//! named `stateward` writing in its own namespace, so it changes nothing for other tests.

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use crate::e2e;

use std::process::Output;
use std::time::{Duration, Instant};

use e2e::*;
use serde_json::json;
use stateward_testkit::TestEnv;

/// `kubectl` as the namespace's `stateward` ServiceAccount.
fn as_operator(env: &TestEnv, args: &[&str], stdin: Option<&str>) -> Output {
    let user = format!("--as=system:serviceaccount:{}:stateward", env.namespace);
    let mut all = vec![user.as_str(), "-n", &env.namespace];
    all.extend_from_slice(args);
    env.kubectl_output(&all, stdin).unwrap()
}

fn configmap(name: &str, labels: serde_json::Value) -> String {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels}, "data": {"k": "v"}})
    .to_string()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn refused(o: &Output, what: &str) {
    assert!(!o.status.success(), "{what} was allowed");
    let err = stderr(o);
    assert!(err.contains("stateward-reload-configmaps"), "{what}: refused for another reason: {err}");
    assert!(err.contains("hot-reload") || err.contains("stateward.dev/plugin"), "{what}: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_account_cannot_write_its_own_plugin_and_policy_configmaps() {
    let env = TestEnv::new("reloadguard").await.unwrap();
    let manifest = workspace_root().join("deploy/operator/reload-configmaps-policy.yaml");
    let out = env
        .kubectl()
        .args(["apply", "--server-side", "--force-conflicts", "-f"])
        .arg(&manifest)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    // RBAC that lets the account write any ConfigMap here, as the shipped ClusterRole does:
    // whatever refuses it below is the admission policy.
    let rbac = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "configmaps", "namespace": env.namespace},
         "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                    "verbs": ["get", "list", "create", "update", "patch", "delete"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "configmaps", "namespace": env.namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "configmaps"},
         "subjects": [{"kind": "ServiceAccount", "name": "stateward", "namespace": env.namespace}]}]})
    .to_string();
    let out = kubectl_stdin(&env, &["apply", "-f", "-"], &rbac);
    assert!(out.status.success(), "{}", stderr(&out));

    // A plugin ConfigMap: refused once the API server has loaded the policy (its informer
    // takes a moment); a create that got through before that is undone and tried again.
    let plugin_cm = configmap("stateward-plugin-redis", json!({"stateward.dev/plugin": "redis"}));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = as_operator(&env, &["create", "-f", "-"], Some(&plugin_cm));
        if !out.status.success() {
            refused(&out, "creating a plugin ConfigMap");
            break;
        }
        assert!(Instant::now() < deadline, "the admission policy never took effect");
        let _ = env
            .kubectl()
            .args(["delete", "configmap", "stateward-plugin-redis", "-n", &env.namespace])
            .output();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let policy_cm = configmap("policy", json!({"stateward.dev/policy": "true"}));
    refused(&as_operator(&env, &["create", "-f", "-"], Some(&policy_cm)), "creating a policy ConfigMap");

    // One an administrator wrote: the operator may neither change nor delete it.
    let out = kubectl_stdin(&env, &["create", "-n", &env.namespace, "-f", "-"], &policy_cm);
    assert!(out.status.success(), "{}", stderr(&out));
    let patch = r#"{"data":{"extra.rego":"package stateward.extra"}}"#;
    refused(
        &as_operator(&env, &["patch", "configmap", "policy", "--type=merge", "-p", patch], None),
        "patching a policy ConfigMap",
    );
    let unlabel = r#"{"metadata":{"labels":{"stateward.dev/policy":null}}}"#;
    refused(
        &as_operator(&env, &["patch", "configmap", "policy", "--type=merge", "-p", unlabel], None),
        "unlabelling a policy ConfigMap",
    );
    refused(&as_operator(&env, &["delete", "configmap", "policy"], None), "deleting a policy ConfigMap");

    // The policy floor's data ([hardening-2] item 4): as the chart installs it (immutable,
    // named after its content), an administrator's. The operator can neither delete it nor
    // make one again under its name (with other data), nor label another one as the floor.
    let floor = json!({"apiVersion": "v1", "kind": "ConfigMap", "immutable": true,
        "metadata": {"name": "stateward-policy-data-1234", "labels": {"app.kubernetes.io/component": "policy-floor"}},
        "data": {"data.json": "{}"}})
    .to_string();
    let out = kubectl_stdin(&env, &["create", "-n", &env.namespace, "-f", "-"], &floor);
    assert!(out.status.success(), "{}", stderr(&out));
    refused(
        &as_operator(&env, &["delete", "configmap", "stateward-policy-data-1234"], None),
        "deleting the floor's ConfigMap",
    );
    let out = env
        .kubectl()
        .args(["delete", "configmap", "stateward-policy-data-1234", "-n", &env.namespace])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let forged = floor.replace(r#""data.json":"{}""#, r#""data.json":"{\"allowed_registries\":[\"\"]}""#);
    assert_ne!(forged, floor);
    refused(&as_operator(&env, &["create", "-f", "-"], Some(&forged)), "re-creating the floor's ConfigMap");
    let relabel = r#"{"metadata":{"labels":{"app.kubernetes.io/component":"policy-floor"}}}"#;

    // Any other ConfigMap: created, changed and deleted as before; labelling one is refused.
    let other = configmap("topology", json!({"app": "x"}));
    let out = as_operator(&env, &["create", "-f", "-"], Some(&other));
    assert!(out.status.success(), "an unlabelled ConfigMap was refused: {}", stderr(&out));
    let out = as_operator(&env, &["patch", "configmap", "topology", "--type=merge", "-p", patch], None);
    assert!(out.status.success(), "{}", stderr(&out));
    let label = r#"{"metadata":{"labels":{"stateward.dev/plugin":"redis"}}}"#;
    refused(
        &as_operator(&env, &["patch", "configmap", "topology", "--type=merge", "-p", label], None),
        "labelling a ConfigMap for hot reload",
    );
    refused(
        &as_operator(&env, &["patch", "configmap", "topology", "--type=merge", "-p", relabel], None),
        "labelling a ConfigMap as the policy floor",
    );
    let out = as_operator(&env, &["delete", "configmap", "topology"], None);
    assert!(out.status.success(), "{}", stderr(&out));
    // Administrators are not concerned.
    let out = env.kubectl().args(["delete", "configmap", "policy", "-n", &env.namespace]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
}
