//! The real-pods cluster (`tests/cluster/up --real`): real containers on a real kubelet, and
//! the operator's behaviour that only a kubelet shows. One cluster is shared by every test of
//! the run (a namespace each); each test body runs inside the cluster's network namespace
//! (`RealPods::enter` re-executes this binary there), the only place pod and Service addresses
//! may be reached. One module per service (`postgres/`, `redis/`, `elasticsearch.rs`) and per
//! concern of the operator's own (`in_cluster`, `lifecycle`, `requests`, `least_privilege`).
//!
//! `cargo test -p stateward --test realpods -- --nocapture` prints what each test measured.

#![allow(clippy::panic, clippy::expect_used)]

#[path = "../e2e/mod.rs"]
mod e2e;
mod elasticsearch;
mod in_cluster;
mod least_privilege;
mod lifecycle;
mod postgres;
mod redis;
mod requests;
#[path = "../support/mod.rs"]
mod support;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use e2e::{condition, get_cr, phase, summary, wait_for, Operator, OperatorOpts, POSTGRES, REDIS};
use k8s_openapi::api::core::v1::Pod;
use kube::core::DynamicObject;
use kube::Api;
use serde_json::{json, Value};
use stateward_testkit::real::{client_pod, RealPods, Weight};
use stateward_testkit::TestEnv;

/// The images `tests/cluster/images` builds and `up --real` imports.
const PG_IMAGE: &str = "localhost/stateward/postgres:15";
const REDIS_IMAGE: &str = "localhost/stateward/redis:7.0";
const OPENSEARCH_IMAGE: &str = "localhost/stateward/opensearch:2.19";

/// kubectl in the test's namespace.
fn kubectl_in(env: &TestEnv, args: &[&str]) -> Output {
    env.kubectl_output(&[&["-n", env.namespace.as_str()], args].concat(), None).expect("run kubectl")
}

fn kubectl_ok(env: &TestEnv, args: &[&str]) -> String {
    let out = kubectl_in(env, args);
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn apply_json(env: &TestEnv, objects: &[Value]) {
    let list = json!({ "apiVersion": "v1", "kind": "List", "items": objects });
    let out = e2e::kubectl_stdin(env, &["apply", "-n", &env.namespace, "-f", "-"], &list.to_string());
    assert!(out.status.success(), "apply failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// Waits until the pod is Ready; returns how long it took.
async fn pod_ready(env: &TestEnv, name: &str, timeout: Duration) -> Duration {
    let pods: Api<Pod> = env.api();
    let (_, took) = wait_for(&format!("pod {name} Ready"), timeout, || {
        let pods = pods.clone();
        async move {
            let p = pods.get_opt(name).await.map_err(|e| e.to_string())?.ok_or("no pod")?;
            let st = p.status.unwrap_or_default();
            let ready =
                st.conditions.unwrap_or_default().iter().any(|c| c.type_ == "Ready" && c.status == "True");
            if ready {
                Ok(())
            } else {
                Err(format!("phase {:?}, containers {:?}", st.phase, st.container_statuses))
            }
        }
    })
    .await;
    took
}

/// A PostgreSQL server pod (the local image, initdb on start), its ClusterIP Service, and a
/// client pod of the same image.
fn pg_server_objects(name: &str) -> Vec<Value> {
    let script = "set -e\n\
        export PGDATA=/var/lib/postgresql/data/pgdata\n\
        if [ ! -s \"$PGDATA/PG_VERSION\" ]; then\n\
          initdb --username=postgres --auth-local=trust --auth-host=trust >/dev/null\n\
          echo \"host all all 0.0.0.0/0 trust\" >> \"$PGDATA/pg_hba.conf\"\n\
        fi\n\
        exec postgres -c listen_addresses='*' -c unix_socket_directories=/var/run/postgresql\n";
    vec![
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": name, "labels": { "app": name } },
            "spec": {
                "securityContext": { "runAsUser": 999, "runAsGroup": 999, "fsGroup": 999, "runAsNonRoot": true },
                "containers": [{
                    "name": "postgres", "image": PG_IMAGE, "imagePullPolicy": "Never",
                    "command": ["sh", "-c", script],
                    "ports": [{ "name": "postgres", "containerPort": 5432 }],
                    "readinessProbe": {
                        "exec": { "command": ["pg_isready", "--host=127.0.0.1", "--port=5432", "--timeout=4"] },
                        "periodSeconds": 2, "timeoutSeconds": 5,
                    },
                    "volumeMounts": [{ "name": "data", "mountPath": "/var/lib/postgresql/data" }],
                }],
                "volumes": [{ "name": "data", "emptyDir": {} }],
            }
        }),
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": { "name": name },
            "spec": { "selector": { "app": name }, "ports": [{ "port": 5432, "targetPort": "postgres" }] }
        }),
        client_pod(&format!("{name}-client"), PG_IMAGE, 999, json!([])),
    ]
}

#[tokio::test]
async fn postgres_pod_answers_through_its_service_dns_name() {
    let Some(env) = RealPods::enter(Weight::Light, "rp-pg").await.expect("real-pods cluster") else {
        return;
    };
    let started = Instant::now();
    apply_json(&env, &pg_server_objects("db"));
    let ready = pod_ready(&env, "db", Duration::from_secs(120)).await;
    pod_ready(&env, "db-client", Duration::from_secs(60)).await;
    eprintln!("realpods: postgres pod Ready {:.1?} after create", ready);

    // From another pod, by the Service's DNS name, through kube-proxy and CoreDNS.
    let host = format!("db.{}.svc.cluster.local", env.namespace);
    let (answer, took) = wait_for("select 1 through the Service", Duration::from_secs(30), || {
        let out = kubectl_in(
            &env,
            &["exec", "db-client", "--", "psql", "-h", &host, "-U", "postgres", "-tAc", "select 1"],
        );
        let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        async move {
            if out.status.success() {
                Ok(text)
            } else {
                Err(err)
            }
        }
    })
    .await;
    assert_eq!(answer, "1");
    eprintln!("realpods: select 1 via {host} answered after {took:.1?} (total {:.1?})", started.elapsed());

    // The server is a real process in the container: exec sees it, logs show its start.
    let ps = kubectl_ok(&env, &["exec", "db", "--", "sh", "-c", "cat /proc/1/cmdline | tr '\\0' ' '"]);
    assert!(ps.starts_with("postgres "), "PID 1 of the container is not postgres: {ps}");
    let logs = kubectl_ok(&env, &["logs", "db"]);
    assert!(logs.contains("database system is ready to accept connections"), "logs: {logs}");
}

