//! Guardrails decision latency: in-process regorus (cloned warmed engine) vs the real
//! `opa run --server` answering the same decision over REST on loopback, measured in the same
//! run. Also shows what the audit log's fsync policy costs per decision.
//!
//! Run: tests/tools/build-opa && cargo bench -p stateward --bench policy_eval
//! Targets (issue 6): in-process p50 <= 20 µs; >= 10x faster than OPA over REST.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stateward::policy::{
    AuditLog, AuditSink, Bundle, DecisionContext, DecisionPoint, FsyncPolicy, Gate, KindRef, PlanAuthor,
    PlannedAction, PolicyEngine,
};

const OPA_VERSION: &str = "v1.22.4";

/// The operator binary's allocator (host/src/main.rs), so the decision costs what it costs there.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn opa_bin() -> PathBuf {
    if let Ok(p) = std::env::var("STATEWARD_OPA") {
        return PathBuf::from(p);
    }
    let cache = std::env::var("STATEWARD_CACHE").map(PathBuf::from).unwrap_or_else(|_| {
        std::env::var("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache"))
            .join("stateward")
    });
    let p = cache.join("bin").join(format!("opa-{OPA_VERSION}")).join("opa");
    assert!(p.is_file(), "opa binary missing at {}: run tests/tools/build-opa", p.display());
    p
}

fn plugin() -> PlanAuthor {
    PlanAuthor {
        name: "postgres".into(),
        version: "0.1.0".into(),
        digest: format!("sha256:{}", "0".repeat(64)),
        owns: vec![
            KindRef { api_version: "apps/v1".into(), kind: "StatefulSet".into() },
            KindRef { api_version: "v1".into(), kind: "Service".into() },
            KindRef { api_version: "policy/v1".into(), kind: "PodDisruptionBudget".into() },
        ],
    }
}

fn resource() -> Value {
    json!({"apiVersion": "stateward.dev/v1alpha1", "kind": "PostgresCluster", "namespace": "db",
           "name": "main", "generation": 4, "spec": {"replicas": 3, "version": "16"}})
}

/// A realistic StatefulSet as a plugin would emit it.
fn statefulset() -> Value {
    json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
      "metadata": {"name": "main", "namespace": "db", "labels": {"app.kubernetes.io/name": "postgres", "app.kubernetes.io/instance": "main"}},
      "spec": {"replicas": 3, "serviceName": "main",
        "selector": {"matchLabels": {"app.kubernetes.io/instance": "main"}},
        "template": {"metadata": {"labels": {"app.kubernetes.io/instance": "main"}},
          "spec": {"securityContext": {"runAsNonRoot": true, "fsGroup": 999}, "automountServiceAccountToken": false,
            "containers": [{"name": "postgres", "image": "docker.io/library/postgres:16.4",
              "ports": [{"containerPort": 5432, "name": "pg"}],
              "env": [{"name": "PGDATA", "value": "/var/lib/postgresql/data/pgdata"}],
              "securityContext": {"runAsNonRoot": true, "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
              "resources": {"limits": {"cpu": "2", "memory": "2Gi"}, "requests": {"cpu": "500m", "memory": "1Gi"}},
              "volumeMounts": [{"name": "data", "mountPath": "/var/lib/postgresql/data"}]}]}},
        "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}}}]}})
}

fn percentiles(mut ns: Vec<u64>) -> (f64, f64) {
    ns.sort_unstable();
    let at = |q: f64| ns[((ns.len() as f64 - 1.0) * q).round() as usize] as f64 / 1000.0;
    (at(0.50), at(0.99))
}

fn time_n(n: usize, mut f: impl FnMut()) -> Vec<u64> {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_nanos() as u64
        })
        .collect()
}

struct Opa {
    child: Child,
    port: u16,
}

impl Drop for Opa {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_opa(policies: &Path) -> Opa {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new(opa_bin())
        .args(["run", "--server", "--skip-version-check", "--log-level", "error", "--addr"])
        .arg(format!("127.0.0.1:{port}"))
        .arg(policies)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start opa run --server");
    let opa = Opa { child, port };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
            if let Ok((200, _)) = http(&mut s, "GET", "/health", "") {
                return opa;
            }
        }
        assert!(Instant::now() < deadline, "opa server did not become healthy");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Minimal HTTP/1.1 keep-alive client: one request, one response (Content-Length or chunked).
fn http(s: &mut TcpStream, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes())?;
    let mut r = BufReader::new(s.try_clone()?);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status: u16 = line.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let (mut len, mut chunked) = (0usize, false);
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let lower = l.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
        if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
            chunked = true;
        }
    }
    let mut out = Vec::new();
    if chunked {
        loop {
            line.clear();
            r.read_line(&mut line)?;
            let n = usize::from_str_radix(line.trim(), 16).unwrap_or(0);
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk)?;
            if n == 0 {
                break;
            }
            out.extend_from_slice(&chunk[..n]);
        }
    } else {
        out.resize(len, 0);
        r.read_exact(&mut out)?;
    }
    assert!(r.buffer().is_empty(), "unexpected pipelined bytes");
    Ok((status, String::from_utf8_lossy(&out).into_owned()))
}

