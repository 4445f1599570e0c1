//! [in-cluster] must-show 4 over the whole real-pods suite: every operator of these tests runs
//! as a ServiceAccount bound only to the roles deploy/ ships (`operator_kubeconfig`, and the
//! in-cluster installs' own account), so the API server's audit log (tests/cluster/up: every
//! request of a ServiceAccount outside kube-system) holds each request the operator made.
//! Read after the suite, the (verb, group, resource) set it used must equal the set the
//! shipped roles grant: no request refused, no request outside them, and every granted rule
//! used or given its reason in [`UNUSED_BECAUSE`].
//!
//! scripts/test runs the check after the other real-pods tests, with the time they started in
//! `STATEWARD_SUITE_AUDIT_SINCE`:
//!   `STATEWARD_SUITE_AUDIT_SINCE=<RFC 3339 UTC> cargo test -p stateward --test realpods -- \
//!    --ignored --exact least_privilege::the_whole_suite_used_what_the_shipped_roles_grant`

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::e2e;

/// The API group of the test fixture's own kind (hostilethings): no shipped role names it,
/// the real-pods tests grant it with a Role of their own, and the check leaves it out.
pub const FIXTURE_GROUP: &str = "test.stateward.dev";

/// One permission as RBAC grants it and the audit log records its use: verb, API group,
/// resource (with `/subresource`), and where: `cluster` or the namespace.
pub type Use = (String, String, String, String);

/// A request the authorizer refused.
#[derive(Debug)]
pub struct Refused {
    /// `verb group/resource in scope (URI)`.
    pub request: String,
    pub user: String,
    /// When the API server received it (RFC 3339).
    pub at: String,
}

/// The requests of an audit log that a filter took.
#[derive(Default)]
pub struct Requests {
    pub count: usize,
    pub used: BTreeSet<Use>,
    pub forbidden: Vec<Refused>,
    /// Refused by a namespace being deleted (authorized, then refused by admission): they say
    /// nothing about the roles.
    pub terminating_refused: Vec<String>,
}

/// The resource requests among the audit `log`'s lines that `take` accepts.
pub fn requests(log: &[u8], take: impl Fn(&Value) -> bool) -> Requests {
    let mut out = Requests::default();
    for line in log.split(|b| *b == b'\n') {
        let Ok(event) = serde_json::from_slice::<Value>(line) else { continue };
        if event["objectRef"].is_null() || !take(&event) {
            continue;
        }
        out.count += 1;
        let object = &event["objectRef"];
        let mut resource = object["resource"].as_str().unwrap_or_default().to_owned();
        if let Some(sub) = object["subresource"].as_str() {
            resource = format!("{resource}/{sub}");
        }
        let scope = object["namespace"].as_str().unwrap_or("cluster").to_owned();
        let verb = event["verb"].as_str().unwrap_or_default().to_owned();
        let group = object["apiGroup"].as_str().unwrap_or_default().to_owned();
        if event["responseStatus"]["code"] == 403 {
            let request = format!("{verb} {group}/{resource} in {scope} ({})", event["requestURI"]);
            let authorized = event["annotations"]["authorization.k8s.io/decision"] == "allow";
            let terminating =
                event["responseStatus"]["message"].as_str().is_some_and(|m| m.contains("being terminated"));
            if authorized && terminating {
                out.terminating_refused.push(request);
            } else {
                let user = event["user"]["username"].as_str().unwrap_or_default().to_owned();
                let at = event["requestReceivedTimestamp"].as_str().unwrap_or_default().to_owned();
                out.forbidden.push(Refused { request, user, at });
            }
        }
        out.used.insert((verb, group, resource, scope));
    }
    out
}

/// The roles of the default install (deploy/kustomization.yaml: the cluster-wide rules, the
/// operator namespace's, the webhook's). The namespaced Role has the ClusterRole's rules
/// (live::rbac checks it); the cert-manager overlay's Role is not part of this install.
const SHIPPED_ROLES: &[&str] = &[
    "deploy/rbac/cluster/clusterrole.yaml",
    "deploy/rbac/operator-namespace/role.yaml",
    "deploy/webhook/role.yaml",
    "deploy/webhook/clusterrole.yaml",
];

/// (verb, group, resource) each shipped rule grants, with the files granting it.
fn shipped_grants() -> BTreeMap<(String, String, String), BTreeSet<String>> {
    let mut grants: BTreeMap<(String, String, String), BTreeSet<String>> = BTreeMap::new();
    let strings = |v: &Value| -> Vec<String> {
        v.as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_owned).collect()
    };
    for file in SHIPPED_ROLES {
        let text = std::fs::read_to_string(e2e::workspace_root().join(file)).expect("shipped role");
        for doc in stateward::render::parse_documents(&text, file).expect("yaml") {
            if !matches!(doc["kind"].as_str(), Some("Role" | "ClusterRole")) {
                continue;
            }
            for rule in doc["rules"].as_array().into_iter().flatten() {
                for group in strings(&rule["apiGroups"]) {
                    for resource in strings(&rule["resources"]) {
                        for verb in strings(&rule["verbs"]) {
                            grants
                                .entry((verb, group.clone(), resource.clone()))
                                .or_default()
                                .insert((*file).to_owned());
                        }
                    }
                }
            }
        }
    }
    grants
}

