//! The real kube-apiserver stopped for 20 s and started again (tests/cluster/restart-apiserver):
//! the operator keeps running, its watches resume without a restart, and a child deleted
//! afterwards is recreated from the resumed watch. In `cluster_wide`, alone, because it takes
//! the shared API server away from every test running beside it.

#![allow(clippy::panic, clippy::unwrap_used)]

use crate::e2e;

use std::time::{Duration, Instant};

use e2e::*;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Service;
use kube::api::DeleteParams;
use kube::Api;
use serde_json::json;
use stateward_testkit::TestEnv;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_resume_after_an_api_server_restart() {
    let _alone = crate::alone().await;
    let env = TestEnv::new("restart").await.unwrap();
    let mut op = Operator::start(&env, "restart");
    op.wait_ready(Duration::from_secs(60)).await;
    let name = "cache";
    apply(&env, &env.namespace, &REDIS.manifest(name, 3, "Retain"));
    wait_running(&env, REDIS, name, 3, Duration::from_secs(180)).await;

    let script = workspace_root().join("tests/cluster/restart-apiserver");
    let out = std::process::Command::new(&script).arg("20").output().unwrap();
    assert!(out.status.success(), "restart-apiserver: {}", String::from_utf8_lossy(&out.stderr));
    let back = Instant::now();
    assert!(op.exited().is_none(), "the operator must survive the API server restart:\n{}", op.log_tail(60));

    let services: Api<Service> = env.api();
    let headless = format!("{name}-headless");
    // Give the watches a moment to come back, as a user would not notice the restart.
    let (_, resumed) =
        wait_for("the operator to see the restarted API server", Duration::from_secs(60), || {
            let op = &op;
            async move { op.is_leader().filter(|l| *l).map(|_| ()).ok_or_else(|| "not leading".to_string()) }
        })
        .await;
    services.delete(&headless, &DeleteParams::default()).await.unwrap();
    let (_, took) = wait_for("the deleted Service to be recreated", Duration::from_secs(60), || {
        let (services, headless) = (services.clone(), headless.clone());
        async move {
            services
                .get_opt(&headless)
                .await
                .map_err(|e| e.to_string())?
                .map(|_| ())
                .ok_or("absent".to_string())
        }
    })
    .await;
    // The operator's part of a spec change: the StatefulSet asks for 4 and the status has
    // seen the new generation. (Pods are the StatefulSet controller's part; after a restart
    // kube-controller-manager may hold a stale cache for a while, which is not ours to test.)
    patch_ok(&env, &env.namespace, &format!("redisclusters/{name}"), &json!({"spec": {"replicas": 4}}));
    let sts: Api<StatefulSet> = env.api();
    let cr = REDIS.api(&env);
    wait_for("the new spec to reach the StatefulSet and the status", Duration::from_secs(60), || {
        let (sts, cr) = (sts.clone(), cr.clone());
        async move {
            let replicas = sts.get(name).await.map_err(|e| e.to_string())?.spec.and_then(|s| s.replicas);
            let cr = get_cr(&cr, name).await.ok_or("CR gone")?;
            let seen = cr.pointer("/status/observedGeneration") == cr.pointer("/metadata/generation");
            if replicas == Some(4) && seen {
                Ok(())
            } else {
                Err(format!("replicas {replicas:?}, {}", summary(&cr)))
            }
        }
    })
    .await;
    eprintln!(
        "restart: leader again {resumed:.1?} after the API server came back; deleted child recreated in {took:.1?}; new spec applied {:.1?} after restart",
        back.elapsed()
    );
    assert!(op.exited().is_none(), "the operator must still be running");
}
