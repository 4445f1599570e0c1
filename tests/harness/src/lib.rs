//! Local control plane helper for tests.
//!
//! stateward is only proven against a real API server, so tests run on the local cluster
//! that `tests/cluster/up` starts (etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler and kwok on loopback; see `tests/cluster/README.md`).
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! let env = stateward_testkit::TestEnv::new("my-test").await?;
//! // env.client: a kube::Client for the cluster; env.namespace: fresh, only this test's.
//! let status = env.kubectl().args(["get", "pods", "-n", &env.namespace]).status()?;
//! # Ok(()) }
//! ```
//!
//! - [`TestEnv::new`] brings the cluster up once per process (running `tests/cluster/up`,
//!   which reuses a healthy cluster, so many test binaries share one), creates a fresh
//!   namespace and waits until pods can be admitted in it.
//! - The namespace is deleted when the `TestEnv` is dropped, except when the test is
//!   panicking (kept for debugging, its name is printed) or `STATEWARD_KEEP_NAMESPACES=1`.
//! - `STATEWARD_KUBECONFIG=<path>` uses an already running cluster instead of `up`.
//! - Teardown is `tests/cluster/down` at the end of the run (`.ci/run` calls it unless
//!   `STATEWARD_KEEP_CLUSTER=1`).
//! - [`real::RealPods`] runs a test on the real-pods cluster (`up --real`: a kubelet running
//!   real containers), inside that cluster's network namespace.
//! - [`components`] builds the plugins and fixtures as WebAssembly components.
//! - [`report`] records what a test measured (timings) for the run's table, apart from its
//!   verdict.
//! - [`LoopbackCert`] issues a serving certificate for 127.0.0.1, for webhooks a test
//!   serves to the API server.

#![forbid(unsafe_code)]

pub mod components;
pub mod gate;
pub mod real;
pub mod report;
pub mod servers;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, ServiceAccount};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use tokio::sync::OnceCell;

/// Label put on every namespace the testkit creates, so leftovers can be found in bulk.
pub const NAMESPACE_LABEL: &str = "stateward.test/testkit";
/// Label carried by the pre-created PersistentVolumes of the cluster's volume pool.
pub const VOLUME_POOL_LABEL: &str = "stateward.test/pool=local";
/// How long `up` may take before the test gives up (a warm start takes ~20 s).
const UP_TIMEOUT: Duration = Duration::from_secs(240);
/// How long a fresh namespace may take to get its default service account.
const NAMESPACE_READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The running cluster shared by every test of this process.
#[derive(Debug, Clone)]
pub struct Cluster {
    kubeconfig: PathBuf,
}

static CLUSTER: OnceCell<Cluster> = OnceCell::const_new();

/// `tests/cluster` in this checkout (the scripts live next to this crate).
pub fn cluster_dir() -> PathBuf {
    components::workspace_root().join("tests").join("cluster")
}

/// The shared cluster, started on first use: `tests/cluster/up` is run once per process
/// and itself reuses a healthy cluster started by an earlier process.
pub async fn cluster() -> anyhow::Result<&'static Cluster> {
    CLUSTER.get_or_try_init(start_cluster).await
}

async fn start_cluster() -> anyhow::Result<Cluster> {
    if let Some(path) = std::env::var_os("STATEWARD_KUBECONFIG") {
        return Ok(Cluster { kubeconfig: PathBuf::from(path) });
    }
    let kubeconfig = run_up(&[], UP_TIMEOUT).await?;
    let cluster = Cluster { kubeconfig };
    let client = cluster.client().await?;
    recycle_released_volumes(&client).await?;
    Ok(cluster)
}

