//! The application's database and owner (`spec.bootstrap`): the Secret `<name>-app` that
//! applications read, the pod mount of its password, and the poll that keeps the role, its
//! password and the database on the primary.
//!
//! The plugin never sees the password. The host fills the Secret (a random `password`, then the
//! derived connection keys), the kubelet mounts its `password` key into the pods, and a poll on
//! the confirmed primary (`psql` over its socket, the script on standard input) has the server
//! read it and compare it with what the role has; only when they differ (first formation, a
//! rotated password once the kubelet has refreshed the mount, a role or database dropped or a
//! password changed by hand) does it make the role and the database and set the password, with
//! statement logging off for that session. Standbys get all of it by replication.

use serde_json::{json, Value};
use stateward_sdk::builders::Ctx;
use stateward_sdk::live::{failure, response};
use stateward_sdk::{Action, ExecRequest, RequestMode, Response, SecretRequest};

use crate::ha::Member;
use crate::spec::Bootstrap;

/// Where the pods mount the application password (the `password` key of `<name>-app`).
pub const MOUNT_DIR: &str = "/etc/stateward-app";
/// How often the primary is asked: a rotated password is taken up within this much of the
/// kubelet refreshing the mount.
pub const POLL_MS: u64 = 10_000;
const TIMEOUT_MS: u32 = 20_000;
const PORT: u16 = 5432;

/// `<name>-app`.
pub fn secret_name(ctx: &Ctx) -> String {
    format!("{}-app", ctx.name())
}

/// The Secret: a random password, and every other key derived from it and the spec, so a
/// changed password rewrites the URIs and an edited user name is put back.
pub fn secret(ctx: &Ctx, b: &Bootstrap, tls_only: bool) -> SecretRequest {
    let host = format!("{}-rw", ctx.name());
    let (uri_tls, jdbc_tls) = if tls_only { ("?sslmode=require", "&sslmode=require") } else { ("", "") };
    let derived = [
        ("username", b.owner.clone()),
        ("dbname", b.database.clone()),
        ("host", host.clone()),
        ("port", PORT.to_string()),
        ("uri", format!("postgresql://{{username}}:{{password}}@{host}.{{namespace}}:{PORT}/{{dbname}}{uri_tls}")),
        (
            "jdbc-uri",
            format!(
                "jdbc:postgresql://{host}.{{namespace}}:{PORT}/{{dbname}}?password={{password}}&user={{username}}{jdbc_tls}"
            ),
        ),
        ("pgpass", format!("{host}:{PORT}:{{dbname}}:{{username}}:{{password}}\n")),
    ];
    SecretRequest {
        name: secret_name(ctx),
        keys: vec![("password".into(), 24)],
        labels: ctx.label_pairs(),
        derived: derived.into_iter().map(|(key, template)| (key.to_string(), template)).collect(),
    }
}

/// The pod volume and mount of the password alone (0440: the pod's group, as for the TLS key).
pub fn volume_and_mount(ctx: &Ctx) -> (Value, Value) {
    (
        json!({
            "name": "app",
            "secret": {
                "secretName": secret_name(ctx),
                "items": [{ "key": "password", "path": "password" }],
                "defaultMode": 0o440,
            },
        }),
        json!({ "name": "app", "mountPath": MOUNT_DIR, "readOnly": true }),
    )
}

