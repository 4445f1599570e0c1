//! Kubernetes Events under a failing loop (issue [telemetry]): a CR whose plan the guardrails deny
//! is reconciled again and again with backoff, and every reconcile fails the same way, yet the
//! API server receives one PolicyDenied Event for it, not one per attempt (no event storm).
//!
//! Run: `scripts/build-plugins && cargo test -p stateward --test kwok -- events_dedup::` (local cluster up).
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use crate::e2e;

use std::time::{Duration, Instant};

use e2e::*;
use serde_json::Value;
use stateward_testkit::TestEnv;

#[tokio::test]
async fn a_denied_plan_retried_in_a_loop_publishes_one_event() {
    let env = TestEnv::new("e2e-events").await.expect("test env");
    let _teardown = Teardown::new(&env);
    let mut operator = Operator::start(&env, "events");
    operator.wait_ready(Duration::from_secs(60)).await;
    let name = "denied";
    let mut cr = POSTGRES.manifest(name, 1, "Retain");
    // An image from a registry the shipped guardrails do not allow: every plan is denied.
    cr["spec"]["image"] = "registry.invalid/postgres:17.2".into();
    apply(&env, &env.namespace, &cr);

    // Let the failing loop run: at least four denied reconciles (backoff 1 s, 2 s, 4 s, …).
    let started = Instant::now();
    loop {
        let (_, metrics) = operator.get("/metrics").expect("scrape");
        let denied = sum_metric(&metrics, "stateward_reconcile_total", &["result=\"policy_denied\""]);
        if denied >= 4.0 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "only {denied} denied reconciles in 60 s");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let out = env
        .kubectl()
        .args(["get", "events.events.k8s.io", "-n", &env.namespace, "-o", "json"])
        .output()
        .expect("kubectl get events");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let list: Value = serde_json::from_slice(&out.stdout).expect("events json");
    let denied: Vec<&Value> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|e| e["regarding"]["name"] == name && e["reason"] == "PolicyDenied")
        .collect();
    assert_eq!(denied.len(), 1, "one PolicyDenied Event object: {denied:#?}");
    // kube-runtime's recorder would turn repeats into a series with a growing count.
    let repeats = denied[0]["series"]["count"].as_i64().unwrap_or(1);
    assert_eq!(repeats, 1, "published once, not once per failed reconcile: {:#}", denied[0]);
    assert_eq!(denied[0]["type"], "Warning");
}
