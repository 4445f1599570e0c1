//! The Redis-specific part of the spec: `mode`, `sentinel`, `cluster` and `persistence` (their
//! defaults, schema and checks).
//!
//! `mode` defaults to `replication` when `spec.replicas` is above 1 and to `standalone`
//! otherwise, so a spec written before the field existed keeps its meaning. Replication needs
//! three pods at least: every pod runs a Sentinel beside its server (see [`crate::sentinel`]),
//! and once the master's pod is gone its Sentinel is gone too, while electing the Sentinel that
//! performs the failover takes a majority of all of them.

use serde_json::{Map, Value};
use stateward_sdk::FieldError;

/// One server, no replica, no Sentinel.
pub const STANDALONE: &str = "standalone";
/// One master, replicas of it, and a Sentinel in every pod.
pub const REPLICATION: &str = "replication";
/// Redis Cluster: `cluster.shards` masters with `cluster.replicasPerShard` replicas each.
pub const CLUSTER: &str = "cluster";

/// Fewest masters of a Redis Cluster: a failed master is voted out by a majority of masters,
/// so with fewer than 3 the loss of one leaves no majority.
pub const MIN_SHARDS: i64 = 3;
pub const MAX_SHARDS: i64 = 100;
pub const MAX_REPLICAS_PER_SHARD: i64 = 5;
pub const DEFAULT_REPLICAS_PER_SHARD: i64 = 1;

/// `spec.cluster`: (shards, replicas per shard), defaults filled in (0 shards: not set).
pub fn cluster_shape(spec: &Value) -> (i64, i64) {
    let field = |f: &str| spec.pointer(&format!("/cluster/{f}")).and_then(Value::as_i64);
    (field("shards").unwrap_or(0), field("replicasPerShard").unwrap_or(DEFAULT_REPLICAS_PER_SHARD))
}

/// `spec.replicas` when the spec does not set it: in cluster mode the pods `spec.cluster`
/// makes (shards × (1 master + replicas per shard)), else the SDK's default.
pub fn default_replicas(spec: &Value) -> i64 {
    match cluster_shape(spec) {
        (shards, per) if spec.get("mode").and_then(Value::as_str) == Some(CLUSTER) && shards > 0 => {
            shards.saturating_mul(per.saturating_add(1))
        }
        _ => stateward_sdk::spec::DEFAULT_REPLICAS,
    }
}

/// Fewest pods for replication mode (see the module's comment).
pub const MIN_REPLICATION_PODS: i64 = 3;

/// Milliseconds a master may not answer before a Sentinel thinks it down (5 s: a failover
/// within the 20 s a client should tolerate, and not on one slow answer).
pub const DEFAULT_DOWN_AFTER_MS: u64 = 5_000;
pub const MIN_DOWN_AFTER_MS: u64 = 1_000;
pub const MAX_DOWN_AFTER_MS: u64 = 600_000;
/// Sentinel's failover timeout: how long before a failover that stalled is tried again.
pub const DEFAULT_FAILOVER_TIMEOUT_MS: u64 = 60_000;

/// `appendfsync` values (`off`: no append-only file).
pub const AOF_MODES: &[&str] = &["everysec", "always", "no", "off"];

/// The mode the spec asks for, defaults filled in.
pub fn mode(spec: &Value, replicas: i64) -> &str {
    match spec.get("mode").and_then(Value::as_str) {
        Some(m) => m,
        None if replicas > 1 => REPLICATION,
        None => STANDALONE,
    }
}

/// What the Sentinels are told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sentinel {
    /// Sentinels that must agree the master is down before a failover starts.
    pub quorum: i64,
    pub down_after_ms: u64,
    pub failover_timeout_ms: u64,
}

/// A majority of `sentinels`.
pub fn majority(sentinels: i64) -> i64 {
    sentinels / 2 + 1
}

/// `spec.sentinel`, defaults filled in (the quorum: a majority of the pods).
pub fn sentinel(spec: &Value, replicas: i64) -> Sentinel {
    let field = |f: &str| spec.pointer(&format!("/sentinel/{f}")).and_then(Value::as_u64);
    Sentinel {
        quorum: field("quorum").map_or_else(|| majority(replicas), |q| q as i64),
        down_after_ms: field("downAfterMilliseconds")
            .unwrap_or(DEFAULT_DOWN_AFTER_MS)
            .clamp(MIN_DOWN_AFTER_MS, MAX_DOWN_AFTER_MS),
        failover_timeout_ms: DEFAULT_FAILOVER_TIMEOUT_MS,
    }
}