#[tokio::test]
async fn statefulset_data_survives_pod_deletion() {
    let Some(env) = RealPods::enter(Weight::Light, "rp-sts").await.expect("real-pods cluster") else {
        return;
    };
    apply_json(
        &env,
        &[json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": { "name": "keep" },
            "spec": {
                "serviceName": "keep", "replicas": 1,
                "selector": { "matchLabels": { "app": "keep" } },
                "template": {
                    "metadata": { "labels": { "app": "keep" } },
                    "spec": {
                        "securityContext": { "runAsUser": 999, "runAsGroup": 999, "fsGroup": 999 },
                        "terminationGracePeriodSeconds": 1,
                        "containers": [{
                            "name": "redis", "image": REDIS_IMAGE, "imagePullPolicy": "Never",
                            "command": ["redis-server", "--dir", "/data", "--appendonly", "yes", "--save", ""],
                            "readinessProbe": {
                                "exec": { "command": ["redis-cli", "ping"] }, "periodSeconds": 2, "timeoutSeconds": 5,
                            },
                            "volumeMounts": [{ "name": "data", "mountPath": "/data" }],
                        }],
                    }
                },
                "volumeClaimTemplates": [{
                    "metadata": { "name": "data" },
                    "spec": { "accessModes": ["ReadWriteOnce"], "storageClassName": "local",
                              "resources": { "requests": { "storage": "1Gi" } } }
                }],
            }
        })],
    );
    pod_ready(&env, "keep-0", Duration::from_secs(120)).await;
    let pods: Api<Pod> = env.api();
    let first_uid = pods.get("keep-0").await.expect("pod").metadata.uid;
    assert_eq!(
        kubectl_ok(&env, &["exec", "keep-0", "--", "redis-cli", "set", "marker", "kept"]).trim(),
        "OK"
    );
    let written = kubectl_ok(
        &env,
        &["exec", "keep-0", "--", "sh", "-c", "echo on-disk > /data/marker.txt && sync && echo done"],
    );
    assert_eq!(written.trim(), "done");

    kubectl_ok(&env, &["delete", "pod", "keep-0", "--wait=true"]);
    let started = Instant::now();
    wait_for("a new keep-0", Duration::from_secs(60), || {
        let pods = pods.clone();
        let first = first_uid.clone();
        async move {
            let p = pods.get_opt("keep-0").await.map_err(|e| e.to_string())?.ok_or("no pod")?;
            if p.metadata.uid == first {
                Err("still the old pod".into())
            } else {
                Ok(())
            }
        }
    })
    .await;
    pod_ready(&env, "keep-0", Duration::from_secs(120)).await;
    eprintln!("realpods: replacement pod Ready {:.1?} after the delete", started.elapsed());
    assert_eq!(kubectl_ok(&env, &["exec", "keep-0", "--", "cat", "/data/marker.txt"]).trim(), "on-disk");
    assert_eq!(kubectl_ok(&env, &["exec", "keep-0", "--", "redis-cli", "get", "marker"]).trim(), "kept");
}

/// A single-node OpenSearch (the Elasticsearch-compatible image) with its settings from a
/// mounted `opensearch.yml`, its Service, and a client pod of the same image (it has curl).
fn opensearch_objects(name: &str) -> Vec<Value> {
    // Disk watermarks off: the test node's disk may be fuller than a production one.
    let config = "cluster.name: realpods\n\
        network.host: 0.0.0.0\n\
        discovery.type: single-node\n\
        cluster.routing.allocation.disk.threshold_enabled: false\n";
    vec![
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": format!("{name}-config") },
            "data": { "opensearch.yml": config }
        }),
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": name, "labels": { "app": name } },
            "spec": {
                "securityContext": { "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000, "runAsNonRoot": true },
                "containers": [{
                    "name": "opensearch", "image": OPENSEARCH_IMAGE, "imagePullPolicy": "Never",
                    "env": [{ "name": "OPENSEARCH_JAVA_OPTS", "value": "-Xms256m -Xmx256m" }],
                    "ports": [{ "name": "http", "containerPort": 9200 }, { "name": "transport", "containerPort": 9300 }],
                    "readinessProbe": {
                        "exec": { "command": ["curl", "-fsS", "--max-time", "4",
                            "http://127.0.0.1:9200/_cluster/health?wait_for_status=yellow&timeout=3s"] },
                        "periodSeconds": 2, "timeoutSeconds": 5,
                    },
                    "volumeMounts": [
                        { "name": "config", "mountPath": "/usr/share/opensearch/config/opensearch.yml", "subPath": "opensearch.yml" },
                        { "name": "data", "mountPath": "/usr/share/opensearch/data" },
                    ],
                }],
                "volumes": [
                    { "name": "config", "configMap": { "name": format!("{name}-config") } },
                    { "name": "data", "emptyDir": {} },
                ],
            }
        }),
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": { "name": name },
            "spec": { "selector": { "app": name }, "ports": [{ "name": "http", "port": 9200, "targetPort": "http" }] }
        }),
        client_pod(&format!("{name}-client"), OPENSEARCH_IMAGE, 1000, json!([])),
    ]
}

#[tokio::test]
async fn opensearch_pod_is_green_and_serves_a_document_through_its_service() {
    let Some(env) = RealPods::enter(Weight::Heavy, "rp-os").await.expect("real-pods cluster") else {
        return;
    };
    apply_json(&env, &opensearch_objects("search"));
    let ready = pod_ready(&env, "search", Duration::from_secs(240)).await;
    pod_ready(&env, "search-client", Duration::from_secs(60)).await;
    eprintln!("realpods: opensearch pod Ready {ready:.1?} after create");

    // From the client pod, by the Service's DNS name: a request returns the body curl printed.
    let base = format!("http://search.{}.svc.cluster.local:9200", env.namespace);
    let curl = |args: &[&str]| {
        let mut full = vec!["exec", "search-client", "--", "curl", "-sS", "-f", "--max-time", "20"];
        full.extend_from_slice(args);
        let out = kubectl_in(&env, &full);
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
        }
    };
    let health_url = format!("{base}/_cluster/health");
    let (health, took) = wait_for("cluster health through the Service", Duration::from_secs(60), || {
        let answer = curl(&[&health_url]);
        async move { answer }
    })
    .await;
    let health: Value = serde_json::from_str(&health).expect("health is JSON");
    assert_eq!(health["status"], "green", "health: {health}");
    assert_eq!(health["number_of_nodes"], 1, "health: {health}");
    assert_eq!(health["cluster_name"], "realpods", "the mounted opensearch.yml was not read: {health}");
    eprintln!("realpods: _cluster/health via {base} green after {took:.1?}");

    // An index without replicas (one node), a document written and read back.
    let json_header = "Content-Type: application/json";
    curl(&[
        "-X",
        "PUT",
        "-H",
        json_header,
        &format!("{base}/notes"),
        "-d",
        r#"{"settings":{"number_of_shards":1,"number_of_replicas":0}}"#,
    ])
    .expect("create index");
    let written = curl(&[
        "-X",
        "PUT",
        "-H",
        json_header,
        &format!("{base}/notes/_doc/1?refresh=true"),
        "-d",
        r#"{"text":"kept by opensearch"}"#,
    ])
    .expect("index a document");
    let written: Value = serde_json::from_str(&written).expect("JSON");
    assert_eq!(written["result"], "created", "{written}");
    let read: Value =
        serde_json::from_str(&curl(&[&format!("{base}/notes/_doc/1")]).expect("get")).expect("JSON");
    assert_eq!(read["found"], true, "{read}");
    assert_eq!(read["_source"]["text"], "kept by opensearch", "{read}");
    let health: Value = serde_json::from_str(
        &curl(&[&format!("{health_url}?wait_for_status=green&timeout=10s")]).expect("health"),
    )
    .expect("JSON");
    assert_eq!(health["status"], "green", "with the index: {health}");
    let nodes = curl(&[&format!("{base}/_cat/nodes?h=name,node.role")]).expect("_cat/nodes");
    assert!(nodes.trim_start().starts_with("search "), "_cat/nodes: {nodes}");

    // PID 1 of the container is the JVM, as the image's user, with the heap asked for.
    let cmdline = kubectl_ok(&env, &["exec", "search", "--", "sh", "-c", "tr '\\0' ' ' </proc/1/cmdline"]);
    assert!(cmdline.contains("org.opensearch.bootstrap.OpenSearch"), "PID 1: {cmdline}");
    assert!(cmdline.contains("-Xmx256m"), "OPENSEARCH_JAVA_OPTS not applied: {cmdline}");
    let status = kubectl_ok(&env, &["exec", "search", "--", "cat", "/proc/1/status"]);
    let field = |key: &str| {
        status.lines().find_map(|l| l.strip_prefix(key)).map(str::trim).unwrap_or_default().to_owned()
    };
    assert!(field("Uid:").starts_with("1000"), "PID 1 runs as {}", field("Uid:"));
    eprintln!("realpods: opensearch JVM RSS {} (heap 256m)", field("VmRSS:"));
    let logs = kubectl_ok(&env, &["logs", "search"]);
    assert!(logs.contains("loaded module [transport-netty4]"), "logs: {logs}");
}

