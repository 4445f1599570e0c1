//! Test helpers (feature `testkit`): real CR and child JSON as the host would observe it, and
//! [`plugin_suite!`](crate::plugin_suite), the behaviour every plugin must show.
#![allow(clippy::unwrap_used, clippy::panic, clippy::expect_used, missing_docs)]

use serde_json::{json, Value};

use crate::schema::GROUP;
use crate::types::{Action, Observed, Plan};

/// A v1 CR of `kind` called `name` with `spec`, generation 1, in namespace "db".
pub fn cr(kind: &str, name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": format!("{GROUP}/v1"),
        "kind": kind,
        "metadata": { "name": name, "namespace": "db", "uid": "0b5c1a4e-1", "generation": 1 },
        "spec": spec,
    })
}

/// Sets `.status.phase` as the host would have written it after an earlier reconcile.
pub fn with_phase(mut cr: Value, phase: &str) -> Value {
    cr["status"] = json!({ "phase": phase });
    cr
}

/// Observed input for `reconcile`/`finalize`.
pub fn observed(cr: &Value, children: &[Value]) -> Observed {
    Observed {
        resource: cr.to_string(),
        children: children.iter().map(Value::to_string).collect(),
        now_ms: 1_700_000_000_000,
        responses: Vec::new(),
    }
}

/// The objects a plan applies, as the host would store them (namespace set), plus the Secret.
pub fn applied(plan: &Plan) -> Vec<Value> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            Action::Apply(text) => {
                let mut v: Value = serde_json::from_str(text).unwrap();
                v["metadata"]["namespace"] = json!("db");
                Some(v)
            }
            Action::EnsureSecret(s) => {
                let data: serde_json::Map<String, Value> =
                    s.keys.iter().map(|(k, _)| (k.clone(), json!("c2VjcmV0"))).collect();
                let labels: serde_json::Map<String, Value> =
                    s.labels.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
                Some(json!({
                    "apiVersion": "v1", "kind": "Secret",
                    "metadata": { "name": s.name, "namespace": "db", "labels": labels },
                    "data": data,
                }))
            }
            Action::Delete(_) | Action::LabelPod(_) | Action::Exec(_) | Action::Http(_) => None,
        })
        .collect()
}

/// The applied object of `kind` in a plan.
pub fn find(plan: &Plan, kind: &str) -> Value {
    applied(plan).into_iter().find(|o| o["kind"] == kind).unwrap_or_else(|| panic!("no {kind} in plan"))
}

/// Every applied object of `kind`.
pub fn find_all(plan: &Plan, kind: &str) -> Vec<Value> {
    applied(plan).into_iter().filter(|o| o["kind"] == kind).collect()
}

/// Children where the StatefulSet carries a status as the controller would report it.
pub fn with_sts_status(
    children: &[Value],
    replicas: i64,
    ready: i64,
    updated: i64,
    revs: (&str, &str),
) -> Vec<Value> {
    children
        .iter()
        .cloned()
        .map(|mut c| {
            if c["kind"] == "StatefulSet" {
                c["metadata"]["generation"] = json!(1);
                c["status"] = json!({
                    "observedGeneration": 1,
                    "replicas": replicas,
                    "readyReplicas": ready,
                    "updatedReplicas": updated,
                    "currentRevision": revs.0,
                    "updateRevision": revs.1,
                });
            }
            c
        })
        .collect()
}

/// A bound data claim as the StatefulSet controller creates it for pod `ordinal`.
pub fn pvc(cluster: &str, ordinal: i64) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": format!("data-{cluster}-{ordinal}"), "namespace": "db",
            "labels": { "stateward.dev/instance": cluster },
        },
        "status": { "phase": "Bound" },
    })
}

/// A plan as canonical bytes, for byte-for-byte comparisons.
pub fn text(plan: &Plan) -> String {
    serde_json::to_string(plan).unwrap()
}

/// The status extra of a plan as JSON.
pub fn extra(plan: &Plan) -> Value {
    serde_json::from_str(&plan.status.extra).unwrap()
}

/// Panics unless every top-level status field of `plan` is declared in the CRD's status
/// schema of `B`: the API server drops an undeclared field without a word, and the plugin
/// would never read back what it wrote.
pub fn assert_status_declared<B: crate::driver::Blueprint>(plan: &Plan) {
    let schema = crate::schema::status(&B::status_extra_schema());
    let declared = schema.get("properties").and_then(Value::as_object).cloned().unwrap_or_default();
    let status = extra(plan);
    let undeclared: Vec<&String> = status
        .as_object()
        .into_iter()
        .flat_map(|m| m.keys())
        .filter(|k| !declared.contains_key(*k))
        .collect();
    assert!(undeclared.is_empty(), "status fields the CRD does not declare: {undeclared:?}");
}

/// The status of condition `type_` as "True"/"False"/"Unknown" and its reason.
pub fn condition(plan: &Plan, type_: &str) -> (String, String) {
    let c = plan.status.conditions.iter().find(|c| c.type_ == type_).unwrap();
    (format!("{:?}", c.status), c.reason.clone())
}

