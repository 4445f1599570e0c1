//! A flood of the webhook port (issue 19, finding 6) against an operator on the local
//! cluster: for 30 s, 1,000 slow connections (a TLS handshake trickled one byte every 2 s,
//! reopened whenever closed) plus 200 admission reviews a second, sent straight to the port by
//! a low-priority thread of this process from loopback addresses of its own (127.0.0.2 and
//! 127.0.0.3), so the API server is not what saturates. Meanwhile a legitimate admission through the API server must
//! be answered within the API server's timeout (10 s), the reconciles of other resources keep
//! their latency (p99 within 2× of the quiet baseline measured first, in the same run), and the
//! operator's RSS stays bounded. The figures are printed. It runs here, alone, rather than
//! beside the live tests, whose own timings the flood would disturb.

#![allow(clippy::expect_used)]

use crate::e2e;
use crate::webhook_env::{dry_run, object, pg_api, wait_webhook_ready, webhook_operator, VwcGuard};

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use e2e::{Teardown, POSTGRES, REDIS};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::DeleteParams;
use kube::Api;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::json;
use stateward_testkit::TestEnv;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const FLOOD: Duration = Duration::from_secs(30);
const SLOW_CONNECTIONS: usize = 1000;
const REVIEWS_PER_SECOND: u64 = 200;
/// Reviews in flight at once (each on a connection of its own); one more is counted failed.
const REVIEWS_IN_FLIGHT: usize = 200;
/// The flood's own source addresses, one for the slow connections and one for the reviews (two
/// peers): the API server calls the webhook from 127.0.0.1.
const SLOW_SOURCE: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
const REVIEW_SOURCE: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));
const INSTANCES: usize = 4;

/// The soft limit on open files of this process.
fn open_files_limit() -> anyhow::Result<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits")?;
    let line = limits.lines().find(|l| l.starts_with("Max open files")).context("no open files limit")?;
    let soft = line.split_whitespace().nth(3).context("unreadable limit")?;
    Ok(if soft == "unlimited" { u64::MAX } else { soft.parse()? })
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

fn percentile(mut samples: Vec<Duration>, p: f64) -> Duration {
    samples.sort();
    samples.get(((samples.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or_default()
}

/// Deletes instance `i`'s ConfigMap child and waits for the operator to put it back: one
/// reconcile of a resource the flood does not touch (no admission on this path).
async fn recreation(cms: &Api<ConfigMap>, i: usize) -> anyhow::Result<Duration> {
    let name = format!("flood-{i}-config");
    let old = cms.get(&name).await?.metadata.uid;
    let started = Instant::now();
    cms.delete(&name, &DeleteParams::default()).await?;
    loop {
        if let Some(cm) = cms.get_opt(&name).await? {
            if cm.metadata.uid != old {
                return Ok(started.elapsed());
            }
        }
        ensure!(started.elapsed() < Duration::from_secs(60), "{name} not recreated within 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What the flood did, counted by its own thread.
#[derive(Default)]
struct FloodCounts {
    slow_opened: AtomicUsize,
    slow_closed: AtomicUsize,
    reviews_sent: AtomicUsize,
    reviews_ok: AtomicUsize,
    reviews_503: AtomicUsize,
    reviews_failed: AtomicUsize,
}

async fn connect_from(source: IpAddr, port: u16) -> std::io::Result<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source, 0))?;
    socket.connect(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)).await
}

/// One slow client: opens a connection and trickles a TLS record header one byte every 2 s;
/// whenever the server closes it, opens another 50 ms later.
async fn slow_client(port: u16, until: Instant, counts: Arc<FloodCounts>) {
    const HELLO: &[u8] = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03";
    while Instant::now() < until {
        let Ok(mut tcp) = connect_from(SLOW_SOURCE, port).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        counts.slow_opened.fetch_add(1, Ordering::Relaxed);
        let mut sent = 0;
        while Instant::now() < until {
            let byte = [HELLO[sent % HELLO.len()]];
            let mut probe = [0u8; 1];
            let alive = tcp.write_all(&byte).await.is_ok()
                && !matches!(
                    tokio::time::timeout(Duration::from_secs(2), tcp.read(&mut probe)).await,
                    Ok(Ok(0) | Err(_))
                );
            if !alive {
                counts.slow_closed.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
                break;
            }
            sent += 1;
        }
    }
}

/// Sends admission reviews at `per_second`, open loop (whether or not earlier ones were
/// answered), each on a connection of its own; at most `at_once` are in flight.
async fn reviews(
    port: u16,
    tls: tokio_rustls::TlsConnector,
    body: Arc<String>,
    per_second: u64,
    until: Instant,
    counts: Arc<FloodCounts>,
) {
    let request = Arc::new(format!(
        "POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{}",
        body.len(),
        body
    ));
    let in_flight = Arc::new(tokio::sync::Semaphore::new(REVIEWS_IN_FLIGHT));
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / per_second.max(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    while Instant::now() < until {
        tick.tick().await;
        counts.reviews_sent.fetch_add(1, Ordering::Relaxed);
        let Ok(permit) = Arc::clone(&in_flight).try_acquire_owned() else {
            counts.reviews_failed.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let (tls, request, counts) = (tls.clone(), Arc::clone(&request), Arc::clone(&counts));
        tokio::spawn(async move {
            let _permit = permit;
            let status = tokio::time::timeout(Duration::from_secs(10), async {
                let tcp = connect_from(REVIEW_SOURCE, port).await.ok()?;
                let name = ServerName::IpAddress(Ipv4Addr::LOCALHOST.into());
                let mut conn = tls.connect(name, tcp).await.ok()?;
                conn.write_all(request.as_bytes()).await.ok()?;
                read_response(&mut conn).await
            })
            .await
            .ok()
            .flatten();
            match status {
                Some(200) => counts.reviews_ok.fetch_add(1, Ordering::Relaxed),
                Some(503) => counts.reviews_503.fetch_add(1, Ordering::Relaxed),
                _ => counts.reviews_failed.fetch_add(1, Ordering::Relaxed),
            };
        });
    }
}

/// Reads one HTTP/1.1 response with a Content-Length body; its status.
async fn read_response<S: tokio::io::AsyncRead + Unpin>(conn: &mut S) -> Option<u16> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 16 * 1024 || conn.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    conn.read_exact(&mut body).await.ok()?;
    Some(status)
}

/// Runs the flood on a thread of its own at a lowest priority (nice 19, like a batch job
/// on the same machine), so that it competes with the operator without starving the test's
/// own measurements.
fn spawn_flood(
    port: u16,
    ca_pem: String,
    body: String,
    counts: Arc<FloodCounts>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        if let Ok(me) = std::fs::read_link("/proc/thread-self") {
            if let Some(tid) = me.file_name().and_then(|t| t.to_str()) {
                let _ = std::process::Command::new("renice").args(["-n", "19", "-p", tid]).output();
            }
        }
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(async move {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()).flatten() {
                let _ = roots.add(cert);
            }
            let config = rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
            let tls = tokio_rustls::TlsConnector::from(Arc::new(config));
            let until = Instant::now() + FLOOD;
            let body = Arc::new(body);
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..SLOW_CONNECTIONS {
                tasks.spawn(slow_client(port, until, Arc::clone(&counts)));
            }
            tasks.spawn(reviews(port, tls, body, REVIEWS_PER_SECOND, until, Arc::clone(&counts)));
            // Every task checks the deadline at least every 2 s; abort stragglers after that.
            let _ = tokio::time::timeout(FLOOD + Duration::from_secs(5), async {
                while tasks.join_next().await.is_some() {}
            })
            .await;
        });
    })
}

