//! What OTLP trace export costs the reconcile path, measured in one run against baselines.
//!
//! One iteration is the in-process part of a reconcile with the operator's span tree and log
//! setup: `reconcile` → `observe` (the children are cloned) → `plugin.call` (the real Wasm
//! PostgreSQL plugin plans a converged 3-replica cluster) → `policy.eval` (the shipped
//! guardrails decide every action through regorus, each decision written to an audit file with
//! the trace id; OS-buffered, no fsync, so the CPU path is what is timed) → one `apply` span per
//! action (no API call: the write itself is not what export could slow) → `status`, with one
//! JSON log line (flattened fields plus trace ids, to a sink) per reconcile. The API server round
//! trips of a real reconcile are left out, which makes the measured overhead an upper bound.
//!
//! Configurations, interleaved reconcile by reconcile so drift hits all alike:
//! - `no OpenTelemetry layer`: tracing with the JSON log layer only (the floor);
//! - `export off`: the operator without `OTEL_*` variables (spans get ids, nothing sampled);
//! - `export → closed port`: every span sampled and batched toward a loopback port where nothing
//!   listens, so every export fails and the queue overflows;
//! - `export → live Jaeger` when the Jaeger binary is at hand (STATEWARD_JAEGER or the
//!   tests/tools/build-jaeger cache).
//!
//! cargo bench -p stateward --bench otel_overhead     (target: closed port ≤ 1.10 × export off)
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stateward::policy::{AuditLog, AuditSink, Bundle, FsyncPolicy, Gate, PolicyEngine};
use stateward::runtime::{Action, AllocatorKind, Limits, Plugin, Sandbox};
use stateward::telemetry::logging::FlatJson;
use stateward::telemetry::otel::{self, ExportSettings, ExportStats};
use tracing::Dispatch;
use tracing_subscriber::fmt::format::JsonFields;
use tracing_subscriber::layer::SubscriberExt;

const RESOURCE: &str = r#"{"apiVersion":"stateward.dev/v1","kind":"PostgresCluster",
  "metadata":{"name":"bench","namespace":"default","generation":2,"uid":"00000000-0000-0000-0000-000000000001"},
  "spec":{"version":"16.4","replicas":3,"storage":{"size":"10Gi","className":"local"},"retentionPolicy":"Retain"}}"#;

/// Reconciles timed per configuration.
const RECONCILES: usize = 2000;

fn observed_children(plugin: &Plugin) -> Vec<String> {
    let plan = plugin.reconcile(RESOURCE, &[], 0, "default").expect("first plan");
    plan.actions
        .iter()
        .filter_map(|a| match a {
            Action::Apply { object } => Some(object.clone()),
            _ => None,
        })
        .map(|mut o: Value| {
            if o["kind"] == "StatefulSet" {
                o["status"] = json!({"replicas": 3, "readyReplicas": 3, "updatedReplicas": 3,
                    "currentReplicas": 3, "currentRevision": "r1", "updateRevision": "r1", "observedGeneration": 1});
            }
            o.to_string()
        })
        .collect()
}

struct Path<'a> {
    plugin: &'a Plugin,
    gate: &'a Gate,
    resource: Value,
    children: Vec<String>,
}