/// Runs `tests/cluster/up` with `args` and returns the kubeconfig path it prints last; its
/// progress (stderr) is passed on.
async fn run_up(args: &[&str], timeout: Duration) -> anyhow::Result<PathBuf> {
    let up = cluster_dir().join("up");
    let mut cmd = tokio::process::Command::new(&up);
    cmd.args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let what = format!("{} {}", up.display(), args.join(" "));
    let output = tokio::time::timeout(timeout, cmd.output())
        .await
        .with_context(|| format!("{what} did not finish within {timeout:?}"))?
        .with_context(|| format!("could not run {what}"))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        bail!("{what} failed ({}):\n{stderr}", output.status);
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let Some(path) = stdout.lines().rev().find(|l| !l.trim().is_empty()) else {
        bail!("{what} printed no kubeconfig path:\n{stderr}");
    };
    eprint!("{stderr}");
    Ok(PathBuf::from(path.trim()))
}

impl Cluster {
    /// Path of the admin kubeconfig (client certificate in `system:masters`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// A new client for the cluster. Clients are bound to the tokio runtime they were
    /// made in, so each test makes its own.
    pub async fn client(&self) -> anyhow::Result<Client> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)
            .with_context(|| format!("reading {}", self.kubeconfig.display()))?;
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        Ok(Client::try_from(config)?)
    }

    /// The built kubectl (same version as the cluster) with `--kubeconfig` set.
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new(kubectl_binary());
        cmd.arg("--kubeconfig").arg(&self.kubeconfig);
        cmd
    }
}

/// Runs a kubectl command (one of [`Cluster::kubectl`]'s, its arguments set), with `stdin` on its
/// standard input when given; what it printed and how it ended.
pub fn run_kubectl(cmd: &mut Command, stdin: Option<&str>) -> std::io::Result<std::process::Output> {
    use std::io::Write as _;
    use std::process::Stdio;
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn()?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())?;
    }
    child.wait_with_output()
}

