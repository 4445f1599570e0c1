//! The operator's RBAC (deploy/rbac) is least privilege and enough, checked against the code.
//!
//! - [`PERMISSIONS`] is the table of every API permission `stateward run` uses, each row with
//!   the code that makes the call. `rbac_yaml_grants_exactly_the_table` checks that the YAML
//!   grants exactly that (no more: no wildcards, no Secret `get`, nothing cluster-scoped) and
//!   that the namespaced Role equals the ClusterRole.
//! - `api_calls_in_host_src_match_the_table` is a tripwire: it counts the kube API calls in
//!   host/src; when the code gains or loses one, it fails until the table (and the YAML) are
//!   reviewed and [`API_CALLS`] updated.
//! - `namespaced_role_is_enough` (live, local cluster): a ServiceAccount bound only to
//!   deploy/rbac/namespaced and deploy/rbac/operator-namespace runs `stateward run
//!   --namespace` until deploy/samples/redis.yaml is Available with 3 ready replicas, without
//!   one `forbidden` in the operator log, and is denied everything outside the table.
//! - `deploy_manifests_pass_server_validation` (live): `kubectl kustomize deploy` builds and
//!   the API server accepts every object (server-side dry run).
//!
//! Run: `cargo test -p stateward --test kwok -- rbac:: --nocapture` (after scripts/build-plugins).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret, ServiceAccount};
use kube::api::{ListParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::Api;
use serde_json::{json, Value};
use stateward_testkit::TestEnv;

/// Where a permission is granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// Every watched namespace: the ClusterRole (default mode) or the namespaced Role.
    Watched,
    /// The operator's own namespace only (deploy/rbac/operator-namespace).
    Operator,
}

/// One row of the permission table.
struct Grant {
    scope: Scope,
    group: &'static str,
    resources: &'static [&'static str],
    verbs: &'static [&'static str],
    /// `resourceNames`; empty means any name.
    names: &'static [&'static str],
    /// The code that makes these calls (file: function).
    code: &'static str,
}

const CHILDREN: &[&str] =
    &["statefulsets", "services", "configmaps", "persistentvolumeclaims", "poddisruptionbudgets"];
/// The plurals of deploy/crds (checked against the CRD files).
const CRS: &[&str] = &["postgresclusters", "redisclusters", "elasticsearchclusters"];
const CRS_STATUS: &[&str] =
    &["postgresclusters/status", "redisclusters/status", "elasticsearchclusters/status"];
const CRS_FINALIZERS: &[&str] =
    &["postgresclusters/finalizers", "redisclusters/finalizers", "elasticsearchclusters/finalizers"];
/// Name of the leader Lease (host/src/main.rs `LeaderConfig::new(.., "stateward-leader", ..)`).
const LEASE: &str = "stateward-leader";

/// Every permission `stateward run` needs, derived from the code. The YAML must grant exactly
/// these (group "" is the core group; children rows are expanded by [`child_group`]).
const PERMISSIONS: &[Grant] = &[
    Grant {
        scope: Scope::Watched,
        group: "*children*",
        resources: CHILDREN,
        verbs: &["list", "watch"],
        names: &[],
        code: "children.rs: Children::start — watcher(watched::api: all_with|namespaced_with) per owned kind and scope, \
               label selector stateward.dev/instance, after a list of one; and \
               controller/apply.rs: Applier::apply — list_metadata by metadata.name before creating",
    },
    Grant {
        scope: Scope::Watched,
        group: "*children*",
        resources: CHILDREN,
        verbs: &["patch", "create"],
        names: &[],
        code:
            "controller/apply.rs: Applier::apply — api.patch(.., PatchParams::apply(\"stateward\").force(), \
               Patch::Apply) on any owned kind (plugins/sdk/src/driver.rs OWNS); an apply that creates \
               the object is also authorized as create (measured: 403 without it)",
    },
    Grant {
        scope: Scope::Watched,
        group: "*children*",
        resources: CHILDREN,
        verbs: &["delete"],
        names: &[],
        code: "controller/apply.rs: Applier::delete — api.delete(name, background) on any owned kind",
    },
    Grant {
        scope: Scope::Watched,
        group: "",
        resources: &["secrets"],
        verbs: &["list", "watch", "patch", "delete"],
        names: &[],
        code: "children.rs (cache), controller/apply.rs: Applier::apply/delete, and \
               Applier::ensure_secret — api.patch(Patch::Merge) adding missing keys",
    },
    Grant {
        scope: Scope::Watched,
        group: "",
        resources: &["secrets"],
        verbs: &["create"],
        names: &[],
        code: "controller/apply.rs: Applier::ensure_secret — api.create(secret) once, 409 tolerated \
               (and server-side apply creating one)",
    },
    Grant {
        scope: Scope::Watched,
        group: "",
        resources: &["pods"],
        verbs: &["list", "watch", "patch", "delete"],
        names: &[],
        code: "children.rs: the cache of v1 Pod, which the plugins own to observe and ask their pods \
               (watcher, list_metadata); controller/apply.rs: Applier::label_pod — a merge patch of \
               labels and annotations only; Applier::delete — a plan's delete of a Pod (the \
               PostgreSQL roll replaces its pods itself)",
    },
    Grant {
        scope: Scope::Watched,
        group: "",
        resources: &["pods/exec"],
        verbs: &["get", "create"],
        names: &[],
        code: "requests/exec.rs: Exec::run — Api::<Pod>::exec (a websocket upgrade, authorized as get, \
               and as create by newer API servers)",
    },
    Grant {
        scope: Scope::Watched,
        group: "stateward.dev",
        resources: CRS,
        verbs: &["list", "watch"],
        names: &[],
        code:
            "controller/mod.rs: start_controllers() — Controller::new_with(watched::api) per watched scope; \
               webhook/admission.rs: name_taken — list_metadata by metadata.name of the other kinds on CREATE",
    },
    Grant {
        scope: Scope::Watched,
        group: "stateward.dev",
        resources: CRS,
        verbs: &["patch"],
        names: &[],
        code: "controller/reconcile.rs: patch_cr — JSON patch adding/removing the finalizer",
    },
    Grant {
        scope: Scope::Watched,
        group: "stateward.dev",
        resources: CRS_STATUS,
        verbs: &["patch"],
        names: &[],
        code: "controller/reconcile.rs: write_status — patch_status(Patch::Merge); requests/durable.rs: the one-shot records",
    },
    Grant {
        scope: Scope::Watched,
        group: "stateward.dev",
        resources: CRS_FINALIZERS,
        verbs: &["update"],
        names: &[],
        code: "controller/apply.rs: owner_reference — blockOwnerDeletion: true; checked only by the \
               OwnerReferencesPermissionEnforcement admission plugin (off in stock kube-apiserver)",
    },
    Grant {
        scope: Scope::Watched,
        group: "events.k8s.io",
        resources: &["events"],
        verbs: &["create"],
        names: &[],
        code: "telemetry/events.rs: Events::publish — kube-runtime Recorder::publish, a recorder per \
               Event (create only)",
    },
    Grant {
        scope: Scope::Operator,
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["get", "update"],
        names: &[LEASE],
        code: "leader.rs: try_acquire_or_renew/release — api.get_opt(lease), api.replace(lease)",
    },
    Grant {
        scope: Scope::Operator,
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["create"],
        names: &[],
        code: "leader.rs: try_acquire_or_renew — api.create(lease) when absent (create cannot be \
               limited by resourceNames)",
    },
    Grant {
        scope: Scope::Operator,
        group: "",
        resources: &["configmaps"],
        verbs: &["list", "watch"],
        names: &[],
        code: "reload/mod.rs: Reloader::configmaps — watcher over ConfigMaps labelled \
               stateward.dev/plugin or stateward.dev/policy=true (list + watch)",
    },
    Grant {
        scope: Scope::Operator,
        group: "events.k8s.io",
        resources: &["events"],
        verbs: &["create"],
        names: &[],
        code: "reload/mod.rs: Reloader::event — Recorder::publish on a plugin or policy ConfigMap \
               (telemetry/events.rs: created once each)",
    },
];

