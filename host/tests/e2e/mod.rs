//! Shared support of the end-to-end tests: the CRDs installed once, the operator binary run as
//! a child process against the local cluster (its log printed when a test fails), the three
//! kinds' manifests, and bounded polling helpers. Every test gets its own namespace and its own
//! operator (`--namespace`, Lease in that namespace), so tests run in parallel.
#![allow(clippy::expect_used)]
#![allow(dead_code)]
// Test support: failing the calling test with a clear message is its job.
#![allow(clippy::panic)]

use std::collections::BTreeSet;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::bail;
use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::ListParams;
use kube::core::DynamicObject;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use serde_json::Value;
use stateward_testkit::TestEnv;

/// Poll interval of every wait.
pub const POLL: Duration = Duration::from_millis(300);
/// Label the plugins put on every child.
pub const INSTANCE_LABEL: &str = "stateward.dev/instance";
pub const FINALIZER: &str = "stateward.dev/cleanup";

pub mod account;
#[path = "../common/mod.rs"]
mod common;
pub mod last_release;
// Every test binary uses a different part of these.
#[allow(unused_imports)]
pub use common::{
    http_get, sum_metric, target_dir, workspace_root, Kind, ELASTICSEARCH, KINDS, POSTGRES, REDIS,
};

impl Kind {
    pub fn api(&self, env: &TestEnv) -> Api<DynamicObject> {
        self.api_in(env, &env.namespace)
    }

    pub fn api_in(&self, env: &TestEnv, namespace: &str) -> Api<DynamicObject> {
        self.api_with(&env.client, namespace)
    }

    /// A small manifest of this kind (no deletionProtection, so tests can delete it). Its
    /// creation does not wait for redundancy: kwok's pods run no server, so no copy ever
    /// answers (the real-pods tests wait for it).
    pub fn manifest(&self, name: &str, replicas: u32, retention: &str) -> Value {
        serde_json::json!({
            "apiVersion": "stateward.dev/v1",
            "kind": self.kind,
            "metadata": { "name": name },
            "spec": {
                "version": self.version,
                "replicas": replicas,
                "waitForRedundancy": false,
                "storage": { "size": self.storage },
                "retentionPolicy": retention,
                "resources": {
                    "requests": { "cpu": "50m", "memory": "64Mi" },
                    "limits": { "cpu": "250m", "memory": "128Mi" },
                },
            }
        })
    }
}

/// Fails with a clear message when the plugins were not built.
pub fn plugin_dir() -> PathBuf {
    let dir = target_dir().join("plugins");
    for p in ["postgres", "redis", "elasticsearch"] {
        let f = dir.join(format!("{p}.wasm"));
        assert!(
            f.is_file(),
            "{} is missing: build the plugins first with scripts/build-plugins (scripts/test does)",
            f.display()
        );
    }
    dir
}

/// The operator's precompiled-plugin cache in these tests.
pub fn wasm_cache() -> PathBuf {
    target_dir().join("e2e-wasm-cache")
}

static PREPARED: OnceLock<Mutex<bool>> = OnceLock::new();

/// Applies deploy/crds (server-side, idempotent), waits until they are Established, and fills
/// the precompiled-plugin cache once, so each operator start is quick. Once per process.
pub fn prepare(env: &TestEnv) {
    let lock = PREPARED.get_or_init(|| Mutex::new(false));
    let mut done = lock.lock().unwrap_or_else(|p| p.into_inner());
    if *done {
        return;
    }
    let plugins = plugin_dir();
    let crds = workspace_root().join("deploy").join("crds");
    let out = env
        .kubectl()
        .args(["apply", "--server-side", "--force-conflicts", "--field-manager", "stateward-e2e", "-f"])
        .arg(&crds)
        .output()
        .expect("run kubectl");
    assert!(out.status.success(), "applying {}: {}", crds.display(), String::from_utf8_lossy(&out.stderr));
    let crd_names: Vec<String> = KINDS.iter().map(|k| format!("crd/{}.stateward.dev", k.plural)).collect();
    if let Err(e) = stateward_testkit::wait_established(env.kubeconfig(), &crd_names) {
        panic!("{e:#}");
    }
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_stateward"))
        .arg("crds")
        .arg("--plugin-dir")
        .arg(&plugins)
        .arg("--wasm-cache")
        .arg(wasm_cache())
        .output()
        .expect("run stateward crds");
    assert!(out.status.success(), "loading the plugins: {}", String::from_utf8_lossy(&out.stderr));
    eprintln!("e2e: CRDs installed, plugin cache warm in {:.1?}", started.elapsed());
    *done = true;
}

