//! The operator installed and run the way users run it (issue [in-cluster], must-show 1): its
//! image built from the Dockerfile's files without a container engine
//! (`tests/cluster/operator-image`), `kubectl apply --server-side -k` of deploy/ through the
//! local overlay (`tests/cluster/operator-overlay`), two replicas and one leader, the
//! PostgreSQL sample reaching Available on real servers, admission refusing `alice` and a
//! v1alpha1 read converted, both through the in-cluster webhook Service; the operator's pods
//! killed during a scale (must-show 5), its PodDisruptionBudget met through the Eviction API,
//! a policy layer and a pinned plugin build hot-loaded from ConfigMaps (must-show 3), and an
//! uninstall that keeps the data. The same install with Helm, in namespace mode, and
//! `helm uninstall` (must-show 2).
//!
//! The install is cluster-wide (webhook configurations, ClusterRoles, a controller for every
//! namespace), so the test runs alone among the real-pods tests
//! (`RealPods::enter(Weight::Exclusive, …)`) and removes everything it installed except the CRDs, which
//! the other tests install the same way (deploy/crds).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stateward_testkit::real::{RealPods, Weight};
use stateward_testkit::TestEnv;

use super::e2e::{self, condition, get_cr, phase, summary, wait_for, POSTGRES};
use super::least_privilege::{self, Requests, Use};
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
    let out = env.kubectl_output(args, None).expect("run kubectl");
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

/// The operator pods' /metrics or /debug/healthz, through the API server's pod proxy. Asked
/// again for up to 10 s: right after pods were replaced the proxy may refuse a pod a moment
/// ("address not allowed") until its address is known to it.
fn pod_http(env: &TestEnv, pod: &str, path: &str) -> String {
    let url = format!("/api/v1/namespaces/{NS}/pods/{pod}:8080/proxy{path}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = env.kubectl_output(&["get", "--raw", &url], None).expect("run kubectl");
        if out.status.success() {
            return String::from_utf8_lossy(&out.stdout).into_owned();
        }
        assert!(Instant::now() < deadline, "kubectl get --raw {url} failed: {}", out_text(&out));
        std::thread::sleep(Duration::from_millis(500));
    }
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

/// Waits until the operator Deployment has its two replicas updated and Ready.
async fn operator_ready(env: &TestEnv, what: &str, timeout: Duration) -> Duration {
    let (_, took) = wait_for(&format!("operator Deployment 2/2 Ready {what}"), timeout, || async {
        let st = kubectl_json(env, &["-n", NS, "get", "deployment", "stateward"])["status"].clone();
        if st["readyReplicas"] == 2 && st["updatedReplicas"] == 2 && st["replicas"] == 2 {
            Ok(())
        } else {
            Err(format!("status {st}"))
        }
    })
    .await;
    took
}

/// The sample's children (kind, name, uid), pods and claims aside: what a second controller,
/// or one that lost track of them, would make twice or make again.
fn children_of(env: &TestEnv, instance: &str) -> BTreeSet<String> {
    let kinds = "statefulsets,services,configmaps,secrets,poddisruptionbudgets";
    let list = kubectl_json(env, &["-n", &env.namespace, "get", kinds, "-l", instance]);
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| format!("{}/{} {}", o["kind"], o["metadata"]["name"], o["metadata"]["uid"]))
        .collect()
}

/// Both operator pods deleted while the sample grows by one member: the Deployment's new pods
/// elect a leader, it finishes the scale, and every child the sample had is still the same
/// object (none made twice, none made again). Returns the new member count.
async fn killed_during_a_scale(env: &TestEnv, sample: &str, instance: &str, replicas: u64) -> u64 {
    let children = children_of(env, instance);
    let old_pods = operator_pods(env);
    let scaled = replicas + 1;
    let pgc = format!("postgresclusters.stateward.dev/{sample}");
    let patch = format!(r#"{{"spec":{{"replicas":{scaled}}}}}"#);
    kubectl(env, &["-n", &env.namespace, "patch", &pgc, "--type=merge", "-p", &patch]);
    // The scale begun: the StatefulSet asks for the new member.
    let (_, begun) = wait_for("the StatefulSet scaled by the operator", Duration::from_secs(60), || async {
        let sts = kubectl_json(env, &["-n", &env.namespace, "get", "statefulset", sample]);
        if sts["spec"]["replicas"].as_u64() == Some(scaled) {
            Ok(())
        } else {
            Err(format!("spec.replicas {}", sts["spec"]["replicas"]))
        }
    })
    .await;
    let selector = "app.kubernetes.io/name=stateward,app.kubernetes.io/component=operator";
    kubectl(
        env,
        &["-n", NS, "delete", "pods", "-l", selector, "--grace-period=0", "--force", "--wait=false"],
    );
    let killed = Instant::now();
    let (leader, _) = wait_for("a leader among the new operator pods", Duration::from_secs(180), || async {
        let pods = operator_pods(env);
        let lease = kubectl_json(env, &["-n", NS, "get", "lease", "stateward-leader"]);
        let holder = lease["spec"]["holderIdentity"].as_str().unwrap_or_default().to_owned();
        if pods.len() == 2 && pods.iter().all(|p| !old_pods.contains(p)) && pods.contains(&holder) {
            Ok(holder)
        } else {
            Err(format!("pods {pods:?}, Lease holder {holder:?}"))
        }
    })
    .await;
    let took = killed.elapsed();
    let converged = e2e::wait_running(env, POSTGRES, sample, scaled as i64, Duration::from_secs(420)).await;
    let after = children_of(env, instance);
    let replaced: Vec<&String> = children.difference(&after).collect();
    assert!(
        replaced.is_empty(),
        "children deleted or made again after the operator was killed: {replaced:?}"
    );
    let statefulsets = after.iter().filter(|c| c.starts_with("\"StatefulSet\"")).count();
    assert_eq!(statefulsets, 1, "the sample's StatefulSets: {after:?}");
    let pods = kubectl_json(env, &["-n", &env.namespace, "get", "pods", "-l", instance]);
    let mut names: Vec<String> = pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    names.sort();
    let expected: Vec<String> = (0..scaled).map(|i| format!("{sample}-{i}")).collect();
    assert_eq!(names, expected, "the sample's pods after the scale");
    eprintln!(
        "in_cluster: scale {replicas} -> {scaled} begun after {begun:.1?}; both operator pods deleted; \
         new leader {leader} after {took:.1?}; {sample} Running with {scaled} ready {converged:.1?} later; \
         {} children, none replaced, {} new",
        after.len(),
        after.len() - children.len()
    );
    scaled
}

/// The operator's PodDisruptionBudget: of its two pods one may be evicted, the other not
/// until the first is back (what `kubectl drain` meets, through the same Eviction API).
async fn the_budget_keeps_one_operator_pod(env: &TestEnv) {
    let (pods, _) = wait_for("the budget allowing one disruption", Duration::from_secs(120), || async {
        let pdb = kubectl_json(env, &["-n", NS, "get", "poddisruptionbudget", "stateward"]);
        let pods = operator_pods(env);
        if pdb["status"]["disruptionsAllowed"] == 1 && pdb["status"]["currentHealthy"] == 2 && pods.len() == 2
        {
            Ok(pods)
        } else {
            Err(format!("budget status {}, pods {pods:?}", pdb["status"]))
        }
    })
    .await;
    let evict = |pod: &str| {
        let body = json!({"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": pod, "namespace": NS}})
        .to_string();
        let path = format!("/api/v1/namespaces/{NS}/pods/{pod}/eviction");
        e2e::kubectl_stdin(env, &["create", "--raw", &path, "-f", "-"], &body)
    };
    let first = evict(&pods[0]);
    assert!(first.status.success(), "evicting {}: {}", pods[0], out_text(&first));
    let second = evict(&pods[1]);
    let refused = out_text(&second);
    assert!(
        !second.status.success() && refused.contains("disruption budget"),
        "a second operator pod was evicted while the first was away: {refused}"
    );
    let back = operator_ready(env, "again", Duration::from_secs(180)).await;
    eprintln!(
        "in_cluster: evicted {}; evicting {} too refused ({}); 2/2 Ready again {back:.1?} later",
        pods[0],
        pods[1],
        refused.lines().last().unwrap_or_default().trim()
    );
}

