//! The Helm chart (deploy/helm/stateward) against kustomize: `helm lint`, and `helm template`
//! installing the same objects as `kubectl kustomize` of deploy/ for the same settings
//! (cluster-wide, namespaced, OTLP export), Helm's own labels aside; values the schema refuses
//! name their field; the values only Helm has (audit sink, plugin pins, hot-loaded ConfigMaps)
//! change what they say and nothing else. Both tools are the real ones (tests/cluster/build).

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use crate::support::workspace_root;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde::Deserialize;
use serde_json::Value;

const CHART: &str = "deploy/helm/stateward";
/// Labels and annotations the chart adds to deploy/'s objects: the chart and release, and
/// keeping the CRDs on `helm uninstall`.
const HELM_LABELS: [&str; 2] = ["helm.sh/chart", "app.kubernetes.io/instance"];
const HELM_ANNOTATIONS: [&str; 1] = ["helm.sh/resource-policy"];

fn run(mut cmd: Command) -> Output {
    cmd.current_dir(workspace_root())
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (built by tests/cluster/build)"))
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

fn helm(args: &[&str]) -> Output {
    let mut cmd = Command::new(stateward_testkit::helm_binary());
    // No user's repositories, plugins or cache.
    let home = std::env::temp_dir().join(format!("stateward-helm-home-{}", std::process::id()));
    cmd.env("HELM_CONFIG_HOME", home.join("config")).env("HELM_CACHE_HOME", home.join("cache"));
    cmd.env("HELM_DATA_HOME", home.join("data")).args(args);
    run(cmd)
}

/// `--set X` for each.
fn sets_args<'a>(sets: &[&'a str]) -> Vec<&'a str> {
    sets.iter().flat_map(|s| ["--set", s]).collect()
}

/// `helm template` of the chart as release `stateward` in stateward-system, with `--set`s.
fn template(sets: &[&str]) -> Output {
    helm(
        &[&["template", "stateward", CHART, "--namespace", "stateward-system"][..], &sets_args(sets)[..]]
            .concat(),
    )
}

fn template_ok(sets: &[&str]) -> String {
    let out = template(sets);
    assert!(out.status.success(), "helm template {sets:?}: {}", text(&out));
    String::from_utf8(out.stdout).unwrap()
}

/// `kubectl kustomize` of an overlay of deploy/ with these components (none: deploy/ itself;
/// one under tests/: that overlay).
fn kustomize(components: &[&str]) -> String {
    let root = workspace_root();
    let dir = match components {
        [overlay] if overlay.starts_with("tests/") => root.join(overlay),
        [] => root.join("deploy"),
        _ => {
            let dir = std::env::temp_dir().join(format!(
                "stateward-chart-overlay-{}-{}",
                std::process::id(),
                components.join("+").replace('/', "_")
            ));
            std::fs::create_dir_all(&dir).unwrap();
            // kustomize takes only relative paths: from the overlay up to / and down to deploy/.
            let dir = dir.canonicalize().unwrap();
            let up = "../".repeat(dir.components().count() - 1);
            let deploy = PathBuf::from(up)
                .join(root.canonicalize().unwrap().join("deploy").strip_prefix("/").unwrap());
            let list: Vec<String> =
                components.iter().map(|c| format!("  - {}", deploy.join(c).display())).collect();
            let kustomization = format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\ncomponents:\n{}\n",
            deploy.display(),
            list.join("\n")
        );
            std::fs::write(dir.join("kustomization.yaml"), kustomization).unwrap();
            dir
        }
    };
    let mut cmd = Command::new(stateward_testkit::kubectl_binary());
    cmd.arg("kustomize").arg(&dir);
    let out = run(cmd);
    assert!(out.status.success(), "kubectl kustomize {}: {}", dir.display(), text(&out));
    String::from_utf8(out.stdout).unwrap()
}

/// The policy floor's data ConfigMap is named after its content, by kustomize's hash or the
/// chart's digest: both become `-HASH`.
fn without_content_suffix(yaml: &str) -> String {
    const NAME: &str = "stateward-policy-data-";
    let mut out = String::with_capacity(yaml.len());
    let mut rest = yaml;
    while let Some(at) = rest.find(NAME) {
        out.push_str(&rest[..at + NAME.len()]);
        out.push_str("HASH");
        rest = rest[at + NAME.len()..].trim_start_matches(|c: char| c.is_ascii_alphanumeric());
    }
    out + rest
}

