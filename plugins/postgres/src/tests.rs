#![allow(clippy::unwrap_used, clippy::panic)]

use serde_json::{json, Value};
use stateward_sdk::testkit as tk;
use stateward_sdk::{Action, Service};

use super::Postgres;

fn spec() -> Value {
    json!({ "version": "15", "replicas": 3, "storage": { "size": "10Gi" } })
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
    let hash =
        |s: &Value| s["spec"]["template"]["metadata"]["annotations"]["stateward.dev/config-hash"].clone();
    assert_ne!(hash(&sts), hash(&before), "a parameter change must roll the pods");
}

#[test]
fn container_runs_the_entry_script_with_the_generated_config_and_pg_isready() {
    let p = plan(&tk::cr("PostgresCluster", "pg", spec()));
    let sts = tk::find(&p, "StatefulSet");
    let c = &sts["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "postgres:15");
    // The image's entrypoint is bypassed: the same start on upstream and Debian-package images.
    assert_eq!(c["command"], json!(["sh", "/etc/stateward/entrypoint.sh"]));
    assert!(c["args"].is_null());
    for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
        let cmd = c[probe]["exec"]["command"][2].as_str().unwrap();
        assert!(cmd.starts_with("pg_isready --host=127.0.0.1 --port=5432"), "{probe}: {cmd}");
        assert!(c[probe]["timeoutSeconds"].as_i64().unwrap() >= 5, "{probe}");
    }
    assert_eq!(c["securityContext"]["runAsUser"], 999);
    let pw = c["env"].as_array().unwrap().iter().find(|e| e["name"] == "POSTGRES_PASSWORD").unwrap();
    assert_eq!(pw["valueFrom"]["secretKeyRef"], json!({ "name": "pg-credentials", "key": "password" }));
    assert_eq!(sts["spec"]["podManagementPolicy"], "OrderedReady");
    let mut alpine = tk::cr("PostgresCluster", "pg", spec());
    alpine["spec"]["version"] = json!("16-alpine");
    let sts = tk::find(&plan(&alpine), "StatefulSet");
    assert_eq!(sts["spec"]["template"]["spec"]["securityContext"]["runAsUser"], 70);
    // spec.image picks another image; nothing else about the pod changes.
    let mut local = tk::cr("PostgresCluster", "pg", spec());
    local["spec"]["image"] = json!("localhost/stateward/postgres:15");
    let other = tk::find(&plan(&local), "StatefulSet");
    let oc = &other["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(oc["image"], "localhost/stateward/postgres:15");
    assert_eq!(oc["command"], c["command"]);
    assert_eq!(oc["env"], c["env"]);
}

#[test]
fn the_config_map_holds_the_entry_script_and_pg_hba() {
    let p = plan(&tk::cr("PostgresCluster", "pg", spec()));
    let data = &tk::find(&p, "ConfigMap")["data"];
    let keys: Vec<&str> = data.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, ["entrypoint.sh", "pg_hba.conf", "postgresql.conf"]);
    let conf = data["postgresql.conf"].as_str().unwrap();
    for line in [
        "unix_socket_directories = '/var/run/postgresql'",
        "unix_socket_permissions = 0700",
        "hba_file = '/var/lib/postgresql/data/pg_hba.conf'",
    ] {
        assert!(conf.lines().any(|l| l == line), "missing {line:?} in\n{conf}");
    }
    let hba: Vec<Vec<&str>> = data["pg_hba.conf"]
        .as_str()
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        hba,
        [
            vec!["local", "all", "all", "trust"],
            vec!["host", "replication", "streaming_replica", "@MEMBERS@", "scram-sha-256"],
            vec!["host", "all", "all", "all", "scram-sha-256"],
        ]
    );
    let script = data["entrypoint.sh"].as_str().unwrap();
    for part in [
        "initdb --pgdata=\"$scratch\" --username=postgres --pwfile=\"$pwfile\"",
        "--auth-host=scram-sha-256 --data-checksums",
        "exec postgres -D \"$PGDATA\" -c config_file=\"$here/postgresql.conf\"",
        "-c primary_slot_name=\"$slot\" \"$@\"",
        "pg_rewind --target-pgdata=\"$PGDATA\"",
        "pg_basebackup --pgdata=\"$scratch\" --host=\"$rw\"",
    ] {
        assert!(script.contains(part), "missing {part:?} in\n{script}");
    }
    assert!(!script.contains("--pwfile=/dev/stdin") && !script.contains("-W"), "password by file only");
    // The script is part of the pods' configuration: a change to it rolls them.
    let hash = |p: &stateward_sdk::Plan| {
        tk::find(p, "StatefulSet")["spec"]["template"]["metadata"]["annotations"]["stateward.dev/config-hash"]
            .clone()
    };
    let mut other = tk::cr("PostgresCluster", "pg2", spec());
    other["metadata"]["name"] = json!("pg2");
    assert_ne!(hash(&p), hash(&plan(&other)), "the files name their cluster, so the hash differs");
}

