//! The PostgreSQL-specific part of the spec: `failoverDelay`, `bootstrap` (the application's
//! database and owner), `postgresql.synchronous` and `postgresql.tlsOnly` (and their schema and
//! checks).

use serde_json::{json, Map, Value};
use stateward_sdk::FieldError;

/// Seconds the primary may be unavailable before the most advanced standby is promoted.
///
/// 5 s. What the delay has to absorb is only what the plugin could mistake for a loss: the
/// pod watch reports a deleted, replaced or stopped primary at once, and a server that is slow
/// but up is never counted (its requests failing while its pod stays Ready is load, not loss;
/// the kubelet needs three failed readiness probes, 20 s and more, to call it not Ready). So a
/// 3 s stall of a loaded primary leaves nothing to count, and what is counted is a container
/// restarting in place, which comes back within a few seconds when it comes back at all.
/// Longer only lengthens every real outage: a delete is a write gap of the delay plus about
/// two seconds of promotion and routing, well inside the 15 s a client should tolerate.
pub const DEFAULT_FAILOVER_DELAY_S: u64 = 5;
/// The longest `failoverDelay` accepted.
pub const MAX_FAILOVER_DELAY_S: u64 = 3600;

/// `spec.failoverDelay` of the resource, or the default.
pub fn failover_delay_s(resource: &Value) -> u64 {
    resource
        .pointer("/spec/failoverDelay")
        .and_then(Value::as_u64)
        .map_or(DEFAULT_FAILOVER_DELAY_S, |s| s.min(MAX_FAILOVER_DELAY_S))
}

/// How many standbys must confirm each commit before it is acknowledged, and how they are
/// picked (`spec.postgresql.synchronous`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Synchronous {
    /// `first`: the first `number` streaming standbys in ordinal order; `any`: any `number`.
    pub first: bool,
    pub number: u64,
}

/// `spec.postgresql.synchronous` of the resource (None: asynchronous replication).
pub fn synchronous(resource: &Value) -> Option<Synchronous> {
    let sync = resource.pointer("/spec/postgresql/synchronous")?;
    Some(Synchronous {
        first: sync.get("method").and_then(Value::as_str) == Some("first"),
        number: sync.get("number").and_then(Value::as_u64)?,
    })
}

/// `synchronous_standby_names` for `sync` over the pods `names` (its application names; the
/// primary's own name among them is never a standby of itself, so the value does not change
/// with who is the primary). Empty: asynchronous.
pub fn synchronous_standby_names(sync: Option<&Synchronous>, names: &[String]) -> String {
    let Some(sync) = sync else { return String::new() };
    let list: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
    format!("{} {} ({})", if sync.first { "FIRST" } else { "ANY" }, sync.number, list.join(", "))
}

/// The application's database and its owner (`spec.bootstrap`), made on the primary and kept
/// there; the owner's password is the `password` key of the `<name>-app` Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bootstrap {
    pub database: String,
    pub owner: String,
}

/// The database (and owner) when the spec names none, as CloudNativePG does.
pub const DEFAULT_DATABASE: &str = "app";

/// `spec.bootstrap`, defaults filled in: the owner defaults to the database.
pub fn bootstrap(spec: &Value) -> Bootstrap {
    let field =
        |f: &str| spec.pointer(&format!("/bootstrap/{f}")).and_then(Value::as_str).filter(|s| !s.is_empty());
    let database = field("database").unwrap_or(DEFAULT_DATABASE).to_string();
    let owner = field("owner").map_or_else(|| database.clone(), str::to_string);
    Bootstrap { database, owner }
}

/// `spec.postgresql.tlsOnly`: every connection over the network must use TLS.
pub fn tls_only(spec: &Value) -> bool {
    spec.pointer("/postgresql/tlsOnly").and_then(Value::as_bool).unwrap_or(false)
}

/// Names the operator keeps for itself: the superuser, the replication role, the template
/// databases, and the reserved `pg_` prefix.
const RESERVED_NAMES: &[&str] = &["postgres", crate::bootstrap::REPLICATION_USER, "template0", "template1"];

/// Why `name` cannot be a database or role name of `spec.bootstrap`, if it cannot. Plain
/// lower-case identifiers only: they go into SQL, shell and URIs unquoted and unescaped.
fn name_problem(name: &str) -> Option<String> {
    let plain = name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !plain {
        return Some(format!(
            "{name:?} is not a plain identifier (a lower-case letter or _, then lower-case letters, digits or _, at most 63)"
        ));
    }
    if RESERVED_NAMES.contains(&name) || name.starts_with("pg_") {
        return Some(format!("{name:?} is reserved for the operator or PostgreSQL itself"));
    }
    None
}