/// The shipped policies, with the local images' registry allowed (the guardrails' registry
/// allow-list is policy data: an administrator adds registries the same way).
fn policies_allowing_local_images() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(stateward_testkit::unique_name("realpods-policies"));
    std::fs::create_dir_all(&dir).expect("policy dir");
    let src = e2e::workspace_root().join("policies");
    for entry in std::fs::read_dir(&src).expect("policies") {
        let path = entry.expect("entry").path();
        if path.is_file() {
            std::fs::copy(&path, dir.join(path.file_name().expect("name"))).expect("copy policy");
        }
    }
    let data_path = dir.join("data.json");
    let mut data: Value =
        serde_json::from_slice(&std::fs::read(&data_path).expect("data.json")).expect("json");
    let registries = data
        .pointer_mut("/stateward/config/guardrails/allowed_registries")
        .and_then(Value::as_array_mut)
        .expect("allowed_registries in policies/data.json");
    registries.push(json!("localhost/stateward/"));
    std::fs::write(&data_path, serde_json::to_vec_pretty(&data).expect("json")).expect("write data.json");
    dir
}

/// The operator's kubeconfig in every real-pods test: the account `stateward` of the test's
/// namespace, bound only to the roles deploy/ ships (e2e::account) and, for the test fixture's
/// own kind (no shipped role names it), a Role of its own. So RBAC refuses the operator what
/// the shipped roles do not grant, and `least_privilege` reads what it used from the audit log.
fn operator_kubeconfig(env: &TestEnv) -> std::path::PathBuf {
    let fixture_role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "stateward-test-fixture"},
        "rules": [{
            "apiGroups": [least_privilege::FIXTURE_GROUP],
            "resources": ["hostilethings", "hostilethings/status"],
            "verbs": ["list", "watch", "patch"],
        }],
    });
    let fixture_binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "stateward-test-fixture"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "stateward-test-fixture"},
        "subjects": [{"kind": "ServiceAccount", "name": e2e::account::ACCOUNT, "namespace": env.namespace}],
    });
    let roles = [e2e::account::NAMESPACED_ROLES, e2e::account::WEBHOOK_ROLES].concat();
    e2e::account::bind(env, &roles, &[fixture_role, fixture_binding], |_| {})
        .unwrap_or_else(|e| panic!("the operator's account: {e:#}"));
    let path = std::env::temp_dir().join(format!("{}-operator.kubeconfig", env.namespace));
    e2e::account::kubeconfig(env, &path).unwrap_or_else(|e| panic!("the operator's kubeconfig: {e:#}"));
    path
}

/// The operator inside the namespace, with its webhooks on loopback (the service certificates
/// PostgreSQL and Redis start with come from its CA).
fn start_operator(env: &TestEnv, name: &str) -> Operator {
    start_operator_with(env, name, None, None, &[])
}

/// [`start_operator`] with the plugins of `plugin_dir` instead of the built ones, the
/// policies of `policy_dir` instead of the shipped ones allowing the local images, and `args`
/// added to `stateward run`'s.
fn start_operator_with(
    env: &TestEnv,
    name: &str,
    plugin_dir: Option<std::path::PathBuf>,
    policy_dir: Option<std::path::PathBuf>,
    args: &[&str],
) -> Operator {
    let port = e2e::free_port();
    Operator::start_with(
        env,
        name,
        OperatorOpts {
            namespace: env.namespace.clone(),
            lease_namespace: env.namespace.clone(),
            policy_dir: Some(policy_dir.unwrap_or_else(policies_allowing_local_images)),
            plugin_dir,
            kubeconfig: Some(operator_kubeconfig(env)),
            webhook_args: vec![
                "--webhook-addr".into(),
                format!("127.0.0.1:{port}"),
                "--webhook-url".into(),
                format!("https://127.0.0.1:{port}"),
                "--webhook-configuration".into(),
                format!("stateward-{}", env.namespace),
                "--webhook-configure".into(),
                "none".into(),
            ],
            args: args.iter().map(|a| (*a).to_string()).collect(),
            ..Default::default()
        },
    )
}

/// The sample of `kind` with a local image and the version it carries.
fn sample(kind: &str, name: &str, image: &str, replicas: u32) -> Value {
    let sample_file = match kind {
        "PostgresCluster" => "postgres.yaml",
        _ => "redis.yaml",
    };
    let text = std::fs::read_to_string(e2e::workspace_root().join("deploy/samples").join(sample_file))
        .expect("sample");
    let mut cr: Value = yaml_serde::from_str(&text).expect("sample yaml");
    cr["metadata"]["name"] = json!(name);
    cr["spec"]["image"] = json!(image);
    cr["spec"]["version"] = json!(image.rsplit(':').next().expect("tag"));
    cr["spec"]["replicas"] = json!(replicas);
    cr["spec"]["deletionProtection"] = json!(false);
    cr["spec"]["retentionPolicy"] = json!("Delete");
    cr
}

/// Every pod of the instance Running and Ready on the real node.
async fn pods_ready_on_real_node(env: &TestEnv, instance: &str, count: usize) -> Result<(), String> {
    let pods: Api<Pod> = env.api();
    let list = pods
        .list(&kube::api::ListParams::default().labels(&format!("{}={instance}", e2e::INSTANCE_LABEL)))
        .await
        .map_err(|e| e.to_string())?;
    let ready: Vec<_> = list
        .items
        .iter()
        .filter(|p| {
            let st = p.status.clone().unwrap_or_default();
            st.phase.as_deref() == Some("Running")
                && st.conditions.unwrap_or_default().iter().any(|c| c.type_ == "Ready" && c.status == "True")
                && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("real-0")
        })
        .collect();
    if ready.len() == count {
        Ok(())
    } else {
        Err(format!("{} of {count} pods Running and Ready on real-0", ready.len()))
    }
}

/// Running, Available and not Degraded: every member ready again.
async fn wait_converged(env: &TestEnv, kind: e2e::Kind, name: &str, timeout: Duration) {
    let api = kind.api(env);
    wait_for(&format!("{} {name} converged", kind.kind), timeout, || {
        let api = api.clone();
        async move {
            let cr = get_cr(&api, name).await.ok_or("CR not found")?;
            if phase(&cr) == "Running"
                && condition(&cr, "Available") == Some("True")
                && condition(&cr, "Degraded") == Some("False")
            {
                Ok(())
            } else {
                Err(summary(&cr))
            }
        }
    })
    .await;
}

/// Milliseconds since the epoch, the clock the client pods' samplers write too.
fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The condition `type_` of the resource, whole (Null when it has none).
fn condition_object(cr: &Value, type_: &str) -> Value {
    cr.pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .cloned()
        .unwrap_or(Value::Null)
}

/// Asserts that the first sample taken at or after `at_ms` counts `want` (`what` says what is
/// counted); when the samples first counted it (ms since the epoch).
fn assert_sampled_at(samples: &[(u64, i64)], at_ms: u64, want: i64, what: &str) -> Option<u64> {
    let at = samples.iter().find(|(t, _)| *t >= at_ms);
    assert!(
        at.is_some_and(|(_, n)| *n == want),
        "Available or Running while not {what}: the sample at or after it says {at:?}; samples {samples:?}"
    );
    samples.iter().find(|(_, n)| *n >= want).map(|s| s.0)
}

/// A loop in the client pod that writes `<ms since the epoch> <count>` every 200 ms, `count`
/// being what a shell command prints (-1 when it prints nothing): the test's own view of the
/// servers, to hold a resource's conditions against.
struct ClientSampler {
    pid: String,
}