/// Rules the real-pods suite leaves unused, each with why and where it is used: (verb, group,
/// resource, why); `*` matches any group or resource, `*/sub` any resource's subresource.
pub const UNUSED_BECAUSE: &[(&str, &str, &str, &str)] = &[
    ("create", "apps", "statefulsets", APPLY_CREATES),
    ("create", "", "services", APPLY_CREATES),
    ("create", "", "configmaps", APPLY_CREATES),
    ("create", "", "persistentvolumeclaims", APPLY_CREATES),
    ("create", "policy", "poddisruptionbudgets", APPLY_CREATES),
    (
        "create",
        "admissionregistration.k8s.io",
        "validatingwebhookconfigurations",
        "an apply that makes the configuration when the installer's is absent (logged as patch too)",
    ),
    (
        "delete",
        "*",
        "*",
        "a plan's delete of a child it owns (controller/apply.rs Applier::delete, the call this suite \
         makes for pods): the shipped plugins delete StatefulSets, claims and Secrets when a resource \
         with retentionPolicy Delete goes (kwok: live::e2e_controller), and a hot-loaded plugin may \
         delete any kind it owns; no real-pods scenario deletes a resource with retentionPolicy Delete",
    ),
    ("patch", "", "persistentvolumeclaims", "volume growth, a larger storage size patching each claim: live::volume_growth"),
    (
        "update",
        "",
        "secrets",
        "renewing the webhook's certificate (a compare-and-swap): live::webhooks renews it; an install \
         only makes it",
    ),
    (
        "update",
        "stateward.dev",
        "*/finalizers",
        "only where OwnerReferencesPermissionEnforcement is on (OpenShift); stock kube-apiserver never checks it",
    ),
    ("create", "", "pods/exec", "newer API servers authorize the exec upgrade as create, this one (1.34) as get"),
    ("get", "", "pods/exec", "older API servers authorize the exec upgrade as get"),
];

/// Children are applied server-side: an apply that makes the object is logged as `patch` and
/// authorized as `create` too (taking the rule out stops the first apply:
/// live::rbac::three_rules_taken_out_each_stop_a_named_step).
const APPLY_CREATES: &str = "server-side apply makes objects: logged as patch, authorized as create too";

/// The reason `list` gives for leaving (verb, group, resource) unused, if any.
pub fn unused_because(
    list: &'static [(&str, &str, &str, &str)],
    verb: &str,
    group: &str,
    resource: &str,
) -> Option<&'static str> {
    list.iter().find_map(|(v, g, r, why)| {
        let resource_matches =
            *r == "*" || *r == resource || (r.starts_with("*/") && resource.ends_with(&r[1..]));
        (*v == verb && (*g == "*" || *g == group) && resource_matches).then_some(*why)
    })
}

/// Whether `event` is a request of an operator of this suite: the account `stateward` of any
/// namespace (the tests' own namespaces, and the in-cluster installs'), not impersonated, at
/// or after `since`, on a kind the shipped roles are about.
fn operator_request(event: &Value, since: &str) -> bool {
    let user = event["user"]["username"].as_str().unwrap_or_default();
    let operator = user
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
        .is_some_and(|(_, name)| name == e2e::account::ACCOUNT);
    operator
        && event["impersonatedUser"].is_null()
        && event["requestReceivedTimestamp"].as_str().is_some_and(|t| t >= since)
        && event["objectRef"]["apiGroup"] != FIXTURE_GROUP
}

/// How long an operator pod may go on after an uninstall removed its role bindings: its
/// shutdown (stepping down, releasing the Lease) within the pod's grace period.
const STOPPING: std::time::Duration = std::time::Duration::from_secs(60);

/// When a role binding was deleted (tests/cluster/up logs each deletion): the namespace, ""
/// for a ClusterRoleBinding.
fn binding_deletions(log: &[u8]) -> Vec<(String, jiff::Timestamp)> {
    log.split(|b| *b == b'\n')
        .filter_map(|line| serde_json::from_slice::<Value>(line).ok())
        .filter(|e| {
            matches!(e["verb"].as_str(), Some("delete" | "deletecollection"))
                && e["objectRef"]["apiGroup"] == "rbac.authorization.k8s.io"
                && e["responseStatus"]["code"].as_u64().is_some_and(|c| c < 300)
        })
        .filter_map(|e| {
            let at = e["requestReceivedTimestamp"].as_str()?.parse().ok()?;
            Some((e["objectRef"]["namespace"].as_str().unwrap_or_default().to_owned(), at))
        })
        .collect()
}

