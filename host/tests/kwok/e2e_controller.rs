//! End-to-end tests of `stateward run` on the local cluster (tests/cluster): the operator
//! binary runs as a child process in each test's own namespace, with the built plugins
//! (scripts/build-plugins) and the policy bundle, and the tests watch what lands in the API.
//!
//! Run: `scripts/build-plugins && cargo test -p stateward --test kwok -- e2e_controller:: --test-threads 8`
//! (tests mostly wait on the cluster, so more threads than cores shortens the run).
#![allow(clippy::expect_used)]

use crate::e2e;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use e2e::*;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use serde_json::{json, Value};
use stateward_testkit::TestEnv;

const START: Duration = Duration::from_secs(120);
const CONVERGE: Duration = Duration::from_secs(180);

fn sts_api(env: &TestEnv) -> Api<StatefulSet> {
    env.api()
}

// ---------------------------------------------------------------------------------------
// 1 + 9. Lifecycle per kind: create, scale up/down, upgrade; printer columns.
// ---------------------------------------------------------------------------------------

async fn lifecycle(kind: Kind) {
    let env = TestEnv::new(&format!("e2e-life-{}", &kind.plural[..5])).await.expect("test env");
    let _teardown_env = Teardown::new(&env);
    let mut op = Operator::start(&env, &format!("life-{}", kind.plural));
    op.wait_ready(START).await;
    let name = "lc";
    let api = kind.api(&env);
    let rec = PhaseRecorder::start(api.clone(), name);
    let target = format!("{}/{name}", kind.plural);

    // create
    apply(&env, &env.namespace, &kind.manifest(name, 3, "Delete"));
    let took = wait_running(&env, kind, name, 3, CONVERGE).await;
    eprintln!("e2e[{}]: create → Running 3/3 in {took:.1?}; phases {:?}", kind.kind, rec.seen());
    // Phases that do not describe what happened are collected and asserted at the end, so
    // the rest of the lifecycle is still checked.
    let mut wrong_phases = Vec::new();
    check_phases(&mut wrong_phases, "create", &rec.seen(), &["", "Pending", "Running"]);
    let cr = get_cr(&api, name).await.expect("CR");
    assert!(
        cr["metadata"]["finalizers"].as_array().is_some_and(|f| f.iter().any(|x| x == FINALIZER)),
        "no finalizer: {cr}"
    );
    assert_eq!(condition(&cr, "Progressing"), Some("False"), "{}", summary(&cr));
    assert_eq!(condition(&cr, "Degraded"), Some("False"), "{}", summary(&cr));
    assert_eq!(child_names(&env, &env.namespace, "statefulsets", name).len(), 1);
    assert!(!child_names(&env, &env.namespace, "services", name).is_empty());
    // The configuration, and what the pods start from: the topology for PostgreSQL and Redis,
    // the bootstrap list for Elasticsearch.
    assert_eq!(child_names(&env, &env.namespace, "configmaps", name).len(), 2);
    // Credentials and the server certificate; PostgreSQL also keeps the application's.
    let secrets = if kind.plural == "postgresclusters" { 3 } else { 2 };
    assert_eq!(child_names(&env, &env.namespace, "secrets", name).len(), secrets);
    let pdb: Api<PodDisruptionBudget> = env.api();
    let pdb = pdb.get(name).await.expect("PodDisruptionBudget named like the CR");
    assert_eq!(
        pdb.spec.as_ref().and_then(|s| s.max_unavailable.clone()),
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1))
    );
    let (bound, _) = wait_for("3 PVCs Bound", Duration::from_secs(30), || pvcs_bound(&env, name)).await;
    assert_eq!(bound, 3);

    // printer columns
    let out = env
        .kubectl()
        .args(["get", kind.plural, "-n", &env.namespace, "-o", "wide"])
        .output()
        .expect("kubectl");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    eprintln!("e2e[{}]: kubectl get -o wide:\n{text}", kind.kind);
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "PHASE", "READY", "VERSION", "AGE", "AVAILABLE", "PROGRESSING", "DEGRADED", "REDUNDANT"],
        "printer columns"
    );
    let row: Vec<&str> = lines.next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(row.len(), header.len(), "{text}");
    assert_eq!((row[0], row[1], row[2], row[3]), (name, "Running", "3", kind.version), "{text}");
    // kwok's pods run no server: nothing answers that a copy is in sync, and Redundant says so.
    assert_eq!((row[5], row[6], row[7], row[8]), ("True", "False", "False", "False"), "{text}");

    // paused: a spec change waits until resumed (through `kubectl stateward`)
    rec.clear();
    let ns = env.namespace.clone();
    kubectl_stateward(&env, &["pause", name, "-n", &ns]);
    patch_ok(&env, &env.namespace, &target, &json!({"spec": {"replicas": 5}}));
    let noticed = wait_paused_seen(&api, name, CONVERGE).await;
    let replicas = |s: StatefulSet| s.spec.and_then(|sp| sp.replicas);
    let held = replicas(sts_api(&env).get(name).await.expect("StatefulSet"));
    assert_eq!(held, Some(3), "a paused resource's StatefulSet was changed");
    let shown = kubectl_stateward(&env, &["status", name, "-n", &ns]);
    assert!(
        shown.contains("SpecPaused")
            && shown.contains("phase Running")
            && shown.contains("generation 3 of 3"),
        "kubectl stateward status:\n{shown}"
    );
    eprintln!(
        "e2e[{}]: paused; replicas 3→5 seen in {noticed:.1?} and not applied; status:\n{shown}",
        kind.kind
    );
    assert!(has_event(&env, name, "Paused").await, "no Paused Event");

    // scale up, on resume
    kubectl_stateward(&env, &["resume", name, "-n", &ns]);
    let took = wait_running(&env, kind, name, 5, CONVERGE).await;
    assert!(has_event(&env, name, "Resumed").await, "no Resumed Event");
    let seen = rec.seen();
    eprintln!("e2e[{}]: scale 3→5 Running in {took:.1?}; phases {seen:?}", kind.kind);
    assert!(seen.iter().any(|p| p == "Scaling"), "phase Scaling never observed while scaling up: {seen:?}");
    check_phases(&mut wrong_phases, "scale up", &seen, &["Running", "Scaling"]);
    let (bound, _) = wait_for("5 PVCs Bound", Duration::from_secs(30), || pvcs_bound(&env, name)).await;
    assert_eq!(bound, 5);

    // scale down
    rec.clear();
    patch_ok(&env, &env.namespace, &target, &json!({"spec": {"replicas": 3}}));
    let took = wait_running(&env, kind, name, 3, CONVERGE).await;
    let seen = rec.seen();
    eprintln!("e2e[{}]: scale 5→3 Running in {took:.1?}; phases {seen:?}", kind.kind);
    assert!(seen.iter().any(|p| p == "Scaling"), "phase Scaling never observed while scaling down: {seen:?}");
    check_phases(&mut wrong_phases, "scale down", &seen, &["Running", "Scaling"]);
    // whenScaled: Retain — no claim is lost by scaling down.
    assert_eq!(pvc_uids(&env, name).await.len(), 5, "claims after scaling down");

    // hibernate, then wake (through `kubectl stateward`): no pod, every claim and Secret kept;
    // the same claims again after the wake.
    let claims = pvc_uids(&env, name).await;
    let secrets = child_names(&env, &env.namespace, "secrets", name);
    kubectl_stateward(&env, &["hibernate", name, "-n", &ns]);
    let pods: Api<Pod> = env.api();
    let (_, slept) = wait_for("Hibernated with no pod left", CONVERGE, || {
        let (api, pods) = (api.clone(), pods.clone());
        async move {
            let cr = get_cr(&api, name).await.ok_or("CR gone")?;
            let left = pods
                .list(&ListParams::default().labels(&format!("{INSTANCE_LABEL}={name}")))
                .await
                .map_err(|e| e.to_string())?
                .items
                .len();
            if condition(&cr, "Hibernated") == Some("True") && left == 0 {
                Ok(())
            } else {
                Err(format!("{left} pod(s); {}", summary(&cr)))
            }
        }
    })
    .await;
    assert_eq!(replicas(sts_api(&env).get(name).await.expect("StatefulSet")), Some(0));
    assert_eq!(pvc_uids(&env, name).await, claims, "the claims hibernated with");
    assert_eq!(child_names(&env, &env.namespace, "secrets", name), secrets);
    let cr = get_cr(&api, name).await.expect("CR");
    assert_eq!(condition(&cr, "Available"), Some("False"), "{}", summary(&cr));
    let shown = kubectl_stateward(&env, &["status", name, "-n", &ns]);
    assert!(
        shown.contains("hibernate:") && shown.contains("Hibernated"),
        "kubectl stateward status:\n{shown}"
    );
    assert!(has_event(&env, name, "Hibernating").await, "no Hibernating Event");
    kubectl_stateward(&env, &["wake", name, "-n", &ns]);
    let woke = wait_running(&env, kind, name, 3, CONVERGE).await;
    assert!(has_event(&env, name, "Waking").await, "no Waking Event");
    assert_eq!(pvc_uids(&env, name).await, claims, "the claims woken with");
    let cr = get_cr(&api, name).await.expect("CR");
    assert_eq!(condition(&cr, "Hibernated"), None, "{}", summary(&cr));
    eprintln!(
        "e2e[{}]: hibernated (0 pods, {} claims kept) in {slept:.1?}, woken Running 3/3 in {woke:.1?}",
        kind.kind,
        claims.len()
    );

    // fence, then unfence (through `kubectl stateward`): lc-1 leaves every client Service and
    // is kept; then it is back.
    let served = || client_endpoints(&env, name);
    // (Settled: the same two seconds apart, after the wake's pods turned Ready.)
    let (all, _) = wait_for("the client Services' endpoints settled", CONVERGE, || async {
        let first = served().await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let then = served().await;
        if first == then {
            Ok(then)
        } else {
            Err(format!("{first:?} then {then:?}"))
        }
    })
    .await;
    let uid = pods.get("lc-1").await.expect("lc-1").uid();
    kubectl_stateward(&env, &["fence", name, "lc-1", "-n", &ns]);
    let (_, fenced_in) = wait_for("lc-1 out of every client Service", CONVERGE, || {
        let (api, pods, all) = (api.clone(), pods.clone(), all.clone());
        let served = served();
        async move {
            let cr = get_cr(&api, name).await.ok_or("CR gone")?;
            let pod = pods.get("lc-1").await.map_err(|e| e.to_string())?;
            let label = pod.labels().get("stateward.dev/fenced").cloned();
            let now = served.await;
            let expected: BTreeSet<String> = all.iter().filter(|p| *p != "lc-1").cloned().collect();
            if condition(&cr, "Fenced") == Some("True") && label.as_deref() == Some("true") && now == expected
            {
                Ok(())
            } else {
                Err(format!("label {label:?}, endpoints {now:?}; {}", summary(&cr)))
            }
        }
    })
    .await;
    assert_eq!(pods.get("lc-1").await.expect("lc-1 kept").uid(), uid, "the fenced pod is kept as it was");
    for svc in client_services(&env, name).await {
        let selector = svc.spec.and_then(|s| s.selector).unwrap_or_default();
        assert_eq!(
            selector.get("stateward.dev/fenced").map(String::as_str),
            Some("false"),
            "{:?}",
            svc.metadata.name
        );
    }
    assert!(has_event(&env, name, "Fenced").await, "no Fenced Event");
    kubectl_stateward(&env, &["unfence", name, "-n", &ns]);
    let (_, unfenced_in) = wait_for("lc-1 back in the client Services", CONVERGE, || {
        let (api, all) = (api.clone(), all.clone());
        let served = served();
        async move {
            let cr = get_cr(&api, name).await.ok_or("CR gone")?;
            let now = served.await;
            if condition(&cr, "Fenced") == Some("False") && now == all {
                Ok(())
            } else {
                Err(format!("endpoints {now:?}; {}", summary(&cr)))
            }
        }
    })
    .await;
    assert!(has_event(&env, name, "Unfenced").await, "no Unfenced Event");
    eprintln!(
        "e2e[{}]: lc-1 fenced (out of {} client endpoint(s)) in {fenced_in:.1?}, back in {unfenced_in:.1?}",
        kind.kind,
        all.len()
    );

    // upgrade
    rec.clear();
    let up_started = Instant::now();
    let next_image = |s: &StatefulSet| {
        s.spec
            .as_ref()
            .and_then(|sp| sp.template.spec.as_ref())
            .and_then(|p| p.containers.first())
            .and_then(|c| c.image.clone())
            .is_some_and(|image| image.contains(kind.next_version))
    };
    let (took, min_ready, watched_floor, pod_events) =
        rolled(&env, kind, name, &format!("upgraded to {}", kind.next_version), next_image, || {
            patch_ok(&env, &env.namespace, &target, &json!({"spec": {"version": kind.next_version}}))
        })
        .await;
    let seen = rec.seen();
    eprintln!(
        "e2e[{}]: upgrade {}→{} done in {took:.1?} (since patch {:.1?}); fewest Ready members: {watched_floor:?} over {pod_events} pod events (watch), {min_ready} (polled); phases {seen:?}",
        kind.kind,
        kind.version,
        kind.next_version,
        up_started.elapsed()
    );
    assert!(pod_events >= 6, "the pod watch saw only {pod_events} events during a rollout of 3 pods");
    assert!(
        watched_floor >= Some(2),
        "more than one member was unavailable at once during the rollout (fewest Ready {watched_floor:?})"
    );
    assert!(seen.iter().any(|p| p == "Upgrading"), "phase Upgrading never observed: {seen:?}");
    assert!(
        min_ready >= 2,
        "more than one member unavailable at once during the rollout (min ready {min_ready})"
    );
    check_phases(&mut wrong_phases, "upgrade", &seen, &["Running", "Upgrading"]);

    // restart: every member replaced, one at a time, nothing else changed
    let image_before = sts_api(&env).get(name).await.expect("StatefulSet").spec.map(|s| s.template);
    let asked = std::cell::RefCell::new(String::new());
    let restarted = |s: &StatefulSet| {
        let annotations =
            s.spec.as_ref().and_then(|sp| sp.template.metadata.as_ref()).and_then(|m| m.annotations.as_ref());
        annotations.and_then(|a| a.get("stateward.dev/restarted-at")).is_some_and(|v| !v.is_empty())
    };
    let (took, min_ready, watched_floor, _) = rolled(&env, kind, name, "restarted", restarted, || {
        *asked.borrow_mut() = kubectl_stateward(&env, &["restart", name, "-n", &ns]);
    })
    .await;
    eprintln!(
        "e2e[{}]: kubectl stateward restart: all 3 members replaced in {took:.1?}; fewest Ready {watched_floor:?} (watch), {min_ready} (polled); said: {}",
        kind.kind,
        asked.borrow().trim()
    );
    assert!(watched_floor >= Some(2) && min_ready >= 2, "more than one member down at once in the restart");
    let mut after = sts_api(&env).get(name).await.expect("StatefulSet").spec.map(|s| s.template);
    if let Some(a) = after.as_mut().and_then(|t| t.metadata.as_mut()).and_then(|m| m.annotations.as_mut()) {
        a.remove("stateward.dev/restarted-at");
    }
    assert_eq!(after, image_before, "the restart changed more of the pod template than its annotation");
    assert_eq!(child_names(&env, &env.namespace, "statefulsets", name).len(), 1);
    assert!(op.exited().is_none(), "operator died");
    assert!(
        wrong_phases.is_empty(),
        "{}: status.phase went through phases that misdescribe the operation:\n{}",
        kind.kind,
        wrong_phases.join("\n")
    );
}