/// A free loopback port (bound then released; the operator binds it right after).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// How to start one operator process.
#[derive(Debug, Clone, Default)]
pub struct OperatorOpts {
    /// Namespace to watch (`--namespace`); the Lease lives in `lease_namespace`.
    pub namespace: String,
    pub lease_namespace: String,
    /// Kubeconfig to use instead of the admin one (e.g. a namespaced service account).
    pub kubeconfig: Option<PathBuf>,
    /// `--identity`; the default one is hostname-pid.
    pub identity: Option<String>,
    /// Plugins to load instead of the three built ones.
    pub plugin_dir: Option<PathBuf>,
    /// Webhook flags (`--webhook-addr`, `--webhook-url`, …). Empty: `--no-webhook`, so
    /// parallel operators neither race for port 9443 nor touch webhook configurations.
    pub webhook_args: Vec<String>,
    /// Extra environment variables (e.g. `OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub env: Vec<(String, String)>,
    /// Extra arguments of `stateward run` (e.g. `--sweep-interval 2`).
    pub args: Vec<String>,
    /// Policy bundle instead of the shipped policies/.
    pub policy_dir: Option<PathBuf>,
}

/// The operator binary as a child process. Killed (SIGKILL) on drop; its log is printed when
/// the test is failing.
pub struct Operator {
    child: Option<Child>,
    pub name: String,
    pub port: u16,
    pub log: PathBuf,
    pub audit: PathBuf,
    _dir: Arc<tempdir::Dir>,
}

/// A scratch directory removed on drop unless the test fails.
pub mod tempdir {
    use std::path::PathBuf;

    pub struct Dir(pub PathBuf);

    impl Dir {
        pub fn new(prefix: &str) -> Dir {
            let dir = std::env::temp_dir().join(stateward_testkit::unique_name(prefix));
            std::fs::create_dir_all(&dir).expect("create scratch dir");
            Dir(dir)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            if !std::thread::panicking() {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }
}

impl Operator {
    /// Starts `stateward run` for the test namespace with the admin kubeconfig.
    pub fn start(env: &TestEnv, name: &str) -> Operator {
        Operator::start_with(
            env,
            name,
            OperatorOpts {
                namespace: env.namespace.clone(),
                lease_namespace: env.namespace.clone(),
                ..Default::default()
            },
        )
    }