impl ClientSampler {
    /// Starts `count` (a command for `sh -c '…'`: no single quote unescaped; spaced inside `$( … )`
    /// so that one starting with a subshell is not read as `$((` arithmetic) in the pod `client`.
    fn start(env: &TestEnv, count: &str) -> Self {
        let script = format!(
            "nohup sh -c 'while :; do t=$(date +%s%3N); n=$( {count} ); echo \"$t ${{n:--1}}\"; sleep 0.2; done' \
             >/tmp/samples 2>/dev/null </dev/null & echo $!"
        );
        let pid = kubectl_ok(env, &["exec", "client", "--", "sh", "-c", &script]).trim().to_string();
        Self { pid }
    }

    fn samples(env: &TestEnv) -> Vec<(u64, i64)> {
        kubectl_ok(env, &["exec", "client", "--", "cat", "/tmp/samples"])
            .lines()
            .filter_map(|l| {
                let (t, n) = l.split_once(' ')?;
                Some((t.parse().ok()?, n.trim().parse().ok()?))
            })
            .collect()
    }

    /// Stops once a sample taken at or after `at_ms` is in; every sample, the first of them
    /// from before `at_ms` (asserted: the sampler saw the time before it).
    async fn stop_after(self, env: &TestEnv, at_ms: u64) -> Vec<(u64, i64)> {
        let mut seen = Self::samples(env);
        for _ in 0..50 {
            if seen.iter().any(|(t, _)| *t >= at_ms) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            seen = Self::samples(env);
        }
        // Gone already is fine here: the samples say whether it ran past `at_ms`.
        kubectl_ok(
            env,
            &["exec", "client", "--", "sh", "-c", &format!("kill {} 2>/dev/null; true", self.pid)],
        );
        let first = seen.first().map_or(u64::MAX, |s| s.0);
        assert!(first < at_ms, "the sampler ran from before {at_ms} (first sample {first}): {seen:?}");
        seen
    }
}

