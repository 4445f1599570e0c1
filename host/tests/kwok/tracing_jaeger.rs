//! Traces end to end against a real Jaeger (built from its Go module by tests/tools/build-jaeger,
//! in-memory storage, OTLP/HTTP receiver and query API on loopback ports):
//!
//! - the operator binary, exporting with the standard `OTEL_*` variables, reconciles one CR on the
//!   local cluster; Jaeger's query API returns that CR's reconcile trace with the tree
//!   reconcile → {plugin.call, policy.eval, apply…, status} and their attributes; the operator's
//!   JSON log lines and audit records carry the same trace id; `/metrics` counts exported spans.
//! - in process: a plugin's `log` call becomes an event of its `plugin.call` span in Jaeger, and
//!   a webhook span starts a trace of its own.
//! - in process: with the endpoint on a closed port, spans are dropped and counted
//!   (`queue_full`, `export_failed`), never blocking the code that makes them; the operator
//!   pointed at a closed port reconciles a CR to Running as usual and counts the lost spans.
//! - with export off, JSON log lines inside spans still carry W3C trace and span ids.
//!
//! Run: `scripts/build-plugins && cargo test -p stateward --test kwok -- tracing_jaeger::`
//! (the cluster tests need `tests/cluster/up`, as the other e2e tests).
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use crate::e2e;
use crate::support;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use e2e::*;
use serde_json::Value;
use stateward::telemetry::otel::{self, ExportSettings, ExportStats};
use stateward_testkit::TestEnv;
use tracing_subscriber::layer::SubscriberExt;

/// Where `tests/tools/build-jaeger` puts the binary (keep the version in step with it); built
/// on first use when missing.
fn jaeger_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("STATEWARD_JAEGER") {
        return PathBuf::from(path);
    }
    let out = Command::new(workspace_root().join("tests/tools/build-jaeger"))
        .stderr(Stdio::inherit())
        .output()
        .expect("run tests/tools/build-jaeger");
    assert!(out.status.success(), "tests/tools/build-jaeger failed");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// A Jaeger process with in-memory storage; killed on drop.
struct Jaeger {
    child: Child,
    /// OTLP/HTTP receiver base URL.
    otlp: String,
    query_port: u16,
    _dir: tempdir::Dir,
}

impl Jaeger {
    fn start() -> Jaeger {
        let dir = tempdir::Dir::new("jaeger");
        let (otlp, query, grpc) = (free_port(), free_port(), free_port());
        let config = dir.0.join("config.yaml");
        std::fs::write(&config, jaeger_config(otlp, query, grpc)).expect("write jaeger config");
        let log = std::fs::File::create(dir.0.join("jaeger.log")).expect("log file");
        let child = Command::new(jaeger_binary())
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start jaeger");
        let jaeger = Jaeger { child, otlp: format!("http://127.0.0.1:{otlp}"), query_port: query, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        while jaeger.query("/api/services").is_err() {
            assert!(Instant::now() < deadline, "jaeger did not answer within 30 s: {}", jaeger.log());
            std::thread::sleep(Duration::from_millis(100));
        }
        // The receiver starts with the pipeline, after the query extension.
        while std::net::TcpStream::connect(("127.0.0.1", otlp)).is_err() {
            assert!(Instant::now() < deadline, "jaeger's OTLP port did not open: {}", jaeger.log());
            std::thread::sleep(Duration::from_millis(100));
        }
        jaeger
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.0.join("jaeger.log")).unwrap_or_default()
    }

    /// GET on the query API, parsed as JSON.
    fn query(&self, path: &str) -> anyhow::Result<Value> {
        let (status, body) = http_get(self.query_port, path)?;
        anyhow::ensure!(status == 200, "{path}: HTTP {status}: {body}");
        Ok(serde_json::from_str(&body)?)
    }

    /// Traces of `service` whose `operation` spans carry all `tags`.
    fn traces(&self, service: &str, operation: &str, tags: &[(&str, &str)]) -> Vec<Value> {
        let tags: HashMap<&str, &str> = tags.iter().copied().collect();
        let tags = serde_json::to_string(&tags).expect("tags json");
        let path = format!(
            "/api/traces?service={service}&operation={operation}&limit=50&lookback=1h&tags={}",
            percent(&tags)
        );
        match self.query(&path) {
            Ok(v) => v["data"].as_array().cloned().unwrap_or_default(),
            Err(_) => Vec::new(),
        }
    }
}