    pub fn start_with(env: &TestEnv, name: &str, opts: OperatorOpts) -> Operator {
        prepare(env);
        let dir = Arc::new(tempdir::Dir::new(&format!("e2e-{name}")));
        let log = dir.0.join("operator.log");
        let audit = dir.0.join("audit.jsonl");
        let port = free_port();
        let file = std::fs::File::create(&log).expect("log file");
        let err = file.try_clone().expect("log file");
        let kubeconfig = opts.kubeconfig.clone().unwrap_or_else(|| env.kubeconfig().to_path_buf());
        // STATEWARD_OPERATOR_BIN: another build of the operator (e.g. a release one, for the
        // figures of a benchmark); by default the one built with these tests.
        let bin = std::env::var_os("STATEWARD_OPERATOR_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_stateward")));
        let mut cmd = Command::new(bin);
        cmd.env("KUBECONFIG", &kubeconfig)
            .env_remove("STATEWARD_NAMESPACE")
            .env_remove("POD_NAMESPACE")
            .env_remove("POD_NAME")
            .args(["run", "--namespace", &opts.namespace, "--lease-namespace", &opts.lease_namespace])
            .args(["--http-addr", &format!("127.0.0.1:{port}"), "--lease-seconds", "6"])
            .arg("--audit-log")
            .arg(&audit)
            .arg("--plugin-dir")
            .arg(opts.plugin_dir.clone().unwrap_or_else(plugin_dir))
            .arg("--wasm-cache")
            .arg(wasm_cache())
            .arg("--policy-dir")
            .arg(opts.policy_dir.clone().unwrap_or_else(|| workspace_root().join("policies")))
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err);
        if let Some(id) = &opts.identity {
            cmd.args(["--identity", id]);
        }
        if opts.webhook_args.is_empty() {
            cmd.arg("--no-webhook");
        } else {
            cmd.args(&opts.webhook_args);
        }
        cmd.args(&opts.args);
        cmd.envs(opts.env.iter().map(|(k, v)| (k, v)));
        let child = cmd.spawn().expect("spawn stateward run");
        eprintln!("e2e: started operator {name} (pid {}, http {port}, log {})", child.id(), log.display());
        Operator { child: Some(child), name: name.to_string(), port, log, audit, _dir: dir }
    }

    /// SIGKILL, no chance to clean up (no Lease release).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
            eprintln!("e2e: operator {} killed with SIGKILL", self.name);
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Exits early only on a crash; returns its status then.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// One HTTP GET on the operator's endpoint: (status code, body).
    pub fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        http_get(self.port, path)
    }

    /// `/debug/healthz` `leader` field; None when the endpoint does not answer.
    pub fn is_leader(&self) -> Option<bool> {
        let (code, body) = self.get("/debug/healthz").ok()?;
        if code != 200 {
            return None;
        }
        serde_json::from_str::<Value>(&body).ok()?.get("leader")?.as_bool()
    }

    /// Sum of `stateward_api_writes_total` over all labels (0 when absent).
    pub fn api_writes(&self) -> anyhow::Result<f64> {
        let (code, body) = self.get("/metrics")?;
        if code != 200 {
            bail!("/metrics answered {code}");
        }
        Ok(sum_metric(&body, "stateward_api_writes_total", &[]))
    }

    /// Waits until the operator answers /readyz 200 (leader, caches synced, controllers up).
    pub async fn wait_ready(&mut self, timeout: Duration) {
        let started = Instant::now();
        loop {
            if let Some(status) = self.exited() {
                panic!("operator {} exited early with {status}:\n{}", self.name, self.log_tail(80));
            }
            if matches!(self.get("/readyz"), Ok((200, _))) {
                eprintln!("e2e: operator {} ready after {:.1?}", self.name, started.elapsed());
                return;
            }
            assert!(
                started.elapsed() < timeout,
                "operator {} not ready within {timeout:?}:\n{}",
                self.name,
                self.log_tail(80)
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until /debug/healthz answers at all (a follower is never ready).
    pub async fn wait_serving(&mut self, timeout: Duration) {
        let started = Instant::now();
        while self.is_leader().is_none() {
            if let Some(status) = self.exited() {
                panic!("operator {} exited early with {status}:\n{}", self.name, self.log_tail(80));
            }
            assert!(started.elapsed() < timeout, "operator {} not serving within {timeout:?}", self.name);
            tokio::time::sleep(POLL).await;
        }
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- operator {} log (last 150 lines; file {}) ----\n{}\n---- end ----",
                self.name,
                self.log.display(),
                self.log_tail(150)
            );
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs kubectl with `input` on stdin.
pub fn kubectl_stdin(env: &TestEnv, args: &[&str], input: &str) -> Output {
    env.kubectl_output(args, Some(input)).expect("run kubectl")
}

/// `kubectl apply -f -` of one object into `namespace`; panics with kubectl's message on failure.
pub fn apply(env: &TestEnv, namespace: &str, object: &Value) {
    let out = kubectl_stdin(env, &["apply", "-n", namespace, "-f", "-"], &object.to_string());
    assert!(out.status.success(), "kubectl apply failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// `kubectl patch --type merge`; returns the output (the caller checks it).
pub fn patch(env: &TestEnv, namespace: &str, target: &str, patch: &Value) -> Output {
    env.kubectl()
        .args(["patch", "-n", namespace, target, "--type", "merge", "-p", &patch.to_string()])
        .output()
        .expect("run kubectl")
}

pub fn patch_ok(env: &TestEnv, namespace: &str, target: &str, p: &Value) {
    let out = patch(env, namespace, target, p);
    assert!(out.status.success(), "kubectl patch {target} failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// Polls `check` every [`POLL`] until it yields `Some`, failing after `timeout` with `what`
/// and the last observation.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> (T, Duration)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let started = Instant::now();
    loop {
        match check().await {
            Ok(v) => return (v, started.elapsed()),
            Err(last) => {
                if started.elapsed() > timeout {
                    panic!("timed out after {timeout:?} waiting for {what}; last seen: {last}");
                }
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The CR as JSON, or None when it is gone.
pub async fn get_cr(api: &Api<DynamicObject>, name: &str) -> Option<Value> {
    let obj = api.get_opt(name).await.ok()??;
    serde_json::to_value(obj).ok()
}

pub fn condition<'a>(cr: &'a Value, type_: &str) -> Option<&'a str> {
    cr.pointer("/status/conditions")?.as_array()?.iter().find(|c| c["type"] == type_)?.get("status")?.as_str()
}

pub fn phase(cr: &Value) -> &str {
    cr.pointer("/status/phase").and_then(Value::as_str).unwrap_or("")
}

/// A short description of the CR's state for failure messages.
pub fn summary(cr: &Value) -> String {
    format!(
        "phase={} ready={} gen={} observed={} conditions={}",
        phase(cr),
        cr.pointer("/status/readyReplicas").unwrap_or(&Value::Null),
        cr.pointer("/metadata/generation").unwrap_or(&Value::Null),
        cr.pointer("/status/observedGeneration").unwrap_or(&Value::Null),
        cr.pointer("/status/conditions").unwrap_or(&Value::Null),
    )
}

/// Waits until the operator has seen the latest spec of a paused resource (observedGeneration
/// caught up) and says so (`Paused` True): from then on it would have acted, had it not been
/// paused. Returns how long that took.
pub async fn wait_paused_seen(api: &Api<DynamicObject>, name: &str, timeout: Duration) -> Duration {
    let (_, seen) = wait_for(&format!("{name}: the change seen while paused"), timeout, || {
        let api = api.clone();
        async move {
            let cr = get_cr(&api, name).await.ok_or("CR gone")?;
            let seen = cr.pointer("/status/observedGeneration") == cr.pointer("/metadata/generation");
            if seen && condition(&cr, "Paused") == Some("True") {
                Ok(())
            } else {
                Err(summary(&cr))
            }
        }
    })
    .await;
    seen
}

/// Waits for phase Running, Available=True, readyReplicas == `replicas` == the StatefulSet's
/// ready count, and observedGeneration == generation.
pub async fn wait_running(
    env: &TestEnv,
    kind: Kind,
    name: &str,
    replicas: i64,
    timeout: Duration,
) -> Duration {
    let api = kind.api(env);
    let sts: Api<StatefulSet> = env.api();
    let (_, took) = wait_for(&format!("{} {name} Running with {replicas} ready", kind.kind), timeout, || {
        let (api, sts) = (api.clone(), sts.clone());
        async move {
            let cr = get_cr(&api, name).await.ok_or("CR not found")?;
            let ok = phase(&cr) == "Running"
                && condition(&cr, "Available") == Some("True")
                && cr.pointer("/status/readyReplicas").and_then(Value::as_i64) == Some(replicas)
                && cr.pointer("/status/observedGeneration") == cr.pointer("/metadata/generation");
            if !ok {
                return Err(summary(&cr));
            }
            let s = sts.get_opt(name).await.map_err(|e| e.to_string())?.ok_or("no StatefulSet")?;
            let st = s.status.unwrap_or_default();
            if st.ready_replicas.unwrap_or(0) as i64 != replicas || st.replicas as i64 != replicas {
                return Err(format!("CR Running but StatefulSet status {st:?}"));
            }
            Ok(())
        }
    })
    .await;
    took
}

/// Records every distinct phase the CR passes through, from a watch (no polling gaps).
pub struct PhaseRecorder {
    seen: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl PhaseRecorder {
    pub fn start(api: Api<DynamicObject>, name: &str) -> PhaseRecorder {
        let seen = Arc::new(Mutex::new(Vec::<String>::new()));
        let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let rec = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            let mut stream = watcher::watcher(api, cfg).boxed();
            while let Some(ev) = stream.next().await {
                let objs: Vec<DynamicObject> = match ev {
                    Ok(watcher::Event::Apply(o)) | Ok(watcher::Event::InitApply(o)) => vec![o],
                    _ => continue,
                };
                for o in objs {
                    let p = o.data.pointer("/status/phase").and_then(Value::as_str).unwrap_or("").to_string();
                    let mut s = rec.lock().unwrap_or_else(|e| e.into_inner());
                    if s.last() != Some(&p) {
                        s.push(p);
                    }
                }
            }
        });
        PhaseRecorder { seen, task }
    }

    /// Phases seen so far, in order, consecutive duplicates collapsed.
    pub fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn clear(&self) {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

impl Drop for PhaseRecorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Names of the children of `instance` of one kind, via kubectl (any kind).
pub fn child_names(env: &TestEnv, namespace: &str, resource: &str, instance: &str) -> BTreeSet<String> {
    let out = env
        .kubectl()
        .args(["get", resource, "-n", namespace, "-l", &format!("{INSTANCE_LABEL}={instance}"), "-o", "name"])
        .output()
        .expect("run kubectl");
    assert!(out.status.success(), "kubectl get {resource}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}

/// PVC name → uid of the instance's claims.
pub async fn pvc_uids(env: &TestEnv, instance: &str) -> std::collections::BTreeMap<String, String> {
    let pvcs: Api<PersistentVolumeClaim> = env.api();
    let list = pvcs
        .list(&ListParams::default().labels(&format!("{INSTANCE_LABEL}={instance}")))
        .await
        .expect("list PVCs");
    list.into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
        .collect()
}

/// Every PVC of the instance is Bound.
pub async fn pvcs_bound(env: &TestEnv, instance: &str) -> Result<usize, String> {
    let pvcs: Api<PersistentVolumeClaim> = env.api();
    let list = pvcs
        .list(&ListParams::default().labels(&format!("{INSTANCE_LABEL}={instance}")))
        .await
        .map_err(|e| e.to_string())?;
    let unbound: Vec<String> = list
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound"))
        .map(|p| p.name_any())
        .collect();
    if unbound.is_empty() {
        Ok(list.items.len())
    } else {
        Err(format!("unbound claims {unbound:?}"))
    }
}

/// Which permissions the operator's service account gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rbac {
    /// The project's least-privilege Roles: deploy/rbac/namespaced/ for the watched namespace
    /// and deploy/rbac/operator-namespace/ for the Lease (both put in the test namespace).
    Project,
    /// A broad namespaced Role of the test's own, for tests about something else than RBAC.
    Broad,
}

/// Makes a kubeconfig for a new service account of the test namespace with only namespaced
/// permissions. Its requests can also be told apart from the test's (admin, exempt from API
/// priority and fairness) in the API server's metrics.
pub fn namespaced_operator_kubeconfig(env: &TestEnv, dir: &Path, sa: &str, rbac: Rbac) -> PathBuf {
    let ns = &env.namespace;
    let mut items = vec![
        serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": ns}}),
    ];
    let bind = |role: &str| {
        serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": format!("{sa}-{role}"), "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]})
    };
    match rbac {
        Rbac::Project => {
            let dir = workspace_root().join("deploy").join("rbac");
            for rel in ["namespaced/role.yaml", "operator-namespace/role.yaml"] {
                let path = dir.join(rel);
                let text = std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
                let mut role: Value =
                    yaml_serde::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()));
                assert_eq!(role["kind"], "Role", "{}", path.display());
                role["metadata"]["namespace"] = Value::String(ns.clone());
                let name = role["metadata"]["name"].as_str().unwrap_or_default().to_string();
                items.push(role);
                items.push(bind(&name));
            }
        }
        Rbac::Broad => {
            let all = ["get", "list", "watch", "create", "update", "patch", "delete"];
            let role = format!("{sa}-broad");
            items.push(serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": role, "namespace": ns},
                "rules": [{"apiGroups": ["", "apps", "policy", "events.k8s.io", "coordination.k8s.io", "stateward.dev"],
                           "resources": ["*"], "verbs": all}]}));
            items.push(bind(&role));
        }
    }
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
    apply(env, ns, &list);
    let token =
        env.kubectl().args(["create", "token", sa, "-n", ns, "--duration", "2h"]).output().expect("kubectl");
    assert!(token.status.success(), "create token: {}", String::from_utf8_lossy(&token.stderr));
    let token = String::from_utf8_lossy(&token.stdout).trim().to_string();
    let view = |path: &str| {
        let out = env
            .kubectl()
            .args(["config", "view", "--raw", "--minify", "-o", &format!("jsonpath={path}")])
            .output()
            .expect("kubectl");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let server = view("{.clusters[0].cluster.server}");
    let ca = view("{.clusters[0].cluster.certificate-authority-data}");
    let ca_line = if ca.is_empty() {
        format!("certificate-authority: {}", view("{.clusters[0].cluster.certificate-authority}"))
    } else {
        format!("certificate-authority-data: {ca}")
    };
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    {ca_line}\nusers:\n- name: {sa}\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: {sa}\n    namespace: {ns}\ncurrent-context: c\n"
    );
    let path = dir.join(format!("{sa}.kubeconfig"));
    std::fs::write(&path, text).expect("write kubeconfig");
    path
}

/// The API server's /metrics text (admin).
pub fn apiserver_metrics(env: &TestEnv) -> String {
    let out = env.kubectl().args(["get", "--raw", "/metrics"]).output().expect("kubectl");
    assert!(out.status.success(), "GET /metrics: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// One pod event as [`ReadyFloor`] saw it: printed when a roll was not one at a time, so a
/// failure says which pods were down together and why.
#[derive(Debug, Clone)]
pub struct PodEvent {
    /// Since the watch started.
    pub at: Duration,
    /// Watch event: `apply`, `init-apply`, `init-done`, `init`, `delete` or `error`.
    pub what: &'static str,
    pub name: String,
    pub resource_version: String,
    pub phase: String,
    /// The pod's Ready condition (regardless of deletion).
    pub ready_condition: bool,
    pub deleting: bool,
    /// `deletionGracePeriodSeconds` once deletion began: the pod's own grace period when its
    /// controller deletes it, 0 when kwok's fake kubelet does.
    pub grace: Option<i64>,
    /// Last five characters of the uid: tells incarnations of one pod name apart.
    pub uid: String,
    pub revision: String,
    pub node: String,
    /// This event is the fake kubelet deleting a live pod (see [`ReadyFloor`]).
    pub fake_kubelet_kill: bool,
    /// Members counted Ready after this event (None before the watch synced).
    pub ready_after: Option<usize>,
    /// Members whose pod is Ready right now, kills included (None before the watch synced).
    pub raw_ready_after: Option<usize>,
}

impl std::fmt::Display for PodEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = |v: Option<usize>| v.map_or("-".to_string(), |n| n.to_string());
        write!(
            f,
            "{:>8.3}s {:<10} {:<8} uid=..{:<5} rv={:<8} phase={:<8} ready={:<5} deleting={:<5} grace={:<4} rev={} node={} -> ready {} (raw {}){}",
            self.at.as_secs_f64(),
            self.what,
            self.name,
            self.uid,
            self.resource_version,
            self.phase,
            self.ready_condition,
            self.deleting,
            self.grace.map_or("-".to_string(), |g| g.to_string()),
            self.revision,
            self.node,
            n(self.ready_after),
            n(self.raw_ready_after),
            if self.fake_kubelet_kill { "  <- fake kubelet deleted a live pod" } else { "" },
        )
    }
}

/// What [`ReadyFloor`] keeps.
#[derive(Default)]
struct FloorState {
    /// Pod name → counted Ready (Ready condition and not being deleted), the synced view.
    members: std::collections::BTreeMap<String, bool>,
    /// The view a relist is building; replaces `members` when it is done.
    relist: std::collections::BTreeMap<String, bool>,
    /// Pod name → how it counted just before the fake kubelet deleted it, until a new
    /// incarnation of that name is Ready (or its controller deletes it).
    killed: std::collections::BTreeMap<String, bool>,
    /// Uids seen alive (not being deleted), and uids whose deletion was already seen.
    alive: BTreeSet<String>,
    deleting: BTreeSet<String>,
    floor: Option<usize>,
    raw_floor: Option<usize>,
    events: usize,
    kills: usize,
    timeline: Vec<PodEvent>,
}

impl FloorState {
    /// (Ready as the roll left it, Ready right now).
    fn counts(&self) -> (usize, usize) {
        let raw = self.members.values().filter(|r| **r).count();
        let names: BTreeSet<&String> = self.members.keys().chain(self.killed.keys()).collect();
        let ready = names
            .into_iter()
            .filter(|n| self.killed.get(*n).or_else(|| self.members.get(*n)).copied().unwrap_or(false))
            .count();
        (ready, raw)
    }
}

/// Follows the pods of an instance through a watch and keeps the lowest number of members
/// that were Ready (and not being deleted) at any moment: exact, unlike sampling, however
/// quickly the fake kubelet replaces pods. A relist (watch restart) replaces the view as a
/// whole, so a pod deleted while the watch was down does not linger in it.
///
/// kwok (v0.7) is no kubelet in one respect that matters here: it plays its `pod-delete`
/// stage once per watch event of a terminating pod (the StatefulSet controller's graceful
/// deletion, then kwok's own grace-0 deletion), and deletes by name without a uid
/// precondition, so the second, stale job can delete the StatefulSet's replacement pod of the
/// same name (seen as a pod whose deletion starts at grace 0 although its spec asks for
/// more). A real kubelet never deletes a pod object. Such a kill is recorded (timeline,
/// [`ReadyFloor::fake_kubelet_kills`]) and the floor keeps counting that member as it was just
/// before the kill until a new incarnation is Ready; [`ReadyFloor::raw_floor`] has the count
/// with the kills.
pub struct ReadyFloor {
    state: Arc<Mutex<FloorState>>,
    task: tokio::task::JoinHandle<()>,
}

impl ReadyFloor {
    pub fn start(env: &TestEnv, instance: &str) -> ReadyFloor {
        use k8s_openapi::api::core::v1::Pod;
        let pods: Api<Pod> = env.api();
        let cfg = watcher::Config::default().labels(&format!("{INSTANCE_LABEL}={instance}"));
        let state: Arc<Mutex<FloorState>> = Arc::new(Mutex::new(FloorState::default()));
        let st = Arc::clone(&state);
        let started = Instant::now();
        let task = tokio::spawn(async move {
            let mut stream = watcher::watcher(pods, cfg).boxed();
            let mut initialized = false;
            let describe = |what: &'static str, p: Option<&Pod>| {
                let ready_condition = p
                    .and_then(|p| p.status.as_ref())
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                PodEvent {
                    at: started.elapsed(),
                    what,
                    name: p.map(|p| p.name_any()).unwrap_or_default(),
                    resource_version: p.and_then(|p| p.resource_version()).unwrap_or_default(),
                    phase: p
                        .and_then(|p| p.status.as_ref())
                        .and_then(|s| s.phase.clone())
                        .unwrap_or_default(),
                    ready_condition,
                    deleting: p.is_some_and(|p| p.metadata.deletion_timestamp.is_some()),
                    grace: p.and_then(|p| p.metadata.deletion_grace_period_seconds),
                    uid: p
                        .and_then(|p| p.uid())
                        .map(|u| u.chars().rev().take(5).collect::<Vec<_>>().into_iter().rev().collect())
                        .unwrap_or_default(),
                    revision: p
                        .and_then(|p| p.labels().get("controller-revision-hash").cloned())
                        .unwrap_or_default(),
                    node: p
                        .and_then(|p| p.spec.as_ref())
                        .and_then(|s| s.node_name.clone())
                        .unwrap_or_default(),
                    fake_kubelet_kill: false,
                    ready_after: None,
                    raw_ready_after: None,
                }
            };
            while let Some(ev) = stream.next().await {
                let mut guard = st.lock().unwrap_or_else(|e| e.into_inner());
                let s = &mut *guard;
                let pod = match &ev {
                    Ok(
                        watcher::Event::Apply(p) | watcher::Event::InitApply(p) | watcher::Event::Delete(p),
                    ) => Some(p),
                    _ => None,
                };
                let mut record = match &ev {
                    Ok(watcher::Event::Apply(p)) => describe("apply", Some(p)),
                    Ok(watcher::Event::InitApply(p)) => describe("init-apply", Some(p)),
                    Ok(watcher::Event::Delete(p)) => describe("delete", Some(p)),
                    Ok(watcher::Event::Init) => describe("init", None),
                    Ok(watcher::Event::InitDone) => describe("init-done", None),
                    Err(e) => PodEvent { name: e.to_string(), ..describe("error", None) },
                };
                let counted = record.ready_condition && !record.deleting;
                if let Some(p) = pod {
                    let uid = p.uid().unwrap_or_default();
                    let deleting = record.deleting || matches!(ev, Ok(watcher::Event::Delete(_)));
                    if !deleting {
                        s.alive.insert(uid.clone());
                    } else if s.deleting.insert(uid.clone()) {
                        // The first sign of this pod's deletion: who began it?
                        let own_grace =
                            p.spec.as_ref().and_then(|sp| sp.termination_grace_period_seconds).unwrap_or(30);
                        let live = s.alive.contains(&uid) && !matches!(ev, Ok(watcher::Event::InitApply(_)));
                        if live && record.grace == Some(0) && own_grace > 0 {
                            record.fake_kubelet_kill = true;
                            s.kills += 1;
                            let before = s.members.get(&record.name).copied().unwrap_or(false);
                            s.killed.insert(record.name.clone(), before);
                        } else {
                            // Its controller deletes it: that counts from now on.
                            s.killed.remove(&record.name);
                        }
                    }
                    if counted {
                        s.killed.remove(&record.name);
                    }
                }
                match ev {
                    Ok(watcher::Event::Apply(_)) => {
                        s.members.insert(record.name.clone(), counted);
                    }
                    Ok(watcher::Event::InitApply(_)) => {
                        s.relist.insert(record.name.clone(), counted);
                    }
                    Ok(watcher::Event::Delete(_)) => {
                        s.members.remove(&record.name);
                    }
                    Ok(watcher::Event::Init) => {
                        initialized = false;
                        s.relist.clear();
                    }
                    Ok(watcher::Event::InitDone) => {
                        initialized = true;
                        s.members = std::mem::take(&mut s.relist);
                    }
                    Err(_) => {}
                }
                if initialized && ev.is_ok() {
                    s.events += 1;
                    let (ready, raw) = s.counts();
                    s.floor = Some(s.floor.map_or(ready, |f| f.min(ready)));
                    s.raw_floor = Some(s.raw_floor.map_or(raw, |f| f.min(raw)));
                    record.ready_after = Some(ready);
                    record.raw_ready_after = Some(raw);
                }
                s.timeline.push(record);
            }
        });
        ReadyFloor { state, task }
    }

    /// (lowest Ready count seen, pod events seen) since the watch synced; a member the fake
    /// kubelet deleted counts as it was before (see the type's documentation).
    pub fn floor(&self) -> (Option<usize>, usize) {
        let g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        (g.floor, g.events)
    }

    /// Lowest number of pods actually Ready at any moment, the fake kubelet's kills included.
    pub fn raw_floor(&self) -> Option<usize> {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).raw_floor
    }

    /// How many live pods kwok's stale `pod-delete` jobs deleted.
    pub fn fake_kubelet_kills(&self) -> usize {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).kills
    }

    /// Ready members now (None before the watch synced).
    pub fn ready_now(&self) -> Option<usize> {
        let g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        g.floor.map(|_| g.counts().0)
    }

    /// Every watch event so far, one line each (for a failure message).
    pub fn timeline(&self) -> String {
        let g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        g.timeline.iter().map(|e| format!("{e}\n")).collect()
    }

    /// The recorded events themselves.
    pub fn events(&self) -> Vec<PodEvent> {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).timeline.clone()
    }
}

