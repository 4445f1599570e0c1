#![allow(clippy::unwrap_used, clippy::panic)]

use serde_json::{json, Value};
use stateward_sdk::testkit as tk;
use stateward_sdk::{Action, Service};

use super::Postgres;

fn spec() -> Value {
    json!({ "version": "17.2", "replicas": 3, "storage": { "size": "10Gi" } })
}

stateward_sdk::plugin_suite!(Postgres, "PostgresCluster", spec());

fn plan(cr: &Value) -> stateward_sdk::Plan {
    Postgres::reconcile(tk::observed(cr, &[])).unwrap()
}

#[test]
fn postgresql_conf_has_managed_settings_defaults_and_parameters() {
    let mut cr = tk::cr("PostgresCluster", "pg", spec());
    cr["spec"]["parameters"] = json!({ "max_connections": "250", "work_mem": "16MB" });
    let cm = tk::find(&plan(&cr), "ConfigMap");
    assert_eq!(cm["metadata"]["name"], "pg-config");
    let conf = cm["data"]["postgresql.conf"].as_str().unwrap();
    for line in [
        "listen_addresses = '*'",
        "port = 5432",
        "max_connections = '250'",
        "work_mem = '16MB'",
        "shared_buffers = '128MB'",
        "wal_level = 'replica'",
    ] {
        assert!(conf.lines().any(|l| l == line), "missing {line:?} in\n{conf}");
    }
    assert!(!conf.contains("max_connections = '100'"));
    let sts = tk::find(&plan(&cr), "StatefulSet");
    let before = tk::find(&plan(&tk::cr("PostgresCluster", "pg", spec())), "StatefulSet");
    let hash = |s: &Value| s["spec"]["template"]["metadata"]["annotations"]["stateward.dev/config-hash"].clone();
    assert_ne!(hash(&sts), hash(&before), "a parameter change must roll the pods");
}

