//! The scale benchmark's driver, shared by `benches/scale.rs` (N = 100, 300, 1000) and the
//! smoke test `tests/scale_smoke.rs` (N = 20, part of the test command so this cannot rot).
//!
//! One [`Bench::run`] at size N measures, on the local control plane:
//! - **operator**: `stateward run` under its own ServiceAccount (the project's namespaced
//!   Roles), N mixed custom resources (a third of each kind, 1 replica each) created at once;
//!   time until every one is Running, Available and at its generation;
//! - **writes**: the operator's write requests as the API server dispatched them, counted by
//!   two FlowSchemas that match only that ServiceAccount (one for children, custom resources
//!   and status, one for Events; the Lease renewals are not counted), with
//!   `stateward_api_writes_total` as a cross-check;
//! - **cost**: operator CPU seconds and peak RSS from `/proc/<pid>/{stat,status}`, reconcile
//!   p50/p99 from `stateward_reconcile_duration_seconds`;
//! - **steady state**: a window with no spec change must see zero writes;
//! - **storm**: every spec changed at once; time until all are back at their generation;
//! - **baseline**: in the same run, a plain loader under a ServiceAccount of its own
//!   server-side-applies exactly the children the plugins plan (rendered in-process) with the
//!   same concurrency, and the time until every StatefulSet is ready is the API server's (and
//!   its controllers') ceiling for the same objects.
//!
//! Each phase runs in a namespace of its own that is deleted (and its volumes recycled)
//! before the next one, so the cluster's volume pool is reused.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, Secret};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client, Config, ResourceExt};
use serde_json::{json, Value};

#[path = "../common/mod.rs"]
mod common;
pub use common::{http_get, sum_metric, target_dir, workspace_root, Kind, KINDS};

impl Kind {
    /// The benchmark's resource: one replica (one claim, one pod), small requests.
    /// `memory_limit` is what the change storm turns.
    fn manifest(&self, name: &str, namespace: &str, memory_limit: &str) -> Value {
        json!({
            "apiVersion": "stateward.dev/v1",
            "kind": self.kind,
            "metadata": { "name": name, "namespace": namespace },
            "spec": {
                "version": self.version,
                "replicas": 1,
                "storage": { "size": self.storage },
                "retentionPolicy": "Delete",
                "resources": {
                    "requests": { "cpu": "50m", "memory": "64Mi" },
                    "limits": { "cpu": "250m", "memory": memory_limit },
                },
            }
        })
    }
}

/// Memory limit before and after the change storm (a pod-template change: every StatefulSet
/// rolls its pod).
const MEMORY_BEFORE: &str = "128Mi";
const MEMORY_AFTER: &str = "160Mi";

/// The i-th resource of a run: kinds in turn, so N resources are a third of each.
pub fn resource(i: usize) -> (Kind, String) {
    let kind = KINDS[i % KINDS.len()];
    (kind, format!("{}-{:04}", kind.prefix, i))
}

/// How one run is made.
#[derive(Debug, Clone)]
pub struct Options {
    pub n: usize,
    /// `--concurrency` of the operator (per kind); the loader runs 3× as many workers.
    pub concurrency: u16,
    /// The steady-state window that must see zero writes.
    pub steady: Duration,
    /// Longest wait for any one convergence.
    pub timeout: Duration,
    pub baseline: bool,
    pub storm: bool,
    /// At the end, the operator stopped (SIGTERM, as a rolling upgrade does) and started
    /// again on the same build: the writes it makes to the converged resources are counted.
    pub restart: bool,
    /// Where logs and audit files go.
    pub work_dir: PathBuf,
}

/// What one run measured.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub n: usize,
    pub concurrency: u16,
    /// Children planned per resource (applies and ensure-secrets), averaged over the mix.
    pub children_per_cr: f64,
    /// Time from the first create until every resource is Running/Available.
    pub operator_secs: f64,
    /// Baseline: time until every StatefulSet is ready / until every child was applied.
    pub baseline_secs: Option<f64>,
    pub baseline_apply_secs: Option<f64>,
    /// Baseline's own writes per resource as the API server counted them (sanity: = children).
    pub baseline_writes_per_cr: Option<f64>,
    /// Operator writes (API server's count, Events excluded) per resource until it settled.
    pub writes_per_cr: f64,
    /// Of those, writes to the custom resource itself (finalizer) and its status.
    pub resource_writes_per_cr: f64,
    pub events_per_cr: f64,
    /// `stateward_api_writes_total` per resource over the same interval.
    pub metric_writes_per_cr: f64,
    /// How long after "all Available" the write counter kept moving.
    pub settle_secs: f64,
    pub steady_secs: f64,
    /// Writes (children/status, Events, the operator's own counter) during the steady window.
    pub steady_writes: f64,
    pub steady_events: f64,
    pub steady_metric_writes: f64,
    pub reconciles: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Operator CPU seconds from start to "all Available", and over the whole run.
    pub cpu_converge_secs: f64,
    pub cpu_total_secs: f64,
    /// VmHWM at the end of the run (peak resident set), MiB.
    pub peak_rss_mib: f64,
    /// RSS right after "all Available", MiB.
    pub rss_converged_mib: f64,
    pub storm_secs: Option<f64>,
    pub storm_writes_per_cr: Option<f64>,
    /// After the second restart onto the same build: writes (children, resources, status) and
    /// Events from before it stopped until it had reconciled every resource and a steady window
    /// more.
    pub restart_writes: Option<f64>,
    pub restart_events: Option<f64>,
    pub restart_reconciles: Option<f64>,
    /// How many resources were Available at the end of the wait (= n when it converged).
    pub available: usize,
    /// The operator's own counters when the creation settled: writes by verb and kind,
    /// reconciles by result, and reconcile time by result (for reading where time goes).
    pub breakdown: Vec<String>,
}