/// API group of a child kind.
fn child_group(resource: &str) -> &'static str {
    match resource {
        "statefulsets" => "apps",
        "poddisruptionbudgets" => "policy",
        _ => "",
    }
}

/// Tripwire over the files of host/src that use kube: (file, token, occurrences). Tokens are the kube API calls the
/// code can make; some counts include look-alikes (noted). When this fails, review the new
/// or removed call, update [`PERMISSIONS`] and deploy/rbac, then this list.
const API_CALLS: &[(&str, &str, usize)] = &[
    // Applier::apply (SSA), Applier::ensure_secret (merge patch), Applier::label_pod (merge
    // patch of a Pod's labels and annotations).
    ("controller/apply.rs", ".patch(", 3),
    // Applier::ensure_secret.
    ("controller/apply.rs", ".create(", 1),
    // Applier::delete.
    ("controller/apply.rs", ".delete(", 1),
    // Not an API call: APPLIED_HASH.replace('/', "~1").
    ("controller/apply.rs", ".replace(", 1),
    // Applier::resource: discovery of /api/v1, /apis/G/V (system:discovery).
    ("controller/apply.rs", "pinned_kind", 1),
    ("controller/apply.rs", "discovery::", 1),
    ("controller/apply.rs", "Api::namespaced", 3),
    // Applier::apply: is an object of the child's name already there, and whose (list with
    // a field selector on the name: the list permission the caches need, no get).
    ("controller/apply.rs", ".list_metadata(", 1),
    // The child caches: discovery of an owned kind, a list of one to prove the permission,
    // then the watch, in each watched scope (watched.rs: Api::namespaced_with, or
    // Api::all_with for every namespace).
    ("children.rs", "watcher(", 1),
    ("watched.rs", "Api::namespaced", 1),
    ("watched.rs", "Api::all", 1),
    ("children.rs", ".list_metadata(", 1),
    ("children.rs", "pinned_kind", 1),
    ("children.rs", "discovery::", 2),
    // Not API calls: JSON-pointer escaping of a Secret key.
    ("controller/dispatch.rs", ".replace(", 2),
    // A one-shot request's record in the resource's status (sent, then answered); not API
    // calls: JSON-pointer escaping of its id.
    ("requests/durable.rs", ".patch_status(", 2),
    ("requests/durable.rs", ".replace(", 2),
    // A plan's exec request through the API server (pods/exec).
    ("requests/exec.rs", ".exec(", 1),
    ("requests/exec.rs", "Api::namespaced", 1),
    // A controller per kind and watched scope (its Api from watched.rs).
    ("controller/mod.rs", "Controller::new", 1),
    // patch_cr (finalizer).
    ("controller/reconcile.rs", ".patch(", 1),
    ("controller/reconcile.rs", ".patch_status(", 1),
    // Not an API call: ctx.applier.delete(..) (Applier::delete above).
    ("controller/reconcile.rs", ".delete(", 1),
    ("controller/reconcile.rs", "Api::namespaced", 1),
    ("reload/mod.rs", "watcher(", 1),
    ("reload/mod.rs", "Api::namespaced", 1),
    // Not an API call: LiveGate::replace (a new policy bundle).
    ("reload/mod.rs", ".replace(", 1),
    ("telemetry/events.rs", "Recorder::new", 1),
    // Not the operator's: `kubectl stateward` runs with the user's own kubeconfig (discovery of
    // the stateward.dev kinds, get of the resource and of the pod to promote, list of Events,
    // merge patch of the resource), so its calls need no rule of the operator's Roles.
    ("kubectl.rs", "discovery::", 1),
    ("kubectl.rs", ".get_opt(", 2),
    ("kubectl.rs", ".list(", 1),
    ("kubectl.rs", ".patch(", 1),
    ("kubectl.rs", "Api::namespaced", 3),
    // The webhook's own permissions are in deploy/webhook/{clusterrole,role}.yaml (and
    // deploy/webhook/cert-manager/ for --cert-manager); the service certificates
    // (controller/service_certs.rs) use the child permissions above (the caches' list/watch,
    // create and patch of Secrets, patch of StatefulSets) and the webhook Role's get of the
    // shared service CA of earlier releases.
    // Admission on CREATE: is the name taken by another kind (list of the custom resources).
    ("webhook/admission.rs", ".list_metadata(", 1),
    ("webhook/admission.rs", "Api::namespaced", 1),
    // Issuer/Certificate server-side apply (cert-manager mode).
    ("webhook/certmanager.rs", ".patch(", 1),
    ("webhook/certmanager.rs", "Api::namespaced", 1),
    // The CA/serving Secret stateward-webhook-tls: get, create when absent, replace (CAS).
    ("webhook/certs.rs", ".create(", 1),
    ("webhook/certs.rs", ".get_opt(", 1),
    ("webhook/certs.rs", ".replace(", 1),
    ("webhook/certs.rs", "Api::namespaced", 1),
    // ValidatingWebhookConfiguration apply and the probe before a refresh (an empty merge
    // patch: the same permission), CRD conversion caBundle merge patch.
    ("webhook/config.rs", ".patch(", 3),
    ("webhook/config.rs", "Api::all", 1),
    // Reads the webhook Secret (readiness of the certificate).
    ("webhook/mod.rs", ".get_opt(", 1),
    ("webhook/mod.rs", "Api::namespaced", 1),
    // CertificateKeeper (a controller, fed by the child caches above): an instance's CA Secret
    // created the first time and merge-patched on renewal (CAS), the shared CA of earlier
    // releases read (get), certificate Secrets merge-patched (the controller stamps the
    // StatefulSets as it applies them). Not an API call: JSON-pointer escaping of an
    // annotation's name.
    ("controller/service_certs.rs", ".get_opt(", 1),
    ("controller/service_certs.rs", ".create(", 1),
    ("controller/service_certs.rs", ".replace(", 1),
    ("controller/service_certs.rs", ".patch(", 2),
    ("controller/service_certs.rs", "Api::namespaced", 3),
    // Lease create / replace (acquire, renew, release) / get_opt (twice).
    ("leader.rs", ".create(", 1),
    ("leader.rs", ".replace(", 2),
    ("leader.rs", ".get_opt(", 2),
    ("leader.rs", "Api::namespaced", 1),
];