impl Path<'_> {
    /// One reconcile's in-process work inside the operator's span tree.
    fn reconcile(&self) {
        let root = tracing::info_span!(
            "reconcile",
            kind = "PostgresCluster",
            namespace = "default",
            name = "bench",
            generation = 2i64,
            result = tracing::field::Empty
        );
        let _r = root.enter();
        let children = tracing::info_span!("observe").in_scope(|| self.children.clone());
        let call = tracing::info_span!(
            "plugin.call",
            plugin = self.plugin.name(),
            version = self.plugin.version(),
            export = "reconcile",
            elapsed_ms = tracing::field::Empty
        );
        let started = Instant::now();
        let plan = call.in_scope(|| self.plugin.reconcile(RESOURCE, &children, 0, "default")).expect("plan");
        call.record("elapsed_ms", started.elapsed().as_secs_f64() * 1e3);
        let eval = tracing::info_span!(
            "policy.eval",
            path = "data.stateward.guardrails",
            result = tracing::field::Empty
        );
        let verdict = eval.in_scope(|| {
            stateward::guardrails::check(self.gate, self.plugin, &self.resource, &[], &plan.actions, None)
        });
        assert!(verdict.allowed(), "the shipped guardrails allow the postgres plan");
        eval.record("result", "allow");
        for action in &plan.actions {
            let span =
                tracing::info_span!("apply", kind = "StatefulSet", name = "bench", verb = action.verb());
            span.in_scope(|| std::hint::black_box(action));
        }
        tracing::info_span!("status").in_scope(|| std::hint::black_box(&plan.status));
        root.record("result", "success");
        tracing::info!(actions = plan.actions.len(), "reconciled");
    }
}

fn json_logs<S>() -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_subscriber::fmt::layer()
        .fmt_fields(JsonFields::new())
        .event_format(FlatJson)
        .with_writer(std::io::sink)
}

struct Config {
    name: String,
    dispatch: Dispatch,
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
    stats: ExportStats,
    samples: Vec<Duration>,
}

fn config(name: &str, export: Option<Option<ExportSettings>>) -> Config {
    let stats = ExportStats::default();
    let (dispatch, provider) = match export {
        None => (Dispatch::new(tracing_subscriber::registry().with(json_logs())), None),
        Some(settings) => {
            let provider = otel::provider(settings.as_ref(), &stats).expect("provider");
            let subscriber = tracing_subscriber::registry().with(otel::layer(&provider)).with(json_logs());
            (Dispatch::new(subscriber), Some(provider))
        }
    };
    Config { name: name.to_owned(), dispatch, provider, stats, samples: Vec::new() }
}

fn jaeger_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("STATEWARD_JAEGER") {
        return Some(PathBuf::from(p));
    }
    let cache = std::env::var_os("STATEWARD_CACHE").map(PathBuf::from).or_else(|| {
        std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|c| c.join("stateward"))
    })?;
    let p = cache.join("bin/jaeger-v1.75.0/jaeger");
    p.is_file().then_some(p)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A Jaeger with in-memory storage and an OTLP/HTTP receiver on a loopback port.
struct Jaeger(Child, PathBuf);

