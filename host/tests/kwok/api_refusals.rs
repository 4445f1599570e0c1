//! The API server refusing what a plan applies (here a ResourceQuota that allows no
//! StatefulSet) is the user's to fix, so it must reach them: the resource turns Degraded with
//! the API server's own message, and converges by itself once the quota is lifted.
//!
//! Run: `scripts/build-plugins && cargo test -p stateward --test kwok -- api_refusals::` (local cluster up).
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use crate::e2e;

use std::time::Duration;

use e2e::*;
use serde_json::{json, Value};
use stateward_testkit::TestEnv;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_apply_reaches_status_and_clears_when_lifted() {
    let env = TestEnv::new("e2e-quota").await.expect("test env");
    let _teardown = Teardown::new(&env);
    let mut op = Operator::start(&env, "quota");
    op.wait_ready(Duration::from_secs(60)).await;
    let quota = json!({
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "no-statefulsets"},
        "spec": {"hard": {"count/statefulsets.apps": "0"}}
    });
    apply(&env, &env.namespace, &quota);
    // The quota controller must have computed usage before the API server enforces it.
    wait_for("quota usage computed", Duration::from_secs(30), || async {
        let out = env
            .kubectl()
            .args(["get", "resourcequota", "no-statefulsets", "-n", &env.namespace, "-o", "json"])
            .output()
            .map_err(|e| e.to_string())?;
        let q: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
        q.pointer("/status/used/count~1statefulsets.apps").map(|_| ()).ok_or_else(|| q["status"].to_string())
    })
    .await;

    let name = "capped";
    apply(&env, &env.namespace, &POSTGRES.manifest(name, 1, "Retain"));
    let api = POSTGRES.api(&env);
    let (message, took) = wait_for("Degraded ApiError", Duration::from_secs(60), || {
        let api = api.clone();
        async move {
            let cr = get_cr(&api, name).await.ok_or("no CR")?;
            let c = cr
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .and_then(|cs| cs.iter().find(|c| c["type"] == "Degraded" && c["status"] == "True").cloned());
            match c {
                Some(c) if c["reason"] == "ApiError" => {
                    Ok(c["message"].as_str().unwrap_or_default().to_string())
                }
                _ => Err(summary(&cr)),
            }
        }
    })
    .await;
    eprintln!("quota: Degraded in {took:.1?}: {message}");
    assert!(message.contains("StatefulSet capped") && message.contains("exceeded quota"), "{message}");

    let out = env
        .kubectl()
        .args(["delete", "resourcequota", "no-statefulsets", "-n", &env.namespace])
        .output()
        .unwrap();
    assert!(out.status.success());
    let took = wait_running(&env, POSTGRES, name, 1, Duration::from_secs(120)).await;
    eprintln!("quota: Running {took:.1?} after the quota was lifted");
    let cr = get_cr(&api, name).await.unwrap();
    assert_eq!(condition(&cr, "Degraded"), Some("False"), "{}", summary(&cr));
    assert!(op.exited().is_none(), "operator died");
}