#[test]
fn services_select_on_the_role_labels_the_plugin_sets() {
    let p = plan(&tk::cr("PostgresCluster", "pg", spec()));
    let services = tk::find_all(&p, "Service");
    let names: Vec<&str> = services.iter().map(|s| s["metadata"]["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["pg-headless", "pg-rw", "pg-ro", "pg-r"]);
    assert_eq!(services[0]["spec"]["clusterIP"], "None");
    let role = |s: &Value| s["spec"]["selector"]["stateward.dev/role"].clone();
    assert_eq!(role(&services[1]), "primary");
    assert_eq!(role(&services[2]), "replica");
    assert!(role(&services[3]).is_null(), "-r: any ready instance");
    for s in &services {
        assert!(s["spec"]["selector"]["statefulset.kubernetes.io/pod-name"].is_null(), "never by ordinal");
    }
    // No primary is assumed: none is current until a server answers as one.
    assert_eq!(tk::extra(&p)["currentPrimary"], "");
    assert_eq!(tk::extra(&p)["targetPrimary"], "pg-0");
    assert_eq!(tk::extra(&p)["plugin"], "postgres@0.1.0");
    let secret = p.actions.iter().find_map(|a| match a {
        Action::EnsureSecret(s) if s.name == "pg-credentials" => Some(s.clone()),
        _ => None,
    });
    assert_eq!(
        secret.unwrap().keys,
        vec![("password".to_string(), 24), ("replication-password".to_string(), 24)]
    );
}

#[test]
fn forbidden_parameters_and_major_version_changes_are_refused() {
    let mut cr = tk::cr("PostgresCluster", "pg", spec());
    cr["spec"]["parameters"] = json!({ "port": "5433", "max_connections": "5", "shared_buffers": "1XB" });
    let errs = Postgres::validate(&cr.to_string(), None);
    let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        ["spec.parameters.max_connections", "spec.parameters.port", "spec.parameters.shared_buffers"]
    );
    assert!(errs[1].message.contains("managed by the operator"));

    let old = tk::cr("PostgresCluster", "pg", spec());
    let mut up = old.clone();
    up["spec"]["version"] = json!("16");
    let errs = Postgres::validate(&up.to_string(), Some(&old.to_string()));
    assert_eq!(errs.len(), 1);
    assert!(errs[0].message.contains("pg_upgrade"));
    let mut down = old.clone();
    down["spec"]["version"] = json!("14.9");
    let errs = Postgres::validate(&down.to_string(), Some(&old.to_string()));
    assert_eq!(errs[0].path, "spec.version");
    let mut minor = old.clone();
    minor["spec"]["version"] = json!("15.8");
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
                if let Some(i) = image {
                    s.insert("image".into(), json!(i));
                }
                let mut st = Map::new();
                if let Some(z) = size {
                    st.insert("size".into(), json!(z));
                }
                if let Some(c) = class {
                    st.insert("className".into(), json!(c));
                }
                s.insert("storage".into(), Value::Object(st));
                if let Some(r) = retention {
                    s.insert("retentionPolicy".into(), json!(r));
                }
                if let Some(d) = dp {
                    s.insert("deletionProtection".into(), json!(d));
                }
                if !params.is_empty() {
                    s.insert("parameters".into(), json!(params));
                }
                if let Some(c) = cpu {
                    s.insert("resources".into(), json!({ "limits": { "cpu": c } }));
                }
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
        if let Some(a) = annotations {
            o["metadata"]["annotations"] = a;
        }
        if let Some(p) = phase {
            o["status"] = json!({ "phase": p, "readyReplicas": 2 });
        }
        o
    }

    fn annotations() -> impl Strategy<Value = Option<Value>> {
        prop::option::of(
            prop::collection::btree_map("[a-z]{1,6}\\.io/[a-z]{1,6}", "[a-z ]{0,6}", 1..3)
                .prop_map(|m| json!(m)),
        )
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

// --- the running servers (WIT 0.2 requests) ------------------------------------------------

fn running_pod(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "namespace": "default", "uid": format!("uid-{name}-0000"),
                      "labels": { "stateward.dev/instance": "pg" } },
        "status": {
            "conditions": [{ "type": "Ready", "status": "True" }],
            "containerStatuses": [{ "name": "postgres", "state": { "running": {} }, "restartCount": 0 }],
        },
    })
}

