//! The server configs the plugins generate, run by real servers: PostgreSQL and Redis from
//! Debian's packages (installed by scripts/setup) start with them on loopback and report the
//! values the spec asked for. The entry scripts of the ConfigMaps run too, the way the pods run
//! them (`sh entrypoint.sh`, the pod's environment, an unprivileged user): PostgreSQL's makes
//! the cluster once and restarts on the same data, Redis' keeps the password off the command
//! line. Elasticsearch has no Debian package; its config is only checked by the plugin's own
//! tests.

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use stateward::render::{parse_documents, render};
use stateward::runtime::{Action, Registry};
use stateward_testkit::servers::{as_postgres, free_port, is_root, postgres_bin, wait_serving, Server};
use support::{load, sandbox, workspace_root};

/// The objects the sample of `plugin` renders to (through the Wasm component).
fn objects_from_sample(plugin: &str) -> Vec<serde_json::Value> {
    let mut registry = Registry::default();
    registry.insert(std::sync::Arc::new(load(&sandbox(), &format!("stateward-{plugin}"))));
    let path = workspace_root().join(format!("deploy/samples/{plugin}.yaml"));
    let sample = parse_documents(&std::fs::read_to_string(path).unwrap(), "sample").unwrap().remove(0);
    let rendered = render(&registry, sample, &[], &[], 0).expect("render");
    rendered
        .plan
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Apply { object } => Some(object.clone()),
            _ => None,
        })
        .collect()
}

fn of_kind(objects: &[serde_json::Value], kind: &str) -> serde_json::Value {
    objects.iter().find(|o| o["kind"] == kind).cloned().unwrap_or_else(|| panic!("no {kind}"))
}

fn config_from_sample(plugin: &str, key: &str) -> String {
    of_kind(&objects_from_sample(plugin), "ConfigMap")["data"][key]
        .as_str()
        .map(String::from)
        .unwrap_or_else(|| panic!("{plugin}: no ConfigMap with {key}"))
}