const TOKENS: &[&str] = &[
    ".patch(",
    ".patch_status(",
    ".patch_subresource(",
    ".create(",
    ".create_subresource(",
    ".delete(",
    ".delete_collection(",
    ".replace(",
    ".replace_status(",
    ".get_opt(",
    ".get_status(",
    ".get_metadata(",
    ".list(",
    ".list_metadata(",
    ".watch(",
    "watcher(",
    "Recorder::new",
    "pinned_kind",
    "discovery::",
    "Api::namespaced",
    "Api::all",
    "Api::default_namespaced",
    "Controller::new",
    ".evict(",
    ".exec(",
    "create_token_request",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn load(rel: &str) -> anyhow::Result<Vec<Value>> {
    let path = root().join(rel);
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(stateward::render::parse_documents(&text, rel)?)
}

fn load_one(rel: &str) -> anyhow::Result<Value> {
    let mut docs = load(rel)?;
    ensure!(docs.len() == 1, "{rel}: expected one document, found {}", docs.len());
    Ok(docs.remove(0))
}

/// (apiGroup, resource, verb, resourceName or "" for any).
type Perm = (String, String, String, String);

fn expected(scope: Scope) -> BTreeSet<Perm> {
    let mut out = BTreeSet::new();
    for g in PERMISSIONS.iter().filter(|g| g.scope == scope) {
        for r in g.resources {
            let group = if g.group == "*children*" { child_group(r) } else { g.group };
            for v in g.verbs {
                let names: Vec<&str> = if g.names.is_empty() { vec![""] } else { g.names.to_vec() };
                for n in names {
                    out.insert((group.to_string(), (*r).to_string(), (*v).to_string(), n.to_string()));
                }
            }
        }
    }
    out
}

fn strings(v: &Value, key: &str) -> Vec<String> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default()
}

/// Every (group, resource, verb, name) a Role/ClusterRole grants; fails on wildcards and
/// non-resource URLs.
fn granted(role: &Value, what: &str) -> anyhow::Result<BTreeSet<Perm>> {
    let mut out = BTreeSet::new();
    let rules = role["rules"].as_array().with_context(|| format!("{what}: no rules"))?;
    for rule in rules {
        ensure!(rule.get("nonResourceURLs").is_none(), "{what}: nonResourceURLs in {rule}");
        let (groups, resources, verbs) =
            (strings(rule, "apiGroups"), strings(rule, "resources"), strings(rule, "verbs"));
        ensure!(
            !groups.is_empty() && !resources.is_empty() && !verbs.is_empty(),
            "{what}: incomplete rule {rule}"
        );
        for s in groups.iter().chain(&resources).chain(&verbs) {
            ensure!(!s.contains('*'), "{what}: wildcard {s:?} in {rule}");
        }
        let mut names = strings(rule, "resourceNames");
        if names.is_empty() {
            names.push(String::new());
        }
        for g in &groups {
            for r in &resources {
                for v in &verbs {
                    for n in &names {
                        out.insert((g.clone(), r.clone(), v.clone(), n.clone()));
                    }
                }
            }
        }
    }
    Ok(out)
}

fn diff(what: &str, got: &BTreeSet<Perm>, want: &BTreeSet<Perm>) -> anyhow::Result<()> {
    let extra: Vec<_> = got.difference(want).collect();
    let missing: Vec<_> = want.difference(got).collect();
    ensure!(
        extra.is_empty() && missing.is_empty(),
        "{what} differs from the table in host/tests/kwok/rbac.rs\n  granted but not in the table: {extra:?}\n  \
         in the table but not granted: {missing:?}"
    );
    Ok(())
}

fn check_binding(binding: &Value, kind: &str, role: &str, what: &str) -> anyhow::Result<()> {
    ensure!(
        binding["roleRef"]["kind"] == kind && binding["roleRef"]["name"] == role,
        "{what}: roleRef {}",
        binding["roleRef"]
    );
    ensure!(
        binding["subjects"]
            == json!([{"kind": "ServiceAccount", "name": "stateward", "namespace": "stateward-system"}]),
        "{what}: subjects must be exactly the operator's ServiceAccount, got {}",
        binding["subjects"]
    );
    Ok(())
}

