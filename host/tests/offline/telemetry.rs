//! The telemetry module over a real TCP socket: metrics recorded through `Metrics` come back out
//! of `/metrics` with the names listed in docs/architecture.md (Telemetry), the probes follow
//! `DebugState`, graceful shutdown ends the server, Prometheus' own `promtool` accepts the
//! exposition, and the JSON log setup writes flattened JSON lines with span fields.
//!
//! HTTP is spoken by hand over `std::net::TcpStream` (HTTP/1.0, so the server closes the
//! connection and sends no chunked encoding): the test sees exactly the bytes a scraper sees.
#![allow(clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use stateward::telemetry::{http, logging, DebugState, Metrics};

use crate::support;
use tokio::sync::oneshot;

struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// One GET, blocking; run on the blocking pool so the server keeps its runtime threads.
async fn get(addr: SocketAddr, path: &str) -> Response {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(addr).expect("connect");
        write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("send request");
        let mut raw = String::new();
        stream.read_to_string(&mut raw).expect("read response");
        let (head, body) = raw.split_once("\r\n\r\n").expect("header/body separator");
        let mut lines = head.lines();
        let status_line = lines.next().expect("status line");
        let status = status_line.split(' ').nth(1).expect("status code").parse().expect("numeric status");
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
            .collect();
        Response { status, headers, body: body.to_owned() }
    })
    .await
    .expect("client task")
}

/// A running server on a free loopback port, and the means to stop it.
struct Server {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn start(metrics: Metrics, state: DebugState) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
    let addr = listener.local_addr().expect("local addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(http::serve_listener(listener, metrics, state, async move {
        let _ = stopped.await;
    }));
    Server { addr, stop, task }
}

/// Metrics with at least one sample in every family, including the replacement cases.
fn recorded() -> Metrics {
    let m = Metrics::new();
    m.reconcile("postgrescluster", "ok", 0.004);
    m.reconcile("postgrescluster", "ok", 0.020);
    m.reconcile("postgrescluster", "error", 1.5);
    m.plugin_call("postgres", "reconcile", 0.0007);
    m.plugin_trap("postgres", "fuel");
    m.plugin_loaded("postgres", "1.0.0", "sha256:aaa");
    m.plugin_loaded("postgres", "1.1.0", "sha256:bbb"); // replaces 1.0.0
    m.plugin_loaded("redis", "2.0.0", "sha256:ccc");
    m.plugin_load_failure("elasticsearch", "bad-signature");
    m.policy_decision("stateward.admission", "allow", 0.0002);
    m.policy_decision("stateward.admission", "deny", 0.0003);
    m.managed_resources("PostgresCluster", &[("Running".into(), 2), ("Scaling".into(), 1)].into());
    m.managed_resources("PostgresCluster", &[("Running".into(), 3)].into()); // Scaling empties out
    m.api_write("apply", "StatefulSet");
    m.api_write("apply", "StatefulSet");
    m
}

