//! One name, two kinds: a RedisCluster created with the name of a running PostgresCluster in
//! the same namespace would share its StatefulSet, volumes and credentials (children are named
//! after the resource). The second is refused with NameConflict and never writes; deleting it
//! with `retentionPolicy: Delete` deletes nothing of the PostgreSQL cluster.
//!
//! Run: `scripts/build-plugins && cargo test -p stateward --test kwok -- name_conflict::` (local cluster up).
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use crate::e2e;

use std::time::Duration;

use e2e::*;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Secret;
use kube::core::DynamicObject;
use kube::Api;
use serde_json::Value;
use stateward_testkit::TestEnv;

fn degraded(cr: &Value) -> Option<(String, String)> {
    let c = cr
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Degraded" && c["status"] == "True")?;
    Some((c["reason"].as_str()?.to_string(), c["message"].as_str()?.to_string()))
}

/// Waits (60 s at most) for the resource's Degraded condition: its reason and message.
async fn wait_degraded(api: &Api<DynamicObject>, name: &str) -> ((String, String), Duration) {
    wait_for(&format!("{name} Degraded"), Duration::from_secs(60), || async move {
        let cr = get_cr(api, name).await.ok_or("no CR")?;
        degraded(&cr).ok_or_else(|| summary(&cr))
    })
    .await
}

/// What must not change in the PostgreSQL cluster: its StatefulSet (uid, generation, owner),
/// its claims and its credentials.
async fn postgres_state(
    env: &TestEnv,
    name: &str,
) -> (String, i64, String, std::collections::BTreeMap<String, String>, String) {
    let sts = env.api::<StatefulSet>().get(name).await.expect("StatefulSet");
    let owner = sts
        .metadata
        .owner_references
        .as_ref()
        .and_then(|r| r.first())
        .map(|r| format!("{}/{}", r.kind, r.uid))
        .unwrap_or_default();
    let secrets: Api<Secret> = env.api();
    let credentials = secrets.get(&format!("{name}-credentials")).await.expect("credentials Secret");
    let password = serde_json::to_string(&credentials.data).unwrap_or_default();
    (
        sts.metadata.uid.unwrap_or_default(),
        sts.metadata.generation.unwrap_or_default(),
        owner,
        pvc_uids(env, name).await,
        password,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_kind_with_a_taken_name_is_refused_and_deletes_nothing() {
    let env = TestEnv::new("e2e-names").await.expect("test env");
    let _teardown = Teardown::new(&env);
    let mut op = Operator::start(&env, "names");
    op.wait_ready(Duration::from_secs(60)).await;
    let name = "db";

    apply(&env, &env.namespace, &POSTGRES.manifest(name, 2, "Retain"));
    wait_running(&env, POSTGRES, name, 2, Duration::from_secs(120)).await;
    wait_for("2 PVCs Bound", Duration::from_secs(30), || pvcs_bound(&env, name)).await;
    let before = postgres_state(&env, name).await;
    assert_eq!(before.3.len(), 2, "two claims: {:?}", before.3);
    assert!(before.2.starts_with("PostgresCluster/"), "owner {}", before.2);

    apply(&env, &env.namespace, &REDIS.manifest(name, 3, "Delete"));
    let redis = REDIS.api(&env);
    let ((reason, message), took) = wait_degraded(&redis, name).await;
    eprintln!("names: refused in {took:.1?}: {reason}: {message}");
    assert_eq!(reason, "NameConflict");
    assert!(message.contains("PostgresCluster db"), "the message names the holder: {message}");
    assert!(message.starts_with("metadata.name"), "the message names the field: {message}");
    let cr = get_cr(&redis, name).await.unwrap();
    assert!(
        cr.pointer("/metadata/finalizers").is_none_or(|f| f.as_array().is_some_and(Vec::is_empty)),
        "refused resource took no finalizer: {cr}"
    );

    // A few more reconciles of both (backoff 0.5, 1, 2 s) must leave PostgreSQL untouched.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(postgres_state(&env, name).await, before, "the PostgreSQL cluster changed");

    let out = env
        .kubectl()
        .args(["delete", "-n", &env.namespace, &format!("{}/{name}", REDIS.plural), "--timeout=30s"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        postgres_state(&env, name).await,
        before,
        "deleting the refused RedisCluster touched the PostgreSQL cluster"
    );
    wait_running(&env, POSTGRES, name, 2, Duration::from_secs(30)).await;
    let metrics = op.get("/metrics").unwrap().1;
    assert!(
        sum_metric(&metrics, "stateward_reconcile_total", &["result=\"name_conflict\""]) >= 1.0,
        "counted as name_conflict"
    );
    assert!(op.exited().is_none(), "operator died");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_of_the_users_in_the_way_is_not_taken_over() {
    let env = TestEnv::new("e2e-foreign").await.expect("test env");
    let _teardown = Teardown::new(&env);
    let mut op = Operator::start(&env, "foreign");
    op.wait_ready(Duration::from_secs(60)).await;
    let name = "cache";
    // The user's own Service, with the name the Redis plugin gives its client Service.
    let theirs = serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}
    });
    apply(&env, &env.namespace, &theirs);
    let services: Api<k8s_openapi::api::core::v1::Service> = env.api();
    let before = services.get(name).await.unwrap();

    apply(&env, &env.namespace, &REDIS.manifest(name, 1, "Retain"));
    let redis = REDIS.api(&env);
    let ((reason, message), took) = wait_degraded(&redis, name).await;
    eprintln!("foreign: refused in {took:.1?}: {reason}: {message}");
    assert_eq!(reason, "ObjectConflict");
    assert!(message.contains("Service cache already exists and was not created by stateward"), "{message}");
    let after = services.get(name).await.unwrap();
    assert_eq!(
        after.metadata.resource_version, before.metadata.resource_version,
        "the user's Service was written"
    );
    assert!(after.metadata.owner_references.is_none(), "the user's Service got an owner");

    // Out of the way: the resource converges on its own (retried with backoff).
    services.delete(name, &Default::default()).await.unwrap();
    let took = wait_running(&env, REDIS, name, 1, Duration::from_secs(90)).await;
    eprintln!("foreign: Running {took:.1?} after the user's Service was deleted");
    let ours = services.get(name).await.unwrap();
    assert!(ours.metadata.owner_references.is_some_and(|r| r.iter().any(|o| o.kind == "RedisCluster")));
    assert!(op.exited().is_none(), "operator died");
}
