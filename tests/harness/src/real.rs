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
//! The test's name is never typed by hand: it is the name libtest gave the test's thread, and
//! the child must report that exactly one test ran and passed (a name that matched nothing
//! would run no test and exit 0: a silent pass). A child that runs past its time
//! (`STATEWARD_REALPODS_TEST_TIMEOUT_SECS`, 40 minutes) is taken for hung and killed with its
//! process group.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use stateward_testkit::real::{RealPods, Weight};
//! let Some(env) = RealPods::enter(Weight::Light, "pg").await? else { return Ok(()) };
//! // inside the namespace: env.client, env.namespace, env.kubectl() …
//! # Ok(()) }
//! ```

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::sync::OnceCell;

pub use crate::gate::Weight;
use crate::gate::{Gate, DEFAULT_CAPACITY};
use crate::{recycle_and_wipe_released_volumes, run_up, Cluster, TestEnv};

/// Set in the re-executed child: the name of the test it runs inside the namespace.
const CHILD_ENV: &str = "STATEWARD_REALPODS_TEST";
/// Set in the child: the real cluster's admin kubeconfig.
const KUBECONFIG_ENV: &str = "STATEWARD_REALPODS_KUBECONFIG";
/// How long one real-pods test may run before it is taken for hung and killed.
const TIMEOUT_ENV: &str = "STATEWARD_REALPODS_TEST_TIMEOUT_SECS";
/// The longest real-pods tests take about 10 minutes on a busy 2-core machine.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(40 * 60);
/// How many units of [`Weight`] run at once (see [`crate::gate`]).
const CAPACITY_ENV: &str = "STATEWARD_REALPODS_CAPACITY";
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

/// The gate every real-pods test of this process passes, by its [`Weight`].
fn gate() -> &'static Gate {
    static GATE: std::sync::OnceLock<Gate> = std::sync::OnceLock::new();
    GATE.get_or_init(|| Gate::new(env_or(CAPACITY_ENV, DEFAULT_CAPACITY)))
}

/// Waits until the gate admits a test of `weight`, for a real-pods test that does not enter
/// the shared cluster (it starts one of its own) but loads the machine all the same.
pub async fn admit(weight: Weight) -> crate::gate::Admitted<'static> {
    let expected = current_test().map(|t| expected_duration(&t)).unwrap_or_default();
    gate().admit(weight, expected).await
}

/// How long `test` took in the last run, from its report (`STATEWARD_REPORT_PREVIOUS`, which
/// scripts/test points at the last `stateward-report.json`); zero when unknown.
fn expected_duration(test: &str) -> Duration {
    static LAST: std::sync::OnceLock<std::collections::HashMap<String, f64>> = std::sync::OnceLock::new();
    let last = LAST.get_or_init(|| {
        let Some(path) = std::env::var_os(crate::report::PREVIOUS_ENV) else { return Default::default() };
        let text = std::fs::read_to_string(path).unwrap_or_default();
        crate::report::durations(&text)
    });
    last.get(test).map_or(Duration::ZERO, |s| Duration::from_secs_f64(s.max(0.0)))
}

/// Entry point of a real-pods test; see the module documentation.
pub struct RealPods;

impl RealPods {
    /// Outside the namespace: waits for the gate to admit a test of `weight`, then runs the
    /// calling test (this binary's test of the same name) inside it and returns `Ok(None)` when
    /// it passed. Inside: a fresh namespace `<prefix>-…` on the real cluster.
    pub async fn enter(weight: Weight, prefix: &str) -> anyhow::Result<Option<TestEnv>> {
        let test = current_test()?;
        if Self::inside() {
            return Self::enter_gated(&test, prefix).await;
        }
        let queued = Instant::now();
        let _admitted = gate().admit(weight, expected_duration(&test)).await;
        let waited = queued.elapsed();
        if waited > Duration::from_secs(1) {
            eprintln!("realpods: {test} ({weight:?}) admitted after {waited:.0?} in line");
        }
        Self::enter_gated(&test, prefix).await
    }

    async fn enter_gated(test: &str, prefix: &str) -> anyhow::Result<Option<TestEnv>> {
        if std::env::var(CHILD_ENV).is_ok_and(|t| t == test) {
            let kubeconfig =
                std::env::var_os(KUBECONFIG_ENV).context("the re-executed test has no kubeconfig")?;
            let cluster = Cluster { kubeconfig: PathBuf::from(kubeconfig) };
            return TestEnv::in_cluster(cluster, prefix).await.map(Some);
        }
        Self::run_inside(test).await.map(|()| None)
    }