/// `/debug/healthz` of each operator pod, parsed.
fn healthz_of_pods(env: &TestEnv) -> Vec<Value> {
    operator_pods(env)
        .iter()
        .map(|p| serde_json::from_str(&pod_http(env, p, "/debug/healthz")).unwrap_or(Value::Null))
        .collect()
}

/// A layer the administrator's policy ConfigMap adds: one rule of its own, and data that tries
/// to loosen the floor (alice's group bound to admin, `retention-delete` set to dryrun).
const LAYER_REGO: &str = r#"package stateward.admission

deny contains msg if {
	input.operation == "CREATE"
	startswith(object.get(input, ["object", "metadata", "name"], ""), "layer-")
	msg := "layer-names: names starting with layer- are kept for this cluster's administrators"
}
"#;
const LAYER_DATA: &str = r#"{"stateward": {"config": {
  "admission": {"roles": {"admin": ["set-retention-delete"]}, "role_bindings": [{"group": "dev", "role": "admin"}]},
  "enforcement": {"admission": {"retention-delete": "dryrun"}}}}}"#;

/// A server-side dry run of `object` as `as_user` (None: the test's admin), through admission.
fn dry_run(env: &TestEnv, object: &Value, as_user: Option<(&str, &str)>) -> Output {
    let mut args = vec!["apply", "--dry-run=server", "-n", &env.namespace, "-f", "-"];
    if let Some((user, group)) = as_user {
        args.extend(["--as", user, "--as-group", group]);
    }
    e2e::kubectl_stdin(env, &args, &object.to_string())
}

/// A policy ConfigMap in the cluster (must-show 3): both operator pods serve the layer, its
/// rule refuses through the webhook Service, and the floor holds against its data.
async fn policy_layer_in_the_cluster(env: &TestEnv, alice_object: &Value) {
    let digest = |h: &Value| h["policy"]["bundleDigest"].as_str().unwrap_or_default().to_owned();
    let floor: Vec<String> = healthz_of_pods(env).iter().map(digest).collect();
    assert!(floor.len() == 2 && floor[0] == floor[1] && !floor[0].is_empty(), "floor digests {floor:?}");
    let layer = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "policy-layer", "namespace": NS, "labels": {"stateward.dev/policy": "true"}},
        "data": {"layer.rego": LAYER_REGO, "data.json": LAYER_DATA}});
    let out = e2e::kubectl_stdin(env, &["apply", "-f", "-"], &layer.to_string());
    assert!(out.status.success(), "applying the policy layer: {}", out_text(&out));
    let (_, took) =
        wait_for("both operator pods serving the policy layer", Duration::from_secs(60), || async {
            let now: Vec<String> = healthz_of_pods(env).iter().map(digest).collect();
            if now.len() == 2 && now.iter().all(|d| !d.is_empty() && *d != floor[0]) {
                Ok(())
            } else {
                Err(format!("digests {now:?} (floor {})", floor[0]))
            }
        })
        .await;
    let mut probe = alice_object.clone();
    probe["metadata"]["name"] = json!("layer-probe");
    probe["spec"]["retentionPolicy"] = json!("Retain");
    let refused = out_text(&dry_run(env, &probe, None));
    assert!(refused.contains("layer-names:"), "the layer's rule is not in force: {refused}");
    let alice = dry_run(env, alice_object, Some(("alice", "dev")));
    let floor_refusal = out_text(&alice);
    assert!(
        !alice.status.success() && floor_refusal.contains("retention-delete: alice may not set"),
        "the layer's data loosened the floor: {floor_refusal}"
    );
    eprintln!(
        "in_cluster: policy layer served by both pods {took:.1?} after the apply; its rule refuses \
         through the Service; alice still refused by the floor despite the layer's data"
    );
}