/// Inputs `validate` must refuse with an error rather than panic or accept.
pub fn hostile_inputs(valid: &str) -> Vec<String> {
    let mut v = vec![
        String::new(),
        "{".into(),
        "null".into(),
        "[]".into(),
        "42".into(),
        "\"text\"".into(),
        "{\"kind\":".into(),
        "\u{0}\u{1}\u{2}garbage\u{fffd}".into(),
        valid[..valid.len() / 2].to_string(),
        valid[..valid.len() - 1].to_string(),
        // 1 MB: a valid object, a deep nest, and a long array.
        format!("{{\"kind\":\"X\",\"pad\":\"{}\"}}", "a".repeat(1 << 20)),
        format!("{}{}", "[".repeat(1 << 20), "]".repeat(1 << 20)),
        format!("[{}0]", "0,".repeat(1 << 19)),
    ];
    let mut big: Value = serde_json::from_str(valid).unwrap();
    big["spec"]["parameters"] = json!({ "x": "y".repeat(1 << 20) });
    v.push(big.to_string());
    v
}

/// The behaviour every plugin shares, as `#[test]`s in the plugin crate:
/// `plugin_suite!(Postgres, "PostgresCluster", json!({ ..a valid v1 spec.. }));`
/// The spec must have 3 replicas and no retentionPolicy.
#[macro_export]
macro_rules! plugin_suite {
    ($ty:ty, $kind:expr, $spec:expr) => {
        mod suite {
            #![allow(clippy::unwrap_used, clippy::panic)]
            use super::*;
            use serde_json::{json, Value};
            use $crate::testkit as tk;
            use $crate::{Action, Phase, Service};

            fn base() -> Value {
                tk::cr($kind, "main", $spec)
            }
            fn plan(cr: &Value, children: &[Value]) -> $crate::Plan {
                <$ty>::reconcile(tk::observed(cr, children)).unwrap()
            }

            #[test]
            fn info_describes_two_versions_and_the_owned_kinds() {
                let info = <$ty>::info();
                assert_eq!(info.kinds.len(), 1);
                let k = &info.kinds[0];
                assert_eq!((k.group.as_str(), k.kind.as_str()), ("stateward.dev", $kind));
                let names: Vec<&str> = k.versions.iter().map(|v| v.name.as_str()).collect();
                assert_eq!(names, ["v1alpha1", "v1"]);
                assert_eq!(k.versions.iter().filter(|v| v.storage).count(), 1);
                assert!(k.versions[1].storage);
                for v in &k.versions {
                    let schema: Value = serde_json::from_str(&v.schema).unwrap();
                    assert_eq!(schema["properties"]["spec"]["properties"]["replicas"]["maximum"], 50);
                    let cols: Value = serde_json::from_str(&v.printer_columns).unwrap();
                    let wide: Vec<&str> = cols.as_array().unwrap().iter()
                        .filter(|c| c["priority"] == 1).map(|c| c["name"].as_str().unwrap()).collect();
                    assert_eq!(wide, ["Available", "Progressing", "Degraded", "Redundant"]);
                }
                let v1: Value = serde_json::from_str(&k.versions[1].schema).unwrap();
                assert_eq!(
                    v1["properties"]["spec"]["properties"]["storage"]["properties"]["className"]["x-kubernetes-validations"][0]["rule"],
                    "self == oldSelf"
                );
                assert!(v1["properties"]["spec"]["properties"]["deletionProtection"].is_object());
                let alpha: Value = serde_json::from_str(&k.versions[0].schema).unwrap();
                assert!(alpha["properties"]["spec"]["properties"]["deletionProtection"].is_null());
                let owns: Vec<String> = info.owns.iter().map(|o| format!("{}/{}", o.api_version, o.kind)).collect();
                assert_eq!(owns, [
                    "apps/v1/StatefulSet", "v1/Service", "v1/ConfigMap", "v1/Secret",
                    "policy/v1/PodDisruptionBudget", "v1/PersistentVolumeClaim", "v1/Pod",
                ]);
            }

            #[test]
            fn plan_emits_only_owned_kinds_without_namespace() {
                let info = <$ty>::info();
                let p = plan(&base(), &[]);
                let mut kinds = Vec::new();
                for a in &p.actions {
                    if let Action::Apply(t) = a {
                        let o: Value = serde_json::from_str(t).unwrap();
                        assert!(o["metadata"]["namespace"].is_null());
                        assert_eq!(o["metadata"]["labels"]["stateward.dev/instance"], "main");
                        assert_eq!(o["metadata"]["labels"]["app.kubernetes.io/managed-by"], "stateward");
                        assert!(info.owns.iter().any(|k| k.api_version == o["apiVersion"] && k.kind == o["kind"]));
                        kinds.push(o["kind"].as_str().unwrap().to_string());
                    }
                }
                for k in ["StatefulSet", "Service", "ConfigMap", "PodDisruptionBudget"] {
                    assert!(kinds.iter().any(|x| x == k), "{k} missing");
                }
                assert!(p.actions.iter().any(|a| matches!(a, Action::EnsureSecret(s) if s.name == "main-credentials")));
                let pdb = tk::find(&p, "PodDisruptionBudget");
                assert_eq!(pdb["spec"]["maxUnavailable"], 1);
            }

            #[test]
            fn statefulset_passes_guardrails() {
                let p = plan(&base(), &[]);
                let sts = tk::find(&p, "StatefulSet");
                let pod = &sts["spec"]["template"]["spec"];
                assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
                assert!(pod["securityContext"]["runAsUser"].as_i64().unwrap() > 0);
                assert!(pod["hostNetwork"].is_null());
                for v in pod["volumes"].as_array().unwrap() {
                    assert!(v["hostPath"].is_null());
                }
                for c in pod["containers"].as_array().unwrap() {
                    let sc = &c["securityContext"];
                    assert_eq!(sc["allowPrivilegeEscalation"], false);
                    assert_eq!(sc["privileged"], false);
                    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
                    assert!(c["resources"]["limits"]["cpu"].is_string());
                    assert!(c["resources"]["limits"]["memory"].is_string());
                    assert!(c["readinessProbe"].is_object() && c["livenessProbe"].is_object());
                    assert!(c["readinessProbe"]["tcpSocket"].is_null(), "probe must ask the service itself");
                    // Exec probes run a process in the container: 1 s timeouts fail on busy nodes.
                    for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
                        if c[probe]["exec"].is_object() {
                            assert!(c[probe]["timeoutSeconds"].as_i64().unwrap() >= 5, "{probe} timeout under 5 s");
                        }
                    }
                }
                for field in ["nodeSelector", "tolerations", "affinity", "priorityClassName"] {
                    assert!(pod[field].is_null(), "{field} only when the spec sets it");
                }
                let keys: Vec<&str> = pod["topologySpreadConstraints"].as_array().unwrap().iter()
                    .map(|t| t["topologyKey"].as_str().unwrap()).collect();
                assert_eq!(keys, ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]);
                let vct = &sts["spec"]["volumeClaimTemplates"][0];
                assert_eq!(vct["metadata"]["labels"]["stateward.dev/instance"], "main");
                assert!(vct["metadata"]["labels"]["app.kubernetes.io/version"].is_null(), "VCTs are immutable");
                assert_eq!(sts["spec"]["replicas"], 3);
                assert!(sts["spec"]["template"]["metadata"]["annotations"]["stateward.dev/config-hash"].is_string());
            }

            #[test]
            fn spec_resources_and_priority_class_reach_the_pods() {
                let mut cr = base();
                cr["spec"]["resources"] = json!({ "requests": { "cpu": "300m", "memory": "300Mi" }, "limits": { "memory": "600Mi" } });
                cr["spec"]["priorityClassName"] = json!("databases");
                let sts = tk::find(&plan(&cr, &[]), "StatefulSet");
                let pod = &sts["spec"]["template"]["spec"];
                assert_eq!(pod["priorityClassName"], "databases");
                let r = &pod["containers"][0]["resources"];
                assert_eq!(r["requests"], json!({ "cpu": "300m", "memory": "300Mi" }));
                assert_eq!(r["limits"]["memory"], "600Mi");
                assert!(r["limits"]["cpu"].is_string(), "default cpu limit");
            }

            #[test]
            fn scheduling_reaches_the_pods_and_bad_scheduling_names_the_field() {
                let mut cr = base();
                let scheduling = json!({
                    "nodeSelector": { "kubernetes.io/os": "linux" },
                    "tolerations": [{ "key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule" }],
                    "affinity": { "podAntiAffinity": { "preferredDuringSchedulingIgnoredDuringExecution": [] } },
                    "priorityClassName": "databases",
                });
                cr["spec"]["scheduling"] = scheduling.clone();
                assert_eq!(<$ty>::validate(&cr.to_string(), None), vec![]);
                let sts = tk::find(&plan(&cr, &[]), "StatefulSet");
                let pod = &sts["spec"]["template"]["spec"];
                for field in ["nodeSelector", "tolerations", "affinity", "priorityClassName"] {
                    assert_eq!(pod[field], scheduling[field], "{field}");
                }
                // Scheduling changes where pods run, not their configuration.
                let h = |s: &Value| s["spec"]["template"]["metadata"]["annotations"]["stateward.dev/config-hash"].clone();
                assert_eq!(h(&sts), h(&tk::find(&plan(&base(), &[]), "StatefulSet")));
                // The deprecated top-level field may repeat the value, not contradict it.
                cr["spec"]["priorityClassName"] = json!("databases");
                assert_eq!(<$ty>::validate(&cr.to_string(), None), vec![]);
                cr["spec"]["priorityClassName"] = json!("other");
                cr["spec"]["scheduling"]["tolerations"][0]["operator"] = json!("Sometimes");
                let errs = <$ty>::validate(&cr.to_string(), None);
                let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
                assert_eq!(paths, ["spec.scheduling.tolerations[0].operator", "spec.priorityClassName"]);
                let p = plan(&cr, &[]);
                assert_eq!(p.status.phase, Phase::Failed);
                assert!(p.actions.is_empty());
                // The same field in both versions: conversion carries it unchanged.
                let mut v1 = base();
                v1["spec"]["scheduling"] = scheduling.clone();
                let alpha: Value = serde_json::from_str(&<$ty>::convert(&v1.to_string(), "v1alpha1").unwrap()).unwrap();
                assert_eq!(alpha["spec"]["scheduling"], scheduling);
                let back: Value = serde_json::from_str(&<$ty>::convert(&alpha.to_string(), "v1").unwrap()).unwrap();
                assert_eq!(back, v1);
                for v in &<$ty>::info().kinds[0].versions {
                    let schema: Value = serde_json::from_str(&v.schema).unwrap();
                    let props = &schema["properties"]["spec"]["properties"];
                    assert!(props["scheduling"]["properties"]["tolerations"].is_object(), "{}", v.name);
                    assert!(props["priorityClassName"]["description"].as_str().unwrap().starts_with("Deprecated"));
                }
            }

            #[test]
            fn a_larger_size_grows_each_claim_and_keeps_the_claim_template() {
                let cr = base();
                let size = cr["spec"]["storage"]["size"].as_str().unwrap().to_string();
                let claim = |i: i64, size: &str| {
                    let mut c = tk::pvc("main", i);
                    c["spec"] = json!({ "resources": { "requests": { "storage": size } } });
                    c
                };
                let mut grown = base();
                grown["spec"]["storage"]["size"] = json!("999Gi");
                let mut observed = tk::applied(&plan(&cr, &[]));
                observed.extend((0..3).map(|i| claim(i, &size)));
                let p = plan(&grown, &observed);
                let claims = tk::find_all(&p, "PersistentVolumeClaim");
                let names: Vec<&str> = claims.iter().map(|c| c["metadata"]["name"].as_str().unwrap()).collect();
                assert_eq!(names, ["data-main-0", "data-main-1", "data-main-2"]);
                for c in &claims {
                    assert_eq!(c["spec"], json!({ "resources": { "requests": { "storage": "999Gi" } } }), "only the request");
                    assert_eq!(c["metadata"]["labels"]["stateward.dev/instance"], "main");
                }
                let vct = &tk::find(&p, "StatefulSet")["spec"]["volumeClaimTemplates"][0];
                assert_eq!(vct["spec"]["resources"]["requests"]["storage"], json!(size), "a claim template cannot change");
                assert!(p.events.iter().any(|e| e.reason == "GrowingVolumes"), "{:?}", p.events);
                // Claims that already ask for the size (or more), or are not this cluster's, stay.
                observed.retain(|c| c["kind"] != "PersistentVolumeClaim");
                observed.extend([claim(0, "999Gi"), claim(1, "1Ti"), tk::pvc("main", 2)]);
                let mut other = claim(0, &size);
                other["metadata"]["labels"]["stateward.dev/instance"] = json!("mainx");
                other["metadata"]["name"] = json!("data-mainx-0");
                observed.push(other);
                assert!(tk::find_all(&plan(&grown, &observed), "PersistentVolumeClaim").is_empty());
                // Running, with a claim still below the size: Progressing says so.
                let running = tk::with_phase(grown.clone(), "Running");
                let mut converged = tk::with_sts_status(&tk::applied(&plan(&cr, &[])), 3, 3, 3, ("r1", "r1"));
                let bound = |i: i64, capacity: &str| {
                    let mut c = claim(i, "999Gi");
                    c["status"] = json!({ "phase": "Bound", "capacity": { "storage": capacity } });
                    c
                };
                converged.extend([bound(0, "999Gi"), bound(1, "999Gi"), bound(2, &size)]);
                assert_eq!(tk::condition(&plan(&running, &converged), "Progressing"), ("True".into(), "ResizingVolumes".into()));
                let message = plan(&running, &converged).status.conditions.iter().find(|c| c.type_ == "Progressing").unwrap().message.clone();
                assert_eq!(message, "2 of 3 data claims have 999Gi");
                converged.pop();
                converged.push(bound(2, "1000Gi"));
                assert_eq!(tk::condition(&plan(&running, &converged), "Progressing"), ("False".into(), "Converged".into()));
                // A new StatefulSet is created at the spec's size.
                let fresh = tk::find(&plan(&grown, &[]), "StatefulSet");
                assert_eq!(fresh["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"], "999Gi");
            }

            #[test]
            fn scaling_keeps_the_config_hash() {
                let h = |cr: &Value| tk::find(&plan(cr, &[]), "StatefulSet")["spec"]["template"]["metadata"]["annotations"]["stateward.dev/config-hash"].clone();
                let a = h(&base());
                let mut cr = base();
                cr["spec"]["replicas"] = json!(5);
                assert!(a.is_string());
                assert_eq!(a, h(&cr), "scaling alone must not roll the pods");
            }

            #[test]
            fn reconcile_is_idempotent_byte_for_byte() {
                let cr = base();
                let first = plan(&cr, &[]);
                let children = tk::applied(&first);
                let second = plan(&cr, &children);
                assert_eq!(first.actions, second.actions, "same applies whatever is observed");
                let third = plan(&cr, &tk::applied(&second));
                assert_eq!(tk::text(&second), tk::text(&third));
                let running = tk::with_phase(cr, "Running");
                let converged = tk::with_sts_status(&children, 3, 3, 3, ("r1", "r1"));
                let a = plan(&running, &converged);
                let b = plan(&running, &converged);
                assert_eq!(tk::text(&a), tk::text(&b));
                assert!(a.events.is_empty(), "no event without a phase change");
                assert_eq!(a.requeue_after_ms, None);
            }

            #[test]
            fn phases_follow_the_statefulset() {
                let cr = base();
                let children = tk::applied(&plan(&cr, &[]));
                let p = plan(&cr, &[]);
                assert_eq!(p.status.phase, Phase::Pending);
                assert_eq!(tk::condition(&p, "Progressing"), ("True".into(), "Creating".into()));
                assert_eq!(tk::condition(&p, "Available").0, "False");
                assert!(p.requeue_after_ms.is_some());
                assert_eq!(p.events[0].reason, "PhaseChanged");

                let creating = plan(&cr, &tk::with_sts_status(&children, 2, 1, 2, ("r1", "r1")));
                assert_eq!(creating.status.phase, Phase::Pending);

                let running = tk::with_phase(cr.clone(), "Running");
                let p = plan(&running, &tk::with_sts_status(&children, 3, 3, 3, ("r1", "r1")));
                assert_eq!(p.status.phase, Phase::Running);
                assert_eq!(tk::condition(&p, "Available"), ("True".into(), "AllReplicasReady".into()));
                assert_eq!(tk::condition(&p, "Progressing").0, "False");
                assert_eq!(tk::condition(&p, "Degraded").0, "False");
                assert_eq!(tk::extra(&p)["readyReplicas"], 3);

                let p = plan(&running, &tk::with_sts_status(&children, 3, 2, 3, ("r1", "r1")));
                assert_eq!(p.status.phase, Phase::Running);
                assert_eq!(tk::condition(&p, "Degraded"), ("True".into(), "ReplicasNotReady".into()));

                let mut scaled = running.clone();
                scaled["spec"]["replicas"] = json!(5);
                let p = plan(&scaled, &tk::with_sts_status(&children, 3, 3, 3, ("r1", "r1")));
                assert_eq!(p.status.phase, Phase::Scaling);
                assert_eq!(tk::condition(&p, "Progressing"), ("True".into(), "Scaling".into()));
                assert_eq!(p.events[0].message, "phase Running -> Scaling");

                let p = plan(&running, &tk::with_sts_status(&children, 3, 3, 1, ("r1", "r2")));
                assert_eq!(p.status.phase, Phase::Upgrading);
                assert_eq!(tk::condition(&p, "Progressing").1, "RollingUpdate");
                // A rollout takes a pod down: the dip in replicas is still an upgrade.
                let upgrading = tk::with_phase(cr.clone(), "Upgrading");
                let p = plan(&upgrading, &tk::with_sts_status(&children, 2, 2, 1, ("r1", "r2")));
                assert_eq!(p.status.phase, Phase::Upgrading);
                // Pods still being added after a scale-up whose spec is applied: Scaling.
                let p = plan(&tk::with_phase(cr.clone(), "Scaling"), &tk::with_sts_status(&children, 2, 2, 3, ("r1", "r1")));
                assert_eq!(p.status.phase, Phase::Scaling);

                let mut upgraded = running.clone();
                upgraded["spec"]["image"] = json!("registry.example/custom:1");
                let p = plan(&upgraded, &tk::with_sts_status(&children, 3, 3, 3, ("r1", "r1")));
                assert_eq!(p.status.phase, Phase::Upgrading);
            }

            #[test]
            fn paused_changes_nothing_until_resumed() {
                let running = tk::with_phase(base(), "Running");
                let children = tk::with_sts_status(&tk::applied(&plan(&running, &[])), 3, 3, 3, ("r1", "r1"));
                let converged = plan(&running, &children);
                let written: Vec<Value> = converged.status.conditions.iter()
                    .map(|c| json!({"type": c.type_, "status": format!("{:?}", c.status), "reason": c.reason, "message": c.message}))
                    .collect();
                let mut paused = running.clone();
                paused["status"]["conditions"] = json!(written);
                paused["status"]["readyReplicas"] = json!(3);
                paused["spec"]["paused"] = json!(true);
                paused["spec"]["replicas"] = json!(5);
                let p = plan(&paused, &children);
                assert!(p.actions.is_empty(), "a paused resource's plan acts: {:?}", p.actions);
                assert_eq!(p.status.phase, Phase::Running, "the last phase is kept");
                assert_eq!(tk::condition(&p, "Paused"), ("True".into(), "SpecPaused".into()));
                assert_eq!(tk::condition(&p, "Available"), tk::condition(&converged, "Available"));
                assert_eq!(tk::extra(&p)["readyReplicas"], 3, "the last status fields are kept");
                assert_eq!(p.events.iter().map(|e| e.reason.as_str()).collect::<Vec<_>>(), ["Paused"]);

                let mut still = paused.clone();
                still["status"]["conditions"] = json!([{"type": "Paused", "status": "True", "reason": "SpecPaused", "message": ""}]);
                assert!(plan(&still, &children).events.is_empty(), "Paused is said once");
                assert!(plan(&still, &children).actions.is_empty());

                let mut resumed = still.clone();
                resumed["spec"]["paused"] = json!(false);
                let p = plan(&resumed, &children);
                assert_eq!(tk::find(&p, "StatefulSet")["spec"]["replicas"], 5, "the change waited, and is applied now");
                assert!(p.status.conditions.iter().all(|c| c.type_ != "Paused"));
                assert!(p.events.iter().any(|e| e.reason == "Resumed"));

                let mut wrong = base();
                wrong["spec"]["paused"] = json!("yes");
                let errs = <$ty>::validate(&wrong.to_string(), None);
                assert!(errs.iter().any(|e| e.path == "spec.paused" && e.message.contains("boolean")), "{errs:?}");
            }

            #[test]
            fn hibernate_stops_every_pod_keeping_the_rest_and_wakes_the_same_pods() {
                let running = tk::with_phase(base(), "Running");
                let children = tk::with_sts_status(&tk::applied(&plan(&running, &[])), 3, 3, 3, ("r1", "r1"));
                let awake = plan(&running, &children);
                let mut asleep = running.clone();
                asleep["spec"]["hibernate"] = json!(true);
                // What the plugin observed and decided last is kept for the wake.
                asleep["status"]["decidedEarlier"] = json!({"primary": "main-1"});
                let pod = |i: i64| json!({"apiVersion": "v1", "kind": "Pod", "metadata": {
                    "name": format!("main-{i}"), "uid": format!("u{i}"), "labels": {"stateward.dev/instance": "main"}}});
                let mut with_pods = children.clone();
                with_pods.extend([pod(0), pod(1), tk::pvc("main", 0), tk::pvc("main", 1)]);
                let p = plan(&asleep, &with_pods);
                assert!(
                    p.actions.iter().all(|a| matches!(a, Action::Apply(_) | Action::EnsureSecret(_))),
                    "no request to the service, no label, no delete while it hibernates: {:?}", p.actions
                );
                let zeroed = |objects: Vec<Value>| -> Vec<Value> {
                    objects.into_iter().map(|mut o| {
                        if o["kind"] == "StatefulSet" { o["spec"]["replicas"] = json!(0); }
                        o
                    }).collect()
                };
                let sets = tk::find_all(&p, "StatefulSet");
                assert!(!sets.is_empty() && sets.iter().all(|s| s["spec"]["replicas"] == 0), "{sets:?}");
                // Every object is the awake plan's (Secrets, Services, configuration, template),
                // the StatefulSets at zero; what the awake plan makes from the service's answers
                // is not rendered (and not deleted either).
                let awake_zeroed = zeroed(tk::applied(&awake));
                for o in tk::applied(&p) {
                    assert!(awake_zeroed.contains(&o), "not as when awake: {o:#}");
                }
                assert_eq!(sets, zeroed(tk::find_all(&awake, "StatefulSet")));
                assert_eq!(p.status.phase, Phase::Scaling);
                assert_eq!(tk::condition(&p, "Hibernated"), ("False".into(), "Stopping".into()));
                assert_eq!(tk::condition(&p, "Available"), ("False".into(), "Hibernated".into()));
                assert_eq!(tk::extra(&p)["decidedEarlier"], json!({"primary": "main-1"}));
                assert_eq!(p.events.iter().map(|e| e.reason.as_str()).collect::<Vec<_>>(), ["PhaseChanged", "Hibernating"]);

                // Every pod gone: Hibernated, said once.
                let stopped = tk::with_sts_status(&tk::applied(&p), 0, 0, 0, ("r1", "r1"));
                let mut stopped_children = stopped.clone();
                stopped_children.extend([tk::pvc("main", 0), tk::pvc("main", 1)]);
                let mut stopping = asleep.clone();
                stopping["status"]["phase"] = json!("Scaling");
                stopping["status"]["conditions"] = json!([{"type": "Hibernated", "status": "False", "reason": "Stopping", "message": ""}]);
                let p = plan(&stopping, &stopped_children);
                let (status, reason) = tk::condition(&p, "Hibernated");
                assert_eq!((status.as_str(), reason.as_str()), ("True", "Hibernated"));
                assert!(p.status.conditions.iter().any(|c| c.message.contains("2 volume claim(s)")), "{:?}", p.status.conditions);
                assert!(p.events.iter().any(|e| e.reason == "Hibernated"), "{:?}", p.events);
                assert_eq!(p.requeue_after_ms, None);
                let mut asleep_still = stopping.clone();
                asleep_still["status"]["phase"] = json!(p.status.phase.as_str());
                asleep_still["status"]["conditions"] = json!([{"type": "Hibernated", "status": "True", "reason": "Hibernated", "message": ""}]);
                assert!(plan(&asleep_still, &stopped_children).events.is_empty(), "said once");

                // Woken: the plan an awake cluster gets, and the event saying so.
                let mut woken = asleep_still.clone();
                woken["spec"]["hibernate"] = json!(false);
                let p = plan(&woken, &stopped_children);
                assert_eq!(tk::find_all(&p, "StatefulSet"), tk::find_all(&awake, "StatefulSet"), "the same pods again");
                assert!(p.status.conditions.iter().all(|c| c.type_ != "Hibernated"));
                assert!(p.events.iter().any(|e| e.reason == "Waking"), "{:?}", p.events);

                let mut wrong = base();
                wrong["spec"]["hibernate"] = json!("yes");
                let errs = <$ty>::validate(&wrong.to_string(), None);
                assert!(errs.iter().any(|e| e.path == "spec.hibernate" && e.message.contains("boolean")), "{errs:?}");
            }

            #[test]
            fn fenced_pods_leave_every_client_service_and_are_kept() {
                use $crate::fence::{FENCED_ANNOTATION, FENCED_LABEL};
                let running = tk::with_phase(base(), "Running");
                let sets = tk::with_sts_status(&tk::applied(&plan(&running, &[])), 3, 3, 3, ("r1", "r1"));
                let pod = |i: i64, fenced: Option<&str>| {
                    let mut labels = json!({"stateward.dev/instance": "main"});
                    if let Some(f) = fenced { labels[FENCED_LABEL] = json!(f); }
                    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {
                        "name": format!("main-{i}"), "uid": format!("u{i}"), "labels": labels}})
                };
                let with_pods = |fenced: [Option<&str>; 3]| -> Vec<Value> {
                    let mut c = sets.clone();
                    c.extend(fenced.iter().enumerate().map(|(i, f)| pod(i as i64, *f)));
                    c
                };
                let fence_labels = |p: &$crate::Plan| -> Vec<(String, String)> {
                    p.actions.iter().filter_map(|a| match a {
                        Action::LabelPod(l) if l.labels[0].0 == FENCED_LABEL =>
                            Some((l.pod.clone(), l.labels[0].1.clone().unwrap_or_default())),
                        _ => None,
                    }).collect()
                };
                let pair = |p: &str, v: &str| (p.to_string(), v.to_string());
                // Every client Service selects pods that are not fenced; the headless one keeps
                // every pod (their names); pods not labelled yet are.
                let p = plan(&running, &with_pods([None, None, None]));
                for svc in tk::find_all(&p, "Service") {
                    let client = svc["spec"]["clusterIP"] != "None";
                    let selects = svc["spec"]["selector"][FENCED_LABEL].clone();
                    assert_eq!(selects, if client { json!("false") } else { Value::Null }, "{svc}");
                    // Only this instance's pods (the guardrails' service-selector).
                    assert_eq!(svc["spec"]["selector"]["stateward.dev/instance"], "main", "{svc}");
                }
                assert_eq!(fence_labels(&p), [pair("main-0", "false"), pair("main-1", "false"), pair("main-2", "false")]);
                assert_eq!(fence_labels(&plan(&running, &with_pods([Some("false"); 3]))), []);
                assert!(p.status.conditions.iter().all(|c| c.type_ != "Fenced"));

                let mut fenced = running.clone();
                fenced["metadata"]["annotations"] = json!({ FENCED_ANNOTATION: "[\"main-1\"]" });
                let p = plan(&fenced, &with_pods([Some("false"); 3]));
                assert_eq!(fence_labels(&p), [pair("main-1", "true")]);
                let first_service = p.actions.iter()
                    .position(|a| matches!(a, Action::Apply(t) if t.contains("\"kind\":\"Service\""))).unwrap();
                let label = p.actions.iter().position(|a| matches!(a, Action::LabelPod(l) if l.labels[0].0 == FENCED_LABEL)).unwrap();
                assert!(label < first_service, "the label before the Services that select on it");
                assert!(!p.actions.iter().any(|a| matches!(a, Action::Delete(_))), "the pod is kept");
                assert_eq!(tk::condition(&p, "Fenced"), ("True".into(), "PodsFenced".into()));
                let said: Vec<&str> = p.events.iter().filter(|e| e.reason == "Fenced").map(|e| e.message.as_str()).collect();
                assert!(said.len() == 1 && said[0].contains("main-1"), "{:?}", p.events);
                // Said once.
                let mut still = fenced.clone();
                let written: Vec<Value> = p.status.conditions.iter()
                    .map(|c| json!({"type": c.type_, "status": format!("{:?}", c.status), "reason": c.reason, "message": c.message}))
                    .collect();
                still["status"]["conditions"] = json!(written);
                let labelled = with_pods([Some("false"), Some("true"), Some("false")]);
                let p = plan(&still, &labelled);
                assert_eq!(fence_labels(&p), []);
                assert!(p.events.iter().all(|e| e.reason != "Fenced"), "{:?}", p.events);

                // Unfenced: back in the Services.
                let mut unfenced = still.clone();
                unfenced["metadata"]["annotations"][FENCED_ANNOTATION] = json!("[]");
                let p = plan(&unfenced, &labelled);
                assert_eq!(fence_labels(&p), [pair("main-1", "false")]);
                assert_eq!(tk::condition(&p, "Fenced"), ("False".into(), "NoneFenced".into()));
                assert!(p.events.iter().any(|e| e.reason == "Unfenced"), "{:?}", p.events);

                // Bad lists are refused, naming the annotation.
                let path = format!("metadata.annotations[{FENCED_ANNOTATION}]");
                for (value, says) in [("main-1", "JSON list"), ("[\"main-7\"]", "not a pod of this cluster"), ("[1]", "JSON list")] {
                    let mut bad = base();
                    bad["metadata"]["annotations"] = json!({ FENCED_ANNOTATION: value });
                    let errs = <$ty>::validate(&bad.to_string(), None);
                    assert!(errs.iter().any(|e| e.path == path && e.message.contains(says)), "{value}: {errs:?}");
                }
            }

            #[test]
            fn a_restart_request_changes_only_the_pod_template_annotation() {
                const KEY: &str = "stateward.dev/restarted-at";
                const HASH: &str = "stateward.dev/template-hash";
                let mut before = tk::find(&plan(&base(), &[]), "StatefulSet");
                let mut asked = base();
                asked["metadata"]["annotations"] = json!({ KEY: "2026-12-04T10:00:00Z" });
                let mut after = tk::find(&plan(&asked, &[]), "StatefulSet");
                let annotations = after["spec"]["template"]["metadata"]["annotations"].as_object_mut().unwrap();
                assert_eq!(annotations.remove(KEY), Some(json!("2026-12-04T10:00:00Z")));
                // The StatefulSet's hash of its pod template follows the template.
                let (old, new) = (before["metadata"]["annotations"][HASH].take(), after["metadata"]["annotations"][HASH].take());
                assert!(old.is_string() && new.is_string() && old != new, "{old} {new}");
                assert_eq!(after, before, "nothing else of the StatefulSet changes");

                asked["metadata"]["annotations"][KEY] = json!("two words");
                let errs = <$ty>::validate(&asked.to_string(), None);
                let path = format!("metadata.annotations[{KEY}]");
                assert!(errs.iter().any(|e| e.path == path), "{errs:?}");
                asked["metadata"]["annotations"][KEY] = json!("x".repeat(65));
                assert!(<$ty>::validate(&asked.to_string(), None).iter().any(|e| e.path == path));
            }

            #[test]
            fn invalid_spec_fails_without_actions() {
                let mut cr = base();
                cr["spec"]["replicas"] = json!(0);
                let p = plan(&cr, &[]);
                assert_eq!(p.status.phase, Phase::Failed);
                assert!(p.actions.is_empty());
                assert_eq!(tk::condition(&p, "Degraded"), ("True".into(), "InvalidSpec".into()));
                assert!(p.status.conditions[2].message.contains("spec.replicas"));
                assert!(<$ty>::reconcile(tk::observed(&json!({"kind": "Other"}), &[])).is_err());
                let mut obs = tk::observed(&base(), &[]);
                obs.children.push("{".into());
                assert!(<$ty>::reconcile(obs).is_err());
            }

            #[test]
            fn retention_policy_is_carried_out_by_finalize_only() {
                let sts = tk::find(&plan(&base(), &[]), "StatefulSet");
                assert_eq!(sts["spec"]["persistentVolumeClaimRetentionPolicy"], json!({ "whenDeleted": "Retain", "whenScaled": "Retain" }));
                let mut del = base();
                del["spec"]["retentionPolicy"] = json!("Delete");
                let p = plan(&del, &[]);
                let sts = tk::find(&p, "StatefulSet");
                // Deleting the StatefulSet alone never takes the claims, even with Delete.
                assert_eq!(sts["spec"]["persistentVolumeClaimRetentionPolicy"], json!({ "whenDeleted": "Retain", "whenScaled": "Retain" }));

                let mut children = tk::applied(&p);
                children.extend([tk::pvc("main", 0), tk::pvc("main", 1), tk::pvc("other", 0)]);
                // The credentials and certificate go with a Delete (another instance's never).
                for name in ["main-credentials", "other-credentials", "main-tls", "other-tls"] {
                    let owner = name.split('-').next().unwrap_or_default();
                    if !children.iter().any(|c| c["kind"] == "Secret" && c["metadata"]["name"] == *name) {
                        children.push(json!({"apiVersion": "v1", "kind": "Secret",
                            "metadata": {"name": name, "labels": {"stateward.dev/instance": owner}}}));
                    }
                }
                let keep = <$ty>::finalize(tk::observed(&base(), &children)).unwrap();
                assert!(keep.done && keep.actions.is_empty());
                let c = <$ty>::finalize(tk::observed(&del, &children)).unwrap();
                assert!(!c.done);
                let deleted: Vec<String> = c.actions.iter().map(|a| match a {
                    Action::Delete(r) => format!("{}/{}", r.kind, r.name),
                    other => panic!("unexpected {other:?}"),
                }).collect();
                let mut deleted = deleted;
                deleted.sort();
                // Every Secret the plan keeps (credentials, certificate, any the plugin adds).
                let mut want: Vec<String> = p.actions.iter().filter_map(|a| match a {
                    Action::EnsureSecret(s) => Some(format!("Secret/{}", s.name)),
                    _ => None,
                }).collect();
                assert!(want.contains(&"Secret/main-credentials".to_string()) && want.contains(&"Secret/main-tls".to_string()));
                want.extend(["PersistentVolumeClaim/data-main-0", "PersistentVolumeClaim/data-main-1", "StatefulSet/main"].map(String::from));
                want.sort();
                assert_eq!(deleted, want);
                let rest: Vec<Value> = children.into_iter().filter(|c| c["kind"] == "Service").collect();
                assert!(<$ty>::finalize(tk::observed(&del, &rest)).unwrap().done);
            }

            #[test]
            fn validate_refuses_garbage_without_panicking() {
                let valid = base().to_string();
                assert_eq!(<$ty>::validate(&valid, None), vec![]);
                assert_eq!(<$ty>::validate(&valid, Some(&valid)), vec![]);
                for input in tk::hostile_inputs(&valid) {
                    assert!(!<$ty>::validate(&input, None).is_empty(), "accepted {:.60}", input);
                }
            }

            #[test]
            fn validate_names_the_fields() {
                let paths = |cr: &Value, old: Option<&Value>| -> Vec<String> {
                    let old = old.map(|o| o.to_string());
                    <$ty>::validate(&cr.to_string(), old.as_deref()).into_iter().map(|e| e.path).collect()
                };
                let mut cr = base();
                cr["spec"]["replicas"] = json!(51);
                cr["spec"]["storage"]["size"] = json!("ten gigs");
                cr["spec"]["parameters"] = json!({ "no_such_parameter": "1" });
                cr["spec"]["version"] = json!("latest");
                cr["metadata"]["name"] = json!("Bad_Name");
                let mut got = paths(&cr, None);
                got.sort();
                assert_eq!(got, ["metadata.name", "spec.parameters.no_such_parameter", "spec.replicas", "spec.storage.size", "spec.version"]);
                let mut moved = base();
                moved["spec"]["storage"]["className"] = json!("other");
                assert!(paths(&moved, Some(&base())).contains(&"spec.storage.className".to_string()));
                let mut grown = base();
                grown["spec"]["storage"]["size"] = json!("999Gi");
                assert!(paths(&grown, Some(&base())).is_empty(), "volumes may grow");
                assert_eq!(paths(&base(), Some(&grown)), ["spec.storage.size"], "volumes never shrink");
                let mut wrong = base();
                wrong["kind"] = json!("SomethingElse");
                assert_eq!(paths(&wrong, None), ["kind"]);
            }

            #[test]
            fn conversion_round_trips_this_kind() {
                let mut cr = base();
                cr["spec"]["deletionProtection"] = json!(true);
                cr["spec"]["storage"]["className"] = json!("fast");
                let alpha = <$ty>::convert(&cr.to_string(), "v1alpha1").unwrap();
                let a: Value = serde_json::from_str(&alpha).unwrap();
                assert_eq!(a["apiVersion"], "stateward.dev/v1alpha1");
                assert_eq!(a["spec"]["storageClassName"], "fast");
                assert!(a["spec"]["storage"].is_null() && a["spec"]["deletionProtection"].is_null());
                let back: Value = serde_json::from_str(&<$ty>::convert(&alpha, "v1").unwrap()).unwrap();
                assert_eq!(back, cr);
                let full = <$ty>::convert(&cr.to_string(), "stateward.dev/v1alpha1").unwrap();
                assert_eq!(full, alpha, "the full apiVersion form is accepted too");
                assert!(<$ty>::convert(&cr.to_string(), "v2").is_err());
                assert!(<$ty>::convert(&cr.to_string(), "other.dev/v1").is_err());
                assert!(<$ty>::convert("{", "v1").is_err());
            }
        }
    };
}