/// Waits until every named CRD (`crd/<name>` or `<name>`) is Established, at most 60 s.
///
/// Polls instead of `kubectl wait --for=condition=Established`: that command fails at once
/// ("accessor error: <nil>") when it reads a CRD the API server has not yet given conditions,
/// which happens right after the CRD is applied.
pub fn wait_established<S: AsRef<str>>(kubeconfig: &Path, crds: &[S]) -> anyhow::Result<()> {
    const TIMEOUT: Duration = Duration::from_secs(60);
    let started = std::time::Instant::now();
    for crd in crds {
        let name = crd.as_ref().trim_start_matches("crd/");
        loop {
            let out = Command::new(kubectl_binary())
                .arg("--kubeconfig")
                .arg(kubeconfig)
                .args(["get", "crd", name, "-o"])
                .arg("jsonpath={.status.conditions[?(@.type==\"Established\")].status}")
                .output()
                .context("run kubectl")?;
            if out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "True" {
                break;
            }
            if started.elapsed() > TIMEOUT {
                bail!(
                    "CRD {name} not Established within {TIMEOUT:?}: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
    Ok(())
}

/// Path of the kubectl that `tests/cluster/build` produced (the version in
/// `tests/cluster/k8s/go.mod`), falling back to `kubectl` on PATH.
pub fn kubectl_binary() -> PathBuf {
    built_tool("kubectl", "k8s", "k8s.io/kubernetes")
}

/// Path of the helm that `tests/cluster/build helm` produced (the version in
/// `tests/cluster/helm/go.mod`), falling back to `helm` on PATH.
pub fn helm_binary() -> PathBuf {
    built_tool("helm", "helm", "helm.sh/helm/v4")
}

/// `$STATEWARD_CACHE/bin/<name>-<version>`, the version being `module`'s in
/// `tests/cluster/<moddir>/go.mod` (as tests/cluster/lib.sh reads it); `name` on PATH when
/// either is unknown.
fn built_tool(name: &str, moddir: &str, module: &str) -> PathBuf {
    let version = std::fs::read_to_string(cluster_dir().join(moddir).join("go.mod")).ok().and_then(|gomod| {
        gomod.lines().find_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            match words.as_slice() {
                ["require", m, v, ..] | [m, v, ..] if *m == module && v.starts_with('v') => {
                    Some(v.to_string())
                }
                _ => None,
            }
        })
    });
    let cache = std::env::var_os("STATEWARD_CACHE").map(PathBuf::from).or_else(|| {
        std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|c| c.join("stateward"))
    });
    match (cache, version) {
        (Some(cache), Some(v)) => cache.join("bin").join(format!("{name}-{v}")),
        _ => PathBuf::from(name),
    }
}

/// Makes Released volumes of the pool Available again (their claims are gone, and with no
/// provisioner nothing else would ever free them), so long test runs do not drain it.
pub async fn recycle_released_volumes(client: &Client) -> anyhow::Result<()> {
    recycle_and_wipe_released_volumes(client, None).await
}

/// [`recycle_released_volumes`], and for the volumes whose `local.path` lies under `wipe_under`
/// (the real-pods cluster's own volume directories) their contents removed first, as a
/// `Recycle` policy would: the next claim starts empty, not with an earlier test's data.
pub async fn recycle_and_wipe_released_volumes(
    client: &Client,
    wipe_under: Option<&Path>,
) -> anyhow::Result<()> {
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let list = pvs.list(&ListParams::default().labels(VOLUME_POOL_LABEL)).await?;
    for pv in list {
        let released = pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released");
        if let (true, Some(name)) = (released, pv.metadata.name.as_deref()) {
            let local = pv.spec.as_ref().and_then(|s| s.local.as_ref()).map(|l| PathBuf::from(&l.path));
            if let (Some(dir), Some(root)) = (local, wipe_under) {
                if dir.starts_with(root) && dir.is_dir() {
                    for entry in std::fs::read_dir(&dir)?.flatten() {
                        let path = entry.path();
                        let removed = if path.is_dir() && !path.is_symlink() {
                            std::fs::remove_dir_all(&path)
                        } else {
                            std::fs::remove_file(&path)
                        };
                        match removed {
                            // Another test entering at the same moment wiped it first.
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                            other => other.with_context(|| format!("wiping {}", path.display()))?,
                        }
                    }
                }
            }
            let patch = serde_json::json!({ "spec": { "claimRef": null } });
            pvs.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        }
    }
    Ok(())
}

/// One test's slice of the cluster: its own namespace and client.
pub struct TestEnv {
    /// Client for the shared cluster, made in the calling test's runtime.
    pub client: Client,
    /// A namespace created for this test only.
    pub namespace: String,
    cluster: Cluster,
}

impl std::fmt::Debug for TestEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestEnv").field("namespace", &self.namespace).finish_non_exhaustive()
    }
}

impl TestEnv {
    /// Brings the cluster up if needed, then creates a namespace named `<prefix>-<unique>`
    /// and waits until its default service account exists (pods are rejected before).
    pub async fn new(prefix: &str) -> anyhow::Result<TestEnv> {
        TestEnv::in_cluster(cluster().await?.clone(), prefix).await
    }