impl Drop for ReadyFloor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Frees a test namespace for deletion when the test ends: the operator is gone by then, so
/// the finalizers of the custom resources are stripped (else the namespace would hang in
/// Terminating and its claims would hold the cluster's small volume pool forever). On a
/// failure the namespace is deleted too (its operator log was printed), unless
/// `STATEWARD_KEEP_NAMESPACES=1`: kept namespaces would drain the shared volume pool.
/// Declare it right after the `TestEnv` so it runs first.
pub struct Teardown<'a> {
    env: &'a TestEnv,
    namespace: String,
}

impl<'a> Teardown<'a> {
    pub fn new(env: &'a TestEnv) -> Teardown<'a> {
        Teardown { env, namespace: env.namespace.clone() }
    }
}

impl Drop for Teardown<'_> {
    fn drop(&mut self) {
        if std::env::var_os("STATEWARD_KEEP_NAMESPACES").is_some_and(|v| v == "1") {
            return;
        }
        let quiet = |cmd: &mut Command| {
            let _ = cmd.stdout(Stdio::null()).stderr(Stdio::null()).status();
        };
        for kind in KINDS {
            let Ok(out) =
                self.env.kubectl().args(["get", kind.plural, "-n", &self.namespace, "-o", "name"]).output()
            else {
                continue;
            };
            for obj in String::from_utf8_lossy(&out.stdout).lines() {
                quiet(self.env.kubectl().args([
                    "patch",
                    "-n",
                    &self.namespace,
                    obj,
                    "--type",
                    "merge",
                    "-p",
                    r#"{"metadata":{"finalizers":null}}"#,
                ]));
            }
        }
        if std::thread::panicking() {
            eprintln!(
                "e2e: deleting namespace {} of the failed test (STATEWARD_KEEP_NAMESPACES=1 keeps it)",
                self.namespace
            );
            quiet(self.env.kubectl().args([
                "delete",
                "namespace",
                &self.namespace,
                "--wait=false",
                "--ignore-not-found",
            ]));
        }
    }
}