/// Objects of a multi-document YAML stream by "kind namespace/name" (namespace empty for
/// cluster-scoped ones).
fn objects(yaml: &str) -> BTreeMap<String, Value> {
    let mut all = BTreeMap::new();
    for doc in yaml_serde::Deserializer::from_str(&without_content_suffix(yaml)) {
        let v = Value::deserialize(doc).unwrap();
        if v.is_null() {
            continue;
        }
        let key = format!(
            "{} {}/{}",
            v["kind"].as_str().unwrap_or_default(),
            v.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or_default(),
            v.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default()
        );
        assert!(all.insert(key.clone(), v).is_none(), "{key} twice");
    }
    all
}

/// The chart's objects with what Helm adds taken out (an emptied map removed).
fn without_helm_marks(mut objects: BTreeMap<String, Value>) -> BTreeMap<String, Value> {
    for (key, v) in &mut objects {
        let meta = v["metadata"].as_object_mut().unwrap();
        for (field, marks) in [("labels", &HELM_LABELS[..]), ("annotations", &HELM_ANNOTATIONS[..])] {
            if let Some(map) = meta.get_mut(field).and_then(Value::as_object_mut) {
                if field == "labels" {
                    for mark in marks {
                        assert!(map.remove(*mark).is_some(), "{key} carries the chart's label {mark}");
                    }
                } else {
                    map.retain(|k, _| !marks.contains(&k.as_str()));
                }
                if map.is_empty() {
                    meta.remove(field);
                }
            }
        }
    }
    objects
}

/// The first path where two values differ, for a readable failure.
fn first_difference(path: &str, a: &Value, b: &Value) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            x.keys().chain(y.keys()).find_map(|k| first_difference(&format!("{path}/{k}"), &x[k], &y[k]))
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            x.iter().zip(y).enumerate().find_map(|(i, (p, q))| first_difference(&format!("{path}/{i}"), p, q))
        }
        _ if a == b => None,
        _ => Some(format!("{path}: kustomize {a} / helm {b}")),
    }
}

/// Asserts `kubectl kustomize` (with `components`) and `helm template` (with `sets`) install
/// the same objects; kustomize's Namespace aside, which Helm holds its release in and so is
/// made before the chart (`--create-namespace`).
fn assert_same_objects(what: &str, components: &[&str], sets: &[&str]) -> usize {
    let mut kustomized = objects(&kustomize(components));
    assert!(
        kustomized.remove("Namespace /stateward-system").is_some(),
        "{what}: deploy/ makes its namespace"
    );
    let charted = without_helm_marks(objects(&template_ok(sets)));
    let only = |a: &BTreeMap<String, Value>, b: &BTreeMap<String, Value>| {
        a.keys().filter(|k| !b.contains_key(*k)).cloned().collect::<Vec<_>>()
    };
    assert_eq!(
        (only(&kustomized, &charted), only(&charted, &kustomized)),
        (vec![], vec![]),
        "{what}: objects only kustomize / only the chart installs"
    );
    for (key, k) in &kustomized {
        if let Some(diff) = first_difference("", k, &charted[key]) {
            panic!("{what}: {key} differs at {diff}");
        }
    }
    eprintln!("chart[{what}]: helm template and kubectl kustomize: the same {} objects", kustomized.len());
    kustomized.len()
}

