//! Upgrades, on the local cluster (kwok nodes: the objects, not the servers): the three samples
//! as the last release before the HA wave (commit a3d9881) left them, each resource with its
//! status and the children that release applied (host/tests/fixtures/last-release), are taken
//! over by this build. Every child it made is updated in place (the same uid: nothing deleted
//! and made again, no StatefulSet recreated, which would orphan nothing but restart every pod
//! at once), every claim is kept, and the Services its clients used keep their names, now
//! selecting by role. What the servers do on such a takeover is shown on real pods
//! (`realpods` `postgres::migration`, `redis::migration`).
#![allow(clippy::expect_used, clippy::panic)]

use crate::e2e;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use e2e::*;
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::Api;
use serde_json::{json, Value};
use stateward_testkit::TestEnv;

/// (file under the fixtures, the resource's kind, its name).
const SAMPLES: [(&str, &str, &str); 3] = [
    ("postgres.yaml", "PostgresCluster", "main-pg"),
    ("redis.yaml", "RedisCluster", "cache"),
    ("elasticsearch.yaml", "ElasticsearchCluster", "logs"),
];

/// `kubectl get <target> -o json`.
fn get_json(env: &TestEnv, target: &str) -> Value {
    let out =
        env.kubectl().args(["get", "-n", &env.namespace, target, "-o", "json"]).output().expect("kubectl");
    assert!(out.status.success(), "get {target}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("json")
}

/// The children as the last release's operator applied them (see `last_release::apply`), each
/// controlled by the resource but the Secrets (its host created those with no owner); their
/// placeholder values made real enough to be read. Returns their (kind, name).
fn apply_children(env: &TestEnv, file: &str, cr: &Value) -> Vec<(String, String)> {
    let owner = last_release::owner_reference(cr);
    let mut items = last_release::documents(&last_release::fixture_text(file));
    for o in &mut items {
        if o["kind"] == "Secret" {
            if let Some(data) = o["stringData"].as_object_mut() {
                for v in data.values_mut() {
                    *v = json!("placeholder-value-of-the-last-release");
                }
            }
            if let Some(a) = o["metadata"]["annotations"].as_object_mut() {
                a.insert("stateward.dev/cert-not-after".into(), json!("4102444800"));
            }
        } else {
            o["metadata"]["ownerReferences"] = json!([owner]);
        }
    }
    last_release::apply(env, &items);
    items
        .iter()
        .map(|o| {
            (
                o["kind"].as_str().unwrap_or_default().to_string(),
                o["metadata"]["name"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// The uid of every object named, by (kind, name).
fn uids(env: &TestEnv, objects: &[(String, String)]) -> BTreeMap<(String, String), String> {
    objects
        .iter()
        .map(|(k, n)| {
            let o = get_json(env, &format!("{}/{n}", k.to_lowercase()));
            ((k.clone(), n.clone()), o["metadata"]["uid"].as_str().unwrap_or_default().to_string())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_releases_samples_are_taken_over_in_place() {
    let env = TestEnv::new("e2e-upgrade").await.expect("test env");
    let _teardown_env = Teardown::new(&env);
    prepare(&env);

    // The resources, their status and their children as the last release left them.
    let mut children = Vec::new();
    let mut instances = Vec::new();
    for mut cr in last_release::documents(&last_release::fixture_text("samples.yaml")) {
        let (file, kind, name) = SAMPLES
            .iter()
            .find(|(_, k, _)| cr["kind"] == json!(k))
            .copied()
            .unwrap_or_else(|| panic!("a sample of no known kind: {cr}"));
        // (So that the namespace can be removed after the test.)
        cr["spec"]["deletionProtection"] = json!(false);
        apply(&env, &env.namespace, &cr);
        let plural = format!("{}s", kind.to_lowercase());
        let made = get_json(&env, &format!("{plural}.stateward.dev/{name}"));
        let mut status = json!({ "phase": "Running", "readyReplicas": 3, "observedGeneration": made["metadata"]["generation"] });
        if kind == "PostgresCluster" {
            status["currentPrimary"] = json!(format!("{name}-0"));
        }
        let out = env
            .kubectl()
            .args(["patch", "-n", &env.namespace, &format!("{plural}.stateward.dev/{name}")])
            .args(["--subresource=status", "--type=merge", "-p", &json!({ "status": status }).to_string()])
            .output()
            .expect("kubectl");
        assert!(out.status.success(), "status of {name}: {}", String::from_utf8_lossy(&out.stderr));
        children.extend(apply_children(&env, file, &made));
        instances.push((kind, name));
    }
    for (_, name) in &instances {
        wait_for(&format!("the claims of {name}"), Duration::from_secs(120), || async {
            let n = pvc_uids(&env, name).await.len();
            if n == 3 {
                Ok(())
            } else {
                Err(format!("{n} claims"))
            }
        })
        .await;
    }
    let before = uids(&env, &children);
    let mut claims_before = BTreeMap::new();
    for (_, name) in &instances {
        claims_before.extend(pvc_uids(&env, name).await);
    }

    // This build takes over.
    let started = Instant::now();
    let mut op = Operator::start(&env, "upgrade");
    op.wait_ready(Duration::from_secs(120)).await;
    let sets: Api<StatefulSet> = env.api();
    for (_, name) in &instances {
        let sets = sets.clone();
        wait_for(&format!("StatefulSet {name} applied by this build"), Duration::from_secs(180), || {
            let sets = sets.clone();
            async move {
                let s = sets.get(name).await.map_err(|e| e.to_string())?;
                let hashed =
                    s.metadata.annotations.unwrap_or_default().contains_key("stateward.dev/template-hash");
                let strategy = s.spec.and_then(|s| s.update_strategy).and_then(|u| u.type_);
                if hashed && strategy.as_deref() == Some("OnDelete") {
                    Ok(())
                } else {
                    Err(format!("template hash {hashed}, updateStrategy {strategy:?}"))
                }
            }
        })
        .await;
    }
    let took = started.elapsed();

    // Every child of the last release is the same object, updated in place; every claim kept.
    let after = uids(&env, &children);
    assert_eq!(after, before, "children deleted and made again");
    let mut claims_after = BTreeMap::new();
    for (_, name) in &instances {
        claims_after.extend(pvc_uids(&env, name).await);
    }
    assert_eq!(claims_after, claims_before, "claims");
    // The Services clients used keep their names and now select by role; the old pod-name
    // selectors are gone with the old manager's fields.
    let selector = |svc: &str| get_json(&env, &format!("service/{svc}"))["spec"]["selector"].clone();
    for (svc, role) in [("main-pg-rw", Some("primary")), ("cache", Some("master")), ("logs-http", None)] {
        let s = selector(svc);
        assert!(s.get("statefulset.kubernetes.io/pod-name").is_none(), "{svc}: {s}");
        assert_eq!(s.get("stateward.dev/role").and_then(Value::as_str), role, "{svc}: {s}");
    }
    // The credentials kept their value (new keys added beside it), and the certificate Secrets,
    // made with no owner, are now controlled by their resource, so the keeper renews them.
    let secret = get_json(&env, "secret/main-pg-credentials");
    use base64::Engine as _;
    let kept = base64::engine::general_purpose::STANDARD.encode("placeholder-value-of-the-last-release");
    assert_eq!(secret["data"]["password"], json!(kept), "the password kept");
    assert!(secret["data"]["replication-password"].is_string(), "the new key added: {secret}");
    for (_, name) in &instances {
        let tls = get_json(&env, &format!("secret/{name}-tls"));
        let controller = tls["metadata"]["ownerReferences"]
            .as_array()
            .and_then(|r| r.iter().find(|r| r["controller"] == json!(true)).cloned());
        assert!(controller.is_some_and(|r| r["name"] == json!(name)), "{name}-tls: {}", tls["metadata"]);
    }
    eprintln!(
        "e2e[upgrade]: {} children of the last release ({} kinds) taken over in place {took:.1?} after this build started; {} claims kept",
        before.len(),
        instances.len(),
        claims_before.len()
    );
    assert!(op.exited().is_none(), "operator died");
}