/// What the poll feeds `psql` on standard input, over the primary's socket as the superuser.
/// Prints `ok` when the owner, its password and the database are as the Secret says, `set`
/// when it had to make or fix them first.
///
/// The server reads the mounted password itself (`pg_read_file`), so it never appears in a
/// request, a command line or the statement log (off for this session). Whether the role's
/// password is the Secret's is told by a digest kept as the role's comment: SHA-256 over the
/// role's SCRAM verifier (readable by superusers only, and new with every password) and the
/// password, so it changes when either does and says nothing to whoever reads comments.
pub fn script(b: &Bootstrap) -> String {
    let (db, owner) = (&b.database, &b.owner);
    format!(
        r#"SET log_statement = 'none';
SET log_min_duration_statement = -1;
SET log_min_error_statement = panic;
SELECT rtrim(pg_read_file('{MOUNT_DIR}/password'), E'\r\n') AS pw \gset
SELECT length(:'pw') > 0 AS has_pw \gset
\if :has_pw
\else
\warn 'the password file {MOUNT_DIR}/password is empty'
\quit
\endif
SELECT coalesce((SELECT 'stateward ' || encode(sha256(convert_to(rolpassword || :'pw', 'UTF8')), 'hex')
        = shobj_description(oid, 'pg_authid') FROM pg_authid WHERE rolname = '{owner}'), false)
    AND EXISTS (SELECT FROM pg_database WHERE datname = '{db}') AS in_sync \gset
\if :in_sync
\echo ok
\else
SELECT 'CREATE ROLE {owner} LOGIN' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{owner}') \gexec
SELECT format('ALTER ROLE {owner} WITH LOGIN PASSWORD %L', :'pw') \gexec
SELECT format('COMMENT ON ROLE {owner} IS %L', 'stateward ' || encode(sha256(convert_to(rolpassword || :'pw', 'UTF8')), 'hex'))
    FROM pg_authid WHERE rolname = '{owner}' \gexec
SELECT 'CREATE DATABASE {db} OWNER {owner}' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '{db}') \gexec
\echo set
\endif
"#
    )
}

/// The poll of the confirmed primary `m` (one id per incarnation: a new primary is asked anew).
pub fn poll_id(m: &Member) -> String {
    format!("app-{}", m.incarnation().replace('@', "-"))
}

/// The poll of `m`.
pub fn poll(m: &Member, b: &Bootstrap) -> Action {
    let psql =
        ["psql", "--username=postgres", "--dbname=postgres", "--no-psqlrc", "--quiet", "--tuples-only"];
    Action::Exec(ExecRequest {
        id: poll_id(m),
        mode: RequestMode::EveryMs(POLL_MS),
        pod: m.pod.clone(),
        container: "postgres".into(),
        command: psql.iter().chain(&["--set=ON_ERROR_STOP=1"]).map(|s| (*s).to_string()).collect(),
        stdin: Some(script(b)),
        timeout_ms: TIMEOUT_MS,
    })
}

/// `status.application`: the database, owner and Secret, and whether the owner could log in
/// at the primary's last answer (`ready`), with the reason when not.
pub fn status(ctx: &Ctx, b: &Bootstrap, answer: Option<&Response>) -> Value {
    let (ready, message) = match answer {
        Some(r) if r.succeeded() && r.stdout.trim() == "ok" => {
            (true, "the owner, its password and the database are as the Secret says".to_string())
        }
        Some(r) if r.succeeded() && r.stdout.trim() == "set" => {
            (false, "made or updated the role, its password or the database; checking again".to_string())
        }
        Some(r) if r.succeeded() => {
            (false, format!("the check said {:?}: {}", r.stdout.trim(), r.stderr.trim()))
        }
        Some(r) => (false, failure(r, "the application user's check")),
        None => (false, "waiting for a confirmed primary".to_string()),
    };
    json!({
        "database": b.database,
        "owner": b.owner,
        "secret": secret_name(ctx),
        "ready": ready,
        "message": message,
    })
}

/// The answer of `m`'s poll.
pub fn answer<'a>(responses: &'a [Response], m: &Member) -> Option<&'a Response> {
    response(responses, &poll_id(m))
}

/// Schema of `status.application`.
pub fn schema() -> Value {
    json!({
        "type": "object",
        "description": "The application's database and owner (spec.bootstrap) and their Secret.",
        "properties": {
            "database": { "type": "string" },
            "owner": { "type": "string" },
            "secret": { "type": "string" },
            "ready": { "type": "boolean", "description": "At the primary's last check the owner existed with the Secret's password, and the database with it." },
            "message": { "type": "string" },
        },
    })
}