#[test]
fn the_chart_lints_and_installs_what_kustomize_installs_for_each_scope() {
    for sets in [&[][..], &["scope=namespace", "watchNamespace=databases", "replicas=1"][..]] {
        let out = helm(&[&["lint", "--strict", CHART][..], &sets_args(sets)[..]].concat());
        assert!(
            out.status.success() && text(&out).contains("0 chart(s) failed"),
            "helm lint {sets:?}: {}",
            text(&out)
        );
    }
    let all = assert_same_objects("cluster-wide", &[], &[]);
    let namespaced = assert_same_objects(
        "namespaced",
        &["rbac/namespaced"],
        &["scope=namespace", "watchNamespace=databases"],
    );
    assert_eq!(
        namespaced, all,
        "namespaced: the ClusterRole and its binding replaced by a Role and its binding"
    );
    let ns = objects(&template_ok(&["scope=namespace", "watchNamespace=databases"]));
    assert!(
        ns.contains_key("Role databases/stateward") && ns.contains_key("RoleBinding databases/stateward")
    );
    assert!(!ns.keys().any(|k| k == "ClusterRole /stateward" || k == "ClusterRoleBinding /stateward"));
    // A set of namespaces: the Role and its binding in each, the operator told to watch them,
    // nothing cluster-wide.
    let set = ["scope=namespace", "watchNamespaces={shop,billing}"];
    let two = objects(&template_ok(&set));
    for ns in ["shop", "billing"] {
        assert!(
            two.contains_key(&format!("Role {ns}/stateward"))
                && two.contains_key(&format!("RoleBinding {ns}/stateward")),
            "no Role and binding in {ns}: {:?}",
            two.keys().collect::<Vec<_>>()
        );
    }
    assert!(!two.keys().any(|k| k == "ClusterRole /stateward" || k == "ClusterRoleBinding /stateward"));
    assert!(
        !two.keys().any(|k| k.starts_with("Role databases/")),
        "watchNamespace left in: {:?}",
        two.keys()
    );
    let (_, container) = operator_container(&set);
    let env = container["env"].as_array().cloned().unwrap_or_default();
    assert!(
        env.iter().any(|e| e["name"] == "STATEWARD_NAMESPACE" && e["value"] == "shop,billing"),
        "{env:?}"
    );
    let otlp = "otlp.endpoint=http://otel-collector.stateward-observability.svc:4318";
    assert_same_objects("otlp", &["observability/operator-otel"], &[otlp]);
    // The local real-pods cluster's install: its image, never pulled, and the floor's data
    // allowing the local images (what realpods::in_cluster installs both ways).
    let local =
        ["image.repository=localhost/stateward/operator", "image.tag=local", "image.pullPolicy=Never"];
    let data = workspace_root().join("tests/cluster/operator-overlay/data.json");
    let out = helm(
        &[
            &["template", "stateward", CHART, "-n", "stateward-system"][..],
            &sets_args(&local)[..],
            &["--set-file", &format!("policyFloorData={}", data.display())],
        ]
        .concat(),
    );
    assert!(out.status.success(), "{}", text(&out));
    let charted = without_helm_marks(objects(&String::from_utf8(out.stdout).unwrap()));
    // The pod starts only on the floor data it was installed with: its digest is in the spec.
    let pinned = format!(
        "--policy-data-sha256={}",
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(std::fs::read(&data).unwrap()))
    );
    let container =
        &charted["Deployment stateward-system/stateward"]["spec"]["template"]["spec"]["containers"][0];
    assert!(
        args_of(container).contains(&pinned),
        "the floor's digest is not pinned: {:?}",
        args_of(container)
    );
    let mut kustomized = objects(&kustomize(&["tests/cluster/operator-overlay"]));
    kustomized.remove("Namespace /stateward-system");
    assert_eq!(kustomized.keys().collect::<Vec<_>>(), charted.keys().collect::<Vec<_>>(), "local install");
    for (key, k) in &kustomized {
        assert_eq!(first_difference("", k, &charted[key]), None, "local install: {key}");
    }
    // Another namespace and name: every reference to the operator's namespace follows it.
    let elsewhere = helm(&["template", "ops", CHART, "--namespace", "ops-system"]);
    assert!(elsewhere.status.success(), "{}", text(&elsewhere));
    let rendered = String::from_utf8(elsewhere.stdout).unwrap();
    assert!(!rendered.contains("stateward-system"), "a reference to stateward-system left in the chart");
    let ops = objects(&rendered);
    assert_eq!(
        ops["ValidatingWebhookConfiguration /stateward"]
            .pointer("/webhooks/0/clientConfig/service/namespace"),
        Some(&Value::from("ops-system"))
    );
    let crd = &ops["CustomResourceDefinition /postgresclusters.stateward.dev"];
    assert_eq!(crd.pointer("/metadata/annotations/helm.sh~1resource-policy"), Some(&Value::from("keep")));
    assert_eq!(crd.pointer("/metadata/labels/app.kubernetes.io~1instance"), Some(&Value::from("ops")));
}

/// The operator container of a rendered chart.
fn operator_container(sets: &[&str]) -> (BTreeMap<String, Value>, Value) {
    let objects = objects(&template_ok(sets));
    let container =
        objects["Deployment stateward-system/stateward"]["spec"]["template"]["spec"]["containers"][0].clone();
    (objects, container)
}

fn args_of(container: &Value) -> Vec<String> {
    container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect()
}