/// Whether an Event with `reason` about `name` appears within 20 s (Events are written after
/// the status, and asynchronously).
pub async fn has_event(env: &TestEnv, name: &str, reason: &str) -> bool {
    let events: Api<k8s_openapi::api::core::v1::Event> = env.api();
    let fields = format!("involvedObject.name={name},reason={reason}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if events.list(&ListParams::default().fields(&fields)).await.is_ok_and(|l| !l.items.is_empty()) {
            return true;
        }
        tokio::time::sleep(POLL).await;
    }
    false
}

/// `kubectl stateward ARGS` with this build installed as kubectl's plugin (`kubectl-stateward`
/// on PATH), as a user runs it, against `env`'s cluster; returns what it printed, failing the
/// test if it failed.
pub fn kubectl_stateward(env: &TestEnv, args: &[&str]) -> String {
    let dir = std::env::temp_dir().join(format!("stateward-kubectl-plugin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("plugin dir");
    let link = dir.join("kubectl-stateward");
    if !link.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_stateward"), &link).expect("link kubectl-stateward");
    }
    let path = format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default());
    // kubectl takes no flag before a plugin's name: the kubeconfig goes by the environment.
    let out = std::process::Command::new(stateward_testkit::kubectl_binary())
        .arg("stateward")
        .args(args)
        .env("PATH", path)
        .env("KUBECONFIG", env.kubeconfig())
        .output()
        .expect("kubectl stateward");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "kubectl stateward {args:?} failed: {text}");
    text
}

/// The client Services of the instance `name` (every one but the headless).
pub async fn client_services(env: &TestEnv, name: &str) -> Vec<k8s_openapi::api::core::v1::Service> {
    let services: Api<k8s_openapi::api::core::v1::Service> = env.api();
    let list = services
        .list(&ListParams::default().labels(&format!("{INSTANCE_LABEL}={name}")))
        .await
        .expect("list Services");
    list.items
        .into_iter()
        .filter(|s| s.spec.as_ref().and_then(|sp| sp.cluster_ip.as_deref()) != Some("None"))
        .collect()
}

/// The pods in the endpoints of the instance's client Services, together.
pub async fn client_endpoints(env: &TestEnv, name: &str) -> BTreeSet<String> {
    let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> = env.api();
    let mut pods = BTreeSet::new();
    for svc in client_services(env, name).await {
        let selector = format!("kubernetes.io/service-name={}", svc.name_any());
        let list = slices.list(&ListParams::default().labels(&selector)).await.expect("list EndpointSlices");
        for slice in list.items {
            pods.extend(slice.endpoints.into_iter().filter_map(|e| e.target_ref.and_then(|r| r.name)));
        }
    }
    pods
}