/// An AdmissionReview as the API server sends it for creating a PostgresCluster.
fn review(namespace: &str) -> String {
    let mut object = POSTGRES.manifest("flood", 3, "Retain");
    object["metadata"]["namespace"] = json!(namespace);
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "00000000-0000-0000-0000-000000000000",
        "kind": {"group": "stateward.dev", "version": "v1", "kind": "PostgresCluster"},
        "resource": {"group": "stateward.dev", "version": "v1", "resource": "postgresclusters"},
        "operation": "CREATE", "namespace": namespace, "name": "flood",
        "userInfo": {"username": "flood", "groups": ["system:authenticated"]},
        "object": object, "dryRun": true}})
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_flood_leaves_admission_and_reconciles_their_latency() -> anyhow::Result<()> {
    // Alone: the flood loads the whole machine, and the live tests' timings would pay for it.
    let _alone = crate::alone().await;
    // 1,000 slow sockets, the reviews in flight, and what the test itself holds open.
    let needed = (SLOW_CONNECTIONS + REVIEWS_IN_FLIGHT + 256) as u64;
    let limit = open_files_limit()?;
    ensure!(
        limit >= needed,
        "this process may open {limit} files; the flood needs {needed} (raise ulimit -n)"
    );

    let env = TestEnv::new("wh-flood").await?;
    let _teardown = Teardown::new(&env);
    let _vwc = VwcGuard::new(&env);
    let port = e2e::free_port();
    let mut op = webhook_operator(&env, "wh-flood", port, &[]);
    wait_webhook_ready(&env, &mut op).await?;
    let pid = op.pid().context("operator pid")?;

    // The other resources: Redis instances whose reconciles are measured.
    let redis = REDIS.api(&env);
    for i in 0..INSTANCES {
        redis
            .create(&Default::default(), &object(&REDIS.manifest(&format!("flood-{i}"), 1, "Retain")))
            .await?;
    }
    let cms: Api<ConfigMap> = env.api();
    let started = Instant::now();
    for i in 0..INSTANCES {
        while cms.get_opt(&format!("flood-{i}-config")).await?.is_none() {
            ensure!(started.elapsed() < Duration::from_secs(90), "flood-{i} never got its ConfigMap");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // Quiet baseline, same run, over a third of the flood's time.
    let mut quiet = Vec::new();
    let quiet_started = Instant::now();
    while quiet_started.elapsed() < FLOOD / 3 {
        quiet.push(recreation(&cms, quiet.len() % INSTANCES).await?);
    }
    let rss_before = rss_mib(pid);

    let secrets: Api<Secret> = env.api();
    let tls_secret = secrets.get("stateward-webhook-tls").await?;
    let ca = tls_secret
        .data
        .as_ref()
        .and_then(|d| d.get("ca.crt"))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .context("no ca.crt")?;
    let counts = Arc::new(FloodCounts::default());
    let flood_started = Instant::now();
    let flood = spawn_flood(port, ca, review(&env.namespace), Arc::clone(&counts));

    // During the flood: reconciles measured continuously, RSS sampled, and legitimate
    // admissions at 5 s and then after gaps longer than the webhook's idle timeout (10 s),
    // so the API server must open new connections while the flood holds the port.
    let stop = Arc::new(AtomicBool::new(false));
    let rss_max = Arc::new(Mutex::new(rss_before));
    let sampler = {
        let (stop, rss_max) = (Arc::clone(&stop), Arc::clone(&rss_max));
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let now = rss_mib(pid);
                {
                    let mut max = rss_max.lock().unwrap_or_else(|p| p.into_inner());
                    *max = max.max(now);
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };
    let admissions = {
        let api = pg_api(&env);
        tokio::spawn(async move {
            let mut answered = Vec::new();
            for (n, at) in [5u64, 17, 29].into_iter().enumerate() {
                tokio::time::sleep_until((flood_started + Duration::from_secs(at)).into()).await;
                let probe = object(&POSTGRES.manifest(&format!("legit-{n}"), 3, "Retain"));
                let sent = Instant::now();
                let result = api.create(&dry_run(), &probe).await.map(drop).map_err(|e| e.to_string());
                answered.push((sent.elapsed(), result));
            }
            answered
        })
    };
    let mut during = Vec::new();
    let mut n = 0;
    while flood_started.elapsed() < FLOOD {
        during.push(recreation(&cms, n % INSTANCES).await?);
        n += 1;
    }
    let admissions = admissions.await?;
    stop.store(true, Ordering::Relaxed);
    sampler.await?;
    tokio::task::spawn_blocking(move || flood.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the flood panicked"))?;
    let rss_max = *rss_max.lock().unwrap_or_else(|p| p.into_inner());

    let (quiet_p99, flood_p99) = (percentile(quiet.clone(), 0.99), percentile(during.clone(), 0.99));
    let (quiet_p50, flood_p50) = (percentile(quiet.clone(), 0.5), percentile(during.clone(), 0.5));
    let c = |a: &AtomicUsize| a.load(Ordering::Relaxed);
    eprintln!(
        "flood {FLOOD:?}: slow connections opened {} (closed by the server {}), reviews sent {} \
         ({:.0}/s): 200 {}, 503 {}, failed {}",
        c(&counts.slow_opened),
        c(&counts.slow_closed),
        c(&counts.reviews_sent),
        c(&counts.reviews_sent) as f64 / FLOOD.as_secs_f64(),
        c(&counts.reviews_ok),
        c(&counts.reviews_503),
        c(&counts.reviews_failed),
    );
    eprintln!(
        "reconcile (child recreation): quiet p50 {quiet_p50:?} p99 {quiet_p99:?} ({} samples), flood p50 {flood_p50:?} p99 {flood_p99:?} ({} samples)",
        quiet.len(),
        during.len()
    );
    eprintln!("legitimate admissions through the API server: {admissions:?}");
    eprintln!("operator RSS: {rss_before:.0} MiB before, {rss_max:.0} MiB at most during the flood");

    ensure!(c(&counts.slow_opened) >= SLOW_CONNECTIONS, "the flood did not open its connections");
    ensure!(
        c(&counts.reviews_sent) as f64 >= 0.5 * (REVIEWS_PER_SECOND as f64) * FLOOD.as_secs_f64(),
        "the flood sent too few reviews to mean anything"
    );
    for (took, result) in &admissions {
        if let Err(e) = result {
            bail!("a legitimate admission failed during the flood after {took:?}: {e}\n{}", op.log_tail(20));
        }
        ensure!(*took < Duration::from_secs(10), "a legitimate admission took {took:?}");
    }
    // The target: 2× the quiet p99, plus the polling step of the measurement (20 ms) and
    // scheduling noise; a figure. The ceiling is liveness: reconciles go on during the flood.
    stateward_testkit::report::figure(
        "webhook_flood.reconcile_p99_over_quiet",
        flood_p99.as_secs_f64() / quiet_p99.as_secs_f64().max(0.001),
        "x",
        stateward_testkit::report::Target::AtMost(2.0),
    );
    ensure!(
        flood_p99 <= quiet_p99 * 6 + Duration::from_secs(1),
        "reconcile p99 {flood_p99:?} during the flood, {quiet_p99:?} before"
    );
    ensure!(rss_max <= rss_before + 256.0, "operator RSS grew from {rss_before:.0} to {rss_max:.0} MiB");
    ensure!(op.exited().is_none(), "the operator exited during the flood");
    Ok(())
}