/// Whether `refused` came while its account's pod was still stopping after an uninstall: a
/// role binding of the account's namespace, or a ClusterRoleBinding, was deleted at most
/// [`STOPPING`] before it. Such a refusal says nothing about the roles (Helm deletes a
/// Deployment and its bindings together; the pods stop afterwards).
fn after_its_uninstall(refused: &Refused, deletions: &[(String, jiff::Timestamp)]) -> bool {
    let Ok(at) = refused.at.parse::<jiff::Timestamp>() else { return false };
    let namespace = refused.user.strip_prefix("system:serviceaccount:").and_then(|r| r.split_once(':'));
    let Some((namespace, _)) = namespace else { return false };
    deletions.iter().any(|(ns, deleted)| {
        (ns.is_empty() || ns == namespace)
            && *deleted <= at
            && at.duration_since(*deleted) <= jiff::SignedDuration::try_from(STOPPING).unwrap_or_default()
    })
}

#[tokio::test]
#[ignore = "run by scripts/test after the other real-pods tests: it reads what they did from the audit log"]
async fn the_whole_suite_used_what_the_shipped_roles_grant() {
    let since = std::env::var("STATEWARD_SUITE_AUDIT_SINCE")
        .expect("STATEWARD_SUITE_AUDIT_SINCE: when the suite started (RFC 3339, UTC, microseconds)");
    let real = stateward_testkit::real::real_cluster().await.expect("the real-pods cluster");
    let path = real.kubeconfig().parent().expect("state dir").join("logs").join("audit.log");
    let log = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut found = requests(&log, |event| operator_request(event, &since));
    let deletions = binding_deletions(&log);
    let (stopping, forbidden): (Vec<Refused>, Vec<Refused>) =
        std::mem::take(&mut found.forbidden).into_iter().partition(|r| after_its_uninstall(r, &deletions));
    found.forbidden = forbidden;
    let used: BTreeSet<(String, String, String)> =
        found.used.iter().map(|(v, g, r, _)| (v.clone(), g.clone(), r.clone())).collect();
    let grants = shipped_grants();

    let mut shown = Vec::new();
    for (verb, group, resource) in &used {
        let scopes: BTreeSet<&str> = found
            .used
            .iter()
            .filter(|(v, g, r, _)| (v, g, r) == (verb, group, resource))
            .map(|(_, _, _, s)| if s == "cluster" { "cluster" } else { "namespaced" })
            .collect();
        shown.push(format!(
            "{verb} {group}/{resource} ({})",
            scopes.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    let outside: Vec<&(String, String, String)> = used.iter().filter(|u| !grants.contains_key(*u)).collect();
    let mut unused = Vec::new();
    let mut reasoned = Vec::new();
    for ((verb, group, resource), files) in &grants {
        if used.contains(&(verb.clone(), group.clone(), resource.clone())) {
            continue;
        }
        let row =
            format!("{verb} {group}/{resource} ({})", files.iter().cloned().collect::<Vec<_>>().join(", "));
        match unused_because(UNUSED_BECAUSE, verb, group, resource) {
            Some(why) => reasoned.push(format!("{row}: {why}")),
            None => unused.push(row),
        }
    }
    eprintln!(
        "least_privilege: since {since}, the operators' accounts made {} requests (audit log), {} kinds; the \
         shipped roles grant {} kinds.\nused:\n  {}\ngranted, unused, with their reasons:\n  {}\ngranted, \
         unused, no reason:\n  {}",
        found.count,
        used.len(),
        grants.len(),
        shown.join("\n  "),
        reasoned.join("\n  "),
        unused.join("\n  ")
    );
    if !stopping.is_empty() {
        eprintln!("least_privilege: refused to pods still stopping after their uninstall: {stopping:#?}");
    }
    if !found.terminating_refused.is_empty() {
        eprintln!(
            "least_privilege: {} refused by a namespace being deleted, not by a role",
            found.terminating_refused.len()
        );
    }
    assert!(found.count > 0, "no request of an operator's account in {} since {since}", path.display());
    let refused: Vec<String> =
        found.forbidden.iter().map(|r| format!("{} by {} at {}", r.request, r.user, r.at)).collect();
    assert!(refused.is_empty(), "requests refused to the operator: {refused:#?}");
    assert!(outside.is_empty(), "requests no shipped role grants: {outside:?}");
    assert!(unused.is_empty(), "granted, never used by the suite, and no reason written: {unused:#?}");
}
