//! The server configs the plugins generate, run by real servers: PostgreSQL and Redis from
//! Debian's packages (installed by scripts/setup) start with them on loopback and report the
//! values the spec asked for. Elasticsearch has no Debian package; its config is only checked
//! by the plugin's own tests.

#![allow(clippy::panic, clippy::unwrap_used)]

mod support;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use stateward::render::{parse_documents, render};
use stateward::runtime::{Action, Registry};
use support::{load, sandbox, workspace_root};

fn config_from_sample(plugin: &str, key: &str) -> String {
    let mut registry = Registry::default();
    registry.insert(std::sync::Arc::new(load(&sandbox(), &format!("stateward-{plugin}"))));
    let path = workspace_root().join(format!("deploy/samples/{plugin}.yaml"));
    let sample = parse_documents(&std::fs::read_to_string(path).unwrap(), "sample").unwrap().remove(0);
    let rendered = render(&registry, sample, &[], 0).expect("render");
    rendered
        .plan
        .actions
        .iter()
        .find_map(|a| match a {
            Action::Apply { object } if object["kind"] == "ConfigMap" => object["data"][key].as_str().map(String::from),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{plugin}: no ConfigMap with {key}"))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("stateward-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Kills the server when the test ends, however it ends.
struct Server(Child);
impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| o.stdout.starts_with(b"0\n")).unwrap_or(false)
}

/// PostgreSQL refuses to run as root: in CI (root) run it as the package's `postgres` user.
fn as_postgres(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn postgres_bin(name: &str) -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin").join(name))
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    found.pop().unwrap_or_else(|| panic!("PostgreSQL's {name} not found under /usr/lib/postgresql: run scripts/setup"))
}

/// Where the pods mount the server certificate the host issues (the sdk's TLS_DIR).
const TLS_DIR: &str = "/etc/stateward-tls";

/// A certificate for 127.0.0.1 from a fresh CA, written as the Secret's three keys into
/// `dir/tls`, which stands in for the mount; returns that directory.
fn certificate_files(dir: &Path) -> PathBuf {
    let cert = stateward_testkit::LoopbackCert::generate().unwrap();
    let tls = dir.join("tls");
    std::fs::create_dir_all(&tls).unwrap();
    for (name, pem) in [("tls.crt", &cert.cert_pem), ("tls.key", &cert.key_pem), ("ca.crt", &cert.ca_pem)] {
        std::fs::write(tls.join(name), pem).unwrap();
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(tls.join("tls.key"), std::fs::Permissions::from_mode(0o600)).unwrap();
    tls
}

fn wait_until(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ready() {
        assert!(started.elapsed() < limit, "{what} not ready within {limit:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn generated_postgresql_conf_runs_in_a_real_postgres() {
    let conf = config_from_sample("postgres", "postgresql.conf");
    let dir = scratch("pg");
    assert!(conf.contains("ssl = on"), "postgresql.conf must serve TLS");
    let tls = certificate_files(&dir);
    let conf = conf.replace(TLS_DIR, &tls.display().to_string());
    if is_root() {
        assert!(Command::new("chown").args(["-R", "postgres:postgres"]).arg(&dir).status().unwrap().success());
    }
    let data = dir.join("data");
    let out = as_postgres(&postgres_bin("initdb"))
        .args(["-A", "trust", "-U", "postgres", "-D"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(out.status.success(), "initdb: {}", String::from_utf8_lossy(&out.stderr));
    // The generated file replaces initdb's, exactly as the pod mounts it.
    std::fs::write(data.join("postgresql.conf"), &conf).unwrap();
    let port = free_port().to_string();
    let _server = Server(
        as_postgres(&postgres_bin("postgres"))
            .arg("-D")
            .arg(&data)
            .args(["-c", "listen_addresses=127.0.0.1", "-c", &format!("port={port}"), "-k"])
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let psql = |sql: &str| {
        Command::new(postgres_bin("psql"))
            .args(["-h", "127.0.0.1", "-p", &port, "-U", "postgres", "-At", "-c", sql])
            .output()
            .unwrap()
    };
    wait_until("postgres", Duration::from_secs(30), || psql("select 1").status.success());
    let show = |name: &str| String::from_utf8_lossy(&psql(&format!("show {name}")).stdout).trim().to_string();
    // From spec.parameters of the sample, and from the plugin's defaults.
    assert_eq!(show("max_connections"), "50");
    assert_eq!(show("shared_buffers"), "32MB");
    assert_eq!(show("wal_level"), "replica");
    assert_eq!(show("password_encryption"), "scram-sha-256");
    assert_eq!(show("ssl"), "on");
    // A client that insists on TLS and checks the server against the CA gets in over TLS.
    let conninfo = format!("host=127.0.0.1 port={port} user=postgres sslmode=verify-full sslrootcert={}", tls.join("ca.crt").display());
    let out = Command::new(postgres_bin("psql"))
        .args([conninfo.as_str(), "-At", "-c", "select ssl from pg_stat_ssl where pid = pg_backend_pid()"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "t", "{}", String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn generated_redis_conf_runs_in_a_real_redis() {
    let conf = config_from_sample("redis", "redis.conf");
    let dir = scratch("redis");
    // The pod mounts its volume at `dir`; here the scratch directory stands in for it (Redis
    // changes into `dir` while reading the file, so it must exist). Nothing else is touched.
    assert!(conf.lines().any(|l| l == "dir /data"), "redis.conf must keep its data in the volume");
    let conf = conf.replace("dir /data", &format!("dir {}", dir.display()));
    let tls = certificate_files(&dir);
    let tls_port = free_port().to_string();
    assert!(conf.lines().any(|l| l == "tls-port 6380"), "redis.conf must serve TLS on 6380");
    let conf = conf.replace(TLS_DIR, &tls.display().to_string()).replace("tls-port 6380", &format!("tls-port {tls_port}"));
    let file = dir.join("redis.conf");
    std::fs::write(&file, &conf).unwrap();
    let port = free_port().to_string();
    let _server = Server(
        Command::new("redis-server")
            .arg(&file)
            .args(["--port", &port, "--bind", "127.0.0.1"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("redis-server: {e} (run scripts/setup)")),
    );
    let cli = |args: &[&str]| {
        let out = Command::new("redis-cli").args(["-p", &port]).args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    wait_until("redis", Duration::from_secs(20), || cli(&["ping"]) == "PONG");
    assert_eq!(cli(&["config", "get", "maxmemory"]), "maxmemory\n100663296");
    assert_eq!(cli(&["config", "get", "maxmemory-policy"]), "maxmemory-policy\nallkeys-lru");
    assert_eq!(cli(&["config", "get", "appendonly"]), "appendonly\nyes");
    // The TLS port answers a client that verifies the server against the CA.
    let out = Command::new("redis-cli")
        .args(["--tls", "--cacert"])
        .arg(tls.join("ca.crt"))
        .args(["-h", "127.0.0.1", "-p", &tls_port, "ping"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "PONG", "{}", String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}
