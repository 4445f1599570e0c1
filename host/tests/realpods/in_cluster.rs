//! The operator installed and run the way users run it (issue [in-cluster], must-show 1): its
//! image built from the Dockerfile's files without a container engine
//! (`tests/cluster/operator-image`), `kubectl apply --server-side -k` of deploy/ through the
//! local overlay (`tests/cluster/operator-overlay`), two replicas and one leader, the
//! PostgreSQL sample reaching Available on real servers, admission refusing `alice` and a
//! v1alpha1 read converted, both through the in-cluster webhook Service.
//!
//! The install is cluster-wide (webhook configurations, ClusterRoles, a controller for every
//! namespace), so the test runs alone among the real-pods tests
//! ([`RealPods::enter_exclusive`]) and removes everything it installed except the CRDs, which
//! the other tests install the same way (deploy/crds).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stateward_testkit::real::RealPods;
use stateward_testkit::TestEnv;

use super::e2e::{self, condition, get_cr, phase, summary, wait_for, POSTGRES};
use super::PG_IMAGE;

/// The operator's namespace in deploy/.
const NS: &str = "stateward-system";
const OVERLAY: &str = "tests/cluster/operator-overlay";
const LOCAL_REGISTRY: &str = "localhost/stateward/";

fn out_text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// kubectl with the test's kubeconfig, no namespace implied; its stdout, or a panic naming
/// the command and what it said.
fn kubectl(env: &TestEnv, args: &[&str]) -> String {
    let out = env.kubectl().args(args).output().expect("run kubectl");
    assert!(out.status.success(), "kubectl {args:?} failed: {}", out_text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn kubectl_json(env: &TestEnv, args: &[&str]) -> Value {
    let text = kubectl(env, &[args, &["-o", "json"]].concat());
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("kubectl {args:?}: not JSON ({e}): {text}"))
}

/// The files the Dockerfile's run stage puts into the image (its COPY lines after the last
/// FROM), as absolute paths: a file copied to a file, or a directory of the build context
/// copied into a directory (every file under it).
fn dockerfile_files(root: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(root.join("Dockerfile")).expect("read Dockerfile");
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.starts_with('#')).collect();
    let last_from =
        lines.iter().rposition(|l| l.starts_with("FROM ")).expect("a FROM line in the Dockerfile");
    let mut files = BTreeSet::new();
    for line in &lines[last_from..] {
        let Some(rest) = line.strip_prefix("COPY ") else { continue };
        let words: Vec<&str> = rest.split_whitespace().collect();
        let from_stage = words.iter().any(|w| w.starts_with("--from="));
        let paths: Vec<&str> = words.iter().copied().filter(|w| !w.starts_with("--")).collect();
        assert_eq!(paths.len(), 2, "Dockerfile: `{line}`: one source and one destination per COPY");
        let (src, dest) = (paths[0], paths[1]);
        if src.ends_with('/') {
            assert!(!from_stage, "Dockerfile: `{line}`: directories are copied from the build context only");
            let dir = root.join(src.trim_end_matches('/'));
            let mut stack = vec![dir.clone()];
            while let Some(d) = stack.pop() {
                for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
                    let path = entry.expect("dir entry").path();
                    if path.is_dir() {
                        stack.push(path);
                    } else {
                        let rel = path.strip_prefix(&dir).expect("under dir").to_string_lossy().into_owned();
                        files.insert(format!("{}/{rel}", dest.trim_end_matches('/')));
                    }
                }
            }
        } else {
            assert!(!dest.ends_with('/'), "Dockerfile: `{line}`: a file is copied to a file path");
            files.insert(dest.to_owned());
        }
    }
    files
}