/// Starts a roll with `start` and waits until every member pod was replaced, the StatefulSet
/// satisfies `template_done` and is fully on its update revision, and the resource is Running
/// with 3 ready members. Returns the time taken, the fewest Ready members polled, the fewest
/// seen by a pod watch, and how many pod events that watch saw.
async fn rolled(
    env: &TestEnv,
    kind: Kind,
    name: &str,
    what: &str,
    template_done: impl Fn(&StatefulSet) -> bool,
    start: impl FnOnce(),
) -> (Duration, i64, Option<usize>, usize) {
    let api = kind.api(env);
    let pods: Api<Pod> = env.api();
    let selector = format!("{INSTANCE_LABEL}={name}");
    let before: BTreeSet<String> = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .expect("pods")
        .iter()
        .filter_map(|p| p.uid())
        .collect();
    assert_eq!(before.len(), 3);
    let floor = ReadyFloor::start(env, name);
    wait_for("the pod watch synced", Duration::from_secs(20), || async {
        if floor.floor().0.is_some() {
            Ok(())
        } else {
            Err("not yet".to_string())
        }
    })
    .await;
    start();
    let min_ready = std::sync::atomic::AtomicI64::new(i64::MAX);
    let mr = &min_ready;
    let sts = sts_api(env);
    let template_done = &template_done;
    let (_, took) = wait_for(&format!("{} {what}", kind.kind), CONVERGE, || {
        let (api, sts, pods, before, selector) =
            (api.clone(), sts.clone(), pods.clone(), before.clone(), selector.clone());
        async move {
            let list =
                pods.list(&ListParams::default().labels(&selector)).await.map_err(|e| e.to_string())?;
            let ready = list
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .filter(|p| {
                    p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
                })
                .count() as i64;
            mr.fetch_min(ready, std::sync::atomic::Ordering::Relaxed);
            let cr = get_cr(&api, name).await.ok_or("CR gone")?;
            let s = sts.get(name).await.map_err(|e| e.to_string())?;
            let st = s.status.clone().unwrap_or_default();
            let uids: BTreeSet<String> = list.iter().filter_map(|p| p.uid()).collect();
            // Under OnDelete (PostgreSQL rolls its own pods) the StatefulSet controller never
            // moves currentRevision (before Kubernetes 1.36): every pod on updateRevision tells.
            let on_delete =
                s.spec.as_ref().and_then(|sp| sp.update_strategy.as_ref()).and_then(|u| u.type_.as_deref())
                    == Some("OnDelete");
            let all_updated = list
                .iter()
                .all(|p| p.labels().get("controller-revision-hash") == st.update_revision.as_ref());
            let done = phase(&cr) == "Running"
                && cr.pointer("/status/observedGeneration") == cr.pointer("/metadata/generation")
                && cr.pointer("/status/readyReplicas").and_then(Value::as_i64) == Some(3)
                && template_done(&s)
                && st.update_revision.is_some()
                && (st.update_revision == st.current_revision || (on_delete && all_updated))
                && st.updated_replicas == Some(3)
                && uids.len() == 3
                && uids.is_disjoint(&before);
            if done {
                Ok(())
            } else {
                Err(format!(
                    "{} currentRevision={:?} updateRevision={:?} updated={:?} pods replaced={}",
                    summary(&cr),
                    st.current_revision,
                    st.update_revision,
                    st.updated_replicas,
                    uids.difference(&before).count()
                ))
            }
        }
    })
    .await;
    let (watched_floor, pod_events) = floor.floor();
    (took, min_ready.load(std::sync::atomic::Ordering::Relaxed), watched_floor, pod_events)
}