#[test]
fn container_runs_postgres_with_the_generated_config_and_pg_isready() {
    let sts = tk::find(&plan(&tk::cr("PostgresCluster", "pg", spec())), "StatefulSet");
    let c = &sts["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "postgres:17.2");
    assert_eq!(c["args"], json!(["postgres", "-c", "config_file=/etc/stateward/postgresql.conf"]));
    assert!(c["readinessProbe"]["exec"]["command"][2].as_str().unwrap().starts_with("pg_isready"));
    assert!(c["livenessProbe"]["exec"]["command"][2].as_str().unwrap().starts_with("pg_isready"));
    assert_eq!(c["securityContext"]["runAsUser"], 999);
    let pw = c["env"].as_array().unwrap().iter().find(|e| e["name"] == "POSTGRES_PASSWORD").unwrap();
    assert_eq!(pw["valueFrom"]["secretKeyRef"], json!({ "name": "pg-credentials", "key": "password" }));
    assert_eq!(sts["spec"]["podManagementPolicy"], "OrderedReady");
    let mut alpine = tk::cr("PostgresCluster", "pg", spec());
    alpine["spec"]["version"] = json!("16-alpine");
    let sts = tk::find(&plan(&alpine), "StatefulSet");
    assert_eq!(sts["spec"]["template"]["spec"]["securityContext"]["runAsUser"], 70);
}

#[test]
fn rw_service_selects_the_primary_and_ro_every_member() {
    let p = plan(&tk::cr("PostgresCluster", "pg", spec()));
    let services = tk::find_all(&p, "Service");
    let names: Vec<&str> = services.iter().map(|s| s["metadata"]["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["pg-headless", "pg-rw", "pg-ro"]);
    assert_eq!(services[0]["spec"]["clusterIP"], "None");
    assert_eq!(services[1]["spec"]["selector"]["statefulset.kubernetes.io/pod-name"], "pg-0");
    assert!(services[2]["spec"]["selector"]["statefulset.kubernetes.io/pod-name"].is_null());
    assert_eq!(tk::extra(&p)["currentPrimary"], "pg-0");
    assert_eq!(tk::extra(&p)["plugin"], "postgres@0.1.0");
    let secret = p.actions.iter().find_map(|a| match a {
        Action::EnsureSecret(s) => Some(s.clone()),
        _ => None,
    });
    assert_eq!(secret.unwrap().keys, vec![("password".to_string(), 24)]);
}

#[test]
fn forbidden_parameters_and_major_version_changes_are_refused() {
    let mut cr = tk::cr("PostgresCluster", "pg", spec());
    cr["spec"]["parameters"] = json!({ "port": "5433", "max_connections": "5", "shared_buffers": "1XB" });
    let errs = Postgres::validate(&cr.to_string(), None);
    let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["spec.parameters.max_connections", "spec.parameters.port", "spec.parameters.shared_buffers"]);
    assert!(errs[1].message.contains("managed by the operator"));

    let old = tk::cr("PostgresCluster", "pg", spec());
    let mut up = old.clone();
    up["spec"]["version"] = json!("18");
    let errs = Postgres::validate(&up.to_string(), Some(&old.to_string()));
    assert_eq!(errs.len(), 1);
    assert!(errs[0].message.contains("pg_upgrade"));
    let mut down = old.clone();
    down["spec"]["version"] = json!("16.4");
    let errs = Postgres::validate(&down.to_string(), Some(&old.to_string()));
    assert_eq!(errs[0].path, "spec.version");
    let mut minor = old.clone();
    minor["spec"]["version"] = json!("17.4");
    assert!(Postgres::validate(&minor.to_string(), Some(&old.to_string())).is_empty());
}

mod roundtrip {
    use proptest::prelude::*;
    use serde_json::{json, Map, Value};
    use stateward_sdk::Service;

    use super::Postgres;

    fn quantity() -> impl Strategy<Value = String> {
        (1u32..1000, prop::sample::select(vec!["Mi", "Gi", "Ti", ""])).prop_map(|(n, u)| format!("{n}{u}"))
    }

    fn v1_spec() -> impl Strategy<Value = Value> {
        (
            "[0-9]{1,2}(\\.[0-9]{1,2})?",
            1i64..=50,
            prop::option::of("[a-z]{1,8}(/[a-z]{1,8})?:[0-9]{1,3}"),
            prop::option::of(quantity()),
            prop::option::of("[a-z][a-z0-9-]{0,12}"),
            prop::option::of(prop::sample::select(vec!["Retain", "Delete"])),
            prop::option::of(any::<bool>()),
            prop::collection::btree_map("[a-z_]{1,10}", "[a-zA-Z0-9]{0,8}", 0..4),
            prop::option::of(quantity()),
        )
            .prop_map(|(version, replicas, image, size, class, retention, dp, params, cpu)| {
                let mut s = Map::new();
                s.insert("version".into(), json!(version));
                s.insert("replicas".into(), json!(replicas));
                if let Some(i) = image { s.insert("image".into(), json!(i)); }
                let mut st = Map::new();
                if let Some(z) = size { st.insert("size".into(), json!(z)); }
                if let Some(c) = class { st.insert("className".into(), json!(c)); }
                s.insert("storage".into(), Value::Object(st));
                if let Some(r) = retention { s.insert("retentionPolicy".into(), json!(r)); }
                if let Some(d) = dp { s.insert("deletionProtection".into(), json!(d)); }
                if !params.is_empty() { s.insert("parameters".into(), json!(params)); }
                if let Some(c) = cpu { s.insert("resources".into(), json!({ "limits": { "cpu": c } })); }
                Value::Object(s)
            })
    }

    fn object(version: &str, spec: Value, annotations: Option<Value>, phase: Option<&str>) -> Value {
        let mut o = json!({
            "apiVersion": format!("stateward.dev/{version}"),
            "kind": "PostgresCluster",
            "metadata": { "name": "pg", "namespace": "db", "generation": 4 },
            "spec": spec,
        });
        if let Some(a) = annotations { o["metadata"]["annotations"] = a; }
        if let Some(p) = phase { o["status"] = json!({ "phase": p, "readyReplicas": 2 }); }
        o
    }

    fn annotations() -> impl Strategy<Value = Option<Value>> {
        prop::option::of(prop::collection::btree_map("[a-z]{1,6}\\.io/[a-z]{1,6}", "[a-z ]{0,6}", 1..3).prop_map(|m| json!(m)))
    }

    proptest! {
        #[test]
        fn v1_to_v1alpha1_and_back_is_lossless(spec in v1_spec(), ann in annotations(), phase in prop::option::of("(Running|Pending)")) {
            let original = object("v1", spec, ann, phase.as_deref());
            let alpha = Postgres::convert(&original.to_string(), "v1alpha1").unwrap();
            let a: Value = serde_json::from_str(&alpha).unwrap();
            prop_assert!(a["spec"]["storage"].is_null());
            prop_assert!(a["spec"]["deletionProtection"].is_null());
            let back: Value = serde_json::from_str(&Postgres::convert(&alpha, "v1").unwrap()).unwrap();
            prop_assert_eq!(back, original);
        }

        #[test]
        fn v1alpha1_to_v1_and_back_is_lossless(spec in v1_spec(), ann in annotations()) {
            // A v1alpha1 object: flat storage fields, no deletionProtection.
            let mut s = spec;
            let storage = s.as_object_mut().unwrap().remove("storage").unwrap();
            s.as_object_mut().unwrap().remove("deletionProtection");
            if let Some(z) = storage.get("size") { s["storageSize"] = z.clone(); }
            if let Some(c) = storage.get("className") { s["storageClassName"] = c.clone(); }
            let original = object("v1alpha1", s, ann, None);
            let v1 = Postgres::convert(&original.to_string(), "v1").unwrap();
            let v: Value = serde_json::from_str(&v1).unwrap();
            prop_assert!(v["spec"]["storage"].is_object());
            let back: Value = serde_json::from_str(&Postgres::convert(&v1, "v1alpha1").unwrap()).unwrap();
            prop_assert_eq!(back, original);
        }
    }
}
