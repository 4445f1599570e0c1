//! The operator's own identity in tests: ServiceAccount `stateward` in the test's namespace,
//! bound to the roles deploy/ ships (moved into that namespace), and a kubeconfig with a token
//! of it. An operator started with that kubeconfig makes its requests as the account, so RBAC
//! refuses whatever the shipped roles do not grant, and the API server's audit log
//! (tests/cluster/up) records each request under the account's name.

use std::path::Path;

use anyhow::Context as _;
use serde_json::{json, Value};
use stateward_testkit::TestEnv;

use super::{kubectl_stdin, workspace_root};

/// The account's name, as in deploy/operator/serviceaccount.yaml.
pub const ACCOUNT: &str = "stateward";

/// The roles `stateward run --namespace NS` needs when NS is also its own namespace: the
/// watched namespace's (Role `stateward`) and the operator namespace's (leader Lease, hot
/// reload). Each file holds Roles or RoleBindings.
pub const NAMESPACED_ROLES: &[&str] = &[
    "deploy/rbac/namespaced/role.yaml",
    "deploy/rbac/namespaced/rolebinding.yaml",
    "deploy/rbac/operator-namespace/role.yaml",
    "deploy/rbac/operator-namespace/rolebinding.yaml",
];

/// What the webhook adds in the operator's namespace: its certificate Secrets.
pub const WEBHOOK_ROLES: &[&str] = &["deploy/webhook/role.yaml"];

/// Makes the account in the test's namespace and binds it there to the Roles of `files`
/// (relative to the workspace), each Role first changed by `edit`, and to the `extra`
/// objects as given (e.g. a Role for a test fixture's own kind). Idempotent: a second
/// operator of the same test binds the same. Uses the admin kubeconfig.
pub fn bind(env: &TestEnv, files: &[&str], extra: &[Value], edit: impl Fn(&mut Value)) -> anyhow::Result<()> {
    let ns = env.namespace.as_str();
    let mut objects =
        vec![json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": ACCOUNT}})];
    for file in files {
        let path = workspace_root().join(file);
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        for mut object in stateward::render::parse_documents(&text, file)? {
            match object["kind"].as_str() {
                Some("Role") => edit(&mut object),
                Some("RoleBinding") => {
                    object["subjects"] =
                        json!([{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": ns}]);
                }
                other => anyhow::bail!("{file}: a {other:?} where Roles and RoleBindings were expected"),
            }
            objects.push(object);
        }
    }
    objects.extend(extra.iter().cloned());
    for object in &mut objects {
        object["metadata"]["namespace"] = json!(ns);
    }
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    let out = kubectl_stdin(env, &["apply", "--server-side", "-n", ns, "-f", "-"], &list.to_string());
    anyhow::ensure!(out.status.success(), "binding the account: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}

/// Writes a kubeconfig at `out` that authenticates as the account with a token valid for two
/// hours, with the server and CA of the admin kubeconfig.
pub fn kubeconfig(env: &TestEnv, out: &Path) -> anyhow::Result<()> {
    let token = env
        .kubectl()
        .args(["create", "token", ACCOUNT, "-n", &env.namespace, "--duration", "2h"])
        .output()
        .context("run kubectl create token")?;
    anyhow::ensure!(
        token.status.success(),
        "a token for {ACCOUNT}: {}",
        String::from_utf8_lossy(&token.stderr)
    );
    token_kubeconfig(env.kubeconfig(), String::from_utf8_lossy(&token.stdout).trim(), &env.namespace, out)
}

/// A kubeconfig for `token`, with the server and CA of the admin kubeconfig.
pub fn token_kubeconfig(admin: &Path, token: &str, namespace: &str, out: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(admin)?;
    let config = stateward::render::parse_documents(&text, "admin kubeconfig")?
        .into_iter()
        .next()
        .context("empty kubeconfig")?;
    let current = config["current-context"].as_str().context("no current-context")?;
    let entry = |list: &str, name: &str| -> anyhow::Result<Value> {
        config[list]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["name"] == name)
            .cloned()
            .with_context(|| format!("{list} has no {name}"))
    };
    let context = entry("contexts", current)?;
    let cluster_name = context["context"]["cluster"].as_str().context("context without cluster")?;
    let mut cluster = entry("clusters", cluster_name)?["cluster"].clone();
    // A relative CA path is relative to the admin kubeconfig's directory.
    if let Some(ca) = cluster["certificate-authority"].as_str() {
        let ca = admin.parent().unwrap_or(Path::new(".")).join(ca);
        cluster["certificate-authority"] = json!(ca.to_string_lossy());
    }
    let kubeconfig = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": cluster}],
        "users": [{"name": ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": ACCOUNT, "context": {"cluster": "test", "user": ACCOUNT, "namespace": namespace}}],
        "current-context": ACCOUNT,
    });
    std::fs::write(out, serde_json::to_string_pretty(&kubeconfig)?)?;
    Ok(())
}