#[tokio::test]
async fn metrics_endpoints_serve_the_design_names_and_values() {
    let server = start(recorded(), DebugState::default()).await;
    for path in ["/metrics", "/debug/metrics"] {
        let resp = get(server.addr, path).await;
        assert_eq!(resp.status, 200, "{path}");
        assert_eq!(resp.header("content-type"), Some(http::OPENMETRICS_CONTENT_TYPE), "{path}");
        let body = &resp.body;
        for line in [
            "# TYPE stateward_reconcile counter",
            r#"stateward_reconcile_total{controller="postgrescluster",result="ok"} 2"#,
            r#"stateward_reconcile_total{controller="postgrescluster",result="error"} 1"#,
            "# TYPE stateward_reconcile_duration_seconds histogram",
            "# UNIT stateward_reconcile_duration_seconds seconds",
            r#"stateward_reconcile_duration_seconds_count{controller="postgrescluster",result="ok"} 2"#,
            r#"stateward_reconcile_duration_seconds_sum{controller="postgrescluster",result="ok"} 0.024"#,
            r#"stateward_reconcile_duration_seconds_bucket{le="0.001",controller="postgrescluster",result="ok"} 0"#,
            r#"stateward_reconcile_duration_seconds_bucket{le="0.005",controller="postgrescluster",result="ok"} 1"#,
            r#"stateward_reconcile_duration_seconds_bucket{le="0.025",controller="postgrescluster",result="ok"} 2"#,
            r#"stateward_reconcile_duration_seconds_bucket{le="+Inf",controller="postgrescluster",result="error"} 1"#,
            r#"stateward_plugin_call_duration_seconds_bucket{le="0.001",plugin="postgres",export="reconcile"} 1"#,
            r#"stateward_plugin_traps_total{plugin="postgres",reason="fuel"} 1"#,
            r#"stateward_plugins_loaded{plugin="postgres",version="1.1.0",digest="sha256:bbb"} 1"#,
            r#"stateward_plugins_loaded{plugin="redis",version="2.0.0",digest="sha256:ccc"} 1"#,
            r#"stateward_plugin_load_failures_total{plugin="elasticsearch",reason="bad-signature"} 1"#,
            r#"stateward_policy_decisions_total{policy="stateward.admission",result="allow"} 1"#,
            r#"stateward_policy_decisions_total{policy="stateward.admission",result="deny"} 1"#,
            r#"stateward_policy_eval_duration_seconds_count{policy="stateward.admission"} 2"#,
            r#"stateward_managed_resources{kind="PostgresCluster",phase="Running"} 3"#,
            r#"stateward_managed_resources{kind="PostgresCluster",phase="Scaling"} 0"#,
            r#"stateward_api_writes_total{verb="apply",kind="StatefulSet"} 2"#,
        ] {
            assert!(body.lines().any(|l| l == line), "{path}: missing line {line:?} in:\n{body}");
        }
        assert!(!body.contains(r#"version="1.0.0""#), "{path}: replaced plugin build still listed:\n{body}");
        assert!(body.ends_with("# EOF\n"), "{path}: exposition must end with # EOF");
    }
    server.stop.send(()).expect("stop");
    server.task.await.expect("join").expect("serve");
}

#[tokio::test]
async fn probes_follow_the_debug_state() {
    let state = DebugState::default();
    let server = start(Metrics::new(), state.clone()).await;

    let health = get(server.addr, "/healthz").await;
    assert_eq!((health.status, health.body.as_str()), (200, "ok"));
    assert_eq!(get(server.addr, "/readyz").await.status, 503, "not ready before set_ready(true)");
    state.set_ready(true);
    assert_eq!(get(server.addr, "/readyz").await.status, 200);
    state.set_ready(false);
    assert_eq!(get(server.addr, "/readyz").await.status, 503, "ready can be withdrawn (shutdown)");
    assert_eq!(get(server.addr, "/nope").await.status, 404);

    server.stop.send(()).expect("stop");
    server.task.await.expect("join").expect("serve");
}

/// A kind's controller task that panics (or ends) turns `/readyz` to 503, and says why in
/// `/debug/healthz`; a restart of the controllers makes the replica ready again.
#[tokio::test]
async fn readyz_fails_once_a_controller_task_died() {
    use stateward::controller::panics::supervise;

    let state = DebugState::default();
    let server = start(Metrics::new(), state.clone()).await;
    state.set_ready(true);
    let healthy = supervise(&state, "PostgresCluster", std::future::pending());
    assert_eq!(get(server.addr, "/readyz").await.status, 200, "a running controller is ready");

    let dying = supervise(&state, "RedisCluster", async {
        let nothing: Option<u8> = None;
        if nothing.is_none() {
            panic!("the gate fell over");
        }
    });
    dying.await.expect("the supervisor itself does not panic");
    let probe = get(server.addr, "/readyz").await;
    assert_eq!(probe.status, 503, "a dead controller task makes the replica unready");
    let doc: serde_json::Value =
        serde_json::from_str(&get(server.addr, "/debug/healthz").await.body).expect("json");
    assert_eq!(doc["ready"], false);
    assert_eq!(doc["controllers"]["PostgresCluster"], "running");
    assert_eq!(doc["controllers"]["RedisCluster"], "panicked: the gate fell over");

    // The controllers are started again (after a leadership change or a plugin with new kinds).
    state.controller_started("RedisCluster");
    assert_eq!(get(server.addr, "/readyz").await.status, 200);
    healthy.abort();
    let _ = healthy.await;
    assert_eq!(get(server.addr, "/readyz").await.status, 200, "an aborted task is not a death");

    server.stop.send(()).expect("stop");
    server.task.await.expect("join").expect("serve");
}

#[tokio::test]
async fn debug_endpoints_report_plugins_policy_leader_and_watches() {
    let state = DebugState::default();
    let server = start(Metrics::new(), state.clone()).await;

    let empty: serde_json::Value =
        serde_json::from_str(&get(server.addr, "/debug/plugins").await.body).expect("json");
    assert_eq!(empty, serde_json::json!([]), "no plugins yet is an empty list");

    let plugins = serde_json::json!([{
        "name": "postgres", "version": "1.1.0", "digest": "sha256:bbb",
        "kinds": ["PostgresCluster"], "loadedAt": "2026-12-02T17:00:00Z", "lastError": null
    }]);
    state.set_plugins(plugins.clone());
    state.set_policy("sha256:policy");
    state.set_leader(true);
    state.set_ready(true);
    state.set_watch("PostgresCluster", true);
    state.set_watch("StatefulSet", false);

    let resp = get(server.addr, "/debug/healthz").await;
    assert_eq!(resp.status, 200);
    assert!(resp.header("content-type").is_some_and(|c| c.starts_with("application/json")));
    let doc: serde_json::Value = serde_json::from_str(&resp.body).expect("debug/healthz is JSON");
    assert_eq!(doc["ready"], true);
    assert_eq!(doc["leader"], true);
    assert_eq!(doc["plugins"], plugins);
    assert_eq!(doc["policy"]["bundleDigest"], "sha256:policy");
    assert_eq!(doc["watches"], serde_json::json!({"PostgresCluster": true, "StatefulSet": false}));
    assert_eq!(doc, state.snapshot(), "endpoint serves the snapshot");

    let listed: serde_json::Value =
        serde_json::from_str(&get(server.addr, "/debug/plugins").await.body).expect("json");
    assert_eq!(listed, plugins);

    server.stop.send(()).expect("stop");
    server.task.await.expect("join").expect("serve");
}

#[tokio::test]
async fn shutdown_signal_ends_serve_and_frees_the_port() {
    // The `addr` entry point, on a port picked by binding port 0 and releasing it.
    let addr = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let task =
        tokio::spawn(stateward::telemetry::serve(addr, Metrics::new(), DebugState::default(), async move {
            let _ = stopped.await;
        }));
    let mut up = false;
    for _ in 0..100 {
        if TcpStream::connect(addr).is_ok() {
            up = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(up, "serve never listened on {addr}");
    assert_eq!(get(addr, "/healthz").await.status, 200);

    stop.send(()).expect("stop");
    let ended = tokio::time::timeout(std::time::Duration::from_secs(5), task).await;
    ended.expect("serve returns within 5 s of the shutdown signal").expect("join").expect("serve ok");
    // A process that another test spawns at this moment can hold a copy of the listening socket
    // between its fork and exec (close-on-exec), so allow a moment for the port to close.
    let mut closed = false;
    for _ in 0..100 {
        if TcpStream::connect(addr).is_err() {
            closed = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(closed, "port still accepting 2 s after shutdown");
}

/// Where `tests/tools/build-promtool` puts the binary (keep the version in step with it).
fn promtool() -> PathBuf {
    if let Some(path) = std::env::var_os("STATEWARD_PROMTOOL") {
        return PathBuf::from(path);
    }
    let cache = std::env::var_os("STATEWARD_CACHE").map(PathBuf::from).unwrap_or_else(|| {
        std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .expect("HOME or XDG_CACHE_HOME")
            .join("stateward")
    });
    cache.join("bin/promtool-v0.315.1/promtool")
}

/// The OpenMetrics exposition rewritten to the classic Prometheus text format, which is the only
/// one `promtool check metrics` parses: an OpenMetrics counter family `x` with samples `x_total`
/// is the classic family `x_total`, and `# UNIT` / `# EOF` do not exist there.
fn to_classic(openmetrics: &str) -> String {
    let counters: Vec<&str> =
        openmetrics.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter")).collect();
    let mut out = String::new();
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|tag| {
            let rest = line.strip_prefix(tag)?;
            let (name, tail) = rest.split_once(' ')?;
            counters.contains(&name).then(|| format!("{tag}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

fn run_promtool(bin: &Path, args: &[&str], stdin: &str) -> std::process::Output {
    let mut child = Command::new(bin)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child.stdin.take().expect("stdin").write_all(stdin.as_bytes()).expect("feed promtool");
    child.wait_with_output().expect("promtool output")
}

/// Prometheus' own tooling on the exact bytes of `/metrics`: `promtool check metrics` lints the
/// names, HELP texts and types, and `promtool tsdb create-blocks-from openmetrics` runs the
/// strict OpenMetrics parser that a Prometheus scrape uses (it needs timestamps, so the test
/// appends one to each sample), then `promtool tsdb dump` shows the values survived.
#[tokio::test]
async fn promtool_accepts_the_exposition() {
    let bin = promtool();
    assert!(
        bin.is_file(),
        "promtool not found at {}: run tests/tools/build-promtool (needs Go) or set STATEWARD_PROMTOOL",
        bin.display()
    );
    let server = start(recorded(), DebugState::default()).await;
    let body = get(server.addr, "/metrics").await.body;
    server.stop.send(()).expect("stop");
    server.task.await.expect("join").expect("serve");

    let out = run_promtool(&bin, &["check", "metrics"], &to_classic(&body));
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "promtool check metrics found problems ({}):\n{}{}\n--- exposition ---\n{body}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );

    let dir = std::env::temp_dir().join(format!("stateward-telemetry-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let ts = 1_700_000_000; // any fixed time: the blocks are read back and deleted
    let stamped: String = body
        .lines()
        .map(|l| if l.starts_with('#') { format!("{l}\n") } else { format!("{l} {ts}\n") })
        .collect();
    let input = dir.join("metrics.om");
    std::fs::write(&input, &stamped).expect("write input");
    let blocks = dir.join("blocks");
    let (input_arg, blocks_arg) = (input.to_string_lossy(), blocks.to_string_lossy());
    let parsed =
        run_promtool(&bin, &["tsdb", "create-blocks-from", "openmetrics", "-q", &input_arg, &blocks_arg], "");
    assert!(
        parsed.status.success(),
        "Prometheus' OpenMetrics parser rejected /metrics ({}):\n{}\n--- input ---\n{stamped}",
        parsed.status,
        String::from_utf8_lossy(&parsed.stderr),
    );
    // `tsdb dump` opens the directory as a whole TSDB, which also has a (here empty) WAL.
    std::fs::create_dir_all(blocks.join("wal")).expect("wal dir");
    let dump = run_promtool(
        &bin,
        &["tsdb", "dump", "--match", r#"{__name__=~"stateward_.*_total"}"#, &blocks_arg],
        "",
    );
    let _ = std::fs::remove_dir_all(&dir);
    let dumped = String::from_utf8_lossy(&dump.stdout);
    assert!(dump.status.success(), "tsdb dump: {}", String::from_utf8_lossy(&dump.stderr));
    for series in [
        r#"{__name__="stateward_reconcile_total", controller="postgrescluster", result="ok"} 2 "#,
        r#"{__name__="stateward_api_writes_total", kind="StatefulSet", verb="apply"} 2 "#,
    ] {
        assert!(dumped.contains(series), "{series:?} not read back by Prometheus; dump:\n{dumped}");
    }
}

/// Runs in a child process (see below) because the log subscriber is process-global.
#[test]
#[ignore = "helper: run by json_logs_are_flat_lines_with_span_fields in a child process"]
fn json_log_child() {
    logging::init(true);
    logging::init(true); // idempotent: a second call must neither panic nor add a subscriber
    let reconcile =
        tracing::info_span!("reconcile", kind = "PostgresCluster", namespace = "db", name = "main");
    let _r = reconcile.enter();
    tracing::info!(trace_id = "abc123", replicas = 3, ready = true, "reconciled");
    tracing::debug!("below the default filter");
    let apply = tracing::info_span!("apply", kind = "StatefulSet");
    let _a = apply.enter();
    tracing::warn!(error = "conflict", "apply failed");
    drop((_a, _r));
    // A crate that logs through `log` rather than `tracing` (bridged by the subscriber).
    log::warn!(target: "rustls::client", "from the log crate");
}

#[test]
fn json_logs_are_flat_lines_with_span_fields() {
    let exe = std::env::current_exe().expect("test binary");
    let out = Command::new(exe)
        .args([
            "--exact",
            &support::test_name(module_path!(), "json_log_child"),
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env_remove("RUST_LOG")
        .output()
        .expect("run child");
    assert!(out.status.success(), "child failed: {}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let mut events: Vec<serde_json::Value> = stderr
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).map_err(|e| format!("{e}: {l}")))
        .collect::<Result<_, _>>()
        .expect("every log line is one JSON object");
    assert_eq!(events.len(), 3, "the info, warn and log-crate events, debug filtered out:\n{stderr}");
    let bridged = events.pop().expect("log-crate event");
    assert_eq!(bridged["target"], "rustls::client", "real target of a `log` record: {bridged}");
    assert_eq!(bridged["message"], "from the log crate");
    assert!(bridged.as_object().is_some_and(|o| !o.keys().any(|k| k.starts_with("log."))), "{bridged}");
    assert!(bridged.get("spans").is_none(), "outside any span: {bridged}");
    for ev in &events {
        let line = ev.to_string();
        assert!(ev["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')), "{line}");
        assert_eq!(ev["target"], module_path!(), "the emitting module: {line}");
        assert_eq!(ev["namespace"], "db", "span fields at the top level: {line}");
        assert_eq!(ev["name"], "main", "the resource name is not clobbered by the span name: {line}");
    }
    let (info, warn) = (&events[0], &events[1]);
    assert_eq!(info["level"], "INFO");
    assert_eq!(info["message"], "reconciled");
    assert_eq!(
        (&info["trace_id"], &info["replicas"], &info["ready"]),
        (&"abc123".into(), &3.into(), &true.into())
    );
    assert_eq!(info["kind"], "PostgresCluster");
    assert_eq!(info["spans"], serde_json::json!(["reconcile"]));
    assert_eq!(warn["level"], "WARN");
    assert_eq!(warn["error"], "conflict");
    assert_eq!(warn["kind"], "StatefulSet", "the inner span's field wins");
    assert_eq!(warn["spans"], serde_json::json!(["reconcile", "apply"]));
}