impl Report {
    pub fn ratio(&self) -> Option<f64> {
        self.baseline_secs.filter(|b| *b > 0.0).map(|b| self.operator_secs / b)
    }
}

/// Markdown table of several runs, one row each.
pub fn table(reports: &[Report]) -> String {
    let mut s = String::from(
        "| N | operator | baseline (apply) | ratio | writes/CR (target children+2) | of which CR+status | events/CR | steady writes | peak RSS | CPU | reconcile p50 | p99 | storm |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in reports {
        let opt = |v: Option<f64>, unit: &str| v.map_or("–".to_string(), |v| format!("{v:.1} {unit}"));
        s.push_str(&format!(
            "| {} | {:.1} s | {} ({}) | {} | {:.2} ({:.2}) | {:.2} | {:.2} | {:.0} in {:.0} s | {:.0} MiB | {:.1} s | {:.1} ms | {:.1} ms | {} |\n",
            r.n,
            r.operator_secs,
            opt(r.baseline_secs, "s"),
            opt(r.baseline_apply_secs, "s"),
            r.ratio().map_or("–".to_string(), |x| format!("{x:.2}")),
            r.writes_per_cr,
            r.children_per_cr + 2.0,
            r.resource_writes_per_cr,
            r.events_per_cr,
            r.steady_writes + r.steady_events,
            r.steady_secs,
            r.peak_rss_mib,
            r.cpu_converge_secs,
            r.p50_ms,
            r.p99_ms,
            opt(r.storm_secs, "s"),
        ));
    }
    s
}

/// Least-squares line through (n, seconds): (slope per resource, intercept).
pub fn fit(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let k = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let (sx, sy) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / k, sy / k);
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    if sxx == 0.0 {
        return None;
    }
    let slope = sxy / sxx;
    Some((slope, my - slope * mx))
}

/// The cluster, the operator binary and the plugins, ready for runs.
pub struct Bench {
    pub client: Client,
    kubeconfig: PathBuf,
    operator: PathBuf,
    plugin_dir: PathBuf,
    wasm_cache: PathBuf,
    registry: stateward::runtime::Registry,
}

impl Bench {
    /// Installs the CRDs, warms the precompiled-plugin cache with `operator` and loads the
    /// plugins in-process (for the loader's renders).
    pub async fn new(kubeconfig: &Path, operator: &Path) -> anyhow::Result<Bench> {
        let client = client_for(kubeconfig).await?;
        let plugin_dir = target_dir().join("plugins");
        for p in ["postgres", "redis", "elasticsearch"] {
            let f = plugin_dir.join(format!("{p}.wasm"));
            if !f.is_file() {
                bail!("{} is missing: build the plugins first with scripts/build-plugins", f.display());
            }
        }
        let wasm_cache = target_dir().join("scale-wasm-cache");
        let bench = Bench {
            client,
            kubeconfig: kubeconfig.to_path_buf(),
            operator: operator.to_path_buf(),
            plugin_dir: plugin_dir.clone(),
            wasm_cache: wasm_cache.clone(),
            registry: {
                let sandbox = stateward::runtime::Sandbox::new(
                    stateward::runtime::Limits::default(),
                    stateward::runtime::AllocatorKind::OnDemand,
                    Some(wasm_cache.clone()),
                )?;
                stateward::runtime::Registry::load_dir(&sandbox, &plugin_dir)?
            },
        };
        let crds = workspace_root().join("deploy").join("crds");
        let mut apply = bench.kubectl();
        apply
            .args(["apply", "--server-side", "--force-conflicts", "--field-manager", "stateward-scale", "-f"])
            .arg(&crds);
        run_ok(&mut apply)?;
        let crd_names: Vec<String> = KINDS.iter().map(|k| format!("{}.stateward.dev", k.plural)).collect();
        stateward_testkit::wait_established(&bench.kubeconfig, &crd_names)?;
        let mut warm = Command::new(operator);
        warm.arg("crds").arg("--plugin-dir").arg(&plugin_dir).arg("--wasm-cache").arg(&wasm_cache);
        run_ok(&mut warm)?;
        Ok(bench)
    }

    fn kubectl(&self) -> Command {
        let mut cmd = Command::new(stateward_testkit::kubectl_binary());
        cmd.arg("--kubeconfig").arg(&self.kubeconfig);
        cmd
    }

