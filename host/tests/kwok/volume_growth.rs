//! Growing volumes online: a larger `spec.storage.size` raises each data claim's request
//! (server-side apply of that one field), leaves the StatefulSet's claim template as it was
//! created (it cannot change), replaces no pod, and never makes a claim a dependent of the
//! resource. The local cluster's StorageClass allows expansion; no resizer runs there, so the
//! claims' capacity stays, and the test checks what the operator asks for.
//!
//! Run: `scripts/build-plugins && cargo test -p stateward --test kwok -- volume_growth::` (local cluster up).
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use crate::e2e;

use std::collections::BTreeMap;
use std::time::Duration;

use e2e::*;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use serde_json::json;
use stateward_testkit::TestEnv;

async fn requests(env: &TestEnv, name: &str) -> BTreeMap<String, (String, bool)> {
    let claims: Api<PersistentVolumeClaim> = env.api();
    let list = claims.list(&ListParams::default().labels(&format!("{INSTANCE_LABEL}={name}"))).await.unwrap();
    list.into_iter()
        .map(|c| {
            let size = c
                .spec
                .as_ref()
                .and_then(|s| s.resources.as_ref())
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("storage"))
                .map(|q| q.0.clone())
                .unwrap_or_default();
            let owned = c.metadata.owner_references.as_ref().is_some_and(|r| !r.is_empty());
            (c.name_any(), (size, owned))
        })
        .collect()
}

/// The capacity of each of the instance's claims, in GiB (the local cluster's volumes are
/// whole GiB).
async fn capacities_gib(env: &TestEnv, name: &str) -> Vec<u64> {
    let claims: Api<PersistentVolumeClaim> = env.api();
    let list = claims.list(&ListParams::default().labels(&format!("{INSTANCE_LABEL}={name}"))).await.unwrap();
    list.into_iter()
        .map(|c| {
            let q = c
                .status
                .and_then(|s| s.capacity)
                .and_then(|m| m.get("storage").map(|q| q.0.clone()))
                .unwrap_or_default();
            q.strip_suffix("Gi").and_then(|n| n.parse().ok()).unwrap_or(0)
        })
        .collect()
}

async fn pod_uids(env: &TestEnv, name: &str) -> BTreeMap<String, String> {
    let pods: Api<Pod> = env.api();
    let list = pods.list(&ListParams::default().labels(&format!("{INSTANCE_LABEL}={name}"))).await.unwrap();
    list.into_iter().map(|p| (p.name_any(), p.uid().unwrap_or_default())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_larger_size_grows_every_claim_without_replacing_a_pod() {
    let env = TestEnv::new("e2e-grow").await.expect("test env");
    let _teardown = Teardown::new(&env);
    let mut op = Operator::start(&env, "grow");
    op.wait_ready(Duration::from_secs(60)).await;
    let name = "grow";
    apply(&env, &env.namespace, &POSTGRES.manifest(name, 2, "Retain"));
    wait_running(&env, POSTGRES, name, 2, Duration::from_secs(120)).await;
    wait_for("2 PVCs Bound", Duration::from_secs(30), || pvcs_bound(&env, name)).await;
    let before = requests(&env, name).await;
    assert_eq!(
        before.values().map(|(s, _)| s.as_str()).collect::<Vec<_>>(),
        [POSTGRES.storage, POSTGRES.storage]
    );
    let pods = pod_uids(&env, name).await;
    assert_eq!(pods.len(), 2);

    patch_ok(
        &env,
        &env.namespace,
        &format!("postgrescluster/{name}"),
        &json!({"spec": {"storage": {"size": "3Gi"}}}),
    );
    let (grown, took) = wait_for("every claim asks for 3Gi", Duration::from_secs(60), || async {
        let now = requests(&env, name).await;
        if now.len() == 2 && now.values().all(|(s, _)| s == "3Gi") {
            Ok(now)
        } else {
            Err(format!("{now:?}"))
        }
    })
    .await;
    eprintln!("grow: claims raised in {took:.1?}: {grown:?}");
    assert!(grown.values().all(|(_, owned)| !owned), "a claim became a dependent of the resource: {grown:?}");
    let sts = env.api::<StatefulSet>().get(name).await.unwrap();
    let template = sts.spec.unwrap().volume_claim_templates.unwrap()[0]
        .spec
        .clone()
        .unwrap()
        .resources
        .unwrap()
        .requests
        .unwrap()["storage"]
        .0
        .clone();
    assert_eq!(template, POSTGRES.storage, "the claim template cannot change");
    wait_running(&env, POSTGRES, name, 2, Duration::from_secs(60)).await;
    assert_eq!(pod_uids(&env, name).await, pods, "a pod was replaced");
    // No resizer runs here: a claim's capacity is its volume's (1Gi, 10Gi or 100Gi in the local
    // cluster), and Progressing says how many have the size until all do.
    let capacities = capacities_gib(&env, name).await;
    let at_size = capacities.iter().filter(|c| **c >= 3).count();
    let want = if at_size < 2 {
        ("True".to_string(), "ResizingVolumes".to_string(), format!("{at_size} of 2 data claims have 3Gi"))
    } else {
        ("False".to_string(), "Converged".to_string(), "2 of 2 replicas ready".to_string())
    };
    eprintln!("grow: claim capacities {capacities:?} GiB, so Progressing must be {want:?}");
    let api = POSTGRES.api(&env);
    wait_for("Progressing to say how far the resize is", Duration::from_secs(30), || async {
        let cr = get_cr(&api, name).await.ok_or("no CR")?;
        let c = cr
            .pointer("/status/conditions")
            .and_then(serde_json::Value::as_array)
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Progressing"))
            .cloned()
            .unwrap_or_default();
        let got = (
            c["status"].as_str().unwrap_or_default().to_string(),
            c["reason"].as_str().unwrap_or_default().to_string(),
            c["message"].as_str().unwrap_or_default().to_string(),
        );
        (got == want).then_some(()).ok_or(format!("{got:?}, want {want:?}"))
    })
    .await;

    // Scaling up: the new member's claim starts from the template and is raised too.
    patch_ok(&env, &env.namespace, &format!("postgrescluster/{name}"), &json!({"spec": {"replicas": 3}}));
    wait_running(&env, POSTGRES, name, 3, Duration::from_secs(120)).await;
    let (_, took) = wait_for("the new member's claim asks for 3Gi", Duration::from_secs(60), || async {
        let now = requests(&env, name).await;
        if now.len() == 3 && now.values().all(|(s, owned)| s == "3Gi" && !owned) {
            Ok(())
        } else {
            Err(format!("{now:?}"))
        }
    })
    .await;
    eprintln!("grow: the third claim raised {took:.1?} after Running");
    let events = env
        .kubectl()
        .args(["get", "events.events.k8s.io", "-n", &env.namespace, "-o", "json"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&events.stdout).contains("GrowingVolumes"), "no GrowingVolumes Event");
    assert!(op.exited().is_none(), "operator died");
}