/// Static: the YAML grants exactly the table, in the right places, to the right identity.
#[test]
fn rbac_yaml_grants_exactly_the_table() -> anyhow::Result<()> {
    let watched = expected(Scope::Watched);
    let operator = expected(Scope::Operator);

    let cluster_role = load_one("deploy/rbac/cluster/clusterrole.yaml")?;
    ensure!(cluster_role["kind"] == "ClusterRole" && cluster_role["metadata"]["name"] == "stateward");
    ensure!(cluster_role.get("aggregationRule").is_none(), "the ClusterRole must not aggregate others");
    let cluster = granted(&cluster_role, "ClusterRole stateward")?;
    diff("deploy/rbac/cluster/clusterrole.yaml", &cluster, &watched)?;

    let role = load_one("deploy/rbac/namespaced/role.yaml")?;
    ensure!(role["kind"] == "Role" && role["metadata"]["name"] == "stateward");
    ensure!(role["metadata"].get("namespace").is_none(), "namespaced/role.yaml must not pin a namespace");
    diff("deploy/rbac/namespaced/role.yaml", &granted(&role, "Role stateward")?, &watched)?;

    let lease_role = load_one("deploy/rbac/operator-namespace/role.yaml")?;
    ensure!(lease_role["kind"] == "Role" && lease_role["metadata"]["namespace"] == "stateward-system");
    diff(
        "deploy/rbac/operator-namespace/role.yaml",
        &granted(&lease_role, "Role stateward-leader-election")?,
        &operator,
    )?;

    check_binding(
        &load_one("deploy/rbac/cluster/clusterrolebinding.yaml")?,
        "ClusterRole",
        "stateward",
        "ClusterRoleBinding",
    )?;
    let rb = load_one("deploy/rbac/namespaced/rolebinding.yaml")?;
    ensure!(
        rb["metadata"].get("namespace").is_none(),
        "namespaced/rolebinding.yaml must not pin a namespace"
    );
    check_binding(&rb, "Role", "stateward", "namespaced RoleBinding")?;
    let rb = load_one("deploy/rbac/operator-namespace/rolebinding.yaml")?;
    ensure!(rb["metadata"]["namespace"] == "stateward-system");
    check_binding(&rb, "Role", "stateward-leader-election", "operator-namespace RoleBinding")?;

    // Least privilege beyond set equality: the things that would hurt most if they crept in.
    for (g, r, v, _) in &cluster {
        ensure!(!(r == "secrets" && (v == "get" || v == "update")), "Secrets {v} must not be granted");
        ensure!(
            !matches!(v.as_str(), "escalate" | "bind" | "impersonate" | "deletecollection"),
            "verb {v} on {g}/{r}"
        );
        ensure!(g != "rbac.authorization.k8s.io" && g != "apiextensions.k8s.io", "{g} must not be granted");
    }

    // The custom-resource rows cover exactly the CRDs that deploy/crds installs.
    let mut plurals = BTreeSet::new();
    for entry in std::fs::read_dir(root().join("deploy/crds"))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let rel =
                format!("deploy/crds/{}", path.file_name().and_then(|f| f.to_str()).unwrap_or_default());
            let crd = load_one(&rel)?;
            ensure!(crd["spec"]["group"] == "stateward.dev", "{rel}: group");
            ensure!(
                crd["spec"]["scope"] == "Namespaced",
                "{rel}: a cluster-scoped CRD needs a ClusterRole in namespaced mode"
            );
            plurals.insert(crd["spec"]["names"]["plural"].as_str().unwrap_or_default().to_string());
        }
    }
    let table: BTreeSet<String> = CRS.iter().map(|s| (*s).to_string()).collect();
    ensure!(plurals == table, "deploy/crds plurals {plurals:?} != table {table:?}");
    for g in PERMISSIONS {
        println!(
            "{:?} {} {:?} {:?} {:?}\n    <- {}",
            g.scope, g.group, g.resources, g.verbs, g.names, g.code
        );
    }
    println!(
        "RBAC: {} permissions per watched namespace, {} in the operator namespace, all as in the table",
        watched.len(),
        operator.len()
    );
    Ok(())
}