fn operator_image(args: &[&str]) -> String {
    let script = e2e::workspace_root().join("tests/cluster/operator-image");
    let bin = env!("CARGO_BIN_EXE_stateward");
    let plugins = e2e::plugin_dir();
    let out = Command::new(&script)
        .args(args)
        .arg(bin)
        .arg(&plugins)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "tests/cluster/operator-image {args:?} failed: {}", out_text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The overlay's data.json is the shipped one with the local images' registry allowed, and
/// nothing else: the overlay changes the policy floor's data only there.
fn check_overlay_policy_data(root: &Path) {
    let read = |p: PathBuf| -> Value {
        serde_json::from_slice(&std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    let mut shipped = read(root.join("policies/data.json"));
    let overlay = read(root.join(OVERLAY).join("data.json"));
    shipped
        .pointer_mut("/stateward/config/guardrails/allowed_registries")
        .and_then(Value::as_array_mut)
        .expect("allowed_registries in policies/data.json")
        .push(json!(LOCAL_REGISTRY));
    assert_eq!(
        overlay, shipped,
        "{OVERLAY}/data.json must be policies/data.json with only {LOCAL_REGISTRY} added to allowed_registries"
    );
}

/// Everything the overlay installs that is not a CRD: (resource, name, namespace), namespaced
/// objects before the cluster-scoped ones, the webhook configuration first (it fails closed).
fn installed_objects(env: &TestEnv) -> Vec<(String, String, Option<String>)> {
    let root = e2e::workspace_root();
    // One JSON object after another.
    let text = kubectl(
        env,
        &["create", "--dry-run=client", "-o", "json", "-k", &root.join(OVERLAY).to_string_lossy()],
    );
    let items: Vec<Value> = serde_json::Deserializer::from_str(&text)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("the overlay's objects: not JSON ({e}): {text}"));
    let mut objects: Vec<(String, String, Option<String>)> = items
        .iter()
        .filter(|o| o["kind"] != "CustomResourceDefinition")
        .map(|o| {
            let api_version = o["apiVersion"].as_str().unwrap_or_default();
            let group = api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
            let kind = o["kind"].as_str().unwrap_or_default().to_lowercase();
            let resource = if group.is_empty() { kind } else { format!("{kind}.{group}") };
            let name = o["metadata"]["name"].as_str().unwrap_or_default().to_owned();
            let ns = o["metadata"]["namespace"].as_str().map(str::to_owned);
            (resource, name, ns)
        })
        .collect();
    assert!(!objects.is_empty(), "the overlay builds no objects: {text}");
    objects.sort_by_key(|(r, _, ns)| {
        (!r.starts_with("validatingwebhookconfiguration"), ns.is_none(), r.clone())
    });
    objects
}

/// Removes what the install made cluster-wide (every object but the CRDs; the namespace takes
/// its contents with it). Idempotent; waits until the namespace is gone.
fn uninstall(env: &TestEnv) -> Result<(), String> {
    // The operator first, and its pods gone: while one runs it applies the webhook
    // configuration again, which would then refuse every change to the kinds (CI once found
    // it back after an uninstall).
    let out = env
        .kubectl()
        .args(["-n", NS, "delete", "deployment/stateward", "--ignore-not-found", "--cascade=foreground"])
        .args(["--wait=true", "--timeout=120s"])
        .output()
        .expect("run kubectl");
    if !out.status.success() {
        eprintln!("in_cluster: deleting the operator's Deployment: {}", out_text(&out));
    }
    for (resource, name, ns) in installed_objects(env) {
        let mut cmd = env.kubectl();
        cmd.args(["delete", "--ignore-not-found", "--wait=false", &format!("{resource}/{name}")]);
        if let Some(ns) = &ns {
            cmd.args(["-n", ns]);
        }
        let out = cmd.output().expect("run kubectl");
        if !out.status.success() {
            eprintln!("in_cluster: deleting {resource}/{name}: {}", out_text(&out));
        }
    }
    let out = env
        .kubectl()
        .args(["wait", "--for=delete", &format!("namespace/{NS}"), "--timeout=180s"])
        .output()
        .expect("run kubectl");
    let text = out_text(&out);
    if out.status.success() || text.contains("not found") {
        Ok(())
    } else {
        Err(format!("namespace {NS} not deleted: {text}"))
    }
}

/// At the end, passed or not: the sample deleted while the operator still runs (its finalizer),
/// then the install removed.
struct Uninstall<'a> {
    env: &'a TestEnv,
    sample: &'a str,
}

impl Drop for Uninstall<'_> {
    fn drop(&mut self) {
        let ns = self.env.namespace.clone();
        let pgc = format!("postgresclusters.stateward.dev/{}", self.sample);
        // The sample is deletion-protected; only stateward:admins may turn that off.
        let _ = self
            .env
            .kubectl()
            .args([
                "-n",
                &ns,
                "patch",
                &pgc,
                "--type=merge",
                "-p",
                r#"{"spec":{"deletionProtection":false}}"#,
            ])
            .args(["--as=stateward-test", "--as-group=stateward:admins", "--as-group=system:masters"])
            .output();
        let out = self
            .env
            .kubectl()
            .args(["-n", &ns, "delete", "--ignore-not-found", "--wait=true", "--timeout=120s", &pgc])
            .output();
        if !matches!(&out, Ok(o) if o.status.success()) {
            eprintln!("in_cluster: {pgc} not deleted by the operator; removing its finalizers");
            let _ = self
                .env
                .kubectl()
                .args(["-n", &ns, "patch", &pgc, "--type=merge", "-p", r#"{"metadata":{"finalizers":[]}}"#])
                .output();
        }
        // No panic here: this may run while the test is already failing.
        let started = Instant::now();
        match uninstall(self.env) {
            Ok(()) => eprintln!("in_cluster: uninstalled in {:.1?}", started.elapsed()),
            Err(e) => eprintln!("in_cluster: uninstall incomplete: {e}"),
        }
    }
}

/// The operator pods' /metrics or /debug/healthz, through the API server's pod proxy.
fn pod_http(env: &TestEnv, pod: &str, path: &str) -> String {
    kubectl(env, &["get", "--raw", &format!("/api/v1/namespaces/{NS}/pods/{pod}:8080/proxy{path}")])
}

fn operator_pods(env: &TestEnv) -> Vec<String> {
    let list = kubectl_json(
        env,
        &[
            "-n",
            NS,
            "get",
            "pods",
            "-l",
            "app.kubernetes.io/name=stateward,app.kubernetes.io/component=operator",
        ],
    );
    list["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
                .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The sum over the operator pods of the count of plugin calls of `export` (postgres).
fn plugin_calls(env: &TestEnv, export: &str) -> u64 {
    let series =
        format!("stateward_plugin_call_duration_seconds_count{{plugin=\"postgres\",export=\"{export}\"}}");
    operator_pods(env)
        .iter()
        .map(|pod| {
            pod_http(env, pod, "/metrics")
                .lines()
                .find_map(|l| l.strip_prefix(&series).and_then(|v| v.trim().parse::<f64>().ok()))
                .unwrap_or(0.0) as u64
        })
        .sum()
}

/// The webhook client configuration names the in-cluster Service, no URL, and the operator's
/// CA bundle is in it.
fn assert_service_client_config(what: &str, cc: &Value) {
    assert_eq!(cc["service"]["namespace"], NS, "{what}: {cc}");
    assert_eq!(cc["service"]["name"], "stateward-webhook", "{what}: {cc}");
    assert!(cc["url"].is_null(), "{what} calls a URL, not the Service: {cc}");
    assert!(cc["caBundle"].as_str().is_some_and(|b| !b.is_empty()), "{what} has no caBundle: {cc}");
}

#[tokio::test]
async fn kustomize_install_serves_admission_conversion_and_the_postgres_sample() {
    let test = "in_cluster::kustomize_install_serves_admission_conversion_and_the_postgres_sample";
    let Some(env) = RealPods::enter_exclusive(test, "incluster").await.expect("real-pods cluster") else {
        return;
    };
    let root = e2e::workspace_root();

    // The image: the Dockerfile's files, built and imported without a container engine.
    let expected = dockerfile_files(&root);
    let listed: BTreeSet<String> = operator_image(&["--list"]).lines().map(str::to_owned).collect();
    assert_eq!(
        listed, expected,
        "the OCI build's application layer (left) differs from the Dockerfile's COPY lines (right)"
    );
    check_overlay_policy_data(&root);
    let started = Instant::now();
    let image = operator_image(&["--import"]);
    eprintln!("in_cluster: image {} ready in {:.1?}", image.trim(), started.elapsed());

    // From a clean cluster: a leftover install (an earlier run killed midway) goes first.
    uninstall(&env).unwrap_or_else(|e| panic!("removing an earlier install: {e}"));
    let sample = "main-pg";
    let _uninstall = Uninstall { env: &env, sample };

    // The audit-signing Secret, made before the install as deploy/kustomization.yaml says.
    let key_dir = std::env::temp_dir().join(stateward_testkit::unique_name("incluster-key"));
    std::fs::create_dir_all(&key_dir).expect("key dir");
    let key = key_dir.join("key");
    let out = Command::new(env!("CARGO_BIN_EXE_stateward"))
        .args(["audit", "keygen", "--private-key"])
        .arg(&key)
        .output()
        .expect("run stateward audit keygen");
    assert!(out.status.success(), "audit keygen: {}", out_text(&out));
    kubectl(&env, &["create", "namespace", NS]);
    let key_arg = format!("--from-file=key={}", key.display());
    kubectl(&env, &["-n", NS, "create", "secret", "generic", "stateward-audit-signing", &key_arg]);
    let _ = std::fs::remove_dir_all(&key_dir);

    // Install.
    let applied = Instant::now();
    kubectl(&env, &["apply", "--server-side", "-k", &root.join(OVERLAY).to_string_lossy()]);
    let (_, ready) = wait_for("operator Deployment 2/2 Ready", Duration::from_secs(240), || async {
        let d = kubectl_json(&env, &["-n", NS, "get", "deployment", "stateward"]);
        let st = &d["status"];
        if st["readyReplicas"] == 2 && st["updatedReplicas"] == 2 && st["replicas"] == 2 {
            Ok(())
        } else {
            Err(format!("status {st}"))
        }
    })
    .await;
    eprintln!("in_cluster: apply -k -> 2 operator pods Ready in {ready:.1?}");

    // Exactly one leader: the Lease names a live operator pod, and only that one says leader.
    let pods = operator_pods(&env);
    assert_eq!(pods.len(), 2, "operator pods: {pods:?}");
    let (leader, _) = wait_for("one leader", Duration::from_secs(60), || async {
        let lease = kubectl_json(&env, &["-n", NS, "get", "lease", "stateward-leader"]);
        let holder = lease["spec"]["holderIdentity"].as_str().unwrap_or_default().to_owned();
        let leaders: Vec<&String> = pods
            .iter()
            .filter(|p| {
                serde_json::from_str::<Value>(&pod_http(&env, p, "/debug/healthz"))
                    .is_ok_and(|h| h["leader"] == true)
            })
            .collect();
        if leaders.len() == 1 && *leaders[0] == holder {
            Ok(holder)
        } else {
            Err(format!("Lease holder {holder:?}, pods saying leader {leaders:?}"))
        }
    })
    .await;
    eprintln!("in_cluster: leader {leader} (Lease stateward-leader), standby the other");

    // The overlay's policy data cannot be rewritten in place (the floor changes only with
    // the pod spec).
    let floor_data = kubectl_json(
        &env,
        &["-n", NS, "get", "configmaps", "-l", "app.kubernetes.io/component=policy-floor"],
    );
    let items = floor_data["items"].as_array().cloned().unwrap_or_default();
    assert!(
        items.len() == 1 && items[0]["immutable"] == true,
        "the overlay's policy data should be one immutable ConfigMap: {floor_data}"
    );

    // The webhooks point at the Service, with the operator's built-in CA.
    let vwc = kubectl_json(&env, &["get", "validatingwebhookconfiguration", "stateward"]);
    for wh in vwc["webhooks"].as_array().expect("webhooks") {
        assert_service_client_config("ValidatingWebhookConfiguration stateward", &wh["clientConfig"]);
    }
    let crd = kubectl_json(&env, &["get", "crd", "postgresclusters.stateward.dev"]);
    assert_service_client_config("CRD conversion", &crd["spec"]["conversion"]["webhook"]["clientConfig"]);

    // The PostgreSQL sample as deploy/local-samples has it (the local image).
    let text = std::fs::read_to_string(root.join("deploy/samples/postgres.yaml")).expect("sample");
    let mut cr: Value = yaml_serde::from_str(&text).expect("sample yaml");
    assert_eq!(cr["metadata"]["name"], sample);
    cr["spec"]["image"] = json!(PG_IMAGE);
    cr["spec"]["version"] = json!("15");
    let replicas = cr["spec"]["replicas"].as_u64().expect("replicas");
    // Ready pods are not yet a reachable Service: the EndpointSlice and then kube-proxy's
    // rules follow the readiness change (CI once refused the first request). A user's first
    // apply waits the same way, so the test measures when admission answers through the
    // Service, with a server-side dry run that creates nothing.
    let (_, serving) = wait_for("admission answering through the Service", Duration::from_secs(60), || {
        let body = cr.to_string();
        let env = &env;
        async move {
            let args = ["apply", "--dry-run=server", "-n", &env.namespace, "-f", "-"];
            let out = e2e::kubectl_stdin(env, &args, &body);
            if out.status.success() {
                Ok(())
            } else {
                Err(out_text(&out))
            }
        }
    })
    .await;
    eprintln!(
        "in_cluster: admission answering through the Service (server dry run): waited {serving:.1?} more"
    );
    let created = Instant::now();
    let out = e2e::kubectl_stdin(&env, &["apply", "-n", &env.namespace, "-f", "-"], &cr.to_string());
    assert!(out.status.success(), "applying the sample: {}", out_text(&out));
    let api = POSTGRES.api(&env);
    let (_, available) =
        wait_for(&format!("PostgresCluster {sample} Available"), Duration::from_secs(420), || {
            let api = api.clone();
            async move {
                let cr = get_cr(&api, sample).await.ok_or("CR not found")?;
                if phase(&cr) == "Running" && condition(&cr, "Available") == Some("True") {
                    Ok(())
                } else {
                    Err(summary(&cr))
                }
            }
        })
        .await;
    eprintln!(
        "in_cluster: sample {sample} ({replicas} members) Available {available:.1?} after create, {:.1?} after apply -k",
        applied.elapsed() - (created.elapsed() - available)
    );
    // A real server answers on the primary (right after Available the plugin may still roll
    // the members once, e.g. for their certificates: retried while the pod is replaced).
    let (answer, _) = wait_for(&format!("pg_isready on {sample}-0"), Duration::from_secs(120), || async {
        let pod = format!("{sample}-0");
        let out = env
            .kubectl()
            .args(["-n", &env.namespace, "exec", &pod, "--", "pg_isready", "-h", "127.0.0.1"])
            .output()
            .map_err(|e| e.to_string())?;
        let text = out_text(&out);
        if out.status.success() && text.contains("accepting connections") {
            Ok(text)
        } else {
            Err(text)
        }
    })
    .await;
    eprintln!("in_cluster: {}", answer.trim());

    // Admission through the in-cluster Service: alice (edit rights on the kinds, group dev)
    // may not set retentionPolicy: Delete.
    for args in [
        vec!["create", "role", "cr-editor", "--verb=*", "--resource=postgresclusters.stateward.dev"],
        vec!["create", "rolebinding", "alice-cr-editor", "--role=cr-editor", "--user=alice"],
    ] {
        kubectl(&env, &[&args[..], &["-n", &env.namespace]].concat());
    }
    let validated = plugin_calls(&env, "validate");
    let mut denied = POSTGRES.manifest("alice-pg", 1, "Delete");
    denied["spec"]["image"] = json!(PG_IMAGE);
    denied["spec"]["version"] = json!("15");
    let out = e2e::kubectl_stdin(
        &env,
        &["apply", "-n", &env.namespace, "--as", "alice", "--as-group", "dev", "-f", "-"],
        &denied.to_string(),
    );
    let err = out_text(&out);
    assert!(!out.status.success(), "alice could set retentionPolicy: Delete: {err}");
    assert!(
        err.contains("denied the request")
            && err.contains("retention-delete: alice may not set retentionPolicy: Delete"),
        "not the admission webhook's denial: {err}"
    );
    assert!(get_cr(&api, "alice-pg").await.is_none(), "a denied object was stored");
    let validated_after = plugin_calls(&env, "validate");
    assert!(
        validated_after > validated,
        "no validate call counted by the operator pods ({validated} -> {validated_after})"
    );
    eprintln!("in_cluster: alice refused by the in-cluster webhook: {}", err.trim());

    // A v1alpha1 read, converted by the operator's conversion webhook.
    let converted = plugin_calls(&env, "convert");
    let old = kubectl_json(
        &env,
        &["-n", &env.namespace, "get", &format!("postgresclusters.v1alpha1.stateward.dev/{sample}")],
    );
    assert_eq!(old["apiVersion"], "stateward.dev/v1alpha1", "{old}");
    assert_eq!(old["spec"]["storageSize"], cr["spec"]["storage"]["size"], "v1alpha1 storageSize: {old}");
    assert!(old["spec"]["storage"].is_null(), "v1 field in the v1alpha1 object: {old}");
    let converted_after = plugin_calls(&env, "convert");
    assert!(
        converted_after > converted,
        "no convert call counted by the operator pods ({converted} -> {converted_after})"
    );
    eprintln!("in_cluster: v1alpha1 read converted (storageSize {})", old["spec"]["storageSize"]);

    // Uninstall (`kubectl delete -k` leaves the CRDs, README) takes no data: the cluster's pods
    // keep running untouched and every claim stays Bound, with the operator gone.
    let instance = format!("stateward.dev/instance={sample}");
    let members = || {
        let pods = kubectl_json(&env, &["-n", &env.namespace, "get", "pods", "-l", &instance]);
        let mut seen: Vec<(String, String, i64)> = pods["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                let restarts = p["status"]["containerStatuses"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c["restartCount"].as_i64())
                    .sum();
                (
                    p["metadata"]["name"].as_str().unwrap_or_default().to_owned(),
                    p["metadata"]["uid"].to_string(),
                    restarts,
                )
            })
            .collect();
        seen.sort();
        seen
    };
    let before = members();
    assert_eq!(before.len() as u64, replicas, "members before the uninstall: {before:?}");
    let started = Instant::now();
    uninstall(&env).unwrap_or_else(|e| panic!("uninstall: {e}"));
    let took = started.elapsed();
    let claims = kubectl_json(&env, &["-n", &env.namespace, "get", "pvc", "-l", &instance]);
    let bound =
        claims["items"].as_array().into_iter().flatten().filter(|c| c["status"]["phase"] == "Bound").count();
    assert_eq!(bound as u64, replicas, "claims after the uninstall: {claims}");
    assert!(get_cr(&api, sample).await.is_some(), "the PostgresCluster went with the uninstall");
    assert_eq!(members(), before, "the uninstall touched the cluster's pods");
    eprintln!(
        "in_cluster: uninstalled in {took:.1?}: {sample} keeps its {bound} Bound claims and its {} pods, unrestarted",
        before.len()
    );
    // With no operator left to run its finalizer, the sample goes with the test's namespace.
    let pgc = format!("postgresclusters.stateward.dev/{sample}");
    kubectl(
        &env,
        &["-n", &env.namespace, "patch", &pgc, "--type=merge", "-p", r#"{"metadata":{"finalizers":[]}}"#],
    );
}