/// The poll id of a pod made by [`running_pod`].
fn stats_id(pod: &str) -> String {
    format!("stats-{pod}-{}-r0", &format!("uid-{pod}-0000")[..8])
}

fn answered(id: &str, stdout: &str) -> stateward_sdk::Response {
    stateward_sdk::Response { id: id.into(), code: Some(0), stdout: stdout.into(), ..Default::default() }
}

fn live_plan(cr: &Value, pods: &[&str], responses: Vec<stateward_sdk::Response>) -> stateward_sdk::Plan {
    let children: Vec<Value> = pods.iter().map(|p| running_pod(p)).collect();
    let mut observed = tk::observed(cr, &children);
    observed.responses = responses;
    Postgres::reconcile(observed).unwrap()
}

fn polls(plan: &stateward_sdk::Plan) -> Vec<(String, String)> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            Action::Exec(e) => Some((e.id.clone(), e.pod.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn every_running_instance_is_polled_with_psql_and_the_plan_is_deterministic() {
    let cr = tk::cr("PostgresCluster", "pg", spec());
    let first = live_plan(&cr, &["pg-0", "pg-1"], Vec::new());
    assert_eq!(polls(&first), [(stats_id("pg-0"), "pg-0".into()), (stats_id("pg-1"), "pg-1".into())]);
    let Some(Action::Exec(e)) = first.actions.iter().find(|a| matches!(a, Action::Exec(_))) else {
        unreachable!()
    };
    assert_eq!(e.command[0], "psql");
    assert_eq!(e.mode, stateward_sdk::RequestMode::EveryMs(super::live::POLL_MS));
    // The target primary's poll also keeps the slots of the others.
    assert!(e.command.iter().any(|c| c.contains("pg_create_physical_replication_slot")), "{:?}", e.command);
    assert_eq!(first, live_plan(&cr, &["pg-0", "pg-1"], Vec::new()), "same input, same plan");
    assert_eq!(first.requeue_after_ms, Some(super::live::POLL_MS), "the next poll needs a reconcile");
    // No pod, nothing to ask: a cluster without pods plans no request.
    assert!(polls(&live_plan(&cr, &[], Vec::new())).is_empty());
}

const PRIMARY: &str = "f|7|100|0/3000148|0/3000148|1||pg-1:streaming:async:0\n";
const STANDBY: &str = "t|2|100|0/3000148|0/3000000|1|streaming|\n";

#[test]
fn the_answers_become_each_instances_role_and_state_in_status_never_readings() {
    let cr = tk::cr("PostgresCluster", "pg", spec());
    let p = live_plan(
        &cr,
        &["pg-0", "pg-1"],
        vec![answered(&stats_id("pg-0"), PRIMARY), answered(&stats_id("pg-1"), STANDBY)],
    );
    let instances = tk::extra(&p)["instances"].clone();
    assert_eq!(
        instances[0],
        json!({"pod": "pg-0", "role": "primary", "maxConnections": 100, "timeline": 1,
               "standbys": [{"name": "pg-1", "state": "streaming", "syncState": "async"}]})
    );
    assert_eq!(
        instances[1],
        json!({"pod": "pg-1", "role": "replica", "maxConnections": 100, "timeline": 1, "streaming": true})
    );
    // An idle server's next answer (WAL moved on, another connection, some lag): the same
    // status, so nothing is written.
    let busier_primary = "f|9|100|0/3000200|0/3000200|1||pg-1:streaming:async:184\n";
    let busier_standby = "t|3|100|0/3000200|0/3000148|1|streaming|\n";
    let again = live_plan(
        &cr,
        &["pg-0", "pg-1"],
        vec![answered(&stats_id("pg-0"), busier_primary), answered(&stats_id("pg-1"), busier_standby)],
    );
    assert_eq!(tk::extra(&again)["instances"], instances, "readings changed the status");
    assert_eq!(tk::condition(&p, "ServiceHealthy").0, "True");
    assert_eq!(tk::extra(&p)["currentPrimary"], "pg-0", "confirmed by its answer");
    assert_eq!(tk::extra(&p)["currentPrimaryUID"], "uid-pg-0-0000");
    assert_eq!(tk::extra(&p)["timeline"], 1);
    // A failed request is shown as such, not as a role.
    let failed =
        stateward_sdk::Response { id: stats_id("pg-0"), error: Some("timeout".into()), ..Default::default() };
    let p = live_plan(&cr, &["pg-0"], vec![failed]);
    assert_eq!(tk::extra(&p)["instances"][0], json!({"pod": "pg-0", "error": "timeout"}));
}

#[test]
fn connections_over_95_percent_three_times_in_a_row_warn_and_clear_when_they_drop() {
    let mut cr = tk::cr("PostgresCluster", "pg", spec());
    let mut reasons = Vec::new();
    let mut warnings = 0;
    for stdout in [
        "f|24|25|0/1|0/1|1||",
        "f|24|25|0/1|0/1|1||",
        "f|24|25|0/1|0/1|1||",
        "f|24|25|0/1|0/1|1||",
        "f|3|25|0/1|0/1|1||",
    ] {
        let p = live_plan(&cr, &["pg-0"], vec![answered(&stats_id("pg-0"), stdout)]);
        let (status, reason) = tk::condition(&p, "ServiceHealthy");
        reasons.push(format!("{status}/{reason}"));
        warnings += p.events.iter().filter(|e| e.reason == "ConnectionsNearLimit").count();
        // The host writes the status back; the next reconcile reads it.
        let mut status = tk::extra(&p);
        status["conditions"] =
            json!([{ "type": "ServiceHealthy", "status": status_word(&p), "reason": reason }]);
        cr["status"] = status;
    }
    assert_eq!(
        reasons,
        [
            "True/ChecksPassing",
            "True/ChecksPassing",
            "False/ConnectionsNearLimit",
            "False/ConnectionsNearLimit",
            "True/ChecksPassing"
        ]
    );
    assert_eq!(warnings, 1, "one Warning when the check starts firing, not one per reconcile");
}

#[test]
fn the_plugin_rolls_its_pods_itself_and_a_roll_ends_when_every_pod_is_on_the_new_revision() {
    let cr = tk::with_phase(tk::cr("PostgresCluster", "pg", spec()), "Running");
    let p = plan(&cr);
    let sts = tk::find(&p, "StatefulSet");
    assert_eq!(sts["spec"]["updateStrategy"], json!({ "type": "OnDelete" }));
    // Under OnDelete the StatefulSet controller leaves currentRevision behind: the pods tell.
    let phase = |updated: i64| {
        let children = tk::with_sts_status(&tk::applied(&p), 3, 3, updated, ("r1", "r2"));
        Postgres::reconcile(tk::observed(&cr, &children)).unwrap().status.phase
    };
    assert_eq!(phase(2), stateward_sdk::Phase::Upgrading);
    assert_eq!(phase(3), stateward_sdk::Phase::Running);
    // The last outdated pod deleted by the roll and not made again yet: 2 pods, both updated.
    // Mid-roll that is still the roll (it read as Scaling, and the kwok lifecycle test saw
    // Upgrading → Scaling → Running); outside a roll a missing pod is what it was before.
    let missing_one = |phase: &str| {
        let cr = tk::with_phase(tk::cr("PostgresCluster", "pg", spec()), phase);
        let children = tk::with_sts_status(&tk::applied(&p), 2, 2, 2, ("r1", "r2"));
        Postgres::reconcile(tk::observed(&cr, &children)).unwrap().status.phase
    };
    assert_eq!(missing_one("Upgrading"), stateward_sdk::Phase::Upgrading);
    assert_eq!(missing_one("Running"), stateward_sdk::Phase::Scaling);
}

fn status_word(p: &stateward_sdk::Plan) -> String {
    tk::condition(p, "ServiceHealthy").0
}

mod app;
mod ha;

/// `STATEWARD_DUMP_DIR=dir cargo test -p stateward-postgres dump_config_files`: the ConfigMap's
/// files of a three-member cluster `pg`, for running the scripts by hand.
#[test]
fn dump_config_files() {
    let Some(dir) = std::env::var_os("STATEWARD_DUMP_DIR") else { return };
    let p = plan(&tk::cr("PostgresCluster", "pg", spec()));
    let cm = tk::find(&p, "ConfigMap");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, text) in cm["data"].as_object().unwrap() {
        std::fs::write(std::path::Path::new(&dir).join(name), text.as_str().unwrap()).unwrap();
    }
}

/// Fencing stops a server taking writes: read-only by default and its client sessions ended,
/// asked once per poll answer that still shows it writable; a server not fenced that answers
/// read-only gets the setting back; the ids name the answer, so a request that failed is asked
/// again after the next one.
#[test]
fn a_fenced_server_is_made_read_only_and_an_unfenced_one_writable_again() {
    let mut cr = tk::cr("PostgresCluster", "pg", spec());
    let writes = |p: &stateward_sdk::Plan| -> Vec<(String, String)> {
        p.actions
            .iter()
            .filter_map(|a| match a {
                Action::Exec(e) if e.id.starts_with("fence-") || e.id.starts_with("unfence-") => {
                    Some((e.id.clone(), e.command.join(" ")))
                }
                _ => None,
            })
            .collect()
    };
    let read_only = |stdout: &str| format!("{}|on", stdout.trim_end());
    let at = |mut r: stateward_sdk::Response, ms: u64| {
        r.started_at_ms = ms;
        r
    };
    let answers = |primary: &str, standby: &str, ms: u64| {
        vec![at(answered(&stats_id("pg-0"), primary), ms), at(answered(&stats_id("pg-1"), standby), ms)]
    };
    // Not fenced, writable (and an answer of an earlier build, without the field): nothing.
    assert_eq!(writes(&live_plan(&cr, &["pg-0", "pg-1"], answers(PRIMARY, STANDBY, 5))), []);
    cr["metadata"]["annotations"] = json!({ "stateward.dev/fenced-instances": "[\"pg-0\"]" });
    let p = live_plan(&cr, &["pg-0", "pg-1"], answers(&format!("{}|off", PRIMARY.trim_end()), STANDBY, 5));
    let w = writes(&p);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].0.starts_with("fence-pg-0-") && w[0].0.ends_with("-5"), "{w:?}");
    assert!(
        w[0].1.contains("default_transaction_read_only = on") && w[0].1.contains("pg_terminate_backend"),
        "{w:?}"
    );
    // Read-only now: nothing more.
    assert_eq!(writes(&live_plan(&cr, &["pg-0", "pg-1"], answers(&read_only(PRIMARY), STANDBY, 7))), []);
    // Unfenced: the setting goes back, on whichever server still has it.
    cr["metadata"]["annotations"] = json!({});
    let p = live_plan(&cr, &["pg-0", "pg-1"], answers(&read_only(PRIMARY), &read_only(STANDBY), 9));
    let w = writes(&p);
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(
        w.iter()
            .all(|(id, c)| id.starts_with("unfence-") && c.contains("RESET default_transaction_read_only")),
        "{w:?}"
    );
}