impl Drop for Jaeger {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- jaeger log ---\n{}", self.log());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Jaeger v2 configuration: OTLP/HTTP in, in-memory store, query API and UI out, every port
/// on loopback, its own telemetry off.
pub fn jaeger_config(otlp: u16, query: u16, grpc: u16) -> String {
    format!(
        r#"service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:{query}
    grpc:
      endpoint: 127.0.0.1:{grpc}
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 10000
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{otlp}
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
"#
    )
}

/// Calls `check` every 200 ms until it yields something; fails after `timeout` naming `what`.
fn poll<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> (T, Duration) {
    let started = Instant::now();
    loop {
        if let Some(v) = check() {
            return (v, started.elapsed());
        }
        assert!(started.elapsed() < timeout, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn percent(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A span of a Jaeger trace, with its tags as a map.
#[derive(Debug, Clone)]
struct Span {
    id: String,
    parent: Option<String>,
    operation: String,
    tags: HashMap<String, Value>,
    logs: Vec<HashMap<String, Value>>,
}

fn spans(trace: &Value) -> Vec<Span> {
    let fields = |list: &Value| -> HashMap<String, Value> {
        list.as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| Some((t["key"].as_str()?.to_owned(), t["value"].clone())))
            .collect()
    };
    trace["spans"]
        .as_array()
        .expect("spans")
        .iter()
        .map(|s| Span {
            id: s["spanID"].as_str().unwrap_or_default().to_owned(),
            parent: s["references"]
                .as_array()
                .and_then(|r| r.iter().find(|r| r["refType"] == "CHILD_OF"))
                .and_then(|r| r["spanID"].as_str())
                .map(str::to_owned),
            operation: s["operationName"].as_str().unwrap_or_default().to_owned(),
            tags: fields(&s["tags"]),
            logs: s["logs"].as_array().into_iter().flatten().map(|l| fields(&l["fields"])).collect(),
        })
        .collect()
}

fn tag<'a>(span: &'a Span, key: &str) -> &'a Value {
    span.tags.get(key).unwrap_or_else(|| panic!("span {} has no tag {key}: {:?}", span.operation, span.tags))
}

fn tag_str<'a>(span: &'a Span, key: &str) -> &'a str {
    tag(span, key).as_str().unwrap_or_else(|| panic!("{}.{key} is not a string", span.operation))
}