#[test]
fn values_only_the_chart_has_change_what_they_name() {
    let (all, base) = operator_container(&[]);
    assert!(all.contains_key("PodDisruptionBudget stateward-system/stateward"));
    let (one, container) =
        operator_container(&["replicas=1", "image.repository=example.org/stateward", "image.tag=1.2.3"]);
    assert!(
        !one.contains_key("PodDisruptionBudget stateward-system/stateward"),
        "one replica: a PDB would block drains"
    );
    assert_eq!(one["Deployment stateward-system/stateward"]["spec"]["replicas"], 1);
    assert_eq!(container["image"], "example.org/stateward:1.2.3");

    let (_, stdout) = operator_container(&["audit.sink=stdout"]);
    let dropped: Vec<String> = args_of(&base).into_iter().filter(|a| !args_of(&stdout).contains(a)).collect();
    assert_eq!(
        dropped,
        ["--audit-log=/var/lib/stateward/audit/audit.jsonl"],
        "stdout sink: only the file goes"
    );

    let pin = format!("redis=sha256:{}", "a".repeat(64));
    let (_, pinned) = operator_container(&["requirePluginPins=true", &format!("pluginPins[0]={pin}")]);
    let added: Vec<String> = args_of(&pinned).into_iter().filter(|a| !args_of(&base).contains(a)).collect();
    assert_eq!(added, ["--require-plugin-pins".to_string(), format!("--pin-plugin={pin}")]);

    // A hot-loaded plugin: the same ConfigMap `stateward plugin pack` makes, the chart's labels aside.
    let wasm = crate::support::wasm("stateward-redis");
    let packed = Command::new(env!("CARGO_BIN_EXE_stateward"))
        .env("STATEWARD_WASM_CACHE", crate::support::wasm_cache_dir())
        .args(["plugin", "pack", "--name", "redis", "--namespace", "stateward-system"])
        .arg(&wasm)
        .output()
        .unwrap();
    assert!(packed.status.success(), "{}", text(&packed));
    let packed: Value = yaml_serde::from_slice(&packed.stdout).unwrap();
    let b64 = std::env::temp_dir().join(format!("stateward-chart-redis-{}.b64", std::process::id()));
    std::fs::write(&b64, packed["binaryData"]["plugin.wasm.gz"].as_str().unwrap()).unwrap();
    let digest = packed["metadata"]["annotations"]["stateward.dev/sha256"].as_str().unwrap();
    let out = helm(&[
        "template",
        "stateward",
        CHART,
        "--namespace",
        "stateward-system",
        "--set",
        "plugins[0].name=redis",
        "--set",
        &format!("plugins[0].sha256={digest}"),
        "--set-file",
        &format!("plugins[0].wasmGz={}", b64.display()),
        "--set",
        "policyConfigMaps.team-rules.team\\.rego=package stateward.team",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let charted = without_helm_marks(objects(&String::from_utf8(out.stdout).unwrap()));
    let mut packed = packed;
    packed["metadata"].as_object_mut().unwrap().remove("creationTimestamp");
    assert_eq!(
        first_difference("", &packed, &charted["ConfigMap stateward-system/stateward-plugin-redis"]),
        None
    );
    let policy = &charted["ConfigMap stateward-system/team-rules"];
    assert_eq!(policy["metadata"]["labels"]["stateward.dev/policy"], "true");
    assert_eq!(policy["data"]["team.rego"], "package stateward.team");
}

#[test]
fn values_the_schema_refuses_name_their_field() {
    for (set, field) in [
        ("scope=everywhere", "scope"),
        ("replicas=0", "replicas"),
        ("replica=2", "replica"),
        ("watchNamespace=Not_A_Name", "watchNamespace"),
        ("watchNamespaces={ok,Not_A_Name}", "watchNamespaces"),
        ("audit.sink=syslog", "sink"),
        ("pluginPins[0]=redis", "pluginPins"),
        ("otlp.endpoint=collector:4318", "endpoint"),
    ] {
        let out = template(&[set]);
        let said = text(&out);
        assert!(!out.status.success(), "{set} was accepted");
        assert!(said.contains(field), "{set}: the error names {field}: {said}");
    }
}

/// The chart's files/ are links into deploy/, so there is one copy of every manifest.
#[test]
fn the_chart_reads_deploy_through_links() {
    let files = workspace_root().join(CHART).join("files");
    for dir in ["crds", "operator", "rbac", "webhook"] {
        let link = files.join(dir);
        let target = std::fs::read_link(&link).unwrap_or_else(|e| panic!("{}: {e}", link.display()));
        assert_eq!(target, PathBuf::from("../../..").join(dir), "{}", link.display());
        assert!(Path::new(&link).join(".").is_dir());
    }
}