fn main() {
    let policies = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
    let engine = Arc::new(PolicyEngine::compile(&Bundle::from_dir(&policies).unwrap()).unwrap());
    let action = PlannedAction { verb: "apply".into(), object: statefulset() };
    let input = json!({
        "plugin": {"name": "postgres", "version": "0.1.0", "digest": plugin().digest, "owns": plugin().owns},
        "resource": resource(),
        "action": {"verb": action.verb, "object": action.object},
    });
    let n_local = 20_000;
    let n_rest = 3_000;

    // 1. In-process engine only.
    let ev = engine.evaluate(DecisionPoint::Guardrails, &input);
    assert!(ev.error.is_none() && ev.deny.is_empty(), "benchmark input must be allowed: {ev:?}");
    time_n(2_000, || drop(engine.evaluate(DecisionPoint::Guardrails, &input)));
    let local = percentiles(time_n(n_local, || drop(engine.evaluate(DecisionPoint::Guardrails, &input))));

    // 2. Whole gate (evaluate + enforcement + audit line) per fsync policy.
    let dir = std::env::temp_dir().join(format!("stateward-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ctx = DecisionContext::default();
    let mut gate_rows = Vec::new();
    // Per decision (a plan's time divided by its actions): a plan syncs the audit file once.
    for (label, fsync, n, plan_len) in [
        ("gate + audit file, OS-buffered", FsyncPolicy::OsBuffered, 5_000, 1),
        ("gate + audit file, fdatasync, 1-action plan", FsyncPolicy::PerRecord, 1_000, 1),
        ("gate + audit file, fdatasync, 5-action plan", FsyncPolicy::PerRecord, 400, 5),
    ] {
        let path = dir.join(format!("audit-{}.jsonl", gate_rows.len()));
        let log = AuditLog::open(&AuditSink::File(path.clone()), fsync).unwrap();
        let gate = Gate::new(engine.clone(), Arc::new(log));
        let res = resource();
        let acts = vec![action.clone(); plan_len];
        let t: Vec<u64> = time_n(n, || assert!(gate.check_plan(&ctx, &plugin(), &res, &acts).allowed()))
            .into_iter()
            .map(|ns| ns / plan_len as u64)
            .collect();
        assert!(stateward::policy::audit::verify(&path).unwrap().first_break.is_none());
        gate_rows.push((label, n, percentiles(t)));
    }
    let _ = std::fs::remove_dir_all(&dir);

    // 3. The real OPA server over REST on loopback, same input.
    let opa = start_opa(&policies);
    let mut conn = TcpStream::connect(("127.0.0.1", opa.port)).unwrap();
    conn.set_nodelay(true).unwrap();
    let body = json!({"input": input}).to_string();
    let (status, resp) = http(&mut conn, "POST", "/v1/data/stateward/guardrails", &body).unwrap();
    assert_eq!(status, 200, "{resp}");
    let resp: Value = serde_json::from_str(&resp).unwrap();
    assert_eq!(resp["result"]["deny"], json!([]), "OPA agrees: allowed");
    time_n(300, || drop(http(&mut conn, "POST", "/v1/data/stateward/guardrails", &body).unwrap()));
    let rest = percentiles(time_n(n_rest, || {
        let (s, _) = http(&mut conn, "POST", "/v1/data/stateward/guardrails", &body).unwrap();
        assert_eq!(s, 200);
    }));
    drop(opa);

    println!();
    println!("guardrails decision, one StatefulSet apply action (bundle {})", &engine.digest()[..19]);
    println!("{:<44} {:>7} {:>10} {:>10}", "path", "n", "p50 µs", "p99 µs");
    println!("{}", "-".repeat(74));
    println!("{:<44} {:>7} {:>10.1} {:>10.1}", "in-process regorus (evaluate)", n_local, local.0, local.1);
    for (label, n, (p50, p99)) in &gate_rows {
        println!("{:<44} {:>7} {:>10.1} {:>10.1}", label, n, p50, p99);
    }
    println!(
        "{:<44} {:>7} {:>10.1} {:>10.1}",
        format!("opa {OPA_VERSION} run --server, REST loopback"),
        n_rest,
        rest.0,
        rest.1
    );
    println!("{}", "-".repeat(74));
    let ratio50 = rest.0 / local.0;
    let ratio99 = rest.1 / local.1;
    println!("OPA REST / in-process: p50 {ratio50:.1}x, p99 {ratio99:.1}x");
    println!(
        "targets: in-process p50 <= 20 µs: {} ({:.1} µs); >= 10x faster than OPA REST: {} ({ratio50:.1}x)",
        if local.0 <= 20.0 { "MET" } else { "MISSED" },
        local.0,
        if ratio50 >= 10.0 { "MET" } else { "MISSED" },
    );
}
