//! The real-pods cluster (`tests/cluster/up --real`): a kubelet running real containers, all
//! inside a network namespace of the cluster's own.
//!
//! Pod and Service addresses may only be reached from inside that namespace, so a real-pods
//! test runs its body there: called from the test thread outside, [`RealPods::enter`] starts the
//! cluster once per process and re-executes this test binary for the one test under
//! `nsenter --net=…`, reports that child's result and returns `None`; in the child it returns the
//! test's environment. Everything the body starts (the operator, kubectl, its own clients)
//! inherits the namespace.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use stateward_testkit::real::RealPods;
//! let Some(env) = RealPods::enter("my_test_fn", "pg").await? else { return Ok(()) };
//! // inside the namespace: env.client, env.namespace, env.kubectl() …
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context as _};
use tokio::sync::{OnceCell, RwLock};

use crate::{recycle_and_wipe_released_volumes, run_up, Cluster, TestEnv};

/// Set in the re-executed child: the name of the test it runs inside the namespace.
const CHILD_ENV: &str = "STATEWARD_REALPODS_TEST";
/// Set in the child: the real cluster's admin kubeconfig.
const KUBECONFIG_ENV: &str = "STATEWARD_REALPODS_KUBECONFIG";
/// A cold `up --real` imports images and waits for the node: allow more than the kwok cluster.
const UP_TIMEOUT: Duration = Duration::from_secs(300);

static REAL: OnceCell<RealCluster> = OnceCell::const_new();

/// The running real-pods cluster: its kubeconfig (the API server on 127.0.0.1, reachable from
/// both sides) and its network namespace.
#[derive(Debug, Clone)]
pub struct RealCluster {
    kubeconfig: PathBuf,
    netns: String,
}

impl RealCluster {
    /// The network namespace, as `/run/netns/<name>`.
    pub fn netns_path(&self) -> PathBuf {
        Path::new("/run/netns").join(&self.netns)
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }
}

/// Starts (or reuses) the real-pods cluster, once per process.
pub async fn real_cluster() -> anyhow::Result<&'static RealCluster> {
    REAL.get_or_try_init(start).await
}

async fn start() -> anyhow::Result<RealCluster> {
    let kubeconfig = run_up(&["--real"], UP_TIMEOUT).await?;
    let netns_file = kubeconfig.parent().context("kubeconfig has no directory")?.join("netns");
    let netns = std::fs::read_to_string(&netns_file)
        .with_context(|| format!("reading {}", netns_file.display()))?
        .trim()
        .to_owned();
    let client = Cluster { kubeconfig: kubeconfig.clone() }.client().await?;
    let volumes = kubeconfig.parent().context("kubeconfig has no directory")?.join("volumes");
    recycle_and_wipe_released_volumes(&client, Some(&volumes)).await?;
    Ok(RealCluster { kubeconfig, netns })
}

/// Tests of this process share the cluster (a read guard each) except those that change it
/// cluster-wide (the operator installed with its cluster-scoped webhooks, which would decide
/// every other test's custom resources): those run alone (the write guard, fair, so they are
/// not starved).
static CLUSTER_GATE: RwLock<()> = RwLock::const_new(());

/// Entry point of a real-pods test; see the module documentation.
pub struct RealPods;

impl RealPods {
    /// Outside the namespace: runs `test` (this binary's test of that exact name) inside it and
    /// returns `Ok(None)` when it passed. Inside: a fresh namespace `<prefix>-…` on the real
    /// cluster.
    pub async fn enter(test: &str, prefix: &str) -> anyhow::Result<Option<TestEnv>> {
        if Self::inside() {
            return Self::enter_gated(test, prefix).await;
        }
        let _shared = CLUSTER_GATE.read().await;
        Self::enter_gated(test, prefix).await
    }

    /// [`RealPods::enter`] for a test that changes the cluster for every namespace, or that
    /// loads the machine so much that the tests beside it would miss their bounds: it runs
    /// while no other real-pods test of this process does.
    pub async fn enter_exclusive(test: &str, prefix: &str) -> anyhow::Result<Option<TestEnv>> {
        if Self::inside() {
            return Self::enter_gated(test, prefix).await;
        }
        let _alone = CLUSTER_GATE.write().await;
        Self::enter_gated(test, prefix).await
    }

    async fn enter_gated(test: &str, prefix: &str) -> anyhow::Result<Option<TestEnv>> {
        if std::env::var(CHILD_ENV).is_ok_and(|t| t == test) {
            let kubeconfig =
                std::env::var_os(KUBECONFIG_ENV).context("the re-executed test has no kubeconfig")?;
            let cluster = Cluster { kubeconfig: PathBuf::from(kubeconfig) };
            return TestEnv::in_cluster(cluster, prefix).await.map(Some);
        }
        let real = real_cluster().await?;
        let exe = std::env::current_exe().context("locating the test binary")?;
        let status = tokio::process::Command::new("nsenter")
            .arg(format!("--net={}", real.netns_path().display()))
            .arg(&exe)
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, test)
            .env(KUBECONFIG_ENV, real.kubeconfig())
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .status()
            .await
            .with_context(|| format!("running {test} inside the cluster's network namespace"))?;
        if !status.success() {
            bail!("{test} failed inside the cluster's network namespace ({status}); its output is above");
        }
        Ok(None)
    }

    /// True in the re-executed child (inside the namespace).
    pub fn inside() -> bool {
        std::env::var_os(CHILD_ENV).is_some()
    }
}

/// The built kubectl for the real cluster; only meaningful inside the namespace.
pub fn kubectl(kubeconfig: &Path) -> Command {
    let mut cmd = Command::new(crate::kubectl_binary());
    cmd.arg("--kubeconfig").arg(kubeconfig);
    cmd
}