/// The spec fields above, in both CRD versions.
pub fn schema() -> Map<String, Value> {
    let mut m = Map::new();
    m.insert(
        "failoverDelay".into(),
        json!({
            "type": "integer",
            "minimum": 0,
            "maximum": MAX_FAILOVER_DELAY_S,
            "description": format!(
                "Seconds the primary may be unavailable (pod gone or replaced, container not running, \
                 answering as a standby, or not Ready with its requests failing) before the most \
                 advanced standby is promoted. Default {DEFAULT_FAILOVER_DELAY_S}."
            ),
        }),
    );
    m.insert(
        "bootstrap".into(),
        json!({
            "type": "object",
            "description": "The application's database and its owner, made on the primary when the cluster \
                forms and kept there (made again if dropped, the password following the Secret). The \
                owner's credentials are in the Secret <name>-app (username, password, host, port, dbname, \
                uri, jdbc-uri, pgpass); the superuser's stay in <name>-credentials. Fixed at creation.",
            "properties": {
                "database": {
                    "type": "string",
                    "maxLength": 63,
                    "description": format!("The database. Default {DEFAULT_DATABASE}."),
                },
                "owner": {
                    "type": "string",
                    "maxLength": 63,
                    "description": "The role that owns it and that applications log in as. Default: the database's name.",
                },
            },
        }),
    );
    m.insert(
        "postgresql".into(),
        json!({
            "type": "object",
            "description": "PostgreSQL settings the operator carries out itself.",
            "properties": {
                "tlsOnly": {
                    "type": "boolean",
                    "description": "Refuse every connection over the network that does not use TLS (pg_hba \
                        hostssl). The servers always offer TLS with the certificate the operator issues; \
                        the socket inside the pod is unaffected. Default false.",
                },
                "synchronous": {
                    "type": "object",
                    "description": "Synchronous replication: a commit is acknowledged only once this many \
                        standbys have it, so a failover loses no acknowledged commit. Absent: asynchronous.",
                    "required": ["number"],
                    "properties": {
                        "method": {
                            "type": "string",
                            "enum": ["any", "first"],
                            "description": "any (default): any `number` standbys confirm (ANY n); first: the \
                                first `number` streaming standbys in ordinal order (FIRST n).",
                        },
                        "number": {
                            "type": "integer",
                            "minimum": 1,
                            "description": "Standbys that must confirm each commit: at most spec.replicas - 1. \
                                With spec.replicas - 1, every standby must confirm, so commits wait whenever one \
                                is away (restarting, being replaced in a roll, cloning): ANY 1 of 2 standbys keeps \
                                writes going through the loss of either.",
                        },
                    },
                },
            },
        }),
    );
    m
}

/// Checks of the fields above; `replicas` is `spec.replicas`.
pub fn validate(spec: &Value, replicas: i64) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for field in ["database", "owner"] {
        match spec.pointer(&format!("/bootstrap/{field}")) {
            None | Some(Value::Null) => {}
            Some(Value::String(name)) => {
                if let Some(problem) = name_problem(name) {
                    errs.push(FieldError::new(format!("spec.bootstrap.{field}"), problem));
                }
            }
            Some(other) => errs
                .push(FieldError::new(format!("spec.bootstrap.{field}"), format!("{other} is not a string"))),
        }
    }
    match spec.pointer("/postgresql/tlsOnly") {
        None | Some(Value::Null | Value::Bool(_)) => {}
        Some(other) => {
            errs.push(FieldError::new("spec.postgresql.tlsOnly", format!("{other} is not true or false")))
        }
    }
    match spec.get("failoverDelay") {
        None | Some(Value::Null) => {}
        Some(v) => match v.as_u64() {
            Some(n) if n <= MAX_FAILOVER_DELAY_S => {}
            _ => errs.push(FieldError::new(
                "spec.failoverDelay",
                format!("must be a whole number of seconds from 0 to {MAX_FAILOVER_DELAY_S}"),
            )),
        },
    }
    if let Some(sync) = spec.pointer("/postgresql/synchronous").filter(|v| !v.is_null()) {
        const PATH: &str = "spec.postgresql.synchronous";
        match sync.get("method") {
            None | Some(Value::Null) => {}
            Some(Value::String(m)) if m == "any" || m == "first" => {}
            Some(other) => {
                errs.push(FieldError::new(format!("{PATH}.method"), format!("{other} is not any or first")))
            }
        }
        match sync.get("number").map(|n| (n, n.as_i64())) {
            None | Some((Value::Null, _)) => {
                errs.push(FieldError::new(format!("{PATH}.number"), "is required"));
            }
            Some((_, Some(n))) if n >= 1 && n < replicas => {}
            Some((_, Some(n))) if n >= 1 => errs.push(FieldError::new(
                format!("{PATH}.number"),
                format!(
                    "{n} standbys cannot confirm each commit: spec.replicas {replicas} has {} standby(s)",
                    (replicas - 1).max(0)
                ),
            )),
            Some((v, _)) => errs.push(FieldError::new(
                format!("{PATH}.number"),
                format!("{v} is not a whole number of at least 1"),
            )),
        }
    }
    errs
}

/// Checks of a change: the application's database and owner are fixed once the cluster exists
/// (renaming them under running applications is theirs to do, in SQL).
pub fn validate_update(new_spec: &Value, old_spec: &Value) -> Vec<FieldError> {
    let (n, o) = (bootstrap(new_spec), bootstrap(old_spec));
    let mut errs = Vec::new();
    if n.database != o.database {
        errs.push(FieldError::new(
            "spec.bootstrap.database",
            format!("is fixed at creation ({:?}); it cannot become {:?}", o.database, n.database),
        ));
    }
    if n.owner != o.owner {
        errs.push(FieldError::new(
            "spec.bootstrap.owner",
            format!("is fixed at creation ({:?}); it cannot become {:?}", o.owner, n.owner),
        ));
    }
    errs
}