    /// Schedulable pods and Available pool volumes: a run of N needs N of each.
    pub async fn capacity(&self) -> anyhow::Result<(usize, usize)> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let pods: usize = nodes
            .list(&ListParams::default())
            .await?
            .iter()
            .filter_map(|n| n.status.as_ref()?.allocatable.as_ref()?.get("pods")?.0.parse::<usize>().ok())
            .sum();
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let free = pvs
            .list(&ListParams::default().labels(stateward_testkit::VOLUME_POOL_LABEL))
            .await?
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Available"))
            .count();
        Ok((pods, free))
    }

    /// One full run at `opts.n`: baseline (if asked), then the operator.
    pub async fn run(&self, opts: &Options) -> anyhow::Result<Report> {
        std::fs::create_dir_all(&opts.work_dir)?;
        stateward_testkit::recycle_released_volumes(&self.client).await?;
        let (pods, free) = self.capacity().await?;
        if free < opts.n || pods < opts.n + 20 {
            bail!(
                "the cluster has room for {pods} pods and {free} free volumes; N = {} needs more. \
                 Stop it (tests/cluster/down) and let the benchmark start a bigger one, or start it with \
                 STATEWARD_NODES_PER_ZONE and STATEWARD_PV_SIZES (tests/cluster/up)",
                opts.n
            );
        }
        let mut report = Report { n: opts.n, concurrency: opts.concurrency, ..Report::default() };
        report.children_per_cr = self.children_per_cr(opts.n)?;
        if opts.baseline {
            self.baseline(opts, &mut report).await?;
        }
        self.operator_run(opts, &mut report).await?;
        Ok(report)
    }

    /// The plan of resource i in namespace `ns`, rendered in-process like `stateward render`.
    fn plan(&self, i: usize, ns: &str) -> anyhow::Result<stateward::runtime::Plan> {
        let (kind, name) = resource(i);
        let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis() as u64;
        let rendered = stateward::render::render(
            &self.registry,
            kind.manifest(&name, ns, MEMORY_BEFORE),
            &[],
            &[],
            now_ms,
        )?;
        Ok(rendered.plan)
    }

    fn children_per_cr(&self, n: usize) -> anyhow::Result<f64> {
        let mut total = 0usize;
        for i in 0..n {
            total += self.plan(i, "scale")?.actions.len();
        }
        Ok(total as f64 / n.max(1) as f64)
    }

    // ------------------------------------------------------------------------------------
    // Baseline: the same children, server-side applied directly.
    // ------------------------------------------------------------------------------------

    async fn baseline(&self, opts: &Options, report: &mut Report) -> anyhow::Result<()> {
        let ns = stateward_testkit::unique_name(&format!("scale-base-{}", opts.n));
        self.create_namespace(&ns).await?;
        let result = async {
            let sa = "scale-loader";
            let kubeconfig = self.service_account(&ns, sa, Rbac::Broad, &opts.work_dir)?;
            let loader = client_for(&kubeconfig).await?;
            let counter = WriteCounter::install(self, &ns, sa, "loader")?;
            let plans: Vec<_> = (0..opts.n).map(|i| self.plan(i, &ns)).collect::<anyhow::Result<_>>()?;
            let mut apis: BTreeMap<String, ApiResource> = BTreeMap::new();
            for plan in &plans {
                for action in &plan.actions {
                    if let stateward::runtime::Action::Apply { object } = action {
                        let (av, kind) = (str_at(object, "/apiVersion"), str_at(object, "/kind"));
                        let key = format!("{av}/{kind}");
                        if let std::collections::btree_map::Entry::Vacant(slot) = apis.entry(key) {
                            let (group, version) = av.rsplit_once('/').unwrap_or(("", av));
                            let (ar, _) =
                                kube::discovery::pinned_kind(&loader, &GroupVersionKind::gvk(group, version, kind)).await?;
                            slot.insert(ar);
                        }
                    }
                }
            }
            let apis = Arc::new(apis);
            let w0 = counter.writes(self)?;
            eprintln!("scale[{}]: baseline: applying the children of {} resources into {ns}", opts.n, opts.n);
            let started = Instant::now();
            let workers = usize::from(opts.concurrency) * KINDS.len();
            futures::stream::iter(plans.into_iter().map(|plan| {
                let (loader, ns, apis) = (loader.clone(), ns.clone(), Arc::clone(&apis));
                async move { load_one(&loader, &ns, &apis, plan).await }
            }))
            .buffer_unordered(workers)
            .try_collect::<Vec<()>>()
            .await?;
            let applied = started.elapsed().as_secs_f64();
            let ready = self.wait_statefulsets_ready(&ns, opts.n, opts.timeout, started).await?;
            let writes = counter.writes(self)? - w0;
            eprintln!(
                "scale[{}]: baseline: applied in {applied:.1} s, all StatefulSets ready after {ready:.1} s, {writes} writes",
                opts.n
            );
            report.baseline_apply_secs = Some(applied);
            report.baseline_secs = Some(ready);
            report.baseline_writes_per_cr = Some(writes / opts.n as f64);
            counter.remove(self);
            anyhow::Ok(())
        }
        .await;
        let cleaned = self.delete_namespace(&ns, opts.timeout).await;
        result?;
        cleaned
    }

    async fn wait_statefulsets_ready(
        &self,
        ns: &str,
        n: usize,
        timeout: Duration,
        started: Instant,
    ) -> anyhow::Result<f64> {
        let sts: Api<StatefulSet> = Api::namespaced(self.client.clone(), ns);
        loop {
            let ready = sts
                .list(&ListParams::default())
                .await?
                .iter()
                .filter(|s| {
                    let want = s.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                    s.status
                        .as_ref()
                        .is_some_and(|st| st.ready_replicas.unwrap_or(0) == want && st.replicas == want)
                })
                .count();
            if ready >= n {
                return Ok(started.elapsed().as_secs_f64());
            }
            if started.elapsed() > timeout {
                bail!("baseline: only {ready} of {n} StatefulSets ready after {timeout:?}");
            }
            tokio::time::sleep(poll_interval(n)).await;
        }
    }

    // ------------------------------------------------------------------------------------
    // The operator.
    // ------------------------------------------------------------------------------------

    async fn operator_run(&self, opts: &Options, report: &mut Report) -> anyhow::Result<()> {
        let ns = stateward_testkit::unique_name(&format!("scale-op-{}", opts.n));
        self.create_namespace(&ns).await?;
        let mut operator = None;
        let result = async {
            let sa = "stateward";
            let kubeconfig = self.service_account(&ns, sa, Rbac::Project, &opts.work_dir)?;
            let counter = WriteCounter::install(self, &ns, sa, "op")?;
            let op = operator.insert(Operator::start(self, &ns, &kubeconfig, opts)?);
            op.wait_ready(Duration::from_secs(120))?;
            self.measure_operator(opts, report, &ns, op, &counter).await?;
            // Restarted twice: the first new leader also runs the audit sweep over resources
            // the first one never swept (it started before they existed), and records their
            // first PolicyCompliant verdict; the second restart is the upgrade of a cluster
            // that has been running, and is the one measured.
            for round in 1..=2 {
                if !opts.restart {
                    break;
                }
                let before = (counter.writes(self)?, counter.events(self)?, counter.resource_writes(self)?);
                let statuses = self.statuses(&ns).await?;
                if let Some(old) = operator.take() {
                    old.stop()?;
                }
                let op = operator.insert(Operator::start(self, &ns, &kubeconfig, opts)?);
                op.wait_ready(Duration::from_secs(120))?;
                // A status that goes and comes back (a first reconcile before the first answer)
                // ends where it began: look while it may be away.
                tokio::time::sleep(Duration::from_millis(400)).await;
                let early = self.statuses(&ns).await?;
                let reconciles = op.reconciled(opts.n, opts.steady, Duration::from_secs(120))?;
                let after = (counter.writes(self)?, counter.events(self)?, counter.resource_writes(self)?);
                report.restart_writes = Some(after.0 - before.0);
                report.restart_events = Some(after.1 - before.1);
                report.restart_reconciles = Some(reconciles);
                eprintln!(
                    "scale[{}]: restart {round} on the same build: {reconciles} reconciles, {} writes ({} to the resources and their status), {} events",
                    opts.n,
                    after.0 - before.0,
                    after.2 - before.2,
                    after.1 - before.1
                );
                // What a status write changed, for the first resources it did.
                let now = self.statuses(&ns).await?;
                for (name, was) in statuses.iter().filter(|(n, v)| now.get(*n) != Some(*v)).take(2) {
                    eprintln!("scale[{}]: {name}: status before restart {round} {was}\nafter {}", opts.n, now[name]);
                }
                for (name, was) in statuses.iter().filter(|(n, v)| early.get(*n) != Some(*v)).take(3) {
                    eprintln!("scale[{}]: {name}: status before restart {round} {was}\nright after {}", opts.n, early[name]);
                }
            }
            counter.remove(self);
            anyhow::Ok(())
        }
        .await;
        if let (Err(_), Some(op)) = (&result, &operator) {
            eprintln!(
                "scale[{}]: operator log (last 40 lines of {}):\n{}",
                opts.n,
                op.log.display(),
                op.log_tail(40)
            );
        }
        if let (Ok(()), Some(op)) = (&result, &operator) {
            // The audit log holds every decision's input: ~0.6 GB at N = 1000. Kept on failure.
            let _ = std::fs::remove_file(&op.audit);
        }
        drop(operator);
        let cleaned = self.delete_namespace(&ns, opts.timeout).await;
        result?;
        cleaned
    }

    async fn measure_operator(
        &self,
        opts: &Options,
        report: &mut Report,
        ns: &str,
        op: &Operator,
        counter: &WriteCounter,
    ) -> anyhow::Result<()> {
        let n = opts.n;
        let (w0, e0, m0) = (counter.writes(self)?, counter.events(self)?, op.metric_writes()?);
        let r0 = counter.resource_writes(self)?;
        eprintln!("scale[{n}]: operator: creating {n} resources in {ns}");
        let started = Instant::now();
        futures::stream::iter((0..n).map(|i| {
            let client = self.client.clone();
            let ns = ns.to_string();
            async move {
                let (kind, name) = resource(i);
                let obj: DynamicObject = serde_json::from_value(kind.manifest(&name, &ns, MEMORY_BEFORE))?;
                kind.api_with(&client, &ns)
                    .create(&PostParams::default(), &obj)
                    .await
                    .with_context(|| format!("creating {name}"))?;
                anyhow::Ok(())
            }
        }))
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
        let created = started.elapsed().as_secs_f64();
        let (available, secs) = self.wait_converged(ns, n, None, opts.timeout, started).await?;
        report.available = available;
        report.cpu_converge_secs = op.cpu_secs()?;
        report.rss_converged_mib = op.rss_mib("VmRSS")?;
        if available < n {
            bail!("only {available} of {n} resources Available after {:?}", opts.timeout);
        }
        report.operator_secs = secs;
        eprintln!("scale[{n}]: operator: created in {created:.1} s, all Available after {secs:.1} s");

        // Settle: the write counter must stop moving (last status writes after Available).
        let settle_started = Instant::now();
        let quiet = Duration::from_secs(if n <= 50 { 6 } else { 10 });
        let mut last = (counter.writes(self)? + counter.events(self)?, Instant::now());
        while last.1.elapsed() < quiet {
            if settle_started.elapsed() > Duration::from_secs(180) {
                bail!("the operator kept writing for 180 s after every resource was Available");
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
            let now = counter.writes(self)? + counter.events(self)?;
            if now != last.0 {
                last = (now, Instant::now());
            }
        }
        report.settle_secs = (last.1 - settle_started).as_secs_f64();
        let (w1, e1, m1) = (counter.writes(self)?, counter.events(self)?, op.metric_writes()?);
        report.writes_per_cr = (w1 - w0) / n as f64;
        report.resource_writes_per_cr = (counter.resource_writes(self)? - r0) / n as f64;
        report.events_per_cr = (e1 - e0) / n as f64;
        report.metric_writes_per_cr = (m1 - m0) / n as f64;
        report.breakdown = op
            .metrics()?
            .lines()
            .filter(|l| {
                [
                    "stateward_api_writes_total{",
                    "stateward_reconcile_total{",
                    "stateward_reconcile_duration_seconds_sum{",
                    "stateward_plugin_call_duration_seconds_sum{",
                    "stateward_policy_eval_duration_seconds_sum",
                    "stateward_policy_decisions_total{",
                ]
                .iter()
                .any(|p| l.starts_with(p))
            })
            .map(str::to_string)
            .collect();
        eprintln!(
            "scale[{n}]: operator: {} writes ({:.2}/CR, {:.2} of them to the resource and its status), {} events, stateward_api_writes_total {} (settled {:.1} s after Available)",
            w1 - w0,
            report.writes_per_cr,
            report.resource_writes_per_cr,
            e1 - e0,
            m1 - m0,
            report.settle_secs
        );

        // Steady state: nothing changes, nothing may be written.
        tokio::time::sleep(opts.steady).await;
        let (w2, e2, m2) = (counter.writes(self)?, counter.events(self)?, op.metric_writes()?);
        report.steady_secs = opts.steady.as_secs_f64();
        report.steady_writes = w2 - w1;
        report.steady_events = e2 - e1;
        report.steady_metric_writes = m2 - m1;
        eprintln!(
            "scale[{n}]: steady {:.0} s: {} writes, {} events, stateward_api_writes_total +{}",
            report.steady_secs, report.steady_writes, report.steady_events, report.steady_metric_writes
        );
        let metrics = op.metrics()?;
        report.reconciles = sum_metric(&metrics, "stateward_reconcile_total", &[]);
        report.p50_ms = histogram_quantile(&metrics, "stateward_reconcile_duration_seconds", 0.50) * 1000.0;
        report.p99_ms = histogram_quantile(&metrics, "stateward_reconcile_duration_seconds", 0.99) * 1000.0;

        if opts.storm {
            let (w3, e3) = (counter.writes(self)?, counter.events(self)?);
            let storm_started = Instant::now();
            let generations = futures::stream::iter((0..n).map(|i| {
                let client = self.client.clone();
                let ns = ns.to_string();
                async move {
                    let (kind, name) = resource(i);
                    let patch = json!({"spec": {"resources": {"limits": {"memory": MEMORY_AFTER}}}});
                    let obj = kind
                        .api_with(&client, &ns)
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .with_context(|| format!("patching {name}"))?;
                    anyhow::Ok((name, obj.metadata.generation.unwrap_or(0)))
                }
            }))
            .buffer_unordered(16)
            .try_collect::<BTreeMap<String, i64>>()
            .await?;
            let (available, secs) =
                self.wait_converged(ns, n, Some(&generations), opts.timeout, storm_started).await?;
            if available < n {
                bail!(
                    "storm: only {available} of {n} resources back at their generation after {:?}",
                    opts.timeout
                );
            }
            let (w4, e4) = (counter.writes(self)?, counter.events(self)?);
            report.storm_secs = Some(secs);
            report.storm_writes_per_cr = Some((w4 - w3) / n as f64);
            eprintln!(
                "scale[{n}]: storm: all {n} re-converged after {secs:.1} s, {} writes, {} events so far",
                w4 - w3,
                e4 - e3
            );
        }
        report.cpu_total_secs = op.cpu_secs()?;
        report.peak_rss_mib = op.rss_mib("VmHWM")?;
        Ok(())
    }

    /// Every resource's status in `ns`, by name.
    async fn statuses(&self, ns: &str) -> anyhow::Result<BTreeMap<String, Value>> {
        let mut all = BTreeMap::new();
        for kind in KINDS {
            for cr in kind.api_with(&self.client, ns).list(&ListParams::default()).await? {
                all.insert(cr.name_any(), cr.data.get("status").cloned().unwrap_or(Value::Null));
            }
        }
        Ok(all)
    }

    /// Polls until all n resources are Running, Available and at their generation (at least
    /// `generations[name]` when given). Returns how many were, and when the last one was.
    async fn wait_converged(
        &self,
        ns: &str,
        n: usize,
        generations: Option<&BTreeMap<String, i64>>,
        timeout: Duration,
        started: Instant,
    ) -> anyhow::Result<(usize, f64)> {
        loop {
            let mut done = 0;
            for kind in KINDS {
                for cr in kind.api_with(&self.client, ns).list(&ListParams::default()).await? {
                    let gen = cr.metadata.generation.unwrap_or(0);
                    let want = generations.and_then(|g| g.get(&cr.name_any()).copied()).unwrap_or(0);
                    let observed = cr.data.pointer("/status/observedGeneration").and_then(Value::as_i64);
                    let phase = cr.data.pointer("/status/phase").and_then(Value::as_str);
                    let available =
                        cr.data.pointer("/status/conditions").and_then(Value::as_array).is_some_and(|cs| {
                            cs.iter().any(|c| c["type"] == "Available" && c["status"] == "True")
                        });
                    if available && phase == Some("Running") && observed == Some(gen) && gen >= want {
                        done += 1;
                    }
                }
            }
            let secs = started.elapsed().as_secs_f64();
            if done >= n || started.elapsed() > timeout {
                return Ok((done, secs));
            }
            tokio::time::sleep(poll_interval(n)).await;
        }
    }

    // ------------------------------------------------------------------------------------
    // Namespaces, identities, counters.
    // ------------------------------------------------------------------------------------

    async fn create_namespace(&self, ns: &str) -> anyhow::Result<()> {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let obj: Namespace = serde_json::from_value(json!({
            "metadata": {"name": ns, "labels": {stateward_testkit::NAMESPACE_LABEL: "true", "stateward.test/scale": "true"}}
        }))?;
        namespaces
            .create(&PostParams::default(), &obj)
            .await
            .with_context(|| format!("creating namespace {ns}"))?;
        let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(self.client.clone(), ns);
        let started = Instant::now();
        while sas.get_opt("default").await?.is_none() {
            if started.elapsed() > Duration::from_secs(60) {
                bail!("namespace {ns} got no default service account within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }

    /// Strips the custom resources' finalizers (their operator is gone), deletes the
    /// namespace, waits until it is gone and makes its volumes Available again.
    async fn delete_namespace(&self, ns: &str, timeout: Duration) -> anyhow::Result<()> {
        let started = Instant::now();
        for kind in KINDS {
            let api = kind.api_with(&self.client, ns);
            let names: Vec<String> =
                api.list(&ListParams::default()).await?.iter().map(ResourceExt::name_any).collect();
            futures::stream::iter(names.into_iter().map(|name| {
                let api = api.clone();
                async move {
                    let patch = json!({"metadata": {"finalizers": null}});
                    match api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                        Ok(_) => Ok(()),
                        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                        Err(e) => Err(e),
                    }
                }
            }))
            .buffer_unordered(16)
            .try_collect::<Vec<()>>()
            .await?;
        }
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        match namespaces.delete(ns, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        while namespaces.get_opt(ns).await?.is_some() {
            if started.elapsed() > timeout {
                bail!("namespace {ns} still there {timeout:?} after its deletion");
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        // Claims are gone: free their volumes for the next phase.
        let released = Instant::now();
        loop {
            stateward_testkit::recycle_released_volumes(&self.client).await?;
            let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
            let bound_here = pvs
                .list(&ListParams::default().labels(stateward_testkit::VOLUME_POOL_LABEL))
                .await?
                .iter()
                .filter(|p| {
                    p.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).and_then(|c| c.namespace.as_deref())
                        == Some(ns)
                })
                .count();
            if bound_here == 0 {
                break;
            }
            if released.elapsed() > Duration::from_secs(120) {
                bail!("{bound_here} volumes still claimed by deleted namespace {ns}");
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        eprintln!("scale: namespace {ns} deleted and its volumes freed in {:.1?}", started.elapsed());
        Ok(())
    }

    /// A ServiceAccount of `ns` with either the project's namespaced Roles (operator) or a
    /// broad Role (loader), and a token kubeconfig for it.
    fn service_account(&self, ns: &str, sa: &str, rbac: Rbac, dir: &Path) -> anyhow::Result<PathBuf> {
        let mut items = vec![
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": ns}}),
        ];
        let bind = |role: &str| {
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": format!("{sa}-{role}"), "namespace": ns},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]})
        };
        match rbac {
            Rbac::Project => {
                for rel in ["namespaced/role.yaml", "operator-namespace/role.yaml"] {
                    let path = workspace_root().join("deploy").join("rbac").join(rel);
                    let text = std::fs::read_to_string(&path)
                        .with_context(|| format!("reading {}", path.display()))?;
                    let mut role: Value =
                        yaml_serde::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
                    role["metadata"]["namespace"] = Value::String(ns.to_string());
                    let name = str_at(&role, "/metadata/name").to_string();
                    items.push(role);
                    items.push(bind(&name));
                }
            }
            Rbac::Broad => {
                let role = format!("{sa}-broad");
                items.push(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                    "metadata": {"name": role, "namespace": ns},
                    "rules": [{"apiGroups": ["", "apps", "policy"], "resources": ["*"],
                               "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]}));
                items.push(bind(&role));
            }
        }
        self.kubectl_apply(&json!({"apiVersion": "v1", "kind": "List", "items": items}))?;
        let mut token = self.kubectl();
        token.args(["create", "token", sa, "-n", ns, "--duration", "6h"]);
        let token = run_ok(&mut token)?.trim().to_string();
        let mut server = self.kubectl();
        server.args(["config", "view", "--raw", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}"]);
        let server = run_ok(&mut server)?.trim().to_string();
        let mut ca = self.kubectl();
        ca.args([
            "config",
            "view",
            "--raw",
            "--minify",
            "-o",
            "jsonpath={.clusters[0].cluster.certificate-authority-data}",
        ]);
        let ca = run_ok(&mut ca)?.trim().to_string();
        if ca.is_empty() {
            bail!("the admin kubeconfig carries no inline CA");
        }
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\n\
             users:\n- name: {sa}\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: {sa}\n    namespace: {ns}\n\
             current-context: c\n"
        );
        let path = dir.join(format!("{ns}-{sa}.kubeconfig"));
        std::fs::write(&path, text)?;
        Ok(path)
    }

    fn kubectl_apply(&self, obj: &Value) -> anyhow::Result<()> {
        let mut child = self
            .kubectl()
            .args(["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(obj.to_string().as_bytes())?;
        }
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!("kubectl apply: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    /// The API server's /metrics (admin; exempt from priority and fairness).
    fn apiserver_metrics(&self) -> anyhow::Result<String> {
        let mut cmd = self.kubectl();
        cmd.args(["get", "--raw", "/metrics"]);
        run_ok(&mut cmd)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rbac {
    Project,
    Broad,
}

/// Three FlowSchemas that route one ServiceAccount's writes in one namespace through schemas
/// of their own, so `apiserver_flowcontrol_dispatched_requests_total{flow_schema}` counts
/// exactly them: children; the custom resources and their status; Events. Leases (leader
/// election) match none.
struct WriteCounter {
    children: String,
    resources: String,
    events: String,
}

impl WriteCounter {
    fn install(bench: &Bench, ns: &str, sa: &str, tag: &str) -> anyhow::Result<WriteCounter> {
        let counter = WriteCounter {
            children: format!("{ns}-{tag}-children"),
            resources: format!("{ns}-{tag}-resources"),
            events: format!("{ns}-{tag}-events"),
        };
        let children: Vec<String> = [
            "statefulsets",
            "services",
            "configmaps",
            "secrets",
            "persistentvolumeclaims",
            "poddisruptionbudgets",
            // Label changes (the fence label, roles).
            "pods",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut resources = Vec::new();
        for k in KINDS {
            resources.push(k.plural.to_string());
            resources.push(format!("{}/status", k.plural));
        }
        let schema = |name: &str, groups: Vec<&str>, resources: Vec<String>| {
            json!({
                "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
                "metadata": {"name": name, "labels": {"stateward.test/scale": "true"}},
                "spec": {
                    "matchingPrecedence": 100,
                    "priorityLevelConfiguration": {"name": "workload-low"},
                    "distinguisherMethod": {"type": "ByUser"},
                    "rules": [{
                        "subjects": [{"kind": "ServiceAccount", "serviceAccount": {"name": sa, "namespace": ns}}],
                        "resourceRules": [{
                            "verbs": ["create", "update", "patch", "delete", "deletecollection"],
                            "apiGroups": groups,
                            "resources": resources,
                            "namespaces": [ns],
                        }],
                    }],
                }
            })
        };
        bench.kubectl_apply(&schema(&counter.children, vec!["", "apps", "policy"], children))?;
        bench.kubectl_apply(&schema(&counter.resources, vec!["stateward.dev"], resources))?;
        bench.kubectl_apply(&schema(
            &counter.events,
            vec!["", "events.k8s.io"],
            vec!["events".to_string()],
        ))?;
        Ok(counter)
    }

    fn count(bench: &Bench, schema: &str) -> anyhow::Result<f64> {
        Ok(sum_metric(
            &bench.apiserver_metrics()?,
            "apiserver_flowcontrol_dispatched_requests_total",
            &[&format!("flow_schema=\"{schema}\"")],
        ))
    }

    /// Writes to children plus writes to the custom resources and their status.
    fn writes(&self, bench: &Bench) -> anyhow::Result<f64> {
        let text = bench.apiserver_metrics()?;
        let count = |schema: &str| {
            sum_metric(
                &text,
                "apiserver_flowcontrol_dispatched_requests_total",
                &[&format!("flow_schema=\"{schema}\"")],
            )
        };
        Ok(count(&self.children) + count(&self.resources))
    }

    /// Writes to the custom resources and their status (finalizer, status) only.
    fn resource_writes(&self, bench: &Bench) -> anyhow::Result<f64> {
        Self::count(bench, &self.resources)
    }

    fn events(&self, bench: &Bench) -> anyhow::Result<f64> {
        Self::count(bench, &self.events)
    }

    fn remove(&self, bench: &Bench) {
        for name in [&self.children, &self.resources, &self.events] {
            let _ = bench
                .kubectl()
                .args(["delete", "flowschema", name, "--ignore-not-found", "--wait=false"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// One resource's children, applied the way the operator would (ensure-secret creates, then
/// server-side apply in plan order), but with no custom resource, policy or status.
async fn load_one(
    client: &Client,
    ns: &str,
    apis: &BTreeMap<String, ApiResource>,
    plan: stateward::runtime::Plan,
) -> anyhow::Result<()> {
    use stateward::runtime::Action;
    for action in plan.actions {
        match action {
            Action::Apply { object } => {
                let key = format!("{}/{}", str_at(&object, "/apiVersion"), str_at(&object, "/kind"));
                let ar = apis.get(&key).with_context(|| format!("no API resource for {key}"))?;
                let name = str_at(&object, "/metadata/name").to_string();
                let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, ar);
                api.patch(&name, &PatchParams::apply("scale-loader").force(), &Patch::Apply(&object))
                    .await
                    .with_context(|| format!("applying {key} {name}"))?;
            }
            Action::EnsureSecret { secret } => {
                let api: Api<Secret> = Api::namespaced(client.clone(), ns);
                let data: BTreeMap<String, k8s_openapi::ByteString> = secret
                    .keys
                    .iter()
                    .map(|(k, bytes)| {
                        (k.clone(), k8s_openapi::ByteString(vec![b'x'; (*bytes).clamp(8, 1024) as usize]))
                    })
                    .collect();
                let obj: Secret = serde_json::from_value(json!({
                    "metadata": {"name": secret.name, "labels": secret.labels.iter().cloned().collect::<BTreeMap<_, _>>()},
                }))?;
                let obj = Secret { data: Some(data), ..obj };
                api.create(&PostParams::default(), &obj)
                    .await
                    .with_context(|| format!("creating Secret {}", secret.name))?;
            }
            // Nothing is running under the loader: no pod to label or ask.
            Action::Delete { .. } | Action::LabelPod { .. } | Action::Exec { .. } | Action::Http { .. } => {}
        }
    }
    Ok(())
}

/// `stateward run` as a child process of the benchmark, under its own identity.
struct Operator {
    child: Child,
    port: u16,
    pub log: PathBuf,
    audit: PathBuf,
    clk_tck: f64,
}

impl Operator {
    fn start(bench: &Bench, ns: &str, kubeconfig: &Path, opts: &Options) -> anyhow::Result<Operator> {
        let port = free_port()?;
        let log = opts.work_dir.join(format!("{ns}-operator.log"));
        let audit = opts.work_dir.join(format!("{ns}-audit.jsonl"));
        let file = std::fs::File::create(&log)?;
        let child = Command::new(&bench.operator)
            .env("KUBECONFIG", kubeconfig)
            .env_remove("STATEWARD_NAMESPACE")
            .env_remove("POD_NAMESPACE")
            .env_remove("POD_NAME")
            .env("RUST_LOG", std::env::var("STATEWARD_SCALE_RUST_LOG").unwrap_or_else(|_| "info".into()))
            .args(["run", "--namespace", ns, "--lease-namespace", ns])
            .args(["--http-addr", &format!("127.0.0.1:{port}")])
            .args(["--concurrency", &opts.concurrency.to_string()])
            .arg("--audit-log")
            .arg(&audit)
            .arg("--plugin-dir")
            .arg(&bench.plugin_dir)
            .arg("--wasm-cache")
            .arg(&bench.wasm_cache)
            .arg("--policy-dir")
            .arg(workspace_root().join("policies"))
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting {}", bench.operator.display()))?;
        let clk_tck = Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse::<f64>().ok())
            .unwrap_or(100.0);
        eprintln!(
            "scale[{}]: operator pid {} on 127.0.0.1:{port}, log {}",
            opts.n,
            child.id(),
            log.display()
        );
        Ok(Operator { child, port, log, audit, clk_tck })
    }

    fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("the operator exited with {status}:\n{}", self.log_tail(40));
            }
            if matches!(http_get(self.port, "/readyz"), Ok((200, _))) {
                return Ok(());
            }
            if started.elapsed() > timeout {
                bail!("the operator was not ready within {timeout:?}:\n{}", self.log_tail(40));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Stops it as Kubernetes stops a pod (SIGTERM: it steps down and releases the Lease) and
    /// keeps its log beside the next one's.
    fn stop(mut self) -> anyhow::Result<()> {
        let pid = self.child.id().to_string();
        let term = Command::new("kill").args(["-TERM", &pid]).status()?;
        anyhow::ensure!(term.success(), "kill -TERM {pid} failed");
        let started = Instant::now();
        while self.child.try_wait()?.is_none() {
            if started.elapsed() > Duration::from_secs(30) {
                bail!("the operator did not stop within 30 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        std::fs::rename(&self.log, self.log.with_extension("before-restart.log"))?;
        Ok(())
    }

    /// Waits until it has reconciled at least `n` times (a new leader reconciles every
    /// resource as its caches fill; the plugins' polls then keep requeueing them), then for
    /// `window` more; the reconciles it made.
    fn reconciled(&self, n: usize, window: Duration, timeout: Duration) -> anyhow::Result<f64> {
        let started = Instant::now();
        let count =
            || -> anyhow::Result<f64> { Ok(sum_metric(&self.metrics()?, "stateward_reconcile_total", &[])) };
        while count()? < n as f64 {
            if started.elapsed() > timeout {
                bail!("{} reconciles after {timeout:?} (want {n})", count()?);
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        std::thread::sleep(window);
        count()
    }

    fn metrics(&self) -> anyhow::Result<String> {
        let (code, body) = http_get(self.port, "/metrics")?;
        if code != 200 {
            bail!("operator /metrics answered {code}");
        }
        Ok(body)
    }

    fn metric_writes(&self) -> anyhow::Result<f64> {
        Ok(sum_metric(&self.metrics()?, "stateward_api_writes_total", &[]))
    }

    /// User + system CPU seconds so far (/proc/<pid>/stat fields 14 and 15).
    fn cpu_secs(&self) -> anyhow::Result<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))?;
        let after = stat.rsplit_once(')').map(|(_, rest)| rest).context("malformed /proc stat")?;
        let fields: Vec<&str> = after.split_whitespace().collect();
        let ticks =
            |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).context("malformed /proc stat");
        Ok((ticks(11)? + ticks(12)?) / self.clk_tck)
    }

    /// A `Vm*` line of /proc/<pid>/status in MiB.
    fn rss_mib(&self, field: &str) -> anyhow::Result<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        let kib = status
            .lines()
            .find_map(|l| {
                l.strip_prefix(field)?.strip_prefix(':')?.split_whitespace().next()?.parse::<f64>().ok()
            })
            .with_context(|| format!("no {field} in /proc status"))?;
        Ok(kib / 1024.0)
    }

    fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn poll_interval(n: usize) -> Duration {
    if n <= 50 {
        Duration::from_millis(250)
    } else {
        Duration::from_millis(500)
    }
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or_default()
}

pub async fn client_for(kubeconfig: &Path) -> anyhow::Result<Client> {
    let kc =
        Kubeconfig::read_from(kubeconfig).with_context(|| format!("reading {}", kubeconfig.display()))?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

fn run_ok(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A free loopback port in the benchmark's range 37900–37999 (else any free one).
fn free_port() -> anyhow::Result<u16> {
    for port in 37900..=37999 {
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// `histogram_quantile` over every series of a histogram (all labels summed), linear within
/// the bucket like Prometheus; the highest finite bound when the rank falls in +Inf.
pub fn histogram_quantile(text: &str, name: &str, q: f64) -> f64 {
    let bucket = format!("{name}_bucket{{");
    let mut buckets: BTreeMap<u64, (f64, f64)> = BTreeMap::new(); // bound bits → (bound, count)
    for line in text.lines().filter(|l| l.starts_with(&bucket)) {
        let Some(le) = line.split("le=\"").nth(1).and_then(|r| r.split('"').next()) else {
            continue;
        };
        let bound = if le == "+Inf" { f64::INFINITY } else { le.parse::<f64>().unwrap_or(f64::NAN) };
        let Some(count) = line.rsplit(' ').next().and_then(|c| c.parse::<f64>().ok()) else {
            continue;
        };
        if bound.is_nan() {
            continue;
        }
        buckets.entry(bound.to_bits()).or_insert((bound, 0.0)).1 += count;
    }
    let mut sorted: Vec<(f64, f64)> = buckets.into_values().collect();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    let Some(&(_, total)) = sorted.last() else { return 0.0 };
    if total <= 0.0 {
        return 0.0;
    }
    let rank = q * total;
    let (mut prev_bound, mut prev_count) = (0.0, 0.0);
    for (bound, count) in &sorted {
        if *count >= rank {
            if bound.is_infinite() {
                return prev_bound;
            }
            let width = count - prev_count;
            let frac = if width > 0.0 { (rank - prev_count) / width } else { 1.0 };
            return prev_bound + (bound - prev_bound) * frac;
        }
        (prev_bound, prev_count) = (*bound, *count);
    }
    prev_bound
}