/// How the data reaches the volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Persistence {
    /// `appendfsync`, or None: no append-only file.
    pub aof: Option<String>,
    /// RDB `save` points (`<seconds> <changes>` pairs), or None: no snapshots.
    pub rdb: Option<String>,
}

/// `spec.persistence`, defaults filled in: an append-only file synced every second, no RDB.
pub fn persistence(spec: &Value) -> Persistence {
    let aof = spec.pointer("/persistence/aof").and_then(Value::as_str).unwrap_or("everysec");
    let rdb = spec.pointer("/persistence/rdb").and_then(Value::as_str).map(str::trim).unwrap_or("");
    Persistence {
        aof: (aof != "off").then(|| aof.to_string()),
        rdb: (!rdb.is_empty()).then(|| rdb.split_whitespace().collect::<Vec<_>>().join(" ")),
    }
}

/// Why `save` is not a list of `<seconds> <changes>` pairs, if it is not.
fn save_problem(save: &str) -> Option<String> {
    let words: Vec<&str> = save.split_whitespace().collect();
    let numbers =
        words.iter().all(|w| w.len() <= 9 && !w.is_empty() && w.bytes().all(|b| b.is_ascii_digit()));
    if words.is_empty() || !words.len().is_multiple_of(2) || words.len() > 16 || !numbers {
        return Some(format!(
            "{save:?} is not 1 to 8 pairs of whole numbers \"<seconds> <changes>\" (e.g. \"3600 1 300 100\")"
        ));
    }
    None
}

/// The spec fields above, for the CRD schema. Kept as data (spec_schema.json), not code: the
/// component must fit a ConfigMap. The numbers its descriptions give are this module's
/// constants (a unit test holds them together).
pub fn schema() -> Map<String, Value> {
    serde_json::from_str(include_str!("spec_schema.json")).unwrap_or_default()
}

/// Checks of the fields above; `replicas` is `spec.replicas`.
pub fn validate(spec: &Value, replicas: i64) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mode = match spec.get("mode") {
        None | Some(Value::Null) => mode(spec, replicas).to_string(),
        Some(Value::String(m)) => m.clone(),
        Some(other) => {
            errs.push(FieldError::new("spec.mode", format!("{other} is not a string")));
            return errs;
        }
    };
    match mode.as_str() {
        STANDALONE if replicas > 1 => errs.push(FieldError::new(
            "spec.mode",
            format!("standalone is one server: spec.replicas is {replicas}; use replication for replicas"),
        )),
        STANDALONE => {}
        REPLICATION if replicas < MIN_REPLICATION_PODS => errs.push(FieldError::new(
            "spec.mode",
            format!(
                "replication needs spec.replicas of at least {MIN_REPLICATION_PODS} (it is {replicas}): each pod \
                 runs a Sentinel, and when the master's pod is lost with its Sentinel a majority of all \
                 Sentinels must remain to authorize the failover"
            ),
        )),
        REPLICATION => {}
        CLUSTER => errs.extend(validate_cluster(spec, replicas)),
        other => errs.push(FieldError::new(
            "spec.mode",
            format!("{other:?} is not one of standalone, replication, cluster"),
        )),
    }
    if mode != CLUSTER && spec.get("cluster").is_some_and(|c| !c.is_null()) {
        errs.push(FieldError::new("spec.cluster", format!("is for cluster mode only, not {mode}")));
    }
    if let Some(s) = spec.get("sentinel").filter(|v| !v.is_null()) {
        if mode != REPLICATION {
            errs.push(FieldError::new(
                "spec.sentinel",
                format!("Sentinels run in replication mode only, not {mode}"),
            ));
        }
        match s.get("quorum") {
            None | Some(Value::Null) => {}
            Some(q) => match q.as_i64() {
                Some(q) if q >= 1 && q <= replicas => {}
                _ => errs.push(FieldError::new(
                    "spec.sentinel.quorum",
                    format!(
                        "{q} is impossible with {replicas} Sentinels (one per pod): it must be from 1 to {replicas}"
                    ),
                )),
            },
        }
        match s.get("downAfterMilliseconds") {
            None | Some(Value::Null) => {}
            Some(v) => match v.as_u64() {
                Some(ms) if (MIN_DOWN_AFTER_MS..=MAX_DOWN_AFTER_MS).contains(&ms) => {}
                _ => errs.push(FieldError::new(
                    "spec.sentinel.downAfterMilliseconds",
                    format!("{v} is not a whole number from {MIN_DOWN_AFTER_MS} to {MAX_DOWN_AFTER_MS}"),
                )),
            },
        }
        if let Some(o) = s.as_object() {
            for key in o.keys().filter(|k| *k != "quorum" && *k != "downAfterMilliseconds") {
                errs.push(FieldError::new(
                    format!("spec.sentinel.{key}"),
                    "is a Sentinel setting the operator owns (only quorum and downAfterMilliseconds may be set)",
                ));
            }
        }
    }
    match spec.pointer("/persistence/aof") {
        None | Some(Value::Null) => {}
        Some(Value::String(a)) if AOF_MODES.contains(&a.as_str()) => {}
        Some(other) => errs.push(FieldError::new(
            "spec.persistence.aof",
            format!("{other} is not one of {}", AOF_MODES.join(", ")),
        )),
    }
    match spec.pointer("/persistence/rdb") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.trim().is_empty() => {}
        Some(Value::String(s)) => {
            if let Some(p) = save_problem(s) {
                errs.push(FieldError::new("spec.persistence.rdb", p));
            }
        }
        Some(other) => errs.push(FieldError::new("spec.persistence.rdb", format!("{other} is not a string"))),
    }
    errs
}