    /// A fresh namespace `<prefix>-<unique>` on the given cluster (e.g. the real-pods one,
    /// see [`real::RealPods`]).
    pub async fn in_cluster(cluster: Cluster, prefix: &str) -> anyhow::Result<TestEnv> {
        let client = cluster.client().await?;
        // Namespaces of finished tests release their claims while the run goes on: free those
        // volumes before each test, not only when the process starts, or a long run drains
        // the pool and a later test's pods never schedule. The real-pods cluster's volumes
        // (directories beside its kubeconfig) are wiped first, so no test inherits data.
        let volumes = cluster.kubeconfig().parent().map(|dir| dir.join("volumes"));
        recycle_and_wipe_released_volumes(&client, volumes.as_deref()).await?;
        let namespace = unique_name(prefix);
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": { "name": namespace, "labels": { NAMESPACE_LABEL: "true" } }
        }))?;
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {namespace}"))?;
        let env = TestEnv { client, namespace, cluster };
        let sas: Api<ServiceAccount> = Api::namespaced(env.client.clone(), &env.namespace);
        let deadline = tokio::time::Instant::now() + NAMESPACE_READY_TIMEOUT;
        while sas.get_opt("default").await?.is_none() {
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "namespace {} got no default service account within {NAMESPACE_READY_TIMEOUT:?}",
                    env.namespace
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(env)
    }

    /// Path of the admin kubeconfig of the cluster.
    pub fn kubeconfig(&self) -> &Path {
        self.cluster.kubeconfig()
    }

    /// The cluster this environment lives in.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// The built kubectl with `--kubeconfig` set (add `-n` yourself when needed).
    pub fn kubectl(&self) -> Command {
        self.cluster.kubectl()
    }

    /// Runs the built kubectl with `args`, and `stdin` on its standard input when given; what
    /// it printed and how it ended. The one place tests run kubectl: their helpers call it.
    pub fn kubectl_output(
        &self,
        args: &[&str],
        stdin: Option<&str>,
    ) -> std::io::Result<std::process::Output> {
        run_kubectl(self.kubectl().args(args), stdin)
    }

    /// Typed API for a namespaced kind in this test's namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("stateward-testkit: test failed; keeping namespace {} for inspection", self.namespace);
            return;
        }
        if std::env::var_os("STATEWARD_KEEP_NAMESPACES").is_some_and(|v| v == "1") {
            return;
        }
        // Fire-and-forget through kubectl: Drop cannot await, and the client belongs to a
        // runtime that may be shutting down.
        let _ = self
            .kubectl()
            .args(["delete", "namespace", &self.namespace, "--wait=false", "--ignore-not-found"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// `<prefix>-<suffix>`, a valid DNS label unique across processes and calls.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let clean: String = prefix
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
        .take(40)
        .collect();
    let clean = clean.trim_matches('-');
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let suffix = (u64::from(std::process::id()) << 20 ^ u64::from(nanos) ^ u64::from(n) << 40) % 0xff_ffff;
    format!("{}-{suffix:06x}{n}", if clean.is_empty() { "t" } else { clean })
}

/// A TLS serving certificate for `127.0.0.1`/`localhost` signed by a throwaway CA, for
/// endpoints (webhooks) that a test serves and the API server must trust.
pub struct LoopbackCert {
    /// PEM of the CA to put in a webhook's `caBundle`.
    pub ca_pem: String,
    /// PEM of the serving certificate (leaf only).
    pub cert_pem: String,
    /// PEM (PKCS#8) of the serving key.
    pub key_pem: String,
    /// DER of the serving certificate.
    pub cert_der: Vec<u8>,
    /// DER (PKCS#8) of the serving key.
    pub key_der: Vec<u8>,
}

impl LoopbackCert {
    /// Generates a fresh CA and a leaf for `127.0.0.1`, `::1` and `localhost`.
    pub fn generate() -> anyhow::Result<LoopbackCert> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.distinguished_name.push(DnType::CommonName, "stateward-testkit-ca");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = rcgen::Issuer::new(ca_params, ca_key);

        let key = KeyPair::generate()?;
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "::1".to_owned(), "localhost".to_owned()])?;
        params.distinguished_name.push(DnType::CommonName, "127.0.0.1");
        let cert = params.signed_by(&key, &issuer)?;
        Ok(LoopbackCert {
            ca_pem: ca_cert.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().to_vec(),
            key_der: key.serialize_der(),
        })
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn unique_names_are_dns_labels_and_differ() {
        let a = unique_name("Stateful_Set test");
        let b = unique_name("Stateful_Set test");
        assert_ne!(a, b);
        for n in [&a, &b] {
            assert!(n.len() <= 63, "{n}");
            assert!(n.starts_with("stateful-set-test-"), "{n}");
            assert!(n.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'), "{n}");
        }
    }

    #[test]
    fn loopback_cert_covers_loopback_ip() {
        let c = LoopbackCert::generate().expect("cert");
        assert!(c.ca_pem.contains("BEGIN CERTIFICATE"));
        assert!(c.key_pem.contains("PRIVATE KEY"));
        assert!(!c.cert_der.is_empty());
    }
}