/// The operator on the local cluster exports the reconcile of one CR; Jaeger shows its tree.
#[tokio::test]
async fn operator_reconcile_trace_reaches_jaeger_with_its_tree() {
    let jaeger = Jaeger::start();
    let env = TestEnv::new("e2e-trace").await.expect("test env");
    let _teardown = Teardown::new(&env);
    let service = format!("stateward-{}", env.namespace);
    let mut operator = Operator::start_with(
        &env,
        "traced",
        OperatorOpts {
            namespace: env.namespace.clone(),
            lease_namespace: env.namespace.clone(),
            env: vec![
                ("OTEL_EXPORTER_OTLP_ENDPOINT".into(), jaeger.otlp.clone()),
                ("OTEL_EXPORTER_OTLP_PROTOCOL".into(), "http/protobuf".into()),
                ("OTEL_SERVICE_NAME".into(), service.clone()),
                ("OTEL_TRACES_SAMPLER".into(), "parentbased_always_on".into()),
                // The per-action debug lines, so the reconcile has log lines to check.
                (
                    "RUST_LOG".into(),
                    "info,kube=warn,tower=warn,hyper=warn,stateward::controller::reconcile=debug".into(),
                ),
            ],
            ..Default::default()
        },
    );
    operator.wait_ready(Duration::from_secs(60)).await;
    let name = "traced";
    apply(&env, &env.namespace, &POSTGRES.manifest(name, 1, "Retain"));

    let (trace, took) = poll("the CR's reconcile trace in jaeger", Duration::from_secs(60), || {
        let found = jaeger.traces(&service, "reconcile", &[("name", name), ("namespace", &env.namespace)]);
        // The reconcile that created the children: its StatefulSet apply wrote.
        found.into_iter().find(|t| {
            let spans = spans(t);
            let has = |op: &str| spans.iter().any(|s| s.operation == op);
            has("plugin.call")
                && has("policy.eval")
                && spans.iter().any(|s| {
                    s.operation == "apply"
                        && s.tags.get("kind").and_then(Value::as_str) == Some("StatefulSet")
                        && s.tags.get("wrote").and_then(Value::as_bool) == Some(true)
                })
        })
    });
    eprintln!("tracing: reconcile trace in jaeger {took:.1?} after the CR was created");
    let spans = spans(&trace);
    let root = spans.iter().find(|s| s.operation == "reconcile").expect("reconcile span");
    assert_eq!(root.parent, None, "reconcile is the trace's root");
    assert_eq!(tag_str(root, "kind"), "PostgresCluster");
    assert_eq!(tag_str(root, "namespace"), env.namespace);
    assert_eq!(tag_str(root, "name"), name);
    assert_eq!(tag(root, "generation").as_i64(), Some(1), "{:?}", root.tags);
    assert_eq!(tag_str(root, "result"), "success");

    let child = |op: &str| -> Vec<&Span> { spans.iter().filter(|s| s.operation == op).collect() };
    let observe = child("observe");
    let plugin = child("plugin.call");
    let policy = child("policy.eval");
    let applies = child("apply");
    for s in observe.iter().chain(&plugin).chain(&policy).chain(&applies) {
        assert_eq!(s.parent.as_deref(), Some(root.id.as_str()), "{} is a child of reconcile", s.operation);
    }
    assert_eq!((observe.len(), plugin.len(), policy.len()), (1, 1, 1), "{spans:#?}");

    let plugin = plugin[0];
    assert_eq!(tag_str(plugin, "plugin"), "postgres");
    assert!(!tag_str(plugin, "version").is_empty());
    assert_eq!(tag_str(plugin, "export"), "reconcile");
    let ms = tag(plugin, "elapsed_ms").as_f64().expect("elapsed_ms is a number");
    assert!(ms > 0.0 && ms < 2_000.0, "plugin call took {ms} ms");

    let policy = policy[0];
    assert_eq!(tag_str(policy, "path"), "data.stateward.guardrails");
    assert_eq!(tag_str(policy, "result"), "allow");
    let decision_ids: Vec<&str> = tag_str(policy, "decision_id").split(',').collect();
    assert_eq!(decision_ids.len() as i64, tag(policy, "decisions").as_i64().expect("decisions"));

    // One apply span per planned action, each naming its object; the StatefulSet among them.
    // The last decision is the status write's, which has a span of its own.
    assert_eq!(applies.len() + 1, decision_ids.len(), "one apply per gated action, and the status");
    let sts = applies.iter().find(|s| tag_str(s, "kind") == "StatefulSet").expect("StatefulSet apply");
    assert_eq!(tag_str(sts, "name"), name);
    assert_eq!(tag_str(sts, "verb"), "apply");
    // Order in time: observe < plugin.call < policy.eval < first apply.
    let start = |s: &Span| {
        trace["spans"].as_array().unwrap().iter().find(|x| x["spanID"] == s.id.as_str()).unwrap()["startTime"]
            .as_i64()
            .unwrap()
    };
    let first_apply = applies.iter().map(|s| start(s)).min().unwrap();
    assert!(
        start(observe[0]) <= start(plugin) && start(plugin) <= start(policy) && start(policy) <= first_apply
    );

    // The same trace id in the audit records of those decisions and in the operator's log lines.
    let trace_id = trace["traceID"].as_str().expect("traceID");
    let audit = std::fs::read_to_string(&operator.audit).expect("audit log");
    let records: Vec<Value> = audit.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    for id in &decision_ids {
        let rec = records
            .iter()
            .find(|r| r["decision_id"] == *id)
            .unwrap_or_else(|| panic!("decision {id} audited"));
        assert_eq!(rec["trace_id"].as_str(), Some(trace_id), "audit record carries the trace id: {rec}");
        assert_eq!(rec["span_id"].as_str(), Some(policy.id.as_str()), "and the policy.eval span id");
    }
    let log = std::fs::read_to_string(&operator.log).expect("operator log");
    let lines: Vec<Value> = log.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let in_reconciles: Vec<&Value> = lines
        .iter()
        .filter(|l| l["spans"].as_array().is_some_and(|s| s.first().is_some_and(|f| f == "reconcile")))
        .collect();
    assert!(
        !in_reconciles.is_empty()
            && in_reconciles.iter().all(|l| l["trace_id"].as_str().is_some_and(|t| t.len() == 32)),
        "every log line inside a reconcile has a trace_id: {in_reconciles:#?}"
    );
    // This reconcile's lines (one per action) carry its trace id, the id of their apply span,
    // and the fields of the spans around them (the inner apply span's kind/name win; the
    // namespace and generation come from reconcile).
    // (The status write's own debug line, when there is one, is not an action's.)
    let ours: Vec<&&Value> =
        in_reconciles.iter().filter(|l| l["trace_id"] == trace_id && l["message"] == "action").collect();
    assert_eq!(ours.len(), applies.len(), "one debug line per action in this trace: {ours:#?}");
    for l in &ours {
        let span = applies
            .iter()
            .find(|s| l["span_id"].as_str() == Some(s.id.as_str()))
            .unwrap_or_else(|| panic!("a line names its apply span: {l}"));
        assert_eq!(l["name"].as_str(), Some(tag_str(span, "name")), "{l}");
        assert_eq!(l["verb"].as_str(), Some(tag_str(span, "verb")), "{l}");
        assert_eq!(l["namespace"].as_str(), Some(env.namespace.as_str()), "{l}");
        assert_eq!(l["generation"].as_i64(), Some(1), "{l}");
    }

    // /metrics counts what was exported, and the reconcile families have real counts.
    let (_, metrics) = operator.get("/metrics").expect("scrape /metrics");
    assert!(
        sum_metric(&metrics, "stateward_otel_spans_exported_total", &[]) >= spans.len() as f64,
        "{metrics}"
    );
    assert!(sum_metric(&metrics, "stateward_reconcile_total", &["result=\"success\""]) >= 1.0);
    assert!(metrics.contains("process_resident_memory_bytes "), "process metrics present");
    assert!(
        sum_metric(&metrics, "stateward_reconcile_duration_seconds_count", &["result=\"success\""]) >= 1.0
    );
    // Prometheus' own linter on the live exposition, counts and all.
    let out = promtool_check(&to_classic(&metrics));
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "promtool check metrics: {}{}\n{metrics}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `promtool check metrics` (tests/tools/build-promtool; built on first use when missing).
fn promtool_check(exposition: &str) -> std::process::Output {
    use std::io::Write as _;
    let bin = match std::env::var_os("STATEWARD_PROMTOOL") {
        Some(p) => PathBuf::from(p),
        None => {
            let out = Command::new(workspace_root().join("tests/tools/build-promtool"))
                .stderr(Stdio::inherit())
                .output()
                .expect("run tests/tools/build-promtool");
            assert!(out.status.success(), "tests/tools/build-promtool failed");
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        }
    };
    let mut child = Command::new(bin)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child.stdin.take().expect("stdin").write_all(exposition.as_bytes()).expect("feed promtool");
    child.wait_with_output().expect("promtool output")
}

/// OpenMetrics to the classic text format `promtool check metrics` reads: counter families are
/// named with their `_total`, and `# UNIT` / `# EOF` go.
fn to_classic(openmetrics: &str) -> String {
    let counters: Vec<&str> =
        openmetrics.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter")).collect();
    let mut out = String::new();
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|tag| {
            let (name, tail) = line.strip_prefix(tag)?.split_once(' ')?;
            counters.contains(&name).then(|| format!("{tag}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

fn plugin_resource(spec: Value) -> String {
    serde_json::json!({
        "apiVersion": "stateward.dev/v1", "kind": "PostgresCluster",
        "metadata": {"name": "logs", "namespace": "default", "uid": "00000000-0000-0000-0000-000000000001", "generation": 1},
        "spec": spec,
    })
    .to_string()
}

/// A plugin's `log` line is an event on its `plugin.call` span (with the plugin's name), and a
/// webhook span is a trace of its own, in the real Jaeger.
#[test]
fn plugin_logs_are_span_events_and_webhooks_are_their_own_traces() {
    let jaeger = Jaeger::start();
    let stats = ExportStats::default();
    let provider = otel::provider(Some(&ExportSettings::to_base(&jaeger.otlp)), &stats).expect("provider");
    let subscriber = tracing_subscriber::registry().with(otel::layer(&provider));
    let sandbox = support::sandbox();
    let plugin = support::load(&sandbox, "stateward-postgres");
    // A spec the plugin itself rejects (replicas as text), so it logs a warning.
    let resource = plugin_resource(
        serde_json::json!({"version": "17.2", "replicas": "three", "storage": {"size": "1Gi"}}),
    );
    tracing::subscriber::with_default(subscriber, || {
        let root = tracing::info_span!("reconcile", kind = "PostgresCluster", name = "logs");
        let _r = root.enter();
        let call = tracing::info_span!("plugin.call", plugin = plugin.name(), export = "reconcile");
        let plan =
            call.in_scope(|| plugin.reconcile(&resource, &[], 1_767_225_600_000, "default")).expect("plan");
        assert!(plan.actions.is_empty(), "an invalid spec plans nothing");
        drop(_r);
        let hook = otel::webhook_span("validate", "PostgresCluster", "default", "logs");
        hook.in_scope(|| tracing::info!("admitted"));
        hook.record("result", "allow");
    });
    provider.force_flush().expect("flush");

    let (trace, _) = poll("the plugin's trace", Duration::from_secs(30), || {
        jaeger.traces(otel::DEFAULT_SERVICE_NAME, "reconcile", &[("name", "logs")]).into_iter().next()
    });
    let traced = spans(&trace);
    let call = traced.iter().find(|s| s.operation == "plugin.call").expect("plugin.call span");
    let event = call
        .logs
        .iter()
        .find(|l| l.get("event").and_then(Value::as_str).is_some_and(|m| m.contains("invalid spec")))
        .unwrap_or_else(|| panic!("plugin log as a span event: {:?}", call.logs));
    assert_eq!(event.get("plugin").and_then(Value::as_str), Some("postgres"), "{event:?}");
    assert_eq!(event.get("level").and_then(Value::as_str), Some("WARN"), "{event:?}");

    let (hook, _) = poll("the webhook trace", Duration::from_secs(30), || {
        jaeger.traces(otel::DEFAULT_SERVICE_NAME, "webhook%20validate", &[]).into_iter().next()
    });
    let hook_spans = spans(&hook);
    assert_eq!(hook_spans.len(), 1, "{hook_spans:#?}");
    assert_ne!(hook["traceID"], trace["traceID"], "a webhook request is its own trace");
    assert_eq!(hook_spans[0].parent, None);
    assert_eq!(tag_str(&hook_spans[0], "result"), "allow");
    assert_eq!(tag_str(&hook_spans[0], "span.kind"), "server");
    assert!(stats.exported() >= 3, "exported {}", stats.exported());
    let _ = provider.shutdown();
}

/// With the collector's port closed, making spans never waits on the exporter: the queue fills,
/// the overflow is dropped and counted, and the batches that were tried count as failed.
#[test]
fn a_closed_collector_port_drops_and_counts_without_blocking() {
    let closed = free_port(); // bound and released: nothing listens there
    let stats = ExportStats::default();
    let mut settings = ExportSettings::to_base(&format!("http://127.0.0.1:{closed}"));
    settings.queue_spans = 64;
    settings.interval = Duration::from_millis(50);
    let provider = otel::provider(Some(&settings), &stats).expect("provider");
    let subscriber = tracing_subscriber::registry().with(otel::layer(&provider));
    let made: u64 = 5_000;
    tracing::subscriber::with_default(subscriber, || {
        for i in 0..made {
            let s = tracing::info_span!("reconcile", i);
            s.in_scope(|| tracing::info!("work"));
        }
    });
    let _ = provider.force_flush();
    let deadline = Instant::now() + Duration::from_secs(20);
    while stats.dropped("export_failed") == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let (full, failed) = (stats.dropped("queue_full"), stats.dropped("export_failed"));
    assert_eq!(stats.exported(), 0, "nothing can reach a closed port");
    assert!(full > 0, "a 64-span queue must overflow under {made} spans");
    assert!(failed > 0, "the batches tried must count as failed");
    assert!(full + failed <= made, "each span is counted at most once: {full} + {failed}");
    let _ = provider.shutdown_with_timeout(Duration::from_secs(2));
}

/// Runs in a child process (the log subscriber is process-global): export off, JSON logs.
#[test]
#[ignore = "helper: run by json_log_lines_carry_the_trace_ids_with_export_off in a child process"]
fn json_trace_id_child() {
    stateward::telemetry::logging::init(true);
    for name in ["first", "second"] {
        let reconcile = tracing::info_span!("reconcile", kind = "PostgresCluster", name);
        let _r = reconcile.enter();
        tracing::info!("observed");
        tracing::info_span!("plugin.call", plugin = "postgres")
            .in_scope(|| tracing::warn!("from the plugin"));
    }
    tracing::info!("outside any span");
}

/// With no OTEL_* variables (export off) every log line inside a span still names its trace and
/// span: one trace id per reconcile, shared by its child spans' lines, none outside spans.
#[test]
fn json_log_lines_carry_the_trace_ids_with_export_off() {
    let exe = std::env::current_exe().expect("test binary");
    let mut cmd = Command::new(exe);
    cmd.args([
        "--exact",
        &support::test_name(module_path!(), "json_trace_id_child"),
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env_remove("RUST_LOG");
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("OTEL_")) {
        cmd.env_remove(k);
    }
    let out = cmd.output().expect("run child");
    assert!(out.status.success(), "child failed: {}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<Value> =
        stderr.lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).expect(l)).collect();
    assert_eq!(lines.len(), 5, "{stderr}");
    let id = |l: &Value, key: &str| l[key].as_str().map(str::to_owned);
    let hex = |s: &Option<String>, n: usize| {
        s.as_ref().is_some_and(|s| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit()))
    };
    for l in &lines[..4] {
        assert!(hex(&id(l, "trace_id"), 32) && hex(&id(l, "span_id"), 16), "W3C ids: {l}");
    }
    assert_eq!(
        id(&lines[0], "trace_id"),
        id(&lines[1], "trace_id"),
        "a child span's line is in its reconcile's trace"
    );
    assert_ne!(id(&lines[0], "span_id"), id(&lines[1], "span_id"), "but names its own span");
    assert_eq!(lines[1]["plugin"], "postgres");
    assert_eq!(id(&lines[2], "trace_id"), id(&lines[3], "trace_id"));
    assert_ne!(id(&lines[0], "trace_id"), id(&lines[2], "trace_id"), "each reconcile is its own trace");
    assert!(lines[4].get("trace_id").is_none(), "no trace outside spans: {}", lines[4]);
}

/// The operator exporting to a closed port reconciles a CR to Running as usual, while its
/// `/metrics` shows the spans it could not deliver.
#[tokio::test]
async fn operator_with_a_dead_collector_reconciles_normally() {
    let env = TestEnv::new("e2e-deadotel").await.expect("test env");
    let _teardown = Teardown::new(&env);
    let closed = free_port();
    let mut operator = Operator::start_with(
        &env,
        "dead-collector",
        OperatorOpts {
            namespace: env.namespace.clone(),
            lease_namespace: env.namespace.clone(),
            env: vec![
                ("OTEL_EXPORTER_OTLP_ENDPOINT".into(), format!("http://127.0.0.1:{closed}")),
                ("OTEL_BSP_MAX_QUEUE_SIZE".into(), "16".into()),
            ],
            ..Default::default()
        },
    );
    operator.wait_ready(Duration::from_secs(60)).await;
    apply(&env, &env.namespace, &POSTGRES.manifest("undeterred", 1, "Retain"));
    let took = wait_running(&env, POSTGRES, "undeterred", 1, Duration::from_secs(120)).await;
    eprintln!("tracing: Running 1/1 in {took:.1?} with the collector down");
    let (lost, _) = poll("failed exports counted", Duration::from_secs(30), || {
        let (_, metrics) = operator.get("/metrics").ok()?;
        let lost = sum_metric(&metrics, "stateward_otel_spans_dropped_total", &[]);
        (lost > 0.0).then_some((lost, metrics))
    });
    let (lost, metrics) = lost;
    assert_eq!(sum_metric(&metrics, "stateward_otel_spans_exported_total", &[]), 0.0);
    assert!(sum_metric(&metrics, "stateward_reconcile_total", &["result=\"success\""]) >= 1.0);
    eprintln!("tracing: {lost} spans dropped, reconciles unaffected");
}
