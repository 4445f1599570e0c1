//! Each managed instance has a CA of its own ([hardening-2] item 1): what one instance's
//! Secrets hold is trusted by that instance alone, checked with real clients and servers
//! (PostgreSQL's `psql`, `redis-cli` and `redis-server` from Debian's packages, on loopback,
//! with the certificates the keeper issued on the local cluster). And a cluster whose
//! certificate an earlier release issued from the CA it shared between every cluster moves to
//! its own CA in three rolls, trusting both in the middle one.
//!
//! Run: `cargo test -p stateward --test kwok -- service_ca:: --nocapture`.
#![allow(clippy::expect_used)]

use crate::e2e;
use crate::webhook_env::{wait_webhook_ready, webhook_operator, VwcGuard};
use crate::webhooks::{expected_stamp, secret_text as text, verifies_for};

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{ensure, Context as _};
use e2e::{Teardown, ELASTICSEARCH, POSTGRES};
use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::Api;
use serde_json::json;
use stateward::controller::service_certs::{self, ISSUED_UNDER_BOTH, MIGRATION_ANNOTATION, TRUSTING_BOTH};
use stateward::webhook::certs::{self, CertPolicy};
use stateward_testkit::servers::{as_postgres, free_port, is_root, postgres_bin, Server};
use stateward_testkit::TestEnv;

/// Waits until the keeper has issued `instance`'s certificate from the instance's own CA;
/// returns (certificate Secret, CA certificate PEM).
async fn issued(secrets: &Api<Secret>, instance: &str) -> (Secret, String) {
    let (found, took) =
        e2e::wait_for(&format!("{instance}-tls issued by its own CA"), Duration::from_secs(90), || async {
            let get = |name: String| async move {
                secrets.get_opt(&name).await.map_err(|e| e.to_string())?.ok_or(format!("no {name} yet"))
            };
            let tls = get(format!("{instance}-tls")).await?;
            let ca = text(&get(service_certs::instance_ca_name(instance)).await?, "ca.crt");
            let on_it = text(&tls, "ca.crt") == ca && text(&tls, "tls.crt").starts_with("-----BEGIN");
            on_it.then_some((tls, ca)).ok_or_else(|| "not yet".to_string())
        })
        .await;
    eprintln!("service_ca: {instance}-tls issued from {instance}'s CA {took:.1?} into the wait");
    found
}

/// The three keys of a certificate Secret as files in `dir` (the key readable by its owner only).
fn write_keys(secret: &Secret, dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::create_dir_all(dir)?;
    for key in ["tls.crt", "tls.key", "ca.crt"] {
        std::fs::write(dir.join(key), text(secret, key))?;
    }
    std::fs::set_permissions(dir.join("tls.key"), std::fs::Permissions::from_mode(0o600))?;
    Ok(())
}

fn said(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
        .trim()
        .to_string()
}

/// `redis-cli --tls ... ping` against 127.0.0.1:`port`, trusting `ca` (and presenting `client`'s
/// certificate when given).
fn redis_ping(port: u16, ca: &Path, client: Option<&Path>) -> Output {
    let mut cli = Command::new("redis-cli");
    cli.args(["--tls", "--cacert"]).arg(ca.join("ca.crt"));
    if let Some(dir) = client {
        cli.arg("--cert").arg(dir.join("tls.crt")).arg("--key").arg(dir.join("tls.key"));
    }
    cli.args(["-h", "127.0.0.1", "-p", &port.to_string(), "ping"])
        .output()
        .expect("redis-cli (run scripts/setup)")
}

/// A Redis server on 127.0.0.1 presenting `server`'s certificate over TLS and trusting its CA
/// for client certificates (optional ones, as the Redis plugin renders it).
fn redis_server(server: &Path, scratch: &Path) -> anyhow::Result<(Server, u16)> {
    let port = free_port();
    let child = Command::new("redis-server")
        .args(["--port", "0", "--bind", "127.0.0.1", "--tls-port", &port.to_string()])
        .arg("--tls-cert-file")
        .arg(server.join("tls.crt"))
        .arg("--tls-key-file")
        .arg(server.join("tls.key"))
        .arg("--tls-ca-cert-file")
        .arg(server.join("ca.crt"))
        .args(["--tls-auth-clients", "optional", "--save", "", "--appendonly", "no", "--dir"])
        .arg(scratch)
        .stdout(Stdio::null())
        .spawn()
        .context("redis-server (run scripts/setup)")?;
    Ok((Server(child), port))
}

async fn wait_pong(port: u16, ca: &Path) {
    e2e::wait_for("redis-server answering over TLS", Duration::from_secs(20), || async {
        let out = redis_ping(port, ca, None);
        (said(&out) == "PONG").then_some(()).ok_or_else(|| said(&out))
    })
    .await;
}