    /// Runs this binary's test `test` alone inside the cluster's network namespace and fails
    /// unless exactly that one test ran and passed. Its output is forwarded as it comes; its
    /// duration goes to the run's report.
    pub async fn run_inside(test: &str) -> anyhow::Result<()> {
        let real = real_cluster().await?;
        let exe = std::env::current_exe().context("locating the test binary")?;
        let started = Instant::now();
        let mut child = tokio::process::Command::new("nsenter")
            .arg(format!("--net={}", real.netns_path().display()))
            .arg(&exe)
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, test)
            .env(KUBECONFIG_ENV, real.kubeconfig())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("running {test} inside the cluster's network namespace"))?;
        // libtest's own lines (which tests ran, the result) are on stdout; the body's on stderr.
        let mut lines = BufReader::new(child.stdout.take().context("the child's stdout")?).lines();
        let run = async {
            let mut stdout = String::new();
            while let Some(line) = lines.next_line().await? {
                // Straight to the process's stdout (libtest's capture would hide it until a
                // failure), marked as the child's so the run's summary counts the test once.
                let _ = writeln!(std::io::stdout().lock(), "inside: {line}");
                stdout.push_str(&line);
                stdout.push('\n');
            }
            let status = child.wait().await?;
            Ok::<_, std::io::Error>((stdout, status))
        };
        let limit = test_timeout();
        let mut ran_one = true;
        let verdict = match tokio::time::timeout(limit, run).await {
            Ok(Ok((stdout, status))) => {
                let ran = ran_one_test(&stdout);
                ran_one = ran.is_ok();
                ran.and_then(|()| it_passed(&stdout)).and_then(|()| {
                    if status.success() {
                        Ok(())
                    } else {
                        Err(format!("it exited with {status}"))
                    }
                })
            }
            Ok(Err(e)) => Err(format!("reading its output: {e}")),
            Err(_) => {
                // A hang: the whole process group goes (the test, its operators, its kubectls).
                if let Some(pid) = child.id() {
                    let _ = Command::new("kill").args(["-KILL", "--", &format!("-{pid}")]).status();
                }
                Err(format!("it hung: killed after {limit:?} ({TIMEOUT_ENV} to change it)"))
            }
        };
        let outcome = if verdict.is_ok() { "passed" } else { "failed" };
        // A child that ran no test has no duration worth keeping.
        if ran_one {
            crate::report::test_duration(test, started.elapsed(), outcome);
        }
        verdict.map_err(|why| {
            anyhow::anyhow!(
                "{test} failed inside the cluster's network namespace: {why}; its output is above"
            )
        })
    }

    /// True in the re-executed child (inside the namespace).
    pub fn inside() -> bool {
        std::env::var_os(CHILD_ENV).is_some()
    }
}

fn test_timeout() -> Duration {
    Duration::from_secs(env_or(TIMEOUT_ENV, DEFAULT_TIMEOUT.as_secs()))
}

/// The variable `name` parsed, or `default` when it is unset or not a `T`.
fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The name libtest runs the calling test under: the name of its thread (a `#[tokio::test]`
/// body runs on the test's own thread).
fn current_test() -> anyhow::Result<String> {
    match std::thread::current().name() {
        Some(name) if name != "main" => Ok(name.to_owned()),
        other => bail!("a real-pods test must be called on libtest's thread for it (thread {other:?})"),
    }
}

/// Whether a test binary's stdout says exactly one test ran.
fn ran_one_test(stdout: &str) -> Result<(), String> {
    let ran = stdout.lines().find_map(|l| l.strip_prefix("running ")).map(|rest| rest.trim());
    if ran == Some("1 test") {
        return Ok(());
    }
    Err(format!("the child should run exactly one test, it said \"running {}\"", ran.unwrap_or("?")))
}

/// Whether a test binary's stdout says its one test passed.
fn it_passed(stdout: &str) -> Result<(), String> {
    let result = stdout.lines().find_map(|l| l.strip_prefix("test result: ")).unwrap_or("");
    if result.starts_with("ok. 1 passed; 0 failed;") {
        Ok(())
    } else {
        Err(format!("its result: \"{result}\""))
    }
}

/// A pod of `image` that runs nothing but waits, as the service user `uid`, with `env` (a list
/// of container env entries): the client a test execs its `psql`, `redis-cli` or `curl` in,
/// inside the cluster. It stops at once when deleted.
pub fn client_pod(name: &str, image: &str, uid: u32, env: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name },
        "spec": {
            "securityContext": { "runAsUser": uid, "runAsGroup": uid, "runAsNonRoot": true },
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "client", "image": image, "imagePullPolicy": "Never",
                "command": ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"],
                "env": env,
            }],
        }
    })
}

/// The built kubectl for the real cluster; only meaningful inside the namespace.
pub fn kubectl(kubeconfig: &Path) -> Command {
    let mut cmd = Command::new(crate::kubectl_binary());
    cmd.arg("--kubeconfig").arg(kubeconfig);
    cmd
}

#[cfg(test)]
mod tests {
    use super::{it_passed, ran_one_test};

    fn one_test_passed(stdout: &str) -> Result<(), String> {
        ran_one_test(stdout).and_then(|()| it_passed(stdout))
    }

    #[test]
    fn a_child_that_ran_no_test_or_failed_is_no_pass() {
        let ok = "\nrunning 1 test\ntest a::b ... ok\n\ntest result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 9 filtered out; finished in 1.00s\n";
        assert_eq!(one_test_passed(ok), Ok(()));
        let none = "\nrunning 0 tests\n\ntest result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 10 filtered out; finished in 0.00s\n";
        assert!(one_test_passed(none).is_err_and(|e| e.contains("running 0 tests")));
        let failed =
            "running 1 test\ntest a::b ... FAILED\ntest result: FAILED. 0 passed; 1 failed; 0 ignored\n";
        assert!(one_test_passed(failed).is_err_and(|e| e.contains("FAILED")));
        assert!(one_test_passed("").is_err());
    }

    #[test]
    fn the_test_name_is_the_threads() {
        assert_eq!(super::current_test().ok().as_deref(), Some("real::tests::the_test_name_is_the_threads"));
    }
}