/// `spec.cluster` in cluster mode: its two numbers in range, and `spec.replicas` the pods they
/// make.
fn validate_cluster(spec: &Value, replicas: i64) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let number = |f: &str| spec.pointer(&format!("/cluster/{f}")).filter(|v| !v.is_null());
    let shards = match number("shards") {
        None => {
            errs.push(FieldError::new(
                "spec.cluster.shards",
                format!("is required in cluster mode: the number of masters, {MIN_SHARDS} to {MAX_SHARDS}"),
            ));
            None
        }
        Some(v) => match v.as_i64() {
            Some(n) if (MIN_SHARDS..=MAX_SHARDS).contains(&n) => Some(n),
            _ => {
                errs.push(FieldError::new(
                    "spec.cluster.shards",
                    format!(
                        "{v} is not a whole number from {MIN_SHARDS} to {MAX_SHARDS}: a failed master is voted out by a \
                         majority of masters, which fewer than {MIN_SHARDS} do not have after losing one"
                    ),
                ));
                None
            }
        },
    };
    let per = match number("replicasPerShard") {
        None => Some(DEFAULT_REPLICAS_PER_SHARD),
        Some(v) => match v.as_i64() {
            Some(n) if (0..=MAX_REPLICAS_PER_SHARD).contains(&n) => Some(n),
            _ => {
                errs.push(FieldError::new(
                    "spec.cluster.replicasPerShard",
                    format!("{v} is not a whole number from 0 to {MAX_REPLICAS_PER_SHARD}"),
                ));
                None
            }
        },
    };
    if let Some(o) = spec.get("cluster").and_then(Value::as_object) {
        for key in o.keys().filter(|k| *k != "shards" && *k != "replicasPerShard") {
            errs.push(FieldError::new(
                format!("spec.cluster.{key}"),
                "is not a field of spec.cluster (shards, replicasPerShard)",
            ));
        }
    }
    if let (Some(s), Some(p)) = (shards, per) {
        let pods = s * (1 + p);
        if replicas != pods {
            errs.push(FieldError::new(
                "spec.replicas",
                format!("is {replicas}, but {s} shards × (1 master + {p} replicas) are {pods} pods: set spec.replicas to {pods}"),
            ));
        }
    }
    errs
}

/// A running server's mode is fixed: moving data between a lone server, a replicated set and a
/// Redis Cluster is a migration, not a change of field.
pub fn validate_update(
    new_spec: &Value,
    new_replicas: i64,
    old_spec: &Value,
    old_replicas: i64,
) -> Vec<FieldError> {
    let (n, o) = (mode(new_spec, new_replicas), mode(old_spec, old_replicas));
    if n != o {
        return vec![FieldError::new(
            "spec.mode",
            format!("is fixed at creation ({o}); it cannot become {n} (migrate to a new resource)"),
        )];
    }
    // Shards may be added or removed: `cluster::scale` moves an even share of the slots (and
    // their keys) to new masters, or off the masters that go before their pods are removed.
    // Each shard's replicas stay as created: `cluster::scale` acts on a change of masters, not
    // on more or fewer replicas per master.
    let (new_shape, old_shape) = (cluster_shape(new_spec), cluster_shape(old_spec));
    if n == CLUSTER && new_shape.1 != old_shape.1 {
        return vec![FieldError::new(
            "spec.cluster.replicasPerShard",
            format!("is fixed at creation ({}); change spec.cluster.shards to scale", old_shape.1),
        )];
    }
    Vec::new()
}