/// Writes every file of the ConfigMap into `dir` (standing in for its mount), returns the
/// container of the StatefulSet.
fn config_map_into(objects: &[serde_json::Value], dir: &Path) -> serde_json::Value {
    std::fs::create_dir_all(dir).unwrap();
    for (name, text) in of_kind(objects, "ConfigMap")["data"].as_object().unwrap() {
        std::fs::write(dir.join(name), text.as_str().unwrap()).unwrap();
    }
    of_kind(objects, "StatefulSet")["spec"]["template"]["spec"]["containers"][0].clone()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("stateward-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
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
        assert!(Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(&dir)
            .status()
            .unwrap()
            .success());
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
            // initdb's own pg_hba.conf (trust); the generated one is run by the entry script test.
            .arg("-c")
            .arg(format!("hba_file={}", data.join("pg_hba.conf").display()))
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
    let conninfo = format!(
        "host=127.0.0.1 port={port} user=postgres sslmode=verify-full sslrootcert={}",
        tls.join("ca.crt").display()
    );
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
    let conf = conf
        .replace(TLS_DIR, &tls.display().to_string())
        .replace("tls-port 6380", &format!("tls-port {tls_port}"));
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
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "PONG",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `program` as the unprivileged `postgres` user when the test runs as root (CI), keeping
/// the environment set on the command (setpriv, unlike runuser, changes nothing else).
fn unprivileged(program: &str) -> Command {
    if is_root() {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=postgres", "--regid=postgres", "--init-groups", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn chown_to_postgres(dir: &Path) {
    if is_root() {
        assert!(Command::new("chown").args(["-R", "postgres:postgres"]).arg(dir).status().unwrap().success());
    }
}

/// Asks the server to stop (SIGINT: PostgreSQL's fast shutdown) and waits for it.
fn stop(server: &mut Server) {
    let pid = server.0.id().to_string();
    assert!(Command::new("kill").args(["-INT", &pid]).status().unwrap().success());
    let status = server.0.wait().unwrap();
    assert!(status.success() || status.code().is_some(), "{status:?}");
}

/// What /proc says about a process: its command line and environment, NULs as spaces.
fn proc_text(pid: u32, what: &str) -> String {
    String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/{what}")).unwrap()).replace('\0', " ")
}

#[test]
fn postgres_entrypoint_makes_the_cluster_once_and_restarts_on_the_same_data() {
    let objects = objects_from_sample("postgres");
    let dir = scratch("pg-entry");
    let config = dir.join("config");
    let container = config_map_into(&objects, &config);
    assert_eq!(container["command"], serde_json::json!(["sh", "/etc/stateward/entrypoint.sh"]));
    assert!(container["args"].is_null(), "nothing after the script: {container}");
    let env = container["env"].as_array().unwrap();
    let pgdata = env.iter().find(|e| e["name"] == "PGDATA").unwrap()["value"].as_str().unwrap();
    assert_eq!(pgdata, "/var/lib/postgresql/data/pgdata", "a directory inside the volume's mount");
    let secret = env.iter().find(|e| e["name"] == "POSTGRES_PASSWORD").unwrap();
    assert_eq!(secret["valueFrom"]["secretKeyRef"]["key"], "password");
    let tls = certificate_files(&dir);
    let tmp = dir.join("tmp");
    let volume = dir.join("volume");
    for d in [&tmp, &volume] {
        std::fs::create_dir_all(d).unwrap();
    }
    chown_to_postgres(&dir);
    let password = "Pw-with 'quotes' and \"double\" $(not a command)";
    let port = free_port().to_string();
    // The pod's environment, with the generated files as they are; what differs on this machine
    // (port, socket, certificate paths) is passed on to postgres by the script's arguments.
    let start = |log: &str| {
        let bin = postgres_bin("postgres");
        let path =
            format!("{}:{}", bin.parent().unwrap().display(), std::env::var("PATH").unwrap_or_default());
        let mut cmd = unprivileged("sh");
        cmd.arg(config.join("entrypoint.sh"))
            .env_clear()
            .env("PATH", path)
            .env("PGDATA", volume.join("pgdata"))
            .env("POSTGRES_PASSWORD", password)
            .env("STATEWARD_REPLICATION_PASSWORD", "replication-secret")
            // The topology of a new cluster, as the plugin publishes it, and the downward API.
            .env("POD_NAME", "main-pg-0")
            .env("POD_UID", "0a1b2c3d-0000")
            .env("STATEWARD_PRIMARY", "main-pg-0")
            .env("STATEWARD_PRIMARY_UID", "")
            .env("STATEWARD_BOOTSTRAP", "initdb")
            .env("TMPDIR", &tmp)
            .args(["-c", "listen_addresses=127.0.0.1", "-c", &format!("port={port}")])
            .args(["-c", &format!("unix_socket_directories={}", dir.display())])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(log)).unwrap());
        for (setting, file) in
            [("ssl_cert_file", "tls.crt"), ("ssl_key_file", "tls.key"), ("ssl_ca_file", "ca.crt")]
        {
            cmd.arg("-c").arg(format!("{setting}={}", tls.join(file).display()));
        }
        // The pg_hba.conf the script writes beside $PGDATA (the pod's hba_file is there too).
        cmd.arg("-c").arg(format!("hba_file={}", volume.join("pg_hba.conf").display()));
        Server(cmd.spawn().unwrap())
    };
    let psql = |host: &str, pw: &str, sql: &str| {
        Command::new(postgres_bin("psql"))
            .env("PGPASSWORD", pw)
            .env("PGCONNECT_TIMEOUT", "5")
            .args(["-h", host, "-p", &port, "-U", "postgres", "-d", "postgres", "-At", "-c", sql])
            .output()
            .unwrap()
    };
    let sql_ok = |sql: &str| {
        let out = psql("127.0.0.1", password, sql);
        assert!(out.status.success(), "{sql}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let log = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();

    let mut server = start("first.log");
    wait_until("postgres (first start)", Duration::from_secs(120), || {
        psql("127.0.0.1", password, "select 1").status.success()
    });
    assert_eq!(sql_ok("select 1"), "1");
    // No name under the headless Service in this machine's /etc/hosts: replication is
    // accepted from no other host (fails closed), and the server runs with that file.
    let hba = std::fs::read_to_string(volume.join("pg_hba.conf")).unwrap();
    assert!(
        hba.lines().any(|l| l.split_whitespace().collect::<Vec<_>>()
            == ["host", "replication", "streaming_replica", "samehost", "scram-sha-256"]),
        "{hba}"
    );
    assert_eq!(sql_ok("select count(*) from pg_hba_file_rules where address = 'samehost'"), "1");
    assert_eq!(sql_ok("select count(*) from pg_hba_file_rules where error is not null"), "0");
    assert_eq!(sql_ok("show data_checksums"), "on", "pg_rewind needs checksums");
    assert_eq!(sql_ok("show max_connections"), "50", "the sample's parameters apply");
    assert_eq!(sql_ok("show unix_socket_permissions"), "0700");
    assert_eq!(
        sql_ok("select rolpassword like 'SCRAM-SHA-256$%' from pg_authid where rolname = 'postgres'"),
        "t"
    );
    // Host connections prove the password; the socket trusts the server's own user.
    let wrong = psql("127.0.0.1", "wrong", "select 1");
    assert!(!wrong.status.success());
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("password authentication failed"));
    if is_root() {
        let mut c = unprivileged(postgres_bin("psql").to_str().unwrap());
        let out = c
            .args(["-h", &dir.display().to_string(), "-p", &port, "-U", "postgres", "-At", "-c", "select 2"])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "2",
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The pod's probe command, on this port.
    let probe = container["readinessProbe"]["exec"]["command"][2].as_str().unwrap().replace("5432", &port);
    let bin_dir = postgres_bin("pg_isready").parent().unwrap().display().to_string();
    let path = format!("{bin_dir}:{}", std::env::var("PATH").unwrap_or_default());
    assert!(
        Command::new("sh").args(["-c", &probe]).env("PATH", &path).output().unwrap().status.success(),
        "{probe}"
    );
    // The password is on no command line, not left in the server's environment, nor in a file.
    let pid = server.0.id();
    assert!(proc_text(pid, "cmdline").starts_with("postgres -D "), "the script execs postgres");
    assert!(!proc_text(pid, "cmdline").contains(password));
    assert!(!proc_text(pid, "environ").contains("POSTGRES_PASSWORD"));
    assert!(!proc_text(pid, "environ").contains("replication-secret"));
    // What stays in TMPDIR is the replication role's password file (the WAL receiver of a
    // standby reads it), 0600; the superuser's password file is gone.
    let left: Vec<String> = std::fs::read_dir(&tmp)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["stateward.pgpass"], "the superuser's password file is removed");
    let pgpass = std::fs::read_to_string(tmp.join("stateward.pgpass")).unwrap();
    assert!(pgpass.contains("streaming_replica:replication-secret") && !pgpass.contains(password));
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(tmp.join("stateward.pgpass")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    assert_eq!(
        sql_ok("select rolreplication from pg_roles where rolname = 'streaming_replica'"),
        "t",
        "the replication role is made with the cluster"
    );
    assert!(!volume.join("pgdata.initdb").exists());
    sql_ok("create table kept (v text); insert into kept values ('still here')");
    assert!(log("first.log").contains("initialising"), "{}", log("first.log"));
    stop(&mut server);

    // The second start finds the cluster and only starts it.
    let second = start("second.log");
    wait_until("postgres (second start)", Duration::from_secs(60), || {
        psql("127.0.0.1", password, "select 1").status.success()
    });
    assert_eq!(sql_ok("select v from kept"), "still here");
    assert!(!log("second.log").contains("initialis"), "{}", log("second.log"));
    assert!(log("second.log").contains("starting as the primary"), "{}", log("second.log"));
    drop(second);

    // A data directory with files but no PG_VERSION is left alone.
    let foreign = dir.join("foreign");
    std::fs::create_dir_all(foreign.join("pgdata")).unwrap();
    std::fs::write(foreign.join("pgdata/precious"), "x").unwrap();
    let out = Command::new("sh")
        .arg(config.join("entrypoint.sh"))
        .env("PGDATA", foreign.join("pgdata"))
        .env("POSTGRES_PASSWORD", "x")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no PG_VERSION"));
    assert!(foreign.join("pgdata/precious").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn redis_entrypoint_keeps_the_password_off_the_command_line_and_replicas_authenticate() {
    let objects = objects_from_sample("redis");
    let dir = scratch("redis-entry");
    let config = dir.join("config");
    let container = config_map_into(&objects, &config);
    assert_eq!(container["command"], serde_json::json!(["sh", "/etc/stateward/entrypoint.sh"]));
    let pod = &of_kind(&objects, "StatefulSet")["spec"]["template"]["spec"];
    let run = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "run").unwrap();
    assert_eq!(run["emptyDir"]["medium"], "Memory", "the password file stays in memory");
    // The pod's paths, moved into the scratch directory: redis.conf changes into `dir` while
    // it is read, so that one line is rewritten; the rest goes as the script's arguments.
    let conf = std::fs::read_to_string(config.join("redis.conf")).unwrap();
    assert!(!conf.contains("requirepass"));
    let tls = certificate_files(&dir);
    let password = "pw \"with\" quotes\\and $(no command)";
    let start = |member: &str, data: &Path, port: &str, extra: &[&str]| -> (Server, PathBuf, PathBuf) {
        let conf_dir = dir.join(format!("config-{member}"));
        std::fs::create_dir_all(&conf_dir).unwrap();
        std::fs::write(
            conf_dir.join("redis.conf"),
            conf.replace("dir /data", &format!("dir {}", data.display())),
        )
        .unwrap();
        std::fs::copy(config.join("entrypoint.sh"), conf_dir.join("entrypoint.sh")).unwrap();
        let run_dir = dir.join(format!("run-{member}"));
        for d in [data, &run_dir] {
            std::fs::create_dir_all(d).unwrap();
        }
        let tls_port = free_port().to_string();
        let mut cmd = Command::new("sh");
        cmd.arg(conf_dir.join("entrypoint.sh"))
            .env("REDIS_PASSWORD", password)
            .env("STATEWARD_RUN_DIR", &run_dir)
            .env("HOSTNAME", member)
            // Replication mode's topology (the ConfigMap `cache-topology` in a pod): names that
            // do not resolve here, so no Sentinel answers and pod 0 starts as the master.
            .env("STATEWARD_HEADLESS", "cache-headless.invalid")
            .env("STATEWARD_PEERS", "cache-0.cache-headless.invalid cache-1.cache-headless.invalid")
            .env("STATEWARD_QUORUM", "2")
            .args(["--port", port, "--bind", "127.0.0.1", "--tls-port", &tls_port])
            .args(["--tls-cert-file", &tls.join("tls.crt").display().to_string()])
            .args(["--tls-key-file", &tls.join("tls.key").display().to_string()])
            .args(["--tls-ca-cert-file", &tls.join("ca.crt").display().to_string()])
            .args(extra);
        // The script's, the server's and its Sentinel's output, which a failed wait shows.
        let log = dir.join(format!("{member}.log"));
        let out = std::fs::File::create(&log).unwrap();
        cmd.stdout(out.try_clone().unwrap()).stderr(out);
        (Server(cmd.spawn().unwrap_or_else(|e| panic!("sh: {e}"))), run_dir, log)
    };
    let cli = |port: &str, auth: Option<&str>, args: &[&str]| {
        let mut c = Command::new("redis-cli");
        if let Some(a) = auth {
            c.env("REDISCLI_AUTH", a);
        }
        let out = c.args(["-h", "127.0.0.1", "-p", port]).args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    // A member serving on free ports, started again on others when a port was taken meanwhile.
    let serve = |member: &str, data: &Path, extra: &[&str]| {
        for _ in 0..3 {
            let port = free_port().to_string();
            let (mut server, run_dir, log) = start(member, data, &port, extra);
            let ping = || cli(&port, Some(password), &["ping"]) == "PONG";
            match wait_serving(&mut server, &log, Duration::from_secs(30), ping) {
                Ok(()) => return (server, run_dir, log, port),
                Err(e) if e.port_taken() => continue,
                Err(e) => panic!("{member} did not serve: {e:?}"),
            }
        }
        panic!("{member}: every port tried was taken")
    };
    let (primary, run_dir, _, port) = serve("cache-0", &dir.join("data-0"), &[]);
    assert!(cli(&port, None, &["ping"]).contains("NOAUTH"), "a password is required");
    assert_ne!(cli(&port, Some("wrong"), &["ping"]), "PONG", "only the password gets in");
    let pid = primary.0.id();
    assert!(proc_text(pid, "cmdline").starts_with("redis-server"), "the script execs redis-server");
    assert!(!proc_text(pid, "cmdline").contains("with"), "{}", proc_text(pid, "cmdline"));
    assert!(!proc_text(pid, "environ").contains("REDIS_PASSWORD"));
    use std::os::unix::fs::PermissionsExt;
    let auth = std::fs::metadata(run_dir.join("auth.conf")).unwrap();
    assert_eq!(auth.permissions().mode() & 0o777, 0o600);
    // The Sentinel's file holds the password too: 0600, in the run directory only.
    let sentinel = std::fs::metadata(run_dir.join("sentinel.conf")).unwrap();
    assert_eq!(sentinel.permissions().mode() & 0o777, 0o600);
    let sentinel_conf = std::fs::read_to_string(run_dir.join("sentinel.conf")).unwrap();
    assert!(
        sentinel_conf.contains("sentinel monitor primary cache-0.cache-headless.invalid 6379 2"),
        "{sentinel_conf}"
    );
    // (Sentinel may have rewritten the file by now; its rewrite keeps requirepass quoted.)
    assert!(
        sentinel_conf.contains("requirepass \"pw \\\"with\\\" quotes\\\\and $(no command)\""),
        "{sentinel_conf}"
    );
    // The pod's probe, on this port.
    let probe = container["readinessProbe"]["exec"]["command"][2].as_str().unwrap().replace("6379", &port);
    assert!(Command::new("sh")
        .args(["-c", &probe])
        .env("REDIS_PASSWORD", password)
        .status()
        .unwrap()
        .success());
    assert_eq!(cli(&port, Some(password), &["set", "k", "v"]), "OK");

    // A member other than pod 0 replicates, proving masterauth: its script names the primary
    // at the pod port 6379, which the last --replicaof (this machine's port) overrides.
    let (mut replica, _, replica_log, replica_port) =
        serve("cache-1", &dir.join("data-1"), &["--replicaof", "127.0.0.1", &port]);
    let linked = wait_serving(&mut replica, &replica_log, Duration::from_secs(60), || {
        cli(&replica_port, Some(password), &["info", "replication"]).contains("master_link_status:up")
    });
    if let Err(e) = linked {
        let info = cli(&replica_port, Some(password), &["info", "replication"]);
        panic!("the replica did not link: {info}\n{e:?}");
    }
    wait_until("replicated key", Duration::from_secs(10), || {
        cli(&replica_port, Some(password), &["get", "k"]) == "v"
    });
    let _ = std::fs::remove_dir_all(&dir);
}