/// `stateward plugin pack FILE`: the ConfigMap's YAML and the digest it carries.
fn pack(file: &Path) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_stateward"))
        .args(["plugin", "pack"])
        .arg(file)
        .args(["--namespace", NS])
        .env("STATEWARD_WASM_CACHE", super::support::wasm_cache_dir())
        .output()
        .expect("run stateward plugin pack");
    assert!(out.status.success(), "pack: {}", out_text(&out));
    let yaml = String::from_utf8_lossy(&out.stdout).into_owned();
    let digest = yaml
        .lines()
        .find_map(|l| l.trim().strip_prefix("stateward.dev/sha256:"))
        .map(|d| d.trim().trim_matches(|c| c == '"' || c == '\'').to_owned())
        .unwrap_or_else(|| {
            panic!("no digest annotation in the packed ConfigMap: {}", &yaml[..yaml.len().min(400)])
        });
    (yaml, digest)
}

/// The redis digest each operator pod serves (`/debug/plugins`), and the lists themselves.
fn served_redis(env: &TestEnv) -> (Vec<String>, Vec<Value>) {
    let plugins: Vec<Value> = operator_pods(env)
        .iter()
        .map(|p| serde_json::from_str(&pod_http(env, p, "/debug/plugins")).unwrap_or(Value::Null))
        .collect();
    let redis = plugins
        .iter()
        .map(|list| {
            list.as_array()
                .into_iter()
                .flatten()
                .find(|p| p["name"] == "redis" && p["digest"].is_string())
                .and_then(|p| p["digest"].as_str())
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    (redis, plugins)
}

/// A plugin build from a ConfigMap in the cluster, admitted the hardened way (must-show 3):
/// the administrator turns pins on and pins, in the pod spec, the build serving now (the
/// image's: a pinned name loads no other build) and the new one; an unpinned build under
/// the same name is refused by both pods, the pinned one then serves.
async fn pinned_plugin_build_in_the_cluster(env: &TestEnv) {
    let (pinned, digest) = pack(&super::support::wasm_with_features("fixture-redis-variant", &[]));
    let (unpinned, other) = pack(&super::support::wasm_with_features("fixture-redis-variant", &["looping"]));
    assert_ne!(digest, other, "two builds, two digests");
    let (serving, plugins) = served_redis(env);
    let builtin = serving.first().cloned().unwrap_or_default();
    assert!(
        serving.len() == 2 && serving.iter().all(|d| *d == builtin) && builtin.starts_with("sha256:"),
        "both pods serve one redis build: {plugins:?}"
    );
    let args = "/spec/template/spec/containers/0/args/-";
    let patch = json!([{"op": "add", "path": args, "value": "--require-plugin-pins"},
        {"op": "add", "path": args, "value": format!("--pin-plugin=redis={builtin}")},
        {"op": "add", "path": args, "value": format!("--pin-plugin=redis={digest}")}]);
    let started = Instant::now();
    kubectl(env, &["-n", NS, "patch", "deployment", "stateward", "--type=json", "-p", &patch.to_string()]);
    let rollout = env
        .kubectl()
        .args(["-n", NS, "rollout", "status", "deployment", "stateward", "--timeout=180s"])
        .output()
        .expect("run kubectl");
    if !rollout.status.success() {
        let pods = env.kubectl().args(["-n", NS, "get", "pods", "-o", "wide"]).output().expect("run kubectl");
        let mut why = format!("{}\n{}", out_text(&rollout), out_text(&pods));
        for pod in operator_pods(env) {
            let args = ["-n", NS, "logs", &pod, "--tail=20", "--all-containers"];
            let logs = env.kubectl().args(args).output().expect("run kubectl");
            why.push_str(&format!("\n== {pod}\n{}", out_text(&logs)));
        }
        panic!("the operator did not roll out with pins on: {why}");
    }
    let rolled = started.elapsed() + operator_ready(env, "with pins", Duration::from_secs(120)).await;
    let served = |want: &str| {
        let (redis, plugins) = served_redis(env);
        (redis.len() == 2 && redis.iter().all(|d| d == want), plugins)
    };

    let apply = |yaml: &str| {
        let out = e2e::kubectl_stdin(env, &["apply", "--server-side", "-f", "-"], yaml);
        assert!(out.status.success(), "applying a plugin ConfigMap: {}", out_text(&out));
    };
    apply(&unpinned);
    wait_for("both pods refusing the unpinned build", Duration::from_secs(60), || async {
        let (still, plugins) = served(&builtin);
        let refusals = plugins.iter().filter(|l| l.to_string().contains("is not pinned")).count();
        if still && refusals == 2 {
            Ok(())
        } else {
            Err(format!("{plugins:?}"))
        }
    })
    .await;
    let applied = Instant::now();
    apply(&pinned);
    // The ConfigMap is stored once the server-side apply returns.
    let stored_at = jiff::Timestamp::now();
    let applying = applied.elapsed();
    let (_, took) = wait_for("both pods serving the pinned build", Duration::from_secs(60), || async {
        let (now, plugins) = served(&digest);
        if now {
            Ok(())
        } else {
            Err(format!("{plugins:?}"))
        }
    })
    .await;
    // When each pod swapped the build in, from its log's timestamps (the polls above see it
    // only at their next round): seconds after the apply began.
    let swapped = swapped_in(env, digest.trim_start_matches("sha256:"), stored_at);
    eprintln!(
        "in_cluster: pins on and {digest} pinned, rolled in {rolled:.1?}; the unpinned {other} refused \
         by both pods; the pinned build's ConfigMap applied in {applying:.1?} (kubectl), then swapped in \
         {swapped:?}, seen served by both {took:.1?} after ({:.1?} with the polls)",
        applied.elapsed()
    );
    assert_eq!(swapped.len(), 2, "both operator pods log the swap: {swapped:?}");
    // Both pods compile the build at once, each under its 1-CPU limit, with Winch (the default
    // on x86-64; Cranelift took 1.2-2.2 s here, most of it compiling).
    if cfg!(target_arch = "x86_64") {
        assert!(swapped.iter().all(|s| s.compiler == "winch"), "compiled by Winch: {swapped:?}");
    }
    for s in &swapped {
        stateward_testkit::report::figure(
            "hot_reload.in_cluster.swap",
            s.after_secs,
            "s",
            stateward_testkit::report::Target::AtMost(2.0),
        );
    }
    assert!(
        swapped.iter().all(|s| s.after_secs <= 6.0),
        "both pods serve the pinned build within 6 s of its ConfigMap's apply (liveness: 3x the 2 s target): {swapped:?}"
    );
}

/// For each operator pod, how many seconds after `since` it logged swapping in the plugin build
/// of `digest` (hex), by the container runtime's timestamps of its log lines, with what its
/// vetting logged: its own time (`vet_ms`, compiling included), the compiler, and the functions
/// it compiled and found compiled by the build before it (Cranelift's incremental cache).
fn swapped_in(env: &TestEnv, digest: &str, since: jiff::Timestamp) -> Vec<Swapped> {
    operator_pods(env)
        .iter()
        .filter_map(|pod| {
            let logs = kubectl(env, &["-n", NS, "logs", pod, "--timestamps"]);
            let line = logs.lines().rfind(|l| l.contains("plugin swapped in") && l.contains(digest))?;
            let (at, record) = line.split_once(' ')?;
            let at: jiff::Timestamp = at.parse().ok()?;
            let record: Value = serde_json::from_str(record).unwrap_or_default();
            let field = |name: &str| {
                record.pointer(&format!("/fields/{name}")).or(record.get(name)).and_then(Value::as_u64)
            };
            Some(Swapped {
                after_secs: at.duration_since(since).as_secs_f64(),
                vet_ms: field("vet_ms").unwrap_or_default(),
                compile_ms: field("compile_ms").unwrap_or_default(),
                compiler: record
                    .pointer("/fields/compiler")
                    .or(record.get("compiler"))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                functions_compiled: field("functions_compiled").unwrap_or_default(),
                functions_reused: field("functions_reused").unwrap_or_default(),
            })
        })
        .collect()
}

/// One operator pod's swap of a plugin build, from its log.
#[derive(Debug)]
#[allow(dead_code)] // read through Debug, in the test's figures
struct Swapped {
    after_secs: f64,
    vet_ms: u64,
    compile_ms: u64,
    compiler: String,
    functions_compiled: u64,
    functions_reused: u64,
}

/// The audit-signing Secret, made before the install as deploy/kustomization.yaml and the
/// chart's notes say (the operator's namespace is made here too).
fn make_audit_signing_secret(env: &TestEnv) {
    let key_dir = std::env::temp_dir().join(stateward_testkit::unique_name("incluster-key"));
    std::fs::create_dir_all(&key_dir).expect("key dir");
    let key = key_dir.join("key");
    let out = Command::new(env!("CARGO_BIN_EXE_stateward"))
        .args(["audit", "keygen", "--private-key"])
        .arg(&key)
        .output()
        .expect("run stateward audit keygen");
    assert!(out.status.success(), "audit keygen: {}", out_text(&out));
    kubectl(env, &["create", "namespace", NS]);
    let key_arg = format!("--from-file=key={}", key.display());
    kubectl(env, &["-n", NS, "create", "secret", "generic", "stateward-audit-signing", &key_arg]);
    let _ = std::fs::remove_dir_all(&key_dir);
}

/// Exactly one leader: the Lease names a live operator pod, and only that one says leader.
async fn one_leader(env: &TestEnv) -> String {
    let pods = operator_pods(env);
    assert_eq!(pods.len(), 2, "operator pods: {pods:?}");
    let (leader, _) = wait_for("one leader", Duration::from_secs(60), || async {
        let lease = kubectl_json(env, &["-n", NS, "get", "lease", "stateward-leader"]);
        let holder = lease["spec"]["holderIdentity"].as_str().unwrap_or_default().to_owned();
        let leaders: Vec<&String> = pods
            .iter()
            .filter(|p| {
                serde_json::from_str::<Value>(&pod_http(env, p, "/debug/healthz"))
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
    leader
}

/// The webhooks point at the Service, with the operator's built-in CA.
fn webhooks_point_at_the_service(env: &TestEnv) {
    let vwc = kubectl_json(env, &["get", "validatingwebhookconfiguration", "stateward"]);
    for wh in vwc["webhooks"].as_array().expect("webhooks") {
        assert_service_client_config("ValidatingWebhookConfiguration stateward", &wh["clientConfig"]);
    }
    let crd = kubectl_json(env, &["get", "crd", "postgresclusters.stateward.dev"]);
    assert_service_client_config("CRD conversion", &crd["spec"]["conversion"]["webhook"]["clientConfig"]);
}

/// The PostgreSQL sample as deploy/local-samples has it (the local image), created in the
/// test's namespace once admission answers through the Service; Available on real servers,
/// and its primary answering. Returns the object.
async fn postgres_sample_available(env: &TestEnv, sample: &str, installed: Instant) -> Value {
    let root = e2e::workspace_root();
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
    let out = e2e::kubectl_stdin(env, &["apply", "-n", &env.namespace, "-f", "-"], &cr.to_string());
    assert!(out.status.success(), "applying the sample: {}", out_text(&out));
    let api = POSTGRES.api(env);
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
        "in_cluster: sample {sample} ({replicas} members) Available {available:.1?} after create, {:.1?} after the install",
        installed.elapsed() - (created.elapsed() - available)
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
    cr
}

/// Admission through the in-cluster Service: alice (edit rights on the kinds, group dev) may
/// not set retentionPolicy: Delete. Returns the object she was refused.
async fn alice_is_refused(env: &TestEnv) -> Value {
    for args in [
        vec!["create", "role", "cr-editor", "--verb=*", "--resource=postgresclusters.stateward.dev"],
        vec!["create", "rolebinding", "alice-cr-editor", "--role=cr-editor", "--user=alice"],
    ] {
        kubectl(env, &[&args[..], &["-n", &env.namespace]].concat());
    }
    let validated = plugin_calls(env, "validate");
    let mut denied = POSTGRES.manifest("alice-pg", 1, "Delete");
    denied["spec"]["image"] = json!(PG_IMAGE);
    denied["spec"]["version"] = json!("15");
    let out = e2e::kubectl_stdin(
        env,
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
    assert!(get_cr(&POSTGRES.api(env), "alice-pg").await.is_none(), "a denied object was stored");
    let validated_after = plugin_calls(env, "validate");
    assert!(
        validated_after > validated,
        "no validate call counted by the operator pods ({validated} -> {validated_after})"
    );
    eprintln!("in_cluster: alice refused by the in-cluster webhook: {}", err.trim());
    denied
}

/// A v1alpha1 read, converted by the operator's conversion webhook.
fn v1alpha1_read_is_converted(env: &TestEnv, sample: &str, cr: &Value) {
    let converted = plugin_calls(env, "convert");
    let old = kubectl_json(
        env,
        &["-n", &env.namespace, "get", &format!("postgresclusters.v1alpha1.stateward.dev/{sample}")],
    );
    assert_eq!(old["apiVersion"], "stateward.dev/v1alpha1", "{old}");
    assert_eq!(old["spec"]["storageSize"], cr["spec"]["storage"]["size"], "v1alpha1 storageSize: {old}");
    assert!(old["spec"]["storage"].is_null(), "v1 field in the v1alpha1 object: {old}");
    let converted_after = plugin_calls(env, "convert");
    assert!(
        converted_after > converted,
        "no convert call counted by the operator pods ({converted} -> {converted_after})"
    );
    eprintln!("in_cluster: v1alpha1 read converted (storageSize {})", old["spec"]["storageSize"]);
}

/// The members of an instance: (pod, uid, restarts), sorted.
fn members(env: &TestEnv, instance: &str) -> Vec<(String, String, i64)> {
    let pods = kubectl_json(env, &["-n", &env.namespace, "get", "pods", "-l", instance]);
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
}

/// After an uninstall: the cluster's pods are the same, unrestarted, every claim is Bound and
/// the custom resource is still there.
async fn the_data_stays(
    env: &TestEnv,
    sample: &str,
    instance: &str,
    before: &[(String, String, i64)],
    took: Duration,
) {
    let claims = kubectl_json(env, &["-n", &env.namespace, "get", "pvc", "-l", instance]);
    let bound =
        claims["items"].as_array().into_iter().flatten().filter(|c| c["status"]["phase"] == "Bound").count();
    assert_eq!(bound, before.len(), "claims after the uninstall: {claims}");
    assert!(
        get_cr(&POSTGRES.api(env), sample).await.is_some(),
        "the PostgresCluster went with the uninstall"
    );
    assert_eq!(members(env, instance), before, "the uninstall touched the cluster's pods");
    eprintln!(
        "in_cluster: uninstalled in {took:.1?}: {sample} keeps its {bound} Bound claims and its {} pods, unrestarted",
        before.len()
    );
    // With no operator left to run its finalizer, the sample goes with the test's namespace.
    let pgc = format!("postgresclusters.stateward.dev/{sample}");
    kubectl(
        env,
        &["-n", &env.namespace, "patch", &pgc, "--type=merge", "-p", r#"{"metadata":{"finalizers":[]}}"#],
    );
}

/// The sample's own CA Secret, beside its other children in its namespace (an uninstall of the
/// operator leaves it there).
fn instance_ca(env: &TestEnv, sample: &str) -> Value {
    kubectl_json(env, &["-n", &env.namespace, "get", "secret", &format!("{sample}-service-ca")])
}

/// What the sample's pods are made from: the StatefulSet's update revision (the pod template,
/// with the hash of the certificate it mounts) and the certificate Secrets' contents.
fn template_and_certificates(env: &TestEnv, sample: &str, instance: &str) -> (Value, Value) {
    let sts = kubectl_json(env, &["-n", &env.namespace, "get", "statefulset", sample]);
    let secrets = kubectl_json(env, &["-n", &env.namespace, "get", "secrets", "-l", instance]);
    let certificates: Vec<Value> = secrets["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["type"] == "kubernetes.io/tls")
        .map(|s| json!([s["metadata"]["name"], s["data"]]))
        .collect();
    (sts["status"]["updateRevision"].clone(), json!(certificates))
}

/// The README's reinstall: the instance's CA stayed with the instance, so the operator issues no
/// new CA, the managed cluster's certificates and pod template stay and its pods do not roll,
/// once the new operator has applied the cluster's StatefulSet again.
async fn reinstall_keeps_the_instance_ca(
    env: &TestEnv,
    sample: &str,
    instance: &str,
    ca: &Value,
    pods_before: &[(String, String, i64)],
    made_before: &(Value, Value),
) {
    let root = e2e::workspace_root();
    let audit = audit_log(env);
    let started = Instant::now();
    // The namespace and the audit signing key first (README), as for the first install.
    make_audit_signing_secret(env);
    kubectl(env, &["apply", "-f", &root.join("deploy/operator/namespace.yaml").to_string_lossy()]);
    kubectl(env, &["apply", "--server-side", "-k", &root.join(OVERLAY).to_string_lossy()]);
    operator_ready(env, "after the reinstall", Duration::from_secs(240)).await;
    // The new operator's reconciles of the sample: its finalizer back (the uninstall left the
    // sample without), and plans made after that (each reconcile applies its plan; an apply
    // that changes nothing writes nothing).
    let (_, reconciled) =
        wait_for("the reinstalled operator reconciles the sample", Duration::from_secs(120), || async {
            let cr = get_cr(&POSTGRES.api(env), sample).await.ok_or("no sample")?;
            let finalized =
                cr["metadata"]["finalizers"].as_array().is_some_and(|f| f.contains(&json!(e2e::FINALIZER)));
            let plans = plugin_calls(env, "reconcile");
            if finalized && plans >= 2 {
                Ok(())
            } else {
                Err(format!("finalizer {finalized}, {plans} plans"))
            }
        })
        .await;
    let kept = instance_ca(env, sample);
    assert_eq!(kept["data"], ca["data"], "the reinstalled operator made a new instance CA");
    // A few reconciles more: a certificate issued again would show in them.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let user = format!("system:serviceaccount:{NS}:stateward");
    let text = std::fs::read(&audit.0).unwrap_or_default();
    let writes =
        least_privilege::requests(&text[usize::try_from(audit.1).unwrap_or(0).min(text.len())..], |e| {
            e["user"]["username"] == user.as_str()
                && e["objectRef"]["namespace"] == env.namespace.as_str()
                && !matches!(e["verb"].as_str(), Some("get" | "list" | "watch"))
        });
    assert_eq!(
        &template_and_certificates(env, sample, instance),
        made_before,
        "the reinstall changed the cluster's pod template or certificates"
    );
    assert_eq!(members(env, instance), pods_before, "the reinstall restarted the cluster's pods");
    eprintln!(
        "in_cluster: reinstalled; the operator reconciled {sample} {reconciled:.1?} \
         after it was Ready ({:.1?} after the reinstall began): same CA, certificates, pod template revision and pods; its \
         writes in the cluster's namespace: {:?}",
        started.elapsed(),
        writes.used
    );
}

#[tokio::test]
async fn kustomize_install_serves_admission_conversion_and_the_postgres_sample() {
    let Some(env) = RealPods::enter(Weight::Exclusive, "incluster").await.expect("real-pods cluster") else {
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
    make_audit_signing_secret(&env);

    // Install.
    let audit = audit_log(&env);
    let applied = Instant::now();
    kubectl(&env, &["apply", "--server-side", "-k", &root.join(OVERLAY).to_string_lossy()]);
    let ready = operator_ready(&env, "", Duration::from_secs(240)).await;
    eprintln!("in_cluster: apply -k -> 2 operator pods Ready in {ready:.1?}");
    one_leader(&env).await;

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
    webhooks_point_at_the_service(&env);

    let cr = postgres_sample_available(&env, sample, applied).await;
    let replicas = cr["spec"]["replicas"].as_u64().expect("replicas");
    let denied = alice_is_refused(&env).await;
    v1alpha1_read_is_converted(&env, sample, &cr);

    // The operator killed during a scale (must-show 5), then its PodDisruptionBudget.
    let instance = format!("stateward.dev/instance={sample}");
    let replicas = killed_during_a_scale(&env, sample, &instance, replicas).await;
    the_budget_keeps_one_operator_pod(&env).await;
    // Hot reload in the cluster (must-show 3): a policy layer, then a pinned plugin build.
    policy_layer_in_the_cluster(&env, &denied).await;
    pinned_plugin_build_in_the_cluster(&env).await;

    // Uninstall (`kubectl delete -k` leaves the CRDs, README) takes no data: the cluster's pods
    // keep running untouched and every claim stays Bound, with the operator gone.
    operator_requests_match_its_roles(&env, "kustomize", &audit);
    let before = members(&env, &instance);
    assert_eq!(before.len() as u64, replicas, "members before the uninstall: {before:?}");
    let made_from = template_and_certificates(&env, sample, &instance);
    let ca = instance_ca(&env, sample);
    let started = Instant::now();
    uninstall(&env).unwrap_or_else(|e| panic!("uninstall: {e}"));
    the_data_stays(&env, sample, &instance, &before, started.elapsed()).await;
    // Installed again (README): nothing of the cluster changes.
    reinstall_keeps_the_instance_ca(&env, sample, &instance, &ca, &before, &made_from).await;
}

/// The API server's audit log of the real-pods cluster (tests/cluster/up: every request of a
/// ServiceAccount outside kube-system, one line each), and how far it is now: a test reads
/// the operator's requests from there on.
fn audit_log(env: &TestEnv) -> (PathBuf, u64) {
    let path = env.kubeconfig().parent().expect("state dir").join("logs").join("audit.log");
    let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    (path, len)
}

/// The rules bound to the operator's account, flattened to one row per (verb, group,
/// resource) and where they apply (`*`: every namespace and cluster-scoped), with names.
fn operator_grants(env: &TestEnv) -> Vec<(Use, Vec<String>)> {
    let account = |b: &Value| {
        b["subjects"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["kind"] == "ServiceAccount" && s["name"] == "stateward" && s["namespace"] == NS)
    };
    let mut grants = Vec::new();
    let mut add = |role: &Value, scope: &str| {
        for rule in role["rules"].as_array().into_iter().flatten() {
            let names: Vec<String> = rule["resourceNames"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|n| n.as_str().map(str::to_owned))
                .collect();
            for group in rule["apiGroups"].as_array().into_iter().flatten().filter_map(Value::as_str) {
                for resource in rule["resources"].as_array().into_iter().flatten().filter_map(Value::as_str) {
                    for verb in rule["verbs"].as_array().into_iter().flatten().filter_map(Value::as_str) {
                        let row = (verb.to_owned(), group.to_owned(), resource.to_owned(), scope.to_owned());
                        grants.push((row, names.clone()));
                    }
                }
            }
        }
    };
    for binding in
        kubectl_json(env, &["get", "clusterrolebindings"])["items"].as_array().into_iter().flatten()
    {
        if account(binding) {
            let role =
                kubectl_json(env, &["get", "clusterrole", binding["roleRef"]["name"].as_str().unwrap_or("")]);
            add(&role, "*");
        }
    }
    // The operator's namespace and the test's (not another test's, whose namespace may still
    // be going away with its bindings).
    for binding in kubectl_json(env, &["get", "rolebindings", "-A"])["items"].as_array().into_iter().flatten()
    {
        let here =
            [NS, env.namespace.as_str()].contains(&binding["metadata"]["namespace"].as_str().unwrap_or(""));
        if here && account(binding) {
            let ns = binding["metadata"]["namespace"].as_str().unwrap_or_default();
            let name = binding["roleRef"]["name"].as_str().unwrap_or_default();
            let kind = if binding["roleRef"]["kind"] == "ClusterRole" { "clusterrole" } else { "role" };
            add(&kubectl_json(env, &["-n", ns, "get", kind, name]), ns);
        }
    }
    grants
}

/// Rules the in-cluster scenarios may leave unused besides those of the whole suite
/// ([`least_privilege::UNUSED_BECAUSE`]), each with why (and where it is used).
const IN_CLUSTER_UNUSED_BECAUSE: &[(&str, &str, &str, &str)] = &[
    ("patch", "stateward.dev", "redisclusters", OTHER_KINDS),
    ("patch", "stateward.dev", "elasticsearchclusters", OTHER_KINDS),
    ("patch", "stateward.dev", "redisclusters/status", OTHER_KINDS),
    ("patch", "stateward.dev", "elasticsearchclusters/status", OTHER_KINDS),
    (
        "create",
        "events.k8s.io",
        "events",
        "Events on hot-loaded ConfigMaps in the operator's namespace; the Helm scenario loads none",
    ),
    (
        "create",
        "coordination.k8s.io",
        "leases",
        "made once per namespace; a Lease left by the previous install is taken over",
    ),
];

const OTHER_KINDS: &str =
    "the scenarios run PostgreSQL only; the other kinds take the same calls (their live tests)";

fn unused_because(verb: &str, group: &str, resource: &str) -> Option<&'static str> {
    least_privilege::unused_because(least_privilege::UNUSED_BECAUSE, verb, group, resource)
        .or_else(|| least_privilege::unused_because(IN_CLUSTER_UNUSED_BECAUSE, verb, group, resource))
}

/// [in-cluster] must-show 4 over this test's stretch of the audit log: every request the
/// operator's account made was allowed (no 403) and is one its roles grant; every granted
/// (verb, group, resource) was used, or has its reason written. Prints both.
fn operator_requests_match_its_roles(env: &TestEnv, what: &str, log: &(PathBuf, u64)) {
    let text = std::fs::read(&log.0).unwrap_or_else(|e| panic!("{}: {e}", log.0.display()));
    let user = format!("system:serviceaccount:{NS}:stateward");
    let stretch = &text[usize::try_from(log.1).unwrap_or(0).min(text.len())..];
    let Requests { count: requests, used, forbidden, terminating_refused } =
        least_privilege::requests(stretch, |event| event["user"]["username"] == user.as_str());
    let grants = operator_grants(env);
    let covered = |(verb, group, resource, scope): &Use| {
        grants
            .iter()
            .any(|((v, g, r, s), _)| v == verb && g == group && r == resource && (s == "*" || s == scope))
    };
    let unallowed: Vec<&Use> = used.iter().filter(|u| !covered(u)).collect();
    let mut unused = Vec::new();
    let mut reasoned = Vec::new();
    for ((verb, group, resource, scope), names) in &grants {
        let applies =
            |u: &Use| u.0 == *verb && u.1 == *group && u.2 == *resource && (scope == "*" || u.3 == *scope);
        if used.iter().any(applies) {
            continue;
        }
        let row = format!(
            "{verb} {group}/{resource} in {scope}{}",
            if names.is_empty() { String::new() } else { format!(" {names:?}") }
        );
        match unused_because(verb, group, resource) {
            Some(why) => reasoned.push(format!("{row}: {why}")),
            None => unused.push(row),
        }
    }
    let shown: Vec<String> = used.iter().map(|(v, g, r, s)| format!("{v} {g}/{r} in {s}")).collect();
    eprintln!(
        "in_cluster[{what}]: the operator's account made {requests} requests (audit log), {} kinds of request:\n  {}\nunused, with their reasons:\n  {}",
        used.len(),
        shown.join("\n  "),
        reasoned.join("\n  ")
    );
    if !terminating_refused.is_empty() {
        eprintln!(
            "in_cluster[{what}]: refused by a namespace being deleted, not by a role: {terminating_refused:?}"
        );
    }
    assert!(requests > 0, "{what}: no request of {user} in the audit log {}", log.0.display());
    let refused: Vec<&str> = forbidden.iter().map(|r| r.request.as_str()).collect();
    assert!(refused.is_empty(), "{what}: requests refused to the operator: {refused:?}");
    assert!(unallowed.is_empty(), "{what}: requests no rule grants: {unallowed:?}");
    assert!(unused.is_empty(), "{what}: granted, never used, and no reason written: {unused:?}");
}

/// helm with the test's kubeconfig; its output, or a panic naming the command and what it said.
fn helm(env: &TestEnv, args: &[&str]) -> String {
    let home = std::env::temp_dir().join(stateward_testkit::unique_name("helm-home"));
    let out = Command::new(stateward_testkit::helm_binary())
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .arg("--kubeconfig")
        .arg(env.kubeconfig())
        .args(args)
        .current_dir(e2e::workspace_root())
        .output()
        .expect("run helm (tests/cluster/build helm)");
    let _ = std::fs::remove_dir_all(&home);
    assert!(out.status.success(), "helm {args:?}: {}", out_text(&out));
    out_text(&out)
}

/// At the end of the Helm install, passed or not: the CRDs it kept carry Helm's
/// `managed-by` label, owned by Helm's field manager; deploy/'s are applied over them again
/// (as a user moving to kustomize would, with --force-conflicts), so the next install of
/// deploy/ finds them as its own.
struct RestoreCrds<'a>(&'a TestEnv);

impl Drop for RestoreCrds<'_> {
    fn drop(&mut self) {
        let crds = e2e::workspace_root().join("deploy/crds");
        let out =
            self.0.kubectl().args(["apply", "--server-side", "--force-conflicts", "-f"]).arg(&crds).output();
        if !matches!(&out, Ok(o) if o.status.success()) {
            eprintln!("in_cluster[helm]: restoring deploy/crds: {out:?}");
        }
    }
}

/// Whether the operator's account may `verb` `resource` in `namespace`.
fn operator_can(env: &TestEnv, verb: &str, resource: &str, namespace: &str) -> bool {
    let out = env
        .kubectl()
        .args(["auth", "can-i", verb, resource, "-n", namespace])
        .arg(format!("--as=system:serviceaccount:{NS}:stateward"))
        .output()
        .expect("run kubectl");
    String::from_utf8_lossy(&out.stdout).trim() == "yes"
}

/// Must-show 2, live: the chart installed with Helm in namespace mode (the operator watches
/// the test's namespace only, with a Role there), the local image and the floor's data
/// admitting the local images as values; the same scenario as the kustomize install (operator
/// pods Ready, one leader, the PostgreSQL sample Available on real servers, alice refused and
/// a v1alpha1 read converted through the in-cluster Service); the operator's account reads no
/// Secret outside its namespaces; `helm uninstall` keeps the CRDs, the cluster and its claims,
/// and leaves no webhook configuration behind.
#[tokio::test]
async fn helm_install_in_namespace_mode_serves_admission_conversion_and_the_postgres_sample() {
    let Some(env) = RealPods::enter(Weight::Exclusive, "inhelm").await.expect("real-pods cluster") else {
        return;
    };
    let root = e2e::workspace_root();
    let image = operator_image(&["--import"]);
    eprintln!("in_cluster[helm]: image {}", image.trim());
    uninstall(&env).unwrap_or_else(|e| panic!("removing an earlier install: {e}"));
    let sample = "main-pg";
    let _uninstall = Uninstall { env: &env, sample };
    let _crds = RestoreCrds(&env);
    make_audit_signing_secret(&env);
    kubectl(&env, &["label", "namespace", NS, "pod-security.kubernetes.io/enforce=restricted"]);

    let audit = audit_log(&env);
    let installed = Instant::now();
    let watched = format!("watchNamespace={}", env.namespace);
    let floor = format!("policyFloorData={}", root.join(OVERLAY).join("data.json").display());
    #[rustfmt::skip]
    let out = helm(&env, &[
        "install", "stateward", "deploy/helm/stateward", "-n", NS,
        "--set", "scope=namespace", "--set", &watched,
        "--set", "image.repository=localhost/stateward/operator", "--set", "image.tag=local",
        "--set", "image.pullPolicy=Never", "--set-file", &floor,
        // The CRDs are there already (the other real-pods tests apply deploy/crds, as a
        // kustomize install would): the chart takes them over, as the README says.
        "--take-ownership", "--force-conflicts",
    ]);
    assert!(out.contains("STATUS: deployed"), "helm install: {out}");
    let ready = operator_ready(&env, "(helm)", Duration::from_secs(240)).await;
    eprintln!("in_cluster[helm]: helm install -> 2 operator pods Ready in {ready:.1?}");
    one_leader(&env).await;
    webhooks_point_at_the_service(&env);

    // Namespace mode: the watched namespace's Secrets, no one else's.
    assert!(operator_can(&env, "list", "secrets", &env.namespace), "the watched namespace's Secrets");
    for other in ["default", "kube-system"] {
        assert!(!operator_can(&env, "list", "secrets", other), "the operator may list Secrets in {other}");
        assert!(!operator_can(&env, "get", "secrets", other), "the operator may get Secrets in {other}");
    }
    for namespace in [env.namespace.as_str(), NS, "default"] {
        let sa = format!("--as=system:serviceaccount:{NS}:stateward");
        let list = kubectl(&env, &["auth", "can-i", "--list", "-n", namespace, &sa]);
        eprintln!("in_cluster[helm]: kubectl auth can-i --list -n {namespace} for the operator:\n{list}");
    }
    let bound =
        kubectl_json(&env, &["get", "clusterrolebinding", "-l", "app.kubernetes.io/instance=stateward"]);
    let names: Vec<&str> = bound["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, ["stateward-webhook"], "namespace mode: only the webhook's cluster-wide binding");

    let cr = postgres_sample_available(&env, sample, installed).await;
    alice_is_refused(&env).await;
    v1alpha1_read_is_converted(&env, sample, &cr);

    // helm uninstall: the operator goes; the CRDs (resource-policy keep), the cluster, its
    // pods and claims stay, and no webhook configuration is left to refuse every change.
    operator_requests_match_its_roles(&env, "helm", &audit);
    let instance = format!("stateward.dev/instance={sample}");
    let before = members(&env, &instance);
    // The operator pods' last words, for a configuration that comes back.
    let logs: Vec<(String, std::process::Child)> = operator_pods(&env)
        .into_iter()
        .map(|pod| {
            let child = env
                .kubectl()
                .args(["-n", NS, "logs", "-f", &pod])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("kubectl logs");
            (pod, child)
        })
        .collect();
    let started = Instant::now();
    helm(&env, &["uninstall", "stateward", "-n", NS, "--wait", "--timeout", "120s"]);
    let took = started.elapsed();
    // Every operator pod gone, terminating ones included: until then one could still apply.
    wait_for("the operator pods gone", Duration::from_secs(120), || async {
        let selector = "app.kubernetes.io/name=stateward,app.kubernetes.io/component=operator";
        let pods = kubectl_json(&env, &["-n", NS, "get", "pods", "-l", selector]);
        match pods["items"].as_array().map(Vec::len) {
            Some(0) => Ok(()),
            n => Err(format!("{n:?} pods")),
        }
    })
    .await;
    let vwc = env
        .kubectl()
        .args(["get", "validatingwebhookconfiguration", "stateward", "-o", "yaml", "--show-managed-fields"])
        .output()
        .expect("kubectl");
    if !out_text(&vwc).contains("NotFound") {
        for (pod, child) in logs {
            let out = child.wait_with_output().expect("kubectl logs");
            let said = String::from_utf8_lossy(&out.stdout);
            let webhook: Vec<&str> = said.lines().filter(|l| l.contains("webhook")).collect();
            eprintln!("in_cluster[helm]: {pod} said of the webhook:\n{}", webhook.join("\n"));
        }
        panic!("a webhook configuration outlived the operator: {}", out_text(&vwc));
    }
    for (_, mut child) in logs {
        let _ = child.kill();
        let _ = child.wait();
    }
    kubectl(&env, &["get", "crd", "postgresclusters.stateward.dev"]);
    the_data_stays(&env, sample, &instance, &before, took).await;
}