impl Drop for Jaeger {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

fn start_jaeger(bin: &PathBuf) -> (Jaeger, String) {
    let (otlp, query, grpc) = (free_port(), free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("otel-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = format!(
        "service:\n  extensions: [jaeger_storage, jaeger_query]\n  pipelines:\n    traces:\n      receivers: [otlp]\n      processors: [batch]\n      exporters: [jaeger_storage_exporter]\n  telemetry:\n    metrics:\n      level: none\n    logs:\n      level: warn\nextensions:\n  jaeger_query:\n    storage:\n      traces: mem\n    http:\n      endpoint: 127.0.0.1:{query}\n    grpc:\n      endpoint: 127.0.0.1:{grpc}\n  jaeger_storage:\n    backends:\n      mem:\n        memory:\n          max_traces: 20000\nreceivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: 127.0.0.1:{otlp}\nprocessors:\n  batch:\nexporters:\n  jaeger_storage_exporter:\n    trace_storage: mem\n"
    );
    std::fs::write(dir.join("config.yaml"), config).unwrap();
    let child = Command::new(bin)
        .arg("--config")
        .arg(dir.join("config.yaml"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", otlp)).is_err() {
        assert!(Instant::now() < deadline, "jaeger's OTLP port did not open");
        std::thread::sleep(Duration::from_millis(100));
    }
    (Jaeger(child, dir), format!("http://127.0.0.1:{otlp}"))
}

fn pct(samples: &[Duration], q: f64) -> Duration {
    let mut s = samples.to_vec();
    s.sort();
    s[((s.len() as f64 - 1.0) * q).round() as usize]
}

fn mean(samples: &[Duration]) -> Duration {
    samples.iter().sum::<Duration>() / samples.len() as u32
}

fn main() {
    let sandbox: Arc<Sandbox> = Sandbox::new(Limits::default(), AllocatorKind::Auto, None).expect("sandbox");
    let plugin =
        Plugin::load(&sandbox, &std::fs::read(support::wasm("stateward-postgres")).unwrap()).expect("load");
    let policies = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
    let engine = Arc::new(PolicyEngine::compile(&Bundle::from_dir(&policies).unwrap()).unwrap());
    let audit_path = std::env::temp_dir().join(format!("otel-bench-audit-{}.jsonl", std::process::id()));
    let audit = AuditLog::open(&AuditSink::File(audit_path.clone()), FsyncPolicy::OsBuffered).unwrap();
    let gate = Gate::new(engine, Arc::new(audit));
    let path = Path {
        plugin: &plugin,
        gate: &gate,
        resource: serde_json::from_str(RESOURCE).unwrap(),
        children: observed_children(&plugin),
    };

    let closed = free_port();
    let mut configs = vec![
        config("no OpenTelemetry layer", None),
        config("export off (no OTEL_* variables)", Some(None)),
        config(
            "export → closed loopback port",
            Some(Some(ExportSettings::to_base(&format!("http://127.0.0.1:{closed}")))),
        ),
    ];
    let jaeger = jaeger_binary().map(|bin| start_jaeger(&bin));
    if let Some((_, endpoint)) = &jaeger {
        configs.push(config("export → live Jaeger", Some(Some(ExportSettings::to_base(endpoint)))));
    }

    for c in &configs {
        tracing::dispatcher::with_default(&c.dispatch, || {
            for _ in 0..50 {
                path.reconcile();
            }
        });
    }
    // Round robin, one reconcile per configuration in turn: a burst of load from elsewhere on
    // the machine lands on all configurations alike.
    for _ in 0..RECONCILES {
        for c in configs.iter_mut() {
            let dispatch = c.dispatch.clone();
            tracing::dispatcher::with_default(&dispatch, || {
                let t = Instant::now();
                path.reconcile();
                c.samples.push(t.elapsed());
            });
        }
    }
    for c in &configs {
        if let Some(p) = &c.provider {
            let _ = p.force_flush();
        }
    }

    let base = mean(&configs[1].samples).as_secs_f64();
    let floor = mean(&configs[0].samples).as_secs_f64();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!("\nreconcile path (plugin + guardrails + audit + span tree + JSON log), {RECONCILES} reconciles per configuration");
    let base_p50 = pct(&configs[1].samples, 0.5).as_secs_f64();
    println!("| configuration | mean | p50 | p99 | p50 / export off | mean / export off | mean / no layer | spans exported | dropped (queue full / export failed) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for c in &configs {
        let m = mean(&c.samples);
        let p50 = pct(&c.samples, 0.5);
        println!(
            "| {} | {:.1} µs | {:.1} µs | {:.1} µs | {:.3} | {:.3} | {:.3} | {} | {} / {} |",
            c.name,
            us(m),
            us(p50),
            us(pct(&c.samples, 0.99)),
            p50.as_secs_f64() / base_p50,
            m.as_secs_f64() / base,
            m.as_secs_f64() / floor,
            c.stats.exported(),
            c.stats.dropped("queue_full"),
            c.stats.dropped("export_failed"),
        );
    }
    let closed = (
        pct(&configs[2].samples, 0.5).as_secs_f64() / base_p50,
        mean(&configs[2].samples).as_secs_f64() / base,
    );
    let met = closed.0 <= 1.10 && closed.1 <= 1.10;
    println!(
        "target: closed port ≤ 1.10 × export off (p50 {:.3}, mean {:.3}): {}",
        closed.0,
        closed.1,
        if met { "met" } else { "MISSED" }
    );
    for c in &configs {
        if let Some(p) = &c.provider {
            let _ = p.shutdown_with_timeout(Duration::from_secs(1));
        }
    }
    drop(jaeger);
    let _ = std::fs::remove_file(audit_path);
}