/// Reads the resource every 200 ms, as a user's `kubectl wait` would, until it is first
/// Available or Running; then (ms since the epoch) and the resource as read.
async fn first_available(env: &TestEnv, kind: e2e::Kind, name: &str, timeout: Duration) -> (u64, Value) {
    let api = kind.api(env);
    let started = Instant::now();
    loop {
        if let Some(cr) = get_cr(&api, name).await {
            if condition(&cr, "Available") == Some("True") || phase(&cr) == "Running" {
                return (now_ms(), cr);
            }
            assert!(started.elapsed() < timeout, "{name} not Available within {timeout:?}: {}", summary(&cr));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the test's own client counts while a new resource forms ([`available_only_when`]).
struct Promised<'a> {
    /// A shell command printing the count (for [`ClientSampler::start`]).
    count: &'a str,
    /// The count once the promised redundancy exists.
    want: i64,
    /// What it counts, for the messages.
    what: &'a str,
    /// The report figure of the time from create to Available.
    figure: &'a str,
}

/// [redundancy] must show 1: the resource `name` was applied at `created_ms` beside the client
/// pod `client`; from before it could be Available, the client counts `p.count` every 200 ms
/// while the test reads the resource every 200 ms, as `kubectl wait` would. The first time it
/// is Available or Running, the count is `p.want` (the first sample at or after that moment)
/// and `Redundant` is True. Returns when it was first Available and when the client first
/// counted `p.want` (ms since the epoch), and the resource as read then.
async fn available_only_when(
    env: &TestEnv,
    kind: e2e::Kind,
    name: &str,
    created_ms: u64,
    timeout: Duration,
    p: Promised<'_>,
) -> (u64, Option<u64>, Value) {
    pod_ready(env, "client", Duration::from_secs(120)).await;
    let sampler = ClientSampler::start(env, p.count);
    let (available_ms, cr) = first_available(env, kind, name, timeout).await;
    let seen = sampler.stop_after(env, available_ms).await;
    let counted_ms = assert_sampled_at(&seen, available_ms, p.want, p.what);
    eprintln!(
        "realpods: {name}: Available {} ms after create, {} {:?} ms after create",
        available_ms - created_ms,
        p.what,
        counted_ms.map(|c| c.saturating_sub(created_ms))
    );
    assert_eq!(condition(&cr, "Redundant"), Some("True"), "{}", summary(&cr));
    stateward_testkit::report::seconds(p.figure, Duration::from_millis(available_ms - created_ms), None);
    (available_ms, counted_ms, cr)
}

/// How long [`idle`] watches: one period of the audit's repetition flush (60 s).
const IDLE_WINDOW: Duration = Duration::from_secs(60);

/// [agent]'s steady state: the converged resource `name` of `kind` watched for
/// [`IDLE_WINDOW`] with nothing happening, its figures named `<prefix>.idle.*`. Reported per minute against that issue's targets:
/// status writes and Events (0), audit records and bytes (10 KB). Asserted: the cluster stays
/// Available and Redundant, and the operator's audit log (its counted repetitions included)
/// verifies.
pub async fn idle(env: &TestEnv, kind: e2e::Kind, name: &str, op: &e2e::Operator, prefix: &str) {
    use futures::StreamExt as _;
    let api = kind.api(env);
    // Settled first: the last step's own writes are not the steady state's.
    redundant_again(env, kind, name, Duration::from_secs(120)).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let rv = get_cr(&api, name).await.expect("CR")["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or("0")
        .to_string();
    let audit_bytes = || std::fs::metadata(&op.audit).map_or(0, |m| m.len());
    let audit_lines = || std::fs::read_to_string(&op.audit).map_or(0, |t| t.lines().count());
    let (bytes_before, lines_before) = (audit_bytes(), audit_lines());
    let started = jiff::Timestamp::now();
    // Every write of the resource (status included) is a MODIFIED of a watch from here.
    let params = kube::api::WatchParams::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(IDLE_WINDOW.as_secs() as u32);
    let writes = api.watch(&params, &rv).await.expect("watch the resource");
    let writes = tokio::time::timeout(IDLE_WINDOW + Duration::from_secs(5), async move {
        let mut writes = std::pin::pin!(writes);
        let mut n = 0u64;
        while let Some(e) = writes.next().await {
            if matches!(e, Ok(kube::api::WatchEvent::Modified(_))) {
                n += 1;
            }
        }
        n
    })
    .await
    .unwrap_or_else(|_| panic!("the watch did not end after its {IDLE_WINDOW:?} timeout"));
    let (bytes, lines) =
        (audit_bytes().saturating_sub(bytes_before), audit_lines().saturating_sub(lines_before));
    let posted = postgres::events_of(env, name)
        .await
        .into_iter()
        .filter(|e| {
            let last =
                e.series.as_ref().map(|s| s.last_observed_time.0).or(e.event_time.as_ref().map(|t| t.0));
            last.is_some_and(|t| t.as_second() >= started.as_second())
        })
        .count();
    let per_minute = |n: f64| n * 60.0 / IDLE_WINDOW.as_secs_f64();
    eprintln!(
        "realpods-{prefix}: idle {IDLE_WINDOW:?}: {writes} writes of {name}, {posted} Events, {lines} audit records, {bytes} audit bytes"
    );
    // What those records were, to tell where the rest of the audit's steady state comes from.
    let mut kinds: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    let text = std::fs::read_to_string(&op.audit).unwrap_or_default();
    for line in text.lines().skip(lines_before) {
        let r: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
        let s = |p: &str| r.pointer(p).and_then(serde_json::Value::as_str).unwrap_or("").to_string();
        let what = if let Some(rows) = r.pointer("/input/repeated/rows").and_then(serde_json::Value::as_array)
        {
            format!("repetitions of {} decisions", rows.len())
        } else if let Some(id) = r.pointer("/result/outcome/id").and_then(serde_json::Value::as_str) {
            format!("outcome {}", id.split('-').next().unwrap_or(id))
        } else {
            format!("{} {} {}", s("/path"), s("/input/action/verb"), s("/input/action/object/kind"))
        };
        *kinds.entry(what).or_default() += 1;
    }
    eprintln!("realpods-{prefix}: idle audit records by kind: {kinds:?}");
    use stateward_testkit::report::{figure, Target};
    figure(
        &format!("{prefix}.idle.status_writes_per_minute"),
        per_minute(writes as f64),
        "writes",
        Target::AtMost(0.0),
    );
    figure(
        &format!("{prefix}.idle.events_per_minute"),
        per_minute(posted as f64),
        "events",
        Target::AtMost(0.0),
    );
    figure(
        &format!("{prefix}.idle.audit_records_per_minute"),
        per_minute(lines as f64),
        "records",
        Target::None,
    );
    figure(
        &format!("{prefix}.idle.audit_bytes_per_minute"),
        per_minute(bytes as f64),
        "bytes",
        Target::AtMost(10_240.0),
    );
    let cr = get_cr(&api, name).await.expect("CR");
    assert_eq!(e2e::condition(&cr, "Available"), Some("True"), "{}", cr["status"]);
    assert_eq!(e2e::condition(&cr, "Redundant"), Some("True"), "{}", cr["status"]);
    let report = stateward::policy::audit::verify(&op.audit).expect("read the audit log");
    assert_eq!(report.first_break, None, "the operator's audit log verifies");
}

/// Waits until the resource `name` says `Redundant` True; how long that took.
async fn redundant_again(env: &TestEnv, kind: e2e::Kind, name: &str, timeout: Duration) -> Duration {
    let api = kind.api(env);
    let (_, took) = wait_for(&format!("{name} Redundant True"), timeout, || {
        let api = api.clone();
        async move {
            let cr = get_cr(&api, name).await.ok_or("CR not found")?;
            match condition(&cr, "Redundant") {
                Some("True") => Ok(()),
                _ => Err(summary(&cr)),
            }
        }
    })
    .await;
    took
}

/// [redundancy] must show 3: once the resource `name` is Redundant, the pod `pod` holding a
/// copy of it is deleted (`--grace-period=0`); `Redundant` turns False naming it while `Available` stays True, and
/// True again once its copy is back. Reports `<figure>.redundant_false_after` and
/// `<figure>.redundant_again_after`.
async fn copy_lost(env: &TestEnv, kind: e2e::Kind, name: &str, pod: &str, figure: &str) {
    // Redundant first: a step before may leave a copy still catching up (a former primary
    // after a failover), and the False verdict would then name that one.
    redundant_again(env, kind, name, Duration::from_secs(180)).await;
    let watch = RedundantWatch::start(env, kind, name);
    let fault_ms = now_ms();
    kubectl_ok(env, &["delete", "pod", pod, "--grace-period=0", "--force", "--wait=false"]);
    let api = kind.api(env);
    let (_, back) =
        wait_for(&format!("{name} Redundant False, then True again"), Duration::from_secs(180), || {
            let (api, seen) = (api.clone(), watch.seen());
            async move {
                let lacked = seen.iter().position(|(_, status, _)| status == "False");
                match lacked.and_then(|i| seen[i..].iter().find(|(_, status, _)| status == "True")) {
                    Some(_) => Ok(()),
                    None => Err(format!(
                        "{seen:?}; now {}",
                        summary(&get_cr(&api, name).await.ok_or("CR not found")?)
                    )),
                }
            }
        })
        .await;
    let seen = watch.stop();
    let cr = get_cr(&api, name).await.expect("CR");
    eprintln!("realpods: {name}: {pod} deleted; Redundant verdicts {seen:?}; True again {back:.1?} after");
    let first_false = seen.iter().find(|(_, status, _)| status == "False").expect("a False verdict");
    assert!(first_false.2.contains(pod), "the False verdict names the lost copy {pod}: {first_false:?}");
    assert_eq!(
        condition(&cr, "Available"),
        Some("True"),
        "the service answered throughout: {}",
        summary(&cr)
    );
    redundant_false_after(&format!("{figure}.redundant_false_after"), first_false.0.saturating_sub(fault_ms));
    stateward_testkit::report::seconds(&format!("{figure}.redundant_again_after"), back, None);
}

/// Reports how long `Redundant` took to turn False after a copy was lost: two polls (2 s each)
/// as the target. The test fails only past 30 s, a liveness ceiling: the verdict waits for the
/// operator's next poll answers, and on a loaded 2-core machine three tests at once measured
/// 6.8 and 8.2 s, so three times the target would fail on load, not on a missing verdict.
fn redundant_false_after(name: &str, ms: u64) {
    stateward_testkit::report::millis(name, ms, 2 * 2_000);
    assert!(ms <= 30_000, "{name}: {ms} ms, past the 30 s liveness ceiling");
}

/// A task recording a resource's `Redundant` condition every 200 ms: (ms since the epoch,
/// status, message), each change once.
struct RedundantWatch {
    seen: std::sync::Arc<std::sync::Mutex<Vec<(u64, String, String)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl RedundantWatch {
    fn start(env: &TestEnv, kind: e2e::Kind, name: &str) -> Self {
        let seen: std::sync::Arc<std::sync::Mutex<Vec<(u64, String, String)>>> = Default::default();
        let (api, name, log) = (kind.api(env), name.to_string(), seen.clone());
        let task = tokio::spawn(async move {
            loop {
                if let Some(cr) = get_cr(&api, &name).await {
                    let c = condition_object(&cr, "Redundant");
                    let status = c["status"].as_str().unwrap_or_default().to_string();
                    let message = c["message"].as_str().unwrap_or_default().to_string();
                    if let Ok(mut seen) = log.lock() {
                        if seen.last().is_none_or(|(_, s, m)| *s != status || *m != message) {
                            seen.push((now_ms(), status, message));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Self { seen, task }
    }

    /// What it has seen so far.
    fn seen(&self) -> Vec<(u64, String, String)> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Stops watching; everything it saw.
    fn stop(self) -> Vec<(u64, String, String)> {
        self.task.abort();
        self.seen()
    }
}

async fn wait_available(env: &TestEnv, kind: e2e::Kind, name: &str, timeout: Duration) -> Duration {
    let api = kind.api(env);
    let (_, took) = wait_for(&format!("{} {name} Available", kind.kind), timeout, || {
        let api = api.clone();
        async move {
            let cr = get_cr(&api, name).await.ok_or("CR not found")?;
            if phase(&cr) == "Running" && condition(&cr, "Available") == Some("True") {
                Ok(())
            } else {
                Err(summary(&cr))
            }
        }
    })
    .await;
    took
}

#[tokio::test]
async fn samples_start_real_servers_and_the_cr_follows_the_pods() {
    let Some(env) = RealPods::enter(Weight::Medium, "rp-samples").await.expect("real-pods cluster") else {
        return;
    };
    // Both contracts side by side: PostgreSQL and Elasticsearch as built (stateward:plugin@0.2.0),
    // Redis as the 0.1.0 build kept as a fixture.
    let plugins = e2e::tempdir::Dir::new("samples-plugins");
    for p in ["postgres", "elasticsearch"] {
        std::fs::copy(e2e::plugin_dir().join(format!("{p}.wasm")), plugins.0.join(format!("{p}.wasm")))
            .expect("copy plugin");
    }
    std::fs::copy(
        e2e::workspace_root().join("tests/fixtures/contract-0.1/redis.wasm"),
        plugins.0.join("redis.wasm"),
    )
    .expect("copy the 0.1.0 fixture");
    let mut op = start_operator_with(&env, "realpods", Some(plugins.0.clone()), None, &[]);
    op.wait_ready(Duration::from_secs(60)).await;
    let started = Instant::now();
    e2e::apply(&env, &env.namespace, &sample("PostgresCluster", "pg", PG_IMAGE, 2));
    e2e::apply(&env, &env.namespace, &sample("RedisCluster", "cache", REDIS_IMAGE, 2));
    wait_available(&env, POSTGRES, "pg", Duration::from_secs(240)).await;
    let pg = started.elapsed();
    wait_available(&env, REDIS, "cache", Duration::from_secs(240)).await;
    let redis = started.elapsed();
    for (instance, n) in [("pg", 2), ("cache", 2)] {
        wait_for(&format!("{instance} pods ready on the real node"), Duration::from_secs(60), || {
            pods_ready_on_real_node(&env, instance, n)
        })
        .await;
    }
    eprintln!(
        "realpods: samples Available on real pods after create: PostgreSQL at {pg:.1?}, Redis at {redis:.1?}"
    );
    stateward_testkit::report::seconds(
        "samples.postgres.available_after_create",
        pg,
        Some(Duration::from_secs(60)),
    );
    stateward_testkit::report::seconds(
        "samples.redis.available_after_create",
        redis,
        Some(Duration::from_secs(60)),
    );
    // The StatefulSet was created with its certificate in place: its pod template never
    // changed, so no pod restarted for the certificate (they used to start on placeholder bytes
    // and roll once it was issued).
    let sets: Api<k8s_openapi::api::apps::v1::StatefulSet> = env.api();
    let pg_set = sets.get("pg").await.expect("pg StatefulSet");
    let stamped = pg_set
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.annotations.as_ref())
        .is_some_and(|a| a.contains_key("stateward.dev/certificates-sha256"));
    assert!(stamped && pg_set.metadata.generation == Some(1), "pg StatefulSet: {:?}", pg_set.metadata);
    // The 0.2.0 plugin reads its servers; the 0.1.0 one serves as it always did, asking nothing.
    let pg_api = POSTGRES.api(&env);
    wait_for("pg status.instances read from both servers", Duration::from_secs(60), || {
        let api = pg_api.clone();
        async move {
            let cr = get_cr(&api, "pg").await.ok_or("CR not found")?;
            let roles: Vec<&str> = cr
                .pointer("/status/instances")
                .and_then(Value::as_array)
                .map(|i| i.iter().filter_map(|i| i["role"].as_str()).collect())
                .unwrap_or_default();
            if roles.len() == 2 {
                Ok(())
            } else {
                Err(summary(&cr))
            }
        }
    })
    .await;
    let cache = get_cr(&REDIS.api(&env), "cache").await.expect("redis CR");
    assert!(cache.pointer("/status/instances").is_none(), "the 0.1.0 plugin asks nothing: {cache}");
    // Real servers answer inside their pods.
    let one = kubectl_ok(&env, &["exec", "pg-0", "--", "psql", "-U", "postgres", "-tAc", "select 1"]);
    assert_eq!(one.trim(), "1");
    let pong = kubectl_ok(
        &env,
        &[
            "exec",
            "cache-0",
            "--",
            "sh",
            "-c",
            "REDISCLI_AUTH=\"$REDIS_PASSWORD\" redis-cli -h 127.0.0.1 ping",
        ],
    );
    assert_eq!(pong.trim(), "PONG");

    // A container that exits is restarted by the kubelet, and the CR shows it meanwhile.
    let pods: Api<Pod> = env.api();
    let restarts = |p: &Pod| {
        p.status.as_ref().and_then(|s| s.container_statuses.as_ref()).map_or(0, |c| c[0].restart_count)
    };
    let before = restarts(&pods.get("cache-1").await.expect("pod"));
    let api = REDIS.api(&env);
    let killed = Instant::now();
    kubectl_ok(&env, &["exec", "cache-1", "--", "sh", "-c", "kill 1"]);
    let (degraded, _) =
        wait_for("RedisCluster cache Degraded while cache-1 restarts", Duration::from_secs(60), || {
            let api = api.clone();
            async move {
                let cr = get_cr(&api, "cache").await.ok_or("CR not found")?;
                if condition(&cr, "Degraded") == Some("True") {
                    Ok(summary(&cr))
                } else {
                    Err(summary(&cr))
                }
            }
        })
        .await;
    eprintln!("realpods: container exit → CR Degraded after {:.1?}: {degraded}", killed.elapsed());
    wait_for("cache-1 restarted", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move {
            let p = pods.get("cache-1").await.map_err(|e| e.to_string())?;
            if restarts(&p) > before {
                Ok(())
            } else {
                Err(format!("restarts {}", restarts(&p)))
            }
        }
    })
    .await;
    wait_converged(&env, REDIS, "cache", Duration::from_secs(120)).await;
    eprintln!(
        "realpods: container restarted by the kubelet, CR converged again {:.1?} after the exit",
        killed.elapsed()
    );

    // Failing readiness probes turn the CR not Available (no member ready); it recovers with them.
    for pod in ["cache-0", "cache-1"] {
        kubectl_ok(
            &env,
            &["exec", pod, "--", "sh", "-c", "REDISCLI_AUTH=\"$REDIS_PASSWORD\" redis-cli -h 127.0.0.1 config set requirepass wrong-on-purpose"],
        );
    }
    let broke = Instant::now();
    let (_, took) = wait_for("RedisCluster cache not Available", Duration::from_secs(90), || {
        let api = api.clone();
        async move {
            let cr = get_cr(&api, "cache").await.ok_or("CR not found")?;
            if condition(&cr, "Available") == Some("False") {
                Ok(())
            } else {
                Err(summary(&cr))
            }
        }
    })
    .await;
    eprintln!("realpods: readiness failing → Available False after {took:.1?}");
    for pod in ["cache-0", "cache-1"] {
        kubectl_ok(
            &env,
            &["exec", pod, "--", "sh", "-c", "REDISCLI_AUTH=wrong-on-purpose redis-cli -h 127.0.0.1 config set requirepass \"$REDIS_PASSWORD\""],
        );
    }
    wait_converged(&env, REDIS, "cache", Duration::from_secs(120)).await;
    eprintln!("realpods: probe passing again → Available {:.1?} after it broke", broke.elapsed());
    drop(op);
}

/// Warning Events of `reason` on the custom resource `name`.
async fn warnings(env: &TestEnv, name: &str, reason: &str) -> Vec<String> {
    let events: Api<k8s_openapi::api::events::v1::Event> = env.api();
    let list = events.list(&kube::api::ListParams::default()).await.map(|l| l.items).unwrap_or_default();
    list.into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter(|e| e.reason.as_deref() == Some(reason) && e.type_.as_deref() == Some("Warning"))
        .map(|e| e.note.unwrap_or_default())
        .collect()
}

/// The `ServiceHealthy` condition of `name` as "status/reason".
async fn service_health(api: &Api<DynamicObject>, name: &str) -> Result<String, String> {
    let cr = get_cr(api, name).await.ok_or("CR not found")?;
    let c = cr
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == "ServiceHealthy"))
        .ok_or_else(|| summary(&cr))?;
    Ok(format!("{}/{}", c["status"].as_str().unwrap_or(""), c["reason"].as_str().unwrap_or("")))
}

/// The seed's custom health checks, which no probe sees, from the running servers through the
/// operator's exec requests: each instance's role and connections in status; PostgreSQL with
/// idle connections held above 95 % of max_connections and Redis filled above 90 % of a small
/// maxmemory each turn a Warning Event and a ServiceHealthy=False condition whose reason comes
/// from the answers, while every pod stays Ready; both clear when the load goes.
#[tokio::test]
async fn health_checks_read_from_the_running_servers() {
    let Some(env) = RealPods::enter(Weight::Medium, "rp-health").await.expect("real-pods cluster") else {
        return;
    };
    let mut op = start_operator(&env, "realpods-health");
    op.wait_ready(Duration::from_secs(60)).await;
    let mut pg = sample("PostgresCluster", "pgh", PG_IMAGE, 1);
    pg["spec"]["parameters"] = json!({ "max_connections": "25" });
    let mut redis = sample("RedisCluster", "rh", REDIS_IMAGE, 1);
    redis["spec"]["parameters"] = json!({ "maxmemory": "4mb" });
    e2e::apply(&env, &env.namespace, &pg);
    e2e::apply(&env, &env.namespace, &redis);
    wait_available(&env, POSTGRES, "pgh", Duration::from_secs(240)).await;
    wait_available(&env, REDIS, "rh", Duration::from_secs(240)).await;

    // Each instance's role and settings, as its server answered (state, never readings that
    // change while it idles).
    let (pg_api, redis_api) = (POSTGRES.api(&env), REDIS.api(&env));
    let asked = Instant::now();
    let (instance, took) = wait_for("pgh status.instances from psql", Duration::from_secs(60), || {
        let api = pg_api.clone();
        async move {
            let cr = get_cr(&api, "pgh").await.ok_or("CR not found")?;
            let i = cr.pointer("/status/instances/0").cloned().ok_or_else(|| summary(&cr))?;
            if i["role"] == "primary" && i["maxConnections"].as_u64().is_some() {
                Ok(i)
            } else {
                Err(i.to_string())
            }
        }
    })
    .await;
    assert_eq!(instance["pod"], "pgh-0");
    assert_eq!(instance["maxConnections"], 25, "read from the server, which got it from spec.parameters");
    eprintln!("realpods: PostgreSQL status from the server after {took:.1?}: {instance}");
    let (instance, _) = wait_for("rh status.instances from redis-cli", Duration::from_secs(60), || {
        let api = redis_api.clone();
        async move {
            let cr = get_cr(&api, "rh").await.ok_or("CR not found")?;
            let i = cr.pointer("/status/instances/0").cloned().ok_or_else(|| summary(&cr))?;
            if i["role"] == "master" && i["maxmemoryBytes"] == 4 * 1024 * 1024 {
                Ok(i)
            } else {
                Err(i.to_string())
            }
        }
    })
    .await;
    eprintln!("realpods: Redis status from the server after {:.1?}: {instance}", asked.elapsed());

    // Load: 23 idle sessions of 25 (+ the check's own = 96 %), and Redis filled to its 4 MB
    // maxmemory in 100 KB values (one 3 MB SET is refused: its query buffer counts against the
    // limit; past the limit the last ones are refused, noeviction).
    let mut sleepers = env
        .kubectl()
        .args(["-n", &env.namespace, "exec", "pgh-0", "--", "sh", "-c"])
        .arg("for i in $(seq 23); do psql -U postgres -c 'select pg_sleep(600)' >/dev/null 2>&1 & done; wait")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the idle sessions");
    kubectl_ok(
        &env,
        &[
            "exec",
            "rh-0",
            "--",
            "sh",
            "-c",
            "for i in $(seq 36); do head -c 100000 /dev/zero | tr '\\0' a | redis-cli --no-auth-warning -h 127.0.0.1 -x set filler$i >/dev/null; done",
        ],
    );
    let loaded = Instant::now();
    for (api, name, reason) in
        [(&pg_api, "pgh", "ConnectionsNearLimit"), (&redis_api, "rh", "MemoryNearLimit")]
    {
        let (health, took) =
            wait_for(&format!("{name} ServiceHealthy False/{reason}"), Duration::from_secs(120), || {
                let api = api.clone();
                async move {
                    let h = service_health(&api, name).await?;
                    if h == format!("False/{reason}") {
                        Ok(h)
                    } else {
                        Err(h)
                    }
                }
            })
            .await;
        let (notes, _) = wait_for(&format!("{name} Warning {reason}"), Duration::from_secs(30), || async {
            let found = warnings(&env, name, reason).await;
            if found.is_empty() {
                Err("no Warning yet".to_string())
            } else {
                Ok(found)
            }
        })
        .await;
        let cr = get_cr(api, name).await.expect("CR");
        assert_eq!(
            condition(&cr, "Available"),
            Some("True"),
            "{name}: the pods stay Ready: {}",
            summary(&cr)
        );
        eprintln!("realpods: {name} {health} after {took:.1?} of load (Warning: {})", notes[0]);
    }
    for (instance, n) in [("pgh", 1), ("rh", 1)] {
        pods_ready_on_real_node(&env, instance, n).await.expect("every pod still Ready under the load");
    }
    eprintln!("realpods: both checks fired {:.1?} after the load began", loaded.elapsed());

    // The load goes; the checks clear.
    let _ = sleepers.kill();
    let _ = sleepers.wait();
    kubectl_ok(
        &env,
        &["exec", "pgh-0", "--", "psql", "-U", "postgres", "-tAc",
          "select count(pg_terminate_backend(pid)) from pg_stat_activity where query like 'select pg_sleep%' and pid <> pg_backend_pid()"],
    );
    kubectl_ok(
        &env,
        &[
            "exec",
            "rh-0",
            "--",
            "sh",
            "-c",
            "for i in $(seq 36); do redis-cli --no-auth-warning -h 127.0.0.1 del filler$i >/dev/null; done",
        ],
    );
    let unloaded = Instant::now();
    for (api, name) in [(&pg_api, "pgh"), (&redis_api, "rh")] {
        wait_for(&format!("{name} ServiceHealthy True again"), Duration::from_secs(90), || {
            let api = api.clone();
            async move {
                let h = service_health(&api, name).await?;
                if h.starts_with("True/") {
                    Ok(())
                } else {
                    Err(h)
                }
            }
        })
        .await;
    }
    eprintln!("realpods: both checks cleared {:.1?} after the load went", unloaded.elapsed());
    drop(op);
}

/// The hostile test fixture as the operator's only plugin, its CRD installed, with policies
/// allowing it and the programs `commands` in the pods of its own instances: the plugin
/// directory and the policy directory to start the operator with.
fn hostile_setup(env: &TestEnv, commands: &[&str]) -> (e2e::tempdir::Dir, std::path::PathBuf) {
    let plugins = e2e::tempdir::Dir::new("hostile-plugins");
    std::fs::copy(support::wasm("fixture-hostile"), plugins.0.join("hostile.wasm")).expect("copy fixture");
    let crds = Command::new(env!("CARGO_BIN_EXE_stateward"))
        .args(["crds", "--plugin-dir"])
        .arg(&plugins.0)
        .output()
        .expect("stateward crds");
    assert!(crds.status.success(), "{}", String::from_utf8_lossy(&crds.stderr));
    let out = e2e::kubectl_stdin(
        env,
        &["apply", "--server-side", "-f", "-"],
        &String::from_utf8_lossy(&crds.stdout),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    if let Err(e) =
        stateward_testkit::wait_established(env.kubeconfig(), &["hostilethings.test.stateward.dev"])
    {
        panic!("{e:#}");
    }
    let policies = policies_allowing_local_images();
    let data_path = policies.join("data.json");
    let mut data: Value = serde_json::from_slice(&std::fs::read(&data_path).expect("data")).expect("json");
    data["stateward"]["config"]["plugins"]["allowed"]["hostile"] = json!({"digests": []});
    data["stateward"]["config"]["guardrails"]["exec_commands"]["hostile"] = json!(commands);
    std::fs::write(&data_path, data.to_string()).expect("write data");
    (plugins, policies)
}

/// Creates (or changes) the HostileThing `name` with `spec`.
fn apply_hostile(env: &TestEnv, name: &str, spec: Value) {
    let object = json!({"apiVersion": "test.stateward.dev/v1", "kind": "HostileThing", "metadata": {"name": name}, "spec": spec});
    e2e::apply(env, &env.namespace, &object);
}

/// The HostileThings of the test's namespace.
fn hostile_api(env: &TestEnv) -> Api<DynamicObject> {
    let ar = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("test.stateward.dev", "v1", "HostileThing"),
        "hostilethings",
    );
    Api::namespaced_with(env.client.clone(), &env.namespace, &ar)
}

/// One-shot safety: the leader is killed after it sent a one-shot exec and before the answer;
/// the next leader finds the request recorded in the resource's status and does not send it
/// again (the command ran exactly once), and the plugin learns that the outcome is unknown.
#[tokio::test]
async fn a_one_shot_request_is_not_sent_again_by_the_next_leader() {
    let Some(env) = RealPods::enter(Weight::Light, "rp-once").await.expect("real-pods cluster") else {
        return;
    };
    // The hostile fixture alone, its CRD installed, allowed to run `sh` in its own pods.
    let (plugins, policies) = hostile_setup(&env, &["sh"]);

    // The instance's pod, a plain one labelled for it.
    apply_json(
        &env,
        &[json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "h-0", "labels": {"stateward.dev/instance": "h"}},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": PG_IMAGE, "command": ["sleep", "3600"]}],
            },
        })],
    );
    pod_ready(&env, "h-0", Duration::from_secs(120)).await;

    let start = |name: &str| {
        Operator::start_with(
            &env,
            name,
            OperatorOpts {
                namespace: env.namespace.clone(),
                lease_namespace: env.namespace.clone(),
                identity: Some(name.to_string()),
                plugin_dir: Some(plugins.0.clone()),
                policy_dir: Some(policies.clone()),
                kubeconfig: Some(operator_kubeconfig(&env)),
                ..Default::default()
            },
        )
    };
    let mut first = start("once-a");
    first.wait_ready(Duration::from_secs(60)).await;
    let api = hostile_api(&env);
    apply_hostile(&env, "h", json!({"mode": "once-slow", "id": "once-1", "pod": "h-0"}));
    let started_runs = |env: &TestEnv| {
        let out = kubectl_in(env, &["exec", "h-0", "--", "sh", "-c", "grep -c start /tmp/once.log || true"]);
        String::from_utf8_lossy(&out.stdout).trim().parse::<u32>().unwrap_or(0)
    };
    // Recorded in status before it is sent; the leader dies once the command is running.
    wait_for("once-1 recorded as Sent", Duration::from_secs(60), || {
        let api = api.clone();
        async move {
            let cr = get_cr(&api, "h").await.ok_or("CR not found")?;
            match cr.pointer("/status/requests/once-1/state").and_then(Value::as_str) {
                Some("Sent") => Ok(()),
                other => Err(format!("{other:?}: {}", summary(&cr))),
            }
        }
    })
    .await;
    wait_for("the command running", Duration::from_secs(30), || async {
        if started_runs(&env) >= 1 {
            Ok(())
        } else {
            Err("not yet".to_string())
        }
    })
    .await;
    first.kill9();
    let killed = Instant::now();

    let mut second = start("once-b");
    second.wait_ready(Duration::from_secs(60)).await;
    let (status, took) =
        wait_for("the next leader reports the outcome as unknown", Duration::from_secs(90), || {
            let api = api.clone();
            async move {
                let cr = get_cr(&api, "h").await.ok_or("CR not found")?;
                let unknown = cr.pointer("/status/unknown") == Some(&json!(true));
                if unknown {
                    Ok(cr["status"].clone())
                } else {
                    Err(summary(&cr))
                }
            }
        })
        .await;
    let after_kill = killed.elapsed();
    // Past the command's own 20 s: had anyone sent it again, it would have started again.
    tokio::time::sleep(Duration::from_secs(25)).await;
    assert_eq!(started_runs(&env), 1, "the one-shot command ran exactly once");
    let cr = get_cr(&api, "h").await.expect("CR");
    assert_eq!(cr.pointer("/status/requests/once-1/state"), Some(&json!("Sent")), "never re-sent: {cr}");
    eprintln!(
        "realpods: leader killed mid one-shot exec; the next leader was ready and reported the outcome unknown {took:.1?} later ({after_kill:.1?} after the kill); the command ran once; status: {}",
        status["requests"]
    );
    drop(second);
}

/// No silent pass: the harness re-executes each real-pods test by its name inside the
/// cluster's network namespace, and a name that matches no test runs nothing and exits 0.
/// That child must fail, not pass.
#[tokio::test]
async fn a_test_re_executed_under_a_name_that_matches_nothing_fails() {
    if RealPods::inside() {
        return;
    }
    let err = RealPods::run_inside("a_test_that_was_renamed_since")
        .await
        .expect_err("a child that ran no test passed");
    assert!(format!("{err:#}").contains("running 0 tests"), "{err:#}");
}

/// `down --real` leaves nothing: a second, small real-pods cluster of its own (state dir,
/// namespace and port apart from the shared one) is started and stopped, then searched for.
#[tokio::test]
async fn down_leaves_no_process_mount_namespace_or_cgroup() {
    let state = std::env::temp_dir().join(stateward_testkit::unique_name("realpods-down"));
    let netns = format!("sw-down-{}", std::process::id());
    let port = e2e::free_port().to_string();
    let script = |name: &str| {
        let mut c = Command::new(stateward_testkit::cluster_dir().join(name));
        c.arg("--real")
            .env("STATEWARD_REAL_CLUSTER_DIR", &state)
            .env("STATEWARD_NETNS", &netns)
            .env("STATEWARD_REAL_APISERVER_PORT", &port)
            .env("STATEWARD_PV_SIZES", "1Gi");
        c
    };
    if RealPods::inside() {
        return;
    }
    // A whole cluster's start beside the shared one's tests: admitted like a replicated cluster.
    let _admitted = stateward_testkit::real::admit(Weight::Medium).await;
    let started = Instant::now();
    let up = script("up").output().expect("run up --real");
    assert!(up.status.success(), "up --real: {}", String::from_utf8_lossy(&up.stderr));
    eprintln!("realpods: a second real cluster up in {:.1?}", started.elapsed());
    // A running pod: its container, shim, mounts, cgroups and network namespace must go too.
    let kubectl = |args: &[&str]| {
        let out = script("kubectl").args(args).output().expect("run kubectl --real");
        assert!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    kubectl(&[
        "run",
        "sleeper",
        "--image",
        REDIS_IMAGE,
        "--image-pull-policy",
        "Never",
        "--restart",
        "Never",
        "--command",
        "--",
        "sleep",
        "3600",
    ]);
    kubectl(&["wait", "--for=condition=Ready", "pod/sleeper", "--timeout=90s"]);
    let down = script("down").output().expect("run down --real");
    assert!(down.status.success(), "down --real: {}", String::from_utf8_lossy(&down.stderr));

    let state_str = state.to_string_lossy().into_owned();
    let mut leftovers = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(&state_str) {
                leftovers.push(format!("process {}: {cmdline}", entry.file_name().to_string_lossy()));
            }
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mounts").expect("mounts");
    leftovers.extend(mounts.lines().filter(|l| l.contains(&state_str)).map(|l| format!("mount {l}")));
    if std::path::Path::new("/run/netns").join(&netns).exists() {
        leftovers.push(format!("network namespace {netns}"));
    }
    for ctl in std::fs::read_dir("/sys/fs/cgroup").expect("cgroups").flatten() {
        if ctl.path().join(&netns).exists() {
            leftovers.push(format!("cgroup {}", ctl.path().join(&netns).display()));
        }
    }
    if state.exists() {
        leftovers.push(format!("state dir {}", state.display()));
    }
    let cni = std::fs::read_dir("/var/lib/cni/results").map(|d| d.flatten().count()).unwrap_or(0);
    let ours = std::fs::read_dir("/var/lib/cni/results")
        .map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().contains(&netns)).count())
        .unwrap_or(0);
    if ours > 0 {
        leftovers.push(format!("{ours} CNI results of {netns} (of {cni})"));
    }
    assert!(leftovers.is_empty(), "down --real left behind:\n{}", leftovers.join("\n"));
}