/// `psql` over TLS to 127.0.0.1:`port` as to the server named `host`, with `sslmode` and the
/// root certificates of `ca`.
fn psql(port: u16, host: &str, sslmode: &str, ca: &Path) -> Output {
    let conninfo = format!(
        "host={host} hostaddr=127.0.0.1 port={port} user=postgres dbname=postgres sslmode={sslmode} sslrootcert={}",
        ca.join("ca.crt").display()
    );
    Command::new(postgres_bin("psql")).args([conninfo.as_str(), "-Atc", "select 1"]).output().expect("psql")
}

/// A PostgreSQL server on 127.0.0.1 serving TLS with `server`'s certificate.
async fn postgres_server(server: &Path, scratch: &Path) -> anyhow::Result<(Server, u16)> {
    if is_root() {
        let status = Command::new("chown").args(["-R", "postgres:postgres"]).arg(scratch).status()?;
        ensure!(status.success(), "chown of {}", scratch.display());
    }
    let data = scratch.join("data");
    let out = as_postgres(&postgres_bin("initdb"))
        .args(["-A", "trust", "-U", "postgres", "-D"])
        .arg(&data)
        .output()?;
    ensure!(out.status.success(), "initdb: {}", said(&out));
    let port = free_port();
    let child = as_postgres(&postgres_bin("postgres"))
        .arg("-D")
        .arg(&data)
        .args(["-c", "listen_addresses=127.0.0.1", "-c", &format!("port={port}"), "-c", "ssl=on", "-k"])
        .arg(scratch)
        .arg("-c")
        .arg(format!("ssl_cert_file={}", server.join("tls.crt").display()))
        .arg("-c")
        .arg(format!("ssl_key_file={}", server.join("tls.key").display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let server = Server(child);
    e2e::wait_for("postgres accepting connections", Duration::from_secs(30), || async {
        let out = Command::new(postgres_bin("psql"))
            .args(["host=127.0.0.1 user=postgres dbname=postgres sslmode=disable", "-p", &port.to_string()])
            .args(["-Atc", "select 1"])
            .output()
            .map_err(|e| e.to_string())?;
        out.status.success().then_some(()).ok_or_else(|| said(&out))
    })
    .await;
    Ok((server, port))
}

fn scratch(name: &str) -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("stateward-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Instance `a` (an ElasticsearchCluster: its members authenticate to each other, so its
/// certificate is also a client certificate) and instance `b` (a PostgresCluster) of one
/// namespace, each with its own CA. With `b`'s CA, `psql` (verify-ca and verify-full) and
/// `redis-cli` refuse a server presenting `a`'s certificate; a Redis server of `b` refuses `a`'s
/// certificate as a client's; and `b`'s certificate, a server's, is no client certificate.
/// With one CA for every cluster, as before, verify-ca and redis-cli accepted `a`'s server and
/// Redis accepted `a`'s client certificate.
#[tokio::test]
async fn one_instances_certificate_is_refused_by_anothers_clients_and_servers() -> anyhow::Result<()> {
    let env = TestEnv::new("svc-ca-iso").await?;
    let _teardown = Teardown::new(&env);
    let _vwc = VwcGuard::new(&env);
    let port = e2e::free_port();
    let mut op = webhook_operator(&env, "svc-ca-iso", port, &[]);
    wait_webhook_ready(&env, &mut op).await?;
    e2e::apply(&env, &env.namespace, &ELASTICSEARCH.manifest("a", 3, "Retain"));
    e2e::apply(&env, &env.namespace, &POSTGRES.manifest("b", 1, "Retain"));
    let secrets: Api<Secret> = env.api();
    let ((a, a_ca), (b, b_ca)) = (issued(&secrets, "a").await, issued(&secrets, "b").await);
    ensure!(a_ca != b_ca, "the two instances share a CA");
    let dir = scratch("svc-ca-iso")?;
    let (a_dir, b_dir) = (dir.join("a"), dir.join("b"));
    write_keys(&a, &a_dir)?;
    write_keys(&b, &b_dir)?;
    let (a_name, b_name) = (sans_first(&a), sans_first(&b));
    ensure!(b_name.ends_with(&format!(".{}.svc", env.namespace)), "b's names: {b_name}");

    // Redis presenting a's certificate: a's CA accepts it, b's refuses it.
    let (_redis_a, a_port) = redis_server(&a_dir, &dir)?;
    wait_pong(a_port, &a_dir).await;
    let out = redis_ping(a_port, &b_dir, None);
    ensure!(said(&out) != "PONG", "redis-cli trusting b's CA accepted a server with a's certificate");
    eprintln!("service_ca: redis-cli trusting b's CA, a's server: {}", said(&out));

    // Redis of b: a's certificate is refused as a client's; none at all is fine (optional).
    let (_redis_b, b_port) = redis_server(&b_dir, &dir)?;
    wait_pong(b_port, &b_dir).await;
    let out = redis_ping(b_port, &b_dir, Some(&a_dir));
    ensure!(said(&out) != "PONG", "b's Redis accepted a's certificate from a client");
    eprintln!("service_ca: b's Redis, a's client certificate: {}", said(&out));
    let out = redis_ping(b_port, &b_dir, Some(&b_dir));
    ensure!(said(&out) != "PONG", "b's server certificate authenticated a client");

    // PostgreSQL presenting a's certificate: refused by b's clients, verify-ca and verify-full.
    let pg_dir = dir.join("pg");
    std::fs::create_dir_all(&pg_dir)?;
    let pg_keys = pg_dir.join("a");
    write_keys(&a, &pg_keys)?;
    let (_postgres, pg_port) = postgres_server(&pg_keys, &pg_dir).await?;
    let out = psql(pg_port, &a_name, "verify-full", &a_dir);
    ensure!(out.status.success(), "a's own client refused a's server as {a_name}: {}", said(&out));
    for mode in ["verify-ca", "verify-full"] {
        let out = psql(pg_port, &b_name, mode, &b_dir);
        ensure!(!out.status.success(), "psql {mode} trusting b's CA accepted a's server as {b_name}");
        ensure!(said(&out).contains("certificate verify failed"), "psql {mode}: {}", said(&out));
    }
    eprintln!("service_ca: psql verify-ca and verify-full trusting b's CA refused a's server");
    drop(op);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// One version of the certificate Secret as the watch saw it: who issued its certificate, whom
/// it trusts, and its step.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    issued_by: &'static str,
    trusts: &'static str,
    migration: String,
    /// The pod-template stamp of what it holds.
    stamp: String,
}

/// A cluster whose certificate Secret the shared CA of earlier releases issued (written over
/// the one the keeper made, as an upgrade finds it) moves to its own CA: first it trusts both
/// (certificate unchanged), then presents its own CA's certificate (trusting both), then trusts
/// its own alone, each step once the StatefulSet has rolled; at the end a certificate of the
/// shared CA is refused.
#[tokio::test]
async fn a_certificate_of_the_shared_ca_moves_to_its_instances_ca_trusting_both_in_between(
) -> anyhow::Result<()> {
    let env = TestEnv::new("svc-ca-move").await?;
    let _teardown = Teardown::new(&env);
    let _vwc = VwcGuard::new(&env);
    let policy = CertPolicy::default();
    let shared = certs::issue_ca(&policy, certs::SERVICE_CA_COMMON_NAME)?;
    let secrets: Api<Secret> = env.api();
    let mut legacy = shared.ca_into_secret(Secret::default());
    legacy.metadata.name = Some(service_certs::LEGACY_CA_SECRET.to_string());
    secrets.create(&PostParams::default(), &legacy).await?;
    let port = e2e::free_port();
    let mut op = webhook_operator(&env, "svc-ca-move", port, &[]);
    wait_webhook_ready(&env, &mut op).await?;
    let name = "moved";
    e2e::apply(&env, &env.namespace, &POSTGRES.manifest(name, 2, "Retain"));
    let (tls, own) = issued(&secrets, name).await;
    ensure!(own != shared.ca_pem, "a new cluster was issued from the shared CA");
    let sans: Vec<String> = tls
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(certs::CERT_SANS))
        .map(|n| n.split(',').map(str::to_string).collect())
        .unwrap_or_default();
    e2e::wait_running(&env, POSTGRES, name, 2, Duration::from_secs(120)).await;

    // Every version of the Secret from here on.
    let tls_name = format!("{name}-tls");
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let watch = {
        let (seen, shared_pem, own) = (Arc::clone(&seen), shared.ca_pem.clone(), own.clone());
        let tls_watched = tls_name.clone();
        let config = watcher::Config::default().fields(&format!("metadata.name={tls_name}"));
        let stream = watcher::watcher(secrets.clone(), config);
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s)) = event else { continue };
                let (crt, ca) = (text(&s, "tls.crt"), text(&s, "ca.crt"));
                let issued_by = if verifies_for(&crt, &own, &sans_first(&s)) {
                    "own"
                } else if verifies_for(&crt, &shared_pem, &sans_first(&s)) {
                    "shared"
                } else {
                    "other"
                };
                let trusts = match (ca.contains(own.trim()), ca.contains(shared_pem.trim())) {
                    (true, true) => "both",
                    (true, false) => "own",
                    (false, true) => "shared",
                    (false, false) => "other",
                };
                let migration = s
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(MIGRATION_ANNOTATION))
                    .cloned()
                    .unwrap_or_default();
                let stamp = expected_stamp(&tls_watched, &crt, &ca);
                let now = Seen { issued_by, trusts, migration, stamp };
                let mut seen = seen.lock().expect("seen");
                if seen.last() != Some(&now) {
                    seen.push(now);
                }
            }
        })
    };

    // The stamps the StatefulSet carried once all its pods ran them.
    let rolled: Arc<Mutex<Vec<String>>> = Arc::default();
    let set_watch = {
        let rolled = Arc::clone(&rolled);
        let sets: Api<StatefulSet> = env.api();
        let stream =
            watcher::watcher(sets, watcher::Config::default().fields(&format!("metadata.name={name}")));
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let Ok(watcher::Event::Apply(set) | watcher::Event::InitApply(set)) = event else { continue };
                let status = set.status.clone().unwrap_or_default();
                let replicas = set.spec.as_ref().and_then(|s| s.replicas);
                let done = status.observed_generation == set.metadata.generation
                    && Some(status.updated_replicas.unwrap_or(0)) == replicas
                    && Some(status.ready_replicas.unwrap_or(0)) == replicas;
                let stamp = set
                    .spec
                    .as_ref()
                    .and_then(|s| s.template.metadata.as_ref())
                    .and_then(|m| m.annotations.as_ref())
                    .and_then(|a| a.get(service_certs::POD_ANNOTATION))
                    .cloned();
                if let (true, Some(stamp)) = (done, stamp) {
                    let mut rolled = rolled.lock().expect("rolled");
                    if rolled.last() != Some(&stamp) {
                        rolled.push(stamp);
                    }
                }
            }
        })
    };

    // As an earlier release left it: a certificate of the shared CA, trusting it alone.
    let (data, annotations) = service_certs::issue(&shared, &sans, &policy, false)?;
    let patch = json!({"metadata": {"annotations": annotations}, "stringData": data});
    secrets.patch(&tls_name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    let (done, took) = e2e::wait_for("the move to the instance's CA", Duration::from_secs(300), || async {
        let steps = seen.lock().expect("seen").clone();
        let last = steps.last().cloned();
        (last.as_ref().is_some_and(|l| l.trusts == "own" && l.issued_by == "own" && l.migration.is_empty())
            && steps.iter().any(|s| s.migration == ISSUED_UNDER_BOTH))
        .then_some(steps.clone())
        .ok_or_else(|| format!("{steps:?}"))
    })
    .await;
    watch.abort();
    // Each step rolled the pods: every state the Secret took on the way ran on all of them.
    e2e::wait_running(&env, POSTGRES, name, 2, Duration::from_secs(120)).await;
    let (_, _) = e2e::wait_for("the last step rolled out", Duration::from_secs(60), || async {
        let rolled = rolled.lock().expect("rolled").clone();
        done.iter()
            .skip_while(|s| s.issued_by != "shared")
            .skip(1)
            .all(|s| rolled.contains(&s.stamp))
            .then_some(())
            .ok_or_else(|| format!("rolled out: {rolled:?}; the Secret's states: {done:?}"))
    })
    .await;
    set_watch.abort();
    eprintln!("service_ca: moved to the instance's CA {took:.1?} after the shared CA's certificate was written: {done:?}");
    let from_shared = done.iter().position(|s| s.issued_by == "shared" && s.trusts == "shared");
    let steps: Vec<(&str, &str, &str)> = done
        .iter()
        .skip(from_shared.context("the shared CA's certificate was never seen")?)
        .map(|s| (s.issued_by, s.trusts, s.migration.as_str()))
        .collect();
    ensure!(
        steps
            == [
                ("shared", "shared", ""),
                ("shared", "both", TRUSTING_BOTH),
                ("own", "both", ISSUED_UNDER_BOTH),
                ("own", "own", ""),
            ],
        "the steps: {steps:?}"
    );
    // The pods run what the Secret holds now, and a certificate of the shared CA is refused.
    let tls = secrets.get(&tls_name).await?;
    let leftover = service_certs::issue(&shared, &sans, &policy, false)?.0;
    ensure!(
        !verifies_for(&leftover["tls.crt"], &text(&tls, "ca.crt"), &sans_first(&tls)),
        "the shared CA still trusted"
    );
    e2e::wait_running(&env, POSTGRES, name, 2, Duration::from_secs(120)).await;
    drop(op);
    Ok(())
}

/// The first non-wildcard name a certificate Secret's certificate carries.
fn sans_first(secret: &Secret) -> String {
    secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(certs::CERT_SANS))
        .and_then(|n| n.split(',').find(|n| !n.starts_with('*')).map(str::to_string))
        .unwrap_or_default()
}