/// Static: deploy/kustomization.yaml installs every CRD, the cluster-wide RBAC, the
/// operator-namespace RBAC, the operator and its webhook, the users' aggregated roles, and not
/// the namespaced variant.
#[test]
fn kustomization_lists_the_cluster_wide_install() -> anyhow::Result<()> {
    let kustomization = load_one("deploy/kustomization.yaml")?;
    let listed: BTreeSet<String> = strings(&kustomization, "resources").into_iter().collect();
    for rel in &listed {
        ensure!(root().join("deploy").join(rel).is_file(), "deploy/kustomization.yaml lists missing {rel}");
    }
    let mut want = BTreeSet::new();
    for dir in ["crds", "rbac/cluster", "rbac/operator-namespace", "rbac/users", "operator", "webhook"] {
        for entry in std::fs::read_dir(root().join("deploy").join(dir))? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if name.ends_with(".yaml") {
                want.insert(format!("{dir}/{name}"));
            }
        }
    }
    ensure!(listed == want, "deploy/kustomization.yaml resources {listed:?}, expected {want:?}");
    Ok(())
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            rust_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// Static tripwire: the kube API calls in host/src are still the ones the table was made from.
#[test]
fn api_calls_in_host_src_match_the_table() -> anyhow::Result<()> {
    let src = root().join("host/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files)?;
    let mut found: BTreeMap<(String, String), usize> = BTreeMap::new();
    for file in files {
        let text = std::fs::read_to_string(&file)?;
        // A file that does not use kube cannot call the API (keeps look-alikes elsewhere out).
        if !text.contains("kube::") && !text.contains("Api<") {
            continue;
        }
        let rel = file.strip_prefix(&src)?.to_string_lossy().replace('\\', "/");
        for token in TOKENS {
            let n = text.matches(token).count();
            if n > 0 {
                found.insert((rel.clone(), (*token).to_string()), n);
            }
        }
    }
    let want: BTreeMap<(String, String), usize> =
        API_CALLS.iter().map(|(f, t, n)| (((*f).to_string(), (*t).to_string()), *n)).collect();
    let changed: Vec<String> = found
        .keys()
        .chain(want.keys())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .filter(|k| found.get(*k) != want.get(*k))
        .map(|(f, t)| {
            format!(
                "host/src/{f}: `{t}` now {} (table: {})",
                found.get(&(f.clone(), t.clone())).unwrap_or(&0),
                want.get(&(f.clone(), t.clone())).unwrap_or(&0)
            )
        })
        .collect();
    ensure!(
        changed.is_empty(),
        "kube API calls in host/src changed since the RBAC table was derived; review each, update PERMISSIONS \
         and deploy/rbac if it needs a permission, then API_CALLS in host/tests/kwok/rbac.rs:\n  {}",
        changed.join("\n  ")
    );
    Ok(())
}

/// deploy/samples/redis.yaml as a cluster without servers can serve it: kwok's pods run none,
/// so no replica ever answers linked, and creation must not wait for redundancy.
fn sample_without_servers() -> anyhow::Result<String> {
    let sample = std::fs::read_to_string(root().join("deploy/samples/redis.yaml"))?;
    ensure!(sample.contains("\nspec:\n"), "the sample has no spec: {sample}");
    Ok(sample.replace("\nspec:\n", "\nspec:\n  waitForRedundancy: false\n"))
}

fn kubectl_output(mut cmd: Command, stdin: Option<&str>) -> anyhow::Result<String> {
    let out = stateward_testkit::run_kubectl(&mut cmd, stdin)
        .context("running kubectl (build it with tests/cluster/build)")?;
    ensure!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Live: `kubectl kustomize deploy` builds, holds what the operator needs, and the API server
/// accepts every object (server-side dry run; namespaced objects moved into the test
/// namespace, as stateward-system need not exist).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_manifests_pass_server_validation() -> anyhow::Result<()> {
    let env = TestEnv::new("rbac-deploy").await?;
    let mut cmd = env.kubectl();
    cmd.arg("kustomize").arg(root().join("deploy"));
    let built = stateward::render::parse_documents(&kubectl_output(cmd, None)?, "kustomize output")?;
    let kinds: BTreeSet<String> = built
        .iter()
        .map(|d| {
            format!(
                "{}/{}",
                d["kind"].as_str().unwrap_or_default(),
                d["metadata"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect();
    for want in [
        "Namespace/stateward-system",
        "ServiceAccount/stateward",
        "ClusterRole/stateward",
        "ClusterRoleBinding/stateward",
        "Role/stateward-leader-election",
        "RoleBinding/stateward-leader-election",
        "Deployment/stateward",
        "PodDisruptionBudget/stateward",
        "Service/stateward-metrics",
        "CustomResourceDefinition/postgresclusters.stateward.dev",
        "CustomResourceDefinition/redisclusters.stateward.dev",
        "CustomResourceDefinition/elasticsearchclusters.stateward.dev",
    ] {
        ensure!(kinds.contains(want), "kustomize deploy lacks {want}: {kinds:?}");
    }
    let deployment = built.iter().find(|d| d["kind"] == "Deployment").context("no Deployment")?;
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    ensure!(deployment["spec"]["replicas"] == 2, "replicas");
    ensure!(pod["serviceAccountName"] == "stateward", "serviceAccountName");
    ensure!(container["args"][0] == "run", "args {}", container["args"]);
    ensure!(
        strings(container, "args").iter().any(|a| a == "--http-addr=0.0.0.0:8080"),
        "args {}",
        container["args"]
    );
    let env_vars: BTreeMap<String, String> = container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let field =
                e.pointer("/valueFrom/fieldRef/fieldPath").and_then(Value::as_str).unwrap_or_default();
            (e["name"].as_str().unwrap_or_default().to_string(), field.to_string())
        })
        .collect();
    ensure!(env_vars.get("POD_NAME").map(String::as_str) == Some("metadata.name"), "POD_NAME {env_vars:?}");
    ensure!(env_vars.get("POD_NAMESPACE").map(String::as_str) == Some("metadata.namespace"), "POD_NAMESPACE");
    ensure!(container["livenessProbe"]["httpGet"]["path"] == "/healthz", "liveness");
    ensure!(container["readinessProbe"]["httpGet"]["path"] == "/readyz", "readiness");
    ensure!(container["securityContext"]["readOnlyRootFilesystem"] == true, "read-only root fs");
    ensure!(pod["securityContext"]["runAsNonRoot"] == true, "non-root");
    // The audit log on a volume of each pod, its head signed (finding 7; why a pod volume:
    // deploy/operator/deployment.yaml).
    let args = strings(container, "args");
    ensure!(
        args.iter().any(|a| a.starts_with("--audit-log=/var/lib/stateward/audit/")),
        "audit log {args:?}"
    );
    ensure!(args.iter().any(|a| a.starts_with("--audit-signing-key=")), "audit signing key {args:?}");
    let audit_mount = container["volumeMounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["mountPath"] == "/var/lib/stateward/audit"))
        .context("no volume at /var/lib/stateward/audit")?;
    let audit_volume = pod["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == audit_mount["name"]))
        .context("the audit mount names no volume")?;
    ensure!(audit_volume["emptyDir"].is_object(), "audit volume {audit_volume}");
    // Two replicas, and a drain keeps one of them.
    let pdb = built.iter().find(|d| d["kind"] == "PodDisruptionBudget").context("no PodDisruptionBudget")?;
    ensure!(pdb["spec"]["minAvailable"] == 1, "PDB {pdb}");
    ensure!(
        pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"],
        "the PDB selects other pods than the Deployment: {pdb}"
    );
    ensure!(
        container["resources"]["requests"].is_object() && container["resources"]["limits"].is_object(),
        "resources"
    );

    let mut docs = String::new();
    for mut doc in built {
        if doc["metadata"]["namespace"] == "stateward-system" {
            doc["metadata"]["namespace"] = json!(env.namespace);
        }
        docs.push_str(&serde_json::to_string(&doc)?);
        docs.push('\n');
    }
    let mut cmd = env.kubectl();
    cmd.args([
        "apply",
        "--dry-run=server",
        "--server-side",
        "--force-conflicts",
        "--field-manager",
        "stateward-rbac-test",
        "-f",
        "-",
    ]);
    let out = kubectl_output(cmd, Some(&docs))?;
    println!("server-side dry run of kustomize deploy:\n{out}");
    Ok(())
}

/// `stateward run` as a child process, SIGKILLed on drop.
struct Operator {
    child: Child,
    log: PathBuf,
    port: u16,
}

impl Operator {
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn tail(&self, lines: usize) -> String {
        let text = self.log_text();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn readyz(&self) -> bool {
        use std::io::Read as _;
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        if s.write_all(b"GET /readyz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").is_err() {
            return false;
        }
        let mut buf = String::new();
        let _ = s.read_to_string(&mut buf);
        buf.starts_with("HTTP/1.1 200") || buf.starts_with("HTTP/1.0 200")
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("operator log tail:\n{}", self.tail(60));
        }
    }
}

fn plugin_dir() -> anyhow::Result<PathBuf> {
    // scripts/build-plugins puts them under the cargo target dir, wherever that is.
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("target"));
    let dir = target.join("plugins");
    for p in ["postgres", "redis", "elasticsearch"] {
        let f = dir.join(format!("{p}.wasm"));
        ensure!(
            f.is_file(),
            "{} is missing: build the plugins first with scripts/build-plugins",
            f.display()
        );
    }
    Ok(dir)
}

/// Scratch files of this test (kubeconfig with the token, operator log, audit log).
fn scratch(namespace: &str) -> anyhow::Result<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("rbac-{namespace}"));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// (namespace or "" for all, apiGroup, resource[/subresource], verb, resourceName or "").
type Access<'a> = (&'a str, &'a str, &'a str, &'a str, &'a str);

/// Whether the ServiceAccount may do `access`, by a SubjectAccessReview.
async fn may(env: &TestEnv, user: &str, groups: &[String], access: Access<'_>) -> anyhow::Result<bool> {
    let (namespace, group, resource, verb, name) = access;
    let (resource, subresource) = match resource.split_once('/') {
        Some((r, s)) => (r.to_string(), Some(s.to_string())),
        None => (resource.to_string(), None),
    };
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_string()),
            groups: Some(groups.to_vec()),
            resource_attributes: Some(ResourceAttributes {
                namespace: (!namespace.is_empty()).then(|| namespace.to_string()),
                group: Some(group.to_string()),
                resource: Some(resource),
                subresource,
                verb: Some(verb.to_string()),
                name: (!name.is_empty()).then(|| name.to_string()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let api: Api<SubjectAccessReview> = Api::all(env.client.clone());
    let answer = api.create(&PostParams::default(), &review).await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// Log lines where the API server refused the operator (RBAC says "forbidden").
fn forbidden_lines(log: &str) -> Vec<String> {
    log.lines().filter(|l| l.to_ascii_lowercase().contains("forbidden")).map(str::to_string).collect()
}

fn redis_api(env: &TestEnv) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("stateward.dev", "v1", "RedisCluster"),
        "redisclusters",
    );
    Api::namespaced_with(env.client.clone(), &env.namespace, &ar)
}

/// The operator's identity in the test's namespace: ServiceAccount `stateward` bound only to
/// the shipped namespaced Roles (moved into this namespace), the watched one first changed by
/// `edit`.
fn bind_account(env: &TestEnv, edit: impl Fn(&mut Value)) -> anyhow::Result<()> {
    crate::e2e::account::bind(env, crate::e2e::account::NAMESPACED_ROLES, &[], |role| {
        if role["metadata"]["name"] == "stateward" {
            edit(role);
        }
    })
}

/// `stateward run --namespace` as the bound ServiceAccount (a token in a kubeconfig of its
/// own), until it is ready (leader, caches synced). Also returns its scratch directory.
async fn start_operator(env: &TestEnv, plugins: &Path) -> anyhow::Result<(Operator, PathBuf)> {
    start_operator_watching(env, plugins, &env.namespace).await
}

/// [`start_operator`] watching `watched` (`--namespace`: one namespace or a comma-separated
/// list), its Lease and account in the test's namespace.
async fn start_operator_watching(
    env: &TestEnv,
    plugins: &Path,
    watched: &str,
) -> anyhow::Result<(Operator, PathBuf)> {
    let ns = env.namespace.clone();
    // A token for the ServiceAccount, in a kubeconfig the operator runs with.
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let token = env
        .api::<ServiceAccount>()
        .create_token_request("stateward", &PostParams::default(), &request)
        .await?
        .status
        .context("TokenRequest without status")?
        .token;
    let dir = scratch(&ns)?;
    let kubeconfig = dir.join("kubeconfig");
    crate::e2e::account::token_kubeconfig(env.kubeconfig(), &token, &ns, &kubeconfig)?;

    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let log = dir.join("operator.log");
    let file = std::fs::File::create(&log)?;
    let child = Command::new(env!("CARGO_BIN_EXE_stateward"))
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("STATEWARD_NAMESPACE")
        .env_remove("POD_NAMESPACE")
        .env_remove("POD_NAME")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .args([
            "run",
            "--namespace",
            watched,
            "--lease-namespace",
            &ns,
            "--identity",
            "rbac-test",
            "--plain-logs",
        ])
        .args(["--http-addr", &format!("127.0.0.1:{port}")])
        .arg("--audit-log")
        .arg(dir.join("audit.jsonl"))
        .arg("--plugin-dir")
        .arg(plugins)
        .arg("--wasm-cache")
        .arg(root().join("target/rbac-wasm-cache"))
        .arg("--policy-dir")
        .arg(root().join("policies"))
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .context("starting stateward run")?;
    let mut operator = Operator { child, log, port };

    let started = Instant::now();
    while !operator.readyz() {
        if let Some(status) = operator.child.try_wait()? {
            bail!("operator exited with {status}:\n{}", operator.tail(40));
        }
        ensure!(
            started.elapsed() < Duration::from_secs(120),
            "operator not ready within 120 s:\n{}",
            operator.tail(40)
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    println!("operator ready (leader, caches synced) after {:.1?}", started.elapsed());
    Ok((operator, dir))
}

/// Live: the namespaced Role (plus the Lease Role) is all `stateward run --namespace` needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaced_role_is_enough() -> anyhow::Result<()> {
    let plugins = plugin_dir()?;
    let env = TestEnv::new("rbac-ns").await?;
    let result = namespaced_run(&env, &plugins).await;
    if result.is_err() {
        release(&env);
    }
    result
}

/// CRDs (cluster-scoped) are the admin's job, as in the README's install.
fn apply_crds(env: &TestEnv) -> anyhow::Result<()> {
    let mut cmd = env.kubectl();
    cmd.args(["apply", "--server-side", "--force-conflicts", "--field-manager", "stateward-rbac-test", "-f"])
        .arg(root().join("deploy/crds"));
    kubectl_output(cmd, None)?;
    let crd_names: Vec<String> = CRS.iter().map(|p| format!("{p}.stateward.dev")).collect();
    stateward_testkit::wait_established(env.kubeconfig(), &crd_names)?;
    Ok(())
}

/// Takes `verb` on `resource` out of a Role's rules (a rule naming other resources keeps
/// them, with the verb).
fn without(role: &mut Value, verb: &str, resource: &str) {
    let mut rules = Vec::new();
    for rule in role["rules"].as_array().cloned().unwrap_or_default() {
        let names = strings(&rule, "resources");
        if !names.iter().any(|r| r == resource) {
            rules.push(rule);
            continue;
        }
        let others: Vec<&String> = names.iter().filter(|r| *r != resource).collect();
        if !others.is_empty() {
            let mut kept = rule.clone();
            kept["resources"] = json!(others);
            rules.push(kept);
        }
        let verbs: Vec<String> = strings(&rule, "verbs").into_iter().filter(|v| v != verb).collect();
        if !verbs.is_empty() {
            let mut cut = rule.clone();
            cut["resources"] = json!([resource]);
            cut["verbs"] = json!(verbs);
            rules.push(cut);
        }
    }
    role["rules"] = json!(rules);
}

/// [in-cluster] must-show 4: three rules of the namespaced Role, each taken out on its own,
/// stop the step that needs them, and the refusal names the rule. For each, a namespace of
/// its own, the account bound to the Role without that rule, the operator started as it, the
/// Redis sample applied: the named step does not happen, and the operator says why (its log,
/// or the resource's conditions: `cannot VERB resource "RESOURCE"`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_rules_taken_out_each_stop_a_named_step() -> anyhow::Result<()> {
    let plugins = plugin_dir()?;
    // (verb, resource, the step it stops)
    let cuts = [
        ("create", "secrets", "ensure-secret: the sample's generated password Secret is never made"),
        // Logged as patch, authorized as create too: the audit log alone never shows this
        // rule in use (realpods::in_cluster lists it with that reason).
        ("create", "statefulsets", "apply: the sample's StatefulSet is never made (a server-side apply that makes an object needs create)"),
        ("patch", "redisclusters/status", "status: the resource never gets a status"),
    ];
    for (verb, resource, step) in cuts {
        let env = TestEnv::new("rbac-cut").await?;
        apply_crds(&env)?;
        bind_account(&env, |role| without(role, verb, resource))?;
        let (operator, _dir) = start_operator(&env, &plugins).await?;
        let mut cmd = env.kubectl();
        cmd.args(["-n", &env.namespace, "apply", "-f"]).arg(root().join("deploy/samples/redis.yaml"));
        kubectl_output(cmd, None)?;
        let refusal = format!("cannot {verb} resource \"{resource}\"");
        let crs = redis_api(&env);
        let started = Instant::now();
        let said = loop {
            let cr = crs.get("cache").await?;
            let conditions: Vec<String> = cr.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["message"].as_str().map(str::to_owned))
                .collect();
            let text = operator.log_text();
            if let Some(line) =
                text.lines().map(str::to_owned).chain(conditions).find(|l| l.contains(&refusal))
            {
                break line;
            }
            ensure!(
                started.elapsed() < Duration::from_secs(60),
                "without {verb} {resource}: no refusal naming it within 60 s:\n{}",
                operator.tail(30)
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        let by_instance = ListParams::default().labels("stateward.dev/instance=cache");
        let not_done = match resource {
            "secrets" => env.api::<Secret>().list(&by_instance).await?.items.is_empty(),
            "statefulsets" => env
                .api::<k8s_openapi::api::apps::v1::StatefulSet>()
                .list(&by_instance)
                .await?
                .items
                .is_empty(),
            _ => crs.get("cache").await?.data.get("status").is_none_or(Value::is_null),
        };
        ensure!(not_done, "without {verb} {resource}, the step happened anyway ({step})");
        println!("without {verb} {resource}: {step}; the operator said: {}", said.trim());
        drop(operator);
        release(&env);
    }
    Ok(())
}

/// Takes the finalizer off the RedisCluster `cache` of `env`, so that nothing blocks the
/// namespace's deletion once the operator is gone.
fn release(env: &TestEnv) {
    let _ = env
        .kubectl()
        .args(["-n", &env.namespace, "patch", "redisclusters", "cache", "--type=merge"])
        .args(["-p", r#"{"metadata":{"finalizers":null}}"#])
        .output();
}

async fn namespaced_run(env: &TestEnv, plugins: &Path) -> anyhow::Result<()> {
    let ns = env.namespace.clone();
    apply_crds(env)?;
    bind_account(env, |_| {})?;
    // What the API server's authorizer says, row by row, and a few things it must refuse.
    let user = format!("system:serviceaccount:{ns}:stateward");
    let groups = vec![
        "system:serviceaccounts".to_string(),
        format!("system:serviceaccounts:{ns}"),
        "system:authenticated".to_string(),
    ];
    let started = Instant::now();
    while !may(env, &user, &groups, (&ns, "apps", "statefulsets", "list", "")).await? {
        ensure!(started.elapsed() < Duration::from_secs(20), "the Role never took effect");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut checked = 0;
    for scope in [Scope::Watched, Scope::Operator] {
        for (g, r, v, n) in expected(scope) {
            ensure!(
                may(env, &user, &groups, (&ns, &g, &r, &v, &n)).await?,
                "table grants {v} {g}/{r} {n} but the API server denies it"
            );
            checked += 1;
        }
    }
    let denied: [Access<'_>; 9] = [
        ("", "apps", "statefulsets", "list", ""),
        ("", "stateward.dev", "redisclusters", "watch", ""),
        ("default", "", "secrets", "list", ""),
        (ns.as_str(), "", "secrets", "get", ""),
        (ns.as_str(), "apps", "statefulsets", "update", ""),
        (ns.as_str(), "stateward.dev", "redisclusters", "delete", ""),
        (ns.as_str(), "coordination.k8s.io", "leases", "update", "someone-else"),
        (ns.as_str(), "", "pods", "create", ""),
        ("", "apiextensions.k8s.io", "customresourcedefinitions", "get", ""),
    ];
    for access in denied {
        let (namespace, group, resource, verb, name) = access;
        ensure!(
            !may(env, &user, &groups, access).await?,
            "the ServiceAccount may {verb} {group}/{resource} {name} in {namespace:?}: more than the Role should give"
        );
    }
    println!("authorizer: {checked} table permissions allowed, {} outside it denied", denied.len());

    let (mut operator, _dir) = start_operator(env, plugins).await?;

    let mut cmd = env.kubectl();
    cmd.args(["-n", &ns, "apply", "-f", "-"]);
    kubectl_output(cmd, Some(&sample_without_servers()?))?;
    let applied = Instant::now();
    let crs = redis_api(env);
    let deadline = Duration::from_secs(240);
    loop {
        let cr = crs.get("cache").await?;
        let status = cr.data.get("status").cloned().unwrap_or(Value::Null);
        let available = status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Available" && c["status"] == "True");
        if available && status["readyReplicas"] == 3 {
            println!(
                "RedisCluster cache Available with 3 ready replicas {:.1?} after apply",
                applied.elapsed()
            );
            break;
        }
        if let Some(status) = operator.child.try_wait()? {
            bail!("operator exited with {status}:\n{}", operator.tail(40));
        }
        let refused = forbidden_lines(&operator.log_text());
        ensure!(refused.is_empty(), "the operator was refused something:\n{}", refused.join("\n"));
        ensure!(
            applied.elapsed() < deadline,
            "RedisCluster not Available with 3 ready within {deadline:?}; status {status}\n{}",
            operator.tail(40)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The writes the Role allows really happened: the secret was created, events published.
    let secrets =
        env.api::<Secret>().list(&ListParams::default().labels("stateward.dev/instance=cache")).await?;
    ensure!(!secrets.items.is_empty(), "no Secret created for cache");
    let events: Api<k8s_openapi::api::events::v1::Event> = env.api();
    let ours = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reporting_controller.as_deref() == Some("stateward"))
        .count();
    ensure!(ours > 0, "no events.k8s.io Event from stateward in {ns}");

    // Deletion with retentionPolicy Delete: finalizer removal and PVC/StatefulSet deletes.
    let pvcs: Api<PersistentVolumeClaim> = env.api();
    let by_instance = ListParams::default().labels("stateward.dev/instance=cache");
    let claims = pvcs.list(&by_instance).await?.items.len();
    ensure!(claims == 3, "expected 3 PVCs of cache, found {claims}");
    crs.delete("cache", &Default::default()).await?;
    let started = Instant::now();
    while crs.get_opt("cache").await?.is_some() {
        ensure!(
            started.elapsed() < Duration::from_secs(90),
            "RedisCluster not finalized within 90 s:\n{}",
            operator.tail(40)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!("RedisCluster cache finalized and gone {:.1?} after delete", started.elapsed());
    // retentionPolicy: Delete, so the operator deleted the claims (they may linger a moment
    // under the pvc-protection finalizer until their pods are gone).
    while let Some(left) =
        pvcs.list(&by_instance).await?.items.iter().find(|c| c.metadata.deletion_timestamp.is_none())
    {
        ensure!(
            started.elapsed() < Duration::from_secs(60),
            "PVC {} not deleted with retentionPolicy Delete:\n{}",
            left.metadata.name.as_deref().unwrap_or_default(),
            operator.tail(40)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!("its {claims} PVCs deleted (retentionPolicy Delete)");

    let text = operator.log_text();
    let forbidden = forbidden_lines(&text);
    ensure!(forbidden.is_empty(), "the operator was refused something:\n{}", forbidden.join("\n"));
    ensure!(text.contains("became leader"), "no leadership in the log:\n{}", operator.tail(20));
    println!("operator log: {} lines, none forbidden; {ours} events published", text.lines().count());
    Ok(())
}

/// [hardening-2] 2: the operator watching two namespaces (`--namespace a,b`) with the
/// namespaced Role and its binding in each and nothing cluster-wide reconciles a resource in
/// both, never touches one in a third namespace, is refused nothing, and may not read Secrets
/// or make StatefulSets or ConfigMaps in that third namespace (asked of the API server's
/// authorizer, as `kubectl auth can-i` does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_of_namespaces_is_watched_with_a_role_in_each_and_nothing_elsewhere() -> anyhow::Result<()> {
    let plugins = plugin_dir()?;
    let a = TestEnv::new("rbac-multi-a").await?;
    let b = TestEnv::new("rbac-multi-b").await?;
    let c = TestEnv::new("rbac-multi-c").await?;
    apply_crds(&a)?;
    bind_account(&a, |_| {})?;
    // In b: the watched namespace's Role, bound to the account of a.
    let mut objects = Vec::new();
    for file in ["deploy/rbac/namespaced/role.yaml", "deploy/rbac/namespaced/rolebinding.yaml"] {
        for mut object in load(file)? {
            object["metadata"]["namespace"] = json!(b.namespace);
            if object["kind"] == "RoleBinding" {
                object["subjects"] =
                    json!([{ "kind": "ServiceAccount", "name": "stateward", "namespace": a.namespace }]);
            }
            objects.push(object);
        }
    }
    let mut cmd = a.kubectl();
    cmd.args(["apply", "--server-side", "-f", "-"]);
    kubectl_output(cmd, Some(&json!({ "apiVersion": "v1", "kind": "List", "items": objects }).to_string()))?;

    let user = format!("system:serviceaccount:{}:stateward", a.namespace);
    let groups = vec!["system:serviceaccounts".to_string(), "system:authenticated".to_string()];
    let started = Instant::now();
    while !may(&a, &user, &groups, (&b.namespace, "apps", "statefulsets", "create", "")).await? {
        ensure!(started.elapsed() < Duration::from_secs(20), "the Role in b never took effect");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let elsewhere = c.namespace.as_str();
    let denied: [Access<'_>; 6] = [
        (elsewhere, "", "secrets", "list", ""),
        (elsewhere, "", "secrets", "get", ""),
        (elsewhere, "apps", "statefulsets", "create", ""),
        (elsewhere, "", "configmaps", "create", ""),
        (elsewhere, "apps", "statefulsets", "list", ""),
        ("", "", "secrets", "list", ""),
    ];
    for access in denied {
        let (namespace, group, resource, verb, _) = access;
        ensure!(
            !may(&a, &user, &groups, access).await?,
            "the account may {verb} {group}/{resource} in {namespace:?}, which it does not watch"
        );
    }

    let watched = format!("{},{}", a.namespace, b.namespace);
    let (operator, _dir) = start_operator_watching(&a, &plugins, &watched).await?;
    for env in [&a, &b, &c] {
        let mut cmd = env.kubectl();
        cmd.args(["-n", &env.namespace, "apply", "-f", "-"]);
        kubectl_output(cmd, Some(&sample_without_servers()?))?;
    }
    let started = Instant::now();
    for env in [&a, &b] {
        let crs = redis_api(env);
        loop {
            let cr = crs.get("cache").await?;
            let phase =
                cr.data.pointer("/status/phase").and_then(Value::as_str).unwrap_or_default().to_string();
            if !phase.is_empty() && !cr.metadata.finalizers.clone().unwrap_or_default().is_empty() {
                println!(
                    "{}: RedisCluster cache {phase} {:.1?} after apply",
                    env.namespace,
                    started.elapsed()
                );
                break;
            }
            ensure!(
                started.elapsed() < Duration::from_secs(120),
                "{}: the RedisCluster was never reconciled:\n{}",
                env.namespace,
                operator.tail(40)
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    // Both watched namespaces reconciled; the third one's resource is left as it was made.
    let untouched = redis_api(&c).get("cache").await?;
    ensure!(
        untouched.data.get("status").is_none_or(Value::is_null)
            && untouched.metadata.finalizers.clone().unwrap_or_default().is_empty(),
        "the resource in {elsewhere}, not watched, was touched: {:?}",
        untouched.data.get("status")
    );
    let refused = forbidden_lines(&operator.log_text());
    ensure!(refused.is_empty(), "the operator was refused something:\n{}", refused.join("\n"));
    drop(operator);
    release(&a);
    release(&b);
    Ok(())
}