/// Records a problem when `seen` holds a phase outside `allowed` for that step.
fn check_phases(problems: &mut Vec<String>, step: &str, seen: &[String], allowed: &[&str]) {
    let bad: Vec<&String> = seen.iter().filter(|p| !allowed.contains(&p.as_str())).collect();
    if !bad.is_empty() {
        problems.push(format!("  {step}: saw {bad:?} in {seen:?}; expected only {allowed:?}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_postgres() {
    lifecycle(POSTGRES).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_redis() {
    lifecycle(REDIS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_elasticsearch() {
    lifecycle(ELASTICSEARCH).await;
}

// ---------------------------------------------------------------------------------------
// 2. The API server rejects bad specs with its own message (no operator involved).
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_rejects_invalid_specs() {
    let env = TestEnv::new("e2e-reject").await.expect("test env");
    let _teardown_env = Teardown::new(&env);
    prepare(&env);
    for kind in KINDS {
        for replicas in [0, 51] {
            let mut m = kind.manifest(&format!("bad-{replicas}"), 3, "Delete");
            m["spec"]["replicas"] = json!(replicas);
            let out = kubectl_stdin(&env, &["apply", "-n", &env.namespace, "-f", "-"], &m.to_string());
            let err = String::from_utf8_lossy(&out.stderr);
            eprintln!("e2e[{}]: replicas {replicas} → {}", kind.kind, err.trim());
            assert!(!out.status.success(), "{} with replicas {replicas} was accepted", kind.kind);
            assert!(err.contains("spec.replicas"), "message does not name spec.replicas: {err}");
            assert!(
                err.contains(if replicas == 0 {
                    "greater than or equal to 1"
                } else {
                    "less than or equal to 50"
                }),
                "{err}"
            );
        }
        let mut m = kind.manifest("cls", 1, "Delete");
        m["spec"]["storage"]["className"] = json!("local");
        apply(&env, &env.namespace, &m);
        let target = format!("{}/cls", kind.plural);
        let out = patch(&env, &env.namespace, &target, &json!({"spec": {"storage": {"className": "fast"}}}));
        let err = String::from_utf8_lossy(&out.stderr);
        eprintln!("e2e[{}]: className change → {}", kind.kind, err.trim());
        assert!(!out.status.success(), "{} accepted a storage.className change", kind.kind);
        assert!(err.contains("storage.className is immutable"), "{err}");
        let out = env
            .kubectl()
            .args(["patch", "-n", &env.namespace, &target, "--type", "json", "-p"])
            .arg(r#"[{"op":"remove","path":"/spec/storage/className"}]"#)
            .output()
            .expect("kubectl");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{} accepted removing storage.className", kind.kind);
        assert!(err.contains("storage.className cannot be added or removed"), "{err}");
        // The stored object still has the class it was created with.
        let cr = get_cr(&kind.api(&env), "cls").await.expect("CR");
        assert_eq!(cr.pointer("/spec/storage/className"), Some(&json!("local")));
    }
}

// ---------------------------------------------------------------------------------------
// 3. Deletion: Retain keeps the claims (and a new CR of the same name binds them again),
//    Delete removes them; children are garbage-collected; the finalizer is released.
// ---------------------------------------------------------------------------------------

async fn wait_gone(env: &TestEnv, kind: Kind, name: &str) -> Duration {
    let api = kind.api(env);
    let (_, took) =
        wait_for(&format!("{} {name} gone (finalizer released)", kind.kind), Duration::from_secs(60), || {
            let api = api.clone();
            async move {
                match get_cr(&api, name).await {
                    None => Ok(()),
                    Some(cr) => Err(format!(
                        "still there: finalizers {} deletionTimestamp {}",
                        cr["metadata"]["finalizers"], cr["metadata"]["deletionTimestamp"]
                    )),
                }
            }
        })
        .await;
    took
}

async fn wait_children_collected(env: &TestEnv, name: &str) -> Duration {
    let (_, took) = wait_for("children garbage-collected", Duration::from_secs(60), || async {
        let left: Vec<String> = ["statefulsets", "services", "configmaps", "poddisruptionbudgets", "pods"]
            .iter()
            .flat_map(|r| child_names(env, &env.namespace, r, name))
            .collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("left: {left:?}"))
        }
    })
    .await;
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_retain_keeps_claims_and_delete_removes_them() {
    let env = TestEnv::new("e2e-retain").await.expect("test env");
    let _teardown_env = Teardown::new(&env);
    let mut op = Operator::start(&env, "retain");
    op.wait_ready(START).await;
    let kind = POSTGRES;
    let name = "keep";
    apply(&env, &env.namespace, &kind.manifest(name, 2, "Retain"));
    let took = wait_running(&env, kind, name, 2, CONVERGE).await;
    eprintln!("e2e[retain]: Running 2/2 in {took:.1?}");
    wait_for("2 PVCs Bound", Duration::from_secs(30), || pvcs_bound(&env, name)).await;
    let claims = pvc_uids(&env, name).await;
    assert_eq!(claims.len(), 2);

    let out = env
        .kubectl()
        .args(["delete", "-n", &env.namespace, &format!("{}/{name}", kind.plural), "--wait=false"])
        .output()
        .expect("kubectl");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let gone = wait_gone(&env, kind, name).await;
    let collected = wait_children_collected(&env, name).await;
    eprintln!("e2e[retain]: CR gone in {gone:.1?}, children collected {collected:.1?} later");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(pvc_uids(&env, name).await, claims, "Retain must keep the claims");
    let secrets = child_names(&env, &env.namespace, "secrets", name);
    eprintln!("e2e[retain]: secrets left after delete (Retain): {secrets:?}");
    assert!(
        secrets.contains(&format!("secret/{name}-credentials")),
        "Retain keeps the credentials: {secrets:?}"
    );

    // Same name again: the StatefulSet's claim templates resolve to the retained claims.
    apply(&env, &env.namespace, &kind.manifest(name, 2, "Delete"));
    let took = wait_running(&env, kind, name, 2, CONVERGE).await;
    eprintln!("e2e[retain]: re-created, Running in {took:.1?}");
    assert_eq!(pvc_uids(&env, name).await, claims, "the new CR must bind the retained claims (same uids)");

    let out = env
        .kubectl()
        .args(["delete", "-n", &env.namespace, &format!("{}/{name}", kind.plural), "--wait=false"])
        .output()
        .expect("kubectl");
    assert!(out.status.success());
    let gone = wait_gone(&env, kind, name).await;
    let collected = wait_children_collected(&env, name).await;
    let (_, pvcs_gone) =
        wait_for("claims deleted (retentionPolicy Delete)", Duration::from_secs(60), || async {
            let left = pvc_uids(&env, name).await;
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("{left:?}"))
            }
        })
        .await;
    let secrets = child_names(&env, &env.namespace, "secrets", name);
    eprintln!(
        "e2e[retain]: Delete: CR gone in {gone:.1?}, children {collected:.1?}, claims {pvcs_gone:.1?} later; secrets left: {secrets:?}"
    );
    assert!(
        !secrets.contains(&format!("secret/{name}-credentials")),
        "Delete takes the credentials too: {secrets:?}"
    );
    assert!(op.exited().is_none(), "operator died");
}

// ---------------------------------------------------------------------------------------
// 4. A converged resource reconciled again makes zero writes, counted by the API server.
// ---------------------------------------------------------------------------------------

/// A FlowSchema that sends every write of the operator's service account in the test
/// namespace (everything but its Lease) through its own schema, so the API server's
/// `apiserver_flowcontrol_dispatched_requests_total{flow_schema=…}` counts exactly those.
struct WriteCounter<'a> {
    env: &'a TestEnv,
    name: String,
}

impl<'a> WriteCounter<'a> {
    fn install(env: &'a TestEnv, sa: &str) -> WriteCounter<'a> {
        let name = format!("e2e-writes-{}", env.namespace);
        let resources: Vec<String> = [
            "statefulsets",
            "services",
            "configmaps",
            "secrets",
            "persistentvolumeclaims",
            "poddisruptionbudgets",
            "events",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(KINDS.iter().flat_map(|k| [k.plural.to_string(), format!("{}/status", k.plural)]))
        .collect();
        let fs = json!({
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
            "metadata": {"name": name},
            "spec": {
                "matchingPrecedence": 100,
                "priorityLevelConfiguration": {"name": "workload-low"},
                "distinguisherMethod": {"type": "ByUser"},
                "rules": [{
                    "subjects": [{"kind": "ServiceAccount", "serviceAccount": {"name": sa, "namespace": env.namespace}}],
                    "resourceRules": [{
                        "verbs": ["create", "update", "patch", "delete", "deletecollection"],
                        "apiGroups": ["", "apps", "policy", "events.k8s.io", "stateward.dev"],
                        "resources": resources,
                        "namespaces": [env.namespace],
                    }],
                }],
            }
        });
        apply(env, &env.namespace, &fs);
        WriteCounter { env, name }
    }

    fn count(&self) -> f64 {
        sum_metric(
            &apiserver_metrics(self.env),
            "apiserver_flowcontrol_dispatched_requests_total",
            &[&format!("flow_schema=\"{}\"", self.name)],
        )
    }
}

impl Drop for WriteCounter<'_> {
    fn drop(&mut self) {
        let _ = self
            .env
            .kubectl()
            .args(["delete", "flowschema", &self.name, "--ignore-not-found", "--wait=false"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// The API server's own write count on the resources the operator manages (all namespaces).
fn apiserver_writes(env: &TestEnv) -> f64 {
    let text = apiserver_metrics(env);
    let mut sum = 0.0;
    for verb in ["POST", "PUT", "PATCH", "DELETE", "APPLY"] {
        for res in [
            "statefulsets",
            "services",
            "configmaps",
            "secrets",
            "poddisruptionbudgets",
            "postgresclusters",
            "redisclusters",
            "elasticsearchclusters",
        ] {
            sum += sum_metric(
                &text,
                "apiserver_request_total",
                &[&format!("verb=\"{verb}\""), &format!("resource=\"{res}\"")],
            );
        }
    }
    sum
}

fn reconciles(op: &Operator) -> f64 {
    op.get("/metrics").map(|(_, b)| sum_metric(&b, "stateward_reconcile_total", &[])).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn converged_resource_reconciled_again_makes_zero_writes() {
    let env = TestEnv::new("e2e-zero").await.expect("test env");
    let _teardown_env = Teardown::new(&env);
    prepare(&env);
    let dir = tempdir::Dir::new("e2e-zero");
    let sa = "stateward-op";
    let kubeconfig = namespaced_operator_kubeconfig(&env, &dir.0, sa, Rbac::Broad);
    let counter = WriteCounter::install(&env, sa);
    let mut op = Operator::start_with(
        &env,
        "zero",
        OperatorOpts {
            namespace: env.namespace.clone(),
            lease_namespace: env.namespace.clone(),
            kubeconfig: Some(kubeconfig),
            identity: None,
            plugin_dir: None,
            ..Default::default()
        },
    );
    op.wait_ready(START).await;
    let kind = POSTGRES;
    let name = "calm";
    apply(&env, &env.namespace, &kind.manifest(name, 1, "Delete"));
    let took = wait_running(&env, kind, name, 1, CONVERGE).await;
    eprintln!("e2e[zero]: Running 1/1 in {took:.1?}");

    // Settle: the counter must stop moving (the last status write after Running).
    let mut last = (counter.count(), Instant::now());
    let settle_started = Instant::now();
    while last.1.elapsed() < Duration::from_secs(6) {
        assert!(
            settle_started.elapsed() < Duration::from_secs(90),
            "the operator keeps writing to a converged resource"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = counter.count();
        if now != last.0 {
            last = (now, Instant::now());
        }
    }
    let writes_to_converge = last.0;
    eprintln!("e2e[zero]: operator writes to converge (API server, APF): {writes_to_converge}; settled after {:.1?}", settle_started.elapsed());
    // The counter really sees the operator: creating the cluster took writes.
    assert!(writes_to_converge >= 5.0, "the FlowSchema counted only {writes_to_converge} writes while creating: it does not see the operator");

    let (w0, a0, r0, s0) =
        (counter.count(), op.api_writes().expect("metrics"), reconciles(&op), apiserver_writes(&env));
    // Poke the CR (metadata only: a watch event, no spec change) and then a child.
    patch_ok(
        &env,
        &env.namespace,
        &format!("{}/{name}", kind.plural),
        &json!({"metadata": {"annotations": {"e2e/poke": "1"}}}),
    );
    wait_for("a reconcile after the CR poke", Duration::from_secs(20), || async {
        let r = reconciles(&op);
        if r > r0 {
            Ok(())
        } else {
            Err(format!("reconcile_total {r}"))
        }
    })
    .await;
    let r1 = reconciles(&op);
    patch_ok(
        &env,
        &env.namespace,
        &format!("statefulset/{name}"),
        &json!({"metadata": {"annotations": {"e2e/poke": "1"}}}),
    );
    wait_for("a reconcile after the StatefulSet poke", Duration::from_secs(20), || async {
        let r = reconciles(&op);
        if r > r1 {
            Ok(())
        } else {
            Err(format!("reconcile_total {r}"))
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (w1, a1, r2, s1) =
        (counter.count(), op.api_writes().expect("metrics"), reconciles(&op), apiserver_writes(&env));
    eprintln!(
        "e2e[zero]: {} reconciles after the pokes; operator writes seen by the API server {w0} → {w1}; stateward_api_writes_total {a0} → {a1}; \
         apiserver_request_total writes on managed kinds, all namespaces, minus our 2 pokes: {} (other tests run in parallel)",
        r2 - r0,
        s1 - s0 - 2.0
    );
    assert_eq!(w1, w0, "the operator wrote to the API server while reconciling a converged resource");
    assert_eq!(a1, a0, "stateward_api_writes_total moved");
    assert!(op.exited().is_none(), "operator died");
}

// ---------------------------------------------------------------------------------------
// 5. SIGKILL mid-reconcile (during a scale 3→5), restart: converges, no duplicates, no loss.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_scale_then_restart_converges() {
    let env = TestEnv::new("e2e-kill").await.expect("test env");
    let _teardown_env = Teardown::new(&env);
    let mut op = Operator::start(&env, "kill-1");
    op.wait_ready(START).await;
    let kind = POSTGRES;
    let name = "hard";
    apply(&env, &env.namespace, &kind.manifest(name, 3, "Delete"));
    wait_running(&env, kind, name, 3, CONVERGE).await;
    let services = child_names(&env, &env.namespace, "services", name);
    let claims = pvc_uids(&env, name).await;
    patch_ok(&env, &env.namespace, &format!("{}/{name}", kind.plural), &json!({"spec": {"replicas": 5}}));
    let sts = sts_api(&env);
    let (mid, _) = wait_for("the StatefulSet scaled to 5 but not yet ready", Duration::from_secs(60), || {
        let sts = sts.clone();
        async move {
            let s = sts.get(name).await.map_err(|e| e.to_string())?;
            let want = s.spec.as_ref().and_then(|s| s.replicas) == Some(5);
            let ready = s.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0);
            if want {
                Ok(ready)
            } else {
                Err(format!("spec.replicas {:?}", s.spec.as_ref().and_then(|s| s.replicas)))
            }
        }
    })
    .await;
    op.kill9();
    eprintln!("e2e[kill]: killed with {mid}/5 ready");
    let restarted = Instant::now();
    let mut op2 = Operator::start(&env, "kill-2");
    let took = wait_running(&env, kind, name, 5, Duration::from_secs(60)).await;
    eprintln!("e2e[kill]: converged {:.1?} after the restart", restarted.elapsed().max(took));
    op2.wait_ready(Duration::from_secs(10)).await;
    assert_eq!(child_names(&env, &env.namespace, "statefulsets", name).len(), 1, "duplicate StatefulSets");
    assert_eq!(
        child_names(&env, &env.namespace, "services", name),
        services,
        "Services differ after the restart"
    );
    // The configuration and the topology.
    assert_eq!(child_names(&env, &env.namespace, "configmaps", name).len(), 2);
    // Credentials, the server certificate and the application's.
    assert_eq!(child_names(&env, &env.namespace, "secrets", name).len(), 3);
    assert_eq!(child_names(&env, &env.namespace, "poddisruptionbudgets", name).len(), 1);
    let after = pvc_uids(&env, name).await;
    assert_eq!(after.len(), 5);
    for (claim, uid) in &claims {
        assert_eq!(after.get(claim), Some(uid), "claim {claim} lost or replaced");
    }
}

// ---------------------------------------------------------------------------------------
// 6. Children deleted while the operator is down: nothing happens until it is back.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_deleted_while_down_are_restored_after_restart() {
    let env = TestEnv::new("e2e-down").await.expect("test env");
    let _teardown_env = Teardown::new(&env);
    let mut op = Operator::start(&env, "down-1");
    op.wait_ready(START).await;
    let kind = POSTGRES;
    let name = "gap";
    apply(&env, &env.namespace, &kind.manifest(name, 2, "Delete"));
    wait_running(&env, kind, name, 2, CONVERGE).await;
    let services = child_names(&env, &env.namespace, "services", name);
    let claims = pvc_uids(&env, name).await;
    let victim = services
        .iter()
        .find(|s| s.ends_with("-rw") || !s.ends_with("-headless"))
        .cloned()
        .unwrap_or_default();
    op.kill9();
    for target in [format!("statefulset/{name}"), victim.clone()] {
        let out = env
            .kubectl()
            .args(["delete", "-n", &env.namespace, &target, "--wait=true", "--timeout=30s"])
            .output()
            .expect("kubectl");
        assert!(out.status.success(), "delete {target}: {}", String::from_utf8_lossy(&out.stderr));
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let claims_while_down = pvc_uids(&env, name).await;
    assert!(
        child_names(&env, &env.namespace, "statefulsets", name).is_empty(),
        "StatefulSet came back with no operator running"
    );
    assert!(
        !child_names(&env, &env.namespace, "services", name).contains(&victim),
        "{victim} came back with no operator running"
    );
    let restarted = Instant::now();
    let _op2 = Operator::start(&env, "down-2");
    wait_running(&env, kind, name, 2, Duration::from_secs(30)).await;
    let took = restarted.elapsed();
    eprintln!("e2e[down]: StatefulSet and {victim} restored, Running 2/2, {took:.1?} after the restart");
    stateward_testkit::report::seconds(
        "controller.restored_after_operator_restart",
        took,
        Some(Duration::from_secs(10)),
    );
    assert_eq!(child_names(&env, &env.namespace, "services", name), services);
    // Deleting a StatefulSet by hand is not deleting the cluster: the data must stay.
    assert_eq!(
        claims_while_down, claims,
        "the claims went away with the StatefulSet (its persistentVolumeClaimRetentionPolicy.whenDeleted follows the CR's retentionPolicy: Delete)"
    );
    assert_eq!(pvc_uids(&env, name).await, claims, "claims must survive the StatefulSet's deletion");
}

// ---------------------------------------------------------------------------------------
// 7. --namespace mode: another namespace is never touched; works with a namespaced Role.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_mode_ignores_other_namespaces() {
    let env = TestEnv::new("e2e-ns-mine").await.expect("test env");
    let _teardown_env = Teardown::new(&env);
    let other = TestEnv::new("e2e-ns-other").await.expect("second namespace");
    let _teardown_other = Teardown::new(&other);
    prepare(&env);
    let dir = tempdir::Dir::new("e2e-ns");
    let kubeconfig = namespaced_operator_kubeconfig(&env, &dir.0, "stateward-ns", Rbac::Project);
    let mut op = Operator::start_with(
        &env,
        "ns",
        OperatorOpts {
            namespace: env.namespace.clone(),
            lease_namespace: env.namespace.clone(),
            kubeconfig: Some(kubeconfig),
            identity: None,
            plugin_dir: None,
            ..Default::default()
        },
    );
    let kind = POSTGRES;
    apply(&env, &other.namespace, &kind.manifest("theirs", 1, "Delete"));
    op.wait_ready(START).await;
    apply(&env, &env.namespace, &kind.manifest("mine", 1, "Delete"));
    let forbidden = async {
        loop {
            let text = std::fs::read_to_string(&op.log).unwrap_or_default();
            if let Some(line) = text.lines().find(|l| l.contains("forbidden")) {
                return line.to_string();
            }
            tokio::time::sleep(POLL).await;
        }
    };
    let took = tokio::select! {
        took = wait_running(&env, kind, "mine", 1, CONVERGE) => took,
        line = forbidden => panic!("the Roles of deploy/rbac are not enough for --namespace mode:\n{line}"),
    };
    eprintln!("e2e[ns]: own CR Running in {took:.1?} with only the Roles of deploy/rbac/namespaced and operator-namespace");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let theirs = get_cr(&kind.api_in(&env, &other.namespace), "theirs").await.expect("the other CR");
    assert!(
        theirs["metadata"]["finalizers"].as_array().is_none_or(Vec::is_empty),
        "finalizer added: {theirs}"
    );
    assert!(theirs.get("status").is_none_or(|s| s.is_null() || s == &json!({})), "status written: {theirs}");
    for r in [
        "statefulsets",
        "services",
        "configmaps",
        "secrets",
        "poddisruptionbudgets",
        "persistentvolumeclaims",
    ] {
        let names = child_names(&env, &other.namespace, r, "theirs");
        assert!(names.is_empty(), "{r} created in the other namespace: {names:?}");
    }
    let log = std::fs::read_to_string(&op.log).unwrap_or_default();
    assert!(!log.contains(&other.namespace), "the operator's log mentions the other namespace");
    assert!(!log.contains("forbidden"), "the namespaced Role was not enough:\n{}", op.log_tail(40));
}

// ---------------------------------------------------------------------------------------
// 8. Leader failover: two replicas, one writes; SIGKILL it; the other takes over ≤ 20 s.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_failover_within_20s() {
    let env = TestEnv::new("e2e-leader").await.expect("test env");
    let _teardown_env = Teardown::new(&env);
    let opts = |id: &str| OperatorOpts {
        namespace: env.namespace.clone(),
        lease_namespace: env.namespace.clone(),
        kubeconfig: None,
        identity: Some(id.to_string()),
        plugin_dir: None,
        ..Default::default()
    };
    let mut a = Operator::start_with(&env, "leader-a", opts("replica-a"));
    let mut b = Operator::start_with(&env, "leader-b", opts("replica-b"));
    a.wait_serving(START).await;
    b.wait_serving(START).await;
    let (leader_is_a, took) = wait_for("exactly one leader", Duration::from_secs(30), || async {
        match (a.is_leader(), b.is_leader()) {
            (Some(true), Some(false)) => Ok(true),
            (Some(false), Some(true)) => Ok(false),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    eprintln!("e2e[leader]: replica-{} leads after {took:.1?}", if leader_is_a { "a" } else { "b" });
    let (leader, follower) = if leader_is_a { (&mut a, &mut b) } else { (&mut b, &mut a) };
    leader.wait_ready(START).await;
    let kind = POSTGRES;
    let name = "ha";
    apply(&env, &env.namespace, &kind.manifest(name, 1, "Delete"));
    wait_running(&env, kind, name, 1, CONVERGE).await;
    assert!(leader.api_writes().expect("metrics") > 0.0, "the leader made no writes");
    assert_eq!(follower.api_writes().expect("metrics"), 0.0, "the follower wrote");
    assert_eq!(reconciles(follower), 0.0, "the follower reconciled");
    assert_eq!(follower.is_leader(), Some(false));

    leader.kill9();
    let killed = Instant::now();
    patch_ok(&env, &env.namespace, &format!("{}/{name}", kind.plural), &json!({"spec": {"replicas": 2}}));
    let sts = sts_api(&env);
    wait_for("the new leader applies the change", Duration::from_secs(30), || {
        let sts = sts.clone();
        async move {
            let s = sts.get(name).await.map_err(|e| e.to_string())?;
            let r = s.spec.as_ref().and_then(|s| s.replicas);
            if r == Some(2) {
                Ok(())
            } else {
                Err(format!("StatefulSet replicas {r:?}"))
            }
        }
    })
    .await;
    let took = killed.elapsed();
    eprintln!("e2e[leader]: follower took over and applied the change {took:.1?} after SIGKILL of the leader (lease 6 s)");
    // Lease 6 s: a figure against 10 s; the ceiling is liveness.
    stateward_testkit::report::seconds("controller.leader_failover", took, Some(Duration::from_secs(10)));
    assert!(took <= Duration::from_secs(30), "failover took {took:?}");
    assert_eq!(follower.is_leader(), Some(true));
    let took = wait_running(&env, kind, name, 2, CONVERGE).await;
    eprintln!("e2e[leader]: Running 2/2 {took:.1?} later");
}
